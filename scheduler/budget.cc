#include "scheduler/budget.h"

#include <algorithm>
#include <charconv>
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

namespace {

__extension__ using Uint128 = unsigned __int128;

// floor(peak x percent / 100), exactly, for the percentage as written: the
// shortest decimal that reads back as `percent` ("33.3", not the double's
// 33.29999...), as digits x 10^exponent, in 128-bit integers. Doubles
// would round a peak past 2^53, and some below it: 100% was not the peak.
// Saturates at INT64_MAX; 0 for a peak or percentage that is not positive.
int64_t PercentOf(int64_t peak, double percent) {
  if (!(percent > 0) || peak <= 0) return 0;
  if (std::isinf(percent)) return INT64_MAX;
  char text[64];
  const auto [end, ec] =
      std::to_chars(text, text + sizeof text, percent, std::chars_format::scientific);
  PEBBLE_CHECK(ec == std::errc() && std::find(text, end, 'e') != end, "to_chars of a double");
  // "d.ddde+XX": the digits, then the power of ten of the first one.
  Uint128 value = static_cast<Uint128>(peak);
  Uint128 digits = 0;
  int exponent = 0;
  const char* p = text;
  for (; p != end && *p != 'e'; ++p) {
    if (*p == '.') continue;
    digits = digits * 10 + static_cast<unsigned>(*p - '0');
    --exponent;  // each digit after the first is a tenth of the one before
  }
  const char* power_text = p + 1;  // "+01", "-05": from_chars takes no '+'
  if (power_text != end && *power_text == '+') ++power_text;
  int power = 0;
  std::from_chars(power_text, end, power);
  exponent += 1 + power - 2;  // the first digit's power; "/ 100"
  value *= digits;  // below 2^63 x 10^17 < 2^120
  constexpr auto kMax = static_cast<Uint128>(INT64_MAX);
  for (; exponent > 0 && value != 0; --exponent) {
    if (value > kMax) return INT64_MAX;
    value *= 10;
  }
  for (; exponent < 0 && value != 0; ++exponent) value /= 10;
  return value > kMax ? INT64_MAX : static_cast<int64_t>(value);
}

}  // namespace

int64_t ResolveBudget(const BudgetSpec& spec, int64_t baseline_peak) {
  switch (spec.kind) {
    case BudgetSpec::Kind::kBytes:
      return spec.bytes;
    case BudgetSpec::Kind::kPercent:
      return PercentOf(baseline_peak, spec.percent);
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
