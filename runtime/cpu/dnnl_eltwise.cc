// Activations and their gradients (oneDNN eltwise primitives over the
// tensor as one flat vector) and softmax and log-softmax over the last dim
// (oneDNN's primitives; softmax's causal mask is applied around them).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/cpu/dnnl_util.h"
#include "runtime/cpu/parallel.h"

namespace pebble::dnnl_internal {
namespace {

// The tensor as a flat vector (element-wise ops do not care about shape).
dnnl::memory::desc Flat(int64_t n) {
  return dnnl::memory::desc({n}, dt::f32, tag::a);
}

absl::StatusOr<dnnl::algorithm> GeluAlgorithm(const KernelContext& ctx) {
  const absl::StatusOr<std::string> mode =
      ops_internal::StringAttr(ctx.attrs(), "approximate", "none");
  if (!mode.ok()) return mode.status();
  if (*mode == "none") return dnnl::algorithm::eltwise_gelu_erf;
  if (*mode == "tanh") return dnnl::algorithm::eltwise_gelu_tanh;
  return Invalid("attr 'approximate' must be \"none\" or \"tanh\", got \"",
                 *mode, "\"");
}

// y = f(x), any shape.
absl::Status EltwiseForward(const KernelContext& ctx, dnnl::algorithm alg) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectF32(x, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, x.shape, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  const int64_t n = x.num_elements();
  if (n == 0) return absl::OkStatus();
  const std::string key =
      absl::StrCat("eltwise_fwd:", static_cast<int>(alg), ":", n);
  const CachedPrimitive& p = GetPrimitive(key, [&] {
    const dnnl::eltwise_forward::desc desc(dnnl::prop_kind::forward_training,
                                           alg, Flat(n), 0.0f, 0.0f);
    dnnl::eltwise_forward::primitive_desc pd(desc, DefaultAttr(), Engine());
    return Cached(pd);
  });
  Execute(p, {{DNNL_ARG_SRC, Wrap(Flat(n), x.data)},
              {DNNL_ARG_DST, Wrap(Flat(n), ctx.output.data)}});
  return absl::OkStatus();
}

// A backward's (grad, saved) into its gradient, all fp32 of one shape.
absl::Status ExpectBackwardOperands(const KernelContext& ctx, const char* saved_name) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& g = ctx.inputs[0];
  const TensorView& saved = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectF32(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(saved, saved_name));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(saved, g.shape, saved_name));
  return ExpectShape(ctx.output, g.shape, "the output");
}

// dx = g * f'(saved), where `saved` (input 1) is y for the *_use_dst_for_bwd
// algorithms and x otherwise. `forward` is the forward algorithm (the hint).
absl::Status EltwiseBackward(const KernelContext& ctx, dnnl::algorithm alg,
                             dnnl::algorithm forward, bool saved_is_dst) {
  RETURN_IF_ERROR(ExpectBackwardOperands(ctx, "input 1 (saved tensor)"));
  const TensorView& g = ctx.inputs[0];
  const TensorView& saved = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectData(ctx));
  const int64_t n = g.num_elements();
  if (n == 0) return absl::OkStatus();
  const std::string key =
      absl::StrCat("eltwise_bwd:", static_cast<int>(alg), ":", n);
  const CachedPrimitive& p = GetPrimitive(key, [&] {
    const dnnl::eltwise_forward::desc hint_desc(
        dnnl::prop_kind::forward_training, forward, Flat(n), 0.0f, 0.0f);
    dnnl::eltwise_forward::primitive_desc hint(hint_desc, DefaultAttr(),
                                               Engine());
    const dnnl::eltwise_backward::desc desc(alg, Flat(n), Flat(n), 0.0f,
                                            0.0f);
    dnnl::eltwise_backward::primitive_desc pd(desc, DefaultAttr(), Engine(),
                                              hint);
    return Cached(pd);
  });
  Execute(p, {{DNNL_ARG_DIFF_DST, Wrap(Flat(n), g.data)},
              {saved_is_dst ? DNNL_ARG_DST : DNNL_ARG_SRC,
               Wrap(Flat(n), saved.data)},
              {DNNL_ARG_DIFF_SRC, Wrap(Flat(n), ctx.output.data)}});
  return absl::OkStatus();
}

// (rows, last) view of a tensor for softmax over its last dim.
struct Rows {
  int64_t rows = 0, cols = 0;
  int64_t queries = 1;  // the second-to-last dim (causal masking)
};

