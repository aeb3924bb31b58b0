#!/usr/bin/env bash
# End-to-end checks of the codec subcommands of the real tqkv binary.
set -euo pipefail
TQKV="${TEST_SRCDIR:-.}/tqkv/client/cli/tqkv"
[ -x "$TQKV" ] || TQKV="$(dirname "$0")/tqkv"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$TQKV" codebook --dim 128 --bits 2)
[ "$(echo "$out" | wc -l)" = 5 ] || fail "codebook 2 bits should print 4 centroids + d_mse: $out"
echo "$out" | head -1 | grep -q '^-0.1330415' || fail "first centroid: $out"
echo "$out" | tail -1 | grep -q '^d_mse=0.1160000' || fail "d_mse line: $out"
# At least 10 significant digits per centroid.
echo "$out" | head -4 | while read -r c; do
  digits=$(echo "$c" | tr -d -- '-.' | sed 's/^0*//' | sed 's/e.*//')
  [ ${#digits} -ge 10 ] || fail "centroid $c has fewer than 10 significant digits"
done
# Ascending order.
echo "$out" | head -4 | sort -g -c || fail "centroids not ascending"

"$TQKV" codebook --dim 4 --bits 2 >/dev/null 2>&1 && fail "dim 4 must be rejected"
msg=$("$TQKV" codebook --dim 128 --bits 7 2>&1) && fail "bits 7 must be rejected"
echo "$msg" | grep -q "unsupported codebook bits 7" || fail "bits 7 message: $msg"

fmt=$("$TQKV" formats --dim 128)
echo "$fmt" | grep -E '^k4v4 +68 +68 +3.76x' >/dev/null || fail "k4v4 row: $fmt"
echo "$fmt" | grep -E '^k4v2 +68 +36 +4.92x' >/dev/null || fail "k4v2 row: $fmt"
echo "$fmt" | grep -E '^turboquant25 +44 +44 +5.82x +needs metadata' >/dev/null || fail "tq25 row: $fmt"
echo "$fmt" | grep -E '^turboquant35 +64 +64 +4.00x' >/dev/null || fail "tq35 row: $fmt"

"$TQKV" bogus >/dev/null 2>&1 && fail "unknown command must fail"
echo "cli_test: all checks passed"
