// The split-record merge shared by the specialised decode kernels (the
// tensor-core kernels of attention_mma.cuh and the CUDA-core fast kernel).
#ifndef TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_

#include "gpu/kernels/attention.cuh"

namespace tqkv::gpu {

// Merge of the split records of the specialised kernels (mse, one group of
// <= 128 channels, no dense part): block per (query, q head), a thread per
// channel, split weights in shared memory; then Πᵀ once.
__global__ void __launch_bounds__(128) FastMergeKernel(AttentionLaunch a, AttnDims d, const float* records) {
  extern __shared__ float fm_w[];  // [splits]
  __shared__ float red[4];
  __shared__ float accs[128];
  __shared__ float rbuf[128];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t w = blockIdx.x;
  const float* rec = records + w * d.splits * d.record;
  float mx = -CUDART_INF_F;
  for (int s = tid; s < d.splits; s += 128) mx = fmaxf(mx, rec[s * d.record]);
  mx = WarpMax(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
  __syncthreads();
  float lsum = 0.0f;
  for (int s = tid; s < d.splits; s += 128) {
    const float ms = rec[s * d.record];
    const float f = ms == -CUDART_INF_F ? 0.0f : exp2f(ms - mx);
    fm_w[s] = f;
    lsum = fmaf(f, rec[s * d.record + 1], lsum);
  }
  lsum = WarpSum(lsum);
  if (lane == 0) red[warp] = lsum;
  __syncthreads();
  const float L = (red[0] + red[1]) + (red[2] + red[3]);
  float v = 0.0f;
  if (tid < d.sv) {
    int s = 0;
    float v1 = 0.0f, v2 = 0.0f, v3 = 0.0f;
    for (; s + 4 <= d.splits; s += 4) {
      v = fmaf(fm_w[s], rec[s * d.record + 2 + tid], v);
      v1 = fmaf(fm_w[s + 1], rec[(s + 1) * d.record + 2 + tid], v1);
      v2 = fmaf(fm_w[s + 2], rec[(s + 2) * d.record + 2 + tid], v2);
      v3 = fmaf(fm_w[s + 3], rec[(s + 3) * d.record + 2 + tid], v3);
    }
    for (; s < d.splits; ++s) v = fmaf(fm_w[s], rec[s * d.record + 2 + tid], v);
    v = (v + v1) + (v2 + v3);
  }
  accs[tid] = v;
  __syncthreads();
  if (warp != 0) return;
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float* out = a.out + w * a.dim;
  const int kvh = static_cast<int>(w % a.q_heads) / d.group;
  const GpuGroup& g = a.v_comp[kvh].groups[0];
  const int n = g.channels;
  float y[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int j = lane + 32 * k;
    y[k] = j < n ? accs[g.state_offset + j] : 0.0f;
  }
  RotateStrided<4>(g, y, lane, rbuf, false);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int j = lane + 32 * k;
    if (j < n) out[g.channel_map ? g.channel_map[j] : j] = y[k] * inv;
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_
