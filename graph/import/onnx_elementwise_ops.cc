// ONNX activations and arithmetic as pebble operators, NumPy broadcasting
// lowered to the operator table's (see onnx_ops.h and docs/import.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
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

// A unary op's value at x, for the ops that fold over constants (FoldUnary).
std::optional<double> UnaryValue(absl::string_view op, double x) {
  if (op == "exp") return std::exp(x);
  if (op == "log") return std::log(x);
  if (op == "sqrt") return std::sqrt(x);
  if (op == "abs") return std::abs(x);
  if (op == "tanh") return std::tanh(x);
  if (op == "sigmoid") return 1 / (1 + std::exp(-x));
  if (op == "erf") return std::erf(x);
  if (op == "relu") return x > 0 ? x : 0.0;
  return std::nullopt;
}

// A unary op of a float constant of several values (the frequencies of a
// sinusoidal table, exp of arange times a scale), folded, each value in
// float; a scalar stays computed, as it always was.
bool FoldUnary(ImportContext& cx, const onnx::NodeProto& node, absl::string_view op) {
  const onnx::TensorProto* t = cx.ConstTensor(node.input(0));
  if (t == nullptr || cx.IsParameterLike(node.input(0)) || !UnaryValue(op, 0.5).has_value()) {
    return false;
  }
  std::optional<Numbers> x = cx.KnownNumbers(node.input(0));
  if (!x || x->values.size() < 2 || !IsFloatType(t->data_type()) ||
      x->data_type == onnx::TensorProto::DOUBLE) {
    return false;
  }
  for (double& v : x->values) v = *UnaryValue(op, static_cast<float>(v));
  return cx.DefineFolded(node, FloatTensor(x->dims, x->values, x->data_type)).ok();
}

absl::Status Unary(ImportContext& cx, const onnx::NodeProto& node, absl::string_view op) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  if (FoldUnary(cx, node, op)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  return cx.Apply(node, op, in);
}

absl::Status HardSigmoid(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"alpha", "beta"}));
  ASSIGN_OR_RETURN(double alpha, attrs.Float("alpha", 0.2));  // ONNX's defaults
  ASSIGN_OR_RETURN(double beta, attrs.Float("beta", 0.5));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  return cx.Apply(node, "hardsigmoid", in, {{"alpha", alpha}, {"beta", beta}});
}

absl::Status LeakyRelu(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"alpha"}));
  ASSIGN_OR_RETURN(double slope, attrs.Float("alpha", 0.01));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  return cx.Apply(node, "leaky_relu", in, {{"negative_slope", slope}});
}

// Elu (nn.ELU), Selu (nn.SELU) and Celu (nn.CELU) as pebble's elu, whose
// three coefficients (ATen's) cover them all: Selu is elu of scale gamma,
// Celu elu of input_scale 1 / alpha. The defaults are ONNX's (Selu's are
// PyTorch's constants rounded to float).
absl::Status EluFamily(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  const bool selu = node.op_type() == "Selu", celu = node.op_type() == "Celu";
  RETURN_IF_ERROR(selu ? attrs.OnlyKnown({"alpha", "gamma"}) : attrs.OnlyKnown({"alpha"}));
  ASSIGN_OR_RETURN(const double alpha,
                   attrs.Float("alpha", selu ? 1.67326319217681884765625 : 1.0));
  ASSIGN_OR_RETURN(const double gamma,
                   selu ? attrs.Float("gamma", 1.05070102214813232421875)
                        : absl::StatusOr<double>(1.0));
  if (celu && alpha == 0) return attrs.Unsupported("alpha", "0", "CELU divides by alpha");
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  return cx.Apply(node, "elu", in,
                  {{"alpha", alpha}, {"scale", gamma}, {"input_scale", celu ? 1 / alpha : 1.0}});
}

// Softplus: log(1 + exp(x)), as PyTorch's F.softplus of beta 1 computes
// it, which returns x itself past a threshold of 20 (the same in float).
// PyTorch exports another beta as Softplus(beta x) / beta.
absl::Status Softplus(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  return cx.Apply(node, "softplus", in, {{"beta", 1.0}, {"threshold", 20.0}});
}

