// The model zoo: the registry, the model-name parser, the pebbling graphs'
// shapes and the networks' parameter counts and names against PyTorch.
#include "graph/models/models.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/graph_json.h"
#include "gtest/gtest.h"

namespace pebble {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Graph MustBuild(absl::string_view spec) {
  absl::StatusOr<Graph> g = BuildModel(spec);
  EXPECT_TRUE(g.ok()) << spec << ": " << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

int64_t CountRole(const Graph& g, Role role) {
  int64_t n = 0;
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (g.role(v) == role) n += NumElements(g.shape(v).value_or(Shape{0}));
  }
  return n;
}

int64_t NumParameters(const Graph& g) { return CountRole(g, Role::kParameter); }

int64_t NumEdges(const Graph& g) {
  int64_t n = 0;
  for (NodeId v = 0; v < g.num_nodes(); ++v) n += g.unique_inputs(v).size();
  return n;
}

std::vector<std::string> OutputIds(const Graph& g) {
  std::vector<std::string> ids;
  for (NodeId v : g.outputs()) ids.push_back(g.id(v));
  return ids;
}

bool Has(const Graph& g, absl::string_view id) { return g.Find(id) != kNoNode; }

// ---------------------------------------------------------------- registry

TEST(ModelRegistryTest, NamesAreUniqueAndDefaultsAreGiven) {
  std::set<std::string> names;
  for (const ModelInfo& info : ListModels()) {
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    EXPECT_FALSE(info.description.empty()) << info.name;
    std::set<std::string> params;
    for (const ModelParam& p : info.params) {
      EXPECT_TRUE(params.insert(p.name).second) << info.name << " " << p.name;
      EXPECT_FALSE(p.default_value.empty()) << info.name << " " << p.name;
      EXPECT_FALSE(p.help.empty()) << info.name << " " << p.name;
    }
  }
  for (const char* name :
       {"tanh-chain", "conv3d", "mnist-cnn", "vgg16", "resnet18", "resnet50",
        "unet3d", "transformer", "path", "pyramid", "tree", "linear",
        "random"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
}

// Every model builds with its defaults; training graphs end in the loss and
// the parameter gradients, pebbling graphs have no persistent node.
TEST(ModelRegistryTest, EveryModelBuildsWithDefaults) {
  for (const ModelInfo& info : ListModels()) {
    SCOPED_TRACE(info.name);
    absl::StatusOr<Graph> g = BuildModel(info.name);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->name(), info.name);
    if (info.training_graph) {
      ASSERT_NE(g->Find("loss"), kNoNode);
      EXPECT_EQ(g->id(g->outputs()[0]), "loss");
      EXPECT_GT(NumParameters(*g), 0);
    } else {
      EXPECT_EQ(g->persistent_bytes(), 0);
      for (NodeId v = 0; v < g->num_nodes(); ++v) {
        EXPECT_EQ(g->op(v), "generic");
        EXPECT_EQ(g->workspace(v), 0);
      }
    }
  }
}

// ------------------------------------------------------------------ parser

TEST(ModelSpecTest, ParsesAndPrintsCanonically) {
  absl::StatusOr<ModelSpec> s = ParseModelSpec(" unet3d : variant=small, batch=2 ");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "unet3d");
  EXPECT_EQ(s->params.at("batch"), "2");
  EXPECT_EQ(s->params.at("variant"), "small");
  EXPECT_EQ(s->ToString(), "unet3d:batch=2,variant=small");

  s = ParseModelSpec("resnet18");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->params.empty());
  EXPECT_EQ(s->ToString(), "resnet18");
}

TEST(ModelSpecTest, CanonicalFormRoundTrips) {
  for (const char* text : {"path", "conv3d:n=3", "unet3d:width=32,batch=1,variant=small"}) {
    absl::StatusOr<ModelSpec> s = ParseModelSpec(text);
    ASSERT_TRUE(s.ok()) << s.status();
    absl::StatusOr<ModelSpec> again = ParseModelSpec(s->ToString());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->name, s->name);
    EXPECT_EQ(again->params, s->params);
    EXPECT_EQ(again->ToString(), s->ToString());
  }
}

