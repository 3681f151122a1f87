// The one-shot order policies (scheduler/orders.h): pebbling numbers of the
// classic graph families, hand-traced examples, an independent brute force
// over all topological orders, and property tests over seeded random DAGs
// and in-trees.
#include "scheduler/orders.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "gtest/gtest.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"
#include "tests/test_util.h"

namespace pebble {
namespace {

using ::pebble::testing::MakeGraph;
using ::pebble::testing::Node;
using ::pebble::testing::Persistent;
using ::pebble::testing::RandomDag;
using ::testing::HasSubstr;
using ::testing::Not;

const char* const kOrderPolicies[] = {"baseline", "dfs", "greedy", "tree",
                                      "exact-order", "best-order"};

// Unit-size graph families (bytes = 1, nothing persistent, no workspace):
// their peak is the black-pebbling number without sliding (SPEC section 2).
Graph Path(int n) {
  std::vector<NodeSpec> nodes;
  for (int i = 0; i < n; ++i) {
    nodes.push_back(Node(absl::StrCat("p", i), 1,
                         i == 0 ? std::vector<std::string>{}
                                : std::vector<std::string>{absl::StrCat("p", i - 1)}));
  }
  return MakeGraph(std::move(nodes), {absl::StrCat("p", n - 1)}, "path");
}

// Levels 0 (bottom, h+1 nodes) to h (apex); L<l>_<i> reads L<l-1>_<i> and
// L<l-1>_<i+1>.
Graph Pyramid(int h) {
  std::vector<NodeSpec> nodes;
  for (int l = 0; l <= h; ++l) {
    for (int i = 0; i + l <= h; ++i) {
      std::vector<std::string> inputs;
      if (l > 0) {
        inputs = {absl::StrCat("L", l - 1, "_", i), absl::StrCat("L", l - 1, "_", i + 1)};
      }
      nodes.push_back(Node(absl::StrCat("L", l, "_", i), 1, inputs));
    }
  }
  return MakeGraph(std::move(nodes), {absl::StrCat("L", h, "_0")}, "pyramid");
}

// Complete binary in-tree of height h: 2^h leaves, the root the output.
Graph BinaryTree(int h) {
  std::vector<NodeSpec> nodes;
  for (int l = 0; l <= h; ++l) {
    for (int i = 0; i < (1 << (h - l)); ++i) {
      std::vector<std::string> inputs;
      if (l > 0) {
        inputs = {absl::StrCat("T", l - 1, "_", 2 * i), absl::StrCat("T", l - 1, "_", 2 * i + 1)};
      }
      nodes.push_back(Node(absl::StrCat("T", l, "_", i), 1, inputs));
    }
  }
  return MakeGraph(std::move(nodes), {absl::StrCat("T", h, "_0")}, "tree");
}

// A seeded random in-forest: each node reads up to 3 nodes nobody reads yet
// (or the persistent w), random sizes and workspaces; the unread nodes are
// the outputs, and a few nodes with a reader are outputs too.
Graph RandomInTree(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NodeSpec> nodes;
  nodes.push_back(Persistent("w", 1 + static_cast<int64_t>(rng() % 30)));
  std::vector<std::string> unread;
  std::vector<std::string> outputs;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> inputs;
    const int fan_in = static_cast<int>(rng() % 4);
    for (int k = 0; k < fan_in && !unread.empty(); ++k) {
      const size_t pick = rng() % unread.size();
      inputs.push_back(unread[pick]);
      if (rng() % 8 == 0) outputs.push_back(unread[pick]);
      unread.erase(unread.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    if (rng() % 3 == 0) inputs.push_back("w");
    const std::string id = absl::StrCat("t", i);
    nodes.push_back(Node(id, 1 + static_cast<int64_t>(rng() % 100), inputs, 1.0,
                         rng() % 4 == 0 ? static_cast<int64_t>(rng() % 50) : 0));
    unread.push_back(id);
  }
  outputs.insert(outputs.end(), unread.begin(), unread.end());
  return MakeGraph(std::move(nodes), outputs, absl::StrCat("in-tree-", seed));
}

PlannerOptions Budget(int64_t bytes) {
  PlannerOptions options;
  options.budget_bytes = bytes;
  return options;
}

PlannerOptions TimeLimit(double seconds) {
  PlannerOptions options;
  options.time_limit_s = seconds;
  return options;
}

// 12 chains of 4 growing tensors (chain c's i-th: `base` + i + c % `spread`
// bytes) hanging off one shared source x (so not a tree), every chain end
// an output: no free moves, the optimum is above the static lower bound,
// and there are about 5^12 computed-sets.
Graph WideChains(const std::string& name, int64_t base, int spread) {
  std::vector<NodeSpec> nodes = {Node("x", 1)};
  std::vector<std::string> ends;
  for (int c = 0; c < 12; ++c) {
    for (int i = 0; i < 4; ++i) {
      nodes.push_back(Node(absl::StrCat("c", c, "_", i), base + i + c % spread,
                           {i == 0 ? std::string("x") : absl::StrCat("c", c, "_", i - 1)}));
    }
    ends.push_back(absl::StrCat("c", c, "_3"));
  }
  return MakeGraph(std::move(nodes), ends, name);
}

// Plans with `policy`; checks that the plan is one-shot and that the
// simulator agrees with the report.
PlanResult PlanOrDie(const Graph& g, absl::string_view policy,
                     PlannerOptions options = {}) {
  auto planner = MakePlanner(policy);
  EXPECT_TRUE(planner.ok()) << planner.status();
  if (!planner.ok()) return PlanResult();
  auto result = (*planner)->Plan(g, options);
  EXPECT_TRUE(result.ok()) << policy << " on " << g.name() << ": " << result.status();
  if (!result.ok()) return PlanResult();
  auto sim = Simulate(g, result->schedule);
  EXPECT_TRUE(sim.ok()) << policy << ": " << sim.status();
  if (sim.ok()) {
    EXPECT_EQ(sim->peak_bytes, result->report.peak_bytes) << policy;
    EXPECT_TRUE(sim->one_shot) << policy;
    EXPECT_EQ(sim->transfer_bytes, 0) << policy;
  }
  return *std::move(result);
}

int64_t Peak(const Graph& g, absl::string_view policy) {
  return PlanOrDie(g, policy, Budget(PlannerOptions::kMinBudget))
      .report.peak_bytes;
}

// ---------------------------------------------------------------------------
// Pebbling numbers (unit sizes).

TEST(PebblingNumbersTest, PathNeedsTwo) {
  for (int n : {2, 3, 10, 100}) {
    Graph g = Path(n);
    for (const char* policy : kOrderPolicies) {
      EXPECT_EQ(Peak(g, policy), 2) << policy << " n=" << n;
    }
  }
  EXPECT_EQ(Peak(Path(1), "exact-order"), 1);
}

TEST(PebblingNumbersTest, PyramidNeedsHeightPlusTwo) {
  for (int h = 1; h <= 6; ++h) {
    Graph g = Pyramid(h);
    EXPECT_EQ(Peak(g, "exact-order"), h + 2) << "h=" << h;
    EXPECT_EQ(Peak(g, "best-order"), h + 2) << "h=" << h;
    EXPECT_GE(Peak(g, "greedy"), h + 2) << "h=" << h;
  }
  // Beyond exact-order's comfort zone the heuristics still reach it.
  EXPECT_EQ(Peak(Pyramid(12), "best-order"), 14);
}

TEST(PebblingNumbersTest, BinaryTreeNeedsHeightPlusTwo) {
  for (int h = 1; h <= 10; ++h) {
    Graph g = BinaryTree(h);
    EXPECT_EQ(Peak(g, "tree"), h + 2) << "h=" << h;
    EXPECT_EQ(Peak(g, "dfs"), h + 2) << "h=" << h;
    EXPECT_EQ(Peak(g, "best-order"), h + 2) << "h=" << h;
    if (h <= 4) {
      EXPECT_EQ(Peak(g, "exact-order"), h + 2) << "h=" << h;
    }
  }
}

// ---------------------------------------------------------------------------
// Hand-traced examples.

// f(x) + g(x) + h(x) with x persistent (0 bytes, so the counts are of
// activations), unit-size a = f(x), b = g(x), c = h(x), s1 = a + b,
// s2 = s1 + c. The graph's own order a b c s1 s2 holds a, b, c and s1
// while s1 is computed: 4 units. Computing s1 before c: a b s1 (3), then
// s1 c s2 (3): 3 units. (Under SPEC's semantics an output and its inputs are
// both resident while it is computed, so this example is 4 vs 3, not the
// 3 vs 2 of a model that computes in place.)
TEST(OrderExamplesTest, SumOfThreeFunctionsDependsOnOrder) {
  Graph g = MakeGraph({Persistent("x", 0), Node("a", 1, {"x"}), Node("b", 1, {"x"}),
                       Node("c", 1, {"x"}), Node("s1", 1, {"a", "b"}),
                       Node("s2", 1, {"s1", "c"})},
                      {"s2"}, "fgh");
  EXPECT_EQ(Peak(g, "baseline"), 4);
  for (const char* policy : {"dfs", "greedy", "exact-order", "best-order"}) {
    EXPECT_EQ(Peak(g, policy), 3) << policy;
  }
  PlanResult best = PlanOrDie(g, "best-order");
  EXPECT_NE(best.details["winner"], "baseline");
  EXPECT_EQ(best.details["optimal"], true);
}

// The counterexample of orders.h: greedy holds d from the start.
TEST(OrderExamplesTest, GreedyIsNotOptimal) {
  Graph g = MakeGraph({Node("x", 1), Node("y", 1, {"x"}), Node("z", 1, {"x", "y"}),
                       Node("d", 1, {"x"}), Node("o1", 1, {"z", "d"}),
                       Node("o2", 1, {"x", "y"})},
                      {"o1", "o2"}, "greedy-trap");
  auto peak = [&](GreedyDirection d) { return *OrderPeak(g, *GreedyOrder(g, d)); };
  EXPECT_EQ(peak(GreedyDirection::kForward), 5);
  EXPECT_EQ(peak(GreedyDirection::kReverse), 5);
  EXPECT_EQ(Peak(g, "greedy"), 5);
  EXPECT_EQ(Peak(g, "exact-order"), 4);
  EXPECT_EQ(Peak(g, "best-order"), 4);
}

// Two chains a1 (10) -> a2 (1) -> a3 (5) and b1 -> b2 -> b3 alike; r (1)
// reads a3 and b3. A post-order finishes one chain (holding 5) and runs the
// other (peak 11 during a2/b2): 16. Liu's order stops each chain at its
// valley (the 1-byte a2, b2): a1 a2 b1 b2 a3 b3 r peaks at 12, during b2
// (a2 1 + b1 10 + b2 1).
TEST(TreeTest, BeatsEveryPostOrder) {
  Graph g = MakeGraph({Node("a1", 10), Node("a2", 1, {"a1"}), Node("a3", 5, {"a2"}),
                       Node("b1", 10), Node("b2", 1, {"b1"}), Node("b3", 5, {"b2"}),
                       Node("r", 1, {"a3", "b3"})},
                      {"r"}, "hills");
  EXPECT_EQ(Peak(g, "dfs"), 16);
  EXPECT_EQ(Peak(g, "tree"), 12);
  EXPECT_EQ(Peak(g, "exact-order"), 12);
  auto order = TreeOrder(g);
  ASSERT_TRUE(order.ok());
  std::vector<std::string> ids;
  for (NodeId v : *order) ids.push_back(g.id(v));
  EXPECT_THAT(ids, ::testing::ElementsAre("a1", "a2", "b1", "b2", "a3", "b3", "r"));
}

TEST(TreeTest, RefusesADiamondNamingTheNode) {
  Graph g = MakeGraph({Node("a", 1), Node("b", 1, {"a"}), Node("c", 1, {"a"}),
                       Node("d", 1, {"b", "c"})},
                      {"d"}, "diamond");
  auto order = TreeOrder(g);
  ASSERT_FALSE(order.ok());
  EXPECT_EQ(order.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(order.status().message()),
              HasSubstr("node 'a' has two readers, 'b' and 'c'"));
  auto planner = MakePlanner("tree");
  ASSERT_TRUE(planner.ok());
  EXPECT_FALSE((*planner)->Plan(g, {}).ok());
  // best-order skips it and says why.
  PlanResult best = PlanOrDie(g, "best-order");
  bool saw_tree = false;
  for (const auto& c : best.details["candidates"]) {
    if (c["policy"] == "tree") {
      saw_tree = true;
      EXPECT_THAT(c["skipped"].get<std::string>(), HasSubstr("two readers"));
    }
  }
  EXPECT_TRUE(saw_tree);
}

TEST(TreeTest, PersistentLeavesWithManyReadersAreAllowed) {
  Graph g = MakeGraph({Persistent("w", 7), Node("a", 3, {"w"}), Node("b", 4, {"w"}),
                       Node("c", 2, {"a", "b", "w"})},
                      {"c"});
  EXPECT_TRUE(CheckInTree(g).ok());
  // Either order: w + a + b + c = 16 while c is computed.
  EXPECT_EQ(Peak(g, "tree"), 16);
}

// Workspace counts only during its compute, in every policy's peak.
TEST(OrderExamplesTest, WorkspaceDecidesTheOrder) {
  // a (1, workspace 10) and b (5) feed c (1). b first: 5 + 1 + 10 = 16;
  // a first: 1 + 10 = 11, then 1 + 5 = 6, then 7: peak 11.
  Graph g = MakeGraph({Node("b", 5), Node("a", 1, {}, 1.0, 10), Node("c", 1, {"a", "b"})},
                      {"c"});
  EXPECT_EQ(Peak(g, "baseline"), 16);
  EXPECT_EQ(Peak(g, "exact-order"), 11);
  EXPECT_EQ(Peak(g, "tree"), 11);
  EXPECT_EQ(Peak(g, "best-order"), 11);
}

TEST(OrderExamplesTest, OutputsWithReadersStayResident) {
  // a is an output and read by b: it is never freed.
  Graph g = MakeGraph({Node("a", 4), Node("b", 2, {"a"}), Node("c", 3, {"b"})},
                      {"a", "c"});
  for (const char* policy : kOrderPolicies) {
    EXPECT_EQ(Peak(g, policy), 9) << policy;  // a + b + c during c
  }
}

TEST(OrderExamplesTest, NothingToComputeGivesAnEmptyPlan) {
  Graph g = MakeGraph({Persistent("w", 7), Node("unused", 5, {"w"})}, {"w"});
  for (const char* policy : kOrderPolicies) {
    PlanResult r = PlanOrDie(g, policy);
    EXPECT_TRUE(r.schedule.steps.empty()) << policy;
    EXPECT_EQ(r.report.peak_bytes, 7) << policy;
  }
}

TEST(OrderExamplesTest, DetailsSayWhatRan) {
  Graph g = RandomDag(12, 4);
  PlanResult exact = PlanOrDie(g, "exact-order");
  EXPECT_EQ(exact.details["optimal"], true);
  EXPECT_LE(exact.details["lower_bound_bytes"].get<int64_t>(), exact.report.peak_bytes);
  EXPECT_GE(exact.details["heuristic_peak_bytes"].get<int64_t>(), exact.report.peak_bytes);
  PlanResult greedy = PlanOrDie(g, "greedy");
  EXPECT_EQ(std::min(greedy.details["forward_peak_bytes"].get<int64_t>(),
                     greedy.details["reverse_peak_bytes"].get<int64_t>()),
            greedy.report.peak_bytes);
  PlanResult best = PlanOrDie(g, "best-order");
  EXPECT_EQ(best.details["optimal"], true);
  ASSERT_EQ(best.details["candidates"].size(), 5u);
  for (const auto& c : best.details["candidates"]) {
    if (c.contains("peak_bytes")) {
      EXPECT_GE(c["peak_bytes"].get<int64_t>(), best.report.peak_bytes) << c.dump();
    }
  }
}

// ---------------------------------------------------------------------------
// OrderPeak is the simulator's peak.

TEST(OrderPeakTest, AgreesWithTheSimulator) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Graph g = RandomDag(30, seed);
    std::vector<std::vector<NodeId>> orders = {DefaultOrder(g)};
    for (auto order : {DfsOrder(g), GreedyOrder(g, GreedyDirection::kForward),
                       GreedyOrder(g, GreedyDirection::kReverse)}) {
      ASSERT_TRUE(order.ok());
      orders.push_back(*order);
    }
    for (const auto& order : orders) {
      auto schedule = FreeAtLastUse(g, order);
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      auto sim = Simulate(g, *schedule);
      ASSERT_TRUE(sim.ok()) << sim.status();
      auto peak = OrderPeak(g, order);
      ASSERT_TRUE(peak.ok());
      EXPECT_EQ(*peak, sim->peak_bytes) << "seed " << seed;
    }
  }
  Graph g = Path(3);
  EXPECT_FALSE(OrderPeak(g, {g.Find("p1"), g.Find("p0"), g.Find("p2")}).ok());
  EXPECT_FALSE(OrderPeak(g, {g.Find("p0"), g.Find("p1")}).ok());
}

// ---------------------------------------------------------------------------
// Brute force: every topological order of small random DAGs.

int64_t BruteForceMinPeak(const Graph& g) {
  const std::vector<NodeId> nodes = DefaultOrder(g);
  std::vector<NodeId> order;
  std::vector<bool> used(g.num_nodes(), false);
  int64_t best = INT64_MAX;
  std::function<void()> rec = [&] {
    if (order.size() == nodes.size()) {
      best = std::min(best, *OrderPeak(g, order));
      return;
    }
    for (NodeId v : nodes) {
      if (used[v]) continue;
      bool ready = true;
      for (NodeId u : g.unique_inputs(v)) ready = ready && (g.persistent(u) || used[u]);
      if (!ready) continue;
      used[v] = true;
      order.push_back(v);
      rec();
      order.pop_back();
      used[v] = false;
    }
  };
  rec();
  return best;
}

TEST(ExactOrderTest, EqualsBruteForceOnSmallRandomDags) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    Graph g = RandomDag(2 + static_cast<int>(seed % 7), 1000 + seed);
    ExactOrderStats stats;
    auto order = ExactOrder(g, {}, &stats);
    ASSERT_TRUE(order.ok()) << order.status();
    EXPECT_EQ(*OrderPeak(g, *order), BruteForceMinPeak(g)) << "seed " << seed;
    EXPECT_EQ(stats.peak_bytes, *OrderPeak(g, *order));
    EXPECT_LE(stats.lower_bound, stats.peak_bytes);
    EXPECT_GE(stats.upper_bound, stats.peak_bytes);
  }
}

