"""The block-hash scheme of tqkv.hf (no torch needed).

A prompt of token ids is cut into blocks of `block_size` tokens; the last
block may be partial. Block i's hash is

    h_i = SHA-256(SCHEME || h_{i-1} || u32le(len(tokens_i)) || u32le(t) for t in tokens_i)

with h_{-1} = b"" and SCHEME = b"tqkv-hf-sha256-chain-v1" (32-byte hashes).
A block's hash therefore names every token from the start of the prompt to
the block's end, so two prompts share exactly the blocks of their common
prefix of whole blocks, and a partial block never collides with a full
one. The scheme's name is registered as the model's `block_hash_scheme`
and so is part of its layout fingerprint: a client hashing differently
cannot read these blocks.
"""
import hashlib
import struct

SCHEME = "tqkv-hf-sha256-chain-v1"
_TAG = SCHEME.encode()


def token_list(token_ids):
    """A flat list of ints from a list, a numpy array or a torch tensor of
    shape [n] or [1, n]."""
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    if token_ids and isinstance(token_ids[0], (list, tuple)):
        if len(token_ids) != 1:
            raise ValueError(f"one sequence of token ids expected, got a batch of {len(token_ids)}")
        token_ids = token_ids[0]
    return [int(t) for t in token_ids]


def block_hashes(token_ids, block_size, *, partial=True):
    """Hashes of the blocks of `token_ids` in order: full blocks, then (when
    `partial` and the length is not a multiple of block_size) the partial
    last one."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    ids = token_list(token_ids)
    out, parent = [], b""
    end = len(ids) if partial else len(ids) - len(ids) % block_size
    for start in range(0, end, block_size):
        chunk = ids[start:min(start + block_size, end)]
        h = hashlib.sha256(_TAG)
        h.update(parent)
        h.update(struct.pack(f"<{len(chunk) + 1}I", len(chunk), *chunk))
        parent = h.digest()
        out.append(parent)
    return out