// Clip (opset 11 on): optional constant min and max inputs; ReLU6 is
// Clip(x, 0, 6).
absl::Status Clip(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 3));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  Json attrs = Json::object();
  for (int i = 1; i < node.input_size(); ++i) {
    if (node.input(i).empty()) continue;
    const onnx::TensorProto* t = cx.ConstTensor(node.input(i));
    std::optional<double> v = t == nullptr ? std::nullopt : NumberScalar(*t);
    if (!v.has_value() || !std::isfinite(*v)) {
      return NodeError(node,
                       absl::StrCat(i == 1 ? "min" : "max", " must be a constant finite scalar"));
    }
    attrs[i == 1 ? "min" : "max"] = *v;
  }
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  return cx.Apply(node, "clip", {x}, std::move(attrs));
}

absl::StatusOr<Value> Broadcast(ImportContext& cx, const onnx::NodeProto& node,
                                absl::string_view op, Value a, Value b, absl::string_view suffix);

// How far above 0 every element of `name` is whatever the model's inputs
// and parameters (Note [Pow of a positive base]). kNormal: at least the
// smallest normal float (kSmallestNormal), as a constant of such values, a
// Clip whose min is that much, and means, maxima and views of such.
// kPositive: above 0 in exact arithmetic but perhaps rounded to 0 in float,
// as a positive constant, a Clip with a positive min, Sigmoid, Exp,
// Softplus, and products, sums and powers of positives. kNone: neither.
// `depth` bounds the walk up the producers.
enum class LowerBound { kNone, kPositive, kNormal };
constexpr double kSmallestNormal = 1.1754943508222875e-38;  // FLT_MIN
LowerBound BoundOf(const ImportContext& cx, const std::string& name, int depth = 0) {
  constexpr int kMaxDepth = 16;
  if (depth > kMaxDepth) return LowerBound::kNone;
  if (std::optional<Numbers> c = cx.KnownNumbers(name)) {
    auto all = [&c](auto above) { return std::all_of(c->values.begin(), c->values.end(), above); };
    if (c->values.empty() || !all([](double v) { return v > 0; })) return LowerBound::kNone;
    return all([](double v) { return v >= kSmallestNormal; }) ? LowerBound::kNormal
                                                              : LowerBound::kPositive;
  }
  const onnx::NodeProto* p = cx.Producer(name);
  if (p == nullptr || p->input_size() == 0) return LowerBound::kNone;
  const std::string& op = p->op_type();
  auto bound = [&](int i) {
    return i < p->input_size() && !p->input(i).empty() ? BoundOf(cx, p->input(i), depth + 1)
                                                       : LowerBound::kNone;
  };
  if (op == "Sigmoid" || op == "Exp" || op == "Softplus") return LowerBound::kPositive;
  if (op == "Clip") {  // (its min an input from opset 11; a max below it would set every value)
    std::optional<Numbers> min =
        p->input_size() > 1 && !p->input(1).empty() ? cx.KnownNumbers(p->input(1)) : std::nullopt;
    if (!min || min->values.size() != 1 || !(min->values[0] > 0)) return LowerBound::kNone;
    if (p->input_size() > 2 && !p->input(2).empty()) {
      std::optional<Numbers> max = cx.KnownNumbers(p->input(2));
      if (!max || max->values.size() != 1 || !(max->values[0] > 0)) return LowerBound::kNone;
    }
    return min->values[0] >= kSmallestNormal ? LowerBound::kNormal : LowerBound::kPositive;
  }
  static const auto* const kOfTheFirst = new absl::flat_hash_set<std::string>{
      "AveragePool", "GlobalAveragePool", "ReduceMean", "MaxPool", "GlobalMaxPool",
      "ReduceMax", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity",
      "Expand"};
  if (kOfTheFirst->contains(op)) return bound(0);
  if (op == "Pad") {  // (pads of nothing: F.avg_pool2d's export writes one)
    std::optional<Ints> pads = p->input_size() > 1 ? cx.KnownInts(p->input(1)) : std::nullopt;
    const bool nothing = pads && std::all_of(pads->values.begin(), pads->values.end(),
                                             [](int64_t v) { return v == 0; });
    return nothing ? bound(0) : LowerBound::kNone;
  }
  if (op == "Pow") return std::min(bound(0), LowerBound::kPositive);
  if (op == "Mul" || op == "Add" || op == "Div") {
    return std::min({bound(0), bound(1), LowerBound::kPositive});
  }
  return LowerBound::kNone;
}

