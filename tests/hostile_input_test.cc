// Hostile input to the pebble binary: each test is an input that once
// crashed it, hung it, replaced a file or printed a silently wrong figure
// (docs/reliability.md lists them). Every one must now end in a one-line
// "pebble: ..." error with exit 1 (bad input) or 2 (bad command line), or
// in the right answer.

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli_test_util.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;
using Json = nlohmann::json;
using Result = ::pebble::testing::CliResult;
using ::pebble::testing::ExpectOneLineError;
using ::pebble::testing::NpyVersion1Header;
using ::pebble::testing::WriteText;

Result Pebble(const std::string& args) { return ::pebble::testing::RunPebble(args); }

fs::path Scratch(const std::string& name) {
  return ::pebble::testing::ScratchDir("pebble_hostile", name);
}

// conv3d:n=8 exported, with `edit` applied to the node `id`.
fs::path EditedConv3d(const fs::path& dir, const std::string& id,
                      const std::function<void(Json&)>& edit) {
  const fs::path path = dir / ("conv3d-" + id + ".json");
  Result r = Pebble("export --model conv3d:n=8 --output " + path.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  Json doc = Json::parse(::pebble::testing::ReadFileText(path.string()));
  for (Json& node : doc["nodes"]) {
    if (node["id"] == id) edit(node);
  }
  WriteText(path, doc.dump());
  return path;
}

// Finding 1: a computed node whose bytes are smaller than shape x dtype got
// an arena slot of `bytes`, and the kernel wrote the whole shape past it.
TEST(HostileInputTest, BytesSmallerThanTheShapeAreRefusedBeforeAnyKernel) {
  const fs::path dir = Scratch("bytes");
  const fs::path g = EditedConv3d(dir, "relu1", [](Json& n) { n["bytes"] = 4; });
  ExpectOneLineError(Pebble("run --backend cpu --graph " + g.string()), 1,
                     {"'relu1'", "'bytes' is 4", "8192 bytes"});
  ExpectOneLineError(Pebble("plan --graph " + g.string()), 1, {"'relu1'"});
}

// Finding 2: a persistent node whose bytes or dtype disagree with its shape
// aborted run on an internal check.
TEST(HostileInputTest, PersistentTensorsThatDisagreeWithTheirShapeAreRefused) {
  const fs::path dir = Scratch("persistent");
  const fs::path bytes = EditedConv3d(dir, "input", [](Json& n) { n["bytes"] = 2052; });
  ExpectOneLineError(Pebble("run --graph " + bytes.string()), 1, {"'input'", "2052"});
  const fs::path dtype = EditedConv3d(dir, "conv1.weight", [](Json& n) { n["dtype"] = "fp16"; });
  ExpectOneLineError(Pebble("run --graph " + dtype.string()), 1, {"'conv1.weight'", "fp16"});
}

// A computed node whose shape is self-consistent but not what its operator
// makes of its inputs would size the kernel's loops past its inputs.
TEST(HostileInputTest, ShapesTheOperatorDoesNotMakeAreRefusedBeforeAnyKernel) {
  const fs::path dir = Scratch("infer");
  const fs::path g = EditedConv3d(dir, "relu1", [](Json& n) {
    n["shape"] = Json::array({1, 4, 8, 8, 16});
    n["bytes"] = 4 * 8 * 8 * 16 * 4;
  });
  ExpectOneLineError(Pebble("run --graph " + g.string()), 1, {"'relu1'", "(1,4,8,8,16)"});
}

TEST(HostileInputTest, DirectoriesAndEndlessFilesAreNotReadAsGraphsOrSchedules) {
  const fs::path dir = Scratch("dirs");
  ExpectOneLineError(Pebble("simulate --model conv3d:n=8 --schedule " + dir.string()), 1,
                     {"is a directory"});
  ExpectOneLineError(Pebble("run --model conv3d:n=8 --schedule " + dir.string()), 1,
                     {"is a directory"});
  ExpectOneLineError(Pebble("describe --graph " + dir.string()), 1, {"is a directory"});
  // Not a regular file: refused without reading (tests/reliability_inputs_test.cc).
  ExpectOneLineError(Pebble("describe --graph /dev/zero"), 1, {"not a regular file"});
}

// .npy headers claiming more than the file holds allocated it first.
TEST(HostileInputTest, NpyHeadersCannotAllocateMoreThanTheFileHolds) {
  const fs::path dir = Scratch("npy");
  auto npy = [&](const std::string& shape) {
    WriteText(dir / "input.npy",
              NpyVersion1Header("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape +
                                ", }") +
                  std::string(16, '\0'));
  };
  for (const std::string shape : {"(1099511627776,)", "(1000000000,)"}) {
    npy(shape);
    ExpectOneLineError(Pebble("run --model conv3d:n=8 --inputs " + dir.string()), 1,
                       {"'input'", "truncated data"});
  }
  npy("(2305843009213693952, 3)");
  ExpectOneLineError(Pebble("run --model conv3d:n=8 --inputs " + dir.string()), 1,
                     {"more than 2^63 bytes"});
}

// Finding 2: `path:n=10000000` was inside the declared range and needed
// 9.8 GB to build.
TEST(HostileInputTest, ModelParametersStayWithinWhatMemoryHolds) {
  ExpectOneLineError(Pebble("describe --model path:n=10000000"), 2, {"'n'", "out of range"});
  ExpectOneLineError(Pebble("describe --model tree:h=20"), 2, {"'h'", "out of range"});
}

// Finding 4: a 2^53-byte node offloaded 1,100 times wrapped transfer_bytes.
TEST(HostileInputTest, TransferBytesThatOverflowAreAnError) {
  const fs::path dir = Scratch("transfer");
  const int64_t big = int64_t{1} << 53;
  WriteText(dir / "g.json", Json{{"format", "pebble-graph"},
                                 {"version", 1},
                                 {"nodes", {{{"id", "a"}, {"bytes", big}}}},
                                 {"outputs", {"a"}}}
                                .dump());
  Json steps = Json::array({{{"action", "compute"}, {"node", "a"}}});
  for (int i = 0; i < 1100; ++i) steps.push_back({{"action", "offload"}, {"node", "a"}});
  WriteText(dir / "s.json", Json{{"format", "pebble-schedule"}, {"version", 1}, {"steps", steps}}
                                .dump());
  ExpectOneLineError(Pebble("simulate --json --graph " + (dir / "g.json").string() +
                            " --schedule " + (dir / "s.json").string()),
                     1, {"2^63"});
}

// Finding 4: costs of 1e308 summed to infinity and --json printed null.
TEST(HostileInputTest, CostsThatSumPastTheLargestDoubleAreAnError) {
  const fs::path dir = Scratch("cost");
  WriteText(dir / "g.json",
            R"({"format": "pebble-graph", "version": 1, "nodes": [
                 {"id": "a", "bytes": 1, "cost": 1e308},
                 {"id": "b", "bytes": 1, "cost": 1e308, "inputs": ["a"]}],
               "outputs": ["b"]})");
  ExpectOneLineError(Pebble("plan --json --graph " + (dir / "g.json").string()), 1,
                     {"total cost"});
  // One node recomputed: each cost is fine, the schedule's sum is not.
  WriteText(dir / "one.json",
            R"({"format": "pebble-graph", "version": 1, "nodes": [
                 {"id": "a", "bytes": 1, "cost": 1e308}], "outputs": ["a"]})");
  WriteText(dir / "s.json", R"({"format": "pebble-schedule", "version": 1, "steps": [
      {"action": "compute", "node": "a"}, {"action": "free", "node": "a"},
      {"action": "compute", "node": "a"}]})");
  ExpectOneLineError(Pebble("simulate --json --graph " + (dir / "one.json").string() +
                            " --schedule " + (dir / "s.json").string()),
                     1, {"largest double"});
}

