// Reverse-mode automatic differentiation on graphs: forward graph in,
// training graph out (SPEC section 3).
#ifndef PEBBLE_GRAPH_AUTODIFF_H_
#define PEBBLE_GRAPH_AUTODIFF_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/net_builder.h"

namespace pebble {

// Given a forward graph whose node `loss_id` is a scalar loss, appends the
// backward nodes (role kBackward) and returns the training graph: outputs are
// the loss and, for every parameter p (role kParameter) the loss depends on,
// its gradient "grad:p", in parameter order. Parameters, buffers and the
// data batch are persistent. Several gradient contributions to one tensor
// are summed by "add" nodes as they arrive.
absl::StatusOr<Graph> BuildTrainingGraph(const Graph& forward,
                                         std::string_view loss_id,
                                         CostModel cost_model = {});

// Handed to OpDef::backward for one forward node.
class BackwardContext {
 public:
  // The forward node being differentiated, its inputs and output.
  NodeId node() const;
  const Graph& forward() const;
  const nlohmann::json& attrs() const;
  Value input(int i) const;          // the i-th input as a value in the builder
  Value output() const;              // the node's own output
  Value grad_output() const;         // gradient of the loss w.r.t. the output
  bool needs_grad(int i) const;      // does input i lead to a parameter?
  const TensorType& input_type(int i) const;
  int num_inputs() const;

  // Emits a backward node (role kBackward).
  Value Emit(std::string_view op, std::vector<Value> inputs,
             nlohmann::json attrs = nlohmann::json::object(),
             std::string id_hint = "");
  // Adds a contribution to the gradient of input i.
  void AccumulateGrad(int i, Value grad);

  // Internal: constructed by BuildTrainingGraph.
  struct State;
  explicit BackwardContext(State* state) : state_(state) {}

 private:
  State* state_;
};

}  // namespace pebble

#endif  // PEBBLE_GRAPH_AUTODIFF_H_
