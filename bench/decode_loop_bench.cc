// The decode worker's loop, end to end over loopback: for each step and
// each layer, ONE data-plane Attend call whose items carry every sequence's
// new token (K/V appended, then attended) and its query, the tensors sent
// from the worker's buffers as the frame's raw payload and the outputs
// received into its buffer (--tensors inline: inside the protobuf request
// and reply instead). Sequences start at
// random offsets inside their last block (a dense tail of 0..15 tokens), so
// tails fill and pack during the run as they do in a real decode loop.
//
// Per shape it reports the per-layer call (median, p99) split into
//   transport + framing  = call − the server's service_micros,
//   service host work    = service_micros − kernel_micros (appends,
//                          request checks, outputs),
//   backend host work    = kernel_micros − device_micros,
//   device               = device_micros (the attention kernels, GPU events),
// the step of all layers (and the first, which uploads the context to the
// device), the packed bytes a layer's kernel reads and their
// rate, and two baselines measured in the same run: a raw loopback TCP round
// trip (a Unix-socket one for --data unix:PATH, the server's --data_socket)
// of the same request and reply bytes (no tqkv), and the same loop as
// two calls per layer (data-plane Append, then Attend).
//
// Context blocks are stored packed: a pool of distinct blocks is put dense
// (the server encodes them) and read back, and every context block is a
// copy of a pool block under its own hash (its own device pages).
//
// Usage: decode_loop_bench --server HOST:PORT --data HOST:PORT|unix:PATH
//        [--layers 32 --kv_heads 8 --q_heads 32 --head_dim 128 --format k4v4
//         --shapes 1x32768,64x4096,mixed64 --steps 32 --two_call_steps 4 --tensors raw
//         --reply_poll_us 0 --shared_mib 0 --doorbell 0]
// --reply_poll_us N: the client polls for each reply for up to N µs before
// sleeping (DataPlaneClientOptions::reply_poll), the echo floor likewise.
// --shared_mib N (with --data unix:PATH): the calls' tensors and outputs go
// through N MiB of memory shared with the server instead of the socket
// (DataPlaneClientOptions::shared_memory_bytes); with --doorbell 1 too, the
// calls themselves go through it (DataPlaneClientOptions::doorbell: no
// socket crossed while the server polls, --data_busy_poll).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
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

