// Launchers of the encode/decode kernels (gpu/kernels/codec_kernels.cuh).
#include "gpu/kernels.h"

#include <type_traits>

#include "gpu/kernels/codec_kernels.cuh"
#include "gpu/kernels/encode_fast.cuh"
#include "gpu/kernels/decode_rows.cuh"
#include "gpu/kernels/encode_rows.cuh"
#include "gpu/launch_util.h"

namespace tqkv::gpu {
namespace {

// Checks slots into *bad (reset to kNoBadSlot first).
cudaError_t CheckSlots(const int64_t* slots, int64_t n, int64_t num_slots, unsigned long long* bad,
                       cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), stream);
  if (e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  CheckSlotsKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(slots, n, num_slots, bad);
  return cudaGetLastError();
}

template <int VPL>
cudaError_t EncodeWith(const EncodeLaunch& a, cudaStream_t stream) {
  const int64_t rows = a.tokens * a.heads;
  const dim3 grid(static_cast<unsigned>((rows + kCodecWarps - 1) / kCodecWarps), 2);
  const size_t smem = kCodecWarps * (VPL * 32 * 2 + 256) * sizeof(float);
  EncodeKernel<VPL><<<grid, 32 * kCodecWarps, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int VPL>
cudaError_t DecodeWith(const DecodeLaunch& a, cudaStream_t stream) {
  const int64_t rows = a.tokens * a.heads;
  const dim3 grid(static_cast<unsigned>((rows + kCodecWarps - 1) / kCodecWarps), 2);
  const size_t smem = kCodecWarps * VPL * 32 * sizeof(float);
  DecodeKernel<VPL><<<grid, 32 * kCodecWarps, smem, stream>>>(a);
  return cudaGetLastError();
}

bool Aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

// Bits of the specialised encode if every head's component qualifies, else 0.
int FastEncodeBits(const GpuComponent* comps, int heads) {
  int bits = 0;
  for (int h = 0; h < heads; ++h) {
    const GpuComponent& c = comps[h];
    const GpuGroup& g = c.groups[0];
    const int b = g.mse_bits;
    if (c.kind != kGpuMse || c.num_groups != 1 || c.dim != 128 || g.channels != 128 ||
        (b != 2 && b != 3 && b != 4 && b != 8) ||
        g.qjl || g.fp16_norms || g.index_offset != 0 || g.norm_offset != 16 * b || c.row_bytes != 16 * b + 4 ||
        g.rotation != kGpuHadamard || g.num_blocks != 1 || g.block_size[0] != 128 || g.channel_map != nullptr ||
        g.num_boundaries != (1 << b) - 1 || (bits != 0 && bits != b))
      return 0;
    bits = b;
  }
  return bits;
}

// True when every head's component has a quantisation table the
// specialised encode can hold (vacuously for bits without tables).
bool HasQuantLuts(const GpuComponent* comps, int heads) {
  for (int h = 0; h < heads; ++h) {
    const GpuGroup& g = comps[h].groups[0];
    const int cap = LutMaxCells(g.mse_bits);
    if (cap > 0 && (g.lut == nullptr || g.lut_cells < 2 || g.lut_cells > cap)) return false;
  }
  return true;
}

template <int KB, int VB, typename T, bool kLut, bool kXpose, int kMinBlocks>
cudaError_t EncodeFastKV(const EncodeLaunch& a, cudaStream_t stream) {
  const int64_t blocks = a.heads * ((a.tokens + kEncTokensPerBlock - 1) / kEncTokensPerBlock);
  const dim3 grid(static_cast<unsigned>(blocks), 2);
  EncodeFastKernel<KB, VB, T, kLut, kXpose, kMinBlocks><<<grid, 32 * kEncWarps, 0, stream>>>(a);
  return cudaGetLastError();
}

template <int KB, int VB, typename T, bool kLut, int kBufs, bool kFew>
cudaError_t LaunchLaneRows(const EncodeLaunch& a, cudaStream_t stream) {
  constexpr size_t smem = LaneRowSmemBytes(kBufs);
  const void* kernel = reinterpret_cast<const void*>(EncodeLaneRowsKernel<KB, VB, T, kLut, kBufs, kFew>);
  cudaError_t e = AllowDynamicSmem(kernel, smem);
  if (e != cudaSuccess) return e;
  const int64_t per_block = LaneRowBlockTokens(a.tokens, a.heads);
  const int64_t blocks = a.heads / LaneRowBlockHeads(a.heads) * ((a.tokens + per_block - 1) / per_block);
  const dim3 grid(static_cast<unsigned>(blocks), 2);
  EncodeLaneRowsKernel<KB, VB, T, kLut, kBufs, kFew><<<grid, 32 * kLaneRowWarps, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int KB, int VB, typename T, bool kLut, int kBufs>
cudaError_t EncodeLaneRowsKV(const EncodeLaunch& a, cudaStream_t stream) {
  return LaneRowPasses(a.tokens, a.heads) < kLaneRowPasses ? LaunchLaneRows<KB, VB, T, kLut, kBufs, true>(a, stream)
                                                           : LaunchLaneRows<KB, VB, T, kLut, kBufs, false>(a, stream);
}

// The variant the launch asks for: two lanes per row from 16-bit input
// (EncodeUsesLaneRows; its input buffers from encode_blocks_per_sm),
// else the 8-lane kernel, from fp16 input with encode_transpose and
// encode_blocks_per_sm, the default from the others.
template <int KB, int VB, typename T, bool kLut>
cudaError_t EncodeFastKV(const EncodeLaunch& a, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float> && KB <= 4 && VB <= 4) {
    if (EncodeUsesLaneRows(a)) {
      return a.encode_blocks_per_sm == 3 ? EncodeLaneRowsKV<KB, VB, T, kLut, LaneRowBufs(3)>(a, stream)
                                         : EncodeLaneRowsKV<KB, VB, T, kLut, LaneRowBufs(2)>(a, stream);
    }
  }
  if constexpr (std::is_same_v<T, __half>) {
    const bool three = a.encode_blocks_per_sm == 3;
    if (a.encode_transpose)
      return three ? EncodeFastKV<KB, VB, T, kLut, true, 3>(a, stream) : EncodeFastKV<KB, VB, T, kLut, true, 2>(a, stream);
    return three ? EncodeFastKV<KB, VB, T, kLut, false, 3>(a, stream) : EncodeFastKV<KB, VB, T, kLut, false, 2>(a, stream);
  } else if constexpr (std::is_same_v<T, float>) {
    return EncodeFastKV<KB, VB, T, kLut, kEncodeTransposeDefault, kEncodeBlocksPerSmF32>(a, stream);
  } else {
    return EncodeFastKV<KB, VB, T, kLut, kEncodeTransposeDefault, kEncodeBlocksPerSmDefault>(a, stream);
  }
}

// The served (K bits, V bits) pairs of the specialised encode and decode:
// f.template operator()<KB, VB>() for the pair, cudaErrorNotSupported for
// any other.
template <typename F>
cudaError_t ByFastPair(int kb, int vb, F&& f) {
  switch (kb * 10 + vb) {
    case 22: return f.template operator()<2, 2>();
    case 33: return f.template operator()<3, 3>();
    case 44: return f.template operator()<4, 4>();
    case 88: return f.template operator()<8, 8>();
    case 42: return f.template operator()<4, 2>();
    case 24: return f.template operator()<2, 4>();
    default: return cudaErrorNotSupported;
  }
}

bool FastEncodePair(int kb, int vb) {
  return ByFastPair(kb, vb, []<int, int>() { return cudaSuccess; }) == cudaSuccess;
}

// kLut: quantise 3-, 4- and 8-bit rows through the tables (2-bit rows
// always compare: no table variant of k2v2).
template <typename T, bool kLut>
cudaError_t EncodeFastWith(const EncodeLaunch& a, cudaStream_t stream) {
  return ByFastPair(FastEncodeBits(a.host_k, a.heads), FastEncodeBits(a.host_v, a.heads), [&]<int KB, int VB>() {
    return EncodeFastKV<KB, VB, T, kLut && !(KB == 2 && VB == 2)>(a, stream);
  });
}

template <typename T>
cudaError_t EncodeFastWith(const EncodeLaunch& a, cudaStream_t stream) {
  return EncodeUsesQuantLut(a) ? EncodeFastWith<T, true>(a, stream) : EncodeFastWith<T, false>(a, stream);
}

template <int KB, int VB, typename T>
cudaError_t DecodeFastKV(const DecodeLaunch& a, cudaStream_t stream) {
  const int64_t per_block = DecodeRowBlockTokens(a.heads);
  const int64_t blocks = a.heads / LaneRowBlockHeads(a.heads) * ((a.tokens + per_block - 1) / per_block);
  DecodeLaneRowsKernel<KB, VB, T><<<dim3(static_cast<unsigned>(blocks), 2), 32 * kLaneRowWarps, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t DecodeFastWith(const DecodeLaunch& a, cudaStream_t stream) {
  return ByFastPair(FastEncodeBits(a.host_k, a.heads), FastEncodeBits(a.host_v, a.heads),
                    [&]<int KB, int VB>() { return DecodeFastKV<KB, VB, T>(a, stream); });
}

}  // namespace

bool EncodeUsesFastPath(const EncodeLaunch& a) {
  if (!a.allow_fast_path || a.host_k == nullptr || a.host_v == nullptr || a.dim != 128 || a.heads <= 0 ||
      (a.dtype != kGpuF16 && a.dtype != kGpuBF16 && a.dtype != kGpuF32))
    return false;
  const uintptr_t in_align = a.dtype == kGpuF32 ? 16 : 8;  // four channels per load
  if (!Aligned(a.k, in_align) || !Aligned(a.v, in_align) || !Aligned(a.k_pages.base, 4) || !Aligned(a.v_pages.base, 4) ||
      a.k_pages.block_stride % 4 != 0 || a.v_pages.block_stride % 4 != 0)
    return false;
  return FastEncodePair(FastEncodeBits(a.host_k, a.heads), FastEncodeBits(a.host_v, a.heads));
}

bool EncodeUsesLaneRows(const EncodeLaunch& a) {
  if (!a.encode_lane_rows || (a.dtype != kGpuF16 && a.dtype != kGpuBF16) || !Aligned(a.k, 16) || !Aligned(a.v, 16) ||
      !LaneRowHeadsFit(a.heads) || !EncodeUsesFastPath(a))
    return false;
  return FastEncodeBits(a.host_k, a.heads) <= 4 && FastEncodeBits(a.host_v, a.heads) <= 4;
}

bool EncodeUsesQuantLut(const EncodeLaunch& a) {
  if (!a.allow_quant_lut || !EncodeUsesFastPath(a)) return false;
  const int kb = FastEncodeBits(a.host_k, a.heads), vb = FastEncodeBits(a.host_v, a.heads);
  return (LutMaxCells(kb) > 0 || LutMaxCells(vb) > 0) && HasQuantLuts(a.host_k, a.heads) &&
         HasQuantLuts(a.host_v, a.heads);
}

cudaError_t LaunchEncode(const EncodeLaunch& a, cudaStream_t stream) {
  if (a.bad_slot == nullptr || a.tokens < 0 || a.heads <= 0 ||
      (a.encode_blocks_per_sm != 2 && a.encode_blocks_per_sm != 3))
    return cudaErrorInvalidValue;
  const int64_t limit = a.k_pages.num_slots < a.v_pages.num_slots ? a.k_pages.num_slots : a.v_pages.num_slots;
  cudaError_t e = CheckSlots(a.slots, a.tokens, limit, a.bad_slot, stream);
  if (e != cudaSuccess || a.tokens == 0) return e;
  if (EncodeUsesFastPath(a)) {
    switch (a.dtype) {
      case kGpuF16: return EncodeFastWith<__half>(a, stream);
      case kGpuBF16: return EncodeFastWith<__nv_bfloat16>(a, stream);
      case kGpuF32: return EncodeFastWith<float>(a, stream);
      default: return cudaErrorNotSupported;
    }
  }
  switch ((a.max_group_channels + 31) / 32) {
    case 0:  // dense components only
    case 1: return EncodeWith<1>(a, stream);
    case 2: return EncodeWith<2>(a, stream);
    case 3: return EncodeWith<3>(a, stream);
    case 4: return EncodeWith<4>(a, stream);
    case 5:
    case 6: return EncodeWith<6>(a, stream);
    case 7:
    case 8: return EncodeWith<8>(a, stream);
    default: return cudaErrorNotSupported;  // groups wider than kMaxGroupChannels
  }
}

bool DecodeUsesFastPath(const DecodeLaunch& a) {
  if (!a.allow_fast_path || a.host_k == nullptr || a.host_v == nullptr || a.dim != 128 || !LaneRowHeadsFit(a.heads) ||
      (a.dtype != kGpuF16 && a.dtype != kGpuBF16 && a.dtype != kGpuF32) || !Aligned(a.k, 16) || !Aligned(a.v, 16) ||
      !Aligned(a.k_pages.base, 4) || !Aligned(a.v_pages.base, 4) || a.k_pages.block_stride % 4 != 0 ||
      a.v_pages.block_stride % 4 != 0)
    return false;
  return FastEncodePair(FastEncodeBits(a.host_k, a.heads), FastEncodeBits(a.host_v, a.heads));
}

cudaError_t LaunchDecode(const DecodeLaunch& a, cudaStream_t stream) {
  if (a.bad_slot == nullptr || a.tokens < 0 || a.heads <= 0) return cudaErrorInvalidValue;
  const int64_t limit = a.k_pages.num_slots < a.v_pages.num_slots ? a.k_pages.num_slots : a.v_pages.num_slots;
  cudaError_t e = CheckSlots(a.slots, a.tokens, limit, a.bad_slot, stream);
  if (e != cudaSuccess || a.tokens == 0) return e;
  if (DecodeUsesFastPath(a)) {
    switch (a.dtype) {
      case kGpuF16: return DecodeFastWith<__half>(a, stream);
      case kGpuBF16: return DecodeFastWith<__nv_bfloat16>(a, stream);
      default: return DecodeFastWith<float>(a, stream);
    }
  }
  switch ((a.max_group_channels + 31) / 32) {
    case 0:
    case 1: return DecodeWith<1>(a, stream);
    case 2: return DecodeWith<2>(a, stream);
    case 3: return DecodeWith<3>(a, stream);
    case 4: return DecodeWith<4>(a, stream);
    case 5:
    case 6: return DecodeWith<6>(a, stream);
    case 7:
    case 8: return DecodeWith<8>(a, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace tqkv::gpu
