// The `rotor` policy: Beaumont, Eyraud-Dubois, Herrmann, Joly and Shilova,
// "Optimal checkpointing for heterogeneous chains: how to train deep neural
// networks with limited memory" (arXiv:1911.13214, 2019; the Rotor
// library): a dynamic program over heterogeneous chains, each stage with its
// own forward and backward costs, output size and saved-activation size.
//
// Note [Rotor's dynamic program]. Solve(s, t, keep) back-propagates stages
// s..t given a_{s-1} and the gradient frontier D_t resident, ending with the
// frontier D_{s-1}; keep says whether a_{s-1} must survive it (the caller
// reads it later). Options (ChainStage has the measured figures; "peak"
// figures count a_{s-1} while resident, index 1 when it stays after the
// operation):
//   base (s = t):  F^saved_s; B_s.
//     peaks: D_t + saved_peak[k1], backward_peak[keep]   (k1 = keep || B_s
//     reads a_{s-1})
//   all (s < t):   F^all_s; Solve(s+1, t, B_s reads a_s); B_s.
//     peaks: D_t + all_peak[k1], PG(s+1..t) + backward_peak[keep]; the
//     inner solve has (k1 ? bytes(a_{s-1}) : 0) + saved_extra_bytes less.
//   checkpoint s' (s < s' <= t): F_s .. F_{s'-1} keeping a_{s-1};
//     Solve(s', t, false) with bytes(a_{s-1}) less; Solve(s, s'-1, keep)
//     with PG(s'..t) less (the outputs that the upper part produced).
//     sweep peaks: D_t + cone_peak_s[1], D_t + bytes(a_{s-1}) +
//     cone_peak_k[0] for s < k < s'.
// PG(a..b) sums permanent_bytes (graph outputs made by those stages). The
// cost of an option is the sum of its stage costs and inner solves; the DP
// keeps the cheapest per memory (ties: all, then the smallest s'). These are
// exactly the peaks of the emitted schedule (Note [Emission]) when stages
// are regular and each operation reads the stage input only as measured
// (chains of one node per stage: tanh-chain, conv3d, `linear`), so there
// the DP is optimal among its programs; the planner runs it for both
// BackwardPlacements and the loss placements of Note [Late loss] (remat.h)
// and keeps the better plan. Its programs keep a subproblem's input until
// the subproblem ends, so the unrestricted optimum can be cheaper: it may
// use a checkpoint for one sweep, drop it and recompute it later from an
// earlier one (2 of 60 random 4-6 stage chains in tests/remat_test.cc, e.g.
// hetero-25 at 18 bytes: 53 against 48). On `linear:n` (n <= 6),
// tanh-chain:size=1 (length <= 7, the least feasible peak included) and the
// other 58 random chains it matched an exhaustive search at every budget. On collapsed general graphs it is an estimate: the plan
// is simulated and, when over budget, planned again with the memory bound
// lowered by the overshoot (at most 8 times), and stages are whole blocks
// (F^all keeps everything a block's backward reads), so per-tensor
// policies such as `dtr` can recompute less on ResNets.
//
// Memory is discretised into kRotorSlots = 500 slots of
// ceil(memory / 500) bytes; every phase's bytes and every term a level holds
// for its inner solves are rounded UP to whole slots (and the top to
// floor(memory / slot) slots), so on regular chains a plan the DP accepts
// never exceeds the bytes it was given; the rounding only loses plans, by
// at most one slot a term.
// Chains longer than kRotorMaxStages = 100 stages are coarsened first: every
// k-th separator is kept as a boundary, so the stages merge (not optimal
// any more). Time O(L^3 x 500), memory O(L^2 x 500) x 6 bytes (30 MB at
// L = 100).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "graph/status.h"
#include "scheduler/policies.h"
#include "scheduler/remat.h"
#include "scheduler/simulator.h"

