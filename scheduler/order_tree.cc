// The `tree` policy: minimum-peak orders of in-trees (scheduler/orders.h,
// TreeOrder), after J. W. H. Liu, "An application of generalized tree
// pebbling to sparse matrix factorization", SIAM J. Algebraic Discrete
// Methods 8(3), 1987; see also Jacquelin, Marchal, Robert and Ucar, "On
// optimal tree traversals for sparse matrix factorization", IPDPS 2011,
// whose MinMemory model (children's files + the node's file + its
// temporary, all resident while the node runs) is SPEC section 2's.
//
// Note [hills and valleys]: the memory profile of a subtree's schedule,
// relative to the memory before it starts, is a sequence of steps, each with
// a peak (during the compute) and a level (after it). Cut it into segments:
// the first ends at the last minimum level after the global maximum peak
// (hill H1, valley V1), the next at the last minimum after the largest peak
// after that, and so on; the last valley is the subtree's final level. Hills
// strictly fall, valleys strictly rise, and inside a segment every level is
// above the segment's starting level. Liu shows that an optimal schedule of
// a node interleaves its children's optimal schedules only at valleys, taking
// the segments of all children in decreasing (hill - valley) (within a child
// that order is its own, as hills fall and valleys rise), then computes the
// node; re-segmenting that gives the node's schedule. Because every level
// inside a segment is above its start and every later level above its
// valley, the re-segmentation needs only each segment's (hill, valley), not
// the individual steps: a stack merge (push; merge the top into the one
// below while the top's hill is not lower or its valley not higher).
//
// Segments keep their nodes as linked lists in one `next` array (each node
// is in exactly one segment), so concatenation is O(1).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "scheduler/orders.h"
#include "scheduler/policies.h"

namespace pebble {
namespace {

struct Segment {
  int64_t hill;    // largest peak inside, relative to the subtree's start
  int64_t valley;  // level at its end, relative to the subtree's start
  NodeId head;     // first node (linked through `next`)
  NodeId tail;     // last node
};

// Appends `block` to the segmented profile `segs`, restoring Note [hills and
// valleys]'s invariant (hills strictly falling, valleys strictly rising).
void PushBlock(std::vector<Segment>& segs, Segment block,
               std::vector<NodeId>& next) {
  segs.push_back(block);
  while (segs.size() >= 2) {
    Segment& top = segs[segs.size() - 1];
    Segment& below = segs[segs.size() - 2];
    if (top.hill < below.hill && top.valley > below.valley) break;
    below.hill = std::max(below.hill, top.hill);
    below.valley = top.valley;
    next[below.tail] = top.head;
    below.tail = top.tail;
    segs.pop_back();
  }
}

// One segment of a child in the merge: (child index, segment index).
struct MergeItem {
  int64_t key;  // hill - valley, larger first
  int32_t child;
  int32_t index;
};

// Merges the segment lists of `chains` (profiles relative to their own
// start) in decreasing (hill - valley), ties by chain then position, and
// calls emit(absolute hill, absolute valley, segment) for each, absolute
// meaning relative to the start of the merged schedule. Returns the sum of
// the chains' final levels.
template <typename Emit>
int64_t MergeChains(const std::vector<const std::vector<Segment>*>& chains,
                    Emit emit) {
  std::vector<MergeItem> items;
  for (int32_t c = 0; c < static_cast<int32_t>(chains.size()); ++c) {
    const std::vector<Segment>& segs = *chains[c];
    for (int32_t i = 0; i < static_cast<int32_t>(segs.size()); ++i) {
      items.push_back({segs[i].hill - segs[i].valley, c, i});
    }
  }
  std::sort(items.begin(), items.end(), [](const MergeItem& a, const MergeItem& b) {
    if (a.key != b.key) return a.key > b.key;
    if (a.child != b.child) return a.child < b.child;
    return a.index < b.index;
  });
  std::vector<int64_t> level(chains.size(), 0);
  int64_t total = 0;  // sum of level[]
  for (const MergeItem& item : items) {
    const Segment& s = (*chains[item.child])[item.index];
    const int64_t others = total - level[item.child];
    emit(others + s.hill, others + s.valley, s);
    total = others + s.valley;
    level[item.child] = s.valley;
  }
  return total;
}

class TreePlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    ASSIGN_OR_RETURN(std::vector<NodeId> order, TreeOrder(graph));
    return PlanFromOrder(graph, order, options);
  }
};

}  // namespace

