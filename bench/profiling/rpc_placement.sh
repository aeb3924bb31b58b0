#!/usr/bin/env bash
# Per-call latency of gRPC and data-plane Attend, and of a trivial RPC, with
# the server and client placed on CPUs in a few ways (taskset), on the GPU
# machine. It shows how much of the gRPC share is host thread wake-ups
# (measurement log, bench/history/results-log-2026-11.md: "the goals against
# their floors; what the gRPC share is").
# Usage (GPU machine, repository root): bench/profiling/rpc_placement.sh [bundle=dist/gpu_xz]
# The bundle is `tools/gpu_bundle.sh`'s compressed one.
set -u
BUNDLE="${1:-dist/gpu_xz}"
T=$(mktemp -d)
tar -C "$T" -xJf "$BUNDLE/bundle.tar.xz"
G=$T/gpu
export LD_LIBRARY_PATH=$G/lib
nproc
lscpu | grep -E "Model name|Socket|NUMA node\(s\)" | head -3
# run NAME SERVER_PREFIX CLIENT_PREFIX SERVER_FLAGS
run() {
  local name="$1" sp="$2" cp="$3" extra="$4" addr="" daddr=""
  rm -rf "$T/data"
  # shellcheck disable=SC2086  # the prefixes and flags are word lists
  $sp "$G/tqkv-server" --listen 127.0.0.1:0 --metrics_listen "" --data_dir "$T/data" $extra > "$T/srv.log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do
    addr=$(sed -n 's/^tqkv-server listening on //p' "$T/srv.log" | head -1)
    daddr=$(sed -n 's/^tqkv-server data plane listening on //p' "$T/srv.log" | head -1)
    [ -n "$addr" ] && [ -n "$daddr" ] && break
    sleep 0.1
  done
  echo "== $name"
  # shellcheck disable=SC2086
  $cp timeout 120 "$G/attend_e2e_bench" --server "$addr" --data "$daddr" --layers 8 --context 4096 --steps 40 \
    2>/dev/null | grep -E "^\[|baseline"
  kill "$pid"
  wait "$pid" 2>/dev/null
}
run "no pinning, cuda backend" "" "" "--backend cuda --threads 16"
run "no pinning, cpu backend" "" "" "--backend cpu"
run "server on cores 0-3, client on core 4" "taskset -c 0-3" "taskset -c 4" "--backend cuda --threads 16"
run "server on cores 0-7, client on cores 8-9" "taskset -c 0-7" "taskset -c 8-9" "--backend cuda --threads 16"
run "server and client on cores 0-1" "taskset -c 0-1" "taskset -c 0-1" "--backend cuda --threads 16"
GRPC_POLL_STRATEGY=poll run "no pinning, GRPC_POLL_STRATEGY=poll" "" "" "--backend cuda --threads 16"
rm -rf "$T"