TEST(ModelSpecTest, RejectsMalformedSpecs) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty model name"},
           {"   ", "empty model name"},
           {":n=3", "no model name"},
           {"alexnet", "unknown model 'alexnet'"},
           {"conv3d:", "malformed parameter ''"},
           {"conv3d:n", "malformed parameter 'n'"},
           {"conv3d:n=", "malformed parameter 'n='"},
           {"conv3d:=3", "malformed parameter '=3'"},
           {"conv3d:n=3=4", "malformed parameter 'n=3=4'"},
           {"conv3d:n=3,,batch=1", "malformed parameter ''"},
           {"conv3d:n=3,n=4", "parameter 'n' given twice"},
       }) {
    absl::StatusOr<ModelSpec> s = ParseModelSpec(c.text);
    ASSERT_FALSE(s.ok()) << "'" << c.text << "'";
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.message)) << c.text;
  }
}

TEST(ModelSpecTest, RejectsBadParameters) {
  struct Case {
    const char* text;
    std::vector<const char*> message_parts;
  };
  for (const Case& c : std::vector<Case>{
           {"conv3d:m=3", {"model 'conv3d' has no parameter 'm'", "n, batch"}},
           {"path:n=abc", {"'path'", "'n'", "integer", "'abc'"}},
           {"path:n=1.5", {"'n'", "integer", "'1.5'"}},
           {"path:n=0", {"'n'", "0", "out of range"}},
           {"tree:h=-1", {"'h'", "-1", "out of range"}},
           {"conv3d:batch=99999999999999999999", {"'batch'", "integer"}},
           {"unet3d:variant=huge", {"'variant'", "'huge'", "large, small"}},
           {"unet3d:dtype=i64", {"'dtype'", "'i64'", "fp32"}},
           {"random:sizes=big", {"'sizes'", "unit, random"}},
       }) {
    absl::StatusOr<Graph> g = BuildModel(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    for (const char* part : c.message_parts) {
      EXPECT_THAT(std::string(g.status().message()), HasSubstr(part)) << c.text;
    }
  }
  // A hand-made spec naming an unknown model.
  absl::StatusOr<Graph> g = BuildModel(ModelSpec{"nope", {}});
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("unknown model 'nope'"));
}

TEST(ModelSpecTest, ShapeErrorsComeBackAsStatus) {
  // Too small to pool four times.
  absl::StatusOr<Graph> g = BuildModel("unet3d:depth=8,height=32,width=32");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("unet3d"));
  // A 16x16 image shrinks to nothing in VGG's fifth max-pool: the builder's
  // shape error, prefixed with the model.
  g = BuildModel("vgg16:batch=1,image=16");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("vgg16"));
  // torchvision's ResNet runs on a 1x1 image: every stage keeps 1x1.
  g = BuildModel("resnet18:batch=1,image=1");
  EXPECT_TRUE(g.ok()) << g.status();
}

// ---------------------------------------------------------- pebbling graphs

TEST(PebblingGraphTest, Path) {
  Graph g = MustBuild("path:n=5");
  EXPECT_EQ(g.num_nodes(), 5);
  EXPECT_EQ(NumEdges(g), 4);
  EXPECT_THAT(OutputIds(g), ElementsAre("p4"));
  EXPECT_EQ(g.inputs(g.Find("p3"))[0], g.Find("p2"));
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    EXPECT_EQ(g.bytes(v), 1);
    EXPECT_EQ(g.cost(v), 1.0);
    EXPECT_FALSE(g.persistent(v));
  }
  EXPECT_EQ(MustBuild("path:n=1").num_nodes(), 1);
}

TEST(PebblingGraphTest, Pyramid) {
  for (int h : {0, 1, 3, 10}) {
    Graph g = MustBuild(absl::StrCat("pyramid:h=", h));
    EXPECT_EQ(g.num_nodes(), (h + 1) * (h + 2) / 2) << h;
    EXPECT_EQ(NumEdges(g), h * (h + 1)) << h;
    EXPECT_THAT(OutputIds(g), ElementsAre(absl::StrCat("L", h, "_0")));
  }
  Graph g = MustBuild("pyramid:h=2");
  const NodeId apex = g.Find("L2_0");
  ASSERT_NE(apex, kNoNode);
  EXPECT_THAT(g.inputs(apex), ElementsAre(g.Find("L1_0"), g.Find("L1_1")));
  EXPECT_THAT(g.inputs(g.Find("L1_1")),
              ElementsAre(g.Find("L0_1"), g.Find("L0_2")));
}

