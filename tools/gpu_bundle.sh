#!/usr/bin/env bash
# Builds the GPU tests and benchmarks here and bundles them, with their
# non-glibc shared libraries, into a directory that runs on the GPU machine
# (no Bazel there): kernel tests, kernel benchmarks (vs torch SDPA and the
# copy ceiling, partial last blocks), the memory probe, the decode floor and
# the backend encode probe
# (bench/profiling/), and tqkv-server with the decode-loop benchmark and the
# put/get benchmark (service_bench --mode put).
# Usage: tools/gpu_bundle.sh [out_dir=dist/gpu]
# On the GPU machine: dist/gpu/run_all.sh  (logs to $OUT, or ./logs;
# TESTS="attention_test ..." runs only those tests; SKIP_KERNEL_BENCH=1,
# SKIP_ATTENTION_BENCH=1, SKIP_FORMATS_BENCH=1, SKIP_TAIL_BENCH=1 or
# SKIP_E2E=1 leave out the kernel benchmarks, only the decode-vs-SDPA one,
# only the every-format one (FORMATS_ARGS: its flags), only the
# partial-block one, or the decode loop (SKIP_PUT_BENCH=1: its put/get
# benchmark); E2E_ARGS: more decode_loop_bench flags, e.g. "--tensors inline";
# E2E_UNIX=1: the decode loop and the put benchmark on the server's
# Unix-domain socket (--data_socket) instead of loopback TCP);
# SERVER_ARGS: more tqkv-server flags for those (e.g. "--work_threads=0");
# then same-host paths on a server with its host tier pinned
# (--pin_host_tier) and a Unix socket: the decode loop's first step, the
# 1 x 32K step over the socket and through the shared-memory doorbell, and
# over the socket without and with shared memory the decode loop's batches
# and the data-plane puts (SKIP_SAME_HOST=1 leaves them out).
# Same-host GPU memory (CUDA IPC): the Python client's torch tests and the
# prefill benchmark (bench/prefill_ipc_bench.py) run against the bundle's
# server with the bundle's stubs (SKIP_IPC=1 leaves them out). A stock
# transformers model on tqkv: client/python/tests/test_hf.py (the README's
# code and the examples included) against `--backend cuda`, then
# examples/hf_accuracy.py (SKIP_HF=1 leaves them out; HF_ARGS: its flags).
# The device tool carries at most 64 MiB, and every binary holds the CUDA
# fatbins (~10 MB), so a compressed copy is made too: carry `dist/gpu_xz`
# and run `dist/gpu_xz/run_all.sh` (it unpacks to a temp dir and runs).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/bundle_lib.sh
DEST="${1:-dist/gpu}"
TESTS=(codec_kernels_test attention_test cuda_backend_test cuda_ipc_test)
bazel build -c opt //gpu:codec_kernels_test //gpu:attention_test //gpu:cuda_backend_test //gpu:cuda_ipc_test \
  //gpu:cuda_ipc_exporter //proto/tqkv/v1:tqkv_py_proto \
  //gpu:libtqkv_gpu_capi.so //bench:gpu_codec_bench //service:tqkv-server //bench:decode_loop_bench \
  //bench/profiling:memory_probe //bench/profiling:decode_floor //bench/profiling:encode_probe //bench:service_bench
rm -rf "$DEST"
mkdir -p "$DEST/lib"
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
for t in "${TESTS[@]}" cuda_ipc_exporter; do cp "$BIN/gpu/$t" "$DEST/"; done
# The Python client, its tests and the stubs (Debian's pure-Python protobuf
# as a fallback for a runtime that refuses them), for the IPC step.
mkdir -p "$DEST/py/proto/tqkv/v1" "$DEST/pyfallback/google"
cp -r client/python/tqkv client/python/tests "$DEST/py/"
cp bench/prefill_ipc_bench.py "$DEST/py/"
cp README.md "$DEST/" && cp -r examples "$DEST/examples"
cp "$BIN"/proto/tqkv/v1/tqkv_pb2.py "$BIN"/proto/tqkv/v1/tqkv_pb2_grpc.py "$DEST/py/proto/tqkv/v1/"
cp -r /usr/lib/python3/dist-packages/google/protobuf "$DEST/pyfallback/google/"
rm -rf "$DEST/pyfallback/google/protobuf/pyext"
find "$DEST/py" "$DEST/pyfallback" -name __pycache__ -prune -exec rm -rf {} +
chmod -R u+w "$DEST/py" "$DEST/pyfallback"
cp "$BIN/bench/gpu_codec_bench" "$BIN/gpu/libtqkv_gpu_capi.so" "$DEST/"
cp "$BIN/service/tqkv-server" "$BIN/bench/decode_loop_bench" "$BIN/bench/profiling/memory_probe" \
  "$BIN/bench/profiling/decode_floor" "$BIN/bench/profiling/encode_probe" "$BIN/bench/service_bench" "$DEST/"
