// Sharded graphs (ZeRO-3 / FSDP FULL_SHARD): ShardGraph and ShardedTensors,
// declared in collectives.h.
#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/collectives.h"

namespace pebble {

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
// own order; the reduce-scatter takes the backward gradient's id, "grad:p"
// ("unclipped_grad:p" where the step clips: Note [Clipping sharded
// gradients]), so the optimizer's updates and the outputs read the shard. Shards are equal, of
// ceil(numel / ranks) elements (the last one padded); the gathered tensor
// is the parameter's own size. A gradient may be a view (PyTorch's Linear weight
// gradient is the transpose of a matmul's output, and one bias's gradient
// may be a view of another's), and then the local gradient keeps that view;
// the reduce-scatter reads it into a shard of its own. A gradient added
// into one kept from before the step is refused. A shard keeps its
// tensor's home and an update its runs_on (with 1/ranks of its host_cost),
// so the optimizer's placement holds on the shards: ZeRO-Offload's updates
// on the host, ZeRO-Infinity's parameters fetched from it for their gathers.
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
// which ShardedRanks (collectives.cc) reads back.
nlohmann::json ShardAttrs(int ranks, const NetworkLink& link) {
  return {{"ranks", ranks},
          {"network_bandwidth_bytes_per_s", link.bandwidth_bytes_per_s},
          {"network_latency_s", link.latency_s}};
}

// A collective node `id` of `op` that reads `input` into a tensor of
// `bytes`, `shape` and `dtype`, taking `seconds` on the ranks' `link`.
NodeSpec CollectiveSpec(std::string id, std::string op, std::string input, int64_t bytes,
                        std::optional<Shape> shape, std::optional<DType> dtype,
                        std::optional<Role> role, double seconds, int ranks,
                        const NetworkLink& link) {
  NodeSpec c;
  c.id = std::move(id);
  c.op = std::move(op);
  c.bytes = bytes;
  c.shape = std::move(shape);
  c.dtype = dtype;
  c.role = role;
  c.inputs = {std::move(input)};
  c.cost = seconds;
  c.collective = true;
  c.attrs = ShardAttrs(ranks, link);
  return c;
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

// The parameters ShardGraph shards: persistent, with a gradient that the
// step makes ("grad:p", or "unclipped_grad:p" where it clips: its
// BackwardGradient; ShardGraph refuses one added into a kept gradient).
std::vector<NodeId> ShardableParameters(const Graph& g) {
  std::vector<NodeId> out;
  for (NodeId p = 0; p < g.num_nodes(); ++p) {
    if (!g.persistent(p) || g.role(p) != Role::kParameter) continue;
    const NodeId grad = BackwardGradient(g, p);
    if (grad != kNoNode && !g.persistent(grad)) out.push_back(p);
  }
  return out;
}

// Note [Clipping sharded gradients]. clip_grad_norm_ under FSDP bounds the
// norm of the whole gradients, which no rank holds. So where the step
// clips (Note [Clipping in the graph], graph/optimizer.cc), the backward's
// gradient "unclipped_grad:p" is the one reduce-scattered; the clipping's
// per-parameter nodes that read it (its square "clip_square:p" and the
// clipped "grad:p") work on the shard, for 1/ranks of their bytes and
// cost, and so does the sum of a square; the total of the squares, a
// rank's part, is summed over the ranks by a collective "clip_total" (op
// all_reduce, one scalar), which the norm reads. So every rank clips its
// shards by one factor, the whole gradients' (up to the order of the
// float32 sums), as FSDP's clip_grad_norm_ does. A shard's padding is
// zero, so it adds nothing to the squares.
struct ShardedClipping {
  std::vector<uint8_t> on_shard;    // per node: a clipping node that reads a gradient shard
  std::vector<uint8_t> sums_shard;  // per node: the sum of such a node (its cost divided)
  NodeId total = kNoNode;           // the rank's sum of squares, which the norm reads
};

// The clipping's nodes of `g` (Note [Clipping in the graph]) that ShardGraph
// puts on shards: per sharded parameter p (gradient_of: its backward
// gradient -> p), "clip_square:p" and "grad:p", which read the backward's
// gradient element-wise, and the sum "clip_part:p". Any other reader of a
// gradient (a backward node, in a graph written by hand) reads the local
// gradient whole, as without clipping.
absl::StatusOr<ShardedClipping> ClippingOnShards(const Graph& g,
                                                 const std::vector<NodeId>& gradient_of) {
  const int n = g.num_nodes();
  ShardedClipping c{std::vector<uint8_t>(n, 0), std::vector<uint8_t>(n, 0), kNoNode};
  if (!ClipsGradients(g)) return c;
  for (NodeId u = 0; u < n; ++u) {
    if (gradient_of[u] == kNoNode) continue;
    const std::string& p = g.id(gradient_of[u]);
    if (!IsUnclippedGradient(g, u)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the step clips its gradients, but ", Quote(g.id(u)), " is not clipped: pebble "
          "shards a step whose every gradient is clipped"));
    }
    for (absl::string_view prefix : {kClipSquarePrefix, kGradPrefix}) {
      const NodeId w = g.Find(absl::StrCat(prefix, p));
      const auto inputs = w == kNoNode ? absl::Span<const NodeId>() : g.unique_inputs(w);
      if (w == kNoNode || std::find(inputs.begin(), inputs.end(), u) == inputs.end() ||
          g.shape(w) != g.shape(u)) {
        return absl::UnimplementedError(absl::StrCat(
            "the clipping of ", Quote(g.id(u)), " has no node ", Quote(absl::StrCat(prefix, p)),
            " that reads it element-wise: sharding clips each rank's shards so (Note "
            "[Clipping in the graph])"));
      }
      c.on_shard[w] = 1;
    }
    const NodeId part = g.Find(absl::StrCat(kClipPartPrefix, p));
    if (part != kNoNode && g.op(part) == "sum") c.sums_shard[part] = 1;
  }
  const NodeId norm = g.Find(kGradNormId);
  if (norm == kNoNode || g.inputs(norm).size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the step clips its gradients, but has no norm ", Quote(kGradNormId),
        " of one input (the sum of the squares) to sum over the ranks"));
  }
  if (g.Find(kClipTotalId) != kNoNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("the graph already has a node ", Quote(kClipTotalId)));
  }
  c.total = g.inputs(norm)[0];
  return c;
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
    const NodeId grad = BackwardGradient(g, p);
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
  // Each parameter is gathered at most twice and its gradient scattered once:
  // where the link makes that time overflow a double, the link is named, not
  // a collective node that pebble made (a latency of 1e308 s did).
  double step_s = 0;
  for (NodeId v = 0; v < n; ++v) step_s += g.cost(v);
  for (const auto& [p, shard] : sharded) step_s += 3 * AllGatherSeconds(g.bytes(p), ranks, link);
  if (!std::isfinite(step_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the network link (", link.bandwidth_bytes_per_s, " bytes/s, latency ", link.latency_s,
        " s) makes the sharded step's collectives take longer than the largest double "
        "(about 1.8e308 s): give a faster link (--network, --network-latency)"));
  }
  for (NodeId s = 0; s < n; ++s) {
    if (g.persistent(s) && g.role(s) == Role::kOptimizerState) {
      if (NodeId p = StateOwner(g, s, sharded); p != kNoNode) shard_root[s] = p;
    }
  }
  ASSIGN_OR_RETURN(const ShardedClipping clipping, ClippingOnShards(g, gradient_of));
  // Every node but the update chains of a sharded storage (and the
  // clipping) reads the gathered parameter and the local gradient; the
  // updates read the shards, and the clipping the gradient's shard.
  auto is_update = [&](NodeId w) { return g.role(w) == Role::kUpdate || g.in_place(w); };
  auto renamed_input = [&](NodeId w, NodeId u) -> std::string {
    if (sharded.contains(u) && !is_update(w)) return absl::StrCat(kGatherPrefix, g.id(u));
    if (gradient_of[u] != kNoNode && !is_update(w) && !clipping.on_shard[w]) {
      return absl::StrCat(kLocalGradPrefix, g.id(gradient_of[u]));
    }
    if (u == clipping.total && g.id(w) == kGradNormId) return std::string(kClipTotalId);
    return g.id(u);
  };
  // Each parameter's gather goes before its first reader but an update.
  std::vector<std::vector<NodeId>> gathers_before(n);
  std::vector<uint8_t> placed(n, 0);
  for (NodeId w : g.topological_order()) {
    for (NodeId u : g.unique_inputs(w)) {
      if (sharded.contains(u) && !is_update(w) && !placed[u]) {
        placed[u] = 1;
        gathers_before[w].push_back(u);
      }
    }
  }
  GraphBuilder b(absl::StrCat(g.name(), " sharded over ", ranks, " ranks"));
  for (NodeId v = 0; v < n; ++v) {
    std::sort(gathers_before[v].begin(), gathers_before[v].end());
    for (NodeId p : gathers_before[v]) {
      b.AddNode(CollectiveSpec(absl::StrCat(kGatherPrefix, g.id(p)), "all_gather", g.id(p),
                               g.bytes(p), g.shape(p), g.dtype(p), std::nullopt,
                               AllGatherSeconds(g.bytes(p), ranks, link), ranks, link));
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
    if (clipping.on_shard[v]) {  // element-wise, on a shard
      const ShardedParameter shard = ShardOf(g, v, ranks);
      s.bytes = shard.shard_bytes;
      s.shape = shard.shard_shape;
      s.cost /= ranks;
    } else if (clipping.sums_shard[v]) {
      s.cost /= ranks;
    }
    if (v == clipping.total) {
      b.AddNode(std::move(s));
      b.AddNode(CollectiveSpec(std::string(kClipTotalId), "all_reduce", g.id(v), g.bytes(v),
                               g.shape(v), g.dtype(v), Role::kBackward,
                               AllReduceSeconds(g.bytes(v), ranks, link), ranks, link));
      continue;
    }
    const NodeId p = gradient_of[v];
    if (p == kNoNode) {
      b.AddNode(std::move(s));
      continue;
    }
    s.id = absl::StrCat(kLocalGradPrefix, g.id(p));
    // The gradient's own dtype; its parameter's shape where it has none.
    const ShardedParameter shard = g.shape(v).has_value()
                                       ? ShardOf(g, v, ranks)
                                       : ShardOf(g.bytes(v), g.shape(p), g.dtype(v), ranks);
    NodeSpec scatter = CollectiveSpec(g.id(v), "reduce_scatter", s.id, shard.shard_bytes,
                                      shard.shard_shape, g.dtype(v), Role::kBackward,
                                      AllGatherSeconds(g.bytes(v), ranks, link), ranks, link);
    b.AddNode(std::move(s));
    b.AddNode(std::move(scatter));
  }
  for (NodeId o : g.outputs()) b.AddOutput(g.id(o));
  return b.Build();
}

}  // namespace pebble