TEST(PebblingGraphTest, Tree) {
  for (int h : {0, 1, 4, 10}) {
    Graph g = MustBuild(absl::StrCat("tree:h=", h));
    EXPECT_EQ(g.num_nodes(), (1 << (h + 1)) - 1) << h;
    EXPECT_EQ(NumEdges(g), (1 << (h + 1)) - 2) << h;
    EXPECT_THAT(OutputIds(g), ElementsAre(absl::StrCat("L", h, "_0")));
  }
  Graph g = MustBuild("tree:h=2");
  EXPECT_THAT(g.inputs(g.Find("L1_1")),
              ElementsAre(g.Find("L0_2"), g.Find("L0_3")));
}

TEST(PebblingGraphTest, LinearIsCheckmatesGenLinearGraph) {
  for (int n : {1, 2, 8}) {
    Graph g = MustBuild(absl::StrCat("linear:n=", n));
    EXPECT_EQ(g.num_nodes(), 2 * n + 1);
    EXPECT_EQ(NumEdges(g), 3 * n);
    EXPECT_THAT(OutputIds(g), ElementsAre(absl::StrCat("v", 2 * n)));
  }
  // n = 2: v0..v4; path edges plus v0 -> v4 and v1 -> v3.
  Graph g = MustBuild("linear:n=2");
  EXPECT_THAT(g.inputs(g.Find("v4")), ElementsAre(g.Find("v3"), g.Find("v0")));
  EXPECT_THAT(g.inputs(g.Find("v3")), ElementsAre(g.Find("v2"), g.Find("v1")));
  EXPECT_THAT(g.inputs(g.Find("v2")), ElementsAre(g.Find("v1")));
}

TEST(PebblingGraphTest, RandomIsSeededAndValid) {
  const Graph a = MustBuild("random:n=200,seed=7,sizes=random");
  const Graph b = MustBuild("random:seed=7,n=200,sizes=random");
  const Graph c = MustBuild("random:n=200,seed=8,sizes=random");
  EXPECT_EQ(GraphToJson(a), GraphToJson(b));
  EXPECT_NE(GraphToJson(a), GraphToJson(c));
  EXPECT_EQ(a.num_nodes(), 200);
  bool some_big = false;
  for (NodeId v = 0; v < a.num_nodes(); ++v) {
    EXPECT_EQ(a.id(v), absl::StrCat("r", v));
    EXPECT_GE(a.bytes(v), 1);
    EXPECT_LE(a.bytes(v), 100);
    EXPECT_GE(a.cost(v), 1);
    EXPECT_LE(a.cost(v), 10);
    some_big = some_big || a.bytes(v) > 1;
    if (v > 0) {
      EXPECT_GE(a.unique_inputs(v).size(), 1u);
      EXPECT_LE(a.unique_inputs(v).size(), 3u);
      for (NodeId u : a.inputs(v)) EXPECT_LT(u, v);
    }
    // Outputs are exactly the sinks.
    EXPECT_EQ(a.is_output(v), a.readers(v).empty()) << a.id(v);
  }
  EXPECT_TRUE(some_big);
  const Graph unit = MustBuild("random:n=50");
  for (NodeId v = 0; v < unit.num_nodes(); ++v) {
    EXPECT_EQ(unit.bytes(v), 1);
    EXPECT_EQ(unit.cost(v), 1);
  }
}

// ----------------------------------------------------------------- networks

// The training graph's outputs: the loss, then grad:p for every parameter.
void ExpectTrainingOutputs(const Graph& g) {
  std::vector<std::string> expected = {"loss"};
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (g.role(v) == Role::kParameter) {
      expected.push_back(absl::StrCat("grad:", g.id(v)));
      EXPECT_TRUE(g.persistent(v)) << g.id(v);
    }
    if (g.role(v) == Role::kInput || g.role(v) == Role::kBuffer) {
      EXPECT_TRUE(g.persistent(v)) << g.id(v);
    }
  }
  EXPECT_EQ(OutputIds(g), expected);
}

TEST(NetworkTest, TanhChain) {
  Graph g = MustBuild("tanh-chain:length=4,size=10");
  ExpectTrainingOutputs(g);
  EXPECT_EQ(NumParameters(g), 10);
  EXPECT_EQ(g.role(g.Find("x")), Role::kParameter);
  EXPECT_EQ(g.bytes(g.Find("x")), 40);
  for (const char* id : {"a1", "a2", "a3", "a4"}) {
    ASSERT_TRUE(Has(g, id)) << id;
    EXPECT_EQ(g.op(g.Find(id)), "tanh");
  }
  EXPECT_FALSE(Has(g, "a5"));
  EXPECT_EQ(g.op(g.Find("loss")), "sum");
  EXPECT_THAT(OutputIds(g), ElementsAre("loss", "grad:x"));
}

