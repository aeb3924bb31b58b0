// Same-host shared memory on the data plane's Unix-domain socket (proto
// "Same-host shared memory"), against the real server: a client that
// shares a memfd gets the stored bytes, dense reads, appends and Attend
// outputs of a client that does not, its payloads and replies through the memory; what
// the server must not take (no descriptor, an unsealed or oversized one,
// TCP, a region out of bounds, a frame with both a payload and `shared`)
// gets its precise status and changes nothing: a put stream with a bad
// frame commits nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/data_plane_client.h"
#include "client/cpp/fd_passing.h"
#include "tests/fixture.h"
#include "tests/raw_data_plane.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

// A memfd of `bytes`, sealed against shrinking unless `sealed` is false.
int Memfd(size_t bytes, bool sealed = true) {
  const int fd = memfd_create("tqkv-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  if (sealed) EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  return fd;
}

v1::DataPlaneRequest ShareRequest() {
  v1::DataPlaneRequest r;
  r.mutable_share_memory();
  return r;
}

// The reply's status code to `frame` sent on `sock` (with `fd`).
StatusCode Ask(int sock, const std::string& frame, int fd = -1, v1::DataPlaneReply* reply = nullptr) {
  EXPECT_EQ(client::SendWithDescriptor(sock, frame.data(), frame.size(), fd), static_cast<ssize_t>(frame.size()));
  v1::DataPlaneReply head;
  if (!ReadReply(sock, &head)) return StatusCode::kUnavailable;
  if (reply != nullptr) *reply = head;
  return static_cast<StatusCode>(head.code());
}

// One decode step of `layer` from `seed` (a new token appended, then
// attended) on two equal sequences, s1 through `a` and s2 through `b`, with
// raw tensors: the same outputs.
void ExpectSameStep(client::DataPlaneClient& a, const std::string& s1, client::DataPlaneClient& b,
                    const std::string& s2, uint32_t layer, uint64_t seed) {
  std::vector<std::string> in1, in2;
  v1::AttendRequest at = OneQueryAttend(s1, layer, v1::DTYPE_FP16, seed);
  *at.mutable_items(0)->mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, seed + 1000);
  *at.mutable_items(0)->mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {1, 2, 64}, seed + 2000);
  v1::AttendRequest at2 = at;
  at2.mutable_items(0)->set_sequence_id(s2);
  const v1::AttendRequest r1 = Strip(at, &in1), r2 = Strip(at2, &in2);
  std::string out1(OutputBytes(r1), '\0'), out2(OutputBytes(r2), '\0');
  auto x = a.Attend(r1, Spans(in1), out1);
  auto y = b.Attend(r2, Spans(in2), out2);
  ASSERT_TRUE(x.ok()) << x.status();
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(out1, out2);
}

class DataPlaneSharedTest : public UnixSocketServerTest {
 protected:
  // A raw connection to the socket, after the TQKVDP02 preface.
  int RawUnix() {
    const int fd = RawConnect("unix:" + socket_);
    SendRaw(fd, "TQKVDP02");
    return fd;
  }
};

