// The `vdnn` policy: Rhu, Gimelshein, Clemons, Zulfiqar and Keckler, "vDNN:
// Virtualized Deep Neural Networks for Scalable, Memory-Efficient Neural
// Network Design" (MICRO 2016).
//
// Note [vDNN as a planner]. vDNN runs the framework's order (here the
// graph's own order, freed at last use) and offloads the input feature maps
// of a set of layers: each is copied to the host while its layer computes
// forwards, released once the layer is done (the release waits for the copy:
// vDNN synchronises the streams at the end of each layer, and SPEC section
// 4's free waits for the offload, which is the same stall), and prefetched
// one layer ahead of its backward use: when the backward pass reaches the
// layer above (the offloaded tensor read first before it, in backward
// order), the prefetch is issued. Variants, as in the paper: vDNN_conv,
// the inputs of the heavy layers (convolution, linear, matmul: IsHeavyOp),
// and vDNN_all, the inputs of every forward layer. vDNN_dyn, which the paper
// recommends, tries no offload first, then the variants, and keeps the
// fastest that fits; that is what this policy does, by simulated makespan
// (with --budget min: the lowest peak). On a graph with no heavy operator
// (pebbling graphs, "generic" ops) vDNN_conv offloads nothing and
// vDNN_all treats every forward node as a layer; the forward part is
// SplitForward's (remat.h). A tensor is offloaded in the gap between its
// last forward use and its first backward use; one the backward pass does
// not read is left alone. With --host-budget the tensors are taken in
// forward order while their bytes fit.
// Not optimal by design: it ignores the budget (everything eligible is
// offloaded) and hides nothing deliberately: on element-wise layers the
// round trip is exposed.
#include <algorithm>
#include <memory>
#include <vector>

#include "graph/status.h"
#include "scheduler/offload.h"
#include "scheduler/policies.h"
#include "scheduler/remat.h"

namespace pebble {
namespace {

// The vDNN intervals for the layers selected by `is_layer`.
std::vector<SwapInterval> VdnnSwaps(const ComputeSequence& seq, const ForwardPart& part,
                                    const std::vector<uint8_t>& is_layer,
                                    const PlannerOptions& options) {
  const Graph& g = seq.graph();
  const int T = seq.size();
  int first_backward = T;
  for (int p = 0; p < T; ++p) {
    if (!part.is_forward[seq.node(p)]) {
      first_backward = p;
      break;
    }
  }
  // Instances read by a layer, in forward order of production.
  std::vector<uint8_t> chosen(T, 0);
  {
    std::vector<int> current(g.num_nodes(), -1);
    for (int p = 0; p < T; ++p) {
      const NodeId v = seq.node(p);
      if (part.is_forward[v] && is_layer[v]) {
        for (NodeId u : g.unique_inputs(v)) {
          if (!g.persistent(u) && current[u] >= 0) chosen[current[u]] = 1;
        }
      }
      current[v] = p;
    }
  }
  struct Item {
    int instance, a, b;
  };
  std::vector<Item> items;
  int64_t host = 0;
  for (int i = 0; i < T; ++i) {
    if (!chosen[i] || seq.final_output(i) || g.bytes(seq.node(i)) == 0) continue;
    int a = i, b = -1;
    for (int r : seq.readers(i)) {
      if (part.is_forward[seq.node(r)]) {
        a = r;
      } else {
        b = r;
        break;
      }
    }
    if (b < 0 || b < a + 2) continue;
    if (options.host_budget_bytes.has_value() &&
        host + g.bytes(seq.node(i)) > *options.host_budget_bytes) {
      continue;
    }
    host += g.bytes(seq.node(i));
    items.push_back({i, a, b});
  }
  // One layer ahead: the prefetch of the j-th tensor in backward order goes
  // where the (j-1)-th is first read; the first one at the backward start.
  std::vector<int> by_use(items.size());
  for (size_t k = 0; k < by_use.size(); ++k) by_use[k] = static_cast<int>(k);
  std::stable_sort(by_use.begin(), by_use.end(),
                   [&](int x, int y) { return items[x].b < items[y].b; });
  std::vector<SwapInterval> swaps;
  int ahead = first_backward;
  for (int k : by_use) {
    const Item& it = items[k];
    const int q = std::min(it.b, std::max(ahead, it.a + 2));
    if (q >= it.a + 2) swaps.push_back({it.instance, it.a, q});
    ahead = it.b;
  }
  std::sort(swaps.begin(), swaps.end(), [](const SwapInterval& x, const SwapInterval& y) {
    return x.instance < y.instance;
  });
  return swaps;
}

}  // namespace

absl::StatusOr<PlanResult> PlanVdnn(const Graph& graph, const PlannerOptions& options) {
  const ComputeSequence seq(graph, DefaultOrder(graph));
  const ForwardPart part = SplitForward(graph);
  MakespanSelector selector(graph, options);
  const PlanReport& none =
      selector.Consider(EmitSwapSchedule(seq, {}), {{"variant", "none"}, {"offloaded", 0}});
  const bool fits = options.budget_bytes != PlannerOptions::kMinBudget &&
                    none.peak_bytes <= options.budget_bytes;
  if (!fits) {
    std::vector<uint8_t> heavy(graph.num_nodes(), 0), all(graph.num_nodes(), 0);
    for (NodeId v = 0; v < graph.num_nodes(); ++v) {
      heavy[v] = IsHeavyOp(graph.op(v)) ? 1 : 0;
      all[v] = 1;
    }
    for (const auto& [name, layers] :
         {std::pair<const char*, const std::vector<uint8_t>*>{"conv", &heavy},
          std::pair<const char*, const std::vector<uint8_t>*>{"all", &all}}) {
      if (selector.TimeUp()) break;  // "none" is a valid plan already
      std::vector<SwapInterval> swaps = VdnnSwaps(seq, part, *layers, options);
      if (swaps.empty()) continue;
      const int count = static_cast<int>(swaps.size());
      selector.Consider(EmitSwapSchedule(seq, swaps), {{"variant", name}, {"offloaded", count}});
    }
  }
  return selector.Finish();
}

namespace {

class VdnnPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    return PlanVdnn(graph, options);
  }
};

}  // namespace

void RegisterVdnnPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "vdnn",
      .description = "vDNN (Rhu et al. 2016): offload the inputs of convolution and matrix "
                     "layers (or of every layer) after their forward use, prefetch each one "
                     "layer ahead of its backward use; the fastest variant that fits",
      .kind = PlanKind::kOffload,
      .exact = false,
      .factory = [] { return std::make_unique<VdnnPlanner>(); },
  });
}

}  // namespace pebble
