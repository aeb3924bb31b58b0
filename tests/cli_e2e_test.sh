#!/usr/bin/env bash
# The `tqkv` CLI's server commands against the real tqkv-server (whose
# --version and byte-count units are checked first): status,
# put (over gRPC and the data plane, with progress), lookup, get (packed
# and dense, over gRPC and the data plane, on TCP and on its Unix-domain
# socket), stats and bench (with its
# data-plane reads), then a graceful
# SIGTERM that must exit 0.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tqkv}"
SERVER="$RUNFILES/service/tqkv-server"
TQKV="$RUNFILES/client/cli/tqkv"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cli.XXXXXX")"
fail() { echo "FAIL: $*" >&2; exit 1; }

# The server's version line, and byte counts with units (a wrong unit is
# refused, naming it).
grep -q '^tqkv-server [0-9][0-9.]* (commit ' <<<"$("$SERVER" --version)" || fail "--version: $("$SERVER" --version)"
rc=0
"$SERVER" --host_budget_bytes=64mib --data_dir="$TMP/never" >/dev/null 2>"$TMP/unit_err" || rc=$?
[ "$rc" != 0 ] && grep -q "unknown unit 'mib'" "$TMP/unit_err" || fail "a wrong unit: exit $rc, $(cat "$TMP/unit_err")"

source "$RUNFILES/tests/start_server.sh"
SOCK="$(mktemp -d /tmp/tqkv-cli.XXXXXX)"  # a socket path holds 107 bytes
start_server "$TMP/out" "$TMP/err" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --data_dir="$TMP/data" \
  --threads=1 --backend=cpu --host_budget_bytes=64MiB --data_socket="$SOCK/dp.sock"
S=(--server "$ADDR")
METRICS=$(sed -n 's/^tqkv-server metrics listening on //p' "$TMP/out")
grep -q '^tqkv_host_capacity_bytes 67108864$' <<<"$(curl -sf "http://$METRICS/metrics")" ||
  fail "--host_budget_bytes=64MiB is not a 67108864-byte budget"

out=$("$TQKV" status "${S[@]}")
grep -q "SERVING, backend cpu, tenant default, data plane $DATA" <<<"$out" || fail "status: $out"

out=$("$TQKV" put "${S[@]}" --blocks 40 --seed 3)
grep -q '^committed 40 already_present 0 ' <<<"$out" || fail "put: $out"
out=$("$TQKV" put "${S[@]}" --blocks 40 --seed 3)
grep -q '^committed 0 already_present 40 ' <<<"$out" || fail "re-put: $out"

out=$("$TQKV" lookup "${S[@]}" --blocks 45 --seed 3)
[ "$out" = "hits 40/45 host=40" ] || fail "lookup: $out"
out=$("$TQKV" get "${S[@]}" --blocks 40 --seed 3)
grep -q '^blocks 40 bytes 184320 (packed)' <<<"$out" || fail "get: $out"
out=$("$TQKV" get "${S[@]}" --blocks 40 --seed 3 --data "$DATA")
grep -q '^blocks 40 bytes 184320 (packed, data plane)' <<<"$out" || fail "get over the data plane: $out"
grep -q "^tqkv-server data plane socket on $SOCK/dp.sock\$" "$TMP/out" || fail "no socket line: $(cat "$TMP/out")"
out=$("$TQKV" get "${S[@]}" --blocks 40 --seed 3 --data "unix:$SOCK/dp.sock")
grep -q '^blocks 40 bytes 184320 (packed, data plane)' <<<"$out" || fail "get over the data plane's socket: $out"
"$TQKV" get "${S[@]}" --blocks 41 --seed 3 --data "$DATA" >/dev/null 2>"$TMP/dp_err" && fail "data-plane get of a missing block must fail"
grep -q 'NOT_FOUND' "$TMP/dp_err" || fail "data-plane missing block message: $(cat "$TMP/dp_err")"
out=$("$TQKV" get "${S[@]}" --blocks 2 --seed 3 --dense)
grep -q '^blocks 2 bytes 32768 (dense fp16)' <<<"$out" || fail "get dense: $out"
out=$("$TQKV" get "${S[@]}" --blocks 2 --seed 3 --dense --data "$DATA")
grep -q '^blocks 2 bytes 32768 (dense fp16, data plane)' <<<"$out" || fail "get dense over the data plane: $out"
"$TQKV" get "${S[@]}" --blocks 41 --seed 3 >/dev/null 2>"$TMP/get_err" && fail "get of a missing block must fail"
grep -q 'NOT_FOUND' "$TMP/get_err" || fail "missing block message: $(cat "$TMP/get_err")"

