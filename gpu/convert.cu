#include "gpu/convert.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/gpu_codec.h"

namespace tqkv::gpu {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void __launch_bounds__(kThreads) HalfToFloatKernel(const __half* src, float* dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) dst[i] = __half2float(src[i]);
}

__global__ void __launch_bounds__(kThreads) BF16ToFloatKernel(const uint16_t* src, float* dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

__global__ void __launch_bounds__(kThreads) FloatToHalfKernel(const float* src, __half* dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) dst[i] = __float2half_rn(src[i]);
}

// codec/dtype.h's FloatToBF16: round to nearest even, NaN kept quiet.
__global__ void __launch_bounds__(kThreads) FloatToBF16Kernel(const float* src, uint16_t* dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  uint32_t u = __float_as_uint(src[i]);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    dst[i] = static_cast<uint16_t>((u >> 16) | 0x40);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  dst[i] = static_cast<uint16_t>(u >> 16);
}

}  // namespace

cudaError_t LaunchToFloat(const void* src, int32_t dtype, float* dst, int64_t n, cudaStream_t stream) {
  if (n < 0 || (dtype != kGpuF16 && dtype != kGpuBF16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dtype == kGpuF16)
    HalfToFloatKernel<<<GridFor(n), kThreads, 0, stream>>>(static_cast<const __half*>(src), dst, n);
  else
    BF16ToFloatKernel<<<GridFor(n), kThreads, 0, stream>>>(static_cast<const uint16_t*>(src), dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchFromFloat(const float* src, int32_t dtype, void* dst, int64_t n, cudaStream_t stream) {
  if (n < 0 || (dtype != kGpuF16 && dtype != kGpuBF16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dtype == kGpuF16)
    FloatToHalfKernel<<<GridFor(n), kThreads, 0, stream>>>(src, static_cast<__half*>(dst), n);
  else
    FloatToBF16Kernel<<<GridFor(n), kThreads, 0, stream>>>(src, static_cast<uint16_t*>(dst), n);
  return cudaGetLastError();
}

}  // namespace tqkv::gpu
