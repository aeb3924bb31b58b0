#include "service/staging_area.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tqkv::service {

absl::Status StagingArea::Apply(const RegisteredModel& model, std::vector<Part> parts,
                                absl::Time now,
                                const std::function<absl::Status(std::vector<Completed>&)>& commit,
                                uint32_t* still_staged) {
  const ModelCodec& codec = *model.codec;
  const int layers = codec.shape().num_layers;
  const size_t block_bytes = codec.block_bytes();
  absl::MutexLock l(&mu_);
  ExpireLocked(now);
  // Work on copies of the touched entries; install them only on success.
  absl::flat_hash_map<storage::BlockKey, Entry> updated;
  for (Part& p : parts) {
    auto it = updated.find(p.key);
    if (it == updated.end()) {
      auto have = entries_.find(p.key);
      Entry e;
      if (have != entries_.end()) {
        e = have->second;
      } else {
        e.payload.assign(block_bytes, '\0');
        e.have.assign(layers, false);
      }
      it = updated.emplace(p.key, std::move(e)).first;
    }
    Entry& e = it->second;
    std::memcpy(e.payload.data() + codec.layer_offset(p.first), p.bytes.data(), p.bytes.size());
    for (int i = p.first; i < p.last; ++i) e.have[i] = true;
    if (e.parent_hash.empty()) e.parent_hash = p.parent_hash;
    e.updated = now;
  }
  std::vector<Completed> completed;
  uint64_t new_bytes = bytes_;
  uint32_t staged = 0;
  for (auto& [key, e] : updated) {
    const bool existed = entries_.contains(key);
    if (std::all_of(e.have.begin(), e.have.end(), [](bool b) { return b; })) {
      completed.push_back({key, e.parent_hash, e.payload});
      if (existed) new_bytes -= block_bytes;
    } else {
      ++staged;
      if (!existed) new_bytes += block_bytes;
    }
  }
  if (new_bytes > options_.max_bytes)
    return absl::ResourceExhaustedError(absl::StrCat(
        "staging area full: layer-range puts would stage ", new_bytes, " bytes, limit ",
        options_.max_bytes, " (finish the blocks or wait for staged parts to expire)"));
  if (!completed.empty()) {
    absl::Status s = commit(completed);
    if (!s.ok()) return s;
  }
  for (auto& [key, e] : updated) {
    if (std::all_of(e.have.begin(), e.have.end(), [](bool b) { return b; })) {
      entries_.erase(key);
    } else {
      entries_[key] = std::move(e);
    }
  }
  bytes_ = new_bytes;
  *still_staged = staged;
  return absl::OkStatus();
}

void StagingArea::ExpireLocked(absl::Time now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.updated + options_.ttl < now) {
      bytes_ -= it->second.payload.size();
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
}

size_t StagingArea::Expire(absl::Time now) {
  absl::MutexLock l(&mu_);
  const size_t before = entries_.size();
  ExpireLocked(now);
  return before - entries_.size();
}

size_t StagingArea::size() const {
  absl::MutexLock l(&mu_);
  return entries_.size();
}

uint64_t StagingArea::bytes() const {
  absl::MutexLock l(&mu_);
  return bytes_;
}

}  // namespace tqkv::service
