#include "scheduler/budget.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

struct Unit {
  const char* name;  // lower case
  double factor;
};
constexpr Unit kUnits[] = {
    {"", 1},          {"b", 1},          {"kib", 1024.0},
    {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
    {"kb", 1e3},      {"mb", 1e6},       {"gb", 1e9},
    {"tb", 1e12},
};

}  // namespace

absl::StatusOr<int64_t> ParseSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  // Split the number from the unit: the unit is the trailing run of letters.
  size_t unit_start = s.size();
  while (unit_start > 0 && absl::ascii_isalpha(s[unit_start - 1])) --unit_start;
  // "1e9" ends in a digit; "1.5e" would leave 'e' as a unit, rejected below.
  absl::string_view number = absl::StripAsciiWhitespace(s.substr(0, unit_start));
  const std::string unit = absl::AsciiStrToLower(s.substr(unit_start));
  double value = 0;
  if (!ParseDecimal(number, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid size ", Quote(text),
        ": expected a number of bytes, optionally with a unit (e.g. 1000000, "
        "1.5e9, 512MiB, 8GiB, 2GB)"));
  }
  const Unit* found = nullptr;
  for (const Unit& u : kUnits) {
    if (unit == u.name) found = &u;
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid size ", Quote(text), ": unknown unit ", Quote(s.substr(unit_start)),
        " (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"));
  }
  const double bytes = value * found->factor;
  if (!std::isfinite(bytes) || bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid size ", Quote(text), ": must be a non-negative finite number"));
  }
  if (bytes >= 9.2e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid size ", Quote(text), ": too large"));
  }
  return static_cast<int64_t>(std::floor(bytes));
}

absl::StatusOr<BudgetSpec> ParseBudget(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  BudgetSpec spec;
  if (absl::AsciiStrToLower(s) == "min") {
    spec.kind = BudgetSpec::Kind::kMin;
    return spec;
  }
  if (!s.empty() && s.back() == '%') {
    double percent = 0;
    if (!ParseDecimal(absl::StripAsciiWhitespace(s.substr(0, s.size() - 1)), &percent) ||
        percent <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid budget ", Quote(text), ": a percentage must be a positive number, e.g. 60%"));
    }
    spec.kind = BudgetSpec::Kind::kPercent;
    spec.percent = percent;
    return spec;
  }
  auto bytes = ParseSize(s);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid budget ", Quote(text),
        ": expected bytes (8GiB, 1.5e9), a percentage of the baseline peak "
        "(60%) or 'min'"));
  }
  spec.kind = BudgetSpec::Kind::kBytes;
  spec.bytes = *bytes;
  return spec;
}

int64_t ResolveBudget(const BudgetSpec& spec, int64_t baseline_peak) {
  switch (spec.kind) {
    case BudgetSpec::Kind::kBytes:
      return spec.bytes;
    case BudgetSpec::Kind::kPercent:
      return static_cast<int64_t>(
          std::floor(static_cast<double>(baseline_peak) * spec.percent / 100.0));
    case BudgetSpec::Kind::kMin:
      return kMinBudgetBytes;
  }
  return spec.bytes;
}

absl::StatusOr<int64_t> BaselinePeak(const Graph& graph) {
  ASSIGN_OR_RETURN(Schedule schedule, FreeAtLastUse(graph, DefaultOrder(graph)));
  ASSIGN_OR_RETURN(PlanReport report, Simulate(graph, schedule));
  return report.peak_bytes;
}

const char* DefaultPolicy(int64_t budget_bytes, int64_t baseline_peak) {
  return budget_bytes >= baseline_peak ? kDefaultOneShotPolicy
                                       : kDefaultBelowBaselinePolicy;
}

}  // namespace pebble
