#!/usr/bin/env bash
# The `tqkv` CLI's data-plane commands over TLS and mutual TLS: with the
# same --tls_ca/--tls_cert/--tls_key flags as its gRPC commands, put, get
# and bench --data reach a server whose gRPC and data plane speak mutual TLS
# only; a CA that did not sign the server's certificate is refused.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tqkv}"
SERVER="$RUNFILES/service/tqkv-server"
TQKV="$RUNFILES/client/cli/tqkv"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cli_tls.XXXXXX")"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$RUNFILES/tests/make_test_certs.sh" "$TMP/certs" >/dev/null 2>&1 || fail "make_test_certs.sh"
C="$TMP/certs"
source "$RUNFILES/tests/start_server.sh"
start_server "$TMP/out" "$TMP/err" --listen=127.0.0.1:0 --data_listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --data_dir="$TMP/data" --threads=1 --backend=cpu \
  --tls_cert_file="$C/server.pem" --tls_key_file="$C/server.key" --tls_client_ca_file="$C/ca.pem"
TLS=(--tls_ca "$C/ca.pem" --tls_cert "$C/alpha.pem" --tls_key "$C/alpha.key")
S=(--server "$ADDR" --timeout_ms 10000)

out=$("$TQKV" put "${S[@]}" "${TLS[@]}" --blocks 30 --seed 4 --data "$DATA" 2>/dev/null) || fail "put --data: $out"
grep -q '^committed 30 already_present 0 ' <<<"$out" || fail "put --data: $out"
out=$("$TQKV" get "${S[@]}" "${TLS[@]}" --blocks 30 --seed 4 --data "$DATA") || fail "get --data: $out"
grep -q '^blocks 30 bytes [0-9]* (packed, data plane)$' <<<"$out" || fail "get --data: $out"
out=$("$TQKV" get "${S[@]}" "${TLS[@]}" --blocks 2 --seed 4 --dense --data "$DATA") || fail "dense get --data: $out"
grep -q '^blocks 2 bytes [0-9]* (dense fp16, data plane)$' <<<"$out" || fail "dense get --data: $out"
out=$("$TQKV" bench "${S[@]}" "${TLS[@]}" --blocks 40 --threads 1 --rounds 1 --seed 9 --data "$DATA") ||
  fail "bench --data: $out"
grep -q 'MB/s packed out (data plane)' <<<"$out" || fail "bench --data: $out"

# The data-plane client checks the server's certificate against --tls_ca.
"$TQKV" get "${S[@]}" --tls_ca "$C/ca2.pem" --tls_cert "$C/alpha.pem" --tls_key "$C/alpha.key" \
  --blocks 2 --seed 4 --data "$DATA" >/dev/null 2>"$TMP/bad_ca" && fail "a get trusting another CA succeeded"
grep -q "UNAVAILABLE" "$TMP/bad_ca" || fail "bad CA: $(cat "$TMP/bad_ca")"

kill -TERM $PID
wait $PID || fail "server exit code $? on SIGTERM"
echo "ok: put, get and bench over the data plane with mutual TLS"
