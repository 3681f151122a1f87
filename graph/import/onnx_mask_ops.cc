// ONNX comparisons, logic, Where, Cast, Sign, Max and Min: over constants
// and shapes they fold at import; over computed tensors they become
// pebble's `compare` (a u8 truth value per element) and `masked_fill`,
// which express `torch.where`, `masked_fill`, `nn.Hardshrink` and a padding
// mask computed from token ids, and `maximum` and `minimum`; a Cast of a
// computed tensor to another type becomes `cast` (docs/import.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/import/onnx_context.h"
#include "graph/import/onnx_ops.h"
#include "graph/import/onnx_util.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::onnx_import {
namespace {

// ONNX's comparison and logic operators and pebble's compare op for each.
const std::map<std::string, std::string>& CompareOps() {
  static const auto* const ops = new std::map<std::string, std::string>{
      {"Equal", "eq"}, {"Greater", "gt"},     {"GreaterOrEqual", "ge"},
      {"Less", "lt"},  {"LessOrEqual", "le"}, {"And", "and"},
      {"Or", "or"},    {"Xor", "ne"}};
  return *ops;
}

// Where's values: x's where c is not 0, else y's, each of c's size or of
// one element; nullopt where a size differs otherwise.
template <typename C, typename T>
std::optional<std::vector<T>> Selected(const std::vector<C>& c, const std::vector<T>& x,
                                       const std::vector<T>& y) {
  const size_t n = c.size();
  for (const std::vector<T>* t : {&x, &y}) {
    if (t->size() != n && t->size() != 1) return std::nullopt;
  }
  std::vector<T> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = c[i] != 0 ? x[x.size() == 1 ? 0 : i] : y[y.size() == 1 ? 0 : i];
  }
  return out;
}

// Whether input `name` is a constant read by value (a Constant, a folded
// value, a constant initializer) rather than a computed tensor or a
// parameter. A scalar one stays a constant after ImportContext::Get made a
// `fill` of it for an earlier reader.
bool IsConstant(const ImportContext& cx, const std::string& name) {
  return cx.ConstTensor(name) != nullptr && !cx.IsParameterLike(name);
}

// The value of a constant operand of one value (a threshold, a fill value;
// the zeros nn.MultiheadAttention's export makes a float padding mask from,
// of any shape), or nullopt where `name` is computed or another constant.
std::optional<double> ScalarConstant(const ImportContext& cx, const std::string& name) {
  if (!IsConstant(cx, name)) return std::nullopt;
  const onnx::TensorProto* t = cx.ConstTensor(name);
  if (std::optional<bool> b = BoolScalar(*t)) return *b ? 1.0 : 0.0;
  if (std::optional<double> v = NumberScalar(*t)) return v;
  std::optional<Numbers> numbers = cx.KnownNumbers(name);
  if (!numbers || numbers->values.empty()) return std::nullopt;
  const double first = numbers->values.front();
  for (double v : numbers->values) {
    if (!(v == first)) return std::nullopt;
  }
  return first;
}

// The dims of input `name` as written: a constant's, a computed value's.
std::optional<Shape> DimsOf(const ImportContext& cx, const std::string& name) {
  if (const onnx::TensorProto* t = cx.ConstTensor(name); t != nullptr && IsConstant(cx, name)) {
    return Shape(t->dims().begin(), t->dims().end());
  }
  if (const Value* v = cx.Find(name)) return cx.nb().type(*v).shape;
  if (const onnx::TensorProto* t = cx.ConstTensor(name)) {  // a parameter not yet read
    return Shape(t->dims().begin(), t->dims().end());
  }
  return std::nullopt;
}

// masked_fill's `value` attr: a number, or "inf" / "-inf" (JSON has no
// infinities); NaN is refused.
absl::StatusOr<Json> FillValue(const onnx::NodeProto& node, double value) {
  if (std::isnan(value)) return NodeError(node, "a NaN fill value is not supported");
  if (std::isinf(value)) return Json(value > 0 ? "inf" : "-inf");
  return Json(value);
}

