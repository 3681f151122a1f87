// Checkmate's MILP (CBC) and LP relaxation with two-phase rounding (Clp);
// see scheduler/checkmate.h, Note [Checkmate's model].
#include "scheduler/checkmate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "CbcModel.hpp"
#include "CbcSolver.hpp"
#include "ClpEventHandler.hpp"
#include "ClpSimplex.hpp"
#include "ClpSolve.hpp"
#include "CoinMessageHandler.hpp"
#include "CoinPackedMatrix.hpp"
#include "OsiClpSolverInterface.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "oneapi/tbb/parallel_for.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/compose.h"
#include "scheduler/exact_multishot.h"
#include "scheduler/planner.h"
#include "scheduler/policies.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

using Clock = std::chrono::steady_clock;

// SPEC section 5: `min` takes the least makespan among the plans within
// 0.5% of the lowest peak.
constexpr double kMinPeakSlack = 1.005;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The graph as Checkmate sees it: positions 0..n-1 in the fixed order.
struct StageGraph {
  std::vector<NodeId> order;
  std::vector<int> position;                // node -> position, or -1
  std::vector<std::vector<int>> inputs;     // distinct non-persistent, ascending
  std::vector<std::vector<int>> readers;    // needed readers, ascending
  std::vector<int64_t> bytes;
  std::vector<int64_t> workspace;
  std::vector<double> cost;
  std::vector<uint8_t> output;
  int64_t persistent_bytes = 0;
  int n() const { return static_cast<int>(order.size()); }
};

StageGraph MakeStageGraph(const Graph& graph, std::vector<NodeId> order) {
  StageGraph g;
  g.order = std::move(order);
  const int n = g.n();
  g.position.assign(graph.num_nodes(), -1);
  for (int p = 0; p < n; ++p) g.position[g.order[p]] = p;
  g.inputs.resize(n);
  g.readers.resize(n);
  g.bytes.resize(n);
  g.workspace.resize(n);
  g.cost.resize(n);
  g.output.resize(n);
  for (int p = 0; p < n; ++p) {
    const NodeId v = g.order[p];
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.persistent(u)) continue;
      PEBBLE_CHECK(g.position[u] >= 0 && g.position[u] < p,
                   "checkmate: the order is not topological");
      g.inputs[p].push_back(g.position[u]);
      g.readers[g.position[u]].push_back(p);
    }
    std::sort(g.inputs[p].begin(), g.inputs[p].end());
    g.bytes[p] = graph.bytes(v);
    g.workspace[p] = graph.workspace(v);
    g.cost[p] = graph.cost(v);
    g.output[p] = graph.is_output(v) ? 1 : 0;
  }
  // Readers were appended in increasing reader position already.
  g.persistent_bytes = graph.persistent_bytes();
  return g;
}

// S[t+1] as a lookup: keep[t + 1] for t + 1 < n, the final row otherwise.
inline bool KeptAfter(const StagePlan& plan, int t, int i) {
  return plan.keep[t + 1][i] != 0;
}

absl::Status CheckShapes(const StagePlan& plan) {
  const int n = static_cast<int>(plan.order.size());
  if (static_cast<int>(plan.compute.size()) != n ||
      static_cast<int>(plan.keep.size()) != n + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage plan: ", n, " nodes need ", n, " compute rows and ", n + 1,
        " keep rows"));
  }
  for (int t = 0; t < n; ++t) {
    if (static_cast<int>(plan.compute[t].size()) != t + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage plan: compute row ", t, " needs ", t + 1, " entries"));
    }
  }
  for (int t = 0; t <= n; ++t) {
    if (static_cast<int>(plan.keep[t].size()) != t) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage plan: keep row ", t, " needs ", t, " entries"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStagePlan(const Graph& graph, const StagePlan& plan) {
  RETURN_IF_ERROR(CheckShapes(plan));
  // Any topological order of the needed non-persistent nodes is accepted;
  // FreeAtLastUse checks exactly that.
  RETURN_IF_ERROR(FreeAtLastUse(graph, plan.order).status());
  const StageGraph g = MakeStageGraph(graph, plan.order);
  const int n = g.n();
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j <= t; ++j) {
      if (!plan.compute[t][j]) continue;
      for (int i : g.inputs[j]) {
        const bool held = plan.compute[t][i] || (i < t && plan.keep[t][i]);
        if (!held) {
          return absl::InvalidArgumentError(absl::StrCat(
              "stage plan: stage ", t, " computes '", graph.id(g.order[j]),
              "' without its input '", graph.id(g.order[i]), "'"));
        }
      }
    }
    for (int i = 0; i <= t; ++i) {
      if (KeptAfter(plan, t, i) && !plan.compute[t][i] &&
          !(i < t && plan.keep[t][i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stage plan: '", graph.id(g.order[i]), "' is kept after stage ", t,
            " but neither computed nor held in it"));
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    if (g.output[i] && !plan.keep[n][i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage plan: output '", graph.id(g.order[i]), "' is not kept at the end"));
    }
  }
  return absl::OkStatus();
}

StagePlan ComputeForKeep(const Graph& graph, std::vector<NodeId> order,
                         std::vector<std::vector<uint8_t>> keep) {
  const StageGraph g = MakeStageGraph(graph, order);
  const int n = g.n();
  PEBBLE_CHECK(static_cast<int>(keep.size()) == n + 1, "ComputeForKeep: keep rows");
  keep[0].clear();
  for (int i = 0; i < n; ++i) keep[n][i] = g.output[i];
  StagePlan plan;
  plan.order = std::move(order);
  plan.compute.resize(n);
  std::vector<uint8_t> need;
  for (int t = 0; t < n; ++t) {
    PEBBLE_CHECK(static_cast<int>(keep[t].size()) == t, "ComputeForKeep: keep row");
    need.assign(t + 1, 0);
    need[t] = 1;
    for (int i = 0; i < t; ++i) {
      if (keep[t + 1][i] && !keep[t][i]) need[i] = 1;
    }
    // Inputs precede their readers, so one descending sweep closes `need`.
    for (int j = t; j >= 0; --j) {
      if (!need[j]) continue;
      for (int i : g.inputs[j]) {
        if (!(i < t && keep[t][i])) need[i] = 1;
      }
    }
    plan.compute[t] = need;
  }
  plan.keep = std::move(keep);
  return plan;
}

StagePlan StagePlanFromSchedule(const Graph& graph, const Schedule& schedule) {
  std::vector<NodeId> order = DefaultOrder(graph);
  const StageGraph g = MakeStageGraph(graph, order);
  const int n = g.n();
  std::vector<std::vector<uint8_t>> keep(n + 1);
  for (int t = 0; t <= n; ++t) keep[t].assign(t, 0);
  std::vector<uint8_t> resident(n, 0), computed(n, 0);
  // `open_stage`: the stage whose S is taken at the next compute (the first
  // compute after v_{open_stage - 1}'s first compute), or -1.
  int open_stage = -1;
  for (const Step& step : schedule.steps) {
    const int p = step.node < static_cast<NodeId>(g.position.size())
                      ? g.position[step.node]
                      : -1;
    if (p < 0) continue;  // persistent or not needed
    switch (step.action) {
      case Action::kCompute:
        if (open_stage > 0 && open_stage < n) {
          for (int i = 0; i < open_stage; ++i) keep[open_stage][i] = resident[i];
        }
        open_stage = -1;
        resident[p] = 1;
        if (!computed[p]) {
          computed[p] = 1;
          open_stage = p + 1;
        }
        break;
      case Action::kFree:
      case Action::kOffload:
        resident[p] = 0;
        break;
      case Action::kPrefetch:
        resident[p] = 1;
        break;
      case Action::kHostCompute:  // no device residency
      case Action::kAllReduce:    // in place: residency unchanged
        break;
    }
  }
  return ComputeForKeep(graph, std::move(order), std::move(keep));
}

Schedule RemoveDeadComputes(const Graph& graph, const Schedule& schedule) {
  const int steps = static_cast<int>(schedule.steps.size());
  std::vector<uint8_t> live(graph.num_nodes(), 0);
  // pending_free[v]: index of the next free of v after the current position
  // (in the backward scan), or -1.
  std::vector<int> pending_free(graph.num_nodes(), -1);
  for (NodeId v : graph.outputs()) live[v] = 1;
  std::vector<uint8_t> removed(steps, 0);
  for (int k = steps - 1; k >= 0; --k) {
    const Step& s = schedule.steps[k];
    switch (s.action) {
      case Action::kFree:
        live[s.node] = 0;
        pending_free[s.node] = k;
        break;
      case Action::kCompute:
        if (!live[s.node]) {
          removed[k] = 1;
          if (pending_free[s.node] >= 0) removed[pending_free[s.node]] = 1;
        } else {
          for (NodeId u : graph.unique_inputs(s.node)) {
            if (!graph.persistent(u)) live[u] = 1;
          }
        }
        live[s.node] = 0;
        pending_free[s.node] = -1;
        break;
      case Action::kOffload:
      case Action::kAllReduce:
        // A host copy may be read later by a prefetch, and a reduced value
        // by an update: the value is live.
        live[s.node] = 1;
        break;
      case Action::kPrefetch:
        live[s.node] = 0;
        pending_free[s.node] = -1;
        break;
      case Action::kHostCompute:  // an update: an effect, never dead
        for (NodeId u : graph.unique_inputs(s.node)) {
          if (!graph.persistent(u)) live[u] = 1;
        }
        break;
    }
  }
  Schedule out;
  out.steps.reserve(steps);
  for (int k = 0; k < steps; ++k) {
    if (!removed[k]) out.steps.push_back(schedule.steps[k]);
  }
  return out;
}

absl::StatusOr<Schedule> StagePlanToSchedule(const Graph& graph,
                                             const StagePlan& plan) {
  RETURN_IF_ERROR(ValidateStagePlan(graph, plan));
  const StageGraph g = MakeStageGraph(graph, plan.order);
  const int n = g.n();
  Schedule schedule;
  std::vector<uint8_t> resident(n, 0);
  std::vector<int> last_use(n, -1);
  std::vector<int> stage_computes;
  for (int t = 0; t < n; ++t) {
    // Invariant: resident == S[t] (ValidateStagePlan and the frees below).
    stage_computes.clear();
    for (int i = 0; i <= t; ++i) {
      if (plan.compute[t][i] && !resident[i]) stage_computes.push_back(i);
    }
    std::fill(last_use.begin(), last_use.begin() + t + 1, -1);
    for (int k : stage_computes) {
      for (int u : g.inputs[k]) last_use[u] = k;
    }
    // Held from before, unread in this stage and not kept: free it now.
    for (int i = 0; i < t; ++i) {
      if (resident[i] && last_use[i] < 0 && !KeptAfter(plan, t, i)) {
        schedule.steps.push_back({Action::kFree, g.order[i]});
        resident[i] = 0;
      }
    }
    for (int k : stage_computes) {
      schedule.steps.push_back({Action::kCompute, g.order[k]});
      resident[k] = 1;
      for (int u : g.inputs[k]) {
        if (last_use[u] == k && !KeptAfter(plan, t, u)) {
          schedule.steps.push_back({Action::kFree, g.order[u]});
          resident[u] = 0;
        }
      }
      if (last_use[k] < 0 && !KeptAfter(plan, t, k)) {
        schedule.steps.push_back({Action::kFree, g.order[k]});
        resident[k] = 0;
      }
    }
  }
  return schedule;
}

StagePlan OneShotStagePlan(const Graph& graph) {
  const StageGraph g = MakeStageGraph(graph, DefaultOrder(graph));
  const int n = g.n();
  std::vector<std::vector<uint8_t>> keep(n + 1);
  for (int t = 0; t <= n; ++t) {
    keep[t].assign(t, 0);
    for (int i = 0; i < t; ++i) {
      const bool read_later = !g.readers[i].empty() && g.readers[i].back() >= t;
      keep[t][i] = (g.output[i] || read_later) ? 1 : 0;
    }
  }
  return ComputeForKeep(graph, g.order, std::move(keep));
}

int64_t PeakLowerBound(const Graph& graph) {
  // With aliases, bytes are a storage's (its root's), each storage once:
  // `seen` stamps the storages counted for the current node (and, with
  // stamp -2, for the outputs). Without aliases every node is its own
  // storage and a node's distinct inputs are distinct storages.
  const bool views = graph.has_aliases();
  std::vector<NodeId> seen(views ? graph.num_nodes() : 0, kNoNode);
  auto count = [&](NodeId u, NodeId stamp) -> int64_t {
    const NodeId root = graph.storage(u);
    if (graph.persistent(root)) return 0;
    if (views) {
      if (seen[root] == stamp) return 0;
      seen[root] = stamp;
    }
    return graph.bytes(root);
  };
  int64_t largest = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (!graph.needed()[v] || graph.persistent(v)) continue;
    int64_t step = count(v, v) + graph.workspace(v);
    for (NodeId u : graph.unique_inputs(v)) step += count(u, v);
    largest = std::max(largest, step);
  }
  int64_t outputs = 0;
  for (NodeId v : graph.outputs()) outputs += count(v, -2);
  return graph.persistent_bytes() + std::max(largest, outputs);
}