// x to the integer n (0 < |n| <= kMostProductExponent) by products, x^|n|
// by squaring (x^4 = (x^2)^2), then 1 / x^|n| for a negative n: any base,
// the gradients those of the products (n x^(n-1) in exact arithmetic).
constexpr int kMostProductExponent = 16;
absl::Status IntegerPow(ImportContext& cx, const onnx::NodeProto& node, Value x, int n) {
  const int magnitude = std::abs(n);
  // x^(2^k) for each bit k of |n|; the last product made is the node's own
  // where n > 0 (a power of two: the last square).
  std::vector<Value> factors;
  Value square = x;
  for (int k = 0; (1 << k) <= magnitude; ++k) {
    if (k > 0) {
      if (n > 0 && magnitude == (1 << k)) return cx.Apply(node, "mul", {square, square});
      ASSIGN_OR_RETURN(square, cx.Aux(node, "mul", {square, square}, Json::object(),
                                      k == 1 ? std::string("square") : absl::StrCat("pow", 1 << k)));
    }
    if ((magnitude & (1 << k)) != 0) factors.push_back(square);
  }
  Value product = factors[0];
  for (size_t i = 1; i < factors.size(); ++i) {
    if (n > 0 && i + 1 == factors.size()) return cx.Apply(node, "mul", {product, factors[i]});
    ASSIGN_OR_RETURN(product, cx.Aux(node, "mul", {product, factors[i]}, Json::object(),
                                     absl::StrCat("product", i)));
  }
  ASSIGN_OR_RETURN(Value one, cx.Fill(node, {}, x, 1.0, "one"));  // (n < 0 here)
  return cx.Apply(node, "div", {one, product});
}

