#include "scheduler/remat.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/boost_adapter.h"
#include "graph/status.h"
#include "oneapi/tbb/parallel_for.h"
#include "oneapi/tbb/task_arena.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

// Resident bytes after each step of the baseline schedule, without building
// it: the role-less split of SplitForward takes its (earliest) maximum.
int BaselinePeakPosition(const Graph& graph, const std::vector<NodeId>& order) {
  const int n = graph.num_nodes();
  std::vector<int> last_reader(n, -1);
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    for (NodeId u : graph.unique_inputs(order[i])) last_reader[u] = i;
  }
  int64_t live = 0;
  int64_t best = -1;
  int best_pos = -1;
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const NodeId v = order[i];
    live += graph.bytes(v);
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u) && !graph.is_output(u) && last_reader[u] == i) {
        live -= graph.bytes(u);
      }
    }
    if (last_reader[v] < 0 && !graph.is_output(v)) live -= graph.bytes(v);
    if (live > best) {
      best = live;
      best_pos = i;
    }
  }
  return best_pos;
}

// Note [Shared gathers]. On a sharded graph a parameter read in two places
// of the forward pass (a tied embedding: the first layer and the last) has
// one gather whose forward readers span the whole chain, so no position is
// a separator and the chain has one stage or a few (rotor's least peak on
// an 8-layer decoder sharded over 4 ranks: 497 MiB, 3 stages, against 415
// for FSDP's rule). Such a gather reads only persistent tensors and costs
// the network's time, not the compute's: the chain treats it as an input,
// as it treats the shard it gathers, and each operation (a stage's forward
// sweep or its backward) that reads it gathers it again and frees it after
// (ChainComputes), as FSDP does. The stages' figures leave it out (its
// bytes while an operation holds it; its time): at a byte budget rotor
// simulates its plan and plans again below the budget when it is over; at
// `min`, and in the other policies, the estimate stands. Gathers with one
// forward reader stay in the chain, where the programs decide whether to
// keep them for the backward.
void MarkSharedGathers(const Graph& graph, ForwardPart& part) {
  const int n = graph.num_nodes();
  part.on_demand.assign(n, 0);
  for (NodeId v = 0; v < n; ++v) {
    // (A gather that is a graph output stays: it is resident to the end.)
    if (!part.is_forward[v] || !graph.collective(v) || !graph.needed()[v] ||
        graph.is_output(v)) {
      continue;
    }
    const auto inputs = graph.unique_inputs(v);
    if (!std::all_of(inputs.begin(), inputs.end(),
                     [&](NodeId u) { return graph.persistent(u); })) {
      continue;
    }
    int forward_readers = 0;
    for (NodeId r : graph.readers(v)) forward_readers += part.is_forward[r] ? 1 : 0;
    part.on_demand[v] = forward_readers >= 2 ? 1 : 0;
  }
}

}  // namespace

