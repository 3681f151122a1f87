// ONNX shapes, views, slices, concatenation and constants: integer tensors
// known at import fold (Ints in onnx_context.h), computed tensors become
// pebble operators (see onnx_ops.h and docs/import.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/import/onnx_context.h"
#include "graph/import/onnx_ops.h"
#include "graph/import/onnx_util.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble::onnx_import {
namespace {

// Mod: shape arithmetic only (newer exporters write it for attention's
// head split); both operands must be known integers.
absl::Status Mod(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"fmod"}));
  ASSIGN_OR_RETURN(int64_t fmod, attrs.Int("fmod", 0));
  if (!cx.KnownInts(node.input(0)) || !cx.KnownInts(node.input(1))) {
    return NodeError(node,
                     "Mod of tensors is not supported: only integer shape arithmetic, "
                     "folded at import");
  }
  return FoldArithmetic(cx, node, fmod != 0);
}

// Shape of a value (its static shape; of a constant too, an attention
// mask's), dims [start, end) from opset 15.
absl::Status ShapeOf(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"start", "end"}));
  Shape shape;
  if (std::optional<Numbers> numbers = cx.KnownNumbers(node.input(0))) {
    shape = numbers->dims;
  } else {
    ASSIGN_OR_RETURN(Operand in, cx.FirstOperand(node));
    shape = in.shape;
  }
  const auto rank = static_cast<int64_t>(shape.size());
  ASSIGN_OR_RETURN(int64_t start, attrs.Int("start", 0));
  ASSIGN_OR_RETURN(int64_t end, attrs.Int("end", rank));
  start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
  end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
  std::vector<int64_t> dims(shape.begin() + start, shape.begin() + std::max(start, end));
  const auto n = static_cast<int64_t>(dims.size());
  return cx.DefineInts(node, 0, Ints{{n}, std::move(dims)});
}

// ReduceProd of a vector of integers known at import (x.numel() as
// torch.onnx.export writes it: the product of Shape(x)), folded; axes (an
// attribute before opset 18) none or that vector's one dim.
absl::Status ReduceProd(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axes", "keepdims"}));
  ASSIGN_OR_RETURN(const std::vector<int64_t> axes, attrs.Ints("axes", {}));
  ASSIGN_OR_RETURN(const int64_t keepdims, attrs.Int("keepdims", 1));
  const std::optional<Ints> in = cx.KnownInts(node.input(0));
  if (!in.has_value() || in->dims.size() != 1 ||
      !(axes.empty() || axes == std::vector<int64_t>{0} || axes == std::vector<int64_t>{-1})) {
    return NodeError(node, "only a product of a vector of integers known at import (a "
                           "shape's, as x.numel() exports) is supported");
  }
  int64_t product = 1;
  for (int64_t v : in->values) {
    if (__builtin_mul_overflow(product, v, &product)) {
      return NodeError(node, "the product overflows 64 bits");
    }
  }
  return cx.DefineInts(node, 0, Ints{keepdims != 0 ? Shape{1} : Shape{}, {product}});
}

// Gather of a computed tensor at one constant index (x[:, 0]): a slice and
// a reshape dropping the dim.
absl::Status GatherOneIndex(ImportContext& cx, const onnx::NodeProto& node, int64_t axis,
                            int64_t index) {
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const Shape shape = cx.nb().type(x).shape;
  const auto rank = static_cast<int64_t>(shape.size());
  ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank));
  if (index < -shape[axis] || index >= shape[axis]) {
    return NodeError(node, absl::StrCat("index ", index, " out of range"));
  }
  if (index < 0) index += shape[axis];
  ASSIGN_OR_RETURN(Value part, cx.Aux(node, "slice", {x},
                                      {{"axis", axis}, {"begin", index}, {"end", index + 1}},
                                      "slice"));
  std::vector<int64_t> out(shape.begin(), shape.end());
  out.erase(out.begin() + axis);
  return cx.Apply(node, "reshape", {part}, {{"shape", out}});
}

// The indices of an embedding look-up into a table of `rows` rows as a
// pebble value: computed (token ids, an input), or known at import and
// either 0, 1, ..., n-1 in row-major order (position ids: `torch.arange`,
// a buffer of them, a slice of one), which an `arange` makes, or all one
// value (BERT's token type ids, a buffer of zeros), which a `fill` makes.
// Other constant indices have no pebble operator.
absl::StatusOr<Value> LookupIndices(ImportContext& cx, const onnx::NodeProto& node,
                                    int64_t rows) {
  const std::string& name = node.input(1);
  std::optional<Ints> known = cx.KnownInts(name);
  if (!known) {
    ASSIGN_OR_RETURN(Value ids, cx.Get(node, name));
    const TensorType& type = cx.nb().type(ids);
    if (type.dtype != DType::kInt64) {
      return NodeError(node, absl::StrCat("indices ", Quote(name), " are ",
                                          DTypeName(type.dtype),
                                          "; an embedding look-up takes int64 indices (as "
                                          "torch.onnx.export writes nn.Embedding's)"));
    }
    return ids;
  }
  const std::vector<int64_t>& values = known->values;
  const auto n = static_cast<int64_t>(values.size());
  bool in_order = true, all_one = true;
  for (int64_t i = 0; i < n; ++i) {
    in_order = in_order && values[i] == i;
    all_one = all_one && values[i] == values[0];
  }
  if (n == 0 || (!in_order && !all_one)) {
    return NodeError(node, absl::StrCat("constant indices ", Quote(name), " of shape ",
                                        ShapeToString(known->dims),
                                        " are supported only as 0, 1, ..., n-1 (position "
                                        "ids) or all one value (token type ids); these are ",
                                        absl::StrJoin(values.begin(),
                                                      values.begin() + std::min<int64_t>(n, 6),
                                                      ", "),
                                        n > 6 ? ", ..." : ""));
  }
  const int64_t largest = in_order ? n - 1 : values[0];
  if (values[0] < 0 || largest >= rows) {
    return NodeError(node, absl::StrCat("constant index ", values[0] < 0 ? values[0] : largest,
                                        " of ", Quote(name), " is outside the table's ", rows,
                                        " rows"));
  }
  if (!in_order) {
    return cx.Aux(node, "fill", {},
                  {{"shape", known->dims}, {"dtype", "i64"}, {"value", values[0]}}, "indices");
  }
  ASSIGN_OR_RETURN(Value ids, cx.Aux(node, "arange", {}, {{"n", n}}, "positions"));
  if (known->dims.size() == 1) return ids;
  return cx.Aux(node, "reshape", {ids}, {{"shape", known->dims}}, "positions_shape");
}

