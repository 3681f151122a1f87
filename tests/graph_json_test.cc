// Graph files: parsing and every error of SPEC section 1, exact round trips
// through JSON (hand-written and seeded random graphs), the example files,
// DOT export, and robustness against malformed input.
#include "graph/graph_json.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/status.h"
#include "gtest/gtest.h"

namespace pebble {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using Json = nlohmann::json;

std::vector<NodeId> ToVector(absl::Span<const NodeId> span) {
  return std::vector<NodeId>(span.begin(), span.end());
}

// Every field of every node, and everything derived from them.
void ExpectSameGraph(const Graph& a, const Graph& b) {
  EXPECT_EQ(a.name(), b.name());
  ASSERT_EQ(a.num_nodes(), b.num_nodes());
  for (NodeId v = 0; v < a.num_nodes(); ++v) {
    SCOPED_TRACE(absl::StrCat("node ", v, " '", a.id(v), "'"));
    EXPECT_EQ(a.id(v), b.id(v));
    EXPECT_EQ(a.op(v), b.op(v));
    EXPECT_EQ(a.bytes(v), b.bytes(v));
    // Bit-identical, so -0.0 and 1/3 count.
    EXPECT_EQ(std::bit_cast<uint64_t>(a.cost(v)),
              std::bit_cast<uint64_t>(b.cost(v)))
        << a.cost(v) << " vs " << b.cost(v);
    EXPECT_EQ(a.workspace(v), b.workspace(v));
    EXPECT_EQ(a.persistent(v), b.persistent(v));
    EXPECT_EQ(a.role(v), b.role(v));
    EXPECT_EQ(a.shape(v), b.shape(v));
    EXPECT_EQ(a.dtype(v), b.dtype(v));
    EXPECT_EQ(a.attrs(v), b.attrs(v));
    EXPECT_EQ(ToVector(a.inputs(v)), ToVector(b.inputs(v)));
    EXPECT_EQ(ToVector(a.unique_inputs(v)), ToVector(b.unique_inputs(v)));
    EXPECT_EQ(ToVector(a.readers(v)), ToVector(b.readers(v)));
    EXPECT_EQ(a.is_output(v), b.is_output(v));
    EXPECT_EQ(a.alias_of(v), b.alias_of(v));
    EXPECT_EQ(a.storage(v), b.storage(v));
  }
  EXPECT_EQ(ToVector(a.outputs()), ToVector(b.outputs()));
  EXPECT_EQ(ToVector(a.topological_order()), ToVector(b.topological_order()));
  EXPECT_EQ(a.needed(), b.needed());
  EXPECT_EQ(a.persistent_bytes(), b.persistent_bytes());
}

// A random valid graph. Nodes read only lower-numbered nodes (repeats
// allowed) and are added in a shuffled order; ids use the characters real
// ids contain (':', '.', '#') and some that need escaping in JSON and DOT.
// Costs include values whose text form is tricky (1/3, -0, denormals).
Graph RandomGraph(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  static const std::vector<std::string> kPieces = {
      "a",     "grad:",       "layer1.0.",         "#2",
      "\"q\"", "back\\slash", "\xc3\xbcn\xc3\xaf", "sp ace",
      "tab\t", "conv1.weight"};
  static const std::vector<std::string> kOps = {"generic", "conv2d", "relu", "",
                                                "matmul"};
  static const std::vector<double> kCosts = {1.0,
                                             0.0,
                                             -0.0,
                                             0.1,
                                             1.0 / 3.0,
                                             2.5e-7,
                                             4.9406564584124654e-324,
                                             2.2250738585072014e-308,
                                             1.7976931348623157e308,
                                             12345678.9};
  std::vector<NodeSpec> specs(n);
  double total_cost = 0;
  bool big_taken = false;
  for (int i = 0; i < n; ++i) {
    NodeSpec& s = specs[i];
    s.id = absl::StrCat(kPieces[pick(0, kPieces.size() - 1)],
                        kPieces[pick(0, kPieces.size() - 1)], i);
    s.op = kOps[pick(0, kOps.size() - 1)];
    s.persistent = i == 0 || pick(0, 5) == 0;
    if (!s.persistent) {
      const int k = pick(0, 3);
      for (int j = 0; j < k; ++j) s.inputs.push_back(specs[pick(0, i - 1)].id);
    }
    switch (pick(0, 3)) {
      case 0:
        s.bytes = 0;
        break;
      case 1:
        // Near the top of the range. GraphBuilder bounds the graph's total
        // (every node plus the largest workspace) by 2^53 as well, so the
        // first such node leaves room for what the others may take (at
        // most 2^30 each, a workspace at most 2^20); later ones are small.
        s.bytes = big_taken ? pick(1, 1 << 30)
                            : kMaxJsonInteger - int64_t{n} * (int64_t{1} << 31) - (1 << 20);
        big_taken = true;
        break;
      default:
        s.bytes = pick(1, 1 << 30);
    }
    if (pick(0, 1)) {
      s.cost = pick(0, 2) == 0
                   ? std::uniform_real_distribution<double>(0, 1e12)(rng)
                   : kCosts[pick(0, kCosts.size() - 1)];
    }
    // The graph's total cost must stay finite (the base cost sums it).
    if (!std::isfinite(total_cost + s.cost)) s.cost = 1.0;
    total_cost += s.cost;
    if (pick(0, 3) == 0) s.workspace = pick(0, 1 << 20);
    if (pick(0, 2) == 0) s.role = static_cast<Role>(pick(0, 4));
    if (pick(0, 1)) {
      Shape shape(pick(0, 4));
      for (int64_t& d : shape) d = pick(0, 64);
      s.shape = shape;
    }
    if (pick(0, 1)) s.dtype = static_cast<DType>(pick(0, 4));
    // Where both are given, bytes must be what they hold.
    if (s.shape.has_value() && s.dtype.has_value()) {
      s.bytes = NumElements(*s.shape) * DTypeSize(*s.dtype);
    }
    if (pick(0, 3) == 0) {
      s.attrs = Json::object();
      if (pick(0, 1)) s.attrs["stride"] = pick(1, 3);
      if (pick(0, 1)) s.attrs["mode"] = "bilinear";
      if (pick(0, 1)) {
        s.attrs["nested"] = {{"list", {1, 2.5, nullptr, true, "x"}},
                             {"empty", Json::object()}};
      }
    }
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  GraphBuilder builder(absl::StrCat("random-", seed));
  for (int i : order) builder.AddNode(specs[i]);
  const int outputs = pick(1, 4);
  for (int k = 0; k < outputs; ++k) {
    builder.AddOutput(specs[pick(0, n - 1)].id);
  }
  absl::StatusOr<Graph> g = builder.Build();
  PEBBLE_CHECK(g.ok(), "random graph must be valid");
  return *std::move(g);
}

std::string SourcePath(const std::string& relative) {
  return absl::StrCat(PEBBLE_SOURCE_DIR, "/", relative);
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/pebble_graph_json_test_", name);
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// A two-node document whose node "b" tests can change.
Json BaseDoc() {
  return Json::parse(R"({
    "format": "pebble-graph", "version": 1, "name": "base",
    "nodes": [{"id": "a", "bytes": 8},
              {"id": "b", "bytes": 4, "inputs": ["a"]}],
    "outputs": ["b"]})");
}

// Expects InvalidArgument with a one-line message containing every part.
void ExpectInvalid(const absl::StatusOr<Graph>& g,
                   const std::vector<std::string>& parts) {
  ASSERT_FALSE(g.ok()) << "expected an error containing " << parts[0];
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument)
      << g.status();
  const std::string message(g.status().message());
  for (const std::string& part : parts) {
    EXPECT_THAT(message, HasSubstr(part));
  }
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

constexpr char kSpecExample[] = R"({
  "format": "pebble-graph",
  "version": 1,
  "name": "tanh-chain-4",
  "nodes": [
    {"id": "x",  "op": "input", "bytes": 1000000, "persistent": true},
    {"id": "a1", "op": "tanh",  "bytes": 1000000, "cost": 1.0, "inputs": ["x"]},
    {"id": "a2", "op": "tanh",  "bytes": 1000000, "cost": 1.0, "inputs": ["a1"], "workspace": 0}
  ],
  "outputs": ["a2"]
})";

