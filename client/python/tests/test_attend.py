"""Fused decode attention vs an fp64 reference over the dequantized blocks."""
import numpy as np
import pytest

import tqkv
from helpers import attention_reference, cosine, hashes, kv, unique

L, H, HQ, D, BS = 2, 2, 4, 128, 16


@pytest.fixture
def setup(client, rng):
    m = client.register_model(unique(), num_layers=L, num_kv_heads=H, num_q_heads=HQ,
                              head_dim=D, block_size=BS, cache_dtype="k4v4")
    hs = hashes("a", 3)
    blocks = [kv(rng, L, BS, H, D) for _ in hs]
    client.put_blocks(m, [(h, k, v) for h, (k, v) in zip(hs, blocks)])
    deq = client.get_blocks(m, hs, dense=True, dtype="fp32")
    # Per layer [T, H, D] over the stored (dequantized) blocks.
    k_blocks = np.concatenate([g.k for g in deq], axis=1)
    v_blocks = np.concatenate([g.v for g in deq], axis=1)
    return m, hs, k_blocks, v_blocks


def check_close(out, ref):
    out = tqkv.tensors.to_float64(out)
    assert out.shape == ref.shape
    assert np.abs(ref).max() > 1e-3  # non-trivial
    assert cosine(out, ref) > 0.9999
    assert np.allclose(out, ref, atol=2e-3 * np.abs(ref).max() + 1e-3, rtol=1e-2)


def test_attend_over_blocks_and_dense_tail(client, rng, setup):
    m, hs, kb, vb = setup
    tail_k, tail_v = kv(rng, L, 5, H, D)
    with client.create_sequence(m, hs, tail_k=tail_k, tail_v=tail_v) as seq:
        assert seq.num_tokens == 3 * BS + 5
        for layer in range(L):
            k_all = np.concatenate([kb[layer], tail_k[layer].astype(np.float64)])
            v_all = np.concatenate([vb[layer], tail_v[layer].astype(np.float64)])
            q = rng.standard_normal((1, HQ, D)).astype(np.float32)
            out = seq.attend(layer, q)
            assert out.dtype == np.float32
            check_close(out, attention_reference(q, k_all, v_all))
            q16 = q.astype(np.float16)
            out16 = seq.attend(layer, q16, scale=0.05)
            assert out16.dtype == np.float16
            check_close(out16, attention_reference(q16, k_all, v_all, scale=0.05))


def test_partial_last_block_then_append(client, rng):
    m = client.register_model(unique(), num_layers=L, num_kv_heads=H, num_q_heads=HQ,
                              head_dim=D, block_size=BS, cache_dtype="k4v4")
    hs = hashes("partial", 2)
    full, short = kv(rng, L, BS, H, D), kv(rng, L, BS - 5, H, D)
    client.put_blocks(m, [(hs[0], *full), (hs[1], *short)])
    deq = client.get_blocks(m, hs, dense=True, dtype="fp32")
    # Only the valid tokens of the short block count.
    kb = np.concatenate([deq[0].k, deq[1].k[:, :BS - 5]], axis=1)
    vb = np.concatenate([deq[0].v, deq[1].v[:, :BS - 5]], axis=1)
    with client.create_sequence(m, hs, last_block_tokens=BS - 5) as seq:
        assert seq.num_tokens == 2 * BS - 5
        q = rng.standard_normal((1, HQ, D)).astype(np.float32)
        check_close(seq.attend(1, q), attention_reference(q, kb[1], vb[1]))
        new_k, new_v = kv(rng, 1, 2, H, D)
        assert seq.append(1, new_k[0], new_v[0]) == 2 * BS - 3
        ref = attention_reference(q, np.concatenate([kb[1], new_k[0]]),
                                  np.concatenate([vb[1], new_v[0]]))
        check_close(seq.attend(1, q), ref)
    with pytest.raises(tqkv.InvalidArgument):
        client.create_sequence(m, hs, last_block_tokens=BS)


def test_attend_with_positions_is_causal(client, rng, setup):
    m, hs, kb, vb = setup
    with client.create_sequence(m, hs) as seq:
        positions = [0, BS - 1, 2 * BS + 3, 3 * BS - 1]
        q = rng.standard_normal((len(positions), HQ, D)).astype(np.float32)
        out = seq.attend(1, q, positions=positions)
        check_close(out, attention_reference(q, kb[1], vb[1], positions=positions))


def test_append_then_attend(client, rng, setup):
    m, hs, kb, vb = setup
    with client.create_sequence(m, hs[:1]) as seq:
        new_k, new_v = kv(rng, 1, 3, H, D)
        assert seq.append(0, new_k[0], new_v[0]) == BS + 3
        q = rng.standard_normal((1, HQ, D)).astype(np.float32)
        out = seq.attend(0, q)
        ref = attention_reference(q, np.concatenate([kb[0, :BS], new_k[0]]),
                                  np.concatenate([vb[0, :BS], new_v[0]]))
        check_close(out, ref)
        # Filling the tail to a whole block packs it: close to the unquantized
        # reference, no longer exact.
        more_k, more_v = kv(rng, 1, BS - 3, H, D)
        assert seq.append(0, more_k[0], more_v[0]) == 2 * BS
        out = seq.attend(0, q)
        ref = attention_reference(q, np.concatenate([kb[0, :BS], new_k[0], more_k[0]]),
                                  np.concatenate([vb[0, :BS], new_v[0], more_v[0]]))
        assert cosine(out, ref) > 0.99


def test_batched_items_across_sequences(client, rng, setup):
    m, hs, kb, vb = setup
    a = client.create_sequence(m, hs[:2])
    b = client.create_sequence(m, hs)
    try:
        qa = rng.standard_normal((1, HQ, D)).astype(np.float32)
        qb = rng.standard_normal((2, HQ, D)).astype(np.float32)
        outs, micros = client.attend(1, [(a, qa), (b, qb, [BS, 3 * BS - 1])],
                                     return_kernel_micros=True)
        check_close(outs[0], attention_reference(qa, kb[1, :2 * BS], vb[1, :2 * BS]))
        check_close(outs[1], attention_reference(qb, kb[1], vb[1], positions=[BS, 3 * BS - 1]))
        assert micros >= 0
    finally:
        a.drop()
        b.drop()
    with pytest.raises(tqkv.NotFound):
        a.attend(0, qa)


def test_bad_attend_inputs(client, rng, setup):
    m, hs, _, _ = setup
    with client.create_sequence(m, hs[:1]) as seq:
        with pytest.raises(tqkv.InvalidArgument):
            seq.attend(0, np.zeros((1, HQ, D + 1), np.float32))  # wrong head dim
        with pytest.raises(tqkv.InvalidArgument):
            seq.attend(L, np.zeros((1, HQ, D), np.float32))  # no such layer
        with pytest.raises(tqkv.InvalidArgument):
            seq.attend(0, np.zeros((1, HQ, D), np.float32), positions=[BS])  # beyond the end
        with pytest.raises(tqkv.InvalidArgument):
            seq.append(0, np.zeros((1, H + 1, D), np.float16), np.zeros((1, H + 1, D), np.float16))


def test_torch_tensors_in_and_out(client, rng, setup):
    torch = pytest.importorskip("torch")
    m, hs, kb, vb = setup
    with client.create_sequence(m, hs) as seq:
        q = torch.randn(1, HQ, D, dtype=torch.bfloat16)
        out = seq.attend(0, q)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
        ref = attention_reference(q.float().numpy(), kb[0], vb[0])
        assert cosine(out.float().numpy(), ref) > 0.999
