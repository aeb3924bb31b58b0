// Tensor-core decode attention for every packed format of gpu/format_tiles.h
// (mse rows of 2-8 bits with any K/V pair, the turboquant25/35 recipes with
// and without QJL; head dims 64, 96, 128, 256; GQA groups up to 8). The
// formats are compile-time (bits and channels of each part size the
// registers); offsets, norms and codebooks come from the launch.
//
// Block = (query, kv head) × split, kTileWarps warps; a warp takes 16-token
// tiles in turn and stages each tile's 16 K and 16 V rows in its own ring of
// shared-memory stages by 4-byte cp.async (rows of any whole-word size).
//
// Scores, per part: S[h, t] = Σ_{c in part} q[h, c] · ĉ[t, c], as
// mma.sync m16n8k16 with the scaled query states as A (rows = heads, the
// group padded to 16) and the dequantised keys as B (k = channels, n =
// tokens). The four k indices a lane quad i supplies per k-step are the
// next four channels of its own quarter of the part (the query fragments
// use the same map), so a lane reads one contiguous piece of each key row
// and every field position in it is a compile-time constant. A token's
// score is Σ_parts coef_part(t) · S_part (the norm, or for a QJL sign part
// ‖x_g‖ · ‖r_g‖ · qjl_scale).
//
// Values: O[c, h] += Σ_t V̂[c, t] · (p[h, t] · coef_part(t)) with V̂ᵀ as A
// (rows = channels: lane octet g owns an eighth of each part, m-tile j's
// rows g, g + 8 are its channels 2j, 2j + 1) and P as B, which is the
// score accumulator's own fragment (no shuffles).
//
// Dequantisation: a lookup in a replicated shared table (entry e of copy r
// at word e · copies + r) gives an fp16 pair: two adjacent fields of a key
// piece, or one field of two tokens' value pieces (the tokens' fields
// interleaved word-wise first, two lop3 per word); 5- and 8-bit fields are
// looked up one by one and paired with a prmt.
//
// Records are the generic kernel's ({m, l, acc_state[sv], 0[dim]}); the
// generic merge applies Πᵀ (and Sᵀ). Packed tokens only: dense tails are
// attended in a split of their own (AttnDims::tail_split) by
// GenericAttentionKernel.
#ifndef TQKV_GPU_KERNELS_ATTENTION_FORMAT_TILES_CUH_
#define TQKV_GPU_KERNELS_ATTENTION_FORMAT_TILES_CUH_

#include <cuda_fp16.h>

#include <type_traits>
#include <utility>

#include "gpu/format_tiles.h"
#include "gpu/kernels/mma_warp.cuh"
#include "gpu/launch_util.h"

