// BlockStore: the storage facade the service layer codes against.
//
// It holds opaque block payloads keyed by (tenant, model_id, block_hash) in
// a host-memory tier with a byte budget and, optionally, a RocksDB disk tier
// (see spill_store.h for the on-disk layout). It knows nothing about codec
// formats: a payload is bytes plus the BlockAccounting the caller computed.
//
// Life of a block
//   BeginPut reserves host bytes and returns a PutHandle owning a writable
//   buffer. Commit makes the block visible atomically; an aborted or
//   destroyed uncommitted handle leaves nothing behind. Lookup and Get see a
//   block only after Commit. When an admission would push host usage above
//   the high watermark, least-recently-used blocks that are not pinned,
//   leased or busy with I/O are evicted until usage (new block included) is
//   at the low watermark: each goes to disk if the disk budget allows (the
//   disk tier drops its own LRU blocks to make room) or is dropped. A Get of
//   a disk-resident block verifies its checksum and promotes it back to host
//   memory if that fits below the high watermark and its tenant's quota.
//   With a per-tenant quota (tenant_host_quota_bytes) a tenant at its quota
//   evicts its own blocks, not other tenants'.
//
// What is durable
//   Blocks on disk survive a restart and a process crash (kill -9): Open
//   rebuilds the disk part of the index from RocksDB (or, with
//   load_index_in_background, starts rebuilding it; see "Opening a large
//   disk tier"). Blocks that only live
//   in host memory are lost on restart. PutOptions::durable writes a block
//   to RocksDB with a synced WAL before Commit returns (it also stays in host
//   memory). Spills are written without fsync unless Options::sync_spills:
//   they survive a process crash but not necessarily a power loss. Deletes
//   are not synced either: after a power loss a deleted block may come back
//   (with its correct bytes). Model records are always synced. Pins, leases
//   and LRU order are not persisted: after a restart no block is pinned and
//   disk blocks age in key order.
//
// A full disk
//   A durable put (Commit, CommitAll) or a model record that needs the disk
//   while it is full fails with RESOURCE_EXHAUSTED naming the disk tier's
//   directory, and nothing of it becomes visible; other disk I/O errors are
//   UNAVAILABLE. Blocks already acknowledged stay: host copies are kept when
//   their spill fails, disk copies keep being read. Puts to host memory go
//   on: while the disk is full (for a second after a spill found it full,
//   then the disk is tried again) eviction drops its victims instead of
//   spilling them, as it does when the disk budget is full. Once space is
//   back, the next write resumes RocksDB (spill_store.h) and succeeds. A
//   store on a full disk opens and serves what it holds.
//
// Opening a large disk tier
//   Indexing takes ~1.7 µs a block (17 s at 10 million). With
//   load_index_in_background, Open returns at once and one thread scans the
//   disk tier's meta into the index while the store serves: a Lookup, Get,
//   Pin, Unpin, Delete or commit of a block not indexed yet reads its meta
//   from RocksDB and indexes it on the spot, so every stored block answers
//   from the first call. What the scan finds after a block was removed (or
//   indexed) meanwhile is skipped. Until the scan ends, StoreStats counts
//   the blocks indexed so far (index_loading is true) and the disk budget
//   sees only them; Evict with drop waits for the scan, as does
//   AwaitIndexLoaded.
//
// Tiers and hits
//   A block may have copies in several tiers (a promoted block keeps its disk
//   copy, so evicting it again costs no write). Lookup and Get report the
//   fastest tier holding it; StoreStats::usage counts residency per tier, so
//   a block with two copies appears under both. Tier::kGpu is reserved.
//
// Thread safety
//   BlockStore is thread-safe; every method may be called concurrently. One
//   mutex guards the index, the budgets and the counters; RocksDB reads and
//   writes, checksums and payload copies run outside it. At most one RocksDB
//   write or delete per key is in flight; Commit and Delete of a key that is
//   busy wait for that one write to finish. A PutHandle must be used by one
//   thread at a time. No background threads (but the index scan of
//   load_index_in_background): all other work runs in the callers.
#ifndef TQKV_STORAGE_BLOCK_STORE_H_
#define TQKV_STORAGE_BLOCK_STORE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "storage/block_index.h"
#include "storage/block_key.h"
#include "storage/clock.h"
#include "storage/host_arena.h"
#include "storage/host_pool.h"
#include "storage/spill_store.h"