// Finding 4: a NUL byte ended parsing and what followed was ignored.
TEST(HostileInputTest, ANulByteIsNotTheEndOfTheDocument) {
  const fs::path dir = Scratch("nul");
  std::string text = R"({"format": "pebble-graph", "version": 1, "nodes": [], "outputs": []})";
  text += std::string(1, '\0') + "garbage";
  WriteText(dir / "g.json", text);
  ExpectOneLineError(Pebble("describe --graph " + (dir / "g.json").string()), 1, {"NUL byte"});
}

// Finding 5: --plot wrote out.png.dat and out.png.gp beside the picture.
TEST(HostileInputTest, PlotLeavesNothingButThePicture) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "gnuplot is not installed";
  }
  const fs::path dir = Scratch("plot");
  WriteText(dir / "out.png.dat", "keep");
  WriteText(dir / "out.png.gp", "keep");
  Result r = Pebble("compare --model tanh-chain:length=6,size=1000 --policies sqrtn "
                    "--budgets 100%,min --plot " + (dir / "out.png").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(::pebble::testing::ReadFileText((dir / "out.png.dat").string()), "keep");
  EXPECT_EQ(::pebble::testing::ReadFileText((dir / "out.png.gp").string()), "keep");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.is_regular_file();
  EXPECT_EQ(files, 3);
}

