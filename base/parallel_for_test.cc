#include "base/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
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
        std::lock_guard<std::mutex> l(mu);
        threads.insert(std::this_thread::get_id());
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << "n " << n << " index " << i;
      // Small work runs inline; 1 GiB of it over as many threads as items allow (at most 8).
      const size_t want = bytes == 0 ? std::min<size_t>(n, 1) : std::min<size_t>(n, 8);
      EXPECT_EQ(threads.size(), want) << "n " << n << " bytes " << bytes;
    }
  }
}

}  // namespace
}  // namespace tqkv
