// Checkmate's MILP and LP policies: the stage-plan conversion, agreement
// with the exact planner and with a brute force over Checkmate's own model,
// and the solver's behaviour (time limit, silence, infeasibility).
#include "scheduler/checkmate.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/models/models.h"
#include "gtest/gtest.h"
#include "scheduler/budget.h"
#include "scheduler/exact_multishot.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"
#include "tests/test_util.h"

namespace pebble {
namespace {

using ::pebble::testing::MakeGraph;
using ::pebble::testing::MakeSchedule;
using ::pebble::testing::Node;
using ::pebble::testing::Persistent;
using ::pebble::testing::RandomDag;
using ::testing::HasSubstr;

constexpr Action kC = Action::kCompute;
constexpr Action kF = Action::kFree;

// As in exact_multishot_test: x (persistent, 10 B); a (1 B) <- x;
// b (2 B) <- a; c (2 B) <- b; d (2 B) <- c; out (1 B) <- (d, a); unit
// costs. Budget 15: no recomputation (cost 5); 14: a is recomputed in the
// last stage (cost 6); 13: nothing fits (b and c together need 14).
Graph SkipGraph() {
  return MakeGraph({Persistent("x", 10), Node("a", 1, {"x"}), Node("b", 2, {"a"}),
                    Node("c", 2, {"b"}), Node("d", 2, {"c"}),
                    Node("out", 1, {"d", "a"})},
                   {"out"});
}

absl::StatusOr<PlanResult> PlanWith(const Graph& g, absl::string_view policy,
                                    int64_t budget, double time_limit_s = 30) {
  auto planner = MakePlanner(policy);
  if (!planner.ok()) return planner.status();
  PlannerOptions options;
  options.budget_bytes = budget;
  options.time_limit_s = time_limit_s;
  // Checkmate's own model (the graph's order), not composed with
  // best-order: what these tests pin (composition: compose_test.cc).
  options.own_order = true;
  return (*planner)->Plan(g, options);
}

// The wall time a call with `limit_s` may take on a loaded test machine: a
// quarter over, plus a second (for the model, the simulation and the layout
// around the solve). A solver bounded by CPU time instead of wall time, or
// not bounded at all, overruns it.
double TimeLimitSlack(double limit_s) { return 1.25 * limit_s + 1.0; }

double SecondsOf(const std::function<void()>& call) {
  const auto t0 = std::chrono::steady_clock::now();
  call();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t OneShotPeak(const Graph& g) {
  auto s = FreeAtLastUse(g, DefaultOrder(g));
  EXPECT_TRUE(s.ok()) << s.status();
  return Simulate(g, *s)->peak_bytes;
}

TEST(StagePlanTest, OneShotPlanIsFreeAtLastUse) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Graph g = RandomDag(12, seed);
    auto schedule = StagePlanToSchedule(g, OneShotStagePlan(g));
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    auto r = Simulate(g, *schedule);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->peak_bytes, OneShotPeak(g));
    EXPECT_TRUE(r->one_shot);
  }
}

TEST(StagePlanTest, ValidationNamesTheMissingInput) {
  Graph g = SkipGraph();
  StagePlan plan = OneShotStagePlan(g);
  // a is no longer held from stage 2 on, so stage 4 (out) lacks it.
  for (int t = 2; t <= 4; ++t) plan.keep[t][0] = 0;
  EXPECT_THAT(ValidateStagePlan(g, plan).message(), HasSubstr("without its input 'a'"));
  // Phase two repairs it by recomputing a in stage 4.
  StagePlan fixed = ComputeForKeep(g, plan.order, plan.keep);
  ASSERT_TRUE(ValidateStagePlan(g, fixed).ok());
  EXPECT_EQ(fixed.compute[4][0], 1);
  auto schedule = StagePlanToSchedule(g, fixed);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto r = Simulate(g, *schedule);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peak_bytes, 14);
  EXPECT_DOUBLE_EQ(r->compute_cost, 6);
}