namespace {

// ---------------------------------------------------------------------------
// The linear program, built as triplets.

struct LinearProgram {
  std::vector<double> col_lb, col_ub, obj;
  std::vector<uint8_t> integer;
  std::vector<double> row_lb, row_ub;
  std::vector<int> rows, cols;
  std::vector<double> values;

  int num_cols() const { return static_cast<int>(obj.size()); }
  int num_rows() const { return static_cast<int>(row_lb.size()); }
  int num_integer() const {
    return static_cast<int>(std::count(integer.begin(), integer.end(), 1));
  }
  int AddCol(double lb, double ub, double cost, bool is_integer) {
    col_lb.push_back(lb);
    col_ub.push_back(ub);
    obj.push_back(cost);
    integer.push_back(is_integer ? 1 : 0);
    return num_cols() - 1;
  }
  // Terms with column -1 are constants 0 and dropped.
  void AddRow(double lb, double ub, const std::vector<std::pair<int, double>>& terms) {
    const int r = num_rows();
    for (const auto& [c, v] : terms) {
      if (c < 0 || v == 0) continue;
      rows.push_back(r);
      cols.push_back(c);
      values.push_back(v);
    }
    row_lb.push_back(lb);
    row_ub.push_back(ub);
  }
  void Load(OsiSolverInterface& solver, bool with_integers) const {
    CoinPackedMatrix matrix(/*colordered=*/true, rows.data(), cols.data(),
                            values.data(), static_cast<CoinBigIndex>(values.size()));
    matrix.setDimensions(num_rows(), num_cols());
    solver.loadProblem(matrix, col_lb.data(), col_ub.data(), obj.data(),
                       row_lb.data(), row_ub.data());
    if (with_integers) {
      for (int c = 0; c < num_cols(); ++c) {
        if (integer[c]) solver.setInteger(c);
      }
    }
  }
};

constexpr double kInf = std::numeric_limits<double>::infinity();

// Note [Checkmate's model] as columns and rows. `budget_bytes` < 0 asks for
// the peak as a variable (the objective then is the peak alone).
struct Formulation {
  LinearProgram lp;
  int n = 0;
  std::vector<int> r;  // R(t, i) at t (t + 1) / 2 + i
  std::vector<int> s;  // S(t, i) at t (t - 1) / 2 + i, t >= 1
  int peak = -1;
  double byte_scale = 1;  // model bytes = bytes / byte_scale
  double cost_scale = 1;  // model cost = cost / cost_scale
  double epsilon = 0;     // objective of a zero-cost node's R
  bool has_zero_cost = false;

