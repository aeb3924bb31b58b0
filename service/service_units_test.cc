// Unit tests of the small service components: auth files (tokens,
// certificate identities, file modes, reload), the listen policy, backend
// selection, the failed-call log's rate limit, the staging area, and
// sequence idle expiry (fake clock).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "codec/cpu_backend.h"
#include "service/auth.h"
#include "service/backend_select.h"
#include "service/listen_policy.h"
#include "service/model_registry.h"
#include "service/rpc_scope.h"
#include "service/sequence_manager.h"
#include "service/staging_area.h"
#include "service/tenant_budget.h"
#include "storage/clock.h"

namespace tqkv::service {
namespace {

// Rate-limited lines: at most N a second; the next written line after a
// full second says how many were dropped.
TEST(LineLogTest, RateLimitedLinesAreCountedOnceTheSecondsAllowanceIsSpent) {
  std::ostringstream out;
  LineLog log(&out, 3, /*stamp=*/false);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) log.WriteLimited("line " + std::to_string(i), t0 + std::chrono::milliseconds(i));
  EXPECT_EQ(out.str(), "line 0\nline 1\nline 2\n");
  log.Write("unlimited");
  log.WriteLimited("late", t0 + std::chrono::milliseconds(1100));
  EXPECT_EQ(out.str(),
            "line 0\nline 1\nline 2\nunlimited\n"
            "tqkv-server: 5 log lines of failed calls dropped (more than 3 a second)\nlate\n");
}

// Lines start with the UTC time (milliseconds) and their level.
TEST(LineLogTest, LinesCarryTheTimeAndTheirLevel) {
  std::ostringstream out;
  LineLog log(&out);
  log.Write("tqkv-server: started");
  log.Write("tqkv-server: stopped badly", LogLevel::kError);
  log.WriteLimited("tqkv-server: Lookup from peer -> INVALID_ARGUMENT");
  const std::string text = out.str();
  const std::string stamped = R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [IWE] tqkv-server: [^\n]*\n)";
  EXPECT_TRUE(std::regex_match(text, std::regex("(" + stamped + "){3}"))) << text;
  EXPECT_NE(text.find("Z I tqkv-server: started\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Z E tqkv-server: stopped badly\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Z W tqkv-server: Lookup from peer"), std::string::npos) << text;
}