ForwardPart SplitForward(const Graph& graph) {
  const int n = graph.num_nodes();
  const std::vector<NodeId> order = DefaultOrder(graph);
  ForwardPart part;
  part.is_forward.assign(n, 0);
  bool has_backward = false;
  for (NodeId v : order) has_backward = has_backward || graph.role(v) == Role::kBackward;
  if (has_backward) {
    part.by_role = true;
    for (NodeId v : order) {  // topological: inputs are decided first
      bool forward = graph.role(v) == Role::kForward;
      for (NodeId u : graph.unique_inputs(v)) {
        if (!graph.persistent(u) && !part.is_forward[u]) forward = false;
      }
      part.is_forward[v] = forward ? 1 : 0;
    }
  } else if (!order.empty()) {
    const int split = BaselinePeakPosition(graph, order);
    for (int i = 0; i <= split; ++i) part.is_forward[order[i]] = 1;
  }
  MarkSharedGathers(graph, part);
  std::vector<NodeId> forward;
  for (NodeId v : order) {
    if (part.on_demand[v]) continue;
    if (part.is_forward[v]) {
      forward.push_back(v);
    } else {
      part.backward.push_back(v);
    }
  }
  // Normalisation (Note [Chain view], step 2). Keys: a dead end (forward
  // inputs, no forward reader) right after its last forward input (+0.5); a
  // source (no forward input, some forward reader) just before its first
  // reader's key (-0.25); others keep their position. Every forward edge
  // still goes up: see the case analysis in docs/multi-shot.md.
  std::vector<int> pos(n, -1);
  for (int i = 0; i < static_cast<int>(forward.size()); ++i) pos[forward[i]] = i;
  std::vector<double> key(n, 0.0);
  std::vector<uint8_t> has_input(n, 0), has_reader(n, 0);
  for (NodeId v : forward) {
    for (NodeId u : graph.unique_inputs(v)) {
      if (pos[u] >= 0) {
        has_input[v] = 1;
        has_reader[u] = 1;
      }
    }
  }
  for (NodeId v : forward) {
    key[v] = pos[v];
    if (has_input[v] && !has_reader[v]) {
      int last = -1;
      for (NodeId u : graph.unique_inputs(v)) last = std::max(last, pos[u]);
      key[v] = last + 0.5;
    }
  }
  for (NodeId v : forward) {
    if (!has_input[v] && has_reader[v]) {
      double first = std::numeric_limits<double>::infinity();
      for (NodeId r : graph.readers(v)) {
        if (pos[r] >= 0) first = std::min(first, key[r]);
      }
      key[v] = first - 0.25;
    }
  }
  std::stable_sort(forward.begin(), forward.end(), [&](NodeId a, NodeId b) {
    if (key[a] != key[b]) return key[a] < key[b];
    return pos[a] < pos[b];
  });
  part.forward = std::move(forward);
  return part;
}

ChainView BuildChainView(const Graph& graph) {
  ChainView view;
  view.part = SplitForward(graph);
  const std::vector<NodeId>& fwd = view.part.forward;
  const int m = static_cast<int>(fwd.size());
  view.position.assign(graph.num_nodes(), -1);
  for (int p = 0; p < m; ++p) view.position[fwd[p]] = p;
  int reach = -1;  // furthest forward reader of the positions seen so far
  for (int p = 0; p < m; ++p) {
    const NodeId v = fwd[p];
    int furthest = -1;
    for (NodeId r : graph.readers(v)) {
      if (view.position[r] >= 0) furthest = std::max(furthest, view.position[r]);
    }
    if (p < m - 1 && reach <= p && furthest > p) view.separators.push_back(p);
    reach = std::max(reach, furthest);
  }
  return view;
}

int64_t SequencePeak(const Graph& graph, absl::Span<const NodeId> seq,
                     absl::Span<const InitialNode> initial,
                     const std::function<bool(NodeId)>& keep_after,
                     SequencePeakScratch* scratch) {
  SequencePeakScratch local;
  if (scratch == nullptr) scratch = &local;
  SequencePeakScratch& sc = *scratch;
  if (sc.last.size() < static_cast<size_t>(graph.num_nodes())) {
    sc.last.assign(graph.num_nodes(), -1);
    sc.keep.assign(graph.num_nodes(), -1);
  }
  // Dense per-node state, reset on the way out (only the nodes touched):
  // linear in the sequence, which on a one-stage chain is the whole graph.
  std::vector<NodeId>& touched = sc.touched;
  touched.clear();
  auto touch = [&](NodeId v) {
    if (sc.last[v] == -1 && sc.keep[v] == -1) touched.push_back(v);
  };
  for (int i = 0; i < static_cast<int>(seq.size()); ++i) {
    for (NodeId u : graph.unique_inputs(seq[i])) {
      touch(u);
      sc.last[u] = i;  // ascending i: the last read wins
    }
  }
  // Whether a tracked node is kept: every entry for it must say keep (a
  // node both initial and in `seq` is dropped when either drops it).
  auto track = [&](NodeId v, bool keep) {
    touch(v);
    sc.keep[v] = sc.keep[v] == -1 ? (keep ? 1 : 0) : (sc.keep[v] & (keep ? 1 : 0));
  };
  int64_t live = 0;
  for (const InitialNode& init : initial) {
    if (init.node == kNoNode || graph.persistent(init.node)) continue;
    if (!init.keep && sc.last[init.node] < 0) continue;
    live += graph.bytes(init.node);
    track(init.node, init.keep);
  }
  for (NodeId v : seq) track(v, keep_after(v));
  int64_t peak = live;
  for (int i = 0; i < static_cast<int>(seq.size()); ++i) {
    const NodeId v = seq[i];
    live += graph.bytes(v);
    peak = std::max(peak, live + graph.workspace(v));
    for (NodeId u : graph.unique_inputs(v)) {
      if (sc.keep[u] == 0 && sc.last[u] == i) live -= graph.bytes(u);
    }
    if (!keep_after(v) && sc.last[v] < 0) live -= graph.bytes(v);
  }
  for (NodeId v : touched) {
    sc.last[v] = -1;
    sc.keep[v] = -1;
  }
  return peak;
}

