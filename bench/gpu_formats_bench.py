#!/usr/bin/env python3
"""Decode attention of every mse format and head dim, against its own
compute-free stream, in one process.

For each format (K/V bits 2..8, asymmetric pairs) and head dim (64, 96, 128,
256), 32 q heads over 8 kv heads, pages in random order, one query per
sequence: the kernel the attention plan picks (tqkv_gpu_attention, planned
splits), the generic kernel on the same pages, a compute-free stream of the
same packed bytes (a read-only reduction over a buffer of exactly the bytes
the call reads: K and V rows of every token and kv head), and torch fp16
SDPA over the same context. Device time from a cold L2
(gpu_attention_bench.timed_device). Prints stream / served (the fraction of
its floor the served kernel reaches), served / SDPA, and generic / served;
and each served output's relative error against SDPA (the TurboQuant error
of that format: it falls with the bits).

Usage: gpu_formats_bench.py --lib path/libtqkv_gpu_capi.so [--iters 20]
"""
import argparse
import sys

import torch

import gpu_attention_bench as gb

QH, KVH, BS = 32, 8, 16
SHAPES = [(64, 4096), (16, 16384), (4, 65536), (1, 131072)]
# (format, head dim): every mse width at d = 128, asymmetric pairs, and the
# other head dims with the 2-, 3- and 4-bit formats.
FORMATS = [("k2v2", 128), ("k3v3", 128), ("k4v4", 128), ("k5v5", 128), ("k8v8", 128), ("k4v2", 128),
           ("k4v3", 128), ("k8v4", 128), ("k4v4", 64), ("k3v3", 64), ("k4v4", 96), ("k3v3", 96),
           ("k4v4", 256), ("k2v2", 256)]
GOAL_BATCH, GOAL_ONE = 0.7, 0.6  # stream / served at the batch shapes and at 1 x 128K


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--shapes", default="", help="subset, e.g. 64x4096 (default: all)")
    ap.add_argument("--formats", default="", help="subset, e.g. k3v3/128,k4v4/64 (default: all)")
    ap.add_argument("--generic-shapes", default="64x4096,1x131072", help="shapes that also time the generic kernel")
    ap.add_argument("--compare", default="", help="other kernels to time on the same pages, e.g. tiles,format_tiles")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    generic = {tuple(int(x) for x in s.split("x")) for s in args.generic_shapes.split(",") if s}
    formats = [(f.split("/")[0], int(f.split("/")[1])) for f in args.formats.split(",") if f] or FORMATS
    compare = [c for c in args.compare.split(",") if c]
    lib = gb.load(args.lib)
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    flag = torch.empty(8, dtype=torch.uint8, device=dev)
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}")
    print("format   d  shape      kernel         served_us stream_us stream/served  sdpa_us served/sdpa  generic/served  err")
    worst = {}
    for fmt, dim in formats:
        h = lib.tqkv_gpu_create(fmt.encode(), dim, KVH, QH, BS, 7)
        if not h:
            sys.exit(f"create {fmt} d{dim}: {lib.tqkv_gpu_last_error().decode()}")
        kr, vr = lib.tqkv_gpu_row_bytes(h, 0), lib.tqkv_gpu_row_bytes(h, 1)
        for batch, ctx in shapes:
            k, v, q16, q32, table = gb.random_context(batch, ctx, dim, QH, KVH)
            nb = ctx // BS
            kp, vp, stride = gb.encode_pages(lib, h, k, v, table, flag, stream)
            packed = torch.full((batch,), ctx, dtype=torch.int64, device=dev)
            pos = torch.full((batch,), ctx - 1, dtype=torch.int64, device=dev)
            out = torch.empty(batch, QH, dim, dtype=torch.float32, device=dev)
            generic_id = lib.tqkv_gpu_attention_kernel_id(b"generic")
            compare_ids = [lib.tqkv_gpu_attention_kernel_id(c.encode()) for c in compare]
            ws_bytes = max(lib.tqkv_gpu_attention_workspace(h, batch, ctx, stride, 0, kid)
                           for kid in [gb.SERVED, generic_id] + compare_ids)
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev)

            def call(kernel=gb.SERVED):
                return lib.tqkv_gpu_attention(h, kp.data_ptr(), vp.data_ptr(), stride, table.data_ptr(), nb,
                                              packed.data_ptr(), None, pos.data_ptr(), batch, ctx, q32.data_ptr(),
                                              out.data_ptr(), ws.data_ptr(), ws.numel(), 0, kernel, stream)

            if call():
                sys.exit(f"attention {fmt} d{dim}: {lib.tqkv_gpu_last_error().decode()}")
            torch.cuda.synchronize()
            ref = torch.nn.functional.scaled_dot_product_attention(q16, k, v, enable_gqa=True).float()
            err = ((out - ref.reshape(batch, QH, dim)).norm() / ref.norm()).item()
            t_served = gb.timed_device(call, args.iters)
            # The compute-free stream: the bytes of every K and V row the call reads.
            nbytes = batch * ctx * KVH * (kr + vr)
            buf = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
            t_stream = gb.timed_device(lambda: buf.sum(), args.iters)
            del buf
            t_sdpa = gb.timed_device(
                lambda: torch.nn.functional.scaled_dot_product_attention(q16, k, v, enable_gqa=True), args.iters)
            g = ""
            if (batch, ctx) in generic:
                if call(generic_id):
                    sys.exit(f"attention (generic) {fmt} d{dim}: {lib.tqkv_gpu_last_error().decode()}")
                g = f"{gb.timed_device(lambda: call(generic_id), 5) / t_served:10.1f}x"
            for name, kid in zip(compare, compare_ids):
                t = gb.timed_device(lambda: call(kid), args.iters) if call(kid) == 0 else None
                g += f"  {name} {t * 1e3:.1f}us" if t is not None else f"  {name} -"
            kernel = gb.kernel_name(lib, lib.tqkv_gpu_attention_kernel(h, batch, ctx, stride))
            frac = t_stream / t_served
            key = f"{fmt}/d{dim}"
            worst[key] = min(worst.get(key, frac), frac)
            print(f"{fmt:6} {dim:4}  {batch:>2}x{ctx:<7} {kernel:14} {t_served * 1e3:9.1f} {t_stream * 1e3:9.1f} "
                  f"{frac:13.2f} {t_sdpa * 1e3:8.1f} {t_served / t_sdpa:11.2f} {g:>15} {err:.3f}", flush=True)
            del k, v, kp, vp, ws
            torch.cuda.empty_cache()
        lib.tqkv_gpu_destroy(h)
    print(f"\nworst stream/served per format (goal >= {GOAL_BATCH} at the batch shapes, >= {GOAL_ONE} at 1 x 128K):")
    print("  " + "  ".join(f"{k} {v:.2f}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
