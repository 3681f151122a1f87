// Boost.Graph adapter: topological order and articulation points, checked on
// hand graphs and against brute force on seeded random graphs.
#include "graph/boost_adapter.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pebble {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct Edge {
  std::string from;
  std::string to;
};

// Nodes named by `ids` (each 1 byte), edges from -> to, outputs: the sinks.
Graph Build(const std::vector<std::string>& ids,
            const std::vector<Edge>& edges) {
  std::vector<NodeSpec> specs(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    specs[i].id = ids[i];
    specs[i].bytes = 1;
  }
  std::vector<bool> has_reader(ids.size(), false);
  for (const Edge& e : edges) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == e.to) specs[i].inputs.push_back(e.from);
      if (ids[i] == e.from) has_reader[i] = true;
    }
  }
  GraphBuilder b;
  for (const NodeSpec& s : specs) b.AddNode(s);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!has_reader[i]) b.AddOutput(ids[i]);
  }
  absl::StatusOr<Graph> g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

// A random DAG whose node i reads up to 3 random earlier nodes (repeats
// allowed); node ids are added in a shuffled order.
Graph RandomDag(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<NodeSpec> specs(n);
  for (int i = 0; i < n; ++i) {
    specs[i].id = absl::StrCat("v", i);
    specs[i].bytes = 1;
    const int k = i == 0 ? 0 : static_cast<int>(rng() % 4);
    for (int j = 0; j < k; ++j) {
      specs[i].inputs.push_back(absl::StrCat("v", rng() % i));
    }
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  GraphBuilder b;
  for (int i : order) b.AddNode(specs[i]);
  b.AddOutput(absl::StrCat("v", n - 1));
  absl::StatusOr<Graph> g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

void ExpectTopologicalOrder(const Graph& g, const std::vector<NodeId>& order) {
  ASSERT_EQ(static_cast<int>(order.size()), g.num_nodes());
  std::vector<int> position(g.num_nodes(), -1);
  for (size_t i = 0; i < order.size(); ++i) {
    ASSERT_GE(order[i], 0);
    ASSERT_LT(order[i], g.num_nodes());
    ASSERT_EQ(position[order[i]], -1) << "node listed twice";
    position[order[i]] = static_cast<int>(i);
  }
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    for (NodeId u : g.inputs(v)) {
      EXPECT_LT(position[u], position[v]) << g.id(u) << " -> " << g.id(v);
    }
  }
}

// Connected components of the undirected view of the nodes in `keep`.
int CountComponents(const Graph& g, const std::vector<bool>& keep) {
  const int n = g.num_nodes();
  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (NodeId v = 0; v < n; ++v) {
    if (!keep[v]) continue;
    for (NodeId u : g.unique_inputs(v)) {
      if (keep[u]) parent[find(u)] = find(v);
    }
  }
  int components = 0;
  for (NodeId v = 0; v < n; ++v) {
    if (keep[v] && find(v) == v) ++components;
  }
  return components;
}

// Nodes of `mask` whose removal increases the number of components.
std::vector<NodeId> BruteForceArticulationPoints(const Graph& g,
                                                 std::vector<bool> mask) {
  if (mask.empty()) mask.assign(g.num_nodes(), true);
  const int base = CountComponents(g, mask);
  std::vector<NodeId> points;
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (!mask[v]) continue;
    std::vector<bool> without = mask;
    without[v] = false;
    if (CountComponents(g, without) > base) points.push_back(v);
  }
  return points;
}

TEST(BoostTopologicalOrderTest, HandGraphs) {
  const Graph path =
      Build({"a", "b", "c", "d"}, {{"a", "b"}, {"b", "c"}, {"c", "d"}});
  EXPECT_THAT(BoostTopologicalOrder(path), ElementsAre(0, 1, 2, 3));

  const Graph diamond = Build({"a", "b", "c", "d"},
                              {{"a", "b"}, {"a", "c"}, {"b", "d"}, {"c", "d"}});
  ExpectTopologicalOrder(diamond, BoostTopologicalOrder(diamond));

  // Added against the edges: d, c, b, a.
  const Graph reversed =
      Build({"d", "c", "b", "a"}, {{"a", "b"}, {"b", "c"}, {"c", "d"}});
  EXPECT_THAT(BoostTopologicalOrder(reversed), ElementsAre(3, 2, 1, 0));

  EXPECT_THAT(BoostTopologicalOrder(Graph()), IsEmpty());
}

TEST(BoostTopologicalOrderTest, RandomDags) {
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    const Graph g = RandomDag(seed, 1 + static_cast<int>(seed % 60));
    ExpectTopologicalOrder(g, BoostTopologicalOrder(g));
  }
}

