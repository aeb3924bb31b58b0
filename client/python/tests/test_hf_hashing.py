"""tqkv.hf.hashing: the block-hash scheme (no torch needed)."""
import hashlib
import struct

import numpy as np
import pytest

from tqkv.hf import hashing


def test_chain_matches_the_documented_formula():
    ids = list(range(100, 137))  # two full blocks of 16 and a partial one of 5
    hs = hashing.block_hashes(ids, 16)
    assert len(hs) == 3 and all(len(h) == 32 for h in hs)
    parent = b""
    for i, chunk in enumerate([ids[:16], ids[16:32], ids[32:]]):
        want = hashlib.sha256(b"tqkv-hf-sha256-chain-v1" + parent +
                              struct.pack(f"<{len(chunk) + 1}I", len(chunk), *chunk)).digest()
        assert hs[i] == want
        parent = want
    assert hashing.block_hashes(ids, 16, partial=False) == hs[:2]


def test_prompts_share_exactly_their_whole_block_prefix():
    a = list(range(40))
    b = a[:32] + [7] * 8
    ha, hb = hashing.block_hashes(a, 16), hashing.block_hashes(b, 16)
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    # A change in block 0 changes every later hash.
    c = [1] + a[1:]
    assert all(x != y for x, y in zip(hashing.block_hashes(c, 16), ha))
    # A partial block never equals the full block it grows into.
    assert hashing.block_hashes(a[:20], 16)[1] != hashing.block_hashes(a[:32], 16)[1]


def test_token_containers():
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    want = hashing.block_hashes(ids, 4)
    assert hashing.block_hashes(np.array([ids]), 4) == want
    assert hashing.block_hashes(tuple(ids), 4) == want
    with pytest.raises(ValueError):
        hashing.block_hashes([ids, ids], 4)
    with pytest.raises(ValueError):
        hashing.block_hashes(ids, 0)
