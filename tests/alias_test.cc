// Aliases (views, SPEC section 1 "Aliases") through every layer: the IR and
// its JSON, the simulator (checked against a brute-force reference), the
// memory layout, the planners' fold/unfold wrapper (scheduler/alias_fold.h),
// autodiff and the CPU executor.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "graph/net_builder.h"
#include "gtest/gtest.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/executor.h"
#include "scheduler/alias_fold.h"
#include "scheduler/budget.h"
#include "scheduler/checkmate.h"
#include "scheduler/external_policy.h"
#include "scheduler/memory_layout.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"
#include "test_util.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;
using testing::MakeGraph;
using testing::MakeSchedule;
using testing::Node;
using testing::Persistent;

constexpr Action kC = Action::kCompute;
constexpr Action kF = Action::kFree;
constexpr Action kO = Action::kOffload;
constexpr Action kP = Action::kPrefetch;

// A computed node that is a view of `base` (one of `inputs`, first if none
// are given).
NodeSpec View(std::string id, int64_t bytes, std::string base,
              std::vector<std::string> inputs = {}, double cost = 1.0) {
  if (inputs.empty()) inputs.push_back(base);
  NodeSpec s = Node(std::move(id), bytes, std::move(inputs), cost);
  s.alias_of = std::move(base);
  return s;
}

absl::StatusOr<Graph> Build(std::vector<NodeSpec> nodes, std::vector<std::string> outputs) {
  GraphBuilder b("t");
  for (NodeSpec& s : nodes) b.AddNode(std::move(s));
  for (std::string& o : outputs) b.AddOutput(std::move(o));
  return b.Build();
}

// ---------------------------------------------------------------- IR, JSON

TEST(AliasGraphTest, AliasOfAndStorageFollowTheChain) {
  const Graph g = MakeGraph({Persistent("x", 8), Node("b", 100, {"x"}), View("v1", 100, "b"),
                             View("v2", 40, "v1", {"x", "v1"}), Node("c", 5, {"v2"})},
                            {"c"});
  const NodeId b = g.Find("b"), v1 = g.Find("v1"), v2 = g.Find("v2"), c = g.Find("c");
  EXPECT_TRUE(g.has_aliases());
  EXPECT_EQ(g.num_aliases(), 2);
  EXPECT_EQ(g.alias_of(b), kNoNode);
  EXPECT_EQ(g.alias_of(v1), b);
  EXPECT_EQ(g.alias_of(v2), v1);
  EXPECT_EQ(g.storage(v2), b);
  EXPECT_EQ(g.storage(v1), b);
  EXPECT_EQ(g.storage(c), c);
  EXPECT_THAT(g.ToString(), HasSubstr("2 aliases"));
  const Graph plain = MakeGraph({Node("a", 1)}, {"a"});
  EXPECT_FALSE(plain.has_aliases());
  EXPECT_EQ(plain.storage(0), 0);
}

TEST(AliasGraphTest, BuilderRefusesBadAliasesNamingTheNode) {
  auto not_input = Build({Node("b", 1), Node("d", 1), View("v", 1, "b", {"d"})}, {"v"});
  ASSERT_FALSE(not_input.ok());
  EXPECT_THAT(not_input.status().message(), HasSubstr("node 'v'"));
  EXPECT_THAT(not_input.status().message(), HasSubstr("not one of its inputs"));

  auto itself = Build({Node("b", 1), View("v", 1, "v", {"b"})}, {"v"});
  ASSERT_FALSE(itself.ok());
  EXPECT_THAT(itself.status().message(), HasSubstr("node 'v': 'alias_of' names the node itself"));

  NodeSpec p = Persistent("p", 4);
  p.alias_of = "q";
  auto persistent = Build({Persistent("q", 4), p, Node("c", 1, {"p"})}, {"c"});
  ASSERT_FALSE(persistent.ok());
  EXPECT_THAT(persistent.status().message(), HasSubstr("node 'p': a persistent node cannot"));

  NodeSpec w = View("v", 1, "b");
  w.workspace = 8;
  auto workspace = Build({Node("b", 1), w}, {"v"});
  ASSERT_FALSE(workspace.ok());
  EXPECT_THAT(workspace.status().message(), HasSubstr("node 'v': an alias"));

  // An alias's bytes are its logical size: anything non-negative.
  EXPECT_TRUE(Build({Node("b", 10), View("v", 1000, "b"), View("z", 0, "b")}, {"v", "z"}).ok());
}

TEST(AliasGraphTest, JsonRoundTripKeepsAliases) {
  const Graph g = MakeGraph({Persistent("x", 8), Node("b", 100, {"x"}), View("v", 100, "b"),
                             View("w", 7, "x"), Node("c", 5, {"v", "w", "v"})},
                            {"c", "v"});
  const std::string text = GraphToJsonText(g);
  EXPECT_THAT(text, HasSubstr(R"("inputs": ["b"], "alias_of": "b")"));
  auto back = ParseGraphJson(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(GraphToJsonText(*back), text);
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    EXPECT_EQ(back->alias_of(v), g.alias_of(v)) << g.id(v);
    EXPECT_EQ(back->storage(v), g.storage(v)) << g.id(v);
  }
  // SpecOf gives the alias back to GraphBuilder.
  EXPECT_EQ(SpecOf(g, g.Find("v")).alias_of, std::optional<std::string>("b"));
  EXPECT_FALSE(SpecOf(g, g.Find("c")).alias_of.has_value());
  EXPECT_THAT(GraphToDot(g), HasSubstr("style=dashed"));

  auto bad = ParseGraphJson(R"({"format": "pebble-graph", "version": 1, "nodes": [
      {"id": "b", "bytes": 1}, {"id": "v", "bytes": 1, "inputs": ["b"], "alias_of": 3}],
      "outputs": ["v"]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("node 'v': 'alias_of' must be"));
  auto unknown = ParseGraphJson(R"({"format": "pebble-graph", "version": 1, "nodes": [
      {"id": "b", "bytes": 1}, {"id": "v", "bytes": 1, "inputs": ["b"], "alias_of": "q"}],
      "outputs": ["v"]})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("node 'v': 'alias_of' 'q'"));
}

