// `exact`: the provably cheapest multi-shot schedule of a tiny graph, the
// oracle that the other multi-shot planners are measured against.
//
// Note [exact multi-shot search]
// ------------------------------
// States are the sets D of resident needed non-persistent nodes (a bitset;
// persistent nodes are always resident). A schedule is a path from the empty
// set to a set holding every output. Moves, each a compute followed by frees:
//
//   compute v, then free a subset F of v's non-persistent inputs:
//     v not in D, every input of v in D,
//     persistent + bytes(D) + bytes(v) + workspace(v) <= budget,
//     D' = (D + v) - F, cost(v), 1 + |F| steps.
//
// Restricting frees this way loses nothing (cost, peak or steps): in any
// schedule, moving a `free u` up to just after the last step before it that
// reads or produces u keeps it valid (nothing in between reads u or can
// compute it, u being resident) and lowers memory in between; if that step is
// `compute u` itself, the pair does nothing and deleting both is cheaper or
// shorter. So some optimal schedule frees only inputs of the compute just
// done. Frees after the last compute are never needed: the outputs stay and
// nothing else counts at the end.
//
// The search is A* on (compute cost, peak, steps) in lexicographic order:
// the cheapest schedule, and among the cheapest the lowest peak (SPEC's
// budget rule: equal makespans, the lower peak), then the fewest steps. The
// heuristic h(D) is the cost and the number of nodes of the set X(D) that
// any completion must compute: the outputs not in D, closed under inputs
// not in D. It is consistent: a move computes one node, and only that node
// can leave X (a node of X upstream of v would make an input of v missing),
// so h drops by at most the move's cost and by at most one step; the peak
// of a path never falls. So (g + h, peak, steps + h_steps) never falls
// along a move and label setting holds for the lexicographic order. Costs
// are summed on a fine grid (Note [Costs on a grid] in the .cc) so that
// equal costs compare equal. Ties are broken by the state's bits, so the
// result is deterministic.
//
// Minimum peak (--budget min): a bottleneck Dijkstra over the same moves
// (the label of a path is the largest memory of its computes) gives the
// lowest peak of any schedule; then the cheapest schedule within 0.5% of
// that peak (SPEC section 5).
//
// Limits: at most kMaxExactMultiShotNodes needed non-persistent nodes (the
// states are 64-bit sets), at most kMaxExactMultiShotStates states stored
// (about 40 bytes each, plus the hash index and the queue: about half a
// GiB), and the time limit; past any of them, an error, never a wrong
// answer. A budget bounds the resident sets, so tight budgets on larger
// graphs stay in reach: linear:n=20 (41 nodes) at 5 or 6 bytes takes well
// under a second.
#ifndef PEBBLE_SCHEDULER_EXACT_MULTISHOT_H_
#define PEBBLE_SCHEDULER_EXACT_MULTISHOT_H_

#include <cstdint>
#include <limits>
#include <optional>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/schedule.h"

namespace pebble {

inline constexpr int kMaxExactMultiShotNodes = 64;
inline constexpr int64_t kMaxExactMultiShotStates = int64_t{1} << 22;

struct ExactMultiShotStats {
  int64_t states = 0;    // distinct sets reached
  int64_t expanded = 0;  // sets expanded
  double seconds = 0;
};

struct ExactMultiShotSolution {
  Schedule schedule;
  double cost = 0;   // sum of compute costs
  int64_t peak = 0;  // SPEC peak, persistent bytes included
};

// The cheapest schedule (compute cost, then fewer steps) whose peak is at
// most `budget_bytes`; nullopt when none exists (proven). InvalidArgument
// past the node limit, ResourceExhausted past the time limit.
absl::StatusOr<std::optional<ExactMultiShotSolution>> ExactMultiShotSchedule(
    const Graph& graph, int64_t budget_bytes, double time_limit_s,
    ExactMultiShotStats* stats = nullptr);

// A schedule of the lowest peak any schedule reaches (not the cheapest at
// that peak: ask ExactMultiShotSchedule for that). Same errors. A finite
// `upper_bytes` (a peak some schedule reaches: a heuristic's) prunes the
// search to moves below it; NotFound where no schedule peaks below it.
absl::StatusOr<ExactMultiShotSolution> ExactMinPeakSchedule(
    const Graph& graph, double time_limit_s, ExactMultiShotStats* stats = nullptr,
    int64_t upper_bytes = std::numeric_limits<int64_t>::max());

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_EXACT_MULTISHOT_H_
