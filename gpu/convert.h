// Element conversions on the device between a wire dtype (fp16, bf16) and
// fp32: the values of the host's ToFloat / FromFloat (codec/dtype.h; NaN
// payloads may differ), so that a large call's queries and outputs cross
// the bus in their wire dtype.
#ifndef TQKV_GPU_CONVERT_H_
#define TQKV_GPU_CONVERT_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tqkv::gpu {

// dst[i] = src[i] as fp32 for i < n; `dtype` kGpuF16 or kGpuBF16
// (gpu/gpu_codec.h). cudaErrorInvalidValue for another dtype or n < 0.
cudaError_t LaunchToFloat(const void* src, int32_t dtype, float* dst, int64_t n, cudaStream_t stream);
// dst[i] = src[i] rounded to nearest even in `dtype` (kGpuF16 or kGpuBF16).
cudaError_t LaunchFromFloat(const float* src, int32_t dtype, void* dst, int64_t n, cudaStream_t stream);

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_CONVERT_H_