TEST(AliasGraphTest, NetBuilderKeepsAliasesThroughRenameAndFromGraph) {
  NetBuilder nb("n");
  const Value x = nb.Input("x", {2, 3});
  const Value r = nb.Apply("relu", {x});
  const Value f = nb.Apply("reshape", {r}, {{"shape", {6}}}, "flat");
  nb.SetAliasOf(f, r);
  ASSERT_TRUE(nb.Rename(r, "renamed").ok());
  EXPECT_EQ(nb.alias_of(f).index, r.index);
  auto g = nb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->alias_of(g->Find("flat")), g->Find("renamed"));
  NetBuilder again = NetBuilder::FromGraph(*g);
  auto g2 = again.Build();
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(GraphToJsonText(*g2), GraphToJsonText(*g));

  NetBuilder bad("bad");
  const Value a = bad.Input("a", {2});
  const Value b = bad.Apply("relu", {a});
  const Value c = bad.Apply("relu", {a});
  bad.SetAliasOf(c, b);  // b is not an input of c
  EXPECT_THAT(bad.status().message(), HasSubstr("node 'relu_2' cannot be an alias of 'relu_1'"));
}

// ---------------------------------------------------------------- simulator

PlanReport MustSimulate(const Graph& g, const Schedule& s) {
  auto r = Simulate(g, s);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : PlanReport{};
}

// A base with two views read by two consumers.
TEST(AliasSimulatorTest, BaseWithTwoViewsReadByTwoConsumers) {
  const Graph g = MakeGraph({Persistent("x", 10), Node("b", 100, {"x"}), View("v1", 100, "b"),
                             View("v2", 50, "b"), Node("c1", 20, {"v1"}), Node("c2", 30, {"v2"})},
                            {"c1", "c2"});
  const Schedule s = MakeSchedule(g, {{kC, "b"},   // 10 + 100 = 110
                                      {kC, "v1"},  // 110: b's storage, once
                                      {kC, "v2"},  // 110
                                      {kF, "b"},   // 110: held by v1 and v2
                                      {kC, "c1"},  // 130
                                      {kF, "v1"},  // 130: v2 holds it
                                      {kC, "c2"},  // 160 (the peak)
                                      {kF, "v2"}});  // 60: storage released
  const PlanReport r = MustSimulate(g, s);
  EXPECT_EQ(r.peak_bytes, 160);
  EXPECT_EQ(r.peak_step, 6);
  const std::vector<int64_t> device = {110, 110, 110, 110, 130, 130, 160, 60};
  for (size_t k = 0; k < device.size(); ++k) EXPECT_EQ(r.timeline[k].device_bytes, device[k]) << k;
  EXPECT_EQ(r.compute_cost, 5);  // every compute step costs its node's cost
  EXPECT_EQ(r.base_cost, 5);
  EXPECT_TRUE(r.one_shot);
}

// A view that outlives its base's last direct reader keeps the storage.
TEST(AliasSimulatorTest, AViewOutlivesItsBasesLastDirectReader) {
  const Graph g = MakeGraph({Node("b", 100), View("v", 100, "b"), Node("d", 10, {"b"}),
                             Node("e", 1, {"v"})},
                            {"d", "e"});
  const Schedule s = MakeSchedule(g, {{kC, "b"},   // 100
                                      {kC, "v"},   // 100
                                      {kC, "d"},   // 110
                                      {kF, "b"},   // 110: v still holds it
                                      {kC, "e"},   // 111 (the peak)
                                      {kF, "v"}});  // 11
  const PlanReport r = MustSimulate(g, s);
  EXPECT_EQ(r.peak_bytes, 111);
  EXPECT_EQ(r.timeline[3].device_bytes, 110);
  EXPECT_EQ(r.timeline[5].device_bytes, 11);
}

