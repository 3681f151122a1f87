// Registration hooks of the built-in policies, one per policy .cc file.
// RegisterBuiltinPlanners (policies.cc) calls each; adding a policy means a
// line here and a line there.
#ifndef PEBBLE_SCHEDULER_POLICIES_H_
#define PEBBLE_SCHEDULER_POLICIES_H_

#include <array>

#include "scheduler/planner.h"

namespace pebble {

void RegisterBaselinePlanner(PlannerRegistry& registry);
// One-shot order policies (scheduler/orders.h).
void RegisterDfsPlanner(PlannerRegistry& registry);
void RegisterGreedyPlanner(PlannerRegistry& registry);
void RegisterTreePlanner(PlannerRegistry& registry);
void RegisterExactOrderPlanner(PlannerRegistry& registry);
void RegisterBestOrderPlanner(PlannerRegistry& registry);
// Multi-shot policies: Checkmate's MILP and LP (scheduler/checkmate.h) and
// the exact search (scheduler/exact_multishot.h).
void RegisterCheckmatePlanners(PlannerRegistry& registry);
void RegisterExactMultiShotPlanner(PlannerRegistry& registry);
// Chain checkpointing and rematerialisation heuristics (scheduler/remat.h).
void RegisterSqrtnPlanner(PlannerRegistry& registry);
void RegisterChenGreedyPlanner(PlannerRegistry& registry);
void RegisterArticulationPlanner(PlannerRegistry& registry);
void RegisterRevolvePlanner(PlannerRegistry& registry);
void RegisterRotorPlanner(PlannerRegistry& registry);
void RegisterDtrPlanner(PlannerRegistry& registry);
// Host-offload policies (scheduler/offload.h).
void RegisterVdnnPlanner(PlannerRegistry& registry);
void RegisterSwapPlanner(PlannerRegistry& registry);
void RegisterHybridPlanner(PlannerRegistry& registry);
// PyTorch FSDP's rules on a sharded graph (scheduler/remat_fsdp.cc): one
// policy per way of wrapping its units, these names.
void RegisterFsdpPlanner(PlannerRegistry& registry);
inline constexpr std::array<const char*, 3> kFsdpPolicies = {"fsdp", "fsdp-module",
                                                            "fsdp-blocks"};

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_POLICIES_H_
