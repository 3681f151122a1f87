// Operators that only rearrange data: concat, slice, transpose, flatten,
// reshape. Each output is a tensor of its own (a copy), so the graph counts
// its bytes; PyTorch's view-returning flatten/reshape/permute are modelled
// as copies.
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "graph/autodiff.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::ops_internal {
namespace {

// ---- concat (x_1, ..., x_n), attr axis (default 1).

absl::StatusOr<TensorType> InferConcat(Inputs in, const Json& attrs) {
  const int rank = static_cast<int>(in[0].shape.size());
  if (rank == 0) return Invalid("cannot concatenate scalars");
  ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(attrs, "axis", 1));
  ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_attr, rank, "axis"));
  Shape out = in[0].shape;
  out[axis] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Shape& s = in[i].shape;
    const std::string what = absl::StrCat("input ", i);
    RETURN_IF_ERROR(ExpectSameDType(in[0], "input 0", in[i], what));
    bool ok = static_cast<int>(s.size()) == rank;
    for (int d = 0; ok && d < rank; ++d) {
      ok = d == axis || s[d] == in[0].shape[d];
    }
    if (!ok) {
      return Invalid(what, " ", ShapeToString(s), " does not match input 0 ",
                     ShapeToString(in[0].shape), " outside axis ", axis);
    }
    out[axis] += s[axis];
  }
  return TensorType{out, in[0].dtype};
}

absl::Status ConcatBackward(BackwardContext& ctx) {
  ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx.attrs(), "axis", 1));
  ASSIGN_OR_RETURN(int axis,
                   NormalizeAxis(axis_attr, ctx.output_type().shape.size(),
                                 "axis"));
  int64_t begin = 0;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const int64_t end = begin + ctx.input_type(i).shape[axis];
    if (ctx.needs_grad(i)) {
      ctx.AccumulateGrad(i, ctx.Emit("slice", {ctx.grad_output()},
                                     {{"axis", axis},
                                      {"begin", begin},
                                      {"end", end}}));
    }
    begin = end;
  }
  return absl::OkStatus();
}

// ---- slice (x), attrs axis (default 0), begin, end: x[..., begin:end, ...].

struct SliceAttrs {
  int axis = 0;
  int64_t begin = 0, end = 0;
};

absl::StatusOr<SliceAttrs> ParseSlice(const TensorType& x, const Json& attrs) {
  const int rank = static_cast<int>(x.shape.size());
  if (rank == 0) return Invalid("cannot slice a scalar");
  SliceAttrs s;
  ASSIGN_OR_RETURN(int64_t axis, IntAttr(attrs, "axis", 0));
  ASSIGN_OR_RETURN(s.axis, NormalizeAxis(axis, rank, "axis"));
  ASSIGN_OR_RETURN(s.begin, RequiredIntAttr(attrs, "begin"));
  ASSIGN_OR_RETURN(s.end, RequiredIntAttr(attrs, "end"));
  if (s.begin < 0 || s.begin >= s.end || s.end > x.shape[s.axis]) {
    return Invalid("slice [", s.begin, ", ", s.end, ") is empty or outside "
                   "dim ", s.axis, " of ", ShapeToString(x.shape));
  }
  return s;
}

absl::StatusOr<TensorType> InferSlice(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(SliceAttrs s, ParseSlice(in[0], attrs));
  TensorType out = in[0];
  out.shape[s.axis] = s.end - s.begin;
  return out;
}

absl::Status SliceBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  const TensorType& x = ctx.input_type(0);
  ASSIGN_OR_RETURN(SliceAttrs s, ParseSlice(x, ctx.attrs()));
  // The gradient is the incoming one padded back with zeros (F.pad order:
  // the last dim first).
  const int rank = static_cast<int>(x.shape.size());
  std::vector<int64_t> pads(2 * (rank - s.axis), 0);
  pads[2 * (rank - 1 - s.axis)] = s.begin;
  pads[2 * (rank - 1 - s.axis) + 1] = x.shape[s.axis] - s.end;
  ctx.AccumulateGrad(0, ctx.Emit("pad", {ctx.grad_output()},
                                 {{"pads", pads}}));
  return absl::OkStatus();
}

// ---- transpose (x), attr perm: out dim d is x's dim perm[d] (ONNX
// Transpose, torch.permute); perm defaults to the dims reversed.

absl::StatusOr<std::vector<int64_t>> ParsePerm(const TensorType& x,
                                               const Json& attrs) {
  const int rank = static_cast<int>(x.shape.size());
  if (rank > kMaxTransposeRank) {
    return Invalid("transpose of rank ", rank, " (at most ",
                   kMaxTransposeRank, ")");
  }
  std::vector<int64_t> perm;
  if (attrs.is_object() && attrs.contains("perm")) {
    ASSIGN_OR_RETURN(perm, IntListAttr(attrs, "perm"));
  } else {
    for (int d = rank - 1; d >= 0; --d) perm.push_back(d);
  }
  if (!IsPermutation(perm, x.shape.size())) {
    return Invalid("attr 'perm' (", absl::StrJoin(perm, ","),
                   ") is not a permutation of the ", rank, " dims of ",
                   ShapeToString(x.shape));
  }
  return perm;
}

