#include "storage/host_pool.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "storage/host_arena.h"

namespace tqkv::storage {

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Allocate(size_t size, HostArena* arena) {
  if (size == 0) return std::unique_ptr<HostBuffer>(new HostBuffer(nullptr, 0, nullptr));
  if (arena != nullptr) {
    if (uint8_t* p = arena->Allocate(size)) return std::unique_ptr<HostBuffer>(new HostBuffer(p, size, arena));
    arena->CountHeapFallback();
  }
  uint8_t* data = new (std::nothrow) uint8_t[size];
  if (data == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " host bytes"));
  return std::unique_ptr<HostBuffer>(new HostBuffer(data, size, nullptr));
}

HostBuffer::~HostBuffer() {
  if (arena_ != nullptr) {
    arena_->Free(data_, size_);
  } else {
    delete[] data_;
  }
}

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::CopyOf(absl::string_view bytes, HostArena* arena) {
  absl::StatusOr<std::unique_ptr<HostBuffer>> buf = Allocate(bytes.size(), arena);
  if (buf.ok() && !bytes.empty()) std::memcpy((*buf)->data(), bytes.data(), bytes.size());
  return buf;
}

absl::Status HostPool::Validate(const HostPoolOptions& o) {
  if (!(o.low_watermark >= 0.0 && o.low_watermark <= o.high_watermark &&
        o.high_watermark <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("host watermarks must satisfy 0 <= low (",
                                                   o.low_watermark, ") <= high (",
                                                   o.high_watermark, ") <= 1"));
  }
  return absl::OkStatus();
}

HostPool::HostPool(const HostPoolOptions& o)
    : capacity_(o.capacity_bytes),
      high_(static_cast<uint64_t>(static_cast<long double>(o.capacity_bytes) * o.high_watermark)),
      low_(static_cast<uint64_t>(static_cast<long double>(o.capacity_bytes) * o.low_watermark)) {
  high_ = std::min(high_, capacity_);
  low_ = std::min(low_, high_);
}

uint64_t HostPool::BytesToFreeFor(uint64_t incoming) const {
  if (FitsBelowHigh(incoming)) return 0;
  uint64_t target = incoming <= low_ ? low_ : std::max(capacity_, incoming);
  uint64_t after = used_ + incoming;
  return after > target ? after - target : 0;
}

bool HostPool::TryReserve(uint64_t bytes) {
  if (!Fits(bytes)) return false;
  used_ += bytes;
  return true;
}

void HostPool::Release(uint64_t bytes) {
  assert(bytes <= used_);
  used_ -= std::min(bytes, used_);
}

}  // namespace tqkv::storage
