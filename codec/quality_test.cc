#include "codec/quality.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tqkv {
namespace {

TEST(Quality, CosineOfKnownVectors) {
  const float a[] = {1, 0, 0, 0, 1, 2};
  const float b[] = {1, 0, 0, 2, 0, 0};  // row0 identical, row1 ⟂
  EXPECT_NEAR(MeanCosine(a, b, 2, 3), 0.5, 1e-12);
  const float z[] = {0, 0, 0};
  EXPECT_EQ(MeanCosine(z, z, 1, 3), 1.0);
  EXPECT_EQ(MeanCosine(z, a, 1, 3), 0.0);
}

TEST(Quality, RelativeMseAndError) {
  const float ref[] = {3, 4};
  const float approx[] = {3, 5};
  EXPECT_NEAR(RelativeMse(ref, approx, 2), 1.0 / 25, 1e-12);
  const double dref[] = {3, 4};
  EXPECT_NEAR(RelativeError(dref, approx, 2), 1.0 / 5, 1e-12);
  EXPECT_EQ(RelativeMse(ref, ref, 2), 0.0);
}

TEST(Quality, InnerProductBiasVariance) {
  std::vector<double> est = {1.1, 0.9, 1.1, 0.9}, truth = {1, 1, 1, 1};
  BiasVariance bv = InnerProductError(est, truth);
  EXPECT_NEAR(bv.bias, 0.0, 1e-12);
  EXPECT_NEAR(bv.variance, 0.01, 1e-12);
  EXPECT_NEAR(bv.std_error, 0.05, 1e-12);
  bv = InnerProductError({2, 2}, {1, 1});
  EXPECT_NEAR(bv.bias, 1.0, 1e-12);
  EXPECT_NEAR(bv.variance, 0.0, 1e-12);
}

TEST(Quality, TopKAgreement) {
  std::vector<double> a = {5, 4, 3, 2, 1}, b = {5, 1, 3, 4, 2};
  EXPECT_EQ(TopKAgreement(a, a, 3), 1.0);
  EXPECT_NEAR(TopKAgreement(a, b, 2), 0.5, 1e-12);  // {0,1} vs {0,3}
  EXPECT_NEAR(TopKAgreement(a, b, 3), 2.0 / 3, 1e-12);
}

}  // namespace
}  // namespace tqkv
