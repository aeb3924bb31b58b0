// Encode and decode kernels: one warp per (token, kv head) row of one
// component (blockIdx.y: 0 = K, 1 = V). VPL = ceil(max group channels / 32)
// values per lane. Encode reproduces RowCodec::Encode bit for bit.
#ifndef TQKV_GPU_KERNELS_CODEC_KERNELS_CUH_
#define TQKV_GPU_KERNELS_CODEC_KERNELS_CUH_

#include "gpu/kernels.h"
#include "gpu/kernels/common.cuh"

namespace tqkv::gpu {

inline constexpr int kCodecWarps = 4;

// Address of the row of (slot, head). REQUIRES: slot >= 0. Block sizes are
// powers of two in practice: a shift and a mask then replace the 64-bit
// division (a ~70-instruction subroutine per call); 32-bit division for
// other sizes while the slot fits. The branches are uniform per launch.
__device__ __forceinline__ uint8_t* RowAddress(const PageRegion& r, int64_t slot, int heads,
                                               int head, int row_bytes) {
  const uint32_t bs = static_cast<uint32_t>(r.block_size);
  int64_t block, off;
  if ((bs & (bs - 1)) == 0) {
    block = slot >> (__ffs(bs) - 1);
    off = slot & (bs - 1);
  } else if (slot <= 0xFFFFFFFFll) {
    const uint32_t s = static_cast<uint32_t>(slot);
    block = s / bs;
    off = s - static_cast<uint32_t>(block) * bs;
  } else {
    block = slot / bs;
    off = slot % bs;
  }
  return r.base + block * r.block_stride + (off * heads + head) * static_cast<int64_t>(row_bytes);
}

__global__ void CheckSlotsKernel(const int64_t* slots, int64_t n, int64_t num_slots,
                                 unsigned long long* bad) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n && slots[i] >= num_slots) atomicMin(bad, static_cast<unsigned long long>(i));
}

template <int VPL>
__device__ void EncodeGroup(const GpuGroup& g, const void* src, int dtype, int64_t src_base,
                            uint8_t* dst, int lane, float* buf, uint8_t* ibuf, float* bsm) {
  const int n = g.channels;
  // Boundaries to warp-private shared memory: the binary search then costs
  // shared-memory latency instead of dependent global loads.
  for (int k = lane; k < g.num_boundaries; k += 32) bsm[k] = __ldg(g.boundaries + k);
  __syncwarp();
  float x[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int j = lane + 32 * i;
    x[i] = 0.0f;
    if (j < n) x[i] = LoadElem(src, src_base + (g.channel_map ? __ldg(g.channel_map + j) : j), dtype);
  }
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < VPL; ++i)
    if (lane + 32 * i < n) ss = __fmaf_rn(x[i], x[i], ss);
  const float norm = __fsqrt_rn(WarpSumCanonical(ss));
  const float inv = norm > 0.0f ? __fdiv_rn(1.0f, norm) : 0.0f;
#pragma unroll
  for (int i = 0; i < VPL; ++i) x[i] = __fmul_rn(x[i], inv);
  RotateStrided<VPL>(g, x, lane, buf, /*forward=*/true);
  uint32_t idx[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int j = lane + 32 * i;
    idx[i] = 0;
    if (j < n) {
      idx[i] = NearestIndex(bsm, g.num_boundaries, x[i]);
      ibuf[j] = static_cast<uint8_t>(idx[i]);
    }
  }
  __syncwarp();
  PackBytesWarp(ibuf, n, g.mse_bits, dst + g.index_offset, lane);
  if (lane == 0) {
    if (g.fp16_norms) StoreF16Bytes(dst + g.norm_offset, norm);
    else StoreF32Bytes(dst + g.norm_offset, norm);
  }
  __syncwarp();
  if (!g.qjl) return;
  float r[VPL];
  float rs = 0.0f;
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int j = lane + 32 * i;
    r[i] = 0.0f;
    if (j < n) {
      r[i] = __fsub_rn(x[i], __ldg(g.centroids + idx[i]));
      rs = __fmaf_rn(r[i], r[i], rs);
      buf[j] = r[i];
    }
  }
  const float gamma = __fsqrt_rn(WarpSumCanonical(rs));
  if (lane == 0) {
    if (g.fp16_norms) StoreF16Bytes(dst + g.residual_offset, gamma);
    else StoreF32Bytes(dst + g.residual_offset, gamma);
  }
  __syncwarp();
  for (int i = lane; i < n; i += 32) {
    const float* srow = g.qjl_matrix + static_cast<int64_t>(i) * n;
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc = __fmaf_rn(__ldg(srow + j), buf[j], acc);
    ibuf[i] = acc >= 0.0f ? 1 : 0;
  }
  __syncwarp();
  PackBytesWarp(ibuf, n, 1, dst + g.sign_offset, lane);
  __syncwarp();
}