  int R(int t, int i) const { return r[t * (t + 1) / 2 + i]; }
  int S(int t, int i) const { return i < t ? s[t * (t - 1) / 2 + i] : -1; }
};

Formulation Formulate(const StageGraph& g, int64_t budget_bytes) {
  Formulation f;
  const int n = g.n();
  f.n = n;
  LinearProgram& lp = f.lp;

  int64_t max_bytes = 1;
  for (int i = 0; i < n; ++i) {
    max_bytes = std::max({max_bytes, g.bytes[i], g.workspace[i]});
  }
  f.byte_scale = std::max(1.0, static_cast<double>(max_bytes) / 1e4);
  double min_positive = kInf, max_cost = 0;
  int zero_cost_nodes = 0;
  for (int i = 0; i < n; ++i) {
    if (g.cost[i] > 0) min_positive = std::min(min_positive, g.cost[i]);
    max_cost = std::max(max_cost, g.cost[i]);
    if (g.cost[i] == 0) ++zero_cost_nodes;
  }
  f.cost_scale = std::isfinite(min_positive)
                     ? std::max(min_positive, max_cost / 1e6)
                     : 1.0;
  f.has_zero_cost = zero_cost_nodes > 0;
  // Each zero-cost node has at most n R variables.
  f.epsilon = 1e-3 / (static_cast<double>(zero_cost_nodes) * n + 1);
  const bool min_peak = budget_bytes < 0;
  auto m = [&](int i) { return static_cast<double>(g.bytes[i]) / f.byte_scale; };
  auto w = [&](int i) { return static_cast<double>(g.workspace[i]) / f.byte_scale; };
  auto obj = [&](int i) {
    if (min_peak) return 0.0;
    return g.cost[i] > 0 ? g.cost[i] / f.cost_scale : f.epsilon;
  };

  f.r.assign(n * (n + 1) / 2, -1);
  f.s.assign(n * (n - 1) / 2 + 1, -1);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i <= t; ++i) {
      const double lb = i == t ? 1.0 : 0.0;  // [1d] R[t][t] = 1
      f.r[t * (t + 1) / 2 + i] = lp.AddCol(lb, 1.0, obj(i), true);
    }
    for (int i = 0; i < t; ++i) {
      f.s[t * (t - 1) / 2 + i] = lp.AddCol(0.0, 1.0, 0.0, true);
    }
  }
  const double available =
      min_peak ? kInf
               : static_cast<double>(budget_bytes - g.persistent_bytes) / f.byte_scale;
  if (min_peak) f.peak = lp.AddCol(0.0, kInf, 1.0, false);

  for (int t = 0; t < n; ++t) {
    // [1b] dependencies.
    for (int j = 0; j <= t; ++j) {
      for (int i : g.inputs[j]) {
        lp.AddRow(-kInf, 0.0, {{f.R(t, j), 1.0}, {f.R(t, i), -1.0}, {f.S(t, i), -1.0}});
      }
    }
    // [1c] checkpoints come from the previous stage.
    if (t + 1 < n) {
      for (int i = 0; i < t; ++i) {
        lp.AddRow(-kInf, 0.0,
                  {{f.S(t + 1, i), 1.0}, {f.R(t, i), -1.0}, {f.S(t, i), -1.0}});
      }
    }
  }
  // Outputs resident at the end.
  for (int o = 0; o + 1 < n; ++o) {
    if (g.output[o]) lp.AddRow(1.0, kInf, {{f.R(n - 1, o), 1.0}, {f.S(n - 1, o), 1.0}});
  }
  // Dominance rows (Note [dominance rows]): a recomputation or a checkpoint
  // is used, and nothing resident is recomputed.
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < t; ++i) {
      const bool kept_at_end = t == n - 1 && g.output[i];
      if (!kept_at_end) {
        std::vector<std::pair<int, double>> terms = {{f.R(t, i), 1.0}};
        for (int j : g.readers[i]) {
          if (j <= t) terms.push_back({f.R(t, j), -1.0});
        }
        if (t + 1 < n) terms.push_back({f.S(t + 1, i), -1.0});
        lp.AddRow(-kInf, 0.0, terms);
        terms = {{f.S(t, i), 1.0}};
        for (int j : g.readers[i]) {
          if (j <= t) terms.push_back({f.R(t, j), -1.0});
        }
        if (t + 1 < n) terms.push_back({f.S(t + 1, i), -1.0});
        lp.AddRow(-kInf, 0.0, terms);
      }
      lp.AddRow(-kInf, 1.0, {{f.R(t, i), 1.0}, {f.S(t, i), 1.0}});
    }
  }

  // FREE and the memory recurrence, stage by stage.
  std::vector<std::vector<std::pair<int, double>>> frees_after(n);
  std::vector<std::vector<int>> frees_of(n);
  for (int t = 0; t < n; ++t) {
    for (int k = 0; k <= t; ++k) frees_after[k].clear();
    for (int i = 0; i <= t; ++i) frees_of[i].clear();
    for (int k = 0; k <= t; ++k) {
      auto add_free = [&](int i) {
        if (t == n - 1 && g.output[i]) return;  // never freed at the end
        const int c = lp.AddCol(0.0, 1.0, 0.0, false);
        lp.AddRow(-kInf, 0.0, {{c, 1.0}, {f.R(t, k), -1.0}});
        if (t + 1 < n) lp.AddRow(-kInf, 1.0, {{c, 1.0}, {f.S(t + 1, i), 1.0}});
        for (int j : g.readers[i]) {
          if (j > k && j <= t) lp.AddRow(-kInf, 1.0, {{c, 1.0}, {f.R(t, j), 1.0}});
        }
        frees_after[k].push_back({c, m(i)});
        frees_of[i].push_back(c);
      };
      for (int i : g.inputs[k]) add_free(i);
      add_free(k);
    }
    // At most one free of v_i a stage, and only of what is resident.
    for (int i = 0; i <= t; ++i) {
      if (frees_of[i].empty()) continue;
      std::vector<std::pair<int, double>> terms;
      for (int c : frees_of[i]) terms.push_back({c, 1.0});
      if (t + 1 < n) terms.push_back({f.S(t + 1, i), 1.0});
      terms.push_back({f.R(t, i), -1.0});
      terms.push_back({f.S(t, i), -1.0});
      lp.AddRow(-kInf, 0.0, terms);
    }
    int previous_u = -1;
    for (int k = 0; k <= t; ++k) {
      const int u = lp.AddCol(0.0, kInf, 0.0, false);
      std::vector<std::pair<int, double>> terms = {{u, 1.0}, {f.R(t, k), -m(k)}};
      if (k == 0) {
        for (int i = 0; i < t; ++i) terms.push_back({f.S(t, i), -m(i)});
      } else {
        terms.push_back({previous_u, -1.0});
        for (const auto& [c, bytes] : frees_after[k - 1]) terms.push_back({c, bytes});
      }
      lp.AddRow(0.0, 0.0, terms);
      if (min_peak) {
        lp.AddRow(-kInf, 0.0, {{u, 1.0}, {f.R(t, k), w(k)}, {f.peak, -1.0}});
      } else {
        lp.AddRow(-kInf, available, {{u, 1.0}, {f.R(t, k), w(k)}});
      }
      previous_u = u;
    }
  }
  return f;
}

// S of a solution, rounded by `threshold`, in StagePlan's keep shape.
std::vector<std::vector<uint8_t>> KeepFrom(const Formulation& f,
                                           const double* x, double threshold) {
  const int n = f.n;
  std::vector<std::vector<uint8_t>> keep(n + 1);
  for (int t = 0; t <= n; ++t) {
    keep[t].assign(t, 0);
    if (t == n) continue;  // ComputeForKeep sets the outputs
    for (int i = 0; i < t; ++i) keep[t][i] = x[f.S(t, i)] >= threshold ? 1 : 0;
  }
  return keep;
}

double PlanCost(const StageGraph& g, const StagePlan& plan) {
  double total = 0;
  for (int t = 0; t < g.n(); ++t) {
    for (int i = 0; i <= t; ++i) {
      if (plan.compute[t][i]) total += g.cost[i];
    }
  }
  return total;
}

// A rounded or solved plan, measured: its schedule's simulated peak and cost.
struct Candidate {
  StagePlan plan;
  int64_t peak = 0;
  double cost = 0;
  std::string how;
};

absl::StatusOr<Candidate> Measure(const Graph& graph, StagePlan plan,
                                  std::string how) {
  ASSIGN_OR_RETURN(Schedule schedule, StagePlanToSchedule(graph, plan));
  ASSIGN_OR_RETURN(PlanReport report,
                   Simulate(graph, RemoveDeadComputes(graph, schedule)));
  Candidate c;
  c.plan = std::move(plan);
  c.peak = report.peak_bytes;
  c.cost = report.compute_cost;
  c.how = std::move(how);
  return c;
}

// Lower cost first, then lower peak; `a` wins ties (it was found first).
// The tolerance is relative: costs are in whatever unit the graph uses
// (1e-13 s a node, or 1e13 FLOPs), and an absolute one would call plans of
// 11 and 38 recomputations equal at one scale and not at the other.
bool Better(const Candidate& a, const Candidate& b) {
  const double tol = 1e-9 * std::abs(b.cost);
  if (a.cost < b.cost - tol) return true;
  if (a.cost > b.cost + tol) return false;
  return a.peak < b.peak;
}

// ---------------------------------------------------------------------------
// CBC and Clp.

struct MilpRun {
  bool has_solution = false;
  bool optimal = false;
  bool infeasible = false;  // proven
  std::vector<double> x;
  double objective = 0;
  double bound = 0;  // best possible objective (model units)
};

// Stops Clp's simplex at the first iteration past the deadline. Clp's own
// limit (setMaximumSeconds) counts CPU seconds and is checked less often: on
// a loaded machine an LP ran 13 s against a 10 s limit.
class StopAtDeadline final : public ClpEventHandler {
 public:
  explicit StopAtDeadline(const Deadline& deadline) : deadline_(&deadline) {}
  ClpEventHandler* clone() const override { return new StopAtDeadline(*this); }
  int event(Event what) override {
    // Non-negative: Clp stops the solve (status "stopped on time").
    if (what == endOfIteration && deadline_->Expired()) return 0;
    return -1;
  }

 private:
  const Deadline* deadline_;
};

// CBC's command reader (CbcMain1's argv, through CoinReadNextField) keeps
// its place in process-wide statics: two solves at once, on two threads of
// one process, read each other's arguments, lost -seconds and -quit, and
// fell back to reading commands from stdin (a hang where stdin was an open
// pipe). So RunCbc's callers take turns on this lock, and read the time
// they have left once their turn has come.
std::mutex& CbcTurn() {
  static std::mutex turn;
  return turn;
}

