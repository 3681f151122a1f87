// End-to-end tests of `pebble run` and `pebble fit` (SPEC section 5) on the
// real binary and the CPU backend.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/npy.h"
#include "tests/cli_test_util.h"

namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

using Result = ::pebble::testing::CliResult;
using ::pebble::testing::RunPebble;

std::string Slurp(const std::string& path) { return ::pebble::testing::ReadFileText(path); }

fs::path Scratch(const std::string& name) {
  return ::pebble::testing::ScratchDir("pebble_run", name);
}

Result Pebble(const std::string& args) { return RunPebble(args); }

nlohmann::json ParseOrFail(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON:\n" << text;
  return j;
}

// The CPU kernels of conv3d exist (else the run tests have nothing to run).
bool Conv3dRuns() {
  static const bool runs = [] {
    Result r = Pebble("run --model conv3d:n=4 --policy baseline --json");
    if (r.exit_code != 0) std::cerr << "pebble run conv3d:n=4 failed: " << r.err << "\n";
    return r.exit_code == 0;
  }();
  return runs;
}

TEST(CliRunTest, JsonReportsPredictedAndMeasured) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  Result r = Pebble("run --model conv3d:n=8 --policy baseline --budget 100% --backend cpu --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = ParseOrFail(r.out);
  EXPECT_EQ(j["graph"], "conv3d:n=8");
  EXPECT_EQ(j["model"], "conv3d:n=8");
  EXPECT_EQ(j["policy"], "baseline");
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["feasible"], true);
  EXPECT_THAT(j["device"].get<std::string>(), HasSubstr("oneDNN"));
  for (const char* key : {"peak_bytes", "compute_cost", "base_cost", "overhead",
                          "recomputations", "transfer_bytes", "host_peak_bytes", "makespan",
                          "arena_bytes"}) {
    EXPECT_TRUE(j["predicted"].contains(key)) << key;
  }
  const nlohmann::json& m = j["measured"];
  for (const char* key : {"peak_bytes", "arena_bytes", "host_peak_bytes", "scratch_bytes",
                          "time_s", "kernel_time_s", "copy_time_s", "copy_overlap_s",
                          "overhead_s", "steps"}) {
    EXPECT_TRUE(m.contains(key)) << key;
  }
  // The CPU backend runs one step at a time, and counts no events of its own.
  EXPECT_EQ(m["copy_overlap_s"].get<double>(), 0);
  ASSERT_TRUE(m["backend_counters"].is_object());
  EXPECT_TRUE(m["backend_counters"].empty());
  EXPECT_EQ(m["peak_bytes"], j["predicted"]["peak_bytes"]);
  EXPECT_EQ(m["arena_bytes"], j["predicted"]["arena_bytes"]);
  EXPECT_EQ(j["peak_equal"], true);
  EXPECT_GT(m["time_s"].get<double>(), 0);
  EXPECT_GE(m["time_s"].get<double>(), m["kernel_time_s"].get<double>());
  ASSERT_TRUE(m["steps"].is_array());
  ASSERT_FALSE(m["steps"].empty());
  for (const auto& s : m["steps"]) {
    EXPECT_TRUE(s.contains("action") && s.contains("node") && s.contains("start_s") &&
                s.contains("end_s") && s.contains("resident_bytes"));
    EXPECT_LE(s["start_s"].get<double>(), s["end_s"].get<double>());
  }
  ASSERT_TRUE(j["loss"].is_number());
  EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
  // Same seed, same loss; the default seed is 0.
  Result again = Pebble("run --model conv3d:n=8 --policy baseline --seed 0 --json");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(ParseOrFail(again.out)["loss"], j["loss"]);
}

