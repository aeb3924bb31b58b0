// Page-streaming variant of the tensor-core decode kernel (benchmark
// variant 2, not served: measured slower at every shape on the H200, see
// bench/RESULTS.md). Split from attention_mma.cuh, whose helpers it uses.
#ifndef TQKV_GPU_KERNELS_ATTENTION_MMA_PAGE_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_MMA_PAGE_CUH_

#include "gpu/kernels/attention_mma.cuh"

namespace tqkv::gpu {

// Page-streaming variant: block = (query, quad of kv heads h0..h0+3,
// split), 4·TT warps; warp (w = warp mod 4, j = warp / 4) takes kv head
// h0 + w and the j-th 16-token tile of every stage. A stage is 16·TT tokens
// of the quad's K and V rows (per token 4·row_bytes contiguous, 16-byte
// aligned bytes: h0 ≡ 0 mod 4), copied with cp.async by the whole block
// into an S-deep shared-memory ring, so S − 1 stages (the block's next
// 16·TT·(S − 1) tokens of 4 heads) are in flight while one is computed.
// Rows then come from shared memory at the same region offsets as in
// MmaDecodeKernel (kv head h0 + w sits at mis = 4w, its region at 16·KB·w);
// token strides are padded so that the piece loads are conflict-free.
// Needs every kv head to share one K and one V codebook (one table per
// block); with equal K and V codebooks the two tables are one.
template <int KB, int VB, int TT, int S>
struct PageCfg {
  static constexpr int kWarps = 4 * TT;
  static constexpr int kTok = 16 * TT;             // tokens per stage
  static constexpr int kKRow = 4 * (16 * KB + 4);  // the quad's K bytes per token
  static constexpr int kVRow = 4 * (16 * VB + 4);
  static constexpr int kKStride = KB == 4 ? 320 : 160;  // ≡ 16 / 8 words mod 32
  static constexpr int kVStride = kVRow;                // 68 / 36 words: conflict-free already
  static constexpr int kKChunks = kKRow / 16, kVChunks = kVRow / 16;
  static constexpr int kStageBytes = kTok * (kKStride + kVStride);
  static constexpr int kLutBytes(bool shared) {
    return (MmaBits<KB>::kLutEntries + (shared ? 0 : MmaBits<VB>::kLutEntries)) * 32 * 4;
  }
  static constexpr size_t SmemBytes(bool shared, int G) {
    const size_t pipe = static_cast<size_t>(kLutBytes(shared)) + static_cast<size_t>(S) * kStageBytes;
    const size_t merge = (static_cast<size_t>(kWarps) * G * 128 + kWarps * G * 2) * 4;
    return pipe > merge ? pipe : merge;
  }
  // Blocks per SM by shared memory (228 KiB per SM, 1 KiB reserved per block).
  static constexpr int Resident(bool shared, int G) {
    const int r = static_cast<int>((228u * 1024u) / (SmemBytes(shared, G) + 1024u));
    const int by_threads = 2048 / (32 * kWarps);
    return r < 1 ? 1 : (r > by_threads ? by_threads : r);
  }
  // __launch_bounds__ target: registers for this many blocks per SM.
  static constexpr int kMinBlocks = TT == 1 ? 3 : (TT == 2 ? 2 : 1);
};

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <int N>
__device__ __forceinline__ void LoadWordsShared(const uint8_t* p, uint32_t (&w)[N]) {
  if constexpr (N == 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (N == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}

template <int KB, int VB, int G, int TT, int S>
__global__ void __launch_bounds__(32 * 4 * TT, (PageCfg<KB, VB, TT, S>::kMinBlocks))
    MmaPageKernel(AttentionLaunch a, AttnDims d, const float* states, float* records, bool shared_lut) {
  using KU = MmaBits<KB>;
  using VU = MmaBits<VB>;
  using Raw = MmaTileRaw<KB, VB>;
  using C = PageCfg<KB, VB, TT, S>;
  constexpr int PK = 4 * KB;
  constexpr int PV = 2 * VB;
  constexpr int KW = Raw::kKW, VW = Raw::kVW;
  constexpr int kThreads = 32 * C::kWarps;
  extern __shared__ __align__(16) uint32_t mma_smem[];
  __shared__ float cent[32];
  uint32_t* lut_k = mma_smem;
  uint32_t* lut_v = shared_lut ? mma_smem : mma_smem + KU::kLutEntries * 32;
  uint8_t* ring = reinterpret_cast<uint8_t*>(mma_smem) + C::kLutBytes(shared_lut);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, i = lane & 3;
  const int w = warp & 3, j = warp >> 2;
  const uint32_t lane4 = static_cast<uint32_t>(lane) * 4u;
  const int quads = a.kv_heads >> 2;
  const int64_t qi = blockIdx.x / quads;
  const int h0 = 4 * static_cast<int>(blockIdx.x % quads);
  const int kvh = h0 + w;
  const int split = blockIdx.y;
  const GpuComponent& kc0 = a.k_comp[h0];
  const GpuComponent& vc0 = a.v_comp[h0];

  const int seq = a.query_seq[qi];
  const int64_t limit = min(a.positions[qi] + 1, a.packed_tokens[seq]);
  const int64_t t0 = split * d.chunk;
  const int64_t t1 = min(limit, t0 + d.chunk);
  const int64_t ntiles = t1 > t0 ? (t1 - t0 + 15) / 16 : 0;
  const int64_t nst = (ntiles + TT - 1) / TT;
  const int krb = 16 * KB + 4, vrb = 16 * VB + 4;
  const int64_t kstep = static_cast<int64_t>(a.kv_heads) * krb;
  const int64_t vstep = static_cast<int64_t>(a.kv_heads) * vrb;
  const int32_t* btab = a.block_table + static_cast<int64_t>(seq) * a.max_blocks;

  // Stage st (buffer st mod S): the tiles st·TT .. st·TT + TT − 1 of the split.
  auto issue = [&](int64_t st) {
    if (st < nst) {
      uint8_t* kb = ring + (st % S) * C::kStageBytes;
      uint8_t* vb = kb + C::kTok * C::kKStride;
      const int64_t tbase = t0 + st * C::kTok;
#pragma unroll 1
      for (int c = tid; c < C::kTok * C::kKChunks; c += kThreads) {
        const int tok = c / C::kKChunks, ch = c - tok * C::kKChunks;
        const int64_t tt = tbase + tok;
        if (tbase + (tok & ~15) < t1) {
          const int64_t page = __ldg(btab + tt / a.block_size);
          CpAsync16(kb + tok * C::kKStride + 16 * ch,
                    a.k_base + page * a.block_stride + (tt % a.block_size) * kstep + h0 * krb + 16 * ch);
        }
      }
#pragma unroll 1
      for (int c = tid; c < C::kTok * C::kVChunks; c += kThreads) {
        const int tok = c / C::kVChunks, ch = c - tok * C::kVChunks;
        const int64_t tt = tbase + tok;
        if (tbase + (tok & ~15) < t1) {
          const int64_t page = __ldg(btab + tt / a.block_size);
          CpAsync16(vb + tok * C::kVStride + 16 * ch,
                    a.v_base + page * a.block_stride + (tt % a.block_size) * vstep + h0 * vrb + 16 * ch);
        }
      }
    }
    CpAsyncCommit();
  };
  // The first stages go out before the tables are built.
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);

  if (tid < (1 << KB)) cent[tid] = __ldg(kc0.groups[0].centroids + tid);
  if (tid < (1 << VB)) cent[16 + tid] = __ldg(vc0.groups[0].centroids + tid);
  __syncthreads();
  for (int e = tid; e < KU::kLutEntries * 32; e += kThreads) {
    const int ent = e >> 5;
    lut_k[e] = PackHalf2(cent[ent & ((1 << KB) - 1)], cent[ent >> KB]);
  }
  if (!shared_lut)
    for (int e = tid; e < VU::kLutEntries * 32; e += kThreads) {
      const int ent = e >> 5;
      lut_v[e] = PackHalf2(cent[16 + (ent & ((1 << VB) - 1))], cent[16 + (ent >> VB)]);
    }

  const int mis = 4 * w;
  const int muk = mis * 8 / KU::kUnitBits, muv = mis * 8 / VU::kUnitBits;
  uint32_t qa[8][2];
  {
    const float sl = a.scale * kLog2e;
    const float* qrow = states + (qi * a.q_heads + kvh * G + (g < G ? g : 0)) * d.sk;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int p = (16 * i + 2 * kk + h - muk) & 63;
        const float x0 = g < G ? qrow[2 * p] * sl : 0.0f;
        const float x1 = g < G ? qrow[2 * p + 1] * sl : 0.0f;
        qa[kk][h] = PackHalf2(x0, x1);
      }
    }
  }
  const bool k_has_tail = PK * i < 16, v_has_tail = PV * g < 16;
  const int ikn = mis / PK, kwn = (mis % PK) / 4;
  const int gvn = mis / PV, vwn = (mis % PV) / 4;
  const int kthr = 16 * KB * w + PK * i;
  const int vthr = 16 * VB * w + PV * g;

