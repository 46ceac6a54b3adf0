# shellcheck shell=bash
# Building deploy/Dockerfile's images with podman, for deploy/test-containers.sh (which
# then runs them) and scripts/dist.sh (which saves them as archives). Sourced, from the
# repository root:
#
#   source deploy/images.sh
#   podman_ready || echo "no images: $PODMAN_UNAVAILABLE"
#   build_images BIN_DIR || echo "$IMAGES_FAILED"     # localhost/shardcache-{hub,spoke,wan-proxy}:{latest,VERSION}
#   save_images FILE                                  # the three (:VERSION) in one archive, layers once
#
# This machine has no Docker engine and no registry:
# - podman runs with the runc runtime (crun fails here) and lowered ulimits, set for
#   every podman call (podman-compose's too) through CONTAINERS_CONF, exported;
# - no base image can be pulled, so the one the Dockerfile names
#   (docker.io/library/debian:bookworm-slim) is built with debootstrap (minbase) and
#   imported; the tarball is cached under ~/.cache/shardcache;
# - the images take binaries already built (BIN_DIR, stripped) through the Dockerfile's
#   `prebuilt` stage instead of compiling RocksDB again in a Rust image.

IMAGES_CACHE="$HOME/.cache/shardcache"
IMAGES_STATE="$PWD/deploy/.state"
BASE_IMAGE=docker.io/library/debian:bookworm-slim   # deploy/Dockerfile's RUNTIME_IMAGE
BASE_TARBALL="$IMAGES_CACHE/debian-bookworm-minbase.tar"
IMAGE_TARGETS=(hub spoke wan-proxy)

# Installs what podman needs (apt) and checks that it runs containers; otherwise sets
# PODMAN_UNAVAILABLE to why and returns 1.
podman_ready() {
  # Checked package by package, not by command: podman can be present while its network
  # backend's firewall tool is not. netavark sets up every container network with
  # iptables (its default firewall driver here); without it each RUN step of a build
  # fails with "netavark: No such file or directory".
  local packages=(podman runc debootstrap uidmap slirp4netns netavark aardvark-dns fuse-overlayfs iptables)
  local missing=() pkg sudo=()
  for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
      PODMAN_UNAVAILABLE="not a Debian machine and missing: ${missing[*]}"; return 1
    fi
    if [ "$(id -u)" -ne 0 ]; then
      if sudo -n true 2>/dev/null; then sudo=(sudo -n); else
        PODMAN_UNAVAILABLE="${missing[*]} are not installed and this user cannot install them"; return 1
      fi
    fi
    echo "installing ${missing[*]} (apt)" >&2
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update -qq
    if ! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null; then
      PODMAN_UNAVAILABLE="apt-get could not install ${missing[*]}"; return 1
    fi
  fi
  if [ "$(id -u)" -ne 0 ]; then
    # Rootless podman needs subuids and a user session; the images and the data volume's
    # ownership (uid 10001) are written for rootful podman here and Docker elsewhere.
    PODMAN_UNAVAILABLE="runs as root only (rootful podman)"; return 1
  fi
  mkdir -p "$IMAGES_STATE"
  cat > "$IMAGES_STATE/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=10000:10000", "nproc=10000:10000"]
[engine]
runtime = "runc"
EOF
  export CONTAINERS_CONF="$IMAGES_STATE/containers.conf"
  # HEALTHCHECK is kept only in Docker-format images (OCI has no field for it).
  export BUILDAH_FORMAT=docker
  if ! podman info >/dev/null 2> "$IMAGES_STATE/podman-info.err"; then
    PODMAN_UNAVAILABLE="podman cannot run here: $(tail -1 "$IMAGES_STATE/podman-info.err")"; return 1
  fi
}

# The workspace's version (Cargo.toml) and the commit the images are built from, with
# "-dirty" when the work tree differs from it (the OCI labels; test-containers.sh checks
# them).
image_version() { sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1; }
image_revision() {
  local rev
  rev="$(git rev-parse HEAD 2>/dev/null)" || { echo unknown; return; }
  git diff --quiet HEAD 2>/dev/null || rev="$rev-dirty"
  echo "$rev"
}

