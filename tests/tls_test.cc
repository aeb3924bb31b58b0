// TLS and mutual TLS on gRPC, against the real tqkv-server binary, the real
// C++ client and the CLI, with certificates made at test time by the
// openssl CLI (tests/make_test_certs.sh): TLS and mTLS serve; plaintext to a
// TLS port, a server certificate from an untrusted CA, a missing, expired
// or untrusted client certificate all fail the handshake, which gRPC reports
// as UNAVAILABLE; tenants come from client certificates (URI SAN or CN) and
// must agree with the token; a renewed server certificate is served without
// a restart; bad TLS files stop the server at start.
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(MakeTempDir("tqkv-certs"));
    std::string out;
    ASSERT_EQ(RunShell(Runfile("tests/make_test_certs.sh") + " " + *certs_ + " 2>&1", &out), 0) << out;
  }
  static void TearDownTestSuite() { delete certs_; }

  static std::string Cert(const std::string& name) { return *certs_ + "/" + name; }

  // Starts the server with TLS from server.pem/server.key (and `flags`).
  void StartTls(std::vector<std::string> flags) {
    flags.push_back("--tls_cert_file=" + Cert("server.pem"));
    flags.push_back("--tls_key_file=" + Cert("server.key"));
    auto p = ServerProcess::Start(MakeTempDir("tqkv-data"), flags);
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
  }
  void StartMutual(std::vector<std::string> flags = {}) {
    flags.push_back("--tls_client_ca_file=" + Cert("ca.pem"));
    StartTls(std::move(flags));
  }

  // A client of the server trusting `ca` with client certificate `who`
  // (who.pem/who.key; empty: none) and `token`.
  std::unique_ptr<client::Client> As(const std::string& ca, const std::string& who,
                                     const std::string& token = "") {
    client::ClientOptions o;
    o.target = server_->address();
    o.max_attempts = 1;
    o.deadline = absl::Seconds(20);
    o.token = token;
    if (!ca.empty()) o.tls_ca_file = Cert(ca);
    if (!who.empty()) {
      o.tls_cert_file = Cert(who + ".pem");
      o.tls_key_file = Cert(who + ".key");
    }
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  static absl::StatusCode StatsCode(client::Client& c) {
    return c.Stats(v1::StatsRequest()).status().code();
  }

  static std::string* certs_;
  std::unique_ptr<ServerProcess> server_;
};

std::string* TlsTest::certs_ = nullptr;

