#include "base/work_queue.h"

#include <atomic>
#include <latch>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"

namespace tqkv {
namespace {

TEST(WorkQueueTest, RunsTasksInSubmissionOrderOnOneWorker) {
  std::vector<int> order;
  {
    WorkQueue q({.threads = 1, .capacity = 1000});
    for (int i = 0; i < 500; ++i) {
      WorkQueue::Task t = [&order, i] { order.push_back(i); };
      ASSERT_TRUE(q.TrySubmit(t));
    }
  }  // the destructor runs what was submitted
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkQueueTest, RefusesOverCapacityAndKeepsTheTask) {
  WorkQueue q({.threads = 1, .capacity = 2, .spin = absl::ZeroDuration()});
  std::latch started(1), release(1);
  WorkQueue::Task blocker = [&] {
    started.count_down();
    release.wait();
  };
  ASSERT_TRUE(q.TrySubmit(blocker));
  started.wait();  // the worker is busy: what follows waits
  std::atomic<int> ran{0};
  for (int i = 0; i < 2; ++i) {
    WorkQueue::Task t = [&] { ran.fetch_add(1); };
    ASSERT_TRUE(q.TrySubmit(t));
  }
  EXPECT_EQ(q.waiting(), 2u);
  WorkQueue::Task refused = [&] { ran.fetch_add(100); };
  EXPECT_FALSE(q.TrySubmit(refused));
  EXPECT_EQ(q.refusals(), 1u);
  ASSERT_TRUE(refused != nullptr);  // still the caller's, to retry
  release.count_down();
  while (q.waiting() > 0) std::this_thread::yield();
  ASSERT_TRUE(q.TrySubmit(refused));
  while (ran.load() != 102) std::this_thread::yield();
}

TEST(WorkQueueTest, ManyWorkersRunEveryTaskOnce) {
  std::atomic<int> sum{0};
  {
    WorkQueue q({.threads = 4, .capacity = 64, .spin = absl::Microseconds(10)});
    for (int i = 1; i <= 10000; ++i) {
      WorkQueue::Task t = [&sum, i] { sum.fetch_add(i); };
      while (!q.TrySubmit(t)) std::this_thread::yield();
    }
  }
  EXPECT_EQ(sum.load(), 10000 * 10001 / 2);
}

TEST(WorkQueueTest, TasksMaySubmitTasks) {
  std::atomic<int> depth{0};
  std::latch done(1);
  WorkQueue q({.threads = 2, .capacity = 4});
  std::function<void(int)> chain = [&](int n) {
    depth.store(n);
    if (n == 50) {
      done.count_down();
      return;
    }
    WorkQueue::Task next = [&chain, n] { chain(n + 1); };
    ASSERT_TRUE(q.TrySubmit(next));
  };
  WorkQueue::Task first = [&chain] { chain(1); };
  ASSERT_TRUE(q.TrySubmit(first));
  done.wait();
  EXPECT_EQ(depth.load(), 50);
}

}  // namespace
}  // namespace tqkv
