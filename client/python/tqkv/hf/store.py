"""TqkvStore: a transformers model's registration on a tqkv server, its
block hashes, prefix lookups and block puts."""
import time

from ..types import Block
from . import hashing


def _layout(config):
    """(num_layers, num_q_heads, num_kv_heads, head_dim) of a transformers
    decoder config (Llama, Qwen2, Mistral, ... field names)."""
    layers = config.num_hidden_layers
    q_heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or q_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // q_heads
    return layers, q_heads, kv_heads, head_dim


class TqkvStore:
    """Registers a model with a tqkv server and moves its prompts' K/V.

    client: a tqkv.Client (give it data_address="auto" or the server's
    data-plane address: Attend, puts and dense reads then go over the data
    plane, one call per layer and step). config: the model's transformers
    config. name: the registration name; it must identify the weights
    (blocks of two models under one name would mix). cache_dtype, block_size,
    dtype and `codec` (register_model's codec keywords, e.g. rotation) decide
    the stored format. Raises what Client.register_model raises.

    Thread safety: as the Client's (one TqkvCache per request and thread).
    """

    def __init__(self, client, config, name, *, cache_dtype="k4v4", block_size=16, dtype="fp16",
                 **codec):
        self.client = client
        self.config = config
        layers, q_heads, kv_heads, head_dim = _layout(config)
        self.model = client.register_model(
            name, num_layers=layers, num_kv_heads=kv_heads, num_q_heads=q_heads, head_dim=head_dim,
            block_size=block_size, dtype=dtype, cache_dtype=cache_dtype,
            block_hash_scheme=hashing.SCHEME, **codec)
        self.block_size = block_size
        self.num_layers = layers
        self.cache_dtype = cache_dtype

    def block_hashes(self, token_ids, *, partial=True):
        """The prompt's block hashes (tqkv.hf.hashing's scheme)."""
        return hashing.block_hashes(token_ids, self.block_size, partial=partial)

    def cached_prefix_blocks(self, token_ids, *, partial=False):
        """How many leading blocks of `token_ids` the server holds (one Lookup;
        by default full blocks only)."""
        hs = self.block_hashes(token_ids, partial=partial)
        return self.client.lookup(self.model, hs).hits if hs else 0

    def put_prompt(self, hashes, k, v, *, first_block=0):
        """Puts blocks `first_block..` of a prompt. k, v: [layers, tokens,
        kv_heads, d] (torch or numpy) covering those blocks from their first
        token; the last block may be partial. Returns the PutResult."""
        bs = self.block_size
        blocks = []
        for j in range(first_block, len(hashes)):
            a = (j - first_block) * bs
            blocks.append(Block(hashes[j], k=k[:, a:a + bs], v=v[:, a:a + bs],
                                parent=hashes[j - 1] if j else b""))
        return self.client.put_blocks(self.model, blocks)

    def new_cache(self, input_ids, *, mode="attend", reuse_prefix=True):
        """A TqkvCache for one request whose prompt is `input_ids` (see TqkvCache)."""
        from .cache import TqkvCache
        return TqkvCache(self, input_ids, mode=mode, reuse_prefix=reuse_prefix)

    def resume(self, input_ids):
        """A TqkvCache that continues a prompt another process stored (every
        block of it, the partial last one included): decoding starts right
        after the prompt. Raises NotFound when a block is missing."""
        from .cache import TqkvCache
        return TqkvCache(self, input_ids, resume=True)

    def stats(self):
        """The server's byte accounting of this model (tqkv.ModelStats)."""
        return self.client.stats(self.model).model(self.model.model_id)


class Timer:
    """Accumulates wall seconds and calls of one kind of client call."""

    def __init__(self):
        self.calls = 0
        self.seconds = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1

    def __repr__(self):
        return f"{self.calls} calls, {self.seconds * 1e3:.1f} ms"
