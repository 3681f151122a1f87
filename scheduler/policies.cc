#include "scheduler/policies.h"

namespace pebble {

void RegisterBuiltinPlanners(PlannerRegistry& registry) {
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
}

}  // namespace pebble
