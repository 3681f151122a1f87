// Element-wise operators: activations, add/mul, dropout, copies and fills.
// FLOP counts per element are in docs/operators.md (one per arithmetic
// operation, one per transcendental function).
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::ops_internal {
namespace {

// ---- Activations: y = f(x), same shape and dtype.

absl::StatusOr<TensorType> InferUnaryFloat(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  return in[0];
}

absl::StatusOr<std::string> GeluApproximate(const Json& attrs) {
  absl::StatusOr<std::string> mode = StringAttr(attrs, "approximate", "none");
  if (mode.ok() && *mode != "none" && *mode != "tanh") {
    return Invalid("attr 'approximate' must be \"none\" or \"tanh\", got \"",
                   *mode, "\"");
  }
  return mode;
}

absl::StatusOr<TensorType> InferGelu(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(GeluApproximate(attrs).status());
  return InferUnaryFloat(in, attrs);
}

double GeluFlops(Inputs, const TensorType& out, const Json& attrs) {
  absl::StatusOr<std::string> mode = GeluApproximate(attrs);
  // none: 0.5 x (1 + erf(x / sqrt 2)) = 5; tanh: 0.5 x (1 + tanh(c (x +
  // 0.044715 x^3))) = 9.
  return (mode.ok() && *mode == "tanh" ? 9.0 : 5.0) * Elements(out);
}

double GeluBackwardFlops(Inputs, const TensorType& out, const Json& attrs) {
  absl::StatusOr<std::string> mode = GeluApproximate(attrs);
  return (mode.ok() && *mode == "tanh" ? 15.0 : 11.0) * Elements(out);
}

// (grad, saved): the backward of an activation; both of the output's shape.
absl::StatusOr<TensorType> InferActivationBackward(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectFloat(in[1], "input 1 (saved tensor)"));
  RETURN_IF_ERROR(ExpectSameShape(in[0], "grad", in[1], "saved tensor"));
  return in[0];
}

// Backward rule of y = f(x) whose derivative is read from the output (relu,
// tanh, sigmoid: f' is a function of y) or from the input (gelu).
std::function<absl::Status(BackwardContext&)> ActivationBackward(
    std::string backward_op, bool reads_output) {
  return [backward_op, reads_output](BackwardContext& ctx) -> absl::Status {
    if (!ctx.needs_grad(0)) return absl::OkStatus();
    const Value saved = reads_output ? ctx.output() : ctx.input(0);
    ctx.AccumulateGrad(
        0, ctx.Emit(backward_op, {ctx.grad_output(), saved}, ctx.attrs()));
    return absl::OkStatus();
  };
}

// ---- Piecewise-linear activations with parameters (runtime/activation_math.h).

// clip: attrs min and max, each optional (absent: unbounded on that side).
absl::StatusOr<TensorType> InferClip(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(double lo, DoubleAttr(attrs, "min", -HUGE_VAL));
  ASSIGN_OR_RETURN(double hi, DoubleAttr(attrs, "max", HUGE_VAL));
  if (!(lo <= hi)) return Invalid("attr 'min' (", lo, ") is above attr 'max' (", hi, ")");
  return InferUnaryFloat(in, attrs);
}

// hardsigmoid: attrs alpha (1/6), beta (1/2), as PyTorch's.
absl::StatusOr<TensorType> InferHardSigmoid(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(double alpha, DoubleAttr(attrs, "alpha", 1.0 / 6));
  ASSIGN_OR_RETURN(double beta, DoubleAttr(attrs, "beta", 0.5));
  if (!std::isfinite(alpha) || !std::isfinite(beta)) {
    return Invalid("attrs 'alpha' and 'beta' must be finite");
  }
  return InferUnaryFloat(in, attrs);
}

// leaky_relu: attr negative_slope (0.01, as PyTorch's).
absl::StatusOr<TensorType> InferLeakyRelu(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(double slope, DoubleAttr(attrs, "negative_slope", 0.01));
  if (!std::isfinite(slope)) return Invalid("attr 'negative_slope' must be finite");
  return InferUnaryFloat(in, attrs);
}

// elu: attrs alpha, scale, input_scale (1 each: nn.ELU's; nn.SELU and
// nn.CELU are other choices).
absl::StatusOr<TensorType> InferElu(Inputs in, const Json& attrs) {
  for (const char* name : {"alpha", "scale", "input_scale"}) {
    RETURN_IF_ERROR(DoubleAttr(attrs, name, 1.0).status());
  }
  return InferUnaryFloat(in, attrs);
}

// softplus: attrs beta (1, not 0) and threshold (20), PyTorch's.
absl::StatusOr<TensorType> InferSoftplus(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(double beta, DoubleAttr(attrs, "beta", 1.0));
  RETURN_IF_ERROR(DoubleAttr(attrs, "threshold", 20.0).status());
  if (beta == 0) return Invalid("attr 'beta' must not be 0");
  return InferUnaryFloat(in, attrs);
}

// The backward of one of these: (grad, x), the forward's attrs.
std::function<absl::StatusOr<TensorType>(Inputs, const Json&)> InferBackwardOf(
    absl::StatusOr<TensorType> (*infer_forward)(Inputs, const Json&)) {
  return [infer_forward](Inputs in, const Json& attrs) -> absl::StatusOr<TensorType> {
    RETURN_IF_ERROR(infer_forward(in.subspan(1, 1), attrs).status());
    return InferActivationBackward(in, attrs);
  };
}

// ---- add / sub / mul / div with NumPy broadcasting of one operand over
// the other (a - b, a / b in that order whichever is broadcast),
// where the broadcast operand keeps one contiguous block of dims
// (BlockBroadcast: a bias over the trailing dims, a (N, C, 1, 1) gate over
// (N, C, H, W)); the result has the other operand's shape.

absl::StatusOr<TensorType> InferBinary(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (a)"));
  RETURN_IF_ERROR(ExpectFloat(in[1], "input 1 (b)"));
  RETURN_IF_ERROR(ExpectSameDType(in[0], "a", in[1], "b"));
  if (BlockBroadcast(in[0].shape, in[1].shape)) return in[0];
  if (BlockBroadcast(in[1].shape, in[0].shape)) return in[1];
  return Invalid("shapes ", ShapeToString(in[0].shape), " and ",
                 ShapeToString(in[1].shape),
                 " do not broadcast (one operand must have the result's shape "
                 "and the other, aligned on the trailing dims, 1 or equal in "
                 "each dim, its dims other than 1 contiguous)");
}

// Hands `grad` (the output's shape) to input i, summed down to the input's
// shape when the input was broadcast.
void AccumulateBroadcast(BackwardContext& ctx, int i, Value grad) {
  const Shape& shape = ctx.input_type(i).shape;
  if (shape == ctx.output_type().shape) {
    ctx.AccumulateGrad(i, grad);
  } else {
    ctx.AccumulateGrad(i, ctx.Emit("sum_to", {grad}, {{"shape", shape}}));
  }
}

absl::Status AddBackward(BackwardContext& ctx) {
  // d(a + b) passes the incoming gradient through: an alias, no node.
  for (int i = 0; i < 2; ++i) {
    if (ctx.needs_grad(i)) AccumulateBroadcast(ctx, i, ctx.grad_output());
  }
  return absl::OkStatus();
}

// A scalar of `value` in the output's dtype, broadcast by mul.
Value ScalarFill(BackwardContext& ctx, double value) {
  return ctx.Emit("fill", {},
                  {{"shape", Shape{}},
                   {"dtype", std::string(DTypeName(ctx.output_type().dtype))},
                   {"value", value}});
}

absl::Status SubBackward(BackwardContext& ctx) {
  // d(a - b) = g for a, -g for b.
  if (ctx.needs_grad(0)) AccumulateBroadcast(ctx, 0, ctx.grad_output());
  if (ctx.needs_grad(1)) {
    AccumulateBroadcast(ctx, 1, ctx.Emit("mul", {ctx.grad_output(), ScalarFill(ctx, -1)}));
  }
  return absl::OkStatus();
}

absl::Status DivBackward(BackwardContext& ctx) {
  // y = a / b: dy/da = 1 / b, dy/db = -a / b^2 = -(1 / b) y; both start
  // from g / b.
  if (!ctx.needs_grad(0) && !ctx.needs_grad(1)) return absl::OkStatus();
  const Value g_over_b = ctx.Emit("div", {ctx.grad_output(), ctx.input(1)});
  if (ctx.needs_grad(0)) AccumulateBroadcast(ctx, 0, g_over_b);
  if (ctx.needs_grad(1)) {
    const Value times_y = ctx.Emit("mul", {g_over_b, ctx.output()});
    AccumulateBroadcast(ctx, 1, ctx.Emit("mul", {times_y, ScalarFill(ctx, -1)}));
  }
  return absl::OkStatus();
}

absl::Status MulBackward(BackwardContext& ctx) {
  // d(a * b)/da = grad * b: each gradient reads the other operand.
  for (int i = 0; i < 2; ++i) {
    if (!ctx.needs_grad(i)) continue;
    AccumulateBroadcast(
        ctx, i, ctx.Emit("mul", {ctx.grad_output(), ctx.input(1 - i)}));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorType> InferSumTo(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  ASSIGN_OR_RETURN(Shape shape, ShapeAttr(attrs, "shape"));
  const Shape& x = in[0].shape;
  if (!BlockBroadcast(x, shape)) {
    return Invalid("attr 'shape' ", ShapeToString(shape),
                   " does not broadcast to the input ", ShapeToString(x),
                   " (as the broadcast operand of add or mul)");
  }
  return TensorType{shape, in[0].dtype};
}

double InputElementsFlops(Inputs in, const TensorType&, const Json&) {
  return Elements(in[0]);
}

// ---- copy and fill.

absl::StatusOr<TensorType> InferCopy(Inputs in, const Json&) { return in[0]; }

// cast (x), attr dtype: x's values converted to `dtype`, the shape kept
// (Note [Cast values], runtime/kernel_math.h). A cast to x's own dtype is
// refused: that is a `copy`.
absl::StatusOr<TensorType> InferCast(Inputs in, const Json& attrs) {
  if (!attrs.contains("dtype")) return Invalid("attr 'dtype' is required");
  ASSIGN_OR_RETURN(const DType dtype, DTypeAttr(attrs, "dtype", DType::kFloat32));
  if (dtype == in[0].dtype) {
    return Invalid("attr 'dtype' is the input's own (", DTypeName(dtype),
                   "): nothing to convert");
  }
  return TensorType{in[0].shape, dtype};
}

// Between float types the gradient is cast back to x's dtype, as autograd
// casts it; an integer result has none (nor has an integer x: needs_grad).
absl::Status CastBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0) || !IsFloat(ctx.output_type().dtype)) return absl::OkStatus();
  ctx.AccumulateGrad(0, ctx.Emit("cast", {ctx.grad_output()},
                                 {{"dtype", DTypeName(ctx.input_type(0).dtype)}}));
  return absl::OkStatus();
}

