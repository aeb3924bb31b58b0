// CUDA error → absl::Status mapping and RAII owners of device memory, pinned
// host memory, streams and events. Copy is deleted; moves transfer
// ownership. Not thread-safe (callers serialise use of one object).
#ifndef TQKV_GPU_CUDA_UTIL_H_
#define TQKV_GPU_CUDA_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tqkv::gpu {

// OK for cudaSuccess; otherwise UNAVAILABLE (no device / driver),
// RESOURCE_EXHAUSTED (out of memory), UNIMPLEMENTED (unsupported shape)
// or INTERNAL, with `what` and the CUDA error name in the message.
absl::Status CudaStatus(cudaError_t e, const std::string& what);

#define TQ_CUDA_RETURN_IF_ERROR(expr, what)                          \
  do {                                                               \
    cudaError_t tq_cuda_err_ = (expr);                               \
    if (tq_cuda_err_ != cudaSuccess) return ::tqkv::gpu::CudaStatus(tq_cuda_err_, what); \
  } while (0)

// Number of usable CUDA devices; 0 when there is no driver or device.
int CudaDeviceCount();

// Device (cudaMalloc) or pinned host (cudaMallocHost) memory.
enum class MemoryKind { kDevice, kPinnedHost };

// Owns one allocation of `Kind`; grows on Reserve (contents not kept).
template <MemoryKind Kind>
class CudaMemory {
 public:
  CudaMemory() = default;
  ~CudaMemory() { Reset(); }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  CudaMemory(CudaMemory&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  CudaMemory& operator=(CudaMemory&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  // RESOURCE_EXHAUSTED when the allocation fails.
  static absl::StatusOr<CudaMemory> Allocate(size_t bytes) {
    CudaMemory m;
    absl::Status s = m.Reserve(bytes);
    if (!s.ok()) return s;
    return m;
  }
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  absl::Status Reserve(size_t bytes);
  void Reset();
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = CudaMemory<MemoryKind::kDevice>;
using PinnedBuffer = CudaMemory<MemoryKind::kPinnedHost>;
extern template class CudaMemory<MemoryKind::kDevice>;
extern template class CudaMemory<MemoryKind::kPinnedHost>;

class CudaStream {
 public:
  CudaStream() = default;
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  static absl::StatusOr<CudaStream> Create();
  cudaStream_t get() const { return s_; }
  absl::Status Synchronize(const std::string& what) const;

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  // Takes o's event; o destroys the one this held.
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  static absl::StatusOr<CudaEvent> Create();
  cudaEvent_t get() const { return e_; }
  // Milliseconds between two recorded, completed events.
  static float ElapsedMs(const CudaEvent& start, const CudaEvent& stop);

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_CUDA_UTIL_H_
