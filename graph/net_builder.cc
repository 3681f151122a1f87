#include "graph/net_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/status.h"

namespace pebble {
namespace {

const TensorType& EmptyType() {
  static const TensorType* const t = new TensorType;
  return *t;
}

const std::string& EmptyString() {
  static const std::string* const s = new std::string;
  return *s;
}

// elements x dtype size; nullopt on overflow (absurd shapes).
std::optional<int64_t> Bytes(const TensorType& t) {
  int64_t bytes = DTypeSize(t.dtype);
  for (int64_t d : t.shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && bytes > INT64_MAX / d) return std::nullopt;
    bytes *= d;
  }
  return bytes;
}

}  // namespace

NetBuilder::NetBuilder(std::string graph_name, CostModel cost_model)
    : name_(std::move(graph_name)), cost_model_(cost_model) {}

NetBuilder NetBuilder::FromGraph(const Graph& graph, CostModel cost_model) {
  NetBuilder nb(graph.name(), cost_model);
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    NodeSpec spec = SpecOf(graph, v);
    spec.inputs.clear();
    spec.alias_of.reset();
    std::vector<int> inputs(graph.inputs(v).begin(), graph.inputs(v).end());
    TensorType type;
    const bool typed = graph.shape(v).has_value();
    if (typed) {
      type.shape = *graph.shape(v);
      type.dtype = graph.dtype(v).value_or(DType::kFloat32);
    }
    nb.Add(std::move(spec), std::move(inputs), std::move(type), typed);
    nb.alias_of_.back() = graph.alias_of(v);
  }
  for (NodeId v : graph.outputs()) nb.outputs_.push_back(v);
  return nb;
}

Value NetBuilder::Add(NodeSpec spec, std::vector<int> inputs, TensorType type,
                      bool typed) {
  const int index = static_cast<int>(specs_.size());
  index_.emplace(spec.id, index);
  specs_.push_back(std::move(spec));
  inputs_.push_back(std::move(inputs));
  alias_of_.push_back(-1);
  types_.push_back(std::move(type));
  typed_.push_back(typed ? 1 : 0);
  return Value{index};
}

void NetBuilder::Fail(absl::Status status) {
  if (status_.ok() && !status.ok()) status_ = std::move(status);
}

bool NetBuilder::CheckValue(Value v, absl::string_view what) {
  if (v.valid() && v.index < num_values()) return true;
  Fail(absl::InvalidArgumentError(
      absl::StrCat(what, ": invalid value (index ", v.index, ")")));
  return false;
}

std::string NetBuilder::FreshId(absl::string_view stem) {
  int& count = stem_counts_[stem];
  std::string id;
  do {
    id = absl::StrCat(stem, "_", ++count);
  } while (index_.contains(id));
  return id;
}

std::string NetBuilder::LayerOutputId(const std::string& prefix) {
  return index_.contains(prefix) ? FreshId(prefix) : prefix;
}

Value NetBuilder::Persistent(std::string id, Shape shape, DType dtype,
                             Role role, bool share) {
  if (!status_.ok()) return Value{};
  TensorType type{std::move(shape), dtype};
  if (id.empty()) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "a persistent tensor (role ", RoleName(role), ") needs a non-empty id")));
    return Value{};
  }
  const Value existing = Find(id);
  if (existing.valid()) {
    const int i = existing.index;
    if (share && specs_[i].role == role && typed_[i] &&
        types_[i].shape == type.shape && types_[i].dtype == type.dtype) {
      return existing;
    }
    Fail(absl::InvalidArgumentError(
        absl::StrCat("node '", id, "': duplicate id")));
    return Value{};
  }
  const std::optional<int64_t> bytes = Bytes(type);
  if (!bytes.has_value()) {
    const bool negative = std::any_of(type.shape.begin(), type.shape.end(),
                                      [](int64_t d) { return d < 0; });
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "node '", id, "': shape ", ShapeToString(type.shape),
        negative ? " has a negative dimension"
                 : " holds more than 2^63 bytes, which is above the largest size pebble "
                   "handles (2^53 bytes)")));
    return Value{};
  }
  if (*bytes > kMaxBytes) {
    Fail(absl::InvalidArgumentError(absl::StrCat("node '", id, "': ", AboveMaxBytes(*bytes))));
    return Value{};
  }
  NodeSpec spec;
  spec.id = std::move(id);
  spec.op = std::string(RoleName(role));
  spec.bytes = *bytes;
  spec.cost = 0;
  spec.persistent = true;
  spec.shape = type.shape;
  spec.dtype = type.dtype;
  spec.role = role;
  return Add(std::move(spec), {}, std::move(type), true);
}

