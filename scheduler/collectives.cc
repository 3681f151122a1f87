#include "scheduler/collectives.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "scheduler/budget.h"
#include "scheduler/policies.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {

namespace {

struct NetworkPreset {
  absl::string_view name;
  NetworkLink link;
};
constexpr NetworkPreset kNetworkPresets[] = {
    {"ethernet-10g", {1.25e9, 25e-6}}, {"ethernet-100g", {12.5e9, 10e-6}},
    {"ib-hdr", {25e9, 5e-6}},          {"ib-ndr", {50e9, 5e-6}},
    {"nvlink4", {450e9, 3e-6}}};

}  // namespace

absl::StatusOr<NetworkLink> ParseNetwork(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  for (const NetworkPreset& p : kNetworkPresets) {
    if (lower == p.name) return p.link;
  }
  absl::StatusOr<double> rate = ParseByteRate(text);
  if (!rate.ok() || !(*rate > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid network ", Quote(text), ": expected bytes per second (12.5e9, 10GB) or a "
        "preset (ethernet-10g, ethernet-100g, ib-hdr, ib-ndr, nvlink4)"));
  }
  NetworkLink link;
  link.bandwidth_bytes_per_s = *rate;
  return link;
}

namespace {

// Note [Where a gradient is reduced]. DistributedDataParallel's rule: a
// gradient is all-reduced as soon as autograd has completed it, while the
// backward goes on. In a plan, "completed" is after the gradient's last
// compute, and "the backward is done with it" is after the last compute
// that reads its storage and is no optimizer update: autograd may hand one
// tensor to two consumers (the gradients of both operands of x + p), and
// the backward must read the rank's own value there. The all-reduce must
// also come before the first step that copies its storage to the host,
// frees the gradient, or updates from it: past those, the host copy, the
// freed memory or the update would miss the sum. Where the backward still
// reads the storage after such a step, no place is right: an error.
absl::StatusOr<size_t> ReducePosition(const Graph& graph, const Schedule& schedule,
                                      NodeId gradient) {
  const NodeId root = graph.storage(gradient);
  const size_t n = schedule.steps.size();
  size_t last_compute = n;
  for (size_t k = 0; k < n; ++k) {
    const Step& s = schedule.steps[k];
    if (s.action == Action::kCompute && s.node == gradient) last_compute = k;
  }
  if (last_compute == n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient ", Quote(graph.id(gradient)), " is never computed by the schedule"));
  }
  auto reads_storage = [&](NodeId w) {
    for (NodeId u : graph.unique_inputs(w)) {
      if (graph.storage(u) == root) return true;
    }
    return false;
  };
  size_t after = last_compute;
  bool closed = false;  // a copy, free or update of the storage came
  for (size_t k = last_compute + 1; k < n; ++k) {
    const Step& s = schedule.steps[k];
    const bool on_storage = graph.storage(s.node) == root;
    const bool closes =
        (s.action == Action::kOffload && on_storage) ||
        (s.action == Action::kFree && (s.node == gradient || s.node == root)) ||
        ((s.action == Action::kCompute || s.action == Action::kHostCompute) &&
         graph.role(s.node) == Role::kUpdate && reads_storage(s.node));
    if (closes) closed = true;
    const bool backward_read = s.action == Action::kCompute && !graph.in_place(s.node) &&
                               !graph.is_alias(s.node) && reads_storage(s.node);
    if (!backward_read) continue;
    if (closed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient ", Quote(graph.id(gradient)), " is read by ", Quote(graph.id(s.node)),
          " (step ", k, ") after the schedule copied, freed or updated from it: no point of "
          "the schedule can sum it over the ranks"));
    }
    after = k;
  }
  return after;
}

}  // namespace

absl::StatusOr<Schedule> ReduceGradients(const Graph& graph, const Schedule& schedule) {
  std::vector<std::pair<size_t, NodeId>> inserts;  // (after step, gradient)
  const std::vector<NodeId> gradients = GradientsToReduce(graph);
  // A gradient that is a view of another is summed with it.
  std::vector<uint8_t> is_gradient(graph.num_nodes(), 0);
  for (NodeId g : gradients) is_gradient[g] = 1;
  auto within_another = [&](NodeId g) {
    for (NodeId a = graph.alias_of(g); a != kNoNode; a = graph.alias_of(a)) {
      if (is_gradient[a]) return true;
    }
    return false;
  };
  for (NodeId g : gradients) {
    if (within_another(g)) continue;
    ASSIGN_OR_RETURN(size_t after, ReducePosition(graph, schedule, g));
    inserts.emplace_back(after, g);
  }
  std::stable_sort(inserts.begin(), inserts.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  Schedule out;
  out.steps.reserve(schedule.steps.size() + inserts.size());
  size_t next = 0;
  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    out.steps.push_back(schedule.steps[k]);
    for (; next < inserts.size() && inserts[next].first == k; ++next) {
      out.steps.push_back({Action::kAllReduce, inserts[next].second});
    }
  }
  return out;
}

