#include "codec/model_codec.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "codec/memory_report.h"
#include "codec/test_util.h"

namespace tqkv {
namespace {

TEST(ModelCodec, BlockLayoutAndAccounting) {
  ModelShape s{4, 8, 32, 128, 16};
  CodecOptions o;
  o.format = "k4v2";
  o.dense_first_layers = 1;
  auto m = ModelCodec::Create(s, o, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  const size_t rows = 16 * 8;
  EXPECT_EQ((*m)->k_page_bytes(0), rows * 256);  // layer 0 dense
  EXPECT_EQ((*m)->k_page_bytes(1), rows * 68);
  EXPECT_EQ((*m)->v_page_bytes(1), rows * 36);
  EXPECT_EQ((*m)->layer_offset(1), rows * 512);
  EXPECT_EQ((*m)->block_bytes(), rows * 512 + 3 * rows * 104);
  const BlockBytes& a = (*m)->block_accounting();
  EXPECT_EQ(a.dense_equivalent, 4 * rows * 512);
  EXPECT_EQ(a.dense_rows, rows * 512);
  EXPECT_EQ(a.packed_k, 3 * rows * 64);
  EXPECT_EQ(a.packed_v, 3 * rows * 32);
  EXPECT_EQ(a.norms, 3 * rows * 8);
  EXPECT_EQ(a.packed_k + a.packed_v + a.norms + a.dense_rows, a.total);
  EXPECT_EQ((*m)->layer_range_bytes(1, 4), 3 * rows * 104);
  MemoryReport r = ReportForBlocks(**m, 10, 0);
  EXPECT_EQ(r.total_bytes(), 10 * a.total);
  EXPECT_NEAR(r.ratio(), double(4 * 512) / (512 + 3 * 104), 1e-12);
  EXPECT_NE(r.ToString().find("baseline=\"fp16 dense K+V\""), std::string::npos);
}

TEST(ModelCodec, Tq4RatioVsFp16) {
  auto m = *ModelCodec::Create({1, 8, 32, 128, 16}, {.format = "tq4"}, nullptr);
  EXPECT_NEAR(ReportForBlocks(*m, 1, 0).ratio(), 256.0 / 68.0, 1e-12);  // 3.76x
  auto m42 = *ModelCodec::Create({1, 8, 32, 128, 16}, {.format = "k4v2"}, nullptr);
  EXPECT_NEAR(ReportForBlocks(*m42, 1, 0).ratio(), 512.0 / 104.0, 1e-12);  // 4.92x
}

TEST(ModelCodec, ErrorsNameTheProblem) {
  EXPECT_EQ(ModelCodec::Create({0, 8, 32, 128, 16}, {}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad_gqa = ModelCodec::Create({1, 8, 12, 128, 16}, {}, nullptr);
  EXPECT_NE(bad_gqa.status().message().find("num_q_heads 12"), std::string::npos);
  EXPECT_EQ(ModelCodec::Create({1, 8, 32, 128, 16}, {.format = "k9v9"}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto no_meta = ModelCodec::Create({1, 8, 32, 128, 16}, {.format = "turboquant35"}, nullptr);
  EXPECT_EQ(no_meta.status().code(), absl::StatusCode::kFailedPrecondition);
  RecipeMetadata meta = testing_util::MakeMetadata("turboquant35", 128, 1, 8);
  EXPECT_TRUE(ModelCodec::Create({1, 8, 32, 128, 16}, {.format = "turboquant35"}, &meta).ok());
  // Wrong recipe / too few layers in the metadata.
  EXPECT_FALSE(ModelCodec::Create({1, 8, 32, 128, 16}, {.format = "turboquant25"}, &meta).ok());
  auto missing = ModelCodec::Create({2, 8, 32, 128, 16}, {.format = "turboquant35"}, &meta);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("layer 1"), std::string::npos) << missing.status();
}

// A codec whose rotations and matrices would not fit the memory limit is
// refused from its first head, before the rest is built: 256 layers x 256 kv
// heads with dense QR rotations (64 KiB each at d = 128) would hold ~8.6 GB.
TEST(ModelCodec, RefusesACodecOverItsMemoryLimit) {
  const ModelShape huge{256, 256, 256, 128, 16};
  auto refused = ModelCodec::Create(huge, {.rotation = RotationKind::kQr, .max_build_work = 0}, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("the limit is 536870912"), std::string::npos) << refused.status();
  // The same shape fits a limit sized for it, and a small model fits the default.
  auto small = ModelCodec::Create({2, 8, 32, 128, 16}, {.rotation = RotationKind::kQr}, nullptr);
  ASSERT_TRUE(small.ok()) << small.status();
  const uint64_t per_head = (*small)->layer(0).k(0).HeapBytes() + (*small)->layer(0).v(0).HeapBytes();
  EXPECT_GT(per_head, 2u * 128 * 128 * sizeof(float));  // two dense 128 x 128 rotations
  EXPECT_EQ(ModelCodec::Create({4, 8, 32, 128, 16}, {.rotation = RotationKind::kQr, .max_codec_bytes = 4 * 8 * per_head - 1},
                               nullptr)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      ModelCodec::Create({4, 8, 32, 128, 16}, {.rotation = RotationKind::kQr, .max_codec_bytes = 4 * 8 * per_head}, nullptr)
          .ok());
}

// A codec whose build would take too long is refused before anything is
// built: QR rotations cost ~(4/3)·d³ each (d = 122 has no Hadamard), the
// Hadamard ones next to nothing.
TEST(ModelCodec, RefusesACodecOverItsBuildWork) {
  const ModelShape s{2, 1, 1, 122, 16};
  const uint64_t work = BuildWork(s, {});
  EXPECT_EQ(work, 2u * 1 * 2 * (4u * 122 * 122 * 122 / 3 + 122 * 122));
  auto refused = ModelCodec::Create(s, {.max_build_work = work - 1}, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find(absl::StrCat("the limit is ", work - 1)), std::string::npos)
      << refused.status();
  EXPECT_TRUE(ModelCodec::Create(s, {.max_build_work = work}, nullptr).ok());
  // 256 layers x 256 kv heads at d = 122 (the default limit: refused at
  // once) or at d = 128 with Hadamard rotations (cheap).
  const auto start = absl::Now();
  EXPECT_EQ(ModelCodec::Create({256, 256, 256, 122, 16}, {}, nullptr).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_LT(BuildWork({256, 256, 256, 128, 16}, {}), uint64_t{1} << 33);
}

TEST(ModelCodec, SeedsDifferPerLayerHeadAndComponent) {
  auto m = *ModelCodec::Create({2, 2, 2, 128, 16}, {.format = "k4v4", .seed = 5}, nullptr);
  EXPECT_NE(m->layer(0).k(0).groups()[0].rotation.signs1(), m->layer(0).k(1).groups()[0].rotation.signs1());
  EXPECT_NE(m->layer(0).k(0).groups()[0].rotation.signs1(), m->layer(1).k(0).groups()[0].rotation.signs1());
  EXPECT_NE(m->layer(0).k(0).groups()[0].rotation.signs1(), m->layer(0).v(0).groups()[0].rotation.signs1());
}

}  // namespace
}  // namespace tqkv
