// Scatter copies on the device: many small pieces staged back to back in
// one device buffer (one host-to-device copy) land at their destinations in
// one kernel launch, instead of one cudaMemcpyAsync (microseconds of host
// time each) per piece.
#ifndef TQKV_GPU_SCATTER_H_
#define TQKV_GPU_SCATTER_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tqkv::gpu {

struct ScatterPiece {
  uint8_t* dst = nullptr;  // device destination, 16-byte aligned
  uint64_t src = 0;        // offset in the source buffer, a multiple of 16
  uint64_t bytes = 0;      // a multiple of 16
};

// Copies pieces[i] (an array of n pieces) from `src` to their destinations
// on `stream`. `pieces` and `src` are device memory or pinned host memory
// (read through its device mapping). cudaErrorInvalidValue for n < 0;
// pieces must not overlap.
cudaError_t LaunchScatter(const ScatterPiece* pieces, int n, const uint8_t* src, cudaStream_t stream);

// Head rows between a strided layout (another process's K/V cache) and a
// packed one ([rows, heads, head_bytes], the codec kernels' input and
// output). Row r's head h lies at strided + row_offsets[r] + h·head_stride
// (head_bytes contiguous). `to_packed` gathers strided → packed, else
// scatters packed → strided. All byte counts and offsets are multiples of
// 2; copies go in 16-byte words where everything is a multiple of 16.
// cudaErrorInvalidValue for a negative count.
struct StridedHeads {
  uint8_t* strided = nullptr;
  const int64_t* row_offsets = nullptr;  // device memory, `rows` of them
  int64_t rows = 0;
  int heads = 0;
  int64_t head_stride = 0;
  int head_bytes = 0;
  bool rows_aligned16 = false;  // every row offset is a multiple of 16
};
cudaError_t LaunchStridedHeads(const StridedHeads& s, uint8_t* packed, bool to_packed, cudaStream_t stream);

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_SCATTER_H_
