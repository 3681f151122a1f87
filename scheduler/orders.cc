// Helpers shared by the one-shot order policies (scheduler/orders.h).
#include "scheduler/orders.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "graph/status.h"

namespace pebble {

absl::StatusOr<int64_t> OrderPeak(const Graph& graph,
                                  const std::vector<NodeId>& order) {
  const int n = graph.num_nodes();
  const int len = static_cast<int>(order.size());
  // position[v]: index of v in `order`; last_reader[u]: the largest
  // position of a reader of u (-1: none in the order).
  std::vector<int> position(n, -1);
  std::vector<int> last_reader(n, -1);
  for (int i = 0; i < len; ++i) {
    const NodeId v = order[i];
    if (v < 0 || v >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("order position ", i, ": node id ", v, " out of range"));
    }
    if (graph.persistent(v) || !graph.needed()[v] || position[v] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "order: node '", graph.id(v),
          "' is persistent, not needed or repeated"));
    }
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u) && position[u] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("order: node '", graph.id(v),
                         "' comes before its input '", graph.id(u), "'"));
      }
      last_reader[u] = i;
    }
    position[v] = i;
  }
  for (NodeId v = 0; v < n; ++v) {
    if (graph.needed()[v] && !graph.persistent(v) && position[v] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("order: node '", graph.id(v), "' is missing"));
    }
  }
  int64_t mem = graph.persistent_bytes();
  int64_t peak = mem;
  for (int i = 0; i < len; ++i) {
    const NodeId v = order[i];
    mem += graph.bytes(v);
    peak = std::max(peak, mem + graph.workspace(v));
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u) && !graph.is_output(u) && last_reader[u] == i) {
        mem -= graph.bytes(u);
      }
    }
    if (last_reader[v] < 0 && !graph.is_output(v)) mem -= graph.bytes(v);
  }
  return peak;
}

absl::StatusOr<PlanResult> PlanFromOrder(const Graph& graph,
                                         const std::vector<NodeId>& order,
                                         const PlannerOptions& options) {
  ASSIGN_OR_RETURN(Schedule schedule, FreeAtLastUse(graph, order));
  return FinishPlan(graph, std::move(schedule), options);
}

}  // namespace pebble