// The baseline schedule (free at last use in the default order) maps back
// to the one-shot stage plan.
TEST(StagePlanTest, FromScheduleOfTheBaselineIsTheOneShotPlan) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Graph g = RandomDag(12, seed);
    auto baseline = FreeAtLastUse(g, DefaultOrder(g));
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    const StagePlan from = StagePlanFromSchedule(g, *baseline);
    const StagePlan one_shot = OneShotStagePlan(g);
    EXPECT_EQ(from.order, one_shot.order) << "seed " << seed;
    EXPECT_EQ(from.keep, one_shot.keep) << "seed " << seed;
    EXPECT_EQ(from.compute, one_shot.compute) << "seed " << seed;
  }
}

// On a chain, the stage form of rotor's plan computes exactly what rotor
// computes and stays within the budget: the MILP's warm start is that plan.
TEST(StagePlanTest, FromScheduleKeepsRotorsPlanOnAChain) {
  auto g = BuildModel("linear:n=10");
  ASSERT_TRUE(g.ok()) << g.status();
  for (int64_t budget : {4, 5, 6, 8}) {
    auto rotor = PlanWith(*g, "rotor", budget);
    ASSERT_TRUE(rotor.ok()) << rotor.status();
    ASSERT_TRUE(rotor->feasible) << budget;
    const StagePlan plan = StagePlanFromSchedule(*g, rotor->schedule);
    ASSERT_TRUE(ValidateStagePlan(*g, plan).ok());
    auto schedule = StagePlanToSchedule(*g, plan);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    auto r = Simulate(*g, RemoveDeadComputes(*g, *schedule));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_DOUBLE_EQ(r->compute_cost, rotor->report.compute_cost) << budget;
    EXPECT_LE(r->peak_bytes, budget);
  }
}

// Any schedule, even one whose first computations leave the default order
// or that offloads, becomes a valid plan of the model.
TEST(StagePlanTest, FromAnyScheduleIsValid) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Graph g = RandomDag(12, seed);
    const int64_t least = PeakLowerBound(g);
    // Other orders (greedy, dfs), recomputation (dtr) and offload (swap).
    for (const auto& [policy, budget] :
         std::vector<std::pair<const char*, int64_t>>{{"greedy", INT64_MAX},
                                                       {"dfs", INT64_MAX},
                                                       {"dtr", least},
                                                       {"swap", least}}) {
      auto planned = PlanWith(g, policy, budget);
      ASSERT_TRUE(planned.ok()) << policy << ": " << planned.status();
      const StagePlan plan = StagePlanFromSchedule(g, planned->schedule);
      SCOPED_TRACE(absl::StrCat(policy, " seed ", seed));
      EXPECT_TRUE(ValidateStagePlan(g, plan).ok());
      auto schedule = StagePlanToSchedule(g, plan);
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      EXPECT_TRUE(Simulate(g, *schedule).ok());
    }
  }
}

TEST(StagePlanTest, RemoveDeadComputes) {
  Graph g = SkipGraph();
  // The first a is freed before anything reads it; the recompute is used.
  Schedule s = MakeSchedule(g, {{kC, "a"}, {kF, "a"}, {kC, "a"}, {kC, "b"},
                                {kC, "c"}, {kF, "b"}, {kC, "d"}, {kF, "c"},
                                {kC, "out"}, {kC, "b"}});
  Schedule cleaned = RemoveDeadComputes(g, s);
  EXPECT_EQ(cleaned, MakeSchedule(g, {{kC, "a"}, {kC, "b"}, {kC, "c"}, {kF, "b"},
                                      {kC, "d"}, {kF, "c"}, {kC, "out"}}));
}

TEST(CheckmateTest, HandTracedBudgets) {
  Graph g = SkipGraph();
  auto r = PlanWith(g, "checkmate", 15);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->feasible);
  EXPECT_DOUBLE_EQ(r->report.compute_cost, 5);
  EXPECT_EQ(r->details["optimal"], true);

  r = PlanWith(g, "checkmate", 14);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->feasible) << r->message;
  EXPECT_EQ(r->report.peak_bytes, 14);
  EXPECT_DOUBLE_EQ(r->report.compute_cost, 6);
  EXPECT_EQ(r->details["optimal"], true);
  EXPECT_EQ(r->details["status"], "optimal");

  r = PlanWith(g, "checkmate", 13);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->feasible);
  EXPECT_EQ(r->details["status"], "infeasible");
  EXPECT_THAT(r->message, HasSubstr("no plan in Checkmate's model fits"));

  // CBC's log is silenced: the CLI's stdout stays one JSON document.
  ::testing::internal::CaptureStdout();
  r = PlanWith(g, "checkmate-lp", 14);
  auto milp = PlanWith(g, "checkmate", 14);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  ASSERT_TRUE(milp.ok()) << milp.status();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->feasible) << r->message;
  EXPECT_EQ(r->details["optimal"], false);
  EXPECT_GE(r->report.compute_cost, 6);
}

