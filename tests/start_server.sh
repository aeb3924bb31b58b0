# Sourced by the shell tests. start_server OUT ERR ARGS... starts $SERVER
# (a tqkv-server binary) with ARGS in the background, its stdout in OUT and
# stderr in ERR, waits until it prints its gRPC and data-plane listening
# lines (only the gRPC one with --data_listen=off), and sets PID, ADDR and
# DATA (empty with --data_listen=off). An EXIT trap kills it. The caller
# defines fail().
start_server() {
  local out="$1" err="$2"
  shift 2
  local want_data=1
  [[ " $* " == *" --data_listen=off "* ]] && want_data=0
  "$SERVER" "$@" >"$out" 2>"$err" &
  PID=$!
  trap 'kill -9 $PID 2>/dev/null || true' EXIT
  for _ in $(seq 1 300); do
    grep -q '^tqkv-server listening on ' "$out" &&
      { [ $want_data = 0 ] || grep -q '^tqkv-server data plane listening on ' "$out"; } && break
    kill -0 $PID 2>/dev/null || fail "server died: $(cat "$err")"
    sleep 0.1
  done
  ADDR=$(sed -n 's/^tqkv-server listening on //p' "$out")
  DATA=$(sed -n 's/^tqkv-server data plane listening on //p' "$out")
  [ -n "$ADDR" ] || fail "no listening line: $(cat "$out")"
  [ $want_data = 0 ] || [ -n "$DATA" ] || fail "no data plane line: $(cat "$out")"
}
