// Row-set decode attention for 4-bit keys at d = 128 (TQ4 with one K/V
// codebook, K4/V2 with uniform codebooks): a block takes one query, a group
// of 8 kv heads (warp w = kv head 8·hg + w) and one context split, and
// every warp walks all tiles of the split. A tile's K (and V) rows of the
// 8 heads are contiguous in a page (token-major rows, 8 · row bytes per
// token), so one TMA tensor load per tile and component brings them into a
// shared stage that all 8 warps read: no partial-sector L2 reads (the
// per-head kernels load 80-byte spans of 68-byte rows, ~2 L2 sectors per
// 32 useful bytes), one table per 8 warps, and S stages of the block in
// flight.
//
// Stage ring: S stages per block; stage s's full barrier (an mbarrier, one
// arrival plus the tensor loads' bytes) completes its k-th phase when tile
// kS + s has landed. Each warp, after computing a tile, adds one to the
// stage's reader count; the warp that brings it to 8(k + 1) is the stage's
// last reader and issues tile (k + 1)S + s into it (no warp waits for a
// producer or for the other warps except through the full barriers).
//
// In a stage, token t's row set sits at kTok·t with kTok = 8 · row bytes +
// 16 (the tensor box takes 16 bytes more than the row set, so that the
// per-lane reads of StagedDecodeKernel's fragment layout hit 32 different
// banks: token stride 140 words ≡ 12 mod 32 for 68-byte rows, 76 ≡ 12 for
// 36-byte rows). Scores, softmax and value mmas as StagedDecodeKernel.
#ifndef TQKV_GPU_KERNELS_ATTENTION_ROWSET_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_ROWSET_CUH_

#include "gpu/kernels/attention_staged.cuh"

namespace tqkv::gpu {

inline constexpr int kRowSetHeads = 8;  // kv heads (= warps) per block

template <int VB, int S, int G>
struct RowSetLayout {
  static_assert(VB == 4 || VB == 2, "row-set decode: 4- or 2-bit values");
  static constexpr bool kSharedKV = VB == 4;
  static constexpr uint32_t kKRow = 68, kVRow = 16 * VB + 4;  // packed row bytes
  static constexpr uint32_t kKTok = kRowSetHeads * kKRow + 16, kVTok = kRowSetHeads * kVRow + 16;
  // Tables of 128-byte rows (StagedLayout's dense mode): K (or the one K/V
  // table) at 0, a 2-bit V table of 256-byte rows after it.
  static constexpr uint32_t kKTable = 0;
  static constexpr uint32_t kVTable = kSharedKV ? 0u : 256u * 128u;
  static constexpr uint32_t kTables = 256u * 128u + (kSharedKV ? 0u : 16u * 256u);
  static constexpr uint32_t kKStage = 16 * kKTok, kVStage = 16 * kVTok, kStage = kKStage + kVStage;
  static_assert(kKStage % 128 == 0 && kVStage % 128 == 0, "tensor loads land 128-byte aligned");
  static constexpr uint32_t KBase(int s) { return kTables + kStage * s; }
  static constexpr uint32_t VBase(int s) { return KBase(s) + kKStage; }
  // Then the warps' rotated queries (and later their output rows), the
  // centroids, the full barriers and the reader counts.
  static constexpr uint32_t kQuery = KBase(S);
  static constexpr uint32_t kCent = kQuery + kRowSetHeads * G * 128 * 4;
  static constexpr uint32_t kMbar = kCent + 32 * 4;
  static constexpr uint32_t kCount = kMbar + 8 * S;
  static constexpr uint32_t kBytes = kCount + 4 * S;
};

template <int VB, int G, int S>
__global__ void __launch_bounds__(32 * kRowSetHeads, 2)
    RowSetDecodeKernel(AttentionLaunch a, AttnDims d, const float* states, float* records,
                       const __grid_constant__ StagedTensorMaps maps) {
  using L = RowSetLayout<VB, S, G>;
  constexpr int NW = kRowSetHeads;
  extern __shared__ __align__(128) uint32_t rs_smem[];  // no static shared memory: kMmaSmemWindowBase
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(rs_smem));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, i = lane & 3;
  const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
  const int groups = a.kv_heads / NW;
  const int64_t qi = blockIdx.x / groups;
  const int hg = static_cast<int>(blockIdx.x % groups);
  const int kvh = hg * NW + warp;
  const int split = blockIdx.y;
  float* qbuf = reinterpret_cast<float*>(rs_smem) + (L::kQuery / 4) + warp * G * 128;  // this warp's heads
  float* cent = reinterpret_cast<float*>(rs_smem) + L::kCent / 4;
  uint32_t* count = rs_smem + L::kCount / 4;
  const uint32_t mbar0 = smem_base + L::kMbar;
  const GpuComponent& kc = a.k_comp[kvh];

