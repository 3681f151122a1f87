#include "scheduler/policies.h"

namespace pebble {

void RegisterBuiltinPlanners(PlannerRegistry& registry) {
  RegisterBaselinePlanner(registry);
}

}  // namespace pebble