Value NetBuilder::Input(std::string id, Shape shape, DType dtype) {
  return Persistent(std::move(id), std::move(shape), dtype, Role::kInput,
                    false);
}

Value NetBuilder::Parameter(std::string id, Shape shape, DType dtype) {
  return Persistent(std::move(id), std::move(shape), dtype, Role::kParameter,
                    false);
}

Value NetBuilder::Buffer(std::string id, Shape shape, DType dtype) {
  return Persistent(std::move(id), std::move(shape), dtype, Role::kBuffer,
                    false);
}

Value NetBuilder::Apply(absl::string_view op, std::vector<Value> inputs,
                        nlohmann::json attrs, std::string id, Role role) {
  if (!status_.ok()) return Value{};
  if (!id.empty() && index_.contains(id)) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("node '", id, "' (op ", op, "): duplicate id")));
    return Value{};
  }
  const std::string node = id.empty() ? std::string(op) : id;
  auto error = [&](absl::string_view what) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("node '", node, "' (op ", op, "): ", what)));
    return Value{};
  };
  const OpDef* def = FindOp(op);
  if (def == nullptr) return error("unknown operator");
  if (attrs.is_null()) attrs = nlohmann::json::object();
  if (!attrs.is_object()) return error("attrs must be a JSON object");
  const int n = static_cast<int>(inputs.size());
  if (n < def->min_inputs || (def->max_inputs >= 0 && n > def->max_inputs)) {
    return error(absl::StrCat(
        "takes ", def->min_inputs,
        def->max_inputs < 0 ? " or more"
                            : (def->max_inputs == def->min_inputs
                                   ? ""
                                   : absl::StrCat(" to ", def->max_inputs)),
        " inputs, got ", n));
  }
  std::vector<TensorType> types;
  std::vector<int> indices;
  for (int i = 0; i < n; ++i) {
    const Value in = inputs[i];
    if (!in.valid() || in.index >= num_values()) {
      return error(absl::StrCat("input ", i, " is an invalid value"));
    }
    if (!typed_[in.index]) {
      return error(absl::StrCat("input ", i, " ('", specs_[in.index].id,
                                "') has no shape"));
    }
    types.push_back(types_[in.index]);
    indices.push_back(in.index);
  }
  absl::StatusOr<TensorType> type = def->infer(types, attrs);
  if (!type.ok()) return error(type.status().message());
  const std::optional<int64_t> bytes = Bytes(*type);
  if (!bytes.has_value()) {
    return error(absl::StrCat("output shape ", ShapeToString(type->shape),
                              " holds more than 2^63 bytes, which is above the largest size "
                              "pebble handles (2^53 bytes)"));
  }
  if (*bytes > kMaxBytes) return error(AboveMaxBytes(*bytes));
  const double rate = cost_model_.device_flops_per_s;
  if (!(rate > 0) || !std::isfinite(rate)) {
    return error(absl::StrCat("device_flops_per_s must be positive, got ",
                              rate));
  }
  const double flops = def->flops(types, *type, attrs);
  NodeSpec spec;
  spec.id = id.empty() ? FreshId(op) : std::move(id);
  spec.op = std::string(op);
  spec.bytes = *bytes;
  spec.cost = std::max(0.0, flops) / rate;
  spec.shape = type->shape;
  spec.dtype = type->dtype;
  spec.attrs = std::move(attrs);
  spec.role = role;
  return Add(std::move(spec), std::move(indices), *std::move(type), true);
}