  const int seq = a.query_seq[qi];
  const int limit = static_cast<int>(min(a.positions[qi] + 1, a.packed_tokens[seq]));
  const int t0 = split * static_cast<int>(d.chunk);
  const int t1 = min(limit, t0 + static_cast<int>(d.chunk));
  const int ntiles = t1 > t0 ? (t1 - t0 + 15) / 16 : 0;
  const int32_t* btab = a.block_table + static_cast<int64_t>(seq) * a.max_blocks;
  const int bs_shift = __ffs(a.block_size) - 1;  // a power of two (eligibility)
  const uint32_t bs_mask = static_cast<uint32_t>(a.block_size) - 1u;
  // Tile n (on `page`) into stage s: two tensor loads on the stage's full
  // barrier.
  auto issue = [&](int n, int s, int page) {
    const int tt = t0 + 16 * n;
    const uint32_t mbar = mbar0 + 8u * s;
    MbarArriveExpectTx(mbar, L::kStage);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stage was last read by LDS
    const int c1 = static_cast<int>(static_cast<uint32_t>(tt) & bs_mask);
    TmaLoad3d(smem_base + L::KBase(s), &maps.k, hg * NW * static_cast<int>(L::kKRow / 4), c1, page, mbar);
    TmaLoad3d(smem_base + L::VBase(s), &maps.v, hg * NW * static_cast<int>(L::kVRow / 4), c1, page, mbar);
  };
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      MbarInit(mbar0 + 8u * s, 1);
      count[s] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int s = 0; s < S && s < ntiles; ++s) issue(s, s, __ldg(btab + ((t0 + 16 * s) >> bs_shift)));
  }

  if (tid < 16) cent[tid] = __ldg(a.k_comp[hg * NW].groups[0].centroids + tid);
  if (tid < (1 << VB)) cent[16 + tid] = __ldg(a.v_comp[hg * NW].groups[0].centroids + tid);
  // Folded query rotation (states == null): each warp rotates its G heads.
  const bool fold = states == nullptr;
  float qy[G][4];
  HadamardLane<4> qrot;
  if (fold) {
    const GpuGroup& kg = kc.groups[0];
    qrot.Load(kg, lane, true);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float* q = a.q + (qi * a.q_heads + kvh * G + h) * a.dim;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int j = lane + 32 * k;
        qy[h][k] = q[kg.channel_map ? kg.channel_map[j] : j];
      }
    }
  }
  __syncthreads();  // centroids (and barrier init) visible
  for (int e = tid; e < 256 * 8; e += blockDim.x) {
    const int ent = e >> 3;
    const uint32_t v = PackHalf2(cent[ent & 15], cent[ent >> 4]);
    *reinterpret_cast<uint4*>(&rs_smem[(L::kKTable + ent * 128u) / 4 + 4 * (e & 7)]) = make_uint4(v, v, v, v);
  }
  if constexpr (!L::kSharedKV) {
    for (int e = tid; e < (1 << (2 * VB)) * 8; e += blockDim.x) {
      const int ent = e >> 3;
      const uint32_t v = PackHalf2(cent[16 + (ent & ((1 << VB) - 1))], cent[16 + (ent >> VB)]);
      *reinterpret_cast<uint4*>(&rs_smem[(L::kVTable + 256u * ent) / 4 + 4 * (e & 7)]) = make_uint4(v, v, v, v);
    }
  }
  if (fold) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      qrot.Apply(qy[h], lane);