namespace {

// CollapseChain's steps (Note [Chain view]), each filling the chain as far
// as it goes: the forward stages, the backward nodes' stages, the late loss,
// the frontiers, then each stage's sets, costs and peaks.
class ChainCollapser {
 public:
  ChainCollapser(const Graph& graph, const ChainView& view, Chain& chain)
      : graph_(graph),
        part_(view.part),
        chain_(chain),
        stage_of_(graph.num_nodes(), -1),
        boundary_stage_(graph.num_nodes(), -1),
        irregular_(graph.num_nodes(), 0),
        lowest_reader_(graph.num_nodes(), std::numeric_limits<int>::max()),
        mark_(graph.num_nodes(), 0),
        in_saved_(graph.num_nodes(), 0) {}

  void AssignForward(const std::vector<int>& boundaries);
  void PlaceBackward(BackwardPlacement placement);
  void PlaceLoss(LossPlacement loss);
  void FillFrontiers();
  void FillStage(int i);

 private:
  int num_stages() const { return chain_.num_stages(); }
  // The cone of a_i (bit 1) and the saved set S_i with its closure and the
  // stage's outputs (bit 2) in mark_; S_i's own nodes in in_saved_.
  void MarkStageSets(int i);
  void StagePeaks(int i);

  const Graph& graph_;
  const ForwardPart& part_;
  Chain& chain_;
  std::vector<int> stage_of_;
  std::vector<int> boundary_stage_;  // a_i -> i
  std::vector<uint8_t> irregular_;
  // Per backward node: the lowest stage whose backward reads it.
  std::vector<int> lowest_reader_;
  std::vector<uint8_t> mark_, in_saved_;  // FillStage's, reset after each stage
  SequencePeakScratch scratch_;
};

void ChainCollapser::AssignForward(const std::vector<int>& boundaries) {
  const std::vector<NodeId>& fwd = part_.forward;
  const int m = static_cast<int>(fwd.size());
  chain_.stages.resize(boundaries.size() + 1);
  int s = 0;
  for (int p = 0; p < m; ++p) {
    stage_of_[fwd[p]] = s;
    chain_.stages[s].forward.push_back(fwd[p]);
    const bool end = (s < num_stages() - 1 && boundaries[s] == p) || p == m - 1;
    if (end) {
      chain_.stages[s].output = fwd[p];
      boundary_stage_[fwd[p]] = s;
      ++s;
    }
  }
  PEBBLE_CHECK(s == num_stages(), "boundaries must be ascending forward positions");
  for (int i = 1; i < num_stages(); ++i) chain_.stages[i].input = chain_.stages[i - 1].output;
}

void ChainCollapser::PlaceBackward(BackwardPlacement placement) {
  // Backward stages (Note [Chain view], step 3), in topological order.
  for (NodeId b : part_.backward) {
    int hi = num_stages() - 1;
    for (NodeId u : graph_.unique_inputs(b)) {
      if (!graph_.persistent(u) && !part_.is_forward[u]) hi = std::min(hi, stage_of_[u]);
    }
    int lo = 0, up = hi, up_low = hi;
    for (NodeId u : graph_.unique_inputs(b)) {
      if (graph_.persistent(u) || !part_.is_forward[u] || part_.on_demand[u]) continue;
      int a = stage_of_[u], c = stage_of_[u];
      if (boundary_stage_[u] >= 0) c = std::min(a + 1, num_stages() - 1);
      lo = std::max(lo, a);
      up = std::min(up, c);
      up_low = std::min(up_low, a);
    }
    int s = up;
    if (placement == BackwardPlacement::kWithProducer && lo <= up_low) s = up_low;
    if (lo > up) {
      irregular_[b] = 1;
      chain_.irregular.push_back(b);
      s = std::min(hi, std::max(0, up));
    }
    stage_of_[b] = s;
  }
  // A backward node that reads no stage's node (only persistent tensors and
  // shared gathers) would go to the top stage, and be held from the start
  // of the backward to its readers: it goes to its first reader's stage.
  for (auto it = part_.backward.rbegin(); it != part_.backward.rend(); ++it) {
    const NodeId b = *it;
    const auto inputs = graph_.unique_inputs(b);
    if (inputs.empty() || irregular_[b] ||
        !std::all_of(inputs.begin(), inputs.end(), [&](NodeId u) {
          return graph_.persistent(u) || part_.on_demand[u];
        })) {
      continue;
    }
    int first = -1;  // the highest stage of a backward reader: the first to run
    for (NodeId r : graph_.readers(b)) {
      if (!part_.is_forward[r] && stage_of_[r] >= 0) first = std::max(first, stage_of_[r]);
    }
    if (first >= 0) stage_of_[b] = std::min(stage_of_[b], first);
  }
  for (NodeId b : part_.backward) chain_.stages[stage_of_[b]].backward.push_back(b);
  std::sort(chain_.irregular.begin(), chain_.irregular.end());
}

void ChainCollapser::PlaceLoss(LossPlacement loss) {
  // Note [Late loss]: the last stage's forward part, when it is all sinks,
  // becomes the end of its backward part.
  if (loss == LossPlacement::kEarly) return;
  ChainStage& top = chain_.stages[num_stages() - 1];
  const bool sinks = std::all_of(top.forward.begin(), top.forward.end(), [&](NodeId v) {
    return graph_.is_output(v) && graph_.readers(v).empty();
  });
  if (!sinks || num_stages() <= 1) return;
  if (loss == LossPlacement::kAfterBackward) {
    top.backward.insert(top.backward.end(), top.forward.begin(), top.forward.end());
  }
  top.forward.clear();
  chain_.late_loss = true;
}

void ChainCollapser::FillFrontiers() {
  // A backward non-output node is resident from its stage down to the
  // lowest stage that reads it.
  for (NodeId b : part_.backward) {
    for (NodeId u : graph_.unique_inputs(b)) {
      if (!graph_.persistent(u) && !part_.is_forward[u]) {
        lowest_reader_[u] = std::min(lowest_reader_[u], stage_of_[b]);
      }
    }
  }
  for (NodeId b : part_.backward) {  // ascending ids per stage below
    if (graph_.is_output(b) || lowest_reader_[b] >= stage_of_[b]) continue;
    for (int j = lowest_reader_[b]; j < stage_of_[b]; ++j) {
      chain_.stages[j].frontier.push_back(b);
      chain_.stages[j].frontier_bytes += graph_.bytes(b);
    }
  }
  for (ChainStage& st : chain_.stages) std::sort(st.frontier.begin(), st.frontier.end());
}

void ChainCollapser::MarkStageSets(int i) {
  ChainStage& st = chain_.stages[i];
  const bool last = i == num_stages() - 1;
  // Marks the stage's inputs of each marked node with `bit`, backwards.
  auto close = [&](uint8_t bit) {
    for (int k = static_cast<int>(st.forward.size()) - 1; k >= 0; --k) {
      const NodeId v = st.forward[k];
      if (!(mark_[v] & bit)) continue;
      for (NodeId u : graph_.unique_inputs(v)) {
        if (stage_of_[u] == i && part_.is_forward[u]) mark_[u] |= bit;
      }
    }
  };
  for (NodeId v : st.forward) mark_[v] = 0;
  mark_[st.output] = 1;
  close(1);
  for (NodeId b : st.backward) {
    for (NodeId u : graph_.unique_inputs(b)) {
      if (part_.is_forward[u] && stage_of_[u] == i && !in_saved_[u]) {
        in_saved_[u] = 1;
        st.saved_bytes += graph_.bytes(u);
        if (u == st.output) {
          st.output_saved = true;
        } else {
          st.saved_extra_bytes += graph_.bytes(u);
        }
      }
      if (u == st.input) st.backward_reads_input = true;
    }
  }
  for (NodeId v : st.forward) {
    if (in_saved_[v] || graph_.is_output(v)) mark_[v] |= 2;
    if (graph_.is_output(v)) {
      if (last) {
        st.permanent_bytes += graph_.bytes(v);
      } else {
        chain_.fixed_bytes += graph_.bytes(v);
      }
    }
  }
  close(2);
}

void ChainCollapser::StagePeaks(int i) {
  ChainStage& st = chain_.stages[i];
  const bool last = i == num_stages() - 1;
  const NodeId out = st.output;
  auto is_out = [&](NodeId v) { return graph_.is_output(v); };
  for (int keep = 0; keep < 2; ++keep) {
    const InitialNode in[] = {{st.input, keep == 1}};
    st.cone_peak[keep] = SequencePeak(graph_, st.cone, in, [&](NodeId v) {
      return v == out || is_out(v);
    }, &scratch_);
    st.all_peak[keep] = SequencePeak(graph_, st.all, in, [&](NodeId v) {
      return v == out || in_saved_[v] || is_out(v);
    }, &scratch_);
    st.saved_peak[keep] = SequencePeak(graph_, st.saved, in, [&](NodeId v) {
      return in_saved_[v] || is_out(v);
    }, &scratch_);
    std::vector<InitialNode> init = {{st.input, keep == 1}};
    for (NodeId v : st.forward) {
      if (in_saved_[v] || (last && is_out(v))) init.push_back({v, is_out(v)});
    }
    for (NodeId f : st.frontier) init.push_back({f, lowest_reader_[f] < i});
    st.backward_peak[keep] = SequencePeak(graph_, st.backward, init, [&](NodeId v) {
      return is_out(v) || lowest_reader_[v] < i;
    }, &scratch_);
  }
}

void ChainCollapser::FillStage(int i) {
  ChainStage& st = chain_.stages[i];
  st.input_bytes = st.input == kNoNode ? 0 : graph_.bytes(st.input);
  st.output_bytes = graph_.bytes(st.output);
  MarkStageSets(i);
  for (NodeId v : st.forward) {
    if (mark_[v] & 1) {
      st.cone.push_back(v);
      st.cone_cost += graph_.cost(v);
    }
    if (mark_[v] & 2) {
      st.saved.push_back(v);
      st.saved_cost += graph_.cost(v);
    }
    if (mark_[v] != 0) {
      st.all.push_back(v);
      st.all_cost += graph_.cost(v);
    }
  }
  for (NodeId b : st.backward) {
    st.backward_cost += graph_.cost(b);
    if (graph_.is_output(b)) st.permanent_bytes += graph_.bytes(b);
  }
  StagePeaks(i);
  for (NodeId v : st.forward) {
    in_saved_[v] = 0;
    mark_[v] = 0;
  }
  mark_[st.output] = 0;  // not in `forward` after a late loss
}

}  // namespace