TEST(AuthTest, ParsesTokenFilesAndAuthenticates) {
  auto a = Authenticator::FromString("# comment\n\ntok1 alpha admin\n  tok2\tbeta  \n");
  ASSERT_TRUE(a.ok()) << a.status();
  auto id = (*a)->Authenticate("Bearer tok1");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->tenant, "alpha");
  EXPECT_TRUE(id->admin);
  id = (*a)->Authenticate("Bearer tok2");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->tenant, "beta");
  EXPECT_FALSE(id->admin);
  EXPECT_EQ((*a)->Authenticate("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*a)->Authenticate("tok1").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*a)->Authenticate("Bearer tok3").status().code(), absl::StatusCode::kUnauthenticated);
  // A prefix or an extension of a token is not the token.
  EXPECT_EQ((*a)->Authenticate("Bearer tok").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*a)->Authenticate("Bearer tok11").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(Authenticator::FromString("tok1 alpha\ntok1 beta\n").ok());
  EXPECT_FALSE(Authenticator::FromString("tok1 alpha root\n").ok());
  EXPECT_FALSE(Authenticator::FromString("lonely\n").ok());
  EXPECT_FALSE(Authenticator::FromString("x509-dns:a alpha\n").ok());
  EXPECT_FALSE(Authenticator::FromString("x509-cn: alpha\n").ok());
  Authenticator off;
  auto anyone = off.Authenticate("");
  ASSERT_TRUE(anyone.ok());
  EXPECT_EQ(anyone->tenant, "default");
  EXPECT_TRUE(anyone->admin);
  EXPECT_EQ((*a)->Reload().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AuthTest, CertificatesMapToTenantsAndMustAgreeWithTheToken) {
  auto a = Authenticator::FromString(
      "x509-uri:spiffe://tqkv/a alpha\nx509-cn:ops-box ops admin\ntok-a alpha\ntok-b beta\n");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->uses_certificates());
  const PeerCertificate by_uri{{"https://other", "spiffe://tqkv/a"}, "ops-box"};
  auto id = (*a)->Authenticate("", &by_uri);  // the URI wins over the CN
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->tenant, "alpha");
  EXPECT_FALSE(id->admin);
  const PeerCertificate by_cn{{}, "ops-box"};
  id = (*a)->Authenticate("", &by_cn);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->tenant, "ops");
  EXPECT_TRUE(id->admin);
  const PeerCertificate unmapped{{"spiffe://tqkv/z"}, "nobody"};
  EXPECT_EQ((*a)->Authenticate("", &unmapped).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*a)->Authenticate("Bearer tok-a", &by_uri).ok());
  EXPECT_EQ((*a)->Authenticate("Bearer tok-b", &by_uri).status().code(),
            absl::StatusCode::kUnauthenticated);
  // A certificate is no help when the token is bad.
  EXPECT_EQ((*a)->Authenticate("Bearer nope", &by_uri).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AuthTest, MetricsCredentialsScrapeOnly) {
  auto a = Authenticator::FromString(
      "ops-tok ops admin\nalice-tok alice\nscrape-tok prom metrics\nx509-cn:prom-box prom metrics\n");
  ASSERT_TRUE(a.ok()) << a.status();
  auto id = (*a)->AuthorizeScrape("Bearer scrape-tok");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(id->scrape_only);
  EXPECT_FALSE(id->admin);
  EXPECT_TRUE((*a)->AuthorizeScrape("Bearer ops-tok").ok());
  const PeerCertificate box{{}, "prom-box"};
  EXPECT_TRUE((*a)->AuthorizeScrape("", &box).ok());
  EXPECT_EQ((*a)->AuthorizeScrape("Bearer alice-tok").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*a)->AuthorizeScrape("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*a)->AuthorizeScrape("Bearer nope").status().code(), absl::StatusCode::kUnauthenticated);
  // A metrics credential opens no tenant.
  EXPECT_EQ((*a)->Authenticate("Bearer scrape-tok").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*a)->Authenticate("", &box).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(Authenticator::FromString("tok prom metrics admin\n").ok());
  Authenticator off;
  EXPECT_TRUE(off.AuthorizeScrape("").ok());
}

// Writes `contents` to a fresh file with `mode`; returns its path.
std::string WriteFile(const std::string& contents, mode_t mode) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string path = std::string(base ? base : "/tmp") + "/authXXXXXX";
  const int fd = mkstemp(path.data());
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, contents.data(), contents.size()), static_cast<ssize_t>(contents.size()));
  fchmod(fd, mode);
  close(fd);
  return path;
}

TEST(AuthTest, FileReadableByOthersIsRefusedNamingItsMode) {
  const std::string path = WriteFile("tok alpha\n", 0644);
  auto a = Authenticator::FromFile(path);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
  EXPECT_NE(a.status().message().find(path), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("0644"), std::string::npos) << a.status();
  chmod(path.c_str(), 0640);
  EXPECT_EQ(Authenticator::FromFile(path).status().code(), absl::StatusCode::kFailedPrecondition);
  chmod(path.c_str(), 0600);
  EXPECT_TRUE(Authenticator::FromFile(path).ok());
  EXPECT_EQ(Authenticator::FromFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(AuthTest, ReloadSwapsTokensAndABadFileKeepsTheOldOnes) {
  const std::string path = WriteFile("old alpha\n", 0600);
  auto a = Authenticator::FromFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  std::ofstream(path, std::ios::trunc) << "new alpha\nnew2 beta admin\n";
  auto r = (*a)->Reload();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "2 tokens, 0 certificate identities");
  EXPECT_EQ((*a)->Authenticate("Bearer old").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*a)->Authenticate("Bearer new").ok());
  std::ofstream(path, std::ios::trunc) << "broken line with four\n";
  EXPECT_EQ((*a)->Reload().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*a)->Authenticate("Bearer new").ok());
  chmod(path.c_str(), 0604);
  EXPECT_EQ((*a)->Reload().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*a)->Authenticate("Bearer new2").ok());
}

TEST(ListenPolicyTest, LoopbackHosts) {
  for (const char* h : {"127.0.0.1", "127.8.9.10", "localhost", "::1", "[::1]"})
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  for (const char* h : {"0.0.0.0", "[::]", "::", "10.0.0.1", "128.0.0.1", "example.com", "", "[::2]"})
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
}

