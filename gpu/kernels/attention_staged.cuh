// Staged tensor-core decode attention for 4-bit keys at d = 128 (TQ4 with
// one K/V codebook, K4/V2): the rows of a warp's 16-token tiles stream into
// a per-warp ring of S shared-memory stages with cp.async, S − 1 tiles
// ahead of the one it computes, so each warp keeps tiles of HBM reads in
// flight without holding them in registers (the register double buffer of
// MmaDecodeKernel holds one per warp at ~170 registers; this kernel needs
// ~128, so more warps fit).
//
// Block = (query, kv head) × split, NW warps taking tiles warp, warp + NW, ...
// Scores and values as MmaDecodeKernel with kMmaTokM: Sᵀ = K̂ · q as
// m16n8k16 with the dequantised K tile as A (16 tokens × 16 channels) and
// the scaled rotated queries as B (n = heads), O[c, h] += V̂ᵀ · (p·n_v)
// with V̂ᵀ as A; V dequantised in token pairs (one lookup = one A register).
//
// Spans: the K row of a token as the 16-byte-aligned span [row − mis,
// row − mis + 80) (index bytes, norm, misalignment), the V row the same way
// (80 or 48 bytes); where a stage's spans live: StagedLayout. A lane copies
// chunks l + 16j of the K (lanes 0-15) or V (16-31) spans of a tile: one
// cp.async each, destinations precomputed per lane.
// Reads: lane (g, i) takes row words i, i + 4, i + 8, i + 12 of K tokens g
// and g + 8, and row words g (and g + 8 for 4-bit V) of V tokens 2i, 2i + 1,
// 2i + 8, 2i + 9: bank-conflict free with dense 80- and 48-byte spans (2-way
// in the holes layouts), one LDS per word at a per-lane base plus
// immediates (no alignment selects).
// Tables: entry e of lane l at rows·e + 4·l, rows of 128 bytes (two-op
// lookup address) or 256 (one prmt), read with LDS immediates
// (kMmaSmemWindowBase).
// kTma (dense stages): lane 0 loads a tile's K and V spans with two TMA
// tensor loads (3-D maps over the page arena: span × 16 tokens × page)
// completing on the stage's mbarrier; no per-lane copy instructions, fewer
// L2 requests (served for k4v4 with one codebook).
#ifndef TQKV_GPU_KERNELS_ATTENTION_STAGED_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_STAGED_CUH_

#include <cuda.h>  // CUtensorMap

#include "gpu/kernels/attention_mma.cuh"

namespace tqkv::gpu {

// Where the stages live (StagedLayout::kMode):
//  kStagesDense: tables of 128-byte rows, then the stages (K spans of a
//    stage at 80·t, its V spans after them).
//  kStagesHoles (one K/V codebook, 4-bit V): the table takes 256-byte rows
//    (a lookup address is one prmt) and the stages live in the free upper
//    halves: span r of stage q = warp·S + s (r < 16: K token r, else V token
//    r − 16) in the half-row of table row 32q + r, at 16·(token mod 4) into
//    it (80 of 128 bytes; the offset spreads the tokens over the banks:
//    2-way conflicts on the row reads instead of 8-way).
//  kStagesHolesK: 256-byte-row K table with the K spans in its holes (16
//    half-rows per stage, room for 8 warps × 2 stages), the V table (if
//    any) and the dense V spans after it.
inline constexpr int kStagesDense = 0;
inline constexpr int kStagesHoles = 1;
inline constexpr int kStagesHolesK = 2;

template <int VB, bool kSharedKV, int kMode, int NW, int S>
struct StagedLayout {
  static_assert(VB == 4 || VB == 2, "staged decode: 4- or 2-bit values");
  static_assert(!kSharedKV || VB == 4, "one K/V table needs equal bits");
  static_assert(kMode != kStagesHoles || kSharedKV, "all stages in the table's holes: one K/V table");
  static_assert(kMode == kStagesDense || NW * S * (kMode == kStagesHoles ? 32 : 16) <= 256,
                "stages in the holes: 256 half-rows");
  static constexpr bool kRow256 = kMode != kStagesDense;
  static constexpr uint32_t kRowBytes = kRow256 ? 256u : 128u;
  static constexpr uint32_t kKTable = 0;
  // A separate V table (2-bit V: 16 entries) takes 256-byte rows: a lookup
  // address is one prmt of a byte-spread index word.
  static constexpr uint32_t kVTable = kSharedKV ? 0u : 256u * kRowBytes;
  static constexpr uint32_t kTables = 256u * kRowBytes + (kSharedKV ? 0u : (1u << (2 * VB)) * 256u);
  static constexpr int kKSpan = 80;                // K span bytes per token
  static constexpr int kVSpan = 16 * VB + 16;      // 80 or 48
  static constexpr int kVChunks = kVSpan / 16;     // chunks per V span
  // Stage q = warp·S + s: K and V bases and strides (bytes from the dynamic
  // shared memory's start), span offsets from those bases.
  static constexpr uint32_t kDenseStages = (kTables + 127u) / 128u * 128u;
  static constexpr uint32_t kKStride = kMode == kStagesHoles    ? 32u * 256u
                                       : kMode == kStagesHolesK ? 16u * 256u
                                                                : 16u * (kKSpan + kVSpan);
  static constexpr uint32_t kVStride = kMode == kStagesHolesK ? 16u * kVSpan : kKStride;
  static constexpr uint32_t KBase(int q) { return (kRow256 ? 128u : kDenseStages) + kKStride * q; }
  static constexpr uint32_t VBase(int q) {
    return kMode == kStagesHolesK ? kTables + kVStride * q : KBase(q) + (kMode == kStagesDense ? 16u * kKSpan : 0u);
  }
  static constexpr uint32_t End() {
    return kMode == kStagesHoles ? kTables : kMode == kStagesHolesK ? VBase(NW * S) : KBase(NW * S);
  }
  static constexpr uint32_t KSpan(int t) { return kRow256 ? 256u * t + 16u * (t & 3) : 80u * t; }
  static constexpr uint32_t VSpan(int t) {
    return kMode == kStagesHoles ? 256u * (16 + t) + 16u * (t & 3) : static_cast<uint32_t>(kVSpan) * t;
  }
};

// Dynamic shared memory: the layout's body (or the block merge's buffers,
// which reuse it), then the G rotated queries (fp32 × 128) and 32 floats of
// centroids.
template <int VB, bool kSharedKV, int kMode, int NW, int S, int G>
constexpr size_t StagedQueryOffset() {
  using L = StagedLayout<VB, kSharedKV, kMode, NW, S>;
  const size_t merge = (NW * G * 128 + NW * G * 2) * 4;
  const size_t body = L::End();
  return body > merge ? body : merge;
}
// ... then one 8-byte mbarrier per warp and stage (kTma).
template <int VB, bool kSharedKV, int kMode, int NW, int S, int G>
constexpr size_t StagedMbarOffset() {
  return StagedQueryOffset<VB, kSharedKV, kMode, NW, S, G>() + (G * 128 + 32) * sizeof(float);
}
template <int VB, bool kSharedKV, int kMode, int NW, int S, int G>
constexpr size_t StagedSmemBytes() {
  return StagedMbarOffset<VB, kSharedKV, kMode, NW, S, G>() + NW * S * 8;
}

// Tensor (TMA) loads into shared memory completing on an mbarrier.
__device__ __forceinline__ void MbarInit(uint32_t mbar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t mbar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t mbar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(mbar),
      "r"(parity)
      : "memory");
}
// Box at (c0, c1, c2) of a 3-D tensor map into dense shared memory at dst.
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                          uint32_t mbar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(mbar)
      : "memory");
}

