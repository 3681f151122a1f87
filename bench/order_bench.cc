// Planning time of the one-shot order policies (scheduler/orders.h) and of
// the static memory layout (scheduler/memory_layout.h).
//
// Workloads, shared by every competitor and seeded:
//  - random:n    each node reads 1-3 earlier nodes drawn uniformly (so many
//                tensors live long), bytes 1 KiB..1 MiB, outputs the sinks;
//  - layered:n   a training-like graph: a forward chain of conv/matmul-like
//                layers (each with a persistent weight, every third with a
//                residual input), a loss, and the backward pass (activation
//                gradients, weight gradients as outputs) reading the saved
//                activations: about n nodes;
//  - chains:k    k chains of 4 growing tensors off one shared source, every
//                chain end an output: exact-order's state space grows as
//                5^k.
// Counters: peak_bytes of the plan, nodes, and for exact-order the states
// stored; for layouts arena_bytes and fragmentation. Results:
// bench/results/order-planning-2026-11-21.md.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "graph/graph.h"
#include "graph/status.h"
#include "scheduler/memory_layout.h"
#include "scheduler/orders.h"
#include "scheduler/planner.h"

namespace pebble {
namespace {

NodeSpec Spec(std::string id, int64_t bytes, std::vector<std::string> inputs,
              bool persistent = false) {
  NodeSpec s;
  s.id = std::move(id);
  s.bytes = bytes;
  s.inputs = std::move(inputs);
  s.persistent = persistent;
  return s;
}

Graph Build(GraphBuilder& b) {
  auto g = b.Build();
  PEBBLE_CHECK(g.ok(), "benchmark graph does not build");
  return *std::move(g);
}

Graph RandomGraph(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  GraphBuilder b(absl::StrCat("random-", n));
  b.AddNode(Spec("x", 1 << 20, {}, /*persistent=*/true));
  std::vector<bool> read(n, false);
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> inputs;
    const int fan_in = i == 0 ? 1 : 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < fan_in; ++k) {
      if (i == 0) {
        inputs.push_back("x");
      } else {
        const int u = static_cast<int>(rng() % i);
        read[u] = true;
        inputs.push_back(absl::StrCat("v", u));
      }
    }
    b.AddNode(Spec(absl::StrCat("v", i), 1024 * (1 + static_cast<int64_t>(rng() % 1024)),
                   inputs));
  }
  for (int i = 0; i < n; ++i) {
    if (!read[i]) b.AddOutput(absl::StrCat("v", i));
  }
  return Build(b);
}

// About 4 nodes per layer plus weights: layers = n / 5.
Graph LayeredGraph(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int layers = std::max(2, n / 5);
  GraphBuilder b(absl::StrCat("layered-", n));
  b.AddNode(Spec("input", 4 << 20, {}, true));
  std::vector<int64_t> act_bytes(layers + 1, 4 << 20);
  auto a = [](int i) { return i == 0 ? std::string("input") : absl::StrCat("a", i); };
  for (int i = 1; i <= layers; ++i) {
    act_bytes[i] = (1 + static_cast<int64_t>(rng() % 8)) << 20;
    b.AddNode(Spec(absl::StrCat("w", i), (1 + static_cast<int64_t>(rng() % 4)) << 18, {},
                   true));
    std::vector<std::string> inputs = {a(i - 1), absl::StrCat("w", i)};
    if (i >= 3 && i % 3 == 0) inputs.push_back(a(i - 2));  // residual from a(i-2)
    b.AddNode(Spec(a(i), act_bytes[i], inputs));
  }
  b.AddNode(Spec("loss", 4, {a(layers)}));
  b.AddOutput("loss");
  // g<i>: gradient of a<i>; gw<i>: of w<i>.
  b.AddNode(Spec(absl::StrCat("g", layers), act_bytes[layers], {a(layers), "loss"}));
  auto residual = [](int i) { return i >= 3 && i % 3 == 0; };
  for (int i = layers; i >= 1; --i) {
    b.AddNode(Spec(absl::StrCat("gw", i), (1 + static_cast<int64_t>(rng() % 4)) << 18,
                   {a(i - 1), absl::StrCat("g", i)}));
    b.AddOutput(absl::StrCat("gw", i));
    if (i > 1) {
      // a(i-1) feeds layer i (and layer i+1 when that one is residual).
      std::vector<std::string> inputs = {absl::StrCat("g", i), absl::StrCat("w", i), a(i)};
      if (i + 1 <= layers && residual(i + 1)) inputs.push_back(absl::StrCat("g", i + 1));
      b.AddNode(Spec(absl::StrCat("g", i - 1), act_bytes[i - 1], inputs));
    }
  }
  return Build(b);
}