// Note [Pow of a positive base]. Pow by a constant exponent that ATen
// computes by products, a square root and a reciprocal
// (pow_tensor_scalar_optimized_kernel) or that products give exactly in
// exact arithmetic: an integer n, 0 < |n| <= 16 (IntegerPow: 2 is x * x, a
// layer norm written out squares the deviation; 3 is (x * x) * x, GPT-2's
// GELU written out; -1 is 1 / x), 0.5 (sqrt) and -0.5 (1 / sqrt), and 1 (x
// itself); the gradients are those of the products, PyTorch's up to
// rounding. Any
// other exponent, a parameter or computed one included (GeM pooling's
// learnable p: x.clamp(min=eps).pow(p), then the mean to the 1/p), where
// the base is positive by construction (BoundOf): exp(p · log x), whose
// value and gradients (p · x^(p-1) for x, x^p · log x for p) are ATen's in
// exact arithmetic, within |p log x| roundings of them in float. Where the
// base may be 0 or negative that form is wrong (log gives NaN), so such a
// Pow is refused. A base that float arithmetic may round to 0 (Sigmoid of
// -100; below LowerBound::kNormal) is clipped to the smallest normal float
// first: there log would be -inf and its gradient NaN, where PyTorch's
// value is 0 (here below 1e-38 for p >= 1) and its gradient 0 (here 0: the
// clip's).
// x ** 0 is a fill of ones (ATen's, NaN ** 0 included), no gradient.
absl::Status Pow(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  // The exponent where it is a constant scalar that no parameter holds.
  std::optional<double> power;
  if (!cx.IsParameterLike(node.input(1))) {
    if (const onnx::TensorProto* e = cx.ConstTensor(node.input(1)); e != nullptr) {
      power = NumberScalar(*e);
    }
  }
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  if (power == 1.0) return cx.Define(node, x);
  if (power == 0.0) {
    const Shape& shape = cx.nb().type(x).shape;
    ASSIGN_OR_RETURN(Value ones, cx.Fill(node, std::vector<int64_t>(shape.begin(), shape.end()),
                                         x, 1.0, "ones"));
    return cx.Define(node, ones);
  }
  if (power == 0.5) return cx.Apply(node, "sqrt", {x});
  if (power == -0.5) {
    ASSIGN_OR_RETURN(Value root, cx.Aux(node, "sqrt", {x}, Json::object(), "sqrt"));
    ASSIGN_OR_RETURN(Value one, cx.Fill(node, {}, x, 1.0, "one"));
    return cx.Apply(node, "div", {one, root});
  }
  if (power.has_value() && *power == std::trunc(*power) && *power != 0 &&
      std::abs(*power) <= kMostProductExponent) {
    return IntegerPow(cx, node, x, static_cast<int>(*power));
  }
  const LowerBound bound = BoundOf(cx, node.input(0));
  if (bound == LowerBound::kNone) {
    return NodeError(node, absl::StrCat(
                               "an exponent other than an integer of -16 to 16, 0.5 or -0.5 (",
                               power.has_value() ? absl::StrCat("here ", *power)
                                                 : absl::StrCat(Quote(node.input(1))),
                               ") is supported for a base that is positive by construction "
                               "only (a Clip with a positive min, Sigmoid, Exp, Softplus, or "
                               "means and products of such), which ",
                               Quote(node.input(0)), " is not known to be"));
  }
  if (!ops_internal::IsFloat(cx.nb().type(x).dtype)) {
    return NodeError(node, "a Pow of an integer tensor is not supported");
  }
  Value exponent;
  if (power.has_value()) {
    ASSIGN_OR_RETURN(exponent, cx.Fill(node, {}, x, *power, "exponent"));
  } else {
    ASSIGN_OR_RETURN(exponent, cx.Get(node, node.input(1)));
  }
  if (bound != LowerBound::kNormal) {
    ASSIGN_OR_RETURN(x, cx.Aux(node, "clip", {x}, {{"min", kSmallestNormal}}, "floored"));
  }
  ASSIGN_OR_RETURN(Value log, cx.Aux(node, "log", {x}, Json::object(), "log"));
  ASSIGN_OR_RETURN(Value scaled, Broadcast(cx, node, "mul", log, exponent, "scaled"));
  return cx.Apply(node, "exp", {scaled});
}