// A `fill` of `value` (infinities as masked_fill takes them), `dims` and
// `dtype`: an Aux of `node`.
absl::StatusOr<Value> FillOf(ImportContext& cx, const onnx::NodeProto& node, const Shape& dims,
                             DType dtype, double value, absl::string_view suffix) {
  ASSIGN_OR_RETURN(Json v, FillValue(node, value));
  return cx.Aux(node, "fill", {},
                {{"shape", std::vector<int64_t>(dims.begin(), dims.end())},
                 {"dtype", std::string(DTypeName(dtype))},
                 {"value", std::move(v)}},
                suffix);
}

// Operand `i` of a comparison whose other operand is the computed `like`:
// computed, or a one-value constant made a `fill` of like's dtype and the
// constant's dims. An integer constant must be one a double holds exactly
// (at most 2^53 in magnitude) and one of like's type can hold: the fill
// carries it as a double.
absl::StatusOr<Value> ComparedOperand(ImportContext& cx, const onnx::NodeProto& node, int i,
                                      Value like) {
  const std::string& name = node.input(i);
  if (!IsConstant(cx, name)) return cx.Get(node, name);  // computed, or a parameter
  std::optional<double> value = ScalarConstant(cx, name);
  if (!value) return cx.Get(node, name);  // the error naming the constant
  const onnx::TensorProto* t = cx.ConstTensor(name);
  if (absl::StatusOr<std::vector<int64_t>> ints = IntValues(*t); ints.ok()) {
    for (int64_t v : *ints) {
      if (v > (int64_t{1} << 53) || v < -(int64_t{1} << 53)) {
        return NodeError(node, absl::StrCat("the constant ", Quote(name), " holds ", v,
                                            ", beyond 2^53 (not supported)"));
      }
    }
  }
  const DType dtype = cx.nb().type(like).dtype;
  if (!ops_internal::IsFloat(dtype) && !(std::isfinite(*value) && *value == std::floor(*value))) {
    return NodeError(node, absl::StrCat("the constant ", Quote(name), " (", *value,
                                        ") is compared with an integer tensor (not supported)"));
  }
  return FillOf(cx, node, *DimsOf(cx, name), dtype, *value, absl::StrCat("operand", i));
}

// A comparison or logic operator of two constants (a mask built in the
// forward: torch.tril(torch.ones(L, L)) == 0, r[:, None] >= r[None, :]),
// folded into a boolean constant under broadcasting.
absl::Status FoldComparison(ImportContext& cx, const onnx::NodeProto& node, const std::string& op) {
  std::optional<Numbers> a = cx.KnownNumbers(node.input(0)), b = cx.KnownNumbers(node.input(1));
  if (!a || !b) {
    return NodeError(node, absl::StrCat(node.op_type(), " of constants of these types is not "
                                                        "supported (of float, integer and "
                                                        "boolean ones it folds)"));
  }
  const bool xor_op = node.op_type() == "Xor";
  const std::optional<Numbers> out = BroadcastFold(*a, *b, [&op, xor_op](double x, double y) {
    return op == "eq"    ? x == y
           : op == "ne"  ? (xor_op ? (x != 0) != (y != 0) : x != y)
           : op == "lt"  ? x < y
           : op == "le"  ? x <= y
           : op == "gt"  ? x > y
           : op == "ge"  ? x >= y
           : op == "and" ? (x != 0 && y != 0)
                         : (x != 0 || y != 0);
  });
  if (!out.has_value()) {
    return NodeError(node, absl::StrCat(node.op_type(), " of constants of shapes ",
                                        ShapeToString(a->dims), " and ", ShapeToString(b->dims),
                                        " is not supported (they do not broadcast, or make more "
                                        "than 2^20 values)"));
  }
  return cx.DefineFolded(node, *TypedTensor(onnx::TensorProto::BOOL, out->dims, out->values));
}

