// Well-behaved clients beside abusive ones, against a running tqkv-server:
// do the limits keep the well-behaved tenant's calls working and the
// server's memory within its budgets?
//
// Well-behaved (tenant of --token): --clients threads, each with its own
// gRPC and data-plane connection, loop over: put 4 fresh dense blocks over
// the data plane, Lookup them, read them back packed over the data plane.
// Every non-OK status is counted.
//
// Abusive (tenant of --abuser_token), all at once for --seconds:
//   flood      opens data-plane connections until refused (at most --flood)
//              and holds them without a byte sent;
//   slow       --slow connections that announce an 8 MiB request frame and
//              send one byte of it every 100 ms;
//   nonreader  one data-plane connection that asks for its 16 stored blocks
//              over and over and never reads a reply;
//   streams    --streams gRPC PutBlocks streams that send a header and 8
//              dense blocks each, then neither finish nor cancel.
//
// The server's resident set (VmRSS of --pid) is sampled every 100 ms: idle,
// under the well-behaved load alone (the baseline), and under abuse; the
// report compares the peak with the budgets the server was given
// (--budget_bytes: the sum of its host budget and data-plane frame budget).
//
// Usage: abuse_bench --server HOST:PORT --data HOST:PORT --pid PID
//          --token T --abuser_token M --budget_bytes B
//          [--seconds 60] [--clients 4] [--flood 8192] [--slow 256] [--streams 32]
// (bench/abuse_bench.sh starts a server with two tenants and runs it.)
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cli/args.h"
#include "client/cpp/client.h"
#include "client/cpp/data_plane_client.h"
#include "client/cpp/synthetic.h"
#include "grpcpp/grpcpp.h"
#include "proto/tqkv/v1/tqkv.grpc.pb.h"

