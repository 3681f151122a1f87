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
#include "graph/status.h"

namespace pebble {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr absl::string_view kFormat = "pebble-graph";
constexpr int64_t kVersion = 1;

// Longest rendering of a value or an id inside an error message.
constexpr size_t kMaxQuoted = 80;

constexpr std::array<absl::string_view, 5> kTopLevelKeys = {
    "format", "version", "name", "nodes", "outputs"};
constexpr std::array<absl::string_view, 11> kNodeKeys = {
    "id",         "op",   "bytes", "cost",  "inputs", "workspace",
    "persistent", "role", "shape", "dtype", "attrs"};

// ---------------------------------------------------------------------------
// Message helpers. Messages are one line: control characters are escaped and
// long text is cut.

std::string Printable(absl::string_view s, size_t max_len = kMaxQuoted) {
  std::string out;
  for (char c : s) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out;
}

// 'id', escaped and cut for a message.
std::string Quote(absl::string_view s) {
  return absl::StrCat("'", Printable(s), "'");
}

// A JSON value as shown after "got": its text, cut.
std::string Shown(const Json& v) {
  if (v.is_number_float() && !std::isfinite(v.get<double>())) {
    return absl::StrCat(v.get<double>());  // dump() would write null
  }
  return Printable(v.dump(-1, ' ', false, Json::error_handler_t::replace));
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Rejects the first key of `object` (in sorted order) that is not in `known`
// and does not start with '_'; suggests the closest known key.
template <size_t N>
absl::Status CheckKeys(const Json& object,
                       const std::array<absl::string_view, N>& known,
                       absl::string_view where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    if (!key.empty() && key[0] == '_') continue;
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string hint;
    size_t best = 3;  // suggest only within edit distance 2
    for (absl::string_view k : known) {
      const size_t d = EditDistance(key, k);
      if (d < best) {
        best = d;
        hint = absl::StrCat(" (did you mean '", k, "'?)");
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown key ", Quote(key), hint));
  }
  return absl::OkStatus();
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

absl::StatusOr<NodeSpec> ParseNode(const Json& node, size_t index) {
  const std::string at_index = absl::StrCat("nodes[", index, "]");
  if (!node.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        at_index, ": a node must be an object, got ", Shown(node)));
  }
  auto id_it = node.find("id");
  if (id_it == node.end()) {
    return absl::InvalidArgumentError(absl::StrCat(at_index, ": missing 'id'"));
  }
  if (!id_it->is_string() || id_it->get_ref<const std::string&>().empty()) {
    return FieldError(
        at_index, "id",
        absl::StrCat("must be a non-empty string, got ", Shown(*id_it)));
  }
  NodeSpec spec;
  spec.id = id_it->get<std::string>();
  const std::string where = absl::StrCat("node ", Quote(spec.id));
  RETURN_IF_ERROR(CheckKeys(node, kNodeKeys, where));

  if (auto it = node.find("op"); it != node.end()) {
    ASSIGN_OR_RETURN(spec.op, ReadString(*it, where, "op"));
  }
  if (auto it = node.find("bytes"); it != node.end()) {
    ASSIGN_OR_RETURN(spec.bytes, ReadCount(*it, where, "bytes"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": missing 'bytes' (the size of its output, a non-negative "
        "integer)"));
  }
  if (auto it = node.find("cost"); it != node.end()) {
    if (!it->is_number() || !std::isfinite(it->get<double>()) ||
        it->get<double>() < 0) {
      return FieldError(
          where, "cost",
          absl::StrCat("must be a non-negative finite number, got ",
                       Shown(*it)));
    }
    spec.cost = it->get<double>();
  }
  if (auto it = node.find("inputs"); it != node.end()) {
    if (!it->is_array()) {
      return FieldError(
          where, "inputs",
          absl::StrCat("must be an array of node ids, got ", Shown(*it)));
    }
    spec.inputs.reserve(it->size());
    for (size_t k = 0; k < it->size(); ++k) {
      const Json& in = (*it)[k];
      if (!in.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": 'inputs'[", k,
                         "] must be a node id (a string), got ", Shown(in)));
      }
      spec.inputs.push_back(in.get<std::string>());
    }
  }
  if (auto it = node.find("workspace"); it != node.end()) {
    ASSIGN_OR_RETURN(spec.workspace, ReadCount(*it, where, "workspace"));
  }
  if (auto it = node.find("persistent"); it != node.end()) {
    if (!it->is_boolean()) {
      return FieldError(
          where, "persistent",
          absl::StrCat("must be true or false, got ", Shown(*it)));
    }
    spec.persistent = it->get<bool>();
  }
  if (auto it = node.find("role"); it != node.end()) {
    ASSIGN_OR_RETURN(std::string name, ReadString(*it, where, "role"));
    absl::StatusOr<Role> role = ParseRole(name);
    if (!role.ok()) {
      return FieldError(where, "role",
                        absl::StrCat("is invalid: ", role.status().message()));
    }
    spec.role = *role;
  }
  if (auto it = node.find("shape"); it != node.end()) {
    if (!it->is_array()) {
      return FieldError(
          where, "shape",
          absl::StrCat("must be an array of non-negative integers, got ",
                       Shown(*it)));
    }
    Shape shape;
    shape.reserve(it->size());
    for (size_t k = 0; k < it->size(); ++k) {
      std::optional<int64_t> d = AsCount((*it)[k]);
      if (!d.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": 'shape'[", k,
            "] must be a non-negative integer (at most 2^53), got ",
            Shown((*it)[k])));
      }
      shape.push_back(*d);
    }
    spec.shape = std::move(shape);
  }
  if (auto it = node.find("dtype"); it != node.end()) {
    ASSIGN_OR_RETURN(std::string name, ReadString(*it, where, "dtype"));
    absl::StatusOr<DType> dtype = ParseDType(name);
    if (!dtype.ok()) {
      return FieldError(where, "dtype",
                        absl::StrCat("is invalid: ", dtype.status().message()));
    }
    spec.dtype = *dtype;
  }
  if (auto it = node.find("attrs"); it != node.end()) {
    if (!it->is_object()) {
      return FieldError(where, "attrs",
                        absl::StrCat("must be an object, got ", Shown(*it)));
    }
    spec.attrs = *it;
  }
  return spec;
}

