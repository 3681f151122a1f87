// The second sweep of the command line (docs/reliability.md, "The second
// sweep: files and flags"): outputs that replaced files without asking,
// inputs that were silently passed over, writes that failed silently, and
// malformed values that exited 1 where a bad command line exits 2. Each test
// runs the real pebble binary, as tests/hostile_input_test.cc does.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/file_output.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/npy.h"
#include "scheduler/budget.h"
#include "scheduler/offload.h"
#include "tests/cli_test_util.h"

namespace {

using ::pebble::testing::ExpectOneLineError;
using ::pebble::testing::NpyVersion1Header;
using ::pebble::testing::ReadFileText;
using ::pebble::testing::WriteText;
using ::testing::HasSubstr;
namespace fs = std::filesystem;
using Json = nlohmann::json;
using Result = ::pebble::testing::CliResult;

Result Pebble(const std::string& args) { return ::pebble::testing::RunPebble(args); }

fs::path Scratch(const std::string& name) {
  return ::pebble::testing::ScratchDir("pebble_reliability_cli", name);
}

// Runs a shell command line in which "PEBBLE" stands for the binary, in
// directory `dir` (relative paths and $PWD are the directory's), capturing
// both streams unless the command redirects them itself.
Result Shell(const fs::path& dir, const std::string& command_line) {
  static int calls = 0;
  const std::string stem = (fs::path(::testing::TempDir()) /
                            ("reliability_cli_" + std::to_string(getpid()) + "_" +
                             std::to_string(++calls)))
                               .string();
  std::string command = command_line;
  const std::string binary = ::pebble::testing::PebbleBinaryDir() + "/bin/pebble";
  for (size_t at = command.find("PEBBLE"); at != std::string::npos;
       at = command.find("PEBBLE", at + binary.size())) {
    command.replace(at, 6, binary);
  }
  const std::string full = "cd '" + dir.string() + "' && { " + command + " ; } >" + stem +
                           ".out 2>" + stem + ".err";
  const int status = std::system(full.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFileText(stem + ".out");
  r.err = ReadFileText(stem + ".err");
  fs::remove(stem + ".out");
  fs::remove(stem + ".err");
  return r;
}

// An .npy file of `bytes` zero bytes of data under the header dict `dict`
// (version 1.0, padded as NumPy pads).
void WriteNpyWithHeader(const fs::path& path, const std::string& dict, size_t bytes) {
  WriteText(path, NpyVersion1Header(dict) + std::string(bytes, '\0'));
}

// conv3d:n=8 exported as a graph file in `dir`.
fs::path Conv3dGraph(const fs::path& dir) {
  const fs::path path = dir / "g.json";
  Result r = Pebble("export --model conv3d:n=8 --output " + path.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

bool HasGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

// --- 1. Files lost without asking ------------------------------------------

// The dump directory did not exist yet: "out/loss.npy" stayed relative while
// "$PWD/out/loss.npy" was absolute, so the two never compared equal and the
// trace replaced the dumped loss.
TEST(ReliabilityCliTest, TraceAndDumpCollideWhetherOrNotTheDirectoryExists) {
  const fs::path dir = Scratch("collide_new");
  Result r = Shell(dir, "PEBBLE run --model conv3d:n=8 --dump out --trace \"$PWD/out/loss.npy\"");
  ExpectOneLineError(r, 1, {"--trace", "--dump", "loss.npy"});
  EXPECT_FALSE(fs::exists(dir / "out" / "loss.npy"));
  r = Shell(dir, "PEBBLE run --model conv3d:n=8 --dump dd --trace ./dd/../dd/loss.npy");
  ExpectOneLineError(r, 1, {"--trace", "--dump", "loss.npy"});
  EXPECT_FALSE(fs::exists(dir / "dd" / "loss.npy"));
  // Through a symbolic link to the directory that will hold the dump.
  fs::create_directories(dir / "real");
  fs::create_directory_symlink(dir / "real", dir / "alias");
  r = Shell(dir, "PEBBLE run --model conv3d:n=8 --dump real --trace alias/loss.npy");
  ExpectOneLineError(r, 1, {"--trace", "--dump"});
}

TEST(ReliabilityCliTest, AnOutputNeverReplacesAnInputEvenWithForce) {
  const fs::path dir = Scratch("own_input");
  const fs::path g = Conv3dGraph(dir);
  const std::string before = ReadFileText(g.string());
  ASSERT_FALSE(before.empty());
  ExpectOneLineError(Pebble("run --graph " + g.string() + " --trace " + g.string() + " --force"),
                     1, {"--trace", "also an input (--graph)", "--force"});
  ExpectOneLineError(
      Pebble("plan --graph " + g.string() + " --schedule-out " + g.string() + " --force"), 1,
      {"--schedule-out", "--graph"});
  // The same file by another spelling, and through a hard link.
  ExpectOneLineError(Shell(dir, "PEBBLE export --graph g.json --output ./x/../g.json --force"), 1,
                     {"--output", "--graph"});
  fs::create_hard_link(g, dir / "h.json");
  ExpectOneLineError(Pebble("plan --graph " + g.string() + " --schedule-out " +
                            (dir / "h.json").string() + " --force"),
                     1, {"--schedule-out", "h.json", "--graph"});
  ExpectOneLineError(Pebble("compare --graph " + g.string() + " --policies baseline --budgets "
                            "100% --plot " + g.string() + " --force"),
                     1, {"--plot", "--graph"});
  ExpectOneLineError(Pebble("calibrate --graph " + g.string() + " --output " + g.string() +
                            " --force --repeat 1 --transfer-size 1MiB"),
                     1, {"--output", "--graph"});
  // A schedule run and traced into itself.
  const fs::path s = dir / "s.json";
  ASSERT_EQ(Pebble("plan --graph " + g.string() + " --schedule-out " + s.string()).exit_code, 0);
  const std::string schedule = ReadFileText(s.string());
  ExpectOneLineError(Pebble("run --graph " + g.string() + " --schedule " + s.string() +
                            " --trace " + s.string() + " --force"),
                     1, {"--trace", "--schedule"});
  EXPECT_EQ(ReadFileText(s.string()), schedule);
  EXPECT_EQ(ReadFileText(g.string()), before);
}

TEST(ReliabilityCliTest, ImportNeverReplacesTheModelItReads) {
  const fs::path dir = Scratch("import_self");
  const fs::path model = dir / "m.onnx";
  fs::copy_file(std::string(PEBBLE_SOURCE_DIR) + "/tests/fuzz/corpus/onnx/conv_bn_13.onnx", model);
  const std::string before = ReadFileText(model.string());
  ExpectOneLineError(
      Pebble("import " + model.string() + " --output " + model.string() + " --force"), 1,
      {"--output", "the ONNX model"});
  EXPECT_EQ(ReadFileText(model.string()), before);
}

// A file the run reads from --inputs is not a --dump target either.
TEST(ReliabilityCliTest, DumpNeverReplacesAnInputFile) {
  const fs::path dir = Scratch("dump_inputs");
  // A graph whose output is a persistent node: its dump would be the very
  // file --inputs holds for it.
  WriteText(dir / "g.json", R"({"format": "pebble-graph", "version": 1, "nodes": [
      {"id": "x", "op": "input", "bytes": 16, "persistent": true, "shape": [4], "dtype": "fp32"},
      {"id": "y", "op": "relu", "bytes": 16, "inputs": ["x"], "shape": [4], "dtype": "fp32"}],
      "outputs": ["x", "y"]})");
  pebble::NpyArray x;
  x.shape = {4};
  x.data.assign(16, 0);
  ASSERT_TRUE(pebble::WriteNpy((dir / "x.npy").string(), x).ok());
  const std::string before = ReadFileText((dir / "x.npy").string());
  Result r = Pebble("run --graph " + (dir / "g.json").string() + " --inputs " + dir.string() +
                    " --dump " + dir.string() + " --force");
  ExpectOneLineError(r, 1, {"--dump", "x.npy", "--inputs"});
  EXPECT_EQ(ReadFileText((dir / "x.npy").string()), before);
}

// An output into a directory that is not there failed only after the run,
// with the dump already written.
TEST(ReliabilityCliTest, OutputsGoIntoDirectoriesThatExistOrThatTheRunMakes) {
  const fs::path dir = Scratch("parents");
  Result r = Shell(dir, "PEBBLE run --model conv3d:n=8 --dump out --trace nodir/t.json");
  ExpectOneLineError(r, 1, {"--trace", "'nodir'", "does not exist"});
  EXPECT_FALSE(fs::exists(dir / "out" / "loss.npy"));
  ExpectOneLineError(Shell(dir, "PEBBLE plan --model path:n=3 --schedule-out nodir/s.json"), 1,
                     {"--schedule-out", "does not exist"});
  // The directory --dump makes may hold the trace.
  r = Shell(dir, "PEBBLE run --model conv3d:n=8 --dump out/a --trace out/t.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "out" / "t.json"));
  EXPECT_TRUE(fs::exists(dir / "out" / "a" / "loss.npy"));
}

// --force asked to replace files and granted a run over budget as well.
TEST(ReliabilityCliTest, ForceReplacesFilesAndOverBudgetRunsOverBudget) {
  const std::string over = "run --model conv3d:n=8 --policy baseline --budget 50%";
  ExpectOneLineError(Pebble(over + " --force"), 1, {"does not fit", "--over-budget"});
  Result r = Pebble(over + " --over-budget --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["feasible"], false);
  // --over-budget replaces nothing.
  const fs::path dir = Scratch("over_budget");
  WriteText(dir / "t.json", "keep");
  r = Pebble(over + " --over-budget --trace " + (dir / "t.json").string());
  ExpectOneLineError(r, 1, {"t.json", "--force"});
  EXPECT_EQ(ReadFileText((dir / "t.json").string()), "keep");
}

// gnuplot exits 0 when it cannot write its picture; stdout was never
// checked at all.
TEST(ReliabilityCliTest, WritesThatFailAreErrorsNamingTheFile) {
  if (!fs::is_character_file("/dev/full")) {
    GTEST_SKIP() << "/dev/full is not the full device here";
  }
  const fs::path dir = Scratch("write_fails");
  if (HasGnuplot()) {
    // --quiet: no forecast line before the error.
    const std::string compare =
        "compare --model path:n=4 --policies baseline --budgets 100% --quiet ";
    ExpectOneLineError(Pebble(compare + "--plot /dev/full"), 1, {"/dev/full"});
    ExpectOneLineError(Pebble(compare + "--plot /proc/version --force"), 1, {"/proc/version"});
  }
  ExpectOneLineError(Pebble("export --model path:n=3 --output /dev/full"), 1, {"/dev/full"});
  ExpectOneLineError(Pebble("plan --model path:n=3 --schedule-out /dev/full"), 1, {"/dev/full"});
  ExpectOneLineError(Pebble("run --model conv3d:n=8 --trace /dev/full"), 1, {"/dev/full"});
  // Standard output on a full device, in every mode of output.
  for (const std::string args :
       {"export --model path:n=3", "plan --model path:n=3 --json", "plan --model path:n=3",
        "describe --model path:n=3", "models --json", "plan --help", "--version"}) {
    Result r = Shell(dir, "PEBBLE " + args + " >/dev/full");
    ExpectOneLineError(r, 1, {"standard output"});
  }
}

// An existing file replaced with --force keeps its permission bits, a
// symbolic link keeps leading to the file it names, and a failed write
// names the file.
TEST(ReliabilityCliTest, FilesAreReplacedWholeThroughLinks) {
  const fs::path dir = Scratch("replace");
  WriteText(dir / "target.json", "old");
  ::chmod((dir / "target.json").c_str(), 0640);
  fs::create_symlink(dir / "target.json", dir / "link.json");
  ASSERT_TRUE(pebble::WriteFileAtomically((dir / "link.json").string(), "new").ok());
  EXPECT_TRUE(fs::is_symlink(dir / "link.json"));
  EXPECT_EQ(ReadFileText((dir / "target.json").string()), "new");
  EXPECT_EQ(fs::status(dir / "target.json").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    files += entry.is_regular_file() && !entry.is_symlink();
  }
  EXPECT_EQ(files, 1);  // no temporary left beside it
  const absl::Status missing =
      pebble::WriteFileAtomically((dir / "no" / "such" / "f.json").string(), "x");
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.message()), HasSubstr("no/such/f.json"));
  const absl::Status full = pebble::WriteFileAtomically("/dev/full", "x");
  EXPECT_THAT(std::string(full.message()), HasSubstr("No space left"));
}

// --- 2. Silently ignored inputs --------------------------------------------

TEST(ReliabilityCliTest, InputFilesThatWouldBePassedOverAreErrors) {
  const std::string run = "run --model conv3d:n=8 --policy baseline --inputs ";
  {
    const fs::path dir = Scratch("inputs_dangling");
    fs::create_symlink(dir / "missing.npy", dir / "input.npy");
    ExpectOneLineError(Pebble(run + dir.string()), 1, {"input.npy", "symbolic link"});
  }
  {
    const fs::path dir = Scratch("inputs_case");
    WriteText(dir / "input.NPY", "");
    ExpectOneLineError(Pebble(run + dir.string()), 1, {"input.NPY", "lower case"});
  }
  {
    const fs::path dir = Scratch("inputs_computed");
    WriteText(dir / "loss.npy", "");
    ExpectOneLineError(Pebble(run + dir.string()), 1, {"loss.npy", "'loss'", "computes"});
  }
  {
    const fs::path dir = Scratch("inputs_unknown");
    WriteText(dir / "inptu.npy", "");
    ExpectOneLineError(Pebble(run + dir.string()), 1, {"inptu.npy", "names no node"});
  }
  {
    // Files of other names are not looked at.
    const fs::path dir = Scratch("inputs_other");
    WriteText(dir / "README.txt", "notes");
    Result r = Pebble(run + dir.string() + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(Json::parse(r.out)["loaded_inputs"], 0);
  }
}

// NumPy's dict literal takes the last of a repeated key; the reader took
// the first.
TEST(ReliabilityCliTest, NpyHeadersWithRepeatedOrUnknownKeysAreRefused) {
  const fs::path dir = Scratch("npy_keys");
  const std::string run = "run --model conv3d:n=8 --policy baseline --inputs " + dir.string();
  WriteNpyWithHeader(dir / "input.npy",
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 8, 8, 8), "
                     "'shape': (2, 1, 8, 8, 8), }",
                     512 * 4);
  ExpectOneLineError(Pebble(run), 1, {"input.npy", "repeats key 'shape'"});
  WriteNpyWithHeader(dir / "input.npy",
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 8, 8, 8), "
                     "'order': 'C', }",
                     512 * 4);
  ExpectOneLineError(Pebble(run), 1, {"input.npy", "unknown key 'order'"});
  WriteNpyWithHeader(dir / "input.npy", "{'descr': '<f4', 'shape': (1, 1, 8, 8, 8), }", 512 * 4);
  ExpectOneLineError(Pebble(run), 1, {"input.npy", "'fortran_order'"});
  // What NumPy writes is still read.
  WriteNpyWithHeader(dir / "input.npy",
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 8, 8, 8), }",
                     512 * 4);
  Result r = Pebble(run + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["loaded_inputs"], 1);
}

