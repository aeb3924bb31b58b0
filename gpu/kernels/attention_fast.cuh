// Specialised CUDA-core decode attention for TurboQuant_mse K/V at d = 128
// with K and V bits in {2, 4} and G = q_heads / kv_heads in {1, 2, 4, 8}:
// the TQ4 and K4/V2 paths where the tensor-core kernel (attention_mma.cuh)
// does not apply (kv_heads % 4 != 0, unaligned pages, pages not a multiple
// of 16 tokens).
//
// Block = (query, kv head) × split, 4 warps; a warp takes 32-token
// sub-tiles. Keys: one lane per token scores its packed row against the G
// rotated queries (centroid gathers from a shared-memory table, queries
// broadcast from shared memory); each lane also stages its token's V row in
// shared memory. Values: one lane per 4 rotated channels accumulates
// p·‖v‖·c[idx] for the sub-tile's 32 tokens. Online softmax per warp; the
// block merges its warps into one split record (same format as the generic
// kernel); MergeKernel applies Πᵀ once.
#ifndef TQKV_GPU_KERNELS_ATTENTION_FAST_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_FAST_CUH_

#include "gpu/kernels/attention.cuh"

namespace tqkv::gpu {

template <int KB, int VB, int G>
__global__ void __launch_bounds__(32 * kAttnWarps) FastDecodeKernel(AttentionLaunch a, AttnDims d,
                                                                 const float* states, float* records) {
  constexpr int D = 128;
  constexpr int KWORDS = D * KB / 32;      // index words of a K row
  constexpr int VROW_WORDS = D * VB / 32 + 1;  // V row incl. norm
  constexpr int KPER = 32 / KB;            // channels per K word
  __shared__ float qs[D * G];              // [channel][head], × scale·log2e
  __shared__ float ck[1 << KB], cv[1 << VB];
  __shared__ float pn[kAttnWarps][32][G];
  __shared__ uint32_t vtile[kAttnWarps][32][VROW_WORDS];
  __shared__ float merge_acc[kAttnWarps][G][D];
  __shared__ float merge_ml[kAttnWarps][G][2];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t qi = blockIdx.x / a.kv_heads;
  const int kvh = static_cast<int>(blockIdx.x % a.kv_heads);
  const int split = blockIdx.y;
  const float scale_log2 = a.scale * kLog2e;
  for (int i = threadIdx.x; i < D * G; i += blockDim.x) {
    const int j = i / G, g = i % G;
    qs[i] = states[(qi * a.q_heads + kvh * G + g) * d.sk + j] * scale_log2;
  }
  const GpuComponent& kc = a.k_comp[kvh];
  const GpuComponent& vc = a.v_comp[kvh];
  if (threadIdx.x < (1 << KB)) ck[threadIdx.x] = kc.groups[0].centroids[threadIdx.x];
  if (threadIdx.x < (1 << VB)) cv[threadIdx.x] = vc.groups[0].centroids[threadIdx.x];
  __syncthreads();

  const int seq = SeqOf(a, qi);
  const int64_t limit = min(a.positions[qi] + 1, a.packed_tokens[seq]);
  const int64_t t0 = split * d.chunk;
  const int64_t t1 = min(limit, t0 + d.chunk);
  const int krb = kc.row_bytes, vrb = vc.row_bytes;
  const int32_t* btab = BlockTable(a, seq);

  float m[G], l[G], acc[G][4];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -CUDART_INF_F;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[g][e] = 0.0f;
  }

