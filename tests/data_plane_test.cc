// The data plane (bulk packed reads and puts over plain TCP) against the
// real server: bytes identical to gRPC GetBlocks and to a local CPU encode,
// puts that store what gRPC PutBlocks stores and commit nothing when they
// fail or break, layer ranges,
// every request error with its code and a connection that stays usable,
// protocol errors on raw sockets (bad preface, oversized and unparsable
// frames, truncated streams), pipelining, auth and tenancy, blocks served
// from disk after eviction, concurrent clients, and the request counter.
#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/data_plane_client.h"
#include "tests/fixture.h"
#include "tests/raw_data_plane.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

class DataPlaneTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }

  std::unique_ptr<client::DataPlaneClient> Dp(const std::string& token = "") {
    return ConnectDataPlane(server_->data_address(), token);
  }

  static v1::GetBlocksRequest Req(const v1::ModelRef& model, const std::vector<std::string>& hashes) {
    return GetBlocksReq(model, hashes);
  }

  // gRPC GetBlocks payloads of `req`, in order.
  std::vector<std::string> GrpcPayloads(const v1::GetBlocksRequest& req) {
    auto r = client_->GetBlocks(req);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::string> out;
    if (r.ok())
      for (const auto& m : *r) out.push_back(m.payload());
    return out;
  }

  int RawConnect() { return testing::RawConnect(server_->data_address()); }


  uint64_t DataGetRequests(const std::string& method = "DataGetBlocks") {
    auto text = HttpGet(server_->metrics_address(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    const std::string key = "tqkv_rpc_requests_total{method=\"" + method + "\"} ";
    const size_t at = text.ok() ? text->find(key) : std::string::npos;
    if (at == std::string::npos) return 0;
    return std::stoull(text->substr(at + key.size()));
  }
};

TEST_F(DataPlaneTest, ServesTheStoredBytesLikeGrpcGetBlocks) {
  ASSERT_FALSE(server_->data_address().empty());
  // Stats advertises it, so clients can find it from the gRPC address.
  auto stats = client_->Stats(v1::StatsRequest());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->data_plane_address(), server_->data_address());
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(3, 40);
  std::vector<v1::PutBlock> sent = PutDense(model, chain, 500);
  auto codec = SmallCodec();
  CpuBackend backend{CpuBackend::Options{0}};

  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  client::DataPlaneBlocks out;
  const v1::GetBlocksRequest req = Req(model, chain);
  ASSERT_TRUE(dp->GetBlocks(req, &out, /*with_format=*/true).ok());
  ASSERT_EQ(out.size(), chain.size());
  const std::vector<std::string> grpc = GrpcPayloads(req);
  ASSERT_EQ(grpc.size(), chain.size());
  for (size_t i = 0; i < chain.size(); ++i) {
    EXPECT_EQ(out.reply().blocks(i).block_hash(), chain[i]);
    EXPECT_EQ(out.reply().blocks(i).tier(), v1::TIER_HOST);
    EXPECT_EQ(out.payload(i), grpc[i]) << "block " << i;
    EXPECT_EQ(out.payload(i), EncodeLocally(*codec, backend, sent[i])) << "block " << i;
  }
  EXPECT_EQ(out.reply().format().block_bytes(), codec->block_bytes());
  EXPECT_EQ(out.reply().format().layers_size(), codec->shape().num_layers);

  // Without with_format the reply carries no format; a layer range serves
  // exactly those layers' bytes.
  v1::GetBlocksRequest range = Req(model, {chain[7], chain[3]});
  range.set_first_layer(1);
  range.set_last_layer(2);
  ASSERT_TRUE(dp->GetBlocks(range, &out).ok());
  EXPECT_FALSE(out.reply().has_format());
  const std::vector<std::string> grpc_range = GrpcPayloads(range);
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(grpc_range.size(), 2u);
  EXPECT_EQ(out.payload(0), grpc_range[0]);
  EXPECT_EQ(out.payload(1), grpc_range[1]);
  EXPECT_EQ(out.payload(0).size(), codec->layer_range_bytes(1, 2));
}