// --- 3. Inconsistent errors ------------------------------------------------

TEST(ReliabilityCliTest, EveryMalformedValueIsACommandLineError) {
  const fs::path dir = Scratch("usage");
  const std::string s = (dir / "s.json").string();
  const std::string m = " --model path:n=4";
  struct Case {
    std::string args;
    std::string names;  // in the message
  };
  const std::vector<Case> cases = {
      {"plan" + m + " --budget abc", "'abc'"},
      {"plan" + m + " --bandwidth abc", "'abc'"},
      {"plan" + m + " --policy nope", "'nope'"},
      {"plan" + m + " --host-budget abc", "--host-budget"},
      {"plan" + m + " --time-limit abc", "--time-limit"},
      {"plan" + m + " --seed -1", "--seed"},
      {"plan" + m + " --policy exec:", "exec:"},
      {"plan" + m + " --budget 0.5B", "'0.5B'"},
      {"compare" + m + " --budgets 100%,abc", "'abc'"},
      {"compare" + m + " --budgets ,", "no budget"},
      {"compare" + m + " --budgets 80%,,", "an empty budget between its commas"},
      {"compare" + m + " --policies rotor,,sqrtn", "an empty policy between its commas"},
      {"fit --model conv3d --vary n --budget 1GiB --policies ,rotor", "an empty policy"},
      {"compare" + m + " --policies rotor,rotor", "names the policy 'rotor' twice"},
      {"compare" + m + " --budgets 80%,min,80%", "names the budget '80%' twice"},
      {"fit --model conv3d --vary n --budget 1GiB --policies dtr,dtr", "'dtr' twice"},
      {"calibrate --model conv3d:n=8 --network-size 1MiB", "--network-size"},
      {"plan" + m + " --budget 1ZiB", "unknown unit 'ZiB'"},
      {"compare" + m + " --policies baseline,nope", "'nope'"},
      {"compare" + m + " --bandwidth abc", "'abc'"},
      {"run --model conv3d:n=8 --budget abc", "'abc'"},
      {"run --model conv3d:n=8 --policy nope", "'nope'"},
      {"run --model conv3d:n=8 --backend tpu", "'tpu'"},
      {"run --model conv3d:n=8 --bandwidth abc", "'abc'"},
      {"run --model conv3d:n=8 --policy baseline --schedule " + s, "--schedule"},
      {"fit --model conv3d --vary n --budget abc", "'abc'"},
      {"fit --model conv3d --vary n --budget 50%", "bytes"},
      {"fit --model conv3d --vary n --budget 0", "positive"},
      {"fit --model conv3d --vary n --budget 1GiB --policies nope", "'nope'"},
      {"fit --model conv3d --vary n --budget 1GiB --backend tpu", "'tpu'"},
      {"fit --model conv3d --vary size --budget 1GiB", "'size'"},
      {"fit --model conv3d --vary n --budget 1MiB --start 100 --max 10", "--max 10"},
      {"fit --model nosuchmodel --vary n --budget 1GiB", "'nosuchmodel'"},
      {"simulate" + m + " --schedule " + s + " --bandwidth abc", "'abc'"},
      {"describe --model nosuchmodel", "'nosuchmodel'"},
      {"describe --model conv3d:n=abc", "'n'"},
      {"describe --model conv3d:size=3", "'size'"},
      {"export --model path:n=3 --format nope", "--format"},
      {"export --model nope", "'nope'"},
      {"import x.onnx --output g.json --batch 0", "--batch"},
      {"import x.onnx --output g.json --loss nope", "--loss"},
      {"calibrate --model conv3d:n=8 --transfer-size abc", "'abc'"},
      {"calibrate --model conv3d:n=8 --transfer-size 0", "positive"},
      {"calibrate --model conv3d:n=8 --backend tpu", "'tpu'"},
      {"calibrate --model conv3d:n=8 --repeat 0", "--repeat"},
      // A value that would be ignored: --loss only means something with --train.
      {"plan --graph " + s + " --loss mse", "--train"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    ExpectOneLineError(Pebble(c.args), 2, {c.names});
  }
}

TEST(ReliabilityCliTest, SizesAreWholeBytesParsedExactly) {
  EXPECT_EQ(*pebble::ParseSize("9007199254740993"), int64_t{9007199254740993});
  EXPECT_EQ(*pebble::ParseSize("9199999999999999999"), int64_t{9199999999999999999});
  EXPECT_EQ(pebble::ParseBudget("9007199254740993")->bytes, int64_t{9007199254740993});
  EXPECT_EQ(*pebble::ParseSize("1.5e9"), 1500000000);
  EXPECT_EQ(*pebble::ParseSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*pebble::ParseSize("8GiB"), int64_t{8} << 30);
  EXPECT_EQ(*pebble::ParseSize("1.5KiB"), 1536);
  EXPECT_EQ(*pebble::ParseSize("0.1GiB"), 107374182);  // a unit's fraction rounds down
  EXPECT_EQ(*pebble::ParseSize("2.50e1"), 25);
  EXPECT_EQ(*pebble::ParseSize("0"), 0);
  EXPECT_EQ(*pebble::ParseSize("0e-99999"), 0);
  EXPECT_EQ(*pebble::ParseSize("0.000B"), 0);
  EXPECT_EQ(pebble::ParseBudget("60%")->percent, 60);
  EXPECT_EQ(pebble::ParseBudget("min")->kind, pebble::BudgetSpec::Kind::kMin);
  for (const char* bad : {"0.5B", "2.7", "1e-30", "1e-30GiB", "1e-400", "9.2e18", "1e19",
                          "10TiB0", "-1", "-0.5"}) {
    SCOPED_TRACE(bad);
    const auto size = pebble::ParseSize(bad);
    ASSERT_FALSE(size.ok());
    EXPECT_THAT(std::string(size.status().message()), HasSubstr(std::string("'") + bad + "'"));
    EXPECT_FALSE(pebble::ParseBudget(bad).ok());
  }
  EXPECT_THAT(std::string(pebble::ParseSize("0.5B").status().message()), HasSubstr("whole"));
  // A rate need not be whole bytes.
  EXPECT_EQ(*pebble::ParseBandwidth("12500.5"), 12500.5);
  EXPECT_EQ(*pebble::ParseBandwidth("12.5GB"), 12.5e9);
  EXPECT_FALSE(pebble::ParseBandwidth("1e-30").ok());
  EXPECT_THAT(std::string(pebble::ParseSize("1e-30").status().message()), HasSubstr("whole"));
  EXPECT_THAT(std::string(pebble::ParseSize("1e-30GiB").status().message()),
              HasSubstr("one byte"));
  // Through the command line: the budget is the exact integer.
  Result r = Pebble("plan --model path:n=4 --budget 9007199254740993 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["budget_bytes"].get<int64_t>(), int64_t{9007199254740993});
  ExpectOneLineError(Pebble("plan --model path:n=4 --budget 1e-30"), 2, {"'1e-30'", "whole"});
  ExpectOneLineError(Pebble("plan --model path:n=4 --budget 1e-30TiB"), 2,
                     {"'1e-30TiB'", "one byte"});
}

// --- Outputs on stdout -----------------------------------------------------

// Two JSON documents on stdout are one no reader takes.
TEST(ReliabilityCliTest, StdoutHoldsOneDocument) {
  const std::string model = std::string(PEBBLE_SOURCE_DIR) + "/tests/fuzz/corpus/onnx/conv_bn_13.onnx";
  ExpectOneLineError(Pebble("import " + model + " --output - --json"), 2, {"--output -", "--json"});
  Result graph = Pebble("import " + model + " --output -");
  ASSERT_EQ(graph.exit_code, 0) << graph.err;
  EXPECT_EQ(Json::parse(graph.out)["format"], "pebble-graph");
  ExpectOneLineError(Pebble("run --model conv3d:n=8 --trace - --json"), 2, {"--trace", "'-'"});
  ExpectOneLineError(Pebble("plan --model path:n=4 --schedule-out - --json"), 2,
                     {"--schedule-out", "'-'"});
  ExpectOneLineError(Pebble("compare --model path:n=4 --plot -"), 2, {"--plot", "'-'"});
  ExpectOneLineError(Pebble("calibrate --model conv3d:n=8 --json"), 2, {"--json", "--output"});
}

}  // namespace
