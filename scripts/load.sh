#!/usr/bin/env bash
# `make load`: ghz against a hub and a warm spoke on loopback, at several concurrencies,
# then an overload run far past the spoke's --max-concurrency, then S3 GETs (s3-bench:
# the spoke's S3 door beside the SDK's gRPC stream and versitygw, the peer gateway).
# Writes target/load/: summary.md (RPS, p50/p95/p99, status codes and errors per run,
# the overload's RSS, the S3 table), one ghz JSON per run and ghz's HTML report per call.
#
# The ghz configs are deploy/ghz/*.json: all use server reflection except
# read-range-protoset.json, which uses the compiled descriptor set (the module proxy
# serves ghz v0.93.0, whose .proto parser predates proto3 `optional`, so --proto cannot
# read shardcache.proto; --protoset is the file-based path it can take).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-target/release}"
OUT=target/load
CONCURRENCIES=(1 16 64)
OVERLOAD_LIMIT=16        # spoke --max-concurrency in the overload run
OVERLOAD_CONCURRENCY=512 # ghz -c in the overload run

GHZ="$(command -v ghz || true)"
if [ -z "$GHZ" ]; then
  GHZ="$(go env GOPATH)/bin/ghz"
  if [ ! -x "$GHZ" ]; then
    echo "installing ghz (go install github.com/bojand/ghz/cmd/ghz@latest)" >&2
    go install github.com/bojand/ghz/cmd/ghz@latest
  fi
fi

# The S3 peer row's gateway (s3-bench finds it in GOPATH).
source scripts/servers.sh
ensure_versitygw

rm -rf "$OUT" && mkdir -p "$OUT"

"$BIN/shardcache" gen --dir "$work/data" --dataset c4-synthetic --shards 8 --shard-size 32MiB >/dev/null
"$BIN/shardcache" descriptor-set --out "$OUT/shardcache.protoset"
hub=$(start "$work/hub.out" "$BIN/hub-server" --root "$work/data" --listen 127.0.0.1:0)
pids+=("$(cat "$work/hub.out.pid")")
spoke=$(start "$work/spoke.out" "$BIN/spoke-cache" --hub "http://$hub" --cache-dir "$work/cache" \
  --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0)
pids+=("$(cat "$work/spoke.out.pid")")
"$BIN/shardcache" --endpoint "http://$spoke" warm c4-synthetic 2>/dev/null

summarize() { # ghz JSON -> one markdown row
  python3 - "$@" <<'EOF'
import json, sys
target, config, concurrency, path = sys.argv[1:5]
r = json.load(open(path))
lat = {int(d["percentage"]): d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
codes = ", ".join(f"{k} {v}" for k, v in sorted((r.get("statusCodeDistribution") or {}).items()))
errors = "; ".join(f"{v}x {k[:80]}" for k, v in (r.get("errorDistribution") or {}).items()) or "-"
print(f"| {target} | {config} | {concurrency} | {r['rps']:.0f} | {lat.get(50, 0):.2f} | {lat.get(95, 0):.2f} | {lat.get(99, 0):.2f} | {codes} | {errors} |")
EOF
}

summary="$OUT/summary.md"
{
  echo "# ghz load test ($(date -u +%Y-%m-%d), $(nproc) cores, $(uname -r))"
  echo
  echo "| target | call | concurrency | RPS | p50 ms | p95 ms | p99 ms | status codes | errors |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$summary"
for target in hub spoke; do
  addr=$hub; [ "$target" = spoke ] && addr=$spoke
  for config in deploy/ghz/*.json; do
    name=$(basename "$config" .json)
    for c in "${CONCURRENCIES[@]}"; do
      report="$OUT/$target-$name-c$c.json"
      # Up to 4 connections (the trainer side of a spoke has several processes).
      connections=$(( c < 4 ? c : 4 ))
      (cd deploy/ghz && "$GHZ" --config "$(basename "$config")" -c "$c" --connections "$connections" \
        --format json "$addr") > "$report"
      summarize "$target" "$name" "$c" "$report" >> "$summary"
    done
    (cd deploy/ghz && "$GHZ" --config "$(basename "$config")" -c 16 --connections 4 --format html "$addr") \
      > "$OUT/$target-$name.html"
  done
done

# Overload: a spoke allowing OVERLOAD_LIMIT requests in flight, asked for far more.
over=$(start "$work/over.out" "$BIN/spoke-cache" --hub "http://$hub" --cache-dir "$work/cache-over" \
  --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --max-concurrency "$OVERLOAD_LIMIT")
over_pid=$(cat "$work/over.out.pid")
pids+=("$over_pid")
"$BIN/shardcache" --endpoint "http://$over" warm c4-synthetic 2>/dev/null
rss() { awk '/^VmRSS/ {print int($2/1024)}' "/proc/$over_pid/status"; }
before=$(rss)
report="$OUT/overload.json"
(cd deploy/ghz && "$GHZ" --config read-ranges.json -c "$OVERLOAD_CONCURRENCY" -n 20000 --connections 16 --format json "$over") > "$report"
after=$(rss)
peak=$(awk '/^VmHWM/ {print int($2/1024)}' "/proc/$over_pid/status")
health=$("$BIN/shardcache" --endpoint "http://$over" health || true)
{
  echo
  echo "## Overload: spoke --max-concurrency $OVERLOAD_LIMIT, ghz read-ranges -c $OVERLOAD_CONCURRENCY"
  echo
  echo "| target | call | concurrency | RPS | p50 ms | p95 ms | p99 ms | status codes | errors |"
  echo "|---|---|---|---|---|---|---|---|---|"
  summarize spoke read-ranges "$OVERLOAD_CONCURRENCY" "$report"
  echo
  echo "Spoke RSS: ${before} MiB before, ${after} MiB after, peak ${peak} MiB; health afterwards: ${health:-no answer}."
} >> "$summary"
# S3: whole 16 MiB objects, warm, 1 and 16 readers (s3-bench checks every object's bytes,
# that the door's were hits with nothing fetched, and that a 1 GiB object is streamed).
{
  echo
  echo "## S3 GetObject: the spoke's S3 door, its SDK stream over gRPC, versitygw (s3-bench)"
  echo
  "$BIN/s3-bench"
} >> "$summary"
cat "$summary"
python3 - "$report" "$health" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
codes = r.get("statusCodeDistribution") or {}
assert codes.get("ResourceExhausted", 0) > 0, f"the overload run got no RESOURCE_EXHAUSTED: {codes}"
assert codes.get("OK", 0) > 0, f"the overloaded spoke served nothing: {codes}"
assert sys.argv[2] == "SERVING", "the spoke did not answer health after the overload"
EOF
echo "wrote $OUT (summary.md, JSON per run, HTML per call)"
