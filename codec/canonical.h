// Canonical fp32 reductions shared by every backend (the GPU kernels compute
// the same values bit for bit).
#ifndef TQKV_CODEC_CANONICAL_H_
#define TQKV_CODEC_CANONICAL_H_

#include <cmath>

namespace tqkv {

// Σ x_j² in the order of a 32-lane warp: lane l accumulates
// acc_l = fmaf(x_j, x_j, acc_l) for j = l, l+32, l+64, ... (ascending, from
// 0); then a butterfly: for off = 16, 8, 4, 2, 1: acc_l = acc_l + acc_{l^off}.
// The result is lane 0's value (all lanes agree: fp32 + is commutative).
inline float CanonicalSumSquares(const float* x, int n) {
  float acc[32];
  for (int l = 0; l < 32; ++l) acc[l] = 0.0f;
  for (int base = 0; base < n; base += 32) {
    int m = n - base < 32 ? n - base : 32;
    for (int l = 0; l < m; ++l) acc[l] = std::fma(x[base + l], x[base + l], acc[l]);
  }
  for (int off = 16; off >= 1; off >>= 1) {
    float t[32];
    for (int l = 0; l < 32; ++l) t[l] = acc[l] + acc[l ^ off];
    for (int l = 0; l < 32; ++l) acc[l] = t[l];
  }
  return acc[0];
}

// ‖x‖ = sqrtf(CanonicalSumSquares(x)) (IEEE-rounded sqrt).
inline float CanonicalNorm(const float* x, int n) { return std::sqrt(CanonicalSumSquares(x, n)); }

// Reciprocal used to normalise: 1/n for n > 0, else 0 (a zero vector encodes
// as all-zero coordinates).
inline float SafeReciprocal(float n) { return n > 0.0f ? 1.0f / n : 0.0f; }

}  // namespace tqkv

#endif  // TQKV_CODEC_CANONICAL_H_
