// Uniform-cell quantisation tables for the specialised d = 128 encode
// (gpu/kernels/encode_fast.cuh): the index of a rotated, scaled value y —
// the number of fp32 codebook boundaries strictly below y, NaN → 0
// (codec/codebook.h) — as one table lookup and one compare instead of a
// search over the boundaries.
//
// The device computes, for every float y (NaN, ±inf, ±0, denormals included):
//   u = fma.rn.sat(y, scale, offset)            in [0, 1]; NaN → +0
//   t = fma.rn(u, (cells − 1)·2^-22, 2)         = 2 + rne(u·(cells − 1))·2^-22, exactly
//                                               (floats in [2, 4) are 2^-22 apart)
//   c = bits(t) − bits(2)                       the cell, in [0, cells)
//   index = base[c] + (y > bnd[c])
// (bits(t)·4 is then the byte offset 4c modulo 2^32: one LEA forms the
// shared-memory address.)
// Each step is monotone non-decreasing in y, so cell(b) < cell(y) implies
// b < y and cell(b) > cell(y) implies b > y. If no cell holds two
// boundaries, base[c] = number of boundaries whose cell is < c and bnd[c] =
// the boundary whose cell is c (+inf if none) give the exact count. NaN:
// u = +0, c = 0, base[0] = 0 and NaN > bnd[0] is false, so index 0 per value.
//
// Pure host math (no CUDA); QuantLutCell / QuantLutIndex below are the
// device computation bit for bit (std::fmaf is correctly rounded like the
// GPU's fma.rn; the kernels keep denormals, no --use_fast_math).
#ifndef TQKV_GPU_QUANT_LUT_H_
#define TQKV_GPU_QUANT_LUT_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "gpu/gpu_codec.h"

namespace tqkv::gpu {

struct QuantLut {
  int cells = 0;       // a power of two in [2, 2^22]
  float scale = 0;     // > 0
  float offset = 0;
  // [2 · cells] words: bnd[c] (fp32 bit patterns, +inf where no boundary)
  // at [0, cells), base[c] at [cells, 2 · cells).
  std::vector<uint32_t> words;
  float bnd(int c) const {
    float f;
    std::memcpy(&f, &words[c], 4);
    return f;
  }
  uint32_t base(int c) const { return words[cells + c]; }
};

// The cell of y, exactly as the device computes it (see the file comment).
inline uint32_t QuantLutCell(float scale, float offset, int cells, float y) {
  float u = std::fmaf(y, scale, offset);
  u = u > 0.0f ? (u < 1.0f ? u : 1.0f) : 0.0f;  // .sat: clamp to [0, 1], NaN → +0 (the sign of 0 is moot below)
  const float t = std::fmaf(u, static_cast<float>(cells - 1) * kLutUlp, kLutMagic);
  uint32_t bits;
  std::memcpy(&bits, &t, 4);
  return bits - kLutMagicBits;
}

// The index of y through table t, exactly as the device computes it.
inline int QuantLutIndex(const QuantLut& t, float y) {
  const uint32_t c = QuantLutCell(t.scale, t.offset, t.cells, y);
  return static_cast<int>(t.base(static_cast<int>(c))) + (y > t.bnd(static_cast<int>(c)) ? 1 : 0);
}

// Returns a table with as few cells as the search finds (a power of two,
// at most max_cells and 2^22) in which no cell holds two of the n
// boundaries, verified by evaluating QuantLutCell on every boundary;
// QuantLutIndex through it then equals the count of boundaries strictly
// below y for every float y. Returns std::nullopt — the caller keeps
// searching the boundaries — when the search finds no such table within
// max_cells (boundaries closer together than the cells can resolve), n < 1,
// or the boundaries are not finite and strictly ascending. Deterministic;
// tries at most 32768 (scale, offset) pairs per cell count (about 1 ms for
// a 255-boundary codebook).
std::optional<QuantLut> BuildQuantLut(const float* boundaries, int n, int max_cells);

}  // namespace tqkv::gpu

#endif  // TQKV_GPU_QUANT_LUT_H_