// Tensor maps of a launch's K and V pages for kTma (uint8, dims: bytes of
// a token's row set, tokens of a page, pages; box: one span per token × 16
// tokens, StagedLayout::kKSpan / kVSpan bytes), built by the launcher.
struct StagedTensorMaps {
  CUtensorMap k, v;
};

// Channel of the score mma's B fragment (k-tile kk, half h, element e) held
// by lanes i: K word k of lane i is row word 4k + i (8 channels), and k-tile
// kk takes bytes 2(kk mod 2), 2(kk mod 2) + 1 of word kk / 2.
__host__ __device__ constexpr int StagedKChannel(int kk, int h, int e, int i) {
  return 32 * (kk / 2) + 8 * i + 4 * (kk % 2) + 2 * h + e;
}
// The same for 2-bit keys (TokMTiles' K pair lookups): lane i reads row
// words i and i + 4 (16 channels each); byte b of word q (channels 4b ..
// 4b + 3 of it) is k-tile 4q + b, channels 2h + e of the byte.
__host__ __device__ constexpr int StagedK2Channel(int kk, int h, int e, int i) {
  return 64 * (kk / 4) + 16 * i + 4 * (kk % 4) + 2 * h + e;
}
template <int KB>
__host__ __device__ constexpr int TokMKChannel(int kk, int h, int e, int i) {
  return KB == 2 ? StagedK2Channel(kk, h, e, i) : StagedKChannel(kk, h, e, i);
}

__device__ __forceinline__ uint32_t LdsWord(uint32_t addr) {
  uint32_t r;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(r) : "r"(addr) : "memory");
  return r;
}

