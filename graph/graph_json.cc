#include "graph/graph_json.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/file_output.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr absl::string_view kFormat = "pebble-graph";
constexpr int64_t kVersion = 1;

constexpr std::array<absl::string_view, 5> kTopLevelKeys = {
    "format", "version", "name", "nodes", "outputs"};
constexpr std::array<absl::string_view, 17> kNodeKeys = {
    "id",    "op",    "bytes", "cost",     "inputs",  "alias_of",  "workspace", "persistent",
    "role",  "shape", "dtype", "attrs",    "home",    "in_place",  "runs_on",   "host_cost",
    "collective"};

// A JSON value as shown after "got": its text, cut.
std::string Shown(const Json& v) {
  if (v.is_number_float() && !std::isfinite(v.get<double>())) {
    return absl::StrCat(v.get<double>());  // dump() would write null
  }
  return Printable(v.dump(-1, ' ', false, Json::error_handler_t::replace));
}

absl::Status FieldError(absl::string_view where, absl::string_view field,
                        absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": '", field, "' ", what));
}

// A non-negative integer no larger than kMaxJsonInteger. JSON has a single
// number type, so an integral float (1e6, 2.0) is accepted as well.
std::optional<int64_t> AsCount(const Json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(kMaxJsonInteger)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0 || i > kMaxJsonInteger) return std::nullopt;
    return i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= 0 && d <= static_cast<double>(kMaxJsonInteger)) ||
        d != std::floor(d)) {
      return std::nullopt;
    }
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

absl::StatusOr<int64_t> ReadCount(const Json& v, absl::string_view where,
                                  absl::string_view field) {
  std::optional<int64_t> n = AsCount(v);
  if (!n.has_value()) {
    return FieldError(where, field,
                      absl::StrCat("must be a non-negative integer (at most "
                                   "2^53), got ",
                                   Shown(v)));
  }
  return *n;
}

absl::StatusOr<std::string> ReadString(const Json& v, absl::string_view where,
                                       absl::string_view field) {
  if (!v.is_string()) {
    return FieldError(where, field,
                      absl::StrCat("must be a string, got ", Shown(v)));
  }
  return v.get<std::string>();
}

// ---------------------------------------------------------------------------
// Document -> GraphBuilder.

absl::StatusOr<bool> ReadBool(const Json& v, absl::string_view where, absl::string_view field) {
  if (!v.is_boolean()) {
    return FieldError(where, field, absl::StrCat("must be true or false, got ", Shown(v)));
  }
  return v.get<bool>();
}

absl::StatusOr<double> ReadNonNegativeNumber(const Json& v, absl::string_view where,
                                   absl::string_view field) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
    return FieldError(where, field,
                      absl::StrCat("must be a non-negative finite number, got ", Shown(v)));
  }
  return v.get<double>();
}

// A name that `parse` knows (a tier, a role, a dtype).
template <typename T>
absl::StatusOr<T> ReadName(const Json& v, absl::string_view where, absl::string_view field,
                           absl::StatusOr<T> (*parse)(absl::string_view)) {
  ASSIGN_OR_RETURN(std::string name, ReadString(v, where, field));
  absl::StatusOr<T> parsed = parse(name);
  if (!parsed.ok()) {
    return FieldError(where, field, absl::StrCat("is invalid: ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<std::vector<std::string>> ReadInputs(const Json& v, absl::string_view where) {
  if (!v.is_array()) {
    return FieldError(where, "inputs",
                      absl::StrCat("must be an array of node ids, got ", Shown(v)));
  }
  std::vector<std::string> inputs;
  inputs.reserve(v.size());
  for (size_t k = 0; k < v.size(); ++k) {
    if (!v[k].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": 'inputs'[", k, "] must be a node id (a string), got ", Shown(v[k])));
    }
    inputs.push_back(v[k].get<std::string>());
  }
  return inputs;
}

absl::StatusOr<Shape> ReadShape(const Json& v, absl::string_view where) {
  if (!v.is_array()) {
    return FieldError(where, "shape",
                      absl::StrCat("must be an array of non-negative integers, got ", Shown(v)));
  }
  Shape shape;
  shape.reserve(v.size());
  for (size_t k = 0; k < v.size(); ++k) {
    std::optional<int64_t> d = AsCount(v[k]);
    if (!d.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": 'shape'[", k,
                       "] must be a non-negative integer (at most 2^53), got ", Shown(v[k])));
    }
    shape.push_back(*d);
  }
  return shape;
}

