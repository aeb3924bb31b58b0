#!/usr/bin/env python3
"""Patches the served lane-row encode (gpu/kernels/encode_rows.cuh) so that
its FWHT runs 4 of its 7 stages (`four_stages`) or none (`no_fwht`), to time
what the rotation costs (measurement log, bench/history/results-log-2026-11.md:
"the goals against their floors; what the gRPC share is"). Either
variant writes wrong indices: it is for timing only and is never served.

Usage, from the repository root:
  python3 bench/profiling/encode_rotation_variants.py four_stages|no_fwht
  bazel build -c opt //bench:gpu_codec_bench    # then run it on the GPU machine
  git checkout gpu/kernels/encode_rows.cuh      # undoes the patch
"""
import pathlib
import sys

PATH = pathlib.Path("gpu/kernels/encode_rows.cuh")
FIRST_STAGES = """  stage(1);
  stage(2);
  stage(4);
  stage(8);"""
ALL_STAGES = FIRST_STAGES + """
  const float sg = u ? -1.0f : 1.0f;  // u = 0: x + other, u = 1: other − x
#pragma unroll
  for (int j = 0; j < 64; ++j) x[j] = __fmaf_rn(sg, x[j], __shfl_xor_sync(kFullMask, x[j], 16));
  stage(16);
  stage(32);"""
VARIANTS = {
    # Stages h = 8, 16 (the shuffle), 32, 64 stay: 4 of 7.
    "four_stages": (FIRST_STAGES, "  stage(8);"),
    "no_fwht": (ALL_STAGES, "  (void)stage;\n  (void)u;"),
}


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in VARIANTS:
        print(__doc__, file=sys.stderr)
        return 2
    old, new = VARIANTS[sys.argv[1]]
    text = PATH.read_text()
    if text.count(old) != 1:
        print(f"{PATH}: FwhtHalfRow is not in the form this script patches "
              "(already patched, or changed since)", file=sys.stderr)
        return 1
    PATH.write_text(text.replace(old, new))
    print(f"patched {PATH}: {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
