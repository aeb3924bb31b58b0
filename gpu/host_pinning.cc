#include "gpu/host_pinning.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tqkv::gpu {

PinnedHostRange::PinnedHostRange(int device, uint8_t* base, size_t bytes)
    : base_(base), bytes_(bytes), thread_([this, device] { Run(device); }) {}

PinnedHostRange::~PinnedHostRange() {
  stop_.store(true, std::memory_order_release);
  thread_.join();
  const size_t pinned = pinned_.load(std::memory_order_acquire);
  for (size_t off = 0; off < pinned; off += kPieceBytes) (void)cudaHostUnregister(base_ + off);
}

void PinnedHostRange::Run(int device) {
  cudaError_t e = cudaSetDevice(device);
  for (size_t off = 0; e == cudaSuccess && off < bytes_ && !stop_.load(std::memory_order_acquire);
       off += kPieceBytes) {
    const size_t n = std::min(kPieceBytes, bytes_ - off);
    e = cudaHostRegister(base_ + off, n, cudaHostRegisterDefault);
    if (e == cudaSuccess) pinned_.store(off + n, std::memory_order_release);
  }
  if (e != cudaSuccess) {
    absl::MutexLock l(&mu_);
    error_ = absl::StrCat("pinning the host tier stopped at ", pinned_.load(), " of ", bytes_,
                          " bytes: ", cudaGetErrorString(e));
  }
}

std::string PinnedHostRange::error() const {
  absl::MutexLock l(&mu_);
  return error_;
}

}  // namespace tqkv::gpu
