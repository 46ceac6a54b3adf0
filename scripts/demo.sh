#!/usr/bin/env bash
# `make demo`: the seed experiment reproduced (../shared/seed/SEED.md). Runs the release
# `seed-demo` binary: a dataset of 16 KiB token windows, a hub, the WAN emulator at 60 ms
# RTT, spokes, and a simulated 16-rank trainer, next to nginx proxy_cache as the peer.
# Prints the table and writes it under target/demo/ (results.md, .json, .png).
#
# nginx (the peer row) and DejaVu Sans (the plot's text) come from apt when missing and
# installable; without them the demo still runs and says which part it skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CARGO_TARGET_DIR:-target}/release"

want=()
[ -x /usr/sbin/nginx ] || want+=(nginx)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || want+=(fonts-dejavu-core)
if [ ${#want[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
  echo "installing for the demo: ${want[*]}" >&2
  if ! { "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${want[@]}"; } >/dev/null 2>&1; then
    echo "could not install ${want[*]}; the demo skips what needs them" >&2
  fi
fi

exec "$bin/seed-demo" --out target/demo "$@"
