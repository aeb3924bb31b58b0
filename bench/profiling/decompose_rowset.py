#!/usr/bin/env python3
"""Patches the working tree's row-set decode call into one of three reduced
forms, each the one before it with one more part taken out, so that timing
them beside the served call and `decode_floor` splits the call's time into
its parts (measurement log, bench/history/results-log-2026-11.md: "the
decode call against its floor, part by part"):

  level 1: a warp's tile step does no arithmetic (it still waits for each
           stage, counts its read and refills it): the loop's compute out;
  level 2: level 1, and no merge kernel (the split records are left as
           they are);
  level 3: level 2, and no lookup tables or query rotation in the block's
           prologue.

Outputs are wrong in every form; the tests must not run on such a build.
Run from the repository root: `python3 bench/profiling/decompose_rowset.py
LEVEL`, build `//gpu:libtqkv_gpu_capi.so`, copy it away, time it with
`gpu_attention_bench.py --quick`, then `git checkout gpu/` to undo.
"""
import sys


def patch(path, pairs):
    with open(path) as f:
        s = f.read()
    for old, new in pairs:
        if s.count(old) != 1:
            sys.exit(f"{path}: expected one occurrence of:\n{old}")
        s = s.replace(old, new)
    with open(path, "w") as f:
        f.write(s)


def main():
    level = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if level not in (1, 2, 3):
        sys.exit("usage: decompose_rowset.py 1|2|3")
    rowset = [
        ("    tiles.Tile(t0 + 16 * (par + P * j), L::kStage * P * k, L::kStage * P * k);", "    (void)0;"),
        ("""    tiles.Tiles2({t0 + 16 * (par + P * j), t0 + 16 * (par + P * (j + 1))},
                 {L::kStage * P * k, L::kStage * P * (k + 1)}, {L::kStage * P * k, L::kStage * P * (k + 1)});""",
         "    (void)0;"),
    ]
    if level >= 3:
        rowset += [
            ("""  BuildTokMTables<VB, L::kSharedKV, L::kRowBytes, L::kKTable, L::kVTable, !L::kSharedKV>(rs_smem, cent, tid,
                                                                                         blockDim.x);""", ""),
            ("""    for (int h = 0; h < G; ++h) qrot.Apply(qy[h], lane);
    tiles.QueryFromLanes(qy, a.scale);""", ""),
        ]
    patch("gpu/kernels/attention_rowset.cuh", rowset)
    if level >= 2:
        patch("gpu/attention.cu", [("""  if (FastMergeEligible(l)) {
    // A programmatic dependent launch""", """  if (MmaEligible(l)) return e;  // decompose_rowset.py: no merge
  if (FastMergeEligible(l)) {
    // A programmatic dependent launch""")])


if __name__ == "__main__":
    main()