// docs/runtime.md, "Workspace": by default every kernel's scratch is asked
// of the backend and planned in the arena; --workspace graph leaves it
// outside, where it is measured as scratch.
TEST(CliRunTest, KernelScratchIsPlannedInTheArena) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  Result r = Pebble("run --model conv3d:n=16 --policy baseline --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = ParseOrFail(r.out);
  ASSERT_TRUE(j["workspace"].is_object()) << j.dump();
  EXPECT_EQ(j["workspace"]["backend"], "cpu");
  EXPECT_GT(j["workspace"]["nodes_raised"].get<int>(), 0);
  EXPECT_EQ(j["measured"]["scratch_bytes"], 0);
  EXPECT_EQ(j["peak_equal"], true);

  Result bare = Pebble("run --model conv3d:n=16 --policy baseline --workspace graph --json");
  ASSERT_EQ(bare.exit_code, 0) << bare.err;
  const nlohmann::json b = ParseOrFail(bare.out);
  EXPECT_TRUE(b["workspace"].is_null());
  EXPECT_GT(b["measured"]["scratch_bytes"].get<int64_t>(), 0);
  // What lay outside the plan is inside it now.
  EXPECT_GE(j["measured"]["arena_bytes"].get<int64_t>(),
            b["measured"]["arena_bytes"].get<int64_t>() +
                b["measured"]["scratch_bytes"].get<int64_t>() / 2);
  EXPECT_EQ(j["loss"], b["loss"]);

  // plan --backend gives run's prediction; plan alone the bare graph's.
  Result planned = Pebble("plan --model conv3d:n=16 --policy baseline --backend cpu --json");
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  const nlohmann::json p = ParseOrFail(planned.out);
  EXPECT_EQ(p["report"]["peak_bytes"], j["predicted"]["peak_bytes"]);
  EXPECT_EQ(p["workspace"]["nodes_raised"], j["workspace"]["nodes_raised"]);
  Result text = Pebble("plan --model conv3d:n=16 --policy baseline --backend cpu");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("take kernel scratch on cpu"));

  Result wrong = Pebble("run --model conv3d:n=8 --workspace sometimes");
  EXPECT_NE(wrong.exit_code, 0);
  Result unknown = Pebble("plan --model conv3d:n=8 --backend tpu");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_THAT(unknown.err, HasSubstr("tpu"));
}

TEST(CliRunTest, HumanOutputShowsPredictedAndMeasured) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  // 95%: the CPU kernels' scratch is planned (--workspace query), and no
  // recomputation shrinks a convolution's workspace.
  Result r = Pebble("run --model conv3d:n=16 --policy sqrtn --budget 95%");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("peak memory"));
  EXPECT_THAT(r.out, HasSubstr("measured == predicted"));
  EXPECT_THAT(r.out, HasSubstr("loss"));
}

TEST(CliRunTest, DumpWritesEveryOutputAndRefusesToOverwrite) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  const fs::path dir = Scratch("dump");
  Result r = Pebble("run --model conv3d:n=16 --policy baseline --dump " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* id : {"loss", "grad:conv1.weight", "grad:conv1.bias", "grad:conv3.weight"}) {
    auto a = pebble::ReadNpy((dir / (std::string(id) + ".npy")).string());
    ASSERT_TRUE(a.ok()) << id << ": " << a.status();
    EXPECT_EQ(a->dtype, pebble::DType::kFloat32);
  }
  auto w = pebble::ReadNpy((dir / "grad:conv1.weight.npy").string());
  EXPECT_EQ(w->shape, (pebble::Shape{4, 1, 3, 3, 3}));
  Result again = Pebble("run --model conv3d:n=16 --policy baseline --dump " + dir.string());
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("--force"));
  // A recomputing policy dumps the same bytes.
  const fs::path dir2 = Scratch("dump2");
  Result sq = Pebble("run --model conv3d:n=16 --policy checkmate-lp --budget 90% --json --dump " +
                     dir2.string());
  ASSERT_EQ(sq.exit_code, 0) << sq.err;
  EXPECT_GT(ParseOrFail(sq.out)["predicted"]["recomputations"].get<int>(), 0);
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(Slurp(entry.path().string()),
              Slurp((dir2 / entry.path().filename()).string()))
        << entry.path().filename();
  }
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

