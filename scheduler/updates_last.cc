#include "scheduler/updates_last.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/state_placement.h"
#include "scheduler/update_placement.h"

namespace pebble {

// Note [Updates last]. An optimizer updates each parameter in place, and
// nothing may read the parameter's earlier value after that: not the data
// gradient that reads the weight, not a recomputation of a forward node.
// Rather than teach every policy that rule, the policy plans the step
// without its updates, keeping what they read, and the updates run at the
// end, where no other compute follows. This keeps every gradient until the
// end, as plans without an optimizer do; running an update as soon as its
// gradient is complete (and freeing the gradient then) is a later policy's
// choice, which the simulator's rules already allow.
//
// Optimizer state whose home is the host (state=host; only updates read it)
// is left out of the planned graph as well, so the forward and backward run
// without it. The update phase streams it: before the first update that
// touches a state tensor, prefetch it; after the last one, offload it (its
// host copy is stale after the write) and free it. Device memory then holds
// one parameter's state at a time on top of the step's end, and the copies
// cost two transfers of the state per step (docs/training.md).

constexpr absl::string_view kSinkPrefix = "update_sink:";

// Whether only in-place updates read v (an optimizer's state).
bool OnlyUpdatesRead(const Graph& graph, NodeId v) {
  for (NodeId r : graph.readers(v)) {
    if (!graph.in_place(r)) return false;
  }
  return true;
}

bool UpdatedParameter(const Graph& graph, NodeId v) {
  if (graph.role(v) != Role::kParameter || !graph.persistent(v)) return false;
  for (NodeId r : graph.readers(v)) {
    if (graph.in_place(r) && graph.storage(r) == v) return true;
  }
  return false;
}

namespace {

// Note [Parameters streamed]. A parameter whose home is the host is read
// by the forward and by the backward, so it cannot be left out of the
// planned graph as streamed state is: the policy plans the step with it
// resident, and this pass then keeps a device copy only around its uses.
// Its uses are the compute steps that read its storage (a view of it
// included), and a view's free. Uses with at least kMinStreamGap compute
// steps between them, and no view of it resident in between (a view
// holds the storage), are in different windows; each window prefetches
// the parameter before the compute step that precedes its first use (so
// the copy overlaps that compute) and frees it after its last use. The
// device then holds the parameter only where the policy's plan used it,
// which the policy had counted, so the peak is that plan's or lower; the
// price is a copy per window (two per step for a layer's weight: its
// forward and its backward), plus the update's (Note [Updates last]). The
// policy does not know the memory this frees (PlanStreamed makes up for
// some of that); a recomputation that reads a parameter fetches it again.
constexpr int kMinStreamGap = 2;

// Whether v is a parameter streamed to its uses (home host, updated).
bool StreamedParameter(const Graph& graph, NodeId v) {
  return graph.home(v) == Tier::kHost && UpdatedParameter(graph, v);
}

// Bytes of the parameters streamed to their uses.
int64_t StreamedParameterBytes(const Graph& graph) {
  int64_t bytes = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (StreamedParameter(graph, v)) bytes += graph.bytes(v);
  }
  return bytes;
}

// `steps` with the views of each persistent storage marked in `of` freed
// right after their last use instead of later: a view of a persistent
// storage holds no bytes of its own, so no figure changes, but it holds
// the storage (the policies' plans free views at the step's end,
// alias_fold.h), which an update on the host writes and a streamed
// parameter leaves the device with.
std::vector<Step> FreeViewsEarly(const Graph& graph, const std::vector<Step>& steps,
                                 const std::vector<uint8_t>& of) {
  const int n = graph.num_nodes();
  // Per view: its last use (the compute that made it or read it) and its
  // last free, where that free ends its last residency.
  std::vector<int> last_use(n, -1), last_free(n, -1);
  for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
    const Step& step = steps[i];
    if (step.action == Action::kFree) {
      last_free[step.node] = i;
    } else if (step.action == Action::kCompute) {
      last_use[step.node] = i;
      last_free[step.node] = -1;
      for (NodeId u : graph.unique_inputs(step.node)) last_use[u] = i;
    }
  }
  std::vector<uint8_t> moved(steps.size(), 0);
  std::vector<std::vector<Step>> after(steps.size());
  for (NodeId v = 0; v < n; ++v) {
    if (!graph.is_alias(v) || graph.in_place(v) || !of[graph.storage(v)] ||
        !graph.persistent(graph.storage(v)) || last_free[v] < 0 || last_use[v] < 0 ||
        last_free[v] <= last_use[v] + 1) {
      continue;
    }
    int at = last_use[v];  // not inside a bucket of collectives: after it
    while (at + 1 < static_cast<int>(steps.size()) && steps[at + 1].joins_bucket) ++at;
    if (last_free[v] <= at + 1) continue;
    moved[last_free[v]] = 1;
    after[at].push_back(steps[last_free[v]]);
  }
  std::vector<Step> out;
  out.reserve(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!moved[i]) out.push_back(steps[i]);
    out.insert(out.end(), after[i].begin(), after[i].end());
  }
  return out;
}


