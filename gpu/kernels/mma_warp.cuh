// Warp-level pieces of the tensor-core decode kernels (MmaDecodeKernel in
// attention_mma.cuh, StagedDecodeKernel in attention_staged.cuh,
// RowSetDecodeKernel in attention_rowset.cuh): the fp16 mma, fp16 packing
// and byte permutes, lookup addresses for tables of 128- or 256-byte rows
// and the lookups themselves (immediates past the dynamic shared memory's
// window base), register dequantisation of 2-bit keys, the
// tokens-on-M softmax and value mmas, the page stream, and the block merge
// of the warps' records.
#ifndef TQKV_GPU_KERNELS_MMA_WARP_CUH_
#define TQKV_GPU_KERNELS_MMA_WARP_CUH_

#include "gpu/kernels/attention_base.cuh"

namespace tqkv::gpu {

__device__ __forceinline__ void MmaF16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 2^x in one MUFU.EX2 (flush-to-zero approximation, max rel. error ~2^-22;
// exp2f adds range scaling for denormal results: 4 instructions). 2^-inf = 0.
__device__ __forceinline__ float FastExp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Byte offset in a replicated lookup table of unit `s` of word w.
template <int UB>
__device__ __forceinline__ uint32_t LutOffset(uint32_t w, int s, uint32_t lane4) {
  const int sh = UB * s - 7;
  const uint32_t x = sh >= 0 ? (w >> sh) : (w << -sh);
  return (x & (((1u << UB) - 1u) << 7)) | lane4;
}

// The same for 256-byte table rows (kMmaLut256, attention_mma.cuh): `base` = 4·lane (+ 128 for
// the V half of a row). Byte units: one prmt (unit byte s of w into bits
// 8..15, base into bits 0..7).
template <int UB>
__device__ __forceinline__ uint32_t LutOffset256(uint32_t w, int s, uint32_t base) {
  if constexpr (UB == 8) {
    return Prmt(w, base, 0x5504u | (static_cast<uint32_t>(s) << 4));
  } else {
    const int sh = UB * s - 8;
    const uint32_t x = sh >= 0 ? (w >> sh) : (w << -sh);
    return (x & (((1u << UB) - 1u) << 8)) | base;
  }
}

template <int UB, bool kRow256>
__device__ __forceinline__ uint32_t LutOff(uint32_t w, int s, uint32_t base) {
  if constexpr (kRow256) {
    return LutOffset256<UB>(w, s, base);
  } else {
    return LutOffset<UB>(w, s, base);
  }
}

__device__ __forceinline__ uint32_t HalfBits(float x) {
  const __half h = __float2half_rn(x);
  return static_cast<uint32_t>(*reinterpret_cast<const unsigned short*>(&h));
}

// Register table of 2-bit K centroids (kMmaKReg): lo/hi hold the low/high
// bytes of fp16 c[0..3].
struct KRegTable {
  uint32_t lo = 0, hi = 0;
  __device__ __forceinline__ void Build(const float* cent) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t x = HalfBits(cent[b]);
      lo |= (x & 0xFFu) << (8 * b);
      hi |= (x >> 8) << (8 * b);
    }
  }
  // fp16 pairs of the 16 fields f0..f15 of w: r[2k] = (c[f_k], c[f_{k+4}]),
  // r[2k+1] = (c[f_{k+8}], c[f_{k+12}]).
  __device__ __forceinline__ void Dequant2(uint32_t w, uint32_t (&r)[8]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = (w >> (2 * k)) & 0x03030303u;
      const uint32_t v = u * 0x11u + 0x40404040u;  // per byte: nibbles (f, f | 4)
      r[2 * k] = Prmt(lo, hi, v);
      r[2 * k + 1] = Prmt(lo, hi, v >> 16);
    }
  }
};

// Tokens-on-M helpers shared by MmaDecodeKernel (kMmaTokM) and TokMTiles
// (StagedDecodeKernel, RowSetDecodeKernel). Lane (g, i) holds the scores
// s[k][2·nt + e] of tokens g + 8·nt, heads 2i + e, of TPS tiles, the
// softmax state mh/lh of those two heads, and the value accumulator acc[u]
// (rows: channels, columns: heads).

