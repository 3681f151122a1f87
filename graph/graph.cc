#include "graph/graph.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kInt64: return "i64";
    case DType::kUInt8: return "u8";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "fp32" || lower == "float32" || lower == "float" || lower == "f32")
    return DType::kFloat32;
  if (lower == "fp16" || lower == "float16" || lower == "half" || lower == "f16")
    return DType::kFloat16;
  if (lower == "bf16" || lower == "bfloat16") return DType::kBFloat16;
  if (lower == "i64" || lower == "int64" || lower == "long") return DType::kInt64;
  if (lower == "u8" || lower == "uint8" || lower == "bool") return DType::kUInt8;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name, "' (expected fp32, fp16, bf16, i64 or u8)"));
}

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  return 0;
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kInput: return "input";
    case Role::kParameter: return "parameter";
    case Role::kBuffer: return "buffer";
    case Role::kForward: return "forward";
    case Role::kBackward: return "backward";
    case Role::kOptimizerState: return "optimizer_state";
    case Role::kUpdate: return "update";
  }
  return "?";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kInput, Role::kParameter, Role::kBuffer, Role::kForward,
                 Role::kBackward, Role::kOptimizerState, Role::kUpdate}) {
    if (RoleName(r) == name) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role '", name,
      "' (expected input, parameter, buffer, forward, backward, optimizer_state or update)"));
}

absl::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kAuto: return "auto";
  }
  return "device";
}

absl::StatusOr<Tier> ParseTier(absl::string_view name) {
  if (name == "device") return Tier::kDevice;
  if (name == "host") return Tier::kHost;
  if (name == "auto") return Tier::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tier '", name, "' (expected device, host or auto)"));
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<int64_t> TensorBytes(const Shape& shape, DType dtype) {
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) return std::nullopt;
  }
  return bytes;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ","), ")");
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 0) return absl::StrCat(bytes, " B");
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static constexpr const char* kNames[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int i = 0;
  while (value >= 1024.0 && i < 4) {
    value /= 1024.0;
    ++i;
  }
  const int decimals = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return absl::StrFormat("%.*f %s", decimals, value, kNames[i]);
}

std::string AboveMaxBytes(int64_t bytes) {
  return absl::StrCat(bytes, " bytes (", FormatBytes(bytes),
                      ") is above the largest size pebble handles (2^53 bytes)");
}

NodeId Graph::Find(absl::string_view id) const {
  auto it = index_.find(id);
  return it == index_.end() ? kNoNode : it->second;
}

std::string Graph::ToString() const {
  int64_t persistent = 0;
  int64_t activation_bytes = 0;
  for (NodeId v = 0; v < num_nodes(); ++v) {
    if (this->persistent(v)) {
      ++persistent;
    } else if (!is_alias(v)) {
      activation_bytes += bytes(v);
    }
  }
  std::string out = absl::StrFormat(
      "Graph '%s': %d nodes (%d persistent, %d bytes), %d edges, %d outputs, "
      "%d non-persistent bytes",
      name_, num_nodes(), persistent, persistent_bytes_, unique_inputs_.size(),
      outputs_.size(), activation_bytes);
  if (num_aliases_ > 0) absl::StrAppend(&out, ", ", num_aliases_, " aliases");
  return out;
}

namespace {

// Ids are printed escaped (absl::CEscape) so that a message stays one line.
absl::Status NodeError(const std::string& id, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("node '", absl::CEscape(id), "': ", what));
}

// Finds one cycle among `candidates` (nodes left over by Kahn's algorithm,
// each of which lies on or behind a cycle) and renders it "a -> b -> a".
std::string DescribeCycle(const std::vector<std::string>& ids,
                          const std::vector<std::vector<NodeId>>& inputs,
                          const std::vector<bool>& leftover) {
  const int n = static_cast<int>(ids.size());
  // Walk backwards along leftover inputs; every leftover node has at least
  // one leftover input, so the walk must revisit a node.
  NodeId start = 0;
  while (start < n && !leftover[start]) ++start;
  std::vector<int> seen_at(n, -1);
  std::vector<NodeId> walk;
  NodeId v = start;
  while (seen_at[v] < 0) {
    seen_at[v] = static_cast<int>(walk.size());
    walk.push_back(v);
    NodeId next = kNoNode;
    for (NodeId u : inputs[v]) {
      if (leftover[u]) {
        next = u;
        break;
      }
    }
    PEBBLE_CHECK(next != kNoNode, "leftover node without leftover input");
    v = next;
  }
  // walk[seen_at[v]..] is the cycle, traversed against the edges.
  std::vector<std::string> names;
  for (size_t i = walk.size(); i-- > static_cast<size_t>(seen_at[v]);) {
    names.push_back(absl::CEscape(ids[walk[i]]));
  }
  names.push_back(absl::CEscape(ids[walk.back()]));
  return absl::StrJoin(names, " -> ");
}

