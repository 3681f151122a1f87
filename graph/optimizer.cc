#include "graph/optimizer.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {
namespace {

absl::string_view KindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "?";
}

// The keys each optimizer takes, in the order ToString writes them.
std::vector<std::string> KeysOf(OptimizerKind kind) {
  if (kind == OptimizerKind::kSgd) {
    return {"lr",         "momentum",  "weight_decay", "max_grad_norm",
            "state",      "parameters", "gradients",  "updates"};
  }
  return {"lr",            "beta1", "beta2",      "eps",       "weight_decay",
          "max_grad_norm", "state", "parameters", "gradients", "updates"};
}

// The number field called `key` (a key of KeysOf other than "state",
// "parameters", "gradients" and "updates").
template <typename Spec>
auto* Field(Spec& spec, absl::string_view key) {
  if (key == "lr") return &spec.lr;
  if (key == "momentum") return &spec.momentum;
  if (key == "weight_decay") return &spec.weight_decay;
  if (key == "beta1") return &spec.beta1;
  if (key == "beta2") return &spec.beta2;
  if (key == "max_grad_norm") return &spec.max_grad_norm;
  return &spec.eps;
}

const std::vector<std::string>& OptimizerNames() {
  static const std::vector<std::string> names = {"sgd", "adam", "adamw"};
  return names;
}

}  // namespace

std::vector<std::string> ParameterGroupKeys(OptimizerKind kind) {
  if (kind == OptimizerKind::kSgd) return {"lr", "momentum", "weight_decay"};
  return {"lr", "weight_decay", "beta1", "beta2", "eps"};
}

bool OptimizerSpec::Matches(const ParameterGroup& group, absl::string_view parameter) {
  return fnmatch(group.pattern.c_str(), std::string(parameter).c_str(), 0) == 0;
}

bool OptimizerSpec::keeps_state() const {
  if (kind != OptimizerKind::kSgd || momentum > 0) return true;
  for (const ParameterGroup& group : groups) {
    for (const auto& [key, value] : group.settings) {
      if (key == "momentum" && value > 0) return true;
    }
  }
  return false;
}

OptimizerSpec OptimizerSpec::SettingsFor(absl::string_view parameter) const {
  OptimizerSpec settings = *this;
  for (const ParameterGroup& group : groups) {
    if (!Matches(group, parameter)) continue;
    for (const auto& [key, value] : group.settings) *Field(settings, key) = value;
  }
  return settings;
}

std::string OptimizerSpec::ToString() const {
  std::vector<std::string> parts;
  for (const std::string& key : KeysOf(kind)) {
    if (key == "state") {
      if (state_home.has_value()) parts.push_back(absl::StrCat("state=", TierName(*state_home)));
      continue;
    }
    if (key == "parameters") {
      if (parameter_home.has_value()) {
        parts.push_back(absl::StrCat("parameters=", TierName(*parameter_home)));
      }
      continue;
    }
    if (key == "gradients") {
      if (!keep_gradients) parts.push_back("gradients=drop");
      continue;
    }
    if (key == "updates") {
      if (updates != Tier::kDevice) parts.push_back(absl::StrCat("updates=", TierName(updates)));
      continue;
    }
    if (key == "max_grad_norm" && max_grad_norm == 0) continue;  // no clipping
    parts.push_back(absl::StrCat(key, "=", *Field(*this, key)));
  }
  std::string text = absl::StrCat(KindName(kind), ":", absl::StrJoin(parts, ","));
  for (const ParameterGroup& group : groups) {
    absl::StrAppend(&text, ";", group.pattern, ":",
                    absl::StrJoin(group.settings, ",", absl::PairFormatter("=")));
  }
  return text;
}

