#!/usr/bin/env python3
"""Device time of each kernel launch of one decode attention call, by name.

A call is more than its decode kernel: query preparation, the dense tail's
split, the merge. For each format and shape (one query per sequence, a
dense tail of --tail tokens), runs the call --iters times under
torch.profiler (CUDA activity: every kernel of the process, the C API's
included) and prints each kernel's median device time and the sum. Run it
next to the bundle's gpu_tail_bench.py / gpu_attention_bench.py.

Usage: attention_launches.py --lib libtqkv_gpu_capi.so [--formats k3v3,k4v4]
       [--shapes 1x32768] [--tail 5] [--iters 20]
"""
import argparse
import collections
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import gpu_attention_bench as gb
import gpu_tail_bench as tb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--formats", default="k3v3,k4v4")
    ap.add_argument("--shapes", default="1x32768")
    ap.add_argument("--tail", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    lib = tb.load(args.lib)
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    flag = torch.empty(8, dtype=torch.uint8, device=dev)
    for shape in args.shapes.split(","):
        batch, ctx = (int(x) for x in shape.split("x"))
        k, v, _, q32, table = gb.random_context(batch, ctx, tb.D)
        for fmt in args.formats.split(","):
            h = lib.tqkv_gpu_create(fmt.encode(), tb.D, tb.KVH, tb.QH, tb.BS, 7)
            if not h:
                sys.exit(f"create {fmt}: {lib.tqkv_gpu_last_error().decode()}")
            kp, vp, stride = gb.encode_pages(lib, h, k, v, table, flag, stream)
            run = tb.Batch(lib, h, k, v, table, kp, vp, stride, [ctx - tb.BS] * batch, [args.tail] * batch, q32)
            if run():
                sys.exit(f"attention {fmt}: {lib.tqkv_gpu_last_error().decode()}")
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.iters):
                    run()
                torch.cuda.synchronize()
            times = collections.defaultdict(list)
            for e in prof.events():
                if e.device_type.name == "CUDA" and e.name:
                    times[e.name].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
            print(f"{fmt} {shape}, tail {args.tail}: kernel, launches, median us")
            total = 0.0
            for name, ts in sorted(times.items(), key=lambda kv: -statistics.median(kv[1])):
                med = statistics.median(ts)
                total += med * len(ts) / args.iters
                print(f"  {name[:90]:90} {len(ts):4} {med:8.1f}")
            print(f"  sum per call {total:.1f} us", flush=True)
            lib.tqkv_gpu_destroy(h)


if __name__ == "__main__":
    main()
