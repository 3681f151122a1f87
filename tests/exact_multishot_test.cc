// The `exact` multi-shot planner against hand-traced plans and an
// independent exhaustive search over SPEC's raw moves.
#include "scheduler/exact_multishot.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// Brute force, independent of the planner: value iteration over every set
// of resident needed non-persistent nodes, with SPEC section 2's moves as
// they are (compute any ready node within the budget, free any resident
// node), no pruning, no heuristic. Small graphs only (2^m sets).
struct BruteForce {
  std::vector<NodeId> nodes;  // needed non-persistent
  std::vector<uint32_t> inputs;
  uint32_t outputs = 0;
  const Graph* graph;

  explicit BruteForce(const Graph& g) : graph(&g) {
    std::vector<int> local(g.num_nodes(), -1);
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      if (g.needed()[v] && !g.persistent(v)) {
        local[v] = static_cast<int>(nodes.size());
        nodes.push_back(v);
      }
    }
    for (NodeId v : nodes) {
      uint32_t in = 0;
      for (NodeId u : g.unique_inputs(v)) {
        if (!g.persistent(u)) in |= 1u << local[u];
      }
      inputs.push_back(in);
      if (g.is_output(v)) outputs |= 1u << local[v];
    }
  }
  int m() const { return static_cast<int>(nodes.size()); }
  int64_t Bytes(uint32_t d) const {
    int64_t total = graph->persistent_bytes();
    for (int i = 0; i < m(); ++i) {
      if (d >> i & 1) total += graph->bytes(nodes[i]);
    }
    return total;
  }

  // The least compute cost of a schedule within `budget`, or nullopt.
  std::optional<double> MinCost(int64_t budget) const {
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> dist(size_t{1} << m(), inf);
    if (Bytes(0) > budget) return std::nullopt;
    dist[0] = 0;
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t d = 0; d < dist.size(); ++d) {
        if (dist[d] == inf) continue;
        for (int v = 0; v < m(); ++v) {
          const uint32_t bit = 1u << v;
          uint32_t next;
          double cost = 0;
          if (d & bit) {
            next = d & ~bit;  // free v
          } else {
            if ((inputs[v] & ~d) != 0) continue;
            next = d | bit;
            if (Bytes(next) + graph->workspace(nodes[v]) > budget) continue;
            cost = graph->cost(nodes[v]);
          }
          if (dist[d] + cost < dist[next] - 1e-12) {
            dist[next] = dist[d] + cost;
            changed = true;
          }
        }
      }
    }
    double best = inf;
    for (uint32_t d = 0; d < dist.size(); ++d) {
      if ((d & outputs) == outputs) best = std::min(best, dist[d]);
    }
    if (best == inf) return std::nullopt;
    return best;
  }

  // The lowest peak of any schedule (bottleneck fixpoint).
  int64_t MinPeak() const {
    const int64_t inf = std::numeric_limits<int64_t>::max();
    std::vector<int64_t> peak(size_t{1} << m(), inf);
    peak[0] = Bytes(0);
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t d = 0; d < peak.size(); ++d) {
        if (peak[d] == inf) continue;
        for (int v = 0; v < m(); ++v) {
          const uint32_t bit = 1u << v;
          uint32_t next;
          int64_t p = peak[d];
          if (d & bit) {
            next = d & ~bit;
          } else {
            if ((inputs[v] & ~d) != 0) continue;
            next = d | bit;
            p = std::max(p, Bytes(next) + graph->workspace(nodes[v]));
          }
          if (p < peak[next]) {
            peak[next] = p;
            changed = true;
          }
        }
      }
    }
    int64_t best = inf;
    for (uint32_t d = 0; d < peak.size(); ++d) {
      if ((d & outputs) == outputs) best = std::min(best, peak[d]);
    }
    return best;
  }
};

// x (persistent, 10 B); a (1 B) <- x; b (2 B) <- a; c (2 B) <- b;
// d (2 B) <- c; out (1 B) <- (d, a). Unit costs.
// Keeping a:     a 11 | a,b 13 | a,b,c 15 | a,c,d 15 | a,d,out 14: peak 15.
// Recomputing a: a 11 | a,b 13 | b,c 14 | c,d 14 | d,a 13 | d,a,out 14:
//                peak 14, cost 6. Computing c needs b and c (14): no
//                schedule goes below 14.
Graph SkipGraph() {
  return MakeGraph({Persistent("x", 10), Node("a", 1, {"x"}), Node("b", 2, {"a"}),
                    Node("c", 2, {"b"}), Node("d", 2, {"c"}),
                    Node("out", 1, {"d", "a"})},
                   {"out"});
}

