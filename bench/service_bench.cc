// Service benchmarks over loopback against a running tqkv-server (CPU
// backend) and, for the GET baseline, a running redis-server. Every number is
// printed with a ratio against a baseline measured in the same run:
//
//   get     GetBlocks of packed blocks vs Redis GET of the same payload bytes,
//           both by the same harness: --threads client threads, each with its
//           own connection, one key per request (and a batched variant:
//           GetBlocks of --batch hashes vs MGET of --batch keys). Measured
//           twice for tqkv: over gRPC and over the data plane (--tqkv_data,
//           DataPlaneClient: one blocking socket per thread, like hiredis).
//   put     PutBlocks of dense fp16 K/V encoded to k4v4 (TQ4) by the server,
//           and of the packed blocks, over gRPC and over the data plane:
//           GB/s of input vs a loopback TCP stream (a Unix-socket one for
//           --tqkv_data unix:PATH) and a memcpy.
//   lookup  Lookup of a 1,000-hash chain: p50/p99 latency vs Redis EXISTS of
//           1,000 keys (one command) and vs a 1-hash Lookup.
//
// Usage: service_bench --tqkv HOST:PORT --tqkv_data HOST:PORT --redis HOST:PORT
//        [--mode all|get|put|lookup]
//        [--threads 8] [--seconds 3] [--batch 8] [--put_gib 2] [--put_frame_mib 8,32] [--put_streams 2]
//        [--paths "packed, data plane;get dense"]  (put/get paths whose name
//        contains one of the ';'-separated parts; default: all)
//        [--server_pid PID]  (CPU ns per byte of client and server)
//        [--shared_mib N]  (unix: --tqkv_data: raw puts through N MiB of memory shared with the server)
// bench/service_bench.sh starts both servers and runs this.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/malloc_tuning.h"
#include "client/cpp/data_plane_client.h"
#include "proto/tqkv/v1/tqkv.grpc.pb.h"

namespace {

namespace v1 = tqkv::v1;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string tqkv = "127.0.0.1:50051";
  std::string tqkv_data = "127.0.0.1:50052";
  std::string redis = "127.0.0.1:6379";
  std::string mode = "all";
  int threads = 8;
  double seconds = 3.0;
  int batch = 8;
  double put_gib = 2.0;
  std::vector<int> put_frame_mib = {8, 32};  // data-plane put frame sizes to time
  int put_streams = 2;                        // concurrent put streams (and get connections)
  // Put and get paths to time: those whose name contains one of these
  // (e.g. "packed, data plane"); empty: all.
  std::vector<std::string> paths;
  // The server's process id (same machine): put and get lines then say the
  // CPU time the client and the server spent per byte. 0: not reported.
  int server_pid = 0;
  // With a unix: --tqkv_data, the put mode's raw-payload clients share this
  // many MiB with the server (DataPlaneClientOptions::shared_memory_bytes):
  // their frames' payloads bypass the socket. 0: none.
  int shared_mib = 0;
};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "service_bench: %s\n", msg.c_str());
  std::exit(1);
}

void Check(const grpc::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.error_message() + " (code " +
                   std::to_string(s.error_code()) + ")");
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A channel with its own TCP connection (no subchannel sharing), so N
// threads get N connections like N Redis clients do.
std::unique_ptr<v1::KvStore::Stub> NewStub(const std::string& addr) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::KvStore::NewStub(
      grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args));
}

redisContext* NewRedis(const std::string& addr) {
  auto colon = addr.rfind(':');
  redisContext* c = redisConnect(addr.substr(0, colon).c_str(), std::stoi(addr.substr(colon + 1)));
  if (c == nullptr || c->err) Die("redis connect " + addr + ": " + (c ? c->errstr : "oom"));
  return c;
}

redisReply* RedisArgv(redisContext* c, const std::vector<std::string>& argv) {
  std::vector<const char*> p;
  std::vector<size_t> n;
  for (const auto& a : argv) {
    p.push_back(a.data());
    n.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), p.data(),
                                                      n.data()));
  if (r == nullptr) Die(std::string("redis: ") + c->errstr);
  if (r->type == REDIS_REPLY_ERROR) Die(std::string("redis: ") + r->str);
  return r;
}

// A 32-byte block hash, distinct for distinct (tag, i).
std::string Hash(const std::string& tag, int i) {
  std::string h = absl::StrCat(absl::Hex(std::hash<std::string>{}(tag), absl::kZeroPad16), ":", i);
  h.resize(32, '#');
  return h;
}

// fp16 bits of N(0, 1) values.
std::string RandomHalfBytes(size_t elems, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::string out(elems * 2, '\0');
  auto* p = reinterpret_cast<_Float16*>(out.data());
  for (size_t i = 0; i < elems; ++i) p[i] = static_cast<_Float16>(nd(rng));
  return out;
}

