// Specialised decode of TurboQuant_mse rows at d = 128 (one group, RHT, fp32
// norm after the indices, 2-, 3-, 4- or 8-bit indices) into fp16, bf16 or
// fp32 rows, two lanes per row as in EncodeLaneRows (encode_rows.cuh): lane
// l holds row l mod 16, half u = l / 16, channels 32m + 16u + q as x[16m +
// q]. Per row: the centroids of the indices (a per-head table in shared
// memory), times s2; the inverse FWHT (stages h = 1, 2, 4, 8 and 32, 64 in
// registers, h = 16 with the partner lane); times scale·s1 and the norm —
// the same operations in the same order as DecodeKernel's
// DecodeRotatedGroup + RotateStrided(forward = false), so the values are
// identical to it.
//
// A block is kLaneRowWarps warps of one component, a warp per head (and
// token group, LaneRowBlockHeads), 16 tokens per pass: a row's index words
// load straight from its page (a lane its 4 groups of 16B bits; the slots
// two passes ahead, the words one pass ahead), a group's 16 outputs leave
// as 16-byte stores (32 contiguous bytes of fp16 / bf16, 64 of fp32).
#ifndef TQKV_GPU_KERNELS_DECODE_ROWS_CUH_
#define TQKV_GPU_KERNELS_DECODE_ROWS_CUH_

#include "gpu/kernels/encode_rows.cuh"

