// The split-record merge shared by the specialised decode kernels (the
// tensor-core kernels of attention_mma.cuh, attention_staged.cuh and
// attention_rowset.cuh, and the CUDA-core fast kernel).
#ifndef TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_MERGE_CUH_

#include "gpu/kernels/attention.cuh"

namespace tqkv::gpu {

// Merge of the split records of the specialised kernels (mse, one group of
// <= 128 channels, no dense part in the records; the dense tail is attended
// here, TailState): block per (query, q head) of W warps
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

// 4 consecutive tail elements (aligned to 4 elements): loaded raw (Raw4),
// widened to floats where used (Widen4), so that a pass's rows stay packed
// in registers.
template <typename T>
struct Raw4 {
  using Type = uint2;  // 4 16-bit elements
};
template <>
struct Raw4<float> {
  using Type = float4;
};
template <typename T>
__device__ __forceinline__ typename Raw4<T>::Type Load4(const T* p) {
  return *reinterpret_cast<const typename Raw4<T>::Type*>(p);
}
__device__ __forceinline__ void Widen4(const float4& r, const float*, float (&x)[4]) {
  x[0] = r.x, x[1] = r.y, x[2] = r.z, x[3] = r.w;
}
__device__ __forceinline__ void Widen4(const uint2& r, const __half*, float (&x)[4]) {
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&r.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&r.y));
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}
__device__ __forceinline__ void Widen4(const uint2& r, const __nv_bfloat16*, float (&x)[4]) {
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.y));
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}

// Online softmax of one warp over n tail tokens of element type T (rows of
// `step` elements from k / v, lane l holding channels 4l..4l+3 of its kv
// head; q4: the query's channels, pre-scaled to the log2 domain) into
// (m, l, acc). Every load of a pass is issued before any is used: one
// memory latency per kU tokens.
template <typename T>
__device__ __forceinline__ void TailSoftmax(const T* k, const T* v, int64_t step, int64_t n, const float (&q4)[4],
                                            float& m, float& l, float (&acc)[4]) {
  constexpr int kU = 8;  // rows of K and V in flight (16 spill at the kernel's 128 registers)
  using R = typename Raw4<T>::Type;
  for (int64_t t0 = 0; t0 < n; t0 += kU) {
    R kr[kU], vr[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (t0 + u < n) {
        kr[u] = Load4(k + (t0 + u) * step);
        vr[u] = Load4(v + (t0 + u) * step);
      }
    }
    float s[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      s[u] = 0.0f;
      if (t0 + u < n) {
        float x[4];
        Widen4(kr[u], k, x);
#pragma unroll
        for (int i = 0; i < 4; ++i) s[u] = fmaf(q4[i], x[i], s[u]);
      }
    }
    float mx = m;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      s[u] = WarpSum(s[u]);
      if (t0 + u < n) mx = fmaxf(mx, s[u]);
    }
    const float c = m == -CUDART_INF_F ? 0.0f : exp2f(m - mx);
    l *= c;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] *= c;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (t0 + u < n) {
        const float p = exp2f(s[u] - mx);
        float x[4];
        Widen4(vr[u], v, x);
        l += p;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = fmaf(p, x[i], acc[i]);
      }
    }
    m = mx;
  }
}

// The dense tail of (query, q head) w: tokens packed_tokens .. position of
// its sequence, attended by one warp straight from the tail rows (fp16,
// bf16 or fp32, dim 128). Returns the state (m in the records' log2
// domain, l, Σ p·v) with the sum carried into the V group's state space
// (Π v, through g's channel map) on the strided layout, so that it folds
// into the merge as one more split. A query without tail tokens returns
// m = -inf. `inverse`: the group's loaded Πᵀ when `hadamard` (else QR).
// `rbuf`: 128 floats of warp-private shared memory.
__device__ __forceinline__ void TailState(const AttentionLaunch& a, const AttnDims& d, int64_t w, int lane,
                                          const GpuGroup& g, bool hadamard, const HadamardLane<4>& inverse,
                                          float* rbuf, float& m, float& l, float (&v)[4]) {
  m = -CUDART_INF_F;
  l = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = 0.0f;
  const int64_t qi = w / a.q_heads;
  const int kvh = static_cast<int>(w % a.q_heads) / d.group;
  const int seq = SeqOf(a, qi);
  // Independent loads first: the query, the sequence's extent and the
  // channel map (the forward rotation is the inverse's factors reversed).
  const float4 qr = *reinterpret_cast<const float4*>(a.q + w * 128 + 4 * lane);
  const int64_t n = a.positions[qi] + 1 - a.packed_tokens[seq];
  const int64_t first = a.tail_offset[seq];
  int src[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int j = lane + 32 * k;
    src[k] = j < g.channels ? (g.channel_map ? g.channel_map[j] : j) : -1;
  }
  if (n <= 0) return;
  const float scale_log2 = a.scale * kLog2e;
  const float q4[4] = {qr.x * scale_log2, qr.y * scale_log2, qr.z * scale_log2, qr.w * scale_log2};
  const int64_t step = static_cast<int64_t>(a.kv_heads) * 128;  // elements per tail token
  const int64_t row0 = (first * a.kv_heads + kvh) * 128 + 4 * lane;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  switch (a.tail_dtype) {
    case kGpuF16:
      TailSoftmax(static_cast<const __half*>(a.tail_k) + row0, static_cast<const __half*>(a.tail_v) + row0, step, n,
                  q4, m, l, acc);
      break;
    case kGpuBF16:
      TailSoftmax(static_cast<const __nv_bfloat16*>(a.tail_k) + row0,
                  static_cast<const __nv_bfloat16*>(a.tail_v) + row0, step, n, q4, m, l, acc);
      break;
    default:
      TailSoftmax(static_cast<const float*>(a.tail_k) + row0, static_cast<const float*>(a.tail_v) + row0, step, n,
                  q4, m, l, acc);
      break;
  }
  // Channels 4l..4l+3 to the strided state layout (state j = channel src[j]).
#pragma unroll
  for (int i = 0; i < 4; ++i) rbuf[4 * lane + i] = acc[i];
  __syncwarp();
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = src[k] >= 0 ? rbuf[src[k]] : 0.0f;
  __syncwarp();
  if (hadamard) inverse.Reversed().Apply(v, lane);
  else RotateStrided<4>(g, v, lane, rbuf, true);
}

// kTail: the launch has dense tails (a.has_tail), attended by warp 0 before
// the wait (a separate instantiation: the tail's registers would otherwise
// cost every launch).
template <bool kTail>
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
  // Warp 0 starts from the dense tail's state (no tail: m = -inf, l = 0).
  float mw = -CUDART_INF_F, lw = 0.0f;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  HadamardLane<4> rot;
  if (warp == 0 && hadamard) rot.Load(g, lane, false);
  if constexpr (kTail) {
    if (warp == 0) TailState(a, d, w, lane, g, hadamard, rot, rbuf, mw, lw, v);
  }
  // Launched as a programmatic dependent of the decode kernel: everything
  // above reads only the codec tables, the queries and the dense tails; the
  // records need the decode grid complete and its writes visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");

  // This warp's splits, kMergeSplitsPerRound per round (their loads issued
  // together), folded into (mw, lw, v) with weights exp2(m - mw); a split
  // without tokens has m = -inf and weight 0.
  const int sv = d.sv;
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