struct Layout {
  uint32_t layers, kv_heads, head_dim, block_size;
  size_t dense_bytes() const {  // fp16 K + V of one block
    return size_t{2} * layers * block_size * kv_heads * head_dim * 2;
  }
};

v1::RegisterModelResponse Register(v1::KvStore::Stub* stub, const std::string& name,
                                   const Layout& l, const std::string& cache_dtype) {
  v1::RegisterModelRequest req;
  req.set_model_name(name);
  auto* lay = req.mutable_layout();
  lay->set_num_layers(l.layers);
  lay->set_num_kv_heads(l.kv_heads);
  lay->set_num_q_heads(l.kv_heads);
  lay->set_head_dim(l.head_dim);
  lay->set_block_size(l.block_size);
  lay->set_dtype(v1::DTYPE_FP16);
  req.mutable_codec()->set_cache_dtype(cache_dtype);
  v1::RegisterModelResponse resp;
  grpc::ClientContext ctx;
  Check(stub->RegisterModel(&ctx, req, &resp), "RegisterModel");
  return resp;
}

v1::ModelRef Ref(const v1::RegisterModelResponse& r) {
  v1::ModelRef m;
  m.set_model_id(r.model_id());
  m.set_layout_fingerprint(r.layout_fingerprint());
  return m;
}

// A dense fp16 PutBlock for a full block of `l`; k and v are `kv` halves.
void FillDenseBlock(v1::PutBlock* b, const Layout& l, const std::string& k, const std::string& v) {
  for (auto* t : {b->mutable_k(), b->mutable_v()}) {
    t->set_dtype(v1::DTYPE_FP16);
    t->clear_shape();
    for (int64_t d : {int64_t{l.layers}, int64_t{l.block_size}, int64_t{l.kv_heads},
                      int64_t{l.head_dim}})
      t->add_shape(d);
  }
  b->mutable_k()->set_data(k);
  b->mutable_v()->set_data(v);
}

// Streams `hashes` as dense blocks (data reused from `k`/`v`).
v1::PutBlocksResponse PutDense(v1::KvStore::Stub* stub, const v1::ModelRef& model,
                               const Layout& l, const std::vector<std::string>& hashes,
                               const std::vector<std::string>& k,
                               const std::vector<std::string>& v) {
  grpc::ClientContext ctx;
  v1::PutBlocksResponse resp;
  auto w = stub->PutBlocks(&ctx, &resp);
  v1::PutBlocksRequest req;
  *req.mutable_header()->mutable_model() = model;
  if (!w->Write(req)) Die("PutBlocks: header write failed");
  req.Clear();
  auto* b = req.mutable_block();
  for (size_t i = 0; i < hashes.size(); ++i) {
    b->set_block_hash(hashes[i]);
    FillDenseBlock(b, l, k[i % k.size()], v[i % v.size()]);
    if (!w->Write(req)) break;  // the status says why
  }
  w->WritesDone();
  Check(w->Finish(), "PutBlocks");
  return resp;
}

void Delete(v1::KvStore::Stub* stub, const v1::ModelRef& model,
            const std::vector<std::string>& hashes) {
  v1::DeleteRequest req;
  *req.mutable_model() = model;
  for (const auto& h : hashes) req.add_block_hashes(h);
  v1::DeleteResponse resp;
  grpc::ClientContext ctx;
  Check(stub->Delete(&ctx, req, &resp), "Delete");
}

// Runs `op(thread, &bytes)` on `threads` threads for `seconds`; returns
// (bytes/s, ops/s).
std::pair<double, double> RunLoop(int threads, double seconds,
                                  const std::function<size_t(int)>& op) {
  std::atomic<bool> stop{false};
  std::vector<size_t> bytes(threads, 0), ops(threads, 0);
  std::vector<std::thread> ts;
  auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      while (!stop.load(std::memory_order_relaxed)) {
        bytes[t] += op(t);
        ++ops[t];
      }
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : ts) th.join();
  double el = Seconds(Clock::now() - t0);
  size_t b = 0, o = 0;
  for (int t = 0; t < threads; ++t) b += bytes[t], o += ops[t];
  return {b / el, o / el};
}