absl::Status CopyBackward(BackwardContext& ctx) {
  if (ctx.needs_grad(0)) ctx.AccumulateGrad(0, ctx.grad_output());
  return absl::OkStatus();
}

// fill: attrs shape, dtype (fp32), value (1; "inf" and "-inf" for a
// float dtype). An integer dtype takes the value truncated toward zero (as
// C++ converts), which must be in its range: [-2^63, 2^63) for i64, [0,
// 256) for u8 (a conversion out of range is undefined).
absl::StatusOr<TensorType> InferFill(Inputs, const Json& attrs) {
  ASSIGN_OR_RETURN(Shape shape, ShapeAttr(attrs, "shape"));
  ASSIGN_OR_RETURN(DType dtype, DTypeAttr(attrs, "dtype", DType::kFloat32));
  ASSIGN_OR_RETURN(const double value, ExtendedDoubleAttr(attrs, "value", 1.0));
  constexpr double kTwo63 = 9223372036854775808.0;
  if (dtype == DType::kInt64 && !(value >= -kTwo63 && value < kTwo63)) {
    return Invalid("attr 'value' (", value, ") of an i64 fill is out of its range");
  }
  if (dtype == DType::kUInt8 && !(value > -1 && value < 256)) {
    return Invalid("attr 'value' (", value, ") of a u8 fill is out of its range [0, 255]");
  }
  return TensorType{shape, dtype};
}

