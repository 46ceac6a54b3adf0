#!/usr/bin/env bash
# `peer-bench`: MosaicML Streaming and WebDataset beside shardcache with a cache of half
# the dataset, three epochs over the same 60 ms emulated link, each on its own files and
# shardcache on the same files (bench/peer/mosaic_vs_spoke.py; its options pass through,
# e.g. --step-ms 20 for GPU utilisation). Not part of `make test`. The peers and this
# repo's Python SDK built release come from scripts/bench-venv.sh.
#
#   cargo build --release --workspace --bins && scripts/peer-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python="$(scripts/bench-venv.sh)"
TEST_VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
exec "$python" bench/peer/mosaic_vs_spoke.py --bin-dir "$TARGET/release" \
  --moto-server "$TEST_VENV/bin/moto_server" "$@"