// A comparison or logic operator: folded over integers known at import
// (Equal of shapes: Expand's), else a `compare` of the computed operand(s).
absl::Status Comparison(ImportContext& cx, const onnx::NodeProto& node, const std::string& op) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  std::optional<Ints> a = cx.KnownInts(node.input(0)), b = cx.KnownInts(node.input(1));
  if (a && b && op == "eq") {
    if (a->values.size() != b->values.size() && b->values.size() != 1) {
      return NodeError(node, "Equal of integer constants of different sizes is not supported");
    }
    Ints out = *a;
    for (size_t i = 0; i < out.values.size(); ++i) {
      out.values[i] = a->values[i] == b->values[b->values.size() == 1 ? 0 : i] ? 1 : 0;
    }
    return cx.DefineInts(node, 0, std::move(out));
  }
  const int computed = !IsConstant(cx, node.input(0)) ? 0 : !IsConstant(cx, node.input(1)) ? 1
                                                                                          : -1;
  if (computed < 0) return FoldComparison(cx, node, op);
  const bool logic = op == "and" || op == "or" || node.op_type() == "Xor";
  if (logic) {
    for (int i = 0; i < 2; ++i) {
      if (!IsConstant(cx, node.input(i)) && !IsBoolean(cx, node.input(i))) {
        return NodeError(node, absl::StrCat("input ", Quote(node.input(i)),
                                            " is not a boolean computed by a comparison"));
      }
    }
  }
  ASSIGN_OR_RETURN(const Value like, cx.Get(node, node.input(computed)));
  ASSIGN_OR_RETURN(Value x, ComparedOperand(cx, node, 0, like));
  ASSIGN_OR_RETURN(Value y, ComparedOperand(cx, node, 1, like));
  return cx.Apply(node, "compare", {x, y}, {{"op", op}});
}

// Max or Min of integers known at import (shape arithmetic), folded: each
// operand of the largest's size or of one element.
absl::Status FoldExtremum(ImportContext& cx, const onnx::NodeProto& node,
                          const std::vector<Ints>& operands, bool maximum) {
  const Ints* largest = &operands.front();
  for (const Ints& k : operands) {
    if (k.values.size() > largest->values.size()) largest = &k;
  }
  Ints out = *largest;
  for (const Ints& k : operands) {
    if (k.values.size() != out.values.size() && k.values.size() != 1) {
      return NodeError(node, absl::StrCat(node.op_type(), " of integer constants of ",
                                          k.values.size(), " and ", out.values.size(),
                                          " values is not supported"));
    }
    for (size_t i = 0; i < out.values.size(); ++i) {
      const int64_t v = k.values[k.values.size() == 1 ? 0 : i];
      out.values[i] = maximum ? std::max(out.values[i], v) : std::min(out.values[i], v);
    }
  }
  return cx.DefineInts(node, 0, std::move(out));
}

