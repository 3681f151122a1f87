// The library's fit search (scheduler/plan_api.h): what it plans and
// probes, its progress reports and its time limit.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/workspace.h"
#include "scheduler/checkmate.h"
#include "scheduler/external_policy.h"
#include "scheduler/schedule.h"
#include "graph/models/models.h"
#include "scheduler/plan_api.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

FitRequest Conv3dRequest(int64_t budget_bytes) {
  FitRequest request;
  request.model = *ParseModelSpec("conv3d");
  request.vary = "n";
  request.budget_bytes = budget_bytes;
  request.jobs = 1;
  return request;
}

// The search prepares (probes) only values whose bound fits the budget, and
// reports every value it tries; the answer is the largest value that fits
// with the prepared graph.
TEST(FitTest, PreparesOnlyWhatCanFitAndReportsEveryTry) {
  constexpr int64_t kBudget = 64 << 20;
  FitRequest request = Conv3dRequest(kBudget);
  request.policies = {"baseline", "rotor"};
  std::mutex mu;
  std::vector<int64_t> prepared_bounds;
  std::vector<FitTry> tries;
  // A stand-in for a backend's workspace: 1 MiB per computed node.
  request.prepare_graph = [&](const Graph& g) -> absl::StatusOr<Graph> {
    {
      std::lock_guard<std::mutex> lock(mu);
      prepared_bounds.push_back(PeakLowerBound(g));
    }
    GraphBuilder b(g.name());
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      NodeSpec spec = SpecOf(g, v);
      if (!spec.persistent) spec.workspace = 1 << 20;
      b.AddNode(std::move(spec));
    }
    for (NodeId v : g.outputs()) b.AddOutput(g.id(v));
    return b.Build();
  };
  request.on_try = [&](const FitTry& t) {
    std::lock_guard<std::mutex> lock(mu);
    tries.push_back(t);
  };
  auto fit = Fit(request);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_FALSE(prepared_bounds.empty());
  for (int64_t bound : prepared_bounds) EXPECT_LE(bound, kBudget);
  // Values past the budget were tried (the exponential search overshoots)
  // but never prepared.
  int bounded = 0;
  for (const FitTry& t : tries) {
    if (t.outcome == FitTry::Outcome::kBelowBound) {
      ++bounded;
      EXPECT_GT(t.peak_bytes, kBudget);
    }
  }
  EXPECT_GT(bounded, 0);
  int tries_in_rows = 0;
  for (const FitRow& row : fit->rows) {
    SCOPED_TRACE(row.policy);
    ASSERT_TRUE(row.value.has_value()) << row.note;
    EXPECT_FALSE(row.time_limit_reached);
    tries_in_rows += row.tries;
    // The kept plan is of the prepared graph at the answer.
    ASSERT_TRUE(row.graph.has_value());
    EXPECT_EQ(row.graph->workspace(row.graph->Find("conv1")), 1 << 20);
    EXPECT_TRUE(row.plan->feasible);
    EXPECT_LE(row.plan->report.peak_bytes, kBudget);
    // One more does not fit with the workspace.
    ModelSpec next = request.model;
    next.params["n"] = std::to_string(*row.value + 1);
    auto g = BuildModel(next, request.cost);
    ASSERT_TRUE(g.ok());
    auto prepared = request.prepare_graph(*g);
    ASSERT_TRUE(prepared.ok());
    auto planner = MakePlanner(row.policy);
    ASSERT_TRUE(planner.ok());
    PlannerOptions o;
    o.budget_bytes = kBudget;
    auto plan = (*planner)->Plan(*prepared, o);
    ASSERT_TRUE(plan.ok());
    EXPECT_FALSE(plan->feasible);
  }
  EXPECT_EQ(tries_in_rows, static_cast<int>(tries.size()));
}

// A CPU backend's workspace probe of operands far larger than memory would
// hold maps them but touches (almost) none of them: it runs no arithmetic.
TEST(FitTest, WorkspaceProbeOfHugeOperandsTouchesNothing) {
  auto g = BuildModel("conv3d:n=320");  // 8 x 320^3 fp32 activations: 1 GiB each
  ASSERT_TRUE(g.ok()) << g.status();
  auto backend = MakeCpuBackend();
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  WorkspaceQueryStats stats;
  auto planned = WithBackendWorkspace(*g, *backend, &stats);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_GT(stats.raised, 0);
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  const int64_t grown_kib = after.ru_maxrss - before.ru_maxrss;
  EXPECT_LT(grown_kib, 128 << 10) << "the probe touched its operands";
}