template <int VPL>
__global__ void __launch_bounds__(32 * kCodecWarps) EncodeKernel(EncodeLaunch a) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* buf = smem + warp * (VPL * 32 * 2 + 256);
  uint8_t* ibuf = reinterpret_cast<uint8_t*>(buf + VPL * 32);
  float* bsm = buf + VPL * 32 * 2;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCodecWarps + warp;
  if (row >= a.tokens * a.heads) return;
  if (*a.bad_slot != kNoBadSlot) return;
  const int64_t t = row / a.heads;
  const int h = static_cast<int>(row % a.heads);
  const int64_t slot = a.slots[t];
  if (slot < 0) return;
  const bool is_k = blockIdx.y == 0;
  const GpuComponent& c = (is_k ? a.k_comp : a.v_comp)[h];
  const void* src = is_k ? a.k : a.v;
  const int64_t src_base = row * a.dim;
  uint8_t* dst = RowAddress(is_k ? a.k_pages : a.v_pages, slot, a.heads, h, c.row_bytes);
  if (c.kind == kGpuDense) {
    for (int j = lane; j < a.dim; j += 32) StoreF16Bytes(dst + 2 * j, LoadElem(src, src_base + j, a.dtype));
    return;
  }
  for (int gi = 0; gi < c.num_groups; ++gi)
    EncodeGroup<VPL>(c.groups[gi], src, a.dtype, src_base, dst, lane, buf, ibuf, bsm);
}

// ŷ of one group on the strided layout (centroids + QJL correction); returns
// the group's norm.
template <int VPL>
__device__ float DecodeRotatedGroup(const GpuGroup& g, const uint8_t* row, int lane, float (&y)[VPL]) {
  const int n = g.channels;
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int j = lane + 32 * i;
    y[i] = j < n ? __ldg(g.centroids + UnpackIndex(row + g.index_offset, j, g.mse_bits)) : 0.0f;
  }
  if (g.qjl) {
    const float gamma = LoadGroupResidual(g, row) * g.qjl_scale;
    for (int s = 0; s < n; ++s) {
      const float sg = ((row[g.sign_offset + (s >> 3)] >> (s & 7)) & 1) ? gamma : -gamma;
      const float* srow = g.qjl_matrix + static_cast<int64_t>(s) * n;
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int j = lane + 32 * i;
        if (j < n) y[i] += sg * __ldg(srow + j);
      }
    }
  }
  return LoadGroupNorm(g, row);
}

template <int VPL>
__global__ void __launch_bounds__(32 * kCodecWarps) DecodeKernel(DecodeLaunch a) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* buf = smem + warp * (VPL * 32);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCodecWarps + warp;
  if (row >= a.tokens * a.heads) return;
  if (*a.bad_slot != kNoBadSlot) return;
  const int64_t t = row / a.heads;
  const int h = static_cast<int>(row % a.heads);
  const int64_t slot = a.slots[t];
  const bool is_k = blockIdx.y == 0;
  void* out = is_k ? a.k : a.v;
  const int64_t out_base = row * a.dim;
  if (slot < 0) {
    for (int j = lane; j < a.dim; j += 32) StoreElem(out, out_base + j, a.dtype, 0.0f);
    return;
  }
  const GpuComponent& c = (is_k ? a.k_comp : a.v_comp)[h];
  const uint8_t* src = RowAddress(is_k ? a.k_pages : a.v_pages, slot, a.heads, h, c.row_bytes);
  if (c.kind == kGpuDense) {
    for (int j = lane; j < a.dim; j += 32) StoreElem(out, out_base + j, a.dtype, LoadF16Bytes(src + 2 * j));
    return;
  }
  for (int gi = 0; gi < c.num_groups; ++gi) {
    const GpuGroup& g = c.groups[gi];
    float y[VPL];
    const float norm = DecodeRotatedGroup<VPL>(g, src, lane, y);
    RotateStrided<VPL>(g, y, lane, buf, /*forward=*/false);
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int j = lane + 32 * i;
      if (j < g.channels) {
        const int ch = g.channel_map ? __ldg(g.channel_map + j) : j;
        StoreElem(out, out_base + ch, a.dtype, y[i] * norm);
      }
    }
  }
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_CODEC_KERNELS_CUH_