// Finding 5: --trace inside --dump replaced the dumped loss.
TEST(HostileInputTest, TwoOutputsOfOneRunCannotBeOneFile) {
  const fs::path dir = Scratch("collide");
  ExpectOneLineError(Pebble("run --model conv3d:n=8 --dump " + dir.string() + " --trace " +
                            (dir / "loss.npy").string()),
                     1, {"--trace", "--dump", "loss.npy"});
  EXPECT_FALSE(fs::exists(dir / "loss.npy"));
}

// Finding 5: a dangling symbolic link given as an output was followed (and
// the file created wherever it pointed); /dev/null was refused.
TEST(HostileInputTest, OutputsNeitherFollowDanglingLinksNorRefuseDevNull) {
  const fs::path dir = Scratch("links");
  fs::create_symlink(dir / "elsewhere.json", dir / "link.json");
  ExpectOneLineError(
      Pebble("export --model path:n=3 --output " + (dir / "link.json").string()), 1,
      {"symbolic link"});
  ExpectOneLineError(
      Pebble("export --model path:n=3 --force --output " + (dir / "link.json").string()), 1,
      {"symbolic link"});
  EXPECT_FALSE(fs::exists(dir / "elsewhere.json"));
  Result null = Pebble("export --model path:n=3 --output /dev/null");
  EXPECT_EQ(null.exit_code, 0) << null.err;
  Result plan = Pebble("plan --model path:n=3 --schedule-out /dev/null");
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
}

// Finding 6: every command-line error printed CLI11's "ERROR: ..." and the
// whole help; "--time-limit abc" printed a 309-digit bound.
TEST(HostileInputTest, CommandLineErrorsAreOneLine) {
  ExpectOneLineError(Pebble("bogus"), 2, {"unknown command 'bogus'", "plan"});
  ExpectOneLineError(Pebble(""), 2, {"give a command"});
  ExpectOneLineError(Pebble("plan --model conv3d:n=8 --time-limit abc"), 2,
                     {"--time-limit", "'abc'", "pebble plan --help"});
  Result abc = Pebble("plan --model conv3d:n=8 --time-limit abc");
  EXPECT_LT(abc.err.size(), 200u);
  ExpectOneLineError(Pebble("plan --model conv3d:n=8 --no-such-flag"), 2, {"--no-such-flag"});
}

// Finding 6: newlines in ids, actions, paths and model strings broke the
// one-line rule.
TEST(HostileInputTest, NewlinesInNamesAreEscaped) {
  // /bin/sh runs the command: printf makes the newline.
  ExpectOneLineError(Pebble("describe --model \"$(printf 'con\\nv3d:n=8')\""), 2, {"'con\\nv3d'"});
  ExpectOneLineError(Pebble("describe --graph \"$(printf 'no\\nsuch.json')\""), 1,
                     {"no\\nsuch.json"});
  const fs::path dir = Scratch("newline");
  WriteText(dir / "s.json", R"({"format": "pebble-schedule", "version": 1, "steps": [
      {"action": "comp\nute", "node": "p0"}]})");
  ExpectOneLineError(Pebble("simulate --model path:n=3 --schedule " + (dir / "s.json").string()),
                     1, {"comp\\nute"});
  WriteText(dir / "t.json", R"({"format": "pebble-schedule", "version": 1, "steps": [
      {"action": "compute", "node": "p\n0"}]})");
  ExpectOneLineError(Pebble("simulate --model path:n=3 --schedule " + (dir / "t.json").string()),
                     1, {"p\\n0"});
}

