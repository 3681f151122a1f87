// What the Python module relies on from the C++ side, under hostile input
// (the module's own tests: tests/python/test_reliability.py).
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/external_policy.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

ScheduleFunction Empty() {
  return [](const Graph&, const PlannerOptions&) -> absl::StatusOr<Schedule> {
    return Schedule{};
  };
}

TEST(RegisterExternalPolicyTest, AMalformedNameIsQuotedWithItsControlCharactersEscaped) {
  // A NUL used to end the message for C callers (and Python's), and a
  // newline split it.
  const absl::Status nul =
      RegisterExternalPolicy(std::string("a\0b", 3), "", PlanKind::kOneShot, Empty());
  EXPECT_EQ(nul.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nul.message()),
              HasSubstr("policy name 'a\\x00b' must be 1 to 64 letters"));
  const absl::Status newline = RegisterExternalPolicy("a\nb", "", PlanKind::kOneShot, Empty());
  EXPECT_THAT(std::string(newline.message()), HasSubstr("'a\\nb'"));
  EXPECT_EQ(std::string(newline.message()).find('\n'), std::string::npos);
}

}  // namespace
}  // namespace pebble