absl::StatusOr<NodeSpec> ParseNode(const Json& node, size_t index) {
  const std::string at_index = absl::StrCat("nodes[", index, "]");
  if (!node.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at_index, ": a node must be an object, got ", Shown(node)));
  }
  auto id_it = node.find("id");
  if (id_it == node.end()) {
    return absl::InvalidArgumentError(absl::StrCat(at_index, ": missing 'id'"));
  }
  if (!id_it->is_string() || id_it->get_ref<const std::string&>().empty()) {
    return FieldError(at_index, "id",
                      absl::StrCat("must be a non-empty string, got ", Shown(*id_it)));
  }
  NodeSpec spec;
  spec.id = id_it->get<std::string>();
  const std::string where = absl::StrCat("node ", Quote(spec.id));
  RETURN_IF_ERROR(CheckJsonKeys(node, kNodeKeys, where));
  // Each field present is read in this order, so the first bad one is named.
  auto field = [&node](const char* name) -> const Json* {
    auto it = node.find(name);
    return it == node.end() ? nullptr : &*it;
  };
  if (const Json* v = field("op")) {
    ASSIGN_OR_RETURN(spec.op, ReadString(*v, where, "op"));
  }
  const Json* bytes = field("bytes");
  if (bytes == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": missing 'bytes' (the size of its output, a non-negative integer)"));
  }
  ASSIGN_OR_RETURN(spec.bytes, ReadCount(*bytes, where, "bytes"));
  if (const Json* v = field("cost")) {
    ASSIGN_OR_RETURN(spec.cost, ReadNonNegativeNumber(*v, where, "cost"));
  }
  if (const Json* v = field("inputs")) {
    ASSIGN_OR_RETURN(spec.inputs, ReadInputs(*v, where));
  }
  if (const Json* v = field("alias_of")) {
    if (!v->is_string()) {
      return FieldError(where, "alias_of",
                        absl::StrCat("must be the id of one of its inputs (a string), got ",
                                     Shown(*v)));
    }
    spec.alias_of = v->get<std::string>();
  }
  if (const Json* v = field("workspace")) {
    ASSIGN_OR_RETURN(spec.workspace, ReadCount(*v, where, "workspace"));
  }
  if (const Json* v = field("persistent")) {
    ASSIGN_OR_RETURN(spec.persistent, ReadBool(*v, where, "persistent"));
  }
  if (const Json* v = field("home")) {
    ASSIGN_OR_RETURN(spec.home, ReadName(*v, where, "home", ParseTier));
  }
  if (const Json* v = field("in_place")) {
    ASSIGN_OR_RETURN(spec.in_place, ReadBool(*v, where, "in_place"));
  }
  if (const Json* v = field("collective")) {
    ASSIGN_OR_RETURN(spec.collective, ReadBool(*v, where, "collective"));
  }
  if (const Json* v = field("runs_on")) {
    ASSIGN_OR_RETURN(spec.runs_on, ReadName(*v, where, "runs_on", ParseTier));
  }
  if (const Json* v = field("host_cost")) {
    ASSIGN_OR_RETURN(spec.host_cost, ReadNonNegativeNumber(*v, where, "host_cost"));
  }
  if (const Json* v = field("role")) {
    ASSIGN_OR_RETURN(spec.role, ReadName(*v, where, "role", ParseRole));
  }
  if (const Json* v = field("shape")) {
    ASSIGN_OR_RETURN(spec.shape, ReadShape(*v, where));
  }
  if (const Json* v = field("dtype")) {
    ASSIGN_OR_RETURN(spec.dtype, ReadName(*v, where, "dtype", ParseDType));
  }
  if (const Json* v = field("attrs")) {
    if (!v->is_object()) {
      return FieldError(where, "attrs", absl::StrCat("must be an object, got ", Shown(*v)));
    }
    spec.attrs = *v;
  }
  return spec;
}

