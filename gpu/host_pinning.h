// PinnedHostRange: pins a range of host memory (the host tier's arena,
// storage/host_arena.h) for DMA with cudaHostRegister, piece by piece on a
// background thread, so a server starts at once and its first puts land
// in the pieces pinned first (the arena hands out its range from the
// start). Copies of bytes that lie within one pinned piece may go straight
// between that memory and the device; others are staged.
//
// Thread safety: Holds and pinned_bytes may be called concurrently with
// the pinning thread and each other.
#ifndef TQKV_GPU_HOST_PINNING_H_
#define TQKV_GPU_HOST_PINNING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace tqkv::gpu {

class PinnedHostRange {
 public:
  // 256 MiB: a registration stalls other CUDA calls of the process while
  // the driver pins its pages (~50 ms at this size).
  static constexpr size_t kPieceBytes = size_t{256} << 20;

  // Starts pinning [base, base + bytes) for CUDA device `device`.
  PinnedHostRange(int device, uint8_t* base, size_t bytes);
  PinnedHostRange(const PinnedHostRange&) = delete;
  PinnedHostRange& operator=(const PinnedHostRange&) = delete;
  // Stops pinning and unregisters what was pinned. REQUIRES: no copy from
  // or to the range still in flight.
  ~PinnedHostRange();

  // True iff [p, p + n) lies within one piece already pinned.
  bool Holds(const void* p, size_t n) const {
    const auto* b = static_cast<const uint8_t*>(p);
    if (n == 0 || b < base_ || b >= base_ + bytes_) return false;
    const size_t off = static_cast<size_t>(b - base_);
    return off + n <= pinned_.load(std::memory_order_acquire) && off / kPieceBytes == (off + n - 1) / kPieceBytes;
  }
  size_t pinned_bytes() const { return pinned_.load(std::memory_order_acquire); }
  size_t bytes() const { return bytes_; }
  // Empty, or the CUDA error that stopped the pinning.
  std::string error() const;

 private:
  void Run(int device);

  uint8_t* const base_;
  const size_t bytes_;
  std::atomic<size_t> pinned_{0};
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_HOST_PINNING_H_
