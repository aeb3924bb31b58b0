#!/usr/bin/env bash
# The tqkv wheel (//client/python:wheel) installed with pip into a new venv,
# then README.md's Python example (the first ```python block after "From
# Python") run by that venv's python from an empty directory against the
# real server: the package must come from the venv, its version must be the
# server's (service/build_info.h), and the example must attend.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:?run me through bazel test}/${TEST_WORKSPACE:-tqkv}"
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/wheel.XXXXXX")"
fail() { echo "FAIL: $*" >&2; exit 1; }
unset PYTHONPATH TQKV_PROTO_PATH

version=$(sed -n 's/^inline constexpr char kTqkvVersion\[\] = "\(.*\)";$/\1/p' "$RUNFILES/service/build_info.h")
[ -n "$version" ] || fail "no kTqkvVersion in service/build_info.h"
grep -q "^version = \"$version\"" "$RUNFILES/client/python/pyproject.toml" ||
  fail "pyproject.toml's version is not the server's $version"
whl="$RUNFILES/client/python/tqkv-$version-py3-none-any.whl"
[ -f "$whl" ] || fail "no wheel $whl"

/usr/bin/python3 -m venv --system-site-packages "$TMP/venv"
"$TMP/venv/bin/pip" install --quiet --no-index --no-deps --no-cache-dir "$whl" || fail "pip install $whl"

SERVER="$RUNFILES/service/tqkv-server"
source "$RUNFILES/tests/start_server.sh"
start_server "$TMP/out" "$TMP/err" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --data_dir="$TMP/data" \
  --backend=cpu --threads=1 --data_listen=off

mkdir "$TMP/empty" && cd "$TMP/empty"
"$TMP/venv/bin/python" - "$RUNFILES/README.md" "$ADDR" "$TMP/venv" "$version" <<'PY' || fail "README example"
import importlib.metadata, os, sys
readme, addr, venv, version = sys.argv[1:]
import tqkv
assert os.path.realpath(tqkv.__file__).startswith(os.path.realpath(venv)), tqkv.__file__
assert importlib.metadata.version("tqkv") == version
text = open(readme).read()
section = text[text.index("From Python"):]
code = section[section.index("```python\n") + 10:]
code = code[:code.index("```")]
assert "localhost:50051" in code
ns = {}
exec(compile(code.replace("localhost:50051", addr), "README.md", "exec"), ns)
assert ns["out"].shape == (1, 32, 128), ns["out"].shape
print("README example: hits", ns["hits"], "output", ns["out"].shape)
PY
echo PASS