namespace tqkv::storage {

struct BlockStoreOptions {
  // Bytes of host memory for block payloads, committed and in flight.
  // Default: 1 GiB.
  uint64_t host_capacity_bytes = uint64_t{1} << 30;
  // Eviction starts when an admission would take host usage above this
  // fraction of capacity. Default: 0.90.
  double host_high_watermark = 0.90;
  // Eviction frees blocks until usage, counting the incoming block, is at
  // most this fraction of capacity. Default: 0.80.
  double host_low_watermark = 0.80;

  // Most bytes one tenant may hold in host memory: its host copies and the
  // reservations of its uncommitted puts. A put that would take its tenant
  // over first evicts that tenant's own least-recently-used blocks (to disk
  // or dropped, as budget eviction does); if they cannot make room (pinned,
  // leased or in flight) BeginPut is RESOURCE_EXHAUSTED naming the tenant,
  // and no other tenant's block is touched for it. With quotas that sum to
  // at most host_capacity_bytes · host_low_watermark, no tenant's puts
  // evict another tenant's blocks. 0: no per-tenant limit. Default: 0.
  uint64_t tenant_host_quota_bytes = 0;

  // RocksDB directory of the disk tier. Empty: no disk tier; evicted blocks
  // are dropped, durable puts are refused and model records live only in
  // memory. Default: empty.
  std::string disk_path;
  // Bytes of payload the disk tier may hold; beyond it the disk tier drops
  // its least-recently-used blocks. Default: 64 GiB.
  uint64_t disk_capacity_bytes = uint64_t{64} << 30;
  // Free bytes the disk tier's file system keeps (SpillStoreOptions::
  // min_free_bytes): spills past it are dropped and durable puts refused
  // as on a full disk. Default: 1 GiB.
  uint64_t disk_min_free_bytes = uint64_t{1} << 30;
  // CollectDiskGarbage waits for at least this many bytes of removed
  // blocks' payloads in the disk tier's files (and a quarter of them).
  // Default: 256 MiB.
  uint64_t disk_gc_min_garbage_bytes = uint64_t{256} << 20;
  // fsync the WAL on every spill (power-loss durable spills, slower
  // eviction). Default: false.
  bool sync_spills = false;
  // Encrypts every payload the disk tier writes (SpillStoreOptions::cipher;
  // at_rest_cipher.h); records already on disk are read either way. Not
  // owned; must outlive the store. Default: null (payloads in clear).
  const AtRestCipher* at_rest_cipher = nullptr;

  // Where put buffers and payloads read back from the disk tier come from
  // (host_arena.h), so that a GPU backend that pinned the arena moves them
  // by DMA. Not owned; must outlive the store and every buffer it handed
  // out. Default: null (the heap).
  HostArena* host_arena = nullptr;

  // Write-behind: while host copies without a disk copy hold more than this
  // many bytes, a thread writes the oldest of them to disk in batches of
  // about 64 MiB, keeping the host copies, as far as the disk budget has
  // room without dropping disk blocks. Eviction then only lets go of host
  // memory, a shutdown has at most about this much left to write, and the
  // written blocks survive a crash (WAL, as spills). 0: off (blocks reach
  // disk when evicted). Default: 0.
  uint64_t write_behind_above_bytes = 0;

  // Open returns before the disk tier is indexed and a thread indexes it
  // while the store serves ("Opening a large disk tier"). Default: false
  // (Open indexes every block before it returns).
  bool load_index_in_background = false;
  // Test hook: the background scan calls it before indexing each batch (up
  // to 1,024 blocks) with the number of blocks scanned before it. Default:
  // none.
  std::function<void(uint64_t)> before_index_batch_for_test;