namespace {

// What a sharded graph's collectives were timed for, as ShardGraph writes
// it in their attrs; nullopt where no collective says (a graph written by
// hand).
struct ShardedFor {
  int ranks = 0;
  NetworkLink link;
};

std::optional<ShardedFor> ShardedRanks(const Graph& graph) {
  for (NodeId v = 0; v < graph.num_nodes() && graph.has_collectives(); ++v) {
    if (!graph.collective(v)) continue;
    const nlohmann::json& a = graph.attrs(v);
    if (a.is_object() && a.contains("ranks") && a["ranks"].is_number_integer() &&
        a.contains("network_bandwidth_bytes_per_s") && a.contains("network_latency_s") &&
        a["network_bandwidth_bytes_per_s"].is_number() && a["network_latency_s"].is_number()) {
      return ShardedFor{a["ranks"].get<int>(),
                        {a["network_bandwidth_bytes_per_s"].get<double>(),
                         a["network_latency_s"].get<double>()}};
    }
  }
  return std::nullopt;
}

class GradientReductionPlanner : public Planner {
 public:
  explicit GradientReductionPlanner(std::unique_ptr<Planner> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const std::optional<ShardedFor> sharded = ShardedRanks(graph);
    // ranks 1: a nested policy's call, planning for one rank what this
    // wrapper completes (below).
    if (sharded.has_value() && options.ranks > 1 && sharded->ranks != options.ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the graph is sharded for ", sharded->ranks, " ranks (its collectives are timed for "
          "them): plan it with ", sharded->ranks, " ranks, not ", options.ranks));
    }
    if (options.ranks <= 1) return inner_->Plan(graph, options);
    // One rank's plan: a policy that plans with others (hybrid, checkmate's
    // warm starts) makes them through MakePlanner, wrapped too, and the
    // all-reduces are added once, here.
    PlannerOptions one_rank = options;
    one_rank.ranks = 1;
    ASSIGN_OR_RETURN(PlanResult planned, inner_->Plan(graph, one_rank));
    ASSIGN_OR_RETURN(Schedule schedule, ReduceGradients(graph, planned.schedule));
    ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(schedule), options));
    // The all-reduces move no memory: the inner plan's verdict and notes
    // stand, its figures are replaced by those with the network's time.
    result.message = std::move(planned.message);
    result.details = std::move(planned.details);
    const PlanReport& r = result.report;
    // A sharded graph's collectives were timed on the link it records.
    const NetworkLink& link = sharded.has_value() ? sharded->link : options.network;
    result.details["collectives"] = {
        {"ranks", options.ranks},
        {"count", r.collectives},
        {"all_reduce", CountSteps(result.schedule, Action::kAllReduce)},
        {"bytes", r.collective_bytes},
        {"network_busy", r.network_busy},
        {"network_bandwidth_bytes_per_s", link.bandwidth_bytes_per_s},
        {"network_latency_s", link.latency_s}};
    return result;
  }

 private:
  std::unique_ptr<Planner> inner_;
};

}  // namespace

std::unique_ptr<Planner> WithGradientReduction(std::unique_ptr<Planner> inner) {
  return std::make_unique<GradientReductionPlanner>(std::move(inner));
}

