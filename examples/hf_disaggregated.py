"""Disaggregated prefill and decode with transformers and tqkv: a prefill
process computes a prompt and stores its K/V in tqkv (every block, the
partial last one too) and hands over only the first token; a decode process
(another OS process, which never saw the prompt's activations) resumes from
the stored blocks and decodes. The driver then runs the same request in one
process and checks that the continuation is the same token for token.

    python3 examples/hf_disaggregated.py --server bazel-bin/service/tqkv-server --backend cuda

Both workers build the same seeded random-weight Llama (tqkv.hf.random_model)
and the same prompt from --seed. --address/--data-address use a running
server instead of starting one.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def worker(args):
    import torch

    import tqkv
    import tqkv.hf
    from tqkv.hf import random_model
    device = "cuda" if args.backend != "cpu" and torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = tqkv.hf.use_tqkv_attention(random_model.random_llama(args.shape, device=device, dtype=dtype))
    prompt = random_model.random_prompt(args.prompt, model.config.vocab_size, seed=args.seed)
    with tqkv.Client(args.address, timeout=600, data_address=args.data_address) as client:
        store = tqkv.hf.TqkvStore(client, model.config, args.name, cache_dtype=args.cache_dtype,
                                  dtype="fp16" if dtype == torch.float16 else "fp32")
        out = {"role": args.role}
        if args.role == "prefill":
            with store.new_cache(prompt) as cache:
                toks, _, ttft, _ = random_model.greedy(model, prompt, cache, 1)
                t0 = time.perf_counter()
                cache.commit(decode=False)
                out.update(first_token=toks[0], ttft_s=ttft, put_s=time.perf_counter() - t0,
                           cached_tokens=cache.cached_tokens)
        elif args.role == "decode":
            t0 = time.perf_counter()
            with store.resume(prompt) as cache:
                resume_s = time.perf_counter() - t0
                toks, _, _, dec = random_model.greedy(model, prompt, cache, args.new,
                                                      first_token=args.first_token)
                out.update(tokens=toks, resume_s=resume_s, tok_s=(args.new - 1) / dec,
                           attend_share=cache.timers["attend"].seconds / dec)
        else:  # single: the same request in one process
            with store.new_cache(prompt, reuse_prefix=False) as cache:
                toks, _, ttft, dec = random_model.greedy(model, prompt, cache, args.new)
                out.update(tokens=toks, ttft_s=ttft, tok_s=(args.new - 1) / dec)
        st = store.stats()
        out["stored_bytes"] = sum(t.bytes for t in st.tiers.values())
        out["dense_bytes"] = sum(t.dense_equivalent_bytes for t in st.tiers.values())
    print("RESULT " + json.dumps(out), flush=True)


def run_role(args, role, name, **extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--address", args.address,
           "--data-address", args.data_address, "--name", name, "--backend", args.backend,
           "--shape", args.shape, "--prompt", str(args.prompt), "--new", str(args.new),
           "--seed", str(args.seed), "--cache-dtype", args.cache_dtype]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{role} process failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    out["process_s"] = time.perf_counter() - t0
    return out


def drive(args):
    server = None
    if not args.address:
        from local_server import LocalServer
        server = LocalServer(args.server, args.backend, ["--host_budget_bytes", str(16 << 30)])
        args.address, args.data_address = server.address, server.data_address
    try:
        name = f"disagg-{os.getpid()}"
        pre = run_role(args, "prefill", name)
        print(f"prefill process: {args.prompt} prompt tokens stored, first token {pre['first_token']}, "
              f"ttft {pre['ttft_s'] * 1e3:.1f} ms, put {pre['put_s'] * 1e3:.1f} ms; tqkv holds "
              f"{pre['stored_bytes'] / 2**20:.1f} MiB for {pre['dense_bytes'] / 2**20:.1f} MiB of fp16 K/V",
              flush=True)
        dec = run_role(args, "decode", name, first_token=pre["first_token"])
        print(f"decode process: resumed in {dec['resume_s'] * 1e3:.1f} ms, {args.new} tokens "
              f"{dec['tokens']}, {dec['tok_s']:.1f} tok/s (tqkv Attend {dec['attend_share'] * 100:.0f}% "
              f"of the step)", flush=True)
        one = run_role(args, "single", name + "-single")
        same = one["tokens"] == dec["tokens"]
        print(f"single process: {one['tokens']}, ttft {one['ttft_s'] * 1e3:.1f} ms, {one['tok_s']:.1f} tok/s",
              flush=True)
        print(f"disaggregated continuation equals the single-process run: {same}", flush=True)
        return 0 if same else 1
    finally:
        if server is not None:
            server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=None, help="tqkv-server binary (default $TQKV_SERVER)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--address", default=None)
    ap.add_argument("--data-address", default="auto", help="the server's data plane (auto: ask it)")
    ap.add_argument("--shape", default="gqa8")
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--cache-dtype", default="k8v8")
    ap.add_argument("--role", default=None, choices=["prefill", "decode", "single"])
    ap.add_argument("--name", default=None)
    ap.add_argument("--first-token", type=int, default=None)
    args = ap.parse_args()
    if args.role:
        worker(args)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
