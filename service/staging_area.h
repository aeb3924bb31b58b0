// StagingArea: layer-range puts waiting for the rest of their block.
//
// A PutBlocks stream whose header names a layer range [first, last) smaller
// than the whole model stages each block's layers here (when the stream
// succeeds). When every layer of a block has been staged, the block is
// complete: the caller commits it to the BlockStore and it leaves the area.
// A staged layer range overwrites the same layers staged earlier. Entries
// expire `ttl` after their last update.
//
// Thread safety: thread-safe; Apply runs its callback under the area's
// mutex, so concurrent streams completing the same block are serialised.
#ifndef TQKV_SERVICE_STAGING_AREA_H_
#define TQKV_SERVICE_STAGING_AREA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/model_registry.h"
#include "service/tenant_budget.h"
#include "storage/block_key.h"

namespace tqkv::service {

struct StagingOptions {
  // Staged parts are dropped this long after their block's last update.
  // Default: 60 s.
  absl::Duration ttl = absl::Seconds(60);
  // Most bytes staged at once, all tenants and one tenant: whole-block
  // buffers of staged entries and the layer-range parts open streams hold
  // until they finish (ChargeParts). Charged before they are allocated;
  // one more is RESOURCE_EXHAUSTED. Defaults: 2 GiB and 1 GiB.
  uint64_t max_bytes = uint64_t{2} << 30;
  uint64_t max_bytes_per_tenant = uint64_t{1} << 30;
};

class StagingArea {
 public:
  struct Part {
    storage::BlockKey key;
    std::string parent_hash;
    int first = 0, last = 0;  // layer range
    std::string bytes;        // layer_range_bytes(first, last)
  };
  // A block this Apply completes: its staged layers (`base`, the whole
  // block's buffer; empty when nothing was staged) with `part` over them
  // at `part_offset`. Views into the area and the call's parts, valid
  // during the commit callback.
  struct Completed {
    const storage::BlockKey* key = nullptr;
    std::string_view parent_hash;
    size_t bytes = 0;  // the whole block's
    std::string_view base;
    size_t part_offset = 0;
    std::string_view part;
    void CopyTo(uint8_t* out) const;  // `bytes` bytes
  };

  explicit StagingArea(const StagingOptions& options);

  // Charges `bytes` of parts an open stream of `tenant` is about to hold
  // (added to *out, given back when *out is destroyed), or
  // RESOURCE_EXHAUSTED naming the flag.
  absl::Status ChargeParts(const std::string& tenant, uint64_t bytes, TenantBudget::Reservation* out) {
    return budget_.Charge(tenant, bytes, out);
  }

  // Merges `parts` (all of `model`) into the staged entries as of `now`,
  // and calls commit(completed) with the blocks that became complete.
  // If commit returns an error, or the blocks it would newly stage do not
  // fit the budget (RESOURCE_EXHAUSTED), the staged entries are left
  // exactly as before and the error is returned. Entries are changed only
  // after commit succeeded, in place. REQUIRES: each key at most once in
  // `parts`, all of one tenant.
  // On success *still_staged is the number of blocks touched by `parts`
  // that remain incomplete.
  absl::Status Apply(const RegisteredModel& model, std::vector<Part> parts, absl::Time now,
                     const std::function<absl::Status(std::vector<Completed>&)>& commit,
                     uint32_t* still_staged);

  // Drops entries idle since before now - ttl. Returns how many.
  size_t Expire(absl::Time now);
  // Staged blocks of one model; DropModel drops them (a model being
  // unregistered) and returns how many.
  size_t CountOfModel(const std::string& tenant, uint64_t model_id) const;
  size_t DropModel(const std::string& tenant, uint64_t model_id);

  size_t size() const;
  // Bytes charged now: staged entries' buffers and open streams' parts.
  uint64_t bytes() const { return budget_.used(); }

 private:
  struct Entry {
    TenantBudget::Reservation charge;  // payload's bytes
    std::string parent_hash;
    std::string payload;          // whole-block buffer
    std::vector<bool> have;       // per layer
    absl::Time updated;
  };
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StagingOptions options_;
  TenantBudget budget_;  // outlives entries_
  mutable absl::Mutex mu_;
  absl::flat_hash_map<storage::BlockKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_STAGING_AREA_H_
