#!/usr/bin/env bash
# `peer-bench`: MosaicML Streaming beside shardcache with a cache of half the dataset,
# three epochs over the same 60 ms emulated link (bench/peer/mosaic_vs_spoke.py). Not
# part of `make test`. Installs what it needs into cached venvs under ~/.cache/shardcache:
# the test venv (moto, maturin) and a peer venv with mosaicml-streaming (which pins
# numpy < 2.2, so it cannot share the test venv) plus this repo's Python SDK.
#
#   cargo build --release --workspace --bins && scripts/peer-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-test-deps.sh
TEST_VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
PEER_VENV="$HOME/.cache/shardcache/peer-venv"
PEER_REQUIREMENTS=("mosaicml-streaming==0.13.0")
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
if [ ! -f "$PEER_VENV/.shardcache-requirements" ] || [ "$(cat "$PEER_VENV/.shardcache-requirements")" != "${PEER_REQUIREMENTS[*]}" ]; then
  python3 -m venv "$PEER_VENV"
  echo "installing ${PEER_REQUIREMENTS[*]} (and torch) into $PEER_VENV" >&2
  "$PEER_VENV/bin/pip" install -q --disable-pip-version-check "${PEER_REQUIREMENTS[@]}"
  echo "${PEER_REQUIREMENTS[*]}" > "$PEER_VENV/.shardcache-requirements"
fi
# This repo's SDK, built release into a wheel and installed into the peer venv.
wheels="$(mktemp -d)"
(cd client/python && CARGO_TARGET_DIR="$TARGET" "$TEST_VENV/bin/maturin" build -q --release -o "$wheels")
"$PEER_VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/shardcache-*.whl
rm -rf "$wheels"
exec "$PEER_VENV/bin/python" bench/peer/mosaic_vs_spoke.py --bin-dir "$TARGET/release" \
  --moto-server "$TEST_VENV/bin/moto_server" "$@"
