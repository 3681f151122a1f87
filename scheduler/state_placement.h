// Planning graphs whose optimizer state has auto homes (state=auto,
// docs/training.md): the plan chooses per tensor whether it lives on the
// device or on the host between steps (Note [State placement] in
// state_placement.cc).
#ifndef PEBBLE_SCHEDULER_STATE_PLACEMENT_H_
#define PEBBLE_SCHEDULER_STATE_PLACEMENT_H_

#include <functional>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/planner.h"

namespace pebble {

// Plans a graph with concrete homes (no kAuto): the updates-last planner.
using ConcretePlanner =
    std::function<absl::StatusOr<PlanResult>(const Graph&, const PlannerOptions&)>;

// The plan of `graph`, every auto home chosen: `plan` plans `graph` with
// some of those tensors resident and the others streamed from the host, and
// the fastest plan that fits the budget is kept (at "min": the fastest at
// the least peak). The schedule is one of `graph` (ResolveHomes reads the
// choice back from it); details["state_placement"] gives the counts and
// bytes of each side and the plans made. Errors: those of `plan`.
// Whether plan `a` is faster than `b` (then: a lower peak): how the
// placement searches rank the plans that fit.
bool Faster(const PlanResult& a, const PlanResult& b);

absl::StatusOr<PlanResult> PlaceAutoState(const Graph& graph, const PlannerOptions& options,
                                          const ConcretePlanner& plan);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_STATE_PLACEMENT_H_
