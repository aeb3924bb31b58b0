// Helpers shared by the standalone GPU probes (memory_probe, decode_floor):
// an L2-evicting read, a bulk copy into shared memory on an mbarrier, and
// the host's error check. Each probe is one translation unit.
#ifndef TQKV_BENCH_PROFILING_PROBE_UTIL_CUH_
#define TQKV_BENCH_PROFILING_PROBE_UTIL_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace tqkv::probe {

// Written only on impossible values: keeps the probes' reads alive.
__device__ int g_sink;

// Reads n int4 through L2 (evicting what the probe reads next).
__global__ void Evict(const int4* p, size_t n) {
  int acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) g_sink = acc;
}

// count bytes from global src into shared dst (both 16-byte aligned, count
// a multiple of 16), completing on the mbarrier at mbar.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t count, uint32_t mbar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(count), "r"(mbar)
               : "memory");
}

// False, after saying so, where no CUDA device is present (a probe then
// exits 0: CI builds and may run it without a GPU).
inline bool HaveDevice() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return true;
  std::printf("no CUDA device\n");
  return false;
}

// Prints `what: error` on failure; true on success.
inline bool Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace tqkv::probe

#endif  // TQKV_BENCH_PROFILING_PROBE_UTIL_CUH_