// The document's fields but its nodes and outputs (format, version, unknown
// top-level keys, name), into `builder`; then that 'nodes' is an array.
absl::Status ReadDocument(const Json& doc, GraphBuilder& builder) {
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pebble-graph document must be a JSON object, got ", Shown(doc)));
  }
  auto format = doc.find("format");
  if (format == doc.end()) {
    return absl::InvalidArgumentError(
        "missing 'format' (expected \"pebble-graph\")");
  }
  if (!format->is_string() ||
      format->get_ref<const std::string&>() != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'format' must be \"pebble-graph\", got ", Shown(*format)));
  }
  auto version = doc.find("version");
  if (version == doc.end()) {
    return absl::InvalidArgumentError("missing 'version' (expected 1)");
  }
  if (AsCount(*version) != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported 'version' ", Shown(*version),
                     " (this pebble reads version 1)"));
  }
  RETURN_IF_ERROR(CheckJsonKeys(doc, kTopLevelKeys, "graph"));

  if (auto it = doc.find("name"); it != doc.end()) {
    ASSIGN_OR_RETURN(std::string name, ReadString(*it, "graph", "name"));
    builder.set_name(std::move(name));
  }

  auto nodes = doc.find("nodes");
  if (nodes == doc.end()) {
    return absl::InvalidArgumentError("missing 'nodes'");
  }
  if (!nodes->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'nodes' must be an array of objects, got ", Shown(*nodes)));
  }
  return absl::OkStatus();
}

// Node objects, in file order, into a GraphBuilder. Reports duplicates
// with both positions (Build() would name the id only).
class NodeReader {
 public:
  explicit NodeReader(GraphBuilder& builder) : builder_(builder) {}
  absl::Status Add(const Json& node, size_t i) {
    ASSIGN_OR_RETURN(NodeSpec spec, ParseNode(node, i));
    auto [it, inserted] = first_at_.emplace(spec.id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", Quote(spec.id), ": duplicate id (nodes[",
                       it->second, "] and nodes[", i, "])"));
    }
    builder_.AddNode(std::move(spec));
    return absl::OkStatus();
  }

 private:
  GraphBuilder& builder_;
  absl::flat_hash_map<std::string, size_t> first_at_;
};

// 'outputs' into `builder`, then Build().
absl::StatusOr<Graph> ReadOutputsAndBuild(const Json& doc, GraphBuilder& builder) {
  auto outputs = doc.find("outputs");
  if (outputs == doc.end()) {
    return absl::InvalidArgumentError(
        "missing 'outputs' (the ids of the nodes that must be resident at "
        "the end)");
  }
  if (!outputs->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'outputs' must be an array of node ids, got ", Shown(*outputs)));
  }
  for (size_t k = 0; k < outputs->size(); ++k) {
    const Json& out = (*outputs)[k];
    if (!out.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'outputs'[", k, "] must be a node id (a string), got ", Shown(out)));
    }
    builder.AddOutput(out.get<std::string>());
  }
  return builder.Build();
}

absl::StatusOr<Graph> FromJson(const Json& doc) {
  GraphBuilder builder;
  RETURN_IF_ERROR(ReadDocument(doc, builder));
  const Json& nodes = doc["nodes"];
  NodeReader reader(builder);
  for (size_t i = 0; i < nodes.size(); ++i) RETURN_IF_ERROR(reader.Add(nodes[i], i));
  return ReadOutputsAndBuild(doc, builder);
}

