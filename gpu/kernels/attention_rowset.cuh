// Row-set decode attention at d = 128 for 4-bit keys (TQ4 with one K/V
// codebook, K4/V2 with uniform codebooks) and for 2-bit keys and values
// (K2/V2, uniform codebooks; 64-bit K pair lookups): a block takes one
// query, a group of 8 kv heads and one context split. With P = 1 (8 warps, 2
// blocks per SM) warp w is kv head 8·hg + w and walks every tile of the
// split; with P = 2 (16 warps, one block per SM; served) warp w is kv head
// 8·hg + w mod 8 on the tiles of parity w / 8. A tile's K (and V) rows of
// the 8 heads are contiguous in a page (token-major rows, 8 · row bytes per
// token), so one TMA tensor load per tile and component brings them into a
// shared stage that 8 warps read: no partial-sector L2 reads (the per-head
// kernels load 80-byte spans of 68-byte rows, ~2 L2 sectors per 32 useful
// bytes), one table per block, and S stages in flight.
//
// Stage ring: S stages per block; stage s's full barrier (an mbarrier, one
// arrival plus the tensor loads' bytes) completes its k-th phase when tile
// kS + s has landed (with P = 2 a stage only ever holds tiles of parity
// s mod 2). Each of its 8 reading warps, after computing the tile, adds one
// to the stage's reader count; the warp that brings it to 8(k + 1) is the
// stage's last reader and issues tile (k + 1)S + s into it (no warp waits
// for a producer or for the other warps except through the full barriers).
//
// In a stage, token t's K row set sits at kKTok·t with kKTok = 8 · 68 +
// 16: the tensor box takes 16 bytes more than the row set, so that the
// per-lane reads of TokMTiles' score fragments (tokens g, 8 lanes at a
// time) hit 32 different banks (token stride 140 words ≡ 12 mod 32). 4-bit
// V row sets are dense (kVTok = 8 · 68: 136 words ≡ 8 mod 32), read
// conflict-free by the value fragments' spread token pairs (TokMTiles'
// kSpreadV: lanes i = 0..3 read tokens i, i + 4, ...), since a box with an
// out-of-bounds gap streams 4-7% slower than a dense one at 32 × 32K
// (bench/profiling/decode_floor): TQ4 1-3% faster (measured 2026-11-30,
// bench/history/). 2-bit V rows keep the gap (+16 bytes, 76 words ≡ 12):
// dense ones were 0.5-1% slower for K4/V2 at 32 × 32K. Dense K rows would
// put tokens g and g + 4 in one bank; TMA's 32-byte swizzle avoids that,
// but its 4-D loads and per-read address XOR made the kernel 3-5% slower
// (measured 2026-11-30). 2-bit K row sets keep the gap too (76 words ≡ 12:
// lanes read row words i and i + 4). Scores, softmax and value mmas:
// TokMTiles.
#ifndef TQKV_GPU_KERNELS_ATTENTION_ROWSET_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_ROWSET_CUH_

#include "gpu/kernels/attention_staged.cuh"
#include "gpu/kernels/profile_hooks.cuh"

