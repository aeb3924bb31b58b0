// `tqkv` subcommands that talk to a running tqkv-server through the C++
// client (client/cpp). Every command takes --server HOST:PORT (default
// localhost:50051), --token T and --timeout_ms MS, and for TLS on gRPC
// --tls_ca FILE (or `system` for the system's root CAs), --tls_cert FILE
// --tls_key FILE (mutual TLS) and --tls_server_name NAME; the same flags
// apply to the data plane (--data HOST:PORT of put, get and bench).
//
//   status                        health and backend; exit 1 unless SERVING
//   stats  [--model_id ID] [--bytes]  per-model blocks and bytes by tier
//   models [--bytes]              registered models: id, fingerprint, layout
//   unregister --model_id ID [--force]  (admin) removes a model
//   put    [model flags] --blocks N [--seed S] [--durable]
//                                 registers the model and puts N synthetic
//                                 dense fp16 blocks (a hash chain from S)
//   lookup [model flags] --blocks N [--seed S]
//   get    [model flags] --blocks N [--seed S] [--dense]
//   bench  [model flags] --blocks N [--threads T] [--rounds R] [--batch N]
//                                 put/get/lookup throughput
// Model flags: --model NAME (default "synthetic"), --layers 2, --kv_heads 2,
// --q_heads 4, --head_dim 64, --block_size 16, --format k4v4.
#include "client/cli/service_commands.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/byte_size.h"
#include "client/cli/args.h"
#include "client/cpp/client.h"
#include "client/cpp/data_plane_client.h"
#include "client/cpp/synthetic.h"