TEST(ExactMultiShotTest, HandTracedRecomputation) {
  Graph g = SkipGraph();
  auto at15 = ExactMultiShotSchedule(g, 15, 10);
  ASSERT_TRUE(at15.ok()) << at15.status();
  ASSERT_TRUE(at15->has_value());
  EXPECT_DOUBLE_EQ((*at15)->cost, 5);
  EXPECT_EQ((*at15)->peak, 15);

  auto at14 = ExactMultiShotSchedule(g, 14, 10);
  ASSERT_TRUE(at14.ok()) << at14.status();
  ASSERT_TRUE(at14->has_value());
  EXPECT_DOUBLE_EQ((*at14)->cost, 6);
  EXPECT_EQ((*at14)->peak, 14);
  auto report = Simulate(g, (*at14)->schedule);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->recomputations, 1);
  // Cost first, then the fewest steps: 6 computes and the 5 frees needed
  // to leave only `out`... but frees after the last compute are never
  // taken, so d and a stay: 6 computes + 3 frees (a, b, c).
  EXPECT_EQ((*at14)->schedule.steps.size(), 9u);

  auto at13 = ExactMultiShotSchedule(g, 13, 10);
  ASSERT_TRUE(at13.ok()) << at13.status();
  EXPECT_FALSE(at13->has_value());

  auto low = ExactMinPeakSchedule(g, 10);
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_EQ(low->peak, 14);
}

TEST(ExactMultiShotTest, PlannerReportsInfeasibleBudgetsAndMinimum) {
  Graph g = SkipGraph();
  auto planner = MakePlanner("exact");
  ASSERT_TRUE(planner.ok()) << planner.status();
  PlannerOptions options;
  options.budget_bytes = 13;
  auto r = (*planner)->Plan(g, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->feasible);
  EXPECT_THAT(r->message, HasSubstr("lowest peak of any schedule is"));
  EXPECT_EQ(r->details["min_peak_bytes"], 14);
  EXPECT_EQ(r->report.peak_bytes, 14);  // the min-peak schedule is shown

  options.budget_bytes = PlannerOptions::kMinBudget;
  r = (*planner)->Plan(g, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->feasible);
  EXPECT_EQ(r->report.peak_bytes, 14);
  EXPECT_DOUBLE_EQ(r->report.compute_cost, 6);
  EXPECT_EQ(r->details["optimal"], true);

  options.budget_bytes = 14;
  r = (*planner)->Plan(g, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->feasible);
  EXPECT_DOUBLE_EQ(r->report.compute_cost, 6);
}

// Budgets from below the minimum peak to the one-shot peak.
std::vector<int64_t> Budgets(const Graph& g, int64_t min_peak) {
  auto one_shot = FreeAtLastUse(g, DefaultOrder(g));
  EXPECT_TRUE(one_shot.ok());
  const int64_t high = Simulate(g, *one_shot)->peak_bytes;
  std::vector<int64_t> budgets = {min_peak - 1, min_peak, high};
  for (int k = 1; k <= 3; ++k) budgets.push_back(min_peak + (high - min_peak) * k / 4);
  std::sort(budgets.begin(), budgets.end());
  budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
  return budgets;
}

void ExpectMatchesBruteForce(const Graph& g) {
  BruteForce brute(g);
  const int64_t min_peak = brute.MinPeak();
  auto low = ExactMinPeakSchedule(g, 30);
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_EQ(low->peak, min_peak) << g.name();
  for (int64_t budget : Budgets(g, min_peak)) {
    std::optional<double> expected = brute.MinCost(budget);
    auto got = ExactMultiShotSchedule(g, budget, 30);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->has_value(), expected.has_value())
        << g.name() << " budget " << budget;
    if (!expected.has_value()) continue;
    EXPECT_NEAR((*got)->cost, *expected, 1e-9) << g.name() << " budget " << budget;
    auto report = Simulate(g, (*got)->schedule);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_LE(report->peak_bytes, budget);
    EXPECT_NEAR(report->compute_cost, *expected, 1e-9);
  }
}

TEST(ExactMultiShotTest, MatchesBruteForceOnCheckmateLinearGraphs) {
  for (int n = 3; n <= 6; ++n) {
    auto g = BuildModel(absl::StrCat("linear:n=", n));
    ASSERT_TRUE(g.ok()) << g.status();
    ExpectMatchesBruteForce(*g);
  }
}

TEST(ExactMultiShotTest, MatchesBruteForceOnRandomDags) {
  for (int n = 5; n <= 10; ++n) {
    for (uint64_t seed = 0; seed < 6; ++seed) {
      ExpectMatchesBruteForce(RandomDag(n, 1000 * n + seed));
    }
  }
}

