// Status propagation helpers. Abseil 20220623 (Debian 12) ships Status and
// StatusOr but not its status macros, so tqkv defines the two it needs.
#ifndef TQKV_BASE_STATUS_MACROS_H_
#define TQKV_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TQ_CONCAT_INNER_(a, b) a##b
#define TQ_CONCAT_(a, b) TQ_CONCAT_INNER_(a, b)

// Returns `expr` from the enclosing function if it is not OK.
#define TQ_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status tq_status_ = (expr);          \
    if (!tq_status_.ok()) return tq_status_;     \
  } while (0)

// `lhs = value of expr`, or returns its error status.
#define TQ_ASSIGN_OR_RETURN(lhs, expr) \
  TQ_ASSIGN_OR_RETURN_IMPL_(TQ_CONCAT_(tq_statusor_, __LINE__), lhs, expr)
#define TQ_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // TQKV_BASE_STATUS_MACROS_H_
