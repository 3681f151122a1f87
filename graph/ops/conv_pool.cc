// Convolutions, pooling, upsampling and padding over 2 or 3 spatial dims
// (NCHW / NCDHW activations, OIHW / OIDHW weights: PyTorch's layouts).
// Sliding windows use PyTorch's floor mode: out = (in + 2p - k) / s + 1.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::ops_internal {
namespace {

// ---- Convolution.

// The kernel of a convolution: its weight's (O, I, k...) spatial dims.
std::vector<int64_t> KernelOf(const Shape& weight) {
  return std::vector<int64_t>(weight.begin() + 2, weight.end());
}

// The attrs of a convolution's backward nodes (the forward's window);
// dilation and groups only where they are not 1, as the forward may say.
Json ConvWindowAttrs(const Window& w) {
  Json attrs = {{"stride", w.stride}, {"padding", w.padding}};
  if (std::any_of(w.dilation.begin(), w.dilation.end(),
                  [](int64_t v) { return v != 1; })) {
    attrs["dilation"] = w.dilation;
  }
  if (w.groups != 1) attrs["groups"] = w.groups;
  return attrs;
}

std::string Layout(int d, bool weight) {
  if (weight) return d == 2 ? "(O, I, kH, kW)" : "(O, I, kD, kH, kW)";
  return d == 2 ? "(N, C, H, W)" : "(N, C, D, H, W)";
}

absl::StatusOr<TensorType> InferConv(int d, Inputs in, const Json& attrs) {
  const TensorType& x = in[0];
  const TensorType& w = in[1];
  RETURN_IF_ERROR(ExpectRank(x, d + 2, "input 0 (x " + Layout(d, false) + ")"));
  RETURN_IF_ERROR(
      ExpectRank(w, d + 2, "input 1 (weight " + Layout(d, true) + ")"));
  RETURN_IF_ERROR(ExpectFloat(x, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectSameDType(x, "x", w, "weight"));
  ASSIGN_OR_RETURN(Window win, ConvWindow(attrs, KernelOf(w.shape), d));
  RETURN_IF_ERROR(CheckConvGroups(x.shape[1], w.shape, win.groups,
                                  "x " + ShapeToString(x.shape)));
  if (in.size() == 3) {
    RETURN_IF_ERROR(ExpectShape(in[2], {w.shape[0]}, "input 2 (bias)"));
    RETURN_IF_ERROR(ExpectSameDType(x, "x", in[2], "bias"));
  }
  ASSIGN_OR_RETURN(Shape out, WindowShape(x.shape, w.shape[0], win));
  return TensorType{out, x.dtype};
}

// 2 N O prod(out) I prod(k): one multiply-add per weight per output.
double ConvMacFlops(const Shape& out, const Shape& weight) {
  return 2.0 * Elements(out) * Elements(Shape(weight.begin() + 1, weight.end()));
}

double ConvFlops(Inputs in, const TensorType& out, const Json&) {
  double f = ConvMacFlops(out.shape, in[1].shape);
  if (in.size() == 3) f += Elements(out);
  return f;
}

// conv{d}_backward_data (grad, weight), attrs stride, padding, dilation,
// groups, input_shape.
absl::StatusOr<TensorType> InferConvBackwardData(int d, Inputs in,
                                                 const Json& attrs) {
  const TensorType& g = in[0];
  const TensorType& w = in[1];
  RETURN_IF_ERROR(ExpectFloat(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRank(g, d + 2, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRank(w, d + 2, "input 1 (weight)"));
  ASSIGN_OR_RETURN(Shape x, ShapeAttr(attrs, "input_shape"));
  if (static_cast<int>(x.size()) != d + 2) {
    return Invalid("attr 'input_shape' ", ShapeToString(x),
                   " does not match the weight ", ShapeToString(w.shape));
  }
  ASSIGN_OR_RETURN(Window win, ConvWindow(attrs, KernelOf(w.shape), d));
  RETURN_IF_ERROR(CheckConvGroups(x[1], w.shape, win.groups,
                                  "attr 'input_shape' " + ShapeToString(x)));
  ASSIGN_OR_RETURN(Shape y, WindowShape(x, w.shape[0], win));
  RETURN_IF_ERROR(ExpectShape(g, y, "input 0 (grad)"));
  return TensorType{x, g.dtype};
}

// The data gradient costs what the forward product costs: in[1] is the
// weight.
double ConvBackwardDataFlops(Inputs in, const TensorType&, const Json&) {
  return ConvMacFlops(in[0].shape, in[1].shape);
}

// conv{d}_backward_weight (grad, x), attrs stride, padding, dilation,
// groups, kernel.
absl::StatusOr<TensorType> InferConvBackwardWeight(int d, Inputs in,
                                                   const Json& attrs) {
  const TensorType& g = in[0];
  const TensorType& x = in[1];
  RETURN_IF_ERROR(ExpectFloat(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRank(g, d + 2, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRank(x, d + 2, "input 1 (x)"));
  ASSIGN_OR_RETURN(std::vector<int64_t> kernel,
                   SpatialAttr(attrs, "kernel", d, 0, /*required=*/true));
  ASSIGN_OR_RETURN(ConvGroupsDilation gd, ConvGroupsDilationAttrs(attrs, d));
  if (x.shape[1] % gd.groups != 0) {
    return Invalid("input 1 (x) has ", x.shape[1],
                   " channels, not divisible by groups = ", gd.groups);
  }
  Shape w = {g.shape[1], x.shape[1] / gd.groups};
  w.insert(w.end(), kernel.begin(), kernel.end());
  ASSIGN_OR_RETURN(Window win, ConvWindow(attrs, kernel, d));
  RETURN_IF_ERROR(CheckConvGroups(x.shape[1], w, win.groups, "input 1 (x)"));
  ASSIGN_OR_RETURN(Shape y, WindowShape(x.shape, g.shape[1], win));
  RETURN_IF_ERROR(ExpectShape(g, y, "input 0 (grad)"));
  return TensorType{w, g.dtype};
}

double WeightGradFlops(Inputs in, const TensorType& out, const Json&) {
  return ConvMacFlops(in[0].shape, out.shape);
}

// conv{d}_backward_bias (grad) -> (O): the sum over N and the spatial dims.
absl::StatusOr<TensorType> InferChannelSum(int rank, Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  if (rank > 0) {
    RETURN_IF_ERROR(ExpectRank(in[0], rank, "input 0 (grad)"));
  } else {
    RETURN_IF_ERROR(ExpectRankAtLeast(in[0], 2, "input 0 (grad)"));
  }
  return TensorType{{in[0].shape[1]}, in[0].dtype};
}

double InputFlops(Inputs in, const TensorType&, const Json&) {
  return Elements(in[0]);
}

// The gradients of a convolution and, with `transposed`, of its data
// gradient run as a forward operator (ONNX's ConvTranspose, nn.ConvTranspose2d
// and 3d: y = A_W^T x, where A_W a = conv(a, W)). A convolution's x gets the
// data gradient of g by the weight, its weight the weight gradient of g by
// x, its bias the sum of g. Since <g, A_W^T x> = <A_W g, x>, a transposed
// convolution's x gets the convolution of g by the same weight and window,
// and its weight the convolution's weight gradient with x as the output
// gradient and g as the input.
std::function<absl::Status(BackwardContext&)> ConvBackward(int d, bool transposed) {
  const std::string base = d == 2 ? "conv2d" : "conv3d";
  return [base, d, transposed](BackwardContext& ctx) -> absl::Status {
    const Value g = ctx.grad_output();
    const Value x = ctx.input(0);
    ASSIGN_OR_RETURN(Window win,
                     ConvWindow(ctx.attrs(), KernelOf(ctx.input_type(1).shape), d));
    const Json common = ConvWindowAttrs(win);
    if (ctx.needs_grad(0)) {
      Json attrs = common;
      if (!transposed) attrs["input_shape"] = ctx.input_type(0).shape;
      ctx.AccumulateGrad(0, ctx.Emit(transposed ? base : base + "_backward_data",
                                     {g, ctx.input(1)}, attrs));
    }
    if (ctx.needs_grad(1)) {
      Json attrs = common;
      attrs["kernel"] = win.kernel;
      ctx.AccumulateGrad(1, ctx.Emit(base + "_backward_weight",
                                     transposed ? std::vector<Value>{x, g}
                                                : std::vector<Value>{g, x},
                                     attrs));
    }
    if (ctx.num_inputs() == 3 && ctx.needs_grad(2)) {
      ctx.AccumulateGrad(2, ctx.Emit(base + "_backward_bias", {g}));
    }
    return absl::OkStatus();
  };
}

// ---- Pooling: kernel (required), stride (default: kernel), padding (0),
// ceil_mode (false; average pooling only with count_include_pad false).

absl::StatusOr<int> PoolDims(const TensorType& x, absl::string_view what) {
  const int rank = static_cast<int>(x.shape.size());
  if (rank != 4 && rank != 5) {
    return Invalid(what, " must be (N, C, H, W) or (N, C, D, H, W), got ",
                   ShapeToString(x.shape));
  }
  return rank - 2;
}

Json WindowAttrs(const Window& w) {
  Json attrs = {{"kernel", w.kernel}, {"stride", w.stride}, {"padding", w.padding}};
  if (w.ceil_mode) attrs["ceil_mode"] = true;
  return attrs;
}

// Average pooling divides by the whole kernel (count_include_pad, true by
// default as PyTorch's) or by the window's elements within the input
// (count_include_pad false, which ceil mode needs: PyTorch's ceil-mode
// divisor with the padding counted is not reproduced).
absl::StatusOr<bool> CountIncludePad(const Json& attrs, const Window& w) {
  ASSIGN_OR_RETURN(bool counted, BoolAttr(attrs, "count_include_pad", true));
  if (w.ceil_mode && counted) {
    return Invalid("attr 'ceil_mode' of avgpool needs count_include_pad false");
  }
  return counted;
}

Json AvgPoolAttrs(const Window& w, bool count_include_pad) {
  Json attrs = WindowAttrs(w);
  if (!count_include_pad) attrs["count_include_pad"] = false;
  return attrs;
}

absl::StatusOr<Shape> PoolShape(const Shape& x, const Window& w) {
  return WindowShape(x, x[1], w);
}

absl::StatusOr<TensorType> InferPool(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  ASSIGN_OR_RETURN(int d, PoolDims(in[0], "input 0 (x)"));
  ASSIGN_OR_RETURN(Window w, PoolWindow(attrs, d));
  ASSIGN_OR_RETURN(Shape out, PoolShape(in[0].shape, w));
  return TensorType{out, in[0].dtype};
}

absl::StatusOr<TensorType> InferAvgPool(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(TensorType out, InferPool(in, attrs));
  ASSIGN_OR_RETURN(Window w, PoolWindow(attrs, static_cast<int>(out.shape.size()) - 2));
  RETURN_IF_ERROR(CountIncludePad(attrs, w).status());
  return out;
}

// One operation per window element per output.
double WindowFlops(const Shape& out, const Json& attrs) {
  const int d = static_cast<int>(out.size()) - 2;
  absl::StatusOr<Window> w = PoolWindow(attrs, d);
  double k = 1;
  if (w.ok()) {
    for (int64_t e : w->kernel) k *= static_cast<double>(e);
  }
  return k * Elements(out);
}

double PoolFlops(Inputs, const TensorType& out, const Json& attrs) {
  return WindowFlops(out.shape, attrs);
}

// maxpool_backward (grad, x): the argmax of each window is found again in x.
absl::StatusOr<TensorType> InferMaxPoolBackward(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectFloat(in[1], "input 1 (x)"));
  ASSIGN_OR_RETURN(int d, PoolDims(in[1], "input 1 (x)"));
  ASSIGN_OR_RETURN(Window w, PoolWindow(attrs, d));
  ASSIGN_OR_RETURN(Shape y, PoolShape(in[1].shape, w));
  RETURN_IF_ERROR(ExpectShape(in[0], y, "input 0 (grad)"));
  return TensorType{in[1].shape, in[0].dtype};
}

double MaxPoolBackwardFlops(Inputs in, const TensorType& out,
                            const Json& attrs) {
  return WindowFlops(in[0].shape, attrs) + Elements(out);
}

// avgpool_backward (grad), attrs kernel, stride, padding, ceil_mode,
// count_include_pad, input_shape.
absl::StatusOr<TensorType> InferAvgPoolBackward(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  ASSIGN_OR_RETURN(Shape x, ShapeAttr(attrs, "input_shape"));
  ASSIGN_OR_RETURN(int d, PoolDims(TensorType{x, in[0].dtype},
                                   "attr 'input_shape'"));
  ASSIGN_OR_RETURN(Window w, PoolWindow(attrs, d));
  RETURN_IF_ERROR(CountIncludePad(attrs, w).status());
  ASSIGN_OR_RETURN(Shape y, PoolShape(x, w));
  RETURN_IF_ERROR(ExpectShape(in[0], y, "input 0 (grad)"));
  return TensorType{x, in[0].dtype};
}

double AvgPoolBackwardFlops(Inputs in, const TensorType&, const Json& attrs) {
  return WindowFlops(in[0].shape, attrs);
}

absl::Status MaxPoolBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ASSIGN_OR_RETURN(Window w, PoolWindow(ctx.attrs(),
                                        ctx.input_type(0).shape.size() - 2));
  ctx.AccumulateGrad(0, ctx.Emit("maxpool_backward",
                                 {ctx.grad_output(), ctx.input(0)},
                                 WindowAttrs(w)));
  return absl::OkStatus();
}

absl::Status AvgPoolBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ASSIGN_OR_RETURN(Window w, PoolWindow(ctx.attrs(),
                                        ctx.input_type(0).shape.size() - 2));
  ASSIGN_OR_RETURN(bool count_include_pad, CountIncludePad(ctx.attrs(), w));
  Json attrs = AvgPoolAttrs(w, count_include_pad);
  attrs["input_shape"] = ctx.input_type(0).shape;
  ctx.AccumulateGrad(0, ctx.Emit("avgpool_backward", {ctx.grad_output()},
                                 attrs));
  return absl::OkStatus();
}

// ---- Global and adaptive average pooling.

absl::StatusOr<TensorType> InferGlobalAvgPool(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(in[0], 3, "input 0 (x, N C spatial...)"));
  return TensorType{{in[0].shape[0], in[0].shape[1]}, in[0].dtype};
}

absl::StatusOr<TensorType> InferGlobalAvgPoolBackward(Inputs in,
                                                      const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  ASSIGN_OR_RETURN(Shape x, ShapeAttr(attrs, "input_shape"));
  if (x.size() < 3) {
    return Invalid("attr 'input_shape' ", ShapeToString(x),
                   " must have rank >= 3");
  }
  RETURN_IF_ERROR(ExpectShape(in[0], {x[0], x[1]}, "input 0 (grad)"));
  return TensorType{x, in[0].dtype};
}

double OutputFlops(Inputs, const TensorType& out, const Json&) {
  return Elements(out);
}

absl::Status GlobalAvgPoolBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ctx.AccumulateGrad(0, ctx.Emit("global_avgpool_backward",
                                 {ctx.grad_output()},
                                 {{"input_shape", ctx.input_type(0).shape}}));
  return absl::OkStatus();
}

// PyTorch's adaptive bins: bin i of `out` over `in` spans
// [floor(i in / out), ceil((i + 1) in / out)).
int64_t AdaptiveBinTotal(int64_t in, int64_t out) {
  int64_t total = 0;
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = (i * in) / out;
    const int64_t end = ((i + 1) * in + out - 1) / out;
    total += end - start;
  }
  return total;
}