namespace tqkv::cli {
namespace {

// Flag names shared by the commands (constexpr arrays: no global objects).
constexpr const char* kCommon[] = {"server",   "token",    "timeout_ms",      "help",
                                   "tls_ca",   "tls_cert", "tls_key",         "tls_server_name"};
constexpr const char* kModel[] = {"model",      "layers", "kv_heads", "q_heads", "head_dim",
                                  "block_size", "format", "blocks",   "seed"};

std::set<std::string> Flags(bool model, std::initializer_list<const char*> extra = {}) {
  std::set<std::string> out(std::begin(kCommon), std::end(kCommon));
  if (model) out.insert(std::begin(kModel), std::end(kModel));
  for (const char* e : extra) out.insert(e);
  return out;
}

const char* TierName(int t) {
  switch (t) {
    case v1::TIER_GPU: return "gpu";
    case v1::TIER_HOST: return "host";
    case v1::TIER_DISK: return "disk";
    default: return "?";
  }
}

struct Ctx {
  std::unique_ptr<client::Client> client;
  std::ostream& out;
  std::ostream& err;
};

absl::StatusOr<std::unique_ptr<client::Client>> MakeClient(const Args& a) {
  client::ClientOptions o;
  o.target = a.Get("server", "localhost:50051");
  o.token = a.Get("token", "");
  auto ms = a.GetInt("timeout_ms", 30000);
  if (!ms.ok()) return ms.status();
  o.deadline = absl::Milliseconds(*ms);
  const std::string ca = a.Get("tls_ca", "");
  o.tls = ca == "system";
  if (!o.tls) o.tls_ca_file = ca;
  o.tls_cert_file = a.Get("tls_cert", "");
  o.tls_key_file = a.Get("tls_key", "");
  o.tls_server_name = a.Get("tls_server_name", "");
  return client::Client::Connect(o);
}

// The data-plane client of --data HOST:PORT (with --token, --timeout_ms and
// the TLS flags: the data plane speaks TLS whenever the server's gRPC does)
// or unix:PATH (the server's --data_socket: no TLS there).
absl::StatusOr<std::unique_ptr<client::DataPlaneClient>> MakeDataClient(const Args& a) {
  client::DataPlaneClientOptions o;
  o.target = a.Get("data", "");
  o.token = a.Get("token", "");
  auto ms = a.GetInt("timeout_ms", 30000);
  if (!ms.ok()) return ms.status();
  o.timeout = absl::Milliseconds(*ms);
  if (o.target.starts_with("unix:")) return client::DataPlaneClient::Connect(o);
  o.tls.ca_file = a.Get("tls_ca", "");  // "system" passes through: the system's roots
  o.tls.cert_file = a.Get("tls_cert", "");
  o.tls.key_file = a.Get("tls_key", "");
  o.tls.server_name = a.Get("tls_server_name", "");
  return client::DataPlaneClient::Connect(o);
}

absl::StatusOr<v1::RegisterModelRequest> ModelFromFlags(const Args& a) {
  v1::RegisterModelRequest r = client::SmallModel(a.Get("model", "synthetic"));
  v1::ModelLayout* l = r.mutable_layout();
  const std::pair<const char*, void (v1::ModelLayout::*)(uint32_t)> fields[] = {
      {"layers", &v1::ModelLayout::set_num_layers},   {"kv_heads", &v1::ModelLayout::set_num_kv_heads},
      {"q_heads", &v1::ModelLayout::set_num_q_heads}, {"head_dim", &v1::ModelLayout::set_head_dim},
      {"block_size", &v1::ModelLayout::set_block_size}};
  for (const auto& [name, setter] : fields) {
    if (!a.Has(name)) continue;
    auto v = a.GetInt(name, 0);
    if (!v.ok()) return v.status();
    if (*v <= 0 || *v > (1 << 20))
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be positive"));
    (l->*setter)(static_cast<uint32_t>(*v));
  }
  if (a.Has("format")) r.mutable_codec()->set_cache_dtype(a.Get("format", ""));
  return r;
}

// Registers the model named by the flags; returns its ref and layout.
absl::StatusOr<std::pair<v1::ModelRef, v1::ModelLayout>> Register(client::Client& c,
                                                                 const Args& a) {
  auto req = ModelFromFlags(a);
  if (!req.ok()) return req.status();
  auto r = c.RegisterModel(*req);
  if (!r.ok()) return r.status();
  v1::ModelRef ref;
  ref.set_model_id(r->model_id());
  ref.set_layout_fingerprint(r->layout_fingerprint());
  return std::make_pair(ref, req->layout());
}

absl::StatusOr<std::vector<std::string>> Chain(const Args& a) {
  auto n = a.GetInt("blocks", 16);
  auto seed = a.GetInt("seed", 1);
  if (!n.ok()) return n.status();
  if (!seed.ok()) return seed.status();
  if (*n < 0 || *n > 10'000'000) return absl::InvalidArgumentError("--blocks out of range");
  return client::HashChain(static_cast<uint64_t>(*seed), static_cast<size_t>(*n));
}

std::vector<v1::PutBlock> DenseBlocks(const v1::ModelLayout& layout,
                                      const std::vector<std::string>& chain, size_t begin,
                                      size_t end, uint64_t seed) {
  std::vector<v1::PutBlock> blocks;
  for (size_t i = begin; i < end; ++i)
    blocks.push_back(client::DenseBlock(layout, chain[i], i ? chain[i - 1] : "", seed * 1000003 + i));
  return blocks;
}

int Fail(std::ostream& err, const absl::Status& s) {
  err << "tqkv: " << s << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

int Status(const Args& a, Ctx& c) {
  auto h = c.client->Health();
  if (!h.ok()) return Fail(c.err, h.status());
  auto s = c.client->Stats(v1::StatsRequest());
  c.out << "server " << c.client->options().target << ": " << (*h ? "SERVING" : "NOT_SERVING");
  if (s.ok()) {
    c.out << ", backend " << s->backend() << ", tenant " << s->tenant() << ", data plane "
          << (s->data_plane_address().empty() ? "off" : s->data_plane_address());
  }
  c.out << "\n";
  return *h ? 0 : 1;
}

int Stats(const Args& a, Ctx& c) {
  auto id = a.GetInt("model_id", 0);
  if (!id.ok()) return Fail(c.err, id.status());
  v1::StatsRequest req;
  req.set_model_id(static_cast<uint64_t>(*id));
  auto s = c.client->Stats(req);
  if (!s.ok()) return Fail(c.err, s.status());
  const bool exact = a.Has("bytes");
  c.out << "tenant " << s->tenant() << ", backend " << s->backend() << "\n";
  for (const v1::ModelStats& m : s->models()) {
    c.out << "model " << m.model_name() << " (id " << m.model_id() << "), compression "
          << std::fixed << std::setprecision(2) << m.compression_ratio() << "x\n";
    for (const v1::TierBytes& t : m.tiers()) {
      if (exact) {
        c.out << "  " << TierName(t.tier()) << ": blocks=" << t.blocks() << " bytes=" << t.bytes()
              << " dense_equivalent=" << t.dense_equivalent_bytes() << " packed_k=" << t.packed_k_bytes()
              << " packed_v=" << t.packed_v_bytes() << " norms=" << t.norms_metadata_bytes()
              << " dense_window=" << t.dense_window_bytes() << "\n";
      } else {
        c.out << "  " << TierName(t.tier()) << ": " << t.blocks() << " blocks, " << HumanBytes(t.bytes())
              << " (fp16: " << HumanBytes(t.dense_equivalent_bytes()) << "); K " << HumanBytes(t.packed_k_bytes())
              << ", V " << HumanBytes(t.packed_v_bytes()) << ", norms " << HumanBytes(t.norms_metadata_bytes())
              << ", dense window " << HumanBytes(t.dense_window_bytes()) << "\n";
      }
    }
  }
  return 0;
}

int Models(const Args& a, Ctx& c) {
  auto r = c.client->ListModels(v1::ListModelsRequest());
  if (!r.ok()) return Fail(c.err, r.status());
  if (r->models().empty()) c.out << "no models registered\n";
  for (const v1::ModelInfo& m : r->models()) {
    const v1::ModelLayout& l = m.registration().layout();
    std::string formats;
    for (const v1::FormatDescriptor::Layer& layer : m.format().layers())
      if (formats.find(layer.cache_dtype()) == std::string::npos)
        absl::StrAppend(&formats, formats.empty() ? "" : ",", layer.cache_dtype());
    c.out << m.model_name() << "  id " << m.model_id() << "  fingerprint " << m.layout_fingerprint() << "\n"
          << "  " << l.num_layers() << " layers x " << l.num_kv_heads() << " kv heads (" << l.num_q_heads()
          << " q) x d " << l.head_dim() << ", block " << l.block_size() << ", " << formats << "\n"
          << "  " << m.blocks() << " blocks, " << (a.Has("bytes") ? std::to_string(m.bytes()) : HumanBytes(m.bytes()))
          << ", " << m.sequences() << " live sequences\n";
  }
  return 0;
}

int Unregister(const Args& a, Ctx& c) {
  auto id = a.GetInt("model_id", 0);
  if (!id.ok()) return Fail(c.err, id.status());
  if (*id <= 0) return Fail(c.err, absl::InvalidArgumentError("--model_id is required (see `tqkv models`)"));
  v1::UnregisterModelRequest req;
  req.set_model_id(static_cast<uint64_t>(*id));
  req.set_force(a.Has("force"));
  auto r = c.client->UnregisterModel(req);
  if (!r.ok()) return Fail(c.err, r.status());
  c.out << "unregistered model " << *id;
  if (req.force())
    c.out << ": removed " << r->blocks() << " blocks (" << HumanBytes(r->bytes()) << "), " << r->sequences()
          << " sequences, " << r->staged() << " staged blocks";
  c.out << "\n";
  return 0;
}

int Put(const Args& a, Ctx& c) {
  auto m = Register(*c.client, a);
  if (!m.ok()) return Fail(c.err, m.status());
  auto chain = Chain(a);
  if (!chain.ok()) return Fail(c.err, chain.status());
  v1::PutHeader h;
  *h.mutable_model() = m->first;
  h.set_durable(a.Has("durable"));
  std::unique_ptr<client::DataPlaneClient> dp;
  if (a.Has("data")) {  // dense blocks over the data plane, encoded in batches
    auto d = MakeDataClient(a);
    if (!d.ok()) return Fail(c.err, d.status());
    dp = std::move(*d);
  }
  v1::PutBlocksResponse total;
  const size_t batch = 256;
  const auto start = std::chrono::steady_clock::now();
  for (size_t s = 0; s < chain->size(); s += batch) {
    const size_t e = std::min(chain->size(), s + batch);
    std::vector<v1::PutBlock> blocks = DenseBlocks(m->second, *chain, s, e, a.GetInt("seed", 1).value());
    absl::StatusOr<v1::PutBlocksResponse> r =
        dp ? dp->PutBlocks(h, std::move(blocks)) : c.client->PutBlocks(h, blocks);
    if (!r.ok()) return Fail(c.err, r.status());
    if (chain->size() > batch) {  // progress on stderr, one line a stream of `batch` blocks
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      c.err << "put: " << e << "/" << chain->size() << " blocks (" << (100 * e / chain->size()) << "%), "
            << std::fixed << std::setprecision(1) << (total.dense_equivalent_bytes() + r->dense_equivalent_bytes()) / 1e6 / secs
            << " MB/s of fp16\n";
    }
    total.set_committed(total.committed() + r->committed());
    total.set_already_present(total.already_present() + r->already_present());
    total.set_packed_bytes(total.packed_bytes() + r->packed_bytes());
    total.set_dense_equivalent_bytes(total.dense_equivalent_bytes() + r->dense_equivalent_bytes());
  }
  c.out << "model_id " << m->first.model_id() << " fingerprint " << m->first.layout_fingerprint()
        << "\ncommitted " << total.committed() << " already_present " << total.already_present()
        << " packed_bytes " << total.packed_bytes() << " dense_equivalent_bytes "
        << total.dense_equivalent_bytes() << "\n";
  return 0;
}

int Lookup(const Args& a, Ctx& c) {
  auto m = Register(*c.client, a);
  if (!m.ok()) return Fail(c.err, m.status());
  auto chain = Chain(a);
  if (!chain.ok()) return Fail(c.err, chain.status());
  v1::LookupRequest req;
  *req.mutable_model() = m->first;
  for (const auto& h : *chain) req.add_block_hashes(h);
  auto r = c.client->Lookup(req);
  if (!r.ok()) return Fail(c.err, r.status());
  std::map<std::string, int> tiers;
  for (int t : r->tiers()) ++tiers[TierName(t)];
  c.out << "hits " << r->hits() << "/" << chain->size();
  for (const auto& [t, n] : tiers) c.out << " " << t << "=" << n;
  c.out << "\n";
  return 0;
}

int Get(const Args& a, Ctx& c) {
  auto m = Register(*c.client, a);
  if (!m.ok()) return Fail(c.err, m.status());
  auto chain = Chain(a);
  if (!chain.ok()) return Fail(c.err, chain.status());
  v1::GetBlocksRequest req;
  *req.mutable_model() = m->first;
  for (const auto& h : *chain) req.add_block_hashes(h);
  req.set_dense(a.Has("dense"));
  if (a.Has("data")) {  // over the data plane (dense: decoded by the server)
    auto dp = MakeDataClient(a);
    if (!dp.ok()) return Fail(c.err, dp.status());
    client::DataPlaneBlocks out;
    if (absl::Status s = (*dp)->GetBlocks(req, &out); !s.ok()) return Fail(c.err, s);
    c.out << "blocks " << out.size() << " bytes " << out.payload_bytes()
          << (req.dense() ? " (dense fp16, data plane)" : " (packed, data plane)") << "\n";
    return 0;
  }
  auto r = c.client->GetBlocks(req);
  if (!r.ok()) return Fail(c.err, r.status());
  uint64_t bytes = 0;
  for (const auto& b : *r) bytes += b.payload().size() + b.k().data().size() + b.v().data().size();
  c.out << "blocks " << r->size() << " bytes " << bytes << (req.dense() ? " (dense fp16)" : " (packed)")
        << "\n";
  return 0;
}

int Bench(const Args& a, Ctx& c) {
  auto m = Register(*c.client, a);
  if (!m.ok()) return Fail(c.err, m.status());
  auto chain = Chain(a);
  if (!chain.ok()) return Fail(c.err, chain.status());
  auto threads = a.GetInt("threads", 4);
  auto rounds = a.GetInt("rounds", 3);
  auto batch = a.GetInt("batch", 16);
  if (!threads.ok() || !rounds.ok() || !batch.ok() || *threads < 1 || *rounds < 1 || *batch < 1)
    return Fail(c.err, absl::InvalidArgumentError("--threads, --rounds and --batch must be >= 1"));
  const v1::ModelRef ref = m->first;
  // Same bytes as `tqkv put` for the same --seed: a hash never gets two
  // different blocks.
  const auto blocks = DenseBlocks(m->second, *chain, 0, chain->size(), a.GetInt("seed", 1).value());
  uint64_t dense_bytes = 0;
  for (const auto& b : blocks) dense_bytes += b.k().data().size() + b.v().data().size();
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // Each thread has its own connections and a disjoint slice of the chain,
  // which it walks `passes` times in calls of --batch blocks; every call's
  // latency is kept for the percentiles.
  struct Phase {
    double seconds = 0;
    std::vector<double> call_ms;
  };
  auto run = [&](int passes, const std::function<absl::Status(client::Client&, client::DataPlaneClient*, size_t,
                                                              size_t)>& op) -> std::optional<Phase> {
    std::atomic<bool> ok{true};
    std::mutex mu;
    Phase phase;
    std::vector<std::thread> ts;
    const size_t n = chain->size(), per = (n + *threads - 1) / *threads;
    const auto t0 = Clock::now();
    for (int t = 0; t < *threads; ++t) {
      ts.emplace_back([&, t] {
        std::vector<double> ms;
        auto cl = MakeClient(a);
        absl::Status s = cl.status();
        std::unique_ptr<client::DataPlaneClient> dp;
        if (s.ok() && a.Has("data")) {
          auto d = MakeDataClient(a);
          s = d.status();
          if (d.ok()) dp = std::move(*d);
        }
        const size_t b = std::min(n, t * per), e = std::min(n, b + per);
        for (int r = 0; s.ok() && r < passes; ++r)
          for (size_t i = b; s.ok() && i < e; i += static_cast<size_t>(*batch)) {
            const auto c0 = Clock::now();
            s = op(**cl, dp.get(), i, std::min(e, i + static_cast<size_t>(*batch)));
            ms.push_back(1e3 * seconds(c0));
          }
        std::lock_guard<std::mutex> l(mu);
        phase.call_ms.insert(phase.call_ms.end(), ms.begin(), ms.end());
        if (!s.ok() && ok.exchange(false)) c.err << "tqkv bench: " << s << "\n";
      });
    }
    for (auto& th : ts) th.join();
    phase.seconds = seconds(t0);
    if (!ok.load()) return std::nullopt;
    return phase;
  };
  auto pct = [](std::vector<double> v, double q) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  };
  auto latency = [&](const Phase& p) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(2) << "; per call of " << *batch << " p50 " << pct(p.call_ms, 0.5)
      << " ms, p99 " << pct(p.call_ms, 0.99) << " ms";
    return o.str();
  };
  // Puts: one pass (over the data plane with --data). Blocks the server
  // already held are counted apart and left out of the rates.
  std::atomic<uint64_t> committed{0}, present{0}, put_bytes{0};
  const uint64_t block_dense = blocks.empty() ? 0 : dense_bytes / blocks.size();
  auto put = run(1, [&](client::Client& cl, client::DataPlaneClient* dp, size_t b, size_t e) {
    v1::PutHeader h;
    *h.mutable_model() = ref;
    std::vector<v1::PutBlock> part(blocks.begin() + b, blocks.begin() + e);
    absl::StatusOr<v1::PutBlocksResponse> r = dp != nullptr ? dp->PutBlocks(h, std::move(part)) : cl.PutBlocks(h, part);
    if (r.ok()) {
      committed += r->committed();
      present += r->already_present();
      put_bytes += r->committed() * block_dense;
    }
    return r.status();
  });
  if (!put) return Fail(c.err, absl::InternalError("some bench puts failed"));
  // Reads and lookups: --rounds passes.
  std::atomic<uint64_t> got_bytes{0}, dp_bytes{0};
  auto get = run(*rounds, [&](client::Client& cl, client::DataPlaneClient*, size_t b, size_t e) {
    v1::GetBlocksRequest req;
    *req.mutable_model() = ref;
    for (size_t i = b; i < e; ++i) req.add_block_hashes((*chain)[i]);
    auto r = cl.GetBlocks(req);
    if (r.ok()) for (const auto& x : *r) got_bytes += x.payload().size();
    return r.status();
  });
  std::optional<Phase> dp_get;
  if (get && a.Has("data"))
    dp_get = run(*rounds, [&](client::Client&, client::DataPlaneClient* dp, size_t b, size_t e) {
      v1::GetBlocksRequest req;
      *req.mutable_model() = ref;
      for (size_t i = b; i < e; ++i) req.add_block_hashes((*chain)[i]);
      client::DataPlaneBlocks out;
      absl::Status s = dp->GetBlocks(req, &out);
      dp_bytes += out.payload_bytes();
      return s;
    });
  auto look = run(*rounds, [&](client::Client& cl, client::DataPlaneClient*, size_t b, size_t e) {
    v1::LookupRequest req;
    *req.mutable_model() = ref;
    for (size_t i = b; i < e; ++i) req.add_block_hashes((*chain)[i]);
    return cl.Lookup(req).status();
  });
  if (!get || !look || (a.Has("data") && !dp_get)) return Fail(c.err, absl::InternalError("some bench calls failed"));
  const double n = static_cast<double>(chain->size()) * *rounds;
  c.out << std::fixed << std::setprecision(1) << "put    " << committed.load() / put->seconds << " blocks/s, "
        << put_bytes.load() / put->seconds / 1e6 << " MB/s dense fp16 in" << (a.Has("data") ? " (data plane)" : "")
        << "; " << committed.load() << " committed, " << present.load() << " already present (not counted)"
        << latency(*put) << "\n"
        << "get    " << n / get->seconds << " blocks/s, " << got_bytes / get->seconds / 1e6 << " MB/s packed out"
        << latency(*get) << "\n";
  if (dp_get)
    c.out << "get    " << n / dp_get->seconds << " blocks/s, " << dp_bytes / dp_get->seconds / 1e6
          << " MB/s packed out (data plane)" << latency(*dp_get) << "\n";
  c.out << "lookup " << n / look->seconds << " hashes/s (" << *threads << " threads)" << latency(*look) << "\n";
  return 0;
}

// What each command does and its own flags, for `tqkv CMD --help`.
struct CommandHelp {
  const char* name;
  const char* synopsis;
  const char* summary;
  const char* flags;  // one "  --flag ARG   meaning (default)" line each
  bool model;
};
constexpr CommandHelp kHelp[] = {
    {"status", "", "Health, backend, tenant and data-plane address of the server; exit 1 unless SERVING.", "",
     false},
    {"stats", "[--model_id ID] [--bytes]",
     "This tenant's models: blocks and bytes per tier, compression against fp16.",
     "  --model_id ID     one model (default: every model)\n"
     "  --bytes           exact byte counts (default: KiB, MiB, GiB)\n",
     false},
    {"models", "[--bytes]",
     "This tenant's registered models: id, fingerprint, layout, formats, stored blocks and live sequences.",
     "  --bytes           exact byte counts (default: KiB, MiB, GiB)\n",
     false},
    {"unregister", "--model_id ID [--force]",
     "Unregisters a model (admin token): refused while it has stored blocks, live sequences or staged\n"
     "blocks, unless --force, which removes them first (pinned and on-disk blocks included).",
     "  --model_id ID     the model (`tqkv models` lists ids)\n"
     "  --force           remove its blocks, sequences and staged blocks first (default: refuse)\n",
     false},
    {"put", "[--durable] [--data HOST:PORT]",
     "Registers the model and puts --blocks synthetic dense fp16 blocks (a hash chain from --seed), with progress.",
     "  --durable         write them to disk (synced) before the put returns\n"
     "  --data HOST:PORT  over the data plane (blocks encoded in batches)\n",
     true},
    {"lookup", "", "Counts the chain's consecutive leading hits.", "", true},
    {"get", "[--dense] [--data HOST:PORT]", "Reads the chain's blocks back: packed, or dense fp16 decoded by the server.",
     "  --dense           dense fp16 (default: packed)\n"
     "  --data HOST:PORT  over the data plane (unix:PATH: its Unix-domain socket on this host)\n",
     true},
    {"bench", "[--threads T] [--rounds R] [--batch N] [--data HOST:PORT]",
     "Put (once; blocks already stored are not counted), then get and lookup (R passes) of the chain from T\n"
     "threads: throughput and each call's latency percentiles.",
     "  --threads T       client threads (default 4)\n"
     "  --rounds R        passes of gets and lookups over the chain (default 3)\n"
     "  --batch N         blocks a call (default 16)\n"
     "  --data HOST:PORT  puts over the data plane, and reads over it too\n",
     true},
};

void Usage(const std::string& cmd, std::ostream& out) {
  for (const CommandHelp& h : kHelp) {
    if (cmd != h.name) continue;
    out << "usage: tqkv " << h.name << (*h.synopsis ? " " : "") << h.synopsis
        << (h.model ? " [model flags]" : "") << " [connection flags]\n"
        << h.summary << "\n"
        << h.flags;
    if (h.model)
      out << "Model flags: --model NAME (default synthetic) --layers L (2) --kv_heads H (2) --q_heads Q (4)\n"
             "  --head_dim D (64) --block_size B (16) --format F (k4v4); the chain: --blocks N (16) --seed S (1)\n";
    out << "Connection flags: --server HOST:PORT (default localhost:50051) --token T --timeout_ms MS (30000)\n"
           "  --tls_ca FILE|system [--tls_cert FILE --tls_key FILE] [--tls_server_name NAME]\n"
           "  (the data plane takes the same token and TLS flags)\n";
  }
}

}  // namespace

