// The `swap` policy: cost-driven host offload of whole tensors, with XLA's
// rule for host offloading (a tensor goes to the host only where the compute
// between its eviction and its reuse hides the round trip) and the largest
// savings first (Note [Greedy swaps] in offload_common.cc, rule
// kHiddenGapsOnly).
//
// Note [swap]. Offload only, no recomputation: the compute sequences are
// one-shot orders, the graph's own (what a framework runs) and
// best-order's (the lowest one-shot peak). On each, the greedy search adds
// swaps at the peak, largest tensor first, among the gaps whose nominal
// compute covers 2 bytes / bandwidth, until the peak meets the budget (or,
// with --budget min, until nothing at the peak qualifies); then the
// placement rounds (Note [Placement rounds]) move evictions and prefetches
// where the simulator shows a stall, within the budget. The plan with the
// least simulated makespan that fits is kept (with --budget min, the lowest
// peak). Below the peak that hidden swaps can reach the plan is infeasible
// by design: `hybrid` then recomputes or accepts exposed transfers.
// Not optimal: the rule ignores copy-stream contention (two tensors whose
// gaps overlap may each be hideable but not both), which the simulator then
// reports as exposed transfer time.
#include <memory>
#include <vector>

#include "graph/status.h"
#include "scheduler/offload.h"
#include "scheduler/policies.h"

namespace pebble {

absl::StatusOr<PlanResult> PlanSwap(const Graph& graph, const PlannerOptions& options,
                                    const std::vector<NodeId>* best_order) {
  MakespanSelector selector(graph, options);
  std::vector<std::pair<std::string, std::vector<NodeId>>> orders;
  orders.emplace_back("baseline", DefaultOrder(graph));
  if (best_order != nullptr) {
    orders.emplace_back("best-order", *best_order);
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<Planner> best, MakePlanner("best-order"));
    // The whole time left, as the composed policies give it (Note
    // [Composition] in compose.cc): best-order's plan at this limit is a
    // candidate, so swap is never above it at `min`.
    PlannerOptions o = options;
    o.time_limit_s = selector.deadline().remaining_s();
    ASSIGN_OR_RETURN(PlanResult r, best->Plan(graph, o));
    if (TimeLimitReached(r)) selector.deadline().MarkHit();
    orders.emplace_back("best-order", ComputeSequence::FromSchedule(graph, r.schedule).computes());
  }
  if (orders[1].second == orders[0].second) orders.pop_back();
  for (const auto& [name, order] : orders) {
    // Each order's plain schedule is always offered, past the time limit
    // too: the baseline is a valid plan, and best-order's is the one
    // `--policy best-order` gives at this limit, which swap never exceeds.
    const ComputeSequence seq(graph, order);
    const PlanReport& plain = selector.Consider(EmitSwapSchedule(seq, {}),
                                                {{"order", name}, {"swaps", 0}});
    if (options.budget_bytes != PlannerOptions::kMinBudget &&
        plain.peak_bytes <= options.budget_bytes) {
      continue;
    }
    if (selector.TimeUp()) continue;
    SwapSearchOptions search;
    search.target_bytes = options.budget_bytes;
    search.host_budget_bytes = options.host_budget_bytes;
    search.bandwidth_bytes_per_s = options.host_bandwidth_bytes_per_s;
    search.rule = SwapRule::kHiddenGapsOnly;
    search.deadline = &selector.deadline();
    std::vector<SwapInterval> swaps = GreedySwaps(seq, search);
    if (swaps.empty()) continue;
    int64_t cap = options.budget_bytes;
    const std::vector<int64_t> during = DuringBytes(seq, swaps);
    int64_t peak = graph.persistent_bytes();
    for (int64_t b : during) peak = std::max(peak, b);
    if (cap == PlannerOptions::kMinBudget || peak > cap) cap = peak;
    selector.Consider(EmitSwapSchedule(seq, swaps),
                      {{"order", name}, {"swaps", swaps.size()}, {"placement", "greedy"}});
    if (selector.TimeUp()) continue;
    swaps = RefinePlacement(seq, std::move(swaps), cap, options.host_bandwidth_bytes_per_s, 4,
                            &selector.deadline());
    selector.Consider(EmitSwapSchedule(seq, swaps),
                      {{"order", name}, {"swaps", swaps.size()}, {"placement", "refined"}});
  }
  return selector.Finish();
}

namespace {

class SwapPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    return PlanSwap(graph, options);
  }
};

}  // namespace

void RegisterSwapPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "swap",
      .description = "cost-driven host offload: swap a tensor only where the compute between "
                     "its eviction and reuse hides the round trip (XLA's rule), largest first, "
                     "until the budget holds",
      .kind = PlanKind::kOffload,
      .exact = false,
      .factory = [] { return std::make_unique<SwapPlanner>(); },
  });
}

}  // namespace pebble
