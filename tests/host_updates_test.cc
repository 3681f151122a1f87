// Updates on the host (docs/semantics.md, "Updates on the host"): an
// in-place node that runs_on the host (or auto) runs as `host_compute`, on
// host copies, on a host stream of its own, for its host_cost; the
// optimizer's updates=host puts every update there and updates=auto lets
// the plan choose per parameter (Note [Updates on the host],
// scheduler/updates_last.cc; Note [Update placement]).
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "graph/optimizer.h"
#include "gtest/gtest.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/executor.h"
#include "scheduler/collectives.h"
#include "scheduler/plan_api.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

// x resident; w (home HOME) and its gradient gw; w1 writes w and runs on
// RUNS_ON (5 units on the host); y reads x only, so it may overlap the
// update.
constexpr char kStep[] = R"({"format": "pebble-graph", "version": 1, "name": "host-step",
  "nodes": [
    {"id": "x", "bytes": 10, "persistent": true},
    {"id": "w", "bytes": 100, "persistent": true, "home": "HOME", "role": "parameter"},
    {"id": "gw", "bytes": 100, "cost": 2, "inputs": ["x"]},
    {"id": "w1", "bytes": 100, "cost": 1, "host_cost": 5, "runs_on": "RUNS_ON",
     "inputs": ["w", "gw"],
     "alias_of": "w", "in_place": true},
    {"id": "y", "bytes": 20, "cost": 4, "inputs": ["x"]}
  ],
  "outputs": ["y"]})";

// kStep's text with its placeholders filled, and `from` (where given)
// replaced by `to`.
std::string StepText(const std::string& home, const std::string& runs_on,
                     const std::string& from = "", const std::string& to = "") {
  std::string text = kStep;
  text.replace(text.find("HOME"), 4, home);
  text.replace(text.find("RUNS_ON"), 7, runs_on);
  if (!from.empty()) text.replace(text.find(from), from.size(), to);
  return text;
}

