// The split-record merge shared by the specialised decode kernels (the
// tensor-core kernels of attention_mma.cuh and the CUDA-core fast kernel).
#ifndef TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_

#include "gpu/kernels/attention.cuh"

namespace tqkv::gpu {

// Merge of the split records of the specialised kernels (mse, one group of
// <= 128 channels, no dense part): block per (query, q head), 128 threads
// per slice of the splits (blockDim = 128 · slices, slices <= 4), thread
// (slice, c) summing state channel c over splits slice, slice + slices, ...
// in a fixed order. The merge is latency-bound (a few KiB per block), so
// every load that does not depend on the split weights is issued first:
// the thread's first kMergePrefetch record values, and warp 0's rotation
// factors; then the (max, sum) pairs, the weights, the sums, Πᵀ once.
// (The rotation factors load before griddepcontrol.wait: with a
// programmatic dependent launch they overlap the decode kernel's tail.)
inline constexpr int kMergePrefetch = 8;
inline constexpr int kMergeMaxSlices = 4;

__global__ void __launch_bounds__(128 * kMergeMaxSlices) FastMergeKernel(AttentionLaunch a, AttnDims d,
                                                                         const float* records) {
  extern __shared__ float fm_sm[];  // [splits] weights, then [splits] sums
  __shared__ float red[4 * kMergeMaxSlices];
  __shared__ float part[kMergeMaxSlices][128];
  __shared__ float rbuf[128];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  const int c = tid & 127, slice = tid >> 7, slices = blockDim.x >> 7;
  const int64_t w = blockIdx.x;
  const float* rec = records + w * d.splits * d.record;
  const bool chan = c < d.sv;
  const int kvh = static_cast<int>(blockIdx.x % static_cast<unsigned>(a.q_heads)) / d.group;
  const GpuGroup& g = a.v_comp[kvh].groups[0];
  const bool hadamard = g.rotation != kGpuQr;
  HadamardLane<4> rot;
  if (warp == 0 && hadamard) rot.Load(g, lane, false);
  // Launched as a programmatic dependent of the decode kernel: everything
  // above reads only the codec tables; the records need the decode grid
  // complete and its writes visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float pre[kMergePrefetch];
#pragma unroll
  for (int k = 0; k < kMergePrefetch; ++k) {
    const int s = slice + slices * k;
    pre[k] = chan && s < d.splits ? rec[s * d.record + 2 + c] : 0.0f;
  }

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
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int k = 1; k < nwarps; ++k) mx = fmaxf(mx, red[k]);
  __syncthreads();
  float lsum = 0.0f;
  for (int s = tid; s < d.splits; s += blockDim.x) {
    const float ms = fm_w[s];
    const float f = ms == -CUDART_INF_F ? 0.0f : exp2f(ms - mx);
    fm_w[s] = f;
    lsum = fmaf(f, fm_l[s], lsum);
  }
  lsum = WarpSum(lsum);
  if (lane == 0) red[warp] = lsum;
  __syncthreads();
  float L = 0.0f;
  for (int k = 0; k < nwarps; ++k) L += red[k];
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (chan) {
#pragma unroll
    for (int k = 0; k < kMergePrefetch; ++k) {
      const int s = slice + slices * k;
      if (s < d.splits) v[k & 3] = fmaf(fm_w[s], pre[k], v[k & 3]);
    }
#pragma unroll 8
    for (int s = slice + slices * kMergePrefetch; s < d.splits; s += slices)
      v[0] = fmaf(fm_w[s], rec[s * d.record + 2 + c], v[0]);
  }
  part[slice][c] = (v[0] + v[1]) + (v[2] + v[3]);
  __syncthreads();
  if (warp != 0) return;
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float* out = a.out + w * a.dim;
  const int n = g.channels;
  float y[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int j = lane + 32 * k;
    y[k] = 0.0f;
    if (j < n)
      for (int sl = 0; sl < slices; ++sl) y[k] += part[sl][g.state_offset + j];
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
