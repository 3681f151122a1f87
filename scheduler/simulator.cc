#include "scheduler/simulator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {

// The start of Simulate's refusal of a schedule whose totals overflow
// (SimulateCandidate tells it from the others).
constexpr absl::string_view kCostOverflow =
    "the schedule's total compute cost or time exceeds the largest double";

double BaseCost(const Graph& graph) {
  double base = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.needed()[v] && !graph.persistent(v) && !graph.collective(v)) base += graph.cost(v);
  }
  return base;
}

double AllGatherSeconds(int64_t bytes, int ranks, const NetworkLink& link) {
  if (ranks <= 1) return 0;
  const double r = ranks;
  return (r - 1) * link.latency_s +
         (r - 1) / r * static_cast<double>(bytes) / link.bandwidth_bytes_per_s;
}

double AllReduceSeconds(int64_t bytes, int ranks, const NetworkLink& link) {
  return 2 * AllGatherSeconds(bytes, ranks, link);
}

std::optional<CollectiveLink> CollectiveLinkOf(const Graph& graph, NodeId v) {
  const nlohmann::json& a = graph.attrs(v);
  if (!graph.collective(v) || !a.is_object()) return std::nullopt;
  auto ranks = a.find("ranks");
  auto bandwidth = a.find("network_bandwidth_bytes_per_s");
  auto latency = a.find("network_latency_s");
  if (ranks == a.end() || bandwidth == a.end() || latency == a.end() ||
      !ranks->is_number_integer() || !bandwidth->is_number() || !latency->is_number()) {
    return std::nullopt;
  }
  return CollectiveLink{ranks->get<int>(), {bandwidth->get<double>(), latency->get<double>()}};
}

std::string BucketJoinError(const Graph& graph, const Schedule& schedule, size_t k) {
  const Step& step = schedule.steps[k];
  if (!step.joins_bucket) return "";
  const Step* before = k > 0 ? &schedule.steps[k - 1] : nullptr;
  if (before != nullptr && (before->node < 0 || before->node >= graph.num_nodes())) return "";
  if (step.action == Action::kAllReduce) {
    if (before != nullptr && before->action == Action::kAllReduce) return "";
    return "it joins a bucket, but the step before is no all_reduce";
  }
  if (step.action != Action::kCompute || !graph.collective(step.node)) {
    return "it joins a bucket, but only an all_reduce step, or a compute of a collective node, "
           "joins one";
  }
  if (before == nullptr || before->action != Action::kCompute ||
      !graph.collective(before->node) || graph.op(before->node) != graph.op(step.node)) {
    return absl::StrCat("it joins a bucket, but the step before is no compute of another ",
                        Quote(graph.op(step.node)), " collective");
  }
  const std::optional<CollectiveLink> link = CollectiveLinkOf(graph, step.node);
  if (!link.has_value()) {
    return "it joins a bucket, but its attrs do not say the ranks and link its cost was timed "
           "for (ranks, network_bandwidth_bytes_per_s, network_latency_s), so its message's "
           "time is unknown";
  }
  if (CollectiveLinkOf(graph, before->node) != link) {
    return absl::StrCat("it joins a bucket, but ", Quote(graph.id(before->node)),
                        " before it was timed for other ranks or another link (attrs)");
  }
  // One message reads its members' inputs together: none is another's output.
  const absl::Span<const NodeId> inputs = graph.unique_inputs(step.node);
  if (std::none_of(inputs.begin(), inputs.end(), [&](NodeId u) { return graph.collective(u); })) {
    return "";
  }
  for (size_t j = k; j > 0 && schedule.steps[j].joins_bucket; --j) {
    const NodeId member = schedule.steps[j - 1].node;
    for (NodeId u : graph.unique_inputs(step.node)) {
      if (u == member) {
        return absl::StrCat("it joins a bucket, but it reads ", Quote(graph.id(member)),
                            ", which the bucket makes");
      }
    }
  }
  return "";
}

namespace {

constexpr absl::string_view kTransferOverflow =
    "the bytes transferred so far exceed 2^63 - 1; no link moves that much";

absl::Status StepError(const Graph& graph, size_t k, const Step& step,
                       absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid schedule at step ", k, " (", ActionName(step.action),
                   " ", Quote(graph.id(step.node)), "): ", rule));
}

// The rule a base `v` breaks when some alias still holds its storage: names
// the first such alias (by id order; an error path, so a scan is fine).
std::string HeldThroughAlias(const Graph& graph, NodeId v,
                             const std::vector<uint8_t>& on_device) {
  NodeId holder = kNoNode;
  for (NodeId a = 0; a < graph.num_nodes() && holder == kNoNode; ++a) {
    if (on_device[a] && graph.storage(a) == v) holder = a;
  }
  PEBBLE_CHECK(holder != kNoNode, "storage held by no node");
  return absl::StrCat("its storage is still resident through alias ",
                      Quote(graph.id(holder)),
                      " (a second copy of a live storage; free its aliases first)");
}

// Whether persistent v may move: it has a home (docs/semantics.md, "Home
// tiers and in-place updates"); without one it is resident throughout.
bool Movable(const Graph& graph, NodeId v) {
  return graph.persistent(v) && graph.home(v).has_value();
}

