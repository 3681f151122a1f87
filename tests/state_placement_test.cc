// Auto homes (Tier::kAuto; state=auto): the plan chooses per optimizer
// state tensor whether it lives on the device or on the host
// (scheduler/state_placement.h), and the schedule says which
// (ResolveHomes, scheduler/schedule.h).
#include "scheduler/state_placement.h"

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/executor.h"
#include "scheduler/plan_api.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "scheduler/updates_last.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// x and w resident; m (momentum, home auto); the step's gradient gw feeds
// m1 (m <- mu m + gw) and w1 (w <- w - lr m1).
constexpr char kSgdStep[] = R"({"format": "pebble-graph", "version": 1, "name": "sgd",
  "nodes": [
    {"id": "x", "bytes": 10, "persistent": true},
    {"id": "w", "bytes": 100, "persistent": true, "role": "parameter"},
    {"id": "m", "bytes": 100, "persistent": true, "home": "auto", "role": "optimizer_state"},
    {"id": "y", "bytes": 50, "inputs": ["x", "w"]},
    {"id": "loss", "bytes": 4, "inputs": ["y"]},
    {"id": "gw", "bytes": 100, "inputs": ["x", "y", "loss"]},
    {"id": "m1", "bytes": 100, "inputs": ["m", "gw"], "alias_of": "m", "in_place": true},
    {"id": "w1", "bytes": 100, "inputs": ["w", "m1"], "alias_of": "w", "in_place": true}
  ],
  "outputs": ["loss"]})";

int Count(const Schedule& s, Action action, NodeId v) {
  int n = 0;
  for (const Step& step : s.steps) n += step.action == action && step.node == v;
  return n;
}

TEST(StatePlacementTest, AnAutoHomeIsWhatTheScheduleMakesIt) {
  absl::StatusOr<Graph> g = ParseGraphJson(kSgdStep);
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId m = g->Find("m");
  EXPECT_EQ(g->home(m), Tier::kAuto);
  EXPECT_TRUE(g->has_auto_homes());
  EXPECT_EQ(g->persistent_bytes(), 110);  // m is in neither sum until a schedule decides
  EXPECT_EQ(g->host_persistent_bytes(), 0);
  EXPECT_EQ(GraphToJson(*g)["nodes"][2]["home"], "auto");

  absl::StatusOr<std::unique_ptr<Planner>> baseline = MakePlanner("baseline");
  ASSERT_TRUE(baseline.ok());
  PlannerOptions roomy;  // no budget: resident, no copies
  absl::StatusOr<PlanResult> resident = (*baseline)->Plan(*g, roomy);
  ASSERT_TRUE(resident.ok()) << resident.status();
  EXPECT_EQ(Count(resident->schedule, Action::kPrefetch, m), 0);
  EXPECT_EQ(ResolveHomes(*g, resident->schedule).home(m), Tier::kDevice);
  EXPECT_EQ(resident->report.initial_bytes, 210);
  EXPECT_EQ(resident->report.transfer_bytes, 0);

  PlannerOptions least;
  least.budget_bytes = PlannerOptions::kMinBudget;  // streamed: the least peak
  absl::StatusOr<PlanResult> streamed = (*baseline)->Plan(*g, least);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(Count(streamed->schedule, Action::kPrefetch, m), 1);
  EXPECT_EQ(Count(streamed->schedule, Action::kOffload, m), 1);
  EXPECT_EQ(ResolveHomes(*g, streamed->schedule).home(m), Tier::kHost);
  EXPECT_EQ(streamed->report.initial_bytes, 110);
  EXPECT_EQ(streamed->report.transfer_bytes, 200);
  EXPECT_LT(streamed->report.peak_bytes, resident->report.peak_bytes);
  EXPECT_EQ(streamed->details["state_placement"]["streamed_tensors"], 1);

  // The simulator reads either schedule as the graph with that home would.
  absl::StatusOr<PlanReport> as_host =
      Simulate(ResolveHomes(*g, streamed->schedule), streamed->schedule);
  absl::StatusOr<PlanReport> as_auto = Simulate(*g, streamed->schedule);
  ASSERT_TRUE(as_host.ok() && as_auto.ok());
  EXPECT_EQ(as_auto->peak_bytes, as_host->peak_bytes);
  EXPECT_EQ(as_auto->host_peak_bytes, as_host->host_peak_bytes);
  // A schedule that offloads m without bringing it back ends with m on the
  // host though its first step did not prefetch it: its home is the device.
  Schedule wrong = resident->schedule;
  wrong.steps.push_back({Action::kOffload, m});
  wrong.steps.push_back({Action::kFree, m});
  absl::StatusOr<PlanReport> bad = Simulate(*g, wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("(home: device)"), std::string::npos)
      << bad.status();
}

