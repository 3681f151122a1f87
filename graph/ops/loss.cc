// Reductions to a scalar loss: sum, softmax cross-entropy and mean squared
// error. The loss is an fp32 scalar whatever the input dtype, as under
// torch.autocast, which runs sum, cross_entropy and mse_loss in float32
// (PyTorch AMP docs, "CUDA Ops that can autocast to float32").
//
// Backward: the seed d loss / d loss = 1 is implicit when the op is the
// loss, so its backward node reads the loss inputs only; used anywhere else
// its backward also reads the incoming (scalar) gradient as a last input.
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::ops_internal {
namespace {

const TensorType kScalar{{}, DType::kFloat32};

// The optional incoming gradient at index `i`: a float scalar.
absl::Status CheckOptionalGrad(Inputs in, size_t i) {
  if (in.size() <= i) return absl::OkStatus();
  RETURN_IF_ERROR(ExpectFloat(in[i], "the incoming gradient"));
  return ExpectShape(in[i], {}, "the incoming gradient");
}

// Appends the incoming gradient when there is a node for it.
std::vector<Value> WithGrad(BackwardContext& ctx, std::vector<Value> reads) {
  if (ctx.has_grad_output()) reads.push_back(ctx.grad_output());
  return reads;
}

// ---- sum (x) -> scalar.

absl::StatusOr<TensorType> InferSum(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  return kScalar;
}

absl::Status SumBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  const TensorType& x = ctx.input_type(0);
  ctx.AccumulateGrad(
      0, ctx.Emit("sum_backward", WithGrad(ctx, {}),
                  {{"shape", x.shape}, {"dtype", DTypeName(x.dtype)}}));
  return absl::OkStatus();
}

// sum_backward ([grad]), attrs shape, dtype: the gradient broadcast to
// `shape` (ones when there is no input).
absl::StatusOr<TensorType> InferSumBackward(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(CheckOptionalGrad(in, 0));
  ASSIGN_OR_RETURN(Shape shape, ShapeAttr(attrs, "shape"));
  ASSIGN_OR_RETURN(DType dtype, DTypeAttr(attrs, "dtype", DType::kFloat32));
  return TensorType{shape, dtype};
}

// ---- softmax_cross_entropy (logits, target): the mean over every target
// element of -log softmax(logits)[target] along the class axis. The class
// axis is 1 as in nn.CrossEntropyLoss ((N, C), (N, C, d1, ...) with target
// (N, d1, ...)), or the last one for language-model logits (N, S, C) with
// target (N, S); attr `axis` picks it, else it is inferred from the target's
// shape (axis 1 first).

Shape Without(const Shape& s, int axis) {
  Shape out = s;
  out.erase(out.begin() + axis);
  return out;
}

absl::StatusOr<int> ClassAxis(const TensorType& logits,
                              const TensorType& target, const Json& attrs) {
  const int rank = static_cast<int>(logits.shape.size());
  if (rank < 2) {
    return Invalid("logits must have rank >= 2 (N, C, ...), got ",
                   ShapeToString(logits.shape));
  }
  const bool given = attrs.is_object() && attrs.contains("axis");
  if (given) {
    ASSIGN_OR_RETURN(int64_t a, IntAttr(attrs, "axis", 1));
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(a, rank, "axis"));
    if (axis == 0) return Invalid("attr 'axis' cannot be the batch dim 0");
    RETURN_IF_ERROR(ExpectShape(target, Without(logits.shape, axis),
                                "input 1 (target)"));
    return axis;
  }
  if (target.shape == Without(logits.shape, 1)) return 1;
  if (target.shape == Without(logits.shape, rank - 1)) return rank - 1;
  return Invalid("target ", ShapeToString(target.shape),
                 " matches logits ", ShapeToString(logits.shape),
                 " with neither the class axis 1 (target ",
                 ShapeToString(Without(logits.shape, 1)),
                 ") nor the last axis (target ",
                 ShapeToString(Without(logits.shape, rank - 1)), ")");
}

