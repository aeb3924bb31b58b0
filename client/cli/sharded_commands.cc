#include "client/cli/sharded_commands.h"

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/args.h"
#include "client/cpp/sharded_client.h"
#include "client/cpp/synthetic.h"

namespace tqkv::cli {
namespace {

struct Ctx {
  const Args& args;
  client::ShardedClient& client;
  std::ostream& out;
  std::ostream& err;
};

int Fail(std::ostream& err, const absl::Status& s) {
  err << "tqkv: " << s << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

absl::StatusOr<std::unique_ptr<client::ShardedClient>> MakeClient(const Args& a) {
  client::ShardedClientOptions o;
  if (a.Has("servers")) {
    auto list = client::ParseShardList(a.Get("servers", ""));
    if (!list.ok()) return list.status();
    o.servers = *std::move(list);
  }
  o.dns = a.Get("dns", "");
  o.shard.token = a.Get("token", "");
  auto ms = a.GetInt("timeout_ms", 30000);
  if (!ms.ok()) return ms.status();
  o.shard.deadline = absl::Milliseconds(*ms);
  o.shard.max_attempts = 2;
  return client::ShardedClient::Connect(o);
}

// The model of the flags (client::SmallModel's shape unless overridden),
// registered on every shard.
absl::StatusOr<std::pair<v1::ModelRef, v1::ModelLayout>> Register(Ctx& c) {
  v1::RegisterModelRequest r = client::SmallModel(c.args.Get("model", "synthetic"));
  v1::ModelLayout* l = r.mutable_layout();
  const std::pair<const char*, void (v1::ModelLayout::*)(uint32_t)> fields[] = {
      {"layers", &v1::ModelLayout::set_num_layers},   {"kv_heads", &v1::ModelLayout::set_num_kv_heads},
      {"q_heads", &v1::ModelLayout::set_num_q_heads}, {"head_dim", &v1::ModelLayout::set_head_dim},
      {"block_size", &v1::ModelLayout::set_block_size}};
  for (const auto& [name, setter] : fields) {
    auto v = c.args.GetInt(name, 0);
    if (!v.ok()) return v.status();
    if (c.args.Has(name) && (*v <= 0 || *v > (1 << 20)))
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be positive"));
    if (c.args.Has(name)) (l->*setter)(static_cast<uint32_t>(*v));
  }
  if (c.args.Has("format")) r.mutable_codec()->set_cache_dtype(c.args.Get("format", ""));
  auto reg = c.client.RegisterModel(r);
  if (!reg.ok()) return reg.status();
  v1::ModelRef ref;
  ref.set_model_id(reg->model_id());
  ref.set_layout_fingerprint(reg->layout_fingerprint());
  return std::make_pair(ref, r.layout());
}

// --chains C hash chains of --blocks N, seeds --seed S .. S+C-1.
absl::StatusOr<std::vector<std::vector<std::string>>> Chains(const Args& a) {
  auto chains = a.GetInt("chains", 8), n = a.GetInt("blocks", 16), seed = a.GetInt("seed", 1);
  if (!chains.ok()) return chains.status();
  if (!n.ok()) return n.status();
  if (!seed.ok()) return seed.status();
  if (*chains < 1 || *n < 1 || *chains * *n > 10'000'000)
    return absl::InvalidArgumentError("--chains and --blocks must be >= 1 (at most 10M blocks)");
  std::vector<std::vector<std::string>> out;
  for (int64_t i = 0; i < *chains; ++i) out.push_back(client::HashChain(static_cast<uint64_t>(*seed + i), *n));
  return out;
}

int Status(Ctx& c) {
  bool all = true;
  for (const auto& h : c.client.Health()) {
    c.out << "shard " << h.shard << ": ";
    if (h.result.ok()) c.out << (*h.result ? "SERVING" : "NOT_SERVING") << "\n";
    else c.out << h.result.status() << "\n";
    all = all && h.result.ok() && *h.result;
  }
  return all ? 0 : 1;
}

int Stats(Ctx& c) {
  auto id = c.args.GetInt("model_id", 0);
  if (!id.ok()) return Fail(c.err, id.status());
  v1::StatsRequest req;
  req.set_model_id(static_cast<uint64_t>(*id));
  int rc = 0;
  for (const auto& s : c.client.Stats(req)) {
    if (!s.result.ok()) {
      c.out << "shard " << s.shard << ": " << s.result.status() << "\n";
      rc = 1;
      continue;
    }
    for (const v1::ModelStats& m : s.result->models())
      c.out << "shard " << s.shard << ": model " << m.model_name() << " blocks " << m.blocks() << " bytes "
            << m.bytes() << "\n";
  }
  return rc;
}

int Put(Ctx& c) {
  auto m = Register(c);
  if (!m.ok()) return Fail(c.err, m.status());
  auto chains = Chains(c.args);
  if (!chains.ok()) return Fail(c.err, chains.status());
  v1::PutHeader h;
  *h.mutable_model() = m->first;
  h.set_durable(c.args.Has("durable"));
  const uint64_t seed = static_cast<uint64_t>(c.args.GetInt("seed", 1).value());
  v1::PutBlocksResponse total;
  std::map<std::string, int> per_shard;
  for (size_t i = 0; i < chains->size(); ++i) {  // one call per chain: one shard each
    const std::vector<std::string>& chain = (*chains)[i];
    std::vector<v1::PutBlock> blocks;
    for (size_t j = 0; j < chain.size(); ++j)
      blocks.push_back(client::DenseBlock(m->second, chain[j], j ? chain[j - 1] : "", (seed + i) * 1000003 + j));
    auto r = c.client.PutBlocks(h, blocks);
    if (!r.ok()) return Fail(c.err, r.status());
    total.set_committed(total.committed() + r->committed());
    total.set_already_present(total.already_present() + r->already_present());
    ++per_shard[c.client.ShardFor(chain[0])];
  }
  c.out << "committed " << total.committed() << " already_present " << total.already_present() << "\n";
  for (const auto& [shard, n] : per_shard) c.out << "shard " << shard << ": " << n << " chains\n";
  return 0;
}

int Lookup(Ctx& c) {
  auto m = Register(c);
  if (!m.ok()) return Fail(c.err, m.status());
  auto chains = Chains(c.args);
  if (!chains.ok()) return Fail(c.err, chains.status());
  std::map<std::string, std::pair<uint64_t, uint64_t>> per_shard;  // hits, hashes
  uint64_t hits = 0, hashes = 0;
  for (const auto& chain : *chains) {
    v1::LookupRequest req;
    *req.mutable_model() = m->first;
    for (const auto& x : chain) req.add_block_hashes(x);
    auto r = c.client.Lookup(req);  // a down shard: 0 hits
    if (!r.ok()) return Fail(c.err, r.status());
    auto& s = per_shard[c.client.ShardFor(chain[0])];
    s.first += r->hits();
    s.second += chain.size();
    hits += r->hits();
    hashes += chain.size();
  }
  c.out << "hits " << hits << "/" << hashes << "\n";
  for (const auto& [shard, s] : per_shard) c.out << "shard " << shard << ": hits " << s.first << "/" << s.second << "\n";
  return 0;
}

int Get(Ctx& c) {
  auto m = Register(c);
  if (!m.ok()) return Fail(c.err, m.status());
  auto chains = Chains(c.args);
  if (!chains.ok()) return Fail(c.err, chains.status());
  v1::GetBlocksRequest req;
  *req.mutable_model() = m->first;
  req.set_dense(c.args.Has("dense"));
  std::vector<std::string> keys;
  for (const auto& chain : *chains)
    for (const auto& x : chain) {
      req.add_block_hashes(x);
      keys.push_back(chain[0]);
    }
  auto r = c.client.GetBlocks(req, keys);  // one call over every shard
  if (!r.ok()) return Fail(c.err, r.status());
  uint64_t bytes = 0;
  for (const auto& b : *r) bytes += b.payload().size() + b.k().data().size() + b.v().data().size();
  c.out << "blocks " << r->size() << " bytes " << bytes << (req.dense() ? " (dense fp16)" : " (packed)") << "\n";
  return 0;
}

}  // namespace

bool WantsShardedClient(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    const std::string w = argv[i];
    if (w == "--servers" || w == "--dns" || absl::StartsWith(w, "--servers=") || absl::StartsWith(w, "--dns="))
      return true;
  }
  return false;
}

int ShardedCommand(const std::string& cmd, int argc, char** argv, std::ostream& out, std::ostream& err) {
  using Fn = int (*)(Ctx&);
  const std::set<std::string> common = {"servers", "dns", "token", "timeout_ms", "help"};
  const std::set<std::string> model = {"model",      "layers", "kv_heads", "q_heads", "head_dim",
                                       "block_size", "format", "blocks",   "seed",    "chains"};
  const std::map<std::string, std::pair<Fn, std::set<std::string>>> commands = {
      {"status", {&Status, {}}},
      {"stats", {&Stats, {"model_id"}}},
      {"put", {&Put, {"durable"}}},
      {"lookup", {&Lookup, {}}},
      {"get", {&Get, {"dense"}}},
  };
  auto it = commands.find(cmd);
  if (it == commands.end()) {
    err << "tqkv " << cmd << ": not available with --servers/--dns (status, stats, put, lookup, get are)\n";
    return 2;
  }
  std::set<std::string> known = common;
  known.insert(it->second.second.begin(), it->second.second.end());
  if (cmd == "put" || cmd == "lookup" || cmd == "get") known.insert(model.begin(), model.end());
  std::vector<std::string> words(argv, argv + argc);
  for (std::string& w : words)  // bare boolean flags
    if (w == "--durable" || w == "--dense" || w == "--help") w += "=1";
  std::vector<char*> ptrs;
  for (std::string& w : words) ptrs.push_back(w.data());
  auto args = Args::Parse(static_cast<int>(ptrs.size()), ptrs.data(), 2, known);
  const char* usage =
      " (--servers HOST:PORT[=WEIGHT],... | --dns HOST:PORT) [--token T] [--timeout_ms MS]"
      " [--model NAME --layers L --kv_heads H --q_heads Q --head_dim D --block_size B --format F]"
      " [--chains C --blocks N --seed S] [--durable] [--dense] [--model_id ID]\n";
  if (!args.ok()) {
    err << "tqkv " << cmd << ": " << args.status().message() << "\nusage: tqkv " << cmd << usage;
    return 2;
  }
  if (args->Has("help")) {
    out << "usage: tqkv " << cmd << usage;
    return 0;
  }
  auto client = MakeClient(*args);
  if (!client.ok()) return Fail(err, client.status());
  Ctx ctx{*args, **client, out, err};
  return it->second.first(ctx);
}

}  // namespace tqkv::cli