struct Placed {
  PlanOutcome outcome;
  int streamed = 0;  // auto-home tensors the schedule prefetches
};

absl::StatusOr<Placed> PlanAt(const Graph& g, const std::string& budget) {
  PlanRequest request;
  request.policy = "rotor";
  request.budget = budget;
  request.options.time_limit_s = 10;
  ASSIGN_OR_RETURN(PlanOutcome outcome, PlanGraph(g, request));
  Placed placed{std::move(outcome)};
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (g.home(v) != Tier::kAuto) continue;
    // State is fetched once, for its updates; a parameter per use window.
    const int prefetches = Count(placed.outcome.result.schedule, Action::kPrefetch, v);
    if (g.role(v) != Role::kParameter) {
      EXPECT_LE(prefetches, 1) << g.id(v);
    }
    placed.streamed += prefetches > 0;
  }
  return placed;
}

absl::StatusOr<Graph> TransformerWith(const char* state) {
  return BuildModel(std::string("transformer:layers=2,optimizer=adam,optimizer_state=") + state);
}

// Between the two fixed rules: with a budget all-resident does not fit and
// all-streamed does, state=auto fits it, copying less and finishing sooner
// than the all-on-the-host rule; at `min` it reaches that rule's peak, and
// with room for everything it copies nothing.
TEST(StatePlacementTest, AutoFitsBetweenTheFixedRulesAndCopiesLess) {
  absl::StatusOr<Graph> device = TransformerWith("device");
  absl::StatusOr<Graph> host = TransformerWith("host");
  absl::StatusOr<Graph> automatic = TransformerWith("auto");
  ASSERT_TRUE(device.ok() && host.ok() && automatic.ok()) << automatic.status();
  absl::StatusOr<Placed> device_min = PlanAt(*device, "min");
  absl::StatusOr<Placed> host_min = PlanAt(*host, "min");
  absl::StatusOr<Placed> auto_min = PlanAt(*automatic, "min");
  ASSERT_TRUE(device_min.ok() && host_min.ok() && auto_min.ok()) << auto_min.status();
  const PlanReport& lowest = host_min->outcome.result.report;
  EXPECT_EQ(auto_min->outcome.result.report.peak_bytes, lowest.peak_bytes);
  EXPECT_LE(auto_min->outcome.result.report.transfer_bytes, lowest.transfer_bytes);
  // The budget percentages of state=auto are of the all-resident baseline.
  EXPECT_EQ(auto_min->outcome.baseline_peak_bytes, device_min->outcome.baseline_peak_bytes);

  const int64_t between =
      (lowest.peak_bytes + device_min->outcome.result.report.peak_bytes) / 2;
  const std::string budget = std::to_string(between);
  absl::StatusOr<Placed> d = PlanAt(*device, budget);
  absl::StatusOr<Placed> h = PlanAt(*host, budget);
  absl::StatusOr<Placed> a = PlanAt(*automatic, budget);
  ASSERT_TRUE(d.ok() && h.ok() && a.ok()) << a.status();
  EXPECT_FALSE(d->outcome.result.feasible);
  ASSERT_TRUE(h->outcome.result.feasible);
  ASSERT_TRUE(a->outcome.result.feasible) << a->outcome.result.message;
  const PlanReport& r = a->outcome.result.report;
  EXPECT_LE(r.peak_bytes, between);
  EXPECT_LT(r.transfer_bytes, h->outcome.result.report.transfer_bytes);
  EXPECT_LT(r.makespan, h->outcome.result.report.makespan);
  const nlohmann::json& placement = a->outcome.result.details["state_placement"];
  EXPECT_GT(placement["resident_tensors"].get<int>(), 0);
  EXPECT_GT(placement["streamed_tensors"].get<int>(), 0);
  EXPECT_EQ(placement["streamed_tensors"].get<int>(), a->streamed);
  EXPECT_EQ(r.transfer_bytes, 2 * placement["streamed_bytes"].get<int64_t>());

  absl::StatusOr<Placed> roomy = PlanAt(*automatic, "100%");
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(roomy->streamed, 0);
  EXPECT_EQ(roomy->outcome.result.report.transfer_bytes, 0);
}

