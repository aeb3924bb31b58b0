#include "storage/block_store.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/parallel_for.h"
#include "base/status_macros.h"

namespace tqkv::storage {

// RocksDB work planned under mu_ and run by RunPlanLocked. Every record in a
// plan is io_busy, which keeps it alive and unchanged by others until the
// plan finishes.
struct BlockStore::IoPlan {
  struct Write {
    BlockRecord* record;
    DiskBlockMeta meta;
    std::shared_ptr<const HostBuffer> payload;
    bool evict_after;  // spill: drop the host copy once written (unless pinned by then)
  };
  struct Drop {
    BlockRecord* record;  // invisible; erased when the plan finishes
    bool count_as_drop;   // budget or admin drop (not Delete / checksum failure)
  };
  std::vector<Write> writes;
  std::vector<Drop> drops;
  bool sync = false;
  bool written_behind = false;  // the writes are write-behind copies (counted as such)
  // Filled by RunPlanLocked: spills whose host copy was released.
  uint64_t evicted_blocks = 0;
  uint64_t evicted_bytes = 0;

  bool empty() const { return writes.empty() && drops.empty(); }
};

namespace {

constexpr int kMaxAdmissionRounds = 16;
// After a spill fails for a full disk, eviction drops its victims instead
// of writing them for this long, then tries the disk again.
constexpr absl::Duration kDiskFullRetryInterval = absl::Seconds(1);
constexpr int kMaxGetAttempts = 4;
// A Lookup prefetches the index memory of the hash this far ahead of the
// one it probes (each probe's cache misses overlap the next ones').
constexpr size_t kLookupAhead = 8;

DiskBlockMeta MetaOf(const BlockRecord& r) {
  DiskBlockMeta m;
  m.size_bytes = r.size_bytes;
  m.checksum = r.checksum;
  m.parent_hash = r.parent_hash;
  m.accounting = r.accounting;
  return m;
}

bool InScope(const BlockRecord& r, const std::optional<ModelScope>& scope) {
  return !scope.has_value() ||
         (r.key.model_id == scope->model_id && r.key.tenant == scope->tenant);
}

}  // namespace

// ---------------------------------------------------------------- PutHandle

PutHandle& PutHandle::operator=(PutHandle&& other) noexcept {
  if (this != &other) {
    Release();
    store_ = std::exchange(other.store_, nullptr);
    key_ = std::move(other.key_);
    parent_hash_ = std::move(other.parent_hash_);
    accounting_ = other.accounting_;
    options_ = other.options_;
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

PutHandle::~PutHandle() { Release(); }

void PutHandle::Release() {
  if (store_ == nullptr) return;
  std::exchange(store_, nullptr)->ReleaseHandle(key_.tenant, accounting_.total_bytes);
  buffer_.reset();
}

// ------------------------------------------------------------ construction

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const BlockStoreOptions& options) {
  TQ_RETURN_IF_ERROR(HostPool::Validate({.capacity_bytes = options.host_capacity_bytes,
                                         .high_watermark = options.host_high_watermark,
                                         .low_watermark = options.host_low_watermark}));
  if (options.max_pin_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("max_pin_ttl must be positive");
  }
  std::unique_ptr<SpillStore> spill;
  if (!options.disk_path.empty()) {
    TQ_ASSIGN_OR_RETURN(spill, SpillStore::Open({.path = options.disk_path,
                                                      .cipher = options.at_rest_cipher,
                                                      .host_arena = options.host_arena,
                                                      .min_free_bytes = options.disk_min_free_bytes}));
  }
  std::unique_ptr<BlockStore> store(new BlockStore(options, std::move(spill)));
  if (options.write_behind_above_bytes > 0 && store->spill_ != nullptr)
    store->write_behind_ = std::thread([s = store.get()] { s->WriteBehindLoop(); });
  if (options.load_index_in_background && store->spill_ != nullptr) {
    {
      absl::MutexLock l(&store->mu_);
      store->loading_ = true;
    }
    store->loader_ = std::thread([s = store.get()] { s->LoadFromDisk().IgnoreError(); });  // in load_status_
    return store;
  }
  TQ_RETURN_IF_ERROR(store->LoadFromDisk());
  return store;
}

BlockStore::BlockStore(const BlockStoreOptions& options, std::unique_ptr<SpillStore> spill)
    : options_(options),
      owned_clock_(options.clock == nullptr ? std::make_unique<RealClock>() : nullptr),
      clock_(options.clock != nullptr ? options.clock : owned_clock_.get()),
      spill_(std::move(spill)),
      pool_({.capacity_bytes = options.host_capacity_bytes,
             .high_watermark = options.host_high_watermark,
             .low_watermark = options.host_low_watermark}) {}

BlockStore::~BlockStore() {
  stop_loading_ = true;
  {
    absl::MutexLock l(&mu_);
    stop_writing_behind_ = true;
  }
  if (write_behind_.joinable()) write_behind_.join();
  if (loader_.joinable()) loader_.join();
}

void BlockStore::WriteBehindLoop() {
  constexpr uint64_t kBatchBytes = uint64_t{64} << 20;
  constexpr absl::Duration kIdleWait = absl::Milliseconds(50);
  absl::MutexLock l(&mu_);
  while (!stop_writing_behind_) {
    IoPlan plan;
    if (index_.host_only_bytes() > options_.write_behind_above_bytes && clock_->Now() >= disk_full_until_)
      PlanWriteBehindLocked(std::min(kBatchBytes, index_.host_only_bytes() - options_.write_behind_above_bytes),
                            &plan);
    if (plan.empty()) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_writing_behind_), kIdleWait);
      continue;
    }
    (void)RunPlanLocked(&plan);  // a failure is counted (disk_errors); the blocks stay host-only, tried again later
  }
}