// The end of a step: every persistent node with a home is in it (a host
// home holds a current host copy, and the device none).
absl::Status CheckHomes(const Graph& graph, const std::vector<uint8_t>& on_device,
                        const std::vector<uint8_t>& on_host) {
  // The resident view that holds each storage, where one does.
  std::vector<NodeId> held_through(graph.num_nodes(), kNoNode);
  for (NodeId a = 0; a < graph.num_nodes(); ++a) {
    if (on_device[a] && graph.is_alias(a)) held_through[graph.storage(a)] = a;
  }
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (!Movable(graph, v)) continue;
    const bool host_home = *graph.home(v) == Tier::kHost;
    if (!host_home && !on_device[v]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: persistent ", Quote(graph.id(v)),
          " (home: device) is not resident at the end; prefetch it back"));
    }
    if (host_home && !on_host[v]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: persistent ", Quote(graph.id(v)),
          " (home: host) has no current host copy at the end; offload it after its last "
          "in-place update"));
    }
    if (host_home && on_device[v]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: persistent ", Quote(graph.id(v)),
          " (home: host) is still resident on the device at the end; free it"));
    }
    if (host_home && held_through[v] != kNoNode) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: persistent ", Quote(graph.id(v)), " (home: host) is still "
          "resident on the device at the end through its view ", Quote(graph.id(held_through[v])),
          "; free the view"));
    }
  }
  return absl::OkStatus();
}

// The rules of data parallelism's all_reduce (docs/semantics.md,
// "Collectives across ranks"): which parts of which values were summed
// over the ranks, when, and which gradients must be before an update reads
// them. A storage's value is new when its base is computed or an in-place
// node writes it; views of it are parts of that value (a view computed
// again is the same part).
class Reductions {
 public:
  Reductions(const Graph& graph, const Schedule& schedule, const SimulatorOptions& options)
      : graph_(graph) {
    const bool steps = std::any_of(schedule.steps.begin(), schedule.steps.end(),
                                   [](const Step& s) { return s.action == Action::kAllReduce; });
    const std::vector<NodeId> gradients =
        options.ranks > 1 ? GradientsToReduce(graph) : std::vector<NodeId>{};
    const bool required = !gradients.empty();
    if (!steps && !required) return;
    const int n = graph.num_nodes();
    reduced_.assign(n, {});
    reduced_until_.assign(n, 0.0);
    unclipped_.assign(n, 0);
    for (NodeId v = 0; v < n; ++v) unclipped_[v] = IsUnclippedGradient(graph, v);
    if (required) {
      gradients_ = gradients;
      gradient_in_.assign(n, kNoNode);
      for (NodeId g : gradients_) gradient_in_[graph.storage(g)] = g;
    }
  }
  bool active() const { return !reduced_.empty(); }

  // Why a compute of v may not read u, or "": the backward reads a rank's
  // own values; an update (but one that writes u's storage: the gradient
  // being made) reads a gradient only once it is summed, and so does the
  // clipping, the reader of an unclipped gradient u itself (it reads the
  // average's norm).
  std::string ReadError(NodeId v, NodeId u) const {
    const NodeId s = graph_.storage(u);
    const bool clipping = unclipped_[u] && graph_.storage(v) != s && !graph_.is_alias(v);
    if (clipping && !gradient_in_.empty() && !Summed(u)) {
      return absl::StrCat("input ", Quote(graph_.id(u)), " is not summed over the ranks yet: "
                          "with several ranks the clipping reads a gradient after its "
                          "all_reduce (the norm of the averaged gradients)");
    }
    if (!reduced_[s].empty() && !graph_.in_place(v) && !graph_.is_alias(v) && !clipping) {
      return absl::StrCat("input ", Quote(graph_.id(u)), " was summed over the ranks by "
                          "all_reduce ", Quote(graph_.id(reduced_[s][0])), "; only in-place "
                          "updates read a reduced value (the backward reads the rank's own: "
                          "reduce after this step)");
    }
    if (!gradient_in_.empty() && gradient_in_[s] != kNoNode && graph_.in_place(v) &&
        graph_.storage(v) != s && !Summed(u)) {
      return absl::StrCat("input ", Quote(graph_.id(u)), " is not summed over the ranks yet: "
                          "with several ranks an update reads a gradient after its all_reduce");
    }
    return "";
  }
  double ReadyAt(NodeId u) const { return reduced_until_[graph_.storage(u)]; }
  double FreeAt(NodeId v) const { return active() ? ReadyAt(v) : 0.0; }

  // A compute of v: where it makes a new value of its storage, nothing of
  // that value is summed yet.
  void Computed(NodeId v) {
    if (active() && (!graph_.is_alias(v) || graph_.in_place(v))) {
      reduced_[graph_.storage(v)].clear();
    }
  }

  // Why v may not be summed now, or "": a part is summed once, so not v
  // where v, a view it is part of, or a part of v was summed already.
  // Sibling views are taken to be disjoint parts.
  std::string ReduceError(NodeId v) const {
    for (NodeId r : reduced_[graph_.storage(v)]) {
      if (PartOf(v, r) || PartOf(r, v)) {
        return absl::StrCat("its storage was summed over the ranks already, by all_reduce ",
                            Quote(graph_.id(r)), " (a value is reduced once)");
      }
    }
    return "";
  }
  void Reduced(NodeId v, double end) {
    const NodeId s = graph_.storage(v);
    reduced_[s].push_back(v);
    reduced_until_[s] = std::max(reduced_until_[s], end);
  }

