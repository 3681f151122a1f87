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
// makespan wins.
bool BetterPlan(const PlanResult& a, const PlanResult& b, const PlannerOptions& options);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_COMPOSE_H_
