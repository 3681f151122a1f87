// PyTorch FSDP's FULL_SHARD rule as a policy of its own, the point pebble's plans of
// sharded graphs (sharding.cc) compare with: RegisterFsdpPlanner (policies.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "graph/status.h"
#include "scheduler/planner.h"
#include "scheduler/policies.h"
#include "scheduler/schedule.h"

namespace pebble {

namespace {

// The "fsdp" policy: PyTorch FSDP's FULL_SHARD rule on a sharded graph
// (ShardGraph). The graph's own order, every tensor freed at its last use,
// but each gathered parameter that the backward reads as well is freed
// after its last forward reader (reshard_after_forward) and gathered again
// right before its first backward reader. Gathers run on the network
// stream, so one issued after a compute may start before it ends: the
// prefetch FSDP makes. Every policy plans the alias-folded graph
// (planner.cc), so a view of a gathered parameter is computed again from
// the gather. A graph without gathers gets the baseline.
class FsdpPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const std::vector<NodeId> order = DefaultOrder(graph);
    ASSIGN_OR_RETURN(Schedule base, FreeAtLastUse(graph, order));
    std::vector<int> position(graph.num_nodes(), -1);
    for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
    // Per order position: gathers to free after it, gathers to make before it.
    std::vector<std::vector<NodeId>> free_after(order.size()), gather_before(order.size());
    int resharded = 0;
    for (NodeId g : order) {
      if (!graph.collective(g) || graph.op(g) != "all_gather") continue;
      int last_forward = -1, first_backward = INT32_MAX;
      for (NodeId r : graph.readers(g)) {
        if (position[r] < 0) continue;
        if (graph.role(r) == Role::kBackward) {
          first_backward = std::min(first_backward, position[r]);
        } else {
          last_forward = std::max(last_forward, position[r]);
        }
      }
      if (last_forward < 0 || first_backward == INT32_MAX ||
          last_forward > first_backward) {
        continue;
      }
      free_after[last_forward].push_back(g);
      gather_before[first_backward].push_back(g);
      ++resharded;
    }
    Schedule schedule;
    for (const Step& step : base.steps) {
      const int at = step.action == Action::kCompute ? position[step.node] : -1;
      if (at >= 0) {
        for (NodeId g : gather_before[at]) schedule.steps.push_back({Action::kCompute, g});
      }
      schedule.steps.push_back(step);
      if (at >= 0) {
        for (NodeId g : free_after[at]) schedule.steps.push_back({Action::kFree, g});
      }
    }
    ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(schedule), options));
    result.details["resharded_parameters"] = resharded;
    if (!graph.has_collectives()) {
      result.message = "no sharded parameters (plan with --ranks N --shard full): the baseline";
    }
    return result;
  }
};

}  // namespace

void RegisterFsdpPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "fsdp",
      .description = "PyTorch FSDP's FULL_SHARD rule on a sharded graph (--shard full): the "
                     "graph's own order, each parameter gathered before its forward and again "
                     "before its backward, freed after each",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<FsdpPlanner>(); },
  });
}

}  // namespace pebble
