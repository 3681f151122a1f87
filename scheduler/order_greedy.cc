// The `greedy` policy: list scheduling by memory (scheduler/orders.h,
// GreedyOrder), in the spirit of XLA's ListScheduler (which picks the ready
// instruction with the largest bytes freed minus bytes defined) and of
// TensorFlow's "linearize" memory experiment.
//
// Note [greedy scores]: the score of a ready node is the change of the
// resident bytes that scheduling it causes, the smaller the better.
// Forwards: + bytes(v) (every needed node is kept after its compute: it is
// an output or has a reader) - the bytes of the inputs whose last unscheduled
// reader is v. Backwards (the order is built from its end): the memory before
// v's compute is the memory after it + the inputs v frees (they come back to
// life) - bytes(v); the score is the same difference. Scores only fall as the
// schedule grows (an input can only reach its last reader), so the heap
// holds stale entries that are skipped when popped (lazy updates).
#include <cstdint>
#include <memory>
#include <queue>
#include <vector>

#include "graph/status.h"
#include "scheduler/orders.h"
#include "scheduler/policies.h"

namespace pebble {
namespace {

struct Entry {
  int64_t score;  // bytes, smaller first
  int64_t stamp;  // when it became ready or its score last fell; larger first
  NodeId node;    // smaller first
};
struct EntryAfter {
  bool operator()(const Entry& a, const Entry& b) const {
    if (a.score != b.score) return a.score > b.score;
    if (a.stamp != b.stamp) return a.stamp < b.stamp;
    return a.node > b.node;
  }
};
using ReadyHeap = std::priority_queue<Entry, std::vector<Entry>, EntryAfter>;

// Needed readers of every node (readers are never persistent).
std::vector<int32_t> NeededReaderCounts(const Graph& graph) {
  std::vector<int32_t> counts(graph.num_nodes(), 0);
  for (NodeId u = 0; u < graph.num_nodes(); ++u) {
    for (NodeId r : graph.readers(u)) counts[u] += graph.needed()[r] ? 1 : 0;
  }
  return counts;
}

bool Computed(const Graph& graph, NodeId v) {
  return graph.needed()[v] && !graph.persistent(v);
}

std::vector<NodeId> ForwardGreedy(const Graph& graph) {
  const int n = graph.num_nodes();
  const std::vector<int32_t> needed_readers = NeededReaderCounts(graph);
  std::vector<int32_t> unscheduled_readers = needed_readers;
  std::vector<int32_t> missing_inputs(n, 0);
  std::vector<int64_t> freeable(n, 0);  // bytes v frees as last reader
  std::vector<uint8_t> done(n, 0);
  auto score = [&](NodeId v) { return graph.bytes(v) - freeable[v]; };
  // The one needed reader of u not scheduled yet.
  auto last_reader = [&](NodeId u) {
    for (NodeId r : graph.readers(u)) {
      if (graph.needed()[r] && !done[r]) return r;
    }
    PEBBLE_CHECK(false, "no unscheduled reader left");
    return kNoNode;
  };
  int total = 0;
  for (NodeId v = 0; v < n; ++v) {
    if (!Computed(graph, v)) continue;
    ++total;
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u)) ++missing_inputs[v];
    }
    if (unscheduled_readers[v] == 1 && !graph.is_output(v)) {
      freeable[last_reader(v)] += graph.bytes(v);
    }
  }
  ReadyHeap heap;
  int64_t clock = 0;
  for (NodeId v = 0; v < n; ++v) {
    if (Computed(graph, v) && missing_inputs[v] == 0) {
      heap.push({score(v), clock++, v});
    }
  }
  std::vector<NodeId> order;
  order.reserve(total);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    const NodeId v = e.node;
    if (done[v] || e.score != score(v)) continue;  // stale
    done[v] = 1;
    order.push_back(v);
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.persistent(u)) continue;
      if (--unscheduled_readers[u] == 1 && !graph.is_output(u)) {
        const NodeId r = last_reader(u);
        freeable[r] += graph.bytes(u);
        if (missing_inputs[r] == 0) heap.push({score(r), clock++, r});
      }
    }
    for (NodeId r : graph.readers(v)) {
      if (graph.needed()[r] && --missing_inputs[r] == 0) {
        heap.push({score(r), clock++, r});
      }
    }
  }
  PEBBLE_CHECK(static_cast<int>(order.size()) == total,
               "forward greedy did not schedule every node");
  return order;
}

