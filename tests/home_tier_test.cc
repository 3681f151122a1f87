// Home tiers and in-place updates (docs/semantics.md, "Home tiers and
// in-place updates"): the graph fields, their validation, and the
// simulator's rules, on a hand-traced step of SGD with momentum whose
// momentum lives on the host.
#include <algorithm>
#include <random>
#include <set>
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

using ::pebble::testing::MakeGraph;
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
      {"host home left on the device through its update", without(good, {kF, "m1"}),
       "persistent 'm' (home: host) is still resident on the device at the end through its "
       "view 'm1'"},
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
       "unknown tier 'disk' (expected device, host or auto)"},
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
  // An output ends the step on the device: one whose home is the host could
  // never be both (describe and plan said "invalid schedule" of it).
  absl::StatusOr<Graph> g = ParseGraphJson(R"({"format": "pebble-graph", "version": 1,
    "nodes": [{"id": "x", "bytes": 4, "persistent": true, "home": "host"},
              {"id": "y", "bytes": 4, "inputs": ["x"]}],
    "outputs": ["y", "x"]})");
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()),
              HasSubstr("output 'x' is a persistent node whose home is the host"));
}

// A home on an updated parameter (w) is planned; on a tensor that computes
// read and no update writes, refused.
TEST(HomeTierTest, PoliciesPlanParameterHomesAndRefuseOthers) {
  PlanRequest request;
  request.policy = "baseline";
  request.budget = "100%";
  absl::StatusOr<PlanOutcome> plan = PlanGraph(SgdStep(), request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->result.feasible);
  std::string text = kSgdStep;
  text.replace(text.find(R"("id": "x", "bytes": 10, "persistent": true)"),
               std::string(R"("id": "x", "bytes": 10, "persistent": true)").size(),
               R"("id": "x", "bytes": 10, "persistent": true, "home": "host")");
  absl::StatusOr<Graph> g = ParseGraphJson(text);
  ASSERT_TRUE(g.ok()) << g.status();
  plan = PlanGraph(*g, request);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("node 'x' has 'home' and is read by more than the optimizer's "
                        "updates: pebble's policies move the optimizer's state and the "
                        "parameters it updates"));
}

// ---------------------------------------------------------------- oracle

// A random graph of persistent tensors (each with no home, a device home or
// a host home) read by computed nodes, some of them in-place updates of a
// persistent storage, chained per storage; outputs are computed nodes that
// nothing reads.
Graph RandomHomeDag(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NodeSpec> nodes;
  std::vector<std::string> ids;
  std::vector<std::string> last_write;  // per persistent: its latest writer (or itself)
  const int persistent = 2 + static_cast<int>(rng() % 3);
  for (int i = 0; i < persistent; ++i) {
    NodeSpec p = ::pebble::testing::Persistent(absl::StrCat("p", i), 1 + rng() % 40);
    const int home = static_cast<int>(rng() % 3);
    if (home > 0) p.home = home == 1 ? Tier::kDevice : Tier::kHost;
    ids.push_back(p.id);
    last_write.push_back(p.id);
    nodes.push_back(std::move(p));
  }
  const int computed = 4 + static_cast<int>(rng() % 8);
  std::vector<std::string> plain;  // computed nodes that are not updates
  std::set<std::string> read;
  for (int i = 0; i < computed; ++i) {
    NodeSpec v;
    v.id = absl::StrCat("v", i);
    v.bytes = 1 + rng() % 60;
    v.cost = 1 + static_cast<double>(rng() % 3);
    const bool update = i >= 2 && rng() % 3 == 0;
    if (update) {
      const int target = static_cast<int>(rng() % persistent);
      v.alias_of = last_write[target];
      v.in_place = true;
      v.inputs.push_back(last_write[target]);
      last_write[target] = v.id;
      if (!plain.empty()) v.inputs.push_back(plain[rng() % plain.size()]);
      if (rng() % 2 == 0) {  // runs on the host, or where the schedule says
        v.host_cost = static_cast<double>(rng() % 4);
        v.runs_on = rng() % 2 == 0 ? Tier::kHost : Tier::kAuto;
      }
    } else {
      const int reads = 1 + static_cast<int>(rng() % 2);
      for (int r = 0; r < reads; ++r) {
        // Mostly earlier computed nodes; sometimes a persistent (through its
        // latest writer, or its base: reading it after an update is invalid).
        if (!plain.empty() && rng() % 3 != 0) {
          v.inputs.push_back(plain[rng() % plain.size()]);
        } else {
          const int target = static_cast<int>(rng() % persistent);
          v.inputs.push_back(rng() % 2 ? last_write[target] : ids[target]);
        }
      }
      plain.push_back(v.id);
    }
    for (const std::string& in : v.inputs) read.insert(in);
    nodes.push_back(std::move(v));
  }
  std::vector<std::string> outputs;
  for (const std::string& id : plain) {
    if (!read.count(id)) outputs.push_back(id);
  }
  if (outputs.empty()) outputs.push_back(plain.back());
  return MakeGraph(std::move(nodes), std::move(outputs), absl::StrCat("random-home-", seed));
}

