#!/usr/bin/env bash
# Runs make dist's artefacts on an older Linux than the one that built them: Ubuntu 20.04
# (focal: glibc 2.31, older than the 2.34 our wheel needed before it was linked by zig;
# Python 3.9, the oldest the abi3 wheel supports), in a chroot made with debootstrap from
# archive.ubuntu.com and cached as a tarball in ~/.cache/shardcache. Inside it, with the
# chroot's own glibc and Python only: pip installs the wheel into a venv (pip checks its
# manylinux tag against this glibc), the tarball's hub-server and spoke-cache serve a
# dataset the tarball's CLI generated, the CLI lists it through the spoke, and the SDK
# reads every shard through the spoke and compares it with the files.
#
#   scripts/check-old-userland.sh DIST      # DIST: make dist's folder (target/dist)
#
# Needs root (chroot, mount) and debootstrap (apt-get). Called by scripts/dist.sh;
# SHARDCACHE_DIST_USERLAND=0 skips it there.
set -euo pipefail
DIST="$(cd "${1:?usage: check-old-userland.sh DIST}" && pwd)"
SUITE=focal
TARBALL="$HOME/.cache/shardcache/ubuntu-$SUITE-python3.9.tar"
fail() { echo "check-old-userland: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "needs root (chroot)"
if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
root="$(mktemp -d)"
servers=""
# The servers stopped and /proc unmounted before the folder goes: never rm -rf into a
# mounted /proc (left in place, with a message, if it cannot be unmounted).
cleanup() {
  if [ -n "$servers" ]; then kill $servers 2>/dev/null || true; wait $servers 2>/dev/null || true; fi
  if mountpoint -q "$root/proc"; then umount "$root/proc" || umount -l "$root/proc" || true; fi
  if mountpoint -q "$root/proc"; then
    echo "check-old-userland: $root/proc is still mounted; $root left in place" >&2
  else
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT

if [ ! -s "$TARBALL" ]; then
  echo "check-old-userland: debootstrap of Ubuntu $SUITE with python3.9 (two minutes, once)" >&2
  # No Ubuntu keyring on Debian: the archive's signatures are not checked. The chroot is a
  # test userland only; nothing from it is shipped.
  debootstrap --variant=minbase --no-check-gpg --components=main,universe "$SUITE" "$root" \
    http://archive.ubuntu.com/ubuntu > "$root.debootstrap.log" 2>&1 ||
    fail "debootstrap failed; see $root.debootstrap.log"
  # python3.9 is in focal-updates' universe (focal itself has 3.8).
  echo "deb http://archive.ubuntu.com/ubuntu $SUITE-updates main universe" >> "$root/etc/apt/sources.list"
  chroot "$root" bash -c 'apt-get -qq -o Acquire::AllowInsecureRepositories=true update &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-unauthenticated \
      --no-install-recommends python3.9 python3.9-venv >/dev/null && apt-get clean' ||
    fail "apt-get install python3.9 in the chroot failed"
  mkdir -p "$(dirname "$TARBALL")"
  tar -C "$root" -cf "$TARBALL.partial" . && mv "$TARBALL.partial" "$TARBALL"
  rm -f "$root.debootstrap.log"
else
  tar -C "$root" -xf "$TARBALL"
fi
mount -t proc proc "$root/proc"

mkdir -p "$root/dist"
cp -r "$DIST/bin" "$DIST"/shardcache-*.whl "$root/dist/"
glibc="$(chroot "$root" getconf GNU_LIBC_VERSION | cut -d' ' -f2)"
echo "check-old-userland: Ubuntu $SUITE, glibc $glibc, $(chroot "$root" python3.9 --version)" >&2

# Servers on port 0; each prints the address it bound.
chroot "$root" /dist/bin/shardcache gen --dir /data --dataset c4 --shards 4 --shard-size 1MiB >/dev/null
chroot "$root" /dist/bin/hub-server --root /data --listen 127.0.0.1:0 > "$root/hub.log" 2>&1 &
servers="$!"
address() {
  for _ in $(seq 100); do
    grep -o "listening on [0-9.:]*" "$root/$1" 2>/dev/null | head -1 | cut -d' ' -f3 && return
    sleep 0.1
  done
  cat "$root/$1" >&2; fail "${1%.log} did not start"
}
hub="$(address hub.log)"
chroot "$root" /dist/bin/spoke-cache --hub "http://$hub" --cache-dir /cache --capacity 1GiB \
  --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 > "$root/spoke.log" 2>&1 &
servers="$servers $!"
spoke="$(address spoke.log)"
chroot "$root" /dist/bin/shardcache --endpoint "http://$spoke" ls c4 | grep -q shard-00003 ||
  fail "the CLI does not list c4's shards through the spoke"

chroot "$root" bash -euo pipefail -c "
  python3.9 -m venv /venv
  /venv/bin/pip install -q --disable-pip-version-check /dist/shardcache-*.whl
  /venv/bin/python - http://$spoke <<'PY'
import os, sys, shardcache
client = shardcache.Client(sys.argv[1])
shards = sorted(s['shard'] for s in client.ls('c4'))
assert len(shards) == 4, f'c4 lists {shards}'
for name in shards:
    got = b''.join(client.stream('c4', name))
    want = open(os.path.join('/data/c4', name), 'rb').read()
    assert got == want, f'{name}: {len(got)} bytes read, the file has {len(want)}'
print(f'python {sys.version.split()[0]}: {len(shards)} shards read through the spoke, byte for byte')
PY
" || fail "the wheel does not install or read in Ubuntu $SUITE"
echo "check-old-userland: the binaries and the wheel run on glibc $glibc" >&2
