// The `exact` policy: A* over resident sets (scheduler/exact_multishot.h,
// Note [exact multi-shot search]).
#include "scheduler/exact_multishot.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"
#include "scheduler/policies.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

using Clock = std::chrono::steady_clock;
using Set = uint64_t;

// The needed non-persistent nodes at positions 0..m-1 (DefaultOrder), with
// input sets as bitsets.
struct LocalGraph {
  std::vector<NodeId> nodes;
  std::vector<Set> inputs;  // non-persistent inputs
  std::vector<int64_t> bytes;
  std::vector<int64_t> workspace;
  std::vector<double> cost;
  // Note [Costs on a grid]: cost[v] in units of 2^(e - 40), e the binary
  // exponent of the sum of the costs, rounded: sums of these are exact and
  // associative, so plans that compute the same nodes in another order, or
  // whole-number costs in any order, cost the same and the peak breaks the
  // tie. Whole numbers below 2^40 times the total's magnitude are exact; any
  // other cost is off by at most half a unit, about 2^-41 of the total.
  std::vector<int64_t> grid_cost;
  Set outputs = 0;
  int64_t persistent_bytes = 0;
  int m() const { return static_cast<int>(nodes.size()); }

  int64_t Bytes(Set d) const {
    int64_t total = 0;
    for (Set rest = d; rest != 0; rest &= rest - 1) total += bytes[__builtin_ctzll(rest)];
    return total;
  }
  // X(D) of the Note: what every completion from `d` must compute.
  Set MustCompute(Set d) const {
    Set x = outputs & ~d;
    for (int p = m() - 1; p >= 0; --p) {
      if (x & (Set{1} << p)) x |= inputs[p] & ~d;
    }
    return x;
  }
};

absl::StatusOr<LocalGraph> MakeLocalGraph(const Graph& graph) {
  LocalGraph g;
  g.nodes = DefaultOrder(graph);
  if (g.m() > kMaxExactMultiShotNodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exact: the graph has ", g.m(),
        " needed non-persistent nodes; the exact multi-shot search takes at most ",
        kMaxExactMultiShotNodes, " (use checkmate or a heuristic policy)"));
  }
  std::vector<int> position(graph.num_nodes(), -1);
  for (int p = 0; p < g.m(); ++p) position[g.nodes[p]] = p;
  for (int p = 0; p < g.m(); ++p) {
    const NodeId v = g.nodes[p];
    Set in = 0;
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u)) in |= Set{1} << position[u];
    }
    g.inputs.push_back(in);
    g.bytes.push_back(graph.bytes(v));
    g.workspace.push_back(graph.workspace(v));
    g.cost.push_back(graph.cost(v));
    if (graph.is_output(v)) g.outputs |= Set{1} << p;
  }
  g.persistent_bytes = graph.persistent_bytes();
  double total = 0;
  for (double c : g.cost) total += c;
  const int exponent = total > 0 ? std::ilogb(total) : 0;
  for (double c : g.cost) g.grid_cost.push_back(std::llround(std::ldexp(c, 40 - exponent)));
  return g;
}

enum class Mode { kCost, kPeak };

// Search results: the goal's path as (state, move) pairs.
struct Found {
  bool reached = false;
  std::vector<std::pair<Set, int>> path;  // (state after the move, node moved)
  double cost = 0;
  int64_t peak = 0;
};

// Labels of one reached set: in kCost mode ordered by (g, peak, steps), in
// kPeak mode by (peak, steps), g kept for the record. g is the compute cost
// on the grid of LocalGraph::grid_cost.
struct Entry {
  Set set;
  int64_t g;
  int64_t peak;
  int32_t steps;
  int32_t parent;  // entry index, -1 for the start
  int8_t move;     // node computed to get here, -1 for the start
  bool closed;
};

// The queue's key: (g + h, peak, steps + h_steps) in kCost mode (A* on the
// lexicographic order: every component is a lower bound of the final
// label's, and they never fall along a move), (peak, steps, 0) in kPeak
// mode.
struct QueueItem {
  int64_t key1;
  int64_t key2;
  int64_t key3;
  Set set;
  int32_t entry;
  // std::priority_queue pops the largest: order so that the smallest
  // (key1, key2, key3, set) is the largest.
  bool operator<(const QueueItem& o) const {
    return std::tie(key1, key2, key3, set) > std::tie(o.key1, o.key2, o.key3, o.set);
  }
};