// Max or Min (torch.maximum, torch.minimum, torch.max(a, b)): folded over
// integers known at import; of float tensors, pebble's maximum or minimum
// of the operands expanded to their broadcast shape (a one-value constant
// made a fill), pairwise from the left. Their gradients are ATen's: the
// larger (smaller) operand's, half each at a tie.
absl::Status Extremum(ImportContext& cx, const onnx::NodeProto& node, bool maximum) {
  if (node.input_size() < 1) return NodeError(node, "has no inputs");
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  std::vector<Ints> known;
  for (const std::string& name : node.input()) {
    if (std::optional<Ints> k = cx.KnownInts(name)) known.push_back(*std::move(k));
  }
  if (known.size() == static_cast<size_t>(node.input_size())) {
    return FoldExtremum(cx, node, known, maximum);
  }
  int computed = -1;
  for (int i = 0; i < node.input_size() && computed < 0; ++i) {
    if (!IsConstant(cx, node.input(i))) computed = i;
  }
  if (computed < 0) {
    return NodeError(node, absl::StrCat(node.op_type(), " of float constants is not supported "
                                                        "(of computed tensors, or of integer "
                                                        "shapes, it is)"));
  }
  ASSIGN_OR_RETURN(const Value like, cx.Get(node, node.input(computed)));
  const DType dtype = cx.nb().type(like).dtype;
  if (!ops_internal::IsFloat(dtype)) {
    return NodeError(node, absl::StrCat(node.op_type(), " of ", DTypeName(dtype),
                                        " tensors is not supported (of float tensors it is)"));
  }
  std::optional<Shape> shape = cx.nb().type(like).shape;
  for (const std::string& name : node.input()) {
    std::optional<Shape> dims = DimsOf(cx, name);
    if (!dims) return cx.Get(node, name).status();  // the error naming it
    shape = ops_internal::BroadcastShapes(*shape, *dims);
    if (!shape) return NodeError(node, "its operands do not broadcast");
  }
  std::vector<Value> operands;
  for (int i = 0; i < node.input_size(); ++i) {
    ASSIGN_OR_RETURN(Value v, ComparedOperand(cx, node, i, like));
    if (cx.nb().type(v).dtype != dtype) {
      return NodeError(node, absl::StrCat("its operands ", Quote(node.input(computed)), " and ",
                                          Quote(node.input(i)), " differ in dtype"));
    }
    ASSIGN_OR_RETURN(v, ExpandTo(cx, node, v, *shape, absl::StrCat("operand", i, "_expanded")));
    operands.push_back(v);
  }
  const char* op = maximum ? "maximum" : "minimum";
  Value result = operands.front();
  for (size_t i = 1; i + 1 < operands.size(); ++i) {
    ASSIGN_OR_RETURN(result, cx.Aux(node, op, {result, operands[i]}, Json::object(),
                                    absl::StrCat(op, i)));
  }
  if (operands.size() == 1) return cx.Define(node, result);
  return cx.Apply(node, op, {result, operands.back()});
}

// Sign (torch.sign): 1 where x > 0, -1 where x < 0, else 0 (zeros and NaN,
// as ATen's CPU kernel), written into zeros by two masks; no gradient
// flows back, as ATen's is zero.
absl::Status Sign(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(const Value x, cx.Get(node, node.input(0)));
  const TensorType type = cx.nb().type(x);
  if (!ops_internal::IsFloat(type.dtype)) {
    return NodeError(node, absl::StrCat("Sign of a ", DTypeName(type.dtype),
                                        " tensor is not supported (of a float tensor it is)"));
  }
  ASSIGN_OR_RETURN(const Value zero, cx.Fill(node, {}, x, 0.0, "zero"));
  ASSIGN_OR_RETURN(const Value positive,
                   cx.Aux(node, "compare", {x, zero}, {{"op", "gt"}}, "positive"));
  ASSIGN_OR_RETURN(const Value negative,
                   cx.Aux(node, "compare", {x, zero}, {{"op", "lt"}}, "negative"));
  ASSIGN_OR_RETURN(Value sign, FillOf(cx, node, type.shape, type.dtype, 0.0, "zeros"));
  ASSIGN_OR_RETURN(sign, cx.Aux(node, "masked_fill", {sign, positive}, {{"value", 1.0}}, "ones"));
  return cx.Apply(node, "masked_fill", {sign, negative}, {{"value", -1.0}});
}

// A constant's type and values (as KnownNumbers reads them), or nullopt
// where `name` is computed or of another type than FLOAT, BOOL and INT64.
std::optional<std::pair<int, Numbers>> TypedConstant(const ImportContext& cx,
                                                     const std::string& name) {
  if (!IsConstant(cx, name)) return std::nullopt;
  const int type = cx.ConstTensor(name)->data_type();
  if (type != onnx::TensorProto::FLOAT && !IsHalfType(type) && type != onnx::TensorProto::BOOL &&
      type != onnx::TensorProto::INT64) {
    return std::nullopt;
  }
  std::optional<Numbers> numbers = cx.KnownNumbers(name);
  if (!numbers) return std::nullopt;
  return std::pair{type, *std::move(numbers)};
}