// Note [Checkmate's model]'s example: the fixed order p, o1, o2 makes the
// last stage hold p, o1 and o2 (21 B); the exact planner's order p, o2, o1
// needs 11 B.
TEST(CheckmateTest, FixedOrderCanBeWorseThanExact) {
  Graph g = MakeGraph({Node("p", 10), Node("o1", 10), Node("o2", 1, {"p"})},
                      {"o1", "o2"});
  auto r = PlanWith(g, "checkmate", 20);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->feasible);
  EXPECT_EQ(r->details["status"], "infeasible");
  auto exact = PlanWith(g, "exact", 11);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_TRUE(exact->feasible);
  EXPECT_DOUBLE_EQ(exact->report.compute_cost, 3);
  r = PlanWith(g, "checkmate", 21);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->feasible);
}

// The cheapest plan of Checkmate's model by enumeration: every S over the
// default order, R from phase two (the least R for S, also the cheapest and
// smallest in memory), the schedule converted without removing dead
// computes. Returns the least plan cost whose simulated peak fits, or
// nullopt. 2^(n(n-1)/2) matrices: n <= 6 stages.
std::optional<double> BruteForceCheckmate(const Graph& g, int64_t budget) {
  const std::vector<NodeId> order = DefaultOrder(g);
  const int n = static_cast<int>(order.size());
  const int bits = n * (n - 1) / 2;
  std::optional<double> best;
  for (uint32_t mask = 0; mask < (1u << bits); ++mask) {
    std::vector<std::vector<uint8_t>> keep(n + 1);
    int b = 0;
    for (int t = 0; t <= n; ++t) {
      keep[t].assign(t, 0);
      if (t == n) continue;
      for (int i = 0; i < t; ++i) keep[t][i] = (mask >> b++) & 1;
    }
    auto schedule = StagePlanToSchedule(g, ComputeForKeep(g, order, keep));
    EXPECT_TRUE(schedule.ok()) << schedule.status();
    if (!schedule.ok()) continue;
    auto r = Simulate(g, *schedule);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->peak_bytes > budget) continue;
    if (!best.has_value() || r->compute_cost < *best) best = r->compute_cost;
  }
  return best;
}

// The MILP against the enumeration of its own model, and both policies
// against the exact planner, on tiny random DAGs (zero costs included).
TEST(CheckmateTest, EqualsBruteForceOverItsModelOnRandomDags) {
  int compared = 0;
  for (int n = 4; n <= 6; ++n) {
    for (uint64_t seed = 0; seed < 8; ++seed) {
      Graph g = RandomDag(n, 31 * n + seed);
      if (DefaultOrder(g).size() > 6) continue;
      auto low = ExactMinPeakSchedule(g, 30);
      ASSERT_TRUE(low.ok()) << low.status();
      const int64_t high = OneShotPeak(g);
      for (int k = 0; k <= 4; ++k) {
        const int64_t budget = low->peak - 1 + (high - low->peak + 1) * k / 4;
        SCOPED_TRACE(absl::StrCat(g.name(), " budget ", budget));
        const std::optional<double> brute = BruteForceCheckmate(g, budget);
        auto exact = ExactMultiShotSchedule(g, budget, 30);
        ASSERT_TRUE(exact.ok()) << exact.status();
        auto r = PlanWith(g, "checkmate", budget);
        ASSERT_TRUE(r.ok()) << r.status();
        ++compared;
        ASSERT_EQ(r->feasible, brute.has_value()) << r->message;
        if (!brute.has_value()) continue;
        ASSERT_TRUE(exact->has_value());
        EXPECT_EQ(r->details["optimal"], true);
        EXPECT_NEAR(r->details["objective"].get<double>(), *brute, 1e-9);
        EXPECT_LE(r->report.peak_bytes, budget);
        EXPECT_LE(r->report.compute_cost, *brute + 1e-9);  // dead computes go
        EXPECT_GE(r->report.compute_cost, (*exact)->cost - 1e-9);
        auto lp = PlanWith(g, "checkmate-lp", budget);
        ASSERT_TRUE(lp.ok()) << lp.status();
        if (lp->feasible) {
          EXPECT_LE(lp->report.peak_bytes, budget);
          EXPECT_GE(lp->details["objective"].get<double>(), *brute - 1e-9);
          EXPECT_GE(lp->report.compute_cost, (*exact)->cost - 1e-9);
          EXPECT_EQ(lp->details["optimal"], false);
        }
      }
    }
  }
  EXPECT_GT(compared, 60);
}

