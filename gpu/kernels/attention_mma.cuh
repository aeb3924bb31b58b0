// Tensor-core decode attention for TurboQuant_mse K/V at d = 128 (K and V
// bits in {2, 4}, GQA group G in {1, 2, 4, 8}): the TQ4 and K4/V2 serving
// paths. Block = (query, kv head) × split, 4 warps; a warp takes 16-token
// tiles (one page slice) in turn.
//
// Scores: S[h, t] = n_t · <q_rot,h , c[idx_t]>, as mma.sync m16n8k16 with
// the scaled rotated queries of the group as A (rows = heads, padded to 16)
// and the dequantised keys as B (k = channels, n = tokens). Values: the
// rotated accumulator O[c, h] += Σ_t V̂[c, t] · (p[h, t] · n_t) as m16n8k16
// with V̂ᵀ as A (rows = channels) and P as B; the S accumulator fragment is
// already P's B fragment (no shuffles). Norms go on the scores and on P,
// never on the fp16 operands.
//
// Dequantisation: one shared-memory lookup per 2-channel unit (a byte of a
// 4-bit row, a nibble of a 2-bit row) gives the fp16 pair (c[lo], c[hi]);
// the tables are replicated 32 times (entry e of lane l at word 32e + l) so
// a warp's lookups never conflict.
// Alternatives (template KM, see kMmaKReg / kMmaLut256): K centroids from
// registers with prmt, and 256-byte table rows with prmt addressing.
//
// Loads: rows are 16·bits + 4 bytes (≡ 4 mod 16), so with kv_heads % 4 == 0
// every row of kv head h starts at 4·(h mod 4) = mis bytes past a 16-byte
// boundary. Each thread loads 16- or 8-byte aligned pieces of the "region"
// [row − mis, row − mis + index bytes) plus the aligned tail chunk after it
// (the row's last mis index bytes and its fp32 norm); region units below mis
// take the tail's units instead. The query fragments absorb the resulting
// rotation of channels: region unit r holds physical unit (r − mis_units)
// mod 64.
//
// Numerics: fp16 operands (scaled queries, centroids, p·n), fp32
// accumulation, softmax in fp32 (log2 domain); same split records as the
// other kernels.
#ifndef TQKV_GPU_KERNELS_ATTENTION_MMA_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_MMA_CUH_

#include "gpu/kernels/attention.cuh"