// Note [Sharded graphs]. ZeRO-3 (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", 2020) and
// PyTorch FSDP's FULL_SHARD keep 1/ranks of every parameter, gradient and
// optimizer state on each rank. A layer's parameter is all-gathered before
// the layer runs and freed after; the backward gathers it again; each
// gradient is reduce-scattered, so a rank keeps the sum of its shard, and
// the optimizer updates that shard. As a graph: the gathered parameter is
// an ordinary tensor, computed (gathered) from the persistent shard by a
// collective node and freeable and computable again like any activation.
// So every policy decides when each parameter is gathered and how long the
// gathered copy lives, jointly with recomputation and offload, and FSDP's
// own rule is one schedule among them (the "fsdp" policy). The gathered
// node's id is "gather:p", placed before p's first reader in the graph's
// own order; the reduce-scatter takes the gradient's id, "grad:p", so the
// optimizer's updates and the outputs read the shard. Shards are equal, of
// ceil(numel / ranks) elements (the last one padded); the gathered tensor
// is the parameter's own size. A gradient may be a view (PyTorch's Linear weight
// gradient is the transpose of a matmul's output, and one bias's gradient
// may be a view of another's), and then the local gradient keeps that view;
// the reduce-scatter reads it into a shard of its own. A gradient added
// into one kept from before the step is refused.
namespace {

struct ShardedParameter {
  int64_t shard_bytes = 0;
  std::optional<Shape> shard_shape;
};

// The shard of a tensor of `bytes`, `shape` and `dtype` (nullopt: unknown;
// without a shape the bytes are split evenly). An element's size is the
// dtype's, else bytes over elements.
ShardedParameter ShardOf(int64_t bytes, const std::optional<Shape>& shape,
                         std::optional<DType> dtype, int ranks) {
  ShardedParameter s;
  if (shape.has_value() && NumElements(*shape) > 0 &&
      (dtype.has_value() || bytes % NumElements(*shape) == 0)) {
    const int64_t numel = NumElements(*shape);
    const int64_t item = dtype.has_value() ? *TensorBytes(Shape{1}, *dtype) : bytes / numel;
    const int64_t shard = (numel + ranks - 1) / ranks;
    s.shard_bytes = shard * item;
    s.shard_shape = Shape{shard};
  } else {
    s.shard_bytes = (bytes + ranks - 1) / ranks;
  }
  return s;
}

ShardedParameter ShardOf(const Graph& g, NodeId p, int ranks) {
  return ShardOf(g.bytes(p), g.shape(p), g.dtype(p), ranks);
}

// A collective node's attrs: the ranks and the link its cost assumes,
// which ShardedRanks reads back.
nlohmann::json ShardAttrs(int ranks, const NetworkLink& link) {
  return {{"ranks", ranks},
          {"network_bandwidth_bytes_per_s", link.bandwidth_bytes_per_s},
          {"network_latency_s", link.latency_s}};
}

// The parameter whose shard a persistent optimizer state "<name>:<p>"
// belongs to, or kNoNode.
NodeId StateOwner(const Graph& g, NodeId s,
                  const absl::flat_hash_map<NodeId, ShardedParameter>& sharded) {
  const std::string& id = g.id(s);
  const size_t colon = id.find(':');
  if (colon == std::string::npos) return kNoNode;
  const NodeId p = g.Find(absl::string_view(id).substr(colon + 1));
  return p != kNoNode && sharded.contains(p) && g.bytes(s) == g.bytes(p) &&
                 g.dtype(s) == g.dtype(p)
             ? p
             : kNoNode;
}

// The parameters ShardGraph shards: persistent, with a gradient "grad:p"
// that the step makes (ShardGraph refuses one added into a kept gradient).
std::vector<NodeId> ShardableParameters(const Graph& g) {
  std::vector<NodeId> out;
  for (NodeId p = 0; p < g.num_nodes(); ++p) {
    if (!g.persistent(p) || g.role(p) != Role::kParameter) continue;
    const NodeId grad = g.Find(absl::StrCat("grad:", g.id(p)));
    if (grad != kNoNode && !g.persistent(grad)) out.push_back(p);
  }
  return out;
}

}  // namespace

std::vector<uint8_t> ShardedTensors(const Graph& g) {
  std::vector<uint8_t> sharded_mask(g.num_nodes(), 0);
  absl::flat_hash_map<NodeId, ShardedParameter> sharded;
  for (NodeId p : ShardableParameters(g)) {
    sharded[p] = ShardOf(g, p, 2);  // StateOwner compares bytes with the parameter's own
    sharded_mask[p] = 1;
  }
  for (NodeId s = 0; s < g.num_nodes(); ++s) {
    if (g.persistent(s) && g.role(s) == Role::kOptimizerState &&
        StateOwner(g, s, sharded) != kNoNode) {
      sharded_mask[s] = 1;
    }
  }
  return sharded_mask;
}

