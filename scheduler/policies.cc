#include "scheduler/policies.h"

#include <algorithm>
#include <string>

#include "scheduler/compose.h"

namespace pebble {

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
  for (const PolicyInfo* p : registry.List()) {
    PolicyInfo info = *p;
    if (info.kind != PlanKind::kOneShot && info.name != "exact" && info.name != "swap" &&
        info.name != "hybrid" && !is_fsdp(info.name)) {
      info.factory = [inner = info.factory, name = info.name] {
        return ComposeWithBestOrder(inner(), name);
      };
    }
    // Each is no worse than best-order on a whole step too (Note [best-order
    // on the whole step]).
    info.composed = info.kind != PlanKind::kOneShot && info.name != "exact" && !is_fsdp(info.name);
    global.Register(std::move(info));
  }
}

}  // namespace pebble