// Trilu (torch.tril, torch.triu) of a constant, folded: a band or causal
// mask the forward builds. Elements (i, j) of the last two dims are kept
// where j - i >= k (upper) or j - i <= k (lower), the others zero.
absl::Status Trilu(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 2));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"upper"}));
  ASSIGN_OR_RETURN(const int64_t upper, attrs.Int("upper", 1));
  int64_t k = 0;
  if (node.input_size() > 1 && !node.input(1).empty()) {
    ASSIGN_OR_RETURN(const std::vector<int64_t> ks, cx.ConstInts(node, 1));
    if (ks.size() != 1) return NodeError(node, "its k must be one integer");
    k = ks[0];
  }
  std::optional<std::pair<int, Numbers>> x = TypedConstant(cx, node.input(0));
  if (!x || x->second.dims.size() < 2) {
    return NodeError(node, absl::StrCat("Trilu of ", Quote(node.input(0)),
                                        " is not supported: it folds a float, boolean or int64 "
                                        "constant of 2 or more dims (a mask), which this is not"));
  }
  auto& [type, numbers] = *x;
  const int64_t rows = numbers.dims[numbers.dims.size() - 2];
  const int64_t cols = numbers.dims.back();
  auto kept = [&](size_t e) {
    const int64_t i = static_cast<int64_t>(e) / cols % rows, j = static_cast<int64_t>(e) % cols;
    return upper != 0 ? j - i >= k : j - i <= k;
  };
  if (type == onnx::TensorProto::INT64) {  // (every bit of an int64, not a double's 53)
    std::optional<Ints> ints = cx.KnownInts(node.input(0));
    if (!ints) return NodeError(node, "its int64 constant cannot be read");
    for (size_t e = 0; e < ints->values.size(); ++e) {
      if (!kept(e)) ints->values[e] = 0;
    }
    return cx.DefineInts(node, 0, *std::move(ints));
  }
  for (size_t e = 0; e < numbers.values.size(); ++e) {
    if (!kept(e)) numbers.values[e] = 0;
  }
  return cx.DefineFolded(node, *TypedTensor(type, numbers.dims, numbers.values));
}

// Not of a boolean: compare equal to 0; of a boolean constant, folded.
absl::Status Not(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  if (std::optional<std::pair<int, Numbers>> c = TypedConstant(cx, node.input(0));
      c && c->first == onnx::TensorProto::BOOL) {
    for (double& v : c->second.values) v = v == 0;
    return cx.DefineFolded(node, *TypedTensor(c->first, c->second.dims, c->second.values));
  }
  if (IsConstant(cx, node.input(0)) || !IsBoolean(cx, node.input(0))) {
    return NodeError(node, "only Not of a boolean computed by a comparison is supported");
  }
  ASSIGN_OR_RETURN(const Value x, cx.Get(node, node.input(0)));
  ASSIGN_OR_RETURN(Value zero, cx.Fill(node, {}, x, 0.0, "zero"));
  return cx.Apply(node, "compare", {x, zero}, {{"op", "eq"}});
}

