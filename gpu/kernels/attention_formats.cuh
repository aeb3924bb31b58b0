// Decode attention for every packed format the specialised kernels do not
// take: mse rows of 2..8 bits (k3v3, k5v5, k8v8, asymmetric pairs), the
// turboquant25/35 recipes with or without QJL, any head dim whose state
// fits 16 values per lane (64, 96, 128, 256), any GQA group. The format is
// read at run time from the launch's host descriptors; only the q heads per
// block (GC) and the value-state channels per lane (CPL) are compile-time.
//
// Block = (query, kv head, chunk of GC q heads) × split, 4 warps; a warp
// takes 32-token tiles. Each lane stages its token's K and V rows in shared
// memory. Keys: the lane scores its own row, walking the index bitstream of
// each group through a 64-bit buffer (one shared load per 32 bits) with a
// centroid gather per channel. Values: lane l owns state channels
// l·CPL .. l·CPL + CPL − 1 and precomputes where their bits sit in a row
// and which table and norm they use; where each lane's channels are
// consecutive indices of one part (every mse format) a token costs it one
// bit window, else a funnel shift per channel (mse indices and QJL signs
// alike); then a gather and GC FMAs per channel.
// The block writes one split record in the generic kernel's format
// (attention.cuh), whose merge applies Πᵀ (and Sᵀ) once. Packed tokens
// only: a launch with tails attends them in a split of its own
// (AttnDims::tail_split) through GenericAttentionKernel.
#ifndef TQKV_GPU_KERNELS_ATTENTION_FORMATS_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_FORMATS_CUH_

#include "gpu/kernels/attention.cuh"

namespace tqkv::gpu {

// Entries of one group's value table: 2^bits centroids, then the QJL signs
// {−1, +1} at kFmtSignEntry.
inline constexpr int kFmtTableStride = 258;
inline constexpr int kFmtSignEntry = 256;
// Value coefficients per token: ‖v_g‖ of both groups, ‖v_g‖·γ_g·qjl_scale
// of both groups, and a zero for lanes past the state.
inline constexpr int kFmtCoefs = 5;

// Shared-memory layout of FormatDecodeKernel (floats / words), from the
// launch's host descriptors.
struct FormatSmem {
  int ks = 0, vs = 0;          // staged row strides in words (odd: lanes hit distinct banks)
  int qs = 0;                  // [sk][GC] prepared queries
  int ktab = 0, vtab = 0;      // [2][256] K centroids; [2][kFmtTableStride] + a zero
  int pw = 0;                  // [warps][32][GC] softmax weights of a tile
  int coef = 0;                // [warps][32][kFmtCoefs]
  int addr = 0;                // [warps][2][32] row addresses of a tile (8 bytes each)
  int stage = 0;               // [warps][32][ks + vs] staged rows, later the warps' merge
  int total = 0;

