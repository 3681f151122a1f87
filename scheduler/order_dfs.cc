// The `dfs` policy: a depth-first post-order from the outputs
// (scheduler/orders.h, DfsOrder).
//
// Note [dfs child order]: Sethi and Ullman (1970) evaluate the operand that
// needs more registers first; Liu (1986) generalises this to tensors of
// different sizes: a post-order of a tree is best when the children of every
// node are visited in decreasing (P(c) - bytes(c)), P(c) the peak of c's
// subtree, because while child i runs the results of children 1..i-1 are
// held. On a DAG a node's cone is not a tree (shared inputs are computed
// once, by the first visitor), so P below over-estimates; it is still a good
// key, and the order is a valid post-order whatever the key.
#include <algorithm>
#include <memory>
#include <vector>

#include "graph/status.h"
#include "scheduler/orders.h"
#include "scheduler/policies.h"

namespace pebble {
namespace {

// Sorts `children` (non-persistent inputs, or the outputs) in decreasing
// (peak - bytes), ties in their given order.
void SortChildren(const Graph& graph, const std::vector<int64_t>& peak,
                  std::vector<NodeId>& children) {
  std::stable_sort(children.begin(), children.end(), [&](NodeId a, NodeId b) {
    return peak[a] - graph.bytes(a) > peak[b] - graph.bytes(b);
  });
}

// Iterative post-order from `roots`; a node's children are
// children[start[v] .. start[v] + count[v]), visited in that order.
std::vector<NodeId> PostOrder(const Graph& graph, const std::vector<NodeId>& roots,
                              const std::vector<int32_t>& start,
                              const std::vector<int32_t>& count,
                              const std::vector<NodeId>& children) {
  std::vector<NodeId> order;
  order.reserve(graph.num_nodes());
  std::vector<uint8_t> visited(graph.num_nodes(), 0);
  std::vector<std::pair<NodeId, int32_t>> stack;  // (node, next child)
  for (NodeId root : roots) {
    if (visited[root]) continue;
    visited[root] = 1;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      const NodeId v = stack.back().first;
      const int32_t next = stack.back().second;
      if (next < count[v]) {
        ++stack.back().second;
        const NodeId c = children[start[v] + next];
        if (!visited[c]) {
          visited[c] = 1;
          stack.push_back({c, 0});
        }
      } else {
        order.push_back(v);
        stack.pop_back();
      }
    }
  }
  return order;
}

class DfsPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    ASSIGN_OR_RETURN(std::vector<NodeId> order, DfsOrder(graph));
    return PlanFromOrder(graph, order, options);
  }
};

}  // namespace

absl::StatusOr<std::vector<NodeId>> DfsOrder(const Graph& graph) {
  const int n = graph.num_nodes();
  // Children (distinct non-persistent inputs) of every needed node, sorted
  // by Note [dfs child order], in compressed rows. P(v) is computed in
  // topological order, so the children's P are known.
  std::vector<int64_t> peak(n, 0);
  std::vector<NodeId> children;
  children.reserve(n);
  std::vector<NodeId> row;
  std::vector<int32_t> start(n, 0);
  std::vector<int32_t> count(n, 0);
  for (NodeId v : graph.topological_order()) {
    if (!graph.needed()[v] || graph.persistent(v)) continue;
    row.clear();
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u)) row.push_back(u);
    }
    SortChildren(graph, peak, row);
    // Liu's contiguous peak: child i runs while children 0..i-1 are held;
    // then v is computed with all of them resident.
    int64_t held = 0;
    int64_t p = 0;
    for (NodeId c : row) {
      p = std::max(p, held + peak[c]);
      held += graph.bytes(c);
    }
    peak[v] = std::max(p, held + graph.bytes(v) + graph.workspace(v));
    start[v] = static_cast<int32_t>(children.size());
    count[v] = static_cast<int32_t>(row.size());
    children.insert(children.end(), row.begin(), row.end());
  }

  // Note [dfs root order]: the outputs are children of a virtual root, but
  // unlike a tree's subtrees they share most of their cones: in a training
  // graph every parameter gradient reads the chain of activation gradients,
  // and Liu's key sends the search to the first layer's gradient first,
  // computing the whole backward chain while every gradient waits for its
  // weight-gradient reader (about twice the baseline's peak). So two root
  // orders are tried, Liu's key and the graph's own order (the order a
  // framework produces the outputs in), and the lower peak is kept (Liu's
  // on a tie).
  std::vector<NodeId> roots;
  for (NodeId v : graph.topological_order()) {
    if (graph.is_output(v) && !graph.persistent(v)) roots.push_back(v);
  }
  std::vector<NodeId> own_order = PostOrder(graph, roots, start, count, children);
  SortChildren(graph, peak, roots);
  std::vector<NodeId> liu_order = PostOrder(graph, roots, start, count, children);
  ASSIGN_OR_RETURN(const int64_t liu_peak, OrderPeak(graph, liu_order));
  ASSIGN_OR_RETURN(const int64_t own_peak, OrderPeak(graph, own_order));
  return own_peak < liu_peak ? own_order : liu_order;
}

void RegisterDfsPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "dfs",
      .description = "depth-first post-order from the outputs, the input "
                     "needing the most memory first (Sethi-Ullman / Liu "
                     "1986), freed at last use",
      .kind = PlanKind::kOneShot,
      .exact = false,
      .factory = [] { return std::make_unique<DfsPlanner>(); },
  });
}

}  // namespace pebble
