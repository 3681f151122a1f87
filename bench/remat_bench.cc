// Planning time of the forget-and-recompute heuristics (scheduler/remat.h)
// against graph size. Workloads: Checkmate's linear:n (n up to 1000) and
// resnet50:batch=32; budgets 60% of the baseline peak and min. Counters:
// the plan's peak (bytes), overhead (compute_cost / base_cost - 1),
// feasibility and the graph's node count. Every plan is simulated inside
// the planner (FinishPlan), so the time includes it.
//
//   build/bin/remat_bench --benchmark_min_time=0.2
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "bench/bench_util.h"
#include "benchmark/benchmark.h"
#include "graph/models/models.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"

namespace pebble {
namespace {

using bench::BudgetFromArg;
using bench::CachedModel;
using bench::PlanInLoop;

// state.range(0): 0 for min, else a percentage of the baseline peak.
void PlanModel(benchmark::State& state, const std::string& policy, const std::string& model) {
  const Graph& graph = CachedModel(model);
  absl::StatusOr<int64_t> base = BaselinePeak(graph);
  PEBBLE_CHECK(base.ok(), "baseline peak");
  PlannerOptions options;
  options.budget_bytes = BudgetFromArg(state.range(0), *base);
  std::optional<PlanResult> last = PlanInLoop(state, policy, graph, options);
  if (!last) return;
  state.counters["nodes"] = graph.num_nodes();
  state.counters["peak_bytes"] = static_cast<double>(last->report.peak_bytes);
  state.counters["peak_pct"] = 100.0 * static_cast<double>(last->report.peak_bytes) /
                               static_cast<double>(*base);
  state.counters["overhead"] = last->report.overhead;
  state.counters["feasible"] = last->feasible ? 1 : 0;
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