void BlockStore::PlanWriteBehindLocked(uint64_t bytes, IoPlan* plan) {
  const uint64_t cap = options_.disk_capacity_bytes;
  uint64_t planned = 0;
  index_.ForEachHostLru([&](BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (planned >= bytes) return false;
    if (r->on_disk || r->io_busy || !r->visible) return true;
    const uint64_t committed = index_.disk_bytes() + disk_reserved_bytes_ - disk_dropping_bytes_;
    if (committed + r->size_bytes > cap) return false;  // only into free room: no disk block dropped for it
    disk_reserved_bytes_ += r->size_bytes;
    r->io_busy = true;
    planned += r->size_bytes;
    plan->writes.push_back({r, MetaOf(*r), r->host, /*evict_after=*/false});
    plan->written_behind = true;
    return true;
  });
}

absl::Status BlockStore::LoadFromDisk() {
  if (spill_ == nullptr) return absl::OkStatus();
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock l(&mu_);
    // An estimate: a few percent over or under costs one rehash at most.
    index_.Reserve(spill_->EstimatedBlocks());
  }
  // Indexed in batches, each under the lock: calls interleave with the scan
  // (a batch holds the lock ~1 ms).
  constexpr size_t kBatch = 1024;
  std::vector<std::pair<BlockKey, DiskBlockMeta>> batch;
  batch.reserve(kBatch);
  uint64_t scanned = 0;
  auto flush = [&] {
    if (options_.before_index_batch_for_test) options_.before_index_batch_for_test(scanned);
    scanned += batch.size();
    absl::MutexLock l(&mu_);
    for (auto& [key, meta] : batch) InsertLoadedLocked(std::move(key), std::move(meta), now);
    batch.clear();
  };
  std::vector<std::string> corrupt;
  absl::Status s = spill_->ScanBlocks(
      [&](BlockKey key, DiskBlockMeta meta) {
        batch.emplace_back(std::move(key), std::move(meta));
        if (batch.size() == kBatch) flush();
        return !stop_loading_.load(std::memory_order_relaxed);
      },
      &corrupt);
  flush();
  if (s.ok() && !corrupt.empty()) {
    {
      absl::MutexLock l(&mu_);
      counters_.checksum_failures += corrupt.size();
    }
    s = spill_->DeleteEncodedKeys(corrupt);
  }
  absl::MutexLock l(&mu_);
  loading_ = false;
  removed_while_loading_.clear();
  load_status_ = s;
  return s;
}

void BlockStore::InsertLoadedLocked(BlockKey key, DiskBlockMeta meta, absl::Time now) {
  if (index_.Find(key) != nullptr || removed_while_loading_.contains(key)) return;
  BlockRecord r;
  // A format 1 record's checksum is of the payload alone.
  r.checksum = meta.version == 1 ? meta.checksum ^ KeyTag(key) : meta.checksum;
  r.key = std::move(key);
  r.parent_hash = std::move(meta.parent_hash);
  r.accounting = meta.accounting;
  r.size_bytes = meta.size_bytes;
  r.on_disk = true;
  r.disk_segment = meta.at.segment;
  r.disk_offset = meta.at.offset;
  r.disk_sealed = meta.sealed;
  r.visible = true;
  r.last_access = now;
  index_.Insert(std::move(r));
}

BlockRecord* BlockStore::FindLocked(const BlockKey& key) {
  BlockRecord* r = index_.Find(key);
  if (r != nullptr || !loading_ || removed_while_loading_.contains(key)) return r;
  absl::StatusOr<DiskBlockMeta> meta = spill_->ReadMeta(key);
  if (!meta.ok()) return nullptr;  // absent; or damaged, which the scan deletes
  InsertLoadedLocked(key, *std::move(meta), clock_->Now());
  return index_.Find(key);
}

void BlockStore::AwaitIndexLoadedLocked() {
  mu_.Await(absl::Condition(+[](bool* loading) { return !*loading; }, &loading_));
}

absl::Status BlockStore::AwaitIndexLoaded() {
  absl::MutexLock l(&mu_);
  AwaitIndexLoadedLocked();
  return load_status_;
}

// --------------------------------------------------------------- budgets

void BlockStore::DetachHostLocked(BlockRecord* r) {
  if (r->host == nullptr) return;
  pool_.Release(r->size_bytes);
  index_.SetHostCopy(r, nullptr);
}

void BlockStore::EraseLocked(BlockRecord* r) {
  DetachHostLocked(r);
  if (loading_) removed_while_loading_.insert(r->key);
  index_.Erase(r);
}

void BlockStore::ReleaseHandle(const std::string& tenant, uint64_t size_bytes) {
  absl::MutexLock l(&mu_);
  pool_.Release(size_bytes);
  UnreserveLocked(tenant, size_bytes);
  counters_.puts_aborted++;
}

void BlockStore::UnreserveLocked(const std::string& tenant, uint64_t bytes) {
  reserved_bytes_ -= bytes;
  auto it = tenant_reserved_bytes_.find(tenant);
  if (it == tenant_reserved_bytes_.end()) return;
  it->second -= bytes;
  if (it->second == 0) tenant_reserved_bytes_.erase(it);
}

uint64_t BlockStore::TenantHostBytesLocked(const std::string& tenant) {
  auto it = tenant_reserved_bytes_.find(tenant);
  return index_.tenant_host_bytes(tenant) + (it == tenant_reserved_bytes_.end() ? 0 : it->second);
}

bool BlockStore::TenantFitsLocked(const std::string& tenant, uint64_t bytes) {
  const uint64_t quota = options_.tenant_host_quota_bytes;
  return quota == 0 || TenantHostBytesLocked(tenant) + bytes <= quota;
}

