#!/usr/bin/env bash
# The README's quickstart as a new user runs it, timed (BENCHMARKS.md "First hour"), in
# one of two ways:
#
#   scripts/first-hour.sh                        from source: a fresh clone of this
#       repository, `make dist` with a new cargo target directory and ccache off (a cold
#       build, half an hour), then the steps below with what it made;
#   scripts/first-hour.sh --from-artefacts DIR   from a release's artefacts (DIR: what
#       `make dist` made, e.g. on another machine): no cargo or rustc on PATH, the
#       binaries from the tarball unpacked in a new folder.
#
# Both then `pip install` the wheel, numpy and torch into a new venv with pip's cache off
# and run the quickstart's two marked blocks taken from README.md (servers and `ls`; the
# PyTorch lines). Not part of `make test`. Uses ports 7070 and 7071, as the quickstart
# does; WORK (default /tmp/shardcache-first-hour) is removed first.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${WORK:-/tmp/shardcache-first-hour}"
ARTEFACTS=""
case "$#:${1:-}" in
  0:) ;;
  2:--from-artefacts) ARTEFACTS="$(cd "$2" && pwd)" ;;
  *) echo "usage: scripts/first-hour.sh [--from-artefacts DIR]" >&2; exit 2 ;;
esac
rm -rf "$WORK" && mkdir -p "$WORK"
t0=$(date +%s)
if [ -z "$ARTEFACTS" ]; then
  git clone -q "$REPO" "$WORK/clone"
  unset CARGO_TARGET_DIR
  export CCACHE_DISABLE=1
  (cd "$WORK/clone" && make dist > "$WORK/dist.log" 2>&1)
  ARTEFACTS="$WORK/clone/target/dist"
  how="make dist (see $WORK/dist.log)"
else
  # A user's machine without Rust: every PATH entry that holds cargo or rustc goes
  # (rustup's ~/.cargo/bin; a system folder such as /usr/bin cannot go, so that fails).
  PATH="$(tr ':' '\n' <<< "$PATH" | while read -r dir; do
    [ -z "$dir" ] || [ -x "$dir/cargo" ] || [ -x "$dir/rustc" ] || printf '%s:' "$dir"; done)"
  PATH="${PATH%:}"
  for tool in tar python3; do
    command -v "$tool" >/dev/null || {
      echo "first-hour: $tool went from PATH with cargo or rustc: run it where Rust is not in a system folder" >&2; exit 1; }
  done
  if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "first-hour: cargo or rustc is still on PATH" >&2; exit 1
  fi
  mkdir -p "$WORK/opt"
  tar -C "$WORK/opt" -xzf "$ARTEFACTS"/shardcache-*-linux-*.tar.gz
  how="tar xzf the binaries"
fi
bin_dir="$([ -d "$WORK/opt/bin" ] && echo "$WORK/opt/bin" || echo "$ARTEFACTS/bin")"
t1=$(date +%s)
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --no-cache-dir "$ARTEFACTS"/shardcache-*.whl numpy torch > "$WORK/pip.log" 2>&1
t2=$(date +%s)
export PATH="$bin_dir:$WORK/venv/bin:$PATH"
mkdir -p "$WORK/run" && cd "$WORK/run"
python3 - "$REPO/README.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = {n: c for n, _, c in re.findall(r"<!-- readme-test: ([a-z-]+) -->\n```(sh|python)\n(.*?)```", text, re.S)}
open("servers.sh", "w").write(blocks["quickstart-servers"])
open("train.py", "w").write(blocks["quickstart-python"])
PY
# The servers the block starts with `&` stay in this process group, stopped at the end.
setsid bash -euo pipefail servers.sh > servers.log 2>&1 &
group=$!
trap 'kill -- -"$group" 2>/dev/null || true' EXIT
wait "$group" || true
t3=$(date +%s)
python train.py > train.log 2>&1
t4=$(date +%s)
grep -q "^epoch 1: " train.log || { cat servers.log train.log >&2; echo "first-hour: no second epoch" >&2; exit 1; }
echo "$how: $((t1-t0)) s; pip install wheel+numpy+torch: $((t2-t1)) s;" \
  "servers+ls: $((t3-t2)) s; python (2 epochs): $((t4-t3)) s; total $((t4-t0)) s"
