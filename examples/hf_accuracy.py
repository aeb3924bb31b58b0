"""A stock transformers Llama (seeded random weights, GQA 32/8, head_dim 128)
decoding through tqkv against the same model over transformers' own
DynamicCache, in one run:

  1. per cache dtype: greedy tokens after a prompt, fed the reference's
     tokens (teacher forcing) so every step compares the same inputs:
     top-1 agreement (1.0: free-running greedy equals the reference token
     for token; else the first step where it departs), per-step relative
     logit difference, KL of the next-token
     distribution; time to first token, decode tokens/s and tqkv's share
     of the step; the server's byte accounting. Beside them, in the same
     run, two floors: the same model with transformers' eager attention
     over a DynamicCache (what two correct fp16 kernels differ by), and
     each format in the dense diagnostic mode (transformers' attention over
     the dequantized K/V: the codec's own error, without tqkv's kernels);
  2. prefix reuse: a request sharing the prompt as its prefix computes only
     its suffix (the model's forward token count, the server's Lookup hit
     counter), its time to first token beside a cold request's;
  3. decode at a long context: tokens/s through tqkv Attend beside
     transformers' SDPA (flash attention) over an fp16 DynamicCache.

    python3 examples/hf_accuracy.py --server bazel-bin/service/tqkv-server --backend cuda
"""
import argparse
import json
import os
import sys
import time

import torch
from transformers import DynamicCache

import tqkv
import tqkv.hf
from tqkv.hf import random_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_server import LocalServer  # noqa: E402