TEST(NetworkTest, Conv3d) {
  Graph g = MustBuild("conv3d:n=8,batch=2");
  ExpectTrainingOutputs(g);
  // conv1 1->4: 108 + 4; conv2 4->8: 864 + 8; conv3 8->1: 216 + 1.
  EXPECT_EQ(NumParameters(g), 112 + 872 + 217);
  EXPECT_EQ(g.shape(g.Find("input")), (Shape{2, 1, 8, 8, 8}));
  EXPECT_EQ(g.shape(g.Find("target")), (Shape{2, 1, 8, 8, 8}));
  EXPECT_EQ(g.shape(g.Find("conv2.weight")), (Shape{8, 4, 3, 3, 3}));
  for (const char* id : {"conv1.weight", "conv1.bias", "conv3.bias",
                         "grad:conv1.weight", "loss"}) {
    EXPECT_TRUE(Has(g, id)) << id;
  }
  EXPECT_EQ(g.op(g.Find("loss")), "mse_loss");
}

TEST(NetworkTest, MnistCnn) {
  const int64_t batch = 2;
  Graph g = MustBuild(absl::StrCat("mnist-cnn:batch=", batch));
  ExpectTrainingOutputs(g);
  EXPECT_EQ(NumParameters(g), 1'111'946);
  EXPECT_EQ(g.shape(g.Find("target")), (Shape{batch}));
  EXPECT_EQ(g.dtype(g.Find("target")), DType::kInt64);
  EXPECT_EQ(g.shape(g.Find("fc1.weight")), (Shape{1024, 1024}));
  EXPECT_EQ(g.shape(g.Find("conv2.weight")), (Shape{64, 32, 5, 5}));
  for (const char* id : {"conv1.weight", "grad:conv1.weight", "fc2.bias",
                         "input", "target", "loss"}) {
    EXPECT_TRUE(Has(g, id)) << id;
  }
  // Activations per image: the input and every layer's output (the conv
  // and linear nodes are named after their module); the ReLUs are not
  // counted (in place) nor the flatten (a view). docs/models.md.
  int64_t activations = 0;
  for (const char* id :
       {"input", "conv1", "pool1", "conv2", "pool2", "fc1", "fc2"}) {
    const NodeId v = g.Find(id);
    ASSERT_NE(v, kNoNode) << id;
    EXPECT_EQ(g.role(v), std::string(id) == "input" ? Role::kInput
                                                    : Role::kForward);
    activations += NumElements(*g.shape(v));
  }
  EXPECT_EQ(activations, 29'978 * batch);
  EXPECT_EQ(g.shape(g.Find("conv1")), (Shape{batch, 32, 24, 24}));
  EXPECT_EQ(g.shape(g.Find("fc2")), (Shape{batch, 10}));
}

TEST(NetworkTest, Vgg16) {
  Graph g = MustBuild("vgg16:batch=1");
  ExpectTrainingOutputs(g);
  EXPECT_EQ(NumParameters(g), 138'357'544);
  for (int i : {0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28}) {
    EXPECT_TRUE(Has(g, absl::StrCat("features.", i, ".weight"))) << i;
    EXPECT_TRUE(Has(g, absl::StrCat("grad:features.", i, ".bias"))) << i;
  }
  EXPECT_FALSE(Has(g, "features.1.weight"));
  EXPECT_EQ(g.shape(g.Find("classifier.0.weight")), (Shape{4096, 25088}));
  EXPECT_EQ(g.shape(g.Find("classifier.6.weight")), (Shape{1000, 4096}));
}

TEST(NetworkTest, ResNet18) {
  Graph g = MustBuild("resnet18:batch=1,image=32");
  ExpectTrainingOutputs(g);
  EXPECT_EQ(NumParameters(g), 11'689'512);
  for (const char* id :
       {"conv1.weight", "bn1.weight", "bn1.running_mean",
        "layer1.0.conv1.weight", "layer1.0.bn1.bias",
        "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_var",
        "layer4.1.bn2.running_var", "layer4.1.bn2.num_batches_tracked",
        "fc.weight", "fc.bias", "grad:fc.weight", "grad:layer3.1.conv2.weight",
        "input", "target", "loss"}) {
    EXPECT_TRUE(Has(g, id)) << id;
  }
  EXPECT_FALSE(Has(g, "layer1.0.downsample.0.weight"));
  EXPECT_FALSE(Has(g, "conv1.bias"));
  EXPECT_FALSE(Has(g, "grad:bn1.running_mean"));
  EXPECT_EQ(g.role(g.Find("layer4.1.bn2.running_var")), Role::kBuffer);
  EXPECT_EQ(g.shape(g.Find("conv1.weight")), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(g.shape(g.Find("fc.weight")), (Shape{1000, 512}));
}

TEST(NetworkTest, ResNet50) {
  Graph g = MustBuild("resnet50:batch=1,image=32");
  ExpectTrainingOutputs(g);
  EXPECT_EQ(NumParameters(g), 25'557'032);
  for (const char* id :
       {"layer1.0.downsample.0.weight", "layer1.2.conv3.weight",
        "layer3.5.bn3.running_mean", "layer4.2.bn3.weight"}) {
    EXPECT_TRUE(Has(g, id)) << id;
  }
  EXPECT_FALSE(Has(g, "layer1.1.downsample.0.weight"));
  EXPECT_EQ(g.shape(g.Find("layer2.0.conv2.weight")), (Shape{128, 128, 3, 3}));
  EXPECT_EQ(g.shape(g.Find("fc.weight")), (Shape{1000, 2048}));
}

TEST(NetworkTest, UNet3dLarge) {
  Graph g = MustBuild("unet3d:batch=1,depth=16,height=20,width=18");
  ExpectTrainingOutputs(g);
  EXPECT_EQ(NumParameters(g), 40'158'853);
  for (const char* id :
       {"inc.double_conv.0.weight", "inc.double_conv.1.running_var",
        "down1.maxpool_conv.1.double_conv.0.weight",
        "down4.maxpool_conv.1.double_conv.4.bias",
        "up1.conv.double_conv.0.weight", "up4.conv.double_conv.3.bias",
        "outc.conv.weight", "outc.conv.bias", "grad:outc.conv.weight"}) {
    EXPECT_TRUE(Has(g, id)) << id;
  }
  EXPECT_EQ(g.shape(g.Find("up1.conv.double_conv.0.weight")),
            (Shape{256, 1024, 3, 3, 3}));
  EXPECT_EQ(g.shape(g.Find("input")), (Shape{1, 1, 16, 20, 18}));
  EXPECT_EQ(g.shape(g.Find("target")), (Shape{1, 16, 20, 18}));
}

TEST(NetworkTest, UNet3dSmall) {
  Graph g = MustBuild("unet3d:batch=1,variant=small,depth=8,height=8,width=8");
  ExpectTrainingOutputs(g);
  EXPECT_EQ(NumParameters(g), 14'496'517);
  EXPECT_FALSE(Has(g, "down4.maxpool_conv.1.double_conv.0.weight"));
  EXPECT_EQ(g.shape(g.Find("up2.conv.double_conv.0.weight")),
            (Shape{128, 384, 3, 3, 3}));
}

// features=F scales every width: DoubleConv(in, out) holds 27 out (in + out)
// weights, 2 out biases and 4 out batch-norm values.
TEST(NetworkTest, UNet3dFeaturesScaleEveryWidth) {
  auto double_conv = [](int64_t in, int64_t out) { return 27 * out * (in + out) + 6 * out; };
  for (int64_t f : {64, 8, 3}) {
    SCOPED_TRACE(f);
    Graph g = MustBuild(absl::StrCat("unet3d:batch=1,variant=small,depth=8,height=8,width=8,"
                                     "classes=5,features=", f));
    ExpectTrainingOutputs(g);
    EXPECT_EQ(NumParameters(g),
              double_conv(1, f) + double_conv(f, 2 * f) + double_conv(2 * f, 4 * f) +
                  double_conv(4 * f, 4 * f) + double_conv(8 * f, 4 * f) +
                  double_conv(6 * f, 2 * f) + double_conv(3 * f, f) + 5 * f + 5);
    EXPECT_EQ(g.shape(g.Find("up2.conv.double_conv.0.weight")), (Shape{2 * f, 6 * f, 3, 3, 3}));
  }
  Graph large = MustBuild("unet3d:batch=1,depth=16,height=16,width=16,features=4");
  EXPECT_EQ(large.shape(large.Find("up1.conv.double_conv.0.weight")), (Shape{16, 64, 3, 3, 3}));
  EXPECT_EQ(large.name(), "unet3d:batch=1,depth=16,features=4,height=16,width=16");
  absl::StatusOr<Graph> bad = BuildModel("unet3d:features=0");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("features"));
}

TEST(NetworkTest, TransformerIsDispatched) {
  Graph g = MustBuild(
      "transformer:layers=1,seq=8,dim=16,heads=2,batch=1,vocab=50");
  ExpectTrainingOutputs(g);
  // vocab dim + seq dim + layers (12 dim^2 + 13 dim) + 2 dim (tied head).
  EXPECT_EQ(NumParameters(g), 50 * 16 + 8 * 16 + (12 * 256 + 13 * 16) + 32);
  EXPECT_TRUE(Has(g, "wte.weight"));
  EXPECT_EQ(g.name(), "transformer:batch=1,dim=16,heads=2,layers=1,seq=8,vocab=50");
  for (const char* text : {"transformer:dim=15,heads=4", "transformer:layers=x",
                           "transformer:width=3"}) {
    absl::StatusOr<Graph> bad = BuildModel(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("transformer"));
  }
}

TEST(NetworkTest, CostModelIsPassedOn) {
  CostModel slow;
  slow.device_flops_per_s = 1e12;
  CostModel fast;
  fast.device_flops_per_s = 1e13;
  absl::StatusOr<Graph> a = BuildModel("conv3d:n=4", slow);
  absl::StatusOr<Graph> b = BuildModel("conv3d:n=4", fast);
  ASSERT_TRUE(a.ok() && b.ok());
  const NodeId v = a->Find("conv2");
  ASSERT_NE(v, kNoNode);
  EXPECT_GT(a->cost(v), 0);
  EXPECT_DOUBLE_EQ(a->cost(v), 10 * b->cost(b->Find("conv2")));
}

TEST(NetworkTest, UNet3dDefaultInputPadsOddSizes) {
  // (2,1,26,150,320): depth 26 -> 13 -> 6 -> 3 -> 1 and height
  // 150 -> 75 -> 37 -> 18 -> 9, so up1 (depth 2 -> 3), up2 (height 36 -> 37)
  // and up3 (depth 12 -> 13, height 74 -> 75) pad; up4 needs none.
  Graph g = MustBuild("unet3d");
  EXPECT_EQ(g.shape(g.Find("input")), (Shape{2, 1, 26, 150, 320}));
  EXPECT_EQ(g.shape(g.Find("up1.pad")), (Shape{2, 512, 3, 18, 40}));
  EXPECT_EQ(g.shape(g.Find("up2.pad")), (Shape{2, 256, 6, 37, 80}));
  EXPECT_EQ(g.shape(g.Find("up3.pad")), (Shape{2, 128, 13, 75, 160}));
  EXPECT_FALSE(Has(g, "up4.pad"));
  EXPECT_EQ(g.attrs(g.Find("up3.pad"))["pads"],
            nlohmann::json({0, 0, 0, 1, 0, 1}));
  EXPECT_EQ(g.shape(g.Find("up4.conv.double_conv.5")),
            (Shape{2, 64, 26, 150, 320}));
}

TEST(NetworkTest, UNet3dHalfPrecisionHalvesActivations) {
  const std::string base = "unet3d:batch=1,variant=small,depth=8,height=8,width=8";
  Graph fp32 = MustBuild(base);
  Graph fp16 = MustBuild(base + ",dtype=fp16");
  // Feature maps (rank 5: activations, their gradients, conv weights and
  // weight gradients) take half the bytes. The loss and the batch-norm
  // weights, biases and statistics stay fp32 (as under torch.autocast), so
  // the totals are not exactly halved.
  const auto bytes = [](const Graph& g, Role role) {
    int64_t n = 0;
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      if (g.role(v) == role && g.shape(v).has_value() &&
          g.shape(v)->size() == 5) {
        n += g.bytes(v);
      }
    }
    return n;
  };
  EXPECT_EQ(fp16.dtype(fp16.Find("input")), DType::kFloat16);
  EXPECT_EQ(fp16.dtype(fp16.Find("target")), DType::kInt64);
  EXPECT_EQ(fp16.dtype(fp16.Find("inc.double_conv.0.weight")), DType::kFloat16);
  EXPECT_EQ(fp16.dtype(fp16.Find("inc.double_conv.2")), DType::kFloat16);
  for (Role role : {Role::kForward, Role::kBackward, Role::kParameter}) {
    EXPECT_GT(bytes(fp32, role), 0) << RoleName(role);
    EXPECT_EQ(bytes(fp32, role), 2 * bytes(fp16, role)) << RoleName(role);
  }
  EXPECT_LT(fp16.persistent_bytes(), fp32.persistent_bytes());
  EXPECT_EQ(NumParameters(fp16), NumParameters(fp32));
}

}  // namespace
}  // namespace pebble