// op(a, b) (add, sub, mul, div) under NumPy broadcasting. The op table
// broadcasts an operand whose dims other than 1 form one block of the
// other's (BlockBroadcast); every other broadcast is lowered to that
// here. Where neither operand has the result's shape, `a` is expanded
// first (added to zeros of the result's shape). Then the full operand's
// dims that the other is 1 in are moved to the front (a transpose), the
// other is viewed without its 1s there (a reshape: its trailing block),
// the op applied, and the result moved back. Each transpose copies a
// tensor of the result's size.
absl::StatusOr<Value> Broadcast(ImportContext& cx, const onnx::NodeProto& node,
                                absl::string_view op, Value a, Value b, absl::string_view suffix) {
  const Shape sa = cx.nb().type(a).shape, sb = cx.nb().type(b).shape;
  if (ops_internal::BlockBroadcast(sa, sb) || ops_internal::BlockBroadcast(sb, sa)) {
    return cx.Lowered(node, op, {a, b}, Json::object(), suffix);
  }
  const std::optional<std::vector<int64_t>> broadcast = ops_internal::BroadcastShapes(sa, sb);
  if (!broadcast) {
    return NodeError(node, absl::StrCat("shapes ", ShapeToString(sa), " and ", ShapeToString(sb),
                                        " do not broadcast"));
  }
  const std::vector<int64_t>& out = *broadcast;
  const size_t rank = out.size();
  auto padded = [rank](const Shape& s) {
    std::vector<int64_t> p(rank - s.size(), 1);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  const std::vector<int64_t> pa = padded(sa), pb = padded(sb);
  const auto prefix = [&](absl::string_view what) {
    return suffix.empty() ? std::string(what) : absl::StrCat(suffix, "_", what);
  };
  if (pa != out && pb != out) {
    ASSIGN_OR_RETURN(Value zeros, cx.Zeros(node, out, a, prefix("zeros")));
    ASSIGN_OR_RETURN(a, Broadcast(cx, node, "add", zeros, a, prefix("expanded")));
    return Broadcast(cx, node, op, a, b, suffix);
  }
  const bool a_full = pa == out;
  const Value full = a_full ? a : b, other = a_full ? b : a;
  const std::vector<int64_t>& po = a_full ? pb : pa;
  std::vector<int64_t> perm, kept;  // the broadcast dims first; other's kept dims
  for (size_t d = 0; d < rank; ++d) {
    if (po[d] == 1 && out[d] != 1) perm.push_back(static_cast<int64_t>(d));
  }
  for (size_t d = 0; d < rank; ++d) {
    if (po[d] != 1 || out[d] == 1) perm.push_back(static_cast<int64_t>(d)), kept.push_back(po[d]);
  }
  std::vector<int64_t> inverse(rank);
  for (size_t i = 0; i < rank; ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  ASSIGN_OR_RETURN(Value moved,
                   cx.Aux(node, "transpose", {full}, {{"perm", perm}}, prefix("broadcast_first")));
  ASSIGN_OR_RETURN(Value view,
                   cx.Aux(node, "reshape", {other}, {{"shape", kept}}, prefix("broadcast_view")));
  ASSIGN_OR_RETURN(
      Value y,
      cx.Aux(node, op, a_full ? std::vector<Value>{moved, view} : std::vector<Value>{view, moved},
             Json::object(), prefix(op)));
  return cx.Lowered(node, "transpose", {y}, {{"perm", inverse}}, suffix);
}

// op of two numeric constants (nn.MultiheadAttention's export scales its
// constant attention mask by a cast 1; a table of positions times a row of
// frequencies, -log(10000) / d), folded into a float constant under NumPy
// broadcasting. Returns false, folding nothing, for other operands.
bool FoldFloatArithmetic(ImportContext& cx, const onnx::NodeProto& node, absl::string_view op) {
  std::optional<Numbers> a = cx.KnownNumbers(node.input(0));
  std::optional<Numbers> b = cx.KnownNumbers(node.input(1));
  if (!a || !b) return false;
  const std::optional<Numbers> out = BroadcastFold(*a, *b, [op](double x, double y) {
    return op == "add" ? x + y : op == "sub" ? x - y : op == "mul" ? x * y : x / y;
  });
  // (of two float16 or bfloat16 operands, rounded to that type: ONNX's
  // operands share one type, a noted cast's included)
  const int type = a->data_type == b->data_type ? a->data_type : onnx::TensorProto::FLOAT;
  return out.has_value() && cx.DefineFolded(node, FloatTensor(out->dims, out->values, type)).ok();
}

// Whether `mask` is a causal mask over the last two dims (S, T) of x:
// leading dims of 1, then 0 where key j <= query i and -inf (or at most
// -1e4, which softmax turns into exactly 0 in fp32 all the same) where
// j > i. nn.Transformer.generate_square_subsequent_mask writes one.
bool IsCausalMask(const Numbers& mask, const Shape& x) {
  const size_t rank = mask.dims.size();
  if (rank < 2 || rank > x.size() || mask.dims[rank - 2] != x[x.size() - 2] ||
      mask.dims[rank - 1] != x.back()) {
    return false;
  }
  for (size_t d = 0; d + 2 < rank; ++d) {
    if (mask.dims[d] != 1) return false;
  }
  const int64_t rows = mask.dims[rank - 2], cols = mask.dims[rank - 1];
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double v = mask.values[i * cols + j];
      if (j <= i ? v != 0.0 : !(v <= -1e4)) return false;
    }
  }
  return true;
}

