// Safe defaults of the real tqkv-server binary: with no address flags it
// binds loopback only (checked in a private network namespace, from the
// kernel's socket table); an unauthenticated listener beyond loopback is
// refused unless --insecure_listen_any, which warns once; gRPC reflection is
// off unless asked for; an auth file readable by others is refused; SIGHUP
// reloads the tokens, so does an edit of the file by itself, and a bad
// reload keeps the old ones.
#include <grpcpp/generic/generic_stub.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

constexpr char kUnshare[] = "/usr/bin/unshare";

// Runs `what` until it returns true or 20 s pass; returns its last answer.
// (Polls an observable effect of an asynchronous signal; never a fixed sleep.)
bool Eventually(const std::function<bool()>& what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!what()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// Writes dir/tokens as an operator should: a new file with its mode, then
// renamed over the old one (the server never reads a half-written file).
std::string WriteAuthFile(const std::string& dir, const std::string& contents, mode_t mode) {
  const std::string path = dir + "/tokens", next = dir + "/tokens.next";
  std::ofstream(next, std::ios::trunc) << contents;
  chmod(next.c_str(), mode);
  rename(next.c_str(), path.c_str());
  return path;
}

std::unique_ptr<client::Client> ClientFor(const std::string& target, const std::string& token) {
  client::ClientOptions o;
  o.target = target;
  o.token = token;
  o.max_attempts = 1;
  o.deadline = absl::Seconds(20);
  auto c = client::Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Local addresses of the listening TCP sockets in /proc/<pid>/net/tcp{,6}
// (the process's network namespace), as the kernel prints them (hex).
std::vector<std::string> ListeningAddresses(pid_t pid) {
  std::vector<std::string> out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::istringstream in(ReadFileOrEmpty("/proc/" + std::to_string(pid) + "/net/" + table));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() > 3 && f[3] == "0A") out.push_back(f[1].substr(0, f[1].find(':')));
    }
  }
  return out;
}

// IPv4 127.0.0.0/8 (stored little-endian: the last byte printed is 7F) or ::1.
bool IsLoopbackHex(const std::string& a) {
  return (a.size() == 8 && absl::EndsWith(a, "7F")) || a == "00000000000000000000000001000000";
}

TEST(SafeDefaultsTest, WithoutAddressFlagsEveryListenerIsOnLoopback) {
  if (access(kUnshare, X_OK) != 0 || system("/usr/bin/unshare -rn true 2>/dev/null") != 0)
    GTEST_SKIP() << "needs unshare -rn (user and network namespaces) to run on the default ports";
  // A private network namespace: the default ports are free and nothing
  // else listens there, so the socket table holds only the server's.
  ServerLaunch launch;
  launch.default_addresses = true;
  launch.wrapper = {kUnshare, "-rn"};
  auto p = ServerProcess::Start(MakeTempDir("tqkv-data"), {}, launch);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->address(), "127.0.0.1:50051");
  EXPECT_EQ((*p)->data_address(), "127.0.0.1:50052");
  EXPECT_EQ((*p)->metrics_address(), "127.0.0.1:9464");
  const std::vector<std::string> listening = ListeningAddresses((*p)->pid());
  EXPECT_GE(listening.size(), 3u);
  for (const std::string& a : listening) EXPECT_TRUE(IsLoopbackHex(a)) << "listening on " << a;
}

TEST(SafeDefaultsTest, UnauthenticatedListenerBeyondLoopbackIsRefused) {
  const std::string dir = MakeTempDir("tqkv-data");
  ServerLaunch launch;
  launch.stderr_path = dir + "/stderr";
  auto p = ServerProcess::Start(dir, {"--listen=0.0.0.0:0"}, launch);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  EXPECT_NE(p.status().message().find("exited with 1"), std::string::npos) << p.status();
  const std::string err = ReadFileOrEmpty(launch.stderr_path);
  EXPECT_NE(err.find("--listen=0.0.0.0:0"), std::string::npos) << err;
  EXPECT_NE(err.find("--data_listen=0.0.0.0:0"), std::string::npos) << err;  // auto follows --listen
  EXPECT_NE(err.find("--insecure_listen_any"), std::string::npos) << err;

  // The metrics listener alone is enough to be refused.
  p = ServerProcess::Start(dir, {"--metrics_listen=0.0.0.0:0"}, launch);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  EXPECT_NE(ReadFileOrEmpty(launch.stderr_path).find("--metrics_listen=0.0.0.0:0"), std::string::npos);
}

