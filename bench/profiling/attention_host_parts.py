#!/usr/bin/env python3
"""Host time of one attention submit: ctypes + C API alone (num_queries 0
returns at once) vs the whole submit, and the split-planning call.

  attention_host_parts.py LIB gpu_attention_bench.py SHAPES
"""
import sys, time, statistics, torch, importlib.util
spec = importlib.util.spec_from_file_location("b", sys.argv[2]); b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
lib = b.load(sys.argv[1])
QH, KVH, D, BS = 32, 8, 128, 16
for shp in sys.argv[3].split(","):
    batch, ctx = map(int, shp.split("x"))
    h = lib.tqkv_gpu_create(b"k4v4", D, KVH, QH, BS, 7)
    kp, vp, stride, ws, args = b.random_decode(lib, h, batch, ctx)
    st = torch.cuda.current_stream().cuda_stream
    res = {}
    for name, nq in (("ctypes+capi (nq=0)", 0), ("whole submit", batch)):
        ts = []
        for i in range(300):
            a = args(nq, st)
            t0 = time.perf_counter(); lib.tqkv_gpu_attention(*a); ts.append((time.perf_counter() - t0) * 1e6)
            if i % 20 == 0: torch.cuda.synchronize()
        torch.cuda.synchronize()
        res[name] = statistics.median(ts)
    ts = []
    for i in range(300):
        t0 = time.perf_counter(); lib.tqkv_gpu_attention_splits(h, batch, ctx, stride, -1); ts.append((time.perf_counter() - t0) * 1e6)
    res["splits call"] = statistics.median(ts)
    print(f"{shp}: " + ", ".join(f"{k} {v:.1f} us" for k, v in res.items()))
    lib.tqkv_gpu_destroy(h)
