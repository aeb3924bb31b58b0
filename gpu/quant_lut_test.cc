// Quantisation tables (gpu/quant_lut.h) vs the brute-force count of
// boundaries below y, for every codebook the specialised encode serves
// (d = 128; 2, 3, 4 and 8 bits), through the host emulation of the device
// arithmetic. CPU only: runs without a GPU.
#include "gpu/quant_lut.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/codebook.h"

namespace tqkv::gpu {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Cells allowed for a codebook in this test: the encode's limit where it
// uses tables; 2-bit (which it does not) checked at 32 cells as well.
int MaxCells(int bits) { return LutMaxCells(bits) > 0 ? LutMaxCells(bits) : 32; }

class ServedCodebook : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    auto cb = GetCodebook(128, GetParam());
    ASSERT_TRUE(cb.ok()) << cb.status();
    b_ = (*cb)->boundaries_f;
    auto t = BuildQuantLut(b_.data(), static_cast<int>(b_.size()), MaxCells(GetParam()));
    ASSERT_TRUE(t.has_value()) << "no table for d=128 b=" << GetParam();
    t_ = *std::move(t);
  }
  // Checks one value: the cell is inside the table and the index equals the
  // brute-force count (NaN → 0). Returns false (once reported) on mismatch.
  bool Check(float y) {
    const uint32_t c = QuantLutCell(t_.scale, t_.offset, t_.cells, y);
    const int want = NearestIndex(b_.data(), static_cast<int>(b_.size()), y);
    if (c >= static_cast<uint32_t>(t_.cells)) {
      ADD_FAILURE() << "cell " << c << " outside the table for y = " << y;
      return false;
    }
    const int got = QuantLutIndex(t_, y);
    if (got != want) {
      uint32_t bits;
      std::memcpy(&bits, &y, 4);
      ADD_FAILURE() << "y = " << y << " (0x" << std::hex << bits << std::dec << "): table " << got
                    << ", count " << want << " (cell " << c << ")";
      return false;
    }
    return true;
  }
  std::vector<float> b_;
  QuantLut t_;
};

TEST_P(ServedCodebook, TableIsSmallAndWellFormed) {
  EXPECT_GE(t_.cells, static_cast<int>(b_.size()));
  EXPECT_LE(t_.cells, MaxCells(GetParam()));
  EXPECT_EQ(t_.cells & (t_.cells - 1), 0);
  ASSERT_EQ(t_.words.size(), 2 * static_cast<size_t>(t_.cells));
  EXPECT_EQ(t_.base(0), 0u);
  // Every boundary sits in exactly one cell, in order.
  int seen = 0;
  for (int c = 0; c < t_.cells; ++c) {
    EXPECT_EQ(t_.base(c), static_cast<uint32_t>(seen)) << "cell " << c;
    if (std::isfinite(t_.bnd(c))) {
      EXPECT_EQ(t_.bnd(c), b_[seen++]) << "cell " << c;
    }
  }
  EXPECT_EQ(seen, static_cast<int>(b_.size()));
  std::printf("d=128 b=%d: %d boundaries, %d cells, scale %a offset %a\n", GetParam(),
              static_cast<int>(b_.size()), t_.cells, t_.scale, t_.offset);
}

TEST_P(ServedCodebook, MatchesCountOnRandomValues) {
  std::mt19937_64 rng(GetParam());
  std::normal_distribution<float> nd;
  // σ of a rotated unit-vector coordinate at d = 128 is ~0.088.
  int bad = 0;
  for (float scale : {1e-6f, 1e-3f, 0.03f, 0.088f, 0.3f, 1.0f, 1e6f})
    for (int i = 0; i < 400000 && bad < 5; ++i) bad += !Check(nd(rng) * scale);
  std::uniform_real_distribution<float> span(b_.front() * 1.1f, b_.back() * 1.1f);
  for (int i = 0; i < 1000000 && bad < 5; ++i) bad += !Check(span(rng));
  // Arbitrary bit patterns: every exponent, NaN payloads of both signs,
  // infinities and denormals.
  for (int i = 0; i < 1000000 && bad < 5; ++i) bad += !Check(FromBits(static_cast<uint32_t>(rng())));
  EXPECT_EQ(bad, 0);
}

