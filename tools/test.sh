#!/usr/bin/env bash
# Installs what is missing (tools/setup.sh) and runs the whole test suite:
# every Bazel test target (C++ unit and integration tests, the Python client's
# pytest suite, promtool checks). GPU tests skip cleanly without a GPU.
# Prints a closing line "N passed, N failed" and exits non-zero on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh || exit 1

log=$(mktemp)
bazel test //... --test_output=errors --test_summary=short "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FAILED TO BUILD|NO STATUS|INCOMPLETE)' "$log")
rm -f "$log"
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "${passed} passed, ${failed} failed"
exit "$rc"
