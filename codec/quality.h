// Quality metrics comparing a reconstruction to a reference.
#ifndef TQKV_CODEC_QUALITY_H_
#define TQKV_CODEC_QUALITY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tqkv {

// Mean over rows (of `dim` values) of cos(reference_row, approx_row); rows
// where either side is all zero count as 1 if both are zero, else 0.
double MeanCosine(const float* reference, const float* approx, size_t rows, int dim);

// ‖approx − reference‖² / ‖reference‖² over all values (0 for an all-zero
// reference that is matched exactly).
double RelativeMse(const float* reference, const float* approx, size_t n);
double RelativeMse(const double* reference, const float* approx, size_t n);

// ‖approx − reference‖ / ‖reference‖ (Frobenius), e.g. attention outputs.
double RelativeError(const double* reference, const double* approx, size_t n);
double RelativeError(const double* reference, const float* approx, size_t n);

// Inner-product error statistics of estimates vs truths.
struct BiasVariance {
  double bias = 0;      // mean(estimate − truth)
  double variance = 0;  // var(estimate − truth)
  double std_error = 0; // sqrt(variance / n)
};
BiasVariance InnerProductError(const std::vector<double>& estimates,
                               const std::vector<double>& truths);

// |top_k(reference) ∩ top_k(approx)| / k for two score vectors (e.g. one
// query's attention weights over the context).
double TopKAgreement(const std::vector<double>& reference, const std::vector<double>& approx,
                     int k);

}  // namespace tqkv

#endif  // TQKV_CODEC_QUALITY_H_
