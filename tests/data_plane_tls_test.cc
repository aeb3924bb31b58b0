// TLS and mutual TLS on the data plane, against the real tqkv-server, the
// real C++ data-plane client and certificates made at test time by the
// openssl CLI (tests/make_test_certs.sh): with TLS configured the data plane
// speaks TLS only; plaintext, an untrusted server certificate, a missing,
// expired or untrusted client certificate are refused (UNAVAILABLE); the
// tenant comes from the client certificate as on gRPC, so another tenant's
// certificate does not read the first tenant's blocks and a token of
// another tenant is UNAUTHENTICATED; a renewed server certificate is served
// without a restart.
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/data_plane_client.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

class DataPlaneTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(MakeTempDir("tqkv-certs"));
    const std::string cmd = Runfile("tests/make_test_certs.sh") + " " + *certs_ + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  static void TearDownTestSuite() { delete certs_; }

  static std::string Cert(const std::string& name) { return *certs_ + "/" + name; }

  // Starts the server with TLS from `cert`/`key` and `flags`.
  void Start(std::vector<std::string> flags, const std::string& cert, const std::string& key) {
    flags.push_back("--tls_cert_file=" + cert);
    flags.push_back("--tls_key_file=" + key);
    auto p = ServerProcess::Start(MakeTempDir("tqkv-data"), flags);
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
    ASSERT_FALSE(server_->data_address().empty());
  }
  // Mutual TLS; the auth file maps alpha.pem's URI SAN to tenant alpha and
  // beta.pem's CN to tenant beta, and has a token of each.
  void StartMutual() {
    const std::string tokens = MakeTempDir("tqkv-auth") + "/tokens";
    std::ofstream(tokens) << "x509-uri:spiffe://tqkv/alpha alpha\n"
                          << "x509-cn:beta-box beta\n"
                          << "tok-a alpha\ntok-b beta\n";
    chmod(tokens.c_str(), 0600);
    Start({"--auth_tokens_file=" + tokens, "--tls_client_ca_file=" + Cert("ca.pem")}, Cert("server.pem"),
          Cert("server.key"));
  }

  // A data-plane connection trusting `ca` (empty: plain TCP) with client
  // certificate `who` (empty: none) and `token`.
  absl::StatusOr<std::unique_ptr<client::DataPlaneClient>> Dp(const std::string& ca, const std::string& who,
                                                              const std::string& token = "") {
    client::DataPlaneClientOptions o;
    o.target = server_->data_address();
    o.token = token;
    o.timeout = absl::Seconds(20);
    if (!ca.empty()) o.tls.ca_file = Cert(ca);
    if (!who.empty()) {
      o.tls.cert_file = Cert(who + ".pem");
      o.tls.key_file = Cert(who + ".key");
    }
    return client::DataPlaneClient::Connect(o);
  }

  static v1::ModelRef NoModel() {
    v1::ModelRef m;
    m.set_model_id(999999);
    return m;
  }

  // The code of a GetBlocks of `hashes` of `model` (a missing model: the
  // call was served, and NOT_FOUND says so) on a fresh connection.
  absl::StatusCode GetCode(const std::string& ca, const std::string& who, const std::string& token = "",
                           const v1::ModelRef& model = NoModel(), std::vector<std::string> hashes = {"h"}) {
    auto dp = Dp(ca, who, token);
    if (!dp.ok()) return dp.status().code();
    v1::GetBlocksRequest req;
    *req.mutable_model() = model;
    for (const std::string& h : hashes) req.add_block_hashes(h);
    client::DataPlaneBlocks out;
    return (*dp)->GetBlocks(req, &out).code();
  }

  // A gRPC client with client certificate `who`.
  std::unique_ptr<client::Client> Grpc(const std::string& who) {
    client::ClientOptions o;
    o.target = server_->address();
    o.max_attempts = 1;
    o.tls_ca_file = Cert("ca.pem");
    o.tls_cert_file = Cert(who + ".pem");
    o.tls_key_file = Cert(who + ".key");
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  static std::string* certs_;
  std::unique_ptr<ServerProcess> server_;
};

std::string* DataPlaneTlsTest::certs_ = nullptr;