// In-place nodes write persistent storages, each after the one before it
// (NodeSpec::in_place): the writes of one storage form a chain through
// alias_of, so their order is the graph's, not a schedule's choice.
absl::Status CheckInPlace(const Graph& g) {
  if (!g.has_in_place()) return absl::OkStatus();
  std::vector<NodeId> written_after(g.num_nodes(), kNoNode);
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (!g.in_place(v)) continue;
    const NodeId base = g.storage(v);
    const NodeId before = g.alias_of(v);
    if (!g.persistent(base)) {
      return NodeError(g.id(v), absl::StrCat(
          "an in-place node writes the storage of ", Quote(g.id(base)),
          ", which is not persistent (updates in place are of parameters and optimizer state)"));
    }
    if (before != base && !g.in_place(before)) {
      return NodeError(g.id(v), absl::StrCat(
          "an in-place node's 'alias_of' must be the persistent ", Quote(g.id(base)),
          " or an earlier in-place node of it, not the view ", Quote(g.id(before))));
    }
    if (written_after[before] != kNoNode) {
      return NodeError(g.id(v), absl::StrCat(
          "in-place nodes ", Quote(g.id(written_after[before])), " and ", Quote(g.id(v)),
          " both write after ", Quote(g.id(before)),
          ": writes of one storage must be ordered (let the second's 'alias_of' be the first)"));
    }
    written_after[before] = v;
  }
  return absl::OkStatus();
}

// A shape's dimensions, and its bytes against the node's where a dtype is
// given.
absl::Status CheckShape(const NodeSpec& s) {
  if (!s.shape.has_value()) return absl::OkStatus();
  int64_t elements = 1;
  for (int64_t d : *s.shape) {
    if (d < 0) return NodeError(s.id, "negative dimension in 'shape'");
    // Only beside a 0 can a dimension exceed the bytes checked before.
    if (d > kMaxBytes) {
      return NodeError(s.id, absl::StrCat("'shape' ", ShapeToString(*s.shape),
                                          " has a dimension above the largest size pebble "
                                          "handles (2^53)"));
    }
    if (__builtin_mul_overflow(elements, d, &elements)) {
      return NodeError(s.id, "'shape' has more elements than 64 bits count");
    }
  }
  // One rule for every tensor: a backend writes shape x dtype bytes into the
  // node's slot of `bytes`, so the two must agree.
  if (!s.dtype.has_value()) return absl::OkStatus();
  const std::optional<int64_t> tensor_bytes = TensorBytes(*s.shape, *s.dtype);
  if (tensor_bytes == s.bytes) return absl::OkStatus();
  return NodeError(s.id, absl::StrCat("'bytes' is ", *s.bytes, " but 'shape' ",
                                      ShapeToString(*s.shape), " of ", DTypeName(*s.dtype),
                                      " holds ",
                                      tensor_bytes.has_value() ? absl::StrCat(*tensor_bytes)
                                                               : std::string("more than 2^63"),
                                      " bytes"));
}

absl::Status CheckCollectiveLink(const NodeSpec& s);

