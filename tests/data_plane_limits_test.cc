// The data plane's memory budget for buffered request bytes, against the
// real server on raw sockets: connections that each send the length prefix
// and most of a large frame hold no more than --data_max_buffered_bytes
// (the gauge and the server's RSS), the frame that would exceed it gets
// RESOURCE_EXHAUSTED naming the budget and its connection closes, the
// budget frees as frames are served or connections close, and a frame that
// arrives too slowly is failed with DEADLINE_EXCEEDED.
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/data_plane_client.h"
#include "client/cpp/synthetic.h"
#include "tests/fixture.h"
#include "tests/raw_data_plane.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

class DataPlaneLimitsTest : public ServerTest {
 protected:
  int RawConnect() { return testing::RawConnect(server_->data_address()); }

  // The server's resident set in bytes.
  uint64_t ServerRss() {
    std::ifstream f(absl::StrCat("/proc/", server_->pid(), "/status"));
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    ADD_FAILURE() << "no VmRSS for the server";
    return 0;
  }
};

// A valid request frame (an Attend of an unknown, very long sequence id) of
// about `bytes` bytes.
v1::DataPlaneRequest BigRequest(size_t bytes) {
  v1::DataPlaneRequest r;
  r.mutable_attend()->add_items()->set_sequence_id(std::string(bytes - 64, 's'));
  return r;
}

TEST_F(DataPlaneLimitsTest, BufferedRequestBytesStayWithinTheBudget) {
  const std::string frame = Frame(BigRequest(4 << 20));  // 4 + N bytes, N <= 4 MiB
  const uint64_t charge = frame.size();
  const uint64_t budget = 3 * charge + charge / 2;  // three frames fit, a fourth does not
  server_.reset();
  StartServer({"--max_message_bytes=4194304", absl::StrCat("--data_max_buffered_bytes=", budget)});
  EXPECT_EQ(Metric("tqkv_data_plane_buffered_budget_bytes"), static_cast<double>(budget));
  EXPECT_EQ(Metric("tqkv_data_plane_buffered_bytes"), 0);
  const uint64_t rss0 = ServerRss();

  // Twelve connections each send the preface and all of a frame but its
  // last byte: three are buffered, the other nine are refused and their
  // bytes dropped (without the budget: 48 MiB held).
  constexpr int kConns = 12;
  std::vector<int> held;
  for (int i = 0; i < kConns; ++i) {
    const int fd = RawConnect();
    SendRaw(fd, "TQKVDP01" + frame.substr(0, frame.size() - 1));
    if (i < 3) {
      ASSERT_EQ(AwaitMetric("tqkv_data_plane_buffered_bytes", static_cast<double>((i + 1) * charge)),
                static_cast<double>((i + 1) * charge));
      held.push_back(fd);
      continue;
    }
    v1::DataPlaneReply head;
    ASSERT_TRUE(ReadReply(fd, &head)) << "connection " << i;
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << head.message();
    EXPECT_NE(head.message().find("--data_max_buffered_bytes"), std::string::npos) << head.message();
    EXPECT_NE(head.message().find(absl::StrCat("budget of ", budget)), std::string::npos) << head.message();
    EXPECT_TRUE(ClosedByServer(fd));
    close(fd);
  }
  EXPECT_EQ(Metric("tqkv_data_plane_buffered_bytes"), static_cast<double>(3 * charge));
  EXPECT_EQ(Metric("tqkv_data_plane_budget_refusals_total"), kConns - 3);
  const uint64_t rss1 = ServerRss();
  EXPECT_LT(rss1, rss0 + budget + (16u << 20)) << "RSS grew from " << rss0 << " to " << rss1;

  // The last byte completes a held frame: it is served (the sequence is
  // unknown, not a budget error) and its charge returned.
  v1::DataPlaneReply head;
  SendRaw(held[0], frame.substr(frame.size() - 1));
  ASSERT_TRUE(ReadReply(held[0], &head));
  EXPECT_NE(head.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << head.message();
  EXPECT_NE(head.code(), 0u);
  EXPECT_EQ(Metric("tqkv_data_plane_buffered_bytes"), static_cast<double>(2 * charge));

  // Room for one large frame again, and small requests are served.
  const int again = RawConnect();
  SendRaw(again, "TQKVDP01" + frame);
  ASSERT_TRUE(ReadReply(again, &head));
  EXPECT_NE(head.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << head.message();
  close(again);
  client::DataPlaneClientOptions o;
  o.target = server_->data_address();
  o.timeout = absl::Seconds(30);
  auto dp = client::DataPlaneClient::Connect(o);
  ASSERT_TRUE(dp.ok()) << dp.status();
  v1::AttendRequest at;
  at.add_items()->set_sequence_id("no-such-sequence");
  EXPECT_EQ((*dp)->Attend(at).status().code(), StatusCode::kNotFound);

  // Closed connections return their charges.
  for (int fd : held) close(fd);
  EXPECT_EQ(AwaitMetric("tqkv_data_plane_buffered_bytes", 0), 0);
}

// A frame that does not arrive whole within --data_frame_timeout_s fails
// with DEADLINE_EXCEEDED and frees its charge, even while its client keeps
// sending a byte now and then (which resets the idle timeout).
TEST_F(DataPlaneLimitsTest, ASlowFrameTimesOutAndReturnsItsCharge) {
  server_.reset();
  StartServer({"--data_frame_timeout_s=1"});
  const uint32_t n = 1000;
  const int fd = RawConnect();
  SendRaw(fd, "TQKVDP01" + std::string(reinterpret_cast<const char*>(&n), 4) + "abc");
  ASSERT_EQ(AwaitMetric("tqkv_data_plane_buffered_bytes", 4 + n), 4 + n);
  for (int i = 0; i < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(300));
    send(fd, "x", 1, MSG_NOSIGNAL);  // may fail once the server has closed
  }
  v1::DataPlaneReply head;
  ASSERT_TRUE(ReadReply(fd, &head));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kDeadlineExceeded)) << head.message();
  EXPECT_NE(head.message().find("1000 bytes"), std::string::npos) << head.message();
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
  EXPECT_EQ(Metric("tqkv_data_plane_buffered_bytes"), 0);
  EXPECT_EQ(Metric("tqkv_data_plane_frame_timeouts_total"), 1);
}