TEST(SafeDefaultsTest, InsecureListenAnyServesAndWarnsOnce) {
  const std::string dir = MakeTempDir("tqkv-data");
  ServerLaunch launch;
  launch.stderr_path = dir + "/stderr";
  auto p = ServerProcess::Start(dir, {"--listen=0.0.0.0:0", "--insecure_listen_any"}, launch);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string port = (*p)->address().substr((*p)->address().rfind(':') + 1);
  auto c = ClientFor("127.0.0.1:" + port, "");
  auto stats = c->Stats(v1::StatsRequest());
  ASSERT_TRUE(stats.ok()) << stats.status();
  const std::string err = ReadFileOrEmpty(launch.stderr_path);
  EXPECT_EQ(Count(err, "WARNING"), 1) << err;
  EXPECT_NE(err.find("--listen=0.0.0.0:0"), std::string::npos) << err;
}

TEST(SafeDefaultsTest, AuthFileLetsListenersBindBeyondLoopbackWithoutWarning) {
  const std::string dir = MakeTempDir("tqkv-data");
  const std::string tokens = WriteAuthFile(dir, "tok-a alpha\n", 0600);
  ServerLaunch launch;
  launch.stderr_path = dir + "/stderr";
  auto p = ServerProcess::Start(
      dir, {"--listen=0.0.0.0:0", "--metrics_listen=0.0.0.0:0", "--auth_tokens_file=" + tokens},
      launch);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(absl::StartsWith((*p)->data_address(), "0.0.0.0:")) << (*p)->data_address();
  EXPECT_EQ(Count(ReadFileOrEmpty(launch.stderr_path), "WARNING"), 0);
}

TEST(SafeDefaultsTest, AuthFileReadableByOthersIsRefused) {
  const std::string dir = MakeTempDir("tqkv-data");
  const std::string tokens = WriteAuthFile(dir, "tok-a alpha\n", 0644);
  ServerLaunch launch;
  launch.stderr_path = dir + "/stderr";
  auto p = ServerProcess::Start(dir, {"--auth_tokens_file=" + tokens}, launch);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  const std::string err = ReadFileOrEmpty(launch.stderr_path);
  EXPECT_NE(err.find("FAILED_PRECONDITION"), std::string::npos) << err;
  EXPECT_NE(err.find(tokens + " has mode 0644"), std::string::npos) << err;
}

TEST(SafeDefaultsTest, SighupReloadsTokensAndABadFileKeepsTheOldOnes) {
  const std::string dir = MakeTempDir("tqkv-data");
  const std::string tokens = WriteAuthFile(dir, "tok-old alpha\n", 0600);
  ServerLaunch launch;
  launch.stderr_path = dir + "/stderr";
  auto p = ServerProcess::Start(dir, {"--auth_tokens_file=" + tokens}, launch);
  ASSERT_TRUE(p.ok()) << p.status();
  auto old_client = ClientFor((*p)->address(), "tok-old");
  auto new_client = ClientFor((*p)->address(), "tok-new");
  ASSERT_TRUE(old_client->Stats(v1::StatsRequest()).ok());
  ASSERT_EQ(new_client->Stats(v1::StatsRequest()).status().code(), absl::StatusCode::kUnauthenticated);

  // SIGHUP and the server's own look at the file may both reload it.
  WriteAuthFile(dir, "tok-new alpha\n", 0600);
  (*p)->Signal(SIGHUP);
  ASSERT_TRUE(Eventually([&] { return Count(ReadFileOrEmpty(launch.stderr_path), "reloaded: 1 tokens") >= 1; }))
      << ReadFileOrEmpty(launch.stderr_path);
  EXPECT_TRUE(new_client->Stats(v1::StatsRequest()).ok());
  EXPECT_EQ(old_client->Stats(v1::StatsRequest()).status().code(), absl::StatusCode::kUnauthenticated);

  // A file others may read is not taken; the tokens in force stay.
  WriteAuthFile(dir, "tok-other alpha\n", 0644);
  (*p)->Signal(SIGHUP);
  ASSERT_TRUE(Eventually([&] { return Count(ReadFileOrEmpty(launch.stderr_path), "reload failed") >= 1; }))
      << ReadFileOrEmpty(launch.stderr_path);
  EXPECT_NE(ReadFileOrEmpty(launch.stderr_path).find("has mode 0644"), std::string::npos);
  EXPECT_TRUE(new_client->Stats(v1::StatsRequest()).ok());
  old_client.reset();  // open channels would hold up the graceful stop
  new_client.reset();
  EXPECT_EQ(p.value()->Stop(), 0);
}

