// HostArena: one reserved range of host memory that the host tier's block
// buffers are carved from, so that a GPU backend can pin the whole tier
// once (cudaHostRegister) and move blocks between it and the device by DMA:
// no staging copy, and no page faults on the way in.
//
//   auto arena = HostArena::Create(budget);       // mmap, no memory yet
//   backend->RegisterHostMemory(arena->base(), arena->size());
//   BlockStoreOptions so; so.host_arena = arena.get();
//
// Chunks are 256-byte aligned and rounded up to 256 bytes. A freed chunk
// goes to the free list of its size and serves the next allocation of that
// size (a store's blocks come in a few sizes: one per model and layer
// range); other allocations take fresh chunks from the unused top of the
// range. Allocate returns null when neither has room and the caller falls
// back to the heap (HostBuffer::Allocate does, and counts it in
// Stats::heap_fallbacks): chunks of a size no longer asked for stay on
// their free list until the arena is destroyed.
//
// Memory is reserved, not committed: pages are faulted in on first touch,
// or all at once by whoever pins the range.
//
// Thread safety: every method may be called concurrently.
#ifndef TQKV_STORAGE_HOST_ARENA_H_
#define TQKV_STORAGE_HOST_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tqkv::storage {

class HostArena {
 public:
  static constexpr size_t kAlign = 256;

  // Reserves `bytes` (rounded up to whole 2 MiB pages, which the kernel is
  // asked to back by transparent huge pages). RESOURCE_EXHAUSTED when the
  // mapping fails; INVALID_ARGUMENT for 0 bytes.
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(size_t bytes);

  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  // Unmaps the range. REQUIRES: every chunk freed, and no one (a pinning
  // backend) still using the range.
  ~HostArena();

  // A chunk of at least `bytes` (> 0), or null when the arena has no room.
  uint8_t* Allocate(size_t bytes);
  // Returns a chunk. REQUIRES: `p` from Allocate(bytes) of this arena.
  void Free(uint8_t* p, size_t bytes);
  // Counts an allocation the caller served from the heap for want of room.
  void CountHeapFallback();

  bool Contains(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= base_ && b < base_ + size_;
  }
  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }

  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t in_use_bytes = 0;      // chunks handed out and not freed
    uint64_t free_listed_bytes = 0; // freed chunks waiting for their size
    uint64_t untouched_bytes = 0;   // never handed out
    uint64_t heap_fallbacks = 0;    // allocations served from the heap
  };
  Stats stats() const;

 private:
  HostArena(uint8_t* base, size_t size) : base_(base), size_(size) {}
  static size_t Round(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  uint8_t* const base_;
  const size_t size_;
  // std::mutex (not absl::Mutex): ThreadSanitizer builds see it (the
  // system's Abseil is not instrumented). It guards the members below.
  mutable std::mutex mu_;
  size_t top_ = 0;  // offset of the first never-used byte
  absl::flat_hash_map<size_t, std::vector<uint8_t*>> free_;  // by rounded size
  uint64_t in_use_ = 0;
  uint64_t free_listed_ = 0;
  uint64_t heap_fallbacks_ = 0;
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_HOST_ARENA_H_
