// The executor on the CPU backend, per policy, on the seed 3-D network
// (conv3d:n=64 by default; PEBBLE_BENCH_MODEL overrides it): one training
// step per iteration. Counters:
//   predicted_peak, measured_peak   bytes (SPEC section 2; the executor's own
//                                   bookkeeping of what it held)
//   peak_equal                      1 when they are equal
//   arena, arena_over_bound         the arena allocated, and its excess over
//                                   the aligned peak (the lower bound of any
//                                   64-byte-aligned layout), as a fraction
//   kernel_s, overhead_s            per step: kernel time, and what the
//                                   executor adds (step time minus kernels
//                                   and copies)
//   overhead_frac                   overhead_s / step time
//   recomputations, transfer_bytes  from the plan
// Run: build/bin/executor_bench --benchmark_counters_tabular=true
#include <cstdlib>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "graph/models/models.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/executor.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"

namespace pebble {
namespace {

std::string BenchModel() {
  const char* env = std::getenv("PEBBLE_BENCH_MODEL");
  return env != nullptr && env[0] != '\0' ? env : "conv3d:n=64";
}

// policy, budget as a fraction of the baseline peak.
struct Workload {
  const char* policy;
  double budget_fraction;
};

void BM_Execute(benchmark::State& state, Workload w) {
  auto graph = BuildModel(BenchModel());
  if (!graph.ok()) {
    state.SkipWithError(std::string(graph.status().message()).c_str());
    return;
  }
  auto baseline_peak = BaselinePeak(*graph);
  auto planner = MakePlanner(w.policy);
  if (!baseline_peak.ok() || !planner.ok()) {
    state.SkipWithError("policy not available");
    return;
  }
  PlannerOptions options;
  options.budget_bytes =
      static_cast<int64_t>(w.budget_fraction * static_cast<double>(*baseline_peak));
  options.time_limit_s = 10;
  auto plan = (*planner)->Plan(*graph, options);
  if (!plan.ok()) {
    state.SkipWithError(std::string(plan.status().message()).c_str());
    return;
  }
  auto backend = MakeCpuBackend();
  ExecutorOptions eo;
  eo.download_outputs = false;
  {  // warm-up: oneDNN primitive caches, first-touch page faults
    auto warm = Execute(*graph, plan->schedule, *backend, eo);
    if (!warm.ok()) {
      state.SkipWithError(std::string(warm.status().message()).c_str());
      return;
    }
  }
  double kernel_s = 0, overhead_s = 0, step_s = 0;
  int64_t measured_peak = 0, arena = 0, aligned_peak = 0;
  for (auto _ : state) {
    auto r = Execute(*graph, plan->schedule, *backend, eo);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    state.SetIterationTime(r->time_s);
    kernel_s += r->kernel_time_s;
    overhead_s += r->overhead_s;
    step_s += r->time_s;
    measured_peak = r->peak_bytes;
    arena = r->arena_bytes;
    aligned_peak = r->layout.aligned_peak_bytes;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["predicted_peak"] = static_cast<double>(plan->report.peak_bytes);
  state.counters["measured_peak"] = static_cast<double>(measured_peak);
  state.counters["peak_equal"] = measured_peak == plan->report.peak_bytes ? 1 : 0;
  state.counters["feasible"] = plan->feasible ? 1 : 0;
  state.counters["arena"] = static_cast<double>(arena);
  state.counters["arena_over_bound"] =
      aligned_peak > 0 ? static_cast<double>(arena) / static_cast<double>(aligned_peak) - 1 : 0;
  state.counters["kernel_s"] = kernel_s / n;
  state.counters["overhead_s"] = overhead_s / n;
  state.counters["overhead_frac"] = step_s > 0 ? overhead_s / step_s : 0;
  state.counters["recomputations"] = static_cast<double>(plan->report.recomputations);
  state.counters["transfer_bytes"] = static_cast<double>(plan->report.transfer_bytes);
  state.SetLabel(BenchModel());
}

const Workload kWorkloads[] = {
    {"baseline", 1.0},     {"best-order", 1.0}, {"sqrtn", 0.9},      {"chen-greedy", 0.9},
    {"checkmate-lp", 0.9}, {"rotor", 0.9},      {"dtr", 0.9},        {"vdnn", 0.9},
    {"swap", 0.9},         {"hybrid", 0.9},     {"hybrid", 0.75},
};

int Register() {
  for (const Workload& w : kWorkloads) {
    const std::string name =
        std::string("Execute/") + w.policy + "/" + std::to_string(static_cast<int>(100 * w.budget_fraction)) + "%";
    benchmark::RegisterBenchmark(name.c_str(), BM_Execute, w)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace pebble

BENCHMARK_MAIN();