TEST(CliRunTest, InputsAreReadFromTheDirectory) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  const fs::path dir = Scratch("inputs");
  pebble::NpyArray input;
  input.shape = {1, 1, 8, 8, 8};
  input.dtype = pebble::DType::kFloat32;
  input.data.assign(512 * 4, 0);  // zeros
  ASSERT_TRUE(pebble::WriteNpy((dir / "input.npy").string(), input).ok());
  Result gen = Pebble("run --model conv3d:n=8 --policy baseline --json");
  Result read = Pebble("run --model conv3d:n=8 --policy baseline --json --inputs " + dir.string());
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  ASSERT_EQ(read.exit_code, 0) << read.err;
  nlohmann::json jr = ParseOrFail(read.out);
  EXPECT_EQ(jr["loaded_inputs"], 1);
  EXPECT_NE(jr["loss"], ParseOrFail(gen.out)["loss"]);
  // A file of the wrong shape names the file and the node.
  input.shape = {8, 8, 8};
  ASSERT_TRUE(pebble::WriteNpy((dir / "input.npy").string(), input).ok());
  Result bad = Pebble("run --model conv3d:n=8 --policy baseline --inputs " + dir.string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("input.npy"));
  EXPECT_THAT(bad.err, HasSubstr("node 'input'"));
  fs::remove_all(dir);
}

TEST(CliRunTest, InfeasiblePlanIsRefusedUnlessForced) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  const fs::path dir = fs::path(::testing::TempDir()) / "infeasible_run";
  fs::remove_all(dir);
  Result r = Pebble("run --model conv3d:n=8 --policy rotor --budget 50% --dump " +
                    (dir / "out").string() + " --trace " + (dir / "t.json").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("does not fit"));
  EXPECT_THAT(r.err, ContainsRegex("rotor reaches .* \\([0-9]+%\\) at least: try --budget "
                                   "[0-9]+% or --budget min"));
  EXPECT_THAT(r.err, HasSubstr("--over-budget"));
  // A run that fails leaves nothing behind: no --dump directory, no trace.
  EXPECT_FALSE(fs::exists(dir)) << dir;
  Result forced =
      Pebble("run --model conv3d:n=8 --policy baseline --budget 50% --over-budget --json");
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(ParseOrFail(forced.out)["feasible"], false);
}

// `run` refused for its host budget advises as `plan` does (RefusalAdvice):
// not the least peak's byte budget, which breaks the host budget too (it
// said "try --budget 100%"), but a host budget with a byte budget, which,
// followed, runs.
TEST(CliRunTest, AHostBudgetRefusalAdvisesWhatRuns) {
  const std::string run =
      "run --model mnist-cnn:batch=2 --optimizer adam:state=host --policy swap --host-budget ";
  Result r = Pebble(run + "2000 --budget 90%");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, Not(HasSubstr("at least: try --budget")));
  EXPECT_THAT(r.err, HasSubstr("nothing was run"));
  const std::string flag = "try --host-budget ";
  const size_t at = r.err.find(flag);
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::vector<std::string> words =
      absl::StrSplit(r.err.substr(at + flag.size()), ' ', absl::SkipEmpty());
  // "N (X MiB) with --budget P% ..."
  ASSERT_GE(words.size(), 6u) << r.err;
  ASSERT_EQ(words[3], "with") << r.err;
  ASSERT_EQ(words[4], "--budget") << r.err;
  Result followed = Pebble(run + words[0] + " --budget " + words[5] + " --json");
  ASSERT_EQ(followed.exit_code, 0) << followed.err;
  EXPECT_EQ(ParseOrFail(followed.out)["feasible"], true);
}

