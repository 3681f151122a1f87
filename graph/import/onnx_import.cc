// ONNX import (see onnx_import.h and docs/import.md).
#include "graph/import/onnx_import.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "onnx/onnx_pb.h"
#include "onnx/shape_inference/implementation.h"

namespace pebble {
namespace {

using Json = nlohmann::json;

absl::StatusOr<DType> DTypeOfOnnx(int elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::FLOAT: return DType::kFloat32;
    case onnx::TensorProto::FLOAT16: return DType::kFloat16;
    case onnx::TensorProto::BFLOAT16: return DType::kBFloat16;
    case onnx::TensorProto::INT64: return DType::kInt64;
    case onnx::TensorProto::UINT8: return DType::kUInt8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("ONNX element type ", elem_type, " has no pebble dtype"));
  }
}

// The node as errors name it: "ONNX node 'name' (op Conv)".
std::string NodeLabel(const onnx::NodeProto& node) {
  const std::string& name = node.name().empty() && node.output_size() > 0
                                ? node.output(0)
                                : node.name();
  return absl::StrCat("ONNX node ", Quote(name), " (op ", Printable(node.op_type()), ")");
}

// `what` may quote ids derived from the file's names (a graph builder's
// message): escaped, so that the error stays one line.
absl::Status NodeError(const onnx::NodeProto& node, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(NodeLabel(node), ": ", Printable(what, 4000)));
}

// The dim that `axis` of `node` names in an input of rank `rank`. ONNX counts
// a negative axis from the end, so -rank to rank - 1 are valid (to rank
// where `one_past_last`: Flatten's axis). Else an error naming the node, the
// axis as written (`what`: "axis -9", "axis 9 of axes [0,9]") and the rank.
absl::StatusOr<int64_t> OnnxAxis(const onnx::NodeProto& node, absl::string_view what,
                                 int64_t axis, int64_t rank, bool one_past_last = false) {
  const int64_t last = one_past_last ? rank : rank - 1;
  if (axis < -rank || axis > last) {
    return NodeError(node, absl::StrCat(what, " is out of range for an input of rank ", rank,
                                        last < 0 ? " (a scalar has no axis)"
                                                 : absl::StrCat(" (", -rank, " to ", last,
                                                                " are valid)")));
  }
  return axis < 0 ? axis + rank : axis;
}

// One ONNX node's attributes, read with their types checked.
class Attrs {
 public:
  explicit Attrs(const onnx::NodeProto& node) : node_(node) {
    for (const onnx::AttributeProto& a : node.attribute()) by_name_[a.name()] = &a;
  }
  bool has(absl::string_view name) const { return by_name_.contains(name); }

  absl::StatusOr<int64_t> Int(absl::string_view name, int64_t fallback) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::INT) return Wrong(name, "an integer");
    return a->i();
  }
  absl::StatusOr<double> Float(absl::string_view name, double fallback) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::FLOAT) return Wrong(name, "a float");
    return a->f();
  }
  absl::StatusOr<std::string> String(absl::string_view name, std::string fallback) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::STRING) return Wrong(name, "a string");
    return a->s();
  }
  absl::StatusOr<std::vector<int64_t>> Ints(absl::string_view name,
                                            std::vector<int64_t> fallback) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::INTS) return Wrong(name, "a list of integers");
    return std::vector<int64_t>(a->ints().begin(), a->ints().end());
  }
  // Every attribute not in `known` is an error: an attribute the importer
  // does not read could change the operator's meaning.
  absl::Status OnlyKnown(std::initializer_list<absl::string_view> known) const {
    for (const auto& [name, a] : by_name_) {
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        return NodeError(node_, absl::StrCat("attribute ", Quote(name),
                                             " is not supported"));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Unsupported(absl::string_view name, absl::string_view value,
                           absl::string_view why = "") const {
    return NodeError(node_, absl::StrCat("attribute ", name, " = ", value,
                                         " is not supported", why.empty() ? "" : " (",
                                         why, why.empty() ? "" : ")"));
  }

 private:
  const onnx::AttributeProto* Find(absl::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }
  absl::Status Wrong(absl::string_view name, absl::string_view what) const {
    return NodeError(node_, absl::StrCat("attribute ", Quote(name), " must be ", what));
  }
  const onnx::NodeProto& node_;
  absl::flat_hash_map<std::string, const onnx::AttributeProto*> by_name_;
};

// Appends the elements of type T that `raw` holds (ONNX's raw_data: packed,
// little-endian) to `out`; false when `raw` is not a whole number of them.
template <typename T, typename Out>
bool DecodeRaw(const std::string& raw, std::vector<Out>& out) {
  if (raw.size() % sizeof(T) != 0) return false;
  for (size_t i = 0; i < raw.size(); i += sizeof(T)) {
    T x;
    std::memcpy(&x, raw.data() + i, sizeof(T));
    out.push_back(static_cast<Out>(x));
  }
  return true;
}

// The values of an integer tensor (initializer or Constant), for shapes,
// pads and axes.
absl::StatusOr<std::vector<int64_t>> IntValues(const onnx::TensorProto& t) {
  if (t.data_type() != onnx::TensorProto::INT64 && t.data_type() != onnx::TensorProto::INT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quote(t.name()), " is not an integer tensor"));
  }
  int64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 20) || (count *= std::max<int64_t>(d, 1)) > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("integer tensor ", Quote(t.name()), " is too large"));
    }
  }
  std::vector<int64_t> values;
  const bool int64 = t.data_type() == onnx::TensorProto::INT64;
  if (const std::string& raw = t.raw_data(); !raw.empty()) {
    if (!(int64 ? DecodeRaw<int64_t>(raw, values) : DecodeRaw<int32_t>(raw, values))) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quote(t.name()), ": raw data of ", raw.size(), " bytes"));
    }
  } else if (int64) {
    values.assign(t.int64_data().begin(), t.int64_data().end());
  } else {
    values.assign(t.int32_data().begin(), t.int32_data().end());
  }
  const int64_t expected = t.dims().empty() ? 1 : count;
  if (static_cast<int64_t>(values.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(t.name()), " holds ",
                                                   values.size(), " values for ", expected,
                                                   " elements"));
  }
  return values;
}

// A float or double tensor's values (Resize's scales), when it is one of at
// most 2^20 elements.
std::optional<std::vector<double>> FloatValues(const onnx::TensorProto& t) {
  int64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 20) || (count *= d) > (int64_t{1} << 20)) {
      return std::nullopt;
    }
  }
  const std::string& raw = t.raw_data();
  std::vector<double> values;
  bool decoded = true;
  if (t.data_type() == onnx::TensorProto::FLOAT) {
    if (raw.empty()) {
      values.assign(t.float_data().begin(), t.float_data().end());
    } else {
      decoded = DecodeRaw<float>(raw, values);
    }
  } else if (t.data_type() == onnx::TensorProto::DOUBLE) {
    if (raw.empty()) {
      values.assign(t.double_data().begin(), t.double_data().end());
    } else {
      decoded = DecodeRaw<double>(raw, values);
    }
  } else {
    return std::nullopt;
  }
  if (!decoded || static_cast<int64_t>(values.size()) != count) return std::nullopt;
  return values;
}

// A scalar float tensor's value (Dropout's ratio), when it is one.
std::optional<double> FloatScalar(const onnx::TensorProto& t) {
  std::optional<std::vector<double>> values = FloatValues(t);
  if (!values || values->size() != 1) return std::nullopt;
  return values->front();
}

std::optional<bool> BoolScalar(const onnx::TensorProto& t) {
  if (t.data_type() != onnx::TensorProto::BOOL) return std::nullopt;
  if (t.raw_data().size() == 1) return t.raw_data()[0] != 0;
  if (t.int32_data_size() == 1) return t.int32_data(0) != 0;
  return std::nullopt;
}

// Symmetric ONNX pads [b_1..b_d, e_1..e_d] as one padding per spatial dim.
absl::StatusOr<std::vector<int64_t>> SymmetricPads(const Attrs& attrs, const onnx::NodeProto& node,
                                                   int spatial) {
  ASSIGN_OR_RETURN(std::vector<int64_t> pads,
                   attrs.Ints("pads", std::vector<int64_t>(2 * spatial, 0)));
  if (static_cast<int>(pads.size()) != 2 * spatial) {
    return NodeError(node, absl::StrCat("attribute pads has ", pads.size(), " values for ",
                                        spatial, " spatial dims"));
  }
  std::vector<int64_t> padding(spatial);
  for (int d = 0; d < spatial; ++d) {
    if (pads[d] != pads[d + spatial]) {
      return attrs.Unsupported("pads", absl::StrCat("[", absl::StrJoin(pads, ","), "]"),
                               "asymmetric padding");
    }
    padding[d] = pads[d];
  }
  return padding;
}

absl::Status OnlyNotSetAutoPad(const Attrs& attrs) {
  ASSIGN_OR_RETURN(std::string auto_pad, attrs.String("auto_pad", "NOTSET"));
  if (auto_pad != "NOTSET") {
    return attrs.Unsupported("auto_pad", Quote(auto_pad), "give explicit pads");
  }
  return absl::OkStatus();
}

absl::Status AllOnes(const Attrs& attrs, absl::string_view name, int spatial) {
  ASSIGN_OR_RETURN(std::vector<int64_t> v, attrs.Ints(name, std::vector<int64_t>(spatial, 1)));
  for (int64_t x : v) {
    if (x != 1) {
      return attrs.Unsupported(name, absl::StrCat("[", absl::StrJoin(v, ","), "]"));
    }
  }
  return absl::OkStatus();
}

class Importer {
 public:
  using Handler = absl::Status (Importer::*)(const onnx::NodeProto&);
  // The operator mapping, by ONNX op type.
  static const std::map<std::string, Handler>& Handlers();

  Importer(const onnx::ModelProto& model, absl::string_view name, const OnnxImportOptions& options)
      : model_(model), graph_(model.graph()), options_(options), nb_(std::string(name),
                                                                      options.cost_model) {}

  absl::StatusOr<Graph> Run() {
    RETURN_IF_ERROR(CheckOpset());
    RETURN_IF_ERROR(CollectInitializers());
    for (const onnx::ValueInfoProto& v : graph_.input()) reserved_.insert(v.name());
    for (const onnx::ValueInfoProto& v : graph_.output()) reserved_.insert(v.name());
    RETURN_IF_ERROR(AddGraphInputs());
    for (const onnx::NodeProto& node : graph_.node()) {
      RETURN_IF_ERROR(ImportNode(node));
      RETURN_IF_ERROR(nb_.status());
    }
    // ONNX's own shape inference runs only now, on nodes whose attributes
    // pebble has checked: it trusts them (a stride of 0 divides by zero in
    // libonnx's convolution inference, found by fuzzing).
    ReadDeclaredShapes();
    for (const onnx::NodeProto& node : graph_.node()) {
      RETURN_IF_ERROR(CheckDeclaredShapes(node));
    }
    if (graph_.output_size() == 0) {
      return absl::InvalidArgumentError("the ONNX graph has no outputs");
    }
    for (const onnx::ValueInfoProto& out : graph_.output()) {
      auto it = values_.find(out.name());
      if (it == values_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ONNX graph output ", Quote(out.name()), " is not computed by any node"));
      }
      nb_.MarkOutput(it->second);
    }
    ASSIGN_OR_RETURN(Graph forward, nb_.Build());
    return AddLossAndDifferentiate(forward, options_.loss, options_.cost_model);
  }