TEST(AliasSimulatorTest, RecomputingABaseWhileAViewLivesIsRefused) {
  const Graph g = MakeGraph({Node("b", 100), View("v", 100, "b"), Node("e", 1, {"b", "v"})},
                            {"e"});
  auto r = Simulate(g, MakeSchedule(g, {{kC, "b"}, {kC, "v"}, {kF, "b"}, {kC, "b"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("step 3 (compute 'b'): its storage is still resident through alias 'v'"));
  // Freeing the view first makes it valid.
  EXPECT_TRUE(Simulate(g, MakeSchedule(g, {{kC, "b"}, {kC, "v"}, {kF, "b"}, {kF, "v"},
                                           {kC, "b"}, {kC, "v"}, {kC, "e"}}))
                  .ok());
}

TEST(AliasSimulatorTest, OffloadAndPrefetchApplyToBasesOnly) {
  const Graph g = MakeGraph({Node("b", 100), View("v", 100, "b"), Node("e", 1, {"v"})}, {"e"});
  auto offload = Simulate(g, MakeSchedule(g, {{kC, "b"}, {kC, "v"}, {kO, "v"}}));
  ASSERT_FALSE(offload.ok());
  EXPECT_THAT(offload.status().message(),
              HasSubstr("step 2 (offload 'v'): the node is an alias; offload its base 'b'"));
  auto prefetch = Simulate(g, MakeSchedule(g, {{kC, "b"}, {kO, "b"}, {kF, "b"}, {kP, "v"}}));
  ASSERT_FALSE(prefetch.ok());
  EXPECT_THAT(prefetch.status().message(), HasSubstr("step 3 (prefetch 'v'): the node is an alias"));
  // Prefetching a base whose storage a view still holds would copy it twice.
  auto held = Simulate(g, MakeSchedule(g, {{kC, "b"}, {kC, "v"}, {kO, "b"}, {kF, "b"},
                                           {kP, "b"}}));
  ASSERT_FALSE(held.ok());
  EXPECT_THAT(held.status().message(),
              HasSubstr("step 4 (prefetch 'b'): its storage is still resident through alias 'v'"));
  // The valid way: offload the base, free base and view, prefetch, view again.
  const PlanReport r = MustSimulate(
      g, MakeSchedule(g, {{kC, "b"}, {kO, "b"}, {kC, "v"}, {kF, "b"}, {kF, "v"}, {kP, "b"},
                          {kC, "v"}, {kF, "b"}, {kC, "e"}, {kF, "v"}}));
  EXPECT_EQ(r.peak_bytes, 101);
  EXPECT_EQ(r.transfer_bytes, 200);
  EXPECT_EQ(r.host_peak_bytes, 100);
  EXPECT_EQ(r.recomputations, 1);  // v, computed twice
}

TEST(AliasSimulatorTest, AViewOfAPersistentNodeCostsNothing) {
  const Graph g = MakeGraph({Persistent("w", 100), View("wt", 100, "w"), Node("c", 10, {"wt"})},
                            {"c"});
  const PlanReport r = MustSimulate(g, MakeSchedule(g, {{kC, "wt"}, {kC, "c"}, {kF, "wt"}}));
  EXPECT_EQ(r.initial_bytes, 100);
  EXPECT_EQ(r.peak_bytes, 110);
  EXPECT_EQ(r.timeline[0].device_bytes, 100);
  EXPECT_EQ(r.timeline[2].device_bytes, 110);
}

// ---------------------------------------------------------------- random graphs

// A seeded random DAG with views: like testing::RandomDag, but about a
// third of the computed nodes are aliases of their first input (a computed
// node, another alias, or the persistent source), some with a second input
// of their own, and some aliases are outputs.
Graph RandomAliasDag(int n, uint64_t seed, bool extra_inputs = true) {
  std::mt19937_64 rng(seed);
  std::vector<NodeSpec> nodes;
  nodes.push_back(Persistent("w", 1 + static_cast<int64_t>(rng() % 50)));
  std::vector<bool> read(n, false);
  std::vector<std::string> outputs;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> inputs;
    const int fan_in = i == 0 ? 1 : 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < fan_in; ++k) {
      if (i == 0 || rng() % 8 == 0) {
        inputs.push_back("w");
      } else {
        const int u = static_cast<int>(rng() % i);
        read[u] = true;
        inputs.push_back(absl::StrCat("v", u));
      }
    }
    const double cost = (rng() % 5 == 0) ? 0.0 : static_cast<double>(rng() % 10 + 1);
    const int64_t bytes = 1 + static_cast<int64_t>(rng() % 100);
    if (i > 0 && rng() % 3 == 0) {
      if (inputs.size() > (extra_inputs ? 2u : 1u)) inputs.resize(extra_inputs ? 2 : 1);
      NodeSpec s = View(absl::StrCat("v", i), bytes, inputs[0], inputs, cost);
      nodes.push_back(std::move(s));
      if (rng() % 6 == 0) outputs.push_back(absl::StrCat("v", i));
    } else {
      nodes.push_back(Node(absl::StrCat("v", i), bytes, inputs, cost,
                           static_cast<int64_t>(rng() % 3 == 0 ? rng() % 20 : 0)));
    }
  }
  for (int i = 0; i < n; ++i) {
    if (!read[i]) outputs.push_back(absl::StrCat("v", i));
  }
  return MakeGraph(std::move(nodes), std::move(outputs), absl::StrCat("random-alias-", seed));
}

// Whether every view reads nothing but its base: then folding is exact for
// the baseline too (Note [Alias folding]).
bool ViewsReadOnlyTheirBase(const Graph& g) {
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (g.is_alias(v) && g.unique_inputs(v).size() > 1) return false;
  }
  return true;
}

// The reference: SPEC sections 1-2 recomputed from scratch after every step
// (the storages of D, each once), with every precondition checked by brute
// force. `bad_step` is the first invalid step (steps.size() when an output
// is missing at the end), or -1.
struct Reference {
  int bad_step = -1;
  int64_t peak = 0, host_peak = 0, transfer = 0;
  double compute_cost = 0;
  std::vector<int64_t> device, during, host;
};

Reference ReferenceRun(const Graph& g, const Schedule& s) {
  const int n = g.num_nodes();
  std::vector<bool> in_d(n, false), in_h(n, false);
  for (NodeId v = 0; v < n; ++v) in_d[v] = g.persistent(v);
  auto device = [&] {
    std::set<NodeId> storages;
    for (NodeId v = 0; v < n; ++v) {
      if (in_d[v]) storages.insert(g.storage(v));
    }
    int64_t sum = 0;
    for (NodeId r : storages) sum += g.bytes(r);
    return sum;
  };
  auto held_through_alias = [&](NodeId v) {
    for (NodeId a = 0; a < n; ++a) {
      if (in_d[a] && a != v && g.storage(a) == v) return true;
    }
    return false;
  };
  Reference ref;
  ref.peak = device();
  for (int k = 0; k < static_cast<int>(s.steps.size()); ++k) {
    const NodeId v = s.steps[k].node;
    int64_t during = 0;
    bool ok = true;
    switch (s.steps[k].action) {
      case kC:
        ok = !g.persistent(v) && !in_d[v] && (g.is_alias(v) || !held_through_alias(v));
        for (NodeId u : g.inputs(v)) ok = ok && in_d[u];
        if (!ok) break;
        in_d[v] = true;
        during = device() + g.workspace(v);
        ref.compute_cost += g.cost(v);
        break;
      case kF:
        ok = !g.persistent(v) && in_d[v];
        if (!ok) break;
        in_d[v] = false;
        during = device();
        break;
      case kO:
        ok = !g.persistent(v) && !g.is_alias(v) && in_d[v];
        if (!ok) break;
        in_h[v] = true;
        ref.transfer += g.bytes(v);
        during = device();
        break;
      case kP:
        ok = !g.is_alias(v) && in_h[v] && !in_d[v] && !held_through_alias(v);
        if (!ok) break;
        in_d[v] = true;
        ref.transfer += g.bytes(v);
        during = device();
        break;
      case Action::kHostCompute:  // these graphs have no host_cost
      case Action::kAllReduce:    // nor collectives
        ok = false;
        break;
    }
    if (!ok) {
      ref.bad_step = k;
      return ref;
    }
    int64_t host = 0;
    for (NodeId u = 0; u < n; ++u) host += in_h[u] ? g.bytes(u) : 0;
    ref.device.push_back(device());
    ref.during.push_back(during);
    ref.host.push_back(host);
    ref.peak = std::max(ref.peak, during);
    ref.host_peak = std::max(ref.host_peak, host);
  }
  for (NodeId o : g.outputs()) {
    if (!in_d[o]) ref.bad_step = static_cast<int>(s.steps.size());
  }
  return ref;
}