  // An output gradient that was not summed, at the end of the step.
  absl::Status CheckEnd() const {
    for (NodeId g : gradients_) {
      if (graph_.is_output(g) && !Summed(g)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "invalid schedule: gradient ", Quote(graph_.id(g)), " ends the step without an "
            "all_reduce (with several ranks every gradient is summed over them; plan with the "
            "ranks, or simulate one rank)"));
      }
    }
    return absl::OkStatus();
  }

 private:
  // Whether `part` is `whole` or a view of it (following alias_of).
  bool PartOf(NodeId part, NodeId whole) const {
    for (NodeId a = part; a != kNoNode; a = graph_.alias_of(a)) {
      if (a == whole) return true;
    }
    return false;
  }
  // Whether u's value is the ranks' sum: u, or a value u is part of, summed.
  bool Summed(NodeId u) const {
    for (NodeId r : reduced_[graph_.storage(u)]) {
      if (PartOf(u, r)) return true;
    }
    return false;
  }

  const Graph& graph_;
  std::vector<std::vector<NodeId>> reduced_;  // per storage: the summed parts of its value
  std::vector<double> reduced_until_;  // per storage: when its last all_reduce ended
  std::vector<NodeId> gradients_;      // GradientsToReduce (ranks > 1)
  std::vector<NodeId> gradient_in_;    // per storage: the gradient it holds (ranks > 1)
  std::vector<uint8_t> unclipped_;     // per node: an unclipped gradient
};

}  // namespace

std::vector<NodeId> GradientsToReduce(const Graph& graph) {
  // Per node, whether a collective other than an all-gather (a
  // reduce-scatter) computes it or a value it is computed from: summed over
  // the ranks already (a gradient scaled or cast after its reduce-scatter).
  // An all-gather sums nothing.
  std::vector<uint8_t> from_sum(graph.num_nodes(), 0);
  for (NodeId v : graph.topological_order()) {
    from_sum[v] = graph.collective(v) && graph.op(v) != "all_gather";
    for (NodeId u : graph.unique_inputs(v)) from_sum[v] |= from_sum[u];
  }
  std::vector<NodeId> gradients;
  for (NodeId p = 0; p < graph.num_nodes(); ++p) {
    if (!graph.persistent(p) || graph.role(p) != Role::kParameter) continue;
    const NodeId g = BackwardGradient(graph, p);
    if (g != kNoNode && !graph.persistent(g) && graph.needed()[g] && !from_sum[g]) {
      gradients.push_back(g);
    }
  }
  std::sort(gradients.begin(), gradients.end());
  return gradients;
}

namespace {

// The members of the bucket of collectives that step k heads, after it
// (those its flag joins: a step refused for its own reasons ends them):
// their whole tensors' bytes added to `bytes`, and `start` moved to the
// latest time one of their inputs is ready. False where the bytes overflow.
bool JoinedCollectives(const Graph& graph, const Schedule& schedule, size_t k,
                       const std::vector<double>& ready, const Reductions& reductions,
                       int64_t& bytes, double& start) {
  for (size_t j = k + 1; j < schedule.steps.size() && schedule.steps[j].joins_bucket; ++j) {
    const NodeId m = schedule.steps[j].node;
    if (schedule.steps[j].action != Action::kCompute || m < 0 || m >= graph.num_nodes() ||
        !graph.collective(m)) {
      break;
    }
    if (__builtin_add_overflow(bytes, std::max(graph.bytes(m), graph.bytes(graph.inputs(m)[0])),
                               &bytes)) {
      return false;
    }
    for (NodeId u : graph.unique_inputs(m)) {
      start = std::max(start, ready[u]);
      if (reductions.active()) start = std::max(start, reductions.ReadyAt(u));
    }
  }
  return true;
}

// The options Simulate refuses before it reads a step.
absl::Status CheckOptions(const Graph& graph, const SimulatorOptions& options) {
  if (!(options.host_bandwidth_bytes_per_s > 0)) {
    return absl::InvalidArgumentError("host bandwidth must be positive");
  }
  if (options.ranks < 1) return absl::InvalidArgumentError("ranks must be at least 1");
  // A sharded graph's collectives are timed for its own ranks: ranks given
  // (more than one) must be those, as planning requires (ShardedRanks).
  for (NodeId v = 0; options.ranks > 1 && graph.has_collectives() && v < graph.num_nodes(); ++v) {
    const std::optional<CollectiveLink> link = CollectiveLinkOf(graph, v);
    if (!link.has_value()) continue;
    if (link->ranks != options.ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the graph is sharded for ", link->ranks, " ranks (its collectives are timed for "
          "them): simulate it with ", link->ranks, " ranks, not ", options.ranks));
    }
    break;
  }
  // (a sharded graph written or edited by hand may clip without the sum)
  RETURN_IF_ERROR(CheckShardedClipping(graph));
  if (!(options.network.bandwidth_bytes_per_s > 0) ||
      !std::isfinite(options.network.bandwidth_bytes_per_s) ||
      !(options.network.latency_s >= 0) || !std::isfinite(options.network.latency_s)) {
    return absl::InvalidArgumentError(
        "the network's bandwidth must be positive and its latency non-negative, both finite");
  }
  if (options.bucket_copy_alignment < 1 || options.bucket_copy_alignment > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("the bucket copies' alignment must be 1 byte to 1 GiB");
  }
  return absl::OkStatus();
}

// One replay of a schedule under the rules of docs/semantics.md: what is
// resident where, the streams' clocks (SPEC section 4), and the report as
// it grows. Step(k) checks and applies step k; Finish() checks the end of
// the step and sums up. Each action has a method of its own.
class Replay {
 public:
  Replay(const Graph& graph, const Schedule& schedule, const SimulatorOptions& options);