absl::StatusOr<TensorType> InferCrossEntropy(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (logits)"));
  RETURN_IF_ERROR(ExpectDType(in[1], DType::kInt64, "input 1 (target)"));
  RETURN_IF_ERROR(ClassAxis(in[0], in[1], attrs).status());
  RETURN_IF_ERROR(CheckOptionalGrad(in, 2));
  return kScalar;
}

// softmax_cross_entropy_backward (logits, target[, grad]) -> logits' type.
absl::StatusOr<TensorType> InferCrossEntropyBackward(Inputs in,
                                                     const Json& attrs) {
  RETURN_IF_ERROR(InferCrossEntropy(in, attrs).status());
  return in[0];
}

// Log-softmax (max, subtract, exp, sum: 4 per logit), then one per target.
double CrossEntropyFlops(Inputs in, const TensorType&, const Json&) {
  return 4.0 * Elements(in[0]) + Elements(in[1]);
}

absl::Status CrossEntropyBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ASSIGN_OR_RETURN(int axis, ClassAxis(ctx.input_type(0), ctx.input_type(1),
                                       ctx.attrs()));
  // (softmax(logits) - one_hot(target)) / count: reads logits and target.
  ctx.AccumulateGrad(
      0, ctx.Emit("softmax_cross_entropy_backward",
                  WithGrad(ctx, {ctx.input(0), ctx.input(1)}),
                  {{"axis", axis}}));
  return absl::OkStatus();
}

// The operands of a mean loss of two tensors named `first` and `second`
// (mse_loss, bce_with_logits, and their backwards): one shape and one
// dtype, then an optional incoming gradient (input 2).
absl::Status CheckPairLoss(Inputs in, absl::string_view first, absl::string_view second) {
  RETURN_IF_ERROR(ExpectSameShape(in[0], first, in[1], second));
  RETURN_IF_ERROR(ExpectSameDType(in[0], first, in[1], second));
  return CheckOptionalGrad(in, 2);
}

// ---- mse_loss (pred, target): mean((pred - target)^2).

absl::StatusOr<TensorType> InferMse(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (pred)"));
  RETURN_IF_ERROR(ExpectFloat(in[1], "input 1 (target)"));
  RETURN_IF_ERROR(CheckPairLoss(in, "pred", "target"));
  return kScalar;
}

// mse_loss_backward (pred, target[, grad]) -> pred's type.
absl::StatusOr<TensorType> InferMseBackward(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(InferMse(in, attrs).status());
  return in[0];
}

absl::Status MseBackward(BackwardContext& ctx) {
  // d/dpred = 2 (pred - target) / n; d/dtarget is the same with the
  // operands swapped.
  for (int i = 0; i < 2; ++i) {
    if (!ctx.needs_grad(i)) continue;
    ctx.AccumulateGrad(
        i, ctx.Emit("mse_loss_backward",
                    WithGrad(ctx, {ctx.input(i), ctx.input(1 - i)})));
  }
  return absl::OkStatus();
}

// ---- bce_with_logits (logits, target): mean of ATen's binary
// cross-entropy with logits (nn.BCEWithLogitsLoss); target of the logits'
// shape and dtype (probabilities in [0, 1]).
absl::StatusOr<TensorType> InferBce(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (logits)"));
  RETURN_IF_ERROR(CheckPairLoss(in, "logits", "target"));
  return kScalar;
}

// bce_with_logits_backward (logits, target[, grad]) -> logits' type.
absl::StatusOr<TensorType> InferBceBackward(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(InferBce(in, attrs).status());
  return in[0];
}

