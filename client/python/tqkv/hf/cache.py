"""TqkvCache: a transformers (5.x) Cache whose prompt K/V live in tqkv.

One request (batch 1), one prompt, in phases:

1. Prefix reuse (reuse_prefix): one Lookup of the prompt's full-block
   hashes. The leading blocks found are not recomputed: get_seq_length()
   starts at their token count P, so generate() (or a caller passing
   input_ids[:, P:]) runs the model over the suffix only. mode="attend"
   creates the server sequence over those blocks at once and the suffix
   attends over them on the server, at causal positions; mode="dense" reads
   them back dequantized.
2. The prompt (or its suffix) is computed: without a sequence, locally with
   transformers' SDPA over full-precision K/V, as DynamicCache would.
3. Commit, at the first forward after the whole prompt was seen (or
   commit()): the prompt's blocks that the server lacks are put (K post-RoPE,
   as the model's own cache holds it; the partial last block too, under its
   own hash), and a sequence is created over all of them
   (last_block_tokens = the partial block's count). The local K/V are freed.
4. Decode: every layer of every step is one data-plane Attend that appends
   the new token's K/V and attends its query (tqkv_attention); nothing of
   the context stays in the model process.

mode="dense" (diagnostic) goes through the same puts and then hands the
dequantized prompt K/V back to transformers' own attention, so a quality
difference can be split between the codec and the server's kernels.

Generated tokens are appended to the sequence, not stored as blocks.
Not thread-safe; one cache per request.
"""
import torch
from transformers.cache_utils import Cache, DynamicLayer

from .. import errors
from . import attention, hashing
from .store import Timer

# Prompt queries sent in one Attend call at most (bounds the message size).
_ATTEND_CHUNK = 1024

_WIRE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


class TqkvLayer(DynamicLayer):
    """One layer: transformers' DynamicLayer while the prompt is computed
    locally (keys/values [1, kv_heads, t, d]); once the sequence lives on the
    server only its token count and, until the commit, the prompt tokens it
    still has to put."""

    def __init__(self):
        super().__init__()
        self.remote = False
        self.num_tokens = 0   # tokens of the server's sequence (remote)
        self.pending = []     # (k, v) [1, kv_heads, n, d] of prompt tokens not yet put

    def go_remote(self, num_tokens, like=None):
        self.remote = True
        self.num_tokens = num_tokens
        if like is not None:
            self.dtype, self.device = like.dtype, like.device
        else:
            self.dtype = self.device = None
        self.keys = self.values = None
        self.is_initialized = True

    def get_seq_length(self, *args):
        if self.remote:
            return self.num_tokens
        if not self.is_initialized or self.keys is None or self.keys.numel() == 0:
            return 0
        return self.keys.shape[-2]

    def crop(self, max_length):
        raise NotImplementedError("a TqkvCache cannot be cropped")

    def batch_repeat_interleave(self, repeats):
        raise NotImplementedError("a TqkvCache holds one sequence")

    def batch_select_indices(self, indices):
        raise NotImplementedError("a TqkvCache holds one sequence")

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("a TqkvCache holds one sequence (no beam search)")