absl::StatusOr<Graph> ShardGraph(const Graph& g, int ranks, const NetworkLink& link) {
  if (ranks < 2) return absl::InvalidArgumentError("sharding needs at least 2 ranks");
  if (g.has_collectives()) {
    return absl::InvalidArgumentError("the graph has collectives already (sharded once)");
  }
  const int n = g.num_nodes();
  // The sharded parameters, and the nodes each shard's storage ends in.
  absl::flat_hash_map<NodeId, ShardedParameter> sharded;
  std::vector<NodeId> shard_root(n, kNoNode);  // a storage -> its parameter
  std::vector<NodeId> gradient_of(n, kNoNode);  // grad:p -> p
  for (NodeId p : ShardableParameters(g)) {
    const NodeId grad = g.Find(absl::StrCat("grad:", g.id(p)));
    if (g.in_place(grad) || g.persistent(g.storage(grad))) {
      return absl::UnimplementedError(absl::StrCat(
          "gradient ", Quote(g.id(grad)), " is added into a gradient kept from before the "
          "step: pebble shards gradients that the step makes"));
    }
    sharded[p] = ShardOf(g, p, ranks);
    shard_root[p] = p;
    gradient_of[grad] = p;
  }
  if (sharded.empty()) {
    return absl::InvalidArgumentError(
        "the graph has no parameter with a gradient \"grad:<parameter>\" to shard");
  }
  for (NodeId s = 0; s < n; ++s) {
    if (g.persistent(s) && g.role(s) == Role::kOptimizerState) {
      if (NodeId p = StateOwner(g, s, sharded); p != kNoNode) shard_root[s] = p;
    }
  }
  for (NodeId v = 0; v < n; ++v) {
    const NodeId root = g.storage(v);
    const bool touched = shard_root[root] != kNoNode;
    if (touched && g.home(root).has_value()) {
      return absl::UnimplementedError(absl::StrCat(
          Quote(g.id(root)), " has a home: pebble does not model sharding with offload yet"));
    }
    if (touched && g.in_place(v) && g.runs_on(v) != Tier::kDevice) {
      return absl::UnimplementedError(absl::StrCat(
          "update ", Quote(g.id(v)), " may run on the host: pebble does not model sharding "
          "with host updates yet"));
    }
  }
  // Every node but the update chains of a sharded storage reads the
  // gathered parameter and the local gradient; the updates read the shards.
  auto is_update = [&](NodeId w) { return g.role(w) == Role::kUpdate || g.in_place(w); };
  auto renamed_input = [&](NodeId w, NodeId u) -> std::string {
    if (sharded.contains(u) && !is_update(w)) return absl::StrCat("gather:", g.id(u));
    if (gradient_of[u] != kNoNode && !is_update(w)) return absl::StrCat("local_grad:", g.id(gradient_of[u]));
    return g.id(u);
  };
  std::vector<NodeId> first_reader(n, kNoNode);
  for (NodeId w : g.topological_order()) {
    for (NodeId u : g.unique_inputs(w)) {
      if (sharded.contains(u) && !is_update(w) && first_reader[u] == kNoNode) first_reader[u] = w;
    }
  }
  std::vector<std::vector<NodeId>> gathers_before(n);
  for (const auto& [p, shard] : sharded) {
    if (first_reader[p] != kNoNode) gathers_before[first_reader[p]].push_back(p);
  }
  GraphBuilder b(absl::StrCat(g.name(), ":sharded", ranks));
  for (NodeId v = 0; v < n; ++v) {
    std::sort(gathers_before[v].begin(), gathers_before[v].end());
    for (NodeId p : gathers_before[v]) {
      NodeSpec gather;
      gather.id = absl::StrCat("gather:", g.id(p));
      gather.op = "all_gather";
      gather.bytes = g.bytes(p);
      gather.shape = g.shape(p);
      gather.dtype = g.dtype(p);
      gather.inputs = {g.id(p)};
      gather.cost = AllGatherSeconds(g.bytes(p), ranks, link);
      gather.collective = true;
      gather.attrs = ShardAttrs(ranks, link);
      b.AddNode(std::move(gather));
    }
    NodeSpec s = SpecOf(g, v);
    for (size_t i = 0; i < s.inputs.size(); ++i) s.inputs[i] = renamed_input(v, g.inputs(v)[i]);
    if (g.is_alias(v)) s.alias_of = renamed_input(v, g.alias_of(v));
    // The shard itself and the updates that write it (a view of the
    // gathered parameter keeps the whole tensor's size).
    if (const NodeId owner = shard_root[g.storage(v)];
        owner != kNoNode && (g.persistent(v) || g.in_place(v))) {
      const ShardedParameter& shard = sharded.at(owner);
      s.bytes = shard.shard_bytes;
      s.shape = shard.shard_shape;
      if (g.in_place(v)) {  // an update of a shard: 1/ranks of the work
        s.cost /= ranks;
        // A temporary of the tensor's size (Adam's denominator) is the shard's.
        s.workspace = s.workspace == g.bytes(owner) ? shard.shard_bytes
                                                    : (s.workspace + ranks - 1) / ranks;
        if (s.host_cost.has_value()) *s.host_cost /= ranks;
      }
    }
    const NodeId p = gradient_of[v];
    if (p == kNoNode) {
      b.AddNode(std::move(s));
      continue;
    }
    s.id = absl::StrCat("local_grad:", g.id(p));
    // The gradient's own dtype; its parameter's shape where it has none.
    const ShardedParameter shard = g.shape(v).has_value()
                                       ? ShardOf(g, v, ranks)
                                       : ShardOf(g.bytes(v), g.shape(p), g.dtype(v), ranks);
    NodeSpec scatter;
    scatter.id = g.id(v);
    scatter.op = "reduce_scatter";
    scatter.bytes = shard.shard_bytes;
    scatter.shape = shard.shard_shape;
    scatter.dtype = g.dtype(v);
    scatter.role = Role::kBackward;
    scatter.inputs = {s.id};
    scatter.cost = AllGatherSeconds(g.bytes(v), ranks, link);
    scatter.collective = true;
    scatter.attrs = ShardAttrs(ranks, link);
    b.AddNode(std::move(s));
    b.AddNode(std::move(scatter));
  }
  for (NodeId o : g.outputs()) b.AddOutput(g.id(o));
  return b.Build();
}

