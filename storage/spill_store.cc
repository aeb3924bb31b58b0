#include "storage/spill_store.h"

#include <sys/statvfs.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/table.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/listener.h"
#include "rocksdb/metadata.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/write_batch.h"
#include "storage/rocksdb_log.h"

namespace tqkv::storage {
namespace {

constexpr char kMetaCf[] = "block_meta";
constexpr char kDataCf[] = "block_data";
constexpr char kModelsCf[] = "models";
constexpr size_t kMetaFixedBytes = 1 + 1 + 2 + 8 + 8 + 5 * 8;
constexpr size_t kLocationBytes = 4 + 4 + 8 + 8;
constexpr char kSegmentDir[] = "segments";

// Turns off RocksDB's own recovery from a full disk (a thread that waits
// for its SstFileManager to see free space; it did not finish in 30 s
// after space returned on a tmpfs): SpillStore resumes writes itself,
// on the next write after one failed (ResumeIfStopped).
class NoAutoRecovery final : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
};

// DATA_LOSS for a database RocksDB finds damaged, with the repair path.
absl::Status Damaged(absl::string_view path, const rocksdb::Status& s) {
  return absl::DataLossError(absl::StrCat(
      "disk tier at ", path, " is damaged (", s.ToString(),
      "); to keep what is intact, stop the server and run: tqkv-disk-repair ", path,
      " (or move the directory away to start with an empty disk tier)"));
}

// The store's column families, for Open and Repair. Payloads are written
// once, into segment files (payload_segments.h), and read with one
// positioned read into the caller's buffer: with payloads in RocksDB's
// integrated blob files every byte went to the WAL and again to a blob
// file at flush, each pass with a software CRC32C (Debian's build); a
// profile of a 256 KiB fill had half its write CPU in the WAL's copy. With
// segments (`disk_tier_bench`, build machine, bench/RESULTS.md "Disk tier
// at scale"): 256 KiB spills 0.57-0.88 of the device's fdatasync'd
// sequential writes (blob files: 0.29-0.31), cold Gets 0.49-0.63 of its
// random reads (0.34); 17 KiB spills 0.53-0.70, Gets 0.52-0.64. block_data keeps the payloads of earlier-format records
// (read, deleted, never written): no compression (packed pages do not
// compress), values of 512 bytes and more in blob files, whose garbage
// compactions do not collect by themselves (CollectBlobFileGarbage).
// RepairDB does not carry blob files over (facebook/rocksdb#13090): Repair
// salvages their payloads itself.
std::vector<rocksdb::ColumnFamilyDescriptor> ColumnFamilies(const SpillStoreOptions& options) {
  rocksdb::ColumnFamilyOptions data_options;
  data_options.compression = rocksdb::kNoCompression;
  data_options.bottommost_compression = rocksdb::kNoCompression;
  data_options.write_buffer_size = options.data_write_buffer_bytes;
  data_options.enable_blob_files = true;
  data_options.min_blob_size = 512;
  data_options.blob_file_size = options.blob_file_bytes;
  data_options.enable_blob_garbage_collection = false;
  // Every write and delete first reads the meta it replaces (its segment
  // bytes become garbage), most often of a key that is not there: Bloom
  // filters on the tables and the memtable answer those misses.
  rocksdb::ColumnFamilyOptions meta_options;
  rocksdb::BlockBasedTableOptions meta_tables;
  meta_tables.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  meta_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(meta_tables));
  meta_options.memtable_prefix_bloom_size_ratio = 0.05;
  meta_options.memtable_whole_key_filtering = true;
  return {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {kMetaCf, meta_options},
      {kDataCf, data_options},
      {kModelsCf, rocksdb::ColumnFamilyOptions()},
  };
}

rocksdb::Slice ToSlice(absl::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(std::string(what.data(), what.size()), ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsNoSpace() || s.IsMemoryLimit()) return absl::ResourceExhaustedError(msg);
  // Writes refused while RocksDB holds a background error (a full disk
  // seen by a flush, or a failed WAL write) may succeed once it resumes.
  if (s.IsIOError()) return absl::UnavailableError(msg);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) return absl::UnavailableError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

void PutFixed64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Where Repair moves the blob files before RepairDB, which would drop them
// (the database it rebuilds does not list them, and the next Open deletes
// unlisted files); removed once their payloads are back.
constexpr char kBlobSalvageDir[] = "blob_salvage";

