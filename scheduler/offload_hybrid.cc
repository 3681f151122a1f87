// The `hybrid` policy: the joint keep / swap / recompute planner, in the
// spirit of Capuchin (Peng et al., ASPLOS 2020), POFO (Beaumont, Herrmann,
// Pallez and Shilova, 2021) and POET (Patil et al., ICML 2022).
//
// Note [hybrid]. Every tensor is kept, swapped to the host or recomputed;
// the figure of merit is the simulated makespan (SPEC section 4) under the
// device and host budgets. The search is a minimum over candidates, every
// one simulated:
//
//  1. The recompute-only and one-shot plans at the same options: baseline,
//     best-order, sqrtn, chen-greedy, articulation, revolve (chains only),
//     rotor and dtr; on a sharded graph, FSDP's rules (fsdp, fsdp-module,
//     fsdp-blocks); and the offload-only plans, vdnn and swap. Taking the
//     minimum over them makes `hybrid` never slower than any of them at the
//     same budget, by construction (the property tests check it).
//  2. Joint plans: a recompute plan made for a looser budget B' (B' from
//     the budget B up to the baseline peak, in quarters; with --budget min
//     from the lowest peak up to 75% of the baseline) decides which tensors
//     are recomputed; the greedy swap search (Note [Greedy swaps], rule
//     kLeastExposure, optionally after the hidden-only rule) then evicts
//     tensors at the peak, least estimated exposure per byte first, until B
//     holds. So a tensor whose gap hides its round trip is swapped, one
//     whose recomputation is cheap is left to the recompute plan's segments,
//     and the rest are kept; which mix wins is decided by the simulator, not
//     by the estimates. Each joint plan is tried with three placements: the
//     greedy one, prefetches hoisted as early as memory allows (within B),
//     and the simulator-guided rounds (Note [Placement rounds]).
//
// Note [hybrid's recompute candidates composed]. Run over the graph as
// written (PlannerOptions::own_order), a recompute policy misses what
// `--policy NAME` adds by running composed with best-order (Note
// [Composition], compose.cc): the graph rearranged into best-order's order,
// and the outputs that nothing reads (parameters' gradients) computed late
// (Note [Outputs computed late]). On torchvision's regnet_y_400mf as
// pebble.torch captures it (batch 8, 64 px) rotor alone held 31.8 MB at min
// and hybrid, the default policy, 38.4 MB (its rotor candidate 39.6 MB), so
// hybrid refused budgets that rotor met. So on a graph that is not
// OnAWholeStep (whole_step.h), each recompute candidate of step 1 but
// baseline runs composed, the plan `--policy NAME` gives: hybrid is no
// worse than any of them there. (A data-parallel step's policies plan the
// one-rank step, where they run composed.) On a step with an optimizer's
// updates, which are taken out before hybrid sees the graph, the wrapper of
// Note [hybrid on the whole step] plans each named policy again on the
// whole step, composed, and hybrid's candidates stay over the graph's order
// (PlannerOptions::named_rivals_on_whole_step): composed there too, inside
// the searches of Note [State placement] and Note [Update placement], which
// plan hybrid many times, they took transformer:layers=2,seq=64,dim=128
// with adam:state=auto,updates=auto at `min` from 6 s to 40 s for a peak
// 0.3% higher (bench/results/hybrid-composed-2026-12-04.md). The joint
// plans' bases at looser budgets stay over the graph's order; under
// --own-order every candidate does.
//
// Time limit (PlannerOptions::time_limit_s): one deadline for the whole
// call. Each nested policy gets the time left; once it has passed, no new
// candidate is started and the fastest one simulated so far wins (the
// baseline is always the first), with the cut noted in the message. Work
// already started ends past the deadline: a nested policy's candidate in
// flight and its final simulation, then this call's own simulation of it
// and of the winner. On graphs of 10^5-10^6 nodes each is a large fraction
// of a second, so the search stops early by twice what the first candidate
// (the baseline, planned and simulated) took: the whole call then ends
// within the limit where it used to overrun it by 15-30% (hybrid
// --time-limit 5 on path:n=1000000: 5.85 s).
//
// Not optimal: the per-tensor choice is greedy at each peak and the
// recompute side comes from heuristics run at a few budgets; an exact
// joint formulation (POFO's dynamic program on chains, POET's MILP) is
// left out for time.
#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/collective_buckets.h"
#include "scheduler/offload.h"
#include "scheduler/policies.h"
#include "scheduler/whole_step.h"