namespace tqkv::gpu {

// f(integral_constant<int, 0>), ..., f(integral_constant<int, N − 1>).
template <int N, typename F>
__device__ __forceinline__ void Unroll(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

constexpr int Log2(int x) { return x <= 1 ? 0 : 1 + Log2(x / 2); }

// Bits [POS, POS + WIDTH) of the word array w (bit 0 = bit 0 of w[0]) moved
// to bit SH; bits outside the field are unspecified.
template <int POS, int WIDTH, int SH, int N>
__device__ __forceinline__ uint32_t FieldAt(const uint32_t (&w)[N]) {
  constexpr int wi = POS / 32, s = POS % 32;
  static_assert(wi < N, "field past the piece");
  if constexpr (s + WIDTH <= 32) {
    if constexpr (s >= SH) {
      return w[wi] >> (s - SH);
    } else {
      return w[wi] << (SH - s);
    }
  } else {
    static_assert(wi + 1 < N && s >= SH, "a field crossing words");
    return __funnelshift_r(w[wi], w[wi + 1], s - SH);
  }
}

// The same on one word.
template <int POS, int SH>
__device__ __forceinline__ uint32_t WordField(uint32_t x) {
  if constexpr (POS >= SH) {
    return x >> (POS - SH);
  } else {
    return x << (SH - POS);
  }
}

// A lane's piece of BITS bits that starts at bit `start` of a staged row,
// realigned to bit 0 (one word past the piece is read: rows have a spare).
template <int BITS>
inline constexpr int kPieceWords = (BITS + 31) / 32;
template <int BITS>
__device__ __forceinline__ void LoadPiece(const uint32_t* row, int start, uint32_t (&w)[kPieceWords<BITS>]) {
  constexpr int N = kPieceWords<BITS>;
  const uint32_t* src = row + (start >> 5);
  const uint32_t sh = static_cast<uint32_t>(start) & 31u;
  uint32_t raw[N + 1];
#pragma unroll
  for (int j = 0; j <= N; ++j) raw[j] = src[j];
#pragma unroll
  for (int j = 0; j < N; ++j) w[j] = __funnelshift_r(raw[j], raw[j + 1], sh);
}

// Lookups in the table of one part (BITS-bit fields) at byte TABLE of the
// dynamic shared memory.
template <int BITS, uint32_t TABLE>
struct TileLut {
  static constexpr bool kPairs = TilePairs(BITS);
  static constexpr int kCopies = TileCopies(BITS);
  static constexpr int kShift = 2 + Log2(kCopies);
  static constexpr uint32_t kMask1 = ((1u << BITS) - 1u) << kShift;
  static constexpr uint32_t kMask2 = ((1u << (2 * BITS)) - 1u) << kShift;

  __device__ __forceinline__ static uint32_t Base(int lane) {
    return (static_cast<uint32_t>(lane) & (kCopies - 1u)) << 2;
  }
  __device__ __forceinline__ static uint32_t At(uint32_t shifted, uint32_t mask, uint32_t base) {
    return LdsTable<TABLE>((shifted & mask) | base);
  }
  // fp16 pair (field at POS, field at POS + BITS) of a piece.
  template <int POS, int N>
  __device__ __forceinline__ static uint32_t Adjacent(const uint32_t (&w)[N], uint32_t base) {
    if constexpr (kPairs) {
      return At(FieldAt<POS, 2 * BITS, kShift>(w), kMask2, base);
    } else {
      const uint32_t lo = At(FieldAt<POS, BITS, kShift>(w), kMask1, base);
      const uint32_t hi = At(FieldAt<POS + BITS, BITS, kShift>(w), kMask1, base);
      return Prmt(lo, hi, 0x5410);
    }
  }
  // Table entry e: fp16 (c[e mod 2^B], c[e / 2^B]) for pairs, c[e] in the
  // low half for singles; signs: c = {−1, +1}.
  __device__ static void Build(uint32_t* smem, const float* centroids, int tid, int threads) {
    constexpr int kEntries = TileEntries(BITS);
    uint32_t* t = smem + TABLE / 4;
    for (int x = tid; x < kEntries * kCopies; x += threads) {
      const int e = x / kCopies;
      auto c = [&](int idx) { return centroids != nullptr ? __ldg(centroids + idx) : (idx ? 1.0f : -1.0f); };
      t[x] = kPairs ? PackHalf2(c(e & ((1 << BITS) - 1)), c(e >> BITS)) : HalfBits(c(e));
    }
  }
};

// Field k of two tokens' value pieces wx, wy as the fp16 pair (x_k, y_k).
// Pair tables: the pieces are cut into channel-aligned words of F fields
// (F even, F · BITS <= 32); even fields pair in (cx & E) | (cy << B & ~E),
// odd ones in (cx >> B & E) | (cy & ~E), E = the even fields' bits.
template <int BITS, uint32_t TABLE, int PC>
struct TokenPairs {
  using Lut = TileLut<BITS, TABLE>;
  static constexpr int kF = (32 / BITS) & ~1;
  static constexpr int kWords = (PC + kF - 1) / kF;
  static constexpr uint32_t EvenFields() {
    uint32_t e = 0;
    for (int k = 0; k < kF; k += 2) e |= ((1u << BITS) - 1u) << (k * BITS);
    return e;
  }
  static constexpr uint32_t kEven = EvenFields();
  uint32_t ev[Lut::kPairs ? kWords : 1], od[Lut::kPairs ? kWords : 1];

  template <int N>
  __device__ __forceinline__ void Make(const uint32_t (&wx)[N], const uint32_t (&wy)[N]) {
    if constexpr (Lut::kPairs) {
      Unroll<kWords>([&](auto c_) {
        constexpr int c = decltype(c_)::value;
        constexpr int pos = c * kF * BITS;
        constexpr int width = (PC - c * kF < kF ? PC - c * kF : kF) * BITS;
        const uint32_t cx = FieldAt<pos, width, 0>(wx), cy = FieldAt<pos, width, 0>(wy);
        ev[c] = (cx & kEven) | ((cy << BITS) & ~kEven);
        od[c] = ((cx >> BITS) & kEven) | (cy & ~kEven);
      });
    }
  }
  template <int K, int N>
  __device__ __forceinline__ uint32_t Get(const uint32_t (&wx)[N], const uint32_t (&wy)[N], uint32_t base) const {
    if constexpr (Lut::kPairs) {
      constexpr int c = K / kF, f = K % kF;
      const uint32_t w = f % 2 == 0 ? ev[c] : od[c];
      return Lut::At(WordField<(f & ~1) * BITS, Lut::kShift>(w), Lut::kMask2, base);
    } else {
      const uint32_t lo = Lut::At(FieldAt<K * BITS, BITS, Lut::kShift>(wx), Lut::kMask1, base);
      const uint32_t hi = Lut::At(FieldAt<K * BITS, BITS, Lut::kShift>(wy), Lut::kMask1, base);
      return Prmt(lo, hi, 0x5410);
    }
  }
};

template <TileFormat KF, TileFormat VF>
struct FormatTilesConst {
  static constexpr FormatTilesLayout L = FormatTilesLayout::Of(KF, VF);
  static constexpr int kKSteps = KF.state / 16;
  static constexpr int kVTiles = VF.state / 16;
  // First k-step (m-tile) of part p.
  static constexpr int KStep0(int p) { return KF.part[p].state / 16; }
  static constexpr int VTile0(int p) { return VF.part[p].state / 16; }
};

// A part's coefficient from a staged row: ‖x_g‖, or ‖x_g‖ · ‖r_g‖ ·
// qjl_scale for a sign part (fp32 norms at 4-byte offsets, fp16 ones at
// 2-byte offsets).
template <bool kF16>
__device__ __forceinline__ float RowNorm(const uint32_t* row, int off) {
  const uint32_t w = row[off >> 2];
  if constexpr (kF16) {
    const uint32_t h = (off & 2) ? (w >> 16) : (w & 0xFFFFu);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
  } else {
    return __uint_as_float(w);
  }
}
template <TileFormat F, int P>
__device__ __forceinline__ float PartCoef(const GpuComponent& c, const uint32_t* row) {
  constexpr TilePart part = F.part[P];
  const GpuGroup& g = c.groups[part.group];
  const float norm = RowNorm<F.fp16_norms>(row, g.norm_offset);
  if constexpr (part.sign) {
    return norm * RowNorm<F.fp16_norms>(row, g.residual_offset) * g.qjl_scale;
  } else {
    return norm;
  }
}
template <TileFormat F, int P>
__device__ __forceinline__ int PartBit(const GpuComponent& c) {
  constexpr TilePart part = F.part[P];
  return 8 * (part.sign ? c.groups[part.group].sign_offset : c.groups[part.group].index_offset);
}

// Entry I of kFormatTiles (a kernel's template arguments are plain
// integers: its host stub cannot name class-type arguments); MB: resident
// blocks per SM the registers are budgeted for.
template <int I, int MB>
__global__ void __launch_bounds__(32 * kTileWarps, MB)
    FormatTilesKernel(AttentionLaunch a, AttnDims d, const float* states, float* records) {
  constexpr TileFormat KF = kFormatTiles[I].k;
  constexpr TileFormat VF = kFormatTiles[I].v;
  using C = FormatTilesConst<KF, VF>;
  constexpr int NS = C::L.stages;
  extern __shared__ __align__(128) uint32_t ft_smem[];  // no static shared memory: kMmaSmemWindowBase
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, i = lane & 3;
  const int64_t qi = blockIdx.x / a.kv_heads;
  const int kvh = static_cast<int>(blockIdx.x % a.kv_heads);
  const int split = blockIdx.y;
  const int G = d.group;
  const GpuComponent& kc = a.k_comp[kvh];  // codebooks: per kv head
  const GpuComponent& vc = a.v_comp[kvh];
  const GpuComponent& hk = a.host_k;  // layouts: the same for every kv head
  const GpuComponent& hv = a.host_v;

  Unroll<KF.parts>([&](auto p_) {
    constexpr int p = decltype(p_)::value;
    constexpr TilePart P = KF.part[p];
    TileLut<P.bits, C::L.k_table[p]>::Build(ft_smem, P.sign ? nullptr : kc.groups[P.group].centroids, tid, blockDim.x);
  });
  Unroll<VF.parts>([&](auto p_) {
    constexpr int p = decltype(p_)::value;
    constexpr TilePart P = VF.part[p];
    TileLut<P.bits, C::L.v_table[p]>::Build(ft_smem, P.sign ? nullptr : vc.groups[P.group].centroids, tid, blockDim.x);
  });

  // Query fragments (A of the score mma; rows g + 8 are zero): k-step s of
  // part p takes state channels part.state + i · n/4 + 4s + {0, 1} (a0) and
  // + {2, 3} (a2).
  uint32_t qa[C::kKSteps][2];
  {
    const float sl = a.scale * kLog2e;
    const float* qrow = states + (qi * a.q_heads + kvh * G + (g < G ? g : 0)) * d.sk;
    Unroll<KF.parts>([&](auto p_) {
      constexpr int p = decltype(p_)::value;
      constexpr TilePart P = KF.part[p];
      Unroll<P.channels / 16>([&](auto s_) {
        constexpr int s = decltype(s_)::value;
        const int c = P.state + i * (P.channels / 4) + 4 * s;
        qa[C::KStep0(p) + s][0] = g < G ? PackHalf2(qrow[c] * sl, qrow[c + 1] * sl) : 0u;
        qa[C::KStep0(p) + s][1] = g < G ? PackHalf2(qrow[c + 2] * sl, qrow[c + 3] * sl) : 0u;
      });
    });
  }
  int kbit[KF.parts], vbit[VF.parts];
  Unroll<KF.parts>([&](auto p_) { kbit[p_] = PartBit<KF, decltype(p_)::value>(hk); });
  Unroll<VF.parts>([&](auto p_) { vbit[p_] = PartBit<VF, decltype(p_)::value>(hv); });
  __syncthreads();  // tables complete

  const int seq = SeqOf(a, qi);
  const int limit = static_cast<int>(min(a.positions[qi] + 1, a.packed_tokens[seq]));
  const int t0 = split * static_cast<int>(d.chunk);
  const int t1 = min(limit, t0 + static_cast<int>(d.chunk));
  const int ntiles = t1 > t0 ? (t1 - t0 + 15) / 16 : 0;
  const int mine = ntiles > warp ? (ntiles - warp + kTileWarps - 1) / kTileWarps : 0;
  const int32_t* btab = BlockTable(a, seq);
  const int bs_shift = __ffs(a.block_size) - 1;  // a power of two >= 16 (the plan)
  const uint32_t bs_mask = static_cast<uint32_t>(a.block_size) - 1u;
  const uint64_t stride = static_cast<uint64_t>(a.block_stride);
  const int krb = hk.row_bytes, vrb = hv.row_bytes;

  // This warp's stages: K rows [16][k_stride] words, then V rows.
  uint32_t* stage0 = ft_smem + (C::L.stage_base + warp * NS * C::L.stage_bytes) / 4;
  const uint32_t stage0_s = static_cast<uint32_t>(__cvta_generic_to_shared(stage0));
  auto tile_tt = [&](int j) { return t0 + 16 * (warp + kTileWarps * j); };
  PageStream pages([&](int m) -> int32_t {
    const int tt = tile_tt(m);
    return tt < t1 ? __ldg(btab + (tt >> bs_shift)) : 0;
  }, lane);
  // Tile j into stage j mod NS: word f of the tile's K rows (row f / KW,
  // word f mod KW) is copied by lane f mod 32, so a warp's copies cover 32
  // consecutive words of two or three rows (a few cache lines, not one per
  // lane); the same for V. Rows past the split's end are not loaded.
  constexpr int KW = KF.row_words(), VW = VF.row_words();
  const uint32_t kstep = static_cast<uint32_t>(a.kv_heads * krb), vstep = static_cast<uint32_t>(a.kv_heads * vrb);
  auto copy_rows = [&](auto words_, uint32_t dst, int stride_words, const uint8_t* src, uint32_t step, int rows) {
    constexpr int W = decltype(words_)::value;
#pragma unroll
    for (int k = 0; k < (16 * W + 31) / 32; ++k) {
      const int f = lane + 32 * k;
      const int r = f / W, w = f - r * W;
      if (f < 16 * W && r < rows) CpAsync4(dst + 4u * (r * stride_words + w), src + r * step + 4 * w);
    }
  };
  auto issue = [&](int j) {
    const uint32_t page = pages.Next(j, lane);
    const int tt = tile_tt(j);
    if (j < mine) {
      const uint32_t off = static_cast<uint32_t>(tt) & bs_mask;
      const uint8_t* kp = a.k_base + page * stride + off * kstep + kvh * krb;
      const uint8_t* vp = a.v_base + page * stride + off * vstep + kvh * vrb;
      const uint32_t dst = stage0_s + static_cast<uint32_t>((j % NS) * C::L.stage_bytes);
      const int rows = min(16, t1 - tt);
      copy_rows(std::integral_constant<int, KW>{}, dst, C::L.k_stride, kp, kstep, rows);
      copy_rows(std::integral_constant<int, VW>{}, dst + 64u * C::L.k_stride, C::L.v_stride, vp, vstep, rows);
    }
    CpAsyncCommit();
  };

  float m = -CUDART_INF_F, l = 0.0f;
  float acc[C::kVTiles][4];
#pragma unroll
  for (int u = 0; u < C::kVTiles; ++u)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[u][e] = 0.0f;

  // One tile: the lane's tokens are 2i + (v & 1) + 8 (v >> 1), v = 0..3
  // (its score columns, its value rows).
  auto compute = [&](int j) {
    const uint32_t* ks = stage0 + (j % NS) * (C::L.stage_bytes / 4);
    const uint32_t* vs = ks + 16 * C::L.k_stride;
    const int tt = tile_tt(j);
    float sc[KF.parts][2][4];
    Unroll<KF.parts>([&](auto p_) {
      constexpr int p = decltype(p_)::value;
      constexpr TilePart P = KF.part[p];
      constexpr int PB = P.channels / 4 * P.bits;
      using Lut = TileLut<P.bits, C::L.k_table[p]>;
      const uint32_t base = Lut::Base(lane);
      Unroll<2>([&](auto nt_) {
        constexpr int nt = decltype(nt_)::value;
        float(&c)[4] = sc[p][nt];
        c[0] = c[1] = c[2] = c[3] = 0.0f;
        uint32_t w[kPieceWords<PB>];
        LoadPiece<PB>(ks + (g + 8 * nt) * C::L.k_stride, kbit[p] + i * PB, w);
        Unroll<P.channels / 16>([&](auto s_) {
          constexpr int s = decltype(s_)::value;
          const uint32_t b0 = Lut::template Adjacent<4 * s * P.bits>(w, base);
          const uint32_t b1 = Lut::template Adjacent<(4 * s + 2) * P.bits>(w, base);
          MmaF16(c, qa[C::KStep0(p) + s][0], 0u, qa[C::KStep0(p) + s][1], 0u, b0, b1);
        });
      });
    });
    float s[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int tok = 2 * i + (v & 1) + 8 * (v >> 1);
      const uint32_t* kr = ks + tok * C::L.k_stride;
      float x = 0.0f;
      Unroll<KF.parts>([&](auto p_) {
        constexpr int p = decltype(p_)::value;
        x = fmaf(PartCoef<KF, p>(hk, kr), sc[p][v >> 1][v & 1], x);
      });
      s[v] = tt + tok < t1 ? x : -CUDART_INF_F;
    }
    // Online softmax of head g over the quad (tokens 0..15 of the tile).
    float tmax = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
    tmax = fmaxf(tmax, __shfl_xor_sync(kFullMask, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(kFullMask, tmax, 2));
    const float mnew = fmaxf(m, tmax);  // finite: the tile's first token is valid
    const float corr = FastExp2(m - mnew);
    m = mnew;
    float psum = 0.0f;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      s[v] = FastExp2(s[v] - mnew);
      psum += s[v];
    }
    l = fmaf(l, corr, psum);
    if (__any_sync(kFullMask, corr != 1.0f)) {
      const float ca = __shfl_sync(kFullMask, corr, 8 * i), cb = __shfl_sync(kFullMask, corr, 8 * i + 4);
#pragma unroll
      for (int u = 0; u < C::kVTiles; ++u) {
        acc[u][0] *= ca;
        acc[u][1] *= cb;
        acc[u][2] *= ca;
        acc[u][3] *= cb;
      }
    }
    // Values, part by part: P's B fragment scaled by the part's coefficient.
    const uint32_t* vr[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) vr[v] = vs + (2 * i + (v & 1) + 8 * (v >> 1)) * C::L.v_stride;
    Unroll<VF.parts>([&](auto p_) {
      constexpr int p = decltype(p_)::value;
      constexpr TilePart P = VF.part[p];
      constexpr int PC = P.channels / 8, PB = PC * P.bits;
      using Pairs = TokenPairs<P.bits, C::L.v_table[p], PC>;
      const uint32_t base = Pairs::Lut::Base(lane);
      float pn[4];
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const bool valid = tt + 2 * i + (v & 1) + 8 * (v >> 1) < t1;
        pn[v] = valid ? s[v] * PartCoef<VF, p>(hv, vr[v]) : 0.0f;
      }
      const uint32_t pb0 = PackHalf2(pn[0], pn[1]), pb1 = PackHalf2(pn[2], pn[3]);
      uint32_t w[4][kPieceWords<PB>];
#pragma unroll
      for (int v = 0; v < 4; ++v) LoadPiece<PB>(vr[v], vbit[p] + g * PB, w[v]);
      Pairs lo, hi;  // tokens (2i, 2i + 1), (2i + 8, 2i + 9)
      lo.Make(w[0], w[1]);
      hi.Make(w[2], w[3]);
      Unroll<P.channels / 16>([&](auto j_) {
        constexpr int jj = decltype(j_)::value;
        const uint32_t a0 = lo.template Get<2 * jj>(w[0], w[1], base);
        const uint32_t a1 = lo.template Get<2 * jj + 1>(w[0], w[1], base);
        const uint32_t a2 = hi.template Get<2 * jj>(w[2], w[3], base);
        const uint32_t a3 = hi.template Get<2 * jj + 1>(w[2], w[3], base);
        MmaF16(acc[C::VTile0(p) + jj], a0, a1, a2, a3, pb0, pb1);
      });
    });
  };

#pragma unroll
  for (int j = 0; j < NS - 1; ++j) issue(j);
  for (int j = 0; j < mine; ++j) {
    issue(j + NS - 1);  // into the stage computed last: every lane is past it (the __syncwarp below)
    CpAsyncWait<NS - 1>();
    __syncwarp();
    compute(j);
    __syncwarp();
  }
  CpAsyncWait<0>();
  l += __shfl_xor_sync(kFullMask, l, 1);
  l += __shfl_xor_sync(kFullMask, l, 2);

  // Block merge: the warps' (m, l, acc) per head over the stages, then one
  // record per head: {m, l, acc_state[sv], 0[dim]}.
  __syncthreads();
  constexpr int SV = VF.state;
  float* mw = reinterpret_cast<float*>(ft_smem) + C::L.stage_base / 4;  // [warps][kTileMaxGroup][2 + SV]
  auto slot = [&](int w, int h) { return mw + (w * kTileMaxGroup + h) * (2 + SV); };
  if (i == 0 && g < G) {
    slot(warp, g)[0] = m;
    slot(warp, g)[1] = l;
  }
  Unroll<VF.parts>([&](auto p_) {
    constexpr int p = decltype(p_)::value;
    constexpr TilePart P = VF.part[p];
    constexpr int PC = P.channels / 8;
#pragma unroll
    for (int jj = 0; jj < P.channels / 16; ++jj) {
      const int ch = P.state + g * PC + 2 * jj;
      const float(&x)[4] = acc[C::VTile0(p) + jj];
      if (2 * i < G) {
        slot(warp, 2 * i)[2 + ch] = x[0];
        slot(warp, 2 * i)[3 + ch] = x[2];
      }
      if (2 * i + 1 < G) {
        slot(warp, 2 * i + 1)[2 + ch] = x[1];
        slot(warp, 2 * i + 1)[3 + ch] = x[3];
      }
    }
  });
  __syncthreads();
  for (int e = tid; e < G * d.record; e += blockDim.x) {
    const int h = e / d.record, x = e % d.record;
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) mx = fmaxf(mx, slot(w, h)[0]);
    float v = 0.0f;
    if (x == 0) {
      v = mx;
    } else if (x < 2 + SV) {
#pragma unroll
      for (int w = 0; w < kTileWarps; ++w) {
        const float* r = slot(w, h);
        const float f = r[0] == -CUDART_INF_F ? 0.0f : FastExp2(r[0] - mx);
        v = fmaf(f, r[x], v);
      }
    }
    records[((qi * a.q_heads + kvh * G + h) * d.splits + split) * d.record + x] = v;
  }
}

