#!/usr/bin/env bash
# What `make test` needs beyond the build, in a virtual environment under
# ~/.cache/shardcache (never the system's Python), pinned:
# - moto's server mode: an S3-compatible server for the hub's S3 tests (the tests run
#   $SHARDCACHE_MOTO_SERVER, which the Makefile points at this venv);
# - maturin, pytest and numpy: to build and test the Python SDK (client/python);
# - ziglang and auditwheel: the wheel is built as `make dist` builds it, linked by zig
#   against glibc 2.17 (manylinux2014), and checked by auditwheel (scripts/test-python.sh);
# - torch: the SDK's DataLoader-with-workers test (PyPI's wheel brings the CUDA
#   libraries: ~3 minutes and 6.3 GB on the first run, measured; cached after);
# - kubernetes-validate: the offline schema check of deploy/k8s (deploy/k8s/validate.sh);
# - podman-compose: runs deploy/compose.yaml in deploy/test-containers.sh;
# - megatron-core: its IndexedDatasetBuilder writes, and its IndexedDataset reads, the
#   Megatron datasets the SDK's format test checks against (0.16.1: the last release
#   for Python 3.11; with torch already here it adds only itself);
# - mosaicml-streaming: its MDSWriter writes, and its LocalDataset reads, the MDS
#   datasets of the same test (it needs numpy < 2.2, hence numpy 2.1.3);
# - webdataset: its TarWriter writes, and its own iteration reads, the tar shards there;
# - pyarrow: writes the Parquet files of the same test, and its to_pylist is the reference;
# - in a venv of their own (S3_CLIENTS below), the aws CLI and s3fs: the S3 door's clients;
# and, from apt, Debian's nss_wrapper, fuse3 and prometheus (below).
set -euo pipefail

REQUIREMENTS=("moto[server]==5.2.5" "maturin==1.16.0" "ziglang==0.13.0" "auditwheel==6.8.2" "pytest==9.2.0" "numpy==2.1.3" "kubernetes-validate==1.37.0" "podman-compose==1.6.0" "torch==2.15.0" "megatron-core==0.16.1" "mosaicml-streaming==0.13.0" "webdataset==1.0.2" "pyarrow==26.0.1")
VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
# The S3 clients that pin a botocore of their own (the aws CLI; s3fs through aiobotocore),
# apart from the SDK's venv, whose boto3 moto and MosaicML Streaming use: the S3 door's
# tests run them as users do (client/python/tests/test_s3_door.py).
S3_CLIENTS=("awscli==1.46.3" "s3fs==2026.9.0")
S3_CLIENTS_VENV="${SHARDCACHE_S3_CLIENTS_VENV:-$HOME/.cache/shardcache/s3clients}"

# Debian packages the tests run (installed with apt where missing):
# - nss_wrapper: the group-discovery test resolves names from its own hosts file
#   (tests/tests/e2e/spoke_group_membership.rs);
# - fuse3 (fusermount3): the mount tests mount a real FUSE filesystem
#   (tests/tests/e2e/mount.rs, client/python/tests/test_mount.py);
# - prometheus and promtool: the monitoring test scrapes real servers with the recording
#   rules of deploy/prometheus (tests/tests/e2e/prometheus.rs; deploy/k8s/validate.sh).
apt_packages=()
if ! [ -e /usr/lib/x86_64-linux-gnu/libnss_wrapper.so ] && ! [ -e /usr/lib/aarch64-linux-gnu/libnss_wrapper.so ] && ! [ -e /usr/lib64/libnss_wrapper.so ]; then
  apt_packages+=(libnss-wrapper)
fi
command -v fusermount3 >/dev/null 2>&1 || apt_packages+=(fuse3)
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  apt_packages+=(prometheus)
fi
if [ ${#apt_packages[@]} -gt 0 ]; then
  echo "installing ${apt_packages[*]} (Debian's) for the tests" >&2
  if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo -n); fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
fi

# Installs the pinned requirements given after VENV into VENV, unless its stamp says they
# are there already.
ensure_venv() {
  local venv="$1"; shift
  local stamp="$venv/.shardcache-requirements"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$*" ]; then
    return 0
  fi
  if ! command -v python3 >/dev/null 2>&1; then
    echo "error: python3 is needed for the S3 tests' server (moto); install it (apt-get install -y python3 python3-venv)" >&2
    exit 1
  fi
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian splits venv support out of python3.
    echo "installing python3-venv" >&2
    if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo -n); fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  echo "installing $* into $venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "$@"
  echo "$*" > "$stamp"
}

ensure_venv "$VENV" "${REQUIREMENTS[@]}"
ensure_venv "$S3_CLIENTS_VENV" "${S3_CLIENTS[@]}"
