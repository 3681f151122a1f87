// Max and average pooling over 2 or 3 spatial dims (oneDNN pooling
// primitives), and the max-pooling gradient (own loop: it recomputes each
// window's argmax from x, as docs/operators.md says, with PyTorch's rule).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/cpu/dnnl_util.h"
#include "runtime/cpu/parallel.h"

namespace pebble::dnnl_internal {
namespace {

absl::StatusOr<int> PoolDims(const Shape& x, absl::string_view what) {
  if (x.size() != 4 && x.size() != 5) {
    return Invalid(what, " must be (N, C, H, W) or (N, C, D, H, W), got ",
                   ShapeToString(x));
  }
  return static_cast<int>(x.size()) - 2;
}

std::string PoolKey(absl::string_view kind, const Shape& x,
                    const Window& w) {
  return absl::StrCat(kind, ":", DimsKey(Dims(x)), ":k", DimsKey(w.kernel),
                      "s", DimsKey(w.stride), "p", DimsKey(w.padding), "c",
                      w.ceil_mode);
}

// The right padding that makes oneDNN produce y: the window's padding,
// or in ceil mode as much more as the last window reaches past the input
// (oneDNN's max pooling ignores padded positions, as PyTorch's does).
dnnl::memory::dims RightPadding(const Shape& x, const Shape& y,
                                const Window& w) {
  dnnl::memory::dims right = Dims(w.padding);
  for (size_t i = 0; i < w.kernel.size(); ++i) {
    const int64_t reach = (y[2 + i] - 1) * w.stride[i] + w.kernel[i] -
                          x[2 + i] - w.padding[i];
    right[i] = std::max<int64_t>(right[i], reach);
  }
  return right;
}

dnnl::pooling_forward::primitive_desc PoolForwardPd(dnnl::algorithm alg,
                                                    const Shape& x,
                                                    const Shape& y,
                                                    const Window& w) {
  const dnnl::pooling_forward::desc desc(
      dnnl::prop_kind::forward_training, alg, PlainDesc(x), PlainDesc(y),
      Dims(w.stride), Dims(w.kernel), Dims(w.padding), RightPadding(x, y, w));
  return dnnl::pooling_forward::primitive_desc(desc, DefaultAttr(), Engine());
}

// maxpool / avgpool (x): oneDNN forward pooling.
absl::Status PoolForward(const KernelContext& ctx, dnnl::algorithm alg,
                         absl::string_view kind) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectF32(x, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  ASSIGN_OR_RETURN(int d, PoolDims(x.shape, "input 0 (x)"));
  ASSIGN_OR_RETURN(Window w, PoolWindow(ctx.attrs(), d));
  if (w.ceil_mode && alg == dnnl::algorithm::pooling_avg_include_padding) {
    return Invalid("attr 'ceil_mode' of avgpool needs count_include_pad false");
  }
  ASSIGN_OR_RETURN(Shape y, WindowShape(x.shape, x.shape[1], w));
  RETURN_IF_ERROR(ExpectShape(ctx.output, y, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (NumElements(y) == 0) return absl::OkStatus();
  const CachedPrimitive& p = GetPrimitive(PoolKey(kind, x.shape, w), [&] {
    // Inference: maxpool_backward finds the argmax again in x, so no
    // workspace of indices is kept.
    const dnnl::pooling_forward::desc desc(
        dnnl::prop_kind::forward_inference, alg, PlainDesc(x.shape),
        PlainDesc(y), Dims(w.stride), Dims(w.kernel), Dims(w.padding),
        RightPadding(x.shape, y, w));
    dnnl::pooling_forward::primitive_desc pd(desc, DefaultAttr(), Engine());
    return Cached(pd);
  });
  Execute(p, {{DNNL_ARG_SRC, Wrap(PlainDesc(x.shape), x.data)},
              {DNNL_ARG_DST, Wrap(PlainDesc(y), ctx.output.data)}});
  return absl::OkStatus();
}

// Extents of a pooling problem as 3-D (2-D pooling has D = 1, kD = 1).
struct Extents3 {
  int64_t in[3], out[3], k[3], s[3], p[3];
};

Extents3 ToExtents3(const Shape& x, const Shape& y, const Window& w) {
  Extents3 e;
  const int d = static_cast<int>(w.kernel.size());
  const int shift = 3 - d;
  for (int i = 0; i < 3; ++i) {
    if (i < shift) {
      e.in[i] = e.out[i] = e.k[i] = e.s[i] = 1;
      e.p[i] = 0;
    } else {
      e.in[i] = x[2 + i - shift];
      e.out[i] = y[2 + i - shift];
      e.k[i] = w.kernel[i - shift];
      e.s[i] = w.stride[i - shift];
      e.p[i] = w.padding[i - shift];
    }
  }
  return e;
}

}  // namespace

absl::Status MaxPool(const KernelContext& ctx) {
  return PoolForward(ctx, dnnl::algorithm::pooling_max, "maxpool");
}

// avgpool: PyTorch's AvgPool default count_include_pad=True. In floor mode
// with padding <= kernel / 2 every window lies inside the padded input, so
// PyTorch's divisor is the full kernel size: oneDNN's
// pooling_avg_include_padding. With count_include_pad false (floor or ceil
// mode) the divisor is the window's elements within the input, oneDNN's
// pooling_avg_exclude_padding.
absl::StatusOr<dnnl::algorithm> AvgPoolAlgorithm(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(bool counted, ops_internal::BoolAttr(ctx.attrs(), "count_include_pad", true));
  return counted ? dnnl::algorithm::pooling_avg_include_padding
                 : dnnl::algorithm::pooling_avg_exclude_padding;
}

absl::Status AvgPool(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(dnnl::algorithm alg, AvgPoolAlgorithm(ctx));
  return PoolForward(ctx, alg,
                     alg == dnnl::algorithm::pooling_avg_include_padding ? "avgpool"
                                                                         : "avgpool_excl");
}

// avgpool_backward (g), attrs kernel, stride, padding, ceil_mode,
// count_include_pad, input_shape.
absl::Status AvgPoolBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& g = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  ASSIGN_OR_RETURN(Shape x,
                   ops_internal::ShapeAttr(ctx.attrs(), "input_shape"));
  ASSIGN_OR_RETURN(int d, PoolDims(x, "attr 'input_shape'"));
  ASSIGN_OR_RETURN(Window w, PoolWindow(ctx.attrs(), d));
  ASSIGN_OR_RETURN(const dnnl::algorithm alg, AvgPoolAlgorithm(ctx));
  if (w.ceil_mode && alg == dnnl::algorithm::pooling_avg_include_padding) {
    return Invalid("attr 'ceil_mode' of avgpool needs count_include_pad false");
  }
  ASSIGN_OR_RETURN(Shape y, WindowShape(x, x[1], w));
  RETURN_IF_ERROR(ExpectShape(g, y, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, x, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (NumElements(x) == 0) return absl::OkStatus();
  if (NumElements(y) == 0) {
    std::memset(ctx.output.data, 0, ctx.output.bytes());
    return absl::OkStatus();
  }
  const bool counted = alg == dnnl::algorithm::pooling_avg_include_padding;
  const CachedPrimitive& p = GetPrimitive(
      PoolKey(counted ? "avgpool_bwd" : "avgpool_excl_bwd", x, w), [&] {
    auto hint = PoolForwardPd(alg, x, y, w);
    const dnnl::pooling_backward::desc desc(
        alg, PlainDesc(x), PlainDesc(y), Dims(w.stride), Dims(w.kernel),
        Dims(w.padding), RightPadding(x, y, w));
    dnnl::pooling_backward::primitive_desc pd(desc, DefaultAttr(), Engine(),
                                              hint);
    return Cached(pd);
  });
  Execute(p, {{DNNL_ARG_DIFF_DST, Wrap(PlainDesc(y), g.data)},
              {DNNL_ARG_DIFF_SRC, Wrap(PlainDesc(x), ctx.output.data)}});
  return absl::OkStatus();
}

// maxpool_backward (g, x), attrs kernel, stride, padding. For each window
// (in row-major output order) the gradient goes to the window's argmax in
// x, found as PyTorch's max_pool{2,3}d CPU kernels do: scanning the window
// row-major over its in-bounds elements, the maximum starts at -inf on the
// first element and moves on `v > max || isnan(v)` (so the first of equal
// maxima wins, and NaN propagates). Gradients of overlapping windows add up
// in output order, as PyTorch's backward does; each (n, c) plane is one
// sequential task, so the result does not depend on the thread count.
absl::Status MaxPoolBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& g = ctx.inputs[0];
  const TensorView& xv = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(xv, "input 1 (x)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  ASSIGN_OR_RETURN(int d, PoolDims(xv.shape, "input 1 (x)"));
  ASSIGN_OR_RETURN(Window w, PoolWindow(ctx.attrs(), d));
  ASSIGN_OR_RETURN(Shape y, WindowShape(xv.shape, xv.shape[1], w));
  RETURN_IF_ERROR(ExpectShape(g, y, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, xv.shape, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (ctx.output.num_elements() == 0) return absl::OkStatus();
  const Extents3 e = ToExtents3(xv.shape, y, w);
  const int64_t planes = xv.shape[0] * xv.shape[1];
  const int64_t in_plane = e.in[0] * e.in[1] * e.in[2];
  const int64_t out_plane = e.out[0] * e.out[1] * e.out[2];
  const float* x = xv.as<float>();
  const float* gy = g.as<float>();
  float* dx = ctx.output.as<float>();
  if (Probing()) return absl::OkStatus();  // a workspace probe discards the results
  cpu::ParallelRanges(planes, 1, [&](int64_t first_plane, int64_t end_plane) {
    for (int64_t plane = first_plane; plane < end_plane; ++plane) {
      const float* xp = x + plane * in_plane;
      const float* gp = gy + plane * out_plane;
      float* dp = dx + plane * in_plane;
      std::fill_n(dp, in_plane, 0.0f);
      int64_t o = 0;
      for (int64_t od = 0; od < e.out[0]; ++od) {
        const int64_t d0 = std::max<int64_t>(od * e.s[0] - e.p[0], 0);
        const int64_t d1 = std::min(od * e.s[0] - e.p[0] + e.k[0], e.in[0]);
        for (int64_t oh = 0; oh < e.out[1]; ++oh) {
          const int64_t h0 = std::max<int64_t>(oh * e.s[1] - e.p[1], 0);
          const int64_t h1 = std::min(oh * e.s[1] - e.p[1] + e.k[1], e.in[1]);
          for (int64_t ow = 0; ow < e.out[2]; ++ow, ++o) {
            const int64_t w0 = std::max<int64_t>(ow * e.s[2] - e.p[2], 0);
            const int64_t w1 = std::min(ow * e.s[2] - e.p[2] + e.k[2], e.in[2]);
            int64_t arg = (d0 * e.in[1] + h0) * e.in[2] + w0;
            float best = -std::numeric_limits<float>::infinity();
            for (int64_t id = d0; id < d1; ++id) {
              for (int64_t ih = h0; ih < h1; ++ih) {
                const int64_t row = (id * e.in[1] + ih) * e.in[2];
                for (int64_t iw = w0; iw < w1; ++iw) {
                  // Branch-free: on real data the comparison is
                  // unpredictable.
                  const float v = xp[row + iw];
                  const bool take = (v > best) | std::isnan(v);
                  best = take ? v : best;
                  arg = take ? row + iw : arg;
                }
              }
            }
            dp[arg] += gp[o];
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace pebble::dnnl_internal
