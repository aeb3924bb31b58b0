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

// A store block under a model id: `durable` puts it on disk as well.
void PutBlock(storage::BlockStore& store, const std::string& tenant, uint64_t model_id, const std::string& hash,
              bool durable) {
  storage::BlockAccounting acc;
  acc.total_bytes = 64;
  ASSERT_TRUE(store.Put({tenant, model_id, hash}, "", acc, std::string(64, 'x'), {.durable = durable}).ok());
}

// Unregistering forgets the model and its record; `retire` runs with puts
// fenced, and its refusal changes nothing.
TEST(ModelRegistryTest, UnregisterRemovesTheRecordUnlessRetireRefuses) {
  const std::string dir = TempDir();
  auto store = OpenStore(dir);
  ModelRegistry reg(store.get());
  auto a = reg.Register("t", Small("m"));
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t id = a->model->model_id;
  EXPECT_EQ(reg.Unregister("t", id + 1, [](const RegisteredModel&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Unregister("u", id, [](const RegisteredModel&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kNotFound)
      << "another tenant's id";
  EXPECT_EQ(reg.Unregister("t", id, [](const RegisteredModel&) { return absl::FailedPreconditionError("busy"); })
                .code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(reg.Find("t", id).ok());
  {
    absl::ReaderMutexLock gate(&a->model->commit_mu);
    EXPECT_FALSE(a->model->unregistered) << "a refusal reopens the gate";
  }
  bool retired = false;
  ASSERT_TRUE(reg.Unregister("t", id, [&](const RegisteredModel& m) {
                   EXPECT_EQ(m.model_id, id);
                   retired = true;
                   return absl::OkStatus();
                 }).ok());
  EXPECT_TRUE(retired);
  EXPECT_EQ(reg.Find("t", id).status().code(), absl::StatusCode::kNotFound);
  {
    absl::ReaderMutexLock gate(&a->model->commit_mu);
    EXPECT_TRUE(a->model->unregistered) << "puts holding the old model see it gone";
  }
  ModelRegistry reloaded(store.get());
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_TRUE(reloaded.List(nullptr).empty()) << "the record is deleted";
  auto other = Small("m");
  other.mutable_codec()->set_cache_dtype("k2v2");
  auto b = reg.Register("t", other);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->created);
  EXPECT_EQ(b->model->model_id, id) << "ids are a hash of (tenant, name)";
  EXPECT_NE(b->model->fingerprint, a->model->fingerprint);
}

// Blocks left under an id with no registration (a record skipped at load,
// an unregistration cut short) are dropped by the next registration of
// that id, pinned and on-disk ones included; other models keep theirs.
TEST(ModelRegistryTest, ANewRegistrationDropsBlocksLeftUnderItsId) {
  const std::string dir = TempDir();
  auto store = OpenStore(dir);
  const uint64_t id = ModelIdFor("t", "m");
  PutBlock(*store, "t", id, "h1", /*durable=*/false);
  PutBlock(*store, "t", id, "h2", /*durable=*/true);
  ASSERT_TRUE(store->Pin({"t", id, "h1"}, absl::Minutes(1)).ok());
  PutBlock(*store, "t", ModelIdFor("t", "other"), "h1", /*durable=*/true);
  PutBlock(*store, "u", ModelIdFor("u", "m"), "h1", /*durable=*/true);
  ASSERT_EQ(store->ResidencyOf("t", id).blocks, 2u);
  ModelRegistry reg(store.get());
  auto a = reg.Register("t", Small("m"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(store->ResidencyOf("t", id).blocks, 0u);
  EXPECT_EQ(store->Get({"t", id, "h2"}).status().code(), absl::StatusCode::kNotFound) << "its disk copy too";
  EXPECT_EQ(store->ResidencyOf("t", ModelIdFor("t", "other")).blocks, 1u);
  EXPECT_EQ(store->ResidencyOf("u", ModelIdFor("u", "m")).blocks, 1u);
  // A registration that exists already drops nothing.
  PutBlock(*store, "t", id, "h3", /*durable=*/false);
  ASSERT_TRUE(reg.Register("t", Small("m")).ok());
  EXPECT_EQ(store->ResidencyOf("t", id).blocks, 1u);
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
