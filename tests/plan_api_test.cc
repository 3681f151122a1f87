// The `plan --json` document of the library (scheduler/plan_api.h):
// PlanDocument is the whole of it, PlanDocumentReport its "report" member.
#include <string>

#include "gtest/gtest.h"
#include "graph/models/models.h"
#include "scheduler/plan_api.h"

namespace pebble {
namespace {

PlanOutcome PlanLinear(const Graph& graph, const std::string& budget) {
  PlanRequest request;
  request.policy = "rotor";
  request.budget = budget;
  absl::StatusOr<PlanOutcome> outcome = PlanGraph(graph, request);
  EXPECT_TRUE(outcome.ok()) << outcome.status();
  return *std::move(outcome);
}

// Whether the plan fits is the document's, at the top, for a plan that fits
// and one that does not; the report member is PlanDocumentReport's.
TEST(PlanDocumentTest, HoldsFeasibleAndTheReport) {
  const Graph graph = *BuildModel("linear:n=20");
  for (const char* budget : {"60%", "1B"}) {
    SCOPED_TRACE(budget);
    const PlanOutcome outcome = PlanLinear(graph, budget);
    const nlohmann::json doc = PlanDocument(graph, outcome, "linear:n=20",
                                            /*with_timeline=*/false, /*with_instances=*/false);
    ASSERT_TRUE(doc.contains("feasible"));
    EXPECT_EQ(doc["feasible"].get<bool>(), outcome.result.feasible);
    EXPECT_EQ(doc["feasible"].get<bool>(), std::string(budget) == "60%");
    EXPECT_EQ(doc["graph"], "linear:n=20");
    EXPECT_EQ(doc["policy"], "rotor");
    EXPECT_EQ(doc["budget_bytes"], outcome.budget_bytes);
    EXPECT_EQ(doc["report"], PlanDocumentReport(graph, outcome, /*with_timeline=*/false));
    EXPECT_EQ(doc["report"]["peak_bytes"], outcome.result.report.peak_bytes);
    EXPECT_EQ(doc["report"]["arena_bytes"], outcome.layout.arena_bytes);
    EXPECT_FALSE(doc["report"].contains("feasible"));
    EXPECT_FALSE(doc["layout"].contains("instances"));
  }
}

TEST(PlanDocumentTest, InstancesAndTimelineOnlyWhenAsked) {
  const Graph graph = *BuildModel("linear:n=20");
  const PlanOutcome outcome = PlanLinear(graph, "60%");
  const nlohmann::json plain = PlanDocument(graph, outcome, "g", false, false);
  const nlohmann::json full = PlanDocument(graph, outcome, "g", true, true);
  EXPECT_TRUE(full["layout"].contains("instances"));
  EXPECT_EQ(full["report"], PlanDocumentReport(graph, outcome, /*with_timeline=*/true));
  EXPECT_NE(full["report"], plain["report"]);  // the timeline
}

}  // namespace
// The floor figures: parameters alone, and what every plan keeps at its end
// (persistent tensors and outputs), which no plan's peak goes below. Where
// the plan does not fit, the least peak is that of the policy at "min", and
// the advice names it and a budget that admits it.
TEST(PlanDocumentTest, FloorFiguresAndTheLeastPeakWhereThePlanDoesNotFit) {
  const Graph graph = *BuildModel("resnet18:batch=2,image=32");
  int64_t parameters = 0, persistent = 0, gradients = 0, loss = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.role(v) == Role::kParameter) parameters += graph.bytes(v);
    if (graph.persistent(v)) persistent += graph.bytes(v);
  }
  for (NodeId v : graph.outputs()) {
    (graph.role(v) == Role::kBackward ? gradients : loss) += graph.bytes(v);
  }
  EXPECT_EQ(ParameterBytes(graph), parameters);
  EXPECT_EQ(gradients, parameters);  // every parameter gets a gradient
  EXPECT_EQ(EndStateBytes(graph), persistent + gradients + loss);

  PlanRequest request;
  request.policy = "rotor";
  request.budget = "min";
  const absl::StatusOr<PlanOutcome> least = PlanGraph(graph, request);
  ASSERT_TRUE(least.ok()) << least.status();
  EXPECT_FALSE(least->least_peak_bytes.has_value());  // a plan at min fits
  EXPECT_GE(least->result.report.peak_bytes, EndStateBytes(graph));
  request.budget = "10%";
  const absl::StatusOr<PlanOutcome> tight = PlanGraph(graph, request);
  ASSERT_TRUE(tight.ok()) << tight.status();
  ASSERT_FALSE(tight->result.feasible);
  EXPECT_EQ(tight->least_peak_bytes, least->result.report.peak_bytes);
  EXPECT_NE(tight->advice.find("rotor reaches"), std::string::npos) << tight->advice;
  const nlohmann::json doc = PlanDocument(graph, *tight, "g", false, false);
  EXPECT_EQ(doc["least_peak_bytes"], least->result.report.peak_bytes);
  EXPECT_EQ(doc["least_peak_cut_short"], false);  // rotor's search has no time limit
  EXPECT_EQ(doc["parameter_bytes"], parameters);
  EXPECT_EQ(doc["advice"], tight->advice);
}

