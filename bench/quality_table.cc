// Quality of every format at context 4K, d = 128, 8 kv heads, 32 q heads:
// keys are Gaussian with a few high-variance outlier channels (like real
// post-RoPE keys), values are Gaussian. Recipes use metadata calibrated on
// the same keys/values (activation energy). Prints a markdown table:
// K/V cosine, relative MSE, decode attention-output relative error vs fp64
// dense attention, and top-32 attention-weight agreement.
// Run: bazel run -c opt //bench:quality_table
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "codec/attention.h"
#include "codec/calibration.h"
#include "codec/page_codec.h"
#include "codec/quality.h"
#include "codec/test_util.h"

namespace tqkv {
namespace {

constexpr int kDim = 128, kHeads = 8, kQHeads = 32, kTokens = 4096, kBlock = 16;

int Run() {
  // Keys: 6 outlier channels per head at 8x scale; values plain Gaussian.
  std::vector<float> k = testing_util::RandomRows(int64_t(kTokens) * kHeads, kDim, 1, 6, 8.0f);
  std::vector<float> v = testing_util::RandomRows(int64_t(kTokens) * kHeads, kDim, 2);
  std::vector<float> q = testing_util::RandomRows(kQHeads, kDim, 3);
  for (float& x : q) x *= 0.25f;
  ActivationEnergyAccumulator acc(1, kHeads, kDim);
  (void)acc.Observe(0, Component::kKey, k.data(), kTokens);
  (void)acc.Observe(0, Component::kValue, v.data(), kTokens);
  AttentionShape shape{kQHeads, kHeads, kDim, 0};
  const int64_t pos = kTokens - 1;
  std::vector<double> ref(kQHeads * kDim);
  ReferenceAttention(shape, q.data(), 1, &pos, k.data(), v.data(), kTokens, ref.data());
  // Reference attention weights of q head 0 (for top-k agreement).
  auto weights = [&](const std::vector<float>& keys) {
    std::vector<double> w(kTokens);
    for (int t = 0; t < kTokens; ++t) {
      double dot = 0;
      for (int j = 0; j < kDim; ++j) dot += double(q[j]) * keys[(t * kHeads) * kDim + j];
      w[t] = dot;
    }
    return w;
  };
  const std::vector<double> ref_w = weights(k);
  std::printf("| format | K cosine | V cosine | K rel. MSE | V rel. MSE | attn out rel. err | top-32 agree | ratio vs fp16 |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> names = AllFormatNames();
  for (const std::string& name : names) {
    Format f = *ParseFormat(name);
    RecipeMetadata meta;
    if (f.needs_metadata()) meta = *acc.BuildMetadata(name.substr(0, 12), "synthetic");
    auto codec = ModelCodec::Create({1, kHeads, kQHeads, kDim, kBlock}, {.format = name},
                                    f.needs_metadata() ? &meta : nullptr);
    if (!codec.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(codec.status().message()).c_str());
      return 1;
    }
    PageGeometry kg = (*codec)->k_geometry(0), vg = (*codec)->v_geometry(0);
    kg.num_blocks = vg.num_blocks = kTokens / kBlock;
    std::vector<uint8_t> kp(kg.total_bytes()), vp(vg.total_bytes());
    std::vector<int64_t> slots(kTokens);
    for (int t = 0; t < kTokens; ++t) slots[t] = t;
    ThreadPool pool(1);
    (void)EncodeToPages((*codec)->layer(0), {k.data(), DType::kF32, kTokens, kHeads, kDim},
                        {v.data(), DType::kF32, kTokens, kHeads, kDim}, slots.data(),
                        {kp.data(), kg}, {vp.data(), vg}, &pool);
    PackedSequence seq;
    for (int b = 0; b < kTokens / kBlock; ++b) {
      seq.k_pages.push_back(kp.data() + b * kg.page_bytes());
      seq.v_pages.push_back(vp.data() + b * vg.page_bytes());
    }
    seq.packed_tokens = kTokens;
    std::vector<float> dk, dv;
    DequantizeSequence((*codec)->layer(0), kBlock, seq, &dk, &dv);
    std::vector<float> out(kQHeads * kDim);
    (void)AttendPacked((*codec)->layer(0), kBlock, shape, seq, q.data(), 1, &pos, out.data(), &pool);
    const size_t rows = size_t(kTokens) * kHeads;
    const double ratio = 4.0 * kDim / double((*codec)->layer(0).k_row_bytes() + (*codec)->layer(0).v_row_bytes());
    std::printf("| %s | %.4f | %.4f | %.4f | %.4f | %.4f | %.2f | %.2fx |\n", name.c_str(),
                MeanCosine(k.data(), dk.data(), rows, kDim), MeanCosine(v.data(), dv.data(), rows, kDim),
                RelativeMse(k.data(), dk.data(), k.size()), RelativeMse(v.data(), dv.data(), v.size()),
                RelativeError(ref.data(), out.data(), ref.size()), TopKAgreement(ref_w, weights(dk), 32),
                ratio);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace tqkv

int main() { return tqkv::Run(); }
