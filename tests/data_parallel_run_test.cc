// Data-parallel runs of the C++ runtime (docs/runtime.md, "Several ranks"):
// ranks as threads of this process, each with its own gloo context and CPU
// backend, meeting through a temporary directory.
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/autodiff.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "gtest/gtest.h"
#include "runtime/collectives.h"
#include "runtime/executor.h"
#include "runtime/gloo/gloo_collectives.h"
#include "runtime/make_backend.h"
#include "runtime/npy.h"
#include "runtime/trace.h"
#include "scheduler/collectives.h"
#include "scheduler/planner.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class DataParallelRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGloo()) GTEST_SKIP() << "this build has no gloo (libgloo-dev)";
    std::string pattern = (std::filesystem::temp_directory_path() / "pebble-dp-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A fresh rendezvous directory.
  std::string Rendezvous(const std::string& name) {
    const std::filesystem::path path = dir_ / name;
    std::filesystem::create_directories(path);
    return path.string();
  }

  // body(r, collectives) on `ranks` threads, rank r's collectives connected
  // to the others' through a new rendezvous directory `name` (waiting up to
  // `timeout_s` in each collective): each rank's result, or its failure to
  // connect.
  template <typename T>
  std::vector<absl::StatusOr<T>> OnEachRank(
      int ranks, const std::string& name,
      const std::function<absl::StatusOr<T>(int, Collectives&)>& body, double timeout_s = 60) {
    const std::string rendezvous = Rendezvous(name);
    std::vector<absl::StatusOr<T>> results(ranks, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        auto collectives = ConnectGloo(
            {.rank = r, .ranks = ranks, .rendezvous_dir = rendezvous, .timeout_s = timeout_s});
        results[r] = collectives.ok() ? body(r, **collectives)
                                      : absl::StatusOr<T>(collectives.status());
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  // `ranks` ranks of `graph` under `schedule` (seed 0, each rank's batch
  // from seed + rank), each run's result.
  std::vector<absl::StatusOr<ExecutionResult>> RunRanks(const Graph& graph,
                                                        const Schedule& schedule, int ranks,
                                                        std::vector<uint64_t> seeds = {},
                                                        const Graph* unsharded = nullptr) {
    return OnEachRank<ExecutionResult>(
        ranks, absl::StrCat("run", runs_++),
        [&](int r, Collectives& collectives) -> absl::StatusOr<ExecutionResult> {
          ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeBackend("cpu"));
          ExecutorOptions options;
          options.seed = seeds.empty() ? 0 : seeds[r];
          options.collectives = &collectives;
          options.unsharded = unsharded;
          return Execute(graph, schedule, *backend, options);
        });
  }

  // Rank 0 of 2, connected to a rank 1 that stops once both are connected
  // (its connections close). The timeout is far beyond what the tests
  // allow, so that a failure must come from the closed connection.
  absl::StatusOr<std::unique_ptr<Collectives>> ConnectBesideAStoppedRank(
      const std::string& name) {
    const GlooOptions meet = {.ranks = 2, .rendezvous_dir = Rendezvous(name), .timeout_s = 120};
    std::promise<void> connected;
    std::thread rank1([&] {
      GlooOptions options = meet;
      options.rank = 1;
      auto collectives = ConnectGloo(options);
      EXPECT_TRUE(collectives.ok()) << collectives.status();
      connected.get_future().wait();
    });
    auto collectives = ConnectGloo(meet);
    connected.set_value();
    rank1.join();
    return collectives;
  }

  // One process's run of `graph` on rank `rank`'s batch (its inputs written
  // to a directory, the rest generated from seed 0, as the ranks do).
  absl::StatusOr<ExecutionResult> RunAlone(const Graph& graph, const Schedule& schedule,
                                           int rank) {
    const std::filesystem::path inputs = dir_ / absl::StrCat("batch", rank);
    std::filesystem::create_directories(inputs);
    for (NodeId v = 0; v < graph.num_nodes(); ++v) {
      if (!graph.persistent(v) || graph.role(v) != Role::kInput) continue;
      auto array = GenerateInput(graph, v, static_cast<uint64_t>(rank));
      if (!array.ok()) return array.status();
      if (absl::Status s = WriteNpy((inputs / TensorFileName(graph.id(v))).string(), *array);
          !s.ok()) {
        return s;
      }
    }
    auto backend = MakeBackend("cpu");
    if (!backend.ok()) return backend.status();
    ExecutorOptions options;
    options.inputs_dir = inputs.string();
    return Execute(graph, schedule, **backend, options);
  }

  static Schedule Plan(const Graph& graph, const char* policy, int ranks,
                       int64_t buckets = PlannerOptions::kPlannedBuckets,
                       NetworkLink link = {}) {
    auto planner = MakePlanner(policy);
    EXPECT_TRUE(planner.ok()) << planner.status();
    PlannerOptions options;
    options.ranks = ranks;
    options.bucket_bytes = buckets;
    options.network = link;
    options.budget_bytes = PlannerOptions::kMinBudget;
    auto plan = (*planner)->Plan(graph, options);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan->schedule;
  }

  // Clipped steps on two ranks against each rank's batch alone (defined
  // below, before its tests).
  std::map<std::string, Schedule> ExpectClippedByTheMeanGradientsNorm(
      const Graph& training, double max_norm, const std::vector<std::string>& policies);

  // Whether `schedule` has a bucket of collectives (or of all-reduces).
  static bool HasBuckets(const Schedule& schedule) {
    return std::any_of(schedule.steps.begin(), schedule.steps.end(),
                       [](const Step& step) { return step.joins_bucket; });
  }

  std::filesystem::path dir_;
  int runs_ = 0;
};

// Rank 0 of 2 whose collectives all fail: for refusals that come first.
class LoneRank : public Collectives {
 public:
  int rank() const override { return 0; }
  int ranks() const override { return 2; }
  std::string Description() const override { return "a lone rank"; }
  absl::Status AllReduceSum(float*, int64_t, absl::string_view what) override {
    return absl::UnavailableError(absl::StrCat(what, ": no other rank"));
  }
  absl::Status AllReduceSum(int64_t*, int64_t, absl::string_view what) override {
    return absl::UnavailableError(absl::StrCat(what, ": no other rank"));
  }
  absl::Status AllGather(const float*, int64_t, float*, absl::string_view what) override {
    return absl::UnavailableError(absl::StrCat(what, ": no other rank"));
  }
};

// Two ranks' collectives as one process sees them where the other rank
// holds the same values: each all-reduce doubles what it is given, after
// `delay_s`, or fails where `fail`. For the executor's collectives in
// flight, without gloo.
class MirroredRank : public Collectives {
 public:
  MirroredRank(double delay_s, bool fail) : delay_s_(delay_s), fail_(fail) {}
  int rank() const override { return 0; }
  int ranks() const override { return 2; }
  std::string Description() const override { return "a mirrored rank"; }
  absl::Status AllReduceSum(float* data, int64_t count, absl::string_view what) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay_s_));
    if (fail_) return absl::UnavailableError(absl::StrCat(what, ": the other rank stopped"));
    for (int64_t i = 0; i < count; ++i) data[i] *= 2;
    ++calls;
    return absl::OkStatus();
  }
  // Only CheckSameOnEveryRank's all-gather made of a sum: rank 1's slots,
  // the second half, are rank 0's.
  absl::Status AllReduceSum(int64_t* data, int64_t count, absl::string_view) override {
    for (int64_t i = count / 2; i < count; ++i) data[i] += data[i - count / 2];
    return absl::OkStatus();
  }
  absl::Status AllGather(const float* in, int64_t count, float* out,
                         absl::string_view what) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay_s_));
    if (fail_) return absl::UnavailableError(absl::StrCat(what, ": the other rank stopped"));
    std::copy(in, in + count, out);
    std::copy(in, in + count, out + count);
    ++calls;
    return absl::OkStatus();
  }
  std::atomic<int> calls{0};

 private:
  double delay_s_;
  bool fail_;
};

