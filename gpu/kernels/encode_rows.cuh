// Specialised encode with two lanes per row, for 16-bit input (fp16, bf16)
// at d = 128: the same formats, tables and arithmetic as EncodeRowsFast
// (encode_fast.cuh), bit-identical to it and to RowCodec::Encode, with one
// cross-lane exchange per row instead of the 8-lane kernel's three FWHT
// stages and its norm and packing shuffles. Lane l holds row l mod 16, half
// u = l / 16: channels 32m + 16u + q (m = 0..3, q = 0..15) as x[16m + q],
// so
//  * the canonical sum of squares (codec/canonical.h) has its accumulators
//    l = 16u + q, each chaining x_{l+32i} for i = 0..3, in the lane; the
//    butterfly's first level (off 16) adds the partner's, the rest (off 8,
//    4, 2, 1) is in registers;
//  * the FWHT's stages h = 1, 2, 4, 8, 32, 64 are register arithmetic and
//    h = 16 is one shuffle per value with the partner (fma(±1, x, other)
//    rounds exactly like the reference's a + b / a − b);
//  * quantisation and packing are per value (the uniform-cell tables of
//    gpu/quant_lut.h, or the boundaries); group m of a lane is bits
//    [16B(2m + u), 16B(2m + u) + 16B) of the row: whole 16-bit units.
// One row per lane (128 values per lane) needed ~168 registers (12 warps
// per SM) and was no faster than the 8-lane kernel (bench/RESULTS.md); two
// lanes per row halve the registers. Both are bound by instruction issue
// (~118 warp instructions per row here, Nsight Compute).
//
// Memory: a block is kLaneRowWarps warps of one component, a warp per head
// (and token group, LaneRowBlockHeads), each taking 16 consecutive tokens
// per pass. The 16 rows of a warp's pass arrive by cp.async into a per-warp
// buffer (two or three buffers: the next passes load while one computes)
// whose 16-byte chunks are swizzled by the row (chunk c of row r at
// c ^ (r & 7)), so that a quarter-warp reading one chunk of 8 rows touches
// 32 different banks. The packed rows (W = 4·B + 1 words, odd) are staged
// in that buffer once its rows are in registers and leave as consecutive
// words of whole rows (a row's W words are contiguous in its page).
#ifndef TQKV_GPU_KERNELS_ENCODE_ROWS_CUH_
#define TQKV_GPU_KERNELS_ENCODE_ROWS_CUH_

#include "gpu/kernels/encode_fast.cuh"
#include "gpu/kernels/profile_hooks.cuh"

