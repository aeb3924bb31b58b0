// The disk tier's payload files: append-only segment files that hold each
// spilled block's payload once, next to the RocksDB database that holds its
// meta (spill_store.h). A payload written here is read back with one
// positioned read into the caller's buffer; RocksDB's WAL carries only the
// meta record that points at it.
//
// Layout (the on-disk contract): files segments/NNNNNNNN.seg (zero-padded
// decimal segment number, new files numbered above every existing one),
// each a sequence of records:
//   u32 magic 0x47535154 ("TQSG")   u32 key length K
//   u64 payload length N            u64 XXH64 (seed 0) of the 16 bytes before
//                                       and the K key bytes
//   K bytes: the block's encoded key (EncodeBlockKey)
//   N bytes: the payload as stored (sealed when the store encrypts)
// A file is appended to by one writer and never rewritten: a record torn
// by a crash is at the end of a file no later write extends (a store
// reopened writes to a new file). The payload's own checksum is in its
// meta (BlockChecksum, bound to the key), so a record carries none.
//
// Durability: Append(sync=false) returns once the bytes are in the OS (a
// process crash keeps them); Append(sync=true) and Sync() fdatasync them
// first. A file filled up is synced as it is closed, and a new file's
// directory entry is synced as it is created.
#ifndef TQKV_STORAGE_PAYLOAD_SEGMENTS_H_
#define TQKV_STORAGE_PAYLOAD_SEGMENTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace rocksdb {
class FileSystem;
class FSRandomAccessFile;
class FSWritableFile;
}  // namespace rocksdb

namespace tqkv::storage {

// Where a payload is: its segment, the offset of its first byte, its
// stored length.
struct SegmentLocation {
  uint32_t segment = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  friend bool operator==(const SegmentLocation&, const SegmentLocation&) = default;
};

// Bytes a record of `key_bytes` key and `payload_bytes` payload takes in
// its file (header included): what its removal frees.
uint64_t SegmentRecordBytes(uint64_t key_bytes, uint64_t payload_bytes);

class PayloadSegments {
 public:
  // Opens the segment files under dir (created if absent), through `fs`
  // (not owned; must outlive this). Appends go to a new file numbered above
  // the existing ones, rolled over once it holds `segment_bytes`.
  static absl::StatusOr<std::unique_ptr<PayloadSegments>> Open(const std::string& dir, rocksdb::FileSystem* fs,
                                                               uint64_t segment_bytes);
  ~PayloadSegments();
  PayloadSegments(const PayloadSegments&) = delete;
  PayloadSegments& operator=(const PayloadSegments&) = delete;

  struct Record {
    absl::string_view encoded_key;
    absl::string_view payload;
  };

  // Appends `records` in order; their locations, one per record. Fails
  // whole: RESOURCE_EXHAUSTED when the disk is full, UNAVAILABLE for other
  // I/O errors; what a failed call wrote is never pointed at (the next
  // call starts a new file).
  absl::StatusOr<std::vector<SegmentLocation>> Append(absl::Span<const Record> records, bool sync);

  // Makes every append so far power-loss durable (fdatasync).
  absl::Status Sync();

  // Reads the payload at `at` into dst (at.bytes bytes). NOT_FOUND when its
  // segment no longer exists (collected: read the meta again); DATA_LOSS
  // when the file is shorter than the location says.
  absl::Status Read(const SegmentLocation& at, char* dst);

  // A whole segment file read into memory: its records in file order.
  struct Contents {
    std::string bytes;
    struct Entry {
      absl::string_view encoded_key;  // into bytes
      SegmentLocation at;
      absl::string_view payload;  // into bytes
    };
    std::vector<Entry> records;
    // Every byte of the file was read as whole records (false: a damaged
    // or torn record ended the walk; what follows it is not listed).
    bool whole = false;
  };
  absl::StatusOr<std::unique_ptr<Contents>> ReadAll(uint32_t segment);

  // Deletes a segment file (not the one being appended to).
  absl::Status Remove(uint32_t segment);

  // Every segment's file size; `active` is the one appends go to.
  struct FileSizes {
    std::map<uint32_t, uint64_t> bytes;
    uint32_t active = 0;
  };
  FileSizes Files();

  // The file name of a segment.
  static std::string FileName(uint32_t segment);

  // Test hook: writes `bytes` over the file at `at.offset`, bypassing every
  // check, to simulate damage.
  absl::Status OverwriteForTest(const SegmentLocation& at, absl::string_view bytes);

 private:
  struct Segment;
  PayloadSegments(std::string dir, rocksdb::FileSystem* fs, uint64_t segment_bytes);
  // A reader of segment file `number` of `size` bytes.
  absl::StatusOr<std::shared_ptr<Segment>> OpenSegment(uint32_t number, uint64_t size);
  // Opens a new file for appends (after the last one filled or failed).
  absl::Status StartSegmentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // The segment's reader; NOT_FOUND when it does not exist.
  absl::StatusOr<std::shared_ptr<Segment>> Find(uint32_t segment);

  const std::string dir_;
  rocksdb::FileSystem* const fs_;
  const uint64_t segment_bytes_;

  // Appends serialise on append_mu_; the map of readers has its own lock,
  // so reads go on during an append.
  absl::Mutex append_mu_;
  // The file appends go to, and its reader: both null, or neither.
  std::unique_ptr<rocksdb::FSWritableFile> writer_ ABSL_GUARDED_BY(append_mu_);
  std::shared_ptr<Segment> active_ ABSL_GUARDED_BY(append_mu_);
  uint64_t active_bytes_ ABSL_GUARDED_BY(append_mu_) = 0;
  bool unsynced_ ABSL_GUARDED_BY(append_mu_) = false;

  absl::Mutex files_mu_;
  std::map<uint32_t, std::shared_ptr<Segment>> files_ ABSL_GUARDED_BY(files_mu_);
  uint32_t next_ ABSL_GUARDED_BY(files_mu_) = 1;
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_PAYLOAD_SEGMENTS_H_