// Puts over the data plane store exactly what gRPC PutBlocks stores for the
// same input: dense whole blocks in many frames, packed blocks, layer
// ranges put in two streams; a repeated put counts the blocks as present.
TEST_F(DataPlaneTest, PutsStoreTheBytesOfGrpcPutBlocks) {
  const v1::ModelRef model = RegisterSmall();
  const v1::ModelLayout layout = client::SmallModel("x").layout();
  const std::vector<std::string> via_grpc = client::HashChain(11, 24), via_dp = client::HashChain(12, 24);
  PutDense(model, via_grpc, 700);
  std::vector<v1::PutBlock> blocks;
  for (size_t i = 0; i < via_dp.size(); ++i)
    blocks.push_back(client::DenseBlock(layout, via_dp[i], i ? via_dp[i - 1] : "", 700 + i));
  v1::PutHeader header;
  *header.mutable_model() = model;
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  const uint64_t frames_before = DataGetRequests("DataPutBlocks");
  // Frames of 3 blocks: 8 of them, then the commit frame.
  const size_t frame_bytes = 3 * blocks[0].ByteSizeLong() - 1;
  absl::StatusOr<v1::PutBlocksResponse> put = dp->PutBlocks(header, blocks, frame_bytes);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->committed(), via_dp.size());
  EXPECT_EQ(put->already_present(), 0u);
  EXPECT_EQ(DataGetRequests("DataPutBlocks") - frames_before, 9u);
  const std::vector<std::string> want = GrpcPayloads(Req(model, via_grpc));
  const std::vector<std::string> got = GrpcPayloads(Req(model, via_dp));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "block " << i;

  // The same blocks again: present, nothing new.
  put = dp->PutBlocks(header, blocks, frame_bytes);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->committed(), 0u);
  EXPECT_EQ(put->already_present(), via_dp.size());

  // Packed: the stored payloads under new hashes, in one frame.
  const std::vector<std::string> packed_hashes = client::HashChain(13, 5);
  v1::PutHeader packed = header;
  packed.set_packed(true);
  std::vector<v1::PutBlock> packed_blocks(packed_hashes.size());
  for (size_t i = 0; i < packed_hashes.size(); ++i) {
    packed_blocks[i].set_block_hash(packed_hashes[i]);
    packed_blocks[i].set_payload(want[i]);
  }
  put = dp->PutBlocks(packed, packed_blocks);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->committed(), packed_hashes.size());
  const std::vector<std::string> got_packed = GrpcPayloads(Req(model, packed_hashes));
  ASSERT_EQ(got_packed.size(), packed_hashes.size());
  for (size_t i = 0; i < packed_hashes.size(); ++i) EXPECT_EQ(got_packed[i], want[i]);

  // Layer-range puts: layer 0, then layer 1, in two streams each, over gRPC
  // and over the data plane; visible after the second, with equal bytes.
  const std::string ranged_grpc = client::ChainHash("ranged", 1, 1), ranged_dp = client::ChainHash("ranged", 2, 1);
  for (int layer = 0; layer < 2; ++layer) {
    v1::PutHeader h = header;
    h.set_first_layer(layer);
    h.set_last_layer(layer + 1);
    auto g = client_->PutBlocks(h, {client::DenseBlock(layout, ranged_grpc, "", 800, layer, layer + 1)});
    ASSERT_TRUE(g.ok()) << g.status();
    put = dp->PutBlocks(h, {client::DenseBlock(layout, ranged_dp, "", 800, layer, layer + 1)});
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_EQ(put->staged(), layer == 0 ? 1u : 0u);
    EXPECT_EQ(put->committed(), layer == 0 ? 0u : 1u);
  }
  const std::vector<std::string> ranged = GrpcPayloads(Req(model, {ranged_grpc, ranged_dp}));
  ASSERT_EQ(ranged.size(), 2u);
  EXPECT_EQ(ranged[1], ranged[0]);
}

