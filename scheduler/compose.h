// Composition of planners: every recomputation and offload policy plans
// over the best execution order pebble can find, not only over the order
// the graph was written in (Note [Composition] in compose.cc).
#ifndef PEBBLE_SCHEDULER_COMPOSE_H_
#define PEBBLE_SCHEDULER_COMPOSE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/planner.h"

namespace pebble {

// `graph` with its nodes rearranged so that its own order (DefaultOrder)
// is `order`: the persistent nodes first, then `order` (the needed
// non-persistent nodes, in a topological order), then the nodes no output
// needs. Ids, edges and everything else are unchanged.
absl::StatusOr<Graph> ReorderedGraph(const Graph& graph, const std::vector<NodeId>& order);

// `inner`, policy `name`, composed with best-order (see the Note).
std::unique_ptr<Planner> ComposeWithBestOrder(std::unique_ptr<Planner> inner, std::string name);

// Which of two plans of one graph is better under SPEC's budget rule
// (docs/semantics.md): with a byte budget, one that fits over one that
// does not; among those that fit, the lower makespan (ties: lower peak);
// among those that do not, the lower peak. With kMinBudget the lower peak,
// except that a plan within 0.5% of the other's peak and of lower
// makespan wins. Makespans within SameMakespan are a tie.
bool BetterPlan(const PlanResult& a, const PlanResult& b, const PlannerOptions& options);

// Whether two makespans (seconds, or any cost unit) are the same time: each
// is a sum of doubles, taken in another order for another schedule of the
// same work, so equal ones may differ in their last bits (resnet18's
// framework order and best-order's sum one cost to 0.008567087322399988
// and 0.00856708732239999). Within a relative 1e-12: the rounding of sums of
// many terms, not a real difference (a transfer of a few bytes beside
// seconds of compute is 1e-9 of it, and decides: no copies, where it is
// all that differs).
bool SameMakespan(double a, double b);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_COMPOSE_H_
