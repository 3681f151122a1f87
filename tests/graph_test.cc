// GraphBuilder validation and the derived structure of a Graph: inputs and
// unique inputs, readers, the topological order and the needed set.
#include "graph/graph.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pebble {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

NodeSpec Node(std::string id, int64_t bytes,
              std::vector<std::string> inputs = {}) {
  NodeSpec s;
  s.id = std::move(id);
  s.bytes = bytes;
  s.inputs = std::move(inputs);
  return s;
}

NodeSpec Persistent(std::string id, int64_t bytes) {
  NodeSpec s = Node(std::move(id), bytes);
  s.persistent = true;
  return s;
}

std::vector<NodeId> ToVector(absl::Span<const NodeId> span) {
  return std::vector<NodeId>(span.begin(), span.end());
}

// Expects Build() to fail with InvalidArgument and a one-line message
// containing every string of `parts`.
void ExpectInvalid(const GraphBuilder& builder,
                   const std::vector<std::string>& parts) {
  absl::StatusOr<Graph> g = builder.Build();
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(g.status().message());
  for (const std::string& part : parts) {
    EXPECT_THAT(message, HasSubstr(part));
  }
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// x (persistent) -> a -> b -> c, outputs {c}.
GraphBuilder Chain() {
  GraphBuilder b("chain");
  b.AddNode(Persistent("x", 10));
  b.AddNode(Node("a", 1, {"x"}));
  b.AddNode(Node("b", 2, {"a"}));
  b.AddNode(Node("c", 3, {"b"}));
  b.AddOutput("c");
  return b;
}

TEST(GraphTest, ChainStructure) {
  absl::StatusOr<Graph> g = Chain().Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->name(), "chain");
  EXPECT_EQ(g->num_nodes(), 4);
  EXPECT_EQ(g->Find("b"), 2);
  EXPECT_EQ(g->Find("nope"), kNoNode);
  EXPECT_EQ(g->id(3), "c");
  EXPECT_EQ(g->op(1), "generic");
  EXPECT_EQ(g->bytes(2), 2);
  EXPECT_EQ(g->cost(2), 1.0);
  EXPECT_EQ(g->workspace(2), 0);
  EXPECT_TRUE(g->persistent(0));
  EXPECT_FALSE(g->persistent(1));
  EXPECT_EQ(g->role(0), Role::kInput);
  EXPECT_EQ(g->role(1), Role::kForward);
  EXPECT_EQ(g->persistent_bytes(), 10);
  EXPECT_THAT(ToVector(g->inputs(1)), ElementsAre(0));
  EXPECT_THAT(ToVector(g->readers(0)), ElementsAre(1));
  EXPECT_THAT(ToVector(g->readers(3)), IsEmpty());
  EXPECT_THAT(ToVector(g->outputs()), ElementsAre(3));
  EXPECT_TRUE(g->is_output(3));
  EXPECT_FALSE(g->is_output(2));
  EXPECT_THAT(ToVector(g->topological_order()), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(g->needed(), std::vector<bool>({true, true, true, true}));
  EXPECT_FALSE(g->ToString().empty());
}

TEST(GraphTest, EmptyGraphBuilds) {
  absl::StatusOr<Graph> g = GraphBuilder("empty").Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->num_nodes(), 0);
  EXPECT_THAT(ToVector(g->topological_order()), IsEmpty());
  EXPECT_EQ(g->persistent_bytes(), 0);
}

TEST(GraphTest, RepeatedInputCountsOnceForResidency) {
  GraphBuilder b;
  b.AddNode(Node("a", 4));
  b.AddNode(Node("sq", 4, {"a", "a"}));  // a * a
  b.AddOutput("sq");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(ToVector(g->inputs(1)), ElementsAre(0, 0));
  EXPECT_THAT(ToVector(g->unique_inputs(1)), ElementsAre(0));
  EXPECT_THAT(ToVector(g->readers(0)), ElementsAre(1));
}

