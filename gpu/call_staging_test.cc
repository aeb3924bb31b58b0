// The host side of a call's staging: the dtype its queries travel in and
// the layout of its packs (no GPU needed).
#include "gpu/call_staging.h"

#include <gtest/gtest.h>

#include <vector>

#include "gpu/gpu_codec.h"

namespace tqkv::gpu {
namespace {

AttendBatch Batch(std::vector<DType> dtypes, std::vector<int64_t> queries) {
  AttendBatch b;
  b.query_offsets = {0};
  for (size_t i = 0; i < dtypes.size(); ++i) {
    AttendSequence s;
    s.dtype = dtypes[i];
    b.sequences.push_back(s);
    b.query_offsets.push_back(b.query_offsets.back() + queries[i]);
  }
  return b;
}

TEST(CallStagingTest, LargeSixteenBitCallsConvertOnTheDevice) {
  const size_t big = WireIo::kMinElems, small = WireIo::kMinElems - 1;
  WireIo w = ChooseWireIo(Batch({DType::kF16, DType::kF16}, {1, 1}), big);
  EXPECT_TRUE(w.on_device);
  EXPECT_EQ(w.gpu_dtype(), kGpuF16);
  EXPECT_EQ(ChooseWireIo(Batch({DType::kBF16}, {1}), big).gpu_dtype(), kGpuBF16);
  EXPECT_FALSE(ChooseWireIo(Batch({DType::kF16}, {1}), small).on_device) << "too small to pay two launches";
  EXPECT_FALSE(ChooseWireIo(Batch({DType::kF32}, {1}), big).on_device);
  EXPECT_FALSE(ChooseWireIo(Batch({DType::kF16, DType::kBF16}, {1, 1}), big).on_device) << "mixed dtypes";
  // A sequence without queries has no say.
  EXPECT_TRUE(ChooseWireIo(Batch({DType::kF32, DType::kBF16}, {0, 2}), big).on_device);
}

TEST(CallStagingTest, PacksStageTheirRowsAndTokenSlots) {
  auto codec = *ModelCodec::Create({2, 2, 4, 128, 16}, {.format = "k4v4"}, nullptr);
  const size_t row = 2 * 128, rows = 16;
  std::vector<float> k0(rows * row, 1.0f), v0(rows * row, 2.0f);
  std::vector<uint16_t> k1(rows * row, 0x3c00), v1(rows * row, 0x4000);  // fp16 1.0 and 2.0
  std::vector<uint8_t> out0(codec->layer_range_bytes(1, 2)), out1(out0.size());
  AttendBatch b;
  b.layer = 1;
  b.packs = {{{k0.data(), DType::kF32, 16, 2, 128}, {v0.data(), DType::kF32, 16, 2, 128}, out0.data(), 7},
             {{k1.data(), DType::kF16, 16, 2, 128}, {v1.data(), DType::kF16, 16, 2, 128}, out1.data(), 8}};
  PackPlan p = PlanPacks(*codec, b, {5, 9});
  EXPECT_EQ(p.dtype, DType::kF32) << "dtypes differ: fp32 for both";
  EXPECT_EQ(p.layer_bytes, out0.size());
  Staging st;
  p.AddInputs(st);
  const size_t in = st.size();
  p.AddOutputs(st);
  EXPECT_GE(p.out_off, in);
  std::vector<uint8_t> h(st.size(), 0xAB);
  p.Stage(b, h.data());
  const float* k = reinterpret_cast<const float*>(h.data() + p.k_off);
  const float* v = reinterpret_cast<const float*>(h.data() + p.v_off);
  EXPECT_EQ(k[0], 1.0f);
  EXPECT_EQ(k[rows * row], 1.0f) << "the fp16 pack converted";
  EXPECT_EQ(v[2 * rows * row - 1], 2.0f);
  const int64_t* tok = reinterpret_cast<const int64_t*>(h.data() + p.slots_off);
  EXPECT_EQ(tok[0], 5 * 16);
  EXPECT_EQ(tok[15], 5 * 16 + 15);
  EXPECT_EQ(tok[16], 9 * 16);
  for (size_t i = 0; i < 2 * p.layer_bytes; ++i) h[p.out_off + i] = static_cast<uint8_t>(i);
  p.Deliver(b, h.data());
  EXPECT_EQ(out0[3], 3);
  EXPECT_EQ(out1[0], static_cast<uint8_t>(p.layer_bytes));
}

}  // namespace
}  // namespace tqkv::gpu