namespace pebble {
namespace {

// The recompute-only and one-shot policies hybrid starts from.
// (dtr-paper beside dtr: dtr's plan is the better of its two revival
// rules, but swaps on top of the paper rule's may reach lower: Note
// [Deeper revivals] in remat_dtr.cc.)
constexpr const char* kRecomputePolicies[] = {"baseline", "best-order", "sqrtn",
                                              "chen-greedy", "articulation", "revolve",
                                              "rotor", "dtr", "dtr-paper"};
// Those whose compute sequences seed joint plans at looser budgets.
constexpr const char* kJointBases[] = {"chen-greedy", "sqrtn", "articulation", "rotor", "dtr",
                                       "dtr-paper"};
// Those whose plan at a budget they miss is their own lowest-peak search,
// run the same way whatever the budget (dtr: Note [DTR as a planner]).
// Once such a policy missed a tighter budget with peak P, a looser budget
// B' < P is not planned again: the run would miss B' too and return the
// same lowest-peak plan, unless DTR's non-monotonicity lets it meet B'
// where its sweep and bisection did not; on 10^5 nodes each such run is
// the bulk of the time (tens of seconds).
constexpr const char* kLowestPeakFallback[] = {"dtr", "dtr-paper"};

bool HasLowestPeakFallback(absl::string_view name) {
  return std::find(std::begin(kLowestPeakFallback), std::end(kLowestPeakFallback), name) !=
         std::end(kLowestPeakFallback);
}

int64_t PeakOf(const ComputeSequence& seq, const std::vector<SwapInterval>& swaps) {
  int64_t peak = seq.graph().persistent_bytes();
  for (int64_t b : DuringBytes(seq, swaps)) peak = std::max(peak, b);
  return peak;
}

// Moves every prefetch as early as the memory cap allows (in order of
// position; each move keeps e + 2 <= q).
std::vector<SwapInterval> HoistPrefetches(const ComputeSequence& seq,
                                          std::vector<SwapInterval> swaps, int64_t cap) {
  std::vector<int64_t> during = DuringBytes(seq, swaps);
  std::vector<int> order(swaps.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    return std::tie(swaps[x].prefetch_before, swaps[x].instance) <
           std::tie(swaps[y].prefetch_before, swaps[y].instance);
  });
  for (int s : order) {
    SwapInterval& w = swaps[s];
    const int64_t b = seq.graph().bytes(seq.node(w.instance));
    while (w.prefetch_before - 1 >= w.evict_after + 2 &&
           during[w.prefetch_before - 1] + b <= cap) {
      --w.prefetch_before;
      during[w.prefetch_before] += b;
    }
  }
  return swaps;
}

class HybridPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const auto started = std::chrono::steady_clock::now();
    // (the simulator's own refusal, before any candidate: the chain
    // policies' selectors check every schedule they simulate)
    if (!(options.host_bandwidth_bytes_per_s > 0)) {
      return absl::InvalidArgumentError("host bandwidth must be positive");
    }
    MakespanSelector selector(graph, options);
    const Deadline& deadline = selector.deadline();
    // The limit less the time kept back for the end (see the comment at
    // the top), once the first candidate has measured it; the searches run
    // against it, and its passing counts as the limit's.
    std::optional<Deadline> search_deadline;
    auto work = [&]() -> const Deadline& {
      return search_deadline.has_value() ? *search_deadline : deadline;
    };
    auto time_up = [&] {
      if (!work().Expired()) return false;
      deadline.MarkHit();
      return true;
    };
    // Options for a nested policy: the time left of this call's limit.
    auto nested = [&](int64_t budget) {
      PlannerOptions o = options;
      o.budget_bytes = budget;
      o.time_limit_s = work().remaining_s();
      o.own_order = true;  // the parts over this graph's order, not composed again
      return o;
    };
    nlohmann::json tried = nlohmann::json::array();
    // On a sharded graph each candidate is judged with its collectives
    // joined into messages where buckets are planned (Note [Planned buckets
    // of collectives]): the joins change which candidate is fastest. Each
    // join search gets a quarter of the usual bound, and none starts once
    // the time is up (the candidate is then judged as it is).
    const bool join = graph.has_collectives() &&
                      options.bucket_bytes == PlannerOptions::kPlannedBuckets;
    auto consider = [&](Schedule schedule, const std::string& name, nlohmann::json details) {
      details["candidate"] = name;
      if (join && !work().Expired()) {
        absl::StatusOr<PlanResult> planned = FinishPlan(graph, schedule, options);
        if (planned.ok()) {
          planned = JoinCollectiveMessages(graph, *std::move(planned), options,
                                           kMaxJoinSimulatedSteps / 4);
        }
        if (planned.ok()) schedule = std::move(planned->schedule);
      }
      const PlanReport& r = selector.Consider(std::move(schedule), std::move(details));
      tried.push_back(CandidateEntry(name, r, selector.Fits(r)));
    };
    // 1. Recompute-only and offload-only plans at the same options.
    // best-order's order (an exact search on some graphs) is planned once.
    // The compute sequences at the budget itself seed the joint plans below.
    std::vector<NodeId> best_order;
    std::vector<std::pair<std::string, std::vector<NodeId>>> at_budget;
    // Per policy with a lowest-peak fallback: the least peak of its plans at
    // budgets it missed (kLowestPeakFallback).
    std::map<std::string, int64_t> missed_peak;
    auto note_missed = [&](const std::string& name, int64_t budget, const PlanReport& r) {
      if (!HasLowestPeakFallback(name)) return;
      if (budget != PlannerOptions::kMinBudget && r.peak_bytes <= budget) return;
      auto [it, inserted] = missed_peak.try_emplace(name, r.peak_bytes);
      if (!inserted) it->second = std::min(it->second, r.peak_bytes);
    };
    const bool composed_candidates = !options.own_order &&
                                     !options.named_rivals_on_whole_step &&
                                     !OnAWholeStep(graph, options);
    for (const char* name : kRecomputePolicies) {
      // The baseline (first) always runs: a valid plan to return. So does
      // best-order, with the whole time left: its plan is the one
      // `--policy best-order` gives at this limit, which hybrid never
      // exceeds at `min`.
      const bool best = std::string(name) == "best-order";
      if (selector.has_best() && !best && time_up()) break;
      ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(name));
      ReportProgress(options, absl::StrCat("hybrid: ", name, " at the budget"),
                     selector.has_best() ? std::optional<double>(selector.best().makespan)
                                         : std::nullopt);
      PlannerOptions o = nested(options.budget_bytes);
      if (best) o.time_limit_s = deadline.remaining_s();
      // Note [hybrid's recompute candidates composed]
      if (composed_candidates && !best && std::string(name) != "baseline") o.own_order = false;
      absl::StatusOr<PlanResult> r = planner->Plan(graph, o);
      if (!r.ok()) continue;  // e.g. revolve on a non-chain
      if (TimeLimitReached(*r)) deadline.MarkHit();
      std::vector<NodeId> computes = ComputeSequence::FromSchedule(graph, r->schedule).computes();
      if (best) best_order = computes;
      note_missed(name, options.budget_bytes, r->report);
      at_budget.emplace_back(name, std::move(computes));
      consider(std::move(r->schedule), name, {});
      if (!search_deadline.has_value()) {
        const double first_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        search_deadline.emplace(std::max(0.0, options.time_limit_s - 2 * first_s), started);
      }
    }
    // On a sharded graph, FSDP's rules, whatever the time left (each is an
    // order and a simulation or two): hybrid is never slower than they are
    // where they fit.
    if (graph.has_collectives()) {
      for (const char* name : kFsdpPolicies) {
        ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(name));
        absl::StatusOr<PlanResult> r = planner->Plan(graph, nested(options.budget_bytes));
        if (r.ok()) consider(std::move(r->schedule), name, {});
      }
    }
    if (!time_up()) {
      ASSIGN_OR_RETURN(PlanResult vdnn, PlanVdnn(graph, nested(options.budget_bytes)));
      if (TimeLimitReached(vdnn)) deadline.MarkHit();
      consider(std::move(vdnn.schedule), "vdnn", {});
    }
    if (!time_up()) {
      ASSIGN_OR_RETURN(PlanResult swap,
                       PlanSwap(graph, nested(options.budget_bytes),
                                best_order.empty() ? nullptr : &best_order));
      if (TimeLimitReached(swap)) deadline.MarkHit();
      consider(std::move(swap.schedule), "swap", {});
    }
    const bool is_min = options.budget_bytes == PlannerOptions::kMinBudget;
    ASSIGN_OR_RETURN(const int64_t baseline_peak, BaselinePeak(graph));
    if ((is_min || options.budget_bytes < baseline_peak) && !time_up()) {
      // 2. Joint plans from recompute plans at looser budgets.
      std::vector<std::pair<std::string, int64_t>> looser;  // label, B'
      for (int k = 0; k < 4; ++k) {
        if (is_min) {
          looser.emplace_back(k == 0 ? "min" : absl::StrCat(25 * k, "%"),
                              k == 0 ? PlannerOptions::kMinBudget : baseline_peak * k / 4);
        } else {
          const int64_t b = options.budget_bytes + (baseline_peak - options.budget_bytes) * k / 4;
          looser.emplace_back(absl::StrFormat("%.0f%%", 100.0 * static_cast<double>(b) /
                                                            static_cast<double>(baseline_peak)),
                              b);
        }
      }
      std::vector<std::pair<std::string, std::vector<NodeId>>> bases;
      bases.emplace_back("baseline", DefaultOrder(graph));
      if (!best_order.empty()) bases.emplace_back("best-order", best_order);
      for (const char* name : kJointBases) {
        ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(name));
        for (const auto& [label, b] : looser) {
          if (time_up()) break;
          if (b == options.budget_bytes) {  // planned above
            for (const auto& [done, computes] : at_budget) {
              if (done == name) bases.emplace_back(absl::StrCat(name, "@", label), computes);
            }
            continue;
          }
          if (b != PlannerOptions::kMinBudget) {
            auto missed = missed_peak.find(name);
            if (missed != missed_peak.end() && b < missed->second) continue;
          }
          absl::StatusOr<PlanResult> r = planner->Plan(graph, nested(b));
          if (!r.ok()) continue;
          if (TimeLimitReached(*r)) deadline.MarkHit();
          note_missed(name, b, r->report);
          bases.emplace_back(absl::StrCat(name, "@", label),
                             ComputeSequence::FromSchedule(graph, r->schedule).computes());
        }
      }
      std::vector<std::vector<NodeId>> seen;
      for (const auto& [base_name, computes] : bases) {
        if (time_up()) break;
        if (std::find(seen.begin(), seen.end(), computes) != seen.end()) continue;
        seen.push_back(computes);
        ReportProgress(options, absl::StrCat("hybrid: swaps over ", base_name),
                       selector.has_best() ? std::optional<double>(selector.best().makespan)
                                           : std::nullopt);
        const ComputeSequence seq(graph, computes);
        SwapSearchOptions search;
        search.target_bytes = options.budget_bytes;
        search.host_budget_bytes = options.host_budget_bytes;
        search.bandwidth_bytes_per_s = options.host_bandwidth_bytes_per_s;
        search.deadline = &work();
        for (int hidden_first = 0; hidden_first < 2 && !time_up(); ++hidden_first) {
          std::vector<SwapInterval> swaps;
          if (hidden_first) {
            search.rule = SwapRule::kHiddenGapsOnly;
            swaps = GreedySwaps(seq, search);
          }
          search.rule = SwapRule::kLeastExposure;
          swaps = GreedySwaps(seq, search, std::move(swaps));
          if (swaps.empty()) break;  // nothing to swap: the base alone was considered
          const std::string name =
              absl::StrCat(base_name, hidden_first ? "+hidden-swaps" : "+swaps");
          const int64_t peak = PeakOf(seq, swaps);
          const int64_t cap = (is_min || peak > options.budget_bytes) ? peak : options.budget_bytes;
          const nlohmann::json d = {{"swaps", swaps.size()}};
          consider(EmitSwapSchedule(seq, swaps), name, d);
          std::vector<SwapInterval> hoisted = HoistPrefetches(seq, swaps, cap);
          consider(EmitSwapSchedule(seq, hoisted), name + "+early-prefetch", d);
          if (time_up()) break;
          std::vector<SwapInterval> refined =
              RefinePlacement(seq, swaps, cap, options.host_bandwidth_bytes_per_s, 4, &work());
          consider(EmitSwapSchedule(seq, refined), name + "+refined", d);
          if (time_up()) break;
          refined = RefinePlacement(seq, std::move(hoisted), cap,
                                    options.host_bandwidth_bytes_per_s, 4, &work());
          consider(EmitSwapSchedule(seq, refined), name + "+early-prefetch+refined", d);
        }
      }
    }
    if (work().hit()) deadline.MarkHit();  // a search the reduced limit cut
    ASSIGN_OR_RETURN(PlanResult result, selector.Finish());
    result.details["candidates"] = std::move(tried);
    return result;
  }
};

}  // namespace

void RegisterHybridPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "hybrid",
      .description = "joint keep / swap / recompute: the fastest simulated plan among the "
                     "recompute-only, offload-only and joint (recompute plan at a looser "
                     "budget + greedy swaps) candidates within the device and host budgets",
      .kind = PlanKind::kOffload,
      .exact = false,
      .factory = [] { return std::make_unique<HybridPlanner>(); },
  });
}

}  // namespace pebble