// The blob files (*.blob) directly in dir, in name order: zero-padded
// file numbers, so oldest first.
absl::StatusOr<std::vector<std::filesystem::path>> BlobFilesIn(const std::filesystem::path& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".blob") files.push_back(e.path());
  if (ec) return absl::UnavailableError(absl::StrCat("listing ", dir.string(), ": ", ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

// Moves dir's blob files (NNNNNN.blob) into dir/kBlobSalvageDir.
absl::Status SetBlobFilesAside(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path aside = std::filesystem::path(dir) / kBlobSalvageDir;
  std::filesystem::create_directories(aside, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("creating ", aside.string(), ": ", ec.message()));
  TQ_ASSIGN_OR_RETURN(const std::vector<std::filesystem::path> blobs, BlobFilesIn(dir));
  for (const std::filesystem::path& b : blobs) {
    // A repair cut short may have set aside a file of the same number (a
    // rebuilt database numbers its files anew): both are kept.
    std::filesystem::path to = aside / b.filename();
    for (int n = 1; std::filesystem::exists(to, ec); ++n)
      to = aside / absl::StrCat(b.stem().string(), ".", n, ".blob");
    std::filesystem::rename(b, to, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("moving ", b.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

// Calls fn(key, value) for every whole record of the blob files in dir,
// oldest file first (RocksDB's blob log format: a 30-byte header starting
// with the magic number 0x00248f37; records of a 32-byte header — u64 key
// length, u64 value length, u64 expiration, u32 header CRC, u32 blob CRC —
// then the key and the value; a 32-byte footer). A file's reading stops at
// the first record that does not fit (a file cut short). The caller checks
// values against the block's own checksum, not RocksDB's CRCs.
absl::Status ForEachBlobRecord(const std::filesystem::path& dir,
                               absl::FunctionRef<void(absl::string_view, absl::string_view)> fn) {
  TQ_ASSIGN_OR_RETURN(const std::vector<std::filesystem::path> files, BlobFilesIn(dir));
  constexpr size_t kHeader = 30, kRecordHeader = 32;
  for (const std::filesystem::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return absl::UnavailableError(absl::StrCat("reading ", f.string()));
    if (bytes.size() < kHeader || (GetFixed64(bytes.data()) & 0xffffffffu) != 0x00248f37u) continue;
    for (size_t at = kHeader; bytes.size() - at >= kRecordHeader;) {
      const uint64_t key_len = GetFixed64(bytes.data() + at), value_len = GetFixed64(bytes.data() + at + 8);
      const uint64_t left = bytes.size() - at - kRecordHeader;
      if (key_len > left || value_len > left - key_len) break;
      const char* k = bytes.data() + at + kRecordHeader;
      fn(absl::string_view(k, key_len), absl::string_view(k + key_len, value_len));
      at += kRecordHeader + key_len + value_len;
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t PayloadChecksum(absl::string_view bytes) {
  return XXH64(bytes.data(), bytes.size(), /*seed=*/0);
}

uint64_t StoredPayloadBytes(uint64_t payload_bytes, bool sealed) {
  return payload_bytes + (sealed ? AtRestCipher::kOverheadBytes : 0);
}

uint64_t KeyTag(const BlockKey& key) {
  const std::string k = EncodeBlockKey(key);
  return XXH64(k.data(), k.size(), /*seed=*/0x6b6579);
}

uint64_t BlockChecksum(const BlockKey& key, absl::string_view payload) {
  return PayloadChecksum(payload) ^ KeyTag(key);
}

std::string EncodeDiskBlockMeta(const DiskBlockMeta& m) {
  const bool located = m.at.segment != 0;
  std::string out;
  out.reserve(kMetaFixedBytes + kLocationBytes + m.parent_hash.size() + 8);
  const uint8_t version = located ? (m.sealed ? kSealedSegmentDiskFormatVersion : kSegmentDiskFormatVersion)
                                        : (m.sealed ? kSealedDiskFormatVersion : kDiskFormatVersion);
  out.push_back(static_cast<char>(version));
  out.push_back(0);
  uint16_t plen = static_cast<uint16_t>(m.parent_hash.size());
  out.push_back(static_cast<char>(plen & 0xff));
  out.push_back(static_cast<char>(plen >> 8));
  PutFixed64(&out, m.size_bytes);
  PutFixed64(&out, m.checksum);
  PutFixed64(&out, m.accounting.dense_equivalent_bytes);
  PutFixed64(&out, m.accounting.packed_k_bytes);
  PutFixed64(&out, m.accounting.packed_v_bytes);
  PutFixed64(&out, m.accounting.norms_metadata_bytes);
  PutFixed64(&out, m.accounting.dense_window_bytes);
  if (located) {
    PutFixed64(&out, m.at.segment);  // u32 segment, u32 reserved (0)
    PutFixed64(&out, m.at.offset);
    PutFixed64(&out, m.at.bytes);
  }
  out.append(m.parent_hash);
  PutFixed64(&out, PayloadChecksum(out));
  return out;
}

absl::StatusOr<DiskBlockMeta> DecodeDiskBlockMeta(absl::string_view in) {
  if (in.size() < kMetaFixedBytes + 8) return absl::DataLossError("block meta is truncated");
  const uint8_t version = static_cast<uint8_t>(in[0]);
  if (version < 1 || version > kSealedSegmentDiskFormatVersion) {
    return absl::DataLossError(absl::StrCat("unknown block meta format version ", version));
  }
  const bool located = version >= kSegmentDiskFormatVersion;
  const size_t fixed = kMetaFixedBytes + (located ? kLocationBytes : 0);
  const char* p = in.data();
  size_t plen = static_cast<uint8_t>(p[2]) | (static_cast<size_t>(static_cast<uint8_t>(p[3])) << 8);
  if (in.size() != fixed + plen + 8) {
    return absl::DataLossError("block meta has the wrong length");
  }
  if (GetFixed64(p + fixed + plen) != PayloadChecksum(in.substr(0, fixed + plen))) {
    return absl::DataLossError("block meta fails its checksum");
  }
  DiskBlockMeta m;
  m.version = version;
  m.sealed = version == kSealedDiskFormatVersion || version == kSealedSegmentDiskFormatVersion;
  m.size_bytes = GetFixed64(p + 4);
  m.checksum = GetFixed64(p + 12);
  m.accounting.dense_equivalent_bytes = GetFixed64(p + 20);
  m.accounting.packed_k_bytes = GetFixed64(p + 28);
  m.accounting.packed_v_bytes = GetFixed64(p + 36);
  m.accounting.norms_metadata_bytes = GetFixed64(p + 44);
  m.accounting.dense_window_bytes = GetFixed64(p + 52);
  m.accounting.total_bytes = m.size_bytes;
  if (located) {
    const uint64_t segment = GetFixed64(p + kMetaFixedBytes);
    if (segment == 0 || segment > UINT32_MAX) return absl::DataLossError("block meta names no segment file");
    m.at = SegmentLocation{static_cast<uint32_t>(segment), GetFixed64(p + kMetaFixedBytes + 8),
                           GetFixed64(p + kMetaFixedBytes + 16)};
  }
  m.parent_hash = std::string(p + fixed, plen);
  return m;
}

SpillStore::SpillStore() = default;
// A clean close writes the memtables to table files, so the next Open has
// no WAL to replay (replay rebuilds every memtable in memory and writes it
// out before Open returns: ~80% of a 100K-block restart). Where the flush
// fails (a full disk) the WAL still holds everything and is replayed.
SpillStore::~SpillStore() {
  if (db_ == nullptr) return;
  rocksdb::FlushOptions flush;
  flush.allow_write_stall = true;
  const rocksdb::Status s =
      db_->Flush(flush, {default_cf_.get(), meta_cf_.get(), data_cf_.get(), models_cf_.get()});
  (void)s;  // nothing is lost either way: what the flush did not write stays in the WAL
}

absl::StatusOr<std::unique_ptr<SpillStore>> SpillStore::Open(const SpillStoreOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("SpillStore needs a path");
  // Buffered I/O (the page cache): direct reads measured no faster (cold
  // 256 KiB Gets 534 MB/s, within the buffered runs' 564-691), and direct
  // flushes and compactions made spills 5x slower (61 MB/s).
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = options.create_if_missing;
  // An existing database lacks a column family when nothing was ever written
  // to it and a repair rebuilt the database (RepairDB recreates only the
  // families its table files name): created empty.
  db_options.create_missing_column_families = true;
  if (options.create_if_missing) {
    std::error_code ec;
    std::filesystem::create_directories(options.path, ec);  // DB::Open reports failures
  }
  db_options.info_log = RocksDbLog::Open(options.path + "/LOG");
  db_options.listeners.push_back(std::make_shared<NoAutoRecovery>());
  if (options.env != nullptr) db_options.env = options.env;
  db_options.wal_recovery_mode = options.wal_recovery == SpillStoreOptions::WalRecovery::kStrict
                                     ? rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords
                                     : rocksdb::WALRecoveryMode::kPointInTimeRecovery;

  const std::vector<rocksdb::ColumnFamilyDescriptor> cfs = ColumnFamilies(options);
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options.path, cfs, &handles, &raw);
  if (s.IsCorruption()) return Damaged(options.path, s);
  if (!s.ok()) return FromRocks(s, absl::StrCat("opening RocksDB at ", options.path));
  std::unique_ptr<SpillStore> store(new SpillStore());
  store->db_.reset(raw);
  store->default_cf_.reset(handles[0]);
  store->meta_cf_.reset(handles[1]);
  store->data_cf_.reset(handles[2]);
  store->models_cf_.reset(handles[3]);
  store->cipher_ = options.cipher;
  store->host_arena_ = options.host_arena;
  store->path_ = options.path;
  store->min_free_bytes_ = options.min_free_bytes;
  store->fs_ = options.env != nullptr ? options.env->GetFileSystem() : rocksdb::FileSystem::Default();
  absl::StatusOr<std::unique_ptr<PayloadSegments>> segments =
      PayloadSegments::Open(options.path + "/" + kSegmentDir, store->fs_.get(), options.segment_bytes);
  if (!segments.ok()) return segments.status();
  store->segments_ = *std::move(segments);
  return store;
}

absl::StatusOr<SpillStore::RepairReport> SpillStore::Repair(const SpillStoreOptions& options) {
  RepairReport report;
  SpillStoreOptions keep = options;
  keep.create_if_missing = false;
  keep.wal_recovery = SpillStoreOptions::WalRecovery::kKeepIntact;
  auto rebuild = [&]() -> absl::Status {
    TQ_RETURN_IF_ERROR(SetBlobFilesAside(options.path));
    rocksdb::DBOptions db_options;
    db_options.info_log = RocksDbLog::Open(options.path + "/LOG");
    if (options.env != nullptr) db_options.env = options.env;
    report.rebuilt = true;
    return FromRocks(rocksdb::RepairDB(options.path, db_options, ColumnFamilies(options)),
                     absl::StrCat("rebuilding RocksDB at ", options.path));
  };

  std::unique_ptr<SpillStore> store;
  std::vector<std::pair<BlockKey, DiskBlockMeta>> blocks;
  std::vector<std::string> corrupt;
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::unique_ptr<SpillStore>> opened = Open(keep);
    absl::Status scanned = opened.status();
    if (opened.ok()) {
      blocks.clear();
      corrupt.clear();
      scanned = (*opened)->ScanBlocks(
          [&](BlockKey key, DiskBlockMeta meta) {
            blocks.emplace_back(std::move(key), std::move(meta));
            return true;
          },
          &corrupt);
    }
    if (scanned.ok()) {
      store = *std::move(opened);
      break;
    }
    if (opened.ok()) opened->reset();  // closed before the rebuild
    if (!absl::IsDataLoss(scanned) || attempt == 1) return scanned;
    TQ_RETURN_IF_ERROR(rebuild());
  }

  // A payload is good when it has the meta's size and checksum (opened
  // first when sealed); a sealed one without the cipher when it reads at
  // all (kept unverified: opening it later authenticates it). A cipher
  // that cannot open it for another reason than damage (a key file without
  // its key) fails the repair: it says nothing about the block.
  auto good_payload = [&](const BlockKey& key, const DiskBlockMeta& meta,
                          absl::string_view stored) -> absl::StatusOr<bool> {
    if (meta.sealed && options.cipher == nullptr) return true;
    std::unique_ptr<HostBuffer> opened;
    absl::string_view plain = stored;
    if (meta.sealed) {
      absl::StatusOr<std::unique_ptr<HostBuffer>> o = options.cipher->Open(key.tenant, EncodeBlockKey(key), stored);
      if (absl::IsDataLoss(o.status())) return false;
      if (!o.ok()) return o.status();
      opened = *std::move(o);
      plain = opened->view();
    }
    return plain.size() == meta.size_bytes &&
           (meta.version == 1 ? PayloadChecksum(plain) : BlockChecksum(key, plain)) == meta.checksum;
  };
  auto count_kept = [&](const DiskBlockMeta& meta) {
    (meta.sealed && options.cipher == nullptr ? report.unverified_blocks : report.intact_blocks)++;
  };
  std::vector<size_t> damaged;  // indices into blocks
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& [key, meta] = blocks[i];
    absl::StatusOr<std::string> stored = store->ReadStoredPayload(key);
    if (!stored.ok() && !absl::IsDataLoss(stored.status()) && !absl::IsNotFound(stored.status()))
      return stored.status();  // an I/O error says nothing about the block
    bool good = false;
    if (stored.ok()) {
      TQ_ASSIGN_OR_RETURN(good, good_payload(key, meta, *stored));
    }
    if (good) {
      count_kept(meta);
    } else {
      damaged.push_back(i);
    }
  }
  // Payloads of damaged blocks, from the blob files a rebuild set aside.
  const std::filesystem::path aside = std::filesystem::path(options.path) / kBlobSalvageDir;
  std::error_code ec;
  if (std::filesystem::exists(aside, ec)) {
    absl::flat_hash_map<std::string, size_t> wanted;  // encoded key → index into blocks
    for (size_t i : damaged) wanted[EncodeBlockKey(blocks[i].first)] = i;
    absl::flat_hash_map<size_t, std::string> found;
    absl::Status opened = absl::OkStatus();
    TQ_RETURN_IF_ERROR(ForEachBlobRecord(aside, [&](absl::string_view k, absl::string_view value) {
      auto it = wanted.find(k);
      if (it == wanted.end() || !opened.ok()) return;
      const auto& [key, meta] = blocks[it->second];
      absl::StatusOr<bool> good = good_payload(key, meta, value);
      if (!good.ok()) opened = good.status();
      if (good.ok() && *good) found[it->second] = std::string(value);  // a newer copy replaces it
    }));
    TQ_RETURN_IF_ERROR(opened);
    rocksdb::WriteBatch batch;
    for (const auto& [i, value] : found) {
      const rocksdb::Status s = batch.Put(store->data_cf_.get(), EncodeBlockKey(blocks[i].first), ToSlice(value));
      if (!s.ok()) return FromRocks(s, "building the salvage batch");
    }
    rocksdb::WriteOptions wo;
    wo.sync = true;
    TQ_RETURN_IF_ERROR(store->WriteStatus(store->db_->Write(wo, &batch), "writing salvaged payloads"));
    for (const auto& [i, value] : found) {
      count_kept(blocks[i].second);
      report.salvaged_blocks++;
    }
    std::erase_if(damaged, [&](size_t i) { return found.contains(i); });
  }
  std::vector<BlockKey> damaged_keys;
  for (size_t i : damaged) damaged_keys.push_back(blocks[i].first);
  TQ_RETURN_IF_ERROR(store->DeleteEncodedKeys(corrupt));
  TQ_RETURN_IF_ERROR(store->Apply({}, damaged_keys, /*sync=*/true));
  report.dropped_blocks = corrupt.size() + damaged_keys.size();
  TQ_ASSIGN_OR_RETURN(std::vector<ModelRecord> models, store->ListModelRecords());
  report.model_records = models.size();
  TQ_RETURN_IF_ERROR(store->SyncWal());
  std::filesystem::remove_all(aside, ec);  // the salvaged payloads are in the database now
  return report;
}

absl::Status SpillStore::WriteStatus(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsIOError()) needs_resume_.store(true, std::memory_order_relaxed);
  const absl::Status st = FromRocks(s, what);  // NoSpace: RESOURCE_EXHAUSTED; other I/O errors: UNAVAILABLE
  return s.IsIOError() ? DiskError(st) : st;
}

absl::Status SpillStore::DiskError(const absl::Status& s) const {
  if (absl::IsResourceExhausted(s))
    return absl::ResourceExhaustedError(absl::StrCat("disk tier at ", path_, " is full: ", s.message()));
  if (absl::IsUnavailable(s)) return absl::UnavailableError(absl::StrCat("disk tier at ", path_, ": ", s.message()));
  return s;
}

absl::Status SpillStore::ResumeIfStopped() {
  if (!needs_resume_.load(std::memory_order_relaxed)) return absl::OkStatus();
  // Flushes the memtables to new files and starts a new WAL; fails (and
  // writes stay stopped) while the disk is still full.
  rocksdb::Status s = db_->Resume();
  if (s.ok()) {
    needs_resume_.store(false, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  return WriteStatus(s, "resuming writes after a disk error");
}

absl::Status SpillStore::CheckHeadroom(uint64_t bytes) const {
  if (min_free_bytes_ == 0) return absl::OkStatus();
  struct statvfs fs {};
  if (::statvfs(path_.c_str(), &fs) != 0)
    return absl::UnavailableError(absl::StrCat("disk tier at ", path_, ": statvfs: ", std::strerror(errno)));
  const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free >= bytes && free - bytes >= min_free_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("disk tier at ", path_, " has ", free, " bytes free; writing ", bytes,
                                                   " more would leave less than --disk_min_free_bytes ",
                                                   min_free_bytes_));
}

absl::StatusOr<std::vector<std::optional<DiskBlockMeta>>> SpillStore::ReadMetas(absl::Span<const std::string> keys) {
  std::vector<std::optional<DiskBlockMeta>> out(keys.size());
  if (keys.empty()) return out;
  std::vector<rocksdb::Slice> slices;
  slices.reserve(keys.size());
  for (const std::string& k : keys) slices.emplace_back(k);
  std::vector<rocksdb::PinnableSlice> values(keys.size());
  std::vector<rocksdb::Status> statuses(keys.size());
  db_->MultiGet(rocksdb::ReadOptions(), meta_cf_.get(), keys.size(), slices.data(), values.data(), statuses.data());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (statuses[i].IsNotFound()) continue;
    if (!statuses[i].ok()) return FromRocks(statuses[i], "reading block meta");
    absl::StatusOr<DiskBlockMeta> meta = DecodeDiskBlockMeta(absl::string_view(values[i].data(), values[i].size()));
    if (meta.ok()) out[i] = *std::move(meta);  // else damaged: what it pointed at is unknown
  }
  return out;
}

void SpillStore::CountLive(uint32_t segment, int64_t bytes) {
  if (live_known_) live_[segment] += bytes;
  if (scanning_) scan_delta_[segment] += bytes;
}

absl::Status SpillStore::Apply(absl::Span<const BlockWrite> writes,
                               absl::Span<const BlockKey> deletes, bool sync, std::vector<SegmentLocation>* placed) {
  if (writes.empty() && deletes.empty()) return absl::OkStatus();
  uint64_t bytes = 0;
  for (const BlockWrite& w : writes) bytes += w.payload.size() + 128;  // meta, keys, headers
  if (!writes.empty()) TQ_RETURN_IF_ERROR(CheckHeadroom(bytes));
  // keys: the writes', then the deletes'.
  std::vector<std::string> keys;
  keys.reserve(writes.size() + deletes.size());
  for (const BlockWrite& w : writes) keys.push_back(EncodeBlockKey(*w.key));
  for (const BlockKey& k : deletes) keys.push_back(EncodeBlockKey(k));
  std::vector<std::string> sealed(cipher_ != nullptr ? writes.size() : 0);
  std::vector<PayloadSegments::Record> records;
  records.reserve(writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    absl::string_view stored = writes[i].payload;
    if (cipher_ != nullptr) {
      absl::StatusOr<std::string> s = cipher_->Seal(writes[i].key->tenant, keys[i], stored);
      if (!s.ok()) return s.status();
      sealed[i] = *std::move(s);
      stored = sealed[i];
    }
    records.push_back({keys[i], stored});
  }
  TQ_RETURN_IF_ERROR(ResumeIfStopped());

  absl::ReaderMutexLock apply(&apply_mu_);
  // What the writes replace and the deletes remove: their segment bytes
  // become garbage, their block_data payloads are deleted.
  TQ_ASSIGN_OR_RETURN(const std::vector<std::optional<DiskBlockMeta>> old, ReadMetas(keys));
  absl::StatusOr<std::vector<SegmentLocation>> appended = segments_->Append(records, sync);
  if (!appended.ok()) return DiskError(appended.status());
  const std::vector<SegmentLocation>& at = *appended;
  rocksdb::WriteBatch batch;
  for (size_t i = 0; i < keys.size(); ++i) {
    rocksdb::Status s;
    if (i < writes.size()) {
      DiskBlockMeta m = *writes[i].meta;
      m.sealed = cipher_ != nullptr;
      m.at = at[i];
      s = batch.Put(meta_cf_.get(), keys[i], EncodeDiskBlockMeta(m));
    } else {
      s = batch.Delete(meta_cf_.get(), keys[i]);
    }
    // A format 1-3 record's payload (or damaged meta: it may have one).
    if (s.ok() && (i >= writes.size() || (old[i].has_value() && old[i]->at.segment == 0)))
      s = batch.Delete(data_cf_.get(), keys[i]);
    if (!s.ok()) return FromRocks(s, "building spill batch");
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  // A failed write leaves its appended payloads unreferenced: garbage.
  TQ_RETURN_IF_ERROR(WriteStatus(db_->Write(wo, &batch), "writing spill batch"));
  if (placed != nullptr) *placed = at;
  absl::MutexLock l(&tally_mu_);
  for (size_t i = 0; i < writes.size(); ++i)
    CountLive(at[i].segment, static_cast<int64_t>(SegmentRecordBytes(keys[i].size(), at[i].bytes)));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (old[i].has_value() && old[i]->at.segment != 0)
      CountLive(old[i]->at.segment, -static_cast<int64_t>(SegmentRecordBytes(keys[i].size(), old[i]->at.bytes)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostBuffer>> SpillStore::ReadAt(const BlockKey& key, const SegmentLocation& at) {
  TQ_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> bytes, HostBuffer::Allocate(at.bytes, host_arena_));
  const absl::Status read = segments_->Read(at, reinterpret_cast<char*>(bytes->data()));
  if (read.ok()) return bytes;
  if (absl::IsNotFound(read)) return read;
  return absl::Status(read.code(), absl::StrCat("reading block ", DebugString(key), ": ", read.message()));
}

absl::StatusOr<std::pair<DiskBlockMeta, std::unique_ptr<HostBuffer>>> SpillStore::ReadStored(const BlockKey& key) {
  const std::string k = EncodeBlockKey(key);
  // Once more if a garbage collection moved the payload between reading
  // its meta and its bytes.
  for (int attempt = 0;; ++attempt) {
    rocksdb::PinnableSlice meta_bytes;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_cf_.get(), k, &meta_bytes);
    if (!s.ok()) return FromRocks(s, absl::StrCat("reading block ", DebugString(key)));
    TQ_ASSIGN_OR_RETURN(DiskBlockMeta m, DecodeDiskBlockMeta(absl::string_view(meta_bytes.data(), meta_bytes.size())));
    if (m.at.segment == 0) {
      // Every reader checks the payload against the meta's checksum (bound
      // to the key), so RocksDB's own CRC32C of the same bytes (computed in
      // software by Debian's build) is skipped.
      rocksdb::ReadOptions data_read;
      data_read.verify_checksums = false;
      rocksdb::PinnableSlice value;
      s = db_->Get(data_read, data_cf_.get(), k, &value);
      if (!s.ok()) return FromRocks(s, absl::StrCat("reading block ", DebugString(key)));
      TQ_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> bytes,
                          HostBuffer::CopyOf(absl::string_view(value.data(), value.size()), host_arena_));
      return std::make_pair(std::move(m), std::move(bytes));
    }
    // A stored length far from the meta's is damage, not an allocation to try.
    if (m.at.bytes != StoredPayloadBytes(m.size_bytes, m.sealed))
      return absl::DataLossError(absl::StrCat("block ", DebugString(key), ": stored ", m.at.bytes,
                                              " bytes where its meta says ", StoredPayloadBytes(m.size_bytes, m.sealed)));
    absl::StatusOr<std::unique_ptr<HostBuffer>> bytes = ReadAt(key, m.at);
    if (absl::IsNotFound(bytes.status()) && attempt == 0) continue;
    if (!bytes.ok()) return bytes.status();
    return std::make_pair(std::move(m), *std::move(bytes));
  }
}

absl::StatusOr<std::string> SpillStore::ReadStoredPayload(const BlockKey& key) {
  TQ_ASSIGN_OR_RETURN(auto stored, ReadStored(key));
  return std::string(stored.second->view());
}

absl::StatusOr<std::unique_ptr<HostBuffer>> SpillStore::ReadPayload(const BlockKey& key, const SegmentLocation& hint,
                                                                    bool sealed) {
  std::unique_ptr<HostBuffer> bytes;
  if (hint.segment != 0) {
    absl::StatusOr<std::unique_ptr<HostBuffer>> read = ReadAt(key, hint);
    if (!read.ok() && !absl::IsNotFound(read.status())) return read.status();
    if (read.ok()) bytes = *std::move(read);  // else collected: the meta says where the payload went
  }
  if (bytes == nullptr) {
    TQ_ASSIGN_OR_RETURN(auto stored, ReadStored(key));
    bytes = std::move(stored.second);
    sealed = stored.first.sealed;
  }
  if (!sealed) return std::move(bytes);
  if (cipher_ == nullptr)
    return absl::FailedPreconditionError(absl::StrCat(
        "block ", DebugString(key), " is encrypted at rest and the store has no key (--at_rest_key_file)"));
  absl::StatusOr<std::unique_ptr<HostBuffer>> open = cipher_->Open(key.tenant, EncodeBlockKey(key), bytes->view(), host_arena_);
  if (!open.ok() && absl::IsDataLoss(open.status()) && hint.segment != 0)
    return ReadPayload(key);  // the hint's sealed flag or place was stale: the meta decides
  if (!open.ok())
    return absl::Status(open.status().code(), absl::StrCat("block ", DebugString(key), ": ", open.status().message()));
  return open;
}

absl::Status SpillStore::ScanBlocks(absl::FunctionRef<bool(BlockKey, DiskBlockMeta)> on_block,
                                    std::vector<std::string>* corrupt_keys) {
  // One pass in key order: large reads ahead, and the table blocks kept
  // out of the block cache (the scan would evict what reads need).
  rocksdb::ReadOptions scan;
  scan.fill_cache = false;
  scan.readahead_size = size_t{4} << 20;
  {
    // The snapshot and the start of scan_delta_ at one point between writes.
    absl::WriterMutexLock apply(&apply_mu_);
    scan.snapshot = db_->GetSnapshot();
    absl::MutexLock l(&tally_mu_);
    scanning_ = true;
    scan_delta_.clear();
  }
  absl::flat_hash_map<uint32_t, int64_t> live;
  bool whole = false;
  absl::Status status = [&]() -> absl::Status {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(scan, meta_cf_.get()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      absl::string_view raw_key(it->key().data(), it->key().size());
      absl::StatusOr<BlockKey> key = DecodeBlockKey(raw_key);
      absl::StatusOr<DiskBlockMeta> meta = DecodeDiskBlockMeta(absl::string_view(it->value().data(), it->value().size()));
      if (!key.ok() || !meta.ok()) {
        if (corrupt_keys != nullptr) corrupt_keys->emplace_back(raw_key);
        continue;
      }
      if (meta->at.segment != 0)
        live[meta->at.segment] += static_cast<int64_t>(SegmentRecordBytes(raw_key.size(), meta->at.bytes));
      if (!on_block(*std::move(key), *std::move(meta))) return absl::OkStatus();
    }
    if (it->status().IsCorruption()) return Damaged(path_, it->status());
    TQ_RETURN_IF_ERROR(FromRocks(it->status(), "scanning block meta"));
    whole = true;
    return absl::OkStatus();
  }();
  db_->ReleaseSnapshot(scan.snapshot);
  const PayloadSegments::FileSizes files = segments_->Files();
  absl::MutexLock l(&tally_mu_);
  scanning_ = false;
  if (whole) {
    for (const auto& [segment, bytes] : scan_delta_) live[segment] += bytes;
    // Files collected during the scan: nothing lives there any more.
    absl::erase_if(live, [&](const auto& e) { return !files.bytes.contains(e.first); });
    live_ = std::move(live);
    live_known_ = true;
  }
  return status;
}

absl::StatusOr<DiskBlockMeta> SpillStore::ReadMeta(const BlockKey& key) {
  rocksdb::PinnableSlice bytes;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), meta_cf_.get(), EncodeBlockKey(key), &bytes);
  if (!s.ok()) return FromRocks(s, absl::StrCat("reading the meta of block ", DebugString(key)));
  return DecodeDiskBlockMeta(absl::string_view(bytes.data(), bytes.size()));
}

uint64_t SpillStore::EstimatedBlocks() {
  uint64_t n = 0;
  return db_->GetIntProperty(meta_cf_.get(), "rocksdb.estimate-num-keys", &n) ? n : 0;
}

uint64_t SpillStore::UnflushedBytes() {
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* cf : {meta_cf_.get(), data_cf_.get()}) {
    uint64_t n = 0;
    if (db_->GetIntProperty(cf, "rocksdb.cur-size-all-mem-tables", &n)) total += n;
  }
  return total;
}

SpillStore::PayloadSpace SpillStore::PayloadFileSpace() {
  rocksdb::ColumnFamilyMetaData data;
  db_->GetColumnFamilyMetaData(data_cf_.get(), &data);
  PayloadSpace space;
  for (const rocksdb::BlobMetaData& f : data.blob_files) {
    space.file_bytes += f.blob_file_size;
    space.garbage_bytes += f.garbage_blob_bytes;
  }
  const PayloadSegments::FileSizes files = segments_->Files();
  for (const auto& [segment, bytes] : files.bytes) space.file_bytes += bytes;
  absl::MutexLock l(&tally_mu_);
  for (const SegmentGarbage& g : SegmentGarbageLocked(files)) space.garbage_bytes += g.garbage;
  return space;
}

std::vector<SpillStore::SegmentGarbage> SpillStore::SegmentGarbageLocked(const PayloadSegments::FileSizes& files) {
  std::vector<SegmentGarbage> out;
  if (!live_known_) return out;
  for (const auto& [segment, bytes] : files.bytes) {
    if (segment == files.active) continue;
    auto it = live_.find(segment);
    const uint64_t live = it == live_.end() ? 0 : static_cast<uint64_t>(std::max<int64_t>(0, it->second));
    if (bytes > live) out.push_back({segment, bytes - live, live});
  }
  return out;
}

absl::Status SpillStore::CollectGarbage(double garbage_share) {
  if (gc_cancelled_.load()) return absl::CancelledError("collecting disk garbage: cancelled");
  TQ_RETURN_IF_ERROR(CollectSegmentGarbage(garbage_share));
  return CollectBlobFileGarbage(garbage_share);
}

absl::Status SpillStore::CollectSegmentGarbage(double garbage_share) {
  std::vector<SegmentGarbage> candidates;
  {
    const PayloadSegments::FileSizes files = segments_->Files();
    absl::MutexLock l(&tally_mu_);
    if (!live_known_) return absl::OkStatus();
    candidates = SegmentGarbageLocked(files);
  }
  uint64_t garbage = 0;
  for (const SegmentGarbage& g : candidates) garbage += g.garbage;
  // The files with the most garbage first: the least moved per byte freed.
  std::sort(candidates.begin(), candidates.end(), [](const SegmentGarbage& a, const SegmentGarbage& b) {
    return a.garbage != b.garbage ? a.garbage > b.garbage : a.segment < b.segment;
  });
  size_t picked = 0;
  uint64_t rewrite = 0;
  for (uint64_t seen = 0; picked < candidates.size() && seen < garbage_share * static_cast<double>(garbage); ++picked) {
    seen += candidates[picked].garbage;
    rewrite += candidates[picked].live;
  }
  TQ_RETURN_IF_ERROR(CheckHeadroom(rewrite));
  for (size_t i = 0; i < picked; ++i) {
    const uint32_t segment = candidates[i].segment;
    TQ_ASSIGN_OR_RETURN(std::unique_ptr<PayloadSegments::Contents> contents, segments_->ReadAll(segment));
    // Moved in batches of up to 8 MiB: writes wait for one batch at most.
    auto records = absl::MakeConstSpan(contents->records);
    while (!records.empty()) {
      if (gc_cancelled_.load()) return absl::CancelledError("collecting disk garbage: cancelled");
      size_t n = 0;
      for (uint64_t bytes = 0; n < records.size() && bytes < (uint64_t{8} << 20); ++n) bytes += records[n].at.bytes;
      TQ_RETURN_IF_ERROR(MoveLive(records.subspan(0, n)));
      records.remove_prefix(n);
    }
    if (!contents->whole) {
      // Records past the damage cannot be listed: the file stays.
      rocksdb::Log(rocksdb::InfoLogLevel::WARN_LEVEL, db_->GetDBOptions().info_log,
                   "segment file %s has a damaged record: its live payloads before it were moved, the file kept",
                   PayloadSegments::FileName(segment).c_str());
      continue;
    }
    // The moved payloads, then their meta, durable before the file goes.
    TQ_RETURN_IF_ERROR(SyncWal());
    TQ_RETURN_IF_ERROR(segments_->Remove(segment));
    absl::MutexLock l(&tally_mu_);
    live_.erase(segment);
  }
  return absl::OkStatus();
}

absl::Status SpillStore::MoveLive(absl::Span<const PayloadSegments::Contents::Entry> records) {
  std::vector<std::string> keys;
  keys.reserve(records.size());
  for (const auto& r : records) keys.emplace_back(r.encoded_key);
  TQ_RETURN_IF_ERROR(ResumeIfStopped());
  absl::WriterMutexLock apply(&apply_mu_);
  TQ_ASSIGN_OR_RETURN(std::vector<std::optional<DiskBlockMeta>> metas, ReadMetas(keys));
  std::vector<size_t> live;  // into records
  std::vector<PayloadSegments::Record> moved;
  for (size_t i = 0; i < records.size(); ++i) {
    if (!metas[i].has_value() || !(metas[i]->at == records[i].at)) continue;
    live.push_back(i);
    moved.push_back({records[i].encoded_key, records[i].payload});
  }
  if (live.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<SegmentLocation>> appended = segments_->Append(moved, /*sync=*/false);
  if (!appended.ok()) return DiskError(appended.status());
  const std::vector<SegmentLocation>& at = *appended;
  rocksdb::WriteBatch batch;
  for (size_t j = 0; j < live.size(); ++j) {
    DiskBlockMeta& m = *metas[live[j]];
    m.at = at[j];
    const rocksdb::Status s = batch.Put(meta_cf_.get(), keys[live[j]], EncodeDiskBlockMeta(m));
    if (!s.ok()) return FromRocks(s, "building the move batch");
  }
  TQ_RETURN_IF_ERROR(WriteStatus(db_->Write(rocksdb::WriteOptions(), &batch), "moving payloads"));
  absl::MutexLock l(&tally_mu_);
  for (size_t j = 0; j < live.size(); ++j) {
    const int64_t bytes = static_cast<int64_t>(SegmentRecordBytes(keys[live[j]].size(), at[j].bytes));
    CountLive(at[j].segment, bytes);
    CountLive(records[live[j]].at.segment, -bytes);
  }
  return absl::OkStatus();
}

absl::Status SpillStore::CollectBlobFileGarbage(double garbage_share) {
  rocksdb::ColumnFamilyMetaData data;
  db_->GetColumnFamilyMetaData(data_cf_.get(), &data);
  std::vector<const rocksdb::BlobMetaData*> files;  // oldest first
  uint64_t garbage = 0;
  for (const rocksdb::BlobMetaData& f : data.blob_files) {
    files.push_back(&f);
    garbage += f.garbage_blob_bytes;
  }
  if (files.empty()) return absl::OkStatus();
  std::sort(files.begin(), files.end(),
            [](const auto* a, const auto* b) { return a->blob_file_number < b->blob_file_number; });
  size_t oldest = 0;
  uint64_t rewrite = 0;  // the live payload bytes of those files: written again before they go
  for (uint64_t seen = 0; oldest < files.size() && seen < garbage_share * static_cast<double>(garbage); ++oldest) {
    const rocksdb::BlobMetaData& f = *files[oldest];
    seen += f.garbage_blob_bytes;
    rewrite += f.blob_file_size - std::min(f.blob_file_size, f.garbage_blob_bytes);
  }
  // A compaction that runs out of disk stops RocksDB's writes: refused
  // unless the rewrite leaves --disk_min_free_bytes free.
  TQ_RETURN_IF_ERROR(CheckHeadroom(rewrite));
  rocksdb::CompactRangeOptions compact;
  compact.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
  // RocksDB relocates the blobs of files older than the one at index
  // floor(cutoff * files): the first `oldest` of them.
  compact.blob_garbage_collection_age_cutoff =
      oldest >= files.size() ? 1.0 : (static_cast<double>(oldest) + 0.5) / static_cast<double>(files.size());
  compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;  // every reference rewritten
  compact.exclusive_manual_compaction = false;  // routine compactions go on
  TQ_RETURN_IF_ERROR(ResumeIfStopped());
  const rocksdb::Status s = db_->CompactRange(compact, data_cf_.get(), nullptr, nullptr);
  if (s.IsManualCompactionPaused())
    return absl::CancelledError("collecting disk garbage: cancelled");
  return WriteStatus(s, "collecting blob garbage");
}

void SpillStore::CancelGarbageCollection() {
  gc_cancelled_.store(true);
  db_->DisableManualCompaction();
}

absl::Status SpillStore::DeleteEncodedKeys(absl::Span<const std::string> encoded_keys) {
  rocksdb::WriteBatch batch;
  for (const std::string& k : encoded_keys) {
    rocksdb::Status s = batch.Delete(meta_cf_.get(), k);
    if (s.ok()) s = batch.Delete(data_cf_.get(), k);
    if (!s.ok()) return FromRocks(s, "building delete batch");
  }
  TQ_RETURN_IF_ERROR(ResumeIfStopped());
  return WriteStatus(db_->Write(rocksdb::WriteOptions(), &batch), "deleting corrupt blocks");
}

absl::Status SpillStore::SyncWal() {
  // The payloads first: a synced meta never points at bytes a power loss took.
  TQ_RETURN_IF_ERROR(DiskError(segments_->Sync()));
  TQ_RETURN_IF_ERROR(ResumeIfStopped());
  return WriteStatus(db_->SyncWAL(), "syncing WAL");
}

absl::Status SpillStore::PutModelRecord(absl::string_view tenant, uint64_t model_id,
                                        absl::string_view record) {
  absl::Status valid = ValidateTenant(tenant);
  if (!valid.ok()) return valid;
  TQ_RETURN_IF_ERROR(ResumeIfStopped());
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return WriteStatus(db_->Put(wo, models_cf_.get(), EncodeModelPrefix(tenant, model_id),
                              ToSlice(record)),
                     "writing model record");
}

absl::StatusOr<std::string> SpillStore::GetModelRecord(absl::string_view tenant,
                                                       uint64_t model_id) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), models_cf_.get(),
                               EncodeModelPrefix(tenant, model_id), &value);
  if (!s.ok()) return FromRocks(s, "reading model record");
  return value;
}

absl::Status SpillStore::DeleteModelRecord(absl::string_view tenant, uint64_t model_id) {
  TQ_RETURN_IF_ERROR(ResumeIfStopped());
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return WriteStatus(db_->Delete(wo, models_cf_.get(), EncodeModelPrefix(tenant, model_id)),
                     "deleting model record");
}

absl::StatusOr<std::vector<ModelRecord>> SpillStore::ListModelRecords() {
  std::vector<ModelRecord> out;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions(), models_cf_.get()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    // A model key is a block key without the hash: decode it with a one-byte
    // placeholder hash appended.
    std::string raw(it->key().data(), it->key().size());
    raw.push_back('\0');
    absl::StatusOr<BlockKey> key = DecodeBlockKey(raw);
    if (!key.ok()) return absl::DataLossError("malformed model record key");
    out.push_back({std::move(key->tenant), key->model_id,
                   std::string(it->value().data(), it->value().size())});
  }
  absl::Status s = FromRocks(it->status(), "listing model records");
  if (!s.ok()) return s;
  return out;
}

