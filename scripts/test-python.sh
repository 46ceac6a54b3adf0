#!/usr/bin/env bash
# The Python SDK's tests, against the wheel users install: built as `make dist` builds it
# (scripts/build-wheel.sh: maturin with zig, manylinux2014; the debug profile here, to
# keep `make test` quick), checked by scripts/check_portable.py (auditwheel: its tag, the
# glibc symbol versions it needs, no external libraries), installed with pip into a fresh venv, then
# pytest there against the cargo-built hub and spoke binaries. The fresh venv sees the
# test venv's packages (pytest, numpy, torch, the formats' reference tools) through a
# .pth line, and nothing of this repo but the wheel. Run by `make test` after
# scripts/ensure-test-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
wheels="$work/wheels"
WHEEL_VENV="$work/venv"

scripts/build-wheel.sh "$VENV" "$TARGET" "$wheels"
"$VENV/bin/python" scripts/check_portable.py --glibc 2.17 --wheel "$wheels"/shardcache-*.whl
# The same check refuses what it should: the debug build's hub links this machine's glibc
# (2.36 on Debian 12), newer than 2.17.
if "$VENV/bin/python" scripts/check_portable.py --glibc 2.17 "$TARGET/debug/hub-server" > "$work/refused" 2>&1 ||
    ! grep -q "asks for GLIBC_" "$work/refused"; then
  cat "$work/refused" >&2
  echo "check_portable.py did not refuse $TARGET/debug/hub-server, built against glibc $(getconf GNU_LIBC_VERSION)" >&2
  exit 1
fi

# The .pth line adds the test venv's folder but not its own .pth files, so an editable
# install an older `maturin develop` left there is not seen; the check below says so if
# any other shardcache were imported.
"$VENV/bin/python" -m venv "$WHEEL_VENV"
site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site "$VENV" > "$(site "$WHEEL_VENV")/shardcache-test-venv.pth"
"$WHEEL_VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$wheels"/shardcache-*.whl
"$WHEEL_VENV/bin/python" - "$WHEEL_VENV" <<'PY'
import shardcache._native, sys
where = shardcache._native.__file__
if not where.startswith(sys.argv[1] + "/"):
    sys.exit(f"the tests would import shardcache from {where}, not from the wheel just installed")
PY
SHARDCACHE_BIN_DIR="$TARGET/debug" "$WHEEL_VENV/bin/python" -m pytest -q client/python/tests