// --- Parsing -----------------------------------------------------------------

TEST(GraphJsonTest, ParsesTheSpecExample) {
  absl::StatusOr<Graph> g = ParseGraphJson(kSpecExample);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->name(), "tanh-chain-4");
  ASSERT_EQ(g->num_nodes(), 3);
  EXPECT_EQ(g->id(0), "x");
  EXPECT_EQ(g->op(0), "input");
  EXPECT_TRUE(g->persistent(0));
  EXPECT_EQ(g->role(0), Role::kInput);
  EXPECT_EQ(g->bytes(1), 1000000);
  EXPECT_EQ(g->cost(1), 1.0);
  EXPECT_THAT(ToVector(g->inputs(2)), ElementsAre(1));
  EXPECT_THAT(ToVector(g->outputs()), ElementsAre(2));
  EXPECT_EQ(g->persistent_bytes(), 1000000);
}

TEST(GraphJsonTest, DefaultsApply) {
  absl::StatusOr<Graph> g = GraphFromJson(BaseDoc());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->op(0), "generic");
  EXPECT_EQ(g->cost(0), 1.0);
  EXPECT_EQ(g->workspace(0), 0);
  EXPECT_FALSE(g->persistent(0));
  EXPECT_EQ(g->role(0), Role::kForward);
  EXPECT_FALSE(g->shape(0).has_value());
  EXPECT_FALSE(g->dtype(0).has_value());
  EXPECT_TRUE(g->attrs(0).is_null());
}

TEST(GraphJsonTest, NameIsOptional) {
  Json doc = BaseDoc();
  doc.erase("name");
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->name(), "");
}

TEST(GraphJsonTest, AllFieldsAndExtensions) {
  Json doc = BaseDoc();
  doc["nodes"][0] = {{"id", "w"},           {"op", "parameter"},
                     {"bytes", 48},         {"persistent", true},
                     {"role", "parameter"}, {"shape", {3, 4}},
                     {"dtype", "float32"}};
  doc["nodes"][1] = {{"id", "b"},
                     {"op", "matmul"},
                     {"bytes", 12},
                     {"cost", 0.25},
                     {"inputs", {"w", "w"}},
                     {"workspace", 16},
                     {"role", "backward"},
                     {"shape", {2, 3}},
                     {"dtype", "bf16"},
                     {"attrs", {{"transpose", true}}}};
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->role(0), Role::kParameter);
  EXPECT_EQ(g->shape(0), Shape({3, 4}));
  EXPECT_EQ(g->dtype(0), DType::kFloat32);
  EXPECT_EQ(g->op(1), "matmul");
  EXPECT_EQ(g->cost(1), 0.25);
  EXPECT_EQ(g->workspace(1), 16);
  EXPECT_EQ(g->role(1), Role::kBackward);
  EXPECT_EQ(g->dtype(1), DType::kBFloat16);
  EXPECT_EQ(g->attrs(1)["transpose"], true);
  // A repeated input counts once for residency but twice as an operand.
  EXPECT_THAT(ToVector(g->inputs(1)), ElementsAre(0, 0));
  EXPECT_THAT(ToVector(g->unique_inputs(1)), ElementsAre(0));
  EXPECT_THAT(ToVector(g->readers(0)), ElementsAre(1));
}