// The rules of one node's own fields (SPEC section 1), in the order Build
// reports them; its id and its place among the others are Build's.
absl::Status CheckNodeSpec(const NodeSpec& s) {
  if (!s.bytes.has_value()) return NodeError(s.id, "missing 'bytes'");
  if (*s.bytes < 0) return NodeError(s.id, absl::StrCat("negative bytes (", *s.bytes, ")"));
  if (*s.bytes > kMaxBytes) return NodeError(s.id, AboveMaxBytes(*s.bytes));
  if (!std::isfinite(s.cost) || s.cost < 0) {
    return NodeError(s.id, absl::StrCat("cost must be a non-negative finite number, got ",
                                        s.cost));
  }
  if (s.workspace < 0) {
    return NodeError(s.id, absl::StrCat("negative workspace (", s.workspace, ")"));
  }
  if (s.workspace > kMaxBytes) {
    return NodeError(s.id, absl::StrCat("a workspace of ", AboveMaxBytes(s.workspace)));
  }
  if (s.persistent && !s.inputs.empty()) {
    return NodeError(s.id, "a persistent node is never computed and cannot have inputs");
  }
  if (!s.attrs.is_null() && !s.attrs.is_object()) {
    return NodeError(s.id, "'attrs' must be an object");
  }
  if (s.alias_of.has_value()) {
    // A persistent node has no inputs, so it could view nothing; the
    // weights and the data batch own their storage.
    if (s.persistent) return NodeError(s.id, "a persistent node cannot be an alias ('alias_of')");
    if (*s.alias_of == s.id) return NodeError(s.id, "'alias_of' names the node itself");
    if (std::find(s.inputs.begin(), s.inputs.end(), *s.alias_of) == s.inputs.end()) {
      return NodeError(s.id, absl::StrCat("'alias_of' ", Quote(*s.alias_of),
                                          " is not one of its inputs"));
    }
    // A view runs no kernel; a workspace would also break the rule that an
    // alias's compute adds no memory (docs/semantics.md). An in-place
    // update runs one, and may need temporaries.
    if (s.workspace != 0 && !s.in_place) {
      return NodeError(s.id, "an alias ('alias_of') has no workspace");
    }
  }
  if (s.home.has_value() && !s.persistent) {
    return NodeError(s.id, "'home' is for persistent nodes (where they live between steps)");
  }
  if ((s.host_cost.has_value() || s.runs_on.has_value()) && !s.in_place) {
    return NodeError(s.id, absl::StrCat("'", s.host_cost.has_value() ? "host_cost" : "runs_on",
                                        "' is for in-place nodes (an update that may run on "
                                        "the host)"));
  }
  if (s.runs_on.has_value() && *s.runs_on != Tier::kDevice && !s.host_cost.has_value()) {
    return NodeError(s.id, absl::StrCat("'runs_on': '", TierName(*s.runs_on),
                                        "' needs 'host_cost' (its time on the host)"));
  }
  if (s.host_cost.has_value() && !(std::isfinite(*s.host_cost) && *s.host_cost >= 0)) {
    return NodeError(s.id, absl::StrCat("'host_cost' must be a non-negative finite number, "
                                        "got ", *s.host_cost));
  }
  if (s.collective && (s.persistent || s.alias_of.has_value() || s.workspace != 0 ||
                       s.inputs.size() != 1)) {
    return NodeError(s.id, "a collective ('collective') reads one input into a tensor of its "
                           "own: it is not persistent, no alias and has no workspace");
  }
  if (s.in_place && !s.alias_of.has_value()) {
    return NodeError(s.id, "an in-place node ('in_place') needs 'alias_of': the storage it "
                           "writes");
  }
  if (s.collective) RETURN_IF_ERROR(CheckCollectiveLink(s));
  return CheckShape(s);
}

