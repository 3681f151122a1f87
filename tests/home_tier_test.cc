// Home tiers and in-place updates (docs/semantics.md, "Home tiers and
// in-place updates"): the graph fields, their validation, and the
// simulator's rules, on a hand-traced step of SGD with momentum whose
// momentum lives on the host.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/graph_json.h"
#include "gtest/gtest.h"
#include "scheduler/plan_api.h"
#include "scheduler/simulator.h"
#include "tests/test_util.h"

namespace pebble {
namespace {

using ::pebble::testing::MakeSchedule;
using ::testing::HasSubstr;

constexpr Action kC = Action::kCompute;
constexpr Action kF = Action::kFree;
constexpr Action kO = Action::kOffload;
constexpr Action kP = Action::kPrefetch;

// x (input, 10 B) and w (weight, 100 B, home device) on the device; m
// (momentum, 100 B, home host) on the host. Forward y = f(x, w), the loss,
// its gradient dy, the data gradient dx (reads w) and the weight gradient
// gw; then m1 writes m (m <- mu m + gw) and w1 writes w (w <- w - lr m1).
constexpr char kSgdStep[] = R"({"format": "pebble-graph", "version": 1, "name": "sgd",
  "nodes": [
    {"id": "x", "bytes": 10, "persistent": true},
    {"id": "w", "bytes": 100, "persistent": true, "home": "device", "role": "parameter"},
    {"id": "m", "bytes": 100, "persistent": true, "home": "host", "role": "buffer"},
    {"id": "y", "bytes": 50, "inputs": ["x", "w"]},
    {"id": "loss", "bytes": 4, "inputs": ["y"]},
    {"id": "dy", "bytes": 50, "inputs": ["loss", "y"]},
    {"id": "dx", "bytes": 10, "inputs": ["dy", "w"]},
    {"id": "gw", "bytes": 100, "inputs": ["x", "dy"]},
    {"id": "m1", "bytes": 100, "inputs": ["m", "gw"], "alias_of": "m", "in_place": true},
    {"id": "w1", "bytes": 100, "inputs": ["w", "m1"], "alias_of": "w", "in_place": true,
     "workspace": 30}
  ],
  "outputs": ["loss", "dx"]})";

using Steps = std::vector<std::pair<Action, std::string>>;

const Steps& GoodSteps() {
  static const Steps steps = {
      {kP, "m"},  {kC, "y"},  {kC, "loss"}, {kC, "dy"}, {kF, "y"},  {kC, "dx"},
      {kC, "gw"}, {kF, "dy"}, {kC, "m1"},   {kC, "w1"}, {kF, "gw"}, {kO, "m"},
      {kF, "m1"}, {kF, "m"},  {kF, "w1"}};
  return steps;
}

