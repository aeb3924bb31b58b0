// ParallelFor: a loop over independent items spread over a few threads when
// the work is large enough to pay for them (bulk copies and checksums of
// many blocks), inline otherwise. The threads are a process-wide set of
// helpers started on first use and kept: a call costs a wake-up, not a
// thread start (pthread_create, a stack mapped and unmapped, and the TLB
// shootdown of every CPU that unmapping costs).
#ifndef TQKV_BASE_PARALLEL_FOR_H_
#define TQKV_BASE_PARALLEL_FOR_H_

#include <algorithm>
#include <cstddef>
#include <functional>

namespace tqkv {

namespace parallel_for_internal {
// Helper threads besides the caller.
inline constexpr size_t kHelpers = 7;
// Calls part(p) for every p in [0, parts), each once, on the caller and
// the helpers; returns when all are done. Calls may run concurrently and
// nest (the caller always works on its own parts).
void RunParts(size_t parts, const std::function<void(size_t)>& part);
}  // namespace parallel_for_internal

// fn(i) for every i in [0, n), each exactly once, in contiguous ranges of
// i on up to max_threads threads: one per min_bytes_per_thread of `bytes`
// (the work's size), inline when that is one. fn must be safe to call
// concurrently for different i.
template <typename Fn>
void ParallelFor(size_t n, size_t bytes, const Fn& fn, size_t max_threads = 8,
                 size_t min_bytes_per_thread = size_t{16} << 20) {
  const size_t threads = std::min({max_threads, parallel_for_internal::kHelpers + 1, n,
                                   std::max<size_t>(1, bytes / min_bytes_per_thread)});
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  parallel_for_internal::RunParts(threads, [&](size_t t) {
    for (size_t i = n * t / threads; i < n * (t + 1) / threads; ++i) fn(i);
  });
}

}  // namespace tqkv

#endif  // TQKV_BASE_PARALLEL_FOR_H_