// A put stream that fails or breaks commits nothing: a frame before the
// header, a bad block in the middle (the frames after it and the commit
// get its error), a connection closed before the commit. The connection
// of a failed stream serves the next stream.
TEST_F(DataPlaneTest, FailedOrBrokenPutStreamsCommitNothing) {
  const v1::ModelRef model = RegisterSmall();
  const v1::ModelLayout layout = client::SmallModel("x").layout();
  const std::vector<std::string> chain = client::HashChain(21, 6);
  auto lookup_hits = [&](const std::vector<std::string>& hashes) {
    v1::LookupRequest lr;
    *lr.mutable_model() = model;
    for (const auto& h : hashes) lr.add_block_hashes(h);
    auto r = client_->Lookup(lr);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->hits() : 9999u;
  };
  auto put_frame = [&](bool header, std::vector<v1::PutBlock> blocks, bool commit) {
    v1::DataPlaneRequest r;
    if (header) *r.mutable_put()->mutable_header()->mutable_model() = model;
    for (auto& b : blocks) *r.mutable_put()->add_blocks() = std::move(b);
    r.mutable_put()->set_commit(commit);
    return Frame(r);
  };
  const int fd = RawConnect();
  SendRaw(fd, "TQKVDP01");
  // Blocks before any header; the commit frame ends that stream.
  SendRaw(fd, put_frame(false, {client::DenseBlock(layout, chain[0], "", 1)}, false));
  SendRaw(fd, put_frame(false, {client::DenseBlock(layout, chain[1], "", 2)}, true));
  v1::DataPlaneReply head;
  std::string payload;
  ASSERT_TRUE(ReadReply(fd, &head, &payload));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument)) << head.message();
  ASSERT_TRUE(ReadReply(fd, &head, &payload));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument)) << head.message();
  EXPECT_FALSE(head.has_put());
  // A good block, then a block with a wrong shape, then more frames and the
  // commit: every frame from the bad one on carries its error.
  v1::PutBlock bad = client::DenseBlock(layout, chain[1], chain[0], 2);
  bad.mutable_k()->set_dtype(v1::DTYPE_UNSPECIFIED);
  SendRaw(fd, put_frame(true, {client::DenseBlock(layout, chain[0], "", 1)}, false));
  SendRaw(fd, put_frame(false, {bad}, false));
  SendRaw(fd, put_frame(false, {client::DenseBlock(layout, chain[2], chain[1], 3)}, false));
  SendRaw(fd, put_frame(false, {}, true));
  const StatusCode want[] = {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kInvalidArgument,
                             StatusCode::kInvalidArgument};
  for (StatusCode code : want) {
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(code)) << head.message();
  }
  EXPECT_EQ(lookup_hits({chain[0]}), 0u);
  // The connection serves the next stream.
  SendRaw(fd, put_frame(true, {client::DenseBlock(layout, chain[3], "", 4)}, true));
  ASSERT_TRUE(ReadReply(fd, &head, &payload));
  EXPECT_EQ(head.code(), 0u) << head.message();
  EXPECT_EQ(head.put().committed(), 1u);
  EXPECT_EQ(lookup_hits({chain[3]}), 1u);
  // A stream whose connection closes before its commit frame.
  SendRaw(fd, put_frame(true, {client::DenseBlock(layout, chain[4], "", 5)}, false));
  SendRaw(fd, put_frame(false, {client::DenseBlock(layout, chain[5], chain[4], 6)}, false));
  ASSERT_TRUE(ReadReply(fd, &head, &payload));
  ASSERT_TRUE(ReadReply(fd, &head, &payload));
  EXPECT_EQ(head.code(), 0u) << head.message();
  close(fd);
  EXPECT_EQ(lookup_hits({chain[4]}), 0u);
  EXPECT_EQ(lookup_hits({chain[5]}), 0u);
}

// Dense reads over the data plane return gRPC GetBlocks' decoded K then V
// bytes: fp16, bf16 and fp32, whole blocks and a layer range.
TEST_F(DataPlaneTest, DenseReadsReturnTheBytesOfGrpcDenseGetBlocks) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(31, 5);
  PutDense(model, chain, 900);
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  client::DataPlaneBlocks out;
  for (v1::DType dt : {v1::DTYPE_FP16, v1::DTYPE_BF16, v1::DTYPE_FP32}) {
    for (int first : {0, 1}) {
      SCOPED_TRACE(absl::StrCat("dtype ", dt, ", layers from ", first));
      v1::GetBlocksRequest req = Req(model, {chain[3], chain[0], chain[4]});
      req.set_dense(true);
      req.set_dense_dtype(dt);
      req.set_first_layer(first);
      ASSERT_TRUE(dp->GetBlocks(req, &out).ok());
      auto grpc = client_->GetBlocks(req);
      ASSERT_TRUE(grpc.ok()) << grpc.status();
      ASSERT_EQ(out.size(), 3u);
      ASSERT_EQ(grpc->size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        const std::string want = (*grpc)[i].k().data() + (*grpc)[i].v().data();
        EXPECT_EQ(out.reply().blocks(i).block_hash(), req.block_hashes(i));
        EXPECT_EQ(out.payload(i).size(), want.size());
        EXPECT_TRUE(out.payload(i) == want) << "block " << i;
      }
    }
  }
}

