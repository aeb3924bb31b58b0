#include "codec/metadata.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tqkv {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kLayer0[] = "model.layers.0.self_attn";
constexpr char kLayer3[] = "model.layers.3.self_attn";

// Kv head h selects channels [h, h + count): distinct per head, so slicing
// can be checked by content.
std::vector<std::vector<int>> HeadLists(int heads, int count) {
  std::vector<std::vector<int>> lists(heads, std::vector<int>(count));
  for (int h = 0; h < heads; ++h) std::iota(lists[h].begin(), lists[h].end(), h);
  return lists;
}

// A valid turboquant35 document at head_size 128 with layers 0 and 3.
Json ValidDoc(int heads = 2) {
  Json layer = {{"key_high_precision_indices", HeadLists(heads, 64)},
                {"value_high_precision_indices", HeadLists(heads, 64)}};
  return {
      {"version", 1},
      {"recipe", "turboquant35"},
      {"head_size", 128},
      {"model_name", "test-model"},
      {"transform_version", "structured_hadamard_v1"},
      {"codebook_version", "lloyd_beta_v1"},
      {"layers", {{kLayer0, layer}, {kLayer3, layer}}},
      {"calibration",
       {{"method", "activation_energy_v1"},
        {"objective", "sum_squared_activation"},
        {"num_prompts", 128},
        {"max_seq_len", 2048},
        {"batch_size", 4},
        {"num_observed_tokens", 1000},
        {"dtype", "bfloat16"},
        {"device", "cuda"},
        {"prompts_sha256", "abc123"}}},
  };
}

absl::Status ParseStatus(const Json& doc) { return ParseMetadataJson(doc.dump()).status(); }

// Asserts that `doc` is rejected with INVALID_ARGUMENT and `substring`.
void ExpectInvalid(const Json& doc, const std::string& substring) {
  absl::Status s = ParseStatus(doc);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(substring));
}

Json& Key(Json& doc, const char* layer) {
  return doc["layers"][layer]["key_high_precision_indices"];
}
Json& Value(Json& doc, const char* layer) {
  return doc["layers"][layer]["value_high_precision_indices"];
}

RecipeMetadata ValidMeta(int heads = 2) {
  absl::StatusOr<RecipeMetadata> meta = ParseMetadataJson(ValidDoc(heads).dump());
  EXPECT_TRUE(meta.ok()) << meta.status();
  return *meta;
}

// ---- Channel counts ----

TEST(HighPrecisionChannelCountTest, MatchesReferenceAtCommonHeadSizes) {
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant25", 128), 32);
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant35", 128), 64);
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant25", 64), 16);
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant35", 64), 32);
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant25", 256), 64);
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant35", 256), 128);
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant25", 96), 32);  // 1.5 → 2
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant25_noqjl", 128), 32);
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant35_noqjl", 128), 64);
}

TEST(HighPrecisionChannelCountTest, RoundsHalfToEvenLikeThePythonWriter) {
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant35", 80), 32);   // 2.5 → 2
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant35", 112), 64);  // 3.5 → 4
  EXPECT_EQ(*HighPrecisionChannelCount("turboquant25", 160), 32);  // 2.5 → 2
}