out=$("$TQKV" stats "${S[@]}")
grep -q 'model synthetic (id [0-9]*), compression 3.56x' <<<"$out" || fail "stats: $out"
grep -q '^  host: 40 blocks, 180 KiB (fp16: 640 KiB); K ' <<<"$out" || fail "stats tiers: $out"
out=$("$TQKV" stats "${S[@]}" --bytes)
grep -q 'host: blocks=40 bytes=184320 dense_equivalent=655360' <<<"$out" || fail "stats --bytes: $out"
# Each command's --help names what it does and its own flags.
grep -q '^usage: tqkv stats \[--model_id ID\] \[--bytes\]' <<<"$("$TQKV" stats --help)" || fail "stats --help"
out=$("$TQKV" put --help)
grep -q -- '--durable' <<<"$out" && grep -q '^Model flags:' <<<"$out" || fail "put --help: $out"

out=$("$TQKV" bench "${S[@]}" --blocks 200 --threads 2 --rounds 1 --seed 9 --data "$DATA")
grep -q '^put .* MB/s dense fp16 in (data plane); 200 committed, 0 already present' <<<"$out" || fail "bench: $out"
grep -q '^lookup .* hashes/s (2 threads); per call of 16 p50 [0-9.]* ms, p99 [0-9.]* ms$' <<<"$out" || fail "bench: $out"
grep -q "^get .* MB/s packed out (data plane); per call of 16 p50 " <<<"$out" || fail "bench data plane: $out"
# The same blocks again: nothing new to put, and the put rate says so.
out=$("$TQKV" bench "${S[@]}" --blocks 200 --threads 2 --rounds 1 --seed 9 --batch 50)
grep -q '^put    0.0 blocks/s, 0.0 MB/s dense fp16 in; 0 committed, 200 already present (not counted); per call of 50 ' \
  <<<"$out" || fail "bench re-put: $out"

out=$("$TQKV" put "${S[@]}" --blocks 300 --seed 5 --data "$DATA" 2>"$TMP/put_progress")
grep -q '^committed 300 already_present 0 ' <<<"$out" || fail "put over the data plane: $out"
grep -q '^put: 256/300 blocks (85%), ' "$TMP/put_progress" || fail "put progress: $(cat "$TMP/put_progress")"
grep -q '^put: 300/300 blocks (100%), ' "$TMP/put_progress" || fail "put progress: $(cat "$TMP/put_progress")"
out=$("$TQKV" lookup "${S[@]}" --blocks 300 --seed 5)
[ "$out" = "hits 300/300 host=300" ] || fail "lookup after a data-plane put: $out"

"$TQKV" put "${S[@]}" --bogus 1 >/dev/null 2>&1 && fail "unknown flag must fail"

# Models: listed with their layout and blocks; unregistering one that holds
# blocks needs --force, which removes them.
out=$("$TQKV" models "${S[@]}")
grep -q '^synthetic  id [0-9]*  fingerprint [0-9a-f]\{32\}$' <<<"$out" || fail "models: $out"
grep -q '^  2 layers x 2 kv heads (4 q) x d 64, block 16, k4v4$' <<<"$out" || fail "models layout: $out"
grep -q '^  540 blocks, [0-9.]* [KM]iB, 0 live sequences$' <<<"$out" || fail "models blocks: $out"
id=$(sed -n 's/^synthetic  id \([0-9]*\) .*/\1/p' <<<"$out")
"$TQKV" unregister "${S[@]}" --model_id "$id" >/dev/null 2>"$TMP/unreg_err" && fail "unregister of a model with blocks must fail"
grep -q 'FAILED_PRECONDITION.*540 stored blocks' "$TMP/unreg_err" || fail "unregister refusal: $(cat "$TMP/unreg_err")"
out=$("$TQKV" unregister "${S[@]}" --model_id "$id" --force)
grep -q "^unregistered model $id: removed 540 blocks (" <<<"$out" || fail "unregister --force: $out"
[ "$("$TQKV" models "${S[@]}")" = "no models registered" ] || fail "models after unregister"
grep -q -- '--force' <<<"$("$TQKV" unregister --help)" || fail "unregister --help"

kill -TERM $PID
wait $PID || fail "graceful shutdown exited $?"
[ ! -e "$SOCK/dp.sock" ] || fail "the socket file outlived the server"
rmdir "$SOCK"
trap - EXIT
echo "cli_e2e_test: all checks passed"
