#include "codec/rotation.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/seed.h"
#include "codec/simd.h"

namespace tqkv {
namespace {

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Householder QR of a row-major n×n matrix `a` (double); returns Q with the
// sign fix Q·diag(sign(diag R)).
std::vector<double> OrthogonalFromGaussian(std::vector<double> a, int n) {
  std::vector<double> q(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) q[i * n + i] = 1.0;
  std::vector<double> v(n);
  std::vector<double> rdiag(n);
  for (int k = 0; k < n; ++k) {
    double norm = 0;
    for (int i = k; i < n; ++i) norm += a[i * n + k] * a[i * n + k];
    norm = std::sqrt(norm);
    double alpha = a[k * n + k] > 0 ? -norm : norm;
    for (int i = 0; i < n; ++i) v[i] = i < k ? 0 : a[i * n + k];
    v[k] -= alpha;
    double vnorm2 = 0;
    for (int i = k; i < n; ++i) vnorm2 += v[i] * v[i];
    rdiag[k] = alpha;
    if (vnorm2 == 0) continue;
    // A <- H A, Q <- Q H with H = I - 2 v vᵀ / (vᵀv).
    for (int j = k; j < n; ++j) {
      double dot = 0;
      for (int i = k; i < n; ++i) dot += v[i] * a[i * n + j];
      double f = 2 * dot / vnorm2;
      for (int i = k; i < n; ++i) a[i * n + j] -= f * v[i];
    }
    for (int i = 0; i < n; ++i) {
      double dot = 0;
      for (int j = k; j < n; ++j) dot += q[i * n + j] * v[j];
      double f = 2 * dot / vnorm2;
      for (int j = k; j < n; ++j) q[i * n + j] -= f * v[j];
    }
  }
  for (int k = 0; k < n; ++k)
    if (a[k * n + k] < 0)
      for (int i = 0; i < n; ++i) q[i * n + k] = -q[i * n + k];
  return q;
}

// One RHT block of size n at v (in place): s2 ⊙ FWHT(s1 ⊙ v) · scale.
inline void RhtBlock(float* v, int n, const float* s1, const float* s2, float scale) {
  if (n >= 8) {  // same operations, eight lanes at a time (simd.h)
    simd::Mul(v, s1, v, n);
    simd::Fwht(v, n);
    simd::ScaleMul(v, scale, s2, v, n);
    return;
  }
  for (int i = 0; i < n; ++i) v[i] *= s1[i];
  Fwht(v, n);
  for (int i = 0; i < n; ++i) v[i] = (v[i] * scale) * s2[i];
}

}  // namespace

std::string RotationKindName(RotationKind k) {
  switch (k) {
    case RotationKind::kRht: return "rht";
    case RotationKind::kBlockHadamard: return "block_hadamard";
    case RotationKind::kQr: return "qr";
  }
  return "unknown";
}

absl::StatusOr<RotationKind> ParseRotationKind(const std::string& name) {
  if (name == "rht") return RotationKind::kRht;
  if (name == "block_hadamard" || name == "block") return RotationKind::kBlockHadamard;
  if (name == "qr") return RotationKind::kQr;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown rotation '", name, "' (expected rht, block_hadamard or qr)"));
}

RotationKind DefaultRotationKind(int dim) {
  if (IsPowerOfTwo(dim)) return RotationKind::kRht;
  if (dim % 16 == 0) return RotationKind::kBlockHadamard;
  return RotationKind::kQr;
}

void Fwht(float* v, int n) {
  for (int h = 1; h < n; h <<= 1) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
}

std::vector<int> HadamardBlocks(int dim) {
  std::vector<int> blocks;
  int rest = dim;
  while (rest > 0) {
    int b = 1;
    while (b * 2 <= rest) b *= 2;
    blocks.push_back(b);
    rest -= b;
  }
  return blocks;
}

absl::StatusOr<Rotation> Rotation::Create(RotationKind kind, int dim, uint64_t seed) {
  Rotation r;
  r.kind_ = kind;
  r.dim_ = dim;
  switch (kind) {
    case RotationKind::kRht:
      if (!IsPowerOfTwo(dim) || dim < 8)
        return absl::InvalidArgumentError(
            absl::StrCat("rht needs a power-of-two dim >= 8, got ", dim));
      r.blocks_ = {dim};
      break;
    case RotationKind::kBlockHadamard:
      if (dim % 16 != 0 || dim <= 0)
        return absl::InvalidArgumentError(
            absl::StrCat("block_hadamard needs a dim that is a multiple of 16, got ", dim));
      r.blocks_ = HadamardBlocks(dim);
      break;
    case RotationKind::kQr: {
      if (dim < 2) return absl::InvalidArgumentError(absl::StrCat("qr needs dim >= 2, got ", dim));
      SplitMixStream rng(seed);
      std::vector<double> g(static_cast<size_t>(dim) * dim);
      for (double& x : g) x = rng.NextGaussian();
      std::vector<double> q = OrthogonalFromGaussian(std::move(g), dim);
      r.q_.assign(q.begin(), q.end());
      return r;
    }
  }
  SplitMixStream rng(seed);
  r.s1_.resize(dim);
  r.s2_.resize(dim);
  for (float& s : r.s1_) s = rng.NextSign();
  for (float& s : r.s2_) s = rng.NextSign();
  return r;
}

void Rotation::Forward(const float* in, float* out) const { Apply(in, out, /*inverse=*/false); }

void Rotation::Inverse(const float* in, float* out) const { Apply(in, out, /*inverse=*/true); }

void Rotation::Apply(const float* in, float* out, bool inverse) const {
  if (kind_ == RotationKind::kQr) {
    // y_i = Σ_j Q_ij x_j (forward) or x_j = Σ_i Q_ij y_i (inverse), each
    // accumulated with fmaf in ascending order from 0; `in` may alias `out`.
    std::vector<float> t(dim_);
    const size_t n = static_cast<size_t>(dim_);
    for (size_t i = 0; i < n; ++i) {
      float acc = 0.0f;
      for (size_t j = 0; j < n; ++j)
        acc = std::fma(inverse ? q_[j * n + i] : q_[i * n + j], in[j], acc);
      t[i] = acc;
    }
    std::memcpy(out, t.data(), sizeof(float) * n);
    return;
  }
  if (in != out) std::memcpy(out, in, sizeof(float) * dim_);
  // Per block: Π = D2 H D1, Πᵀ = D1 H D2.
  const std::vector<float>& first = inverse ? s2_ : s1_;
  const std::vector<float>& second = inverse ? s1_ : s2_;
  int off = 0;
  for (int b : blocks_) {
    RhtBlock(out + off, b, &first[off], &second[off], 1.0f / std::sqrt(static_cast<float>(b)));
    off += b;
  }
}

}  // namespace tqkv
