#pragma once
// Early-return helpers for absl::Status / absl::StatusOr across module borders.
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LH_CONCAT_INNER(a, b) a##b
#define LH_CONCAT(a, b) LH_CONCAT_INNER(a, b)

#define LH_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status lh_status_ = (expr);          \
    if (!lh_status_.ok()) return lh_status_;     \
  } while (0)

#define LH_ASSIGN_OR_RETURN(lhs, expr) LH_ASSIGN_OR_RETURN_IMPL(LH_CONCAT(lh_or_, __LINE__), lhs, expr)
#define LH_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