namespace tqkv::gpu {

inline constexpr int kMmaWarps = 4;
// Resident blocks per SM (the __launch_bounds__ target; split planning) for
// TPS tiles per softmax step. Served: one tile per step (two tiles per step,
// 255 registers at 2 blocks/SM, measured 1.0-1.15x slower on H200).
constexpr int MmaCtasPerSm(int tps) { return tps == 1 ? 3 : 2; }
inline constexpr int kMmaTilesPerStep = 1;
template <int B>
struct MmaBits {
  static constexpr int kUnitBits = B == 4 ? 8 : 4;        // one 2-channel unit
  static constexpr int kLutEntries = 1 << kUnitBits;      // 256 or 16
  static constexpr int kUnitsPerWord = 32 / kUnitBits;    // 4 or 8
  static constexpr int kIndexBytes = 16 * B;              // d = 128
};

// Dequantisation modes of MmaDecodeKernel (template KM, bit flags; the
// benchmark variants in gpu/attention.cu pick them).
//   kMmaKReg: K centroids come from registers instead of a shared-memory
//     table. 2-bit keys: the 4 fp16 centroids as a low-byte and a high-byte
//     register; one prmt per fp16 pair (selector nibbles i, i|4 per index,
//     built with a shift, a lop3 and one imad per 4 index pairs). 4-bit keys
//     need a codebook symmetric at fp16 (c[15-k] = -c[k] bitwise apart from
//     the sign; AttentionLaunch::symmetric_codebooks): index i maps to the
//     magnitude m[j], j = i & 7 for i >= 8 and 7 - i for i < 8, the 8
//     magnitudes' low and high bytes fit in 4 registers, one prmt per plane
//     dequantises 4 indices, a sign-mode prmt + lop3 puts the sign into the
//     high bytes and two prmts interleave the planes into fp16 pairs
//     (~18 integer ops per 8 indices, no shared-memory traffic).
//   kMmaLut256: tables of byte units (4-bit rows) use 256-byte rows (entry e
//     of lane l at byte 256e + 4l, V at +128), so one prmt of the index word
//     with the lane's offset is the lookup address (128-byte rows need a
//     shift and a lop3).
//   kMmaOneBuf: one raw tile buffer per warp (load a step's rows, then
//     compute them; no prefetch of the next step), for register budgets of
//     4+ blocks/SM where more resident warps hide the load latency instead.
//   kMmaTokM: "tokens on M" scores Sᵀ[t, h] = K̂[t, :] · q[h, :]: the
//     dequantised K tile (16 tokens × 16 channels) is A, the query fragment
//     is B (n = heads), one mma per k-tile (8 per tile instead of 16 with
//     half-zero A operands). Lane (g, i) then holds tokens g, g + 8 of heads
//     2i, 2i + 1: two softmax states per lane (reduced over the 8 lanes of
//     one i, 4 shuffles for both maxima), which are also the value
//     accumulator's columns (no shuffled rescale); the probabilities are
//     transposed to P's B fragment with 4 shuffles and 2 prmts per tile.
inline constexpr int kMmaKReg = 1;
inline constexpr int kMmaLut256 = 2;
inline constexpr int kMmaOneBuf = 4;
inline constexpr int kMmaTokM = 8;

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

// The same for 256-byte table rows (kMmaLut256): `base` = 4·lane (+ 128 for
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

// Register tables of the K centroids (kMmaKReg). KB = 4: lo[q]/hi[q] hold
// the low/high bytes of the fp16 magnitudes m[4q .. 4q+3], m[k] = c[8 + k].
// KB = 2: lo[0]/hi[0] hold the low/high bytes of fp16 c[0..3].
template <int KB>
struct KRegTable {
  uint32_t lo[KB == 4 ? 2 : 1], hi[KB == 4 ? 2 : 1];
  __device__ __forceinline__ void Build(const float* cent) {
    constexpr int kN = KB == 4 ? 8 : 4, kOff = KB == 4 ? 8 : 0;
#pragma unroll
    for (int q = 0; q < kN / 4; ++q) {
      uint32_t l = 0, h = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t x = HalfBits(cent[kOff + 4 * q + b]);
        l |= (x & 0xFFu) << (8 * b);
        h |= (x >> 8) << (8 * b);
      }
      lo[q] = l;
      hi[q] = h;
    }
  }
  // 4-bit: fp16 pairs of the 4 byte units of index word w (r[s] = centroids
  // of nibbles 2s, 2s + 1).
  __device__ __forceinline__ void Dequant4(uint32_t w, uint32_t (&r)[4]) const {
    const uint32_t x = w & 0x88888888u;
    const uint32_t j = ~(w ^ (x - (x >> 3))) & 0x77777777u;  // magnitude index per nibble
    const uint32_t jh = j >> 16;
    const uint32_t ll = Prmt(lo[0], lo[1], j), lh = Prmt(lo[0], lo[1], jh);
    uint32_t hl = Prmt(hi[0], hi[1], j), hh = Prmt(hi[0], hi[1], jh);
    // Sign-mode prmt: byte k = 0xFF iff nibble k (of 4) is >= 8 (positive).
    const uint32_t w4 = w << 4;
    hl |= ~Prmt(w4, w, 0xD9C8u) & 0x80808080u;
    hh |= ~Prmt(w4, w, 0xFBEAu) & 0x80808080u;
    r[0] = Prmt(ll, hl, 0x5140u);
    r[1] = Prmt(ll, hl, 0x7362u);
    r[2] = Prmt(lh, hh, 0x5140u);
    r[3] = Prmt(lh, hh, 0x7362u);
  }
  // 2-bit: fp16 pairs of the 16 fields f0..f15 of w: r[2k] = (c[f_k],
  // c[f_{k+4}]), r[2k+1] = (c[f_{k+8}], c[f_{k+12}]).
  __device__ __forceinline__ void Dequant2(uint32_t w, uint32_t (&r)[8]) const {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = (w >> (2 * k)) & 0x03030303u;
      const uint32_t v = u * 0x11u + 0x40404040u;  // per byte: nibbles (f, f | 4)
      r[2 * k] = Prmt(lo[0], hi[0], v);
      r[2 * k + 1] = Prmt(lo[0], hi[0], v >> 16);
    }
  }
};

