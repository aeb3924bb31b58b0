#!/usr/bin/env bash
# Bundles what tqkv.hf needs on the GPU machine beside the work tree (which
# the device tool copies there): tqkv-server (-c opt, CUDA backend linked in)
# with its non-glibc shared libraries, the generated Python stubs, and
# Debian's pure-Python protobuf as a fallback for a protobuf runtime that
# refuses the stubs. The machine has torch, transformers, grpcio and numpy.
# Usage: tools/hf_bundle.sh [out_dir=dist/hf]; carry `dist/hf_xz`, then in the
# repository root:
#   dist/hf_xz/env.sh python3 -m pytest -s client/python/tests/test_hf.py
# env.sh unpacks into a temp dir, sets TQKV_SERVER, LD_LIBRARY_PATH,
# PYTHONPATH (client/python + the stubs) and runs its arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/bundle_lib.sh
DEST="${1:-dist/hf}"
bazel build -c opt //service:tqkv-server //proto/tqkv/v1:tqkv_py_proto
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
rm -rf "$DEST"
mkdir -p "$DEST/py/proto/tqkv/v1" "$DEST/pyfallback/google"
cp "$BIN/service/tqkv-server" "$DEST/"
cp "$BIN"/proto/tqkv/v1/tqkv_pb2.py "$BIN"/proto/tqkv/v1/tqkv_pb2_grpc.py "$DEST/py/proto/tqkv/v1/"
cp -r /usr/lib/python3/dist-packages/google/protobuf "$DEST/pyfallback/google/"
rm -rf "$DEST/pyfallback/google/protobuf/pyext" && find "$DEST/pyfallback" -name __pycache__ -prune -exec rm -rf {} +
chmod -R u+w "$DEST"
strip "$DEST/tqkv-server"
bundle_copy_libs "$DEST" "$DEST/tqkv-server"
chmod -R u+w "$DEST/lib" && strip --strip-unneeded "$DEST"/lib/* 2>/dev/null || true
cat > "$DEST/env.sh" <<'RUN'
#!/usr/bin/env bash
# Runs its arguments (in the caller's directory, the repository root) with
# the bundle's server, libraries and Python stubs.
HERE="$(cd "$(dirname "$0")" && pwd)"
export TQKV_SERVER="$HERE/tqkv-server"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$PWD/client/python:$HERE/py${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "from proto.tqkv.v1 import tqkv_pb2, tqkv_pb2_grpc" 2>"$HERE/stub_check.txt"; then
  echo "tqkv: the installed protobuf refuses the stubs ($(tail -1 "$HERE/stub_check.txt")); using the bundled pure-Python protobuf"
  export PYTHONPATH="$HERE/pyfallback:$PYTHONPATH" PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
fi
exec "$@"
RUN
chmod +x "$DEST/env.sh"
du -sh "$DEST"
bundle_pack "$DEST" env.sh