// A random schedule of `g`: a walk of mostly valid steps (computes, frees,
// offloads and prefetches), with now and then an arbitrary step (often one
// the alias rules refuse), then every node freed and the needed ones
// computed in topological order, so that most schedules are valid to the
// end.
Schedule RandomSchedule(const Graph& g, std::mt19937_64& rng, double invalid_rate) {
  const int n = g.num_nodes();
  std::vector<bool> in_d(n, false), in_h(n, false);
  for (NodeId v = 0; v < n; ++v) in_d[v] = g.persistent(v);
  auto held = [&](NodeId v) {
    for (NodeId a = 0; a < n; ++a) {
      if (in_d[a] && a != v && g.storage(a) == v) return true;
    }
    return false;
  };
  auto valid = [&](Step st) {
    const NodeId v = st.node;
    switch (st.action) {
      case kC: {
        bool ok = !g.persistent(v) && !in_d[v] && (g.is_alias(v) || !held(v));
        for (NodeId u : g.inputs(v)) ok = ok && in_d[u];
        return ok;
      }
      case kF: return !g.persistent(v) && in_d[v];
      case kO: return !g.persistent(v) && !g.is_alias(v) && in_d[v];
      case kP: return !g.is_alias(v) && in_h[v] && !in_d[v] && !held(v);
      case Action::kHostCompute: return false;  // these graphs have no host_cost
      case Action::kAllReduce: return false;    // nor collectives
    }
    return false;
  };
  auto apply = [&](Step st) {
    switch (st.action) {
      case kC: case kP: in_d[st.node] = true; break;
      case kF: in_d[st.node] = false; break;
      case kO: in_h[st.node] = true; break;
      case Action::kHostCompute: break;
      case Action::kAllReduce: break;
    }
  };
  Schedule s;
  const int walk = 3 * n;
  constexpr Action kActions[] = {kC, kC, kC, kF, kF, kO, kP};
  for (int i = 0; i < walk; ++i) {
    const bool arbitrary = std::uniform_real_distribution<double>(0, 1)(rng) < invalid_rate;
    for (int attempt = 0; attempt < 50; ++attempt) {
      const Step st{kActions[rng() % 7], static_cast<NodeId>(rng() % n)};
      if (arbitrary || valid(st)) {
        s.steps.push_back(st);
        if (valid(st)) apply(st);
        break;
      }
    }
  }
  for (NodeId v = 0; v < n; ++v) {
    if (in_d[v] && !g.persistent(v)) {
      s.steps.push_back({kF, v});
      in_d[v] = false;
    }
  }
  for (NodeId v : g.topological_order()) {
    if (g.needed()[v] && !g.persistent(v)) s.steps.push_back({kC, v});
  }
  return s;
}

int StepOf(const absl::Status& status) {
  const std::string m(status.message());
  const std::string key = "at step ";
  const size_t at = m.find(key);
  if (at == std::string::npos) return -2;
  int k = 0;
  size_t end = at + key.size();
  while (end < m.size() && std::isdigit(static_cast<unsigned char>(m[end]))) ++end;
  if (!absl::SimpleAtoi(m.substr(at + key.size(), end - at - key.size()), &k)) return -2;
  return k;
}

TEST(AliasSimulatorTest, AgreesWithTheBruteForceReferenceOnRandomGraphsAndSchedules) {
  int valid = 0, invalid = 0, aliased = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    const Graph g = RandomAliasDag(4 + static_cast<int>(seed % 14), seed);
    aliased += g.has_aliases() ? 1 : 0;
    std::mt19937_64 rng(seed * 7919);
    for (int trial = 0; trial < 6; ++trial) {
      const Schedule s = RandomSchedule(g, rng, trial % 2 == 0 ? 0.0 : 0.08);
      const Reference ref = ReferenceRun(g, s);
      auto r = Simulate(g, s);
      const std::string label = absl::StrCat("seed ", seed, " trial ", trial);
      ASSERT_EQ(r.ok(), ref.bad_step < 0) << label << ": " << r.status();
      if (!r.ok()) {
        ++invalid;
        if (ref.bad_step < static_cast<int>(s.steps.size())) {
          EXPECT_EQ(StepOf(r.status()), ref.bad_step) << label << ": " << r.status();
        } else {
          EXPECT_THAT(r.status().message(), HasSubstr("is not resident at the end")) << label;
        }
        continue;
      }
      ++valid;
      EXPECT_EQ(r->peak_bytes, ref.peak) << label;
      EXPECT_EQ(r->host_peak_bytes, ref.host_peak) << label;
      EXPECT_EQ(r->transfer_bytes, ref.transfer) << label;
      EXPECT_DOUBLE_EQ(r->compute_cost, ref.compute_cost) << label;
      for (size_t k = 0; k < s.steps.size(); ++k) {
        ASSERT_EQ(r->timeline[k].device_bytes, ref.device[k]) << label << " step " << k;
        ASSERT_EQ(r->timeline[k].peak_bytes, ref.during[k]) << label << " step " << k;
        ASSERT_EQ(r->timeline[k].host_bytes, ref.host[k]) << label << " step " << k;
      }
      // The layout: one instance per storage lifetime, none for a view.
      auto layout = PlanMemoryLayout(g, s, LayoutOptions{.alignment = 1});
      ASSERT_TRUE(layout.ok()) << label << ": " << layout.status();
      EXPECT_TRUE(VerifyLayout(g, s, *layout).ok()) << label;
      EXPECT_EQ(layout->aligned_peak_bytes, r->peak_bytes) << label;
      for (const TensorInstance& inst : layout->instances) {
        EXPECT_FALSE(g.is_alias(inst.node)) << label << ": an instance of a view";
      }
    }
  }
  EXPECT_GT(aliased, 130);
  EXPECT_GT(valid, 300);
  EXPECT_GT(invalid, 100);
}

