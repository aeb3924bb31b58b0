// Restarts and eviction against the real server and RocksDB: a graceful
// restart finds every block (host blocks are spilled at shutdown); after
// kill -9 every durable or spilled block is found with its exact bytes;
// under a small host budget old blocks spill and are served from disk.
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

class DurabilityTest : public ServerTest {
 protected:
  std::vector<v1::GetBlocksResponse> Get(const v1::ModelRef& model,
                                         const std::vector<std::string>& hashes) {
    v1::GetBlocksRequest gr;
    *gr.mutable_model() = model;
    for (const auto& h : hashes) gr.add_block_hashes(h);
    auto r = client_->GetBlocks(gr);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::vector<v1::GetBlocksResponse>();
  }
  v1::LookupResponse Lookup(const v1::ModelRef& model, const std::vector<std::string>& hashes) {
    v1::LookupRequest lr;
    *lr.mutable_model() = model;
    for (const auto& h : hashes) lr.add_block_hashes(h);
    auto r = client_->Lookup(lr);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::LookupResponse();
  }
  std::unique_ptr<ModelCodec> codec_ = SmallCodec();
  CpuBackend backend_{CpuBackend::Options{0}};
};

TEST_F(DurabilityTest, GracefulRestartKeepsRegistrationsAndBlocks) {
  StartServer();
  const v1::ModelRef model = RegisterSmall();
  const auto chain = client::HashChain(21, 200);
  const auto blocks = PutDense(model, chain, 1000);
  Restart(/*kill9=*/false);

  auto again = client_->RegisterModel(client::SmallModel("small"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created()) << "the registration must survive a restart";
  EXPECT_EQ(again->model_id(), model.model_id());
  EXPECT_EQ(again->layout_fingerprint(), model.layout_fingerprint());

  const v1::LookupResponse look = Lookup(model, chain);
  EXPECT_EQ(look.hits(), 200u);
  for (int t : look.tiers()) EXPECT_EQ(t, v1::TIER_DISK);
  const auto got = Get(model, chain);
  ASSERT_EQ(got.size(), 200u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tier(), v1::TIER_DISK);
    ASSERT_EQ(got[i].payload(), EncodeLocally(*codec_, backend_, blocks[i])) << "block " << i;
  }
}

TEST_F(DurabilityTest, KillNineKeepsDurableAndSpilledBlocks) {
  StartServer();
  const v1::ModelRef model = RegisterSmall();
  const auto durable = client::HashChain(31, 100);
  const auto spilled = client::HashChain(32, 100);
  const auto volatile_only = client::HashChain(33, 50);
  const auto d_blocks = PutDense(model, durable, 2000, /*durable=*/true);
  // A durable block is in host memory and on disk: once in each tier's
  // residency, once in the model's count.
  EXPECT_EQ(Blocks(model, v1::TIER_HOST), 100u);
  EXPECT_EQ(Blocks(model, v1::TIER_DISK), 100u);
  EXPECT_EQ(ModelStats(model).blocks(), 100u);
  EXPECT_EQ(ModelStats(model).bytes(), 100 * codec_->block_bytes());
  const auto s_blocks = PutDense(model, spilled, 3000);
  v1::EvictRequest ev;
  ev.set_model_id(model.model_id());
  auto er = client_->Evict(ev);
  ASSERT_TRUE(er.ok()) << er.status();
  EXPECT_EQ(er->blocks(), 200u) << "every host copy of the model is moved out";
  PutDense(model, volatile_only, 4000);  // host memory only

  Restart(/*kill9=*/true);
  // The registration is synced: the data path works without re-registering.
  for (const auto* set : {&durable, &spilled}) {
    const v1::LookupResponse look = Lookup(model, *set);
    EXPECT_EQ(look.hits(), set->size());
    for (int t : look.tiers()) EXPECT_EQ(t, v1::TIER_DISK);
  }
  const auto got_d = Get(model, durable);
  const auto got_s = Get(model, spilled);
  ASSERT_EQ(got_d.size(), 100u);
  ASSERT_EQ(got_s.size(), 100u);
  for (size_t i = 0; i < 100; ++i) {
    ASSERT_EQ(got_d[i].payload(), EncodeLocally(*codec_, backend_, d_blocks[i]));
    ASSERT_EQ(got_s[i].payload(), EncodeLocally(*codec_, backend_, s_blocks[i]));
  }
  // Host-only blocks are documented to be lost by a crash.
  EXPECT_EQ(Lookup(model, volatile_only).hits(), 0u);
}