TEST_F(DataPlaneTest, RequestErrorsGetTheirCodeAndTheConnectionStaysUsable) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(4, 3);
  PutDense(model, chain, 600);
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  client::DataPlaneBlocks out;
  const uint64_t before = DataGetRequests();

  v1::GetBlocksRequest unknown = Req(model, chain);
  unknown.mutable_model()->set_model_id(model.model_id() ^ 1);
  v1::GetBlocksRequest stale = Req(model, chain);
  stale.mutable_model()->set_layout_fingerprint(std::string(32, '0'));
  v1::GetBlocksRequest missing = Req(model, {chain[0], "not-stored", chain[1]});
  v1::GetBlocksRequest dup = Req(model, {chain[0], chain[0]});
  v1::GetBlocksRequest layers = Req(model, chain);
  layers.set_first_layer(2);
  layers.set_last_layer(1);
  v1::GetBlocksRequest no_model = Req(model, chain);
  no_model.clear_model();
  const std::vector<std::pair<v1::GetBlocksRequest, StatusCode>> cases = {
      {unknown, StatusCode::kNotFound},
      {stale, StatusCode::kFailedPrecondition},
      {missing, StatusCode::kNotFound},
      {dup, StatusCode::kInvalidArgument},
      {layers, StatusCode::kInvalidArgument},
      {no_model, StatusCode::kInvalidArgument},
  };
  for (const auto& [req, code] : cases) {
    absl::Status s = dp->GetBlocks(req, &out);
    EXPECT_EQ(s.code(), code) << s;
    // The gRPC path answers the same code.
    EXPECT_EQ(client_->GetBlocks(req).status().code(), code);
    // Same connection, next request fine.
    ASSERT_TRUE(dp->GetBlocks(Req(model, chain), &out).ok());
    EXPECT_EQ(out.size(), chain.size());
  }
  // A dense read of an unknown dtype: the gRPC path's code.
  v1::GetBlocksRequest dense = Req(model, chain);
  dense.set_dense(true);
  dense.set_dense_dtype(static_cast<v1::DType>(99));
  EXPECT_EQ(dp->GetBlocks(dense, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->GetBlocks(dense).status().code(), StatusCode::kInvalidArgument);
  // Every request was counted: 6 errors + 6 successes + the dense one.
  EXPECT_EQ(DataGetRequests() - before, 13u);
  // Nothing changed.
  EXPECT_EQ(Blocks(model), chain.size());
}

TEST_F(DataPlaneTest, ProtocolErrorsAnswerOnceAndClose) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(5, 2);
  PutDense(model, chain, 700);
  v1::DataPlaneReply head;
  std::string payload;

  {  // Not the preface (an HTTP/2 client by mistake).
    int fd = RawConnect();
    SendRaw(fd, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
    EXPECT_NE(head.message().find("preface"), std::string::npos) << head.message();
    EXPECT_TRUE(ClosedByServer(fd));
    close(fd);
  }
  {  // A frame over the limit (the server's limit is --max_message_bytes).
    int fd = RawConnect();
    const uint32_t huge = 1u << 30;
    SendRaw(fd, std::string("TQKVDP01") + std::string(reinterpret_cast<const char*>(&huge), 4));
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted));
    EXPECT_TRUE(ClosedByServer(fd));
    close(fd);
  }
  {  // A frame that is not a DataPlaneRequest.
    int fd = RawConnect();
    const std::string junk = "\xff\xff\xff\xff\x0f";
    const uint32_t n = static_cast<uint32_t>(junk.size());
    SendRaw(fd, std::string("TQKVDP01") + std::string(reinterpret_cast<const char*>(&n), 4) + junk);
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
    EXPECT_TRUE(ClosedByServer(fd));
    close(fd);
  }
  {  // An empty request (no operation): an ordinary error, connection kept.
    int fd = RawConnect();
    v1::DataPlaneRequest empty;
    v1::DataPlaneRequest get;
    *get.mutable_get_blocks() = Req(model, chain);
    // Pipelined: three frames in one write, three replies in order.
    SendRaw(fd, std::string("TQKVDP01") + Frame(empty) + Frame(get) + Frame(get));
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(ReadReply(fd, &head, &payload));
      EXPECT_EQ(head.code(), 0u) << head.message();
      EXPECT_EQ(head.blocks_size(), 2);
      EXPECT_EQ(payload.size(), 2 * SmallCodec()->block_bytes());
    }
    // A truncated frame, then the client goes away: nothing to answer.
    const uint32_t n = 100;
    SendRaw(fd, std::string(reinterpret_cast<const char*>(&n), 4) + "abc");
    close(fd);
  }
  // The server is unaffected.
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  client::DataPlaneBlocks out;
  EXPECT_TRUE(dp->GetBlocks(Req(model, chain), &out).ok());
}

