#include "storage/host_arena.h"

#include <sys/mman.h>

#include <cassert>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tqkv::storage {

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Create(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a host arena needs at least one byte");
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes > SIZE_MAX - kHuge) return absl::InvalidArgumentError(absl::StrCat("host arena of ", bytes, " bytes"));
  const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve a host arena of ", size, " bytes: ", std::strerror(errno)));
  // Fewer faults and TLB misses where transparent huge pages are enabled
  // for madvise'd ranges; nothing changes where they are not.
  (void)madvise(p, size, MADV_HUGEPAGE);
  return std::unique_ptr<HostArena>(new HostArena(static_cast<uint8_t*>(p), size));
}

HostArena::~HostArena() {
  {
    std::lock_guard<std::mutex> l(mu_);
    assert(in_use_ == 0 && "a host arena destroyed with chunks in use");
  }
  munmap(base_, size_);
}

uint8_t* HostArena::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t n = Round(bytes);
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = free_.find(n); it != free_.end() && !it->second.empty()) {
    uint8_t* p = it->second.back();
    it->second.pop_back();
    free_listed_ -= n;
    in_use_ += n;
    return p;
  }
  if (n > size_ - top_) return nullptr;
  uint8_t* p = base_ + top_;
  top_ += n;
  in_use_ += n;
  return p;
}

void HostArena::Free(uint8_t* p, size_t bytes) {
  const size_t n = Round(bytes);
  assert(Contains(p));
  std::lock_guard<std::mutex> l(mu_);
  free_[n].push_back(p);
  in_use_ -= n;
  free_listed_ += n;
}

void HostArena::CountHeapFallback() {
  std::lock_guard<std::mutex> l(mu_);
  ++heap_fallbacks_;
}

HostArena::Stats HostArena::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return Stats{.capacity_bytes = size_,
               .in_use_bytes = in_use_,
               .free_listed_bytes = free_listed_,
               .untouched_bytes = size_ - top_,
               .heap_fallbacks = heap_fallbacks_};
}

}  // namespace tqkv::storage
