// ParallelFor: a loop over independent items spread over a few short-lived
// threads when the work is large enough to pay for starting them (bulk
// copies and checksums of many blocks), inline otherwise.
#ifndef TQKV_BASE_PARALLEL_FOR_H_
#define TQKV_BASE_PARALLEL_FOR_H_

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace tqkv {

// fn(i) for every i in [0, n), each exactly once, in contiguous ranges of
// i on up to max_threads threads: one per min_bytes_per_thread of `bytes`
// (the work's size), inline when that is one. fn must be safe to call
// concurrently for different i.
template <typename Fn>
void ParallelFor(size_t n, size_t bytes, const Fn& fn, size_t max_threads = 8,
                 size_t min_bytes_per_thread = size_t{16} << 20) {
  const size_t threads = std::min({max_threads, n, std::max<size_t>(1, bytes / min_bytes_per_thread)});
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  auto range = [&](size_t t) {
    for (size_t i = n * t / threads; i < n * (t + 1) / threads; ++i) fn(i);
  };
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(range, t);
  range(0);
  for (std::thread& th : pool) th.join();
}

}  // namespace tqkv

#endif  // TQKV_BASE_PARALLEL_FOR_H_
