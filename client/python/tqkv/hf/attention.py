"""The "tqkv" attention function of transformers' attention registry.

A model whose attention implementation is "tqkv" (use_tqkv_attention)
computes each layer's attention as follows: when the layer's cache is a
TqkvCache holding its sequence on the server, the layer's new tokens' K/V
(what TqkvCache.update was just given, post-RoPE) and the queries
(post-RoPE) go to the server in one Attend call that appends and attends
(queries at their causal positions); otherwise (a prompt computed locally,
the dense mode, or any other cache, e.g. transformers' DynamicCache) it is
transformers' own SDPA attention over what the cache returned. Masks for the
local paths are SDPA's (the "tqkv" mask function is sdpa_mask).
"""
import threading

NAME = "tqkv"

# TqkvCache.update -> tqkv_attention of the same layer, on the same thread:
# the cache whose layer just took its new tokens and attends remotely.
_handoff = threading.local()


def hand_off(cache, layer_idx):
    """Called by TqkvCache.update: `cache` attends layer `layer_idx` on the
    server (None: locally)."""
    _handoff.step = None if cache is None else (cache, layer_idx)


def tqkv_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: query [b, q_heads, n, d],
    key/value [b, kv_heads, t, d]; returns ([b, n, q_heads, d], None)."""
    step = getattr(_handoff, "step", None)
    _handoff.step = None
    if step is not None and step[1] == getattr(module, "layer_idx", None):
        cache, layer_idx = step
        return cache.attend(layer_idx, query, key, value, scaling), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                  dropout=dropout, **kwargs)


def register(name=NAME):
    """Registers tqkv_attention (and SDPA's mask function) under `name`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, tqkv_attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def use_tqkv_attention(model, name=NAME):
    """Registers the function and switches `model` (a transformers
    PreTrainedModel) to it. Returns the model."""
    register(name)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    return model
