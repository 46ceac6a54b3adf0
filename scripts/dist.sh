#!/usr/bin/env bash
# `make dist`: everything a user installs, in target/dist/ (or $DIST):
#
#   bin/hub-server, bin/spoke-cache, bin/shardcache, bin/wan-proxy   release binaries (stripped)
#   shardcache-VERSION-linux-ARCH.tar.gz                            the same four, as one archive
#   shardcache-VERSION-cp39-abi3-*.whl                              the Python SDK (CPython 3.9+)
#   images/shardcache-{hub,spoke,wan-proxy}.tar                     container images (`docker load -i`,
#                                                                   `podman load -i`), where podman runs
#   SHA256SUMS
#
# Builds with the toolchain rust-toolchain.toml names. The wheel is built by maturin
# from a small venv of its own (~/.cache/shardcache/dist-venv); the images by
# deploy/images.sh from the binaries just built (skipped, saying why, where podman
# cannot run containers: the binaries and the wheel are still made).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
DIST="${DIST:-$PWD/target/dist}"
VENV="$HOME/.cache/shardcache/dist-venv"
# The maturin make test pins (scripts/ensure-test-deps.sh), one pin for both.
MATURIN="$(grep -o '"maturin==[^"]*"' scripts/ensure-test-deps.sh | tr -d '"')"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
ARCH="$(uname -m)"
BINARIES=(hub-server spoke-cache shardcache wan-proxy)

started=$SECONDS
step() { echo "dist: $* ($((SECONDS - started)) s)" >&2; }

scripts/ensure-deps.sh
rm -rf "$DIST" && mkdir -p "$DIST/bin"

step "release binaries"
cargo build --release --locked --workspace --bins
for bin in "${BINARIES[@]}"; do
  strip -o "$DIST/bin/$bin" "$TARGET_DIR/release/$bin"
done
tar -C "$DIST" -czf "$DIST/shardcache-$VERSION-linux-$ARCH.tar.gz" bin

step "Python wheel"
if [ ! -x "$VENV/bin/maturin" ]; then
  python3 -m venv "$VENV" 2>/dev/null || {
    echo "dist: python3 -m venv failed: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
  "$VENV/bin/pip" install -q --disable-pip-version-check "$MATURIN"
fi
(cd client/python && CARGO_TARGET_DIR="$TARGET_DIR" "$VENV/bin/maturin" build --release --locked -q -o "$DIST")

step "container images"
source deploy/images.sh
if podman_ready; then
  build_images "$DIST/bin" || { echo "dist: $IMAGES_FAILED" >&2; exit 1; }
  mkdir -p "$DIST/images"
  for target in "${IMAGE_TARGETS[@]}"; do
    podman save -q --format docker-archive -o "$DIST/images/shardcache-$target.tar" \
      "localhost/shardcache-$target:latest"
  done
else
  echo "dist: no container images: $PODMAN_UNAVAILABLE" >&2
fi

(cd "$DIST" && find . -type f ! -name SHA256SUMS -printf '%P\n' | sort | xargs sha256sum > SHA256SUMS)
step "done"
echo "dist: in $DIST:" >&2
(cd "$DIST" && du -sh -- * | sed 's/^/  /') >&2
