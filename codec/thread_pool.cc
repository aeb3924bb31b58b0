#include "codec/thread_pool.h"

#include <algorithm>

namespace tqkv {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::RunOneChunk() {
  int64_t begin, end;
  const std::function<void(int64_t, int64_t)>* fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fn_ == nullptr || next_ >= n_) return false;
    begin = next_;
    end = std::min(n_, begin + chunk_);
    next_ = end;
    fn = fn_;
  }
  (*fn)(begin, end);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ -= end - begin;
    if (pending_ == 0) done_cv_.notify_all();
  }
  return true;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && fn_ != nullptr); });
      if (stop_) return;
      seen = generation_;
    }
    while (RunOneChunk()) {
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n <= min_chunk) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> loop(loop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    // About 4 chunks per thread for balance, never below min_chunk.
    chunk_ = std::max<int64_t>(min_chunk, (n + 4 * size() - 1) / (4 * size()));
    next_ = 0;
    pending_ = n;
    ++generation_;
  }
  work_cv_.notify_all();
  while (RunOneChunk()) {
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

}  // namespace tqkv