// Online softmax step: s becomes the probabilities exp2(s − m); the maxima
// reduce over the 8 lanes of one i in 4 shuffles (lanes with g odd reduce
// head 2i + 1, even head 2i, then swap); acc rescales only when a maximum
// moved. The step's first token must be valid (finite maxima).
template <int TPS>
__device__ __forceinline__ void TokMSoftmax(float (&s)[TPS][4], float (&mh)[2], float (&lh)[2], float (&acc)[8][4],
                                            int g) {
  float tmax[2], corr[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    tmax[e] = s[0][e];
#pragma unroll
    for (int k = 0; k < TPS; ++k) tmax[e] = fmaxf(tmax[e], fmaxf(s[k][e], s[k][2 + e]));
  }
  {
    const bool odd = (g & 1) != 0;
    float own = odd ? tmax[1] : tmax[0];
    own = fmaxf(own, __shfl_xor_sync(kFullMask, odd ? tmax[0] : tmax[1], 4));
    own = fmaxf(own, __shfl_xor_sync(kFullMask, own, 8));
    own = fmaxf(own, __shfl_xor_sync(kFullMask, own, 16));
    const float other = __shfl_xor_sync(kFullMask, own, 4);
    tmax[0] = odd ? other : own;
    tmax[1] = odd ? own : other;
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float mnew = fmaxf(mh[e], tmax[e]);
    corr[e] = FastExp2(mh[e] - mnew);
    mh[e] = mnew;
    float psum = 0.0f;
#pragma unroll
    for (int k = 0; k < TPS; ++k)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[k][2 * nt + e] = FastExp2(s[k][2 * nt + e] - mnew);
        psum += s[k][2 * nt + e];
      }
    lh[e] = fmaf(lh[e], corr[e], psum);
  }
  if (__any_sync(kFullMask, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      acc[u][0] *= corr[0];
      acc[u][1] *= corr[1];
      acc[u][2] *= corr[0];
      acc[u][3] *= corr[1];
    }
  }
}

// P's B fragment of the value mma (head g; tokens 2i, 2i + 1 and 2i + 8,
// 2i + 9) from x[nt] = fp16 (p·n_v) of token g + 8·nt for heads 2i, 2i + 1:
// lanes 8i + g/2 and 8i + 4 + g/2 hold them, half g mod 2 (4 shuffles, 2 prmts).
// kSpread: tokens i, i + 4 and i + 8, i + 12 instead (lanes 4i + g/2 and
// 4i + 16 + g/2), for V rows read with a token stride ≡ 8 words mod 32
// (TokMTiles' kSpreadV).
template <bool kSpread = false>
__device__ __forceinline__ void TokMProbFragment(const uint32_t (&x)[2], int g, int i, uint32_t& pb0, uint32_t& pb1) {
  const int sa = (kSpread ? 4 : 8) * i + (g >> 1), sb = sa + (kSpread ? 16 : 4);
  const uint32_t sel = (g & 1) ? 0x7632u : 0x5410u;
  pb0 = Prmt(__shfl_sync(kFullMask, x[0], sa), __shfl_sync(kFullMask, x[0], sb), sel);
  pb1 = Prmt(__shfl_sync(kFullMask, x[1], sa), __shfl_sync(kFullMask, x[1], sb), sel);
}

// 4-bit V words of two consecutive tokens → token-pair index words: byte k
// of lo = (low nibble of byte k of x0, same of x1), of hi the high nibbles;
// a table entry (c[e & 15], c[e >> 4]) of such a byte is the A register
// (channel, 2 tokens) of the value mma.
__device__ __forceinline__ void TokenPairs4(uint32_t x0, uint32_t x1, uint32_t& lo, uint32_t& hi) {
  lo = (x0 & 0x0F0F0F0Fu) | ((x1 << 4) & 0xF0F0F0F0u);
  hi = ((x0 >> 4) & 0x0F0F0F0Fu) | (x1 & 0xF0F0F0F0u);
}

// The value mmas of one tile from token-pair lookups: x_of(j, h, u) is the
// A register of unit u (channel pair), its low (h = 0) or high (h = 1)
// channel, tokens 2i + 8j, 2i + 8j + 1.
template <typename XOf>
__device__ __forceinline__ void TokenPairValueMmas(float (&acc)[8][4], XOf x_of, uint32_t pb0, uint32_t pb1) {
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    uint32_t x[4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) x[2 * h + j] = x_of(j, h, u);
    MmaF16(acc[u], x[0], x[2], x[1], x[3], pb0, pb1);
  }
}

