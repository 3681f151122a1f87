// Collectives across ranks (docs/semantics.md, "Collectives across ranks"):
// the all_reduce step's rules and time in the simulator, and the planners'
// placement of the gradients' all-reduces (scheduler/collectives.h).
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "gtest/gtest.h"
#include "scheduler/collectives.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "test_util.h"

namespace pebble {
namespace {

using ::pebble::testing::MakeSchedule;
using ::testing::HasSubstr;

// w a parameter; its gradient grad:w (100 bytes, 2 units) is read by the
// backward's r (3 units) and by the update w1, in place; y (4 units) reads
// x only, so it may overlap a collective.
constexpr char kStep[] = R"({"format": "pebble-graph", "version": 1, "name": "dp-step",
  "nodes": [
    {"id": "x", "bytes": 10, "persistent": true, "role": "input"},
    {"id": "w", "bytes": 100, "persistent": true, "role": "parameter"},
    {"id": "grad:w", "bytes": 100, "cost": 2, "inputs": ["x"], "role": "backward"},
    {"id": "r", "bytes": 5, "cost": 3, "inputs": ["grad:w"], "role": "backward"},
    {"id": "w1", "bytes": 100, "cost": 1, "inputs": ["w", "grad:w"], "alias_of": "w",
     "in_place": true, "role": "update"},
    {"id": "y", "bytes": 20, "cost": 4, "inputs": ["x"]}
  ],
  "outputs": ["r", "y"]})";

