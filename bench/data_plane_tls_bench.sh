#!/usr/bin/env bash
# Data-plane GetBlocks with and without TLS on loopback: builds tqkv-server
# and bench/data_plane_tls_bench (-c opt), makes certificates
# (tests/make_test_certs.sh), starts a plain and a TLS tqkv-server (CPU
# backend, temp data dirs, port 0), runs the harness against both and stops
# them. Extra arguments go to the harness (e.g. --threads 1 --seconds 4).
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //service:tqkv-server //bench:data_plane_tls_bench >&2
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
work="$(mktemp -d /tmp/tqkv-tls-bench.XXXXXX)"
cp "$BIN/service/tqkv-server" "$BIN/bench/data_plane_tls_bench" "$work/"
tests/make_test_certs.sh "$work/certs" >/dev/null 2>&1
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

start() {  # NAME [flags...]: echoes GRPC,DATA
  local name=$1
  shift
  mkdir "$work/$name"
  "$work/tqkv-server" --listen 127.0.0.1:0 --metrics_listen '' --data_dir "$work/$name" \
    --backend cpu "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    g=$(sed -n 's/^tqkv-server listening on \([^ ]*\).*/\1/p' "$work/$name.log" | head -1)
    d=$(sed -n 's/^tqkv-server data plane listening on \([^ ]*\).*/\1/p' "$work/$name.log" | head -1)
    if [ -n "$g" ] && [ -n "$d" ]; then echo "$g,$d"; return; fi
    sleep 0.1
  done
  cat "$work/$name.log" >&2
  exit 1
}
plain=$(start plain)
tls=$(start tls --tls_cert_file "$work/certs/server.pem" --tls_key_file "$work/certs/server.key")
"$work/data_plane_tls_bench" --plain "$plain" --tls "$tls" --ca "$work/certs/ca.pem" "$@"