namespace pebble {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int16_t kNone = -2;  // infeasible
constexpr int16_t kAll = -1;   // base (s = t) or all

// On x86-64 with GCC or Clang, RelaxRow is also built for AVX2 and the
// loader picks the build the processor runs (twice the vector width).
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define PEBBLE_ROTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef PEBBLE_ROTOR_CLONES
#define PEBBLE_ROTOR_CLONES
#endif

// cost[i] = min(cost[i], f + a[i] + b[i]) for i < n, choice[i] = tag where
// the sum is lower (b null: f + a[i]). The rows are apart: each is another
// (keep, s, t) of the table. The table's fill is nearly all of rotor's time,
// so this is written for the compiler to vectorise: no branch, the choice
// by a mask, and the file built with -O3 (scheduler/CMakeLists.txt). The
// sums are the scalar loop's, in its order: the plans are the same.
template <bool kTwoTerms>
[[gnu::always_inline]] inline void RelaxLoop(float* __restrict cost, int16_t* __restrict choice,
                                             const float* __restrict a,
                                             const float* __restrict b, float f, int16_t tag,
                                             int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float c = f + a[i];
    if constexpr (kTwoTerms) c += b[i];
    const float old = cost[i];
    const int16_t lower = static_cast<int16_t>(-static_cast<int16_t>(c < old));
    cost[i] = c < old ? c : old;
    choice[i] = static_cast<int16_t>((choice[i] & ~lower) | (tag & lower));
  }
}

// (not a template: Clang clones no function template)
PEBBLE_ROTOR_CLONES void RelaxRow(float* cost, int16_t* choice, const float* a, const float* b,
                                  float f, int16_t tag, int64_t n) {
  if (b == nullptr) {
    RelaxLoop<false>(cost, choice, a, b, f, tag, n);
  } else {
    RelaxLoop<true>(cost, choice, a, b, f, tag, n);
  }
}

class RotorTable {
 public:
  RotorTable(const Chain& chain, int64_t memory_bytes, int slots)
      : chain_(chain), L_(chain.num_stages()) {
    slot_ = std::max<int64_t>(1, (memory_bytes + slots - 1) / slots);
    top_ = static_cast<int>(std::min<int64_t>(slots, memory_bytes / slot_));
    width_ = top_ + 1;
    pg_prefix_.assign(L_ + 1, 0);
    for (int i = 0; i < L_; ++i) {
      pg_prefix_[i + 1] = pg_prefix_[i] + chain.stages[i].permanent_bytes;
    }
    // The table holds costs in floats (half a double's memory: 2 L^2/2
    // slots-wide rows). Where the chain's whole cost is far from 1, in
    // units of a power of two near it, so that costs of any scale fit a
    // float's range (costs above 3.4e38 once read as infeasible, and a graph
    // of huge costs planned no recomputation at all; tiny ones would round
    // to 0); a power of two scales every float exactly, so the plans of
    // costs within the range are those of the costs as given.
    double whole = 0;
    for (const ChainStage& st : chain.stages) {
      whole += st.cone_cost + st.all_cost + st.saved_cost + st.backward_cost;
    }
    if (std::isfinite(whole) && (whole > 1e30 || (whole > 0 && whole < 1e-30))) {
      unit_ = std::ldexp(1.0, std::ilogb(whole));
    }
    const size_t pairs = static_cast<size_t>(L_) * (L_ + 1) / 2;
    cost_.assign(2 * pairs * width_, kInf);
    choice_.assign(2 * pairs * width_, kNone);
    Fill();
  }

  int top() const { return top_; }
  int64_t slot() const { return slot_; }
  // A cost in the table's units, and back in the chain's.
  float Units(double cost) const { return static_cast<float>(cost / unit_); }
  double InChainUnits(float units) const { return static_cast<double>(units) * unit_; }
  float Cost(bool keep, int s, int t, int m) const { return cost_[Index(keep, s, t, m)]; }

