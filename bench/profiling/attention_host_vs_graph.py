#!/usr/bin/env python3
"""Host submit time and CUDA-graph replay vs CUDA-event time, served kernel and SDPA.

  attention_host_vs_graph.py LIB gpu_attention_bench.py SHAPES FORMATS
e.g. 64x4096,1x131072 k4v4 (measurement log, bench/history/results-log-2026-11.md:
"16-warp row sets, a timeline of the call, host time").
"""
import sys, time, statistics, torch, importlib.util
spec = importlib.util.spec_from_file_location("b", sys.argv[2]); b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
lib = b.load(sys.argv[1])
QH, KVH, D, BS = 32, 8, 128, 16
dev = torch.device("cuda")
def evt(fn, iters=50):
    for _ in range(3): fn()
    torch.cuda.synchronize(); ts = []; hs = []
    for _ in range(iters):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); h0 = time.perf_counter(); fn(); hs.append((time.perf_counter() - h0) * 1e6); e.record(); e.synchronize()
        ts.append(a.elapsed_time(e) * 1e3)
    return statistics.median(ts), statistics.median(hs)
for fmt in sys.argv[4].split(","):
  for shp in sys.argv[3].split(","):
    batch, ctx = map(int, shp.split("x"))
    stream = torch.cuda.current_stream().cuda_stream
    h = lib.tqkv_gpu_create(fmt.encode(), D, KVH, QH, BS, 7)
    kp, vp, stride, ws, args = b.random_decode(lib, h, batch, ctx)
    def call(s=None):
        rc = lib.tqkv_gpu_attention(*args(batch, s))
        assert rc == 0, lib.tqkv_gpu_last_error()
    t, hs = evt(call)
    h0 = time.perf_counter()
    for _ in range(200): lib.tqkv_gpu_attention_splits(h, batch, ctx, stride, -1)
    plan = (time.perf_counter() - h0) / 200 * 1e6
    g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(s.cuda_stream); torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            call(s.cuda_stream)
    torch.cuda.synchronize()
    tg, hg = evt(lambda: g.replay())
    k = torch.randn(batch, KVH, ctx, D, dtype=torch.float16, device=dev); v = torch.randn_like(k)
    q16 = torch.randn(batch, QH, 1, D, dtype=torch.float16, device=dev)
    sd = lambda: torch.nn.functional.scaled_dot_product_attention(q16, k, v, enable_gqa=True)
    ts, hss = evt(sd)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        sd(); torch.cuda.synchronize()
        with torch.cuda.graph(g2, stream=s):
            o2 = sd()
    torch.cuda.synchronize()
    tsg, _ = evt(lambda: g2.replay())
    print(f"{fmt} {batch}x{ctx}: tqkv event {t:.1f} us (host submit {hs:.1f}, planning {plan:.1f}), graph replay {tg:.1f} us;"
          f" SDPA event {ts:.1f} us (host {hss:.1f}), graph {tsg:.1f} us; ratio event {t/ts:.3f} graph {tg/tsg:.3f}")
    del kp, vp, args, k, v, g, g2
    lib.tqkv_gpu_destroy(h)
