// Listing and unregistering models against the real server: a model that
// holds blocks, sequences or staged blocks is refused unless forced; a
// forced unregistration removes all of it (pinned and on-disk blocks too);
// the name registered again with another layout gets the same id and
// never sees a byte of the old one, across puts still streaming and across
// a restart; only admin tokens may unregister, and tenants see only their
// own models.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "proto/tqkv/v1/tqkv.grpc.pb.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

std::vector<std::string> Chain(const std::string& prefix, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

class UnregisterModelTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }

  uint32_t Hits(const v1::ModelRef& model, const std::vector<std::string>& chain) {
    v1::LookupRequest req;
    *req.mutable_model() = model;
    for (const std::string& h : chain) req.add_block_hashes(h);
    auto r = client_->Lookup(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->hits() : 0;
  }
  std::vector<v1::ModelInfo> Models() {
    auto r = client_->ListModels(v1::ListModelsRequest());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::vector<v1::ModelInfo>(r->models().begin(), r->models().end())
                   : std::vector<v1::ModelInfo>{};
  }
  absl::StatusOr<v1::UnregisterModelResponse> Unregister(const v1::ModelRef& model, bool force) {
    v1::UnregisterModelRequest req;
    req.set_model_id(model.model_id());
    req.set_force(force);
    return client_->UnregisterModel(req);
  }
  // The small model's name with another layout (2-bit K and V).
  v1::ModelRef RegisterOtherLayout(const std::string& name) {
    v1::RegisterModelRequest req = client::SmallModel(name);
    req.mutable_codec()->set_cache_dtype("k2v2");
    auto r = client_->RegisterModel(req);
    EXPECT_TRUE(r.ok()) << r.status();
    v1::ModelRef ref;
    if (!r.ok()) return ref;
    EXPECT_TRUE(r->created());
    ref.set_model_id(r->model_id());
    ref.set_layout_fingerprint(r->layout_fingerprint());
    return ref;
  }
};

TEST_F(UnregisterModelTest, RefusedWhileItHoldsAnythingThenForcedAndNothingOfItSurvives) {
  const v1::ModelRef old = RegisterSmall("m");
  const v1::ModelRef kept = RegisterSmall("kept");
  const std::vector<std::string> chain = Chain("b", 4);
  PutDense(old, chain, 1, /*durable=*/true);
  PutDense(kept, chain, 1);
  v1::PinRequest pin;
  *pin.mutable_model() = old;
  pin.add_block_hashes(chain[0]);
  ASSERT_TRUE(client_->Pin(pin).ok());
  v1::CreateSequenceRequest cs;
  *cs.mutable_model() = old;
  cs.add_block_hashes(chain[0]);
  auto seq = client_->CreateSequence(cs);
  ASSERT_TRUE(seq.ok()) << seq.status();

  std::vector<v1::ModelInfo> models = Models();
  ASSERT_EQ(models.size(), 2u);
  const v1::ModelInfo& info = models[0].model_id() == old.model_id() ? models[0] : models[1];
  EXPECT_EQ(info.model_name(), "m");
  EXPECT_EQ(info.layout_fingerprint(), old.layout_fingerprint());
  EXPECT_EQ(info.registration().layout().head_dim(), 64u);
  EXPECT_EQ(info.format().layers(0).cache_dtype(), "k4v4");
  EXPECT_EQ(info.blocks(), 4u);
  EXPECT_GT(info.bytes(), 0u);
  EXPECT_EQ(info.sequences(), 1u);

  auto refused = Unregister(old, /*force=*/false);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "4 stored blocks, 1 live sequences"))
      << refused.status();
  EXPECT_EQ(Hits(old, chain), 4u) << "a refusal changes nothing";
  EXPECT_EQ(Models().size(), 2u);

  auto forced = Unregister(old, /*force=*/true);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->blocks(), 4u) << "the pinned block and the disk copies too";
  EXPECT_EQ(forced->sequences(), 1u);
  ASSERT_EQ(Models().size(), 1u);
  EXPECT_EQ(Models()[0].model_name(), "kept");
  EXPECT_EQ(Hits(kept, chain), 4u) << "other models keep their blocks";
  v1::LookupRequest lookup;
  *lookup.mutable_model() = old;
  lookup.add_block_hashes(chain[0]);
  EXPECT_EQ(client_->Lookup(lookup).status().code(), StatusCode::kNotFound);
  v1::DropSequenceRequest drop;
  drop.set_sequence_id(seq->sequence_id());
  EXPECT_EQ(client_->DropSequence(drop).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Unregister(old, true).status().code(), StatusCode::kNotFound);

  // The name again, another layout: same id, none of the old bytes, now
  // or after a restart (the disk copies went with the model).
  const v1::ModelRef fresh = RegisterOtherLayout("m");
  EXPECT_EQ(fresh.model_id(), old.model_id());
  EXPECT_NE(fresh.layout_fingerprint(), old.layout_fingerprint());
  EXPECT_EQ(Hits(fresh, chain), 0u);
  Restart(/*kill9=*/false);
  EXPECT_EQ(Hits(fresh, chain), 0u);
  models = Models();
  ASSERT_EQ(models.size(), 2u);
  for (const v1::ModelInfo& m : models)
    if (m.model_name() == "m") {
      EXPECT_EQ(m.format().layers(0).cache_dtype(), "k2v2");
    }
  PutDense(fresh, chain, 9);
  EXPECT_EQ(Hits(fresh, chain), 4u);
}