  // The program of Solve(s, t, keep) at m slots (Cost must be finite).
  void Build(bool keep, int s, int t, int m, std::vector<ChainOp>& ops) const {
    const int16_t ch = choice_[Index(keep, s, t, m)];
    PEBBLE_CHECK(ch != kNone, "rotor: rebuilding an infeasible state");
    const ChainStage& st = chain_.stages[s];
    if (s == t) {
      ops.push_back({ChainOpKind::kForwardSaved, s});
      ops.push_back({ChainOpKind::kBackward, s});
    } else if (ch == kAll) {
      const bool k1 = keep || st.backward_reads_input;
      ops.push_back({ChainOpKind::kForwardAll, s});
      Build(st.output_saved, s + 1, t,
            m - Slots((k1 ? st.input_bytes : 0) + st.saved_extra_bytes), ops);
      ops.push_back({ChainOpKind::kBackward, s});
    } else {
      for (int k = s; k < ch; ++k) ops.push_back({ChainOpKind::kForward, k});
      Build(false, ch, t, m - Slots(st.input_bytes), ops);
      Build(keep, s, ch - 1, m - Slots(Permanent(ch, t)), ops);
    }
  }

 private:
  size_t Pair(int s, int t) const {
    // Row s holds t = s..L-1, after rows 0..s-1.
    return static_cast<size_t>(s) * L_ - static_cast<size_t>(s) * (s - 1) / 2 + (t - s);
  }
  size_t Index(bool keep, int s, int t, int m) const {
    const size_t pairs = static_cast<size_t>(L_) * (L_ + 1) / 2;
    return ((keep ? pairs : 0) + Pair(s, t)) * width_ + m;
  }
  int64_t Slots(int64_t bytes) const { return (std::max<int64_t>(0, bytes) + slot_ - 1) / slot_; }
  int64_t Permanent(int a, int b) const { return pg_prefix_[b + 1] - pg_prefix_[a]; }

  void Fill() {
    std::vector<int64_t> sweep_req(L_ + 1), sub1(L_ + 1), sub2(L_ + 1);
    std::vector<double> sweep_cost(L_ + 1);
    for (int d = 0; d < L_; ++d) {
      for (int s = 0; s + d < L_; ++s) {
        const int t = s + d;
        const ChainStage& st = chain_.stages[s];
        const int64_t frontier = chain_.stages[t].frontier_bytes;
        for (int keep = 0; keep < 2; ++keep) {
          float* cost = &cost_[Index(keep, s, t, 0)];
          int16_t* choice = &choice_[Index(keep, s, t, 0)];
          const bool k1 = keep || st.backward_reads_input;
          if (d == 0) {
            const int64_t req = std::max(Slots(frontier + st.saved_peak[k1]),
                                         Slots(st.backward_peak[keep]));
            const float c = Units(st.saved_cost + st.backward_cost);
            for (int64_t m = req; m <= top_; ++m) {
              cost[m] = c;
              choice[m] = kAll;
            }
            continue;
          }
          // All.
          {
            const int64_t req = std::max(Slots(frontier + st.all_peak[k1]),
                                         Slots(Permanent(s + 1, t) + st.backward_peak[keep]));
            const int64_t less = Slots((k1 ? st.input_bytes : 0) + st.saved_extra_bytes);
            const float own = Units(st.all_cost + st.backward_cost);
            const float* inner = &cost_[Index(st.output_saved, s + 1, t, 0)];
            const int64_t from = std::max(req, less);
            if (from <= top_) {
              RelaxRow(cost + from, choice + from, inner + (from - less), nullptr, own, kAll,
                       top_ + 1 - from);
            }
          }
          // Checkpoint at s'.
          int64_t req = Slots(frontier + st.cone_peak[1]);
          double fwd = 0;
          const int64_t in_slots = Slots(st.input_bytes);
          for (int sp = s + 1; sp <= t; ++sp) {
            const int k = sp - 1;  // the stage this sweep step adds
            if (k > s) {
              req = std::max(req, Slots(frontier + st.input_bytes +
                                        chain_.stages[k].cone_peak[0]));
            }
            fwd += chain_.stages[k].cone_cost;
            const int64_t less2 = Slots(Permanent(sp, t));
            const float* upper = &cost_[Index(false, sp, t, 0)];
            const float* lower = &cost_[Index(keep, s, sp - 1, 0)];
            const int64_t from = std::max({req, in_slots, less2});
            if (from <= top_) {
              RelaxRow(cost + from, choice + from, upper + (from - in_slots),
                       lower + (from - less2), Units(fwd), static_cast<int16_t>(sp),
                       top_ + 1 - from);
            }
          }
        }
      }
    }
  }