TEST(GraphJsonTest, IntegralFloatsAreIntegers) {
  Json doc = BaseDoc();
  doc["nodes"][1]["bytes"] = 1e6;
  doc["nodes"][1]["workspace"] = 2.0;
  doc["nodes"][1]["shape"] = {4.0, 1e2};
  doc["version"] = 1.0;
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->bytes(1), 1000000);
  EXPECT_EQ(g->workspace(1), 2);
  EXPECT_EQ(g->shape(1), Shape({4, 100}));
}

TEST(GraphJsonTest, LargestBytesAccepted) {
  Json doc = BaseDoc();
  // The graph's total is bounded by 2^53 as well: the other node is empty.
  doc["nodes"][0]["bytes"] = 0;
  doc["nodes"][1]["bytes"] = kMaxJsonInteger;
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->bytes(1), kMaxJsonInteger);
}

TEST(GraphJsonTest, IntegerCostAccepted) {
  Json doc = BaseDoc();
  doc["nodes"][1]["cost"] = 3;
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->cost(1), 3.0);
}

TEST(GraphJsonTest, UnderscoreKeysAreIgnored) {
  Json doc = BaseDoc();
  doc["_comment"] = "free text";
  doc["nodes"][1]["_note"] = {1, 2, 3};
  EXPECT_TRUE(GraphFromJson(doc).ok());
}

TEST(GraphJsonTest, EmptyGraph) {
  absl::StatusOr<Graph> g = ParseGraphJson(
      R"({"format": "pebble-graph", "version": 1, "nodes": [], "outputs": []})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->num_nodes(), 0);
}

// --- Field errors: every one names node 'b' and the field. -----------------

struct FieldCase {
  std::string field;   // the key set on node "b"
  Json value;          // its value; a discarded value erases the key
  std::string expect;  // besides "node 'b'" and the field
};

TEST(GraphJsonFieldTest, EveryBadFieldNamesNodeAndField) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<FieldCase> cases = {
      {"bytes", Json(Json::value_t::discarded), "missing 'bytes'"},
      {"bytes", 1.5, "1.5"},
      {"bytes", -1, "-1"},
      {"bytes", -1.0, "-1.0"},
      {"bytes", "8", "\"8\""},
      {"bytes", true, "true"},
      {"bytes", nullptr, "null"},
      {"bytes", kMaxJsonInteger + 1, "2^53"},
      {"bytes", std::numeric_limits<uint64_t>::max(), "18446744073709551615"},
      {"bytes", 1e300, "1e+300"},
      {"cost", -1, "-1"},
      {"cost", -0.5, "-0.5"},
      {"cost", "1", "\"1\""},
      {"cost", nullptr, "null"},
      // Only an in-memory document can hold these (JSON cannot spell them).
      {"cost", inf, "inf"},
      {"cost", -inf, "-inf"},
      {"cost", std::numeric_limits<double>::quiet_NaN(), "nan"},
      {"inputs", "a", "array"},
      {"inputs", {1}, "'inputs'[0]"},
      {"inputs", {"a", nullptr}, "'inputs'[1]"},
      {"workspace", -4, "-4"},
      {"workspace", 0.5, "0.5"},
      {"persistent", 1, "true or false"},
      {"persistent", "true", "true or false"},
      {"shape", 3, "array"},
      {"shape", {2, -1}, "'shape'[1]"},
      {"shape", {1.5}, "'shape'[0]"},
      {"dtype", "fp64", "unknown dtype 'fp64'"},
      {"dtype", 4, "string"},
      {"attrs", {1, 2}, "object"},
      {"attrs", nullptr, "object"},
      {"attrs", "x", "object"},
      {"role", "weight", "unknown role 'weight'"},
      {"role", 1, "string"},
      {"op", 3, "string"},
      {"op", nullptr, "string"},
      {"byte", 4, "did you mean 'bytes'"},
      {"cots", 4, "did you mean 'cost'"},
      {"input", {"a"}, "did you mean 'inputs'"},
      {"color", "red", "unknown key 'color'"},
  };
  for (const FieldCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.field, " = ", c.value.dump()));
    Json doc = BaseDoc();
    if (c.value.is_discarded()) {
      doc["nodes"][1].erase(c.field);
    } else {
      doc["nodes"][1][c.field] = c.value;
    }
    ExpectInvalid(GraphFromJson(doc),
                  {"node 'b'", absl::StrCat("'", c.field), c.expect});
  }
}

TEST(GraphJsonFieldTest, BadIdNamesTheIndex) {
  const std::vector<std::pair<Json, std::string>> cases = {
      {Json(Json::value_t::discarded), "missing 'id'"},
      {"", "non-empty string"},
      {3, "non-empty string, got 3"},
      {nullptr, "got null"},
  };
  for (const auto& [value, expect] : cases) {
    Json doc = BaseDoc();
    if (value.is_discarded()) {
      doc["nodes"][1].erase("id");
    } else {
      doc["nodes"][1]["id"] = value;
    }
    ExpectInvalid(GraphFromJson(doc), {"nodes[1]", expect});
  }
}

TEST(GraphJsonFieldTest, NodeMustBeAnObject) {
  Json doc = BaseDoc();
  doc["nodes"][1] = {"b", 4};
  ExpectInvalid(GraphFromJson(doc), {"nodes[1]", "object"});
}

