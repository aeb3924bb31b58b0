#include "service/tenant_budget.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tqkv::service {

TenantBudget::Reservation& TenantBudget::Reservation::operator=(Reservation&& o) noexcept {
  if (this == &o) return *this;
  Reset();
  budget_ = std::exchange(o.budget_, nullptr);
  tenant_ = std::move(o.tenant_);
  amount_ = std::exchange(o.amount_, 0);
  return *this;
}

void TenantBudget::Reservation::Absorb(Reservation&& o) {
  if (o.budget_ == nullptr) return;
  if (budget_ == nullptr) {
    *this = std::move(o);
    return;
  }
  amount_ += std::exchange(o.amount_, 0);
  o.budget_ = nullptr;
}

void TenantBudget::Reservation::Release(uint64_t n) {
  if (budget_ == nullptr || n == 0) return;
  budget_->Give(tenant_, n);
  amount_ -= n;
}

absl::Status TenantBudget::Charge(const std::string& tenant, uint64_t n, Reservation* out) {
  if (n > 0) {
    absl::MutexLock l(&mu_);
    const auto it = per_tenant_.find(tenant);
    const uint64_t mine = it == per_tenant_.end() ? 0 : it->second;
    if (n > limits_.per_tenant - std::min(mine, limits_.per_tenant))
      return absl::ResourceExhaustedError(absl::StrCat("this tenant holds ", mine, " ", limits_.what, "; ", n,
                                                       " more would pass its cap of ", limits_.per_tenant, " (",
                                                       limits_.per_tenant_flag, ")"));
    if (n > limits_.total - std::min(total_, limits_.total))
      return absl::ResourceExhaustedError(absl::StrCat("the server holds ", total_, " ", limits_.what, "; ", n,
                                                       " more would pass its cap of ", limits_.total, " (",
                                                       limits_.total_flag, "); retry later"));
    total_ += n;
    per_tenant_[tenant] = mine + n;
  }
  Reservation r;
  r.budget_ = this;
  r.tenant_ = tenant;
  r.amount_ = n;
  out->Absorb(std::move(r));
  return absl::OkStatus();
}

void TenantBudget::Give(const std::string& tenant, uint64_t n) {
  absl::MutexLock l(&mu_);
  total_ -= n;
  auto it = per_tenant_.find(tenant);
  if (it != per_tenant_.end() && (it->second -= n) == 0) per_tenant_.erase(it);
}

uint64_t TenantBudget::used() const {
  absl::MutexLock l(&mu_);
  return total_;
}

uint64_t TenantBudget::used(const std::string& tenant) const {
  absl::MutexLock l(&mu_);
  const auto it = per_tenant_.find(tenant);
  return it == per_tenant_.end() ? 0 : it->second;
}

}  // namespace tqkv::service
