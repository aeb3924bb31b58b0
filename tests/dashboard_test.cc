// The Grafana dashboard (deploy/grafana/tqkv.json) checked for real: the
// real tqkv-server serves traffic, Debian's Prometheus scrapes it, and every
// panel query, with Grafana's variables replaced by concrete values, is
// evaluated through Prometheus' query API. Each must parse, return at least
// one series, and hold no NaN or infinite value on a CPU-only server.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

using nlohmann::json;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
// Grafana's $__rate_interval, long enough to cover the whole test.
constexpr char kRateInterval[] = "1m";

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// Prometheus as a child process: scrapes one target every 250 ms, keeps its
// TSDB in a temp dir, listens on a loopback port it picks (read from its
// "Listening on" log line).
class PrometheusProcess {
 public:
  static absl::StatusOr<std::unique_ptr<PrometheusProcess>> Start(const std::string& target) {
    auto p = std::unique_ptr<PrometheusProcess>(new PrometheusProcess());
    const std::string dir = MakeTempDir("prometheus");
    const std::string config = dir + "/prometheus.yml";
    std::ofstream(config) << "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n"
                          << "scrape_configs:\n  - job_name: tqkv\n    static_configs:\n"
                          << "      - targets: ['" << target << "']\n";
    p->log_ = dir + "/log";
    std::vector<std::string> args = {kPrometheus, "--config.file=" + config,
                                     "--storage.tsdb.path=" + dir + "/data",
                                     "--web.listen-address=127.0.0.1:0"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    p->pid_ = fork();
    if (p->pid_ < 0) return absl::InternalError("fork failed");
    if (p->pid_ == 0) {
      if (freopen(p->log_.c_str(), "w", stderr) == nullptr) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const std::regex listening(R"(msg="Listening on" address=(127\.0\.0\.1:[0-9]+))");
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (p->address_.empty()) {
      std::smatch m;
      const std::string log = ReadFileOrEmpty(p->log_);
      if (std::regex_search(log, m, listening)) {
        p->address_ = m[1];
      } else if (absl::Now() > deadline || waitpid(p->pid_, nullptr, WNOHANG) == p->pid_) {
        return absl::UnavailableError("prometheus did not start: " + log);
      } else {
        absl::SleepFor(absl::Milliseconds(20));  // polls its log for the bound port
      }
    }
    return p;
  }
  ~PrometheusProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  const std::string& address() const { return address_; }
  std::string Log() const { return ReadFileOrEmpty(log_); }

  // GET /api/v1/<path>; the decoded JSON body, or the HTTP error (whose
  // message holds Prometheus' error text).
  absl::StatusOr<json> Api(const std::string& path) const {
    auto body = HttpGet(address_, "/api/v1/" + path);
    if (!body.ok()) return body.status();
    json j = json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InternalError("not JSON: " + *body);
    return j;
  }
  absl::StatusOr<json> Query(const std::string& promql) const {
    return Api("query?query=" + UrlEncode(promql));
  }
  // Polls `promql` until its first sample equals `want`; false after 20 s.
  bool WaitFor(const std::string& promql, double want) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      auto r = Query(promql);
      double v;
      if (r.ok() && !(*r)["data"]["result"].empty() &&
          absl::SimpleAtod((*r)["data"]["result"][0]["value"][1].get<std::string>(), &v) &&
          v == want)
        return true;
      absl::SleepFor(absl::Milliseconds(50));  // the next scrape is at most 250 ms away
    }
    return false;
  }

 private:
  PrometheusProcess() = default;
  pid_t pid_ = -1;
  std::string address_, log_;
};

class DashboardTest : public ServerTest {
 protected:
  void SetUp() override {
    if (access(kPrometheus, X_OK) != 0)
      GTEST_SKIP() << kPrometheus << " is not installed (tools/setup.sh installs `prometheus`)";
    StartServer();
    auto p = PrometheusProcess::Start(server_->metrics_address());
    ASSERT_TRUE(p.ok()) << p.status();
    prometheus_ = std::move(*p);
  }