// Note [Views of streamed parameters]: a view of a streamed parameter (the
// transpose of a weight that the forward reads and, much later, the
// backward: PyTorch's captures have one per Linear layer) holds the
// parameter's storage while it is resident, and so keeps the parameter on
// the device across the gap (Note [Parameters streamed]). A view of the
// parameter alone (it reads nothing else and is no output) that is read by
// two compute steps with at least kMinStreamGap compute steps between
// them, with no write of the parameter's storage in between and no view of
// it resident at the second, is freed after the first and computed again
// before the second (the backward's read is often a view of it: PyTorch's
// t(t(weight))): a view holds no bytes of its own and costs its own cost
// (next to none), and the parameter's uses then fall in two windows. Steps
// of a bucket of collectives are left as they are.
std::vector<Step> RecomputeViewsOfStreamed(const Graph& graph, const std::vector<Step>& steps,
                                           const std::vector<uint8_t>& streamed) {
  const int num_nodes = graph.num_nodes();
  std::vector<uint8_t> candidate(num_nodes, 0);
  for (NodeId w = 0; w < num_nodes; ++w) {
    const NodeId base = graph.alias_of(w);
    candidate[w] = base != kNoNode && !graph.in_place(w) && base == graph.storage(w) &&
                   streamed[base] && !graph.is_output(w) && graph.unique_inputs(w).size() == 1;
  }
  const int n = static_cast<int>(steps.size());
  auto in_bucket = [&](int i) {
    return steps[i].joins_bucket || (i + 1 < n && steps[i + 1].joins_bucket);
  };
  std::vector<int> last_read(num_nodes, -1);  // per resident candidate: its last read's step
  std::vector<int> computes_at(num_nodes, 0);  // compute steps up to and including it
  std::vector<int> written_at(num_nodes, -1);  // per storage: its last in-place write's step
  std::vector<int> views_of(num_nodes, 0);  // per candidate: its resident views
  std::vector<std::vector<Step>> before(n), after(n);
  bool any = false;
  int computes = 0;
  for (int i = 0; i < n; ++i) {
    const Step& step = steps[i];
    const NodeId v = step.node;
    const NodeId of = v >= 0 && v < num_nodes ? graph.alias_of(v) : kNoNode;
    if (step.action == Action::kFree && candidate[v]) last_read[v] = -1;
    if (step.action == Action::kFree && of != kNoNode && candidate[of]) --views_of[of];
    if (step.action != Action::kCompute) continue;
    ++computes;
    for (NodeId w : graph.unique_inputs(v)) {
      if (!candidate[w] || last_read[w] < 0) continue;
      const int from = last_read[w];
      const NodeId base = graph.alias_of(w);
      if (computes - 1 - computes_at[w] >= kMinStreamGap && written_at[base] < from &&
          views_of[w] == 0 && !in_bucket(from) && !in_bucket(i)) {
        after[from].push_back({Action::kFree, w});
        before[i].push_back({Action::kCompute, w});
        any = true;
      }
      last_read[w] = i;
      computes_at[w] = computes;
    }
    if (candidate[v]) {
      last_read[v] = i;
      computes_at[v] = computes;
    }
    if (of != kNoNode && candidate[of]) ++views_of[of];
    if (graph.in_place(v)) written_at[graph.storage(v)] = i;
  }
  if (!any) return steps;
  std::vector<Step> out;
  out.reserve(steps.size() + 8);
  for (int i = 0; i < n; ++i) {
    out.insert(out.end(), before[i].begin(), before[i].end());
    out.push_back(steps[i]);
    out.insert(out.end(), after[i].begin(), after[i].end());
  }
  return out;
}

std::vector<Step> StreamParameters(const Graph& graph, const std::vector<Step>& given) {
  std::vector<uint8_t> streamed(graph.num_nodes(), 0);
  bool any = false;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    streamed[v] = StreamedParameter(graph, v);
    any = any || streamed[v];
  }
  if (!any) return given;
  const std::vector<Step> steps =
      RecomputeViewsOfStreamed(graph, FreeViewsEarly(graph, given, streamed), streamed);
  const int n = static_cast<int>(steps.size());
  // Per parameter, its uses: the step index, and whether a view of it is
  // resident after that step (the window may not close there).
  struct Use {
    int step;
    bool view_held;
  };
  std::vector<std::vector<Use>> uses(graph.num_nodes());
  std::vector<int> views(graph.num_nodes(), 0);  // per parameter, its resident views
  std::vector<int> computes;  // indices of compute steps, in order
  for (int i = 0; i < n; ++i) {
    const Step& step = steps[i];
    const NodeId v = step.node;
    std::vector<NodeId> used;
    if (step.action == Action::kCompute) {
      computes.push_back(i);
      for (NodeId u : graph.unique_inputs(v)) {
        if (streamed[graph.storage(u)]) used.push_back(graph.storage(u));
      }
      if (graph.is_alias(v) && streamed[graph.storage(v)]) ++views[graph.storage(v)];
    } else if (step.action == Action::kFree && graph.is_alias(v) && streamed[graph.storage(v)]) {
      --views[graph.storage(v)];
      used.push_back(graph.storage(v));
    }
    for (NodeId root : used) {
      if (!uses[root].empty() && uses[root].back().step == i) continue;
      uses[root].push_back({i, false});
    }
    for (NodeId root : used) uses[root].back().view_held = views[root] > 0;
  }
  // Compute steps strictly before step i.
  auto computes_before = [&](int i) {
    return static_cast<int>(std::lower_bound(computes.begin(), computes.end(), i) -
                            computes.begin());
  };
  // A bucket of collectives (a unit's gathers of sharded parameters) is
  // consecutive steps: a prefetch or free goes before or after it whole.
  auto bucket_first = [&](int i) {
    while (i > 0 && steps[i].joins_bucket) --i;
    return i;
  };
  auto bucket_last = [&](int i) {
    while (i + 1 < n && steps[i + 1].joins_bucket) ++i;
    return i;
  };
  std::vector<std::vector<Step>> before(n + 1), after(n);
  for (NodeId p = 0; p < graph.num_nodes(); ++p) {
    const std::vector<Use>& u = uses[p];
    int previous_end = -1;  // the last use of the previous window
    for (size_t a = 0; a < u.size();) {
      size_t b = a;
      while (b + 1 < u.size() &&
             (u[b].view_held ||
              computes_before(u[b + 1].step) - computes_before(u[b].step + 1) < kMinStreamGap)) {
        ++b;
      }
      // Prefetch before the compute preceding the first use, where that
      // comes after the previous window's free.
      int at = bucket_first(u[a].step);
      const int c = computes_before(at);
      if (c > 0 && computes[c - 1] > previous_end) at = bucket_first(computes[c - 1]);
      before[at].push_back({Action::kPrefetch, p});
      previous_end = bucket_last(u[b].step);
      after[previous_end].push_back({Action::kFree, p});
      a = b + 1;
    }
  }
  std::vector<Step> out;
  out.reserve(steps.size() + 4 * graph.num_nodes());
  for (int i = 0; i < n; ++i) {
    out.insert(out.end(), before[i].begin(), before[i].end());
    out.push_back(steps[i]);
    out.insert(out.end(), after[i].begin(), after[i].end());
  }
  return out;
}