  __host__ __device__ static FormatSmem Of(const GpuComponent& k, const GpuComponent& v, int sk, int sv, int gc) {
    FormatSmem s;
    auto up4 = [](int x) { return (x + 3) / 4 * 4; };  // 16-byte aligned arrays (vector loads)
    s.ks = (k.row_bytes + 3) / 4 | 1;
    s.vs = ((v.row_bytes + 3) / 4 + 2) | 1;  // two spare words: a lane's window reads up to w + 2
    s.qs = 0;
    s.ktab = up4(s.qs + sk * gc);
    s.vtab = up4(s.ktab + 2 * 256);
    s.pw = up4(s.vtab + 2 * kFmtTableStride + 1);
    s.coef = up4(s.pw + kAttnWarps * 32 * gc);
    s.addr = up4(s.coef + kAttnWarps * 32 * kFmtCoefs);
    s.stage = s.addr + kAttnWarps * 64 * 2;
    const int staged = kAttnWarps * 32 * (s.ks + s.vs);
    const int merge = kAttnWarps * gc * (2 + sv);
    s.total = s.stage + (staged > merge ? staged : merge);
    return s;
  }
};

// x[0..GC) = w[0..GC), w 16-byte aligned for GC >= 4 (one vector load per
// 4 heads).
template <int GC>
__device__ __forceinline__ void LoadHeads(const float* w, float (&x)[GC]) {
  if constexpr (GC % 4 == 0) {
#pragma unroll
    for (int h = 0; h < GC; h += 4) {
      const float4 v = *reinterpret_cast<const float4*>(w + h);
      x[h] = v.x;
      x[h + 1] = v.y;
      x[h + 2] = v.z;
      x[h + 3] = v.w;
    }
  } else if constexpr (GC == 2) {
    const float2 v = *reinterpret_cast<const float2*>(w);
    x[0] = v.x;
    x[1] = v.y;
  } else {
    x[0] = w[0];
  }
}

// x[0..GC) += w[0..GC) · c (LoadHeads' alignment).
template <int GC>
__device__ __forceinline__ void FmaHeads(const float* w, float c, float (&x)[GC]) {
  float v[GC];
  LoadHeads<GC>(w, v);
#pragma unroll
  for (int h = 0; h < GC; ++h) x[h] = fmaf(v[h], c, x[h]);
}

// Copies a packed row at any byte address into 4-byte words of shared
// memory starting at its first byte (aligned loads, funnel shifts).
__device__ __forceinline__ void StageRow(const uint8_t* p, int row_bytes, uint32_t* dst) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uint32_t* src = reinterpret_cast<const uint32_t*>(at & ~uintptr_t{3});
  const int lead = static_cast<int>(at & 3);
  const int words = (row_bytes + 3) / 4, loads = (lead + row_bytes + 3) / 4;
  uint32_t prev = __ldg(src);
#pragma unroll 4
  for (int w = 0; w < words; ++w) {
    const uint32_t next = w + 1 < loads ? __ldg(src + w + 1) : 0u;
    dst[w] = __funnelshift_r(prev, next, 8 * lead);
    prev = next;
  }
}

