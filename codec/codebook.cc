#include "codec/codebook.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tqkv {
namespace {

// Continued fraction for the incomplete beta function (modified Lentz).
double BetaContinuedFraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  constexpr double kEps = 1e-16;
  double qab = a + b, qap = a + 1.0, qam = a - 1.0;
  double c = 1.0, d = 1.0 - qab * x / qap;
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1.0 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    int m2 = 2 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1.0 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1.0 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1.0 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1.0 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    double del = d * c;
    h *= del;
    if (std::fabs(del - 1.0) < kEps) break;
  }
  return h;
}

// Regularised incomplete beta I_x(a, b).
double IncompleteBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  double lbt = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) +
               b * std::log1p(-x);
  double bt = std::exp(lbt);
  if (x < (a + 1.0) / (a + b + 2.0)) return bt * BetaContinuedFraction(a, b, x) / a;
  return 1.0 - bt * BetaContinuedFraction(b, a, 1.0 - x) / b;
}

// Moments of the coordinate law on [lo, hi] (0 <= lo < hi <= 1):
// m0 = ∫ f, m1 = ∫ x f, m2 = ∫ x² f.
struct Moments {
  double m0, m1, m2;
};

class CoordinateLaw {
 public:
  explicit CoordinateLaw(int dim) : alpha_((dim - 3) / 2.0) {}

  // P(0 <= X <= t) for t in [0, 1], with exponent beta in (1-x²)^beta,
  // normalised by the exponent-alpha constant.
  double HalfMass(double beta, double t) const {
    // ∫_0^t (1-x²)^beta dx = ½ B(½, beta+1) I_{t²}(½, beta+1).
    double log_b = std::lgamma(0.5) + std::lgamma(beta + 1) - std::lgamma(beta + 1.5);
    double log_c = -(std::lgamma(0.5) + std::lgamma(alpha_ + 1) - std::lgamma(alpha_ + 1.5));
    return 0.5 * std::exp(log_b + log_c) * IncompleteBeta(0.5, beta + 1, t * t);
  }

  Moments Cell(double lo, double hi) const {
    Moments m;
    m.m0 = HalfMass(alpha_, hi) - HalfMass(alpha_, lo);
    // ∫ x (1-x²)^α = [-(1-x²)^(α+1) / (2(α+1))]
    double log_c = -(std::lgamma(0.5) + std::lgamma(alpha_ + 1) - std::lgamma(alpha_ + 1.5));
    double c = std::exp(log_c);
    m.m1 = c * (std::pow(1 - lo * lo, alpha_ + 1) - std::pow(1 - hi * hi, alpha_ + 1)) /
           (2 * (alpha_ + 1));
    // x² (1-x²)^α = (1-x²)^α - (1-x²)^(α+1)
    m.m2 = m.m0 - (HalfMass(alpha_ + 1, hi) - HalfMass(alpha_ + 1, lo));
    return m;
  }

  double alpha() const { return alpha_; }

 private:
  double alpha_;
};

// Inverse standard normal CDF (Acklam's rational approximation, refined by
// one Halley step); only used for the starting point.
double NormalQuantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                             -2.759285104469687e+02, 1.383577518672690e+02,
                             -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                             -1.556989798598866e+02, 6.680131188771972e+01,
                             -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                             -2.400758277161838e+00, -2.549732539343734e+00,
                             4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                             2.445134137142996e+00, 3.754408661907416e+00};
  double q, r, x;
  if (p < 0.02425) {
    q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - 0.02425) {
    q = p - 0.5;
    r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  return x;
}

}  // namespace

double CoordinateDensity(int dim, double x) {
  if (x <= -1 || x >= 1) return 0;
  double alpha = (dim - 3) / 2.0;
  double log_c = std::lgamma(dim / 2.0) - 0.5 * std::log(M_PI) - std::lgamma((dim - 1) / 2.0);
  return std::exp(log_c + alpha * std::log1p(-x * x));
}