// On Checkmate's linear graphs the topological order is unique and the
// model loses nothing: the MILP (below the one-shot shortcut) equals the
// exact planner at every budget from one below the minimum peak to the
// one-shot peak; the LP rounding is valid and no cheaper.
TEST(CheckmateTest, EqualsExactOnLinearGraphs) {
  for (int n = 3; n <= 8; ++n) {
    auto g = BuildModel(absl::StrCat("linear:n=", n));
    ASSERT_TRUE(g.ok()) << g.status();
    auto low = ExactMinPeakSchedule(*g, 30);
    ASSERT_TRUE(low.ok()) << low.status();
    for (int64_t budget = low->peak - 1; budget <= OneShotPeak(*g); ++budget) {
      SCOPED_TRACE(absl::StrCat("linear:n=", n, " budget ", budget));
      auto exact = ExactMultiShotSchedule(*g, budget, 30);
      ASSERT_TRUE(exact.ok()) << exact.status();
      auto r = PlanWith(*g, "checkmate", budget);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->feasible, exact->has_value()) << r->message;
      auto lp = PlanWith(*g, "checkmate-lp", budget);
      ASSERT_TRUE(lp.ok()) << lp.status();
      if (!exact->has_value()) {
        EXPECT_FALSE(lp->feasible);
        continue;
      }
      EXPECT_EQ(r->details["optimal"], true);
      EXPECT_LE(r->report.peak_bytes, budget);
      EXPECT_NEAR(r->report.compute_cost, (*exact)->cost, 1e-9);
      EXPECT_NEAR(r->details["objective"].get<double>(), (*exact)->cost, 1e-9);
      EXPECT_NEAR(r->details["gap"].get<double>(), 0, 1e-9);
      if (lp->feasible) {
        EXPECT_LE(lp->report.peak_bytes, budget);
        EXPECT_GE(lp->report.compute_cost, (*exact)->cost - 1e-9);
        EXPECT_LE(lp->details["lower_bound"].get<double>(), (*exact)->cost + 1e-6);
      }
    }
  }
}

// --budget min: the lowest peak of the model, then the cheapest plan there.
TEST(CheckmateTest, MinBudgetOnLinearGraphs) {
  for (int n = 3; n <= 6; ++n) {
    auto g = BuildModel(absl::StrCat("linear:n=", n));
    ASSERT_TRUE(g.ok()) << g.status();
    auto low = ExactMinPeakSchedule(*g, 30);
    ASSERT_TRUE(low.ok()) << low.status();
    auto exact = ExactMultiShotSchedule(*g, low->peak, 30);
    ASSERT_TRUE(exact.ok() && exact->has_value());
    auto r = PlanWith(*g, "checkmate", PlannerOptions::kMinBudget);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->feasible);
    EXPECT_EQ(r->details["optimal"], true) << r->message;
    EXPECT_EQ(r->report.peak_bytes, low->peak) << n;
    EXPECT_NEAR(r->report.compute_cost, (*exact)->cost, 1e-9) << n;
    auto lp = PlanWith(*g, "checkmate-lp", PlannerOptions::kMinBudget);
    ASSERT_TRUE(lp.ok()) << lp.status();
    EXPECT_TRUE(lp->feasible);
    EXPECT_GE(lp->report.peak_bytes, low->peak);
  }
}