int CountAllReduces(const Schedule& schedule) {
  int n = 0;
  for (const Step& s : schedule.steps) n += s.action == Action::kAllReduce;
  return n;
}
int CountJoining(const Schedule& schedule) {
  int n = 0;
  for (const Step& s : schedule.steps) n += s.joins_bucket;
  return n;
}

std::vector<float> Floats(const NpyArray& array) {
  std::vector<float> out(array.data.size() / sizeof(float));
  std::memcpy(out.data(), array.data.data(), out.size() * sizeof(float));
  return out;
}

// With two ranks, (g0 / 2) + (g1 / 2) is (g0 + g1) / 2 to the bit: halving is
// exact, and so each rank's gradient is the two single runs' mean exactly.
// Baseline with one all-reduce a gradient; rotor's with the buckets that a
// millisecond a message makes worth it (one all-reduce of several
// gradients side by side).
TEST_F(DataParallelRunTest, GradientsAreTheMeanOfTheRanksBitwise) {
  const Graph g = *BuildModel("mnist-cnn:batch=2");
  for (const char* policy : {"baseline", "rotor"}) {
    SCOPED_TRACE(policy);
    const bool bucketed = std::string(policy) == "rotor";
    const Schedule dp = bucketed ? Plan(g, policy, 2, PlannerOptions::kPlannedBuckets,
                                        NetworkLink{1e9, 1e-3})
                                 : Plan(g, policy, 2, /*buckets=*/0);
    ASSERT_GT(CountAllReduces(dp), 0);
    if (bucketed) {
      EXPECT_GT(CountJoining(dp), 0);
    } else {
      EXPECT_EQ(CountJoining(dp), 0);
    }
    const Schedule alone = Plan(g, policy, 1);
    auto a0 = RunAlone(g, alone, 0);
    auto a1 = RunAlone(g, alone, 1);
    ASSERT_TRUE(a0.ok()) << a0.status();
    ASSERT_TRUE(a1.ok()) << a1.status();
    ASSERT_NE(*a0->loss, *a1->loss) << "the two batches should differ";
    auto ranks = RunRanks(g, dp, 2);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(ranks[r].ok()) << "rank " << r << ": " << ranks[r].status();
      EXPECT_EQ(ranks[r]->peak_bytes, ranks[r]->predicted.peak_bytes);
      EXPECT_GT(ranks[r]->collective_time_s, 0);
      // A bucket's all-reduce runs at its first step; those joining it take
      // no time of their own.
      for (size_t k = 0; k < dp.steps.size(); ++k) {
        if (dp.steps[k].joins_bucket) {
          EXPECT_EQ(ranks[r]->steps[k].start_s, ranks[r]->steps[k].end_s) << "step " << k;
        }
      }
    }
    EXPECT_EQ(*ranks[0]->loss, *a0->loss);  // each rank its own batch
    EXPECT_EQ(*ranks[1]->loss, *a1->loss);
    int compared = 0;
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      const NodeId v = g.outputs()[i];
      if (!absl::StartsWith(g.id(v), "grad:")) continue;
      const std::vector<float> x0 = Floats(a0->outputs[i].array);
      const std::vector<float> x1 = Floats(a1->outputs[i].array);
      for (int r = 0; r < 2; ++r) {
        const std::vector<float> got = Floats(ranks[r]->outputs[i].array);
        ASSERT_EQ(got.size(), x0.size());
        for (size_t j = 0; j < got.size(); ++j) {
          ASSERT_EQ(got[j], (x0[j] + x1[j]) / 2) << g.id(v) << "[" << j << "] on rank " << r;
        }
      }
      ++compared;
    }
    EXPECT_GT(compared, 3);
  }
}