TEST(GraphTest, UniqueInputsKeepFirstOccurrenceOrder) {
  GraphBuilder b;
  b.AddNode(Node("a", 1));
  b.AddNode(Node("b", 1));
  b.AddNode(Node("c", 1));
  b.AddNode(Node("d", 1, {"c", "a", "c", "b", "a"}));
  b.AddOutput("d");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(ToVector(g->inputs(3)), ElementsAre(2, 0, 2, 1, 0));
  EXPECT_THAT(ToVector(g->unique_inputs(3)), ElementsAre(2, 0, 1));
}

TEST(GraphTest, ReadersAreAscending) {
  // r3 and r1 both read s; r2 reads it twice.
  GraphBuilder b;
  b.AddNode(Node("s", 1));
  b.AddNode(Node("r3", 1, {"s"}));
  b.AddNode(Node("r1", 1, {"s"}));
  b.AddNode(Node("r2", 1, {"s", "s"}));
  b.AddOutput("r1");
  b.AddOutput("r2");
  b.AddOutput("r3");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(ToVector(g->readers(0)), ElementsAre(1, 2, 3));
}

TEST(GraphTest, NodesMayComeBeforeTheirInputs) {
  // Added as c, b, a with a -> b -> c: ids 0, 1, 2 = c, b, a.
  GraphBuilder b;
  b.AddNode(Node("c", 1, {"b"}));
  b.AddNode(Node("b", 1, {"a"}));
  b.AddNode(Node("a", 1));
  b.AddOutput("c");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(ToVector(g->topological_order()), ElementsAre(2, 1, 0));
}

TEST(GraphTest, TopologicalOrderTakesSmallestReadyIdFirst) {
  // Sources p (0) and q (1); r (2) reads q, s (3) reads p. Smallest ready
  // id first: p; ready {q, s} -> q; ready {r, s} -> r; then s.
  GraphBuilder b;
  b.AddNode(Node("p", 1));
  b.AddNode(Node("q", 1));
  b.AddNode(Node("r", 1, {"q"}));
  b.AddNode(Node("s", 1, {"p"}));
  b.AddOutput("r");
  b.AddOutput("s");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(ToVector(g->topological_order()), ElementsAre(0, 1, 2, 3));

  // Same graph, s added before r: ids r = 3, s = 2.
  GraphBuilder b2;
  b2.AddNode(Node("p", 1));
  b2.AddNode(Node("q", 1));
  b2.AddNode(Node("s", 1, {"p"}));
  b2.AddNode(Node("r", 1, {"q"}));
  b2.AddOutput("r");
  absl::StatusOr<Graph> g2 = b2.Build();
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_THAT(ToVector(g2->topological_order()), ElementsAre(0, 1, 2, 3));
}

TEST(GraphTest, NeededIsOutputsAndAncestors) {
  // x -> a -> out, x -> dead -> dead2; w unused; only out is an output.
  GraphBuilder b;
  b.AddNode(Persistent("x", 1));
  b.AddNode(Persistent("w", 1));
  b.AddNode(Node("a", 1, {"x"}));
  b.AddNode(Node("dead", 1, {"x"}));
  b.AddNode(Node("dead2", 1, {"dead"}));
  b.AddNode(Node("out", 1, {"a"}));
  b.AddOutput("out");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->needed(),
            std::vector<bool>({true, false, true, false, false, true}));
}

TEST(GraphTest, PersistentOutputIsNeeded) {
  GraphBuilder b;
  b.AddNode(Persistent("w", 8));
  b.AddNode(Node("y", 1, {"w"}));
  b.AddOutput("w");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->needed(), std::vector<bool>({true, false}));
}

TEST(GraphTest, RepeatedOutputCountsOnce) {
  GraphBuilder b = Chain();
  b.AddOutput("b");
  b.AddOutput("c");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(ToVector(g->outputs()), ElementsAre(3, 2));
}

