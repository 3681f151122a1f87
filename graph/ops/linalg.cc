// Matrix products and what attention is made of: linear, batched matmul,
// softmax, head splitting and merging, embedding look-ups.
//
// Note [Attention]. Multi-head attention is composed from ops of their own
// meaning (graph/models/transformer.cc):
//   qkv  = linear(x, c_attn)                        (B, S, 3 D)
//   q    = split_heads(qkv, heads=H, chunks=3, index=0)  (B, H, S, D/H)
//   k, v = ... index 1, 2
//   s    = matmul(q, k, transpose_b, scale=1/sqrt(D/H))  (B, H, S, S)
//   p    = softmax(s, causal)                        (B, H, S, S)
//   ctx  = merge_heads(matmul(p, v))                 (B, S, D)
// split_heads is torch's qkv.split(D, dim=2)[i].view(B, S, H, D/H)
// .transpose(1, 2) materialised; merge_heads is the inverse
// transpose(1, 2).reshape(B, S, D). The gradients of q, k and v are merged
// into the gradient of qkv by one merge_heads node (as PyTorch's
// SplitBackward concatenates its output gradients), not by a sum of three
// zero-padded tensors.
#include <algorithm>
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::ops_internal {
namespace {

Shape Leading(const Shape& s) { return Shape(s.begin(), s.end() - 1); }

// ---- linear: y = x W^T + b, x (..., in), W (out, in), b (out).

absl::StatusOr<TensorType> InferLinear(Inputs in, const Json&) {
  const TensorType& x = in[0];
  const TensorType& w = in[1];
  RETURN_IF_ERROR(ExpectFloat(x, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(x, 1, "input 0 (x)"));
  RETURN_IF_ERROR(ExpectRank(w, 2, "input 1 (weight (out, in))"));
  RETURN_IF_ERROR(ExpectSameDType(x, "x", w, "weight"));
  if (x.shape.back() != w.shape[1]) {
    return Invalid("x ", ShapeToString(x.shape), " has ", x.shape.back(),
                   " features but the weight ", ShapeToString(w.shape),
                   " expects ", w.shape[1]);
  }
  if (in.size() == 3) {
    RETURN_IF_ERROR(ExpectShape(in[2], {w.shape[0]}, "input 2 (bias)"));
    RETURN_IF_ERROR(ExpectSameDType(x, "x", in[2], "bias"));
  }
  Shape out = Leading(x.shape);
  out.push_back(w.shape[0]);
  return TensorType{out, x.dtype};
}

double LinearFlops(Inputs in, const TensorType& out, const Json&) {
  double f = 2.0 * Elements(out) * static_cast<double>(in[1].shape[1]);
  if (in.size() == 3) f += Elements(out);
  return f;
}

// linear_backward_data (grad, weight): grad W, (..., in).
absl::StatusOr<TensorType> InferLinearBackwardData(Inputs in, const Json&) {
  const TensorType& g = in[0];
  const TensorType& w = in[1];
  RETURN_IF_ERROR(ExpectFloat(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(g, 1, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRank(w, 2, "input 1 (weight)"));
  if (g.shape.back() != w.shape[0]) {
    return Invalid("grad ", ShapeToString(g.shape), " does not match weight ",
                   ShapeToString(w.shape));
  }
  Shape out = Leading(g.shape);
  out.push_back(w.shape[1]);
  return TensorType{out, g.dtype};
}

// linear_backward_weight (grad, x): grad^T x over the flattened leading dims.
absl::StatusOr<TensorType> InferLinearBackwardWeight(Inputs in, const Json&) {
  const TensorType& g = in[0];
  const TensorType& x = in[1];
  RETURN_IF_ERROR(ExpectFloat(g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(g, 1, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(x, 1, "input 1 (x)"));
  if (Leading(g.shape) != Leading(x.shape)) {
    return Invalid("grad ", ShapeToString(g.shape), " and x ",
                   ShapeToString(x.shape), " differ in their leading dims");
  }
  return TensorType{{g.shape.back(), x.shape.back()}, g.dtype};
}

double LinearGradFlops(Inputs in, const TensorType& out, const Json&) {
  // Data: 2 * numel(grad) * in; weight: 2 * numel(grad) * in as well.
  return 2.0 * Elements(in[0]) * static_cast<double>(out.shape.back());
}

// linear_backward_bias (grad): the sum over every dim but the last.
absl::StatusOr<TensorType> InferLastDimSum(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(in[0], 1, "input 0 (grad)"));
  return TensorType{{in[0].shape.back()}, in[0].dtype};
}

double InputFlops(Inputs in, const TensorType&, const Json&) {
  return Elements(in[0]);
}

absl::Status LinearBackward(BackwardContext& ctx) {
  const Value g = ctx.grad_output();
  if (ctx.needs_grad(0)) {
    ctx.AccumulateGrad(0, ctx.Emit("linear_backward_data", {g, ctx.input(1)}));
  }
  if (ctx.needs_grad(1)) {
    ctx.AccumulateGrad(1,
                       ctx.Emit("linear_backward_weight", {g, ctx.input(0)}));
  }
  if (ctx.num_inputs() == 3 && ctx.needs_grad(2)) {
    ctx.AccumulateGrad(2, ctx.Emit("linear_backward_bias", {g}));
  }
  return absl::OkStatus();
}

// ---- matmul: y = scale * op(a) op(b) over equal batch dims, op(t) = t or
// t^T on the last two dims.

struct MatmulAttrs {
  bool ta = false, tb = false;
  double scale = 1;
};

absl::StatusOr<MatmulAttrs> ParseMatmul(const Json& attrs) {
  MatmulAttrs m;
  ASSIGN_OR_RETURN(m.ta, BoolAttr(attrs, "transpose_a", false));
  ASSIGN_OR_RETURN(m.tb, BoolAttr(attrs, "transpose_b", false));
  ASSIGN_OR_RETURN(m.scale, DoubleAttr(attrs, "scale", 1.0));
  return m;
}

Json MatmulJson(bool ta, bool tb, double scale) {
  Json j = Json::object();
  if (ta) j["transpose_a"] = true;
  if (tb) j["transpose_b"] = true;
  if (scale != 1) j["scale"] = scale;
  return j;
}

absl::StatusOr<TensorType> InferMatmul(Inputs in, const Json& attrs) {
  const TensorType& a = in[0];
  const TensorType& b = in[1];
  RETURN_IF_ERROR(ExpectFloat(a, "input 0 (a)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(a, 2, "input 0 (a)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(b, 2, "input 1 (b)"));
  RETURN_IF_ERROR(ExpectSameDType(a, "a", b, "b"));
  ASSIGN_OR_RETURN(MatmulAttrs m, ParseMatmul(attrs));
  const size_t r = a.shape.size();
  if (b.shape.size() != r ||
      !std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin())) {
    return Invalid("a ", ShapeToString(a.shape), " and b ",
                   ShapeToString(b.shape),
                   " must have the same rank and batch dims");
  }
  const int64_t rows = m.ta ? a.shape[r - 1] : a.shape[r - 2];
  const int64_t ka = m.ta ? a.shape[r - 2] : a.shape[r - 1];
  const int64_t kb = m.tb ? b.shape[r - 1] : b.shape[r - 2];
  const int64_t cols = m.tb ? b.shape[r - 2] : b.shape[r - 1];
  if (ka != kb) {
    return Invalid("inner dims differ: a ", ShapeToString(a.shape),
                   m.ta ? " (transposed)" : "", " and b ",
                   ShapeToString(b.shape), m.tb ? " (transposed)" : "");
  }
  Shape out(a.shape.begin(), a.shape.end() - 2);
  out.push_back(rows);
  out.push_back(cols);
  return TensorType{out, a.dtype};
}

double MatmulFlops(Inputs in, const TensorType& out, const Json& attrs) {
  absl::StatusOr<MatmulAttrs> m = ParseMatmul(attrs);
  const Shape& a = in[0].shape;
  const int64_t k = m.ok() && m->ta ? a[a.size() - 2] : a.back();
  return 2.0 * Elements(out) * static_cast<double>(k);
}

absl::Status MatmulBackward(BackwardContext& ctx) {
  ASSIGN_OR_RETURN(MatmulAttrs m, ParseMatmul(ctx.attrs()));
  const Value g = ctx.grad_output();
  const Value a = ctx.input(0);
  const Value b = ctx.input(1);
  // C = s op(A) op(B): dop(A) = s G op(B)^T, dop(B) = s op(A)^T G, and a
  // transposed operand takes the transpose of that.
  if (ctx.needs_grad(0)) {
    const Value da =
        m.ta ? ctx.Emit("matmul", {b, g}, MatmulJson(m.tb, true, m.scale))
             : ctx.Emit("matmul", {g, b}, MatmulJson(false, !m.tb, m.scale));
    ctx.AccumulateGrad(0, da);
  }
  if (ctx.needs_grad(1)) {
    const Value db =
        m.tb ? ctx.Emit("matmul", {g, a}, MatmulJson(true, m.ta, m.scale))
             : ctx.Emit("matmul", {a, g}, MatmulJson(!m.ta, false, m.scale));
    ctx.AccumulateGrad(1, db);
  }
  return absl::OkStatus();
}

// ---- softmax over the last dim; causal masks key j > query i of the last
// two dims (PyTorch's is_causal, top-left aligned).

absl::StatusOr<TensorType> InferSoftmax(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  RETURN_IF_ERROR(ExpectRankAtLeast(in[0], 1, "input 0 (x)"));
  ASSIGN_OR_RETURN(bool causal, BoolAttr(attrs, "causal", false));
  if (causal) RETURN_IF_ERROR(ExpectRankAtLeast(in[0], 2, "causal input 0"));
  if (in.size() == 2) {  // softmax_backward (grad, y)
    RETURN_IF_ERROR(ExpectSameShape(in[0], "grad", in[1], "y"));
    RETURN_IF_ERROR(ExpectSameDType(in[0], "grad", in[1], "y"));
  }
  return in[0];
}

// log_softmax (x) and log_softmax_backward (grad, y): over the last dim,
// with no causal mask (nothing imports one).
absl::StatusOr<TensorType> InferLogSoftmax(Inputs in, const Json& attrs) {
  if (attrs.contains("causal")) {
    return absl::InvalidArgumentError("log_softmax takes no attr 'causal'");
  }
  return InferSoftmax(in, attrs);
}

absl::Status LogSoftmaxBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  // dx = g - exp(y) * sum(g), as ATen's _log_softmax_backward_data: reads
  // the output, not the input.
  ctx.AccumulateGrad(0, ctx.Emit("log_softmax_backward",
                                 {ctx.grad_output(), ctx.output()}, Json::object()));
  return absl::OkStatus();
}

absl::Status SoftmaxBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ASSIGN_OR_RETURN(bool causal, BoolAttr(ctx.attrs(), "causal", false));
  Json attrs = Json::object();
  if (causal) attrs["causal"] = true;
  // dx = y * (g - sum(g * y)): reads the output, not the input.
  ctx.AccumulateGrad(0, ctx.Emit("softmax_backward",
                                 {ctx.grad_output(), ctx.output()}, attrs));
  return absl::OkStatus();
}

// ---- Heads.

struct Split {
  int64_t heads = 1, chunks = 1, index = 0;
};

absl::StatusOr<Split> ParseSplit(const Json& attrs, bool need_heads) {
  Split s;
  if (need_heads) {
    ASSIGN_OR_RETURN(s.heads, RequiredIntAttr(attrs, "heads"));
    if (s.heads < 1) return Invalid("attr 'heads' must be >= 1");
  }
  ASSIGN_OR_RETURN(s.chunks, IntAttr(attrs, "chunks", 1));
  ASSIGN_OR_RETURN(s.index, IntAttr(attrs, "index", 0));
  if (s.chunks < 1) return Invalid("attr 'chunks' must be >= 1");
  if (s.index < 0 || s.index >= s.chunks) {
    return Invalid("attr 'index' = ", s.index, " must be in [0, ", s.chunks,
                   ")");
  }
  return s;
}

// split_heads (x (B, S, C)), attrs heads, chunks, index -> (B, H, S, Dh),
// Dh = C / (chunks H): part `index` of the last dim, as heads.
absl::StatusOr<TensorType> InferSplitHeads(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  RETURN_IF_ERROR(ExpectRank(in[0], 3, "input 0 (x (B, S, C))"));
  ASSIGN_OR_RETURN(Split s, ParseSplit(attrs, true));
  const Shape& x = in[0].shape;
  int64_t parts = 0;
  if (__builtin_mul_overflow(s.chunks, s.heads, &parts)) {
    return Invalid("attrs 'chunks' ", s.chunks, " x 'heads' ", s.heads, " overflow 64 bits");
  }
  if (x[2] % parts != 0) {
    return Invalid("the last dim ", x[2], " of ", ShapeToString(x),
                   " does not split into ", s.chunks, " x ", s.heads,
                   " heads");
  }
  return TensorType{{x[0], s.heads, x[1], x[2] / (s.chunks * s.heads)},
                    in[0].dtype};
}

absl::Status SplitHeadsBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ASSIGN_OR_RETURN(Split s, ParseSplit(ctx.attrs(), true));
  if (s.chunks == 1) {
    ctx.AccumulateGrad(0, ctx.Emit("merge_heads", {ctx.grad_output()}));
  } else {
    ctx.AccumulateGradPart(0, static_cast<int>(s.index),
                           static_cast<int>(s.chunks), ctx.grad_output(),
                           "merge_heads", "split_heads_backward");
  }
  return absl::OkStatus();
}

// merge_heads (x_1..x_n, each (B, H, S, Dh)) -> (B, S, n H Dh): each input
// transposed to (B, S, H, Dh), flattened and concatenated on the last dim.
absl::StatusOr<TensorType> InferMergeHeads(Inputs in, const Json&) {
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string what = absl::StrCat("input ", i, " (B, H, S, Dh)");
    RETURN_IF_ERROR(ExpectFloat(in[i], what));
    RETURN_IF_ERROR(ExpectRank(in[i], 4, what));
    RETURN_IF_ERROR(ExpectSameShape(in[0], "input 0", in[i], what));
    RETURN_IF_ERROR(ExpectSameDType(in[0], "input 0", in[i], what));
  }
  const Shape& x = in[0].shape;
  return TensorType{
      {x[0], x[2], static_cast<int64_t>(in.size()) * x[1] * x[3]},
      in[0].dtype};
}

absl::Status MergeHeadsBackward(BackwardContext& ctx) {
  const int n = ctx.num_inputs();
  for (int i = 0; i < n; ++i) {
    if (!ctx.needs_grad(i)) continue;
    ctx.AccumulateGrad(
        i, ctx.Emit("split_heads", {ctx.grad_output()},
                    {{"heads", ctx.input_type(i).shape[1]},
                     {"chunks", n},
                     {"index", i}}));
  }
  return absl::OkStatus();
}

// split_heads_backward (grad (B, H, S, Dh)), attrs chunks, index ->
// (B, S, chunks H Dh), zero outside part `index`.
absl::StatusOr<TensorType> InferSplitHeadsBackward(Inputs in,
                                                   const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectRank(in[0], 4, "input 0 (grad (B, H, S, Dh))"));
  ASSIGN_OR_RETURN(Split s, ParseSplit(attrs, false));
  const Shape& g = in[0].shape;
  int64_t width = 0;
  if (__builtin_mul_overflow(s.chunks, g[1], &width) ||
      __builtin_mul_overflow(width, g[3], &width)) {
    return Invalid("attr 'chunks' ", s.chunks, " x the heads and width of ", ShapeToString(g),
                   " overflow 64 bits");
  }
  return TensorType{{g[0], g[2], width}, in[0].dtype};
}

// ---- embedding: y[..., :] = weight[indices[...], :].

absl::StatusOr<TensorType> InferEmbedding(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kInt64, "input 0 (indices)"));
  RETURN_IF_ERROR(ExpectRank(in[1], 2, "input 1 (weight (num, dim))"));
  RETURN_IF_ERROR(ExpectFloat(in[1], "input 1 (weight)"));
  Shape out = in[0].shape;
  out.push_back(in[1].shape[1]);
  return TensorType{out, in[1].dtype};
}