// ---- get -------------------------------------------------------------------
void BenchGet(const Flags& f, const Layout& l, const std::string& label) {
  constexpr int kKeys = 64;
  auto stub = NewStub(f.tqkv);
  auto reg = Register(stub.get(), "bench_get_" + label, l, "k4v4");
  auto model = Ref(reg);
  const size_t block_bytes = reg.format().block_bytes();
  std::vector<std::string> hashes, k, v;
  for (int i = 0; i < kKeys; ++i) hashes.push_back(Hash("get" + label, i));
  size_t elems = size_t{l.layers} * l.block_size * l.kv_heads * l.head_dim;
  for (int i = 0; i < 4; ++i) {
    k.push_back(RandomHalfBytes(elems, 100 + i));
    v.push_back(RandomHalfBytes(elems, 200 + i));
  }
  PutDense(stub.get(), model, l, hashes, k, v);

  // Read every payload once and mirror it into Redis under the same key.
  redisContext* rc = NewRedis(f.redis);
  freeReplyObject(RedisArgv(rc, {"FLUSHALL"}));
  {
    v1::GetBlocksRequest req;
    *req.mutable_model() = model;
    for (const auto& h : hashes) req.add_block_hashes(h);
    grpc::ClientContext ctx;
    auto r = stub->GetBlocks(&ctx, req);
    v1::GetBlocksResponse resp;
    int n = 0;
    while (r->Read(&resp)) {
      if (resp.payload().size() != block_bytes) Die("GetBlocks: unexpected payload size");
      freeReplyObject(RedisArgv(rc, {"SET", resp.block_hash(), resp.payload()}));
      ++n;
    }
    Check(r->Finish(), "GetBlocks (prefill)");
    if (n != kKeys) Die("GetBlocks (prefill): missing blocks");
  }
  redisFree(rc);

  for (int batch : {1, f.batch}) {
    const size_t want = block_bytes * batch;
    // A thread per client, blocking calls (gRPC sync stub / hiredis), each
    // on its own connection.
    std::vector<std::unique_ptr<v1::KvStore::Stub>> stubs;
    std::vector<std::unique_ptr<tqkv::client::DataPlaneClient>> dps;
    std::vector<tqkv::client::DataPlaneBlocks> dp_out(f.threads);
    std::vector<redisContext*> rcs;
    std::vector<std::mt19937> rngs;
    for (int t = 0; t < f.threads; ++t) {
      stubs.push_back(NewStub(f.tqkv));
      auto dp = tqkv::client::DataPlaneClient::Connect({.target = f.tqkv_data});
      if (!dp.ok()) Die("data plane connect: " + dp.status().ToString());
      dps.push_back(std::move(*dp));
      rcs.push_back(NewRedis(f.redis));
      rngs.emplace_back(t + 1);
    }
    auto tq_threads = [&](double secs) {
      return RunLoop(f.threads, secs, [&](int t) -> size_t {
        v1::GetBlocksRequest req;
        *req.mutable_model() = model;
        size_t base = (rngs[t]() % (kKeys / batch)) * batch;
        for (int j = 0; j < batch; ++j) req.add_block_hashes(hashes[base + j]);
        grpc::ClientContext ctx;
        auto r = stubs[t]->GetBlocks(&ctx, req);
        v1::GetBlocksResponse resp;
        size_t got = 0;
        while (r->Read(&resp)) got += resp.payload().size();
        Check(r->Finish(), "GetBlocks");
        if (got != want) Die("GetBlocks: short read");
        return got;
      });
    };
    auto dp_threads = [&](double secs) {
      return RunLoop(f.threads, secs, [&](int t) -> size_t {
        v1::GetBlocksRequest req;
        *req.mutable_model() = model;
        size_t base = (rngs[t]() % (kKeys / batch)) * batch;
        for (int j = 0; j < batch; ++j) req.add_block_hashes(hashes[base + j]);
        absl::Status s = dps[t]->GetBlocks(req, &dp_out[t]);
        if (!s.ok()) Die("data plane GetBlocks: " + s.ToString());
        if (dp_out[t].payload_bytes() != want) Die("data plane GetBlocks: short read");
        return dp_out[t].payload_bytes();
      });
    };
    auto rd_threads = [&](double secs) {
      return RunLoop(f.threads, secs, [&](int t) -> size_t {
        std::vector<std::string> argv{batch == 1 ? "GET" : "MGET"};
        size_t base = (rngs[t]() % (kKeys / batch)) * batch;
        for (int j = 0; j < batch; ++j) argv.push_back(hashes[base + j]);
        redisReply* r = RedisArgv(rcs[t], argv);
        size_t got = r->type == REDIS_REPLY_STRING ? r->len : 0;
        for (size_t j = 0; j < r->elements; ++j) got += r->element[j]->len;
        freeReplyObject(r);
        if (got != want) Die("redis GET: short read");
        return got;
      });
    };
    // Warm-up (connections up, flow-control windows grown, caches warm),
    // then the three systems in interleaved rounds so that a change in
    // machine load hits all of them alike; rates are over the summed time.
    const double warm = std::min(0.5, f.seconds / 4);
    tq_threads(warm), dp_threads(warm), rd_threads(warm);
    constexpr int kRounds = 4;
    std::pair<double, double> tq{0, 0}, dp{0, 0}, rd{0, 0};
    for (int r = 0; r < kRounds; ++r) {
      auto add = [](std::pair<double, double>& acc, std::pair<double, double> x) {
        acc.first += x.first / kRounds, acc.second += x.second / kRounds;
      };
      add(tq, tq_threads(f.seconds / kRounds));
      add(dp, dp_threads(f.seconds / kRounds));
      add(rd, rd_threads(f.seconds / kRounds));
    }
    for (auto* c : rcs) redisFree(c);
    std::printf("get  %-7s payload %7zu B  keys/request %d  %d clients:  redis %6.3f GB/s "
                "(%6.0f req/s) | tqkv data plane %6.3f GB/s (%6.0f req/s) ratio %.2fx | "
                "tqkv gRPC %6.3f GB/s (%6.0f req/s) ratio %.2fx\n",
                label.c_str(), block_bytes, batch, f.threads, rd.first / 1e9, rd.second,
                dp.first / 1e9, dp.second, dp.first / rd.first, tq.first / 1e9, tq.second,
                tq.first / rd.first);
    std::fflush(stdout);
  }
  Delete(stub.get(), model, hashes);
}

