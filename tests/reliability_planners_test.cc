// The planners' promises (README's capability table, docs/multi-shot.md,
// docs/offload.md), checked where a sweep found them broken:
//  - no recomputation or offload policy is above best-order at `min`,
//    whatever the time limit (best-order's plan at that limit is a
//    candidate);
//  - `hybrid` keeps --time-limit on graphs where one simulation takes a
//    noticeable part of the limit;
//  - at a budget no plan meets, a policy shows its lowest-peak plan: no
//    higher than its own plan at `min`;
//  - `exact` prefers, among the cheapest plans, the lowest peak, and at an
//    infeasible budget never shows more than best-order's peak.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "gtest/gtest.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

Graph Model(const std::string& spec) {
  auto g = BuildModel(spec);
  EXPECT_TRUE(g.ok()) << spec << ": " << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// `policy` on `g`; the plan's figures checked against the simulator's.
absl::StatusOr<PlanResult> Plan(const std::string& policy, const Graph& g, int64_t budget,
                                double time_limit_s) {
  auto planner = MakePlanner(policy);
  EXPECT_TRUE(planner.ok()) << planner.status();
  if (!planner.ok()) return planner.status();
  PlannerOptions o;
  o.budget_bytes = budget;
  o.time_limit_s = time_limit_s;
  absl::StatusOr<PlanResult> r = (*planner)->Plan(g, o);
  if (r.ok()) {
    auto sim = Simulate(g, r->schedule);
    EXPECT_TRUE(sim.ok()) << policy << ": " << sim.status();
    if (sim.ok()) {
      EXPECT_EQ(sim->peak_bytes, r->report.peak_bytes) << policy;
    }
  }
  return r;
}

// The recomputation and offload policies that plan over best-order's order
// (composed, or swap and hybrid by themselves).
const char* const kComposed[] = {"sqrtn", "chen-greedy", "articulation", "rotor", "dtr",
                                 "checkmate-lp", "vdnn", "swap", "hybrid"};

// Random DAGs on which best-order's exact-order search beats its heuristics
// by more than 0.5% and takes tens of milliseconds. The limit is 2.5 times
// what best-order takes, so best-order alone finishes its search. The
// composition used to give best-order a quarter of the limit: cut there,
// it kept a heuristic order, and the policies that found no lower peak
// over it ended that far above best-order at `min`.
TEST(ReliabilityPlannersTest, NoComposedPolicyIsAboveBestOrderUnderAShortLimit) {
  int graphs = 0;
  for (const std::string spec : {"random:n=36,seed=2,sizes=random",
                                 "random:n=36,seed=5,sizes=random",
                                 "random:n=40,seed=10,sizes=random"}) {
    SCOPED_TRACE(spec);
    const Graph g = Model(spec);
    // Best-order's own time: the slower of two runs, for a loaded machine.
    double best_s = 0;
    absl::StatusOr<PlanResult> best;
    for (int k = 0; k < 2; ++k) {
      const auto start = std::chrono::steady_clock::now();
      best = Plan("best-order", g, PlannerOptions::kMinBudget, 60);
      best_s = std::max(best_s, Seconds(start));
    }
    ASSERT_TRUE(best.ok()) << best.status();
    ASSERT_EQ(best->details.value("winner", ""), "exact-order");
    int64_t heuristic = INT64_MAX;  // the lowest peak of best-order's other orders
    for (const auto& c : best->details["candidates"]) {
      if (c.value("policy", "") != "exact-order" && c.contains("peak_bytes")) {
        heuristic = std::min(heuristic, c["peak_bytes"].get<int64_t>());
      }
    }
    const int64_t optimum = best->report.peak_bytes;
    ASSERT_GT(static_cast<double>(heuristic), 1.005 * static_cast<double>(optimum));
    const double limit_s = std::max(0.02, 2.5 * best_s);
    ++graphs;
    for (const char* policy : kComposed) {
      SCOPED_TRACE(absl::StrCat(policy, " --time-limit ", limit_s));
      absl::StatusOr<PlanResult> r = Plan(policy, g, PlannerOptions::kMinBudget, limit_s);
      ASSERT_TRUE(r.ok()) << r.status();
      // The lowest peak, or one within 0.5% of it at a lower makespan.
      EXPECT_LE(static_cast<double>(r->report.peak_bytes), 1.005 * static_cast<double>(optimum))
          << r->message;
    }
  }
  EXPECT_EQ(graphs, 3);
}

// The same at a limit of zero, on random DAGs of several seeds: best-order
// then offers its first order, and so does every policy over it; none is
// above that plan.
TEST(ReliabilityPlannersTest, NoComposedPolicyIsAboveBestOrderAtALimitOfZero) {
  for (int n : {40, 69}) {
    for (int seed = 1; seed <= 4; ++seed) {
      const std::string spec = absl::StrCat("random:n=", n, ",seed=", seed, ",sizes=random");
      SCOPED_TRACE(spec);
      const Graph g = Model(spec);
      absl::StatusOr<PlanResult> best = Plan("best-order", g, PlannerOptions::kMinBudget, 0);
      ASSERT_TRUE(best.ok()) << best.status();
      for (const char* policy : kComposed) {
        SCOPED_TRACE(policy);
        absl::StatusOr<PlanResult> r = Plan(policy, g, PlannerOptions::kMinBudget, 0);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_LE(static_cast<double>(r->report.peak_bytes),
                  1.005 * static_cast<double>(best->report.peak_bytes))
            << r->message;
      }
    }
  }
}

// hybrid on a graph where a simulation takes a noticeable part of the limit
// (a 200,000-node path: tens of milliseconds each): the nested policies'
// last candidates and final simulations, hybrid's simulation of each and
// of the winner used to end 15-30% past the limit. The bound is the
// promise, 10%, and a small constant for the start. The fastest of up to
// three runs is judged: an overrun of the planner's shows in each, where a
// busy machine (the suite runs two tests at once) slowed one run now and
// then by 2%.
TEST(ReliabilityPlannersTest, HybridKeepsItsTimeLimitOnALargeGraph) {
  for (const auto& [spec, half] :
       {std::pair<std::string, bool>{"path:n=200000", true}, {"random:n=60000", false}}) {
    SCOPED_TRACE(spec);
    const Graph g = Model(spec);
    const int64_t budget = half ? *BaselinePeak(g) / 2 : PlannerOptions::kMinBudget;
    const double limit_s = 1.0;
    const double bound_s = 1.1 * limit_s + 0.05;
    double fastest_s = std::numeric_limits<double>::infinity();
    std::string message;  // the fastest run's
    for (int run = 0; run < 3 && fastest_s > bound_s; ++run) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<PlanResult> r = Plan("hybrid", g, budget, limit_s);
      const double took = Seconds(start);
      ASSERT_TRUE(r.ok()) << r.status();
      if (took < fastest_s) {
        fastest_s = took;
        message = r->message;
      }
    }
    EXPECT_LE(fastest_s, bound_s) << message;
  }
}

