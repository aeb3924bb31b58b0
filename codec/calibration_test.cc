#include "codec/calibration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "codec/metadata.h"
#include "codec/seed.h"

namespace tqkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kLayers = 3;
constexpr int kHeads = 2;
constexpr int kHeadSize = 128;

// A deterministic set of `k` distinct channels for (layer, component, head),
// returned ascending.
std::vector<int> PlantedChannels(int layer, Component c, int head, int k) {
  std::vector<int> all(kHeadSize);
  std::iota(all.begin(), all.end(), 0);
  SplitMixStream rng(DeriveSeed(/*model_seed=*/7, layer, head, c));
  for (int i = kHeadSize - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(all[i], all[rng.Next() % (i + 1)]);
  }
  all.resize(k);
  std::sort(all.begin(), all.end());
  return all;
}

// [tokens, kHeads, kHeadSize] activations: noise in (-1, 1) on every channel,
// ±(3 + noise) on the planted ones, so planted channels carry far more energy.
std::vector<float> Activations(int layer, Component c, int k, int tokens, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(tokens) * kHeads * kHeadSize);
  SplitMixStream rng(seed);
  for (float& v : x) v = static_cast<float>(2 * rng.NextUniform() - 1);
  for (int h = 0; h < kHeads; ++h) {
    for (int ch : PlantedChannels(layer, c, h, k)) {
      for (int t = 0; t < tokens; ++t) {
        float& v = x[(static_cast<size_t>(t) * kHeads + h) * kHeadSize + ch];
        v = (v < 0 ? -3.0f : 3.0f) + v;
      }
    }
  }
  return x;
}

// Observes every (layer, component) with `tokens` tokens, in two calls.
ActivationEnergyAccumulator CalibratedAccumulator(int k, int tokens) {
  ActivationEnergyAccumulator acc(kLayers, kHeads, kHeadSize);
  uint64_t seed = 1;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (Component c : {Component::kKey, Component::kValue}) {
      std::vector<float> x = Activations(layer, c, k, tokens, seed++);
      const int first = tokens / 3;
      const size_t row = kHeads * kHeadSize;
      EXPECT_TRUE(acc.Observe(layer, c, x.data(), first).ok());
      EXPECT_TRUE(acc.Observe(layer, c, x.data() + first * row, tokens - first).ok());
    }
  }
  return acc;
}

TEST(ActivationEnergyTest, FindsPlantedHighEnergyChannels) {
  for (const char* recipe : {"turboquant25", "turboquant35"}) {
    const int k = *HighPrecisionChannelCount(recipe, kHeadSize);
    ActivationEnergyAccumulator acc = CalibratedAccumulator(k, /*tokens=*/50);
    absl::StatusOr<RecipeMetadata> meta = acc.BuildMetadata(recipe, "synthetic");
    ASSERT_TRUE(meta.ok()) << meta.status();
    ASSERT_EQ(meta->layers.size(), static_cast<size_t>(kLayers));
    for (int layer = 0; layer < kLayers; ++layer) {
      absl::StatusOr<const LayerChannels*> channels = LayerByIndex(*meta, layer);
      ASSERT_TRUE(channels.ok()) << channels.status();
      ASSERT_EQ((*channels)->num_kv_heads(), kHeads);
      for (int h = 0; h < kHeads; ++h) {
        EXPECT_EQ((*channels)->key[h], PlantedChannels(layer, Component::kKey, h, k))
            << recipe << " layer " << layer << " head " << h;
        EXPECT_EQ((*channels)->value[h], PlantedChannels(layer, Component::kValue, h, k))
            << recipe << " layer " << layer << " head " << h;
      }
    }
    // The planted sets differ between K and V and between heads, so a mix-up shows.
    EXPECT_NE(PlantedChannels(0, Component::kKey, 0, k), PlantedChannels(0, Component::kValue, 0, k));
    EXPECT_NE(PlantedChannels(0, Component::kKey, 0, k), PlantedChannels(0, Component::kKey, 1, k));
  }
}

