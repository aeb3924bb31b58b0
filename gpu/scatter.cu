#include "gpu/scatter.h"

namespace tqkv::gpu {
namespace {

// Block i copies piece i in 16-byte words.
__global__ void __launch_bounds__(256) ScatterKernel(const ScatterPiece* pieces, const uint8_t* src) {
  const ScatterPiece p = pieces[blockIdx.x];
  const uint4* from = reinterpret_cast<const uint4*>(src + p.src);
  uint4* to = reinterpret_cast<uint4*>(p.dst);
  for (uint64_t w = threadIdx.x; w < p.bytes / 16; w += blockDim.x) to[w] = from[w];
}

}  // namespace

cudaError_t LaunchScatter(const ScatterPiece* pieces, int n, const uint8_t* src, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ScatterKernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(pieces, src);
  return cudaGetLastError();
}

}  // namespace tqkv::gpu
