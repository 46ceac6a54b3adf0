#!/usr/bin/env bash
# Checks that the tests fail when the features they test are broken: each patch in
# tests/mutations/ breaks one feature (its first lines say how, and name the commands
# that build the mutant and the tests that must then fail); this applies each in turn,
# builds, runs those tests, expects each to fail, and takes the patch back out.
#
#   scripts/mutations.sh                 # every patch
#   scripts/mutations.sh NAME [NAME...]  # tests/mutations/NAME.patch only
#
# A patch's header, before its diff:
#   # what: ...          the feature it breaks, and how
#   # build: COMMAND     run first, after `cargo build --workspace --bins` (the tests start
#                        the built binaries: they must be the mutant's); must succeed
#   # test: COMMAND      must fail (the test caught the breakage); one line per test
# The binaries are built again from the unbroken tree at the end.
# Not part of `make test` (each mutant is a rebuild): run it before resolving an issue
# that adds or changes such a test, and keep its output in the issue's note. Needs a
# clean tree for the files a patch touches; the patch is taken back out however the
# run ends.
set -uo pipefail
cd "$(dirname "$0")/.."
# The environment `make test` builds and tests in (Makefile, .ci/run): another CC would
# rebuild RocksDB.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shardcache/target}"
export CC="ccache cc" CXX="ccache c++" CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export SHARDCACHE_MOTO_SERVER="${SHARDCACHE_MOTO_SERVER:-$HOME/.cache/shardcache/venv/bin/moto_server}"

if [ $# -gt 0 ]; then
  patches=()
  for name in "$@"; do patches+=("tests/mutations/$name.patch"); done
else
  patches=(tests/mutations/*.patch)
fi

applied=""
restore() { if [ -n "$applied" ]; then git apply -R "$applied" && applied=""; fi; }
trap restore EXIT INT TERM

log="$(mktemp -d)"
survived=0
for patch in "${patches[@]}"; do
  name="$(basename "$patch" .patch)"
  what="$(sed -n 's/^# what: //p' "$patch")"
  echo "== $name: $what"
  if ! git apply --check "$patch" 2>"$log/$name.apply"; then
    echo "   NOT APPLIED: $(head -1 "$log/$name.apply")"
    survived=$((survived + 1))
    continue
  fi
  git apply "$patch" && applied="$patch"
  built=1
  while IFS= read -r command; do
    if ! bash -c "$command" >"$log/$name.build" 2>&1; then
      echo "   the mutant does not build ($command): see $log/$name.build"
      built=0
      break
    fi
  done < <(echo "cargo build --workspace --bins"; sed -n 's/^# build: //p' "$patch")
  if [ "$built" = 1 ]; then
    i=0
    while IFS= read -r command; do
      i=$((i + 1))
      started=$SECONDS
      if bash -c "$command" >"$log/$name.test$i" 2>&1; then
        echo "   SURVIVED: $command passed ($((SECONDS - started)) s; $log/$name.test$i)"
        survived=$((survived + 1))
      else
        # What failed: a Rust test's panic message, or pytest's first `E` line.
        why="$(grep -m1 -A1 "panicked at" "$log/$name.test$i" | tail -1; grep -m1 "^E " "$log/$name.test$i")"
        echo "   killed: $command failed ($((SECONDS - started)) s): $(echo "$why" | head -1 | cut -c1-220)"
      fi
    done < <(sed -n 's/^# test: //p' "$patch")
  else
    survived=$((survived + 1))
  fi
  restore
done
# The binaries of the unbroken tree again, for whatever runs next.
cargo build --workspace --bins >"$log/rebuild" 2>&1 || echo "the unbroken tree did not build again: see $log/rebuild"
echo
if [ "$survived" -gt 0 ]; then
  echo "$survived test(s) passed with their feature broken, or a mutant did not apply or build (logs in $log)"
  exit 1
fi
echo "every test failed under its mutation (logs in $log)"