// Gather of a float matrix's rows (axis 0) at integer indices:
// nn.Embedding and F.embedding as torch.onnx.export writes them; pebble's
// `embedding`, whose gradient scatter-adds into the matrix. A padding_idx
// is not in the file (the exporter warns that its row then trains).
absl::Status Embedding(ImportContext& cx, const onnx::NodeProto& node, int64_t axis) {
  ASSIGN_OR_RETURN(Value table, cx.Get(node, node.input(0)));
  const TensorType& type = cx.nb().type(table);
  const auto rank = static_cast<int64_t>(type.shape.size());
  ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank));
  if (rank != 2 || axis != 0) {
    return NodeError(node, absl::StrCat("a Gather of a computed tensor at a tensor of indices "
                                        "is supported only as an embedding look-up, of rows "
                                        "(axis 0) of a matrix; this one takes axis ", axis,
                                        " of a ", ShapeToString(type.shape), " tensor"));
  }
  if (!ops_internal::IsFloat(type.dtype)) {
    return NodeError(node, absl::StrCat("an embedding look-up into ", DTypeName(type.dtype),
                                        " data: pebble's embedding takes float rows"));
  }
  ASSIGN_OR_RETURN(Value ids, LookupIndices(cx, node, type.shape[0]));
  return cx.Apply(node, "embedding", {ids, table});
}

// Gather: of a known integer vector (a shape's dims) at constant indices,
// folded; of a computed tensor at one constant index; an embedding look-up.
absl::Status Gather(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axis"}));
  ASSIGN_OR_RETURN(int64_t axis, attrs.Int("axis", 0));
  std::optional<Ints> data = cx.KnownInts(node.input(0));
  std::optional<Ints> indices = cx.KnownInts(node.input(1));
  if (!data && indices && indices->dims.empty()) {
    return GatherOneIndex(cx, node, axis, indices->values[0]);
  }
  if (!data) return Embedding(cx, node, axis);
  ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis,
                                  static_cast<int64_t>(data->dims.size())));
  if (!indices || data->dims.size() != 1) {
    return NodeError(node,
                     "a Gather from constant integers is supported only from a vector (a "
                     "shape) at constant indices");
  }
  Ints out{indices->dims, {}};
  const auto n = static_cast<int64_t>(data->values.size());
  for (int64_t i : indices->values) {
    if (i < -n || i >= n) return NodeError(node, absl::StrCat("index ", i, " out of range"));
    out.values.push_back(data->values[i < 0 ? i + n : i]);
  }
  return cx.DefineInts(node, 0, std::move(out));
}

// DepthToSpace (nn.PixelShuffle exports it, mode CRD; mode DCR too) and
// SpaceToDepth of x (N, C, H, W) by `blocksize`, as ONNX defines them: x
// viewed as 6-D (a reshape), a transpose (a copy) and the result viewed
// back as 4-D.
absl::Status MoveBlocks(ImportContext& cx, const onnx::NodeProto& node, bool to_space) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(to_space ? attrs.OnlyKnown({"blocksize", "mode"})
                           : attrs.OnlyKnown({"blocksize"}));
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const Shape shape = cx.nb().type(x).shape;
  if (shape.size() != 4) {
    return NodeError(node, absl::StrCat("input of shape ", ShapeToString(shape),
                                        "; takes (N, C, H, W)"));
  }
  ASSIGN_OR_RETURN(const int64_t bs, attrs.Int("blocksize", 0));
  ASSIGN_OR_RETURN(const std::string mode, attrs.String("mode", "DCR"));
  if (mode != "DCR" && mode != "CRD") return attrs.Unsupported("mode", mode);
  const int64_t n = shape[0], c = shape[1], h = shape[2], w = shape[3];
  if (bs < 1 || (to_space ? c % (bs * bs) != 0 : h % bs != 0 || w % bs != 0)) {
    return NodeError(node, absl::StrCat("blocksize ", bs, " does not divide ",
                                        to_space ? "the channels of " : "the height and width of ",
                                        ShapeToString(shape)));
  }
  std::vector<int64_t> blocks, perm, out;
  if (!to_space) {
    blocks = {n, c, h / bs, bs, w / bs, bs};
    perm = {0, 3, 5, 1, 2, 4};
    out = {n, c * bs * bs, h / bs, w / bs};
  } else if (mode == "DCR") {
    blocks = {n, bs, bs, c / (bs * bs), h, w};
    perm = {0, 3, 4, 1, 5, 2};
    out = {n, c / (bs * bs), h * bs, w * bs};
  } else {
    blocks = {n, c / (bs * bs), bs, bs, h, w};
    perm = {0, 1, 4, 2, 5, 3};
    out = {n, c / (bs * bs), h * bs, w * bs};
  }
  ASSIGN_OR_RETURN(Value b, cx.Aux(node, "reshape", {x}, {{"shape", blocks}}, "blocks"));
  ASSIGN_OR_RETURN(Value t, cx.Aux(node, "transpose", {b}, {{"perm", perm}}, "moved"));
  return cx.Apply(node, "reshape", {t}, {{"shape", out}});
}

