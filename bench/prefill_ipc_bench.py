"""What a prefill worker on the server's host does with a finished context:
its paged K/V cache (torch, on the GPU) goes into tqkv, and a decode worker
pulls it back dense into its own cache. Timed paths, the same bytes each:

  ipc put     put_blocks_device: the server encodes from the worker's GPU
              memory (CUDA IPC); nothing crosses the socket but slots
  wire put    the worker copies the blocks to the host (.cpu()) and puts them
              over the data plane (the server encodes on the GPU)
  ipc get     get_blocks_device: decoded straight into the worker's cache
  wire get    dense get over the data plane, then copied into the cache
Each against a server whose host tier is on the heap, then one whose host
tier is pinned for DMA (--pin_host_tier; it waits for the server's log line
that the pinning is done). Baselines measured in the same run: a
device-to-device copy of the fp16 bytes (torch), and a device-to-host copy
into pinned memory.

Usage (GPU machine, tools/hf_bundle.sh): dist/hf_xz/env.sh python3
bench/prefill_ipc_bench.py [--tokens 32768 --layers 32 --kv_heads 8
--head_dim 128 --format k4v4 --wire_blocks 256 --pinned both|on|off --host_budget 60GB]
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python", "tests"))
import tqkv  # noqa: E402
from conftest import Server  # noqa: E402


def timed(fn, rounds):
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def wait_pinned(server, timeout_s):
    """Waits for the server's log line that its host tier is pinned."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        for line in list(server.lines):
            if "host tier pinned for DMA" in line or "pinning the host tier stopped" in line:
                print(f"server: {line}")
                return
        time.sleep(0.2)
    raise RuntimeError(f"the server did not pin its host tier within {timeout_s} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv_heads", type=int, default=8)
    ap.add_argument("--head_dim", type=int, default=128)
    ap.add_argument("--block_size", type=int, default=16)
    ap.add_argument("--format", default="k4v4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wire_blocks", type=int, default=256, help="blocks of the (slow) wire paths")
    ap.add_argument("--server_args", default="", help="more tqkv-server flags, space-separated")
    ap.add_argument("--pinned", choices=["off", "on", "both"], default="both",
                    help="the server's host tier: on the heap (--pin_host_tier=false), pinned, or both in turn")
    ap.add_argument("--host_budget", default="60GB", help="the server's --host_budget_bytes")
    ap.add_argument("--settle_s", type=float, default=0,
                    help="seconds to wait after the server starts (e.g. while it pins its host tier)")
    a = ap.parse_args()
    blocks = a.tokens // a.block_size
    shape = (blocks, a.block_size, a.kv_heads, a.head_dim)
    g = torch.Generator(device="cuda").manual_seed(1)
    k = [torch.randn(shape, generator=g, device="cuda", dtype=torch.float16) for _ in range(a.layers)]
    v = [torch.randn(shape, generator=g, device="cuda", dtype=torch.float16) for _ in range(a.layers)]
    kv = tqkv.DeviceKv.paged(k, v)
    fp16 = 2 * a.layers * k[0].numel() * 2
    gb = fp16 / 1e9
    print(f"context: {a.tokens} tokens, {a.layers} layers, {a.kv_heads} kv heads x {a.head_dim}, {a.format}: "
          f"{gb:.2f} GB of fp16 K/V in {blocks} blocks; {torch.cuda.get_device_name()}")

    flat = torch.cat([x.reshape(-1) for x in k + v])
    copy = torch.empty_like(flat)
    d2d, _ = timed(lambda: copy.copy_(flat), a.rounds)
    pinned = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=True)
    d2h, _ = timed(lambda: pinned.copy_(flat), a.rounds)
    del copy, flat, pinned
    rows = [("d2d copy (baseline)", d2d, gb), ("d2h copy to pinned (baseline)", d2h, gb)]

    def measure(tier_args):
        """The server-dependent rows, against a server started with `tier_args`."""
        measured = []
        server = Server(os.environ["TQKV_SERVER"], ["--backend", "cuda", "--host_budget_bytes", a.host_budget,
                                                     "--threads", "16"] + tier_args + a.server_args.split())
        if "--pin_host_tier=true" in tier_args:
            wait_pinned(server, 300)
        time.sleep(a.settle_s)
        try:
            with tqkv.Client(server.address, timeout=600) as c, tqkv.DataPlane(server.data_address, timeout=600) as dp:
                m = c.register_model("prefill", num_layers=a.layers, num_kv_heads=a.kv_heads,
                                     num_q_heads=a.kv_heads * 4, head_dim=a.head_dim, block_size=a.block_size,
                                     cache_dtype=a.format)
                slots = list(range(blocks))
                n = [0]

                def ipc_put():
                    n[0] += 1
                    names = [f"r{n[0]}-{i}".encode() for i in range(blocks)]
                    r = dp.put_blocks_device(m, names, kv, slots, fallback=False)
                    assert r.committed == blocks, r
                    return names

                ipc, ipc_best = timed(ipc_put, a.rounds)
                measured.append(("ipc put", ipc, gb))

                def small_put():
                    n[0] += 1
                    dp.put_blocks_device(m, [f"s{n[0]}-{i}".encode() for i in range(16)], kv, slots[:16], fallback=False)

                small, _ = timed(small_put, a.rounds)
                measured.append(("ipc put, 16 blocks (the fixed cost)", small, gb * 16 / blocks))
                wb = min(a.wire_blocks, blocks)
                wire_gb = gb * wb / blocks

                def wire_put():
                    n[0] += 1
                    items = [tqkv.Block(f"w{n[0]}-{i}".encode(), k=kv.block(k, i, a.block_size).cpu(),
                                        v=kv.block(v, i, a.block_size).cpu()) for i in range(wb)]
                    dp.put_blocks(m, items, frame_bytes=32 << 20)

                wire, _ = timed(wire_put, a.rounds)
                measured.append((f"wire put ({wb} blocks, .cpu() included)", wire, wire_gb))

                names = [f"r1-{i}".encode() for i in range(blocks)]
                ok = [torch.zeros_like(x) for x in k]
                ov = [torch.zeros_like(x) for x in v]
                out = tqkv.DeviceKv.paged(ok, ov)
                get, _ = timed(lambda: dp.get_blocks_device(m, names, out, slots, fallback=False), a.rounds)
                measured.append(("ipc get (dense into the cache)", get, gb))
                cg = tqkv.Client(server.address, timeout=600, data_address=server.data_address)

                def wire_get():
                    for i, b in enumerate(cg.get_blocks(m, names[:wb], dense=True, as_torch=True)):
                        out.write_block(i, b.k, b.v)

                wget, _ = timed(wire_get, a.rounds)
                measured.append((f"wire get ({wb} blocks, into the cache)", wget, wire_gb))
                cg.close()
        finally:
            server.stop()
        return measured, ipc, ipc_best

    for tier in (["off", "on"] if a.pinned == "both" else [a.pinned]):
        label = "pinned host tier" if tier == "on" else "heap host tier"
        got, ipc, ipc_best = measure([f"--pin_host_tier={'true' if tier == 'on' else 'false'}"])
        rows += [(f"{name} [{label}]", t, size) for name, t, size in got]
        print(f"[{label}] ipc put best {ipc_best:.4f} s: {gb / ipc_best:.2f} GB/s; a {a.tokens}-token context "
              f"stored in {ipc:.3f} s (median)")
    print(f"{'path':62s} {'median s':>9s} {'GB/s fp16':>10s} {'vs d2d':>7s} {'vs d2h':>7s}")
    for name, t, size in rows:
        rate = size / t
        print(f"{name:62s} {t:9.4f} {rate:10.2f} {rate / (gb / d2d):7.3f} {rate / (gb / d2h):7.3f}")


if __name__ == "__main__":
    main()
