#!/usr/bin/env python3
"""Fused paged TurboQuant decode vs torch fp16 SDPA decode, in one process.

Loads libtqkv_gpu_capi.so (ctypes) and times, with CUDA events (median of
--iters runs after warm-up, random data): a D2D copy (HBM ceiling), torch
scaled_dot_product_attention decode on contiguous fp16 K/V (enable_gqa), and
tqkv's paged decode for TQ4 (k4v4) and K4/V2 on randomly permuted pages
(planned splits; the kernel the attention plan picks). Also times every
other served kernel that can run the shape (gpu/attention_plan.h; the
CUDA-core and generic kernels among them) and sweeps forced split counts.
Prints time ratios against SDPA and achieved bandwidth on packed bytes
against the copy ceiling.

Two timings of SDPA and of the served kernel: device time (the calls queued
behind a sleep kernel, each after an L2-evicting read: the GPU's time for
the call, as in a decode loop that queues its layers) is the primary one;
synchronised calls (the GPU idle until the host has submitted the call, so
the host's submit time is included) are printed beside it.

Usage: gpu_attention_bench.py --lib path/libtqkv_gpu_capi.so [--iters 50]
"""
import argparse
import ctypes
import statistics
import sys

import torch

QH, KVH, D, BS = 32, 8, 128, 16
SHAPES = [(64, 4096), (16, 16384), (32, 32768), (4, 65536), (1, 131072)]
GOALS = {"k4v4": 0.35, "k4v2": 0.28, "k2v2": None}
SERVED = -1  # the kernel argument of the C API: the plan's choice
MAX_KERNELS = 8


