// Checkmate: optimal tensor rematerialization as a mixed-integer linear
// program, and its LP relaxation with two-phase rounding. Jain, Jain,
// Nrusimha, Gholami, Abbeel, Keutzer, Stoica and Gonzalez, "Checkmate:
// Breaking the Memory Wall with Optimal Tensor Rematerialization", MLSys
// 2020 (section 4: the MILP; section 5: the approximation).
//
// Policies (PlanKind::kMultiShot, registered by RegisterCheckmatePlanners):
//
//   checkmate     the MILP, solved by CBC within PlannerOptions::time_limit_s;
//                 optimal within Checkmate's model when details.optimal.
//   checkmate-lp  the LP relaxation (Clp), rounded in two phases; a
//                 heuristic, never claimed optimal.
//
// Note [Checkmate's model]
// ------------------------
// The needed non-persistent nodes, in a fixed topological order v_0..v_{n-1}
// (the graph's DefaultOrder), define n stages. Stage t computes v_t for the
// first time, after (re)computing whatever of v_0..v_{t-1} it needs, always
// in the fixed order. Binary variables:
//   R[t][i]  v_i is computed in stage t               (i <= t, R[t][t] = 1)
//   S[t][i]  v_i is resident when stage t starts      (i < t, S[0] empty)
// and S[n][i] := [v_i is an output] (the end of the schedule). Constraints
// (paper's numbering in brackets):
//   [1b] R[t][j] <= R[t][i] + S[t][i]   for every input v_i of v_j, j <= t
//   [1c] S[t+1][i] <= R[t][i] + S[t][i]
//   [1d] R[t][t] = 1;  R, S lower-triangular (the frontier advances)
//   outputs: R[n-1][o] + S[n-1][o] >= 1 (S[n] as above)
// Memory: with m_i = bytes(v_i), w_k = workspace(v_k) and FREE[t][i][k] in
// [0, 1] for i in inputs(v_k) + {v_k} ("v_i is freed right after v_k is
// computed in stage t"),
//   U[t][0] = sum_i m_i S[t][i] + m_0 R[t][0]
//   U[t][k] = U[t][k-1] - sum_{i in F(k-1)} m_i FREE[t][i][k-1] + m_k R[t][k]
//   U[t][k] + w_k R[t][k] <= budget - persistent_bytes
// U[t][k] is the memory while v_k is computed in stage t: everything
// resident at the stage start, plus what the stage computed up to v_k, less
// what it freed (the paper's eq. 2 to 4, plus the workspace term, which the
// paper does not have). Objective: minimise sum_t sum_i cost(v_i) R[t][i].
//
// Deviations from the paper, all of them exact (the integer solutions and
// the optimum are unchanged) unless said otherwise:
//  * FREE is continuous and only bounded from above by its hazards:
//      FREE[t][i][k] <= R[t][k],  FREE[t][i][k] <= 1 - S[t+1][i],
//      FREE[t][i][k] <= 1 - R[t][j]  for every reader v_j of v_i, k < j <= t,
//    plus one row per (t, i): sum_k FREE[t][i][k] + S[t+1][i] <=
//    R[t][i] + S[t][i]. The paper's two-sided big-M linearisation pins FREE
//    to the product it stands for; here FREE can only be smaller, which only
//    over-counts memory, and the solver raises it to the product whenever
//    memory binds. For integral R and S the feasible sets therefore coincide;
//    the LP relaxation is tighter (one hazard a row instead of their sum).
//  * Note [dominance rows]: three families of rows cut off solutions that
//    waste work, never all optimal ones (removing a wasted recomputation or
//    checkpoint keeps a plan valid and costs no more memory or compute):
//      R[t][i] <= sum_{readers v_j of v_i, j <= t} R[t][j] + S[t+1][i],
//      S[t][i] <= the same right-hand side,
//      R[t][i] + S[t][i] <= 1,                          for i < t,
//    the first two dropped where S[t+1][i] is the constant 1 (an output at
//    the end). They do not change the optimum; they prune the search.
//  * Outputs: the paper's graphs end in one node; here several outputs must
//    be resident at the end, hence S[n] and the output rows.
//  * Workspace counts while its node is computed (SPEC section 2).
//  * Zero-cost nodes: their R variables get an objective of epsilon =
//    1e-3 / (number of such variables + 1), in units of the smallest
//    positive cost, so that the solver does not recompute them for nothing;
//    all epsilons together stay below a thousandth of the smallest positive
//    cost. Positive costs are left as they are (an integral objective lets
//    CBC prune by integrality).
//
// From a solution to a SPEC schedule (StagePlanToSchedule): stages in order;
// in stage t the nodes with R[t][i] = 1 that are not already resident are
// computed in the fixed order; a node is freed right after its last reader
// in the stage (or after itself, when nothing in the stage reads it, or at
// the stage start when it is resident, unread and not kept) unless
// S[t+1][i] = 1. The resident set at every compute is then a subset of the
// set U[t][k] counts, so the simulated peak is at most the MILP's bound.
// Before converting, R is replaced by the least R that S admits
// (ComputeForKeep), which is never more expensive nor larger in memory.
// After converting, computes whose result nobody reads are removed
// (RemoveDeadComputes). That step can beat the model: when a plan computes
// v_t in stage t, drops it and recomputes it later before any use, the
// first computation disappears, which amounts to a different order of first
// computations. The reported MILP objective is the model's; the schedule's
// compute_cost can be lower.
//
// The fixed order restricts Checkmate to schedules whose first computations
// follow it and whose recomputations in a stage follow it, each node at most
// once a stage: the MILP is optimal within that model, and can be worse
// than the unrestricted optimum (policy `exact`) on graphs with more than
// one topological order. Example (unit costs, nothing persistent): p and
// o1 (10 B each) read nothing, o2 (1 B) <- p; outputs o1 and o2; order
// p, o1, o2. The last stage computes o2 while o1 (an output, computed
// earlier in the stage or kept) and p are resident: 21 B, whatever the plan.
// The order p, o2, free p, o1 peaks at 11 B.
#ifndef PEBBLE_SCHEDULER_CHECKMATE_H_
#define PEBBLE_SCHEDULER_CHECKMATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/schedule.h"

