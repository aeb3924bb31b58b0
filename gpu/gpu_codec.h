// Plain-data descriptors of one component's row codec (one layer, kv head,
// K or V) as the kernels see it. Host code fills them from a RowCodec
// (gpu/codec_tables.h); the tables they point at are device copies of the
// CPU's sign vectors, QR matrices, codebooks and QJL matrices (never
// regenerated on the GPU). No CUDA types: included by host and device code.
#ifndef TQKV_GPU_GPU_CODEC_H_
#define TQKV_GPU_GPU_CODEC_H_

#include <cstdint>

namespace tqkv::gpu {

// A block-Hadamard rotation of d <= 1024 has at most 7 power-of-two blocks.
inline constexpr int kMaxHadamardBlocks = 8;
// Largest channel group the kernels are instantiated for (8 values/lane).
inline constexpr int kMaxGroupChannels = 256;

// Uniform-cell quantisation tables (gpu/quant_lut.h): t = fma(u, (cells − 1)
// · kLutUlp, kLutMagic) = 2 + c · 2^-22 holds the cell c in the low mantissa
// bits, and bits(t) · 4 = 4c (mod 2^32) is its byte offset in the table.
inline constexpr float kLutMagic = 2.0f;
inline constexpr uint32_t kLutMagicBits = 0x40000000u;
inline constexpr float kLutUlp = 0x1p-22f;  // the ulp of floats in [2, 4)
// Most cells a B-bit codebook's table may have: what the specialised encode
// holds in shared memory (32 words span the 32 banks once). 0: no table, the
// encode searches the boundaries (2 bits: three compares are cheaper).
constexpr int LutMaxCells(int bits) { return bits == 3 || bits == 4 ? 32 : bits == 8 ? 1024 : 0; }

enum GpuComponentKind : int32_t { kGpuDense = 0, kGpuMse = 1, kGpuRecipe = 2 };
enum GpuRotationKind : int32_t { kGpuHadamard = 0, kGpuQr = 1 };
// Element types of dense tensors (same values as codec/dtype.h's DType).
enum GpuDType : int32_t { kGpuF16 = 0, kGpuBF16 = 1, kGpuF32 = 2 };

struct GpuGroup {
  int32_t channels = 0;  // n
  int32_t mse_bits = 0;
  int32_t qjl = 0;
  int32_t fp16_norms = 0;
  int32_t index_offset = 0, sign_offset = 0, norm_offset = 0, residual_offset = 0;
  int32_t rotation = kGpuHadamard;
  int32_t num_blocks = 0;                      // Hadamard blocks, descending
  int32_t block_size[kMaxHadamardBlocks] = {};
  float block_scale[kMaxHadamardBlocks] = {};  // fl(1/sqrt(block)) as the CPU computes it
  int32_t num_boundaries = 0;
  float qjl_scale = 0;
  int32_t state_offset = 0;  // first float of this group in a query/value state
  const float* s1 = nullptr;          // [n] ±1
  const float* s2 = nullptr;          // [n] ±1
  const float* qr = nullptr;          // [n, n] row-major (QR rotation)
  const float* centroids = nullptr;   // [2^mse_bits]
  const float* boundaries = nullptr;  // [2^mse_bits - 1]
  const float* qjl_matrix = nullptr;  // [n, n] row-major (QJL)
  const int32_t* channel_map = nullptr;  // [n] source channels; null = identity
  // Quantisation table of the codebook (gpu/quant_lut.h); lut_cells == 0
  // when there is none (LutMaxCells(mse_bits) == 0, or no valid table).
  int32_t lut_cells = 0;
  float lut_scale = 0, lut_offset = 0;
  const uint32_t* lut = nullptr;  // [2 · lut_cells]: bnd bit patterns, then base
};

struct GpuComponent {
  int32_t kind = kGpuMse;
  int32_t dim = 0;
  int32_t row_bytes = 0;
  int32_t num_groups = 0;
  int32_t state_size = 0;  // RowCodec::query_state_size()
  int32_t max_group_channels = 0;
  GpuGroup groups[2];
};

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_GPU_CODEC_H_
