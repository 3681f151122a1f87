// The `articulation` policy: the "memory" mode of the TensorFlow
// gradient-checkpointing library (openai/gradient-checkpointing,
// memory_saving_gradients.py; Bulatov 2018). It finds the bottleneck
// tensors of the forward pass (articulation points that every path from
// the inputs to the loss crosses), drops those under 1024 elements unless
// too few remain (fewer than sqrt of the filtered forward tensors, as the
// library retries without the filter), and keeps about sqrt(N) of them,
// evenly in topological order: with `count` bottlenecks and N forward
// tensors, all of them when count <= ceil(sqrt(N)), else every step-th from
// index step, step = ceil(count / sqrt(N)) (the library's
// sorted_bottlenecks[step::step]). Segments between kept bottlenecks are
// recomputed once in the backward pass (CheckpointOps).
//
// Knob: the step. The library's step is one candidate; under a byte budget
// we return the least costly step that fits (the baseline schedule first,
// then steps 1..count and "all bottlenecks"), under --budget min the lowest
// peak. Not optimal: the spacing counts bottlenecks, not bytes or costs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "graph/boost_adapter.h"
#include "graph/status.h"
#include "scheduler/policies.h"
#include "scheduler/remat.h"

namespace pebble {
namespace {

// The library's MIN_CHECKPOINT_NODE_SIZE, in elements; a node without a
// shape counts its bytes as elements.
constexpr int64_t kMinCheckpointElements = 1024;

int64_t Elements(const Graph& graph, NodeId v) {
  return graph.shape(v).has_value() ? NumElements(*graph.shape(v)) : graph.bytes(v);
}

class ArticulationPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const auto started = std::chrono::steady_clock::now();
    const ChainView view = BuildChainView(graph);
    const Chain chain = CollapseChain(graph, view, view.separators);
    const int L = chain.num_stages();
    // Bottlenecks: forward articulation points that are separators (the
    // library's "no shortcut" test), as stage indices (their output).
    std::vector<bool> mask(graph.num_nodes(), false);
    for (NodeId v : view.part.forward) mask[v] = true;
    std::vector<uint8_t> articulation(graph.num_nodes(), 0);
    for (NodeId v : ArticulationPoints(graph, mask)) articulation[v] = 1;
    std::vector<int> all, large;
    for (int s = 0; s + 1 < L; ++s) {
      const NodeId v = chain.stages[s].output;
      if (!articulation[v]) continue;
      all.push_back(s);
      if (Elements(graph, v) >= kMinCheckpointElements) large.push_back(s);
    }
    int64_t n_all = static_cast<int64_t>(view.part.forward.size());
    int64_t n_large = 0;
    for (NodeId v : view.part.forward) {
      if (Elements(graph, v) >= kMinCheckpointElements) ++n_large;
    }
    const bool filtered = !large.empty() &&
                          static_cast<double>(large.size()) >= std::sqrt(n_large);
    const std::vector<int>& bottlenecks = filtered ? large : all;
    const double root_n = std::sqrt(static_cast<double>(filtered ? n_large : n_all));
    const int count = static_cast<int>(bottlenecks.size());
    auto every = [&](int step) {
      std::vector<int> kept;
      for (int i = step; i < count; i += step) kept.push_back(bottlenecks[i]);
      return kept;
    };
    int library_step = 0;  // 0: all bottlenecks
    std::vector<CheckpointCandidate> candidates;
    if (count > 0) {
      if (count > std::ceil(root_n)) {
        library_step = static_cast<int>(std::ceil(count / root_n));
        candidates.push_back({every(library_step), {{"step", library_step}}});
      } else {
        candidates.push_back({bottlenecks, {{"step", "all"}}});
      }
      for (int step = 1; step <= count; ++step) {
        candidates.push_back({every(step), {{"step", step}}});
      }
      candidates.push_back({bottlenecks, {{"step", "all"}}});
    }
    return PlanCheckpointCandidates(
        graph, options, view, chain, candidates,
        {{"bottlenecks", count},
         {"size_filter", filtered},
         {"library_step", library_step == 0 ? nlohmann::json("all")
                                            : nlohmann::json(library_step)}},
        started);
  }
};

}  // namespace

void RegisterArticulationPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "articulation",
      .description = "TensorFlow gradient-checkpointing 'memory' mode: about sqrt(N) "
                     "articulation-point bottlenecks of the forward pass, evenly in "
                     "topological order, as checkpoints; the spacing is searched for "
                     "the budget",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<ArticulationPlanner>(); },
  });
}

}  // namespace pebble
