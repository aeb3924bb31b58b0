#include "codec/calibration.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tqkv {
namespace {

const char* ComponentName(Component c) { return c == Component::kKey ? "key" : "value"; }

bool ValidComponent(Component c) { return c == Component::kKey || c == Component::kValue; }

}  // namespace

ActivationEnergyAccumulator::ActivationEnergyAccumulator(int num_layers, int num_kv_heads,
                                                         int head_size)
    : num_layers_(num_layers), num_kv_heads_(num_kv_heads), head_size_(head_size) {
  if (!CheckDims().ok()) return;
  const size_t slots = static_cast<size_t>(num_layers_) * 2;
  energy_.assign(slots, std::vector<double>(static_cast<size_t>(num_kv_heads_) * head_size_));
  tokens_.assign(slots, 0);
}

absl::Status ActivationEnergyAccumulator::CheckDims() const {
  if (num_layers_ < 1 || num_kv_heads_ < 1 || head_size_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "accumulator dimensions must be positive: num_layers=", num_layers_,
        " num_kv_heads=", num_kv_heads_, " head_size=", head_size_));
  }
  return absl::OkStatus();
}

absl::Status ActivationEnergyAccumulator::Observe(int layer, Component component, const float* x,
                                                  int64_t tokens) {
  TQ_RETURN_IF_ERROR(CheckDims());
  if (layer < 0 || layer >= num_layers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is outside [0, ", num_layers_, ")"));
  }
  if (!ValidComponent(component)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown component ", static_cast<int>(component)));
  }
  if (tokens < 0) return absl::InvalidArgumentError(absl::StrCat("tokens is negative: ", tokens));
  if (tokens == 0) return absl::OkStatus();
  if (x == nullptr) return absl::InvalidArgumentError("activations pointer is null");

  const size_t row = static_cast<size_t>(num_kv_heads_) * head_size_;
  const size_t n = static_cast<size_t>(tokens) * row;
  // Validate first so that a rejected call leaves the sums untouched.
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      const size_t t = i / row, h = (i % row) / head_size_, c = i % head_size_;
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", layer, " ", ComponentName(component), ": non-finite activation ", x[i],
          " at token ", t, ", kv head ", h, ", channel ", c));
    }
  }
  std::vector<double>& energy = energy_[Slot(layer, component)];
  for (size_t t = 0; t < static_cast<size_t>(tokens); ++t) {
    const float* r = x + t * row;
    for (size_t j = 0; j < row; ++j) {
      const double v = r[j];
      energy[j] += v * v;
    }
  }
  tokens_[Slot(layer, component)] += tokens;
  return absl::OkStatus();
}

double ActivationEnergyAccumulator::Energy(int layer, Component component, int kv_head,
                                           int channel) const {
  return energy_[Slot(layer, component)][static_cast<size_t>(kv_head) * head_size_ + channel];
}

int64_t ActivationEnergyAccumulator::ObservedTokens(int layer, Component component) const {
  return tokens_[Slot(layer, component)];
}

std::vector<int> TopKChannels(const std::vector<double>& energy, int k) {
  std::vector<int> order(energy.size());
  std::iota(order.begin(), order.end(), 0);
  // Strict weak order: higher energy first, then lower index.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    if (energy[a] != energy[b]) return energy[a] > energy[b];
    return a < b;
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

absl::StatusOr<RecipeMetadata> ActivationEnergyAccumulator::BuildMetadata(
    const std::string& recipe, const std::string& model_name,
    const std::string& layer_name_format) const {
  TQ_RETURN_IF_ERROR(CheckDims());
  TQ_ASSIGN_OR_RETURN(int k, HighPrecisionChannelCount(recipe, head_size_));
  const std::string placeholder = "{i}";
  const size_t at = layer_name_format.find(placeholder);
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer name format '", layer_name_format, "' has no {i} placeholder"));
  }

  RecipeMetadata meta;
  meta.recipe = recipe;
  meta.head_size = head_size_;
  meta.model_name = model_name;
  int64_t min_tokens = -1;
  for (int layer = 0; layer < num_layers_; ++layer) {
    std::string name = layer_name_format;
    name.replace(at, placeholder.size(), std::to_string(layer));
    LayerChannels channels;
    for (Component c : {Component::kKey, Component::kValue}) {
      const int64_t tokens = tokens_[Slot(layer, c)];
      if (tokens == 0) {
        return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " ('", name,
                                                          "'): no ", ComponentName(c),
                                                          " activations were observed"));
      }
      min_tokens = min_tokens < 0 ? tokens : std::min(min_tokens, tokens);
      const std::vector<double>& energy = energy_[Slot(layer, c)];
      auto& lists = c == Component::kKey ? channels.key : channels.value;
      for (int h = 0; h < num_kv_heads_; ++h) {
        std::vector<double> head(energy.begin() + static_cast<size_t>(h) * head_size_,
                                 energy.begin() + static_cast<size_t>(h + 1) * head_size_);
        lists.push_back(TopKChannels(head, k));
      }
    }
    meta.layers.emplace(std::move(name), std::move(channels));
  }

  CalibrationInfo info;
  info.method = kActivationEnergyMethod;
  info.objective = kActivationEnergyObjective;
  info.num_observed_tokens = min_tokens;
  meta.calibration = std::move(info);
  // Catches a format that maps two layers to one name or to alias-equal names.
  if (static_cast<int>(meta.layers.size()) != num_layers_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer name format '", layer_name_format, "' gives distinct layers the same name"));
  }
  absl::Status valid = ValidateMetadata(meta);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibrated metadata is invalid: ", valid.message()));
  }
  return meta;
}

}  // namespace tqkv