absl::Status BlockStore::ReserveForTenantLocked(const std::string& tenant, uint64_t bytes) {
  const uint64_t quota = options_.tenant_host_quota_bytes;
  if (quota == 0) {
    TQ_RETURN_IF_ERROR(ReserveHostLocked(bytes));
    reserved_bytes_ += bytes;
    return absl::OkStatus();
  }
  if (bytes > quota) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block of ", bytes, " bytes exceeds tenant '", tenant, "''s host quota of ", quota,
        " bytes"));
  }
  for (int round = 0; round < kMaxAdmissionRounds; ++round) {
    if (!TenantFitsLocked(tenant, bytes)) {
      // Make room among the tenant's own blocks, oldest first.
      IoPlan plan;
      const uint64_t before = TenantHostBytesLocked(tenant);
      PlanHostEvictionLocked(before + bytes - quota, std::nullopt, &plan, nullptr,
                             /*include_pinned=*/false, /*at_most=*/false, &tenant);
      // Drops and detaches happen in planning: no plan can still have made room.
      if (plan.empty() && TenantHostBytesLocked(tenant) == before) break;
      absl::Status spilled = RunPlanLocked(&plan);
      if (!spilled.ok() && !absl::IsResourceExhausted(spilled)) return spilled;
      continue;
    }
    TQ_RETURN_IF_ERROR(ReserveHostLocked(bytes));  // may release mu_ while it spills
    if (!TenantFitsLocked(tenant, bytes)) {  // the tenant's other puts came first
      pool_.Release(bytes);
      continue;
    }
    reserved_bytes_ += bytes;
    tenant_reserved_bytes_[tenant] += bytes;
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant '", tenant, "' holds ", TenantHostBytesLocked(tenant), " of its host quota of ", quota,
      " bytes in blocks that cannot be evicted (pinned, leased or in flight); cannot admit ",
      bytes));
}

BlockRecord* BlockStore::FindIdleLocked(const BlockKey& key) {
  BlockRecord* r = FindLocked(key);
  while (r != nullptr && r->io_busy) {
    io_done_.Wait(&mu_);
    r = FindLocked(key);
  }
  return r;
}

bool BlockStore::ReserveDiskLocked(uint64_t bytes, IoPlan* plan) {
  if (spill_ == nullptr || bytes > options_.disk_capacity_bytes) return false;
  const uint64_t cap = options_.disk_capacity_bytes;
  uint64_t committed =
      index_.disk_bytes() + disk_reserved_bytes_ - disk_dropping_bytes_;
  if (committed + bytes > cap) {
    // Make room by dropping the oldest idle, unprotected disk-only blocks,
    // but only if enough of them exist.
    absl::Time now = clock_->Now();
    std::vector<BlockRecord*> victims;
    uint64_t freed = 0;
    index_.ForEachDiskOnlyLru([&](BlockRecord* r) {
      if (committed - freed + bytes <= cap) return false;
      if (!r->io_busy && r->visible && !r->Protected(now)) {
        victims.push_back(r);
        freed += r->size_bytes;
      }
      return true;
    });
    if (committed - freed + bytes > cap) return false;
    for (BlockRecord* r : victims) {
      r->visible = false;
      r->io_busy = true;
      disk_dropping_bytes_ += r->size_bytes;
      plan->drops.push_back({r, /*count_as_drop=*/true});
    }
  }
  disk_reserved_bytes_ += bytes;
  return true;
}

uint64_t BlockStore::EvictableHostBytesLocked(uint64_t enough) {
  const absl::Time now = clock_->Now();
  uint64_t found = 0;
  index_.ForEachHostLru([&](BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!r->io_busy && r->visible && !r->Protected(now)) found += r->size_bytes;
    return found < enough;
  });
  return found;
}

void BlockStore::PlanHostEvictionLocked(uint64_t bytes, const std::optional<ModelScope>& scope,
                                        IoPlan* plan, EvictResult* result, bool include_pinned, bool at_most,
                                        const std::string* tenant) {
  absl::Time now = clock_->Now();
  uint64_t planned = 0;
  index_.ForEachHostLru([&](BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (planned >= bytes) return false;
    if (!InScope(*r, scope) || (tenant != nullptr && r->key.tenant != *tenant)) return true;
    if (r->io_busy || !r->visible) {
      if (result != nullptr) result->skipped_busy++;
      return true;
    }
    if (!include_pinned && r->Protected(now)) {
      if (result != nullptr) result->skipped_pinned++;
      return true;
    }
    const uint64_t size = r->size_bytes;
    if (at_most && planned + size > bytes) return false;
    planned += size;
    if (r->on_disk) {  // already has a disk copy: just let go of host memory
      DetachHostLocked(r);
    } else if (now >= disk_full_until_ && ReserveDiskLocked(size, plan)) {
      r->io_busy = true;
      host_spilling_bytes_ += size;
      plan->writes.push_back({r, MetaOf(*r), r->host, /*evict_after=*/true});
      return true;  // counted when the write finishes
    } else {  // no room on disk: the block is dropped
      EraseLocked(r);
      counters_.drops++;
    }
    counters_.evictions++;
    counters_.evicted_bytes += size;
    if (result != nullptr) {
      result->blocks++;
      result->bytes += size;
    }
    return true;
  });
}

