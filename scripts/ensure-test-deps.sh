#!/usr/bin/env bash
# What `make test` needs beyond the build: an S3-compatible server for the hub's S3
# tests, moto's server mode from PyPI, pinned, in a virtual environment under
# ~/.cache/shardcache (never the system's Python). The tests run
# $SHARDCACHE_MOTO_SERVER, which the Makefile points at this venv.
set -euo pipefail

MOTO_VERSION=5.2.5
VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"

if [ -x "$VENV/bin/moto_server" ] && "$VENV/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
  exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "error: python3 is needed for the S3 tests' server (moto); install it (apt-get install -y python3 python3-venv)" >&2
  exit 1
fi
if ! python3 -m venv "$VENV" 2>/dev/null; then
  # Debian splits venv support out of python3.
  echo "installing python3-venv" >&2
  if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo -n); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  python3 -m venv "$VENV"
fi
echo "installing moto[server]==$MOTO_VERSION into $VENV" >&2
"$VENV/bin/pip" install -q --disable-pip-version-check "moto[server]==$MOTO_VERSION"