TEST_F(DurabilityTest, BlocksWrittenBehindSurviveKillNine) {
  const size_t block_bytes = codec_->block_bytes();
  // A host budget of 100 blocks, written behind above 20 of them: of 60
  // blocks put (none durable, none evicted) the oldest 40 reach disk.
  StartServer({"--host_budget_bytes=" + std::to_string(100 * block_bytes), "--write_behind_fraction=0.2"});
  const v1::ModelRef model = RegisterSmall();
  const auto chain = client::HashChain(41, 60);
  const auto blocks = PutDense(model, chain, 5000);
  EXPECT_EQ(AwaitMetric("tqkv_written_behind_total", 40), 40);
  EXPECT_EQ(Blocks(model, v1::TIER_HOST), 60u);  // host copies kept
  EXPECT_EQ(Blocks(model, v1::TIER_DISK), 40u);

  Restart(/*kill9=*/true);
  const v1::LookupResponse look = Lookup(model, chain);
  EXPECT_EQ(look.hits(), 40u) << "the oldest 40 were on disk; the rest only in host memory";
  const std::vector<std::string> behind(chain.begin(), chain.begin() + 40);
  const auto got = Get(model, behind);
  ASSERT_EQ(got.size(), 40u);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i].payload(), EncodeLocally(*codec_, backend_, blocks[i])) << "block " << i;
}

TEST_F(DurabilityTest, BadWriteBehindFractionsAreRefused) {
  for (const std::string& bad : {"--write_behind_fraction=-0.1", "--write_behind_fraction=1.5"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(ServerProcess::Start(::testing::TempDir() + "/bad-write-behind", {bad}).ok());
  }
}

TEST_F(DurabilityTest, SmallHostBudgetSpillsAndServesFromDisk) {
  const size_t block_bytes = codec_->block_bytes();
  StartServer({"--host_budget_bytes=" + std::to_string(100 * block_bytes)});
  const v1::ModelRef model = RegisterSmall();
  const auto chain = client::HashChain(41, 300);
  std::vector<v1::PutBlock> blocks;
  for (size_t s = 0; s < 300; s += 50) {
    auto part = PutDense(model, {chain.begin() + s, chain.begin() + s + 50}, 5000 + s);
    blocks.insert(blocks.end(), part.begin(), part.end());
  }
  const v1::LookupResponse look = Lookup(model, chain);
  ASSERT_EQ(look.hits(), 300u) << "spilled blocks are still hits";
  EXPECT_EQ(look.tiers(0), v1::TIER_DISK);
  EXPECT_EQ(look.tiers(299), v1::TIER_HOST);
  EXPECT_LE(Blocks(model, v1::TIER_HOST), 90u) << "host usage stays under the high watermark";
  EXPECT_GE(Blocks(model, v1::TIER_DISK), 200u);

  // A disk hit is served with its exact bytes (checksum-verified by storage).
  const auto got = Get(model, {chain.begin(), chain.begin() + 20});
  ASSERT_EQ(got.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(got[i].tier(), v1::TIER_DISK);
    ASSERT_EQ(got[i].payload(), EncodeLocally(*codec_, backend_, blocks[i]));
  }

  // One stream larger than the whole host budget cannot be held until its
  // commit: it fails with RESOURCE_EXHAUSTED and leaves nothing behind.
  const auto big = client::HashChain(42, 120);
  std::vector<v1::PutBlock> big_blocks;
  for (size_t i = 0; i < big.size(); ++i)
    big_blocks.push_back(client::DenseBlock(client::SmallModel("x").layout(), big[i], "", 9000 + i));
  v1::PutHeader h;
  *h.mutable_model() = model;
  auto r = client_->PutBlocks(h, big_blocks);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_EQ(Lookup(model, {big.front()}).hits(), 0u);
  EXPECT_EQ(Blocks(model), 300u);
}

}  // namespace
}  // namespace tqkv::testing