namespace tqkv {
namespace {

using Clock = std::chrono::steady_clock;

double RssBytes(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) * 1024;
  return 0;
}

// A TCP connection to HOST:PORT, or -1.
int Dial(const std::string& target) {
  const size_t colon = target.rfind(':');
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (colon == std::string::npos ||
      getaddrinfo(target.substr(0, colon).c_str(), target.substr(colon + 1).c_str(), &hints, &res) != 0)
    return -1;
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t w = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

// A data-plane frame (preface TQKVDP01 sent separately): u32 N, u64 P = 0, N bytes.
std::string Frame(const v1::DataPlaneRequest& req) {
  const std::string body = req.SerializeAsString();
  std::string f(12, '\0');
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::memcpy(f.data(), &n, 4);
  return f + body;
}

// The server has neither answered nor closed the connection: a read would
// block. (An abuser sends nothing the server answers with success, so a
// reply waiting to be read is a refusal.)
bool StillOpen(int fd) {
  char c;
  const ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

struct Config {
  std::string server, data, token, abuser_token;
  int pid = 0, seconds = 60, clients = 4, flood = 8192, slow = 256, streams = 32;
  double budget = 0;
};

v1::RegisterModelRequest Model() { return client::ModelRegistration("abuse-bench", 8, 8, 32, 128, 16, "k4v4"); }

struct Tally {
  std::atomic<uint64_t> calls{0}, errors{0};
  absl::Mutex mu;
  std::string first_error ABSL_GUARDED_BY(mu);
  void Error(const absl::Status& s) {
    errors++;
    absl::MutexLock l(&mu);
    if (first_error.empty()) first_error = s.ToString();
  }
};

// One well-behaved client's loop until `stop`.
void WellBehaved(const Config& cfg, int id, const std::atomic<bool>& stop, Tally* t) {
  auto c = client::Client::Connect({.target = cfg.server, .token = cfg.token});
  auto dp = client::DataPlaneClient::Connect({.target = cfg.data, .token = cfg.token});
  if (!c.ok() || !dp.ok()) return t->Error(c.ok() ? dp.status() : c.status());
  const v1::RegisterModelRequest reg = Model();
  auto m = (*c)->RegisterModel(reg);
  if (!m.ok()) return t->Error(m.status());
  v1::PutHeader h;
  h.mutable_model()->set_model_id(m->model_id());
  h.mutable_model()->set_layout_fingerprint(m->layout_fingerprint());
  client::DataPlaneBlocks out;
  for (uint64_t round = 0; !stop.load(); ++round) {
    const std::vector<std::string> chain = client::HashChain(1000003 * (id + 1) + round, 4);
    std::vector<v1::PutBlock> blocks;
    for (size_t i = 0; i < chain.size(); ++i)
      blocks.push_back(client::DenseBlock(reg.layout(), chain[i], i ? chain[i - 1] : "", round * 4 + i));
    t->calls++;
    if (auto r = (*dp)->PutBlocks(h, std::move(blocks)); !r.ok()) t->Error(r.status());
    v1::LookupRequest lr;
    *lr.mutable_model() = h.model();
    for (const auto& x : chain) lr.add_block_hashes(x);
    t->calls++;
    auto l = (*c)->Lookup(lr);
    if (!l.ok()) t->Error(l.status());
    v1::GetBlocksRequest g;
    *g.mutable_model() = h.model();
    for (const auto& x : chain) g.add_block_hashes(x);
    t->calls++;
    if (absl::Status s = (*dp)->GetBlocks(g, &out); !s.ok()) t->Error(s);
  }
}

int Run(int argc, char** argv) {
  auto args = cli::Args::Parse(argc, argv, 1,
                               {"server", "data", "pid", "token", "abuser_token", "budget_bytes", "seconds",
                                "clients", "flood", "slow", "streams"});
  if (!args.ok()) {
    std::fprintf(stderr, "abuse_bench: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  Config cfg;
  cfg.server = args->Get("server", "");
  cfg.data = args->Get("data", "");
  cfg.token = args->Get("token", "");
  cfg.abuser_token = args->Get("abuser_token", "");
  cfg.pid = static_cast<int>(*args->GetInt("pid", 0));
  cfg.seconds = static_cast<int>(*args->GetInt("seconds", 60));
  cfg.clients = static_cast<int>(*args->GetInt("clients", 4));
  cfg.flood = static_cast<int>(*args->GetInt("flood", 8192));
  cfg.slow = static_cast<int>(*args->GetInt("slow", 256));
  cfg.streams = static_cast<int>(*args->GetInt("streams", 32));
  cfg.budget = static_cast<double>(*args->GetInt("budget_bytes", 0));
  if (cfg.server.empty() || cfg.data.empty() || cfg.pid <= 0 || cfg.abuser_token.empty()) {
    std::fprintf(stderr, "abuse_bench: --server, --data, --pid and --abuser_token are required\n");
    return 2;
  }

  // Memory: idle, then sampled every 100 ms for the rest of the run.
  const double idle = RssBytes(cfg.pid);
  std::atomic<bool> sampling{true};
  std::atomic<double> peak_baseline{0}, peak_abuse{0};
  std::atomic<bool> abusing{false};
  std::thread sampler([&] {
    while (sampling.load()) {
      const double r = RssBytes(cfg.pid);
      std::atomic<double>& p = abusing.load() ? peak_abuse : peak_baseline;
      if (r > p.load()) p.store(r);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  // The well-behaved load, 10 s alone, then with the abusers.
  std::atomic<bool> stop{false};
  Tally good_before, good_during;
  std::vector<std::thread> good;
  for (int i = 0; i < cfg.clients; ++i) good.emplace_back([&, i] { WellBehaved(cfg, i, stop, &good_before); });
  std::this_thread::sleep_for(std::chrono::seconds(10));
  stop = true;
  for (auto& t : good) t.join();
  good.clear();
  stop = false;
  abusing = true;
  for (int i = 0; i < cfg.clients; ++i) good.emplace_back([&, i] { WellBehaved(cfg, 100 + i, stop, &good_during); });

  const auto until = Clock::now() + std::chrono::seconds(cfg.seconds);
  std::vector<std::thread> bad;
  std::atomic<int> flood_open{0}, flood_refused{0}, slow_open{0}, slow_closed{0};
  std::atomic<uint64_t> nonreader_sent{0};
  std::atomic<bool> nonreader_closed{false};
  std::atomic<int> streams_open{0}, streams_failed{0};
  // flood
  bad.emplace_back([&] {
    std::vector<int> fds;
    while (static_cast<int>(fds.size()) < cfg.flood && Clock::now() < until) {
      const int fd = Dial(cfg.data);
      if (fd < 0) {
        flood_refused++;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      fds.push_back(fd);
    }
    std::this_thread::sleep_until(until);
    for (int fd : fds) flood_open += StillOpen(fd) ? 1 : 0;
    for (int fd : fds) close(fd);
  });
  // slow
  bad.emplace_back([&] {
    std::vector<int> fds;
    std::string prefix = "TQKVDP01" + std::string(12, '\0');
    const uint32_t n = 8u << 20;
    std::memcpy(prefix.data() + 8, &n, 4);
    for (int i = 0; i < cfg.slow; ++i) {
      const int fd = Dial(cfg.data);
      if (fd >= 0 && SendAll(fd, prefix)) fds.push_back(fd);
      else if (fd >= 0) close(fd);
    }
    while (Clock::now() < until) {
      for (int fd : fds) SendAll(fd, std::string(1, 'x'));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (int fd : fds) (StillOpen(fd) ? slow_open : slow_closed)++;
    for (int fd : fds) close(fd);
  });
  // nonreader: stores its own 16 blocks, then asks for them without reading.
  bad.emplace_back([&] {
    auto c = client::Client::Connect({.target = cfg.server, .token = cfg.abuser_token});
    if (!c.ok()) return;
    const v1::RegisterModelRequest reg = Model();
    auto m = (*c)->RegisterModel(reg);
    if (!m.ok()) return;
    v1::PutHeader h;
    h.mutable_model()->set_model_id(m->model_id());
    h.mutable_model()->set_layout_fingerprint(m->layout_fingerprint());
    const std::vector<std::string> chain = client::HashChain(77, 16);
    std::vector<v1::PutBlock> blocks;
    for (size_t i = 0; i < chain.size(); ++i)
      blocks.push_back(client::DenseBlock(reg.layout(), chain[i], i ? chain[i - 1] : "", 500 + i));
    if (!(*c)->PutBlocks(h, blocks).ok()) return;
    v1::DataPlaneRequest req;
    req.set_authorization("Bearer " + cfg.abuser_token);
    v1::GetBlocksRequest* g = req.mutable_get_blocks();
    *g->mutable_model() = h.model();
    for (const auto& x : chain) g->add_block_hashes(x);
    const std::string frame = Frame(req);
    const int fd = Dial(cfg.data);
    if (fd < 0 || !SendAll(fd, "TQKVDP01")) return;
    int rcv = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    while (Clock::now() < until) {
      if (SendAll(fd, frame)) {
        nonreader_sent++;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    nonreader_closed = !StillOpen(fd);
    close(fd);
  });
  // streams
  bad.emplace_back([&] {
    auto channel = grpc::CreateChannel(cfg.server, grpc::InsecureChannelCredentials());
    auto stub = v1::KvStore::NewStub(channel);
    const v1::RegisterModelRequest reg = Model();
    struct Open {
      grpc::ClientContext ctx;
      v1::PutBlocksResponse resp;
      std::unique_ptr<grpc::ClientWriter<v1::PutBlocksRequest>> w;
    };
    std::vector<std::unique_ptr<Open>> open;
    grpc::ClientContext rctx;
    rctx.AddMetadata("authorization", "Bearer " + cfg.abuser_token);
    v1::RegisterModelResponse mr;
    if (!stub->RegisterModel(&rctx, reg, &mr).ok()) return;
    for (int s = 0; s < cfg.streams && Clock::now() < until; ++s) {
      auto o = std::make_unique<Open>();
      o->ctx.AddMetadata("authorization", "Bearer " + cfg.abuser_token);
      o->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(cfg.seconds + 30));
      o->w = stub->PutBlocks(&o->ctx, &o->resp);
      v1::PutBlocksRequest first;
      first.mutable_header()->mutable_model()->set_model_id(mr.model_id());
      first.mutable_header()->mutable_model()->set_layout_fingerprint(mr.layout_fingerprint());
      bool ok = o->w->Write(first);
      const std::vector<std::string> chain = client::HashChain(9000 + s, 8);
      for (size_t i = 0; ok && i < chain.size(); ++i) {
        v1::PutBlocksRequest b;
        *b.mutable_block() = client::DenseBlock(reg.layout(), chain[i], i ? chain[i - 1] : "", 900 + i);
        ok = o->w->Write(b);
      }
      (ok ? streams_open : streams_failed)++;
      open.push_back(std::move(o));
    }
    std::this_thread::sleep_until(until);
    for (auto& o : open) o->ctx.TryCancel();
    for (auto& o : open) (void)o->w->Finish();
  });
  for (auto& t : bad) t.join();
  stop = true;
  for (auto& t : good) t.join();
  sampling = false;
  sampler.join();

  auto mb = [](double b) { return b / 1e6; };
  std::printf("well-behaved alone (10 s): %llu calls, %llu errors\n",
              (unsigned long long)good_before.calls.load(), (unsigned long long)good_before.errors.load());
  std::printf("well-behaved under abuse (%d s): %llu calls, %llu errors%s%s\n", cfg.seconds,
              (unsigned long long)good_during.calls.load(), (unsigned long long)good_during.errors.load(),
              good_during.errors.load() ? ", first: " : "",
              [&] {
                absl::MutexLock l(&good_during.mu);
                return good_during.first_error;
              }()
                  .c_str());
  std::printf("flood: %d connections held open at the end, %d refused at connect\n", flood_open.load(),
              flood_refused.load());
  std::printf("slow frames: %d held open, %d answered or closed by the server\n", slow_open.load(), slow_closed.load());
  std::printf("non-reader: %llu GetBlocks frames sent unread, connection %s\n",
              (unsigned long long)nonreader_sent.load(),
              nonreader_closed.load() ? "answered or closed by the server" : "open");
  std::printf("open PutBlocks streams: %d held open, %d refused\n", streams_open.load(), streams_failed.load());
  std::printf("server RSS: idle %.0f MB, peak with the well-behaved load %.0f MB, peak under abuse %.0f MB; "
              "budgets %.0f MB; peak under abuse - budgets = %.0f MB\n",
              mb(idle), mb(peak_baseline.load()), mb(peak_abuse.load()), mb(cfg.budget),
              mb(peak_abuse.load() - cfg.budget));
  return good_during.errors.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tqkv

int main(int argc, char** argv) { return tqkv::Run(argc, argv); }