// A least peak that the time limit cut short (checkmate given no time) is
// not called the least: a longer limit may find less.
TEST(PlanDocumentTest, ALeastPeakCutShortByTheTimeLimitIsNotCalledTheLeast) {
  const Graph graph = *BuildModel("conv3d:n=32");
  PlanRequest request;
  request.policy = "checkmate";
  request.budget = "95%";
  request.options.time_limit_s = 1e-9;
  const absl::StatusOr<PlanOutcome> cut = PlanGraph(graph, request);
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_FALSE(cut->result.feasible);
  EXPECT_TRUE(cut->least_peak_cut_short);
  EXPECT_NE(cut->advice.find("in its time limit: try --budget 100%, --budget min or a longer "
                             "--time-limit"),
            std::string::npos)
      << cut->advice;
  EXPECT_EQ(cut->advice.find("at least"), std::string::npos) << cut->advice;
  EXPECT_EQ(PlanDocument(graph, *cut, "g", false, false)["least_peak_cut_short"], true);
  // With time to search, the same budget plans: the cut-short figure was no least.
  request.options.time_limit_s = 30;
  const absl::StatusOr<PlanOutcome> searched = PlanGraph(graph, request);
  ASSERT_TRUE(searched.ok()) << searched.status();
  EXPECT_TRUE(searched->result.feasible) << searched->result.message;
}

TEST(PlanDocumentTest, LeastPeakAdviceRoundsUpAndNamesTheFloorWhereItDominates) {
  EXPECT_EQ(LeastPeakAdvice("rotor", 720, 1000),
            "rotor reaches 720 B (72%) at least: try --budget 72% or --budget min");
  EXPECT_EQ(LeastPeakAdvice("dtr", 721, 1000, 100),
            "dtr reaches 721 B (73%) at least: try --budget 73% or --budget min");
  EXPECT_NE(LeastPeakAdvice("dtr", 721, 1000, 400).find("400 B of it are"), std::string::npos);
  EXPECT_EQ(LeastPeakAdvice("checkmate", 720, 1000, 0, false, /*cut_short=*/true),
            "checkmate reaches 720 B (72%) in its time limit: try --budget 72%, --budget min or "
            "a longer --time-limit");
  // A budget that rounds as the least peak does is given in bytes, both.
  EXPECT_EQ(DoesNotFitAdvice("hybrid", 13000000, 13000123, 13500000, 0, ""),
            "the plan does not fit 12.4 MiB (13000000 bytes): hybrid reaches 12.4 MiB "
            "(13000123 bytes, 97%) at least: try --budget 97% or --budget min");
  EXPECT_EQ(DoesNotFitAdvice("rotor", 700, 720, 1000, 0, ""),
            "the plan does not fit 700 B: rotor reaches 720 B (72%) at least: try --budget 72% "
            "or --budget min");
}

}  // namespace pebble