// Call with CbcTurn() held.
MilpRun RunCbc(const Formulation& f, double seconds,
               const std::vector<double>* start) {
  const LinearProgram& lp = f.lp;
  OsiClpSolverInterface solver;
  solver.messageHandler()->setLogLevel(0);
  solver.getModelPtr()->setLogLevel(0);
  lp.Load(solver, /*with_integers=*/true);
  // CBC's root LP goes through the solver's initial solve: dual simplex
  // after presolve (see RunClp), bounded by the time limit.
  ClpSolve solve_options;
  solve_options.setSolveType(ClpSolve::useDual);
  solve_options.setPresolveType(ClpSolve::presolveOn);
  solver.setSolveOptions(solve_options);
  solver.getModelPtr()->setMaximumSeconds(std::max(0.01, seconds));
  solver.getModelPtr()->setMaximumWallSeconds(std::max(0.01, seconds));
  // The root LP is CBC's longest uninterrupted step (resnet18:batch=8,
  // image=64: 3.4 s of simplex, past a 3.75 s limit): stopped at CBC's own
  // limit, when CBC stops anyway. The handler is cloned with the solver.
  const Deadline cbc_deadline(std::max(0.01, seconds));
  StopAtDeadline stop(cbc_deadline);
  solver.getModelPtr()->passInEventHandler(&stop);
  std::vector<std::pair<std::string, double>> mip_start;
  if (start != nullptr) {
    // CBC matches a MIP start by column names; only integer columns are
    // given, CBC solves the LP for the rest.
    for (int c = 0; c < lp.num_cols(); ++c) {
      const std::string name = absl::StrCat("c", c);
      solver.setColName(c, name);
      if (lp.integer[c]) mip_start.push_back({name, (*start)[c]});
    }
    // With column names but no row names, CBC 2.10's postprocessing
    // dereferences the missing row names (coin-or/Cbc issue #515).
    for (int r = 0; r < lp.num_rows(); ++r) solver.setRowName(r, absl::StrCat("r", r));
  }
  CbcModel model(solver);
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  CbcSolverUsefulData data;
  data.noPrinting_ = true;
  data.useSignalHandler_ = false;
  CbcMain0(model, data);
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  if (!mip_start.empty()) model.setMIPStart(mip_start);
  const std::string secs = absl::StrCat(std::max(0.01, seconds));
  // A zero-cost node's epsilon is far below CBC's default cutoff increment
  // (1e-5): let CBC tell such objectives apart.
  const std::string increment = absl::StrCat(f.has_zero_cost ? f.epsilon / 4 : 1e-5);
  // No CglPreProcess: CBC 2.10's postprocessing can crash (a segfault in
  // CglPreProcess::postProcess, Debian's 2.10.8) when the time limit stops
  // the search early, as it does on a loaded machine.
  std::vector<const char*> argv = {"pebble",     "-log",      "0",
                                   "-slog",      "0",         "-seconds",
                                   secs.c_str(), "-timeMode", "elapsed",
                                   "-ratioGap",  "0",         "-allowableGap",
                                   "1e-9",       "-increment", increment.c_str(),
                                   "-preprocess", "off",      "-solve",
                                   "-quit"};
  const Clock::time_point started = Clock::now();
  CbcMain1(static_cast<int>(argv.size()), argv.data(), model, nullptr, data);
  const double elapsed = SecondsSince(started);

  MilpRun run;
  const double* best = model.bestSolution();
  if (best != nullptr) {
    run.has_solution = true;
    run.x.assign(best, best + lp.num_cols());
    run.objective = model.getObjValue();
  }
  run.optimal = run.has_solution && model.isProvenOptimal();
  run.bound = model.getBestPossibleObjValue();
  if (run.optimal) run.bound = run.objective;
  // Infeasible only when CBC finished well inside its time: a root LP cut
  // short by the time limit must not read as a proof.
  run.infeasible = !run.has_solution && !model.isSecondsLimitReached() &&
                   elapsed < 0.9 * seconds &&
                   (model.isProvenInfeasible() || model.status() == 0);
  return run;
}

struct LpRun {
  bool optimal = false;
  bool infeasible = false;
  std::vector<double> x;
  double objective = 0;
};

// Clp's load and presolve run to their end, whatever the deadline: on
// resnet50:batch=32 (878k columns, 2.6M rows, 7.2M nonzeros) they took 7 s
// of a loaded 2-core machine, on resnet18:batch=8,image=64 (1.1M nonzeros)
// about 0.9 s: some 10^6 nonzeros a second. Estimated before each LP from
// its nonzeros, so that an LP whose set-up alone would overrun the time
// left is not started; the rate assumed is 60% of that measured.
constexpr double kLpSetupNonzerosPerS = 6e5;

// The estimated set-up time of `lp` for a solver that sets up
// `nonzeros_per_s` (kLpSetupNonzerosPerS, kMilpSetupNonzerosPerS).
double SetupSeconds(const LinearProgram& lp, double nonzeros_per_s) {
  return static_cast<double>(lp.values.size()) / nonzeros_per_s;
}

LpRun RunClp(const Formulation& f, const Deadline& deadline) {
  OsiClpSolverInterface solver;
  solver.messageHandler()->setLogLevel(0);
  solver.getModelPtr()->setLogLevel(0);
  solver.setHintParam(OsiDoReducePrint, true, OsiHintTry);
  f.lp.Load(solver, /*with_integers=*/false);
  const double seconds = std::max(0.01, deadline.remaining_s());
  solver.getModelPtr()->setMaximumSeconds(seconds);
  solver.getModelPtr()->setMaximumWallSeconds(seconds);
  StopAtDeadline stop(deadline);
  solver.getModelPtr()->passInEventHandler(&stop);
  // Dual simplex after presolve: on these LPs several times faster than
  // OsiClpSolverInterface's default initial solve (linear:n=40, 17k
  // columns: 1.3 s against 4.6 s); the barrier ignores the time limit.
  ClpSolve solve_options;
  solve_options.setSolveType(ClpSolve::useDual);
  solve_options.setPresolveType(ClpSolve::presolveOn);
  solver.setSolveOptions(solve_options);
  solver.initialSolve();
  LpRun run;
  run.optimal = solver.isProvenOptimal();
  run.infeasible = solver.isProvenPrimalInfeasible();
  if (run.optimal) {
    const double* x = solver.getColSolution();
    run.x.assign(x, x + f.lp.num_cols());
    run.objective = solver.getObjValue();
  }
  return run;
}

// Column values of `plan` for a MIP start (R and S; the rest is left 0,
// CBC recomputes the continuous columns).
std::vector<double> StartValues(const Formulation& f, const StagePlan& plan) {
  std::vector<double> x(f.lp.num_cols(), 0.0);
  for (int t = 0; t < f.n; ++t) {
    for (int i = 0; i <= t; ++i) x[f.R(t, i)] = plan.compute[t][i];
    for (int i = 0; i < t; ++i) x[f.S(t, i)] = plan.keep[t][i];
  }
  return x;
}

// The cost in graph units of a model objective (epsilons included; they add
// at most 1e-3 of the smallest positive cost).
double ToCost(const Formulation& f, double model_objective) {
  return model_objective * f.cost_scale;
}

// One MILP solve at a budget (>= 0) or for the minimum peak (< 0), with the
// model's budget tightened and re-solved when CBC's tolerances let the
// simulated peak exceed the budget.
struct MilpAttempt {
  CheckmateResult::Status status = CheckmateResult::Status::kNoSolution;
  std::optional<Candidate> best;
  double lower_bound = 0;
  int variables = 0, integers = 0, constraints = 0;
  // > 0: the estimated set-up time of a MILP not started, too large for the
  // time left.
  double skipped_setup_s = 0;
};

// CBC's set-up (the model's load, its copy into CbcModel, Clp's presolve
// and the root LP's start) runs to its end, whatever the time limit: on
// resnet50:batch=32 at 600 stages (7.2M nonzeros) 20 s, on
// resnet18:batch=8,image=64 (1.1M) 1.6 to 2.3 s, some 3.5e5 to 5e5 nonzeros
// a second on an idle 2-core machine (2026-12-05), where a 3 s limit ran 22
// s. A MILP whose set-up alone would overrun the time left is not started;
// the rate assumed is 60% of the slower figure.
constexpr double kMilpSetupNonzerosPerS = 2e5;

