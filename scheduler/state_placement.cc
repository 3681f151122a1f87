#include "scheduler/state_placement.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "scheduler/compose.h"
#include "scheduler/planner.h"

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
// first on, and the largest stay streamed, one at a time), so the search
// plans k = 0 (all streamed, the least peak) and k = n (all resident, no
// copies), then bisects for the largest k that fits, 2 + log2(n) plans,
// and keeps the fastest plan that fits among those made. Keeping the small
// tensors resident keeps most of the tensors out of the copies, not most
// of the bytes; within a kind every byte costs the same transfer time, so the
// time saved is the resident bytes' copies.
//
// The peak grows with k only roughly (a policy plans each k afresh), so the
// search tries two more k past the first that did not fit. A host budget
// bounds k from below (the host peak falls as k grows): a first bisection
// finds the smallest k whose host copies fit, the second starts there (at
// "min", from that k's peak). A placement the policy or the simulator
// refuses fits nothing.
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

}  // namespace

bool Faster(const PlanResult& a, const PlanResult& b) {
  if (!SameMakespan(a.report.makespan, b.report.makespan)) {
    return a.report.makespan < b.report.makespan;
  }
  return a.report.peak_bytes < b.report.peak_bytes;
}

absl::StatusOr<PlanResult> PlaceAutoState(const Graph& graph, const PlannerOptions& options,
                                          const ConcretePlanner& plan) {
  const std::vector<NodeId> nodes = AutoHomes(graph);
  const int n = static_cast<int>(nodes.size());
  std::vector<int> rank(graph.num_nodes(), -1);
  for (int i = 0; i < n; ++i) rank[nodes[i]] = i;
  const bool at_min = options.budget_bytes == PlannerOptions::kMinBudget;
  const Deadline deadline(options.time_limit_s);
  PlannerOptions probe_options = options;
  // Each plan gets an equal share of what is left of the call's time limit
  // (two bisections and two extra probes bound how many are left).
  const int most_plans = 4 + 2 * static_cast<int>(std::ceil(std::log2(std::max(n, 1))));
  int plans = 0;
  absl::Status first_error = absl::OkStatus();
  std::optional<PlanResult> best, least;  // the fastest that fits; the least device peak
  int best_k = 0, least_k = 0;
  // The device budget a plan must fit: at "min", the least peak (k = 0's).
  int64_t device_budget = options.budget_bytes;
  auto device_fits = [&](const PlanResult& r) { return r.report.peak_bytes <= device_budget; };
  auto host_fits = [&](const PlanResult& r) {
    return !options.host_budget_bytes.has_value() ||
           r.report.host_peak_bytes <= *options.host_budget_bytes;
  };
  // Plans with the first k kept resident; nullopt where the policy or the
  // simulator refused that placement (it then fits nothing).
  auto probe = [&](int k) -> std::optional<PlanResult> {
    ++plans;
    probe_options.time_limit_s =
        std::max(0.01, deadline.remaining_s() / std::max(1, most_plans - plans + 1));
    const Graph concrete = graph.WithAutoHomesAs(
        [&](NodeId v) { return rank[v] < k ? Tier::kDevice : Tier::kHost; });
    absl::StatusOr<PlanResult> r = plan(concrete, probe_options);
    if (!r.ok()) {
      if (first_error.ok()) first_error = r.status();
      return std::nullopt;
    }
    if (!least.has_value() || r->report.peak_bytes < least->report.peak_bytes) {
      least = *r;
      least_k = k;
    }
    if (device_fits(*r) && host_fits(*r) && (!best.has_value() || Faster(*r, *best))) {
      best = *r;
      best_k = k;
    }
    return *std::move(r);
  };
  std::optional<PlanResult> streamed = probe(0);
  if (at_min) {
    device_budget = streamed.has_value() ? streamed->report.peak_bytes : INT64_MAX;
    probe_options.budget_bytes = device_budget;  // the least peak, then the fastest
    if (streamed.has_value() && host_fits(*streamed)) {
      best = streamed;
      best_k = 0;
    }
  }
  std::optional<PlanResult> resident = n > 0 ? probe(n) : std::nullopt;
  const bool resident_fits = resident.has_value() && device_fits(*resident) && host_fits(*resident);
  if (n > 1 && !resident_fits) {
    // The host peak falls with k and the device peak rises: the smallest k
    // whose host copies fit, then the largest from there whose device peak
    // fits.
    int low = 0;
    if (!streamed.has_value() || !host_fits(*streamed)) {
      int lo = 0, hi = n;  // hi's host copies fit (none at all where k = n)
      while (hi - lo > 1 && !deadline.Expired()) {
        const int mid = lo + (hi - lo) / 2;
        std::optional<PlanResult> r = probe(mid);
        (r.has_value() && host_fits(*r) ? hi : lo) = mid;
      }
      low = hi;
    }
    std::optional<PlanResult> first = low == 0 ? streamed : probe(low);
    if (at_min && low > 0 && first.has_value()) {
      // The least device peak whose host copies fit.
      device_budget = first->report.peak_bytes;
      probe_options.budget_bytes = device_budget;
      if (host_fits(*first) && (!best.has_value() || Faster(*first, *best))) {
        best = first;
        best_k = low;
      }
    }
    if (first.has_value() && device_fits(*first) && low < n) {
      int lo = low, hi = n;  // lo's device peak fits, hi's does not
      while (hi - lo > 1 && !deadline.Expired()) {
        const int mid = lo + (hi - lo) / 2;
        std::optional<PlanResult> r = probe(mid);
        (r.has_value() && device_fits(*r) ? lo : hi) = mid;
      }
      // The peak need not grow strictly with k: two more tries past the
      // first that did not fit.
      for (int k = hi + 1; k <= std::min(hi + 2, n - 1) && !deadline.Expired(); ++k) probe(k);
    }
  }
  if (!best.has_value() && !least.has_value()) {
    // (a policy that searches to its limit, exact, had a share of it)
    if (!absl::StrContains(first_error.message(), "time limit")) return first_error;
    return absl::Status(first_error.code(),
                        absl::StrCat(first_error.message(), " (each of the state placement's ",
                                     most_plans, " plans at most has an equal share of the ",
                                     options.time_limit_s, " s time limit)"));
  }
  // Where nothing fits, the least device peak says by how much.
  const bool fits = best.has_value();
  PlanResult result = fits ? *std::move(best) : *std::move(least);
  const int chosen = fits ? best_k : least_k;
  if (fits && at_min) {
    // Probed at another budget (a least peak found on the way), whose
    // verdict its message gives: judged again at "min".
    const bool cut = TimeLimitReached(result);
    nlohmann::json details = std::move(result.details);
    ASSIGN_OR_RETURN(result, FinishPlan(graph, std::move(result.schedule), options));
    result.details = std::move(details);
    if (cut) NoteTimeLimit(result, options.time_limit_s, "the policy's search");
  }
  result.feasible = fits;
  int64_t resident_bytes = 0, streamed_bytes = 0;
  int streamed_parameters = 0;
  for (int i = 0; i < n; ++i) {
    (i < chosen ? resident_bytes : streamed_bytes) += graph.bytes(nodes[i]);
    streamed_parameters += i >= chosen && graph.role(nodes[i]) == Role::kParameter;
  }
  result.details["state_placement"] = {{"resident_tensors", chosen},
                                       {"streamed_tensors", n - chosen},
                                       {"streamed_parameters", streamed_parameters},
                                       {"resident_bytes", resident_bytes},
                                       {"streamed_bytes", streamed_bytes},
                                       {"plans", plans}};
  if (deadline.hit()) NoteTimeLimit(result, options.time_limit_s, "state placement");
  return result;
}

}  // namespace pebble
