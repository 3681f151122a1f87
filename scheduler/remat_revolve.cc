// The `revolve` policy: binomial checkpointing for adjoint chains, Griewank
// and Walther, "Algorithm 799: Revolve: an implementation of checkpointing
// for the reverse or adjoint mode of computational differentiation", ACM
// TOMS 26(1), 2000.
//
// Scope: adjoint chains only (CheckAdjointChain): a forward pass that is a
// path from the input to the loss, every forward node a stage, and a
// backward pass that mirrors it (every backward node reads the forward
// nodes of one stage and the stage input, Note [Chain view of a training
// graph]): tanh-chain, conv3d, Checkmate's `linear` graph. Anything else is
// refused with InvalidArgument naming the node that breaks the chain.
//
// Model: Revolve assumes every state a_i has the same size and every step
// the same cost, so memory is a number of checkpoint slots c (states kept
// besides the one a sweep starts from and the one it works on; Revolve's
// "snaps" are c + 1) and the cost is the number of forward steps. With l
// steps and c slots the least number of forward recomputations is
// T(l, c) = r l - beta(c + 2, r - 1), beta(s, r) = C(s + r, s), r the
// smallest integer with beta(c + 1, r) >= l (Griewank and Walther,
// Proposition 1). The schedule is the recursion behind it: sweep j steps
// from the current checkpoint, keep the state reached, solve the upper l - j
// steps with c - 1 slots, then the lower j with c; j minimises
// j + T(l - j, c - 1) + T(j, c) (ties: the largest j).
//
// Budget: sizes are not uniform in SPEC graphs (the loss is a scalar, the
// gradient frontier adds bytes), so instead of dividing the budget by a
// state size we pick the largest c whose schedule the simulator finds within
// the budget, by bisection on c (peak grows with c; a step where it does not
// only costs optimality, never validity). --budget min: the lowest peak of
// c = 0..3 (of the fewest slots whose schedule is made and the next three,
// on a long chain). The baseline schedule is offered first, so a budget it meets
// costs nothing. Optimal in Revolve's model (uniform sizes and costs); on
// heterogeneous chains `rotor` weighs both.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "scheduler/policies.h"
#include "scheduler/remat.h"

namespace pebble {

__extension__ using RevolveInt128 = __int128;

// T(l, c) of the header comment; c < 0 allows l <= 1 only.
int64_t RevolveForwardSteps(int64_t l, int64_t c) {
  if (l <= 1) return 0;
  if (c < 0) return INT64_MAX / 4;
  if (c >= l - 1) return l - 1;
  if (c == 0) return l * (l - 1) / 2;  // (the loop below would take l rounds)
  const RevolveInt128 s = c + 1;  // snaps
  RevolveInt128 r = 0, beta = 1;  // beta(s, r)
  while (beta < l) {
    ++r;
    beta = beta * (s + r) / r;
  }
  // beta(s + 1, r - 1) = C(s + r, r - 1).
  RevolveInt128 b2 = 1;
  for (RevolveInt128 k = 1; k <= r - 1; ++k) b2 = b2 * (s + 1 + k) / k;
  return static_cast<int64_t>(r * l - b2);
}

absl::Status CheckAdjointChain(const Graph& graph, const ChainView& view,
                               const Chain& chain) {
  const std::vector<NodeId>& fwd = view.part.forward;
  const int m = static_cast<int>(fwd.size());
  const std::string need =
      "revolve needs an adjoint chain (a forward path from the input to the loss "
      "whose backward pass mirrors it): ";
  if (m == 0) return absl::InvalidArgumentError(need + "the graph has no forward pass");
  for (int p = 0; p < m; ++p) {
    const NodeId v = fwd[p];
    std::vector<NodeId> ins, outs;
    for (NodeId u : graph.unique_inputs(v)) {
      if (view.position[u] >= 0) ins.push_back(u);
    }
    for (NodeId r : graph.readers(v)) {
      if (view.position[r] >= 0) outs.push_back(r);
    }
    if (ins.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          need, "forward node '", graph.id(v), "' reads two forward nodes ('",
          graph.id(ins[0]), "' and '", graph.id(ins[1]), "')"));
    }
    if (outs.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          need, "forward node '", graph.id(v), "' is read by two forward nodes ('",
          graph.id(outs[0]), "' and '", graph.id(outs[1]), "')"));
    }
    if (p > 0 && ins.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          need, "forward node '", graph.id(v), "' starts a second path"));
    }
    if (p + 1 < m && outs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          need, "forward node '", graph.id(v),
          "' is a dead end of the forward pass (only the backward pass reads it)"));
    }
  }
  if (!chain.irregular.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        need, "backward node '", graph.id(chain.irregular[0]),
        "' reads forward nodes that are not one step and its input"));
  }
  PEBBLE_CHECK(chain.num_stages() == m, "a forward path has one stage per node");
  return absl::OkStatus();
}

