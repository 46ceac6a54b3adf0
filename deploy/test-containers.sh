#!/usr/bin/env bash
# The containers, really run: builds deploy/Dockerfile's images, starts deploy/compose.yaml
# (certs, hub, 60 ms WAN emulator, spoke; TLS everywhere, mTLS spoke -> hub) with podman
# on a podman network, reads a generated dataset through the spoke with the host's CLI
# and checks every byte against the files, then checks what an operator relies on:
# health checks, non-root users, the hub refusing clients without a certificate, and the
# cache surviving a restart of the spoke's container.
#
# Run by `make test` (after the debug build); skipped, saying why, where podman cannot
# run containers, or with SHARDCACHE_SKIP_CONTAINERS=1.
#
# The images take the binaries `make test` built (BIN_DIR, stripped) through the
# Dockerfile's `prebuilt` stage; how podman runs on a machine without Docker or a
# registry is deploy/images.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN_DIR="${BIN_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/debug}"
VENV="${SHARDCACHE_VENV:-$HOME/.cache/shardcache/venv}"
PROJECT=shardcache-test
STATE="$PWD/deploy/.state"

skip() { echo "deploy/test-containers.sh: skipped: $*" >&2; exit 0; }
fail() { echo "deploy/test-containers.sh: FAILED: $*" >&2; exit 1; }

if [ "${SHARDCACHE_SKIP_CONTAINERS:-0}" = 1 ]; then skip "SHARDCACHE_SKIP_CONTAINERS=1"; fi

# --- podman, the base image and the images (deploy/images.sh, shared with make dist) ---
source deploy/images.sh
podman_ready || skip "$PODMAN_UNAVAILABLE"
build_images "$BIN_DIR" || fail "$IMAGES_FAILED"

# --- what the images say they are, and the base they share ---------------------------
label() { podman inspect --format "{{index .Config.Labels \"org.opencontainers.image.$2\"}}" "localhost/shardcache-$1:latest"; }
layers() { podman inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' "localhost/shardcache-$1:latest"; }
hub_base="$(layers hub | sed 's/ *$//; s/ [^ ]*$//')"
for target in "${IMAGE_TARGETS[@]}"; do
  [ "$(label "$target" version)" = "$(image_version)" ] || fail "$target: label version '$(label "$target" version)', not $(image_version)"
  [ "$(label "$target" revision)" = "$(image_revision)" ] || fail "$target: label revision '$(label "$target" revision)', not $(image_revision)"
  [ "$(label "$target" title)" = "shardcache-$target" ] || fail "$target: label title '$(label "$target" title)'"
  # Every layer but the binary's own is the runtime stage's: stored and pulled once.
  [ "$(layers "$target" | sed 's/ *$//; s/ [^ ]*$//')" = "$hub_base" ] || fail "$target does not share the hub's base layers"
done

# --- the compose file ----------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
export SHARDCACHE_DATA="$STATE/data" SPOKE_PORT SPOKE_METRICS_PORT
SPOKE_PORT="$(free_port)"
SPOKE_METRICS_PORT="$(free_port)"
compose=("$VENV/bin/podman-compose" --project-name "$PROJECT" -f deploy/compose.yaml)

cleanup() {
  status=$?
  if [ "$status" -ne 0 ]; then
    echo "--- container logs ---" >&2
    for svc in certs hub wan spoke; do
      echo "--- $svc" >&2
      podman logs --tail 30 "$(container "$svc")" >&2 2>&1 || true
    done
  fi
  down
  rm -rf "$STATE/data" "$STATE/out"
}
# `down -v` removes the compose file's named volumes; the anonymous ones the images'
# VOLUME lines make (/data of the certs job, which runs the hub image) go by name.
down() {
  local anonymous=()
  for ctr in $(podman ps -a -q --filter "label=com.docker.compose.project=$PROJECT"); do
    anonymous+=($(podman inspect --format '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}' "$ctr"))
  done
  "${compose[@]}" down -v >/dev/null 2>&1 || true
  for volume in "${anonymous[@]}"; do
    case "$volume" in "${PROJECT}_"*) ;; *) podman volume rm -f "$volume" >/dev/null 2>&1 || true ;; esac
  done
}
# The container of a compose service (podman-compose labels them like Docker Compose).
container() {
  podman ps -a --format '{{.Names}}' \
    --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=$1" | head -1
}
trap cleanup EXIT

down
rm -rf "$STATE/data" "$STATE/out" && mkdir -p "$STATE/out"
"$BIN_DIR/shardcache" gen --dir "$STATE/data" --dataset c4-synthetic --shards 4 --shard-size 4MiB >/dev/null
chmod -R a+rX "$STATE/data"

"${compose[@]}" up -d > "$STATE/compose-up.log" 2>&1 || { cat "$STATE/compose-up.log" >&2; fail "compose up"; }

podman cp "$(container spoke):/tls/ca.pem" "$STATE/out/ca.pem"
cli=("$BIN_DIR/shardcache" --endpoint "https://127.0.0.1:$SPOKE_PORT" --ca "$STATE/out/ca.pem")
# Waits until the spoke answers health over TLS, or fails: bounded, 120 x 0.5 s.
spoke_serves() {
  for _ in $(seq 1 120); do
    if "${cli[@]}" health >/dev/null 2>&1; then return; fi
    sleep 0.5
  done
  fail "the spoke never answered health on 127.0.0.1:$SPOKE_PORT over TLS"
}

# The spoke's port is published as soon as the container starts; it serves once it has
# opened RocksDB and bound its listener.
spoke_serves

