#!/usr/bin/env bash
# Builds the tqkv Python client's wheel, offline: stages client/python's
# package, pyproject.toml and the generated gRPC stubs (their import of
# `proto.tqkv.v1` rewritten to the package's own `tqkv._stubs`), then runs
# `pip wheel --no-build-isolation --no-index` with the installed setuptools.
# Usage: build_wheel.sh PYTHON_DIR STUBS_DIR OUT_DIR
#   PYTHON_DIR: client/python (holds pyproject.toml and tqkv/)
#   STUBS_DIR:  the directory with tqkv_pb2.py and tqkv_pb2_grpc.py
#               (`bazel build //proto/tqkv/v1:tqkv_py_proto`: bazel-bin/proto/tqkv/v1)
#   OUT_DIR:    where the wheel is written (tqkv-VERSION-py3-none-any.whl)
# PYTHON: the interpreter that builds it (default: Debian's /usr/bin/python3,
# which has setuptools and wheel from tools/setup.sh).
set -euo pipefail
PYTHON="${PYTHON:-/usr/bin/python3}"
[ $# -eq 3 ] || { echo "usage: $0 PYTHON_DIR STUBS_DIR OUT_DIR" >&2; exit 2; }
src="$1" stubs="$2" out="$3"
for f in "$src/pyproject.toml" "$src/tqkv/__init__.py" "$stubs/tqkv_pb2.py" "$stubs/tqkv_pb2_grpc.py"; do
  [ -f "$f" ] || { echo "build_wheel: missing $f" >&2; exit 1; }
done
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp -L "$src/pyproject.toml" "$stage/"
mkdir -p "$stage/tqkv/hf" "$stage/tqkv/_stubs"
cp -L "$src"/tqkv/*.py "$stage/tqkv/"
cp -L "$src"/tqkv/hf/*.py "$stage/tqkv/hf/"
cp -L "$stubs/tqkv_pb2.py" "$stage/tqkv/_stubs/"
sed 's/^from proto\.tqkv\.v1 import tqkv_pb2 /from tqkv._stubs import tqkv_pb2 /' "$stubs/tqkv_pb2_grpc.py" \
  > "$stage/tqkv/_stubs/tqkv_pb2_grpc.py"
grep -q '^from tqkv._stubs import tqkv_pb2 ' "$stage/tqkv/_stubs/tqkv_pb2_grpc.py" ||
  { echo "build_wheel: the gRPC stub's import of tqkv_pb2 was not found" >&2; exit 1; }
echo '"""Generated protobuf and gRPC stubs of tqkv.v1 (proto/tqkv/v1/tqkv.proto)."""' > "$stage/tqkv/_stubs/__init__.py"
mkdir -p "$out"
"$PYTHON" -m pip wheel --quiet --no-cache-dir --no-build-isolation --no-index --no-deps -w "$out" "$stage"
ls "$out"/tqkv-*.whl