std::vector<NodeId> ReverseGreedy(const Graph& graph) {
  const int n = graph.num_nodes();
  std::vector<int32_t> unplaced_readers = NeededReaderCounts(graph);
  std::vector<int32_t> placed_readers(n, 0);
  std::vector<int64_t> revived(n, 0);  // bytes v brings back to life
  std::vector<uint8_t> placed(n, 0);
  auto freed_by_last_reader = [&](NodeId u) {
    return !graph.persistent(u) && !graph.is_output(u);
  };
  auto score = [&](NodeId v) { return revived[v] - graph.bytes(v); };
  int total = 0;
  ReadyHeap heap;
  int64_t clock = 0;
  for (NodeId v = 0; v < n; ++v) {
    if (!Computed(graph, v)) continue;
    ++total;
    for (NodeId u : graph.unique_inputs(v)) {
      if (freed_by_last_reader(u)) revived[v] += graph.bytes(u);
    }
  }
  for (NodeId v = 0; v < n; ++v) {
    if (Computed(graph, v) && unplaced_readers[v] == 0) {
      heap.push({score(v), clock++, v});
    }
  }
  std::vector<NodeId> reversed;
  reversed.reserve(total);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    const NodeId v = e.node;
    if (placed[v] || e.score != score(v)) continue;  // stale
    placed[v] = 1;
    reversed.push_back(v);
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.persistent(u)) continue;
      if (placed_readers[u]++ == 0 && freed_by_last_reader(u)) {
        // v is u's last reader in the final order; u's other readers no
        // longer revive it.
        for (NodeId r : graph.readers(u)) {
          if (r == v || placed[r] || !graph.needed()[r]) continue;
          revived[r] -= graph.bytes(u);
          if (unplaced_readers[r] == 0) heap.push({score(r), clock++, r});
        }
      }
      if (--unplaced_readers[u] == 0) heap.push({score(u), clock++, u});
    }
  }
  PEBBLE_CHECK(static_cast<int>(reversed.size()) == total,
               "reverse greedy did not schedule every node");
  return std::vector<NodeId>(reversed.rbegin(), reversed.rend());
}

class GreedyPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    ASSIGN_OR_RETURN(std::vector<NodeId> forward,
                     GreedyOrder(graph, GreedyDirection::kForward));
    ASSIGN_OR_RETURN(std::vector<NodeId> reverse,
                     GreedyOrder(graph, GreedyDirection::kReverse));
    ASSIGN_OR_RETURN(const int64_t forward_peak, OrderPeak(graph, forward));
    ASSIGN_OR_RETURN(const int64_t reverse_peak, OrderPeak(graph, reverse));
    const bool use_reverse = reverse_peak < forward_peak;
    ASSIGN_OR_RETURN(PlanResult result,
                     PlanFromOrder(graph, use_reverse ? reverse : forward, options));
    result.details["direction"] = use_reverse ? "reverse" : "forward";
    result.details["forward_peak_bytes"] = forward_peak;
    result.details["reverse_peak_bytes"] = reverse_peak;
    return result;
  }
};

}  // namespace

absl::StatusOr<std::vector<NodeId>> GreedyOrder(const Graph& graph,
                                                GreedyDirection direction) {
  switch (direction) {
    case GreedyDirection::kForward:
      return ForwardGreedy(graph);
    case GreedyDirection::kReverse:
      return ReverseGreedy(graph);
    case GreedyDirection::kBoth: {
      std::vector<NodeId> forward = ForwardGreedy(graph);
      std::vector<NodeId> reverse = ReverseGreedy(graph);
      ASSIGN_OR_RETURN(const int64_t forward_peak, OrderPeak(graph, forward));
      ASSIGN_OR_RETURN(const int64_t reverse_peak, OrderPeak(graph, reverse));
      return reverse_peak < forward_peak ? reverse : forward;
    }
  }
  return absl::InvalidArgumentError("unknown greedy direction");
}

void RegisterGreedyPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "greedy",
      .description = "list scheduling: always the ready node that leaves the "
                     "least memory resident, forwards and backwards, the lower "
                     "peak kept (XLA's list scheduler); freed at last use",
      .kind = PlanKind::kOneShot,
      .exact = false,
      .factory = [] { return std::make_unique<GreedyPlanner>(); },
  });
}

}  // namespace pebble
