#!/usr/bin/env python3
"""Per-block timelines of the row-set decode kernel and the split merge.

Needs a bundle built from a tree patched by instrument_rowset_timeline.py
(the kernels then write %globaltimer stamps past the split records; never
commit or serve such a build). On the GPU machine:
  rowset_timeline.py LIB gpu_attention_bench.py BATCH CONTEXT [FORMAT [CALLS]]
prints, for the last of CALLS launches on random packed pages, quantiles of
each prologue step, the first tile's arrival, the loop, the epilogue and
the merge, in µs (measurement log, bench/history/results-log-2026-11.md:
"16-warp row sets, a timeline of the call, host time").
"""
import sys, torch, importlib.util
spec = importlib.util.spec_from_file_location("b", sys.argv[2]); b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
lib = b.load(sys.argv[1])
batch, ctx = int(sys.argv[3]), int(sys.argv[4]); fmt = sys.argv[5] if len(sys.argv) > 5 else "k4v4"
QH, KVH, D, BS = 32, 8, 128, 16
stream = torch.cuda.current_stream().cuda_stream
h = lib.tqkv_gpu_create(fmt.encode(), D, KVH, QH, BS, 7)
kp, vp, stride, ws, args = b.random_decode(lib, h, batch, ctx, ws_extra=8 << 20)  # the stamps past the records
splits = lib.tqkv_gpu_attention_splits(h, batch, ctx, stride, -1)
states = (batch * QH * 128 * 4 + 255) // 256 * 256
nrec = batch * QH * splits * 258
off = states + (nrec + 1) // 2 * 2 * 4
nblk = batch * splits
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
for it in range(int(sys.argv[6]) if len(sys.argv) > 6 else 3):
    ev[0].record()
    rc = lib.tqkv_gpu_attention(*args(batch, stream))
    ev[1].record()
    assert rc == 0, lib.tqkv_gpu_last_error()
    torch.cuda.synchronize()
st = ws[off: off + nblk * 128].view(torch.int64).view(nblk, 16).cpu().tolist()
mg = ws[off + nblk * 128: off + nblk * 128 + batch * QH * 32].view(torch.int64).view(batch * QH, 4).cpu().tolist()
t0 = min(r[1] for r in st)
def q(xs):
    xs = sorted(xs); n = len(xs)
    return " ".join(f"{xs[int(f * (n - 1))] / 1e3:7.2f}" for f in (0, 0.1, 0.5, 0.9, 0.99, 1.0))
print(f"{batch} x {ctx} {fmt}: splits {splits}, {nblk} blocks; quantiles 0/10/50/90/99/100% in us (from each block's start)")
for name, k in (("tid0 at tile block", 10), ("tid0 first pages in", 11), ("tid0 barriers init", 12),
                ("tid0 TMAs issued", 2), ("sync1", 3), ("tables stored", 4), ("query frags", 6), ("sync2", 5), ("first tile landed", 7), ("loop done (all)", 8), ("block end", 9)):
    print(f"  {name:20s}", q([r[k] - r[1] for r in st]))
for name, k in (("probe: seq length", 13), ("probe: +table entry", 14), ("probe: +other row", 15)):
    print(f"  {name:20s}", q([r[k] for r in st]))
print("  block start (global)", q([r[1] - t0 for r in st]))
print("  block end (global)  ", q([r[9] - t0 for r in st]))
print("  merge start         ", q([m[0] - t0 for m in mg]))
print("  merge wait released ", q([m[1] - t0 for m in mg]))
print("  merge end           ", q([m[2] - t0 for m in mg]))
print(f"  events around the call: {ev[0].elapsed_time(ev[1]) * 1e3:.1f} us (synchronised call; the stamps span "
      f"{(max(m[2] for m in mg) - t0) / 1e3:.1f} us)")