// The reference: docs/semantics.md's rules recomputed from scratch after
// every step (the storages of D, each once; host copies summed), every
// precondition checked by brute force. bad_step: the first invalid step
// (steps.size() when the end state is wrong), or -1.
struct HomeReference {
  int bad_step = -1;
  int64_t peak = 0, host_peak = 0, transfer = 0;
  std::vector<int64_t> device, host;
};

class HomeOracle {
 public:
  explicit HomeOracle(const Graph& g) : g_(g), in_d_(g.num_nodes()), in_h_(g.num_nodes()),
                                        done_(g.num_nodes()) {
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      if (!g.persistent(v)) continue;
      (g.home(v) == Tier::kHost ? in_h_ : in_d_)[v] = true;
    }
  }
  bool Movable(NodeId v) const { return g_.persistent(v) && g_.home(v).has_value(); }
  // The node whose write made the value u reads: walk the alias chain
  // to an update or the base.
  NodeId VersionOf(NodeId u) const {
    while (g_.is_alias(u) && !g_.in_place(u)) u = g_.alias_of(u);
    return u;
  }
  // The latest update of storage s that ran, else s.
  NodeId Current(NodeId s) const {
    NodeId current = s;
    for (NodeId w : writes_) {
      if (g_.storage(w) == s) current = w;
    }
    return current;
  }
  bool HeldThroughAlias(NodeId v) const {
    for (NodeId a = 0; a < g_.num_nodes(); ++a) {
      if (in_d_[a] && a != v && g_.storage(a) == v) return true;
    }
    return false;
  }
  bool Valid(const Step& st) const {
    const NodeId v = st.node;
    switch (st.action) {
      case Action::kCompute: {
        bool ok = !g_.persistent(v) && !in_d_[v] && (g_.is_alias(v) || !HeldThroughAlias(v)) &&
                  !(g_.in_place(v) && done_[v]) && g_.runs_on(v) != Tier::kHost;
        for (NodeId u : g_.inputs(v)) {
          ok = ok && in_d_[u] && VersionOf(u) == Current(g_.storage(u));
        }
        return ok;
      }
      case Action::kFree:
        return in_d_[v] && (!g_.persistent(v) || (Movable(v) && in_h_[v]));
      case Action::kOffload:
        return (!g_.persistent(v) || Movable(v)) && !g_.is_alias(v) && in_d_[v];
      case Action::kPrefetch:
        return !g_.is_alias(v) && in_h_[v] && !in_d_[v] && !HeldThroughAlias(v);
      case Action::kHostCompute: {
        const NodeId root = g_.storage(v);
        bool ok = g_.runs_on(v) != Tier::kDevice && !done_[v];
        for (NodeId a = 0; a < g_.num_nodes(); ++a) ok = ok && !(in_d_[a] && g_.storage(a) == root);
        for (NodeId u : g_.inputs(v)) {
          ok = ok && in_h_[g_.storage(u)] && VersionOf(u) == Current(g_.storage(u));
        }
        return ok;
      }
      case Action::kAllReduce:  // the schedules drawn here have none
        return false;
    }
    return false;
  }
  void Apply(const Step& st) {
    const NodeId v = st.node;
    switch (st.action) {
      case Action::kCompute:
        in_d_[v] = true;
        done_[v] = true;
        if (g_.in_place(v)) {
          writes_.push_back(v);
          in_h_[g_.storage(v)] = false;
        }
        break;
      case Action::kFree: in_d_[v] = false; break;
      case Action::kOffload: in_h_[v] = true; break;
      case Action::kPrefetch: in_d_[v] = true; break;
      case Action::kHostCompute:  // writes the host copy, which stays current
        done_[v] = true;
        writes_.push_back(v);
        break;
      case Action::kAllReduce:
        break;
    }
  }
  int64_t Device() const {
    std::set<NodeId> storages;
    for (NodeId v = 0; v < g_.num_nodes(); ++v) {
      if (in_d_[v]) storages.insert(g_.storage(v));
    }
    int64_t sum = 0;
    for (NodeId r : storages) sum += g_.bytes(r);
    return sum;
  }
  int64_t Host() const {
    int64_t sum = 0;
    for (NodeId v = 0; v < g_.num_nodes(); ++v) sum += in_h_[v] ? g_.bytes(v) : 0;
    return sum;
  }
  bool EndValid() const {
    for (NodeId o : g_.outputs()) {
      if (!in_d_[o]) return false;
    }
    for (NodeId v = 0; v < g_.num_nodes(); ++v) {
      if (g_.in_place(v) && !done_[v]) return false;
      if (!Movable(v)) continue;
      if (*g_.home(v) == Tier::kDevice && !in_d_[v]) return false;
      if (*g_.home(v) == Tier::kHost && (!in_h_[v] || in_d_[v])) return false;
    }
    return true;
  }
  bool resident(NodeId v) const { return in_d_[v]; }
  bool has_host_copy(NodeId v) const { return in_h_[v]; }

 private:
  const Graph& g_;
  std::vector<bool> in_d_, in_h_, done_;
  std::vector<NodeId> writes_;
};

