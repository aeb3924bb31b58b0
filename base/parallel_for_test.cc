#include "base/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace tqkv {
namespace {

TEST(ParallelFor, VisitsEveryIndexOnceInlineAndOnThreads) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
    for (size_t bytes : {size_t{0}, size_t{1} << 30}) {
      std::vector<std::atomic<int>> seen(n);
      std::mutex mu;
      std::set<std::thread::id> threads;
      ParallelFor(n, bytes, [&](size_t i) {
        seen[i].fetch_add(1);
        if (bytes != 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // helpers take parts
        std::lock_guard<std::mutex> l(mu);
        threads.insert(std::this_thread::get_id());
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << "n " << n << " index " << i;
      // Small work runs inline on the caller; 1 GiB of it over several threads (at most 8).
      if (bytes == 0 || n <= 1) {
        EXPECT_EQ(threads.size(), std::min<size_t>(n, 1)) << "n " << n << " bytes " << bytes;
        if (n == 1) EXPECT_EQ(*threads.begin(), std::this_thread::get_id());
      } else {
        EXPECT_GT(threads.size(), 1u) << "n " << n;
        EXPECT_LE(threads.size(), 8u) << "n " << n;
      }
    }
  }
}

// Loops from several threads at once, and loops inside loops, each visit
// every index once (the helpers are shared; every caller works on its own
// loop, so none waits for another's).
TEST(ParallelFor, ConcurrentAndNestedLoopsComplete) {
  constexpr size_t kOuter = 16, kInner = 64;
  std::vector<std::atomic<int>> seen(4 * kOuter * kInner);
  std::vector<std::thread> callers;
  for (size_t c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      ParallelFor(kOuter, size_t{1} << 30, [&](size_t o) {
        ParallelFor(kInner, size_t{1} << 30, [&](size_t i) { seen[(c * kOuter + o) * kInner + i].fetch_add(1); });
      });
    });
  }
  for (std::thread& t : callers) t.join();
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i].load(), 1) << "index " << i;
}

}  // namespace
}  // namespace tqkv