  absl::Status Step(size_t k);
  absl::StatusOr<PlanReport> Finish() &&;

 private:
  absl::Status Compute(size_t k, StepRecord& rec);
  absl::Status Free(size_t k, StepRecord& rec);
  absl::Status Offload(size_t k, StepRecord& rec);
  absl::Status Prefetch(size_t k, StepRecord& rec);
  absl::Status HostCompute(size_t k, StepRecord& rec);
  absl::Status AllReduce(size_t k, StepRecord& rec);

  // Why step k may not compute its node (device compute), or OK.
  absl::Status ComputeRefusal(size_t k) const;
  // The earliest start of step k's compute, given its stream's: every input
  // resident, current and ready (and, with reductions, summed as required).
  absl::StatusOr<double> InputsReadyAt(size_t k, double start) const;
  // The interval of step k's collective compute of `bytes` (the whole
  // tensor's), alone or as the head or a member of a bucket, on the network
  // stream; `rec` holds the compute's own interval on entry.
  absl::Status TimeCollective(size_t k, int64_t bytes, StepRecord& rec);
  // The interval and device copy of the bucket of all_reduce steps that
  // step k heads.
  absl::Status StartAllReduceBucket(size_t k, StepRecord& rec);
  // Counts a collective on the network stream, `seconds` long and ending at
  // `end`, of a tensor of `bytes` (the whole); false where the bytes
  // overflow.
  bool OnNetworkStream(int64_t bytes, double seconds, double end);
  // Frees every bucket copy that holds a sum for `u`'s storage: the runtime
  // settles them before a step touches that storage.
  void SettleCopiesOf(NodeId u);
  absl::Status Error(size_t k, absl::string_view rule) const {
    return StepError(graph_, k, schedule_.steps[k], rule);
  }

  const Graph& graph_;
  const Schedule& schedule_;
  const SimulatorOptions& options_;
  const int n_;
  PlanReport report_;

  std::vector<uint8_t> on_device_;
  // Per storage root: how many nodes of D hold it (itself and its aliases,
  // SPEC section 1 "Aliases"); its bytes count while this is positive.
  std::vector<int32_t> holders_;
  std::vector<uint8_t> on_host_;
  std::vector<uint8_t> computed_;
  int64_t device_ = 0;  // bytes resident on the device (the set D's)
  int64_t host_ = 0;    // bytes of host copies
  int64_t distinct_computed_ = 0;
  int64_t computes_ = 0;
  // current_[s]: the node whose value storage s holds now: its base, then
  // each in-place node that wrote it. Only graphs with updates need it.
  std::vector<NodeId> current_;

  // Time model state (SPEC section 4).
  std::vector<double> ready_;     // when the resident copy is valid
  std::vector<double> last_use_;  // latest end of a compute that read or
                                  // produced the node, or of its offload
  double compute_free_at_ = 0;    // end of the previous compute
  double copy_free_at_ = 0;       // end of the previous copy
  double host_free_at_ = 0;       // end of the previous host compute
  // Per storage: the end of the latest copy or host compute on its host
  // copy (a host compute and a copy of one host copy run one after the
  // other; copies alone are ordered by their stream already).
  std::vector<double> host_copy_until_;
  double frees_done_at_ = 0;    // R_k: latest end of earlier frees
  double network_free_at_ = 0;  // end of the previous collective
  struct {
    double start = 0, end = 0;
  } bucket_;  // the interval of the last bucket (of all_reduce steps or of collectives)
  Reductions reductions_;

  // Buckets' device copies (SimulatorOptions::device_bucket_copies): each
  // copy's bytes (0 once freed), and per storage root the copies that hold
  // a sum for it (two views of one storage may be in different buckets).
  std::vector<int64_t> copy_bytes_;
  std::vector<std::vector<int>> copies_of_;
};

Replay::Replay(const Graph& graph, const Schedule& schedule, const SimulatorOptions& options)
    : graph_(graph),
      schedule_(schedule),
      options_(options),
      n_(graph.num_nodes()),
      on_device_(n_, 0),
      holders_(n_, 0),
      on_host_(n_, 0),
      computed_(n_, 0),
      current_(graph.has_in_place() ? n_ : 0),
      ready_(n_, 0.0),
      last_use_(n_, 0.0),
      host_copy_until_(graph.has_host_costs() ? n_ : 0, 0.0),
      reductions_(graph, schedule, options),
      copies_of_(options.device_bucket_copies ? n_ : 0) {
  report_.base_cost = BaseCost(graph);
  report_.num_steps = static_cast<int64_t>(schedule.steps.size());
  std::iota(current_.begin(), current_.end(), NodeId{0});
  for (NodeId v = 0; v < n_; ++v) {
    if (!graph.persistent(v)) continue;
    if (graph.home(v) == Tier::kHost) {
      on_host_[v] = 1;
      host_ += graph.bytes(v);
      continue;
    }
    on_device_[v] = 1;
    holders_[v] = 1;
    device_ += graph.bytes(v);
  }
  report_.initial_bytes = device_;
  report_.host_peak_bytes = host_;
  report_.peak_bytes = device_;
  report_.peak_step = -1;
  if (options.record_timeline) report_.timeline.reserve(schedule.steps.size());
}

bool Replay::OnNetworkStream(int64_t bytes, double seconds, double end) {
  network_free_at_ = end;
  report_.network_busy += seconds;
  ++report_.collectives;
  return !__builtin_add_overflow(report_.collective_bytes, bytes, &report_.collective_bytes);
}

