// Helpers for GPU tests: skip without a device, device copies of vectors,
// host memory a backend pins as its host arena.
#ifndef TQKV_GPU_TEST_SUPPORT_H_
#define TQKV_GPU_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "codec/backend.h"
#include "gpu/cuda_util.h"

#define TQ_SKIP_WITHOUT_GPU()                                                  \
  do {                                                                         \
    if (::tqkv::gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

namespace tqkv::gpu::testing_util {

template <typename T>
DeviceBuffer ToDevice(const std::vector<T>& v) {
  DeviceBuffer b = *DeviceBuffer::Allocate(std::max<size_t>(1, v.size() * sizeof(T)));
  if (!v.empty()) cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return b;
}

template <typename T>
std::vector<T> ToHost(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  if (n) cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// Host memory that `backend` pins as its host arena (UseHostArena), as a
// server's host tier: whole 2 MiB pages holding at least `bytes`. Waits
// until the backend has pinned all of it (a test failure, and null, if it
// has not within 10 s).
using HostRegion = std::unique_ptr<uint8_t, decltype(&std::free)>;
inline HostRegion PinnedRegion(ComputeBackend& backend, size_t bytes) {
  constexpr size_t kPage = size_t{2} << 20;
  const size_t n = (bytes + kPage - 1) / kPage * kPage;
  HostRegion r(static_cast<uint8_t*>(std::aligned_alloc(kPage, n)), &std::free);
  if (r == nullptr || !backend.UseHostArena(r.get(), n).ok()) {
    ADD_FAILURE() << "no host arena of " << n << " bytes";
    return HostRegion(nullptr, &std::free);
  }
  for (int waited = 0; backend.Stats().host_pinned_bytes < n && waited < 1000; ++waited)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (backend.Stats().host_pinned_bytes < n) {
    ADD_FAILURE() << "the backend pinned " << backend.Stats().host_pinned_bytes << " of " << n << " bytes";
    return HostRegion(nullptr, &std::free);
  }
  return r;
}

}  // namespace tqkv::gpu::testing_util

#endif  // TQKV_GPU_TEST_SUPPORT_H_