Graph StepGraph() {
  absl::StatusOr<Graph> g = ParseGraphJson(kStep);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

constexpr Action kC = Action::kCompute, kF = Action::kFree, kO = Action::kOffload,
                 kA = Action::kAllReduce;

// 4 ranks on a link of 100 bytes/s and 0.5 s a message: an all-reduce of
// 100 bytes takes 2 * 3 * 0.5 + 2 * 3 / 4 * 100 / 100 = 4.5 s.
SimulatorOptions FourRanks() {
  SimulatorOptions o;
  o.ranks = 4;
  o.network = {100, 0.5};
  return o;
}

TEST(CollectivesTest, ActionIsReadAndWritten) {
  const Graph g = StepGraph();
  EXPECT_EQ(ActionName(kA), "all_reduce");
  EXPECT_EQ(*ParseAction("all_reduce"), kA);
  const Schedule s = MakeSchedule(g, {{kC, "grad:w"}, {kA, "grad:w"}});
  EXPECT_EQ(ScheduleToJson(g, s)["steps"][1]["action"], "all_reduce");
  absl::StatusOr<Schedule> back = ScheduleFromJson(g, ScheduleToJson(g, s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
  EXPECT_THAT(ParseAction("allreduce").status().message(), HasSubstr("all_reduce)"));
}

TEST(CollectivesTest, AllReduceSecondsFollowsTheRing) {
  EXPECT_EQ(AllReduceSeconds(1000, 1, {100, 0.5}), 0);
  EXPECT_DOUBLE_EQ(AllReduceSeconds(100, 4, {100, 0.5}), 4.5);
  EXPECT_DOUBLE_EQ(AllReduceSeconds(800, 2, {100, 0}), 8);  // each rank sends half, twice
}

TEST(CollectivesTest, OverlapsComputeAndDelaysItsReaders) {
  const Graph g = StepGraph();
  const Schedule s = MakeSchedule(g, {{kC, "grad:w"}, {kC, "r"}, {kA, "grad:w"}, {kC, "y"},
                               {kC, "w1"}, {kF, "grad:w"}});
  absl::StatusOr<PlanReport> r = Simulate(g, s, FourRanks());
  ASSERT_TRUE(r.ok()) << r.status();
  // grad:w 0-2, r 2-5; the all-reduce follows r (issued after it): 5-9.5,
  // while y runs 5-9; the update waits for the sum: 9.5-10.5; the free
  // after it.
  EXPECT_DOUBLE_EQ(r->timeline[2].start, 5);
  EXPECT_DOUBLE_EQ(r->timeline[2].end, 9.5);
  EXPECT_DOUBLE_EQ(r->timeline[3].end, 9);
  EXPECT_DOUBLE_EQ(r->timeline[4].start, 9.5);
  EXPECT_DOUBLE_EQ(r->makespan, 10.5);
  EXPECT_EQ(r->collectives, 1);
  EXPECT_EQ(r->collective_bytes, 100);
  EXPECT_DOUBLE_EQ(r->network_busy, 4.5);
  EXPECT_DOUBLE_EQ(r->exposed_transfer_time, 10.5 - 10);
  // Memory: the all-reduce is in place.
  EXPECT_EQ(r->timeline[2].device_bytes, r->timeline[1].device_bytes);
  nlohmann::json j = ReportToJson(*r, g, s, false);
  EXPECT_EQ(j["collectives"], 1);
  EXPECT_EQ(j["collective_bytes"], 100);

  // One rank: the same schedule, no network time.
  absl::StatusOr<PlanReport> one = Simulate(g, s);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_DOUBLE_EQ(one->makespan, 10);
  // Without collectives the report has no such keys.
  const Schedule plain = MakeSchedule(g, {{kC, "grad:w"}, {kC, "r"}, {kC, "y"}, {kC, "w1"}});
  EXPECT_FALSE(ReportToJson(*Simulate(g, plain), g, plain, false).contains("collectives"));
}

TEST(CollectivesTest, AFreeWaitsForTheSum) {
  const Graph g = StepGraph();
  absl::StatusOr<PlanReport> r = Simulate(
      g, MakeSchedule(g, {{kC, "grad:w"}, {kC, "r"}, {kC, "w1"}, {kA, "grad:w"}, {kF, "grad:w"},
                   {kC, "y"}}), FourRanks());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->timeline[3].end, 6 + 4.5);
  EXPECT_DOUBLE_EQ(r->timeline[4].end, 10.5);  // the free takes effect then
  EXPECT_DOUBLE_EQ(r->timeline[5].start, 10.5);  // and y, a compute, after the free
}

TEST(CollectivesTest, RulesAreChecked) {
  const Graph g = StepGraph();
  auto error = [&](std::vector<std::pair<Action, std::string>> steps) {
    absl::StatusOr<PlanReport> r = Simulate(g, MakeSchedule(g, std::move(steps)), FourRanks());
    return r.ok() ? std::string("valid") : std::string(r.status().message());
  };
  EXPECT_THAT(error({{kA, "grad:w"}}), HasSubstr("step 0 (all_reduce 'grad:w'): the node is "
                                                 "not resident"));
  EXPECT_THAT(error({{kA, "x"}}), HasSubstr("the node is persistent"));
  EXPECT_THAT(error({{kC, "grad:w"}, {kA, "grad:w"}, {kA, "grad:w"}}),
              HasSubstr("summed over the ranks already, by all_reduce 'grad:w'"));
  // The backward reads the rank's own gradient.
  EXPECT_THAT(error({{kC, "grad:w"}, {kA, "grad:w"}, {kC, "r"}}),
              HasSubstr("step 2 (compute 'r'): input 'grad:w' was summed over the ranks"));
  // An update reads the sum; a gradient computed again is the rank's own,
  // and may be reduced again.
  EXPECT_EQ(error({{kC, "grad:w"}, {kA, "grad:w"}, {kC, "w1"}, {kC, "y"}, {kF, "grad:w"},
                   {kC, "grad:w"}, {kC, "r"}, {kA, "grad:w"}}),
            "valid");
}

TEST(CollectivesTest, AnEarlierHostCopyGoesStale) {
  const Graph g = StepGraph();
  SimulatorOptions o = FourRanks();
  o.host_bandwidth_bytes_per_s = 10;  // the offload of grad:w takes 10: 2-12
  absl::StatusOr<PlanReport> r = Simulate(
      g, MakeSchedule(g, {{kC, "grad:w"}, {kO, "grad:w"}, {kC, "r"}, {kA, "grad:w"}, {kC, "w1"},
                   {kC, "y"}}), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->timeline[1].host_bytes, 100);
  EXPECT_EQ(r->timeline[3].host_bytes, 0);
  // It waits for the offload, which reads its storage, past r's end (5).
  EXPECT_DOUBLE_EQ(r->timeline[1].end, 12);
  EXPECT_DOUBLE_EQ(r->timeline[3].start, 12);
}

TEST(CollectivesTest, OptionsAreChecked) {
  const Graph g = StepGraph();
  const Schedule s = MakeSchedule(g, {{kC, "y"}});
  SimulatorOptions o;
  o.ranks = 0;
  EXPECT_THAT(Simulate(g, s, o).status().message(), HasSubstr("ranks must be at least 1"));
  o.ranks = 2;
  o.network.bandwidth_bytes_per_s = 0;
  EXPECT_THAT(Simulate(g, s, o).status().message(), HasSubstr("network's bandwidth"));
  o.network = {1e9, -1};
  EXPECT_THAT(Simulate(g, s, o).status().message(), HasSubstr("latency non-negative"));
}

TEST(CollectivesTest, ReduceGradientsPlacesAfterTheBackwardsLastRead) {
  const Graph g = StepGraph();
  EXPECT_EQ(GradientsToReduce(g), std::vector<NodeId>{g.Find("grad:w")});
  absl::StatusOr<Schedule> s =
      ReduceGradients(g, MakeSchedule(g, {{kC, "grad:w"}, {kC, "y"}, {kC, "r"}, {kC, "w1"}}));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, MakeSchedule(g, {{kC, "grad:w"}, {kC, "y"}, {kC, "r"}, {kA, "grad:w"}, {kC, "w1"}}));
  // Read by the backward after its update: no place is right.
  absl::StatusOr<Schedule> bad =
      ReduceGradients(g, MakeSchedule(g, {{kC, "grad:w"}, {kC, "w1"}, {kC, "r"}, {kC, "y"}}));
  EXPECT_THAT(bad.status().message(),
              HasSubstr("gradient 'grad:w' is read by 'r' (step 2) after the schedule"));
  EXPECT_THAT(ReduceGradients(g, MakeSchedule(g, {{kC, "y"}})).status().message(),
              HasSubstr("never computed"));
}

// Every policy, on training graphs with and without an optimizer (the
// transformer's tied embedding sums two gradients into one), at 2 and 4
// ranks: one all-reduce per gradient, after every read of the backward
// and before every update that reads it (the simulator checks both), the
// same memory as the one-rank plan, and no less time.
TEST(CollectivesTest, EveryPolicyReducesEachGradientOnce) {
  const std::vector<std::string> models = {
      "mnist-cnn:batch=4", "transformer:layers=2,seq=16,dim=32,heads=2,vocab=50",
      "transformer:layers=2,seq=16,dim=32,heads=2,vocab=50,optimizer=adam",
      "resnet18:batch=2,image=32,optimizer=sgd,gradients=drop",
      "mnist-cnn:batch=4,optimizer=adam,updates=host"};
  for (const std::string& model : models) {
    absl::StatusOr<Graph> g = BuildModel(model);
    ASSERT_TRUE(g.ok()) << model << ": " << g.status();
    const size_t gradients = GradientsToReduce(*g).size();
    ASSERT_GT(gradients, 2u) << model;
    for (const char* policy : {"baseline", "rotor", "dtr", "swap", "hybrid"}) {
      auto planner = MakePlanner(policy);
      ASSERT_TRUE(planner.ok());
      PlannerOptions options;
      options.budget_bytes = kMinBudgetBytes;
      options.time_limit_s = 10;
      absl::StatusOr<PlanResult> single = (*planner)->Plan(*g, options);
      ASSERT_TRUE(single.ok()) << model << " " << policy << ": " << single.status();
      for (int ranks : {2, 4}) {
        SCOPED_TRACE(absl::StrCat(model, " ", policy, " ranks ", ranks));
        options.ranks = ranks;
        options.network = {1e9, 5e-6};
        absl::StatusOr<PlanResult> dp = (*planner)->Plan(*g, options);
        ASSERT_TRUE(dp.ok()) << dp.status();
        EXPECT_EQ(dp->report.collectives, static_cast<int64_t>(gradients));
        EXPECT_EQ(dp->details["collectives"]["all_reduce"], gradients);
        EXPECT_EQ(dp->report.peak_bytes, single->report.peak_bytes);
        EXPECT_GE(dp->report.makespan, single->report.makespan);
        EXPECT_GT(dp->report.network_busy, 0);
        int reduces = 0;
        for (const Step& step : dp->schedule.steps) reduces += step.action == kA;
        EXPECT_EQ(reduces, static_cast<int>(gradients));
        // Its figures are the simulator's for the schedule it returns.
        SimulatorOptions sim;
        sim.ranks = ranks;
        sim.network = options.network;
        absl::StatusOr<PlanReport> again = Simulate(*g, dp->schedule, sim);
        ASSERT_TRUE(again.ok()) << again.status();
        EXPECT_DOUBLE_EQ(again->makespan, dp->report.makespan);
      }
    }
  }
}

}  // namespace
}  // namespace pebble
