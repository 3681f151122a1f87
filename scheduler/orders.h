// Execution orders for one-shot plans (SPEC section 2, "free at last use").
//
// A one-shot plan is an execution order: a topological order of the needed
// (output or ancestor of an output) non-persistent nodes, turned into steps
// by FreeAtLastUse(). The policies of this family differ only in how they
// pick the order; each is a function here so that best-order, benchmarks and
// later multi-shot planners can reuse it, and a thin Planner in its own
// order_<name>.cc file registers it:
//
//   dfs          DfsOrder       post-order from the outputs, larger subtrees
//                               first (Sethi and Ullman 1970, Liu 1986)
//   greedy       GreedyOrder    list scheduling by net bytes allocated,
//                               forwards and backwards (XLA's list
//                               scheduler, TensorFlow's linearize experiment)
//   tree         TreeOrder      optimal for in-trees (Liu 1987)
//   exact-order  ExactOrder     optimal for any DAG, by a search over the
//                               sets of computed nodes (small graphs only)
//   best-order   (all above)    the lowest peak of the applicable ones
//
// Memory model (SPEC section 2): with S the set of nodes computed so far, the
// resident bytes are persistent_bytes() plus the bytes of every node of S
// that is an output or still has a needed reader outside S. Computing v next
// peaks at that plus bytes(v) plus workspace(v); then v's inputs whose last
// reader is v are freed. The memory between steps depends on S alone, not on
// the order that computed S, which is what makes ExactOrder's search finite.
#ifndef PEBBLE_SCHEDULER_ORDERS_H_
#define PEBBLE_SCHEDULER_ORDERS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/planner.h"

