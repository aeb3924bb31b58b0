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
// split count), warp w merging splits w, w + W, ... (lane l: state channels
// l + 32k, the strided layout the inverse rotation takes) into its own
// (m, l, sums), then the W warps' states meet in shared memory. One warp
// per (query, head) at low split counts keeps a large batch's merge in one
// wave (a block of 128 threads per 128 channels took up to 4 waves, 39 µs
// at 64 queries × 32 heads × 4 splits on the H200); more warps spread a
// long sequence's hundreds of splits. The merge is latency-bound: the
// rotation factors load before griddepcontrol.wait (with a programmatic
// dependent launch they overlap the decode kernel's tail), and a warp's
// first kMergeSplitsPerRound splits (all of them up to 144 splits: one
// query split over the H200's 132 SMs) load at once, (m, l) with their
// sums: one memory latency after the wait. (32 warps of 8 splits would
// cap the registers at 64 and spill.)
inline constexpr int kMergeMaxWarps = 16;
inline constexpr int kMergeSplitsPerRound = 9;

// Warps per merge block for a split count.
inline int MergeWarps(int splits) {
  int w = 1;
  while (w < kMergeMaxWarps && kMergeSplitsPerRound * w < splits) w *= 2;
  return w;
}

// Dynamic shared memory of a merge block of `warps` warps: the warps'
// states (none for one warp: a large batch's blocks stay small enough for
// one wave), then 128 floats for a QR rotation.
inline size_t MergeSmemBytes(int warps) { return sizeof(float) * ((warps > 1 ? warps * 130 : 0) + 128); }

__global__ void __launch_bounds__(32 * kMergeMaxWarps) FastMergeKernel(AttentionLaunch a, AttnDims d,
                                                                       const float* records) {
  extern __shared__ float fm_sm[];  // MergeSmemBytes: [nwarps][128] sums, [nwarps] m, [nwarps] l; [128]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  float* part = fm_sm;
  float* red_m = fm_sm + (nwarps > 1 ? 128 * nwarps : 0);
  float* red_l = red_m + (nwarps > 1 ? nwarps : 0);
  float* rbuf = red_l + (nwarps > 1 ? nwarps : 0);
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

  // This warp's splits, kMergeSplitsPerRound per round (their loads issued
  // together), folded into (mw, lw, v) with weights exp2(m - mw); a split
  // without tokens has m = -inf and weight 0.
  const int sv = d.sv;
  float mw = -CUDART_INF_F, lw = 0.0f;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s0 = warp; s0 < d.splits; s0 += kMergeSplitsPerRound * nwarps) {
    float m[kMergeSplitsPerRound], l[kMergeSplitsPerRound], x[kMergeSplitsPerRound][4];
#pragma unroll
    for (int u = 0; u < kMergeSplitsPerRound; ++u) {
      const int sp = s0 + u * nwarps;
      const bool valid = sp < d.splits;
      const float* r = rec + (valid ? sp : 0) * d.record;
      m[u] = valid ? r[0] : -CUDART_INF_F;
      l[u] = valid ? r[1] : 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) x[u][k] = valid && lane + 32 * k < sv ? r[2 + lane + 32 * k] : 0.0f;
    }
    float mx = mw;
#pragma unroll
    for (int u = 0; u < kMergeSplitsPerRound; ++u) mx = fmaxf(mx, m[u]);
    const float c = mw == -CUDART_INF_F ? 0.0f : exp2f(mw - mx);
    lw *= c;
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] *= c;
#pragma unroll
    for (int u = 0; u < kMergeSplitsPerRound; ++u) {
      const float f = m[u] == -CUDART_INF_F ? 0.0f : exp2f(m[u] - mx);
      lw = fmaf(f, l[u], lw);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = fmaf(f, x[u][k], v[k]);
    }
    mw = mx;
  }
  float L = lw;
  if (nwarps > 1) {
    // The warps' states: m, l and sums; warp 0 weighs each by exp2(m_w - m).
#pragma unroll
    for (int k = 0; k < 4; ++k) part[warp * 128 + lane + 32 * k] = v[k];
    if (lane == 0) {
      red_m[warp] = mw;
      red_l[warp] = lw;
    }
    __syncthreads();
    if (warp != 0) return;
    float mx = -CUDART_INF_F;
    for (int ww = 0; ww < nwarps; ++ww) mx = fmaxf(mx, red_m[ww]);
    L = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = 0.0f;
    for (int ww = 0; ww < nwarps; ++ww) {
      const float f = red_m[ww] == -CUDART_INF_F ? 0.0f : exp2f(red_m[ww] - mx);
      L = fmaf(f, red_l[ww], L);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = fmaf(f, part[ww * 128 + lane + 32 * k], v[k]);
    }
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