absl::StatusOr<std::vector<int64_t>> AdaptiveSize(const Json& attrs, int d) {
  ASSIGN_OR_RETURN(std::vector<int64_t> size,
                   SpatialAttr(attrs, "output_size", d, 0, true));
  for (int64_t s : size) {
    if (s < 1) return Invalid("attr 'output_size' must be >= 1, got ", s);
  }
  return size;
}

absl::StatusOr<TensorType> InferAdaptiveAvgPool(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  ASSIGN_OR_RETURN(int d, PoolDims(in[0], "input 0 (x)"));
  ASSIGN_OR_RETURN(std::vector<int64_t> size, AdaptiveSize(attrs, d));
  Shape out = {in[0].shape[0], in[0].shape[1]};
  out.insert(out.end(), size.begin(), size.end());
  return TensorType{out, in[0].dtype};
}

// One addition per input element of every bin (bins may overlap).
double AdaptiveFlops(const Shape& x, const Shape& y) {
  double f = static_cast<double>(x[0] * x[1]);
  for (size_t i = 2; i < x.size() && i < y.size(); ++i) {
    f *= static_cast<double>(AdaptiveBinTotal(x[i], y[i]));
  }
  return f;
}

absl::StatusOr<TensorType> InferAdaptiveAvgPoolBackward(Inputs in,
                                                        const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  ASSIGN_OR_RETURN(Shape x, ShapeAttr(attrs, "input_shape"));
  ASSIGN_OR_RETURN(int d, PoolDims(TensorType{x, in[0].dtype},
                                   "attr 'input_shape'"));
  ASSIGN_OR_RETURN(std::vector<int64_t> size, AdaptiveSize(attrs, d));
  Shape y = {x[0], x[1]};
  y.insert(y.end(), size.begin(), size.end());
  RETURN_IF_ERROR(ExpectShape(in[0], y, "input 0 (grad)"));
  return TensorType{x, in[0].dtype};
}

absl::Status AdaptiveAvgPoolBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  const Shape& y = ctx.output_type().shape;
  ctx.AccumulateGrad(
      0, ctx.Emit("adaptive_avgpool_backward", {ctx.grad_output()},
                  {{"output_size", Shape(y.begin() + 2, y.end())},
                   {"input_shape", ctx.input_type(0).shape}}));
  return absl::OkStatus();
}

// ---- Upsampling (ParseUpsampling, op_util.h).

absl::StatusOr<Shape> Upsampled(const Shape& x, const Json& attrs) {
  ASSIGN_OR_RETURN(const Upsampling u, ParseUpsampling(attrs, x));
  Shape out = x;
  std::copy(u.out.begin(), u.out.end(), out.begin() + 2);
  return out;
}

absl::StatusOr<TensorType> InferUpsample(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  RETURN_IF_ERROR(PoolDims(in[0], "input 0 (x)").status());
  ASSIGN_OR_RETURN(Shape out, Upsampled(in[0].shape, attrs));
  return TensorType{out, in[0].dtype};
}

// Per output element: nearest copies (1), (bi/tri)linear takes a weighted
// sum of 2^d neighbours (2 * 2^d), bicubic of 4^2 (32, its weights
// besides).
double UpsampleFlopsFor(const Shape& y, const Json& attrs) {
  absl::StatusOr<std::string> mode = StringAttr(attrs, "mode", "nearest");
  double per = 1;
  if (mode.ok() && *mode == "bicubic") {
    per = 32;
  } else if (mode.ok() && *mode != "nearest") {
    per = 2.0 * (1 << (y.size() - 2));
  }
  return per * Elements(y);
}