Graph StepGraph(const std::string& home, const std::string& runs_on = "host") {
  absl::StatusOr<Graph> g = ParseGraphJson(StepText(home, runs_on));
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

Schedule Steps(const Graph& g, std::vector<std::pair<Action, std::string>> steps) {
  Schedule s;
  for (const auto& [action, id] : steps) s.steps.push_back({action, g.Find(id)});
  return s;
}

constexpr Action kC = Action::kCompute, kF = Action::kFree, kO = Action::kOffload,
                 kP = Action::kPrefetch, kH = Action::kHostCompute;

TEST(HostUpdatesTest, HostCostIsReadWrittenAndChecked) {
  const Graph g = StepGraph("device");
  EXPECT_EQ(g.host_cost(g.Find("w1")), 5.0);
  EXPECT_FALSE(g.host_cost(g.Find("gw")).has_value());
  EXPECT_TRUE(g.has_host_costs());
  EXPECT_EQ(GraphToJson(g)["nodes"][3]["host_cost"], 5.0);
  absl::StatusOr<Graph> back = ParseGraphJson(GraphToJson(g).dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->host_cost(back->Find("w1")), 5.0);

  absl::StatusOr<Graph> bad = ParseGraphJson(
      StepText("device", "host", "\"cost\": 4,", "\"cost\": 4, \"host_cost\": 1,"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'host_cost' is for in-place nodes"));
  EXPECT_THAT(bad.status().message(), HasSubstr("y"));
  bad = ParseGraphJson(StepText("device", "host", "\"host_cost\": 5", "\"host_cost\": -1"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("host_cost"));
  bad = ParseGraphJson(StepText("device", "auto", "\"host_cost\": 5, ", ""));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'runs_on': 'auto' needs 'host_cost'"));
  EXPECT_EQ(GraphToJson(StepGraph("device", "auto"))["nodes"][3]["runs_on"], "auto");
  EXPECT_FALSE(GraphToJson(StepGraph("device", "device"))["nodes"][3].contains("runs_on"));
}

// The time model: the update starts once the copies it reads are on the
// host, runs on its own stream beside the compute, and the prefetch that
// brings w back waits for it.
TEST(HostUpdatesTest, AHostComputeRunsOnItsOwnStreamAfterItsCopies) {
  const Graph g = StepGraph("device");
  SimulatorOptions options;
  options.host_bandwidth_bytes_per_s = 100;  // 100 bytes: 1 unit
  const Schedule s = Steps(g, {{kC, "gw"}, {kO, "gw"}, {kO, "w"}, {kF, "w"}, {kF, "gw"},
                               {kH, "w1"}, {kC, "y"}, {kP, "w"}});
  absl::StatusOr<PlanReport> r = Simulate(g, s, options);
  ASSERT_TRUE(r.ok()) << r.status();
  // gw: [0, 2]; its offload [2, 3]; w's [3, 4]; w1 on the host [4, 9];
  // y on the compute stream from 2 (after the frees at 3 and 4: R_k);
  // the prefetch of w after w1's end.
  EXPECT_DOUBLE_EQ(r->timeline[5].start, 4);
  EXPECT_DOUBLE_EQ(r->timeline[5].end, 9);
  EXPECT_DOUBLE_EQ(r->timeline[6].start, 4);
  EXPECT_DOUBLE_EQ(r->timeline[6].end, 8);
  EXPECT_DOUBLE_EQ(r->timeline[7].start, 9);
  EXPECT_DOUBLE_EQ(r->makespan, 10);
  EXPECT_DOUBLE_EQ(r->host_compute_cost, 5);
  EXPECT_DOUBLE_EQ(r->compute_cost, 6);  // gw and y: the update ran on the host
  EXPECT_EQ(r->transfer_bytes, 300);
  EXPECT_EQ(r->recomputations, 0);
  // While w1 runs the device holds x alone (then y).
  EXPECT_EQ(r->timeline[5].device_bytes, 10);
  EXPECT_EQ(ReportToJson(*r, g, s, false)["host_compute_cost"], 5.0);

  // The schedule file names the action.
  const nlohmann::json doc = ScheduleToJson(g, s);
  EXPECT_EQ(doc["steps"][5]["action"], "host_compute");
  absl::StatusOr<Schedule> back = ScheduleFromJson(g, doc);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
}

TEST(HostUpdatesTest, EveryBrokenRuleIsRefusedNamingTheStep) {
  const Graph g = StepGraph("device");
  struct Case {
    std::vector<std::pair<Action, std::string>> steps;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{kC, "gw"}, {kO, "gw"}, {kH, "w1"}}, "is resident on the device"},
      {{{kC, "gw"}, {kO, "w"}, {kF, "w"}, {kH, "w1"}}, "input 'gw' has no current host copy"},
      {{{kC, "gw"}, {kO, "gw"}, {kF, "w"}}, "no current host copy (offload it first)"},
      {{{kC, "gw"}, {kO, "gw"}, {kO, "w"}, {kF, "w"}, {kH, "w1"}, {kH, "w1"}},
       "has run already"},
      {{{kC, "gw"}, {kH, "gw"}}, "the node runs on the device"},
      {{{kC, "gw"}, {kO, "gw"}, {kO, "w"}, {kF, "w"}, {kH, "w1"}, {kC, "y"}},
       "(home: device) is not resident at the end"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PlanReport> r = Simulate(g, Steps(g, c.steps));
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message));
  }
  // A device compute of the update after it ran on the host, where either
  // side is allowed; on the device where only the host is.
  const Graph either = StepGraph("device", "auto");
  absl::StatusOr<PlanReport> twice = Simulate(
      either, Steps(either, {{kC, "gw"}, {kO, "gw"}, {kO, "w"}, {kF, "w"}, {kH, "w1"},
                             {kP, "w"}, {kC, "w1"}}));
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("at step 6 (compute 'w1')"));
  EXPECT_THAT(twice.status().message(), HasSubstr("has run already"));
  absl::StatusOr<PlanReport> on_device = Simulate(g, Steps(g, {{kC, "gw"}, {kC, "w1"}}));
  ASSERT_FALSE(on_device.ok());
  EXPECT_THAT(on_device.status().message(), HasSubstr("runs on the host (runs_on: host)"));
  absl::StatusOr<PlanReport> device_only =
      Simulate(StepGraph("device", "device"),
               Steps(g, {{kC, "gw"}, {kO, "gw"}, {kO, "w"}, {kF, "w"}, {kH, "w1"}}));
  ASSERT_FALSE(device_only.ok());
  EXPECT_THAT(device_only.status().message(), HasSubstr("the node runs on the device"));
}