TEST(ExactOrderTest, EqualsBruteForceWithUnitSizes) {
  // Unit sizes make many ties: the free-move rule and the tie-breaks must
  // not lose the optimum.
  for (uint64_t seed = 0; seed < 150; ++seed) {
    Graph r = RandomDag(8, 5000 + seed);
    std::vector<NodeSpec> nodes;
    for (NodeId v = 0; v < r.num_nodes(); ++v) {
      NodeSpec s = SpecOf(r, v);
      s.bytes = 1;
      s.workspace = 0;
      nodes.push_back(std::move(s));
    }
    std::vector<std::string> outputs;
    for (NodeId o : r.outputs()) outputs.push_back(r.id(o));
    Graph g = MakeGraph(std::move(nodes), outputs);
    auto order = ExactOrder(g);
    ASSERT_TRUE(order.ok()) << order.status();
    EXPECT_EQ(*OrderPeak(g, *order), BruteForceMinPeak(g)) << "seed " << seed;
  }
}

TEST(ExactOrderTest, LimitsAreErrors) {
  ExactOrderLimits limits;
  limits.max_nodes = 50;
  auto too_big = ExactOrder(Path(51), limits);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("limit of 50"));

  Graph wide = WideChains("wide", 2, 3);
  ExactOrderLimits few_states;
  few_states.max_states = 1000;
  auto exhausted = ExactOrder(wide, few_states);
  ASSERT_FALSE(exhausted.ok());
  EXPECT_EQ(exhausted.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(exhausted.status().message()), HasSubstr("1000 states"));
  ExactOrderLimits no_time;
  no_time.time_limit_s = 0;
  auto timed_out = ExactOrder(wide, no_time);
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(timed_out.status().message()), HasSubstr("time limit"));
  // best-order still plans it, skipping exact-order with the reason.
  PlanResult best = PlanOrDie(wide, "best-order", TimeLimit(0));
  ASSERT_EQ(best.details["candidates"].size(), 5u);
  EXPECT_THAT(best.details["candidates"][4]["skipped"].get<std::string>(),
              HasSubstr("time limit"));
  EXPECT_EQ(best.details["optimal"], false);
}