namespace tqkv::gpu {

inline constexpr int kRowSetHeads = 8;  // kv heads (= warps) per block

// Tables of 256-byte rows (a lookup address is one prmt; 4-9% faster for
// TQ4 than 128-byte rows with 3 stages, bench/RESULTS.md) take 64 KiB, so
// 2 stages fit at 2 blocks per SM, 8 at one (2-bit K and V: the pair
// tables in the rows' lower and upper halves); the rotated queries reach
// their fragments by shuffles (no shared memory), so the first tiles load
// during the prologue, and the warps' output rows reuse the stages once
// every warp is past its last tile.
template <int VB, int S, int G, int P = 1, int KB = 4>
struct RowSetLayout {
  static_assert(VB == 4 || VB == 2, "row-set decode: 4- or 2-bit values");
  static_assert(KB == 4 || (KB == 2 && VB == 2), "row-set decode: 4-bit keys, or 2-bit keys and values");
  static_assert(P == 1 || (P == 2 && S % 2 == 0), "two tile parities need an even stage count");
  static constexpr bool kSharedKV = VB == 4;
  static constexpr uint32_t kKRow = 16 * KB + 4, kVRow = 16 * VB + 4;  // packed row bytes
  static constexpr bool kSpreadV = VB == 4;  // dense V row sets, spread value token pairs
  static constexpr uint32_t kKTok = kRowSetHeads * kKRow + 16, kVTok = kRowSetHeads * kVRow + (kSpreadV ? 0 : 16);
  // Tables (StagedLayout's rows): K (or the one K/V table) at 0; for 2-bit
  // V the token-pair table of TokMTiles' kV2Pairs in the K rows' upper
  // halves (the K entries take 128 of each row's 256 bytes).
  static constexpr uint32_t kRowBytes = 256;
  static constexpr uint32_t kKTable = 0;
  static constexpr uint32_t kVTable = kSharedKV ? 0u : 128u;
  static constexpr uint32_t kTables = 256u * kRowBytes;
  static constexpr uint32_t kKStage = 16 * kKTok, kVStage = 16 * kVTok, kStage = kKStage + kVStage;
  static_assert(kKStage % 128 == 0 && kVStage % 128 == 0, "tensor loads land 128-byte aligned");
  static constexpr uint32_t KBase(int s) { return kTables + kStage * s; }
  static constexpr uint32_t VBase(int s) { return KBase(s) + kKStage; }
  // Over the stages once every warp is past its last tile: the warps'
  // output rows (the records' transposition, [8 heads][G][128]) and, for
  // two parities, the parity-1 warps' accumulator fragments and (m, l)
  // ([8 heads][36][32 lanes]); then the centroids, the full barriers, the
  // reader counts and, for two parities, the query fragments the parity-0
  // warps hand to the parity-1 warps ([8 heads][16][32 lanes]).
  static constexpr uint32_t kOut = KBase(0);
  static constexpr uint32_t kXchg = kOut + kRowSetHeads * G * 128 * 4;
  static constexpr uint32_t kOutEnd = kXchg + (P == 2 ? kRowSetHeads * 36 * 32 * 4 : 0);
  static constexpr uint32_t kCent = kOutEnd > KBase(S) ? kOutEnd : KBase(S);
  static constexpr uint32_t kMbar = kCent + 32 * 4;
  static constexpr uint32_t kCount = kMbar + 8 * S;
  static constexpr uint32_t kQa = (kCount + 4 * S + 15) / 16 * 16;
  static constexpr uint32_t kBytes = kQa + (P == 2 ? kRowSetHeads * 16 * 32 * 4 : 0);
};

// Blocks per SM: two of 8 warps, or one of 16 (P = 2).
template <int P>
inline constexpr int kRowSetBlocksPerSm = P == 1 ? 2 : 1;

// P = 1: warp w is kv head w and takes every tile. P = 2 (16 warps): warp
// w is kv head w mod 8 and takes the tiles of parity w / 8, so the two
// halves of the block advance through one tile stream together (no block
// of the SM finishing long before the other and leaving the SM to one
// block's stages), and their records merge in shared memory at the end.
//
// T = 2: a warp computes its tiles two at a time (stages k, k + 1 of its
// parity) with one softmax update, two independent chains in flight.
template <int VB, int G, int S, int P, int T = 1, int KB = 4>
__global__ void __launch_bounds__(32 * kRowSetHeads * P, kRowSetBlocksPerSm<P>)
    RowSetDecodeKernel(AttentionLaunch a, AttnDims d, const float* states, float* records,
                       const __grid_constant__ StagedTensorMaps maps) {
  using L = RowSetLayout<VB, S, G, P, KB>;
  constexpr int NW = kRowSetHeads;  // readers per stage
  constexpr int kHalf = S / P;      // stages per parity
  static_assert(T == 1 || (T == 2 && kHalf % 2 == 0), "two tiles per step: an even stage count per parity");
  extern __shared__ __align__(128) uint32_t rs_smem[];  // no static shared memory: kMmaSmemWindowBase
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(rs_smem));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, i = lane & 3;
  const int head = warp % NW, par = warp / NW;  // par: this warp's tile parity (0 for P = 1)
  const int groups = a.kv_heads / NW;
  const int64_t qi = blockIdx.x / groups;
  const int hg = static_cast<int>(blockIdx.x % groups);
  const int kvh = hg * NW + head;
  const int split = blockIdx.y;
  float* cent = reinterpret_cast<float*>(rs_smem) + L::kCent / 4;
  uint32_t* count = rs_smem + L::kCount / 4;
  const uint32_t mbar0 = smem_base + L::kMbar;