  const Chain& chain_;
  const int L_;
  int64_t slot_ = 1;
  double unit_ = 1;  // the chain's cost of one table unit (Units)
  int top_ = 0;
  int width_ = 1;
  std::vector<int64_t> pg_prefix_;
  std::vector<float> cost_;
  std::vector<int16_t> choice_;
};

}  // namespace

RotorSolution SolveRotor(const Chain& chain, int64_t memory_bytes, int slots,
                         bool least_memory) {
  RotorSolution sol;
  const int L = chain.num_stages();
  PEBBLE_CHECK(L <= 32000, "rotor: too many stages for 16-bit choices");
  if (L == 0 || memory_bytes <= 0 || slots < 1) return sol;
  RotorTable table(chain, memory_bytes, slots);
  sol.slot_bytes = table.slot();
  for (int m = 0; m <= table.top(); ++m) {
    if (table.Cost(false, 0, L - 1, m) < kInf) {
      sol.min_bytes = static_cast<int64_t>(m) * table.slot();
      break;
    }
  }
  const int m = least_memory && sol.min_bytes > 0
                    ? static_cast<int>(sol.min_bytes / table.slot())
                    : table.top();
  const float c = table.Cost(false, 0, L - 1, m);
  if (!(c < kInf)) return sol;
  sol.feasible = true;
  sol.predicted_cost = table.InChainUnits(c);
  table.Build(false, 0, L - 1, m, sol.ops);
  return sol;
}

