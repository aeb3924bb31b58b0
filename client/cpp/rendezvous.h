// Weighted rendezvous (highest-random-weight) hashing: which of a set of
// shards owns a routing key.
//
// Every (key, shard) pair gets a score weight / -ln(u), u in (0, 1) a hash
// of the pair; the shard with the highest score owns the key (ties: the
// smaller name). Adding a shard of weight w to shards of total weight W
// moves only the keys the new shard wins, about w / (W + w) of them, all to
// it; removing one moves only its own keys. Owners depend on shard names
// and weights only, not on their order.
//
// The arithmetic is part of the contract: the Python client
// (client/python/tqkv/rendezvous.py) computes the same hashes and scores,
// and both unit tests check the same golden values, so a C++ and a Python
// client route every key to the same shard.
//
// Pure functions; thread-safe.
#ifndef TQKV_CLIENT_CPP_RENDEZVOUS_H_
#define TQKV_CLIENT_CPP_RENDEZVOUS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tqkv::client {

// 64-bit hash of bytes: FNV-1a 64 followed by the SplitMix64 finalizer.
uint64_t RendezvousHash(std::string_view bytes);

// The score of a key on a shard, from RendezvousHash of each:
// u = ((Mix(key_hash ^ shard_hash) >> 11) + 0.5) / 2^53, score = weight / -ln(u)
// (Mix: the SplitMix64 finalizer). REQUIRES: weight > 0.
double RendezvousScore(uint64_t key_hash, uint64_t shard_hash, double weight);

struct RendezvousShard {
  std::string name;
  double weight = 1.0;  // > 0
};

// Index into `shards` of the owner of `key`; -1 when `shards` is empty.
// O(shards). REQUIRES: names distinct, weights > 0.
int RendezvousOwner(std::string_view key, const std::vector<RendezvousShard>& shards);

}  // namespace tqkv::client

#endif  // TQKV_CLIENT_CPP_RENDEZVOUS_H_
