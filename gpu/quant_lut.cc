#include "gpu/quant_lut.h"

#include <cmath>
#include <limits>

namespace tqkv::gpu {
namespace {

// Candidate parameters per cell count: cells per unit of y (K) from the
// most that keeps the boundaries inside the table down to half of it, and
// for each K a few positions of the first boundary within the spare room.
constexpr int kScaleSteps = 4096;
constexpr int kPhases = 8;

// True when the boundaries' cells are strictly increasing (then no cell
// holds two; the cells lie in [0, cells) by construction).
bool Separates(float scale, float offset, int cells, const float* b, int n) {
  uint32_t prev = QuantLutCell(scale, offset, cells, b[0]);
  for (int j = 1; j < n; ++j) {
    const uint32_t c = QuantLutCell(scale, offset, cells, b[j]);
    if (c <= prev) return false;
    prev = c;
  }
  return true;
}

QuantLut Fill(float scale, float offset, int cells, const float* b, int n) {
  QuantLut t;
  t.cells = cells;
  t.scale = scale;
  t.offset = offset;
  t.words.assign(2 * static_cast<size_t>(cells), 0);
  const float inf = std::numeric_limits<float>::infinity();
  uint32_t inf_bits;
  std::memcpy(&inf_bits, &inf, 4);
  for (int c = 0; c < cells; ++c) t.words[c] = inf_bits;
  std::vector<int> in_cell(cells, 0);
  for (int j = 0; j < n; ++j) {
    const uint32_t c = QuantLutCell(scale, offset, cells, b[j]);
    std::memcpy(&t.words[c], &b[j], 4);
    ++in_cell[c];
  }
  uint32_t below = 0;
  for (int c = 0; c < cells; ++c) {
    t.words[cells + c] = below;
    below += in_cell[c];
  }
  return t;
}

}  // namespace

std::optional<QuantLut> BuildQuantLut(const float* b, int n, int max_cells) {
  if (n < 1) return std::nullopt;
  for (int j = 0; j < n; ++j)
    if (!std::isfinite(b[j]) || (j > 0 && !(b[j] > b[j - 1]))) return std::nullopt;
  const double lo = b[0], span = static_cast<double>(b[n - 1]) - lo;
  for (int cells = 2; cells <= max_cells && cells <= (1 << 22); cells *= 2) {
    if (cells < n) continue;  // n boundaries need n cells
    const double m = cells - 1;
    // u = y·scale + offset = (K·(y − b0) + phase) / m puts b0 at cell
    // ≈ phase and b_{n−1} at ≈ phase + K·span <= m.
    const double k_max = span > 0 ? m / span : 1.0;
    for (int s = 0; s < kScaleSteps; ++s) {
      const double k = k_max * (1.0 - 0.5 * s / kScaleSteps);
      const double room = m - k * span;
      for (int p = 0; p < kPhases; ++p) {
        const double phase = room * (p + 0.5) / kPhases;
        const float scale = static_cast<float>(k / m);
        const float offset = static_cast<float>((phase - k * lo) / m);
        if (scale > 0.0f && std::isfinite(scale) && std::isfinite(offset) &&
            Separates(scale, offset, cells, b, n))
          return Fill(scale, offset, cells, b, n);
      }
    }
  }
  return std::nullopt;
}

}  // namespace tqkv::gpu