int ServiceCommand(const std::string& cmd, int argc, char** argv, std::ostream& out,
                   std::ostream& err) {
  using Fn = int (*)(const Args&, Ctx&);
  const std::map<std::string, std::pair<Fn, std::set<std::string>>> commands = {
          {"status", {&Status, Flags(false)}},
          {"stats", {&Stats, Flags(false, {"model_id", "bytes"})}},
          {"models", {&Models, Flags(false, {"bytes"})}},
          {"unregister", {&Unregister, Flags(false, {"model_id", "force"})}},
          {"put", {&Put, Flags(true, {"durable", "data"})}},
          {"lookup", {&Lookup, Flags(true)}},
          {"get", {&Get, Flags(true, {"dense", "data"})}},
          {"bench", {&Bench, Flags(true, {"threads", "rounds", "batch", "data"})}},
      };
  auto it = commands.find(cmd);
  if (it == commands.end()) return -1;
  // Boolean flags may be given bare: rewrite `--durable` / `--dense` /
  // `--help` to `--x=1` so the value parser accepts them.
  std::vector<std::string> words(argv, argv + argc);
  for (std::string& w : words)
    if (w == "--durable" || w == "--dense" || w == "--help" || w == "--bytes" || w == "--force") w += "=1";
  std::vector<char*> ptrs;
  for (std::string& w : words) ptrs.push_back(w.data());
  auto args = Args::Parse(static_cast<int>(ptrs.size()), ptrs.data(), 2, it->second.second);
  if (!args.ok()) {
    err << "tqkv " << cmd << ": " << args.status().message() << "\n";
    Usage(cmd, err);
    return 2;
  }
  if (args->Has("help")) {
    Usage(cmd, out);
    return 0;
  }
  auto client = MakeClient(*args);
  if (!client.ok()) return Fail(err, client.status());
  Ctx ctx{std::move(*client), out, err};
  return it->second.first(*args, ctx);
}

}  // namespace tqkv::cli
