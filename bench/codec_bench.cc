// Encode/decode throughput of every format at d = 128 on one core.
// Bytes counted: fp16 input read (encode) or fp16 output written (decode).
// Run: bazel run -c opt //bench:codec_bench -- --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "codec/metadata.h"
#include "codec/page_codec.h"
#include "codec/test_util.h"

namespace tqkv {
namespace {

constexpr int kDim = 128, kHeads = 8, kTokens = 4096;

struct Setup {
  std::unique_ptr<ModelCodec> codec;
  std::vector<uint16_t> k, v;
  std::vector<uint8_t> kp, vp;
  std::vector<int64_t> slots;
  PagesView kv, vv;
};

Setup MakeSetup(const std::string& format) {
  Setup s;
  auto fmt = *ParseFormat(format);
  RecipeMetadata meta;
  if (fmt.needs_metadata()) meta = testing_util::MakeMetadata(format.substr(0, 12), kDim, 1, kHeads);
  s.codec = *ModelCodec::Create({1, kHeads, kHeads * 4, kDim, 16}, {.format = format},
                                fmt.needs_metadata() ? &meta : nullptr);
  s.k = testing_util::ToHalf(testing_util::RandomRows(int64_t(kTokens) * kHeads, kDim, 1, 4));
  s.v = testing_util::ToHalf(testing_util::RandomRows(int64_t(kTokens) * kHeads, kDim, 2));
  PageGeometry kg = s.codec->k_geometry(0), vg = s.codec->v_geometry(0);
  kg.num_blocks = vg.num_blocks = kTokens / 16;
  s.kp.resize(kg.total_bytes());
  s.vp.resize(vg.total_bytes());
  s.kv = {s.kp.data(), kg};
  s.vv = {s.vp.data(), vg};
  s.slots.resize(kTokens);
  for (int t = 0; t < kTokens; ++t) s.slots[t] = t;
  return s;
}

void BM_Encode(benchmark::State& state, std::string format) {
  Setup s = MakeSetup(format);
  DenseView k{s.k.data(), DType::kF16, kTokens, kHeads, kDim};
  DenseView v{s.v.data(), DType::kF16, kTokens, kHeads, kDim};
  for (auto _ : state) {
    absl::Status st = EncodeToPages(s.codec->layer(0), k, v, s.slots.data(), s.kv, s.vv, nullptr);
    if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
    benchmark::DoNotOptimize(s.kp.data());
  }
  state.SetBytesProcessed(state.iterations() * int64_t(k.bytes() + v.bytes()));
  state.counters["rows/s"] = benchmark::Counter(double(state.iterations()) * kTokens * kHeads * 2,
                                                benchmark::Counter::kIsRate);
}

void BM_Decode(benchmark::State& state, std::string format) {
  Setup s = MakeSetup(format);
  DenseView k{s.k.data(), DType::kF16, kTokens, kHeads, kDim};
  DenseView v{s.v.data(), DType::kF16, kTokens, kHeads, kDim};
  (void)EncodeToPages(s.codec->layer(0), k, v, s.slots.data(), s.kv, s.vv, nullptr);
  std::vector<uint16_t> ko(s.k.size()), vo(s.v.size());
  for (auto _ : state) {
    absl::Status st = DecodeFromPages(s.codec->layer(0), s.kv, s.vv, s.slots.data(), kTokens,
                                      {ko.data(), DType::kF16, kTokens, kHeads, kDim},
                                      {vo.data(), DType::kF16, kTokens, kHeads, kDim}, nullptr);
    if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
    benchmark::DoNotOptimize(ko.data());
  }
  state.SetBytesProcessed(state.iterations() * int64_t(k.bytes() + v.bytes()));
}

int Register() {
  for (const char* f : {"k4v4", "k4v2", "k2v2", "k3v3", "k5v5", "k8v8", "turboquant25",
                        "turboquant35", "turboquant25_noqjl", "turboquant35_noqjl"}) {
    benchmark::RegisterBenchmark((std::string("Encode/") + f).c_str(), BM_Encode, std::string(f))
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("Decode/") + f).c_str(), BM_Decode, std::string(f))
        ->Unit(benchmark::kMillisecond);
  }
  return 0;
}
const int registered = Register();

}  // namespace
}  // namespace tqkv

BENCHMARK_MAIN();
