#!/usr/bin/env bash
# The server as the Kubernetes manifests run it (deploy/k8s): uid and gid
# 10001 on a data volume that root created. With fsGroup semantics (the
# volume group-owned by 10001, group-writable, setgid; 10001 among the
# process' groups) it starts, creates its RocksDB directory and serves; on a
# root-owned volume without them it exits 1 naming the directory, its owner
# and mode, its own uid and groups, and fsGroup. Also: --data_advertise_host
# puts the pod's address, not the bound wildcard, in Stats.
# Needs root (to create the volume as root and drop to 10001).
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tqkv}"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root to create a root-owned volume and run the server as uid 10001"

# The runfiles sit under root's home, which uid 10001 cannot enter: run a
# copy from a directory it can read.
TMP="$(mktemp -d /tmp/tqkv-pod-user.XXXXXX)"
PID=""
cleanup() {
  if [ -n "$PID" ]; then kill -9 "$PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
chmod 755 "$TMP"
install -m 755 "$RUNFILES/service/tqkv-server" "$TMP/tqkv-server"
TQKV="$RUNFILES/client/cli/tqkv"
AS_POD=(setpriv --reuid=10001 --regid=10001 --groups=10001 --)

# start DATA_DIR [FLAGS...]: runs the server as 10001 in the background,
# waits for its listening line; PID and ADDR are set. Returns 1 if it exits.
start() {
  local dir=$1
  shift
  : >"$TMP/out"
  : >"$TMP/err"
  "${AS_POD[@]}" "$TMP/tqkv-server" --listen=127.0.0.1:0 --data_listen=127.0.0.1:0 --metrics_listen= \
    --data_dir="$dir" --threads=1 --backend=cpu "$@" >"$TMP/out" 2>"$TMP/err" &
  PID=$!
  for _ in $(seq 1 300); do
    grep -q '^tqkv-server listening on ' "$TMP/out" && break
    kill -0 "$PID" 2>/dev/null || { wait "$PID" || true; PID=""; return 1; }
    sleep 0.1
  done
  ADDR=$(sed -n 's/^tqkv-server listening on //p' "$TMP/out")
  [ -n "$ADDR" ] || fail "no listening line: $(cat "$TMP/err")"
}

stop() {
  kill -TERM "$PID"
  wait "$PID" || fail "server exit code $? on SIGTERM: $(cat "$TMP/err")"
  PID=""
}

# 1. fsGroup semantics: the kubelet makes the volume root:10001, mode 2775.
mkdir "$TMP/fsgroup"
chown 0:10001 "$TMP/fsgroup"
chmod 2775 "$TMP/fsgroup"
start "$TMP/fsgroup" --data_advertise_host=127.0.0.9 || fail "did not start on an fsGroup volume: $(cat "$TMP/err")"
out=$("$TQKV" put --server "$ADDR" --blocks 8 --seed 1 --durable) || fail "put: $out"
grep -q '^committed 8 ' <<<"$out" || fail "put: $out"
DATA=$(sed -n 's/^tqkv-server data plane listening on //p' "$TMP/out")
out=$("$TQKV" status --server "$ADDR")
grep -q "data plane 127.0.0.9:${DATA##*:}\$" <<<"$out" || fail "advertised data plane (bound $DATA): $out"
stop
[ "$(stat -c %u "$TMP/fsgroup/rocksdb")" = 10001 ] || fail "rocksdb/ not owned by 10001: $(ls -ln "$TMP/fsgroup")"
# The blocks are there after a restart as the same user.
start "$TMP/fsgroup" || fail "did not restart: $(cat "$TMP/err")"
out=$("$TQKV" lookup --server "$ADDR" --blocks 8 --seed 1)
grep -q '^hits 8/8 ' <<<"$out" || fail "lookup after restart: $out"
stop
echo "ok: uid 10001 serves from an fsGroup volume and advertises its data plane at the given host"

# 2. A volume root owns, without fsGroup: a clear refusal, exit 1.
mkdir "$TMP/rootonly"
chmod 755 "$TMP/rootonly"
if start "$TMP/rootonly"; then fail "started on a root-owned volume"; fi
err=$(cat "$TMP/err")
for want in "--data_dir $TMP/rootonly is not writable" "owned by 0:0 with mode 0755" \
            "uid 10001 gid 10001 groups [10001]" "securityContext.fsGroup"; do
  grep -qF -- "$want" <<<"$err" || fail "refusal lacks '$want': $err"
done
echo "ok: a root-owned volume is refused: $(echo "$err" | tail -1)"