TEST(ListenPolicyTest, UnprotectedListenersBeyondLoopbackNeedTheFlag) {
  std::string warning = "stale";
  EXPECT_TRUE(CheckListeners({{"--listen", "127.0.0.1:1", false}, {"--data_listen", "0.0.0.0:2", true}},
                             false, &warning)
                  .ok());
  EXPECT_EQ(warning, "");
  const std::vector<ListenerExposure> open = {{"--listen", "0.0.0.0:1", false},
                                              {"--metrics_listen", "[::]:3", false}};
  absl::Status s = CheckListeners(open, false, &warning);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--listen=0.0.0.0:1, --metrics_listen=[::]:3"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--insecure_listen_any"), std::string::npos) << s;
  ASSERT_TRUE(CheckListeners(open, true, &warning).ok());
  EXPECT_NE(warning.find("WARNING"), std::string::npos);
  EXPECT_NE(warning.find("--listen=0.0.0.0:1"), std::string::npos);
  EXPECT_EQ(CheckListeners({{"--listen", "nonsense", true}}, false, &warning).code(),
            absl::StatusCode::kInvalidArgument);
}

class FakeBackend : public CpuBackend {
 public:
  FakeBackend() : CpuBackend(Options{0}) {}
  std::string name() const override { return "cuda"; }
};

TEST(BackendSelectTest, AutoFallsBackAndCudaFailsClearly) {
  auto cpu = SelectBackend("cpu", 0, nullptr);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->backend->name(), "cpu");
  auto auto_none = SelectBackend("auto", 0, nullptr);
  ASSERT_TRUE(auto_none.ok());
  EXPECT_EQ(auto_none->backend->name(), "cpu");
  EXPECT_NE(auto_none->note, "");
  EXPECT_EQ(SelectBackend("cuda", 0, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  CudaBackendFactory no_gpu = [] {
    return absl::StatusOr<std::unique_ptr<ComputeBackend>>(absl::UnavailableError("no GPU"));
  };
  EXPECT_EQ(SelectBackend("cuda", 0, no_gpu).status().code(), absl::StatusCode::kUnavailable);
  auto fallback = SelectBackend("auto", 0, no_gpu);
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->backend->name(), "cpu");
  EXPECT_NE(fallback->note.find("no GPU"), std::string::npos);
  CudaBackendFactory gpu = [] {
    return absl::StatusOr<std::unique_ptr<ComputeBackend>>(std::make_unique<FakeBackend>());
  };
  EXPECT_EQ(SelectBackend("auto", 0, gpu)->backend->name(), "cuda");
  EXPECT_EQ(SelectBackend("cuda", 0, gpu)->backend->name(), "cuda");
  EXPECT_EQ(SelectBackend("tpu", 0, gpu).status().code(), absl::StatusCode::kInvalidArgument);
}

v1::RegisterModelRequest Small() {
  v1::RegisterModelRequest r;
  r.set_model_name("m");
  auto* l = r.mutable_layout();
  l->set_num_layers(3);
  l->set_num_kv_heads(1);
  l->set_num_q_heads(1);
  l->set_head_dim(16);
  l->set_block_size(4);
  return r;
}

