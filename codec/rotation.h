// Random orthogonal rotations Π used before scalar quantization.
//
// Canonical fp32 arithmetic (the contract the GPU kernels reproduce bit for
// bit, so that indices agree exactly):
//  * FWHT on n = 2^k values: stages h = 1, 2, 4, ..., n/2; at each stage, for
//    every pair (i, i+h) with (i & h) == 0: a = v[i], b = v[i+h];
//    v[i] = a + b; v[i+h] = a - b (plain fp32 adds, never fused).
//  * RHT (d a power of two): y = s2 ⊙ (FWHT(s1 ⊙ u) · fl(1/√d)), where s1, s2
//    are ±1 vectors: the first d then the next d signs of SplitMixStream(seed).
//  * Block Hadamard (d a multiple of 16): d splits greedily into descending
//    powers of two (96 = 64 + 32, 80 = 64 + 16, 112 = 64 + 32 + 16); each block
//    is an RHT of its size using the block's slices of s1 and s2 and
//    fl(1/√block).
//  * QR (any d): Q from the Householder QR of a d×d matrix of
//    SplitMixStream(seed).NextGaussian() (row-major), sign-fixed so that
//    diag(R) > 0, rounded to fp32. y_i = Σ_j Q_ij u_j accumulated with fmaf in
//    ascending j starting from 0.
// The inverse applies Πᵀ (for RHT/block: s1 ⊙ FWHT(s2 ⊙ y) · fl(1/√b)).
#ifndef TQKV_CODEC_ROTATION_H_
#define TQKV_CODEC_ROTATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tqkv {

enum class RotationKind : uint8_t { kRht = 0, kBlockHadamard = 1, kQr = 2 };

std::string RotationKindName(RotationKind k);
absl::StatusOr<RotationKind> ParseRotationKind(const std::string& name);
// RHT for powers of two, block Hadamard for other multiples of 16, else QR.
RotationKind DefaultRotationKind(int dim);

// In-place normalised-free FWHT (see contract above). REQUIRES: n power of 2.
void Fwht(float* v, int n);

// Power-of-two block sizes of a block-Hadamard rotation of dimension `dim`.
std::vector<int> HadamardBlocks(int dim);

class Rotation {
 public:
  // An empty rotation (dim 0); assign from Create() before use.
  Rotation() = default;
  // INVALID_ARGUMENT if `kind` cannot rotate `dim` (RHT: power of two >= 8;
  // block: multiple of 16; QR: >= 2).
  static absl::StatusOr<Rotation> Create(RotationKind kind, int dim, uint64_t seed);

  RotationKind kind() const { return kind_; }
  int dim() const { return dim_; }

  // y = Π x (in may alias out).
  void Forward(const float* in, float* out) const;
  // x = Πᵀ y (in may alias out).
  void Inverse(const float* in, float* out) const;

  // Tables the GPU backend uploads: sign vectors (±1.0f, length dim each) for
  // RHT/block; the row-major fp32 matrix for QR (empty otherwise); the block
  // sizes for block Hadamard (a single block for RHT).
  const std::vector<float>& signs1() const { return s1_; }
  const std::vector<float>& signs2() const { return s2_; }
  const std::vector<float>& matrix() const { return q_; }
  const std::vector<int>& blocks() const { return blocks_; }

 private:
  void Apply(const float* in, float* out, bool inverse) const;

  RotationKind kind_ = RotationKind::kRht;
  int dim_ = 0;
  std::vector<float> s1_, s2_, q_;
  std::vector<int> blocks_;
};

}  // namespace tqkv

#endif  // TQKV_CODEC_ROTATION_H_
