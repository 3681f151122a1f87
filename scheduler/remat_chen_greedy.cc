// The `chen-greedy` policy: Chen, Xu, Zhang and Guestrin 2016, Algorithm 3
// ("memory planning with budget"): walk the forward pass in topological
// order, adding each stage's activation bytes (its output plus what its
// backward reads) to a running total; when the total passes a threshold b
// at a candidate point (a separator, Note [Chain view of a training
// graph]), keep that point as a checkpoint and restart the total. Segments
// are recomputed once in the backward pass (CheckpointOps).
//
// Knob: b. We try b on a geometric grid of 96 values from the smallest
// stage to the whole forward pass (the distinct checkpoint sets it yields,
// each simulated) plus "no checkpoint"; under a byte budget we return the
// least costly plan that fits (the baseline schedule first), under
// --budget min the lowest peak. Not optimal, even at its best b: in Chen's
// model (peak = kept borders plus the largest segment), stage bytes
// (1, 1, 2, 1) are best cut once after the second stage (1 + max(2, 3) = 4),
// but every b that closes a segment there (1 <= b < 2) closes one after the
// third stage too (1 + 2 + max(2, 2, 1) = 5), and the other thresholds give
// 5 or 6.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "graph/status.h"
#include "scheduler/policies.h"
#include "scheduler/remat.h"

namespace pebble {
namespace {

constexpr int kThresholds = 96;

std::vector<int> GreedyCheckpoints(const std::vector<double>& sizes, double b) {
  std::vector<int> kept;
  double total = 0;
  for (int i = 0; i + 1 < static_cast<int>(sizes.size()); ++i) {
    total += sizes[i];
    if (total > b) {
      kept.push_back(i);
      total = 0;
    }
  }
  return kept;
}

class ChenGreedyPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const auto started = std::chrono::steady_clock::now();
    const ChainView view = BuildChainView(graph);
    const Chain chain = CollapseChain(graph, view, view.separators);
    const int L = chain.num_stages();
    std::vector<double> sizes(L);
    double lo = 0, total = 0;
    for (int i = 0; i < L; ++i) {
      const ChainStage& st = chain.stages[i];
      // At least one byte, so that zero-byte stages still advance the walk.
      sizes[i] = std::max<double>(1.0, static_cast<double>(st.output_bytes +
                                                           st.saved_extra_bytes));
      lo = i == 0 ? sizes[i] : std::min(lo, sizes[i]);
      total += sizes[i];
    }
    std::vector<CheckpointCandidate> candidates;
    if (L > 1) {
      // b just under lo keeps every stage; b = total keeps none.
      const double start = lo * 0.5;
      const double ratio = std::pow(total / start, 1.0 / (kThresholds - 1));
      double b = start;
      for (int k = 0; k < kThresholds; ++k, b *= ratio) {
        candidates.push_back({GreedyCheckpoints(sizes, b), {{"threshold_bytes", b}}});
      }
    }
    return PlanCheckpointCandidates(graph, options, view, chain, candidates,
                                    nlohmann::json::object(), started);
  }
};

}  // namespace

void RegisterChenGreedyPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "chen-greedy",
      .description = "Chen et al. 2016 Algorithm 3: checkpoint a forward articulation "
                     "point whenever the segment's activation bytes pass a threshold, "
                     "threshold searched for the least recomputation within the budget",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<ChenGreedyPlanner>(); },
  });
}

}  // namespace pebble
