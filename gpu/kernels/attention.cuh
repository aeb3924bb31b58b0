// Paged attention over packed K/V: query preparation (rotate once, QJL
// sketch), a generic split-K kernel for every format (packed rows, fp16
// layers, dense tail, recipes, QJL), and the log-sum-exp merge that applies
// Πᵀ once per (query, head).
//
// Workspace: [nq, q_heads, Sk] prepared query states, then per (query,
// head, split) a record {m (log2 domain), l, acc_rot[Sv], acc_dense[d]}.
#ifndef TQKV_GPU_KERNELS_ATTENTION_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_CUH_

#include "gpu/kernels/attention_base.cuh"

namespace tqkv::gpu {

// One warp per (query, q head): state = PrepareQuery(q).
template <int VPL>
__global__ void __launch_bounds__(32 * kAttnWarps) PrepareQueryKernel(AttentionLaunch a, AttnDims d, float* states) {
  __shared__ float sbuf[kAttnWarps][VPL * 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kAttnWarps + warp;
  if (w >= a.num_queries * a.q_heads) return;
  const int h = static_cast<int>(w % a.q_heads);
  const int kvh = h / d.group;
  const GpuComponent& c = a.k_comp[kvh];
  const float* q = a.q + w * a.dim;
  float* st = states + w * d.sk;
  if (c.kind == kGpuDense) {
    for (int j = lane; j < a.dim; j += 32) st[j] = q[j];
    return;
  }
  float* buf = sbuf[warp];
  for (int gi = 0; gi < c.num_groups; ++gi) {
    const GpuGroup& g = c.groups[gi];
    const int n = g.channels;
    float x[VPL];
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int j = lane + 32 * i;
      x[i] = j < n ? q[g.channel_map ? g.channel_map[j] : j] : 0.0f;
    }
    RotateStrided<VPL>(g, x, lane, buf, true);
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int j = lane + 32 * i;
      if (j < n) st[g.state_offset + j] = x[i];
    }
    if (g.qjl) {
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int j = lane + 32 * i;
        if (j < n) buf[j] = x[i];
      }
      __syncwarp();
      for (int r = lane; r < n; r += 32) {
        const float* srow = g.qjl_matrix + static_cast<int64_t>(r) * n;
        float acc = 0.0f;
        for (int j = 0; j < n; ++j) acc = fmaf(__ldg(srow + j), buf[j], acc);
        st[g.state_offset + n + r] = acc;
      }
      __syncwarp();
    }
  }
}