// ---------------------------------------------------------------- layout

TEST(AliasLayoutTest, OneInstancePerStorageLifetimeAndViewsAtTheBasesOffset) {
  const Graph g = MakeGraph({Node("b", 100), View("v", 100, "b"), Node("d", 10, {"b"}),
                             Node("e", 1, {"v"})},
                            {"d", "e"});
  const Schedule s = MakeSchedule(
      g, {{kC, "b"}, {kC, "v"}, {kC, "d"}, {kF, "b"}, {kC, "e"}, {kF, "v"}});
  auto instances = TensorInstances(g, s);
  ASSERT_TRUE(instances.ok());
  ASSERT_EQ(instances->size(), 3u);  // b's storage, d, e
  const TensorInstance& storage = (*instances)[0];
  EXPECT_EQ(storage.node, g.Find("b"));
  EXPECT_EQ(storage.first_step, 0);
  EXPECT_EQ(storage.last_step, 4);  // until the step before `free v`
  EXPECT_EQ(storage.bytes, 100);
  auto layout = PlanMemoryLayout(g, s);
  ASSERT_TRUE(layout.ok());
  EXPECT_TRUE(VerifyLayout(g, s, *layout).ok());
  EXPECT_EQ(layout->peak_bytes, 111);
}

// ---------------------------------------------------------------- fold / unfold

TEST(AliasFoldTest, HandTracedFoldAndUnfold) {
  // The example of Note [Alias folding].
  const Graph g = MakeGraph({Persistent("x", 1), Node("b", 100, {"x"}), View("v", 100, "b"),
                             Node("c", 10, {"v"}), Node("d", 20, {"b", "v"})},
                            {"c", "d"});
  auto folded = FoldAliases(g);
  ASSERT_TRUE(folded.ok()) << folded.status();
  const Graph& f = folded->graph;
  EXPECT_FALSE(f.has_aliases());
  EXPECT_EQ(f.num_nodes(), 4);
  EXPECT_EQ(f.Find("v"), kNoNode);
  const NodeId fd = f.Find("d");
  ASSERT_EQ(f.unique_inputs(fd).size(), 1u);  // b and v: one storage
  EXPECT_EQ(f.id(f.unique_inputs(fd)[0]), "b");
  EXPECT_EQ(f.id(f.unique_inputs(f.Find("c"))[0]), "b");
  const Schedule plan = MakeSchedule(f, {{kC, "b"}, {kC, "c"}, {kC, "d"}, {kF, "b"}});
  const Schedule unfolded = UnfoldSchedule(g, *folded, plan);
  EXPECT_EQ(unfolded, MakeSchedule(g, {{kC, "b"}, {kC, "v"}, {kC, "c"}, {kC, "d"}, {kF, "v"},
                                       {kF, "b"}}));
  EXPECT_EQ(MustSimulate(g, unfolded).peak_bytes, MustSimulate(f, plan).peak_bytes);
}

TEST(AliasFoldTest, OutputViewsChainsAndRecomputation) {
  // x -> b, v1 = view(b), v2 = view(v1) an output, c reads v2; the plan
  // recomputes b after an offload round trip.
  const Graph g = MakeGraph({Persistent("x", 1), Node("b", 100, {"x"}), View("v1", 100, "b"),
                             View("v2", 100, "v1"), Node("c", 10, {"v2"}), Node("e", 5, {"c"})},
                            {"v2", "e"});
  auto folded = FoldAliases(g);
  ASSERT_TRUE(folded.ok());
  const Graph& f = folded->graph;
  EXPECT_TRUE(f.is_output(f.Find("b")));  // the output view makes its root one
  const Schedule plan = MakeSchedule(
      f, {{kC, "b"}, {kC, "c"}, {kO, "b"}, {kF, "b"}, {kC, "e"}, {kF, "c"}, {kP, "b"}});
  const Schedule unfolded = UnfoldSchedule(g, *folded, plan);
  EXPECT_EQ(unfolded,
            MakeSchedule(g, {{kC, "b"}, {kC, "v1"}, {kC, "v2"}, {kC, "c"}, {kO, "b"}, {kF, "v2"},
                             {kF, "v1"}, {kF, "b"}, {kC, "e"}, {kF, "c"}, {kP, "b"},
                             {kC, "v1"}, {kC, "v2"}, {kF, "v1"}}));
  const PlanReport folded_report = MustSimulate(f, plan);
  const PlanReport r = MustSimulate(g, unfolded);
  EXPECT_EQ(r.peak_bytes, folded_report.peak_bytes);
  EXPECT_EQ(r.host_peak_bytes, folded_report.host_peak_bytes);
  EXPECT_EQ(r.transfer_bytes, folded_report.transfer_bytes);
}