// Zero-cost nodes carry an epsilon in the objective: the plan recomputes
// no more than it must. SkipGraph with every cost 0 but out's: budget 14
// needs exactly one recomputation (of a).
TEST(CheckmateTest, ZeroCostNodesAreNotRecomputedForNothing) {
  Graph g = MakeGraph({Persistent("x", 10), Node("a", 1, {"x"}, 0), Node("b", 2, {"a"}, 0),
                       Node("c", 2, {"b"}, 0), Node("d", 2, {"c"}, 0),
                       Node("out", 1, {"d", "a"}, 1)},
                      {"out"});
  for (const char* policy : {"checkmate", "checkmate-lp"}) {
    auto r = PlanWith(g, policy, 14);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->feasible) << policy;
    EXPECT_DOUBLE_EQ(r->report.compute_cost, 1) << policy;
    EXPECT_EQ(r->report.recomputations, 1) << policy;
  }
}

TEST(CheckmateTest, InfeasibleBudgets) {
  auto g = BuildModel("linear:n=6");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* policy : {"checkmate", "checkmate-lp"}) {
    // Below the lower bound (a backward node with its two inputs: 3).
    auto r = PlanWith(*g, policy, 2);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->feasible) << policy;
    EXPECT_EQ(r->details["status"], "infeasible") << policy;
    EXPECT_THAT(r->message, HasSubstr("lower bound")) << policy;
    EXPECT_EQ(r->details["optimal"], false);
  }
}

// Two acceptance workloads, solved to proven optimality in the time limit:
// conv3d:n=8's training graph (19 stages) and Checkmate's linear:n=20 (41
// stages) at budgets that force recomputation.
TEST(CheckmateTest, SolvesConv3dAndLinear20ToOptimality) {
  struct Case {
    const char* model;
    int64_t budget;  // < 0: that percentage of (one-shot peak - lower bound)
  };
  for (const Case& c : {Case{"conv3d:n=8", -50}, Case{"conv3d:n=8", -5},
                        Case{"linear:n=20", 14}, Case{"linear:n=20", 10},
                        Case{"linear:n=20", 7}}) {
    auto g = BuildModel(c.model);
    ASSERT_TRUE(g.ok()) << g.status();
    const int64_t lower = PeakLowerBound(*g);
    const int64_t budget =
        c.budget >= 0 ? c.budget : lower + (OneShotPeak(*g) - lower) * -c.budget / 100;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = PlanWith(*g, "checkmate", budget, 60);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r.ok()) << r.status();
    SCOPED_TRACE(absl::StrCat(c.model, " budget ", budget, ": ", r->message));
    EXPECT_TRUE(r->feasible);
    EXPECT_EQ(r->details["optimal"], true);
    EXPECT_LE(r->report.peak_bytes, budget);
    EXPECT_GT(r->report.recomputations, 0);
    EXPECT_LT(secs, 60);
    // conv3d:n=8 (19 nodes) and linear:n=20 at 7 bytes are within the exact
    // planner's reach; linear:n=20 at 10 or 14 bytes has too many resident
    // sets (ResourceExhausted).
    if (c.budget < 0 || budget <= 7) {
      auto exact = ExactMultiShotSchedule(*g, budget, 60);
      ASSERT_TRUE(exact.ok()) << exact.status();
      ASSERT_TRUE(exact->has_value());
      EXPECT_NEAR(r->report.compute_cost, (*exact)->cost, 1e-9 * (*exact)->cost);
    }
    std::printf("%s budget %lld: cost %g (base %g), %lld recomputations, %.2f s, "
                "%d variables (%d integer), %d rows\n",
                c.model, static_cast<long long>(budget), r->report.compute_cost,
                r->report.base_cost, static_cast<long long>(r->report.recomputations),
                secs, r->details["variables"].get<int>(),
                r->details["integer_variables"].get<int>(),
                r->details["constraints"].get<int>());
  }
}

// At the tightest budgets of linear:n=20 CBC's LP bound (58 and 57) stays
// far below the optimum; the policy starts CBC from rotor's plan and closes
// the gap with the exact search (Note [Certifying with the exact search]).
TEST(CheckmateTest, CertifiesTightBudgetsWithTheExactSearch) {
  auto g = BuildModel("linear:n=20");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const auto& [budget, optimum] : {std::pair<int64_t, double>{5, 70},
                                        std::pair<int64_t, double>{6, 63}}) {
    auto r = PlanWith(*g, "checkmate", budget, 8);
    ASSERT_TRUE(r.ok()) << r.status();
    SCOPED_TRACE(absl::StrCat("budget ", budget, ": ", r->message));
    EXPECT_TRUE(r->feasible);
    EXPECT_LE(r->report.peak_bytes, budget);
    EXPECT_DOUBLE_EQ(r->report.compute_cost, optimum);
    EXPECT_EQ(r->details["optimal"], true);
    EXPECT_EQ(r->details["bound_source"], "exact search");
    EXPECT_THAT(r->message, HasSubstr("closed by the exact search"));
    EXPECT_THAT(r->details["warm_starts"].dump(), HasSubstr("rotor"));
  }
}