TEST_F(DataPlaneTest, ServesBlocksFromDiskAfterEviction) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(6, 12);
  std::vector<v1::PutBlock> sent = PutDense(model, chain, 800);
  ASSERT_TRUE(client_->Evict(v1::EvictRequest()).ok());
  ASSERT_EQ(Blocks(model, v1::TIER_DISK), chain.size());
  auto codec = SmallCodec();
  CpuBackend backend{CpuBackend::Options{0}};
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  client::DataPlaneBlocks out;
  ASSERT_TRUE(dp->GetBlocks(Req(model, chain), &out).ok());
  for (size_t i = 0; i < chain.size(); ++i) {
    EXPECT_EQ(out.reply().blocks(i).tier(), v1::TIER_DISK);
    EXPECT_EQ(out.payload(i), EncodeLocally(*codec, backend, sent[i]));
  }
}

TEST_F(DataPlaneTest, ConcurrentClientsGetTheirOwnBlocks) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(7, 64);
  std::vector<v1::PutBlock> sent = PutDense(model, chain, 900);
  auto codec = SmallCodec();
  CpuBackend backend{CpuBackend::Options{0}};
  std::vector<std::string> want;
  for (const auto& b : sent) want.push_back(EncodeLocally(*codec, backend, b));
  constexpr int kThreads = 16, kRequests = 200;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      auto dp = Dp();
      if (dp == nullptr) {
        bad[t] = kRequests;
        return;
      }
      client::DataPlaneBlocks out;
      for (int r = 0; r < kRequests; ++r) {
        const size_t a = (t * 7 + r * 13) % chain.size(), b = (a + 1 + t) % chain.size();
        if (!dp->GetBlocks(Req(model, {chain[a], chain[b]}), &out).ok() || out.size() != 2 ||
            out.payload(0) != want[a] || out.payload(1) != want[b])
          ++bad[t];
      }
    });
  for (auto& th : ts) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

TEST_F(DataPlaneTest, AttendGivesTheSameOutputsAsGrpcAttend) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(8, 6);
  PutDense(model, chain, 1000);
  const std::string seq = NewSequence(model, chain, 5, 21);
  ASSERT_FALSE(seq.empty());
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  const uint64_t before = DataGetRequests("DataAttend");
  for (int layer = 0; layer < 2; ++layer) {
    const v1::AttendRequest at = OneQueryAttend(seq, layer, v1::DTYPE_FP16, 30 + layer);
    auto via_grpc = client_->Attend(at);
    auto via_dp = dp->Attend(at);
    ASSERT_TRUE(via_grpc.ok()) << via_grpc.status();
    ASSERT_TRUE(via_dp.ok()) << via_dp.status();
    ASSERT_EQ(via_dp->outputs_size(), 1);
    EXPECT_EQ(via_dp->outputs(0).dtype(), v1::DTYPE_FP16);
    EXPECT_EQ(via_dp->outputs(0).data(), via_grpc->outputs(0).data()) << "layer " << layer;
    EXPECT_NE(via_dp->outputs(0).data(), std::string(via_dp->outputs(0).data().size(), '\0'));
  }
  // Errors: the same codes as gRPC, and the connection stays usable.
  v1::AttendRequest bad;
  bad.set_layer(0);
  bad.add_items()->set_sequence_id("no-such-sequence");
  *bad.mutable_items(0)->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 40);
  EXPECT_EQ(dp->Attend(bad).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(client_->Attend(bad).status().code(), StatusCode::kNotFound);
  v1::AttendRequest layer_out = bad;
  layer_out.mutable_items(0)->set_sequence_id(seq);
  layer_out.set_layer(7);
  EXPECT_EQ(dp->Attend(layer_out).status().code(), client_->Attend(layer_out).status().code());
  EXPECT_NE(dp->Attend(layer_out).status().code(), StatusCode::kOk);
  v1::AttendRequest ok = bad;
  ok.mutable_items(0)->set_sequence_id(seq);
  EXPECT_TRUE(dp->Attend(ok).ok());
  EXPECT_EQ(DataGetRequests("DataAttend") - before, 6u);  // 2 layers, 3 errors, 1 ok
}

