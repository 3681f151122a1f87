// The state of one ONNX import and its primitives (see onnx_context.h).
#include "graph/import/onnx_context.h"

#include <fnmatch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/import/onnx_util.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble::onnx_import {

int64_t BroadcastIndex(const Shape& dims, const Shape& out, int64_t o) {
  int64_t index = 0, stride = 1;
  const size_t lead = out.size() - dims.size();
  for (size_t d = out.size(); d-- > lead;) {
    const int64_t extent = dims[d - lead];
    const int64_t coordinate = o % out[d];
    o /= out[d];
    if (extent != 1) index += coordinate * stride;
    stride *= extent;
  }
  return index;
}

std::optional<Shape> FoldedBroadcastShape(const Shape& a, const Shape& b) {
  std::optional<Shape> out = ops_internal::BroadcastShapes(a, b);
  // (counted in double: an int64 product of hostile dims could wrap)
  if (!out.has_value() || ops_internal::Elements(*out) > double(int64_t{1} << 20)) {
    return std::nullopt;
  }
  return out;
}

std::optional<Numbers> BroadcastFold(const Numbers& a, const Numbers& b,
                                     const std::function<double(double, double)>& op) {
  std::optional<Shape> shape = FoldedBroadcastShape(a.dims, b.dims);
  if (!shape.has_value()) return std::nullopt;
  Numbers out{*std::move(shape), {}};
  out.values.resize(NumElements(out.dims));
  for (int64_t o = 0; o < static_cast<int64_t>(out.values.size()); ++o) {
    out.values[o] = op(a.values[BroadcastIndex(a.dims, out.dims, o)],
                       b.values[BroadcastIndex(b.dims, out.dims, o)]);
  }
  return out;
}

absl::Status ImportContext::ReadInitializers(const onnx::GraphProto& graph) {
  for (const onnx::TensorProto& t : graph.initializer()) {
    if (t.name().empty()) return absl::InvalidArgumentError("an initializer has no name");
    if (!initializers_.emplace(t.name(), &t).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("initializer ", Quote(t.name()), " is given twice"));
    }
    RETURN_IF_ERROR(CheckStoredValues(t, absl::StrCat("initializer ", Quote(t.name())),
                                      /*require_values=*/false));
  }
  if (graph.sparse_initializer_size() > 0) {
    return absl::InvalidArgumentError("sparse initializers are not supported");
  }
  for (const onnx::NodeProto& node : graph.node()) {
    if (node.op_type() != "Resize") continue;
    for (int i = 1; i < node.input_size(); ++i) arguments_.insert(node.input(i));
  }
  for (const onnx::NodeProto& node : graph.node()) {
    if (node.op_type() != "Concat" || node.output_size() == 0 ||
        !arguments_.contains(node.output(0))) {
      continue;
    }
    for (const std::string& part : node.input()) arguments_.insert(part);
  }
  // Batch-norm running statistics are buffers, not parameters.
  for (const onnx::NodeProto& node : graph.node()) {
    if (node.op_type() != "BatchNormalization") continue;
    for (int i = 3; i < std::min(node.input_size(), 5); ++i) buffers_.insert(node.input(i));
  }
  return absl::OkStatus();
}

absl::Status ImportContext::FreezeInitializers(const std::vector<std::string>& patterns) {
  // A pattern may name any initializer: one of another type (a boolean mask
  // or int64 indices registered as a buffer) is a constant, never trained,
  // so naming it changes nothing.
  std::vector<std::string> names;  // sorted, the floating-point ones first
  for (const auto& [name, tensor] : initializers_) names.push_back(name);
  std::sort(names.begin(), names.end(), [this](const std::string& a, const std::string& b) {
    return std::pair(!IsParameterLike(a), a) < std::pair(!IsParameterLike(b), b);
  });
  for (const std::string& pattern : patterns) {
    bool matched = false;
    for (const std::string& name : names) {
      if (fnmatch(pattern.c_str(), name.c_str(), 0) != 0) continue;
      if (IsParameterLike(name)) buffers_.insert(name);
      matched = true;
    }
    if (matched) continue;
    constexpr size_t kNamesShown = 8;
    std::vector<std::string> shown(names.begin(),
                                   names.begin() + std::min(names.size(), kNamesShown));
    for (std::string& name : shown) name = Quote(name);
    return OptionError(absl::StrCat(
        "frozen ", Quote(pattern), " matches none of the model's initializers",
        names.empty() ? " (it has none)"
                      : absl::StrCat(" (", absl::StrJoin(shown, ", "),
                                     names.size() > shown.size()
                                         ? absl::StrCat(" and ", names.size() - shown.size(),
                                                        " more")
                                         : "",
                                     ")")));
  }
  return absl::OkStatus();
}