def forward_tokens(model):
    """A list that collects the token count of each forward of `model`, and
    the hook's handle."""
    seen = []
    handle = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    return seen, handle


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=None, help="tqkv-server binary (default $TQKV_SERVER)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--shape", default="gqa8", choices=sorted(random_model.SHAPES))
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--formats", default="k8v8,k4v4,k4v2")
    ap.add_argument("--suffix", type=int, default=64, help="prefix reuse: the new request's own tokens")
    ap.add_argument("--long", type=int, default=32768, help="long-context decode (0: skip)")
    ap.add_argument("--long-steps", type=int, default=32)
    ap.add_argument("--long-format", default="k4v4")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of decoding before measuring")
    ap.add_argument("--cudnn-sdpa", action="store_true",
                    help="let SDPA use cuDNN attention (it builds a plan for every new sequence length: "
                         "each decode step of a fresh context costs tens of ms); default: flash attention")
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()

    device = "cuda" if args.backend != "cpu" and torch.cuda.is_available() else "cpu"
    if device == "cuda" and not args.cudnn_sdpa:
        torch.backends.cuda.enable_cudnn_sdp(False)
    dtype = torch.float16 if device == "cuda" else torch.float32
    wire = "fp16" if dtype == torch.float16 else "fp32"
    results = {"prompt": args.prompt, "new": args.new, "shape": args.shape, "device": device}
    with LocalServer(args.server, args.backend, ["--host_budget_bytes", str(48 << 30)]) as srv, \
            tqkv.Client(srv.address, timeout=600, data_address=srv.data_address) as client:
        model = tqkv.hf.use_tqkv_attention(random_model.random_llama(args.shape, device=device, dtype=dtype))
        vocab = model.config.vocab_size
        prompt = random_model.random_prompt(args.prompt, vocab)

        # Warm-up at the same shapes (kernels, allocator, clocks): decode steps
        # on the H200 host take several seconds to reach their steady speed.
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.warmup:
            random_model.greedy(model, prompt, DynamicCache(), min(args.new, 32))
        ref_toks, ref_logits, ref_ttft, ref_dec = random_model.greedy(model, prompt, DynamicCache(), args.new)
        results["reference"] = dict(ttft_s=ref_ttft, tok_s=(args.new - 1) / ref_dec)
        print(f"reference (DynamicCache, SDPA): ttft {ref_ttft * 1e3:.1f} ms, "
              f"{(args.new - 1) / ref_dec:.1f} tok/s", flush=True)

        # Floor 1: another correct fp16 attention kernel over the same cache type.
        eager = random_model.random_llama(args.shape, device=device, dtype=dtype, attn="eager")
        _, eager_logits, _, _ = random_model.greedy(eager, prompt, DynamicCache(), args.new, force=ref_toks)
        del eager
        c = random_model.compare(eager_logits, ref_logits)
        results["floor_eager"] = c
        print(f"floor, eager attention vs SDPA (DynamicCache): top1 {c['top1']:.4f} (first miss "
              f"{c['first_diff']}) rel {c['rel']:.2e} (median {c['rel_median']:.2e}) KL {c['kl']:.2e}",
              flush=True)

        stores = {}
        for fmt in args.formats.split(","):
            store = stores[fmt] = tqkv.hf.TqkvStore(client, model.config, f"acc-{fmt}", cache_dtype=fmt,
                                                   dtype=wire)
            with store.new_cache(prompt) as cache:
                toks, logits, ttft, dec = random_model.greedy(model, prompt, cache, args.new, force=ref_toks)
                attend = cache.timers["attend"].seconds
                put = cache.timers["put"].seconds
            c = random_model.compare(logits, ref_logits)
            st = store.stats()
            row = dict(c, ttft_s=ttft, tok_s=(args.new - 1) / dec, attend_share=attend / dec, put_s=put,
                       compression=st.compression_ratio,
                       stored_bytes=sum(t.bytes for t in st.tiers.values()),
                       dense_bytes=sum(t.dense_equivalent_bytes for t in st.tiers.values()))
            results[fmt] = row
            # Floor 2: the codec alone (the stored blocks, dequantized, in transformers' attention).
            with store.new_cache(prompt, mode="dense", reuse_prefix=False) as cache:
                _, dense_logits, _, _ = random_model.greedy(model, prompt, cache, args.new, force=ref_toks)
            dc = random_model.compare(dense_logits, ref_logits)
            results[fmt + "_dense_mode"] = dc
            print(f"{fmt}: top1 {c['top1']:.4f} (first miss {c['first_diff']}) rel {c['rel']:.2e} "
                  f"(median {c['rel_median']:.2e}) rel_max {c['rel_max']:.2e} "
                  f"KL {c['kl']:.2e} | ttft {ttft * 1e3:.1f} ms, {row['tok_s']:.1f} tok/s, tqkv "
                  f"{row['attend_share'] * 100:.0f}% of the step, put {put:.2f} s | stored "
                  f"{row['stored_bytes'] / 2**20:.1f} MiB for {row['dense_bytes'] / 2**20:.1f} MiB fp16 "
                  f"(x{st.compression_ratio:.2f})", flush=True)
            print(f"{fmt}, dense mode (codec only): top1 {dc['top1']:.4f} (first miss {dc['first_diff']}) "
                  f"rel {dc['rel']:.2e} (median {dc['rel_median']:.2e}) KL {dc['kl']:.2e}", flush=True)

        # Prefix reuse: the prompt is stored under the first format; a new
        # request = prompt + its own suffix.
        fmt = args.formats.split(",")[0]
        other = torch.cat([prompt, random_model.random_prompt(args.suffix, vocab, seed=11)], 1)
        seen, hook = forward_tokens(model)
        try:
            cold_store = tqkv.hf.TqkvStore(client, model.config, f"acc-cold-{fmt}", cache_dtype=fmt, dtype=wire)
            t0 = time.perf_counter()
            with cold_store.new_cache(other) as cold:  # its Lookup finds nothing
                cold_setup = time.perf_counter() - t0
                cold_toks, _, cold_ttft, _ = random_model.greedy(model, other, cold, 8)
            cold_fwd = seen[0]
            seen.clear()
            hits0 = srv.counter("tqkv_lookup_hit_blocks_total")
            t0 = time.perf_counter()
            with stores[fmt].new_cache(other) as warm:  # Lookup + CreateSequence over the hits
                warm_setup = time.perf_counter() - t0
                warm_toks, _, warm_ttft, _ = random_model.greedy(model, other, warm, 8)
                cached = warm.cached_tokens
            hit_blocks = srv.counter("tqkv_lookup_hit_blocks_total") - hits0
            warm_fwd = seen[0]
        finally:
            hook.remove()
        cold_ttft += cold_setup
        warm_ttft += warm_setup
        results["prefix"] = dict(cached_tokens=cached, cold_forward_tokens=cold_fwd,
                                 warm_forward_tokens=warm_fwd, lookup_hit_blocks=hit_blocks,
                                 cold_ttft_s=cold_ttft, warm_ttft_s=warm_ttft,
                                 same_tokens=cold_toks == warm_toks)
        print(f"prefix reuse ({fmt}): {cached} of {other.shape[1]} tokens cached, the model computed "
              f"{warm_fwd} (cold: {cold_fwd}); Lookup hit blocks +{hit_blocks:.0f}; ttft warm "
              f"{warm_ttft * 1e3:.1f} ms vs cold {cold_ttft * 1e3:.1f} ms; same 8 tokens: "
              f"{cold_toks == warm_toks}", flush=True)

        if args.long:
            long_prompt = random_model.random_prompt(args.long, vocab, seed=5)
            _, _, _, sdpa_dec = random_model.greedy(model, long_prompt, DynamicCache(), args.long_steps)
            store = tqkv.hf.TqkvStore(client, model.config, f"acc-long-{args.long_format}",
                                      cache_dtype=args.long_format, dtype=wire)
            with store.new_cache(long_prompt) as cache:
                _, _, _, dec = random_model.greedy(model, long_prompt, cache, args.long_steps)
                attend = cache.timers["attend"]
                put = cache.timers["put"].seconds
            n = args.long_steps - 1
            results["long"] = dict(context=args.long, format=args.long_format, sdpa_tok_s=n / sdpa_dec,
                                   tqkv_tok_s=n / dec, attend_share=attend.seconds / dec,
                                   attend_ms_per_call=attend.seconds / attend.calls * 1e3, put_s=put)
            print(f"decode at {args.long} tokens: tqkv {args.long_format} {n / dec:.1f} tok/s "
                  f"(Attend {attend.seconds / attend.calls * 1e3:.2f} ms a layer, "
                  f"{attend.seconds / dec * 100:.0f}% of the step; prompt put {put:.1f} s) vs SDPA fp16 "
                  f"{n / sdpa_dec:.1f} tok/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
