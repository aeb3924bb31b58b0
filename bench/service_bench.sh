#!/usr/bin/env bash
# Service benchmarks on loopback: builds tqkv-server and bench/service_bench
# (-c opt), starts tqkv-server (CPU backend, temp data dir, port 0) and
# redis-server (free loopback port, no persistence), runs the harness against
# both, and stops them. Extra arguments go to service_bench
# (e.g. --mode get --seconds 5); TQKV_SERVER_ARGS adds server flags (e.g.
# "--threads 2"). Results: bench/RESULTS.md, "Service" section.
set -euo pipefail
cd "$(dirname "$0")/.."

bazel build -c opt //service:tqkv-server //bench:service_bench >&2
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
# Copy the binaries: another build may repoint bazel-bin while we run.
work="$(mktemp -d /tmp/tqkv-service-bench.XXXXXX)"
cp "$BIN/service/tqkv-server" "$BIN/bench/service_bench" "$work/"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

mkdir "$work/data"
"$work/tqkv-server" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 \
  --data_dir "$work/data" --backend cpu ${TQKV_SERVER_ARGS:-} >"$work/server.log" 2>&1 &
pids+=($!)
tqkv_addr=""
for _ in $(seq 600); do
  tqkv_addr=$(sed -n 's/^tqkv-server listening on \([^ ]*\).*/\1/p' "$work/server.log" | head -1)
  data_addr=$(sed -n 's/^tqkv-server data plane listening on \([^ ]*\).*/\1/p' "$work/server.log" | head -1)
  [ -n "$tqkv_addr" ] && [ -n "$data_addr" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$tqkv_addr" ] || { echo "tqkv-server did not start" >&2; cat "$work/server.log" >&2; exit 1; }

# Redis has no "port 0": take a free port from the kernel, then bind it.
redis_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
  --protected-mode no --dir "$work" --logfile "$work/redis.log" &
pids+=($!)
for _ in $(seq 100); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done

echo "load average before: $(cut -d" " -f1-3 /proc/loadavg)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores;" \
  "tqkv $tqkv_addr, data plane $data_addr (cpu backend${TQKV_SERVER_ARGS:+, $TQKV_SERVER_ARGS}), redis $(redis-server --version | awk '{print $3}') 127.0.0.1:$redis_port"
"$work/service_bench" --tqkv "$tqkv_addr" --tqkv_data "$data_addr" --redis "127.0.0.1:$redis_port" "$@"
