// Lloyd-Max scalar codebooks for one coordinate of a uniform unit vector.
//
// For x uniform on S^{d-1} each coordinate has density
//   f(x) = Γ(d/2) / (√π Γ((d-1)/2)) · (1-x²)^((d-3)/2)   on [-1, 1].
// The b-bit codebook is the continuous 1-D k-means (Lloyd-Max) solution for
// f: boundaries are midpoints of adjacent centroids and each centroid is the
// conditional mean of its cell. Cell integrals use closed forms (regularised
// incomplete beta), so the result is exact to ~1e-13.
#ifndef TQKV_CODEC_CODEBOOK_H_
#define TQKV_CODEC_CODEBOOK_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tqkv {

struct Codebook {
  int dim = 0;
  int bits = 0;
  // 2^bits centroids, strictly ascending, symmetric about 0.
  std::vector<double> centroids;
  // 2^bits - 1 cell boundaries (midpoints), ascending.
  std::vector<double> boundaries;
  // The same tables rounded to fp32: the contract every backend encodes with.
  // Index of y = number of float boundaries strictly below y.
  std::vector<float> centroids_f;
  std::vector<float> boundaries_f;
  // Expected squared error per coordinate; d·MSE is the distortion of a unit
  // vector (reference §1: 0.03397 at d=128, b=3).
  double mse = 0;
  double d_mse() const { return dim * mse; }
  // Lloyd iterations it took to converge (for diagnostics).
  int iterations = 0;
};

// Returns the codebook for (dim, bits), computing it on first use.
// Supported: dim >= 8; bits in 1..5 or 8. INVALID_ARGUMENT otherwise.
// Thread-safe. The returned reference stays valid for the life of the
// process: codebooks are immutable values of a pure function of (dim, bits),
// memoised in a function-local table (the only process-wide cache in codec/).
absl::StatusOr<const Codebook*> GetCodebook(int dim, int bits);

// Computes a codebook without the cache (exposed for tests and the CLI).
absl::StatusOr<Codebook> ComputeCodebook(int dim, int bits);

// Index of the nearest centroid: the number of boundaries strictly below y.
inline uint8_t NearestIndex(const float* boundaries, int num_boundaries, float y) {
  int lo = 0;
  for (int k = 0; k < num_boundaries; ++k) lo += (y > boundaries[k]);
  return static_cast<uint8_t>(lo);
}

// max_k |T(c)_k - c_k| for the Lloyd map T (midpoint boundaries, conditional
// means): 0 exactly at a Lloyd-Max fixed point. Centroids ascending.
double LloydResidual(int dim, const std::vector<double>& centroids);

// Density f(x) of one coordinate (exposed for tests).
double CoordinateDensity(int dim, double x);

}  // namespace tqkv

#endif  // TQKV_CODEC_CODEBOOK_H_
