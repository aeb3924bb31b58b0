#include "service/put_streams.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace tqkv::service {

absl::StatusOr<std::unique_ptr<PutSession>> PutStreams::Open(PutContext ctx, const Identity& id) {
  ctx.streams = this;
  ctx.deadline = clock_->Now() + limits_.max_age;
  absl::MutexLock l(&mu_);
  if (open_.size() >= limits_.max_open)
    return absl::ResourceExhaustedError(absl::StrCat("the server has ", open_.size(),
                                                     " open put streams (--max_put_streams); retry later"));
  size_t& mine = per_tenant_[id.tenant];
  if (mine >= limits_.max_open_per_tenant)
    return absl::ResourceExhaustedError(absl::StrCat("this tenant has ", mine,
                                                     " open put streams (--max_put_streams_per_tenant); end one first"));
  auto s = std::make_unique<PutSession>(ctx, id);
  ++mine;
  open_.emplace(s.get(), id.tenant);
  return s;
}

void PutStreams::Close(PutSession* s) {
  absl::MutexLock l(&mu_);
  auto it = open_.find(s);
  if (it == open_.end()) return;
  auto t = per_tenant_.find(it->second);
  if (t != per_tenant_.end() && --t->second == 0) per_tenant_.erase(t);
  open_.erase(it);
}

size_t PutStreams::ExpireOld() {
  const absl::Time now = clock_->Now();
  size_t n = 0;
  // Under mu_ a listed session cannot be destroyed (its destructor waits
  // in Close), and TryExpire never waits for a busy one.
  absl::MutexLock l(&mu_);
  for (const auto& [s, tenant] : open_)
    if (s->TryExpire(now)) ++n;
  return n;
}

size_t PutStreams::open() const {
  absl::MutexLock l(&mu_);
  return open_.size();
}

}  // namespace tqkv::service