  // Longest lease Pin accepts. Default: 10 minutes.
  absl::Duration max_pin_ttl = absl::Minutes(10);
  // Whether a Lookup hit refreshes the block's LRU position (as a Get does).
  // Default: true.
  bool lookup_refreshes_lru = true;

  // Time source for leases and LRU order. Not owned; must outlive the store.
  // Default: null, meaning the real clock.
  Clock* clock = nullptr;
};

struct PutOptions {
  // Write the block to RocksDB with a synced WAL before Commit returns.
  // Requires a disk tier. Default: false (host memory only until evicted).
  bool durable = false;
};

class BlockStore;

// A reserved, not yet visible block. Move-only. Destroying or Abort-ing a
// handle that was not committed releases its reservation; nothing becomes
// visible. REQUIRES: destroyed before the BlockStore that issued it.
class PutHandle {
 public:
  PutHandle() = default;
  PutHandle(PutHandle&& other) noexcept { *this = std::move(other); }
  PutHandle& operator=(PutHandle&& other) noexcept;
  PutHandle(const PutHandle&) = delete;
  PutHandle& operator=(const PutHandle&) = delete;
  ~PutHandle();

  // True until committed, aborted or moved from.
  bool valid() const { return store_ != nullptr; }
  // The payload buffer: size_bytes() bytes, uninitialised; fill all of it.
  // Valid while the handle is. REQUIRES: valid().
  absl::Span<uint8_t> buffer() { return buffer_->span(); }
  const BlockKey& key() const { return key_; }
  uint64_t size_bytes() const { return accounting_.total_bytes; }

 private:
  friend class BlockStore;
  void Release();