// Note [exact-order's searches remembered]: once best-order's search passed
// its state limit on a graph, later plans of that graph in the process skip
// it (the same plan, at once); another limit searches again.
TEST(BestOrderTest, AGraphTooWideForExactOrderIsNotSearchedAgain) {
  const Graph wide = WideChains("wider", 3, 4);
  const PlanResult first = PlanOrDie(wide, "best-order");
  ASSERT_EQ(first.details["candidates"].size(), 5u);
  const std::string searched = first.details["candidates"][4]["skipped"].get<std::string>();
  EXPECT_THAT(searched, HasSubstr("passed its limit of 250000 states"));
  EXPECT_THAT(searched, Not(HasSubstr("before")));
  const PlanResult again = PlanOrDie(wide, "best-order");
  EXPECT_THAT(again.details["candidates"][4]["skipped"].get<std::string>(),
              HasSubstr("on this graph before (the graph is too wide); not searched again"));
  EXPECT_EQ(again.schedule, first.schedule);
  ExactOrderLimits few_states;
  few_states.max_states = 1000;
  absl::StatusOr<std::vector<NodeId>> limited = ExactOrder(wide, few_states);
  ASSERT_FALSE(limited.ok());
  EXPECT_THAT(std::string(limited.status().message()), Not(HasSubstr("before")));
}

