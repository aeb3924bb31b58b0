// Specialised encode for TurboQuant_mse rows at d = 128 (one group, RHT,
// fp32 norm after the indices, 2-, 3-, 4- or 8-bit indices) from fp16, bf16
// or fp32 input: k2v2 / k3v3 / k4v4 / k8v8 / k4v2 / k2v4. Bit-identical to
// RowCodec::Encode and to EncodeKernel.
//
// Layout A: 8 lanes per row, 4 rows per warp; lane L of a row holds channels
// j = 4L + e + 32i (e, i in 0..3; channel bits 0-1 = e, 2-4 = L, 5-6 = i),
// loaded as four 4-channel pieces. Then
//  * the first sign vector s1 as an XOR of the raw input's sign bits (one
//    LOP per 32-bit word: (x·inv)·s1 = (±x)·inv exactly, round-to-nearest
//    being sign-symmetric, and x² is unchanged);
//  * the canonical sum of squares (codec/canonical.h): accumulator l = 4L + e
//    chains its x_{l+32i} in order i = 0..3 in registers, then the butterfly
//    over l (off 16, 8, 4: lane bits; off 2, 1: e bits) adds the same pairs
//    as the reference (fp32 + is commutative) — kXpose: through shared
//    memory, one 16-byte read giving each lane the four leaves of its
//    off-16/off-8 subtree, then three shuffles (RowSumSquares); otherwise
//    three shuffle levels of four values;
//  * the FWHT with the same a+b / a−b per pair, in the same stage order, as
//    codec/rotation.cc: h = 1, 2 (e bits) in registers; h = 4, 8, 16 (lane
//    bits) — kXpose: in registers of layout B (lane bits = channel bits
//    {1, 5, 6}, registers = 8 pairs over bits {0} × {2, 3, 4}) reached and
//    left through a conflict-free shared-memory transpose (FwhtLaneStages);
//    otherwise across lanes as fma(±1, x, shfl), which rounds exactly like
//    o ± x; h = 32, 64 (i bits) in registers;
//  * y = x·(±scale), one FMUL: (x·scale)·s2 with s2 = ±1 is exactly that;
//  * quantisation (= the number of boundaries strictly below y; NaN → 0):
//    3-, 4- and 8-bit rows through the codebook's uniform-cell table in
//    shared memory (gpu/quant_lut.h: two FFMA, the address from the second
//    one's bit pattern, two LDS, one compare); 2-bit rows as the sum of
//    three compares; codebooks without a table (kLut = false) by a
//    branch-free search over boundaries in registers (3/4 bits) or an
//    8-step search over the block's boundaries in shared memory (8 bits);
//  * packing with shuffles inside the row's 8 lanes, 4-byte stores (3 bits:
//    lanes 0..2 assemble the three words of each 12-byte chunk).
// SASS instructions per pass (4 rows per warp) from fp16, 2 blocks/SM,
// shuffles → transposes: k4v4 580 → 552, k3v3 616 → 584, k8v8 572 → 541
// (tables), k2v2 584 → 551: k4v4 trades 57 SHFL and 48 FFMA for 39 FADD,
// 17 STS, 13 LDS and ~10 integer ops. Registers: k4v4 96 → 102, still 2
// blocks/SM; the 3-blocks/SM budget (80, no spills with tables) costs 3-6
// instructions per pass.
#ifndef TQKV_GPU_KERNELS_ENCODE_FAST_CUH_
#define TQKV_GPU_KERNELS_ENCODE_FAST_CUH_

#include <type_traits>

#include "gpu/kernels/codec_kernels.cuh"