absl::StatusOr<MilpAttempt> SolveMilpAt(const Graph& graph, const StageGraph& g,
                                        int64_t budget_bytes,
                                        const std::optional<Candidate>& start,
                                        const Deadline& deadline) {
  MilpAttempt attempt;
  int64_t model_budget = budget_bytes;
  for (int tries = 0; tries < 4; ++tries) {
    Formulation f = Formulate(g, model_budget);
    attempt.variables = f.lp.num_cols();
    attempt.integers = f.lp.num_integer();
    attempt.constraints = f.lp.num_rows();
    std::unique_lock<std::mutex> turn(CbcTurn());  // (the wait counts against the limit)
    if (deadline.Expired()) break;
    const double left = deadline.remaining_s();
    // CBC checks its clock between nodes and heuristics and its clean-up
    // takes time (0.1 s on resnet18:batch=8,image=64); the conversion,
    // simulation and layout after it another 0.2 s there.
    const double cbc_s = 0.95 * left - 0.25;
    if (const double setup_s = SetupSeconds(f.lp, kMilpSetupNonzerosPerS); setup_s > cbc_s) {
      deadline.MarkHit();
      attempt.skipped_setup_s = setup_s;
      break;
    }
    std::vector<double> start_x;
    if (start.has_value() &&
        (budget_bytes < 0 || start->peak <= budget_bytes)) {
      start_x = StartValues(f, start->plan);
    }
    MilpRun run = RunCbc(f, cbc_s, start_x.empty() ? nullptr : &start_x);
    turn.unlock();
    if (budget_bytes < 0) {
      attempt.lower_bound = run.bound * f.byte_scale + g.persistent_bytes;
    } else {
      attempt.lower_bound = ToCost(f, run.bound);
    }
    if (!run.has_solution) {
      attempt.status = run.infeasible ? CheckmateResult::Status::kInfeasible
                                      : CheckmateResult::Status::kNoSolution;
      // A start within the budget is still the best known plan.
      if (!start_x.empty()) {
        attempt.best = start;
        attempt.status = CheckmateResult::Status::kFeasible;
      }
      return attempt;
    }
    StagePlan plan = ComputeForKeep(graph, g.order, KeepFrom(f, run.x.data(), 0.5));
    ASSIGN_OR_RETURN(Candidate c, Measure(graph, std::move(plan), "milp"));
    if (budget_bytes >= 0 && c.peak > budget_bytes) {
      // Tolerance leak: tighten the model's budget by the excess and retry.
      model_budget -= (c.peak - budget_bytes);
      continue;
    }
    if (start.has_value() && !start_x.empty()) {
      const bool start_better =
          budget_bytes >= 0 ? Better(*start, c)
                            : (start->peak < c.peak ||
                               (start->peak == c.peak && Better(*start, c)));
      if (start_better) c = *start;
    }
    attempt.best = std::move(c);
    attempt.status = run.optimal ? CheckmateResult::Status::kOptimal
                                 : CheckmateResult::Status::kFeasible;
    return attempt;
  }
  if (start.has_value() && (budget_bytes < 0 || start->peak <= budget_bytes)) {
    attempt.best = start;
    attempt.status = CheckmateResult::Status::kFeasible;
  }
  return attempt;
}

void FillResult(const StageGraph& g, const Candidate& c, CheckmateResult* r) {
  r->plan = c.plan;
  r->objective = PlanCost(g, c.plan);
  r->note = c.how;
}

double Gap(double objective, double bound) {
  if (objective <= 0) return 0;
  return std::max(0.0, (objective - bound) / objective);
}

}  // namespace

// What both Checkmate policies settle before any solve. Every needed node
// is computed at least once, so a one-shot plan that fits costs the least
// any plan can: `answer` holds it, labelled `fits_status` (the MILP reports
// it optimal; the LP policy never claims optimality). A budget below the
// peak lower bound fits nothing: `answer` says so. Otherwise `answer` is
// empty and the caller solves, starting from `lower` and `one_shot`.
struct Prelude {
  int64_t lower = 0;
  Candidate one_shot;
  std::optional<CheckmateResult> answer;
};

absl::StatusOr<Prelude> SettleWithoutSolving(const Graph& graph, const StageGraph& g,
                                             const CheckmateOptions& options,
                                             Clock::time_point started,
                                             CheckmateResult::Status fits_status) {
  Prelude prelude;
  prelude.lower = PeakLowerBound(graph);
  ASSIGN_OR_RETURN(prelude.one_shot,
                   Measure(graph, OneShotStagePlan(graph), "one-shot"));
  if (options.budget_bytes == kMinBudgetBytes) return prelude;
  CheckmateResult result;
  result.budget_bytes = options.budget_bytes;
  if (prelude.one_shot.peak <= options.budget_bytes) {
    FillResult(g, prelude.one_shot, &result);
    result.status = fits_status;
    result.lower_bound = result.objective;
    result.note = "the one-shot plan fits: no recomputation needed";
  } else if (options.budget_bytes < prelude.lower) {
    result.status = CheckmateResult::Status::kInfeasible;
    result.note = absl::StrCat("the budget is below the lower bound of ", prelude.lower,
                               " bytes (a node with its inputs, or the outputs)");
  } else {
    return prelude;
  }
  result.solve_s = SecondsSince(started);
  prelude.answer = std::move(result);
  return prelude;
}

absl::StatusOr<CheckmateResult> SolveCheckmateMilp(const Graph& graph,
                                                   const CheckmateOptions& options) {
  const Clock::time_point started = Clock::now();
  const Deadline deadline(options.time_limit_s);
  const StageGraph g = MakeStageGraph(graph, DefaultOrder(graph));
  const int cap = options.max_stages > 0 ? options.max_stages : kMaxMilpStages;
  if (g.n() > cap) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkmate: the graph has ", g.n(), " needed non-persistent nodes; the MILP takes at most ",
        cap, " (--milp-max-stages, or milp_max_stages in Python, raises the cap; or use checkmate-lp, "
        "or a heuristic policy)"));
  }
  CheckmateResult result;
  const bool min_budget = options.budget_bytes == kMinBudgetBytes;
  ASSIGN_OR_RETURN(Prelude prelude,
                   SettleWithoutSolving(graph, g, options, started,
                                        CheckmateResult::Status::kOptimal));
  if (prelude.answer.has_value()) return *std::move(prelude.answer);
  const Candidate one_shot = std::move(prelude.one_shot);

  // Other policies' plans in the model's form (CheckmateOptions::warm_starts).
  std::vector<Candidate> warm;
  for (const CheckmateOptions::WarmStart& w : options.warm_starts) {
    ASSIGN_OR_RETURN(Candidate c, Measure(graph, StagePlanFromSchedule(graph, w.schedule),
                                          absl::StrCat("start from ", w.name)));
    warm.push_back(std::move(c));
  }
  // The lowest peak (ties: the least cost) of the one-shot plan and `warm`.
  auto lowest_peak = [&] {
    Candidate best = one_shot;
    for (const Candidate& c : warm) {
      if (c.peak < best.peak || (c.peak == best.peak && c.cost < best.cost)) best = c;
    }
    return best;
  };
  // The cheapest of `start` and `warm` within `limit`.
  auto cheapest_within = [&](std::optional<Candidate> start, int64_t limit) {
    for (const Candidate& c : warm) {
      if (c.peak <= limit && (!start.has_value() || Better(c, *start))) start = c;
    }
    return start;
  };

  int64_t budget = options.budget_bytes;
  bool proven = true;
  std::optional<Candidate> start;
  bool peak_phase_cut = false;  // not MarkHit: the cost phase still runs
  double skipped_setup_s = 0;    // of a MILP not started (MilpAttempt)
  if (min_budget) {
    // The LP's rounding at `min` (a tenth of the time at most) as one more
    // start: CBC's search for the lowest peak may not improve on the starts
    // within its time, and the heuristics' plans (warm) may follow another
    // order than the model's (a 5-layer MLP with Adam's updates: 47,860
    // bytes, the one-shot plan's, where the rounding starts at 30,544).
    CheckmateOptions lp_options = options;
    lp_options.time_limit_s = 0.1 * deadline.remaining_s();
    ASSIGN_OR_RETURN(CheckmateResult lp, SolveCheckmateLp(graph, lp_options));
    if (lp.status == CheckmateResult::Status::kFeasible) {
      ASSIGN_OR_RETURN(Candidate c, Measure(graph, lp.plan, "lp-rounding"));
      warm.push_back(std::move(c));
    }
    // Phase 1: the lowest peak in the model (half the time at most), from
    // the lowest-peak plan known as a start.
    const Deadline half(deadline.remaining_s() / 2);
    ASSIGN_OR_RETURN(MilpAttempt peak_phase,
                     SolveMilpAt(graph, g, -1, lowest_peak(), half));
    peak_phase_cut = half.hit();
    skipped_setup_s = peak_phase.skipped_setup_s;
    if (!peak_phase.best.has_value()) {
      peak_phase.best = one_shot;
      proven = false;
    }
    proven = proven && peak_phase.status == CheckmateResult::Status::kOptimal;
    budget = peak_phase.best->peak;
    start = cheapest_within(peak_phase.best, budget);
    result.note = absl::StrCat("min-peak phase: peak ", budget, " bytes (",
                               proven ? "optimal" : "not proven optimal", ")");
  } else {
    // A start within the budget from the LP rounding, with a fifth of the
    // time at most: CBC's own heuristics often find nothing on larger
    // graphs before the time limit.
    CheckmateOptions lp_options = options;
    lp_options.time_limit_s = 0.2 * deadline.remaining_s();
    ASSIGN_OR_RETURN(CheckmateResult lp, SolveCheckmateLp(graph, lp_options));
    if (lp.status == CheckmateResult::Status::kInfeasible) {
      // The relaxation is infeasible, so is the MILP.
      result.status = CheckmateResult::Status::kInfeasible;
      result.budget_bytes = budget;
      result.note = "the LP relaxation is infeasible";
      result.solve_s = SecondsSince(started);
      return result;
    }
    if (lp.status == CheckmateResult::Status::kFeasible) {
      ASSIGN_OR_RETURN(Candidate c, Measure(graph, lp.plan, "lp-rounding"));
      start = std::move(c);
    }
    start = cheapest_within(std::move(start), budget);
  }
  ASSIGN_OR_RETURN(MilpAttempt attempt, SolveMilpAt(graph, g, budget, start, deadline));
  // CBC runs to a proof (ratio gap 0) unless its time runs out.
  result.time_limit_reached = deadline.hit() || peak_phase_cut ||
                              attempt.status == CheckmateResult::Status::kFeasible ||
                              attempt.status == CheckmateResult::Status::kNoSolution;
  result.num_variables = attempt.variables;
  result.num_integer_variables = attempt.integers;
  result.num_constraints = attempt.constraints;
  result.budget_bytes = budget;
  result.status = attempt.status;
  if (attempt.best.has_value()) {
    const std::string phases = result.note;
    FillResult(g, *attempt.best, &result);
    if (!phases.empty()) result.note = absl::StrCat(phases, "; then ", result.note);
    if (!proven && result.status == CheckmateResult::Status::kOptimal) {
      result.status = CheckmateResult::Status::kFeasible;
    }
    result.lower_bound = std::min(attempt.lower_bound, result.objective);
    if (result.status == CheckmateResult::Status::kOptimal) {
      result.lower_bound = result.objective;
    }
    result.gap = Gap(result.objective, result.lower_bound);
  } else if (min_budget && start.has_value()) {
    FillResult(g, *start, &result);
    result.status = CheckmateResult::Status::kFeasible;
    result.lower_bound = 0;
    result.gap = Gap(result.objective, 0);
  }
  skipped_setup_s = std::max(skipped_setup_s, attempt.skipped_setup_s);
  if (skipped_setup_s > 0) {
    absl::StrAppend(&result.note, result.note.empty() ? "" : "; ", "CBC was not started on a ",
                    "MILP of ", attempt.variables, " columns and ", attempt.constraints,
                    " rows: its set-up alone (an estimated ", absl::SixDigits(skipped_setup_s),
                    " s) would overrun the time left");
  }
  result.solve_s = SecondsSince(started);
  return result;
}