// x + mask, where the mask is a constant causal mask over x's last two dims
// (IsCausalMask: a causal `src_mask` or `attn_mask`) and every reader of
// the sum is a Softmax over the last dim: the sum is x itself, marked, and
// those softmaxes take pebble's `causal` attr, which masks the same keys
// (no mask tensor, no add). Returns whether it applied.
absl::StatusOr<bool> CausallyMaskedAdd(ImportContext& cx, const onnx::NodeProto& node) {
  for (int m : {0, 1}) {
    std::optional<Numbers> mask = cx.KnownNumbers(node.input(m));
    const Value* x = cx.Find(node.input(1 - m));
    if (!mask || x == nullptr || !cx.nb().has_type(*x)) continue;
    const Shape& shape = cx.nb().type(*x).shape;
    const std::string& sum = node.output(0);
    const auto& readers = cx.Readers(sum);
    const bool softmaxes_only =
        !readers.empty() && !cx.Reserved(sum) &&
        std::all_of(readers.begin(), readers.end(), [&](const onnx::NodeProto* r) {
          if (r->op_type() != "Softmax") return false;
          const absl::StatusOr<int64_t> axis =
              Attrs(*r).Int("axis", cx.opset() >= 13 ? -1 : 1);
          const auto rank = static_cast<int64_t>(shape.size());
          return axis.ok() && (*axis == -1 || *axis == rank - 1);
        });
    if (!softmaxes_only || !IsCausalMask(*mask, shape)) continue;
    RETURN_IF_ERROR(cx.Define(node, *x));
    cx.MarkCausallyMasked(sum);
    return true;
  }
  return false;
}

absl::Status Binary(ImportContext& cx, const onnx::NodeProto& node, absl::string_view op) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  // (integers noted cast to float divide as floats: Note [Casts of constants])
  auto cast_to_float = [&cx](const std::string& name) {
    const std::optional<int> to = cx.CastTo(name);
    return to.has_value() && *to != onnx::TensorProto::INT64 && *to != onnx::TensorProto::INT32;
  };
  if (cx.KnownInts(node.input(0)) && cx.KnownInts(node.input(1)) &&
      !cast_to_float(node.input(0)) && !cast_to_float(node.input(1))) {
    return FoldArithmetic(cx, node);
  }
  if (FoldFloatArithmetic(cx, node, op)) return absl::OkStatus();
  if (op == "add") {
    ASSIGN_OR_RETURN(bool masked, CausallyMaskedAdd(cx, node));
    if (masked) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  ASSIGN_OR_RETURN(Value v, Broadcast(cx, node, op, in[0], in[1], ""));
  return cx.Define(node, v);
}

// PRelu(x, slope) (nn.PReLU: a slope per channel, or one), the slope
// broadcast to x: relu(x) + slope min(x, 0), with min(x, 0) computed as
// x - relu(x), exactly. Its gradients are PyTorch's: x's is slope where
// x <= 0, the slope's the sum of g min(x, 0).
absl::Status PRelu(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  ASSIGN_OR_RETURN(Value positive, cx.Aux(node, "relu", {in[0]}, Json::object(), "positive"));
  ASSIGN_OR_RETURN(Value negative,
                   cx.Aux(node, "sub", {in[0], positive}, Json::object(), "negative"));
  ASSIGN_OR_RETURN(Value scaled, Broadcast(cx, node, "mul", negative, in[1], "scaled"));
  if (cx.nb().type(scaled).shape != cx.nb().type(in[0]).shape) {
    return NodeError(node, absl::StrCat("the slope ", ShapeToString(cx.nb().type(in[1]).shape),
                                        " does not broadcast to x ",
                                        ShapeToString(cx.nb().type(in[0]).shape)));
  }
  return cx.Apply(node, "add", {positive, scaled});
}