// An outside policy that takes `seconds` per plan (the graph's own order).
void RegisterSlowPolicy(const std::string& name, double seconds) {
  ASSERT_TRUE(RegisterExternalPolicy(
                  name, "sleeps, then plans the graph's own order", PlanKind::kOneShot,
                  [seconds](const Graph& graph, const PlannerOptions&) -> absl::StatusOr<Schedule> {
                    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
                    return FreeAtLastUse(graph, DefaultOrder(graph));
                  })
                  .ok());
}

// The whole search stops at its time limit and keeps what it found.
TEST(FitTest, StopsAtItsTimeLimitWithTheLargestValueFound) {
  RegisterSlowPolicy("fit-test-slow", 0.25);
  FitRequest request = Conv3dRequest(int64_t{1} << 30);
  request.policies = {"fit-test-slow", "baseline"};
  request.time_limit_s = 1.0;
  request.jobs = 2;
  const auto start = std::chrono::steady_clock::now();
  auto fit = Fit(request);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(fit.ok()) << fit.status();
  // One plan may be under way when the limit passes.
  EXPECT_LT(took, 1.0 + 0.25 + 0.5);
  const FitRow& slow = fit->rows[0];
  EXPECT_TRUE(slow.time_limit_reached);
  ASSERT_TRUE(slow.value.has_value());
  EXPECT_GE(*slow.value, 2);  // n = 1, 2, 4, ... about four plans in a second
  EXPECT_THAT(slow.note, HasSubstr("time limit of 1 s reached"));
  const FitRow& fast = fit->rows[1];
  EXPECT_FALSE(fast.time_limit_reached);
  ASSERT_TRUE(fast.value.has_value());
  EXPECT_GT(*fast.value, *slow.value);
  ASSERT_TRUE(UnregisterExternalPolicy("fit-test-slow").ok());
}

TEST(FitTest, RefusesANonPositiveTimeLimit) {
  FitRequest request = Conv3dRequest(1 << 20);
  request.time_limit_s = 0;
  EXPECT_FALSE(Fit(request).ok());
}

// A value that makes no model (heads that do not divide dim) is passed over
// for the nearest one that does, not taken as too large: transformer's heads
// up to 48 with dim=48 reach 48 (they stopped at 24, 32 being refused), and
// dim from 1 with heads=2 starts at 2 (the search stopped at dim=1); a value
// past the model's range is too large.
TEST(FitTest, AValueThatMakesNoModelIsPassedOver) {
  FitRequest request;
  request.model = *ParseModelSpec("transformer:dim=48");
  request.vary = "heads";
  request.budget_bytes = int64_t{64} << 20;
  request.max_value = 48;
  request.jobs = 1;
  request.policies = {"baseline"};
  absl::StatusOr<FitResult> fit = Fit(request);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_TRUE(fit->rows[0].value.has_value()) << fit->rows[0].note;
  EXPECT_EQ(*fit->rows[0].value, 48);
  request.model = *ParseModelSpec("transformer:heads=2");
  request.vary = "dim";
  request.max_value = 64;
  fit = Fit(request);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_TRUE(fit->rows[0].value.has_value()) << fit->rows[0].note;
  EXPECT_EQ(*fit->rows[0].value, 64);
  // Past the model's range (unet3d takes at most 1024 classes), no value
  // near makes a model: too large, and the search goes on below it (it
  // stopped at 768).
  request.model = *ParseModelSpec("unet3d:variant=small,depth=16,height=16,width=16,batch=1");
  request.vary = "classes";
  request.start = 3;
  request.max_value = 0;
  request.budget_bytes = int64_t{64} << 30;
  fit = Fit(request);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_TRUE(fit->rows[0].value.has_value()) << fit->rows[0].note;
  EXPECT_EQ(*fit->rows[0].value, 1024);
}

}  // namespace
}  // namespace pebble
