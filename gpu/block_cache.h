// DeviceBlockCache: the GPU tier's page arena. One cudaMalloc at creation
// carves fixed-size slots (one stored block each); blocks are keyed by
// BlockRef::id and evicted least-recently-used. Nothing allocates after
// Create: a miss takes a free slot or evicts.
//
// Thread safety: not thread-safe; CudaBackend serialises calls.
#ifndef TQKV_GPU_BLOCK_CACHE_H_
#define TQKV_GPU_BLOCK_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/cuda_util.h"

namespace tqkv::gpu {

class DeviceBlockCache {
 public:
  // Allocates `arena_bytes` of device memory (RESOURCE_EXHAUSTED on failure).
  static absl::StatusOr<std::unique_ptr<DeviceBlockCache>> Create(size_t arena_bytes);

  // Makes slots of at least `block_bytes` (rounded up to 256). A request
  // larger than the slots re-carves the arena: every resident block is
  // dropped (counted as evicted) and re-uploads on its next Acquire, so
  // models of different block sizes share one arena in slots of the
  // largest. Call it between batches (no block of the current epoch may be
  // in use). RESOURCE_EXHAUSTED when the arena cannot hold one such block
  // (nothing changes).
  absl::Status EnsureSlotBytes(size_t block_bytes);

  // Slot holding `id`, assigning one on a miss (*miss = true: the caller
  // must upload the payload). Blocks acquired with the current `epoch` are
  // never evicted by this call; RESOURCE_EXHAUSTED when every slot is in use
  // by the current epoch.
  absl::StatusOr<int32_t> Acquire(uint64_t id, uint64_t epoch, size_t payload_bytes, bool* miss);
  // Drops `id` (no-op when absent).
  void Forget(uint64_t id);

  uint8_t* base() const { return arena_.as<uint8_t>(); }
  size_t slot_bytes() const { return slot_bytes_; }
  int32_t num_slots() const { return static_cast<int32_t>(num_slots_); }
  size_t capacity_bytes() const { return arena_.bytes(); }
  size_t resident_bytes() const { return resident_bytes_; }
  size_t resident_blocks() const { return map_.size(); }
  uint64_t uploads() const { return uploads_; }
  // Changes whenever a resident block loses its slot (eviction, Forget, a
  // re-carved arena). While it is unchanged, every slot Acquire returned
  // still holds the same block.
  uint64_t generation() const { return generation_; }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    int32_t slot;
    uint64_t epoch;
    size_t bytes;
    std::list<uint64_t>::iterator lru;
  };
  DeviceBuffer arena_;
  size_t slot_bytes_ = 0;
  size_t num_slots_ = 0;
  std::vector<int32_t> free_;
  std::list<uint64_t> lru_;  // front = most recent
  std::unordered_map<uint64_t, Entry> map_;
  size_t resident_bytes_ = 0;
  uint64_t uploads_ = 0, evictions_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_BLOCK_CACHE_H_