// Both modes keep only moves whose memory is within `budget`: the budget
// of kCost mode; in kPeak mode a bound below which the lowest peak is
// sought (INT64_MAX: none).
absl::StatusOr<Found> Search(const LocalGraph& g, Mode mode, int64_t budget,
                             double time_limit_s, ExactMultiShotStats* stats) {
  const Clock::time_point started = Clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(Clock::now() - started).count();
  };
  Found found;
  if (g.persistent_bytes > budget) return found;
  std::vector<Entry> entries;
  absl::flat_hash_map<Set, int32_t> index;
  std::priority_queue<QueueItem> queue;
  auto key_of = [&](const Entry& en) -> QueueItem {
    if (mode == Mode::kPeak) return {en.peak, en.steps, 0, en.set, -1};
    const Set x = g.MustCompute(en.set);
    int64_t h = 0;
    for (Set rest = x; rest != 0; rest &= rest - 1) h += g.grid_cost[__builtin_ctzll(rest)];
    return {en.g + h, en.peak, en.steps + __builtin_popcountll(x), en.set, -1};
  };
  auto push = [&](int32_t e) {
    QueueItem item = key_of(entries[e]);
    item.entry = e;
    queue.push(item);
  };
  // Is label (g, peak, steps) better than entry e's?
  auto better = [&](int64_t gc, int64_t peak, int32_t steps, const Entry& e) {
    if (mode == Mode::kCost) return std::tie(gc, peak, steps) < std::tie(e.g, e.peak, e.steps);
    return std::tie(peak, steps) < std::tie(e.peak, e.steps);
  };

  entries.push_back({0, 0, g.persistent_bytes, 0, -1, -1, false});
  index[0] = 0;
  push(0);
  int32_t goal = -1;
  // The clock is read every 1024 units of work, a pop (stale ones
  // included) or a child made: one expansion of a node with many inputs
  // makes a child per subset of them (2^20 for 20), and counted by
  // expansions the search once ran 20 times past its limit.
  int64_t work = 0;
  auto exhausted = [&]() -> absl::Status {
    const bool out_of_time = (++work & 1023) == 0 && elapsed() > time_limit_s;
    const bool out_of_memory =
        static_cast<int64_t>(entries.size()) > kMaxExactMultiShotStates;
    if (!out_of_time && !out_of_memory) return absl::OkStatus();
    stats->states = static_cast<int64_t>(entries.size());
    stats->seconds = elapsed();
    return absl::ResourceExhaustedError(absl::StrCat(
        "exact: ",
        out_of_time
            ? absl::StrCat("no optimum within the time limit (the search reached ",
                           entries.size(), " states in ",
                           absl::StrFormat("%.3g", stats->seconds), " s, the time left to it)")
            : absl::StrCat("more than ", kMaxExactMultiShotStates,
                           " resident sets reached before the optimum (the "
                           "memory limit of the search)"),
        "; use checkmate or a heuristic policy"));
  };
  while (!queue.empty()) {
    RETURN_IF_ERROR(exhausted());
    const QueueItem item = queue.top();
    queue.pop();
    Entry& cur = entries[item.entry];
    if (cur.closed) continue;
    {
      const QueueItem now = key_of(cur);
      if (std::tie(now.key1, now.key2, now.key3) != std::tie(item.key1, item.key2, item.key3)) {
        continue;  // stale
      }
    }
    if ((cur.set & g.outputs) == g.outputs) {
      goal = item.entry;
      break;
    }
    cur.closed = true;
    ++stats->expanded;
    const Set d = cur.set;
    const int64_t gc = cur.g;
    const int64_t peak = cur.peak;
    const int32_t steps = cur.steps;
    const int32_t parent = item.entry;
    const int64_t resident = g.persistent_bytes + g.Bytes(d);
    for (int v = 0; v < g.m(); ++v) {
      const Set bit = Set{1} << v;
      if ((d & bit) || (g.inputs[v] & ~d)) continue;
      const int64_t during = resident + g.bytes[v] + g.workspace[v];
      if (during > budget) continue;
      const int64_t child_g = gc + g.grid_cost[v];
      const int64_t child_peak = std::max(peak, during);
      // Every subset F of v's inputs, the empty one first.
      const Set in = g.inputs[v];
      Set f = 0;
      while (true) {
        RETURN_IF_ERROR(exhausted());
        const Set child = (d | bit) & ~f;
        const int32_t child_steps = steps + 1 + __builtin_popcountll(f);
        auto it = index.find(child);
        if (it == index.end()) {
          const int32_t e = static_cast<int32_t>(entries.size());
          entries.push_back({child, child_g, child_peak, child_steps, parent,
                             static_cast<int8_t>(v), false});
          index.emplace(child, e);
          push(e);
        } else {
          Entry& old = entries[it->second];
          if (!old.closed && better(child_g, child_peak, child_steps, old)) {
            old.g = child_g;
            old.peak = child_peak;
            old.steps = child_steps;
            old.parent = parent;
            old.move = static_cast<int8_t>(v);
            push(it->second);
          }
        }
        if (f == in) break;
        f = (f - in) & in;  // next subset of `in`
      }
    }
  }
  stats->states = static_cast<int64_t>(entries.size());
  stats->seconds = elapsed();
  if (goal < 0) return found;
  found.reached = true;
  found.peak = entries[goal].peak;
  for (int32_t e = goal; entries[e].parent >= 0; e = entries[e].parent) {
    found.path.push_back({entries[e].set, entries[e].move});
  }
  std::reverse(found.path.begin(), found.path.end());
  for (const auto& [set, v] : found.path) found.cost += g.cost[v];
  return found;
}

