// Planning graphs whose updates may run on either side (runs_on auto;
// updates=auto, docs/training.md): the plan chooses per parameter whether
// its updates run on the host or on the device (Note [Update placement] in
// update_placement.cc).
#ifndef PEBBLE_SCHEDULER_UPDATE_PLACEMENT_H_
#define PEBBLE_SCHEDULER_UPDATE_PLACEMENT_H_

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/planner.h"
#include "scheduler/state_placement.h"

namespace pebble {

// The plan of `graph`, every update that runs_on auto placed: `plan` plans
// `graph` with some parameters' updates on the host and the others on the
// device, and the fastest plan that fits the budget is kept (at "min": the
// fastest at the least peak). The schedule is one of `graph` (a host
// update is a host_compute step); details["update_placement"] gives the
// counts and parameter bytes of each side and the plans made. Errors:
// those of `plan`.
absl::StatusOr<PlanResult> PlaceUpdates(const Graph& graph, const PlannerOptions& options,
                                        const ConcretePlanner& plan);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_UPDATE_PLACEMENT_H_