// A MILP too hard for the limit stops on time with its best incumbent
// (a warm start, the LP rounding or CBC's), not proven optimal. linear:n=40
// (81 nodes) is past the exact search's reach, so nothing certifies it.
TEST(CheckmateTest, StopsAtTheTimeLimitWithTheIncumbent) {
  auto g = BuildModel("linear:n=40");
  ASSERT_TRUE(g.ok()) << g.status();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = PlanWith(*g, "checkmate", 5, 4.0);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(secs, TimeLimitSlack(4.0));
  EXPECT_TRUE(r->feasible) << r->message;
  EXPECT_LE(r->report.peak_bytes, 5);
  EXPECT_EQ(r->details["optimal"], false);
  EXPECT_EQ(r->details["status"], "feasible");
  EXPECT_GT(r->details["gap"].get<double>(), 0);
  EXPECT_EQ(r->details["bound_source"], "cbc");
  EXPECT_THAT(r->message, HasSubstr("not proven optimal"));
}

// On a larger model the time limit holds even when no plan is found.
TEST(CheckmateTest, HonoursTheTimeLimitOnALargerModel) {
  auto g = BuildModel("linear:n=40");  // 81 stages, 17k columns
  ASSERT_TRUE(g.ok()) << g.status();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = PlanWith(*g, "checkmate", 8, 3.0);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(secs, TimeLimitSlack(3.0));
  EXPECT_EQ(r->details["optimal"], false);
  if (r->feasible) {
    EXPECT_LE(r->report.peak_bytes, 8);
  } else {
    EXPECT_THAT(r->message, HasSubstr("time limit"));
  }
}

// A plan of resnet18:batch=8,image=64 (1.1M nonzeros in either model) at
// 97% of its one-shot peak with `policy` and a `limit_s` time limit, and
// that budget; the call must end within the limit's slack.
struct TimedPlan {
  PlanResult plan;
  int64_t budget = 0;
};

