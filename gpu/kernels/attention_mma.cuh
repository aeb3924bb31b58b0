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

#include "gpu/kernels/mma_warp.cuh"

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
// served configuration of each bit pair in gpu/attention.cu picks them).
//   kMmaKReg (2-bit keys): K centroids come from registers instead of a
//     shared-memory table: the 4 fp16 centroids as a low-byte and a
//     high-byte register; one prmt per fp16 pair (selector nibbles i, i|4
//     per index, built with a shift, a lop3 and one imad per 4 index pairs).
//   kMmaLut256: tables of byte units (4-bit rows) use 256-byte rows (entry e
//     of lane l at byte 256e + 4l, V at +128), so one prmt of the index word
//     with the lane's offset is the lookup address (128-byte rows need a
//     shift and a lop3).
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
inline constexpr int kMmaTokM = 8;

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
  LaunchTailMergeEarly(a);
  using KU = MmaBits<KB>;
  using VU = MmaBits<VB>;
  using Raw = MmaTileRaw<KB, VB>;
  constexpr bool kKReg = (KM & kMmaKReg) != 0, kRow256 = (KM & kMmaLut256) != 0;
  constexpr bool kTokM = (KM & kMmaTokM) != 0;
  static_assert(!kKReg || KB == 2, "register dequantisation serves 2-bit keys");
  // Score chains per n-tile: two (k-tile parity) hide mma latency.
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
  KRegTable ktab;
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
  const int32_t* btab = BlockTable(a, seq);
  const int bs_shift = __ffs(a.block_size) - 1;  // block_size: a power of two (the plan: TensorCore)
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
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      kmerge(nt);
      const uint32_t(&kw)[KW] = kws[nt];
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][0][e] = sc[nt][1][e] = 0.0f;
      if constexpr (kKReg) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {  // word q: k-tiles 4q .. 4q + 3
          uint32_t b[8];
          ktab.Dequant2(kw[q], b);
#pragma unroll
          for (int k = 0; k < 4; ++k)
            MmaF16(sc[nt][k & 1], qa[4 * q + k][0], 0u, qa[4 * q + k][1], 0u, b[2 * k], b[2 * k + 1]);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          const int u0 = 2 * kk;
          const uint32_t w = kw[u0 / KU::kUnitsPerWord];
          const int s0 = u0 % KU::kUnitsPerWord;
          const uint32_t b0 = LdsTable<0>(LutOff<KU::kUnitBits, kRow256>(w, s0, lane4));
          const uint32_t b1 = LdsTable<0>(LutOff<KU::kUnitBits, kRow256>(w, s0 + 1, lane4));
          MmaF16(sc[nt][kk & 1], qa[kk][0], 0u, qa[kk][1], 0u, b0, b1);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      hold[nt] = __uint_as_float(PickWord<KW>(r.kt[nt], kwn));
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float nk = __shfl_sync(kFullMask, hold[nt], 4 * (2 * i + e) + ikn);
        const bool valid = tt + 8 * nt + 2 * i + e < t1;
        const float x = sc[nt][0][e] + sc[nt][1][e];
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
    if constexpr (kKReg) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {  // word q: k-tiles 4q .. 4q + 3
        uint32_t b0[8], b1[8];
        ktab.Dequant2(kw[0][q], b0);
        ktab.Dequant2(kw[1][q], b1);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          MmaF16(sc[k & 1], b0[2 * k], b1[2 * k], b0[2 * k + 1], b1[2 * k + 1], qa[4 * q + k][0],
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
        MmaF16(sc[kk & 1], a0, a1, a2, a3, qa[kk][0], qa[kk][1]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float nk = __shfl_sync(kFullMask, hold[nt], 4 * g + ikn);
      const bool valid = tt + g + 8 * nt < t1;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = sc[0][2 * nt + e] + sc[1][2 * nt + e];
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