namespace {

// Roundings of one LP solution: thresholds (0.5 first), seeded Bernoulli
// samples, and keeping every checkpoint the LP uses at all. The cheapest
// whose simulated peak fits `budget` (>= 0), or the lowest peak (< 0). The
// roundings of a batch (the thresholds, then the samples) are simulated
// concurrently (oneTBB) and judged in order: the serial choice, the
// deadline checked between the batches.
absl::StatusOr<std::optional<Candidate>> RoundLp(const Graph& graph,
                                                 const StageGraph& g,
                                                 const Formulation& f,
                                                 const LpRun& lp, int64_t budget,
                                                 uint64_t seed,
                                                 const Deadline& deadline) {
  using Keep = std::vector<std::vector<uint8_t>>;
  std::optional<Candidate> best;
  auto consider_all = [&](std::vector<std::pair<Keep, std::string>> batch) -> absl::Status {
    std::vector<absl::StatusOr<Candidate>> measured(batch.size(),
                                                    absl::UnknownError("not measured"));
    oneapi::tbb::parallel_for(size_t{0}, batch.size(), [&](size_t k) {
      StagePlan plan = ComputeForKeep(graph, g.order, std::move(batch[k].first));
      measured[k] = Measure(graph, std::move(plan), std::move(batch[k].second));
    });
    for (absl::StatusOr<Candidate>& m : measured) {
      RETURN_IF_ERROR(m.status());
      Candidate& c = *m;
      if (budget >= 0 && c.peak > budget) continue;
      const bool better = !best.has_value() ||
                          (budget >= 0 ? Better(c, *best)
                                       : (c.peak < best->peak ||
                                          (c.peak == best->peak && c.cost < best->cost)));
      if (better) best = std::move(c);
    }
    return absl::OkStatus();
  };
  std::vector<std::pair<Keep, std::string>> thresholds;
  for (double threshold : {0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.1, 0.9, 1e-6}) {
    thresholds.emplace_back(KeepFrom(f, lp.x.data(), threshold),
                            absl::StrCat("lp-rounding threshold ", threshold));
  }
  RETURN_IF_ERROR(consider_all(std::move(thresholds)));
  if (deadline.Expired()) return best;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::pair<Keep, std::string>> samples;
  for (int sample = 0; sample < 8; ++sample) {
    Keep keep(f.n + 1);
    for (int t = 0; t <= f.n; ++t) {
      keep[t].assign(t, 0);
      if (t == f.n) continue;
      for (int i = 0; i < t; ++i) {
        keep[t][i] = uniform(rng) < lp.x[f.S(t, i)] ? 1 : 0;
      }
    }
    samples.emplace_back(std::move(keep), absl::StrCat("lp-rounding random sample ", sample));
  }
  RETURN_IF_ERROR(consider_all(std::move(samples)));
  return best;
}

}  // namespace

absl::StatusOr<CheckmateResult> SolveCheckmateLp(const Graph& graph,
                                                 const CheckmateOptions& options) {
  const Clock::time_point started = Clock::now();
  const Deadline deadline(options.time_limit_s);
  const StageGraph g = MakeStageGraph(graph, DefaultOrder(graph));
  const int cap = options.max_stages > 0 ? options.max_stages : kMaxLpStages;
  if (g.n() > cap) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkmate-lp: the graph has ", g.n(), " needed non-persistent nodes; the LP takes at most ",
        cap, " (--milp-max-stages, or milp_max_stages in Python, raises the cap; or use a heuristic "
        "policy)"));
  }
  CheckmateResult result;
  const bool min_budget = options.budget_bytes == kMinBudgetBytes;
  ASSIGN_OR_RETURN(Prelude prelude,
                   SettleWithoutSolving(graph, g, options, started,
                                        CheckmateResult::Status::kFeasible));
  if (prelude.answer.has_value()) return *std::move(prelude.answer);
  const int64_t lower = prelude.lower;
  const Candidate one_shot = std::move(prelude.one_shot);

  int lp_solves = 0;
  // > 0: the estimated set-up time of an LP not started, too large for the
  // time left.
  double skipped_setup_s = 0;
  bool lp_cut = false;         // an LP stopped by the time limit
  // Solves the LP at `lp_budget` and rounds it against `target`.
  auto attempt = [&](int64_t lp_budget, int64_t target, bool* lp_infeasible,
                     double* lp_objective) -> absl::StatusOr<std::optional<Candidate>> {
    Formulation f = Formulate(g, lp_budget);
    result.num_variables = f.lp.num_cols();
    result.num_constraints = f.lp.num_rows();
    if (const double setup_s = SetupSeconds(f.lp, kLpSetupNonzerosPerS);
        setup_s > deadline.remaining_s()) {
      deadline.MarkHit();
      skipped_setup_s = setup_s;
      return std::optional<Candidate>();
    }
    LpRun lp = RunClp(f, deadline);
    ++lp_solves;
    *lp_infeasible = lp.infeasible;
    if (!lp.optimal) {
      lp_cut = lp_cut || (!lp.infeasible && deadline.Expired());
      return std::optional<Candidate>();
    }
    *lp_objective = ToCost(f, lp.objective);
    return RoundLp(graph, g, f, lp, target, options.seed + lp_solves, deadline);
  };

  std::optional<Candidate> best;
  if (!min_budget) {
    const int64_t budget = options.budget_bytes;
    result.budget_bytes = budget;
    bool infeasible = false;
    double objective = 0;
    ASSIGN_OR_RETURN(best, attempt(budget, budget, &infeasible, &objective));
    if (infeasible) {
      result.status = CheckmateResult::Status::kInfeasible;
      result.note = "the LP relaxation is infeasible";
      result.solve_s = SecondsSince(started);
      return result;
    }
    result.lower_bound = objective;
    // No rounding fits: ask the LP for less memory (the paper's remedy for
    // roundings that overshoot), down to the lower bound.
    for (double f : {0.9, 0.75, 0.5, 0.25, 0.0}) {
      if (best.has_value() || deadline.Expired()) break;
      const int64_t lp_budget =
          lower + static_cast<int64_t>(f * static_cast<double>(budget - lower));
      bool ignored = false;
      double ignored_objective = 0;
      ASSIGN_OR_RETURN(best, attempt(lp_budget, budget, &ignored, &ignored_objective));
      if (best.has_value()) {
        best->how = absl::StrCat(best->how, " (LP budget ", lp_budget, " bytes)");
      }
    }
  } else {
    // Binary search over the budget: [lo, hi], hi always reached by `best`.
    // It stops once hi is within 0.5% of lo: SPEC's `min` judges the plans
    // within 0.5% of the lowest peak by makespan, not by peak, so the
    // remaining LP solves (seconds each on a few hundred stages: 240 s for
    // the last 0.5% on resnet18:batch=2,image=32) could not change the
    // answer's standing.
    best = one_shot;
    int64_t lo = lower, hi = one_shot.peak;
    auto settled = [&] {
      return static_cast<double>(hi) <= kMinPeakSlack * static_cast<double>(lo);
    };
    while (lo < hi && !settled() && !deadline.Expired()) {
      const int64_t mid = lo + (hi - lo) / 2;
      bool ignored = false;
      double ignored_objective = 0;
      ASSIGN_OR_RETURN(std::optional<Candidate> c,
                       attempt(mid, mid, &ignored, &ignored_objective));
      if (c.has_value()) {
        hi = c->peak;
        best = std::move(c);
      } else {
        lo = mid + 1;
      }
    }
    result.budget_bytes = best->peak;
    result.lower_bound = 0;
  }
  if (best.has_value()) {
    FillResult(g, *best, &result);
    result.status = CheckmateResult::Status::kFeasible;
    result.lower_bound = std::min(result.lower_bound, result.objective);
    result.gap = Gap(result.objective, result.lower_bound);
  } else {
    result.status = CheckmateResult::Status::kNoSolution;
    result.note = lp_solves == 0 ? "no LP solved"
                  : lp_cut       ? "the LP did not finish in the time limit"
                                 : "no rounding of the LP fits the budget";
  }
  if (lp_solves > 0) absl::StrAppend(&result.note, " (", lp_solves, " LP solves)");
  if (skipped_setup_s > 0) {
    absl::StrAppend(&result.note, "; an LP of ", result.num_variables, " columns and ",
                    result.num_constraints, " rows was not started: its set-up alone (",
                    "an estimated ", absl::SixDigits(skipped_setup_s),
                    " s) would overrun the time left");
  }
  // (an LP not started for the time left is cut by the limit too)
  result.time_limit_reached = deadline.hit() || skipped_setup_s > 0;
  result.solve_s = SecondsSince(started);
  return result;
}

