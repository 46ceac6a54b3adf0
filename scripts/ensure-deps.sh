#!/usr/bin/env bash
# Makes sure this machine can build shardcache: a Rust toolchain and the system packages
# the build needs. Installs missing Debian/Ubuntu packages with apt-get when it can (as
# root, or with passwordless sudo); otherwise prints the exact command and fails.
#
# clang and libclang-dev: the rocksdb crate compiles RocksDB from C++ and generates its
# bindings with bindgen (libclang). ccache: cargo compiles RocksDB's C++ once for
# `cargo clippy` and once for `cargo build` (~10 minutes each on 2 cores); through ccache
# the second time, and every later run, are cache hits. Nothing needs protoc: protox
# compiles the .proto files.
set -euo pipefail

PACKAGES=(clang libclang-dev ccache)

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo is not installed. Install Rust (https://rustup.rs), then run this again." >&2
  exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing system packages: ${missing[*]}" >&2
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: this is not a Debian/Ubuntu machine; install the equivalents of: ${missing[*]}" >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "error: missing packages and no root: run  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "installed: ${missing[*]}" >&2
