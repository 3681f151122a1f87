#include "scheduler/cost_profile.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/offload.h"

namespace pebble {
namespace {

constexpr const char* kFormat = "pebble-cost-profile";
constexpr int kVersion = 1;

// Note [Update keys]. An optimizer update's time depends on its operands
// and on the terms it computes, not on its hyper-parameters' values: a
// profile calibrated at one learning rate serves another, and the updates
// of a grouped step (Note [Parameter groups], graph/optimizer.h) share
// their layers' entries. So an update's key keeps of its attrs whether
// weight decay and momentum are on, and whether the decay is decoupled;
// lr, the betas and eps leave it. A profile written with every number in
// its update keys (before this rule) is read with each such key mapped to
// this form, the larger time (and workspace) where several meet.
bool IsUpdateOp(absl::string_view op) {
  return absl::c_linear_search(kUpdateOps, op);
}

// An update's attrs as its key holds them (Note [Update keys]); `attrs`
// already of that form come back as they are.
nlohmann::json UpdateKeyAttrs(const nlohmann::json& attrs) {
  if (!attrs.is_object() || attrs.contains("weight_decay_on")) return attrs;
  auto on = [&attrs](const char* name) {
    const auto it = attrs.find(name);
    return it != attrs.end() && it->is_number() && it->get<double>() != 0;
  };
  nlohmann::json key = {{"weight_decay_on", on("weight_decay")}, {"momentum_on", on("momentum")}};
  if (attrs.contains("decoupled_weight_decay")) {
    key["decoupled_weight_decay"] = attrs.at("decoupled_weight_decay");
  }
  return key;
}

// `key` of a profile file in CostKey's form: an update's key written with
// every number (Note [Update keys]) mapped to the form CostKey makes now;
// every other key as it is.
std::string CanonicalKey(const std::string& key) {
  const std::vector<absl::string_view> parts = absl::StrSplit(key, absl::MaxSplits('|', 3));
  if (parts.size() != 4 || !IsUpdateOp(parts[0])) return key;
  const nlohmann::json attrs = nlohmann::json::parse(parts[3], nullptr, /*allow_exceptions=*/false);
  if (!attrs.is_object()) return key;
  return absl::StrCat(parts[0], "|", parts[1], "|", parts[2], "|", UpdateKeyAttrs(attrs).dump());
}

// Puts `value` at `key` of `map` (CanonicalKey's form), keeping the larger
// where the key is there already.
template <typename T>
void PutLarger(std::map<std::string, T>& map, const std::string& key, T value) {
  auto [it, added] = map.emplace(CanonicalKey(key), value);
  if (!added) it->second = std::max(it->second, value);
}

std::string TypeText(const Graph& graph, NodeId v) {
  return absl::StrCat(DTypeName(*graph.dtype(v)), ShapeToString(*graph.shape(v)));
}

absl::StatusOr<double> NonNegativeNumber(const nlohmann::json& doc,
                                         const std::string& field) {
  if (!doc.contains(field)) return 0.0;
  const nlohmann::json& v = doc.at(field);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost profile: '", field, "' must be a non-negative finite number"));
  }
  return v.get<double>();
}

// A measured link bandwidth: 0 (not measured) or within the range the
// planners take.
absl::StatusOr<double> Bandwidth(const nlohmann::json& doc, const std::string& field) {
  ASSIGN_OR_RETURN(const double bytes_per_s, NonNegativeNumber(doc, field));
  if (bytes_per_s != 0 &&
      (bytes_per_s < kMinBandwidthBytesPerS || bytes_per_s > kMaxBandwidthBytesPerS)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost profile: '", field, "' is ", bytes_per_s, "; a measured bandwidth lies between ",
        kMinBandwidthBytesPerS, " and ", kMaxBandwidthBytesPerS,
        " bytes per second (0: not measured)"));
  }
  return bytes_per_s;
}

}  // namespace

std::optional<double> CostProfile::PlannerBandwidth() const {
  const double a = bandwidth_h2d_bytes_per_s, b = bandwidth_d2h_bytes_per_s;
  if (a > 0 && b > 0) return std::min(a, b);
  if (a > 0) return a;
  if (b > 0) return b;
  return std::nullopt;
}

