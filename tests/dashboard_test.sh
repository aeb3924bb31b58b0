#!/usr/bin/env bash
# Every tqkv_ metric the Grafana dashboard queries is exported by the real
# server: start tqkv-server on port 0, scrape /metrics, compare names.
set -euo pipefail
root="${TEST_SRCDIR}/tqkv"
server="$root/service/tqkv-server"
dash="$root/deploy/grafana/tqkv.json"
tqkv="$root/client/cli/tqkv"
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$server" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --data_dir "$tmp/data" --backend cpu >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do grep -q "metrics listening on" "$tmp/out" && break; sleep 0.1; done
addr=$(grep -o "metrics listening on [^ ]*" "$tmp/out" | awk '{print $4}')
[ -n "$addr" ] || { cat "$tmp/err"; echo "FAIL: server did not start"; exit 1; }
grpc_addr=$(grep -o "^tqkv-server listening on [^ ]*" "$tmp/out" | awk '{print $4}')
# Activity so that labelled families have samples: blocks stored, an RPC
# error (a get of a block that was never put).
"$tqkv" put --server "$grpc_addr" --blocks 4 --seed 1 >/dev/null
"$tqkv" get --server "$grpc_addr" --blocks 5 --seed 1 >/dev/null 2>&1 && { echo "FAIL: get of a missing block succeeded"; exit 1; }
curl -sf "http://$addr/metrics" >"$tmp/metrics"
exported=$(grep -oE '^tqkv_[a-z_]+' "$tmp/metrics" | sed -E 's/_(bucket|sum|count)$//' | sort -u)
queried=$(grep -oE 'tqkv_[a-z_]+' "$dash" | sed -E 's/_(bucket|sum|count)$//' | sort -u)
missing=$(comm -23 <(echo "$queried") <(echo "$exported"))
if [ -n "$missing" ]; then echo "FAIL: dashboard queries metrics the server does not export:"; echo "$missing"; exit 1; fi
echo "dashboard_test: $(echo "$queried" | wc -l) queried metrics all exported"
