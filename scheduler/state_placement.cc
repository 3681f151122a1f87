#include "scheduler/state_placement.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "graph/status.h"

namespace pebble {

// Note [State placement]. A fixed rule puts all of the optimizer's state on
// the host (ZeRO-Offload) or none of it, and all of the parameters (FSDP's
// CPU offload) or none. Streamed state costs two copies a step and saves
// its bytes at the step's boundary and in its backward; a streamed
// parameter costs a copy per use window and the update's two (Note
// [Parameters streamed]) and saves its bytes between its uses; a resident
// tensor costs nothing in time. So the fastest placement that fits keeps
// as much resident as the budget allows, the parameters (dearer to stream)
// first. With the tensors in that order, parameters then state, each
// smallest first, the k first resident and the rest streamed, the peak
// grows with k (each resident tensor adds its bytes to every step from the
// first on, and the largest stay streamed, one at a time): the search
// plans k = 0 (all streamed, the least peak) and k = n (all resident, no
// copies), then bisects for the largest k that fits, 2 + log2(n) plans,
// and keeps the fastest plan that fits among those made. Keeping the small
// tensors resident keeps most of the tensors out of the copies, not most
// of the bytes; within a kind every byte costs the same transfer time, so the
// time saved is the resident bytes' copies.
//
// The choice is written in the schedule: a streamed tensor's first step is
// its prefetch, a resident one is never moved (ResolveHomes). At "min" the
// least peak is k = 0's, and the search then looks for the largest k that
// fits it.

namespace {

// Tensors whose home the plan chooses, in the order they are kept
// resident: parameters before state, then the smallest first (ties: graph
// order).
std::vector<NodeId> AutoHomes(const Graph& graph) {
  std::vector<NodeId> nodes;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.home(v) == Tier::kAuto) nodes.push_back(v);
  }
  auto key = [&](NodeId v) {
    return std::pair(graph.role(v) != Role::kParameter, graph.bytes(v));
  };
  std::stable_sort(nodes.begin(), nodes.end(),
                   [&](NodeId a, NodeId b) { return key(a) < key(b); });
  return nodes;
}

// Whether `a` is faster than `b` (then: a lower peak).
bool Faster(const PlanResult& a, const PlanResult& b) {
  return a.report.makespan < b.report.makespan ||
         (a.report.makespan == b.report.makespan && a.report.peak_bytes < b.report.peak_bytes);
}

}  // namespace

absl::StatusOr<PlanResult> PlaceAutoState(const Graph& graph, const PlannerOptions& options,
                                          const ConcretePlanner& plan) {
  const std::vector<NodeId> nodes = AutoHomes(graph);
  const int n = static_cast<int>(nodes.size());
  std::vector<int> rank(graph.num_nodes(), -1);
  for (int i = 0; i < n; ++i) rank[nodes[i]] = i;
  const Deadline deadline(options.time_limit_s);
  PlannerOptions probe_options = options;
  int plans = 0;
  // Each plan gets an equal share of what is left of the call's time limit
  // (the bisection's depth bounds how many are left).
  const int most_plans = 2 + static_cast<int>(std::ceil(std::log2(std::max(n, 1))));
  // The plan with the k smallest resident.
  auto plan_with = [&](int k) -> absl::StatusOr<PlanResult> {
    ++plans;
    probe_options.time_limit_s =
        std::max(0.01, deadline.remaining_s() / std::max(1, most_plans - plans + 1));
    const Graph concrete = graph.WithAutoHomesAs(
        [&](NodeId v) { return rank[v] < k ? Tier::kDevice : Tier::kHost; });
    return plan(concrete, probe_options);
  };
  ASSIGN_OR_RETURN(PlanResult streamed, plan_with(0));
  int chosen = 0;
  std::optional<PlanResult> best;
  if (options.budget_bytes == PlannerOptions::kMinBudget) {
    probe_options.budget_bytes = streamed.report.peak_bytes;  // the least peak, then fastest
    streamed.feasible = true;
  }
  if (streamed.feasible) best = std::move(streamed);
  if (n > 0) {
    ASSIGN_OR_RETURN(PlanResult resident, plan_with(n));
    const bool fits = resident.feasible &&
                      (options.budget_bytes != PlannerOptions::kMinBudget ||
                       resident.report.peak_bytes <= probe_options.budget_bytes);
    if (fits) {
      best = std::move(resident);
      chosen = n;
    } else if (best.has_value()) {  // bisect: k = lo fits, k = hi does not
      int lo = 0, hi = n;
      while (hi - lo > 1 && !deadline.Expired()) {
        const int mid = lo + (hi - lo) / 2;
        ASSIGN_OR_RETURN(PlanResult r, plan_with(mid));
        const bool mid_fits = r.feasible && r.report.peak_bytes <= probe_options.budget_bytes;
        (mid_fits ? lo : hi) = mid;
        if (mid_fits && Faster(r, *best)) {
          best = std::move(r);
          chosen = mid;
        }
      }
    }
  }
  // Where nothing fits, the streamed plan (the least peak) says by how much.
  if (!best.has_value()) best = std::move(streamed);
  PlanResult result = *std::move(best);
  int64_t resident_bytes = 0, streamed_bytes = 0;
  for (int i = 0; i < n; ++i) (i < chosen ? resident_bytes : streamed_bytes) += graph.bytes(nodes[i]);
  result.details["state_placement"] = {{"resident_tensors", chosen},
                                       {"streamed_tensors", n - chosen},
                                       {"resident_bytes", resident_bytes},
                                       {"streamed_bytes", streamed_bytes},
                                       {"plans", plans}};
  if (options.budget_bytes == PlannerOptions::kMinBudget) result.feasible = true;
  if (deadline.hit()) NoteTimeLimit(result, options.time_limit_s, "state placement");
  return result;
}

}  // namespace pebble