// Expand of a computed tensor to a known shape (NumPy broadcast): added
// to a zero `fill` of the result's shape, which broadcasts it; a boolean
// mask or-ed with one.
absl::Status Expand(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, cx.ConstInts(node, 1));
  if (cx.Find(node.input(0)) == nullptr && !cx.KnownInts(node.input(0))) {
    // A float constant (the zeros of an RNN's initial state, expanded to
    // the batch): folded where the result is one of at most 2^20 values.
    if (std::optional<Numbers> c = cx.KnownNumbers(node.input(0))) {
      if (const std::optional<Shape> out =
              FoldedBroadcastShape(c->dims, Shape(shape.begin(), shape.end()))) {
        std::vector<double> values(static_cast<size_t>(ops_internal::Elements(*out)));
        for (size_t o = 0; o < values.size(); ++o) {
          values[o] = c->values[BroadcastIndex(c->dims, *out, static_cast<int64_t>(o))];
        }
        return cx.DefineFolded(node, FloatTensor(*out, values, c->data_type));
      }
    }
  }
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const Shape& in = cx.nb().type(x).shape;
  const std::optional<std::vector<int64_t>> out = ops_internal::BroadcastShapes(in, shape);
  if (!out) {
    return NodeError(node, absl::StrCat("cannot expand ", ShapeToString(in), " to [",
                                        absl::StrJoin(shape, ","), "]"));
  }
  if (Shape(out->begin(), out->end()) == in) return cx.Define(node, x);
  // A boolean mask (a padding mask over the heads) is or-ed into false
  // values of the result's shape, which compare broadcasts in full.
  if (IsBoolean(cx, node.input(0))) {
    ASSIGN_OR_RETURN(Value zeros, cx.Zeros(node, *out, x, "zeros"));
    return cx.Apply(node, "compare", {x, zeros}, {{"op", "or"}});
  }
  // The expansion is an add to zeros, which pebble computes in float only.
  if (const DType dtype = cx.nb().type(x).dtype; !ops_internal::IsFloat(dtype)) {
    return NodeError(node, absl::StrCat("an Expand of ", DTypeName(dtype), " ",
                                        Quote(node.input(0)),
                                        " is not supported (pebble expands float tensors "
                                        "and boolean masks only)"));
  }
  ASSIGN_OR_RETURN(Value v, ExpandTo(cx, node, x, *out, ""));
  return cx.Define(node, v);
}

// Neg (-x) and Reciprocal (torch.reciprocal): a mul by a scalar fill of
// -1, a div of a scalar fill of 1 by x. Neg of known integers (a slice's
// bound, -x.shape[1]) folds, and so does either of another constant (a
// float one: 1 / d of a table's frequencies).
absl::Status NegOrReciprocal(ImportContext& cx, const onnx::NodeProto& node, bool reciprocal) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  if (std::optional<Ints> ints = cx.KnownInts(node.input(0)); ints && !reciprocal) {
    for (int64_t& v : ints->values) {
      if (v == std::numeric_limits<int64_t>::min()) return NodeError(node, "overflows");
      v = -v;
    }
    return cx.DefineInts(node, 0, *std::move(ints));
  }
  if (std::optional<Numbers> c = cx.KnownNumbers(node.input(0));
      c && !c->values.empty() && !cx.IsParameterLike(node.input(0))) {  // a float constant
    for (double& v : c->values) v = reciprocal ? 1 / static_cast<float>(v) : -v;
    return cx.DefineFolded(node, FloatTensor(c->dims, c->values, c->data_type));
  }
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  if (const DType dtype = cx.nb().type(x).dtype; !ops_internal::IsFloat(dtype)) {
    return NodeError(node, absl::StrCat("a ", node.op_type(), " of ", DTypeName(dtype), " ",
                                        Quote(node.input(0)),
                                        " is not supported (of float tensors and integers "
                                        "known at import only)"));
  }
  ASSIGN_OR_RETURN(Value c, cx.Fill(node, {}, x, reciprocal ? 1.0 : -1.0,
                                    reciprocal ? "one" : "minus_one"));
  return reciprocal ? cx.Apply(node, "div", {c, x}) : cx.Apply(node, "mul", {x, c});
}