void Replay::SettleCopiesOf(NodeId u) {
  for (int c : copies_of_[graph_.storage(u)]) {
    device_ -= copy_bytes_[c];
    copy_bytes_[c] = 0;
  }
  copies_of_[graph_.storage(u)].clear();
}

absl::Status Replay::Step(size_t k) {
  const ::pebble::Step& step = schedule_.steps[k];
  const NodeId v = step.node;
  if (v < 0 || v >= n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid schedule at step ", k, ": node id ", v, " out of range"));
  }
  if (static_cast<int>(step.action) > static_cast<int>(Action::kAllReduce)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid schedule at step ", k, ": action ",
                                                   static_cast<int>(step.action),
                                                   " is no Action"));
  }
  if (std::string e = BucketJoinError(graph_, schedule_, k); !e.empty()) return Error(k, e);
  if (!copies_of_.empty() && step.action != Action::kAllReduce) {
    SettleCopiesOf(v);
    if (step.action == Action::kCompute || step.action == Action::kHostCompute) {
      for (NodeId u : graph_.unique_inputs(v)) SettleCopiesOf(u);
    }
  }
  StepRecord rec;
  switch (step.action) {
    case Action::kCompute: RETURN_IF_ERROR(Compute(k, rec)); break;
    case Action::kFree: RETURN_IF_ERROR(Free(k, rec)); break;
    case Action::kOffload: RETURN_IF_ERROR(Offload(k, rec)); break;
    case Action::kPrefetch: RETURN_IF_ERROR(Prefetch(k, rec)); break;
    case Action::kHostCompute: RETURN_IF_ERROR(HostCompute(k, rec)); break;
    case Action::kAllReduce: RETURN_IF_ERROR(AllReduce(k, rec)); break;
  }
  rec.device_bytes = device_;
  rec.host_bytes = host_;
  if (rec.peak_bytes > report_.peak_bytes) {
    report_.peak_bytes = rec.peak_bytes;
    report_.peak_step = static_cast<int>(k);
  }
  report_.host_peak_bytes = std::max(report_.host_peak_bytes, host_);
  report_.makespan = std::max(report_.makespan, rec.end);
  if (options_.record_timeline) report_.timeline.push_back(rec);
  return absl::OkStatus();
}

