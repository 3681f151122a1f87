// Data parallelism in a plan (docs/semantics.md, "Collectives across
// ranks"): every rank runs the same schedule on its own slice of the batch,
// and each parameter's gradient is summed over the ranks by an all_reduce
// step once the backward is done with it.
#ifndef PEBBLE_SCHEDULER_COLLECTIVES_H_
#define PEBBLE_SCHEDULER_COLLECTIVES_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"

namespace pebble {

// The gradients data parallelism sums: for each parameter p (a persistent
// node of role parameter), the node "grad:p" (SPEC section 3's name) where
// it exists and is computed (not persistent), in the graph's id order.
std::vector<NodeId> GradientsToReduce(const Graph& graph);

// `schedule` with an all_reduce of each of GradientsToReduce(graph) right
// after the step that completes it: its last compute, or the last later
// compute of the backward (no in-place update) that reads its storage,
// whichever comes later; and before anything copies, frees or updates from
// that storage. So the all-reduce overlaps the rest of the backward, and
// the backward reads each rank's own gradient (Note [Where a gradient is
// reduced] in collectives.cc). Errors: a gradient the schedule never
// computes; one the backward reads after it was freed, copied or updated.
absl::StatusOr<Schedule> ReduceGradients(const Graph& graph, const Schedule& schedule);

// A network link by name, with the nominal rate of its standard per
// direction (not a measurement): ethernet-10g (1.25e9 bytes/s, 25 us),
// ethernet-100g (12.5e9, 10 us; NetworkLink's default), ib-hdr (25e9, 5
// us), ib-ndr (50e9, 5 us), nvlink4 (450e9, 3 us: H100's 18 links of
// 25 GB/s); or bytes/s (ParseByteRate: 12.5e9, 10GB) with the default
// latency. InvalidArgument names the text and the presets.
absl::StatusOr<NetworkLink> ParseNetwork(absl::string_view text);

// `inner`, and where options.ranks > 1, its schedule with ReduceGradients's
// all_reduce steps, simulated again with the ranks and their link
// (details["collectives"]: how many, their bytes and the network's busy
// time). Every planner the registry makes is wrapped (planner.cc).
std::unique_ptr<Planner> WithGradientReduction(std::unique_ptr<Planner> inner);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_COLLECTIVES_H_