absl::StatusOr<Graph> FromJson(const Json& doc) {
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
  RETURN_IF_ERROR(CheckKeys(doc, kTopLevelKeys, "graph"));

  GraphBuilder builder;
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
  // Reports duplicates with both positions (Build() would name the id only).
  absl::flat_hash_map<std::string, size_t> first_at;
  first_at.reserve(nodes->size());
  for (size_t i = 0; i < nodes->size(); ++i) {
    ASSIGN_OR_RETURN(NodeSpec spec, ParseNode((*nodes)[i], i));
    auto [it, inserted] = first_at.emplace(spec.id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", Quote(spec.id), ": duplicate id (nodes[",
                       it->second, "] and nodes[", i, "])"));
    }
    builder.AddNode(std::move(spec));
  }

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

// ---------------------------------------------------------------------------
// Text -> document.

// Builds the document as nlohmann's own parser does and keeps the path to the
// value being parsed, so that errors can say where they are. Also rejects
// what nlohmann accepts but a graph file must not contain: a key repeated in
// one object (nlohmann keeps the last one silently) and nesting deeper than
// kMaxJsonDepth (copying and printing such values recurses).
class TrackingSax : public nlohmann::json_sax<Json> {
 public:
  explicit TrackingSax(absl::string_view text) : text_(text) {}

  Json& root() { return root_; }
  // After a failed parse: "line L, column C: what (at path, node 'id')"
  // (no line and column when the parser gave no position).
  const std::string& error() const { return error_; }

  bool null() override { return Put(Json(nullptr)); }
  bool boolean(bool v) override { return Put(Json(v)); }
  bool number_integer(number_integer_t v) override { return Put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Put(Json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) override {
    return Put(Json(v));
  }
  bool string(string_t& v) override { return Put(Json(std::move(v))); }
  bool binary(binary_t& v) override { return Put(Json::binary(std::move(v))); }
  bool start_object(std::size_t /*elements*/) override {
    return Open(Json::object());
  }
  bool start_array(std::size_t /*elements*/) override {
    return Open(Json::array());
  }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& key) override {
    Frame& f = frames_.back();
    f.key = key;
    f.has_key = true;
    if (!f.keys.insert(key).second) {
      return Fail(std::nullopt, absl::StrCat("duplicate key ", Quote(key)));
    }
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    // Drops nlohmann's "[json.exception.parse_error.101] parse error at
    // line 3, column 4: " prefix: the position is rendered by Fail.
    std::string what = ex.what();
    if (size_t p = what.find("] "); p != std::string::npos) {
      what.erase(0, p + 2);
    }
    if (what.rfind("parse error", 0) == 0) {
      if (size_t p = what.find(": "); p != std::string::npos) {
        what.erase(0, p + 2);
      }
      what = absl::StrCat("invalid JSON: ", what);
    }
    return Fail(position, what);
  }

 private:
  struct Frame {
    Json* value = nullptr;
    bool is_array = false;
    bool has_key = false;
    std::string key;                        // objects: the key being parsed
    absl::flat_hash_set<std::string> keys;  // objects: lookups only
  };

  // Where the next value goes: a new root, the end of an array, or the
  // current key of an object.
  Json* Slot() {
    if (frames_.empty()) return &root_;
    Frame& f = frames_.back();
    if (f.is_array) {
      f.value->push_back(nullptr);
      return &f.value->back();
    }
    return &(*f.value)[f.key];
  }

  bool Put(Json v) {
    *Slot() = std::move(v);
    return true;
  }

  bool Open(Json container) {
    if (frames_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      return Fail(std::nullopt, absl::StrCat("nested deeper than ",
                                             kMaxJsonDepth, " levels"));
    }
    const bool is_array = container.is_array();
    Json* slot = Slot();
    *slot = std::move(container);
    // The pointer stays valid: a container's parent gains no element until
    // the container is closed.
    Frame frame;
    frame.value = slot;
    frame.is_array = is_array;
    frames_.push_back(std::move(frame));
    return true;
  }

  bool Close() {
    frames_.pop_back();
    return true;
  }

  // "nodes[2].cost": the path to the value being parsed.
  std::string Path() const {
    std::string path;
    for (size_t j = 0; j < frames_.size(); ++j) {
      const Frame& f = frames_[j];
      const bool has_child = j + 1 < frames_.size();
      if (f.is_array) {
        // An open child container was already appended; a scalar was not.
        const size_t n = f.value->size();
        absl::StrAppend(&path, "[", has_child ? n - 1 : n, "]");
      } else if (f.has_key) {
        absl::StrAppend(&path, j == 0 ? "" : ".", Printable(f.key, 40));
      } else {
        break;
      }
    }
    return path;
  }

  // The id of the node being parsed, when the error lies inside a node
  // object under "nodes" whose id was already read.
  std::optional<std::string> CurrentNodeId() const {
    if (frames_.size() < 3 || frames_[0].is_array ||
        frames_[0].key != "nodes" || !frames_[1].is_array ||
        frames_[2].is_array) {
      return std::nullopt;
    }
    auto it = frames_[2].value->find("id");
    if (it == frames_[2].value->end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  }

  bool Fail(std::optional<size_t> position, absl::string_view what) {
    if (position.has_value()) {
      const size_t pos = std::min(*position, text_.size());
      const absl::string_view before = text_.substr(0, pos);
      const size_t line = 1 + static_cast<size_t>(std::count(
                                  before.begin(), before.end(), '\n'));
      const size_t line_start = before.rfind('\n');
      const size_t column =
          line_start == absl::string_view::npos ? pos : pos - line_start - 1;
      error_ = absl::StrCat("line ", line, ", column ", column, ": ");
    }
    absl::StrAppend(&error_, Printable(what, 200));
    std::string context = Path();
    if (std::optional<std::string> id = CurrentNodeId(); id.has_value()) {
      absl::StrAppend(&context, context.empty() ? "" : ", ", "node ",
                      Quote(*id));
    }
    if (!context.empty()) absl::StrAppend(&error_, " (at ", context, ")");
    return false;
  }

  absl::string_view text_;
  Json root_;
  std::vector<Frame> frames_;
  std::string error_;
};

// `source` is the file the text came from, or empty.
absl::StatusOr<Graph> ParseText(absl::string_view text,
                                absl::string_view source) {
  TrackingSax sax(text);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const std::exception& e) {
    // Not expected: the parser reports through the handler. Kept so that no
    // input can escape as an exception.
    return absl::InvalidArgumentError(
        absl::StrCat(source, source.empty() ? "" : ": ",
                     "invalid JSON: ", Printable(e.what(), 200)));
  }
  if (!ok) {
    const std::string& error = sax.error();
    if (source.empty()) return absl::InvalidArgumentError(error);
    // "line 3, column 4: x" -> "path:3:4: x", as compilers write it.
    size_t line = 0;
    size_t column = 0;
    int consumed = 0;
    if (std::sscanf(error.c_str(), "line %zu, column %zu: %n", &line, &column,
                    &consumed) == 2 &&
        consumed > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line, ":", column, ": ", error.substr(consumed)));
    }
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", error));
  }
  absl::StatusOr<Graph> graph = GraphFromJson(sax.root());
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
  if (graph.workspace(v) != 0) node["workspace"] = graph.workspace(v);
  if (graph.persistent(v)) node["persistent"] = true;
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
        out += c;
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
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot read graph file: no such file"));
  }
  if (std::filesystem::is_directory(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read graph file: is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": cannot open graph file (", std::strerror(errno), ")"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": error while reading graph file"));
  }
  return ParseText(text.str(), path);
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
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": cannot write graph file (", std::strerror(errno), ")"));
  }
  out << GraphToJsonText(graph);
  out.close();
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": error while writing graph file"));
  }
  return absl::OkStatus();
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
      "// edge u -> v: v reads u (\"xk\": k times).\n"
      "// Label: id, op, bytes of the output, shape and dtype when known.\n";
  absl::StrAppend(&out, "digraph ", DotQuote(graph.name()), " {\n");
  out += "  rankdir=TB;\n";
  out += "  node [fontname=\"Helvetica\", fontsize=10, style=filled];\n";
  out += "  edge [color=\"#555555\"];\n";
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    std::string label = absl::StrCat(graph.id(v), "\n", graph.op(v), "\n",
                                     FormatBytes(graph.bytes(v)));
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
      if (times > 1) absl::StrAppend(&out, " [label=\"x", times, "\"]");
      out += ";\n";
    }
  }
  out += "}\n";
  return out;
}

}  // namespace pebble
