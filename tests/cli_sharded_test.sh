#!/usr/bin/env bash
# `tqkv --servers a,b,c` against three real tqkv-servers: put spreads chains
# over every shard, lookup and get find them all; with one server killed its
# chains miss in lookup (exit 0) and get fails naming it (exit 1).
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tqkv}"
SERVER="$RUNFILES/service/tqkv-server"
TQKV="$RUNFILES/client/cli/tqkv"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cli-sharded.XXXXXX")"
fail() { echo "FAIL: $*" >&2; exit 1; }

PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done' EXIT
ADDRS=()
for i in 0 1 2; do
  "$SERVER" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --data_listen=off --data_dir="$TMP/d$i" \
    --threads=1 --backend=cpu >"$TMP/out$i" 2>"$TMP/err$i" &
  PIDS+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 1 300); do
    grep -q '^tqkv-server listening on ' "$TMP/out$i" && break
    kill -0 "${PIDS[$i]}" 2>/dev/null || fail "server $i died: $(cat "$TMP/err$i")"
    sleep 0.1
  done
  ADDRS+=("$(sed -n 's/^tqkv-server listening on //p' "$TMP/out$i")")
  [ -n "${ADDRS[$i]}" ] || fail "no listening line from server $i"
done
LIST="${ADDRS[0]},${ADDRS[1]},${ADDRS[2]}"
S=(--servers "$LIST" --timeout_ms 10000)

out=$("$TQKV" status "${S[@]}")
[ "$(echo "$out" | grep -c ': SERVING$')" = 3 ] || fail "status: $out"

out=$("$TQKV" put "${S[@]}" --chains 60 --blocks 3 --seed 5)
grep -q '^committed 180 already_present 0$' <<<"$out" || fail "put: $out"
for a in "${ADDRS[@]}"; do
  grep -q "^shard $a: [0-9]* chains$" <<<"$out" || fail "no chains on $a: $out"
done

out=$("$TQKV" lookup "${S[@]}" --chains 60 --blocks 3 --seed 5)
grep -q '^hits 180/180$' <<<"$out" || fail "lookup: $out"
out=$("$TQKV" get "${S[@]}" --chains 60 --blocks 3 --seed 5)
grep -q '^blocks 180 bytes [0-9]* (packed)$' <<<"$out" || fail "get: $out"
out=$("$TQKV" stats "${S[@]}")
[ "$(echo "$out" | grep -c 'model synthetic blocks')" = 3 ] || fail "stats: $out"

kill -9 "${PIDS[1]}"
wait "${PIDS[1]}" 2>/dev/null || true
dead="${ADDRS[1]}"
out=$("$TQKV" lookup "${S[@]}" --chains 60 --blocks 3 --seed 5) || fail "lookup with a dead shard must succeed"
grep -q "^shard $dead: hits 0/[1-9][0-9]*$" <<<"$out" || fail "dead shard's chains should miss: $out"
for a in "${ADDRS[0]}" "${ADDRS[2]}"; do
  grep -Eq "^shard $a: hits ([0-9]+)/\\1$" <<<"$out" || fail "live shard $a should hit everything: $out"
done
rc=0
"$TQKV" get "${S[@]}" --chains 60 --blocks 3 --seed 5 >/dev/null 2>"$TMP/get_err" || rc=$?
[ "$rc" = 1 ] || fail "get with a dead shard: exit $rc"
grep -q "UNAVAILABLE: shard $dead" "$TMP/get_err" || fail "get error should name the shard: $(cat "$TMP/get_err")"
rc=0
"$TQKV" status "${S[@]}" >"$TMP/status" || rc=$?
[ "$rc" = 1 ] || fail "status with a dead shard: exit $rc"
rc=0
"$TQKV" bench "${S[@]}" 2>"$TMP/bench_err" || rc=$?
[ "$rc" = 2 ] && grep -q "not available with --servers" "$TMP/bench_err" || fail "bench --servers: exit $rc"
echo PASS
