#include "base/parallel_for.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace tqkv::parallel_for_internal {
namespace {

// One RunParts call. Every field is guarded by Helpers::mu_; the job is
// in the queue while it has unclaimed parts, and its caller returns only
// once every claimed part is done, so no helper touches it afterwards.
struct Job {
  const std::function<void(size_t)>* part;
  size_t parts, next = 0, done = 0;
};

class Helpers {
 public:
  // Never destroyed: helpers may be waiting when the process exits.
  static Helpers& Get() {
    static Helpers* const helpers = new Helpers();
    return *helpers;
  }

  void Run(size_t parts, const std::function<void(size_t)>& part) {
    Job job{&part, parts};
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back(&job);
    work_cv_.notify_all();
    while (job.next < job.parts) RunClaimed(&job, lock);
    done_cv_.wait(lock, [&] { return job.done == job.parts; });
  }

 private:
  Helpers() {
    for (size_t i = 0; i < kHelpers; ++i) std::thread([this] { Loop(); }).detach();
  }

  // Claims `job`'s next part, runs it unlocked, counts it done.
  // REQUIRES: lock holds mu_ and the job has an unclaimed part.
  void RunClaimed(Job* job, std::unique_lock<std::mutex>& lock) {
    const size_t p = job->next++;
    if (job->next == job->parts) std::erase(queue_, job);
    lock.unlock();
    (*job->part)(p);
    lock.lock();
    if (++job->done == job->parts) done_cv_.notify_all();
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !queue_.empty(); });
      RunClaimed(queue_.front(), lock);
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job*> queue_;  // jobs with unclaimed parts, oldest first
};

}  // namespace

void RunParts(size_t parts, const std::function<void(size_t)>& part) { Helpers::Get().Run(parts, part); }

}  // namespace tqkv::parallel_for_internal
