#include "service/model_registry.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "codec/metadata.h"
#include "codec/test_util.h"

namespace tqkv::service {
namespace {

v1::RegisterModelRequest Small(const std::string& name) {
  v1::RegisterModelRequest r;
  r.set_model_name(name);
  auto* l = r.mutable_layout();
  l->set_num_layers(2);
  l->set_num_kv_heads(2);
  l->set_num_q_heads(4);
  l->set_head_dim(64);
  l->set_block_size(16);
  r.mutable_codec()->set_cache_dtype("k4v4");
  r.set_block_hash_scheme("vllm-sha256");
  return r;
}

std::unique_ptr<storage::BlockStore> OpenStore(const std::string& dir) {
  storage::BlockStoreOptions o;
  o.disk_path = dir;
  return std::move(storage::BlockStore::Open(o)).value();
}

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string t = std::string(base ? base : "/tmp") + "/regXXXXXX";
  return mkdtemp(t.data());
}

TEST(ModelRegistryTest, FingerprintCoversEverythingThatDecidesTheBytes) {
  const std::string fp = (*BuildModel("t", Small("m")))->fingerprint;
  EXPECT_EQ(fp.size(), 32u);
  EXPECT_EQ((*BuildModel("t", Small("m")))->fingerprint, fp) << "deterministic";
  auto alias = Small("m");
  alias.mutable_codec()->set_cache_dtype("tq4");
  EXPECT_EQ((*BuildModel("t", alias))->fingerprint, fp) << "aliases resolve to the same bytes";
  std::vector<std::function<void(v1::RegisterModelRequest&)>> changes = {
      [](auto& r) { r.mutable_layout()->set_block_size(32); },
      [](auto& r) { r.mutable_layout()->set_num_layers(3); },
      [](auto& r) { r.mutable_layout()->set_num_q_heads(8); },
      [](auto& r) { r.mutable_layout()->set_dtype(v1::DTYPE_BF16); },
      [](auto& r) { r.mutable_codec()->set_cache_dtype("k4v2"); },
      [](auto& r) { r.mutable_codec()->set_rotation_seed(1); },
      [](auto& r) { r.mutable_codec()->set_rotation("qr"); },
      [](auto& r) { r.mutable_codec()->set_dense_first_layers(1); },
      [](auto& r) { (*r.mutable_codec()->mutable_layer_cache_dtypes())[1] = "k8v8"; },
      [](auto& r) { r.set_block_hash_scheme("other"); },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    auto r = Small("m");
    changes[i](r);
    auto m = BuildModel("t", r);
    ASSERT_TRUE(m.ok()) << i << ": " << m.status();
    EXPECT_NE((*m)->fingerprint, fp) << "change " << i;
  }
}

TEST(ModelRegistryTest, RecipeMetadataIsPartOfTheFingerprint) {
  auto r = Small("tq");
  r.mutable_codec()->set_cache_dtype("turboquant35");
  RecipeMetadata meta = testing_util::MakeMetadata("turboquant35", 64, 2, 2);
  r.mutable_codec()->set_recipe_metadata_json(SerializeMetadataJson(meta));
  auto a = BuildModel("t", r);
  ASSERT_TRUE(a.ok()) << a.status();
  meta.layers.begin()->second.key[0][0] ^= 0;  // same content, reserialised
  std::swap(meta.layers.begin()->second.key[0], meta.layers.begin()->second.value[0]);
  r.mutable_codec()->set_recipe_metadata_json(SerializeMetadataJson(meta));
  auto b = BuildModel("t", r);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE((*a)->fingerprint, (*b)->fingerprint);
}

TEST(ModelRegistryTest, IdsAreDeterministicPerTenantAndName) {
  EXPECT_EQ(ModelIdFor("t", "m"), ModelIdFor("t", "m"));
  EXPECT_NE(ModelIdFor("t", "m"), ModelIdFor("u", "m"));
  EXPECT_NE(ModelIdFor("t", "m"), ModelIdFor("t", "n"));
  EXPECT_NE(ModelIdFor("t", "m"), 0u);
}

TEST(ModelRegistryTest, RegisterIsIdempotentRefusesConflictsAndPersists) {
  const std::string dir = TempDir();
  uint64_t id = 0;
  std::string fp;
  {
    auto store = OpenStore(dir);
    ModelRegistry reg(store.get());
    auto a = reg.Register("t", Small("m"));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->created);
    id = a->model->model_id;
    fp = a->model->fingerprint;
    auto b = reg.Register("t", Small("m"));
    ASSERT_TRUE(b.ok());
    EXPECT_FALSE(b->created);
    auto c = Small("m");
    c.mutable_layout()->set_head_dim(128);
    EXPECT_EQ(reg.Register("t", c).status().code(), absl::StatusCode::kAlreadyExists);
    v1::ModelRef ref;
    ref.set_model_id(id);
    ref.set_layout_fingerprint("x");
    EXPECT_EQ(reg.Resolve("t", ref).status().code(), absl::StatusCode::kFailedPrecondition);
    ref.set_layout_fingerprint(fp);
    EXPECT_TRUE(reg.Resolve("t", ref).ok());
    EXPECT_EQ(reg.Resolve("u", ref).status().code(), absl::StatusCode::kNotFound);
  }
  auto store = OpenStore(dir);
  ModelRegistry reg(store.get());
  auto warnings = reg.Load();
  ASSERT_TRUE(warnings.ok());
  EXPECT_TRUE(warnings->empty());
  auto m = reg.Find("t", id);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->fingerprint, fp);
  EXPECT_EQ((*m)->codec->block_bytes(), (*BuildModel("t", Small("m")))->codec->block_bytes());
}

