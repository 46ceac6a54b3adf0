#!/usr/bin/env bash
# The OpenTelemetry Collector that the trace test sends to (tests/tests/e2e/traces.rs):
# built from tools/otelcol (the collector's own modules, pinned by its go.mod and
# go.sum) with `go build`, into ~/.cache/shardcache/bin, and rebuilt only when those
# files change. The first build downloads the modules from the Go module proxy and
# compiles (1.5 minutes on 2 cores with a partly warm Go build cache, measured); later
# runs take the stamp's word.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${SHARDCACHE_OTELCOL:-$HOME/.cache/shardcache/bin/otelcol-shardcache}"
STAMP="$OUT.sources"
sources="$(cat tools/otelcol/go.mod tools/otelcol/go.sum tools/otelcol/main.go | sha256sum | cut -d' ' -f1)"
if [ -x "$OUT" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$sources" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "error: Go is needed to build the OpenTelemetry Collector of the trace test (tools/otelcol); install Go 1.26 or newer" >&2
  exit 1
fi
echo "building the OpenTelemetry Collector (tools/otelcol, v0.161.0 modules) into $OUT" >&2
mkdir -p "$(dirname "$OUT")"
(cd tools/otelcol && GOFLAGS="-buildvcs=false -mod=readonly" go build -trimpath -o "$OUT.tmp" .)
mv "$OUT.tmp" "$OUT"
echo "$sources" > "$STAMP"
