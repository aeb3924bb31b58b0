"""tqkv.hf.TqkvStore against the real server, without torch: a prompt's K/V
put as chained blocks (the partial last one too), prefix lookups and a
sequence over them."""
from types import SimpleNamespace

import numpy as np
import pytest

import tqkv
from tqkv.hf import TqkvStore, hashing
from helpers import unique

CFG = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                      hidden_size=256)


@pytest.fixture(params=["grpc", "data_plane"])
def any_client(request, client, server):
    if request.param == "grpc":
        yield client
        return
    with tqkv.Client(server.address, timeout=60, data_address=server.data_address) as c:
        yield c


def test_store_puts_a_prompt_as_chained_blocks(any_client, rng):
    client = any_client
    s = TqkvStore(client, CFG, unique("hfs"), cache_dtype="k8v8", block_size=16)
    assert (s.model.num_layers, s.model.num_q_heads, s.model.num_kv_heads) == (2, 4, 2)
    ids = list(range(1000, 1045))  # two full blocks and 13 tokens
    hs = s.block_hashes(ids)
    assert hs == hashing.block_hashes(ids, 16) and len(hs) == 3
    k = rng.standard_normal((2, 45, 2, 128)).astype(np.float16)
    v = rng.standard_normal((2, 45, 2, 128)).astype(np.float16)
    assert s.cached_prefix_blocks(ids) == 0
    assert s.put_prompt(hs, k, v).committed == 3
    assert s.cached_prefix_blocks(ids) == 2  # full blocks only, by default
    assert s.cached_prefix_blocks(ids, partial=True) == 3
    assert s.cached_prefix_blocks(ids[:32] + [7] * 20) == 2
    assert s.cached_prefix_blocks([7] + ids[1:]) == 0
    # The blocks from the third on, again: present already.
    r = s.put_prompt(hs, k[:, 32:], v[:, 32:], first_block=2)
    assert (r.committed, r.already_present) == (0, 1)
    # A sequence over all of them, the partial block's tokens counted.
    with client.create_sequence(s.model, hs, last_block_tokens=13) as seq:
        assert seq.num_tokens == 45
    # The hash scheme is part of the registration.
    with pytest.raises(tqkv.AlreadyExists):
        client.register_model(s.model.name, num_layers=2, num_kv_heads=2, num_q_heads=4, head_dim=128,
                              block_size=16, cache_dtype="k8v8", block_hash_scheme="another-scheme")
    st = s.stats()
    assert sum(t.blocks for t in st.tiers.values()) >= 3 and st.compression_ratio > 1


def test_layerwise_saves_and_loads_a_prompt_with_a_partial_block(client, rng):
    from tqkv.layerwise import LayerwiseLoader, LayerwiseSaver
    s = TqkvStore(client, CFG, unique("hfl"), cache_dtype="k8v8", block_size=16)
    ids = list(range(45))
    hs = s.block_hashes(ids)
    k = rng.standard_normal((2, 45, 2, 128)).astype(np.float16)
    v = rng.standard_normal((2, 45, 2, 128)).astype(np.float16)
    saver = LayerwiseSaver(client, s.model, hs[:2], parents=[b""] + hs[:1])
    with pytest.raises(ValueError):
        saver.save_layer(0, k[0], v[0])  # 3 blocks of tokens, 2 hashes
    saver = LayerwiseSaver(client, s.model, hs, parents=[b""] + hs[:-1])
    for layer in range(2):
        saver.save_layer(layer, k[layer], v[layer])
    assert saver.wait_for_save()[-1].committed == 3
    saver.close()
    assert s.cached_prefix_blocks(ids, partial=True) == 3
    # The same blocks as one put of the whole prompt under other hashes.
    other = hashing.block_hashes([t + 1 for t in ids], 16)
    s.put_prompt(other, k, v)
    with LayerwiseLoader(client, s.model, hs, num_tokens=45) as loader, \
            LayerwiseLoader(client, s.model, other, num_tokens=45) as ref:
        for (layer, (lk, lv)), (_, (rk, rv)) in zip(loader, ref):
            assert lk.shape == (45, 2, 128)
            assert np.array_equal(lk, rk) and np.array_equal(lv, rv)
            assert np.abs(lk.astype(np.float32) - k[layer]).max() < 0.05