double UpsampleFlops(Inputs, const TensorType& out, const Json& attrs) {
  return UpsampleFlopsFor(out.shape, attrs);
}

absl::StatusOr<TensorType> InferUpsampleBackward(Inputs in,
                                                 const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  ASSIGN_OR_RETURN(Shape x, ShapeAttr(attrs, "input_shape"));
  RETURN_IF_ERROR(
      PoolDims(TensorType{x, in[0].dtype}, "attr 'input_shape'").status());
  ASSIGN_OR_RETURN(Shape upsampled, Upsampled(x, attrs));
  RETURN_IF_ERROR(ExpectShape(in[0], upsampled, "input 0 (grad)"));
  return TensorType{x, in[0].dtype};
}

double UpsampleBackwardFlops(Inputs in, const TensorType&, const Json& attrs) {
  return UpsampleFlopsFor(in[0].shape, attrs);
}

absl::Status UpsampleBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  // The forward's geometry attrs, and the input's shape.
  Json attrs = Json::object();
  for (const char* name : {"scale", "size", "scale_factor", "mode", "align_corners"}) {
    if (ctx.attrs().contains(name)) attrs[name] = ctx.attrs()[name];
  }
  attrs["input_shape"] = ctx.input_type(0).shape;
  ctx.AccumulateGrad(0, ctx.Emit("upsample_backward", {ctx.grad_output()},
                                 attrs));
  return absl::OkStatus();
}