absl::StatusOr<double> ParseOptimizerNumber(absl::string_view key, absl::string_view value) {
  double number = 0;
  if (!ParseDecimal(value, &number)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, "=", Quote(value), " is not a decimal number"));
  }
  const absl::string_view mantissa = value.substr(0, value.find_first_of("eE"));
  if (number == 0 && mantissa.find_first_of("123456789") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, "=", Quote(value), " is too small for a double (it would be 0)"));
  }
  RETURN_IF_ERROR(ops_internal::CheckOptimizerValue(key, number));
  return number;
}

namespace {

// The optimizer's name and its settings for the whole step, "adam:lr=...",
// as ParseOptimizer takes them before any group.
absl::StatusOr<OptimizerSpec> ParseOptimizerSettings(absl::string_view text) {
  std::pair<absl::string_view, absl::string_view> name_params =
      absl::StrSplit(text, absl::MaxSplits(':', 1));
  const absl::string_view name = absl::StripAsciiWhitespace(name_params.first);
  OptimizerSpec spec;
  if (name == "sgd") {
    spec.kind = OptimizerKind::kSgd;
  } else if (name == "adam" || name == "adamw") {
    spec.kind = name == "adam" ? OptimizerKind::kAdam : OptimizerKind::kAdamW;
    spec.lr = 0.001;
    if (spec.kind == OptimizerKind::kAdamW) spec.weight_decay = 0.01;
  } else {
    const std::string near = NearestName(name, OptimizerNames());
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown optimizer ", Quote(name), " (expected sgd, adam or adamw",
        near.empty() ? "" : absl::StrCat("; did you mean ", near, "?"), ")"));
  }
  const std::vector<std::string> keys = KeysOf(spec.kind);
  if (text.find(':') == absl::string_view::npos) return spec;
  if (absl::StripAsciiWhitespace(name_params.second).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", name, ": no settings after ':' (give the name alone, or key=value "
        "settings, e.g. ", name, ":lr=0.01)"));
  }
  std::map<std::string, bool> seen;
  for (absl::string_view item : absl::StrSplit(name_params.second, ',')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string key(absl::StripAsciiWhitespace(kv.first));
    const absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer ", name, ": a setting is empty (give key=value, e.g. lr=0.01)"));
    }
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer ", name, ": unknown parameter ", Quote(key), " (", name, " takes ",
          absl::StrJoin(keys, ", "), ")"));
    }
    if (seen[key]) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer ", name, ": ", key,
                                                     " is given twice"));
    }
    seen[key] = true;
    if (key == "state") {
      ASSIGN_OR_RETURN(spec.state_home, ParseTier(value));
      continue;
    }
    if (key == "parameters") {
      ASSIGN_OR_RETURN(spec.parameter_home, ParseTier(value));
      continue;
    }
    if (key == "gradients") {
      if (value != "keep" && value != "drop") {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer ", name, ": gradients=", Quote(value), " (expected keep or drop)"));
      }
      spec.keep_gradients = value == "keep";
      continue;
    }
    if (key == "updates") {
      absl::StatusOr<Tier> tier = ParseTier(value);
      if (!tier.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer ", name, ": updates=", Quote(value), " (expected device, host or auto)"));
      }
      spec.updates = *tier;
      continue;
    }
    absl::StatusOr<double> number = ParseOptimizerNumber(key, value);
    if (!number.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", name, ": ", number.status().message()));
    }
    *Field(spec, key) = *number;
  }
  return spec;
}