// Generic split-K attention. Block: (query, kv head, chunk of <= 8 q heads)
// × split. Each warp walks tokens t0 + warp, t0 + warp + 4, ... with an
// online softmax; accumulators live in shared memory (per warp); the block
// merges its warps into one record.
__global__ void __launch_bounds__(32 * kAttnWarps) GenericAttentionKernel(AttentionLaunch a, AttnDims d,
                                                                       const float* states, float* records) {
  extern __shared__ float sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const BlockHeads heads = HeadsOfBlock(a, d, kMaxHeadsPerBlock);
  const int64_t qi = heads.qi;
  const int kvh = heads.kvh, h0 = heads.h0, gc = heads.count;
  const int split = d.tail_split >= 0 ? d.tail_split : static_cast<int>(blockIdx.y);
  const int dim = a.dim, sk = d.sk, sv = d.sv, accw = sv + dim;
  float* st = sm;                                   // [8][sk]
  float* rq = st + kMaxHeadsPerBlock * sk;          // [8][dim]
  float* acc_all = rq + kMaxHeadsPerBlock * dim;    // [warps][8][accw]
  float* ml = acc_all + kAttnWarps * kMaxHeadsPerBlock * accw;  // [warps][8][2]
  float* acc = acc_all + warp * kMaxHeadsPerBlock * accw;
  for (int i = threadIdx.x; i < gc * sk; i += blockDim.x)
    st[i] = states[((qi * a.q_heads) + h0 + i / sk) * sk + i % sk];
  for (int i = threadIdx.x; i < gc * dim; i += blockDim.x)
    rq[i] = a.q[((qi * a.q_heads) + h0 + i / dim) * dim + i % dim];
  for (int i = lane; i < kMaxHeadsPerBlock * accw; i += 32) acc[i] = 0.0f;
  __syncthreads();

  const int seq = SeqOf(a, qi);
  const int64_t n_ctx = a.positions[qi] + 1;
  const int64_t packed = a.packed_tokens[seq];
  const int64_t t0 = d.tail_split >= 0 ? packed : split * d.chunk;
  const int64_t t1 = d.tail_split >= 0 ? n_ctx : min(n_ctx, t0 + d.chunk);
  const GpuComponent& kc = a.k_comp[kvh];
  const GpuComponent& vc = a.v_comp[kvh];
  const float scale_log2 = a.scale * kLog2e;
  const int64_t tail_base = a.tail_offset ? a.tail_offset[seq] : 0;

  float m[kMaxHeadsPerBlock], l[kMaxHeadsPerBlock];
#pragma unroll
  for (int g = 0; g < kMaxHeadsPerBlock; ++g) { m[g] = -CUDART_INF_F; l[g] = 0.0f; }

  for (int64_t t = t0 + warp; t < t1; t += kAttnWarps) {
    float part[kMaxHeadsPerBlock];
#pragma unroll
    for (int g = 0; g < kMaxHeadsPerBlock; ++g) part[g] = 0.0f;
    const bool is_packed = t < packed;
    const uint8_t* krow = nullptr;
    const uint8_t* vrow = nullptr;
    int64_t tail_row = 0;
    if (is_packed) {
      krow = PackedRow(a, a.k_base, seq, t, kvh, kc.row_bytes);
      vrow = PackedRow(a, a.v_base, seq, t, kvh, vc.row_bytes);
      if (kc.kind == kGpuDense) {
        for (int j = lane; j < dim; j += 32) {
          const float x = LoadF16Bytes(krow + 2 * j);
#pragma unroll
          for (int g = 0; g < kMaxHeadsPerBlock; ++g)
            if (g < gc) part[g] = fmaf(st[g * sk + j], x, part[g]);
        }
      } else {
        for (int gi = 0; gi < kc.num_groups; ++gi) {
          const GpuGroup& gr = kc.groups[gi];
          const int n = gr.channels, off = gr.state_offset;
          float dot[kMaxHeadsPerBlock], sk_[kMaxHeadsPerBlock];
#pragma unroll
          for (int g = 0; g < kMaxHeadsPerBlock; ++g) { dot[g] = 0.0f; sk_[g] = 0.0f; }
          for (int j = lane; j < n; j += 32) {
            const float c = __ldg(gr.centroids + UnpackIndex(krow + gr.index_offset, j, gr.mse_bits));
#pragma unroll
            for (int g = 0; g < kMaxHeadsPerBlock; ++g)
              if (g < gc) dot[g] = fmaf(st[g * sk + off + j], c, dot[g]);
            if (gr.qjl) {
              const bool sg = (krow[gr.sign_offset + (j >> 3)] >> (j & 7)) & 1;
#pragma unroll
              for (int g = 0; g < kMaxHeadsPerBlock; ++g)
                if (g < gc) sk_[g] += sg ? st[g * sk + off + n + j] : -st[g * sk + off + n + j];
            }
          }
          const float norm = LoadGroupNorm(gr, krow);
          const float gq = gr.qjl ? LoadGroupResidual(gr, krow) * gr.qjl_scale : 0.0f;
#pragma unroll
          for (int g = 0; g < kMaxHeadsPerBlock; ++g) part[g] += norm * (dot[g] + gq * sk_[g]);
        }
      }
    } else {
      tail_row = ((tail_base + (t - packed)) * a.kv_heads + kvh) * dim;
      for (int j = lane; j < dim; j += 32) {
        const float x = LoadElem(a.tail_k, tail_row + j, a.tail_dtype);
#pragma unroll
        for (int g = 0; g < kMaxHeadsPerBlock; ++g)
          if (g < gc) part[g] = fmaf(rq[g * dim + j], x, part[g]);
      }
    }
    float p[kMaxHeadsPerBlock];
    bool rescale = false;
    float corr[kMaxHeadsPerBlock];
#pragma unroll
    for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
      p[g] = 0.0f;
      corr[g] = 1.0f;
      if (g < gc) {
        const float s = WarpSum(part[g]) * scale_log2;
        if (s > m[g]) {
          corr[g] = exp2f(m[g] - s);
          l[g] *= corr[g];
          m[g] = s;
          rescale = true;
        }
        p[g] = exp2f(s - m[g]);
        l[g] += p[g];
      }
    }
    if (rescale) {  // warp-uniform
#pragma unroll
      for (int g = 0; g < kMaxHeadsPerBlock; ++g)
        if (g < gc && corr[g] != 1.0f)
          for (int i = lane; i < accw; i += 32) acc[g * accw + i] *= corr[g];
      __syncwarp();
    }
    if (is_packed) {
      if (vc.kind == kGpuDense) {
        for (int j = lane; j < dim; j += 32) {
          const float x = LoadF16Bytes(vrow + 2 * j);
#pragma unroll
          for (int g = 0; g < kMaxHeadsPerBlock; ++g)
            if (g < gc) acc[g * accw + j] = fmaf(p[g], x, acc[g * accw + j]);
        }
      } else {
        for (int gi = 0; gi < vc.num_groups; ++gi) {
          const GpuGroup& gr = vc.groups[gi];
          const int n = gr.channels, off = gr.state_offset;
          const float norm = LoadGroupNorm(gr, vrow);
          const float gq = gr.qjl ? LoadGroupResidual(gr, vrow) * gr.qjl_scale : 0.0f;
          for (int j = lane; j < n; j += 32) {
            const float c = __ldg(gr.centroids + UnpackIndex(vrow + gr.index_offset, j, gr.mse_bits));
            const bool sg = gr.qjl && ((vrow[gr.sign_offset + (j >> 3)] >> (j & 7)) & 1);
#pragma unroll
            for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
              if (g < gc) {
                const float wn = p[g] * norm;
                acc[g * accw + off + j] = fmaf(wn, c, acc[g * accw + off + j]);
                if (gr.qjl) {
                  const float ws = wn * gq;
                  acc[g * accw + off + n + j] += sg ? ws : -ws;
                }
              }
            }
          }
        }
      }
    } else {
      for (int j = lane; j < dim; j += 32) {
        const float x = LoadElem(a.tail_v, tail_row + j, a.tail_dtype);
#pragma unroll
        for (int g = 0; g < kMaxHeadsPerBlock; ++g)
          if (g < gc) acc[g * accw + sv + j] = fmaf(p[g], x, acc[g * accw + sv + j]);
      }
    }
    __syncwarp();
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
      ml[(warp * kMaxHeadsPerBlock + g) * 2] = m[g];
      ml[(warp * kMaxHeadsPerBlock + g) * 2 + 1] = l[g];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < gc * (accw + 2); i += blockDim.x) {
    const int g = i / (accw + 2), e = i % (accw + 2);
    float mx = -CUDART_INF_F;
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, ml[(w * kMaxHeadsPerBlock + g) * 2]);
    float v = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      const float mw = ml[(w * kMaxHeadsPerBlock + g) * 2];
      const float f = mw == -CUDART_INF_F ? 0.0f : exp2f(mw - mx);
      if (e == 0) v = mx;
      else if (e == 1) v += f * ml[(w * kMaxHeadsPerBlock + g) * 2 + 1];
      else v += f * acc_all[(w * kMaxHeadsPerBlock + g) * accw + (e - 2)];
    }
    records[((qi * a.q_heads + h0 + g) * d.splits + split) * d.record + e] = v;
  }
}