// Finding 7: invalid values that were accepted, each silently meaning
// something else.
TEST(HostileInputTest, InvalidValuesAreRefused) {
  ExpectOneLineError(Pebble("run --model conv3d:n=8 --inputs /no/such/dir"), 1,
                     {"--inputs", "/no/such/dir"});
  ExpectOneLineError(Pebble("compare --model path:n=4 --budgets ''"), 2, {"--budgets"});
  ExpectOneLineError(Pebble("compare --model path:n=4 --budgets ,"), 2, {"no budget"});
  ExpectOneLineError(Pebble("plan --model path:n=4 --bandwidth ''"), 2, {"--bandwidth"});
  ExpectOneLineError(Pebble("plan --model path:n=4 --budget 0x10"), 2, {"'0x10'"});
  ExpectOneLineError(Pebble("plan --model path:n=4 --budget nan"), 2, {"'nan'"});
  ExpectOneLineError(Pebble("plan --model path:n=4 --time-limit nan"), 2, {"--time-limit"});
  ExpectOneLineError(Pebble("plan --model path:n=4 --time-limit inf"), 2, {"--time-limit"});
  ExpectOneLineError(Pebble("fit --model conv3d --vary n --budget 1MiB --max -1"), 2, {"--max"});
  ExpectOneLineError(Pebble("fit --model conv3d --vary n --budget 1MiB --start 100 --max 10"), 2,
                     {"--max 10", "--start 100"});
  ExpectOneLineError(Pebble("plan --model path:n=4 --bandwidth 1e-300"), 2, {"bandwidth"});
}

TEST(HostileInputTest, ProfilesWithImpossibleBandwidthsAreRefused) {
  const fs::path dir = Scratch("profile");
  for (const std::string bw : {"1e-300", "-1", "1e300"}) {
    WriteText(dir / "p.json", R"({"format": "pebble-cost-profile", "version": 1,
        "bandwidth_h2d_bytes_per_s": )" + bw + R"(, "entries": {}})");
    ExpectOneLineError(Pebble("plan --model path:n=3 --profile " + (dir / "p.json").string()), 1,
                       {"bandwidth_h2d_bytes_per_s"});
  }
  WriteText(dir / "p.json", R"({"format": "pebble-cost-profile", "version": 1,
      "bandwidth_h2d_bytes_per_s": 0, "entries": {}})");
  EXPECT_EQ(Pebble("plan --model path:n=3 --profile " + (dir / "p.json").string()).exit_code, 0);
}

// Finding 7: the schedule reader took repeated and unknown keys.
TEST(HostileInputTest, SchedulesWithRepeatedOrUnknownKeysAreRefused) {
  const fs::path dir = Scratch("keys");
  WriteText(dir / "dup.json", R"({"format": "pebble-schedule", "version": 1, "steps": [
      {"action": "compute", "node": "p0", "node": "p1"}]})");
  ExpectOneLineError(Pebble("simulate --model path:n=3 --schedule " + (dir / "dup.json").string()),
                     1, {"duplicate key 'node'"});
  WriteText(dir / "unknown.json", R"({"format": "pebble-schedule", "version": 1, "steps": [
      {"action": "compute", "nodes": "p0"}]})");
  ExpectOneLineError(
      Pebble("simulate --model path:n=3 --schedule " + (dir / "unknown.json").string()), 1,
      {"unknown key 'nodes'", "did you mean 'node'"});
}

// Finding 7: "exact --time-limit 1e-9" reported a negative time limit.
TEST(HostileInputTest, ATinyTimeLimitIsNotReportedAsNegative) {
  Result r = Pebble("plan --model tanh-chain:length=8 --policy exact --budget 90% "
                    "--time-limit 1e-9");
  EXPECT_THAT(r.err, Not(::testing::ContainsRegex(" -[0-9]")));
}

}  // namespace