// Sin and Cos of a float constant, folded (the sinusoidal table of
// positions a forward computes from torch.arange), each of the float
// argument, rounded to float (within an ulp of PyTorch's float32 kernel);
// of a computed tensor not supported.
absl::Status FoldedSinOrCos(ImportContext& cx, const onnx::NodeProto& node, bool cosine) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  const std::string& name = node.input(0);
  const onnx::TensorProto* t = cx.ConstTensor(name);
  std::optional<std::vector<double>> values;
  if (t != nullptr && !cx.IsParameterLike(name) && IsFloatType(t->data_type()) &&
      t->data_type() != onnx::TensorProto::DOUBLE) {
    values = FloatValues(*t);
  }
  if (!values) {
    return NodeError(node, absl::StrCat(node.op_type(), " of ", Quote(name),
                                        " is not supported: it folds a float constant (a table "
                                        "of positions), which this is not (",
                                        t == nullptr ? "a computed tensor"
                                        : cx.IsParameterLike(name) ? "a parameter"
                                                                   : "a constant of another type",
                                        ")"));
  }
  for (double& v : *values) {
    const float x = static_cast<float>(v);
    v = cosine ? std::cos(x) : std::sin(x);
  }
  return cx.DefineFolded(
      node, FloatTensor(Shape(t->dims().begin(), t->dims().end()), *values, t->data_type()));
}

}  // namespace

absl::StatusOr<Value> ExpandTo(ImportContext& cx, const onnx::NodeProto& node, Value v,
                               const Shape& shape, absl::string_view suffix) {
  if (cx.nb().type(v).shape == shape) return v;
  ASSIGN_OR_RETURN(Value zeros, cx.Zeros(node, std::vector<int64_t>(shape.begin(), shape.end()),
                                         v, suffix.empty() ? "zeros"
                                                           : absl::StrCat(suffix, "_zeros")));
  return Broadcast(cx, node, "add", zeros, v, suffix);
}

void AddElementwiseOps(OnnxHandlers& handlers) {
  // Operators of one input and no attributes, by their pebble op.
  for (const auto& ops : {std::pair{"Relu", "relu"},
                          {"HardSwish", "hardswish"},
                          {"Sigmoid", "sigmoid"},
                          {"Tanh", "tanh"},
                          {"Erf", "erf"},
                          {"Sqrt", "sqrt"},
                          {"Abs", "abs"},
                          {"Exp", "exp"},
                          {"Log", "log"}}) {
    handlers[ops.first] = [op = ops.second](ImportContext& cx, const onnx::NodeProto& node) {
      return Unary(cx, node, op);
    };
  }
  for (const auto& ops :
       {std::pair{"Add", "add"}, {"Sub", "sub"}, {"Mul", "mul"}, {"Div", "div"}}) {
    handlers[ops.first] = [op = ops.second](ImportContext& cx, const onnx::NodeProto& node) {
      return Binary(cx, node, op);
    };
  }
  handlers["HardSigmoid"] = HardSigmoid;
  handlers["LeakyRelu"] = LeakyRelu;
  for (const char* op : {"Elu", "Selu", "Celu"}) handlers[op] = EluFamily;
  handlers["Softplus"] = Softplus;
  handlers["PRelu"] = PRelu;
  handlers["Clip"] = Clip;
  handlers["Pow"] = Pow;
  handlers["Sin"] = [](ImportContext& cx, const onnx::NodeProto& node) {
    return FoldedSinOrCos(cx, node, false);
  };
  handlers["Cos"] = [](ImportContext& cx, const onnx::NodeProto& node) {
    return FoldedSinOrCos(cx, node, true);
  };
  handlers["Expand"] = Expand;
  for (const bool reciprocal : {false, true}) {
    handlers[reciprocal ? "Reciprocal" : "Neg"] = [reciprocal](ImportContext& cx,
                                                               const onnx::NodeProto& node) {
      return NegOrReciprocal(cx, node, reciprocal);
    };
  }
}

}  // namespace pebble::onnx_import