// Note [Leftovers freed]. A policy's plan may leave a tensor resident to
// the end of the step where freeing it earlier lowers no peak of the step
// it planned: exact's plans of a chain kept the last recomputed activation
// and its gradient (the step's end frees all). With the updates placed after
// the plan, the tensor then sits beside them and the state they stream in
// (tanh-chain with Adam's state on the host: exact at min 24,008 bytes,
// checkmate 16,008, until 2026-12-05). So each tensor resident at the end of
// `steps` that no update reads, that is neither persistent nor an output
// and has no views, is freed after its last use: no figure of the steps
// before rises, and no compute changes.
std::vector<Step> FreeLeftovers(const Graph& graph, const std::vector<Step>& steps) {
  const int n = graph.num_nodes();
  std::vector<uint8_t> resident(n, 0), computed(n, 0), has_view(n, 0);
  std::vector<int> last_use(n, -1);
  for (NodeId v = 0; v < n; ++v) {
    if (graph.is_alias(v)) has_view[graph.storage(v)] = 1;
  }
  for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
    const Step& step = steps[i];
    last_use[step.node] = i;
    if (step.action == Action::kFree) resident[step.node] = 0;
    if (step.action == Action::kCompute || step.action == Action::kPrefetch) {
      resident[step.node] = 1;
    }
    if (step.action != Action::kCompute) continue;
    computed[step.node] = 1;
    for (NodeId u : graph.unique_inputs(step.node)) last_use[u] = i;
  }
  std::vector<std::vector<Step>> after(steps.size());
  bool any = false;
  for (NodeId v = 0; v < n; ++v) {
    if (!resident[v] || graph.is_alias(v) || has_view[v] || graph.persistent(v) ||
        graph.is_output(v) || graph.in_place(v) || graph.collective(v)) {
      continue;
    }
    // (a reader the steps do not compute is an update, placed after them)
    const auto readers = graph.readers(v);
    if (std::any_of(readers.begin(), readers.end(), [&](NodeId r) { return !computed[r]; })) {
      continue;
    }
    int at = last_use[v];  // not inside a bucket of collectives: after it
    while (at + 1 < static_cast<int>(steps.size()) && steps[at + 1].joins_bucket) ++at;
    after[at].push_back({Action::kFree, v});
    any = true;
  }
  if (!any) return steps;
  std::vector<Step> out;
  out.reserve(steps.size() + n);
  for (size_t i = 0; i < steps.size(); ++i) {
    out.push_back(steps[i]);
    out.insert(out.end(), after[i].begin(), after[i].end());
  }
  return out;
}

}  // namespace

absl::StatusOr<Graph> WithoutUpdates(const Graph& graph, bool sinks) {
  GraphBuilder b(graph.name());
  // Per value: read by an update (and no other node), and by a write of the
  // backward itself (a gradient added into a .grad, not an optimizer's).
  std::vector<uint8_t> output(graph.num_nodes(), 0), added_in_backward(graph.num_nodes(), 0);
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (!graph.in_place(v)) continue;
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.in_place(u) || graph.persistent(u)) continue;
      output[u] = 1;
      added_in_backward[u] |= graph.role(v) != Role::kUpdate;
    }
  }
  // A value only updates read and no output keeps (a dropped gradient, a
  // gradient added into a .grad): with `sinks`, a zero-byte sink reads it
  // instead of the step keeping it.
  auto add_sink = [&](NodeId v) {
    output[v] = 0;
    NodeSpec sink;
    sink.id = absl::StrCat(kSinkPrefix, graph.id(v));
    sink.op = std::string(kUpdateSinkOp);
    sink.bytes = 0;
    sink.inputs = {graph.id(v)};
    b.AddOutput(sink.id);
    b.AddNode(std::move(sink));
  };
  auto sunk = [&](NodeId v) { return sinks && output[v] && !graph.is_output(v); };
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.in_place(v)) continue;
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.in_place(u)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node ", Quote(graph.id(v)), " reads the in-place update ", Quote(graph.id(u)),
            ": only another update may read an update (pebble plans updates last)"));
      }
    }
    if (graph.home(v) == Tier::kHost && OnlyUpdatesRead(graph, v)) continue;  // streamed
    NodeSpec spec = SpecOf(graph, v);
    spec.home.reset();  // a device home stays resident throughout
    b.AddNode(std::move(spec));
    // A gradient that the backward adds into a .grad has its sink next in
    // the graph's own order: a policy that keeps that order (baseline) frees
    // it once added, as autograd does. An optimizer's sinks come last (the
    // order of a step whose updates follow the backward; rotor's chain on
    // resnet18 at batch 8 peaks 0.3 MiB higher with them next).
    if (sunk(v) && added_in_backward[v]) add_sink(v);
  }
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (sunk(v)) add_sink(v);
  }
  for (NodeId out : graph.outputs()) {
    if (!graph.in_place(out)) output[out] = 1;
  }
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (output[v]) b.AddOutput(graph.id(v));
  }
  return b.Build();
}