// A host budget bounds how much may be streamed: the plan keeps resident
// what the host cannot hold, at "min" and at a budget alike.
TEST(StatePlacementTest, AutoKeepsWithinTheHostBudget) {
  absl::StatusOr<Graph> g = TransformerWith("auto");
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<Placed> free_host = PlanAt(*g, "min");
  ASSERT_TRUE(free_host.ok()) << free_host.status();
  const int64_t all_state = free_host->outcome.result.report.host_peak_bytes;
  ASSERT_GT(all_state, 0);
  for (const char* budget : {"min", "100%"}) {
    SCOPED_TRACE(budget);
    PlanRequest request;
    request.policy = "rotor";
    request.budget = budget;
    request.options.host_budget_bytes = all_state / 3;
    absl::StatusOr<PlanOutcome> plan = PlanGraph(*g, request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(plan->result.feasible) << plan->result.message;
    // (at "min" the placement was probed at a lower peak on the way: a
    // plan that fits says nothing of a budget it exceeds)
    EXPECT_THAT(plan->result.message, Not(HasSubstr("exceeds")));
    EXPECT_LE(plan->result.report.host_peak_bytes, all_state / 3);
    if (std::string(budget) == "min") {
      EXPECT_GT(plan->result.report.transfer_bytes, 0);  // as much streamed as the host takes
      EXPECT_GT(plan->result.report.peak_bytes, free_host->outcome.result.report.peak_bytes);
    }
  }
  PlanRequest none;
  none.policy = "rotor";
  none.budget = std::to_string(free_host->outcome.result.report.peak_bytes);
  none.options.host_budget_bytes = all_state / 3;
  absl::StatusOr<PlanOutcome> plan = PlanGraph(*g, none);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->result.feasible);  // the least peak needs all of the state streamed
}

// A placed plan runs on the CPU backend: measured peaks == predicted (device
// and host), and the updated parameters and state are the all-resident
// run's, bit for bit.
TEST(StatePlacementTest, APlacedPlanRunsToTheResidentBits) {
  absl::StatusOr<Graph> plain = BuildModel("conv3d:n=8");
  ASSERT_TRUE(plain.ok());
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  std::vector<HostTensor> reference;
  for (const char* spec_text : {"adamw:lr=0.01", "adamw:lr=0.01,state=auto"}) {
    SCOPED_TRACE(spec_text);
    absl::StatusOr<OptimizerSpec> spec = ParseOptimizer(spec_text);
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<Graph> g = AddOptimizerStep(*plain, *spec);
    ASSERT_TRUE(g.ok()) << g.status();
    // Halfway between the streamed plan's least peak and the baseline.
    absl::StatusOr<Placed> least = PlanAt(*g, "min");
    ASSERT_TRUE(least.ok()) << least.status();
    const int64_t budget =
        (least->outcome.result.report.peak_bytes + least->outcome.baseline_peak_bytes) / 2;
    absl::StatusOr<Placed> plan = PlanAt(*g, std::to_string(budget));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(plan->outcome.result.feasible);
    if (g->has_auto_homes()) {
      EXPECT_GT(plan->streamed, 0);
      EXPECT_GT(plan->outcome.result.details["state_placement"]["resident_tensors"].get<int>(),
                0);
    }
    absl::StatusOr<ExecutionResult> r = Execute(*g, plan->outcome.result.schedule, *backend);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->peak_bytes, r->predicted.peak_bytes);
    EXPECT_EQ(r->host_peak_bytes, r->predicted.host_peak_bytes);
    if (reference.empty()) {
      reference = r->updated;
      continue;
    }
    ASSERT_EQ(r->updated.size(), reference.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      EXPECT_EQ(r->updated[i].node, reference[i].node);
      EXPECT_TRUE(r->updated[i].array.data == reference[i].array.data) << i;
    }
  }
}

