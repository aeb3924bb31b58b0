#include "base/work_queue.h"

#include <chrono>
#include <utility>

namespace tqkv {

WorkQueue::WorkQueue(const Options& options) : options_(options) {
  workers_.reserve(static_cast<size_t>(options_.threads));
  for (int i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { Work(); });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool WorkQueue::TrySubmit(Task& task) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (tasks_.size() >= options_.capacity) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    tasks_.push_back(std::move(task));
    waiting_.store(tasks_.size(), std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) cv_.notify_one();
  return true;
}

bool WorkQueue::Next(Task* task) {
  const auto spin_until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options_.spin);
  while (waiting_.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < spin_until) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  std::unique_lock<std::mutex> l(mu_);
  while (tasks_.empty() && !stop_) {
    ++sleepers_;
    cv_.wait(l);
    --sleepers_;
  }
  if (tasks_.empty()) return false;
  *task = std::move(tasks_.front());
  tasks_.pop_front();
  waiting_.store(tasks_.size(), std::memory_order_release);
  return true;
}

void WorkQueue::Work() {
  Task task;
  while (Next(&task)) {
    std::move(task)();
    task = nullptr;  // what the task holds is released before the next wait
  }
}

}  // namespace tqkv