namespace {

const char* StatusName(CheckmateResult::Status status) {
  switch (status) {
    case CheckmateResult::Status::kOptimal: return "optimal";
    case CheckmateResult::Status::kFeasible: return "feasible";
    case CheckmateResult::Status::kInfeasible: return "infeasible";
    case CheckmateResult::Status::kNoSolution: return "no solution";
  }
  return "?";
}

// The PlanResult of a Checkmate result: its plan's schedule, or the one-shot
// schedule (marked infeasible) when there is none; the message says why
// (CheckmatePlanner::Plan may show a lower-peak schedule instead).
absl::StatusOr<PlanResult> ToPlanResult(const Graph& graph,
                                        const PlannerOptions& options,
                                        const CheckmateResult& r, bool is_milp,
                                        absl::string_view policy) {
  const bool has_plan = r.status == CheckmateResult::Status::kOptimal ||
                        r.status == CheckmateResult::Status::kFeasible;
  Schedule schedule;
  if (has_plan) {
    ASSIGN_OR_RETURN(schedule, StagePlanToSchedule(graph, r.plan));
    schedule = RemoveDeadComputes(graph, schedule);
  } else {
    ASSIGN_OR_RETURN(schedule, FreeAtLastUse(graph, DefaultOrder(graph)));
  }
  ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(schedule), options));
  const bool optimal = is_milp && r.status == CheckmateResult::Status::kOptimal;
  if (!has_plan) {
    result.feasible = false;
    if (r.status == CheckmateResult::Status::kInfeasible) {
      result.message = absl::StrCat(
          policy, ": no plan in Checkmate's model fits the budget of ",
          FormatBytes(options.budget_bytes), " (", options.budget_bytes, " bytes)",
          r.note.empty() ? "" : ": ", r.note);
    } else {
      result.message = absl::StrCat(
          policy, ": no plan within the budget found in the time limit of ",
          options.time_limit_s, " s", r.note.empty() ? "" : absl::StrCat(" (", r.note, ")"));
    }
  } else if (result.feasible) {
    result.message = optimal ? "optimal in Checkmate's model (fixed order)"
                             : r.note.empty() ? std::string("not proven optimal")
                                              : absl::StrCat("not proven optimal: ", r.note);
  }
  if (r.time_limit_reached) {
    if (has_plan) {
      NoteTimeLimit(result, options.time_limit_s, "the best plan found so far");
    } else {
      result.details["time_limit_reached"] = true;
    }
  }
  nlohmann::json& d = result.details;
  d["optimal"] = optimal;
  d["status"] = StatusName(r.status);
  d["objective"] = r.objective;
  d["lower_bound"] = r.lower_bound;
  d["gap"] = r.gap;
  d["solve_s"] = r.solve_s;
  d["variables"] = r.num_variables;
  if (is_milp) d["integer_variables"] = r.num_integer_variables;
  d["constraints"] = r.num_constraints;
  d["stages"] = static_cast<int>(DefaultOrder(graph).size());
  d["model_budget_bytes"] = r.budget_bytes;
  d["note"] = r.note;
  return result;
}

// The policies whose plans the `checkmate` policy offers CBC as starts.
constexpr const char* kWarmStartPolicies[] = {"rotor", "dtr"};

// Note [Certifying with the exact search]: CBC's bound comes from Checkmate's
// LP relaxation, which is weak at tight budgets (linear:n=20 at 5 bytes: 58
// against an optimum of 70), so CBC can hold the optimal plan, from a warm
// start, without closing the gap in any reasonable time. Every plan of
// Checkmate's model is a SPEC schedule within the budget, so the cheapest
// schedule of all (the `exact` search) bounds the model's optimum from
// below. On graphs within the exact search's reach, the `checkmate` policy
// gives CBC kCbcShare of the time and, when CBC stops unproven, spends the
// rest on that search: if the incumbent costs what the search's optimum
// costs, it is optimal (in the model and overall); otherwise the search's
// optimum raises the lower bound. `bound_source` in the details says which
// bound the result rests on.
constexpr double kCbcShare = 0.75;

// Raises r's lower bound with the exact search's optimum at `budget_bytes`
// within `seconds`; marks r optimal when the bound meets r's cost. Returns
// the message for a certified plan, or "" (not certified: search stopped,
// or a gap remains).
absl::StatusOr<std::string> CertifyWithExactSearch(const Graph& graph,
                                                   int64_t budget_bytes, double seconds,
                                                   CheckmateResult* r) {
  if (seconds <= 0) return std::string();
  auto exact = ExactMultiShotSchedule(graph, budget_bytes, seconds);
  if (!exact.ok() || !exact->has_value()) return std::string();  // out of reach
  ASSIGN_OR_RETURN(Schedule schedule, StagePlanToSchedule(graph, r->plan));
  ASSIGN_OR_RETURN(PlanReport report, Simulate(graph, RemoveDeadComputes(graph, schedule)));
  const double optimum = (*exact)->cost;
  const double cbc_bound = r->lower_bound;
  if (report.compute_cost > optimum * (1 + 1e-9)) {  // relative: any cost unit
    // Still a valid bound on the model (in cost units, epsilons aside).
    r->lower_bound = std::max(r->lower_bound, std::min(optimum, r->objective));
    r->gap = Gap(r->objective, r->lower_bound);
    return std::string();
  }
  r->status = CheckmateResult::Status::kOptimal;
  r->time_limit_reached = false;  // the search closed what CBC left open
  r->lower_bound = r->objective;
  r->gap = 0;
  return absl::StrCat("optimal in Checkmate's model (fixed order) and overall: CBC's bound ",
                      cbc_bound, " left a gap, closed by the exact search's optimum of ",
                      optimum);
}

// A warm start or a repair: policy `name` over the graph's own order (the
// order of Checkmate's model; composing it again would only repeat work),
// within the time left of `deadline`. Its error where it refuses the graph.
absl::StatusOr<PlanResult> PlanInTimeLeft(const char* name, const Graph& graph,
                                          PlannerOptions options, const Deadline& deadline) {
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(name));
  options.time_limit_s = deadline.remaining_s();
  options.own_order = true;
  return planner->Plan(graph, options);
}

// The share of the time limit checkmate-lp's LP and rounding get; the rest
// is for the repair.
constexpr double kLpShare = 0.8;