TEST(HighPrecisionChannelCountTest, RejectsBadInput) {
  EXPECT_EQ(HighPrecisionChannelCount("turboquant99", 128).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HighPrecisionChannelCount("tq4", 128).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HighPrecisionChannelCount("turboquant35", 130).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HighPrecisionChannelCount("turboquant35", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Empty high group (16·0.25 → 0) and a group that is the whole head (32·0.25 → 0.5 → 0).
  EXPECT_THAT(std::string(HighPrecisionChannelCount("turboquant25", 16).status().message()),
              HasSubstr("no high-precision group"));
  EXPECT_FALSE(HighPrecisionChannelCount("turboquant25", 32).ok());
  EXPECT_FALSE(HighPrecisionChannelCount("turboquant35", 16).ok());
}

// ---- Parsing valid documents ----

TEST(ParseMetadataTest, ParsesEveryField) {
  RecipeMetadata meta = ValidMeta();
  EXPECT_EQ(meta.version, 1);
  EXPECT_EQ(meta.recipe, "turboquant35");
  EXPECT_EQ(meta.head_size, 128);
  EXPECT_EQ(meta.model_name, "test-model");
  EXPECT_EQ(meta.transform_version, "structured_hadamard_v1");
  EXPECT_EQ(meta.codebook_version, "lloyd_beta_v1");
  ASSERT_EQ(meta.layers.size(), 2u);
  const LayerChannels& layer = meta.layers.at(kLayer3);
  EXPECT_EQ(layer.num_kv_heads(), 2);
  EXPECT_EQ(layer.key, HeadLists(2, 64));
  EXPECT_EQ(layer.value, HeadLists(2, 64));
  ASSERT_TRUE(meta.calibration.has_value());
  EXPECT_EQ(meta.calibration->method, "activation_energy_v1");
  EXPECT_EQ(meta.calibration->objective, "sum_squared_activation");
  EXPECT_EQ(meta.calibration->num_prompts, 128);
  EXPECT_EQ(meta.calibration->max_seq_len, 2048);
  EXPECT_EQ(meta.calibration->batch_size, 4);
  EXPECT_EQ(meta.calibration->num_observed_tokens, 1000);
  EXPECT_EQ(meta.calibration->dtype, "bfloat16");
  EXPECT_EQ(meta.calibration->device, "cuda");
  EXPECT_EQ(meta.calibration->prompts_sha256, "abc123");
}

TEST(ParseMetadataTest, AcceptsNoQjlRecipeNames) {
  Json doc = ValidDoc();
  doc["recipe"] = "turboquant35_noqjl";
  absl::StatusOr<RecipeMetadata> meta = ParseMetadataJson(doc.dump());
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->recipe, "turboquant35_noqjl");
}

TEST(ParseMetadataTest, AcceptsUnknownFieldsAndOptionalOnes) {
  Json doc = ValidDoc();
  doc["future_field"] = {{"anything", 1}};
  doc["layers"][kLayer0]["codebook"] = "custom";
  doc["calibration"]["extra"] = true;
  doc["model_name"] = nullptr;
  doc.erase("transform_version");
  doc.erase("codebook_version");
  absl::StatusOr<RecipeMetadata> meta = ParseMetadataJson(doc.dump());
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->model_name, "");
  EXPECT_EQ(meta->transform_version, kDefaultTransformVersion);
  EXPECT_EQ(meta->codebook_version, kDefaultCodebookVersion);

  doc.erase("calibration");
  meta = ParseMetadataJson(doc.dump());
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_FALSE(meta->calibration.has_value());
}

TEST(ParseMetadataTest, AcceptsTurboQuant25) {
  Json doc = ValidDoc();
  doc["recipe"] = "turboquant25";
  for (const char* layer : {kLayer0, kLayer3}) {
    Key(doc, layer) = HeadLists(2, 32);
    Value(doc, layer) = HeadLists(2, 32);
  }
  EXPECT_TRUE(ParseStatus(doc).ok()) << ParseStatus(doc);
}

// ---- One malformed document per validation rule ----

TEST(MetadataValidationTest, MalformedJsonReportsParserPosition) {
  absl::Status s = ParseMetadataJson("{\"version\": 1,\n \"recipe\": }").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("malformed metadata JSON"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("line 2, column 12"));
  EXPECT_EQ(ParseMetadataJson("").status().code(), absl::StatusCode::kInvalidArgument);
}

// A deeply nested document is refused before anything is built (a tree
// 100,000 levels deep would overflow the stack when printed or destroyed);
// brackets inside strings do not count.
TEST(MetadataValidationTest, DeepNestingIsRejected) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  absl::Status s = ParseMetadataJson(deep).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("100000 levels deep"));
  const std::string layers = "{\"version\": 1, \"layers\": " + std::string(40, '[') + std::string(40, ']') + "}";
  EXPECT_THAT(std::string(ParseMetadataJson(layers).status().message()), HasSubstr("41 levels deep"));
  Json doc = ValidDoc();
  doc["model_name"] = std::string(1000, '[') + "\"\\" + std::string(1000, '{');
  EXPECT_TRUE(ParseMetadataJson(doc.dump()).ok()) << ParseMetadataJson(doc.dump()).status();
}

TEST(MetadataValidationTest, RootMustBeAnObject) {
  ExpectInvalid(Json::array({1, 2}), "metadata root must be a JSON object");
}

TEST(MetadataValidationTest, DuplicateKeysAreRejected) {
  std::string text = ValidDoc().dump();
  // Repeat layer 0 under the same name: nlohmann would silently keep one.
  Json layer = ValidDoc()["layers"][kLayer0];
  std::string dup = std::string("\"") + kLayer0 + "\":" + layer.dump() + ",";
  size_t at = text.find(std::string("\"") + kLayer0 + "\"");
  ASSERT_NE(at, std::string::npos);
  text.insert(at, dup);
  absl::Status s = ParseMetadataJson(text).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("duplicate key 'model.layers.0.self_attn'"));
}

