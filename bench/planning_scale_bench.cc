// Planning time of the heuristic policies against graph size, on the two
// shapes that hostile inputs take: random DAGs (random:n, every sink an
// output) and wide graphs (n independent input-free nodes, every one an
// output). Budgets 60% of the baseline peak and min; `hybrid` and `dtr`
// also at 50% and 70% (the budgets of the scale goal: 10^4 nodes in
// seconds, 10^5 within a minute). One iteration per case: the large cases
// take seconds, and the figure of interest is how the time grows with n,
// not its last percent. Counters: nodes, the plan's peak as a percentage
// of the baseline's, and whether the time limit cut the search (60 s for
// `hybrid` and `dtr`, pebble's default, so that the goal is what is
// measured; 20 s for the others, so that the whole run stays within
// minutes).
//
//   build/bin/planning_scale_bench
//   build/bin/planning_scale_bench --benchmark_filter='hybrid/'
// bench/results/planning-scale.md holds measured figures.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "benchmark/benchmark.h"
#include "graph/graph.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"

namespace pebble {
namespace {

using bench::BudgetFromArg;
using bench::CachedModel;
using bench::PlanInLoop;

// n input-free nodes of about 1 kB, every one an output: nothing can be
// freed or recomputed, so every planner must conclude quickly that the
// baseline is all there is.
const Graph& WideGraph(int n) {
  static auto* cache = new std::map<int, Graph>();
  auto it = cache->find(n);
  if (it == cache->end()) {
    GraphBuilder b(absl::StrCat("wide-", n));
    for (int i = 0; i < n; ++i) {
      NodeSpec s;
      s.id = absl::StrCat("o", i);
      s.bytes = 1000 + i % 7;
      b.AddNode(std::move(s));
      b.AddOutput(absl::StrCat("o", i));
    }
    absl::StatusOr<Graph> g = b.Build();
    PEBBLE_CHECK(g.ok(), "wide graph does not build");
    it = cache->emplace(n, *std::move(g)).first;
  }
  return it->second;
}

// state.range(0): the node count; state.range(1): 0 for min, else a
// percentage of the baseline peak.
void PlanGraph(benchmark::State& state, const std::string& policy, bool wide,
               double time_limit_s) {
  const int n = static_cast<int>(state.range(0));
  const Graph& graph =
      wide ? WideGraph(n) : CachedModel(absl::StrCat("random:n=", n));
  absl::StatusOr<int64_t> base = BaselinePeak(graph);
  PEBBLE_CHECK(base.ok(), "baseline peak");
  PlannerOptions options;
  options.budget_bytes = BudgetFromArg(state.range(1), *base);
  options.time_limit_s = time_limit_s;
  std::optional<PlanResult> last = PlanInLoop(state, policy, graph, options);
  if (!last) return;
  state.counters["nodes"] = graph.num_nodes();
  state.counters["peak_pct"] = 100.0 * static_cast<double>(last->report.peak_bytes) /
                               static_cast<double>(*base);
  state.counters["cut"] = TimeLimitReached(*last) ? 1 : 0;
}

void Register() {
  const char* policies[] = {"hybrid", "dtr",   "swap",        "vdnn",
                            "sqrtn",  "rotor", "chen-greedy", "best-order"};
  for (const char* p : policies) {
    const bool goal = std::string(p) == "hybrid" || std::string(p) == "dtr";
    const double time_limit_s = goal ? 60 : 20;
    const std::vector<int64_t> budgets =
        goal ? std::vector<int64_t>{60, 50, 70, 0} : std::vector<int64_t>{60, 0};
    for (bool wide : {false, true}) {
      const std::string name = absl::StrCat(p, wide ? "/wide" : "/random");
      benchmark::RegisterBenchmark(
          name.c_str(),
          [p, wide, time_limit_s](benchmark::State& s) { PlanGraph(s, p, wide, time_limit_s); })
          ->ArgsProduct({{1000, 10000, 100000}, budgets})
          ->ArgNames({"n", "budget"})
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
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
