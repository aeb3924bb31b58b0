// The block index: every block the store knows, where its copies live, and
// the per-(tenant, model, tier) byte sums derived from that.
//
// A record has at most one host copy (a shared immutable buffer) and at most
// one disk copy (a RocksDB entry); it is "resident" in each tier it has a
// copy in. Residency changes go through SetHostCopy/SetOnDisk so that the
// LRU lists and the usage sums can never drift from the records:
//   - host LRU:      records with a host copy;
//   - disk-only LRU: records with a disk copy and no host copy.
// Both lists are ordered by last access (Touch), oldest first, and kept as
// ordered trees: a record joins or leaves a list in O(log n) whatever the
// access pattern (a record that changes tier keeps its age among the
// records already there). Touch is O(1): it only records the access, and
// a walk that meets a record touched since it was placed moves it to its
// new place first (O(log n), once per touched record), so walks see
// records in their exact order of last access.
//
// Memory per record: the record (~150 bytes plus its key's strings), one
// hash map slot, and one LRU tree entry (32 bytes plus the tree's node
// overhead).
//
// Policy (pins, visibility, I/O serialisation) is the caller's: the index
// stores those fields but does not interpret them.
#ifndef TQKV_STORAGE_BLOCK_INDEX_H_
#define TQKV_STORAGE_BLOCK_INDEX_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/time/time.h"
#include "storage/block_key.h"
#include "storage/host_pool.h"

namespace tqkv::storage {

struct BlockRecord {
  // Identity and metadata; fixed once inserted.
  BlockKey key;
  std::string parent_hash;
  BlockAccounting accounting;  // accounting.total_bytes == size_bytes
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;    // BlockChecksum(key, payload)
  uint64_t generation = 0;  // unique per insertion; tells incarnations of a key apart

  // Residency. Read freely; change only through BlockIndex.
  std::shared_ptr<const HostBuffer> host;  // non-null iff resident in host
  bool on_disk = false;                    // RocksDB holds this block
  // Where the disk copy's payload is (SpillStore::ReadPayload's hint;
  // segment 0: none known), and whether it is sealed at rest.
  bool disk_sealed = false;
  uint32_t disk_segment = 0;
  uint64_t disk_offset = 0;

  // State kept for the caller.
  bool visible = false;  // committed and not being deleted: Lookup/Get see it
  bool io_busy = false;  // a RocksDB write or delete for this key is in flight
  int pin_count = 0;
  absl::Time lease_deadline = absl::InfinitePast();
  absl::Time last_access = absl::InfinitePast();

  // True iff pins protect the record at `now` (pinned with an unexpired lease).
  bool Protected(absl::Time now) const { return pin_count > 0 && now < lease_deadline; }
  // The fastest tier holding a copy. REQUIRES: host or on_disk.
  Tier best_tier() const { return host != nullptr ? Tier::kHost : Tier::kDisk; }

 private:
  friend class BlockIndex;
  enum class List : uint8_t { kNone, kHost, kDiskOnly };
  List list_ = List::kNone;
  std::pair<absl::Time, uint64_t> lru_key_;  // its place in list_: (last access, generation)
};

// Sums over the records of one (tenant, model, tier).
struct TierUsage {
  std::string tenant;
  uint64_t model_id = 0;
  Tier tier = Tier::kHost;
  uint64_t blocks = 0;
  uint64_t payload_bytes = 0;
  BlockAccounting accounting;  // field-wise sums
};

// Blocks of one (tenant, model) resident in at least one tier, each counted
// once (TierUsage counts a block once per tier it is in).
struct ModelResidency {
  std::string tenant;
  uint64_t model_id = 0;
  uint64_t blocks = 0;
  uint64_t payload_bytes = 0;
};

// Thread-compatible: the owner serialises all calls (BlockStore holds its
// mutex). Record pointers stay valid until Erase of that record.
class BlockIndex {
 public:
  BlockIndex() = default;
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // The record of `key`, or null.
  BlockRecord* Find(const BlockKey& key);
  // Starts loading the table memory Find(key) will read, so that the probes
  // of a chain's later keys overlap the earlier ones.
  void Prefetch(const BlockKey& key) const { records_.prefetch(key); }

  // Inserts `record` (its host/on_disk fields are applied as residency) and
  // assigns it a fresh generation. REQUIRES: no record with the same key.
  BlockRecord* Insert(BlockRecord record);

  // Makes room for `records` records in all (a load of a known size).
  void Reserve(size_t records) { records_.reserve(records); }

  // Drops the record's copies from the sums and removes it. Pointer dies.
  void Erase(BlockRecord* record);