// A decode worker's step: the layer's new token rides in the Attend call.
// Append then Attend (gRPC), Attend with new tokens (gRPC), Attend with
// new tokens (data plane) and one data-plane Attend whose two items both
// carry new tokens (their blocks fill in the same call and pack in one
// batch) on five identical sequences give the same bytes at every step and
// layer, across the block fill; a call that fails leaves every sequence
// unchanged.
TEST_F(DataPlaneTest, DecodeStepAppendsAndAttendsInOneCall) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(7, 3);
  PutDense(model, chain, 1100);
  v1::CreateSequenceRequest cs;
  *cs.mutable_model() = model;
  for (const auto& h : chain) cs.add_block_hashes(h);
  *cs.mutable_tail_k() = client::RandomTensor(v1::DTYPE_FP16, {2, 5, 2, 64}, 51);
  *cs.mutable_tail_v() = client::RandomTensor(v1::DTYPE_FP16, {2, 5, 2, 64}, 52);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto seq = client_->CreateSequence(cs);
    ASSERT_TRUE(seq.ok()) << seq.status();
    ids.push_back(seq->sequence_id());
  }
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  uint64_t tokens = 3 * 16 + 5;
  for (int step = 0; step < 20; ++step, ++tokens) {  // the tail fills at step 10
    for (int layer = 0; layer < 2; ++layer) {
      const v1::Tensor k = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, 1000 + 2 * (step * 2 + layer));
      const v1::Tensor v = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, 1001 + 2 * (step * 2 + layer));
      const v1::Tensor q = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 5000 + step * 2 + layer);
      v1::AppendRequest ap;
      ap.set_sequence_id(ids[0]);
      ap.set_layer(layer);
      *ap.mutable_k() = k;
      *ap.mutable_v() = v;
      auto appended = client_->Append(ap);
      ASSERT_TRUE(appended.ok()) << appended.status();
      EXPECT_EQ(appended->num_tokens(), tokens + 1);
      v1::AttendRequest at;
      at.set_layer(layer);
      v1::AttendItem* item = at.add_items();
      item->set_sequence_id(ids[0]);
      *item->mutable_q() = q;
      auto two_calls = client_->Attend(at);
      ASSERT_TRUE(two_calls.ok()) << two_calls.status();
      item->set_sequence_id(ids[1]);
      *item->mutable_k() = k;
      *item->mutable_v() = v;
      auto one_call = client_->Attend(at);
      ASSERT_TRUE(one_call.ok()) << one_call.status();
      item->set_sequence_id(ids[2]);
      auto data_plane = dp->Attend(at);
      ASSERT_TRUE(data_plane.ok()) << data_plane.status();
      item->set_sequence_id(ids[3]);
      *at.add_items() = *item;
      at.mutable_items(1)->set_sequence_id(ids[4]);
      auto pair = dp->Attend(at);
      ASSERT_TRUE(pair.ok()) << pair.status();
      SCOPED_TRACE(absl::StrCat("step ", step, " layer ", layer));
      EXPECT_EQ(one_call->outputs(0).data(), two_calls->outputs(0).data());
      EXPECT_EQ(data_plane->outputs(0).data(), two_calls->outputs(0).data());
      EXPECT_EQ(pair->outputs(0).data(), two_calls->outputs(0).data());
      EXPECT_EQ(pair->outputs(1).data(), two_calls->outputs(0).data());
      EXPECT_NE(one_call->outputs(0).data(), std::string(one_call->outputs(0).data().size(), '\0'));
    }
  }

  // Failures change nothing: ids[1] then takes one more token over the
  // data plane's Append and reports the count it had plus one.
  const v1::Tensor k = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, 90);
  const v1::Tensor v = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, 91);
  auto step = [&](const std::string& id) {
    v1::AttendItem item;
    item.set_sequence_id(id);
    *item.mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 92);
    *item.mutable_k() = k;
    *item.mutable_v() = v;
    return item;
  };
  std::vector<std::pair<std::string, v1::AttendRequest>> bad;
  {
    v1::AttendRequest r;  // a later item's position is outside its sequence
    *r.add_items() = step(ids[1]);
    v1::AttendItem* other = r.add_items();
    other->set_sequence_id(ids[0]);
    *other->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 93);
    other->add_positions(100000);
    bad.emplace_back("position", r);
  }
  {
    v1::AttendRequest r;  // as above, after new tokens that pack blocks and leave a new tail
    *r.add_items() = step(ids[1]);
    *r.mutable_items(0)->mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {40, 2, 64}, 96);
    *r.mutable_items(0)->mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {40, 2, 64}, 97);
    v1::AttendItem* other = r.add_items();
    other->set_sequence_id(ids[0]);
    *other->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 93);
    other->add_positions(100000);
    bad.emplace_back("position after packing", r);
  }
  {
    v1::AttendRequest r;  // a later item names no sequence
    *r.add_items() = step(ids[1]);
    *r.add_items() = step("no-such-sequence");
    bad.emplace_back("unknown sequence", r);
  }
  {
    v1::AttendRequest r;  // the same sequence gets new tokens twice
    *r.add_items() = step(ids[1]);
    *r.add_items() = step(ids[1]);
    bad.emplace_back("twice", r);
  }
  {
    v1::AttendRequest r;  // k without v
    *r.add_items() = step(ids[1]);
    r.mutable_items(0)->clear_v();
    bad.emplace_back("k without v", r);
  }
  {
    v1::AttendRequest r;  // new tokens of the wrong shape
    *r.add_items() = step(ids[1]);
    *r.mutable_items(0)->mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {1, 3, 64}, 94);
    *r.mutable_items(0)->mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {1, 3, 64}, 95);
    bad.emplace_back("shape", r);
  }
  for (const auto& [what, r] : bad) {
    const absl::StatusCode want =
        what == "unknown sequence" ? StatusCode::kNotFound : StatusCode::kInvalidArgument;
    EXPECT_EQ(client_->Attend(r).status().code(), want) << what;
    EXPECT_EQ(dp->Attend(r).status().code(), want) << what;
  }
  for (int layer = 0; layer < 2; ++layer) {  // ids[1] still attends exactly as ids[0]
    v1::AttendRequest same;
    same.set_layer(layer);
    v1::AttendItem* a = same.add_items();
    a->set_sequence_id(ids[0]);
    *a->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 98);
    *same.add_items() = *a;
    same.mutable_items(1)->set_sequence_id(ids[1]);
    auto r = dp->Attend(same);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outputs(0).data(), r->outputs(1).data()) << "layer " << layer;
  }
  v1::AppendRequest ap;
  ap.set_sequence_id(ids[1]);
  ap.set_layer(0);
  *ap.mutable_k() = k;
  *ap.mutable_v() = v;
  auto appended = dp->Append(ap);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->num_tokens(), tokens + 1);
  ap.set_layer(5);
  EXPECT_EQ(dp->Append(ap).status().code(), StatusCode::kInvalidArgument);
  ap.set_sequence_id("no-such-sequence");
  EXPECT_EQ(dp->Append(ap).status().code(), StatusCode::kNotFound);
}