std::optional<std::string> CostKey(const Graph& graph, NodeId v) {
  if (!graph.shape(v).has_value() || !graph.dtype(v).has_value()) return std::nullopt;
  std::vector<std::string> operands;
  for (NodeId u : graph.inputs(v)) {
    if (!graph.shape(u).has_value() || !graph.dtype(u).has_value()) return std::nullopt;
    operands.push_back(TypeText(graph, u));
  }
  nlohmann::json attrs = graph.attrs(v);
  // The buffers a batch norm's statistics update name the layer, not the
  // work: layers of one shape share a measurement.
  if (attrs.is_object()) {
    attrs.erase("running_mean");
    attrs.erase("running_var");
  }
  if (IsUpdateOp(graph.op(v))) attrs = UpdateKeyAttrs(attrs);
  // nlohmann's objects are sorted maps: dump() is canonical.
  const std::string attr_text = attrs.is_object() ? attrs.dump() : "{}";
  return absl::StrCat(graph.op(v), "|", absl::StrJoin(operands, ";"), "|",
                      DTypeName(*graph.dtype(v)), "|", attr_text);
}

nlohmann::json CostProfileToJson(const CostProfile& profile) {
  nlohmann::json doc = {{"format", kFormat},
                        {"version", kVersion},
                        {"backend", profile.backend},
                        {"device", profile.device},
                        {"bandwidth_h2d_bytes_per_s", profile.bandwidth_h2d_bytes_per_s},
                        {"bandwidth_d2h_bytes_per_s", profile.bandwidth_d2h_bytes_per_s}};
  if (profile.host_update_bytes_per_s > 0) {
    doc["host_update_bytes_per_s"] = profile.host_update_bytes_per_s;
  }
  if (profile.network_bandwidth_bytes_per_s > 0) {
    doc["network_bandwidth_bytes_per_s"] = profile.network_bandwidth_bytes_per_s;
    doc["network_latency_s"] = profile.network_latency_s;
    doc["network_ranks"] = profile.network_ranks;
  }
  nlohmann::json entries = nlohmann::json::object();
  for (const auto& [key, seconds] : profile.entries) entries[key] = seconds;
  doc["entries"] = std::move(entries);
  if (!profile.workspace_bytes.empty()) {
    nlohmann::json workspace = nlohmann::json::object();
    for (const auto& [key, bytes] : profile.workspace_bytes) workspace[key] = bytes;
    doc["workspace_bytes"] = std::move(workspace);
  }
  return doc;
}