Graph SgdStep() {
  absl::StatusOr<Graph> g = ParseGraphJson(kSgdStep);
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

TEST(HomeTierTest, GraphFieldsReadAndWriteBack) {
  Graph g = SgdStep();
  EXPECT_EQ(g.home(g.Find("w")), Tier::kDevice);
  EXPECT_EQ(g.home(g.Find("m")), Tier::kHost);
  EXPECT_FALSE(g.home(g.Find("x")).has_value());
  EXPECT_TRUE(g.in_place(g.Find("w1")));
  EXPECT_EQ(g.version(g.Find("w1")), g.Find("w1"));
  EXPECT_EQ(g.version(g.Find("w")), g.Find("w"));
  EXPECT_EQ(g.persistent_bytes(), 110);  // x and w: resident at the start
  EXPECT_EQ(g.host_persistent_bytes(), 100);
  // Updates are needed though no output reads them.
  EXPECT_TRUE(g.needed()[g.Find("w1")]);
  EXPECT_TRUE(g.needed()[g.Find("m1")]);
  absl::StatusOr<Graph> back = GraphFromJson(nlohmann::json(GraphToJson(g)));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(nlohmann::json(GraphToJson(*back)), nlohmann::json(GraphToJson(g)));
}

TEST(HomeTierTest, AStepThatMovesAndUpdatesPersistentTensors) {
  Graph g = SgdStep();
  absl::StatusOr<PlanReport> r = Simulate(g, MakeSchedule(g, GoodSteps()));
  ASSERT_TRUE(r.ok()) << r.status();
  // Device: 110 at the start, +m 210, +y 260, +loss 264, +dy 314, -y 264,
  // +dx 274, +gw 374 (the peak), -dy 324; m1 and w1 add nothing (w1's
  // workspace: 354); -gw 224, offload m, -m1 (m still held), -m 124, -w1
  // (w still held) 124.
  EXPECT_EQ(r->initial_bytes, 110);
  EXPECT_EQ(r->peak_bytes, 374);
  EXPECT_EQ(r->timeline[9].peak_bytes, 354);
  EXPECT_EQ(r->timeline.back().device_bytes, 124);
  // Host: m's copy from the start until m1 writes m, then again from the
  // offload of the new value.
  EXPECT_EQ(r->host_peak_bytes, 100);
  EXPECT_EQ(r->timeline[8].host_bytes, 0);
  EXPECT_EQ(r->timeline.back().host_bytes, 100);
  EXPECT_EQ(r->transfer_bytes, 200);
  EXPECT_EQ(r->recomputations, 0);
}

TEST(HomeTierTest, RejectsEveryBrokenRule) {
  Graph g = SgdStep();
  auto with = [](Steps steps, size_t at, std::pair<Action, std::string> step) {
    steps.insert(steps.begin() + static_cast<std::ptrdiff_t>(at), std::move(step));
    return steps;
  };
  auto without = [](Steps steps, std::pair<Action, std::string> step) {
    steps.erase(std::find(steps.begin(), steps.end(), step));
    return steps;
  };
  const Steps& good = GoodSteps();
  // dx after w1: reads the weight after its update.
  const Steps late_dx = {{kP, "m"}, {kC, "y"},  {kC, "loss"}, {kC, "dy"}, {kF, "y"},
                         {kC, "gw"}, {kC, "m1"}, {kC, "w1"},  {kC, "dx"}};
  struct Case {
    const char* name;
    Steps steps;
    const char* message;
  } cases[] = {
      {"read after the update", late_dx,
       "step 8 (compute 'dx'): input 'w' was overwritten by the in-place update 'w1'"},
      {"update twice", with(with(good, 9, {kF, "m1"}), 10, {kC, "m1"}),
       "step 10 (compute 'm1'): the in-place update has run already (it writes 'm' once"},
      {"host home read without prefetch", without(good, {kP, "m"}),
       "(compute 'm1'): input 'm' is not resident"},
      {"free a persistent without a current host copy", with(good, 9, {kF, "m"}),
       "step 9 (free 'm'): the persistent node has no current host copy"},
      {"host home not written back", without(without(good, {kO, "m"}), {kF, "m"}),
       "persistent 'm' (home: host) has no current host copy at the end"},
      {"host home left on the device", without(good, {kF, "m"}),
       "persistent 'm' (home: host) is still resident on the device at the end"},
      {"device home left on the host", with(with(good, 15, {kO, "w"}), 16, {kF, "w"}),
       "persistent 'w' (home: device) is not resident at the end"},
      {"update never ran", without(without(good, {kC, "w1"}), {kF, "w1"}),
       "the in-place update 'w1' never ran"},
      {"a persistent without a home stays", with(good, 0, {kF, "x"}),
       "step 0 (free 'x'): the node is persistent"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PlanReport> r = Simulate(g, MakeSchedule(g, c.steps));
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message)) << c.name;
  }
  // A device-home weight may leave the device while a host copy keeps it.
  Steps evicted = with(with(good, 6, {kO, "w"}), 7, {kF, "w"});  // after dx
  evicted = with(evicted, 10, {kP, "w"});                          // before w1
  absl::StatusOr<PlanReport> r = Simulate(g, MakeSchedule(g, evicted));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->transfer_bytes, 400);
}

TEST(HomeTierTest, GraphErrorsNameTheNode) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"id": "a", "bytes": 1, "home": "device"})", "node 'a': 'home' is for persistent"},
      {R"({"id": "w", "bytes": 1, "persistent": true, "home": "disk"})",
       "unknown tier 'disk' (expected device or host)"},
      {R"({"id": "a", "bytes": 1, "inputs": ["w"], "in_place": true})",
       "node 'a': an in-place node ('in_place') needs 'alias_of'"},
      {R"({"id": "a", "bytes": 1, "inputs": ["w"], "alias_of": "w", "in_place": 1})",
       "'in_place' must be true or false"},
      {R"({"id": "v", "bytes": 1, "inputs": ["t"], "alias_of": "t"},
          {"id": "a", "bytes": 1, "inputs": ["v"], "alias_of": "v", "in_place": true})",
       "an in-place node writes the storage of 't', which is not persistent"},
      {R"({"id": "v", "bytes": 1, "inputs": ["w"], "alias_of": "w"},
          {"id": "a", "bytes": 1, "inputs": ["v"], "alias_of": "v", "in_place": true})",
       "node 'a': an in-place node's 'alias_of' must be the persistent 'w' or an earlier "
       "in-place node of it, not the view 'v'"},
      {R"({"id": "a", "bytes": 1, "inputs": ["w"], "alias_of": "w", "in_place": true},
          {"id": "b", "bytes": 1, "inputs": ["w"], "alias_of": "w", "in_place": true})",
       "in-place nodes 'a' and 'b' both write after 'w'"},
  };
  for (const auto& [nodes, message] : cases) {
    const std::string text = absl::StrCat(
        R"({"format": "pebble-graph", "version": 1, "nodes": [)",
        R"({"id": "w", "bytes": 1, "persistent": true}, {"id": "t", "bytes": 1}, )", nodes,
        R"(], "outputs": ["t"]})");
    absl::StatusOr<Graph> g = ParseGraphJson(text);
    ASSERT_FALSE(g.ok()) << nodes;
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(message)) << nodes;
  }
}

TEST(HomeTierTest, PoliciesRefuseWhatTheyDoNotPlanYet) {
  Graph g = SgdStep();
  PlanRequest request;
  request.policy = "baseline";
  request.budget = "100%";
  absl::StatusOr<PlanOutcome> plan = PlanGraph(g, request);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("node 'w' has 'home': pebble's policies do not move persistent tensors"));
}

}  // namespace
}  // namespace pebble