// A budget that cannot hold one largest frame (4 + --max_message_bytes)
// is a startup error; one that holds exactly one is served.
TEST_F(DataPlaneLimitsTest, ABudgetBelowOneFrameIsRefusedAtStart) {
  auto low = ServerProcess::Start(MakeTempDir("tqkv-data"),
                                  {"--max_message_bytes=4194304", "--data_max_buffered_bytes=4194307"});
  EXPECT_FALSE(low.ok());
  auto exact = ServerProcess::Start(MakeTempDir("tqkv-data"),
                                    {"--max_message_bytes=4194304", "--data_max_buffered_bytes=4194308"});
  EXPECT_TRUE(exact.ok()) << exact.status();
}

// Requests whose string fields are not UTF-8 (no token needed) make
// protobuf complain; those lines go through the server's rate-limited log,
// so a client sending them in a loop cannot flood it.
// Replies a client does not read hold at most its tenant's share of the
// reply budget: its requests past it are answered RESOURCE_EXHAUSTED naming
// the flag, another tenant is served meanwhile, and the charge returns once
// the replies have been read (without the budget: every request served,
// 48 MiB of replies held less what the sockets' buffers take).
TEST_F(DataPlaneLimitsTest, UnreadRepliesStayWithinTheirTenantsBudget) {
  server_.reset();
  const std::string dir = MakeTempDir("tokens");
  std::ofstream(dir + "/tokens") << "tok-a alpha\ntok-b beta\n";
  chmod((dir + "/tokens").c_str(), 0600);
  constexpr uint64_t kMiB = 1 << 20;
  StartServer({"--auth_tokens_file=" + dir + "/tokens", "--max_message_bytes=1048576", "--data_max_reply_bytes=4MiB",
               "--data_max_reply_bytes_per_tenant=2MiB", "--metrics_auth=false"});
  auto connect = [&](const std::string& token) {
    client::ClientOptions o;
    o.target = server_->address();
    o.token = token;
    return std::move(client::Client::Connect(o)).value();
  };
  // Each tenant stores 48 blocks of 16 KiB dense.
  auto store = [&](client::Client& c, uint64_t seed) {
    auto reg = c.RegisterModel(client::SmallModel("m"));
    EXPECT_TRUE(reg.ok()) << reg.status();
    v1::GetBlocksRequest get;
    get.mutable_model()->set_model_id(reg->model_id());
    get.mutable_model()->set_layout_fingerprint(reg->layout_fingerprint());
    get.set_dense(true);
    v1::PutHeader header;
    *header.mutable_model() = get.model();
    const std::vector<std::string> chain = client::HashChain(seed, 48);
    for (size_t from = 0; from < chain.size(); from += 16) {
      std::vector<v1::PutBlock> blocks;
      for (size_t i = from; i < from + 16; ++i)
        blocks.push_back(client::DenseBlock(client::SmallModel("m").layout(), chain[i], i ? chain[i - 1] : "", i));
      auto put = c.PutBlocks(header, blocks);
      EXPECT_TRUE(put.ok()) << put.status();
    }
    for (const std::string& h : chain) get.add_block_hashes(h);
    return get;
  };
  auto alpha = connect("tok-a");
  auto beta = connect("tok-b");
  const v1::GetBlocksRequest alpha_get = store(*alpha, 1);
  const v1::GetBlocksRequest beta_get = store(*beta, 2);

  // Alpha pipelines 64 dense gets of 768 KiB and reads nothing.
  v1::DataPlaneRequest req;
  req.set_authorization("Bearer tok-a");
  *req.mutable_get_blocks() = alpha_get;
  const int fd = RawConnect();
  std::string frames = "TQKVDP01";
  constexpr int kRequests = 64;
  for (int i = 0; i < kRequests; ++i) frames += Frame(req);
  SendRaw(fd, frames);
  // Every request is served or refused at once; what the sockets' buffers
  // did not take stays queued, within the budget.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_LE(Metric("tqkv_data_plane_reply_bytes"), 2.0 * kMiB);

  // Beta is served meanwhile.
  client::DataPlaneClientOptions o;
  o.target = server_->data_address();
  o.token = "tok-b";
  auto dp = std::move(client::DataPlaneClient::Connect(o)).value();
  client::DataPlaneBlocks out;
  ASSERT_TRUE(dp->GetBlocks(beta_get, &out).ok());

  // Alpha reads: the first replies carry the blocks, the ones past its
  // budget say so.
  int served = 0, refused = 0;
  for (int i = 0; i < kRequests; ++i) {
    v1::DataPlaneReply head;
    std::string payload;
    ASSERT_TRUE(ReadReply(fd, &head, &payload)) << i;
    if (head.code() == 0) {
      EXPECT_EQ(payload.size(), 48u * 16384) << i;
      ++served;
      continue;
    }
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << head.message();
    EXPECT_NE(head.message().find("--data_max_reply_bytes_per_tenant"), std::string::npos) << head.message();
    ++refused;
  }
  close(fd);
  EXPECT_GE(served, 1);
  EXPECT_GE(refused, kRequests / 2);
  EXPECT_EQ(AwaitMetric("tqkv_data_plane_reply_bytes", 0), 0);
}