Schedule ToSchedule(const LocalGraph& g, const Found& found) {
  Schedule schedule;
  Set d = 0;
  for (const auto& [next, v] : found.path) {
    schedule.steps.push_back({Action::kCompute, g.nodes[v]});
    const Set freed = (d | (Set{1} << v)) & ~next;
    for (Set rest = freed; rest != 0; rest &= rest - 1) {
      schedule.steps.push_back({Action::kFree, g.nodes[__builtin_ctzll(rest)]});
    }
    d = next;
  }
  return schedule;
}

absl::StatusOr<ExactMultiShotSolution> Finish(const Graph& graph,
                                              const LocalGraph& g,
                                              const Found& found) {
  ExactMultiShotSolution solution;
  solution.schedule = ToSchedule(g, found);
  ASSIGN_OR_RETURN(PlanReport report, Simulate(graph, solution.schedule));
  PEBBLE_CHECK(report.peak_bytes == found.peak,
               "exact: simulated peak differs from the search's");
  // The search's cost counts a collective's (a gather again costs its
  // network time); the simulator's compute_cost leaves collectives out.
  double compute_cost = 0;
  for (const auto& [set, v] : found.path) {
    if (!graph.collective(g.nodes[v])) compute_cost += g.cost[v];
  }
  PEBBLE_CHECK(std::abs(report.compute_cost - compute_cost) <=
                   1e-9 * std::abs(found.cost),
               "exact: simulated cost differs from the search's");
  solution.cost = report.compute_cost;
  solution.peak = report.peak_bytes;
  return solution;
}

}  // namespace

absl::StatusOr<std::optional<ExactMultiShotSolution>> ExactMultiShotSchedule(
    const Graph& graph, int64_t budget_bytes, double time_limit_s,
    ExactMultiShotStats* stats) {
  ExactMultiShotStats local;
  if (stats == nullptr) stats = &local;
  ASSIGN_OR_RETURN(LocalGraph g, MakeLocalGraph(graph));
  ASSIGN_OR_RETURN(Found found, Search(g, Mode::kCost, budget_bytes, time_limit_s, stats));
  if (!found.reached) return std::optional<ExactMultiShotSolution>();
  ASSIGN_OR_RETURN(ExactMultiShotSolution solution, Finish(graph, g, found));
  PEBBLE_CHECK(solution.peak <= budget_bytes, "exact: plan over budget");
  return std::optional<ExactMultiShotSolution>(std::move(solution));
}

absl::StatusOr<ExactMultiShotSolution> ExactMinPeakSchedule(
    const Graph& graph, double time_limit_s, ExactMultiShotStats* stats,
    int64_t upper_bytes) {
  ExactMultiShotStats local;
  if (stats == nullptr) stats = &local;
  ASSIGN_OR_RETURN(LocalGraph g, MakeLocalGraph(graph));
  const bool bounded = upper_bytes != std::numeric_limits<int64_t>::max();
  ASSIGN_OR_RETURN(Found found, Search(g, Mode::kPeak, bounded ? upper_bytes - 1 : upper_bytes,
                                       time_limit_s, stats));
  if (!found.reached) {
    // Without a bound every goal is reachable (compute everything once).
    PEBBLE_CHECK(bounded, "exact: min-peak search found no schedule");
    return absl::NotFoundError(
        absl::StrCat("exact: no schedule peaks below ", upper_bytes, " bytes"));
  }
  return Finish(graph, g, found);
}