// A byte-identical re-registration builds no codec; an equivalent one (an
// alias) builds one and resolves to the same model. A tenant's models are
// capped for new names only; other tenants and models loaded from disk are
// not refused.
TEST(ModelRegistryTest, ReRegistrationIsCheapAndTenantsHaveAModelLimit) {
  const std::string dir = TempDir();
  {
    auto store = OpenStore(dir);
    ModelRegistry reg(store.get(), {.max_models_per_tenant = 2});
    ASSERT_TRUE(reg.Register("t", Small("a")).ok());
    EXPECT_EQ(reg.codec_builds(), 1u);
    for (int i = 0; i < 3; ++i) {
      auto again = reg.Register("t", Small("a"));
      ASSERT_TRUE(again.ok());
      EXPECT_FALSE(again->created);
    }
    EXPECT_EQ(reg.codec_builds(), 1u) << "identical requests build no codec";
    auto alias = Small("a");
    alias.mutable_codec()->set_cache_dtype("tq4");
    auto same = reg.Register("t", alias);
    ASSERT_TRUE(same.ok()) << same.status();
    EXPECT_FALSE(same->created);
    EXPECT_EQ(reg.codec_builds(), 2u);
    ASSERT_TRUE(reg.Register("t", Small("b")).ok());
    auto third = reg.Register("t", Small("c"));
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
    EXPECT_EQ(reg.List(nullptr).size(), 2u) << "a refused model changes nothing";
    EXPECT_TRUE(reg.Register("t", Small("b")).ok()) << "existing models re-register at the limit";
    EXPECT_TRUE(reg.Register("u", Small("c")).ok()) << "the limit is per tenant";
  }
  auto store = OpenStore(dir);
  ModelRegistry reg(store.get(), {.max_models_per_tenant = 1});
  auto warnings = reg.Load();
  ASSERT_TRUE(warnings.ok());
  EXPECT_TRUE(warnings->empty());
  const std::string t = "t";
  EXPECT_EQ(reg.List(&t).size(), 2u) << "models on disk load over a lowered limit";
  EXPECT_EQ(reg.Register("t", Small("d")).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ModelRegistryTest, BadRequestsAreInvalidArgument) {
  auto r = Small("");
  EXPECT_EQ(BuildModel("t", r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Small("m");
  r.clear_layout();
  EXPECT_EQ(BuildModel("t", r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Small("m");
  r.mutable_layout()->set_num_layers(4000000000u);
  EXPECT_EQ(BuildModel("t", r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Small("m");
  (*r.mutable_codec()->mutable_layer_cache_dtypes())[7] = "k4v4";
  EXPECT_EQ(BuildModel("t", r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Small("m");
  r.mutable_codec()->set_recipe_metadata_json("[]");
  EXPECT_EQ(BuildModel("t", r).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv::service