absl::StatusOr<CostProfile> CostProfileFromJson(const nlohmann::json& doc) {
  if (!doc.is_object()) {
    return absl::InvalidArgumentError("cost profile: expected a JSON object");
  }
  if (!doc.contains("format") || doc.at("format") != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost profile: 'format' must be \"", kFormat, "\""));
  }
  if (!doc.contains("version") || doc.at("version") != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost profile: unsupported 'version' (this pebble reads ", kVersion, ")"));
  }
  constexpr absl::string_view kKeys[] = {
      "format", "version", "backend", "device", "bandwidth_h2d_bytes_per_s",
      "bandwidth_d2h_bytes_per_s", "host_update_bytes_per_s", "network_bandwidth_bytes_per_s",
      "network_latency_s", "network_ranks", "entries", "workspace_bytes"};
  RETURN_IF_ERROR(CheckJsonKeys(doc, kKeys, "cost profile"));
  CostProfile p;
  for (const char* field : {"backend", "device"}) {
    if (doc.contains(field) && !doc.at(field).is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost profile: '", field, "' must be a string"));
    }
  }
  p.backend = doc.value("backend", "");
  if (!p.backend.empty() && p.backend != "cpu" && p.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost profile: 'backend' is the backend it was measured on, \"cpu\" or \"cuda\"; got ",
        Quote(p.backend)));
  }
  p.device = doc.value("device", "");
  ASSIGN_OR_RETURN(p.bandwidth_h2d_bytes_per_s, Bandwidth(doc, "bandwidth_h2d_bytes_per_s"));
  ASSIGN_OR_RETURN(p.bandwidth_d2h_bytes_per_s, Bandwidth(doc, "bandwidth_d2h_bytes_per_s"));
  if (doc.contains("host_update_bytes_per_s")) {
    ASSIGN_OR_RETURN(p.host_update_bytes_per_s, Bandwidth(doc, "host_update_bytes_per_s"));
  }
  const int network_keys = static_cast<int>(doc.contains("network_bandwidth_bytes_per_s")) +
                           static_cast<int>(doc.contains("network_latency_s")) +
                           static_cast<int>(doc.contains("network_ranks"));
  if (network_keys != 0 && network_keys != 3) {
    return absl::InvalidArgumentError(
        "cost profile: give network_bandwidth_bytes_per_s, network_latency_s and "
        "network_ranks together, or none of them");
  }
  if (network_keys == 3) {
    ASSIGN_OR_RETURN(p.network_bandwidth_bytes_per_s,
                     Bandwidth(doc, "network_bandwidth_bytes_per_s"));
    ASSIGN_OR_RETURN(p.network_latency_s, NonNegativeNumber(doc, "network_latency_s"));
    const nlohmann::json& ranks = doc.at("network_ranks");
    if (!ranks.is_number_integer() || ranks.get<int64_t>() < 2 || ranks.get<int64_t>() > 1 << 20 ||
        !(p.network_bandwidth_bytes_per_s > 0)) {
      return absl::InvalidArgumentError(
          "cost profile: 'network_ranks' must be a whole number of ranks, 2 or more, and "
          "network_bandwidth_bytes_per_s positive");
    }
    p.network_ranks = static_cast<int>(ranks.get<int64_t>());
  }
  if (!doc.contains("entries") || !doc.at("entries").is_object()) {
    return absl::InvalidArgumentError("cost profile: 'entries' must be an object");
  }
  for (const auto& [key, value] : doc.at("entries").items()) {
    if (!value.is_number() || !std::isfinite(value.get<double>()) ||
        value.get<double>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cost profile: entry ", Quote(key), " must be a non-negative finite number of seconds"));
    }
    PutLarger(p.entries, key, value.get<double>());
  }
  if (doc.contains("workspace_bytes")) {
    if (!doc.at("workspace_bytes").is_object()) {
      return absl::InvalidArgumentError("cost profile: 'workspace_bytes' must be an object");
    }
    for (const auto& [key, value] : doc.at("workspace_bytes").items()) {
      // At most kMaxBytes, as a graph's workspace (and a value past INT64_MAX
      // reads as negative).
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > kMaxBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cost profile: workspace_bytes ", Quote(key),
            " must be a non-negative integer number of bytes, at most 2^53"));
      }
      PutLarger(p.workspace_bytes, key, value.get<int64_t>());
    }
  }
  return p;
}

absl::StatusOr<CostProfile> ReadCostProfileFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(path, "cost profile"));
  const std::string source = Printable(path, 200);
  ASSIGN_OR_RETURN(const nlohmann::json doc, ParseStrictJson(text, source));
  auto profile = CostProfileFromJson(doc);
  if (!profile.ok()) {
    return absl::Status(profile.status().code(),
                        absl::StrCat(source, ": ", profile.status().message()));
  }
  return profile;
}

absl::StatusOr<Graph> ApplyCostProfile(const Graph& graph, const CostProfile& profile,
                                       CostProfileMatch* match) {
  CostProfileMatch m;
  GraphBuilder builder(graph.name());
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    NodeSpec spec = SpecOf(graph, v);
    if (!graph.persistent(v)) {
      const std::optional<std::string> key = CostKey(graph, v);
      auto it = key.has_value() ? profile.entries.find(*key) : profile.entries.end();
      if (it != profile.entries.end()) {
        spec.cost = it->second;
        ++m.matched;
      } else {
        ++m.unmatched;
      }
      auto ws = key.has_value() ? profile.workspace_bytes.find(*key)
                                : profile.workspace_bytes.end();
      if (ws != profile.workspace_bytes.end() && ws->second > spec.workspace) {
        spec.workspace = ws->second;
        ++m.workspaces;
      }
      if (spec.host_cost.has_value() && profile.host_update_bytes_per_s > 0) {
        int64_t moved = graph.bytes(v);
        for (NodeId u : graph.inputs(v)) moved += graph.bytes(u);
        spec.host_cost = HostUpdateSeconds(moved, profile.host_update_bytes_per_s);
      }
    }
    builder.AddNode(std::move(spec));
  }
  for (NodeId v : graph.outputs()) builder.AddOutput(graph.id(v));
  if (match != nullptr) *match = m;
  return builder.Build();
}

}  // namespace pebble