def timed(fn, iters):
    """Median ms of `iters` calls, each synchronised before the next: the
    events bracket the host's submit too (the GPU idles while it runs)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


_FLUSH = None


EVICT_BY_WRITE = False  # --evict write: dirty-line eviction, an older timing method kept for comparison


def _evict_l2():
    """Reads 256 MiB (4x the H200's L2): L2 then holds clean lines of other
    data. A write (zero_(), EVICT_BY_WRITE) leaves ~60 MiB of dirty lines
    whose write-back competes with the timed call's reads."""
    if EVICT_BY_WRITE:
        _FLUSH.zero_()
    else:
        _FLUSH.sum(dtype=torch.int64)


def timed_device(fn, iters):
    """Median ms of `iters` calls as the GPU runs them: the stream is held by
    a sleep kernel while the host queues every call (each after a 256 MiB
    read that evicts L2, outside the events), so the events bracket device
    time only, from a cold L2. Exits if the host did not finish queueing
    before the sleep ended (the times would then include host time)."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.ones(64 << 20, dtype=torch.int32, device="cuda")
    for _ in range(3):  # also loads the flush and sleep kernels (a lazy load would wait for the sleep)
        _evict_l2()
        fn()
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    held = torch.cuda.Event()
    torch.cuda._sleep(200_000_000)  # ~0.1 s at the H200's clocks
    held.record()
    for a, b in ev:
        _evict_l2()
        a.record()
        fn()
        b.record()
    queued_in_time = not held.query()
    torch.cuda.synchronize()
    if not queued_in_time:
        sys.exit("timed_device: the sleep ended before the calls were queued; lengthen it")
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def load(path):
    lib = ctypes.CDLL(path)
    vp, i64, i32, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint64
    lib.tqkv_gpu_create.restype = vp
    lib.tqkv_gpu_create.argtypes = [ctypes.c_char_p, i32, i32, i32, i32, u64]
    lib.tqkv_gpu_last_error.restype = ctypes.c_char_p
    lib.tqkv_gpu_row_bytes.restype = i64
    lib.tqkv_gpu_row_bytes.argtypes = [vp, i32]
    lib.tqkv_gpu_encode.argtypes = [vp, vp, vp, i32, i64, vp, vp, vp, i64, vp, vp]
    lib.tqkv_gpu_attention_workspace.restype = u64
    lib.tqkv_gpu_attention_workspace.argtypes = [vp, i64, i64, i64, i32, i32]
    lib.tqkv_gpu_attention.argtypes = [vp, vp, vp, i64, vp, i32, vp, vp, vp, i64, i64, vp, vp, vp, u64, i32, i32, vp]
    lib.tqkv_gpu_attention_splits.restype = i32
    lib.tqkv_gpu_attention_splits.argtypes = [vp, i64, i64, i64, i32]
    lib.tqkv_gpu_attention_kernel.restype = i32
    lib.tqkv_gpu_attention_kernel.argtypes = [vp, i64, i64, i64]
    lib.tqkv_gpu_attention_kernel_id.restype = i32
    lib.tqkv_gpu_attention_kernel_id.argtypes = [ctypes.c_char_p]
    lib.tqkv_gpu_attention_kernel_name.restype = ctypes.c_char_p
    lib.tqkv_gpu_attention_kernel_name.argtypes = [i32]
    lib.tqkv_gpu_attention_eligible.restype = i32
    lib.tqkv_gpu_attention_eligible.argtypes = [vp, i64, i64, i64, ctypes.POINTER(i32), i32]
    lib.tqkv_gpu_destroy.argtypes = [vp]
    return lib


def kernel_name(lib, kid):
    return lib.tqkv_gpu_attention_kernel_name(kid).decode()


def eligible_kernels(lib, h, batch, ctx, stride):
    """Ids of the served kernels that can run a decode call of this shape,
    the plan's preference first."""
    ids = (ctypes.c_int * MAX_KERNELS)()
    n = lib.tqkv_gpu_attention_eligible(h, batch, ctx, stride, ids, MAX_KERNELS)
    return list(ids[:n])


def encode_pages(lib, h, k, v, table, flag, stream):
    """Encodes fp16 k, v [batch, KVH, ctx, D] into the pages that table
    ([batch, ctx / BS] int32) names; returns the K and V page regions (one
    stride, the larger page) and the stride."""
    batch, _, ctx, _ = k.shape
    nblocks = table.numel()
    kr, vr = lib.tqkv_gpu_row_bytes(h, 0), lib.tqkv_gpu_row_bytes(h, 1)
    stride = BS * KVH * max(kr, vr)
    kp = torch.empty(nblocks * stride, dtype=torch.uint8, device=k.device)
    vp = torch.empty(nblocks * stride, dtype=torch.uint8, device=k.device)
    # Encode per sequence from [ctx, KVH, D] token-major copies into a
    # contiguous scratch region, then scatter its pages at `stride`.
    kpg = torch.empty(nblocks * BS * KVH * kr, dtype=torch.uint8, device=k.device)
    vpg = torch.empty(nblocks * BS * KVH * vr, dtype=torch.uint8, device=k.device)
    t = torch.arange(ctx, device=k.device)
    for b in range(batch):
        kt = k[b].transpose(0, 1).contiguous()
        vt = v[b].transpose(0, 1).contiguous()
        slots = (table[b].long()[t // BS] * BS + t % BS).contiguous()
        rc = lib.tqkv_gpu_encode(h, kt.data_ptr(), vt.data_ptr(), 0, ctx, slots.data_ptr(), kpg.data_ptr(),
                                 vpg.data_ptr(), nblocks, flag.data_ptr(), stream)
        if rc:
            sys.exit(f"encode: {lib.tqkv_gpu_last_error().decode()}")
    kp.view(nblocks, stride)[:, : BS * KVH * kr] = kpg.view(nblocks, BS * KVH * kr)
    vp.view(nblocks, stride)[:, : BS * KVH * vr] = vpg.view(nblocks, BS * KVH * vr)
    return kp, vp, stride


def random_context(batch, ctx, dim, qh=None, kvh=None):
    """Random fp16 K/V [batch, kvh, ctx, dim], queries q16 [batch, qh, 1,
    dim] and their fp32 copy [batch, qh, dim], and a block table of
    randomly permuted pages ([batch, ctx / BS] int32), seeded."""
    qh, kvh = qh or QH, kvh or KVH
    dev = torch.device("cuda")
    torch.manual_seed(0)
    k = torch.randn(batch, kvh, ctx, dim, dtype=torch.float16, device=dev)
    v = torch.randn(batch, kvh, ctx, dim, dtype=torch.float16, device=dev)
    q16 = torch.randn(batch, qh, 1, dim, dtype=torch.float16, device=dev)
    q32 = q16.float().reshape(batch, qh, dim).contiguous()
    nb = ctx // BS
    table = torch.randperm(batch * nb, device=dev, dtype=torch.int64).reshape(batch, nb).to(torch.int32)
    return k, v, q16, q32, table.contiguous()


def random_pages(lib, h, batch, ctx):
    """Pages for the profiling scripts (bench/profiling/): random bytes, not
    encoded rows, in randomly permuted pages of `batch` sequences of `ctx`
    tokens, query i at sequence i's last position. Returns kp, vp (K and V
    page regions at one stride), stride, table, packed, pos."""
    dev = torch.device("cuda")
    nb_per = ctx // BS
    nblocks = batch * nb_per
    stride = BS * KVH * max(lib.tqkv_gpu_row_bytes(h, 0), lib.tqkv_gpu_row_bytes(h, 1))
    kp = torch.randint(0, 255, (nblocks * stride,), dtype=torch.uint8, device=dev)
    vp = torch.randint(0, 255, (nblocks * stride,), dtype=torch.uint8, device=dev)
    table = torch.randperm(nblocks, device=dev, dtype=torch.int64).reshape(batch, nb_per).to(torch.int32).contiguous()
    packed = torch.full((batch,), ctx, dtype=torch.int64, device=dev)
    pos = torch.full((batch,), ctx - 1, dtype=torch.int64, device=dev)
    return kp, vp, stride, table, packed, pos


def random_decode(lib, h, batch, ctx, ws_extra=0):
    """random_pages() plus random queries, an output and a workspace
    (ws_extra bytes more than the call needs) for one decode call over them.
    Returns kp, vp, stride, ws and args(nq=batch, stream=None): the argument
    tuple of tqkv_gpu_attention (served path, planned splits; stream None:
    the current one), so a caller can time the C call alone."""
    dev = torch.device("cuda")
    kp, vp, stride, table, packed, pos = random_pages(lib, h, batch, ctx)
    q32 = torch.randn(batch, QH, D, dtype=torch.float32, device=dev)
    ws_bytes = lib.tqkv_gpu_attention_workspace(h, batch, ctx, stride, 0, SERVED)
    ws = torch.zeros(ws_bytes + ws_extra, dtype=torch.uint8, device=dev)
    out = torch.empty(batch, QH, D, dtype=torch.float32, device=dev)

    def args(nq=batch, stream=None):
        st = stream if stream is not None else torch.cuda.current_stream().cuda_stream
        return (h, kp.data_ptr(), vp.data_ptr(), stride, table.data_ptr(), ctx // BS, packed.data_ptr(), None,
                pos.data_ptr(), nq, ctx, q32.data_ptr(), out.data_ptr(), ws.data_ptr(), ws_bytes, 0, SERVED, st)
    return kp, vp, stride, ws, args


def attention_call(lib, h, kp, vp, stride, table, packed, pos, q32, out, ws, stream):
    """call(kernel=SERVED, splits=0) -> rc: one decode call over the pages
    (query i is sequence i's) on a served kernel (its id; SERVED: the
    plan's choice) with planned (0) or forced splits."""
    batch, nblocks_per = table.shape
    ctx = nblocks_per * BS
    return lambda kernel=SERVED, splits=0: lib.tqkv_gpu_attention(
        h, kp.data_ptr(), vp.data_ptr(), stride, table.data_ptr(), nblocks_per, packed.data_ptr(),
        None, pos.data_ptr(), batch, ctx, q32.data_ptr(), out.data_ptr(), ws.data_ptr(),
        ws.numel(), splits, kernel, stream)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--shapes", default="", help="subset, e.g. 32x32768,1x131072 (default: all)")
    ap.add_argument("--formats", default="", help="subset, e.g. k4v4 (default: all)")
    ap.add_argument("--quick", action="store_true",
                    help="served kernel vs SDPA only (no other kernels or split sweep); for profiling")
    ap.add_argument("--kernels", default="",
                    help="other served kernels to time, by name (default: every one that can run the shape; "
                         "with --quick: none), e.g. staged_tma,tiles")
    ap.add_argument("--evict", choices=["read", "write"], default="read",
                    help="how device timing evicts L2 before each call (write: dirty lines, for comparison)")
    args = ap.parse_args()
    global EVICT_BY_WRITE
    EVICT_BY_WRITE = args.evict == "write"
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    formats = [f for f in args.formats.split(",") if f] or list(GOALS)
    lib = load(args.lib)
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}")

    src = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), args.iters)
    ceiling = 2 * src.numel() / (ms * 1e-3)
    print(f"copy ceiling (D2D, read+write): {ceiling / 1e12:.2f} TB/s ({ms:.3f} ms for 2 GiB)")
    del src, dst

    handles = {f: lib.tqkv_gpu_create(f.encode(), D, KVH, QH, BS, 7) for f in formats}
    for f, h in handles.items():
        if not h:
            sys.exit(f"create {f}: {lib.tqkv_gpu_last_error().decode()}")
    flag = torch.empty(8, dtype=torch.uint8, device=dev)
    rows = []
    for batch, ctx in shapes:
        torch.manual_seed(0)
        k = torch.randn(batch, KVH, ctx, D, dtype=torch.float16, device=dev)
        v = torch.randn(batch, KVH, ctx, D, dtype=torch.float16, device=dev)
        q16 = torch.randn(batch, QH, 1, D, dtype=torch.float16, device=dev)
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q16, k, v, enable_gqa=True)
        ref = sdpa().float().reshape(batch, QH, D)
        t_sdpa = timed_device(sdpa, args.iters)
        t_sdpa_sync = timed(sdpa, args.iters)
        fp16_bytes = 2 * k.numel() * 2
        line = (f"{batch:3d} x {ctx:6d}: SDPA {t_sdpa:.3f} ms ({fp16_bytes / t_sdpa / 1e9:.2f} TB/s of fp16 KV; "
                f"synchronised calls {t_sdpa_sync:.3f} ms)")
        nblocks_per = ctx // BS
        nblocks = batch * nblocks_per
        perm = torch.randperm(nblocks, device=dev, dtype=torch.int64)
        table = perm.reshape(batch, nblocks_per).to(torch.int32).contiguous()
        packed = torch.full((batch,), ctx, dtype=torch.int64, device=dev)
        # Query i is sequence i's decode query: query_seq null (as the
        # service passes it for decode batches).
        pos = torch.full((batch,), ctx - 1, dtype=torch.int64, device=dev)
        q32 = q16.float().reshape(batch, QH, D).contiguous()
        for f, h in handles.items():
            kr, vr = lib.tqkv_gpu_row_bytes(h, 0), lib.tqkv_gpu_row_bytes(h, 1)
            kp, vp, stride = encode_pages(lib, h, k, v, table, flag, stream)
            # Split counts: planned (0), the CUDA-core kernel's plan, and a sweep.
            old_splits = min(max(1, -(-(132 * 8) // (batch * KVH))), max(1, -(-ctx // 256)), 1024)
            sweep = [s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
                     if s * batch * KVH <= 8192 and s <= max(1, ctx // 256)]
            served = lib.tqkv_gpu_attention_kernel(h, batch, ctx, stride)
            eligible = eligible_kernels(lib, h, batch, ctx, stride)
            asked = [lib.tqkv_gpu_attention_kernel_id(n.encode()) for n in args.kernels.split(",") if n]
            if -1 in asked:
                sys.exit(f"--kernels: unknown name in {args.kernels}")
            others = [kid for kid in (asked or ([] if args.quick else eligible)) if kid != served and kid in eligible]
            ws_bytes = max([lib.tqkv_gpu_attention_workspace(h, batch, ctx, stride, s, SERVED)
                            for s in [0] + sweep] +
                           [lib.tqkv_gpu_attention_workspace(h, batch, ctx, stride, s, kid)
                            for kid in others for s in (0, old_splits)])
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev)
            out = torch.empty(batch, QH, D, dtype=torch.float32, device=dev)
            call = attention_call(lib, h, kp, vp, stride, table, packed, pos, q32, out, ws, stream)
            if call():
                sys.exit(f"attention: {lib.tqkv_gpu_last_error().decode()}")
            torch.cuda.synchronize()
            err = ((out - ref).norm() / ref.norm()).item()
            t_tq = timed_device(call, args.iters)
            t_tq_sync = timed(call, args.iters)
            sync = f"synchronised calls {t_tq_sync:.3f} ms, ratio {t_tq_sync / t_sdpa_sync:.3f}x"
            floor = batch * ctx * KVH * (kr + vr)
            bw = floor / (t_tq * 1e-3)
            # The other served kernels that can run the shape, each with its
            # own planned splits (the generic kernel only where it is quick).
            var = []
            for kid in others:
                if kernel_name(lib, kid) == "generic" and batch * ctx > 16 * 16384:
                    continue
                if call(kid):
                    sys.exit(f"attention ({kernel_name(lib, kid)}): {lib.tqkv_gpu_last_error().decode()}")
                torch.cuda.synchronize()
                err_v = ((out - ref).norm() / ref.norm()).item()
                var.append((kid, timed_device(lambda: call(kid), args.iters),
                            lib.tqkv_gpu_attention_splits(h, batch, ctx, stride, kid), err_v))
            var_line = ("\n        other kernels (ms @splits, TB/s, err): "
                        + "  ".join(f"{kernel_name(lib, kid)}: {t:.3f}@{sp} {floor / (t * 1e-3) / 1e12:.2f} {e:.3f}"
                                    for kid, t, sp, e in var)) if var else ""
            if args.quick:
                line += (f"\n    {f}: {t_tq:.3f} ms  ratio {t_tq / t_sdpa:.3f}x SDPA  "
                         f"{bw / 1e12:.2f} TB/s of packed bytes  rel.err vs fp16 SDPA {err:.3f}  ({sync})" + var_line)
                del kp, vp, ws, out
                continue
            cuda_core = lib.tqkv_gpu_attention_kernel_id(b"cuda_core")
            t_old, err_old = float("nan"), float("nan")
            if cuda_core in eligible:  # at the CUDA-core kernel's own split plan
                if call(cuda_core, old_splits):
                    sys.exit(f"attention (CUDA-core kernel): {lib.tqkv_gpu_last_error().decode()}")
                torch.cuda.synchronize()
                err_old = ((out - ref).norm() / ref.norm()).item()
                t_old = timed_device(lambda: call(cuda_core, old_splits), args.iters)
            sw = []
            for s in sweep:
                if call(SERVED, s):
                    sys.exit(f"attention splits={s}: {lib.tqkv_gpu_last_error().decode()}")
                sw.append((timed_device(lambda: call(SERVED, s), max(5, args.iters // 2)), s))
            best_t, best_s = min(sw)
            ratio = t_tq / t_sdpa
            line += (f"\n    {f}: {t_tq:.3f} ms  ratio {ratio:.3f}x SDPA (goal <= {GOALS[f] or '-'})  "
                     f"packed {floor / 1e6:.1f} MB -> {bw / 1e12:.2f} TB/s = {bw / ceiling:.2f} of copy ceiling  "
                     f"kernel={kernel_name(lib, served)}  rel.err vs fp16 SDPA {err:.3f}  ({sync})"
                     f"\n        CUDA-core fast kernel (splits {old_splits}): {t_old:.3f} ms (rel.err {err_old:.3f});"
                     f" split sweep best {best_t:.3f} ms at {best_s} splits ("
                     + " ".join(f"{s}:{t:.3f}" for t, s in sorted(sw, key=lambda x: x[1])) + ")" + var_line)
            rows.append((batch, ctx, f, t_sdpa, t_tq, ratio, bw / 1e12, t_sdpa_sync, t_tq_sync, t_tq_sync / t_sdpa_sync,
                         t_old, best_t, best_s))
            del kp, vp, ws, out
        print(line, flush=True)
        del k, v
        torch.cuda.empty_cache()
    print("\nsummary: device time (queued calls, cold L2) and synchronised calls (host submit included)\n"
          "  (batch, ctx, format, sdpa_ms, tq_ms, ratio, packed_TB/s, sync: sdpa_ms, tq_ms, ratio, "
          "cuda_core_kernel_ms, sweep_best_ms, sweep_best_splits)")
    for r in rows:
        print("  %3d %6d %-5s %.3f %.3f %.3f %.2f  sync %.3f %.3f %.3f  %.3f %.3f %d" % r)


if __name__ == "__main__":
    main()