TEST(GraphJsonFieldTest, LongAndOddValuesStayOnOneLine) {
  Json doc = BaseDoc();
  doc["nodes"][1]["id"] = std::string("new\nline") + std::string(500, 'x');
  doc["nodes"][1]["bytes"] = std::string(1000, 'y');
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_FALSE(g.ok());
  const std::string message(g.status().message());
  EXPECT_THAT(message, HasSubstr("node 'new\\nline"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_LT(message.size(), 400u);
}

// --- Document errors. ------------------------------------------------------

TEST(GraphJsonDocumentTest, Errors) {
  struct Case {
    std::string key;
    Json value;  // discarded: erase the key
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"format", Json(Json::value_t::discarded), "missing 'format'"},
      {"format", "pebble-schedule", "\"pebble-schedule\""},
      {"format", 1, "'format'"},
      {"version", Json(Json::value_t::discarded), "missing 'version'"},
      {"version", 2, "unsupported 'version' 2"},
      {"version", 0, "unsupported 'version' 0"},
      {"version", "1", "unsupported 'version' \"1\""},
      {"version", 1.5, "unsupported 'version' 1.5"},
      {"name", 7, "'name' must be a string"},
      {"nodes", Json(Json::value_t::discarded), "missing 'nodes'"},
      {"nodes", Json::object(), "'nodes' must be an array"},
      {"outputs", Json(Json::value_t::discarded), "missing 'outputs'"},
      {"outputs", "b", "'outputs' must be an array"},
      {"outputs", {"b", 2}, "'outputs'[1]"},
      {"output", {"b"}, "unknown key 'output' (did you mean 'outputs'?)"},
      {"edges", Json::array(), "unknown key 'edges'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.key, " = ", c.value.dump()));
    Json doc = BaseDoc();
    if (c.value.is_discarded()) {
      doc.erase(c.key);
    } else {
      doc[c.key] = c.value;
    }
    ExpectInvalid(GraphFromJson(doc), {c.expect});
  }
}

TEST(GraphJsonDocumentTest, NotAnObject) {
  ExpectInvalid(GraphFromJson(Json::array({1})), {"JSON object"});
  ExpectInvalid(ParseGraphJson("42"), {"JSON object"});
  ExpectInvalid(ParseGraphJson("null"), {"JSON object"});
}

// --- Cross-node errors (GraphBuilder::Build) through JSON. -----------------

TEST(GraphJsonGraphErrorsTest, Cycle) {
  Json doc = BaseDoc();
  doc["nodes"][0]["inputs"] = {"b"};
  ExpectInvalid(GraphFromJson(doc), {"cycle", "a", "b"});
}

TEST(GraphJsonGraphErrorsTest, UnknownInput) {
  Json doc = BaseDoc();
  doc["nodes"][1]["inputs"] = {"a", "ghost"};
  ExpectInvalid(GraphFromJson(doc), {"node 'b'", "unknown input 'ghost'"});
}

TEST(GraphJsonGraphErrorsTest, DuplicateIdNamesBothPositions) {
  Json doc = BaseDoc();
  doc["nodes"].push_back({{"id", "a"}, {"bytes", 1}});
  ExpectInvalid(GraphFromJson(doc),
                {"node 'a'", "duplicate id", "nodes[0]", "nodes[2]"});
}

TEST(GraphJsonGraphErrorsTest, UnknownOutput) {
  Json doc = BaseDoc();
  doc["outputs"] = {"b", "ghost"};
  ExpectInvalid(GraphFromJson(doc), {"unknown output 'ghost'"});
}

TEST(GraphJsonGraphErrorsTest, NoOutputs) {
  Json doc = BaseDoc();
  doc["outputs"] = Json::array();
  ExpectInvalid(GraphFromJson(doc), {"no outputs"});
}

TEST(GraphJsonGraphErrorsTest, PersistentWithInputs) {
  Json doc = BaseDoc();
  doc["nodes"][1]["persistent"] = true;
  ExpectInvalid(GraphFromJson(doc), {"node 'b'", "persistent"});
}

// --- JSON text errors. -------------------------------------------------------

TEST(GraphJsonTextTest, SyntaxErrorHasLineColumnAndPath) {
  const std::string text =
      "{\"format\": \"pebble-graph\", \"version\": 1,\n"
      " \"nodes\": [{\"id\": \"a\", \"bytes\": 1},\n"
      "           {\"id\": \"b\", \"bytes\": 1, \"inputs\": [\"a\",]}],\n"
      " \"outputs\": [\"b\"]}\n";
  absl::StatusOr<Graph> g = ParseGraphJson(text);
  ExpectInvalid(g, {"line 3, column 51", "invalid JSON",
                    "at nodes[1].inputs[1], node 'b'"});
  EXPECT_THAT(std::string(g.status().message()), StartsWith("line 3"));
}

TEST(GraphJsonTextTest, HugeNumberIsRejectedNamingTheNode) {
  // JSON has no spelling for infinity or NaN. nlohmann refuses to parse a
  // number that overflows a double (1e999 would be inf): the text does not
  // parse, and the message says where.
  const std::string text =
      R"({"format": "pebble-graph", "version": 1, "nodes": [)"
      R"({"id": "a", "bytes": 1},)"
      R"({"id": "b", "bytes": 1, "cost": 1e999, "inputs": ["a"]}],)"
      R"("outputs": ["b"]})";
  ExpectInvalid(ParseGraphJson(text), {"line 1, column", "number overflow",
                                       "1e999", "at nodes[1].cost, node 'b'"});
  // Also when the id comes after the field: the path still names the node.
  const std::string id_last =
      R"({"format": "pebble-graph", "version": 1, "nodes": [)"
      R"({"cost": -1e999, "id": "b", "bytes": 1}], "outputs": ["b"]})";
  ExpectInvalid(ParseGraphJson(id_last), {"-1e999", "at nodes[0].cost"});
}

TEST(GraphJsonTextTest, TinyNumberUnderflowsToZero) {
  // The other end of the range parses: 1e-999 reads as 0.
  Json doc = BaseDoc();
  std::string text = doc.dump();
  text.replace(text.find("\"bytes\":4"), 9, "\"bytes\":4,\"cost\":1e-999");
  absl::StatusOr<Graph> g = ParseGraphJson(text);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->cost(1), 0.0);
}

TEST(GraphJsonTextTest, DuplicateKeyIsRejected) {
  // nlohmann would silently keep the last "bytes".
  const std::string text =
      R"({"format": "pebble-graph", "version": 1, "nodes": [)"
      R"({"id": "a", "bytes": 1, "bytes": -1}], "outputs": ["a"]})";
  ExpectInvalid(ParseGraphJson(text),
                {"duplicate key 'bytes'", "at nodes[0].bytes, node 'a'"});
}

TEST(GraphJsonTextTest, DeepNestingIsRejected) {
  std::string attrs;
  for (int i = 0; i < 100000; ++i) attrs += "[";
  for (int i = 0; i < 100000; ++i) attrs += "]";
  const std::string text =
      absl::StrCat(R"({"format": "pebble-graph", "version": 1, "nodes": [)",
                   R"({"id": "a", "bytes": 1, "attrs": {"deep": )", attrs,
                   R"(}}], "outputs": ["a"]})");
  ExpectInvalid(ParseGraphJson(text), {"nested deeper than", "node 'a'"});
}

TEST(GraphJsonTextTest, EmptyAndTrailingText) {
  ExpectInvalid(ParseGraphJson(""), {"line 1", "invalid JSON"});
  ExpectInvalid(ParseGraphJson("   \n  "), {"line 2", "invalid JSON"});
  const std::string trailing = absl::StrCat(BaseDoc().dump(), " {}");
  ExpectInvalid(ParseGraphJson(trailing), {"invalid JSON"});
}

TEST(GraphJsonTextTest, InvalidUtf8IsRejected) {
  std::string text = BaseDoc().dump();
  text.replace(text.find("\"b\""), 3, "\"b\xff\"");
  ExpectInvalid(ParseGraphJson(text), {"invalid JSON"});
}

// --- Files. ----------------------------------------------------------------

TEST(GraphFileTest, MissingFile) {
  const std::string path = TempPath("does_not_exist.json");
  absl::StatusOr<Graph> g = ReadGraphFile(path);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(g.status().message()), StartsWith(path));
}

