// Planning time of the forget-and-recompute heuristics (scheduler/remat.h)
// against graph size. Workloads: Checkmate's linear:n (n up to 1000) and
// resnet50:batch=32; budgets 60% of the baseline peak and min. Counters:
// the plan's peak (bytes), overhead (compute_cost / base_cost - 1),
// feasibility and the graph's node count. Every plan is simulated inside
// the planner (FinishPlan), so the time includes it.
//
//   build-remat/bin/remat_bench --benchmark_min_time=0.2
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "benchmark/benchmark.h"
#include "graph/models/models.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"

namespace pebble {
namespace {

// Built once per model name: graph building is not what we measure.
const Graph& CachedModel(const std::string& name) {
  static auto* cache = new std::map<std::string, Graph>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    absl::StatusOr<Graph> g = BuildModel(name);
    PEBBLE_CHECK(g.ok(), "bench model does not build");
    it = cache->emplace(name, *std::move(g)).first;
  }
  return it->second;
}

// state.range(0): 0 for min, else a percentage of the baseline peak.
void PlanModel(benchmark::State& state, const std::string& policy, const std::string& model) {
  const Graph& graph = CachedModel(model);
  absl::StatusOr<int64_t> base = BaselinePeak(graph);
  PEBBLE_CHECK(base.ok(), "baseline peak");
  PlannerOptions options;
  options.budget_bytes =
      state.range(0) == 0 ? PlannerOptions::kMinBudget : *base * state.range(0) / 100;
  absl::StatusOr<std::unique_ptr<Planner>> planner = MakePlanner(policy);
  PEBBLE_CHECK(planner.ok(), "unknown policy");
  PlanResult last;
  for (auto _ : state) {
    absl::StatusOr<PlanResult> r = (*planner)->Plan(graph, options);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    last = *std::move(r);
    benchmark::DoNotOptimize(last.report.peak_bytes);
  }
  state.counters["nodes"] = graph.num_nodes();
  state.counters["peak_bytes"] = static_cast<double>(last.report.peak_bytes);
  state.counters["peak_pct"] = 100.0 * static_cast<double>(last.report.peak_bytes) /
                               static_cast<double>(*base);
  state.counters["overhead"] = last.report.overhead;
  state.counters["feasible"] = last.feasible ? 1 : 0;
}

void Register() {
  const char* policies[] = {"sqrtn", "chen-greedy", "articulation", "revolve", "rotor", "dtr"};
  for (const char* p : policies) {
    for (int n : {10, 30, 100, 300, 1000}) {
      const std::string model = "linear:n=" + std::to_string(n);
      benchmark::RegisterBenchmark((std::string(p) + "/" + model).c_str(),
                                   [p, model](benchmark::State& s) { PlanModel(s, p, model); })
          ->Arg(60)
          ->Arg(0)
          ->Unit(benchmark::kMillisecond);
    }
    if (std::string(p) == "revolve") continue;  // resnet50 is not a chain
    benchmark::RegisterBenchmark((std::string(p) + "/resnet50:batch=32").c_str(),
                                 [p](benchmark::State& s) {
                                   PlanModel(s, p, "resnet50:batch=32");
                                 })
        ->Arg(80)
        ->Arg(60)
        ->Arg(0)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace pebble

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  pebble::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