// A home the schedule chooses: a host compute that touches the storage
// first makes it the host.
TEST(HostUpdatesTest, AnAutoHomeFirstTouchedByAHostComputeIsTheHost) {
  const Graph g = StepGraph("auto");
  const Schedule s = Steps(g, {{kC, "gw"}, {kO, "gw"}, {kF, "gw"}, {kH, "w1"}, {kC, "y"}});
  EXPECT_EQ(ResolveHomes(g, s).home(g.Find("w")), Tier::kHost);
  absl::StatusOr<PlanReport> r = Simulate(g, s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->transfer_bytes, 100);  // the gradient alone crosses the link
  EXPECT_EQ(r->initial_bytes, 10);
}

TEST(HostUpdatesTest, UpdatesEqualsHostParsesAndGivesEveryUpdateAHostCost) {
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizer("adam:updates=host,gradients=drop");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->updates, Tier::kHost);
  EXPECT_EQ(spec->ToString(),
            "adam:lr=0.001,beta1=0.9,beta2=0.999,eps=1e-08,weight_decay=0,gradients=drop,"
            "updates=host");
  absl::StatusOr<OptimizerSpec> bad = ParseOptimizer("sgd:updates=cpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("expected device, host or auto"));
  bad = ParseOptimizer("adam:updates=auto,state=device");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("updates=auto with state=device"));
  // SGD without momentum has no state to place: state=device is no conflict
  // (it was refused, "give state=host or state=auto", which then was refused
  // for SGD keeping no state); with momentum, in a group too, it is.
  EXPECT_TRUE(ParseOptimizer("sgd:updates=auto,state=device").ok());
  for (const char* text : {"sgd:momentum=0.9,updates=auto,state=device",
                           "sgd:updates=auto,state=device;fc*:momentum=0.9"}) {
    bad = ParseOptimizer(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_THAT(bad.status().message(), HasSubstr("updates=auto with state=device")) << text;
  }
  EXPECT_TRUE(BuildModel("mnist-cnn:batch=2,optimizer=sgd,updates=auto,optimizer_state=device")
                  .ok());

  absl::StatusOr<Graph> g = BuildModel("mnist-cnn:batch=2,optimizer=adam,updates=host");
  ASSERT_TRUE(g.ok()) << g.status();
  int updates = 0;
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    if (g->in_place(v)) {
      ++updates;
      EXPECT_EQ(g->runs_on(v), Tier::kHost) << g->id(v);
      ASSERT_TRUE(g->host_cost(v).has_value()) << g->id(v);
      EXPECT_GT(*g->host_cost(v), 0) << g->id(v);
    }
    if (g->role(v) == Role::kOptimizerState) {
      EXPECT_EQ(g->home(v), Tier::kHost) << g->id(v);
    }
    if (g->role(v) == Role::kParameter) {
      EXPECT_EQ(g->home(v), Tier::kDevice) << g->id(v);
    }
  }
  EXPECT_GT(updates, 3);
  // The host's rate sets the cost: the bytes an update reads and writes
  // over the rate (exp_avg: m, the gradient and p read, m written; Adam's
  // step: p and both moments read, the 4-byte count, p written).
  CostModel slow;
  slow.host_bytes_per_s = 1e6;
  absl::StatusOr<Graph> s = BuildModel("mnist-cnn:batch=2,optimizer=adam,updates=host", slow);
  ASSERT_TRUE(s.ok());
  const NodeId exp_avg = s->Find("exp_avg:conv1.weight#1");
  ASSERT_NE(exp_avg, kNoNode);
  EXPECT_DOUBLE_EQ(*s->host_cost(exp_avg),
                   4.0 * static_cast<double>(s->bytes(exp_avg)) / 1e6);
  const NodeId update = s->Find("update:conv1.weight");
  ASSERT_NE(update, kNoNode);
  EXPECT_DOUBLE_EQ(*s->host_cost(update),
                   (4.0 * static_cast<double>(s->bytes(update)) + 4) / 1e6);

  // Said, optimizer_state=device keeps the state's home on the device.
  absl::StatusOr<Graph> kept =
      BuildModel("mnist-cnn:batch=2,optimizer=adam,updates=host,optimizer_state=device");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->home(kept->Find("exp_avg:conv1.weight")), Tier::kDevice);
  EXPECT_EQ(g->home(g->Find("exp_avg:conv1.weight")), Tier::kHost);
  for (const char* text : {"mnist-cnn:updates=host", "mnist-cnn:optimizer=sgd,updates=gpu",
                           "mnist-cnn:optimizer=adam,updates=auto,optimizer_state=device"}) {
    absl::StatusOr<Graph> refused = BuildModel(text);
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_THAT(refused.status().message(), HasSubstr("updates=")) << text;
  }
}