Chain CollapseChain(const Graph& graph, const ChainView& view,
                    const std::vector<int>& boundaries, BackwardPlacement placement,
                    LossPlacement loss) {
  Chain chain;
  chain.fixed_bytes = graph.persistent_bytes();
  chain.on_demand = view.part.on_demand;
  if (view.part.forward.empty()) return chain;
  ChainCollapser collapser(graph, view, chain);
  collapser.AssignForward(boundaries);
  collapser.PlaceBackward(placement);
  collapser.PlaceLoss(loss);
  collapser.FillFrontiers();
  for (int i = 0; i < chain.num_stages(); ++i) collapser.FillStage(i);
  return chain;
}

std::vector<ChainOp> CheckpointOps(const Chain& chain, const std::vector<int>& kept) {
  const int L = chain.num_stages();
  std::vector<ChainOp> ops;
  if (L == 0) return ops;
  // Segments [begin_j, end_j].
  std::vector<std::pair<int, int>> segments;
  int begin = 0;
  for (int c : kept) {
    PEBBLE_CHECK(c >= begin && c < L - 1, "checkpoints must be ascending stages < L-1");
    segments.emplace_back(begin, c);
    begin = c + 1;
  }
  segments.emplace_back(begin, L - 1);
  const int num = static_cast<int>(segments.size());
  for (int j = 0; j + 1 < num; ++j) {
    for (int i = segments[j].first; i <= segments[j].second; ++i) {
      ops.push_back({ChainOpKind::kForward, i});
    }
  }
  for (int j = num - 1; j >= 0; --j) {
    const auto [a, b] = segments[j];
    for (int i = a; i < b; ++i) ops.push_back({ChainOpKind::kForwardAll, i});
    ops.push_back({ChainOpKind::kForwardSaved, b});
    for (int i = b; i >= a; --i) ops.push_back({ChainOpKind::kBackward, i});
  }
  return ops;
}