absl::StatusOr<TensorType> InferTranspose(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, ParsePerm(in[0], attrs));
  TensorType out = in[0];
  for (size_t d = 0; d < perm.size(); ++d) out.shape[d] = in[0].shape[perm[d]];
  return out;
}

// The gradient is the incoming one transposed back: inverse[perm[d]] = d.
absl::Status TransposeBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int64_t> perm,
                   ParsePerm(ctx.input_type(0), ctx.attrs()));
  std::vector<int64_t> inverse(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) inverse[perm[d]] = static_cast<int64_t>(d);
  ctx.AccumulateGrad(0, ctx.Emit("transpose", {ctx.grad_output()},
                                 {{"perm", inverse}}));
  return absl::OkStatus();
}

// ---- flip (x), attr dims: the dims reversed (torch.flip, ONNX Slice by a
// step of -1); its gradient is the incoming one flipped back.

absl::StatusOr<TensorType> InferFlip(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(FlipDims(attrs, static_cast<int>(in[0].shape.size())).status());
  return in[0];
}

absl::Status FlipBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ctx.AccumulateGrad(0, ctx.Emit("flip", {ctx.grad_output()}, {{"dims", ctx.attrs()["dims"]}}));
  return absl::OkStatus();
}

// ---- flatten (x), attrs start_dim (1), end_dim (-1), and reshape (x),
// attr shape (one entry may be -1).

absl::StatusOr<TensorType> InferFlatten(Inputs in, const Json& attrs) {
  const Shape& x = in[0].shape;
  const int rank = static_cast<int>(x.size());
  if (rank == 0) return TensorType{{1}, in[0].dtype};
  ASSIGN_OR_RETURN(int64_t start_attr, IntAttr(attrs, "start_dim", 1));
  ASSIGN_OR_RETURN(int64_t end_attr, IntAttr(attrs, "end_dim", -1));
  ASSIGN_OR_RETURN(int start, NormalizeAxis(start_attr, rank, "start_dim"));
  ASSIGN_OR_RETURN(int end, NormalizeAxis(end_attr, rank, "end_dim"));
  if (start > end) {
    return Invalid("start_dim ", start, " is after end_dim ", end);
  }
  Shape out(x.begin(), x.begin() + start);
  out.push_back(Product(x, start, end + 1));
  out.insert(out.end(), x.begin() + end + 1, x.end());
  return TensorType{out, in[0].dtype};
}

absl::StatusOr<TensorType> InferReshape(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntListAttr(attrs, "shape"));
  const int64_t total = NumElements(in[0].shape);
  int infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && infer_at < 0) {
      infer_at = static_cast<int>(i);
    } else if (shape[i] < 0) {
      return Invalid("attr 'shape' (", absl::StrJoin(shape, ","),
                     ") may hold one -1 and no other negative entry");
    } else {
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0) {
      return Invalid("cannot reshape ", ShapeToString(in[0].shape), " into (",
                     absl::StrJoin(shape, ","), ")");
    }
    shape[infer_at] = total / known;
  } else if (known != total) {
    return Invalid("cannot reshape ", ShapeToString(in[0].shape), " (", total,
                   " elements) into ", ShapeToString(shape));
  }
  return TensorType{shape, in[0].dtype};
}

// flatten and reshape: the gradient is the incoming one in x's shape; a
// view of it when the forward node is a view (Note [Gradients of views]).
absl::Status ReshapeBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  Json attrs = {{"shape", ctx.input_type(0).shape}};
  ctx.AccumulateGrad(0, ctx.is_view() ? ctx.EmitView("reshape", ctx.grad_output(), std::move(attrs))
                                      : ctx.Emit("reshape", {ctx.grad_output()}, std::move(attrs)));
  return absl::OkStatus();
}

}  // namespace

void RegisterShapeOps(std::vector<OpDef>& t) {
  t.push_back({.name = "concat", .min_inputs = 1, .max_inputs = -1,
               .infer = InferConcat, .flops = CopyFlops,
               .backward = ConcatBackward});
  t.push_back({.name = "slice", .min_inputs = 1, .max_inputs = 1,
               .infer = InferSlice, .flops = CopyFlops,
               .backward = SliceBackward});
  t.push_back({.name = "transpose", .min_inputs = 1, .max_inputs = 1,
               .infer = InferTranspose, .flops = CopyFlops,
               .backward = TransposeBackward});
  t.push_back({.name = "flip", .min_inputs = 1, .max_inputs = 1, .infer = InferFlip,
               .flops = CopyFlops, .backward = FlipBackward});
  t.push_back({.name = "flatten", .min_inputs = 1, .max_inputs = 1,
               .infer = InferFlatten, .flops = CopyFlops,
               .backward = ReshapeBackward});
  t.push_back({.name = "reshape", .min_inputs = 1, .max_inputs = 1,
               .infer = InferReshape, .flops = CopyFlops,
               .backward = ReshapeBackward});
}

}  // namespace pebble::ops_internal
