// Raw payloads on the data plane (proto "Data plane", preface TQKVDP02):
// an Attend or Append whose tensors travel beside the request gives the
// bytes of the same call with the tensors inside it, across a block fill
// and with inline and raw tensors mixed in one call; a payload that does
// not match its tensors, or rides on a frame that takes none, is
// INVALID_ARGUMENT and changes nothing; a payload over the frame limit
// closes the connection; put frames take their blocks' tensors from the
// payload; the byte counters count frames and replies. Against the real
// server.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cpp/data_plane_client.h"
#include "tests/fixture.h"
#include "tests/raw_data_plane.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

class DataPlaneRawTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer();
    model_ = RegisterSmall();
    chain_ = client::HashChain(7, 3);
    PutDense(model_, chain_, 1100);
    client::DataPlaneClientOptions o;
    o.target = server_->data_address();
    auto c = client::DataPlaneClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    dp_ = std::move(*c);
  }

  // A sequence over chain_ with a 5-token tail (the same one each time).
  std::string NewSequence() { return ServerTest::NewSequence(model_, chain_, 5, 51); }

  // One item with a query and a new token, from `seed`.
  static v1::AttendItem Step(const std::string& id, uint64_t seed) {
    v1::AttendItem item;
    item.set_sequence_id(id);
    *item.mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, seed);
    *item.mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, seed + 1);
    *item.mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, seed + 2);
    return item;
  }

  // `at` with its tensors in the payload; the outputs as one string.
  absl::StatusOr<std::string> RawAttend(const v1::AttendRequest& at) {
    std::vector<std::string> bytes;
    const v1::AttendRequest stripped = Strip(at, &bytes);
    std::string out(OutputBytes(at), '\0');
    auto r = dp_->Attend(stripped, Spans(bytes), out);
    if (!r.ok()) return r.status();
    for (const v1::Tensor& t : r->outputs()) EXPECT_TRUE(t.data().empty());
    return out;
  }

  // The token count of `id` at layer 0, learnt by appending one token.
  uint64_t TokensAfterOneMore(const std::string& id) {
    v1::AppendRequest ap;
    ap.set_sequence_id(id);
    ap.set_layer(0);
    *ap.mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, 7);
    *ap.mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, 8);
    auto r = dp_->Append(ap);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->num_tokens() : 0;
  }

  v1::ModelRef model_;
  std::vector<std::string> chain_;
  std::unique_ptr<client::DataPlaneClient> dp_;
};

TEST_F(DataPlaneRawTest, RawTensorsGiveTheBytesOfInlineTensors) {
  const std::string inline_id = NewSequence(), raw_id = NewSequence(), mixed_id = NewSequence();
  for (int step = 0; step < 20; ++step) {  // the 5-token tail fills at step 11
    for (int layer = 0; layer < 2; ++layer) {
      SCOPED_TRACE(absl::StrCat("step ", step, " layer ", layer));
      v1::AttendRequest at;
      at.set_layer(layer);
      *at.add_items() = Step(inline_id, 100 * step + 10 * layer);
      auto inline_r = dp_->Attend(at);
      ASSERT_TRUE(inline_r.ok()) << inline_r.status();
      at.mutable_items(0)->set_sequence_id(raw_id);
      auto raw = RawAttend(at);
      ASSERT_TRUE(raw.ok()) << raw.status();
      EXPECT_EQ(*raw, inline_r->outputs(0).data());
      EXPECT_NE(*raw, std::string(raw->size(), '\0'));
      // Mixed: the query inline, the new token in the payload; a second
      // item (no new tokens) all in the payload.
      at.mutable_items(0)->set_sequence_id(mixed_id);
      std::vector<std::string> bytes = {at.items(0).k().data(), at.items(0).v().data()};
      at.mutable_items(0)->mutable_k()->clear_data();
      at.mutable_items(0)->mutable_v()->clear_data();
      v1::AttendItem* second = at.add_items();
      second->set_sequence_id(inline_id);
      *second->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {2, 4, 64}, 7 + step);
      bytes.push_back(second->q().data());
      second->mutable_q()->clear_data();
      std::string out(OutputBytes(at), '\0');
      auto mixed = dp_->Attend(at, Spans(bytes), out);
      ASSERT_TRUE(mixed.ok()) << mixed.status();
      EXPECT_EQ(out.substr(0, raw->size()), *raw);
    }
  }
  // Append with raw k and v counts as the inline one.
  v1::AppendRequest ap;
  ap.set_sequence_id(raw_id);
  ap.set_layer(1);
  *ap.mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {3, 2, 64}, 60);
  *ap.mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {3, 2, 64}, 61);
  auto inline_ap = dp_->Append(ap);
  ASSERT_TRUE(inline_ap.ok()) << inline_ap.status();
  std::vector<std::string> bytes = {ap.k().data(), ap.v().data()};
  ap.set_sequence_id(inline_id);
  ap.mutable_k()->clear_data();
  ap.mutable_v()->clear_data();
  auto raw_ap = dp_->Append(ap, Spans(bytes));
  ASSERT_TRUE(raw_ap.ok()) << raw_ap.status();
  EXPECT_EQ(raw_ap->num_tokens(), inline_ap->num_tokens());
  v1::AttendRequest both;
  both.set_layer(1);
  v1::AttendItem* a = both.add_items();
  a->set_sequence_id(inline_id);
  *a->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, 62);
  *both.add_items() = *a;
  both.mutable_items(1)->set_sequence_id(raw_id);
  auto r = RawAttend(both);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->substr(0, r->size() / 2), r->substr(r->size() / 2));
}

