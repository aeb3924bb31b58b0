#include "codec/rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace tqkv {
namespace {

std::vector<float> RandomVector(int d, std::mt19937& rng) {
  std::normal_distribution<float> n;
  std::vector<float> v(d);
  for (float& x : v) x = n(rng);
  return v;
}

TEST(Fwht, MatchesHadamardMatrix) {
  // H_4 rows: ++++, +-+-, ++--, +--+
  float v[4] = {1, 2, 3, 4};
  Fwht(v, 4);
  EXPECT_EQ(v[0], 10);
  EXPECT_EQ(v[1], -2);
  EXPECT_EQ(v[2], -4);
  EXPECT_EQ(v[3], 0);
}

TEST(Rotation, BlocksAreDescendingPowersOfTwo) {
  EXPECT_EQ(HadamardBlocks(96), (std::vector<int>{64, 32}));
  EXPECT_EQ(HadamardBlocks(80), (std::vector<int>{64, 16}));
  EXPECT_EQ(HadamardBlocks(112), (std::vector<int>{64, 32, 16}));
  EXPECT_EQ(HadamardBlocks(192), (std::vector<int>{128, 64}));
  EXPECT_EQ(HadamardBlocks(128), (std::vector<int>{128}));
}

TEST(Rotation, DefaultKinds) {
  EXPECT_EQ(DefaultRotationKind(128), RotationKind::kRht);
  EXPECT_EQ(DefaultRotationKind(96), RotationKind::kBlockHadamard);
  EXPECT_EQ(DefaultRotationKind(100), RotationKind::kQr);
}

TEST(Rotation, RejectsBadDims) {
  EXPECT_FALSE(Rotation::Create(RotationKind::kRht, 96, 1).ok());
  EXPECT_FALSE(Rotation::Create(RotationKind::kBlockHadamard, 100, 1).ok());
  EXPECT_FALSE(Rotation::Create(RotationKind::kQr, 1, 1).ok());
}

struct Case {
  RotationKind kind;
  int dim;
};

class RotationProperties : public testing::TestWithParam<Case> {};

TEST_P(RotationProperties, OrthogonalInverseAndDeterministic) {
  const Case c = GetParam();
  auto r = Rotation::Create(c.kind, c.dim, 12345);
  ASSERT_TRUE(r.ok()) << r.status();
  auto r2 = Rotation::Create(c.kind, c.dim, 12345);
  auto r3 = Rotation::Create(c.kind, c.dim, 54321);
  std::mt19937 rng(1);
  for (int t = 0; t < 20; ++t) {
    std::vector<float> x = RandomVector(c.dim, rng), y(c.dim), y2(c.dim), y3(c.dim), back(c.dim);
    r->Forward(x.data(), y.data());
    r2->Forward(x.data(), y2.data());
    r3->Forward(x.data(), y3.data());
    EXPECT_EQ(y, y2) << "same seed must give the same rotation";
    EXPECT_NE(y, y3) << "different seeds must differ";
    double nx = 0, ny = 0;
    for (int j = 0; j < c.dim; ++j) nx += x[j] * x[j], ny += y[j] * y[j];
    EXPECT_NEAR(ny, nx, 1e-4 * nx);
    r->Inverse(y.data(), back.data());
    for (int j = 0; j < c.dim; ++j) EXPECT_NEAR(back[j], x[j], 1e-5f * (1 + std::fabs(x[j])));
    // In-place use gives the same result.
    std::vector<float> inplace = x;
    r->Forward(inplace.data(), inplace.data());
    EXPECT_EQ(inplace, y);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, RotationProperties,
                         testing::Values(Case{RotationKind::kRht, 8}, Case{RotationKind::kRht, 128},
                                         Case{RotationKind::kRht, 256},
                                         Case{RotationKind::kBlockHadamard, 96},
                                         Case{RotationKind::kBlockHadamard, 112},
                                         Case{RotationKind::kQr, 100},
                                         Case{RotationKind::kQr, 64}));

// A one-hot input spreads over all coordinates with magnitude 1/sqrt(d).
TEST(Rotation, RhtSpreadsOneHot) {
  auto r = *Rotation::Create(RotationKind::kRht, 128, 9);
  std::vector<float> x(128, 0.0f), y(128);
  x[17] = 1.0f;
  r.Forward(x.data(), y.data());
  for (float v : y) EXPECT_NEAR(std::fabs(v), 1.0 / std::sqrt(128.0), 1e-7);
}

}  // namespace
}  // namespace tqkv
