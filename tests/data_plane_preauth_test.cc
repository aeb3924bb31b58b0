// What an unauthenticated data-plane client can make the server hold, on a
// real server with a token file: a frame over
// --data_max_unauthenticated_frame_bytes is refused at its length prefix
// unless its request fits and authenticates, and a raw payload is read only
// after its request's token held (a wrong token is answered before the
// payload is sent). Connections that authenticated, and large first frames
// with a good token, are served as before.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/cpp/data_plane_client.h"
#include "client/cpp/synthetic.h"
#include "tests/fixture.h"
#include "tests/raw_data_plane.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

constexpr uint64_t kLimit = 16 << 10;

class DataPlanePreauthTest : public ServerTest {
 protected:
  void SetUp() override {
    const std::string dir = MakeTempDir("tokens");
    std::ofstream(dir + "/tokens") << "tok-a alpha\n";
    chmod((dir + "/tokens").c_str(), 0600);
    StartServer({"--auth_tokens_file=" + dir + "/tokens",
                 absl::StrCat("--data_max_unauthenticated_frame_bytes=", kLimit)});
    client::ClientOptions o;
    o.target = server_->address();
    o.token = "tok-a";
    alpha_ = std::move(client::Client::Connect(o)).value();
    auto reg = alpha_->RegisterModel(client::SmallModel("m"));
    ASSERT_TRUE(reg.ok()) << reg.status();
    model_.set_model_id(reg->model_id());
    model_.set_layout_fingerprint(reg->layout_fingerprint());
  }

  int RawConnect() { return testing::RawConnect(server_->data_address()); }

  // The request frame of a one-block get with `token`.
  v1::DataPlaneRequest Get(const std::string& token) const {
    v1::DataPlaneRequest r;
    if (!token.empty()) r.set_authorization("Bearer " + token);
    *r.mutable_get_blocks()->mutable_model() = model_;
    r.mutable_get_blocks()->add_block_hashes(client::HashChain(99, 1)[0]);  // never stored
    return r;
  }

  // A get whose request alone is `bytes` long or more (many hashes).
  v1::DataPlaneRequest BigGet(const std::string& token, size_t bytes) const {
    v1::DataPlaneRequest r = Get(token);
    for (const std::string& h : client::HashChain(98, bytes / 16)) {
      if (r.ByteSizeLong() >= bytes) break;
      r.mutable_get_blocks()->add_block_hashes(h);
    }
    return r;
  }

  std::unique_ptr<client::Client> alpha_;
  v1::ModelRef model_;
};

// A raw put frame with a wrong token: UNAUTHENTICATED comes back with only
// the request sent, its 4 MiB payload never read; the connection closes.
TEST_F(DataPlanePreauthTest, APayloadIsReadOnlyAfterItsTokenHeld) {
  v1::DataPlaneRequest put;
  put.set_authorization("Bearer tok-wrong");
  *put.mutable_put()->mutable_header()->mutable_model() = model_;
  put.mutable_put()->set_commit(true);
  const std::string request = put.SerializeAsString();
  const uint32_t n = static_cast<uint32_t>(request.size());
  const uint64_t payload = 4 << 20;
  std::string head = "TQKVDP02";
  head.append(reinterpret_cast<const char*>(&n), 4);
  head.append(reinterpret_cast<const char*>(&payload), 8);
  head += request;
  const int fd = RawConnect();
  SendRaw(fd, head);
  v1::DataPlaneReply reply;
  ASSERT_TRUE(ReadReply(fd, &reply));
  EXPECT_EQ(reply.code(), static_cast<uint32_t>(StatusCode::kUnauthenticated)) << reply.message();
  shutdown(fd, SHUT_WR);
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
}

// A request over the limit on a connection that has not authenticated is
// refused at its length prefix, naming the flag; once a request of the
// connection has authenticated, the same frame is served.
TEST_F(DataPlanePreauthTest, LargeRequestsWaitForAnAuthenticatedConnection) {
  const std::string big = Frame(BigGet("tok-a", 2 * kLimit));
  {
    const int fd = RawConnect();
    SendRaw(fd, "TQKVDP01" + big.substr(0, 4));  // the length prefix alone
    v1::DataPlaneReply reply;
    ASSERT_TRUE(ReadReply(fd, &reply));
    EXPECT_EQ(reply.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << reply.message();
    EXPECT_NE(reply.message().find("--data_max_unauthenticated_frame_bytes"), std::string::npos)
        << reply.message();
    close(fd);
  }
  {
    const int fd = RawConnect();
    SendRaw(fd, "TQKVDP01" + Frame(Get("tok-a")));
    v1::DataPlaneReply reply;
    ASSERT_TRUE(ReadReply(fd, &reply));
    EXPECT_EQ(reply.code(), static_cast<uint32_t>(StatusCode::kNotFound)) << reply.message();
    SendRaw(fd, big);
    ASSERT_TRUE(ReadReply(fd, &reply));
    EXPECT_EQ(reply.code(), static_cast<uint32_t>(StatusCode::kNotFound)) << reply.message();
    close(fd);
  }
  {
    // A failed small request does not authenticate the connection.
    const int fd = RawConnect();
    SendRaw(fd, "TQKVDP01" + Frame(Get("tok-wrong")));
    v1::DataPlaneReply reply;
    ASSERT_TRUE(ReadReply(fd, &reply));
    EXPECT_EQ(reply.code(), static_cast<uint32_t>(StatusCode::kUnauthenticated)) << reply.message();
    SendRaw(fd, big.substr(0, 4));
    ASSERT_TRUE(ReadReply(fd, &reply));
    EXPECT_EQ(reply.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << reply.message();
    close(fd);
  }
}

// A prefill worker's first frame, a put far over the limit with raw
// payloads and a good token, commits as usual.
TEST_F(DataPlanePreauthTest, ALargeFirstPutWithAGoodTokenCommits) {
  client::DataPlaneClientOptions o;
  o.target = server_->data_address();
  o.token = "tok-a";
  auto dp = std::move(client::DataPlaneClient::Connect(o)).value();
  v1::PutHeader header;
  *header.mutable_model() = model_;
  std::vector<v1::PutBlock> blocks;
  const std::vector<std::string> chain = client::HashChain(5, 64);
  size_t bytes = 0;
  for (size_t i = 0; bytes < 4 * kLimit; ++i) {
    blocks.push_back(client::DenseBlock(client::SmallModel("m").layout(), chain[i], i ? chain[i - 1] : "", i));
    bytes += blocks.back().k().data().size() + blocks.back().v().data().size();
  }
  auto r = dp->PutBlocks(header, blocks);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->committed(), blocks.size());
}

}  // namespace
}  // namespace tqkv::testing