namespace tqkv::gpu {

inline constexpr int kDecodeRowPasses = 8;  // per warp
__host__ __device__ constexpr int DecodeRowBlockTokens(int heads) {
  return kLaneRowTokens * kDecodeRowPasses * (kLaneRowWarps / LaneRowBlockHeads(heads));
}

// Per head of the block: the centroids, s2, and scale·s1 (the inverse
// rotation's factors, HadamardLane::Load(g, lane, false)).
template <int KB, int VB>
struct DecodeRowTables {
  static constexpr int kCent = 1 << (KB > VB ? KB : VB);
  float cent[kLaneRowWarps][kCent];
  float s2[kLaneRowWarps][128];
  float ss1[kLaneRowWarps][128];
};

// Output element stores: 16 consecutive channels from v[0..15].
template <typename T>
__device__ __forceinline__ void StoreRow16(T* p, const float (&v)[16]) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      reinterpret_cast<float4*>(p)[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  } else {
    uint32_t w[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if constexpr (std::is_same_v<T, __half>) {
        const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    reinterpret_cast<uint4*>(p)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<uint4*>(p)[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

template <int B, typename T, bool kIsK, typename Tables>
__device__ __forceinline__ void DecodeLaneRows(const DecodeLaunch& a, int h0, int64_t tok0, Tables& tb) {
  constexpr int kGroupWords = (16 * B + 31) / 32 + 1;  // words covering a group's 16B bits from its first word
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int hb = LaneRowBlockHeads(a.heads), groups = kLaneRowWarps / hb;
  const int hw = warp % hb, tg = warp / hb;
  const int h = h0 + hw;
  const GpuComponent* comps = kIsK ? a.k_comp : a.v_comp;
  const GpuComponent& c = comps[h];
  const PageRegion& pr = kIsK ? a.k_pages : a.v_pages;
  T* const out = static_cast<T*>(kIsK ? a.k : a.v);
  for (int k = tid; k < hb * (1 << B); k += blockDim.x)
    tb.cent[k >> B][k & ((1 << B) - 1)] = __ldg(comps[h0 + (k >> B)].groups[0].centroids + (k & ((1 << B) - 1)));
  for (int k = tid; k < hb * 128; k += blockDim.x) {
    const GpuGroup& g = comps[h0 + k / 128].groups[0];
    tb.s2[k / 128][k % 128] = __ldg(g.s2 + k % 128);
    tb.ss1[k / 128][k % 128] = __fmul_rn(g.block_scale[0], __ldg(g.s1 + k % 128));
  }
  __syncthreads();
  const float* const cent = tb.cent[hw];
  const float* const s2 = tb.s2[hw];
  const float* const ss1 = tb.ss1[hw];
  const int r = lane & 15, u = lane >> 4;
  // A pass's loads: the lane's index words (group m: bits [16B(2m + u),
  // + 16B), from word 16B(2m + u) / 32) and the norm at its slot. The slots
  // load two passes ahead and the words one pass ahead, so no pass waits on
  // a global load (two dependent loads per pass stalled every warp twice).
  struct Loaded {
    int64_t slot;
    uint32_t gw[4][kGroupWords];
    float norm;
  };
  auto slot_of = [&](int pass) -> int64_t {
    const int64_t t = tok0 + kLaneRowTokens * (groups * pass + tg) + r;
    return pass < kDecodeRowPasses && t < a.tokens ? __ldg(a.slots + t) : -1;
  };
  auto fetch = [&](int64_t slot, Loaded& f) {
    f.slot = slot;
    f.norm = 0.0f;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int k = 0; k < kGroupWords; ++k) f.gw[m][k] = 0u;
    if (slot < 0) return;
    const uint8_t* row = RowAddress(pr, slot, a.heads, h, c.row_bytes);
    const uint32_t* rw = reinterpret_cast<const uint32_t*>(row);
    f.norm = __ldg(reinterpret_cast<const float*>(row + 16 * B));
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int k = 0; k < kGroupWords; ++k) {
        const int wi = ((16 * B * (2 * m + u)) >> 5) + k;
        if (wi < 4 * B) f.gw[m][k] = __ldg(rw + wi);
      }
  };
  Loaded cur, nxt;
  fetch(slot_of(0), cur);
  int64_t slot1 = slot_of(1);  // the next pass's slot
#pragma unroll 1
  for (int pass = 0; pass < kDecodeRowPasses; ++pass) {
    const int64_t t0 = tok0 + kLaneRowTokens * (groups * pass + tg);
    if (t0 >= a.tokens) break;  // warp-uniform: later passes are past the end too
    const int64_t t = t0 + r;
    const bool live = t < a.tokens;  // else no store (the partner shuffles need every lane)
    fetch(slot1, nxt);
    slot1 = slot_of(pass + 2);
    const int64_t slot = cur.slot;
    const float norm = cur.norm;
    T* const orow = out + (t * a.heads + h) * 128;
    float x[64];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int off = (16 * B * (2 * m + u)) & 31;  // 0, or 16 for odd B and u = 1
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        // Field at bit off + B·q of the group's words (a 64-bit window where
        // it straddles); a skipped slot's words are zero.
        const int bit = B * q;
        const uint64_t win = (static_cast<uint64_t>(cur.gw[m][(bit >> 5) + 1]) << 32) | cur.gw[m][bit >> 5];
        const uint32_t idx = static_cast<uint32_t>(win >> ((bit & 31) + off)) & ((1u << B) - 1u);
        x[16 * m + q] = cent[idx];
      }
    }
    // × s2, FWHT (h = 1, 2, 4, 8; 16 with the partner; 32, 64), × scale·s1,
    // × norm: RotateStrided(forward = false)'s order.
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int q4 = 0; q4 < 4; ++q4) {
        const float4 s = *reinterpret_cast<const float4*>(s2 + 32 * m + 16 * u + 4 * q4);
        x[16 * m + 4 * q4] = __fmul_rn(x[16 * m + 4 * q4], s.x);
        x[16 * m + 4 * q4 + 1] = __fmul_rn(x[16 * m + 4 * q4 + 1], s.y);
        x[16 * m + 4 * q4 + 2] = __fmul_rn(x[16 * m + 4 * q4 + 2], s.z);
        x[16 * m + 4 * q4 + 3] = __fmul_rn(x[16 * m + 4 * q4 + 3], s.w);
      }
    FwhtHalfRow(x, u);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      float v[16];
#pragma unroll
      for (int q4 = 0; q4 < 4; ++q4) {
        const float4 s = *reinterpret_cast<const float4*>(ss1 + 32 * m + 16 * u + 4 * q4);
        v[4 * q4] = __fmul_rn(__fmul_rn(x[16 * m + 4 * q4], s.x), norm);
        v[4 * q4 + 1] = __fmul_rn(__fmul_rn(x[16 * m + 4 * q4 + 1], s.y), norm);
        v[4 * q4 + 2] = __fmul_rn(__fmul_rn(x[16 * m + 4 * q4 + 2], s.z), norm);
        v[4 * q4 + 3] = __fmul_rn(__fmul_rn(x[16 * m + 4 * q4 + 3], s.w), norm);
      }
      if (slot < 0) {
#pragma unroll
        for (int q = 0; q < 16; ++q) v[q] = 0.0f;  // a skipped slot: a zero row
      }
      if (live) StoreRow16(orow + 32 * m + 16 * u, v);
    }
    cur = nxt;
  }
}

// grid: (heads / LaneRowBlockHeads × token blocks of DecodeRowBlockTokens,
// 2 components); kLaneRowWarps warps.
template <int KB, int VB, typename T>
__global__ void __launch_bounds__(32 * kLaneRowWarps, kLaneRowMinBlocks) DecodeLaneRowsKernel(DecodeLaunch a) {
  __shared__ __align__(16) DecodeRowTables<KB, VB> tables;
  if (*a.bad_slot != kNoBadSlot) return;
  const int head_groups = a.heads / LaneRowBlockHeads(a.heads);
  const int h0 = static_cast<int>(blockIdx.x % head_groups) * LaneRowBlockHeads(a.heads);
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x / head_groups) * DecodeRowBlockTokens(a.heads);
  if (blockIdx.y == 0) DecodeLaneRows<KB, T, true>(a, h0, tok0, tables);
  else DecodeLaneRows<VB, T, false>(a, h0, tok0, tables);
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_DECODE_ROWS_CUH_
