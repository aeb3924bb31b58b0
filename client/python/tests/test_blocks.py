"""Block round trips against the real server (CPU backend)."""
import numpy as np
import pytest

import tqkv
from helpers import cosine, hashes, kv, unique

L, H, D, BS = 3, 2, 128, 16


def register(client, **kw):
    args = dict(num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS, cache_dtype="k4v4",
                dense_first_layers=1)
    args.update(kw)
    return client.register_model(unique(), **args)


def test_register_returns_id_fingerprint_and_format(client):
    name = unique()
    m = client.register_model(name, num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                              cache_dtype="k4v4", dense_first_layers=1)
    assert m.created and m.model_id != 0
    assert len(m.fingerprint) == 32 and int(m.fingerprint, 16) >= 0
    f = m.format
    assert (f.block_size, f.num_kv_heads, f.head_dim, len(f.layers)) == (BS, H, D, L)
    assert f.layers[0].k_row_bytes == 2 * D  # fp16 boundary layer
    assert f.layers[1].k_row_bytes == 68 and f.layers[1].v_row_bytes == 68  # 4-bit + fp32 norm
    assert f.block_bytes == f.range_bytes() == sum(
        l.k_page_bytes + l.v_page_bytes for l in f.layers)
    offset = 0
    for l in f.layers:
        assert l.offset == offset
        offset += l.k_page_bytes + l.v_page_bytes
    # Idempotent re-registration; a conflicting one is refused.
    again = client.register_model(name, num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                                  cache_dtype="k4v4", dense_first_layers=1)
    assert not again.created
    assert (again.model_id, again.fingerprint) == (m.model_id, m.fingerprint)
    with pytest.raises(tqkv.AlreadyExists) as e:
        client.register_model(name, num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                              cache_dtype="k2v2")
    assert e.value.code.name == "ALREADY_EXISTS"


def test_dense_put_get_fp16_exact_tq4_close_packed_stable(client, rng):
    m = register(client)
    hs = hashes("blk", 4)
    ks, vs = zip(*(kv(rng, L, BS, H, D) for _ in hs))
    r = client.put_blocks(m, [tqkv.Block(h, k=k, v=v, parent=hs[i - 1] if i else b"")
                              for i, (h, k, v) in enumerate(zip(hs, ks, vs))])
    assert (r.committed, r.already_present, r.staged) == (4, 0, 0)
    assert r.packed_bytes == 4 * m.format.block_bytes
    assert r.dense_equivalent_bytes == 4 * 2 * L * BS * H * D * 2

    assert client.lookup(m, hs).hits == 4
    got = client.get_blocks(m, hs, dense=True)
    assert [g.hash for g in got] == hs
    for g, k, v in zip(got, ks, vs):
        assert g.k.dtype == np.float16 and g.k.shape == (L, BS, H, D)
        # Layer 0 is an fp16 boundary layer: exact.
        assert np.array_equal(g.k[0], k[0]) and np.array_equal(g.v[0], v[0])
        # Layers 1.. are 4-bit TurboQuant.
        for layer in range(1, L):
            assert cosine(g.k[layer], k[layer]) > 0.99
            assert cosine(g.v[layer], v[layer]) > 0.99
            assert not np.array_equal(g.k[layer], k[layer])  # it really is quantized

    p1 = client.get_blocks(m, hs)
    p2 = client.get_blocks(m, hs)
    assert all(len(a.payload) == m.format.block_bytes for a in p1)
    assert [a.payload for a in p1] == [b.payload for b in p2]
    assert p1[0].format == m.format
    # The fp16 layer's packed K page is the input's bytes.
    k_page, _ = m.format.pages(p1[0].payload)[0]
    assert k_page.tobytes() == ks[0][0].tobytes()


def test_dense_dtypes_agree(client, rng):
    m = register(client)
    k, v = kv(rng, L, BS, H, D)
    client.put_blocks(m, [(b"h", k, v)])
    f16 = client.get_blocks(m, [b"h"], dense=True)[0]
    f32 = client.get_blocks(m, [b"h"], dense=True, dtype="fp32")[0]
    b16 = client.get_blocks(m, [b"h"], dense=True, dtype="bf16")[0]
    assert f32.k.dtype == np.float32 and b16.k.dtype == np.uint16
    assert np.array_equal(f32.k.astype(np.float16), f16.k)
    assert np.allclose(tqkv.bf16_to_float32(b16.v), f32.v, rtol=2 ** -7, atol=1e-6)


