// The `sqrtn` policy: Chen, Xu, Zhang and Guestrin, "Training Deep Nets with
// Sublinear Memory Cost" (arXiv:1604.06174, 2016), section 4.1: cut the
// forward pass into segments at articulation points, keep only the segment
// borders during the forward pass and recompute each segment's inside once,
// just before the backward pass needs it. With n equal layers and sqrt(n)
// segments the activations held at once are about 2 sqrt(n) (the borders
// plus one segment) for at most one extra forward pass.
//
// Knob: the number k of segments of (nearly) equal length in stages, the
// stages being those of Note [Chain view of a training graph] with every
// separator a boundary. k = 1 is no recomputation; Chen's rule is
// k = round(sqrt(L)). Under a byte budget we return the least costly k that
// fits (the baseline schedule first), under --budget min the lowest peak.
// Not optimal: equal lengths ignore sizes and costs. In Chen's model (peak =
// kept borders plus the largest segment) stage bytes (1, 1, 2) are best cut
// after the second stage: 1 + max(1 + 1, 2) = 3; the equal cuts hold 4
// (k = 1: 4; k = 2 cuts after the first: 1 + max(1, 1 + 2); k = 3:
// 1 + 1 + 2). chen-greedy and rotor weigh bytes.
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

// Segment counts tried: every k up to 64, then a geometric sweep (x1.25)
// up to L, and round(sqrt(L)) with its neighbours; ascending, distinct.
std::vector<int> SegmentCounts(int num_stages) {
  std::vector<int> ks;
  for (int k = 1; k <= std::min(num_stages, 64); ++k) ks.push_back(k);
  for (double k = 80; k < num_stages; k *= 1.25) ks.push_back(static_cast<int>(k));
  const int root = static_cast<int>(std::lround(std::sqrt(num_stages)));
  for (int k = root - 2; k <= root + 2; ++k) ks.push_back(k);
  ks.push_back(num_stages);
  std::vector<int> out;
  for (int k : ks) {
    if (k >= 1 && k <= num_stages) out.push_back(k);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

class SqrtnPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const auto started = std::chrono::steady_clock::now();
    const ChainView view = BuildChainView(graph);
    const Chain chain = CollapseChain(graph, view, view.separators);
    const int L = chain.num_stages();
    std::vector<CheckpointCandidate> candidates;
    if (L > 0) {
      for (int k : SegmentCounts(L)) {
        candidates.push_back({EvenCheckpoints(L, k), {{"segments", k}}});
      }
    }
    return PlanCheckpointCandidates(
        graph, options, view, chain, candidates,
        {{"sqrt_rule_segments", L > 0 ? std::lround(std::sqrt(L)) : 0}}, started);
  }
};

}  // namespace

void RegisterSqrtnPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "sqrtn",
      .description = "Chen et al. 2016 sqrt(n) checkpointing: equal segments between "
                     "forward articulation points, each recomputed once in the backward "
                     "pass; the segment count is searched for the budget",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<SqrtnPlanner>(); },
  });
}

}  // namespace pebble
