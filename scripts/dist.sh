#!/usr/bin/env bash
# `make dist`: everything a user installs, in target/dist/ (or $DIST), for Linux with
# glibc 2.17 or newer (manylinux2014: RHEL/CentOS 7+, Amazon Linux 2, Ubuntu 18.04+,
# Debian 10+ and older ones), whatever glibc the building machine has:
#
#   bin/hub-server, bin/spoke-cache, bin/shardcache, bin/wan-proxy   release binaries (stripped)
#   shardcache-VERSION-linux-ARCH-glibc2.17.tar.gz                  the same four, as one archive
#   shardcache-VERSION-cp39-abi3-manylinux2014_ARCH.manylinux_2_17_ARCH.whl   the Python SDK (CPython 3.9+)
#   shardcache-chart-VERSION.tgz                                    the Helm chart (`helm install NAME FILE`)
#   images/shardcache-images.tar                                    the three container images
#                                                                   (`docker load -i`, `podman load -i`),
#                                                                   where podman runs
#   SHA256SUMS
#
# zig (PyPI's `ziglang`) links the binaries and the wheel against glibc 2.17's symbols, and
# C++ (RocksDB) against its own libc++, statically: maturin's documented way without a
# manylinux container (polars and pydantic-core build in manylinux2014 containers, the same
# glibc floor; no image can be pulled here), and cargo-zigbuild's for the binaries. Then
# scripts/check_portable.py reads what they ask of the system (auditwheel for the wheel)
# and scripts/check-old-userland.sh runs them on Ubuntu 20.04 in a chroot (as root where
# debootstrap works; SHARDCACHE_DIST_USERLAND=0 skips it).
#
# Builds with the toolchain rust-toolchain.toml names; the tools (maturin, ziglang,
# auditwheel: make test's pins in scripts/ensure-test-deps.sh; cargo-zigbuild) in a venv
# of their own (~/.cache/shardcache/dist-venv). The images come from deploy/images.sh
# with the binaries just built (skipped, saying why, where podman cannot run containers).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
DIST="${DIST:-$PWD/target/dist}"
VENV="$HOME/.cache/shardcache/dist-venv"
GLIBC=2.17
pin() { grep -o "\"$1==[^\"]*\"" scripts/ensure-test-deps.sh | tr -d '"'; }
TOOLS=("$(pin maturin)" "$(pin ziglang)" "$(pin auditwheel)" "cargo-zigbuild==0.24.1")
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
ARCH="$(uname -m)"
TRIPLE="$ARCH-unknown-linux-gnu"
BINARIES=(hub-server spoke-cache shardcache wan-proxy)

started=$SECONDS
step() { echo "dist: $* ($((SECONDS - started)) s)" >&2; }

scripts/ensure-deps.sh
rm -rf "$DIST" && mkdir -p "$DIST/bin"
if [ "$(cat "$VENV/.shardcache-tools" 2>/dev/null)" != "${TOOLS[*]}" ]; then
  python3 -m venv "$VENV" 2>/dev/null || {
    echo "dist: python3 -m venv failed: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
  "$VENV/bin/pip" install -q --disable-pip-version-check "${TOOLS[@]}"
  echo "${TOOLS[*]}" > "$VENV/.shardcache-tools"
fi
# maturin and cargo-zigbuild find zig as `python -m ziglang` of the venv on PATH. Their
# zig wrappers are the C and C++ compilers for the target (CC_<triple>, CXX_<triple>),
# which is also the host here, so they compile everything C (not ccache: zig keeps its
# own cache of compiled files, ~/.cache/zig, which a second build of RocksDB hits).
export PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV"

step "release binaries for glibc $GLIBC (cargo zigbuild)"
bin_args=()
for bin in "${BINARIES[@]}"; do bin_args+=(--bin "$bin"); done
cargo zigbuild --release --locked --target "$TRIPLE.$GLIBC" "${bin_args[@]}"
for bin in "${BINARIES[@]}"; do
  strip -o "$DIST/bin/$bin" "$TARGET_DIR/$TRIPLE/release/$bin"
done
cat > "$DIST/bin/README.txt" <<EOF
shardcache $VERSION for Linux $ARCH, glibc $GLIBC or newer: hub-server, spoke-cache,
shardcache (the CLI) and wan-proxy. They need no other library (RocksDB and its C++
runtime are linked in). The README's quickstart says how to run them.
EOF
tar -C "$DIST" -czf "$DIST/shardcache-$VERSION-linux-$ARCH-glibc$GLIBC.tar.gz" bin

step "Python wheel (manylinux2014)"
scripts/build-wheel.sh "$VENV" "$TARGET_DIR/wheel" "$DIST" --release

step "what they need of the system"
"$VENV/bin/python" scripts/check_portable.py --glibc "$GLIBC" --wheel "$DIST"/shardcache-*.whl \
  "${BINARIES[@]/#/$DIST/bin/}"
if [ "${SHARDCACHE_DIST_USERLAND:-1}" = 1 ] && [ "$(id -u)" -eq 0 ]; then
  step "on an older Linux (Ubuntu 20.04 in a chroot)"
  scripts/check-old-userland.sh "$DIST"
else
  echo "dist: not run on an older Linux (needs root; SHARDCACHE_DIST_USERLAND=${SHARDCACHE_DIST_USERLAND:-1})" >&2
fi

# The chart as `helm package` lays it out (the chart's folder at the archive's root), so
# that a user installs it without a clone.
tar -C deploy/helm -czf "$DIST/shardcache-chart-$VERSION.tgz" shardcache

step "container images"
source deploy/images.sh
if podman_ready; then
  build_images "$DIST/bin" || { echo "dist: $IMAGES_FAILED" >&2; exit 1; }
  mkdir -p "$DIST/images"
  save_images "$DIST/images/shardcache-images.tar"
else
  echo "dist: no container images: $PODMAN_UNAVAILABLE" >&2
fi

(cd "$DIST" && find . -type f ! -name SHA256SUMS -printf '%P\n' | sort | xargs sha256sum > SHA256SUMS)
step "done"
echo "dist: in $DIST:" >&2
(cd "$DIST" && du -sh -- * | sed 's/^/  /') >&2
