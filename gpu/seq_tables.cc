#include "gpu/seq_tables.h"

#include <algorithm>
#include <bit>
#include <cstdint>

namespace tqkv::gpu {

TableChunks::TableChunks(size_t entries, size_t max_chunk)
    : entries_(entries), max_chunk_(std::bit_floor(std::max(max_chunk, kMinChunk))) {
  free_.resize(std::countr_zero(max_chunk_) + 1);
}

std::optional<size_t> TableChunks::Allocate(size_t n, size_t* size) {
  if (n > max_chunk_) return std::nullopt;
  const size_t s = std::bit_ceil(std::max(n, kMinChunk));
  std::vector<size_t>& list = free_[std::countr_zero(s)];
  size_t off;
  if (!list.empty()) {
    off = list.back();
    list.pop_back();
  } else if (entries_ - next_ >= s) {
    off = next_;
    next_ += s;
  } else {
    return std::nullopt;
  }
  used_ += s;
  *size = s;
  return off;
}

void TableChunks::Free(size_t offset, size_t size) {
  free_[std::countr_zero(size)].push_back(offset);
  used_ -= size;
}

size_t SeqTable::Keep(std::span<const BlockRef> blocks, uint64_t cache_generation) {
  size_t keep = 0;
  if (generation == cache_generation) {
    keep = std::min(ids.size(), blocks.size());
    if (keep > 0 && ids[keep - 1] != blocks[keep - 1].id) keep = 0;
  }
  generation = cache_generation;
  ids.resize(keep);
  slots.resize((keep + 3) / 4 * 4);
  std::fill(slots.begin() + static_cast<std::ptrdiff_t>(keep), slots.end(), 0);
  if (first_filling >= keep) first_filling = SIZE_MAX;  // none of the kept blocks
  uploaded = std::min(uploaded, keep);
  return keep;
}

void SeqTable::Push(const BlockRef& block, int32_t slot) {
  if (!block.complete) first_filling = std::min(first_filling, ids.size());
  ids.push_back(block.id);
  slots.resize((ids.size() + 3) / 4 * 4);
  slots[ids.size() - 1] = slot;
}

void SeqTable::Clear() {
  ids.clear();
  slots.clear();
  first_filling = SIZE_MAX;
  uploaded = 0;
}

absl::StatusOr<std::unique_ptr<DeviceSeqTables>> DeviceSeqTables::Create(size_t bytes, size_t max_table_entries,
                                                                         size_t max_tables) {
  const size_t entries = bytes / sizeof(int32_t);
  const size_t pad = std::bit_floor(std::max(max_table_entries, TableChunks::kMinChunk));
  absl::StatusOr<DeviceBuffer> arena = DeviceBuffer::Allocate((entries + pad) * sizeof(int32_t));
  if (!arena.ok()) return arena.status();
  return std::unique_ptr<DeviceSeqTables>(new DeviceSeqTables(std::move(*arena), entries, pad, max_tables));
}

DeviceSeqTables::DeviceSeqTables(DeviceBuffer arena, size_t entries, size_t max_table_entries, size_t max_tables)
    : arena_(std::move(arena)), chunks_(entries, max_table_entries), max_tables_(max_tables) {}

void DeviceSeqTables::Reserve(size_t n) {
  if (tables_.size() + n <= max_tables_) return;
  for (auto& [key, t] : tables_) Release(t);
  tables_.clear();
}

SeqTable& DeviceSeqTables::Get(uint64_t key) { return tables_[key]; }

void DeviceSeqTables::Forget(uint64_t key) {
  auto it = tables_.find(key);
  if (it == tables_.end()) return;
  Release(it->second);
  tables_.erase(it);
}

int32_t* DeviceSeqTables::Device(SeqTable& t) {
  if (t.chunk_size == 0 || t.chunk_size < t.slots.size()) {
    Release(t);
    size_t size = 0;
    std::optional<size_t> off = chunks_.Allocate(t.slots.size(), &size);
    if (!off) return nullptr;
    t.chunk = *off;
    t.chunk_size = size;
  }
  return arena_.as<int32_t>() + t.chunk;
}

void DeviceSeqTables::Release(SeqTable& t) {
  if (t.chunk_size > 0) chunks_.Free(t.chunk, t.chunk_size);
  t.chunk = t.chunk_size = 0;
  t.uploaded = 0;
}

}  // namespace tqkv::gpu
