// One decode step of a model served as one Attend call per layer over
// loopback, end to end (issue #4): register a model, store a context of
// `--context` tokens as dense fp16 blocks (the server encodes them), create a
// sequence over them, then time `--steps` decode steps of `--layers` Attend
// calls each. Reports per-call latency and its split into kernel time (the
// server's `kernel_micros`) and the rest (RPC, (de)serialisation, copies),
// against a baseline measured in the same run: a trivial RPC (Lookup of one
// hash) on the same channel. With --data (the server's data-plane address)
// every step is also run over the data plane (DataPlaneClient::Attend),
// alternating with the gRPC step, and both are reported.
//
// Usage: attend_e2e_bench --server HOST:PORT [--data HOST:PORT] [--layers 32
//        --context 32768 --kv_heads 8 --q_heads 32 --head_dim 128
//        --format k4v4 --steps 20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/latency.h"
#include "client/cli/args.h"
#include "client/cpp/client.h"
#include "client/cpp/data_plane_client.h"
#include "client/cpp/synthetic.h"

namespace tqkv {
namespace {

using bench::Clock;
using bench::Micros;
using bench::Percentile;

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "attend_e2e_bench: %s: %s\n", what, std::string(s.message()).c_str());
  return 1;
}

int Run(int argc, char** argv) {
  auto args = cli::Args::Parse(argc, argv, 1,
                               {"server", "data", "layers", "context", "kv_heads", "q_heads", "head_dim",
                                "format", "steps", "put_batch"});
  if (!args.ok()) return Fail(args.status(), "arguments");
  const std::string server = args->Get("server", "localhost:50051");
  const std::string data = args->Get("data", "");
  const int layers = *args->GetInt("layers", 32), kv = *args->GetInt("kv_heads", 8),
            qh = *args->GetInt("q_heads", 32), d = *args->GetInt("head_dim", 128),
            steps = *args->GetInt("steps", 20), put_batch = *args->GetInt("put_batch", 32);
  const int64_t context = *args->GetInt("context", 32768);
  const int bs = 16;
  const std::string format = args->Get("format", "k4v4");

  client::ClientOptions opts;
  opts.target = server;
  opts.deadline = absl::Seconds(600);
  auto c = client::Client::Connect(opts);
  if (!c.ok()) return Fail(c.status(), "connect");
  const v1::RegisterModelRequest reg = client::ModelRegistration(
      absl::StrFormat("attend-e2e-%s-%d", format, layers), layers, kv, qh, d, bs, format);
  const v1::ModelLayout* l = &reg.layout();
  auto model = (*c)->RegisterModel(reg);
  if (!model.ok()) return Fail(model.status(), "register");

  const int64_t blocks = context / bs;
  std::vector<std::string> chain = client::HashChain(77, blocks);
  auto t0 = Clock::now();
  v1::PutHeader header;
  header.mutable_model()->set_model_id(model->model_id());
  header.mutable_model()->set_layout_fingerprint(model->layout_fingerprint());
  for (int64_t b = 0; b < blocks; b += put_batch) {
    std::vector<v1::PutBlock> batch;
    for (int64_t i = b; i < std::min(blocks, b + put_batch); ++i)
      batch.push_back(client::DenseBlock(*l, chain[i], i ? chain[i - 1] : "", 1000 + i));
    auto put = (*c)->PutBlocks(header, batch);
    if (!put.ok()) return Fail(put.status(), "put");
    std::fprintf(stderr, "\rput %lld/%lld blocks", (long long)std::min(blocks, b + put_batch),
                 (long long)blocks);
  }
  const double put_s = Micros(t0, Clock::now()) / 1e6;
  std::fprintf(stderr, "\n");

  v1::CreateSequenceRequest cs;
  *cs.mutable_model() = header.model();
  for (const std::string& h : chain) cs.add_block_hashes(h);
  cs.set_ttl_ms(3600 * 1000);
  auto seq = (*c)->CreateSequence(cs);
  if (!seq.ok()) return Fail(seq.status(), "create sequence");

  v1::AttendRequest req;
  auto* item = req.add_items();
  item->set_sequence_id(seq->sequence_id());
  *item->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, qh, d}, 5);
  v1::LookupRequest ping;
  *ping.mutable_model() = header.model();
  ping.add_block_hashes(chain[0]);

  std::unique_ptr<client::DataPlaneClient> dp;
  if (!data.empty()) {
    auto d = client::DataPlaneClient::Connect({.target = data, .timeout = absl::Seconds(600)});
    if (!d.ok()) return Fail(d.status(), "data plane connect");
    dp = std::move(*d);
  }
  struct Path {
    const char* name;
    std::vector<double> call_us, kernel_us, rest_us, step_us;
  };
  Path grpc_path{"gRPC"}, dp_path{"data plane"};
  std::vector<double> ping_us;
  // One decode step over gRPC (dp == nullptr) or the data plane.
  auto step = [&](Path& path, client::DataPlaneClient* over, bool record) -> absl::Status {
    auto step_start = Clock::now();
    for (int layer = 0; layer < layers; ++layer) {
      req.set_layer(layer);
      auto a = Clock::now();
      absl::StatusOr<v1::AttendResponse> r = over ? over->Attend(req) : (*c)->Attend(req);
      auto b = Clock::now();
      if (!r.ok()) return r.status();
      if (!record) continue;
      path.call_us.push_back(Micros(a, b));
      path.kernel_us.push_back(static_cast<double>(r->kernel_micros()));
      path.rest_us.push_back(Micros(a, b) - static_cast<double>(r->kernel_micros()));
    }
    if (record) path.step_us.push_back(Micros(step_start, Clock::now()));
    return absl::OkStatus();
  };
  for (int s = -1; s < steps; ++s) {  // step -1 warms up (uploads, caches)
    if (absl::Status st = step(grpc_path, nullptr, s >= 0); !st.ok()) return Fail(st, "attend");
    if (dp)
      if (absl::Status st = step(dp_path, dp.get(), s >= 0); !st.ok())
        return Fail(st, "attend (data plane)");
    auto a = Clock::now();
    auto p = (*c)->Lookup(ping);
    if (!p.ok()) return Fail(p.status(), "lookup");
    if (s >= 0) ping_us.push_back(Micros(a, Clock::now()));
  }
  const double packed_gb = double(model->format().block_bytes()) * blocks / 1e9;
  std::printf("model: %d layers, %d kv heads, %d q heads, d=%d, format %s; context %lld tokens "
              "(%lld blocks, %.3f GB packed); put %.1f s\n",
              layers, kv, qh, d, format.c_str(), (long long)context, (long long)blocks, packed_gb,
              put_s);
  for (const Path* path : {&grpc_path, &dp_path}) {
    if (path->call_us.empty()) continue;
    std::printf("[%s] Attend per call (us): median %.0f p99 %.0f | kernel median %.0f | rest "
                "(transport, copies) median %.0f | decode step (%d calls) median %.2f ms\n",
                path->name, Percentile(path->call_us, 0.5), Percentile(path->call_us, 0.99),
                Percentile(path->kernel_us, 0.5), Percentile(path->rest_us, 0.5), layers,
                Percentile(path->step_us, 0.5) / 1e3);
  }
  std::printf("baseline trivial RPC (Lookup of 1 hash) median %.0f us -> gRPC Attend call = %.1fx a "
              "trivial RPC\n",
              Percentile(ping_us, 0.5),
              Percentile(grpc_path.call_us, 0.5) / std::max(1.0, Percentile(ping_us, 0.5)));
  return 0;
}

}  // namespace
}  // namespace tqkv

int main(int argc, char** argv) { return tqkv::Run(argc, argv); }