TEST_F(DataPlaneSharedTest, SharedMemoryCarriesWhatTheSocketCarries) {
  StartServer({"--data_socket=" + socket_});
  const v1::ModelRef model = RegisterSmall();
  client::DataPlaneClientOptions o;
  o.target = "unix:" + socket_;
  o.shared_memory_bytes = 8 << 20;
  auto shared = client::DataPlaneClient::Connect(o);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ((*shared)->shared_memory_bytes(), size_t{8} << 20);
  auto plain = ConnectDataPlane("unix:" + socket_);
  ASSERT_NE(plain, nullptr);

  // Dense puts of the same K/V under two chains, several frames in flight.
  const std::vector<std::string> via_shared = client::HashChain(41, 12), via_socket = client::HashChain(42, 12);
  PutDenseOverDataPlane(**shared, model, via_shared, 700);
  PutDenseOverDataPlane(*plain, model, via_socket, 700);
  // Packed and dense reads: the same bytes, the shared client's through
  // the memory.
  for (bool dense : {false, true}) {
    SCOPED_TRACE(dense ? "dense" : "packed");
    v1::GetBlocksRequest a = GetBlocksReq(model, via_shared), b = GetBlocksReq(model, via_socket);
    a.set_dense(dense);
    b.set_dense(dense);
    client::DataPlaneBlocks got_shared, got_socket;
    ASSERT_TRUE((*shared)->GetBlocks(a, &got_shared).ok());
    ASSERT_TRUE(plain->GetBlocks(b, &got_socket).ok());
    EXPECT_GT(got_shared.reply().shared_reply_bytes(), 0u);
    EXPECT_EQ(got_socket.reply().shared_reply_bytes(), 0u);
    ASSERT_EQ(got_shared.size(), via_shared.size());
    for (size_t i = 0; i < got_shared.size(); ++i) EXPECT_EQ(got_shared.payload(i), got_socket.payload(i)) << i;
  }

  // A decode step (append and attend) on two equal sequences: the same
  // outputs, and the same error for a bad item, after which the
  // connection serves on.
  const std::string s1 = NewSequence(model, via_shared, 5, 61), s2 = NewSequence(model, via_shared, 5, 61);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    ExpectSameStep(**shared, s1, *plain, s2, 1, 80 + step);
  }
  // Append's k and v through the memory: the same count, and the next
  // step attends the same tokens.
  v1::AppendRequest ap;
  ap.set_layer(1);
  *ap.mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {3, 2, 64}, 70);
  *ap.mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {3, 2, 64}, 71);
  const std::vector<std::string> kv = {ap.k().data(), ap.v().data()};
  ap.mutable_k()->clear_data();
  ap.mutable_v()->clear_data();
  ap.set_sequence_id(s1);
  auto ap1 = (*shared)->Append(ap, Spans(kv));
  ap.set_sequence_id(s2);
  auto ap2 = plain->Append(ap, Spans(kv));
  ASSERT_TRUE(ap1.ok()) << ap1.status();
  ASSERT_TRUE(ap2.ok()) << ap2.status();
  EXPECT_EQ(ap1->num_tokens(), ap2->num_tokens());
  {
    std::vector<std::string> in1, in2;
    const v1::AttendRequest r1 = Strip(OneQueryAttend(s1, 1, v1::DTYPE_FP16, 72), &in1);
    const v1::AttendRequest r2 = Strip(OneQueryAttend(s2, 1, v1::DTYPE_FP16, 72), &in2);
    std::string out1(OutputBytes(r1), '\0'), out2(OutputBytes(r2), '\0');
    ASSERT_TRUE((*shared)->Attend(r1, Spans(in1), out1).ok());
    ASSERT_TRUE(plain->Attend(r2, Spans(in2), out2).ok());
    EXPECT_EQ(out1, out2);
  }
  std::vector<std::string> in;
  v1::AttendRequest bad = Strip(OneQueryAttend("no-such-sequence", 1, v1::DTYPE_FP16, 5), &in);
  std::string out(OutputBytes(bad), '\0');
  EXPECT_EQ((*shared)->Attend(bad, Spans(in), out).status().code(), StatusCode::kNotFound);
  v1::GetBlocksRequest again = GetBlocksReq(model, via_shared);
  client::DataPlaneBlocks got;
  EXPECT_TRUE((*shared)->GetBlocks(again, &got).ok());

  // A TCP client cannot share memory.
  client::DataPlaneClientOptions tcp = o;
  tcp.target = server_->data_address();
  EXPECT_EQ(client::DataPlaneClient::Connect(tcp).status().code(), StatusCode::kInvalidArgument);
}