const Value* ImportContext::Find(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

absl::StatusOr<Value> ImportContext::Get(const onnx::NodeProto& node, const std::string& name) {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (unreadable_.contains(name)) {
    return NodeError(node, absl::StrCat("reads ", Quote(name),
                                        ", an output a training step does not produce "
                                        "(updated running statistics, a dropout mask)"));
  }
  auto init = initializers_.find(name);
  if (init == initializers_.end()) {
    // A scalar Constant read by a computation (GELU's 0.5 and sqrt(2), a
    // "+ 1"; an integer one through a Cast to float, which keeps the value
    // as it is, as nn.MultiheadAttention's mask scaling): a one-element
    // `fill` node of that value, fp32 but of a float16 or bfloat16
    // constant (a .half() model's "* 2"). Any other: a `constant` node of
    // its values (ConstantNode).
    if (auto c = constants_.find(name); c != constants_.end()) {
      if (std::optional<double> value = NumberScalar(*c->second)) {
        const Shape shape(c->second->dims().begin(), c->second->dims().end());
        const int type = CastTo(name).value_or(c->second->data_type());
        const std::string id = Free(name) ? name : FreshId(name);
        const Value v = nb_.Apply("fill", {},
                                  {{"shape", std::vector<int64_t>(shape.begin(), shape.end())},
                                   {"dtype", type == onnx::TensorProto::FLOAT16    ? "f16"
                                             : type == onnx::TensorProto::BFLOAT16 ? "bf16"
                                                                                   : "f32"},
                                   {"value", *value}},
                                  id);
        if (!nb_.status().ok()) return NodeError(node, nb_.status().message());
        values_[name] = v;
        return v;
      }
    }
    if (auto c = constants_.find(name); c != constants_.end()) {
      return ConstantNode(node, name, *c->second);
    }
    return NodeError(node,
                     absl::StrCat("input ", Quote(name), " is not computed before it is read"));
  }
  return PersistentNode(node, name, *init->second);
}

absl::StatusOr<Value> ImportContext::ConstantNode(const onnx::NodeProto& node,
                                                  const std::string& name,
                                                  const onnx::TensorProto& t) {
  const Shape shape(t.dims().begin(), t.dims().end());
  std::string bytes;  // the tensor's, as pebble's dtype holds them (little-endian)
  absl::string_view dtype;
  auto append = [&bytes](auto value) {
    bytes.append(reinterpret_cast<const char*>(&value), sizeof(value));
  };
  // Its own type, or that of a cast to float, int64 or bool without a
  // change of value (Note [Casts of constants]).
  const std::optional<int> cast = CastTo(name);
  const int type = cast.has_value() && (*cast == onnx::TensorProto::FLOAT ||
                                        *cast == onnx::TensorProto::INT64 ||
                                        *cast == onnx::TensorProto::BOOL)
                       ? *cast
                       : t.data_type();
  if (type == onnx::TensorProto::INT64 && t.data_type() == onnx::TensorProto::INT64) {
    absl::StatusOr<std::vector<int64_t>> values = IntValues(t);  // (every bit, not a double's)
    if (values.ok() && values->size() <= (size_t{1} << 20)) {
      dtype = "i64";
      for (int64_t v : *values) append(v);
    }
  } else if (type == onnx::TensorProto::FLOAT || IsHalfType(type) ||
             type == onnx::TensorProto::INT64 || type == onnx::TensorProto::BOOL) {
    if (std::optional<Numbers> numbers = KnownNumbers(name)) {
      for (double v : numbers->values) {
        if (type == onnx::TensorProto::FLOAT) append(static_cast<float>(v));
        // (values of the type already: CastConstant rounds a cast's)
        if (IsHalfType(type)) append(HalfBits(type, v));
        if (type == onnx::TensorProto::INT64) append(static_cast<int64_t>(v));
        if (type == onnx::TensorProto::BOOL) append(static_cast<uint8_t>(v != 0));
      }
      dtype = type == onnx::TensorProto::FLOAT      ? "f32"
              : type == onnx::TensorProto::FLOAT16  ? "f16"
              : type == onnx::TensorProto::BFLOAT16 ? "bf16"
              : type == onnx::TensorProto::INT64    ? "i64"
                                                    : "u8";
    }
  }
  if (dtype.empty()) {
    return NodeError(node, absl::StrCat("input ", Quote(name), " is a constant tensor of shape ",
                                        ShapeToString(shape), " and type ",
                                        onnx::TensorProto::DataType_Name(t.data_type()),
                                        ": a computation reads float (32 and 16 bits, bfloat16), "
                                        "bool and int64 constants of at most 2^20 elements"));
  }
  const std::string id = Free(name) ? name : FreshId(name);
  const Value v = nb_.Apply("constant", {},
                            {{"shape", std::vector<int64_t>(shape.begin(), shape.end())},
                             {"dtype", dtype},
                             {"data", absl::Base64Escape(bytes)}},
                            id);
  if (!nb_.status().ok()) return NodeError(node, nb_.status().message());
  values_[name] = v;
  return v;
}

absl::StatusOr<Value> ImportContext::PersistentNode(const onnx::NodeProto& node,
                                                    const std::string& name,
                                                    const onnx::TensorProto& t) {
  auto dtype = DTypeOfOnnx(t.data_type());
  if (!dtype.ok()) {
    return NodeError(node,
                     absl::StrCat("initializer ", Quote(name), ": ", dtype.status().message()));
  }
  Shape shape(t.dims().begin(), t.dims().end());
  for (int64_t d : shape) {
    if (d <= 0) {
      return NodeError(
          node, absl::StrCat("initializer ", Quote(name), " has shape ", ShapeToString(shape)));
    }
  }
  Value v;
  if (buffers_.contains(name)) {
    v = nb_.Buffer(name, shape, *dtype);
    // PyTorch keeps a step counter beside each batch norm's statistics.
    constexpr absl::string_view kMean = ".running_mean";
    if (name.size() > kMean.size() && absl::EndsWith(name, kMean)) {
      const std::string counter =
          absl::StrCat(name.substr(0, name.size() - kMean.size()), ".num_batches_tracked");
      if (!nb_.Find(counter).valid() && !initializers_.contains(counter)) {
        nb_.Buffer(counter, {}, DType::kInt64);
      }
    }
  } else {
    v = nb_.Parameter(name, shape, *dtype);
  }
  RETURN_IF_ERROR(nb_.status());
  values_[name] = v;
  return v;
}

absl::StatusOr<std::vector<Value>> ImportContext::Inputs(const onnx::NodeProto& node) {
  std::vector<Value> inputs;
  for (const std::string& name : node.input()) {
    if (name.empty()) continue;
    ASSIGN_OR_RETURN(Value v, Get(node, name));
    inputs.push_back(v);
  }
  return inputs;
}

bool ImportContext::IsParameterLike(const std::string& name) const {
  auto it = initializers_.find(name);
  if (it == initializers_.end() || absl::StartsWith(name, "onnx::") ||
      arguments_.contains(name)) {
    return false;
  }
  const absl::StatusOr<DType> dtype = DTypeOfOnnx(it->second->data_type());
  return dtype.ok() && (*dtype == DType::kFloat32 || *dtype == DType::kFloat16 ||
                        *dtype == DType::kBFloat16);
}

const onnx::TensorProto* ImportContext::ConstTensor(const std::string& name) const {
  if (auto it = constants_.find(name); it != constants_.end()) return it->second;
  if (auto it = initializers_.find(name); it != initializers_.end()) return it->second;
  return nullptr;
}

absl::StatusOr<std::vector<int64_t>> ImportContext::ConstInts(const onnx::NodeProto& node, int i) {
  if (i >= node.input_size() || node.input(i).empty()) {
    return NodeError(node, absl::StrCat("input ", i, " is missing"));
  }
  const std::string& name = node.input(i);
  const onnx::TensorProto* t = ConstTensor(name);
  if (t == nullptr) {
    return NodeError(node, absl::StrCat("input ", Quote(name),
                                        " must be a constant (shapes computed at run time "
                                        "are not supported: export with fixed shapes)"));
  }
  auto values = IntValues(*t);
  if (!values.ok()) return NodeError(node, values.status().message());
  return values;
}

std::optional<Ints> ImportContext::KnownInts(const std::string& name) const {
  const onnx::TensorProto* t = ConstTensor(name);
  if (t == nullptr) return std::nullopt;
  absl::StatusOr<std::vector<int64_t>> values = IntValues(*t);
  if (!values.ok()) return std::nullopt;
  return Ints{Shape(t->dims().begin(), t->dims().end()), *std::move(values)};
}

std::optional<Numbers> ImportContext::KnownNumbers(const std::string& name) const {
  const onnx::TensorProto* t = ConstTensor(name);
  if (t == nullptr || IsParameterLike(name)) return std::nullopt;
  Numbers out{Shape(t->dims().begin(), t->dims().end()), {}, CastTo(name).value_or(t->data_type())};
  if (std::optional<std::vector<double>> floats = FloatValues(*t)) {
    out.values = *std::move(floats);
    return out;
  }
  if (std::optional<std::vector<double>> bools = BoolValues(*t)) {
    out.values = *std::move(bools);
    return out;
  }
  absl::StatusOr<std::vector<int64_t>> ints = IntValues(*t);
  if (!ints.ok() || ints->size() > (size_t{1} << 20)) return std::nullopt;
  out.values.assign(ints->begin(), ints->end());
  return out;
}

void ImportContext::IndexReaders(const onnx::GraphProto& graph) {
  for (const onnx::NodeProto& node : graph.node()) {
    for (const std::string& name : node.input()) {
      std::vector<const onnx::NodeProto*>& readers = readers_[name];
      if (readers.empty() || readers.back() != &node) readers.push_back(&node);
    }
    for (const std::string& name : node.output()) producers_[name] = &node;
  }
}

const std::vector<const onnx::NodeProto*>& ImportContext::Readers(const std::string& name) const {
  static const auto* const kNone = new std::vector<const onnx::NodeProto*>;
  auto it = readers_.find(name);
  return it == readers_.end() ? *kNone : it->second;
}

absl::StatusOr<Operand> ImportContext::FirstOperand(const onnx::NodeProto& node) {
  Operand in;
  in.ints = KnownInts(node.input(0));
  if (in.ints) {
    in.shape = in.ints->dims;
  } else {
    ASSIGN_OR_RETURN(in.value, Get(node, node.input(0)));
    in.shape = nb_.type(in.value).shape;
  }
  return in;
}

absl::Status ImportContext::ExpectInputs(const onnx::NodeProto& node, int min, int max) {
  if (node.input_size() < min || node.input_size() > max) {
    return NodeError(node, absl::StrCat("has ", node.input_size(), " inputs; expected ", min,
                                        min == max ? "" : absl::StrCat(" to ", max)));
  }
  return absl::OkStatus();
}

absl::Status ImportContext::Define(const onnx::NodeProto& node, Value v, int output) {
  RETURN_IF_ERROR(nb_.status());
  if (node.output_size() <= output || node.output(output).empty()) {
    return NodeError(node, "has no output");
  }
  if (!values_.emplace(node.output(output), v).second) {
    return NodeError(node, absl::StrCat("its output ", Quote(node.output(output)),
                                        " is already defined (ONNX values are assigned once)"));
  }
  return absl::OkStatus();
}

absl::Status ImportContext::DefineInts(const onnx::NodeProto& node, int output, Ints ints) {
  if (output >= node.output_size() || node.output(output).empty()) {
    return NodeError(node, "has no output");
  }
  onnx::TensorProto& t = folded_.emplace_back();
  t.set_name(node.output(output));
  t.set_data_type(onnx::TensorProto::INT64);
  for (int64_t d : ints.dims) t.add_dims(d);
  for (int64_t v : ints.values) t.add_int64_data(v);
  constants_[node.output(output)] = &t;
  InheritCast(node, node.output(output));
  return absl::OkStatus();
}

void ImportContext::InheritCast(const onnx::NodeProto& node, const std::string& output) {
  static const auto* const kViews = new absl::flat_hash_set<std::string>{
      "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Identity", "Slice",
      "Expand", "Concat", "Gather", "Tile", "Trilu"};
  if (node.input_size() == 0 || !kViews->contains(node.op_type())) return;
  if (std::optional<int> to = CastTo(node.input(0))) cast_to_[output] = *to;
}

absl::Status ImportContext::DefineFolded(const onnx::NodeProto& node, onnx::TensorProto tensor) {
  if (node.output_size() < 1 || node.output(0).empty()) return NodeError(node, "has no output");
  onnx::TensorProto& t = folded_.emplace_back(std::move(tensor));
  t.set_name(node.output(0));
  constants_[node.output(0)] = &t;
  InheritCast(node, node.output(0));
  return absl::OkStatus();
}

absl::Status ImportContext::Apply(const onnx::NodeProto& node, absl::string_view op,
                                  std::vector<Value> inputs, Json attrs, std::string id) {
  if (node.output_size() < 1 || node.output(0).empty()) return NodeError(node, "has no output");
  const Value v = nb_.Apply(op, inputs, std::move(attrs), id.empty() ? NodeIdFor(node) : id);
  MarkView(op, v, inputs);
  if (!nb_.status().ok()) {
    return NodeError(node, nb_.status().message());
  }
  return Define(node, v);
}

absl::StatusOr<Value> ImportContext::Aux(const onnx::NodeProto& node, absl::string_view op,
                                         std::vector<Value> inputs, Json attrs,
                                         absl::string_view suffix) {
  const std::string id = absl::StrCat(NodeIdFor(node), ".", suffix);
  const Value v = nb_.Apply(op, inputs, std::move(attrs), Free(id) ? id : FreshId(id));
  MarkView(op, v, inputs);
  if (!nb_.status().ok()) return NodeError(node, nb_.status().message());
  return v;
}

absl::StatusOr<Value> ImportContext::Lowered(const onnx::NodeProto& node, absl::string_view op,
                                             std::vector<Value> inputs, Json attrs,
                                             absl::string_view suffix) {
  if (!suffix.empty()) return Aux(node, op, std::move(inputs), std::move(attrs), suffix);
  const Value v = nb_.Apply(op, inputs, std::move(attrs), NodeIdFor(node));
  MarkView(op, v, inputs);
  if (!nb_.status().ok()) return NodeError(node, nb_.status().message());
  return v;
}

absl::Status ImportContext::ApplyAs2d(const onnx::NodeProto& node, absl::string_view op,
                                      std::vector<Value> in, size_t viewed, Json attrs) {
  static constexpr absl::string_view kViewSuffix[] = {"x2d", "w2d"};
  for (size_t i = 0; i < viewed; ++i) {
    ASSIGN_OR_RETURN(
        in[i], Aux(node, "reshape", {in[i]}, {{"shape", WithUnitDim(nb_.type(in[i]).shape, 2)}},
                   kViewSuffix[i]));
  }
  ASSIGN_OR_RETURN(Value y, Aux(node, op, std::move(in), std::move(attrs), op));
  std::vector<int64_t> back(nb_.type(y).shape.begin(), nb_.type(y).shape.end());
  back.erase(back.begin() + 2);
  return Apply(node, "reshape", {y}, {{"shape", back}});
}

absl::StatusOr<Value> ImportContext::Fill(const onnx::NodeProto& node,
                                          const std::vector<int64_t>& shape, Value like,
                                          double value, absl::string_view suffix) {
  return Aux(
      node, "fill", {},
      {{"shape", shape}, {"dtype", std::string(DTypeName(nb_.type(like).dtype))}, {"value", value}},
      suffix);
}

// Reshape, Flatten, Squeeze and Unsqueeze, and the reshapes of the
// lowerings, become pebble's reshape and flatten: the same bytes in the
// same order, so each is an alias (a view) of its input and holds no
// memory of its own (docs/import.md).
void ImportContext::MarkView(absl::string_view op, Value v, const std::vector<Value>& inputs) {
  const bool view = op == "reshape" || op == "flatten";
  if (view && v.valid() && inputs.size() == 1) nb_.SetAliasOf(v, inputs[0]);
}

std::string ImportContext::NodeIdFor(const onnx::NodeProto& node) const {
  const std::string& out = node.output(0);
  if (reserved_.contains(out)) return out;
  const std::string op = absl::AsciiStrToLower(node.op_type());
  std::vector<std::string> candidates;
  const std::vector<std::string> parts = absl::StrSplit(node.name(), '/', absl::SkipEmpty());
  if (parts.size() >= 2) {
    // The scopes are attribute names ("conv1") or, inside containers,
    // paths that repeat their parent's ("layer1" then "layer1.0";
    // "downsample" then "downsample.0"): join them into the module's path.
    std::string path, last;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const std::string& scope = parts[i];
      if (!path.empty() && absl::StartsWith(scope, path + ".")) {
        path = scope;
      } else if (!last.empty() && absl::StartsWith(scope, last + ".")) {
        path = absl::StrCat(path.substr(0, path.size() - last.size()), scope);
      } else {
        path = path.empty() ? scope : absl::StrCat(path, ".", scope);
      }
      last = scope;
    }
    candidates.push_back(path);
    candidates.push_back(absl::StrCat(path, ".", op));
  } else {
    candidates.push_back(op);
  }
  candidates.push_back(out);
  for (const std::string& c : candidates) {
    if (Free(c)) return c;
  }
  return FreshId(candidates.front());
}

bool ImportContext::Free(const std::string& id) const {
  return !id.empty() && !nb_.Find(id).valid() && !initializers_.contains(id) &&
         !reserved_.contains(id) && id != "loss" && id != "target" &&
         !absl::StartsWith(id, "grad:");
}

std::string ImportContext::FreshId(const std::string& stem) const {
  for (int n = 2;; ++n) {
    std::string id = absl::StrCat(stem, "#", n);
    if (Free(id)) return id;
  }
}

}  // namespace pebble::onnx_import