  // The prologue's small loads go out first, the tiles' burst after them:
  // the centroids (one codebook for all heads: the launch's host copy of
  // the components) and, for a folded query rotation (states == null) with
  // AttentionLaunch::k_signs, the warp's G queries and rotation factors (no
  // dependent loads; parity-0 warps only: a parity-1 warp takes its head's
  // query fragments from them); thread 0 then loads the sequence's length
  // and the first block-table entries and issues the first S tiles. Loads
  // issued after the burst wait behind it: per-block timelines on the H200
  // put the loop's start at ~11.7 µs when warp 0 loaded its queries after
  // thread 0's tiles, at ~9.2 µs when they waited for a descriptor before
  // the tiles, and at ~8.5 µs in this order (bench/RESULTS.md).
  const float ck = tid < (1 << KB) ? __ldg(a.host_k.groups[0].centroids + tid) : 0.0f;
  const float cv = tid < (1 << VB) ? __ldg(a.host_v.groups[0].centroids + tid) : 0.0f;
  const bool fold = states == nullptr;
  const bool rotates = fold && par == 0;
  const bool early = rotates && a.k_signs != nullptr;  // no descriptor to wait for
  float qy[G][4];
  HadamardLane<4> qrot;
  if (early) LoadFoldedQueries(a, qi, kvh, G, 0, 1, lane, qrot, qy);
  const int seq = SeqOf(a, qi);
  const int limit = static_cast<int>(min(a.positions[qi] + 1, a.packed_tokens[seq]));
  const int t0 = split * static_cast<int>(d.chunk);
  const int t1 = min(limit, t0 + static_cast<int>(d.chunk));
  const int ntiles = t1 > t0 ? (t1 - t0 + 15) / 16 : 0;
  const int32_t* btab = BlockTable(a, seq);
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
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&maps.k)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&maps.v)) : "memory");
    // The first S tiles' pages, loaded together and without waiting for
    // the sequence's length (entries past it are read but not used).
    int first[S];
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const int b = (t0 + 16 * s) >> bs_shift;
      first[s] = b < a.max_blocks ? __ldg(btab + b) : 0;
    }
    for (int s = 0; s < S; ++s) {
      MbarInit(mbar0 + 8u * s, 1);
      count[s] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    // The first S tiles load during the prologue (nothing else uses the
    // stages before the records).
#pragma unroll
    for (int s = 0; s < S; ++s)
      if (s < ntiles) issue(s, s, first[s]);
  }
  if (rotates && !early) LoadFoldedQueries(a, qi, kvh, G, 0, 1, lane, qrot, qy);
  if (tid < (1 << KB)) cent[tid] = ck;
  if (tid < (1 << VB)) cent[16 + tid] = cv;
  __syncthreads();  // centroids (and barrier init) visible
  if constexpr (profile::kRowsetCut < 3)
    BuildTokMTables<VB, L::kSharedKV, L::kRowBytes, L::kKTable, L::kVTable, !L::kSharedKV, KB>(rs_smem, cent, tid,
                                                                                               blockDim.x);
  // Per-lane read bases in this warp's first stage (its stage p + 2k adds
  // 2k·kStage, an immediate): the fragment layout of TokMTiles with the
  // row-set token strides. The query fragments need no other warp's work
  // but the parity-0 warp's: they are ready before the tables' barrier (a
  // parity-1 warp reads its copy after it).
  // Lane (g, i)'s value token pairs: (i, i + 4) spread, else (2i, 2i + 1).
  constexpr uint32_t kV8 = 8 * L::kVTok, kV1 = (L::kSpreadV ? 4 : 1) * L::kVTok, kVLane = L::kSpreadV ? 1 : 2;
  constexpr uint32_t kK8 = 8 * L::kKTok;
  const uint32_t pbase = L::kStage * static_cast<uint32_t>(par);
  TokMTiles<VB, true, L::kKTable, L::kVTable, kK8, kV8, kV1, !L::kSharedKV, L::kSpreadV, KB> tiles;
  tiles.Begin(Opaque(smem_base + pbase + L::KBase(0) + L::kKTok * g + L::kKRow * head + 4u * i),
              Opaque(smem_base + pbase + L::KBase(0) + L::kKTok * g + L::kKRow * head + 16u * KB),
              Opaque(smem_base + pbase + L::VBase(0) + L::kVTok * kVLane * i + L::kVRow * head + 4u * g),
              Opaque(smem_base + pbase + L::VBase(0) + L::kVTok * g + L::kVRow * head + 16u * VB), lane, t1);
  uint32_t* qa_copy = rs_smem + L::kQa / 4 + head * 16 * 32 + lane;
  if (rotates) {
    if constexpr (profile::kRowsetCut < 3) {
#pragma unroll
      for (int h = 0; h < G; ++h) qrot.Apply(qy[h], lane);
      tiles.QueryFromLanes(qy, a.scale);
    }
    if constexpr (P == 2) tiles.StoreQuery(qa_copy);
  } else if (!fold) {
    tiles.QueryFromMemory(a, d, states, nullptr, qi, kvh, G);
  }
  __syncthreads();  // tables complete (and the parity-0 warps' query fragments)
  if constexpr (P == 2) {
    if (fold && par == 1) tiles.LoadQuery(qa_copy);
  }

  // This warp's tiles n = par + P·j, j = 0, 1, ...: tile n sits in stage
  // n mod S = par + P·(j mod kHalf) in its (j / kHalf)-th fill. Every warp
  // streams the pages of its tiles' refills (n + S), so the one that
  // issues a refill has its page in a register.
  const int mine = (ntiles - par + P - 1) / P;
  PageStream pages([&](int m) -> int32_t {
    const int tt = t0 + 16 * (par + P * m + S);
    return tt < t1 ? __ldg(btab + (tt >> bs_shift)) : 0;
  }, lane);
  // Counts this warp's read of stage k (its tile j, on the stage's (j /
  // kHalf)-th fill); the stage's last reader refills it with tile n + S.
  auto release = [&](int j, int k, int page) {
    const int n = par + P * j, s = par + P * k;
    if (lane == 0) {
      const uint32_t before = atomicAdd(count + s, 1u);
      if (before + 1 == static_cast<uint32_t>(NW * (j / kHalf + 1)) && n + S < ntiles) issue(n + S, s, page);
    }
  };
  // Tile j of this warp from its stage k (= j mod kHalf).
  auto step = [&](int j, int k) {
    const int page = static_cast<int>(pages.Next(j, lane));  // tile n + S's
    MbarWait(mbar0 + 8u * (par + P * k), static_cast<uint32_t>(j / kHalf) & 1u);
    if constexpr (profile::kRowsetCut < 1) tiles.Tile(t0 + 16 * (par + P * j), L::kStage * P * k, L::kStage * P * k);
    __syncwarp();
    if (lane == 0) __threadfence_block();  // this warp's reads of the stage before its count
    release(j, k, page);
  };
  // Tiles j, j + 1 from stages k, k + 1 (k even: one phase).
  auto step2 = [&](int j, int k) {
    const int page0 = static_cast<int>(pages.Next(j, lane));
    const int page1 = static_cast<int>(pages.Next(j + 1, lane));
    const uint32_t phase = static_cast<uint32_t>(j / kHalf) & 1u;
    MbarWait(mbar0 + 8u * (par + P * k), phase);
    MbarWait(mbar0 + 8u * (par + P * (k + 1)), phase);
    if constexpr (profile::kRowsetCut < 1)
      tiles.Tiles2({t0 + 16 * (par + P * j), t0 + 16 * (par + P * (j + 1))},
                   {L::kStage * P * k, L::kStage * P * (k + 1)}, {L::kStage * P * k, L::kStage * P * (k + 1)});
    __syncwarp();
    if (lane == 0) __threadfence_block();
    release(j, k, page0);
    release(j + 1, k + 1, page1);
  };
  int j = 0;
  for (; j + kHalf <= mine; j += kHalf) {
#pragma unroll
    for (int k = 0; k < kHalf; k += T) {
      if constexpr (T == 2) step2(j + k, k);
      else step(j + k, k);
    }
  }