// `source` is the file the text came from, or empty. The nodes are read one
// at a time as the text is parsed (ParseStrictJsonStreaming), never as a
// document of all of them, which would take about ten times the text. The
// first bad node is reported only once the JSON and the document's own
// fields are found sound, so that errors come in the order FromJson gives
// them (docs/graph-format.md).
absl::StatusOr<Graph> ParseText(absl::string_view text, absl::string_view source) {
  GraphBuilder builder;
  NodeReader reader(builder);
  absl::Status first_bad_node;
  auto sink = [&](Json& node, size_t i) {
    if (first_bad_node.ok()) first_bad_node = reader.Add(node, i);
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(const Json doc, ParseStrictJsonStreaming(text, source, "nodes", sink));
  absl::StatusOr<Graph> graph;
  try {
    absl::Status status = ReadDocument(doc, builder);
    if (status.ok()) status = first_bad_node;
    graph = status.ok() ? ReadOutputsAndBuild(doc, builder) : absl::StatusOr<Graph>(status);
  } catch (const std::exception& e) {
    // As in GraphFromJson: every access is type-checked first.
    graph = absl::InvalidArgumentError(absl::StrCat(
        "malformed pebble-graph document: ", Printable(e.what(), 200)));
  }
  if (!graph.ok() && !source.empty()) {
    return absl::Status(graph.status().code(),
                        absl::StrCat(source, ": ", graph.status().message()));
  }
  return graph;
}

// ---------------------------------------------------------------------------
// Graph -> text.

OrderedJson NodeToJson(const Graph& graph, NodeId v) {
  OrderedJson node = OrderedJson::object();
  node["id"] = graph.id(v);
  node["op"] = graph.op(v);
  node["bytes"] = graph.bytes(v);
  // Exact comparison on purpose: anything but the default 1 is written, and
  // nlohmann prints the shortest text that reads back the same double.
  if (graph.cost(v) != 1.0 || std::signbit(graph.cost(v))) {
    node["cost"] = graph.cost(v);
  }
  if (!graph.inputs(v).empty()) {
    OrderedJson inputs = OrderedJson::array();
    for (NodeId u : graph.inputs(v)) inputs.push_back(graph.id(u));
    node["inputs"] = std::move(inputs);
  }
  if (graph.is_alias(v)) node["alias_of"] = graph.id(graph.alias_of(v));
  if (graph.workspace(v) != 0) node["workspace"] = graph.workspace(v);
  if (graph.persistent(v)) node["persistent"] = true;
  if (graph.home(v).has_value()) node["home"] = std::string(TierName(*graph.home(v)));
  if (graph.in_place(v)) node["in_place"] = true;
  if (graph.runs_on(v) != Tier::kDevice) node["runs_on"] = std::string(TierName(graph.runs_on(v)));
  if (graph.host_cost(v).has_value()) node["host_cost"] = *graph.host_cost(v);
  if (graph.collective(v)) node["collective"] = true;
  const Role default_role = graph.persistent(v) ? Role::kInput : Role::kForward;
  if (graph.role(v) != default_role) {
    node["role"] = std::string(RoleName(graph.role(v)));
  }
  if (graph.shape(v).has_value()) node["shape"] = *graph.shape(v);
  if (graph.dtype(v).has_value()) {
    node["dtype"] = std::string(DTypeName(*graph.dtype(v)));
  }
  if (!graph.attrs(v).is_null()) node["attrs"] = graph.attrs(v);
  return node;
}

std::string Dump(const OrderedJson& v) {
  return v.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// Single-line JSON with a space after ':' and ',', as in the SPEC's example.
void AppendInline(const OrderedJson& v, std::string* out) {
  if (v.is_object()) {
    out->push_back('{');
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      absl::StrAppend(out, first ? "" : ", ", Dump(OrderedJson(it.key())),
                      ": ");
      AppendInline(it.value(), out);
      first = false;
    }
    out->push_back('}');
  } else if (v.is_array()) {
    out->push_back('[');
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out->append(", ");
      AppendInline(v[i], out);
    }
    out->push_back(']');
  } else {
    out->append(Dump(v));
  }
}

// ---------------------------------------------------------------------------
// DOT.

// A DOT double-quoted string. In labels (escString) '\' starts an escape, so
// it is doubled; '"' is escaped; line breaks become the "\n" escape.
std::string DotQuote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        break;
      default:
        // Another control character (a NUL cuts Graphviz's strings) is
        // written as its code, \\xHH, visible in the picture.
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          absl::StrAppend(&out, "\\\\x",
                          absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

const char* RoleColor(Role role) {
  switch (role) {
    case Role::kInput:
      return "#c7e9c0";  // green
    case Role::kParameter:
      return "#fee391";  // yellow
    case Role::kBuffer:
      return "#d9d9d9";  // grey
    case Role::kForward:
      return "#c6dbef";  // blue
    case Role::kBackward:
      return "#fcbba1";  // red
    case Role::kOptimizerState:
      return "#dadaeb";  // lilac
    case Role::kUpdate:
      return "#bcbddc";  // purple
  }
  return "#ffffff";
}

}  // namespace

// ---------------------------------------------------------------------------

absl::StatusOr<Graph> GraphFromJson(const nlohmann::json& doc) {
  try {
    return FromJson(doc);
  } catch (const std::exception& e) {
    // Every access above is type-checked first; this is a safety net.
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed pebble-graph document: ", Printable(e.what(), 200)));
  }
}

absl::StatusOr<Graph> ParseGraphJson(absl::string_view text) {
  return ParseText(text, "");
}

absl::StatusOr<Graph> ReadGraphFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(path, "graph file"));
  return ParseText(text, Printable(path, 200));
}

nlohmann::ordered_json GraphToJson(const Graph& graph) {
  OrderedJson doc = OrderedJson::object();
  doc["format"] = std::string(kFormat);
  doc["version"] = kVersion;
  doc["name"] = graph.name();
  OrderedJson nodes = OrderedJson::array();
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    nodes.push_back(NodeToJson(graph, v));
  }
  doc["nodes"] = std::move(nodes);
  OrderedJson outputs = OrderedJson::array();
  for (NodeId v : graph.outputs()) outputs.push_back(graph.id(v));
  doc["outputs"] = std::move(outputs);
  return doc;
}

