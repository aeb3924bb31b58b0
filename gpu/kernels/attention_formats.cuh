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
// centroid gather per channel. Values: lanes own state channels
// (lane + 32·i), each precomputing where its bits sit in a row and which
// table and norm they use, so every token costs each channel one funnel
// shift, one gather and GC FMAs, for mse indices and QJL signs alike.
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
  int stage = 0;               // [warps][32][ks + vs] staged rows, later the warps' merge
  int total = 0;

  __host__ __device__ static FormatSmem Of(const GpuComponent& k, const GpuComponent& v, int sk, int sv, int gc) {
    FormatSmem s;
    s.ks = (k.row_bytes + 3) / 4 | 1;
    s.vs = ((v.row_bytes + 3) / 4 + 1) | 1;  // one spare word: the funnel shift reads w + 1
    s.qs = 0;
    s.ktab = s.qs + sk * gc;
    s.vtab = s.ktab + 2 * 256;
    s.pw = s.vtab + 2 * kFmtTableStride + 1;
    s.coef = s.pw + kAttnWarps * 32 * gc;
    s.stage = s.coef + kAttnWarps * 32 * kFmtCoefs;
    const int staged = kAttnWarps * 32 * (s.ks + s.vs);
    const int merge = kAttnWarps * gc * (2 + sv);
    s.total = s.stage + (staged > merge ? staged : merge);
    return s;
  }
};

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

template <int GC, int CPL>
__global__ void __launch_bounds__(32 * kAttnWarps) FormatDecodeKernel(AttentionLaunch a, AttnDims d,
                                                                   const float* states, float* records) {
  extern __shared__ float fsm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t bx = blockIdx.x;
  const int64_t qi = bx / (a.kv_heads * d.head_chunks);
  const int rem = static_cast<int>(bx % (a.kv_heads * d.head_chunks));
  const int kvh = rem / d.head_chunks;
  const int h0 = kvh * d.group + (rem % d.head_chunks) * GC;
  const int gc = min(GC, kvh * d.group + d.group - h0);
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

  // Where each of this lane's value-state channels finds its bits: bit
  // position in the row, mask, table entry and coefficient slot.
  int vbit[CPL], vtab_at[CPL], vslot[CPL];
  uint32_t vmask[CPL];
#pragma unroll
  for (int i = 0; i < CPL; ++i) {
    const int ch = lane + 32 * i;
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
      } else if (g.qjl && j >= g.channels && j < 2 * g.channels) {
        vbit[i] = g.sign_offset * 8 + (j - g.channels);
        vmask[i] = 1u;
        vtab_at[i] = gi * kFmtTableStride + kFmtSignEntry;
        vslot[i] = 2 + gi;
      }
    }
  }
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

  for (int64_t base = t0 + warp * 32; base < t1; base += 32 * kAttnWarps) {
    const int64_t t = base + lane;
    const bool valid = t < t1;
    uint32_t* kr = kst + lane * L.ks;
    uint32_t* vr = vst + lane * L.vs;
    float s[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) s[g] = valid ? 0.0f : -CUDART_INF_F;
    if (valid) {
      const int32_t page = a.block_table[static_cast<int64_t>(seq) * a.max_blocks + t / a.block_size];
      const int64_t row = (t % a.block_size) * a.kv_heads + kvh;
      StageRow(a.k_base + page * a.block_stride + row * hk.row_bytes, hk.row_bytes, kr);
      StageRow(a.v_base + page * a.block_stride + row * hv.row_bytes, hv.row_bytes, vr);
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
#pragma unroll
          for (int h = 0; h < GC; ++h) dot[h] = fmaf(qrow[j * GC + h], c, dot[h]);
        }
        const float norm = LoadGroupNorm(g, kb);
        float gq = 0.0f;
        if (g.qjl) {
          const float* srow = qrow + g.channels * GC;
          for (int j = 0; j < g.channels; ++j) {
            const float c = (kb[g.sign_offset + (j >> 3)] >> (j & 7)) & 1 ? 1.0f : -1.0f;
#pragma unroll
            for (int h = 0; h < GC; ++h) sgn[h] = fmaf(srow[j * GC + h], c, sgn[h]);
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
    const int nt = static_cast<int>(t1 - base < 32 ? t1 - base : 32);
    for (int tt = 0; tt < nt; ++tt) {
      const uint32_t* row = vst + tt * L.vs;
      const float* cf = coef + tt * kFmtCoefs;
      float p[GC];
#pragma unroll
      for (int g = 0; g < GC; ++g) p[g] = pw[tt * GC + g];
#pragma unroll
      for (int i = 0; i < CPL; ++i) {
        const int w = vbit[i] >> 5;
        const uint32_t idx = __funnelshift_r(row[w], row[w + 1], vbit[i] & 31) & vmask[i];
        const float x = vtab[vtab_at[i] + idx] * cf[vslot[i]];
#pragma unroll
        for (int g = 0; g < GC; ++g) acc[g][i] = fmaf(p[g], x, acc[g][i]);
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
      const int ch = lane + 32 * i;
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