  BlockStore* store_ = nullptr;  // null once committed, aborted or moved
  BlockKey key_;
  std::string parent_hash_;
  BlockAccounting accounting_;
  PutOptions options_;
  std::unique_ptr<HostBuffer> buffer_;
};

enum class CommitOutcome {
  kCommitted,       // the block is now visible
  kAlreadyPresent,  // an identical block (same size and checksum) was visible
};

struct LookupResult {
  size_t hits = 0;          // consecutive leading hashes present
  std::vector<Tier> tiers;  // tiers[i]: fastest tier of hit i; size() == hits
};

// A block as returned by Get. The payload is shared and immutable: it stays
// valid for as long as the caller holds it, whatever happens to the block.
struct BlockData {
  std::shared_ptr<const HostBuffer> payload;
  Tier tier = Tier::kHost;  // tier it was served from
  std::string parent_hash;
  BlockAccounting accounting;
  uint64_t checksum = 0;  // XXH64(payload, seed 0)
};

struct ModelScope {
  std::string tenant;
  uint64_t model_id = 0;
};

struct EvictSpec {
  // Only blocks of this model; nullopt: every block. Default: nullopt.
  std::optional<ModelScope> scope;
  // At most this many payload bytes, whole blocks (oldest first for
  // spills; the walk stops at the first block that would pass it); 0: no
  // limit. Default: 0.
  uint64_t max_bytes = 0;
  // false: move host copies out of host memory the way budget eviction does
  //        (to disk if it fits, else dropped); disk copies are untouched.
  // true:  remove matching blocks from every tier.
  // Default: false.
  bool drop = false;
  // Also move (drop=false) or remove (drop=true) pinned/leased blocks. For
  // shutdown, where pins end with the process and a pinned block left in
  // host memory would be lost, and for unregistering a model, whose blocks
  // must all go. Default: false.
  bool include_pinned = false;
  // drop=false: spills are written in RocksDB batches of about this many
  // payload bytes (bounding the memory a batch takes), and no new batch
  // starts that would, taking as long as the one before it, end past
  // `deadline`. Defaults: 64 MiB, none.
  uint64_t batch_bytes = uint64_t{64} << 20;
  absl::Time deadline = absl::InfiniteFuture();
  // drop=false with a deadline: also keep, before it, the time the disk
  // tier's memtables take to flush at the spill rate measured so far (a
  // close writes them), so that the flush ends by the deadline too.
  // Default: false.
  bool flush_by_deadline = false;
};

struct EvictResult {
  uint64_t blocks = 0;          // blocks moved out of host (drop=false) or removed
  uint64_t bytes = 0;           // their payload bytes
  uint64_t skipped_pinned = 0;  // matching blocks protected by a pin/lease
  uint64_t skipped_busy = 0;    // matching blocks with I/O in flight
  // drop=false, stopped by the deadline: matching blocks still only in
  // host memory (idle and, unless include_pinned, unprotected).
  uint64_t left_blocks = 0;
  uint64_t left_bytes = 0;
};

// Monotonic event counters.
struct StoreCounters {
  uint64_t lookups = 0;                                  // Lookup calls
  std::array<uint64_t, kNumTiers> lookup_hit_blocks{};   // leading hits, by tier
  uint64_t lookup_miss_blocks = 0;                       // queried blocks not hit
  std::array<uint64_t, kNumTiers> get_hits{};            // Gets served, by tier
  uint64_t get_misses = 0;                               // Gets answered NOT_FOUND
  uint64_t puts_committed = 0;
  uint64_t puts_already_present = 0;
  uint64_t puts_aborted = 0;   // handles released without commit
  uint64_t puts_rejected = 0;  // BeginPut refused for lack of host memory
  uint64_t evictions = 0;      // blocks whose host copy was evicted
  uint64_t evicted_bytes = 0;
  uint64_t spills = 0;  // evictions that wrote the block to disk
  uint64_t spilled_bytes = 0;
  uint64_t written_behind = 0;  // host blocks copied to disk by write-behind (host copy kept)
  uint64_t written_behind_bytes = 0;
  uint64_t promotions = 0;  // disk blocks copied into host memory by Get
  uint64_t promoted_bytes = 0;
  uint64_t drops = 0;  // blocks removed by budget pressure or Evict(drop)
  uint64_t checksum_failures = 0;  // corrupt disk payloads or meta found
  uint64_t disk_errors = 0;        // disk-tier write batches (spills, durable puts, deletes) that failed
  uint64_t deletes = 0;            // successful Delete calls
};

struct StoreStats {
  std::vector<TierUsage> usage;  // per (tenant, model, tier) residency, sorted
  std::vector<ModelResidency> residency;  // per (tenant, model), each block once, sorted
  StoreCounters counters;
  uint64_t blocks = 0;  // blocks in the index (visible, committing or deleting)
  uint64_t host_capacity_bytes = 0;
  uint64_t host_high_watermark_bytes = 0;
  uint64_t host_low_watermark_bytes = 0;
  uint64_t host_used_bytes = 0;      // host copies + reservations
  uint64_t host_reserved_bytes = 0;  // reservations of uncommitted puts
  bool disk_enabled = false;
  uint64_t disk_capacity_bytes = 0;
  uint64_t disk_used_bytes = 0;  // payload bytes of blocks on disk
  // The files holding those payloads (SpillStore::PayloadFileSpace), and how
  // many of their bytes belong to removed blocks (collected by
  // CollectDiskGarbage).
  uint64_t disk_file_bytes = 0;
  uint64_t disk_garbage_bytes = 0;
  // The disk tier's index is still being loaded: counts cover the blocks
  // indexed so far (load_index_in_background).
  bool index_loading = false;
  // The put buffers' arena (BlockStoreOptions::host_arena), if any.
  std::optional<HostArena::Stats> host_arena;
};

class BlockStore {
 public:
  // Validates options (INVALID_ARGUMENT), opens the disk tier if configured
  // and indexes every block found there, or starts doing so with
  // load_index_in_background (payload checksums are verified
  // lazily on Get; entries with corrupt meta are deleted and counted as
  // checksum failures). Disk open errors are returned as mapped statuses.
  static absl::StatusOr<std::unique_ptr<BlockStore>> Open(const BlockStoreOptions& options);