// An unclipped gradient that is a view (Note [Clipping in the graph]) is
// made right after the compute that makes its root, not before its first
// reader, so that its all-reduce may come once the backward is done with it
// and join the others' (alias_fold.h); other views stay where they were.
// After a prefetch it is made before its reader, as any view.
TEST(AliasFoldTest, AnUnclippedGradientThatIsAViewIsMadeWithItsRoot) {
  NodeSpec p = Persistent("p", 4);
  p.role = Role::kParameter;
  const Graph g = MakeGraph(
      {Persistent("x", 1), p, Node("d", 100, {"x"}), View("unclipped_grad:p", 100, "d"),
       View("v", 100, "d"), Node("e", 10, {"x"}), Node("norm", 4, {"unclipped_grad:p", "v"}),
       Node("grad:p", 100, {"unclipped_grad:p", "norm"})},
      {"grad:p", "e"});
  auto folded = FoldAliases(g);
  ASSERT_TRUE(folded.ok()) << folded.status();
  const Graph& f = folded->graph;
  const Schedule plan = MakeSchedule(f, {{kC, "d"}, {kC, "e"}, {kC, "norm"}, {kO, "d"},
                                         {kF, "d"}, {kP, "d"}, {kC, "grad:p"}, {kF, "norm"},
                                         {kF, "d"}});
  const Schedule unfolded = UnfoldSchedule(g, *folded, plan);
  EXPECT_EQ(unfolded,
            MakeSchedule(g, {{kC, "d"}, {kC, "unclipped_grad:p"}, {kC, "e"}, {kC, "v"},
                             {kC, "norm"}, {kO, "d"}, {kF, "v"}, {kF, "unclipped_grad:p"},
                             {kF, "d"}, {kP, "d"}, {kC, "unclipped_grad:p"}, {kC, "grad:p"},
                             {kF, "norm"}, {kF, "unclipped_grad:p"}, {kF, "d"}}));
  EXPECT_EQ(MustSimulate(g, unfolded).peak_bytes, MustSimulate(f, plan).peak_bytes);
}

// Every policy, through MakePlanner (the wrapper), on graphs with views:
// valid plans, within the budget when feasible, and the unfolded plan's
// peak is the folded plan's.
TEST(AliasFoldTest, EveryPolicyPlansStoragesOnRandomGraphsWithViews) {
  std::vector<std::string> policies;
  for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
    if (!p->external) policies.push_back(p->name);
  }
  int planned = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const Graph g = RandomAliasDag(9 + static_cast<int>(seed % 4), 1000 + seed, seed % 4 != 0);
    ASSERT_TRUE(g.has_aliases());
    const bool exact = ViewsReadOnlyTheirBase(g);
    auto baseline = BaselinePeak(g);
    ASSERT_TRUE(baseline.ok());
    auto folded = FoldAliases(g);
    ASSERT_TRUE(folded.ok());
    // The baseline peak is the storage rule's: the folded graph's own
    // (never less: a folded reader keeps a view's other inputs).
    auto folded_baseline = BaselinePeak(folded->graph);
    ASSERT_TRUE(folded_baseline.ok());
    EXPECT_LE(*baseline, *folded_baseline) << seed;
    if (exact) {
      EXPECT_EQ(*baseline, *folded_baseline) << seed;
    }
    EXPECT_LE(PeakLowerBound(g), *baseline) << seed;
    EXPECT_LE(PeakLowerBound(g), PeakLowerBound(folded->graph)) << seed;
    for (const std::string& policy : policies) {
      for (const int64_t budget : {*baseline, kMinBudgetBytes}) {
        const std::string label = absl::StrCat("seed ", seed, " ", policy, " budget ", budget);
        PlannerOptions options;
        options.budget_bytes = budget;
        options.time_limit_s = 2;
        options.own_order = seed % 2 == 1;
        auto planner = MakePlanner(policy);
        ASSERT_TRUE(planner.ok());
        auto plan = (*planner)->Plan(g, options);
        if (!plan.ok()) {  // a policy that does not take this graph (a chain policy)
          EXPECT_NE(plan.status().code(), absl::StatusCode::kInternal) << label << plan.status();
          continue;
        }
        ++planned;
        auto r = Simulate(g, plan->schedule);
        ASSERT_TRUE(r.ok()) << label << ": " << r.status();
        EXPECT_EQ(r->peak_bytes, plan->report.peak_bytes) << label;
        if (budget != kMinBudgetBytes) {
          EXPECT_EQ(plan->feasible, r->peak_bytes <= budget) << label;
        }
        if (exact && (policy == "baseline" || policy == "best-order")) {
          EXPECT_TRUE(plan->feasible || budget == kMinBudgetBytes) << label;
        }
        // Fold, plan the folded graph, unfold: the peaks agree.
        auto inner = (*planner)->Plan(folded->graph, options);
        ASSERT_TRUE(inner.ok()) << label << ": " << inner.status();
        const Schedule unfolded = UnfoldSchedule(g, *folded, inner->schedule);
        auto u = Simulate(g, unfolded);
        ASSERT_TRUE(u.ok()) << label << ": " << u.status();
        EXPECT_EQ(u->peak_bytes, inner->report.peak_bytes) << label;
        EXPECT_EQ(u->host_peak_bytes, inner->report.host_peak_bytes) << label;
        EXPECT_EQ(u->transfer_bytes, inner->report.transfer_bytes) << label;
        // Every needed view is computed; a one-shot folded plan stays one-shot.
        if (inner->report.one_shot && inner->report.transfer_bytes == 0) {
          EXPECT_TRUE(u->one_shot) << label;
        }
      }
    }
  }
  EXPECT_GT(planned, 150);
}

TEST(AliasFoldTest, FoldUnfoldPeakEqualityOnManyRandomGraphs) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const Graph g = RandomAliasDag(5 + static_cast<int>(seed % 40), 5000 + seed);
    auto folded = FoldAliases(g);
    ASSERT_TRUE(folded.ok()) << seed;
    for (const char* policy : {"best-order", "chen-greedy", "sqrtn", "vdnn", "swap"}) {
      PlannerOptions options;
      options.budget_bytes = seed % 3 == 0 ? kMinBudgetBytes : PeakLowerBound(folded->graph);
      options.time_limit_s = 1;
      options.own_order = true;
      auto planner = MakePlanner(policy);
      ASSERT_TRUE(planner.ok());
      auto inner = (*planner)->Plan(folded->graph, options);
      ASSERT_TRUE(inner.ok()) << seed << " " << policy << ": " << inner.status();
      auto u = Simulate(g, UnfoldSchedule(g, *folded, inner->schedule));
      ASSERT_TRUE(u.ok()) << seed << " " << policy << ": " << u.status();
      EXPECT_EQ(u->peak_bytes, inner->report.peak_bytes) << seed << " " << policy;
      EXPECT_EQ(u->host_peak_bytes, inner->report.host_peak_bytes) << seed << " " << policy;
    }
  }
}

