"""What a decode call costs a model process that shares its GPU with
tqkv-server: one data-plane Attend that appends a token and attends (k4v4,
8 kv / 32 q heads, d = 128, a 4K-token sequence), timed three ways in the
same run, alternating:

  host:    q, k, v as host arrays (what the server's work and the transport cost);
  copies:  the same tensors' device-to-host copies and the output's
           host-to-device copy alone, with no call;
  cuda:    the call with CUDA tensors (the client copies them out and the
           output back to the query's device), what tqkv.hf does each layer.

cuda - (host + copies) is what the two processes' turns on the GPU add.

    dist/hf_xz/env.sh python3 bench/shared_gpu_attend_bench.py   # on the GPU machine
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import tqkv  # noqa: E402
from local_server import LocalServer  # noqa: E402

LAYERS, HEADS, QHEADS, DIM, BS = 8, 8, 32, 128, 16


def median_micros(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=None, help="tqkv-server binary (default $TQKV_SERVER)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    def half(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(np.float16)

    with LocalServer(args.server, "cuda", ["--host_budget_bytes", str(8 << 30)]) as srv, \
            tqkv.Client(srv.address, timeout=600, data_address=srv.data_address) as client:
        model = client.register_model("shared-gpu", num_layers=LAYERS, num_kv_heads=HEADS, num_q_heads=QHEADS,
                                      head_dim=DIM, block_size=BS, cache_dtype="k4v4")
        names = [f"b{i}".encode() for i in range(args.context // BS)]
        client.put_blocks(model, [tqkv.Block(h, k=half(LAYERS, BS, HEADS, DIM), v=half(LAYERS, BS, HEADS, DIM),
                                             parent=names[i - 1] if i else b"") for i, h in enumerate(names)])
        seq = client.create_sequence(model, names)
        q, k = half(1, QHEADS, DIM), half(1, HEADS, DIM)
        qc, kc = torch.from_numpy(q).cuda(), torch.from_numpy(k).cuda()
        out = torch.empty_like(qc)

        def host():
            client.attend(0, [(seq, q, None, k, k)])

        def copies():
            for x in (qc, kc, kc):
                x.cpu()
            out.copy_(torch.from_numpy(q))
            torch.cuda.synchronize()

        def cuda():
            client.attend(0, [(seq, qc, None, kc, kc)])
            torch.cuda.synchronize()

        print(f"{args.context}-token k4v4 sequence, one token appended and attended a call; medians of "
              f"{args.calls} calls, µs", flush=True)
        for r in range(args.rounds):
            h, c, g = (median_micros(f, args.calls) for f in (host, copies, cuda))
            print(f"round {r}: host {h:.0f}, copies {c:.0f}, cuda {g:.0f}: the shared GPU adds "
                  f"{g - h - c:.0f} µs a call ({g / (h + c):.2f}x host + copies)", flush=True)
        seq.drop()


if __name__ == "__main__":
    main()