absl::StatusOr<Rows> SoftmaxRows(const TensorView& t, bool causal) {
  if (t.rank() < 1) return Invalid("input 0 must have rank >= 1");
  if (causal && t.rank() < 2) {
    return Invalid("causal softmax needs rank >= 2, got ",
                   ShapeToString(t.shape));
  }
  Rows r;
  r.cols = t.shape.back();
  r.rows = r.cols == 0 ? 0 : t.num_elements() / r.cols;
  if (causal) r.queries = t.shape[t.rank() - 2];
  return r;
}

// Runs `fn(row, first_masked_column)` for each row of a causal softmax:
// query i = row % queries keeps keys j <= i (top-left aligned).
template <typename Fn>
void ForEachCausalRow(const Rows& r, Fn fn) {
  if (Probing()) return;  // a workspace probe discards the results
  cpu::ParallelRanges(r.rows, 64, [&](int64_t first_row, int64_t end_row) {
    for (int64_t row = first_row; row < end_row; ++row) {
      const int64_t i = row % r.queries;
      fn(row, std::min(i + 1, r.cols));
    }
  });
}

dnnl::memory::desc RowsDesc(const Rows& r) {
  return dnnl::memory::desc({r.rows, r.cols}, dt::f32, tag::ab);
}

// softmax and log_softmax: oneDNN's primitives of each (2.x has one per
// kind), over dim 1 of (rows, cols).
template <typename Forward, typename Backward>
struct SoftmaxKind {
  using ForwardPd = typename Forward::primitive_desc;
  static ForwardPd ForwardPdOf(const Rows& r) {
    const typename Forward::desc desc(dnnl::prop_kind::forward_training, RowsDesc(r), 1);
    return ForwardPd(desc, DefaultAttr(), Engine());
  }
  static typename Backward::primitive_desc BackwardPdOf(const Rows& r) {
    const typename Backward::desc desc(RowsDesc(r), RowsDesc(r), 1);
    return typename Backward::primitive_desc(desc, DefaultAttr(), Engine(), ForwardPdOf(r));
  }
};
using PlainSoftmax = SoftmaxKind<dnnl::softmax_forward, dnnl::softmax_backward>;
using LogSoftmaxKind = SoftmaxKind<dnnl::logsoftmax_forward, dnnl::logsoftmax_backward>;

// The output = kind's softmax of `src` (x's rows) over the last dim; the
// primitive is cached by `name` and shape.
template <typename Kind>
absl::Status RunSoftmaxForward(const KernelContext& ctx, const Rows& r, const char* name,
                               const void* src) {
  const std::string key = absl::StrCat(name, "_fwd:", r.rows, "x", r.cols);
  const CachedPrimitive& p = GetPrimitive(key, [&] { return Cached(Kind::ForwardPdOf(r)); });
  Execute(p, {{DNNL_ARG_SRC, Wrap(RowsDesc(r), src)},
              {DNNL_ARG_DST, Wrap(RowsDesc(r), ctx.output.data)}});
  return absl::OkStatus();
}

// softmax_backward or log_softmax_backward (g, y) over the last dim.
template <typename Kind>
absl::Status RunSoftmaxBackward(const KernelContext& ctx, const Rows& r, const char* name) {
  const TensorView& g = ctx.inputs[0];
  const TensorView& y = ctx.inputs[1];
  const std::string key = absl::StrCat(name, "_bwd:", r.rows, "x", r.cols);
  const CachedPrimitive& p = GetPrimitive(key, [&] { return Cached(Kind::BackwardPdOf(r)); });
  Execute(p, {{DNNL_ARG_DIFF_DST, Wrap(RowsDesc(r), g.data)},
              {DNNL_ARG_DST, Wrap(RowsDesc(r), y.data)},
              {DNNL_ARG_DIFF_SRC, Wrap(RowsDesc(r), ctx.output.data)}});
  return absl::OkStatus();
}

// The rows of softmax's or log_softmax's (x) after checking its tensors;
// `causal` is read where the op takes it.
absl::StatusOr<Rows> SoftmaxForwardRows(const KernelContext& ctx, bool* causal) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectF32(x, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, x.shape, "the output"));
  if (causal != nullptr) {
    ASSIGN_OR_RETURN(*causal, ops_internal::BoolAttr(ctx.attrs(), "causal", false));
  }
  ASSIGN_OR_RETURN(Rows r, SoftmaxRows(x, causal != nullptr && *causal));
  RETURN_IF_ERROR(ExpectData(ctx));
  return r;
}

