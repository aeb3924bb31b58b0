#!/usr/bin/env bash
# Builds the GPU tests and benchmarks here and bundles them, with their
# non-glibc shared libraries, into a directory that runs on the GPU machine
# (no Bazel there). Usage: tools/gpu_bundle.sh [out_dir=dist/gpu]
# On the GPU machine: dist/gpu/run_all.sh  (logs to $OUT, or ./logs)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-dist/gpu}"
TESTS=(codec_kernels_test attention_test cuda_backend_test)
bazel build -c opt //gpu:codec_kernels_test //gpu:attention_test //gpu:cuda_backend_test \
  //gpu:libtqkv_gpu_capi.so //bench:gpu_codec_bench
rm -rf "$DEST"
mkdir -p "$DEST/lib"
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
for t in "${TESTS[@]}"; do cp "$BIN/gpu/$t" "$DEST/"; done
cp "$BIN/bench/gpu_codec_bench" "$BIN/gpu/libtqkv_gpu_capi.so" "$DEST/"
cp bench/gpu_attention_bench.py "$DEST/"
chmod u+w "$DEST"/*
# Non-glibc shared libraries (glibc, libstdc++ and libgcc_s come from the host).
for f in "$DEST"/*_test "$DEST/gpu_codec_bench" "$DEST/libtqkv_gpu_capi.so"; do
  ldd "$f" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libdl|libpthread|librt)\.so' \
    | while read -r lib; do cp -n "$lib" "$DEST/lib/" 2>/dev/null || true; done
done
cat > "$DEST/run_all.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every GPU test and benchmark of the bundle; logs go to $OUT (or ./logs).
HERE="$(cd "$(dirname "$0")" && pwd)"
LOGS="${OUT:-$HERE/logs}"
mkdir -p "$LOGS"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > "$LOGS/device.txt" 2>&1
for t in codec_kernels_test attention_test cuda_backend_test; do
  timeout 240 "$HERE/$t" --gtest_brief=1 > "$LOGS/$t.log" 2>&1; rc=$?
  echo "$t rc=$rc" | tee -a "$LOGS/summary.txt"; [ $rc -eq 0 ] || status=1
done
timeout 180 "$HERE/gpu_codec_bench" 50 > "$LOGS/gpu_codec_bench.log" 2>&1; echo "gpu_codec_bench rc=$?" | tee -a "$LOGS/summary.txt"
timeout 300 python3 "$HERE/gpu_attention_bench.py" --lib "$HERE/libtqkv_gpu_capi.so" --iters 50 \
  > "$LOGS/gpu_attention_bench.log" 2>&1; echo "gpu_attention_bench rc=$?" | tee -a "$LOGS/summary.txt"
exit $status
RUN
chmod +x "$DEST/run_all.sh"
du -sh "$DEST"