// One parameter group, "GLOB:key=value,..." (Note [Parameter groups]), of
// an optimizer named `name` of `kind`. The glob ends at the first colon
// (parameter ids have none).
absl::StatusOr<ParameterGroup> ParseParameterGroup(absl::string_view text,
                                                   absl::string_view name, OptimizerKind kind) {
  const std::string who = absl::StrCat("optimizer ", name, ": parameter group ", Quote(text));
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", name, ": an empty parameter group after ';' (a group is "
        "GLOB:key=value,..., e.g. *.bias:weight_decay=0)"));
  }
  const size_t colon = text.find(':');
  ParameterGroup group;
  group.pattern = std::string(absl::StripAsciiWhitespace(text.substr(0, colon)));
  if (colon == absl::string_view::npos || group.pattern.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": give a glob of parameter ids and its settings after a colon, e.g. "
        "*.bias:weight_decay=0"));
  }
  const std::vector<std::string> keys = ParameterGroupKeys(kind);
  const std::vector<std::string> step_keys = KeysOf(kind);
  for (absl::string_view item : absl::StrSplit(text.substr(colon + 1), ',')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string key(absl::StripAsciiWhitespace(kv.first));
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": a setting is empty (give key=value, e.g. weight_decay=0)"));
    }
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      const bool step_wide =
          std::find(step_keys.begin(), step_keys.end(), key) != step_keys.end();
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": ", Quote(key),
                       step_wide ? " is one setting for the whole step" : " is not a setting",
                       " (a group sets ", absl::StrJoin(keys, ", "), ")"));
    }
    for (const auto& [given, value] : group.settings) {
      if (given == key) {
        return absl::InvalidArgumentError(absl::StrCat(who, ": ", key, " is given twice"));
      }
    }
    absl::StatusOr<double> number =
        ParseOptimizerNumber(key, absl::StripAsciiWhitespace(kv.second));
    if (!number.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ", number.status().message()));
    }
    group.settings.emplace_back(key, *number);
  }
  return group;
}

}  // namespace

absl::StatusOr<OptimizerSpec> ParseOptimizer(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ';');
  ASSIGN_OR_RETURN(OptimizerSpec spec, ParseOptimizerSettings(parts[0]));
  const absl::string_view name =
      absl::StripAsciiWhitespace(parts[0].substr(0, parts[0].find(':')));
  for (size_t i = 1; i < parts.size(); ++i) {
    ASSIGN_OR_RETURN(ParameterGroup group, ParseParameterGroup(parts[i], name, spec.kind));
    spec.groups.push_back(std::move(group));
  }
  if (!spec.keeps_state() && spec.state_home.has_value() && *spec.state_home != Tier::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", name, ": state=", TierName(*spec.state_home),
        ", but SGD without momentum keeps no state (give momentum=..., for the step or a "
        "parameter group)"));
  }
  // (SGD without momentum has no state to move: state=device says nothing there)
  if (spec.updates == Tier::kAuto && spec.state_home == Tier::kDevice && spec.keeps_state()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", name, ": updates=auto with state=device is not planned (an update on "
        "the host would move its state out and back each step): give state=host or "
        "state=auto"));
  }
  return spec;
}