TEST_F(DataPlaneRawTest, PayloadsThatDoNotFitTheirTensorsChangeNothing) {
  const std::string id = NewSequence(), twin = NewSequence();
  v1::AttendRequest at;
  at.set_layer(0);
  *at.add_items() = Step(id, 5);
  std::vector<std::string> bytes;
  const v1::AttendRequest stripped = Strip(at, &bytes);
  std::string out(OutputBytes(at), '\0');
  {  // One byte short.
    std::vector<std::string> short_bytes = bytes;
    short_bytes.back().pop_back();
    auto r = dp_->Attend(stripped, Spans(short_bytes), out);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("payload"), std::string::npos) << r.status();
  }
  {  // One byte over.
    std::vector<std::string> long_bytes = bytes;
    long_bytes.push_back("x");
    auto r = dp_->Attend(stripped, Spans(long_bytes), out);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  }
  {  // No payload at all for tensors without data.
    auto r = dp_->Attend(stripped);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  }
  {  // An output buffer of the wrong size is refused before sending.
    std::string small(out.size() - 2, '\0');
    EXPECT_EQ(dp_->Attend(stripped, Spans(bytes), small).status().code(), StatusCode::kInvalidArgument);
  }
  // None of them appended: `id` has as many tokens as its twin.
  EXPECT_EQ(TokensAfterOneMore(id), TokensAfterOneMore(twin));

  // On raw sockets: a payload on a get frame is refused and the connection
  // stays usable; a payload over the frame limit closes the connection.
  v1::DataPlaneRequest get;
  *get.mutable_get_blocks()->mutable_model() = model_;
  for (const auto& h : chain_) get.mutable_get_blocks()->add_block_hashes(h);
  v1::DataPlaneReply head;
  std::string payload;
  {
    const int fd = RawConnect(server_->data_address());
    SendRaw(fd, "TQKVDP02" + RawFrame(get, "abc") + RawFrame(get, ""));
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument)) << head.message();
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), 0u) << head.message();
    EXPECT_EQ(head.blocks_size(), static_cast<int>(chain_.size()));
    close(fd);
  }
  {  // A put stream whose frame carries a payload fails; its commit says so and stores nothing.
    const int fd = RawConnect(server_->data_address());
    v1::DataPlaneRequest put;
    *put.mutable_put()->mutable_header()->mutable_model() = model_;
    v1::DataPlaneRequest commit;
    commit.mutable_put()->set_commit(true);
    SendRaw(fd, "TQKVDP02" + RawFrame(put, "abc") + RawFrame(commit, ""));
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument)) << head.message();
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument)) << head.message();
    close(fd);
  }
  {
    const int fd = RawConnect(server_->data_address());
    const uint32_t n = 0;
    const uint64_t p = uint64_t{1} << 40;
    SendRaw(fd, std::string("TQKVDP02") + std::string(reinterpret_cast<const char*>(&n), 4) +
                    std::string(reinterpret_cast<const char*>(&p), 8));
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kResourceExhausted)) << head.message();
    EXPECT_TRUE(ClosedByServer(fd));
    close(fd);
  }
  auto ok = RawAttend(at);  // the client's connection is unaffected
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// The RPC byte counters count a data-plane call's frame (prefix, request
// and raw payload) and its reply.
TEST_F(DataPlaneRawTest, ByteCountersCountFramesAndReplies) {
  auto counter = [&](const std::string& name) -> uint64_t {
    auto text = HttpGet(server_->metrics_address(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    const std::string key = name + "{method=\"DataAttend\"} ";
    const size_t at = text.ok() ? text->find(key) : std::string::npos;
    return at == std::string::npos ? 0 : std::stoull(text->substr(at + key.size()));
  };
  const uint64_t in0 = counter("tqkv_rpc_received_bytes_total"), out0 = counter("tqkv_rpc_sent_bytes_total");
  v1::AttendRequest at;
  at.set_layer(0);
  *at.add_items() = Step(NewSequence(), 3);
  std::vector<std::string> bytes;
  v1::DataPlaneRequest frame;
  *frame.mutable_attend() = Strip(at, &bytes);
  size_t payload = 0;
  for (const std::string& b : bytes) payload += b.size();
  auto out = RawAttend(at);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(counter("tqkv_rpc_received_bytes_total") - in0, 12 + frame.ByteSizeLong() + payload);
  const uint64_t sent = counter("tqkv_rpc_sent_bytes_total") - out0;
  EXPECT_GT(sent, 12 + out->size());  // prefix, the reply's header, the outputs
  EXPECT_LT(sent, 12 + out->size() + 256);
}

// A client without raw payloads (TQKVDP01 frames, for servers that predate
// them) puts and attends with the tensors inside the messages, with the same
// results; its raw overloads are FAILED_PRECONDITION.
TEST_F(DataPlaneRawTest, ClientsWithoutRawPayloadsKeepTensorsInline) {
  auto c = client::DataPlaneClient::Connect({.target = server_->data_address(), .raw_payloads = false});
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string a = NewSequence(), b = NewSequence();
  v1::AttendRequest at;
  at.set_layer(1);
  *at.add_items() = Step(a, 77);
  auto inline_r = (*c)->Attend(at);
  ASSERT_TRUE(inline_r.ok()) << inline_r.status();
  at.mutable_items(0)->set_sequence_id(b);
  auto raw = RawAttend(at);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(inline_r->outputs(0).data(), *raw);
  std::vector<std::string> bytes;
  const v1::AttendRequest stripped = Strip(at, &bytes);
  std::string out(OutputBytes(at), '\0');
  EXPECT_EQ((*c)->Attend(stripped, Spans(bytes), out).status().code(), StatusCode::kFailedPrecondition);
  v1::PutHeader h;
  *h.mutable_model() = model_;
  const std::vector<std::string> chain = client::HashChain(41, 2);
  std::vector<v1::PutBlock> blocks;
  for (size_t i = 0; i < chain.size(); ++i)
    blocks.push_back(client::DenseBlock(client::SmallModel("x").layout(), chain[i], i ? chain[i - 1] : "", 900 + i));
  auto put = (*c)->PutBlocks(h, blocks);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->committed(), 2u);
}

// A client that polls for its replies (DataPlaneClientOptions::reply_poll)
// gets the replies of one that sleeps: outputs, errors, and replies that
// outlast a poll window of a microsecond.
TEST_F(DataPlaneRawTest, ClientsThatPollForRepliesGetTheSameReplies) {
  for (absl::Duration poll : {absl::Milliseconds(200), absl::Microseconds(1)}) {
    SCOPED_TRACE(absl::StrCat("reply_poll ", absl::FormatDuration(poll)));
    auto c = client::DataPlaneClient::Connect({.target = server_->data_address(), .reply_poll = poll});
    ASSERT_TRUE(c.ok()) << c.status();
    const std::string a = NewSequence(), b = NewSequence();
    for (int step = 0; step < 3; ++step) {
      v1::AttendRequest at;
      at.set_layer(0);
      *at.add_items() = Step(a, 300 + step);
      std::vector<std::string> bytes;
      const v1::AttendRequest stripped = Strip(at, &bytes);
      std::string polled(OutputBytes(at), '\0');
      auto r = (*c)->Attend(stripped, Spans(bytes), polled);
      ASSERT_TRUE(r.ok()) << r.status();
      at.mutable_items(0)->set_sequence_id(b);
      auto slept = RawAttend(at);
      ASSERT_TRUE(slept.ok()) << slept.status();
      EXPECT_EQ(polled, *slept);
    }
    v1::AttendRequest missing;
    *missing.add_items() = Step("no-such-sequence", 9);
    EXPECT_EQ((*c)->Attend(missing).status().code(), StatusCode::kNotFound);
  }
}

// A put frame's blocks take their tensors from the payload (here block 0
// inline, blocks 1 and 2 raw) and store the bytes gRPC stores for the same
// input; a frame whose payload is one byte short fails its stream and
// stores nothing.
TEST_F(DataPlaneRawTest, PutFramesTakeTheirTensorsFromThePayload) {
  const std::vector<std::string> grpc_chain = client::HashChain(31, 3), raw_chain = client::HashChain(32, 3);
  const std::vector<v1::PutBlock> blocks = PutDense(model_, grpc_chain, 500);  // over gRPC
  auto put_frames = [&](bool short_payload) {
    v1::DataPlaneRequest header;
    *header.mutable_put()->mutable_header()->mutable_model() = model_;
    v1::DataPlaneRequest frame;
    std::string payload;
    for (size_t i = 0; i < blocks.size(); ++i) {
      v1::PutBlock* b = frame.mutable_put()->add_blocks();
      *b = blocks[i];
      b->set_block_hash(raw_chain[i]);
      b->set_parent_hash(i == 0 ? "" : raw_chain[i - 1]);
      if (i == 0) continue;
      payload += b->k().data() + b->v().data();
      b->mutable_k()->clear_data();
      b->mutable_v()->clear_data();
    }
    if (short_payload) payload.pop_back();
    v1::DataPlaneRequest commit;
    commit.mutable_put()->set_commit(true);
    const int fd = RawConnect(server_->data_address());
    SendRaw(fd, "TQKVDP02" + RawFrame(header, "") + RawFrame(frame, payload) + RawFrame(commit, ""));
    std::vector<uint32_t> codes;
    v1::DataPlaneReply head;
    for (int i = 0; i < 3 && ReadReply(fd, &head); ++i) codes.push_back(head.code());
    close(fd);
    return codes;
  };
  auto stored = [&](const std::vector<std::string>& chain) {
    v1::LookupRequest lr;
    *lr.mutable_model() = model_;
    for (const auto& h : chain) lr.add_block_hashes(h);
    auto r = client_->Lookup(lr);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->hits() : 0u;
  };
  const uint32_t invalid = static_cast<uint32_t>(StatusCode::kInvalidArgument);
  EXPECT_EQ(put_frames(true), (std::vector<uint32_t>{0, invalid, invalid}));
  EXPECT_EQ(stored(raw_chain), 0u);
  EXPECT_EQ(put_frames(false), (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(stored(raw_chain), 3u);
  for (size_t i = 0; i < blocks.size(); ++i) {
    v1::GetBlocksRequest a, b;
    *a.mutable_model() = *b.mutable_model() = model_;
    a.add_block_hashes(grpc_chain[i]);
    b.add_block_hashes(raw_chain[i]);
    auto ra = client_->GetBlocks(a);
    auto rb = client_->GetBlocks(b);
    ASSERT_TRUE(ra.ok() && rb.ok());
    EXPECT_EQ((*ra)[0].payload(), (*rb)[0].payload()) << "block " << i;
  }
}

}  // namespace
}  // namespace tqkv::testing