// The rows of a softmax's or log_softmax's backward (g, y).
absl::StatusOr<Rows> SoftmaxBackwardRows(const KernelContext& ctx, bool causal) {
  RETURN_IF_ERROR(ExpectBackwardOperands(ctx, "input 1 (y)"));
  ASSIGN_OR_RETURN(Rows r, SoftmaxRows(ctx.inputs[0], causal));
  RETURN_IF_ERROR(ExpectData(ctx));
  return r;
}

}  // namespace

absl::Status Tanh(const KernelContext& ctx) {
  return EltwiseForward(ctx, dnnl::algorithm::eltwise_tanh);
}
absl::Status Sigmoid(const KernelContext& ctx) {
  return EltwiseForward(ctx, dnnl::algorithm::eltwise_logistic);
}
absl::Status Gelu(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(dnnl::algorithm alg, GeluAlgorithm(ctx));
  return EltwiseForward(ctx, alg);
}

// tanh_backward (g, y): g (1 - y^2).
absl::Status TanhBackward(const KernelContext& ctx) {
  return EltwiseBackward(ctx, dnnl::algorithm::eltwise_tanh_use_dst_for_bwd,
                         dnnl::algorithm::eltwise_tanh_use_dst_for_bwd, true);
}
// sigmoid_backward (g, y): g y (1 - y).
absl::Status SigmoidBackward(const KernelContext& ctx) {
  return EltwiseBackward(ctx,
                         dnnl::algorithm::eltwise_logistic_use_dst_for_bwd,
                         dnnl::algorithm::eltwise_logistic_use_dst_for_bwd,
                         true);
}
// gelu_backward (g, x), attr approximate.
absl::Status GeluBackward(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(dnnl::algorithm alg, GeluAlgorithm(ctx));
  return EltwiseBackward(ctx, alg, alg, false);
}

// softmax (x), attr causal: over the last dim. Causal: key j > query i of
// the last two dims is masked (its probability is exactly 0): the kept
// scores are copied into the output with -inf in the masked places, oneDNN's
// softmax runs in place, and the masked places are set to 0 again.
absl::Status Softmax(const KernelContext& ctx) {
  bool causal = false;
  ASSIGN_OR_RETURN(const Rows r, SoftmaxForwardRows(ctx, &causal));
  if (r.rows == 0) return absl::OkStatus();
  const TensorView& x = ctx.inputs[0];
  float* y = ctx.output.as<float>();
  const void* src = x.data;
  if (causal) {
    const float* xs = x.as<float>();
    ForEachCausalRow(r, [&](int64_t row, int64_t keep) {
      std::memcpy(y + row * r.cols, xs + row * r.cols, keep * sizeof(float));
      std::fill(y + row * r.cols + keep, y + (row + 1) * r.cols,
                -std::numeric_limits<float>::infinity());
    });
    src = y;
  }
  RETURN_IF_ERROR(RunSoftmaxForward<PlainSoftmax>(ctx, r, "softmax", src));
  if (causal) {
    ForEachCausalRow(r, [&](int64_t row, int64_t keep) {
      std::fill(y + row * r.cols + keep, y + (row + 1) * r.cols, 0.0f);
    });
  }
  return absl::OkStatus();
}

// softmax_backward (g, y), attr causal: y (g - sum(g y)) over the last dim.
// Masked places have y = 0 and so get 0.
absl::Status SoftmaxBackward(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(bool causal, ops_internal::BoolAttr(ctx.attrs(), "causal", false));
  ASSIGN_OR_RETURN(const Rows r, SoftmaxBackwardRows(ctx, causal));
  if (r.rows == 0) return absl::OkStatus();
  return RunSoftmaxBackward<PlainSoftmax>(ctx, r, "softmax");
}

// log_softmax (x): x - max - log(sum(exp(x - max))) over the last dim.
absl::Status LogSoftmax(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(const Rows r, SoftmaxForwardRows(ctx, nullptr));
  if (r.rows == 0) return absl::OkStatus();
  return RunSoftmaxForward<LogSoftmaxKind>(ctx, r, "log_softmax", ctx.inputs[0].data);
}

// log_softmax_backward (g, y): g - exp(y) sum(g) over the last dim.
absl::Status LogSoftmaxBackward(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(const Rows r, SoftmaxBackwardRows(ctx, false));
  if (r.rows == 0) return absl::OkStatus();
  return RunSoftmaxBackward<LogSoftmaxKind>(ctx, r, "log_softmax");
}

}  // namespace pebble::dnnl_internal