TEST(CliRunTest, TraceIsChromeTraceJson) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  const fs::path dir = Scratch("trace");
  const std::string path = (dir / "t.json").string();
  Result r = Pebble("run --model conv3d:n=8 --policy baseline --trace " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json t = ParseOrFail(Slurp(path));
  ASSERT_TRUE(t["traceEvents"].is_array());
  bool compute = false, counter = false, thread_names = false;
  for (const auto& e : t["traceEvents"]) {
    compute |= e["ph"] == "X" && e["tid"] == 1 && e["cat"] == "compute";
    counter |= e["ph"] == "C" && e["name"] == "device memory";
    thread_names |= e["ph"] == "M" && e["name"] == "thread_name";
  }
  EXPECT_TRUE(compute && counter && thread_names);
  EXPECT_EQ(Pebble("run --model conv3d:n=8 --policy baseline --trace " + path).exit_code, 1);
  // One path for the dump's directory and the trace's file: named, before
  // anything runs (it was "'...' is a directory" once the dump was made).
  const std::string both = (dir / "both.json").string();
  Result same = Pebble("run --model conv3d:n=8 --policy baseline --dump " + both + " --trace " +
                       both);
  EXPECT_EQ(same.exit_code, 1);
  EXPECT_THAT(same.err, HasSubstr("--dump and --trace both name"));
  EXPECT_FALSE(fs::exists(both));
  Result slashed = Pebble("run --model conv3d:n=8 --policy baseline --dump " + both + "/ --trace " +
                          both);
  EXPECT_THAT(slashed.err, HasSubstr("--dump and --trace both name"));
  fs::remove_all(dir);
}

TEST(CliRunTest, MemoryLogListsModulesAndPhases) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  Result r = Pebble("run --model conv3d:n=8 --policy baseline --memory-log");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("module"));
  EXPECT_THAT(r.out, HasSubstr("conv2"));
  EXPECT_THAT(r.out, HasSubstr("forward"));
  EXPECT_THAT(r.out, HasSubstr("backward"));
  Result j = Pebble("run --model conv3d:n=8 --policy baseline --memory-log --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  nlohmann::json doc = ParseOrFail(j.out);
  ASSERT_TRUE(doc["memory_log"].is_array());
  EXPECT_EQ(doc["memory_log"][0]["module"], "conv1");
  EXPECT_EQ(doc["memory_log"].back()["total_bytes"],
            doc["measured"]["steps"].back()["resident_bytes"]);
}

TEST(CliRunTest, RunsAGivenScheduleFile) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  const fs::path dir = Scratch("schedule");
  const std::string s = (dir / "s.json").string();
  ASSERT_EQ(Pebble("plan --model conv3d:n=8 --policy greedy --schedule-out " + s).exit_code, 0);
  Result r = Pebble("run --model conv3d:n=8 --schedule " + s + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = ParseOrFail(r.out);
  EXPECT_EQ(j["policy"], "schedule");
  EXPECT_EQ(j["measured"]["peak_bytes"], j["predicted"]["peak_bytes"]);
  std::ofstream(s) << R"({"format": "pebble-schedule", "version": 1,
                          "steps": [{"action": "compute", "node": "relu1"}]})";
  Result bad = Pebble("run --model conv3d:n=8 --schedule " + s);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("step 0"));
  fs::remove_all(dir);
}

TEST(CliRunTest, BadArgumentsAreErrors) {
  EXPECT_EQ(Pebble("run --model conv3d:n=8 --backend tpu").exit_code, 2);
  EXPECT_EQ(Pebble("run --model conv3d:n=8 --policy nope").exit_code, 2);
  Result g = Pebble("run --graph " + std::string(PEBBLE_SOURCE_DIR) +
                    "/examples/tanh-chain-4.json --policy baseline");
  EXPECT_EQ(g.exit_code, 1);  // an abstract graph without shapes cannot run
  EXPECT_THAT(g.err, HasSubstr("shape"));
}