std::vector<std::vector<ChainOp>> RotorLossAtEndPrograms(const Chain& chain,
                                                         int64_t memory_bytes, int slots) {
  const int L = chain.num_stages();
  std::vector<std::pair<float, std::vector<ChainOp>>> found;
  if (L < 2 || memory_bytes <= 0 || slots < 1) return {};
  RotorTable table(chain, memory_bytes, slots);
  const int64_t slot = table.slot();
  const int top = table.top();
  auto slots_of = [&](int64_t bytes) { return (std::max<int64_t>(0, bytes) + slot - 1) / slot; };
  int64_t upper_permanent = 0;  // PG(p+1..L-1)
  for (int i = 0; i < L; ++i) upper_permanent += chain.stages[i].permanent_bytes;
  double sweep = 0;  // cost of F_0..F_p
  for (int p = -1; p < L - 1; ++p) {
    if (p >= 0) {
      sweep += chain.stages[p].cone_cost;
      upper_permanent -= chain.stages[p].permanent_bytes;
    }
    std::vector<ChainOp> ops;
    float cost = 0;
    if (p < 0) {
      cost = table.Cost(false, 0, L - 1, top);
      if (!(cost < kInf)) continue;
      table.Build(false, 0, L - 1, top, ops);
    } else {
      const int held = static_cast<int>(slots_of(chain.stages[p].output_bytes) +
                                        slots_of(upper_permanent));
      if (held > top) continue;
      const float upper = table.Cost(true, p + 1, L - 1, top);
      const float lower = table.Cost(false, 0, p, top - held);
      if (!(upper < kInf && lower < kInf)) continue;
      cost = table.Units(sweep) + upper + lower;
      for (int k = 0; k <= p; ++k) ops.push_back({ChainOpKind::kForward, k});
      table.Build(true, p + 1, L - 1, top, ops);
      table.Build(false, 0, p, top - held, ops);
    }
    // The sweep may start above a_p, from a_{q-1} when its last instance
    // is still resident (kept from its last read to the sweep): q = p+1..L-1.
    for (int q = p + 1; q <= L - 1; ++q) {
      std::vector<ChainOp> with_tail = ops;
      double tail = 0;
      for (int k = q; k < L - 1; ++k) {
        with_tail.push_back({ChainOpKind::kForward, k});
        tail += chain.stages[k].cone_cost;
      }
      found.emplace_back(cost + table.Units(tail), std::move(with_tail));
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<ChainOp>> programs;
  for (auto& f : found) programs.push_back(std::move(f.second));
  return programs;
}

std::vector<int> CoarsenBoundaries(const std::vector<int>& separators, int max_stages) {
  const int count = static_cast<int>(separators.size());
  if (count + 1 <= max_stages) return separators;
  // Keep max_stages - 1 of them, evenly by index.
  std::vector<int> kept;
  const int want = max_stages - 1;
  for (int j = 0; j < want; ++j) {
    const int idx = static_cast<int>((static_cast<int64_t>(j + 1) * count) / (want + 1));
    const int pos = separators[std::min(idx, count - 1)];
    if (kept.empty() || pos > kept.back()) kept.push_back(pos);
  }
  return kept;
}

namespace {

class RotorPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    PlanSelector selector(graph, options);  // the chain's set-up counts
    const ChainView view = BuildChainView(graph);
    const std::vector<int> boundaries = CoarsenBoundaries(view.separators, kRotorMaxStages);
    selector.Consider(BaselineSchedule(graph), {{"plan", "baseline"}});
    nlohmann::json attempts = nlohmann::json::array();
    // Both placements of boundary-reading backward nodes (remat.h,
    // BackwardPlacement) and of the loss (Note [Late loss]): none
    // dominates, the selector keeps the better plan.
    struct Variant {
      BackwardPlacement placement;
      LossPlacement loss;
      const char* name;
    };
    static constexpr Variant kVariants[] = {
        {BackwardPlacement::kWithInput, LossPlacement::kEarly, "with-input"},
        {BackwardPlacement::kWithProducer, LossPlacement::kEarly, "with-producer"},
        {BackwardPlacement::kWithInput, LossPlacement::kAfterBackward, "with-input, late loss"},
        {BackwardPlacement::kWithProducer, LossPlacement::kAfterBackward,
         "with-producer, late loss"},
    };
    for (const Variant& variant : kVariants) {
      if (selector.TimeUp()) break;
      const Chain chain =
          CollapseChain(graph, view, boundaries, variant.placement, variant.loss);
      if (chain.num_stages() == 0) break;
      if (variant.loss == LossPlacement::kAfterBackward && !chain.late_loss) continue;
      const char* placement_name = variant.name;
      const bool first = &variant == &kVariants[0];
      // Plans at `memory` bytes for the chain (the budget less
      // chain.fixed_bytes); the simulated peak, or -1 when the DP finds
      // nothing.
      auto plan_at = [&](int64_t memory, bool least) -> int64_t {
        if (selector.TimeUp()) return -1;  // as if the DP found nothing
        const RotorSolution sol = SolveRotor(chain, memory, kRotorSlots, least);
        nlohmann::json a = {{"placement", placement_name},
                            {"memory_bytes", memory},
                            {"slot_bytes", sol.slot_bytes}};
        if (!sol.feasible) {
          a["feasible"] = false;
          attempts.push_back(std::move(a));
          return -1;
        }
        const PlanSelector::Figures f = selector.Consider(
            EmitChainOps(graph, chain, sol.ops),
            {{"plan", "rotor"},
             {"placement", placement_name},
             {"memory_bytes", memory},
             {"slot_bytes", sol.slot_bytes},
             {"predicted_cost", sol.predicted_cost}});
        a["peak_bytes"] = f.peak_bytes;
        a["compute_cost"] = f.compute_cost;
        attempts.push_back(std::move(a));
        return f.peak_bytes;
      };
      // --budget min, or a budget nothing met: search the lowest peak.
      // Start from the bytes the all-kept program (or the baseline) needs
      // and plan at the least memory of that DP table (from that table:
      // another slot size could round it out of reach), then with finer
      // tables (slots of about a 500th of the peak reached) while the peak
      // keeps going down.
      auto lowest = [&] {
        const int64_t before = selector.best_peak();
        const int64_t all_kept =
            selector.Consider(EmitChainOps(graph, chain, CheckpointOps(chain, {})),
                              {{"plan", "all kept"}})
                .peak_bytes;
        const int64_t upper = std::max(before, all_kept) - chain.fixed_bytes;
        int64_t best = plan_at(upper, /*least=*/true);
        for (int round = 0; round < 6 && best > 0; ++round) {
          const int64_t memory = best - chain.fixed_bytes;
          if (memory <= 0) break;
          const int64_t p = plan_at(memory, /*least=*/true);
          if (p < 0 || p >= best) break;
          best = p;
        }
      };
      if (options.budget_bytes == PlannerOptions::kMinBudget) {
        lowest();
      } else if (!selector.best_fits() || !first) {
        // The other variants run whenever the baseline does not fit, to
        // compete on cost with the first one's plan.
        if (selector.best_fits() && selector.best_cost() <= BaseCost(graph) * (1 + 1e-12)) {
          continue;  // the baseline fits: nothing to improve
        }
        int64_t memory = options.budget_bytes - chain.fixed_bytes;
        bool fitted = false;
        for (int attempt = 0; attempt < 8 && memory > 0; ++attempt) {
          const int64_t peak = plan_at(memory, false);
          if (peak < 0) break;
          if (peak <= options.budget_bytes) {
            fitted = true;
            break;
          }
          memory -= peak - options.budget_bytes;
        }
        if (!fitted && !selector.best_fits()) lowest();
      }
    }
    // The loss after the whole backward pass (Note [Late loss]): the first
    // 256 programs by predicted cost. With a byte budget, at the budget's
    // memory, then lowered a little (the final sweep is not in the DP's
    // figures) while none fits; at `min`, below the lowest peak found so
    // far, while that keeps going down.
    const bool least = options.budget_bytes == PlannerOptions::kMinBudget;
    if (!selector.TimeUp() && (least || !(selector.best_fits() &&
                                          selector.best_cost() <= BaseCost(graph) * (1 + 1e-12)))) {
      const Chain at_end = CollapseChain(graph, view, boundaries,
                                         BackwardPlacement::kWithInput, LossPlacement::kAtEnd);
      int64_t memory = (least ? selector.best_peak() - 1 : options.budget_bytes) -
                       at_end.fixed_bytes;
      for (int round = 0; at_end.late_loss && memory > 0 && round < 6; ++round) {
        const int64_t before = selector.best_peak();
        bool fitted = false;
        int offered = 0;
        for (const std::vector<ChainOp>& ops : RotorLossAtEndPrograms(at_end, memory)) {
          if (offered++ == 256 || selector.TimeUp()) break;
          const PlanSelector::Figures f = selector.Consider(
              EmitChainOps(graph, at_end, ops),
              {{"plan", "rotor"}, {"placement", "with-input, loss at end"},
               {"memory_bytes", memory}});
          fitted = fitted || (!least && f.peak_bytes <= options.budget_bytes);
        }
        if (least) {
          if (selector.best_peak() >= before) break;
          memory = selector.best_peak() - 1 - at_end.fixed_bytes;
        } else {
          if (fitted) break;
          memory -= 1 + memory / 64;
        }
      }
    }
    ASSIGN_OR_RETURN(PlanResult result, selector.Finish());
    result.details["chain"] = ChainSummary(
        graph, view, CollapseChain(graph, view, boundaries));
    result.details["coarsened"] = boundaries.size() != view.separators.size();
    result.details["slots"] = kRotorSlots;
    result.details["attempts"] = std::move(attempts);
    return result;
  }
};

}  // namespace

void RegisterRotorPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "rotor",
      .description = "Beaumont et al. 2019 (Rotor) dynamic program for heterogeneous "
                     "chains, memory in 500 slots rounded up; optimal among its "
                     "checkpointing programs on chains (up to the rounding), general "
                     "graphs collapsed into a chain of stages between forward "
                     "articulation points",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<RotorPlanner>(); },
  });
}

}  // namespace pebble
