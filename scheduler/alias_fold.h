// Planning graphs with aliases (views, SPEC section 1): every planner sees
// storages, not copies (Note [Alias folding] in alias_fold.cc).
//
// Contract. FoldAliases(g) is g without its alias nodes: a reader of an
// alias reads the alias's storage root instead (and whatever the aliases on
// the way read besides), an output that is an alias makes its root an output
// (and those other inputs), a repeated input counts once. A planner plans the
// folded graph; UnfoldSchedule turns its schedule back into one of g:
//  - before each `compute c`, `compute a` for every alias a that c needs (the
//    chain from the root to each alias c reads, in topological order) and
//    that is not resident;
//  - before each `free r` of a storage root, `free a` for its aliases then
//    resident (they hold no bytes, so memory does not move);
//  - at the end, the aliases that are outputs, if not resident, are
//    computed, and every other alias still resident is freed;
//  - but an alias that is an unclipped gradient (Note [Clipping in the
//    graph]) is computed right after the compute that makes the last of
//    the non-aliases it needs resident: on several ranks its all-reduce may
//    then come as soon as the backward is done with it, and join others in
//    a bucket (made just before the clipping reads it, each all-reduce
//    would sit between the clipping's reads of the gradients before it).
// Aliases hold no bytes and never outlive their root's residency, so
// recomputing or prefetching a root never meets a live alias; the unfolded
// schedule is valid on g and has the folded schedule's peak, host peak and
// transfers exactly (its compute cost adds the aliases' costs). Time: an
// alias's free sits right before its root's free (or at the end), so it
// makes no later step wait longer than the folded `free r` did. For views
// that read another tensor besides their base, folding is conservative: the
// folded reader keeps that tensor (Note [Alias folding]).
#ifndef PEBBLE_SCHEDULER_ALIAS_FOLD_H_
#define PEBBLE_SCHEDULER_ALIAS_FOLD_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"

namespace pebble {

struct FoldedGraph {
  Graph graph;  // no aliases; the same ids as the original's non-aliases
  // Folded node -> original node, and original -> folded (kNoNode for an
  // alias).
  std::vector<NodeId> original;
  std::vector<NodeId> folded;
};

// The folded graph of `graph` (see the file comment). Node order: the
// original's topological order without the aliases, so that the folded
// graph's own order (DefaultOrder) is the original's without its aliases.
// Errors: only what GraphBuilder would refuse (none for a valid graph).
absl::StatusOr<FoldedGraph> FoldAliases(const Graph& graph);

// A schedule of folded.graph (valid there; a planner's output) as a
// schedule of `graph`, by the rules of the file comment.
Schedule UnfoldSchedule(const Graph& graph, const FoldedGraph& folded,
                        const Schedule& schedule);

// `inner` planning the folded graph of a graph with aliases, its schedule
// unfolded and simulated on the original graph (the result's report). A
// graph without aliases goes to `inner` as it is: no copy, no cost. Every
// planner the registry makes is wrapped (planner.cc).
std::unique_ptr<Planner> WithAliasFolding(std::unique_ptr<Planner> inner);

// How many views of `graph` (aliases that write nothing in place) read
// another tensor besides their base (expand_as): folding keeps that
// tensor while the view's readers may run, so a plan of such a graph is
// optimal, where a policy says so, over that model only.
int AliasesReadingOthers(const Graph& graph);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_ALIAS_FOLD_H_