// One warp's tokens-on-M attention over 16-token tiles whose packed rows
// sit in shared memory (StagedDecodeKernel, RowSetDecodeKernel): lane (g,
// i)'s query fragments, softmax state (heads 2i, 2i + 1) and value
// accumulator, and its read bases. Lane (g, i) reads row words i, i + 4,
// i + 8, i + 12 of K tokens g and g + 8 at k_rd (+ kK8), their norms at
// kn_rd, row words g (and g + 8 for 4-bit V) of V tokens 2i, 2i + 1, 2i +
// 8, 2i + 9 at v_rd (+ kV1, + kV8) and the V norms of tokens g, g + 8 at
// vn_rd: one LDS per word at a per-lane base plus immediates. Tables: entry
// e of lane l at rows·e + 4·l (rows of 128 or, kRow256, 256 bytes), read as
// LdsTable immediates. kV2Pairs (2-bit V, 256-byte rows): the V table's
// entries are bytes of four 2-bit fields, a channel pair of a token pair,
// 8 bytes (both A registers) per entry and half-warp lane at 256·e + 8·(l
// mod 16) from kVTable (BuildTokMTables): one 64-bit lookup per two A
// registers. kSpreadV: the value mma's token pairs are (i, i + 4) and (i +
// 8, i + 12) instead of (2i, 2i + 1) and (2i + 8, 2i + 9) (the caller's V
// read base and kV1 say where lane (g, i)'s tokens are), so that V rows at
// a token stride ≡ 8 words mod 32 (dense row sets) are read without bank
// conflicts. KB = 2: K row words i and i + 4 of tokens g and g + 8, K
// norms at row byte 32; the K table's entries (kKTable, 256-byte rows) are
// bytes of four 2-bit fields, 8 bytes (both A registers of a k-tile) per
// entry and half-warp lane at 256·e + 8·(l mod 16) (BuildTokMTables): one
// 64-bit lookup per two A registers (channels StagedK2Channel).
template <int VB, bool kRow256, uint32_t kKTable, uint32_t kVTable, uint32_t kK8, uint32_t kV8, uint32_t kV1,
          bool kV2Pairs = false, bool kSpreadV = false, int KB = 4>
struct TokMTiles {
  static_assert(!kV2Pairs || (VB == 2 && kRow256), "pair lookups: 2-bit V, 256-byte rows");
  static_assert(KB == 4 || KB == 2, "tokens-on-M tiles: 4- or 2-bit keys");
  uint32_t qa[8][2];  // B of the score mma: head g at channels TokMKChannel<KB>(kk, h, 0/1, i)
  float mh[2], lh[2];
  float acc[8][4];
  uint32_t k_rd, kn_rd, v_rd, vn_rd, lane4, lane8;
  int g, i, t1;  // t1: the end of the tokens this warp attends

  // A tile's value operands: P's B fragment and the V index words.
  struct Operands {
    uint32_t pb0, pb1;
    uint32_t w[2][2][2];  // 4-bit V: token-pair words tp[j][w][h]; 2-bit: sp[j][h][k]
  };