# The spoke reaches the hub through the emulator by its name on the compose network.
# On a machine where this is podman's first network, aardvark-dns (podman's resolver)
# can still be starting when the spoke first looks `wan` up; the lookup then falls
# through to the host's resolver, the spoke answers UNAVAILABLE (the hub unreachable,
# nothing cached), and its next request connects again. Wait for that, bounded:
# 40 x 0.5 s.
hub_reachable() {
  for _ in $(seq 1 40); do
    if "${cli[@]}" ls c4-synthetic > "$STATE/out/ls.txt" 2> "$STATE/out/ls.err"; then return; fi
    grep -q "Unavailable" "$STATE/out/ls.err" || fail "listing through the spoke: $(cat "$STATE/out/ls.err")"
    sleep 0.5
  done
  fail "the spoke never reached the hub: $(cat "$STATE/out/ls.err")"
}

# --- the bytes ---------------------------------------------------------------------
hub_reachable
shards=$(cd "$STATE/data/c4-synthetic" && ls)
for shard in $shards; do
  grep -q "$shard" "$STATE/out/ls.txt" || fail "the spoke does not list $shard: $(cat "$STATE/out/ls.txt")"
  "${cli[@]}" get c4-synthetic "$shard" --output "$STATE/out/$shard"
  cmp "$STATE/data/c4-synthetic/$shard" "$STATE/out/$shard" \
    || fail "$shard read through the spoke differs from the hub's file"
done
first=$(echo "$shards" | head -1)
"${cli[@]}" cat c4-synthetic "$first" --offset 16380 --length 100 > "$STATE/out/range"
cmp <(tail -c +16381 "$STATE/data/c4-synthetic/$first" | head -c 100) "$STATE/out/range" \
  || fail "a range across a record boundary differs"
"${cli[@]}" status > "$STATE/out/status-before.txt"

# --- what operators rely on ----------------------------------------------------------
for svc in hub spoke; do
  ctr="$(container "$svc")"
  [ "$(podman exec "$ctr" id -u)" = 10001 ] || fail "$svc runs as $(podman exec "$ctr" id -u), not 10001"
  podman healthcheck run "$ctr" >/dev/null || fail "$svc's image health check does not report healthy"
done
# mTLS: the hub (reached from the spoke's container, by its name on the compose network)
# refuses a client without a certificate, and serves one with the CA's client certificate.
spoke_ctr="$(container spoke)"
if podman exec "$spoke_ctr" shardcache --endpoint https://hub:7070 --ca /tls/ca.pem ls > "$STATE/out/nocert.txt" 2>&1; then
  fail "the hub served a client without a certificate"
fi
# The hub must have refused it for that reason. (What the client prints varies: usually
# the hub's CertificateRequired alert, sometimes only "connection closed" when its request
# was queued on the connection as the alert arrived; see serving/src/tls.rs.)
# (The hub logs it once it has closed the connection; bounded wait: 20 x 0.5 s.)
refused=0
for _ in $(seq 1 20); do
  if podman logs "$(container hub)" 2>&1 | grep -q "TLS handshake failed.*peer sent no certificates"; then
    refused=1 && break
  fi
  sleep 0.5
done
[ "$refused" = 1 ] || fail "the hub did not log refusing a client without a certificate"
podman exec "$spoke_ctr" shardcache --endpoint https://hub:7070 --ca /tls/ca.pem \
  --cert /tls/client.pem --key /tls/client.key ls | grep -q c4-synthetic \
  || fail "the hub refused the CA's client certificate"

# The cache is on a volume: after the spoke's container restarts, a read is served from
# it (hits go up, bytes fetched from the hub do not).
# (stop + start: `podman restart` does not start the exited certs job the container
# requires, and refuses.)
podman stop -t 60 "$spoke_ctr" >/dev/null
podman start "$spoke_ctr" >/dev/null 2>&1
spoke_serves
"${cli[@]}" get c4-synthetic "$first" --output "$STATE/out/again"
cmp "$STATE/data/c4-synthetic/$first" "$STATE/out/again" || fail "$first differs after the spoke restarted"
"${cli[@]}" status > "$STATE/out/status-after.txt"
# `shardcache status` prints a row per dataset: DATASET SHARDS CACHED PINNED HITS MISSES
# HIT% UPSTREAM (sizes for people: 16MiB, 1.5GiB, 0B); its counters are the process's
# (they start at 0 after the restart).
python3 - "$STATE/out/status-before.txt" "$STATE/out/status-after.txt" <<'EOF'
import re, sys
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
def size(text):
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]+)", text).groups()
    return float(number) * UNITS[unit]
def row(path):
    text = open(path).read()
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "c4-synthetic":
            return int(fields[4]), size(fields[7])
    sys.exit(f"no c4-synthetic row in `shardcache status`:\n{text}")
(hits0, up0), (hits1, up1) = row(sys.argv[1]), row(sys.argv[2])
if up0 == 0:
    sys.exit("the first reads fetched nothing from the hub: were they not cold?")
if up1 != 0:
    sys.exit(f"after the restart the spoke fetched {up1} bytes from the hub again: the cache did not persist")
if hits1 == 0:
    sys.exit("after the restart the read was not counted as a cache hit")
EOF

echo "deploy/test-containers.sh: ok: images built, compose (certs, hub, wan 60 ms, spoke; TLS) served" \
  "$(echo "$shards" | wc -w) shards byte-exact through the spoke; health checks, uid 10001, mTLS" \
  "refusal and the cache across a restart checked"
