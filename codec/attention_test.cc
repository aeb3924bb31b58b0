#include "codec/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "codec/page_codec.h"
#include "codec/quality.h"
#include "codec/test_util.h"

namespace tqkv {
namespace {

using testing_util::RandomRows;

TEST(ReferenceAttention, SingleKeyReturnsItsValue) {
  AttentionShape s{2, 1, 8, 0};
  std::vector<float> q = RandomRows(2, 8, 1), k = RandomRows(1, 8, 2), v = RandomRows(1, 8, 3);
  int64_t pos = 0;
  std::vector<double> out(16);
  ReferenceAttention(s, q.data(), 1, &pos, k.data(), v.data(), 1, out.data());
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 8; ++j) EXPECT_DOUBLE_EQ(out[h * 8 + j], v[j]);
}

TEST(ReferenceAttention, UniformScoresAverageValues) {
  AttentionShape s{1, 1, 8, 0};
  std::vector<float> q(8, 0.0f), k = RandomRows(3, 8, 2), v = RandomRows(3, 8, 3);
  int64_t pos = 2;
  std::vector<double> out(8);
  ReferenceAttention(s, q.data(), 1, &pos, k.data(), v.data(), 3, out.data());
  for (int j = 0; j < 8; ++j) EXPECT_NEAR(out[j], (double(v[j]) + v[8 + j] + v[16 + j]) / 3, 1e-12);
  // Causal: position 0 sees only the first token.
  pos = 0;
  ReferenceAttention(s, q.data(), 1, &pos, k.data(), v.data(), 3, out.data());
  for (int j = 0; j < 8; ++j) EXPECT_DOUBLE_EQ(out[j], v[j]);
}

// The packed CPU path equals fp64 attention over the same dequantized K/V
// (partial last block, dense tail, GQA, every format family).
TEST(AttendPacked, MatchesReferenceOverDequantizedRows) {
  for (const std::string name : {"k4v4", "k4v2", "k3v3", "turboquant25", "turboquant35_noqjl", "fp16"}) {
    const int heads = 2, qheads = 6, dim = 128, bs = 16, layers = 1;
    auto fmt = *ParseFormat(name);
    RecipeMetadata meta;
    if (fmt.needs_metadata()) meta = testing_util::MakeMetadata(name.substr(0, 12), dim, layers, heads);
    auto codec = *ModelCodec::Create({layers, heads, qheads, dim, bs}, {.format = name},
                                     fmt.needs_metadata() ? &meta : nullptr);
    const LayerCodec& layer = codec->layer(0);
    const int64_t packed = 37, tail = 5;  // 3 blocks, last one partial
    const int blocks = 3;
    PageGeometry kg = codec->k_geometry(0), vg = codec->v_geometry(0);
    kg.num_blocks = vg.num_blocks = blocks;
    std::vector<uint8_t> kp(kg.total_bytes(), 0), vp(vg.total_bytes(), 0);
    std::vector<float> k = RandomRows(packed * heads, dim, 1, 3), v = RandomRows(packed * heads, dim, 2);
    std::vector<int64_t> slots(packed);
    for (int64_t t = 0; t < packed; ++t) slots[t] = t;
    ASSERT_TRUE(EncodeToPages(layer, {k.data(), DType::kF32, packed, heads, dim},
                              {v.data(), DType::kF32, packed, heads, dim}, slots.data(),
                              {kp.data(), kg}, {vp.data(), vg}, nullptr)
                    .ok());
    std::vector<float> tk = RandomRows(tail * heads, dim, 3), tv = RandomRows(tail * heads, dim, 4);
    PackedSequence seq;
    for (int b = 0; b < blocks; ++b) {
      seq.k_pages.push_back(kp.data() + b * kg.page_bytes());
      seq.v_pages.push_back(vp.data() + b * vg.page_bytes());
    }
    seq.packed_tokens = packed;
    seq.tail_k = {tk.data(), DType::kF32, tail, heads, dim};
    seq.tail_v = {tv.data(), DType::kF32, tail, heads, dim};
    std::vector<float> dk, dv;
    DequantizeSequence(layer, bs, seq, &dk, &dv);
    AttentionShape s{qheads, heads, dim, 0};
    const int64_t nq = 3;
    std::vector<float> q = RandomRows(nq * qheads, dim, 9);
    for (float& x : q) x *= 0.3f;
    std::vector<int64_t> pos = {packed + tail - 1, 20, packed};
    std::vector<double> ref(nq * qheads * dim);
    ReferenceAttention(s, q.data(), nq, pos.data(), dk.data(), dv.data(), packed + tail, ref.data());
    std::vector<float> out(ref.size());
    ThreadPool pool(1);
    ASSERT_TRUE(AttendPacked(layer, bs, s, seq, q.data(), nq, pos.data(), out.data(), &pool).ok());
    EXPECT_LT(RelativeError(ref.data(), out.data(), ref.size()), 2e-5) << name;
    double norm = 0;
    for (float x : out) norm += x * x;
    EXPECT_GT(norm, 1e-3) << "output is trivially zero";
  }
}

TEST(AttendPacked, RejectsBadPositions) {
  auto codec = *ModelCodec::Create({1, 1, 1, 64, 16}, {}, nullptr);
  PackedSequence seq;
  float q[64] = {0};
  float out[64];
  int64_t pos = 0;
  EXPECT_EQ(AttendPacked(codec->layer(0), 16, {1, 1, 64, 0}, seq, q, 1, &pos, out, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv
