#include "scheduler/policies.h"

namespace pebble {

void RegisterBuiltinPlanners(PlannerRegistry& registry) {
  RegisterBaselinePlanner(registry);
  RegisterDfsPlanner(registry);
  RegisterGreedyPlanner(registry);
  RegisterTreePlanner(registry);
  RegisterExactOrderPlanner(registry);
  RegisterBestOrderPlanner(registry);
}

}  // namespace pebble
