// Buckets of collectives planned for any policy's plan of a sharded graph
// (docs/semantics.md, "Buckets of collectives"): gathers, and
// reduce-scatters, sent as one message where the simulator finds that
// faster within the budget (Note [Planned buckets of collectives] in
// collective_buckets.cc).
#ifndef PEBBLE_SCHEDULER_COLLECTIVE_BUCKETS_H_
#define PEBBLE_SCHEDULER_COLLECTIVE_BUCKETS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/planner.h"

namespace pebble {

// The most bytes of local gradients one message of reduce-scatters may
// hold: where the runtime sends them through a staging buffer of its own
// (a persistent node of op "staging_buffer", as pebble.torch's graphs
// have), the least of those buffers' bytes; else INT64_MAX (no bound).
int64_t StagingCap(const Graph& graph);

// The dtype a collective's message carries, by name ("fp32"), for telling
// whether two may be one message: the node's dtype, else the "dtype" its
// attrs name (a capture's), else its input's (a gather's shard, a
// reduce-scatter's local gradient), else "" (unknown: equal only to
// another unknown, as in a graph written without dtypes).
std::string MessageDtype(const Graph& graph, NodeId v);

// `planned` (a plan of a sharded graph, simulated with `options`) with
// neighbouring messages of one op joined into one where that makes the
// simulated makespan no longer, and shorter or no higher in peak, within
// the budget where the plan fits it (else within its own peak):
//  - gathers: the later message's steps move up to the earlier one's, and
//    the members' frees that follow it move together, to the last of them
//    (a runtime may then free the message's storage as one);
//  - reduce-scatters: the earlier message's steps move down to the later
//    one's; the frees of their local gradients, and the steps between that
//    read their shards (an update) or follow from those, go after the
//    bucket; at most StagingCap(graph) bytes of local gradients a message.
// Members must carry one link (CollectiveLinkOf) and one dtype
// (MessageDtype). Bounded by `max_simulated_steps` (the default about a
// second of simulation), half for the gathers, not by the clock (the ranks
// must reach the same plan). details["collective_buckets"]: messages
// joined, simulations, and whether the bound left pairs untried ("cut").
inline constexpr int64_t kMaxJoinSimulatedSteps = 30'000'000;
absl::StatusOr<PlanResult> JoinCollectiveMessages(
    const Graph& graph, PlanResult planned, const PlannerOptions& options,
    int64_t max_simulated_steps = kMaxJoinSimulatedSteps);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_COLLECTIVE_BUCKETS_H_
