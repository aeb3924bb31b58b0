// Time source injected into storage components so that tests control lease
// expiry and LRU order without sleeping.
#ifndef TQKV_STORAGE_CLOCK_H_
#define TQKV_STORAGE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tqkv::storage {

// Implementations must be thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
};

// Wall-clock time (absl::Now()). Stateless and thread-safe.
class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
};

// A clock that moves only when told to. Thread-safe. Starts at the Unix
// epoch plus one day unless given a start time.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24)) : now_(start) {}

  absl::Time Now() override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Set(absl::Time t) {
    absl::MutexLock l(&mu_);
    now_ = t;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tqkv::storage

#endif  // TQKV_STORAGE_CLOCK_H_