// Note [Collectives in flight] (executor.cc): an all-reduce runs while the
// steps after it do, and is settled before anything reads its gradient.
// With the other rank's values equal to this one's, every gradient is this
// rank's own, exactly (halved, then doubled); the first compute step after
// the first bucket starts before that bucket's 200 ms have passed. One
// all-reduce a gradient, and DDP's rule with a cap of 64 KiB (three
// buckets, the first amid the backward).
TEST(CollectivesInFlightTest, RunBesideTheComputeAndSettleBeforeAReader) {
  const Graph training = *BuildModel("mnist-cnn:batch=2");
  const Graph g = *AddOptimizerStep(training, *ParseOptimizer("sgd:lr=0.5"));
  auto backend = MakeBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status();
  for (const bool bucketed : {false, true}) {
    SCOPED_TRACE(bucketed ? "buckets of 64 KiB" : "one all-reduce a gradient");
    auto planner = MakePlanner("baseline");
    ASSERT_TRUE(planner.ok());
    PlannerOptions options;
    options.ranks = 2;
    options.bucket_bytes = bucketed ? 64 << 10 : 0;
    auto dp = (*planner)->Plan(g, options);
    ASSERT_TRUE(dp.ok()) << dp.status();
    options.ranks = 1;
    auto alone = (*planner)->Plan(g, options);
    ASSERT_TRUE(alone.ok()) << alone.status();
    auto single = Execute(g, alone->schedule, **backend, {});
    ASSERT_TRUE(single.ok()) << single.status();
    const std::vector<Step>& steps = dp->schedule.steps;
    EXPECT_EQ(CountJoining(dp->schedule) > 0, bucketed);

    MirroredRank mirror(0.2, /*fail=*/false);
    ExecutorOptions with_ranks;
    with_ranks.collectives = &mirror;
    auto run = Execute(g, dp->schedule, **backend, with_ranks);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(mirror.calls, CountAllReduces(dp->schedule) - CountJoining(dp->schedule));
    EXPECT_EQ(run->peak_bytes, run->predicted.peak_bytes);
    ASSERT_EQ(run->updated.size(), single->updated.size());
    for (size_t i = 0; i < run->updated.size(); ++i) {
      EXPECT_EQ(Floats(run->updated[i].array), Floats(single->updated[i].array))
          << g.id(run->updated[i].node);
    }
    size_t first = 0;
    while (steps[first].action != Action::kAllReduce) ++first;
    size_t next = first + 1;
    while (next < steps.size() && steps[next].joins_bucket) ++next;
    EXPECT_EQ(next - first > 1, bucketed);
    while (next < steps.size() && steps[next].action != Action::kCompute) ++next;
    ASSERT_LT(next, steps.size()) << "no compute after the first bucket";
    const StepMeasurement& reduce = run->steps[first];
    EXPECT_GE(reduce.end_s - reduce.start_s, 0.2);
    EXPECT_LT(run->steps[next].start_s, reduce.end_s)
        << "step " << next << " (compute " << g.id(steps[next].node)
        << ") waited for the all-reduce of " << g.id(steps[first].node);
    EXPECT_GE(run->collective_time_s, 0.2);
    EXPECT_LT(run->collective_time_s, run->time_s);
    // The trace draws the all-reduces on a row of their own.
    const nlohmann::json trace = ChromeTrace(g, *run);
    int network_row = -1, on_it = 0;
    for (const nlohmann::json& e : trace["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "network") {
        network_row = e["tid"];
      }
    }
    for (const nlohmann::json& e : trace["traceEvents"]) {
      on_it += e["ph"] == "X" && e["cat"] == "all_reduce" && e["tid"] == network_row;
    }
    EXPECT_EQ(on_it, CountAllReduces(dp->schedule));
    // Its memory counters read in time order (a viewer draws them by time),
    // although the all-reduce ends after later computes start, and each
    // track reaches the run's peak.
    std::map<std::string, double> last_ts;
    std::map<std::string, int64_t> most;
    for (const nlohmann::json& e : trace["traceEvents"]) {
      if (e["ph"] != "C") continue;
      const std::string name = e["name"];
      const double ts = e["ts"];
      if (last_ts.count(name)) {
        EXPECT_GE(ts, last_ts[name]) << name;
      }
      last_ts[name] = ts;
      most[name] = std::max(most[name], e["args"]["bytes"].get<int64_t>());
    }
    EXPECT_EQ(most["device memory"], run->peak_bytes);
    EXPECT_EQ(most["host memory"], run->host_peak_bytes);

    // A collective that fails is the run's error, naming its step, once it
    // is settled; nothing hangs.
    MirroredRank failing(0.05, /*fail=*/true);
    with_ranks.collectives = &failing;
    auto failed = Execute(g, dp->schedule, **backend, with_ranks);
    ASSERT_FALSE(failed.ok());
    EXPECT_THAT(failed.status().message(), HasSubstr("the other rank stopped"));
    EXPECT_THAT(failed.status().message(), HasSubstr(absl::StrCat("step ", first, " (")));
  }
}

// A sharded graph's gathers and reduce-scatters run in flight too: each
// compute that reads none of them starts before the collective issued
// just before it ends; the memory is as planned; a failing gather names
// its step. (The mirrored rank's shards equal this one's, so the values
// are not a real model's: the gloo tests above check those.)
TEST(CollectivesInFlightTest, ShardedCollectivesRunBesideTheCompute) {
  const Graph training = *BuildModel("mnist-cnn:batch=2");
  const Graph g = *AddOptimizerStep(training, *ParseOptimizer("adam:lr=0.01"));
  auto sharded = ShardGraph(g, 2, NetworkLink{});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  auto backend = MakeBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status();
  for (const char* policy : {"fsdp", "dtr"}) {
    SCOPED_TRACE(policy);
    auto planner = MakePlanner(policy);
    ASSERT_TRUE(planner.ok());
    PlannerOptions options;
    options.ranks = 2;
    options.budget_bytes = PlannerOptions::kMinBudget;
    options.bucket_bytes = 0;  // each collective its own message, timed alone
    auto plan = (*planner)->Plan(*sharded, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<Step>& steps = plan->schedule.steps;
    MirroredRank mirror(0.02, /*fail=*/false);
    ExecutorOptions with_ranks;
    with_ranks.collectives = &mirror;
    with_ranks.unsharded = &g;
    auto run = Execute(*sharded, plan->schedule, **backend, with_ranks);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->peak_bytes, run->predicted.peak_bytes);
    int collectives = 0, overlapped = 0, first = -1;
    for (size_t k = 0; k < steps.size(); ++k) {
      if (steps[k].action != Action::kCompute || !sharded->collective(steps[k].node)) continue;
      if (first < 0) first = static_cast<int>(k);
      ++collectives;
      EXPECT_GE(run->steps[k].end_s - run->steps[k].start_s, 0.02) << "step " << k;
      const NodeId v = steps[k].node;
      size_t next = k + 1;
      while (next < steps.size() && steps[next].action != Action::kCompute) ++next;
      if (next == steps.size() || sharded->collective(steps[next].node)) continue;
      bool reads = sharded->storage(steps[next].node) == v;
      for (NodeId u : sharded->unique_inputs(steps[next].node)) {
        reads = reads || sharded->storage(u) == v;
      }
      if (reads) continue;
      ++overlapped;
      EXPECT_LT(run->steps[next].start_s, run->steps[k].end_s)
          << "step " << next << " waited for " << sharded->id(v);
    }
    EXPECT_EQ(mirror.calls, collectives);
    EXPECT_GT(overlapped, 0);

    MirroredRank failing(0.01, /*fail=*/true);
    with_ranks.collectives = &failing;
    auto failed = Execute(*sharded, plan->schedule, **backend, with_ranks);
    ASSERT_FALSE(failed.ok());
    EXPECT_THAT(failed.status().message(), HasSubstr("the other rank stopped"));
    EXPECT_THAT(failed.status().message(), HasSubstr(absl::StrCat("step ", first, " (")));
  }
}

