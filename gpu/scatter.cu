#include "gpu/scatter.h"

#include <algorithm>

namespace tqkv::gpu {
namespace {

// Block i copies piece i in 16-byte words.
__global__ void __launch_bounds__(256) ScatterKernel(const ScatterPiece* pieces, const uint8_t* src) {
  const ScatterPiece p = pieces[blockIdx.x];
  const uint4* from = reinterpret_cast<const uint4*>(src + p.src);
  uint4* to = reinterpret_cast<uint4*>(p.dst);
  for (uint64_t w = threadIdx.x; w < p.bytes / 16; w += blockDim.x) to[w] = from[w];
}

// Thread i moves word (i mod words) of head (i / words) of the rows, in
// units of Word.
template <typename Word>
__global__ void __launch_bounds__(256) StridedHeadsKernel(StridedHeads s, uint8_t* packed, bool to_packed) {
  const int64_t words = s.head_bytes / static_cast<int>(sizeof(Word));
  const int64_t total = s.rows * s.heads * words;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = i % words, rh = i / words, h = rh % s.heads, r = rh / s.heads;
    Word* far = reinterpret_cast<Word*>(s.strided + s.row_offsets[r] + h * s.head_stride) + w;
    Word* near = reinterpret_cast<Word*>(packed) + i;
    if (to_packed) {
      *near = *far;
    } else {
      *far = *near;
    }
  }
}

}  // namespace

cudaError_t LaunchStridedHeads(const StridedHeads& s, uint8_t* packed, bool to_packed, cudaStream_t stream) {
  if (s.rows < 0 || s.heads < 0 || s.head_bytes < 0) return cudaErrorInvalidValue;
  if (s.rows == 0 || s.heads == 0 || s.head_bytes == 0) return cudaSuccess;
  const bool wide = s.rows_aligned16 && reinterpret_cast<uintptr_t>(s.strided) % 16 == 0 && reinterpret_cast<uintptr_t>(packed) % 16 == 0 &&
                    s.head_stride % 16 == 0 && s.head_bytes % 16 == 0;
  const int64_t words = s.rows * s.heads * (s.head_bytes / (wide ? 16 : 2));
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((words + 255) / 256, 65536));
  if (wide) {
    StridedHeadsKernel<uint4><<<grid, 256, 0, stream>>>(s, packed, to_packed);
  } else {
    StridedHeadsKernel<uint16_t><<<grid, 256, 0, stream>>>(s, packed, to_packed);
  }
  return cudaGetLastError();
}

cudaError_t LaunchScatter(const ScatterPiece* pieces, int n, const uint8_t* src, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ScatterKernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(pieces, src);
  return cudaGetLastError();
}

}  // namespace tqkv::gpu