TEST(MetadataValidationTest, Version) {
  Json doc = ValidDoc();
  doc.erase("version");
  ExpectInvalid(doc, "missing required field 'version'");
  doc["version"] = 2;
  ExpectInvalid(doc, "unsupported metadata version 2");
  doc["version"] = "1";
  ExpectInvalid(doc, "version must be an integer, got \"1\"");
}

TEST(MetadataValidationTest, Recipe) {
  Json doc = ValidDoc();
  doc.erase("recipe");
  ExpectInvalid(doc, "missing required field 'recipe'");
  doc["recipe"] = "turboquant99";
  ExpectInvalid(doc, "recipe: unknown recipe 'turboquant99'");
  doc["recipe"] = 35;
  ExpectInvalid(doc, "recipe must be a string, got 35");
}

TEST(MetadataValidationTest, HeadSizeMustBePresentAndAnInteger) {
  Json doc = ValidDoc();
  doc.erase("head_size");
  ExpectInvalid(doc, "missing required field 'head_size'");
  doc["head_size"] = 128.5;
  ExpectInvalid(doc, "head_size must be an integer, got 128.5");
  doc["head_size"] = 128.0;
  ExpectInvalid(doc, "head_size must be an integer, got 128.0");
  doc["head_size"] = "128";
  ExpectInvalid(doc, "head_size must be an integer, got \"128\"");
  doc["head_size"] = true;
  ExpectInvalid(doc, "head_size must be an integer, got true");
}

TEST(MetadataValidationTest, HeadSizeMustBeAMultipleOf16) {
  Json doc = ValidDoc();
  doc["head_size"] = 8;
  ExpectInvalid(doc, "head_size must be a multiple of 16 in [16, 65536], got 8");
  doc["head_size"] = 120;
  ExpectInvalid(doc, "head_size must be a multiple of 16 in [16, 65536], got 120");
  doc["head_size"] = -128;
  ExpectInvalid(doc, "got -128");
  doc["head_size"] = 1LL << 40;
  ExpectInvalid(doc, "got 1099511627776");
  doc["head_size"] = 16;  // a multiple of 16, but turboquant35 cannot split it
  ExpectInvalid(doc, "head_size: recipe turboquant35 has no high-precision group");
}

TEST(MetadataValidationTest, LayersMustBeANonEmptyObject) {
  Json doc = ValidDoc();
  doc.erase("layers");
  ExpectInvalid(doc, "missing required field 'layers'");
  doc["layers"] = Json::array();
  ExpectInvalid(doc, "layers must be an object");
  doc["layers"] = Json::object();
  ExpectInvalid(doc, "layers is empty");
}

TEST(MetadataValidationTest, LayerEntryMustBeAnObject) {
  Json doc = ValidDoc();
  doc["layers"][kLayer3] = Json::array({1});
  ExpectInvalid(doc, "layer 'model.layers.3.self_attn' must be an object");
}

TEST(MetadataValidationTest, LayerMustHaveBothFields) {
  Json doc = ValidDoc();
  doc["layers"][kLayer3].erase("key_high_precision_indices");
  ExpectInvalid(doc, "layer 'model.layers.3.self_attn': missing key_high_precision_indices");
  doc = ValidDoc();
  doc["layers"][kLayer3].erase("value_high_precision_indices");
  ExpectInvalid(doc, "layer 'model.layers.3.self_attn': missing value_high_precision_indices");
}

TEST(MetadataValidationTest, IndicesMustBeAListOfLists) {
  Json doc = ValidDoc();
  Key(doc, kLayer3) = {{"0", 1}};
  ExpectInvalid(doc,
                "layer 'model.layers.3.self_attn': key_high_precision_indices must be a list of "
                "lists (one per kv head)");
  Key(doc, kLayer3) = Json::array({1, 2, 3});
  ExpectInvalid(doc,
                "layer 'model.layers.3.self_attn': key_high_precision_indices[0] must be a list "
                "of integers, got 1");
}

TEST(MetadataValidationTest, IndexMustBeAnInteger) {
  for (const Json& bad : {Json(3.5), Json("3"), Json(true), Json(nullptr)}) {
    Json doc = ValidDoc();
    Value(doc, kLayer3)[1][4] = bad;
    ExpectInvalid(doc,
                  "layer 'model.layers.3.self_attn': value_high_precision_indices[1][4] is not an "
                  "integer (got " +
                      bad.dump() + ")");
  }
}