namespace {

// The in-place updates of `graph`, in its topological order.
std::vector<NodeId> UpdatesOf(const Graph& graph) {
  std::vector<NodeId> updates;
  for (NodeId v : graph.topological_order()) {
    if (graph.in_place(v)) updates.push_back(v);
  }
  return updates;
}

// Emits the updates of `graph`, in the order given (each after those it
// reads), into a schedule: each with the frees that follow it, and the
// prefetch, offload and free of each streamed state tensor around the
// updates that touch it (Note [Updates last]).
class UpdateEmitter {
 public:
  UpdateEmitter(const Graph& graph, std::vector<NodeId> order)
      : graph_(graph),
        updates_(std::move(order)),
        last_reader_(graph.num_nodes(), -1),
        last_touch_(graph.num_nodes(), -1),
        fetched_(graph.num_nodes(), 0),
        host_current_(graph.num_nodes(), 0),
        freed_(graph.num_nodes(), 0),
        on_device_(graph.num_nodes(), 0) {
    // A host home starts the step with a current host copy.
    for (NodeId v = 0; v < graph.num_nodes(); ++v) {
      host_current_[v] = graph.persistent(v) && graph.home(v) == Tier::kHost;
    }
    for (int k = 0; k < num_updates(); ++k) {
      for (NodeId u : graph.unique_inputs(updates_[k])) {
        last_reader_[u] = k;
        last_touch_[graph.storage(u)] = k;
      }
      last_touch_[graph.storage(updates_[k])] = k;
    }
  }

  int num_updates() const { return static_cast<int>(updates_.size()); }

  // Update k and the moves and frees around it.
  void Emit(int k, Schedule& schedule) {
    const NodeId w = updates_[k];
    if (graph_.runs_on(w) == Tier::kHost) return EmitOnHost(k, schedule);
    for (NodeId u : graph_.unique_inputs(w)) {
      const NodeId root = graph_.storage(u);
      if (Streamed(root) && !fetched_[root]) {
        fetched_[root] = 1;
        schedule.steps.push_back({Action::kPrefetch, root});
      }
    }
    schedule.steps.push_back({Action::kCompute, w});
    on_device_[w] = 1;
    host_current_[graph_.storage(w)] = 0;  // its host copy is stale now
    for (NodeId u : graph_.unique_inputs(w)) {
      if (last_reader_[u] == k && Droppable(u)) schedule.steps.push_back({Action::kFree, u});
    }
    if (last_reader_[w] < 0 && Droppable(w)) schedule.steps.push_back({Action::kFree, w});
    for (NodeId u : graph_.unique_inputs(w)) {  // w's own storage is among its inputs'
      const NodeId root = graph_.storage(u);
      if (!Streamed(root) || last_touch_[root] != k || fetched_[root] != 1) continue;
      fetched_[root] = 2;
      schedule.steps.push_back({Action::kOffload, root});
      schedule.steps.push_back({Action::kFree, root});
      host_current_[root] = 1;
    }
  }

  // Note [Updates on the host]. An update that runs_on the host runs
  // there, on host copies (where it may run on either side, the plan has
  // chosen first: Note [Update placement]). Before it, each storage it reads without a
  // current host copy is offloaded: a gradient (then freed on the device
  // at once where it is dropped and only host updates read it, as
  // ZeRO-Offload sends a gradient to the host when it is complete), or a
  // storage whose home is the device. The storage it writes leaves the
  // device (the write would leave a device copy stale); one whose home is
  // the device is prefetched back after the last update that touches it.
  // State and parameters whose home is the host are there already and
  // never cross the link for an update.
  void EmitOnHost(int k, Schedule& schedule) {
    const NodeId w = updates_[k];
    for (NodeId u : graph_.unique_inputs(w)) {
      const NodeId root = graph_.storage(u);
      if (host_current_[root]) continue;
      schedule.steps.push_back({Action::kOffload, root});
      host_current_[root] = 1;
      if (!graph_.persistent(root) && Droppable(root) && OnlyHostUpdatesRead(root)) {
        schedule.steps.push_back({Action::kFree, root});
        freed_[root] = 1;
      }
    }
    const NodeId own = graph_.storage(w);
    if (graph_.home(own) != Tier::kHost && fetched_[own] == 0) {
      schedule.steps.push_back({Action::kFree, own});
      fetched_[own] = 3;  // back to the device after its last update
    }
    schedule.steps.push_back({Action::kHostCompute, w});
    // Its inputs that nothing later reads leave the device: a value, or the
    // view that a device update left of a storage (it would hold the
    // storage there past the step's end; an update on the host leaves no
    // view on the device).
    for (NodeId u : graph_.unique_inputs(w)) {
      if (last_reader_[u] == k && Droppable(u) && !freed_[u] &&
          (!graph_.in_place(u) || on_device_[u])) {
        schedule.steps.push_back({Action::kFree, u});
        freed_[u] = 1;
      }
    }
    for (NodeId u : graph_.unique_inputs(w)) {
      const NodeId root = graph_.storage(u);
      if (last_touch_[root] != k) continue;
      if (fetched_[root] == 3) {  // a device home, back for the step's end
        fetched_[root] = 2;
        schedule.steps.push_back({Action::kPrefetch, root});
      } else if (fetched_[root] == 1 && Streamed(root)) {  // streamed in for a device update
        fetched_[root] = 2;
        schedule.steps.push_back({Action::kFree, root});  // offloaded above: the host copy is current
      }
    }
  }