// Range of known integer scalars (`torch.arange(ids.shape[1])` exported
// with a symbolic dim): the vector start, start + delta, ... before limit,
// folded; at most 2^24 values (a position-id vector, not data).
// Range of float constants (torch.arange(w, dtype=torch.float32) under a
// symbolic size): ONNX's max(ceil((limit - start) / delta), 0) values
// start + i delta, each rounded to float, at most 2^20 of them. The count
// and the values are computed in double, as torch.arange computes them
// (the model is PyTorch's), where ONNX Runtime computes in the inputs'
// float32: (0, 0.3, 0.1) counts 4 values here and in PyTorch, 3 there.
absl::Status FloatRange(ImportContext& cx, const onnx::NodeProto& node) {
  double bound[3];
  for (int i = 0; i < 3; ++i) {
    std::optional<Numbers> v = cx.KnownNumbers(node.input(i));
    if (!v || v->values.size() != 1 || !std::isfinite(v->values[0])) {
      return NodeError(node, absl::StrCat("input ", Quote(node.input(i)),
                                          " must be a scalar known at import (a Range of "
                                          "values computed at run time is not supported)"));
    }
    bound[i] = v->values[0];
  }
  const auto [start, limit, delta] = bound;
  if (delta == 0) return NodeError(node, "delta 0");
  const double count = std::max(std::ceil((limit - start) / delta), 0.0);
  if (count > (1 << 20)) return NodeError(node, absl::StrCat("more than ", 1 << 20, " values"));
  std::vector<double> values(static_cast<size_t>(count));
  for (size_t i = 0; i < values.size(); ++i) values[i] = start + static_cast<double>(i) * delta;
  const int type = cx.KnownNumbers(node.input(0))->data_type;
  return cx.DefineFolded(node,
                         FloatTensor({static_cast<int64_t>(values.size())}, values, type));
}

absl::Status Range(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 3, 3));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  int64_t bound[3];
  for (int i = 0; i < 3; ++i) {
    std::optional<Ints> v = cx.KnownInts(node.input(i));
    if (!v || v->values.size() != 1) return FloatRange(cx, node);
    bound[i] = v->values[0];
  }
  const auto [start, limit, delta] = bound;
  if (delta == 0) return NodeError(node, "delta 0");
  constexpr int64_t kMaxValues = int64_t{1} << 24;
  Ints out{{0}, {}};
  for (int64_t v = start; delta > 0 ? v < limit : v > limit;) {
    if (static_cast<int64_t>(out.values.size()) == kMaxValues) {
      return NodeError(node, absl::StrCat("more than ", kMaxValues, " values"));
    }
    out.values.push_back(v);
    if (__builtin_add_overflow(v, delta, &v)) break;
  }
  out.dims[0] = static_cast<int64_t>(out.values.size());
  return cx.DefineInts(node, 0, std::move(out));
}

// ConstantOfShape of a known shape: with an integer value folds (the ones
// torch writes for Expand's -1 dims), with a float one folds into a float
// constant (an attention mask's zeros).
absl::Status ConstantOfShape(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"value"}));
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, cx.ConstInts(node, 0));
  int64_t value = 0;
  std::optional<double> float_value;
  int float_type = onnx::TensorProto::FLOAT;
  std::optional<bool> bool_value;  // (torch.ones(n, n, dtype=torch.bool) of a symbolic n)
  for (const onnx::AttributeProto& a : node.attribute()) {
    if (a.name() != "value") continue;
    absl::StatusOr<std::vector<int64_t>> v = IntValues(a.t());
    if (v.ok() && v->size() == 1) {
      value = (*v)[0];
    } else if (std::optional<double> f = FloatScalar(a.t())) {
      float_value = f;
      float_type = a.t().data_type();
    } else if (std::optional<bool> b = BoolScalar(a.t())) {
      bool_value = b;
    } else {
      return NodeError(node, "only an integer, float or boolean scalar value is supported");
    }
  }
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > (int64_t{1} << 20) || (count *= d) > (int64_t{1} << 20)) {
      return NodeError(node, "shape is negative or too large for a constant");
    }
  }
  const Shape dims(shape.begin(), shape.end());
  if (float_value) {
    return cx.DefineFolded(
        node, FloatTensor(dims, std::vector<double>(count, *float_value), float_type));
  }
  if (bool_value) {
    return cx.DefineFolded(node, *TypedTensor(onnx::TensorProto::BOOL, dims,
                                              std::vector<double>(count, *bool_value)));
  }
  return cx.DefineInts(node, 0, Ints{dims, std::vector<int64_t>(count, value)});
}

// The axes of Unsqueeze / Squeeze: an input from opset 13, before that
// an attribute.
absl::StatusOr<std::vector<int64_t>> AxesOf(ImportContext& cx, const onnx::NodeProto& node,
                                            bool required) {
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axes"}));
  if (node.input_size() >= 2 && !node.input(1).empty()) return cx.ConstInts(node, 1);
  if (attrs.has("axes")) return attrs.Ints("axes", {});
  if (required) return NodeError(node, "has no axes");
  return std::vector<int64_t>{};
}