// Note [Constant data]. constant: attrs shape, dtype (fp32) and data, the
// tensor's own bytes (each element little-endian, row-major) in base64, so
// that every value survives JSON as it is: -inf in a mask, NaN, and i64
// beyond a double's 53 bits. A model's non-scalar constants (a table of
// positions computed by the exporter, a fixed mask) import as one; at most
// kMaxConstantBytes (16 MiB) each.
absl::StatusOr<TensorType> InferConstant(Inputs, const Json& attrs) {
  ASSIGN_OR_RETURN(Shape shape, ShapeAttr(attrs, "shape"));
  ASSIGN_OR_RETURN(DType dtype, DTypeAttr(attrs, "dtype", DType::kFloat32));
  const TensorType type{std::move(shape), dtype};
  RETURN_IF_ERROR(ConstantData(attrs, type).status());
  return type;
}

// random: attrs shape, dtype (fp32; a float type), and ParseRandom's: a
// tensor of seeded noise, torch.randn_like's and torch.rand_like's role
// (Note [Random values] in runtime/kernel_math.h).
absl::StatusOr<TensorType> InferRandom(Inputs, const Json& attrs) {
  ASSIGN_OR_RETURN(Shape shape, ShapeAttr(attrs, "shape"));
  ASSIGN_OR_RETURN(DType dtype, DTypeAttr(attrs, "dtype", DType::kFloat32));
  if (!IsFloat(dtype)) return Invalid("attr 'dtype' must be a float type, got ", DTypeName(dtype));
  RETURN_IF_ERROR(ParseRandom(attrs).status());
  return TensorType{std::move(shape), dtype};
}

