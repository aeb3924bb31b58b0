#!/usr/bin/env python3
"""Host time of one attention submit: ctypes + C API alone (num_queries 0
returns at once) vs the whole submit, and the split-planning call.

  attention_host_parts.py LIB gpu_attention_bench.py SHAPES
"""
import sys, time, statistics, torch, importlib.util
spec = importlib.util.spec_from_file_location("b", sys.argv[2]); b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
lib = b.load(sys.argv[1])
QH, KVH, D, BS = 32, 8, 128, 16
dev = torch.device("cuda")
for shp in sys.argv[3].split(","):
    batch, ctx = map(int, shp.split("x"))
    h = lib.tqkv_gpu_create(b"k4v4", D, KVH, QH, BS, 7)
    nb_per = ctx // BS
    kp, vp, stride, table, packed, pos = b.random_pages(lib, h, batch, ctx)
    q32 = torch.randn(batch, QH, D, dtype=torch.float32, device=dev)
    ws_bytes = lib.tqkv_gpu_attention_workspace(h, batch, ctx, stride, 0)
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=dev)
    out = torch.empty(batch, QH, D, dtype=torch.float32, device=dev)
    st = torch.cuda.current_stream().cuda_stream
    args = lambda nq: (h, kp.data_ptr(), vp.data_ptr(), stride, table.data_ptr(), nb_per, packed.data_ptr(), None,
                       pos.data_ptr(), nq, ctx, q32.data_ptr(), out.data_ptr(), ws.data_ptr(), ws_bytes, 0, 1, st)
    res = {}
    for name, nq in (("ctypes+capi (nq=0)", 0), ("whole submit", batch)):
        ts = []
        for i in range(300):
            a = args(nq)
            t0 = time.perf_counter(); lib.tqkv_gpu_attention(*a); ts.append((time.perf_counter() - t0) * 1e6)
            if i % 20 == 0: torch.cuda.synchronize()
        torch.cuda.synchronize()
        res[name] = statistics.median(ts)
    ts = []
    for i in range(300):
        t0 = time.perf_counter(); lib.tqkv_gpu_attention_splits(h, batch, ctx, stride, 0); ts.append((time.perf_counter() - t0) * 1e6)
    res["splits call"] = statistics.median(ts)
    print(f"{shp}: " + ", ".join(f"{k} {v:.1f} us" for k, v in res.items()))
    lib.tqkv_gpu_destroy(h)