// Unsqueeze and Squeeze: new dims of the values' shape; a reshape of a
// computed tensor.
absl::Status SqueezeOrUnsqueeze(ImportContext& cx, const onnx::NodeProto& node, bool unsqueeze) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 2));
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, AxesOf(cx, node, unsqueeze));
  // A float constant (nn.MultiheadAttention unsqueezes its 2-D attention
  // mask) keeps its values in the new shape, folded.
  std::optional<Numbers> floats;
  if (!cx.KnownInts(node.input(0))) floats = cx.KnownNumbers(node.input(0));
  Operand in;
  if (floats) {
    in.shape = floats->dims;
  } else {
    ASSIGN_OR_RETURN(in, cx.FirstOperand(node));
  }
  const std::optional<Ints>& ints = in.ints;
  Value x = in.value;
  const Shape& shape = in.shape;
  const auto out_rank =
      static_cast<int64_t>(shape.size()) + (unsqueeze ? static_cast<int64_t>(axes.size()) : 0);
  std::set<int64_t> at;
  const std::string all = absl::StrCat("axes [", absl::StrJoin(axes, ","), "]");
  for (int64_t a : axes) {
    // Unsqueeze's axes count in its output's rank.
    const int64_t r = unsqueeze ? out_rank : static_cast<int64_t>(shape.size());
    ASSIGN_OR_RETURN(const int64_t d, OnnxAxis(node, absl::StrCat("axis ", a, " of ", all), a, r));
    if (!at.insert(d).second) {
      return NodeError(node, absl::StrCat(all, ": dim ", d, " is repeated"));
    }
  }
  Shape out;
  if (unsqueeze) {
    for (int64_t d = 0, k = 0; d < out_rank; ++d) out.push_back(at.contains(d) ? 1 : shape[k++]);
  } else {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      const bool drop = at.empty() ? shape[d] == 1 : at.contains(d);
      if (drop && shape[d] != 1) {
        return NodeError(node,
                         absl::StrCat("cannot squeeze dim ", d, " of ", ShapeToString(shape)));
      }
      if (!drop) out.push_back(shape[d]);
    }
  }
  if (ints) return cx.DefineInts(node, 0, Ints{out, ints->values});
  if (floats) return cx.DefineFolded(node, FloatTensor(out, floats->values, floats->data_type));
  return cx.Apply(node, "reshape", {x}, {{"shape", std::vector<int64_t>(out.begin(), out.end())}});
}

// Transpose of a known integer tensor (F.pad's export transposes its pads).
absl::Status FoldTranspose(ImportContext& cx, const onnx::NodeProto& node, const Ints& ints) {
  const size_t rank = ints.dims.size();
  std::vector<int64_t> perm;
  for (size_t d = rank; d-- > 0;) perm.push_back(static_cast<int64_t>(d));
  ASSIGN_OR_RETURN(perm, Attrs(node).Ints("perm", perm));
  std::vector<bool> seen(rank, false);
  for (int64_t p : perm) {
    if (perm.size() != rank || p < 0 || p >= static_cast<int64_t>(rank) || seen[p]) {
      return NodeError(
          node, absl::StrCat("perm [", absl::StrJoin(perm, ","), "] is not a permutation of the ",
                             rank, " dims of ", ShapeToString(ints.dims)));
    }
    seen[p] = true;
  }
  // Output dim d walks input dim perm[d]: gather in the input's order.
  Ints out;
  for (int64_t p : perm) out.dims.push_back(ints.dims[p]);
  std::vector<int64_t> out_stride(rank, 1);
  for (size_t d = rank; d-- > 1;) out_stride[d - 1] = out_stride[d] * out.dims[d];
  out.values.assign(ints.values.size(), 0);
  std::vector<int64_t> at(rank, 0);  // an input position
  for (int64_t value : ints.values) {
    int64_t target = 0;
    for (size_t d = 0; d < rank; ++d) target += at[perm[d]] * out_stride[d];
    out.values[target] = value;
    for (size_t d = rank; d-- > 0;) {
      if (++at[d] < ints.dims[d]) break;
      at[d] = 0;
    }
  }
  return cx.DefineInts(node, 0, std::move(out));
}

// Transpose: `perm` (default: the dims reversed).
absl::Status Transpose(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"perm"}));
  if (std::optional<Ints> ints = cx.KnownInts(node.input(0))) return FoldTranspose(cx, node, *ints);
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  if (!attrs.has("perm")) return cx.Apply(node, "transpose", in);
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, attrs.Ints("perm", {}));
  return cx.Apply(node, "transpose", in, {{"perm", perm}});
}

// [begin, end) of ONNX Slice's start and end along a dim of `size`:
// negative values count from the end, both clamped to [0, size].
std::pair<int64_t, int64_t> SliceBounds(int64_t start, int64_t end, int64_t size) {
  auto clamp = [size](int64_t v) {
    if (v < 0) v = v < -size ? 0 : v + size;
    return std::min(v, size);
  };
  return {clamp(start), clamp(end)};
}

// The cut of a Slice along one dim of `size` by a negative step, in the
// coordinates of that dim reversed (j -> size - 1 - j): ONNX's start
// clamped to [0, size - 1] and end to [-1, size - 1] become begin and end
// of a positive step; begin >= end when nothing is kept.
std::pair<int64_t, int64_t> ReversedSliceBounds(int64_t start, int64_t end, int64_t size) {
  if (size == 0) return {0, 0};
  auto wrap = [size](int64_t v) { return v < 0 ? (v < -size ? -size - 1 : v) + size : v; };
  const int64_t first = std::clamp<int64_t>(wrap(start), 0, size - 1);
  const int64_t stop = std::clamp<int64_t>(wrap(end), -1, size - 1);
  return {size - 1 - first, size - 1 - stop};
}