int Count(const Schedule& s, Action action) {
  int n = 0;
  for (const Step& step : s.steps) n += step.action == action;
  return n;
}

// Every policy runs every update on the host: no update on the device,
// each gradient sent to the host once (and, dropped, freed then), the
// state never crossing the link; and the step runs on the CPU backend to
// the device updates' bits, measured peaks == predicted.
TEST(HostUpdatesTest, EveryPolicyRunsTheUpdatesOnTheHostToTheDeviceUpdatesBits) {
  absl::StatusOr<Graph> plain = BuildModel("transformer:layers=2");
  ASSERT_TRUE(plain.ok());
  absl::StatusOr<OptimizerSpec> device_spec = ParseOptimizer("adamw:lr=0.01,gradients=drop");
  absl::StatusOr<OptimizerSpec> host_spec =
      ParseOptimizer("adamw:lr=0.01,gradients=drop,updates=host");
  ASSERT_TRUE(device_spec.ok() && host_spec.ok());
  absl::StatusOr<Graph> on_device = AddOptimizerStep(*plain, *device_spec);
  absl::StatusOr<Graph> on_host = AddOptimizerStep(*plain, *host_spec);
  ASSERT_TRUE(on_device.ok() && on_host.ok()) << on_host.status();
  int updates = 0, gradients = 0;
  for (NodeId v = 0; v < on_host->num_nodes(); ++v) {
    updates += on_host->in_place(v);
    gradients += on_host->id(v).rfind("grad:", 0) == 0 && on_host->readers(v).size() > 0 &&
                 on_host->in_place(on_host->readers(v).front());
  }
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  PlanRequest reference_request;
  reference_request.policy = "baseline";
  absl::StatusOr<PlanOutcome> reference = PlanGraph(*on_device, reference_request);
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<ExecutionResult> expected =
      Execute(*on_device, reference->result.schedule, *backend);
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (const char* policy : {"baseline", "rotor", "dtr", "swap", "hybrid"}) {
    SCOPED_TRACE(policy);
    PlanRequest request;
    request.policy = policy;
    request.budget = "min";
    request.options.time_limit_s = 5;
    absl::StatusOr<PlanOutcome> plan = PlanGraph(*on_host, request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(plan->result.feasible) << plan->result.message;
    const Schedule& s = plan->result.schedule;
    EXPECT_EQ(Count(s, Action::kHostCompute), updates);
    for (const Step& step : s.steps) {
      if (step.action == Action::kCompute) {
        EXPECT_FALSE(on_host->in_place(step.node));
      }
      if (step.action == Action::kOffload || step.action == Action::kPrefetch) {
        EXPECT_NE(on_host->role(step.node), Role::kOptimizerState) << on_host->id(step.node);
      }
    }
    EXPECT_GE(Count(s, Action::kOffload), gradients);
    EXPECT_GT(plan->result.report.host_compute_cost, 0);
    absl::StatusOr<ExecutionResult> r = Execute(*on_host, s, *backend);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->peak_bytes, r->predicted.peak_bytes);
    EXPECT_EQ(r->host_peak_bytes, r->predicted.host_peak_bytes);
    EXPECT_GT(r->host_time_s, 0);
    ASSERT_EQ(r->updated.size(), expected->updated.size());
    for (size_t i = 0; i < r->updated.size(); ++i) {
      EXPECT_EQ(on_host->id(r->updated[i].node), on_device->id(expected->updated[i].node));
      EXPECT_TRUE(r->updated[i].array.data == expected->updated[i].array.data)
          << on_host->id(r->updated[i].node);
    }
  }
}

}  // namespace
}  // namespace pebble