absl::Status BlockStore::RunPlanLocked(IoPlan* plan) {
  if (plan->empty()) return absl::OkStatus();
  std::vector<SpillStore::BlockWrite> writes;
  writes.reserve(plan->writes.size());
  for (const IoPlan::Write& w : plan->writes) {
    writes.push_back({&w.record->key, &w.meta, w.payload->view()});
  }
  std::vector<BlockKey> deletes;
  deletes.reserve(plan->drops.size());
  for (const IoPlan::Drop& d : plan->drops) deletes.push_back(d.record->key);

  mu_.Unlock();
  std::vector<SegmentLocation> placed;
  absl::Status s = spill_->Apply(writes, deletes, plan->sync || options_.sync_spills, &placed);
  mu_.Lock();

  absl::Time now = clock_->Now();
  if (!s.ok()) counters_.disk_errors++;
  if (s.ok()) {
    disk_full_until_ = absl::InfinitePast();
  } else if (absl::IsResourceExhausted(s) && !plan->writes.empty()) {
    disk_full_until_ = now + kDiskFullRetryInterval;
  }
  for (size_t j = 0; j < plan->writes.size(); ++j) {
    const IoPlan::Write& w = plan->writes[j];
    BlockRecord* r = w.record;
    const uint64_t size = r->size_bytes;
    r->io_busy = false;
    disk_reserved_bytes_ -= size;
    if (w.evict_after) host_spilling_bytes_ -= size;
    if (!s.ok()) continue;
    index_.SetOnDisk(r, true);
    r->disk_segment = placed[j].segment;
    r->disk_offset = placed[j].offset;
    r->disk_sealed = options_.at_rest_cipher != nullptr;
    if (plan->written_behind) {
      counters_.written_behind++;
      counters_.written_behind_bytes += size;
    }
    if (!w.evict_after) continue;
    counters_.spills++;
    counters_.spilled_bytes += size;
    if (r->host != nullptr && !r->Protected(now)) {  // pinned meanwhile: keep it
      DetachHostLocked(r);
      counters_.evictions++;
      counters_.evicted_bytes += size;
      plan->evicted_blocks++;
      plan->evicted_bytes += size;
    }
  }
  for (const IoPlan::Drop& d : plan->drops) {
    disk_dropping_bytes_ -= d.record->size_bytes;
    if (s.ok() && d.count_as_drop) counters_.drops++;
    // Erased even if the delete failed: the index must not serve a block it
    // meant to remove. A surviving RocksDB entry is re-indexed (with correct,
    // checksummed bytes) at the next Open.
    EraseLocked(d.record);
  }
  io_done_.SignalAll();
  return s;
}

absl::Status BlockStore::ReserveHostLocked(uint64_t bytes) {
  if (bytes > pool_.capacity_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block of ", bytes, " bytes exceeds the host capacity of ", pool_.capacity_bytes()));
  }
  for (int round = 0; round < kMaxAdmissionRounds; ++round) {
    uint64_t to_free = pool_.BytesToFreeFor(bytes);
    if (to_free == 0 && pool_.TryReserve(bytes)) return absl::OkStatus();
    // A block that cannot fit even once every evictable block is gone is
    // refused before anything is evicted for it.
    if (pool_.used_bytes() + bytes > pool_.capacity_bytes() && host_spilling_bytes_ == 0 &&
        EvictableHostBytesLocked(pool_.used_bytes() + bytes - pool_.capacity_bytes()) <
            pool_.used_bytes() + bytes - pool_.capacity_bytes())
      break;
    IoPlan plan;
    PlanHostEvictionLocked(to_free, std::nullopt, &plan, nullptr);
    if (plan.empty()) {
      if (pool_.TryReserve(bytes)) return absl::OkStatus();
      if (host_spilling_bytes_ == 0) break;
      io_done_.Wait(&mu_);  // other threads' spills will free memory
      continue;
    }
    absl::Status spilled = RunPlanLocked(&plan);
    // A full disk: the next round drops the victims instead (as when the
    // disk budget is full), so puts to host memory go on.
    if (!spilled.ok() && !absl::IsResourceExhausted(spilled)) return spilled;
  }
  if (pool_.TryReserve(bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "host tier full: ", pool_.used_bytes(), " of ", pool_.capacity_bytes(),
      " bytes in use and not evictable (pinned, leased or in flight); cannot admit ", bytes));
}

// ------------------------------------------------------------------ puts

absl::StatusOr<PutHandle> BlockStore::BeginPut(const BlockKey& key,
                                               absl::string_view parent_hash,
                                               const BlockAccounting& accounting,
                                               uint64_t size_bytes, PutOptions options) {
  TQ_RETURN_IF_ERROR(ValidateBlockKey(key));
  if (!parent_hash.empty()) TQ_RETURN_IF_ERROR(ValidateBlockHash(parent_hash));
  if (accounting.total_bytes != size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("accounting.total_bytes (",
                                                   accounting.total_bytes,
                                                   ") differs from the payload size (",
                                                   size_bytes, ")"));
  }
  if (options.durable && spill_ == nullptr) {
    return absl::FailedPreconditionError("durable put requested but no disk tier is configured");
  }
  {
    absl::MutexLock l(&mu_);
    absl::Status s = ReserveForTenantLocked(key.tenant, size_bytes);
    if (!s.ok()) {
      if (absl::IsResourceExhausted(s)) counters_.puts_rejected++;
      return s;
    }
  }
  absl::StatusOr<std::unique_ptr<HostBuffer>> buffer = HostBuffer::Allocate(size_bytes, options_.host_arena);
  PutHandle handle;
  handle.store_ = this;  // from here on, the handle owns the reservation
  handle.key_ = key;
  handle.parent_hash_ = std::string(parent_hash);
  handle.accounting_ = accounting;
  handle.options_ = options;
  if (!buffer.ok()) return buffer.status();  // ~PutHandle releases the reservation
  handle.buffer_ = *std::move(buffer);
  return handle;
}

void BlockStore::Abort(PutHandle handle) { handle.Release(); }

absl::StatusOr<CommitOutcome> BlockStore::Commit(PutHandle handle) {
  std::vector<PutHandle> one;
  one.push_back(std::move(handle));
  TQ_ASSIGN_OR_RETURN(std::vector<CommitOutcome> out, CommitAll(std::move(one)));
  return out[0];
}