// The values of a tensor of `dims` at the positions `picks` select, in
// row-major order of the result: the source index along dim d of result
// position (i_0, ...) is picks[d][i_d].
template <typename T>
std::vector<T> Gathered(const Shape& dims, const std::vector<T>& values,
                        const std::vector<std::vector<int64_t>>& picks) {
  const size_t rank = dims.size();
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * dims[d];
  int64_t count = 1;
  for (const auto& pick : picks) count *= static_cast<int64_t>(pick.size());
  std::vector<T> out;
  std::vector<int64_t> at(rank, 0);
  for (int64_t p = 0; p < count; ++p) {
    int64_t source = 0;
    for (size_t d = 0; d < rank; ++d) source += picks[d][at[d]] * stride[d];
    out.push_back(values[source]);
    for (size_t d = rank; d-- > 0;) {
      if (++at[d] < static_cast<int64_t>(picks[d].size())) break;
      at[d] = 0;
    }
  }
  return out;
}

// The source index along each dim of the result of a Slice of a tensor of
// `dims`, with any steps, as ONNX defines them.
absl::StatusOr<std::vector<std::vector<int64_t>>> SlicePicks(
    const onnx::NodeProto& node, const Shape& dims, const std::vector<int64_t>& starts,
    const std::vector<int64_t>& ends, const std::vector<int64_t>& axes,
    const std::vector<int64_t>& steps) {
  const auto rank = static_cast<int64_t>(dims.size());
  std::vector<std::vector<int64_t>> picks(rank);
  for (int64_t d = 0; d < rank; ++d) {
    for (int64_t i = 0; i < dims[d]; ++i) picks[d].push_back(i);
  }
  for (size_t k = 0; k < axes.size(); ++k) {
    ASSIGN_OR_RETURN(const int64_t axis,
                     OnnxAxis(node, absl::StrCat("axis ", axes[k]), axes[k], rank));
    const int64_t size = dims[axis], step = steps[k];
    if (step == 0) return NodeError(node, "step 0");
    // A negative step picks in the reversed coordinates j = size - 1 - i.
    const auto [begin, end] = step > 0 ? SliceBounds(starts[k], ends[k], size)
                                       : ReversedSliceBounds(starts[k], ends[k], size);
    const int64_t stride =
        step > 0 ? step : (step == std::numeric_limits<int64_t>::min() ? size + 1 : -step);
    const int64_t count = begin < end ? 1 + (end - begin - 1) / stride : 0;
    std::vector<int64_t>& pick = picks[axis];
    pick.clear();
    for (int64_t c = 0; c < count; ++c) {
      const int64_t j = begin + c * stride;
      pick.push_back(step > 0 ? j : size - 1 - j);
    }
  }
  return picks;
}

// A Slice of a constant of any rank with any steps, folded: of integers
// (F.pad's export reverses its (dims, 2) pads with a step of -1; position
// ids are a (1, n) buffer cut to the sequence's length), or of floats (a
// causal attention mask cut to the sequence's length). Returns false,
// folding nothing, where input 0 is neither.
absl::StatusOr<bool> FoldSlice(ImportContext& cx, const onnx::NodeProto& node,
                               const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                               const std::vector<int64_t>& axes, std::vector<int64_t> steps) {
  if (steps.empty()) steps.assign(starts.size(), 1);
  const std::optional<Ints> ints = cx.KnownInts(node.input(0));
  const std::optional<Numbers> numbers =
      ints ? std::nullopt : cx.KnownNumbers(node.input(0));
  if (!ints && !numbers) return false;
  const Shape& source = ints ? ints->dims : numbers->dims;
  ASSIGN_OR_RETURN(auto picks, SlicePicks(node, source, starts, ends, axes, steps));
  Shape dims;
  for (const auto& pick : picks) dims.push_back(static_cast<int64_t>(pick.size()));
  if (ints) {
    RETURN_IF_ERROR(cx.DefineInts(node, 0, Ints{dims, Gathered(source, ints->values, picks)}));
  } else {
    RETURN_IF_ERROR(
        cx.DefineFolded(node, FloatTensor(dims, Gathered(source, numbers->values, picks),
                                          numbers->data_type)));
  }
  return true;
}

// What a Slice keeps along one dim of a computed tensor: elements begin,
// begin + step, ..., `count` of them, all below end.
struct SliceCut {
  int64_t axis, begin, end, step, count;
};

// `cut` applied to x, the result's id `suffix`'d (empty: the node's own).
// A step of 1, or one element kept, is a `slice`. A larger step s
// (x[::2], YOLOv5's Focus layer) views the run of s x n elements from
// begin (a `slice`) as (n, s) (a `reshape`), keeps the first of each s (a
// `slice`) and views the dim back, n being the kept elements whose s-run
// lies within the dim; the last kept element, where its run does not, is a
// `slice` of its own, concatenated after them. Only operators with
// gradients, which route each kept element's gradient back to it and zeros
// elsewhere, as PyTorch's strided view; any dtype.
absl::StatusOr<Value> ApplySliceCut(ImportContext& cx, const onnx::NodeProto& node, Value x,
                                    const SliceCut& cut, const std::string& suffix) {
  const auto name = [&](absl::string_view what) {
    return absl::StrCat(suffix.empty() ? "" : absl::StrCat(suffix, "_"), "step_", what);
  };
  const auto slice = [&](Value v, int64_t axis, int64_t begin, int64_t end,
                         const std::string& id) {
    return cx.Lowered(node, "slice", {v}, {{"axis", axis}, {"begin", begin}, {"end", end}}, id);
  };
  if (cut.step == 1 || cut.count == 1) {
    return slice(x, cut.axis, cut.begin, cut.step == 1 ? cut.end : cut.begin + 1, suffix);
  }
  Shape shape = cx.nb().type(x).shape;
  const int64_t size = shape[cut.axis];
  // The kept elements whose whole run lies within the dim (the last one's
  // may not): at least 1, as count >= 2 keeps begin + step < size.
  const int64_t grouped = (size - cut.begin) / cut.step < cut.count ? cut.count - 1 : cut.count;
  const int64_t run = grouped * cut.step;
  const bool tail = grouped < cut.count;
  Value v = x;
  if (cut.begin != 0 || run != size) {
    ASSIGN_OR_RETURN(v, slice(v, cut.axis, cut.begin, cut.begin + run, name("run")));
  }
  std::vector<int64_t> dims(shape.begin(), shape.end());
  dims[cut.axis] = grouped;
  dims.insert(dims.begin() + cut.axis + 1, cut.step);
  ASSIGN_OR_RETURN(v, cx.Aux(node, "reshape", {v}, {{"shape", dims}}, name("grouped")));
  ASSIGN_OR_RETURN(v, slice(v, cut.axis + 1, 0, 1, name("first")));
  shape[cut.axis] = grouped;
  ASSIGN_OR_RETURN(v, cx.Lowered(node, "reshape", {v},
                                 {{"shape", std::vector<int64_t>(shape.begin(), shape.end())}},
                                 tail ? name("kept") : suffix));
  if (!tail) return v;
  const int64_t last = cut.begin + run;  // the last kept element
  ASSIGN_OR_RETURN(const Value end, slice(x, cut.axis, last, last + 1, name("last")));
  return cx.Lowered(node, "concat", {v, end}, {{"axis", cut.axis}}, suffix);
}