Value NetBuilder::Generic(std::string id, std::vector<Value> inputs,
                          int64_t bytes, double cost) {
  if (!status_.ok()) return Value{};
  if (id.empty()) id = FreshId("generic");
  if (index_.contains(id)) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("node '", id, "': duplicate id")));
    return Value{};
  }
  if (bytes < 0 || !(cost >= 0) || !std::isfinite(cost)) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "node '", id, "': bytes must be >= 0 and cost finite and >= 0 (got ",
        bytes, ", ", cost, ")")));
    return Value{};
  }
  std::vector<int> indices;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].valid() || inputs[i].index >= num_values()) {
      Fail(absl::InvalidArgumentError(absl::StrCat(
          "node '", id, "': input ", i, " is an invalid value")));
      return Value{};
    }
    indices.push_back(inputs[i].index);
  }
  NodeSpec spec;
  spec.id = std::move(id);
  spec.bytes = bytes;
  spec.cost = cost;
  return Add(std::move(spec), std::move(indices), TensorType{}, false);
}

void NetBuilder::MarkOutput(Value v) {
  if (!status_.ok() || !CheckValue(v, "MarkOutput")) return;
  if (std::find(outputs_.begin(), outputs_.end(), v.index) == outputs_.end()) {
    outputs_.push_back(v.index);
  }
}

void NetBuilder::ClearOutputs() { outputs_.clear(); }

void NetBuilder::SetAliasOf(Value v, Value base) {
  if (!status_.ok() || !CheckValue(v, "SetAliasOf") || !CheckValue(base, "SetAliasOf")) return;
  const std::vector<int>& in = inputs_[v.index];
  if (specs_[v.index].persistent || std::find(in.begin(), in.end(), base.index) == in.end()) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "node '", specs_[v.index].id, "' cannot be an alias of '", specs_[base.index].id,
        "': only a computed node views one of its inputs")));
    return;
  }
  alias_of_[v.index] = base.index;
}

Value NetBuilder::alias_of(Value v) const {
  if (!v.valid() || v.index >= num_values() || alias_of_[v.index] < 0) return Value{};
  return Value{alias_of_[v.index]};
}

const TensorType& NetBuilder::type(Value v) const {
  if (!v.valid() || v.index >= num_values()) return EmptyType();
  return types_[v.index];
}

bool NetBuilder::has_type(Value v) const {
  return v.valid() && v.index < num_values() && typed_[v.index] != 0;
}

const std::string& NetBuilder::id(Value v) const {
  if (!v.valid() || v.index >= num_values()) return EmptyString();
  return specs_[v.index].id;
}

Role NetBuilder::role(Value v) const {
  if (!v.valid() || v.index >= num_values()) return Role::kForward;
  const NodeSpec& s = specs_[v.index];
  return s.role.value_or(s.persistent ? Role::kInput : Role::kForward);
}

Value NetBuilder::Find(absl::string_view id) const {
  auto it = index_.find(id);
  return it == index_.end() ? Value{} : Value{it->second};
}

int NetBuilder::num_values() const { return static_cast<int>(specs_.size()); }

absl::Status NetBuilder::Rename(Value v, std::string new_id) {
  if (!v.valid() || v.index >= num_values()) {
    return absl::InvalidArgumentError("Rename: invalid value");
  }
  if (new_id == specs_[v.index].id) return absl::OkStatus();
  if (new_id.empty() || index_.contains(new_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot rename node '", specs_[v.index].id, "' to '", new_id,
        "': the id is empty or taken"));
  }
  index_.erase(specs_[v.index].id);
  index_.emplace(new_id, v.index);
  specs_[v.index].id = std::move(new_id);
  return absl::OkStatus();
}