void PlanResnet18Within(absl::string_view policy, double limit_s, TimedPlan* out) {
  auto g = BuildModel("resnet18:batch=8,image=64");
  ASSERT_TRUE(g.ok()) << g.status();
  out->budget = OneShotPeak(*g) * 97 / 100;
  absl::StatusOr<PlanResult> r;
  const double secs = SecondsOf([&] { r = PlanWith(*g, policy, out->budget, limit_s); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(secs, TimeLimitSlack(limit_s)) << policy;
  out->plan = *std::move(r);
}

// checkmate-lp's LP of resnet18:batch=8,image=64 has 1.1M nonzeros: Clp's
// set-up alone (load and presolve, which no deadline interrupts) would take
// most of 0.3 s, so the LP is not started and the result says why; the
// repair (rotor, dtr) may still find a plan in the time left.
TEST(CheckmateTest, LpIsNotStartedWhenItsSetUpWouldOverrunTheLimit) {
  TimedPlan t;
  ASSERT_NO_FATAL_FAILURE(PlanResnet18Within("checkmate-lp", 0.3, &t));
  const PlanResult& r = t.plan;
  if (r.details.contains("repaired_by")) {
    EXPECT_TRUE(r.feasible);
    EXPECT_TRUE(r.details["lp"].is_object());
    // The LP's cut stays said with the repair that won: a longer limit may
    // give a better plan. details.lp is the LP's, whichever repair won.
    EXPECT_EQ(r.details["lp"]["time_limit_reached"], true) << r.details.dump();
    EXPECT_FALSE(r.details["lp"].contains("repaired_by")) << r.details.dump();
    EXPECT_TRUE(TimeLimitReached(r));
    EXPECT_THAT(r.message, HasSubstr("time limit of 0.3 s reached"));
  } else {
    EXPECT_FALSE(r.feasible);
    EXPECT_EQ(r.details["time_limit_reached"], true);
    EXPECT_THAT(r.message, HasSubstr("was not started"));
  }
}

// The MILP's set-up (the model's load, CBC's copy of it, presolve and the
// root LP's start) runs to its end whatever the deadline, about 2 s for the
// 1.1M nonzeros here: with 1.5 s CBC is not started, and the result says
// why. (resnet50 at 600 stages took 22 s against a 3 s limit before.)
TEST(CheckmateTest, MilpIsNotStartedWhenItsSetUpWouldOverrunTheLimit) {
  TimedPlan t;
  ASSERT_NO_FATAL_FAILURE(PlanResnet18Within("checkmate", 1.5, &t));
  EXPECT_THAT(t.plan.message, HasSubstr("CBC was not started"));
  EXPECT_EQ(t.plan.details["time_limit_reached"], true) << t.plan.message;
}

// Below its least peak, each Checkmate policy as `plan` runs it (composed
// with best-order, over storages) hands its least-peak plan's peak on with
// the refusal, so the advice does not plan at min again (which took the
// rest of a 10 s limit after a plan of 0.4 s here).
TEST(CheckmateTest, ARefusalCarriesTheLeastPeakFound) {
  auto g = BuildModel("resnet18:batch=8,image=64");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* policy : {"checkmate", "checkmate-lp"}) {
    SCOPED_TRACE(policy);
    auto planner = MakePlanner(policy);
    ASSERT_TRUE(planner.ok()) << planner.status();
    PlannerOptions options;
    options.budget_bytes = OneShotPeak(*g) * 80 / 100;
    options.time_limit_s = 10;
    absl::StatusOr<PlanResult> r = (*planner)->Plan(*g, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->feasible);
    ASSERT_TRUE(r->least_peak_bytes.has_value());
    EXPECT_LE(*r->least_peak_bytes, r->report.peak_bytes);
    EXPECT_GT(*r->least_peak_bytes, options.budget_bytes);
  }
}

// Given time for the set-up, the LP itself stops at the limit (wall clock,
// checked every simplex iteration), or finishes and is rounded.
TEST(CheckmateTest, LpStopsAtTheTimeLimit) {
  TimedPlan t;
  ASSERT_NO_FATAL_FAILURE(PlanResnet18Within("checkmate-lp", 3.0, &t));
  const PlanResult& r = t.plan;
  if (r.feasible) {
    EXPECT_LE(r.report.peak_bytes, t.budget);
  } else {
    EXPECT_EQ(r.details["time_limit_reached"], true) << r.message;
    EXPECT_THAT(r.message, HasSubstr("time limit"));
  }
}

TEST(CheckmateTest, RejectsGraphsPastTheLimit) {
  auto g = BuildModel(absl::StrCat("linear:n=", kMaxMilpStages / 2 + 1));
  ASSERT_TRUE(g.ok()) << g.status();
  auto r = PlanWith(*g, "checkmate", 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("at most"));
  EXPECT_THAT(r.status().message(), HasSubstr("--milp-max-stages"));
  // The cap is an option: raised, the MILP runs (here cut by a short limit).
  auto planner = MakePlanner("checkmate");
  ASSERT_TRUE(planner.ok());
  PlannerOptions o;
  o.budget_bytes = 10;
  o.time_limit_s = 1;
  o.own_order = true;
  o.milp_max_stages = 2 * kMaxMilpStages;
  auto raised = (*planner)->Plan(*g, o);
  EXPECT_TRUE(raised.ok()) << raised.status();
  o.milp_max_stages = 10;  // and lowered, a small graph is refused
  auto lowered = (*planner)->Plan(*BuildModel("linear:n=20"), o);
  EXPECT_FALSE(lowered.ok());
}

// Costs are in any unit (seconds of 1e-13, or FLOPs of 1e13): the plan
// and its certificate must not depend on it. At 1e-13 s a node, an absolute
// tolerance of 1e-9 once called a plan of 38 recomputations optimal on this
// chain, where exact (and checkmate at 1e13) find 11.
TEST(CheckmateTest, SamePlanAtAnyCostScale) {
  // Eight steps: CBC proves the optimum at 24 bytes in about 2 s (at ten
  // steps, 20 s per cost scale on the CI machine's two cores).
  const Graph g = *BuildModel("tanh-chain:length=8,size=1");
  auto scaled = [&](double factor) {
    GraphBuilder b(g.name());
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      NodeSpec spec = SpecOf(g, v);
      spec.cost *= factor;
      b.AddNode(std::move(spec));
    }
    for (NodeId o : g.outputs()) b.AddOutput(g.id(o));
    return *b.Build();
  };
  auto exact = PlanWith(g, "exact", 24);
  ASSERT_TRUE(exact.ok()) << exact.status();
  for (const char* policy : {"checkmate", "checkmate-lp"}) {
    std::optional<int> recomputations;
    for (double factor : {1.0, 1e13, 1e-6, 1e6}) {
      SCOPED_TRACE(absl::StrCat(policy, " at costs x ", factor));
      auto r = PlanWith(scaled(factor), policy, 24);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(r->feasible);
      if (!recomputations) recomputations = r->report.recomputations;
      EXPECT_EQ(r->report.recomputations, *recomputations);
      if (std::string(policy) == "checkmate") {
        EXPECT_EQ(r->report.recomputations, exact->report.recomputations);
      }
    }
  }
}