// SGD after the all-reduce: every rank ends with the same parameters, those
// of one step on the mean gradient (up to rounding: p - lr g rounds once
// per rank alone, once here).
TEST_F(DataParallelRunTest, SgdStepsLeaveTheSameParametersOnEveryRank) {
  const Graph training = *BuildModel("mnist-cnn:batch=2");
  const Graph g = *AddOptimizerStep(training, *ParseOptimizer("sgd:lr=0.5"));
  const Schedule dp = Plan(g, "dtr", 3);
  const Schedule alone = Plan(g, "dtr", 1);
  std::vector<ExecutionResult> single;
  for (int r = 0; r < 3; ++r) {
    auto run = RunAlone(g, alone, r);
    ASSERT_TRUE(run.ok()) << run.status();
    single.push_back(*std::move(run));
  }
  auto ranks = RunRanks(g, dp, 3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(ranks[r].ok()) << "rank " << r << ": " << ranks[r].status();
  }
  ASSERT_FALSE(single[0].updated.empty());
  for (size_t i = 0; i < single[0].updated.size(); ++i) {
    const std::string& id = g.id(single[0].updated[i].node);
    const std::vector<float> on0 = Floats(ranks[0]->updated[i].array);
    for (int r = 1; r < 3; ++r) {
      EXPECT_EQ(Floats(ranks[r]->updated[i].array), on0) << id << ": rank " << r;
    }
    std::vector<std::vector<float>> each;
    for (const ExecutionResult& s : single) each.push_back(Floats(s.updated[i].array));
    for (size_t j = 0; j < on0.size(); ++j) {
      const float mean = (each[0][j] + each[1][j] + each[2][j]) / 3;
      ASSERT_NEAR(on0[j], mean, 1e-6f + 1e-5f * std::abs(mean)) << id << "[" << j << "]";
    }
  }
}

// Clipped (max_grad_norm), as clip_grad_norm_ after DistributedDataParallel's
// backward: the norm is of the ranks' mean gradient, each rank's .grad is
// that mean times min(1, X / (norm + 1e-6)), and SGD moves every parameter
// by lr times it; the same bits on both ranks, measured peak == predicted.
// The expected values come from each rank's batch run alone without
// clipping. Returns each policy's two-rank schedule.
std::map<std::string, Schedule> DataParallelRunTest::ExpectClippedByTheMeanGradientsNorm(
    const Graph& training, double max_norm, const std::vector<std::string>& policies) {
  const Graph plain = *AddOptimizerStep(training, *ParseOptimizer("sgd:lr=0.5"));
  const Graph clipped = *AddOptimizerStep(
      training, *ParseOptimizer(absl::StrCat("sgd:lr=0.5,max_grad_norm=", max_norm)));
  std::vector<ExecutionResult> single;
  for (int r = 0; r < 2; ++r) {
    auto run = RunAlone(plain, Plan(plain, "dtr", 1), r);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return {};
    single.push_back(*std::move(run));
  }
  // The mean gradients and their norm.
  std::map<std::string, std::vector<float>> mean;
  double squares = 0;
  for (NodeId p = 0; p < plain.num_nodes(); ++p) {
    if (plain.role(p) != Role::kParameter) continue;
    const std::string grad = "grad:" + plain.id(p);
    const std::vector<float> g0 = Floats(single[0].FindOutput(plain, grad)->array),
                             g1 = Floats(single[1].FindOutput(plain, grad)->array);
    std::vector<float>& m = mean[plain.id(p)];
    for (size_t i = 0; i < g0.size(); ++i) {
      m.push_back(g0[i] / 2 + g1[i] / 2);
      squares += static_cast<double>(m.back()) * m.back();
    }
  }
  const double norm = std::sqrt(squares);
  const double factor = std::min(1.0, max_norm / (norm + 1e-6));
  EXPECT_LT(factor, 0.5) << "the clipping would not act";
  std::map<std::string, Schedule> plans;
  for (const std::string& policy : policies) {
    SCOPED_TRACE(policy);
    const Schedule dp = Plan(clipped, policy.c_str(), 2);
    plans[policy] = dp;
    auto ranks = RunRanks(clipped, dp, 2);
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(ranks[r].ok()) << "rank " << r << ": " << ranks[r].status();
      if (!ranks[r].ok()) return plans;
    }
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r]->peak_bytes, ranks[r]->predicted.peak_bytes) << "rank " << r;
      EXPECT_NEAR(*ranks[r]->ScalarOutput(clipped, kGradNormId), norm, 1e-5 * norm)
          << "rank " << r;
    }
    for (const auto& [id, m] : mean) {
      SCOPED_TRACE(id);
      const std::vector<float> g = Floats(ranks[0]->FindOutput(clipped, "grad:" + id)->array);
      EXPECT_EQ(Floats(ranks[1]->FindOutput(clipped, "grad:" + id)->array), g);
      absl::StatusOr<NpyArray> before = GenerateInput(clipped, clipped.Find(id), /*seed=*/0);
      EXPECT_TRUE(before.ok());
      const HostTensor* after = nullptr;
      for (const auto& u : ranks[0]->updated) {
        if (clipped.id(u.node) == id) after = &u;
      }
      EXPECT_NE(after, nullptr);
      if (!before.ok() || after == nullptr) continue;
      const std::vector<float> p0 = Floats(*before), p1 = Floats(after->array);
      size_t wrong = 0;  // (the first element off, reported alone)
      for (size_t i = 0; i < m.size() && wrong == 0; ++i) {
        const float want = static_cast<float>(factor * m[i]);
        const float tolerance = 1e-6f * std::abs(want) + 1e-5f * static_cast<float>(max_norm);
        EXPECT_NEAR(g[i], want, tolerance) << i;
        EXPECT_NEAR(p1[i], p0[i] - 0.5f * g[i], 1e-6f * std::abs(p0[i]) + 1e-12f) << i;
        if (std::abs(g[i] - want) > tolerance) wrong = i + 1;
      }
    }
  }
  return plans;
}

// checkmate-lp at its least peak frees unclipped gradients and computes
// them again for their clipped copies: each value the clipping reads is
// summed.
TEST_F(DataParallelRunTest, ClippedStepsClipByTheNormOfTheMeanGradient) {
  const Graph training = *BuildModel("mnist-cnn:batch=2");
  const auto plans =
      ExpectClippedByTheMeanGradientsNorm(training, 0.05, {"dtr", "checkmate-lp"});
  ASSERT_TRUE(plans.contains("checkmate-lp"));
  const std::vector<Step>& steps = plans.at("checkmate-lp").steps;
  const auto reduces = std::count_if(steps.begin(), steps.end(), [](const Step& s) {
    return s.action == Action::kAllReduce;
  });
  EXPECT_GT(reduces, 8) << "no gradient summed twice (8 parameters)";
}

