# Sourced by the scripts that start servers on loopback (load.sh, versitygw-tests.sh):
# a work folder, the servers' pids, their cleanup on exit, and `start`.

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  # Let the servers finish stopping (the spoke flushes RocksDB) before removing their files.
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$work"
}
trap cleanup EXIT

# Starts a server, waits for its "listening on" line, prints the address. Runs in a
# command substitution (a subshell), so the pid goes to LOG.pid for the caller.
start() {
  local log="$1"; shift
  "$@" > "$log" 2> "$log.err" &
  echo $! > "$log.pid"
  for _ in $(seq 1 100); do
    if grep -q "listening on" "$log" 2>/dev/null; then
      sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$log" | head -1
      return
    fi
    sleep 0.1
  done
  echo "error: $* did not start; see $log.err" >&2
  exit 1
}

# versitygw, the S3 peer, where `go env GOPATH` puts it (a version the module proxy serves).
ensure_versitygw() {
  if [ ! -x "$(go env GOPATH)/bin/versitygw" ]; then
    echo "installing versitygw (go install github.com/versity/versitygw/cmd/versitygw@v1.8.0)" >&2
    go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
  fi
}