// ---- put -------------------------------------------------------------------
// CPU seconds used so far by this process and by the server (0 without
// --server_pid; its utime + stime, in clock ticks).
struct CpuSeconds {
  double client = 0, server = 0;
  CpuSeconds operator-(const CpuSeconds& o) const { return {client - o.client, server - o.server}; }
  CpuSeconds& operator+=(const CpuSeconds& o) {
    client += o.client;
    server += o.server;
    return *this;
  }
};

CpuSeconds CpuNow(int server_pid) {
  CpuSeconds c;
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  c.client = u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  if (server_pid > 0) {
    std::ifstream in("/proc/" + std::to_string(server_pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Fields after the command's closing parenthesis: state is field 3,
    // utime and stime fields 14 and 15.
    std::vector<std::string> fs = absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
    if (fs.size() > 12) c.server = (std::stod(fs[11]) + std::stod(fs[12])) / sysconf(_SC_CLK_TCK);
  }
  return c;
}

// ", CPU ns/B: client C, server S" (empty without --server_pid).
std::string CpuPerByte(const Flags& f, const CpuSeconds& c, double bytes) {
  if (f.server_pid <= 0) return "";
  return absl::StrFormat(", CPU ns/B: client %.3f, server %.3f", c.client * 1e9 / bytes, c.server * 1e9 / bytes);
}

// Bytes/s of a loopback TCP stream (`unix`: a Unix-domain stream socket
// pair, for a data plane reached on its Unix-domain socket) of `bytes` in
// writes of `chunk` (one writer, one reader thread): the transport floor
// of a put, without tqkv.
double RawStream(size_t bytes, size_t chunk, bool unix) {
  int ls = -1, pair[2] = {-1, -1};
  sockaddr_in a{};
  if (unix) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) Die("raw stream: socketpair");
  } else {
    ls = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      Die("raw TCP stream: bind/listen");
  }
  std::thread reader([&] {
    const int fd = unix ? pair[1] : accept(ls, nullptr, nullptr);
    std::vector<char> buf(1 << 20);
    size_t got = 0;
    while (got < bytes) {
      const ssize_t r = read(fd, buf.data(), buf.size());
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    const char ack = 1;
    (void)!write(fd, &ack, 1);
    close(fd);
  });
  const int fd = unix ? pair[0] : socket(AF_INET, SOCK_STREAM, 0);
  if (!unix && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) Die("raw TCP stream: connect");
  std::string data(chunk, 'x');
  const auto t0 = Clock::now();
  for (size_t sent = 0; sent < bytes;) {
    const ssize_t w = write(fd, data.data(), std::min(chunk, bytes - sent));
    if (w <= 0) Die("raw TCP stream: write");
    sent += static_cast<size_t>(w);
  }
  char ack;
  (void)!read(fd, &ack, 1);  // the reader has every byte
  const double secs = Seconds(Clock::now() - t0);
  reader.join();
  close(fd);
  if (ls >= 0) close(ls);
  return bytes / secs;
}

// Puts of one path: `streams` concurrent streams of kBlocksPerStream blocks
// per round, over enough rounds to move `gib` of input.
struct PutPath {
  const char* name;
  // The blocks of one stream, under `hashes` (built before the clock starts:
  // the rate is the put's, not the building of its messages).
  std::function<std::vector<v1::PutBlock>(const std::vector<std::string>& hashes)> blocks;
  // Puts `blocks` as one stream on stream slot `s`; returns the response.
  std::function<v1::PutBlocksResponse(int s, std::vector<v1::PutBlock> blocks)> put;
  size_t block_input_bytes;  // bytes of input a block carries
  int frame_mib;             // data plane: frame size; 0: gRPC
};

// Whether `name` is one of f.paths (or f.paths is empty).
bool Selected(const Flags& f, const std::string& name) {
  if (f.paths.empty()) return true;
  for (const std::string& p : f.paths)
    if (name.find(p) != std::string::npos) return true;
  return false;
}

void BenchPut(const Flags& f) {
  // Llama-3-8B-like block: 32 layers, 8 kv heads, d 128, 16 tokens = 2 MiB fp16 K+V.
  const Layout l{32, 8, 128, 16};
  constexpr int kBlocksPerStream = 16;
  const int streams = f.put_streams;
  auto stub = NewStub(f.tqkv);
  auto reg = Register(stub.get(), "bench_put", l, "k4v4");
  auto model = Ref(reg);
  size_t elems = size_t{l.layers} * l.block_size * l.kv_heads * l.head_dim;
  std::vector<std::string> k, v;
  for (int i = 0; i < 8; ++i) {
    k.push_back(RandomHalfBytes(elems, 300 + i));
    v.push_back(RandomHalfBytes(elems, 400 + i));
  }
  std::vector<std::unique_ptr<v1::KvStore::Stub>> stubs;
  for (int s = 0; s < streams; ++s) stubs.push_back(NewStub(f.tqkv));
  // Data-plane clients sending tensors as raw payloads (dps) and inside the
  // messages (inline_dps). The server deals connections out to its loops
  // round-robin: each kind's streams are connected one after another, so
  // that they land on different loops.
  std::vector<std::unique_ptr<tqkv::client::DataPlaneClient>> dps, inline_dps;
  for (bool raw : {true, false}) {
    for (int s = 0; s < streams; ++s) {
      auto dp = tqkv::client::DataPlaneClient::Connect(
          {.target = f.tqkv_data,
           .raw_payloads = raw,
           .shared_memory_bytes = raw ? static_cast<size_t>(f.shared_mib) << 20 : 0});
      if (!dp.ok()) Die("data plane connect: " + std::string(dp.status().message()));
      (raw ? dps : inline_dps).push_back(std::move(*dp));
    }
  }
  // The packed payloads of the 8 dense blocks, for the packed puts.
  std::vector<std::string> seed_hashes;
  for (int i = 0; i < 8; ++i) seed_hashes.push_back(Hash("put-seed", i));
  PutDense(stub.get(), model, l, seed_hashes, k, v);
  std::vector<std::string> packed_payloads;
  {
    v1::GetBlocksRequest g;
    *g.mutable_model() = model;
    for (const auto& h : seed_hashes) g.add_block_hashes(h);
    tqkv::client::DataPlaneBlocks out;
    if (absl::Status st = dps[0]->GetBlocks(g, &out); !st.ok()) Die("GetBlocks: " + std::string(st.message()));
    for (size_t i = 0; i < out.size(); ++i) packed_payloads.emplace_back(out.payload(i));
  }
  auto dense_blocks = [&](const std::vector<std::string>& hashes) {
    std::vector<v1::PutBlock> blocks(hashes.size());
    for (size_t i = 0; i < hashes.size(); ++i) {
      blocks[i].set_block_hash(hashes[i]);
      FillDenseBlock(&blocks[i], l, k[i % k.size()], v[i % v.size()]);
    }
    return blocks;
  };
  auto packed_blocks = [&](const std::vector<std::string>& hashes) {
    std::vector<v1::PutBlock> blocks(hashes.size());
    for (size_t i = 0; i < hashes.size(); ++i) {
      blocks[i].set_block_hash(hashes[i]);
      blocks[i].set_payload(packed_payloads[i % packed_payloads.size()]);
    }
    return blocks;
  };
  v1::PutHeader dense_header, packed_header;
  *dense_header.mutable_model() = model;
  packed_header = dense_header;
  packed_header.set_packed(true);
  auto grpc_put = [&](int s, const v1::PutHeader& h, std::vector<v1::PutBlock> blocks) {
    grpc::ClientContext ctx;
    v1::PutBlocksResponse resp;
    auto w = stubs[s]->PutBlocks(&ctx, &resp);
    v1::PutBlocksRequest req;
    *req.mutable_header() = h;
    if (!w->Write(req)) Die("PutBlocks: header write failed");
    for (auto& b : blocks) {
      req.mutable_block()->Swap(&b);
      if (!w->Write(req)) break;  // the status says why
    }
    w->WritesDone();
    Check(w->Finish(), "PutBlocks");
    return resp;
  };
  size_t frame_bytes = size_t{8} << 20;
  auto dp_put = [&](int s, const v1::PutHeader& h, std::vector<v1::PutBlock> blocks, bool raw = true) {
    auto r = (raw ? dps : inline_dps)[s]->PutBlocks(h, std::move(blocks), frame_bytes);
    if (!r.ok()) Die("data plane PutBlocks: " + std::string(r.status().message()));
    return *r;
  };
  const size_t packed_bytes = packed_payloads[0].size();
  std::vector<PutPath> paths = {
      {"dense, gRPC", dense_blocks, [&](int s, auto bs) { return grpc_put(s, dense_header, std::move(bs)); },
       l.dense_bytes(), 0},
      {"packed, gRPC", packed_blocks, [&](int s, auto bs) { return grpc_put(s, packed_header, std::move(bs)); },
       packed_bytes, 0},
  };
  for (int mib : f.put_frame_mib) {
    paths.push_back({"dense, data plane", dense_blocks,
                     [&](int s, auto bs) { return dp_put(s, dense_header, std::move(bs)); }, l.dense_bytes(), mib});
    paths.push_back({"packed, data plane", packed_blocks,
                     [&](int s, auto bs) { return dp_put(s, packed_header, std::move(bs)); }, packed_bytes, mib});
    paths.push_back({"dense, data plane, inline tensors", dense_blocks,
                     [&](int s, auto bs) { return dp_put(s, dense_header, std::move(bs), false); }, l.dense_bytes(),
                     mib});
  }


  // Baselines in the same run: memcpy of the dense bytes, and a loopback TCP
  // (or, for a data plane on its Unix-domain socket, a Unix-socket) stream
  // of 2 GiB in 8 MiB writes.
  const double input_target = f.put_gib * (1ull << 30);
  std::vector<std::string> dst(k.size(), std::string(k[0].size(), '\0'));
  size_t copied = 0;
  auto t0 = Clock::now();
  while (copied < input_target) {
    for (size_t i = 0; i < k.size() && copied < input_target; ++i) {
      std::memcpy(dst[i].data(), k[i].data(), k[i].size());
      std::memcpy(dst[(i + 1) % dst.size()].data(), v[i].data(), v[i].size());
      copied += k[i].size() + v[i].size();
    }
  }
  const double memcpy_bps = copied / Seconds(Clock::now() - t0);
  volatile char sink = dst[0][7];
  (void)sink;
  const bool unix = f.tqkv_data.starts_with("unix:");
  const double tcp_bps = RawStream(size_t{2} << 30, size_t{8} << 20, unix);
  std::printf("put  baselines: memcpy %.3f GB/s, raw %s stream %.3f GB/s\n", memcpy_bps / 1e9,
              unix ? "Unix-socket" : "loopback TCP", tcp_bps / 1e9);

  for (const PutPath& path : paths) {
    const std::string name =
        path.frame_mib > 0 ? absl::StrCat(path.name, ", ", path.frame_mib, " MiB frames") : std::string(path.name);
    if (!Selected(f, "put " + name)) continue;
    frame_bytes = size_t(std::max(path.frame_mib, 1)) << 20;
    const size_t per_round = size_t{streams} * kBlocksPerStream * path.block_input_bytes;
    const size_t dense_per_round = size_t{streams} * kBlocksPerStream * l.dense_bytes();
    const int rounds = std::max<int>(1, input_target / dense_per_round);
    double put_s = 0;
    CpuSeconds cpu;
    uint64_t committed = 0;
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::vector<std::string>> hs(streams);
      for (int s = 0; s < streams; ++s)
        for (int i = 0; i < kBlocksPerStream; ++i)
          hs[s].push_back(Hash(std::string(path.name) + std::to_string(path.frame_mib) + "r" + std::to_string(round) + "." + std::to_string(s), i));
      std::vector<v1::PutBlocksResponse> resp(streams);
      std::vector<std::vector<v1::PutBlock>> blocks(streams);
      for (int s = 0; s < streams; ++s) blocks[s] = path.blocks(hs[s]);
      const CpuSeconds cpu0 = CpuNow(f.server_pid);
      t0 = Clock::now();
      std::vector<std::thread> ts;
      for (int s = 0; s < streams; ++s) ts.emplace_back([&, s] { resp[s] = path.put(s, std::move(blocks[s])); });
      for (auto& t : ts) t.join();
      put_s += Seconds(Clock::now() - t0);
      cpu += CpuNow(f.server_pid) - cpu0;
      for (int s = 0; s < streams; ++s) {
        committed += resp[s].committed();
        Delete(stub.get(), model, hs[s]);  // keep memory flat; not timed
      }
    }
    if (committed != uint64_t(rounds) * streams * kBlocksPerStream) Die("PutBlocks: not all committed");
    const double bps = double(rounds) * per_round / put_s;
    std::printf("put  %-35s k4v4, %zu B of input a block, %d streams x %d blocks x %d rounds: %.3f GB/s of input "
                "(%.3fx the TCP stream, %.3fx memcpy)%s\n",
                name.c_str(), path.block_input_bytes, streams, kBlocksPerStream, rounds, bps / 1e9, bps / tcp_bps,
                bps / memcpy_bps, CpuPerByte(f, cpu, double(rounds) * per_round).c_str());
    std::fflush(stdout);
  }

  // Reads of what a prefill worker stored: 2 streams each reading its 16
  // blocks per request, packed over the data plane, dense fp16 (decoded by
  // the server) over the data plane and over gRPC; GB/s of output.
  std::vector<std::vector<std::string>> stored(streams);
  for (int s = 0; s < streams; ++s) {
    for (int i = 0; i < kBlocksPerStream; ++i) stored[s].push_back(Hash("get" + std::to_string(s), i));
    dp_put(s, dense_header, dense_blocks(stored[s]));
  }
  struct GetPath {
    const char* name;
    std::function<size_t(int s)> get;  // one request of stream s; output bytes
  };
  auto request = [&](int s, bool dense) {
    v1::GetBlocksRequest g;
    *g.mutable_model() = model;
    for (const auto& h : stored[s]) g.add_block_hashes(h);
    g.set_dense(dense);
    return g;
  };
  std::vector<tqkv::client::DataPlaneBlocks> outs(streams);
  const std::vector<GetPath> gets = {
      {"packed, data plane", [&](int s) {
         if (absl::Status st = dps[s]->GetBlocks(request(s, false), &outs[s]); !st.ok()) Die(std::string(st.message()));
         return size_t(outs[s].payload_bytes());
       }},
      {"dense fp16, data plane", [&](int s) {
         if (absl::Status st = dps[s]->GetBlocks(request(s, true), &outs[s]); !st.ok()) Die(std::string(st.message()));
         return size_t(outs[s].payload_bytes());
       }},
      {"dense fp16, gRPC", [&](int s) {
         grpc::ClientContext ctx;
         auto r = stubs[s]->GetBlocks(&ctx, request(s, true));
         v1::GetBlocksResponse m;
         size_t bytes = 0;
         while (r->Read(&m)) bytes += m.k().data().size() + m.v().data().size();
         Check(r->Finish(), "GetBlocks");
         return bytes;
       }},
  };
  for (const GetPath& g : gets) {
    if (!Selected(f, std::string("get ") + g.name)) continue;
    std::vector<size_t> bytes(streams, 0);
    const CpuSeconds cpu0 = CpuNow(f.server_pid);
    t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int s = 0; s < streams; ++s)
      ts.emplace_back([&, s] {
        while (bytes[s] < input_target / streams) bytes[s] += g.get(s);
      });
    for (auto& t : ts) t.join();
    const double secs = Seconds(Clock::now() - t0);
    const CpuSeconds cpu = CpuNow(f.server_pid) - cpu0;
    double total = 0;
    for (size_t b : bytes) total += double(b);
    std::printf("get  %-35s %d streams x %d blocks a request: %.3f GB/s of output (%.3fx the TCP stream)%s\n", g.name,
                streams, kBlocksPerStream, total / secs / 1e9, total / secs / tcp_bps, CpuPerByte(f, cpu, total).c_str());
    std::fflush(stdout);
  }
}

