#!/usr/bin/env bash
# Installs what is missing and starts tqkv-server on its embedded defaults:
# gRPC on 127.0.0.1:50051, Prometheus /metrics on 127.0.0.1:9464, RocksDB spill
# under ./data, the CUDA backend when a GPU is usable, else the CPU backend.
# Extra arguments go to the server (e.g. --listen 127.0.0.1:6000);
# `tools/serve.sh --help` lists every flag.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
echo "tqkv: building the server (first build takes a few minutes)..." >&2
# The commit goes into tqkv_build_info (service/build_info.h).
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || true)
bazel build -c opt ${commit:+--per_file_copt=service/build_info.cc@-DTQKV_COMMIT=$commit} \
  //service:tqkv-server >&2
exec "$(bazel info -c opt bazel-bin 2>/dev/null)/service/tqkv-server" "$@"