namespace tqkv::gpu {

inline constexpr int kEncWarps = 8;
inline constexpr int kEncTokensPerBlock = 256;  // per (kv head, component)

// B-bit rows of a launch with kLut quantise through the codebook's table
// (LutMaxCells(B) words of bnd, then of base, in shared memory).
template <int B, bool kLut>
inline constexpr bool kUseLut = kLut && LutMaxCells(B) > 0;
// Otherwise the boundaries: in registers for B <= 4 (compares / branch-free
// search), in shared memory for B = 8 (eight dependent lookups).
template <int B>
inline constexpr bool kBoundsInRegs = B <= 4;
template <int B>
inline constexpr int kRegBounds = kBoundsInRegs<B> ? (1 << B) - 1 : 1;

// Number of boundaries strictly below y through the uniform-cell table
// (gpu/quant_lut.h; QuantLutIndex bit for bit): the saturating FFMA maps
// every float into [0, 1] (NaN → +0, so NaN → cell 0 → index 0), the
// second puts the cell c in the low mantissa bits of t = 2 + c·2^-22, and
// c − bits(2) folds away in 32-bit address arithmetic (bits(2)·4 = 2^32):
// one LEA addresses bnd (lut[c]) and base (lut[kCap + c]). `step` =
// (cells − 1)·2^-22. 8 SASS instructions per value with the packing, two
// of them LDS.
template <int kCap>
__device__ __forceinline__ uint32_t QuantizeLut(float y, float scale, float offset, float step,
                                                const uint32_t* lut) {
  float u;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(u) : "f"(y), "f"(scale), "f"(offset));
  const uint32_t c = __float_as_uint(__fmaf_rn(u, step, kLutMagic)) - kLutMagicBits;
  // base + (y > bnd) as FSETP and a predicated increment: ptxas turns the
  // C++ sum (or base − set.gt.u32 mask) into FSETP, SEL and IADD3.
  uint32_t idx = lut[kCap + c];
  asm("{\n .reg .pred p;\n setp.gt.f32 p, %1, %2;\n @p add.u32 %0, %0, 1;\n}" : "+r"(idx) : "f"(y), "f"(__uint_as_float(lut[c])));
  return idx;
}

