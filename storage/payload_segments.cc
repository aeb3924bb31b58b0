#include "storage/payload_segments.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rocksdb/file_system.h"
#include "rocksdb/io_status.h"

namespace tqkv::storage {
namespace {

constexpr uint32_t kMagic = 0x47535154;  // "TQSG" little-endian
constexpr size_t kHeaderBytes = 24;
constexpr char kSuffix[] = ".seg";
constexpr size_t kCopyBelowBytes = 64 << 10;
constexpr size_t kBatchBytes = 1 << 20;

void Put32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }  // x86-64 and aarch64: little-endian
void Put64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t Get32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t Get64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t HeaderChecksum(const char* header16, absl::string_view key) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, header16, 16);
  XXH64_update(st, key.data(), key.size());
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

// RESOURCE_EXHAUSTED for a full disk, UNAVAILABLE for another I/O error.
absl::Status FromIo(const rocksdb::IOStatus& s, absl::string_view what, absl::string_view file) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, " ", file, ": ", s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(absl::StrCat("no space: ", msg));
  if (s.IsNotFound() || s.IsPathNotFound()) return absl::NotFoundError(msg);
  return absl::UnavailableError(msg);
}

// The segment number of a file name, or 0 if it is not a segment's.
uint32_t SegmentOf(absl::string_view name) {
  if (name.size() != 8 + 4 || !absl::EndsWith(name, kSuffix)) return 0;
  uint32_t n = 0;
  return absl::SimpleAtoi(name.substr(0, 8), &n) ? n : 0;
}

}  // namespace

uint64_t SegmentRecordBytes(uint64_t key_bytes, uint64_t payload_bytes) {
  return kHeaderBytes + key_bytes + payload_bytes;
}

struct PayloadSegments::Segment {
  uint32_t number = 0;
  std::string path;
  std::unique_ptr<rocksdb::FSRandomAccessFile> reader;
  std::atomic<uint64_t> size{0};
};

std::string PayloadSegments::FileName(uint32_t segment) {
  char name[32];
  std::snprintf(name, sizeof name, "%08" PRIu32 "%s", segment, kSuffix);
  return name;
}

PayloadSegments::PayloadSegments(std::string dir, rocksdb::FileSystem* fs, uint64_t segment_bytes)
    : dir_(std::move(dir)), fs_(fs), segment_bytes_(segment_bytes) {}

PayloadSegments::~PayloadSegments() {
  absl::MutexLock l(&append_mu_);
  if (writer_ != nullptr) {
    // What was appended reached the OS; a clean close makes it durable too.
    (void)writer_->Sync(rocksdb::IOOptions(), nullptr);
    (void)writer_->Close(rocksdb::IOOptions(), nullptr);
  }
}

absl::StatusOr<std::unique_ptr<PayloadSegments>> PayloadSegments::Open(const std::string& dir,
                                                                       rocksdb::FileSystem* fs,
                                                                       uint64_t segment_bytes) {
  const rocksdb::IOOptions io;
  TQ_RETURN_IF_ERROR(FromIo(fs->CreateDirIfMissing(dir, io, nullptr), "creating", dir));
  std::vector<std::string> names;
  TQ_RETURN_IF_ERROR(FromIo(fs->GetChildren(dir, io, &names, nullptr), "listing", dir));
  std::unique_ptr<PayloadSegments> s(new PayloadSegments(dir, fs, segment_bytes));
  absl::MutexLock l(&s->files_mu_);
  for (const std::string& name : names) {
    const uint32_t n = SegmentOf(name);
    if (n == 0) continue;
    const std::string path = dir + "/" + name;
    uint64_t size = 0;
    TQ_RETURN_IF_ERROR(FromIo(fs->GetFileSize(path, io, &size, nullptr), "sizing", path));
    TQ_ASSIGN_OR_RETURN(s->files_[n], s->OpenSegment(n, size));
    s->next_ = std::max(s->next_, n + 1);
  }
  return s;
}

absl::StatusOr<std::shared_ptr<PayloadSegments::Segment>> PayloadSegments::OpenSegment(uint32_t number,
                                                                                     uint64_t size) {
  auto seg = std::make_shared<Segment>();
  seg->number = number;
  seg->path = dir_ + "/" + FileName(number);
  seg->size.store(size);
  TQ_RETURN_IF_ERROR(
      FromIo(fs_->NewRandomAccessFile(seg->path, rocksdb::FileOptions(), &seg->reader, nullptr), "opening", seg->path));
  seg->reader->Hint(rocksdb::FSRandomAccessFile::kRandom);  // no readahead past a payload
  return seg;
}

