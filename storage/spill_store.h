// The disk tier: spilled blocks' payloads in append-only segment files
// (payload_segments.h, under segments/), and a RocksDB database holding
// their meta and the service's model registration records. A payload is
// written once, into a segment file; the WAL carries only its meta.
//
// Column families (the on-disk contract):
//   "block_meta"  key: EncodeBlockKey(key) (see block_key.h)
//                 value: the meta record (below), ~70-100 bytes + parent
//                 hash; formats 4 and 5 say where in the segment files the
//                 payload is
//   "block_data"  key: EncodeBlockKey(key)
//                 value: the payload of a format 1-3 record (written by
//                 earlier versions of the store; read, never written now),
//                 exactly as committed (values of 512 bytes and more in
//                 RocksDB blob files), or in a format 3 record sealed
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
// Meta value, little-endian, format versions 1-5:
//   u8  format version (1-5)       u8  reserved (0)
//   u16 parent hash length P
//   u64 payload size               u64 payload checksum (XXH64, seed 0)
//   u64 dense_equivalent_bytes     u64 packed_k_bytes
//   u64 packed_v_bytes             u64 norms_metadata_bytes
//   u64 dense_window_bytes
//   versions 4 and 5 only: u32 segment, u32 reserved (0), u64 offset,
//                          u64 stored payload bytes (SegmentLocation)
//   P bytes parent hash
//   u64 XXH64 (seed 0) of all preceding meta bytes
// (accounting.total_bytes is the payload size and is not stored twice.)
// Versions 1-3 keep the payload in block_data; 4 and 5 in a segment file.
// Versions 3 and 5 are 2 and 4 with a sealed payload (AtRestCipher,
// at_rest_cipher.h, with the tenant's key, bound to EncodeBlockKey(key)):
// written only with a cipher, so a store without encryption writes version
// 4. Block keys, meta (sizes, checksums, parent hashes), model records and
// segment record headers stay in clear.
//
// Durability: a write appends the payloads to the segment file, then
// writes their meta. Apply(sync=true) fdatasyncs the segment file, then
// fsyncs the WAL, before returning. Writes with sync=false reach the OS
// before Apply returns, so they survive a process crash (kill -9) but not
// a power loss.
//
// Space: a payload's segment bytes become garbage when its block is
// deleted or rewritten; CollectGarbage moves the live payloads of the
// files with the most garbage to the current file and deletes those files.
// The store knows each file's live bytes once a full ScanBlocks has run
// (BlockStore's index load): collection waits for it.
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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "storage/at_rest_cipher.h"
#include "storage/block_key.h"
#include "storage/host_pool.h"
#include "storage/payload_segments.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class FileSystem;
class Status;
}  // namespace rocksdb

namespace tqkv::storage {

// Format 2 binds block checksums to their keys (BlockChecksum); format 1
// records (checksum = XXH64(payload)) are still read. Format 3 = format 2
// with the payload sealed. Formats 4 and 5: 2 and 3 with the payload in a
// segment file (the formats SpillStore writes).
inline constexpr uint8_t kDiskFormatVersion = 2;
inline constexpr uint8_t kSealedDiskFormatVersion = 3;
inline constexpr uint8_t kSegmentDiskFormatVersion = 4;
inline constexpr uint8_t kSealedSegmentDiskFormatVersion = 5;

// What the disk tier stores about a block besides its payload.
struct DiskBlockMeta {
  uint64_t size_bytes = 0;
  // BlockChecksum(key, payload); in a format 1 record XXH64(payload)
  // alone (BlockStore folds the key's tag in when it loads one).
  uint64_t checksum = 0;
  uint8_t version = kDiskFormatVersion;  // of the decoded record (not encoded from here)
  // The payload is sealed (formats 3 and 5). Set by SpillStore when it seals.
  bool sealed = false;
  // Where the payload is: in a segment file (formats 4 and 5), or, with
  // segment 0, in block_data (formats 1-3). Where, not what: operator==
  // leaves it out.
  SegmentLocation at;
  std::string parent_hash;
  BlockAccounting accounting;  // total_bytes == size_bytes
  friend bool operator==(const DiskBlockMeta& a, const DiskBlockMeta& b) {
    return a.size_bytes == b.size_bytes && a.checksum == b.checksum && a.version == b.version &&
           a.sealed == b.sealed && a.parent_hash == b.parent_hash && a.accounting == b.accounting;
  }
};

// A 64-bit tag of the key (XXH64 of its encoding).
uint64_t KeyTag(const BlockKey& key);
// The checksum of a block everywhere in storage: XXH64 of the payload xor
// the key's tag, so bytes stored or misplaced under another key fail it.
uint64_t BlockChecksum(const BlockKey& key, absl::string_view payload);

// A format 4 or 5 record when meta.at names a segment, else a format 2
// or 3 one (3 and 5: meta.sealed).
std::string EncodeDiskBlockMeta(const DiskBlockMeta& meta);
// DATA_LOSS if the bytes are truncated, fail their checksum or carry an
// unknown format version.
absl::StatusOr<DiskBlockMeta> DecodeDiskBlockMeta(absl::string_view bytes);

// The bytes a payload of `payload_bytes` takes on disk: more when sealed
// at rest (AtRestCipher::kOverheadBytes).
uint64_t StoredPayloadBytes(uint64_t payload_bytes, bool sealed);

// XXH64 of `bytes` with seed 0 (a record's own checksum; format 1 payloads).
uint64_t PayloadChecksum(absl::string_view bytes);

struct SpillStoreOptions {
  // Directory of the RocksDB database. Required.
  std::string path;
  // Create the database (and missing column families) if absent. Default: true.
  bool create_if_missing = true;
  // Memtable size of the block_data column family. Default: 64 MiB.
  uint64_t data_write_buffer_bytes = uint64_t{64} << 20;
  // Size of the blob files of block_data. Default: 64 MiB.
  uint64_t blob_file_bytes = uint64_t{64} << 20;
  // Size at which a segment file is closed and the next one started: the
  // unit of garbage collection. Default: 64 MiB.
  uint64_t segment_bytes = uint64_t{64} << 20;
  // Seals every payload written (format 3 records); records already on
  // disk are read either way. Not owned; must outlive the store. Default:
  // null (payloads stored in clear; sealed records cannot be read).
  const AtRestCipher* cipher = nullptr;
  // Where payloads read back are allocated (host_arena.h; the heap where
  // it has no room). Not owned; must outlive the store and the buffers it
  // hands out. Default: null (the heap).
  HostArena* host_arena = nullptr;
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
  // error: NOT_FOUND, DATA_LOSS for damage.
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