// A view that reads another tensor besides its base (expand_as) keeps it
// while the view's readers may run (alias_fold.h): 100% is the baseline
// policy's peak under that rule, so every one-shot policy fits it, and an
// exact policy's "optimal" says that it is over that model.
TEST(AliasFoldTest, AViewThatReadsAnotherTensorKeepsItAndTheBaselineFits) {
  const Graph g = MakeGraph({Node("a", 1, {}), Node("s", 2, {}), View("v", 3, "a", {"s", "a"}),
                             Node("big", 4, {})},
                            {"v", "big"});
  EXPECT_EQ(AliasesReadingOthers(g), 1);
  // Freed at its last use, s would be gone before big: 5 bytes. Kept with
  // the output view, 7.
  absl::StatusOr<int64_t> baseline_peak = BaselinePeak(g);
  ASSERT_TRUE(baseline_peak.ok()) << baseline_peak.status();
  EXPECT_EQ(*baseline_peak, 7);
  for (const char* policy : {"baseline", "best-order", "greedy", "exact-order", "checkmate",
                             "exact"}) {
    SCOPED_TRACE(policy);
    PlannerOptions options;
    options.budget_bytes = *baseline_peak;
    absl::StatusOr<PlanResult> r = (*MakePlanner(policy))->Plan(g, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->feasible) << r->message;
    EXPECT_EQ(r->details.value("aliases_reading_others", 0), 1);
    if (absl::StartsWith(r->message, "optimal")) {
      EXPECT_THAT(r->message, HasSubstr("1 view that reads another tensor keeps it"));
    }
  }
  // Views of their base alone fold as before: the peak freed at last use.
  const Graph plain = MakeGraph({Node("a", 1, {}), View("v", 1, "a"), Node("big", 4, {})},
                                {"v", "big"});
  EXPECT_EQ(AliasesReadingOthers(plain), 0);
}

TEST(AliasFoldTest, GraphsWithoutAliasesGoThroughUntouched) {
  // The wrapper hands such a graph to the policy as it is: the same plan as
  // the registered factory's.
  auto zoo = BuildModel("mnist-cnn:batch=2");
  ASSERT_TRUE(zoo.ok());
  for (const Graph& g : {testing::RandomDag(30, 7), *zoo}) {
    ASSERT_FALSE(g.has_aliases());
    for (const char* policy : {"baseline", "best-order", "greedy", "sqrtn", "rotor", "dtr",
                               "vdnn"}) {
      PlannerOptions options;
      options.budget_bytes = kMinBudgetBytes;
      options.own_order = true;
      auto wrapped = MakePlanner(policy);
      ASSERT_TRUE(wrapped.ok());
      auto a = (*wrapped)->Plan(g, options);
      auto b = PlannerRegistry::Global().Find(policy)->factory()->Plan(g, options);
      ASSERT_EQ(a.ok(), b.ok()) << policy;
      if (!a.ok()) continue;
      EXPECT_EQ(a->schedule, b->schedule) << policy;
      EXPECT_FALSE(a->details.contains("folded_aliases")) << policy;
    }
  }
}

// Policies from outside (a C++ or Python function, an exec: program) plan
// the folded graph too: they never see a view, and their plans are
// unfolded and judged on the graph itself.
TEST(AliasFoldTest, OutsidePoliciesPlanTheFoldedGraph) {
  bool saw_view = false;
  ASSERT_TRUE(RegisterExternalPolicy("alias-test-outside", "free at last use", PlanKind::kOneShot,
                                     [&](const Graph& graph, const PlannerOptions&) {
                                       saw_view = saw_view || graph.has_aliases();
                                       return FreeAtLastUse(graph, DefaultOrder(graph));
                                     })
                  .ok());
  const std::string program = absl::StrCat("exec:python3 ", PEBBLE_SOURCE_DIR,
                                           "/examples/policies/greedy_order.py");
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Graph g = RandomAliasDag(12, 9000 + seed, false);
    auto baseline = BaselinePeak(g);
    ASSERT_TRUE(baseline.ok());
    for (const std::string& policy : {std::string("alias-test-outside"), program}) {
      if (policy == program && seed > 2) continue;  // a process per plan: a few suffice
      PlannerOptions options;
      options.budget_bytes = *baseline;
      auto planner = MakePlanner(policy);
      ASSERT_TRUE(planner.ok()) << planner.status();
      auto plan = (*planner)->Plan(g, options);
      ASSERT_TRUE(plan.ok()) << policy << ": " << plan.status();
      auto r = Simulate(g, plan->schedule);
      ASSERT_TRUE(r.ok()) << policy << ": " << r.status();
      EXPECT_EQ(r->peak_bytes, plan->report.peak_bytes) << policy;
      EXPECT_EQ(plan->details["folded_aliases"], g.num_aliases()) << policy;
    }
    // Free at last use of the graph's own order, folded: the baseline.
    auto own = MakePlanner("alias-test-outside");
    PlannerOptions options;
    auto plan = (*own)->Plan(g, options);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->report.peak_bytes, *baseline) << seed;
  }
  EXPECT_FALSE(saw_view);
  ASSERT_TRUE(UnregisterExternalPolicy("alias-test-outside").ok());
}

// ---------------------------------------------------------------- autodiff, executor

// conv -> relu -> flatten (a view when `views`) -> linear -> cross-entropy.
Graph SmallNet(bool views) {
  NetBuilder nb(views ? "views" : "copies");
  const Value x = nb.Input("input", {2, 3, 6, 6});
  const Value c = nb.Conv("conv1", x, 4, 3, 1, 1);
  const Value r = nb.Relu(c);
  const Value f = nb.Apply("flatten", {r}, {{"start_dim", 1}}, "flat");
  if (views) nb.SetAliasOf(f, r);
  const Value y = nb.Linear("fc", f, 5);
  const Value t = nb.Input("target", {2}, DType::kInt64);
  nb.Apply("softmax_cross_entropy", {y, t}, nlohmann::json::object(), "loss");
  return testing::TrainingGraph(nb);
}

