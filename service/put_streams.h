// PutStreams: the server's open put streams (gRPC PutBlocks and data-plane
// put streams alike). An open stream holds host memory for its blocks
// until it commits or ends, so how many are open and for how long is
// bounded: at most max_open in all and max_open_per_tenant of one tenant
// (one more is RESOURCE_EXHAUSTED naming the flag), and a stream open
// longer than max_age fails with DEADLINE_EXCEEDED: at its next message,
// or, when it sends nothing, by ExpireOld (run periodically), which
// releases its reservations while its client still holds it open.
//
// Thread safety: every method may be called concurrently.
#ifndef TQKV_SERVICE_PUT_STREAMS_H_
#define TQKV_SERVICE_PUT_STREAMS_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/put_session.h"
#include "service/tenant_budget.h"

namespace tqkv::service {

struct PutStreamLimits {
  // Open streams, all tenants. Default: 4096.
  size_t max_open = 4096;
  // Open streams of one tenant. Default: 256.
  size_t max_open_per_tenant = 256;
  // Longest a stream may stay open. Default: 10 minutes.
  absl::Duration max_age = absl::Minutes(10);
};

class PutStreams {
 public:
  // `clock` is not owned and must outlive this.
  PutStreams(const PutStreamLimits& limits, storage::Clock* clock);
  PutStreams(const PutStreams&) = delete;
  PutStreams& operator=(const PutStreams&) = delete;

  // A new stream's session over `ctx` (ctx.streams is set to this), or
  // RESOURCE_EXHAUSTED when a cap is reached. The session leaves the count
  // when it is destroyed.
  absl::StatusOr<std::unique_ptr<PutSession>> Open(PutContext ctx, const Identity& id);

  // Fails every stream open longer than max_age that no thread is using
  // right now (a busy one fails at its next message); returns how many.
  size_t ExpireOld();

  size_t open() const;
  const PutStreamLimits& limits() const { return limits_; }

 private:
  friend class PutSession;
  void Close(PutSession* s);  // from ~PutSession

  const PutStreamLimits limits_;
  storage::Clock* const clock_;
  TenantBudget count_;  // open streams; outlives open_
  mutable absl::Mutex mu_;
  absl::flat_hash_map<PutSession*, TenantBudget::Reservation> open_ ABSL_GUARDED_BY(mu_);  // → its place
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_PUT_STREAMS_H_
