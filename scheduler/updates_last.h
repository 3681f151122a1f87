// Planning graphs with in-place updates (an optimizer's step; docs/semantics.md,
// "Home tiers and in-place updates") with any policy (Note [Updates last]
// in updates_last.cc).
//
// Contract. WithoutUpdates(g) is g without its in-place nodes, each value
// an update reads (a gradient, a state) made an output. A policy plans that
// graph; its schedule, followed by every update in g's topological order,
// each value freed after the last update that reads it (unless an output of
// g), is a schedule of g: every compute that reads a storage comes before
// the storage's update, and each update runs once. Its peak is the larger of
// the policy's peak and the state at its end plus each update's workspace.
// State whose home is the host (read by updates alone) is left out of the
// planned graph too, and streamed through the updates: prefetched before
// the first that touches it, offloaded and freed after the last. Where an
// update reads a value no output keeps (gradients=drop), the updates may
// instead run as soon as they may, inside the policy's schedule: planned
// with a sink per such value, or moved per parameter afterwards, whichever
// simulates lower (Note [Updates early]); details["updates"] says "early"
// or "last".
#ifndef PEBBLE_SCHEDULER_UPDATES_LAST_H_
#define PEBBLE_SCHEDULER_UPDATES_LAST_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"

namespace pebble {

// g without its in-place nodes and its streamed state (see above), same ids
// and order otherwise.
// Errors: a node other than an update reads an update (nothing may follow
// an update but another).
// With `sinks`, each value that only updates read and no output keeps (a
// dropped gradient) is read by a zero-byte output "update_sink:<id>" of op
// kUpdateSinkOp instead of being an output itself (Note [Updates early]):
// right after it in the order where the backward adds it into a .grad (an
// in-place node that is no optimizer's update), else after every node.
absl::StatusOr<Graph> WithoutUpdates(const Graph& graph, bool sinks = false);

// The op of WithoutUpdates' sinks: a planner may move their steps freely.
inline constexpr absl::string_view kUpdateSinkOp = "update_sink";

// `inner` planning WithoutUpdates(g) of a graph with in-place nodes, the
// updates appended; any other graph goes to `inner` as it is. Every
// planner the registry makes is wrapped (planner.cc).
std::unique_ptr<Planner> WithUpdatesLast(std::unique_ptr<Planner> inner);

// Whether only in-place updates read v (an optimizer's state): such a
// tensor may have a home the policies honour.
bool OnlyUpdatesRead(const Graph& graph, NodeId v);

// Whether v is a parameter that an in-place update writes: such a tensor
// may have a home too, and is streamed to its uses (Note [Parameters
// streamed] in updates_last.cc).
bool UpdatedParameter(const Graph& graph, NodeId v);

// Per parameter that an update writes, in the graph's topological order:
// that update, then the updates only it reads (transitively: Adam's
// moments, a momentum buffer). One parameter's step.
std::vector<std::vector<NodeId>> ParameterUpdateGroups(const Graph& graph);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_UPDATES_LAST_H_
