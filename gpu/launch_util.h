// Host helpers of the kernel launchers.
#ifndef TQKV_GPU_LAUNCH_UTIL_H_
#define TQKV_GPU_LAUNCH_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>

namespace tqkv::gpu {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes), once per
// kernel, device and size: a driver call per launch is host latency that
// every call pays.
inline cudaError_t AllowDynamicSmem(const void* kernel, size_t bytes) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  static std::mutex mu;
  static auto* allowed = new std::map<std::pair<const void*, int>, size_t>;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = (*allowed)[{kernel, dev}];
  if (have >= bytes) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) have = bytes;
  return e;
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_LAUNCH_UTIL_H_
