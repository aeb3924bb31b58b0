// Activation-energy calibration of recipe metadata (reference §4).
//
// For every (layer, K|V, kv head, channel) the accumulator sums the squared
// activations over every observed token, in double. The high-precision group
// of a (layer, component, kv head) is then its k highest-energy channels
// (k = HighPrecisionChannelCount), ties broken towards the lower channel
// index, listed in ascending order.
//
// Feed it what the cache actually stores: post-RoPE keys and values, real
// tokens only (no padding). Scoring pre-RoPE k_proj outputs, as one reference
// did, ranks channels the cache never sees.
#ifndef TQKV_CODEC_CALIBRATION_H_
#define TQKV_CODEC_CALIBRATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/metadata.h"
#include "codec/seed.h"  // Component

namespace tqkv {

inline constexpr char kActivationEnergyMethod[] = "activation_energy_v1";
inline constexpr char kActivationEnergyObjective[] = "sum_squared_activation";
inline constexpr char kDefaultLayerNameFormat[] = "model.layers.{i}.self_attn";

// Not thread-safe: callers serialise Observe/BuildMetadata (a calibration run
// observes layers one after another). Copyable value type.
class ActivationEnergyAccumulator {
 public:
  // REQUIRES: num_layers, num_kv_heads, head_size >= 1. With any of them < 1
  // every Observe and BuildMetadata returns INVALID_ARGUMENT.
  ActivationEnergyAccumulator(int num_layers, int num_kv_heads, int head_size);

  // Adds x[t][h][c]² to energy(layer, component, h, c) for t < tokens, where x
  // is row-major [tokens, num_kv_heads, head_size] fp32 (not retained), and
  // adds `tokens` to the (layer, component) token count.
  // OK; INVALID_ARGUMENT when layer is outside [0, num_layers), tokens < 0,
  // x is null with tokens > 0, or x holds a NaN or infinity (naming the
  // token, head and channel); on error nothing is added.
  absl::Status Observe(int layer, Component component, const float* x, int64_t tokens);

  // Metadata for `recipe` (a base recipe or its _noqjl variant, stored as
  // given): for each layer i, the key "layer_name_format" with "{i}" replaced
  // by i holds, per kv head, the top-k channels by energy, ascending.
  // calibration = {method "activation_energy_v1", objective
  // "sum_squared_activation", num_observed_tokens = the fewest tokens any
  // (layer, component) observed}; the caller fills the remaining provenance
  // fields (prompts, dtype, device, ...). The result passes ValidateMetadata.
  // INVALID_ARGUMENT for an unknown recipe, a head size the recipe cannot
  // split, or a format without "{i}"; FAILED_PRECONDITION naming the layer and
  // component when a (layer, component) observed no tokens.
  absl::StatusOr<RecipeMetadata> BuildMetadata(
      const std::string& recipe, const std::string& model_name,
      const std::string& layer_name_format = kDefaultLayerNameFormat) const;

  // Accumulated energy (0 before any Observe). REQUIRES: all indices in range.
  double Energy(int layer, Component component, int kv_head, int channel) const;
  // Tokens observed for (layer, component). REQUIRES: layer in range.
  int64_t ObservedTokens(int layer, Component component) const;

  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_size() const { return head_size_; }

 private:
  size_t Slot(int layer, Component component) const {
    return static_cast<size_t>(layer) * 2 + static_cast<size_t>(component);
  }
  absl::Status CheckDims() const;

  int num_layers_;
  int num_kv_heads_;
  int head_size_;
  // energy_[Slot(layer, c)][h * head_size + channel]
  std::vector<std::vector<double>> energy_;
  std::vector<int64_t> tokens_;  // indexed by Slot
};

// The k channels of `energy` (one kv head, `energy.size()` channels) with the
// highest energy, ties broken towards the lower index, sorted ascending.
// REQUIRES: 0 <= k <= energy.size(); no NaN in `energy`.
std::vector<int> TopKChannels(const std::vector<double>& energy, int k);

}  // namespace tqkv

#endif  // TQKV_CODEC_CALIBRATION_H_