TEST(GraphFileTest, Directory) {
  absl::StatusOr<Graph> g = ReadGraphFile(::testing::TempDir());
  ExpectInvalid(g, {"directory"});
}

TEST(GraphFileTest, ErrorsStartWithThePath) {
  const std::string path = TempPath("broken.json");
  WriteFile(path, "{\n  \"format\": \"pebble-graph\",\n  \"version\": 1,\n}");
  absl::StatusOr<Graph> g = ReadGraphFile(path);
  ExpectInvalid(g, {absl::StrCat(path, ":4:1: invalid JSON")});

  WriteFile(path, BaseDoc().dump().replace(0, 1, "{\"_c\": 0, \"extra\": 1,"));
  g = ReadGraphFile(path);
  ExpectInvalid(g, {absl::StrCat(path, ": graph: unknown key 'extra'")});
}

TEST(GraphFileTest, WriteThenRead) {
  const Graph g = *GraphFromJson(BaseDoc());
  const std::string path = TempPath("written.json");
  ASSERT_TRUE(WriteGraphFile(g, path).ok());
  absl::StatusOr<Graph> h = ReadGraphFile(path);
  ASSERT_TRUE(h.ok()) << h.status();
  ExpectSameGraph(g, *h);
}

TEST(GraphFileTest, WriteToBadPathFails) {
  const Graph g = *GraphFromJson(BaseDoc());
  absl::Status s = WriteGraphFile(g, TempPath("no/such/dir/x.json"));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("no/such/dir/x.json"));
}

// --- Example files. ----------------------------------------------------------

std::vector<std::string> JsonFilesIn(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(ExamplesTest, GoodExamplesParseAndRoundTrip) {
  const std::vector<std::string> files = JsonFilesIn(SourcePath("examples"));
  EXPECT_GE(files.size(), 3u);
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    absl::StatusOr<Graph> g = ReadGraphFile(path);
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<Graph> again = ParseGraphJson(GraphToJsonText(*g));
    ASSERT_TRUE(again.ok()) << again.status();
    ExpectSameGraph(*g, *again);
  }
}

TEST(ExamplesTest, TanhChain4) {
  absl::StatusOr<Graph> g =
      ReadGraphFile(SourcePath("examples/tanh-chain-4.json"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->name(), "tanh-chain-4");
  EXPECT_EQ(g->num_nodes(), 5);
  EXPECT_THAT(ToVector(g->outputs()), ElementsAre(g->Find("a4")));
  EXPECT_EQ(g->persistent_bytes(), 1000000);
}

TEST(ExamplesTest, Diamond) {
  absl::StatusOr<Graph> g = ReadGraphFile(SourcePath("examples/diamond.json"));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->num_nodes(), 4);
  EXPECT_THAT(ToVector(g->readers(g->Find("a"))),
              ElementsAre(g->Find("b"), g->Find("c")));
  EXPECT_THAT(ToVector(g->inputs(g->Find("d"))),
              ElementsAre(g->Find("b"), g->Find("c")));
}