// Attend and Append through the doorbell (proto "Doorbell"), against a
// server whose loops poll (no socket crossed) and one whose loops sleep
// (a ring frame wakes them), with a client that spins and one that sleeps
// on the futex: the outputs of socket calls, errors included, and socket
// calls on the same connection in between.
TEST_F(DataPlaneSharedTest, DoorbellCallsGiveWhatSocketCallsGive) {
  for (const bool polls : {true, false}) {
    SCOPED_TRACE(polls ? "server polls" : "server sleeps");
    std::vector<std::string> flags = {"--data_socket=" + socket_};
    if (polls) flags.push_back("--data_busy_poll=50ms");
    StartServer(flags);
    const v1::ModelRef model = RegisterSmall();
    const std::vector<std::string> chain = client::HashChain(51, 6);
    PutDense(model, chain, 900);
    auto plain = ConnectDataPlane("unix:" + socket_);
    ASSERT_NE(plain, nullptr);
    for (const absl::Duration spin : {absl::Microseconds(200), absl::ZeroDuration()}) {
      SCOPED_TRACE(spin > absl::ZeroDuration() ? "client spins" : "client sleeps");
      client::DataPlaneClientOptions o;
      o.target = "unix:" + socket_;
      o.shared_memory_bytes = 1 << 20;
      o.doorbell = true;
      o.reply_poll = spin;
      auto rung = client::DataPlaneClient::Connect(o);
      ASSERT_TRUE(rung.ok()) << rung.status();
      const std::string s1 = NewSequence(model, chain, 3, 62), s2 = NewSequence(model, chain, 3, 62);
      for (int step = 0; step < 20; ++step) {
        SCOPED_TRACE(step);
        ExpectSameStep(**rung, s1, *plain, s2, step % 2, 180 + step);
      }
      std::vector<std::string> in;
      const v1::AttendRequest bad = Strip(OneQueryAttend("no-such-sequence", 1, v1::DTYPE_FP16, 5), &in);
      std::string out(OutputBytes(bad), '\0');
      EXPECT_EQ((*rung)->Attend(bad, Spans(in), out).status().code(), StatusCode::kNotFound);
      EXPECT_EQ((*rung)->doorbell_calls(), 21u);
      client::DataPlaneBlocks got;
      EXPECT_TRUE((*rung)->GetBlocks(GetBlocksReq(model, chain), &got).ok());
      EXPECT_EQ(got.size(), chain.size());
    }
    server_->Kill();
    server_.reset();
  }
  // A region too small for a doorbell: refused at connect.
  StartServer({"--data_socket=" + socket_});
  client::DataPlaneClientOptions small;
  small.target = "unix:" + socket_;
  small.shared_memory_bytes = 64 << 10;
  small.doorbell = true;
  EXPECT_EQ(client::DataPlaneClient::Connect(small).status().code(), StatusCode::kInvalidArgument);
}

