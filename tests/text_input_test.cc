#include "graph/text_input.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(PrintableTest, EscapesControlCharactersAndCuts) {
  EXPECT_EQ(Printable("a\nb\tc\rd\x01"), "a\\nb\\tc\\rd\\x01");
  EXPECT_EQ(Printable(std::string(100, 'x'), 10), std::string(10, 'x') + "...");
  EXPECT_EQ(Quote("conv\n1"), "'conv\\n1'");
  // Well-formed UTF-8 stays as it is; a byte of no character is escaped, so
  // an error message is valid text whatever a path or id holds.
  EXPECT_EQ(Printable("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(Printable("bad\xff.json"), "bad\\xff.json");
  EXPECT_EQ(Printable("cut\xc3"), "cut\\xc3");            // a truncated sequence
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
}

TEST(ParseDecimalTest, TakesWhatPeopleWrite) {
  double x = 0;
  for (const auto& [text, want] :
       std::vector<std::pair<std::string, double>>{{"12", 12},     {"-0.5", -0.5}, {"1.5e9", 1.5e9},
                                                   {".5", 0.5},    {"5.", 5},      {"+3", 3},
                                                   {"1E-3", 1e-3}, {"007", 7}}) {
    ASSERT_TRUE(ParseDecimal(text, &x)) << text;
    EXPECT_EQ(x, want) << text;
  }
}

TEST(ParseDecimalTest, RefusesHexInfinityNanAndBlanks) {
  double x = 42;
  for (const char* bad : {"", "0x10", "0X1p3", "inf", "-inf", "nan", "NaN", "infinity", " 1",
                          "1 ", "1e", "1e+", "e5", ".", "-", "1.2.3", "1e999", "1,5"}) {
    EXPECT_FALSE(ParseDecimal(bad, &x)) << bad;
  }
  EXPECT_EQ(x, 42);  // untouched on failure
}

class TextFileTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) {
    return (::pebble::testing::ScratchDir("text_input", name) / name).string();
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = Path(name);
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
};

TEST_F(TextFileTest, ReadsAWholeFileWithinTheBound) {
  const std::string path = Write("small.json", "{\"a\": 1}");
  absl::StatusOr<std::string> text = ReadBoundedFile(path, "test file", 8);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"a\": 1}");
  EXPECT_THAT(Message(ReadBoundedFile(path, "test file", 7).status()),
              HasSubstr("larger than 7 bytes"));
}

TEST_F(TextFileTest, RefusesDirectoriesMissingFilesAndEndlessDevices) {
  EXPECT_THAT(Message(ReadBoundedFile(::testing::TempDir(), "graph file").status()),
              HasSubstr("is a directory"));
  EXPECT_EQ(ReadBoundedFile(Path("missing"), "graph file").status().code(),
            absl::StatusCode::kNotFound);
  // /dev/zero never ends: not a regular file, refused without reading.
  EXPECT_THAT(Message(ReadBoundedFile("/dev/zero", "graph file", 1 << 20).status()),
              HasSubstr("not a regular file (a character device)"));
}

TEST(ParseStrictJsonTest, RefusesNulBytesRepeatedKeysAndDeepNesting) {
  EXPECT_TRUE(ParseStrictJson(R"({"a": [1, 2, {"b": null}]})").ok());
  const std::string with_nul = std::string("{}") + '\0' + "garbage";
  EXPECT_THAT(Message(ParseStrictJson(with_nul).status()), HasSubstr("NUL byte at offset 2"));
  EXPECT_THAT(Message(ParseStrictJson(R"({"a": 1, "a": 2})").status()),
              HasSubstr("duplicate key 'a'"));
  const std::string deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  EXPECT_THAT(Message(ParseStrictJson(deep).status()), HasSubstr("nested deeper"));
  EXPECT_THAT(Message(ParseStrictJson("{\n  \"a\": 1e999}", "f.json").status()),
              HasSubstr("f.json:2:"));
}

TEST(CheckJsonKeysTest, NamesTheUnknownKeyAndSuggestsTheClosest) {
  constexpr absl::string_view kKnown[] = {"action", "node"};
  EXPECT_TRUE(CheckJsonKeys({{"action", 1}, {"node", 2}, {"_note", 3}}, kKnown, "step 0").ok());
  EXPECT_EQ(Message(CheckJsonKeys({{"nodes", 1}}, kKnown, "step 0")),
            "step 0: unknown key 'nodes' (did you mean 'node'?)");
  EXPECT_EQ(Message(CheckJsonKeys({{"x\ny", 1}}, kKnown, "step 0")),
            "step 0: unknown key 'x\\ny'");
}

}  // namespace
}  // namespace pebble

namespace pebble {
namespace {

TEST(Utf8Test, WellFormedTextPassesAndMalformedBytesDoNot) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("layer1.0.conv1"));
  EXPECT_TRUE(IsValidUtf8("gr\xc3\xb6\xc3\x9f" "e \xe2\x82\xac \xf0\x9f\x98\x80"));  // ö ß € emoji
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("a\xc3"));                 // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));              // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));          // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));      // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));              // truncated at the end
  EXPECT_FALSE(IsValidUtf8("\x80"));                  // a lone continuation byte
}

}  // namespace
}  // namespace pebble