  // Whether some update reads a value that no output keeps (a dropped
  // gradient): running it early frees that value early.
  bool FreesEarly() const {
    for (NodeId w : updates_) {
      for (NodeId u : graph_.unique_inputs(w)) {
        if (!graph_.in_place(u) && Droppable(u)) return true;
      }
    }
    return false;
  }

 private:
  bool Droppable(NodeId u) const { return !graph_.persistent(u) && !graph_.is_output(u); }
  bool OnlyHostUpdatesRead(NodeId u) const {
    for (NodeId r : graph_.readers(u)) {
      if (graph_.runs_on(r) != Tier::kHost) return false;
    }
    return true;
  }
  // State whose home is the host, and parameters streamed to their uses
  // (which leave the device after their last use before the updates).
  bool Streamed(NodeId root) const {
    return (graph_.home(root) == Tier::kHost && OnlyUpdatesRead(graph_, root)) ||
           StreamedParameter(graph_, root);
  }

  const Graph& graph_;
  const std::vector<NodeId> updates_;
  std::vector<int> last_reader_;  // node -> index of the last update reading it
  std::vector<int> last_touch_;   // storage root -> the last update touching it
  // Streamed root: 1 prefetched, 2 back on the host; a device home moved
  // for host updates: 3 on the host, 2 back on the device.
  std::vector<uint8_t> fetched_;
  // Per storage root, whether its host copy is current: a host home not
  // yet written on the device, or offloaded here since.
  std::vector<uint8_t> host_current_;
  std::vector<uint8_t> freed_;  // freed here already
  std::vector<uint8_t> on_device_;  // an update computed on the device here
};

// Note [Updates early]. Where the gradients are not outputs
// (gradients=drop), an update run as soon as it may frees its gradient then
// instead of at the step's end. An update may run once every value it reads
// is computed and nothing later reads its storage's value before the write:
// after the last inner step on one of its inputs and the last that reads
// its storage (a recomputation of a forward node included), and after the
// updates it reads. (Running a parameter's moments only where its update
// may run, to stream its state in later, gave no lower peaks on resnet18
// and the transformer, and a higher one on resnet18 at batch 8.)
//
// Running every update as soon as it may is not always best: a state
// tensor streamed in beside live activations may raise the peak. So the
// choice is per parameter's group (its update and the updates that only it
// reads), greedily in the graph's order: a group runs early
// where that lowers the simulated peak (or the makespan at the same peak),
// else last. Updates that several groups read (Adam's step count) run as
// soon as they may. `inner` holds the step's own steps (the policy's plan,
// ids of `graph`); the updates are inserted between them, in topological
// order; the simulator checks every candidate.
//
// That greedy placement leaves the policy planning as if every gradient
// stayed to the end. Planned jointly instead (PlanWithSinks), the policy
// sees a zero-byte sink read each dropped gradient, so it plans the memory
// that gradient frees; the updates then run as soon as they may, all of
// them. Both candidates are simulated and the lower peak (then makespan)
// kept: transformer:layers=8 with Adam's state on the host, 52.5 MiB with
// the updates last, 52.0 MiB moved afterwards, 32.9 MiB planned jointly.
// `steps` with the views of each persistent storage that an update on the
// host writes freed right after their last use (FreeViewsEarly): the
// update need not wait for the free.
std::vector<Step> FreeHostWrittenViewsEarly(const Graph& graph, const std::vector<Step>& steps) {
  std::vector<uint8_t> host_written(graph.num_nodes(), 0);
  bool any = false;
  for (NodeId w = 0; w < graph.num_nodes(); ++w) {
    if (graph.in_place(w) && graph.runs_on(w) == Tier::kHost) {
      host_written[graph.storage(w)] = 1;
      any = true;
    }
  }
  return any ? FreeViewsEarly(graph, steps, host_written) : steps;
}

// Note [Updates after the sums]. With data parallelism, each gradient is
// summed over the ranks once the backward is done with its storage, and
// before anything copies that storage to the host or an update reads it
// (Note [Where a gradient is reduced] in collectives.cc): the all-reduces
// are added to this plan afterwards. So where they follow (`sums_follow`),
// an update early waits for the backward's last read of each gradient
// storage it reads, not only for its own gradient: gradients that share
// one storage (parameters read through one tensor, torch.cat([a, b]): two
// slices of one gradient) or one read by another's computation (w = base +
// delta: delta's gradient made from base's) are read later by their
// siblings, and an update run before that would copy the storage to the
// host, or read it, before the sibling's sum (the plan was refused as
// invalid, or as having no point for the sum, until 2026-12-06). With one
// rank the placement is as before.

// The schedules of Note [Updates early] over one inner plan: what the
// placement of the updates reads of the inner steps is found once, for the
// greedy's many trials (one per parameter's group).
class EarlyUpdates {
 public:
  // `given`: the step's own steps (the policy's plan, ids of `graph`);
  // `sums_follow`: data parallelism's all-reduces are added to the plan
  // (Note [Updates after the sums]).
  EarlyUpdates(const Graph& graph, const std::vector<Step>& given, bool sums_follow)
      : graph_(graph),
        sums_follow_(sums_follow),
        inner_(FreeHostWrittenViewsEarly(graph, given)),
        updates_(UpdatesOf(graph)),
        last_step_(graph.num_nodes(), -1),
        last_read_(graph.num_nodes(), -1),
        last_view_step_(graph.num_nodes(), -1) {
    for (int i = 0; i < static_cast<int>(inner_.size()); ++i) {
      last_step_[inner_[i].node] = i;
      if (graph.is_alias(inner_[i].node)) last_view_step_[graph.storage(inner_[i].node)] = i;
      if (inner_[i].action != Action::kCompute) continue;
      for (NodeId u : graph.unique_inputs(inner_[i].node)) last_read_[graph.storage(u)] = i;
    }
  }