absl::Status SpillStore::OverwritePayloadForTest(const BlockKey& key, absl::string_view bytes) {
  const std::string k = EncodeBlockKey(key);
  TQ_ASSIGN_OR_RETURN(std::vector<std::optional<DiskBlockMeta>> metas, ReadMetas({k}));
  if (!metas[0].has_value() || metas[0]->at.segment == 0)
    return FromRocks(db_->Put(rocksdb::WriteOptions(), data_cf_.get(), k, ToSlice(bytes)), "overwriting payload");
  // Damage in place (what a reader with the location finds) ...
  const SegmentLocation old = metas[0]->at;
  TQ_RETURN_IF_ERROR(segments_->OverwriteForTest(old, bytes.substr(0, std::min<uint64_t>(bytes.size(), old.bytes))));
  if (bytes.size() == old.bytes) return absl::OkStatus();
  // ... and a payload of another length: the meta points at it.
  TQ_ASSIGN_OR_RETURN(const std::vector<SegmentLocation> at, segments_->Append({{k, bytes}}, /*sync=*/false));
  metas[0]->at = at[0];
  return FromRocks(db_->Put(rocksdb::WriteOptions(), meta_cf_.get(), k, EncodeDiskBlockMeta(*metas[0])),
                   "overwriting payload");
}

absl::Status SpillStore::OverwriteMetaForTest(const BlockKey& key, absl::string_view bytes) {
  return FromRocks(
      db_->Put(rocksdb::WriteOptions(), meta_cf_.get(), EncodeBlockKey(key), ToSlice(bytes)),
      "overwriting meta");
}

bool SpillStore::HasPayloadForTest(const BlockKey& key) {
  const std::string k = EncodeBlockKey(key);
  absl::StatusOr<std::vector<std::optional<DiskBlockMeta>>> metas = ReadMetas({k});
  if (metas.ok() && (*metas)[0].has_value() && (*metas)[0]->at.segment != 0)
    return segments_->Files().bytes.contains((*metas)[0]->at.segment);
  rocksdb::PinnableSlice value;
  return db_->Get(rocksdb::ReadOptions(), data_cf_.get(), k, &value).ok();
}

}  // namespace tqkv::storage