absl::StatusOr<std::vector<CommitOutcome>> BlockStore::CommitAll(std::vector<PutHandle> handles,
                                                                  size_t* conflict) {
  // What this call owns: each handle's reservation, bytes and checksum.
  struct Item {
    BlockKey key;
    std::string parent_hash;
    BlockAccounting accounting;
    PutOptions options;
    std::shared_ptr<const HostBuffer> payload;
    uint64_t checksum = 0;
    BlockRecord* existing = nullptr;  // an identical visible block
    BlockRecord* placeholder = nullptr;  // the new record, invisible until the end
  };
  std::vector<Item> items;
  items.reserve(handles.size());
  uint64_t bytes = 0;
  absl::Status invalid;
  for (PutHandle& h : handles) {
    if (h.store_ != this) {
      invalid = absl::InvalidArgumentError("Commit of an invalid handle or one from another store");
      continue;
    }
    h.store_ = nullptr;  // this function now owns the reservation
    Item& it = items.emplace_back();
    it.key = std::move(h.key_);
    it.parent_hash = std::move(h.parent_hash_);
    it.accounting = h.accounting_;
    it.options = h.options_;
    it.payload = std::shared_ptr<const HostBuffer>(std::move(h.buffer_));
    bytes += it.payload->size();
  }
  // The checksums: a large commit's on several threads.
  ParallelFor(items.size(), bytes, [&](size_t i) { items[i].checksum = BlockChecksum(items[i].key, items[i].payload->view()); });
  absl::flat_hash_set<BlockKey> keys;
  for (const Item& it : items)
    if (!keys.insert(it.key).second && invalid.ok())
      invalid = absl::InvalidArgumentError(absl::StrCat("block ", DebugString(it.key), " is committed twice in one call"));

  absl::MutexLock l(&mu_);
  auto release_all = [&] {
    for (const Item& it : items) {
      UnreserveLocked(it.key.tenant, it.accounting.total_bytes);
      pool_.Release(it.accounting.total_bytes);
    }
  };
  if (!invalid.ok()) {
    release_all();
    return invalid;
  }
  // Every key idle at once (a wait releases mu_, so look again after it).
  for (bool waited = true; waited;) {
    waited = false;
    for (Item& it : items) {
      BlockRecord* r = FindLocked(it.key);
      if (r != nullptr && r->io_busy) {
        io_done_.Wait(&mu_);
        waited = true;
        break;
      }
      it.existing = r;
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    const BlockRecord* e = it.existing;
    if (e != nullptr && (e->size_bytes != it.accounting.total_bytes || e->checksum != it.checksum)) {
      release_all();
      if (conflict != nullptr) *conflict = i;
      return absl::AlreadyExistsError(absl::StrCat("block ", DebugString(it.key),
                                                   " already holds different bytes (", e->size_bytes,
                                                   " bytes, checksum ", e->checksum, ")"));
    }
  }

  // New blocks enter the index invisible and busy (readers do not see them,
  // other commits of their keys wait); durable ones, and identical blocks
  // that must become durable, are written in one RocksDB batch.
  IoPlan plan;
  plan.sync = true;
  uint64_t durable_bytes = 0;
  bool sync_wal = false;
  for (Item& it : items) {
    const uint64_t size = it.accounting.total_bytes;
    if (it.existing != nullptr) {
      if (it.options.durable && !it.existing->on_disk) durable_bytes += size;
      sync_wal = sync_wal || (it.options.durable && it.existing->on_disk);
    } else if (it.options.durable) {
      durable_bytes += size;
    }
  }
  if (durable_bytes > 0 && !ReserveDiskLocked(durable_bytes, &plan)) {  // plans nothing when it fails
    release_all();
    return absl::ResourceExhaustedError(
        absl::StrCat("disk tier full: cannot write ", durable_bytes, " bytes durably"));
  }
  const absl::Time now = clock_->Now();
  for (Item& it : items) {
    const uint64_t size = it.accounting.total_bytes;
    UnreserveLocked(it.key.tenant, size);  // the reservation becomes the host copy, or is released
    if (it.existing != nullptr) {
      pool_.Release(size);
      index_.Touch(it.existing, now);
      if (it.options.durable && !it.existing->on_disk) {
        it.existing->io_busy = true;
        plan.writes.push_back({it.existing, MetaOf(*it.existing), it.payload, /*evict_after=*/false});
      }
      continue;
    }
    BlockRecord rec;
    rec.key = it.key;
    rec.parent_hash = std::move(it.parent_hash);
    rec.accounting = it.accounting;
    rec.size_bytes = size;
    rec.checksum = it.checksum;
    rec.last_access = now;
    rec.io_busy = true;
    it.placeholder = index_.Insert(std::move(rec));
    if (it.options.durable)
      plan.writes.push_back({it.placeholder, MetaOf(*it.placeholder), it.payload, /*evict_after=*/false});
  }
  // One batch: on an error nothing of it is on disk. Its synced write also
  // syncs the WAL before it, so an identical block's copy from an unsynced
  // spill needs a WAL sync of its own only when nothing was written.
  const bool wrote = !plan.writes.empty();
  absl::Status s = RunPlanLocked(&plan);  // clears io_busy of what it wrote
  if (s.ok() && sync_wal && !wrote) {
    mu_.Unlock();
    s = spill_->SyncWal();
    mu_.Lock();
  }
  if (!s.ok()) {
    for (Item& it : items) {
      if (it.placeholder == nullptr) continue;
      pool_.Release(it.accounting.total_bytes);
      EraseLocked(it.placeholder);
    }
    io_done_.SignalAll();
    return s;
  }
  // Everything becomes visible together, under one hold of mu_.
  std::vector<CommitOutcome> out;
  out.reserve(items.size());
  for (Item& it : items) {
    if (it.existing != nullptr) {
      counters_.puts_already_present++;
      out.push_back(CommitOutcome::kAlreadyPresent);
      continue;
    }
    BlockRecord* r = it.placeholder;
    r->io_busy = false;
    index_.SetHostCopy(r, std::move(it.payload));  // the pool already counts these bytes
    r->visible = true;
    counters_.puts_committed++;
    out.push_back(CommitOutcome::kCommitted);
  }
  io_done_.SignalAll();
  return out;
}

absl::StatusOr<CommitOutcome> BlockStore::Put(const BlockKey& key, absl::string_view parent_hash,
                                              const BlockAccounting& accounting,
                                              absl::string_view payload, PutOptions options) {
  TQ_ASSIGN_OR_RETURN(PutHandle handle,
                      BeginPut(key, parent_hash, accounting, payload.size(), options));
  if (!payload.empty()) std::memcpy(handle.buffer().data(), payload.data(), payload.size());
  return Commit(std::move(handle));
}

// ----------------------------------------------------------------- reads

absl::StatusOr<LookupResult> BlockStore::Lookup(absl::string_view tenant, uint64_t model_id,
                                                absl::Span<const std::string> chain) {
  TQ_RETURN_IF_ERROR(ValidateTenant(tenant));
  for (const std::string& h : chain) TQ_RETURN_IF_ERROR(ValidateBlockHash(h));
  LookupResult result;
  result.tiers.reserve(chain.size());
  BlockKey key{std::string(tenant), model_id, ""};
  BlockKey ahead = key;  // kLookupAhead hashes ahead: its table memory prefetched
  absl::MutexLock l(&mu_);
  absl::Time now = clock_->Now();
  counters_.lookups++;
  for (size_t i = 0; i < std::min(kLookupAhead, chain.size()); ++i) {
    ahead.block_hash = chain[i];
    index_.Prefetch(ahead);
  }
  for (size_t i = 0; i < chain.size(); ++i) {
    if (i + kLookupAhead < chain.size()) {
      ahead.block_hash = chain[i + kLookupAhead];
      index_.Prefetch(ahead);
    }
    key.block_hash = chain[i];
    BlockRecord* r = FindLocked(key);
    if (r == nullptr || !r->visible) break;
    Tier tier = r->best_tier();
    result.tiers.push_back(tier);
    counters_.lookup_hit_blocks[static_cast<int>(tier)]++;
    if (options_.lookup_refreshes_lru) index_.Touch(r, now);
  }
  result.hits = result.tiers.size();
  counters_.lookup_miss_blocks += chain.size() - result.hits;
  return result;
}

absl::StatusOr<BlockData> BlockStore::Get(const BlockKey& key) {
  TQ_RETURN_IF_ERROR(ValidateBlockKey(key));
  for (int attempt = 0; attempt < kMaxGetAttempts; ++attempt) {
    BlockData data;
    uint64_t generation = 0;
    SegmentLocation hint;
    bool sealed = false;
    {
      absl::MutexLock l(&mu_);
      BlockRecord* r = FindLocked(key);
      if (r == nullptr || !r->visible) {
        counters_.get_misses++;
        return absl::NotFoundError(absl::StrCat("no block ", DebugString(key)));
      }
      index_.Touch(r, clock_->Now());
      data.parent_hash = r->parent_hash;
      data.accounting = r->accounting;
      data.checksum = r->checksum;
      if (r->host != nullptr) {
        data.payload = r->host;
        data.tier = Tier::kHost;
        counters_.get_hits[static_cast<int>(Tier::kHost)]++;
        return data;
      }
      generation = r->generation;
      hint = {r->disk_segment, r->disk_offset, StoredPayloadBytes(r->size_bytes, r->disk_sealed)};
      sealed = r->disk_sealed;
    }

    // Disk-only: read and verify outside the lock.
    absl::StatusOr<std::unique_ptr<HostBuffer>> read = spill_->ReadPayload(key, hint, sealed);
    if (!read.ok() && !absl::IsNotFound(read.status()) && !absl::IsDataLoss(read.status())) {
      return read.status();  // an I/O error says nothing about the block
    }
    bool good = read.ok() && (*read)->size() == data.accounting.total_bytes &&
                BlockChecksum(key, (*read)->view()) == data.checksum;

    absl::MutexLock l(&mu_);
    BlockRecord* r = index_.Find(key);
    bool same = r != nullptr && r->generation == generation;
    if (good) {
      std::shared_ptr<const HostBuffer> payload(*std::move(read));
      counters_.get_hits[static_cast<int>(Tier::kDisk)]++;
      if (same && r->visible && r->host == nullptr && pool_.FitsBelowHigh(r->size_bytes) &&
          TenantFitsLocked(key.tenant, r->size_bytes) && pool_.TryReserve(r->size_bytes)) {
        index_.SetHostCopy(r, payload);
        counters_.promotions++;
        counters_.promoted_bytes += r->size_bytes;
      }
      data.payload = std::move(payload);
      data.tier = Tier::kDisk;
      return data;
    }
    if (!same) continue;  // deleted or replaced while we read: look again
    if (!r->visible) {
      counters_.get_misses++;
      return absl::NotFoundError(absl::StrCat("no block ", DebugString(key)));
    }
    counters_.checksum_failures++;
    if (!r->io_busy) {
      r->visible = false;
      r->io_busy = true;
      IoPlan plan;
      plan.drops.push_back({r, /*count_as_drop=*/false});
      disk_dropping_bytes_ += r->size_bytes;  // disk-only, so on_disk
      // The block is gone from the index whatever the delete returns (a
      // failed delete is counted in disk_errors; the record fails its
      // checksum again if a restart re-indexes it).
      RunPlanLocked(&plan).IgnoreError();
    }
    return absl::DataLossError(absl::StrCat(
        "block ", DebugString(key),
        read.ok()                         ? " failed its checksum on disk"
        : absl::IsNotFound(read.status()) ? " is missing its payload on disk"
                                          : absl::StrCat(" is damaged on disk (",
                                                         read.status().message(), ")"),
        "; it has been dropped"));
  }
  return absl::AbortedError(absl::StrCat("block ", DebugString(key),
                                         " kept changing while being read; retry"));
}

// ------------------------------------------------------- pins and removal

absl::Status BlockStore::Pin(const BlockKey& key, absl::Duration ttl) {
  return PinAll(std::span<const BlockKey>(&key, 1), ttl);
}

absl::Status BlockStore::PinAll(std::span<const BlockKey> keys, absl::Duration ttl, size_t* missing) {
  if (ttl <= absl::ZeroDuration() || ttl > options_.max_pin_ttl) {
    return absl::InvalidArgumentError(absl::StrCat("pin ttl must be in (0, ",
                                                   absl::FormatDuration(options_.max_pin_ttl),
                                                   "]"));
  }
  absl::MutexLock l(&mu_);
  std::vector<BlockRecord*> records(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    records[i] = FindLocked(keys[i]);
    if (records[i] == nullptr || !records[i]->visible) {
      if (missing != nullptr) *missing = i;
      return absl::NotFoundError(absl::StrCat("no block ", DebugString(keys[i])));
    }
  }
  const absl::Time now = clock_->Now();
  for (BlockRecord* r : records) {
    if (!r->Protected(now)) {  // expired leases void earlier pins
      r->pin_count = 0;
      r->lease_deadline = now + ttl;
    } else {
      r->lease_deadline = std::max(r->lease_deadline, now + ttl);
    }
    r->pin_count++;
  }
  return absl::OkStatus();
}

absl::Status BlockStore::Unpin(const BlockKey& key) {
  absl::MutexLock l(&mu_);
  BlockRecord* r = FindLocked(key);
  if (r == nullptr || !r->visible) {
    return absl::NotFoundError(absl::StrCat("no block ", DebugString(key)));
  }
  if (!r->Protected(clock_->Now())) {
    r->pin_count = 0;
    return absl::FailedPreconditionError(
        absl::StrCat("block ", DebugString(key), " is not pinned (or its lease expired)"));
  }
  if (--r->pin_count == 0) r->lease_deadline = absl::InfinitePast();
  return absl::OkStatus();
}

absl::Status BlockStore::RemoveLocked(BlockRecord* r) {
  DetachHostLocked(r);
  if (!r->on_disk) {
    EraseLocked(r);
    return absl::OkStatus();
  }
  r->visible = false;
  r->io_busy = true;
  disk_dropping_bytes_ += r->size_bytes;
  IoPlan plan;
  plan.drops.push_back({r, /*count_as_drop=*/false});
  return RunPlanLocked(&plan);
}

absl::Status BlockStore::Delete(const BlockKey& key) {
  TQ_RETURN_IF_ERROR(ValidateBlockKey(key));
  absl::MutexLock l(&mu_);
  BlockRecord* r = FindIdleLocked(key);
  if (r == nullptr || !r->visible) {
    return absl::NotFoundError(absl::StrCat("no block ", DebugString(key)));
  }
  TQ_RETURN_IF_ERROR(RemoveLocked(r));
  counters_.deletes++;
  return absl::OkStatus();
}

absl::StatusOr<EvictResult> BlockStore::SpillForShutdown(absl::Duration budget) {
  EvictSpec all;
  all.include_pinned = true;
  all.deadline = clock_->Now() + budget - std::min(budget / 10, absl::Seconds(3));
  all.flush_by_deadline = true;
  TQ_ASSIGN_OR_RETURN(EvictResult r, Evict(all));
  TQ_RETURN_IF_ERROR(Sync());
  return r;
}

absl::StatusOr<EvictResult> BlockStore::Evict(const EvictSpec& spec) {
  if (spec.scope.has_value()) TQ_RETURN_IF_ERROR(ValidateTenant(spec.scope->tenant));
  const uint64_t limit =
      spec.max_bytes == 0 ? std::numeric_limits<uint64_t>::max() : spec.max_bytes;
  EvictResult result;
  absl::MutexLock l(&mu_);
  IoPlan plan;
  if (!spec.drop) {
    // Batches of about batch_bytes, oldest first, each planned, written and
    // settled before the next; the last walk's skip counts stand.
    const uint64_t batch = std::max<uint64_t>(1, spec.batch_bytes);
    uint64_t budget = limit;
    absl::Duration pace = absl::ZeroDuration();  // the last batch's time: the next one's likely time
    absl::Duration spilling = absl::ZeroDuration();  // the batches' time so far
    uint64_t spilled = 0;                            // and their bytes
    // The memtables' flush at the rate of the batches so far (each byte
    // went to the WAL and the memtable; a flush writes it once).
    auto flush_time = [&] {
      if (!spec.flush_by_deadline || spill_ == nullptr || spilled == 0) return absl::ZeroDuration();
      return spilling * (static_cast<double>(spill_->UnflushedBytes()) / static_cast<double>(spilled));
    };
    for (;;) {
      if (clock_->Now() + pace + flush_time() >= spec.deadline) {
        const absl::Time now = clock_->Now();
        index_.ForEachHostLru([&](BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (InScope(*r, spec.scope) && !r->on_disk && !r->io_busy && r->visible &&
              (spec.include_pinned || !r->Protected(now))) {
            result.left_blocks++;
            result.left_bytes += r->size_bytes;
          }
          return true;
        });
        return result;
      }
      IoPlan batch_plan;
      EvictResult walk;
      const uint64_t before = result.bytes;
      // Within the caller's bound (whole blocks), about one batch: at least
      // one block when the bound allows it.
      if (budget <= batch) {
        PlanHostEvictionLocked(budget, spec.scope, &batch_plan, &walk, spec.include_pinned, /*at_most=*/true);
      } else {
        PlanHostEvictionLocked(batch, spec.scope, &batch_plan, &walk, spec.include_pinned, /*at_most=*/true);
        if (walk.blocks == 0 && batch_plan.empty()) {  // a block larger than a batch
          walk = EvictResult();
          PlanHostEvictionLocked(1, spec.scope, &batch_plan, &walk, spec.include_pinned);
        }
      }
      result.skipped_pinned = walk.skipped_pinned;
      result.skipped_busy = walk.skipped_busy;
      result.blocks += walk.blocks;  // blocks let go at once (already on disk, or dropped)
      result.bytes += walk.bytes;
      if (batch_plan.empty() && walk.blocks == 0) return result;  // nothing left to move
      const absl::Time started = clock_->Now();
      absl::Status s = RunPlanLocked(&batch_plan);
      pace = clock_->Now() - started;
      spilling += pace;
      spilled += batch_plan.evicted_bytes;
      result.blocks += batch_plan.evicted_blocks;
      result.bytes += batch_plan.evicted_bytes;
      if (!s.ok()) return s;
      if (spec.max_bytes != 0) {
        budget -= std::min(budget, result.bytes - before);
        if (budget == 0) return result;
      }
    }
  }
  // A drop walks the whole index: every block on disk must be in it.
  AwaitIndexLoadedLocked();
  absl::Time now = clock_->Now();
  std::vector<BlockRecord*> victims;
  index_.ForEach([&](BlockRecord* r) {
    if (!InScope(*r, spec.scope)) return;
    if (r->io_busy || !r->visible) {
      result.skipped_busy++;
    } else if (!spec.include_pinned && r->Protected(now)) {
      result.skipped_pinned++;
    } else {
      victims.push_back(r);
    }
  });
  for (BlockRecord* r : victims) {
    if (result.bytes + r->size_bytes > limit) break;
    result.blocks++;
    result.bytes += r->size_bytes;
    DetachHostLocked(r);
    if (r->on_disk) {
      r->visible = false;
      r->io_busy = true;
      disk_dropping_bytes_ += r->size_bytes;
      plan.drops.push_back({r, /*count_as_drop=*/true});
    } else {
      EraseLocked(r);
      counters_.drops++;
    }
  }
  TQ_RETURN_IF_ERROR(RunPlanLocked(&plan));
  return result;
}

// ----------------------------------------------------------------- stats

ModelResidency BlockStore::ResidencyOf(absl::string_view tenant, uint64_t model_id) {
  absl::MutexLock l(&mu_);
  return index_.ResidencyOf(std::string(tenant), model_id);
}

StoreStats BlockStore::Stats() {
  StoreStats s;
  if (options_.host_arena != nullptr) s.host_arena = options_.host_arena->stats();
  if (spill_ != nullptr) {
    const SpillStore::PayloadSpace space = spill_->PayloadFileSpace();
    s.disk_file_bytes = space.file_bytes;
    s.disk_garbage_bytes = space.garbage_bytes;
  }
  absl::MutexLock l(&mu_);
  s.usage = index_.Usage();
  s.residency = index_.Residency();
  s.counters = counters_;
  s.blocks = index_.size();
  s.host_capacity_bytes = pool_.capacity_bytes();
  s.host_high_watermark_bytes = pool_.high_bytes();
  s.host_low_watermark_bytes = pool_.low_bytes();
  s.host_used_bytes = pool_.used_bytes();
  s.host_reserved_bytes = reserved_bytes_;
  s.disk_enabled = spill_ != nullptr;
  s.index_loading = loading_;
  s.disk_capacity_bytes = spill_ != nullptr ? options_.disk_capacity_bytes : 0;
  s.disk_used_bytes = index_.disk_bytes();
  return s;
}

// --------------------------------------------------------- model records

absl::Status BlockStore::PutModelRecord(absl::string_view tenant, uint64_t model_id,
                                        absl::string_view record) {
  TQ_RETURN_IF_ERROR(ValidateTenant(tenant));
  if (spill_ != nullptr) return spill_->PutModelRecord(tenant, model_id, record);
  absl::MutexLock l(&mu_);
  memory_models_[{std::string(tenant), model_id}] = std::string(record);
  return absl::OkStatus();
}

absl::StatusOr<std::string> BlockStore::GetModelRecord(absl::string_view tenant,
                                                       uint64_t model_id) {
  if (spill_ != nullptr) return spill_->GetModelRecord(tenant, model_id);
  absl::MutexLock l(&mu_);
  auto it = memory_models_.find({std::string(tenant), model_id});
  if (it == memory_models_.end()) return absl::NotFoundError("no such model record");
  return it->second;
}

absl::Status BlockStore::Sync() { return spill_ ? spill_->SyncWal() : absl::OkStatus(); }

absl::StatusOr<uint64_t> BlockStore::CollectDiskGarbage() {
  if (spill_ == nullptr) return 0;
  const SpillStore::PayloadSpace space = spill_->PayloadFileSpace();
  if (space.garbage_bytes < options_.disk_gc_min_garbage_bytes || space.garbage_bytes * 4 < space.file_bytes) return 0;
  TQ_RETURN_IF_ERROR(spill_->CollectGarbage(/*garbage_share=*/0.5));
  return space.garbage_bytes / 2;
}

void BlockStore::StopDiskGarbageCollection() {
  if (spill_ != nullptr) spill_->CancelGarbageCollection();
}

absl::Status BlockStore::DeleteModelRecord(absl::string_view tenant, uint64_t model_id) {
  if (spill_ != nullptr) return spill_->DeleteModelRecord(tenant, model_id);
  absl::MutexLock l(&mu_);
  memory_models_.erase({std::string(tenant), model_id});
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModelRecord>> BlockStore::ListModelRecords() {
  if (spill_ != nullptr) return spill_->ListModelRecords();
  absl::MutexLock l(&mu_);
  std::vector<ModelRecord> out;
  for (const auto& [k, v] : memory_models_) out.push_back({k.first, k.second, v});
  return out;
}

}  // namespace tqkv::storage