  // Atomically writes `writes` and deletes `deletes`: the payloads go to
  // the segment file, then every meta write and delete in one WriteBatch.
  // sync=true makes both power-loss durable before returning. `placed`
  // (may be null) receives each write's location, a hint for ReadPayload.
  // RESOURCE_EXHAUSTED (nothing written) when the disk is full or the batch
  // would leave less than min_free_bytes free.
  absl::Status Apply(absl::Span<const BlockWrite> writes, absl::Span<const BlockKey> deletes,
                     bool sync, std::vector<SegmentLocation>* placed = nullptr);

  // The stored payload of `key` in a new buffer (opened when sealed).
  // NOT_FOUND if absent; DATA_LOSS when its meta does not decode or a
  // sealed payload fails authentication; FAILED_PRECONDITION when it is
  // sealed and the store has no cipher, or not the key it was sealed with
  // (AtRestCipher::Open). Does not verify the checksum (the caller compares
  // with its index). With `hint` (where Apply or ScanBlocks said the payload
  // is: segment not 0) the payload is read from there without its meta; a
  // segment file keeps its bytes until it is deleted, after its live
  // payloads moved, so a hint reads the same bytes or finds no file, and
  // then the meta is read.
  absl::StatusOr<std::unique_ptr<HostBuffer>> ReadPayload(const BlockKey& key, const SegmentLocation& hint = {},
                                                          bool sealed = false);

  // Calls on_block for every block in block_meta, in key order, until it
  // returns false. Entries whose key or meta fail to decode are not passed
  // on; their encoded keys are appended to *corrupt_keys (may be null) for
  // DeleteEncodedKeys. The scan reads one snapshot: writes after it starts
  // are not seen. A scan to the end gives the store each segment file's
  // live bytes (CollectGarbage needs them).
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

  // The payload files' bytes (segment files and block_data's blob files),
  // and how many of them belong to deleted or overwritten payloads
  // (garbage; a segment file's is known once a full ScanBlocks has run, a
  // blob file's once a compaction has dropped the keys).
  struct PayloadSpace {
    uint64_t file_bytes = 0;
    uint64_t garbage_bytes = 0;
  };
  PayloadSpace PayloadFileSpace();

