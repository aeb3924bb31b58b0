// Wall-clock helpers of the end-to-end benchmarks: elapsed microseconds and
// percentiles of samples.
#ifndef TQKV_BENCH_LATENCY_H_
#define TQKV_BENCH_LATENCY_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace tqkv::bench {

using Clock = std::chrono::steady_clock;

inline double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// The p-quantile (0..1, nearest rank) of `v`; 0 for no samples.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace tqkv::bench

#endif  // TQKV_BENCH_LATENCY_H_