#pragma unroll
  for (int k = 0; k < kHalf - 1; k += T) {
    if constexpr (T == 2) {
      if (j + k + 1 < mine) step2(j + k, k);
      else if (j + k < mine) step(j + k, k);
    } else {
      if (j + k < mine) step(j + k, k);
    }
  }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  tiles.ReduceSums();
  // The split records: the accumulators through the output rows (over the
  // stages: once every warp is past its last tile).
  __syncthreads();
  if constexpr (P == 2) {
    // The parity-1 warps hand their accumulator fragments and (m, l) to
    // the parity-0 warp of their head (same fragment layout, lane-major:
    // conflict free), which merges them in registers: m = max, weights
    // exp2(m_p - m) (0 for a parity without tokens).
    float* x = reinterpret_cast<float*>(rs_smem) + L::kXchg / 4 + head * 36 * 32 + lane;
    if (par == 1) {
#pragma unroll
      for (int u = 0; u < 8; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[(4 * u + e) * 32] = tiles.acc[u][e];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        x[(32 + e) * 32] = tiles.mh[e];
        x[(34 + e) * 32] = tiles.lh[e];
      }
    }
    __syncthreads();
    if (par == 1) return;
    float f0[2], f1[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float m0 = tiles.mh[e], m1 = x[(32 + e) * 32];
      const float mx = fmaxf(m0, m1);
      f0[e] = m0 == -CUDART_INF_F ? 0.0f : FastExp2(m0 - mx);
      f1[e] = m1 == -CUDART_INF_F ? 0.0f : FastExp2(m1 - mx);
      tiles.mh[e] = mx;
      tiles.lh[e] = fmaf(f0[e], tiles.lh[e], f1[e] * x[(34 + e) * 32]);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) tiles.acc[u][e] = fmaf(f0[e & 1], tiles.acc[u][e], f1[e & 1] * x[(4 * u + e) * 32]);
  }
  // Each (parity-0) warp's records: acc[u][0], [2] belong to head 2i,
  // [1], [3] to head 2i + 1 (StoreWarpAcc).
  float* own = reinterpret_cast<float*>(rs_smem) + L::kOut / 4 + head * G * 128;
  StoreWarpAcc<G>(own, tiles.acc, 0, i, [&](int u) { return tiles.PairOf(u); });
  __syncwarp();
  auto rec_of = [&](int h) { return records + ((qi * a.q_heads + kvh * G + h) * d.splits + split) * d.record; };
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int k = 0; k < 4; ++k) rec_of(h)[2 + lane + 32 * k] = own[h * 128 + lane + 32 * k];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (g == 0 && 2 * i + e < G) {
      rec_of(2 * i + e)[0] = tiles.mh[e];
      rec_of(2 * i + e)[1] = tiles.lh[e];
    }
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_ROWSET_CUH_