// Page stream: a warp takes its tiles in order (n = 0, 1, ...), and lane j
// holds the page of its tile 32b + j of batch b, loaded a batch ahead, so no
// tile's row addresses wait on a block-table load. page_of(n): the page of
// the warp's n-th tile (any value past its end).
template <typename PageOf>
struct PageStream {
  PageOf page_of;
  int32_t cur, nxt;
  __device__ __forceinline__ PageStream(PageOf f, int lane) : page_of(f), cur(f(lane)), nxt(f(32 + lane)) {}
  // The page of tile n; every lane calls it, for n = 0, 1, ... in order.
  __device__ __forceinline__ uint32_t Next(int n, int lane) {
    const uint32_t page = static_cast<uint32_t>(__shfl_sync(kFullMask, cur, n & 31));
    if ((n & 31) == 31) {
      cur = nxt;
      nxt = page_of(n + 33 + lane);
    }
    return page;
  }
};

// Block merge, part 1: a warp's accumulator into macc [warp][G][128] (unit
// u's channel pair 2·pu(u), 2·pu(u) + 1 = rows g, g + 8 of acc[u]).
template <int G, typename PU>
__device__ __forceinline__ void StoreWarpAcc(float* macc, const float (&acc)[8][4], int warp, int i, PU pu_of) {
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int pu = pu_of(u);
    const int h0 = 2 * i, h1 = 2 * i + 1;
    if (h0 < G) {
      macc[(warp * G + h0) * 128 + 2 * pu] = acc[u][0];
      macc[(warp * G + h0) * 128 + 2 * pu + 1] = acc[u][2];
    }
    if (h1 < G) {
      macc[(warp * G + h1) * 128 + 2 * pu] = acc[u][1];
      macc[(warp * G + h1) * 128 + 2 * pu + 1] = acc[u][3];
    }
  }
}

// Block merge, part 2 (after a barrier): the NW warps' (m, l, acc) of each
// head into the split record rec(h) = [m, l, acc[128]]; thread tid takes
// channel tid mod 128 of heads tid / 128, + NW / 4, ...
template <int NW, int G, typename Rec>
__device__ __forceinline__ void MergeWarpRecords(const float* macc, const float* mml, int tid, Rec rec_of) {
  const int j = tid & 127;
#pragma unroll
  for (int h = tid >> 7; h < G; h += NW / 4) {
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < NW; ++w) mx = fmaxf(mx, mml[(w * G + h) * 2]);
    float v = 0.0f, lsum = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float mw = mml[(w * G + h) * 2];
      const float f = mw == -CUDART_INF_F ? 0.0f : FastExp2(mw - mx);
      v = fmaf(f, macc[(w * G + h) * 128 + j], v);
      lsum = fmaf(f, mml[(w * G + h) * 2 + 1], lsum);
    }
    float* rec = rec_of(h);
    rec[2 + j] = v;
    if (j == 0) {
      rec[0] = mx;
      rec[1] = lsum;
    }
  }
}

// Offset of the kernel's dynamic shared memory in the shared window: the
// 1 KiB the hardware reserves per block comes first and the kernel has no
// static shared memory. The launcher checks it once per process
// (MmaSmemWindowBase in gpu/attention.cu) and falls back to the CUDA-core
// kernels where it differs.
inline constexpr uint32_t kMmaSmemWindowBase = 1024;

// Lookup at byte `off` of the table that starts `kTable` bytes into the
// dynamic shared memory: the table's window address is an immediate of the
// LDS, so a lookup is the one instruction that computes `off` plus the load.
template <uint32_t kTable>
__device__ __forceinline__ uint32_t LdsTable(uint32_t off) {
  uint32_t r;
  asm("ld.shared.b32 %0, [%1+%2];\n" : "=r"(r) : "r"(off), "n"(kMmaSmemWindowBase + kTable));
  return r;
}

// The same, 8 bytes (two table words) at an 8-byte-aligned `off`.
template <uint32_t kTable>
__device__ __forceinline__ uint2 LdsTable2(uint32_t off) {
  uint2 r;
  asm("ld.shared.v2.b32 {%0, %1}, [%2+%3];\n" : "=r"(r.x), "=r"(r.y) : "r"(off), "n"(kMmaSmemWindowBase + kTable));
  return r;
}

template <int N>
__device__ __forceinline__ void LoadWords(const uint8_t* p, uint32_t (&w)[N]) {
  if constexpr (N == 4) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (N == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = __ldg(reinterpret_cast<const uint32_t*>(p));
  }
}

template <int N>
__device__ __forceinline__ uint32_t PickWord(const uint32_t (&w)[N], int k) {
  uint32_t r = w[0];
#pragma unroll
  for (int j = 1; j < N; ++j) r = k == j ? w[j] : r;
  return r;
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_MMA_WARP_CUH_