std::vector<NodeId> ChainComputes(const Graph& graph, const Chain& chain,
                                  const std::vector<ChainOp>& ops) {
  const int n = graph.num_nodes();
  std::vector<uint8_t> computed(n, 0);
  std::vector<NodeId> seq;
  std::vector<std::pair<NodeId, int>> stack;  // on-demand DFS: node, next input
  // Note [Shared gathers]: the operation that last made each one.
  std::vector<int> made_in(n, -1);
  int op_index = 0;
  const auto missing = [&](NodeId u) {
    if (graph.persistent(u)) return false;
    if (!computed[u]) return true;
    return !chain.on_demand.empty() && chain.on_demand[u] && made_in[u] != op_index;
  };
  auto append = [&](NodeId v) {
    if (computed[v] && graph.is_output(v)) return;
    // Never-computed inputs first, in post-order (irregular graphs only).
    stack.clear();
    stack.emplace_back(v, 0);
    while (!stack.empty()) {
      auto& [x, k] = stack.back();
      const auto inputs = graph.unique_inputs(x);
      if (k < static_cast<int>(inputs.size())) {
        const NodeId u = inputs[k++];
        if (missing(u)) stack.emplace_back(u, 0);
        continue;
      }
      const NodeId done = x;
      stack.pop_back();
      if (done != v && !missing(done)) continue;  // reached twice in the DFS
      seq.push_back(done);
      computed[done] = 1;
      made_in[done] = op_index;
    }
  };
  for (const ChainOp& op : ops) {
    ++op_index;
    const ChainStage& st = chain.stages[op.stage];
    const std::vector<NodeId>* list = nullptr;
    switch (op.kind) {
      case ChainOpKind::kForward: list = &st.cone; break;
      case ChainOpKind::kForwardAll: list = &st.all; break;
      case ChainOpKind::kForwardSaved: list = &st.saved; break;
      case ChainOpKind::kBackward: list = &st.backward; break;
    }
    for (NodeId v : *list) append(v);
  }
  // Outputs no operation made (a chain without stages, or outputs outside
  // the forward and backward lists) are computed at the end.
  for (NodeId o : graph.outputs()) {
    if (!graph.persistent(o) && !computed[o]) append(o);
  }
  return seq;
}