  // The inner steps with the updates inserted: those marked in `early` (per
  // node) as soon as they may, the others at the end, in topological order.
  Schedule With(const std::vector<uint8_t>& early) const {
    std::vector<int> after(graph_.num_nodes(), -1);  // update -> inner step it follows
    std::vector<std::vector<NodeId>> at(inner_.size() + 1);  // updates run before step i
    const int size = static_cast<int>(inner_.size());
    for (NodeId w : updates_) {
      int pos = early[w] ? last_read_[graph_.storage(w)] : size - 1;
      if (graph_.runs_on(w) == Tier::kHost) {
        pos = std::max(pos, last_view_step_[graph_.storage(w)]);
      }
      for (NodeId u : graph_.unique_inputs(w)) {
        pos = std::max(pos, graph_.in_place(u) ? after[u] : last_step_[u]);
        const NodeId root = graph_.storage(u);
        if (sums_follow_ && !graph_.persistent(root)) pos = std::max(pos, last_read_[root]);
      }
      // Not inside a bucket of collectives (a unit's reduce-scatters): after it.
      while (pos + 1 < size && inner_[pos + 1].joins_bucket) ++pos;
      after[w] = pos;
      at[pos + 1].push_back(w);
    }
    std::vector<NodeId> order;
    order.reserve(updates_.size());
    for (const std::vector<NodeId>& group : at) {
      order.insert(order.end(), group.begin(), group.end());
    }
    UpdateEmitter emitter(graph_, std::move(order));
    Schedule schedule;
    schedule.steps.reserve(inner_.size() + 4 * updates_.size());
    int k = 0;
    for (size_t i = 0; i <= inner_.size(); ++i) {
      for (size_t j = 0; j < at[i].size(); ++j) emitter.Emit(k++, schedule);
      if (i < inner_.size()) schedule.steps.push_back(inner_[i]);
    }
    return schedule;
  }

 private:
  const Graph& graph_;
  const bool sums_follow_;
  const std::vector<Step> inner_;  // the given steps, host-written views freed early
  const std::vector<NodeId> updates_;  // in topological order
  // Per node, the last inner step on it (any action: a swapped gradient is
  // back before its update frees it); per storage, the last compute reading
  // it, and the last inner step on a view of it (an update on the host
  // writes the host copy, so it waits until no view holds the device copy).
  std::vector<int> last_step_, last_read_, last_view_step_;
};

}  // namespace