namespace {

// Adam's step count and its increment (Note [Optimizer nodes]).
constexpr char kStepCount[] = "optimizer.step";
constexpr char kStepCountNow[] = "optimizer.step#1";

// Whether `out` is the gradient "grad:p" of a parameter p: the gradients an
// optimizer step updates from.
bool IsParameterGradient(const Graph& graph, NodeId out) {
  const std::string& gid = graph.id(out);
  if (!absl::StartsWith(gid, kGradPrefix)) return false;
  const NodeId p = graph.Find(gid.substr(kGradPrefix.size()));
  return p != kNoNode && graph.role(p) == Role::kParameter;
}

// `training` with its parameters' gradients clipped (Note [Clipping in the
// graph]).
absl::StatusOr<Graph> WithClippedGradients(const Graph& training, double max_norm,
                                           CostModel cost) {
  std::vector<NodeId> gradients;
  for (NodeId out : training.outputs()) {
    if (IsParameterGradient(training, out)) gradients.push_back(out);
  }
  if (gradients.empty()) return training;  // AddOptimizerStep names the fault
  std::vector<std::string> params;  // p of each "grad:p"
  for (NodeId g : gradients) {
    const std::string& p = params.emplace_back(training.id(g).substr(kGradPrefix.size()));
    if (!training.shape(training.Find(p)).has_value() || !training.shape(g).has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: parameter ", Quote(p), " or its gradient has no shape"));
    }
    if (training.dtype(g).value_or(DType::kFloat32) != DType::kFloat32) {
      return absl::UnimplementedError(absl::StrCat(
          "max_grad_norm: gradient ", Quote(training.id(g)), " is ",
          DTypeName(*training.dtype(g)), "; pebble clips float32 gradients (pebble.torch's "
          "train_step clips any)"));
    }
  }
  NetBuilder b = NetBuilder::FromGraph(training, cost);
  // `id`, where the graph has no such node (else the builder's error).
  auto claim = [&b](std::string id) {
    if (b.Find(id).valid()) {
      b.Fail(absl::InvalidArgumentError(
          absl::StrCat("max_grad_norm: the graph already has a node ", Quote(id))));
    }
    return id;
  };
  // A node of the backward.
  auto apply = [&b, &claim](absl::string_view op, std::vector<Value> inputs, std::string id,
                            nlohmann::json attrs = nlohmann::json::object()) {
    return b.Apply(op, std::move(inputs), std::move(attrs), claim(std::move(id)),
                   Role::kBackward);
  };
  auto scalar = [&apply](const std::string& id, double value) {
    return apply("fill", {}, id,
                 {{"shape", Shape{}}, {"dtype", "float32"}, {"value", value}});
  };
  // The squares' sums, added up parameter by parameter.
  std::vector<Value> unclipped;
  Value total;
  for (size_t i = 0; i < gradients.size(); ++i) {
    const std::string& p = params[i];
    const Value g{static_cast<int>(gradients[i])};
    if (absl::Status s = b.Rename(g, claim(absl::StrCat(kUnclippedGradPrefix, p))); !s.ok()) {
      b.Fail(s);
    }
    unclipped.push_back(g);
    const Value square = apply("mul", {g, g}, absl::StrCat(kClipSquarePrefix, p));
    const Value part = apply("sum", {square}, absl::StrCat(kClipPartPrefix, p));
    total = i == 0 ? part : apply("add", {total, part}, absl::StrCat("clip_sum:", i));
  }
  // clip_grad_norm_'s factor: max_norm / (n + 1e-6), at most 1.
  const Value norm = apply("sqrt", {total}, std::string(kGradNormId));
  const Value denominator =
      apply("add", {norm, scalar("clip_eps", 1e-6)}, "clip_denominator");
  const Value ratio =
      apply("div", {scalar("clip_max_norm", max_norm), denominator}, "clip_ratio");
  const Value coef = apply("clip", {ratio}, "clip_coef", {{"max", 1.0}});
  std::vector<Value> clipped;
  for (size_t i = 0; i < gradients.size(); ++i) {
    clipped.push_back(apply("mul", {unclipped[i], coef}, absl::StrCat(kGradPrefix, params[i])));
  }
  // The same outputs, each gradient clipped, and the norm.
  b.ClearOutputs();
  for (NodeId out : training.outputs()) {
    const auto it = std::find(gradients.begin(), gradients.end(), out);
    b.MarkOutput(it == gradients.end() ? Value{static_cast<int>(out)}
                                       : clipped[it - gradients.begin()]);
  }
  b.MarkOutput(norm);
  return b.Build();
}

// Builds the nodes of Note [Optimizer nodes] beside a copy of the training
// graph's own.
class OptimizerStepBuilder {
 public:
  OptimizerStepBuilder(const Graph& training, const OptimizerSpec& spec, CostModel cost)
      : training_(training), spec_(spec), cost_(cost) {}

