// Shared pieces of the planner benchmarks: the models they plan, built once,
// and the timed planning loop.
#ifndef PEBBLE_BENCH_BENCH_UTIL_H_
#define PEBBLE_BENCH_BENCH_UTIL_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "benchmark/benchmark.h"
#include "graph/graph.h"
#include "graph/models/models.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"

namespace pebble::bench {

// Built once per model name: graph building is not what we measure.
inline const Graph& CachedModel(const std::string& name) {
  static auto* cache = new std::map<std::string, Graph>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    absl::StatusOr<Graph> g = BuildModel(name);
    PEBBLE_CHECK(g.ok(), "bench model does not build");
    it = cache->emplace(name, *std::move(g)).first;
  }
  return it->second;
}

// The budget of a benchmark argument: 0 for min, else a percentage of
// `baseline_peak`.
inline int64_t BudgetFromArg(int64_t arg, int64_t baseline_peak) {
  return arg == 0 ? PlannerOptions::kMinBudget : baseline_peak * arg / 100;
}

// Plans `graph` with `policy` once per benchmark iteration and returns the
// last result; nullopt (the benchmark marked as skipped with the error)
// when the planner fails.
inline std::optional<PlanResult> PlanInLoop(benchmark::State& state, const std::string& policy,
                                            const Graph& graph, const PlannerOptions& options) {
  absl::StatusOr<std::unique_ptr<Planner>> planner = MakePlanner(policy);
  PEBBLE_CHECK(planner.ok(), "unknown policy");
  PlanResult last;
  for (auto _ : state) {
    absl::StatusOr<PlanResult> r = (*planner)->Plan(graph, options);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return std::nullopt;
    }
    last = *std::move(r);
    // An integer: this benchmark release's DoNotOptimize can clobber a
    // double held in a register.
    benchmark::DoNotOptimize(last.report.peak_bytes);
  }
  return last;
}

}  // namespace pebble::bench

#endif  // PEBBLE_BENCH_BENCH_UTIL_H_