// Slice with constant (or folded) starts, ends, axes and steps: per dim it
// narrows, a pebble `slice`, or for a step above 1 the lowering of
// ApplySliceCut (none: the input itself); dims of a negative step are
// reversed first (one `flip`, torch.flip's export), and cut by the
// positive step in the reversed coordinates. A slice of a constant folds,
// with any steps (FoldSlice).
absl::Status Slice(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 3, 5));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(std::vector<int64_t> starts, cx.ConstInts(node, 1));
  ASSIGN_OR_RETURN(std::vector<int64_t> ends, cx.ConstInts(node, 2));
  std::vector<int64_t> axes, steps;
  if (node.input_size() > 3 && !node.input(3).empty()) {
    ASSIGN_OR_RETURN(axes, cx.ConstInts(node, 3));
  } else {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (node.input_size() > 4 && !node.input(4).empty()) {
    ASSIGN_OR_RETURN(steps, cx.ConstInts(node, 4));
  }
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      (!steps.empty() && steps.size() != starts.size())) {
    return NodeError(node, "starts, ends, axes and steps differ in length");
  }
  ASSIGN_OR_RETURN(const bool folded, FoldSlice(cx, node, starts, ends, axes, steps));
  if (folded) return absl::OkStatus();
  ASSIGN_OR_RETURN(Operand in, cx.FirstOperand(node));
  if (steps.empty()) steps.assign(starts.size(), 1);
  Value x = in.value;
  const Shape& shape = in.shape;
  const auto rank = static_cast<int64_t>(shape.size());
  std::vector<SliceCut> cuts;
  std::vector<int64_t> reversed;  // dims of a negative step (but of size 1)
  std::set<int64_t> seen;
  for (size_t i = 0; i < axes.size(); ++i) {
    ASSIGN_OR_RETURN(const int64_t axis,
                     OnnxAxis(node, absl::StrCat("axis ", axes[i]), axes[i], rank));
    if (steps[i] == 0) return NodeError(node, "step 0");
    if (steps[i] == std::numeric_limits<int64_t>::min()) {
      return NodeError(node, absl::StrCat("step ", steps[i], " is not supported"));
    }
    if (!seen.insert(axis).second) {
      return NodeError(node, absl::StrCat("slices dim ", axis, " twice"));
    }
    const int64_t step = steps[i] < 0 ? -steps[i] : steps[i];
    if (steps[i] < 0 && shape[axis] > 1) reversed.push_back(axis);
    const auto [begin, end] = steps[i] < 0
                                  ? ReversedSliceBounds(starts[i], ends[i], shape[axis])
                                  : SliceBounds(starts[i], ends[i], shape[axis]);
    if (begin >= end) {
      return NodeError(node,
                       absl::StrCat("slice [", starts[i], ", ", ends[i], ") of dim ", axis, " of ",
                                    ShapeToString(shape), " is empty (not supported)"));
    }
    const int64_t count = 1 + (end - begin - 1) / step;  // elements kept
    if (begin != 0 || end != shape[axis] || count != shape[axis]) {
      cuts.push_back({axis, begin, end, step, count});
    }
  }
  if (!reversed.empty()) {
    ASSIGN_OR_RETURN(x, cx.Lowered(node, "flip", {x}, {{"dims", reversed}},
                                   cuts.empty() ? "" : "reversed"));
  }
  if (cuts.empty()) return cx.Define(node, x);
  for (size_t i = 0; i < cuts.size(); ++i) {
    const bool last = i + 1 == cuts.size();
    ASSIGN_OR_RETURN(x, ApplySliceCut(cx, node, x, cuts[i],
                                      last ? "" : absl::StrCat(cuts[i].axis)));
  }
  return cx.Define(node, x);
}