  // Lane state before the first tile: the read bases (stage 0) and the end
  // of the warp's tokens; then one of the Query* calls.
  __device__ __forceinline__ void Begin(uint32_t k_base, uint32_t kn_base, uint32_t v_base, uint32_t vn_base,
                                        int lane, int end) {
    k_rd = k_base, kn_rd = kn_base, v_rd = v_base, vn_rd = vn_base;
    lane4 = static_cast<uint32_t>(lane) * 4u;
    lane8 = static_cast<uint32_t>(lane & 15) * 8u;
    g = lane >> 2, i = lane & 3, t1 = end;
    mh[0] = mh[1] = -CUDART_INF_F;
    lh[0] = lh[1] = 0.0f;
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[u][e] = 0.0f;
  }
  // Head g's query fragments (zeros for g >= G), times scale·log2(e), from
  // its rotated query in memory: states (PrepareQueryKernel) or else the
  // block's own rotation in qbuf (G rows of 128 floats).
  __device__ __forceinline__ void QueryFromMemory(const AttentionLaunch& a, const AttnDims& d, const float* states,
                                                  const float* qbuf, int64_t qi, int kvh, int G) {
    const bool valid = g < G;
    const int hq = valid ? g : 0;
    const float* qrow = states ? states + (qi * a.q_heads + kvh * G + hq) * d.sk : qbuf + hq * 128;
    const float sl = a.scale * kLog2e;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float x0 = valid ? qrow[TokMKChannel<KB>(kk, h, 0, i)] * sl : 0.0f;
        const float x1 = valid ? qrow[TokMKChannel<KB>(kk, h, 1, i)] * sl : 0.0f;
        qa[kk][h] = PackHalf2(x0, x1);
      }
  }
  // The same from the warp's registers: qy[h][r] = channel lane + 32r of
  // rotated head h (h < G), every lane; channel c of head g comes from lane
  // c mod 32 by shuffles (G per channel; 2G for KB = 2, whose channel's
  // register depends on i), no shared memory.
  template <int G>
  __device__ __forceinline__ void QueryFromLanes(const float (&qy)[G][4], float scale) {
    const float sl = scale * kLog2e;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float x[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // register c / 32: kk / 2 (KB = 4), 2(kk / 4) + i / 2 (KB = 2)
          const int c = TokMKChannel<KB>(kk, h, e, i);
          float v = 0.0f;
#pragma unroll
          for (int hq = 0; hq < G; ++hq) {
            float y;
            if constexpr (KB == 2) {
              const float y0 = __shfl_sync(kFullMask, qy[hq][2 * (kk / 4)], c & 31);
              const float y1 = __shfl_sync(kFullMask, qy[hq][2 * (kk / 4) + 1], c & 31);
              y = (i >> 1) != 0 ? y1 : y0;
            } else {
              y = __shfl_sync(kFullMask, qy[hq][kk / 2], c & 31);
            }
            v = g == hq ? y : v;
          }
          x[e] = g < G ? v * sl : 0.0f;
        }
        qa[kk][h] = PackHalf2(x[0], x[1]);
      }
  }
  // The query fragments to / from shared memory at p (lane's word of
  // fragment k at p[32k]: conflict free).
  __device__ __forceinline__ void StoreQuery(uint32_t* p) const {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) p[32 * (2 * kk + h)] = qa[kk][h];
  }
  __device__ __forceinline__ void LoadQuery(const uint32_t* p) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) qa[kk][h] = p[32 * (2 * kk + h)];
  }
  // The tile at token tt, its K / V rows at the read bases + ko / vo.
  __device__ __forceinline__ void Tile(int tt, uint32_t ko, uint32_t vo) {
    float s[1][4];
    Scores(tt, ko, s[0]);
    TokMSoftmax<1>(s, mh, lh, acc, g);  // finite maxima: the tile's first token is valid
    Operands o;
    Prepare(tt, s[0], vo, o);
    Values(o);
  }
  // Two tiles (at tokens tt[k], rows at + ko[k] / vo[k]) with one softmax
  // update: two independent score and operand chains in flight (the first
  // tile's first token must be valid).
  __device__ __forceinline__ void Tiles2(const int (&tt)[2], const uint32_t (&ko)[2], const uint32_t (&vo)[2]) {
    float s[2][4];
    Scores(tt[0], ko[0], s[0]);
    Scores(tt[1], ko[1], s[1]);
    TokMSoftmax<2>(s, mh, lh, acc, g);
    Operands o[2];
    Prepare(tt[0], s[0], vo[0], o[0]);
    Prepare(tt[1], s[1], vo[1], o[1]);
    Values(o[0]);
    Values(o[1]);
  }
  // After the last tile: lh summed over the lanes of each i.
  __device__ __forceinline__ void ReduceSums() {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      lh[e] += __shfl_xor_sync(kFullMask, lh[e], 4);
      lh[e] += __shfl_xor_sync(kFullMask, lh[e], 8);
      lh[e] += __shfl_xor_sync(kFullMask, lh[e], 16);
    }
  }
  // Channel pair of accumulator unit u (rows g / g + 8 of acc[u]).
  __device__ __forceinline__ int PairOf(int u) const { return VB == 4 ? 4 * (g + 8 * (u / 4)) + u % 4 : 8 * g + u; }

  // Scores s[2·nt + e] of token g + 8·nt, head 2i + e (−inf past t1).
  __device__ __forceinline__ void Scores(int tt, uint32_t ko, float (&s)[4]) const {
    uint32_t kw[2][KB];  // row words i + 4k of tokens g, g + 8
    float nk[2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int k = 0; k < KB; ++k) kw[nt][k] = LdsWord(k_rd + ko + kK8 * nt + 16u * k);
      nk[nt] = __uint_as_float(LdsWord(kn_rd + ko + kK8 * nt));
    }
    float sc[2][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[0][e] = sc[1][e] = 0.0f;
    if constexpr (KB == 2) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {  // byte kk mod 4 of word kk / 4
        const uint2 x0 = LdsTable2<kKTable>(LutOffset256<8>(kw[0][kk / 4], kk % 4, lane8));
        const uint2 x1 = LdsTable2<kKTable>(LutOffset256<8>(kw[1][kk / 4], kk % 4, lane8));
        MmaF16(sc[kk & 1], x0.x, x1.x, x0.y, x1.y, qa[kk][0], qa[kk][1]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const int s0 = 2 * (kk % 2);
        const uint32_t w0 = kw[0][kk / 2], w1 = kw[1][kk / 2];
        const uint32_t a0 = LdsTable<kKTable>(LutOff<8, kRow256>(w0, s0, lane4));
        const uint32_t a1 = LdsTable<kKTable>(LutOff<8, kRow256>(w1, s0, lane4));
        const uint32_t a2 = LdsTable<kKTable>(LutOff<8, kRow256>(w0, s0 + 1, lane4));
        const uint32_t a3 = LdsTable<kKTable>(LutOff<8, kRow256>(w1, s0 + 1, lane4));
        MmaF16(sc[kk & 1], a0, a1, a2, a3, qa[kk][0], qa[kk][1]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const bool past = tt + g + 8 * nt >= t1;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = (sc[0][2 * nt + e] + sc[1][2 * nt + e]) * nk[nt];
        s[2 * nt + e] = past ? -CUDART_INF_F : v;
      }
    }
  }
  // From the probabilities p (Scores' layout, after TokMSoftmax): P·n_v
  // transposed to P's B fragment (head g; tokens 2i, 2i + 1 and 2i + 8,
  // 2i + 9), and the V words of token pairs (2i + 8j, 2i + 8j + 1), j = 0, 1.
  __device__ __forceinline__ void Prepare(int tt, const float (&p)[4], uint32_t vo, Operands& o) const {
    {
      uint32_t x[2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float nv = __uint_as_float(LdsWord(vn_rd + vo + kV8 * nt));
        nv = tt + g + 8 * nt >= t1 ? 0.0f : nv;  // rows past the end: NaN norms possible
        x[nt] = PackHalf2(p[2 * nt] * nv, p[2 * nt + 1] * nv);
      }
      TokMProbFragment<kSpreadV>(x, g, i, o.pb0, o.pb1);
    }
    if constexpr (kV2Pairs) {
      // Lane word: row word g (channels 16g .. 16g + 15, 2 bits each);
      // w[j][0][0 / 1] byte k: nibble 2k / 2k + 1 of the pair's two words
      // (low / high nibble of the byte: the first / second token), the
      // fields of channel pair 8g + u (u = 2k / 2k + 1) of both tokens.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t base = v_rd + vo + kV8 * j;
        TokenPairs4(LdsWord(base), LdsWord(base + kV1), o.w[j][0][0], o.w[j][0][1]);
      }
    } else if constexpr (VB == 4) {
      // Lane words w = 0, 1: row words g + 8w; w[j][w][0/1]: byte k = the
      // pair's low / high nibbles of byte k (channels 8(g + 8w) + 2k, + 1).
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          const uint32_t base = v_rd + vo + kV8 * j + 32u * w;
          TokenPairs4(LdsWord(base), LdsWord(base + kV1), o.w[j][w][0], o.w[j][w][1]);
        }
    } else {
      // Lane word: row word g (channels 16g .. 16g + 15, 2 bits each);
      // tp0/tp1: nibble u = the pair's fields 2u / 2u + 1, spread to bytes:
      // w[j][h][0] byte k = nibble 2k, w[..][1] byte k = nibble 2k + 1; a
      // lookup address is then one prmt.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t base = v_rd + vo + kV8 * j;
        const uint32_t x0 = LdsWord(base), x1 = LdsWord(base + kV1);
        const uint32_t tp0 = (x0 & 0x33333333u) | ((x1 << 2) & 0xCCCCCCCCu);
        const uint32_t tp1 = ((x0 >> 2) & 0x33333333u) | (x1 & 0xCCCCCCCCu);
        o.w[j][0][0] = tp0 & 0x0F0F0F0Fu;
        o.w[j][0][1] = (tp0 >> 4) & 0x0F0F0F0Fu;
        o.w[j][1][0] = tp1 & 0x0F0F0F0Fu;
        o.w[j][1][1] = (tp1 >> 4) & 0x0F0F0F0Fu;
      }
    }
  }
  __device__ __forceinline__ void Values(const Operands& o) {
    if constexpr (kV2Pairs) {
      // Unit u (channels 16g + 2u, + 1): token pair j's lookup is A
      // registers (j, low channel), (j, high channel).
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const uint2 x0 = LdsTable2<kVTable>(LutOffset256<8>(o.w[0][0][u & 1], u >> 1, lane8));
        const uint2 x1 = LdsTable2<kVTable>(LutOffset256<8>(o.w[1][0][u & 1], u >> 1, lane8));
        MmaF16(acc[u], x0.x, x0.y, x1.x, x1.y, o.pb0, o.pb1);
      }
    } else if constexpr (VB == 4) {
      TokenPairValueMmas(acc, [&](int j, int h, int u) {
        return LdsTable<kVTable>(LutOff<8, kRow256>(o.w[j][u / 4][h], u % 4, lane4));
      }, o.pb0, o.pb1);
    } else {
      TokenPairValueMmas(acc, [&](int j, int h, int u) {
        return LdsTable<kVTable>(LutOffset256<8>(o.w[j][h][u & 1], u >> 1, lane4));
      }, o.pb0, o.pb1);
    }
  }
};

