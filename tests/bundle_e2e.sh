#!/usr/bin/env bash
# Bundles tqkv-server and the C++ integration tests, with their non-glibc
# shared libraries, into a directory that runs on the GPU machine (no Bazel
# there), to run the integration suite against --backend=cuda.
# Usage: tests/bundle_e2e.sh [out_dir=dist/e2e]
# There: dist/e2e/run.sh [backend=cuda]   (logs to $OUT, or ./logs); the
# device tool carries the compressed dist/e2e_xz (dist/e2e_xz/run.sh).
# metrics_test needs promtool and is not bundled.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/bundle_lib.sh
DEST="${1:-dist/e2e}"
TESTS=(e2e_test bad_input_test durability_test concurrency_test data_plane_test)
bazel build //service:tqkv-server $(printf '//tests:%s ' "${TESTS[@]}")
BIN="$(bazel info bazel-bin 2>/dev/null)"
rm -rf "$DEST"
mkdir -p "$DEST/lib" "$DEST/runfiles/tqkv/service"
cp "$BIN/service/tqkv-server" "$DEST/runfiles/tqkv/service/"
for t in "${TESTS[@]}"; do cp "$BIN/tests/$t" "$DEST/"; done
chmod -R u+w "$DEST"
bundle_copy_libs "$DEST" "$DEST"/*_test "$DEST/runfiles/tqkv/service/tqkv-server"
# Bazel links test-only cc_libraries dynamically in fastbuild: ship them too.
cp -n "$BIN"/_solib_k8/*.so "$DEST/lib/" 2>/dev/null || true
chmod -R u+w "$DEST"
strip "$DEST"/*_test "$DEST/runfiles/tqkv/service/tqkv-server" "$DEST"/lib/* 2>/dev/null || true
cat > "$DEST/run.sh" <<'RUN'
#!/usr/bin/env bash
HERE="$(cd "$(dirname "$0")" && pwd)"
LOGS="${OUT:-$HERE/logs}"
mkdir -p "$LOGS"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$HERE/runfiles" TEST_WORKSPACE=tqkv TQKV_TEST_BACKEND="${1:-cuda}"
export TEST_TMPDIR="$(mktemp -d)"
status=0
for t in e2e_test bad_input_test durability_test concurrency_test data_plane_test; do
  timeout 240 "$HERE/$t" > "$LOGS/$t.log" 2>&1; rc=$?
  echo "$t rc=$rc" | tee -a "$LOGS/summary.txt"; [ $rc -eq 0 ] || status=1
done
exit $status
RUN
chmod +x "$DEST/run.sh"
du -sh "$DEST"
bundle_pack "$DEST" run.sh