// ---- Padding, torch.nn.functional.pad order: the last dim first,
// (before, after) per dim. Mode constant (attr value, 0 by default):
// negative amounts crop, as in F.pad. Modes reflect and replicate
// (Note [Border padding] in runtime/kernel_math.h): amounts of 0 or more,
// and for reflect below the dim's size, as PyTorch requires.

absl::StatusOr<Shape> Padded(const Shape& x, const std::vector<int64_t>& pads,
                             int sign) {
  if (pads.empty() || pads.size() % 2 != 0 || pads.size() > 2 * x.size()) {
    return Invalid("attr 'pads' must hold 2 to ", 2 * x.size(),
                   " integers (an even count) for shape ", ShapeToString(x));
  }
  Shape out = x;
  for (int64_t p : pads) {
    if (p > kMaxWindowExtent || p < -kMaxWindowExtent) {
      return Invalid("attr 'pads' holds ", p, ", beyond +-", kMaxWindowExtent);
    }
  }
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const size_t axis = x.size() - 1 - i;
    if (__builtin_add_overflow(out[axis], sign * (pads[2 * i] + pads[2 * i + 1]),
                               &out[axis])) {
      return Invalid("attr 'pads' overflows dim ", axis, " of ", ShapeToString(x));
    }
    if (out[axis] < 1) {
      return Invalid("attr 'pads' leaves dim ", axis, " of ",
                     ShapeToString(x), " with size ", out[axis]);
    }
  }
  return out;
}