  // REQUIRES: no PutHandle of this store is alive and no call is running.
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Reserves size_bytes of host memory and returns a handle to fill.
  // parent_hash is empty or a valid block hash.
  // INVALID_ARGUMENT: bad key/parent, accounting.total_bytes != size_bytes.
  // FAILED_PRECONDITION: options.durable without a disk tier.
  // RESOURCE_EXHAUSTED: the block cannot fit even after evicting everything
  //   evictable (the rest is pinned, leased or in flight), or is larger than
  //   the host capacity, or its tenant is at tenant_host_quota_bytes with
  //   blocks that cannot be evicted. The budgets are never exceeded.
  // Other codes: a disk error (not a full disk: victims are dropped then)
  //   while spilling victims.
  absl::StatusOr<PutHandle> BeginPut(const BlockKey& key, absl::string_view parent_hash,
                                     const BlockAccounting& accounting, uint64_t size_bytes,
                                     PutOptions options = {});

  // Makes the handle's block visible and consumes the handle (whatever the
  // result). If a block with the same key is already visible:
  //   same size and checksum -> kAlreadyPresent (the new bytes are dropped;
  //     with durable=true the existing block is made durable first);
  //   otherwise -> ALREADY_EXISTS; the visible block is unchanged.
  // Concurrent commits of one key are serialised: exactly one returns
  // kCommitted. INVALID_ARGUMENT for an invalid handle; disk errors for
  // durable puts (nothing becomes visible then).
  absl::StatusOr<CommitOutcome> Commit(PutHandle handle);

  // Commits several handles as one: every block becomes visible at the
  // same instant, or none does (a reader never sees part of the set).
  // Each handle as Commit treats it; ALREADY_EXISTS for any conflicting
  // key, INVALID_ARGUMENT for an invalid handle or a key given twice, a
  // full disk or disk error for durable ones: then nothing becomes visible
  // and every handle is consumed. Durable blocks are written in one
  // RocksDB batch (after a crash: all of them or none). Outcomes in the
  // handles' order. On ALREADY_EXISTS, *conflict (optional) receives the
  // index of the first conflicting handle.
  absl::StatusOr<std::vector<CommitOutcome>> CommitAll(std::vector<PutHandle> handles,
                                                       size_t* conflict = nullptr);

  // Releases an uncommitted handle (same as destroying it). No-op if invalid.
  void Abort(PutHandle handle);

  // BeginPut + copy + Commit in one call.
  absl::StatusOr<CommitOutcome> Put(const BlockKey& key, absl::string_view parent_hash,
                                    const BlockAccounting& accounting,
                                    absl::string_view payload, PutOptions options = {});

  // Counts the consecutive leading hashes of `chain` that are visible blocks
  // of (tenant, model_id) and reports each hit's tier. Updates lookup
  // counters. INVALID_ARGUMENT for a bad tenant or hash.
  absl::StatusOr<LookupResult> Lookup(absl::string_view tenant, uint64_t model_id,
                                      absl::Span<const std::string> chain);

  // The exact committed bytes of `key`.
  // NOT_FOUND: no visible block. DATA_LOSS: the disk copy failed its
  //   checksum (or vanished); the block has been removed from the store.
  //   A sealed disk copy that fails authentication counts as such.
  // FAILED_PRECONDITION: the disk copy is encrypted at rest and the store
  //   has no key, or not the one it was sealed with (the block is kept).
  // Other codes: disk read errors (the block is kept).
  absl::StatusOr<BlockData> Get(const BlockKey& key);

  // Adds a pin whose lease ends at Now() + ttl (extending, never shortening,
  // the block's lease). A block with a pin and an unexpired lease is never
  // evicted or dropped for budget; once the lease expires, all its pins are
  // void. Evict skips protected blocks; Delete removes them regardless.
  // INVALID_ARGUMENT: ttl <= 0 or > max_pin_ttl. NOT_FOUND: no visible block.
  absl::Status Pin(const BlockKey& key, absl::Duration ttl);
  // Pins every key, or none: NOT_FOUND (naming the first missing key, in
  // *missing when not null) changes no block's pins or lease.
  absl::Status PinAll(std::span<const BlockKey> keys, absl::Duration ttl, size_t* missing = nullptr);
  // Removes one pin. FAILED_PRECONDITION if the block has no live pin (never
  // pinned, all unpinned, or lease expired). NOT_FOUND: no visible block.
  absl::Status Unpin(const BlockKey& key);