// The folded query rotation's loads: query heads kvh·G + first + step·k (k
// < N; a head >= G loads head 0) in the group's channel order, the strided
// layout (lane + 32·r) its rotation takes.
template <int N>
__device__ __forceinline__ void LoadGroupQueries(const AttentionLaunch& a, const GpuGroup& kg, int64_t qi, int kvh,
                                                 int G, int first, int step, int lane, float (&qy)[N][4]) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int h = first + step * k;
    const float* q = a.q + (qi * a.q_heads + kvh * G + (h < G ? h : 0)) * a.dim;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int j = lane + 32 * r;
      qy[k][r] = q[kg.channel_map ? kg.channel_map[j] : j];
    }
  }
}

// The folded query rotation's factors and queries (LoadGroupQueries' heads
// and layout): from the launch's parameters where every head's K rotation
// has one layout (AttentionLaunch::k_signs: the loads wait for nothing),
// else through head kvh's descriptor (they wait for it first).
template <int N>
__device__ __forceinline__ void LoadFoldedQueries(const AttentionLaunch& a, int64_t qi, int kvh, int G, int first,
                                                  int step, int lane, HadamardLane<4>& qrot, float (&qy)[N][4]) {
  if (a.k_signs != nullptr) {
    const float* f = a.k_signs + 2 * kvh * a.dim;
    qrot.Load(a.host_k.groups[0], f, f + a.dim, lane);
    LoadGroupQueries(a, a.host_k.groups[0], qi, kvh, G, first, step, lane, qy);  // no channel map
  } else {
    const GpuGroup& kg = a.k_comp[kvh].groups[0];
    qrot.Load(kg, lane, true);
    LoadGroupQueries(a, kg, qi, kvh, G, first, step, lane, qy);
  }
}