absl::Status EmbeddingBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(1)) return absl::OkStatus();
  ctx.AccumulateGrad(
      1, ctx.Emit("embedding_backward", {ctx.grad_output(), ctx.input(0)},
                  {{"num_embeddings", ctx.input_type(1).shape[0]}}));
  return absl::OkStatus();
}

// embedding_backward (grad, indices), attr num_embeddings: scatter-add of
// the gradient rows into a zero (num, dim) tensor.
absl::StatusOr<TensorType> InferEmbeddingBackward(Inputs in,
                                                  const Json& attrs) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectDType(in[1], DType::kInt64, "input 1 (indices)"));
  ASSIGN_OR_RETURN(int64_t num, RequiredIntAttr(attrs, "num_embeddings"));
  if (num < 1) return Invalid("attr 'num_embeddings' must be >= 1");
  const Shape& g = in[0].shape;
  if (g.size() != in[1].shape.size() + 1 ||
      !std::equal(in[1].shape.begin(), in[1].shape.end(), g.begin())) {
    return Invalid("grad ", ShapeToString(g), " must be the indices' shape ",
                   ShapeToString(in[1].shape), " plus the embedding dim");
  }
  return TensorType{{num, g.back()}, in[0].dtype};
}

double EmbeddingBackwardFlops(Inputs in, const TensorType& out, const Json&) {
  return Elements(in[0]) + Elements(out);
}