namespace tqkv::gpu {

inline constexpr int kLaneRowWarps = 8;
inline constexpr int kLaneRowTokens = 16;  // per warp and pass: 16 rows, two lanes each
inline constexpr int kLaneRowPasses = 32;  // per warp
inline constexpr uint32_t kLaneRowBufBytes = kLaneRowTokens * 256;  // one pass: 16 rows of 128 16-bit values
// A block takes kLaneRowWarps warps of its heads' tokens: 8 heads (warp w:
// head w) where heads % 8 == 0, else all heads (1, 2 or 4; warp w: head
// w mod heads, token group w / heads), so that a pass reads whole tokens'
// rows, which are contiguous in the input (H·256 bytes each): 16 tokens
// of 8 heads are 32 KiB. (k4v4 on the H200: 1.36-1.38 ms for 8.4 M rows,
// 1.41 ms with one head per block of 4 warps; bench/RESULTS.md.)
__host__ __device__ constexpr bool LaneRowHeadsFit(int heads) {
  return heads > 0 && (heads % kLaneRowWarps == 0 || kLaneRowWarps % heads == 0);
}
__host__ __device__ constexpr int LaneRowBlockHeads(int heads) { return heads < kLaneRowWarps ? heads : kLaneRowWarps; }
// Passes per warp: kLaneRowPasses for large encodes; fewer where the rows
// are few, so that a small batch (a put frame: 16 tokens a block per
// layer) spreads over up to kLaneRowTargetBlocks blocks per head group
// instead of one block walking 32 passes in turn (~120 µs a launch,
// whatever its rows; bench/profiling/encode_probe).
inline constexpr int64_t kLaneRowTargetBlocks = 256;
__host__ __device__ constexpr int LaneRowPasses(int64_t tokens, int heads) {
  const int64_t per_pass = kLaneRowTokens * (kLaneRowWarps / LaneRowBlockHeads(heads)) * kLaneRowTargetBlocks;
  const int64_t p = (tokens + per_pass - 1) / per_pass;
  return p < 1 ? 1 : p > kLaneRowPasses ? kLaneRowPasses : static_cast<int>(p);
}
__host__ __device__ constexpr int64_t LaneRowBlockTokens(int64_t tokens, int heads) {
  return kLaneRowTokens * LaneRowPasses(tokens, heads) * (kLaneRowWarps / LaneRowBlockHeads(heads));
}
// Blocks of 8 warps per SM the registers are budgeted for (<= 128; at 3
// blocks, 80 registers spill 300-600 bytes), and the input buffers per
// warp by EncodeLaunch::encode_blocks_per_sm (3: served, two; 2: three,
// i.e. two passes loading while one computes).
inline constexpr int kLaneRowMinBlocks = 2;
constexpr int LaneRowBufs(int encode_blocks_per_sm) { return encode_blocks_per_sm == 3 ? 2 : 3; }
constexpr size_t LaneRowSmemBytes(int bufs) { return static_cast<size_t>(bufs) * kLaneRowWarps * kLaneRowBufBytes; }

// The block's tables in shared memory, per head of the block (whichever
// component): 3- and 4-bit codebooks' tables only (lane rows take 2-, 3-
// and 4-bit rows).
struct LaneRowTables {
  static constexpr int kCap = 32;  // LutMaxCells(3) = LutMaxCells(4)
  uint32_t s1m[kLaneRowWarps][64];  // s1 as sign masks of the raw 16-bit pairs (channels 2k, 2k + 1)
  float ss2[kLaneRowWarps][128];    // ±scale per channel
  uint32_t lut[kLaneRowWarps][2 * kCap];  // bnd, then base (gpu/quant_lut.h)
};

// The FWHT of a row held as two half rows (lane half u: channels 32m + 16u
// + q as x[16m + q]): stages h = 1, 2, 4, 8 (x index bits 0-3), 16 (u: the
// partner lane l ^ 16), 32, 64 (x index bits 4, 5), each pair as a + b /
// a − b in the reference's order (codec/rotation.cc); the cross-lane stage
// as fma(±1, x, other), which rounds exactly like other ± x.
__device__ __forceinline__ void FwhtHalfRow(float (&x)[64], int u) {
  auto stage = [&](int xb) {
#pragma unroll
    for (int j = 0; j < 64; ++j)
      if ((j & xb) == 0) {
        const float p = x[j], q = x[j + xb];
        x[j] = __fadd_rn(p, q);
        x[j + xb] = __fsub_rn(p, q);
      }
  };
  constexpr int kStages = profile::kEncodeFwhtStages;  // 7 but in a profiling build
  if constexpr (kStages == 7) {
    stage(1);
    stage(2);
    stage(4);
  }
  if constexpr (kStages >= 4) {
    stage(8);
    const float sg = u ? -1.0f : 1.0f;  // u = 0: x + other, u = 1: other − x
#pragma unroll
    for (int j = 0; j < 64; ++j) x[j] = __fmaf_rn(sg, x[j], __shfl_xor_sync(kFullMask, x[j], 16));
    stage(16);
    stage(32);
  }
  (void)stage;
  (void)u;
}

template <int B, typename T, bool kLut, bool kIsK, int kBufs, bool kFew>
__device__ __forceinline__ void EncodeLaneRows(const EncodeLaunch& a, int h0, int64_t tok0, LaneRowTables& tb,
                                               uint8_t* bufs) {
  static_assert(!std::is_same_v<T, float>, "lane rows: 16-bit input");
  static_assert(B == 2 || B == 3 || B == 4, "lane rows: 2-, 3- or 4-bit rows");
  using In = FastInput<T>;
  constexpr int kCap = LutMaxCells(B);
  static_assert(kCap <= LaneRowTables::kCap);
  constexpr int W = 4 * B + 1;  // packed row words: indices, then the fp32 norm
  constexpr uint32_t kAddrBytes = 2048;  // a pass buffer: staged rows (16·W words), then 16 row addresses
  static_assert(kLaneRowTokens * W * 4 <= kAddrBytes && kAddrBytes + kLaneRowTokens * 8 <= kLaneRowBufBytes);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int hb = LaneRowBlockHeads(a.heads), groups = kLaneRowWarps / hb;
  const int hw = warp % hb, tg = warp / hb;  // the warp's head in the block, token group
  const int h = h0 + hw;
  // kFew: LaneRowPasses(tokens) < kLaneRowPasses (a separate instantiation:
  // the full-size loop with a run-time bound ran 4-9% slower).
  const int passes = kFew ? LaneRowPasses(a.tokens, a.heads) : kLaneRowPasses;
  const GpuComponent* comps = kIsK ? a.k_comp : a.v_comp;
  const GpuComponent& c = comps[h];
  const GpuGroup& gr = c.groups[0];
  const PageRegion& pr = kIsK ? a.k_pages : a.v_pages;
  const T* src = static_cast<const T*>(kIsK ? a.k : a.v);

  const int r = lane & 15, u = lane >> 4;  // the lane's row and half
  uint8_t* const wbuf = bufs + static_cast<size_t>(warp) * kBufs * kLaneRowBufBytes;
  const uint32_t wbuf_s = static_cast<uint32_t>(__cvta_generic_to_shared(wbuf));
  auto first_token = [&](int pass) { return tok0 + kLaneRowTokens * (groups * pass + tg); };
  // Pass `pass`'s 16 rows into buffer pass mod kBufs: lane l copies chunk
  // r = l & 15 of rows 2j + u, j = 0..7 (two whole rows per instruction),
  // 2j·H·128 elements past its first row, into the swizzled chunk
  // r ^ ((2j + u) mod 8) = r ^ u ^ (2j mod 8). The first passes load while
  // the block sets up its tables.
  const T* const lane_src = src + (static_cast<int64_t>(u) * a.heads + h) * 128 + 8 * r;
  const int64_t row_pair = 2 * static_cast<int64_t>(a.heads) * 128;
  const uint32_t lane_dst = wbuf_s + 256u * u;
  auto load = [&](int pass) {
    const int64_t t0 = first_token(pass);
    const int64_t rows = a.tokens - t0;  // rows of the pass that exist (may be <= 0 or > 16)
    const uint32_t dst = lane_dst + static_cast<uint32_t>(pass % kBufs) * kLaneRowBufBytes;
    const T* p = lane_src + t0 * a.heads * 128;
    auto copy = [&](int j) { CpAsync16(dst + 512u * j + 16u * static_cast<uint32_t>(r ^ u ^ ((2 * j) & 7)), p); };
    if (rows >= kLaneRowTokens) {  // the warp's whole pass: no per-copy bounds (64-bit compares)
#pragma unroll
      for (int j = 0; j < kLaneRowTokens / 2; ++j, p += row_pair) copy(j);
    } else {
#pragma unroll
      for (int j = 0; j < kLaneRowTokens / 2; ++j, p += row_pair)
        if (2 * j + u < rows) copy(j);
    }
  };
  auto slot_of = [&](int pass) -> int64_t {
    const int64_t t = first_token(pass) + r;
    return pass < passes && t < a.tokens ? __ldg(a.slots + t) : -1;
  };
#pragma unroll
  for (int p = 0; p + 1 < kBufs; ++p) {
    if (p < passes) load(p);
    CpAsyncCommit();
  }
  int64_t nslot = slot_of(0);
  // Per head of the block: s1 as sign masks of the raw 16-bit pairs, ±scale
  // per channel, and the quantiser's table.
  for (int k = tid; k < hb * 128; k += blockDim.x) {
    const GpuGroup& g = comps[h0 + k / 128].groups[0];
    tb.ss2[k / 128][k % 128] = __fmul_rn(g.block_scale[0], __ldg(g.s2 + k % 128));
  }
  for (int k = tid; k < hb * 64; k += blockDim.x) {
    const float* s1 = comps[h0 + k / 64].groups[0].s1 + 2 * (k % 64);
    tb.s1m[k / 64][k % 64] = (__ldg(s1) < 0.0f ? 0x8000u : 0u) | (__ldg(s1 + 1) < 0.0f ? 0x80000000u : 0u);
  }
  if constexpr (kUseLut<B, kLut>) {
    for (int k = tid; k < hb * kCap; k += blockDim.x) {
      const GpuGroup& g = comps[h0 + k / kCap].groups[0];
      const int cell = k % kCap, cells = g.lut_cells;  // <= kCap (EncodeUsesQuantLut)
      if (cell < cells) {
        tb.lut[k / kCap][cell] = __ldg(g.lut + cell);
        tb.lut[k / kCap][kCap + cell] = __ldg(g.lut + cells + cell);
      }
    }
  }
  const uint32_t* const s1m = tb.s1m[hw];
  const float* const ss2 = tb.ss2[hw];
  float bnd[kRegBounds<B>];
  const uint32_t* lut = nullptr;
  float lut_scale = 0.0f, lut_offset = 0.0f, lut_step = 0.0f;
  if constexpr (kUseLut<B, kLut>) {
    lut = tb.lut[hw];
    lut_scale = gr.lut_scale;
    lut_offset = gr.lut_offset;
    lut_step = static_cast<float>(gr.lut_cells - 1) * kLutUlp;
    bnd[0] = 0.0f;
  } else {
#pragma unroll
    for (int k = 0; k < (1 << B) - 1; ++k) bnd[k] = __ldg(gr.boundaries + k);
  }
  __syncthreads();
#pragma unroll 1
  for (int pass = 0; pass < passes; ++pass) {
    if (kFew && first_token(pass) >= a.tokens) break;  // warp-uniform: the later passes are past the end too
    const int64_t slot = nslot;
    // Into the buffer the previous pass read (freed by its last __syncwarp).
    if (pass + kBufs - 1 < passes) load(pass + kBufs - 1);
    CpAsyncCommit();  // possibly empty: one group per pass
    nslot = slot_of(pass + 1);
    CpAsyncWait<kBufs - 1>();  // this pass's group
    __syncwarp();

    // The lane's half row: chunks 4m + 2u, 4m + 2u + 1 (channels 32m + 16u
    // .. + 15), s1 applied to the raw signs.
    uint32_t* const buf = reinterpret_cast<uint32_t*>(wbuf + (pass % kBufs) * kLaneRowBufBytes);
    float x[64];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ch = 4 * m + 2 * u + e;
        const uint4 v = *reinterpret_cast<const uint4*>(buf + 64 * r + 4 * (ch ^ (r & 7)));
        const uint4 sm = *reinterpret_cast<const uint4*>(s1m + 4 * ch);
        typename In::Raw lo = {v.x ^ sm.x, v.y ^ sm.y}, hi = {v.z ^ sm.z, v.w ^ sm.w};
        In::ToFloat(lo, x + 16 * m + 8 * e);
        In::ToFloat(hi, x + 16 * m + 8 * e + 4);
      }
    // Canonical sum of squares, norm and 1/norm (EncodeRowsFast's).
    float acc[16];
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      float t = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) t = __fmaf_rn(x[16 * i + q], x[16 * i + q], t);
      acc[q] = __fadd_rn(t, __shfl_xor_sync(kFullMask, t, 16));  // off 16: accumulators q and 16 + q
    }
    auto level = [&]<int kOff>() {
#pragma unroll
      for (int q = 0; q < kOff; ++q) acc[q] = __fadd_rn(acc[q], acc[q + kOff]);
    };
    level.template operator()<8>();
    level.template operator()<4>();
    level.template operator()<2>();
    level.template operator()<1>();
    const float norm = __fsqrt_rn(acc[0]);
    const float inv = norm > 0.0f ? __fdiv_rn(1.0f, norm) : 0.0f;
