// The packed formats the format-tiles decode kernel
// (gpu/kernels/attention_format_tiles.cuh) is compiled for, as plain
// constexpr data that host code (the attention plan) and the kernel share.
//
// A component's row is read as up to four parts in query-state order: per
// codebook group its mse indices and, with QJL, its sign bits. A part of
// n channels at b bits contributes n consecutive query-state channels;
// every part's channels are a multiple of 16 (one mma k-step of keys, one
// m-tile of values). The part's bit offset in the row, the norms' offsets
// and the QJL scales are read at run time from the launch's host
// descriptors; everything that sizes registers and tables is here.
#ifndef TQKV_GPU_FORMAT_TILES_H_
#define TQKV_GPU_FORMAT_TILES_H_

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "gpu/attention_plan.h"
#include "gpu/gpu_codec.h"

namespace tqkv::gpu {

inline constexpr int kTileMaxParts = 4;

struct TilePart {
  int channels = 0;
  int bits = 0;       // 1..8; QJL sign parts are 1-bit fields read as ±1
  bool sign = false;  // a QJL sign part (coefficient ‖x_g‖ · ‖r_g‖ · qjl_scale)
  int group = 0;      // the codebook group it belongs to
  int state = 0;      // first query-state channel
};

// Structural (a template argument of the kernel).
struct TileFormat {
  int dim = 0;
  int parts = 0;
  TilePart part[kTileMaxParts] = {};
  bool fp16_norms = false;
  int row_bytes = 0;
  int state = 0;  // query / value state floats

  constexpr int row_words() const { return row_bytes / 4; }
};

// Lookups of a part: pairs of fields through one table entry (two fp16
// values) where the pair table is small, single fields (fp16 in the low
// half of a word) for 5- and 8-bit indices.
constexpr bool TilePairs(int bits) { return bits <= 4; }
constexpr int TileEntries(int bits) { return TilePairs(bits) ? 1 << (2 * bits) : 1 << bits; }
// Copies of a table, so that lanes of a warp read distinct banks: 32 for
// tables of up to 64 entries, 8 (4 lanes per copy) for larger ones.
constexpr int TileCopies(int bits) { return TileEntries(bits) <= 64 ? 32 : 8; }
constexpr size_t TileTableBytes(int bits) { return static_cast<size_t>(TileEntries(bits)) * TileCopies(bits) * 4; }

constexpr int TilePackedBytes(int channels, int bits) { return (channels * bits + 7) / 8; }

// k{b}: one mse group of `dim` channels, fp32 norm after the indices.
constexpr TileFormat MseTileFormat(int dim, int bits) {
  TileFormat f;
  f.dim = dim;
  f.parts = 1;
  f.part[0] = {dim, bits, false, 0, 0};
  f.row_bytes = TilePackedBytes(dim, bits) + 4;
  f.state = dim;
  return f;
}

// turboquant25 / turboquant35 (codec/format.cc's MakeRowLayout): a high
// group of `high` channels at hb bits and the rest at hb − 1, each group
// [mse | signs | fp16 norm | fp16 residual] with QJL (mse at bits − 1),
// [mse | fp16 norm] without.
constexpr TileFormat RecipeTileFormat(int dim, int high, int hb, bool qjl) {
  TileFormat f;
  f.dim = dim;
  f.fp16_norms = true;
  const int n[2] = {high, dim - high};
  const int b[2] = {hb, hb - 1};
  int state = 0;
  for (int g = 0; g < 2; ++g) {
    const int mse = qjl ? b[g] - 1 : b[g];
    f.part[f.parts++] = {n[g], mse, false, g, state};
    state += n[g];
    f.row_bytes += TilePackedBytes(n[g], mse) + 2;
    if (qjl) {
      f.part[f.parts++] = {n[g], 1, true, g, state};
      state += n[g];
      f.row_bytes += TilePackedBytes(n[g], 1) + 2;
    }
  }
  f.state = state;
  return f;
}

constexpr int RecipeHigh(int dim, double ratio) {
  // round(dim · ratio / 16) · 16, halves to even (codec's RecipeHighChannels).
  const double x = dim * ratio / 16.0;
  const int lo = static_cast<int>(x);
  const double frac = x - lo;
  const int r = frac > 0.5 ? lo + 1 : frac < 0.5 ? lo : (lo % 2 == 0 ? lo : lo + 1);
  return r * 16;
}
constexpr TileFormat Tq25TileFormat(int dim, bool qjl) { return RecipeTileFormat(dim, RecipeHigh(dim, 0.25), 3, qjl); }
constexpr TileFormat Tq35TileFormat(int dim, bool qjl) { return RecipeTileFormat(dim, RecipeHigh(dim, 0.5), 4, qjl); }

struct FormatTilesEntry {
  TileFormat k, v;
};

// Warps per block and the cp.async stages of a warp.
inline constexpr int kTileWarps = 4;
inline constexpr int kTileMaxGroup = 8;  // q heads per kv head

// Shared memory of the kernel for (k, v): the tables, then either the
// warps' stages or (after the loop) their records.
struct FormatTilesLayout {
  size_t k_table[kTileMaxParts] = {}, v_table[kTileMaxParts] = {};
  size_t tables = 0;
  int k_stride = 0, v_stride = 0;  // staged row words (a spare word for reads past a row's end)
  int stages = 0;
  size_t stage_bytes = 0;  // one stage: 16 K rows, 16 V rows
  size_t stage_base = 0;   // warp w's stage s at stage_base + (w · stages + s) · stage_bytes
  size_t bytes = 0;