namespace pebble {
namespace {

PlanOutcome PlanOrDie(const Graph& g, const std::string& policy, const std::string& budget,
                      std::optional<int64_t> host_budget_bytes = std::nullopt) {
  PlanRequest request;
  request.policy = policy;
  request.budget = budget;
  request.options.time_limit_s = 10;
  request.options.host_budget_bytes = host_budget_bytes;
  absl::StatusOr<PlanOutcome> plan = PlanGraph(g, request);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : PlanOutcome{};
}

// `schedule` of `g` runs on the CPU backend with measured peaks ==
// predicted, to the parameters and state of the all-resident baseline
// plan of `reference` (the same step with device updates), bit for bit.
void ExpectRunsToTheDeviceUpdatesBits(const Graph& g, const Schedule& schedule,
                                      const Graph& reference) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  const PlanOutcome plan = PlanOrDie(reference, "baseline", "100%");
  absl::StatusOr<ExecutionResult> expected = Execute(reference, plan.result.schedule, *backend);
  absl::StatusOr<ExecutionResult> r = Execute(g, schedule, *backend);
  ASSERT_TRUE(expected.ok() && r.ok()) << r.status();
  EXPECT_EQ(r->peak_bytes, r->predicted.peak_bytes);
  EXPECT_EQ(r->host_peak_bytes, r->predicted.host_peak_bytes);
  ASSERT_EQ(r->updated.size(), expected->updated.size());
  for (size_t i = 0; i < r->updated.size(); ++i) {
    EXPECT_TRUE(r->updated[i].array.data == expected->updated[i].array.data)
        << g.id(r->updated[i].node);
  }
}

// updates=auto: the plan runs on the host only the updates the budget
// needs there, the largest parameters' first (Note [Update placement]).
// With room, none (the device is faster); at the least peak, as low as
// all on the host; between, some, no slower than either fixed rule that
// fits; and a placed plan runs on the CPU backend to the device updates'
// bits with measured peaks == predicted.
TEST(HostUpdatesTest, AutoRunsOnTheHostOnlyWhatTheBudgetNeeds) {
  absl::StatusOr<Graph> on_device = BuildModel("transformer:layers=3,optimizer=adam,"
                                               "optimizer_state=host,gradients=drop");
  absl::StatusOr<Graph> on_host = BuildModel("transformer:layers=3,optimizer=adam,"
                                             "gradients=drop,updates=host");
  absl::StatusOr<Graph> placed = BuildModel("transformer:layers=3,optimizer=adam,"
                                            "gradients=drop,updates=auto");
  ASSERT_TRUE(on_device.ok() && on_host.ok() && placed.ok()) << placed.status();
  EXPECT_TRUE(placed->has_auto_runs_on());
  EXPECT_EQ(placed->runs_on(placed->Find("optimizer.step#1")), Tier::kDevice);
  EXPECT_EQ(placed->home(placed->Find("optimizer.step")), Tier::kDevice);

  const PlanOutcome roomy = PlanOrDie(*placed, "rotor", "100%");
  ASSERT_TRUE(roomy.result.feasible);
  EXPECT_EQ(roomy.result.details["update_placement"]["host_parameters"], 0);
  EXPECT_EQ(Count(roomy.result.schedule, Action::kHostCompute), 0);

  const PlanOutcome least = PlanOrDie(*placed, "rotor", "min");
  const PlanOutcome host_least = PlanOrDie(*on_host, "rotor", "min");
  const PlanOutcome device_least = PlanOrDie(*on_device, "rotor", "min");
  // As low as all on the host, but for Adam's step count (4 bytes), which
  // auto counts on the device.
  EXPECT_LE(least.result.report.peak_bytes, host_least.result.report.peak_bytes + 4);
  EXPECT_LT(host_least.result.report.peak_bytes, device_least.result.report.peak_bytes);
  EXPECT_GT(least.result.details["update_placement"]["host_parameters"].get<int>(), 0);

  // Halfway between the least peaks of the two fixed rules.
  const int64_t budget =
      (host_least.result.report.peak_bytes + device_least.result.report.peak_bytes) / 2;
  const PlanOutcome between = PlanOrDie(*placed, "rotor", std::to_string(budget));
  ASSERT_TRUE(between.result.feasible) << between.result.message;
  const int host_parameters = between.result.details["update_placement"]["host_parameters"];
  const int device_parameters = between.result.details["update_placement"]["device_parameters"];
  EXPECT_GT(host_parameters, 0);
  EXPECT_GT(device_parameters, 0);
  const PlanOutcome host_rule = PlanOrDie(*on_host, "rotor", std::to_string(budget));
  ASSERT_TRUE(host_rule.result.feasible);
  EXPECT_LE(between.result.report.makespan, host_rule.result.report.makespan);
  EXPECT_LT(between.result.report.peak_bytes, device_least.result.report.peak_bytes);

  ExpectRunsToTheDeviceUpdatesBits(*placed, between.result.schedule, *on_device);
}

}  // namespace
}  // namespace pebble

