#include "service/put_streams.h"

#include <vector>

#include "base/status_macros.h"

namespace tqkv::service {

PutStreams::PutStreams(const PutStreamLimits& limits, storage::Clock* clock)
    : limits_(limits),
      clock_(clock),
      count_({.total = limits.max_open,
              .per_tenant = limits.max_open_per_tenant,
              .what = "open put streams",
              .total_flag = "--max_put_streams",
              .per_tenant_flag = "--max_put_streams_per_tenant"}) {}

absl::StatusOr<std::unique_ptr<PutSession>> PutStreams::Open(PutContext ctx, const Identity& id) {
  ctx.streams = this;
  ctx.deadline = clock_->Now() + limits_.max_age;
  TenantBudget::Reservation place;
  TQ_RETURN_IF_ERROR(count_.Charge(id.tenant, 1, &place));
  auto s = std::make_unique<PutSession>(ctx, id);
  absl::MutexLock l(&mu_);
  open_.emplace(s.get(), std::move(place));
  return s;
}

void PutStreams::Close(PutSession* s) {
  absl::MutexLock l(&mu_);
  open_.erase(s);  // gives its place back
}

size_t PutStreams::ExpireOld() {
  const absl::Time now = clock_->Now();
  size_t n = 0;
  // Under mu_ a listed session cannot be destroyed (its destructor waits
  // in Close), and TryExpire never waits for a busy one.
  absl::MutexLock l(&mu_);
  for (const auto& [s, place] : open_)
    if (s->TryExpire(now)) ++n;
  return n;
}

size_t PutStreams::open() const {
  absl::MutexLock l(&mu_);
  return open_.size();
}

}  // namespace tqkv::service
