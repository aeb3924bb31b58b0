#include "storage/block_index.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace tqkv::storage {

BlockRecord* BlockIndex::Find(const BlockKey& key) {
  auto it = records_.find(key);
  return it == records_.end() ? nullptr : it->get();
}

BlockRecord* BlockIndex::Insert(BlockRecord record) {
  auto owned = std::make_unique<BlockRecord>(std::move(record));
  BlockRecord* r = owned.get();
  r->generation = next_generation_++;
  r->list_ = BlockRecord::List::kNone;
  std::shared_ptr<const HostBuffer> host = std::move(r->host);
  bool on_disk = r->on_disk;
  r->host = nullptr;
  r->on_disk = false;
  auto [it, inserted] = records_.insert(std::move(owned));
  assert(inserted);
  (void)it;
  (void)inserted;
  SetOnDisk(r, on_disk);
  if (host != nullptr) SetHostCopy(r, std::move(host));
  Relist(r);
  return r;
}

void BlockIndex::Erase(BlockRecord* r) {
  SetHostCopy(r, nullptr);
  SetOnDisk(r, false);
  records_.erase(records_.find(r->key));  // destroys *r
}

void BlockIndex::SetHostCopy(BlockRecord* r, std::shared_ptr<const HostBuffer> buffer) {
  assert(buffer == nullptr || buffer->size() == r->size_bytes);
  bool had = r->host != nullptr;
  bool has = buffer != nullptr;
  r->host = std::move(buffer);
  if (had != has) {
    if (!r->on_disk) {
      AddResidency(*r, has);
      if (has) {
        host_only_bytes_ += r->size_bytes;
      } else {
        host_only_bytes_ -= r->size_bytes;
      }
    }
    AddUsage(*r, Tier::kHost, has);
    if (has) {
      host_bytes_ += r->size_bytes;
    } else {
      host_bytes_ -= r->size_bytes;
    }
  }
  Relist(r);
}

void BlockIndex::SetOnDisk(BlockRecord* r, bool on_disk) {
  if (r->on_disk != on_disk) {
    r->on_disk = on_disk;
    if (r->host == nullptr) {
      AddResidency(*r, on_disk);
    } else if (on_disk) {
      host_only_bytes_ -= r->size_bytes;
    } else {
      host_only_bytes_ += r->size_bytes;
    }
    AddUsage(*r, Tier::kDisk, on_disk);
    if (on_disk) {
      disk_bytes_ += r->size_bytes;
    } else {
      disk_bytes_ -= r->size_bytes;
    }
  }
  Relist(r);
}

void BlockIndex::Relist(BlockRecord* r) {
  BlockRecord::List want = r->host != nullptr ? BlockRecord::List::kHost
                           : r->on_disk       ? BlockRecord::List::kDiskOnly
                                              : BlockRecord::List::kNone;
  if (want == r->list_) return;
  if (r->list_ == BlockRecord::List::kHost) host_lru_.erase(r->lru_key_);
  if (r->list_ == BlockRecord::List::kDiskOnly) disk_only_lru_.erase(r->lru_key_);
  // A record joining a list is placed by its last access, so that blocks
  // moving between tiers keep their relative age.
  r->list_ = want;
  if (want == BlockRecord::List::kNone) return;
  r->lru_key_ = {r->last_access, r->generation};
  (want == BlockRecord::List::kHost ? host_lru_ : disk_only_lru_).emplace(r->lru_key_, r);
}

void BlockIndex::AddUsage(const BlockRecord& r, Tier tier, bool add) {
  if (tier == Tier::kHost) {
    uint64_t& t = tenant_host_bytes_[r.key.tenant];
    if (add) {
      t += r.size_bytes;
    } else {
      assert(t >= r.size_bytes);
      t -= r.size_bytes;
      if (t == 0) tenant_host_bytes_.erase(r.key.tenant);
    }
  }
  UsageKey key{r.key.tenant, r.key.model_id, tier};
  TierUsage& u = usage_[key];
  if (add) {
    if (u.blocks == 0) {
      u.tenant = r.key.tenant;
      u.model_id = r.key.model_id;
      u.tier = tier;
    }
    u.blocks += 1;
    u.payload_bytes += r.size_bytes;
    u.accounting += r.accounting;
  } else {
    assert(u.blocks > 0);
    u.blocks -= 1;
    u.payload_bytes -= r.size_bytes;
    u.accounting -= r.accounting;
    if (u.blocks == 0) usage_.erase(key);
  }
}

void BlockIndex::AddResidency(const BlockRecord& r, bool add) {
  std::pair<std::string, uint64_t> key{r.key.tenant, r.key.model_id};
  ModelResidency& m = residency_[key];
  if (add) {
    m.tenant = r.key.tenant;
    m.model_id = r.key.model_id;
    m.blocks += 1;
    m.payload_bytes += r.size_bytes;
  } else {
    assert(m.blocks > 0);
    m.blocks -= 1;
    m.payload_bytes -= r.size_bytes;
    if (m.blocks == 0) residency_.erase(key);
  }
}

std::vector<ModelResidency> BlockIndex::Residency() const {
  std::vector<ModelResidency> out;
  out.reserve(residency_.size());
  for (const auto& [key, m] : residency_) out.push_back(m);
  std::sort(out.begin(), out.end(), [](const ModelResidency& a, const ModelResidency& b) {
    return std::tie(a.tenant, a.model_id) < std::tie(b.tenant, b.model_id);
  });
  return out;
}

ModelResidency BlockIndex::ResidencyOf(const std::string& tenant, uint64_t model_id) const {
  auto it = residency_.find(std::make_pair(tenant, model_id));
  if (it != residency_.end()) return it->second;
  return ModelResidency{tenant, model_id, 0, 0};
}

std::vector<TierUsage> BlockIndex::Usage() const {
  std::vector<TierUsage> out;
  out.reserve(usage_.size());
  for (const auto& [key, u] : usage_) out.push_back(u);
  std::sort(out.begin(), out.end(), [](const TierUsage& a, const TierUsage& b) {
    return std::tie(a.tenant, a.model_id, a.tier) < std::tie(b.tenant, b.model_id, b.tier);
  });
  return out;
}

}  // namespace tqkv::storage