namespace {

// The "fsdp" policy: PyTorch FSDP's FULL_SHARD rule on a sharded graph
// (ShardGraph). The graph's own order, every tensor freed at its last use,
// but each gathered parameter that the backward reads as well is freed
// after its last forward reader (reshard_after_forward) and gathered again
// right before its first backward reader. Gathers run on the network
// stream, so one issued after a compute may start before it ends: the
// prefetch FSDP makes. Every policy plans the alias-folded graph
// (planner.cc), so a view of a gathered parameter is computed again from
// the gather. A graph without gathers gets the baseline.
class FsdpPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const std::vector<NodeId> order = DefaultOrder(graph);
    ASSIGN_OR_RETURN(Schedule base, FreeAtLastUse(graph, order));
    std::vector<int> position(graph.num_nodes(), -1);
    for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
    // Per order position: gathers to free after it, gathers to make before it.
    std::vector<std::vector<NodeId>> free_after(order.size()), gather_before(order.size());
    int resharded = 0;
    for (NodeId g : order) {
      if (!graph.collective(g) || graph.op(g) != "all_gather") continue;
      int last_forward = -1, first_backward = INT32_MAX;
      for (NodeId r : graph.readers(g)) {
        if (position[r] < 0) continue;
        if (graph.role(r) == Role::kBackward) {
          first_backward = std::min(first_backward, position[r]);
        } else {
          last_forward = std::max(last_forward, position[r]);
        }
      }
      if (last_forward < 0 || first_backward == INT32_MAX ||
          last_forward > first_backward) {
        continue;
      }
      free_after[last_forward].push_back(g);
      gather_before[first_backward].push_back(g);
      ++resharded;
    }
    Schedule schedule;
    for (const Step& step : base.steps) {
      const int at = step.action == Action::kCompute ? position[step.node] : -1;
      if (at >= 0) {
        for (NodeId g : gather_before[at]) schedule.steps.push_back({Action::kCompute, g});
      }
      schedule.steps.push_back(step);
      if (at >= 0) {
        for (NodeId g : free_after[at]) schedule.steps.push_back({Action::kFree, g});
      }
    }
    ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(schedule), options));
    result.details["resharded_parameters"] = resharded;
    if (!graph.has_collectives()) {
      result.message = "no sharded parameters (plan with --ranks N --shard full): the baseline";
    }
    return result;
  }
};

}  // namespace

void RegisterFsdpPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "fsdp",
      .description = "PyTorch FSDP's FULL_SHARD rule on a sharded graph (--shard full): the "
                     "graph's own order, each parameter gathered before its forward and again "
                     "before its backward, freed after each",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<FsdpPlanner>(); },
  });
}

}  // namespace pebble