TEST(GraphTest, RolesShapesAttrsAndEmptyOp) {
  GraphBuilder b;
  NodeSpec w = Persistent("conv1.weight", 4 * 27);
  w.role = Role::kParameter;
  w.shape = Shape{1, 3, 3, 3};
  w.dtype = DType::kFloat32;
  b.AddNode(w);
  NodeSpec y = Node("y", 4, {"conv1.weight"});
  y.op = "";
  y.attrs = nlohmann::json{{"stride", 1}};
  y.role = Role::kBackward;
  b.AddNode(y);
  b.AddOutput("y");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->role(0), Role::kParameter);
  EXPECT_EQ(g->role(1), Role::kBackward);
  EXPECT_EQ(g->op(1), "generic");
  ASSERT_TRUE(g->shape(0).has_value());
  EXPECT_EQ(ShapeToString(*g->shape(0)), "(1,3,3,3)");
  EXPECT_EQ(NumElements(*g->shape(0)), 27);
  EXPECT_EQ(g->dtype(0), DType::kFloat32);
  EXPECT_FALSE(g->shape(1).has_value());
  EXPECT_EQ(g->attrs(1)["stride"], 1);
  EXPECT_TRUE(g->attrs(0).is_null());
}

TEST(GraphTest, SpecOfRebuildsTheSameGraph) {
  GraphBuilder b = Chain();
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  GraphBuilder again(g->name());
  for (NodeId v = 0; v < g->num_nodes(); ++v) again.AddNode(SpecOf(*g, v));
  for (NodeId v : g->outputs()) again.AddOutput(g->id(v));
  absl::StatusOr<Graph> h = again.Build();
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->num_nodes(), g->num_nodes());
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    EXPECT_EQ(h->id(v), g->id(v));
    EXPECT_EQ(h->bytes(v), g->bytes(v));
    EXPECT_EQ(h->role(v), g->role(v));
    EXPECT_EQ(ToVector(h->inputs(v)), ToVector(g->inputs(v)));
  }
}

// --- Validation errors: every one names the node. --------------------------

TEST(GraphValidationTest, EmptyId) {
  GraphBuilder b;
  b.AddNode(Node("a", 1));
  b.AddNode(Node("", 1));
  b.AddOutput("a");
  ExpectInvalid(b, {"#1", "empty id"});
}

TEST(GraphValidationTest, DuplicateId) {
  GraphBuilder b = Chain();
  b.AddNode(Node("b", 5));
  ExpectInvalid(b, {"'b'", "duplicate"});
}

TEST(GraphValidationTest, MissingBytes) {
  GraphBuilder b = Chain();
  NodeSpec s;
  s.id = "nobytes";
  b.AddNode(s);
  ExpectInvalid(b, {"'nobytes'", "bytes"});
}

TEST(GraphValidationTest, NegativeBytes) {
  GraphBuilder b = Chain();
  b.AddNode(Node("neg", -1, {"c"}));
  ExpectInvalid(b, {"'neg'", "bytes"});
}

TEST(GraphValidationTest, NegativeCost) {
  GraphBuilder b = Chain();
  NodeSpec s = Node("d", 1, {"c"});
  s.cost = -0.5;
  b.AddNode(s);
  ExpectInvalid(b, {"'d'", "cost"});
}

TEST(GraphValidationTest, NonFiniteCost) {
  for (double cost : {std::numeric_limits<double>::infinity(),
                      -std::numeric_limits<double>::infinity(),
                      std::numeric_limits<double>::quiet_NaN()}) {
    GraphBuilder b = Chain();
    NodeSpec s = Node("d", 1, {"c"});
    s.cost = cost;
    b.AddNode(s);
    ExpectInvalid(b, {"'d'", "cost"});
  }
}

TEST(GraphValidationTest, ZeroCostAndZeroBytesAreFine) {
  GraphBuilder b = Chain();
  NodeSpec s = Node("d", 0, {"c"});
  s.cost = 0;
  b.AddNode(s);
  EXPECT_TRUE(b.Build().ok());
}

