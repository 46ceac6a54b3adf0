#!/usr/bin/env bash
# The Python SDK's tests: build the extension into the test venv (maturin, debug
# profile, the same cargo target directory as the rest), then pytest against the
# cargo-built hub and spoke binaries. Run by `make test` after scripts/ensure-test-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
(cd client/python && VIRTUAL_ENV="$VENV" CARGO_TARGET_DIR="$TARGET" "$VENV/bin/maturin" develop -q)
SHARDCACHE_BIN_DIR="$TARGET/debug" "$VENV/bin/python" -m pytest -q client/python/tests