TEST_F(TlsTest, TlsServesClientsThatTrustItsCaAndRefusesTheRest) {
  StartTls({});
  EXPECT_EQ(StatsCode(*As("ca.pem", "")), absl::StatusCode::kOk);
  // Plaintext to the TLS port: no HTTP/2 preface is accepted.
  EXPECT_EQ(StatsCode(*As("", "")), absl::StatusCode::kUnavailable);
  // A client that trusts another CA refuses the server's certificate.
  EXPECT_EQ(StatsCode(*As("rogue-ca.pem", "")), absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, MutualTlsNeedsAValidClientCertificateFromTheClientCa) {
  StartMutual();
  EXPECT_EQ(StatsCode(*As("ca.pem", "alpha")), absl::StatusCode::kOk);
  EXPECT_EQ(StatsCode(*As("ca.pem", "")), absl::StatusCode::kUnavailable);         // none
  EXPECT_EQ(StatsCode(*As("ca.pem", "expired")), absl::StatusCode::kUnavailable);  // 2020
  EXPECT_EQ(StatsCode(*As("ca.pem", "rogue")), absl::StatusCode::kUnavailable);    // other CA
  EXPECT_EQ(StatsCode(*As("", "")), absl::StatusCode::kUnavailable);              // plaintext
}

TEST_F(TlsTest, TenantsComeFromClientCertificatesAndMustAgreeWithTheToken) {
  const std::string dir = MakeTempDir("tqkv-auth");
  const std::string tokens = dir + "/tokens";
  std::ofstream(tokens) << "x509-uri:spiffe://tqkv/alpha alpha\n"  // alpha.pem's URI SAN
                        << "x509-cn:beta-box beta\n"               // beta.pem's CN
                        << "tok-a alpha\ntok-b beta\n";
  chmod(tokens.c_str(), 0600);
  StartMutual({"--auth_tokens_file=" + tokens});

  auto alpha = As("ca.pem", "alpha");
  auto reg = alpha->RegisterModel(client::SmallModel("m"));
  ASSERT_TRUE(reg.ok()) << reg.status();
  v1::LookupRequest lookup;
  lookup.mutable_model()->set_model_id(reg->model_id());
  lookup.mutable_model()->set_layout_fingerprint(reg->layout_fingerprint());
  lookup.add_block_hashes("h0");
  EXPECT_TRUE(alpha->Lookup(lookup).ok());
  EXPECT_TRUE(As("ca.pem", "alpha", "tok-a")->Lookup(lookup).ok());
  // Tenant beta (by CN) does not see alpha's model.
  EXPECT_EQ(As("ca.pem", "beta")->Lookup(lookup).status().code(), absl::StatusCode::kNotFound);
  // A verified certificate that the auth file does not map is nobody.
  EXPECT_EQ(StatsCode(*As("ca.pem", "stranger")), absl::StatusCode::kUnauthenticated);
  // Certificate and token must name one tenant.
  EXPECT_EQ(As("ca.pem", "alpha", "tok-b")->Lookup(lookup).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(TlsTest, ARenewedServerCertificateIsServedWithoutARestart) {
  // The server's own copies, replaced below by rename (atomic, as the
  // file watcher needs).
  const std::string dir = MakeTempDir("tqkv-live");
  std::filesystem::copy_file(Cert("server.pem"), dir + "/cert.pem");
  std::filesystem::copy_file(Cert("server.key"), dir + "/key.pem");
  auto p = ServerProcess::Start(MakeTempDir("tqkv-data"),
                                {"--tls_cert_file=" + dir + "/cert.pem", "--tls_key_file=" + dir + "/key.pem",
                                 "--tls_reload_interval_s=1"});
  ASSERT_TRUE(p.ok()) << p.status();
  server_ = std::move(*p);
  EXPECT_EQ(StatsCode(*As("ca.pem", "")), absl::StatusCode::kOk);
  EXPECT_EQ(StatsCode(*As("ca2.pem", "")), absl::StatusCode::kUnavailable);

  std::filesystem::copy_file(Cert("server2.pem"), dir + "/cert.new");
  std::filesystem::copy_file(Cert("server2.key"), dir + "/key.new");
  std::filesystem::rename(dir + "/key.new", dir + "/key.pem");
  std::filesystem::rename(dir + "/cert.new", dir + "/cert.pem");
  // The watcher re-reads within its 1 s interval; poll (fresh channels).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (StatsCode(*As("ca2.pem", "")) != absl::StatusCode::kOk) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the renewed certificate was never served";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(StatsCode(*As("ca.pem", "")), absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, CliSpeaksMutualTls) {
  StartMutual();
  const std::string cli = Runfile("client/cli/tqkv");
  std::string out;
  const std::string base = absl::StrCat(cli, " status --server ", server_->address(),
                                        " --timeout_ms 10000 --tls_ca ", Cert("ca.pem"));
  EXPECT_EQ(RunShell(base + " --tls_cert " + Cert("alpha.pem") + " --tls_key " + Cert("alpha.key") + " 2>&1", &out), 0)
      << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
  EXPECT_NE(RunShell(base + " 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("UNAVAILABLE"), std::string::npos) << out;
}

TEST_F(TlsTest, BadTlsFilesStopTheServerAtStart) {
  const std::string dir = MakeTempDir("tqkv-data");
  ServerLaunch launch;
  launch.stderr_path = dir + "/stderr";
  auto p = ServerProcess::Start(
      dir, {"--tls_cert_file=" + Cert("server.pem"), "--tls_key_file=" + Cert("alpha.key")}, launch);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  std::string err = ReadFileOrEmpty(launch.stderr_path);
  EXPECT_NE(err.find("INVALID_ARGUMENT: TLS key file " + Cert("alpha.key") + " does not match"),
            std::string::npos)
      << err;
  p = ServerProcess::Start(dir, {"--tls_cert_file=" + Cert("server.pem")}, launch);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(ReadFileOrEmpty(launch.stderr_path).find("go together"), std::string::npos);
  p = ServerProcess::Start(dir,
                           {"--tls_cert_file=" + Cert("ca.db/index.txt"), "--tls_key_file=" + Cert("server.key")},
                           launch);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(ReadFileOrEmpty(launch.stderr_path).find("holds no PEM certificate"), std::string::npos);
}

}  // namespace
}  // namespace tqkv::testing
