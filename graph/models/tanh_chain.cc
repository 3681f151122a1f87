// tanh-chain: the element-wise chain used to explain TensorFlow's training
// memory, y = tanh(tanh(...tanh(x))) with L tanh ops on one variable x, and
// its gradient tf.gradients(y, x). Each tanh backward reads its own output,
// so a plain backward pass keeps all L activations: memory O(L), where
// checkpointing needs O(sqrt(L)) (Chen et al., "Training deep nets with
// sublinear memory cost", 2016).
//
// Nodes: the variable `x` (a parameter, shape (size)), activations a1..aL,
// `loss` = sum(aL) (a scalar, so that dloss/daL is ones, as tf.gradients of
// the sum), and the backward nodes, ending in `grad:x`.
#include <string>

#include "absl/strings/str_cat.h"
#include "graph/models/zoo_internal.h"
#include "graph/status.h"

namespace pebble::zoo {

absl::StatusOr<Graph> BuildTanhChain(const ModelArgs& args,
                                     const CostModel& cost) {
  ASSIGN_OR_RETURN(const int64_t length, args.Int("length", 1, 100'000));
  ASSIGN_OR_RETURN(const int64_t size, args.Int("size", 1, int64_t{1} << 40));
  NetBuilder nb(args.graph_name(), cost);
  Value a = nb.Parameter("x", {size});
  for (int64_t i = 1; i <= length; ++i) {
    a = nb.Apply("tanh", {a}, nlohmann::json::object(), absl::StrCat("a", i));
  }
  nb.Apply("sum", {a}, nlohmann::json::object(), "loss");
  return FinishTrainingGraph(nb, cost);
}

}  // namespace pebble::zoo