// The warp copies `n` words of a tile's rows (row r at addr[r], `words`
// words each) into dst[r · stride + w], consecutive lanes on consecutive
// words, eight loads in flight per lane. r = ⌊f / words⌋ through the
// reciprocal `magic` (exact for f < 2^16).
__device__ __forceinline__ void StageTile(const uintptr_t* addr, int n, int words, uint32_t magic, int stride,
                                          int lane, uint32_t* dst) {
  constexpr int kInFlight = 8;
  for (int f0 = lane; f0 < n; f0 += 32 * kInFlight) {
    uint32_t v[kInFlight];
    int at[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int f = f0 + 32 * u;
      const int r = f < n ? __umulhi(f, magic) : 0, w = f - r * words;
      at[u] = r * stride + w;
      v[u] = f < n ? __ldg(reinterpret_cast<const uint32_t*>(addr[r]) + w) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      if (f0 + 32 * u < n) dst[at[u]] = v[u];
  }
}

template <int GC, int CPL>
__global__ void __launch_bounds__(32 * kAttnWarps) FormatDecodeKernel(AttentionLaunch a, AttnDims d,
                                                                   const float* states, float* records) {
  extern __shared__ __align__(16) float fsm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const BlockHeads heads = HeadsOfBlock(a, d, GC);
  const int64_t qi = heads.qi;
  const int kvh = heads.kvh, h0 = heads.h0, gc = heads.count;
  const int split = blockIdx.y;
  const GpuComponent& hk = a.host_k;  // layouts: the same for every kv head
  const GpuComponent& hv = a.host_v;
  const FormatSmem L = FormatSmem::Of(hk, hv, d.sk, d.sv, GC);
  float* qs = fsm + L.qs;
  float* ktab = fsm + L.ktab;
  float* vtab = fsm + L.vtab;
  float* pw = fsm + L.pw + warp * 32 * GC;
  float* coef = fsm + L.coef + warp * 32 * kFmtCoefs;
  uint32_t* kst = reinterpret_cast<uint32_t*>(fsm + L.stage) + warp * 32 * (L.ks + L.vs);
  uint32_t* vst = kst + 32 * L.ks;

  const float scale_log2 = a.scale * kLog2e;
  for (int i = threadIdx.x; i < d.sk * GC; i += blockDim.x) {
    const int e = i / GC, g = i % GC;
    qs[i] = g < gc ? states[(qi * a.q_heads + h0 + g) * d.sk + e] * scale_log2 : 0.0f;
  }
  const GpuComponent& kc = a.k_comp[kvh];  // codebooks: per kv head
  const GpuComponent& vc = a.v_comp[kvh];
  for (int gi = 0; gi < hk.num_groups; ++gi)
    for (int i = threadIdx.x; i < (1 << hk.groups[gi].mse_bits); i += blockDim.x)
      ktab[gi * 256 + i] = kc.groups[gi].centroids[i];
  for (int gi = 0; gi < hv.num_groups; ++gi) {
    for (int i = threadIdx.x; i < (1 << hv.groups[gi].mse_bits); i += blockDim.x)
      vtab[gi * kFmtTableStride + i] = vc.groups[gi].centroids[i];
    if (threadIdx.x < 2) vtab[gi * kFmtTableStride + kFmtSignEntry + threadIdx.x] = threadIdx.x ? 1.0f : -1.0f;
  }
  if (threadIdx.x == 0) vtab[2 * kFmtTableStride] = 0.0f;

  // Where each of this lane's value-state channels (lane·CPL + i) finds
  // its bits: bit position in the row, mask, table entry, coefficient slot.
  int vbit[CPL], vtab_at[CPL], vslot[CPL];
  uint32_t vmask[CPL];
  int vwidth = 0;  // bits per channel of the lane's first channel's part
#pragma unroll
  for (int i = 0; i < CPL; ++i) {
    const int ch = lane * CPL + i;
    vbit[i] = 0;
    vmask[i] = 0;
    vtab_at[i] = 2 * kFmtTableStride;
    vslot[i] = 4;
    for (int gi = 0; gi < hv.num_groups; ++gi) {
      const GpuGroup& g = hv.groups[gi];
      const int j = ch - g.state_offset;
      if (j >= 0 && j < g.channels) {
        vbit[i] = g.index_offset * 8 + j * g.mse_bits;
        vmask[i] = (1u << g.mse_bits) - 1u;
        vtab_at[i] = gi * kFmtTableStride;
        vslot[i] = gi;
        if (i == 0) vwidth = g.mse_bits;
      } else if (g.qjl && j >= g.channels && j < 2 * g.channels) {
        vbit[i] = g.sign_offset * 8 + (j - g.channels);
        vmask[i] = 1u;
        vtab_at[i] = gi * kFmtTableStride + kFmtSignEntry;
        vslot[i] = 2 + gi;
        if (i == 0) vwidth = 1;
      }
    }
  }
  // Window mode: every lane's channels are consecutive indices of one part
  // (channels past the state are never written), so a token costs a lane
  // one window of <= 32 (CPL <= 4) or 64 bits instead of a read per channel.
  bool own = CPL * vwidth <= (CPL > 4 ? 64 : 32);
#pragma unroll
  for (int i = 1; i < CPL; ++i) {
    if (lane * CPL + i < d.sv)
      own = own && vbit[i] == vbit[0] + i * vwidth && vmask[i] == vmask[0] && vtab_at[i] == vtab_at[0] &&
            vslot[i] == vslot[0];
  }
  const bool window = __all_sync(kFullMask, own);
  __syncthreads();

  const int seq = SeqOf(a, qi);
  const int64_t limit = min(a.positions[qi] + 1, a.packed_tokens[seq]);
  const int64_t t0 = split * d.chunk;
  const int64_t t1 = min(limit, t0 + d.chunk);

  float m[GC], l[GC], acc[GC][CPL];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    m[g] = -CUDART_INF_F;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < CPL; ++i) acc[g][i] = 0.0f;
  }

  // Rows of whole, aligned 4-byte words are loaded by the warp together
  // (StageTile); others by their own lane (StageRow).
  auto aligned = [&](const uint8_t* p, int rb) {
    return (reinterpret_cast<uintptr_t>(p) & 3) == 0 && rb % 4 == 0;
  };
  const bool words_aligned =
      aligned(a.k_base, hk.row_bytes) && aligned(a.v_base, hv.row_bytes) && a.block_stride % 4 == 0;
  const int kwords = hk.row_bytes / 4, vwords = hv.row_bytes / 4;
  const uint32_t kmagic = kwords > 0 ? (0xffffffffu / kwords) + 1 : 0;
  const uint32_t vmagic = vwords > 0 ? (0xffffffffu / vwords) + 1 : 0;
  uintptr_t* raddr = reinterpret_cast<uintptr_t*>(fsm + L.addr) + warp * 64;

  for (int64_t base = t0 + warp * 32; base < t1; base += 32 * kAttnWarps) {
    const int64_t t = base + lane;
    const bool valid = t < t1;
    uint32_t* kr = kst + lane * L.ks;
    uint32_t* vr = vst + lane * L.vs;
    const int nt = static_cast<int>(t1 - base < 32 ? t1 - base : 32);
    const uint8_t* krow = nullptr;
    const uint8_t* vrow = nullptr;
    if (valid) {
      krow = PackedRow(a, a.k_base, seq, t, kvh, hk.row_bytes);
      vrow = PackedRow(a, a.v_base, seq, t, kvh, hv.row_bytes);
    }
    if (words_aligned) {  // warp-uniform: the warp loads rows word by word, consecutive lanes on consecutive words
      raddr[lane] = reinterpret_cast<uintptr_t>(krow);
      raddr[32 + lane] = reinterpret_cast<uintptr_t>(vrow);
      __syncwarp();
      StageTile(raddr, nt * kwords, kwords, kmagic, L.ks, lane, kst);
      StageTile(raddr + 32, nt * vwords, vwords, vmagic, L.vs, lane, vst);
      __syncwarp();
    } else if (valid) {
      StageRow(krow, hk.row_bytes, kr);
      StageRow(vrow, hv.row_bytes, vr);
    }
    float s[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) s[g] = valid ? 0.0f : -CUDART_INF_F;
    if (valid) {
      const uint8_t* kb = reinterpret_cast<const uint8_t*>(kr);
      for (int gi = 0; gi < hk.num_groups; ++gi) {
        const GpuGroup& g = hk.groups[gi];
        const int bits = g.mse_bits;
        const uint32_t mask = (1u << bits) - 1u;
        const float* tab = ktab + gi * 256;
        const float* qrow = qs + g.state_offset * GC;
        float dot[GC], sgn[GC];
#pragma unroll
        for (int h = 0; h < GC; ++h) dot[h] = sgn[h] = 0.0f;
        int bit = g.index_offset * 8;
        int wi = bit >> 5;
        uint64_t buf = kr[wi++] >> (bit & 31);
        int have = 32 - (bit & 31);
#pragma unroll 4
        for (int j = 0; j < g.channels; ++j) {
          if (have < bits) {  // warp-uniform
            buf |= static_cast<uint64_t>(kr[wi++]) << have;
            have += 32;
          }
          const float c = tab[static_cast<uint32_t>(buf) & mask];
          buf >>= bits;
          have -= bits;
          FmaHeads<GC>(qrow + j * GC, c, dot);
        }
        const float norm = LoadGroupNorm(g, kb);
        float gq = 0.0f;
        if (g.qjl) {
          const float* srow = qrow + g.channels * GC;
          for (int j = 0; j < g.channels; ++j) {
            const float c = (kb[g.sign_offset + (j >> 3)] >> (j & 7)) & 1 ? 1.0f : -1.0f;
            FmaHeads<GC>(srow + j * GC, c, sgn);
          }
          gq = LoadGroupResidual(g, kb) * g.qjl_scale;
        }
#pragma unroll
        for (int h = 0; h < GC; ++h) s[h] = fmaf(norm, fmaf(gq, sgn[h], dot[h]), s[h]);
      }
      const uint8_t* vb = reinterpret_cast<const uint8_t*>(vr);
      float* cf = coef + lane * kFmtCoefs;
      cf[0] = cf[1] = cf[2] = cf[3] = cf[4] = 0.0f;
      for (int gi = 0; gi < hv.num_groups; ++gi) {
        const GpuGroup& g = hv.groups[gi];
        const float norm = LoadGroupNorm(g, vb);
        cf[gi] = norm;
        if (g.qjl) cf[2 + gi] = norm * LoadGroupResidual(g, vb) * g.qjl_scale;
      }
    }
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      const float tm = WarpMax(s[g]);
      if (tm > m[g]) {  // warp-uniform
        const float corr = exp2f(m[g] - tm);
        l[g] *= corr;
#pragma unroll
        for (int i = 0; i < CPL; ++i) acc[g][i] *= corr;
        m[g] = tm;
      }
      const float p = valid ? exp2f(s[g] - m[g]) : 0.0f;
      l[g] += p;
      pw[lane * GC + g] = p;
    }
    __syncwarp();
    for (int tt = 0; tt < nt; ++tt) {
      const uint32_t* row = vst + tt * L.vs;
      const float* cf = coef + tt * kFmtCoefs;
      float p[GC];
      LoadHeads<GC>(pw + tt * GC, p);
      if (window) {  // warp-uniform
        const int w = vbit[0] >> 5, sh = vbit[0] & 31;
        uint64_t win = __funnelshift_r(row[w], row[w + 1], sh);
        if constexpr (CPL > 4) win |= static_cast<uint64_t>(__funnelshift_r(row[w + 1], row[w + 2], sh)) << 32;
        const float c = cf[vslot[0]];
#pragma unroll
        for (int i = 0; i < CPL; ++i) {
          const float x = vtab[vtab_at[0] + (static_cast<uint32_t>(win >> (i * vwidth)) & vmask[0])] * c;
#pragma unroll
          for (int g = 0; g < GC; ++g) acc[g][i] = fmaf(p[g], x, acc[g][i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < CPL; ++i) {
          const int w = vbit[i] >> 5;
          const uint32_t idx = __funnelshift_r(row[w], row[w + 1], vbit[i] & 31) & vmask[i];
          const float x = vtab[vtab_at[i] + idx] * cf[vslot[i]];
#pragma unroll
          for (int g = 0; g < GC; ++g) acc[g][i] = fmaf(p[g], x, acc[g][i]);
        }
      }
    }
    __syncwarp();
  }

  // Merge the warps into the block's record: {m, l, acc_rot[sv], 0[dim]}.
  __syncthreads();  // the staging area becomes the warps' accumulators
  float* mw = fsm + L.stage;  // [warps][GC][2 + sv]
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    float* w = mw + (warp * GC + g) * (2 + d.sv);
    const float lw = WarpSum(l[g]);
    if (lane == 0) {
      w[0] = m[g];
      w[1] = lw;
    }
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
      const int ch = lane * CPL + i;
      if (ch < d.sv) w[2 + ch] = acc[g][i];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < gc * d.record; i += blockDim.x) {
    const int g = i / d.record, e = i % d.record;
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, mw[(w * GC + g) * (2 + d.sv)]);
    float v = 0.0f;
    if (e == 0) {
      v = mx;
    } else if (e < 2 + d.sv) {
#pragma unroll
      for (int w = 0; w < kAttnWarps; ++w) {
        const float* r = mw + (w * GC + g) * (2 + d.sv);
        const float f = r[0] == -CUDART_INF_F ? 0.0f : exp2f(r[0] - mx);
        v = fmaf(f, r[e], v);
      }
    }
    records[((qi * a.q_heads + h0 + g) * d.splits + split) * d.record + e] = v;
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_FORMATS_CUH_
