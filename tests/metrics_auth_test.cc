// /metrics of an authenticated and of a TLS server, scraped by curl from the
// real tqkv-server: with an auth file a scrape needs an admin or `metrics`
// credential (401 without one, 403 for a tenant's token) and names no tenant
// unless --metrics_tenant_labels=true; a `metrics` token opens nothing on
// gRPC; a token reload (SIGHUP) applies to scrapes at once; with TLS the
// listener speaks HTTPS only, and under mutual TLS a
// client certificate mapped to a `metrics` line is a credential of its own.
#include <sys/stat.h>

#include <csignal>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

struct Scrape {
  int curl_exit = -1;
  int http_code = 0;  // 0: no HTTP answer
  std::string body;
};

// GET `url` with curl; `args` are extra curl arguments (already quoted).
Scrape Get(const std::string& url, const std::string& args = "") {
  Scrape s;
  std::string out;
  s.curl_exit = RunShell(absl::StrCat("curl -sS --max-time 20 -o - -w '\\n%{http_code}' ", args,
                                      " '", url, "' 2>/dev/null"),
                         &out);
  const size_t nl = out.rfind('\n');
  if (nl != std::string::npos) {
    s.body = out.substr(0, nl);
    s.http_code = std::atoi(out.c_str() + nl + 1);
  }
  return s;
}

std::string Bearer(const std::string& token) {
  return absl::StrCat("-H 'Authorization: Bearer ", token, "'");
}

class MetricsAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(MakeTempDir("tqkv-certs"));
    std::string out;
    ASSERT_EQ(RunShell(Runfile("tests/make_test_certs.sh") + " " + *certs_ + " 2>/dev/null", &out), 0) << out;
  }
  static void TearDownTestSuite() { delete certs_; }
  static std::string Cert(const std::string& name) { return *certs_ + "/" + name; }

  void Start(const std::string& tokens, std::vector<std::string> flags) {
    tokens_path_ = MakeTempDir("tqkv-auth") + "/tokens";
    WriteTokens(tokens);
    flags.push_back("--auth_tokens_file=" + tokens_path_);
    auto p = ServerProcess::Start(MakeTempDir("tqkv-data"), flags);
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
  }

  std::unique_ptr<client::Client> As(const std::string& token, bool tls = false) {
    client::ClientOptions o;
    o.target = server_->address();
    o.max_attempts = 1;
    o.token = token;
    if (tls) {
      o.tls_ca_file = Cert("ca.pem");
      o.tls_cert_file = Cert("beta.pem");
      o.tls_key_file = Cert("beta.key");
    }
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  // Registers the small model as `c`'s tenant and puts `n` blocks.
  void PutAs(client::Client& c, int n) {
    auto r = c.RegisterModel(client::SmallModel("alice-model"));
    ASSERT_TRUE(r.ok()) << r.status();
    const v1::ModelLayout layout = client::SmallModel("x").layout();
    std::vector<v1::PutBlock> blocks;
    std::string parent;
    for (const std::string& hash : client::HashChain(3, n)) {
      blocks.push_back(client::DenseBlock(layout, hash, parent, blocks.size()));
      parent = hash;
    }
    v1::PutHeader h;
    h.mutable_model()->set_model_id(r->model_id());
    h.mutable_model()->set_layout_fingerprint(r->layout_fingerprint());
    auto put = c.PutBlocks(h, blocks);
    ASSERT_TRUE(put.ok()) << put.status();
  }

  std::string Url() const { return absl::StrCat("http://", server_->metrics_address(), "/metrics"); }

  void WriteTokens(const std::string& tokens) {
    const std::string tmp = tokens_path_ + ".new";
    std::ofstream(tmp) << tokens;
    chmod(tmp.c_str(), 0600);
    std::rename(tmp.c_str(), tokens_path_.c_str());
  }

  static std::string* certs_;
  std::string tokens_path_;
  std::unique_ptr<ServerProcess> server_;
};

std::string* MetricsAuthTest::certs_ = nullptr;

constexpr char kTokens[] =
    "admin-token ops admin\n"
    "alice-token alice\n"
    "scrape-token prometheus metrics\n";

