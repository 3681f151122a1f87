#include "scheduler/policies.h"

#include <algorithm>
#include <string>

#include "graph/status.h"
#include "scheduler/compose.h"
#include "scheduler/planner.h"

namespace pebble {
namespace {

// Note [dtr keeps the better of its rules]. dtr runs each budget with the
// paper's revivals and with deeper ones and keeps the better plan (Note
// [Deeper revivals], remat_dtr.cc); composed with best-order, the room that
// the composition searches for outputs computed late (compose.cc) is
// judged by whichever of the two dtr kept at each room, and the deeper
// one's fitting first took the search elsewhere: resnet18 at batch 13 and
// 60% cost 35% of recomputation under dtr, 6.9% under dtr-paper, which
// is its paper rule alone. So at a byte budget dtr plans both ways, each
// composed, and keeps the better by BetterPlan: never slower than dtr-paper
// where both fit. At min, and run as a part of another policy's search
// (own_order: hybrid's, which tries dtr-paper itself), it is dtr alone, as
// before.
class BetterOfPlanner final : public Planner {
 public:
  BetterOfPlanner(std::unique_ptr<Planner> first, std::unique_ptr<Planner> second)
      : first_(std::move(first)), second_(std::move(second)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    // (at min, the first's least peak, as before: the second's is no lower,
    // where its own search does not undercut it by a margin of time)
    if (options.own_order || options.budget_bytes == PlannerOptions::kMinBudget) {
      return first_->Plan(graph, options);
    }
    // The first has the whole limit (a note of its limit names the one
    // given), the second what the first left; a plan of the second that
    // its share cut is not taken.
    const Deadline deadline(options.time_limit_s);
    ASSIGN_OR_RETURN(PlanResult first, first_->Plan(graph, options));
    if (deadline.Expired()) return first;
    PlannerOptions rest = options;
    rest.time_limit_s = deadline.remaining_s();
    absl::StatusOr<PlanResult> second = second_->Plan(graph, rest);
    if (!second.ok() || TimeLimitReached(*second) || !BetterPlan(*second, first, options)) {
      return first;
    }
    return *std::move(second);
  }

 private:
  std::unique_ptr<Planner> first_, second_;
};

}  // namespace

void RegisterBuiltinPlanners(PlannerRegistry& global) {
  PlannerRegistry registry;
  RegisterBaselinePlanner(registry);
  RegisterDfsPlanner(registry);
  RegisterGreedyPlanner(registry);
  RegisterTreePlanner(registry);
  RegisterExactOrderPlanner(registry);
  RegisterBestOrderPlanner(registry);
  RegisterCheckmatePlanners(registry);
  RegisterExactMultiShotPlanner(registry);
  RegisterSqrtnPlanner(registry);
  RegisterChenGreedyPlanner(registry);
  RegisterArticulationPlanner(registry);
  RegisterRevolvePlanner(registry);
  RegisterRotorPlanner(registry);
  RegisterDtrPlanner(registry);
  RegisterVdnnPlanner(registry);
  RegisterSwapPlanner(registry);
  RegisterHybridPlanner(registry);
  RegisterFsdpPlanner(registry);
  // Every recomputation and offload policy runs composed with best-order
  // (Note [Composition], compose.cc), but the exhaustive search (which
  // tries every order), swap and hybrid (which plan over best-order's
  // order themselves) and the fsdp rules (a framework's fixed rule, as
  // baseline is).
  auto is_fsdp = [](const std::string& name) {
    return std::find(kFsdpPolicies.begin(), kFsdpPolicies.end(), name) != kFsdpPolicies.end();
  };
  const PolicyInfo* dtr_paper = registry.Find("dtr-paper");
  for (const PolicyInfo* p : registry.List()) {
    PolicyInfo info = *p;
    if (info.kind != PlanKind::kOneShot && info.name != "exact" && info.name != "swap" &&
        info.name != "hybrid" && !is_fsdp(info.name)) {
      info.factory = [inner = info.factory, name = info.name] {
        return ComposeWithBestOrder(inner(), name);
      };
    }
    if (info.name == "dtr" && dtr_paper != nullptr) {  // Note [dtr keeps the better of its rules]
      info.factory = [dtr = info.factory, paper = dtr_paper->factory] {
        return std::make_unique<BetterOfPlanner>(dtr(), ComposeWithBestOrder(paper(), "dtr"));
      };
    }
    // Each is no worse than best-order on a whole step too (Note [best-order
    // on the whole step]).
    info.composed = info.kind != PlanKind::kOneShot && info.name != "exact" && !is_fsdp(info.name);
    global.Register(std::move(info));
  }
}

}  // namespace pebble
