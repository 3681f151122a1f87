// The graph IR: an immutable DAG of tensors.
//
// Every node is one tensor, produced once per computation by its operator
// from the tensors listed as its inputs (SPEC section 1). Nodes have dense
// integer ids (NodeId, in the order they were added) and live in column
// arrays; inputs and readers are compressed rows. A Graph is only made by
// GraphBuilder::Build(), which validates everything SPEC section 1 names, so
// code that holds a Graph may rely on: ids unique and non-empty, sizes and
// costs in range, every input and output known, no cycle.
//
// Aliases (views, SPEC section 1 "Aliases"): a node may be an alias of one
// of its inputs, its output then a view of that input's storage, as a
// PyTorch view is of its base. alias_of(v) is that input (kNoNode for a node
// of its own storage); storage(v) is the end of the chain, the node whose
// bytes hold v's data (v itself when v is no alias). The memory rules count
// each storage once, with its root's bytes; an alias's own bytes are its
// logical size and add nothing (docs/semantics.md).
#ifndef PEBBLE_GRAPH_GRAPH_H_
#define PEBBLE_GRAPH_GRAPH_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace pebble {

using NodeId = int32_t;
inline constexpr NodeId kNoNode = -1;

// Element types of tensors. Sizes in bytes: DTypeSize().
enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kInt64, kUInt8 };

// Canonical names "fp32", "fp16", "bf16", "i64", "u8". ParseDType also takes
// PyTorch's spellings ("float32", "half", "bfloat16", "int64", "uint8", ...).
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(absl::string_view name);
int64_t DTypeSize(DType dtype);

// What a node is in a training step. Only presentation (describe, DOT) and
// autodiff look at it; the scheduler sees bytes, costs and edges alone.
enum class Role : uint8_t {
  kInput,      // persistent data batch (input, target)
  kParameter,  // persistent trainable weight
  kBuffer,     // persistent non-trainable state (batch-norm running stats)
  kForward,    // activation of the forward pass (the loss included)
  kBackward,   // gradient node produced by autodiff
  kOptimizerState,  // persistent optimizer state (momentum, Adam's moments, steps)
  kUpdate,          // an optimizer's in-place update (graph/optimizer.h)
};
absl::string_view RoleName(Role role);
absl::StatusOr<Role> ParseRole(absl::string_view name);

// Where a persistent tensor lives between steps ("home"; docs/semantics.md,
// "Home tiers and in-place updates"): it starts the step there and must end
// it there. A persistent node without a home is resident throughout, as the
// contract first defined it. kAuto leaves the choice to the plan: the tier
// is the host where the schedule's first step on the node is a prefetch,
// else the device (ResolveHomes, scheduler/schedule.h).
enum class Tier : uint8_t { kDevice, kHost, kAuto };
absl::string_view TierName(Tier tier);  // "device", "host", "auto"
absl::StatusOr<Tier> ParseTier(absl::string_view name);

using Shape = std::vector<int64_t>;
int64_t NumElements(const Shape& shape);  // 1 for a scalar shape []
// Bytes of a tensor of `shape` and `dtype` (NumElements x DTypeSize), or
// nullopt when the product overflows int64_t: the one overflow-checked
// size of untrusted shapes (graph files, .npy headers).
std::optional<int64_t> TensorBytes(const Shape& shape, DType dtype);
std::string ShapeToString(const Shape& shape);  // "(2,1,26,150,320)"

// Bytes for people: "512 B", "1.50 KiB", "977 MiB" (binary units, three
// significant digits).
std::string FormatBytes(int64_t bytes);

// The largest size pebble handles: 2^53 bytes (8 PiB). GraphBuilder refuses
// a node whose bytes, workspace or any shape dimension is larger, and a
// graph whose bytes summed over every node, plus its largest workspace, are:
// so every memory figure of a graph and of its plans (persistent bytes, a
// peak) is at most this. JSON numbers are doubles, which hold every integer
// up to 2^53 exactly: every graph pebble accepts writes and reads back.
inline constexpr int64_t kMaxBytes = int64_t{1} << 53;