TEST(ActivationEnergyTest, SumsSquaresPerHeadAndChannelInDouble) {
  ActivationEnergyAccumulator acc(1, 2, 16);
  std::vector<float> x(3 * 2 * 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i) - 2.0f;
  ASSERT_TRUE(acc.Observe(0, Component::kValue, x.data(), 3).ok());
  ASSERT_TRUE(acc.Observe(0, Component::kValue, x.data(), 1).ok());  // token 0 again
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 16; ++c) {
      double want = 0;
      for (int t = 0; t < 3; ++t) {
        double v = x[(t * 2 + h) * 16 + c];
        want += v * v;
      }
      double v0 = x[h * 16 + c];
      want += v0 * v0;
      EXPECT_DOUBLE_EQ(acc.Energy(0, Component::kValue, h, c), want) << h << " " << c;
      EXPECT_EQ(acc.Energy(0, Component::kKey, h, c), 0.0);
    }
  }
  EXPECT_EQ(acc.ObservedTokens(0, Component::kValue), 4);
  EXPECT_EQ(acc.ObservedTokens(0, Component::kKey), 0);
}

TEST(TopKChannelsTest, BreaksTiesTowardsTheLowerIndex) {
  EXPECT_THAT(TopKChannels({1, 5, 5, 5, 0}, 2), ElementsAre(1, 2));
  EXPECT_THAT(TopKChannels({5, 1, 5, 1, 5, 1}, 3), ElementsAre(0, 2, 4));
  EXPECT_THAT(TopKChannels({2, 3, 3, 2}, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(TopKChannels({0, 0, 0, 9}, 2), ElementsAre(0, 3));
  EXPECT_THAT(TopKChannels({4, 3, 2, 1}, 0), ElementsAre());
  EXPECT_THAT(TopKChannels({1, 2, 3}, 3), ElementsAre(0, 1, 2));
}

TEST(ActivationEnergyTest, EqualEnergiesSelectTheLowestChannels) {
  // Every channel carries the same energy (±1): the first k channels win.
  ActivationEnergyAccumulator acc(1, 1, 64);
  std::vector<float> x(5 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0) ? -1.0f : 1.0f;
  ASSERT_TRUE(acc.Observe(0, Component::kKey, x.data(), 5).ok());
  ASSERT_TRUE(acc.Observe(0, Component::kValue, x.data(), 5).ok());
  absl::StatusOr<RecipeMetadata> meta = acc.BuildMetadata("turboquant35", "ties");
  ASSERT_TRUE(meta.ok()) << meta.status();
  std::vector<int> first32(32);
  std::iota(first32.begin(), first32.end(), 0);
  EXPECT_EQ(meta->layers.at("model.layers.0.self_attn").key[0], first32);
  EXPECT_EQ(meta->layers.at("model.layers.0.self_attn").value[0], first32);
}

TEST(ActivationEnergyTest, ResultValidatesAndRoundTripsThroughJson) {
  const int k = *HighPrecisionChannelCount("turboquant25", kHeadSize);
  ActivationEnergyAccumulator acc = CalibratedAccumulator(k, /*tokens=*/20);
  // One extra value observation: the token count reported is the minimum.
  std::vector<float> x(kHeads * kHeadSize, 0.5f);
  ASSERT_TRUE(acc.Observe(1, Component::kValue, x.data(), 1).ok());

  absl::StatusOr<RecipeMetadata> meta = acc.BuildMetadata("turboquant25_noqjl", "my-model");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(ValidateMetadata(*meta).ok());
  EXPECT_TRUE(ValidateForModel(*meta, "turboquant25", kHeadSize, kHeads).ok());
  EXPECT_EQ(meta->recipe, "turboquant25_noqjl");
  EXPECT_EQ(meta->model_name, "my-model");
  EXPECT_EQ(meta->head_size, kHeadSize);
  ASSERT_TRUE(meta->calibration.has_value());
  EXPECT_EQ(meta->calibration->method, "activation_energy_v1");
  EXPECT_EQ(meta->calibration->objective, "sum_squared_activation");
  EXPECT_EQ(meta->calibration->num_observed_tokens, 20);

  meta->calibration->num_prompts = 128;
  meta->calibration->dtype = "float32";
  absl::StatusOr<RecipeMetadata> again = ParseMetadataJson(SerializeMetadataJson(*meta));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *meta);
}

TEST(ActivationEnergyTest, CustomLayerNameFormat) {
  ActivationEnergyAccumulator acc = CalibratedAccumulator(32, 4);
  absl::StatusOr<RecipeMetadata> meta =
      acc.BuildMetadata("turboquant25", "m", "language_model.model.layers.{i}.self_attn.attn");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->layers.count("language_model.model.layers.2.self_attn.attn"));
  EXPECT_TRUE(LayerByIndex(*meta, 2).ok());
  EXPECT_TRUE(FindLayer(*meta, "model.layers.1.self_attn").ok());

  absl::Status s = acc.BuildMetadata("turboquant25", "m", "model.layers.self_attn").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no {i} placeholder"));
}