TEST(CliFitTest, LargestValuePerPolicyAndNaiveEstimate) {
  // conv3d at 64 MiB: the naive rule gives the largest n with 26 n^3 4 <= 2^26.
  Result r = Pebble("fit --model conv3d --vary n --budget 64MiB --policies baseline,sqrtn --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = ParseOrFail(r.out);
  int64_t naive = 0;
  while (26 * 4 * (naive + 1) * (naive + 1) * (naive + 1) <= (int64_t{64} << 20)) ++naive;
  EXPECT_EQ(j["naive"]["value"], naive);
  ASSERT_EQ(j["results"].size(), 2u);
  const nlohmann::json& base = j["results"][0];
  EXPECT_EQ(base["policy"], "baseline");
  EXPECT_EQ(base["baseline"], true);
  const int64_t n = base["value"];
  EXPECT_LE(base["predicted_peak_bytes"].get<int64_t>(), int64_t{64} << 20);
  // n is the largest: n + 1 does not fit.
  Result over = Pebble("plan --model conv3d:n=" + std::to_string(n + 1) +
                       " --policy baseline --budget 64MiB --json");
  ASSERT_EQ(over.exit_code, 1) << over.err;
  EXPECT_EQ(ParseOrFail(over.out)["feasible"], false);
  // Recomputation fits at least as much.
  EXPECT_GE(j["results"][1]["value"].get<int64_t>(), n);
  Result human = Pebble("fit --model conv3d --vary n --budget 64MiB --policies baseline");
  ASSERT_EQ(human.exit_code, 0) << human.err;
  EXPECT_THAT(human.out, HasSubstr("naive (26 x input)"));
  EXPECT_THAT(human.out, HasSubstr("baseline *"));

  // The rule was made for 3-D networks: a transformer's input is token ids.
  const std::string lm = "fit --model transformer:layers=1,dim=32,heads=2,vocab=50 --vary seq "
                         "--budget 4MiB --policies baseline";
  Result tokens = Pebble(lm + " --json");
  ASSERT_EQ(tokens.exit_code, 0) << tokens.err;
  nlohmann::json t = ParseOrFail(tokens.out);
  EXPECT_TRUE(t["naive"]["value"].is_null());
  EXPECT_THAT(t["naive"]["note"].get<std::string>(), HasSubstr("for 3-D convolution networks"));
  EXPECT_GT(t["results"][0]["value"].get<int64_t>(), 0);
  Result tokens_text = Pebble(lm);
  ASSERT_EQ(tokens_text.exit_code, 0) << tokens_text.err;
  EXPECT_THAT(tokens_text.out, Not(HasSubstr("naive")));
}

TEST(CliFitTest, VerifyRunsTheLargestAndMatchesThePrediction) {
  if (!Conv3dRuns()) GTEST_SKIP() << "conv3d does not run on the CPU backend yet";
  Result r = Pebble("fit --model conv3d --vary n --budget 2MiB --policies rotor,baseline "
                    "--verify --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = ParseOrFail(r.out);
  for (const auto& row : j["results"]) {
    if (row["value"].is_null()) continue;
    ASSERT_TRUE(row.contains("measured")) << row.dump();
    EXPECT_EQ(row["measured"]["peak_bytes"], row["predicted_peak_bytes"]) << row["policy"];
    EXPECT_EQ(row["measured"]["peak_equal"], true);
    // Each row's backend high-water mark is its own run's arena, not the
    // largest arena of the rows before it (rotor runs first, on a larger n).
    EXPECT_EQ(row["measured"]["device_peak_bytes"], row["measured"]["arena_bytes"])
        << row["policy"];
    // The answer names the arena the run allocates, which the run confirms.
    EXPECT_EQ(row["arena_bytes"], row["measured"]["arena_bytes"]) << row["policy"];
    EXPECT_GE(row["arena_bytes"].get<int64_t>(), row["predicted_peak_bytes"].get<int64_t>());
  }
}

// An answer that a bound made, not the budget, says which: --max, the
// model's range (conv3d's n is at most 2048), a policy's refusal.
TEST(CliFitTest, AnAnswerABoundMadeSaysWhich) {
  Result capped = Pebble("fit --model conv3d --vary n --budget 64MiB --max 50 --policies rotor "
                         "--json");
  ASSERT_EQ(capped.exit_code, 0) << capped.err;
  const nlohmann::json row = ParseOrFail(capped.out)["results"][0];
  EXPECT_EQ(row["value"], 50);
  EXPECT_THAT(row["note"].get<std::string>(), HasSubstr("--max 50 reached"));
  Result range = Pebble("fit --model conv3d --vary n --budget 1EiB --policies baseline --json");
  ASSERT_EQ(range.exit_code, 0) << range.err;
  const nlohmann::json top = ParseOrFail(range.out)["results"][0];
  EXPECT_EQ(top["value"], 2048);
  EXPECT_THAT(top["note"].get<std::string>(), HasSubstr("bounded by n=2049"));
}

// The budget bounds the peak, not the arena that a run allocates: where the
// arena is over it, fit and run say so, as plan does (a user asking "does it
// fit in 200 MiB?" was told yes, and the run allocated 234 MiB unannounced).
TEST(CliFitTest, AnArenaOverTheBudgetIsSaid) {
  Result fit = Pebble("fit --model resnet18 --vary batch --budget 200MiB --policies rotor -q");
  ASSERT_EQ(fit.exit_code, 0) << fit.err;
  EXPECT_THAT(fit.out, HasSubstr("arena"));
  EXPECT_THAT(fit.out, HasSubstr("over the budget for rotor"));
  Result run = Pebble("run --model resnet18:batch=13 --policy rotor --budget 200MiB");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("the arena is over the budget by"));
  Result within = Pebble("run --model resnet18:batch=4 --policy rotor --budget 200MiB");
  ASSERT_EQ(within.exit_code, 0) << within.err;
  EXPECT_THAT(within.out, Not(HasSubstr("the arena is over the budget")));
}

// Off a terminal, each value tried is a line on stderr; --json and --quiet
// print none.
TEST(CliFitTest, ReportsEveryValueItTries) {
  Result r = Pebble("fit --model conv3d --vary n --budget 64MiB --policies baseline");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("baseline n=1: fits"));
  EXPECT_THAT(r.err, HasSubstr(": does not fit (peak "));
  // The exponential search's first miss is past what any plan could fit.
  EXPECT_THAT(r.err, HasSubstr(": over the budget at any plan (at least "));
  EXPECT_EQ(Pebble("fit --model conv3d --vary n --budget 64MiB --policies baseline --json")
                .err,
            "");
  EXPECT_EQ(Pebble("fit --model conv3d --vary n --budget 64MiB --policies baseline --quiet")
                .err,
            "");
}

// The seed model's search with each value's kernel scratch asked of the CPU
// backend finishes well within its time limit, whatever the budget (the
// probe runs no arithmetic and never sees a value whose bound is over the
// budget; it used to run every kernel on operands of each size tried).
TEST(CliFitTest, WorkspaceQueryOfTheSeedModelFinishes) {
  Result r = Pebble("fit --model conv3d --vary n --budget 8GiB --workspace query --policies "
                    "baseline,rotor --json --time-limit 60");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = ParseOrFail(r.out);
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["time_limit_reached"], false) << row.dump();
    EXPECT_GT(row["value"].get<int64_t>(), 300) << row.dump();
  }
}

TEST(CliFitTest, BadArgumentsAreErrors) {
  EXPECT_EQ(Pebble("fit --model conv3d --vary n --budget 50%").exit_code, 2);
  EXPECT_EQ(Pebble("fit --model conv3d --vary size --budget 1GiB").exit_code, 2);
  EXPECT_EQ(Pebble("fit --model conv3d --budget 1GiB").exit_code, 2);
}

}  // namespace