absl::StatusOr<Graph> NetBuilder::Build() const {
  if (!status_.ok()) return status_;
  GraphBuilder builder(name_);
  for (int i = 0; i < num_values(); ++i) {
    NodeSpec spec = specs_[i];
    for (int u : inputs_[i]) spec.inputs.push_back(specs_[u].id);
    if (alias_of_[i] >= 0) spec.alias_of = specs_[alias_of_[i]].id;
    builder.AddNode(std::move(spec));
  }
  if (!outputs_.empty()) {
    for (int v : outputs_) builder.AddOutput(specs_[v].id);
  } else {
    // No output marked: the computed nodes nobody reads.
    std::vector<uint8_t> read(num_values(), 0);
    for (const std::vector<int>& in : inputs_) {
      for (int u : in) read[u] = 1;
    }
    for (int i = 0; i < num_values(); ++i) {
      if (!read[i] && !specs_[i].persistent) builder.AddOutput(specs_[i].id);
    }
  }
  return builder.Build();
}

// ---------------------------------------------------------------- layers

Value NetBuilder::Conv(const std::string& prefix, Value x,
                       int64_t out_channels, int64_t kernel, int64_t stride,
                       int64_t padding, bool bias) {
  if (!status_.ok() || !CheckValue(x, absl::StrCat("Conv '", prefix, "'"))) {
    return Value{};
  }
  const TensorType& t = type(x);
  const size_t rank = t.shape.size();
  if (!has_type(x) || (rank != 4 && rank != 5)) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "Conv '", prefix, "': x must be (N, C, H, W) or (N, C, D, H, W), got ",
        ShapeToString(t.shape))));
    return Value{};
  }
  if (out_channels < 1 || kernel < 1) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "Conv '", prefix, "': out_channels and kernel must be >= 1")));
    return Value{};
  }
  const DType dtype = t.dtype;
  Shape w = {out_channels, t.shape[1]};
  w.resize(rank, kernel);
  std::vector<Value> inputs = {
      x, Persistent(prefix + ".weight", w, dtype, Role::kParameter, true)};
  if (bias) {
    inputs.push_back(Persistent(prefix + ".bias", {out_channels}, dtype,
                                Role::kParameter, true));
  }
  if (!status_.ok()) return Value{};
  return Apply(rank == 4 ? "conv2d" : "conv3d", std::move(inputs),
               {{"stride", stride}, {"padding", padding}},
               LayerOutputId(prefix));
}

Value NetBuilder::Linear(const std::string& prefix, Value x,
                         int64_t out_features, bool bias) {
  if (!status_.ok() || !CheckValue(x, absl::StrCat("Linear '", prefix, "'"))) {
    return Value{};
  }
  const TensorType& t = type(x);
  if (!has_type(x) || t.shape.empty() || out_features < 1) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "Linear '", prefix, "': x must have rank >= 1 (got ",
        ShapeToString(t.shape), ") and out_features >= 1")));
    return Value{};
  }
  const DType dtype = t.dtype;
  std::vector<Value> inputs = {
      x, Persistent(prefix + ".weight", {out_features, t.shape.back()}, dtype,
                    Role::kParameter, true)};
  if (bias) {
    inputs.push_back(Persistent(prefix + ".bias", {out_features}, dtype,
                                Role::kParameter, true));
  }
  if (!status_.ok()) return Value{};
  return Apply("linear", std::move(inputs), nlohmann::json::object(),
               LayerOutputId(prefix));
}

