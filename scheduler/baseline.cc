// The `baseline` policy: the graph's own order, each tensor freed at its last
// use (SPEC section 2), as a framework without memory planning runs it.
#include <memory>

#include "scheduler/policies.h"
#include "graph/status.h"

namespace pebble {
namespace {

class BaselinePlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    ASSIGN_OR_RETURN(Schedule schedule, FreeAtLastUse(graph, DefaultOrder(graph)));
    return FinishPlan(graph, std::move(schedule), options);
  }
};

}  // namespace

void RegisterBaselinePlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "baseline",
      .description = "the graph's own order, every tensor freed at its last use "
                     "(what a framework runs); no recomputation, no offload",
      .kind = PlanKind::kOneShot,
      .exact = false,
      .factory = [] { return std::make_unique<BaselinePlanner>(); },
  });
}

}  // namespace pebble
