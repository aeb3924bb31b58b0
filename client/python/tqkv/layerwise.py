"""Layer-wise transfers: the shape of an inference engine's KV connector.

An inference worker computes layer N while layer N+1's KV is on its way:

    loader = LayerwiseLoader(client, model, hashes)      # starts prefetching
    for layer in range(model.num_layers):
        k, v = loader.wait_for_layer(layer)  # [tokens, kv_heads, d]; N+1 already in flight
        ...compute layer...
    loader.close()

and saves KV layer by layer as it is produced; each layer is a layer-range
put, staged by the server until the block's last layer arrives:

    saver = LayerwiseSaver(client, model, hashes)
    for layer in ...:
        saver.save_layer(layer, k, v)        # [tokens, kv_heads, d] or [blocks, block_size, kv_heads, d]
    saver.wait_for_save()                    # raises the first failure

A prompt whose length is not a multiple of block_size ends in a partial
block: the saver puts its tokens as they are, the loader trims the padding
rows when given `num_tokens`. The hashes are the caller's (tqkv.hf.hashing
chains them over token ids). Both use one background thread; numpy (or
torch) in, numpy (or torch) out.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .types import Block


class LayerwiseLoader:
    """Fetches layers [0, num_layers) of `hashes` one layer per GetBlocks call,
    keeping `depth` layers in flight ahead of the one the caller waits for.

    dense=True (default) returns (k, v) arrays [num_blocks * block_size,
    kv_heads, d] in `dtype` (the first `num_tokens` rows when given: a
    partial last block's padding cut off); dense=False returns the list of
    packed payloads of that layer (one per block; split with
    model.format.pages).
    """

    def __init__(self, client, model, hashes, *, dense=True, dtype="fp16", depth=1,
                 as_torch=False, num_tokens=None):
        self._client = client
        self._model = model
        self._hashes = list(hashes)
        self._dense = dense
        self._dtype = dtype
        self._depth = max(1, depth)
        self._as_torch = as_torch
        self._num_tokens = num_tokens
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tqkv-load")
        self._futures = {}
        self._num_layers = model.num_layers
        self._prefetch(0)

    def _fetch(self, layer):
        blocks = self._client.get_blocks(self._model, self._hashes, first_layer=layer,
                                         last_layer=layer + 1, dense=self._dense,
                                         dtype=self._dtype, as_torch=self._as_torch)
        if not self._dense:
            return [b.payload for b in blocks]
        n = self._num_tokens
        if self._as_torch:
            import torch
            return (torch.cat([b.k[0] for b in blocks])[:n], torch.cat([b.v[0] for b in blocks])[:n])
        return (np.concatenate([b.k[0] for b in blocks])[:n], np.concatenate([b.v[0] for b in blocks])[:n])

    def _prefetch(self, layer):
        for l in range(layer, min(layer + self._depth + 1, self._num_layers)):
            if l not in self._futures:
                self._futures[l] = self._pool.submit(self._fetch, l)

    def wait_for_layer(self, layer):
        """Blocks until `layer` is here and returns it; schedules the next
        `depth` layers. Raises the fetch's TqkvError."""
        self._prefetch(layer)
        return self._futures.pop(layer).result()

    def __iter__(self):
        for layer in range(self._num_layers):
            yield layer, self.wait_for_layer(layer)

    def close(self):
        for f in self._futures.values():
            f.cancel()
        self._pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LayerwiseSaver:
    """Puts one layer of every block at a time, in the background. A block
    becomes visible once all its layers are put (before the server's staging
    TTL). `parents` optionally chains the blocks."""

    def __init__(self, client, model, hashes, parents=None, *, durable=False):
        self._client = client
        self._model = model
        self._hashes = list(hashes)
        self._parents = list(parents) if parents else [b""] * len(self._hashes)
        self._durable = durable
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tqkv-save")
        self._futures = []

    def save_layer(self, layer, k, v):
        """Queues layer `layer`: k, v [num_blocks, block_size, kv_heads, d], or
        the layer's tokens [tokens, kv_heads, d] (cut into blocks of the
        model's block_size, the last one partial when tokens is not a
        multiple of it). Raises ValueError when the blocks and the hashes
        differ in number."""
        if len(k.shape) == 3:
            bs = self._model.block_size
            k = [k[a:a + bs] for a in range(0, k.shape[0], bs)]
            v = [v[a:a + bs] for a in range(0, v.shape[0], bs)]
        if len(k) != len(self._hashes) or len(v) != len(self._hashes):
            raise ValueError(f"{len(k)} blocks of K, {len(v)} of V for {len(self._hashes)} hashes")
        blocks = [Block(h, k=k[i][None], v=v[i][None], parent=p)
                  for i, (h, p) in enumerate(zip(self._hashes, self._parents))]
        self._futures.append(self._pool.submit(
            self._client.put_blocks, self._model, blocks, first_layer=layer,
            last_layer=layer + 1, durable=self._durable))

    def wait_for_save(self):
        """Waits for every queued layer; returns their PutResults. Raises the
        first failure (the other layers still finish)."""
        results, first_error = [], None
        for f in self._futures:
            try:
                results.append(f.result())
            except Exception as e:  # keep waiting for the rest
                first_error = first_error or e
        self._futures = []
        if first_error:
            raise first_error
        return results

    def close(self):
        self._pool.shutdown(wait=True)