  auto fill = [&](int64_t st, Raw& r) {
    const uint8_t* kb = ring + (st % S) * C::kStageBytes + 16 * j * C::kKStride;
    const uint8_t* vb = ring + (st % S) * C::kStageBytes + C::kTok * C::kKStride + 16 * j * C::kVStride;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const uint8_t* p = kb + (g + 8 * nt) * C::kKStride + kthr;
      LoadWordsShared<KW>(p, r.k[nt]);
      if (k_has_tail) LoadWordsShared<KW>(p + KU::kIndexBytes, r.kt[nt]);
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint8_t* p = vb + (2 * i + (v & 1) + 8 * (v >> 1)) * C::kVStride + vthr;
      LoadWordsShared<VW>(p, r.v[v]);
      if (v_has_tail) LoadWordsShared<VW>(p + VU::kIndexBytes, r.vt[v]);
    }
  };

  float m = -CUDART_INF_F, l = 0.0f;
  float acc[8][4];
#pragma unroll
  for (int u = 0; u < 8; ++u)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[u][e] = 0.0f;

  auto scores = [&](int64_t tl, const Raw& r, float (&s)[4]) {
    const int64_t tt = t0 + tl * 16;
    float sc[2][2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      uint32_t kw[KW];
#pragma unroll
      for (int q = 0; q < KW; ++q) kw[q] = PK * i + 4 * q < mis ? r.kt[nt][q] : r.k[nt][q];
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][0][e] = sc[nt][1][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const int u0 = 2 * kk;
        const uint32_t wd = kw[u0 / KU::kUnitsPerWord];
        const int s0 = u0 % KU::kUnitsPerWord;
        const uint32_t b0 = LdsU32(lut_k, LutOffset<KU::kUnitBits>(wd, s0, lane4));
        const uint32_t b1 = LdsU32(lut_k, LutOffset<KU::kUnitBits>(wd, s0 + 1, lane4));
        MmaF16(sc[nt][kk & 1], qa[kk][0], 0u, qa[kk][1], 0u, b0, b1);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float hold = __uint_as_float(PickWord<KW>(r.kt[nt], kwn));
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float nk = __shfl_sync(kFullMask, hold, 4 * (2 * i + e) + ikn);
        const bool valid = tt + 8 * nt + 2 * i + e < t1;
        s[2 * nt + e] = valid ? (sc[nt][0][e] + sc[nt][1][e]) * nk : -CUDART_INF_F;
      }
    }
  };
  auto values = [&](int64_t tl, const Raw& r, const float (&p)[4]) {
    const int64_t tt = t0 + tl * 16;
    float pn[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float hold = __uint_as_float(PickWord<VW>(r.vt[v], vwn));
      const float nv = __shfl_sync(kFullMask, hold, 4 * gvn + i);
      const bool valid = tt + 2 * i + (v & 1) + 8 * (v >> 1) < t1;
      pn[v] = valid ? p[v] * nv : 0.0f;
    }
    const uint32_t pb0 = PackHalf2(pn[0], pn[1]), pb1 = PackHalf2(pn[2], pn[3]);
    uint32_t vw[4][VW];
#pragma unroll
    for (int v = 0; v < 4; ++v)
#pragma unroll
      for (int q = 0; q < VW; ++q) vw[v][q] = PV * g + 4 * q < mis ? r.vt[v][q] : r.v[v][q];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      uint32_t x[4];
#pragma unroll
      for (int v = 0; v < 4; ++v)
        x[v] = LdsU32(lut_v, LutOffset<VU::kUnitBits>(vw[v][u / VU::kUnitsPerWord], u % VU::kUnitsPerWord, lane4));
      MmaF16(acc[u], Prmt(x[0], x[1], 0x5410), Prmt(x[0], x[1], 0x7632), Prmt(x[2], x[3], 0x5410),
             Prmt(x[2], x[3], 0x7632), pb0, pb1);
    }
  };
  auto compute = [&](int64_t tl, const Raw& r) {
    float s[4];
    scores(tl, r, s);
    float tmax = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
    tmax = fmaxf(tmax, __shfl_xor_sync(kFullMask, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(kFullMask, tmax, 2));
    const float mnew = fmaxf(m, tmax);  // finite: the tile's first token is valid
    const float corr = exp2f(m - mnew);
    m = mnew;
    float psum = 0.0f;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      s[v] = exp2f(s[v] - mnew);
      psum += s[v];
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
    values(tl, r, s);
  };

#pragma unroll 1
  for (int64_t st = 0; st < nst; ++st) {
    CpAsyncWait<S - 2>();
    __syncthreads();  // stage st landed for all threads; stage st − 1 is free (and the tables are built)
    issue(st + S - 1);
    const int64_t tl = st * TT + j;
    if (tl < ntiles) {
      Raw r;
      fill(st, r);
      compute(tl, r);
    }
  }
  CpAsyncWait<0>();
  l += __shfl_xor_sync(kFullMask, l, 1);
  l += __shfl_xor_sync(kFullMask, l, 2);

  __syncthreads();  // ring and tables no longer read
  float* macc = reinterpret_cast<float*>(mma_smem);  // [warps][G][128]
  float* mml = macc + C::kWarps * G * 128;            // [warps][G][2]
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int pu = (8 * g + u - muv) & 63;
    const int hA = 2 * i, hB = 2 * i + 1;
    if (hA < G) {
      macc[(warp * G + hA) * 128 + 2 * pu] = acc[u][0];
      macc[(warp * G + hA) * 128 + 2 * pu + 1] = acc[u][2];
    }
    if (hB < G) {
      macc[(warp * G + hB) * 128 + 2 * pu] = acc[u][1];
      macc[(warp * G + hB) * 128 + 2 * pu + 1] = acc[u][3];
    }
  }
  if (i == 0 && g < G) {
    mml[(warp * G + g) * 2] = m;
    mml[(warp * G + g) * 2 + 1] = l;
  }
  __syncthreads();
  for (int idx = tid; idx < 4 * G * 128; idx += kThreads) {
    const int ch = idx & 127, hw = idx >> 7;  // hw = w·G + h
    const int hw_w = hw / G, h = hw - hw_w * G;
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int jj = 0; jj < TT; ++jj) mx = fmaxf(mx, mml[((jj * 4 + hw_w) * G + h) * 2]);
    float v = 0.0f, lsum = 0.0f;
#pragma unroll
    for (int jj = 0; jj < TT; ++jj) {
      const int wi = jj * 4 + hw_w;
      const float mw = mml[(wi * G + h) * 2];
      const float f = mw == -CUDART_INF_F ? 0.0f : exp2f(mw - mx);
      v = fmaf(f, macc[(wi * G + h) * 128 + ch], v);
      lsum = fmaf(f, mml[(wi * G + h) * 2 + 1], lsum);
    }
    float* rec = records + ((qi * a.q_heads + (h0 + hw_w) * G + h) * d.splits + split) * d.record;
    rec[2 + ch] = v;
    if (ch == 0) {
      rec[0] = mx;
      rec[1] = lsum;
    }
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_MMA_PAGE_CUH_