namespace pebble {

// A plan in Checkmate's stage form (Note [Checkmate's model]).
struct StagePlan {
  // v_0..v_{n-1}: a topological order of the needed non-persistent nodes.
  std::vector<NodeId> order;
  // compute[t] has t + 1 entries: R[t][0..t].
  std::vector<std::vector<uint8_t>> compute;
  // keep[t] has t entries for t in 0..n-1 (S[t][0..t-1]); keep[n] has n
  // entries: what stays resident at the end (at least the outputs).
  std::vector<std::vector<uint8_t>> keep;
};

// Checks the shapes and constraints [1b], [1c] and the outputs' residency at
// the end; InvalidArgument names the stage and node.
absl::Status ValidateStagePlan(const Graph& graph, const StagePlan& plan);

// Phase two of the two-phase rounding (paper section 5): given the order and
// S (keep, shaped as in StagePlan; keep[n] is replaced by the outputs), the
// least R that satisfies [1b], [1c] and [1d]: per stage, v_t and every node
// that S[t+1] keeps but S[t] does not hold, closed under inputs that S[t]
// does not hold. No other R admitted by S is cheaper or uses less memory.
StagePlan ComputeForKeep(const Graph& graph, std::vector<NodeId> order,
                         std::vector<std::vector<uint8_t>> keep);

// The SPEC schedule of a valid plan (Note [Checkmate's model], "From a
// solution"): its compute cost is the plan's sum of cost(v_i) R[t][i] (a
// node already resident is not computed again) and its peak is at most the
// MILP's memory bound. Dead computes are kept (the policies remove them
// afterwards). Error when the plan is invalid.
absl::StatusOr<Schedule> StagePlanToSchedule(const Graph& graph,
                                             const StagePlan& plan);

// Removes every compute whose result is neither read before it is freed or
// recomputed nor needed at the end (an output resident after the last
// step), together with its matching free; one backward liveness pass. The
// result is valid if `schedule` is, with no more cost, steps or memory at
// any step.
Schedule RemoveDeadComputes(const Graph& graph, const Schedule& schedule);

// Checkmate's stage form of any schedule (a warm start for the MILP): S[t]
// is the set of v_0..v_{t-1} that `schedule` holds on the device right
// before its first compute after the first compute of v_{t-1} (S[0] empty),
// and R is ComputeForKeep's least R for that S. When the schedule's first
// computations follow `DefaultOrder(graph)` and each stage recomputes a node
// at most once, in that order (the chain policies on a chain), the plan
// computes what the schedule computes; otherwise it is some valid plan of
// the model, possibly costlier or larger. Offload steps count as leaving the
// device; a node never computed is computed in its own stage.
StagePlan StagePlanFromSchedule(const Graph& graph, const Schedule& schedule);

// The plan that FreeAtLastUse(DefaultOrder) makes: every node computed once
// in its own stage and kept until its last reader's stage.
StagePlan OneShotStagePlan(const Graph& graph);

// A lower bound on the peak of every schedule of `graph`: persistent bytes
// plus the largest of (the bytes of a needed node, of its distinct
// non-persistent inputs and its workspace) and the outputs' bytes. With
// aliases, bytes are the storages' (SPEC section 1), each counted once.
int64_t PeakLowerBound(const Graph& graph);

struct CheckmateOptions {
  // Device budget in bytes; kMinBudgetBytes (-1): the lowest peak first.
  int64_t budget_bytes = INT64_MAX;
  double time_limit_s = 60;  // wall clock, for the whole call
  uint64_t seed = 0;         // randomised rounding (LP only)
  // Plans of other policies offered to the MILP as starts (MILP only): each
  // is converted by StagePlanFromSchedule and simulated; the best that fits
  // (cheapest; under kMinBudgetBytes the lowest peak) is CBC's MIP start.
  // A good start lets CBC prune from the first node: on linear:n=20 at 7
  // bytes rotor's plan meets the root LP bound, which proves it optimal.
  struct WarmStart {
    std::string name;  // the policy, for CheckmateResult::note
    Schedule schedule;
  };
  std::vector<WarmStart> warm_starts;
  // The largest graph (needed non-persistent nodes) the solver takes; 0:
  // its default (kMaxMilpStages, kMaxLpStages). The model has O(n^2)
  // variables and constraints: past the defaults, CBC and Clp rarely finish
  // within minutes, but a user with time may raise the cap.
  int max_stages = 0;
};

struct CheckmateResult {
  enum class Status {
    kOptimal,      // proven optimal in Checkmate's model
    kFeasible,     // a plan within the budget, not proven optimal
    kInfeasible,   // proven: no plan of the model fits the budget
    kNoSolution,   // stopped (time limit) before finding a plan
  };
  Status status = Status::kNoSolution;
  StagePlan plan;           // valid when status is kOptimal or kFeasible
  int64_t budget_bytes = 0;  // the budget solved at (min: the peak found)
  double objective = 0;     // sum of cost(v_i) R[t][i] of `plan`
  double lower_bound = 0;   // on the model's optimum, in cost units
  double gap = 0;           // (objective - lower_bound) / objective
  double solve_s = 0;       // wall clock of the whole call
  int num_variables = 0;
  int num_integer_variables = 0;
  int num_constraints = 0;
  std::string note;         // how the plan was found (rounding, phases)
  // The time limit stopped a solve (or kept one from starting) before it
  // finished: the plan, if any, is the best found by then.
  bool time_limit_reached = false;
};

// Solves the MILP with CBC (log silenced; time limit in wall-clock seconds,
// the best incumbent returned when it is reached). With kMinBudgetBytes it
// first minimises the peak (half the time at most), then the cost at the
// peak found. The returned plan's SPEC peak is within the budget (checked by
// simulation). Error only for graphs past the size limit (kMaxMilpStages).
inline constexpr int kMaxMilpStages = 300;
absl::StatusOr<CheckmateResult> SolveCheckmateMilp(const Graph& graph,
                                                   const CheckmateOptions& options);

// Solves the LP relaxation with Clp and rounds it in two phases: S by a
// threshold (0.5 first, the paper's deterministic rule, then others) and by
// seeded randomised rounding, R by ComputeForKeep; keeps the cheapest
// rounding whose simulated peak fits. When none fits, re-solves the LP with
// smaller budgets. kOptimal is never returned; lower_bound is the LP's
// optimum at the requested budget. kMinBudgetBytes: binary search over the
// budget. Error only past kMaxLpStages.
inline constexpr int kMaxLpStages = 600;
absl::StatusOr<CheckmateResult> SolveCheckmateLp(const Graph& graph,
                                                 const CheckmateOptions& options);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_CHECKMATE_H_