  // Removes the block from every tier. NOT_FOUND if not visible. Readers
  // holding its payload keep it.
  absl::Status Delete(const BlockKey& key);

  // Administrative eviction; see EvictSpec. Disk errors are returned.
  absl::StatusOr<EvictResult> Evict(const EvictSpec& spec);

  // A graceful shutdown's spill: every host block (pinned ones too: pins
  // end with the process) moved to disk, oldest first, in batches that end
  // before `budget` is spent less the time the memtables take to flush
  // (EvictSpec::flush_by_deadline) and less its last tenth (at most 3 s),
  // kept for the WAL sync that follows and the close. The result counts
  // what moved and what was left (lost with the process).
  absl::StatusOr<EvictResult> SpillForShutdown(absl::Duration budget);

  // A consistent snapshot of usage, budgets and counters.
  StoreStats Stats();
  // Whether the store has a disk tier (Stats().disk_enabled without the rest).
  bool disk_enabled() const { return spill_ != nullptr; }
  // Returns once every block on disk is indexed (at once unless
  // load_index_in_background and its scan is running); the scan's error,
  // if it failed (then blocks it did not reach stay unknown).
  absl::Status AwaitIndexLoaded();
  // The blocks of one model resident in any tier, each once.
  ModelResidency ResidencyOf(absl::string_view tenant, uint64_t model_id);

  // Model registration records: opaque bytes per (tenant, model_id), synced
  // to the "models" column family (or kept in memory without a disk tier).
  // Get: NOT_FOUND if absent. List: ordered by (tenant, model_id).
  absl::Status PutModelRecord(absl::string_view tenant, uint64_t model_id,
                              absl::string_view record);
  absl::StatusOr<std::string> GetModelRecord(absl::string_view tenant, uint64_t model_id);
  absl::Status DeleteModelRecord(absl::string_view tenant, uint64_t model_id);

  // Makes every write acknowledged so far power-loss durable (fsyncs the
  // RocksDB WAL): spills, unsynced deletes. OK without a disk tier (nothing
  // to sync); the RocksDB error otherwise.
  absl::Status Sync();

  // Frees the disk space of removed blocks (SpillStore::CollectGarbage)
  // once it is a quarter of the disk tier's payload files and at least
  // disk_gc_min_garbage_bytes: the files holding half of it are rewritten
  // without it.
  // Returns the garbage bytes it set out to free (0: none yet). Blocks while
  // it runs; everything else goes on. For a periodic caller (the server's
  // maintenance loop); OK without a disk tier.
  absl::StatusOr<uint64_t> CollectDiskGarbage();
  // Stops a CollectDiskGarbage in progress (CANCELLED) and refuses later
  // ones (SpillStore::CancelGarbageCollection). Before a shutdown.
  void StopDiskGarbageCollection();
  absl::StatusOr<std::vector<ModelRecord>> ListModelRecords();

  // The disk tier (null without one), to corrupt entries in tests.
  SpillStore* SpillStoreForTest() { return spill_.get(); }

 private:
  friend class PutHandle;  // releases reservations of dropped handles
  struct IoPlan;