// "<bytes> bytes (<FormatBytes>) is above the largest size pebble handles
// (2^53 bytes)": the one way every layer words a size past kMaxBytes.
std::string AboveMaxBytes(int64_t bytes);

// Everything GraphBuilder takes about one node; fields as in SPEC section 1.
struct NodeSpec {
  std::string id;
  std::string op = "generic";
  std::optional<int64_t> bytes;      // required; nullopt is "missing bytes"
  double cost = 1.0;                 // non-negative, finite; one unit per graph
  std::vector<std::string> inputs;   // may repeat; a repeat counts once for residency
  int64_t workspace = 0;             // bytes needed only while computing
  bool persistent = false;
  std::optional<Shape> shape;        // needed only to execute
  std::optional<DType> dtype;        // needed only to execute
  nlohmann::json attrs = nullptr;    // null or an object
  std::optional<Role> role;          // default: kInput if persistent, else kForward
  // The id of the input whose storage this node's output views; none: the
  // node owns its storage. Must name one of `inputs`; an alias is never
  // persistent and has no workspace (a view runs no kernel).
  std::optional<std::string> alias_of;
  // Persistent nodes only: where the tensor lives between steps. With a
  // home, it may leave the device while a current host copy keeps it.
  std::optional<Tier> home;
  // An alias whose compute writes its storage (an optimizer's update of a
  // parameter or of its state): the storage must be persistent, alias_of
  // names the base or the previous in-place node of the same storage, the
  // node runs once per step, and nothing reads the storage's earlier value
  // after it. It may have a workspace.
  bool in_place = false;
  // In-place nodes only: where the node runs ("runs_on"): the device (the
  // default), the host (a CPU update of host copies, action host_compute),
  // or either, as the plan chooses (kAuto). Host and auto need host_cost,
  // its time on the host in the graph's cost unit.
  std::optional<Tier> runs_on;
  std::optional<double> host_cost;
  // A collective that the ranks run together on their network (an
  // all-gather of a sharded parameter, a reduce-scatter of a gradient;
  // docs/semantics.md, "Sharding"): computed on the network stream, its
  // `cost` the network's time. Not persistent, no alias, no workspace, one
  // input.
  bool collective = false;
};

class Graph {
 public:
  Graph() = default;  // the empty graph

  const std::string& name() const { return name_; }
  int num_nodes() const { return static_cast<int>(ids_.size()); }

  // The node called `id`, or kNoNode.
  NodeId Find(absl::string_view id) const;

  const std::string& id(NodeId v) const { return ids_[v]; }
  const std::string& op(NodeId v) const { return ops_[v]; }
  int64_t bytes(NodeId v) const { return bytes_[v]; }
  double cost(NodeId v) const { return costs_[v]; }
  int64_t workspace(NodeId v) const { return workspaces_[v]; }
  bool persistent(NodeId v) const { return persistent_[v] != 0; }
  Role role(NodeId v) const { return roles_[v]; }
  // Whether a node is a trainable parameter (role kParameter): a training
  // step of a graph without one would train nothing.
  bool has_parameters() const {
    return std::find(roles_.begin(), roles_.end(), Role::kParameter) != roles_.end();
  }
  const std::optional<Shape>& shape(NodeId v) const { return shapes_[v]; }
  std::optional<DType> dtype(NodeId v) const { return dtypes_[v]; }
  const nlohmann::json& attrs(NodeId v) const { return attrs_[v]; }

  // Views (see the file comment). alias_of(v): the input v is a view of, or
  // kNoNode. storage(v): the root of v's alias chain (v when v is no
  // alias); never an alias itself. has_aliases(): whether any node is one;
  // a graph without aliases means exactly what it meant before them.
  NodeId alias_of(NodeId v) const { return alias_of_[v]; }
  NodeId storage(NodeId v) const { return storage_[v]; }
  bool is_alias(NodeId v) const { return alias_of_[v] != kNoNode; }

