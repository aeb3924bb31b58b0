// The AVX2 primitives are bit-identical to the scalar contracts.
#include "codec/simd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/canonical.h"
#include "codec/codebook.h"
#include "codec/rotation.h"

namespace tqkv {
namespace {

std::vector<float> Random(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng) * (1 + (seed % 5));
  return v;
}

// fp32 → fp16 in 8-lane F16C blocks gives the bytes of a cast to _Float16:
// random values over the whole fp16 range, halfway cases, subnormals,
// overflow, signed zeros, infinities and NaN.
TEST(Simd, FloatToHalfMatchesCast) {
  std::vector<float> x;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exp2(-30.0f, 17.0f);
  for (int i = 0; i < 4096; ++i) x.push_back((i & 1 ? -1.0f : 1.0f) * std::exp2(exp2(rng)));
  for (float v : {0.0f, -0.0f, 65504.0f, 65520.0f, 65519.99f, 1e9f, -1e9f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f,
                  1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, -(1.0f + 1.0f / 2048), INFINITY, -INFINITY})
    x.push_back(v);
  for (int u = 0; u < 8; ++u) {  // exact halfway points between fp16 neighbours at several scales
    const float h = std::ldexp(1.0f + (2 * u + 1) / 2048.0f, u - 3);
    x.push_back(h);
  }
  x.push_back(NAN);
  while (x.size() % 8) x.push_back(1.5f);
  std::vector<uint16_t> got(x.size());
  simd::FloatToHalf(x.data(), got.data(), static_cast<int>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const _Float16 want = static_cast<_Float16>(x[i]);
    uint16_t w;
    std::memcpy(&w, &want, 2);
    if (std::isnan(x[i])) {
      EXPECT_EQ(got[i] & 0x7c00, 0x7c00) << "NaN stays NaN";
      EXPECT_NE(got[i] & 0x03ff, 0) << "NaN stays NaN";
    } else {
      EXPECT_EQ(got[i], w) << "x = " << x[i];
    }
  }
}

TEST(Simd, SumSquaresMatchesCanonical) {
  for (int n : {8, 16, 24, 32, 64, 96, 128, 136, 256, 512}) {
    for (uint64_t s = 0; s < 200; ++s) {
      std::vector<float> x = Random(n, s * 31 + n);
      float a = simd::SumSquares(x.data(), n), b = CanonicalSumSquares(x.data(), n);
      ASSERT_EQ(0, std::memcmp(&a, &b, 4)) << "n=" << n << " seed=" << s << " " << a << " " << b;
    }
  }
}

TEST(Simd, FwhtMatchesScalar) {
  for (int n : {8, 16, 32, 64, 128, 256, 1024}) {
    for (uint64_t s = 0; s < 50; ++s) {
      std::vector<float> a = Random(n, s + 7 * n), b = a;
      simd::Fwht(a.data(), n);
      Fwht(b.data(), n);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), 4 * n)) << "n=" << n;
    }
  }
}

TEST(Simd, QuantizeMatchesNearestIndex) {
  for (int bits : {1, 2, 3, 4, 5, 8}) {
    const Codebook* cb = *GetCodebook(128, bits);
    std::vector<float> y = Random(128, bits);
    for (float& v : y) v *= 0.1f;
    // Exact boundary values must also agree (strictly-greater rule).
    for (size_t k = 0; k < cb->boundaries_f.size() && k < 128; ++k) y[k] = cb->boundaries_f[k];
    std::vector<uint8_t> a(128), b(128);
    simd::Quantize(y.data(), 128, cb->boundaries_f.data(), cb->boundaries_f.size(), a.data());
    for (int j = 0; j < 128; ++j)
      b[j] = NearestIndex(cb->boundaries_f.data(), cb->boundaries_f.size(), y[j]);
    EXPECT_EQ(a, b) << bits;
  }
}

TEST(Simd, MatVecTransposedMatchesSequentialFma) {
  for (int n : {32, 64, 96}) {
    std::vector<float> m = Random(n * n, n), r = Random(n, n + 1), mt(n * n), z(n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) mt[j * n + i] = m[i * n + j];
    simd::MatVecTransposed(mt.data(), r.data(), z.data(), n);
    for (int i = 0; i < n; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < n; ++j) acc = std::fma(m[i * n + j], r[j], acc);
      ASSERT_EQ(0, std::memcmp(&acc, &z[i], 4)) << "n=" << n << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace tqkv

namespace tqkv {
namespace {

TEST(Simd, LutDotAndAxpyMatchScalar) {
  for (int levels : {2, 4, 8, 16, 32, 256}) {
    std::vector<float> c = Random(levels, levels), p = Random(128, 3), acc(128, 0.5f), want = acc;
    std::vector<uint8_t> idx(128);
    for (int j = 0; j < 128; ++j) idx[j] = static_cast<uint8_t>((j * 37 + 11) % levels);
    double dot = 0;
    for (int j = 0; j < 128; ++j) dot += double(p[j]) * c[idx[j]];
    EXPECT_NEAR(simd::LutDot(p.data(), idx.data(), 128, c.data(), levels), dot, 1e-4 * (1 + std::fabs(dot)))
        << levels;
    simd::LutAxpy(0.25f, idx.data(), 128, c.data(), levels, acc.data());
    for (int j = 0; j < 128; ++j) EXPECT_NEAR(acc[j], want[j] + 0.25f * c[idx[j]], 1e-6) << levels;
  }
}

}  // namespace
}  // namespace tqkv