# Builds localhost/shardcache-{hub,spoke,wan-proxy}:latest and :VERSION (the tag the
# Helm chart and deploy/k8s name) from the binaries in $1
# (after podman_ready); otherwise sets IMAGES_FAILED to why and returns 1.
build_images() {
  local bin_dir="$1" bin target rootfs
  if ! podman image exists "$BASE_IMAGE"; then
    if [ ! -s "$BASE_TARBALL" ]; then
      echo "building $BASE_IMAGE with debootstrap --variant=minbase bookworm (about a minute)" >&2
      rootfs="$(mktemp -d)"
      if ! debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian \
          > "$IMAGES_STATE/debootstrap.log" 2>&1; then
        rm -rf "$rootfs"
        IMAGES_FAILED="debootstrap failed; see $IMAGES_STATE/debootstrap.log"; return 1
      fi
      rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
      mkdir -p "$IMAGES_CACHE"
      tar -C "$rootfs" -cf "$BASE_TARBALL.partial" . && mv "$BASE_TARBALL.partial" "$BASE_TARBALL"
      rm -rf "$rootfs"
    fi
    if ! podman import --change 'CMD ["/bin/bash"]' "$BASE_TARBALL" "$BASE_IMAGE" >/dev/null; then
      IMAGES_FAILED="podman import of $BASE_TARBALL"; return 1
    fi
  fi
  mkdir -p deploy/.bin
  for bin in hub-server spoke-cache shardcache wan-proxy; do
    if [ ! -x "$bin_dir/$bin" ]; then
      IMAGES_FAILED="$bin_dir/$bin is missing: build first (cargo build --workspace --bins)"; return 1
    fi
    strip -o "deploy/.bin/$bin" "$bin_dir/$bin" || { IMAGES_FAILED="strip $bin_dir/$bin"; return 1; }
  done
  # What the images say they are (OCI labels; the Dockerfile has the ones that do not
  # change). Set by a second build from the first, never from the layer cache: buildah
  # (1.28) reuses a cached image whole, labels included, when every step is a cache hit,
  # so a new commit with the same binaries kept the old revision (make test caught it).
  # FROM and LABEL only: no layer of its own, so the three images still share their base.
  local oci=org.opencontainers.image
  local labels=(
    --label "$oci.version=$(image_version)"
    --label "$oci.revision=$(image_revision)"
    --label "$oci.created=$(git log -1 --format=%cI 2>/dev/null || echo 1970-01-01T00:00:00Z)"
    # The clone's origin, without any user or token in it; empty where there is none.
    --label "$oci.source=$(git remote get-url origin 2>/dev/null | sed -E 's#://[^/@]*@#://#' || true)"
    --label "$oci.base.name=$BASE_IMAGE"
  )
  local empty
  empty="$(mktemp -d)"
  for target in "${IMAGE_TARGETS[@]}"; do
    if ! podman build -q -f deploy/Dockerfile --target "$target" --build-arg BINARIES=prebuilt \
        -t "localhost/shardcache-$target:layers" . > /dev/null; then
      rm -rf "$empty"; IMAGES_FAILED="podman build --target $target"; return 1
    fi
    if ! echo "FROM localhost/shardcache-$target:layers" | podman build -q --no-cache "${labels[@]}" \
        -t "localhost/shardcache-$target:latest" -t "localhost/shardcache-$target:$(image_version)" \
        -f - "$empty" > /dev/null; then
      rm -rf "$empty"; IMAGES_FAILED="podman build of $target's labels"; return 1
    fi
  done
  rm -rf "$empty"
}

# Saves the three images in one docker-archive FILE (`docker load -i`, `podman load -i`):
# the layers they share (the base, the runtime stage) are stored once, not once per image.
save_images() {
  local refs=() target
  for target in "${IMAGE_TARGETS[@]}"; do refs+=("localhost/shardcache-$target:$(image_version)"); done
  podman save -q --format docker-archive --multi-image-archive -o "$1" "${refs[@]}"
}
