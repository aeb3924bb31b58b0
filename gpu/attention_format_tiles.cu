// The format-tiles kernel's d = 128 entries of kFormatTiles (every mse bit
// pair, the recipes) and the launch's dispatch; the other head dims are in
// attention_format_tiles_dims.cu.
#include "gpu/format_tiles.h"
#include "gpu/kernels/attention_format_tiles.cuh"

namespace tqkv::gpu {

inline constexpr int kFormatTilesD128 = 29;  // entries 0 .. 28 (gpu/format_tiles.h)
static_assert(kFormatTiles[kFormatTilesD128 - 1].k.dim == 128 && kFormatTiles[kFormatTilesD128].k.dim != 128);

cudaError_t LaunchFormatTilesDims(const AttentionLaunch& a, const AttnDims& d, const float* states, float* records,
                                  cudaStream_t stream);

cudaError_t LaunchFormatTiles(const AttentionLaunch& a, const AttnDims& d, const float* states, float* records,
                              cudaStream_t stream) {
  if (d.format_tiles < 0 || d.format_tiles >= kNumFormatTiles) return cudaErrorNotSupported;
  if (d.format_tiles >= kFormatTilesD128) return LaunchFormatTilesDims(a, d, states, records, stream);
  return LaunchFormatTilesIn<0>(std::make_integer_sequence<int, kFormatTilesD128>{}, a, d, states, records, stream);
}

}  // namespace tqkv::gpu