TEST(ExamplesTest, Views) {
  absl::StatusOr<Graph> g = ReadGraphFile(SourcePath("examples/views.json"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->alias_of(g->Find("v")), g->Find("b"));
  EXPECT_EQ(g->storage(g->Find("v")), g->Find("b"));
  EXPECT_EQ(g->num_aliases(), 1);
}

TEST(ExamplesTest, MlpTrain) {
  absl::StatusOr<Graph> g =
      ReadGraphFile(SourcePath("examples/mlp-train.json"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->role(g->Find("fc.weight")), Role::kParameter);
  EXPECT_EQ(g->role(g->Find("input")), Role::kInput);
  EXPECT_EQ(g->role(g->Find("grad:fc.weight")), Role::kBackward);
  EXPECT_EQ(g->shape(g->Find("loss")), Shape{});
  EXPECT_EQ(g->attrs(g->Find("loss"))["reduction"], "mean");
  // bytes agree with shape and dtype throughout this example.
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    EXPECT_EQ(g->bytes(v), NumElements(*g->shape(v)) * DTypeSize(*g->dtype(v)))
        << g->id(v);
  }
}

TEST(ExamplesTest, BadExamplesFailWithTheirError) {
  // Every file in examples/bad/ must be listed here with what its message
  // says; each is one error of SPEC section 1 (or of the format's typing).
  const std::vector<std::pair<std::string, std::vector<std::string>>> expected =
      {
          {"alias-not-input.json", {"node 'v'", "'alias_of' 'a' is not one of its inputs"}},
          {"cycle.json", {"cycle", "c -> b -> c"}},
          {"duplicate-id.json",
           {"node 'a'", "duplicate id", "nodes[0]", "nodes[2]"}},
          {"fractional-bytes.json", {"node 'b'", "'bytes'", "1.5"}},
          {"invalid-json.json",
           {"invalid-json.json:6:", "invalid JSON", "nodes[1].inputs[1]",
            "node 'b'"}},
          {"missing-bytes.json", {"node 'b'", "missing 'bytes'"}},
          {"negative-bytes.json", {"node 'b'", "'bytes'", "-8"}},
          {"negative-cost.json", {"node 'b'", "'cost'", "-1"}},
          {"nonfinite-cost.json",
           {"number overflow", "1e999", "nodes[1].cost", "node 'b'"}},
          {"unknown-input.json", {"node 'b'", "unknown input 'missing'"}},
          {"unknown-key.json",
           {"node 'b'", "unknown key 'cots'", "did you mean 'cost'"}},
          {"unknown-output.json", {"unknown output 'c'"}},
          {"wrong-format.json", {"'format'", "\"pebble-schedule\""}},
          {"wrong-version.json", {"unsupported 'version' 2"}},
      };
  std::vector<std::string> listed;
  for (const auto& [name, parts] : expected) {
    SCOPED_TRACE(name);
    const std::string path = SourcePath(absl::StrCat("examples/bad/", name));
    listed.push_back(path);
    absl::StatusOr<Graph> g = ReadGraphFile(path);
    ExpectInvalid(g, parts);
    if (!g.ok()) {
      EXPECT_THAT(std::string(g.status().message()), StartsWith(path));
    }
  }
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(JsonFilesIn(SourcePath("examples/bad")), listed);
}

// --- Writing and round trips. ------------------------------------------------

TEST(GraphToJsonTest, KeysInOrderAndDefaultsOmitted) {
  absl::StatusOr<Graph> g = ParseGraphJson(kSpecExample);
  ASSERT_TRUE(g.ok()) << g.status();
  const nlohmann::ordered_json doc = GraphToJson(*g);
  std::vector<std::string> keys;
  for (auto it = doc.begin(); it != doc.end(); ++it) keys.push_back(it.key());
  EXPECT_THAT(keys,
              ElementsAre("format", "version", "name", "nodes", "outputs"));
  EXPECT_EQ(doc["format"], "pebble-graph");
  EXPECT_EQ(doc["version"], 1);
  // cost 1.0 and workspace 0 are defaults: left out.
  EXPECT_EQ(doc["nodes"][2].dump(),
            R"({"id":"a2","op":"tanh","bytes":1000000,"inputs":["a1"]})");
  // Persistent input: role "input" is its default.
  EXPECT_EQ(doc["nodes"][0].dump(),
            R"({"id":"x","op":"input","bytes":1000000,"persistent":true})");
  EXPECT_EQ(doc["outputs"], Json::array({"a2"}));
}

TEST(GraphToJsonTest, RoleWrittenOnlyWhenNotDefault) {
  GraphBuilder b;
  NodeSpec w;
  w.id = "w";
  w.bytes = 4;
  w.persistent = true;
  w.role = Role::kParameter;
  b.AddNode(w);
  NodeSpec x;
  x.id = "x";
  x.bytes = 4;
  x.persistent = true;
  x.role = Role::kInput;
  b.AddNode(x);
  NodeSpec f;
  f.id = "f";
  f.bytes = 4;
  f.inputs = {"w", "x"};
  f.role = Role::kForward;
  b.AddNode(f);
  NodeSpec g;
  g.id = "g";
  g.bytes = 4;
  g.inputs = {"f"};
  g.role = Role::kBackward;
  b.AddNode(g);
  b.AddOutput("g");
  absl::StatusOr<Graph> graph = b.Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  const nlohmann::ordered_json doc = GraphToJson(*graph);
  EXPECT_EQ(doc["nodes"][0]["role"], "parameter");
  EXPECT_FALSE(doc["nodes"][1].contains("role"));
  EXPECT_FALSE(doc["nodes"][2].contains("role"));
  EXPECT_EQ(doc["nodes"][3]["role"], "backward");
}

TEST(GraphToJsonTest, TextLayoutFollowsTheSpec) {
  absl::StatusOr<Graph> g = ParseGraphJson(kSpecExample);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string text = GraphToJsonText(*g);
  EXPECT_EQ(text,
            "{\n"
            "  \"format\": \"pebble-graph\",\n"
            "  \"version\": 1,\n"
            "  \"name\": \"tanh-chain-4\",\n"
            "  \"nodes\": [\n"
            "    {\"id\": \"x\", \"op\": \"input\", \"bytes\": 1000000, "
            "\"persistent\": true},\n"
            "    {\"id\": \"a1\", \"op\": \"tanh\", \"bytes\": 1000000, "
            "\"inputs\": [\"x\"]},\n"
            "    {\"id\": \"a2\", \"op\": \"tanh\", \"bytes\": 1000000, "
            "\"inputs\": [\"a1\"]}\n"
            "  ],\n"
            "  \"outputs\": [\"a2\"]\n"
            "}\n");
}

TEST(GraphToJsonTest, ManyOutputsOnePerLine) {
  Json doc = BaseDoc();
  Json outputs = Json::array();
  for (int i = 0; i < 30; ++i) {
    const std::string id = absl::StrCat("grad:layer", i, ".weight");
    doc["nodes"].push_back({{"id", id}, {"bytes", 4}, {"inputs", {"b"}}});
    outputs.push_back(id);
  }
  doc["outputs"] = outputs;
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string text = GraphToJsonText(*g);
  EXPECT_THAT(text,
              HasSubstr("  \"outputs\": [\n    \"grad:layer0.weight\",\n"));
  absl::StatusOr<Graph> again = ParseGraphJson(text);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameGraph(*g, *again);
}

TEST(GraphToJsonTest, CostsReadBackBitIdentical) {
  const std::vector<double> costs = {0.1,
                                     1.0 / 3.0,
                                     2.0 / 3.0,
                                     1e-310,
                                     4.9406564584124654e-324,
                                     1.7976931348623157e308,
                                     -0.0,
                                     0.0,
                                     123456789.123456789,
                                     1.0 + 1e-15,
                                     0.30000000000000004};
  Json doc = BaseDoc();
  for (size_t i = 0; i < costs.size(); ++i) {
    doc["nodes"].push_back({{"id", absl::StrCat("c", i)},
                            {"bytes", 1},
                            {"cost", costs[i]},
                            {"inputs", {"b"}}});
  }
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<Graph> again = ParseGraphJson(GraphToJsonText(*g));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameGraph(*g, *again);
  for (size_t i = 0; i < costs.size(); ++i) {
    EXPECT_EQ(
        std::bit_cast<uint64_t>(again->cost(g->Find(absl::StrCat("c", i)))),
        std::bit_cast<uint64_t>(costs[i]));
  }
}

TEST(GraphToJsonTest, HandGraphRoundTrip) {
  absl::StatusOr<Graph> g =
      ReadGraphFile(SourcePath("examples/mlp-train.json"));
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<Graph> via_doc = GraphFromJson(GraphToJson(*g));
  ASSERT_TRUE(via_doc.ok()) << via_doc.status();
  ExpectSameGraph(*g, *via_doc);
  absl::StatusOr<Graph> via_dump = ParseGraphJson(GraphToJson(*g).dump(2));
  ASSERT_TRUE(via_dump.ok()) << via_dump.status();
  ExpectSameGraph(*g, *via_dump);
}

TEST(GraphToJsonTest, EmptyGraphRoundTrip) {
  absl::StatusOr<Graph> g = GraphBuilder("nothing").Build();
  ASSERT_TRUE(g.ok());
  absl::StatusOr<Graph> again = ParseGraphJson(GraphToJsonText(*g));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameGraph(*g, *again);
}

TEST(GraphToJsonTest, RandomGraphsRoundTrip) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    const Graph g = RandomGraph(seed, 1 + static_cast<int>(seed % 40));
    absl::StatusOr<Graph> via_doc = GraphFromJson(GraphToJson(g));
    ASSERT_TRUE(via_doc.ok()) << via_doc.status();
    ExpectSameGraph(g, *via_doc);
    absl::StatusOr<Graph> via_text = ParseGraphJson(GraphToJsonText(g));
    ASSERT_TRUE(via_text.ok()) << via_text.status();
    ExpectSameGraph(g, *via_text);
    // Writing is deterministic and a fixed point.
    EXPECT_EQ(GraphToJsonText(*via_text), GraphToJsonText(g));
  }
}