TEST(GraphValidationTest, NegativeWorkspace) {
  GraphBuilder b = Chain();
  NodeSpec s = Node("d", 1, {"c"});
  s.workspace = -4;
  b.AddNode(s);
  ExpectInvalid(b, {"'d'", "workspace"});
}

TEST(GraphValidationTest, PersistentNodeWithInputs) {
  GraphBuilder b = Chain();
  NodeSpec s = Persistent("w", 1);
  s.inputs = {"x"};
  b.AddNode(s);
  ExpectInvalid(b, {"'w'", "persistent"});
}

TEST(GraphValidationTest, AttrsNotAnObject) {
  GraphBuilder b = Chain();
  NodeSpec s = Node("d", 1, {"c"});
  s.attrs = nlohmann::json::array({1, 2});
  b.AddNode(s);
  ExpectInvalid(b, {"'d'", "attrs"});
}

TEST(GraphValidationTest, NegativeShapeDimension) {
  GraphBuilder b = Chain();
  NodeSpec s = Node("d", 1, {"c"});
  s.shape = Shape{2, -1};
  b.AddNode(s);
  ExpectInvalid(b, {"'d'", "shape"});
}

TEST(GraphValidationTest, UnknownInput) {
  GraphBuilder b = Chain();
  b.AddNode(Node("d", 1, {"c", "ghost"}));
  ExpectInvalid(b, {"'d'", "unknown input", "'ghost'"});
}

TEST(GraphValidationTest, UnknownOutput) {
  GraphBuilder b = Chain();
  b.AddOutput("ghost");
  ExpectInvalid(b, {"unknown output", "'ghost'"});
}

TEST(GraphValidationTest, NoOutputs) {
  GraphBuilder b;
  b.AddNode(Node("a", 1));
  ExpectInvalid(b, {"no outputs"});
}

TEST(GraphValidationTest, CycleIsListed) {
  // a -> b -> c -> a, plus an unrelated source s and a node t behind the
  // cycle (t reads c): the message lists the cycle.
  GraphBuilder b;
  b.AddNode(Node("s", 1));
  b.AddNode(Node("t", 1, {"c"}));
  b.AddNode(Node("a", 1, {"c", "s"}));
  b.AddNode(Node("b", 1, {"a"}));
  b.AddNode(Node("c", 1, {"b"}));
  b.AddOutput("t");
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(g.status().message());
  EXPECT_THAT(message, HasSubstr("cycle"));
  // Any rotation of a -> b -> c -> a.
  EXPECT_TRUE(message.find("a -> b -> c -> a") != std::string::npos ||
              message.find("b -> c -> a -> b") != std::string::npos ||
              message.find("c -> a -> b -> c") != std::string::npos)
      << message;
}

TEST(GraphValidationTest, SelfLoop) {
  GraphBuilder b;
  b.AddNode(Node("a", 1, {"a"}));
  b.AddOutput("a");
  ExpectInvalid(b, {"cycle", "a -> a"});
}

TEST(DTypeTest, NamesAndSizes) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                  DType::kInt64, DType::kUInt8}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(*ParseDType("float32"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("half"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("int64"), DType::kInt64);
  EXPECT_EQ(*ParseDType("uint8"), DType::kUInt8);
  EXPECT_FALSE(ParseDType("fp64").ok());
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8);
}

TEST(RoleTest, NamesRoundTrip) {
  for (Role r : {Role::kInput, Role::kParameter, Role::kBuffer, Role::kForward,
                 Role::kBackward}) {
    absl::StatusOr<Role> parsed = ParseRole(RoleName(r));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, r);
  }
  EXPECT_FALSE(ParseRole("weight").ok());
}

TEST(ShapeTest, ScalarAndString) {
  EXPECT_EQ(NumElements(Shape{}), 1);
  EXPECT_EQ(NumElements(Shape{2, 0, 3}), 0);
  EXPECT_EQ(ShapeToString(Shape{2, 1, 26, 150, 320}), "(2,1,26,150,320)");
  EXPECT_EQ(ShapeToString(Shape{}), "()");
}

}  // namespace
}  // namespace pebble