// Tokens-on-M helpers shared by MmaDecodeKernel (kMmaTokM) and
// StagedDecodeKernel. Lane (g, i) holds the scores s[k][2·nt + e] of tokens
// g + 8·nt, heads 2i + e, of TPS tiles, the softmax state mh/lh of those two
// heads, and the value accumulator acc[u] (rows: channels, columns: heads).

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
__device__ __forceinline__ void TokMProbFragment(const uint32_t (&x)[2], int g, int i, uint32_t& pb0, uint32_t& pb1) {
  const int sa = 8 * i + (g >> 1);
  const uint32_t sel = (g & 1) ? 0x7632u : 0x5410u;
  pb0 = Prmt(__shfl_sync(kFullMask, x[0], sa), __shfl_sync(kFullMask, x[0], sa + 4), sel);
  pb1 = Prmt(__shfl_sync(kFullMask, x[1], sa), __shfl_sync(kFullMask, x[1], sa + 4), sel);
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

// Piece positions (0..31: index p of the thread's 32-channel K piece, in bit
// order) of the two channels of B register (kk, h) of the score mma.
template <int KB, int KM>
__host__ __device__ constexpr int KPos(int kk, int h, int second) {
  if constexpr ((KM & kMmaKReg) != 0 && KB == 2) {
    return 16 * (kk / 4) + 8 * h + (kk % 4) + 4 * second;
  } else {
    return 4 * kk + 2 * h + second;
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

// Raw words of one 16-token tile held by one thread.
template <int KB, int VB>
struct MmaTileRaw {
  static constexpr int kKW = KB;      // K piece words (16 or 8 bytes)
  static constexpr int kVW = VB / 2;  // V piece words (8 or 4 bytes)
  uint32_t k[2][kKW], kt[2][kKW];     // tokens g, g + 8: piece, tail piece
  uint32_t v[4][kVW], vt[4][kVW];     // tokens 2i, 2i+1, 2i+8, 2i+9
};

// Dynamic shared memory of the kernel: the tables at offset 0 (reused for
// the block merge), then the 32 fp32 centroids (K at 0, V at 16).
// (KM: dequantisation mode flags, see kMmaKReg / kMmaLut256.)
template <int KB, int VB, int G, int KM = 0>
constexpr size_t MmaCentOffset() {
  constexpr bool kKReg = (KM & kMmaKReg) != 0, kRow256 = (KM & kMmaLut256) != 0;
  const size_t ke = kKReg ? 0 : MmaBits<KB>::kLutEntries, ve = MmaBits<VB>::kLutEntries;
  const size_t lut = kRow256 ? (ke > ve ? ke : ve) * 256 : (ke + ve) * 32 * 4;
  const size_t merge = (kMmaWarps * G * 128 + kMmaWarps * G * 2) * 4;
  return lut > merge ? lut : merge;
}
template <int KB, int VB, int G, int KM = 0>
constexpr size_t MmaSmemBytes() {
  return MmaCentOffset<KB, VB, G, KM>() + 32 * sizeof(float);
}

// MB: resident blocks per SM the registers are budgeted for.
template <int KB, int VB, int G, int TPS, int KM = 0, int MB = MmaCtasPerSm(TPS)>
__global__ void __launch_bounds__(32 * kMmaWarps, MB)
    MmaDecodeKernel(AttentionLaunch a, AttnDims d, const float* states, float* records) {
  using KU = MmaBits<KB>;
  using VU = MmaBits<VB>;
  using Raw = MmaTileRaw<KB, VB>;
  constexpr bool kKReg = (KM & kMmaKReg) != 0, kRow256 = (KM & kMmaLut256) != 0;
  constexpr bool kTokM = (KM & kMmaTokM) != 0;
  // Score chains per n-tile: two (k-tile parity) hide mma latency; one
  // saves 8 registers where more resident warps hide it (kMmaOneBuf).
  constexpr bool kOneBuf = (KM & kMmaOneBuf) != 0;
  constexpr int kPar = kOneBuf ? 0 : 1;
  constexpr int PK = 4 * KB;  // K piece bytes per thread
  constexpr int PV = 2 * VB;  // V piece bytes per thread
  constexpr int KW = Raw::kKW, VW = Raw::kVW;
  extern __shared__ __align__(16) uint32_t mma_smem[];  // no static shared memory: kMmaSmemWindowBase
  float* cent = reinterpret_cast<float*>(mma_smem) + MmaCentOffset<KB, VB, G, KM>() / 4;
  // Tables: 128-byte rows (K entries, then V entries) or 256-byte rows (K at
  // +0, V at +128 of each row). kVTable: byte offset of the V table.
  constexpr uint32_t kVTable = kRow256 ? 0u : (kKReg ? 0u : KU::kLutEntries * 32u * 4u);
  uint32_t* lut_k = mma_smem;
  uint32_t* lut_v = mma_smem + kVTable / 4;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, i = lane & 3;
  const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
  const int64_t qi = blockIdx.x / a.kv_heads;
  const int kvh = static_cast<int>(blockIdx.x % a.kv_heads);
  const int split = blockIdx.y;
  const GpuComponent& kc = a.k_comp[kvh];
  const GpuComponent& vc = a.v_comp[kvh];
  if (tid < (1 << KB)) cent[tid] = __ldg(kc.groups[0].centroids + tid);
  if (tid < (1 << VB)) cent[16 + tid] = __ldg(vc.groups[0].centroids + tid);
  __syncthreads();
  constexpr int kRowWords = kRow256 ? 64 : 32;
  if constexpr (!kKReg) {
    for (int e = tid; e < KU::kLutEntries * 32; e += blockDim.x) {
      const int ent = e >> 5;
      lut_k[ent * kRowWords + (e & 31)] = PackHalf2(cent[ent & ((1 << KB) - 1)], cent[ent >> KB]);
    }
  }
  for (int e = tid; e < VU::kLutEntries * 32; e += blockDim.x) {
    const int ent = e >> 5;
    lut_v[ent * kRowWords + (kRow256 ? 32 : 0) + (e & 31)] =
        PackHalf2(cent[16 + (ent & ((1 << VB) - 1))], cent[16 + (ent >> VB)]);
  }
  const uint32_t vbase = kRow256 ? (lane4 | 128u) : lane4;
  KRegTable<KB> ktab;
  if constexpr (kKReg) ktab.Build(cent);

  const int mis = 4 * (kvh & 3);
  const int muk = mis * 8 / KU::kUnitBits, muv = mis * 8 / VU::kUnitBits;
  // Query fragments (A of the score mma): thread (g, i), k-tile kk, half h
  // covers the piece positions KPos(kk, h, 0/1) of region channels 32i + p,
  // i.e. physical channels (32i + p − 2·muk) mod 128 (region unit r holds
  // physical unit (r − muk) mod 64).
  uint32_t qa[8][2];
  {
    const float sl = a.scale * kLog2e;
    const float* qrow = states + (qi * a.q_heads + kvh * G + (g < G ? g : 0)) * d.sk;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c0 = (32 * i + KPos<KB, KM>(kk, h, 0) - 2 * muk) & 127;
        const int c1 = (32 * i + KPos<KB, KM>(kk, h, 1) - 2 * muk) & 127;
        const float x0 = g < G ? qrow[c0] * sl : 0.0f;
        const float x1 = g < G ? qrow[c1] * sl : 0.0f;
        qa[kk][h] = PackHalf2(x0, x1);
      }
    }
  }
  __syncthreads();

  // Token positions and in-page offsets are 32-bit (contexts < 2^31 tokens,
  // pages < 2 GiB); only the page base is 64-bit.
  const int seq = SeqOf(a, qi);
  const int limit = static_cast<int>(min(a.positions[qi] + 1, a.packed_tokens[seq]));
  const int t0 = split * static_cast<int>(d.chunk);
  const int t1 = min(limit, t0 + static_cast<int>(d.chunk));
  const int ntiles = t1 > t0 ? (t1 - t0 + 15) / 16 : 0;
  const int krb = kc.row_bytes, vrb = vc.row_bytes;
  const int kstep = a.kv_heads * krb;  // token rows within a page
  const int vstep = a.kv_heads * vrb;
  const int32_t* btab = a.block_table + static_cast<int64_t>(seq) * a.max_blocks;
  const int bs_shift = __ffs(a.block_size) - 1;  // block_size: a power of two (MmaEligible)
  const uint32_t bs_mask = static_cast<uint32_t>(a.block_size) - 1u;
  const uint64_t stride = static_cast<uint64_t>(a.block_stride);
  // In-page byte offsets of the thread's pieces: K rows g, g + 8; V rows 2i,
  // 2i + 1, 2i + 8, 2i + 9 (tails at + index bytes, immediates).
  uint32_t koff[2], voff[4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) koff[nt] = (g + 8 * nt) * kstep + kvh * krb - mis + PK * i;
#pragma unroll
  for (int v = 0; v < 4; ++v) voff[v] = (2 * i + (v & 1) + 8 * (v >> 1)) * vstep + kvh * vrb - mis + PV * g;
  const bool k_has_tail = PK * i < 16, v_has_tail = PV * g < 16;
  // Norm holders: K norm of token τ in lane 4(τ mod 8) + ikn, word kwn of
  // its tail piece; V norm of token τ in lane 4·gvn + (its i), word vwn.
  const int ikn = mis / PK, kwn = (mis % PK) / 4;
  const int gvn = mis / PV, vwn = (mis % PV) / 4;

  // Tile tl of this split (tiles past the split's end are not loaded; their
  // tokens are masked).
  // Pages: the warp loads its tiles in order, call n tile tile_of(n).
  auto tile_of = [&](int n) { return (warp + kMmaWarps * (n / TPS)) * TPS + n % TPS; };
  PageStream pages([&](int n) -> int32_t {
    const int tt = t0 + tile_of(n) * 16;
    return tt < t1 ? __ldg(btab + (tt >> bs_shift)) : 0;
  }, lane);
  int ncall = 0;
  auto load = [&](int tl, Raw& r) {
    const uint32_t page = pages.Next(ncall++, lane);
    const int tt = t0 + tl * 16;
    if (tt >= t1) return;
    const uint32_t off0 = static_cast<uint32_t>(tt) & bs_mask;
    const uint8_t* kp = a.k_base + page * stride + off0 * kstep;
    const uint8_t* vp = a.v_base + page * stride + off0 * vstep;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const uint8_t* p = kp + koff[nt];
      LoadWords<KW>(p, r.k[nt]);
      if (k_has_tail) LoadWords<KW>(p + KU::kIndexBytes, r.kt[nt]);
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint8_t* p = vp + voff[v];
      LoadWords<VW>(p, r.v[v]);
      if (v_has_tail) LoadWords<VW>(p + VU::kIndexBytes, r.vt[v]);
    }
  };

  float m = -CUDART_INF_F, l = 0.0f;
  float mh[2] = {-CUDART_INF_F, -CUDART_INF_F}, lh[2] = {0.0f, 0.0f};  // kTokM: heads 2i, 2i + 1
  float acc[8][4];
#pragma unroll
  for (int u = 0; u < 8; ++u)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[u][e] = 0.0f;

  // Scores of one tile: s[v] for tokens 2i + (v & 1) + 8 (v >> 1) of head g.
  auto scores = [&](int tl, const Raw& r, float (&s)[4]) {
    const int tt = t0 + tl * 16;
    float sc[2][2][4];  // [n-tile][k-tile parity]: four chains of four mmas
    uint32_t kws[2][KW];
    float hold[2];
    auto kmerge = [&](int nt) {
#pragma unroll
      for (int w = 0; w < KW; ++w) kws[nt][w] = PK * i + 4 * w < mis ? r.kt[nt][w] : r.k[nt][w];
    };
    if constexpr (kOneBuf) {  // tail pieces die before the mmas (fewer live registers)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        kmerge(nt);
        hold[nt] = __uint_as_float(PickWord<KW>(r.kt[nt], kwn));
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      if constexpr (!kOneBuf) kmerge(nt);
      const uint32_t(&kw)[KW] = kws[nt];
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][0][e] = sc[nt][1][e] = 0.0f;
      if constexpr (kKReg && KB == 4) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // word q: k-tiles 2q, 2q + 1
          uint32_t b[4];
          ktab.Dequant4(kw[q], b);
          MmaF16(sc[nt][0], qa[2 * q][0], 0u, qa[2 * q][1], 0u, b[0], b[1]);
          MmaF16(sc[nt][kPar], qa[2 * q + 1][0], 0u, qa[2 * q + 1][1], 0u, b[2], b[3]);
        }
      } else if constexpr (kKReg) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {  // word q: k-tiles 4q .. 4q + 3
          uint32_t b[8];
          ktab.Dequant2(kw[q], b);
#pragma unroll
          for (int k = 0; k < 4; ++k)
            MmaF16(sc[nt][k & kPar], qa[4 * q + k][0], 0u, qa[4 * q + k][1], 0u, b[2 * k], b[2 * k + 1]);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          const int u0 = 2 * kk;
          const uint32_t w = kw[u0 / KU::kUnitsPerWord];
          const int s0 = u0 % KU::kUnitsPerWord;
          const uint32_t b0 = LdsTable<0>(LutOff<KU::kUnitBits, kRow256>(w, s0, lane4));
          const uint32_t b1 = LdsTable<0>(LutOff<KU::kUnitBits, kRow256>(w, s0 + 1, lane4));
          MmaF16(sc[nt][kk & kPar], qa[kk][0], 0u, qa[kk][1], 0u, b0, b1);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      if constexpr (!kOneBuf) hold[nt] = __uint_as_float(PickWord<KW>(r.kt[nt], kwn));
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float nk = __shfl_sync(kFullMask, hold[nt], 4 * (2 * i + e) + ikn);
        const bool valid = tt + 8 * nt + 2 * i + e < t1;
        const float x = kPar ? sc[nt][0][e] + sc[nt][kPar][e] : sc[nt][0][e];
        s[2 * nt + e] = valid ? x * nk : -CUDART_INF_F;
      }
    }
  };
  // The value mmas of one tile with P's B fragment pb0, pb1.
  auto value_mmas = [&](const Raw& r, uint32_t pb0, uint32_t pb1) {
    uint32_t vw[4][VW];
#pragma unroll
    for (int v = 0; v < 4; ++v)
#pragma unroll
      for (int w = 0; w < VW; ++w) vw[v][w] = PV * g + 4 * w < mis ? r.vt[v][w] : r.v[v][w];
    if constexpr (VB == 4) {
      // Token pairs: byte k of tp[j][w][0] = (low nibble of byte k of token
      // 2i + 8j's word w, same of token 2i + 8j + 1), tp[..][1] the high
      // nibbles; one lookup is then the A register (channel, 2 tokens)
      // itself: no interleave.
      uint32_t tp[2][VW][2];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int w = 0; w < VW; ++w) {
          TokenPairs4(vw[2 * j][w], vw[2 * j + 1][w], tp[j][w][0], tp[j][w][1]);
        }
      TokenPairValueMmas(acc, [&](int j, int h, int u) {
        return LdsTable<kVTable>(LutOff<8, kRow256>(tp[j][u / 4][h], u % 4, vbase));
      }, pb0, pb1);
      return;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      uint32_t x[4];
#pragma unroll
      for (int v = 0; v < 4; ++v)
        x[v] = LdsTable<kVTable>(
                      LutOff<VU::kUnitBits, kRow256>(vw[v][u / VU::kUnitsPerWord], u % VU::kUnitsPerWord, vbase));
      MmaF16(acc[u], Prmt(x[0], x[1], 0x5410), Prmt(x[0], x[1], 0x7632), Prmt(x[2], x[3], 0x5410),
             Prmt(x[2], x[3], 0x7632), pb0, pb1);
    }
  };
  // Values of one tile with probabilities p (same token order as s).
  auto values = [&](int tl, const Raw& r, const float (&p)[4]) {
    const int tt = t0 + tl * 16;
    float pn[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float hold = __uint_as_float(PickWord<VW>(r.vt[v], vwn));
      const float nv = __shfl_sync(kFullMask, hold, 4 * gvn + i);
      const bool valid = tt + 2 * i + (v & 1) + 8 * (v >> 1) < t1;
      pn[v] = valid ? p[v] * nv : 0.0f;
    }
    const uint32_t pb0 = PackHalf2(pn[0], pn[1]), pb1 = PackHalf2(pn[2], pn[3]);
    value_mmas(r, pb0, pb1);
  };
  // kTokM scores of one tile: s[2·nt + e] for token g + 8·nt, head 2i + e.
  // A = K̂ (rows = tokens g, g + 8: the lookups of both tokens of a k-tile),
  // B = the query fragment (the same registers as qa).
  auto scores_tokm = [&](int tl, const Raw& r, float (&s)[4]) {
    const int tt = t0 + tl * 16;
    float sc[2][4];  // [k-tile parity]
    uint32_t kw[2][KW];
    float hold[2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int w = 0; w < KW; ++w) kw[nt][w] = PK * i + 4 * w < mis ? r.kt[nt][w] : r.k[nt][w];
      hold[nt] = __uint_as_float(PickWord<KW>(r.kt[nt], kwn));
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[0][e] = sc[1][e] = 0.0f;
    if constexpr (kKReg && KB == 4) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // word q: k-tiles 2q, 2q + 1
        uint32_t b0[4], b1[4];
        ktab.Dequant4(kw[0][q], b0);
        ktab.Dequant4(kw[1][q], b1);
        MmaF16(sc[0], b0[0], b1[0], b0[1], b1[1], qa[2 * q][0], qa[2 * q][1]);
        MmaF16(sc[kPar], b0[2], b1[2], b0[3], b1[3], qa[2 * q + 1][0], qa[2 * q + 1][1]);
      }
    } else if constexpr (kKReg) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {  // word q: k-tiles 4q .. 4q + 3
        uint32_t b0[8], b1[8];
        ktab.Dequant2(kw[0][q], b0);
        ktab.Dequant2(kw[1][q], b1);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          MmaF16(sc[k & kPar], b0[2 * k], b1[2 * k], b0[2 * k + 1], b1[2 * k + 1], qa[4 * q + k][0],
                 qa[4 * q + k][1]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const int u0 = 2 * kk, s0 = u0 % KU::kUnitsPerWord;
        const uint32_t w0 = kw[0][u0 / KU::kUnitsPerWord], w1 = kw[1][u0 / KU::kUnitsPerWord];
        const uint32_t a0 = LdsTable<0>(LutOff<KU::kUnitBits, kRow256>(w0, s0, lane4));
        const uint32_t a1 = LdsTable<0>(LutOff<KU::kUnitBits, kRow256>(w1, s0, lane4));
        const uint32_t a2 = LdsTable<0>(LutOff<KU::kUnitBits, kRow256>(w0, s0 + 1, lane4));
        const uint32_t a3 = LdsTable<0>(LutOff<KU::kUnitBits, kRow256>(w1, s0 + 1, lane4));
        MmaF16(sc[kk & kPar], a0, a1, a2, a3, qa[kk][0], qa[kk][1]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float nk = __shfl_sync(kFullMask, hold[nt], 4 * g + ikn);
      const bool valid = tt + g + 8 * nt < t1;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = kPar ? sc[0][2 * nt + e] + sc[kPar][2 * nt + e] : sc[0][2 * nt + e];
        s[2 * nt + e] = valid ? x * nk : -CUDART_INF_F;
      }
    }
  };
  // kTokM values of one tile with probabilities p (the layout of s): p·n_v
  // packed per token over the lane's two heads, then transposed to P's B
  // fragment (head g; tokens 2i, 2i+1 and 2i+8, 2i+9): 4 shuffles, 2 prmts.
  auto values_tokm = [&](int tl, const Raw& r, const float (&p)[4]) {
    const int tt = t0 + tl * 16;
    // V norm of token τ: lane 4·gvn + (τ mod 8) / 2, word vwn of vt[τ mod 2 + 2·(τ / 8)].
    const int nsrc = 4 * gvn + (g >> 1);
    uint32_t x[2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float n0 = __shfl_sync(kFullMask, __uint_as_float(PickWord<VW>(r.vt[2 * nt], vwn)), nsrc);
      const float n1 = __shfl_sync(kFullMask, __uint_as_float(PickWord<VW>(r.vt[2 * nt + 1], vwn)), nsrc);
      const float nv = (g & 1) ? n1 : n0;
      const bool valid = tt + g + 8 * nt < t1;
      x[nt] = PackHalf2(valid ? p[2 * nt] * nv : 0.0f, valid ? p[2 * nt + 1] * nv : 0.0f);
    }
    uint32_t pb0, pb1;
    TokMProbFragment(x, g, i, pb0, pb1);
    value_mmas(r, pb0, pb1);
  };
  // kTokM step: per-head softmax over the 8 lanes of one i; the accumulator
  // columns are this lane's heads.
  auto compute_tokm = [&](int tl0, const Raw (&r)[TPS]) {
    float s[TPS][4];
#pragma unroll
    for (int k = 0; k < TPS; ++k) scores_tokm(tl0 + k, r[k], s[k]);
    TokMSoftmax<TPS>(s, mh, lh, acc, g);  // finite maxima: the step's first token is valid
#pragma unroll
    for (int k = 0; k < TPS; ++k) values_tokm(tl0 + k, r[k], s[k]);
  };
  // One step: TPS consecutive tiles (first tile tl0) with one softmax update.
  auto compute = [&](int tl0, const Raw (&r)[TPS]) {
    float s[TPS][4];
#pragma unroll
    for (int k = 0; k < TPS; ++k) scores(tl0 + k, r[k], s[k]);
    float tmax = s[0][0];
#pragma unroll
    for (int k = 0; k < TPS; ++k)
#pragma unroll
      for (int v = 0; v < 4; ++v) tmax = fmaxf(tmax, s[k][v]);
    tmax = fmaxf(tmax, __shfl_xor_sync(kFullMask, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(kFullMask, tmax, 2));
    const float mnew = fmaxf(m, tmax);  // finite: the step's first token is valid
    const float corr = FastExp2(m - mnew);
    m = mnew;
    float psum = 0.0f;
#pragma unroll
    for (int k = 0; k < TPS; ++k)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        s[k][v] = FastExp2(s[k][v] - mnew);
        psum += s[k][v];
      }
    l = fmaf(l, corr, psum);
    if (__any_sync(kFullMask, corr != 1.0f)) {
      const float ca = __shfl_sync(kFullMask, corr, 8 * i), cb = __shfl_sync(kFullMask, corr, 8 * i + 4);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        acc[u][0] *= ca;
        acc[u][1] *= cb;
        acc[u][2] *= ca;
        acc[u][3] *= cb;
      }
    }