absl::Status CheckInTree(const Graph& graph) {
  for (NodeId u : graph.topological_order()) {
    if (!graph.needed()[u] || graph.persistent(u)) continue;
    NodeId first = kNoNode;
    for (NodeId r : graph.readers(u)) {
      if (!graph.needed()[r]) continue;
      if (first == kNoNode) {
        first = r;
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "tree: node '", graph.id(u), "' has two readers, '", graph.id(first),
          "' and '", graph.id(r),
          "'; the tree policy takes in-trees only (every computed tensor read "
          "by at most one node); use best-order, greedy or exact-order"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<NodeId>> TreeOrder(const Graph& graph) {
  RETURN_IF_ERROR(CheckInTree(graph));
  const int n = graph.num_nodes();
  std::vector<NodeId> next(n, kNoNode);
  // profile[v]: the segmented optimal schedule of v's subtree, alive until
  // v's reader (its parent) consumes it.
  std::vector<std::vector<Segment>> profile(n);
  std::vector<const std::vector<Segment>*> chains;
  for (NodeId v : graph.topological_order()) {
    if (!graph.needed()[v] || graph.persistent(v)) continue;
    chains.clear();
    NodeId only_child = kNoNode;
    int64_t freed = 0;  // children's roots released by v (not outputs)
    for (NodeId c : graph.unique_inputs(v)) {
      if (graph.persistent(c)) continue;
      chains.push_back(&profile[c]);
      only_child = c;
      if (!graph.is_output(c)) freed += graph.bytes(c);
    }
    std::vector<Segment> segs;
    int64_t level = 0;  // after the children, before v
    if (chains.size() == 1) {
      // One child: its profile unchanged (nothing to interleave).
      segs = std::move(profile[only_child]);
      level = segs.back().valley;
    } else if (chains.size() > 1) {
      level = MergeChains(chains, [&](int64_t hill, int64_t valley,
                                      const Segment& s) {
        PushBlock(segs, {hill, valley, s.head, s.tail}, next);
      });
    }
    PushBlock(segs,
              {level + graph.bytes(v) + graph.workspace(v),
               level - freed + graph.bytes(v), v, v},
              next);
    profile[v] = std::move(segs);
    for (NodeId c : graph.unique_inputs(v)) {
      if (!graph.persistent(c)) {
        profile[c].clear();
        profile[c].shrink_to_fit();
      }
    }
  }
  // The roots (needed nodes without a needed reader: outputs), merged under
  // a virtual root that computes nothing.
  chains.clear();
  for (NodeId v : graph.topological_order()) {
    if (!graph.needed()[v] || graph.persistent(v)) continue;
    bool has_reader = false;
    for (NodeId r : graph.readers(v)) has_reader = has_reader || graph.needed()[r];
    if (!has_reader) chains.push_back(&profile[v]);
  }
  std::vector<NodeId> order;
  order.reserve(n);
  MergeChains(chains, [&](int64_t, int64_t, const Segment& s) {
    for (NodeId v = s.head;; v = next[v]) {
      order.push_back(v);
      if (v == s.tail) break;
    }
  });
  return order;
}

void RegisterTreePlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "tree",
      .description = "optimal order for in-trees (every tensor read once; Liu "
                     "1987's hill-valley merge), freed at last use; refuses "
                     "other graphs",
      .kind = PlanKind::kOneShot,
      .exact = true,
      .factory = [] { return std::make_unique<TreePlanner>(); },
  });
}

}  // namespace pebble