// The staged kernels' lookup tables from the centroids cent (K at 0..15, V
// at 16..): 256 K (or K/V) entries of fp16 centroid pairs in rows of
// kRowBytes, a copy per lane, written as 16-byte stores (a quarter-warp
// per row: conflict free); for 2-bit V (!kSharedKV) 16 entries in
// 256-byte rows at kVTable. KB = 2: TokMTiles' K pair entries instead
// of the K table (byte e = fields f0 .. f3 at bits 0-1 .. 6-7 → (c[f0],
// c[f1]), (c[f2], c[f3])), in the rows' lower halves.
template <int VB, bool kSharedKV, uint32_t kRowBytes, uint32_t kKTable, uint32_t kVTable, bool kV2Pairs = false,
          int KB = 4>
__device__ __forceinline__ void BuildTokMTables(uint32_t* smem, const float* cent, int tid, int nthreads) {
  if constexpr (KB == 2) {
    static_assert(kRowBytes == 256, "K pair lookups: 256-byte rows");
    for (int e = tid; e < 256 * 8; e += nthreads) {
      const int ent = e >> 3;
      const uint32_t lo = PackHalf2(cent[ent & 3], cent[(ent >> 2) & 3]);
      const uint32_t hi = PackHalf2(cent[(ent >> 4) & 3], cent[ent >> 6]);
      *reinterpret_cast<uint4*>(&smem[(kKTable + ent * 256u) / 4 + 4 * (e & 7)]) = make_uint4(lo, hi, lo, hi);
    }
  } else {
    for (int e = tid; e < 256 * 8; e += nthreads) {
      const int ent = e >> 3;
      const uint32_t v = PackHalf2(cent[ent & 15], cent[ent >> 4]);
      *reinterpret_cast<uint4*>(&smem[(kKTable + ent * kRowBytes) / 4 + 4 * (e & 7)]) = make_uint4(v, v, v, v);
    }
  }
  if constexpr (kV2Pairs) {
    // TokMTiles' pair entries: byte e = fields (low channel, first token)
    // at bits 0-1, (high, first) 2-3, (low, second) 4-5, (high, second)
    // 6-7 → (fp16 pair of the low channel's two tokens, same of the high).
    static_assert(VB == 2 && kRowBytes == 256, "pair lookups: 2-bit V, 256-byte rows");
    const float* cv = cent + 16;
    for (int e = tid; e < 256 * 8; e += nthreads) {
      const int ent = e >> 3;
      const uint32_t lo = PackHalf2(cv[ent & 3], cv[(ent >> 4) & 3]);
      const uint32_t hi = PackHalf2(cv[(ent >> 2) & 3], cv[ent >> 6]);
      *reinterpret_cast<uint4*>(&smem[(kVTable + ent * 256u) / 4 + 4 * (e & 7)]) = make_uint4(lo, hi, lo, hi);
    }
  } else if constexpr (!kSharedKV) {
    for (int e = tid; e < (1 << (2 * VB)) * 8; e += nthreads) {
      const int ent = e >> 3;
      const uint32_t v = PackHalf2(cent[16 + (ent & ((1 << VB) - 1))], cent[16 + (ent >> VB)]);
      *reinterpret_cast<uint4*>(&smem[(kVTable + 256u * ent) / 4 + 4 * (e & 7)]) = make_uint4(v, v, v, v);
    }
  }
}