  // Frees at least `garbage_share` (0, 1] of the garbage: the live
  // payloads of the segment files with the most garbage are appended to
  // the current file (their meta updated) and those files deleted; blob
  // files' garbage goes by a compaction of block_data that rewrites the
  // oldest files. Blocks until done; reads and writes go on meanwhile
  // (writes wait while a batch of payloads moves). Nothing collects garbage
  // by itself: the store's owner calls this when PayloadFileSpace shows
  // enough of it. RESOURCE_EXHAUSTED (nothing done) when rewriting those
  // files' live payloads would leave less than min_free_bytes free;
  // CANCELLED once CancelGarbageCollection was called.
  absl::Status CollectGarbage(double garbage_share);
  // Stops a CollectGarbage in progress (it returns CANCELLED soon, what it
  // moved kept) and refuses later ones: for a shutdown, which must not wait
  // for a rewrite of the whole disk tier.
  void CancelGarbageCollection();

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
  // bypassing every check, to simulate on-disk corruption (a payload: the
  // bytes appended to the segment files, the meta pointed at them).
  absl::Status OverwritePayloadForTest(const BlockKey& key, absl::string_view bytes);
  absl::Status OverwriteMetaForTest(const BlockKey& key, absl::string_view bytes);
  // True iff a payload of `key` is stored (its meta points into an existing
  // segment file, or block_data holds it).
  bool HasPayloadForTest(const BlockKey& key);

 private:
  SpillStore();
  // Maps a write's RocksDB status; an I/O error marks writes as stopped.
  absl::Status WriteStatus(const rocksdb::Status& s, absl::string_view what);
  // An I/O error in the store's words: "disk tier at PATH is full" for
  // RESOURCE_EXHAUSTED, "disk tier at PATH: ..." for UNAVAILABLE.
  absl::Status DiskError(const absl::Status& s) const;
  // After an I/O error: DB::Resume, or its error while the disk is full.
  absl::Status ResumeIfStopped();

  // RESOURCE_EXHAUSTED when writing `bytes` would leave less than
  // min_free_bytes_ free under path_.
  absl::Status CheckHeadroom(uint64_t bytes) const;

  // The stored metas of `keys` (encoded): nullopt where absent or damaged.
  absl::StatusOr<std::vector<std::optional<DiskBlockMeta>>> ReadMetas(absl::Span<const std::string> keys);
  // A block's meta and its stored payload bytes (sealed ones as sealed).
  absl::StatusOr<std::pair<DiskBlockMeta, std::unique_ptr<HostBuffer>>> ReadStored(const BlockKey& key);
  // The payload at `at` in a new buffer: NOT_FOUND when its file was
  // collected (the meta says where it went); other errors name `key`.
  absl::StatusOr<std::unique_ptr<HostBuffer>> ReadAt(const BlockKey& key, const SegmentLocation& at);
  // Adds `bytes` to (or takes them from) a segment file's live bytes.
  void CountLive(uint32_t segment, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tally_mu_);
  // A segment file's garbage and live bytes.
  struct SegmentGarbage {
    uint32_t segment;
    uint64_t garbage, live;
  };
  // The files of `files` (not the one appended to) holding garbage; none
  // while the live bytes are not known.
  std::vector<SegmentGarbage> SegmentGarbageLocked(const PayloadSegments::FileSizes& files)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(tally_mu_);
  // Blob files (block_data) and segment files: CollectGarbage's halves.
  absl::Status CollectBlobFileGarbage(double garbage_share);
  absl::Status CollectSegmentGarbage(double garbage_share);
  // Moves the live ones of `records` (of one segment file) to the current
  // file, their meta updated, in one write.
  absl::Status MoveLive(absl::Span<const PayloadSegments::Contents::Entry> records);

  std::string path_;
  uint64_t min_free_bytes_ = 0;
  std::atomic<bool> needs_resume_{false};
  std::atomic<bool> gc_cancelled_{false};

  std::shared_ptr<rocksdb::FileSystem> fs_;
  std::unique_ptr<PayloadSegments> segments_;
  // Writes hold it shared; moving payloads between segment files holds it
  // exclusively, so a write or delete never races a move of its key.
  absl::Mutex apply_mu_;
  // Each segment file's live record bytes (SegmentRecordBytes), known once
  // a scan of every meta has completed (live_known_). A scan in progress
  // collects what writes change meanwhile in scan_delta_.
  absl::Mutex tally_mu_;
  absl::flat_hash_map<uint32_t, int64_t> live_ ABSL_GUARDED_BY(tally_mu_);
  bool live_known_ ABSL_GUARDED_BY(tally_mu_) = false;
  bool scanning_ ABSL_GUARDED_BY(tally_mu_) = false;
  absl::flat_hash_map<uint32_t, int64_t> scan_delta_ ABSL_GUARDED_BY(tally_mu_);

  // Declaration order matters: members are destroyed in reverse, so the
  // column family handles go before the database that owns them.
  std::unique_ptr<rocksdb::DB> db_;
  std::unique_ptr<rocksdb::ColumnFamilyHandle> default_cf_;
  std::unique_ptr<rocksdb::ColumnFamilyHandle> meta_cf_;
  std::unique_ptr<rocksdb::ColumnFamilyHandle> data_cf_;
  std::unique_ptr<rocksdb::ColumnFamilyHandle> models_cf_;
  const AtRestCipher* cipher_ = nullptr;
  HostArena* host_arena_ = nullptr;
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_SPILL_STORE_H_