Schedule ScheduleFromComputes(const Graph& graph, const std::vector<NodeId>& computes) {
  const int n = graph.num_nodes();
  const int T = static_cast<int>(computes.size());
  std::vector<int> current(n, -1);
  std::vector<int> last_read(T, -1);
  for (int p = 0; p < T; ++p) {
    const NodeId v = computes[p];
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.persistent(u)) continue;
      PEBBLE_CHECK(current[u] >= 0, "compute sequence reads a node never computed");
      last_read[current[u]] = p;
    }
    current[v] = p;
  }
  std::vector<uint8_t> final_keep(T, 0);
  for (NodeId o : graph.outputs()) {
    if (!graph.persistent(o) && current[o] >= 0) final_keep[current[o]] = 1;
  }
  std::fill(current.begin(), current.end(), -1);
  Schedule schedule;
  schedule.steps.reserve(2 * static_cast<size_t>(T));
  for (int p = 0; p < T; ++p) {
    const NodeId v = computes[p];
    schedule.steps.push_back({Action::kCompute, v});
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.persistent(u)) continue;
      const int q = current[u];
      if (last_read[q] == p && !final_keep[q]) schedule.steps.push_back({Action::kFree, u});
    }
    current[v] = p;
    if (last_read[p] < 0 && !final_keep[p]) schedule.steps.push_back({Action::kFree, v});
  }
  return schedule;
}