// checkmate-lp's repair: wherever rotor or dtr (over the same order) fits
// the budget, so does checkmate-lp, whatever its rounding found, at no
// greater makespan than theirs.
TEST(CheckmateTest, LpIsFeasibleWhereverRotorOrDtrIs) {
  int repaired = 0, compared = 0;
  for (const char* spec : {"linear:n=20", "mnist-cnn:batch=4", "random:n=60,seed=2",
                           "resnet18:batch=2,image=32"}) {
    const Graph g = *BuildModel(spec);
    const int64_t base = *BaselinePeak(g);
    for (int percent : {90, 70, 50, 30}) {
      SCOPED_TRACE(absl::StrCat(spec, " at ", percent, "%"));
      const int64_t budget = base * percent / 100;
      bool heuristic_fits = false;
      double best_makespan = std::numeric_limits<double>::infinity();
      for (const char* policy : {"rotor", "dtr"}) {
        auto r = PlanWith(g, policy, budget, 5);
        if (r.ok() && r->feasible) {
          heuristic_fits = true;
          best_makespan = std::min(best_makespan, r->report.makespan);
        }
      }
      auto lp = PlanWith(g, "checkmate-lp", budget, 5);
      ASSERT_TRUE(lp.ok()) << lp.status();
      if (heuristic_fits) {
        ++compared;
        EXPECT_TRUE(lp->feasible) << lp->message;
        EXPECT_LE(lp->report.makespan, best_makespan * (1 + 1e-9));
      }
      repaired += lp->details.contains("repaired_by");
    }
  }
  EXPECT_GE(compared, 4);
  RecordProperty("repaired", repaired);
}

// Where the MILP proves its plan optimal, checkmate-lp's plan costs at most
// 1.1 times as much (the promise; the rounding alone missed it on
// tanh-chain:length=10 at 50%, where rotor meets the optimum).
TEST(CheckmateTest, LpWithinATenthOfTheProvenOptimum) {
  int proven = 0;
  // Graphs whose optimum CBC proves within the time limit (mnist-cnn's it
  // does not, at any of these budgets, in 20 s).
  for (const char* spec : {"linear:n=12", "tanh-chain:length=10,size=1000", "conv3d:n=16"}) {
    const Graph g = *BuildModel(spec);
    const int64_t base = *BaselinePeak(g);
    for (int percent : {90, 70, 50}) {
      SCOPED_TRACE(absl::StrCat(spec, " at ", percent, "%"));
      const int64_t budget = base * percent / 100;
      auto milp = PlanWith(g, "checkmate", budget, 20);
      if (!milp.ok() || !milp->feasible || milp->details.value("optimal", false) != true) {
        continue;
      }
      ++proven;
      auto lp = PlanWith(g, "checkmate-lp", budget, 20);
      ASSERT_TRUE(lp.ok()) << lp.status();
      EXPECT_TRUE(lp->feasible) << lp->message;
      EXPECT_LE(lp->report.compute_cost, 1.1 * milp->report.compute_cost);
    }
  }
  EXPECT_GE(proven, 5);
}

}  // namespace
}  // namespace pebble
