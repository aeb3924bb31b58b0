"""Shared test helpers (data generators, reference math)."""
import uuid

import numpy as np


def unique(prefix="m"):
    """A model name no other test uses (tests share one server)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def hashes(prefix, n):
    return [f"{prefix}-{i}".encode() for i in range(n)]


def kv(rng, layers, tokens, heads, d, dtype=np.float16):
    """Random K and V [layers, tokens, heads, d] of unit variance."""
    k = rng.standard_normal((layers, tokens, heads, d)).astype(dtype)
    v = rng.standard_normal((layers, tokens, heads, d)).astype(dtype)
    return k, v


def cosine(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def attention_reference(q, k, v, scale=None, positions=None):
    """fp64 attention. q [nq, hq, d]; k, v [T, hkv, d] (GQA: q head h reads
    kv head h // (hq // hkv)). positions: per query, attend to tokens
    [0, p]; None: every query sees all T tokens."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    nq, hq, d = q.shape
    t, hkv, _ = k.shape
    group = hq // hkv
    scale = 1.0 / np.sqrt(d) if not scale else scale
    out = np.zeros((nq, hq, d))
    for i in range(nq):
        end = t if positions is None else positions[i] + 1
        for h in range(hq):
            kh, vh = k[:end, h // group], v[:end, h // group]
            s = kh @ q[i, h] * scale
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ vh
    return out