// A put stream that resolved the old model before it was unregistered fails
// at its commit: its blocks never land under the id the name keeps.
TEST_F(UnregisterModelTest, AStreamOpenAcrossTheUnregistrationCommitsNothing) {
  const v1::ModelRef old = RegisterSmall("m");
  const std::vector<std::string> chain = Chain("s", 3);
  auto stub = v1::KvStore::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::PutBlocksResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::PutBlocksRequest>> w = stub->PutBlocks(&ctx, &resp);
  v1::PutBlocksRequest header;
  *header.mutable_header()->mutable_model() = old;
  ASSERT_TRUE(w->Write(header));
  std::string parent;
  for (size_t i = 0; i < chain.size(); ++i) {
    v1::PutBlocksRequest r;
    *r.mutable_block() = client::DenseBlock(client::SmallModel("m").layout(), chain[i], parent, i);
    parent = chain[i];
    ASSERT_TRUE(w->Write(r));
  }
  ASSERT_TRUE(Unregister(old, /*force=*/false).ok()) << "an open stream has no stored blocks yet";
  const v1::ModelRef fresh = RegisterOtherLayout("m");
  w->WritesDone();
  grpc::Status s = w->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "unregistered")) << s.error_message();
  EXPECT_EQ(Hits(fresh, chain), 0u);
  EXPECT_EQ(Models().at(0).blocks(), 0u);
}

TEST_F(UnregisterModelTest, StagedLayerRangesCountAndGoWithTheModel) {
  const v1::ModelRef old = RegisterSmall("m");
  // Layer 0 of one block, its layer 1 never sent: staged, not stored.
  const v1::ModelLayout layout = client::SmallModel("m").layout();
  v1::PutHeader h;
  *h.mutable_model() = old;
  h.set_first_layer(0);
  h.set_last_layer(1);
  v1::PutBlock part = client::DenseBlock(layout, "p0", "", 3, 0, 1);
  auto staged = client_->PutBlocks(h, {part});
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_EQ(staged->staged(), 1u);
  auto refused = Unregister(old, false);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "1 staged blocks")) << refused.status();
  auto forced = Unregister(old, true);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->staged(), 1u);

  // Layer 1 under the new layout completes nothing of the old layer 0.
  const v1::ModelRef fresh = RegisterOtherLayout("m");
  *h.mutable_model() = fresh;
  h.set_first_layer(1);
  h.set_last_layer(2);
  part = client::DenseBlock(layout, "p0", "", 3, 1, 2);
  auto second = client_->PutBlocks(h, {part});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->committed(), 0u);
  EXPECT_EQ(second->staged(), 1u);
  EXPECT_EQ(Hits(fresh, {"p0"}), 0u);
}

TEST(UnregisterModelAuthTest, OnlyAdminsUnregisterAndTenantsListTheirOwn) {
  const std::string dir = MakeTempDir("tokens");
  std::ofstream(dir + "/tokens") << "tok-admin alpha admin\n"
                                 << "tok-a alpha\n"
                                 << "tok-b beta\n";
  chmod((dir + "/tokens").c_str(), 0600);
  auto server = ServerProcess::Start(MakeTempDir("tqkv-data"), {"--auth_tokens_file=" + dir + "/tokens"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto as = [&](const std::string& token) {
    client::ClientOptions o;
    o.target = (*server)->address();
    o.token = token;
    return std::move(client::Client::Connect(o)).value();
  };
  auto admin = as("tok-admin"), a = as("tok-a"), b = as("tok-b");
  auto m = a->RegisterModel(client::SmallModel("m"));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(b->RegisterModel(client::SmallModel("theirs")).ok());
  auto listed = a->ListModels(v1::ListModelsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->models_size(), 1);
  EXPECT_EQ(listed->models(0).model_name(), "m");

  v1::UnregisterModelRequest req;
  req.set_model_id(m->model_id());
  EXPECT_EQ(a->UnregisterModel(req).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(b->UnregisterModel(req).status().code(), StatusCode::kPermissionDenied);
  req.set_model_id(0);
  EXPECT_EQ(admin->UnregisterModel(req).status().code(), StatusCode::kInvalidArgument);
  req.set_model_id(m->model_id());
  ASSERT_TRUE(admin->UnregisterModel(req).ok());
  EXPECT_EQ(a->ListModels(v1::ListModelsRequest())->models_size(), 0);
  EXPECT_EQ(b->ListModels(v1::ListModelsRequest())->models_size(), 1) << "another tenant's model stays";
}

}  // namespace
}  // namespace tqkv::testing