std::vector<std::vector<NodeId>> ParameterUpdateGroups(const Graph& graph) {
  std::vector<std::vector<NodeId>> groups;
  for (NodeId w : UpdatesOf(graph)) {
    if (graph.role(graph.storage(w)) != Role::kParameter) continue;
    std::vector<NodeId> group = {w};
    for (size_t i = 0; i < group.size(); ++i) {
      for (NodeId u : graph.unique_inputs(group[i])) {
        if (graph.in_place(u) && graph.readers(u).size() == 1) group.push_back(u);
      }
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

namespace {

// The groups of Note [Updates early] (ParameterUpdateGroups); `early`
// starts with the other updates that several read set (they run as soon
// as they may).
std::vector<std::vector<NodeId>> UpdateGroups(const Graph& graph, std::vector<uint8_t>& early) {
  early.assign(graph.num_nodes(), 0);
  for (NodeId w : UpdatesOf(graph)) {
    if (graph.role(graph.storage(w)) == Role::kParameter) continue;
    for (NodeId r : graph.readers(w)) early[w] = early[w] || r != graph.readers(w).front();
  }
  return ParameterUpdateGroups(graph);
}

// Whether `a` beats `b`: a lower peak, or the same at a lower makespan.
bool Better(const PlanResult& a, const PlanResult& b) {
  return a.report.peak_bytes < b.report.peak_bytes ||
         (a.report.peak_bytes == b.report.peak_bytes && a.report.makespan < b.report.makespan);
}

// `inner` (a schedule of `rest`, WithoutUpdates(graph, ...)) in `graph`'s
// ids: without the sinks, and without the free of a value a sink read (its
// update frees it).
std::vector<Step> StepsOf(const Graph& graph, const Graph& rest, const Schedule& inner) {
  std::vector<Step> steps;
  steps.reserve(inner.steps.size());
  for (const Step& step : inner.steps) {
    const NodeId v = graph.Find(rest.id(step.node));
    if (v == kNoNode) continue;  // a sink
    if (step.action == Action::kFree && !graph.is_output(v) &&
        rest.Find(absl::StrCat(kSinkPrefix, graph.id(v))) != kNoNode) {
      continue;
    }
    steps.push_back({step.action, v, step.joins_bucket});
  }
  return steps;
}

// Note [Placements planned once]. The searches of Note [State placement]
// and Note [Update placement] plan the step under many placements, and the
// policy plans each one's step without its updates: that graph differs only
// in the state left out (state whose home is the host), not in where an
// update runs or whether a parameter is streamed (homes are dropped from
// it), so most placements give the policy a graph it has planned already,
// at the same budget. One call keeps the policy's plans (PlanMemo) by
// graph (its content, GraphFingerprint) and budget, and plans each once.
// (The calls of one search differ in their budget and time limit only.)
// Only a whole plan is kept: one the time limit cut may be bettered with
// more time, and not every policy marks its cuts (composition's optional
// searches stop at the deadline unsaid, checkmate's repairs too), so a
// plan is kept where it was unmarked and made within kKeptWithin of its
// time limit, which no deadline of the policies' (the call's limit, or a
// share of it: a fifth at least, checkmate's warm start) can have cut. A
// later call with less time may then take a plan better than it would have
// made; where no search is cut, the plans are those made without the memo.
// The same plans, sooner: hybrid on transformer:layers=2,seq=64,dim=128
// with adam:state=auto,updates=auto at min, 7.2 to 3.9 s; rotor on
// resnet18:batch=4,image=32 so, 5.1 to 2.3 s
// (bench/results/placements-planned-once-2026-12-05.md).

// The share of its time limit within which a plan was made, for PlanMemo
// to keep it (Note [Placements planned once]).
constexpr double kKeptWithin = 0.1;

class UpdatesLastPlanner final : public Planner {
 public:
  explicit UpdatesLastPlanner(std::unique_ptr<Planner> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    if (!graph.has_in_place()) return inner_->Plan(graph, options);
    PlanMemo memo;  // Note [Placements planned once]
    if (graph.has_auto_runs_on()) {  // Note [Update placement]
      return PlaceUpdates(graph, options, [&](const Graph& g, const PlannerOptions& o) {
        return PlanPlaced(g, o, memo);
      });
    }
    return PlanPlaced(graph, options, memo);
  }

 private:
  // The plan of a graph whose updates' sides are chosen.
  absl::StatusOr<PlanResult> PlanPlaced(const Graph& graph, const PlannerOptions& options,
                                        PlanMemo& memo) const {
    if (graph.has_auto_homes()) {  // Note [State placement]
      return PlaceAutoState(graph, options, [&](const Graph& g, const PlannerOptions& o) {
        return PlanStreamed(g, o, memo);
      });
    }
    return PlanStreamed(graph, options, memo);
  }

  // The policy's plan of `rest` (a graph without updates), made once per
  // call (Note [Placements planned once]).
  absl::StatusOr<PlanResult> PlanInner(const Graph& rest, const PlannerOptions& options,
                                       PlanMemo& memo) const {
    if (const PlanResult* kept = memo.Find(rest, options)) return *kept;
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(PlanResult plan, inner_->Plan(rest, options));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!TimeLimitReached(plan) && seconds < kKeptWithin * options.time_limit_s) {
      memo.Keep(rest, options, plan);
    }
    return plan;
  }

  // Note [Parameters streamed]: the policy plans with the parameters
  // resident, so a budget it cannot meet may still fit once they are
  // streamed, and the memory they free lets it keep more. It plans at the
  // budget plus the streamed parameters' bytes, then at the budget, then
  // at its least peak; the first whole plan that fits is kept (else the
  // last). Without streamed parameters, at the budget then at its least
  // peak: the policy plans the step without its updates, and its plan at
  // a byte budget may not fit once they are placed where its least-peak
  // plan does (Note [The least peak of a sharded step], planner.cc), so
  // each placement that the searches of Note [State placement] and Note
  // [Update placement] try fits wherever its least peak does.
  absl::StatusOr<PlanResult> PlanStreamed(const Graph& graph, const PlannerOptions& options,
                                          PlanMemo& memo) const {
    const int64_t streamed_bytes = StreamedParameterBytes(graph);
    const bool streams = streamed_bytes > 0;
    if (options.budget_bytes == PlannerOptions::kMinBudget) {
      return PlanOnce(graph, options, streams, memo);
    }
    std::vector<int64_t> budgets = {options.budget_bytes, PlannerOptions::kMinBudget};
    if (streams && options.budget_bytes <= INT64_MAX - streamed_bytes) {
      budgets.insert(budgets.begin(), options.budget_bytes + streamed_bytes);
    }
    absl::StatusOr<PlanResult> result = absl::InternalError("no plan");
    const Deadline deadline(options.time_limit_s);
    for (size_t i = 0; i < budgets.size(); ++i) {
      const int64_t inner_budget = budgets[i];
      PlannerOptions inner = options;
      inner.budget_bytes = inner_budget;
      // An equal share of the time left to each plan still to make; without
      // streamed parameters, the policy's plan at the budget has all of it
      // (one that searches to its limit, checkmate-lp, is as at any other
      // budget) and its least-peak plan what is left, if anything.
      if (!streams && i > 0 && deadline.remaining_s() <= 0) break;
      inner.time_limit_s = std::max(
          0.01, deadline.remaining_s() /
                    static_cast<double>(streams ? budgets.size() - i : 1));
      ASSIGN_OR_RETURN(PlanResult planned, PlanOnce(graph, inner, streams, memo));
      const bool cut = TimeLimitReached(planned);
      nlohmann::json details = std::move(planned.details);
      // Judged against the caller's budget, not the one the policy had.
      ASSIGN_OR_RETURN(result, FinishPlan(graph, std::move(planned.schedule), options));
      result->details = std::move(details);
      if (cut) NoteTimeLimit(*result, inner.time_limit_s, "the policy's search");
      if (inner_budget != options.budget_bytes && streams) {
        result->details["parameters_streamed_inner_budget"] =
            inner_budget == PlannerOptions::kMinBudget ? nlohmann::json("min")
                                                       : nlohmann::json(inner_budget);
      }
      if (result->feasible) break;
    }
    return result;
  }

  // The policy's plan of the step, the updates placed (Note [Updates last],
  // Note [Updates early]) and the parameters streamed where
  // `streams_parameters`.
  absl::StatusOr<PlanResult> PlanOnce(const Graph& graph, const PlannerOptions& options,
                                      bool streams_parameters, PlanMemo& memo) const {
    ASSIGN_OR_RETURN(const Graph rest, WithoutUpdates(graph));
    ASSIGN_OR_RETURN(PlanResult inner, PlanInner(rest, options, memo));
    const std::vector<Step> steps =
        FreeLeftovers(graph, StreamParameters(graph, StepsOf(graph, rest, inner.schedule)));
    Schedule last;
    last.steps = steps;
    UpdateEmitter emitter(graph, UpdatesOf(graph));
    for (int k = 0; k < emitter.num_updates(); ++k) emitter.Emit(k, last);
    ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(last), options));
    int early_groups = 0;
    // Note [Updates early]; host updates run beside the backward where early.
    if (emitter.FreesEarly() || graph.has_host_costs()) {
      const EarlyUpdates schedules(graph, steps, options.reduced_ranks > 1);
      std::vector<uint8_t> early;
      const std::vector<std::vector<NodeId>> groups = UpdateGroups(graph, early);
      for (const std::vector<NodeId>& group : groups) {
        for (NodeId w : group) early[w] = 1;
        absl::StatusOr<PlanResult> other = FinishPlan(graph, schedules.With(early), options,
                                                      /*record_timeline=*/false);
        if (other.ok() && Better(*other, result)) {
          result = *std::move(other);
          ++early_groups;
          continue;
        }
        for (NodeId w : group) early[w] = 0;
      }
      if (early_groups > 0) {  // the trials kept no timeline: the winner's, again
        ASSIGN_OR_RETURN(result, FinishPlan(graph, std::move(result.schedule), options));
      }
    }
    if (emitter.FreesEarly()) {  // the policy told which gradients go early
      absl::StatusOr<PlanResult> sunk = PlanWithSinks(graph, options, memo);
      if (sunk.ok() && Better(*sunk, result)) {
        result = *std::move(sunk);
        inner.details = result.details;
        inner.feasible = true;
        early_groups = -1;
      }
    }
    // With the updates last, the whole step peaks at least where the step
    // without them does: the inner plan's verdict stands. Updates run early
    // may free what the inner plan kept: the whole schedule's verdict
    // (FinishPlan's, against the budget) is the one.
    // Where the inner plan fits but the whole does not, FinishPlan's message
    // says why (the updates' workspace, the streamed state, the host budget).
    // Streamed parameters (Note [Parameters streamed]) free what the inner
    // plan held: there too the whole schedule's verdict is the one.
    const bool cut = TimeLimitReached(inner);
    if (early_groups == 0 && !inner.feasible && !streams_parameters) {
      result.feasible = false;
      result.message = std::move(inner.message);
    } else if (result.message.empty() && inner.feasible) {
      result.message = std::move(inner.message);  // the policy's own note (fsdp's, unsharded)
    }
    result.details = std::move(inner.details);
    // The policy's cut is said, whichever message stands.
    if (cut && !absl::StrContains(result.message, "time limit")) {
      NoteTimeLimit(result, options.time_limit_s, "the policy's search");
    }
    result.details["updates"] = early_groups != 0 ? "early" : "last";
    if (early_groups > 0) result.details["updates_early_groups"] = early_groups;
    if (early_groups < 0) result.details["updates_planned_with_sinks"] = true;
    return result;
  }

  // Note [Updates early], planned jointly: the policy plans the step with a
  // zero-byte sink per dropped gradient, so it frees each gradient where the
  // sink reads it; every update then runs as soon as it may (the sinks
  // dropped), and its gradient is freed after it.
  absl::StatusOr<PlanResult> PlanWithSinks(const Graph& graph, const PlannerOptions& options,
                                           PlanMemo& memo) const {
    ASSIGN_OR_RETURN(const Graph rest, WithoutUpdates(graph, /*sinks=*/true));
    ASSIGN_OR_RETURN(PlanResult inner, PlanInner(rest, options, memo));
    const std::vector<Step> steps =
        FreeLeftovers(graph, StreamParameters(graph, StepsOf(graph, rest, inner.schedule)));
    std::vector<uint8_t> early(graph.num_nodes(), 1);
    ASSIGN_OR_RETURN(PlanResult result,
                     FinishPlan(graph,
                                EarlyUpdates(graph, steps, options.reduced_ranks > 1).With(early),
                                options));
    result.details = std::move(inner.details);
    return result;
  }

  std::unique_ptr<Planner> inner_;
};

}  // namespace

std::unique_ptr<Planner> WithUpdatesLast(std::unique_ptr<Planner> inner) {
  return std::make_unique<UpdatesLastPlanner>(std::move(inner));
}

}  // namespace pebble
