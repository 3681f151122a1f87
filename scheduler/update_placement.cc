#include "scheduler/update_placement.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "graph/status.h"
#include "scheduler/updates_last.h"

namespace pebble {

// Note [Update placement]. ZeRO-Offload runs every update on the host: each
// gradient leaves the device as soon as it is complete, the state never
// comes to the device, and the host's time (an update reads and writes
// about twelve times a parameter's bytes for Adam) replaces the copies of
// the state. The device then never holds a parameter's state, which lowers
// the least peak (the largest parameter's update, with its state streamed
// in, sets it otherwise); but a host streams an update several times more
// slowly than a device computes it. So the fastest placement that fits runs
// on the host only the updates the budget needs there, and those of the
// largest parameters first (they set the peak; with state=auto too, each
// placement is planned with the state placed per tensor, Note [State
// placement], which streams the largest state first). With the parameters'
// groups (a parameter's update and the updates only it reads) in that
// order and the k first on the host, the search plans k = 0 (all on the
// device) and k = n (all on the host), bisects for the smallest k that
// fits, tries two more k past it (the peak falls with k only roughly), and
// keeps the fastest plan that fits among those made. At "min" the budget is
// the lower of k = 0's and k = n's least peaks, at which the later plans
// are made; where a host budget holds k = 0's host peak but not k = n's
// (the host then holds every state, gradient and update), it is the least
// peak within the host budget instead: the search bisects for the largest k
// whose least-peak plan fits the host budget, and the budget is the lowest
// device peak among the plans so made that fit it. A placement the policy or
// the simulator refuses fits nothing.
// Where k = 0 fits, only k = n is tried besides: an update is faster on
// the host only where the host's rate is several times the link's (Adam's
// update moves twelve times a parameter's bytes on the host, its streamed
// state four times over the link), and then all of them are.

namespace {

// Per update that runs_on auto, the index of its parameter's group
// (ParameterUpdateGroups) in the order they go to the host: the largest
// parameter first (ties: the lower node id); -1 for every other node.
struct Groups {
  std::vector<int> of;
  std::vector<NodeId> parameter;  // per group, the parameter its update writes
};

Groups GroupsOf(const Graph& graph) {
  std::vector<std::vector<NodeId>> all = ParameterUpdateGroups(graph);
  std::erase_if(all, [&](const std::vector<NodeId>& g) {
    return graph.runs_on(g.front()) != Tier::kAuto;
  });
  auto key = [&](const std::vector<NodeId>& g) {
    return std::pair(-graph.bytes(graph.storage(g.front())), g.front());
  };
  std::sort(all.begin(), all.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  Groups groups;
  groups.of.assign(graph.num_nodes(), -1);
  for (int i = 0; i < static_cast<int>(all.size()); ++i) {
    groups.parameter.push_back(graph.storage(all[i].front()));
    for (NodeId w : all[i]) {
      if (graph.runs_on(w) == Tier::kAuto) groups.of[w] = i;
    }
  }
  return groups;
}

}  // namespace

absl::StatusOr<PlanResult> PlaceUpdates(const Graph& graph, const PlannerOptions& options,
                                        const ConcretePlanner& plan) {
  const Groups groups = GroupsOf(graph);
  const int n = static_cast<int>(groups.parameter.size());
  const bool at_min = options.budget_bytes == PlannerOptions::kMinBudget;
  const Deadline deadline(options.time_limit_s);
  PlannerOptions probe_options = options;
  const int most_plans = 4 + static_cast<int>(std::ceil(std::log2(std::max(n, 1))));
  int plans = 0;
  absl::Status first_error = absl::OkStatus();
  std::vector<std::optional<PlanResult>> made(n + 1);
  // Plans with the first k groups on the host; nullopt where the policy or
  // the simulator refused that placement.
  auto probe = [&](int k) -> const std::optional<PlanResult>& {
    if (made[k].has_value() || (plans > 0 && deadline.Expired())) return made[k];
    ++plans;
    probe_options.time_limit_s =
        std::max(0.01, deadline.remaining_s() / std::max(1, most_plans - plans + 1));
    absl::StatusOr<PlanResult> r = plan(
        graph.WithAutoRunsOnAs([&](NodeId v) { return groups.of[v] >= 0 && groups.of[v] < k; }),
        probe_options);
    if (!r.ok()) {
      if (first_error.ok()) first_error = r.status();
    } else {
      made[k] = *std::move(r);
    }
    return made[k];
  };
  probe(0);
  if (n > 0) probe(n);
  auto within_host_budget = [&](int k) {
    return made[k].has_value() && (!options.host_budget_bytes.has_value() ||
                                   made[k]->report.host_peak_bytes <= *options.host_budget_bytes);
  };
  int64_t device_budget = options.budget_bytes;
  if (at_min) {
    if (n > 1 && within_host_budget(0) && made[n].has_value() && !within_host_budget(n)) {
      int lo = 0, hi = n;  // lo's least-peak plan fits the host budget, hi's does not
      while (hi - lo > 1 && !deadline.Expired()) {
        const int mid = lo + (hi - lo) / 2;
        probe(mid);
        (within_host_budget(mid) ? lo : hi) = mid;
      }
    }
    // The least peak (within the host budget where some plan is), then the
    // fastest at it: later plans have that budget.
    bool any_within = false;
    for (int k = 0; k <= n; ++k) any_within = any_within || within_host_budget(k);
    device_budget = INT64_MAX;
    for (int k = 0; k <= n; ++k) {
      if (made[k].has_value() && (within_host_budget(k) || !any_within)) {
        device_budget = std::min(device_budget, made[k]->report.peak_bytes);
      }
    }
    probe_options.budget_bytes = device_budget;
  }
  auto fits = [&](int k) {
    const std::optional<PlanResult>& r = made[k];
    return r.has_value() && (r->feasible || at_min) && r->report.peak_bytes <= device_budget &&
           within_host_budget(k);
  };
  if (n > 1 && !fits(0) && fits(n)) {
    int lo = 0, hi = n;  // lo does not fit, hi does
    while (hi - lo > 1 && !deadline.Expired()) {
      const int mid = lo + (hi - lo) / 2;
      probe(mid);
      (fits(mid) ? hi : lo) = mid;
    }
    for (int k = hi + 1; k <= std::min(hi + 2, n - 1) && !deadline.Expired(); ++k) probe(k);
  }
  int best = -1, least = -1;
  for (int k = 0; k <= n; ++k) {
    if (!made[k].has_value()) continue;
    if (least < 0 || made[k]->report.peak_bytes < made[least]->report.peak_bytes) least = k;
    if (fits(k) && (best < 0 || Faster(*made[k], *made[best]))) best = k;
  }
  if (least < 0) return first_error;
  // Where nothing fits, the least device peak says by how much.
  const int chosen = best >= 0 ? best : least;
  PlanResult result = *std::move(made[chosen]);
  result.feasible = best >= 0;
  int64_t host_bytes = 0, device_bytes = 0;
  for (int i = 0; i < n; ++i) {
    (i < chosen ? host_bytes : device_bytes) += graph.bytes(groups.parameter[i]);
  }
  result.details["update_placement"] = {{"host_parameters", chosen},
                                        {"device_parameters", n - chosen},
                                        {"host_parameter_bytes", host_bytes},
                                        {"device_parameter_bytes", device_bytes},
                                        {"plans", plans}};
  if (deadline.hit()) NoteTimeLimit(result, options.time_limit_s, "update placement");
  return result;
}

}  // namespace pebble