#pragma unroll
    for (int j = 0; j < 64; ++j) x[j] = __fmul_rn(x[j], inv);
    FwhtHalfRow(x, u);
    // Scale and signs, quantise, pack; stage the packed rows over this
    // pass's buffer (every lane's half row is in registers): group m, bits
    // [16B(2m + u), + 16B) of row r, as B 16-bit units at unit B(2m + u) of
    // its W staged words.
    __syncwarp();
    uint16_t* const srow = reinterpret_cast<uint16_t*>(buf + W * r);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      uint32_t gw[(16 * B + 31) / 32];
#pragma unroll
      for (int k = 0; k < (16 * B + 31) / 32; ++k) gw[k] = 0;
#pragma unroll
      for (int t4 = 0; t4 < 4; ++t4) {
        const float4 sc = *reinterpret_cast<const float4*>(ss2 + 32 * m + 16 * u + 4 * t4);
        const float sv[4] = {sc.x, sc.y, sc.z, sc.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = 4 * t4 + e;
          const float y = __fmul_rn(x[16 * m + q], sv[e]);
          uint32_t idx;
          if constexpr (kUseLut<B, kLut>) idx = QuantizeLut<kCap>(y, lut_scale, lut_offset, lut_step, lut);
          else idx = QuantizeFast<B>(y, bnd, nullptr);
          const int bit = B * q, word = bit >> 5, sh = bit & 31;
          gw[word] += idx << sh;  // disjoint fields
          if (sh + B > 32) gw[word + 1] += idx >> (32 - sh);
        }
      }
      if constexpr (B % 2 == 0) {
        uint32_t* const dw = buf + W * r + B * m + (B / 2) * u;
#pragma unroll
        for (int k = 0; k < B / 2; ++k) dw[k] = gw[k];
      } else {
        uint16_t* const dh = srow + B * (2 * m + u);
#pragma unroll
        for (int k = 0; k < B; ++k) dh[k] = static_cast<uint16_t>(gw[k / 2] >> (16 * (k % 2)));
      }
    }
    // The rows' page addresses (null: skipped slot; 4·W is the row's bytes,
    // as the lane-row formats have) go past the staged rows, at byte
    // kAddrBytes of the buffer.
    uint32_t** const addrs = reinterpret_cast<uint32_t**>(wbuf + (pass % kBufs) * kLaneRowBufBytes + kAddrBytes);
    if (u == 0) {
      buf[W * r + W - 1] = __float_as_uint(norm);
      addrs[r] = slot < 0 ? nullptr : reinterpret_cast<uint32_t*>(RowAddress(pr, slot, a.heads, h, 4 * W));
    }
    const bool every = __all_sync(kFullMask, slot >= 0);  // no skipped slot in the pass (the usual case)
    __syncwarp();
    // Whole rows out: staged word W·row + k to word k of the row's page
    // address, by lane (W·row + k) mod 32.