// Split along `axis` into the sizes of input `split` (opset 13; the
// attribute before), or equal parts: one pebble `slice` per output.
absl::Status Split(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 2));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axis", "split"}));
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const Shape& shape = cx.nb().type(x).shape;
  const auto rank = static_cast<int64_t>(shape.size());
  ASSIGN_OR_RETURN(int64_t axis, attrs.Int("axis", 0));
  ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank));
  const int parts = node.output_size();
  std::vector<int64_t> sizes;
  if (node.input_size() == 2 && !node.input(1).empty()) {
    ASSIGN_OR_RETURN(sizes, cx.ConstInts(node, 1));
  } else if (attrs.has("split")) {
    ASSIGN_OR_RETURN(sizes, attrs.Ints("split", {}));
  } else if (parts > 0 && shape[axis] % parts == 0) {
    sizes.assign(parts, shape[axis] / parts);
  }
  int64_t total = 0;
  for (int64_t s : sizes) total += s > 0 ? s : -(int64_t{1} << 40);
  if (static_cast<int>(sizes.size()) != parts || total != shape[axis]) {
    return NodeError(
        node, absl::StrCat("cannot split dim ", axis, " of ", ShapeToString(shape), " into ", parts,
                           sizes.empty() ? " equal parts"
                                         : absl::StrCat(" parts [", absl::StrJoin(sizes, ","),
                                                        "]")));
  }
  const std::string id = cx.NodeIdFor(node);
  int64_t begin = 0;
  for (int i = 0; i < parts; ++i) {
    const int64_t end = begin + sizes[i];
    const std::string part = i == 0 ? id : absl::StrCat(id, ".", i);
    const Value v = cx.nb().Apply("slice", {x}, {{"axis", axis}, {"begin", begin}, {"end", end}},
                                  cx.Free(part) ? part : cx.FreshId(part));
    if (!cx.nb().status().ok()) return NodeError(node, cx.nb().status().message());
    if (!node.output(i).empty()) RETURN_IF_ERROR(cx.Define(node, v, i));
    begin = end;
  }
  return absl::OkStatus();
}

absl::Status Flatten(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axis"}));
  ASSIGN_OR_RETURN(int64_t axis, attrs.Int("axis", 1));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  const Shape& x = cx.nb().type(in[0]).shape;
  const auto rank = static_cast<int64_t>(x.size());
  ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank,
                                  /*one_past_last=*/true));
  // ONNX Flatten is always 2-D: dims [0, axis) and [axis, rank) merged.
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x[d];
  if (axis == 1 && rank >= 2) return cx.Apply(node, "flatten", in, {{"start_dim", 1}});
  return cx.Apply(node, "reshape", in, {{"shape", std::vector<int64_t>{outer, -1}}});
}

absl::Status Reshape(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"allowzero"}));
  ASSIGN_OR_RETURN(int64_t allowzero, attrs.Int("allowzero", 0));
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, cx.ConstInts(node, 1));
  ASSIGN_OR_RETURN(Operand x, cx.FirstOperand(node));
  const Shape& in = x.shape;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0 && allowzero == 0) {
      if (d >= in.size()) return NodeError(node, "shape copies a dimension x does not have");
      shape[d] = in[d];  // 0 copies the input's dimension
    }
  }
  if (!x.ints) return cx.Apply(node, "reshape", {x.value}, {{"shape", shape}});
  // Known integers keep their values in the new shape.
  const auto count = static_cast<int64_t>(x.ints->values.size());
  int64_t known = 1, infer_at = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1 && infer_at < 0) {
      infer_at = static_cast<int64_t>(d);
    } else if (shape[d] < 0) {
      return NodeError(node, "shape has a negative dimension");
    } else if (__builtin_mul_overflow(known, shape[d], &known)) {
      return NodeError(node, "shape overflows");
    }
  }
  if (infer_at >= 0 && known > 0 && count % known == 0) shape[infer_at] = count / known;
  int64_t total = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(total, d, &total)) total = -1;
  }
  if (total != count) return NodeError(node, "shape does not hold the integers' count");
  return cx.DefineInts(node, 0, Ints{Shape(shape.begin(), shape.end()), x.ints->values});
}

absl::Status Concat(ImportContext& cx, const onnx::NodeProto& node) {
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axis"}));
  if (!attrs.has("axis")) return NodeError(node, "attribute axis is required");
  ASSIGN_OR_RETURN(int64_t axis, attrs.Int("axis", 1));
  // Integer vectors (the pieces of a shape) fold.
  bool all_ints = node.input_size() > 0;
  for (const std::string& name : node.input()) all_ints = all_ints && cx.KnownInts(name);
  if (all_ints) {
    Ints out{{0}, {}};
    for (const std::string& name : node.input()) {
      const Ints part = *cx.KnownInts(name);
      if (part.dims.size() != 1 || (axis != 0 && axis != -1)) {
        return NodeError(node, "only vectors of integers concatenate into a constant");
      }
      out.values.insert(out.values.end(), part.values.begin(), part.values.end());
    }
    out.dims = {static_cast<int64_t>(out.values.size())};
    return cx.DefineInts(node, 0, std::move(out));
  }
  // Float vectors of constants of one type (Resize's scales as nn.Upsample
  // exports them) fold too.
  std::vector<double> floats;
  bool all_floats = node.input_size() > 0 && (axis == 0 || axis == -1);
  const onnx::TensorProto* first = all_floats ? cx.ConstTensor(node.input(0)) : nullptr;
  for (const std::string& name : node.input()) {
    // (a parameter's part is concatenated as a value: it trains)
    const onnx::TensorProto* t =
        all_floats && !cx.IsParameterLike(name) ? cx.ConstTensor(name) : nullptr;
    std::optional<std::vector<double>> part = t ? FloatValues(*t) : std::nullopt;
    all_floats = part.has_value() && t->dims_size() == 1 && t->data_type() == first->data_type();
    if (all_floats) floats.insert(floats.end(), part->begin(), part->end());
  }
  if (all_floats) {
    return cx.DefineFolded(node, FloatTensor({static_cast<int64_t>(floats.size())}, floats,
                                             first->data_type()));
  }
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  if (in.empty()) return NodeError(node, "has no inputs");
  ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis,
                                  static_cast<int64_t>(cx.nb().type(in[0]).shape.size())));
  return cx.Apply(node, "concat", in, {{"axis", axis}});
}