// A parameter whose gradient is a view of a value the backward reads too
// (a reshaped bias added to an activation: its gradient is the add's,
// which the linear's weight gradient reads): its sum waits for that read.
// Where a plan clips it before the backward's read, or copies it to the
// host before its sum and fetches it back after, planning with the ranks
// refuses, saying so.
TEST_F(DataParallelRunTest, AClippedGradientThatIsAViewIsSummedAfterTheBackwardsReads) {
  absl::StatusOr<Graph> forward = ParseGraphJson(R"({
    "format": "pebble-graph", "version": 1, "name": "view-bias",
    "nodes": [
      {"id": "x", "op": "input", "bytes": 32, "persistent": true, "shape": [2, 4],
       "dtype": "fp32"},
      {"id": "fc.weight", "op": "parameter", "bytes": 48, "persistent": true,
       "role": "parameter", "shape": [3, 4], "dtype": "fp32"},
      {"id": "b", "op": "parameter", "bytes": 24, "persistent": true, "role": "parameter",
       "shape": [6], "dtype": "fp32"},
      {"id": "fc", "op": "linear", "bytes": 24, "cost": 48, "inputs": ["x", "fc.weight"],
       "shape": [2, 3], "dtype": "fp32"},
      {"id": "bv", "op": "reshape", "attrs": {"shape": [2, 3]}, "bytes": 24, "cost": 0,
       "inputs": ["b"], "alias_of": "b", "shape": [2, 3], "dtype": "fp32"},
      {"id": "y", "op": "add", "bytes": 24, "cost": 6, "inputs": ["fc", "bv"],
       "shape": [2, 3], "dtype": "fp32"},
      {"id": "relu", "op": "relu", "bytes": 24, "cost": 6, "inputs": ["y"], "shape": [2, 3],
       "dtype": "fp32"}
    ],
    "outputs": ["relu"]})");
  ASSERT_TRUE(forward.ok()) << forward.status();
  const Graph training = *AddLossAndDifferentiate(*forward, LossKind::kMse);
  ExpectClippedByTheMeanGradientsNorm(training, 0.01, {"dtr", "rotor", "checkmate-lp", "swap"});
  const Graph clipped =
      *AddOptimizerStep(training, *ParseOptimizer("sgd:lr=0.5,max_grad_norm=0.01"));
  for (const char* policy : {"greedy", "hybrid"}) {
    absl::StatusOr<PlanResult> refused = (*MakePlanner(policy))->Plan(clipped, [] {
      PlannerOptions options;
      options.ranks = 2;
      options.budget_bytes = PlannerOptions::kMinBudget;
      return options;
    }());
    ASSERT_FALSE(refused.ok()) << policy;
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("no point of the schedule can sum it")) << policy;
  }
}

// Sharded (ZeRO-3): each rank's parameters, optimizer state and gradients
// after a step are its shards of the data-parallel run's, to the bit with
// two ranks (both average the same two halves; the update is element-wise).
TEST_F(DataParallelRunTest, ShardedRunsHoldTheShardsOfTheDataParallelRun) {
  const Graph training = *BuildModel("mnist-cnn:batch=2");
  const Graph g = *AddOptimizerStep(training, *ParseOptimizer("adam:lr=0.01"));
  auto dp = RunRanks(g, Plan(g, "baseline", 2), 2);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(dp[r].ok()) << "rank " << r << ": " << dp[r].status();
  const auto sharded = ShardGraph(g, 2, NetworkLink{});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  // Without the unsharded graph its shards would start from nothing that
  // the unsharded run knows: refused, before any collective.
  {
    LoneRank lone;
    auto backend = MakeBackend("cpu");
    ASSERT_TRUE(backend.ok()) << backend.status();
    ExecutorOptions options;
    options.collectives = &lone;
    EXPECT_THAT(Execute(*sharded, Plan(*sharded, "fsdp", 2), **backend, options)
                    .status()
                    .message(),
                HasSubstr("the graph is sharded"));
  }
  // fsdp-module sends each module's gathers, and its reduce-scatters, as one
  // message (a bucket of collectives), and dtr's plan joins messages where
  // they are faster (collective_buckets.h); fsdp joins none: the same sums,
  // in the same order. With the optimizer's state on the host and its
  // updates there too (ZeRO-Offload on shards), or the shards streamed from
  // the host to their gathers, the same.
  struct Case {
    const char* optimizer;
    const char* policy;
  };
  for (const Case& c : {Case{"adam:lr=0.01", "fsdp"}, Case{"adam:lr=0.01", "dtr"},
                        Case{"adam:lr=0.01", "fsdp-module"},
                        Case{"adam:lr=0.01,state=host,updates=host,gradients=drop", "fsdp-blocks"},
                        Case{"adam:lr=0.01,state=host,parameters=host", "dtr"}}) {
    SCOPED_TRACE(absl::StrCat(c.optimizer, " ", c.policy));
    const Graph offloaded = *AddOptimizerStep(training, *ParseOptimizer(c.optimizer));
    auto step_graph = ShardGraph(offloaded, 2, NetworkLink{});
    ASSERT_TRUE(step_graph.ok()) << step_graph.status();
    const Schedule schedule = Plan(*step_graph, c.policy, 2);
    EXPECT_EQ(HasBuckets(schedule), std::string(c.policy) != "fsdp");
    const bool on_host = std::string(c.optimizer) != "adam:lr=0.01";
    int host_computes = 0, moves = 0;
    for (const Step& step : schedule.steps) {
      host_computes += step.action == Action::kHostCompute;
      moves += step.action == Action::kPrefetch || step.action == Action::kOffload;
    }
    EXPECT_EQ(host_computes > 0, absl::StrContains(c.optimizer, "updates=host"));
    EXPECT_EQ(moves > 0, on_host);
    auto runs = RunRanks(*step_graph, schedule, 2, {}, &offloaded);
    int compared = 0;
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(runs[r].ok()) << "rank " << r << ": " << runs[r].status();
      EXPECT_EQ(runs[r]->peak_bytes, runs[r]->predicted.peak_bytes);
      EXPECT_EQ(runs[r]->host_peak_bytes, runs[r]->predicted.host_peak_bytes);
      EXPECT_EQ(runs[r]->host_peak_bytes > 0, on_host);
      EXPECT_EQ(*runs[r]->loss, *dp[r]->loss);
      std::vector<const HostTensor*> mine, whole;
      for (const HostTensor& t : runs[r]->updated) mine.push_back(&t);
      for (const HostTensor& t : runs[r]->outputs) mine.push_back(&t);
      for (const HostTensor* t : mine) {
        const std::string& id = step_graph->id(t->node);
        if (id == "loss") continue;
        const HostTensor* full = nullptr;
        for (const auto* list : {&dp[r]->updated, &dp[r]->outputs}) {
          for (const HostTensor& u : *list) {
            if (g.id(u.node) == id) full = &u;
          }
        }
        ASSERT_NE(full, nullptr) << id;
        const std::vector<float> shard = Floats(t->array);
        const std::vector<float> all = Floats(full->array);
        if (shard.size() == all.size()) {  // not sharded: Adam's step count
          EXPECT_EQ(shard, all) << id;
          continue;
        }
        for (size_t j = 0; j < shard.size(); ++j) {
          const size_t at = r * shard.size() + j;
          ASSERT_EQ(shard[j], at < all.size() ? all[at] : 0.0f) << id << "[" << at << "]";
        }
        ++compared;
      }
    }
    // 8 parameters, their gradients (unless dropped) and Adam's moments, per rank
    EXPECT_GT(compared, 20);
  }
}