namespace {

// `stopped` becomes true where `time_up` says so (checked every 4096
// calls): the schedule is then left unfinished, for the caller to drop.
void RevolveOps(int s, int t, int64_t c, std::vector<ChainOp>& ops,
                const std::function<bool()>& time_up, int64_t& calls, bool& stopped) {
  if (stopped || ((++calls & 4095) == 0 && (stopped = time_up()))) return;
  if (s == t) {
    ops.push_back({ChainOpKind::kForwardSaved, s});
    ops.push_back({ChainOpKind::kBackward, s});
    return;
  }
  const int64_t l = t - s + 1;
  int64_t best_j = -1, best = 0;
  for (int64_t j = 1; j < l; ++j) {
    if (c < 1 && l - j > 1) continue;  // the upper part needs a slot
    const int64_t v = j + RevolveForwardSteps(l - j, c - 1) + RevolveForwardSteps(j, c);
    if (best_j < 0 || v <= best) {
      best = v;
      best_j = j;
    }
  }
  const int split = s + static_cast<int>(best_j);
  for (int k = s; k < split; ++k) ops.push_back({ChainOpKind::kForward, k});
  RevolveOps(split, t, c - 1, ops, time_up, calls, stopped);
  RevolveOps(s, split - 1, c, ops, time_up, calls, stopped);
}

// The most forward steps a schedule of revolve's is made with: c = 0 slots
// over a chain of L stages takes L(L-1)/2 (1.3e8 for L = 16384, which took
// 23 GB and was killed, past its time limit: a schedule is built whole
// before it is judged). A slot count whose schedule takes more counts as
// not fitting, unbuilt, and the plan's details say which
// (`slots_too_long`; its message too, where nothing fits).
constexpr int64_t kMostRevolveForwardSteps = 8'000'000;

// Offers the binomial schedules of `chain` to the selector: with a byte
// budget the largest slot count c whose schedule fits, by bisection on c
// (peak grows with c; a step where it does not only costs optimality, never
// validity); with --budget min, the fewest slots whose schedule is made and
// the next three. Nothing when the baseline fits. The slot counts left
// unbuilt for their length go into `too_long`.
//
// Note [Revolve's fewest slots]: a chain past about 4,000 stages takes more
// than kMostRevolveForwardSteps with c = 0 (L(L-1)/2 steps), so its schedule
// is not made. The bisection starts at the fewest slots whose schedule is:
// it started at 0, whose "does not fit" sent it to c = 1..3 whatever the
// budget (a 4,100-stage chain at 90% planned with 3 slots, 561% overhead,
// where 3,597 slots fit with 5%), until 2026-12-07.
void SearchSlots(const Graph& graph, const Chain& chain, const char* loss,
                 bool baseline_fits, const PlannerOptions& options,
                 PlanSelector& selector, std::vector<int64_t>& too_long) {
  const int L = chain.num_stages();
  auto fits = [&](int64_t c) {
    // Past the time limit a candidate counts as not fitting and is not
    // built: the searches below then end within O(log L) cheap calls.
    if (selector.TimeUp()) return false;
    if (RevolveForwardSteps(L, c) > kMostRevolveForwardSteps) {
      too_long.push_back(c);
      return false;
    }
    std::vector<ChainOp> ops;
    int64_t calls = 0;
    bool stopped = false;
    RevolveOps(0, L - 1, c, ops, [&] { return selector.TimeUp(); }, calls, stopped);
    if (stopped) return false;  // (the time limit passed while it was made)
    return selector.fits(
        selector
            .Consider(EmitChainOps(graph, chain, ops),
                      {{"plan", "revolve"},
                       {"loss", loss},
                       {"slots", c},
                       {"snaps", c + 1},
                       {"predicted_forward_steps", RevolveForwardSteps(L, c)}})
            .peak_bytes);
  };
  const int64_t max_slots = std::max(0, L - 1);
  // The fewest slots whose schedule is made (Note [Revolve's fewest slots]).
  int64_t fewest = 0;
  while (fewest < max_slots && RevolveForwardSteps(L, fewest) > kMostRevolveForwardSteps) {
    too_long.push_back(fewest++);
  }
  if (options.budget_bytes == PlannerOptions::kMinBudget) {
    for (int64_t c = fewest; c <= std::min<int64_t>(fewest + 3, max_slots); ++c) fits(c);
  } else if (!baseline_fits) {
    if (fits(max_slots)) {
      // Storing every state fits: nothing to recompute beyond it.
    } else if (!fits(fewest)) {
      for (int64_t c = fewest + 1; c <= std::min<int64_t>(fewest + 3, max_slots); ++c) fits(c);
    } else {
      int64_t lo = fewest, hi = max_slots;  // fits(lo), !fits(hi)
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (fits(mid)) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
    }
  }
}

class RevolvePlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const auto started = std::chrono::steady_clock::now();  // set-up counts
    const ChainView view = BuildChainView(graph);
    const Chain chain = CollapseChain(graph, view, view.separators);
    RETURN_IF_ERROR(CheckAdjointChain(graph, view, chain));
    PlanSelector selector(graph, options, started);
    selector.Consider(BaselineSchedule(graph), {{"plan", "baseline"}});
    const bool baseline_fits = selector.best_fits();
    // The loss computed in the forward pass, then after the last backward
    // stage (Note [Late loss]); the selector keeps the better plan.
    std::vector<int64_t> too_long;
    SearchSlots(graph, chain, "early", baseline_fits, options, selector, too_long);
    const Chain late = CollapseChain(graph, view, view.separators,
                                     BackwardPlacement::kWithInput,
                                     LossPlacement::kAfterBackward);
    if (late.late_loss) {
      SearchSlots(graph, late, "late", baseline_fits, options, selector, too_long);
    }
    ASSIGN_OR_RETURN(PlanResult result, selector.Finish());
    result.details["chain"] = ChainSummary(graph, view, chain);
    if (!too_long.empty()) {
      std::sort(too_long.begin(), too_long.end());
      too_long.erase(std::unique(too_long.begin(), too_long.end()), too_long.end());
      result.details["slots_too_long"] = too_long;
      if (!result.feasible) {
        absl::StrAppend(&result.message, result.message.empty() ? "" : "; ",
                        "schedules of ", absl::StrJoin(too_long, ", "),
                        " slots were not made: each would take more than ",
                        kMostRevolveForwardSteps, " forward steps");
      }
    }
    return result;
  }
};

}  // namespace

void RegisterRevolvePlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "revolve",
      .description = "Griewank and Walther 2000 binomial checkpointing (Revolve) for "
                     "adjoint chains, slots from the budget; optimal for uniform "
                     "chains, refuses graphs that are not chains",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<RevolvePlanner>(); },
  });
}

}  // namespace pebble