  // One round of traffic through the C++ client, touching every family the
  // dashboard reads: registration, puts, lookups with hits, misses and a
  // FAILED_PRECONDITION, reads that hit and one NOT_FOUND, a sequence built
  // on stored blocks, an attend over it, and its drop.
  void Traffic(int round) {
    const v1::ModelRef model = RegisterSmall();
    const auto chain = client::HashChain(round, 4);
    PutDense(model, chain, 100 * round);

    v1::LookupRequest lr;
    *lr.mutable_model() = model;
    for (const auto& h : chain) lr.add_block_hashes(h);
    lr.add_block_hashes(client::ChainHash(chain.back(), round, 99));
    auto look = client_->Lookup(lr);
    ASSERT_TRUE(look.ok()) << look.status();
    ASSERT_EQ(look->hits(), 4u);
    lr.mutable_model()->set_layout_fingerprint("bad");
    ASSERT_FALSE(client_->Lookup(lr).ok());

    v1::GetBlocksRequest gr;
    *gr.mutable_model() = model;
    gr.add_block_hashes(chain[0]);
    ASSERT_TRUE(client_->GetBlocks(gr).ok());
    gr.add_block_hashes(client::ChainHash(chain.back(), round, 98));
    ASSERT_FALSE(client_->GetBlocks(gr).ok());

    v1::CreateSequenceRequest cs;
    *cs.mutable_model() = model;
    for (const auto& h : chain) cs.add_block_hashes(h);
    auto seq = client_->CreateSequence(cs);
    ASSERT_TRUE(seq.ok()) << seq.status();
    const v1::AttendRequest at = OneQueryAttend(seq->sequence_id(), 0, v1::DTYPE_FP32, round);
    auto out = client_->Attend(at);
    ASSERT_TRUE(out.ok()) << out.status();
    v1::DropSequenceRequest drop;
    drop.set_sequence_id(seq->sequence_id());
    ASSERT_TRUE(client_->DropSequence(drop).ok());
  }

  // The query with Grafana's variables replaced by this test's values.
  std::string Concrete(const std::string& expr) const {
    return absl::StrReplaceAll(expr, {{"$__rate_interval", kRateInterval},
                                      {"$instance", server_->metrics_address()}});
  }

  std::unique_ptr<PrometheusProcess> prometheus_;
};

json LoadDashboard() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string path =
      absl::StrCat(srcdir ? srcdir : ".", "/tqkv/deploy/grafana/tqkv.json");
  json j = json::parse(ReadFileOrEmpty(path), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path << " is not JSON";
  return j;
}

TEST_F(DashboardTest, EveryPanelQueryReturnsSeriesWithoutNaN) {
  const json dash = LoadDashboard();
  ASSERT_TRUE(dash.contains("panels") && !dash["panels"].empty());
  ASSERT_TRUE(prometheus_->WaitFor("up", 1)) << prometheus_->Log();

  // Two rounds with a scrape after each: every counter the queries rate
  // moves between two samples of the window.
  const std::string drops = "tqkv_rpc_requests_total{method=\"DropSequence\"}";
  for (int round = 1; round <= 2; ++round) {
    ASSERT_NO_FATAL_FAILURE(Traffic(round));
    ASSERT_TRUE(prometheus_->WaitFor(drops, round)) << "round " << round << " not scraped";
  }

  // The instance variable lists this server.
  bool has_instance = false;
  for (const json& v : dash["templating"]["list"]) {
    if (v.value("name", "") != "instance") continue;
    has_instance = true;
    const std::regex label_values(R"(label_values\((\w+), *(\w+)\))");
    std::smatch m;
    const std::string def = v.value("definition", "");
    ASSERT_TRUE(std::regex_match(def, m, label_values)) << def;
    auto r = prometheus_->Api(
        absl::StrCat("label/", m[2].str(), "/values?match[]=", UrlEncode(m[1].str())));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE(std::find((*r)["data"].begin(), (*r)["data"].end(), server_->metrics_address()),
              (*r)["data"].end())
        << r->dump();
  }
  EXPECT_TRUE(has_instance) << "no `instance` template variable";

  const std::regex selector(R"(tqkv_\w+(\{[^}]*\})?)");
  int queries = 0;
  for (const json& panel : dash["panels"]) {
    const std::string title = panel.value("title", "?");
    ASSERT_TRUE(panel.contains("targets") && !panel["targets"].empty()) << title;
    for (const json& target : panel["targets"]) {
      const std::string expr = target.value("expr", "");
      SCOPED_TRACE(absl::StrCat("panel \"", title, "\" ", target.value("refId", ""), ": ", expr));
      ++queries;
      // Every series the panel reads follows the instance variable.
      for (std::sregex_iterator it(expr.begin(), expr.end(), selector), end; it != end; ++it)
        EXPECT_NE((*it)[1].str().find("instance=~\"$instance\""), std::string::npos)
            << (*it).str() << " ignores $instance";
      const std::string promql = Concrete(expr);
      ASSERT_EQ(promql.find('$'), std::string::npos) << "unknown Grafana variable in " << promql;
      auto r = prometheus_->Query(promql);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ((*r)["status"], "success") << r->dump();
      const json& result = (*r)["data"]["result"];
      EXPECT_FALSE(result.empty()) << "no series";
      for (const json& series : result) {
        double v = 0;
        const std::string text = series["value"][1].get<std::string>();
        ASSERT_TRUE(absl::SimpleAtod(text, &v)) << text;
        EXPECT_TRUE(std::isfinite(v)) << series.dump();
      }
    }
  }
  EXPECT_GE(queries, 20);
}

}  // namespace
}  // namespace tqkv::testing
