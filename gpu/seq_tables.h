// Block tables that outlive a call: for each keyed sequence
// (AttendSequence::sequence_key) the block ids its list held at its last
// call, their arena slots, and a device copy of the slots in a chunk of one
// table arena. A decode call then acquires and uploads only the blocks its
// sequences added since, and the attention kernels read each sequence's
// table where it lives (AttentionLaunch::seq_tables).
//
// Thread safety: not thread-safe; CudaBackend serialises calls.
#ifndef TQKV_GPU_SEQ_TABLES_H_
#define TQKV_GPU_SEQ_TABLES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/backend.h"
#include "gpu/cuda_util.h"

namespace tqkv::gpu {

// Host bookkeeping of the table arena (no CUDA): `entries` int32 entries
// carved on demand into chunks of 2^k entries, kMinChunk <= 2^k <=
// max_chunk; a freed chunk is reused for its size only.
class TableChunks {
 public:
  static constexpr size_t kMinChunk = 256;
  TableChunks(size_t entries, size_t max_chunk);
  // Offset (entries) of a chunk of at least `n` entries, its size in
  // *size; nullopt when none is free or n > max_chunk.
  std::optional<size_t> Allocate(size_t n, size_t* size);
  void Free(size_t offset, size_t size);
  size_t max_chunk() const { return max_chunk_; }
  size_t used() const { return used_; }

 private:
  const size_t entries_, max_chunk_;
  size_t next_ = 0;  // first entry never carved
  size_t used_ = 0;
  std::vector<std::vector<size_t>> free_;  // offsets by log2(size)
};

// One keyed sequence's table.
struct SeqTable {
  std::vector<uint64_t> ids;   // the list at the last call
  std::vector<int32_t> slots;  // their arena slots, zero-padded to a multiple of 4 (16-byte uploads)
  uint64_t generation = 0;     // the DeviceBlockCache::generation() the slots hold for
  size_t first_filling = SIZE_MAX;  // first kept block that may be filling (BlockRef::complete false); SIZE_MAX: none
  // The device copy: a chunk of the arena (chunk_size 0: none) whose first
  // `uploaded` entries equal `slots`.
  size_t chunk = 0, chunk_size = 0;
  size_t uploaded = 0;

  // How many leading entries of `blocks` this table still holds, given the
  // cache's current `generation`; the table is truncated to them. Lists
  // under one key agree on their common prefix (the backend contract), so
  // only the last common entry is compared: that catches a list whose end
  // was taken back and refilled with other blocks. 0 after the arena lost a
  // block (another generation).
  size_t Keep(std::span<const BlockRef> blocks, uint64_t generation);
  // Appends the next block of the list and its slot.
  void Push(const BlockRef& block, int32_t slot);
  // Forgets every entry (the device copy stays allocated, to be rewritten).
  void Clear();
  size_t size() const { return ids.size(); }
};

class DeviceSeqTables {
 public:
  // A table arena of `bytes` (one cudaMalloc, plus max_table_entries of
  // readable padding after it: kernels read up to a call's max_blocks
  // entries past a table's start). RESOURCE_EXHAUSTED when it cannot be
  // allocated.
  static absl::StatusOr<std::unique_ptr<DeviceSeqTables>> Create(size_t bytes, size_t max_table_entries,
                                                                 size_t max_tables);

  // Makes room for `n` more tables: when fewer fit under max_tables, every
  // table is dropped (they are rebuilt on demand). Call it before a call's
  // Get()s: Get never drops, so the tables it returns stay valid.
  void Reserve(size_t n);
  // The table of `key`, empty when new.
  SeqTable& Get(uint64_t key);
  // Drops `key`'s table (no-op when absent).
  void Forget(uint64_t key);
  // t's device copy, with room for t.slots (a larger chunk resets
  // t.uploaded to 0); null when the arena has no chunk for it (the caller
  // stages the table in its call).
  int32_t* Device(SeqTable& t);
  size_t max_table_entries() const { return chunks_.max_chunk(); }
  size_t live_tables() const { return tables_.size(); }

 private:
  DeviceSeqTables(DeviceBuffer arena, size_t entries, size_t max_table_entries, size_t max_tables);
  void Release(SeqTable& t);

  DeviceBuffer arena_;
  TableChunks chunks_;
  const size_t max_tables_;
  std::unordered_map<uint64_t, SeqTable> tables_;
};

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_SEQ_TABLES_H_
