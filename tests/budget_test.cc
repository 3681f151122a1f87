#include "scheduler/budget.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

TEST(ParseSizeTest, AcceptsBytesAndUnits) {
  EXPECT_EQ(*ParseSize("1000000"), 1000000);
  EXPECT_EQ(*ParseSize("1.5e9"), 1500000000);
  EXPECT_EQ(*ParseSize("512MiB"), 512LL << 20);
  EXPECT_EQ(*ParseSize("8GiB"), 8LL << 30);
  EXPECT_EQ(*ParseSize("8 gib"), 8LL << 30);
  EXPECT_EQ(*ParseSize("2GB"), 2000000000);
  EXPECT_EQ(*ParseSize("64kB"), 64000);
  EXPECT_EQ(*ParseSize("1.5KiB"), 1536);
  EXPECT_EQ(*ParseSize("10B"), 10);
  EXPECT_EQ(*ParseSize("0"), 0);
  EXPECT_EQ(*ParseSize("2.7KiB"), 2764);  // a unit's fraction rounds down to whole bytes
  // The units pebble prints its sizes in, up to the largest size it takes.
  EXPECT_EQ(*ParseSize("1PiB"), int64_t{1} << 50);
  EXPECT_EQ(*ParseSize("7EiB"), int64_t{7} << 60);
  EXPECT_EQ(*ParseSize("2PB"), int64_t{2'000'000'000'000'000});
  EXPECT_EQ(*ParseSize("9EB"), int64_t{9'000'000'000'000'000'000});
  EXPECT_EQ(*ParseSize("1e-14EiB"), 11529);  // 2^60 / 10^14, rounded down
  EXPECT_THAT(ParseSize("8EiB").status().message(), HasSubstr("too large"));
}

TEST(ParseSizeTest, RejectsGarbage) {
  for (const char* bad : {"", "abc", "-5", "5XB", "1.5e", "GiB", "1e30", "inf", "nan", "0x10",
                          "0x1p4", "1e", "+", ".", "1..2", "infinity", "1 0"}) {
    auto r = ParseSize(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseBudgetTest, RejectsHexNanAndInfinitePercentages) {
  for (const char* bad : {"0x10", "nan", "nan%", "inf%", "0x10%", "-5%", "0%", "%", ""}) {
    EXPECT_FALSE(ParseBudget(bad).ok()) << bad;
  }
  EXPECT_EQ(ParseBudget("1e2%")->percent, 100);
  // A unit pebble does not know is named, with the ones it knows.
  EXPECT_THAT(ParseBudget("1ZiB").status().message(),
              HasSubstr("unknown unit 'ZiB' (use B, KiB, MiB, GiB, TiB, PiB, EiB"));
  // A number past the largest double is too large, as 1e19 is, not "expected
  // bytes" (nor "a percentage must be a positive number").
  for (const char* huge : {"1e19", "1e400", "1e400GiB", "1e400%"}) {
    EXPECT_EQ(ParseBudget(huge).status().message(),
              absl::StrCat("invalid budget '", huge, "': too large"))
        << huge;
  }
  EXPECT_EQ(ParseSize("1e400").status().message(), "invalid size '1e400': too large");
  EXPECT_THAT(ParseByteRate("1e400").status().message(), HasSubstr("too large"));
}

TEST(BudgetTest, ParsesTheThreeForms) {
  auto min = ParseBudget("min");
  ASSERT_TRUE(min.ok());
  EXPECT_EQ(min->kind, BudgetSpec::Kind::kMin);
  EXPECT_EQ(ResolveBudget(*min, 1000), kMinBudgetBytes);

  auto percent = ParseBudget("60%");
  ASSERT_TRUE(percent.ok());
  EXPECT_EQ(percent->kind, BudgetSpec::Kind::kPercent);
  EXPECT_EQ(ResolveBudget(*percent, 1000), 600);
  EXPECT_EQ(ResolveBudget(*ParseBudget("33.3%"), 1000), 333);

  auto bytes = ParseBudget("2GiB");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(ResolveBudget(*bytes, 1), 2LL << 30);

  for (const char* bad : {"0%", "-10%", "x%", "lots", ""}) {
    EXPECT_FALSE(ParseBudget(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseBudget("lots").status().message()),
              ::testing::HasSubstr("'min'"));
}

TEST(BudgetTest, PercentagesResolveExactlyHoweverLargeThePeak) {
  auto percent = [](const char* text) { return *ParseBudget(text); };
  // Peaks a double cannot hold, and ones it holds where peak x 100.0 / 100.0
  // still rounds (4503599627365503 -> one byte less).
  for (int64_t peak : {int64_t{4503599627365503}, (int64_t{1} << 53) + 1,
                       (int64_t{1} << 62) + 7, INT64_MAX}) {
    EXPECT_EQ(ResolveBudget(percent("100%"), peak), peak) << peak;
    EXPECT_EQ(ResolveBudget(percent("50%"), peak), peak / 2) << peak;
    EXPECT_EQ(ResolveBudget(percent("12.5%"), peak), peak / 8) << peak;
    EXPECT_EQ(ResolveBudget(percent("1e2%"), peak), peak) << peak;
  }
  EXPECT_EQ(ResolveBudget(percent("50%"), 1000000000000002), 500000000000001);
  EXPECT_EQ(ResolveBudget(percent("33.3%"), 1000000000000000), 333000000000000);
  EXPECT_EQ(ResolveBudget(percent("99.9%"), 1000000000000001), 999000000000000);
  // The percentage as written, not its double (33.29999...): 998 in doubles.
  EXPECT_EQ(ResolveBudget(percent("33.3%"), 3000), 999);
  EXPECT_EQ(ResolveBudget(percent("0.7%"), 11000), 77);
  EXPECT_EQ(ResolveBudget(percent("0.001%"), 100000), 1);
  EXPECT_EQ(ResolveBudget(percent("150%"), 3), 4);
  EXPECT_EQ(ResolveBudget(percent("100%"), 0), 0);
  // Far outside int64: saturated, not undefined.
  EXPECT_EQ(ResolveBudget(percent("1e300%"), 1000), INT64_MAX);
  EXPECT_EQ(ResolveBudget(percent("200%"), INT64_MAX), INT64_MAX);
  EXPECT_EQ(ResolveBudget(percent("1e-300%"), INT64_MAX), 0);
}

TEST(BudgetTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(8LL << 30), "8.00 GiB");
  EXPECT_EQ(FormatBytes(150LL << 20), "150 MiB");
}

TEST(BudgetTest, BaselinePeakOfAChain) {
  // a (100) -> b (100) -> c (50): peak 200 while b is computed.
  Graph g = testing::MakeGraph({testing::Node("a", 100), testing::Node("b", 100, {"a"}),
                                testing::Node("c", 50, {"b"})},
                               {"c"});
  EXPECT_EQ(*BaselinePeak(g), 200);
}

}  // namespace
}  // namespace pebble
