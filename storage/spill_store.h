// The disk tier: a RocksDB database holding spilled blocks and the service's
// model registration records.
//
// Column families (the on-disk contract):
//   "block_meta"  key: EncodeBlockKey(key) (see block_key.h)
//                 value: EncodeDiskBlockMeta (below), ~70 bytes + parent hash
//   "block_data"  key: EncodeBlockKey(key)
//                 value: the payload bytes, exactly as committed
//                 (compression off: packed pages do not compress; values
//                 of 512 bytes and more live in RocksDB blob files), or in a
//                 format 3 record the payload sealed by AtRestCipher
//                 (at_rest_cipher.h) with the tenant's key, bound to
//                 EncodeBlockKey(key)
//   "models"      key: EncodeModelPrefix(tenant, model_id)
//                 value: opaque bytes chosen by the service
//   "default"     unused (RocksDB requires it)
//
// A block's meta and data are always written and deleted together in one
// WriteBatch, so a reader never sees one without the other. Meta lives in
// its own column family so that opening a store scans only the small meta
// values to rebuild the index; payloads are read (and their checksums
// verified) only when a block is requested.
//
// Meta value, little-endian, format versions 1-3 (one layout):
//   u8  format version (1, 2, 3)   u8  reserved (0)
//   u16 parent hash length P
//   u64 payload size               u64 payload checksum (XXH64, seed 0)
//   u64 dense_equivalent_bytes     u64 packed_k_bytes
//   u64 packed_v_bytes             u64 norms_metadata_bytes
//   u64 dense_window_bytes
//   P bytes parent hash
//   u64 XXH64 (seed 0) of all preceding meta bytes
// (accounting.total_bytes is the payload size and is not stored twice.)
// Version 3 is version 2 with a sealed payload: written only with a
// cipher, so a store without encryption keeps writing version 2. Block
// keys, meta (sizes, checksums, parent hashes) and model records stay in
// clear.
//
// Durability: Apply(sync=true) returns after the WAL is fsynced. Writes with
// sync=false reach the OS before Apply returns, so they survive a process
// crash (kill -9) but not a power loss.
//
// A full disk: a write RocksDB cannot complete (ENOSPC, or another I/O
// error) fails whole, nothing of its batch visible, and RocksDB stops
// taking writes. Every later write first asks RocksDB to resume (it flushes
// its memtables and starts a new WAL) and fails the same way, quickly,
// while the disk stays full; once space is back the first write resumes
// and proceeds. Reads go on throughout. RocksDB's info log ("LOG" in the
// directory) drops lines the disk refuses (rocksdb_log.h).
#ifndef TQKV_STORAGE_SPILL_STORE_H_
#define TQKV_STORAGE_SPILL_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "storage/at_rest_cipher.h"
#include "storage/block_key.h"
#include "storage/host_pool.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class Status;
}  // namespace rocksdb

