#include "gpu/block_cache.h"

#include "absl/strings/str_cat.h"

namespace tqkv::gpu {

absl::StatusOr<std::unique_ptr<DeviceBlockCache>> DeviceBlockCache::Create(size_t arena_bytes) {
  std::unique_ptr<DeviceBlockCache> c(new DeviceBlockCache());
  absl::Status s = c->arena_.Reserve(arena_bytes);
  if (!s.ok()) return s;
  return c;
}

absl::Status DeviceBlockCache::EnsureSlotBytes(size_t block_bytes) {
  if (block_bytes == 0) return absl::InvalidArgumentError("block of 0 bytes");
  if (block_bytes <= slot_bytes_) return absl::OkStatus();
  const size_t slot = (block_bytes + 255) / 256 * 256;
  if (arena_.bytes() / slot == 0)
    return absl::ResourceExhaustedError(absl::StrCat("arena of ", arena_.bytes(), " bytes cannot hold a ",
                                                     block_bytes, "-byte block"));
  // Every resident block is a copy of a payload its owner still holds: the
  // re-carved arena re-uploads each on its next use.
  evictions_ += map_.size();
  map_.clear();
  lru_.clear();
  resident_bytes_ = 0;
  slot_bytes_ = slot;
  num_slots_ = arena_.bytes() / slot_bytes_;
  free_.clear();
  for (size_t i = num_slots_; i-- > 0;) free_.push_back(static_cast<int32_t>(i));
  ++generation_;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> DeviceBlockCache::Acquire(uint64_t id, uint64_t epoch, size_t payload_bytes,
                                                  bool* miss) {
  auto it = map_.find(id);
  if (it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    it->second.epoch = epoch;
    *miss = false;
    return it->second.slot;
  }
  if (payload_bytes > slot_bytes_)
    return absl::FailedPreconditionError("block larger than the arena slot");
  int32_t slot = -1;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    for (auto r = lru_.rbegin(); r != lru_.rend(); ++r) {
      auto victim = map_.find(*r);
      if (victim->second.epoch == epoch) continue;
      slot = victim->second.slot;
      resident_bytes_ -= victim->second.bytes;
      lru_.erase(victim->second.lru);
      map_.erase(victim);
      ++evictions_;
      ++generation_;
      break;
    }
    if (slot < 0)
      return absl::ResourceExhaustedError(absl::StrCat("one attention batch needs more than the arena's ",
                                                       num_slots_, " block slots"));
  }
  lru_.push_front(id);
  map_[id] = Entry{slot, epoch, payload_bytes, lru_.begin()};
  resident_bytes_ += payload_bytes;
  ++uploads_;
  *miss = true;
  return slot;
}

void DeviceBlockCache::Forget(uint64_t id) {
  auto it = map_.find(id);
  if (it == map_.end()) return;
  free_.push_back(it->second.slot);
  resident_bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  map_.erase(it);
  ++generation_;
}

}  // namespace tqkv::gpu