// 0xffffffff if a > b, else 0 (NaN: 0). Written as PTX set: nvcc turns the
// C++ (a > b) sums of QuantizeFast<2> into longer select chains.
__device__ __forceinline__ uint32_t GreaterMask(float a, float b) {
  uint32_t r;
  asm("set.gt.u32.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));
  return r;
}

// Number of boundaries strictly below y by comparing / searching
// (codec/codebook.h; NaN → 0).
template <int B>
__device__ __forceinline__ uint32_t QuantizeFast(float y, const float (&b)[kRegBounds<B>], const float* bsm) {
  if constexpr (B == 2) {
    return 0u - (GreaterMask(y, b[0]) + GreaterMask(y, b[1]) + GreaterMask(y, b[2]));
  } else if constexpr (B == 3) {
    const bool c2 = y > b[3];
    const bool c1 = y > (c2 ? b[5] : b[1]);
    const float t0 = c2 ? (c1 ? b[6] : b[4]) : (c1 ? b[2] : b[0]);
    const bool c0 = y > t0;
    return (c2 ? 4u : 0u) | (c1 ? 2u : 0u) | (c0 ? 1u : 0u);
  } else if constexpr (B == 4) {
    const bool c3 = y > b[7];
    const bool c2 = y > (c3 ? b[11] : b[3]);
    const float t1 = c3 ? (c2 ? b[13] : b[9]) : (c2 ? b[5] : b[1]);
    const bool c1 = y > t1;
    const float u0 = c1 ? b[2] : b[0], u1 = c1 ? b[6] : b[4], u2 = c1 ? b[10] : b[8], u3 = c1 ? b[14] : b[12];
    const float t0 = c3 ? (c2 ? u3 : u2) : (c2 ? u1 : u0);
    const bool c0 = y > t0;
    return (c3 ? 8u : 0u) | (c2 ? 4u : 0u) | (c1 ? 2u : 0u) | (c0 ? 1u : 0u);
  } else {
    uint32_t idx = 0;
#pragma unroll
    for (uint32_t st = 1u << (B - 1); st; st >>= 1)
      if (y > bsm[idx + st - 1]) idx += st;
    return idx;
  }
}

// Input element loads: four consecutive channels of a row; SignMask/Flip
// apply ±1 signs to the raw words (the sign bit of each channel).
template <typename T>
struct FastInput {
  using Raw = uint2;  // 4 × 16-bit
  static __device__ __forceinline__ Raw Load(const T* p) { return __ldcs(reinterpret_cast<const uint2*>(p)); }
  static __device__ __forceinline__ Raw SignMask(const float* s) {
    auto bit = [](float v, uint32_t m) { return v < 0.0f ? m : 0u; };
    return make_uint2(bit(s[0], 0x8000u) | bit(s[1], 0x80000000u), bit(s[2], 0x8000u) | bit(s[3], 0x80000000u));
  }
  static __device__ __forceinline__ void Flip(Raw& r, const Raw& m) { r.x ^= m.x, r.y ^= m.y; }
  static __device__ __forceinline__ void ToFloat(const Raw& r, float* x) {
    if constexpr (std::is_same_v<T, __half>) {
      const __half2 lo = *reinterpret_cast<const __half2*>(&r.x);
      const __half2 hi = *reinterpret_cast<const __half2*>(&r.y);
      x[0] = __low2float(lo), x[1] = __high2float(lo), x[2] = __low2float(hi), x[3] = __high2float(hi);
    } else {
      const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&r.x);
      const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&r.y);
      x[0] = __low2float(lo), x[1] = __high2float(lo), x[2] = __low2float(hi), x[3] = __high2float(hi);
    }
  }
};
template <>
struct FastInput<float> {
  using Raw = uint4;
  static __device__ __forceinline__ Raw Load(const float* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
  static __device__ __forceinline__ Raw SignMask(const float* s) {
    auto bit = [](float v) { return v < 0.0f ? 0x80000000u : 0u; };
    return make_uint4(bit(s[0]), bit(s[1]), bit(s[2]), bit(s[3]));
  }
  static __device__ __forceinline__ void Flip(Raw& r, const Raw& m) { r.x ^= m.x, r.y ^= m.y, r.z ^= m.z, r.w ^= m.w; }
  static __device__ __forceinline__ void ToFloat(const Raw& r, float* x) {
    x[0] = __uint_as_float(r.x), x[1] = __uint_as_float(r.y), x[2] = __uint_as_float(r.z), x[3] = __uint_as_float(r.w);
  }
};

// Per-warp shared memory of the kXpose exchanges: the 4 rows' values (row r
// at kXRowWords·r, its channel chunk i = 32i..32i+31 at kXChunkWords·i) and
// the norm's accumulators (row r at kNormRowWords·r). The padding makes
// every access below conflict-free.
inline constexpr int kXChunkWords = 36, kXRowWords = 4 * kXChunkWords, kNormRowWords = 40;
struct __align__(16) EncodeWarpSmem {
  float x[4 * kXRowWords];
  float acc[4 * kNormRowWords];
};

// Σ x_j² of the lane's row (x in layout A) in the canonical order, the same
// value in its 8 lanes; nr: the row's acc words.
template <bool kXpose>
__device__ __forceinline__ float RowSumSquares(const float (&x)[16], int L, float* nr) {
  float acc[4];  // acc_l, l = 4L + e
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    acc[e] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[e] = __fmaf_rn(x[4 * i + e], x[4 * i + e], acc[e]);
  }
  if constexpr (kXpose) {
    // With a_m = acc_{e+4m}, the value after off 16, 8, 4 at l = e is
    //   ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
    // a_m of e is stored at word 8e + 4(m & 1) + (m >> 1); lane L reads
    // (a_h, a_{h+2}, a_{h+4}, a_{h+6}) of e = L & 3, h = L >> 2 as one
    // float4; the row stride of 40 words keeps the four rows' stores apart.
#pragma unroll
    for (int e = 0; e < 4; ++e) nr[8 * e + 4 * (L & 1) + (L >> 1)] = acc[e];
    __syncwarp();
    const float4 q = *reinterpret_cast<const float4*>(nr + 8 * (L & 3) + 4 * (L >> 2));
    float t = __fadd_rn(__fadd_rn(q.x, q.z), __fadd_rn(q.y, q.w));  // off 16, off 8
    t = __fadd_rn(t, __shfl_xor_sync(kFullMask, t, 4));              // off 4: the other h
    t = __fadd_rn(t, __shfl_xor_sync(kFullMask, t, 2));              // off 2: e ^ 2
    return __fadd_rn(t, __shfl_xor_sync(kFullMask, t, 1));           // off 1: e ^ 1
  } else {
#pragma unroll
    for (int off = 4; off >= 1; off >>= 1)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = __fadd_rn(acc[e], __shfl_xor_sync(kFullMask, acc[e], off));
    return __fadd_rn(__fadd_rn(acc[0], acc[2]), __fadd_rn(acc[1], acc[3]));
  }
}

