#!/usr/bin/env bash
# The Python SDK's wheel as users install it, one way for `make dist` and `make test`:
# maturin with zig, linked against glibc 2.17 (manylinux2014), CPython 3.9+ (abi3).
#
#   scripts/build-wheel.sh VENV TARGET_DIR OUT [--release]
#
# VENV holds maturin and ziglang (make test's pins, scripts/ensure-test-deps.sh); maturin
# finds zig as `python -m ziglang` of the venv on PATH. TARGET_DIR is the cargo target
# folder: not one cargo-zigbuild uses too (their zig wrappers differ, and each would
# rebuild every crate the other built).
set -euo pipefail
venv="${1:?VENV}" target_dir="${2:?TARGET_DIR}" out="${3:?OUT}"
shift 3
cd "$(dirname "$0")/../client/python"
PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" CARGO_TARGET_DIR="$target_dir" \
  "$venv/bin/maturin" build -q --locked --zig --compatibility manylinux2014 -o "$out" "$@"