TEST_P(ServedCodebook, MatchesCountAtBoundariesAndSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> ys = {0.0f, -0.0f, inf, -inf, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN,
                           std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                           FromBits(0x007fffffu), FromBits(0x807fffffu),  // largest denormals
                           std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                           FromBits(0x7f800001u), FromBits(0xff800001u),  // signalling NaNs
                           FromBits(0x7fffffffu), FromBits(0xffffffffu), 1.0f, -1.0f, 1e30f, -1e30f};
  for (float b : b_) {
    float up = b, down = b;
    ys.push_back(b);
    for (int s = 0; s < 64; ++s) {  // the neighbours, 64 ulps either way
      up = std::nextafter(up, inf);
      down = std::nextafter(down, -inf);
      ys.push_back(up);
      ys.push_back(down);
    }
  }
  // The cell edges: wherever the cell of y changes, the floats either side.
  for (int c = 1; c < t_.cells; ++c) {
    // The edge between cells c − 1 and c: u·(cells − 1) = c − 0.5.
    const float y0 = static_cast<float>(((c - 0.5) / (t_.cells - 1) - t_.offset) / t_.scale);
    float y = y0;
    for (int s = 0; s < 256; ++s, y = std::nextafter(y, inf)) ys.push_back(y);
    y = y0;
    for (int s = 0; s < 256; ++s, y = std::nextafter(y, -inf)) ys.push_back(y);
  }
  int bad = 0;
  for (float y : ys)
    if (bad < 5) bad += !Check(y);
  EXPECT_EQ(bad, 0);
  // NaN: index 0 whatever its sign (the encode relies on it per value).
  EXPECT_EQ(QuantLutIndex(t_, std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(QuantLutIndex(t_, -std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(QuantLutIndex(t_, inf), static_cast<int>(b_.size()));
  EXPECT_EQ(QuantLutIndex(t_, -inf), 0);
}

INSTANTIATE_TEST_SUITE_P(D128, ServedCodebook, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return "b" + std::to_string(i.param); });

// The specialised encode uses a table for every 3-, 4- and 8-bit codebook it
// serves and none for 2 bits (LutMaxCells; codec_tables.cc builds them).
TEST(QuantLut, EncodeLimits) {
  EXPECT_EQ(LutMaxCells(2), 0);
  for (int bits : {3, 4, 8}) {
    const Codebook* cb = *GetCodebook(128, bits);
    EXPECT_TRUE(BuildQuantLut(cb->boundaries_f.data(), static_cast<int>(cb->boundaries_f.size()),
                              LutMaxCells(bits))
                    .has_value())
        << bits;
  }
}

// No valid table: the caller falls back to searching the boundaries.
TEST(QuantLut, FallbackForPathologicalBoundaries) {
  // Two boundaries one ulp apart in a wide span: ~2^24 cells needed.
  const std::vector<float> close = {-1.0f, 0.5f, std::nextafter(0.5f, 1.0f), 1.0f};
  EXPECT_FALSE(BuildQuantLut(close.data(), 4, 1024).has_value());
  // Fine with enough room: the same points spread out.
  const std::vector<float> spread = {-1.0f, 0.0f, 0.5f, 1.0f};
  auto t = BuildQuantLut(spread.data(), 4, 1024);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->cells, 4);
  // More boundaries than cells.
  std::vector<float> many(40);
  for (int j = 0; j < 40; ++j) many[j] = static_cast<float>(j);
  EXPECT_FALSE(BuildQuantLut(many.data(), 40, 32).has_value());
  EXPECT_TRUE(BuildQuantLut(many.data(), 40, 64).has_value());
  // Not strictly ascending, not finite, empty.
  const std::vector<float> dup = {0.0f, 0.0f}, nan = {0.0f, std::nanf("")},
                           inf = {0.0f, std::numeric_limits<float>::infinity()};
  EXPECT_FALSE(BuildQuantLut(dup.data(), 2, 1024).has_value());
  EXPECT_FALSE(BuildQuantLut(nan.data(), 2, 1024).has_value());
  EXPECT_FALSE(BuildQuantLut(inf.data(), 2, 1024).has_value());
  EXPECT_FALSE(BuildQuantLut(nullptr, 0, 1024).has_value());
}

// One boundary: two cells, exact on both sides and at it.
TEST(QuantLut, SingleBoundary) {
  const float b = 0.25f;
  auto t = BuildQuantLut(&b, 1, 32);
  ASSERT_TRUE(t.has_value());
  for (float y : {-1.0f, 0.0f, 0.25f, std::nextafter(0.25f, 1.0f), 1.0f, std::nanf("")})
    EXPECT_EQ(QuantLutIndex(*t, y), NearestIndex(&b, 1, y)) << y;
}

}  // namespace
}  // namespace tqkv::gpu