absl::Status Replay::ComputeRefusal(size_t k) const {
  const NodeId v = schedule_.steps[k].node;
  if (graph_.persistent(v)) return Error(k, "the node is persistent");
  if (on_device_[v]) return Error(k, "the node is already resident");
  if (!graph_.is_alias(v) && holders_[v] > 0) {
    return Error(k, HeldThroughAlias(graph_, v, on_device_));
  }
  if (graph_.runs_on(v) == Tier::kHost) {
    return Error(k, "the node runs on the host (runs_on: host): use host_compute");
  }
  if (graph_.in_place(v) && computed_[v]) {
    return Error(k, absl::StrCat("the in-place update has run already (it writes ",
                                 Quote(graph_.id(graph_.storage(v))), " once per step)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Replay::InputsReadyAt(size_t k, double start) const {
  const NodeId v = schedule_.steps[k].node;
  for (NodeId u : graph_.unique_inputs(v)) {
    if (!on_device_[u]) {
      return Error(k, absl::StrCat("input '", graph_.id(u), "' is not resident"));
    }
    if (graph_.has_in_place() && graph_.version(u) != current_[graph_.storage(u)]) {
      return Error(k, absl::StrCat(
          "input ", Quote(graph_.id(u)), " was overwritten by the in-place update ",
          Quote(graph_.id(current_[graph_.storage(u)])), " (reads of a storage's earlier "
          "value come before its update)"));
    }
    start = std::max(start, ready_[u]);
    if (!reductions_.active()) continue;
    if (std::string e = reductions_.ReadError(v, u); !e.empty()) return Error(k, e);
    start = std::max(start, reductions_.ReadyAt(u));
  }
  return start;
}

absl::Status Replay::Compute(size_t k, StepRecord& rec) {
  const NodeId v = schedule_.steps[k].node;
  RETURN_IF_ERROR(ComputeRefusal(k));
  // A collective node runs on the network stream (docs/semantics.md,
  // "Sharding"), anything else on the compute stream.
  const bool on_network = graph_.collective(v);
  ASSIGN_OR_RETURN(
      const double start,
      InputsReadyAt(k, std::max(on_network ? network_free_at_ : compute_free_at_,
                                frees_done_at_)));
  on_device_[v] = 1;
  // An alias's storage is resident already (its input is in D), so only a
  // base adds bytes.
  const NodeId root = graph_.storage(v);
  if (holders_[root]++ == 0) device_ += graph_.bytes(root);
  reductions_.Computed(v);  // this rank's own value
  if (graph_.in_place(v)) {
    // The write makes every host copy of the storage stale.
    current_[root] = v;
    if (on_host_[root]) {
      on_host_[root] = 0;
      host_ -= graph_.bytes(root);
    }
  }
  rec.peak_bytes = device_ + graph_.workspace(v);
  rec.start = start;
  rec.end = start + graph_.cost(v);
  if (on_network) {
    // The whole tensor's bytes: a gather's output, a reduce-scatter's input.
    RETURN_IF_ERROR(
        TimeCollective(k, std::max(graph_.bytes(v), graph_.bytes(graph_.inputs(v)[0])), rec));
  }
  ready_[v] = rec.end;
  last_use_[v] = std::max(last_use_[v], rec.end);
  for (NodeId u : graph_.unique_inputs(v)) last_use_[u] = std::max(last_use_[u], rec.end);
  if (!on_network) {
    compute_free_at_ = rec.end;
    report_.compute_cost += graph_.cost(v);
    report_.compute_busy += graph_.cost(v);
  }
  ++computes_;
  if (!computed_[v]) {
    computed_[v] = 1;
    ++distinct_computed_;
  }
  return absl::OkStatus();
}

absl::Status Replay::TimeCollective(size_t k, int64_t bytes, StepRecord& rec) {
  const NodeId v = schedule_.steps[k].node;
  if (schedule_.steps[k].joins_bucket) {  // one message with the steps before (BucketJoinError)
    rec.start = bucket_.start;
    rec.end = bucket_.end;
    return absl::OkStatus();
  }
  const bool heads_bucket = k + 1 < schedule_.steps.size() && schedule_.steps[k + 1].joins_bucket;
  if (!heads_bucket) {
    if (!OnNetworkStream(bytes, graph_.cost(v), rec.end)) return Error(k, kTransferOverflow);
    return absl::OkStatus();
  }
  // A bucket of collectives: one message of all their bytes, when every
  // member's input is ready.
  int64_t total = bytes;
  if (!JoinedCollectives(graph_, schedule_, k, ready_, reductions_, total, rec.start)) {
    return Error(k, kTransferOverflow);
  }
  const std::optional<CollectiveLink> link = CollectiveLinkOf(graph_, v);
  if (!link.has_value()) {  // the next step is refused for it
    return Error(k + 1, BucketJoinError(graph_, schedule_, k + 1));
  }
  rec.end = rec.start + AllGatherSeconds(total, link->ranks, link->link);
  if (!OnNetworkStream(total, rec.end - rec.start, rec.end)) return Error(k, kTransferOverflow);
  bucket_ = {rec.start, rec.end};
  return absl::OkStatus();
}

absl::Status Replay::Free(size_t k, StepRecord& rec) {
  const NodeId v = schedule_.steps[k].node;
  if (graph_.persistent(v) && !Movable(graph_, v)) return Error(k, "the node is persistent");
  if (Movable(graph_, v) && !on_host_[v] && on_device_[v]) {
    return Error(k, "the persistent node has no current host copy (offload it first)");
  }
  if (!on_device_[v]) return Error(k, "the node is not resident");
  on_device_[v] = 0;
  const NodeId root = graph_.storage(v);
  if (--holders_[root] == 0) device_ -= graph_.bytes(root);
  rec.peak_bytes = device_;
  rec.start = rec.end = std::max(last_use_[v], reductions_.FreeAt(v));
  frees_done_at_ = std::max(frees_done_at_, rec.end);
  return absl::OkStatus();
}

absl::Status Replay::Offload(size_t k, StepRecord& rec) {
  const NodeId v = schedule_.steps[k].node;
  if (graph_.persistent(v) && !Movable(graph_, v)) return Error(k, "the node is persistent");
  if (graph_.is_alias(v)) {
    return Error(k, absl::StrCat("the node is an alias; offload its base ",
                                 Quote(graph_.id(graph_.storage(v))), " instead"));
  }
  if (!on_device_[v]) return Error(k, "the node is not resident");
  if (!on_host_[v]) {
    on_host_[v] = 1;
    host_ += graph_.bytes(v);
  }
  if (__builtin_add_overflow(report_.transfer_bytes, graph_.bytes(v), &report_.transfer_bytes)) {
    return Error(k, kTransferOverflow);
  }
  rec.peak_bytes = device_;
  rec.start = std::max(copy_free_at_, ready_[v]);
  if (!host_copy_until_.empty()) rec.start = std::max(rec.start, host_copy_until_[v]);
  rec.end = rec.start + static_cast<double>(graph_.bytes(v)) / options_.host_bandwidth_bytes_per_s;
  copy_free_at_ = rec.end;
  if (!host_copy_until_.empty()) host_copy_until_[v] = rec.end;
  last_use_[v] = std::max(last_use_[v], rec.end);
  report_.copy_busy += rec.end - rec.start;
  return absl::OkStatus();
}

absl::Status Replay::Prefetch(size_t k, StepRecord& rec) {
  const NodeId v = schedule_.steps[k].node;
  if (graph_.is_alias(v)) {
    return Error(k, absl::StrCat("the node is an alias; prefetch its base ",
                                 Quote(graph_.id(graph_.storage(v))),
                                 " and compute the alias again"));
  }
  if (!on_host_[v]) return Error(k, "the node has no host copy");
  if (on_device_[v]) return Error(k, "the node is already resident");
  if (holders_[v] > 0) return Error(k, HeldThroughAlias(graph_, v, on_device_));
  on_device_[v] = 1;
  holders_[v] = 1;
  device_ += graph_.bytes(v);
  if (__builtin_add_overflow(report_.transfer_bytes, graph_.bytes(v), &report_.transfer_bytes)) {
    return Error(k, kTransferOverflow);
  }
  rec.peak_bytes = device_;
  rec.start = std::max(copy_free_at_, frees_done_at_);
  if (!host_copy_until_.empty()) rec.start = std::max(rec.start, host_copy_until_[v]);
  rec.end = rec.start + static_cast<double>(graph_.bytes(v)) / options_.host_bandwidth_bytes_per_s;
  copy_free_at_ = rec.end;
  if (!host_copy_until_.empty()) host_copy_until_[v] = rec.end;
  ready_[v] = rec.end;
  report_.copy_busy += rec.end - rec.start;
  return absl::OkStatus();
}

absl::Status Replay::HostCompute(size_t k, StepRecord& rec) {
  const NodeId v = schedule_.steps[k].node;
  if (graph_.runs_on(v) == Tier::kDevice) {
    return Error(k, "the node runs on the device (only an in-place update with runs_on host or "
                    "auto, and a host_cost, runs on the host)");
  }
  const NodeId root = graph_.storage(v);
  if (computed_[v]) {
    return Error(k, absl::StrCat("the in-place update has run already (it writes ",
                                 Quote(graph_.id(root)), " once per step)"));
  }
  if (holders_[root] > 0) {
    return Error(k, absl::StrCat(
        on_device_[root] ? absl::StrCat("its storage ", Quote(graph_.id(root)),
                                        " is resident on the device")
                         : HeldThroughAlias(graph_, root, on_device_),
        "; a host compute writes the host copy, which would leave the device copy stale "
        "(free it first, after an offload if the device holds the current value)"));
  }
  double start = host_free_at_;
  for (NodeId u : graph_.unique_inputs(v)) {
    const NodeId s = graph_.storage(u);
    if (!on_host_[s] || graph_.version(u) != current_[s]) {
      return Error(k, absl::StrCat("input ", Quote(graph_.id(u)),
                                   " has no current host copy (offload ", Quote(graph_.id(s)),
                                   " after the step that wrote it)"));
    }
    start = std::max(start, host_copy_until_[s]);
    if (!reductions_.active()) continue;
    if (std::string e = reductions_.ReadError(v, u); !e.empty()) return Error(k, e);
  }
  current_[root] = v;  // the host copy stays current: it was written
  rec.peak_bytes = device_;
  rec.start = start;
  rec.end = start + *graph_.host_cost(v);
  host_free_at_ = rec.end;
  for (NodeId u : graph_.unique_inputs(v)) host_copy_until_[graph_.storage(u)] = rec.end;
  report_.host_compute_cost += *graph_.host_cost(v);
  ++computes_;
  computed_[v] = 1;
  ++distinct_computed_;
  return absl::OkStatus();
}

absl::Status Replay::AllReduce(size_t k, StepRecord& rec) {
  const NodeId v = schedule_.steps[k].node;
  const NodeId root = graph_.storage(v);
  if (graph_.persistent(v)) return Error(k, "the node is persistent");
  if (graph_.collective(root)) {  // (a gather's, or a reduce-scatter's: summed once)
    return Error(k, absl::StrCat("its storage is the output of collective ",
                                 Quote(graph_.id(root)),
                                 ", the same on every rank already (a value is reduced once)"));
  }
  if (!on_device_[v]) return Error(k, "the node is not resident");
  if (graph_.has_in_place() && graph_.version(v) != current_[root]) {
    return Error(k, absl::StrCat("the in-place update ", Quote(graph_.id(current_[root])),
                                 " overwrote it"));
  }
  if (std::string e = reductions_.ReduceError(v); !e.empty()) return Error(k, e);
  if (on_host_[root]) {  // the host copy holds this rank's own value
    on_host_[root] = 0;
    host_ -= graph_.bytes(root);
  }
  if (schedule_.steps[k].joins_bucket) {
    rec.start = bucket_.start;
    rec.end = bucket_.end;
  } else {
    RETURN_IF_ERROR(StartAllReduceBucket(k, rec));
  }
  rec.peak_bytes = device_;
  reductions_.Reduced(v, rec.end);
  for (NodeId u : {v, root}) {
    ready_[u] = std::max(ready_[u], rec.end);
    last_use_[u] = std::max(last_use_[u], rec.end);
  }
  return absl::OkStatus();
}

// A bucket (step k and the all_reduce steps that join it) is one collective
// of its tensors' bytes. It follows every compute issued before it (a
// collective on the compute stream's order, as NCCL's and gloo's are) and
// every copy of its storages.
absl::Status Replay::StartAllReduceBucket(size_t k, StepRecord& rec) {
  int64_t bytes = 0, copied = 0;
  std::vector<NodeId> roots;
  rec.start = std::max(network_free_at_, compute_free_at_);
  for (size_t j = k; j < schedule_.steps.size(); ++j) {
    const ::pebble::Step& member = schedule_.steps[j];
    if (j > k && !(member.joins_bucket && member.action == Action::kAllReduce)) break;
    if (member.node < 0 || member.node >= n_) break;  // refused at its own step
    const NodeId m = member.node, m_root = graph_.storage(m);
    if (__builtin_add_overflow(bytes, graph_.bytes(m), &bytes)) {
      return Error(k, kTransferOverflow);
    }
    // Each member's place in the copy, rounded up to the runtime's
    // alignment (a GPU allocator's block, for one allocation per copy).
    const int64_t align = options_.bucket_copy_alignment;
    const int64_t place = graph_.bytes(m) / align * align;
    if (__builtin_add_overflow(copied, place, &copied) ||
        (place < graph_.bytes(m) && __builtin_add_overflow(copied, align, &copied))) {
      return Error(k, kTransferOverflow);
    }
    roots.push_back(m_root);
    rec.start = std::max({rec.start, ready_[m], ready_[m_root], last_use_[m_root]});
  }
  rec.end = rec.start + AllReduceSeconds(bytes, options_.ranks, options_.network);
  if (!OnNetworkStream(bytes, rec.end - rec.start, rec.end)) return Error(k, kTransferOverflow);
  bucket_ = {rec.start, rec.end};
  // One member is reduced where it lies; several, through a copy.
  if (!copies_of_.empty() && roots.size() > 1) {
    if (__builtin_add_overflow(device_, copied, &device_)) {
      return Error(k, "the bucket's device copy takes memory past 2^63 - 1 bytes");
    }
    for (NodeId r : roots) copies_of_[r].push_back(static_cast<int>(copy_bytes_.size()));
    copy_bytes_.push_back(copied);
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanReport> Replay::Finish() && {
  if (graph_.has_homes()) RETURN_IF_ERROR(CheckHomes(graph_, on_device_, on_host_));
  RETURN_IF_ERROR(reductions_.CheckEnd());
  for (NodeId v = 0; v < n_ && graph_.has_in_place(); ++v) {
    if (graph_.in_place(v) && !computed_[v]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: the in-place update ", Quote(graph_.id(v)),
          " never ran (every update runs once per step)"));
    }
  }
  for (NodeId out : graph_.outputs()) {
    if (!on_device_[out]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: output '", graph_.id(out), "' is not resident at the end"));
    }
  }
  PlanReport& r = report_;
  // Costs are finite, but their sums may not be: a figure printed as "inf"
  // or JSON's null would be silently wrong.
  if (!std::isfinite(r.compute_cost) || !std::isfinite(r.makespan) ||
      !std::isfinite(r.copy_busy) || !std::isfinite(r.base_cost) ||
      !std::isfinite(r.host_compute_cost) || !std::isfinite(r.network_busy)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kCostOverflow, " (about 1.8e308): the graph's costs, a copy's time (its bytes over "
        "the host bandwidth) or a collective's (over the network, with its latency) sum past "
        "it; give the costs in a smaller unit, or a larger bandwidth or a smaller latency "
        "(--throughput, --bandwidth, --network, --network-latency, a --profile's figures)"));
  }
  r.recomputations = computes_ - distinct_computed_;
  r.one_shot = r.recomputations == 0;
  r.overhead = r.base_cost > 0 ? r.compute_cost / r.base_cost - 1 : 0;
  // (sums of the same costs in another order differ in their last bits: a
  // one-shot plan's 2.2e-16 is 0)
  if (std::abs(r.overhead) < 1e-9) r.overhead = 0;
  r.exposed_transfer_time = std::max(0.0, r.makespan - r.compute_busy);
  return std::move(report_);
}

}  // namespace