def test_fp32_and_bf16_inputs(client, rng):
    m = register(client)
    k, v = kv(rng, L, BS, H, D, dtype=np.float32)
    client.put_blocks(m, [(b"f32", k, v)])
    client.put_blocks(m, [(b"b16", tqkv.float32_to_bf16(k), tqkv.float32_to_bf16(v))])
    a, b = client.get_blocks(m, [b"f32", b"b16"], dense=True, dtype="fp32")
    assert np.allclose(a.k[0], k[0].astype(np.float16), atol=0)  # fp16 layer of fp32 input
    assert np.allclose(b.k[0], tqkv.bf16_to_float32(tqkv.float32_to_bf16(k[0])), atol=1e-2)
    assert cosine(a.v[2], v[2]) > 0.99 and cosine(b.v[2], v[2]) > 0.99


def test_packed_put_round_trip_and_layer_ranges(client, rng):
    m = register(client)
    k, v = kv(rng, L, BS, H, D)
    client.put_blocks(m, [(b"src", k, v)])
    payload = client.get_blocks(m, [b"src"])[0].payload
    # Same bytes under a new hash through the packed path.
    r = client.put_blocks(m, [(b"copy", payload)])
    assert r.committed == 1
    assert client.get_blocks(m, [b"copy"])[0].payload == payload
    # Identical bytes again: already present, nothing new.
    assert client.put_blocks(m, [(b"copy", payload)]).already_present == 1
    # A layer range is the matching slice of the block.
    f = m.format
    part = client.get_blocks(m, [b"src"], first_layer=1, last_layer=3)[0].payload
    assert part == payload[f.layers[1].offset:]
    dense = client.get_blocks(m, [b"src"], first_layer=1, last_layer=2, dense=True)[0]
    assert dense.k.shape == (1, BS, H, D)
    full = client.get_blocks(m, [b"src"], dense=True)[0]
    assert np.array_equal(dense.k[0], full.k[1])


def test_layer_range_put_stages_until_complete(client, rng):
    m = register(client)
    k, v = kv(rng, L, BS, H, D)
    r = client.put_blocks(m, [(b"lr", k[:1], v[:1])], first_layer=0, last_layer=1)
    assert (r.committed, r.staged) == (0, 1)
    assert client.lookup(m, [b"lr"]).hits == 0
    r = client.put_blocks(m, [(b"lr", k[1:], v[1:])], first_layer=1, last_layer=L)
    assert r.committed == 1
    whole = register(client)
    client.put_blocks(whole, [(b"lr", k, v)])
    assert (client.get_blocks(m, [b"lr"])[0].payload ==
            client.get_blocks(whole, [b"lr"])[0].payload)


def test_partial_block_tokens(client, rng):
    m = register(client)
    k, v = kv(rng, L, BS - 5, H, D)
    client.put_blocks(m, [(b"short", k, v)])
    g = client.get_blocks(m, [b"short"], dense=True)[0]
    assert g.k.shape == (L, BS, H, D)
    assert np.array_equal(g.k[0, :BS - 5], k[0])


def test_lookup_counts_leading_hits_and_tiers(client, rng):
    m = register(client)
    hs = hashes("chain", 6)
    k, v = kv(rng, L, BS, H, D)
    client.put_blocks(m, [(h, k, v) for h in hs[:3]] + [(hs[4], k, v)])
    r = client.lookup(m, hs)
    assert r.hits == 3 and len(r.tiers) == 3
    assert set(r.tiers) <= {"gpu", "host", "disk"}
    assert client.lookup(m, hs[3:]).hits == 0
    assert client.lookup(m, []).hits == 0


def test_generator_put_and_failure_commits_nothing(client, rng):
    m = register(client)
    k, v = kv(rng, L, BS, H, D)

    def gen(n, fail_at=None):
        for i in range(n):
            if i == fail_at:
                raise RuntimeError("producer failed")
            yield tqkv.Block(f"g{i}".encode(), k=k, v=v)

    with pytest.raises(RuntimeError, match="producer failed"):
        client.put_blocks(m, gen(3, fail_at=2))
    assert client.lookup(m, [b"g0"]).hits == 0
    assert client.put_blocks(m, gen(3)).committed == 3
    assert client.lookup(m, [b"g0", b"g1", b"g2"]).hits == 3


def test_durable_put(client, rng):
    m = register(client)
    k, v = kv(rng, L, BS, H, D)
    assert client.put_blocks(m, [(b"d", k, v)], durable=True).committed == 1
    assert client.lookup(m, [b"d"]).hits == 1