// An edited auth file takes effect without a signal, within the server's
// maintenance interval; a bad edit keeps the tokens in force and is tried
// once, until the file changes again.
TEST(SafeDefaultsTest, AnEditedAuthFileReloadsByItself) {
  const std::string dir = MakeTempDir("tqkv-data");
  const std::string tokens = WriteAuthFile(dir, "tok-old alpha\n", 0600);
  ServerLaunch launch;
  launch.stderr_path = dir + "/stderr";
  auto p = ServerProcess::Start(dir, {"--auth_tokens_file=" + tokens}, launch);
  ASSERT_TRUE(p.ok()) << p.status();
  auto old_client = ClientFor((*p)->address(), "tok-old");
  auto new_client = ClientFor((*p)->address(), "tok-new");
  ASSERT_TRUE(old_client->Stats(v1::StatsRequest()).ok());
  WriteAuthFile(dir, "tok-new alpha\n", 0600);
  ASSERT_TRUE(Eventually([&] { return new_client->Stats(v1::StatsRequest()).ok(); }))
      << ReadFileOrEmpty(launch.stderr_path);
  EXPECT_EQ(old_client->Stats(v1::StatsRequest()).status().code(), absl::StatusCode::kUnauthenticated);
  WriteAuthFile(dir, "tok-other alpha\n", 0644);
  ASSERT_TRUE(Eventually([&] { return Count(ReadFileOrEmpty(launch.stderr_path), "reload failed") == 1; }))
      << ReadFileOrEmpty(launch.stderr_path);
  absl::SleepFor(absl::Seconds(3));  // three maintenance intervals: not tried again
  EXPECT_EQ(Count(ReadFileOrEmpty(launch.stderr_path), "reload failed"), 1);
  EXPECT_TRUE(new_client->Stats(v1::StatsRequest()).ok());
  old_client.reset();
  new_client.reset();
  EXPECT_EQ(p.value()->Stop(), 0);
}

// One ServerReflectionInfo exchange (list_services "*") as a unary call of
// raw bytes; the status it ends with.
grpc::Status ListServicesByReflection(const std::string& target) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  const char list_services[] = {0x3a, 0x01, '*'};  // field 7 (list_services) = "*"
  grpc::Slice slice(list_services, sizeof list_services);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                 grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (status.ok() && response.Length() == 0) return grpc::Status(grpc::StatusCode::INTERNAL, "empty reply");
  return status;
}

TEST(SafeDefaultsTest, ReflectionIsOffUnlessAskedFor) {
  auto off = ServerProcess::Start(MakeTempDir("tqkv-data"), {});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(ListServicesByReflection((*off)->address()).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  auto on = ServerProcess::Start(MakeTempDir("tqkv-data"), {"--grpc_reflection"});
  ASSERT_TRUE(on.ok()) << on.status();
  grpc::Status s = ListServicesByReflection((*on)->address());
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
}

}  // namespace
}  // namespace tqkv::testing