cp bench/gpu_attention_bench.py bench/gpu_tail_bench.py bench/gpu_formats_bench.py "$DEST/"
chmod u+w "$DEST"/*
strip "$DEST"/*_test "$DEST/cuda_ipc_exporter" "$DEST/gpu_codec_bench" "$DEST/tqkv-server" "$DEST/decode_loop_bench" "$DEST/memory_probe" \
  "$DEST/decode_floor" "$DEST/encode_probe" "$DEST/service_bench"
strip --strip-unneeded "$DEST/libtqkv_gpu_capi.so"
bundle_copy_libs "$DEST" "$DEST"/*_test "$DEST/gpu_codec_bench" "$DEST/libtqkv_gpu_capi.so" \
  "$DEST/tqkv-server" "$DEST/decode_loop_bench" "$DEST/encode_probe" "$DEST/service_bench"
chmod -R u+w "$DEST/lib" && strip --strip-unneeded "$DEST"/lib/* 2>/dev/null || true
cat > "$DEST/run_all.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every GPU test and benchmark of the bundle; logs go to $OUT (or ./logs).
HERE="$(cd "$(dirname "$0")" && pwd)"
LOGS="${OUT:-$HERE/logs}"
mkdir -p "$LOGS"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > "$LOGS/device.txt" 2>&1
for t in ${TESTS:-codec_kernels_test attention_test cuda_backend_test cuda_ipc_test}; do
  timeout 240 "$HERE/$t" --gtest_brief=1 > "$LOGS/$t.log" 2>&1; rc=$?
  echo "$t rc=$rc" | tee -a "$LOGS/summary.txt"; [ $rc -eq 0 ] || status=1
done
if [ -z "${SKIP_KERNEL_BENCH:-}" ]; then
  timeout 180 "$HERE/gpu_codec_bench" 50 > "$LOGS/gpu_codec_bench.log" 2>&1; echo "gpu_codec_bench rc=$?" | tee -a "$LOGS/summary.txt"
  timeout 120 "$HERE/memory_probe" > "$LOGS/memory_probe.log" 2>&1; echo "memory_probe rc=$?" | tee -a "$LOGS/summary.txt"
  timeout 120 "$HERE/decode_floor" > "$LOGS/decode_floor.log" 2>&1; echo "decode_floor rc=$?" | tee -a "$LOGS/summary.txt"
  timeout 120 "$HERE/encode_probe" 30 > "$LOGS/encode_probe.log" 2>&1; echo "encode_probe rc=$?" | tee -a "$LOGS/summary.txt"
  if [ -z "${SKIP_ATTENTION_BENCH:-}" ]; then
    timeout 300 python3 "$HERE/gpu_attention_bench.py" --lib "$HERE/libtqkv_gpu_capi.so" --iters 50 \
      > "$LOGS/gpu_attention_bench.log" 2>&1; echo "gpu_attention_bench rc=$?" | tee -a "$LOGS/summary.txt"
  fi
  if [ -z "${SKIP_FORMATS_BENCH:-}" ]; then
    (cd "$HERE" && timeout 400 python3 gpu_formats_bench.py --lib "$HERE/libtqkv_gpu_capi.so" --iters 20 \
      ${FORMATS_ARGS:-}) > "$LOGS/gpu_formats_bench.log" 2>&1; echo "gpu_formats_bench rc=$?" | tee -a "$LOGS/summary.txt"
  fi
  if [ -z "${SKIP_TAIL_BENCH:-}" ]; then
    (cd "$HERE" && timeout 300 python3 gpu_tail_bench.py --lib "$HERE/libtqkv_gpu_capi.so" --iters 30) \
      > "$LOGS/gpu_tail_bench.log" 2>&1; echo "gpu_tail_bench rc=$?" | tee -a "$LOGS/summary.txt"
  fi
fi
# End to end: the decode loop (one data-plane call per layer that appends a
# token and attends) over loopback to tqkv-server on the CUDA backend:
# 32 layers for the single sequences, 8 for the batches (a layer's pages
# exceed the L2 either way, so the per-layer call does not depend on it).
if [ -z "${SKIP_E2E:-}" ]; then
  data="$(mktemp -d)"
  "$HERE/tqkv-server" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --data_dir "$data" \
    --backend cuda --host_budget_bytes 48000000000 --threads 16 --data_socket "$data/dp.sock" ${SERVER_ARGS:-} \
    > "$LOGS/e2e_server.log" 2>&1 &
  spid=$!
  addr=""
  for _ in $(seq 300); do
    addr=$(sed -n 's/^tqkv-server listening on //p' "$LOGS/e2e_server.log" | head -1)
    daddr=$(sed -n "s/^tqkv-server data plane listening on //p" "$LOGS/e2e_server.log" | head -1)
    [ -n "$addr" ] && [ -n "$daddr" ] && break; sleep 0.1
  done
  [ -n "${E2E_UNIX:-}" ] && daddr="unix:$data/dp.sock"
  for fmt in ${E2E_FORMATS:-k4v4 k4v2}; do
    timeout 300 "$HERE/decode_loop_bench" --server "$addr" --data "$daddr" --layers 32 --format "$fmt" \
      --shapes "${E2E_SHAPES:-1x32768,1x131072}" --steps 32 ${E2E_ARGS:-} >> "$LOGS/decode_loop_bench.log" 2>&1
    echo "decode_loop_bench $fmt rc=$?" | tee -a "$LOGS/summary.txt"
  done
  timeout 300 "$HERE/decode_loop_bench" --server "$addr" --data "$daddr" --layers 8 --format k4v4 \
    --shapes "${E2E_BATCH_SHAPES:-16x16384,64x4096,mixed64}" --steps 16 ${E2E_ARGS:-} >> "$LOGS/decode_loop_bench.log" 2>&1
  echo "decode_loop_bench batches rc=$?" | tee -a "$LOGS/summary.txt"
  # A prefill worker's puts and a decode worker's reads: dense and packed
  # over gRPC and the data plane (raw payloads and inline tensors) against a
  # loopback TCP stream and memcpy of the same bytes.
  if [ -z "${SKIP_PUT_BENCH:-}" ]; then
    timeout 300 "$HERE/service_bench" --tqkv "$addr" --tqkv_data "$daddr" --mode put --put_gib 2 \
      --put_frame_mib 8 > "$LOGS/service_bench_put.log" 2>&1
    echo "service_bench put rc=$?" | tee -a "$LOGS/summary.txt"
  fi
  kill "$spid"; wait "$spid"
  # Same-host paths, on a server whose host tier is pinned for DMA
  # (--pin_host_tier; measured once the pinning is done) and that also
  # listens on a Unix socket: a context's first decode step (its upload)
  # beside the heap tier's above; then over the socket, without and with
  # memory shared with the server (--shared_mib), the decode loop's batches
  # and the data-plane puts.
  if [ -z "${SKIP_SAME_HOST:-}" ]; then
    data="$(mktemp -d)"
    "$HERE/tqkv-server" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --data_dir "$data" \
      --backend cuda --host_budget_bytes 48000000000 --threads 16 --pin_host_tier=true \
      --data_socket "$data/dp.sock" --data_busy_poll=200us ${SERVER_ARGS:-} > "$LOGS/same_host_server.log" 2>&1 &
    spid=$!
    for _ in $(seq 1200); do
      grep -q "host tier pinned for DMA\|pinning the host tier stopped" "$LOGS/same_host_server.log" && break
      sleep 0.25
    done
    addr=$(sed -n 's/^tqkv-server listening on //p' "$LOGS/same_host_server.log" | head -1)
    daddr=$(sed -n "s/^tqkv-server data plane listening on //p" "$LOGS/same_host_server.log" | head -1)
    timeout 300 "$HERE/decode_loop_bench" --server "$addr" --data "$daddr" --layers 32 --format k4v4 \
      --shapes 1x32768 --steps 8 --two_call_steps 0 > "$LOGS/decode_loop_bench_pinned.log" 2>&1
    echo "decode_loop_bench pinned rc=$?" | tee -a "$LOGS/summary.txt"
    # The 32-layer step at 1 x 32K over the socket, then through the
    # doorbell (no socket crossed while the loop polls), both sides polling.
    for bell in 0 1; do
      timeout 300 "$HERE/decode_loop_bench" --server "$addr" --data "unix:$data/dp.sock" --layers 32 --format k4v4 \
        --shapes 1x32768 --steps 32 --two_call_steps 0 --reply_poll_us 200 --shared_mib 4 --doorbell $bell \
        >> "$LOGS/decode_loop_bench_doorbell.log" 2>&1
      echo "decode_loop_bench unix doorbell=$bell rc=$?" | tee -a "$LOGS/summary.txt"
    done
    for mib in 0 64; do
      timeout 300 "$HERE/decode_loop_bench" --server "$addr" --data "unix:$data/dp.sock" --layers 8 --format k4v4 \
        --shapes 64x4096,mixed64 --steps 16 --two_call_steps 0 --shared_mib $mib \
        >> "$LOGS/decode_loop_bench_shared.log" 2>&1
      echo "decode_loop_bench unix shared_mib=$mib rc=$?" | tee -a "$LOGS/summary.txt"
    done
    for mib in 0 128; do
      timeout 300 "$HERE/service_bench" --tqkv "$addr" --tqkv_data "unix:$data/dp.sock" --mode put --put_gib 2 \
        --put_frame_mib 8 --paths "dense, data plane;packed, data plane" --server_pid $spid --shared_mib $mib \
        >> "$LOGS/service_bench_put_same_host.log" 2>&1
      echo "service_bench put unix shared_mib=$mib rc=$?" | tee -a "$LOGS/summary.txt"
    done
    kill "$spid"; wait "$spid"
  fi
fi
# The Python steps: the bundle's server, client and stubs.
if [ -z "${SKIP_IPC:-}" ] || [ -z "${SKIP_HF:-}" ]; then
  export TQKV_SERVER="$HERE/tqkv-server" PYTHONPATH="$HERE/py:$HERE/py/tests${PYTHONPATH:+:$PYTHONPATH}"
  if ! python3 -c "from proto.tqkv.v1 import tqkv_pb2" 2>/dev/null; then
    export PYTHONPATH="$HERE/pyfallback:$PYTHONPATH" PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
  fi
fi
if [ -z "${SKIP_IPC:-}" ]; then
  (cd "$HERE/py/tests" && timeout 300 python3 -m pytest -q -p no:cacheprovider test_cuda_ipc.py \
    test_cuda_tensors.py) > "$LOGS/test_cuda_ipc.log" 2>&1; rc=$?
  echo "test_cuda_ipc rc=$rc" | tee -a "$LOGS/summary.txt"; [ $rc -eq 0 ] || status=1
  timeout 400 python3 "$HERE/py/prefill_ipc_bench.py" ${IPC_ARGS:-} > "$LOGS/prefill_ipc_bench.log" 2>&1
  echo "prefill_ipc_bench rc=$?" | tee -a "$LOGS/summary.txt"
fi
if [ -z "${SKIP_HF:-}" ]; then
  (cd "$HERE/py/tests" && TQKV_HF_BACKEND=cuda TQKV_REPO_ROOT="$HERE" timeout 400 python3 -m pytest -q -s \
    -p no:cacheprovider test_hf.py) > "$LOGS/test_hf.log" 2>&1; rc=$?
  echo "test_hf rc=$rc" | tee -a "$LOGS/summary.txt"; [ $rc -eq 0 ] || status=1
  timeout 400 python3 "$HERE/examples/hf_accuracy.py" --backend cuda --json "$LOGS/hf_accuracy.json" ${HF_ARGS:-} \
    > "$LOGS/hf_accuracy.log" 2>&1
  echo "hf_accuracy rc=$?" | tee -a "$LOGS/summary.txt"
fi
exit $status
RUN
chmod +x "$DEST/run_all.sh"
du -sh "$DEST"
bundle_pack "$DEST" run_all.sh