TEST(MetadataValidationTest, KeyAndValueMustHaveTheSameHeadCount) {
  Json doc = ValidDoc();
  Value(doc, kLayer3) = HeadLists(1, 64);
  ExpectInvalid(doc,
                "layer 'model.layers.3.self_attn': key_high_precision_indices has 2 kv heads but "
                "value_high_precision_indices has 1");
}

TEST(MetadataValidationTest, AtLeastOneHead) {
  Json doc = ValidDoc();
  Key(doc, kLayer0) = Json::array();
  Value(doc, kLayer0) = Json::array();
  ExpectInvalid(doc, "layer 'model.layers.0.self_attn': key_high_precision_indices has no kv heads");
}

TEST(MetadataValidationTest, IndicesMustBeSorted) {
  Json doc = ValidDoc();
  Key(doc, kLayer3)[1][5] = 0;
  ExpectInvalid(doc,
                "layer 'model.layers.3.self_attn': key_high_precision_indices[1] is not sorted "
                "ascending at position 5 (0 after 5)");
}

TEST(MetadataValidationTest, IndicesMustBeUnique) {
  Json doc = ValidDoc();
  Value(doc, kLayer0)[0][10] = 9;
  ExpectInvalid(doc,
                "layer 'model.layers.0.self_attn': value_high_precision_indices[0] has duplicate "
                "index 9 at position 10");
}

TEST(MetadataValidationTest, IndicesMustBeInRange) {
  Json doc = ValidDoc();
  Key(doc, kLayer3)[1][63] = 128;
  ExpectInvalid(doc,
                "layer 'model.layers.3.self_attn': key_high_precision_indices[1][63] = 128 is out "
                "of range [0, 128)");
  doc = ValidDoc();
  Key(doc, kLayer3)[0][0] = -1;
  ExpectInvalid(doc, "key_high_precision_indices[0][0] = -1 is out of range [0, 128)");
  doc = ValidDoc();
  Key(doc, kLayer3)[0][63] = 1ULL << 63;
  ExpectInvalid(doc, "key_high_precision_indices[0][63] = 9223372036854775808 is out of range");
}

TEST(MetadataValidationTest, CountMustMatchTheRecipe) {
  Json doc = ValidDoc();
  Key(doc, kLayer3)[1].erase(63);
  ExpectInvalid(doc,
                "layer 'model.layers.3.self_attn': key_high_precision_indices[1] has 63 indices; "
                "recipe turboquant35 at head_size 128 needs 64");
  doc = ValidDoc();
  doc["recipe"] = "turboquant25";  // 64 per head, but turboquant25 needs 32
  ExpectInvalid(doc, "has 64 indices; recipe turboquant25 at head_size 128 needs 32");
}

TEST(MetadataValidationTest, LayerNamesMustBeDistinctAfterAliasNormalisation) {
  Json doc = ValidDoc();
  doc["layers"]["language_model.model.layers.0.self_attn.attn"] = doc["layers"][kLayer0];
  ExpectInvalid(doc, "name the same layer after alias normalisation ('model.layers.0.self_attn')");
}

TEST(MetadataValidationTest, OtherFieldsMustHaveTheirTypes) {
  Json doc = ValidDoc();
  doc["model_name"] = 7;
  ExpectInvalid(doc, "model_name must be a string or null, got 7");
  doc = ValidDoc();
  doc["transform_version"] = 1;
  ExpectInvalid(doc, "transform_version must be a string, got 1");
  doc = ValidDoc();
  doc["calibration"] = "yes";
  ExpectInvalid(doc, "calibration must be an object or null");
  doc = ValidDoc();
  doc["calibration"]["num_prompts"] = "128";
  ExpectInvalid(doc, "calibration.num_prompts must be a non-negative integer");
  doc = ValidDoc();
  doc["calibration"]["device"] = 0;
  ExpectInvalid(doc, "calibration.device must be a string");
}

TEST(MetadataValidationTest, ValidateMetadataChecksInMemoryDocuments) {
  RecipeMetadata meta = ValidMeta();
  EXPECT_TRUE(ValidateMetadata(meta).ok());
  meta.layers[kLayer3].key[1][5] = 0;
  absl::Status s = ValidateMetadata(meta);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("layer 'model.layers.3.self_attn': key_high_precision_indices[1] is not "
                        "sorted"));
  meta = ValidMeta();
  meta.version = 3;
  EXPECT_EQ(ValidateMetadata(meta).code(), absl::StatusCode::kInvalidArgument);
}

