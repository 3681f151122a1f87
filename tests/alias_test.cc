// Aliases (views, SPEC section 1 "Aliases") through every layer: the IR and
// its JSON, the simulator (checked against a brute-force reference), the
// autodiff and the CPU executor.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "graph/net_builder.h"
#include "gtest/gtest.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/executor.h"
#include "scheduler/budget.h"
#include "scheduler/checkmate.h"
#include "scheduler/memory_layout.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"
#include "test_util.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;
using testing::MakeGraph;
using testing::MakeSchedule;
using testing::Node;
using testing::Persistent;

constexpr Action kC = Action::kCompute;
constexpr Action kF = Action::kFree;
constexpr Action kO = Action::kOffload;
constexpr Action kP = Action::kPrefetch;

// A computed node that is a view of `base` (one of `inputs`, first if none
// are given).
NodeSpec View(std::string id, int64_t bytes, std::string base,
              std::vector<std::string> inputs = {}, double cost = 1.0) {
  if (inputs.empty()) inputs.push_back(base);
  NodeSpec s = Node(std::move(id), bytes, std::move(inputs), cost);
  s.alias_of = std::move(base);
  return s;
}

absl::StatusOr<Graph> Build(std::vector<NodeSpec> nodes, std::vector<std::string> outputs) {
  GraphBuilder b("t");
  for (NodeSpec& s : nodes) b.AddNode(std::move(s));
  for (std::string& o : outputs) b.AddOutput(std::move(o));
  return b.Build();
}

// ---------------------------------------------------------------- IR, JSON

TEST(AliasGraphTest, AliasOfAndStorageFollowTheChain) {
  const Graph g = MakeGraph({Persistent("x", 8), Node("b", 100, {"x"}), View("v1", 100, "b"),
                             View("v2", 40, "v1", {"x", "v1"}), Node("c", 5, {"v2"})},
                            {"c"});
  const NodeId b = g.Find("b"), v1 = g.Find("v1"), v2 = g.Find("v2"), c = g.Find("c");
  EXPECT_TRUE(g.has_aliases());
  EXPECT_EQ(g.num_aliases(), 2);
  EXPECT_EQ(g.alias_of(b), kNoNode);
  EXPECT_EQ(g.alias_of(v1), b);
  EXPECT_EQ(g.alias_of(v2), v1);
  EXPECT_EQ(g.storage(v2), b);
  EXPECT_EQ(g.storage(v1), b);
  EXPECT_EQ(g.storage(c), c);
  EXPECT_THAT(g.ToString(), HasSubstr("2 aliases"));
  const Graph plain = MakeGraph({Node("a", 1)}, {"a"});
  EXPECT_FALSE(plain.has_aliases());
  EXPECT_EQ(plain.storage(0), 0);
}

TEST(AliasGraphTest, BuilderRefusesBadAliasesNamingTheNode) {
  auto not_input = Build({Node("b", 1), Node("d", 1), View("v", 1, "b", {"d"})}, {"v"});
  ASSERT_FALSE(not_input.ok());
  EXPECT_THAT(not_input.status().message(), HasSubstr("node 'v'"));
  EXPECT_THAT(not_input.status().message(), HasSubstr("not one of its inputs"));

  auto itself = Build({Node("b", 1), View("v", 1, "v", {"b"})}, {"v"});
  ASSERT_FALSE(itself.ok());
  EXPECT_THAT(itself.status().message(), HasSubstr("node 'v': 'alias_of' names the node itself"));

  NodeSpec p = Persistent("p", 4);
  p.alias_of = "q";
  auto persistent = Build({Persistent("q", 4), p, Node("c", 1, {"p"})}, {"c"});
  ASSERT_FALSE(persistent.ok());
  EXPECT_THAT(persistent.status().message(), HasSubstr("node 'p': a persistent node cannot"));

  NodeSpec w = View("v", 1, "b");
  w.workspace = 8;
  auto workspace = Build({Node("b", 1), w}, {"v"});
  ASSERT_FALSE(workspace.ok());
  EXPECT_THAT(workspace.status().message(), HasSubstr("node 'v': an alias"));

  // An alias's bytes are its logical size: anything non-negative.
  EXPECT_TRUE(Build({Node("b", 10), View("v", 1000, "b"), View("z", 0, "b")}, {"v", "z"}).ok());
}

TEST(AliasGraphTest, JsonRoundTripKeepsAliases) {
  const Graph g = MakeGraph({Persistent("x", 8), Node("b", 100, {"x"}), View("v", 100, "b"),
                             View("w", 7, "x"), Node("c", 5, {"v", "w", "v"})},
                            {"c", "v"});
  const std::string text = GraphToJsonText(g);
  EXPECT_THAT(text, HasSubstr(R"("inputs": ["b"], "alias_of": "b")"));
  auto back = ParseGraphJson(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(GraphToJsonText(*back), text);
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    EXPECT_EQ(back->alias_of(v), g.alias_of(v)) << g.id(v);
    EXPECT_EQ(back->storage(v), g.storage(v)) << g.id(v);
  }
  // SpecOf gives the alias back to GraphBuilder.
  EXPECT_EQ(SpecOf(g, g.Find("v")).alias_of, std::optional<std::string>("b"));
  EXPECT_FALSE(SpecOf(g, g.Find("c")).alias_of.has_value());
  EXPECT_THAT(GraphToDot(g), HasSubstr("style=dashed"));

  auto bad = ParseGraphJson(R"({"format": "pebble-graph", "version": 1, "nodes": [
      {"id": "b", "bytes": 1}, {"id": "v", "bytes": 1, "inputs": ["b"], "alias_of": 3}],
      "outputs": ["v"]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("node 'v': 'alias_of' must be"));
  auto unknown = ParseGraphJson(R"({"format": "pebble-graph", "version": 1, "nodes": [
      {"id": "b", "bytes": 1}, {"id": "v", "bytes": 1, "inputs": ["b"], "alias_of": "q"}],
      "outputs": ["v"]})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("node 'v': 'alias_of' 'q'"));
}

TEST(AliasGraphTest, NetBuilderKeepsAliasesThroughRenameAndFromGraph) {
  NetBuilder nb("n");
  const Value x = nb.Input("x", {2, 3});
  const Value r = nb.Apply("relu", {x});
  const Value f = nb.Apply("reshape", {r}, {{"shape", {6}}}, "flat");
  nb.SetAliasOf(f, r);
  ASSERT_TRUE(nb.Rename(r, "renamed").ok());
  EXPECT_EQ(nb.alias_of(f).index, r.index);
  auto g = nb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->alias_of(g->Find("flat")), g->Find("renamed"));
  NetBuilder again = NetBuilder::FromGraph(*g);
  auto g2 = again.Build();
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(GraphToJsonText(*g2), GraphToJsonText(*g));

  NetBuilder bad("bad");
  const Value a = bad.Input("a", {2});
  const Value b = bad.Apply("relu", {a});
  const Value c = bad.Apply("relu", {a});
  bad.SetAliasOf(c, b);  // b is not an input of c
  EXPECT_THAT(bad.status().message(), HasSubstr("node 'relu_2' cannot be an alias of 'relu_1'"));
}

}  // namespace
}  // namespace pebble