 private:
  absl::Status CheckOpset() {
    bool found = false;
    for (const onnx::OperatorSetIdProto& op_set : model_.opset_import()) {
      if (op_set.domain().empty() || op_set.domain() == "ai.onnx") {
        found = true;
        opset_ = op_set.version();
      }
    }
    if (!found) return absl::InvalidArgumentError("the model imports no ONNX opset");
    if (opset_ < kMinOnnxOpset || opset_ > kMaxOnnxOpset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ONNX opset ", opset_, " is not supported (", kMinOnnxOpset, " to ", kMaxOnnxOpset,
          "; torch.onnx.export(..., opset_version=13) writes one)"));
    }
    return absl::OkStatus();
  }

  absl::Status CollectInitializers() {
    for (const onnx::TensorProto& t : graph_.initializer()) {
      if (t.name().empty()) return absl::InvalidArgumentError("an initializer has no name");
      if (!initializers_.emplace(t.name(), &t).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("initializer ", Quote(t.name()), " is given twice"));
      }
    }
    if (graph_.sparse_initializer_size() > 0) {
      return absl::InvalidArgumentError("sparse initializers are not supported");
    }
    // Batch-norm running statistics are buffers, not parameters.
    for (const onnx::NodeProto& node : graph_.node()) {
      if (node.op_type() != "BatchNormalization") continue;
      for (int i = 3; i < std::min(node.input_size(), 5); ++i) buffers_.insert(node.input(i));
    }
    return absl::OkStatus();
  }

  // Shapes ONNX shape inference gives (or the model declares) by value
  // name, to check pebble's against. Without --batch every dim counts;
  // with it, dim 0 is skipped (the model's batch is rewritten).
  void ReadDeclaredShapes() {
    onnx::ModelProto inferred = model_;
    try {
      onnx::shape_inference::InferShapes(inferred);
    } catch (const std::exception& e) {
      // ONNX's inference refuses what it cannot type (shapes the model
      // declares in contradiction with its nodes, say): the shapes the model
      // itself declares are checked instead.
      inferred = model_;
    }
    auto read = [&](const onnx::ValueInfoProto& info) {
      if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) return;
      Shape shape;
      for (const auto& dim : info.type().tensor_type().shape().dim()) {
        shape.push_back(dim.has_dim_value() ? dim.dim_value() : -1);
      }
      declared_[info.name()] = std::move(shape);
    };
    for (const auto& info : inferred.graph().value_info()) read(info);
    for (const auto& info : inferred.graph().output()) read(info);
  }

  absl::Status AddGraphInputs() {
    for (const onnx::ValueInfoProto& in : graph_.input()) {
      if (initializers_.contains(in.name())) continue;  // old exporters list them
      if (!in.type().has_tensor_type()) {
        return absl::InvalidArgumentError(
            absl::StrCat("graph input ", Quote(in.name()), " is not a tensor"));
      }
      const onnx::TypeProto::Tensor& tt = in.type().tensor_type();
      auto dtype = DTypeOfOnnx(tt.elem_type());
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("graph input ", Quote(in.name()), ": ",
                                                       dtype.status().message()));
      }
      if (!tt.has_shape()) {
        return absl::InvalidArgumentError(
            absl::StrCat("graph input ", Quote(in.name()), " has no shape"));
      }
      Shape shape;
      for (int d = 0; d < tt.shape().dim_size(); ++d) {
        const auto& dim = tt.shape().dim(d);
        if (d == 0 && options_.batch.has_value()) {
          shape.push_back(*options_.batch);
        } else if (dim.has_dim_value() && dim.dim_value() > 0) {
          shape.push_back(dim.dim_value());
        } else {
          const std::string what =
              dim.has_dim_param() ? absl::StrCat("symbolic (", Quote(dim.dim_param()), ")")
                                  : std::string("unknown");
          return absl::InvalidArgumentError(absl::StrCat(
              "graph input ", Quote(in.name()), ": dimension ", d, " is ", what,
              d == 0 ? "; give the batch size with --batch N"
                     : "; only the batch dimension may be symbolic (export with fixed sizes)"));
        }
      }
      values_[in.name()] = nb_.Input(in.name(), shape, *dtype);
      RETURN_IF_ERROR(nb_.status());
    }
    return absl::OkStatus();
  }

  // The pebble value of ONNX value `name`: computed, a graph input, or an
  // initializer made a persistent node on first use.
  absl::StatusOr<Value> Get(const onnx::NodeProto& node, const std::string& name) {
    if (auto it = values_.find(name); it != values_.end()) return it->second;
    if (unreadable_.contains(name)) {
      return NodeError(node, absl::StrCat("reads ", Quote(name),
                                          ", an output a training step does not produce "
                                          "(updated running statistics, a dropout mask)"));
    }
    auto init = initializers_.find(name);
    if (init == initializers_.end()) {
      // A float scalar Constant read by a computation (GELU's 0.5 and
      // sqrt(2), a "+ 1"): a one-element `fill` node of that value.
      if (auto c = constants_.find(name); c != constants_.end()) {
        if (std::optional<double> value = FloatScalar(*c->second)) {
          const Shape shape(c->second->dims().begin(), c->second->dims().end());
          const std::string id = Free(name) ? name : FreshId(name);
          const Value v = nb_.Apply("fill", {},
                                    {{"shape", std::vector<int64_t>(shape.begin(), shape.end())},
                                     {"dtype", "f32"},
                                     {"value", *value}},
                                    id);
          if (!nb_.status().ok()) return NodeError(node, nb_.status().message());
          values_[name] = v;
          return v;
        }
      }
      return NodeError(node, absl::StrCat("input ", Quote(name),
                                          " is not computed before it is read"));
    }
    const onnx::TensorProto& t = *init->second;
    auto dtype = DTypeOfOnnx(t.data_type());
    if (!dtype.ok()) {
      return NodeError(node, absl::StrCat("initializer ", Quote(name), ": ",
                                          dtype.status().message()));
    }
    Shape shape(t.dims().begin(), t.dims().end());
    for (int64_t d : shape) {
      if (d <= 0) {
        return NodeError(node, absl::StrCat("initializer ", Quote(name), " has shape ",
                                            ShapeToString(shape)));
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

  // A constant integer input (an initializer or a Constant node's value).
  absl::StatusOr<std::vector<int64_t>> ConstInts(const onnx::NodeProto& node, int i) {
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

  const onnx::TensorProto* ConstTensor(const std::string& name) const {
    if (auto it = constants_.find(name); it != constants_.end()) return it->second;
    if (auto it = initializers_.find(name); it != initializers_.end()) return it->second;
    return nullptr;
  }

  // Whether `id` may name a new node: not a node, initializer or input yet,
  // and not one of the names the loss and autodiff add.
  bool Free(const std::string& id) const {
    return !id.empty() && !nb_.Find(id).valid() && !initializers_.contains(id) &&
           !reserved_.contains(id) && id != "loss" && id != "target" &&
           !absl::StartsWith(id, "grad:");
  }
  std::string FreshId(const std::string& stem) const {
    for (int n = 2;; ++n) {
      std::string id = absl::StrCat(stem, "#", n);
      if (Free(id)) return id;
    }
  }

  // The id of the node computing `node`'s first output: the graph output's
  // name for a graph output; else the module path torch.onnx.export puts in
  // the node name ("/layer1/layer1.0/conv1/Conv" -> "layer1.0.conv1", then
  // "layer1.0.conv1.conv" for a second node of the module); else the op in
  // lower case; else the ONNX value name.
  std::string NodeIdFor(const onnx::NodeProto& node) const {
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

  absl::Status Define(const onnx::NodeProto& node, Value v) {
    RETURN_IF_ERROR(nb_.status());
    if (node.output_size() < 1 || node.output(0).empty()) {
      return NodeError(node, "has no output");
    }
    if (!values_.emplace(node.output(0), v).second) {
      return NodeError(node, absl::StrCat("its output ", Quote(node.output(0)),
                                          " is already defined (ONNX values are assigned once)"));
    }
    return absl::OkStatus();
  }

  // Reshape, Flatten, Squeeze and Unsqueeze, and the reshapes of the
  // lowerings, become pebble's reshape and flatten: the same bytes in the
  // same order, so each is an alias (a view) of its input and holds no
  // memory of its own (docs/import.md).
  static bool IsView(absl::string_view op) { return op == "reshape" || op == "flatten"; }
  void MarkView(absl::string_view op, Value v, const std::vector<Value>& inputs) {
    if (IsView(op) && v.valid() && inputs.size() == 1) nb_.SetAliasOf(v, inputs[0]);
  }

  // Applies pebble op `op` with the node's first output as id.
  absl::Status Apply(const onnx::NodeProto& node, absl::string_view op, std::vector<Value> inputs,
                     Json attrs = Json::object(), std::string id = "") {
    if (node.output_size() < 1 || node.output(0).empty()) return NodeError(node, "has no output");
    const Value v = nb_.Apply(op, inputs, std::move(attrs), id.empty() ? NodeIdFor(node) : id);
    MarkView(op, v, inputs);
    if (!nb_.status().ok()) {
      return NodeError(node, nb_.status().message());
    }
    return Define(node, v);
  }

  // A node `node` needs beside the one computing its output (a lowering's
  // reshape, transpose, statistics): id "<node's id>.<suffix>".
  absl::StatusOr<Value> Aux(const onnx::NodeProto& node, absl::string_view op,
                            std::vector<Value> inputs, Json attrs, absl::string_view suffix) {
    const std::string id = absl::StrCat(NodeIdFor(node), ".", suffix);
    const Value v = nb_.Apply(op, inputs, std::move(attrs), Free(id) ? id : FreshId(id));
    MarkView(op, v, inputs);
    if (!nb_.status().ok()) return NodeError(node, nb_.status().message());
    return v;
  }

  // The shape of `shape` with a dim of 1 put at `at`: a 1-D convolution or
  // pooling runs as a 2-D one of height 1.
  static std::vector<int64_t> WithUnitDim(const Shape& shape, size_t at) {
    std::vector<int64_t> out(shape.begin(), shape.end());
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), 1);
    return out;
  }
  // 1-D window attrs as 2-D ones of height 1: `fill` (1 for strides and
  // dilations, 0 for padding) put first.
  static std::vector<int64_t> Widen(std::vector<int64_t> v, int64_t fill) {
    v.insert(v.begin(), fill);
    return v;
  }
  // A 1-D convolution or pooling run as 2-D of height 1: the first
  // `viewed` inputs (x; for a convolution the weight too) get a unit dim at
  // 2 (reshapes: views of their inputs), `op` runs on them with `attrs`
  // (already 2-D), and its result is viewed back without that dim.
  absl::Status ApplyAs2d(const onnx::NodeProto& node, absl::string_view op,
                         std::vector<Value> in, size_t viewed, Json attrs) {
    static constexpr absl::string_view kViewSuffix[] = {"x2d", "w2d"};
    for (size_t i = 0; i < viewed; ++i) {
      ASSIGN_OR_RETURN(in[i], Aux(node, "reshape", {in[i]},
                                  {{"shape", WithUnitDim(nb_.type(in[i]).shape, 2)}},
                                  kViewSuffix[i]));
    }
    ASSIGN_OR_RETURN(Value y, Aux(node, op, std::move(in), std::move(attrs), op));
    std::vector<int64_t> back(nb_.type(y).shape.begin(), nb_.type(y).shape.end());
    back.erase(back.begin() + 2);
    return Apply(node, "reshape", {y}, {{"shape", back}});
  }

  absl::Status ExpectInputs(const onnx::NodeProto& node, int min, int max) {
    if (node.input_size() < min || node.input_size() > max) {
      return NodeError(node, absl::StrCat("has ", node.input_size(), " inputs; expected ", min,
                                          min == max ? "" : absl::StrCat(" to ", max)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Value>> Inputs(const onnx::NodeProto& node) {
    std::vector<Value> inputs;
    for (const std::string& name : node.input()) {
      if (name.empty()) continue;
      ASSIGN_OR_RETURN(Value v, Get(node, name));
      inputs.push_back(v);
    }
    return inputs;
  }

  absl::Status ImportNode(const onnx::NodeProto& node) {
    if (!node.domain().empty() && node.domain() != "ai.onnx") {
      return NodeError(node, absl::StrCat("operator domain ", Quote(node.domain()),
                                          " is not supported"));
    }
    const auto& handlers = Handlers();
    auto it = handlers.find(node.op_type());
    if (it == handlers.end()) {
      return NodeError(node, absl::StrCat("operator not supported (supported: ",
                                          absl::StrJoin(SupportedOnnxOps(), ", "),
                                          "; docs/import.md)"));
    }
    return (this->*(it->second))(node);
  }

  absl::Status CheckDeclaredShapes(const onnx::NodeProto& node) {
    for (const std::string& out : node.output()) {
      auto v = values_.find(out);
      auto declared = declared_.find(out);
      if (v == values_.end() || declared == declared_.end() || !nb_.has_type(v->second)) continue;
      const Shape& ours = nb_.type(v->second).shape;
      const Shape& theirs = declared->second;
      bool same = ours.size() == theirs.size();
      for (size_t d = 0; same && d < ours.size(); ++d) {
        if (theirs[d] < 0 || (d == 0 && options_.batch.has_value())) continue;
        same = ours[d] == theirs[d];
      }
      if (!same) {
        return NodeError(node, absl::StrCat("pebble computes ", Quote(out), " as ",
                                            ShapeToString(ours), " but ONNX as ",
                                            ShapeToString(theirs)));
      }
    }
    return absl::OkStatus();
  }

  // ---- Operators.

  absl::Status Conv(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 3));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"auto_pad", "dilations", "group", "kernel_shape", "pads",
                                     "strides"}));
    const int rank = static_cast<int>(nb_.type(in[0]).shape.size());
    if (rank != 3 && rank != 4 && rank != 5) {
      return NodeError(node, absl::StrCat("only 1-D, 2-D and 3-D convolutions are supported; x is ",
                                          ShapeToString(nb_.type(in[0]).shape)));
    }
    const int spatial = rank - 2;
    RETURN_IF_ERROR(OnlyNotSetAutoPad(attrs));
    ASSIGN_OR_RETURN(std::vector<int64_t> dilations,
                     attrs.Ints("dilations", std::vector<int64_t>(spatial, 1)));
    if (static_cast<int>(dilations.size()) != spatial) {
      return attrs.Unsupported("dilations", absl::StrCat("[", absl::StrJoin(dilations, ","),
                                                         "] (one per spatial dim expected)"));
    }
    ASSIGN_OR_RETURN(int64_t group, attrs.Int("group", 1));
    ASSIGN_OR_RETURN(std::vector<int64_t> padding, SymmetricPads(attrs, node, spatial));
    ASSIGN_OR_RETURN(std::vector<int64_t> strides,
                     attrs.Ints("strides", std::vector<int64_t>(spatial, 1)));
    ASSIGN_OR_RETURN(std::vector<int64_t> kernel, attrs.Ints("kernel_shape", {}));
    const Shape& w = nb_.type(in[1]).shape;
    if (!kernel.empty() && (static_cast<int>(w.size()) != rank ||
                            !std::equal(kernel.begin(), kernel.end(), w.begin() + 2))) {
      return NodeError(node, absl::StrCat("kernel_shape [", absl::StrJoin(kernel, ","),
                                          "] disagrees with the weight ", ShapeToString(w)));
    }
    // Groups and dilation the operator table checks (a one-line error
    // naming this node where they do not fit the shapes); written only
    // where they are not 1, as pebble's own models write them.
    Json conv_attrs = {{"stride", strides}, {"padding", padding}};
    if (group != 1) conv_attrs["groups"] = group;
    if (std::any_of(dilations.begin(), dilations.end(), [](int64_t v) { return v != 1; })) {
      conv_attrs["dilation"] = dilations;
    }
    if (spatial > 1) return Apply(node, spatial == 2 ? "conv2d" : "conv3d", in, conv_attrs);
    // 1-D: x (N, C, L) and the weight (O, C/g, k) as 2-D of height 1.
    conv_attrs["stride"] = Widen(strides, 1);
    conv_attrs["padding"] = Widen(padding, 0);
    if (conv_attrs.contains("dilation")) conv_attrs["dilation"] = Widen(dilations, 1);
    return ApplyAs2d(node, "conv2d", in, 2, conv_attrs);
  }

  absl::Status BatchNormalization(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 5, 5));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"epsilon", "momentum", "training_mode", "spatial"}));
    ASSIGN_OR_RETURN(int64_t training_mode, attrs.Int("training_mode", 0));
    // Before opset 14 a training-mode batch norm is told by its extra
    // outputs (the updated running statistics).
    const bool training = opset_ >= 14 ? training_mode != 0 : node.output_size() > 1;
    if (!training) {
      return NodeError(node, "is in inference mode (running statistics); export the model "
                             "with training=torch.onnx.TrainingMode.TRAINING");
    }
    ASSIGN_OR_RETURN(double eps, attrs.Float("epsilon", 1e-5));
    ASSIGN_OR_RETURN(double momentum, attrs.Float("momentum", 0.9));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    // ONNX's momentum weighs the old running value; PyTorch's the new one.
    const Json a = {{"eps", eps}, {"momentum", 1.0 - momentum}};
    // The statistics node names the running statistics it updates in
    // PyTorch (pebble.torch updates them; pebble's executors do not).
    Json stats_attrs = a;
    stats_attrs["running_mean"] = nb_.id(in[3]);
    stats_attrs["running_var"] = nb_.id(in[4]);
    ASSIGN_OR_RETURN(Value stats,
                     Aux(node, "batchnorm_stats", {in[0]}, std::move(stats_attrs), "stats"));
    RETURN_IF_ERROR(Apply(node, "batchnorm", {in[0], stats, in[1], in[2]}, a));
    // The updated running statistics (outputs 1 and 2) are the buffers'
    // in-place update in PyTorch: nothing reads them in a training step.
    for (int i = 1; i < node.output_size(); ++i) {
      if (!node.output(i).empty()) unreadable_.insert(node.output(i));
    }
    return absl::OkStatus();
  }

  absl::Status Unary(const onnx::NodeProto& node, absl::string_view op) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    return Apply(node, op, in);
  }
  absl::Status Relu(const onnx::NodeProto& node) { return Unary(node, "relu"); }
  absl::Status HardSwish(const onnx::NodeProto& node) { return Unary(node, "hardswish"); }

  absl::Status HardSigmoid(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"alpha", "beta"}));
    ASSIGN_OR_RETURN(double alpha, attrs.Float("alpha", 0.2));  // ONNX's defaults
    ASSIGN_OR_RETURN(double beta, attrs.Float("beta", 0.5));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    return Apply(node, "hardsigmoid", in, {{"alpha", alpha}, {"beta", beta}});
  }

  absl::Status LeakyRelu(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"alpha"}));
    ASSIGN_OR_RETURN(double slope, attrs.Float("alpha", 0.01));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    return Apply(node, "leaky_relu", in, {{"negative_slope", slope}});
  }

  // Clip (opset 11 on): optional constant min and max inputs; ReLU6 is
  // Clip(x, 0, 6).
  absl::Status Clip(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 3));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    Json attrs = Json::object();
    for (int i = 1; i < node.input_size(); ++i) {
      if (node.input(i).empty()) continue;
      const onnx::TensorProto* t = ConstTensor(node.input(i));
      std::optional<double> v = t == nullptr ? std::nullopt : FloatScalar(*t);
      if (!v.has_value() || !std::isfinite(*v)) {
        return NodeError(node, absl::StrCat(i == 1 ? "min" : "max",
                                            " must be a constant finite scalar"));
      }
      attrs[i == 1 ? "min" : "max"] = *v;
    }
    ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
    return Apply(node, "clip", {x}, std::move(attrs));
  }
  absl::Status Tanh(const onnx::NodeProto& node) { return Unary(node, "tanh"); }
  absl::Status Erf(const onnx::NodeProto& node) { return Unary(node, "erf"); }
  absl::Status Sqrt(const onnx::NodeProto& node) { return Unary(node, "sqrt"); }

  // Pow by a constant exponent of 2 (x * x) or 0.5 (sqrt): a layer norm
  // written out squares the deviation.
  absl::Status Pow(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 2));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    // The exponent, 0 where it is not a constant scalar (0 is refused too).
    double power = 0;
    if (const onnx::TensorProto* e = ConstTensor(node.input(1)); e != nullptr) {
      if (std::optional<double> f = FloatScalar(*e)) {
        power = *f;
      } else if (absl::StatusOr<std::vector<int64_t>> ints = IntValues(*e);
                 ints.ok() && ints->size() == 1) {
        power = static_cast<double>((*ints)[0]);
      }
    }
    ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
    if (power == 2.0) return Apply(node, "mul", {x, x});
    if (power == 0.5) return Apply(node, "sqrt", {x});
    return NodeError(node, "only a constant exponent of 2 or 0.5 is supported");
  }
  absl::Status Sigmoid(const onnx::NodeProto& node) { return Unary(node, "sigmoid"); }

  absl::Status Binary(const onnx::NodeProto& node, absl::string_view op) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 2));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    if (KnownInts(node.input(0)) && KnownInts(node.input(1))) return FoldArithmetic(node);
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    ASSIGN_OR_RETURN(Value v, Broadcast(node, op, in[0], in[1], ""));
    return Define(node, v);
  }

  // A node of `node`'s lowering: with an empty `suffix` the one whose id is
  // the node's own (its output, still to be defined), else an Aux.
  absl::StatusOr<Value> Lowered(const onnx::NodeProto& node, absl::string_view op,
                                std::vector<Value> inputs, Json attrs, absl::string_view suffix) {
    if (!suffix.empty()) return Aux(node, op, std::move(inputs), std::move(attrs), suffix);
    const Value v = nb_.Apply(op, std::move(inputs), std::move(attrs), NodeIdFor(node));
    if (!nb_.status().ok()) return NodeError(node, nb_.status().message());
    return v;
  }

  // The NumPy broadcast of shapes `a` and `b` (aligned on the trailing dims,
  // each dim equal or 1); nullopt where they do not broadcast.
  template <typename A, typename B>
  static std::optional<std::vector<int64_t>> BroadcastShape(const A& a, const B& b) {
    const size_t rank = std::max(a.size(), b.size());
    std::vector<int64_t> out(rank);
    for (size_t k = 0; k < rank; ++k) {
      const int64_t x = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
      const int64_t y = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
      if (x != y && x != 1 && y != 1) return std::nullopt;
      out[k] = x == 1 ? y : x;
    }
    return out;
  }

  // A zero `fill` of `shape` and `like`'s dtype: what Expand and a two-sided
  // broadcast add a tensor to, to broadcast it.
  absl::StatusOr<Value> Zeros(const onnx::NodeProto& node, const std::vector<int64_t>& shape,
                              Value like, absl::string_view suffix) {
    return Aux(node, "fill", {},
               {{"shape", shape}, {"dtype", std::string(DTypeName(nb_.type(like).dtype))},
                {"value", 0.0}},
               suffix);
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
  absl::StatusOr<Value> Broadcast(const onnx::NodeProto& node, absl::string_view op, Value a,
                                  Value b, absl::string_view suffix) {
    const Shape sa = nb_.type(a).shape, sb = nb_.type(b).shape;
    if (ops_internal::BlockBroadcast(sa, sb) || ops_internal::BlockBroadcast(sb, sa)) {
      return Lowered(node, op, {a, b}, Json::object(), suffix);
    }
    const std::optional<std::vector<int64_t>> broadcast = BroadcastShape(sa, sb);
    if (!broadcast) {
      return NodeError(node, absl::StrCat("shapes ", ShapeToString(sa), " and ",
                                          ShapeToString(sb), " do not broadcast"));
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
      ASSIGN_OR_RETURN(Value zeros, Zeros(node, out, a, prefix("zeros")));
      ASSIGN_OR_RETURN(a, Broadcast(node, "add", zeros, a, prefix("expanded")));
      return Broadcast(node, op, a, b, suffix);
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
    ASSIGN_OR_RETURN(Value moved, Aux(node, "transpose", {full}, {{"perm", perm}},
                                      prefix("broadcast_first")));
    ASSIGN_OR_RETURN(Value view, Aux(node, "reshape", {other}, {{"shape", kept}},
                                     prefix("broadcast_view")));
    ASSIGN_OR_RETURN(Value y, Aux(node, op, a_full ? std::vector<Value>{moved, view}
                                                   : std::vector<Value>{view, moved},
                                  Json::object(), prefix(op)));
    return Lowered(node, "transpose", {y}, {{"perm", inverse}}, suffix);
  }
  absl::Status Add(const onnx::NodeProto& node) { return Binary(node, "add"); }
  absl::Status Mul(const onnx::NodeProto& node) { return Binary(node, "mul"); }
  absl::Status Sub(const onnx::NodeProto& node) { return Binary(node, "sub"); }
  // Mod: shape arithmetic only (newer exporters write it for attention's
  // head split); both operands must be known integers.
  absl::Status Mod(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 2));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"fmod"}));
    ASSIGN_OR_RETURN(int64_t fmod, attrs.Int("fmod", 0));
    if (!KnownInts(node.input(0)) || !KnownInts(node.input(1))) {
      return NodeError(node, "Mod of tensors is not supported: only integer shape arithmetic, "
                             "folded at import");
    }
    return FoldArithmetic(node, fmod != 0);
  }
  absl::Status Div(const onnx::NodeProto& node) { return Binary(node, "div"); }

  // ---- Integer tensors known at import: shapes and their arithmetic.
  // torch.onnx.export writes `x.size()` and the sizes computed from it
  // (Shape, Gather, Div, Unsqueeze, Concat, ...) as nodes; every shape is
  // static here, so they fold into constants that Reshape, Slice and the
  // others read. No pebble node is made for them.

  struct Ints {
    Shape dims;
    std::vector<int64_t> values;
  };
  std::optional<Ints> KnownInts(const std::string& name) const {
    const onnx::TensorProto* t = ConstTensor(name);
    if (t == nullptr) return std::nullopt;
    absl::StatusOr<std::vector<int64_t>> values = IntValues(*t);
    if (!values.ok()) return std::nullopt;
    return Ints{Shape(t->dims().begin(), t->dims().end()), *std::move(values)};
  }
  absl::Status DefineInts(const onnx::NodeProto& node, int output, Ints ints) {
    if (output >= node.output_size() || node.output(output).empty()) {
      return NodeError(node, "has no output");
    }
    onnx::TensorProto& t = folded_.emplace_back();
    t.set_name(node.output(output));
    t.set_data_type(onnx::TensorProto::INT64);
    for (int64_t d : ints.dims) t.add_dims(d);
    for (int64_t v : ints.values) t.add_int64_data(v);
    constants_[node.output(output)] = &t;
    return absl::OkStatus();
  }

  // Add, Sub, Mul, Div, Mod of two integer tensors (a scalar or one-element
  // operand broadcast over the other); Div of non-negative values; Mod by a
  // non-zero divisor, the result's sign the divisor's (fmod 0, as Python's
  // %) or the dividend's (fmod 1, as C's %).
  absl::Status FoldArithmetic(const onnx::NodeProto& node, bool fmod = false) {
    Ints a = *KnownInts(node.input(0));
    const Ints b = *KnownInts(node.input(1));
    const size_t na = a.values.size(), nb = b.values.size();
    if (na != nb && na != 1 && nb != 1) {
      return NodeError(node, absl::StrCat("integer operands of ", na, " and ", nb,
                                          " values do not broadcast"));
    }
    Ints out = na >= nb ? a : b;
    const std::string& op = node.op_type();
    for (size_t i = 0; i < out.values.size(); ++i) {
      const int64_t x = a.values[na == 1 ? 0 : i], y = b.values[nb == 1 ? 0 : i];
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
    return DefineInts(node, 0, std::move(out));
  }

  // Shape of a value (its static shape), dims [start, end) from opset 15.
  absl::Status ShapeOf(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"start", "end"}));
    ASSIGN_OR_RETURN(Operand in, FirstOperand(node));
    const Shape& shape = in.shape;
    const auto rank = static_cast<int64_t>(shape.size());
    ASSIGN_OR_RETURN(int64_t start, attrs.Int("start", 0));
    ASSIGN_OR_RETURN(int64_t end, attrs.Int("end", rank));
    start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
    end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
    std::vector<int64_t> dims(shape.begin() + start, shape.begin() + std::max(start, end));
    const auto n = static_cast<int64_t>(dims.size());
    return DefineInts(node, 0, Ints{{n}, std::move(dims)});
  }

  // Gather of a known integer vector (a shape's dims) at constant indices;
  // of a computed tensor at one constant index (x[:, 0]): a slice and a
  // reshape dropping the dim.
  absl::Status Gather(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 2));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"axis"}));
    ASSIGN_OR_RETURN(int64_t axis, attrs.Int("axis", 0));
    std::optional<Ints> data = KnownInts(node.input(0));
    std::optional<Ints> indices = KnownInts(node.input(1));
    if (!data && indices && indices->dims.empty()) {
      ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
      const Shape shape = nb_.type(x).shape;
      const auto rank = static_cast<int64_t>(shape.size());
      ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank));
      int64_t i = indices->values[0];
      if (i < -shape[axis] || i >= shape[axis]) {
        return NodeError(node, absl::StrCat("index ", i, " out of range"));
      }
      if (i < 0) i += shape[axis];
      ASSIGN_OR_RETURN(Value part, Aux(node, "slice", {x},
                                       {{"axis", axis}, {"begin", i}, {"end", i + 1}}, "slice"));
      std::vector<int64_t> out(shape.begin(), shape.end());
      out.erase(out.begin() + axis);
      return Apply(node, "reshape", {part}, {{"shape", out}});
    }
    if (data) {
      ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis,
                                      static_cast<int64_t>(data->dims.size())));
    }
    if (!data || !indices || data->dims.size() != 1) {
      return NodeError(node, "only a Gather from a constant integer vector (a shape) or at one "
                             "constant index is supported (an embedding look-up is not yet)");
    }
    Ints out{indices->dims, {}};
    const auto n = static_cast<int64_t>(data->values.size());
    for (int64_t i : indices->values) {
      if (i < -n || i >= n) return NodeError(node, absl::StrCat("index ", i, " out of range"));
      out.values.push_back(data->values[i < 0 ? i + n : i]);
    }
    return DefineInts(node, 0, std::move(out));
  }

  // Input 0 of `node`: known integers, or else a computed value; its shape.
  struct Operand {
    std::optional<Ints> ints;
    Value value;
    Shape shape;
  };
  absl::StatusOr<Operand> FirstOperand(const onnx::NodeProto& node) {
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

  // ConstantOfShape of a known shape with an integer value: folds (the
  // ones torch writes for Expand's -1 dims).
  absl::Status ConstantOfShape(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"value"}));
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, ConstInts(node, 0));
    int64_t value = 0;
    for (const onnx::AttributeProto& a : node.attribute()) {
      if (a.name() != "value") continue;
      absl::StatusOr<std::vector<int64_t>> v = IntValues(a.t());
      if (!v.ok() || v->size() != 1) {
        return NodeError(node, "only an integer value is supported (a shape's arithmetic)");
      }
      value = (*v)[0];
    }
    int64_t count = 1;
    for (int64_t d : shape) {
      if (d < 0 || d > (int64_t{1} << 20) || (count *= d) > (int64_t{1} << 20)) {
        return NodeError(node, "shape is negative or too large for a constant");
      }
    }
    return DefineInts(node, 0, Ints{Shape(shape.begin(), shape.end()),
                                    std::vector<int64_t>(count, value)});
  }

  // Equal of known integers (0 or 1) and Where over them: Expand's shape.
  absl::Status Equal(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 2));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    std::optional<Ints> a = KnownInts(node.input(0)), b = KnownInts(node.input(1));
    if (!a || !b || (a->values.size() != b->values.size() && b->values.size() != 1)) {
      return NodeError(node, "only Equal of integer constants and shapes is supported");
    }
    Ints out = *a;
    for (size_t i = 0; i < out.values.size(); ++i) {
      out.values[i] = a->values[i] == b->values[b->values.size() == 1 ? 0 : i] ? 1 : 0;
    }
    return DefineInts(node, 0, std::move(out));
  }
  absl::Status Where(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 3, 3));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    std::optional<Ints> c = KnownInts(node.input(0)), x = KnownInts(node.input(1)),
                        y = KnownInts(node.input(2));
    const size_t n = c ? c->values.size() : 0;
    auto fits = [n](const std::optional<Ints>& t) {
      return t && (t->values.size() == n || t->values.size() == 1);
    };
    if (!c || !fits(x) || !fits(y)) {
      return NodeError(node, "only Where over integer constants and shapes is supported");
    }
    Ints out = *c;
    for (size_t i = 0; i < n; ++i) {
      out.values[i] = c->values[i] != 0 ? x->values[x->values.size() == 1 ? 0 : i]
                                        : y->values[y->values.size() == 1 ? 0 : i];
    }
    return DefineInts(node, 0, std::move(out));
  }

  // Expand of a computed tensor to a known shape (NumPy broadcast): added
  // to a zero `fill` of the result's shape, which broadcasts it.
  absl::Status Expand(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 2));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, ConstInts(node, 1));
    ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
    const Shape& in = nb_.type(x).shape;
    const std::optional<std::vector<int64_t>> out = BroadcastShape(in, shape);
    if (!out) {
      return NodeError(node, absl::StrCat("cannot expand ", ShapeToString(in), " to [",
                                          absl::StrJoin(shape, ","), "]"));
    }
    if (Shape(out->begin(), out->end()) == in) return Define(node, x);
    ASSIGN_OR_RETURN(Value zeros, Zeros(node, *out, x, "zeros"));
    ASSIGN_OR_RETURN(Value v, Broadcast(node, "add", zeros, x, ""));
    return Define(node, v);
  }

  // The axes of Unsqueeze / Squeeze: an input from opset 13, before that
  // an attribute.
  absl::StatusOr<std::vector<int64_t>> AxesOf(const onnx::NodeProto& node, bool required) {
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"axes"}));
    if (node.input_size() >= 2 && !node.input(1).empty()) return ConstInts(node, 1);
    if (attrs.has("axes")) return attrs.Ints("axes", {});
    if (required) return NodeError(node, "has no axes");
    return std::vector<int64_t>{};
  }

  // Unsqueeze and Squeeze: new dims of the values' shape; a reshape of a
  // computed tensor.
  absl::Status Unsqueeze(const onnx::NodeProto& node) { return SqueezeOrUnsqueeze(node, true); }
  absl::Status Squeeze(const onnx::NodeProto& node) { return SqueezeOrUnsqueeze(node, false); }
  absl::Status SqueezeOrUnsqueeze(const onnx::NodeProto& node, bool unsqueeze) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 2));
    ASSIGN_OR_RETURN(std::vector<int64_t> axes, AxesOf(node, unsqueeze));
    ASSIGN_OR_RETURN(Operand in, FirstOperand(node));
    const std::optional<Ints>& ints = in.ints;
    Value x = in.value;
    const Shape& shape = in.shape;
    const auto out_rank = static_cast<int64_t>(shape.size()) +
                          (unsqueeze ? static_cast<int64_t>(axes.size()) : 0);
    std::set<int64_t> at;
    const std::string all = absl::StrCat("axes [", absl::StrJoin(axes, ","), "]");
    for (int64_t a : axes) {
      // Unsqueeze's axes count in its output's rank.
      const int64_t r = unsqueeze ? out_rank : static_cast<int64_t>(shape.size());
      ASSIGN_OR_RETURN(const int64_t d,
                       OnnxAxis(node, absl::StrCat("axis ", a, " of ", all), a, r));
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
          return NodeError(node, absl::StrCat("cannot squeeze dim ", d, " of ",
                                              ShapeToString(shape)));
        }
        if (!drop) out.push_back(shape[d]);
      }
    }
    if (ints) return DefineInts(node, 0, Ints{out, ints->values});
    return Apply(node, "reshape", {x}, {{"shape", std::vector<int64_t>(out.begin(), out.end())}});
  }

  // Transpose: `perm` (default: the dims reversed).
  absl::Status Transpose(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"perm"}));
    if (std::optional<Ints> ints = KnownInts(node.input(0))) return FoldTranspose(node, *ints);
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    if (!attrs.has("perm")) return Apply(node, "transpose", in);
    ASSIGN_OR_RETURN(std::vector<int64_t> perm, attrs.Ints("perm", {}));
    return Apply(node, "transpose", in, {{"perm", perm}});
  }

  // Transpose of a known integer tensor (F.pad's export transposes its pads).
  absl::Status FoldTranspose(const onnx::NodeProto& node, const Ints& ints) {
    const size_t rank = ints.dims.size();
    std::vector<int64_t> perm;
    for (size_t d = rank; d-- > 0;) perm.push_back(static_cast<int64_t>(d));
    ASSIGN_OR_RETURN(perm, Attrs(node).Ints("perm", perm));
    std::vector<bool> seen(rank, false);
    for (int64_t p : perm) {
      if (perm.size() != rank || p < 0 || p >= static_cast<int64_t>(rank) || seen[p]) {
        return NodeError(node, absl::StrCat("perm [", absl::StrJoin(perm, ","),
                                            "] is not a permutation of the ", rank, " dims of ",
                                            ShapeToString(ints.dims)));
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
    return DefineInts(node, 0, std::move(out));
  }

  // [begin, end) of ONNX Slice's start and end along a dim of `size`:
  // negative values count from the end, both clamped to [0, size].
  static std::pair<int64_t, int64_t> SliceBounds(int64_t start, int64_t end, int64_t size) {
    auto clamp = [size](int64_t v) {
      if (v < 0) v = v < -size ? 0 : v + size;
      return std::min(v, size);
    };
    return {clamp(start), clamp(end)};
  }

  // A Slice of a known integer tensor with any steps, as ONNX defines them
  // (F.pad's export reverses its (dims, 2) pads with a step of -1).
  absl::Status FoldSteppedSlice(const onnx::NodeProto& node, const Ints& ints,
                                const std::vector<int64_t>& starts,
                                const std::vector<int64_t>& ends,
                                const std::vector<int64_t>& axes,
                                const std::vector<int64_t>& steps) {
    const auto rank = static_cast<int64_t>(ints.dims.size());
    // The source index along each dim of each output position.
    std::vector<std::vector<int64_t>> picks(rank);
    for (int64_t d = 0; d < rank; ++d) {
      for (int64_t i = 0; i < ints.dims[d]; ++i) picks[d].push_back(i);
    }
    for (size_t k = 0; k < axes.size(); ++k) {
      ASSIGN_OR_RETURN(const int64_t axis,
                       OnnxAxis(node, absl::StrCat("axis ", axes[k]), axes[k], rank));
      const int64_t size = ints.dims[axis], step = steps[k];
      if (step == 0) return NodeError(node, "step 0");
      auto wrap = [size](int64_t i) { return i < 0 ? i + size : i; };
      std::vector<int64_t>& pick = picks[axis];
      pick.clear();
      if (step > 0) {
        const int64_t end = std::clamp<int64_t>(wrap(ends[k]), 0, size);
        for (int64_t i = std::clamp<int64_t>(wrap(starts[k]), 0, size); i < end; i += step) {
          pick.push_back(i);
        }
      } else {
        const int64_t end = std::clamp<int64_t>(wrap(ends[k]), -1, size - 1);
        for (int64_t i = std::clamp<int64_t>(wrap(starts[k]), 0, size - 1); i > end; i += step) {
          pick.push_back(i);
        }
      }
    }
    Ints out;
    for (const auto& pick : picks) out.dims.push_back(static_cast<int64_t>(pick.size()));
    GatherInts(ints, picks, out);
    return DefineInts(node, 0, std::move(out));
  }

  // out.values[p] = in.values[source of p], p over out.dims in row-major
  // order; the source index along dim d of position (i_0, ...) is picks[d][i_d].
  static void GatherInts(const Ints& in, const std::vector<std::vector<int64_t>>& picks,
                         Ints& out) {
    const size_t rank = in.dims.size();
    std::vector<int64_t> stride(rank, 1);
    for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * in.dims[d];
    int64_t count = 1;
    for (const auto& pick : picks) count *= static_cast<int64_t>(pick.size());
    std::vector<int64_t> at(rank, 0);
    for (int64_t p = 0; p < count; ++p) {
      int64_t source = 0;
      for (size_t d = 0; d < rank; ++d) source += picks[d][at[d]] * stride[d];
      out.values.push_back(in.values[source]);
      for (size_t d = rank; d-- > 0;) {
        if (++at[d] < static_cast<int64_t>(picks[d].size())) break;
        at[d] = 0;
      }
    }
  }

  // Slice with constant (or folded) starts, ends, axes and steps of 1: one
  // pebble `slice` per dim it narrows (none: the input itself). A slice of
  // a known integer vector folds.
  absl::Status Slice(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 3, 5));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    ASSIGN_OR_RETURN(std::vector<int64_t> starts, ConstInts(node, 1));
    ASSIGN_OR_RETURN(std::vector<int64_t> ends, ConstInts(node, 2));
    std::vector<int64_t> axes, steps;
    if (node.input_size() > 3 && !node.input(3).empty()) {
      ASSIGN_OR_RETURN(axes, ConstInts(node, 3));
    } else {
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    }
    if (node.input_size() > 4 && !node.input(4).empty()) {
      ASSIGN_OR_RETURN(steps, ConstInts(node, 4));
    }
    if (ends.size() != starts.size() || axes.size() != starts.size() ||
        (!steps.empty() && steps.size() != starts.size())) {
      return NodeError(node, "starts, ends, axes and steps differ in length");
    }
    ASSIGN_OR_RETURN(Operand in, FirstOperand(node));
    const std::optional<Ints>& ints = in.ints;
    const bool unit_steps =
        std::all_of(steps.begin(), steps.end(), [](int64_t s) { return s == 1; });
    if (ints && !unit_steps) return FoldSteppedSlice(node, *ints, starts, ends, axes, steps);
    for (int64_t s : steps) {
      if (s != 1) return NodeError(node, absl::StrCat("step ", s, " is not supported (only 1)"));
    }
    Value x = in.value;
    const Shape& shape = in.shape;
    const auto rank = static_cast<int64_t>(shape.size());
    struct Cut {
      int64_t axis, begin, end;
    };
    std::vector<Cut> cuts;
    for (size_t i = 0; i < axes.size(); ++i) {
      ASSIGN_OR_RETURN(const int64_t axis,
                       OnnxAxis(node, absl::StrCat("axis ", axes[i]), axes[i], rank));
      const auto [begin, end] = SliceBounds(starts[i], ends[i], shape[axis]);
      if (begin >= end) {
        return NodeError(node, absl::StrCat("slice [", starts[i], ", ", ends[i], ") of dim ",
                                            axis, " of ", ShapeToString(shape),
                                            " is empty (not supported)"));
      }
      if (begin != 0 || end != shape[axis]) cuts.push_back({axis, begin, end});
    }
    if (ints) {
      if (rank != 1) return NodeError(node, "a slice of a constant must be of a vector");
      Ints out = *ints;
      for (const Cut& c : cuts) {
        out.values = std::vector<int64_t>(ints->values.begin() + c.begin,
                                          ints->values.begin() + c.end);
        out.dims = {c.end - c.begin};
      }
      return DefineInts(node, 0, std::move(out));
    }
    if (cuts.empty()) return Define(node, x);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      ASSIGN_OR_RETURN(x, Aux(node, "slice", {x},
                              {{"axis", cuts[i].axis}, {"begin", cuts[i].begin}, {"end", cuts[i].end}},
                              absl::StrCat(cuts[i].axis)));
    }
    const Cut& last = cuts.back();
    return Apply(node, "slice", {x}, {{"axis", last.axis}, {"begin", last.begin}, {"end", last.end}});
  }

  // Split along `axis` into the sizes of input `split` (opset 13; the
  // attribute before), or equal parts: one pebble `slice` per output.
  absl::Status Split(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 2));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"axis", "split"}));
    ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
    const Shape& shape = nb_.type(x).shape;
    const auto rank = static_cast<int64_t>(shape.size());
    ASSIGN_OR_RETURN(int64_t axis, attrs.Int("axis", 0));
    ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank));
    const int parts = node.output_size();
    std::vector<int64_t> sizes;
    if (node.input_size() == 2 && !node.input(1).empty()) {
      ASSIGN_OR_RETURN(sizes, ConstInts(node, 1));
    } else if (attrs.has("split")) {
      ASSIGN_OR_RETURN(sizes, attrs.Ints("split", {}));
    } else if (parts > 0 && shape[axis] % parts == 0) {
      sizes.assign(parts, shape[axis] / parts);
    }
    int64_t total = 0;
    for (int64_t s : sizes) total += s > 0 ? s : -(int64_t{1} << 40);
    if (static_cast<int>(sizes.size()) != parts || total != shape[axis]) {
      return NodeError(node, absl::StrCat("cannot split dim ", axis, " of ",
                                          ShapeToString(shape), " into ", parts, " parts [",
                                          absl::StrJoin(sizes, ","), "]"));
    }
    const std::string id = NodeIdFor(node);
    int64_t begin = 0;
    for (int i = 0; i < parts; ++i) {
      const int64_t end = begin + sizes[i];
      const std::string part = i == 0 ? id : absl::StrCat(id, ".", i);
      const Value v = nb_.Apply("slice", {x}, {{"axis", axis}, {"begin", begin}, {"end", end}},
                                Free(part) ? part : FreshId(part));
      if (!nb_.status().ok()) return NodeError(node, nb_.status().message());
      if (!node.output(i).empty() && !values_.emplace(node.output(i), v).second) {
        return NodeError(node, absl::StrCat("its output ", Quote(node.output(i)),
                                            " is already defined"));
      }
      begin = end;
    }
    return absl::OkStatus();
  }

  absl::Status Pool(const onnx::NodeProto& node, absl::string_view op) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"auto_pad", "ceil_mode", "count_include_pad", "dilations",
                                     "kernel_shape", "pads", "storage_order", "strides"}));
    if (node.output_size() > 1) return NodeError(node, "the Indices output is not supported");
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    const Shape& x = nb_.type(in[0]).shape;
    const int spatial = static_cast<int>(x.size()) - 2;
    if (spatial != 1 && spatial != 2 && spatial != 3) {
      return NodeError(node, absl::StrCat("only 1-D, 2-D and 3-D pooling is supported; x is ",
                                          ShapeToString(x)));
    }
    RETURN_IF_ERROR(OnlyNotSetAutoPad(attrs));
    RETURN_IF_ERROR(AllOnes(attrs, "dilations", spatial));
    ASSIGN_OR_RETURN(int64_t storage_order, attrs.Int("storage_order", 0));
    if (storage_order != 0) return attrs.Unsupported("storage_order", "1");
    ASSIGN_OR_RETURN(std::vector<int64_t> kernel, attrs.Ints("kernel_shape", {}));
    if (static_cast<int>(kernel.size()) != spatial) {
      return NodeError(node, "attribute kernel_shape must give one size per spatial dim");
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> padding, SymmetricPads(attrs, node, spatial));
    ASSIGN_OR_RETURN(std::vector<int64_t> strides,
                     attrs.Ints("strides", std::vector<int64_t>(spatial, 1)));
    if (static_cast<int>(strides.size()) != spatial) {
      return NodeError(node, "attribute strides must give one stride per spatial dim");
    }
    ASSIGN_OR_RETURN(int64_t ceil_mode, attrs.Int("ceil_mode", 0));
    bool ceil_differs = false;  // whether ceil mode may give a larger output
    for (int d = 0; d < spatial; ++d) {
      if (strides[d] <= 0) return NodeError(node, "attribute strides must be positive");
      ceil_differs |= (x[d + 2] + 2 * padding[d] - kernel[d]) % strides[d] != 0;
    }
    // maxpool takes PyTorch's ceil mode; avgpool only where ceil and floor
    // agree (the window fits exactly), since its divisor at the edge differs.
    if (ceil_mode != 0 && ceil_differs && op != "maxpool") {
      return attrs.Unsupported("ceil_mode", "1", "here it gives a larger output than floor mode");
    }
    const bool ceil_attr = ceil_mode != 0 && ceil_differs;
    if (op == "avgpool") {
      ASSIGN_OR_RETURN(int64_t include_pad, attrs.Int("count_include_pad", 0));
      const bool padded = std::any_of(padding.begin(), padding.end(),
                                      [](int64_t p) { return p != 0; });
      if (padded && include_pad == 0) {
        return attrs.Unsupported("count_include_pad", "0",
                                 "pebble's avgpool counts the padding, as PyTorch's default");
      }
    }
    Json pool_attrs = {{"kernel", kernel}, {"stride", strides}, {"padding", padding}};
    if (ceil_attr) pool_attrs["ceil_mode"] = true;
    if (spatial > 1) return Apply(node, op, in, pool_attrs);
    // 1-D: pooled as 2-D of height 1.
    pool_attrs["kernel"] = Widen(kernel, 1);
    pool_attrs["stride"] = Widen(strides, 1);
    pool_attrs["padding"] = Widen(padding, 0);
    return ApplyAs2d(node, op, in, 1, pool_attrs);
  }
  absl::Status MaxPool(const onnx::NodeProto& node) { return Pool(node, "maxpool"); }
  absl::Status AveragePool(const onnx::NodeProto& node) { return Pool(node, "avgpool"); }

  absl::Status GlobalAveragePool(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    // (N, C, 1, ...): adaptive pooling to size 1 keeps ONNX's rank.
    return Apply(node, "adaptive_avgpool", in, {{"output_size", 1}});
  }

  // ReduceMean over every spatial dim (2 ..) of a 2-D or 3-D image: global
  // average pooling, then
  // without keepdims the (N, C) view. Over any other axes: the reduced dims
  // moved last (a transpose, where they are not already), the tensor viewed
  // as (kept..., R), a `linear` by a `fill` row of 1/R, then the view of
  // ONNX's result shape. No axes: every dim.
  absl::Status ReduceMean(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"axes", "keepdims"}));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    const Shape& x = nb_.type(in[0]).shape;
    const auto rank = static_cast<int64_t>(x.size());
    ASSIGN_OR_RETURN(std::vector<int64_t> axes, attrs.Ints("axes", {}));
    ASSIGN_OR_RETURN(int64_t keepdims, attrs.Int("keepdims", 1));
    std::vector<bool> reduced(rank, axes.empty());
    const std::string all = absl::StrCat("axes [", absl::StrJoin(axes, ","), "]");
    for (int64_t a : axes) {
      ASSIGN_OR_RETURN(const int64_t d,
                       OnnxAxis(node, absl::StrCat("axis ", a, " of ", all), a, rank));
      if (reduced[d]) return NodeError(node, absl::StrCat(all, ": dim ", d, " is repeated"));
      reduced[d] = true;
    }
    std::vector<int64_t> result;  // ONNX's output shape
    for (int64_t d = 0; d < rank; ++d) {
      if (!reduced[d]) {
        result.push_back(x[d]);
      } else if (keepdims != 0) {
        result.push_back(1);
      }
    }
    // adaptive_avgpool takes (N, C, H, W) and (N, C, D, H, W).
    const bool spatial = (rank == 4 || rank == 5) && !reduced[0] && !reduced[1] &&
                         std::all_of(reduced.begin() + 2, reduced.end(), std::identity());
    if (spatial) {
      if (keepdims != 0) return Apply(node, "adaptive_avgpool", in, {{"output_size", 1}});
      ASSIGN_OR_RETURN(Value pooled,
                       Aux(node, "adaptive_avgpool", in, {{"output_size", 1}}, "pool"));
      return Apply(node, "reshape", {pooled}, {{"shape", result}});
    }
    // The permutation putting the reduced dims last, in order.
    std::vector<int64_t> perm, kept_dims;
    int64_t count = 1;  // R: the elements each mean averages
    for (int64_t d = 0; d < rank; ++d) {
      if (!reduced[d]) perm.push_back(d), kept_dims.push_back(x[d]);
    }
    for (int64_t d = 0; d < rank; ++d) {
      if (reduced[d]) perm.push_back(d), count *= x[d];
    }
    Value v = in[0];
    if (!std::is_sorted(perm.begin(), perm.end())) {
      ASSIGN_OR_RETURN(v, Aux(node, "transpose", {v}, {{"perm", perm}}, "reduced_last"));
    }
    std::vector<int64_t> rows = kept_dims;  // (kept..., R)
    rows.push_back(count);
    if (Shape(rows.begin(), rows.end()) != nb_.type(v).shape) {
      ASSIGN_OR_RETURN(v, Aux(node, "reshape", {v}, {{"shape", rows}}, "rows"));
    }
    ASSIGN_OR_RETURN(Value row, Aux(node, "fill", {},
                                    {{"shape", {1, count}},
                                     {"dtype", std::string(DTypeName(nb_.type(v).dtype))},
                                     {"value", 1.0 / static_cast<double>(count)}},
                                    "mean_row"));
    std::vector<int64_t> linear_shape = kept_dims;  // (kept..., 1)
    linear_shape.push_back(1);
    if (result == linear_shape) return Apply(node, "linear", {v, row});
    ASSIGN_OR_RETURN(Value mean, Aux(node, "linear", {v, row}, Json::object(), "mean"));
    return Apply(node, "reshape", {mean}, {{"shape", result}});
  }

  absl::Status Flatten(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"axis"}));
    ASSIGN_OR_RETURN(int64_t axis, attrs.Int("axis", 1));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    const Shape& x = nb_.type(in[0]).shape;
    const auto rank = static_cast<int64_t>(x.size());
    ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank,
                                    /*one_past_last=*/true));
    // ONNX Flatten is always 2-D: dims [0, axis) and [axis, rank) merged.
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x[d];
    if (axis == 1 && rank >= 2) return Apply(node, "flatten", in, {{"start_dim", 1}});
    return Apply(node, "reshape", in, {{"shape", std::vector<int64_t>{outer, -1}}});
  }

  absl::Status Reshape(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 2));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"allowzero"}));
    ASSIGN_OR_RETURN(int64_t allowzero, attrs.Int("allowzero", 0));
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, ConstInts(node, 1));
    ASSIGN_OR_RETURN(Operand x, FirstOperand(node));
    const Shape& in = x.shape;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0 && allowzero == 0) {
        if (d >= in.size()) return NodeError(node, "shape copies a dimension x does not have");
        shape[d] = in[d];  // 0 copies the input's dimension
      }
    }
    if (!x.ints) return Apply(node, "reshape", {x.value}, {{"shape", shape}});
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
    return DefineInts(node, 0, Ints{Shape(shape.begin(), shape.end()), x.ints->values});
  }

  absl::Status Concat(const onnx::NodeProto& node) {
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"axis"}));
    if (!attrs.has("axis")) return NodeError(node, "attribute axis is required");
    ASSIGN_OR_RETURN(int64_t axis, attrs.Int("axis", 1));
    // Integer vectors (the pieces of a shape) fold.
    bool all_ints = node.input_size() > 0;
    for (const std::string& name : node.input()) all_ints = all_ints && KnownInts(name);
    if (all_ints) {
      Ints out{{0}, {}};
      for (const std::string& name : node.input()) {
        const Ints part = *KnownInts(name);
        if (part.dims.size() != 1 || (axis != 0 && axis != -1)) {
          return NodeError(node, "only vectors of integers concatenate into a constant");
        }
        out.values.insert(out.values.end(), part.values.begin(), part.values.end());
      }
      out.dims = {static_cast<int64_t>(out.values.size())};
      return DefineInts(node, 0, std::move(out));
    }
    // Float vectors of constants (Resize's scales as nn.Upsample exports
    // them) fold too.
    std::vector<float> floats;
    bool all_floats = node.input_size() > 0 && (axis == 0 || axis == -1);
    for (const std::string& name : node.input()) {
      const onnx::TensorProto* t = all_floats ? ConstTensor(name) : nullptr;
      std::optional<std::vector<double>> part = t ? FloatValues(*t) : std::nullopt;
      all_floats = part.has_value() && t->dims_size() == 1;
      if (all_floats) floats.insert(floats.end(), part->begin(), part->end());
    }
    if (all_floats) {
      onnx::TensorProto& t = folded_.emplace_back();
      t.set_name(node.output(0));
      t.set_data_type(onnx::TensorProto::FLOAT);
      t.add_dims(static_cast<int64_t>(floats.size()));
      for (float f : floats) t.add_float_data(f);
      constants_[node.output(0)] = &t;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    if (in.empty()) return NodeError(node, "has no inputs");
    ASSIGN_OR_RETURN(axis, OnnxAxis(node, absl::StrCat("axis ", axis), axis,
                                    static_cast<int64_t>(nb_.type(in[0]).shape.size())));
    return Apply(node, "concat", in, {{"axis", axis}});
  }

  absl::Status Gemm(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 3));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"alpha", "beta", "transA", "transB"}));
    ASSIGN_OR_RETURN(double alpha, attrs.Float("alpha", 1));
    ASSIGN_OR_RETURN(double beta, attrs.Float("beta", 1));
    ASSIGN_OR_RETURN(int64_t trans_a, attrs.Int("transA", 0));
    ASSIGN_OR_RETURN(int64_t trans_b, attrs.Int("transB", 0));
    if (alpha != 1) return attrs.Unsupported("alpha", absl::StrCat(alpha));
    if (beta != 1 && node.input_size() == 3) return attrs.Unsupported("beta", absl::StrCat(beta));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    if (nb_.type(in[0]).shape.size() != 2 || nb_.type(in[1]).shape.size() != 2) {
      return NodeError(node, "A and B must be matrices");
    }
    // pebble's linear takes x (M, K) and the weight (N, K), as nn.Linear
    // exports them (transB = 1); other layouts are transposed first.
    if (trans_a != 0) {
      ASSIGN_OR_RETURN(in[0], Aux(node, "transpose", {in[0]}, {{"perm", {1, 0}}}, "a_t"));
    }
    if (trans_b == 0) {
      ASSIGN_OR_RETURN(in[1], Aux(node, "transpose", {in[1]}, {{"perm", {1, 0}}}, "b_t"));
    }
    if (in.size() == 3 && nb_.type(in[2]).shape.size() != 1) {
      return NodeError(node, absl::StrCat("the bias C must be 1-D, is ",
                                          ShapeToString(nb_.type(in[2]).shape)));
    }
    return Apply(node, "linear", in);
  }

  // MatMul: by a matrix B (K, N), pebble's linear of x (..., K) with the
  // weight B transposed; of two tensors with the same batch dims, matmul.
  absl::Status MatMul(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 2));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    const Shape& a = nb_.type(in[0]).shape;
    const Shape& b = nb_.type(in[1]).shape;
    if (a.size() >= 2 && b.size() == 2) {
      ASSIGN_OR_RETURN(Value w, Aux(node, "transpose", {in[1]}, {{"perm", {1, 0}}}, "b_t"));
      return Apply(node, "linear", {in[0], w});
    }
    if (a.size() >= 3 && a.size() == b.size()) return Apply(node, "matmul", in);
    return NodeError(node, absl::StrCat("MatMul of ", ShapeToString(a), " and ", ShapeToString(b),
                                        " is not supported (a matrix B, or equal ranks with the "
                                        "same batch dims)"));
  }

  // LayerNormalization (opset 17) over the last dim: layernorm_stats, then
  // layernorm with the scale and bias.
  absl::Status LayerNormalization(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 3, 3));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"axis", "epsilon", "stash_type"}));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    const auto rank = static_cast<int64_t>(nb_.type(in[0]).shape.size());
    ASSIGN_OR_RETURN(const int64_t axis, attrs.Int("axis", -1));
    ASSIGN_OR_RETURN(const int64_t dim, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank));
    if (dim != rank - 1) {
      return attrs.Unsupported("axis", absl::StrCat(axis), "layer norm over the last dim only");
    }
    ASSIGN_OR_RETURN(int64_t stash, attrs.Int("stash_type", 1));
    if (stash != 1) return attrs.Unsupported("stash_type", absl::StrCat(stash));
    ASSIGN_OR_RETURN(double eps, attrs.Float("epsilon", 1e-5));
    const Json a = {{"eps", eps}};
    ASSIGN_OR_RETURN(Value stats, Aux(node, "layernorm_stats", {in[0]}, a, "stats"));
    RETURN_IF_ERROR(Apply(node, "layernorm", {in[0], stats, in[1], in[2]}, a));
    // The saved mean and inverse deviation: nothing reads them in a step.
    for (int i = 1; i < node.output_size(); ++i) {
      if (!node.output(i).empty()) unreadable_.insert(node.output(i));
    }
    return absl::OkStatus();
  }

  absl::Status Softmax(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"axis"}));
    ASSIGN_OR_RETURN(std::vector<Value> in, Inputs(node));
    const auto rank = static_cast<int64_t>(nb_.type(in[0]).shape.size());
    ASSIGN_OR_RETURN(const int64_t given, attrs.Int("axis", opset_ >= 13 ? -1 : 1));
    ASSIGN_OR_RETURN(const int64_t axis,
                     OnnxAxis(node, absl::StrCat("axis ", given), given, rank));
    // Before opset 13, axis 1 of a 2-D input is the last one as well; its
    // other axes flatten the dims after them, which is refused.
    if (axis == rank - 1) return Apply(node, "softmax", in);
    if (opset_ < 13) {
      return attrs.Unsupported("axis", absl::StrCat(given),
                               "before opset 13, softmax over the last dim only");
    }
    // Over another dim: swapped with the last one, softmax, swapped back.
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < rank; ++d) perm.push_back(d);
    std::swap(perm[axis], perm.back());
    ASSIGN_OR_RETURN(Value t, Aux(node, "transpose", in, {{"perm", perm}}, "to_last"));
    ASSIGN_OR_RETURN(Value sm, Aux(node, "softmax", {t}, Json::object(), "softmax"));
    return Apply(node, "transpose", {sm}, {{"perm", perm}});
  }

  absl::Status Dropout(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 3));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"seed", "ratio"}));
    double ratio = 0.5;
    // Before opset 12 Dropout has no training input; torch.onnx.export
    // writes one only in training mode (eval mode drops the node).
    bool training = opset_ < 12;
    if (node.input_size() >= 2 && !node.input(1).empty()) {
      const onnx::TensorProto* t = ConstTensor(node.input(1));
      std::optional<double> r = t == nullptr ? std::nullopt : FloatScalar(*t);
      if (!r.has_value()) return NodeError(node, "the ratio must be a constant scalar");
      ratio = *r;
    } else {
      ASSIGN_OR_RETURN(ratio, attrs.Float("ratio", 0.5));
    }
    if (node.input_size() >= 3 && !node.input(2).empty()) {
      const onnx::TensorProto* t = ConstTensor(node.input(2));
      std::optional<bool> b = t == nullptr ? std::nullopt : BoolScalar(*t);
      if (!b.has_value()) return NodeError(node, "training_mode must be a constant boolean");
      training = *b;
    }
    if (node.output_size() > 1 && !node.output(1).empty()) unreadable_.insert(node.output(1));
    ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
    if (!training || ratio == 0) return Define(node, x);  // identity
    if (!(ratio > 0 && ratio < 1)) return attrs.Unsupported("ratio", absl::StrCat(ratio));
    // Seeded masks, not PyTorch's random stream (docs/import.md).
    return Define(node, nb_.Dropout(x, ratio));
  }

  absl::Status Identity(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
    return Define(node, x);
  }

  absl::Status Constant(const onnx::NodeProto& node) {
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"value"}));
    for (const onnx::AttributeProto& a : node.attribute()) {
      if (a.name() == "value" && a.type() == onnx::AttributeProto::TENSOR &&
          node.output_size() == 1) {
        constants_[node.output(0)] = &a.t();
        return absl::OkStatus();
      }
    }
    return NodeError(node, "only a tensor 'value' is supported");
  }

  // Cast of a constant (torch.clamp casts its scalar bounds): the value is
  // kept as it is, for the operators that read constants by value. A cast
  // of a computed tensor is refused.
  absl::Status Cast(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 1));
    RETURN_IF_ERROR(Attrs(node).OnlyKnown({"to", "saturate"}));
    const onnx::TensorProto* t = ConstTensor(node.input(0));
    if (t == nullptr) {
      return NodeError(node, "only a cast of a constant is supported (this one casts a "
                             "computed tensor)");
    }
    if (node.output_size() != 1 || node.output(0).empty()) return NodeError(node, "has no output");
    constants_[node.output(0)] = t;
    return absl::OkStatus();
  }

  // Resize by whole factors of the spatial dims (nn.Upsample, F.interpolate
  // with a scale_factor or a size they divide): `upsample`. PyTorch's
  // nearest is ONNX's asymmetric transform with floor; bilinear and
  // trilinear are `linear` with half_pixel (align_corners=False) or
  // align_corners.
  absl::Status Resize(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 1, 4));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"coordinate_transformation_mode", "cubic_coeff_a",
                                     "exclude_outside", "extrapolation_value", "mode",
                                     "nearest_mode"}));
    ASSIGN_OR_RETURN(std::string mode, attrs.String("mode", "nearest"));
    ASSIGN_OR_RETURN(std::string transform,
                     attrs.String("coordinate_transformation_mode", "half_pixel"));
    ASSIGN_OR_RETURN(std::string nearest_mode,
                     attrs.String("nearest_mode", "round_prefer_floor"));
    ASSIGN_OR_RETURN(int64_t exclude_outside, attrs.Int("exclude_outside", 0));
    if (exclude_outside != 0) return attrs.Unsupported("exclude_outside", "1");
    ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
    const Shape shape = nb_.type(x).shape;
    const auto rank = static_cast<int64_t>(shape.size());
    if (rank != 4 && rank != 5) {
      return NodeError(node, absl::StrCat("resizes ", ShapeToString(shape),
                                          " (only 4-D and 5-D tensors)"));
    }
    // The factor of each dim, from the scales (input 2) or the sizes (3).
    std::vector<double> factors;
    const onnx::TensorProto* scales =
        node.input_size() > 2 && !node.input(2).empty() ? ConstTensor(node.input(2)) : nullptr;
    std::optional<std::vector<double>> scale_values =
        scales != nullptr ? FloatValues(*scales) : std::nullopt;
    if (scale_values && !scale_values->empty()) {
      factors = *scale_values;
    } else if (node.input_size() > 3 && !node.input(3).empty()) {
      ASSIGN_OR_RETURN(std::vector<int64_t> sizes, ConstInts(node, 3));
      if (static_cast<int64_t>(sizes.size()) != rank) {
        return NodeError(node, "sizes do not match the input's rank");
      }
      for (int64_t d = 0; d < rank; ++d) {
        factors.push_back(static_cast<double>(sizes[d]) / static_cast<double>(shape[d]));
      }
    } else {
      return NodeError(node, "needs constant scales or sizes");
    }
    if (static_cast<int64_t>(factors.size()) != rank) {
      return NodeError(node, "scales do not match the input's rank");
    }
    if (factors[0] != 1 || factors[1] != 1) {
      return NodeError(node, "resizes the batch or channel dim (only spatial dims)");
    }
    std::vector<int64_t> scale;
    for (int64_t d = 2; d < rank; ++d) {
      const double f = factors[d];
      if (!(f >= 1) || f != std::floor(f) || f > 1024) {
        return NodeError(node, absl::StrCat("scale ", f, " of dim ", d,
                                            " is not supported (only whole factors)"));
      }
      scale.push_back(static_cast<int64_t>(f));
    }
    Json a = {{"scale", scale}};
    if (mode == "nearest") {
      if (transform != "asymmetric" || nearest_mode != "floor") {
        return NodeError(node, absl::StrCat("nearest resize with coordinate_transformation_mode ",
                                            transform, " and nearest_mode ", nearest_mode,
                                            " (only PyTorch's: asymmetric, floor)"));
      }
      a["mode"] = "nearest";
    } else if (mode == "linear") {
      if (transform == "align_corners") {
        a["align_corners"] = true;
      } else if (transform != "half_pixel" && transform != "pytorch_half_pixel") {
        return attrs.Unsupported("coordinate_transformation_mode", transform);
      }
      a["mode"] = rank == 4 ? "bilinear" : "trilinear";
    } else {
      return attrs.Unsupported("mode", mode);
    }
    return Apply(node, "upsample", {x}, std::move(a));
  }

  absl::Status Pad(const onnx::NodeProto& node) {
    RETURN_IF_ERROR(ExpectInputs(node, 2, 3));
    const Attrs attrs(node);
    RETURN_IF_ERROR(attrs.OnlyKnown({"mode"}));
    ASSIGN_OR_RETURN(std::string mode, attrs.String("mode", "constant"));
    if (mode != "constant") return attrs.Unsupported("mode", Quote(mode));
    double value = 0;
    if (node.input_size() == 3 && !node.input(2).empty()) {
      const onnx::TensorProto* t = ConstTensor(node.input(2));
      std::optional<double> v = t == nullptr ? std::nullopt : FloatScalar(*t);
      if (!v.has_value()) return NodeError(node, "constant_value must be a constant scalar");
      value = *v;
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> pads, ConstInts(node, 1));
    ASSIGN_OR_RETURN(Value x, Get(node, node.input(0)));
    const auto rank = static_cast<int64_t>(nb_.type(x).shape.size());
    if (static_cast<int64_t>(pads.size()) != 2 * rank) {
      return NodeError(node, absl::StrCat("pads has ", pads.size(), " values for rank ", rank));
    }
    if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) {
      return Define(node, x);  // no padding (torch exports one before AvgPool)
    }
    // ONNX: [b_0 .. b_r-1, e_0 .. e_r-1]; F.pad: (b_last, e_last, ...).
    std::vector<int64_t> torch_pads;
    int64_t last = rank - 1;
    while (last >= 0 && pads[last] == 0 && pads[last + rank] == 0) --last;
    for (int64_t d = rank - 1; d >= 0 && d >= (last < 0 ? rank : 0); --d) {
      torch_pads.push_back(pads[d]);
      torch_pads.push_back(pads[d + rank]);
    }
    return Apply(node, "pad", {x}, {{"pads", torch_pads}, {"mode", "constant"}, {"value", value}});
  }

  static const std::map<std::string, Handler>& HandlerTable() {
    static const auto* handlers = new std::map<std::string, Handler>{
        {"Add", &Importer::Add},
        {"AveragePool", &Importer::AveragePool},
        {"BatchNormalization", &Importer::BatchNormalization},
        {"Cast", &Importer::Cast},
        {"Clip", &Importer::Clip},
        {"Concat", &Importer::Concat},
        {"Constant", &Importer::Constant},
        {"Conv", &Importer::Conv},
        {"Dropout", &Importer::Dropout},
        {"Flatten", &Importer::Flatten},
        {"Gemm", &Importer::Gemm},
        {"GlobalAveragePool", &Importer::GlobalAveragePool},
        {"ReduceMean", &Importer::ReduceMean},
        {"Shape", &Importer::ShapeOf},
        {"Gather", &Importer::Gather},
        {"Unsqueeze", &Importer::Unsqueeze},
        {"Squeeze", &Importer::Squeeze},
        {"Sub", &Importer::Sub},
        {"Mod", &Importer::Mod},
        {"Div", &Importer::Div},
        {"Transpose", &Importer::Transpose},
        {"ConstantOfShape", &Importer::ConstantOfShape},
        {"Equal", &Importer::Equal},
        {"Where", &Importer::Where},
        {"Expand", &Importer::Expand},
        {"MatMul", &Importer::MatMul},
        {"LayerNormalization", &Importer::LayerNormalization},
        {"Slice", &Importer::Slice},
        {"Split", &Importer::Split},
        {"HardSigmoid", &Importer::HardSigmoid},
        {"HardSwish", &Importer::HardSwish},
        {"Identity", &Importer::Identity},
        {"LeakyRelu", &Importer::LeakyRelu},
        {"MaxPool", &Importer::MaxPool},
        {"Mul", &Importer::Mul},
        {"Pad", &Importer::Pad},
        {"Resize", &Importer::Resize},
        {"Relu", &Importer::Relu},
        {"Erf", &Importer::Erf},
        {"Sqrt", &Importer::Sqrt},
        {"Pow", &Importer::Pow},
        {"Reshape", &Importer::Reshape},
        {"Sigmoid", &Importer::Sigmoid},
        {"Softmax", &Importer::Softmax},
        {"Tanh", &Importer::Tanh},
    };
    return *handlers;
  }

  const onnx::ModelProto& model_;
  const onnx::GraphProto& graph_;
  const OnnxImportOptions& options_;
  NetBuilder nb_;
  int64_t opset_ = 0;
  absl::flat_hash_map<std::string, const onnx::TensorProto*> initializers_;
  absl::flat_hash_map<std::string, const onnx::TensorProto*> constants_;
  // The integer tensors folded at import (DefineInts); a deque keeps the
  // addresses constants_ holds.
  std::deque<onnx::TensorProto> folded_;
  absl::flat_hash_set<std::string> buffers_;
  // Outputs nothing in a training step reads (batch norm's updated
  // statistics, dropout's mask): reading one is an error.
  absl::flat_hash_set<std::string> unreadable_;
  absl::flat_hash_map<std::string, Value> values_;
  absl::flat_hash_map<std::string, Shape> declared_;
  // Graph inputs and outputs: their names are the nodes' ids.
  absl::flat_hash_set<std::string> reserved_;
};

