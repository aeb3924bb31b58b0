// A fixed-size thread pool with a blocking ParallelFor, for the CPU backend.
#ifndef TQKV_CODEC_THREAD_POOL_H_
#define TQKV_CODEC_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tqkv {

// Thread safety: ParallelFor may be called from several threads at once;
// calls are serialised (one parallel loop runs at a time, using every worker
// plus the calling thread).
class ThreadPool {
 public:
  // `threads` workers in addition to the caller; 0 runs loops inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into chunks of at least
  // `min_chunk` items; returns when every chunk is done.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  bool RunOneChunk();

  std::mutex loop_mu_;  // serialises ParallelFor calls; taken before mu_
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;  // guarded by mu_
  int64_t n_ = 0, chunk_ = 1, next_ = 0, pending_ = 0;         // guarded by mu_
  uint64_t generation_ = 0;                                    // guarded by mu_
  bool stop_ = false;                                          // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace tqkv

#endif  // TQKV_CODEC_THREAD_POOL_H_