// The attrs a collective's time was figured from (pebble export writes
// them; the simulator and the planners read them back): all three or none,
// each in range, as the command line takes --ranks, --network and
// --network-latency. A graph edited by hand with a negative latency gave a
// negative network time, and one with ranks 4.5 was planned as unsharded.
absl::Status CheckCollectiveLink(const NodeSpec& s) {
  if (!s.attrs.is_object()) return absl::OkStatus();
  const char* keys[] = {"ranks", "network_bandwidth_bytes_per_s", "network_latency_s"};
  int given = 0;
  for (const char* key : keys) given += s.attrs.contains(key) ? 1 : 0;
  if (given == 0) return absl::OkStatus();
  if (given != 3) {
    return NodeError(s.id, "a collective's attrs give its link as ranks, "
                           "network_bandwidth_bytes_per_s and network_latency_s together");
  }
  const nlohmann::json& ranks = s.attrs["ranks"];
  if (!ranks.is_number_integer() || ranks.get<int64_t>() < 2 ||
      ranks.get<int64_t>() > (int64_t{1} << 20)) {
    return NodeError(s.id, absl::StrCat("attrs.ranks must be a whole number from 2 to 1048576, "
                                        "got ", ranks.dump()));
  }
  const nlohmann::json& bandwidth = s.attrs["network_bandwidth_bytes_per_s"];
  if (!bandwidth.is_number() || !(bandwidth.get<double>() > 0) ||
      !std::isfinite(bandwidth.get<double>())) {
    return NodeError(s.id, absl::StrCat("attrs.network_bandwidth_bytes_per_s must be a positive "
                                        "finite number, got ", bandwidth.dump()));
  }
  const nlohmann::json& latency = s.attrs["network_latency_s"];
  if (!latency.is_number() || !(latency.get<double>() >= 0) ||
      !std::isfinite(latency.get<double>())) {
    return NodeError(s.id, absl::StrCat("attrs.network_latency_s must be a non-negative finite "
                                        "number, got ", latency.dump()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GraphBuilder::CheckNodes(Graph& g) const {
  const int n = static_cast<int>(specs_.size());
  g.index_.reserve(n);
  int64_t total_bytes = 0;
  int64_t max_workspace = 0;
  double total_cost = 0;
  for (NodeId v = 0; v < n; ++v) {
    const NodeSpec& s = specs_[v];
    if (s.id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("node #", v, " has an empty id"));
    }
    if (specs_.size() > static_cast<size_t>(INT32_MAX / 2)) {
      return absl::InvalidArgumentError("too many nodes");
    }
    if (!IsValidUtf8(s.id)) return NodeError(s.id, "id is not valid UTF-8");
    if (!g.index_.emplace(s.id, v).second) return NodeError(s.id, "duplicate id");
    RETURN_IF_ERROR(CheckNodeSpec(s));
    // The base cost (SPEC section 2) sums every cost once: it must be a
    // finite number.
    total_cost += s.cost;
    if (!std::isfinite(total_cost)) {
      return NodeError(s.id, "the graph's total cost exceeds the largest double (about 1.8e308); "
                             "give costs in a smaller unit");
    }
    // Every sum of bytes the simulator forms (all nodes resident, plus one
    // workspace) is at most kMaxBytes. Both terms are at most 2^53 here, so
    // the sums cannot overflow.
    max_workspace = std::max(max_workspace, s.workspace);
    total_bytes += *s.bytes;
    if (total_bytes + max_workspace > kMaxBytes) {
      return NodeError(s.id, absl::StrCat("with this node, the graph's total (the bytes of "
                                          "every node plus the largest workspace) of ",
                                          AboveMaxBytes(total_bytes + max_workspace)));
    }
  }
  return absl::OkStatus();
}

void GraphBuilder::FillColumns(Graph& g) const {
  g.ids_.reserve(specs_.size());
  for (const NodeSpec& s : specs_) {
    g.ids_.push_back(s.id);
    g.ops_.push_back(s.op.empty() ? "generic" : s.op);
    g.bytes_.push_back(*s.bytes);
    g.costs_.push_back(s.cost);
    g.workspaces_.push_back(s.workspace);
    g.persistent_.push_back(s.persistent ? 1 : 0);
    g.roles_.push_back(s.role.value_or(s.persistent ? Role::kInput : Role::kForward));
    g.shapes_.push_back(s.shape);
    g.dtypes_.push_back(s.dtype);
    g.attrs_.push_back(s.attrs);
    g.homes_.push_back(s.home);
    g.in_place_.push_back(s.in_place ? 1 : 0);
    g.runs_on_.push_back(s.runs_on.value_or(Tier::kDevice));
    g.host_costs_.push_back(s.host_cost);
    if (s.host_cost.has_value()) ++g.num_host_costs_;
    g.collective_.push_back(s.collective ? 1 : 0);
    if (s.collective) ++g.num_collectives_;
    if (s.runs_on == Tier::kAuto) ++g.num_auto_runs_on_;
    if (s.home.has_value()) ++g.num_homes_;
    if (s.home == Tier::kAuto) ++g.num_auto_homes_;
    if (s.in_place) ++g.num_in_place_;
    if (s.persistent && s.home == Tier::kHost) {
      g.host_persistent_bytes_ += *s.bytes;
    } else if (s.persistent && s.home != Tier::kAuto) {
      g.persistent_bytes_ += *s.bytes;
    }
  }
  // Aliases: alias_of names an input (CheckNodeSpec), so it is a known id.
  g.alias_of_.assign(specs_.size(), kNoNode);
  for (NodeId v = 0; v < static_cast<NodeId>(specs_.size()); ++v) {
    if (!specs_[v].alias_of.has_value()) continue;
    g.alias_of_[v] = g.Find(*specs_[v].alias_of);
    ++g.num_aliases_;
  }
}

absl::Status GraphBuilder::LinkInputs(Graph& g, std::vector<std::vector<NodeId>>& unique) const {
  const int n = static_cast<int>(specs_.size());
  // Inputs, as given and deduplicated.
  unique.assign(n, {});
  for (NodeId v = 0; v < n; ++v) {
    for (const std::string& in : specs_[v].inputs) {
      NodeId u = g.Find(in);
      if (u == kNoNode) {
        return NodeError(specs_[v].id, absl::StrCat("unknown input '", absl::CEscape(in), "'"));
      }
      g.inputs_.push_back(u);
      if (std::find(unique[v].begin(), unique[v].end(), u) == unique[v].end()) {
        unique[v].push_back(u);
        g.unique_inputs_.push_back(u);
      }
    }
    g.input_offsets_.push_back(static_cast<int32_t>(g.inputs_.size()));
    g.unique_input_offsets_.push_back(static_cast<int32_t>(g.unique_inputs_.size()));
  }
  // Readers: counting sort by input, so each row is ascending.
  std::vector<int32_t> reader_count(n + 1, 0);
  for (NodeId v = 0; v < n; ++v) {
    for (NodeId u : unique[v]) ++reader_count[u + 1];
  }
  g.reader_offsets_.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) g.reader_offsets_[i + 1] = g.reader_offsets_[i] + reader_count[i + 1];
  g.readers_.assign(g.unique_inputs_.size(), kNoNode);
  std::vector<int32_t> fill(g.reader_offsets_.begin(), g.reader_offsets_.end() - 1);
  for (NodeId v = 0; v < n; ++v) {
    for (NodeId u : unique[v]) g.readers_[fill[u]++] = v;
  }
  return absl::OkStatus();
}

absl::Status GraphBuilder::MarkOutputs(Graph& g) const {
  g.is_output_.assign(specs_.size(), 0);
  for (const std::string& out : output_ids_) {
    NodeId v = g.Find(out);
    if (v == kNoNode) {
      return absl::InvalidArgumentError(absl::StrCat("unknown output '", absl::CEscape(out), "'"));
    }
    if (g.homes_[v] == Tier::kHost) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output '", absl::CEscape(out), "' is a persistent node whose home is the host: an "
          "output ends the step resident on the device, a node whose home is the host ends it "
          "there; give it one or the other"));
    }
    if (!g.is_output_[v]) {
      g.is_output_[v] = 1;
      g.outputs_.push_back(v);
    }
  }
  if (!specs_.empty() && g.outputs_.empty()) {
    return absl::InvalidArgumentError(
        "the graph lists no outputs: nothing would need to be computed");
  }
  return absl::OkStatus();
}