namespace pebble {
namespace {

// A weight read through a view (a transposed weight) by the forward and by
// the data gradient, its gradient dropped, its update on the host: the
// update waits until the view is freed, and runs beside the compute that
// follows (h), ahead of the step's end.
constexpr char kViewStep[] = R"({"format": "pebble-graph", "version": 1, "name": "view-step",
  "nodes": [
    {"id": "x", "bytes": 10, "persistent": true},
    {"id": "w", "bytes": 100, "persistent": true, "home": "device", "role": "parameter"},
    {"id": "wt", "bytes": 100, "inputs": ["w"], "alias_of": "w", "cost": 0},
    {"id": "y", "bytes": 20, "inputs": ["x", "wt"]},
    {"id": "loss", "bytes": 4, "inputs": ["y"]},
    {"id": "gw", "bytes": 100, "inputs": ["x", "loss"]},
    {"id": "gx", "bytes": 10, "inputs": ["wt", "loss"]},
    {"id": "h", "bytes": 4, "cost": 50, "inputs": ["gx"]},
    {"id": "w1", "bytes": 100, "host_cost": 5, "runs_on": "host", "inputs": ["w", "gw"],
     "alias_of": "w", "in_place": true}
  ],
  "outputs": ["loss", "h"]})";

TEST(HostUpdatesTest, AHostUpdateWaitsForTheViewsOfItsStorageAndRunsEarly) {
  absl::StatusOr<Graph> g = ParseGraphJson(kViewStep);
  ASSERT_TRUE(g.ok()) << g.status();
  const PlanOutcome plan = PlanOrDie(*g, "baseline", "100%");
  ASSERT_TRUE(plan.result.feasible) << plan.result.message;
  EXPECT_EQ(plan.result.details["updates"], "early");
  const Schedule& s = plan.result.schedule;
  int update = -1, view_free = -1, h = -1;
  for (int i = 0; i < static_cast<int>(s.steps.size()); ++i) {
    const std::string& id = g->id(s.steps[i].node);
    if (s.steps[i].action == Action::kHostCompute && id == "w1") update = i;
    if (s.steps[i].action == Action::kFree && id == "wt") view_free = i;
    if (s.steps[i].action == Action::kCompute && id == "h") h = i;
  }
  ASSERT_GE(update, 0);
  EXPECT_GT(update, view_free);
  EXPECT_LT(update, h);  // beside h, not after the step
}

TEST(HostUpdatesTest, AHostUpdateOfATensorWithoutAHomeIsRefusedNamingIt) {
  std::string text = kViewStep;
  text.replace(text.find("\"home\": \"device\", "), 18, "");
  absl::StatusOr<Graph> g = ParseGraphJson(text);
  ASSERT_TRUE(g.ok()) << g.status();
  PlanRequest request;
  request.policy = "rotor";
  absl::StatusOr<PlanOutcome> plan = PlanGraph(*g, request);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("update 'w1' may run on the host"));
  EXPECT_THAT(plan.status().message(), HasSubstr("'w' has no 'home'"));
}

// A state written on the device (m1) and read by an update on the host (w1):
// the plan offloads its new value for the host update, and the state still
// ends the step on the host.
TEST(HostUpdatesTest, AStateWrittenOnTheDeviceIsOffloadedForAHostUpdate) {
  absl::StatusOr<Graph> g = ParseGraphJson(R"({"format": "pebble-graph", "version": 1,
    "nodes": [
      {"id": "x", "bytes": 10, "persistent": true},
      {"id": "w", "bytes": 100, "persistent": true, "home": "device", "role": "parameter"},
      {"id": "m", "bytes": 100, "persistent": true, "home": "host",
       "role": "optimizer_state"},
      {"id": "y", "bytes": 20, "inputs": ["x", "w"]},
      {"id": "gw", "bytes": 100, "inputs": ["x", "y"]},
      {"id": "m1", "bytes": 100, "inputs": ["m", "gw"], "alias_of": "m", "in_place": true},
      {"id": "w1", "bytes": 100, "host_cost": 1, "runs_on": "host", "inputs": ["w", "m1"],
       "alias_of": "w", "in_place": true}
    ],
    "outputs": ["y"]})");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* policy : {"baseline", "rotor", "hybrid"}) {
    const PlanOutcome plan = PlanOrDie(*g, policy, "min");
    EXPECT_TRUE(plan.result.feasible) << policy << ": " << plan.result.message;
    EXPECT_EQ(Count(plan.result.schedule, Action::kHostCompute), 1) << policy;
  }
}

}  // namespace
}  // namespace pebble