// parameters=host: every policy streams each updated parameter to its uses
// (Note [Parameters streamed]): fetched before each use window and its
// update, on the host at the end; the peak drops below the plan that keeps
// the parameters resident, and the step runs to the resident plan's bits
// with measured peaks == predicted.
TEST(StatePlacementTest, ParametersOnTheHostAreStreamedToTheirUses) {
  absl::StatusOr<Graph> plain = BuildModel("transformer:layers=2");
  ASSERT_TRUE(plain.ok());
  absl::StatusOr<OptimizerSpec> kept = ParseOptimizer("adam:state=host,gradients=drop");
  absl::StatusOr<OptimizerSpec> streamed =
      ParseOptimizer("adam:state=host,parameters=host,gradients=drop");
  ASSERT_TRUE(kept.ok() && streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->ToString(),
            "adam:lr=0.001,beta1=0.9,beta2=0.999,eps=1e-08,weight_decay=0,state=host,"
            "parameters=host,gradients=drop");
  absl::StatusOr<Graph> resident = AddOptimizerStep(*plain, *kept);
  absl::StatusOr<Graph> g = AddOptimizerStep(*plain, *streamed);
  ASSERT_TRUE(resident.ok() && g.ok()) << g.status();
  const NodeId weight = g->Find("h.0.mlp.c_fc.weight");
  ASSERT_NE(weight, kNoNode);
  EXPECT_EQ(g->home(weight), Tier::kHost);
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  for (const char* policy : {"baseline", "rotor", "dtr"}) {
    SCOPED_TRACE(policy);
    PlanRequest request;
    request.policy = policy;
    request.budget = "min";
    request.options.time_limit_s = 5;
    absl::StatusOr<PlanOutcome> with = PlanGraph(*g, request);
    absl::StatusOr<PlanOutcome> without = PlanGraph(*resident, request);
    ASSERT_TRUE(with.ok() && without.ok()) << with.status() << without.status();
    EXPECT_LT(with->result.report.peak_bytes, without->result.report.peak_bytes);
    for (NodeId v = 0; v < g->num_nodes(); ++v) {
      if (g->role(v) != Role::kParameter || g->home(v) != Tier::kHost) continue;
      // At least a window of its uses and its update's (a weight's forward
      // and backward uses are two windows where far enough apart).
      EXPECT_GE(Count(with->result.schedule, Action::kPrefetch, v), 2) << g->id(v);
      EXPECT_EQ(Count(with->result.schedule, Action::kOffload, v), 1) << g->id(v);
    }
    absl::StatusOr<ExecutionResult> a = Execute(*g, with->result.schedule, *backend);
    absl::StatusOr<ExecutionResult> b = Execute(*resident, without->result.schedule, *backend);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ(a->peak_bytes, a->predicted.peak_bytes);
    EXPECT_EQ(a->host_peak_bytes, a->predicted.host_peak_bytes);
    ASSERT_EQ(a->updated.size(), b->updated.size());
    for (size_t i = 0; i < a->updated.size(); ++i) {
      EXPECT_EQ(g->id(a->updated[i].node), resident->id(b->updated[i].node));
      EXPECT_TRUE(a->updated[i].array.data == b->updated[i].array.data) << i;
    }
  }
}

// A view of a streamed parameter (a transposed weight read by the forward
// and, much later, by the backward) holds its storage while resident: it is
// freed after the forward's read and computed again for the backward's
// (Note [Views of streamed parameters]), so the parameter is fetched for
// each window (and for its update), not held across the gap.
TEST(StatePlacementTest, AViewOfAStreamedParameterIsComputedAgainAcrossAGap) {
  absl::StatusOr<Graph> g = ParseGraphJson(R"({"format": "pebble-graph", "version": 1,
    "nodes": [
      {"id": "x", "bytes": 100, "persistent": true},
      {"id": "w", "bytes": 400, "persistent": true, "role": "parameter", "home": "host"},
      {"id": "wt", "bytes": 400, "inputs": ["w"], "alias_of": "w", "cost": 1},
      {"id": "a1", "bytes": 100, "inputs": ["x", "wt"], "cost": 1},
      {"id": "a2", "bytes": 100, "inputs": ["a1"], "cost": 1},
      {"id": "a3", "bytes": 100, "inputs": ["a2"], "cost": 1},
      {"id": "a4", "bytes": 100, "inputs": ["a3"], "cost": 1},
      {"id": "loss", "bytes": 4, "inputs": ["a4"], "cost": 1},
      {"id": "g4", "bytes": 100, "inputs": ["loss", "a4"], "cost": 1},
      {"id": "g3", "bytes": 100, "inputs": ["g4", "a3"], "cost": 1},
      {"id": "g2", "bytes": 100, "inputs": ["g3", "a2"], "cost": 1},
      {"id": "gx", "bytes": 100, "inputs": ["g2", "wt"], "cost": 1},
      {"id": "grad:w", "bytes": 400, "inputs": ["g2", "x"], "cost": 1},
      {"id": "update:w", "bytes": 400, "inputs": ["w", "grad:w"], "alias_of": "w",
       "in_place": true, "cost": 1}],
    "outputs": ["loss", "gx"]})");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* policy : {"baseline", "rotor", "dtr", "checkmate-lp"}) {
    SCOPED_TRACE(policy);
    for (const char* budget : {"min", "100%"}) {
      PlanRequest request;
      request.policy = policy;
      request.budget = budget;
      request.options.time_limit_s = 5;
      absl::StatusOr<PlanOutcome> plan = PlanGraph(*g, request);
      ASSERT_TRUE(plan.ok()) << budget << ": " << plan.status();
      EXPECT_TRUE(plan->result.feasible) << budget;
      EXPECT_EQ(Count(plan->result.schedule, Action::kPrefetch, g->Find("w")), 3) << budget;
      EXPECT_EQ(Count(plan->result.schedule, Action::kCompute, g->Find("wt")), 2) << budget;
    }
  }
}