#pragma unroll
    for (int k = 0; k < (kLaneRowTokens * W + 31) / 32; ++k) {
      const int idx = lane + 32 * k;
      if (32 * (k + 1) > kLaneRowTokens * W && idx >= kLaneRowTokens * W) continue;
      const int row = idx / W;
      uint32_t* const rb = addrs[row];
      if (every || rb != nullptr) rb[idx - W * row] = buf[idx];
    }
    __syncwarp();  // the buffer is pass + kBufs's next
  }
}

// grid: (heads / LaneRowBlockHeads × token blocks of LaneRowBlockTokens(tokens, heads), 2
// components); kLaneRowWarps warps; LaneRowSmemBytes(kBufs) of dynamic
// shared memory.
template <int KB, int VB, typename T, bool kLut, int kBufs, bool kFew>
__global__ void __launch_bounds__(32 * kLaneRowWarps, kLaneRowMinBlocks) EncodeLaneRowsKernel(EncodeLaunch a) {
  extern __shared__ __align__(128) uint8_t lr_smem[];
  __shared__ __align__(16) LaneRowTables tables;
  if (*a.bad_slot != kNoBadSlot) return;
  const int head_groups = a.heads / LaneRowBlockHeads(a.heads);
  const int h0 = static_cast<int>(blockIdx.x % head_groups) * LaneRowBlockHeads(a.heads);
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x / head_groups) * LaneRowBlockTokens(a.tokens, a.heads);
  if (blockIdx.y == 0) EncodeLaneRows<KB, T, kLut, true, kBufs, kFew>(a, h0, tok0, tables, lr_smem);
  else EncodeLaneRows<VB, T, kLut, false, kBufs, kFew>(a, h0, tok0, tables, lr_smem);
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ENCODE_ROWS_CUH_