// Note [exact-order's searches remembered]: a later plan of a graph that
// exact-order solved takes the order it found (the same plan), and a graph
// that differs in one byte is searched again.
TEST(BestOrderTest, AnOrderExactOrderFoundIsRemembered) {
  // (one byte changed: a graph no other test plans, whose search is this test's)
  nlohmann::json own = GraphToJson(*BuildModel("linear:n=6"));
  own["nodes"].back()["bytes"] = own["nodes"].back()["bytes"].get<int64_t>() + 3;
  const Graph solved = *GraphFromJson(own);
  auto exact_candidate = [](const PlanResult& plan) {
    for (const nlohmann::json& c : plan.details["candidates"]) {
      if (c["policy"] == "exact-order") return c;
    }
    return nlohmann::json();
  };
  const PlanResult first = PlanOrDie(solved, "best-order");
  ASSERT_TRUE(exact_candidate(first).contains("peak_bytes")) << first.details.dump();
  EXPECT_FALSE(exact_candidate(first).contains("remembered"));
  const PlanResult again = PlanOrDie(solved, "best-order");
  EXPECT_EQ(exact_candidate(again).value("remembered", false), true);
  EXPECT_EQ(again.schedule, first.schedule);
  EXPECT_EQ(again.report.peak_bytes, first.report.peak_bytes);
  nlohmann::json edited = GraphToJson(solved);
  edited["nodes"].back()["bytes"] = edited["nodes"].back()["bytes"].get<int64_t>() + 1;
  const Graph other = *GraphFromJson(edited);
  EXPECT_FALSE(exact_candidate(PlanOrDie(other, "best-order")).contains("remembered"));
}