// The kernel of entry I of kFormatTiles over the packed splits of d.
template <int I>
cudaError_t LaunchFormatTilesAt(const AttentionLaunch& a, const AttnDims& d, const float* states, float* records,
                                cudaStream_t stream) {
  constexpr FormatTilesEntry e = kFormatTiles[I];
  constexpr size_t smem = FormatTilesLayout::Of(e.k, e.v).bytes;
  auto* kernel = FormatTilesKernel<I, FormatTilesBlocksPerSm(e)>;
  cudaError_t err = AllowDynamicSmem(reinterpret_cast<const void*>(kernel), smem);
  if (err != cudaSuccess) return err;
  const int packed_splits = d.tail_split >= 0 ? d.tail_split : d.splits;
  const dim3 grid(static_cast<unsigned>(a.num_queries * a.kv_heads), static_cast<unsigned>(packed_splits));
  kernel<<<grid, 32 * kTileWarps, smem, stream>>>(a, d, states, records);
  return cudaGetLastError();
}

// Entries LO .. LO + N − 1 (one translation unit each range: they compile
// in parallel).
template <int LO, int... I>
cudaError_t LaunchFormatTilesIn(std::integer_sequence<int, I...>, const AttentionLaunch& a, const AttnDims& d,
                                const float* states, float* records, cudaStream_t stream) {
  cudaError_t e = cudaErrorNotSupported;
  (void)((d.format_tiles == LO + I ? (e = LaunchFormatTilesAt<LO + I>(a, d, states, records, stream), true) : false) ||
         ...);
  return e;
}

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_KERNELS_ATTENTION_FORMAT_TILES_CUH_
