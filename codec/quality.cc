#include "codec/quality.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tqkv {

double MeanCosine(const float* reference, const float* approx, size_t rows, int dim) {
  if (rows == 0) return 0;
  double total = 0;
  for (size_t r = 0; r < rows; ++r) {
    double dot = 0, na = 0, nb = 0;
    for (int j = 0; j < dim; ++j) {
      double a = reference[r * dim + j], b = approx[r * dim + j];
      dot += a * b, na += a * a, nb += b * b;
    }
    if (na == 0 || nb == 0) {
      total += (na == 0 && nb == 0) ? 1.0 : 0.0;
    } else {
      total += dot / std::sqrt(na * nb);
    }
  }
  return total / rows;
}

template <typename R, typename A>
static double RelMse(const R* reference, const A* approx, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = double(approx[i]) - double(reference[i]);
    num += d * d, den += double(reference[i]) * double(reference[i]);
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : num / den;
}

double RelativeMse(const float* reference, const float* approx, size_t n) {
  return RelMse(reference, approx, n);
}
double RelativeMse(const double* reference, const float* approx, size_t n) {
  return RelMse(reference, approx, n);
}
double RelativeError(const double* reference, const double* approx, size_t n) {
  return std::sqrt(RelMse(reference, approx, n));
}
double RelativeError(const double* reference, const float* approx, size_t n) {
  return std::sqrt(RelMse(reference, approx, n));
}

BiasVariance InnerProductError(const std::vector<double>& estimates,
                               const std::vector<double>& truths) {
  BiasVariance r;
  const size_t n = std::min(estimates.size(), truths.size());
  if (n == 0) return r;
  double sum = 0, sum2 = 0;
  for (size_t i = 0; i < n; ++i) {
    double e = estimates[i] - truths[i];
    sum += e, sum2 += e * e;
  }
  r.bias = sum / n;
  r.variance = std::max(0.0, sum2 / n - r.bias * r.bias);
  r.std_error = std::sqrt(r.variance / n);
  return r;
}

double TopKAgreement(const std::vector<double>& reference, const std::vector<double>& approx,
                     int k) {
  const size_t n = std::min(reference.size(), approx.size());
  k = std::min<int>(k, static_cast<int>(n));
  if (k <= 0) return 1.0;
  auto top = [&](const std::vector<double>& v) {
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](size_t a, size_t b) {
      return v[a] > v[b] || (v[a] == v[b] && a < b);
    });
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    return idx;
  };
  std::vector<size_t> a = top(reference), b = top(approx), both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / k;
}

}  // namespace tqkv