// The server's CPU seconds so far (user + system), from /proc.
double CpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(f, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::vector<std::string> fields{std::istream_iterator<std::string>(rest), std::istream_iterator<std::string>()};
  if (fields.size() < 13) return -1;
  return (std::stod(fields[11]) + std::stod(fields[12])) / sysconf(_SC_CLK_TCK);
}

// Out of file descriptors, the data plane stops watching its listener for a
// moment instead of waking up for the pending connection in a loop, and it
// accepts and serves again once descriptors are free.
TEST_F(DataPlaneTest, OutOfDescriptorsDoesNotSpinAndRecovers) {
  const pid_t pid = server_->pid();
  size_t open = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) ++open;
  rlimit old{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &old), 0);
  rlimit tight = {open + 4, old.rlim_max};
  if (prlimit(pid, RLIMIT_NOFILE, &tight, nullptr) != 0) GTEST_SKIP() << "cannot set the server's descriptor limit";
  std::vector<int> fds;
  for (int i = 0; i < 12; ++i) fds.push_back(RawConnect());  // 4 accepted, the rest wait in the backlog
  absl::SleepFor(absl::Milliseconds(300));
  const double cpu0 = CpuSeconds(pid);
  absl::SleepFor(absl::Seconds(1));
  const double busy = CpuSeconds(pid) - cpu0;
  EXPECT_GE(cpu0, 0);
  EXPECT_LT(busy, 0.3) << "CPU seconds in one second while out of descriptors";
  for (int fd : fds) close(fd);
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &old, nullptr), 0);
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  v1::AttendRequest at;
  at.add_items()->set_sequence_id("no-such-sequence");
  EXPECT_EQ(dp->Attend(at).status().code(), StatusCode::kNotFound);
}