// The backward reads the weight through a view of its view (PyTorch's
// t(t(weight))), and the plans free views at the step's end: the views are
// freed after their last use first, so the parameter leaves the device
// after the backward's read, not at the step's end (a GPT's weights were
// all held to the end: Note [Views of streamed parameters]).
TEST(StatePlacementTest, AStreamedParameterLeavesAfterItsViewsLastRead) {
  absl::StatusOr<Graph> g = ParseGraphJson(R"({"format": "pebble-graph", "version": 1,
    "nodes": [
      {"id": "x", "bytes": 100, "persistent": true},
      {"id": "w", "bytes": 400, "persistent": true, "role": "parameter", "home": "host"},
      {"id": "wt", "bytes": 400, "inputs": ["w"], "alias_of": "w", "cost": 1},
      {"id": "a1", "bytes": 100, "inputs": ["x", "wt"], "cost": 1},
      {"id": "a2", "bytes": 100, "inputs": ["a1"], "cost": 1},
      {"id": "a3", "bytes": 100, "inputs": ["a2"], "cost": 1},
      {"id": "loss", "bytes": 4, "inputs": ["a3"], "cost": 1},
      {"id": "g3", "bytes": 100, "inputs": ["loss", "a3"], "cost": 1},
      {"id": "g2", "bytes": 100, "inputs": ["g3", "a2"], "cost": 1},
      {"id": "wtt", "bytes": 400, "inputs": ["wt"], "alias_of": "wt", "cost": 1},
      {"id": "gx", "bytes": 100, "inputs": ["g2", "wtt"], "cost": 1},
      {"id": "h1", "bytes": 100, "inputs": ["gx"], "cost": 1},
      {"id": "h2", "bytes": 100, "inputs": ["h1"], "cost": 1},
      {"id": "h3", "bytes": 100, "inputs": ["h2"], "cost": 1},
      {"id": "grad:w", "bytes": 400, "inputs": ["g2", "x"], "cost": 1},
      {"id": "update:w", "bytes": 400, "inputs": ["w", "grad:w"], "alias_of": "w",
       "in_place": true, "cost": 1}],
    "outputs": ["loss", "h3"]})");
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId w = g->Find("w"), gx = g->Find("gx"), h3 = g->Find("h3");
  for (const char* policy : {"baseline", "rotor", "dtr"}) {
    SCOPED_TRACE(policy);
    PlanRequest request;
    request.policy = policy;
    request.budget = "100%";
    absl::StatusOr<PlanOutcome> plan = PlanGraph(*g, request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<Step>& steps = plan->result.schedule.steps;
    // w is on the device from gx's compute only up to a free before h3's
    // (the update, last, fetches it again).
    int at_gx = -1, freed_after = -1, at_h3 = -1;
    for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
      if (steps[i].action == Action::kCompute && steps[i].node == gx) at_gx = i;
      if (steps[i].action == Action::kCompute && steps[i].node == h3) at_h3 = i;
      if (at_gx >= 0 && freed_after < 0 && steps[i].action == Action::kFree &&
          steps[i].node == w) {
        freed_after = i;
      }
    }
    ASSERT_GE(at_gx, 0);
    EXPECT_GT(freed_after, at_gx);
    EXPECT_LT(freed_after, at_h3);
    EXPECT_EQ(Count(plan->result.schedule, Action::kPrefetch, w), 3);
  }
}

