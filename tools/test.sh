#!/usr/bin/env bash
# Installs what is missing (tools/setup.sh) and runs the whole test suite:
# every Bazel test target (C++ unit and integration tests, the Python client's
# pytest suite, promtool checks), then the host-code tests again under
# AddressSanitizer and UndefinedBehaviorSanitizer (.bazelrc's asan and ubsan
# configs; the CUDA kernels are not instrumented, GPU tests skip without a
# GPU). TQKV_SANITIZERS=0 leaves the sanitizer passes out. Then each
# libFuzzer target of fuzz/ runs for TQKV_FUZZ_SECONDS (default 20) through
# tools/fuzz.sh, counted as one test each; TQKV_FUZZ=0 leaves them out.
# Prints a closing line "N passed, N failed" over all passes and exits
# non-zero on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh || exit 1

SANITIZED=(//storage/... //codec/... //service/... //tests/... //client/...)
passed=0
failed=0
rc=0
run() {
  local log
  log=$(mktemp)
  bazel test "$@" --test_output=errors --test_summary=short 2>&1 | tee "$log"
  local r=${PIPESTATUS[0]}
  local p f
  p=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
  f=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FAILED TO BUILD|NO STATUS|INCOMPLETE)' "$log")
  rm -f "$log"
  if [ "$r" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$r" -ne 0 ]; then rc=$r; fi
}
run //... "$@"
if [ "${TQKV_SANITIZERS:-1}" != 0 ]; then
  for config in asan ubsan; do
    echo "== ${config}: ${SANITIZED[*]}"
    run --config="$config" "${SANITIZED[@]}" "$@"
  done
fi
if [ "${TQKV_FUZZ:-1}" != 0 ]; then
  echo "== fuzz: ${TQKV_FUZZ_SECONDS:-20} s per target"
  log=$(mktemp)
  TQKV_FUZZ_SECONDS=${TQKV_FUZZ_SECONDS:-20} tools/fuzz.sh 2>&1 | tee "$log"
  r=${PIPESTATUS[0]}
  p=$(grep -cE '^fuzz [^ ]+: .*: OK$' "$log")
  f=$(grep -cE '^fuzz [^ ]+: FAILED' "$log")
  rm -f "$log"
  if [ "$r" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$r" -ne 0 ]; then rc=$r; fi
fi
echo "${passed} passed, ${failed} failed"
exit "$rc"
