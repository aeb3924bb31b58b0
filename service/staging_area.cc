#include "service/staging_area.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tqkv::service {

StagingArea::StagingArea(const StagingOptions& options)
    : options_(options),
      budget_({.total = options.max_bytes,
                .per_tenant = options.max_bytes_per_tenant,
                .what = "staged bytes of layer-range puts",
                .total_flag = "--max_staged_bytes",
                .per_tenant_flag = "--max_staged_bytes_per_tenant"}) {}

void StagingArea::Completed::CopyTo(uint8_t* out) const {
  if (base.empty()) {
    std::memset(out, 0, bytes);
  } else {
    std::memcpy(out, base.data(), bytes);
  }
  std::memcpy(out + part_offset, part.data(), part.size());
}

absl::Status StagingArea::Apply(const RegisteredModel& model, std::vector<Part> parts,
                                absl::Time now,
                                const std::function<absl::Status(std::vector<Completed>&)>& commit,
                                uint32_t* still_staged) {
  const ModelCodec& codec = *model.codec;
  const int layers = codec.shape().num_layers;
  const size_t block_bytes = codec.block_bytes();
  absl::MutexLock l(&mu_);
  ExpireLocked(now);
  // What each part does: completes its block (committed first, from views
  // of the staged layers and the part) or stays staged (an entry changed in
  // place, or a new one whose bytes are charged before anything changes).
  std::vector<Entry*> entry(parts.size(), nullptr);
  std::vector<bool> completes(parts.size(), false);
  std::vector<TenantBudget::Reservation> fresh(parts.size());
  std::vector<Completed> completed;
  uint32_t staged = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    auto it = entries_.find(p.key);
    entry[i] = it == entries_.end() ? nullptr : &it->second;
    bool all = true;
    for (int layer = 0; layer < layers && all; ++layer)
      all = (layer >= p.first && layer < p.last) || (entry[i] != nullptr && entry[i]->have[layer]);
    completes[i] = all;
    if (all) {
      completed.push_back({.key = &p.key,
                           .parent_hash = entry[i] != nullptr && !entry[i]->parent_hash.empty()
                                              ? std::string_view(entry[i]->parent_hash)
                                              : std::string_view(p.parent_hash),
                           .bytes = block_bytes,
                           .base = entry[i] != nullptr ? std::string_view(entry[i]->payload) : std::string_view(),
                           .part_offset = codec.layer_offset(p.first),
                           .part = p.bytes});
      continue;
    }
    ++staged;
    if (entry[i] == nullptr) TQ_RETURN_IF_ERROR(budget_.Charge(p.key.tenant, block_bytes, &fresh[i]));
  }
  if (!completed.empty()) TQ_RETURN_IF_ERROR(commit(completed));
  // (Looked up again: an insertion may move the entries.)
  for (size_t i = 0; i < parts.size(); ++i) {
    Part& p = parts[i];
    if (completes[i]) {
      if (entry[i] != nullptr) entries_.erase(p.key);
      continue;
    }
    auto it = entries_.find(p.key);
    Entry* e = it == entries_.end() ? nullptr : &it->second;
    if (e == nullptr) {
      e = &entries_[p.key];
      e->charge = std::move(fresh[i]);
      e->payload.assign(block_bytes, '\0');
      e->have.assign(layers, false);
    }
    std::memcpy(e->payload.data() + codec.layer_offset(p.first), p.bytes.data(), p.bytes.size());
    for (int layer = p.first; layer < p.last; ++layer) e->have[layer] = true;
    if (e->parent_hash.empty()) e->parent_hash = p.parent_hash;
    e->updated = now;
  }
  *still_staged = staged;
  return absl::OkStatus();
}

void StagingArea::ExpireLocked(absl::Time now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.updated + options_.ttl < now) {
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

size_t StagingArea::CountOfModel(const std::string& tenant, uint64_t model_id) const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += key.tenant == tenant && key.model_id == model_id;
  return n;
}

size_t StagingArea::DropModel(const std::string& tenant, uint64_t model_id) {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->first.tenant == tenant && it->first.model_id == model_id) {
      entries_.erase(it++);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

size_t StagingArea::size() const {
  absl::MutexLock l(&mu_);
  return entries_.size();
}

}  // namespace tqkv::service