// The mode's checks against the unpadded shape `x`; returns the mode.
absl::StatusOr<std::string> CheckPadMode(const Json& attrs, const Shape& x,
                                         const std::vector<int64_t>& pads) {
  ASSIGN_OR_RETURN(std::string mode, StringAttr(attrs, "mode", "constant"));
  if (mode == "constant") {
    RETURN_IF_ERROR(DoubleAttr(attrs, "value", 0).status());
    return mode;
  }
  if (mode != "reflect" && mode != "replicate") {
    return Invalid("attr 'mode' must be \"constant\", \"reflect\" or \"replicate\", got \"",
                   mode, "\"");
  }
  if (attrs.is_object() && attrs.contains("value")) {
    return Invalid("attr 'value' is for mode \"constant\", not \"", mode, "\"");
  }
  if (x.size() > 6) return Invalid("mode \"", mode, "\" pads tensors of rank 6 at most");
  for (size_t i = 0; i < pads.size() && i / 2 < x.size(); ++i) {
    const size_t axis = x.size() - 1 - i / 2;
    if (pads[i] < 0) {
      return Invalid("attr 'pads' holds ", pads[i], ": mode \"", mode, "\" does not crop");
    }
    if (mode == "reflect" && pads[i] >= x[axis]) {
      return Invalid("attr 'pads' holds ", pads[i], " for dim ", axis, " of ", ShapeToString(x),
                     ": mode \"reflect\" pads by less than the dim's size (PyTorch's rule)");
    }
  }
  return mode;
}

absl::StatusOr<TensorType> InferPad(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  ASSIGN_OR_RETURN(std::vector<int64_t> pads, IntListAttr(attrs, "pads"));
  ASSIGN_OR_RETURN(Shape out, Padded(in[0].shape, pads, +1));
  RETURN_IF_ERROR(CheckPadMode(attrs, in[0].shape, pads).status());
  return TensorType{out, in[0].dtype};
}

// pad_backward (grad), attrs pads and mode: the gradient of the unpadded
// region (constant), or of each input element summed over the outputs that
// read it (reflect, replicate).
absl::StatusOr<TensorType> InferPadBackward(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  ASSIGN_OR_RETURN(std::vector<int64_t> pads, IntListAttr(attrs, "pads"));
  ASSIGN_OR_RETURN(Shape out, Padded(in[0].shape, pads, -1));
  RETURN_IF_ERROR(CheckPadMode(attrs, out, pads).status());
  return TensorType{out, in[0].dtype};
}