  absl::StatusOr<Graph> Build() {
    GraphBuilder b(training_.name());
    for (NodeId v = 0; v < training_.num_nodes(); ++v) {
      NodeSpec node = SpecOf(training_, v);
      if (training_.role(v) == Role::kParameter && Updated(v)) node.home = ParameterHome();
      b.AddNode(std::move(node));
    }
    for (NodeId out : training_.outputs()) {
      if (!spec_.keep_gradients && IsUpdatedGradient(out)) continue;  // only updates read it
      b.AddOutput(training_.id(out));
    }
    const bool adam = spec_.kind != OptimizerKind::kSgd;
    std::string step_now;
    if (adam) {
      // The step count stays resident whatever the state's home: streaming
      // 4 bytes would cost two copies' latency per step and save nothing.
      // Updates on the host read it there, so it lives on the host then.
      NodeSpec count = State(kStepCount, {}, DType::kFloat32, 4);
      count.home.reset();
      // With updates=auto it is counted on the device and offloaded (4
      // bytes) for the updates that run on the host.
      if (spec_.updates == Tier::kHost) count.home = Tier::kHost;
      if (spec_.updates == Tier::kAuto) count.home = Tier::kDevice;
      RETURN_IF_ERROR(Add(b, std::move(count)));
      step_now = kStepCountNow;
      NodeSpec count_update = Update(step_now, "optimizer_step", kStepCount, {kStepCount}, {},
                                   DType::kFloat32, 4, 1, spec_);
    if (spec_.updates == Tier::kAuto) {  // counted on the device
      count_update.runs_on.reset();
      count_update.host_cost.reset();
    }
    RETURN_IF_ERROR(Add(b, std::move(count_update)));
    }
    int params = 0;
    std::vector<uint8_t> matched(spec_.groups.size(), 0);  // per group: a parameter matched
    for (NodeId g : training_.outputs()) {
      if (!IsUpdatedGradient(g)) continue;
      const std::string& gid = training_.id(g);
      const std::string p = gid.substr(kGradPrefix.size());
      const NodeId pv = training_.Find(p);
      if (!training_.shape(pv).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer: parameter ", Quote(p), " has no shape"));
      }
      ++params;
      const OptimizerSpec settings = spec_.SettingsFor(p);
      for (size_t i = 0; i < spec_.groups.size(); ++i) {
        matched[i] = matched[i] || OptimizerSpec::Matches(spec_.groups[i], p);
      }
      const Shape& shape = *training_.shape(pv);
      // None where the parameter has none (a dtype the format cannot name:
      // pebble.torch's float64): the state and updates take its bytes.
      const std::optional<DType> dtype = training_.dtype(pv);
      const int64_t bytes = training_.bytes(pv);
      const double n = static_cast<double>(NumElements(shape));
      if (!adam) {
        std::string step = gid;
        if (settings.momentum > 0) {  // else no buffer (Note [Parameter groups])
          const std::string buf = absl::StrCat(kMomentumBufferPrefix, p);
          RETURN_IF_ERROR(Add(b, State(buf, shape, dtype, bytes)));
          RETURN_IF_ERROR(Add(b, Update(buf + "#1", "sgd_momentum", buf, {buf, gid, p},
                                        shape, dtype, bytes, 3 * n, settings)));
          step = buf + "#1";
        }
        RETURN_IF_ERROR(Add(b, Update(absl::StrCat(kUpdatePrefix, p), "sgd_update", p, {p, step},
                                      shape, dtype, bytes, 3 * n, settings)));
        continue;
      }
      const std::string m = absl::StrCat(kExpAvgPrefix, p), v2 = absl::StrCat(kExpAvgSqPrefix, p);
      RETURN_IF_ERROR(Add(b, State(m, shape, dtype, bytes)));
      RETURN_IF_ERROR(Add(b, State(v2, shape, dtype, bytes)));
      RETURN_IF_ERROR(Add(b, Update(m + "#1", "adam_exp_avg", m, {m, gid, p}, shape, dtype,
                                    bytes, 4 * n, settings)));
      RETURN_IF_ERROR(Add(b, Update(v2 + "#1", "adam_exp_avg_sq", v2, {v2, gid, p}, shape,
                                    dtype, bytes, 5 * n, settings)));
      RETURN_IF_ERROR(Add(b, Update(absl::StrCat(kUpdatePrefix, p), "adam_update", p,
                                    {p, m + "#1", v2 + "#1", step_now}, shape, dtype, bytes,
                                    10 * n, settings)));
    }
    if (params == 0) {
      return absl::InvalidArgumentError(
          "optimizer: the graph has no parameter with a gradient among its outputs "
          "(a training graph's grad:<parameter>)");
    }
    for (size_t i = 0; i < spec_.groups.size(); ++i) {
      if (!matched[i]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer: parameter group ", Quote(spec_.groups[i].pattern), " matches no "
            "parameter that the step updates (ids such as ", Quote(FirstUpdated()), ")"));
      }
    }
    return b.Build();
  }

 private:
  // Whether the step updates parameter p (its gradient is an output).
  bool Updated(NodeId p) const {
    const NodeId g = training_.Find(absl::StrCat(kGradPrefix, training_.id(p)));
    return g != kNoNode && training_.is_output(g);
  }

  // The id of the first parameter the step updates ("" where none), for
  // an example in an error.
  std::string FirstUpdated() const {
    for (NodeId out : training_.outputs()) {
      if (IsUpdatedGradient(out)) return training_.id(out).substr(kGradPrefix.size());
    }
    return "";
  }

  // Whether `out` is "grad:p" of a parameter p the step updates.
  bool IsUpdatedGradient(NodeId out) const { return IsParameterGradient(training_, out); }

  // The homes, where the spec leaves them open: host updates write host
  // copies, so what they touch must be able to move (the state lives on
  // the host, the parameters return to the device).
  std::optional<Tier> StateHome() const {
    if (spec_.updates != Tier::kDevice && !spec_.state_home.has_value()) return Tier::kHost;
    return spec_.state_home;
  }
  std::optional<Tier> ParameterHome() const {
    if (spec_.updates != Tier::kDevice && !spec_.parameter_home.has_value()) {
      return Tier::kDevice;
    }
    return spec_.parameter_home;
  }

  NodeSpec State(const std::string& id, Shape shape, std::optional<DType> dtype,
                 int64_t bytes) const {
    NodeSpec s;
    s.id = id;
    s.op = "optimizer_state";
    s.bytes = bytes;
    s.cost = 0;  // (persistent: never computed, as a parameter)
    s.persistent = true;
    s.role = Role::kOptimizerState;
    s.shape = std::move(shape);
    s.dtype = dtype;
    s.home = StateHome();
    return s;
  }

  // An update of `writes` with `settings`' hyper-parameters (the spec's, or
  // its parameter's: OptimizerSpec::SettingsFor).
  NodeSpec Update(const std::string& id, const std::string& op, const std::string& writes,
                  std::vector<std::string> inputs, Shape shape, std::optional<DType> dtype,
                  int64_t bytes, double operations, const OptimizerSpec& settings) const {
    NodeSpec s;
    s.id = id;
    s.op = op;
    s.bytes = bytes;
    s.cost = operations / cost_.device_flops_per_s;
    s.inputs = std::move(inputs);
    s.alias_of = writes;
    s.in_place = true;
    s.role = Role::kUpdate;
    s.shape = std::move(shape);
    s.dtype = dtype;
    nlohmann::json attrs = {{"lr", settings.lr}, {"weight_decay", settings.weight_decay}};
    if (spec_.kind == OptimizerKind::kSgd) {
      attrs["momentum"] = settings.momentum;
    } else {
      attrs.update({{"beta1", settings.beta1}, {"beta2", settings.beta2}, {"eps", settings.eps},
                    {"decoupled_weight_decay", spec_.kind == OptimizerKind::kAdamW}});
    }
    s.attrs = std::move(attrs);
    if (spec_.updates != Tier::kDevice) {
      s.runs_on = spec_.updates;
      int64_t moved = bytes;  // the output written, then each operand read
      for (const std::string& in : s.inputs) {
        moved += in == kStepCount || in == kStepCountNow ? 4 : bytes;  // the count, or a tensor
      }
      s.host_cost = HostUpdateSeconds(moved, cost_.host_bytes_per_s);
    }
    return s;
  }

  absl::Status Add(GraphBuilder& b, NodeSpec spec) {
    if (training_.Find(spec.id) != kNoNode) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: the graph already has a node ", Quote(spec.id)));
    }
    b.AddNode(std::move(spec));
    return absl::OkStatus();
  }

  const Graph& training_;
  const OptimizerSpec& spec_;
  CostModel cost_;
};

}  // namespace