// parameters=auto with the state: between the fixed rules' least peaks,
// the plan keeps some tensors resident and streams others.
TEST(StatePlacementTest, AutoPlacesParametersAndStateTogether) {
  absl::StatusOr<Graph> automatic = BuildModel(
      "transformer:layers=2,optimizer=adam,optimizer_state=auto,parameters=auto");
  absl::StatusOr<Graph> host = BuildModel(
      "transformer:layers=2,optimizer=adam,optimizer_state=host,parameters=host");
  ASSERT_TRUE(automatic.ok() && host.ok()) << automatic.status();
  absl::StatusOr<Placed> least = PlanAt(*host, "min");
  absl::StatusOr<Placed> auto_least = PlanAt(*automatic, "min");
  ASSERT_TRUE(least.ok() && auto_least.ok()) << auto_least.status();
  EXPECT_EQ(auto_least->outcome.result.report.peak_bytes,
            least->outcome.result.report.peak_bytes);
  const int64_t between = (least->outcome.result.report.peak_bytes +
                           auto_least->outcome.baseline_peak_bytes) / 2;
  absl::StatusOr<Placed> h = PlanAt(*host, std::to_string(between));
  absl::StatusOr<Placed> a = PlanAt(*automatic, std::to_string(between));
  ASSERT_TRUE(h.ok() && a.ok()) << a.status();
  ASSERT_TRUE(a->outcome.result.feasible) << a->outcome.result.message;
  EXPECT_LE(a->outcome.result.report.peak_bytes, between);
  EXPECT_LT(a->outcome.result.report.transfer_bytes, h->outcome.result.report.transfer_bytes);
  const nlohmann::json& placement = a->outcome.result.details["state_placement"];
  EXPECT_GT(placement["resident_tensors"].get<int>(), 0);
  EXPECT_GT(placement["streamed_tensors"].get<int>(), 0);
  int streamed_parameters = 0;
  for (NodeId v = 0; v < automatic->num_nodes(); ++v) {
    streamed_parameters += automatic->role(v) == Role::kParameter &&
                           Count(a->outcome.result.schedule, Action::kPrefetch, v) > 0;
  }
  EXPECT_EQ(placement["streamed_parameters"].get<int>(), streamed_parameters);
}

// A policy that records each graph (by content) and budget it is asked to
// plan; with `cut`, each of its plans says the time limit cut it.
class PlansRecorded final : public Planner {
 public:
  PlansRecorded(std::unique_ptr<Planner> inner, std::vector<std::pair<uint64_t, int64_t>>& asked,
                bool cut = false)
      : inner_(std::move(inner)), asked_(asked), cut_(cut) {}
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    asked_.push_back({GraphFingerprint(graph), options.budget_bytes});
    absl::StatusOr<PlanResult> plan = inner_->Plan(graph, options);
    if (plan.ok() && cut_) NoteTimeLimit(*plan, options.time_limit_s, "(recorded)");
    return plan;
  }

 private:
  std::unique_ptr<Planner> inner_;
  std::vector<std::pair<uint64_t, int64_t>>& asked_;
  bool cut_;
};

