// NetBuilder: builds forward graphs with shapes, dtypes, byte sizes and
// costs derived from the operator table, the way a model author writes a
// network. Errors stick: the first invalid operation is recorded, later ones
// are ignored, and Build() returns it. Model code can then read straight
// through without checking every call.
//
// Ids. A layer's output is named by its module prefix (Conv("conv1", ...)
// makes "conv1" and the parameters "conv1.weight", "conv1.bias"); Apply()
// with an empty id and the helpers without a prefix (Relu, Dropout) take a
// fresh id from the op: "relu_1", "relu_2", ... (the first free "<stem>_<n>",
// n counted per stem from 1). Calling a layer again with the same prefix
// shares its parameters (as reusing an nn.Module does) and gives the output
// a fresh id "<prefix>_<n>".
//
// Sizes and costs: bytes = elements x DTypeSize; cost = the op's analytic
// FLOPs / CostModel::device_flops_per_s (seconds). Persistent tensors
// (inputs, parameters, buffers) cost 0: they are never computed.
#ifndef PEBBLE_GRAPH_NET_BUILDER_H_
#define PEBBLE_GRAPH_NET_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/ops.h"
#include "nlohmann/json.hpp"

namespace pebble {

// Turns analytic FLOPs into the `cost` unit (seconds).
struct CostModel {
  // Default: 10 TFLOP/s, the fp32 rate of the 8 GiB consumer cards the seed
  // report used. `--throughput` on the command line overrides it.
  double device_flops_per_s = 10e12;
  // The rate at which the host streams an element-wise update (an
  // optimizer's update on the host): bytes read plus bytes written per
  // second. The default, 10 GB/s, is a placeholder of the right order for
  // one socket; `pebble calibrate` measures it (host_update_bytes_per_s).
  double host_bytes_per_s = 10e9;
};

// A tensor under construction: an index into the builder. Invalid after an
// error (index -1); passing it on is harmless.
struct Value {
  int index = -1;
  bool valid() const { return index >= 0; }
};

class NetBuilder {
 public:
  explicit NetBuilder(std::string graph_name, CostModel cost_model = {});

  // Starts from an existing graph (autodiff appends backward nodes to a
  // forward graph this way). Nodes keep their ids and order (the Value of
  // node v has index v) and the graph's outputs stay marked. A node with a
  // shape has a type (fp32 when the graph gives no dtype); one without
  // cannot be an input of Apply().
  static NetBuilder FromGraph(const Graph& graph, CostModel cost_model = {});

  // Persistent tensors.
  Value Input(std::string id, Shape shape, DType dtype = DType::kFloat32);
  Value Parameter(std::string id, Shape shape, DType dtype = DType::kFloat32);
  Value Buffer(std::string id, Shape shape, DType dtype = DType::kFloat32);

  // Applies operator `op` (see ops.h) to `inputs`. `id` empty: a fresh
  // unique id derived from the op. bytes = elements x dtype size of the
  // inferred type; cost = flops / throughput. A failed inference records an
  // InvalidArgument "node '<id>' (op <op>): <what is wrong>".
  Value Apply(absl::string_view op, std::vector<Value> inputs,
              nlohmann::json attrs = nlohmann::json::object(),
              std::string id = "", Role role = Role::kForward);

  // A node outside the operator table (pebbling graphs): explicit bytes and
  // cost, no shape.
  Value Generic(std::string id, std::vector<Value> inputs, int64_t bytes,
                double cost);

  // Makes `v` an alias (view) of `base`, one of its inputs (SPEC section 1,
  // "Aliases"): its output shares base's storage. A base that is not an
  // input of v, or a persistent v, records an InvalidArgument naming v.
  void SetAliasOf(Value v, Value base);
  // The value v is an alias of, or an invalid value.
  Value alias_of(Value v) const;

  // Marks a node as an output of the graph (a repeat counts once).
  void MarkOutput(Value v);
  // Unmarks every output.
  void ClearOutputs();

  // Look-ups on values built so far. type() of a node without a shape (or
  // of an invalid value) is an empty fp32 scalar type; has_type tells.
  const TensorType& type(Value v) const;
  bool has_type(Value v) const;
  const std::string& id(Value v) const;
  Role role(Value v) const;
  Value Find(absl::string_view id) const;  // invalid when absent
  int num_values() const;
  const std::string& name() const { return name_; }

  // Gives node v the id `new_id` (autodiff's gradient names). Every reader
  // follows, since inputs are kept as indices until Build(). Errors: invalid
  // value, empty or taken id. Does not touch status().
  absl::Status Rename(Value v, std::string new_id);

  // The first error, or OK.
  const absl::Status& status() const { return status_; }
  // Records an error (the first one wins) for model code that validates its
  // own parameters.
  void Fail(absl::Status status);

  // Freezes into a Graph (returns the first error instead, if any). With no
  // output marked, the outputs are the computed nodes nobody reads (a
  // forward graph's loss).
  absl::StatusOr<Graph> Build() const;

  // ---- Layers (PyTorch module semantics; `prefix` names the module, so the
  // parameters are "<prefix>.weight", "<prefix>.bias", as in state_dict()).
  // Parameters take x's dtype unless said otherwise.
  // Conv over 2 or 3 spatial dims (chosen by x's rank), square kernels.
  Value Conv(const std::string& prefix, Value x, int64_t out_channels,
             int64_t kernel, int64_t stride = 1, int64_t padding = 0,
             bool bias = true);
  Value Linear(const std::string& prefix, Value x, int64_t out_features,
               bool bias = true);
  // Training-mode batch norm; adds running_mean, running_var (fp32) and
  // num_batches_tracked (i64 scalar) buffers as PyTorch does. weight and
  // bias are fp32 (see graph/ops/norm.cc). Nodes: "<prefix>.stats" (mean
  // and inverse std, (2, C) fp32) and the output "<prefix>".
  Value BatchNorm(const std::string& prefix, Value x, double eps = 1e-5);
  // Layer norm over the last dim: "<prefix>.stats" ((2, x[:-1]) fp32) and
  // the output "<prefix>".
  Value LayerNorm(const std::string& prefix, Value x, double eps = 1e-5);
  // nn.Embedding: weight (num_embeddings, dim), fp32 or `dtype`.
  Value Embedding(const std::string& prefix, Value indices,
                  int64_t num_embeddings, int64_t dim);
  Value Embedding(const std::string& prefix, Value indices,
                  int64_t num_embeddings, int64_t dim, DType dtype);
  Value Relu(Value x);
  // A `dropout_mask` node (u8, seeded by the count of masks so far) and the
  // `dropout` output.
  Value Dropout(Value x, double p);
  // A `random` node of `shape` and `dtype` (Note [Random values],
  // runtime/kernel_math.h): `attrs` gives its distribution and parameters;
  // the seed is the count of random nodes so far plus kRandomSeedBase, so
  // that no noise shares a stream with a dropout mask.
  static constexpr int64_t kRandomSeedBase = int64_t{1} << 32;
  Value Random(const Shape& shape, DType dtype, nlohmann::json attrs, const std::string& id);

 private:
  std::string FreshId(absl::string_view stem);
  // `prefix` when free, else a fresh id from it.
  std::string LayerOutputId(const std::string& prefix);
  // A persistent tensor; reuses an existing one of the same id, role and
  // type (shared parameters), fails on any other clash.
  Value Persistent(std::string id, Shape shape, DType dtype, Role role,
                   bool share);
  Value Add(NodeSpec spec, std::vector<int> inputs, TensorType type,
            bool typed);
  bool CheckValue(Value v, absl::string_view what);

  std::string name_;
  CostModel cost_model_;
  // One entry per node, by index. specs_[i].inputs and alias_of stay
  // empty: they live in inputs_ and alias_of_ as indices (so Rename is
  // O(1)) and are written as ids by Build().
  std::vector<NodeSpec> specs_;
  std::vector<std::vector<int>> inputs_;
  std::vector<int> alias_of_;  // per node: the index it views, or -1
  std::vector<TensorType> types_;
  std::vector<uint8_t> typed_;
  std::vector<int> outputs_;
  absl::flat_hash_map<std::string, int> index_;        // look-ups only
  absl::flat_hash_map<std::string, int> stem_counts_;  // look-ups only
  int dropout_masks_ = 0;
  int64_t random_nodes_ = 0;
  absl::Status status_;
};

}  // namespace pebble

#endif  // PEBBLE_GRAPH_NET_BUILDER_H_
