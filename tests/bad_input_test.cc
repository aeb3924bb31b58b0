// Every kind of bad input gets its precise status code and leaves the
// store unchanged (same Stats of every model, same lookups). One test per
// case, each against a fresh real server. Every put goes over gRPC and
// over the data plane, which must answer with the same code.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "client/cpp/data_plane_client.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

class BadInputTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer({"--max_message_bytes=1048576"});
    model_ = RegisterSmall();
    chain_ = client::HashChain(5, 4);
    PutDense(model_, chain_, 50);
    before_ = Snapshot();
  }
  // Everything the store holds, per model and tier.
  std::string Snapshot() {
    auto s = client_->Stats(v1::StatsRequest());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->DebugString() : "";
  }
  void ExpectUnchanged() {
    EXPECT_EQ(Snapshot(), before_) << "bad input must leave the store unchanged";
    v1::LookupRequest lr;
    *lr.mutable_model() = model_;
    for (const auto& h : chain_) lr.add_block_hashes(h);
    auto look = client_->Lookup(lr);
    ASSERT_TRUE(look.ok());
    EXPECT_EQ(look->hits(), chain_.size());
  }
  v1::PutHeader Header() {
    v1::PutHeader h;
    *h.mutable_model() = model_;
    return h;
  }
  v1::PutBlock Block(const std::string& hash, uint64_t seed) {
    return client::DenseBlock(client::SmallModel("x").layout(), hash, "", seed);
  }
  // The same put over gRPC PutBlocks and over the data plane: both must
  // fail (or succeed) with the same code; returns it.
  absl::StatusCode Put(const v1::PutHeader& h, const std::vector<v1::PutBlock>& blocks) {
    const absl::StatusCode grpc_code = client_->PutBlocks(h, blocks).status().code();
    client::DataPlaneClientOptions o;
    o.target = server_->data_address();
    auto dp = client::DataPlaneClient::Connect(o);
    EXPECT_TRUE(dp.ok()) << dp.status();
    if (!dp.ok()) return grpc_code;
    const absl::StatusOr<v1::PutBlocksResponse> data = (*dp)->PutBlocks(h, blocks);
    EXPECT_EQ(data.status().code(), grpc_code) << "data-plane twin: " << data.status();
    return grpc_code;
  }
  uint32_t Hits(const std::vector<std::string>& hashes) {
    v1::LookupRequest lr;
    *lr.mutable_model() = model_;
    for (const auto& h : hashes) lr.add_block_hashes(h);
    auto look = client_->Lookup(lr);
    return look.ok() ? look->hits() : 9999;
  }

  v1::ModelRef model_;
  std::vector<std::string> chain_;
  std::string before_;
  const std::string fresh_ = client::ChainHash("fresh", 1, 1);
};

// ---- RegisterModel ---------------------------------------------------------

TEST_F(BadInputTest, RegisterMalformedMetadataJson) {
  auto r = client::SmallModel("tq35");
  r.mutable_codec()->set_cache_dtype("turboquant35");
  r.mutable_codec()->set_recipe_metadata_json("{\"version\": 1, \"recipe\": ");
  auto s = client_->RegisterModel(r);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("recipe_metadata_json"), absl::string_view::npos);
  ExpectUnchanged();
}