// Note [Placements planned once]: the searches over where each update runs
// and where each state tensor and parameter lives plan the step many times,
// and the policy is asked to plan each step without its updates once per
// budget, at `min` and at a byte budget above the least peak; a plan the
// time limit cut is asked for again.
TEST(StatePlacementTest, ThePolicyPlansEachStepWithoutUpdatesOnce) {
  absl::StatusOr<Graph> g = BuildModel(
      "mnist-cnn:batch=4,optimizer=adam,updates=auto,optimizer_state=auto,parameters=auto");
  ASSERT_TRUE(g.ok()) << g.status();
  const PolicyInfo* rotor = PlannerRegistry::Global().Find("rotor");
  ASSERT_NE(rotor, nullptr);
  std::vector<std::pair<uint64_t, int64_t>> asked;
  const std::unique_ptr<Planner> planner =
      WithUpdatesLast(std::make_unique<PlansRecorded>(rotor->factory(), asked));
  PlannerOptions options;
  options.time_limit_s = 600;  // (no plan is cut: a cut plan is planned again)
  options.budget_bytes = PlannerOptions::kMinBudget;
  absl::StatusOr<PlanResult> least = planner->Plan(*g, options);
  ASSERT_TRUE(least.ok()) << least.status();
  ASSERT_TRUE(least->feasible) << least->message;
  ASSERT_TRUE(Simulate(*g, least->schedule).ok());
  for (const int64_t budget :
       {PlannerOptions::kMinBudget, least->report.peak_bytes + least->report.peak_bytes / 4}) {
    SCOPED_TRACE(budget);
    asked.clear();
    options.budget_bytes = budget;
    absl::StatusOr<PlanResult> r = planner->Plan(*g, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->feasible) << r->message;
    absl::StatusOr<PlanReport> again = Simulate(*g, r->schedule);
    ASSERT_TRUE(again.ok()) << again.status();
    // The update orders' trials keep no timeline; the plan returned has its
    // whole timeline, as a simulation of it gives.
    EXPECT_EQ(r->details["updates"], "early") << r->details.dump();
    ASSERT_EQ(r->report.timeline.size(), r->schedule.steps.size());
    EXPECT_EQ(r->report.peak_bytes, again->peak_bytes);
    EXPECT_EQ(r->report.timeline.back().device_bytes, again->timeline.back().device_bytes);
    // The searches tried several placements of each kind.
    EXPECT_GE(r->details["update_placement"]["plans"].get<int>(), 2) << r->details.dump();
    EXPECT_GE(r->details["state_placement"]["plans"].get<int>(), 2) << r->details.dump();
    const std::set<std::pair<uint64_t, int64_t>> distinct(asked.begin(), asked.end());
    EXPECT_GE(asked.size(), 2u);
    EXPECT_EQ(asked.size(), distinct.size()) << "a step without its updates planned again";
  }
  // The policy's plans cut by the time limit: none is kept, and the same
  // searches ask again for the steps they planned.
  std::vector<std::pair<uint64_t, int64_t>> asked_cut;
  const std::unique_ptr<Planner> cut_planner =
      WithUpdatesLast(std::make_unique<PlansRecorded>(rotor->factory(), asked_cut, true));
  options.budget_bytes = PlannerOptions::kMinBudget;
  ASSERT_TRUE(cut_planner->Plan(*g, options).ok());
  const std::set<std::pair<uint64_t, int64_t>> distinct_cut(asked_cut.begin(), asked_cut.end());
  EXPECT_GT(asked_cut.size(), distinct_cut.size());
}

TEST(StatePlacementTest, TheZooAndTheOptimizerSpecTakeAuto) {
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizer("adam:state=auto");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ToString(), "adam:lr=0.001,beta1=0.9,beta2=0.999,eps=1e-08,weight_decay=0,"
                              "state=auto");
  absl::StatusOr<Graph> g = BuildModel("mnist-cnn:batch=2,optimizer=adam,optimizer_state=auto");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->has_auto_homes());
  absl::StatusOr<Graph> none = BuildModel("mnist-cnn:batch=2,optimizer_state=auto");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("optimizer_state=auto needs an optimizer"),
            std::string::npos)
      << none.status();
  absl::StatusOr<Graph> dropped =
      BuildModel("mnist-cnn:batch=2,optimizer=adam,parameters=host,gradients=drop");
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_FALSE(dropped->is_output(dropped->Find("grad:fc1.weight")));
  EXPECT_EQ(dropped->home(dropped->Find("fc1.weight")), Tier::kHost);
  absl::StatusOr<Graph> nothing_reads = BuildModel("mnist-cnn:batch=2,gradients=drop");
  ASSERT_FALSE(nothing_reads.ok());
  EXPECT_NE(std::string(nothing_reads.status().message()).find("gradients=drop needs an optimizer"),
            std::string::npos);
  absl::StatusOr<Graph> sgd = BuildModel("mnist-cnn:batch=2,optimizer=sgd,optimizer_state=auto");
  ASSERT_FALSE(sgd.ok());
  EXPECT_NE(std::string(sgd.status().message()).find("keeps no state"), std::string::npos);
}

}  // namespace
}  // namespace pebble
