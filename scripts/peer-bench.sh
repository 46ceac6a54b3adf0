#!/usr/bin/env bash
# `peer-bench`: MosaicML Streaming and WebDataset beside shardcache with a cache of half
# the dataset, three epochs over the same 60 ms emulated link, each on its own files and
# shardcache on the same files (bench/peer/mosaic_vs_spoke.py; its options pass through,
# e.g. --step-ms 20 for GPU utilisation). Not part of `make test`. Installs what it needs
# into cached venvs under ~/.cache/shardcache: the test venv (moto, maturin) and a peer
# venv with the peers and this repo's Python SDK built release (the test venv keeps its
# debug build).
#
#   cargo build --release --workspace --bins && scripts/peer-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-test-deps.sh
TEST_VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
PEER_VENV="$HOME/.cache/shardcache/peer-venv"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
# The peers (mosaicml-streaming, webdataset) and torch are make test's, pinned there: the
# peer venv sees the test venv's packages through a .pth line (not its editable
# shardcache, which a .pth of the test venv adds) and holds only the release SDK.
if [ ! -x "$PEER_VENV/bin/python" ]; then
  "$TEST_VENV/bin/python" -m venv "$PEER_VENV"
fi
site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site "$TEST_VENV" > "$(site "$PEER_VENV")/shardcache-test-venv.pth"
# This repo's SDK, built release into a wheel and installed into the peer venv.
wheels="$(mktemp -d)"
(cd client/python && CARGO_TARGET_DIR="$TARGET" "$TEST_VENV/bin/maturin" build -q --release -o "$wheels")
"$PEER_VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/shardcache-*.whl
rm -rf "$wheels"
exec "$PEER_VENV/bin/python" bench/peer/mosaic_vs_spoke.py --bin-dir "$TARGET/release" \
  --moto-server "$TEST_VENV/bin/moto_server" "$@"