namespace pebble {

// The peak bytes of FreeAtLastUse(graph, order), equal to what Simulate()
// reports for that schedule, in O(V + E) without building it. `order` must
// be what FreeAtLastUse accepts; else InvalidArgument naming the node.
absl::StatusOr<int64_t> OrderPeak(const Graph& graph,
                                  const std::vector<NodeId>& order);

// FreeAtLastUse(order), then FinishPlan(): the common tail of every one-shot
// policy, so that budgets and feasibility mean the same for all of them.
absl::StatusOr<PlanResult> PlanFromOrder(const Graph& graph,
                                         const std::vector<NodeId>& order,
                                         const PlannerOptions& options);

// `dfs`: depth-first post-order from the outputs. The inputs of a node (and
// the outputs, children of a virtual root) are visited in decreasing order
// of (P(u) - bytes(u)), where P(u) is the peak of u's cone computed as if it
// were a tree with contiguous subtrees (Liu 1986's rule, which is Sethi and
// Ullman's register rule with sizes): the child that needs the most memory
// beyond what it leaves behind goes first, while the fewest siblings'
// results are held. Ties keep operand order. The outputs are visited both in
// that order and in the graph's own order, and the lower peak is kept (see
// Note [dfs root order] in order_dfs.cc: on training graphs Liu's key alone
// nearly doubles the baseline's peak).
// Optimal among post-orders of an in-tree, but post-orders are not optimal
// even there (TreeTest.BeatsEveryPostOrder: 16 against 12); a heuristic on
// DAGs, where shared inputs make P an over-estimate. O(E log E) time, iterative (no recursion),
// so it takes graphs of any depth.
absl::StatusOr<std::vector<NodeId>> DfsOrder(const Graph& graph);

// `greedy`: list scheduling. kForward runs, at every step, the ready node
// whose compute leaves the least memory resident: the smallest (bytes it
// allocates and keeps) - (bytes of inputs it frees as their last reader).
// kReverse schedules from the outputs backwards (a node is ready once all its
// needed readers are placed; the score is the same quantity seen from the
// other end: bytes revived minus bytes released) and reverses the result.
// kBoth runs both and keeps the lower peak (the forward one on a tie). Ties:
// the most recently readied node first (depth-first locality), then the
// smaller id. Heap with lazy updates over the graph's compressed rows:
// O((V + E) log V).
//
// Not optimal: a node that frees nothing now may be held for long. Example
// with unit sizes (OrderExamplesTest.GreedyIsNotOptimal): x; y <- x;
// z <- (x, y); d <- x; o1 <- (z, d); o2 <- (x, y), outputs o1, o2. Both
// directions peak at 5 (forwards: x, then d and y tie at +1 and d, the most
// recent, is held to the end); x y o2 z d o1 peaks at 4.
enum class GreedyDirection : uint8_t { kForward, kReverse, kBoth };
absl::StatusOr<std::vector<NodeId>> GreedyOrder(
    const Graph& graph, GreedyDirection direction = GreedyDirection::kBoth);

// OK when the needed part of `graph` is an in-forest: every needed
// non-persistent node has at most one needed reader (persistent nodes may
// have any number). Else InvalidArgument naming a node and two of its readers.
absl::Status CheckInTree(const Graph& graph);

// `tree`: an order of minimum peak for in-forests (CheckInTree), by Liu 1987
// ("An application of generalized tree pebbling to sparse matrix
// factorization"): the optimal schedule of each subtree is kept as a
// sequence of hill-valley segments; siblings' segments are merged in
// decreasing (hill - valley) order, the parent is appended and the result is
// re-segmented. Liu's model is SPEC's: a node's inputs, its output and its
// workspace are resident during its compute. Post-orders (Liu 1986's
// contiguous rule, DfsOrder on a tree) are not optimal in this model: see
// TreeTest.BeatsEveryPostOrder. Outputs with a reader and persistent leaves
// are allowed. Errors: CheckInTree's. Time O(n log n) when segment lists
// stay short (paths, complete trees, unit sizes); O(n^2 log n) in the worst
// case (long segment lists merged at many nodes).
absl::StatusOr<std::vector<NodeId>> TreeOrder(const Graph& graph);

// Limits of ExactOrder. Past max_nodes (needed non-persistent nodes) it
// refuses at once (InvalidArgument); past max_states or time_limit_s it
// gives up (ResourceExhausted). The default state limit keeps the search
// under about 150 MB (some 120 bytes a state at 200 nodes) and 10 s.
struct ExactOrderLimits {
  int max_nodes = 200;
  int64_t max_states = 1'000'000;
  double time_limit_s = 60;
  // Called about once a second while the search runs: states expanded so
  // far, the best peak known (bytes; the heuristic orders') and the
  // search's current lower bound on the optimum (bytes). None: no reports.
  std::function<void(int64_t expanded, int64_t best_bytes, int64_t bound_bytes)> progress;
};

// ExactOrderLimits::progress as PlannerOptions::progress reports ("NAME:
// searching orders, N states", incumbent and bound in bytes).
std::function<void(int64_t, int64_t, int64_t)> ExactOrderProgress(const PlannerOptions& options,
                                                                  const char* name);

// What the search did, for details JSON and benchmarks.
struct ExactOrderStats {
  int64_t peak_bytes = 0;    // the optimum
  int64_t lower_bound = 0;   // the static bound the search started from
  int64_t upper_bound = 0;   // the best heuristic order's peak
  int64_t states = 0;        // distinct computed-sets stored
  int64_t expanded = 0;      // states expanded
  double seconds = 0;
};

// `exact-order`: a topological order of minimum peak over all of them.
// Bottleneck Dijkstra over the computed sets S (downsets of the needed
// nodes), S -> S + {v} costing mem(S) + bytes(v) + workspace(v), a path's
// value its largest step (the peak). Memoised on the bitset of S. Pruning
// (order_exact.cc, Notes [exact search], [state bound], [free moves]):
// (1) the best of the baseline, greedy (both directions) and dfs orders is
// an upper bound U: moves that reach U are never taken, and when nothing
// beats U that order is returned; (2) a static lower bound L (what every
// order holds while a node runs: its inputs, and the ancestors that are
// outputs or are read after it): labels are max(L, path peak), so the
// search stops at the first complete set whose peak is L, and ties go to
// the larger S first; (3) the same bound per state (the nodes of S that are
// outputs or read after a remaining node v are resident while v runs):
// states that cannot beat U are dropped; (4) free moves: a ready node that
// frees at least as much as it keeps and whose compute stays within what
// every completion of S reaches anyway is taken at once, without branching
// (exchange argument: moving it to the front of any completion never raises
// a later step, because the bytes it frees only grow with S). best-order
// runs it with a quarter of the default state limit.
// Deterministic; `stats` may be null.
absl::StatusOr<std::vector<NodeId>> ExactOrder(const Graph& graph,
                                               const ExactOrderLimits& limits = {},
                                               ExactOrderStats* stats = nullptr);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_ORDERS_H_