#pragma unroll
      for (int k = 0; k < 4; ++k) qbuf[h * 128 + lane + 32 * k] = qy[h][k];
    }
  }
  __syncthreads();  // tables complete (and each warp's rotated queries)

  uint32_t qa[8][2];
  {
    const float sl = a.scale * kLog2e;
    const int hq = g < G ? g : 0;
    const float* qrow = states ? states + (qi * a.q_heads + kvh * G + hq) * d.sk : qbuf + hq * 128;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float x0 = g < G ? qrow[StagedKChannel(kk, h, 0, i)] * sl : 0.0f;
        const float x1 = g < G ? qrow[StagedKChannel(kk, h, 1, i)] * sl : 0.0f;
        qa[kk][h] = PackHalf2(x0, x1);
      }
  }

  // Per-lane read bases in stage 0 (stage s adds s·kStage, an immediate):
  // lane (g, i) reads row words i + 4k of K tokens g, g + 8 and row words g
  // (g + 8) of V tokens 2i, 2i + 1, 2i + 8, 2i + 9, as StagedDecodeKernel.
  const uint32_t k_rd = Opaque(smem_base + L::KBase(0) + L::kKTok * g + L::kKRow * warp + 4u * i);
  const uint32_t kn_rd = Opaque(smem_base + L::KBase(0) + L::kKTok * g + L::kKRow * warp + 64u);
  const uint32_t v_rd = Opaque(smem_base + L::VBase(0) + L::kVTok * 2 * i + L::kVRow * warp + 4u * g);
  const uint32_t vn_rd = Opaque(smem_base + L::VBase(0) + L::kVTok * g + L::kVRow * warp + 16u * VB);
  constexpr uint32_t kK8 = 8 * L::kKTok, kV8 = 8 * L::kVTok, kV1 = L::kVTok;

  float mh[2] = {-CUDART_INF_F, -CUDART_INF_F}, lh[2] = {0.0f, 0.0f};  // heads 2i, 2i + 1
  float acc[8][4];