TEST(ActivationEnergyTest, UnobservedLayerIsAFailedPrecondition) {
  ActivationEnergyAccumulator acc(kLayers, kHeads, kHeadSize);
  std::vector<float> x(kHeads * kHeadSize, 1.0f);
  for (int layer = 0; layer < kLayers; ++layer) {
    ASSERT_TRUE(acc.Observe(layer, Component::kKey, x.data(), 1).ok());
    if (layer != 1) {
      ASSERT_TRUE(acc.Observe(layer, Component::kValue, x.data(), 1).ok());
    }
  }
  absl::Status s = acc.BuildMetadata("turboquant35", "m").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("layer 1 ('model.layers.1.self_attn'): no value activations"));

  ActivationEnergyAccumulator empty(2, 1, 64);
  s = empty.BuildMetadata("turboquant35", "m").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("layer 0 ('model.layers.0.self_attn')"));
}

TEST(ActivationEnergyTest, ObserveRejectsBadInputWithoutAccumulating) {
  ActivationEnergyAccumulator acc(2, 1, 16);
  std::vector<float> x(3 * 16, 1.0f);
  EXPECT_EQ(acc.Observe(2, Component::kKey, x.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Observe(-1, Component::kKey, x.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Observe(0, Component::kKey, x.data(), -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Observe(0, Component::kKey, nullptr, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(acc.Observe(0, Component::kKey, nullptr, 0).ok());

  x[2 * 16 + 5] = std::numeric_limits<float>::quiet_NaN();
  absl::Status s = acc.Observe(0, Component::kKey, x.data(), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("at token 2, kv head 0, channel 5"));
  x[2 * 16 + 5] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(acc.Observe(0, Component::kKey, x.data(), 3).code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(acc.ObservedTokens(0, Component::kKey), 0);
  for (int c = 0; c < 16; ++c) EXPECT_EQ(acc.Energy(0, Component::kKey, 0, c), 0.0);
}

TEST(ActivationEnergyTest, BadDimensionsAndRecipes) {
  ActivationEnergyAccumulator bad(0, 1, 128);
  float x = 1.0f;
  EXPECT_EQ(bad.Observe(0, Component::kKey, &x, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.BuildMetadata("turboquant35", "m").status().code(),
            absl::StatusCode::kInvalidArgument);

  ActivationEnergyAccumulator acc = CalibratedAccumulator(32, 2);
  EXPECT_EQ(acc.BuildMetadata("tq4", "m").status().code(), absl::StatusCode::kInvalidArgument);
  ActivationEnergyAccumulator odd(1, 1, 100);  // not a multiple of 16
  EXPECT_EQ(odd.BuildMetadata("turboquant35", "m").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv
