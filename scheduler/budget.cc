#include "scheduler/budget.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/alias_fold.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

struct Unit {
  const char* name;  // lower case
  uint64_t factor;
};
constexpr Unit kUnits[] = {
    {"", 1},           {"b", 1},           {"kib", uint64_t{1} << 10}, {"mib", uint64_t{1} << 20},
    {"gib", uint64_t{1} << 30}, {"tib", uint64_t{1} << 40}, {"pib", uint64_t{1} << 50},
    {"eib", uint64_t{1} << 60}, {"kb", 1000},           {"mb", 1000000},
    {"gb", 1000000000},         {"tb", 1000000000000},  {"pb", 1000000000000000},
    {"eb", 1000000000000000000},
};

// Sizes at or above this are refused: INT64_MAX itself means "no budget".
constexpr uint64_t kSizeLimit = 9'200'000'000'000'000'000ull;

// Why a size's text is no size: not a number, a number past the largest
// double ("1e400"), or a unit pebble does not know.
enum class TextProblem { kNone, kNotANumber, kTooLarge, kUnknownUnit };

// Whether `number` is written as a decimal number (ParseDecimal's forms)
// whose value is past the largest double.
bool DecimalTooLarge(absl::string_view number) {
  if (number.empty() || number.find_first_not_of("0123456789+-.eE") != absl::string_view::npos) {
    return false;
  }
  const std::string copy(number);
  char* end = nullptr;
  return std::isinf(std::strtod(copy.c_str(), &end)) && end == copy.c_str() + copy.size();
}

// A size refused for its text (text_problem) or for its value (negative, not
// whole, under a byte, too large: text_problem kNone, `problem` set).
struct SizeParse {
  int64_t bytes = 0;
  TextProblem text_problem = TextProblem::kNone;
  std::string problem;  // empty: ok
};

// `digits` (no sign, no leading or trailing zeros, not empty) times
// 10^`exponent` times `factor`: the whole bytes (rounded down) and whether
// they are exact, computed in integers: 9007199254740993 stays itself.
// False when the value reaches kSizeLimit.
bool ExactBytes(const std::string& digits, int64_t exponent, uint64_t factor, uint64_t* bytes,
                bool* exact) {
  const int64_t k = static_cast<int64_t>(digits.size());
  // value >= 10^(k-1+exponent): 10^19 is past the limit whatever the unit.
  if (k - 1 + exponent >= 19) return false;
  // value < 10^(k+exponent) <= 10^-19, and 10^-19 * 2^60 (EiB) < 1.
  if (k + exponent < -19) {
    *bytes = 0;
    *exact = false;
    return true;
  }
  std::string whole, fraction;
  if (exponent >= 0) {
    whole = digits + std::string(static_cast<size_t>(exponent), '0');
  } else if (k > -exponent) {
    whole = digits.substr(0, static_cast<size_t>(k + exponent));
    fraction = digits.substr(static_cast<size_t>(k + exponent));
  } else {
    fraction = std::string(static_cast<size_t>(-exponent - k), '0') + digits;
  }
  absl::uint128 total = 0;
  for (char c : whole) total = total * 10 + static_cast<unsigned>(c - '0');  // < 10^19
  total *= factor;
  // floor(0.fraction * factor) by long multiplication from the last digit:
  // what carries past the first digit is the whole part, and any digit
  // left behind is a fraction of a byte.
  uint64_t carry = 0;
  *exact = true;
  for (size_t i = fraction.size(); i-- > 0;) {
    const uint64_t t = static_cast<uint64_t>(fraction[i] - '0') * factor + carry;
    if (t % 10 != 0) *exact = false;
    carry = t / 10;
  }
  total += carry;
  if (total >= kSizeLimit) return false;
  *bytes = absl::Uint128Low64(total);
  return true;
}

// `text` split into a decimal number (ParseDecimal's grammar; `*value` its
// approximation) and a unit of kUnits: kNone, else why not with `*problem`
// set.
TextProblem SplitNumberAndUnit(absl::string_view text, absl::string_view* number, double* value,
                               const Unit** unit, std::string* problem) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  // Split the number from the unit: the unit is the trailing run of letters.
  size_t unit_start = s.size();
  while (unit_start > 0 && absl::ascii_isalpha(s[unit_start - 1])) --unit_start;
  // "1e9" ends in a digit; "1.5e" would leave 'e' as a unit, rejected below.
  *number = absl::StripAsciiWhitespace(s.substr(0, unit_start));
  const std::string name = absl::AsciiStrToLower(s.substr(unit_start));
  if (!ParseDecimal(*number, value)) {
    if (DecimalTooLarge(*number)) {
      *problem = "too large";
      return TextProblem::kTooLarge;
    }
    *problem =
        "expected a number of bytes, optionally with a unit (e.g. 1000000, 1.5e9, 512MiB, "
        "8GiB, 2GB)";
    return TextProblem::kNotANumber;
  }
  *unit = nullptr;
  for (const Unit& u : kUnits) {
    if (name == u.name) *unit = &u;
  }
  if (*unit == nullptr) {
    *problem = absl::StrCat("unknown unit ", Quote(s.substr(unit_start)),
                            " (use B, KiB, MiB, GiB, TiB, PiB, EiB, kB, MB, GB, TB, PB or EB)");
    return TextProblem::kUnknownUnit;
  }
  return TextProblem::kNone;
}

SizeParse ParseSizeText(absl::string_view text) {
  SizeParse out;
  absl::string_view number;
  double approximate = 0;
  const Unit* found = nullptr;
  out.text_problem = SplitNumberAndUnit(text, &number, &approximate, &found, &out.problem);
  if (out.text_problem != TextProblem::kNone) return out;
  // The decimal digits and the power of ten they are scaled by.
  const bool negative = number[0] == '-';
  if (number[0] == '-' || number[0] == '+') number.remove_prefix(1);
  std::string digits;
  int64_t exponent = 0;
  size_t i = 0;
  for (; i < number.size() && absl::ascii_isdigit(number[i]); ++i) digits += number[i];
  if (i < number.size() && number[i] == '.') {
    for (++i; i < number.size() && absl::ascii_isdigit(number[i]); ++i) {
      digits += number[i];
      --exponent;
    }
  }
  if (i < number.size()) {  // 'e' or 'E', a sign, digits (ParseDecimal)
    ++i;
    const bool minus = number[i] == '-';
    if (number[i] == '-' || number[i] == '+') ++i;
    int64_t e = 0;
    for (; i < number.size(); ++i) e = std::min<int64_t>(e * 10 + (number[i] - '0'), 1000000);
    exponent += minus ? -e : e;
  }
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
  if (digits.empty()) return out;  // zero, whatever its sign and unit
  while (digits.back() == '0') {
    digits.pop_back();
    ++exponent;
  }
  if (negative) {
    out.problem = "must not be negative";
    return out;
  }
  uint64_t bytes = 0;
  bool exact = false;
  if (!ExactBytes(digits, exponent, found->factor, &bytes, &exact)) {
    out.problem = "too large";
  } else if (!exact && found->factor == 1) {
    out.problem = "not a whole number of bytes (a fraction is taken of a larger unit: 0.5KiB)";
  } else if (bytes == 0) {
    out.problem = "less than one byte (a size is 0 or at least 1 byte)";
  } else {
    out.bytes = static_cast<int64_t>(bytes);  // a larger unit's fraction rounds down
  }
  return out;
}

}  // namespace

absl::StatusOr<int64_t> ParseSize(absl::string_view text) { return ParseSizeOf(text, "size"); }

absl::StatusOr<int64_t> ParseSizeOf(absl::string_view text, absl::string_view subject) {
  const SizeParse parsed = ParseSizeText(text);
  if (!parsed.problem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", subject, " ", Quote(text), ": ", parsed.problem));
  }
  return parsed.bytes;
}

absl::StatusOr<double> ParseByteRate(absl::string_view text) {
  absl::string_view number;
  double value = 0;
  const Unit* unit = nullptr;
  std::string problem;
  if (SplitNumberAndUnit(text, &number, &value, &unit, &problem) != TextProblem::kNone) {
    return absl::InvalidArgumentError(absl::StrCat("invalid rate ", Quote(text), ": ", problem));
  }
  const double rate = value * static_cast<double>(unit->factor);
  if (!std::isfinite(rate) || rate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid rate ", Quote(text), ": must be a non-negative finite number"));
  }
  return rate;
}

absl::Status CheckBudgetHasUnit(absl::string_view text, bool percent_allowed) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  double value = 0;
  // Only numbers that read as a percentage or a fraction with two decimals
  // ("70", "0.6", "0.75"); others ("1e-30", "0.5") meet ParseSize's errors.
  if (!ParseDecimal(t, &value) || value >= 1024 || value <= 0 ||
      std::abs(100 * value - std::round(100 * value)) > 1e-9 * value) {
    return absl::OkStatus();
  }
  std::vector<std::string> readings;
  if (percent_allowed) {
    readings.push_back(value < 1 ? absl::StrCat(absl::StrFormat("%g", 100 * value), "%")
                                 : absl::StrCat(t, "%"));
    readings.push_back(value == std::floor(value) ? absl::StrCat(t, "B")
                                                  : absl::StrCat(t, "GiB"));
  } else {
    readings = {absl::StrCat(t, "MiB"), absl::StrCat(t, "GiB")};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      t, ": did you mean ", absl::StrJoin(readings, " or "),
      "? (a number without a unit is bytes only from 1024 up)"));
}

absl::StatusOr<BudgetSpec> ParseBudget(absl::string_view text) {
  RETURN_IF_ERROR(CheckBudgetHasUnit(text, /*percent_allowed=*/true));
  absl::string_view s = absl::StripAsciiWhitespace(text);
  BudgetSpec spec;
  if (absl::AsciiStrToLower(s) == "min") {
    spec.kind = BudgetSpec::Kind::kMin;
    return spec;
  }
  if (!s.empty() && s.back() == '%') {
    double percent = 0;
    const absl::string_view number = absl::StripAsciiWhitespace(s.substr(0, s.size() - 1));
    if (DecimalTooLarge(number)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid budget ", Quote(text), ": too large"));
    }
    if (!ParseDecimal(number, &percent) || percent <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid budget ", Quote(text), ": a percentage must be a positive number, e.g. 60%"));
    }
    spec.kind = BudgetSpec::Kind::kPercent;
    spec.percent = percent;
    return spec;
  }
  const SizeParse bytes = ParseSizeText(s);
  if (bytes.text_problem == TextProblem::kNotANumber) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid budget ", Quote(text),
        ": expected bytes (8GiB, 1.5e9), a percentage of the baseline peak "
        "(60%) or 'min'"));
  }
  if (!bytes.problem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid budget ", Quote(text), ": ", bytes.problem));
  }
  spec.kind = BudgetSpec::Kind::kBytes;
  spec.bytes = bytes.bytes;
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

absl::StatusOr<Schedule> BaselinePlanSchedule(const Graph& graph) {
  const bool views_read_others = AliasesReadingOthers(graph) > 0;
  if (!graph.has_homes() && !views_read_others) return FreeAtLastUse(graph, DefaultOrder(graph));
  // A view that reads another tensor keeps it while its readers may run
  // (Note [Alias folding]): 100% is the baseline policy's own peak, which
  // every policy plans under, not one that frees that tensor earlier.
  if (!graph.has_homes() && !graph.has_in_place()) {
    ASSIGN_OR_RETURN(const FoldedGraph folded, FoldAliases(graph));
    ASSIGN_OR_RETURN(Schedule schedule,
                     FreeAtLastUse(folded.graph, DefaultOrder(folded.graph)));
    return UnfoldSchedule(graph, folded, schedule);
  }
  // Tensors that move between tiers, or updates beside such views: the
  // baseline policy places their copies and the updates (Note [Updates
  // last]), and folds the views. Auto homes are resident in the baseline,
  // as a framework keeps them (no budget: Note [State placement]).
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> baseline, MakePlanner("baseline"));
  PlannerOptions options;
  if (!graph.has_auto_homes()) options.budget_bytes = PlannerOptions::kMinBudget;
  ASSIGN_OR_RETURN(PlanResult plan, baseline->Plan(graph, options));
  return std::move(plan.schedule);
}

absl::StatusOr<int64_t> BaselinePeak(const Graph& graph) {
  ASSIGN_OR_RETURN(Schedule schedule, BaselinePlanSchedule(graph));
  ASSIGN_OR_RETURN(PlanReport report, Simulate(graph, schedule));
  return report.peak_bytes;
}

const char* DefaultPolicy(int64_t budget_bytes, int64_t baseline_peak) {
  return budget_bytes >= baseline_peak ? kDefaultOneShotPolicy
                                       : kDefaultBelowBaselinePolicy;
}

}  // namespace pebble
