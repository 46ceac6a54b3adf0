#!/usr/bin/env bash
# A venv for the benchmarks that run Python beside the spoke (peer-bench, link-bench):
# it sees the test venv's packages (make test's pins: torch, the peers) through a .pth
# line, not its editable shardcache, and holds only this repo's SDK built release.
# Prints the venv's python. Installs what it needs into cached venvs under
# ~/.cache/shardcache (scripts/ensure-test-deps.sh first).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-test-deps.sh >&2
TEST_VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
BENCH_VENV="$HOME/.cache/shardcache/peer-venv"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
if [ ! -x "$BENCH_VENV/bin/python" ]; then
  "$TEST_VENV/bin/python" -m venv "$BENCH_VENV"
fi
site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site "$TEST_VENV" > "$(site "$BENCH_VENV")/shardcache-test-venv.pth"
wheels="$(mktemp -d)"
(cd client/python && CARGO_TARGET_DIR="$TARGET" "$TEST_VENV/bin/maturin" build -q --release -o "$wheels") >&2
"$BENCH_VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/shardcache-*.whl >&2
rm -rf "$wheels"
echo "$BENCH_VENV/bin/python"