struct ShardsCompared {
  int tensors = 0, padded = 0;  // tensors compared; padding elements (zero)
};

// Expects rank r's updated tensors in a sharded run (of `sharded`) to be
// its shards of the data-parallel run's (of `whole`), within 1e-5, the
// padding past a tensor's end zero; a tensor kept whole (Adam's step
// count) is compared whole.
ShardsCompared ExpectShardsOf(const Graph& sharded, const ExecutionResult& run,
                              const Graph& whole, const ExecutionResult& dp, int r) {
  ShardsCompared n;
  EXPECT_EQ(run.updated.size(), dp.updated.size());
  for (size_t i = 0; i < std::min(run.updated.size(), dp.updated.size()); ++i) {
    const std::string& id = sharded.id(run.updated[i].node);
    EXPECT_EQ(whole.id(dp.updated[i].node), id);
    const std::vector<float> shard = Floats(run.updated[i].array);
    const std::vector<float> all = Floats(dp.updated[i].array);
    const bool kept_whole = shard.size() == all.size();
    for (size_t j = 0; j < shard.size(); ++j) {
      const size_t at = kept_whole ? j : r * shard.size() + j;
      if (at >= all.size()) {
        EXPECT_EQ(shard[j], 0.0f) << id << " padding [" << at << "]";
        ++n.padded;
      } else {
        EXPECT_NEAR(shard[j], all[at], 1e-5f + 1e-5f * std::abs(all[at]))
            << id << "[" << at << "]";
      }
    }
    ++n.tensors;
  }
  return n;
}

// Three ranks: the last rank's shards end in padding (mnist-cnn's 10-element
// bias: shards of 4, the last 2 values and 2 zeros), which stays zero, and
// the sums run in another order than the data-parallel run's (within 1e-5).
TEST_F(DataParallelRunTest, ThreeShardedRanksEndInZeroPadding) {
  const Graph training = *BuildModel("mnist-cnn:batch=2");
  const Graph g = *AddOptimizerStep(training, *ParseOptimizer("sgd:lr=0.1,momentum=0.9"));
  auto dp = RunRanks(g, Plan(g, "baseline", 3), 3);
  auto sharded = ShardGraph(g, 3, NetworkLink{});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  // rotor with buckets none sends each collective on its own; fsdp-blocks,
  // here one root unit (mnist-cnn has no module list), its gathers as one
  // message, each parameter's shard at its place in every rank's part,
  // padding included.
  for (const char* policy : {"rotor", "fsdp-blocks"}) {
    SCOPED_TRACE(policy);
    const bool rotor = std::string(policy) == "rotor";
    const Schedule schedule =
        Plan(*sharded, policy, 3, rotor ? 0 : PlannerOptions::kPlannedBuckets);
    EXPECT_EQ(HasBuckets(schedule), !rotor);
    auto runs = RunRanks(*sharded, schedule, 3, {}, &g);
    int padded = 0;
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(dp[r].ok()) << "rank " << r << ": " << dp[r].status();
      ASSERT_TRUE(runs[r].ok()) << "rank " << r << ": " << runs[r].status();
      EXPECT_EQ(runs[r]->peak_bytes, runs[r]->predicted.peak_bytes);
      padded += ExpectShardsOf(*sharded, *runs[r], g, *dp[r], r).padded;
    }
    EXPECT_GT(padded, 0);
  }
}

// Clipped and sharded (Note [Clipping sharded gradients]): every rank clips
// its shards by the whole gradients' norm, summed from each rank's squares
// by one all_reduce, as FSDP's clip_grad_norm_ does. So the norm and each
// rank's parameters and optimizer state are the data-parallel clipped
// run's (its shards; the padding stays zero), up to the order of the
// float32 sums; with the updates on the host too; measured peak ==
// predicted.
// A gradient that another parameter's gradient is computed from (written by
// hand): b2's is b1's times one, so it reads b1's local gradient whole, not
// its clipped shard.
constexpr char kGradientFromGradient[] = R"({"format": "pebble-graph", "version": 1,
  "name": "gradient-from-gradient", "nodes": [
  {"id": "input", "op": "input", "bytes": 24, "persistent": true, "shape": [2, 3], "dtype": "fp32"},
  {"id": "target", "op": "input", "bytes": 24, "persistent": true, "shape": [2, 3], "dtype": "fp32"},
  {"id": "b1", "op": "parameter", "bytes": 24, "persistent": true, "role": "parameter",
   "shape": [6], "dtype": "fp32"},
  {"id": "b2", "op": "parameter", "bytes": 24, "persistent": true, "role": "parameter",
   "shape": [6], "dtype": "fp32"},
  {"id": "b1v", "op": "reshape", "attrs": {"shape": [2, 3]}, "bytes": 24, "cost": 0,
   "inputs": ["b1"], "alias_of": "b1", "shape": [2, 3], "dtype": "fp32"},
  {"id": "b2v", "op": "reshape", "attrs": {"shape": [2, 3]}, "bytes": 24, "cost": 0,
   "inputs": ["b2"], "alias_of": "b2", "shape": [2, 3], "dtype": "fp32"},
  {"id": "y1", "op": "add", "bytes": 24, "cost": 6, "inputs": ["input", "b1v"], "shape": [2, 3],
   "dtype": "fp32"},
  {"id": "y", "op": "add", "bytes": 24, "cost": 6, "inputs": ["y1", "b2v"], "shape": [2, 3],
   "dtype": "fp32"},
  {"id": "loss", "op": "mse_loss", "bytes": 4, "cost": 6, "inputs": ["y", "target"],
   "shape": [], "dtype": "fp32"},
  {"id": "grad:y", "op": "mse_loss_backward", "bytes": 24, "cost": 6, "inputs": ["y", "target"],
   "shape": [2, 3], "dtype": "fp32", "role": "backward"},
  {"id": "grad:b1", "op": "reshape", "attrs": {"shape": [6]}, "bytes": 24, "cost": 0,
   "inputs": ["grad:y"], "alias_of": "grad:y", "shape": [6], "dtype": "fp32", "role": "backward"},
  {"id": "one", "op": "fill", "attrs": {"shape": [], "dtype": "float32", "value": 1.0},
   "bytes": 4, "cost": 0, "shape": [], "dtype": "fp32", "role": "backward"},
  {"id": "grad:b2", "op": "mul", "bytes": 24, "cost": 6, "inputs": ["grad:b1", "one"],
   "shape": [6], "dtype": "fp32", "role": "backward"}],
  "outputs": ["loss", "grad:b1", "grad:b2"]})";

