// Data-plane packed GetBlocks over TLS against plain TCP, on two running
// tqkv-servers (one with --tls_cert_file, one without; both CPU backend):
// --threads client threads, one connection and one block per request, in
// interleaved rounds; prints GB/s of payload and requests/s for each and the
// TLS/plain ratio, per block size.
//
// Usage: data_plane_tls_bench --plain GRPC,DATA --tls GRPC,DATA --ca ca.pem
//        [--threads 2] [--seconds 2]
// bench/data_plane_tls_bench.sh makes the certificates, starts both servers
// and runs this.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cpp/client.h"
#include "client/cpp/data_plane_client.h"
#include "client/cpp/synthetic.h"

namespace {

namespace v1 = tqkv::v1;
namespace client = tqkv::client;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "data_plane_tls_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Target {
  std::string grpc, data, ca;  // ca empty: plain
};

struct Loaded {
  v1::ModelRef model;
  std::vector<std::string> hashes;
};

// Registers a model of `layers` layers and puts `n` blocks.
Loaded Load(const Target& t, int layers, int n) {
  client::ClientOptions o;
  o.target = t.grpc;
  o.tls_ca_file = t.ca;
  auto c = client::Client::Connect(o);
  if (!c.ok()) Die(c.status().ToString());
  const v1::RegisterModelRequest reg = client::ModelRegistration(
      absl::StrCat("bench", layers), layers, 8, 8, 128, 16, "k4v4");
  auto r = (*c)->RegisterModel(reg);
  if (!r.ok()) Die(r.status().ToString());
  Loaded l;
  l.model.set_model_id(r->model_id());
  l.model.set_layout_fingerprint(r->layout_fingerprint());
  l.hashes = client::HashChain(layers, n);
  std::vector<v1::PutBlock> blocks;
  std::string parent;
  for (int i = 0; i < n; ++i) {
    blocks.push_back(client::DenseBlock(reg.layout(), l.hashes[i], parent, 100 + i));
    parent = l.hashes[i];
  }
  v1::PutHeader h;
  *h.mutable_model() = l.model;
  auto p = (*c)->PutBlocks(h, blocks);
  if (!p.ok()) Die(p.status().ToString());
  return l;
}

struct Rate {
  double bytes = 0, requests = 0, seconds = 0;
};

// `threads` connections reading random single blocks for `secs`.
void Run(const Target& t, const Loaded& l, int threads, double secs, Rate* rate) {
  std::vector<std::thread> pool;
  std::atomic<uint64_t> bytes{0}, requests{0};
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      client::DataPlaneClientOptions o;
      o.target = t.data;
      o.tls.ca_file = t.ca;
      auto dp = client::DataPlaneClient::Connect(o);
      if (!dp.ok()) Die(dp.status().ToString());
      client::DataPlaneBlocks out;
      uint64_t i = k * 7919, b = 0, n = 0;
      const auto end = start + std::chrono::duration<double>(secs);
      while (std::chrono::steady_clock::now() < end) {
        v1::GetBlocksRequest req;
        *req.mutable_model() = l.model;
        req.add_block_hashes(l.hashes[i++ % l.hashes.size()]);
        if (absl::Status s = (*dp)->GetBlocks(req, &out); !s.ok()) Die(s.ToString());
        b += out.payload_bytes();
        ++n;
      }
      bytes += b;
      requests += n;
    });
  }
  for (std::thread& th : pool) th.join();
  rate->bytes += bytes.load();
  rate->requests += requests.load();
  rate->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Target Parse(const std::string& arg, const std::string& ca) {
  std::vector<std::string> parts = absl::StrSplit(arg, ',');
  if (parts.size() != 2) Die("a target is GRPC_ADDRESS,DATA_ADDRESS");
  return {parts[0], parts[1], ca};
}

}  // namespace

int main(int argc, char** argv) {
  std::string plain_arg, tls_arg, ca;
  int threads = 2;
  double seconds = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--plain") plain_arg = v;
    else if (k == "--tls") tls_arg = v;
    else if (k == "--ca") ca = v;
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--seconds") seconds = std::stod(v);
    else Die("unknown flag " + k);
  }
  if (plain_arg.empty() || tls_arg.empty() || ca.empty()) Die("--plain, --tls and --ca are required");
  const Target plain = Parse(plain_arg, ""), tls = Parse(tls_arg, ca);
  std::printf("data-plane packed GetBlocks, 1 block a request, %d threads, %.1f s each\n", threads, seconds);
  for (int layers : {4, 32}) {
    const Loaded lp = Load(plain, layers, 64), lt = Load(tls, layers, 64);
    Rate p, t;
    Run(plain, lp, threads, 0.3, &p);  // warm-up
    Run(tls, lt, threads, 0.3, &t);
    p = t = Rate();
    for (int round = 0; round < 4; ++round) {
      Run(plain, lp, threads, seconds / 4, &p);
      Run(tls, lt, threads, seconds / 4, &t);
    }
    const double block = p.bytes / p.requests;
    std::printf("block %6.0f KiB  plain %6.2f GB/s %8.0f req/s   TLS %6.2f GB/s %8.0f req/s   TLS/plain %.2fx\n",
                block / 1024, p.bytes / p.seconds / 1e9, p.requests / p.seconds, t.bytes / t.seconds / 1e9,
                t.requests / t.seconds, (t.bytes / t.seconds) / (p.bytes / p.seconds));
  }
  return 0;
}