Value NetBuilder::BatchNorm(const std::string& prefix, Value x, double eps) {
  if (!status_.ok() ||
      !CheckValue(x, absl::StrCat("BatchNorm '", prefix, "'"))) {
    return Value{};
  }
  const TensorType& t = type(x);
  if (!has_type(x) || t.shape.size() < 2) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "BatchNorm '", prefix, "': x must be (N, C, ...), got ",
        ShapeToString(t.shape))));
    return Value{};
  }
  const int64_t c = t.shape[1];
  const Value weight =
      Persistent(prefix + ".weight", {c}, DType::kFloat32, Role::kParameter,
                 true);
  const Value bias = Persistent(prefix + ".bias", {c}, DType::kFloat32,
                                Role::kParameter, true);
  Persistent(prefix + ".running_mean", {c}, DType::kFloat32, Role::kBuffer,
             true);
  Persistent(prefix + ".running_var", {c}, DType::kFloat32, Role::kBuffer,
             true);
  Persistent(prefix + ".num_batches_tracked", {}, DType::kInt64,
             Role::kBuffer, true);
  const nlohmann::json attrs = {{"eps", eps}, {"momentum", 0.1}};
  const Value stats = Apply("batchnorm_stats", {x}, attrs,
                            LayerOutputId(prefix + ".stats"));
  return Apply("batchnorm", {x, stats, weight, bias}, attrs,
               LayerOutputId(prefix));
}

Value NetBuilder::LayerNorm(const std::string& prefix, Value x, double eps) {
  if (!status_.ok() ||
      !CheckValue(x, absl::StrCat("LayerNorm '", prefix, "'"))) {
    return Value{};
  }
  const TensorType& t = type(x);
  if (!has_type(x) || t.shape.empty()) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "LayerNorm '", prefix, "': x must have rank >= 1, got ",
        ShapeToString(t.shape))));
    return Value{};
  }
  const int64_t d = t.shape.back();
  const DType dtype = t.dtype;
  const Value weight =
      Persistent(prefix + ".weight", {d}, dtype, Role::kParameter, true);
  const Value bias =
      Persistent(prefix + ".bias", {d}, dtype, Role::kParameter, true);
  const nlohmann::json attrs = {{"eps", eps}};
  const Value stats = Apply("layernorm_stats", {x}, attrs,
                            LayerOutputId(prefix + ".stats"));
  return Apply("layernorm", {x, stats, weight, bias}, attrs,
               LayerOutputId(prefix));
}

Value NetBuilder::Embedding(const std::string& prefix, Value indices,
                            int64_t num_embeddings, int64_t dim) {
  return Embedding(prefix, indices, num_embeddings, dim, DType::kFloat32);
}

Value NetBuilder::Embedding(const std::string& prefix, Value indices,
                            int64_t num_embeddings, int64_t dim, DType dtype) {
  if (!status_.ok() ||
      !CheckValue(indices, absl::StrCat("Embedding '", prefix, "'"))) {
    return Value{};
  }
  if (num_embeddings < 1 || dim < 1) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "Embedding '", prefix, "': num_embeddings and dim must be >= 1")));
    return Value{};
  }
  const Value weight = Persistent(prefix + ".weight", {num_embeddings, dim},
                                  dtype, Role::kParameter, true);
  return Apply("embedding", {indices, weight}, nlohmann::json::object(),
               LayerOutputId(prefix));
}

Value NetBuilder::Relu(Value x) { return Apply("relu", {x}); }

Value NetBuilder::Dropout(Value x, double p) {
  if (!status_.ok()) return Value{};
  const Value mask =
      Apply("dropout_mask", {x}, {{"p", p}, {"seed", dropout_masks_++}});
  return Apply("dropout", {x, mask}, {{"p", p}});
}

Value NetBuilder::Random(const Shape& shape, DType dtype, nlohmann::json attrs,
                         const std::string& id) {
  if (!status_.ok()) return Value{};
  attrs["shape"] = std::vector<int64_t>(shape.begin(), shape.end());
  attrs["dtype"] = std::string(DTypeName(dtype));
  attrs["seed"] = kRandomSeedBase + random_nodes_++;
  return Apply("random", {}, std::move(attrs), id);
}

}  // namespace pebble