// --- DOT.
// ----------------------------------------------------------------------

// The line of `dot` that declares node `quoted_id`.
std::string NodeLine(const std::string& dot, const std::string& quoted_id) {
  std::istringstream in(dot);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(absl::StrCat("  ", quoted_id, " [label="), 0) == 0) {
      return line;
    }
  }
  return "";
}

std::string FillColor(const std::string& line) {
  const size_t p = line.find("fillcolor=\"");
  if (p == std::string::npos) return "";
  const size_t end = line.find('"', p + 11);
  return line.substr(p, end - p + 1);
}

TEST(GraphToDotTest, ShapesColoursLabelsAndEscaping) {
  const Json doc = Json::parse(R"({
    "format": "pebble-graph", "version": 1, "name": "dot \"test\"",
    "nodes": [
      {"id": "input", "bytes": 1000000, "persistent": true,
       "shape": [250, 1000], "dtype": "fp32"},
      {"id": "conv1.weight", "bytes": 1536, "persistent": true,
       "role": "parameter"},
      {"id": "bn1.running_mean", "bytes": 512, "persistent": true,
       "role": "buffer"},
      {"id": "y#1", "op": "conv2d", "bytes": 3145728,
       "inputs": ["input", "conv1.weight", "bn1.running_mean"]},
      {"id": "q\"uote", "op": "mul", "bytes": 8, "inputs": ["y#1", "y#1"]},
      {"id": "grad:conv1.weight", "op": "conv2d_weight_grad", "bytes": 1536,
       "role": "backward", "inputs": ["q\"uote", "input"]},
      {"id": "back\\slash", "bytes": 1, "inputs": ["input"]},
      {"id": "n\u0000ul\u001b", "bytes": 1, "inputs": ["input"]}
    ],
    "outputs": ["q\"uote", "grad:conv1.weight"]})");
  absl::StatusOr<Graph> g = GraphFromJson(doc);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string dot = GraphToDot(*g);

  EXPECT_THAT(dot, StartsWith("// pebble graph"));
  EXPECT_THAT(dot, HasSubstr("Legend"));
  EXPECT_THAT(dot, HasSubstr("digraph \"dot \\\"test\\\"\" {"));

  const std::string input = NodeLine(dot, "\"input\"");
  const std::string weight = NodeLine(dot, "\"conv1.weight\"");
  const std::string buffer = NodeLine(dot, "\"bn1.running_mean\"");
  const std::string conv = NodeLine(dot, "\"y#1\"");
  const std::string quote = NodeLine(dot, "\"q\\\"uote\"");
  const std::string grad = NodeLine(dot, "\"grad:conv1.weight\"");
  const std::string slash = NodeLine(dot, "\"back\\\\slash\"");
  for (const std::string* line :
       {&input, &weight, &buffer, &conv, &quote, &grad, &slash}) {
    ASSERT_FALSE(line->empty()) << dot;
  }
  // Persistent nodes are boxes; parameters, data inputs and buffers differ.
  for (const std::string* line : {&input, &weight, &buffer}) {
    EXPECT_THAT(*line, HasSubstr("shape=box"));
  }
  EXPECT_NE(FillColor(input), FillColor(weight));
  EXPECT_NE(FillColor(input), FillColor(buffer));
  EXPECT_NE(FillColor(weight), FillColor(buffer));
  // Computed nodes are ellipses; forward and backward differ.
  EXPECT_THAT(conv, HasSubstr("shape=ellipse"));
  EXPECT_EQ(FillColor(conv), FillColor(quote));
  EXPECT_NE(FillColor(conv), FillColor(grad));
  // Outputs have a double border, other nodes do not.
  EXPECT_THAT(quote, HasSubstr("peripheries=2"));
  EXPECT_THAT(grad, HasSubstr("peripheries=2"));
  EXPECT_THAT(conv, Not(HasSubstr("peripheries")));
  // Labels: id, op, human bytes, shape and dtype.
  EXPECT_THAT(input,
              HasSubstr("label=\"input\\ngeneric\\n977 KiB\\n(250,1000) fp32\""));
  EXPECT_THAT(weight, HasSubstr("1.50 KiB"));
  EXPECT_THAT(buffer, HasSubstr("512 B"));
  EXPECT_THAT(conv, HasSubstr("y#1\\nconv2d\\n3.00 MiB\""));
  EXPECT_THAT(slash, HasSubstr("label=\"back\\\\slash\\n"));
  // Control characters are written as their codes: a NUL would cut the string.
  EXPECT_EQ(dot.find('\0'), std::string::npos);
  EXPECT_EQ(dot.find('\x1b'), std::string::npos);
  EXPECT_FALSE(NodeLine(dot, "\"n\\\\x00ul\\\\x1b\"").empty()) << dot;
  // Edges: quoted ids; a doubly-read input is one edge labelled x2.
  EXPECT_THAT(dot, HasSubstr("  \"y#1\" -> \"q\\\"uote\" [label=\"x2\"];\n"));
  EXPECT_THAT(dot, HasSubstr("  \"input\" -> \"grad:conv1.weight\";\n"));
  int edges = 0;
  for (size_t p = dot.find(" -> "); p != std::string::npos;
       p = dot.find(" -> ", p + 1)) {
    ++edges;
  }
  int unique_edges = 0;
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    unique_edges += static_cast<int>(g->unique_inputs(v).size());
  }
  // The legend mentions "u -> v" once.
  EXPECT_EQ(edges, unique_edges + 1);
  EXPECT_THAT(dot, ::testing::EndsWith("}\n"));
}

