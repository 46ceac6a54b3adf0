#!/usr/bin/env bash
# The README's quickstart as a new user runs it, timed (BENCHMARKS.md "First hour"):
# a fresh clone of this repository, `make dist` with a new cargo target directory and
# ccache off (a cold build), `pip install` of the wheel, numpy and torch into a new venv
# with pip's cache off, then the quickstart's two marked blocks taken from README.md
# (servers and `ls`; the PyTorch lines). Not part of `make test` (a cold build is half
# an hour). Uses ports 7070 and 7071, as the quickstart does; WORK (default
# /tmp/shardcache-first-hour) is removed first.
#
#   scripts/first-hour.sh
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${WORK:-/tmp/shardcache-first-hour}"
rm -rf "$WORK" && mkdir -p "$WORK"
git clone -q "$REPO" "$WORK/clone"
cd "$WORK/clone"
unset CARGO_TARGET_DIR
export CCACHE_DISABLE=1
t0=$(date +%s)
make dist > "$WORK/dist.log" 2>&1
t1=$(date +%s)
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --no-cache-dir target/dist/shardcache-*.whl numpy torch > "$WORK/pip.log" 2>&1
t2=$(date +%s)
export PATH="$PWD/target/dist/bin:$WORK/venv/bin:$PATH"
mkdir -p "$WORK/run" && cd "$WORK/run"
python3 - "$WORK/clone/README.md" <<'PY'
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
echo "make dist: $((t1-t0)) s (see $WORK/dist.log); pip install wheel+numpy+torch: $((t2-t1)) s;" \
  "servers+ls: $((t3-t2)) s; python (2 epochs): $((t4-t3)) s; total $((t4-t0)) s"
