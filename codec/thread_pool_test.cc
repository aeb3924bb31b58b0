#include "codec/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tqkv {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {0, 1, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPool, ConcurrentCallersAreSerialisedSafely) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r)
        pool.ParallelFor(1000, 10, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 1000);
}

}  // namespace
}  // namespace tqkv