// ---- Serialisation and files ----

TEST(SerializeMetadataTest, RoundTrips) {
  RecipeMetadata meta = ValidMeta();
  std::string text = SerializeMetadataJson(meta);
  absl::StatusOr<RecipeMetadata> again = ParseMetadataJson(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, meta);
  EXPECT_EQ(SerializeMetadataJson(*again), text);
  EXPECT_EQ(text.back(), '\n');

  meta.calibration.reset();
  meta.model_name = "";
  again = ParseMetadataJson(SerializeMetadataJson(meta));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, meta);
}

TEST(SerializeMetadataTest, WritesTheDocumentedFieldNames) {
  Json doc = Json::parse(SerializeMetadataJson(ValidMeta()));
  EXPECT_EQ(doc, ValidDoc());
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(MetadataFileTest, SaveThenLoad) {
  const std::string path = TempPath("turboquant_kv.json");
  RecipeMetadata meta = ValidMeta();
  ASSERT_TRUE(SaveMetadataFile(meta, path).ok());
  absl::StatusOr<RecipeMetadata> loaded = LoadMetadataFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, meta);
}

TEST(MetadataFileTest, LoadErrors) {
  EXPECT_EQ(LoadMetadataFile(TempPath("does_not_exist.json")).status().code(),
            absl::StatusCode::kNotFound);
  const std::string path = TempPath("bad.json");
  {
    std::ofstream out(path);
    out << "{\"version\": 1}";
  }
  absl::Status s = LoadMetadataFile(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(path + ": missing required field 'recipe'"));
}

TEST(MetadataFileTest, SaveRejectsInvalidMetadataWithoutWriting) {
  const std::string path = TempPath("invalid.json");
  RecipeMetadata meta = ValidMeta();
  meta.head_size = 100;
  EXPECT_EQ(SaveMetadataFile(meta, path).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadMetadataFile(path).status().code(), absl::StatusCode::kNotFound);
}

// ---- Run-time checks ----

TEST(ValidateForModelTest, AcceptsAMatchingModel) {
  RecipeMetadata meta = ValidMeta(4);
  EXPECT_TRUE(ValidateForModel(meta, "turboquant35", 128, 4).ok());
  EXPECT_TRUE(ValidateForModel(meta, "turboquant35_noqjl", 128, 4).ok());
}