// checkmate-lp: the LP and its rounding, then the warm-start heuristics
// (rotor's DP, DTR) over the same order in the time left; the best plan
// (BetterPlan) is returned: a repair where the rounding meets no budget, an
// improvement where a heuristic beats a rounding that fits. So checkmate-lp
// is feasible wherever they are, and never costs more than they do.
absl::StatusOr<PlanResult> PlanLp(const Graph& graph, const PlannerOptions& options,
                                  CheckmateOptions co) {
  const Deadline deadline(options.time_limit_s);
  co.time_limit_s = kLpShare * options.time_limit_s;
  ReportProgress(options,
                 absl::StrFormat("checkmate-lp: LP and rounding, up to %.1f s", co.time_limit_s));
  ASSIGN_OR_RETURN(CheckmateResult r, SolveCheckmateLp(graph, co));
  ASSIGN_OR_RETURN(PlanResult result,
                   ToPlanResult(graph, options, r, /*is_milp=*/false, "checkmate-lp"));
  const bool rounding_fits = result.feasible && options.budget_bytes != PlannerOptions::kMinBudget;
  // A cut stays said whichever plan wins: a longer limit may give a better
  // LP and rounding, or a heuristic not tried (TimeLimitReached reads it).
  const bool lp_cut = TimeLimitReached(result);
  // (kept apart: a second repair that wins replaces the first, not the LP)
  const nlohmann::json lp = result.details;
  const std::string lp_message = result.message;
  std::vector<std::string> untried;
  for (const char* name : kWarmStartPolicies) {
    if (deadline.Expired()) {
      untried.push_back(name);
      continue;
    }
    ReportProgress(options, absl::StrCat("checkmate-lp: ", rounding_fits ? "compare with " : "repair with ", name));
    absl::StatusOr<PlanResult> plan = PlanInTimeLeft(name, graph, options, deadline);
    // With a byte budget a repair must fit: an infeasible LP result keeps
    // its own account of why (the model's lower bound, the time limit).
    const bool byte_budget = options.budget_bytes != PlannerOptions::kMinBudget;
    if (!plan.ok() || (byte_budget && !plan->feasible) || !BetterPlan(*plan, result, options)) {
      continue;
    }
    result = *std::move(plan);
    result.details[rounding_fits ? "improved_by" : "repaired_by"] = name;
    // The LP's bound holds whichever plan wins.
    if (lp.contains("lower_bound")) result.details["lower_bound"] = lp["lower_bound"];
    result.details["lp"] = lp;
    if (!lp_message.empty()) result.details["lp_message"] = lp_message;
  }
  if (lp_cut && !TimeLimitReached(result)) {
    const std::string winner =
        result.details.value("repaired_by", result.details.value("improved_by", ""));
    NoteTimeLimit(result, options.time_limit_s,
                  absl::StrCat("the LP (the plan is ", winner, "'s)"));
  }
  if (!untried.empty()) {
    NoteTimeLimit(result, options.time_limit_s,
                  absl::StrCat("not compared with ", absl::StrJoin(untried, " or ")));
  }
  return result;
}

class CheckmatePlanner final : public Planner {
 public:
  explicit CheckmatePlanner(bool relaxed) : relaxed_(relaxed) {}

  // At a byte budget no plan meets, the policy's lowest-peak plan: the plan
  // it gives at `min`, planned in the time left (the plan of the budget
  // where the time is up or the `min` plan peaks no lower). So the peak
  // shown is how far off the budget is, not the one-shot plan's. A plan
  // within 0.5% of PeakLowerBound is kept as it is: `min` stops there too
  // (SPEC section 5), and the search would take seconds to learn it.
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    if (DefaultOrder(graph).empty()) {
      // Nothing to compute (the outputs are persistent): the empty plan. CBC
      // given a model without variables at `min` crashed.
      return FinishPlan(graph, Schedule{}, options);
    }
    const Deadline deadline(options.time_limit_s);
    ASSIGN_OR_RETURN(PlanResult result, PlanAtBudget(graph, options));
    if (options.budget_bytes == PlannerOptions::kMinBudget || result.feasible ||
        deadline.Expired() ||
        static_cast<double>(result.report.peak_bytes) <=
            kMinPeakSlack * static_cast<double>(PeakLowerBound(graph))) {
      return result;
    }
    const char* policy = relaxed_ ? "checkmate-lp" : "checkmate";
    ReportProgress(options, absl::StrCat(policy, ": no plan fits; the lowest peak"));
    PlannerOptions min_options = options;
    min_options.budget_bytes = PlannerOptions::kMinBudget;
    min_options.time_limit_s = deadline.remaining_s();
    ASSIGN_OR_RETURN(PlanResult low, PlanAtBudget(graph, min_options));
    if (low.report.peak_bytes >= result.report.peak_bytes) return result;
    const bool cut = TimeLimitReached(low);
    ASSIGN_OR_RETURN(PlanResult shown, FinishPlan(graph, std::move(low.schedule), options));
    if (shown.feasible) {
      // The lowest-peak search met the budget where the search at it did not.
      shown.message = absl::StrCat(policy, ": its lowest-peak plan (its plan at --budget min) ",
                                   "fits the budget; at the budget itself: ", result.message);
      shown.details = std::move(low.details);
      shown.details["at_budget"] = std::move(result.details);
    } else {
      shown.message = absl::StrCat(result.message, "; the schedule shown is ", policy,
                                   "'s lowest-peak plan (its plan at --budget min)");
      shown.details = std::move(result.details);
      shown.details["lowest_peak"] = std::move(low.details);
      // (the refusal's advice takes it rather than planning at min again)
      shown.least_peak_bytes = shown.report.peak_bytes;
    }
    shown.details["shown"] = "lowest peak";
    if (cut) NoteTimeLimit(shown, options.time_limit_s, "the lowest peak found so far");
    return shown;
  }

 private:
  absl::StatusOr<PlanResult> PlanAtBudget(const Graph& graph,
                                          const PlannerOptions& options) const {
    CheckmateOptions co;
    co.budget_bytes = options.budget_bytes;
    co.time_limit_s = options.time_limit_s;
    co.seed = options.seed;
    co.max_stages = options.milp_max_stages;
    if (relaxed_) return PlanLp(graph, options, co);
    // Warm starts: the chain DP and DTR are fast and often optimal or close,
    // which CBC's own heuristics are not within the time limit. Their time
    // counts against the limit.
    const Deadline deadline(options.time_limit_s);
    std::vector<std::string> offered;
    for (const char* name : kWarmStartPolicies) {
      ReportProgress(options, absl::StrCat("checkmate: warm start from ", name));
      // The time left, so that a slow one cannot eat CBC's.
      absl::StatusOr<PlanResult> plan = PlanInTimeLeft(name, graph, options, deadline);
      if (!plan.ok()) continue;  // e.g. past a size limit: CBC starts without it
      co.warm_starts.push_back({name, std::move(plan->schedule)});
      offered.push_back(name);
    }
    const bool certifiable = options.budget_bytes != PlannerOptions::kMinBudget &&
                             DefaultOrder(graph).size() <=
                                 static_cast<size_t>(kMaxExactMultiShotNodes);
    const double left = deadline.remaining_s();
    co.time_limit_s = certifiable ? kCbcShare * left : left;
    ReportProgress(options, absl::StrFormat("checkmate: CBC, up to %.1f s", co.time_limit_s));
    ASSIGN_OR_RETURN(CheckmateResult r, SolveCheckmateMilp(graph, co));
    if (r.status == CheckmateResult::Status::kOptimal ||
        r.status == CheckmateResult::Status::kFeasible) {
      ReportProgress(options, "checkmate: CBC stopped", r.objective, r.lower_bound);
    }
    std::string certificate;
    if (certifiable && r.status == CheckmateResult::Status::kFeasible) {
      ReportProgress(options, "checkmate: certifying with the exact search", r.objective,
                     r.lower_bound);
      ASSIGN_OR_RETURN(certificate, CertifyWithExactSearch(
                                        graph, options.budget_bytes,
                                        deadline.remaining_s(), &r));
    }
    ASSIGN_OR_RETURN(PlanResult result,
                     ToPlanResult(graph, options, r, /*is_milp=*/true, "checkmate"));
    result.details["warm_starts"] = offered;
    result.details["bound_source"] = certificate.empty() ? "cbc" : "exact search";
    if (!certificate.empty()) result.message = certificate;
    return result;
  }

  bool relaxed_;
};

}  // namespace

void RegisterCheckmatePlanners(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "checkmate",
      .description =
          "Checkmate's MILP (Jain et al. 2020) solved by CBC: the cheapest "
          "recomputation plan over the graph's own order; exact within that "
          "model when it finishes in the time limit (small graphs)",
      .kind = PlanKind::kMultiShot,
      .exact = true,
      .factory = [] { return std::make_unique<CheckmatePlanner>(false); },
  });
  registry.Register(PolicyInfo{
      .name = "checkmate-lp",
      .description =
          "Checkmate's LP relaxation with two-phase rounding (Jain et al. "
          "2020, section 5): recomputation plan over the graph's own order; "
          "heuristic",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<CheckmatePlanner>(true); },
  });
}

}  // namespace pebble