  static constexpr FormatTilesLayout Of(const TileFormat& k, const TileFormat& v) {
    FormatTilesLayout l;
    size_t at = 0;
    for (int p = 0; p < k.parts; ++p) {
      l.k_table[p] = at;
      at += TileTableBytes(k.part[p].bits);
    }
    for (int p = 0; p < v.parts; ++p) {
      l.v_table[p] = at;
      at += TileTableBytes(v.part[p].bits);
    }
    l.tables = at;
    l.k_stride = k.row_words() + 1;
    l.v_stride = v.row_words() + 1;
    l.stage_bytes = static_cast<size_t>(16) * (l.k_stride + l.v_stride) * 4;
    l.stages = l.stage_bytes * 3 * kTileWarps <= 48 * 1024 ? 3 : 2;
    l.stage_base = (at + 127) / 128 * 128;
    const size_t stages = l.stage_bytes * l.stages * kTileWarps;
    const size_t merge = static_cast<size_t>(kTileWarps) * kTileMaxGroup * (v.state + 2) * 4;
    l.bytes = l.stage_base + (stages > merge ? stages : merge);
    return l;
  }
};

// The (K, V) format pairs the kernel is compiled for: every mse bit pair
// and the four recipes at d = 128; the symmetric mse formats, K4/V2 and the
// recipes at 64, 96 and 256 — where their rows are whole 4-byte words (the
// stages are filled by 4-byte copies: turboquant25 at 64 and turboquant35
// at 96 are not) and, at 256, without QJL (a QJL recipe's state of 512
// floats is more accumulators than a lane holds).
inline constexpr int kTileBits[] = {2, 3, 4, 5, 8};
inline constexpr int kMaxFormatTiles = 25 + 4 + 10 + 10 + 8;

struct FormatTilesList {
  std::array<FormatTilesEntry, kMaxFormatTiles> entry = {};
  int count = 0;
};
constexpr FormatTilesList MakeFormatTiles() {
  FormatTilesList out;
  auto add = [&](const TileFormat& k, const TileFormat& v) {
    if (k.row_bytes % 4 == 0 && v.row_bytes % 4 == 0) out.entry[out.count++] = {k, v};
  };
  auto recipes = [&](int dim, bool with_qjl) {
    for (bool qjl : {true, false}) {
      if (qjl && !with_qjl) continue;
      add(Tq25TileFormat(dim, qjl), Tq25TileFormat(dim, qjl));
      add(Tq35TileFormat(dim, qjl), Tq35TileFormat(dim, qjl));
    }
  };
  for (int kb : kTileBits)
    for (int vb : kTileBits) add(MseTileFormat(128, kb), MseTileFormat(128, vb));
  recipes(128, true);
  for (int dim : {64, 96, 256}) {
    for (int b : kTileBits) add(MseTileFormat(dim, b), MseTileFormat(dim, b));
    add(MseTileFormat(dim, 4), MseTileFormat(dim, 2));
    recipes(dim, dim != 256);
  }
  return out;
}
inline constexpr FormatTilesList kFormatTilesList = MakeFormatTiles();
inline constexpr int kNumFormatTiles = kFormatTilesList.count;
inline constexpr std::array<FormatTilesEntry, kMaxFormatTiles> kFormatTiles = kFormatTilesList.entry;

// Resident blocks per SM the kernel's registers are budgeted for.
constexpr int FormatTilesBlocksPerSm(const FormatTilesEntry& e) { return e.k.state + e.v.state > 256 ? 2 : 4; }

// The entry of kFormatTiles whose formats the launch's host descriptors
// have (and whose layout the kernel can read: 4-byte aligned rows and
// pages, power-of-two blocks of whole 16-token tiles, GQA group <= 8), or
// -1.
int FormatTilesIndex(const AttentionLaunch& a);
// Blocks of the kernel resident per SM for entry `index`.
int FormatTilesResident(int index);
// Launches the kernel over the packed splits of `d` (all of them, or those
// before d.tail_split) for entry d.format_tiles (gpu/attention_format_tiles.cu).
cudaError_t LaunchFormatTiles(const AttentionLaunch& a, const AttnDims& d, const float* states, float* records,
                              cudaStream_t stream);

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_FORMAT_TILES_H_