#pragma unroll
    for (int k = 0; k < TPS; ++k) values(tl0 + k, r[k], s[k]);
  };
  auto step = [&](int tl0, const Raw (&r)[TPS]) {
    if constexpr (kTokM) {
      compute_tokm(tl0, r);
    } else {
      compute(tl0, r);
    }
  };

  if constexpr ((KM & kMmaOneBuf) != 0) {
    // Steps st = warp, warp + 4, ...: load the step's rows, then compute.
    const int nsteps = (ntiles + TPS - 1) / TPS;
    for (int st = warp; st < nsteps; st += kMmaWarps) {
      Raw r[TPS];
#pragma unroll
      for (int k = 0; k < TPS; ++k) load(st * TPS + k, r[k]);
      step(st * TPS, r);
    }
  } else {
    // Steps st = warp, warp + 4, ...; step st covers tiles TPS·st .. TPS·st + TPS − 1.
    // Double-buffered: the next step's rows load while this one computes.
    const int nsteps = (ntiles + TPS - 1) / TPS;
    Raw ra[TPS], rb[TPS];
    auto load_step = [&](int st, Raw (&r)[TPS]) {
#pragma unroll
      for (int k = 0; k < TPS; ++k) load(st * TPS + k, r[k]);
    };
    int st = warp;
    if (st < nsteps) load_step(st, ra);
    while (st < nsteps) {
      if (st + kMmaWarps < nsteps) load_step(st + kMmaWarps, rb);
      step(st * TPS, ra);
      st += kMmaWarps;
      if (st >= nsteps) break;
      if (st + kMmaWarps < nsteps) load_step(st + kMmaWarps, ra);
      step(st * TPS, rb);
      st += kMmaWarps;
    }
  }
  if constexpr (kTokM) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      lh[e] += __shfl_xor_sync(kFullMask, lh[e], 4);
      lh[e] += __shfl_xor_sync(kFullMask, lh[e], 8);
      lh[e] += __shfl_xor_sync(kFullMask, lh[e], 16);
    }
  } else {
    l += __shfl_xor_sync(kFullMask, l, 1);
    l += __shfl_xor_sync(kFullMask, l, 2);
  }

  // Block merge of the warps into one split record.
  __syncthreads();  // tables no longer read
  float* macc = reinterpret_cast<float*>(mma_smem);  // [warps][G][128]
  float* mml = macc + kMmaWarps * G * 128;            // [warps][G][2]
  StoreWarpAcc<G>(macc, acc, warp, i, [&](int u) { return (8 * g + u - muv) & 63; });
  if constexpr (kTokM) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (g == 0 && 2 * i + e < G) {
        mml[(warp * G + 2 * i + e) * 2] = mh[e];
        mml[(warp * G + 2 * i + e) * 2 + 1] = lh[e];
      }
    }
  } else if (i == 0 && g < G) {
    mml[(warp * G + g) * 2] = m;
    mml[(warp * G + g) * 2 + 1] = l;
  }
  __syncthreads();
  MergeWarpRecords<kMmaWarps, G>(macc, mml, tid, [&](int h) {
    return records + ((qi * a.q_heads + kvh * G + h) * d.splits + split) * d.record;
  });
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_MMA_CUH_