TEST(ExactOrderTest, HandlesTrainingGraphsInSeconds) {
  for (const char* model : {"conv3d:n=16", "linear:n=12", "tanh-chain:length=8,size=1000"}) {
    auto g = BuildModel(model);
    ASSERT_TRUE(g.ok()) << model << ": " << g.status();
    const auto start = std::chrono::steady_clock::now();
    ExactOrderStats stats;
    auto order = ExactOrder(*g, {}, &stats);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(order.ok()) << model << ": " << order.status();
    EXPECT_LT(seconds, 10.0) << model;
    const int64_t exact = *OrderPeak(*g, *order);
    for (const char* policy : {"baseline", "dfs", "greedy"}) {
      EXPECT_LE(exact, Peak(*g, policy)) << model << " " << policy;
    }
    EXPECT_EQ(Peak(*g, "best-order"), exact) << model;
  }
}

// ---------------------------------------------------------------------------
// Property tests on seeded random graphs.

TEST(OrderPropertyTest, EveryPolicyIsValidOneShotAndNeverBelowExact) {
  int exact_runs = 0;
  for (uint64_t seed = 0; seed < 250; ++seed) {
    const int n = 3 + static_cast<int>(seed % 23);
    Graph g = RandomDag(n, seed);
    ExactOrderLimits limits;
    limits.max_states = 200'000;
    auto exact_order = ExactOrder(g, limits);
    const int64_t baseline = Peak(g, "baseline");
    int64_t exact = -1;
    if (exact_order.ok()) {
      exact = *OrderPeak(g, *exact_order);
      ++exact_runs;
    }
    for (const char* policy : {"baseline", "dfs", "greedy", "best-order"}) {
      const int64_t peak = Peak(g, policy);
      if (exact >= 0) {
        EXPECT_GE(peak, exact) << policy << " seed " << seed;
      }
    }
    const int64_t best = Peak(g, "best-order");
    EXPECT_LE(best, baseline) << "seed " << seed;
    if (exact >= 0) {
      EXPECT_EQ(best, exact) << "seed " << seed;
    }
  }
  EXPECT_GT(exact_runs, 200);
}