// ---- arange: (n) i64 = 0, 1, ..., n - 1 (position ids).

absl::StatusOr<TensorType> InferArange(Inputs, const Json& attrs) {
  ASSIGN_OR_RETURN(int64_t n, RequiredIntAttr(attrs, "n"));
  if (n < 0) return Invalid("attr 'n' must be >= 0");
  return TensorType{{n}, DType::kInt64};
}

}  // namespace

void RegisterLinalgOps(std::vector<OpDef>& t) {
  t.push_back({.name = "linear", .min_inputs = 2, .max_inputs = 3,
               .infer = InferLinear, .flops = LinearFlops,
               .backward = LinearBackward});
  t.push_back({.name = "linear_backward_data", .min_inputs = 2,
               .max_inputs = 2, .infer = InferLinearBackwardData,
               .flops = LinearGradFlops});
  t.push_back({.name = "linear_backward_weight", .min_inputs = 2,
               .max_inputs = 2, .infer = InferLinearBackwardWeight,
               .flops = [](Inputs in, const TensorType& out, const Json&) {
                 return 2.0 * Elements(in[0]) *
                        static_cast<double>(out.shape[1]);
               }});
  t.push_back({.name = "linear_backward_bias", .min_inputs = 1,
               .max_inputs = 1, .infer = InferLastDimSum,
               .flops = InputFlops});
  t.push_back({.name = "matmul", .min_inputs = 2, .max_inputs = 2,
               .infer = InferMatmul, .flops = MatmulFlops,
               .backward = MatmulBackward});
  // max, subtract, exp, sum, divide; backward: multiply, sum, subtract,
  // multiply.
  t.push_back({.name = "softmax", .min_inputs = 1, .max_inputs = 1,
               .infer = InferSoftmax, .flops = PerElement(5),
               .backward = SoftmaxBackward});
  t.push_back({.name = "softmax_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferSoftmax, .flops = PerElement(4)});
  // max, subtract, exp, sum, log, subtract; backward: exp, sum, multiply,
  // subtract.
  t.push_back({.name = "log_softmax", .min_inputs = 1, .max_inputs = 1,
               .infer = InferLogSoftmax, .flops = PerElement(5),
               .backward = LogSoftmaxBackward});
  t.push_back({.name = "log_softmax_backward", .min_inputs = 2, .max_inputs = 2,
               .infer = InferLogSoftmax, .flops = PerElement(4)});
  t.push_back({.name = "split_heads", .min_inputs = 1, .max_inputs = 1,
               .infer = InferSplitHeads, .flops = CopyFlops,
               .backward = SplitHeadsBackward});
  t.push_back({.name = "merge_heads", .min_inputs = 1, .max_inputs = -1,
               .infer = InferMergeHeads, .flops = CopyFlops,
               .backward = MergeHeadsBackward});
  t.push_back({.name = "split_heads_backward", .min_inputs = 1,
               .max_inputs = 1, .infer = InferSplitHeadsBackward,
               .flops = CopyFlops});
  t.push_back({.name = "embedding", .min_inputs = 2, .max_inputs = 2,
               .infer = InferEmbedding, .flops = CopyFlops,
               .backward = EmbeddingBackward});
  t.push_back({.name = "embedding_backward", .min_inputs = 2,
               .max_inputs = 2, .infer = InferEmbeddingBackward,
               .flops = EmbeddingBackwardFlops});
  t.push_back({.name = "arange", .min_inputs = 0, .max_inputs = 0,
               .infer = InferArange, .flops = CopyFlops});
}

}  // namespace pebble::ops_internal