int Fail(const absl::Status& s, const std::string& what) {
  std::fprintf(stderr, "decode_loop_bench: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return 1;
}

// A loopback TCP server (`unix`: the two ends of a Unix-domain stream
// socket pair, for a data plane reached on its Unix-domain socket) that
// answers each `request_bytes` message with `reply_bytes` bytes: the
// transport floor of one call, without tqkv. The client polls for each
// reply for up to `reply_poll` first, as the data-plane client does with
// the same setting.
class EchoFloor {
 public:
  EchoFloor(size_t request_bytes, size_t reply_bytes, absl::Duration reply_poll, bool unix)
      : req_(request_bytes), rep_(reply_bytes), poll_(reply_poll), unix_(unix) {}
  ~EchoFloor() {
    if (thread_.joinable()) thread_.join();
    if (listen_ >= 0) close(listen_);
  }
  // Median and p99 of `n` round trips, in microseconds.
  absl::StatusOr<std::pair<double, double>> Measure(int n) {
    if (unix_) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return absl::UnavailableError("echo floor: socketpair");
      thread_ = std::thread([this, n, c = sv[1]] { Serve(c, n); });
      return Drive(sv[0], n);
    }
    listen_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (listen_ < 0 || bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listen_, 1) != 0 ||
        getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return absl::UnavailableError("echo floor: cannot listen on loopback");
    thread_ = std::thread([this, n] {
      const int c = accept(listen_, nullptr, nullptr);
      if (c < 0) return;
      const int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Serve(c, n);
    });
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
      return absl::UnavailableError("echo floor: cannot connect");
    const int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return Drive(s, n);
  }

 private:
  // The echo side on `c` (closed after n answers).
  void Serve(int c, int n) {
    std::vector<char> in(req_), out(rep_, 'r');
    for (int i = 0; i < n; ++i)
      if (!Io(c, in.data(), req_, false) || !Io(c, out.data(), rep_, true)) break;
    close(c);
  }
  // n timed round trips on `s` (then closed).
  absl::StatusOr<std::pair<double, double>> Drive(int s, int n) {
    std::vector<char> out(req_, 'q'), in(rep_);
    std::vector<double> us;
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      if (!Io(s, out.data(), req_, true)) break;
      const absl::Time until = absl::Now() + poll_;
      pollfd pfd{s, POLLIN, 0};
      while (poll_ > absl::ZeroDuration() && poll(&pfd, 1, 0) == 0 && absl::Now() < until) {
      }
      if (!Io(s, in.data(), rep_, false)) break;
      us.push_back(Micros(t0, Clock::now()));
    }
    close(s);
    if (us.size() != static_cast<size_t>(n)) return absl::UnavailableError("echo floor: connection broke");
    return std::make_pair(Percentile(us, 0.5), Percentile(us, 0.99));
  }
  static bool Io(int fd, char* p, size_t n, bool send_side) {
    for (size_t done = 0; done < n;) {
      const ssize_t r = send_side ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
      if (r <= 0) return false;
      done += static_cast<size_t>(r);
    }
    return true;
  }
  const size_t req_, rep_;
  const absl::Duration poll_;
  const bool unix_;
  int listen_ = -1;
  std::thread thread_;
};

struct Shape {
  std::string name;
  std::vector<int64_t> lengths;  // tokens per sequence at the start
};

// "BxC": B sequences of C tokens less a random 0..15 (the tail);
// "mixedB": B sequences of 1K..7K tokens.
absl::StatusOr<Shape> ParseShape(const std::string& s, std::mt19937_64& rng) {
  Shape out{s, {}};
  int64_t b = 0, c = 0;
  if (s.rfind("mixed", 0) == 0) {
    if (!absl::SimpleAtoi(s.substr(5), &b) || b < 1) return absl::InvalidArgumentError("bad shape " + s);
    std::uniform_int_distribution<int64_t> len(1024, 7168);
    for (int64_t i = 0; i < b; ++i) out.lengths.push_back(len(rng));
    return out;
  }
  std::vector<std::string> p = absl::StrSplit(s, 'x');
  if (p.size() != 2 || !absl::SimpleAtoi(p[0], &b) || !absl::SimpleAtoi(p[1], &c) || b < 1 || c < 32)
    return absl::InvalidArgumentError("bad shape " + s + " (want BxC or mixedB)");
  std::uniform_int_distribution<int64_t> tail(0, 15);
  for (int64_t i = 0; i < b; ++i) out.lengths.push_back(c - 16 + tail(rng));
  return out;
}

struct Samples {
  std::vector<double> call, service, kernel, device, step;
  double first_step = 0;  // µs of step -1, which uploads the context to the device
};

