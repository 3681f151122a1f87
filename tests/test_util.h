// Small helpers for building graphs and schedules by hand in tests.
#ifndef PEBBLE_TESTS_TEST_UTIL_H_
#define PEBBLE_TESTS_TEST_UTIL_H_

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/net_builder.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"

namespace pebble::testing {

// A computed node with `bytes`, `cost` and the given inputs.
inline NodeSpec Node(std::string id, int64_t bytes, std::vector<std::string> inputs = {},
                     double cost = 1.0, int64_t workspace = 0) {
  NodeSpec s;
  s.id = std::move(id);
  s.bytes = bytes;
  s.inputs = std::move(inputs);
  s.cost = cost;
  s.workspace = workspace;
  return s;
}

// A persistent node (weights, the data batch).
inline NodeSpec Persistent(std::string id, int64_t bytes) {
  NodeSpec s;
  s.id = std::move(id);
  s.bytes = bytes;
  s.persistent = true;
  return s;
}

// Builds a graph or fails the test.
inline Graph MakeGraph(std::vector<NodeSpec> nodes, std::vector<std::string> outputs,
                       std::string name = "test") {
  GraphBuilder b(std::move(name));
  for (NodeSpec& s : nodes) b.AddNode(std::move(s));
  for (std::string& o : outputs) b.AddOutput(std::move(o));
  auto g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

// The training graph of the forward graph `nb` built, with loss "loss", or
// fails the test.
inline Graph TrainingGraph(const NetBuilder& nb) {
  auto forward = nb.Build();
  EXPECT_TRUE(forward.ok()) << forward.status();
  if (!forward.ok()) return Graph();
  auto g = BuildTrainingGraph(*forward, "loss");
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

// A schedule from (action, node id) pairs.
inline Schedule MakeSchedule(const Graph& g,
                             std::vector<std::pair<Action, std::string>> steps) {
  Schedule s;
  for (auto& [action, id] : steps) {
    NodeId v = g.Find(id);
    EXPECT_NE(v, kNoNode) << "unknown node " << id;
    s.steps.push_back({action, v});
  }
  return s;
}

// A seeded random DAG: `n` computed nodes, each reading 1..3 earlier nodes
// (or a persistent source), random bytes in [1, 100] and costs in [0, 10]
// (some zero), the sinks as outputs.
inline Graph RandomDag(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NodeSpec> nodes;
  nodes.push_back(Persistent("w", 1 + rng() % 50));
  std::vector<bool> read(n, false);
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> inputs;
    const int fan_in = i == 0 ? 1 : 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < fan_in; ++k) {
      if (i == 0 || rng() % 8 == 0) {
        inputs.push_back("w");
      } else {
        int u = static_cast<int>(rng() % i);
        read[u] = true;
        inputs.push_back(absl::StrCat("v", u));
      }
    }
    const double cost = (rng() % 5 == 0) ? 0.0 : static_cast<double>(rng() % 10 + 1);
    nodes.push_back(Node(absl::StrCat("v", i), 1 + static_cast<int64_t>(rng() % 100),
                         inputs, cost, static_cast<int64_t>(rng() % 3 == 0 ? rng() % 20 : 0)));
  }
  std::vector<std::string> outputs;
  for (int i = 0; i < n; ++i) {
    if (!read[i]) outputs.push_back(absl::StrCat("v", i));
  }
  return MakeGraph(std::move(nodes), std::move(outputs), absl::StrCat("random-", seed));
}

// The plan of `policy` at the tightest budget of 70%, 80% and 90% of
// `peak` (the baseline's) that it fits, else at --budget min (as low as it
// goes), or nullopt where it fails. No single fraction suits every graph:
// the smallest peak reachable by recomputation is often above 70% of the
// baseline's (conv3d's backward holds a layer's input, output and gradient
// at once), and the offload policies move tensors at "min" only.
inline std::optional<PlanResult> TightPlan(const Graph& g, const std::string& policy,
                                           int64_t peak, double time_limit_s = 10) {
  auto planner = MakePlanner(policy);
  if (!planner.ok()) return std::nullopt;
  for (int percent : {70, 80, 90, 0}) {
    PlannerOptions options;
    options.budget_bytes = percent > 0 ? peak * percent / 100 : kMinBudgetBytes;
    options.time_limit_s = time_limit_s;
    // The policy as published: composed with best-order, a budget is often
    // met by best-order's one-shot plan, which recomputes nothing.
    options.own_order = true;
    auto plan = (*planner)->Plan(g, options);
    if (plan.ok() && plan->feasible) return *std::move(plan);
  }
  return std::nullopt;
}

// `policy`'s plan of `graph` (sharded over `ranks`) within `budget`, with
// `buckets` (PlannerOptions::bucket_bytes), in at most `time_limit_s`; an
// empty result (and a test failure) where it fails.
inline PlanResult PlanSharded(const Graph& graph, int ranks, const char* policy,
                              int64_t budget = kMinBudgetBytes,
                              int64_t buckets = PlannerOptions::kPlannedBuckets,
                              double time_limit_s = 10) {
  PlannerOptions options;
  options.budget_bytes = budget;
  options.time_limit_s = time_limit_s;
  options.ranks = ranks;
  options.bucket_bytes = buckets;
  absl::StatusOr<PlanResult> r = (*MakePlanner(policy))->Plan(graph, options);
  EXPECT_TRUE(r.ok()) << policy << ": " << r.status();
  return r.ok() ? *std::move(r) : PlanResult();
}

}  // namespace pebble::testing

#endif  // PEBBLE_TESTS_TEST_UTIL_H_
