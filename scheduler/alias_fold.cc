#include "scheduler/alias_fold.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/optimizer.h"
#include "graph/status.h"

namespace pebble {

// Note [Alias folding]. A view (SPEC section 1, "Aliases") shares its base's
// storage, so a planner that saw it as a tensor of its own would count its
// bytes twice, and could "recompute" a base while a view keeps the old
// storage alive. Rather than teach every planner (built-in, exec:, Python)
// the storage rule, each plans the folded graph, which has one node per
// storage, and the schedule is unfolded (alias_fold.h):
//
//   b = conv(x); v = view(b); c = relu(v); d = add(b, v)
//   folded:  b = conv(x); c = relu(b); d = add(b)
//   plan:    compute b, compute c, compute d, free b
//   unfolded: compute b, compute v, compute c, compute d, free v, free b
//
// In the unfolded schedule an alias is computed right before the first
// compute of its root's residency that needs it and freed right before the
// free that ends that residency. Computing or freeing an alias never moves
// memory: its root is resident (the folded reader reads the root), and the
// alias is freed before the root. So every step of the unfolded schedule
// holds what the folded step it comes from (or next to) held: same peak,
// same host peak, same transfers. A root is never recomputed or prefetched
// while an alias of it lives, since those are freed with it.

namespace {

// The non-alias nodes that computing alias `a` needs resident: the root of
// its chain and whatever the aliases on the chain read besides, for every
// alias of `graph` (memoised in topological order; empty for non-aliases).
std::vector<std::vector<NodeId>> AliasDeps(const Graph& graph) {
  const int n = graph.num_nodes();
  std::vector<std::vector<NodeId>> deps(n);
  std::vector<int32_t> stamp(n, -1);
  for (NodeId a : graph.topological_order()) {
    if (!graph.is_alias(a)) continue;
    std::vector<NodeId>& out = deps[a];
    auto add = [&](NodeId w) {
      if (stamp[w] != a) {
        stamp[w] = a;
        out.push_back(w);
      }
    };
    for (NodeId u : graph.unique_inputs(a)) {
      if (graph.is_alias(u)) {
        for (NodeId w : deps[u]) add(w);
      } else {
        add(u);
      }
    }
  }
  return deps;
}

class AliasFoldingPlanner final : public Planner {
 public:
  explicit AliasFoldingPlanner(std::unique_ptr<Planner> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    if (!graph.has_aliases()) return inner_->Plan(graph, options);
    ASSIGN_OR_RETURN(const FoldedGraph folded, FoldAliases(graph));
    ASSIGN_OR_RETURN(PlanResult inner, inner_->Plan(folded.graph, options));
    Schedule schedule = UnfoldSchedule(graph, folded, inner.schedule);
    ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(schedule), options));
    // Note [Alias folding]: the unfolded plan holds what the folded one did.
    if (result.report.peak_bytes != inner.report.peak_bytes ||
        result.report.host_peak_bytes != inner.report.host_peak_bytes ||
        result.report.transfer_bytes != inner.report.transfer_bytes) {
      return absl::InternalError(absl::StrCat(
          "alias folding: the unfolded plan's peak ", result.report.peak_bytes,
          " (host ", result.report.host_peak_bytes, ") differs from the folded plan's ",
          inner.report.peak_bytes, " (host ", inner.report.host_peak_bytes, ")"));
    }
    result.feasible = inner.feasible;
    result.message = std::move(inner.message);
    result.details = std::move(inner.details);
    result.least_peak_bytes = inner.least_peak_bytes;  // (the peaks are the same)
    result.details["folded_aliases"] = graph.num_aliases();
    if (const int others = AliasesReadingOthers(graph); others > 0) {
      result.details["aliases_reading_others"] = others;
      if (absl::StartsWith(result.message, "optimal")) {
        absl::StrAppend(&result.message, " (over storages: ", others,
                        others == 1 ? " view that reads another tensor keeps it while its"
                                    : " views that read another tensor keep it while their",
                        " readers may run, as making the view again would need it)");
      }
    }
    return result;
  }

 private:
  std::unique_ptr<Planner> inner_;
};

}  // namespace

int AliasesReadingOthers(const Graph& graph) {
  int count = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.is_alias(v) && !graph.in_place(v) && graph.unique_inputs(v).size() > 1) ++count;
  }
  return count;
}

absl::StatusOr<FoldedGraph> FoldAliases(const Graph& graph) {
  const int n = graph.num_nodes();
  const std::vector<std::vector<NodeId>> deps = AliasDeps(graph);
  FoldedGraph f;
  f.folded.assign(n, kNoNode);
  GraphBuilder builder(graph.name());
  for (NodeId v : graph.topological_order()) {
    if (graph.is_alias(v)) continue;
    NodeSpec spec = SpecOf(graph, v);
    spec.inputs.clear();
    for (NodeId u : graph.inputs(v)) {
      if (graph.is_alias(u)) {
        for (NodeId w : deps[u]) spec.inputs.push_back(graph.id(w));
      } else {
        spec.inputs.push_back(graph.id(u));
      }
    }
    f.folded[v] = static_cast<NodeId>(f.original.size());
    f.original.push_back(v);
    builder.AddNode(std::move(spec));
  }
  for (NodeId o : graph.outputs()) {
    if (graph.is_alias(o)) {
      for (NodeId w : deps[o]) builder.AddOutput(graph.id(w));
    } else {
      builder.AddOutput(graph.id(o));
    }
  }
  ASSIGN_OR_RETURN(f.graph, builder.Build());
  return f;
}

