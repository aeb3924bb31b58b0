// Open put streams are bounded against the real server: a tenant at
// --max_put_streams_per_tenant gets RESOURCE_EXHAUSTED for one more stream
// (gRPC and data plane alike) until one of its streams ends, and a stream
// left open past --put_stream_timeout_s gives back the host memory it held
// while its client still holds it, then fails with DEADLINE_EXCEEDED and
// commits nothing.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/tqkv/v1/tqkv.grpc.pb.h"
#include "tests/fixture.h"
#include "tests/raw_data_plane.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

// One gRPC PutBlocks stream that has sent its header and `blocks` blocks.
struct OpenStream {
  grpc::ClientContext ctx;
  v1::PutBlocksResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::PutBlocksRequest>> w;
  bool Write(const v1::PutBlocksRequest& r) { return w->Write(r); }
  grpc::Status End() {
    w->WritesDone();
    return w->Finish();
  }
};

class PutStreamsTest : public ServerTest {
 protected:
  std::unique_ptr<OpenStream> Open(v1::KvStore::Stub* stub, const v1::ModelRef& model,
                                   const std::vector<std::string>& chain, uint64_t seed) {
    auto s = std::make_unique<OpenStream>();
    s->w = stub->PutBlocks(&s->ctx, &s->resp);
    v1::PutBlocksRequest h;
    *h.mutable_header()->mutable_model() = model;
    s->Write(h);
    const v1::ModelLayout layout = client::SmallModel("x").layout();
    for (size_t i = 0; i < chain.size(); ++i) {
      v1::PutBlocksRequest b;
      *b.mutable_block() = client::DenseBlock(layout, chain[i], i ? chain[i - 1] : "", seed + i);
      s->Write(b);
    }
    return s;
  }

  uint64_t HostUsedBytes() {
    auto text = HttpGet(server_->metrics_address(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    const std::string key = "\ntqkv_host_used_bytes ";
    const size_t at = text.ok() ? text->find(key) : std::string::npos;
    return at == std::string::npos ? ~uint64_t{0} : std::stoull(text->substr(at + key.size()));
  }

  uint32_t Hits(const v1::ModelRef& model, const std::vector<std::string>& hashes) {
    v1::LookupRequest lr;
    *lr.mutable_model() = model;
    for (const auto& h : hashes) lr.add_block_hashes(h);
    auto r = client_->Lookup(lr);
    return r.ok() ? r->hits() : 9999u;
  }
};

TEST_F(PutStreamsTest, ATenantAtItsCapWaitsForOneOfItsStreamsToEnd) {
  StartServer({"--max_put_streams_per_tenant=2"});
  const v1::ModelRef model = RegisterSmall();
  auto stub = v1::KvStore::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  const std::vector<std::string> a = client::HashChain(61, 2), b = client::HashChain(62, 2),
                                 c = client::HashChain(63, 2);
  // Each stream is open once the server holds memory for its blocks.
  auto s1 = Open(stub.get(), model, a, 10);
  uint64_t one = 0;
  for (int i = 0; i < 100 && (one = HostUsedBytes()) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto s2 = Open(stub.get(), model, b, 20);
  for (int i = 0; i < 100 && HostUsedBytes() <= one; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto s3 = Open(stub.get(), model, c, 30);
  grpc::Status refused = s3->End();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("--max_put_streams_per_tenant"), std::string::npos)
      << refused.error_message();
  // The data plane counts the same streams.
  const int fd = RawConnect(server_->data_address());
  SendRaw(fd, "TQKVDP01");
  v1::DataPlaneRequest put;
  *put.mutable_put()->mutable_header()->mutable_model() = model;
  put.mutable_put()->set_commit(true);
  SendRaw(fd, Frame(put));
  v1::DataPlaneReply head;
  ASSERT_TRUE(ReadReply(fd, &head));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << head.message();
  // One stream ends (commits): the next one is taken.
  ASSERT_TRUE(s1->End().ok());
  EXPECT_EQ(Hits(model, a), 2u);
  SendRaw(fd, Frame(put));
  ASSERT_TRUE(ReadReply(fd, &head));
  EXPECT_EQ(head.code(), 0u) << head.message();
  close(fd);
  ASSERT_TRUE(s2->End().ok());
  EXPECT_EQ(Hits(model, b), 2u);
  EXPECT_EQ(Hits(model, c), 0u);
}

TEST_F(PutStreamsTest, AStreamLeftOpenPastItsTimeoutGivesItsMemoryBack) {
  StartServer({"--put_stream_timeout_s=1"});
  const v1::ModelRef model = RegisterSmall();
  auto stub = v1::KvStore::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  const std::vector<std::string> chain = client::HashChain(64, 3);
  auto s = Open(stub.get(), model, chain, 40);
  uint64_t held = 0;
  for (int i = 0; i < 100 && (held = HostUsedBytes()) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GT(held, 0u) << "the open stream's blocks are reserved";
  // The sweep (every second) fails it while the client holds it open.
  uint64_t after = held;
  for (int i = 0; i < 60 && (after = HostUsedBytes()) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(after, 0u) << "an expired stream still holds host memory";
  grpc::Status end = s->End();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << end.error_message();
  EXPECT_NE(end.error_message().find("--put_stream_timeout_s"), std::string::npos) << end.error_message();
  EXPECT_EQ(Hits(model, chain), 0u);
  // A stream that ends in time commits.
  PutDense(model, client::HashChain(65, 2), 50);
  EXPECT_EQ(Hits(model, client::HashChain(65, 2)), 2u);
}

}  // namespace
}  // namespace tqkv::testing