namespace tqkv::storage {

// Format 2 binds block checksums to their keys (BlockChecksum); format 1
// records (checksum = XXH64(payload)) are still read. Format 3 = format 2
// with the payload sealed (kSealedDiskFormatVersion).
inline constexpr uint8_t kDiskFormatVersion = 2;
inline constexpr uint8_t kSealedDiskFormatVersion = 3;

// What the disk tier stores about a block besides its payload.
struct DiskBlockMeta {
  uint64_t size_bytes = 0;
  // BlockChecksum(key, payload); in a format 1 record XXH64(payload)
  // alone (BlockStore folds the key's tag in when it loads one).
  uint64_t checksum = 0;
  uint8_t version = kDiskFormatVersion;  // of the decoded record (not encoded from here)
  // The payload is sealed (format 3). Set by SpillStore when it seals.
  bool sealed = false;
  std::string parent_hash;
  BlockAccounting accounting;  // total_bytes == size_bytes
  friend bool operator==(const DiskBlockMeta&, const DiskBlockMeta&) = default;
};

// A 64-bit tag of the key (XXH64 of its encoding).
uint64_t KeyTag(const BlockKey& key);
// The checksum of a block everywhere in storage: XXH64 of the payload xor
// the key's tag, so bytes stored or misplaced under another key fail it.
uint64_t BlockChecksum(const BlockKey& key, absl::string_view payload);

std::string EncodeDiskBlockMeta(const DiskBlockMeta& meta);
// DATA_LOSS if the bytes are truncated, fail their checksum or carry an
// unknown format version.
absl::StatusOr<DiskBlockMeta> DecodeDiskBlockMeta(absl::string_view bytes);

// XXH64 of `bytes` with seed 0 (a record's own checksum; format 1 payloads).
uint64_t PayloadChecksum(absl::string_view bytes);

struct SpillStoreOptions {
  // Directory of the RocksDB database. Required.
  std::string path;
  // Create the database (and missing column families) if absent. Default: true.
  bool create_if_missing = true;
  // Memtable size of the block_data column family. Default: 64 MiB.
  uint64_t data_write_buffer_bytes = uint64_t{64} << 20;
  // Size of the blob files payloads are written into. Default: 64 MiB.
  uint64_t blob_file_bytes = uint64_t{64} << 20;
  // Seals every payload written (format 3 records); records already on
  // disk are read either way. Not owned; must outlive the store. Default:
  // null (payloads stored in clear; sealed records cannot be read).
  const AtRestCipher* cipher = nullptr;
  // The RocksDB Env (file system) under the database; tests inject disk
  // faults through it. Not owned; must outlive the store. Default: null
  // (RocksDB's default Env).
  rocksdb::Env* env = nullptr;
  // How Open treats a damaged write-ahead log.
  //   kStrict: a record torn at the end of the log (a write in flight when
  //     the process died, never acknowledged) is dropped; any other damage
  //     fails Open with DATA_LOSS, so acknowledged writes never vanish
  //     silently.
  //   kKeepIntact: replays the log up to the first damaged record and
  //     drops the rest (RocksDB's point-in-time recovery): the repair path
  //     after a kStrict Open failed (tqkv-disk-repair).
  // Default: kStrict.
  enum class WalRecovery { kStrict, kKeepIntact };
  WalRecovery wal_recovery = WalRecovery::kStrict;
  // Free bytes the file system under `path` keeps: a write whose batch
  // would leave less (statvfs, checked before each write) is refused with
  // RESOURCE_EXHAUSTED naming --disk_min_free_bytes, before RocksDB runs
  // out of room for its WAL, compactions and manifest. Deletes are always
  // taken. Default: 1 GiB.
  uint64_t min_free_bytes = uint64_t{1} << 30;
};

// A model registration record as stored in the "models" column family.
struct ModelRecord {
  std::string tenant;
  uint64_t model_id = 0;
  std::string record;
};

// Thread-safe: RocksDB serialises internally. SpillStore keeps no index of
// its own; BlockStore decides what to write and delete and must not issue
// conflicting writes for one key concurrently (it serialises per key).
class SpillStore {
 public:
  // Opens (or creates) the database at options.path. INVALID_ARGUMENT for an
  // empty path; otherwise the RocksDB error mapped to a Status.
  static absl::StatusOr<std::unique_ptr<SpillStore>> Open(const SpillStoreOptions& options);

  // What Repair did.
  struct RepairReport {
    bool rebuilt = false;        // RocksDB's RepairDB rebuilt the MANIFEST
    uint64_t intact_blocks = 0;  // payload read back and matched its checksum
    uint64_t dropped_blocks = 0;  // damaged meta or payload: deleted
    uint64_t unverified_blocks = 0;  // sealed and no cipher given: kept as is
    // Payloads read back from the blob files a rebuild set aside (counted in
    // intact_blocks or unverified_blocks too).
    uint64_t salvaged_blocks = 0;
    uint64_t model_records = 0;
  };

  // The repair path when Open fails with DATA_LOSS (tqkv-disk-repair runs
  // it; the server must not be running). Opens the database keeping the
  // intact part of a damaged WAL (WalRecovery::kKeepIntact); when the
  // MANIFEST or a table file is damaged, first rebuilds the database from
  // the table files it can read (RocksDB's RepairDB; unreadable files go to
  // lost/ under the directory; blob files are set aside first, since the
  // rebuilt database would not list them, and the payloads it lost are read
  // back from them and checked). Then reads every block back and deletes the
  // ones whose meta or payload is damaged or fails its checksum, so the
  // store serves only correct bytes; records lost with a damaged WAL or
  // table are simply absent (clients miss them and put them again).
  // options.path must name an existing database. Errors: the RocksDB
  // errors that remain after the rebuild.
  static absl::StatusOr<RepairReport> Repair(const SpillStoreOptions& options);

  // The stored bytes of a block's payload (sealed ones as sealed), or the
  // RocksDB error mapped: NOT_FOUND, DATA_LOSS for damage.
  absl::StatusOr<std::string> ReadStoredPayload(const BlockKey& key);

  // Closes the database.
  ~SpillStore();
  SpillStore(const SpillStore&) = delete;
  SpillStore& operator=(const SpillStore&) = delete;

  // Writes below: RESOURCE_EXHAUSTED naming the directory when the disk is
  // full; UNAVAILABLE for other I/O errors (RocksDB stopped writes; a later
  // write retries); nothing of a failed write is visible.

  struct BlockWrite {
    const BlockKey* key;  // not owned; must outlive the Apply call
    const DiskBlockMeta* meta;  // not owned
    absl::string_view payload;  // meta->size_bytes bytes
  };

  // Atomically writes `writes` (meta and data) and deletes `deletes` (meta and
  // data) in one WriteBatch. sync=true fsyncs the WAL before returning.
  // RESOURCE_EXHAUSTED (nothing written) when the disk is full or the batch
  // would leave less than min_free_bytes free.
  absl::Status Apply(absl::Span<const BlockWrite> writes, absl::Span<const BlockKey> deletes,
                     bool sync);