Schedule EmitChainOps(const Graph& graph, const Chain& chain,
                      const std::vector<ChainOp>& ops) {
  return ScheduleFromComputes(graph, ChainComputes(graph, chain, ops));
}

double CostEpsilon(const Graph& graph) {
  double sum = 0;
  int count = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.needed()[v] && !graph.persistent(v) && graph.cost(v) > 0) {
      sum += graph.cost(v);
      ++count;
    }
  }
  return count == 0 ? 1e-9 : 1e-9 * sum / count;
}

bool PlanSelector::fits(int64_t peak) const {
  return options_.budget_bytes == PlannerOptions::kMinBudget ||
         peak <= options_.budget_bytes;
}

bool PlanSelector::Better(const Figures& a, const Figures& b) const {
  // Costs are sums of doubles in different orders: equal within 1e-9.
  const double tol = 1e-9 * std::max(std::abs(a.compute_cost), std::abs(b.compute_cost));
  const bool cheaper = a.compute_cost < b.compute_cost - tol;
  const bool same_cost = std::abs(a.compute_cost - b.compute_cost) <= tol;
  if (options_.budget_bytes != PlannerOptions::kMinBudget) {
    const bool fa = fits(a.peak_bytes), fb = fits(b.peak_bytes);
    if (fa != fb) return fa;
    if (fa) return cheaper || (same_cost && a.peak_bytes < b.peak_bytes);
  }
  return a.peak_bytes < b.peak_bytes || (a.peak_bytes == b.peak_bytes && cheaper);
}

PlanSelector::Figures PlanSelector::Evaluate(const Schedule& schedule) const {
  SimulatorOptions sim;
  sim.host_bandwidth_bytes_per_s = options_.host_bandwidth_bytes_per_s;
  absl::StatusOr<PlanReport> report = SimulateCandidate(graph_, schedule, sim);
  PEBBLE_CHECK(report.ok(), "a multi-shot heuristic emitted an invalid schedule");
  return Figures{report->peak_bytes, report->compute_cost};
}

PlanSelector::Figures PlanSelector::Consider(Schedule schedule, nlohmann::json details) {
  const Figures f = Evaluate(schedule);
  Take(f, std::move(schedule), std::move(details));
  return f;
}

void PlanSelector::Take(const Figures& f, Schedule schedule, nlohmann::json details) {
  ++considered_;
  if (!has_best_ || Better(f, best_)) {
    has_best_ = true;
    best_ = f;
    best_schedule_ = std::move(schedule);
    best_details_ = std::move(details);
  }
}

void PlanSelector::ConsiderEach(int n, const CandidateMaker& make) {
  struct Made {
    Schedule schedule;
    nlohmann::json details;
    Figures figures;
  };
  // A batch keeps every thread busy while the deadline is checked often.
  const int batch = std::max(1, 4 * oneapi::tbb::this_task_arena::max_concurrency());
  for (int first = 0; first < n && !TimeUp(); first += batch) {
    const int count = std::min(batch, n - first);
    std::vector<Made> made(count);
    oneapi::tbb::parallel_for(0, count, [&](int k) {
      auto [schedule, details] = make(first + k);
      const Figures figures = Evaluate(schedule);
      made[k] = {std::move(schedule), std::move(details), figures};
    });
    for (Made& m : made) Take(m.figures, std::move(m.schedule), std::move(m.details));
  }
}