// One warp per (query, q head): merge the splits' records, apply Πᵀ (and
// the QJL Sᵀ) once to the rotated accumulator, add the dense-tail part.
template <int VPL>
__global__ void __launch_bounds__(32 * kAttnWarps) MergeKernel(AttentionLaunch a, AttnDims d, const float* records,
                                                            bool use_dense) {
  extern __shared__ float sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kAttnWarps + warp;
  if (w >= a.num_queries * a.q_heads) return;
  const int accw = d.sv + a.dim;
  float* buf = sm + warp * (accw + VPL * 32 + d.splits);
  float* rbuf = buf + accw;
  float* weight = rbuf + VPL * 32;  // [splits] exp2(m_s − max)
  const float* rec = records + w * d.splits * d.record;
  // The splits' maximum, weights and sum spread over the lanes, then every
  // channel sums its splits eight loads at a time (a long sequence has
  // hundreds of splits: one warp per (query, head) waits on each load
  // otherwise).
  float mx = -CUDART_INF_F;
  for (int s = lane; s < d.splits; s += 32) mx = fmaxf(mx, rec[s * d.record]);
  mx = WarpMax(mx);
  float L = 0.0f;
  for (int s = lane; s < d.splits; s += 32) {
    const float ms = rec[s * d.record];
    const float f = ms == -CUDART_INF_F ? 0.0f : exp2f(ms - mx);
    weight[s] = f;
    L = fmaf(f, rec[s * d.record + 1], L);
  }
  L = WarpSum(L);
  __syncwarp();
  for (int e = lane; e < accw; e += 32) {
    float v = 0.0f;
    if (e < d.sv || use_dense) {
#pragma unroll 8
      for (int s = 0; s < d.splits; ++s) v = fmaf(weight[s], rec[s * d.record + 2 + e], v);
    }
    buf[e] = v;
  }
  __syncwarp();
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float* out = a.out + w * a.dim;
  const int kvh = static_cast<int>(w % a.q_heads) / d.group;
  const GpuComponent& vc = a.v_comp[kvh];
  if (vc.kind == kGpuDense) {
    for (int j = lane; j < a.dim; j += 32) out[j] = (buf[j] + buf[d.sv + j]) * inv;
    return;
  }
  for (int gi = 0; gi < vc.num_groups; ++gi) {
    const GpuGroup& g = vc.groups[gi];
    const int n = g.channels, off = g.state_offset;
    float y[VPL];
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int j = lane + 32 * i;
      y[i] = j < n ? buf[off + j] : 0.0f;
    }
    if (g.qjl) {
      for (int s = 0; s < n; ++s) {
        const float as = buf[off + n + s];
        const float* srow = g.qjl_matrix + static_cast<int64_t>(s) * n;
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
          const int j = lane + 32 * i;
          if (j < n) y[i] = fmaf(as, __ldg(srow + j), y[i]);
        }
      }
    }
    RotateStrided<VPL>(g, y, lane, rbuf, false);
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int j = lane + 32 * i;
      if (j < n) {
        const int ch = g.channel_map ? g.channel_map[j] : j;
        out[ch] = (y[i] + buf[d.sv + ch]) * inv;
      }
    }
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_CUH_