// A zero-cost node is recomputed freely but never for nothing: among the
// cheapest plans the lowest peak, then the fewest steps.
TEST(ExactMultiShotTest, ZeroCostNodesAreNotRecomputedForNothing) {
  Graph g = MakeGraph({Node("a", 1, {}, 0.0), Node("b", 1, {"a"}, 0.0),
                       Node("c", 1, {"b"}, 0.0)},
                      {"c"});
  auto r = ExactMultiShotSchedule(g, 100, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_DOUBLE_EQ((*r)->cost, 0);
  // compute a, b, free a, c: peak 2 (a, b, c all resident would be 3), each
  // node computed once.
  EXPECT_EQ((*r)->peak, 2);
  EXPECT_EQ((*r)->schedule.steps.size(), 4u);
  // Budget 2: compute a, compute b, free a, compute c.
  r = ExactMultiShotSchedule(g, 2, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_DOUBLE_EQ((*r)->cost, 0);
  EXPECT_EQ((*r)->schedule.steps.size(), 4u);
}

// A collective node (a gather) costs its network time in the search, which
// the simulator keeps out of compute_cost: the plan is the simulator's, not
// an internal error (a gather's cost above 0 aborted `plan --policy exact`).
TEST(ExactMultiShotTest, CollectiveNodesCostOutsideTheComputeCost) {
  absl::StatusOr<Graph> g = ParseGraphJson(R"({"format": "pebble-graph", "version": 1,
    "name": "gather", "nodes": [
      {"id": "x", "bytes": 1000, "persistent": true, "role": "input"},
      {"id": "ws", "bytes": 2000, "persistent": true, "role": "parameter"},
      {"id": "g", "op": "all_gather", "bytes": 4000, "cost": 0.5, "inputs": ["ws"],
       "collective": true},
      {"id": "y", "bytes": 1000, "cost": 1, "inputs": ["x", "g"]}],
    "outputs": ["y"]})");
  ASSERT_TRUE(g.ok()) << g.status();
  auto r = ExactMultiShotSchedule(*g, 1 << 20, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_DOUBLE_EQ((*r)->cost, 1);  // y's; the gather's 0.5 on the network
  EXPECT_EQ((*r)->peak, 8000);
}

// A tight budget bounds the resident sets, so graphs past 32 nodes are in
// reach: linear:n=20 (41 nodes) against Revolve's binomial optimum.
TEST(ExactMultiShotTest, ReachesLinear20AtTightBudgets) {
  auto g = BuildModel("linear:n=20");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const auto& [budget, cost] : {std::pair<int64_t, double>{5, 70},
                                     std::pair<int64_t, double>{6, 63},
                                     std::pair<int64_t, double>{7, 56}}) {
    ExactMultiShotStats stats;
    auto r = ExactMultiShotSchedule(*g, budget, 60, &stats);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value());
    EXPECT_DOUBLE_EQ((*r)->cost, cost) << budget;
    EXPECT_LE((*r)->peak, budget);
    EXPECT_LT(stats.states, kMaxExactMultiShotStates);
  }
}

TEST(ExactMultiShotTest, RejectsGraphsPastTheLimit) {
  auto g = BuildModel("linear:n=32");  // 65 nodes
  ASSERT_TRUE(g.ok()) << g.status();
  auto r = ExactMultiShotSchedule(*g, 1000, 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("at most 64"));
}

TEST(ExactMultiShotTest, HonoursTheTimeLimit) {
  auto g = BuildModel("linear:n=11");  // 23 nodes
  ASSERT_TRUE(g.ok()) << g.status();
  auto r = ExactMultiShotSchedule(*g, 5, 0.0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
}

// One expansion of a node with 22 inputs makes a child per subset of them
// that it may free (4 million): the clock is read among them too (it was
// read every 256 expansions, and the search ran until its memory limit,
// seconds past the time limit).
TEST(ExactMultiShotTest, HonoursTheTimeLimitInsideOneWideExpansion) {
  std::vector<NodeSpec> nodes = {Persistent("x", 1)};
  std::vector<std::string> inputs;
  for (int i = 0; i < 22; ++i) {
    inputs.push_back("a" + std::to_string(i));
    nodes.push_back(Node(inputs.back(), 1, {"x"}));
  }
  nodes.push_back(Node("out", 1, inputs));
  const Graph g = MakeGraph(std::move(nodes), {"out"});
  ExactMultiShotStats stats;
  auto r = ExactMultiShotSchedule(g, 1000, 0.2, &stats);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("no optimum within the time limit"));
  EXPECT_LT(stats.states, kMaxExactMultiShotStates);
}

}  // namespace
}  // namespace pebble
