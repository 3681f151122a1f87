// Planning time of the offload policies (scheduler/offload.h) on the
// workloads of docs/offload.md: conv3d:n=128, resnet18:batch=32 and unet3d
// (default size), at a budget in percent of the baseline peak (0: min) and
// the PCIe 4 link. Counters: the plan's peak (percent of the baseline),
// makespan and exposed transfer time (seconds, simulated), transfer bytes
// and feasibility. The time includes every simulation the planner runs.
//
//   build/bin/offload_bench --benchmark_min_time=0.2
#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

void PlanOffload(benchmark::State& state, const std::string& policy, const std::string& model) {
  const Graph& graph = CachedModel(model);
  absl::StatusOr<int64_t> base = BaselinePeak(graph);
  PEBBLE_CHECK(base.ok(), "baseline peak");
  PlannerOptions options;
  options.budget_bytes = BudgetFromArg(state.range(0), *base);
  options.host_bandwidth_bytes_per_s = 25e9;
  std::optional<PlanResult> last = PlanInLoop(state, policy, graph, options);
  if (!last) return;
  state.counters["peak_pct"] = 100.0 * static_cast<double>(last->report.peak_bytes) /
                               static_cast<double>(*base);
  state.counters["makespan_s"] = last->report.makespan;
  state.counters["exposed_s"] = last->report.exposed_transfer_time;
  state.counters["transfer_bytes"] = static_cast<double>(last->report.transfer_bytes);
  state.counters["feasible"] = last->feasible ? 1 : 0;
}

void RegisterAll() {
  const std::pair<const char*, std::vector<int64_t>> workloads[] = {
      {"conv3d:n=128", {90, 0}}, {"resnet18:batch=32", {70, 0}}, {"unet3d", {60, 40, 0}}};
  for (const char* policy : {"vdnn", "swap", "hybrid"}) {
    for (const auto& [model, budgets] : workloads) {
      auto* b = benchmark::RegisterBenchmark(
          (std::string(policy) + "/" + model).c_str(),
          [policy = std::string(policy), model = std::string(model)](benchmark::State& s) {
            PlanOffload(s, policy, model);
          });
      for (int64_t budget : budgets) b->Arg(budget);
      b->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace pebble

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  pebble::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