TEST(ValidateForModelTest, RejectsMismatches) {
  RecipeMetadata meta = ValidMeta(4);
  absl::Status s = ValidateForModel(meta, "turboquant25", 128, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("metadata recipe 'turboquant35' does not match the model's recipe "
                        "'turboquant25'"));
  s = ValidateForModel(meta, "turboquant35", 64, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("metadata head_size 128 does not match the model's head size 64"));
  s = ValidateForModel(meta, "turboquant35", 128, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("layer 'model.layers.0.self_attn': metadata has 4 kv heads, the model "
                        "has 2 per rank"));
  EXPECT_EQ(ValidateForModel(meta, "tq4", 128, 4).code(), absl::StatusCode::kInvalidArgument);
  meta.layers[kLayer0].key[0][0] = 200;
  EXPECT_EQ(ValidateForModel(meta, "turboquant35", 128, 4).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Layer lookup ----

TEST(FindLayerTest, ResolvesAliases) {
  RecipeMetadata meta = ValidMeta();
  const LayerChannels* want = &meta.layers.at(kLayer3);
  for (const char* name :
       {"model.layers.3.self_attn", "model.layers.3.self_attn.attn",
        "language_model.model.layers.3.self_attn",
        "language_model.model.layers.3.self_attn.attn"}) {
    absl::StatusOr<const LayerChannels*> found = FindLayer(meta, name);
    ASSERT_TRUE(found.ok()) << name << ": " << found.status();
    EXPECT_EQ(*found, want) << name;
  }
}

TEST(FindLayerTest, NormalisesMetadataKeysToo) {
  RecipeMetadata meta = ValidMeta();
  LayerChannels layer = meta.layers.at(kLayer3);
  layer.key[0][0] = 100;  // mark it (validity does not matter for lookup)
  meta.layers.erase(kLayer3);
  meta.layers["language_model.model.layers.3.self_attn.attn"] = layer;
  for (const char* name : {"model.layers.3.self_attn", "model.layers.3.self_attn.attn",
                           "language_model.model.layers.3.self_attn"}) {
    absl::StatusOr<const LayerChannels*> found = FindLayer(meta, name);
    ASSERT_TRUE(found.ok()) << name << ": " << found.status();
    EXPECT_EQ((*found)->key[0][0], 100) << name;
  }
}

TEST(FindLayerTest, NeverInfersAMissingLayer) {
  RecipeMetadata meta = ValidMeta();
  absl::Status s = FindLayer(meta, "model.layers.1.self_attn.attn").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("layer 'model.layers.1.self_attn.attn'"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("known layers: 'model.layers.0.self_attn', 'model.layers.3.self_attn'"));
  EXPECT_EQ(FindLayer(meta, "model.layers.3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindLayer(meta, "layers.3.self_attn").status().code(), absl::StatusCode::kNotFound);
}

TEST(FindLayerTest, ListsOnlyAFewKnownNames) {
  RecipeMetadata meta = ValidMeta();
  for (int i = 10; i < 30; ++i) {
    meta.layers["model.layers." + std::to_string(i) + ".self_attn"] = meta.layers.at(kLayer0);
  }
  absl::Status s = FindLayer(meta, "nope").status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("... (22 in all)"));
}

TEST(LayerByIndexTest, FindsNormalisedNames) {
  RecipeMetadata meta = ValidMeta();
  absl::StatusOr<const LayerChannels*> found = LayerByIndex(meta, 3);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, &meta.layers.at(kLayer3));

  meta.layers["language_model.model.layers.7.self_attn.attn"] = meta.layers.at(kLayer0);
  found = LayerByIndex(meta, 7);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, &meta.layers.at("language_model.model.layers.7.self_attn.attn"));

  absl::Status s = LayerByIndex(meta, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'model.layers.1.self_attn'"));
  EXPECT_EQ(LayerByIndex(meta, -1).status().code(), absl::StatusCode::kNotFound);
}

// ---- Tensor parallelism ----

TEST(SliceForTensorParallelTest, SplitsHeadsEvenly) {
  RecipeMetadata meta = ValidMeta(8);
  for (int rank = 0; rank < 4; ++rank) {
    absl::StatusOr<RecipeMetadata> slice = SliceForTensorParallel(meta, rank, 4);
    ASSERT_TRUE(slice.ok()) << slice.status();
    for (const auto& [name, layer] : slice->layers) {
      ASSERT_EQ(layer.num_kv_heads(), 2) << name;
      EXPECT_EQ(layer.key[0], meta.layers.at(name).key[2 * rank]);
      EXPECT_EQ(layer.key[1], meta.layers.at(name).key[2 * rank + 1]);
      EXPECT_EQ(layer.value[1], meta.layers.at(name).value[2 * rank + 1]);
    }
    EXPECT_EQ(slice->recipe, meta.recipe);
    EXPECT_EQ(slice->calibration, meta.calibration);
    EXPECT_TRUE(ValidateForModel(*slice, "turboquant35", 128, 2).ok());
  }
  absl::StatusOr<RecipeMetadata> whole = SliceForTensorParallel(meta, 0, 1);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, meta);
}

TEST(SliceForTensorParallelTest, ReplicatesWhenRanksOutnumberHeads) {
  RecipeMetadata meta = ValidMeta(2);
  // tp 8 over 2 heads: ranks 0-3 hold head 0, ranks 4-7 head 1.
  for (int rank = 0; rank < 8; ++rank) {
    absl::StatusOr<RecipeMetadata> slice = SliceForTensorParallel(meta, rank, 8);
    ASSERT_TRUE(slice.ok()) << slice.status();
    const LayerChannels& layer = slice->layers.at(kLayer0);
    ASSERT_EQ(layer.num_kv_heads(), 1);
    EXPECT_EQ(layer.key[0], meta.layers.at(kLayer0).key[rank / 4]) << rank;
    EXPECT_EQ(layer.value[0], meta.layers.at(kLayer0).value[rank / 4]) << rank;
  }
}

TEST(SliceForTensorParallelTest, RejectsUnevenSplitsAndBadRanks) {
  absl::Status s = SliceForTensorParallel(ValidMeta(8), 0, 3).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("layer 'model.layers.0.self_attn': 8 kv heads do not split evenly over 3"));
  s = SliceForTensorParallel(ValidMeta(2), 0, 3).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot be replicated evenly over 3"));
  EXPECT_EQ(SliceForTensorParallel(ValidMeta(2), 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceForTensorParallel(ValidMeta(2), -1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceForTensorParallel(ValidMeta(2), 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv
