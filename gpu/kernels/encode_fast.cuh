// Specialised encode for TurboQuant_mse rows at d = 128 (one group, RHT,
// fp32 norm after the indices, 2- or 4-bit indices) from fp16 input: the
// k4v4 / k4v2 / k2v2 serving formats. Bit-identical to RowCodec::Encode and
// to EncodeKernel.
//
// Layout: 8 lanes per row, 4 rows per warp; lane L of a row holds channels
// j = 4L + e + 32i (e, i in 0..3) loaded as four 8-byte pieces. Then
//  * the canonical sum of squares: accumulator l = 4L + e chains its
//    x_{l+32i} in order i = 0..3 in registers; the butterfly over l
//    (off 16, 8, 4 → lanes L^4, L^2, L^1; off 2, 1 → e^2, e^1 in registers)
//    adds the same pairs as codec/canonical.h (fp32 + is commutative);
//  * the FWHT stages h = 1, 2 (e bits) and 32, 64 (i bits) in registers,
//    h = 4, 8, 16 across lanes (L bits) with the same a+b / a−b per pair as
//    codec/rotation.cc (fma(±1, x, o) rounds exactly like o ± x);
//  * quantisation as a branch-free binary search over the boundaries in
//    registers (= the number of boundaries strictly below y; NaN → 0);
//  * packing with shuffles inside the row's 8 lanes, 4-byte stores.
#ifndef TQKV_GPU_KERNELS_ENCODE_FAST_CUH_
#define TQKV_GPU_KERNELS_ENCODE_FAST_CUH_

#include "gpu/kernels/codec_kernels.cuh"

namespace tqkv::gpu {

inline constexpr int kEncWarps = 8;
inline constexpr int kEncTokensPerBlock = 256;  // per (kv head, component)

template <int B>
__device__ __forceinline__ uint32_t QuantizeFast(float y, const float (&b)[(1 << B) - 1]) {
  if constexpr (B == 2) {
    return static_cast<uint32_t>(y > b[0]) + static_cast<uint32_t>(y > b[1]) + static_cast<uint32_t>(y > b[2]);
  } else {
    const bool c3 = y > b[7];
    const bool c2 = y > (c3 ? b[11] : b[3]);
    const float t1 = c3 ? (c2 ? b[13] : b[9]) : (c2 ? b[5] : b[1]);
    const bool c1 = y > t1;
    const float u0 = c1 ? b[2] : b[0], u1 = c1 ? b[6] : b[4], u2 = c1 ? b[10] : b[8], u3 = c1 ? b[14] : b[12];
    const float t0 = c3 ? (c2 ? u3 : u2) : (c2 ? u1 : u0);
    const bool c0 = y > t0;
    return (c3 ? 8u : 0u) | (c2 ? 4u : 0u) | (c1 ? 2u : 0u) | (c0 ? 1u : 0u);
  }
}

template <int B>
__device__ __forceinline__ void EncodeRowsFast(const EncodeLaunch& a, bool is_k, int h, int64_t tok0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int L = lane & 7, sub = lane >> 3;
  const GpuComponent& c = (is_k ? a.k_comp : a.v_comp)[h];
  const GpuGroup& gr = c.groups[0];
  const PageRegion& pr = is_k ? a.k_pages : a.v_pages;
  const __half* src = static_cast<const __half*>(is_k ? a.k : a.v);
  float s1[16], s2[16];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s1[4 * i + e] = __ldg(gr.s1 + 4 * L + e + 32 * i);
      s2[4 * i + e] = __ldg(gr.s2 + 4 * L + e + 32 * i);
    }
  const float scale = gr.block_scale[0];
  float bnd[(1 << B) - 1];
#pragma unroll
  for (int k = 0; k < (1 << B) - 1; ++k) bnd[k] = __ldg(gr.boundaries + k);

  constexpr int kPasses = kEncTokensPerBlock / (4 * kEncWarps);
  // The next pass's row and slot load while this pass computes.
  auto fetch = [&](int pass, uint2 (&raw)[4], int64_t& slot) {
    const int64_t t = tok0 + (pass * kEncWarps + warp) * 4 + sub;
    slot = -1;
    if (pass < kPasses && t < a.tokens) {
      slot = __ldg(a.slots + t);
      const __half* row = src + (t * a.heads + h) * 128 + 4 * L;
#pragma unroll
      for (int i = 0; i < 4; ++i) raw[i] = __ldcs(reinterpret_cast<const uint2*>(row + 32 * i));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) raw[i] = make_uint2(0u, 0u);
    }
  };
  uint2 nraw[4];
  int64_t nslot;
  fetch(0, nraw, nslot);
  for (int pass = 0; pass < kPasses; ++pass) {
    float x[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 lo = *reinterpret_cast<const __half2*>(&nraw[i].x);
      const __half2 hi = *reinterpret_cast<const __half2*>(&nraw[i].y);
      x[4 * i + 0] = __low2float(lo);
      x[4 * i + 1] = __high2float(lo);
      x[4 * i + 2] = __low2float(hi);
      x[4 * i + 3] = __high2float(hi);
    }
    const int64_t slot = nslot;
    fetch(pass + 1, nraw, nslot);
    // Canonical norm.
    float acc[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[e] = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[e] = __fmaf_rn(x[4 * i + e], x[4 * i + e], acc[e]);
    }
#pragma unroll
    for (int off = 4; off >= 1; off >>= 1)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = __fadd_rn(acc[e], __shfl_xor_sync(kFullMask, acc[e], off));
    const float ss = __fadd_rn(__fadd_rn(acc[0], acc[2]), __fadd_rn(acc[1], acc[3]));
    const float norm = __fsqrt_rn(ss);
    const float inv = norm > 0.0f ? __fdiv_rn(1.0f, norm) : 0.0f;
#pragma unroll
    for (int r = 0; r < 16; ++r) x[r] = __fmul_rn(__fmul_rn(x[r], inv), s1[r]);
    // FWHT, stages h = 1, 2 (e bits), 4, 8, 16 (lane bits), 32, 64 (i bits).
#pragma unroll
    for (int hb = 1; hb <= 2; hb <<= 1)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if ((e & hb) == 0) {
            const float p = x[4 * i + e], q = x[4 * i + e + hb];
            x[4 * i + e] = __fadd_rn(p, q);
            x[4 * i + e + hb] = __fsub_rn(p, q);
          }
#pragma unroll
    for (int hl = 1; hl <= 4; hl <<= 1) {
      const float sg = (L & hl) ? -1.0f : 1.0f;
#pragma unroll
      for (int r = 0; r < 16; ++r) x[r] = __fmaf_rn(sg, x[r], __shfl_xor_sync(kFullMask, x[r], hl));
    }
#pragma unroll
    for (int hi = 1; hi <= 2; hi <<= 1)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if ((i & hi) == 0)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float p = x[4 * i + e], q = x[4 * (i + hi) + e];
            x[4 * i + e] = __fadd_rn(p, q);
            x[4 * (i + hi) + e] = __fsub_rn(p, q);
          }
    // Scale, signs, quantise, pack.
    uint32_t part[4];  // per i: the lane's 4 channels' indices, packed
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t v = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float y = __fmul_rn(__fmul_rn(x[4 * i + e], scale), s2[4 * i + e]);
        v |= QuantizeFast<B>(y, bnd) << (B * e);
      }
      part[i] = v;
    }
    uint8_t* dst = nullptr;
    if (slot >= 0) dst = RowAddress(pr, slot, a.heads, h, c.row_bytes);
    if constexpr (B == 4) {
      // Lane L: 16 bits at byte 2L + 16i; even lanes store words L/2 + 4i.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w = part[i] | (__shfl_down_sync(kFullMask, part[i], 1) << 16);
        if (dst && (L & 1) == 0) *reinterpret_cast<uint32_t*>(dst + 2 * L + 16 * i) = w;
      }
    } else {
      // Lane L: 8 bits at byte L + 8i; lanes 0 and 4 store words L/4 + 2i.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w = part[i] | (__shfl_down_sync(kFullMask, part[i], 1) << 8) |
                           (__shfl_down_sync(kFullMask, part[i], 2) << 16) |
                           (__shfl_down_sync(kFullMask, part[i], 3) << 24);
        if (dst && (L & 3) == 0) *reinterpret_cast<uint32_t*>(dst + L + 8 * i) = w;
      }
    }
    if (dst && L == 0) *reinterpret_cast<float*>(dst + 16 * B) = norm;
  }
}

// grid: (heads × token blocks, 2 components); 256 threads.
template <int KB, int VB>
__global__ void __launch_bounds__(32 * kEncWarps, 2) EncodeFastKernel(EncodeLaunch a) {
  if (*a.bad_slot != kNoBadSlot) return;
  const int h = static_cast<int>(blockIdx.x % a.heads);
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x / a.heads) * kEncTokensPerBlock;
  if (blockIdx.y == 0) EncodeRowsFast<KB>(a, true, h, tok0);
  else EncodeRowsFast<VB>(a, false, h, tok0);
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ENCODE_FAST_CUH_