absl::StatusOr<Graph> AddOptimizerStep(const Graph& training, const OptimizerSpec& spec,
                                       CostModel cost) {
  if (spec.max_grad_norm <= 0) return OptimizerStepBuilder(training, spec, cost).Build();
  ASSIGN_OR_RETURN(const Graph clipped, WithClippedGradients(training, spec.max_grad_norm, cost));
  return OptimizerStepBuilder(clipped, spec, cost).Build();
}

absl::Status CheckShardedClipping(const Graph& graph) {
  if (!graph.has_collectives() || !ClipsGradients(graph)) return absl::OkStatus();
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (IsUnclippedGradient(graph, v) &&
        !(graph.collective(v) && graph.op(v) == "reduce_scatter")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient ", Quote(graph.id(v)), " is clipped in a sharded step but is not a "
          "reduce_scatter: a sharded step clips the shards of reduce-scattered gradients, whose "
          "squares one all_reduce sums (a gradient kept whole would count once per rank)"));
    }
  }
  // The norm's ancestors short of the all_reduce nodes: an unclipped
  // gradient among them is a rank's shard read without the ranks' sum.
  const auto unsummed = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the sharded step clips its gradients, but its norm ", Quote(kGradNormId), why,
        ": each rank holds shards, so the norm must sum every rank's part (pebble's --shard "
        "full adds the all_reduce ", Quote(kClipTotalId), ")"));
  };
  const NodeId norm = graph.Find(kGradNormId);
  std::vector<uint8_t> seen(graph.num_nodes(), 0);
  std::vector<NodeId> stack;
  if (norm != kNoNode) stack.push_back(norm);
  bool summed = false;
  while (!stack.empty()) {
    const NodeId v = stack.back();
    stack.pop_back();
    if (graph.collective(v) && graph.op(v) == "all_reduce") {
      summed = true;
      continue;
    }
    if (IsUnclippedGradient(graph, v)) {
      return unsummed(
          absl::StrCat(" reads gradient ", Quote(graph.id(v)), " without an all_reduce between"));
    }
    for (NodeId u : graph.unique_inputs(v)) {
      if (!seen[u]) {
        seen[u] = 1;
        stack.push_back(u);
      }
    }
  }
  if (summed) return absl::OkStatus();
  return unsummed(norm == kNoNode ? " is missing" : " is not computed from an all_reduce "
                                                    "collective");
}

bool IsUnclippedGradient(const Graph& graph, NodeId v) {
  const std::string& id = graph.id(v);
  if (!absl::StartsWith(id, kUnclippedGradPrefix)) return false;
  const NodeId p = graph.Find(id.substr(kUnclippedGradPrefix.size()));
  return p != kNoNode && graph.role(p) == Role::kParameter;
}

bool ClipsGradients(const Graph& graph) {
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (IsUnclippedGradient(graph, v)) return true;
  }
  return false;
}

NodeId BackwardGradient(const Graph& graph, NodeId p) {
  const NodeId unclipped = graph.Find(absl::StrCat(kUnclippedGradPrefix, graph.id(p)));
  return unclipped != kNoNode ? unclipped : graph.Find(absl::StrCat(kGradPrefix, graph.id(p)));
}

}  // namespace pebble