TEST_F(MetricsAuthTest, AScrapeNeedsAnAdminOrMetricsCredentialAndNamesNoTenant) {
  Start(kTokens, {});
  auto alice = As("alice-token");
  PutAs(*alice, 4);

  Scrape none = Get(Url());
  EXPECT_EQ(none.http_code, 401) << none.body;
  EXPECT_FALSE(absl::StrContains(none.body, "tqkv_")) << none.body;
  EXPECT_EQ(Get(Url(), Bearer("wrong-token")).http_code, 401);
  EXPECT_EQ(Get(Url(), "-H 'Authorization: Basic c2NyYXBlOnRva2Vu'").http_code, 401);
  Scrape tenant = Get(Url(), Bearer("alice-token"));
  EXPECT_EQ(tenant.http_code, 403) << tenant.body;
  EXPECT_FALSE(absl::StrContains(tenant.body, "tqkv_")) << tenant.body;

  Scrape scraper = Get(Url(), Bearer("scrape-token"));
  ASSERT_EQ(scraper.http_code, 200) << scraper.body;
  bool ok = false;
  const std::string check = PromtoolCheck(scraper.body, &ok);
  EXPECT_TRUE(ok) << check;
  EXPECT_TRUE(absl::StrContains(scraper.body, "\ntqkv_stored_blocks{tier=\"host\"} 4\n")) << scraper.body;
  EXPECT_FALSE(absl::StrContains(scraper.body, "alice")) << scraper.body;
  EXPECT_FALSE(absl::StrContains(scraper.body, "tenant=")) << scraper.body;
  EXPECT_TRUE(absl::StrContains(scraper.body, "\nprocess_resident_memory_bytes ")) << scraper.body;

  Scrape admin = Get(Url(), Bearer("admin-token"));
  EXPECT_EQ(admin.http_code, 200);
  EXPECT_TRUE(absl::StrContains(admin.body, "tqkv_stored_blocks{tier=\"host\"} 4")) << admin.body;
  EXPECT_EQ(Get(absl::StrCat("http://", server_->metrics_address(), "/"), Bearer("admin-token")).http_code,
            404);

  // The scrape-only token opens nothing on gRPC.
  auto scraper_rpc = As("scrape-token");
  EXPECT_EQ(scraper_rpc->Stats(v1::StatsRequest()).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(alice->Stats(v1::StatsRequest()).ok());
}

TEST_F(MetricsAuthTest, AReloadedAuthFileTakesEffectWithoutARestart) {
  Start(kTokens, {});
  ASSERT_EQ(Get(Url(), Bearer("scrape-token")).http_code, 200);
  WriteTokens("admin-token ops admin\nnew-scrape-token prometheus metrics\n");
  server_->Signal(SIGHUP);
  // The reload is asynchronous to this process: wait for the old token to go.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Get(Url(), Bearer("scrape-token")).http_code != 401) {
    ASSERT_LT(absl::Now(), deadline) << "the old metrics token still scrapes after SIGHUP";
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(Get(Url(), Bearer("new-scrape-token")).http_code, 200);
}

// --metrics_auth=false: an authenticated server serves /metrics without a
// credential (a scraper that cannot send one), still naming no tenant,
// while gRPC keeps asking for tokens.
TEST_F(MetricsAuthTest, MetricsAuthCanBeTurnedOffAndStillNamesNoTenant) {
  Start(kTokens, {"--metrics_auth=false"});
  auto alice = As("alice-token");
  PutAs(*alice, 3);
  Scrape none = Get(Url());
  ASSERT_EQ(none.http_code, 200) << none.body;
  EXPECT_TRUE(absl::StrContains(none.body, "\ntqkv_stored_blocks{tier=\"host\"} 3\n")) << none.body;
  EXPECT_FALSE(absl::StrContains(none.body, "alice")) << none.body;
  EXPECT_EQ(As("")->Stats(v1::StatsRequest()).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(MetricsAuthTest, TenantLabelsOnlyWhenAsked) {
  Start(kTokens, {"--metrics_tenant_labels=true"});
  auto alice = As("alice-token");
  PutAs(*alice, 2);
  Scrape s = Get(Url(), Bearer("scrape-token"));
  ASSERT_EQ(s.http_code, 200) << s.body;
  EXPECT_TRUE(absl::StrContains(
      s.body, "tqkv_stored_blocks{model=\"alice-model\",tenant=\"alice\",tier=\"host\"} 2"))
      << s.body;
}

TEST_F(MetricsAuthTest, TlsServesHttpsOnlyAndMutualTlsMapsScraperCertificates) {
  Start(absl::StrCat(kTokens,
                     "x509-uri:spiffe://tqkv/alpha prometheus metrics\n"
                     "x509-uri:spiffe://tqkv/beta beta\n"),
        {"--tls_cert_file=" + Cert("server.pem"), "--tls_key_file=" + Cert("server.key"),
         "--tls_client_ca_file=" + Cert("ca.pem")});
  const std::string https = absl::StrCat("https://", server_->metrics_address(), "/metrics");
  const std::string ca = "--cacert '" + Cert("ca.pem") + "' ";
  auto cert = [&](const std::string& who) {
    return absl::StrCat(ca, "--cert '", Cert(who + ".pem"), "' --key '", Cert(who + ".key"), "' ");
  };

  // Plain HTTP gets no metrics.
  Scrape plain = Get(Url(), Bearer("scrape-token"));
  EXPECT_NE(plain.http_code, 200);
  EXPECT_FALSE(absl::StrContains(plain.body, "tqkv_"));
  // Without a client certificate the handshake fails, token or not.
  Scrape no_cert = Get(https, ca + Bearer("scrape-token"));
  EXPECT_NE(no_cert.curl_exit, 0);
  EXPECT_NE(no_cert.http_code, 200);
  // A certificate from an untrusted CA is refused as well.
  Scrape rogue = Get(https, cert("rogue") + Bearer("scrape-token"));
  EXPECT_NE(rogue.curl_exit, 0);
  EXPECT_NE(rogue.http_code, 200);

  // The scraper's own certificate is its credential.
  Scrape alpha = Get(https, cert("alpha"));
  ASSERT_EQ(alpha.http_code, 200) << alpha.body;
  bool ok = false;
  const std::string check = PromtoolCheck(alpha.body, &ok);
  EXPECT_TRUE(ok) << check;
  // A tenant's certificate is not; with the metrics token on top it is the
  // token that must agree with the certificate's tenant (it does not).
  EXPECT_EQ(Get(https, cert("beta")).http_code, 403);
  EXPECT_EQ(Get(https, cert("beta") + Bearer("scrape-token")).http_code, 401);
  // Any verified certificate with an admin token.
  EXPECT_EQ(Get(https, cert("stranger") + Bearer("admin-token")).http_code, 200);
}

}  // namespace
}  // namespace tqkv::testing
