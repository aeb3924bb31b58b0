"""tqkv from Hugging Face transformers (5.x): a Cache whose prompt K/V live in
tqkv, and an attention function that runs decode attention on the server.

    import tqkv, tqkv.hf
    client = tqkv.Client("127.0.0.1:7070", data_address="auto")
    store = tqkv.hf.TqkvStore(client, model.config, "llama-3-8b", cache_dtype="k8v8")
    tqkv.hf.use_tqkv_attention(model)          # attn_implementation "tqkv"
    with store.new_cache(input_ids) as cache:  # Lookup: a stored prefix is not recomputed
        out = model.generate(input_ids, past_key_values=cache, max_new_tokens=32, do_sample=False)

The prompt is computed locally (or only its suffix, over a stored prefix,
on the server), its blocks are put under chained token hashes
(tqkv.hf.hashing), and each decode step's layer is one data-plane Attend
that appends the token's K/V and attends. mode="dense" hands the
dequantized K/V back to transformers' own attention instead. See cache.py.
Needs torch and transformers; tqkv.hf.hashing alone needs neither.
"""
from .attention import NAME, register, tqkv_attention, use_tqkv_attention
from .hashing import SCHEME, block_hashes
from .store import TqkvStore

__all__ = ["NAME", "SCHEME", "TqkvCache", "TqkvLayer", "TqkvStore", "block_hashes", "register",
           "tqkv_attention", "use_tqkv_attention"]


def __getattr__(name):  # the cache needs torch and transformers: imported on first use
    if name in ("TqkvCache", "TqkvLayer"):
        from . import cache
        return getattr(cache, name)
    raise AttributeError(name)