// The target's gradient of bce_with_logits: -logits g / n, as ATen's
// binary_cross_entropy_with_logits_target_backward computes it for the
// mean: the logits times the incoming gradient (g cast to the logits'
// dtype, as type promotion casts a 0-dim tensor), negated, divided by the
// number of elements n in fp32 (an fp16 fill cannot hold n past 65504)
// and rounded to the logits' dtype. A target that the model computes
// takes it (a trained teacher's soft labels, two heads against each
// other).
Value BceTargetGradient(BackwardContext& ctx) {
  const TensorType logits = ctx.input_type(0);  // (a copy: Emit adds types)
  const bool fp32 = logits.dtype == DType::kFloat32;
  const std::string dtype(DTypeName(logits.dtype));
  Value product = ctx.input(0);
  if (ctx.has_grad_output()) {
    Value g = ctx.grad_output();
    if (!fp32) g = ctx.Emit("cast", {g}, {{"dtype", dtype}});
    product = ctx.Emit("mul", {product, g});
  }
  if (!fp32) product = ctx.Emit("cast", {product}, {{"dtype", "fp32"}});
  const Value minus_n =
      ctx.Emit("fill", {}, {{"shape", Shape{}}, {"dtype", "fp32"}, {"value", -Elements(logits)}});
  const Value gradient = ctx.Emit("div", {product, minus_n});
  return fp32 ? gradient : ctx.Emit("cast", {gradient}, {{"dtype", dtype}});
}

absl::Status BceBackward(BackwardContext& ctx) {
  // d/dlogits = (sigmoid(logits) - target) / n.
  if (ctx.needs_grad(0)) {
    ctx.AccumulateGrad(0, ctx.Emit("bce_with_logits_backward",
                                   WithGrad(ctx, {ctx.input(0), ctx.input(1)})));
  }
  if (ctx.needs_grad(1)) ctx.AccumulateGrad(1, BceTargetGradient(ctx));
  return absl::OkStatus();
}

double PerInput3(Inputs in, const TensorType&, const Json&) {
  return 3.0 * Elements(in[0]);
}

}  // namespace

void RegisterLossOps(std::vector<OpDef>& t) {
  t.push_back({.name = "sum", .min_inputs = 1, .max_inputs = 1,
               .infer = InferSum,
               .flops = [](Inputs in, const TensorType&, const Json&) {
                 return Elements(in[0]);
               },
               .backward = SumBackward});
  t.push_back({.name = "sum_backward", .min_inputs = 0, .max_inputs = 1,
               .infer = InferSumBackward, .flops = CopyFlops});
  t.push_back({.name = "softmax_cross_entropy", .min_inputs = 2,
               .max_inputs = 2, .infer = InferCrossEntropy,
               .flops = CrossEntropyFlops, .backward = CrossEntropyBackward});
  t.push_back({.name = "softmax_cross_entropy_backward", .min_inputs = 2,
               .max_inputs = 3, .infer = InferCrossEntropyBackward,
               .flops = [](Inputs in, const TensorType&, const Json&) {
                 return 4.0 * Elements(in[0]);
               }});
  t.push_back({.name = "mse_loss", .min_inputs = 2, .max_inputs = 2,
               .infer = InferMse, .flops = PerInput3,
               .backward = MseBackward});
  t.push_back({.name = "mse_loss_backward", .min_inputs = 2, .max_inputs = 3,
               .infer = InferMseBackward, .flops = PerInput3});
  // (1 - t) x + m + log(exp(-m) + exp(-x - m)), m = max(-x, 0): 8 per
  // element; the backward's sigmoid and difference 4.
  t.push_back({.name = "bce_with_logits", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBce,
               .flops = [](Inputs in, const TensorType&, const Json&) {
                 return 8.0 * Elements(in[0]);
               },
               .backward = BceBackward});
  t.push_back({.name = "bce_with_logits_backward", .min_inputs = 2, .max_inputs = 3,
               .infer = InferBceBackward,
               .flops = [](Inputs in, const TensorType&, const Json&) {
                 return 4.0 * Elements(in[0]);
               }});
}

}  // namespace pebble::ops_internal