  // Home tiers and in-place updates (NodeSpec::home, NodeSpec::in_place).
  // home(v): the persistent node's tier, or nullopt (resident throughout).
  // version(v): the node whose write made the value v reads: the nearest
  // in-place node on v's alias chain (v itself if in place), else the
  // storage's base.
  std::optional<Tier> home(NodeId v) const { return homes_[v]; }
  bool in_place(NodeId v) const { return in_place_[v] != 0; }
  // runs_on(v): where the node runs (kDevice unless an in-place node says
  // otherwise); host_cost(v): its time on the host, where it may run there
  // (NodeSpec::runs_on, NodeSpec::host_cost).
  Tier runs_on(NodeId v) const { return runs_on_[v]; }
  std::optional<double> host_cost(NodeId v) const { return host_costs_[v]; }
  bool has_host_costs() const { return num_host_costs_ > 0; }
  bool has_auto_runs_on() const { return num_auto_runs_on_ > 0; }
  // This graph with each node that runs_on kAuto set to on_host(v) ? kHost
  // : kDevice; everything else unchanged.
  Graph WithAutoRunsOnAs(const std::function<bool(NodeId)>& on_host) const;
  NodeId version(NodeId v) const { return versions_[v]; }
  // collective(v): the node runs on the ranks' network (NodeSpec::collective).
  bool collective(NodeId v) const { return collective_[v] != 0; }
  bool has_collectives() const { return num_collectives_ > 0; }
  bool has_homes() const { return num_homes_ > 0; }
  bool has_auto_homes() const { return num_auto_homes_ > 0; }
  // This graph with each auto home v replaced by tier_of(v), which must be
  // kDevice or kHost; everything else unchanged.
  Graph WithAutoHomesAs(const std::function<Tier(NodeId)>& tier_of) const;
  bool has_in_place() const { return num_in_place_ > 0; }
  bool has_aliases() const { return num_aliases_ > 0; }
  int num_aliases() const { return num_aliases_; }

  // Inputs as written (operand order, repeats kept): what a kernel reads.
  absl::Span<const NodeId> inputs(NodeId v) const {
    return Row(input_offsets_, inputs_, v);
  }
  // Distinct inputs in first-occurrence order: what must be resident.
  absl::Span<const NodeId> unique_inputs(NodeId v) const {
    return Row(unique_input_offsets_, unique_inputs_, v);
  }
  // Distinct nodes that read v, ascending.
  absl::Span<const NodeId> readers(NodeId v) const {
    return Row(reader_offsets_, readers_, v);
  }

  // Nodes that must be resident at the end, in the order given.
  absl::Span<const NodeId> outputs() const { return outputs_; }
  bool is_output(NodeId v) const { return is_output_[v] != 0; }

  // A topological order of all nodes: Kahn's algorithm taking the smallest
  // ready id first, so a graph whose nodes were added in a valid order keeps
  // that order. This is "the graph's own order" of the baseline policy.
  absl::Span<const NodeId> topological_order() const { return topo_order_; }

  // needed()[v]: v is an output, an in-place update, or an ancestor of one
  // (SPEC's base_cost set includes the non-persistent ones).
  const std::vector<bool>& needed() const { return needed_; }

  // Sum of bytes over persistent nodes resident when the step starts (all
  // but those whose home is the host or auto); without homes, resident
  // throughout.
  int64_t persistent_bytes() const { return persistent_bytes_; }
  // Sum of bytes over persistent nodes whose home is the host (auto ones
  // are in neither sum: a schedule decides).
  int64_t host_persistent_bytes() const { return host_persistent_bytes_; }

  // A short human-readable summary (counts, bytes), for logs and tests.
  std::string ToString() const;

 private:
  friend class GraphBuilder;
  static absl::Span<const NodeId> Row(const std::vector<int32_t>& offsets,
                                      const std::vector<NodeId>& values,
                                      NodeId v) {
    return absl::MakeConstSpan(values.data() + offsets[v],
                               offsets[v + 1] - offsets[v]);
  }

  std::string name_;
  std::vector<std::string> ids_;
  std::vector<std::string> ops_;
  std::vector<int64_t> bytes_;
  std::vector<double> costs_;
  std::vector<int64_t> workspaces_;
  std::vector<uint8_t> persistent_;
  std::vector<Role> roles_;
  std::vector<std::optional<Shape>> shapes_;
  std::vector<std::optional<DType>> dtypes_;
  std::vector<nlohmann::json> attrs_;
  std::vector<NodeId> alias_of_;
  std::vector<NodeId> storage_;
  int num_aliases_ = 0;
  std::vector<std::optional<Tier>> homes_;
  std::vector<uint8_t> in_place_;
  std::vector<Tier> runs_on_;
  std::vector<std::optional<double>> host_costs_;
  int num_host_costs_ = 0;
  std::vector<uint8_t> collective_;
  int num_collectives_ = 0;
  int num_auto_runs_on_ = 0;
  std::vector<NodeId> versions_;
  int num_homes_ = 0;
  int num_auto_homes_ = 0;
  int num_in_place_ = 0;
  std::vector<int32_t> input_offsets_{0};
  std::vector<NodeId> inputs_;
  std::vector<int32_t> unique_input_offsets_{0};
  std::vector<NodeId> unique_inputs_;
  std::vector<int32_t> reader_offsets_{0};
  std::vector<NodeId> readers_;
  std::vector<NodeId> outputs_;
  std::vector<uint8_t> is_output_;
  std::vector<NodeId> topo_order_;
  std::vector<bool> needed_;
  int64_t persistent_bytes_ = 0;
  int64_t host_persistent_bytes_ = 0;
  absl::flat_hash_map<std::string, NodeId> index_;  // lookups only, never iterated
};

// Collects nodes and outputs, then validates and freezes them into a Graph.
// Nodes may be added in any order and name inputs added later. Build()
// reports the first problem found, naming the node (SPEC section 1).
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name = "") : name_(std::move(name)) {}

  void set_name(std::string name) { name_ = std::move(name); }
  void AddNode(NodeSpec spec) { specs_.push_back(std::move(spec)); }
  void AddOutput(std::string id) { output_ids_.push_back(std::move(id)); }
  int num_nodes() const { return static_cast<int>(specs_.size()); }

  // Validates and freezes. Errors (InvalidArgument): empty or duplicate id,
  // missing or negative bytes, negative or non-finite cost, negative
  // workspace, bytes, workspace or a shape dimension above kMaxBytes, a
  // graph whose bytes (all nodes plus the largest workspace) are, a
  // persistent node with inputs, attrs that are not an object, an unknown
  // input or output id, no outputs, a cycle (the message lists it), an
  // alias_of that is not one of the node's inputs (or the node itself), a
  // persistent alias, an alias with workspace (unless in place), a home on a
  // node that is not persistent, an in-place node that is no alias, writes
  // a storage that is not persistent, or whose alias_of is neither the base
  // nor an in-place node, two in-place nodes writing after the same one, a
  // runs_on or host_cost on a node that is not in place, a runs_on host or
  // auto without a host_cost, a host_cost that is negative or not finite, a
  // collective that is persistent, an alias, has a workspace or has not
  // exactly one input. A repeated output id counts once.
  absl::StatusOr<Graph> Build() const;

 private:
  // Build's stages, in its order, each filling `g` as far as it goes.
  absl::Status CheckNodes(Graph& g) const;  // ids, each node's fields, the totals
  void FillColumns(Graph& g) const;         // the per-node columns and aliases
  absl::Status LinkInputs(Graph& g, std::vector<std::vector<NodeId>>& unique) const;
  absl::Status MarkOutputs(Graph& g) const;
  static absl::Status OrderTopologically(Graph& g,
                                         const std::vector<std::vector<NodeId>>& unique);
  static void DeriveStoragesAndNeeds(Graph& g);  // storage roots, versions, needed

  std::string name_;
  std::vector<NodeSpec> specs_;
  std::vector<std::string> output_ids_;
};

// The spec of node v of `graph`, as GraphBuilder would take it back.
NodeSpec SpecOf(const Graph& graph, NodeId v);

}  // namespace pebble

#endif  // PEBBLE_GRAPH_GRAPH_H_