  // Attaches (non-null) or detaches (null) the host copy.
  // REQUIRES: a non-null buffer has record->size_bytes bytes.
  void SetHostCopy(BlockRecord* record, std::shared_ptr<const HostBuffer> buffer);
  void SetOnDisk(BlockRecord* record, bool on_disk);

  // Sets last_access (the record's place in its LRU list follows it).
  void Touch(BlockRecord* record, absl::Time now) { record->last_access = std::max(record->last_access, now); }

  // Calls fn(record) oldest first over the host (or disk-only) LRU list until
  // fn returns false. fn may change residency of, or erase, only the record it
  // is given.
  template <typename Fn>
  void ForEachHostLru(Fn fn) {
    ForEachIn(host_lru_, fn);
  }
  template <typename Fn>
  void ForEachDiskOnlyLru(Fn fn) {
    ForEachIn(disk_only_lru_, fn);
  }
  // Calls fn(record) for every record, in no particular order. fn must not
  // insert or erase.
  template <typename Fn>
  void ForEach(Fn fn) {
    for (const std::unique_ptr<BlockRecord>& rec : records_) fn(rec.get());
  }

  size_t size() const { return records_.size(); }
  uint64_t host_bytes() const { return host_bytes_; }
  // Bytes of `tenant`'s host copies.
  uint64_t tenant_host_bytes(const std::string& tenant) const {
    auto it = tenant_host_bytes_.find(tenant);
    return it == tenant_host_bytes_.end() ? 0 : it->second;
  }
  uint64_t disk_bytes() const { return disk_bytes_; }
  // Bytes of host copies that have no disk copy.
  uint64_t host_only_bytes() const { return host_only_bytes_; }
  size_t host_blocks() const { return host_lru_.size(); }
  size_t disk_only_blocks() const { return disk_only_lru_.size(); }

  // Usage per (tenant, model, tier) with at least one block, sorted by
  // (tenant, model_id, tier).
  std::vector<TierUsage> Usage() const;
  // Per (tenant, model) with at least one resident block, sorted.
  std::vector<ModelResidency> Residency() const;
  // One model's (zero blocks when it has none).
  ModelResidency ResidencyOf(const std::string& tenant, uint64_t model_id) const;

 private:
  using UsageKey = std::tuple<std::string, uint64_t, Tier>;
  using LruKey = std::pair<absl::Time, uint64_t>;  // (last access, generation): unique
  using Lru = absl::btree_map<LruKey, BlockRecord*>;

  // Records touched since they were placed move to their new place when
  // met. fn may remove the record it is given from `list` (which
  // invalidates iterators): the walk goes on from the next key.
  template <typename Fn>
  static void ForEachIn(Lru& list, Fn& fn) {
    for (auto it = list.begin(); it != list.end();) {
      const LruKey at = it->first;
      BlockRecord* r = it->second;
      if (r->last_access > at.first) {
        list.erase(it);
        r->lru_key_ = {r->last_access, at.second};
        list.emplace(r->lru_key_, r);
      } else if (!fn(r)) {
        return;
      }
      it = list.upper_bound(at);
    }
  }

  void AddUsage(const BlockRecord& r, Tier tier, bool add);
  // Counts the record in (add) or out of its model's residency when it
  // gains its first or loses its last copy.
  void AddResidency(const BlockRecord& r, bool add);
  // Puts the record on the list its residency calls for (keeping its place
  // if unchanged).
  void Relist(BlockRecord* r);

  // The records, found by the key inside each (no second copy of it).
  struct RecordHash {
    using is_transparent = void;
    size_t operator()(const BlockKey& k) const { return absl::Hash<BlockKey>()(k); }
    size_t operator()(const std::unique_ptr<BlockRecord>& r) const { return (*this)(r->key); }
  };
  struct RecordEq {
    using is_transparent = void;
    static const BlockKey& Key(const BlockKey& k) { return k; }
    static const BlockKey& Key(const std::unique_ptr<BlockRecord>& r) { return r->key; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Key(a) == Key(b);
    }
  };
  absl::flat_hash_set<std::unique_ptr<BlockRecord>, RecordHash, RecordEq> records_;
  Lru host_lru_;       // oldest first
  Lru disk_only_lru_;  // oldest first
  absl::flat_hash_map<UsageKey, TierUsage> usage_;
  absl::flat_hash_map<std::pair<std::string, uint64_t>, ModelResidency> residency_;
  absl::flat_hash_map<std::string, uint64_t> tenant_host_bytes_;  // no zero entries
  uint64_t host_bytes_ = 0;
  uint64_t disk_bytes_ = 0;
  uint64_t host_only_bytes_ = 0;
  uint64_t next_generation_ = 1;
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_BLOCK_INDEX_H_
