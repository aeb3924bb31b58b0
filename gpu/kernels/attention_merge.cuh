// The split-record merge shared by the specialised decode kernels (the
// tensor-core kernels of attention_mma.cuh, attention_staged.cuh and
// attention_rowset.cuh, and the CUDA-core fast kernel).
#ifndef TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_

#include "gpu/kernels/attention.cuh"

namespace tqkv::gpu {

// Merge of the split records of the specialised kernels (mse, one group of
// <= 128 channels, no dense part): block per (query, q head) of W warps
// (blockDim = 32·W, W <= kMergeMaxWarps, chosen by the launcher from the
// split count), lane l of warp w summing state channels l + 32k over
// splits w, w + W, ... in a fixed order: the strided layout the inverse
// rotation takes, so only the W partial sums meet in shared memory. One
// warp per (query, head) at low split counts keeps a large batch's merge
// in one wave (a block of 128 threads per 128 channels took up to 4 waves,
// 39 µs at 64 queries × 32 heads × 4 splits on the H200); more warps
// spread a long sequence's hundreds of splits. The merge is latency-bound:
// the rotation factors load before griddepcontrol.wait (with a
// programmatic dependent launch they overlap the decode kernel's tail) and
// the record loads of 4 splits are in flight at once.
inline constexpr int kMergeMaxWarps = 16;

// Warps per merge block for a split count.
inline int MergeWarps(int splits) {
  int w = 1;
  while (w < kMergeMaxWarps && 8 * w < splits) w *= 2;  // <= 8 splits per warp, up to 16 warps
  return w;
}

__global__ void __launch_bounds__(32 * kMergeMaxWarps) FastMergeKernel(AttentionLaunch a, AttnDims d,
                                                                       const float* records) {
  extern __shared__ float fm_sm[];  // [splits] weights, then [splits] sums
  __shared__ float red[2 * kMergeMaxWarps];
  __shared__ float part[kMergeMaxWarps][128];
  __shared__ float rbuf[128];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  const int64_t w = blockIdx.x;
  const float* rec = records + w * d.splits * d.record;
  const int kvh = static_cast<int>(blockIdx.x % static_cast<unsigned>(a.q_heads)) / d.group;
  const GpuGroup& g = a.v_comp[kvh].groups[0];
  const bool hadamard = g.rotation != kGpuQr;
  HadamardLane<4> rot;
  if (warp == 0 && hadamard) rot.Load(g, lane, false);
  // Launched as a programmatic dependent of the decode kernel: everything
  // above reads only the codec tables; the records need the decode grid
  // complete and its writes visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");

  float* fm_w = fm_sm;
  float* fm_l = fm_sm + d.splits;
  float mx = -CUDART_INF_F;
  for (int s = tid; s < d.splits; s += blockDim.x) {
    const float ms = rec[s * d.record], ls = rec[s * d.record + 1];
    fm_w[s] = ms;
    fm_l[s] = ls;
    mx = fmaxf(mx, ms);
  }
  mx = WarpMax(mx);
  if (nwarps > 1) {
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int k = 1; k < nwarps; ++k) mx = fmaxf(mx, red[k]);
  }
  // Each thread rescales the splits whose (m, l) it stored.
  float lsum = 0.0f;
  for (int s = tid; s < d.splits; s += blockDim.x) {
    const float ms = fm_w[s];
    const float f = ms == -CUDART_INF_F ? 0.0f : exp2f(ms - mx);
    fm_w[s] = f;
    lsum = fmaf(f, fm_l[s], lsum);
  }
  lsum = WarpSum(lsum);
  if (lane == 0) red[kMergeMaxWarps + warp] = lsum;
  __syncthreads();  // weights and sums visible
  float L = 0.0f;
  for (int k = 0; k < nwarps; ++k) L += red[kMergeMaxWarps + k];
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int sv = d.sv;
  auto load = [&](int sp, float (&x)[4]) {
    const float* r = rec + sp * d.record + 2;
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = lane + 32 * k < sv ? r[lane + 32 * k] : 0.0f;
  };
  // Four of the warp's splits per round: their 16 loads are issued before
  // the sums (in split order) need them.
  int s = warp;
  for (; s + 3 * nwarps < d.splits; s += 4 * nwarps) {
    float x[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) load(s + u * nwarps, x[u]);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = fmaf(fm_w[s + u * nwarps], x[u][k], v[k]);
  }
  for (; s < d.splits; s += nwarps) {
    float x[4];
    load(s, x);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = fmaf(fm_w[s], x[k], v[k]);
  }
  if (nwarps > 1) {
#pragma unroll
    for (int k = 0; k < 4; ++k) part[warp][lane + 32 * k] = v[k];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      for (int ww = 1; ww < nwarps; ++ww) v[k] += part[ww][lane + 32 * k];
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float* out = a.out + w * a.dim;
  const int n = g.channels;
  float y[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int j = lane + 32 * k;  // state channel j (state_offset 0: FastMergeEligible)
    y[k] = j < n ? v[k] : 0.0f;
  }
  if (hadamard) rot.Apply(y, lane);
  else RotateStrided<4>(g, y, lane, rbuf, false);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int j = lane + 32 * k;
    if (j < n) out[g.channel_map ? g.channel_map[j] : j] = y[k] * inv;
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_
