// Sizes and budgets as the command line takes them (SPEC section 5).
#ifndef PEBBLE_SCHEDULER_BUDGET_H_
#define PEBBLE_SCHEDULER_BUDGET_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/schedule.h"

namespace pebble {

// "1000000", "1.5e9", "512MiB", "8GiB", "64KB", "2 GB" -> bytes. Binary units
// KiB MiB GiB TiB are powers of 1024, decimal ones kB/KB MB GB TB of 1000;
// "B" is bytes. Computed exactly in integers (9007199254740993 is itself, not
// the nearest double). A fraction of a larger unit rounds down to whole bytes
// ("0.1GiB" is 107374182); InvalidArgument naming the text for a number of
// bytes that is not whole ("0.5", "2.7B"), a size under one byte that is not
// 0 ("1e-30", "1e-30GiB"), a negative size, 9.2e18 bytes or more, and
// anything that is not a decimal number with an optional unit.
absl::StatusOr<int64_t> ParseSize(absl::string_view text);
// ParseSize, its errors naming the text as `subject` ("invalid budget
// '1XB': ...") rather than as a size.
absl::StatusOr<int64_t> ParseSizeOf(absl::string_view text, absl::string_view subject);

// A number of bytes per unit of time ("25e9", "12.5GB", "1000.5"): the forms
// of ParseSize, but a rate need not be whole. Negative, non-finite or
// malformed: InvalidArgument naming the text.
absl::StatusOr<double> ParseByteRate(absl::string_view text);

// The planner's marker for "as low as the policy can go" (--budget min).
inline constexpr int64_t kMinBudgetBytes = -1;

// A --budget argument: bytes, a percentage of the baseline peak, or "min".
struct BudgetSpec {
  enum class Kind { kBytes, kPercent, kMin } kind = Kind::kBytes;
  int64_t bytes = 0;     // kBytes
  double percent = 100;  // kPercent
};
// Refuses a bare number under 1024 (CheckBudgetHasUnit).
absl::StatusOr<BudgetSpec> ParseBudget(absl::string_view text);

// A budget given as a bare number above 0 and under 1024 ("70", "0.6") is
// refused: it reads as a percentage or a fraction, not as a handful of
// bytes, and the error gives the readings it may have meant ("70: did you
// mean 70% or 70B?"). Larger bare numbers stay bytes ("8589934592").
// `percent_allowed`: whether to offer a percentage (fit's budget takes
// bytes only).
absl::Status CheckBudgetHasUnit(absl::string_view text, bool percent_allowed);

// Bytes for the planner: kPercent of `baseline_peak` (rounded down), kMin as
// kMinBudgetBytes.
int64_t ResolveBudget(const BudgetSpec& spec, int64_t baseline_peak);

// The baseline policy's schedule: the graph's own order, freed at last use
// (with the copies of tensors that move between tiers, where the graph has
// homes: Note [Updates last]).
absl::StatusOr<Schedule> BaselinePlanSchedule(const Graph& graph);

// The peak of the baseline policy's schedule: the reference of percentage
// budgets.
absl::StatusOr<int64_t> BaselinePeak(const Graph& graph);

// The policy `plan` and `run` use when none is given: the best one-shot
// order ("best-order") when the budget is at least the baseline peak, else
// the joint recompute-or-swap planner ("hybrid").
inline constexpr char kDefaultOneShotPolicy[] = "best-order";
inline constexpr char kDefaultBelowBaselinePolicy[] = "hybrid";
const char* DefaultPolicy(int64_t budget_bytes, int64_t baseline_peak);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_BUDGET_H_