TEST(StagingAreaTest, CompletesBlocksKeepsStateOnFailureAndExpires) {
  auto model = std::move(BuildModel("t", Small())).value();
  const ModelCodec& c = *model->codec;
  StagingArea area(StagingOptions{absl::Seconds(10), 1 << 20});
  const absl::Time t0 = absl::UnixEpoch();
  auto part = [&](const std::string& hash, int first, int last, char fill) {
    return StagingArea::Part{{"t", model->model_id, hash}, "", first, last,
                             std::string(c.layer_range_bytes(first, last), fill)};
  };
  uint32_t staged = 0;
  int commits = 0;
  auto never = [&](std::vector<StagingArea::Completed>&) {
    ++commits;
    return absl::OkStatus();
  };
  ASSERT_TRUE(area.Apply(*model, {part("a", 0, 1, 'x'), part("b", 0, 2, 'y')}, t0, never, &staged).ok());
  EXPECT_EQ(staged, 2u);
  EXPECT_EQ(commits, 0);
  // A failing commit leaves the staged parts as they were.
  auto fail = [](std::vector<StagingArea::Completed>& done) {
    EXPECT_EQ(done.size(), 1u);
    return absl::InternalError("disk");
  };
  EXPECT_FALSE(area.Apply(*model, {part("a", 1, 3, 'z')}, t0, fail, &staged).ok());
  EXPECT_EQ(area.size(), 2u);
  std::string payload;
  auto keep = [&](std::vector<StagingArea::Completed>& done) {
    payload.resize(done[0].bytes);
    done[0].CopyTo(reinterpret_cast<uint8_t*>(payload.data()));
    return absl::OkStatus();
  };
  ASSERT_TRUE(area.Apply(*model, {part("a", 1, 3, 'z')}, t0, keep, &staged).ok());
  EXPECT_EQ(staged, 0u);
  EXPECT_EQ(area.size(), 1u);
  EXPECT_EQ(payload, std::string(c.layer_range_bytes(0, 1), 'x') +
                         std::string(c.layer_range_bytes(1, 3), 'z'));
  EXPECT_EQ(area.Expire(t0 + absl::Seconds(5)), 0u);
  EXPECT_EQ(area.Expire(t0 + absl::Seconds(11)), 1u);
  EXPECT_EQ(area.bytes(), 0u);
  StagingArea tiny(StagingOptions{absl::Seconds(10), c.block_bytes()});
  EXPECT_EQ(tiny.Apply(*model, {part("a", 0, 1, 'x'), part("b", 0, 1, 'x')}, t0, never, &staged)
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(tiny.size(), 0u);
  EXPECT_EQ(tiny.bytes(), 0u);
}

// Staged bytes are charged per tenant before they are allocated: entries'
// whole-block buffers and the parts open streams hold. A tenant at its cap
// is refused (naming the flag) while another tenant still stages; what a
// refused or failed call charged is given back.
TEST(StagingAreaTest, StagedBytesAreChargedPerTenantBeforeAllocation) {
  auto model = std::move(BuildModel("t", Small())).value();
  const ModelCodec& c = *model->codec;
  const uint64_t block = c.block_bytes();
  StagingArea area(StagingOptions{.ttl = absl::Seconds(10), .max_bytes = 5 * block, .max_bytes_per_tenant = 3 * block});
  const absl::Time t0 = absl::UnixEpoch();
  auto part = [&](const std::string& tenant, const std::string& hash) {
    return StagingArea::Part{{tenant, model->model_id, hash}, "", 0, 1, std::string(c.layer_range_bytes(0, 1), 'x')};
  };
  auto never = [](std::vector<StagingArea::Completed>&) { return absl::OkStatus(); };
  uint32_t staged = 0;
  ASSERT_TRUE(area.Apply(*model, {part("a", "1"), part("a", "2"), part("a", "3")}, t0, never, &staged).ok());
  EXPECT_EQ(area.bytes(), 3 * block);
  absl::Status full = area.Apply(*model, {part("a", "4")}, t0, never, &staged);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("--max_staged_bytes_per_tenant"), std::string::npos) << full;
  EXPECT_EQ(area.bytes(), 3 * block) << "a refused call keeps nothing";
  EXPECT_EQ(area.size(), 3u);
  // Another tenant's parts held by an open stream count too.
  TenantBudget::Reservation held;
  ASSERT_TRUE(area.ChargeParts("b", block, &held).ok());
  EXPECT_EQ(area.bytes(), 4 * block);
  ASSERT_TRUE(area.Apply(*model, {part("b", "1")}, t0, never, &staged).ok());
  absl::Status total = area.Apply(*model, {part("b", "2")}, t0, never, &staged);
  EXPECT_EQ(total.code(), absl::StatusCode::kResourceExhausted) << total;
  EXPECT_NE(total.message().find("--max_staged_bytes)"), std::string::npos) << total;
  held.Reset();
  ASSERT_TRUE(area.Apply(*model, {part("b", "2")}, t0, never, &staged).ok()) << "the stream's parts went back";
  // A failed commit stages nothing new.
  auto fail = [](std::vector<StagingArea::Completed>&) { return absl::InternalError("disk"); };
  StagingArea::Part whole = part("a", "1");
  whole.first = 1;
  whole.last = c.shape().num_layers;
  whole.bytes.assign(c.layer_range_bytes(1, c.shape().num_layers), 'y');
  EXPECT_FALSE(area.Apply(*model, {whole}, t0, fail, &staged).ok());
  EXPECT_EQ(area.bytes(), 5 * block);
  EXPECT_EQ(area.size(), 5u);
  ASSERT_TRUE(area.Apply(*model, {whole}, t0, never, &staged).ok()) << "completing frees the entry";
  EXPECT_EQ(area.bytes(), 4 * block);
  EXPECT_EQ(area.Expire(t0 + absl::Seconds(11)), 4u);
  EXPECT_EQ(area.bytes(), 0u);
}

