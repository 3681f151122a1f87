// Error handling for pebble (see docs/architecture.md, "Two error channels").
//
// Bad input, infeasible budgets and device failures travel as absl::Status /
// absl::StatusOr. A broken internal invariant is a bug: PEBBLE_CHECK aborts
// with the file, line and message, in every build type.
//
// The Abseil release pebble targets (20220623) has no status macros, so the
// two that the code base needs are defined here.
#ifndef PEBBLE_GRAPH_STATUS_H_
#define PEBBLE_GRAPH_STATUS_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PEBBLE_STATUS_CONCAT_INNER_(a, b) a##b
#define PEBBLE_STATUS_CONCAT_(a, b) PEBBLE_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                                      \
  do {                                                             \
    ::absl::Status pebble_status_ = (expr);                        \
    if (!pebble_status_.ok()) return pebble_status_;               \
  } while (false)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on
// error returns its status, else moves the value into `lhs`, which may be a
// declaration (`auto x`) or an existing variable.
#define ASSIGN_OR_RETURN(lhs, expr)                                          \
  ASSIGN_OR_RETURN_IMPL_(PEBBLE_STATUS_CONCAT_(pebble_statusor_, __LINE__), \
                         lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

namespace pebble::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line,
                                     const char* condition,
                                     const char* message) {
  std::fprintf(stderr, "pebble: internal error at %s:%d: check '%s' failed%s%s\n",
               file, line, condition, message[0] ? ": " : "", message);
  std::abort();
}
}  // namespace pebble::internal

// Always-on invariant check. The optional second argument is a C string.
#define PEBBLE_CHECK(condition, ...)                                    \
  do {                                                                  \
    if (!(condition))                                                   \
      ::pebble::internal::CheckFailed(__FILE__, __LINE__, #condition,   \
                                      "" __VA_ARGS__);                  \
  } while (false)

#endif  // PEBBLE_GRAPH_STATUS_H_
