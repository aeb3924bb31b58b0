#!/usr/bin/env python3
"""Decode attention with a partial last block: the kernel time of a context
whose last block is a dense tail (1..15 tokens, as a decode worker's
sequence is between block fills) against the same context block-aligned,
and a mixed batch (64 sequences of different lengths, each with its own
tail) against the aligned batch of the same blocks. One process, CUDA
events, device time from a cold L2 (gpu_attention_bench.timed_device).

Each tail run is checked against torch fp16 SDPA over the same tokens (the
relative error must stay within 1.5x the aligned run's: the TurboQuant
error, not a wrong tail).

Usage: gpu_tail_bench.py --lib path/libtqkv_gpu_capi.so [--iters 30]
"""
import argparse
import ctypes
import sys

import torch

import gpu_attention_bench as gb

QH, KVH, D, BS = gb.QH, gb.KVH, gb.D, gb.BS
SHAPES = [(1, 32768), (1, 131072), (16, 16384), (64, 4096)]
FORMATS = ["k4v4", "k4v2", "k2v2"]
GOAL = 1.1  # tail (or mixed) kernel time / aligned


def load(path):
    lib = gb.load(path)
    vp, i64, i32, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint64
    lib.tqkv_gpu_attention_tail.argtypes = [vp, vp, vp, i64, vp, i32, vp, vp, vp, i64, i64, vp, vp, vp, u64, i32,
                                            i32, vp, vp, i32, vp, i32, vp]
    return lib


class Batch:
    """Sequences over encoded pages: sequence b's first packed[b] tokens in
    its pages, the next tail[b] tokens as fp16 tail rows; query b at its
    last token."""

    def __init__(self, lib, h, k, v, table, kp, vp, stride, packed, tails, q32, force_tail=False):
        dev = k.device
        self.lib, self.h, self.kp, self.vp, self.stride, self.table = lib, h, kp, vp, stride, table
        batch = k.shape[0]
        self.batch = batch
        self.packed = torch.tensor(packed, dtype=torch.int64, device=dev)
        total = [p + t for p, t in zip(packed, tails)]
        self.pos = torch.tensor([n - 1 for n in total], dtype=torch.int64, device=dev)
        self.max_ctx = max(total)
        rows_k, rows_v, offs = [], [], []
        off = 0
        for b in range(batch):
            p, t = packed[b], tails[b]
            offs.append(off)
            off += t
            rows_k.append(k[b, :, p:p + t].transpose(0, 1))  # [t, KVH, D]
            rows_v.append(v[b, :, p:p + t].transpose(0, 1))
        self.tail_k = torch.cat(rows_k).contiguous() if off else torch.zeros(1, KVH, D, dtype=torch.float16, device=dev)
        self.tail_v = torch.cat(rows_v).contiguous() if off else torch.zeros(1, KVH, D, dtype=torch.float16, device=dev)
        self.tail_off = torch.tensor(offs, dtype=torch.int64, device=dev)
        self.has_tail = 1 if off or force_tail else 0
        self.q32 = q32
        self.out = torch.empty(batch, QH, D, dtype=torch.float32, device=dev)
        # The served plan's workspace, or the generic kernel's.
        self.generic = lib.tqkv_gpu_attention_kernel_id(b"generic")
        ws_bytes = max(lib.tqkv_gpu_attention_workspace(h, batch, self.max_ctx, stride, 0, kid)
                       for kid in (gb.SERVED, self.generic))
        self.ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev)
        self.stream = torch.cuda.current_stream().cuda_stream

    def __call__(self, kernel=gb.SERVED):
        return self.lib.tqkv_gpu_attention_tail(
            self.h, self.kp.data_ptr(), self.vp.data_ptr(), self.stride, self.table.data_ptr(),
            self.table.shape[1], self.packed.data_ptr(), None, self.pos.data_ptr(), self.batch, self.max_ctx,
            self.q32.data_ptr(), self.out.data_ptr(), self.ws.data_ptr(), self.ws.numel(), 0, kernel,
            self.tail_k.data_ptr(), self.tail_v.data_ptr(), 0, self.tail_off.data_ptr(), self.has_tail,
            self.stream)


