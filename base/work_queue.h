// WorkQueue: a few worker threads that run submitted tasks in submission
// order, with a bound on the tasks waiting. The server hands each
// request's GPU work to one (the device's queue), so the threads that
// serve the network never wait for the GPU: TrySubmit refuses a task when
// the queue is full, and the caller holds the request back (backpressure)
// instead of queueing without bound.
//
// A worker that runs out of tasks spins for `spin` before it sleeps, so a
// stream of short tasks (tens of microseconds apart) does not pay a thread
// wake-up each.
//
// Thread safety: TrySubmit and the accessors may be called from any
// thread, also from a task.
#ifndef TQKV_BASE_WORK_QUEUE_H_
#define TQKV_BASE_WORK_QUEUE_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

namespace tqkv {

class WorkQueue {
 public:
  struct Options {
    int threads = 1;          // workers, 1..64
    size_t capacity = 64;     // tasks waiting (not yet started) at most, >= 1
    absl::Duration spin = absl::Microseconds(200);  // a worker's wait for work before it sleeps
  };
  using Task = absl::AnyInvocable<void() &&>;

  // REQUIRES: options within the ranges above.
  explicit WorkQueue(const Options& options);
  // Runs every task already submitted, then joins the workers.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`; false (and `task` untouched) when `capacity` tasks are
  // already waiting.
  bool TrySubmit(Task& task);

  size_t waiting() const { return waiting_.load(std::memory_order_relaxed); }
  size_t capacity() const { return options_.capacity; }
  uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  void Work();
  // The next task, or false once stopping with nothing left.
  bool Next(Task* task);

  const Options options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;  // guarded by mu_
  int sleepers_ = 0;        // guarded by mu_: workers waiting on cv_
  bool stop_ = false;       // guarded by mu_
  std::atomic<size_t> waiting_{0};  // tasks_.size(), readable without mu_ (spinning workers poll it)
  std::atomic<uint64_t> refusals_{0};
  std::vector<std::thread> workers_;
};

}  // namespace tqkv

#endif  // TQKV_BASE_WORK_QUEUE_H_