// FWHT stages h = 4, 8, 16 (channel bits 2-4 = the lane bits of layout A)
// of the lane's row; x in layout A before and after; xr: the row's x words.
template <bool kXpose>
__device__ __forceinline__ void FwhtLaneStages(float (&x)[16], int L, float* xr) {
  if constexpr (kXpose) {
    // Channel j at word kXChunkWords·(j >> 5) + (j & 31). Layout A stores
    // its 4 channels 4L..4L+3 of chunk i as one float4 (a quarter-warp, one
    // row, covers the 32 banks). Layout B: lane L holds channels
    // j0 + 2(L & 1) + 4k + 32(L >> 1), j0 in 0..1, k (channel bits 2-4) in
    // 0..7, as 8 float2 (a half-warp, two rows 144 words apart, covers the
    // 32 banks: the chunk padding of 4 words separates L >> 1).
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<float4*>(xr + kXChunkWords * i + 4 * L) =
          make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
    __syncwarp();
    float* xb = xr + kXChunkWords * (L >> 1) + 2 * (L & 1);
    float y[16];  // y[2k + j0]
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float2 v = *reinterpret_cast<const float2*>(xb + 4 * k);
      y[2 * k] = v.x, y[2 * k + 1] = v.y;
    }
#pragma unroll
    for (int hk = 1; hk <= 4; hk <<= 1)  // h = 4hk
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if ((k & hk) == 0)
#pragma unroll
          for (int j0 = 0; j0 < 2; ++j0) {
            const float p = y[2 * k + j0], q = y[2 * (k + hk) + j0];
            y[2 * k + j0] = __fadd_rn(p, q);
            y[2 * (k + hk) + j0] = __fsub_rn(p, q);
          }
    // Each lane rewrites only the words it read, so no other lane's read of
    // them is pending; the next pass's stores likewise hit this lane's own
    // layout-A words.
#pragma unroll
    for (int k = 0; k < 8; ++k) *reinterpret_cast<float2*>(xb + 4 * k) = make_float2(y[2 * k], y[2 * k + 1]);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 v = *reinterpret_cast<const float4*>(xr + kXChunkWords * i + 4 * L);
      x[4 * i] = v.x, x[4 * i + 1] = v.y, x[4 * i + 2] = v.z, x[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int hl = 1; hl <= 4; hl <<= 1) {
      const float sg = (L & hl) ? -1.0f : 1.0f;
#pragma unroll
      for (int r = 0; r < 16; ++r) x[r] = __fmaf_rn(sg, x[r], __shfl_xor_sync(kFullMask, x[r], hl));
    }
  }
}