TEST_F(BadInputTest, RegisterRecipeWithoutMetadata) {
  auto r = client::SmallModel("tq25");
  r.mutable_codec()->set_cache_dtype("turboquant25");
  EXPECT_EQ(client_->RegisterModel(r).status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, RegisterUnknownFormat) {
  auto r = client::SmallModel("weird");
  r.mutable_codec()->set_cache_dtype("k7v9");
  EXPECT_EQ(client_->RegisterModel(r).status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, RegisterBadLayout) {
  auto r = client::SmallModel("bad-layout");
  r.mutable_layout()->set_num_q_heads(3);  // not a multiple of kv heads
  EXPECT_EQ(client_->RegisterModel(r).status().code(), StatusCode::kInvalidArgument);
  r.mutable_layout()->set_num_q_heads(4);
  r.mutable_layout()->set_head_dim(0);
  EXPECT_EQ(client_->RegisterModel(r).status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, RegisterBadRotation) {
  auto r = client::SmallModel("bad-rot");
  r.mutable_codec()->set_rotation("spin");
  EXPECT_EQ(client_->RegisterModel(r).status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, RegisterConflictingLayoutIsRefused) {
  auto r = client::SmallModel("small");
  r.mutable_layout()->set_block_size(32);
  EXPECT_EQ(client_->RegisterModel(r).status().code(), StatusCode::kAlreadyExists);
  auto seed = client::SmallModel("small");
  seed.mutable_codec()->set_rotation_seed(8);
  EXPECT_EQ(client_->RegisterModel(seed).status().code(), StatusCode::kAlreadyExists);
  ExpectUnchanged();
  // The original registration still serves.
  EXPECT_EQ(Put(Header(), {Block(fresh_, 1)}), StatusCode::kOk);
}

// ---- PutBlocks -------------------------------------------------------------

TEST_F(BadInputTest, PutUnknownModel) {
  v1::PutHeader h = Header();
  h.mutable_model()->set_model_id(model_.model_id() ^ 1);
  EXPECT_EQ(Put(h, {Block(fresh_, 1)}), StatusCode::kNotFound);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutFingerprintMismatch) {
  v1::PutHeader h = Header();
  h.mutable_model()->set_layout_fingerprint("00000000000000000000000000000000");
  EXPECT_EQ(Put(h, {Block(fresh_, 1)}), StatusCode::kFailedPrecondition);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutWrongTensorShapeCommitsNothing) {
  v1::PutBlock good = Block(fresh_, 1);
  v1::PutBlock bad = Block(client::ChainHash(fresh_, 1, 2), 2);
  bad.mutable_k()->set_shape(3, 32);  // head dim
  bad.mutable_k()->mutable_data()->resize(bad.k().data().size() / 2);
  EXPECT_EQ(Put(Header(), {good, bad}), StatusCode::kInvalidArgument);
  EXPECT_EQ(Hits({fresh_}), 0u) << "the good block before the bad one is not committed";
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutTensorDataSizeMismatch) {
  v1::PutBlock b = Block(fresh_, 1);
  b.mutable_v()->mutable_data()->pop_back();
  EXPECT_EQ(Put(Header(), {b}), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutTooManyTokens) {
  v1::PutBlock b = client::DenseBlock(client::SmallModel("x").layout(), fresh_, "", 1, 0, 0, 17);
  EXPECT_EQ(Put(Header(), {b}), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutUnknownDtype) {
  v1::PutBlock b = Block(fresh_, 1);
  b.mutable_k()->set_dtype(static_cast<v1::DType>(9));
  EXPECT_EQ(Put(Header(), {b}), StatusCode::kInvalidArgument);
  b.mutable_k()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(Put(Header(), {b}), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutPackedPayloadWrongSize) {
  v1::PutHeader h = Header();
  h.set_packed(true);
  v1::PutBlock b;
  b.set_block_hash(fresh_);
  b.set_payload(std::string(SmallCodec()->block_bytes() - 1, 'x'));
  EXPECT_EQ(Put(h, {b}), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutDuplicateHashInOneStream) {
  EXPECT_EQ(Put(Header(), {Block(fresh_, 1), Block(fresh_, 1)}), StatusCode::kInvalidArgument);
  EXPECT_EQ(Hits({fresh_}), 0u);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutBadHashes) {
  EXPECT_EQ(Put(Header(), {Block("", 1)}), StatusCode::kInvalidArgument);
  EXPECT_EQ(Put(Header(), {Block(std::string(65, 'h'), 1)}), StatusCode::kInvalidArgument);
  v1::PutBlock b = Block(fresh_, 1);
  b.set_parent_hash(std::string(65, 'p'));
  EXPECT_EQ(Put(Header(), {b}), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutOutOfRangeLayers) {
  v1::PutHeader h = Header();
  h.set_first_layer(1);
  h.set_last_layer(3);
  EXPECT_EQ(Put(h, {Block(fresh_, 1)}), StatusCode::kInvalidArgument);
  h.set_first_layer(2);
  h.set_last_layer(0);
  EXPECT_EQ(Put(h, {Block(fresh_, 1)}), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutWithoutHeader) {
  v1::PutBlocksResponse resp;
  auto ctx = client_->NewContext();
  auto w = client_->kv_stub().PutBlocks(ctx.get(), &resp);
  v1::PutBlocksRequest msg;
  *msg.mutable_block() = Block(fresh_, 1);
  w->Write(msg);
  w->WritesDone();
  EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutDifferentBytesUnderAnExistingHashRollsBack) {
  // A new block, then different bytes under a stored hash: the stream fails
  // with ALREADY_EXISTS and the new block is rolled back.
  v1::PutBlock conflict = Block(chain_[2], 999);
  EXPECT_EQ(Put(Header(), {Block(fresh_, 1), conflict}), StatusCode::kAlreadyExists);
  EXPECT_EQ(Hits({fresh_}), 0u);
  ExpectUnchanged();
  // The stored block kept its bytes: re-putting the original is a no-op.
  auto again = client_->PutBlocks(Header(), {client::DenseBlock(client::SmallModel("x").layout(),
                                                                chain_[2], chain_[1], 52)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->already_present(), 1u);
}

TEST_F(BadInputTest, PutOversizedMessage) {
  v1::PutHeader h = Header();
  h.set_packed(true);
  v1::PutBlock b;
  b.set_block_hash(fresh_);
  b.set_payload(std::string(2 << 20, 'x'));  // over --max_message_bytes
  EXPECT_EQ(Put(h, {b}), StatusCode::kResourceExhausted);
  ExpectUnchanged();
}

TEST_F(BadInputTest, PutTruncatedStreamCommitsNothing) {
  v1::PutBlocksResponse resp;
  auto ctx = client_->NewContext();
  auto w = client_->kv_stub().PutBlocks(ctx.get(), &resp);
  v1::PutBlocksRequest msg;
  *msg.mutable_header() = Header();
  ASSERT_TRUE(w->Write(msg));
  std::vector<std::string> hashes = client::HashChain(66, 3);
  for (const auto& hash : hashes) {
    *msg.mutable_block() = Block(hash, 3);
    ASSERT_TRUE(w->Write(msg));
  }
  ctx->TryCancel();  // the client goes away mid-stream
  EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(Hits(hashes), 0u);
  ExpectUnchanged();
}

// ---- Lookup / GetBlocks ------------------------------------------------------

TEST_F(BadInputTest, DataPlaneDenseGetOverTheMessageLimit) {
  // 40 blocks of 32 KiB of fp32 K/V: 1.25 MiB dense, over --max_message_bytes
  // (1 MiB); the same blocks packed, or fewer of them, are served.
  const std::vector<std::string> many = client::HashChain(77, 40);
  PutDense(model_, many, 900);
  before_ = Snapshot();
  client::DataPlaneClientOptions o;
  o.target = server_->data_address();
  auto dp = client::DataPlaneClient::Connect(o);
  ASSERT_TRUE(dp.ok()) << dp.status();
  v1::GetBlocksRequest req;
  *req.mutable_model() = model_;
  for (const auto& h : many) req.add_block_hashes(h);
  req.set_dense(true);
  req.set_dense_dtype(v1::DTYPE_FP32);
  client::DataPlaneBlocks out;
  absl::Status s = (*dp)->GetBlocks(req, &out);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  req.mutable_block_hashes()->DeleteSubrange(20, req.block_hashes_size() - 20);
  s = (*dp)->GetBlocks(req, &out);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(out.size(), 20u);
  req.set_dense(false);
  for (size_t i = 20; i < many.size(); ++i) req.add_block_hashes(many[i]);
  s = (*dp)->GetBlocks(req, &out);
  EXPECT_TRUE(s.ok()) << s;
  ExpectUnchanged();
}

TEST_F(BadInputTest, LookupDuplicateHashes) {
  v1::LookupRequest lr;
  *lr.mutable_model() = model_;
  lr.add_block_hashes(chain_[0]);
  lr.add_block_hashes(chain_[0]);
  EXPECT_EQ(client_->Lookup(lr).status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, LookupFingerprintMismatchAndUnknownModel) {
  v1::LookupRequest lr;
  *lr.mutable_model() = model_;
  lr.add_block_hashes(chain_[0]);
  lr.mutable_model()->set_layout_fingerprint("ffff");
  EXPECT_EQ(client_->Lookup(lr).status().code(), StatusCode::kFailedPrecondition);
  lr.mutable_model()->set_model_id(12345);
  EXPECT_EQ(client_->Lookup(lr).status().code(), StatusCode::kNotFound);
  lr.mutable_model()->set_model_id(0);
  EXPECT_EQ(client_->Lookup(lr).status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(BadInputTest, GetMissingBlockReturnsNoBytes) {
  v1::GetBlocksRequest gr;
  *gr.mutable_model() = model_;
  gr.add_block_hashes(chain_[0]);
  gr.add_block_hashes(fresh_);
  v1::GetBlocksResponse resp;
  auto ctx = client_->NewContext();
  auto r = client_->kv_stub().GetBlocks(ctx.get(), gr);
  int messages = 0;
  while (r->Read(&resp)) ++messages;
  EXPECT_EQ(r->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(messages, 0) << "a get either returns every block or fails before any byte";
  ExpectUnchanged();
}

TEST_F(BadInputTest, GetFingerprintMismatch) {
  v1::GetBlocksRequest gr;
  *gr.mutable_model() = model_;
  gr.mutable_model()->set_layout_fingerprint(std::string(32, '0'));
  gr.add_block_hashes(chain_[0]);
  EXPECT_EQ(client_->GetBlocks(gr).status().code(), StatusCode::kFailedPrecondition);
  ExpectUnchanged();
}

TEST_F(BadInputTest, GetOutOfRangeLayersAndBadDtype) {
  v1::GetBlocksRequest gr;
  *gr.mutable_model() = model_;
  gr.add_block_hashes(chain_[0]);
  gr.set_first_layer(1);
  gr.set_last_layer(1);
  EXPECT_EQ(client_->GetBlocks(gr).status().code(), StatusCode::kInvalidArgument);
  gr.set_first_layer(0);
  gr.set_last_layer(5);
  EXPECT_EQ(client_->GetBlocks(gr).status().code(), StatusCode::kInvalidArgument);
  gr.set_last_layer(0);
  gr.set_dense(true);
  gr.set_dense_dtype(static_cast<v1::DType>(42));
  EXPECT_EQ(client_->GetBlocks(gr).status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

// ---- Pins ------------------------------------------------------------------

TEST_F(BadInputTest, PinWithAMissingBlockPinsNothing) {
  v1::PinRequest pr;
  *pr.mutable_model() = model_;
  pr.add_block_hashes(chain_[0]);
  pr.add_block_hashes(fresh_);
  EXPECT_EQ(client_->Pin(pr).status().code(), StatusCode::kNotFound);
  v1::UnpinRequest ur;
  *ur.mutable_model() = model_;
  ur.add_block_hashes(chain_[0]);
  auto un = client_->Unpin(ur);
  ASSERT_TRUE(un.ok()) << un.status();
  EXPECT_EQ(un->unpinned(), 0u) << "the pin taken before the failure was released";
  ExpectUnchanged();
}

// ---- Sequences --------------------------------------------------------------

TEST_F(BadInputTest, SequenceErrors) {
  v1::CreateSequenceRequest cr;
  *cr.mutable_model() = model_;
  cr.add_block_hashes(chain_[0]);
  cr.add_block_hashes(fresh_);
  EXPECT_EQ(client_->CreateSequence(cr).status().code(), StatusCode::kNotFound);
  cr.clear_block_hashes();
  cr.add_block_hashes(chain_[0]);
  *cr.mutable_tail_k() = client::RandomTensor(v1::DTYPE_FP16, {2, 3, 2, 64}, 1);
  EXPECT_EQ(client_->CreateSequence(cr).status().code(), StatusCode::kInvalidArgument)
      << "tail_k without tail_v";
  cr.clear_tail_k();
  auto seq = client_->CreateSequence(cr);
  ASSERT_TRUE(seq.ok()) << seq.status();

  v1::AppendRequest ap;
  ap.set_sequence_id("seq-nope");
  *ap.mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {2, 2, 64}, 2);
  *ap.mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {2, 2, 64}, 3);
  EXPECT_EQ(client_->Append(ap).status().code(), StatusCode::kNotFound);
  ap.set_sequence_id(seq->sequence_id());
  ap.set_layer(2);
  EXPECT_EQ(client_->Append(ap).status().code(), StatusCode::kInvalidArgument);
  ap.set_layer(0);
  *ap.mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {3, 2, 64}, 3);
  EXPECT_EQ(client_->Append(ap).status().code(), StatusCode::kInvalidArgument);
  *ap.mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {2, 2, 64}, 3);
  auto ok = client_->Append(ap);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->num_tokens(), 18u) << "failed appends left the sequence unchanged";

  v1::AttendRequest at;
  at.set_layer(0);
  v1::AttendItem* it = at.add_items();
  it->set_sequence_id(seq->sequence_id());
  *it->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 4);
  it->add_positions(18);
  EXPECT_EQ(client_->Attend(at).status().code(), StatusCode::kInvalidArgument);
  it->set_positions(0, 17);
  *it->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, 4);
  EXPECT_EQ(client_->Attend(at).status().code(), StatusCode::kInvalidArgument);
  *it->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 4);
  at.set_layer(9);
  EXPECT_EQ(client_->Attend(at).status().code(), StatusCode::kInvalidArgument);
  at.set_layer(0);
  EXPECT_TRUE(client_->Attend(at).ok());
  v1::DropSequenceRequest drop;
  drop.set_sequence_id("seq-nope");
  EXPECT_EQ(client_->DropSequence(drop).status().code(), StatusCode::kNotFound);
  ExpectUnchanged();
}

// The documented policy for NaN and infinity (proto, message Tensor): they
// are stored as the codec encodes them and poison the attention of their
// own kv head and layer only: the other kv head of the same token, the
// other layer, and a sequence without the block stay finite.
TEST_F(BadInputTest, NonFiniteValuesPoisonOnlyTheirKvHeadAndLayer) {
  v1::PutBlock bad = Block(fresh_, 60);
  // K of layer 0, token 3, kv head 1, dim 5 ([layers, tokens, kv_heads, d] fp16).
  const size_t at = ((0 * 16 + 3) * 2 + 1) * 64 + 5;
  const uint16_t nan = 0x7e00;
  std::memcpy(bad.mutable_k()->mutable_data()->data() + 2 * at, &nan, 2);
  ASSERT_TRUE(client_->PutBlocks(Header(), {bad}).ok());
  auto attend = [&](const std::vector<std::string>& hashes, int layer) {
    v1::CreateSequenceRequest cr;
    *cr.mutable_model() = model_;
    for (const std::string& h : hashes) cr.add_block_hashes(h);
    auto seq = client_->CreateSequence(cr);
    EXPECT_TRUE(seq.ok()) << seq.status();
    v1::AttendRequest req;
    req.set_layer(layer);
    v1::AttendItem* it = req.add_items();
    it->set_sequence_id(seq->sequence_id());
    *it->mutable_q() = client::RandomTensor(v1::DTYPE_FP32, {1, 4, 64}, 4);
    auto r = client_->Attend(req);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<float> out(4 * 64);
    if (r.ok()) std::memcpy(out.data(), r->outputs(0).data().data(), out.size() * sizeof(float));
    return out;
  };
  auto finite_heads = [](const std::vector<float>& out) {
    std::string s;
    for (int h = 0; h < 4; ++h)
      s += std::all_of(out.begin() + h * 64, out.begin() + (h + 1) * 64, [](float x) { return std::isfinite(x); })
               ? 'F'
               : std::all_of(out.begin() + h * 64, out.begin() + (h + 1) * 64, [](float x) { return std::isnan(x); })
                     ? 'N'
                     : '?';
    return s;
  };
  EXPECT_EQ(finite_heads(attend({chain_[0], fresh_}, 0)), "FFNN") << "q heads 2, 3 read kv head 1";
  EXPECT_EQ(finite_heads(attend({chain_[0], fresh_}, 1)), "FFFF");
  EXPECT_EQ(finite_heads(attend({chain_[0]}, 0)), "FFFF");
}

// ---- Auth and tenancy ---------------------------------------------------------

class AuthTest : public ServerTest {
 protected:
  void SetUp() override {
    const std::string dir = MakeTempDir("tokens");
    std::ofstream(dir + "/tokens") << "# token tenant [admin]\n"
                                   << "tok-a alpha admin\n"
                                   << "tok-b beta\n";
    chmod((dir + "/tokens").c_str(), 0600);  // the server refuses files others may read
    StartServer({"--auth_tokens_file=" + dir + "/tokens"});
  }
  std::unique_ptr<client::Client> As(const std::string& token) {
    client::ClientOptions o;
    o.target = server_->address();
    o.token = token;
    return std::move(client::Client::Connect(o)).value();
  }
};

TEST_F(AuthTest, TokensMapToTenantsAndAdminRights) {
  auto none = As("");
  EXPECT_EQ(none->Stats(v1::StatsRequest()).status().code(), StatusCode::kUnauthenticated);
  auto bogus = As("tok-zzz");
  EXPECT_EQ(bogus->RegisterModel(client::SmallModel("m")).status().code(),
            StatusCode::kUnauthenticated);

  auto a = As("tok-a");
  auto b = As("tok-b");
  auto ra = a->RegisterModel(client::SmallModel("m"));
  ASSERT_TRUE(ra.ok()) << ra.status();
  auto sa = a->Stats(v1::StatsRequest());
  ASSERT_TRUE(sa.ok());
  EXPECT_EQ(sa->tenant(), "alpha");

  // Tenant beta cannot see or use alpha's model, even with its id.
  v1::LookupRequest lr;
  lr.mutable_model()->set_model_id(ra->model_id());
  lr.mutable_model()->set_layout_fingerprint(ra->layout_fingerprint());
  lr.add_block_hashes("h");
  EXPECT_EQ(b->Lookup(lr).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(a->Lookup(lr).ok());
  auto rb = b->RegisterModel(client::SmallModel("m"));
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_TRUE(rb->created());
  EXPECT_NE(rb->model_id(), ra->model_id());

  // Admin RPCs need an admin token.
  EXPECT_EQ(b->Evict(v1::EvictRequest()).status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(a->Evict(v1::EvictRequest()).ok());
}

}  // namespace
}  // namespace tqkv::testing
