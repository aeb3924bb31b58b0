// TenantBudget: a quantity (bytes, streams, sequences) that tenants take
// from a cap for all tenants together and a cap for each one. A charge that
// would pass either cap is refused with RESOURCE_EXHAUSTED naming the flag
// that sets it, and takes nothing; a Reservation gives back what it holds
// when it is destroyed, so memory is charged before it is allocated and
// returned when it is freed.
//
// Thread safety: thread-safe. Reservations of one budget may live on any
// thread; the budget must outlive them.
#ifndef TQKV_SERVICE_TENANT_BUDGET_H_
#define TQKV_SERVICE_TENANT_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tqkv::service {

struct TenantBudgetLimits {
  uint64_t total = UINT64_MAX;       // all tenants together
  uint64_t per_tenant = UINT64_MAX;  // each tenant
  // For messages: what is counted ("live sequences", "bytes of decode
  // sequences") and the flags that set the caps.
  std::string what = "units";
  std::string total_flag, per_tenant_flag;
};

class TenantBudget {
 public:
  explicit TenantBudget(TenantBudgetLimits limits) : limits_(std::move(limits)) {}
  TenantBudget(const TenantBudget&) = delete;
  TenantBudget& operator=(const TenantBudget&) = delete;

  // What one tenant holds of the budget; empty (tenant and budget null)
  // when default-constructed or moved from. Move-only.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept { *this = std::move(o); }
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { Reset(); }

    uint64_t amount() const { return amount_; }
    // Adds `o`'s amount to this one; `o` becomes empty. REQUIRES: both of
    // one budget and tenant, or one of them empty.
    void Absorb(Reservation&& o);
    // Gives back `n` of the amount now (REQUIRES: n <= amount()).
    void Release(uint64_t n);
    // Gives back everything now.
    void Reset() { Release(amount_); }

   private:
    friend class TenantBudget;
    TenantBudget* budget_ = nullptr;
    std::string tenant_;
    uint64_t amount_ = 0;
  };

  // Charges `n` to `tenant` and adds it to *out (empty, or of this budget
  // and tenant), or RESOURCE_EXHAUSTED (nothing charged) when the tenant's
  // or the total would pass its cap. n = 0 always succeeds.
  absl::Status Charge(const std::string& tenant, uint64_t n, Reservation* out);

  uint64_t used() const;
  uint64_t used(const std::string& tenant) const;
  const TenantBudgetLimits& limits() const { return limits_; }

 private:
  void Give(const std::string& tenant, uint64_t n);

  const TenantBudgetLimits limits_;
  mutable absl::Mutex mu_;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> per_tenant_ ABSL_GUARDED_BY(mu_);  // nonzero entries only
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_TENANT_BUDGET_H_
