// Host-memory buffers and the host tier's byte budget.
//
// HostBuffer is a fixed-size byte array (contents uninitialised on
// allocation), on the heap or in a HostArena (host_arena.h). Blocks share finished buffers as std::shared_ptr<const
// HostBuffer>, so a buffer stays valid for as long as any reader holds it,
// even after the block has been evicted or deleted.
//
// HostPool does the budget arithmetic: bytes in use, capacity and the two
// watermarks. It does not allocate; callers pair TryReserve/Release with the
// buffers they create. Memory held only by readers (after the block left the
// host tier) is not counted: readers are expected to send and drop results
// promptly.
#ifndef TQKV_STORAGE_HOST_POOL_H_
#define TQKV_STORAGE_HOST_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tqkv::storage {

class HostArena;

class HostBuffer {
 public:
  // A buffer of `size` uninitialised bytes, or RESOURCE_EXHAUSTED if the
  // allocation fails. size 0 is allowed (data() may then be null). With an
  // arena, the bytes come from it where it has room, else from the heap
  // (counted by the arena); the arena must outlive the buffer.
  static absl::StatusOr<std::unique_ptr<HostBuffer>> Allocate(size_t size, HostArena* arena = nullptr);
  // A buffer holding a copy of `bytes` (allocated as Allocate does).
  static absl::StatusOr<std::unique_ptr<HostBuffer>> CopyOf(absl::string_view bytes, HostArena* arena = nullptr);

  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<uint8_t> span() { return absl::Span<uint8_t>(data_, size_); }
  absl::string_view view() const { return absl::string_view(reinterpret_cast<const char*>(data_), size_); }

 private:
  HostBuffer(uint8_t* data, size_t size, HostArena* arena) : data_(data), size_(size), arena_(arena) {}

  uint8_t* data_;
  size_t size_;
  HostArena* arena_;  // the arena data_ came from; null: the heap
};

struct HostPoolOptions {
  // Bytes the host tier may hold (committed blocks plus in-flight puts).
  // Default: 1 GiB.
  uint64_t capacity_bytes = uint64_t{1} << 30;
  // Admission that would take usage above high_watermark * capacity starts
  // eviction. Default: 0.90.
  double high_watermark = 0.90;
  // Eviction then frees blocks until usage is at most low_watermark *
  // capacity (counting the new block). Default: 0.80.
  double low_watermark = 0.80;
};

// Thread-compatible: callers serialise access (BlockStore guards its pool
// with its own mutex).
class HostPool {
 public:
  // REQUIRES: 0 <= low_watermark <= high_watermark <= 1 (Validate checks).
  explicit HostPool(const HostPoolOptions& options);

  // INVALID_ARGUMENT unless 0 <= low <= high <= 1.
  static absl::Status Validate(const HostPoolOptions& options);

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t high_bytes() const { return high_; }
  uint64_t low_bytes() const { return low_; }
  uint64_t used_bytes() const { return used_; }

  // True iff `bytes` more fit without passing the high watermark.
  bool FitsBelowHigh(uint64_t bytes) const { return used_ + bytes <= high_; }
  // True iff `bytes` more fit within capacity.
  bool Fits(uint64_t bytes) const { return used_ + bytes <= capacity_; }

  // How many bytes eviction should free before admitting `incoming` bytes:
  // 0 if they fit below the high watermark; otherwise enough to bring usage
  // (incoming included) down to the low watermark, or, for an incoming size
  // above the low watermark, down to capacity.
  uint64_t BytesToFreeFor(uint64_t incoming) const;

  // Adds `bytes` to usage if the result stays within capacity; returns
  // whether it did.
  bool TryReserve(uint64_t bytes);
  // REQUIRES: bytes <= used_bytes().
  void Release(uint64_t bytes);

 private:
  uint64_t capacity_;
  uint64_t high_;
  uint64_t low_;
  uint64_t used_ = 0;
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_HOST_POOL_H_
