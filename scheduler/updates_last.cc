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
    b.AddNode(SpecOf(graph, v));
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
// follow each (Note [Updates last]).
void AppendUpdates(const Graph& graph, Schedule& schedule) {
  std::vector<NodeId> updates;
  for (NodeId v : graph.topological_order()) {
    if (graph.in_place(v)) updates.push_back(v);
  }
  std::vector<int> last_reader(graph.num_nodes(), -1);  // index into updates
  for (int k = 0; k < static_cast<int>(updates.size()); ++k) {
    for (NodeId u : graph.unique_inputs(updates[k])) last_reader[u] = k;
  }
  auto droppable = [&](NodeId u) { return !graph.persistent(u) && !graph.is_output(u); };
  for (int k = 0; k < static_cast<int>(updates.size()); ++k) {
    const NodeId w = updates[k];
    schedule.steps.push_back({Action::kCompute, w});
    for (NodeId u : graph.unique_inputs(w)) {
      if (last_reader[u] == k && droppable(u)) schedule.steps.push_back({Action::kFree, u});
    }
    if (last_reader[w] < 0 && droppable(w)) schedule.steps.push_back({Action::kFree, w});
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