std::string GraphToJsonText(const Graph& graph) {
  const OrderedJson doc = GraphToJson(graph);
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": ", Dump(doc["format"]), ",\n");
  absl::StrAppend(&out, "  \"version\": ", Dump(doc["version"]), ",\n");
  absl::StrAppend(&out, "  \"name\": ", Dump(doc["name"]), ",\n");
  const OrderedJson& nodes = doc["nodes"];
  if (nodes.empty()) {
    out += "  \"nodes\": [],\n";
  } else {
    out += "  \"nodes\": [\n";
    for (size_t i = 0; i < nodes.size(); ++i) {
      out += "    ";
      AppendInline(nodes[i], &out);
      out += i + 1 < nodes.size() ? ",\n" : "\n";
    }
    out += "  ],\n";
  }
  std::string outputs;
  AppendInline(doc["outputs"], &outputs);
  if (outputs.size() <= 90) {
    absl::StrAppend(&out, "  \"outputs\": ", outputs, "\n");
  } else {
    // Training graphs list every parameter gradient: one per line.
    out += "  \"outputs\": [\n";
    const OrderedJson& list = doc["outputs"];
    for (size_t i = 0; i < list.size(); ++i) {
      absl::StrAppend(&out, "    ", Dump(list[i]),
                      i + 1 < list.size() ? ",\n" : "\n");
    }
    out += "  ]\n";
  }
  out += "}\n";
  return out;
}

absl::Status WriteGraphFile(const Graph& graph, const std::string& path) {
  return WriteFileAtomically(path, GraphToJsonText(graph));
}

std::string GraphToDot(const Graph& graph) {
  std::string out;
  absl::StrAppend(&out, "// pebble graph ", Quote(graph.name()), ": ",
                  graph.num_nodes(), " nodes, ", graph.outputs().size(),
                  " outputs.\n");
  out +=
      "// Legend: box = persistent (resident throughout, never computed):\n"
      "//   green = data input, yellow = parameter, grey = buffer;\n"
      "// ellipse = computed: blue = forward, red = backward (gradient);\n"
      "// double border = output (resident at the end);\n"
      "// edge u -> v: v reads u (\"xk\": k times); dashed: v is a view of u.\n"
      "// Label: id, op, bytes of the output, shape and dtype when known.\n";
  absl::StrAppend(&out, "digraph ", DotQuote(graph.name()), " {\n");
  out += "  rankdir=TB;\n";
  out += "  node [fontname=\"Helvetica\", fontsize=10, style=filled];\n";
  out += "  edge [color=\"#555555\"];\n";
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    std::string label = absl::StrCat(graph.id(v), "\n", graph.op(v), "\n",
                                     FormatBytes(graph.bytes(v)));
    if (graph.is_alias(v)) absl::StrAppend(&label, " (view of ", graph.id(graph.alias_of(v)), ")");
    if (graph.shape(v).has_value()) {
      absl::StrAppend(&label, "\n", ShapeToString(*graph.shape(v)));
      if (graph.dtype(v).has_value()) {
        absl::StrAppend(&label, " ", DTypeName(*graph.dtype(v)));
      }
    }
    absl::StrAppend(&out, "  ", DotQuote(graph.id(v)),
                    " [label=", DotQuote(label),
                    ", shape=", graph.persistent(v) ? "box" : "ellipse",
                    ", fillcolor=\"", RoleColor(graph.role(v)), "\"",
                    graph.is_output(v) ? ", peripheries=2" : "", "];\n");
  }
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    const absl::Span<const NodeId> inputs = graph.inputs(v);
    for (NodeId u : graph.unique_inputs(v)) {
      const auto times = std::count(inputs.begin(), inputs.end(), u);
      absl::StrAppend(&out, "  ", DotQuote(graph.id(u)), " -> ",
                      DotQuote(graph.id(v)));
      const bool view = graph.alias_of(v) == u;
      if (times > 1 || view) {
        absl::StrAppend(&out, " [", times > 1 ? absl::StrCat("label=\"x", times, "\"") : "",
                        times > 1 && view ? ", " : "", view ? "style=dashed" : "", "]");
      }
      out += ";\n";
    }
  }
  out += "}\n";
  return out;
}

}  // namespace pebble
