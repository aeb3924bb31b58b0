// /metrics scraped over HTTP from the real server: the exposition passes
// `promtool check metrics`, and byte, hit, miss, spill, error and RPC
// message-byte counters move by exactly the amounts the test causes; the
// server's process metrics are there.
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

class MetricsTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }
  std::string Scrape() {
    auto body = HttpGet(server_->metrics_address(), "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    return body.ok() ? *body : "";
  }
  // Value of the sample `series` (name plus exact label set), or -1.
  static double Value(const std::string& text, const std::string& series) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (absl::StartsWith(line, series + " ")) {
        double v;
        if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
      }
    }
    return -1;
  }
};

std::string Stored(const char* kind, const char* tier) {
  return std::string("tqkv_stored_bytes{kind=\"") + kind +
         "\",model=\"small\",tenant=\"default\",tier=\"" + tier + "\"}";
}

TEST_F(MetricsTest, ExpositionIsValidAndCountersMoveByTheRightAmounts) {
  bool ok = false;
  std::string out = PromtoolCheck(Scrape(), &ok);
  EXPECT_TRUE(ok) << out;

  const v1::ModelRef model = RegisterSmall();
  const auto codec = SmallCodec();
  const BlockBytes& acc = codec->block_accounting();
  const std::string before = Scrape();
  const auto chain = client::HashChain(8, 10);
  PutDense(model, chain, 10);

  v1::LookupRequest lr;
  *lr.mutable_model() = model;
  for (const auto& h : chain) lr.add_block_hashes(h);
  lr.add_block_hashes(client::ChainHash(chain.back(), 8, 99));
  lr.add_block_hashes(client::ChainHash(chain.back(), 8, 100));
  auto look = client_->Lookup(lr);
  ASSERT_TRUE(look.ok());
  ASSERT_EQ(look->hits(), 10u);
  const size_t lookup_bytes = lr.ByteSizeLong();
  lr.mutable_model()->set_layout_fingerprint("bad");
  EXPECT_FALSE(client_->Lookup(lr).ok());
  const size_t bad_lookup_bytes = lr.ByteSizeLong();

  const std::string after = Scrape();
  out = PromtoolCheck(after, &ok);
  EXPECT_TRUE(ok) << out;
  EXPECT_EQ(Value(after, Stored("total", "host")), 10.0 * codec->block_bytes());
  EXPECT_EQ(Value(after, Stored("dense_equivalent", "host")), 10.0 * acc.dense_equivalent);
  EXPECT_EQ(Value(after, Stored("packed_k", "host")), 10.0 * acc.packed_k);
  EXPECT_EQ(Value(after, Stored("packed_v", "host")), 10.0 * acc.packed_v);
  EXPECT_EQ(Value(after, Stored("norms_metadata", "host")), 10.0 * acc.norms);
  EXPECT_EQ(Value(after, "tqkv_stored_blocks{model=\"small\",tenant=\"default\",tier=\"host\"}"), 10);
  EXPECT_NEAR(Value(after, "tqkv_compression_ratio{model=\"small\",tenant=\"default\"}"),
              static_cast<double>(acc.dense_equivalent) / codec->block_bytes(), 1e-9);
  auto delta = [&](const std::string& series) {
    const double b = Value(before, series);
    return Value(after, series) - (b < 0 ? 0 : b);
  };
  EXPECT_EQ(delta("tqkv_lookups_total"), 1);
  EXPECT_EQ(delta("tqkv_lookup_hit_blocks_total{tier=\"host\"}"), 10);
  EXPECT_EQ(delta("tqkv_lookup_miss_blocks_total"), 2);
  EXPECT_EQ(delta("tqkv_puts_committed_total"), 10);
  EXPECT_EQ(delta("tqkv_rpc_requests_total{method=\"Lookup\"}"), 2);
  EXPECT_EQ(delta("tqkv_rpc_errors_total{code=\"FAILED_PRECONDITION\",method=\"Lookup\"}"), 1);
  EXPECT_EQ(delta("tqkv_rpc_duration_seconds_count{method=\"PutBlocks\"}"), 1);
  // Message bytes: both requests received; only the successful reply sent.
  EXPECT_EQ(delta("tqkv_rpc_received_bytes_total{method=\"Lookup\"}"),
            static_cast<double>(lookup_bytes + bad_lookup_bytes));
  EXPECT_EQ(delta("tqkv_rpc_sent_bytes_total{method=\"Lookup\"}"),
            static_cast<double>(look->ByteSizeLong()));
  EXPECT_GT(delta("tqkv_rpc_received_bytes_total{method=\"PutBlocks\"}"),
            10.0 * SmallCodec()->block_accounting().dense_equivalent);
  // Process metrics of the server process (from its procfs).
  EXPECT_GT(Value(after, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(Value(after, "process_open_fds"), 5);
  EXPECT_GT(Value(after, "process_max_fds"), Value(after, "process_open_fds"));
  EXPECT_GT(Value(after, "process_cpu_seconds_total"), 0);
  EXPECT_NEAR(Value(after, "process_start_time_seconds"), absl::ToUnixSeconds(absl::Now()), 600);
  EXPECT_EQ(Value(after, "tqkv_backend_info{backend=\"" + TestBackend() + "\"}"), 1);
  // The commit depends on how the binary was built; the version is never empty.
  const std::string build = "tqkv_build_info{backend=\"" + TestBackend() + "\",commit=\"";
  const size_t at = after.find(build);
  ASSERT_NE(at, std::string::npos) << after;
  const std::string line = after.substr(at, after.find('\n', at) - at);
  EXPECT_TRUE(absl::StrContains(line, ",version=\"") && !absl::StrContains(line, "version=\"\"") &&
              absl::EndsWith(line, "} 1"))
      << line;

  // Spilling moves the bytes to the disk tier and counts the spills; a get
  // from disk counts a disk hit.
  v1::EvictRequest ev;
  ASSERT_TRUE(client_->Evict(ev).ok());
  v1::GetBlocksRequest gr;
  *gr.mutable_model() = model;
  gr.add_block_hashes(chain[0]);
  ASSERT_TRUE(client_->GetBlocks(gr).ok());
  const std::string spilled = Scrape();
  EXPECT_EQ(Value(spilled, "tqkv_spills_total") - Value(after, "tqkv_spills_total"), 10);
  EXPECT_EQ(Value(spilled, Stored("total", "disk")), 10.0 * codec->block_bytes());
  EXPECT_EQ(Value(spilled, "tqkv_get_hit_blocks_total{tier=\"disk\"}") -
                Value(after, "tqkv_get_hit_blocks_total{tier=\"disk\"}"),
            1);
  EXPECT_EQ(Value(spilled, "tqkv_promotions_total") - Value(after, "tqkv_promotions_total"), 1);
  // The payload files (none until the memtable is flushed) hold no garbage: nothing was removed.
  EXPECT_GE(Value(spilled, "tqkv_disk_file_bytes"), 0);
  EXPECT_EQ(Value(spilled, "tqkv_disk_garbage_bytes"), 0);
  out = PromtoolCheck(spilled, &ok);
  EXPECT_TRUE(ok) << out;
}

// Sequence-owned bytes (the dense tails' fp32 rooms here, block_size rows
// per layer from the sequence's creation) are accounted while the sequence
// lives and released when it is dropped.
TEST_F(MetricsTest, SequenceBytesFollowTheirSequences) {
  const v1::ModelRef model = RegisterSmall();
  EXPECT_EQ(Value(Scrape(), "tqkv_sequence_bytes"), 0);
  const v1::ModelLayout layout = client::SmallModel("small").layout();
  const int tail = 5;  // tokens, below block_size: stays dense
  v1::CreateSequenceRequest cs;
  *cs.mutable_model() = model;
  *cs.mutable_tail_k() = client::RandomTensor(
      v1::DTYPE_FP16, {layout.num_layers(), tail, layout.num_kv_heads(), layout.head_dim()}, 1);
  *cs.mutable_tail_v() = client::RandomTensor(
      v1::DTYPE_FP16, {layout.num_layers(), tail, layout.num_kv_heads(), layout.head_dim()}, 2);
  auto seq = client_->CreateSequence(cs);
  ASSERT_TRUE(seq.ok()) << seq.status();
  const double want =
      2.0 * layout.num_layers() * layout.block_size() * layout.num_kv_heads() * layout.head_dim() * 4;
  EXPECT_EQ(Value(Scrape(), "tqkv_sequence_bytes"), want);
  v1::DropSequenceRequest drop;
  drop.set_sequence_id(seq->sequence_id());
  ASSERT_TRUE(client_->DropSequence(drop).ok());
  EXPECT_EQ(Value(Scrape(), "tqkv_sequence_bytes"), 0);
}

}  // namespace
}  // namespace tqkv::testing
