// NetBuilder: builds forward graphs with shapes, dtypes, byte sizes and
// costs derived from the operator table, the way a model author writes a
// network. Errors stick: the first invalid operation is recorded, later ones
// are ignored, and Build() returns it. Model code can then read straight
// through without checking every call.
#ifndef PEBBLE_GRAPH_NET_BUILDER_H_
#define PEBBLE_GRAPH_NET_BUILDER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/ops.h"
#include "nlohmann/json.hpp"

namespace pebble {

// Turns analytic FLOPs into the `cost` unit (seconds).
struct CostModel {
  // Default: 10 TFLOP/s, the fp32 rate of the 8 GiB consumer cards the seed
  // report used. `--throughput` on the command line overrides it.
  double device_flops_per_s = 10e12;
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
  // forward graph this way). Nodes keep their ids and order.
  static NetBuilder FromGraph(const Graph& graph, CostModel cost_model = {});

  // Persistent tensors.
  Value Input(std::string id, Shape shape, DType dtype = DType::kFloat32);
  Value Parameter(std::string id, Shape shape, DType dtype = DType::kFloat32);
  Value Buffer(std::string id, Shape shape, DType dtype = DType::kFloat32);

  // Applies operator `op` (see ops.h) to `inputs`. `id` empty: a fresh
  // unique id derived from the op. bytes = elements x dtype size of the
  // inferred type; cost = flops / throughput.
  Value Apply(std::string_view op, std::vector<Value> inputs,
              nlohmann::json attrs = nlohmann::json::object(),
              std::string id = "", Role role = Role::kForward);

  // A node outside the operator table (pebbling graphs): explicit bytes and
  // cost, no shape.
  Value Generic(std::string id, std::vector<Value> inputs, int64_t bytes,
                double cost);

  // Marks a node as an output of the graph.
  void MarkOutput(Value v);

  // Look-ups on values built so far.
  const TensorType& type(Value v) const;
  const std::string& id(Value v) const;
  Value Find(std::string_view id) const;  // invalid when absent
  int num_values() const;

  // The first error, or OK.
  const absl::Status& status() const { return status_; }
  // Records an error (the first one wins) for model code that validates its
  // own parameters.
  void Fail(absl::Status status);

  // Freezes into a Graph (returns the first error instead, if any).
  absl::StatusOr<Graph> Build() const;

  // ---- Layers (PyTorch module semantics; `prefix` names the module, so the
  // parameters are "<prefix>.weight", "<prefix>.bias", as in state_dict()).
  // Conv over 2 or 3 spatial dims (chosen by x's rank), square kernels.
  Value Conv(const std::string& prefix, Value x, int64_t out_channels,
             int64_t kernel, int64_t stride = 1, int64_t padding = 0,
             bool bias = true);
  Value Linear(const std::string& prefix, Value x, int64_t out_features,
               bool bias = true);
  // Training-mode batch norm; adds running_mean, running_var and
  // num_batches_tracked buffers as PyTorch does.
  Value BatchNorm(const std::string& prefix, Value x, double eps = 1e-5);
  Value LayerNorm(const std::string& prefix, Value x, double eps = 1e-5);
  Value Embedding(const std::string& prefix, Value indices,
                  int64_t num_embeddings, int64_t dim);
  Value Relu(Value x);
  Value Dropout(Value x, double p);

 private:
  std::string FreshId(std::string_view stem);

  CostModel cost_model_;
  GraphBuilder graph_;
  std::vector<NodeSpec> specs_;
  std::vector<TensorType> types_;
  std::vector<std::string> output_ids_;
  absl::flat_hash_map<std::string, int> index_;
  absl::flat_hash_map<std::string, int> stem_counts_;
  absl::Status status_;
};

}  // namespace pebble

#endif  // PEBBLE_GRAPH_NET_BUILDER_H_
