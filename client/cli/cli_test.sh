#!/usr/bin/env bash
# End-to-end checks of the codec subcommands of the real tqkv binary.
set -euo pipefail
TQKV="${TEST_SRCDIR:-.}/tqkv/client/cli/tqkv"
[ -x "$TQKV" ] || TQKV="$(dirname "$0")/tqkv"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$TQKV" codebook --dim 128 --bits 2)
[ "$(echo "$out" | wc -l)" = 5 ] || fail "codebook 2 bits should print 4 centroids + d_mse: $out"
head -1 <<<"$out" | grep -q '^-0.1330415' || fail "first centroid: $out"
tail -1 <<<"$out" | grep -q '^d_mse=0.1160000' || fail "d_mse line: $out"
# At least 10 significant digits per centroid.
echo "$out" | head -4 | while read -r c; do
  digits=$(echo "$c" | tr -d -- '-.' | sed 's/^0*//' | sed 's/e.*//')
  [ ${#digits} -ge 10 ] || fail "centroid $c has fewer than 10 significant digits"
done
# Ascending order.
echo "$out" | head -4 | sort -g -c || fail "centroids not ascending"

"$TQKV" codebook --dim 4 --bits 2 >/dev/null 2>&1 && fail "dim 4 must be rejected"
msg=$("$TQKV" codebook --dim 128 --bits 7 2>&1) && fail "bits 7 must be rejected"
grep -q "unsupported codebook bits 7" <<<"$msg" || fail "bits 7 message: $msg"

fmt=$("$TQKV" formats --dim 128)
grep -qE '^k4v4 +68 +68 +3.76x' <<<"$fmt" || fail "k4v4 row: $fmt"
grep -qE '^k4v2 +68 +36 +4.92x' <<<"$fmt" || fail "k4v2 row: $fmt"
grep -qE '^turboquant25 +44 +44 +5.82x +needs metadata' <<<"$fmt" || fail "tq25 row: $fmt"
grep -qE '^turboquant35 +64 +64 +4.00x' <<<"$fmt" || fail "tq35 row: $fmt"

# calibrate → verify on a synthetic capture: 2 layers × (K, V) × 10 tokens ×
# 2 kv heads × d 64 fp32, where channels 3 (K) and 5 (V) carry the energy.
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cli.XXXXXX")"
/usr/bin/python3 - "$tmp/capture.f32" <<'PY'
import struct, sys, random
random.seed(1)
vals = []
for layer in range(2):
    for comp in range(2):
        hot = 3 if comp == 0 else 5
        for t in range(10):
            for h in range(2):
                for c in range(64):
                    vals.append(random.gauss(0, 8.0 if c % 8 == hot else 1.0))
open(sys.argv[1], "wb").write(struct.pack("<%df" % len(vals), *vals))
PY
out=$("$TQKV" calibrate --input "$tmp/capture.f32" --recipe turboquant35 --layers 2 --kv-heads 2 \
  --dim 64 --out "$tmp/meta.json" --model-name synthetic 2>/dev/null) || fail "calibrate: $out"
grep -q "wrote .*meta.json (2 layers, 10 tokens observed)" <<<"$out" || fail "calibrate output: $out"
grep -q '"recipe": "turboquant35"' "$tmp/meta.json" || fail "metadata recipe"
out=$("$TQKV" verify --metadata "$tmp/meta.json" --format turboquant35 --dim 64 --kv-heads 2 --layers 2) \
  || fail "verify: $out"
grep -q "^OK: .* row bytes K 36 V 36" <<<"$out" || fail "verify output: $out"
# The high-energy channels were found for every layer, kv head and component.
/usr/bin/python3 - "$tmp/meta.json" <<'PY' || fail "calibrated channels"
import json, sys
m = json.load(open(sys.argv[1]))
for name, layer in m["layers"].items():
    for comp, hot in (("key_high_precision_indices", 3), ("value_high_precision_indices", 5)):
        for head in layer[comp]:
            assert len(head) == 32 and head == sorted(head), (name, comp)
            assert all(c in head for c in range(hot, 64, 8)), (name, comp, head)
PY
msg=$("$TQKV" verify --metadata "$tmp/meta.json" --format turboquant35 --dim 128 --kv-heads 2 --layers 2 2>&1) \
  && fail "verify must reject a head-dim mismatch"
grep -q "^FAIL: " <<<"$msg" || fail "verify mismatch message: $msg"
printf 'garbage' > "$tmp/short.f32"
"$TQKV" calibrate --input "$tmp/short.f32" --recipe turboquant35 --layers 2 --kv-heads 2 --dim 64 \
  --out "$tmp/x.json" >/dev/null 2>&1 && fail "calibrate must reject a capture of the wrong size"
rm -rf "$tmp"

"$TQKV" bogus >/dev/null 2>&1 && fail "unknown command must fail"
echo "cli_test: all checks passed"