TEST_F(DataParallelRunTest, ShardedClippedStepsClipByTheWholeGradientsNorm) {
  const Graph cnn = *BuildModel("mnist-cnn:batch=2");
  const Graph chained = *ParseGraphJson(kGradientFromGradient);
  struct Case {
    const Graph* training;
    int ranks;
    const char* optimizer;
    const char* policy;
  };
  for (const Case& c :
       {Case{&cnn, 2, "sgd:lr=0.5,max_grad_norm=0.05", "fsdp"},
        Case{&cnn, 2, "adam:lr=0.01,max_grad_norm=0.05", "dtr"},
        Case{&cnn, 2, "adam:lr=0.01,max_grad_norm=0.05,state=host,updates=host", "fsdp-module"},
        Case{&cnn, 3, "sgd:lr=0.5,momentum=0.9,max_grad_norm=0.05", "rotor"},
        Case{&chained, 2, "sgd:lr=0.5,max_grad_norm=0.05", "fsdp"},
        Case{&chained, 3, "adam:lr=0.01,max_grad_norm=0.05", "dtr"}}) {
    SCOPED_TRACE(absl::StrCat(c.training->name(), ", ", c.ranks, " ranks, ", c.optimizer, ", ",
                              c.policy));
    const Graph g = *AddOptimizerStep(*c.training, *ParseOptimizer(c.optimizer));
    auto dp = RunRanks(g, Plan(g, "baseline", c.ranks), c.ranks);
    auto sharded = ShardGraph(g, c.ranks, NetworkLink{});
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    auto runs = RunRanks(*sharded, Plan(*sharded, c.policy, c.ranks), c.ranks, {}, &g);
    int compared = 0, padded = 0;
    for (int r = 0; r < c.ranks; ++r) {
      ASSERT_TRUE(dp[r].ok()) << "rank " << r << ": " << dp[r].status();
      ASSERT_TRUE(runs[r].ok()) << "rank " << r << ": " << runs[r].status();
      EXPECT_EQ(runs[r]->peak_bytes, runs[r]->predicted.peak_bytes) << "rank " << r;
      EXPECT_EQ(runs[r]->host_peak_bytes, runs[r]->predicted.host_peak_bytes) << "rank " << r;
      const double norm = *dp[r]->ScalarOutput(g, kGradNormId);
      EXPECT_GT(norm, 0.1) << "the clipping would not act";
      EXPECT_NEAR(*runs[r]->ScalarOutput(*sharded, kGradNormId), norm, 1e-5 * norm)
          << "rank " << r;
      const ShardsCompared n = ExpectShardsOf(*sharded, *runs[r], g, *dp[r], r);
      compared += n.tensors;
      padded += n.padded;
    }
    EXPECT_GE(compared, c.ranks * (c.training == &cnn ? 8 : 2));  // the parameters, any state
    if (c.ranks == 3 && c.training == &cnn) {
      EXPECT_GT(padded, 0);  // (6 elements: none)
    }
  }
}

// The reduce-scatter of the sharded runs (an all-to-all and a sum): with
// 2 to 5 ranks and parts of 1 to 1000 elements, each rank ends with its
// part of the exact sum in place (small whole numbers, so no rounding),
// and the threads end at once after it, their connections closed.
TEST_F(DataParallelRunTest, GlooReduceScatterLeavesEachRankItsPartOfTheSum) {
  for (int ranks = 2; ranks <= 5; ++ranks) {
    for (int64_t count : {1, 7, 1000}) {
      SCOPED_TRACE(absl::StrCat(ranks, " ranks, parts of ", count));
      auto parts = OnEachRank<std::vector<float>>(
          ranks, absl::StrCat("scatter", ranks, "-", count),
          [&](int r, Collectives& collectives) -> absl::StatusOr<std::vector<float>> {
            std::vector<float> data;
            for (int64_t i = 0; i < ranks * count; ++i) {
              data.push_back(static_cast<float>((r + 1) * 10000 + i));
            }
            RETURN_IF_ERROR(collectives.ReduceScatterSum(data.data(), count, "the test's sum"));
            return data;
          });
      const int64_t rank_sum = ranks * (ranks + 1) / 2;
      for (int r = 0; r < ranks; ++r) {
        ASSERT_TRUE(parts[r].ok()) << "rank " << r << ": " << parts[r].status();
        for (int64_t j = 0; j < count; ++j) {
          const int64_t i = r * count + j;
          ASSERT_EQ((*parts[r])[i], static_cast<float>(rank_sum * 10000 + ranks * i))
              << "rank " << r << ", element " << i;
        }
      }
    }
  }
}

// A reduce-scatter whose other rank has stopped fails at once, saying so.
TEST_F(DataParallelRunTest, GlooReduceScatterFailsWhenTheOtherRankStopped) {
  auto collectives = ConnectBesideAStoppedRank("scatter-dead");
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> data(2000, 1.0f);
  const absl::Status s = (*collectives)->ReduceScatterSum(data.data(), 1000, "the test's sum");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(s.message(), HasSubstr("the test's sum failed (a rank stopped"));
  EXPECT_LT(seconds, 10);
}