  BlockStore(const BlockStoreOptions& options, std::unique_ptr<SpillStore> spill);
  // Indexes every block of the disk tier (the scan of "Opening a large disk
  // tier" when loading_; stops early once stop_loading_).
  absl::Status LoadFromDisk();
  // Indexes a block found by the scan, unless indexed or removed meanwhile.
  void InsertLoadedLocked(BlockKey key, DiskBlockMeta meta, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record of `key`; while the index loads, a block not indexed yet is
  // read from the disk tier's meta and indexed first. Null if absent.
  BlockRecord* FindLocked(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (releasing mu_) until the index scan has ended.
  void AwaitIndexLoadedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The write-behind thread: batches of the oldest host-only blocks written
  // to disk while they exceed options_.write_behind_above_bytes.
  void WriteBehindLoop();
  // Plans writing up to `bytes` of the oldest idle, visible host-only
  // blocks to disk (host copies kept) within the disk budget's free room.
  void PlanWriteBehindLocked(uint64_t bytes, IoPlan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ReleaseHandle(const std::string& tenant, uint64_t size_bytes);
  absl::Status ReserveHostLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReserveHostLocked within the tenant's quota (options_.tenant_host_quota_bytes),
  // evicting the tenant's own blocks first; on success the bytes are
  // reserved in the pool and counted as the tenant's.
  absl::Status ReserveForTenantLocked(const std::string& tenant, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `bytes` more of `tenant` stay within its host quota.
  bool TenantFitsLocked(const std::string& tenant, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A tenant's host copies plus its uncommitted reservations.
  uint64_t TenantHostBytesLocked(const std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns a reservation of `tenant` (the pool's bytes are the caller's).
  void UnreserveLocked(const std::string& tenant, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes of host copies eviction could release now (idle, visible,
  // unprotected), counted oldest first until `enough` is reached.
  uint64_t EvictableHostBytesLocked(uint64_t enough) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Plans moving up to `bytes` of unprotected, idle host copies out of host
  // memory, oldest first, restricted to `scope` and `tenant` if set.
  // at_most: `bytes` is a bound not to pass (whole blocks); else a goal to
  // reach.
  void PlanHostEvictionLocked(uint64_t bytes, const std::optional<ModelScope>& scope,
                              IoPlan* plan, EvictResult* result, bool include_pinned = false,
                              bool at_most = false, const std::string* tenant = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves disk room for `bytes`, planning disk-only LRU drops as needed.
  // Returns false, having planned nothing, if even those cannot make room.
  bool ReserveDiskLocked(uint64_t bytes, IoPlan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the plan's RocksDB batch with mu_ released, then applies its
  // outcome to the index. Returns the I/O status.
  absl::Status RunPlanLocked(IoPlan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DetachHostLocked(BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until no I/O is in flight for `key`; returns its record or null.
  BlockRecord* FindIdleLocked(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a visible, idle disk-resident block from the index and RocksDB.
  absl::Status RemoveLocked(BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BlockStoreOptions options_;
  std::unique_ptr<Clock> owned_clock_;  // set when options_.clock is null
  Clock* const clock_;
  const std::unique_ptr<SpillStore> spill_;  // null without a disk tier

  absl::Mutex mu_;
  absl::CondVar io_done_;  // signalled whenever a RocksDB batch finishes
  BlockIndex index_ ABSL_GUARDED_BY(mu_);
  HostPool pool_ ABSL_GUARDED_BY(mu_);
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;        // held by uncommitted puts
  // reserved_bytes_ by tenant (no zero entries).
  absl::flat_hash_map<std::string, uint64_t> tenant_reserved_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t host_spilling_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // host copies being spilled
  uint64_t disk_reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // disk writes in flight
  uint64_t disk_dropping_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // disk deletes in flight
  // Until then eviction drops instead of spilling: a spill found the disk
  // full (RunPlanLocked).
  absl::Time disk_full_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  StoreCounters counters_ ABSL_GUARDED_BY(mu_);
  // The background index scan (load_index_in_background): while loading_,
  // keys erased from the index are kept in removed_while_loading_ so that
  // the scan (a snapshot) does not bring them back.
  bool loading_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status load_status_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<BlockKey> removed_while_loading_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_loading_{false};
  std::thread loader_;
  // Write-behind (options_.write_behind_above_bytes): its thread runs until
  // stop_writing_behind_.
  bool stop_writing_behind_ ABSL_GUARDED_BY(mu_) = false;
  std::thread write_behind_;
  // Model records when there is no disk tier.
  std::map<std::pair<std::string, uint64_t>, std::string> memory_models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_BLOCK_STORE_H_
