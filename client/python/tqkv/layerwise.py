"""Layer-wise transfer adapters (a sketch of a vLLM-style KV connector).

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
        saver.save_layer(layer, k, v)        # [num_blocks, block_size, kv_heads, d]
    saver.wait_for_save()                    # raises the first failure

Both use one background thread; numpy (or torch) in, numpy (or torch) out.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .types import Block


class LayerwiseLoader:
    """Fetches layers [0, num_layers) of `hashes` one layer per GetBlocks call,
    keeping `depth` layers in flight ahead of the one the caller waits for.

    dense=True (default) returns (k, v) arrays [num_blocks * block_size,
    kv_heads, d] in `dtype`; dense=False returns the list of packed payloads
    of that layer (one per block; split with model.format.pages).
    """

    def __init__(self, client, model, hashes, *, dense=True, dtype="fp16", depth=1,
                 as_torch=False):
        self._client = client
        self._model = model
        self._hashes = list(hashes)
        self._dense = dense
        self._dtype = dtype
        self._depth = max(1, depth)
        self._as_torch = as_torch
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
        if self._as_torch:
            import torch
            return (torch.cat([b.k[0] for b in blocks]), torch.cat([b.v[0] for b in blocks]))
        return (np.concatenate([b.k[0] for b in blocks]), np.concatenate([b.v[0] for b in blocks]))

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
        """Queues layer `layer`: k, v [num_blocks, tokens, kv_heads, d]."""
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