absl::Status GraphBuilder::OrderTopologically(Graph& g,
                                              const std::vector<std::vector<NodeId>>& unique) {
  // Kahn, smallest ready id first.
  const int n = static_cast<int>(unique.size());
  std::vector<int32_t> pending(n);
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (NodeId v = 0; v < n; ++v) {
    pending[v] = static_cast<int32_t>(unique[v].size());
    if (pending[v] == 0) ready.push(v);
  }
  g.topo_order_.reserve(n);
  while (!ready.empty()) {
    NodeId v = ready.top();
    ready.pop();
    g.topo_order_.push_back(v);
    for (NodeId r : g.readers(v)) {
      if (--pending[r] == 0) ready.push(r);
    }
  }
  if (static_cast<int>(g.topo_order_.size()) != n) {
    std::vector<bool> leftover(n, true);
    for (NodeId v : g.topo_order_) leftover[v] = false;
    return absl::InvalidArgumentError(absl::StrCat(
        "the graph has a cycle: ", DescribeCycle(g.ids_, unique, leftover)));
  }
  return absl::OkStatus();
}

void GraphBuilder::DeriveStoragesAndNeeds(Graph& g) {
  const int n = g.num_nodes();
  // Storage roots, in topological order: an alias's input comes first.
  g.storage_.resize(n);
  g.versions_.resize(n);
  for (NodeId v : g.topo_order_) {
    g.storage_[v] = g.alias_of_[v] == kNoNode ? v : g.storage_[g.alias_of_[v]];
    g.versions_[v] = g.alias_of_[v] == kNoNode || g.in_place_[v] ? v
                                                                 : g.versions_[g.alias_of_[v]];
  }
  // Outputs and their ancestors.
  g.needed_.assign(n, false);
  for (auto it = g.topo_order_.rbegin(); it != g.topo_order_.rend(); ++it) {
    NodeId v = *it;
    // An in-place update is an effect every step has, output or not.
    if (!g.needed_[v] && !g.is_output_[v] && !g.in_place_[v]) continue;
    g.needed_[v] = true;
    for (NodeId u : g.unique_inputs(v)) g.needed_[u] = true;
  }
}

