"""Many requests over one long system prompt: the first request computes
and stores it, each later one finds it with one Lookup and computes only its
own suffix (attending over the stored prefix on the server). Prints each
request's cached and computed tokens, time to first token, decode tokens/s,
and tqkv's byte accounting at the end.

    python3 examples/hf_prefix_sharing.py --server bazel-bin/service/tqkv-server --backend cuda
"""
import argparse
import os
import sys

import torch

import tqkv
import tqkv.hf
from tqkv.hf import random_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_server import LocalServer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=None, help="tqkv-server binary (default $TQKV_SERVER)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--shape", default="gqa8")
    ap.add_argument("--system", type=int, default=4096, help="system prompt tokens")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--user", type=int, default=48, help="each request's own tokens")
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--cache-dtype", default="k4v4")
    args = ap.parse_args()
    device = "cuda" if args.backend != "cpu" and torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    with LocalServer(args.server, args.backend, ["--host_budget_bytes", str(16 << 30)]) as srv, \
            tqkv.Client(srv.address, timeout=600, data_address=srv.data_address) as client:
        model = tqkv.hf.use_tqkv_attention(random_model.random_llama(args.shape, device=device, dtype=dtype))
        vocab = model.config.vocab_size
        store = tqkv.hf.TqkvStore(client, model.config, "prefix-sharing", cache_dtype=args.cache_dtype,
                                  dtype="fp16" if dtype == torch.float16 else "fp32")
        system = random_model.random_prompt(args.system, vocab, seed=21)
        seen = []
        hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
        for r in range(args.requests):
            prompt = torch.cat([system, random_model.random_prompt(args.user, vocab, seed=100 + r)], 1)
            seen.clear()
            hits0 = srv.counter("tqkv_lookup_hit_blocks_total")
            with store.new_cache(prompt) as cache:
                toks, _, ttft, dec = random_model.greedy(model, prompt, cache, args.new)
                cached = cache.cached_tokens
            hits = srv.counter("tqkv_lookup_hit_blocks_total") - hits0
            print(f"request {r}: {prompt.shape[1]} prompt tokens, {cached} cached ({hits:.0f} blocks hit), "
                  f"{seen[0]} computed; ttft {ttft * 1e3:.1f} ms; {(args.new - 1) / dec:.1f} tok/s; "
                  f"tokens {toks[:8]}...", flush=True)
        hook.remove()
        st = store.stats()
        for tier, t in sorted(st.tiers.items()):
            print(f"tqkv {tier}: {t.blocks} blocks, {t.bytes / 2**20:.1f} MiB stored for "
                  f"{t.dense_equivalent_bytes / 2**20:.1f} MiB of fp16 K/V (K {t.packed_k_bytes / 2**20:.1f} "
                  f"MiB, V {t.packed_v_bytes / 2**20:.1f} MiB, norms {t.norms_metadata_bytes / 2**20:.2f} MiB)")
        print(f"compression x{st.compression_ratio:.2f}")


if __name__ == "__main__":
    main()