TEST(ProtobufLogTest, MalformedStringsCannotFloodTheLog) {
  const std::string dir = MakeTempDir("tqkv-data");
  ServerLaunch launch;
  launch.stderr_path = dir + "/stderr";
  auto p = ServerProcess::Start(dir, {}, launch);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string body = "\x0a\x02\xff\xfe";  // authorization = two bytes that are not UTF-8
  const uint32_t n = static_cast<uint32_t>(body.size());
  const std::string frame = "TQKVDP01" + std::string(reinterpret_cast<const char*>(&n), 4) + body;
  const absl::Time start = absl::Now();
  int sent = 0;
  for (; sent < 300 && absl::Now() - start < absl::Milliseconds(900); ++sent) {
    const int fd = RawConnect((*p)->data_address());
    SendRaw(fd, frame);
    v1::DataPlaneReply head;
    ASSERT_TRUE(ReadReply(fd, &head));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
    close(fd);
  }
  EXPECT_EQ(p.value()->Stop(), 0);
  const std::string err = ReadFileOrEmpty(launch.stderr_path);
  size_t lines = 0;
  for (size_t at = err.find("protobuf: "); at != std::string::npos; at = err.find("protobuf: ", at + 1)) ++lines;
  EXPECT_GE(lines, 1u) << err;
  EXPECT_LE(lines, 2 * 20u + 2) << sent << " bad frames; stderr:\n" << err.substr(0, 2000);
  EXPECT_GT(sent, 60) << "too few frames to show the limit";
}

}  // namespace
}  // namespace tqkv::testing