HomeReference ReferenceRun(const Graph& g, const Schedule& s) {
  HomeOracle oracle(g);
  HomeReference ref;
  ref.peak = oracle.Device();
  ref.host_peak = oracle.Host();
  for (int k = 0; k < static_cast<int>(s.steps.size()); ++k) {
    const Step& st = s.steps[k];
    if (!oracle.Valid(st)) {
      ref.bad_step = k;
      return ref;
    }
    oracle.Apply(st);
    if (st.action == Action::kOffload || st.action == Action::kPrefetch) {
      ref.transfer += g.bytes(st.node);
    }
    const int64_t during =
        oracle.Device() + (st.action == Action::kCompute ? g.workspace(st.node) : 0);
    ref.device.push_back(oracle.Device());
    ref.host.push_back(oracle.Host());
    ref.peak = std::max(ref.peak, during);
    ref.host_peak = std::max(ref.host_peak, oracle.Host());
  }
  if (!oracle.EndValid()) ref.bad_step = static_cast<int>(s.steps.size());
  return ref;
}

// A random walk of mostly valid steps (computes, frees, offloads and
// prefetches of anything, homed persistent tensors included), now and then
// an arbitrary one; then a finish that brings each homed tensor home and
// the outputs and updates in where it still can.
Schedule RandomHomeSchedule(const Graph& g, std::mt19937_64& rng, double invalid_rate) {
  HomeOracle oracle(g);
  Schedule s;
  auto push = [&](Step st) {
    s.steps.push_back(st);
    if (oracle.Valid(st)) oracle.Apply(st);
  };
  const int n = g.num_nodes();
  constexpr Action kActions[] = {Action::kCompute, Action::kCompute, Action::kCompute,
                                 Action::kFree,    Action::kOffload, Action::kPrefetch,
                                 Action::kHostCompute};
  for (int i = 0; i < 3 * n; ++i) {
    const bool arbitrary = std::uniform_real_distribution<double>(0, 1)(rng) < invalid_rate;
    for (int attempt = 0; attempt < 50; ++attempt) {
      const Step st{kActions[rng() % 7], static_cast<NodeId>(rng() % n)};
      if (!arbitrary && st.action == Action::kHostCompute && g.runs_on(st.node) != Tier::kDevice) {
        // Prepare it where the rules allow: host copies of what it reads,
        // then its storage off the device (each holder freed).
        for (NodeId u : g.inputs(st.node)) {
          const Step offload{Action::kOffload, g.storage(u)};
          if (!oracle.has_host_copy(g.storage(u)) && oracle.Valid(offload)) push(offload);
        }
        for (NodeId a = 0; a < n; ++a) {
          const Step free{Action::kFree, a};
          if (a != g.storage(st.node) && g.storage(a) == g.storage(st.node) &&
              oracle.resident(a) && oracle.Valid(free)) {
            push(free);
          }
        }
        const Step free_base{Action::kFree, g.storage(st.node)};
        if (oracle.resident(g.storage(st.node)) && oracle.Valid(free_base)) push(free_base);
      }
      if (arbitrary || oracle.Valid(st)) {
        push(st);
        break;
      }
    }
  }
  for (NodeId v : g.topological_order()) {
    const Step compute{Action::kCompute, v};
    if (g.needed()[v] && !oracle.resident(v) && oracle.Valid(compute)) push(compute);
  }
  for (NodeId v = 0; v < n; ++v) {
    if (!g.persistent(v) || !g.home(v).has_value()) continue;
    if (*g.home(v) == Tier::kDevice && !oracle.resident(v)) push({Action::kPrefetch, v});
    if (*g.home(v) == Tier::kHost && oracle.resident(v)) {
      if (!oracle.has_host_copy(v)) push({Action::kOffload, v});
      for (NodeId a = 0; a < n; ++a) {  // the updates holding it, then the base
        if (a != v && g.storage(a) == v && oracle.resident(a) && !g.is_output(a)) {
          push({Action::kFree, a});
        }
      }
      push({Action::kFree, v});
    }
  }
  return s;
}

