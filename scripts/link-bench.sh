#!/usr/bin/env bash
# `link-bench` with every reader, the Python one (ShardDataset under a shuffling
# DataLoader) included, through this repo's SDK built release (scripts/bench-venv.sh).
# Not part of `make test`; its options pass through (e.g. --readers python,sdk).
#
#   cargo build --release --workspace --bins && scripts/link-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python="$(scripts/bench-venv.sh)"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
exec "$TARGET/release/link-bench" --python "$python" "$@"