absl::StatusOr<Graph> GraphBuilder::Build() const {
  Graph g;
  g.name_ = name_;
  RETURN_IF_ERROR(CheckNodes(g));
  FillColumns(g);
  std::vector<std::vector<NodeId>> unique;  // per node, its inputs once each
  RETURN_IF_ERROR(LinkInputs(g, unique));
  RETURN_IF_ERROR(MarkOutputs(g));
  RETURN_IF_ERROR(OrderTopologically(g, unique));
  DeriveStoragesAndNeeds(g);
  RETURN_IF_ERROR(CheckInPlace(g));
  return g;
}

Graph Graph::WithAutoRunsOnAs(const std::function<bool(NodeId)>& on_host) const {
  Graph g = *this;
  for (NodeId v = 0; v < num_nodes(); ++v) {
    if (runs_on_[v] == Tier::kAuto) g.runs_on_[v] = on_host(v) ? Tier::kHost : Tier::kDevice;
  }
  g.num_auto_runs_on_ = 0;
  return g;
}

Graph Graph::WithAutoHomesAs(const std::function<Tier(NodeId)>& tier_of) const {
  Graph g = *this;
  for (NodeId v = 0; v < num_nodes(); ++v) {
    if (homes_[v] != Tier::kAuto) continue;
    const Tier tier = tier_of(v);
    PEBBLE_CHECK(tier != Tier::kAuto, "an auto home resolved to auto");
    g.homes_[v] = tier;
    (tier == Tier::kHost ? g.host_persistent_bytes_ : g.persistent_bytes_) += bytes(v);
  }
  g.num_auto_homes_ = 0;
  return g;
}

NodeSpec SpecOf(const Graph& graph, NodeId v) {
  NodeSpec s;
  s.id = graph.id(v);
  s.op = graph.op(v);
  s.bytes = graph.bytes(v);
  s.cost = graph.cost(v);
  for (NodeId u : graph.inputs(v)) s.inputs.push_back(graph.id(u));
  s.workspace = graph.workspace(v);
  s.persistent = graph.persistent(v);
  s.shape = graph.shape(v);
  s.dtype = graph.dtype(v);
  s.attrs = graph.attrs(v);
  s.role = graph.role(v);
  if (graph.is_alias(v)) s.alias_of = graph.id(graph.alias_of(v));
  s.home = graph.home(v);
  s.in_place = graph.in_place(v);
  if (graph.runs_on(v) != Tier::kDevice) s.runs_on = graph.runs_on(v);
  s.host_cost = graph.host_cost(v);
  s.collective = graph.collective(v);
  return s;
}

}  // namespace pebble