int Run(int argc, char** argv) {
  auto args = cli::Args::Parse(argc, argv, 1,
                               {"server", "data", "layers", "kv_heads", "q_heads", "head_dim", "format", "shapes",
                                "steps", "two_call_steps", "pool", "tensors", "reply_poll_us", "shared_mib", "doorbell"});
  if (!args.ok()) return Fail(args.status(), "arguments");
  const std::string server = args->Get("server", "localhost:50051");
  const std::string data = args->Get("data", "localhost:50052");
  const int layers = *args->GetInt("layers", 32), kv = *args->GetInt("kv_heads", 8),
            qh = *args->GetInt("q_heads", 32), d = *args->GetInt("head_dim", 128),
            steps = *args->GetInt("steps", 32), two_call_steps = *args->GetInt("two_call_steps", 4),
            pool = *args->GetInt("pool", 16), reply_poll_us = *args->GetInt("reply_poll_us", 0),
            shared_mib = *args->GetInt("shared_mib", 0);
  const std::string format = args->Get("format", "k4v4");
  const std::string tensors = args->Get("tensors", "raw");
  if (tensors != "raw" && tensors != "inline")
    return Fail(absl::InvalidArgumentError("--tensors is raw or inline"), "arguments");
  const int bs = 16;

  client::ClientOptions copts;
  copts.target = server;
  copts.deadline = absl::Seconds(600);
  auto c = client::Client::Connect(copts);
  if (!c.ok()) return Fail(c.status(), "connect");
  auto dp = client::DataPlaneClient::Connect({.target = data,
                                              .timeout = absl::Seconds(600),
                                              .reply_poll = absl::Microseconds(reply_poll_us),
                                              .shared_memory_bytes = static_cast<size_t>(shared_mib) << 20,
                                              .doorbell = *args->GetInt("doorbell", 0) != 0});
  if (!dp.ok()) return Fail(dp.status(), "data plane connect");
  const v1::RegisterModelRequest reg = client::ModelRegistration(
      absl::StrFormat("decode-loop-%s-%d", format, layers), layers, kv, qh, d, bs, format);
  const v1::ModelLayout* l = &reg.layout();
  auto model = (*c)->RegisterModel(reg);
  if (!model.ok()) return Fail(model.status(), "register");
  v1::PutHeader header;
  header.mutable_model()->set_model_id(model->model_id());
  header.mutable_model()->set_layout_fingerprint(model->layout_fingerprint());

  // The pool: distinct blocks encoded by the server, read back packed.
  std::vector<std::string> pool_payloads;
  {
    const std::vector<std::string> hashes = client::HashChain(4242, pool);
    std::vector<v1::PutBlock> dense;
    for (int i = 0; i < pool; ++i) dense.push_back(client::DenseBlock(*l, hashes[i], "", 7000 + i));
    if (auto r = (*c)->PutBlocks(header, dense); !r.ok()) return Fail(r.status(), "put pool");
    v1::GetBlocksRequest g;
    *g.mutable_model() = header.model();
    for (const auto& h : hashes) g.add_block_hashes(h);
    auto got = (*c)->GetBlocks(g);
    if (!got.ok()) return Fail(got.status(), "get pool");
    for (const auto& b : *got) pool_payloads.push_back(b.payload());
  }
  v1::PutHeader packed_header = header;
  packed_header.set_packed(true);

  std::mt19937_64 rng(2026);
  const v1::Tensor q = client::RandomTensor(v1::DTYPE_FP16, {1, qh, d}, 11);
  const v1::Tensor nk = client::RandomTensor(v1::DTYPE_FP16, {1, kv, d}, 12);
  const v1::Tensor nv = client::RandomTensor(v1::DTYPE_FP16, {1, kv, d}, 13);
  std::printf("model: %d layers, %d kv heads, %d q heads, d=%d, format %s, block %d tokens (%lld bytes)\n", layers,
              kv, qh, d, format.c_str(), bs, (long long)model->format().block_bytes());
  const std::vector<std::string> specs = absl::StrSplit(args->Get("shapes", "1x32768,64x4096,mixed64"), ',');
  for (const std::string& spec : specs) {
    auto shape = ParseShape(spec, rng);
    if (!shape.ok()) return Fail(shape.status(), "shapes");
    const size_t nseq = shape->lengths.size();
    // Store each sequence's full blocks (packed copies of pool blocks) and
    // create it with its tail.
    const auto put0 = Clock::now();
    uint64_t put_bytes = 0;
    std::vector<std::string> ids;
    for (size_t s = 0; s < nseq; ++s) {
      const int64_t len = shape->lengths[s], nblocks = len / bs, tail = len % bs;
      const std::vector<std::string> chain = client::HashChain(rng(), nblocks);
      for (int64_t b0 = 0; b0 < nblocks; b0 += 64) {
        std::vector<v1::PutBlock> batch;
        for (int64_t b = b0; b < std::min(nblocks, b0 + 64); ++b) {
          v1::PutBlock& pb = batch.emplace_back();
          pb.set_block_hash(chain[b]);
          if (b) pb.set_parent_hash(chain[b - 1]);
          pb.set_payload(pool_payloads[rng() % pool_payloads.size()]);
          put_bytes += pb.payload().size();
        }
        if (auto r = (*c)->PutBlocks(packed_header, batch); !r.ok()) return Fail(r.status(), "put context");
      }
      v1::CreateSequenceRequest cs;
      *cs.mutable_model() = header.model();
      for (const auto& h : chain) cs.add_block_hashes(h);
      if (tail > 0) {
        *cs.mutable_tail_k() = client::RandomTensor(v1::DTYPE_FP16, {layers, tail, kv, d}, rng());
        *cs.mutable_tail_v() = client::RandomTensor(v1::DTYPE_FP16, {layers, tail, kv, d}, rng());
      }
      cs.set_ttl_ms(3600 * 1000);
      auto seq = (*c)->CreateSequence(cs);
      if (!seq.ok()) return Fail(seq.status(), "create sequence");
      ids.push_back(seq->sequence_id());
    }
    const double put_s = Micros(put0, Clock::now()) / 1e6;

    // One call per layer: every sequence's new token and query.
    v1::AttendRequest one;
    for (const std::string& id : ids) {
      v1::AttendItem* it = one.add_items();
      it->set_sequence_id(id);
      *it->mutable_q() = q;
      *it->mutable_k() = nk;
      *it->mutable_v() = nv;
    }
    // The same call with the tensors beside the request: their bytes from
    // the worker's buffers (q, k, v per item), the outputs into `outputs`.
    v1::AttendRequest one_raw = one;
    std::vector<std::span<const char>> inputs;
    for (v1::AttendItem& it : *one_raw.mutable_items()) {
      it.mutable_q()->clear_data();
      it.mutable_k()->clear_data();
      it.mutable_v()->clear_data();
      inputs.insert(inputs.end(), {q.data(), nk.data(), nv.data()});
    }
    std::string outputs(nseq * q.data().size(), '\0');
    Samples s1, s2;
    auto run = [&](bool two_calls, int n, Samples* out) -> absl::Status {
      for (int step = -1; step < n; ++step) {  // step -1: uploads the context to the device
        const auto step0 = Clock::now();
        for (int layer = 0; layer < layers; ++layer) {
          one.set_layer(layer);
          const auto a = Clock::now();
          if (two_calls) {
            for (const std::string& id : ids) {
              v1::AppendRequest ap;
              ap.set_sequence_id(id);
              ap.set_layer(layer);
              *ap.mutable_k() = nk;
              *ap.mutable_v() = nv;
              if (auto r = (*dp)->Append(ap); !r.ok()) return r.status();
            }
            v1::AttendRequest at;
            at.set_layer(layer);
            for (const auto& it : one.items()) {
              v1::AttendItem* x = at.add_items();
              x->set_sequence_id(it.sequence_id());
              *x->mutable_q() = q;
            }
            auto r = (*dp)->Attend(at);
            if (!r.ok()) return r.status();
            if (step >= 0) {
              out->service.push_back(static_cast<double>(r->service_micros()));
              out->kernel.push_back(static_cast<double>(r->kernel_micros()));
              out->device.push_back(static_cast<double>(r->device_micros()));
            }
          } else {
            one_raw.set_layer(layer);
            auto r = tensors == "raw" ? (*dp)->Attend(one_raw, inputs, outputs) : (*dp)->Attend(one);
            if (!r.ok()) return r.status();
            if (step >= 0) {
              out->service.push_back(static_cast<double>(r->service_micros()));
              out->kernel.push_back(static_cast<double>(r->kernel_micros()));
              out->device.push_back(static_cast<double>(r->device_micros()));
            }
          }
          if (step >= 0) out->call.push_back(Micros(a, Clock::now()));
        }
        if (step >= 0) out->step.push_back(Micros(step0, Clock::now()));
        else out->first_step = Micros(step0, Clock::now());
      }
      return absl::OkStatus();
    };
    if (absl::Status st = run(false, steps, &s1); !st.ok()) return Fail(st, "decode loop " + spec);
    if (two_call_steps > 0)
      if (absl::Status st = run(true, two_call_steps, &s2); !st.ok()) return Fail(st, "two-call loop " + spec);
    for (const std::string& id : ids) {
      v1::DropSequenceRequest drop;
      drop.set_sequence_id(id);
      (void)(*c)->DropSequence(drop);
    }

    const size_t req_bytes = one.ByteSizeLong();
    const size_t rep_bytes = nseq * (static_cast<size_t>(qh) * d * 2 + 16) + 16;
    const bool unix = data.starts_with("unix:");
    EchoFloor echo(req_bytes, rep_bytes, absl::Microseconds(reply_poll_us), unix);
    auto floor = echo.Measure(2000);
    if (!floor.ok()) return Fail(floor.status(), "echo floor");
    int64_t tokens = 0;
    for (int64_t len : shape->lengths) tokens += len;
    const double layer_bytes = static_cast<double>(model->format().block_bytes()) / layers / bs * tokens;
    std::vector<double> transport, service, host;
    for (size_t i = 0; i < s1.call.size(); ++i) {
      transport.push_back(s1.call[i] - s1.service[i]);
      service.push_back(s1.service[i] - s1.kernel[i]);
      host.push_back(s1.kernel[i] - s1.device[i]);
    }
    const double call = Percentile(s1.call, 0.5), dev = Percentile(s1.device, 0.5);
    std::printf(
        "\n[%s] %zu sequences, %lld tokens (%.2f GB packed, put in %.1f s), %d steps x %d layers\n"
        "  per-layer call (one call: append + attend, %s tensors): median %.0f us, p99 %.0f us\n"
        "    transport + framing %.0f us | service host work %.0f us | backend host work %.0f us | device "
        "(kernels) %.0f us "
        "(%.1f MB of pages a layer, %.2f TB/s)\n"
        "  step (%d layers): median %.2f ms, p99 %.2f ms; the first (uploads the context to the device): %.1f ms\n"
        "  call / device: %.2fx   raw %s round trip of the same %zu + %zu bytes: median %.0f us, p99 "
        "%.0f us\n",
        spec.c_str(), nseq, (long long)tokens, put_bytes / 1e9, put_s, steps, layers, tensors.c_str(), call,
        Percentile(s1.call, 0.99), Percentile(transport, 0.5), Percentile(service, 0.5), Percentile(host, 0.5), dev, layer_bytes / 1e6,
        dev > 0 ? layer_bytes / dev / 1e6 : 0.0, layers, Percentile(s1.step, 0.5) / 1e3,
        Percentile(s1.step, 0.99) / 1e3, s1.first_step / 1e3, dev > 0 ? call / dev : 0.0, unix ? "Unix-socket" : "loopback TCP",
        req_bytes, rep_bytes, floor->first,
        floor->second);
    if (!s2.call.empty())
      std::printf("  two calls (%zu Append + 1 Attend a layer): per-layer median %.0f us, step median %.2f ms "
                  "(%.2fx the one-call step)\n",
                  nseq, Percentile(s2.call, 0.5), Percentile(s2.step, 0.5) / 1e3,
                  Percentile(s2.step, 0.5) / std::max(1.0, Percentile(s1.step, 0.5)));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace tqkv

int main(int argc, char** argv) { return tqkv::Run(argc, argv); }