TEST(TenantBudgetTest, ChargesAreCappedPerTenantAndInAllAndGivenBack) {
  TenantBudget b({.total = 10, .per_tenant = 6, .what = "bytes", .total_flag = "--all", .per_tenant_flag = "--one"});
  TenantBudget::Reservation a1, a2, c;
  ASSERT_TRUE(b.Charge("a", 4, &a1).ok());
  ASSERT_TRUE(b.Charge("a", 2, &a1).ok());
  EXPECT_EQ(a1.amount(), 6u);
  absl::Status one = b.Charge("a", 1, &a2);
  EXPECT_EQ(one.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(one.message().find("(--one)"), std::string::npos) << one;
  EXPECT_EQ(a2.amount(), 0u);
  ASSERT_TRUE(b.Charge("c", 4, &c).ok());
  absl::Status all = b.Charge("c", 1, &c);
  EXPECT_NE(all.message().find("(--all)"), std::string::npos) << all;
  EXPECT_EQ(b.used(), 10u);
  a1.Release(3);
  EXPECT_EQ(b.used("a"), 3u);
  TenantBudget::Reservation moved = std::move(a1);
  EXPECT_EQ(a1.amount(), 0u);
  { TenantBudget::Reservation gone = std::move(c); }
  EXPECT_EQ(b.used("c"), 0u);
  EXPECT_EQ(b.used(), 3u);
  moved.Reset();
  EXPECT_EQ(b.used(), 0u);
}

TEST(SequenceManagerTest, IdleSequencesExpire) {
  std::shared_ptr<const RegisteredModel> model = std::move(BuildModel("t", Small())).value();
  CpuBackend backend(CpuBackend::Options{0});
  storage::FakeClock clock;
  SequenceManager seqs(SequenceOptions{}, &backend, &clock);
  v1::CreateSequenceRequest req;
  req.set_ttl_ms(1000);
  auto s = seqs.Create("t", model, {}, req);
  ASSERT_TRUE(s.ok()) << s.status();
  v1::AppendRequest ap;
  ap.set_sequence_id(s->sequence_id());
  ap.mutable_k()->set_dtype(v1::DTYPE_FP32);
  for (int d : {5, 1, 16}) ap.mutable_k()->add_shape(d);
  ap.mutable_k()->mutable_data()->assign(5 * 16 * 4, '\0');
  *ap.mutable_v() = ap.k();
  clock.Advance(absl::Milliseconds(900));
  auto r = seqs.Append("t", ap);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_tokens(), 5u);
  EXPECT_EQ(seqs.Append("u", ap).status().code(), absl::StatusCode::kNotFound) << "other tenant";
  clock.Advance(absl::Milliseconds(900));  // used 900 ms ago: still alive
  EXPECT_EQ(seqs.ExpireIdle(), 0u);
  clock.Advance(absl::Milliseconds(200));
  EXPECT_EQ(seqs.ExpireIdle(), 1u);
  EXPECT_EQ(seqs.Append("t", ap).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(seqs.size(), 0u);
}

// The server-wide and per-tenant caps on live sequences: a tenant at its
// cap is refused while others still create; dropping, expiry and use after
// expiry give the tenant's places back.
TEST(SequenceManagerTest, LiveSequencesAreCappedPerTenantAndInAll) {
  std::shared_ptr<const RegisteredModel> model = std::move(BuildModel("t", Small())).value();
  CpuBackend backend(CpuBackend::Options{0});
  storage::FakeClock clock;
  SequenceManager seqs(SequenceOptions{.max_sequences = 5, .max_sequences_per_tenant = 3}, &backend, &clock);
  v1::CreateSequenceRequest req;
  req.set_ttl_ms(1000);
  std::vector<std::string> a;
  for (int i = 0; i < 3; ++i) a.push_back(seqs.Create("a", model, {}, req).value().sequence_id());
  absl::Status full = seqs.Create("a", model, {}, req).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("--max_sequences_per_tenant"), std::string::npos) << full;
  ASSERT_TRUE(seqs.Create("b", model, {}, req).ok());
  ASSERT_TRUE(seqs.Create("b", model, {}, req).ok());
  EXPECT_EQ(seqs.Create("c", model, {}, req).status().code(), absl::StatusCode::kResourceExhausted) << "5 in all";
  ASSERT_TRUE(seqs.Drop("a", a[0]).ok());
  ASSERT_TRUE(seqs.Create("a", model, {}, req).ok()) << "a dropped one";
  clock.Advance(absl::Milliseconds(1100));
  EXPECT_EQ(seqs.ExpireIdle(), 5u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(seqs.Create("a", model, {}, req).ok()) << i;
  EXPECT_EQ(seqs.size(), 3u);
}

// A [d0, d1, d2] fp32 tensor of `value`.
void FillF32(v1::Tensor* t, std::initializer_list<int64_t> shape, float value) {
  t->set_dtype(v1::DTYPE_FP32);
  t->clear_shape();
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  std::vector<float> x(static_cast<size_t>(n), value);
  t->set_data(x.data(), x.size() * sizeof(float));
}

// Sequences' bytes (tail rooms, blocks their appends fill) are charged per
// tenant before they are allocated: a Create or an append past the cap is
// RESOURCE_EXHAUSTED and changes nothing; dropping gives the bytes back.
TEST(SequenceManagerTest, SequenceBytesAreCappedAndGivenBack) {
  std::shared_ptr<const RegisteredModel> model = std::move(BuildModel("t", Small())).value();
  const ModelShape& s = model->shape();
  const uint64_t tails = uint64_t{2} * s.num_layers * s.block_size * s.num_kv_heads * s.head_dim * sizeof(float);
  const uint64_t block = model->codec->block_bytes();
  ASSERT_LT(block, tails);
  CpuBackend backend(CpuBackend::Options{0});
  storage::FakeClock clock;
  SequenceManager seqs(
      SequenceOptions{.max_bytes = 2 * tails + block + tails / 2, .max_bytes_per_tenant = tails + block}, &backend,
      &clock);
  v1::CreateSequenceRequest req;
  const std::string a = seqs.Create("a", model, {}, req).value().sequence_id();
  EXPECT_EQ(seqs.OwnedBytes("a"), tails);
  // A block's worth of tokens at layer 0 fills one owned block: charged.
  v1::AppendRequest ap;
  ap.set_sequence_id(a);
  ap.set_layer(0);
  FillF32(ap.mutable_k(), {s.block_size, s.num_kv_heads, s.head_dim}, 1);
  FillF32(ap.mutable_v(), {s.block_size, s.num_kv_heads, s.head_dim}, 2);
  ASSERT_TRUE(seqs.Append("a", ap).ok());
  EXPECT_EQ(seqs.OwnedBytes("a"), tails + block);
  ap.set_layer(1);
  ASSERT_TRUE(seqs.Append("a", ap).ok()) << "layer 1 fills the same block";
  // The next block would pass a's cap: refused, the sequence unchanged.
  ap.set_layer(0);
  absl::Status full = seqs.Append("a", ap).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("--max_sequence_bytes_per_tenant"), std::string::npos) << full;
  EXPECT_EQ(seqs.OwnedBytes("a"), tails + block);
  v1::AppendRequest one = ap;
  FillF32(one.mutable_k(), {1, s.num_kv_heads, s.head_dim}, 3);
  FillF32(one.mutable_v(), {1, s.num_kv_heads, s.head_dim}, 4);
  EXPECT_EQ(seqs.Append("a", one).value().num_tokens(), s.block_size + 1) << "the refused rows were not kept";
  EXPECT_EQ(seqs.Create("a", model, {}, req).status().code(), absl::StatusCode::kResourceExhausted) << "tails";
  ASSERT_TRUE(seqs.Create("b", model, {}, req).ok());
  absl::Status all = seqs.Create("c", model, {}, req).status();
  EXPECT_EQ(all.code(), absl::StatusCode::kResourceExhausted) << all;
  EXPECT_NE(all.message().find("--max_sequence_bytes)"), std::string::npos) << all;
  EXPECT_EQ(seqs.size(), 2u);
  ASSERT_TRUE(seqs.Drop("a", a).ok());
  EXPECT_EQ(seqs.OwnedBytes("a"), 0u);
  EXPECT_TRUE(seqs.Create("c", model, {}, req).ok());
}

}  // namespace
}  // namespace tqkv::service
