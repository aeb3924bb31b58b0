// Helpers for codec tests: deterministic random tensors and recipe metadata.
#ifndef TQKV_CODEC_TEST_UTIL_H_
#define TQKV_CODEC_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "codec/dtype.h"
#include "codec/metadata.h"

namespace tqkv::testing_util {

// Gaussian floats, with `outliers` channels (the first ones of each row after
// a fixed stride pattern) scaled by `outlier_scale`.
inline std::vector<float> RandomRows(int64_t rows, int dim, uint64_t seed, int outliers = 0,
                                     float outlier_scale = 8.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n;
  std::vector<float> x(static_cast<size_t>(rows) * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < dim; ++j)
      x[r * dim + j] = n(rng) * ((j % 7 == 3 && j / 7 < outliers) ? outlier_scale : 1.0f);
  return x;
}

inline std::vector<uint16_t> ToHalf(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  FromFloat(DType::kF16, x.data(), h.data(), x.size());
  return h;
}

// Metadata for `layers` layers × `heads` heads: high channels every
// dim/count-th channel starting at `phase`.
inline RecipeMetadata MakeMetadata(const std::string& recipe, int dim, int layers, int heads) {
  RecipeMetadata m;
  m.recipe = recipe;
  m.head_size = dim;
  const int count = *HighPrecisionChannelCount(recipe, dim);
  for (int l = 0; l < layers; ++l) {
    LayerChannels lc;
    for (int h = 0; h < heads; ++h) {
      std::vector<int> k, v;
      for (int i = 0; i < count; ++i) {
        k.push_back((i * dim / count + (l + h) % (dim / count)));
        v.push_back((i * dim / count + (l + 2 * h + 1) % (dim / count)));
      }
      lc.key.push_back(k);
      lc.value.push_back(v);
    }
    m.layers["model.layers." + std::to_string(l) + ".self_attn"] = lc;
  }
  return m;
}

}  // namespace tqkv::testing_util

#endif  // TQKV_CODEC_TEST_UTIL_H_
