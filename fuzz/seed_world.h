// The state the data-plane fuzzer starts from, and the records that build
// it for the service fuzzer's seeds: the small test model (2 layers, 2 kv
// heads, 4 q heads, head dim 64, block 16, k4v4) registered, kSeedBlocks
// blocks of the chain HashChain(1, kSeedBlocks) stored, and a sequence over
// them.
#ifndef TQKV_FUZZ_SEED_WORLD_H_
#define TQKV_FUZZ_SEED_WORLD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tqkv/v1/tqkv.pb.h"
#include "service/kv_service.h"

namespace tqkv::fuzz {

inline constexpr int kSeedBlocks = 3;

struct SeedWorld {
  v1::RegisterModelRequest registration;
  v1::ModelRef model;
  std::vector<std::string> hashes;
  std::vector<v1::PutBlock> blocks;  // dense, one per hash
  std::string sequence_id;
};

// The requests of the world (model ref and sequence id left empty).
SeedWorld WorldRequests();

// Builds the world in `service` as `id`: fills model and sequence_id.
absl::StatusOr<SeedWorld> BuildWorld(service::KvService& service, const service::Identity& id);

// A dense [tokens, kv_heads, d] (or [tokens, q_heads, d] for queries)
// fp16 tensor of the small model with values from `seed`.
v1::Tensor Rows(int tokens, int heads, uint64_t seed);

}  // namespace tqkv::fuzz

#endif  // TQKV_FUZZ_SEED_WORLD_H_