namespace pebble {
namespace {

// updates=auto with state=auto: the plan places the updates and the state
// together (Note [Update placement] plans through Note [State placement]):
// it fits wherever either search alone fits, no slower, and runs to the
// device updates' bits.
// At "min" with a host budget that the all-host placement breaks (it holds
// every state and gradient there), updates=auto takes the least peak within
// the host budget, as the device rule does, rather than refusing: by the
// update placement's own search (exact-order, whose least peak no descent
// revisits), and so for a heuristic too (dtr, which Note [The least peak
// within a host budget] would also rescue, in several times the time).
TEST(HostUpdatesTest, AutoAtMinKeepsToTheHostBudget) {
  const std::string base = "mnist-cnn:batch=8,optimizer=adam,optimizer_state=auto,";
  absl::StatusOr<Graph> placed = BuildModel(base + "updates=auto");
  absl::StatusOr<Graph> on_device = BuildModel(base + "updates=device");
  ASSERT_TRUE(placed.ok() && on_device.ok()) << placed.status();
  for (const char* policy : {"exact-order", "dtr"}) {
    SCOPED_TRACE(policy);
    const PlanOutcome unbounded = PlanOrDie(*placed, policy, "min");
    ASSERT_TRUE(unbounded.result.feasible);
    ASSERT_GT(unbounded.result.details["update_placement"]["host_parameters"].get<int>(), 0);
    for (const int64_t host_budget :
         {int64_t{2000}, unbounded.result.report.host_peak_bytes / 4,
          unbounded.result.report.host_peak_bytes / 2}) {
      SCOPED_TRACE(host_budget);
      const PlanOutcome least = PlanOrDie(*placed, policy, "min", host_budget);
      ASSERT_TRUE(least.result.feasible) << least.result.message;
      EXPECT_LE(least.result.report.host_peak_bytes, host_budget);
      const PlanOutcome device_rule = PlanOrDie(*on_device, policy, "min", host_budget);
      ASSERT_TRUE(device_rule.result.feasible) << device_rule.result.message;
      EXPECT_LE(least.result.report.peak_bytes, device_rule.result.report.peak_bytes);
    }
  }
}

// swap at "min" with a host budget that its least-peak plan breaks (the
// updates' copies on the host besides the tensors it swaps): a plan with
// fewer swaps keeps to it (Note [The least peak within a host budget],
// scheduler/planner.cc).
TEST(HostUpdatesTest, SwapAtMinKeepsToTheHostBudget) {
  absl::StatusOr<Graph> g = BuildModel("transformer:layers=2,seq=64,dim=128,optimizer=adam,"
                                       "updates=host,gradients=drop");
  ASSERT_TRUE(g.ok()) << g.status();
  const PlanOutcome unbounded = PlanOrDie(*g, "swap", "min");
  const PlanOutcome plain = PlanOrDie(*g, "swap", "100%");  // nothing swapped: it fits
  ASSERT_LT(plain.result.report.host_peak_bytes, unbounded.result.report.host_peak_bytes);
  const int64_t host_budget =
      (plain.result.report.host_peak_bytes + unbounded.result.report.host_peak_bytes) / 2;
  const PlanOutcome least = PlanOrDie(*g, "swap", "min", host_budget);
  ASSERT_TRUE(least.result.feasible) << least.result.message;
  EXPECT_LE(least.result.report.host_peak_bytes, host_budget);
  EXPECT_LT(least.result.report.peak_bytes, plain.result.report.peak_bytes);
}

// A byte budget at the least peak of a sharded step with its state placed
// and a host budget fits, as "min" did: among best-order's orders, one
// whose lower peak broke the host budget was taken over one that fit
// (FitsLowerOrFaster, scheduler/whole_step.cc), and the budget was refused.
TEST(HostUpdatesTest, ByteBudgetAtTheShardedMinWithAHostBudgetFits) {
  absl::StatusOr<Graph> step = BuildModel("mnist-cnn:batch=4,optimizer=adam,optimizer_state=auto");
  ASSERT_TRUE(step.ok()) << step.status();
  absl::StatusOr<Graph> sharded = ShardGraph(*step, 2, NetworkLink{});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  auto plan = [&](const std::string& policy, const std::string& budget, int64_t host_budget) {
    PlanRequest request;
    request.policy = policy;
    request.budget = budget;
    request.options.time_limit_s = 20;
    request.options.ranks = 2;
    request.options.host_budget_bytes = host_budget;
    absl::StatusOr<PlanOutcome> outcome = PlanGraph(*sharded, request);
    EXPECT_TRUE(outcome.ok()) << outcome.status();
    return outcome.ok() ? *std::move(outcome) : PlanOutcome{};
  };
  for (const char* policy : {"swap", "rotor", "hybrid"}) {
    SCOPED_TRACE(policy);
    // (2,223,892 bytes: the host budget the command-line sweep refused)
    for (const int64_t host_budget : {int64_t{2223892}, int64_t{3} << 20}) {
      SCOPED_TRACE(host_budget);
      const PlanOutcome least = plan(policy, "min", host_budget);
      ASSERT_TRUE(least.result.feasible) << least.result.message;
      EXPECT_LE(least.result.report.host_peak_bytes, host_budget);
      const PlanOutcome at = plan(policy, std::to_string(least.result.report.peak_bytes),
                                  host_budget);
      EXPECT_TRUE(at.result.feasible) << at.result.message;
      EXPECT_LE(at.result.report.peak_bytes, least.result.report.peak_bytes);
      EXPECT_LE(at.result.report.host_peak_bytes, host_budget);
    }
  }
}

// Note [Leftovers freed]: exact left the last recomputed activation and its
// gradient resident to the step's end, where the updates then streamed the
// state in beside them (24,008 bytes at min against checkmate's 16,008 on
// tanh-chain:length=6 with Adam's state on the host).
TEST(HostUpdatesTest, WhatThePlanLeftResidentIsFreedBeforeTheUpdates) {
  for (const char* spec : {"tanh-chain:length=4,size=1000,optimizer=adam,optimizer_state=host",
                           "tanh-chain:length=6,size=1000,optimizer=adam,optimizer_state=host",
                           "tanh-chain:length=8,size=1000,optimizer=adamw,optimizer_state=host"}) {
    SCOPED_TRACE(spec);
    absl::StatusOr<Graph> g = BuildModel(std::string(spec));
    ASSERT_TRUE(g.ok()) << g.status();
    const PlanOutcome exact = PlanOrDie(*g, "exact", "min");
    const PlanOutcome checkmate = PlanOrDie(*g, "checkmate", "min");
    ASSERT_TRUE(exact.result.feasible && checkmate.result.feasible);
    EXPECT_LE(exact.result.report.peak_bytes, checkmate.result.report.peak_bytes);
  }
}

TEST(HostUpdatesTest, UpdatesAndStatePlacedTogether) {
  const std::string base = "transformer:layers=3,optimizer=adam,gradients=drop,";
  absl::StatusOr<Graph> both = BuildModel(base + "optimizer_state=auto,updates=auto");
  absl::StatusOr<Graph> updates_only = BuildModel(base + "updates=auto");
  absl::StatusOr<Graph> state_only = BuildModel(base + "optimizer_state=auto");
  ASSERT_TRUE(both.ok() && updates_only.ok() && state_only.ok()) << both.status();
  EXPECT_TRUE(both->has_auto_runs_on());
  EXPECT_TRUE(both->has_auto_homes());
  const PlanOutcome least = PlanOrDie(*updates_only, "rotor", "min");
  const PlanOutcome state_least = PlanOrDie(*state_only, "rotor", "min");
  for (const int64_t budget :
       {least.result.report.peak_bytes + 4,
        (least.result.report.peak_bytes + state_least.result.report.peak_bytes) / 2,
        state_least.result.report.peak_bytes + (int64_t{4} << 20)}) {
    SCOPED_TRACE(budget);
    const PlanOutcome together = PlanOrDie(*both, "rotor", std::to_string(budget));
    ASSERT_TRUE(together.result.feasible) << together.result.message;
    EXPECT_LE(together.result.report.peak_bytes, budget);
    ASSERT_TRUE(together.result.details.contains("update_placement"));
    for (const Graph* alone : {&*updates_only, &*state_only}) {
      const PlanOutcome other = PlanOrDie(*alone, "rotor", std::to_string(budget));
      if (other.result.feasible) {
        EXPECT_LE(together.result.report.makespan, other.result.report.makespan * (1 + 1e-9));
      }
    }
  }
  absl::StatusOr<Graph> on_device = BuildModel(base + "optimizer_state=host");
  ASSERT_TRUE(on_device.ok());
  const int64_t budget =
      (least.result.report.peak_bytes + state_least.result.report.peak_bytes) / 2;
  const PlanOutcome together = PlanOrDie(*both, "rotor", std::to_string(budget));
  ExpectRunsToTheDeviceUpdatesBits(*both, together.result.schedule, *on_device);
}

}  // namespace
}  // namespace pebble