def test_list_and_unregister_models(client, rng):
    name = unique()
    m = client.register_model(name, num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS)
    k, v = kv(rng, L, BS, H, D)
    client.put_blocks(m, [(b"u0", k, v), (b"u1", k, v)])
    info = {i.model.name: i for i in client.list_models()}[name]
    assert (info.model.model_id, info.model.fingerprint) == (m.model_id, m.fingerprint)
    assert (info.model.num_layers, info.model.head_dim, info.blocks, info.sequences) == (L, D, 2, 0)
    assert client.lookup(info.model, [b"u0", b"u1"]).hits == 2, "a listed model works in data calls"
    with pytest.raises(tqkv.FailedPrecondition):
        client.unregister_model(m)
    r = client.unregister_model(m, force=True)
    assert (r.blocks, r.sequences, r.staged) == (2, 0, 0) and r.bytes > 0
    assert name not in {i.model.name for i in client.list_models()}
    with pytest.raises(tqkv.NotFound):
        client.lookup(m, [b"u0"])
    again = client.register_model(name, num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                                  cache_dtype="k2v2")
    assert again.created and again.model_id == m.model_id and again.fingerprint != m.fingerprint
    assert client.lookup(again, [b"u0", b"u1"]).hits == 0


def test_pin_unpin_delete(client, rng):
    m = register(client)
    hs = hashes("p", 3)
    k, v = kv(rng, L, BS, H, D)
    client.put_blocks(m, [(h, k, v) for h in hs])
    assert client.pin(m, hs[:2], ttl_ms=60_000) == 2
    assert client.unpin(m, hs[:2]) == 2
    assert client.delete(m, hs[1:]) == 2
    assert client.lookup(m, hs).hits == 1
    with pytest.raises(tqkv.NotFound):
        client.get_blocks(m, hs[1:2])
    assert client.delete(m, hs[1:]) == 0


def test_stats_and_evict_to_disk(client, rng):
    m = register(client)
    hs = hashes("s", 2)
    k, v = kv(rng, L, BS, H, D)
    client.put_blocks(m, [(h, k, v) for h in hs])
    before = client.get_blocks(m, hs)
    st = client.stats(m).model(m.model_id)
    assert st.tiers["host"].blocks == 2 and st.compression_ratio > 1.0
    assert st.tiers["host"].dense_equivalent_bytes == 2 * 2 * L * BS * H * D * 2
    assert client.stats().backend in ("cpu", "cuda")

    ev = client.evict(m, drop=False)  # spill to disk
    assert ev.blocks == 2 and ev.bytes >= 2 * m.format.block_bytes
    assert client.stats(m).model(m.model_id).tiers["disk"].blocks == 2
    assert client.lookup(m, hs).tiers == ["disk", "disk"]
    after = client.get_blocks(m, hs)  # verified read from RocksDB, promoted to host
    assert [a.payload for a in after] == [b.payload for b in before]
    assert [a.tier for a in after] == ["disk", "disk"]
    assert client.lookup(m, hs).tiers == ["host", "host"]

    dropped = client.evict(m, drop=True)  # drops every copy
    assert dropped.blocks == 2
    assert client.lookup(m, hs).hits == 0
    assert client.stats(m).model(m.model_id).tiers == {}


def test_layerwise_save_then_load(client, rng):
    from tqkv.layerwise import LayerwiseLoader, LayerwiseSaver
    m = register(client)
    hs = hashes("lw", 3)
    ks = np.stack([kv(rng, L, BS, H, D)[0] for _ in hs])  # [blocks, L, BS, H, D]
    vs = np.stack([kv(rng, L, BS, H, D)[1] for _ in hs])
    saver = LayerwiseSaver(client, m, hs)
    for layer in range(L):
        saver.save_layer(layer, ks[:, layer], vs[:, layer])
    results = saver.wait_for_save()
    saver.close()
    assert sum(r.committed for r in results) == 3 and results[-1].committed == 3
    full = client.get_blocks(m, hs, dense=True)
    with LayerwiseLoader(client, m, hs) as loader:
        for layer, (lk, lv) in loader:
            assert lk.shape == (3 * BS, H, D)
            assert np.array_equal(lk, np.concatenate([f.k[layer] for f in full]))
            assert np.array_equal(lv, np.concatenate([f.v[layer] for f in full]))
    assert np.array_equal(full[1].k[0], ks[1, 0])  # layer 0 is fp16