// ---- dropout: mask = (uniform(seed) >= p) as u8; y = x * mask / (1 - p).

absl::Status CheckDropoutP(const Json& attrs) {
  ASSIGN_OR_RETURN(double p, DoubleAttr(attrs, "p", 0.5));
  if (p < 0 || p >= 1) return Invalid("attr 'p' = ", p, " must be in [0, 1)");
  return absl::OkStatus();
}

absl::StatusOr<TensorType> InferDropoutMask(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(CheckDropoutP(attrs));
  RETURN_IF_ERROR(IntAttr(attrs, "seed", 0).status());
  return TensorType{in[0].shape, DType::kUInt8};
}

// (x or grad, mask) -> x's type.
absl::StatusOr<TensorType> InferDropout(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(CheckDropoutP(attrs));
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0"));
  RETURN_IF_ERROR(ExpectDType(in[1], DType::kUInt8, "input 1 (mask)"));
  RETURN_IF_ERROR(ExpectSameShape(in[0], "input 0", in[1], "mask"));
  return in[0];
}

absl::Status DropoutBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ctx.AccumulateGrad(0, ctx.Emit("dropout_backward",
                                 {ctx.grad_output(), ctx.input(1)},
                                 ctx.attrs()));
  return absl::OkStatus();
}

}  // namespace