TEST_F(DataPlaneTlsTest, TlsServesClientsThatTrustItsCaAndRefusesPlaintext) {
  Start({}, Cert("server.pem"), Cert("server.key"));
  EXPECT_EQ(GetCode("ca.pem", ""), absl::StatusCode::kNotFound);  // served: no such model
  EXPECT_EQ(GetCode("", ""), absl::StatusCode::kUnavailable);     // plaintext: the server hangs up
  auto rogue = Dp("rogue-ca.pem", "");                            // the client refuses the server
  ASSERT_FALSE(rogue.ok());
  EXPECT_EQ(rogue.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(rogue.status().message().find("certificate verify failed"), std::string::npos) << rogue.status();
}

TEST_F(DataPlaneTlsTest, MutualTlsNeedsAValidClientCertificateFromTheClientCa) {
  StartMutual();
  EXPECT_EQ(GetCode("ca.pem", "alpha"), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetCode("ca.pem", ""), absl::StatusCode::kUnavailable);         // none
  EXPECT_EQ(GetCode("ca.pem", "expired"), absl::StatusCode::kUnavailable);  // 2020
  EXPECT_EQ(GetCode("ca.pem", "rogue"), absl::StatusCode::kUnavailable);    // other CA
  EXPECT_EQ(GetCode("", ""), absl::StatusCode::kUnavailable);               // plaintext
}

TEST_F(DataPlaneTlsTest, TheCertificateIsTheTenantOnBothTransports) {
  StartMutual();
  auto reg = Grpc("alpha")->RegisterModel(client::SmallModel("m"));
  ASSERT_TRUE(reg.ok()) << reg.status();
  v1::ModelRef model;
  model.set_model_id(reg->model_id());
  model.set_layout_fingerprint(reg->layout_fingerprint());
  const std::vector<std::string> hashes = client::HashChain(7, 3);
  std::vector<v1::PutBlock> blocks;
  std::string parent;
  for (size_t i = 0; i < hashes.size(); ++i) {
    blocks.push_back(client::DenseBlock(client::SmallModel("m").layout(), hashes[i], parent, 40 + i));
    parent = hashes[i];
  }
  v1::PutHeader header;
  *header.mutable_model() = model;
  auto alpha = Dp("ca.pem", "alpha");
  ASSERT_TRUE(alpha.ok()) << alpha.status();
  auto put = (*alpha)->PutBlocks(header, blocks);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->committed(), 3u);

  // Over TLS the data plane returns gRPC's bytes.
  v1::GetBlocksRequest req;
  *req.mutable_model() = model;
  for (const std::string& h : hashes) req.add_block_hashes(h);
  client::DataPlaneBlocks out;
  ASSERT_TRUE((*alpha)->GetBlocks(req, &out).ok());
  auto grpc = Grpc("alpha")->GetBlocks(req);
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  std::vector<std::string> expected;
  for (const v1::GetBlocksResponse& r : *grpc) expected.push_back(r.payload());
  ASSERT_EQ(out.size(), 3u);
  ASSERT_EQ(expected.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(out.payload(i).size(), 1000u);
    EXPECT_EQ(out.payload(i), expected[i]) << i;
  }

  EXPECT_EQ(GetCode("ca.pem", "alpha", "tok-a", model, hashes), absl::StatusCode::kOk);
  // Tenant beta (its CN) does not see alpha's model, with or without its token.
  EXPECT_EQ(GetCode("ca.pem", "beta", "", model, hashes), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetCode("ca.pem", "beta", "tok-b", model, hashes), absl::StatusCode::kNotFound);
  // Certificate and token must name one tenant: alpha's token on beta's
  // certificate, and beta's token on alpha's, are nobody.
  EXPECT_EQ(GetCode("ca.pem", "beta", "tok-a", model, hashes), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(GetCode("ca.pem", "alpha", "tok-b", model, hashes), absl::StatusCode::kUnauthenticated);
  // A verified certificate the auth file does not map is nobody.
  EXPECT_EQ(GetCode("ca.pem", "stranger", "", model, hashes), absl::StatusCode::kUnauthenticated);
}

TEST_F(DataPlaneTlsTest, ARenewedServerCertificateIsServedWithoutARestart) {
  const std::string dir = MakeTempDir("tqkv-live");
  std::filesystem::copy_file(Cert("server.pem"), dir + "/cert.pem");
  std::filesystem::copy_file(Cert("server.key"), dir + "/key.pem");
  Start({"--tls_reload_interval_s=1"}, dir + "/cert.pem", dir + "/key.pem");
  EXPECT_EQ(GetCode("ca.pem", ""), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetCode("ca2.pem", ""), absl::StatusCode::kUnavailable);
  auto before = Dp("ca.pem", "");  // an open connection keeps its session
  ASSERT_TRUE(before.ok()) << before.status();

  std::filesystem::copy_file(Cert("server2.pem"), dir + "/cert.new");
  std::filesystem::copy_file(Cert("server2.key"), dir + "/key.new");
  std::filesystem::rename(dir + "/key.new", dir + "/key.pem");
  std::filesystem::rename(dir + "/cert.new", dir + "/cert.pem");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (GetCode("ca2.pem", "") != absl::StatusCode::kNotFound) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the renewed certificate was never served";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(GetCode("ca.pem", ""), absl::StatusCode::kUnavailable);
  v1::GetBlocksRequest req;
  *req.mutable_model() = NoModel();
  req.add_block_hashes("h");
  client::DataPlaneBlocks out;
  EXPECT_EQ((*before)->GetBlocks(req, &out).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tqkv::testing