class TqkvCache(Cache):
    """A request's cache (see the module doc). Build it with
    TqkvStore.new_cache / resume. `cached_tokens`: prompt tokens found on the
    server and not recomputed; `timers`: the client calls' counts and wall
    seconds ("attend", "put", "lookup", "read", "create"). Close it (or use
    `with`) to drop the server sequence.

    Raises NotImplementedError for batch > 1, crop or beam search; errors of
    the client calls (tqkv.TqkvError) propagate out of the model's forward.
    """

    def __init__(self, store, input_ids, *, mode="attend", reuse_prefix=True, resume=False):
        if mode not in ("attend", "dense"):
            raise ValueError(f"mode must be 'attend' or 'dense', got {mode!r}")
        super().__init__(layers=[TqkvLayer() for _ in range(store.num_layers)])
        self.store = store
        self.mode = mode
        self.prompt = hashing.token_list(input_ids)
        if not self.prompt:
            raise ValueError("the prompt is empty")
        self.hashes = store.block_hashes(self.prompt)
        self.sequence = None
        self.cached_tokens = 0
        self.committed = False
        self.timers = {k: Timer() for k in ("attend", "put", "lookup", "read", "create")}
        self._hit_blocks = 0
        self._stored_only = False
        bs = store.block_size
        if resume:
            if mode != "attend":
                raise ValueError("resume needs mode='attend'")
            self._create_sequence(self.hashes, len(self.prompt))
            self.cached_tokens = len(self.prompt)
            self.committed = True
        elif reuse_prefix:
            usable = (len(self.prompt) - 1) // bs  # one prompt token is always computed
            with self.timers["lookup"]:
                hits = min(self.store.cached_prefix_blocks(self.prompt), usable)
            if hits:
                self._hit_blocks = hits
                self.cached_tokens = hits * bs
                if mode == "attend":
                    self._create_sequence(self.hashes[:hits], hits * bs)
                else:
                    self._load_dense(0, hits, hits * bs, None)

    # ---- transformers' Cache API --------------------------------------------
    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        if key_states.shape[0] != 1:
            raise NotImplementedError("a TqkvCache holds one sequence (batch size 1)")
        if self._stored_only:
            raise errors.FailedPrecondition("this cache only stored its prompt (commit(decode=False))")
        if layer_idx == 0 and not self.committed and self.get_seq_length() >= len(self.prompt):
            self.commit(like=key_states)
        layer = self.layers[layer_idx]
        if layer.remote:
            if getattr(layer, "dtype", None) is None:
                layer.dtype, layer.device = key_states.dtype, key_states.device
            if not self.committed:
                layer.pending.append((key_states, value_states))
            layer.num_tokens += key_states.shape[-2]
            attention.hand_off(self, layer_idx)
            return key_states, value_states
        attention.hand_off(None, layer_idx)
        if layer.is_initialized and layer.keys is not None and (
                layer.keys.device != key_states.device or layer.keys.dtype != key_states.dtype):
            layer.keys = layer.keys.to(key_states.device, key_states.dtype)
            layer.values = layer.values.to(key_states.device, key_states.dtype)
        return DynamicLayer.update(layer, key_states, value_states, cache_kwargs)

    def get_seq_length(self, layer_idx=0):
        return self.layers[layer_idx].get_seq_length()

    # ---- remote attention (tqkv_attention calls it) ---------------------------
    def attend(self, layer_idx, query, key, value, scaling):
        """Appends key/value ([1, kv_heads, n, d]) to the layer's sequence and
        attends query ([1, q_heads, n, d]) at positions end-n .. end-1, in
        Attend calls of at most _ATTEND_CHUNK queries. Returns [1, n, q_heads, d]
        on the query's device."""
        n = query.shape[2]
        end = self.layers[layer_idx].num_tokens
        q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
        outs = []
        for a in range(0, n, _ATTEND_CHUNK):
            b = min(n, a + _ATTEND_CHUNK)
            positions = None if n == 1 else range(end - n + a, end - n + b)
            with self.timers["attend"]:
                out = self.store.client.attend(
                    layer_idx, [(self.sequence, q[a:b], positions, k[a:b], v[a:b])],
                    scale=float(scaling or 0.0))[0]
            outs.append(out)
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.to(query.device, non_blocking=True).unsqueeze(0)

    # ---- commit -------------------------------------------------------------
    def commit(self, like=None, *, decode=True):
        """Puts the prompt's blocks the server lacks and, in attend mode,
        moves the request onto a server sequence (see the module doc). Called
        by the first update after the prompt; idempotent. decode=False (a
        prefill worker whose prompt another process decodes): only puts, and
        frees the local K/V; the cache cannot run the model afterwards.
        REQUIRES: the whole prompt went through the model."""
        if self.committed:
            return
        t = len(self.prompt)
        layer0 = self.layers[0]
        if layer0.remote:  # a prefix hit: the suffix went through Attend
            bs = self.store.block_size
            first = self._hit_blocks
            # The server may hold more of the prompt than the hits it was
            # created over (the same prompt again: its last block's tokens
            # are always computed). Those blocks stay as stored: the
            # recomputed ones attended over the stored prefix, so their
            # bytes differ, and a block's hash names one set of bytes. Only
            # the blocks past the hits are looked up (the hits are not
            # counted twice).
            start = first
            if first < len(self.hashes):
                with self.timers["lookup"]:
                    start += self.store.client.lookup(self.store.model, self.hashes[first:]).hits
            if start < len(self.hashes):
                k, v = self._stack(
                    [torch.cat([p[0] for p in l.pending], dim=-2) for l in self.layers],
                    [torch.cat([p[1] for p in l.pending], dim=-2) for l in self.layers],
                    t - first * bs)
                skip = (start - first) * bs
                self._put(start, k[:, skip:], v[:, skip:])
            for l in self.layers:
                l.pending = []
            self.committed = True
            if not decode:
                self.close()
                self._stored_only = True
            return
        have = layer0.get_seq_length()
        if have < t:
            raise errors.FailedPrecondition(f"commit after {have} of the prompt's {t} tokens")
        with self.timers["lookup"]:
            first = self.store.client.lookup(self.store.model, self.hashes).hits
        bs = self.store.block_size
        if first < len(self.hashes):
            k, v = self._stack([l.keys[..., first * bs:t, :] for l in self.layers],
                               [l.values[..., first * bs:t, :] for l in self.layers], t - first * bs)
            self._put(first, k, v)
        like = like if like is not None else layer0.keys
        if not decode:
            for l in self.layers:
                l.keys = l.values = None
                l.is_initialized = False
            self.committed = True
            self._stored_only = True
            return
        if self.mode == "attend":
            self._create_sequence(self.hashes, t, like=like)
        else:
            self._load_dense(self._hit_blocks, len(self.hashes), t, like)
        self.committed = True

    # ---- helpers --------------------------------------------------------------
    @staticmethod
    def _stack(keys, values, tokens):
        """[layers, tokens, kv_heads, d] on the CPU from per-layer [1, kv_heads, t, d]."""
        k = torch.stack([x[0, :, :tokens] for x in keys]).transpose(1, 2)
        v = torch.stack([x[0, :, :tokens] for x in values]).transpose(1, 2)
        return k.to("cpu").contiguous(), v.to("cpu").contiguous()

    def _put(self, first_block, k, v):
        with self.timers["put"]:
            self.store.put_prompt(self.hashes, k, v, first_block=first_block)

    def _create_sequence(self, hashes, tokens, like=None):
        partial = tokens % self.store.block_size
        with self.timers["create"]:
            self.sequence = self.store.client.create_sequence(
                self.store.model, hashes, last_block_tokens=partial)
        if self.sequence.num_tokens != tokens:
            raise errors.FailedPrecondition(
                f"sequence holds {self.sequence.num_tokens} tokens, expected {tokens}")
        for l in self.layers:
            l.go_remote(tokens, like)

    def _load_dense(self, first_block, last_block, tokens, like):
        """Replaces tokens [first_block * bs, tokens) of every layer's K/V by
        the server's dequantized copy of those blocks."""
        bs = self.store.block_size
        dtype = like.dtype if like is not None else torch.float32
        device = like.device if like is not None else "cpu"
        with self.timers["read"]:
            blocks = self.store.client.get_blocks(
                self.store.model, self.hashes[first_block:last_block], dense=True,
                dtype=_WIRE[dtype], as_torch=True)
        a = first_block * bs
        k = torch.cat([b.k for b in blocks], dim=1)[:, :tokens - a]  # [layers, t, kv_heads, d]
        v = torch.cat([b.v for b in blocks], dim=1)[:, :tokens - a]
        for i, l in enumerate(self.layers):
            ki = k[i].transpose(0, 1).unsqueeze(0).to(device, dtype)
            vi = v[i].transpose(0, 1).unsqueeze(0).to(device, dtype)
            if l.is_initialized and l.keys is not None and l.keys.numel():
                l.keys = torch.cat([l.keys[..., :a, :], ki, l.keys[..., tokens:, :]], dim=-2)
                l.values = torch.cat([l.values[..., :a, :], vi, l.values[..., tokens:, :]], dim=-2)
            else:
                l.keys, l.values = ki, vi
                l.dtype, l.device = dtype, torch.device(device)
                l.is_initialized = True

    def close(self):
        """Drops the server sequence (the stored blocks stay)."""
        if self.sequence is not None:
            try:
                self.sequence.drop()
            except errors.NotFound:
                pass
            self.sequence = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