TEST(AliasAutodiffTest, TheGradientOfAViewIsAViewOfTheIncomingGradient) {
  const Graph g = SmallNet(true);
  const NodeId flat = g.Find("flat");
  ASSERT_NE(flat, kNoNode);
  EXPECT_EQ(g.alias_of(flat), g.Find("relu_1"));
  // The gradient of relu_1 (flatten's input) is a view of grad:flat.
  const NodeId grad = g.Find("grad:relu_1");
  ASSERT_NE(grad, kNoNode);
  EXPECT_EQ(g.alias_of(grad), g.Find("grad:flat"));
  EXPECT_EQ(g.op(grad), "reshape");
  const Graph copies = SmallNet(false);
  EXPECT_FALSE(copies.has_aliases());
  EXPECT_EQ(copies.num_nodes(), g.num_nodes());
  auto with_views = BaselinePeak(g);
  auto without = BaselinePeak(copies);
  ASSERT_TRUE(with_views.ok() && without.ok());
  EXPECT_LT(*with_views, *without);
}

TEST(AliasExecutorTest, ViewsRunInTheirStoragesMemoryAndPeaksMatch) {
  const Graph views = SmallNet(true);
  const Graph copies = SmallNet(false);
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  auto reference = Execute(copies, *FreeAtLastUse(copies, DefaultOrder(copies)), *backend);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto baseline = BaselinePeak(views);
  ASSERT_TRUE(baseline.ok());
  for (const char* policy : {"baseline", "best-order", "sqrtn", "dtr", "checkmate-lp", "vdnn"}) {
    for (const int64_t budget : {*baseline, kMinBudgetBytes}) {
      PlannerOptions options;
      options.budget_bytes = budget;
      options.time_limit_s = 5;
      auto planner = MakePlanner(policy);
      ASSERT_TRUE(planner.ok());
      auto plan = (*planner)->Plan(views, options);
      ASSERT_TRUE(plan.ok()) << policy << ": " << plan.status();
      auto run = Execute(views, plan->schedule, *backend);
      ASSERT_TRUE(run.ok()) << policy << ": " << run.status();
      EXPECT_EQ(run->peak_bytes, plan->report.peak_bytes) << policy;
      EXPECT_EQ(run->peak_bytes, run->predicted.peak_bytes) << policy;
      // Bitwise the same numbers as the graph whose reshapes copy.
      ASSERT_EQ(run->outputs.size(), reference->outputs.size());
      for (size_t i = 0; i < run->outputs.size(); ++i) {
        const HostTensor& a = run->outputs[i];
        const HostTensor* b = reference->FindOutput(copies, views.id(a.node));
        ASSERT_NE(b, nullptr) << views.id(a.node);
        EXPECT_EQ(a.array.shape, b->array.shape) << views.id(a.node);
        EXPECT_EQ(a.array.data, b->array.data) << policy << " " << views.id(a.node);
      }
    }
  }
}

TEST(AliasExecutorTest, ViewsItCannotRunAreRefusedBeforeRunning) {
  // A transpose is a strided view: the contiguous backends cannot run it.
  NetBuilder nb("transposed");
  const Value x = nb.Input("x", {2, 3});
  const Value r = nb.Apply("relu", {x});
  const Value t = nb.Apply("transpose", {r}, {{"perm", {1, 0}}}, "t");
  nb.SetAliasOf(t, r);
  nb.Apply("relu", {t}, nlohmann::json::object(), "out");
  auto g = nb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  auto run = Execute(*g, *FreeAtLastUse(*g, DefaultOrder(*g)), *backend);
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("node 't' (op transpose, an alias of 'relu_1')"));
  EXPECT_EQ(backend->MemoryStats().device_bytes_peak, 0);

  // A slice is not a contiguous reshape either.
  NetBuilder nb2("sliced");
  const Value x2 = nb2.Input("x", {4, 3});
  const Value r2 = nb2.Apply("relu", {x2});
  const Value s2 = nb2.Apply("slice", {r2}, {{"axis", 0}, {"begin", 0}, {"end", 2}}, "s");
  nb2.SetAliasOf(s2, r2);
  nb2.Apply("relu", {s2}, nlohmann::json::object(), "out");
  auto g2 = nb2.Build();
  ASSERT_TRUE(g2.ok()) << g2.status();
  auto run2 = Execute(*g2, *FreeAtLastUse(*g2, DefaultOrder(*g2)), *backend);
  ASSERT_FALSE(run2.ok());
  EXPECT_THAT(run2.status().message(), HasSubstr("node 's' (op slice"));

  // A reshape-like view whose bytes are not its storage's.
  auto typed = [](NodeSpec s, Shape shape) {
    s.shape = std::move(shape);
    s.dtype = DType::kFloat32;
    return s;
  };
  NodeSpec r3 = typed(Node("r", 48, {"x"}), {4, 3});
  r3.op = "relu";
  NodeSpec s3 = typed(View("s", 24, "r"), {2, 3});
  s3.op = "identity";
  NodeSpec o3 = typed(Node("out", 24, {"s"}), {2, 3});
  o3.op = "relu";
  const Graph g3 = MakeGraph({typed(Persistent("x", 48), {4, 3}), r3, s3, o3}, {"out"});
  auto run3 = Execute(g3, *FreeAtLastUse(g3, DefaultOrder(g3)), *backend);
  ASSERT_FALSE(run3.ok());
  EXPECT_THAT(run3.status().message(),
              HasSubstr("node 's' (op identity, an alias of 'r') is fp32(2,3) (24 bytes) but its "
                        "storage 'r' is fp32(4,3) (48 bytes)"));
  EXPECT_EQ(backend->MemoryStats().device_bytes_peak, 0);
}

}  // namespace
}  // namespace pebble