// Every multi-shot and offload policy at budgets no plan of it meets (30%
// of the baseline, and one byte under its own lowest peak): the plan shown
// peaks no higher than the policy's plan at `min`. checkmate and
// checkmate-lp showed the graph's one-shot plan (peak 293 B where `min`
// gives 264 B on the first graph). checkmate's MILP takes seconds on the
// 12-node graphs: it runs on the first only.
// A graph whose costs sum to a finite number, but whose recomputations
// would not (8e307 twice, where a recomputation of the first adds 8e307
// more): every policy plans it or refuses it with the overflow's message,
// never stops on an internal check (multi-shot heuristics aborted there,
// taking a Python interpreter with them).
TEST(ReliabilityPlannersTest, ACostThatRecomputationWouldOverflowIsNoCrash) {
  absl::StatusOr<Graph> g = ParseGraphJson(R"({"format": "pebble-graph", "version": 1,
    "nodes": [{"id": "x", "bytes": 10, "persistent": true},
              {"id": "a", "bytes": 100, "cost": 8e307, "inputs": ["x"]},
              {"id": "b", "bytes": 100, "cost": 1, "inputs": ["a"]},
              {"id": "c", "bytes": 100, "cost": 1, "inputs": ["b"]},
              {"id": "d", "bytes": 10, "cost": 8e307, "inputs": ["c", "a"]}],
    "outputs": ["d"]})");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
    if (p->external) continue;
    for (const int64_t budget : {kMinBudgetBytes, int64_t{210}}) {
      // (a refusal of the graph's shape, such as tree's of a DAG, is fine)
      absl::StatusOr<PlanResult> r = Plan(p->name, *g, budget, 5.0);
      if (r.ok()) {
        EXPECT_TRUE(std::isfinite(r->report.makespan)) << p->name;
      }
    }
  }
  // The multi-shot heuristics pass over their candidates that overflow.
  for (const char* policy : {"dtr", "hybrid", "sqrtn", "rotor"}) {
    absl::StatusOr<PlanResult> r = Plan(policy, *g, kMinBudgetBytes, 5.0);
    EXPECT_TRUE(r.ok()) << policy << ": " << r.status();
  }
  absl::StatusOr<PlanResult> checkmate = Plan("checkmate", *g, kMinBudgetBytes, 5.0);
  if (!checkmate.ok()) {
    EXPECT_THAT(std::string(checkmate.status().message()),
                HasSubstr("exceeds the largest double"));
  }
}