TEST(HomeTierTest, AgreesWithTheBruteForceReferenceOnRandomGraphsAndSchedules) {
  int valid = 0, invalid = 0, with_updates = 0, with_host_homes = 0, host_computes = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const Graph g = RandomHomeDag(seed);
    with_updates += g.has_in_place();
    with_host_homes += g.host_persistent_bytes() > 0;
    std::mt19937_64 rng(seed * 104729);
    for (int trial = 0; trial < 6; ++trial) {
      const Schedule s = RandomHomeSchedule(g, rng, trial % 2 == 0 ? 0.0 : 0.08);
      const HomeReference ref = ReferenceRun(g, s);
      absl::StatusOr<PlanReport> r = Simulate(g, s);
      const std::string label = absl::StrCat("seed ", seed, " trial ", trial);
      ASSERT_EQ(r.ok(), ref.bad_step < 0) << label << ": " << r.status();
      if (!r.ok()) {
        ++invalid;
        const std::string message(r.status().message());
        if (ref.bad_step < static_cast<int>(s.steps.size())) {
          EXPECT_THAT(message, HasSubstr(absl::StrCat("at step ", ref.bad_step, " ")))
              << label;
        } else {
          EXPECT_THAT(message, HasSubstr("invalid schedule: ")) << label;
          EXPECT_THAT(message, ::testing::Not(HasSubstr("at step"))) << label;
        }
        continue;
      }
      ++valid;
      for (const Step& st : s.steps) host_computes += st.action == Action::kHostCompute;
      EXPECT_EQ(r->peak_bytes, ref.peak) << label;
      EXPECT_EQ(r->host_peak_bytes, ref.host_peak) << label;
      EXPECT_EQ(r->transfer_bytes, ref.transfer) << label;
      for (size_t k = 0; k < s.steps.size(); ++k) {
        ASSERT_EQ(r->timeline[k].device_bytes, ref.device[k]) << label << " step " << k;
        ASSERT_EQ(r->timeline[k].host_bytes, ref.host[k]) << label << " step " << k;
      }
    }
  }
  EXPECT_GT(with_updates, 100);
  EXPECT_GT(with_host_homes, 100);
  EXPECT_GT(valid, 150);
  EXPECT_GT(invalid, 150);
  EXPECT_GT(host_computes, 15);  // valid host computes, in valid schedules
}

}  // namespace
}  // namespace pebble