namespace {

// SPEC section 5: `min` takes the least makespan within 0.5% of the lowest
// peak.
constexpr double kMinPeakSlack = 1.005;

// The plan shown where no schedule fits options.budget_bytes (proven): the
// lowest peak of any schedule, where the search finishes in the time left;
// else best-order's plan. best-order runs first (half the time left at
// most): the search then keeps only moves below its peak, and where it
// finds no schedule there, best-order's plan has the lowest peak. Sets
// *min_peak where the search finished.
absl::StatusOr<PlanResult> LowestPeakPlan(const Graph& graph, const PlannerOptions& options,
                                          const Deadline& deadline,
                                          ExactMultiShotStats* stats,
                                          std::optional<int64_t>* min_peak) {
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> best_order, MakePlanner("best-order"));
  PlannerOptions order_options = options;
  order_options.budget_bytes = PlannerOptions::kMinBudget;
  order_options.time_limit_s = deadline.remaining_s() / 2;
  ASSIGN_OR_RETURN(PlanResult one_shot, best_order->Plan(graph, order_options));
  const int64_t upper = one_shot.report.peak_bytes;
  absl::StatusOr<ExactMultiShotSolution> low =
      ExactMinPeakSchedule(graph, deadline.remaining_s(), stats, upper);
  Schedule shown = std::move(one_shot.schedule);
  if (low.ok()) {
    *min_peak = low->peak;
    shown = std::move(low->schedule);
  } else if (absl::IsNotFound(low.status())) {
    *min_peak = upper;
  }
  ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(shown), options));
  result.feasible = false;
  result.message = absl::StrCat("exact: no schedule fits the budget of ",
                                FormatBytes(options.budget_bytes), " (", options.budget_bytes,
                                " bytes)");
  if (min_peak->has_value()) {
    absl::StrAppend(&result.message, "; the lowest peak of any schedule is ",
                    FormatBytes(**min_peak), " (", **min_peak, " bytes), the schedule shown");
  } else {
    absl::StrAppend(&result.message, "; the search for the lowest peak stopped (",
                    low.status().message(), "): the schedule shown is best-order's, peak ",
                    FormatBytes(upper), " (", upper, " bytes)");
  }
  return result;
}

class ExactMultiShotPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const Deadline deadline(options.time_limit_s);
    auto left = [&] { return deadline.remaining_s(); };
    ExactMultiShotStats cost_stats, peak_stats;
    std::optional<int64_t> min_peak;
    std::optional<ExactMultiShotSolution> best;
    std::string message;
    if (options.budget_bytes == PlannerOptions::kMinBudget) {
      // SPEC section 5: the cheapest plan within 0.5% of the lowest peak
      // (the cheapest at that budget has, among equal costs, the lowest
      // peak: Note [Costs on a grid]).
      ASSIGN_OR_RETURN(ExactMultiShotSolution low,
                       ExactMinPeakSchedule(graph, left(), &peak_stats));
      min_peak = low.peak;
      const int64_t near =
          std::max(low.peak, static_cast<int64_t>(
                                 std::floor(kMinPeakSlack * static_cast<double>(low.peak))));
      ASSIGN_OR_RETURN(best, ExactMultiShotSchedule(graph, near, left(), &cost_stats));
      PEBBLE_CHECK(best.has_value(), "exact: no plan at the minimum peak");
      message = absl::StrCat("optimal: the cheapest plan within 0.5% of the minimum peak, ",
                             low.peak, " bytes");
    } else {
      ASSIGN_OR_RETURN(best, ExactMultiShotSchedule(graph, options.budget_bytes,
                                                    left(), &cost_stats));
      message = "optimal";
    }
    PlanResult result;
    if (best.has_value()) {
      ASSIGN_OR_RETURN(result, FinishPlan(graph, std::move(best->schedule), options));
      result.message = message;
    } else {
      ASSIGN_OR_RETURN(result, LowestPeakPlan(graph, options, deadline, &peak_stats, &min_peak));
    }
    nlohmann::json& d = result.details;
    d["optimal"] = result.feasible;
    d["states"] = cost_stats.states + peak_stats.states;
    d["expanded"] = cost_stats.expanded + peak_stats.expanded;
    d["search_s"] = cost_stats.seconds + peak_stats.seconds;
    if (min_peak.has_value()) d["min_peak_bytes"] = *min_peak;
    return result;
  }
};

}  // namespace

void RegisterExactMultiShotPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "exact",
      .description = absl::StrCat(
          "the cheapest multi-shot plan (recomputation, any order) by A* over "
          "resident sets; provably optimal; tiny graphs (at most ",
          kMaxExactMultiShotNodes, " needed nodes)"),
      .kind = PlanKind::kMultiShot,
      .exact = true,
      .factory = [] { return std::make_unique<ExactMultiShotPlanner>(); },
  });
}

}  // namespace pebble