// Calls through the doorbell cross no socket while the server polls, and
// still count as the connection's activity: it outlives the idle timeout.
// Once it is closed, the doorbell says so.
TEST_F(DataPlaneSharedTest, DoorbellCallsKeepTheConnectionOpen) {
  StartServer({"--data_socket=" + socket_, "--data_busy_poll=500ms", "--data_idle_timeout_s=1"});
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(53, 2);
  PutDense(model, chain, 950);
  client::DataPlaneClientOptions o;
  o.target = "unix:" + socket_;
  o.shared_memory_bytes = 1 << 20;
  o.doorbell = true;
  o.reply_poll = absl::Milliseconds(1);
  o.timeout = absl::Seconds(3);
  auto rung = client::DataPlaneClient::Connect(o);
  ASSERT_TRUE(rung.ok()) << rung.status();
  const std::string seq = NewSequence(model, chain, 3, 63);
  const absl::Time until = absl::Now() + absl::Milliseconds(2500);
  int calls = 0;
  while (absl::Now() < until) {
    std::vector<std::string> in;
    const v1::AttendRequest at = Strip(OneQueryAttend(seq, 0, v1::DTYPE_FP16, 300 + calls), &in);
    std::string out(OutputBytes(at), '\0');
    auto r = (*rung)->Attend(at, Spans(in), out);
    ASSERT_TRUE(r.ok()) << "call " << calls << ": " << r.status();
    ++calls;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ((*rung)->doorbell_calls(), static_cast<uint64_t>(calls));
  // Idle past the timeout: the server closes the connection, and says so
  // at the doorbell. The next call fails at once (not after the client's
  // timeout) and the one after it reconnects.
  absl::SleepFor(absl::Milliseconds(2500));
  std::vector<std::string> in;
  const v1::AttendRequest at = Strip(OneQueryAttend(seq, 0, v1::DTYPE_FP16, 7), &in);
  std::string out(OutputBytes(at), '\0');
  const absl::Time start = absl::Now();
  EXPECT_EQ((*rung)->Attend(at, Spans(in), out).status().code(), StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  auto again = (*rung)->Attend(at, Spans(in), out);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(DataPlaneSharedTest, WhatTheServerMustNotTakeChangesNothing) {
  StartServer({"--data_socket=" + socket_, "--data_max_shared_bytes=1MiB"});
  const v1::ModelRef model = RegisterSmall();
  const int sock = RawUnix();
  const std::string share = RawFrame(ShareRequest(), "");

  // A frame with `shared` before any memory is shared.
  v1::DataPlaneRequest get;
  *get.mutable_get_blocks() = GetBlocksReq(model, client::HashChain(5, 1));
  get.mutable_shared()->set_reply_capacity(1);
  EXPECT_EQ(Ask(sock, RawFrame(get, "")), StatusCode::kFailedPrecondition);
  // share_memory without a descriptor, with one not sealed, with one over
  // --data_max_shared_bytes, with one that is not a memfd.
  EXPECT_EQ(Ask(sock, share), StatusCode::kFailedPrecondition);
  const int unsealed = Memfd(1 << 20, false), big = Memfd(2 << 20), fine = Memfd(1 << 20);
  EXPECT_EQ(Ask(sock, share, unsealed), StatusCode::kInvalidArgument);
  EXPECT_EQ(Ask(sock, share, big), StatusCode::kResourceExhausted);
  int pipe_fds[2] = {-1, -1};
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_EQ(Ask(sock, share, pipe_fds[0]), StatusCode::kInvalidArgument);
  v1::DataPlaneReply reply;
  ASSERT_EQ(Ask(sock, share, fine, &reply), StatusCode::kOk);
  EXPECT_EQ(reply.shared_memory_bytes(), 1u << 20);
  // Regions out of bounds, and `shared` beside a payload of the frame's own.
  for (auto [off, n] : {std::pair<uint64_t, uint64_t>{1 << 20, 1}, {1, 1 << 20}, {UINT64_MAX, 2}}) {
    SCOPED_TRACE(absl::StrCat(off, " +", n));
    v1::DataPlaneRequest at;
    *at.mutable_attend() = OneQueryAttend("s", 1, v1::DTYPE_FP16, 1);
    at.mutable_shared()->set_offset(off);
    at.mutable_shared()->set_bytes(n);
    EXPECT_EQ(Ask(sock, RawFrame(at, "")), StatusCode::kInvalidArgument);
    at.mutable_shared()->set_offset(0);
    at.mutable_shared()->set_bytes(0);
    at.mutable_shared()->set_reply_offset(off);
    at.mutable_shared()->set_reply_capacity(n);
    EXPECT_EQ(Ask(sock, RawFrame(at, "")), StatusCode::kInvalidArgument);
  }
  v1::DataPlaneRequest both;
  *both.mutable_get_blocks() = GetBlocksReq(model, client::HashChain(5, 1));
  both.mutable_shared()->set_bytes(8);
  EXPECT_EQ(Ask(sock, RawFrame(both, "12345678")), StatusCode::kInvalidArgument);

  // A put stream with one frame whose `shared` is out of bounds: its
  // commit fails and nothing of it is stored.
  const v1::ModelLayout layout = client::SmallModel("x").layout();
  const std::vector<std::string> chain = client::HashChain(77, 2);
  v1::DataPlaneRequest first;
  *first.mutable_put()->mutable_header()->mutable_model() = model;
  *first.mutable_put()->add_blocks() = client::DenseBlock(layout, chain[0], "", 1);
  EXPECT_EQ(Ask(sock, RawFrame(first, "")), StatusCode::kOk);
  v1::DataPlaneRequest second;
  *second.mutable_put()->add_blocks() = client::DenseBlock(layout, chain[1], chain[0], 2);
  second.mutable_shared()->set_offset(1 << 20);
  second.mutable_shared()->set_bytes(1);
  EXPECT_EQ(Ask(sock, RawFrame(second, "")), StatusCode::kInvalidArgument);
  v1::DataPlaneRequest commit;
  commit.mutable_put()->set_commit(true);
  EXPECT_EQ(Ask(sock, RawFrame(commit, "")), StatusCode::kInvalidArgument);
  EXPECT_EQ(Blocks(model), 0u);

  // Over TCP: refused, whatever comes with it.
  const int tcp = RawConnect(server_->data_address());
  SendRaw(tcp, "TQKVDP02");
  EXPECT_EQ(Ask(tcp, share), StatusCode::kFailedPrecondition);
  for (int fd : {sock, tcp, unsealed, big, fine, pipe_fds[0], pipe_fds[1]}) close(fd);
}

}  // namespace
}  // namespace tqkv::testing