#pragma unroll
  for (int u = 0; u < 8; ++u)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[u][e] = 0.0f;

  auto scores = [&](int n, uint32_t so, float (&s)[1][4]) {
    const int tt = t0 + 16 * n;
    uint32_t kw[2][4];
    float nk[2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int k = 0; k < 4; ++k) kw[nt][k] = LdsWord(k_rd + so + kK8 * nt + 16u * k);
      nk[nt] = __uint_as_float(LdsWord(kn_rd + so + kK8 * nt));
    }
    float sc[2][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[0][e] = sc[1][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const int s0 = 2 * (kk % 2);
      const uint32_t w0 = kw[0][kk / 2], w1 = kw[1][kk / 2];
      const uint32_t a0 = LdsTable<L::kKTable>(LutOff<8, false>(w0, s0, lane4));
      const uint32_t a1 = LdsTable<L::kKTable>(LutOff<8, false>(w1, s0, lane4));
      const uint32_t a2 = LdsTable<L::kKTable>(LutOff<8, false>(w0, s0 + 1, lane4));
      const uint32_t a3 = LdsTable<L::kKTable>(LutOff<8, false>(w1, s0 + 1, lane4));
      MmaF16(sc[kk & 1], a0, a1, a2, a3, qa[kk][0], qa[kk][1]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const bool past = tt + g + 8 * nt >= t1;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = (sc[0][2 * nt + e] + sc[1][2 * nt + e]) * nk[nt];
        s[0][2 * nt + e] = past ? -CUDART_INF_F : v;
      }
    }
  };
  struct Operands {
    uint32_t pb0, pb1;
    uint32_t w[2][2][2];
  };
  auto operands = [&](int n, float (&s)[1][4], uint32_t so, Operands& o) {
    const int tt = t0 + 16 * n;
    TokMSoftmax<1>(s, mh, lh, acc, g);  // finite maxima: the tile's first token is valid
    {
      uint32_t x[2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float nv = __uint_as_float(LdsWord(vn_rd + so + kV8 * nt));
        nv = tt + g + 8 * nt >= t1 ? 0.0f : nv;  // rows past the end: NaN norms possible
        x[nt] = PackHalf2(s[0][2 * nt] * nv, s[0][2 * nt + 1] * nv);
      }
      TokMProbFragment(x, g, i, o.pb0, o.pb1);
    }
    if constexpr (VB == 4) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          const uint32_t base = v_rd + so + kV8 * j + 32u * w;
          TokenPairs4(LdsWord(base), LdsWord(base + kV1), o.w[j][w][0], o.w[j][w][1]);
        }
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t base = v_rd + so + kV8 * j;
        const uint32_t x0 = LdsWord(base), x1 = LdsWord(base + kV1);
        const uint32_t tp0 = (x0 & 0x33333333u) | ((x1 << 2) & 0xCCCCCCCCu);
        const uint32_t tp1 = ((x0 >> 2) & 0x33333333u) | (x1 & 0xCCCCCCCCu);
        o.w[j][0][0] = tp0 & 0x0F0F0F0Fu;
        o.w[j][0][1] = (tp0 >> 4) & 0x0F0F0F0Fu;
        o.w[j][1][0] = tp1 & 0x0F0F0F0Fu;
        o.w[j][1][1] = (tp1 >> 4) & 0x0F0F0F0Fu;
      }
    }
  };
  auto values = [&](const Operands& o) {
    if constexpr (VB == 4) {
      TokenPairValueMmas(acc, [&](int j, int h, int u) {
        return LdsTable<L::kVTable>(LutOff<8, false>(o.w[j][u / 4][h], u % 4, lane4));
      }, o.pb0, o.pb1);
    } else {
      TokenPairValueMmas(acc, [&](int j, int h, int u) {
        return LdsTable<L::kVTable>(LutOffset256<8>(o.w[j][h][u & 1], u >> 1, lane4));
      }, o.pb0, o.pb1);
    }
  };
  // Every warp streams the pages of tiles S, S + 1, ... (the refills), so
  // the one that issues a refill has its page in a register.
  PageStream pages([&](int m) -> int32_t {
    const int tt = t0 + 16 * (m + S);
    return tt < t1 ? __ldg(btab + (tt >> bs_shift)) : 0;
  }, lane);
  // Tile n from stage s (= n mod S), then this warp's read of the stage is
  // counted; the stage's last reader refills it with tile n + S.
  auto step = [&](int n, int s) {
    const int page = static_cast<int>(pages.Next(n, lane));  // tile n + S's
    MbarWait(mbar0 + 8u * s, static_cast<uint32_t>(n / S) & 1u);
    float sc[1][4];
    scores(n, L::kStage * s, sc);
    Operands o;
    operands(n, sc, L::kStage * s, o);
    values(o);
    __syncwarp();
    if (lane == 0) {
      __threadfence_block();  // this warp's reads of the stage before its count
      const uint32_t before = atomicAdd(count + s, 1u);
      if (before + 1 == static_cast<uint32_t>(NW * (n / S + 1)) && n + S < ntiles) issue(n + S, s, page);
    }
  };
  int n = 0;
  for (; n + S <= ntiles; n += S) {
#pragma unroll
    for (int s = 0; s < S; ++s) step(n + s, s);
  }
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (n + s < ntiles) step(n + s, s);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    lh[e] += __shfl_xor_sync(kFullMask, lh[e], 4);
    lh[e] += __shfl_xor_sync(kFullMask, lh[e], 8);
    lh[e] += __shfl_xor_sync(kFullMask, lh[e], 16);
  }
  // The warp's split records: the accumulator through its own query rows.
  __syncwarp();
  StoreWarpAcc<G>(qbuf, acc, 0, i, [&](int u) { return VB == 4 ? 4 * (g + 8 * (u / 4)) + u % 4 : 8 * g + u; });
  __syncwarp();
  auto rec_of = [&](int h) { return records + ((qi * a.q_heads + kvh * G + h) * d.splits + split) * d.record; };
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int k = 0; k < 4; ++k) rec_of(h)[2 + lane + 32 * k] = qbuf[h * 128 + lane + 32 * k];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (g == 0 && 2 * i + e < G) {
      rec_of(2 * i + e)[0] = mh[e];
      rec_of(2 * i + e)[1] = lh[e];
    }
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_ROWSET_CUH_