def sdpa_ref(q16, k, v, lengths):
    """fp16 SDPA of each sequence over its first lengths[b] tokens, fp32."""
    outs = []
    for b, n in enumerate(lengths):
        o = torch.nn.functional.scaled_dot_product_attention(q16[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                                             enable_gqa=True)
        outs.append(o.float().reshape(QH, D))
    return torch.stack(outs)


def rel_err(out, ref):
    return ((out - ref).norm() / ref.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--shapes", default="", help="subset, e.g. 1x32768 (default: all)")
    ap.add_argument("--formats", default="", help="subset, e.g. k4v4 (default: k4v4,k4v2,k2v2)")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    formats = [f for f in args.formats.split(",") if f] or FORMATS
    lib = load(args.lib)
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}")
    handles = {f: lib.tqkv_gpu_create(f.encode(), D, KVH, QH, BS, 7) for f in formats}
    for f, h in handles.items():
        if not h:
            sys.exit(f"create {f}: {lib.tqkv_gpu_last_error().decode()}")
    flag = torch.empty(8, dtype=torch.uint8, device=dev)
    worst = {}
    summary = []
    cases = [(b, c, False) for b, c in shapes] + [(64, 8192, True)]
    for batch, ctx, mixed in cases:
        k, v, q16, q32, table = gb.random_context(batch, ctx, D)
        nb = ctx // BS
        g = torch.Generator().manual_seed(1)
        for f, h in handles.items():
            kp, vp, stride = gb.encode_pages(lib, h, k, v, table, flag, stream)
            if not mixed:
                name = f"{batch}x{ctx}"
                aligned = Batch(lib, h, k, v, table, kp, vp, stride, [ctx] * batch, [0] * batch, q32)
                if aligned():
                    sys.exit(f"attention: {lib.tqkv_gpu_last_error().decode()}")
                torch.cuda.synchronize()
                err0 = rel_err(aligned.out, sdpa_ref(q16, k, v, [ctx] * batch))
                t0 = gb.timed_device(aligned, args.iters)
                times = []
                for t in range(1, BS):
                    run = Batch(lib, h, k, v, table, kp, vp, stride, [ctx - BS] * batch, [t] * batch, q32)
                    if run():
                        sys.exit(f"attention (tail {t}): {lib.tqkv_gpu_last_error().decode()}")
                    torch.cuda.synchronize()
                    err = rel_err(run.out, sdpa_ref(q16, k, v, [ctx - BS + t] * batch))
                    if err > 1.5 * err0 + 1e-3:
                        sys.exit(f"{name} {f} tail {t}: rel.err {err:.4f} vs aligned {err0:.4f}")
                    times.append((gb.timed_device(run, args.iters), t))
                tmax, targ = max(times)
                # The tail path with no tail token (has_tail set, every query before the tail): its fixed cost.
                no_token = Batch(lib, h, k, v, table, kp, vp, stride, [ctx] * batch, [0] * batch, q32,
                                 force_tail=True)
                t_flag = gb.timed_device(no_token, args.iters)
                by_len = " ".join(f"{t}:{x * 1e3:.1f}" for x, t in sorted(times, key=lambda p: p[1]) if t in (1, 4, 8, 9, 15))
                line = (f"{name:>9} {f}: aligned {t0 * 1e3:7.1f} us (err {err0:.3f}); tails 1..15 "
                        f"{min(times)[0] * 1e3:.1f}-{tmax * 1e3:.1f} us, worst {tmax / t0:.3f}x at {targ} "
                        f"(us by length {by_len}; tail path, no tail token {t_flag * 1e3:.1f})")
                if batch * ctx <= 32768:  # the generic kernel, what a tail cost before the fast merge attended it
                    run = Batch(lib, h, k, v, table, kp, vp, stride, [ctx - BS] * batch, [5] * batch, q32)
                    if run(run.generic):
                        sys.exit(f"attention (generic kernel): {lib.tqkv_gpu_last_error().decode()}")
                    line += f"; generic kernel, tail 5: {gb.timed_device(lambda: run(run.generic), 5) * 1e3:.1f} us"
                print(line, flush=True)
                summary.append((name, f, t0 * 1e3, tmax * 1e3, tmax / t0))
            else:
                # 64 sequences of 1K..8K tokens, each with a tail of 0..15 tokens;
                # the aligned batch has the same blocks and no tails.
                name = f"mixed{batch}"
                blocks = [int(x) for x in torch.randint(64, nb, (batch,), generator=g)]
                tails = [int(x) for x in torch.randint(0, BS, (batch,), generator=g)]
                packed = [b * BS - BS for b in blocks]
                aligned = Batch(lib, h, k, v, table, kp, vp, stride, [b * BS for b in blocks], [0] * batch, q32)
                run = Batch(lib, h, k, v, table, kp, vp, stride, packed, tails, q32)
                for call in (aligned, run):
                    if call():
                        sys.exit(f"attention: {lib.tqkv_gpu_last_error().decode()}")
                torch.cuda.synchronize()
                err0 = rel_err(aligned.out, sdpa_ref(q16, k, v, [b * BS for b in blocks]))
                err = rel_err(run.out, sdpa_ref(q16, k, v, [p + t for p, t in zip(packed, tails)]))
                if err > 1.5 * err0 + 1e-3:
                    sys.exit(f"{name} {f}: rel.err {err:.4f} vs aligned {err0:.4f}")
                t0 = gb.timed_device(aligned, args.iters)
                t1 = gb.timed_device(run, args.iters)
                print(f"{name:>9} {f}: aligned {t0 * 1e3:7.1f} us (err {err0:.3f}); with tails {t1 * 1e3:.1f} us "
                      f"(err {err:.3f}), {t1 / t0:.3f}x", flush=True)
                summary.append((name, f, t0 * 1e3, t1 * 1e3, t1 / t0))
            del kp, vp
        del k, v
        torch.cuda.empty_cache()
    print(f"\nsummary (kernel us; goal: tail / aligned <= {GOAL})\n  shape format aligned worst_tail ratio")
    for r in summary:
        worst[r[1]] = max(worst.get(r[1], 0), r[4])
        print("  %-9s %-5s %8.1f %8.1f %.3f" % r)
    print("  worst ratio per format: " + "  ".join(f"{f} {x:.3f}" for f, x in worst.items()))


if __name__ == "__main__":
    main()