// Where(c, x, y) of computed tensors (c may be a constant boolean mask):
// with a constant x (y), y (x) filled with it where c says
// (masked_fill(scores, pad, -inf); torch.where(c, x, 0)); with both
// computed, the sum of each with the other's elements set to -0.0, each
// gradient where its side was taken (as PyTorch's where).
absl::Status WhereComputed(ImportContext& cx, const onnx::NodeProto& node) {
  const std::string &c_name = node.input(0), &x_name = node.input(1), &y_name = node.input(2);
  // A constant condition is a `constant` mask (ImportContext::Get), read
  // as bool whatever type a fold left it in (Equal of integers folds to
  // int64 0 and 1).
  if (IsConstant(cx, c_name)) {
    std::optional<Numbers> c = cx.KnownNumbers(c_name);
    if (!c || !std::all_of(c->values.begin(), c->values.end(),
                           [](double v) { return v == 0 || v == 1; })) {
      return NodeError(node, absl::StrCat("the constant condition ", Quote(c_name),
                                          " is not a mask of 0 and 1 (not supported)"));
    }
    cx.NoteCastTo(c_name, onnx::TensorProto::BOOL);
  }
  ASSIGN_OR_RETURN(const Value cv, cx.Get(node, c_name));
  const Value* c = &cv;
  std::optional<Shape> shape = cx.nb().type(*c).shape;
  for (const std::string* name : {&x_name, &y_name}) {
    std::optional<Shape> dims = DimsOf(cx, *name);
    if (!dims) return cx.Get(node, *name).status();  // the error naming it
    shape = ops_internal::BroadcastShapes(*shape, *dims);
    if (!shape) return NodeError(node, "its operands do not broadcast");
  }
  const std::optional<double> x_value = ScalarConstant(cx, x_name);
  const std::optional<double> y_value = ScalarConstant(cx, y_name);
  const std::vector<int64_t> dims(shape->begin(), shape->end());
  if (x_value && y_value) {  // torch.where(c, 1.0, 0.0), torch.where(c, 0.0, -inf)
    const absl::StatusOr<DType> dtype = DTypeOfOnnx(cx.ConstTensor(x_name)->data_type());
    if (!dtype.ok() || !ops_internal::IsFloat(*dtype)) {
      return NodeError(node, "a Where of two integer or boolean constants over a computed "
                             "condition is not supported (of float constants it is)");
    }
    ASSIGN_OR_RETURN(Value base, FillOf(cx, node, *shape, *dtype, *y_value, "else"));
    ASSIGN_OR_RETURN(Json value, FillValue(node, *x_value));
    return cx.Apply(node, "masked_fill", {base, *c}, {{"value", value}});
  }
  if (x_value || y_value) {
    const std::string& computed = x_value ? y_name : x_name;
    ASSIGN_OR_RETURN(Value v, cx.Get(node, computed));
    ASSIGN_OR_RETURN(v, ExpandTo(cx, node, v, *shape, "expanded"));
    ASSIGN_OR_RETURN(Json value, FillValue(node, x_value ? *x_value : *y_value));
    // y is kept where c is 0 (fill where c is not); x where c is not.
    return cx.Apply(node, "masked_fill", {v, *c},
                    {{"value", value}, {"invert", y_value.has_value()}});
  }
  ASSIGN_OR_RETURN(Value x, cx.Get(node, x_name));
  ASSIGN_OR_RETURN(Value y, cx.Get(node, y_name));
  ASSIGN_OR_RETURN(x, ExpandTo(cx, node, x, *shape, "x"));
  ASSIGN_OR_RETURN(y, ExpandTo(cx, node, y, *shape, "y"));
  // The side not taken is -0.0, which adds to every value v, 0.0 and -0.0
  // included, exactly v (IEEE 754): the sum is the side taken, bit for bit.
  ASSIGN_OR_RETURN(Value x_taken, cx.Aux(node, "masked_fill", {x, *c},
                                         {{"value", -0.0}, {"invert", true}}, "then"));
  ASSIGN_OR_RETURN(Value y_taken,
                   cx.Aux(node, "masked_fill", {y, *c}, {{"value", -0.0}}, "else"));
  return cx.Apply(node, "add", {x_taken, y_taken});
}

