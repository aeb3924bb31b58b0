#!/usr/bin/env bash
# Runs the Python client's pytest suite under Bazel with Debian's python3
# (it sees python3-grpcio/-protobuf/-numpy/-pytest). Arguments select test
# files (relative to client/python/tests); none means all of them.
set -euo pipefail
ROOT="${TEST_SRCDIR:?run me through bazel test}/${TEST_WORKSPACE:-tqkv}"
export PYTHONPATH="$ROOT:$ROOT/client/python"   # generated stubs (proto/...) + the package
export PYTHONDONTWRITEBYTECODE=1
export TQKV_SERVER="$ROOT/service/tqkv-server"
files=()
for f in "$@"; do files+=("$ROOT/client/python/tests/$f"); done
((${#files[@]})) || files=("$ROOT/client/python/tests")
cd "${TEST_TMPDIR:-/tmp}"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider -o "junit_family=xunit2" \
  ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} "${files[@]}"
