// The data plane on a Unix-domain socket (--data_socket), against the real
// server and the real C++ data-plane client: the same bytes and outputs as
// over TCP for puts, gets and Attend; the socket file's mode; auth as on
// TCP; a socket file left by an ended process replaced, a file that is not
// a socket, a live socket and an overlong path refused at start; the file
// removed at shutdown.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/cpp/data_plane_client.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

class DataPlaneSocketTest : public UnixSocketServerTest {
 protected:
  std::unique_ptr<client::DataPlaneClient> Dp(const std::string& target, const std::string& token = "") {
    return ConnectDataPlane(target, token);
  }
  static v1::GetBlocksRequest Req(const v1::ModelRef& model, const std::vector<std::string>& hashes) {
    return GetBlocksReq(model, hashes);
  }
};

TEST_F(DataPlaneSocketTest, ServesWhatTcpServesOnAFileOfTheServersUserOnly) {
  StartServer({"--data_socket=" + socket_});
  struct stat st{};
  ASSERT_EQ(lstat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  const v1::ModelRef model = RegisterSmall();
  auto unix_dp = Dp("unix:" + socket_);
  auto tcp_dp = Dp(server_->data_address());
  ASSERT_NE(unix_dp, nullptr);
  ASSERT_NE(tcp_dp, nullptr);

  // Dense puts of the same K/V under two chains, one per transport: the
  // same stored bytes.
  const std::vector<std::string> via_unix = client::HashChain(21, 10), via_tcp = client::HashChain(22, 10);
  PutDenseOverDataPlane(*unix_dp, model, via_unix, 300);
  PutDenseOverDataPlane(*tcp_dp, model, via_tcp, 300);
  client::DataPlaneBlocks a, b;
  ASSERT_TRUE(unix_dp->GetBlocks(Req(model, via_unix), &a).ok());
  ASSERT_TRUE(tcp_dp->GetBlocks(Req(model, via_tcp), &b).ok());
  ASSERT_EQ(a.size(), via_unix.size());
  ASSERT_EQ(b.size(), via_tcp.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a.payload(i), b.payload(i)) << "block " << i;

  // Attend: the outputs of TCP; a bad request: the same code, and the
  // connection stays usable.
  v1::CreateSequenceRequest cs;
  *cs.mutable_model() = model;
  for (const auto& h : via_unix) cs.add_block_hashes(h);
  *cs.mutable_tail_k() = client::RandomTensor(v1::DTYPE_FP16, {2, 5, 2, 64}, 31);
  *cs.mutable_tail_v() = client::RandomTensor(v1::DTYPE_FP16, {2, 5, 2, 64}, 32);
  auto seq = client_->CreateSequence(cs);
  ASSERT_TRUE(seq.ok()) << seq.status();
  const v1::AttendRequest at = OneQueryAttend(seq->sequence_id(), 1, v1::DTYPE_FP16, 33);
  auto over_unix = unix_dp->Attend(at);
  auto over_tcp = tcp_dp->Attend(at);
  ASSERT_TRUE(over_unix.ok()) << over_unix.status();
  ASSERT_TRUE(over_tcp.ok()) << over_tcp.status();
  ASSERT_EQ(over_unix->outputs_size(), 1);
  EXPECT_EQ(over_unix->outputs(0).data(), over_tcp->outputs(0).data());
  v1::AttendRequest bad = at;
  bad.mutable_items(0)->set_sequence_id("no-such-sequence");
  EXPECT_EQ(unix_dp->Attend(bad).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(unix_dp->Attend(at).ok());

  // Shutdown removes the socket file.
  EXPECT_EQ(server_->Stop(), 0);
  EXPECT_NE(lstat(socket_.c_str(), &st), 0);
}

TEST_F(DataPlaneSocketTest, AuthAsOnTcpAndTheModeOfTheFlag) {
  const std::string tokens = MakeTempDir("tqkv-auth") + "/tokens";
  std::ofstream(tokens) << "tok-a alpha\n";
  chmod(tokens.c_str(), 0600);
  StartServer({"--data_socket=" + socket_, "--data_socket_mode=0660", "--auth_tokens_file=" + tokens});
  struct stat st{};
  ASSERT_EQ(lstat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  v1::ModelRef missing;
  missing.set_model_id(999999);
  client::DataPlaneBlocks out;
  auto anonymous = Dp("unix:" + socket_);
  ASSERT_NE(anonymous, nullptr);
  EXPECT_EQ(anonymous->GetBlocks(Req(missing, {client::ChainHash("x", 1, 1)}), &out).code(),
            StatusCode::kUnauthenticated);
  auto alpha = Dp("unix:" + socket_, "tok-a");
  ASSERT_NE(alpha, nullptr);
  EXPECT_EQ(alpha->GetBlocks(Req(missing, {client::ChainHash("x", 1, 1)}), &out).code(), StatusCode::kNotFound);
}

TEST_F(DataPlaneSocketTest, ReplacesAStaleSocketAndRefusesWhatItMustNotTake) {
  // A socket file whose process no longer listens (it ended without
  // removing it): replaced.
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket_.data(), socket_.size());
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
    close(fd);
  }
  StartServer({"--data_socket=" + socket_});
  EXPECT_NE(Dp("unix:" + socket_), nullptr);
  v1::ModelRef missing;
  missing.set_model_id(999999);
  client::DataPlaneBlocks out;
  EXPECT_EQ(Dp("unix:" + socket_)->GetBlocks(Req(missing, {client::ChainHash("x", 1, 1)}), &out).code(),
            StatusCode::kNotFound);

  // A second server on the live socket: refused, and the first keeps it.
  auto [live, live_err] = FailedStart({"--data_socket=" + socket_});
  EXPECT_FALSE(live.ok());
  EXPECT_NE(live_err.find("another process listens on it"), std::string::npos) << live_err;
  EXPECT_EQ(Dp("unix:" + socket_)->GetBlocks(Req(missing, {client::ChainHash("x", 1, 1)}), &out).code(),
            StatusCode::kNotFound);

  // A regular file at the path: refused and left alone.
  const std::string file = dir_ + "/not-a-socket";
  std::ofstream(file) << "keep me";
  auto [regular, regular_err] = FailedStart({"--data_socket=" + file});
  EXPECT_FALSE(regular.ok());
  EXPECT_NE(regular_err.find("not a socket"), std::string::npos) << regular_err;
  std::ifstream in(file);
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "keep me");

  // A path longer than a socket address holds, a mode that is not octal,
  // and a socket without the data plane: refused with their reasons.
  auto [longer, longer_err] = FailedStart({"--data_socket=/tmp/" + std::string(120, 'x')});
  EXPECT_FALSE(longer.ok());
  EXPECT_NE(longer_err.find("a socket path is 1..107 bytes"), std::string::npos) << longer_err;
  auto [mode, mode_err] = FailedStart({"--data_socket=" + socket_ + "2", "--data_socket_mode=0999"});
  EXPECT_FALSE(mode.ok());
  EXPECT_NE(mode_err.find("not an octal file mode"), std::string::npos) << mode_err;
  auto [off, off_err] = FailedStart({"--data_socket=" + socket_ + "3", "--data_listen=off"});
  EXPECT_FALSE(off.ok());
  EXPECT_NE(off_err.find("--data_socket needs the data plane"), std::string::npos) << off_err;

  // A client with TLS options on a Unix-domain target: told there is none.
  client::DataPlaneClientOptions o;
  o.target = "unix:" + socket_;
  o.tls.ca_file = "/nonexistent/ca.pem";
  auto tls = client::DataPlaneClient::Connect(o);
  ASSERT_FALSE(tls.ok());
  EXPECT_EQ(tls.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv::testing