// A graph whose outputs are all persistent has nothing to compute: every
// policy gives the empty plan, at `min` too (checkmate's CBC was handed a
// model without variables there and crashed the process).
TEST(ReliabilityPlannersTest, NothingToComputeIsTheEmptyPlanUnderEveryPolicy) {
  for (const char* text :
       {R"({"format": "pebble-graph", "version": 1,
           "nodes": [{"id": "x", "bytes": 100, "persistent": true}], "outputs": ["x"]})",
        R"({"format": "pebble-graph", "version": 1,
           "nodes": [{"id": "x", "bytes": 100, "persistent": true},
                     {"id": "y", "bytes": 100, "inputs": ["x"]}], "outputs": ["x"]})"}) {
    absl::StatusOr<Graph> g = ParseGraphJson(text);
    ASSERT_TRUE(g.ok()) << g.status();
    for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
      if (p->external) continue;
      for (const int64_t budget : {kMinBudgetBytes, int64_t{100}}) {
        SCOPED_TRACE(absl::StrCat(p->name, " at ", budget));
        absl::StatusOr<PlanResult> r = Plan(p->name, *g, budget, 5.0);
        if (!r.ok()) continue;  // (a refusal of the graph, as fsdp's of an unsharded one)
        EXPECT_TRUE(r->feasible);
        EXPECT_TRUE(r->schedule.steps.empty());
        EXPECT_EQ(r->report.peak_bytes, 100);
      }
    }
  }
}

// A host bandwidth of 0, below 0 or NaN is refused by every policy with the
// simulator's words (hybrid's first candidate, simulated unchecked, aborted
// the process), and a step whose action is no Action by the simulator.
TEST(ReliabilityPlannersTest, ABandwidthNotAboveZeroIsRefusedByEveryPolicy) {
  absl::StatusOr<Graph> g = BuildModel("linear:n=20");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
    if (p->external) continue;
    absl::StatusOr<std::unique_ptr<Planner>> planner = MakePlanner(p->name);
    ASSERT_TRUE(planner.ok());
    PlannerOptions options;
    options.budget_bytes = kMinBudgetBytes;
    options.time_limit_s = 2;
    if (!(*planner)->Plan(*g, options).ok()) continue;  // (fsdp's refusal of an unsharded graph)
    for (const double bandwidth : {0.0, -1.0, std::nan("")}) {
      SCOPED_TRACE(absl::StrCat(p->name, " at ", bandwidth, " bytes/s"));
      options.host_bandwidth_bytes_per_s = bandwidth;
      absl::StatusOr<PlanResult> r = (*planner)->Plan(*g, options);
      ASSERT_FALSE(r.ok());
      EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("bandwidth"));
    }
  }
  Schedule bad;
  bad.steps.push_back({static_cast<Action>(17), 0});
  absl::StatusOr<PlanReport> report = Simulate(*g, bad);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(std::string(report.status().message()), ::testing::HasSubstr("action 17"));
}

TEST(ReliabilityPlannersTest, AnInfeasibleBudgetShowsTheLowestPeak) {
  const char* const policies[] = {"sqrtn", "chen-greedy", "articulation", "revolve", "rotor",
                                  "dtr", "checkmate", "checkmate-lp", "exact", "vdnn",
                                  "swap", "hybrid"};
  for (const std::string spec : {"random:n=10,seed=5,sizes=random",
                                 "random:n=12,seed=1,sizes=random",
                                 "random:n=12,seed=5,sizes=random"}) {
    const Graph g = Model(spec);
    const int64_t baseline = *BaselinePeak(g);
    for (const std::string policy : policies) {
      if (policy == "checkmate" && spec != "random:n=10,seed=5,sizes=random") continue;
      SCOPED_TRACE(absl::StrCat(policy, " on ", spec));
      absl::StatusOr<PlanResult> low = Plan(policy, g, PlannerOptions::kMinBudget, 20);
      if (!low.ok()) continue;  // refused: revolve on a non-chain
      ASSERT_FALSE(TimeLimitReached(*low)) << low->message;
      const int64_t lowest = low->report.peak_bytes;
      for (int64_t budget : {baseline * 3 / 10, lowest - 1}) {
        SCOPED_TRACE(absl::StrCat("budget ", budget));
        absl::StatusOr<PlanResult> r = Plan(policy, g, budget, 20);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_FALSE(TimeLimitReached(*r)) << r->message;
        if (r->feasible) continue;  // met where `min` did not: allowed
        EXPECT_LE(r->report.peak_bytes, lowest) << r->message;
      }
    }
  }
}