// pebble calibrate --ranks's measurement: a link every rank agrees on, with
// a positive bandwidth and a non-negative latency. The sizes are far apart
// and each is timed seven times (the least counts), so that the suite's other
// tests on these cores do not hide the difference (4 MiB three times did, once).
TEST_F(DataParallelRunTest, TheMeasuredLinkIsRankZerosOnEveryRank) {
  auto links = OnEachRank<NetworkLink>(2, "link", [](int, Collectives& collectives) {
    return MeasureNetworkLink(collectives, 4096, 16 << 20, 7);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(links[r].ok()) << "rank " << r << ": " << links[r].status();
  }
  EXPECT_GT(links[0]->bandwidth_bytes_per_s, 0);
  EXPECT_TRUE(std::isfinite(links[0]->bandwidth_bytes_per_s));
  EXPECT_GE(links[0]->latency_s, 0);
  EXPECT_EQ(links[1]->bandwidth_bytes_per_s, links[0]->bandwidth_bytes_per_s);
  EXPECT_EQ(links[1]->latency_s, links[0]->latency_s);
}

// pebble run --ranks's planning (Note [Rank 0 plans], cli/run_commands.cc):
// rank 0 makes the result once, for longer than the collectives' timeout,
// and every rank gets its bytes, or its error.
TEST_F(DataParallelRunTest, FromRank0OutlastsTheTimeoutAndGivesEveryRankItsResult) {
  std::string made(100001, '\0');  // not a whole number of words, NULs included
  for (size_t i = 0; i < made.size(); ++i) made[i] = static_cast<char>(i * 7919 % 251);
  std::atomic<int> calls = 0;
  auto results = OnEachRank<std::string>(
      3, "from-rank-0",
      [&](int, Collectives& collectives) {
        return FromRank0(
            collectives,
            [&]() -> absl::StatusOr<std::string> {
              ++calls;
              std::this_thread::sleep_for(std::chrono::milliseconds(2500));
              return made;
            },
            "the test's result", /*poll_s=*/0.2);
      },
      /*timeout_s=*/1);
  EXPECT_EQ(calls, 1);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_TRUE(*results[r] == made) << "rank " << r;
  }
  auto failed = OnEachRank<std::string>(2, "from-rank-0-fails", [](int, Collectives& c) {
    return FromRank0(c, [] { return absl::StatusOr<std::string>(absl::NotFoundError("no plan")); },
                     "the test's result");
  });
  ASSERT_FALSE(failed[0].ok());
  ASSERT_FALSE(failed[1].ok());
  EXPECT_EQ(failed[0].status(), absl::NotFoundError("no plan"));
  EXPECT_EQ(failed[1].status(), absl::NotFoundError("rank 0: no plan"));
}

// Any rank's work may outlast the timeout: every rank waits for the last.
TEST_F(DataParallelRunTest, WorkTogetherWaitsForTheSlowestRank) {
  std::atomic<int> finished = 0;
  auto results = OnEachRank<int>(
      3, "work-together",
      [&](int r, Collectives& collectives) -> absl::StatusOr<int> {
        RETURN_IF_ERROR(WorkTogether(
            collectives,
            [&] {
              if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
              ++finished;
            },
            "the test's work", /*poll_s=*/0.2));
        return finished.load();  // every rank's work has returned
      },
      /*timeout_s=*/1);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(*results[r], 3) << "rank " << r;
  }
}

// A rank that stops while rank 0 makes the result fails rank 0 once the
// result is made, not at the timeout.
TEST_F(DataParallelRunTest, FromRank0FailsWhenAnotherRankStopped) {
  auto collectives = ConnectBesideAStoppedRank("from-rank-0-dead");
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  const auto start = std::chrono::steady_clock::now();
  auto result = FromRank0(
      **collectives,
      [] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        return absl::StatusOr<std::string>("made");
      },
      "the test's result", /*poll_s=*/0.1);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("the wait for the test's result"));
  EXPECT_LT(seconds, 10);
}

TEST_F(DataParallelRunTest, RanksThatDisagreeAreRefusedOnEveryRank) {
  const Graph g = *BuildModel("mnist-cnn:batch=2");
  const Schedule dp = Plan(g, "baseline", 2);
  auto ranks = RunRanks(g, dp, 2, /*seeds=*/{0, 1});
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(ranks[r].ok()) << "rank " << r;
    EXPECT_THAT(ranks[r].status().message(), HasSubstr("differs between the ranks (rank 1"));
  }
}

TEST_F(DataParallelRunTest, ARankThatStopsFailsTheOthersWithoutHanging) {
  const Graph g = *BuildModel("mnist-cnn:batch=2");
  const Schedule dp = Plan(g, "baseline", 2);
  auto collectives = ConnectBesideAStoppedRank("dead");
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  auto backend = MakeBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status();
  const auto start = std::chrono::steady_clock::now();
  ExecutorOptions options;
  options.collectives = collectives->get();
  const absl::Status survivor = Execute(g, dp, **backend, options).status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(survivor.ok());
  EXPECT_THAT(survivor.message(), HasSubstr("a rank stopped"));
  EXPECT_LT(seconds, 10);
}

TEST_F(DataParallelRunTest, MisuseIsRefusedNamingTheCulprit) {
  const Graph g = *BuildModel("mnist-cnn:batch=2");
  const Schedule dp = Plan(g, "baseline", 2);
  auto backend = MakeBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto one_rank = Execute(g, dp, **backend);
  EXPECT_THAT(one_rank.status().message(), HasSubstr("give them (pebble run --ranks"));
  const std::string rendezvous = Rendezvous("stale");
  std::ofstream(std::filesystem::path(rendezvous) / "pebble-rank-0");  // an earlier run's
  auto again = ConnectGloo({.rank = 0, .ranks = 2, .rendezvous_dir = rendezvous, .timeout_s = 2});
  EXPECT_THAT(again.status().message(), HasSubstr("left from an earlier run"));
  // A file of the user's: refused, named, and left as it was.
  const std::string users = Rendezvous("users");
  std::ofstream(std::filesystem::path(users) / "mygraph.json") << "{}";
  auto foreign = ConnectGloo({.rank = 0, .ranks = 2, .rendezvous_dir = users, .timeout_s = 2});
  EXPECT_THAT(foreign.status().message(), HasSubstr("holds 'mygraph.json'"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(users), {}), 1);
  // A meeting that fails (no other rank) takes back its marker and store files,
  // and says gloo's reason once, without gloo's source locations.
  const std::string alone = Rendezvous("alone");
  auto lonely = ConnectGloo({.rank = 0, .ranks = 2, .rendezvous_dir = alone, .timeout_s = 1});
  EXPECT_THAT(lonely.status().message(), HasSubstr("could not meet the others"));
  EXPECT_THAT(lonely.status().message(), Not(HasSubstr("file_store.cc")));
  EXPECT_TRUE(std::filesystem::is_empty(alone));
  EXPECT_THAT(ConnectGloo({.rank = 2, .ranks = 2, .rendezvous_dir = rendezvous, .timeout_s = 2})
                  .status()
                  .message(),
              HasSubstr("a rank is 0 to ranks - 1"));
  EXPECT_THAT(ConnectGloo({.rank = 0, .ranks = 2, .rendezvous_dir = (dir_ / "missing").string(),
                           .timeout_s = 2})
                  .status()
                  .message(),
              HasSubstr("is not a directory"));
}

}  // namespace
}  // namespace pebble