// Tile (x.repeat(...)) of a computed tensor by constant repeats: along
// each dim repeated r > 1 times, a `concat` of r copies (each copy's
// gradient is summed back into x, as PyTorch's repeat_backward sums them).
absl::Status Tile(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(const std::vector<int64_t> repeats, cx.ConstInts(node, 1));
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const auto rank = static_cast<int64_t>(cx.nb().type(x).shape.size());
  if (static_cast<int64_t>(repeats.size()) != rank) {
    return NodeError(node, absl::StrCat("repeats has ", repeats.size(), " values for rank ", rank));
  }
  int64_t last = -1;  // the last dim repeated: its concat is the node's own
  for (int64_t d = 0; d < rank; ++d) {
    if (repeats[d] < 1) {
      return NodeError(node, absl::StrCat("repeats ", repeats[d], " for dim ", d,
                                          " (an empty result is not supported)"));
    }
    if (repeats[d] > 1) last = d;
  }
  if (last < 0) return cx.Define(node, x);
  for (int64_t d = 0; d < rank; ++d) {
    if (repeats[d] == 1) continue;
    const std::vector<Value> copies(static_cast<size_t>(repeats[d]), x);
    const Json attrs = {{"axis", d}};
    if (d == last) return cx.Apply(node, "concat", copies, attrs);
    ASSIGN_OR_RETURN(x, cx.Aux(node, "concat", copies, attrs, absl::StrCat("dim", d)));
  }
  return absl::OkStatus();
}

absl::Status Identity(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  return cx.Define(node, x);
}

absl::Status Constant(ImportContext& cx, const onnx::NodeProto& node) {
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"value"}));
  for (const onnx::AttributeProto& a : node.attribute()) {
    if (a.name() == "value" && a.type() == onnx::AttributeProto::TENSOR &&
        node.output_size() == 1) {
      if (absl::Status stored = CheckStoredValues(a.t(), "its value", /*require_values=*/true);
          !stored.ok()) {
        return NodeError(node, stored.message());
      }
      cx.SetConstant(node.output(0), &a.t());
      return absl::OkStatus();
    }
  }
  return NodeError(node, "only a tensor 'value' is supported");
}

}  // namespace

// Add, Sub, Mul, Div, Mod of two integer tensors (a scalar or one-element
// operand broadcast over the other); Div of non-negative values; Mod by a
// non-zero divisor, the result's sign the divisor's (fmod 0, as Python's
// %) or the dividend's (fmod 1, as C's %).
absl::Status FoldArithmetic(ImportContext& cx, const onnx::NodeProto& node, bool fmod) {
  const Ints a = *cx.KnownInts(node.input(0));
  const Ints b = *cx.KnownInts(node.input(1));
  const std::optional<Shape> shape = FoldedBroadcastShape(a.dims, b.dims);
  if (!shape.has_value()) {
    return NodeError(node, absl::StrCat("integer operands of shapes ", ShapeToString(a.dims),
                                        " and ", ShapeToString(b.dims),
                                        " do not broadcast (or make more than 2^20 values)"));
  }
  Ints out{*shape, std::vector<int64_t>(NumElements(*shape))};
  const std::string& op = node.op_type();
  for (size_t i = 0; i < out.values.size(); ++i) {
    const int64_t o = static_cast<int64_t>(i);
    const int64_t x = a.values[BroadcastIndex(a.dims, *shape, o)];
    const int64_t y = b.values[BroadcastIndex(b.dims, *shape, o)];
    int64_t r = 0;
    bool overflow = false;
    if (op == "Add") {
      overflow = __builtin_add_overflow(x, y, &r);
    } else if (op == "Sub") {
      overflow = __builtin_sub_overflow(x, y, &r);
    } else if (op == "Mul") {
      overflow = __builtin_mul_overflow(x, y, &r);
    } else if (op == "Mod") {
      if (y == 0) return NodeError(node, absl::StrCat("integer ", x, " mod 0"));
      if (y == -1) {
        r = 0;  // x % -1 overflows for INT64_MIN in C++
      } else {
        r = x % y;
        if (!fmod && r != 0 && ((r < 0) != (y < 0))) r += y;
      }
    } else {
      if (y <= 0 || x < 0) {
        return NodeError(node, absl::StrCat("integer division ", x, " / ", y,
                                            " (only non-negative by positive)"));
      }
      r = x / y;
    }
    if (overflow) return NodeError(node, "integer arithmetic overflows");
    out.values[i] = r;
  }
  return cx.DefineInts(node, 0, std::move(out));
}

void AddShapeOps(OnnxHandlers& handlers) {
  handlers["Mod"] = Mod;
  handlers["Shape"] = ShapeOf;
  handlers["Gather"] = Gather;
  handlers["ConstantOfShape"] = ConstantOfShape;
  handlers["Range"] = Range;
  handlers["DepthToSpace"] = [](ImportContext& cx, const onnx::NodeProto& node) {
    return MoveBlocks(cx, node, /*to_space=*/true);
  };
  handlers["SpaceToDepth"] = [](ImportContext& cx, const onnx::NodeProto& node) {
    return MoveBlocks(cx, node, /*to_space=*/false);
  };
  for (const bool unsqueeze : {true, false}) {
    handlers[unsqueeze ? "Unsqueeze" : "Squeeze"] = [unsqueeze](ImportContext& cx,
                                                                const onnx::NodeProto& node) {
      return SqueezeOrUnsqueeze(cx, node, unsqueeze);
    };
  }
  handlers["Transpose"] = Transpose;
  handlers["Slice"] = Slice;
  handlers["Split"] = Split;
  handlers["Flatten"] = Flatten;
  handlers["Reshape"] = Reshape;
  handlers["Concat"] = Concat;
  handlers["Tile"] = Tile;
  handlers["ReduceProd"] = ReduceProd;
  handlers["Identity"] = Identity;
  handlers["Constant"] = Constant;
}

}  // namespace pebble::onnx_import
