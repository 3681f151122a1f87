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
  if (graph.has_auto_homes()) return Simulate(ResolveHomes(graph, schedule), schedule, options);
  const int n = graph.num_nodes();
  const double bandwidth = options.host_bandwidth_bytes_per_s;
  PlanReport report;
  report.base_cost = BaseCost(graph);
  report.num_steps = static_cast<int64_t>(schedule.steps.size());

  std::vector<uint8_t> on_device(n, 0);
  // Per storage root: how many nodes of D hold it (itself and its aliases,
  // SPEC section 1 "Aliases"); its bytes count while this is positive.
  std::vector<int32_t> holders(n, 0);
  std::vector<uint8_t> on_host(n, 0);
  std::vector<uint8_t> computed(n, 0);
  // Time model state (SPEC section 4).
  std::vector<double> ready(n, 0.0);     // when the resident copy is valid
  std::vector<double> last_use(n, 0.0);  // latest end of a compute that read
                                         // or produced the node, or of its
                                         // offload
  double compute_free_at = 0;  // end of the previous compute
  double copy_free_at = 0;     // end of the previous copy
  double host_free_at = 0;     // end of the previous host compute
  // Per storage: the end of the latest copy or host compute on its host
  // copy (a host compute and a copy of one host copy run one after the
  // other; copies alone are ordered by their stream already).
  std::vector<double> host_copy_until(graph.has_host_costs() ? n : 0, 0.0);
  double frees_done_at = 0;    // R_k: latest end of earlier frees
  double network_free_at = 0;  // end of the previous collective
  struct {
    double start = 0, end = 0;
  } bucket;  // the interval of the last bucket (of all_reduce steps or of collectives)
  Reductions reductions(graph, schedule, options);
  // Counts a collective on the network stream, `seconds` long and ending at
  // `end`, of a tensor of `bytes` (the whole); false where the bytes
  // overflow.
  auto on_network_stream = [&](int64_t bytes, double seconds, double end) {
    network_free_at = end;
    report.network_busy += seconds;
    ++report.collectives;
    return !__builtin_add_overflow(report.collective_bytes, bytes, &report.collective_bytes);
  };

  // current[s]: the node whose value storage s holds now: its base, then
  // each in-place node that wrote it. Only graphs with updates need it.
  std::vector<NodeId> current(graph.has_in_place() ? n : 0);
  std::iota(current.begin(), current.end(), NodeId{0});
  int64_t device = 0;
  int64_t host = 0;
  for (NodeId v = 0; v < n; ++v) {
    if (!graph.persistent(v)) continue;
    if (graph.home(v) == Tier::kHost) {
      on_host[v] = 1;
      host += graph.bytes(v);
      continue;
    }
    on_device[v] = 1;
    holders[v] = 1;
    device += graph.bytes(v);
  }
  // Buckets' device copies (SimulatorOptions::device_bucket_copies): each
  // copy's bytes (0 once freed), and per storage root the copies that hold
  // a sum for it (two views of one storage may be in different buckets).
  std::vector<int64_t> copy_bytes;
  std::vector<std::vector<int>> copies_of(options.device_bucket_copies ? n : 0);
  // Frees every copy that holds a sum for `u`'s storage: the runtime settles
  // them before a step touches that storage.
  auto settle_copies_of = [&](NodeId u) {
    for (int c : copies_of[graph.storage(u)]) {
      device -= copy_bytes[c];
      copy_bytes[c] = 0;
    }
    copies_of[graph.storage(u)].clear();
  };
  int64_t distinct_computed = 0;
  int64_t computes = 0;
  report.initial_bytes = device;
  report.host_peak_bytes = host;
  report.peak_bytes = device;
  report.peak_step = -1;
  report.timeline.reserve(schedule.steps.size());

  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    const Step& step = schedule.steps[k];
    const NodeId v = step.node;
    if (v < 0 || v >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid schedule at step ", k, ": node id ", v,
                       " out of range"));
    }
    StepRecord rec;
    if (std::string e = BucketJoinError(graph, schedule, k); !e.empty()) {
      return StepError(graph, k, step, e);
    }
    if (!copies_of.empty() && step.action != Action::kAllReduce) {
      settle_copies_of(v);
      if (step.action == Action::kCompute || step.action == Action::kHostCompute) {
        for (NodeId u : graph.unique_inputs(v)) settle_copies_of(u);
      }
    }
    switch (step.action) {
      case Action::kCompute: {
        if (graph.persistent(v)) {
          return StepError(graph, k, step, "the node is persistent");
        }
        if (on_device[v]) {
          return StepError(graph, k, step, "the node is already resident");
        }
        if (!graph.is_alias(v) && holders[v] > 0) {
          return StepError(graph, k, step, HeldThroughAlias(graph, v, on_device));
        }
        if (graph.runs_on(v) == Tier::kHost) {
          return StepError(graph, k, step,
                           "the node runs on the host (runs_on: host): use host_compute");
        }
        if (graph.in_place(v) && computed[v]) {
          return StepError(graph, k, step,
                           absl::StrCat("the in-place update has run already (it writes ",
                                        Quote(graph.id(graph.storage(v))), " once per step)"));
        }
        // A collective node runs on the network stream (docs/semantics.md,
        // "Sharding"), anything else on the compute stream.
        const bool on_network = graph.collective(v);
        double start = std::max(on_network ? network_free_at : compute_free_at, frees_done_at);
        for (NodeId u : graph.unique_inputs(v)) {
          if (!on_device[u]) {
            return StepError(graph, k, step,
                             absl::StrCat("input '", graph.id(u),
                                          "' is not resident"));
          }
          if (graph.has_in_place() && graph.version(u) != current[graph.storage(u)]) {
            return StepError(graph, k, step, absl::StrCat(
                "input ", Quote(graph.id(u)), " was overwritten by the in-place update ",
                Quote(graph.id(current[graph.storage(u)])), " (reads of a storage's earlier "
                "value come before its update)"));
          }
          start = std::max(start, ready[u]);
          if (!reductions.active()) continue;
          if (std::string e = reductions.ReadError(v, u); !e.empty()) {
            return StepError(graph, k, step, e);
          }
          start = std::max(start, reductions.ReadyAt(u));
        }
        on_device[v] = 1;
        // An alias's storage is resident already (its input is in D), so
        // only a base adds bytes.
        const NodeId root = graph.storage(v);
        if (holders[root]++ == 0) device += graph.bytes(root);
        reductions.Computed(v);  // this rank's own value
        if (graph.in_place(v)) {
          // The write makes every host copy of the storage stale.
          current[root] = v;
          if (on_host[root]) {
            on_host[root] = 0;
            host -= graph.bytes(root);
          }
        }
        rec.peak_bytes = device + graph.workspace(v);
        rec.start = start;
        rec.end = start + graph.cost(v);
        // The whole tensor's bytes: a gather's output, a reduce-scatter's input.
        const int64_t bytes =
            on_network ? std::max(graph.bytes(v), graph.bytes(graph.inputs(v)[0])) : 0;
        if (step.joins_bucket) {  // one message with the steps before (BucketJoinError)
          rec.start = bucket.start;
          rec.end = bucket.end;
        } else if (on_network && k + 1 < schedule.steps.size() &&
                   schedule.steps[k + 1].joins_bucket) {
          // A bucket of collectives: one message of all their bytes, when
          // every member's input is ready.
          int64_t total = bytes;
          if (!JoinedCollectives(graph, schedule, k, ready, reductions, total, rec.start)) {
            return StepError(graph, k, step, kTransferOverflow);
          }
          const std::optional<CollectiveLink> link = CollectiveLinkOf(graph, v);
          if (!link.has_value()) {  // the next step is refused for it
            return StepError(graph, k + 1, schedule.steps[k + 1],
                             BucketJoinError(graph, schedule, k + 1));
          }
          rec.end = rec.start + AllGatherSeconds(total, link->ranks, link->link);
          if (!on_network_stream(total, rec.end - rec.start, rec.end)) {
            return StepError(graph, k, step, kTransferOverflow);
          }
          bucket = {rec.start, rec.end};
        } else if (on_network && !on_network_stream(bytes, graph.cost(v), rec.end)) {
          return StepError(graph, k, step, kTransferOverflow);
        }
        ready[v] = rec.end;
        last_use[v] = std::max(last_use[v], rec.end);
        for (NodeId u : graph.unique_inputs(v)) {
          last_use[u] = std::max(last_use[u], rec.end);
        }
        if (!on_network) {
          compute_free_at = rec.end;
          report.compute_cost += graph.cost(v);
          report.compute_busy += graph.cost(v);
        }
        ++computes;
        if (!computed[v]) {
          computed[v] = 1;
          ++distinct_computed;
        }
        break;
      }
      case Action::kFree: {
        if (graph.persistent(v) && !Movable(graph, v)) {
          return StepError(graph, k, step, "the node is persistent");
        }
        if (Movable(graph, v) && !on_host[v] && on_device[v]) {
          return StepError(graph, k, step,
                           "the persistent node has no current host copy (offload it first)");
        }
        if (!on_device[v]) {
          return StepError(graph, k, step, "the node is not resident");
        }
        on_device[v] = 0;
        const NodeId root = graph.storage(v);
        if (--holders[root] == 0) device -= graph.bytes(root);
        rec.peak_bytes = device;
        rec.start = rec.end = std::max(last_use[v], reductions.FreeAt(v));
        frees_done_at = std::max(frees_done_at, rec.end);
        break;
      }
      case Action::kOffload: {
        if (graph.persistent(v) && !Movable(graph, v)) {
          return StepError(graph, k, step, "the node is persistent");
        }
        if (graph.is_alias(v)) {
          return StepError(graph, k, step,
                           absl::StrCat("the node is an alias; offload its base ",
                                        Quote(graph.id(graph.storage(v))), " instead"));
        }
        if (!on_device[v]) {
          return StepError(graph, k, step, "the node is not resident");
        }
        if (!on_host[v]) {
          on_host[v] = 1;
          host += graph.bytes(v);
        }
        if (__builtin_add_overflow(report.transfer_bytes, graph.bytes(v), &report.transfer_bytes)) {
          return StepError(graph, k, step, kTransferOverflow);
        }
        rec.peak_bytes = device;
        rec.start = std::max(copy_free_at, ready[v]);
        if (!host_copy_until.empty()) rec.start = std::max(rec.start, host_copy_until[v]);
        rec.end = rec.start + static_cast<double>(graph.bytes(v)) / bandwidth;
        copy_free_at = rec.end;
        if (!host_copy_until.empty()) host_copy_until[v] = rec.end;
        last_use[v] = std::max(last_use[v], rec.end);
        report.copy_busy += rec.end - rec.start;
        break;
      }
      case Action::kPrefetch: {
        if (graph.is_alias(v)) {
          return StepError(graph, k, step,
                           absl::StrCat("the node is an alias; prefetch its base ",
                                        Quote(graph.id(graph.storage(v))),
                                        " and compute the alias again"));
        }
        if (!on_host[v]) {
          return StepError(graph, k, step, "the node has no host copy");
        }
        if (on_device[v]) {
          return StepError(graph, k, step, "the node is already resident");
        }
        if (holders[v] > 0) {
          return StepError(graph, k, step, HeldThroughAlias(graph, v, on_device));
        }
        on_device[v] = 1;
        holders[v] = 1;
        device += graph.bytes(v);
        if (__builtin_add_overflow(report.transfer_bytes, graph.bytes(v), &report.transfer_bytes)) {
          return StepError(graph, k, step, kTransferOverflow);
        }
        rec.peak_bytes = device;
        rec.start = std::max(copy_free_at, frees_done_at);
        if (!host_copy_until.empty()) rec.start = std::max(rec.start, host_copy_until[v]);
        rec.end = rec.start + static_cast<double>(graph.bytes(v)) / bandwidth;
        copy_free_at = rec.end;
        if (!host_copy_until.empty()) host_copy_until[v] = rec.end;
        ready[v] = rec.end;
        report.copy_busy += rec.end - rec.start;
        break;
      }
      case Action::kHostCompute: {
        if (graph.runs_on(v) == Tier::kDevice) {
          return StepError(graph, k, step,
                           "the node runs on the device (only an in-place update with "
                           "runs_on host or auto, and a host_cost, runs on the host)");
        }
        const NodeId root = graph.storage(v);
        if (computed[v]) {
          return StepError(graph, k, step,
                           absl::StrCat("the in-place update has run already (it writes ",
                                        Quote(graph.id(root)), " once per step)"));
        }
        if (holders[root] > 0) {
          return StepError(graph, k, step, absl::StrCat(
              on_device[root] ? absl::StrCat("its storage ", Quote(graph.id(root)),
                                             " is resident on the device")
                              : HeldThroughAlias(graph, root, on_device),
              "; a host compute writes the host copy, which would leave the device copy stale "
              "(free it first, after an offload if the device holds the current value)"));
        }
        double start = host_free_at;
        for (NodeId u : graph.unique_inputs(v)) {
          const NodeId s = graph.storage(u);
          if (!on_host[s] || graph.version(u) != current[s]) {
            return StepError(graph, k, step, absl::StrCat(
                "input ", Quote(graph.id(u)), " has no current host copy (offload ",
                Quote(graph.id(s)), " after the step that wrote it)"));
          }
          start = std::max(start, host_copy_until[s]);
          if (!reductions.active()) continue;
          if (std::string e = reductions.ReadError(v, u); !e.empty()) {
            return StepError(graph, k, step, e);
          }
        }
        current[root] = v;  // the host copy stays current: it was written
        rec.peak_bytes = device;
        rec.start = start;
        rec.end = start + *graph.host_cost(v);
        host_free_at = rec.end;
        for (NodeId u : graph.unique_inputs(v)) host_copy_until[graph.storage(u)] = rec.end;
        report.host_compute_cost += *graph.host_cost(v);
        ++computes;
        computed[v] = 1;
        ++distinct_computed;
        break;
      }
      case Action::kAllReduce: {
        const NodeId root = graph.storage(v);
        if (graph.persistent(v)) return StepError(graph, k, step, "the node is persistent");
        if (graph.collective(root)) {  // (a gather's, or a reduce-scatter's: summed once)
          return StepError(graph, k, step, absl::StrCat(
              "its storage is the output of collective ", Quote(graph.id(root)),
              ", the same on every rank already (a value is reduced once)"));
        }
        if (!on_device[v]) return StepError(graph, k, step, "the node is not resident");
        if (graph.has_in_place() && graph.version(v) != current[root]) {
          return StepError(graph, k, step, absl::StrCat(
              "the in-place update ", Quote(graph.id(current[root])), " overwrote it"));
        }
        if (std::string e = reductions.ReduceError(v); !e.empty()) {
          return StepError(graph, k, step, e);
        }
        if (on_host[root]) {  // the host copy holds this rank's own value
          on_host[root] = 0;
          host -= graph.bytes(root);
        }
        // A bucket (this step and the all_reduce steps that join it) is one
        // collective of its tensors' bytes. It follows every compute
        // issued before it (a collective on the compute stream's order, as
        // NCCL's and gloo's are) and every copy of its storages.
        if (step.joins_bucket) {
          rec.start = bucket.start;
          rec.end = bucket.end;
        } else {
          int64_t bytes = 0, copied = 0;
          std::vector<NodeId> roots;
          rec.start = std::max(network_free_at, compute_free_at);
          for (size_t j = k; j < schedule.steps.size(); ++j) {
            const Step& member = schedule.steps[j];
            if (j > k && !(member.joins_bucket && member.action == Action::kAllReduce)) break;
            if (member.node < 0 || member.node >= n) break;  // refused at its own step
            const NodeId m = member.node, m_root = graph.storage(m);
            if (__builtin_add_overflow(bytes, graph.bytes(m), &bytes)) {
              return StepError(graph, k, step, kTransferOverflow);
            }
            // Each member's place in the copy, rounded up to the runtime's
            // alignment (a GPU allocator's block, for one allocation per copy).
            const int64_t align = options.bucket_copy_alignment;
            const int64_t place = graph.bytes(m) / align * align;
            if (__builtin_add_overflow(copied, place, &copied) ||
                (place < graph.bytes(m) && __builtin_add_overflow(copied, align, &copied))) {
              return StepError(graph, k, step, kTransferOverflow);
            }
            roots.push_back(m_root);
            rec.start = std::max({rec.start, ready[m], ready[m_root], last_use[m_root]});
          }
          rec.end = rec.start + AllReduceSeconds(bytes, options.ranks, options.network);
          if (!on_network_stream(bytes, rec.end - rec.start, rec.end)) {
            return StepError(graph, k, step, kTransferOverflow);
          }
          bucket = {rec.start, rec.end};
          // One member is reduced where it lies; several, through a copy.
          if (!copies_of.empty() && roots.size() > 1) {
            if (__builtin_add_overflow(device, copied, &device)) {
              return StepError(graph, k, step, "the bucket's device copy takes memory past "
                                               "2^63 - 1 bytes");
            }
            for (NodeId r : roots) copies_of[r].push_back(static_cast<int>(copy_bytes.size()));
            copy_bytes.push_back(copied);
          }
        }
        rec.peak_bytes = device;
        reductions.Reduced(v, rec.end);
        for (NodeId u : {v, root}) {
          ready[u] = std::max(ready[u], rec.end);
          last_use[u] = std::max(last_use[u], rec.end);
        }
        break;
      }
    }
    rec.device_bytes = device;
    rec.host_bytes = host;
    if (rec.peak_bytes > report.peak_bytes) {
      report.peak_bytes = rec.peak_bytes;
      report.peak_step = static_cast<int>(k);
    }
    report.host_peak_bytes = std::max(report.host_peak_bytes, host);
    report.makespan = std::max(report.makespan, rec.end);
    report.timeline.push_back(rec);
  }

  if (graph.has_homes()) RETURN_IF_ERROR(CheckHomes(graph, on_device, on_host));
  RETURN_IF_ERROR(reductions.CheckEnd());
  for (NodeId v = 0; v < n && graph.has_in_place(); ++v) {
    if (graph.in_place(v) && !computed[v]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: the in-place update ", Quote(graph.id(v)),
          " never ran (every update runs once per step)"));
    }
  }
  for (NodeId out : graph.outputs()) {
    if (!on_device[out]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid schedule: output '", graph.id(out),
          "' is not resident at the end"));
    }
  }
  // Costs are finite, but their sums may not be: a figure printed as
  // "inf" or JSON's null would be silently wrong.
  if (!std::isfinite(report.compute_cost) || !std::isfinite(report.makespan) ||
      !std::isfinite(report.copy_busy) || !std::isfinite(report.base_cost) ||
      !std::isfinite(report.host_compute_cost) || !std::isfinite(report.network_busy)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kCostOverflow, " (about 1.8e308): the graph's costs, a copy's time (its bytes over "
        "the host bandwidth) or a collective's (over the network, with its latency) sum past "
        "it; give the costs in a smaller unit, or a larger bandwidth or a smaller latency "
        "(--throughput, --bandwidth, --network, --network-latency, a --profile's figures)"));
  }
  report.recomputations = computes - distinct_computed;
  report.one_shot = report.recomputations == 0;
  report.overhead =
      report.base_cost > 0 ? report.compute_cost / report.base_cost - 1 : 0;
  // (sums of the same costs in another order differ in their last bits: a
  // one-shot plan's 2.2e-16 is 0)
  if (std::abs(report.overhead) < 1e-9) report.overhead = 0;
  report.exposed_transfer_time =
      std::max(0.0, report.makespan - report.compute_busy);
  return report;
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