TEST(OrderPropertyTest, TreeEqualsExactOnRandomInTrees) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    Graph g = RandomInTree(2 + static_cast<int>(seed % 19), seed);
    ASSERT_TRUE(CheckInTree(g).ok()) << CheckInTree(g);
    auto tree = TreeOrder(g);
    ASSERT_TRUE(tree.ok()) << tree.status();
    auto exact = ExactOrder(g);
    ASSERT_TRUE(exact.ok()) << exact.status();
    EXPECT_EQ(*OrderPeak(g, *tree), *OrderPeak(g, *exact)) << "seed " << seed;
    EXPECT_LE(*OrderPeak(g, *tree), *OrderPeak(g, *DfsOrder(g))) << "seed " << seed;
  }
}

TEST(OrderPropertyTest, BudgetsMeanTheSameForEveryPolicy) {
  Graph g = RandomInTree(15, 77);  // an in-tree, so that `tree` runs too
  for (const char* policy : kOrderPolicies) {
    const int64_t peak = Peak(g, policy);
    PlanResult fits = PlanOrDie(g, policy, Budget(peak));
    EXPECT_TRUE(fits.feasible) << policy;
    EXPECT_EQ(fits.report.peak_bytes, peak) << policy;
    PlanResult over = PlanOrDie(g, policy, Budget(peak - 1));
    EXPECT_FALSE(over.feasible) << policy;
    EXPECT_THAT(over.message, HasSubstr("exceeds the budget")) << policy;
    EXPECT_EQ(over.report.peak_bytes, peak) << policy;  // the best it found
    PlanResult min = PlanOrDie(g, policy, Budget(PlannerOptions::kMinBudget));
    EXPECT_TRUE(min.feasible) << policy;
  }
}

