#include "scheduler/updates_last.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {

// Note [Updates last]. An optimizer updates each parameter in place, and
// nothing may read the parameter's earlier value after that: not the data
// gradient that reads the weight, not a recomputation of a forward node.
// Rather than teach every policy that rule, the policy plans the step
// without its updates, keeping what they read, and the updates run at the
// end, where no other compute follows. This keeps every gradient until the
// end, as plans without an optimizer do; running an update as soon as its
// gradient is complete (and freeing the gradient then) is a later policy's
// choice, which the simulator's rules already allow.
//
// Optimizer state whose home is the host (state=host; only updates read it)
// is left out of the planned graph as well, so the forward and backward run
// without it. The update phase streams it: before the first update that
// touches a state tensor, prefetch it; after the last one, offload it (its
// host copy is stale after the write) and free it. Device memory then holds
// one parameter's state at a time on top of the step's end, and the copies
// cost two transfers of the state per step (docs/training.md).

// Whether only in-place updates read v (an optimizer's state).
bool OnlyUpdatesRead(const Graph& graph, NodeId v) {
  for (NodeId r : graph.readers(v)) {
    if (!graph.in_place(r)) return false;
  }
  return true;
}

absl::StatusOr<Graph> WithoutUpdates(const Graph& graph) {
  GraphBuilder b(graph.name());
  std::vector<uint8_t> output(graph.num_nodes(), 0);
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.in_place(v)) {
      for (NodeId u : graph.unique_inputs(v)) {
        if (!graph.in_place(u) && !graph.persistent(u)) output[u] = 1;
      }
      continue;
    }
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.in_place(u)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node ", Quote(graph.id(v)), " reads the in-place update ", Quote(graph.id(u)),
            ": only another update may read an update (pebble plans updates last)"));
      }
    }
    if (graph.home(v) == Tier::kHost && OnlyUpdatesRead(graph, v)) continue;  // streamed
    NodeSpec spec = SpecOf(graph, v);
    spec.home.reset();  // a device home stays resident throughout
    b.AddNode(std::move(spec));
  }
  for (NodeId out : graph.outputs()) {
    if (!graph.in_place(out)) output[out] = 1;
  }
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (output[v]) b.AddOutput(graph.id(v));
  }
  return b.Build();
}

namespace {

// The updates of `graph`, in its topological order, with the frees that
// follow each, and the prefetch, offload and free of each streamed state
// tensor around the updates that touch it (Note [Updates last]).
void AppendUpdates(const Graph& graph, Schedule& schedule) {
  std::vector<NodeId> updates;
  for (NodeId v : graph.topological_order()) {
    if (graph.in_place(v)) updates.push_back(v);
  }
  std::vector<int> last_reader(graph.num_nodes(), -1);  // index into updates
  std::vector<int> last_touch(graph.num_nodes(), -1);   // per storage root
  for (int k = 0; k < static_cast<int>(updates.size()); ++k) {
    for (NodeId u : graph.unique_inputs(updates[k])) {
      last_reader[u] = k;
      last_touch[graph.storage(u)] = k;
    }
    last_touch[graph.storage(updates[k])] = k;
  }
  auto droppable = [&](NodeId u) { return !graph.persistent(u) && !graph.is_output(u); };
  auto streamed = [&](NodeId root) {
    return graph.home(root) == Tier::kHost && OnlyUpdatesRead(graph, root);
  };
  std::vector<uint8_t> fetched(graph.num_nodes(), 0);
  for (int k = 0; k < static_cast<int>(updates.size()); ++k) {
    const NodeId w = updates[k];
    for (NodeId u : graph.unique_inputs(w)) {
      const NodeId root = graph.storage(u);
      if (streamed(root) && !fetched[root]) {
        fetched[root] = 1;
        schedule.steps.push_back({Action::kPrefetch, root});
      }
    }
    schedule.steps.push_back({Action::kCompute, w});
    for (NodeId u : graph.unique_inputs(w)) {
      if (last_reader[u] == k && droppable(u)) schedule.steps.push_back({Action::kFree, u});
    }
    if (last_reader[w] < 0 && droppable(w)) schedule.steps.push_back({Action::kFree, w});
    for (NodeId u : graph.unique_inputs(w)) {  // w's own storage is among its inputs'
      const NodeId root = graph.storage(u);
      if (!streamed(root) || last_touch[root] != k || fetched[root] != 1) continue;
      fetched[root] = 2;
      schedule.steps.push_back({Action::kOffload, root});
      schedule.steps.push_back({Action::kFree, root});
    }
  }
}

class UpdatesLastPlanner final : public Planner {
 public:
  explicit UpdatesLastPlanner(std::unique_ptr<Planner> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    if (!graph.has_in_place()) return inner_->Plan(graph, options);
    ASSIGN_OR_RETURN(const Graph rest, WithoutUpdates(graph));
    ASSIGN_OR_RETURN(PlanResult inner, inner_->Plan(rest, options));
    Schedule schedule;
    schedule.steps.reserve(inner.schedule.steps.size() + 2 * graph.num_nodes());
    for (const Step& step : inner.schedule.steps) {
      schedule.steps.push_back({step.action, graph.Find(rest.id(step.node))});
    }
    AppendUpdates(graph, schedule);
    ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(schedule), options));
    const bool updates_over = inner.feasible && !result.feasible;
    if (!inner.feasible) result.feasible = false;
    result.message = updates_over ? absl::StrCat("the updates' workspace takes the peak to ",
                                                 result.report.peak_bytes, " bytes")
                                  : std::move(inner.message);
    result.details = std::move(inner.details);
    result.details["updates_last"] = true;
    return result;
  }

 private:
  std::unique_ptr<Planner> inner_;
};

}  // namespace

std::unique_ptr<Planner> WithUpdatesLast(std::unique_ptr<Planner> inner) {
  return std::make_unique<UpdatesLastPlanner>(std::move(inner));
}

}  // namespace pebble
