// Registration hooks of the built-in policies, one per policy .cc file.
// RegisterBuiltinPlanners (policies.cc) calls each; adding a policy means a
// line here and a line there.
#ifndef PEBBLE_SCHEDULER_POLICIES_H_
#define PEBBLE_SCHEDULER_POLICIES_H_

#include "scheduler/planner.h"

namespace pebble {

void RegisterBaselinePlanner(PlannerRegistry& registry);
// One-shot order policies (scheduler/orders.h).
void RegisterDfsPlanner(PlannerRegistry& registry);
void RegisterGreedyPlanner(PlannerRegistry& registry);
void RegisterTreePlanner(PlannerRegistry& registry);
void RegisterExactOrderPlanner(PlannerRegistry& registry);
void RegisterBestOrderPlanner(PlannerRegistry& registry);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_POLICIES_H_