void RegisterElementwiseOps(std::vector<OpDef>& t) {
  t.push_back({.name = "relu", .min_inputs = 1, .max_inputs = 1,
               .infer = InferUnaryFloat, .flops = PerElement(1),
               .backward = ActivationBackward("relu_backward", true)});
  t.push_back({.name = "tanh", .min_inputs = 1, .max_inputs = 1,
               .infer = InferUnaryFloat, .flops = PerElement(1),
               .backward = ActivationBackward("tanh_backward", true)});
  t.push_back({.name = "sigmoid", .min_inputs = 1, .max_inputs = 1,
               .infer = InferUnaryFloat, .flops = PerElement(3),
               .backward = ActivationBackward("sigmoid_backward", true)});
  t.push_back({.name = "gelu", .min_inputs = 1, .max_inputs = 1,
               .infer = InferGelu, .flops = GeluFlops,
               .backward = ActivationBackward("gelu_backward", false)});
  // grad * (y > 0); grad * (1 - y^2); grad * y * (1 - y).
  t.push_back({.name = "relu_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferActivationBackward, .flops = PerElement(1)});
  t.push_back({.name = "tanh_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferActivationBackward, .flops = PerElement(3)});
  t.push_back({.name = "sigmoid_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferActivationBackward, .flops = PerElement(3)});
  t.push_back({.name = "gelu_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = [](Inputs in, const Json& attrs)
                   -> absl::StatusOr<TensorType> {
                 RETURN_IF_ERROR(GeluApproximate(attrs).status());
                 return InferActivationBackward(in, attrs);
               },
               .flops = GeluBackwardFlops});

  // Piecewise-linear activations; each backward reads x:
  // clip: min(max(x, lo), hi) (2); hardsigmoid: clip(alpha x + beta, 0, 1)
  // (4); hardswish: x relu6(x + 3) / 6 (5); leaky_relu (2).
  t.push_back({.name = "clip", .min_inputs = 1, .max_inputs = 1, .infer = InferClip,
               .flops = PerElement(2),
               .backward = ActivationBackward("clip_backward", false)});
  t.push_back({.name = "hardsigmoid", .min_inputs = 1, .max_inputs = 1,
               .infer = InferHardSigmoid, .flops = PerElement(4),
               .backward = ActivationBackward("hardsigmoid_backward", false)});
  t.push_back({.name = "hardswish", .min_inputs = 1, .max_inputs = 1,
               .infer = InferUnaryFloat, .flops = PerElement(5),
               .backward = ActivationBackward("hardswish_backward", false)});
  t.push_back({.name = "leaky_relu", .min_inputs = 1, .max_inputs = 1,
               .infer = InferLeakyRelu, .flops = PerElement(2),
               .backward = ActivationBackward("leaky_relu_backward", false)});
  // elu: scale x, or alpha scale (exp(input_scale x) - 1) (4); softplus:
  // log1p(exp(beta x)) / beta (4); each backward reads x.
  t.push_back({.name = "elu", .min_inputs = 1, .max_inputs = 1, .infer = InferElu,
               .flops = PerElement(4), .backward = ActivationBackward("elu_backward", false)});
  t.push_back({.name = "elu_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferElu), .flops = PerElement(4)});
  t.push_back({.name = "softplus", .min_inputs = 1, .max_inputs = 1, .infer = InferSoftplus,
               .flops = PerElement(4),
               .backward = ActivationBackward("softplus_backward", false)});
  t.push_back({.name = "softplus_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferSoftplus), .flops = PerElement(5)});
  // abs (1), exp (1), log (1); abs's and log's backwards read x (g sgn(x),
  // g / x), exp's its output (g y).
  t.push_back({.name = "abs", .min_inputs = 1, .max_inputs = 1, .infer = InferUnaryFloat,
               .flops = PerElement(1), .backward = ActivationBackward("abs_backward", false)});
  t.push_back({.name = "abs_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferUnaryFloat), .flops = PerElement(2)});
  t.push_back({.name = "exp", .min_inputs = 1, .max_inputs = 1, .infer = InferUnaryFloat,
               .flops = PerElement(1), .backward = ActivationBackward("exp_backward", true)});
  t.push_back({.name = "exp_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferUnaryFloat), .flops = PerElement(1)});
  t.push_back({.name = "log", .min_inputs = 1, .max_inputs = 1, .infer = InferUnaryFloat,
               .flops = PerElement(1), .backward = ActivationBackward("log_backward", false)});
  t.push_back({.name = "log_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferUnaryFloat), .flops = PerElement(1)});
  // erf (ONNX Erf: GELU written out); its backward reads x:
  // grad * 2 / sqrt(pi) exp(-x^2).
  t.push_back({.name = "erf", .min_inputs = 1, .max_inputs = 1,
               .infer = InferUnaryFloat, .flops = PerElement(8),
               .backward = ActivationBackward("erf_backward", false)});
  t.push_back({.name = "erf_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferUnaryFloat), .flops = PerElement(6)});
  // sqrt; its backward reads the output: grad / (2 y).
  t.push_back({.name = "sqrt", .min_inputs = 1, .max_inputs = 1,
               .infer = InferUnaryFloat, .flops = PerElement(1),
               .backward = ActivationBackward("sqrt_backward", true)});
  t.push_back({.name = "sqrt_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferUnaryFloat), .flops = PerElement(2)});
  // grad * (lo < x < hi); grad * alpha * (0 < alpha x + beta < 1);
  // grad * (x / 3 + 1/2) on [-3, 3]; grad * (x > 0 ? 1 : slope).
  t.push_back({.name = "clip_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferClip), .flops = PerElement(3)});
  t.push_back({.name = "hardsigmoid_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferHardSigmoid), .flops = PerElement(4)});
  t.push_back({.name = "hardswish_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferUnaryFloat), .flops = PerElement(4)});
  t.push_back({.name = "leaky_relu_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBackwardOf(InferLeakyRelu), .flops = PerElement(2)});

  t.push_back({.name = "add", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBinary, .flops = PerElement(1),
               .backward = AddBackward});
  t.push_back({.name = "mul", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBinary, .flops = PerElement(1),
               .backward = MulBackward});
  t.push_back({.name = "sub", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBinary, .flops = PerElement(1),
               .backward = SubBackward});
  t.push_back({.name = "div", .min_inputs = 2, .max_inputs = 2,
               .infer = InferBinary, .flops = PerElement(1),
               .backward = DivBackward});
  t.push_back({.name = "sum_to", .min_inputs = 1, .max_inputs = 1,
               .infer = InferSumTo, .flops = InputElementsFlops});
  t.push_back({.name = "copy", .min_inputs = 1, .max_inputs = 1,
               .infer = InferCopy, .flops = CopyFlops,
               .backward = CopyBackward});
  t.push_back({.name = "cast", .min_inputs = 1, .max_inputs = 1,
               .infer = InferCast, .flops = CopyFlops, .backward = CastBackward});
  t.push_back({.name = "fill", .min_inputs = 0, .max_inputs = 0,
               .infer = InferFill, .flops = CopyFlops});
  t.push_back({.name = "constant", .min_inputs = 0, .max_inputs = 0,
               .infer = InferConstant, .flops = CopyFlops});
  t.push_back({.name = "random", .min_inputs = 0, .max_inputs = 0,
               .infer = InferRandom, .flops = PerElement(8)});

  t.push_back({.name = "dropout_mask", .min_inputs = 1, .max_inputs = 1,
               .infer = InferDropoutMask, .flops = PerElement(1)});
  t.push_back({.name = "dropout", .min_inputs = 2, .max_inputs = 2,
               .infer = InferDropout, .flops = PerElement(2),
               .backward = DropoutBackward});
  t.push_back({.name = "dropout_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferDropout, .flops = PerElement(2)});
}

}  // namespace pebble::ops_internal
