"""Seeded random-weight transformers models and a greedy decode loop, for
tqkv.hf's tests, examples and measurements (no weights to download: the
architecture's attention, RoPE and cache calls are the real ones).
"""
import time

import torch

# Llama shapes with GQA 32/8 and head_dim 128: `small` fits the CPU backend
# in CI, `gqa8` scales the layer count and widths down, `llama8b` does not.
SHAPES = {
    "small": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=128, num_hidden_layers=2, vocab_size=512),
    "gqa8": dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, num_hidden_layers=8, vocab_size=8192),
    # Llama 3 8B's shapes (16 GB of fp16 weights).
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, num_hidden_layers=32, vocab_size=128256),
}


def random_llama(shape="small", *, seed=0, device="cpu", dtype=torch.float32, logit_scale=8.0,
                 max_position_embeddings=65536, attn="sdpa"):
    """A LlamaForCausalLM of SHAPES[shape] with weights drawn from `seed`
    (the same on every call with the same seed, device and dtype).

    logit_scale multiplies the output head: a trained model's next-token
    distribution is peaked, an untrained one's nearly flat, where greedy
    decoding would flip on ties at the noise level of any kernel change.
    """
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=max_position_embeddings,
                      tie_word_embeddings=False, attn_implementation=attn)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.to(dtype).eval()


def random_prompt(n, vocab_size, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, n), generator=g)


@torch.no_grad()
def greedy(model, input_ids, cache, steps, *, first_token=None, force=None):
    """Greedy decoding with an explicit cache: the prompt tokens the cache
    does not hold yet in one forward, then one token a step. Returns (tokens
    [steps], logits [steps, vocab] fp32 on the CPU (row i produced token i),
    seconds to the first token, seconds of the decode steps).

    first_token: a cache that already holds the prompt (TqkvStore.resume)
    starts by feeding this token, which another process produced; the
    logits then have steps - 1 rows, for tokens 1..steps-1. A TqkvCache is
    committed (its prompt put) between the two timed parts.
    force: feed these tokens instead of the argmax (teacher forcing, so two
    caches' distributions are compared on the same inputs); `tokens` are
    still the argmaxes."""
    device = model.device
    tokens, logits = [], []

    def step(ids):
        out = model(input_ids=ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1)
        last = out.logits[0, -1].float()
        logits.append(last.cpu())
        tokens.append(int(last.argmax()))

    t0 = time.perf_counter()
    if first_token is None:
        step(input_ids[:, cache.get_seq_length():])
    else:
        tokens.append(int(first_token))
    if device.type == "cuda":
        torch.cuda.synchronize()
    ttft = time.perf_counter() - t0
    commit = getattr(cache, "commit", None)
    if commit is not None and len(tokens) < steps:  # TqkvCache: its puts, outside the decode time
        commit()
    t1 = time.perf_counter()
    while len(tokens) < steps:
        fed = tokens[-1] if force is None else int(force[len(tokens) - 1])
        step(torch.tensor([[fed]]))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return tokens, torch.stack(logits) if logits else None, ttft, time.perf_counter() - t1


def compare(logits, ref):
    """Per-step comparison of next-token distributions, as a dict:
    rel: the largest per-step relative difference ||a-b||2 / ||b||2;
    rel_median: its median over the steps;
    rel_max: the largest per-step max|a-b| / max|b|; kl: the mean KL(ref || a)
    in nats; top1: the fraction of steps whose argmaxes agree; first_diff:
    the first step whose argmaxes differ (-1: none)."""
    steps = min(len(logits), len(ref))
    a, b = logits[:steps].double(), ref[:steps].double()
    per_step = (a - b).norm(dim=-1) / b.norm(dim=-1)
    rel, rel_median = per_step.max().item(), per_step.median().item()
    rel_max = ((a - b).abs().amax(-1) / b.abs().amax(-1)).max().item()
    pa, pb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    kl = (pb.exp() * (pb - pa)).sum(-1).mean().item()
    agree = a.argmax(-1) == b.argmax(-1)
    first_diff = int((~agree).nonzero()[0, 0]) if not bool(agree.all()) else -1
    return dict(rel=rel, rel_median=rel_median, rel_max=rel_max, kl=kl, top1=agree.double().mean().item(), first_diff=first_diff)