absl::StatusOr<PlanResult> PlanSelector::Finish() {
  PEBBLE_CHECK(has_best_, "PlanSelector::Finish without candidates");
  ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph_, std::move(best_schedule_), options_));
  if (best_details_.is_object()) {
    for (auto it = best_details_.begin(); it != best_details_.end(); ++it) {
      result.details[it.key()] = it.value();
    }
  }
  result.details["candidates_simulated"] = considered_;
  if (deadline_.hit()) {
    NoteTimeLimit(result, deadline_.limit_s(),
                  absl::StrCat("the best of ", considered_, " candidates found so far"));
  }
  has_best_ = false;
  return result;
}

Schedule BaselineSchedule(const Graph& graph) {
  absl::StatusOr<Schedule> s = FreeAtLastUse(graph, DefaultOrder(graph));
  PEBBLE_CHECK(s.ok(), "the graph's own order is always a valid order");
  return *std::move(s);
}

absl::StatusOr<PlanResult> PlanCheckpointCandidates(
    const Graph& graph, const PlannerOptions& options, const ChainView& view,
    const Chain& chain, const std::vector<CheckpointCandidate>& candidates,
    nlohmann::json details, std::chrono::steady_clock::time_point started) {
  PlanSelector selector(graph, options, started);
  selector.Consider(BaselineSchedule(graph),
                    {{"plan", "baseline"}, {"checkpoints", nlohmann::json::array()}});
  // Distinct checkpoint sets, first occurrence first; the baseline is a
  // valid plan already, so a time limit may cut the rest.
  std::vector<const CheckpointCandidate*> distinct;
  std::set<std::vector<int>> seen;
  for (const CheckpointCandidate& c : candidates) {
    if (seen.insert(c.kept).second) distinct.push_back(&c);
  }
  selector.ConsiderEach(static_cast<int>(distinct.size()), [&](int i) {
    const CheckpointCandidate& c = *distinct[i];
    nlohmann::json d = c.details;
    d["plan"] = "checkpoints";
    nlohmann::json ids = nlohmann::json::array();
    for (int s : c.kept) ids.push_back(graph.id(chain.stages[s].output));
    d["checkpoints"] = std::move(ids);
    return std::make_pair(EmitChainOps(graph, chain, CheckpointOps(chain, c.kept)),
                          std::move(d));
  });
  ASSIGN_OR_RETURN(PlanResult result, selector.Finish());
  for (auto it = details.begin(); it != details.end(); ++it) {
    result.details[it.key()] = it.value();
  }
  result.details["chain"] = ChainSummary(graph, view, chain);
  return result;
}

std::vector<int> EvenCheckpoints(int num_stages, int k) {
  PEBBLE_CHECK(k >= 1 && k <= std::max(1, num_stages), "segment count out of range");
  std::vector<int> kept;
  for (int j = 0; j + 1 < k; ++j) {
    const int end = static_cast<int>((static_cast<int64_t>(j + 1) * num_stages) / k) - 1;
    if (end >= 0 && end < num_stages - 1 && (kept.empty() || end > kept.back())) {
      kept.push_back(end);
    }
  }
  return kept;
}

nlohmann::json ChainSummary(const Graph& graph, const ChainView& view,
                            const Chain& chain) {
  nlohmann::json irregular = nlohmann::json::array();
  for (size_t k = 0; k < chain.irregular.size() && k < 10; ++k) {
    irregular.push_back(graph.id(chain.irregular[k]));
  }
  return {{"forward_nodes", view.part.forward.size()},
          {"forward_by_role", view.part.by_role},
          {"separators", view.separators.size()},
          {"stages", chain.num_stages()},
          {"irregular_backward_nodes", chain.irregular.size()},
          {"irregular_examples", irregular}};
}

}  // namespace pebble