  for (int64_t base = t0 + warp * 32; base < t1; base += 32 * kAttnWarps) {
    const int64_t t = base + lane;
    const bool valid = t < t1;
    float s[G];
    float nv = 0.0f;
    if (valid) {
      // One lane per token: its K row straight into registers, its V row
      // into the warp's shared tile. (Staging all 32 rows cooperatively,
      // two rows per load instruction, measured 1.3-1.6x slower on H200.)
      const int32_t page = btab[t / a.block_size];
      const int64_t row = (t % a.block_size) * a.kv_heads + kvh;
      const uint32_t* kw = reinterpret_cast<const uint32_t*>(a.k_base + page * a.block_stride + row * krb);
      const uint32_t* vw = reinterpret_cast<const uint32_t*>(a.v_base + page * a.block_stride + row * vrb);
      uint32_t kbits[KWORDS];
#pragma unroll
      for (int w = 0; w < KWORDS; ++w) kbits[w] = __ldg(kw + w);
      const float nk = __uint_as_float(__ldg(kw + KWORDS));
#pragma unroll
      for (int w = 0; w < VROW_WORDS; ++w) vtile[warp][lane][w] = __ldg(vw + w);
      nv = __uint_as_float(vtile[warp][lane][VROW_WORDS - 1]);
      float dot[G];
#pragma unroll
      for (int g = 0; g < G; ++g) dot[g] = 0.0f;
#pragma unroll
      for (int w = 0; w < KWORDS; ++w) {
#pragma unroll
        for (int e = 0; e < KPER; ++e) {
          const float c = ck[(kbits[w] >> (e * KB)) & ((1u << KB) - 1u)];
          const float* qv = &qs[(w * KPER + e) * G];
          if constexpr (G == 4) {
            const float4 q4 = *reinterpret_cast<const float4*>(qv);
            dot[0] = fmaf(q4.x, c, dot[0]);
            dot[1] = fmaf(q4.y, c, dot[1]);
            dot[2] = fmaf(q4.z, c, dot[2]);
            dot[3] = fmaf(q4.w, c, dot[3]);
          } else {
#pragma unroll
            for (int g = 0; g < G; ++g) dot[g] = fmaf(qv[g], c, dot[g]);
          }
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = dot[g] * nk;
    } else {
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = -CUDART_INF_F;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float tm = WarpMax(s[g]);
      if (tm > m[g]) {  // warp-uniform
        const float corr = exp2f(m[g] - tm);
        l[g] *= corr;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[g][e] *= corr;
        m[g] = tm;
      }
      const float p = valid ? exp2f(s[g] - m[g]) : 0.0f;
      l[g] += p;
      pn[warp][lane][g] = p * nv;
    }
    __syncwarp();
    const int nt = static_cast<int>(t1 - base < 32 ? t1 - base : 32);
#pragma unroll 4
    for (int tt = 0; tt < nt; ++tt) {
      uint32_t bits;
      if constexpr (VB == 4) {
        bits = (vtile[warp][tt][lane >> 1] >> ((lane & 1) * 16)) & 0xffffu;
      } else {
        bits = (vtile[warp][tt][lane >> 2] >> ((lane & 3) * 8)) & 0xffu;
      }
      float c[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) c[e] = cv[(bits >> (e * VB)) & ((1u << VB) - 1u)];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float w = pn[warp][tt][g];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[g][e] = fmaf(w, c[e], acc[g][e]);
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float lw = WarpSum(l[g]);
#pragma unroll
    for (int e = 0; e < 4; ++e) merge_acc[warp][g][4 * lane + e] = acc[g][e];
    if (lane == 0) {
      merge_ml[warp][g][0] = m[g];
      merge_ml[warp][g][1] = lw;
    }
  }
  __syncthreads();
  const int j = threadIdx.x;  // one channel per thread (128 threads)
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, merge_ml[w][g][0]);
    float v = 0.0f, lsum = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) {
      const float mw = merge_ml[w][g][0];
      const float f = mw == -CUDART_INF_F ? 0.0f : exp2f(mw - mx);
      v = fmaf(f, merge_acc[w][g][j], v);
      lsum = fmaf(f, merge_ml[w][g][1], lsum);
    }
    float* rec = records + ((qi * a.q_heads + kvh * G + g) * d.splits + split) * d.record;
    rec[2 + j] = v;
    if (j == 0) {
      rec[0] = mx;
      rec[1] = lsum;
    }
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_FAST_CUH_
