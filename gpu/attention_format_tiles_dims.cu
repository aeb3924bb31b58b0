// The format-tiles kernel's entries of kFormatTiles at head dims 64, 96 and
// 256 (gpu/format_tiles.h).
#include "gpu/format_tiles.h"
#include "gpu/kernels/attention_format_tiles.cuh"

namespace tqkv::gpu {

cudaError_t LaunchFormatTilesDims(const AttentionLaunch& a, const AttnDims& d, const float* states, float* records,
                                  cudaStream_t stream) {
  constexpr int kFirst = 29;
  return LaunchFormatTilesIn<kFirst>(std::make_integer_sequence<int, kNumFormatTiles - kFirst>{}, a, d, states,
                                     records, stream);
}

}  // namespace tqkv::gpu