absl::Status PadBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int64_t> pads, IntListAttr(ctx.attrs(), "pads"));
  ASSIGN_OR_RETURN(std::string mode, StringAttr(ctx.attrs(), "mode", "constant"));
  Json attrs = {{"pads", pads}};
  if (mode != "constant") attrs["mode"] = mode;
  ctx.AccumulateGrad(0, ctx.Emit("pad_backward", {ctx.grad_output()}, std::move(attrs)));
  return absl::OkStatus();
}

}  // namespace

void RegisterConvPoolOps(std::vector<OpDef>& t) {
  for (int d : {2, 3}) {
    const std::string base = d == 2 ? "conv2d" : "conv3d";
    t.push_back({.name = base, .min_inputs = 2, .max_inputs = 3,
                 .infer = [d](Inputs in, const Json& a) {
                   return InferConv(d, in, a);
                 },
                 .flops = ConvFlops,
                 .backward = ConvBackward(d, /*transposed=*/false)});
    t.push_back({.name = base + "_backward_data", .min_inputs = 2,
                 .max_inputs = 2,
                 .infer = [d](Inputs in, const Json& a) {
                   return InferConvBackwardData(d, in, a);
                 },
                 .flops = ConvBackwardDataFlops,
                 .backward = ConvBackward(d, /*transposed=*/true)});
    t.push_back({.name = base + "_backward_weight", .min_inputs = 2,
                 .max_inputs = 2,
                 .infer = [d](Inputs in, const Json& a) {
                   return InferConvBackwardWeight(d, in, a);
                 },
                 .flops = WeightGradFlops});
    t.push_back({.name = base + "_backward_bias", .min_inputs = 1,
                 .max_inputs = 1,
                 .infer = [d](Inputs in, const Json& a) {
                   return InferChannelSum(d + 2, in, a);
                 },
                 .flops = InputFlops});
  }
  t.push_back({.name = "maxpool", .min_inputs = 1, .max_inputs = 1,
               .infer = InferPool, .flops = PoolFlops,
               .backward = MaxPoolBackward});
  t.push_back({.name = "maxpool_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferMaxPoolBackward, .flops = MaxPoolBackwardFlops});
  t.push_back({.name = "avgpool", .min_inputs = 1, .max_inputs = 1,
               .infer = InferAvgPool, .flops = PoolFlops,
               .backward = AvgPoolBackward});
  t.push_back({.name = "avgpool_backward", .min_inputs = 1, .max_inputs = 1,
               .infer = InferAvgPoolBackward, .flops = AvgPoolBackwardFlops});
  t.push_back({.name = "global_avgpool", .min_inputs = 1, .max_inputs = 1,
               .infer = InferGlobalAvgPool, .flops = InputFlops,
               .backward = GlobalAvgPoolBackward});
  t.push_back({.name = "global_avgpool_backward", .min_inputs = 1,
               .max_inputs = 1, .infer = InferGlobalAvgPoolBackward,
               .flops = OutputFlops});
  t.push_back({.name = "adaptive_avgpool", .min_inputs = 1, .max_inputs = 1,
               .infer = InferAdaptiveAvgPool,
               .flops = [](Inputs in, const TensorType& out, const Json&) {
                 return AdaptiveFlops(in[0].shape, out.shape);
               },
               .backward = AdaptiveAvgPoolBackward});
  t.push_back({.name = "adaptive_avgpool_backward", .min_inputs = 1,
               .max_inputs = 1, .infer = InferAdaptiveAvgPoolBackward,
               .flops = [](Inputs in, const TensorType& out, const Json&) {
                 return AdaptiveFlops(out.shape, in[0].shape);
               }});
  t.push_back({.name = "upsample", .min_inputs = 1, .max_inputs = 1,
               .infer = InferUpsample, .flops = UpsampleFlops,
               .backward = UpsampleBackward});
  t.push_back({.name = "upsample_backward", .min_inputs = 1, .max_inputs = 1,
               .infer = InferUpsampleBackward,
               .flops = UpsampleBackwardFlops});
  t.push_back({.name = "pad", .min_inputs = 1, .max_inputs = 1,
               .infer = InferPad, .flops = CopyFlops,
               .backward = PadBackward});
  t.push_back({.name = "pad_backward", .min_inputs = 1, .max_inputs = 1,
               .infer = InferPadBackward, .flops = CopyFlops});
}

}  // namespace pebble::ops_internal