  // The stored payload of `key` in a new buffer (opened when sealed).
  // NOT_FOUND if absent; DATA_LOSS when its meta does not decode or a
  // sealed payload fails authentication; FAILED_PRECONDITION when it is
  // sealed and the store has no cipher, or not the key it was sealed with
  // (AtRestCipher::Open). Does not verify the checksum (the caller compares
  // with its index).
  absl::StatusOr<std::unique_ptr<HostBuffer>> ReadPayload(const BlockKey& key);

  // Calls on_block for every block in block_meta, in key order, until it
  // returns false. Entries whose key or meta fail to decode are not passed
  // on; their encoded keys are appended to *corrupt_keys (may be null) for
  // DeleteEncodedKeys. The scan reads one snapshot: writes after it starts
  // are not seen.
  absl::Status ScanBlocks(absl::FunctionRef<bool(BlockKey, DiskBlockMeta)> on_block,
                          std::vector<std::string>* corrupt_keys);

  // The meta of one block as stored now: NOT_FOUND if absent, DATA_LOSS if
  // it does not decode.
  absl::StatusOr<DiskBlockMeta> ReadMeta(const BlockKey& key);

  // RocksDB's estimate of the blocks in block_meta (exact after a clean
  // close; 0 when it has none).
  uint64_t EstimatedBlocks();

  // Bytes in the memtables of the block column families: what a close (or
  // a flush) still writes to table and blob files.
  uint64_t UnflushedBytes();

  // The blob files' bytes, and how many of them belong to deleted or
  // overwritten payloads (garbage: counted once a compaction has dropped
  // their keys; a file whose every payload is garbage is deleted).
  struct BlobSpace {
    uint64_t file_bytes = 0;
    uint64_t garbage_bytes = 0;
  };
  BlobSpace BlobFileSpace();

  // Rewrites the live payloads of the oldest blob files that together hold
  // at least `garbage_share` (0, 1] of the garbage into new files, so those
  // files and their garbage are deleted: a compaction of the block_data
  // keys that blocks until it is done (reads and writes go on meanwhile).
  // Compactions do not collect garbage by themselves: the store's owner
  // calls this when BlobFileSpace shows enough of it.
  // RESOURCE_EXHAUSTED (nothing done) when rewriting those files' live
  // payloads would leave less than min_free_bytes free; CANCELLED once
  // CancelBlobGarbageCollection was called.
  absl::Status CollectBlobGarbage(double garbage_share);
  // Stops a CollectBlobGarbage in progress (it returns CANCELLED soon,
  // what it rewrote kept) and refuses later ones: for a shutdown, which
  // must not wait for a compaction of the whole disk tier.
  void CancelBlobGarbageCollection();

  // Deletes meta and data under raw encoded keys (cleanup of corrupt entries).
  absl::Status DeleteEncodedKeys(absl::Span<const std::string> encoded_keys);

  // Fsyncs the WAL: every earlier write becomes power-loss durable.
  absl::Status SyncWal();

  // Model records. Put and Delete are synced. Get: NOT_FOUND if absent.
  absl::Status PutModelRecord(absl::string_view tenant, uint64_t model_id,
                              absl::string_view record);
  absl::StatusOr<std::string> GetModelRecord(absl::string_view tenant, uint64_t model_id);
  absl::Status DeleteModelRecord(absl::string_view tenant, uint64_t model_id);
  // Every record, ordered by (tenant, model_id).
  absl::StatusOr<std::vector<ModelRecord>> ListModelRecords();

  // Test hooks: replace the stored payload or meta of `key` with raw bytes,
  // bypassing every check, to simulate on-disk corruption.
  absl::Status OverwritePayloadForTest(const BlockKey& key, absl::string_view bytes);
  absl::Status OverwriteMetaForTest(const BlockKey& key, absl::string_view bytes);
  // True iff block_data holds `key`.
  bool HasPayloadForTest(const BlockKey& key);

 private:
  SpillStore();
  // Maps a write's RocksDB status; an I/O error marks writes as stopped.
  absl::Status WriteStatus(const rocksdb::Status& s, absl::string_view what);
  // After an I/O error: DB::Resume, or its error while the disk is full.
  absl::Status ResumeIfStopped();

  // RESOURCE_EXHAUSTED when writing `bytes` would leave less than
  // min_free_bytes_ free under path_.
  absl::Status CheckHeadroom(uint64_t bytes) const;

  std::string path_;
  uint64_t min_free_bytes_ = 0;
  std::atomic<bool> needs_resume_{false};

  // Declaration order matters: members are destroyed in reverse, so the
  // column family handles go before the database that owns them.
  std::unique_ptr<rocksdb::DB> db_;
  std::unique_ptr<rocksdb::ColumnFamilyHandle> default_cf_;
  std::unique_ptr<rocksdb::ColumnFamilyHandle> meta_cf_;
  std::unique_ptr<rocksdb::ColumnFamilyHandle> data_cf_;
  std::unique_ptr<rocksdb::ColumnFamilyHandle> models_cf_;
  const AtRestCipher* cipher_ = nullptr;
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_SPILL_STORE_H_
