// Convolutions (oneDNN convolution primitives), linear layers and batched
// matrix products (oneDNN matmul), and the bias gradients (own
// deterministic reductions). Operands are PyTorch's row-major layouts:
// x (N, C, [D,] H, W), weight (O, I, [kD,] kH, kW), linear weight
// (out, in). Matrix operands are wrapped in place (a transpose is a
// stride); convolutions let oneDNN choose its layouts (blocked nCdhw16c and
// friends run its direct JIT kernels, several times faster than the im2col
// GEMM path it takes for plain ncdhw) and reorder through scratch.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/cpu/dnnl_util.h"

namespace pebble::dnnl_internal {
namespace {

// 2 for conv2d*, 3 for conv3d*.
int ConvDims(const KernelContext& ctx) {
  return ctx.op().rfind("conv3d", 0) == 0 ? 3 : 2;
}

std::string WindowKey(const Window& w) {
  return absl::StrCat("s", DimsKey(w.stride), "p", DimsKey(w.padding), "d",
                      DimsKey(w.dilation), "g", w.groups);
}

// oneDNN's dilation counts the gaps between taps: PyTorch's minus one.
dnnl::memory::dims Dilates(const Window& w) {
  dnnl::memory::dims d(w.kernel.size(), 0);
  for (size_t i = 0; i < w.dilation.size(); ++i) d[i] = w.dilation[i] - 1;
  return d;
}

// The weight (O, I / G, k...) as oneDNN's grouped weights (G, O / G, I / G,
// k...) where groups > 1: the same bytes, one more dim.
Shape WeightShape(const Shape& w, const Window& win) {
  if (win.groups == 1) return w;
  Shape g = {win.groups, w[0] / win.groups};
  g.insert(g.end(), w.begin() + 1, w.end());
  return g;
}

// The layout of a convolution operand: oneDNN's choice (format_tag::any),
// so that it can pick its blocked / channels-last kernels; Execute reorders
// between that and the plain layout in scratch (Relayout).
dnnl::memory::desc AnyDesc(const Shape& shape) {
  return dnnl::memory::desc(Dims(shape), dt::f32, tag::any);
}

// A forward convolution primitive descriptor: the primitive itself for
// conv{2,3}d, the hint of the backward ones. No bias unless `bias`.
dnnl::convolution_forward::primitive_desc ForwardPd(const Shape& x,
                                                    const Shape& w,
                                                    const Shape& y,
                                                    const Window& win,
                                                    bool bias) {
  const dnnl::memory::desc bias_md =
      bias ? PlainDesc({w[0]}) : dnnl::memory::desc();
  const dnnl::convolution_forward::desc desc(
      dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
      AnyDesc(x), AnyDesc(WeightShape(w, win)), bias_md, AnyDesc(y),
      Dims(win.stride), Dilates(win), Dims(win.padding), Dims(win.padding));
  return dnnl::convolution_forward::primitive_desc(desc, DefaultAttr(),
                                                   Engine());
}

// Whether any dim of `shape` is zero (an empty tensor: nothing to compute).
bool Empty(const Shape& shape) { return NumElements(shape) == 0; }

}  // namespace

// conv{2,3}d (x, weight[, bias]), attrs stride, padding.
absl::Status ConvForward(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 3));
  const int d = ConvDims(ctx);
  const TensorView& x = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectRank(x, d + 2, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectRank(w, d + 2, "input 1 (weight)"));
  RETURN_IF_ERROR(ExpectF32(x, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectF32(w, "input 1 (weight)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  const bool bias = ctx.inputs.size() == 3;
  if (bias) {
    RETURN_IF_ERROR(ExpectShape(ctx.inputs[2], {w.shape[0]}, "input 2 (bias)"));
    RETURN_IF_ERROR(ExpectF32(ctx.inputs[2], "input 2 (bias)"));
  }
  ASSIGN_OR_RETURN(
      Window win,
      ConvWindow(ctx.attrs(), std::vector<int64_t>(w.shape.begin() + 2,
                                                   w.shape.end()),
                 d));
  RETURN_IF_ERROR(ops_internal::CheckConvGroups(
      x.shape[1], w.shape, win.groups, "x " + ShapeToString(x.shape)));
  ASSIGN_OR_RETURN(Shape y, WindowShape(x.shape, w.shape[0], win));
  RETURN_IF_ERROR(ExpectShape(ctx.output, y, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (Empty(y)) return absl::OkStatus();
  if (Empty(x.shape)) {  // C == 0: the bias alone
    float* out = ctx.output.as<float>();
    const int64_t inner = NumElements(y) / (y[0] * y[1]);
    for (int64_t n = 0; n < y[0]; ++n) {
      for (int64_t o = 0; o < y[1]; ++o) {
        const float v = bias ? ctx.inputs[2].as<float>()[o] : 0.0f;
        std::fill_n(out + (n * y[1] + o) * inner, inner, v);
      }
    }
    return absl::OkStatus();
  }
  const std::string key =
      absl::StrCat("conv_fwd:", DimsKey(Dims(x.shape)), ":",
                   DimsKey(Dims(w.shape)), ":", bias, ":", WindowKey(win));
  const CachedPrimitive& p = GetPrimitive(key, [&] {
    auto pd = ForwardPd(x.shape, w.shape, y, win, bias);
    CachedPrimitive c = Cached(pd);
    AddRelayout(c, DNNL_ARG_SRC, PlainDesc(x.shape), pd.src_desc(), false);
    AddRelayout(c, DNNL_ARG_WEIGHTS, PlainDesc(WeightShape(w.shape, win)),
                pd.weights_desc(), false);
    AddRelayout(c, DNNL_ARG_DST, PlainDesc(y), pd.dst_desc(), true);
    return c;
  });
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, Wrap(PlainDesc(x.shape), x.data)},
      {DNNL_ARG_WEIGHTS, Wrap(PlainDesc(WeightShape(w.shape, win)), w.data)},
      {DNNL_ARG_DST, Wrap(PlainDesc(y), ctx.output.data)}};
  if (bias) {
    args.emplace(DNNL_ARG_BIAS,
                 Wrap(PlainDesc({w.shape[0]}), ctx.inputs[2].data));
  }
  Execute(p, std::move(args));
  return absl::OkStatus();
}

// conv{2,3}d_backward_data (g, weight), attrs stride, padding, dilation,
// groups, input_shape.
absl::Status ConvBackwardData(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const int d = ConvDims(ctx);
  const TensorView& g = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectRank(g, d + 2, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRank(w, d + 2, "input 1 (weight)"));
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(w, "input 1 (weight)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  ASSIGN_OR_RETURN(Shape x,
                   ops_internal::ShapeAttr(ctx.attrs(), "input_shape"));
  if (static_cast<int>(x.size()) != d + 2) {
    return Invalid("attr 'input_shape' ", ShapeToString(x),
                   " does not match the weight ", ShapeToString(w.shape));
  }
  ASSIGN_OR_RETURN(
      Window win,
      ConvWindow(ctx.attrs(), std::vector<int64_t>(w.shape.begin() + 2,
                                                   w.shape.end()),
                 d));
  RETURN_IF_ERROR(ops_internal::CheckConvGroups(
      x[1], w.shape, win.groups, "attr 'input_shape' " + ShapeToString(x)));
  ASSIGN_OR_RETURN(Shape y, WindowShape(x, w.shape[0], win));
  RETURN_IF_ERROR(ExpectShape(g, y, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, x, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (Empty(x)) return absl::OkStatus();
  if (Empty(y)) {  // O == 0: no contribution
    std::memset(ctx.output.data, 0, ctx.output.bytes());
    return absl::OkStatus();
  }
  const std::string key =
      absl::StrCat("conv_bwd_data:", DimsKey(Dims(x)), ":",
                   DimsKey(Dims(w.shape)), ":", WindowKey(win));
  const CachedPrimitive& p = GetPrimitive(key, [&] {
    auto hint = ForwardPd(x, w.shape, y, win, false);
    const dnnl::convolution_backward_data::desc desc(
        dnnl::algorithm::convolution_direct, AnyDesc(x),
        AnyDesc(WeightShape(w.shape, win)), AnyDesc(y), Dims(win.stride),
        Dilates(win), Dims(win.padding), Dims(win.padding));
    dnnl::convolution_backward_data::primitive_desc pd(desc, DefaultAttr(),
                                                       Engine(), hint);
    CachedPrimitive c = Cached(pd);
    AddRelayout(c, DNNL_ARG_DIFF_DST, PlainDesc(y), pd.diff_dst_desc(),
                false);
    AddRelayout(c, DNNL_ARG_WEIGHTS, PlainDesc(WeightShape(w.shape, win)),
                pd.weights_desc(), false);
    AddRelayout(c, DNNL_ARG_DIFF_SRC, PlainDesc(x), pd.diff_src_desc(), true);
    return c;
  });
  Execute(p, {{DNNL_ARG_DIFF_DST, Wrap(PlainDesc(y), g.data)},
              {DNNL_ARG_WEIGHTS,
               Wrap(PlainDesc(WeightShape(w.shape, win)), w.data)},
              {DNNL_ARG_DIFF_SRC, Wrap(PlainDesc(x), ctx.output.data)}});
  return absl::OkStatus();
}

// conv{2,3}d_backward_weight (g, x), attrs stride, padding, dilation,
// groups, kernel.
absl::Status ConvBackwardWeight(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const int d = ConvDims(ctx);
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectRank(g, d + 2, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRank(x, d + 2, "input 1 (x)"));
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(x, "input 1 (x)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  ASSIGN_OR_RETURN(std::vector<int64_t> kernel,
                   ops_internal::SpatialAttr(ctx.attrs(), "kernel", d, 0,
                                             /*required=*/true));
  ASSIGN_OR_RETURN(Window win, ConvWindow(ctx.attrs(), kernel, d));
  if (x.shape[1] % win.groups != 0) {
    return Invalid("input 1 (x) has ", x.shape[1],
                   " channels, not divisible by groups = ", win.groups);
  }
  Shape w = {g.shape[1], x.shape[1] / win.groups};
  w.insert(w.end(), kernel.begin(), kernel.end());
  RETURN_IF_ERROR(ops_internal::CheckConvGroups(x.shape[1], w, win.groups,
                                                "input 1 (x)"));
  ASSIGN_OR_RETURN(Shape y, WindowShape(x.shape, g.shape[1], win));
  RETURN_IF_ERROR(ExpectShape(g, y, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, w, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (Empty(w)) return absl::OkStatus();
  if (Empty(y) || Empty(x.shape)) {
    std::memset(ctx.output.data, 0, ctx.output.bytes());
    return absl::OkStatus();
  }
  const std::string key =
      absl::StrCat("conv_bwd_weights:", DimsKey(Dims(x.shape)), ":",
                   DimsKey(Dims(w)), ":", WindowKey(win));
  const CachedPrimitive& p = GetPrimitive(key, [&] {
    auto hint = ForwardPd(x.shape, w, y, win, false);
    const dnnl::convolution_backward_weights::desc desc(
        dnnl::algorithm::convolution_direct, AnyDesc(x.shape),
        AnyDesc(WeightShape(w, win)), AnyDesc(y), Dims(win.stride),
        Dilates(win), Dims(win.padding), Dims(win.padding));
    dnnl::convolution_backward_weights::primitive_desc pd(desc, DefaultAttr(),
                                                          Engine(), hint);
    CachedPrimitive c = Cached(pd);
    AddRelayout(c, DNNL_ARG_DIFF_DST, PlainDesc(y), pd.diff_dst_desc(),
                false);
    AddRelayout(c, DNNL_ARG_SRC, PlainDesc(x.shape), pd.src_desc(), false);
    AddRelayout(c, DNNL_ARG_DIFF_WEIGHTS, PlainDesc(WeightShape(w, win)),
                pd.diff_weights_desc(), true);
    return c;
  });
  Execute(p, {{DNNL_ARG_DIFF_DST, Wrap(PlainDesc(y), g.data)},
              {DNNL_ARG_SRC, Wrap(PlainDesc(x.shape), x.data)},
              {DNNL_ARG_DIFF_WEIGHTS,
               Wrap(PlainDesc(WeightShape(w, win)), ctx.output.data)}});
  return absl::OkStatus();
}

// conv{2,3}d_backward_bias (g) -> (O): the sum over N and the spatial dims.
absl::Status ConvBackwardBias(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const int d = ConvDims(ctx);
  const TensorView& g = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectRank(g, d + 2, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, {g.shape[1]}, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (g.shape[1] == 0) return absl::OkStatus();
  const int64_t inner = ops_internal::Product(g.shape, 2, d + 2);
  ChannelSums(g.as<float>(), g.shape[0], g.shape[1], inner,
              ctx.output.as<float>());
  return absl::OkStatus();
}

namespace {

// A row-major matrix product dst (batch, m, n) = scale * src (batch, m, k)
// . weights (batch, k, n), each operand given by its dims and strides
// (a transposed operand is a strided view), optionally plus bias (1, n).
struct MatmulShape {
  int64_t batch = 1, m = 0, k = 0, n = 0;
  bool transpose_src = false, transpose_weights = false;
  bool bias = false;
  float scale = 1.0f;
};

dnnl::memory::desc MatrixDesc(int64_t batch, int64_t rows, int64_t cols,
                              bool transposed) {
  // Logical (batch, rows, cols); stored (rows, cols) or, transposed,
  // (cols, rows) per batch element.
  const dnnl::memory::dims strides =
      transposed ? dnnl::memory::dims{rows * cols, 1, rows}
                 : dnnl::memory::dims{rows * cols, cols, 1};
  return dnnl::memory::desc({batch, rows, cols}, dt::f32, strides);
}

void RunMatmul(const MatmulShape& s, const void* src, const void* weights,
               const void* bias, void* dst) {
  const dnnl::memory::desc src_md =
      MatrixDesc(s.batch, s.m, s.k, s.transpose_src);
  const dnnl::memory::desc weights_md =
      MatrixDesc(s.batch, s.k, s.n, s.transpose_weights);
  const dnnl::memory::desc dst_md = MatrixDesc(s.batch, s.m, s.n, false);
  const dnnl::memory::desc bias_md =
      s.bias ? dnnl::memory::desc({1, 1, s.n}, dt::f32, tag::abc)
             : dnnl::memory::desc();
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &s.scale, 4);
  const std::string key =
      absl::StrCat("matmul:", s.batch, "x", s.m, "x", s.k, "x", s.n, ":",
                   s.transpose_src, s.transpose_weights, s.bias, ":",
                   scale_bits);
  const CachedPrimitive& p = GetPrimitive(key, [&] {
    dnnl::primitive_attr attr = DefaultAttr();
    if (s.scale != 1.0f) attr.set_output_scales(0, {s.scale});
    const dnnl::matmul::desc desc(src_md, weights_md, bias_md, dst_md);
    dnnl::matmul::primitive_desc pd(desc, attr, Engine());
    return Cached(pd);
  });
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, Wrap(src_md, src)},
      {DNNL_ARG_WEIGHTS, Wrap(weights_md, weights)},
      {DNNL_ARG_DST, Wrap(dst_md, dst)}};
  if (s.bias) args.emplace(DNNL_ARG_BIAS, Wrap(bias_md, bias));
  Execute(p, std::move(args));
}

// dst (rows, cols) = bias per column, or zero: a product over k = 0.
void FillRows(float* dst, int64_t rows, int64_t cols, const float* bias) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      dst[i * cols + j] = bias != nullptr ? bias[j] : 0.0f;
    }
  }
}

Shape Leading(const Shape& s) { return Shape(s.begin(), s.end() - 1); }

}  // namespace

// linear (x (..., in), weight (out, in)[, bias (out)]) = x W^T + b.
absl::Status Linear(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 3));
  const TensorView& x = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectF32(x, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectF32(w, "input 1 (weight)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  if (x.rank() < 1) return Invalid("input 0 (x) must have rank >= 1");
  RETURN_IF_ERROR(ExpectRank(w, 2, "input 1 (weight (out, in))"));
  if (x.shape.back() != w.shape[1]) {
    return Invalid("x ", ShapeToString(x.shape), " has ", x.shape.back(),
                   " features but the weight ", ShapeToString(w.shape),
                   " expects ", w.shape[1]);
  }
  const bool bias = ctx.inputs.size() == 3;
  if (bias) {
    RETURN_IF_ERROR(ExpectShape(ctx.inputs[2], {w.shape[0]}, "input 2 (bias)"));
    RETURN_IF_ERROR(ExpectF32(ctx.inputs[2], "input 2 (bias)"));
  }
  Shape y = Leading(x.shape);
  y.push_back(w.shape[0]);
  RETURN_IF_ERROR(ExpectShape(ctx.output, y, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  MatmulShape s;
  s.m = NumElements(Leading(x.shape));
  s.k = w.shape[1];
  s.n = w.shape[0];
  s.transpose_weights = true;  // W (out, in) read as (in, out)
  s.bias = bias;
  if (s.m == 0 || s.n == 0) return absl::OkStatus();
  const void* b = bias ? ctx.inputs[2].data : nullptr;
  if (s.k == 0) {
    FillRows(ctx.output.as<float>(), s.m, s.n, static_cast<const float*>(b));
    return absl::OkStatus();
  }
  RunMatmul(s, x.data, w.data, b, ctx.output.data);
  return absl::OkStatus();
}

// linear_backward_data (g (..., out), weight (out, in)) = g W, (..., in).
absl::Status LinearBackwardData(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& g = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(w, "input 1 (weight)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  if (g.rank() < 1) return Invalid("input 0 (grad) must have rank >= 1");
  RETURN_IF_ERROR(ExpectRank(w, 2, "input 1 (weight (out, in))"));
  if (g.shape.back() != w.shape[0]) {
    return Invalid("grad ", ShapeToString(g.shape), " does not match weight ",
                   ShapeToString(w.shape));
  }
  Shape dx = Leading(g.shape);
  dx.push_back(w.shape[1]);
  RETURN_IF_ERROR(ExpectShape(ctx.output, dx, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  MatmulShape s;
  s.m = NumElements(Leading(g.shape));
  s.k = w.shape[0];
  s.n = w.shape[1];
  if (s.m == 0 || s.n == 0) return absl::OkStatus();
  if (s.k == 0) {
    FillRows(ctx.output.as<float>(), s.m, s.n, nullptr);
    return absl::OkStatus();
  }
  RunMatmul(s, g.data, w.data, nullptr, ctx.output.data);
  return absl::OkStatus();
}

// linear_backward_weight (g (..., out), x (..., in)) = g^T x over the
// flattened leading dims, (out, in).
absl::Status LinearBackwardWeight(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(x, "input 1 (x)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  if (g.rank() < 1 || x.rank() < 1 || Leading(g.shape) != Leading(x.shape)) {
    return Invalid("grad ", ShapeToString(g.shape), " and x ",
                   ShapeToString(x.shape), " differ in their leading dims");
  }
  RETURN_IF_ERROR(
      ExpectShape(ctx.output, {g.shape.back(), x.shape.back()}, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  MatmulShape s;
  s.m = g.shape.back();
  s.k = NumElements(Leading(g.shape));
  s.n = x.shape.back();
  s.transpose_src = true;  // g (M, out) read as (out, M)
  if (s.m == 0 || s.n == 0) return absl::OkStatus();
  if (s.k == 0) {
    FillRows(ctx.output.as<float>(), s.m, s.n, nullptr);
    return absl::OkStatus();
  }
  RunMatmul(s, g.data, x.data, nullptr, ctx.output.data);
  return absl::OkStatus();
}

// linear_backward_bias (g (..., out)) -> (out): the sum over leading dims.
absl::Status LinearBackwardBias(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& g = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  if (g.rank() < 1) return Invalid("input 0 (grad) must have rank >= 1");
  RETURN_IF_ERROR(ExpectShape(ctx.output, {g.shape.back()}, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (g.shape.back() == 0) return absl::OkStatus();
  ChannelSums(g.as<float>(), NumElements(Leading(g.shape)), g.shape.back(), 1,
              ctx.output.as<float>());
  return absl::OkStatus();
}

// matmul (a, b), attrs transpose_a, transpose_b, scale: scale op(a) op(b)
// over equal batch dims.
absl::Status Matmul(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& a = ctx.inputs[0];
  const TensorView& b = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectF32(a, "input 0 (a)"));
  RETURN_IF_ERROR(ExpectF32(b, "input 1 (b)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  ASSIGN_OR_RETURN(bool ta, ops_internal::BoolAttr(ctx.attrs(), "transpose_a",
                                                   false));
  ASSIGN_OR_RETURN(bool tb, ops_internal::BoolAttr(ctx.attrs(), "transpose_b",
                                                   false));
  ASSIGN_OR_RETURN(double scale,
                   ops_internal::DoubleAttr(ctx.attrs(), "scale", 1.0));
  const int r = a.rank();
  if (r < 2 || b.rank() != r ||
      !std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin())) {
    return Invalid("a ", ShapeToString(a.shape), " and b ",
                   ShapeToString(b.shape),
                   " must have rank >= 2 and the same batch dims");
  }
  MatmulShape s;
  s.batch = ops_internal::Product(a.shape, 0, r - 2);
  s.m = ta ? a.shape[r - 1] : a.shape[r - 2];
  s.k = ta ? a.shape[r - 2] : a.shape[r - 1];
  const int64_t kb = tb ? b.shape[r - 1] : b.shape[r - 2];
  s.n = tb ? b.shape[r - 2] : b.shape[r - 1];
  if (s.k != kb) {
    return Invalid("inner dims differ: a ", ShapeToString(a.shape),
                   ta ? " (transposed)" : "", " and b ",
                   ShapeToString(b.shape), tb ? " (transposed)" : "");
  }
  Shape y(a.shape.begin(), a.shape.end() - 2);
  y.push_back(s.m);
  y.push_back(s.n);
  RETURN_IF_ERROR(ExpectShape(ctx.output, y, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  s.transpose_src = ta;
  s.transpose_weights = tb;
  s.scale = static_cast<float>(scale);
  if (NumElements(y) == 0) return absl::OkStatus();
  if (s.k == 0) {
    FillRows(ctx.output.as<float>(), s.batch * s.m, s.n, nullptr);
    return absl::OkStatus();
  }
  RunMatmul(s, a.data, b.data, nullptr, ctx.output.data);
  return absl::OkStatus();
}

}  // namespace pebble::dnnl_internal