absl::StatusOr<PlanReport> SimulateCandidate(const Graph& graph, const Schedule& schedule,
                                             const SimulatorOptions& options) {
  absl::StatusOr<PlanReport> report = Simulate(graph, schedule, options);
  if (report.ok() || !absl::StartsWith(report.status().message(), kCostOverflow)) return report;
  PlanReport worst;
  worst.peak_bytes = worst.host_peak_bytes = worst.transfer_bytes = INT64_MAX;
  worst.compute_cost = worst.makespan = worst.base_cost = std::numeric_limits<double>::infinity();
  return worst;
}

absl::StatusOr<PlanReport> Simulate(const Graph& graph,
                                    const Schedule& schedule,
                                    const SimulatorOptions& options) {
  RETURN_IF_ERROR(CheckOptions(graph, options));
  if (graph.has_auto_homes()) return Simulate(ResolveHomes(graph, schedule), schedule, options);
  Replay replay(graph, schedule, options);
  for (size_t k = 0; k < schedule.steps.size(); ++k) RETURN_IF_ERROR(replay.Step(k));
  return std::move(replay).Finish();
}

nlohmann::json ReportToJson(const PlanReport& report, const Graph& graph,
                            const Schedule& schedule, bool with_timeline) {
  nlohmann::json j = {
      {"peak_bytes", report.peak_bytes},
      {"compute_cost", report.compute_cost},
      {"base_cost", report.base_cost},
      {"overhead", report.overhead},
      {"recomputations", report.recomputations},
      {"transfer_bytes", report.transfer_bytes},
      {"host_peak_bytes", report.host_peak_bytes},
      {"makespan", report.makespan},
      {"peak_step", report.peak_step},
      {"initial_bytes", report.initial_bytes},
      {"one_shot", report.one_shot},
      {"num_steps", report.num_steps},
      {"compute_busy", report.compute_busy},
      {"copy_busy", report.copy_busy},
      {"exposed_transfer_time", report.exposed_transfer_time},
  };
  if (graph.has_host_costs()) j["host_compute_cost"] = report.host_compute_cost;
  if (report.collectives > 0) {
    j["collectives"] = report.collectives;
    j["collective_bytes"] = report.collective_bytes;
    j["network_busy"] = report.network_busy;
  }
  if (with_timeline) {
    PEBBLE_CHECK(schedule.steps.size() == report.timeline.size(),
                 "timeline and schedule differ in length");
    nlohmann::json timeline = nlohmann::json::array();
    for (size_t k = 0; k < schedule.steps.size(); ++k) {
      const StepRecord& r = report.timeline[k];
      timeline.push_back({{"action", std::string(ActionName(schedule.steps[k].action))},
                          {"node", graph.id(schedule.steps[k].node)},
                          {"device_bytes", r.device_bytes},
                          {"peak_bytes", r.peak_bytes},
                          {"host_bytes", r.host_bytes},
                          {"start", r.start},
                          {"end", r.end}});
    }
    j["timeline"] = std::move(timeline);
  }
  return j;
}

}  // namespace pebble