Graph Chains(int k) {
  GraphBuilder b(absl::StrCat("chains-", k));
  b.AddNode(Spec("x", 1, {}));
  for (int c = 0; c < k; ++c) {
    for (int i = 0; i < 4; ++i) {
      b.AddNode(Spec(absl::StrCat("c", c, "_", i), 2 + i + c % 3,
                     {i == 0 ? std::string("x") : absl::StrCat("c", c, "_", i - 1)}));
    }
    b.AddOutput(absl::StrCat("c", c, "_3"));
  }
  return Build(b);
}

void PlanWith(benchmark::State& state, const std::string& policy, const Graph& g) {
  auto planner = MakePlanner(policy);
  PEBBLE_CHECK(planner.ok(), "unknown policy");
  PlannerOptions options;
  options.budget_bytes = PlannerOptions::kMinBudget;
  int64_t peak = 0;
  for (auto _ : state) {
    auto result = (*planner)->Plan(g, options);
    PEBBLE_CHECK(result.ok(), "planning failed");
    peak = result->report.peak_bytes;
    benchmark::DoNotOptimize(peak);
  }
  auto baseline = BaselinePeak(g);
  state.counters["nodes"] = g.num_nodes();
  state.counters["peak_bytes"] = static_cast<double>(peak);
  state.counters["vs_baseline"] =
      static_cast<double>(peak) / static_cast<double>(baseline.ok() ? *baseline : 1);
}

void BM_PlanRandom(benchmark::State& state, const std::string& policy) {
  const Graph g = RandomGraph(static_cast<int>(state.range(0)), 42);
  PlanWith(state, policy, g);
}

void BM_PlanLayered(benchmark::State& state, const std::string& policy) {
  const Graph g = LayeredGraph(static_cast<int>(state.range(0)), 42);
  PlanWith(state, policy, g);
}

void BM_ExactOrderChains(benchmark::State& state) {
  const Graph g = Chains(static_cast<int>(state.range(0)));
  ExactOrderStats stats;
  ExactOrderLimits limits;
  limits.max_states = 20'000'000;
  for (auto _ : state) {
    auto order = ExactOrder(g, limits, &stats);
    PEBBLE_CHECK(order.ok(), "exact-order failed");
    benchmark::DoNotOptimize(order->data());
  }
  state.counters["nodes"] = g.num_nodes();
  state.counters["peak_bytes"] = static_cast<double>(stats.peak_bytes);
  state.counters["states"] = static_cast<double>(stats.states);
}

void BM_Layout(benchmark::State& state, bool layered) {
  const int n = static_cast<int>(state.range(0));
  const Graph g = layered ? LayeredGraph(n, 42) : RandomGraph(n, 42);
  auto order = GreedyOrder(g);
  PEBBLE_CHECK(order.ok(), "greedy failed");
  auto schedule = FreeAtLastUse(g, *order);
  PEBBLE_CHECK(schedule.ok(), "free at last use failed");
  MemoryLayout layout;
  for (auto _ : state) {
    auto planned = PlanMemoryLayout(g, *schedule);
    PEBBLE_CHECK(planned.ok(), "layout failed");
    layout = *std::move(planned);
  }
  state.counters["instances"] = static_cast<double>(layout.instances.size());
  state.counters["peak_bytes"] = static_cast<double>(layout.peak_bytes);
  state.counters["arena_bytes"] = static_cast<double>(layout.arena_bytes);
  state.counters["fragmentation"] = layout.fragmentation;
  state.SetLabel(layout.strategy);
}

#define PEBBLE_SIZES RangeMultiplier(10)->Range(100, 100'000)->Unit(benchmark::kMillisecond)
BENCHMARK_CAPTURE(BM_PlanRandom, baseline, std::string("baseline"))->PEBBLE_SIZES;
BENCHMARK_CAPTURE(BM_PlanRandom, dfs, std::string("dfs"))->PEBBLE_SIZES;
BENCHMARK_CAPTURE(BM_PlanRandom, greedy, std::string("greedy"))->PEBBLE_SIZES;
BENCHMARK_CAPTURE(BM_PlanRandom, best_order, std::string("best-order"))->PEBBLE_SIZES;
BENCHMARK_CAPTURE(BM_PlanLayered, baseline, std::string("baseline"))->PEBBLE_SIZES;
BENCHMARK_CAPTURE(BM_PlanLayered, dfs, std::string("dfs"))->PEBBLE_SIZES;
BENCHMARK_CAPTURE(BM_PlanLayered, greedy, std::string("greedy"))->PEBBLE_SIZES;
BENCHMARK_CAPTURE(BM_PlanLayered, best_order, std::string("best-order"))->PEBBLE_SIZES;
BENCHMARK(BM_ExactOrderChains)->DenseRange(2, 9)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Layout, random, false)->PEBBLE_SIZES;
BENCHMARK_CAPTURE(BM_Layout, layered, true)->PEBBLE_SIZES;

}  // namespace
}  // namespace pebble

BENCHMARK_MAIN();