Schedule UnfoldSchedule(const Graph& graph, const FoldedGraph& folded,
                        const Schedule& schedule) {
  const int n = graph.num_nodes();
  Schedule out;
  out.steps.reserve(schedule.steps.size() + 2 * static_cast<size_t>(graph.num_aliases()));
  std::vector<uint8_t> resident(n, 0);  // aliases only
  // The resident aliases of each root, a list through next_alias (latest
  // computed first, so a chain is freed from its end).
  std::vector<NodeId> head(n, kNoNode);
  std::vector<NodeId> next_alias(n, kNoNode);
  std::vector<std::pair<NodeId, int>> stack;  // (alias, next input to look at)
  // Unclipped gradients that are aliases, made as soon as the non-aliases
  // they need are resident (the contract in alias_fold.h): per non-alias,
  // those that need it.
  const std::vector<std::vector<NodeId>> deps = AliasDeps(graph);
  std::vector<std::vector<NodeId>> eager(n);
  for (NodeId a = 0; a < n; ++a) {
    if (!graph.is_alias(a) || !IsUnclippedGradient(graph, a)) continue;
    for (NodeId u : deps[a]) eager[u].push_back(a);
  }
  std::vector<uint8_t> live(n, 0);  // non-aliases resident on the device

  // Computes `a` and the aliases it reads that are not resident, inputs
  // first (an iterative post-order walk: chains can be long).
  auto ensure = [&](NodeId a) {
    if (resident[a]) return;
    stack.push_back({a, 0});
    while (!stack.empty()) {
      const NodeId x = stack.back().first;
      const absl::Span<const NodeId> inputs = graph.unique_inputs(x);
      const int i = stack.back().second++;
      if (i < static_cast<int>(inputs.size())) {
        const NodeId w = inputs[i];
        if (graph.is_alias(w) && !resident[w]) stack.push_back({w, 0});
        continue;
      }
      stack.pop_back();
      out.steps.push_back({Action::kCompute, x});
      resident[x] = 1;
      const NodeId root = graph.storage(x);
      next_alias[x] = head[root];
      head[root] = x;
    }
  };

  const size_t num_steps = schedule.steps.size();
  for (size_t k = 0; k < num_steps; ++k) {
    const Step& step = schedule.steps[k];
    PEBBLE_CHECK(step.node >= 0 && step.node < static_cast<NodeId>(folded.original.size()),
                 "UnfoldSchedule: a step names no folded node");
    const NodeId v = folded.original[step.node];
    switch (step.action) {
      case Action::kCompute:
        // A bucket's members (Step::joins_bucket) stay side by side: the
        // views they read are made before its first step.
        if (step.joins_bucket) break;
        for (size_t j = k; j < num_steps && (j == k || schedule.steps[j].joins_bucket); ++j) {
          for (NodeId u : graph.unique_inputs(folded.original[schedule.steps[j].node])) {
            if (graph.is_alias(u)) ensure(u);
          }
        }
        break;
      case Action::kFree:
        for (NodeId a = head[v]; a != kNoNode; a = next_alias[a]) {
          out.steps.push_back({Action::kFree, a});
          resident[a] = 0;
        }
        head[v] = kNoNode;
        break;
      case Action::kOffload:
      case Action::kPrefetch:
      case Action::kHostCompute:  // reads host copies: no view to make
      case Action::kAllReduce:    // reduces the node itself, resident already
        break;
    }
    out.steps.push_back({step.action, v, step.joins_bucket});
    if (step.action == Action::kCompute || step.action == Action::kPrefetch) live[v] = 1;
    if (step.action == Action::kFree) live[v] = 0;
    // (after a compute only: the value a prefetch brings back was made, and
    // summed, before its offload)
    if (step.action != Action::kCompute) continue;
    for (NodeId a : eager[v]) {
      if (std::all_of(deps[a].begin(), deps[a].end(), [&](NodeId u) { return live[u]; })) {
        ensure(a);
      }
    }
  }
  for (NodeId o : graph.outputs()) {
    if (graph.is_alias(o)) ensure(o);
  }
  const absl::Span<const NodeId> order = graph.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (resident[*it] && !graph.is_output(*it)) out.steps.push_back({Action::kFree, *it});
  }
  return out;
}

std::unique_ptr<Planner> WithAliasFolding(std::unique_ptr<Planner> inner) {
  return std::make_unique<AliasFoldingPlanner>(std::move(inner));
}

}  // namespace pebble