absl::StatusOr<Codebook> ComputeCodebook(int dim, int bits) {
  if (dim < 8) return absl::InvalidArgumentError(absl::StrCat("head dim ", dim, " < 8"));
  if (!((bits >= 1 && bits <= 5) || bits == 8))
    return absl::InvalidArgumentError(absl::StrCat("unsupported codebook bits ", bits,
                                                   " (supported: 1-5, 8)"));
  const CoordinateLaw law(dim);
  const int levels = 1 << bits;
  const int half = levels / 2;  // centroids in (0, 1); the rest mirror them
  // Start from the high-resolution optimum: point density ∝ f^(1/3), which
  // for the near-Gaussian law is a Gaussian of variance 3/d.
  std::vector<double> c(half);
  const double sigma = std::sqrt(3.0 / dim);
  for (int k = 0; k < half; ++k) {
    double p = 0.5 + 0.5 * (k + 0.5) / half;
    double z = sigma * NormalQuantile(p);
    c[k] = z / std::sqrt(1 + z * z);  // squashed into (0, 1), still ascending
  }
  std::vector<double> t(half + 1);  // boundaries of positive cells: t[0]=0, t[half]=1
  auto set_boundaries = [&] {
    t[0] = 0;
    for (int k = 0; k + 1 < half; ++k) t[k + 1] = 0.5 * (c[k] + c[k + 1]);
    t[half] = 1;
  };
  // Lloyd steps bring the centroids into the basin of the fixed point; Newton
  // steps on c - T(c) = 0 (T the Lloyd map, whose Jacobian is tridiagonal)
  // then converge quadratically to machine precision.
  std::vector<double> next(half), lower(half), diag(half), upper(half), rhs(half);
  // One Lloyd map evaluation at c: fills next = T(c), the Newton system, and
  // returns max |T(c) - c|.
  auto evaluate = [&](const std::vector<double>& cc) {
    t[0] = 0;
    for (int k = 0; k + 1 < half; ++k) t[k + 1] = 0.5 * (cc[k] + cc[k + 1]);
    t[half] = 1;
    double residual = 0;
    for (int k = 0; k < half; ++k) {
      Moments m = law.Cell(t[k], t[k + 1]);
      next[k] = m.m1 / m.m0;
      // dT_k/dt_lo and dT_k/dt_hi: moving a boundary moves the cell's mean.
      double d_lo = k == 0 ? 0 : CoordinateDensity(dim, t[k]) * (next[k] - t[k]) / m.m0;
      double d_hi =
          k + 1 == half ? 0 : CoordinateDensity(dim, t[k + 1]) * (t[k + 1] - next[k]) / m.m0;
      // J = dT/dc with t_k = (c_{k-1} + c_k)/2; Newton solves (I - J) δ = T(c) - c.
      lower[k] = -0.5 * d_lo;
      diag[k] = 1.0 - 0.5 * (d_lo + d_hi);
      upper[k] = -0.5 * d_hi;
      rhs[k] = next[k] - cc[k];
      residual = std::max(residual, std::fabs(rhs[k]));
    }
    return residual;
  };
  auto valid = [&](const std::vector<double>& cc) {
    for (int k = 0; k < half; ++k)
      if (!(cc[k] > (k ? cc[k - 1] : 0.0)) || !(cc[k] < 1.0)) return false;
    return true;
  };
  // Newton steps on c - T(c) = 0 (T the Lloyd map, whose Jacobian is
  // tridiagonal) converge quadratically; a step that does not lower the
  // residual is replaced by a plain Lloyd step, which always descends.
  std::vector<double> trial(half);
  int it = 0;
  double residual = evaluate(c);
  for (; it < 5000 && residual > 1e-13; ++it) {
    for (int k = 1; k < half; ++k) {  // Thomas algorithm
      double w = lower[k] / diag[k - 1];
      diag[k] -= w * upper[k - 1];
      rhs[k] -= w * rhs[k - 1];
    }
    for (int k = half - 1; k >= 0; --k)
      rhs[k] = (rhs[k] - (k + 1 < half ? upper[k] * rhs[k + 1] : 0)) / diag[k];
    for (int k = 0; k < half; ++k) trial[k] = c[k] + rhs[k];
    std::vector<double> lloyd = next;
    if (valid(trial)) {
      double r = evaluate(trial);
      if (r < residual) {
        c = trial;
        residual = r;
        continue;
      }
    }
    c = lloyd;
    residual = evaluate(c);
  }
  set_boundaries();
  Codebook cb;
  cb.dim = dim;
  cb.bits = bits;
  cb.iterations = it;
  cb.centroids.resize(levels);
  for (int k = 0; k < half; ++k) {
    cb.centroids[half + k] = c[k];
    cb.centroids[half - 1 - k] = -c[k];
  }
  cb.boundaries.resize(levels - 1);
  for (int k = 0; k + 1 < levels; ++k)
    cb.boundaries[k] = 0.5 * (cb.centroids[k] + cb.centroids[k + 1]);
  // Final MSE with the converged boundaries (both halves, by symmetry).
  double mse = 0;
  for (int k = 0; k < half; ++k) {
    Moments m = law.Cell(t[k], t[k + 1]);
    mse += 2 * (m.m2 - 2 * c[k] * m.m1 + c[k] * c[k] * m.m0);
  }
  cb.mse = mse;
  cb.centroids_f.assign(cb.centroids.begin(), cb.centroids.end());
  cb.boundaries_f.assign(cb.boundaries.begin(), cb.boundaries.end());
  return cb;
}

double LloydResidual(int dim, const std::vector<double>& centroids) {
  const CoordinateLaw law(dim);
  const size_t n = centroids.size();
  double residual = 0;
  for (size_t k = 0; k < n; ++k) {
    double lo = k == 0 ? -1.0 : 0.5 * (centroids[k - 1] + centroids[k]);
    double hi = k + 1 == n ? 1.0 : 0.5 * (centroids[k] + centroids[k + 1]);
    // Cell moments on a possibly negative interval, by symmetry of f.
    double m0, m1;
    if (lo >= 0) {
      Moments m = law.Cell(lo, hi);
      m0 = m.m0, m1 = m.m1;
    } else if (hi <= 0) {
      Moments m = law.Cell(-hi, -lo);
      m0 = m.m0, m1 = -m.m1;
    } else {
      Moments a = law.Cell(0, -lo), b = law.Cell(0, hi);
      m0 = a.m0 + b.m0, m1 = b.m1 - a.m1;
    }
    residual = std::max(residual, std::fabs(m1 / m0 - centroids[k]));
  }
  return residual;
}

absl::StatusOr<const Codebook*> GetCodebook(int dim, int bits) {
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, int>, std::unique_ptr<Codebook>>();
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(dim, bits);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second.get();
  absl::StatusOr<Codebook> cb = ComputeCodebook(dim, bits);
  if (!cb.ok()) return cb.status();
  auto [pos, _] = cache->emplace(key, std::make_unique<Codebook>(std::move(*cb)));
  return pos->second.get();
}

}  // namespace tqkv