// --data_busy_poll: a loop polls for a while after each request (its
// replies are gRPC's) and sleeps once the window has passed; a window
// outside 0..1s is refused at start.
TEST_F(DataPlaneTest, BusyPollServesLikeGrpcAndThenSleeps) {
  server_.reset();
  StartServer({"--data_busy_poll=300ms", "--data_threads=1"});
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(8, 3);
  PutDense(model, chain, 1200);
  const std::string seq = NewSequence(model, chain, 5, 23);
  ASSERT_FALSE(seq.empty());
  auto dp = Dp();
  ASSERT_NE(dp, nullptr);
  for (int i = 0; i < 20; ++i) {
    const v1::AttendRequest at = OneQueryAttend(seq, i % 2, v1::DTYPE_FP16, 60 + i);
    auto via_grpc = client_->Attend(at);
    auto via_dp = dp->Attend(at);
    ASSERT_TRUE(via_grpc.ok()) << via_grpc.status();
    ASSERT_TRUE(via_dp.ok()) << via_dp.status();
    EXPECT_EQ(via_dp->outputs(0).data(), via_grpc->outputs(0).data()) << "call " << i;
  }
  // Within the window the loop polls (CPU time accrues); past it, it sleeps.
  const pid_t pid = server_->pid();
  const double cpu0 = CpuSeconds(pid);
  absl::SleepFor(absl::Milliseconds(200));
  const double polling = CpuSeconds(pid) - cpu0;
  absl::SleepFor(absl::Milliseconds(300));
  const double cpu1 = CpuSeconds(pid);
  absl::SleepFor(absl::Seconds(1));
  const double idle = CpuSeconds(pid) - cpu1;
  EXPECT_GT(polling, 0.02) << "CPU seconds in the first 200 ms of the window";
  EXPECT_LT(idle, 0.2) << "CPU seconds in one second after the window";

  auto [refused, refused_err] = FailedStart({"--data_busy_poll=2s"});
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused_err.find("--data_busy_poll 2s is outside 0..1s"), std::string::npos) << refused_err;
}

// Idle connections are closed, and a connection over the cap gets
// RESOURCE_EXHAUSTED and is closed; the others are served as before.
TEST_F(DataPlaneTest, IdleConnectionsCloseAndTheConnectionCapHolds) {
  server_.reset();
  StartServer({"--data_idle_timeout_s=1", "--data_max_connections=2"});
  v1::DataPlaneRequest attend;
  attend.mutable_attend()->add_items()->set_sequence_id("no-such-sequence");
  v1::DataPlaneReply head;
  std::string payload;
  const int a = RawConnect(), b = RawConnect();
  SendRaw(a, "TQKVDP01" + Frame(attend));
  ASSERT_TRUE(ReadReply(a, &head, &payload));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kNotFound));
  SendRaw(b, "TQKVDP01");
  absl::SleepFor(absl::Milliseconds(200));  // both registered
  const int c = RawConnect();
  SendRaw(c, "TQKVDP01" + Frame(attend));
  ASSERT_TRUE(ReadReply(c, &head, &payload));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << head.message();
  shutdown(c, SHUT_WR);
  EXPECT_TRUE(ClosedByServer(c));
  close(c);
  SendRaw(a, Frame(attend));  // still served
  ASSERT_TRUE(ReadReply(a, &head, &payload));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kNotFound));
  // Silent for more than a second: both are closed within the next sweep.
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_TRUE(ClosedByServer(a));
  EXPECT_TRUE(ClosedByServer(b));
  close(a);
  close(b);
  auto dp = Dp();  // room again
  ASSERT_NE(dp, nullptr);
  EXPECT_EQ(dp->Attend(attend.attend()).status().code(), StatusCode::kNotFound);
}

TEST_F(DataPlaneTest, TenancyComesFromTheToken) {
  server_.reset();
  client_.reset();
  data_dir_.clear();
  const std::string dir = MakeTempDir("tokens");
  std::ofstream(dir + "/tokens") << "tok-a alpha\ntok-b beta\n";
  chmod((dir + "/tokens").c_str(), 0600);  // the server refuses files others may read
  StartServer({"--auth_tokens_file=" + dir + "/tokens"});
  client::ClientOptions o;
  o.target = server_->address();
  o.token = "tok-a";
  auto a = std::move(client::Client::Connect(o)).value();
  auto reg = a->RegisterModel(client::SmallModel("m"));
  ASSERT_TRUE(reg.ok()) << reg.status();
  v1::ModelRef model;
  model.set_model_id(reg->model_id());
  model.set_layout_fingerprint(reg->layout_fingerprint());
  v1::PutHeader header;
  *header.mutable_model() = model;
  std::vector<v1::PutBlock> blocks = {
      client::DenseBlock(client::SmallModel("m").layout(), "h1", "", 1)};
  ASSERT_TRUE(a->PutBlocks(header, blocks).ok());

  client::DataPlaneBlocks out;
  EXPECT_EQ(Dp("")->GetBlocks(Req(model, {"h1"}), &out).code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(Dp("tok-zzz")->GetBlocks(Req(model, {"h1"}), &out).code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(Dp("tok-b")->GetBlocks(Req(model, {"h1"}), &out).code(), StatusCode::kNotFound);
  EXPECT_TRUE(Dp("tok-a")->GetBlocks(Req(model, {"h1"}), &out).ok());
}

}  // namespace
}  // namespace tqkv::testing
