// The `plan --json` document of the library (scheduler/plan_api.h):
// PlanDocument is the whole of it, PlanDocumentReport its "report" member.
#include <string>

#include "gtest/gtest.h"
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
}  // namespace pebble
