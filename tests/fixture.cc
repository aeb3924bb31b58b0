#include "tests/fixture.h"

#include <stdlib.h>

#include <filesystem>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "codec/dtype.h"

namespace tqkv::testing {

void ServerTest::StartServer(const std::vector<std::string>& flags) {
  if (data_dir_.empty()) data_dir_ = MakeTempDir("tqkv-data");
  flags_ = flags;
  auto p = ServerProcess::Start(data_dir_, flags_);
  ASSERT_TRUE(p.ok()) << p.status();
  server_ = std::move(*p);
  client::ClientOptions o;
  o.target = server_->address();
  o.deadline = absl::Seconds(60);
  auto c = client::Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  client_ = std::move(*c);
}

void ServerTest::Restart(bool kill9) {
  client_.reset();
  if (kill9) {
    server_->Kill();
  } else {
    ASSERT_EQ(server_->Stop(), 0) << "graceful shutdown must exit 0";
  }
  server_.reset();
  StartServer(flags_);
}

v1::ModelRef ServerTest::RegisterSmall(const std::string& name) {
  auto r = client_->RegisterModel(client::SmallModel(name));
  EXPECT_TRUE(r.ok()) << r.status();
  v1::ModelRef ref;
  if (!r.ok()) return ref;
  ref.set_model_id(r->model_id());
  ref.set_layout_fingerprint(r->layout_fingerprint());
  return ref;
}

std::vector<v1::PutBlock> ServerTest::PutDense(const v1::ModelRef& model,
                                               const std::vector<std::string>& hashes,
                                               uint64_t seed0, bool durable) {
  const v1::ModelLayout layout = client::SmallModel("x").layout();
  std::vector<v1::PutBlock> blocks;
  std::string parent;
  for (size_t i = 0; i < hashes.size(); ++i) {
    blocks.push_back(client::DenseBlock(layout, hashes[i], parent, seed0 + i));
    parent = hashes[i];
  }
  v1::PutHeader h;
  *h.mutable_model() = model;
  h.set_durable(durable);
  auto r = client_->PutBlocks(h, blocks);
  EXPECT_TRUE(r.ok()) << r.status();
  return blocks;
}

std::string ServerTest::NewSequence(const v1::ModelRef& model, const std::vector<std::string>& chain,
                                    int tail_tokens, uint64_t seed) {
  v1::CreateSequenceRequest cs;
  *cs.mutable_model() = model;
  for (const auto& h : chain) cs.add_block_hashes(h);
  *cs.mutable_tail_k() = client::RandomTensor(v1::DTYPE_FP16, {2, tail_tokens, 2, 64}, seed);
  *cs.mutable_tail_v() = client::RandomTensor(v1::DTYPE_FP16, {2, tail_tokens, 2, 64}, seed + 1);
  auto seq = client_->CreateSequence(cs);
  EXPECT_TRUE(seq.ok()) << seq.status();
  return seq.ok() ? seq->sequence_id() : "";
}

double ServerTest::Metric(const std::string& name) {
  auto text = HttpGet(server_->metrics_address(), "/metrics");
  EXPECT_TRUE(text.ok()) << text.status();
  const std::string key = "\n" + name + " ";
  const size_t at = text.ok() ? text->find(key) : std::string::npos;
  return at == std::string::npos ? -1 : std::stod(text->substr(at + key.size()));
}

double ServerTest::AwaitMetric(const std::string& name, double want) {
  double v = Metric(name);
  for (const absl::Time end = absl::Now() + absl::Seconds(10); v != want && absl::Now() < end; v = Metric(name))
    absl::SleepFor(absl::Milliseconds(20));
  return v;
}

v1::ModelStats ServerTest::ModelStats(const v1::ModelRef& model) {
  v1::StatsRequest req;
  req.set_model_id(model.model_id());
  auto r = client_->Stats(req);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok() || r->models_size() != 1) return v1::ModelStats();
  return r->models(0);
}

uint64_t ServerTest::Blocks(const v1::ModelRef& model, v1::Tier tier) {
  uint64_t n = 0;
  const v1::ModelStats stats = ModelStats(model);
  for (const v1::TierBytes& t : stats.tiers())
    if (tier == v1::TIER_UNSPECIFIED || t.tier() == tier) n += t.blocks();
  return n;
}

std::unique_ptr<ModelCodec> SmallCodec() {
  ModelShape s{.num_layers = 2, .num_kv_heads = 2, .num_q_heads = 4, .head_dim = 64,
               .block_size = 16};
  CodecOptions o;
  o.format = "k4v4";
  o.seed = 7;
  return std::move(ModelCodec::Create(s, o, nullptr)).value();
}