TEST(BoostTopologicalOrderTest, LongChainDoesNotOverflowTheStack) {
  const int n = 200000;
  GraphBuilder b;
  for (int i = 0; i < n; ++i) {
    NodeSpec s;
    s.id = absl::StrCat("n", i);
    s.bytes = 1;
    if (i > 0) s.inputs = {absl::StrCat("n", i - 1)};
    b.AddNode(s);
  }
  b.AddOutput(absl::StrCat("n", n - 1));
  absl::StatusOr<Graph> chain = b.Build();
  ASSERT_TRUE(chain.ok());
  const std::vector<NodeId> order = BoostTopologicalOrder(*chain);
  ASSERT_EQ(static_cast<int>(order.size()), n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(order[i], i);
  // Every interior node of a path is an articulation point.
  EXPECT_EQ(static_cast<int>(ArticulationPoints(*chain).size()), n - 2);
}

TEST(ArticulationPointsTest, Path) {
  const Graph g =
      Build({"a", "b", "c", "d"}, {{"a", "b"}, {"b", "c"}, {"c", "d"}});
  EXPECT_THAT(ArticulationPoints(g), ElementsAre(1, 2));
}

TEST(ArticulationPointsTest, DiamondHasNone) {
  const Graph g = Build({"a", "b", "c", "d"},
                        {{"a", "b"}, {"a", "c"}, {"b", "d"}, {"c", "d"}});
  EXPECT_THAT(ArticulationPoints(g), IsEmpty());
}

TEST(ArticulationPointsTest, TwoDiamondsJoinedAtANode) {
  // a -> {b, c} -> m -> {e, f} -> z: only m separates.
  const Graph g = Build({"a", "b", "c", "m", "e", "f", "z"}, {{"a", "b"},
                                                              {"a", "c"},
                                                              {"b", "m"},
                                                              {"c", "m"},
                                                              {"m", "e"},
                                                              {"m", "f"},
                                                              {"e", "z"},
                                                              {"f", "z"}});
  EXPECT_THAT(ArticulationPoints(g), ElementsAre(3));
}

TEST(ArticulationPointsTest, SkipConnectionRemovesBorders) {
  // a -> b -> c -> d with a residual a -> c: only c separates (d hangs off
  // it); b lies on the cycle a-b-c.
  const Graph g = Build({"a", "b", "c", "d"},
                        {{"a", "b"}, {"b", "c"}, {"a", "c"}, {"c", "d"}});
  EXPECT_THAT(ArticulationPoints(g), ElementsAre(2));
}

TEST(ArticulationPointsTest, MaskRestrictsToTheSubgraph) {
  const Graph path =
      Build({"a", "b", "c", "d"}, {{"a", "b"}, {"b", "c"}, {"c", "d"}});
  // Without d: a - b - c.
  EXPECT_THAT(ArticulationPoints(path, {true, true, true, false}),
              ElementsAre(1));
  // Without b: a alone, c - d: nothing separates further.
  EXPECT_THAT(ArticulationPoints(path, {true, false, true, true}), IsEmpty());
  // Empty selection.
  EXPECT_THAT(ArticulationPoints(path, {false, false, false, false}),
              IsEmpty());

  // The diamond without c is the path a - b - d.
  const Graph diamond = Build({"a", "b", "c", "d"},
                              {{"a", "b"}, {"a", "c"}, {"b", "d"}, {"c", "d"}});
  EXPECT_THAT(ArticulationPoints(diamond, {true, true, false, true}),
              ElementsAre(1));
}

TEST(ArticulationPointsTest, RepeatedInputsAndSmallGraphs) {
  // b reads a twice: still one undirected edge, so no articulation point.
  GraphBuilder b;
  NodeSpec a;
  a.id = "a";
  a.bytes = 1;
  b.AddNode(a);
  NodeSpec sq;
  sq.id = "sq";
  sq.bytes = 1;
  sq.inputs = {"a", "a"};
  b.AddNode(sq);
  b.AddOutput("sq");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok());
  EXPECT_THAT(ArticulationPoints(*g), IsEmpty());
  EXPECT_THAT(ArticulationPoints(Graph()), IsEmpty());
}

TEST(ArticulationPointsTest, DisconnectedComponentsAreEachSearched) {
  // Two separate paths a-b-c and x-y-z.
  const Graph g = Build({"a", "b", "c", "x", "y", "z"},
                        {{"a", "b"}, {"b", "c"}, {"x", "y"}, {"y", "z"}});
  EXPECT_THAT(ArticulationPoints(g), ElementsAre(1, 4));
}

TEST(ArticulationPointsTest, MatchesBruteForceOnRandomGraphs) {
  std::mt19937_64 rng(2024);
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    const Graph g = RandomDag(seed, 1 + static_cast<int>(seed % 25));
    EXPECT_EQ(ArticulationPoints(g), BruteForceArticulationPoints(g, {}));
    std::vector<bool> mask(g.num_nodes());
    for (NodeId v = 0; v < g.num_nodes(); ++v) mask[v] = rng() % 4 != 0;
    EXPECT_EQ(ArticulationPoints(g, mask),
              BruteForceArticulationPoints(g, mask));
  }
}

}  // namespace
}  // namespace pebble
