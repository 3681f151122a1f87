// The simulator against hand-traced schedules (SPEC sections 2 and 4).
#include "scheduler/simulator.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/planner.h"
#include "tests/test_util.h"

namespace pebble {
namespace {

using ::pebble::testing::MakeGraph;
using ::pebble::testing::MakeSchedule;
using ::pebble::testing::Node;
using ::pebble::testing::Persistent;
using ::testing::HasSubstr;

constexpr Action kC = Action::kCompute;
constexpr Action kF = Action::kFree;
constexpr Action kO = Action::kOffload;
constexpr Action kP = Action::kPrefetch;

// x (persistent, 10 B) -> a (100 B, cost 1) -> b (100 B, cost 2) -> c (50 B,
// cost 1); output c.
Graph Chain() {
  return MakeGraph({Persistent("x", 10), Node("a", 100, {"x"}, 1),
                    Node("b", 100, {"a"}, 2), Node("c", 50, {"b"}, 1)},
                   {"c"});
}

// Simulator options with a host link of `bytes_per_s`, the rest default.
SimulatorOptions HostLink(double bytes_per_s) {
  SimulatorOptions o;
  o.host_bandwidth_bytes_per_s = bytes_per_s;
  return o;
}

TEST(SimulatorTest, FreeAtLastUseOnAChain) {
  Graph g = Chain();
  auto schedule = FreeAtLastUse(g, DefaultOrder(g));
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  // compute a, compute b, free a, compute c, free b.
  EXPECT_EQ(*schedule, MakeSchedule(g, {{kC, "a"}, {kC, "b"}, {kF, "a"},
                                        {kC, "c"}, {kF, "b"}}));
  auto r = Simulate(g, *schedule);
  ASSERT_TRUE(r.ok()) << r.status();
  // Memory: 10 | a 110 | b 210 | free a 110 | c 160 | free b 60.
  EXPECT_EQ(r->initial_bytes, 10);
  EXPECT_EQ(r->peak_bytes, 210);
  EXPECT_EQ(r->peak_step, 1);
  EXPECT_EQ(r->timeline.back().device_bytes, 60);
  // Time: a 0-1, b 1-3, free a at 3 (end of b, its reader), c 3-4, free b 4.
  EXPECT_DOUBLE_EQ(r->timeline[2].start, 3);
  EXPECT_DOUBLE_EQ(r->timeline[3].start, 3);
  EXPECT_DOUBLE_EQ(r->makespan, 4);
  EXPECT_DOUBLE_EQ(r->compute_cost, 4);
  EXPECT_DOUBLE_EQ(r->base_cost, 4);
  EXPECT_DOUBLE_EQ(r->overhead, 0);
  EXPECT_EQ(r->recomputations, 0);
  EXPECT_TRUE(r->one_shot);
  EXPECT_EQ(r->transfer_bytes, 0);
  EXPECT_EQ(r->host_peak_bytes, 0);
  EXPECT_DOUBLE_EQ(r->exposed_transfer_time, 0);
}

TEST(SimulatorTest, WorkspaceCountsOnlyDuringItsCompute) {
  Graph g = MakeGraph({Node("a", 100, {}, 1, /*workspace=*/1000),
                       Node("b", 10, {"a"}, 1)},
                      {"b"});
  auto r = Simulate(g, MakeSchedule(g, {{kC, "a"}, {kC, "b"}, {kF, "a"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  // During a: 100 + 1000 workspace; after: 100; during b: 110.
  EXPECT_EQ(r->peak_bytes, 1100);
  EXPECT_EQ(r->peak_step, 0);
  EXPECT_EQ(r->timeline[0].device_bytes, 100);
  EXPECT_EQ(r->timeline[1].peak_bytes, 110);
}

TEST(SimulatorTest, RecomputationIsCountedInCostNotInBase) {
  Graph g = Chain();
  // Compute a, b; drop a; recompute a; c reads only b, a is kept as extra.
  auto r = Simulate(g, MakeSchedule(g, {{kC, "a"}, {kC, "b"}, {kF, "a"},
                                        {kC, "a"}, {kC, "c"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->compute_cost, 5);
  EXPECT_DOUBLE_EQ(r->base_cost, 4);
  EXPECT_DOUBLE_EQ(r->overhead, 0.25);
  EXPECT_EQ(r->recomputations, 1);
  EXPECT_FALSE(r->one_shot);
  // The recompute of a waits for the free of a (R_k = 3): 3-4, then c 4-5.
  EXPECT_DOUBLE_EQ(r->timeline[3].start, 3);
  EXPECT_DOUBLE_EQ(r->makespan, 5);
}

// x (persistent, 0 B); a (100 B, cost 1) and b (100 B, cost 4) read x;
// c (10 B, cost 1) reads a and b, as a backward node reads a saved
// activation.
Graph SavedActivation() {
  return MakeGraph({Persistent("x", 0), Node("a", 100, {"x"}, 1), Node("b", 100, {"x"}, 4),
                    Node("c", 10, {"a", "b"}, 1)},
                   {"c"});
}

// SavedActivation's a offloaded while b computes, and prefetched for c.
Schedule OffloadedWhileBComputes(const Graph& g) {
  return MakeSchedule(g, {{kC, "a"}, {kO, "a"}, {kF, "a"}, {kC, "b"}, {kP, "a"}, {kC, "c"}});
}

// Bandwidth 50 B per time unit: a copy of a takes 2.
TEST(SimulatorTest, OffloadAndPrefetchFollowTheTimeModel) {
  Graph g = SavedActivation();
  Schedule s = OffloadedWhileBComputes(g);
  auto r = Simulate(g, s, HostLink(50));
  ASSERT_TRUE(r.ok()) << r.status();
  // Step      start end  device host
  // compute a   0    1    100    0
  // offload a   1    3    100    100   (waits for ready(a) = 1)
  // free a      3    3    0      100   (waits for the offload's end)
  // compute b   3    7    100    100   (R_k = 3: the free's end)
  // prefetch a  3    5    200    100   (copy stream free at 3, R_k = 3)
  // compute c   7    8    210    100   (b ready at 7, a at 5)
  const double starts[] = {0, 1, 3, 3, 3, 7};
  const double ends[] = {1, 3, 3, 7, 5, 8};
  const int64_t device[] = {100, 100, 0, 100, 200, 210};
  for (int k = 0; k < 6; ++k) {
    EXPECT_DOUBLE_EQ(r->timeline[k].start, starts[k]) << "step " << k;
    EXPECT_DOUBLE_EQ(r->timeline[k].end, ends[k]) << "step " << k;
    EXPECT_EQ(r->timeline[k].device_bytes, device[k]) << "step " << k;
  }
  EXPECT_EQ(r->peak_bytes, 210);
  EXPECT_EQ(r->transfer_bytes, 200);
  EXPECT_EQ(r->host_peak_bytes, 100);
  EXPECT_DOUBLE_EQ(r->makespan, 8);
  EXPECT_DOUBLE_EQ(r->compute_busy, 6);
  EXPECT_DOUBLE_EQ(r->copy_busy, 4);
  // Compute alone would take 6; the offload delays b by 2 (the free waits).
  EXPECT_DOUBLE_EQ(r->exposed_transfer_time, 2);
}

// Without the timeline (a candidate only compared): the same figures.
TEST(SimulatorTest, TheFiguresDoNotDependOnRecordingTheTimeline) {
  const Graph g = SavedActivation();
  const Schedule s = OffloadedWhileBComputes(g);
  SimulatorOptions options = HostLink(50);
  auto with = Simulate(g, s, options);
  options.record_timeline = false;
  auto without = Simulate(g, s, options);
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(with->timeline.size(), s.steps.size());
  EXPECT_TRUE(without->timeline.empty());
  EXPECT_EQ(ReportToJson(*with, g, s, false).dump(), ReportToJson(*without, g, s, false).dump());
}

// A prefetch waits for memory freed earlier in the schedule (R_k), and the
// compute that reads it waits for the prefetch.
TEST(SimulatorTest, PrefetchWaitsForEarlierFrees) {
  Graph g = MakeGraph({Node("a", 100, {}, 1), Node("b", 10, {"a"}, 4),
                       Node("c", 10, {"b"}, 1), Node("d", 10, {"a", "c"}, 1)},
                      {"d"});
  Schedule s = MakeSchedule(g, {{kC, "a"}, {kO, "a"}, {kC, "b"}, {kF, "a"},
                                {kC, "c"}, {kP, "a"}, {kC, "d"}});
  auto r = Simulate(g, s, HostLink(50));
  ASSERT_TRUE(r.ok()) << r.status();
  // compute a 0-1; offload a 1-3; compute b 1-5; free a at 5 (b read it);
  // compute c 5-6 (R_k = 5); prefetch a 5-7 (R_k = 5 > copy end 3);
  // compute d 7-8 (waits for a).
  EXPECT_DOUBLE_EQ(r->timeline[3].start, 5);
  EXPECT_DOUBLE_EQ(r->timeline[4].start, 5);
  EXPECT_DOUBLE_EQ(r->timeline[5].start, 5);
  EXPECT_DOUBLE_EQ(r->timeline[5].end, 7);
  EXPECT_DOUBLE_EQ(r->timeline[6].start, 7);
  EXPECT_DOUBLE_EQ(r->makespan, 8);
  EXPECT_EQ(r->peak_bytes, 130);  // during compute d: a, b, c and d
}

TEST(SimulatorTest, RepeatedInputCountsOnce) {
  Graph g = MakeGraph({Node("a", 100), Node("sq", 100, {"a", "a"})}, {"sq"});
  auto schedule = FreeAtLastUse(g, DefaultOrder(g));
  ASSERT_TRUE(schedule.ok());
  EXPECT_EQ(schedule->steps.size(), 3u);  // compute a, compute sq, free a
  auto r = Simulate(g, *schedule);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peak_bytes, 200);
}

TEST(SimulatorTest, EmptyScheduleOfPersistentOutput) {
  Graph g = MakeGraph({Persistent("w", 7)}, {"w"});
  auto r = Simulate(g, Schedule{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peak_bytes, 7);
  EXPECT_EQ(r->peak_step, -1);
  EXPECT_DOUBLE_EQ(r->makespan, 0);
}

struct BadCase {
  const char* name;
  std::vector<std::pair<Action, std::string>> steps;
  const char* message;
};

TEST(SimulatorTest, RejectsEveryBrokenPrecondition) {
  Graph g = Chain();
  const BadCase cases[] = {
      {"missing input", {{kC, "b"}}, "step 0 (compute 'b'): input 'a' is not resident"},
      {"compute persistent", {{kC, "x"}}, "step 0 (compute 'x'): the node is persistent"},
      {"compute twice", {{kC, "a"}, {kC, "a"}}, "step 1 (compute 'a'): the node is already resident"},
      {"free absent", {{kF, "a"}}, "step 0 (free 'a'): the node is not resident"},
      {"free persistent", {{kF, "x"}}, "step 0 (free 'x'): the node is persistent"},
      {"offload absent", {{kO, "a"}}, "step 0 (offload 'a'): the node is not resident"},
      {"offload persistent", {{kO, "x"}}, "step 0 (offload 'x'): the node is persistent"},
      {"prefetch without copy", {{kC, "a"}, {kF, "a"}, {kP, "a"}},
       "step 2 (prefetch 'a'): the node has no host copy"},
      {"prefetch resident", {{kC, "a"}, {kO, "a"}, {kP, "a"}},
       "step 2 (prefetch 'a'): the node is already resident"},
      {"output missing", {{kC, "a"}, {kC, "b"}, {kC, "c"}, {kF, "c"}},
       "output 'c' is not resident at the end"},
  };
  for (const BadCase& c : cases) {
    auto r = Simulate(g, MakeSchedule(g, c.steps));
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message)) << c.name;
  }
}

TEST(SimulatorTest, RejectsNonPositiveBandwidth) {
  Graph g = Chain();
  EXPECT_FALSE(Simulate(g, Schedule{}, HostLink(0)).ok());
}

TEST(ScheduleTest, FreeAtLastUseRejectsBadOrders) {
  Graph g = Chain();
  const NodeId x = g.Find("x"), a = g.Find("a"), b = g.Find("b"), c = g.Find("c");
  EXPECT_THAT(std::string(FreeAtLastUse(g, {b, a, c}).status().message()),
              HasSubstr("'b' comes before its input 'a'"));
  EXPECT_THAT(std::string(FreeAtLastUse(g, {a, b}).status().message()),
              HasSubstr("'c' is missing"));
  EXPECT_THAT(std::string(FreeAtLastUse(g, {a, a, b, c}).status().message()),
              HasSubstr("'a' appears twice"));
  EXPECT_THAT(std::string(FreeAtLastUse(g, {x, a, b, c}).status().message()),
              HasSubstr("'x' is persistent"));
}

TEST(ScheduleTest, UnneededNodesAreLeftOut) {
  // d is not an output and nothing needed reads it.
  Graph g = MakeGraph({Node("a", 1), Node("b", 1, {"a"}), Node("d", 1, {"a"})}, {"b"});
  EXPECT_EQ(DefaultOrder(g), (std::vector<NodeId>{g.Find("a"), g.Find("b")}));
  EXPECT_FALSE(FreeAtLastUse(g, {g.Find("a"), g.Find("d"), g.Find("b")}).ok());
}

TEST(ScheduleTest, JsonRoundTripAndErrors) {
  Graph g = Chain();
  Schedule s = MakeSchedule(g, {{kC, "a"}, {kO, "a"}, {kF, "a"}, {kP, "a"}});
  nlohmann::json j = ScheduleToJson(g, s);
  EXPECT_EQ(j["format"], "pebble-schedule");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["steps"][1]["action"], "offload");
  auto back = ScheduleFromJson(g, j);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);

  nlohmann::json bad = j;
  bad["steps"][2]["node"] = "nope";
  EXPECT_THAT(std::string(ScheduleFromJson(g, bad).status().message()),
              HasSubstr("step 2: unknown node 'nope'"));
  bad = j;
  bad["steps"][0]["action"] = "swap";
  EXPECT_THAT(std::string(ScheduleFromJson(g, bad).status().message()),
              HasSubstr("unknown action 'swap'"));
  bad = j;
  bad["version"] = 2;
  EXPECT_FALSE(ScheduleFromJson(g, bad).ok());
  bad = j;
  bad["format"] = "pebble-graph";
  EXPECT_FALSE(ScheduleFromJson(g, bad).ok());
}

// Baseline plans of seeded random DAGs: valid, one-shot, and bounded by
// simple arguments (every compute holds its inputs and output).
TEST(SimulatorTest, BaselineOnRandomDagsIsValidAndBounded) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Graph g = testing::RandomDag(5 + static_cast<int>(seed % 40), seed);
    auto schedule = FreeAtLastUse(g, DefaultOrder(g));
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    auto r = Simulate(g, *schedule);
    ASSERT_TRUE(r.ok()) << "seed " << seed << ": " << r.status();
    EXPECT_TRUE(r->one_shot);
    EXPECT_DOUBLE_EQ(r->compute_cost, r->base_cost);
    int64_t total = 0, lower = 0;
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      total += g.bytes(v) + g.workspace(v);
      if (g.persistent(v)) continue;
      int64_t need = g.persistent_bytes() + g.bytes(v) + g.workspace(v);
      for (NodeId u : g.unique_inputs(v)) {
        if (!g.persistent(u)) need += g.bytes(u);
      }
      lower = std::max(lower, need);
    }
    EXPECT_GE(r->peak_bytes, lower) << "seed " << seed;
    EXPECT_LE(r->peak_bytes, total) << "seed " << seed;
    EXPECT_DOUBLE_EQ(r->makespan, r->compute_cost) << "seed " << seed;
  }
}

TEST(PlannerTest, RegistryAndBaselinePolicy) {
  EXPECT_NE(PlannerRegistry::Global().Find("baseline"), nullptr);
  auto unknown = MakePlanner("nope");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("baseline"));

  Graph g = Chain();
  auto planner = MakePlanner("baseline");
  ASSERT_TRUE(planner.ok());
  PlannerOptions options;
  options.budget_bytes = 210;
  auto fits = (*planner)->Plan(g, options);
  ASSERT_TRUE(fits.ok());
  EXPECT_TRUE(fits->feasible);
  EXPECT_EQ(fits->report.peak_bytes, 210);
  options.budget_bytes = 209;
  auto tight = (*planner)->Plan(g, options);
  ASSERT_TRUE(tight.ok());
  EXPECT_FALSE(tight->feasible);
  EXPECT_THAT(tight->message, HasSubstr("exceeds the budget"));
  options.budget_bytes = PlannerOptions::kMinBudget;
  EXPECT_TRUE((*planner)->Plan(g, options)->feasible);
}

}  // namespace
}  // namespace pebble