std::string EncodeLocally(ModelCodec& codec, CpuBackend& backend, const v1::PutBlock& block) {
  const ModelShape& s = codec.shape();
  const int layers = static_cast<int>(block.k().shape(0));
  const int64_t tokens = block.k().shape(1);
  const size_t layer_bytes = static_cast<size_t>(tokens) * s.num_kv_heads * s.head_dim * 2;
  std::vector<DenseView> k, v;
  for (int l = 0; l < layers; ++l) {
    k.push_back({block.k().data().data() + l * layer_bytes, DType::kF16, tokens, s.num_kv_heads,
                 s.head_dim});
    v.push_back({block.v().data().data() + l * layer_bytes, DType::kF16, tokens, s.num_kv_heads,
                 s.head_dim});
  }
  std::string out(codec.layer_range_bytes(0, layers), '\0');
  absl::Status st =
      backend.EncodeBlock(codec, 0, layers, k, v, reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

std::unique_ptr<client::DataPlaneClient> ConnectDataPlane(const std::string& target, const std::string& token) {
  client::DataPlaneClientOptions o;
  o.target = target;
  o.token = token;
  o.timeout = absl::Seconds(30);
  auto c = client::DataPlaneClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

v1::GetBlocksRequest GetBlocksReq(const v1::ModelRef& model, const std::vector<std::string>& hashes) {
  v1::GetBlocksRequest r;
  *r.mutable_model() = model;
  for (const auto& h : hashes) r.add_block_hashes(h);
  return r;
}

std::pair<absl::Status, std::string> FailedStart(const std::vector<std::string>& flags) {
  const std::string err = MakeTempDir("tqkv-err") + "/stderr";
  auto p = ServerProcess::Start(MakeTempDir("tqkv-data"), flags, {.stderr_path = err});
  return {p.ok() ? absl::OkStatus() : p.status(), ReadFileOrEmpty(err)};
}

v1::AttendRequest OneQueryAttend(const std::string& sequence_id, uint32_t layer, v1::DType dtype, uint64_t seed) {
  v1::AttendRequest at;
  at.set_layer(layer);
  v1::AttendItem* item = at.add_items();
  item->set_sequence_id(sequence_id);
  *item->mutable_q() = client::RandomTensor(dtype, {1, 4, 64}, seed);
  return at;
}

// The request with every tensor's data moved out (into *bytes, in request
// order: per item q, k, v): what a raw-payload caller sends.
v1::AttendRequest Strip(v1::AttendRequest at, std::vector<std::string>* bytes) {
  for (v1::AttendItem& item : *at.mutable_items()) {
    bytes->push_back(std::move(*item.mutable_q()->mutable_data()));
    item.mutable_q()->clear_data();
    if (!item.has_k()) continue;
    bytes->push_back(std::move(*item.mutable_k()->mutable_data()));
    bytes->push_back(std::move(*item.mutable_v()->mutable_data()));
    item.mutable_k()->clear_data();
    item.mutable_v()->clear_data();
  }
  return at;
}

std::vector<std::span<const char>> Spans(const std::vector<std::string>& bytes) {
  return {bytes.begin(), bytes.end()};
}

size_t OutputBytes(const v1::AttendRequest& at) {
  size_t n = 0;
  for (const v1::AttendItem& item : at.items()) n += item.q().shape(0) * item.q().shape(1) * item.q().shape(2) * 2;
  return n;
}

void UnixSocketServerTest::SetUp() {
  char dir[] = "/tmp/tqkv-sock-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  dir_ = dir;
  socket_ = dir_ + "/dp.sock";
}

void UnixSocketServerTest::TearDown() {
  if (server_ != nullptr) server_->Kill();
  std::filesystem::remove_all(dir_);
}

void PutDenseOverDataPlane(client::DataPlaneClient& dp, const v1::ModelRef& model,
                           const std::vector<std::string>& chain, uint64_t seed) {
  const v1::ModelLayout layout = client::SmallModel("x").layout();
  v1::PutHeader header;
  *header.mutable_model() = model;
  std::vector<v1::PutBlock> blocks;
  for (size_t i = 0; i < chain.size(); ++i)
    blocks.push_back(client::DenseBlock(layout, chain[i], i ? chain[i - 1] : "", seed + i));
  auto put = dp.PutBlocks(header, blocks, 2 * blocks[0].ByteSizeLong());
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->committed(), chain.size());
}

}  // namespace tqkv::testing