absl::Status PayloadSegments::StartSegmentLocked() {
  const rocksdb::IOOptions io;
  if (writer_ != nullptr) {
    // A file filled up (or failed): closed, its bytes made durable.
    const rocksdb::IOStatus synced = writer_->Sync(io, nullptr);
    (void)writer_->Close(io, nullptr);
    writer_.reset();
    const uint32_t filled = active_->number;
    active_.reset();
    TQ_RETURN_IF_ERROR(FromIo(synced, "syncing", FileName(filled)));
    unsynced_ = false;
  }
  uint32_t n;
  {
    absl::MutexLock l(&files_mu_);
    n = next_++;
  }
  const std::string path = dir_ + "/" + FileName(n);
  std::unique_ptr<rocksdb::FSWritableFile> w;
  TQ_RETURN_IF_ERROR(FromIo(fs_->NewWritableFile(path, rocksdb::FileOptions(), &w, nullptr), "creating", path));
  TQ_ASSIGN_OR_RETURN(std::shared_ptr<Segment> seg, OpenSegment(n, 0));
  std::unique_ptr<rocksdb::FSDirectory> d;
  TQ_RETURN_IF_ERROR(FromIo(fs_->NewDirectory(dir_, io, &d, nullptr), "opening", dir_));
  TQ_RETURN_IF_ERROR(FromIo(d->Fsync(io, nullptr), "syncing", dir_));
  writer_ = std::move(w);
  active_ = seg;
  active_bytes_ = 0;
  absl::MutexLock l(&files_mu_);
  files_[n] = std::move(seg);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SegmentLocation>> PayloadSegments::Append(absl::Span<const Record> records, bool sync) {
  const rocksdb::IOOptions io;
  std::vector<SegmentLocation> out;
  out.reserve(records.size());
  absl::MutexLock l(&append_mu_);
  auto fail = [&](const rocksdb::IOStatus& s, absl::string_view what) {
    // The file's end is unknown now: no later record goes after it.
    (void)writer_->Close(io, nullptr);
    writer_.reset();
    const uint32_t failed = active_->number;
    active_.reset();
    unsynced_ = false;
    return FromIo(s, what, FileName(failed));
  };
  // Records go out in as few writes as the file takes: small payloads are
  // copied behind their headers into one buffer of up to kBatchBytes; a
  // large payload is written from where it is (a copy would cost more
  // than the call).
  std::string pending;
  auto flush = [&]() -> rocksdb::IOStatus {
    if (pending.empty()) return rocksdb::IOStatus::OK();
    const rocksdb::IOStatus s = writer_->Append(rocksdb::Slice(pending), io, nullptr);
    pending.clear();
    return s;
  };
  for (const Record& r : records) {
    if (writer_ == nullptr || active_bytes_ >= segment_bytes_) {
      if (writer_ != nullptr) {
        if (const rocksdb::IOStatus s = flush(); !s.ok()) return fail(s, "appending to");
        active_->size.store(active_bytes_, std::memory_order_release);
      }
      TQ_RETURN_IF_ERROR(StartSegmentLocked());
    }
    char header[kHeaderBytes];
    Put32(header, kMagic);
    Put32(header + 4, static_cast<uint32_t>(r.encoded_key.size()));
    Put64(header + 8, r.payload.size());
    Put64(header + 16, HeaderChecksum(header, r.encoded_key));
    pending.append(header, kHeaderBytes);
    pending.append(r.encoded_key.data(), r.encoded_key.size());
    const size_t head = kHeaderBytes + r.encoded_key.size();
    rocksdb::IOStatus s;
    if (r.payload.size() <= kCopyBelowBytes) {
      pending.append(r.payload.data(), r.payload.size());
      if (pending.size() >= kBatchBytes) s = flush();
    } else {
      s = flush();
      if (s.ok()) s = writer_->Append(rocksdb::Slice(r.payload.data(), r.payload.size()), io, nullptr);
    }
    if (!s.ok()) return fail(s, "appending to");
    out.push_back({active_->number, active_bytes_ + head, r.payload.size()});
    active_bytes_ += head + r.payload.size();
    unsynced_ = true;
  }
  if (writer_ != nullptr) {
    if (const rocksdb::IOStatus s = flush(); !s.ok()) return fail(s, "appending to");
    active_->size.store(active_bytes_, std::memory_order_release);
  }
  if (sync && unsynced_) {
    const rocksdb::IOStatus s = writer_->Sync(io, nullptr);
    if (!s.ok()) return fail(s, "syncing");
    unsynced_ = false;
  }
  return out;
}

absl::Status PayloadSegments::Sync() {
  absl::MutexLock l(&append_mu_);
  if (writer_ == nullptr || !unsynced_) return absl::OkStatus();
  TQ_RETURN_IF_ERROR(FromIo(writer_->Sync(rocksdb::IOOptions(), nullptr), "syncing", FileName(active_->number)));
  unsynced_ = false;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<PayloadSegments::Segment>> PayloadSegments::Find(uint32_t segment) {
  absl::MutexLock l(&files_mu_);
  auto it = files_.find(segment);
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat("segment ", FileName(segment), " does not exist"));
  return it->second;
}

absl::Status PayloadSegments::Read(const SegmentLocation& at, char* dst) {
  TQ_ASSIGN_OR_RETURN(const std::shared_ptr<Segment> seg, Find(at.segment));
  if (at.offset + at.bytes > seg->size.load(std::memory_order_acquire) || at.offset + at.bytes < at.offset)
    return absl::DataLossError(absl::StrCat("segment ", FileName(at.segment), " is shorter than a record it holds"));
  uint64_t done = 0;
  while (done < at.bytes) {
    rocksdb::Slice got;
    const rocksdb::IOStatus s =
        seg->reader->Read(at.offset + done, at.bytes - done, rocksdb::IOOptions(), &got, dst + done, nullptr);
    TQ_RETURN_IF_ERROR(FromIo(s, "reading", seg->path));
    if (got.size() == 0) return absl::DataLossError(absl::StrCat("segment ", seg->path, " ends early"));
    if (got.data() != dst + done) std::memcpy(dst + done, got.data(), got.size());
    done += got.size();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PayloadSegments::Contents>> PayloadSegments::ReadAll(uint32_t segment) {
  TQ_ASSIGN_OR_RETURN(const std::shared_ptr<Segment> seg, Find(segment));
  const uint64_t size = seg->size.load(std::memory_order_acquire);
  auto out = std::make_unique<Contents>();
  out->bytes.resize(size);
  TQ_RETURN_IF_ERROR(Read({segment, 0, size}, out->bytes.data()));
  const std::string& bytes = out->bytes;
  uint64_t at = 0;
  while (size - at >= kHeaderBytes) {
    const char* h = bytes.data() + at;
    const uint64_t key_len = Get32(h + 4), len = Get64(h + 8);
    if (Get32(h) != kMagic || key_len > size - at - kHeaderBytes) break;
    const absl::string_view key(h + kHeaderBytes, key_len);
    if (Get64(h + 16) != HeaderChecksum(h, key) || len > size - at - kHeaderBytes - key_len) break;
    const uint64_t payload_at = at + kHeaderBytes + key_len;
    out->records.push_back({key, SegmentLocation{segment, payload_at, len}, absl::string_view(bytes.data() + payload_at, len)});
    at = payload_at + len;
  }
  out->whole = at == size;
  return out;
}

absl::Status PayloadSegments::Remove(uint32_t segment) {
  std::shared_ptr<Segment> seg;
  {
    absl::MutexLock l(&append_mu_);
    if (active_ != nullptr && segment == active_->number)
      return absl::FailedPreconditionError("the segment being appended to cannot be removed");
    absl::MutexLock f(&files_mu_);
    auto it = files_.find(segment);
    if (it == files_.end()) return absl::OkStatus();
    seg = std::move(it->second);
    files_.erase(it);
  }
  // Readers holding the segment finish their reads from the open file.
  return FromIo(fs_->DeleteFile(seg->path, rocksdb::IOOptions(), nullptr), "deleting", seg->path);
}

absl::Status PayloadSegments::OverwriteForTest(const SegmentLocation& at, absl::string_view bytes) {
  TQ_ASSIGN_OR_RETURN(const std::shared_ptr<Segment> seg, Find(at.segment));
  const int fd = ::open(seg->path.c_str(), O_WRONLY);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("opening ", seg->path));
  const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(at.offset));
  ::close(fd);
  return n == static_cast<ssize_t>(bytes.size()) ? absl::OkStatus()
                                                 : absl::UnavailableError(absl::StrCat("writing ", seg->path));
}

PayloadSegments::FileSizes PayloadSegments::Files() {
  FileSizes out;
  {
    absl::MutexLock l(&append_mu_);
    out.active = active_ != nullptr ? active_->number : 0;
  }
  absl::MutexLock l(&files_mu_);
  for (const auto& [n, seg] : files_) out.bytes[n] = seg->size.load(std::memory_order_acquire);
  return out;
}

}  // namespace tqkv::storage