template <int B, typename T, bool kLut, bool kXpose>
__device__ __forceinline__ void EncodeRowsFast(const EncodeLaunch& a, bool is_k, int h, int64_t tok0,
                                               EncodeWarpSmem* ws) {
  using In = FastInput<T>;
  using Raw = typename In::Raw;
  constexpr int kCap = LutMaxCells(B);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int L = lane & 7, sub = lane >> 3;
  const GpuComponent& c = (is_k ? a.k_comp : a.v_comp)[h];
  const GpuGroup& gr = c.groups[0];
  const PageRegion pr = is_k ? a.k_pages : a.v_pages;  // by value: registers, not a param-space load per row
  const T* src = static_cast<const T*>(is_k ? a.k : a.v);
  // s1 as sign-bit masks of the raw pieces; scale·s2 = ±scale.
  Raw sgn[4];
  float ss2[16];
  const float scale = gr.block_scale[0];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float s1[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s1[e] = __ldg(gr.s1 + 4 * L + e + 32 * i);
      ss2[4 * i + e] = __fmul_rn(scale, __ldg(gr.s2 + 4 * L + e + 32 * i));
    }
    sgn[i] = In::SignMask(s1);
  }
  float bnd[kRegBounds<B>];
  const float* bsm = nullptr;
  const uint32_t* lut = nullptr;
  float lut_scale = 0.0f, lut_offset = 0.0f, lut_step = 0.0f;
  if constexpr (kUseLut<B, kLut>) {
    __shared__ uint32_t lut_arr[2 * kCap];
    const int cells = gr.lut_cells;  // <= kCap (EncodeUsesQuantLut)
    for (int k = threadIdx.x; k < cells; k += blockDim.x) {
      lut_arr[k] = __ldg(gr.lut + k);
      lut_arr[kCap + k] = __ldg(gr.lut + cells + k);
    }
    __syncthreads();
    lut = lut_arr;
    lut_scale = gr.lut_scale;
    lut_offset = gr.lut_offset;
    lut_step = static_cast<float>(cells - 1) * kLutUlp;
    bnd[0] = 0.0f;
  } else if constexpr (kBoundsInRegs<B>) {
#pragma unroll
    for (int k = 0; k < (1 << B) - 1; ++k) bnd[k] = __ldg(gr.boundaries + k);
  } else {
    __shared__ float bsm_arr[(1 << B) - 1];
    for (int k = threadIdx.x; k < (1 << B) - 1; k += blockDim.x) bsm_arr[k] = __ldg(gr.boundaries + k);
    __syncthreads();
    bsm = bsm_arr;
    bnd[0] = 0.0f;
  }

  constexpr int kPasses = kEncTokensPerBlock / (4 * kEncWarps);
  // 3-bit packing: word L (L < 3) of a chunk = (p[a] >> ra) | (p[b] << lb) |
  // (p[c] << lc) (| p[5] << 28 for word 1) over the row's lanes' 12-bit parts.
  const int3 p3_src = L == 0 ? make_int3(0, 1, 2) : (L == 1 ? make_int3(2, 3, 4) : make_int3(5, 6, 7));
  const int3 p3_sh = L == 0 ? make_int3(0, 12, 24) : (L == 1 ? make_int3(8, 4, 16) : make_int3(4, 8, 20));
  // The next pass's row and slot load while this pass computes.
  auto fetch = [&](int pass, Raw (&raw)[4], int64_t& slot) {
    const int64_t t = tok0 + (pass * kEncWarps + warp) * 4 + sub;
    slot = -1;
    if (pass < kPasses && t < a.tokens) {
      slot = __ldg(a.slots + t);
      const T* row = src + (t * a.heads + h) * 128 + 4 * L;
#pragma unroll
      for (int i = 0; i < 4; ++i) raw[i] = In::Load(row + 32 * i);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) raw[i] = Raw{};
    }
  };
  Raw nraw[4];
  int64_t nslot;
  fetch(0, nraw, nslot);
  for (int pass = 0; pass < kPasses; ++pass) {
    float x[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      In::Flip(nraw[i], sgn[i]);
      In::ToFloat(nraw[i], x + 4 * i);
    }
    const int64_t slot = nslot;
    fetch(pass + 1, nraw, nslot);
    const float ss = RowSumSquares<kXpose>(x, L, ws->acc + kNormRowWords * sub);
    const float norm = __fsqrt_rn(ss);
    const float inv = norm > 0.0f ? __fdiv_rn(1.0f, norm) : 0.0f;
#pragma unroll
    for (int r = 0; r < 16; ++r) x[r] = __fmul_rn(x[r], inv);
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
    FwhtLaneStages<kXpose>(x, L, ws->x + kXRowWords * sub);
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
    // Scale and signs, quantise, pack.
    uint32_t part[4];  // per i: the lane's 4 channels' indices, packed
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t v = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float y = __fmul_rn(x[4 * i + e], ss2[4 * i + e]);
        uint32_t q;
        if constexpr (kUseLut<B, kLut>) q = QuantizeLut<kCap>(y, lut_scale, lut_offset, lut_step, lut);
        else q = QuantizeFast<B>(y, bnd, bsm);
        v += q << (B * e);  // disjoint fields: + packs like | and folds into LEA/IMAD
      }
      part[i] = v;
    }
    uint8_t* dst = nullptr;
    if (slot >= 0) dst = RowAddress(pr, slot, a.heads, h, c.row_bytes);
    if constexpr (B == 8) {
      // Lane L: the word at byte 4L + 32i.
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (dst) *reinterpret_cast<uint32_t*>(dst + 4 * L + 32 * i) = part[i];
    } else if constexpr (B == 4) {
      // Lane L: 16 bits at byte 2L + 16i; even lanes store words L/2 + 4i.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w = part[i] | (__shfl_down_sync(kFullMask, part[i], 1) << 16);
        if (dst && (L & 1) == 0) *reinterpret_cast<uint32_t*>(dst + 2 * L + 16 * i) = w;
      }
    } else if constexpr (B == 3) {
      // Lane L: 12 bits at bit 12L of the 12-byte chunk 12i; lanes 0..2
      // assemble and store its words (sources / shifts per word below).
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t sa = __shfl_sync(kFullMask, part[i], p3_src.x, 8);
        const uint32_t sb = __shfl_sync(kFullMask, part[i], p3_src.y, 8);
        const uint32_t sc = __shfl_sync(kFullMask, part[i], p3_src.z, 8);
        const uint32_t sd = __shfl_sync(kFullMask, part[i], 5, 8);
        const uint32_t w = (sa >> p3_sh.x) | (sb << p3_sh.y) | (sc << p3_sh.z) | (L == 1 ? sd << 28 : 0u);
        if (dst && L < 3) *reinterpret_cast<uint32_t*>(dst + 4 * L + 12 * i) = w;
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

// grid: (heads × token blocks, 2 components); 256 threads. kLut: every
// 3-, 4- and 8-bit component has a table of at most LutMaxCells(B) cells.
// kXpose: shared-memory transposes instead of shuffles (see the top);
// kMinBlocks: blocks per SM the registers are budgeted for (2: 128, 3: 80).
template <int KB, int VB, typename T, bool kLut, bool kXpose, int kMinBlocks>
__global__ void __launch_bounds__(32 * kEncWarps, kMinBlocks) EncodeFastKernel(EncodeLaunch a) {
  __shared__ EncodeWarpSmem smem[kXpose ? kEncWarps : 1];
  if (*a.bad_slot != kNoBadSlot) return;
  const int h = static_cast<int>(blockIdx.x % a.heads);
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x / a.heads) * kEncTokensPerBlock;
  EncodeWarpSmem* ws = smem + (kXpose ? threadIdx.x >> 5 : 0);
  if (blockIdx.y == 0) EncodeRowsFast<KB, T, kLut, kXpose>(a, true, h, tok0, ws);
  else EncodeRowsFast<VB, T, kLut, kXpose>(a, false, h, tok0, ws);
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ENCODE_FAST_CUH_