TEST(OrderPropertyTest, PlansAreDeterministic) {
  Graph g = RandomDag(60, 3);
  for (const char* policy : {"dfs", "greedy", "best-order"}) {
    EXPECT_EQ(PlanOrDie(g, policy).schedule, PlanOrDie(g, policy).schedule) << policy;
  }
}

TEST(OrderPropertyTest, LargeGraphsPlanWithoutRecursion) {
  // A 100,000-node path (depth-first recursion would overflow the stack)
  // and a 100,000-node random DAG.
  Graph path = Path(100'000);
  EXPECT_EQ(Peak(path, "dfs"), 2);
  EXPECT_EQ(Peak(path, "tree"), 2);
  EXPECT_EQ(Peak(path, "best-order"), 2);
  Graph big = RandomDag(100'000, 9);
  const auto start = std::chrono::steady_clock::now();
  auto order = GreedyOrder(big);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(order->size(), DefaultOrder(big).size());
  EXPECT_LT(seconds, 5.0);  // about 0.1 s in a release build
  EXPECT_LE(Peak(big, "best-order"), Peak(big, "baseline"));
}

TEST(OrderRegistryTest, PoliciesAreRegistered) {
  for (const char* name : {"dfs", "greedy", "tree", "exact-order", "best-order"}) {
    const PolicyInfo* info = PlannerRegistry::Global().Find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->kind, PlanKind::kOneShot) << name;
    EXPECT_FALSE(info->description.empty()) << name;
  }
  EXPECT_TRUE(PlannerRegistry::Global().Find("tree")->exact);
  EXPECT_TRUE(PlannerRegistry::Global().Find("exact-order")->exact);
}

// exact-order's reports (PlannerOptions::progress): states expanded, the
// best peak known as the incumbent and the search's bound, in bytes.
TEST(ExactOrderTest, ProgressReportsStatesAndBounds) {
  std::vector<PlanProgress> seen;
  PlannerOptions options;
  options.progress = [&](const PlanProgress& p) { seen.push_back(p); };
  auto report = ExactOrderProgress(options, "exact-order");
  ASSERT_TRUE(report);
  report(4096, 1000, 900);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].stage, "exact-order: searching orders, 4096 states");
  EXPECT_EQ(seen[0].incumbent, 1000.0);
  EXPECT_EQ(seen[0].bound, 900.0);
  EXPECT_FALSE(ExactOrderProgress(PlannerOptions{}, "exact-order"));
}

}  // namespace
}  // namespace pebble
