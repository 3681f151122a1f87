// The operator table: for every operator of the model zoo, its shape and
// dtype inference, its FLOP count and its backward rule (which tensors each
// gradient node reads). Autodiff and NetBuilder consult it; the scheduler
// never does (it sees bytes and costs only).
//
// Backward rules follow the math, and read exactly what it needs (SPEC
// section 3): relu/tanh/sigmoid backward read their output and the incoming
// gradient, gelu backward reads its input, a convolution's data gradient
// reads the weight and the incoming gradient, its weight gradient reads the
// input and the incoming gradient, and so on; docs/operators.md lists them.
//
// Conventions (docs/operators.md):
//  - the output dtype is the dtype of the first floating-point input;
//    losses and `sum` give fp32 scalars; batch-norm statistics, weights and
//    weight gradients are fp32;
//  - backward operators are registered too (backward = null), named
//    "<op>_backward[_data|_weight|_bias]", with the incoming gradient as
//    input 0 (PyTorch's order: grad_output first), then what they read;
//    shapes they cannot infer from their inputs come as attrs
//    (`input_shape`, `kernel`, ...), so a training graph read back from JSON
//    re-infers every shape;
//  - FLOPs are analytic: 2 per multiply-add of a product, a documented
//    count per element for element-wise ops, and one per element written
//    for ops that only move data, so that no node is free to recompute.
#ifndef PEBBLE_GRAPH_OPS_H_
#define PEBBLE_GRAPH_OPS_H_

#include <functional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"

namespace pebble {

struct TensorType {
  Shape shape;
  DType dtype = DType::kFloat32;
};

class BackwardContext;  // defined in graph/autodiff.h

struct OpDef {
  std::string name;
  int min_inputs = 0;
  int max_inputs = 0;  // -1: any number
  // Output type from the input types and attrs; InvalidArgument on a
  // mismatch (the message names the problem; the caller adds the node).
  std::function<absl::StatusOr<TensorType>(absl::Span<const TensorType> inputs,
                                           const nlohmann::json& attrs)>
      infer = nullptr;
  // Floating-point operations to compute the output once.
  std::function<double(absl::Span<const TensorType> inputs,
                       const TensorType& output, const nlohmann::json& attrs)>
      flops = nullptr;
  // Emits the gradient nodes of the inputs that need one. Null for
  // operators that are not differentiated (they only appear in backward
  // graphs, or have no gradient: the data batch, masks).
  std::function<absl::Status(BackwardContext& ctx)> backward = nullptr;
};

// The definition of `name`, or nullptr.
const OpDef* FindOp(absl::string_view name);
// Every registered operator name, sorted.
std::vector<std::string> OpNames();

}  // namespace pebble

#endif  // PEBBLE_GRAPH_OPS_H_