// states: the rotated queries of PrepareQueryKernel, or null: the block
// rotates its G heads itself (block-Hadamard K rotation: a few shuffles per
// head, overlapped with the table build; saves the preparation launch).
// kTma (dense stages only): a tile's 16 K and 16 V spans arrive as two
// tensor loads issued by lane 0 and complete on the stage's mbarrier,
// instead of 5 16-byte cp.async per lane.
template <int VB, int G, int S, int MB, bool kSharedKV, int kMode, int NW, bool kTma = false>
__global__ void __launch_bounds__(32 * NW, MB)
    StagedDecodeKernel(AttentionLaunch a, AttnDims d, const float* states, float* records,
                       const __grid_constant__ StagedTensorMaps maps) {
  using L = StagedLayout<VB, kSharedKV, kMode, NW, S>;
  constexpr bool kRow256 = L::kRow256;
  static_assert(S == 2, "the tile loop alternates two stages");
  constexpr int KB = 4;
  extern __shared__ __align__(16) uint32_t st_smem[];  // no static shared memory: kMmaSmemWindowBase
  float* qbuf = reinterpret_cast<float*>(st_smem) + StagedQueryOffset<VB, kSharedKV, kMode, NW, S, G>() / 4;
  float* cent = qbuf + G * 128;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(st_smem));
  static_assert(!kTma || kMode == kStagesDense, "tensor loads land in dense stages");
  const uint32_t mbar0 =
      smem_base + static_cast<uint32_t>(StagedMbarOffset<VB, kSharedKV, kMode, NW, S, G>()) + 8u * S * (threadIdx.x >> 5);
  if constexpr (kTma) {
    if ((threadIdx.x & 31) == 0) {
      for (int st = 0; st < S; ++st) MbarInit(mbar0 + 8u * st, 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
  }

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, i = lane & 3;
  const int64_t qi = blockIdx.x / a.kv_heads;
  const int kvh = static_cast<int>(blockIdx.x % a.kv_heads);
  const int split = blockIdx.y;
  // The prologue's small loads go out first (one memory latency each where
  // the launch allows: the centroids from its host copy with uniform
  // codebooks, the queries and signs with AttentionLaunch::k_signs), then
  // the sequence's length, its first block-table entries and the warp's
  // first tile; the tables and the query rotation overlap them (the first
  // tile used to wait for the whole prologue).
  float ck = 0.0f, cv = 0.0f;
  if (a.uniform_codebooks) {
    if (tid < (1 << KB)) ck = __ldg(a.host_k.groups[0].centroids + tid);
    if (tid < (1 << VB)) cv = __ldg(a.host_v.groups[0].centroids + tid);
  } else {
    if (tid < (1 << KB)) ck = __ldg(a.k_comp[kvh].groups[0].centroids + tid);
    if (tid < (1 << VB)) cv = __ldg(a.v_comp[kvh].groups[0].centroids + tid);
  }
  // Folded query rotation: warp w takes heads w, w + NW, ...
  constexpr int kHeadsPerWarp = (G + NW - 1) / NW;
  const bool fold = states == nullptr;
  float qy[kHeadsPerWarp][4];
  HadamardLane<4> qrot;
  if (fold) LoadFoldedQueries(a, qi, kvh, G, warp, NW, lane, qrot, qy);
  const int krow = a.host_k.row_bytes, vrow = a.host_v.row_bytes;  // every head's (the pages' layout)
  const int mis = 4 * (kvh & 3);
  const int seq = SeqOf(a, qi);
  const int limit = static_cast<int>(min(a.positions[qi] + 1, a.packed_tokens[seq]));
  const int t0 = split * static_cast<int>(d.chunk);
  const int t1 = min(limit, t0 + static_cast<int>(d.chunk));
  const int ntiles = t1 > t0 ? (t1 - t0 + 15) / 16 : 0;
  const int nmine = ntiles > warp ? (ntiles - warp + NW - 1) / NW : 0;  // this warp's tiles
  const int kstep = a.kv_heads * krow, vstep = a.kv_heads * vrow;
  const int32_t* btab = BlockTable(a, seq);
  const int bs_shift = __ffs(a.block_size) - 1;  // a power of two (eligibility)
  const uint32_t bs_mask = static_cast<uint32_t>(a.block_size) - 1u;
  const uint64_t stride = static_cast<uint64_t>(a.block_stride);

  // Copies: lane l < 16 takes K chunks l + 16j (j < 5), lane 16 + l V chunks
  // l + 16j (j < kVChunks); chunk c of a span set is token c / chunks-per-
  // span, piece c mod chunks-per-span, at 16·c in the stage. (One row per
  // lane, its chunks at immediate offsets, issues ~30 fewer instructions
  // per tile but is 5-40% slower: 16 rows per copy instruction.)
  const bool kside = lane < 16;
  const int l16 = lane & 15;
  const int cps = kside ? 5 : L::kVChunks;
  const uint8_t* cbase = kside ? a.k_base : a.v_base;
  const int cstep = kside ? kstep : vstep;
  const int chead = kvh * (kside ? krow : vrow) - mis;
  uint32_t csrc[5];
#pragma unroll
  for (int j = 0; j < 5; ++j) {
    const int c = l16 + 16 * j;
    csrc[j] = static_cast<uint32_t>((c / cps) * cstep + (c % cps) * 16 + chead);
  }
  // Stage s of this warp: K spans at kst + s·kKStride, V at vst + s·kVStride.
  const uint32_t kst = smem_base + L::KBase(warp * S), vst = smem_base + L::VBase(warp * S);
  const uint32_t cst = kside ? kst : vst, cstride = kside ? L::kKStride : L::kVStride;
  // cd[j]: the lane's chunk destinations in stage 0, opaque so that the
  // compiler keeps them in registers instead of recomputing them per tile.
  uint32_t cd[5];
#pragma unroll
  for (int j = 0; j < 5; ++j) {
    const int c = l16 + 16 * j;
    cd[j] = Opaque(cst + (kside ? L::KSpan(c / cps) : L::VSpan(c / cps)) + 16u * (c % cps));
  }

  // Pages of the warp's tiles, read without waiting for the sequence's
  // length (entries past it are read but not used).
  PageStream pages([&](int n) -> int32_t {
    const int b = (t0 + (warp + NW * n) * 16) >> bs_shift;
    return b < a.max_blocks ? __ldg(btab + b) : 0;
  }, lane);
  // Issue the copies of this warp's tile n into `stage`: cp.async (always
  // one commit group, empty past the end, so wait counts stay exact), or
  // with kTma two tensor loads by lane 0 on the stage's mbarrier.
  auto issue = [&](int n, uint32_t stage) {
    const uint32_t page = pages.Next(n, lane);
    if (n < nmine) {
      const int tt = t0 + (warp + NW * n) * 16;
      if constexpr (kTma) {
        if (lane == 0) {
          const uint32_t mbar = mbar0 + 8u * stage;
          MbarArriveExpectTx(mbar, 16u * (L::kKSpan + L::kVSpan));
          // The stage was last read through the generic proxy (LDS).
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          const int c1 = static_cast<int>(static_cast<uint32_t>(tt) & bs_mask);
          TmaLoad3d(kst + stage * L::kKStride, &maps.k, kvh * krow - mis, c1, static_cast<int>(page), mbar);
          TmaLoad3d(vst + stage * L::kVStride, &maps.v, kvh * vrow - mis, c1, static_cast<int>(page), mbar);
        }
      } else {
        const uint8_t* src = cbase + page * stride + (static_cast<uint32_t>(tt) & bs_mask) * cstep;
        const uint32_t so = stage * cstride;
#pragma unroll
        for (int j = 0; j < 5; ++j)
          if (j < cps) CpAsync16(cd[j] + so, src + csrc[j]);
      }
    }
    if constexpr (!kTma) CpAsyncCommit();
  };

  issue(0, 0);

  if (tid < (1 << KB)) cent[tid] = ck;
  if (tid < (1 << VB)) cent[16 + tid] = cv;
  __syncthreads();
  BuildTokMTables<VB, kSharedKV, L::kRowBytes, L::kKTable, L::kVTable>(st_smem, cent, tid, blockDim.x);

  if (fold) {
#pragma unroll
    for (int hw = 0; hw < kHeadsPerWarp; ++hw) {
      const int h = warp + NW * hw;
      if (h < G) {
        qrot.Apply(qy[hw], lane);
#pragma unroll
        for (int k = 0; k < 4; ++k) qbuf[h * 128 + lane + 32 * k] = qy[hw][k];
      }
    }
  }
  __syncthreads();  // tables and rotated queries complete

  // Per-lane read bases within a stage (see the header comment).
  // Tokens t and t + 8 share t mod 4, so K / V token + 8 and the V token
  // pair's second token are immediates (kK8, kV8, kV1).
  // Absolute for stage 0 (stage 1 adds kKStride / kVStride as an
  // immediate: the tile loop alternates the two stages explicitly), opaque
  // as cd above.
  constexpr uint32_t kK8 = L::KSpan(8) - L::KSpan(0), kV8 = L::VSpan(8) - L::VSpan(0);
  constexpr uint32_t kV1 = L::VSpan(1) - L::VSpan(0);  // also VSpan(2k + 1) − VSpan(2k)
  TokMTiles<VB, kRow256, L::kKTable, L::kVTable, kK8, kV8, kV1> tiles;
  tiles.Begin(Opaque(kst + L::KSpan(g) + static_cast<uint32_t>(mis + 4 * i)),
              Opaque(kst + L::KSpan(g) + static_cast<uint32_t>(mis + 64)),
              Opaque(vst + L::VSpan(2 * i) + static_cast<uint32_t>(mis + 4 * g)),
              Opaque(vst + L::VSpan(g) + static_cast<uint32_t>(mis + 16 * VB)), lane, t1);
  tiles.QueryFromMemory(a, d, states, qbuf, qi, kvh, G);

  // The ring of two stages: tile n + 1 in flight while tile n computes
  // from stage n mod 2; the loop takes tiles in pairs so that every stage
  // offset is an immediate. (Running tile n − 1's value mmas between tile
  // n's scores and its softmax, operands held in registers, measured no
  // faster: 136 registers, within 1-2% of this at every benchmark shape.)
  auto step = [&](int n, uint32_t stage) {
    if constexpr (kTma) {
      MbarWait(mbar0 + 8u * stage, static_cast<uint32_t>(n >> 1) & 1u);  // the stage's (n / 2)-th use
    } else {
      CpAsyncWait<0>();
    }
    __syncwarp();
    issue(n + 1, stage ^ 1u);  // into the stage tile n − 1 used (read before the last __syncwarp)
    tiles.Tile(t0 + (warp + NW * n) * 16, stage * L::kKStride, stage * L::kVStride);
    __syncwarp();
  };
  int n = 0;
  for (; n + 1 < nmine; n += 2) {
    step(n, 0);
    step(n + 1, 1);
  }
  if (n < nmine) step(n, 0);
  if constexpr (!kTma) CpAsyncWait<0>();
  // The split merge (a programmatic dependent launch) may start launching
  // once every block is past its tiles.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  tiles.ReduceSums();

  // Block merge of the warps into one split record.
  __syncthreads();  // tables and stages no longer read
  float* macc = reinterpret_cast<float*>(st_smem);  // [warps][G][128]
  float* mml = macc + NW * G * 128;                  // [warps][G][2]
  // Channel pair of unit u (rows g / g + 8 of acc[u]).
  StoreWarpAcc<G>(macc, tiles.acc, warp, i, [&](int u) { return tiles.PairOf(u); });
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (g == 0 && 2 * i + e < G) {
      mml[(warp * G + 2 * i + e) * 2] = tiles.mh[e];
      mml[(warp * G + 2 * i + e) * 2 + 1] = tiles.lh[e];
    }
  }
  __syncthreads();
  MergeWarpRecords<NW, G>(macc, mml, tid, [&](int h) {
    return records + ((qi * a.q_heads + kvh * G + h) * d.splits + split) * d.record;
  });
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_STAGED_CUH_
