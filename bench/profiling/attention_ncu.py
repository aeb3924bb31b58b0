#!/usr/bin/env python3
"""One decode call (the served kernel or another served one) and one torch SDPA call at one
shape, bracketed by cudaProfilerStart/Stop for Nsight Compute.

  ncu --profile-from-start off [--section ...] python3 attention_ncu.py LIB gpu_attention_bench.py SHAPE FORMAT [KERNEL]
e.g. 32x32768 k4v4 rowsets (measurement log, bench/history/results-log-2026-11.md:
"two tiles per step, 2-bit V pair lookups, device-time timing"). Pages
are encoded from random fp16 K/V and randomly permuted, as in the benchmark.
"""
import importlib.util
import sys

import torch

spec = importlib.util.spec_from_file_location("bench", sys.argv[2])
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
lib = b.load(sys.argv[1])
batch, ctx = map(int, sys.argv[3].split("x"))
fmt = sys.argv[4]
kernel_arg = sys.argv[5] if len(sys.argv) > 5 else "served"
dev = torch.device("cuda")
stream = torch.cuda.current_stream().cuda_stream
torch.manual_seed(0)
k = torch.randn(batch, b.KVH, ctx, b.D, dtype=torch.float16, device=dev)
v = torch.randn_like(k)
q16 = torch.randn(batch, b.QH, 1, b.D, dtype=torch.float16, device=dev)
h = lib.tqkv_gpu_create(fmt.encode(), b.D, b.KVH, b.QH, b.BS, 7)
if not h:
    sys.exit(lib.tqkv_gpu_last_error().decode())
nb_per = ctx // b.BS
table = torch.randperm(batch * nb_per, device=dev, dtype=torch.int64).reshape(batch, nb_per).to(torch.int32).contiguous()
flag = torch.zeros(8, dtype=torch.uint8, device=dev)
kp, vp, stride = b.encode_pages(lib, h, k, v, table, flag, stream)
packed = torch.full((batch,), ctx, dtype=torch.int64, device=dev)
pos = torch.full((batch,), ctx - 1, dtype=torch.int64, device=dev)
q32 = q16.float().reshape(batch, b.QH, b.D).contiguous()
out = torch.empty(batch, b.QH, b.D, dtype=torch.float32, device=dev)
kernel = b.SERVED if kernel_arg == "served" else lib.tqkv_gpu_attention_kernel_id(kernel_arg.encode())
if kernel == -1 and kernel_arg != "served":
    sys.exit(f"unknown kernel {kernel_arg}")
ws = torch.empty(lib.tqkv_gpu_attention_workspace(h, batch, ctx, stride, 0, kernel), dtype=torch.uint8, device=dev)
call = b.attention_call(lib, h, kp, vp, stride, table, packed, pos, q32, out, ws, stream)
sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q16, k, v, enable_gqa=True)
for _ in range(3):
    assert call(kernel) == 0, lib.tqkv_gpu_last_error()
    sdpa()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
call(kernel)
sdpa()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print(f"{fmt} {batch}x{ctx} kernel {kernel_arg}: profiled one call and one SDPA call")
