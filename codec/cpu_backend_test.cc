#include "codec/cpu_backend.h"

#include <gtest/gtest.h>

#include "codec/quality.h"
#include "codec/test_util.h"

namespace tqkv {
namespace {

using testing_util::RandomRows;
using testing_util::ToHalf;

TEST(CpuBackend, EncodeDecodeAttendBlocks) {
  ModelShape s{3, 2, 4, 64, 16};
  auto codec = *ModelCodec::Create(s, {.format = "k4v4", .dense_last_layers = 1}, nullptr);
  CpuBackend backend({.threads = 1});
  const int blocks = 3;
  std::vector<std::vector<uint8_t>> payloads(blocks, std::vector<uint8_t>(codec->block_bytes()));
  std::vector<std::vector<uint16_t>> dense_k, dense_v;  // [block][layer] flattened
  for (int b = 0; b < blocks; ++b) {
    std::vector<DenseView> k, v;
    std::vector<std::vector<uint16_t>> hk, hv;
    for (int l = 0; l < 3; ++l) {
      hk.push_back(ToHalf(RandomRows(16 * 2, 64, 100 * b + l)));
      hv.push_back(ToHalf(RandomRows(16 * 2, 64, 100 * b + l + 50)));
    }
    for (int l = 0; l < 3; ++l) {
      k.push_back({hk[l].data(), DType::kF16, 16, 2, 64});
      v.push_back({hv[l].data(), DType::kF16, 16, 2, 64});
    }
    ASSERT_TRUE(backend.EncodeBlock(*codec, 0, 3, k, v, payloads[b].data()).ok());
    // Re-encoding only layers [1, 3) into the same offset gives identical bytes.
    std::vector<uint8_t> part(codec->layer_range_bytes(1, 3));
    ASSERT_TRUE(backend.EncodeBlock(*codec, 1, 3, {k[1], k[2]}, {v[1], v[2]}, part.data()).ok());
    EXPECT_EQ(0, memcmp(part.data(), payloads[b].data() + codec->layer_offset(1), part.size()));
    // Decode layer 2 (dense) gives back the fp16 input exactly.
    std::vector<uint16_t> ok(16 * 2 * 64), ov(16 * 2 * 64);
    ASSERT_TRUE(backend
                    .DecodeBlock(*codec, 2, 3, payloads[b].data() + codec->layer_offset(2),
                                 {{ok.data(), DType::kF16, 16, 2, 64}},
                                 {{ov.data(), DType::kF16, 16, 2, 64}})
                    .ok());
    EXPECT_EQ(ok, hk[2]);
    EXPECT_EQ(ov, hv[2]);
  }
  AttendBatch batch;
  batch.layer = 0;
  batch.shape = {4, 2, 64, 0};
  AttendSequence seq;
  std::vector<BlockRef> refs;
  for (int b = 0; b < blocks; ++b) refs.push_back({uint64_t(b + 1), payloads[b].data()});
  seq.blocks = refs;
  seq.packed_tokens = 40;
  std::vector<float> q = RandomRows(4, 64, 7);
  std::vector<float> out(4 * 64);
  seq.q = q.data();
  seq.out = out.data();
  batch.sequences = {seq};
  batch.query_offsets = {0, 1};
  batch.positions = {39};
  ASSERT_TRUE(backend.Attend(*codec, batch).ok());
  PackedSequence ps;
  for (int b = 0; b < blocks; ++b) {
    ps.k_pages.push_back(payloads[b].data());
    ps.v_pages.push_back(payloads[b].data() + codec->k_page_bytes(0));
  }
  ps.packed_tokens = 40;
  std::vector<float> dk, dv;
  DequantizeSequence(codec->layer(0), 16, ps, &dk, &dv);
  std::vector<double> ref(4 * 64);
  int64_t pos = 39;
  ReferenceAttention(batch.shape, q.data(), 1, &pos, dk.data(), dv.data(), 40, ref.data());
  EXPECT_LT(RelativeError(ref.data(), out.data(), ref.size()), 2e-5);
  // fp16 and bf16 queries come back as outputs of the same dtype: the fp32
  // result of the same (rounded) queries, rounded once.
  for (DType t : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> q16(q.size()), out16(q.size());
    FromFloat(t, q.data(), q16.data(), q.size());
    std::vector<float> q_rounded(q.size()), out32(q.size()), want(q.size());
    ToFloat(t, q16.data(), q_rounded.data(), q.size());
    AttendBatch b16 = batch;
    b16.sequences[0].q = q_rounded.data();
    b16.sequences[0].out = out32.data();
    ASSERT_TRUE(backend.Attend(*codec, b16).ok());
    b16.sequences[0] = {.blocks = refs, .packed_tokens = 40, .q = q16.data(), .out = out16.data(), .dtype = t};
    ASSERT_TRUE(backend.Attend(*codec, b16).ok());
    std::vector<uint16_t> want16(q.size());
    FromFloat(t, out32.data(), want16.data(), q.size());
    EXPECT_EQ(out16, want16) << DTypeName(t);
  }
  // Bad batches are rejected.
  AttendBatch no_out = batch;
  no_out.sequences[0].out = nullptr;
  EXPECT_EQ(backend.Attend(*codec, no_out).code(), absl::StatusCode::kInvalidArgument);
  batch.positions = {40};
  EXPECT_EQ(backend.Attend(*codec, batch).code(), absl::StatusCode::kInvalidArgument);
  batch.positions = {39};
  batch.layer = 3;
  EXPECT_EQ(backend.Attend(*codec, batch).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackend, EncodeRejectsBadShapes) {
  auto codec = *ModelCodec::Create({2, 2, 2, 64, 16}, {}, nullptr);
  CpuBackend backend({.threads = 0});
  std::vector<float> x(17 * 2 * 64);
  std::vector<uint8_t> out(codec->block_bytes());
  DenseView too_long{x.data(), DType::kF32, 17, 2, 64};
  EXPECT_EQ(backend.EncodeBlock(*codec, 0, 1, {too_long}, {too_long}, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  DenseView ok{x.data(), DType::kF32, 16, 2, 64};
  EXPECT_EQ(backend.EncodeBlock(*codec, 0, 3, {ok, ok, ok}, {ok, ok, ok}, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.EncodeBlock(*codec, 0, 2, {ok}, {ok}, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv
