// Reverse-mode automatic differentiation on graphs: forward graph in,
// training graph out (SPEC section 3).
//
// Note [Gradient names]. The final gradient of forward tensor t is the node
// "grad:t" whenever it is a node of its own. With several contributions c1,
// c2, ... (t read by several nodes) they are summed by `add` nodes as they
// arrive, in the order the backward pass produces them: the contributions
// are "grad:t#1", "grad:t#2", ..., the partial sums "grad:t#sum2", ...,
// and the last sum is "grad:t". A gradient that is only an alias of another
// node (the backward of `add` passes the incoming gradient through) gets no
// node of its own, except for parameters: "grad:p" always exists, as a
// `copy` if need be, because it is an output of the training graph.
#ifndef PEBBLE_GRAPH_AUTODIFF_H_
#define PEBBLE_GRAPH_AUTODIFF_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/net_builder.h"

namespace pebble {

// Given a forward graph whose node `loss_id` is a scalar loss, appends the
// backward nodes (role kBackward) and returns the training graph: outputs are
// the loss and, for every parameter p (role kParameter) the loss depends on,
// its gradient "grad:p", in parameter order. Parameters, buffers and the
// data batch are persistent. Several gradient contributions to one tensor
// are summed by "add" nodes as they arrive.
//
// Node order: the forward nodes in their order, then the backward nodes in
// the order a framework runs them: forward nodes are visited in reverse
// topological order, and each one's gradient nodes are emitted when it is
// visited; a parameter's gradient is completed (named, copied if an alias)
// right after its last reader is visited. Only gradients of tensors that
// lead to a parameter are made (no data gradient for the first
// convolution). The seed d loss / d loss = 1 is implicit: a loss operator's
// backward reads the loss inputs only.
//
// Errors (InvalidArgument, naming the node): unknown loss id, a loss that is
// not a scalar, a node on the gradient path whose operator has no backward
// rule or whose shapes are unknown, an id "grad:..." already taken.
absl::StatusOr<Graph> BuildTrainingGraph(const Graph& forward,
                                         absl::string_view loss_id,
                                         CostModel cost_model = {});

// The loss a forward graph is trained with (`--loss` on the command line).
enum class LossKind {
  kNone,          // the forward graph as it is
  kCrossEntropy,  // softmax_cross_entropy(output, target), nn.CrossEntropyLoss
  kMse,           // mse_loss(output, target), nn.MSELoss
  kBce,           // bce_with_logits(output, target), nn.BCEWithLogitsLoss
};
// "none", "cross-entropy", "mse", "bce"; InvalidArgument naming the choices.
absl::StatusOr<LossKind> ParseLossKind(absl::string_view name);
absl::string_view LossKindName(LossKind kind);

// Adds `loss` to a forward graph whose one output is the prediction, and
// differentiates it: the persistent input "target" (cross-entropy: i64, the
// output's shape without dim 1; mse, bce: the output's type), the node "loss",
// then BuildTrainingGraph. kNone returns `forward` unchanged. Errors name
// the problem: not exactly one output, an output that is not (N, C, ...)
// for cross-entropy, "target" or "loss" already taken.
absl::StatusOr<Graph> AddLossAndDifferentiate(const Graph& forward, LossKind loss,
                                              CostModel cost_model = {});

// Handed to OpDef::backward for one forward node: what the rule may read and
// how it hands gradients back.
class BackwardContext {
 public:
  // The forward node being differentiated, its inputs and output.
  NodeId node() const;
  const Graph& forward() const;
  const nlohmann::json& attrs() const;  // an object, possibly empty
  Value input(int i) const;          // the i-th input as a value in the builder
  Value output() const;              // the node's own output
  // Gradient of the loss w.r.t. the output. For the loss node itself the
  // seed is implicit (has_grad_output() is false): loss operators then read
  // their inputs only; any other operator used as the loss gets a `fill`
  // node of ones named "grad:<loss>" on first call.
  Value grad_output() const;
  bool has_grad_output() const;
  bool needs_grad(int i) const;      // does input i lead to a parameter?
  const TensorType& input_type(int i) const;
  const TensorType& output_type() const;
  int num_inputs() const;

  // Emits a backward node (role kBackward). Its id is provisional (a fresh
  // id from the op, or `id_hint`): a node accumulated as a gradient is
  // renamed per Note [Gradient names].
  Value Emit(absl::string_view op, std::vector<Value> inputs,
             nlohmann::json attrs = nlohmann::json::object(),
             std::string id_hint = "");
  // Emit, and makes the node an alias (view) of `base`, its one input: for
  // the backward of a forward view, whose gradient is the incoming one
  // reshaped (Note [Gradients of views] in autodiff.cc).
  Value EmitView(absl::string_view op, Value base,
                 nlohmann::json attrs = nlohmann::json::object());
  // Whether the forward node being differentiated is an alias (a view).
  bool is_view() const;
  // Adds a contribution to the gradient of input i (same shape and dtype as
  // the input; ignored when `grad` is invalid after an error).
  void AccumulateGrad(int i, Value grad);
  // Adds the gradient of part `part` of `num_parts` equal parts of input i
  // (the q, k and v thirds of a fused projection). When the input's gradient
  // is complete, each full set of parts becomes one `merge_op` node reading
  // the parts in order (attrs {}); parts without a full set become
  // `scatter_op` nodes (attrs {"chunks": num_parts, "index": part}) that
  // place one part in a zero tensor of the input's shape. Either way the
  // result is accumulated like AccumulateGrad.
  void AccumulateGradPart(int i, int part, int num_parts, Value grad,
                          absl::string_view merge_op,
                          absl::string_view scatter_op);

  // Internal: constructed by BuildTrainingGraph.
  struct State;
  explicit BackwardContext(State* state) : state_(state) {}

 private:
  State* state_;
};

}  // namespace pebble

#endif  // PEBBLE_GRAPH_AUTODIFF_H_