const std::map<std::string, Importer::Handler>& Importer::Handlers() { return HandlerTable(); }

}  // namespace

std::vector<std::string> SupportedOnnxOps() {
  std::vector<std::string> names;
  for (const auto& [name, handler] : Importer::Handlers()) names.push_back(name);
  return names;
}

absl::StatusOr<Graph> ImportOnnxModel(absl::string_view bytes, absl::string_view name,
                                      const OnnxImportOptions& options) {
  if (options.batch.has_value() && (*options.batch < 1 || *options.batch > (int64_t{1} << 24))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch must be 1 to ", int64_t{1} << 24, ", got ", *options.batch));
  }
  onnx::ModelProto model;
  if (bytes.size() > static_cast<size_t>(kMaxOnnxFileBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model is ", bytes.size(), " bytes, larger than ", kMaxOnnxFileBytes,
                     " bytes, the most protobuf reads"));
  }
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        "not an ONNX model: the file does not parse as an ONNX ModelProto (truncated?)");
  }
  if (!model.has_graph()) return absl::InvalidArgumentError("the ONNX model has no graph");
  Importer importer(model, name, options);
  return importer.Run();
}

absl::StatusOr<Graph> ImportOnnxFile(const std::string& path, const OnnxImportOptions& options) {
  ASSIGN_OR_RETURN(std::string bytes, ReadBoundedFile(path, "ONNX model", kMaxOnnxFileBytes));
  const std::string stem = std::filesystem::path(path).stem().string();
  auto graph = ImportOnnxModel(bytes, stem.empty() ? "model" : stem, options);
  if (!graph.ok()) {
    return absl::Status(graph.status().code(),
                        absl::StrCat(Quote(path), ": ", graph.status().message()));
  }
  return graph;
}

}  // namespace pebble