// Where over integer constants and shapes (Expand's shape), folded; over
// other constants (a boolean mask made an additive one: -inf where masked,
// 0 elsewhere), folded into a float constant; over computed tensors,
// WhereComputed.
absl::Status Where(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 3, 3));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  const bool computed = !IsConstant(cx, node.input(0)) || !IsConstant(cx, node.input(1)) ||
                        !IsConstant(cx, node.input(2));
  if (computed) return WhereComputed(cx, node);
  std::optional<Ints> c = cx.KnownInts(node.input(0)), x = cx.KnownInts(node.input(1)),
                      y = cx.KnownInts(node.input(2));
  if (c && x && y) {
    if (auto values = Selected(c->values, x->values, y->values)) {
      return cx.DefineInts(node, 0, Ints{c->dims, *std::move(values)});
    }
  } else {
    std::optional<Numbers> cn = cx.KnownNumbers(node.input(0)),
                           xn = cx.KnownNumbers(node.input(1)),
                           yn = cx.KnownNumbers(node.input(2));
    if (cn && xn && yn) {
      if (auto values = Selected(cn->values, xn->values, yn->values)) {
        return cx.DefineFolded(node, FloatTensor(cn->dims, *values, xn->data_type));
      }
    }
  }
  return NodeError(node, "Where over constants is supported only where the constants are of "
                         "one size or one element");
}

// Cast of a computed tensor: to its own type, none; to a boolean, 1 where
// not 0 (a `compare` with 0); to any other type pebble has (a mask to 0/1,
// a uint8 image or int64 ids to floats, floats to fp16 or to integers), a
// `cast` node (Note [Cast values], runtime/kernel_math.h).
absl::Status CastComputed(ImportContext& cx, const onnx::NodeProto& node, Value x, int64_t to) {
  const DType from = cx.nb().type(x).dtype;
  const bool boolean = from == DType::kUInt8 && IsBoolean(cx, node.input(0));
  if (to == onnx::TensorProto::BOOL) {
    if (boolean) return cx.Define(node, x);
    ASSIGN_OR_RETURN(Value zero, cx.Fill(node, {}, x, 0.0, "zero"));
    return cx.Apply(node, "compare", {x, zero}, {{"op", "ne"}});
  }
  absl::StatusOr<DType> to_dtype = DTypeOfOnnx(static_cast<int>(to));
  if (!to_dtype.ok()) {
    return NodeError(node, absl::StrCat("a cast of a computed tensor: ",
                                        to_dtype.status().message()));
  }
  // (a boolean to uint8 keeps its 0/1 bytes; IsBoolean no longer takes it
  // for a mask)
  if (*to_dtype == from) return cx.Define(node, x);
  return cx.Apply(node, "cast", {x}, {{"dtype", std::string(DTypeName(*to_dtype))}});
}

