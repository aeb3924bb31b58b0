// Helpers for GPU tests: skip without a device, device copies of vectors.
#ifndef TQKV_GPU_TEST_SUPPORT_H_
#define TQKV_GPU_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <vector>

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

}  // namespace tqkv::gpu::testing_util

#endif  // TQKV_GPU_TEST_SUPPORT_H_
