"""Weighted rendezvous (highest-random-weight) hashing, bit for bit the
arithmetic of the C++ client (client/cpp/rendezvous.h), so that Python and C++
clients route every key to the same shard.

A (key, shard) pair scores weight / -ln(u), u in (0, 1) a hash of the pair;
the highest score owns the key (ties: the smaller name). Adding a shard of
weight w to shards of total weight W moves about w / (W + w) of the keys, all
to the new shard.
"""
import math

_M64 = (1 << 64) - 1


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & _M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & _M64
    return z ^ (z >> 31)


def rendezvous_hash(data):
    """64-bit hash of bytes: FNV-1a 64, then the SplitMix64 finalizer."""
    h = 0xcbf29ce484222325
    for c in data:
        h = ((h ^ c) * 0x100000001b3) & _M64
    return _mix(h)


def rendezvous_score(key_hash, shard_hash, weight):
    """weight / -ln(u), u = ((mix(key_hash ^ shard_hash) >> 11) + 0.5) / 2**53."""
    u = ((_mix(key_hash ^ shard_hash) >> 11) + 0.5) / 9007199254740992.0
    return weight / -math.log(u)


def rendezvous_owner(key, shards):
    """Index into `shards` (a sequence of (name, weight)) of the owner of
    `key` (bytes); -1 when there are none."""
    k = rendezvous_hash(key)
    best, best_score, best_name = -1, 0.0, None
    for i, (name, weight) in enumerate(shards):
        s = rendezvous_score(k, rendezvous_hash(name.encode()), weight)
        if best < 0 or s > best_score or (s == best_score and name < best_name):
            best, best_score, best_name = i, s, name
    return best


class Ring:
    """Shards with their hashes computed once: `owner(key)` is
    rendezvous_owner(key, shards) without re-hashing the names."""

    def __init__(self, shards):
        self.shards = [(name, float(weight)) for name, weight in shards]
        self._hashes = [rendezvous_hash(name.encode()) for name, _ in self.shards]

    def owner(self, key):
        k = rendezvous_hash(key)
        best, best_score = -1, 0.0
        for i, ((name, weight), h) in enumerate(zip(self.shards, self._hashes)):
            s = rendezvous_score(k, h, weight)
            if best < 0 or s > best_score or (s == best_score and name < self.shards[best][0]):
                best, best_score = i, s
        return best