// Note [Casts of constants]. A Cast of a constant whose values it keeps
// (integers or booleans to float, integral floats or booleans to int64, 0
// and 1 to bool, a type to itself) leaves the tensor as it is, so that the
// shape arithmetic of an export (Cast of a Shape to float and back) folds
// as integers, and notes the type for a computation that reads it
// (ImportContext::NoteCastTo). One that changes values (float to int,
// truncated toward zero as ONNX's Cast; any number to bool, 1 where not 0)
// folds into a tensor of the new values, int64 for int64 and int32, bool
// for bool; to a narrower integer type, or of a value no int64 holds, it is
// refused. (Until 2026-12-07 every such cast kept the values it was given:
// (x * 0.7).long() computed with 0.7, 1.4, ...) A cast to float16 or
// bfloat16 folds into a tensor of that type, each value rounded to float
// and then to it (FloatTensor; an integer rounds twice, as PyTorch's does).
absl::Status CastConstant(ImportContext& cx, const onnx::NodeProto& node,
                          const onnx::TensorProto& t, int64_t to) {
  const std::string& name = node.input(0);
  const bool to_int = to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32 ||
                      to == onnx::TensorProto::INT16 || to == onnx::TensorProto::INT8 ||
                      to == onnx::TensorProto::UINT8;
  const bool to_bool = to == onnx::TensorProto::BOOL;
  std::optional<Numbers> numbers = cx.KnownNumbers(name);
  if (numbers.has_value() && to != t.data_type() && IsHalfType(static_cast<int>(to))) {
    return cx.DefineFolded(node, FloatTensor(numbers->dims, numbers->values, static_cast<int>(to)));
  }
  bool changes = false;
  if (numbers.has_value() && (to_int || to_bool)) {
    for (double v : numbers->values) {
      changes |= to_bool ? (v != 0 && v != 1) : v != std::trunc(v);
    }
  }
  constexpr double kTwo63 = 9223372036854775808.0;
  if (changes && to_int &&
      ((to != onnx::TensorProto::INT64 && to != onnx::TensorProto::INT32) ||
       !std::all_of(numbers->values.begin(), numbers->values.end(),
                    [](double v) { return v > -kTwo63 && v < kTwo63; }))) {
    return NodeError(node, absl::StrCat("a Cast of the constant ", Quote(name), " to ",
                                        onnx::TensorProto::DataType_Name(static_cast<int>(to)),
                                        " that changes its values is not supported (to int64 or "
                                        "int32 of values an int64 holds it folds)"));
  }
  if (!changes) {
    cx.SetConstant(node.output(0), &t);
    if (to != t.data_type()) cx.NoteCastTo(node.output(0), static_cast<int>(to));
    return absl::OkStatus();
  }
  for (double& v : numbers->values) v = to_bool ? (v != 0) : std::trunc(v);
  return cx.DefineFolded(node, *TypedTensor(to_bool ? onnx::TensorProto::BOOL
                                                    : onnx::TensorProto::INT64,
                                            numbers->dims, numbers->values));
}

// Cast of a constant (torch.clamp casts its scalar bounds): CastConstant;
// of a computed tensor: CastComputed.
absl::Status Cast(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"to", "saturate"}));
  if (node.output_size() != 1 || node.output(0).empty()) return NodeError(node, "has no output");
  ASSIGN_OR_RETURN(const int64_t to, attrs.Int("to", 0));
  if (const onnx::TensorProto* t = cx.ConstTensor(node.input(0))) return CastConstant(cx, node, *t, to);
  ASSIGN_OR_RETURN(const Value x, cx.Get(node, node.input(0)));  // or the error naming it
  return CastComputed(cx, node, x, to);
}

}  // namespace

bool IsBoolean(const ImportContext& cx, const std::string& name) {
  static const auto* const kViews = new std::set<std::string>{
      "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Identity", "Slice",
      "Expand"};
  for (const onnx::NodeProto* p = cx.Producer(name); p != nullptr;
       p = p->input_size() > 0 ? cx.Producer(p->input(0)) : nullptr) {
    const std::string& op = p->op_type();
    if (CompareOps().contains(op) || op == "Not") return true;
    if (op == "Cast") {
      for (const onnx::AttributeProto& a : p->attribute()) {
        if (a.name() == "to") return a.i() == onnx::TensorProto::BOOL;
      }
      return false;
    }
    if (!kViews->contains(op)) return false;
  }
  return false;
}

void AddMaskOps(OnnxHandlers& handlers) {
  for (const auto& [onnx_op, op] : CompareOps()) {
    handlers[onnx_op] = [op = op](ImportContext& cx, const onnx::NodeProto& node) {
      return Comparison(cx, node, op);
    };
  }
  handlers["Not"] = Not;
  handlers["Max"] = [](ImportContext& cx, const onnx::NodeProto& node) {
    return Extremum(cx, node, true);
  };
  handlers["Min"] = [](ImportContext& cx, const onnx::NodeProto& node) {
    return Extremum(cx, node, false);
  };
  handlers["Sign"] = Sign;
  handlers["Trilu"] = Trilu;
  handlers["Where"] = Where;
  handlers["Cast"] = Cast;
}

}  // namespace pebble::onnx_import