TEST(GraphToDotTest, Deterministic) {
  const Graph g = RandomGraph(7, 30);
  EXPECT_EQ(GraphToDot(g), GraphToDot(g));
}

// --- Robustness: no input crashes or throws. -------------------------------

TEST(GraphJsonFuzzTest, MutatedTextNeverCrashes) {
  std::mt19937_64 rng(12345);
  const std::string alphabet = "{}[]\":,.-+0123456789eEtrufalsn \\x";
  int failures = 0;
  for (int round = 0; round < 3000; ++round) {
    const Graph g = RandomGraph(round % 50 + 1, 6);
    std::string text = GraphToJsonText(g);
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          text.erase(pos, 1 + rng() % 8);
          break;
        default:
          text.insert(pos, 1, alphabet[rng() % alphabet.size()]);
      }
      if (text.empty()) text = "{";
    }
    absl::StatusOr<Graph> parsed = ParseGraphJson(text);
    if (!parsed.ok()) {
      ++failures;
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(failures, 1000);
}

TEST(GraphJsonFuzzTest, WrongValuesNeverCrash) {
  std::mt19937_64 rng(777);
  const std::vector<std::string> keys = {
      "id",         "op",    "bytes", "cost",  "inputs", "workspace",
      "persistent", "shape", "dtype", "attrs", "role",   "bogus"};
  const std::vector<Json> values = {nullptr,
                                    true,
                                    false,
                                    0,
                                    -1,
                                    1,
                                    1.5,
                                    -0.0,
                                    1e300,
                                    "",
                                    "x",
                                    "fp16",
                                    "parameter",
                                    Json::array(),
                                    Json::object(),
                                    Json::array({1, -1}),
                                    Json::array({"x", "x"}),
                                    Json::array({nullptr}),
                                    std::numeric_limits<uint64_t>::max(),
                                    std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<double>::quiet_NaN(),
                                    std::numeric_limits<double>::infinity()};
  const std::vector<std::string> top_keys = {"format", "version", "name",
                                             "nodes", "outputs"};
  for (int round = 0; round < 3000; ++round) {
    const Graph g = RandomGraph(round % 50 + 1, 5);
    Json doc = GraphToJson(g);
    if (rng() % 5 == 0) {
      doc[top_keys[rng() % top_keys.size()]] = values[rng() % values.size()];
    } else {
      Json& node = doc["nodes"][rng() % doc["nodes"].size()];
      const std::string& key = keys[rng() % keys.size()];
      if (rng() % 6 == 0) {
        node.erase(key);
      } else {
        node[key] = values[rng() % values.size()];
      }
    }
    absl::StatusOr<Graph> parsed = GraphFromJson(doc);
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace pebble
