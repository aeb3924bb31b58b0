#!/usr/bin/env bash
# Well-behaved and abusive clients against one server (bench/abuse_bench.cc):
# builds tqkv-server and the harness (-c opt), starts a server (CPU backend,
# temp data dir, port 0) with two tenants (alice: well-behaved; mallory:
# abusive) and these budgets, runs the harness and stops the server. Extra
# arguments go to the harness (e.g. --seconds 30); TQKV_SERVER_ARGS adds
# server flags. Results: bench/RESULTS.md, "Service" section.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST_BUDGET=$((1 << 30))
TENANT_QUOTA=$((512 << 20))
FRAME_BUDGET=$((256 << 20))
bazel build -c opt //service:tqkv-server //bench:abuse_bench >&2
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
work="$(mktemp -d /tmp/tqkv-abuse-bench.XXXXXX)"
cp "$BIN/service/tqkv-server" "$BIN/bench/abuse_bench" "$work/"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
printf 'alice-token alice\nmallory-token mallory\n' >"$work/tokens"
chmod 600 "$work/tokens"
ulimit -n 65536 2>/dev/null || true
mkdir "$work/data"
"$work/tqkv-server" --listen 127.0.0.1:0 --metrics_listen '' --data_dir "$work/data" --backend cpu \
  --auth_tokens_file "$work/tokens" --host_budget_bytes "$HOST_BUDGET" \
  --tenant_host_quota_bytes "$TENANT_QUOTA" --data_max_buffered_bytes "$FRAME_BUDGET" \
  ${TQKV_SERVER_ARGS:-} >"$work/server.log" 2>&1 &
pid=$!
g="" d=""
for _ in $(seq 600); do
  g=$(sed -n 's/^tqkv-server listening on \([^ ]*\).*/\1/p' "$work/server.log" | head -1)
  d=$(sed -n 's/^tqkv-server data plane listening on \([^ ]*\).*/\1/p' "$work/server.log" | head -1)
  [ -n "$g" ] && [ -n "$d" ] && break
  sleep 0.1
done
[ -n "$g" ] && [ -n "$d" ] || { cat "$work/server.log" >&2; exit 1; }
echo "server: host budget $HOST_BUDGET, tenant quota $TENANT_QUOTA, data-plane frame budget $FRAME_BUDGET ${TQKV_SERVER_ARGS:-}"
"$work/abuse_bench" --server "$g" --data "$d" --pid "$pid" --token alice-token --abuser_token mallory-token \
  --budget_bytes $((HOST_BUDGET + FRAME_BUDGET)) "$@"