// ---- lookup ----------------------------------------------------------------
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

void BenchLookup(const Flags& f) {
  constexpr int kChain = 1000, kIters = 3000;
  const Layout l{1, 1, 128, 16};
  auto stub = NewStub(f.tqkv);
  auto model = Ref(Register(stub.get(), "bench_lookup", l, "k4v4"));
  std::vector<std::string> hashes;
  for (int i = 0; i < kChain; ++i) hashes.push_back(Hash("chain", i));
  size_t elems = size_t{l.layers} * l.block_size * l.kv_heads * l.head_dim;
  PutDense(stub.get(), model, l, hashes, {RandomHalfBytes(elems, 7)}, {RandomHalfBytes(elems, 8)});

  v1::LookupRequest req, one;
  *req.mutable_model() = model;
  *one.mutable_model() = model;
  for (const auto& h : hashes) req.add_block_hashes(h);
  one.add_block_hashes(hashes[0]);
  auto lookup = [&](const v1::LookupRequest& r, uint32_t want) {
    grpc::ClientContext ctx;
    v1::LookupResponse resp;
    auto t0 = Clock::now();
    Check(stub->Lookup(&ctx, r, &resp), "Lookup");
    double us = Seconds(Clock::now() - t0) * 1e6;
    if (resp.hits() != want) Die("Lookup: wrong hit count");
    return us;
  };
  redisContext* rc = NewRedis(f.redis);
  freeReplyObject(RedisArgv(rc, {"FLUSHALL"}));
  for (const auto& h : hashes) freeReplyObject(RedisArgv(rc, {"SET", h, "1"}));
  std::vector<std::string> exists{"EXISTS"};
  exists.insert(exists.end(), hashes.begin(), hashes.end());
  auto redis_exists = [&] {
    auto t0 = Clock::now();
    redisReply* r = RedisArgv(rc, exists);
    double us = Seconds(Clock::now() - t0) * 1e6;
    if (r->integer != kChain) Die("redis EXISTS: wrong count");
    freeReplyObject(r);
    return us;
  };
  for (int i = 0; i < 200; ++i) lookup(req, kChain), lookup(one, 1), redis_exists();  // warm up
  std::vector<double> chain, single, redis;
  for (int i = 0; i < kIters; ++i) {
    chain.push_back(lookup(req, kChain));
    single.push_back(lookup(one, 1));
    redis.push_back(redis_exists());
  }
  redisFree(rc);
  std::printf("lookup 1000-hash chain (1 client):  p50 %.0f us  p99 %.0f us  max %.0f us  |  "
              "1-hash Lookup p50 %.0f us p99 %.0f us  |  redis EXISTS x1000 p50 %.0f us p99 %.0f us"
              "  |  p50 ratio vs redis %.2fx, p99 ratio %.2fx\n",
              Percentile(chain, .5), Percentile(chain, .99), Percentile(chain, 1.0),
              Percentile(single, .5), Percentile(single, .99), Percentile(redis, .5),
              Percentile(redis, .99), Percentile(chain, .5) / Percentile(redis, .5),
              Percentile(chain, .99) / Percentile(redis, .99));
  std::fflush(stdout);
  Delete(stub.get(), model, hashes);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      auto eq = a.find('=');
      if (eq != std::string::npos) return a.substr(eq + 1);
      if (i + 1 >= argc) Die("missing value for " + a);
      return argv[++i];
    };
    std::string name = a.substr(0, a.find('='));
    if (name == "--tqkv") f.tqkv = val();
    else if (name == "--tqkv_data") f.tqkv_data = val();
    else if (name == "--redis") f.redis = val();
    else if (name == "--mode") f.mode = val();
    else if (name == "--threads") f.threads = std::stoi(val());
    else if (name == "--seconds") f.seconds = std::stod(val());
    else if (name == "--batch") f.batch = std::stoi(val());
    else if (name == "--put_gib") f.put_gib = std::stod(val());
    else if (name == "--put_frame_mib") {
      f.put_frame_mib.clear();
      for (absl::string_view x : absl::StrSplit(val(), ',')) f.put_frame_mib.push_back(std::stoi(std::string(x)));
    }
    else if (name == "--server_pid") f.server_pid = std::stoi(val());
    else if (name == "--shared_mib") f.shared_mib = std::max(0, std::stoi(val()));
    else if (name == "--put_streams") f.put_streams = std::max(1, std::stoi(val()));
    else if (name == "--paths") f.paths = absl::StrSplit(val(), ';', absl::SkipEmpty());
    else Die("unknown flag " + a);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = ParseFlags(argc, argv);
  // The harness keeps its freed buffers for reuse as the server does, so
  // that its own page faults do not set the pace.
  tqkv::KeepFreedMemoryForReuse(tqkv::kDefaultKeepFreeBytes);
  // Debian's Abseil is built without NDEBUG, so absl::Mutex (under gRPC's
  // locks) tracks lock graphs for deadlock detection on every acquisition.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  bool all = f.mode == "all";
  if (all || f.mode == "get") {
    // k4v4 at d 128: 68-byte rows, 2176 B per layer-token-head pair of pages.
    // 30 layers x 1 kv head x 16 tokens ~ 64 KiB; x 8 kv heads ~ 512 KiB.
    BenchGet(f, Layout{30, 1, 128, 16}, "64KiB");
    BenchGet(f, Layout{30, 8, 128, 16}, "512KiB");
  }
  if (all || f.mode == "put") BenchPut(f);
  if (all || f.mode == "lookup") BenchLookup(f);
  return 0;
}
