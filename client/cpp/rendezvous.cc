#include "client/cpp/rendezvous.h"

#include <cmath>

namespace tqkv::client {
namespace {

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t RendezvousHash(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix(h);
}

double RendezvousScore(uint64_t key_hash, uint64_t shard_hash, double weight) {
  const double u = (static_cast<double>(Mix(key_hash ^ shard_hash) >> 11) + 0.5) / 9007199254740992.0;
  return weight / -std::log(u);
}

int RendezvousOwner(std::string_view key, const std::vector<RendezvousShard>& shards) {
  const uint64_t k = RendezvousHash(key);
  int best = -1;
  double best_score = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const double s = RendezvousScore(k, RendezvousHash(shards[i].name), shards[i].weight);
    if (best < 0 || s > best_score || (s == best_score && shards[i].name < shards[best].name)) {
      best = static_cast<int>(i);
      best_score = s;
    }
  }
  return best;
}

}  // namespace tqkv::client
