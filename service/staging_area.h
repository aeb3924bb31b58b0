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
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/model_registry.h"
#include "storage/block_key.h"

namespace tqkv::service {

struct StagingOptions {
  // Staged parts are dropped this long after their block's last update.
  // Default: 60 s.
  absl::Duration ttl = absl::Seconds(60);
  // Most bytes (whole-block buffers) staged at once; Apply beyond it is
  // RESOURCE_EXHAUSTED. Default: 256 MiB.
  uint64_t max_bytes = uint64_t{256} << 20;
};

class StagingArea {
 public:
  struct Part {
    storage::BlockKey key;
    std::string parent_hash;
    int first = 0, last = 0;  // layer range
    std::string bytes;        // layer_range_bytes(first, last)
  };
  struct Completed {
    storage::BlockKey key;
    std::string parent_hash;
    std::string payload;  // the whole block
  };

  explicit StagingArea(const StagingOptions& options) : options_(options) {}

  // Merges `parts` (all of `model`) into the staged entries as of `now`,
  // and calls commit(completed) with the blocks that became complete.
  // If commit returns an error, or the merge would exceed max_bytes, the
  // staged entries are left exactly as before and the error is returned.
  // On success *still_staged is the number of blocks touched by `parts`
  // that remain incomplete.
  absl::Status Apply(const RegisteredModel& model, std::vector<Part> parts, absl::Time now,
                     const std::function<absl::Status(std::vector<Completed>&)>& commit,
                     uint32_t* still_staged);

  // Drops entries idle since before now - ttl. Returns how many.
  size_t Expire(absl::Time now);

  size_t size() const;
  uint64_t bytes() const;

 private:
  struct Entry {
    std::string parent_hash;
    std::string payload;          // whole-block buffer
    std::vector<bool> have;       // per layer
    absl::Time updated;
  };
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StagingOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<storage::BlockKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_STAGING_AREA_H_