// exact at a budget best-order's plan meets: every such plan costs the
// least (each node once), so among the cheapest the lowest peak is at most
// best-order's. It used to keep whichever cheapest plan its search met
// first (587 B where best-order has 443 B on the first graph).
TEST(ReliabilityPlannersTest, ExactPrefersTheLowerPeakAmongTheCheapest) {
  int checked = 0;
  for (const std::string spec :
       {"random:n=23,seed=1923725476,sizes=random", "random:n=14,seed=1,sizes=random",
        "random:n=18,seed=2,sizes=random", "random:n=20,seed=3,sizes=random"}) {
    SCOPED_TRACE(spec);
    const Graph g = Model(spec);
    absl::StatusOr<PlanResult> best = Plan("best-order", g, PlannerOptions::kMinBudget, 60);
    ASSERT_TRUE(best.ok()) << best.status();
    const int64_t baseline = *BaselinePeak(g);
    for (int64_t budget : {baseline * 8 / 10, best->report.peak_bytes, baseline}) {
      if (budget < best->report.peak_bytes) continue;
      SCOPED_TRACE(absl::StrCat("budget ", budget));
      absl::StatusOr<PlanResult> r = Plan("exact", g, budget, 30);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(r->feasible) << r->message;
      EXPECT_DOUBLE_EQ(r->report.compute_cost, best->report.compute_cost);
      EXPECT_LE(r->report.peak_bytes, best->report.peak_bytes);
      ++checked;
    }
  }
  EXPECT_GE(checked, 8);
}

// exact at a budget no schedule meets, where its search for the lowest peak
// does not finish in the time limit (29 nodes, 3 s: it ends on the search's
// memory limit after 9 s here): best-order's plan is shown, not the graph's
// one-shot plan (960 B against best-order's 730 B here), and the message
// says which. (At half a second, the proof that nothing fits ran out of
// time once on a loaded machine.)
TEST(ReliabilityPlannersTest, ExactAtAnInfeasibleBudgetShowsNoMoreThanBestOrder) {
  const Graph g = Model("random:n=29,seed=975341078,sizes=random");
  absl::StatusOr<PlanResult> best = Plan("best-order", g, PlannerOptions::kMinBudget, 0.5);
  ASSERT_TRUE(best.ok()) << best.status();
  ASSERT_LT(best->report.peak_bytes, *BaselinePeak(g));  // the case worth testing
  absl::StatusOr<PlanResult> r = Plan("exact", g, *BaselinePeak(g) * 3 / 10, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->feasible);
  EXPECT_LE(r->report.peak_bytes, best->report.peak_bytes) << r->message;
  EXPECT_THAT(r->message, HasSubstr("no schedule fits"));
  EXPECT_THAT(r->message, HasSubstr("the schedule shown is best-order's"));
}

// The same where the search does finish: the peak shown is the lowest of
// any schedule, which the message states.
TEST(ReliabilityPlannersTest, ExactAtAnInfeasibleBudgetShowsTheLowestPeakOfAll) {
  for (const std::string spec :
       {"random:n=12,seed=4,sizes=random", "random:n=16,seed=5,sizes=random"}) {
    SCOPED_TRACE(spec);
    const Graph g = Model(spec);
    absl::StatusOr<PlanResult> low = Plan("exact", g, PlannerOptions::kMinBudget, 30);
    ASSERT_TRUE(low.ok()) << low.status();
    const int64_t min_peak = low->details.value("min_peak_bytes", int64_t{-1});
    ASSERT_GT(min_peak, 0);
    absl::StatusOr<PlanResult> r = Plan("exact", g, min_peak - 1, 30);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->feasible);
    EXPECT_EQ(r->report.peak_bytes, min_peak);
    EXPECT_EQ(r->details.value("min_peak_bytes", int64_t{-1}), min_peak);
    EXPECT_THAT(r->message, HasSubstr("the lowest peak of any schedule is"));
  }
}

}  // namespace
}  // namespace pebble
