// The ONNX importer on models built here with the ONNX protobuf API (the
// torchvision models exported by PyTorch are checked against PyTorch by
// tests/torch/import_check.py).
#include "graph/import/onnx_import.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/net_builder.h"
#include "graph/ops.h"
#include "graph/half.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A small model in torch.onnx.export's style (opset 13, training-mode batch
// norm): input (N,3,8,8) -> conv1 (4 channels, 3x3, pad 1) -> bn1 -> relu ->
// global average pool -> flatten -> fc (Gemm, 5 classes) -> "logits".
class ModelMaker {
 public:
  explicit ModelMaker(int opset = 13) {
    model_.set_ir_version(7);
    auto* op_set = model_.add_opset_import();
    op_set->set_domain("");
    op_set->set_version(opset);
    graph()->set_name("tiny");
  }
  onnx::GraphProto* graph() { return model_.mutable_graph(); }

  void Input(const std::string& name, std::vector<int64_t> dims,
             const std::string& symbolic_batch = "",
             int elem_type = onnx::TensorProto::FLOAT) {
    auto* in = graph()->add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem_type);
    for (size_t i = 0; i < dims.size(); ++i) {
      auto* dim = tt->mutable_shape()->add_dim();
      if (i == 0 && !symbolic_batch.empty()) {
        dim->set_dim_param(symbolic_batch);
      } else {
        dim->set_dim_value(dims[i]);
      }
    }
  }
  void Output(const std::string& name) { graph()->add_output()->set_name(name); }
  void Initializer(const std::string& name, std::vector<int64_t> dims) {
    auto* t = graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t n = 1;
    for (int64_t d : dims) {
      t->add_dims(d);
      n *= d;
    }
    t->mutable_raw_data()->assign(static_cast<size_t>(4 * n), '\0');
  }
  void IntInitializer(const std::string& name, std::vector<int64_t> values) {
    auto* t = graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
  }
  void FloatVectorInitializer(const std::string& name, std::vector<float> values) {
    auto* t = graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (float v : values) t->add_float_data(v);
  }
  static void StringAttr(onnx::NodeProto* n, const std::string& name, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  void ScalarIntInitializer(const std::string& name, int64_t value) {
    auto* t = graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_int64_data(value);
  }
  onnx::NodeProto* Node(const std::string& op, const std::string& name,
                        std::vector<std::string> inputs, std::vector<std::string> outputs) {
    auto* n = graph()->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return n;
  }
  static void IntsAttr(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void IntAttr(onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void FloatAttr(onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }

  static void SetSecondOpset(ModelMaker& m, int64_t version) {
    auto* op_set = m.model_.add_opset_import();
    op_set->set_domain("ai.onnx");
    op_set->set_version(version);
  }

  std::string Bytes() const { return model_.SerializeAsString(); }

 private:
  onnx::ModelProto model_;
};

// Puts the nodes named in `order` first, in that order (ONNX lists a
// graph's nodes in topological order); the others follow in theirs.
void MoveFirst(ModelMaker& m, const std::vector<std::string>& order) {
  std::vector<onnx::NodeProto> nodes(m.graph()->node().begin(), m.graph()->node().end());
  auto rank = [&order](const onnx::NodeProto& n) {
    return std::find(order.begin(), order.end(), n.name()) - order.begin();
  };
  std::stable_sort(nodes.begin(), nodes.end(),
                   [&rank](const onnx::NodeProto& a, const onnx::NodeProto& b) {
                     return rank(a) < rank(b);
                   });
  m.graph()->clear_node();
  for (onnx::NodeProto& n : nodes) *m.graph()->add_node() = std::move(n);
}

// The tiny model; `edit` may change it before serialisation.
std::string TinyModel(int opset = 13, const std::string& symbolic_batch = "",
                      const std::function<void(ModelMaker&)>& edit = nullptr) {
  ModelMaker m(opset);
  m.Input("input", {2, 3, 8, 8}, symbolic_batch);
  m.Initializer("conv1.weight", {4, 3, 3, 3});
  m.Initializer("conv1.bias", {4});
  m.Initializer("bn1.weight", {4});
  m.Initializer("bn1.bias", {4});
  m.Initializer("bn1.running_mean", {4});
  m.Initializer("bn1.running_var", {4});
  m.Initializer("fc.weight", {5, 4});
  m.Initializer("fc.bias", {5});
  auto* conv = m.Node("Conv", "/conv1/Conv", {"input", "conv1.weight", "conv1.bias"}, {"c"});
  ModelMaker::IntsAttr(conv, "kernel_shape", {3, 3});
  ModelMaker::IntsAttr(conv, "pads", {1, 1, 1, 1});
  ModelMaker::IntsAttr(conv, "strides", {1, 1});
  auto* bn = m.Node("BatchNormalization", "/bn1/BatchNormalization",
                    {"c", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"},
                    {"b", "b_mean", "b_var"});
  ModelMaker::FloatAttr(bn, "epsilon", 1e-5f);
  ModelMaker::FloatAttr(bn, "momentum", 0.9f);
  if (opset >= 14) ModelMaker::IntAttr(bn, "training_mode", 1);
  m.Node("Relu", "/relu/Relu", {"b"}, {"r"});
  m.Node("GlobalAveragePool", "/avgpool/GlobalAveragePool", {"r"}, {"p"});
  auto* flat = m.Node("Flatten", "/Flatten", {"p"}, {"f"});
  ModelMaker::IntAttr(flat, "axis", 1);
  auto* fc = m.Node("Gemm", "/fc/Gemm", {"f", "fc.weight", "fc.bias"}, {"logits"});
  ModelMaker::IntAttr(fc, "transB", 1);
  m.Output("logits");
  if (edit) edit(m);
  return m.Bytes();
}

absl::StatusOr<Graph> Import(const std::string& bytes, LossKind loss = LossKind::kCrossEntropy,
                             std::optional<int64_t> batch = std::nullopt) {
  OnnxImportOptions options;
  options.loss = loss;
  options.batch = batch;
  return ImportOnnxModel(bytes, "tiny", options);
}

// The first node of op type `op`.
onnx::NodeProto* FindNode(ModelMaker& m, const std::string& op) {
  for (auto& n : *m.graph()->mutable_node()) {
    if (n.op_type() == op) return &n;
  }
  return nullptr;
}

TEST(OnnxImportTest, ForwardGraphKeepsNamesShapesAndRoles) {
  auto g = Import(TinyModel(), LossKind::kNone);
  ASSERT_TRUE(g.ok()) << g.status();
  // Module paths name the computed nodes; the graph output keeps its name.
  for (const char* id : {"conv1", "bn1.stats", "bn1", "relu", "avgpool", "flatten", "logits"}) {
    EXPECT_NE(g->Find(id), kNoNode) << id;
  }
  const NodeId logits = g->Find("logits");
  ASSERT_NE(logits, kNoNode);
  EXPECT_EQ(*g->shape(logits), (Shape{2, 5}));
  EXPECT_EQ(g->op(logits), "linear");
  EXPECT_TRUE(g->is_output(logits));
  EXPECT_EQ(g->role(g->Find("conv1.weight")), Role::kParameter);
  EXPECT_EQ(g->role(g->Find("bn1.running_mean")), Role::kBuffer);
  EXPECT_EQ(g->role(g->Find("bn1.num_batches_tracked")), Role::kBuffer);
  EXPECT_EQ(g->role(g->Find("input")), Role::kInput);
  EXPECT_EQ(*g->shape(g->Find("avgpool")), (Shape{2, 4, 1, 1}));
  // Costs are the operator table's FLOPs, never a default.
  EXPECT_GT(g->cost(g->Find("conv1")), g->cost(g->Find("relu")));
  int64_t parameter_bytes = 0;
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    if (g->role(v) == Role::kParameter) parameter_bytes += g->bytes(v);
  }
  EXPECT_EQ(parameter_bytes, 4 * (4 * 3 * 9 + 4 + 4 + 4 + 5 * 4 + 5));
}

TEST(OnnxImportTest, TrainingGraphHasTheLossAndEveryParameterGradient) {
  auto g = Import(TinyModel());
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId loss = g->Find("loss");
  ASSERT_NE(loss, kNoNode);
  EXPECT_EQ(g->op(loss), "softmax_cross_entropy");
  EXPECT_EQ(*g->shape(g->Find("target")), (Shape{2}));
  EXPECT_EQ(*g->dtype(g->Find("target")), DType::kInt64);
  for (const char* p : {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "fc.weight",
                        "fc.bias"}) {
    const NodeId grad = g->Find(std::string("grad:") + p);
    ASSERT_NE(grad, kNoNode) << p;
    EXPECT_TRUE(g->is_output(grad)) << p;
  }
  EXPECT_EQ(g->Find("grad:bn1.running_mean"), kNoNode);
  EXPECT_EQ(g->outputs().size(), 7u);  // loss + 6 gradients
}

TEST(OnnxImportTest, MseLossTakesATargetOfTheOutputsType) {
  auto g = Import(TinyModel(), LossKind::kMse);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->shape(g->Find("target")), (Shape{2, 5}));
  EXPECT_EQ(g->op(g->Find("loss")), "mse_loss");
}

TEST(OnnxImportTest, BatchRewritesTheBatchDimension) {
  auto g = Import(TinyModel(13, "batch"), LossKind::kCrossEntropy, 6);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->shape(g->Find("input")), (Shape{6, 3, 8, 8}));
  EXPECT_EQ(*g->shape(g->Find("logits")), (Shape{6, 5}));
  EXPECT_EQ(*g->shape(g->Find("target")), (Shape{6}));
  // A fixed batch is rewritten too.
  auto fixed = Import(TinyModel(), LossKind::kNone, 3);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(*fixed->shape(fixed->Find("logits")), (Shape{3, 5}));
}

TEST(OnnxImportTest, BatchLeavesAFixedSideInputBesideASymbolicBatch) {
  // logits = Gemm(...) * scale, scale of fixed shape (5) beside a symbolic
  // batch: --batch rewrites the batch, not the scale (it became (6), which
  // does not broadcast against (6,5)).
  auto scaled = [](ModelMaker& m) {
    m.Input("scale", {5});
    FindNode(m, "Gemm")->set_output(0, "g");
    m.Node("Mul", "/Mul", {"g", "scale"}, {"logits"});
  };
  auto g = Import(TinyModel(13, "batch", scaled), LossKind::kNone, 6);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->shape(g->Find("scale")), (Shape{5}));
  EXPECT_EQ(*g->shape(g->Find("logits")), (Shape{6, 5}));
  // Without a symbolic batch every input's dimension 0 is the batch.
  auto fixed = Import(TinyModel(13, "", [](ModelMaker& m) { m.Input("extra", {2, 7}); }),
                      LossKind::kNone, 3);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(*fixed->shape(fixed->Find("extra")), (Shape{3, 7}));
}

TEST(OnnxImportTest, OutputKeepsItsNameAfterANodeThatImportsAsNone) {
  for (const char* op : {"Identity", "Dropout"}) {
    auto g = Import(TinyModel(13, "",
                              [&](ModelMaker& m) {
                                FindNode(m, "Gemm")->set_output(0, "g");
                                m.Node(op, std::string("/") + op, {"g"}, {"logits"});
                              }),
                    LossKind::kNone);
    ASSERT_TRUE(g.ok()) << op << ": " << g.status();
    const NodeId logits = g->Find("logits");
    ASSERT_NE(logits, kNoNode) << op;
    EXPECT_TRUE(g->is_output(logits)) << op;
    EXPECT_EQ(g->op(logits), "linear") << op;
    EXPECT_EQ(g->outputs().size(), 1u) << op;
  }
  // A weight listed as a graph input as well, with its own shape, imports.
  auto listed = Import(TinyModel(13, "", [](ModelMaker& m) { m.Input("fc.bias", {5}); }));
  EXPECT_TRUE(listed.ok()) << listed.status();
}

TEST(OnnxImportTest, SymbolicBatchWithoutBatchIsAnErrorSayingWhatToDo) {
  auto g = Import(TinyModel(13, "batch"));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("'input'"));
  EXPECT_THAT(g.status().message(), HasSubstr("--batch"));
}

TEST(OnnxImportTest, TrainingModeBatchNormOfOpset14) {
  auto g = Import(TinyModel(14));
  ASSERT_TRUE(g.ok()) << g.status();
  auto eval = Import(TinyModel(14, "", [](ModelMaker& m) {
    for (auto& n : *m.graph()->mutable_node()) {
      if (n.op_type() != "BatchNormalization") continue;
      for (auto& a : *n.mutable_attribute()) {
        if (a.name() == "training_mode") a.set_i(0);
      }
      n.mutable_output()->DeleteSubrange(1, 2);
    }
  }));
  ASSERT_FALSE(eval.ok());
  EXPECT_THAT(eval.status().message(), HasSubstr("inference mode"));
  EXPECT_THAT(eval.status().message(), HasSubstr("TrainingMode.TRAINING"));
}

// Each edit gives an error that names the ONNX node, its op and what is
// wrong: never a silently different graph.
struct BadCase {
  std::string what;
  std::function<void(ModelMaker&)> edit;
  std::vector<std::string> message_parts;
};

TEST(OnnxImportTest, WhatCannotBeHonouredIsAnErrorNamingTheNode) {
  const std::vector<BadCase> cases = {
      {"groups that do not divide the channels",
       [](ModelMaker& m) { ModelMaker::IntAttr(FindNode(m, "Conv"), "group", 2); },
       {"'/conv1/Conv'", "op Conv", "3 channels", "groups = 2"}},
      {"dilation wider than the input",
       [](ModelMaker& m) { ModelMaker::IntsAttr(FindNode(m, "Conv"), "dilations", {5, 5}); },
       {"'/conv1/Conv'", "larger than the padded input"}},
      {"reduce-mean over a repeated axis",
       [](ModelMaker& m) {
         auto* pool = FindNode(m, "GlobalAveragePool");
         pool->set_op_type("ReduceMean");
         ModelMaker::IntsAttr(pool, "axes", {1, -3});
       },
       {"'/avgpool/GlobalAveragePool'", "axes", "repeated"}},
      {"operands that do not broadcast",
       [](ModelMaker& m) {
         m.Initializer("wrong", {3, 1});
         FindNode(m, "Relu")->set_op_type("Add");
         FindNode(m, "Add")->add_input("wrong");
       },
       {"'/relu/Relu'", "(2,4,8,8)", "(3,1)", "do not broadcast"}},
      {"asymmetric pads",
       [](ModelMaker& m) {
         auto* conv = FindNode(m, "Conv");
         for (auto& a : *conv->mutable_attribute()) {
           if (a.name() == "pads") a.set_ints(3, 0);
         }
       },
       {"'/conv1/Conv'", "pads", "asymmetric"}},
      {"unknown attribute",
       [](ModelMaker& m) { ModelMaker::IntAttr(FindNode(m, "Relu"), "bogus", 1); },
       {"'/relu/Relu'", "'bogus'"}},
      {"several unknown attributes: the first in the node's order",
       [](ModelMaker& m) {
         for (const char* name : {"first_bogus", "b", "c", "d", "e", "f", "g", "h"}) {
           ModelMaker::IntAttr(FindNode(m, "Relu"), name, 1);
         }
       },
       {"'/relu/Relu'", "'first_bogus'"}},
      {"unknown op",
       [](ModelMaker& m) { FindNode(m, "Relu")->set_op_type("Softsign"); },
       {"'/relu/Relu'", "op Softsign", "not supported", "Conv, ConvTranspose",
        "of constants and shapes only: ConstantOfShape, Mod"}},
      {"other domain",
       [](ModelMaker& m) { FindNode(m, "Relu")->set_domain("com.example"); },
       {"'/relu/Relu'", "com.example"}},
      // Operators are checked before any node is imported: the unknown one
      // is named, not an earlier node that fails for another reason.
      {"an unknown op after a node that fails",
       [](ModelMaker& m) {
         ModelMaker::IntAttr(FindNode(m, "Conv"), "group", 2);
         FindNode(m, "Relu")->set_op_type("Softsign");
         FindNode(m, "GlobalAveragePool")->set_op_type("ThresholdedRelu");
       },
       {"'/relu/Relu'", "op Softsign", "not supported", "the model also uses 'ThresholdedRelu'",
        "pebble.torch trains a PyTorch module"}},
      {"control flow",
       [](ModelMaker& m) { FindNode(m, "Relu")->set_op_type("Loop"); },
       {"'/relu/Relu'", "op Loop", "control flow", "dynamic_axes"}},
      {"gemm with alpha",
       [](ModelMaker& m) { ModelMaker::FloatAttr(FindNode(m, "Gemm"), "alpha", 2.0f); },
       {"'/fc/Gemm'", "alpha"}},
      {"reads an undefined value",
       [](ModelMaker& m) { FindNode(m, "Relu")->set_input(0, "nowhere"); },
       {"'/relu/Relu'", "'nowhere'"}},
      // ONNX assigns each value once; a second assignment imported as the
      // last one the walk met (a weight dropped from the step, a stored
      // shape replaced by a Constant's).
      {"assigns a value twice",
       [](ModelMaker& m) { FindNode(m, "Relu")->set_output(0, "c"); },
       {"'c' is assigned twice", "output 0 of ONNX node '/conv1/Conv'",
        "output 0 of ONNX node '/relu/Relu'"}},
      {"a node's output named like a weight",
       [](ModelMaker& m) {
         FindNode(m, "Relu")->set_output(0, "conv1.bias");
         FindNode(m, "GlobalAveragePool")->set_input(0, "conv1.bias");
       },
       {"'conv1.bias' is assigned twice", "by an initializer", "'/relu/Relu'"}},
      {"a Constant named like a weight",
       [](ModelMaker& m) { m.Node("Constant", "k1", {}, {"fc.bias"}); },
       {"'fc.bias' is assigned twice", "by an initializer", "'k1' (op Constant)"}},
      {"a graph input named like a node's output",
       [](ModelMaker& m) { m.Input("r", {2, 4, 8, 8}); },
       {"'r' is assigned twice", "by a graph input", "'/relu/Relu'"}},
      {"the default opset imported twice",
       [](ModelMaker& m) { ModelMaker::SetSecondOpset(m, 17); },
       {"the ONNX opset twice, as 13 and as 17"}},
      {"an input named like the node the loss adds",
       [](ModelMaker& m) { m.Input("target", {2}); },
       {"adds the nodes 'target' and 'loss'", "a node 'target'", "input_names"}},
      {"a graph input without a name",
       [](ModelMaker& m) { m.Input("", {2}); },
       {"a graph input has no name"}},
      {"a weight listed as a graph input of another shape",
       [](ModelMaker& m) { m.Input("fc.bias", {3}); },
       {"initializer 'fc.bias' is also a graph input", "of shape (3), but holds (5)"}},
      {"a weight listed as a graph input of another type",
       [](ModelMaker& m) {
         m.Input("fc.bias", {5});
         m.graph()->mutable_input(1)->mutable_type()->mutable_tensor_type()->set_elem_type(
             onnx::TensorProto::INT64);
       },
       {"initializer 'fc.bias' is also a graph input", "of type INT64, but holds FLOAT"}},
      {"an input dimension of 0",
       [](ModelMaker& m) {
         m.graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()
             ->mutable_dim(1)->set_dim_value(0);
       },
       {"graph input 'input': dimension 1 is 0", "at least 1"}},
      {"reads batch norm's running statistics output",
       [](ModelMaker& m) { FindNode(m, "Relu")->set_input(0, "b_mean"); },
       {"'/relu/Relu'", "'b_mean'", "running statistics"}},
      // A learnable exponent (GeM pooling's) was once folded as a constant,
      // frozen at its first value; over a base that may be 0 or negative
      // (here a batch norm's output) exp(p log x) would be wrong.
      {"a Pow whose exponent is a parameter, of a base of any sign",
       [](ModelMaker& m) {
         m.FloatVectorInitializer("gem.p", {2.0f});
         FindNode(m, "Relu")->set_op_type("Pow");
         FindNode(m, "Pow")->add_input("gem.p");
       },
       {"'/relu/Relu'", "'gem.p') is supported for a base that is positive",
        "'b' is not known to be"}},
  };
  for (const BadCase& c : cases) {
    auto g = Import(TinyModel(13, "", c.edit));
    ASSERT_FALSE(g.ok()) << c.what;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(g.status().message(), HasSubstr(part)) << c.what;
    }
    EXPECT_EQ(g.status().message().find('\n'), absl::string_view::npos) << c.what;
  }
}

// The tiny model with its Flatten written as a Reshape to `shape`.
std::string ReshapingModel(std::vector<int64_t> shape, bool symbolic_batch = false) {
  return TinyModel(13, "", [&](ModelMaker& m) {
    if (symbolic_batch) {  // exported with dynamic_axes={"x": {0: "batch"}}
      m.graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()
          ->mutable_dim(0)->set_dim_param("batch");
    }
    m.IntInitializer("flat_shape", shape);
    onnx::NodeProto* flatten = FindNode(m, "Flatten");
    flatten->set_op_type("Reshape");
    flatten->set_name("/Reshape");
    flatten->clear_attribute();
    flatten->add_input("flat_shape");
  });
}

TEST(OnnxImportTest, BatchThatAReshapeFixesIsNamed) {
  // x.reshape(2, -1) at an exported batch of 2: --batch 4 makes it (2, 8),
  // which the classifier refuses; the error says why.
  auto fixed = Import(ReshapingModel({2, -1}), LossKind::kCrossEntropy, 4);
  ASSERT_FALSE(fixed.ok());
  EXPECT_THAT(fixed.status().message(), HasSubstr("'/fc/Gemm'"));
  EXPECT_THAT(fixed.status().message(),
              HasSubstr("--batch 4 rewrote dimension 0 from the exported 2, but Reshape "
                        "'/Reshape' sets dimension 0 to 2 with a constant shape"));
  EXPECT_THAT(fixed.status().message(), HasSubstr("x.flatten(1)"));
  // A shape whose every size is the exported one fails at the Reshape
  // itself (shufflenet's channel shuffle, x.size(0) written as a constant):
  // named too, where until 2026-12-05 the error said only that it cannot
  // reshape.
  auto whole = Import(ReshapingModel({2, 4}), LossKind::kCrossEntropy, 4);
  ASSERT_FALSE(whole.ok());
  EXPECT_THAT(whole.status().message(), HasSubstr("cannot reshape"));
  EXPECT_THAT(whole.status().message(),
              HasSubstr("--batch 4 rewrote dimension 0 from the exported 2, but Reshape "
                        "'/Reshape' sets dimension 0 to 2 with a constant shape"));
  EXPECT_TRUE(Import(ReshapingModel({2, 4}), LossKind::kCrossEntropy, 2).ok());
  // Exported with a symbolic batch, the constant fixes it all the same.
  auto symbolic = Import(ReshapingModel({2, -1}, true), LossKind::kCrossEntropy, 4);
  ASSERT_FALSE(symbolic.ok());
  EXPECT_THAT(symbolic.status().message(),
              HasSubstr("--batch 4 gave the symbolic batch 'batch' its size, but Reshape "
                        "'/Reshape' sets dimension 0 to 2 with a constant shape"));
  EXPECT_THAT(symbolic.status().message(), Not(HasSubstr("import without --batch")));
  EXPECT_TRUE(Import(ReshapingModel({4, -1}, true), LossKind::kCrossEntropy, 4).ok());
  EXPECT_TRUE(Import(ReshapingModel({-1, 4}, true), LossKind::kCrossEntropy, 4).ok());
  // The same model at its own batch, and a reshape with -1 for the batch.
  EXPECT_TRUE(Import(ReshapingModel({2, -1}), LossKind::kCrossEntropy, 2).ok());
  EXPECT_TRUE(Import(ReshapingModel({2, -1})).ok());
  auto follows = Import(ReshapingModel({-1, 4}), LossKind::kCrossEntropy, 4);
  ASSERT_TRUE(follows.ok()) << follows.status();
  EXPECT_EQ(*follows->shape(follows->Find("logits")), (Shape{4, 5}));
  // Another error is not given the note.
  auto other = Import(TinyModel(13, "", [](ModelMaker& m) {
                        ModelMaker::IntAttr(FindNode(m, "Conv"), "group", 2);
                      }),
                      LossKind::kCrossEntropy, 4);
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(), ::testing::Not(HasSubstr("rewrote")));
}

// Exported at a fixed batch, a file may hold constants computed from the
// batch anywhere (nn.MultiheadAttention's batch x heads in dimension 1):
// --batch rewrites the inputs and says so, and where the import then fails
// but imports at the exported batch, the error says that too.
TEST(OnnxImportTest, BatchRewrittenFromAFixedSizeIsSaid) {
  std::vector<std::string> notes;
  OnnxImportOptions options;
  options.batch = 4;
  ASSERT_TRUE(ImportOnnxModel(TinyModel(), "tiny", options, &notes).ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("--batch 4 rewrote dimension 0 from the exported 2, a size "
                                  "the file fixes"));
  EXPECT_THAT(notes[0], HasSubstr("dynamic_axes"));
  // A symbolic batch: nothing to say.
  notes.clear();
  ASSERT_TRUE(ImportOnnxModel(TinyModel(13, "batch"), "tiny", options, &notes).ok());
  EXPECT_TRUE(notes.empty());
  // The features flattened as (1, batch x 4), a constant of the export:
  // at --batch 4 the reshape fails, at the exported 2 the file imports.
  auto batch_in_dim1 = [](ModelMaker& m) {
    m.IntInitializer("rows_shape", {1, 8});
    m.IntInitializer("back_shape", {2, 4});
    auto* flat = FindNode(m, "Flatten");
    flat->set_op_type("Reshape");
    flat->clear_attribute();
    flat->add_input("rows_shape");
    flat->set_output(0, "rows");
    m.Node("Reshape", "/Reshape_1", {"rows", "back_shape"}, {"f"});
    MoveFirst(m, {"/conv1/Conv", "/bn1/BatchNormalization", "/relu/Relu",
                  "/avgpool/GlobalAveragePool", "/Flatten", "/Reshape_1"});
  };
  ASSERT_TRUE(Import(TinyModel(13, "", batch_in_dim1)).ok());
  auto rewritten = Import(TinyModel(13, "", batch_in_dim1), LossKind::kCrossEntropy, 4);
  ASSERT_FALSE(rewritten.ok());
  EXPECT_THAT(std::string(rewritten.status().message()),
              HasSubstr("'/Flatten' (op Reshape)"));
  EXPECT_THAT(std::string(rewritten.status().message()),
              HasSubstr("(--batch 4 rewrote dimension 0 from the exported 2, a size the file "
                        "fixes"));
  EXPECT_THAT(std::string(rewritten.status().message()),
              HasSubstr("and the file imports at batch 2"));
}

TEST(OnnxImportTest, BatchThatAReshapeFixesInAGraphThatImportsIsANote) {
  // x.reshape(2, -1) as the forward's last node, exported with a symbolic
  // batch (ONNX's inference then knows no shape to hold against pebble's):
  // nothing after it refuses its shape, so the graph imports at --batch 4
  // with the constant's batch there, and a note says so.
  const std::string model = TinyModel(13, "batch", [](ModelMaker& m) {
    m.IntInitializer("pair_shape", {2, -1});
    m.Node("Reshape", "/Reshape", {"logits", "pair_shape"}, {"pairs"});
    m.graph()->mutable_output(0)->set_name("pairs");
  });
  OnnxImportOptions options;
  options.loss = LossKind::kNone;
  options.batch = 4;
  std::vector<std::string> notes;
  auto g = ImportOnnxModel(model, "tiny", options, &notes);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->shape(g->Find("pairs")), (Shape{2, 10}));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("--batch 4 gave the symbolic batch 'batch' its size, but "
                                  "Reshape '/Reshape' sets dimension 0 to 2"));
  EXPECT_THAT(notes[0], HasSubstr("the nodes after it keep dimension 0 at 2"));
  // At the constant's batch, or with no Reshape fixing it: no note.
  notes.clear();
  options.batch = 2;
  ASSERT_TRUE(ImportOnnxModel(model, "tiny", options, &notes).ok());
  options.batch = 4;
  ASSERT_TRUE(ImportOnnxModel(TinyModel(13, "batch"), "tiny", options, &notes).ok());
  EXPECT_THAT(notes, ::testing::IsEmpty());
}

// PyTorch drops a ceil-mode pool's last window where it would start in the
// padding; ONNX's shape inference keeps it. The model
// is PyTorch's: its shape is taken, and the shapes after it go unchecked.
TEST(OnnxImportTest, ACeilModePoolTakesPyTorchsShape) {
  auto model = TinyModel(13, "", [](ModelMaker& m) {
    auto* dims = m.graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()
                     ->mutable_shape();
    dims->mutable_dim(2)->set_dim_value(9);
    dims->mutable_dim(3)->set_dim_value(9);
    FindNode(m, "GlobalAveragePool")->set_input(0, "pooled");
    auto* pool = m.Node("MaxPool", "/pool/MaxPool", {"r"}, {"pooled"});
    ModelMaker::IntsAttr(pool, "kernel_shape", {2, 2});
    ModelMaker::IntsAttr(pool, "strides", {2, 2});
    ModelMaker::IntsAttr(pool, "pads", {1, 1, 1, 1});
    ModelMaker::IntAttr(pool, "ceil_mode", 1);
    // Nodes in their order: the pool before the average.
    auto* nodes = m.graph()->mutable_node();
    std::rotate(nodes->begin() + 3, nodes->end() - 1, nodes->end());
  });
  auto g = Import(model, LossKind::kNone);
  ASSERT_TRUE(g.ok()) << g.status();
  // ceil((9 + 2 - 2) / 2) + 1 = 6 windows, the last starting at 10, in the
  // padding: PyTorch's 5.
  ASSERT_NE(g->Find("pool"), kNoNode);
  EXPECT_EQ(*g->shape(g->Find("pool")), (Shape{2, 4, 5, 5}));
  EXPECT_EQ(*g->shape(g->Find("logits")), (Shape{2, 5}));
}

// A Concat of parameters (a learnable scale put together from parts) is a
// concat of values, each part a parameter with its gradient; a Concat that
// makes Resize's scales folds (ResizeByWholeFactorsIsUpsample).
TEST(OnnxImportTest, AConcatOfParametersIsComputedNotFolded) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.FloatVectorInitializer("scale.a", {1, 2});
    m.FloatVectorInitializer("scale.b", {3, 4});
    auto* cat = m.Node("Concat", "/Concat", {"scale.a", "scale.b"}, {"scale"});
    ModelMaker::IntAttr(cat, "axis", 0);
    m.Node("Unsqueeze", "/Unsqueeze", {"scale", "axes"}, {"scale_2d"});
    m.IntInitializer("axes", {0});
    m.Node("Mul", "/Mul", {"f", "scale_2d"}, {"scaled"});
    FindNode(m, "Gemm")->set_input(0, "scaled");
    auto* nodes = m.graph()->mutable_node();  // the Gemm last, after what it reads
    for (int i = before - 1; i + 1 < nodes->size(); ++i) nodes->SwapElements(i, i + 1);
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* p : {"scale.a", "scale.b"}) {
    const NodeId v = g->Find(p);
    ASSERT_NE(v, kNoNode) << p;
    EXPECT_EQ(g->role(v), Role::kParameter) << p;
    EXPECT_NE(g->Find(std::string("grad:") + p), kNoNode) << p;
  }
}

// OnnxImportOptions::frozen: initializers matched by id or glob import as
// buffers (no gradient); the batch norm's statistics stay buffers; a
// pattern that matches nothing is an option error, not the model's; a
// model frozen whole is refused.
TEST(OnnxImportTest, FrozenInitializersAreBuffersWithoutGradients) {
  const std::string bytes = TinyModel(13, "", [](ModelMaker& m) {
    m.FloatVectorInitializer("mean", {0.5});
    m.Node("Sub", "/Sub", {"input", "mean"}, {"centred"});
    FindNode(m, "Conv")->set_input(0, "centred");
    MoveFirst(m, {"/Sub"});
  });
  auto import_frozen = [&bytes](std::vector<std::string> frozen) {
    OnnxImportOptions options;
    options.frozen = std::move(frozen);
    return ImportOnnxModel(bytes, "tiny", options);
  };
  {
    auto g = Import(bytes);  // (what --frozen is for: a buffer read by Sub trains)
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->role(g->Find("mean")), Role::kParameter);
  }
  auto g = import_frozen({"mean", "conv1.*"});
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* id : {"mean", "conv1.weight", "conv1.bias", "bn1.running_mean"}) {
    EXPECT_EQ(g->role(g->Find(id)), Role::kBuffer) << id;
    EXPECT_EQ(g->Find(absl::StrCat("grad:", id)), kNoNode) << id;
  }
  for (const char* id : {"bn1.weight", "bn1.bias", "fc.weight", "fc.bias"}) {
    EXPECT_EQ(g->role(g->Find(id)), Role::kParameter) << id;
    EXPECT_NE(g->Find(absl::StrCat("grad:", id)), kNoNode) << id;
  }
  EXPECT_EQ(g->outputs().size(), 5u);  // loss + 4 gradients

  auto unmatched = import_frozen({"mean", "conv2.*"});
  ASSERT_FALSE(unmatched.ok());
  EXPECT_TRUE(IsOnnxOptionError(unmatched.status()));
  EXPECT_THAT(unmatched.status().message(),
              AllOf(HasSubstr("frozen 'conv2.*' matches none"), HasSubstr("'conv1.bias'")));
  auto whole = import_frozen({"*"});
  ASSERT_FALSE(whole.ok());
  EXPECT_FALSE(IsOnnxOptionError(whole.status()));
  EXPECT_THAT(whole.status().message(), HasSubstr("no parameters left to train"));
}

// A model whose weights are graph inputs (export_params=False) trains
// nothing: refused, saying how to export it (it imported as a step with no
// parameter gradient).
TEST(OnnxImportTest, ATrainingGraphWithoutParametersIsRefused) {
  ModelMaker m(13);
  m.Input("input", {2, 4});
  m.Input("fc.weight", {5, 4});
  auto* fc = m.Node("Gemm", "/fc/Gemm", {"input", "fc.weight"}, {"logits"});
  ModelMaker::IntAttr(fc, "transB", 1);
  m.Output("logits");
  auto g = Import(m.Bytes());
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("export_params=False"));
  EXPECT_TRUE(Import(m.Bytes(), LossKind::kNone).ok());  // (its forward graph)
}

// LayerNormalization without a bias (ONNX's optional input) and without a
// scale (an empty name: PyTorch 1.13's export of
// nn.LayerNorm(elementwise_affine=False)) normalizes with a zero bias and a
// scale of ones, made by the step, not parameters (the scale-less one read
// past its inputs, a Value that was none).
// nn.LayerNorm([C, H, W]) at opset 17: axis -3, its scale and bias
// (C, H, W); x viewed as (N, C x H x W), the parameters as vectors.
TEST(OnnxImportTest, LayerNormOverSeveralTrailingDims) {
  auto g = Import(TinyModel(17, "", [](ModelMaker& m) {
    m.Initializer("ln.weight", {4, 8, 8});
    m.Initializer("ln.bias", {4, 8, 8});
    auto* relu = FindNode(m, "Relu");
    relu->set_op_type("LayerNormalization");
    relu->set_name("/ln/LayerNormalization");
    relu->add_input("ln.weight");
    relu->add_input("ln.bias");
    ModelMaker::IntAttr(relu, "axis", -3);
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->shape(g->Find("ln.rows")), (Shape{2, 256}));
  EXPECT_EQ(*g->shape(g->Find("ln.scale_row")), (Shape{256}));
  EXPECT_EQ(g->op(g->Find("ln.normalized")), "layernorm");
  EXPECT_EQ(*g->shape(g->Find("ln")), (Shape{2, 4, 8, 8}));
  EXPECT_EQ(*g->shape(g->Find("grad:ln.weight")), (Shape{4, 8, 8}));
}

TEST(OnnxImportTest, LayerNormWithoutScaleOrBias) {
  for (const std::vector<std::string>& affine :
       {std::vector<std::string>{"", ""}, std::vector<std::string>{"ln.weight"}}) {
    SCOPED_TRACE(affine.front().empty() ? "no scale" : "no bias");
    ModelMaker m(17);
    m.Input("input", {2, 3, 6});
    m.Initializer("ln.weight", {6});
    m.Initializer("fc.weight", {5, 6});
    std::vector<std::string> inputs = {"input"};
    inputs.insert(inputs.end(), affine.begin(), affine.end());
    m.Node("LayerNormalization", "/ln/LayerNormalization", inputs, {"n"});
    m.Node("ReduceMean", "/ReduceMean", {"n"}, {"p"});
    ModelMaker::IntsAttr(m.graph()->mutable_node(1), "axes", {1});
    ModelMaker::IntAttr(m.graph()->mutable_node(1), "keepdims", 0);
    auto* fc = m.Node("Gemm", "/fc/Gemm", {"p", "fc.weight"}, {"logits"});
    ModelMaker::IntAttr(fc, "transB", 1);
    m.Output("logits");
    auto g = Import(m.Bytes());
    ASSERT_TRUE(g.ok()) << g.status();
    const NodeId ln = g->Find("ln");
    ASSERT_NE(ln, kNoNode);
    ASSERT_EQ(g->inputs(ln).size(), 4u);
    const NodeId scale = g->inputs(ln)[2], bias = g->inputs(ln)[3];
    EXPECT_EQ(g->op(bias), "fill");
    EXPECT_EQ(g->attrs(bias)["value"], 0.0);
    EXPECT_EQ(*g->shape(bias), (Shape{6}));
    if (affine.front().empty()) {
      EXPECT_EQ(g->op(scale), "fill");
      EXPECT_EQ(g->attrs(scale)["value"], 1.0);
      EXPECT_EQ(*g->shape(scale), (Shape{6}));
      EXPECT_EQ(g->Find("grad:ln.weight"), kNoNode);
    } else {
      EXPECT_EQ(g->id(scale), "ln.weight");
      EXPECT_NE(g->Find("grad:ln.weight"), kNoNode);
    }
    EXPECT_NE(g->Find("grad:fc.weight"), kNoNode);
  }
}

TEST(OnnxImportTest, OpsetOutsideTheSupportedRangeIsRefused) {
  for (int opset : {9, 18}) {
    auto g = Import(TinyModel(opset));
    ASSERT_FALSE(g.ok()) << opset;
    EXPECT_THAT(g.status().message(), HasSubstr(absl::StrCat("opset ", opset)));
  }
}

TEST(OnnxImportTest, BytesThatAreNotAModelAreRefused) {
  const std::string model = TinyModel();
  for (const std::string& bytes :
       {std::string("not a model"), model.substr(0, model.size() / 2), std::string()}) {
    auto g = Import(bytes);
    EXPECT_FALSE(g.ok());
  }
}

TEST(OnnxImportTest, PebblesShapeMustAgreeWithOnnxShapeInference) {
  // Flatten with axis 2 of (N,4,1,1) is (N*4, 1) in ONNX: the importer
  // reshapes to that, and the Gemm then fails on its weight, naming it.
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    for (auto& a : *FindNode(m, "Flatten")->mutable_attribute()) a.set_i(2);
  }));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("'/fc/Gemm'"));
}

// A model that declares another shape than pebble infers (here its output
// claims 7 classes where the weights give 5) is refused: pebble would
// otherwise plan a different network than the file describes.
TEST(OnnxImportTest, ShapesTheModelDeclaresMustMatch) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    auto* out = m.graph()->mutable_output(0);
    auto* tt = out->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_value(2);
    tt->mutable_shape()->add_dim()->set_dim_value(7);
  }));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("'/fc/Gemm'"));
  EXPECT_THAT(g.status().message(), HasSubstr("(2,5)"));
  EXPECT_THAT(g.status().message(), HasSubstr("(2,7)"));
}

// Grouped and dilated convolutions keep their attrs; a ReduceMean over
// the spatial dims is a global average pool (a view of (N, C) without
// keepdims).
// torch.clamp(x, 0, 6) with Python ints exports its bounds as int64
// constants cast to float: Clip takes them (they were refused as "min must
// be a constant finite scalar").
TEST(OnnxImportTest, ClipTakesIntegerBoundsCastToFloat) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    m.IntInitializer("low", {0});
    m.IntInitializer("high", {6});
    ModelMaker::IntAttr(m.Node("Cast", "/Cast", {"low"}, {"low_f"}), "to",
                        onnx::TensorProto::FLOAT);
    ModelMaker::IntAttr(m.Node("Cast", "/Cast_1", {"high"}, {"high_f"}), "to",
                        onnx::TensorProto::FLOAT);
    auto* nodes = m.graph()->mutable_node();
    for (int cast = nodes->size() - 2; cast < nodes->size(); ++cast) {  // before the Relu
      for (int i = cast; nodes->Get(i - 1).op_type() != "BatchNormalization"; --i) {
        nodes->SwapElements(i, i - 1);
      }
    }
    auto* relu = FindNode(m, "Relu");
    relu->set_op_type("Clip");
    relu->add_input("low_f");
    relu->add_input("high_f");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  NodeId clip = kNoNode;
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    if (g->op(v) == "clip") clip = v;
  }
  ASSERT_NE(clip, kNoNode);
  EXPECT_EQ(g->attrs(clip)["min"], 0.0);
  EXPECT_EQ(g->attrs(clip)["max"], 6.0);
}

// nn.MultiheadAttention's export multiplies by an integer constant cast to
// float: a scalar of that value.
TEST(OnnxImportTest, AComputationReadsAnIntegerScalarCastToFloat) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    m.ScalarIntInitializer("three", 3);
    ModelMaker::IntAttr(m.Node("Cast", "/Cast", {"three"}, {"three_f"}), "to",
                        onnx::TensorProto::FLOAT);
    MoveFirst(m, {"/Cast"});
    auto* relu = FindNode(m, "Relu");
    relu->set_op_type("Mul");
    relu->add_input("three_f");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId mul = g->Find("relu");
  ASSERT_NE(mul, kNoNode);
  EXPECT_EQ(g->op(mul), "mul");
  const NodeId scale = g->inputs(mul)[1];
  EXPECT_EQ(g->op(scale), "fill");
  EXPECT_EQ(g->attrs(scale)["value"], 3.0);
}

// The tiny model's batch norm made an instance norm (nn.InstanceNorm2d
// with affine parameters): a layer norm over x viewed as (N, C, H x W), the
// affine a broadcast mul and add by the parameters viewed as (C, 1).
TEST(OnnxImportTest, InstanceNormIsALayerNormOverEachChannel) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    auto* norm = FindNode(m, "BatchNormalization");
    norm->set_op_type("InstanceNormalization");
    norm->mutable_input()->DeleteSubrange(3, 2);
    norm->mutable_output()->DeleteSubrange(1, 2);
    norm->clear_attribute();
    ModelMaker::FloatAttr(norm, "epsilon", 1e-3f);
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId stats = g->Find("bn1.stats");
  ASSERT_NE(stats, kNoNode);
  EXPECT_EQ(g->op(stats), "layernorm_stats");
  EXPECT_FLOAT_EQ(g->attrs(stats)["eps"].get<double>(), 1e-3);
  EXPECT_EQ(*g->shape(g->inputs(stats)[0]), (Shape{2, 4, 64}));
  EXPECT_EQ(g->op(g->Find("bn1.scaled")), "mul");
  EXPECT_EQ(*g->shape(g->Find("bn1.scale_column")), (Shape{4, 1}));
  EXPECT_EQ(g->op(g->Find("bn1.shifted")), "add");
  const NodeId out = g->Find("bn1");
  EXPECT_EQ(g->op(out), "reshape");
  EXPECT_EQ(*g->shape(out), (Shape{2, 4, 8, 8}));
  EXPECT_EQ(*g->shape(g->Find("grad:bn1.weight")), (Shape{4}));
  EXPECT_EQ(*g->shape(g->Find("grad:bn1.bias")), (Shape{4}));
}

// nn.GroupNorm(2, 4) as PyTorch exports it before opset 18: x viewed as
// (N, 2, -1), an instance norm of constant unit scale and zero bias (no
// affine nodes: the layer norm alone), viewed back.
TEST(OnnxImportTest, GroupNormsInstanceNormHasNoAffineNodes) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    m.IntInitializer("groups_shape", {0, 2, -1});
    m.IntInitializer("back_shape", {2, 4, 8, 8});
    m.FloatVectorInitializer("onnx::ones", {1, 1});
    m.FloatVectorInitializer("onnx::zeros", {0, 0});
    auto* norm = FindNode(m, "BatchNormalization");
    norm->set_op_type("InstanceNormalization");
    norm->set_name("/gn/InstanceNormalization");
    norm->clear_input();
    for (const char* in : {"grouped", "onnx::ones", "onnx::zeros"}) norm->add_input(in);
    norm->mutable_output()->DeleteSubrange(1, 2);
    norm->set_output(0, "normed");
    norm->clear_attribute();
    m.Node("Reshape", "/gn/Reshape", {"c", "groups_shape"}, {"grouped"});
    m.Node("Reshape", "/gn/Reshape_1", {"normed", "back_shape"}, {"b"});
    MoveFirst(m, {"/conv1/Conv", "/gn/Reshape", "/gn/InstanceNormalization", "/gn/Reshape_1"});
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId norm = g->Find("gn.instancenormalization");
  ASSERT_NE(norm, kNoNode);
  EXPECT_EQ(g->op(norm), "layernorm");
  EXPECT_EQ(g->inputs(norm).size(), 2u);
  EXPECT_EQ(*g->shape(norm), (Shape{2, 2, 128}));
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    EXPECT_NE(g->op(v), "mul") << g->id(v);
    EXPECT_NE(g->op(v), "fill") << g->id(v);
  }
  EXPECT_EQ(*g->shape(g->Find("grad:conv1.weight")), (Shape{4, 3, 3, 3}));
}

TEST(OnnxImportTest, GroupedDilatedConvAndSpatialReduceMean) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    // conv2: depthwise over conv1's 4 channels, dilation 2, pads 2.
    m.Initializer("conv2.weight", {4, 1, 3, 3});
    auto* conv2 = m.Node("Conv", "/conv2/Conv", {"r", "conv2.weight"}, {"r2"});
    ModelMaker::IntAttr(conv2, "group", 4);
    ModelMaker::IntsAttr(conv2, "dilations", {2, 2});
    ModelMaker::IntsAttr(conv2, "pads", {2, 2, 2, 2});
    // Moved before the pool (nodes are in topological order).
    auto* nodes = m.graph()->mutable_node();
    for (int i = nodes->size() - 1; nodes->Get(i - 1).op_type() != "Relu"; --i) {
      nodes->SwapElements(i, i - 1);
    }
    auto* pool = FindNode(m, "GlobalAveragePool");
    pool->set_op_type("ReduceMean");
    pool->set_input(0, "r2");
    ModelMaker::IntsAttr(pool, "axes", {-1, 2});
    ModelMaker::IntAttr(pool, "keepdims", 0);
    auto* flatten = FindNode(m, "Flatten");
    flatten->set_op_type("Identity");
    flatten->clear_attribute();
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId conv2 = g->Find("conv2");
  ASSERT_NE(conv2, kNoNode);
  EXPECT_EQ(g->attrs(conv2).value("groups", 0), 4);
  EXPECT_EQ(g->attrs(conv2)["dilation"], nlohmann::json({2, 2}));
  EXPECT_EQ(*g->shape(conv2), (Shape{2, 4, 8, 8}));
  const NodeId mean = g->Find("avgpool");
  ASSERT_NE(mean, kNoNode);
  EXPECT_EQ(g->op(mean), "reshape");
  EXPECT_EQ(*g->shape(mean), (Shape{2, 4}));
  const NodeId grad = g->Find("grad:conv2.weight");
  ASSERT_NE(grad, kNoNode);
  EXPECT_EQ(*g->shape(grad), (Shape{4, 1, 3, 3}));
}

// ReduceMean over the channels (CBAM's spatial attention) and over no
// axes (every dim); the broadcasts that are not one block of dims: the
// (N, 1, H, W) mean times (N, C, H, W), and (N, 1, H, W) + (N, C, 1, 1)
// where both operands broadcast. Each lowers to transposes around a block
// broadcast and keeps ONNX's shapes; the gradients of the lowering are
// checked against PyTorch by import_check.py --model grouped.
TEST(OnnxImportTest, ReduceMeanOverAnyAxesAndBroadcastsOfAnyDims) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    auto* nodes = m.graph()->mutable_node();
    const int before = nodes->size();
    auto* chan = m.Node("ReduceMean", "/chan/ReduceMean", {"r"}, {"chan"});
    ModelMaker::IntsAttr(chan, "axes", {1});
    m.Node("Mul", "/gate/Mul", {"r", "chan"}, {"gated"});
    auto* spatial = m.Node("ReduceMean", "/spatial/ReduceMean", {"r"}, {"spatial"});
    ModelMaker::IntsAttr(spatial, "axes", {2, 3});
    m.Node("Add", "/both/Add", {"chan", "spatial"}, {"both"});
    m.Node("Sub", "/mix/Sub", {"gated", "both"}, {"mixed"});
    auto* all = m.Node("ReduceMean", "/all/ReduceMean", {"mixed"}, {"all"});
    ModelMaker::IntAttr(all, "keepdims", 0);
    m.Node("Add", "/shift/Add", {"mixed", "all"}, {"shifted"});
    // Moved, in order, before the pool, the flatten and the gemm (nodes
    // are in topological order).
    for (int i = before; i < nodes->size(); ++i) {
      for (int j = i; j > i - 3; --j) nodes->SwapElements(j, j - 1);
    }
    FindNode(m, "GlobalAveragePool")->set_input(0, "shifted");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  auto shape_of = [&](const char* id) {
    const NodeId n = g->Find(id);
    return n == kNoNode ? Shape{} : *g->shape(n);
  };
  EXPECT_EQ(shape_of("chan"), (Shape{2, 1, 8, 8}));
  EXPECT_EQ(shape_of("gate"), (Shape{2, 4, 8, 8}));
  EXPECT_EQ(g->op(g->Find("gate")), "transpose");
  EXPECT_EQ(shape_of("spatial"), (Shape{2, 4, 1, 1}));
  EXPECT_EQ(g->op(g->Find("spatial")), "adaptive_avgpool");
  EXPECT_EQ(shape_of("both"), (Shape{2, 4, 8, 8}));
  EXPECT_EQ(shape_of("mix"), (Shape{2, 4, 8, 8}));
  EXPECT_EQ(g->op(g->Find("mix")), "sub");
  EXPECT_EQ(shape_of("all"), (Shape{}));
  EXPECT_EQ(shape_of("shift"), (Shape{2, 4, 8, 8}));
  EXPECT_NE(g->Find("grad:relu"), kNoNode);
}

// Moves the nodes from index `before` on (appended to TinyModel's graph)
// ahead of its pooling, in their order, and pools `value` instead of r.
void FeedThePool(ModelMaker& m, int before, const std::string& value) {
  auto* nodes = m.graph()->mutable_node();
  const int added = nodes->size() - before;
  int pool = 0;
  while (nodes->Get(pool).op_type() != "GlobalAveragePool") ++pool;
  for (int k = 0; k < added; ++k) {
    for (int i = before + k; i > pool + k; --i) nodes->SwapElements(i, i - 1);
  }
  FindNode(m, "GlobalAveragePool")->set_input(0, value);
}

// Casts of computed tensors: a `cast` node to each type pebble has, its
// gradient cast back between floats; bool by a comparison with 0; a type
// pebble lacks refused, named.
TEST(OnnxImportTest, CastsOfComputedTensorsAreCastNodes) {
  const auto model = [](int to) {
    return TinyModel(13, "", [to](ModelMaker& m) {
      const int before = m.graph()->node_size();
      ModelMaker::IntAttr(m.Node("Cast", "/narrow/Cast", {"r"}, {"narrow"}), "to", to);
      ModelMaker::IntAttr(m.Node("Cast", "/wide/Cast", {"narrow"}, {"wide"}), "to",
                          onnx::TensorProto::FLOAT);
      m.Node("Add", "/add/Add", {"wide", "r"}, {"sum"});
      FeedThePool(m, before, "sum");
    });
  };
  auto g = Import(model(onnx::TensorProto::FLOAT16));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->op(g->Find("narrow")), "cast");
  EXPECT_EQ(*g->dtype(g->Find("narrow")), DType::kFloat16);
  EXPECT_EQ(g->op(g->Find("wide")), "cast");
  EXPECT_EQ(*g->dtype(g->Find("wide")), DType::kFloat32);
  ASSERT_NE(g->Find("grad:narrow"), kNoNode);
  EXPECT_EQ(g->op(g->Find("grad:narrow")), "cast");
  EXPECT_EQ(*g->dtype(g->Find("grad:narrow")), DType::kFloat16);

  // Truncated to int64: no gradient through the casts (r gets the add's).
  g = Import(model(onnx::TensorProto::INT64));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->dtype(g->Find("narrow")), DType::kInt64);
  EXPECT_EQ(g->Find("grad:narrow"), kNoNode);
  int casts = 0;
  for (NodeId v = 0; v < g->num_nodes(); ++v) casts += g->op(v) == "cast" ? 1 : 0;
  EXPECT_EQ(casts, 2);  // the forward's two
  EXPECT_NE(g->Find("grad:conv1.weight"), kNoNode);

  // To bool: 1 where not 0, a mask; then to float by a cast.
  g = Import(model(onnx::TensorProto::BOOL));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->op(g->Find("narrow")), "compare");
  EXPECT_EQ(g->attrs(g->Find("narrow"))["op"], "ne");
  EXPECT_EQ(g->op(g->Find("wide")), "cast");

  const absl::StatusOr<Graph> int32 = Import(model(onnx::TensorProto::INT32));
  ASSERT_FALSE(int32.ok());
  EXPECT_THAT(std::string(int32.status().message()),
              ::testing::AllOf(::testing::HasSubstr("/narrow/Cast"),
                               ::testing::HasSubstr("INT32")));
}

// Comparisons of computed tensors, Not, And, Cast of a mask to floats,
// Expand of a mask and Where: torch.where(r > 0.5, r, 0), a
// masked_fill by ~(r < 0.1) of -inf, a mask cast to float and multiplied
// in, and torch.where of two computed tensors under an and of masks.
TEST(OnnxImportTest, ComparisonsAndWhereOfComputedTensors) {
  const auto model = [](const std::function<void(ModelMaker&)>& more) {
    return TinyModel(13, "", [&](ModelMaker& m) {
      const int before = m.graph()->node_size();
      m.FloatVectorInitializer("onnx::half", {0.5f});
      m.FloatVectorInitializer("onnx::tenth", {0.1f});
      m.FloatVectorInitializer("onnx::zero", {0.0f});
      m.FloatVectorInitializer("onnx::neg_inf", {-INFINITY});
      m.Node("Greater", "/gt/Greater", {"r", "onnx::half"}, {"big"});
      m.Node("Where", "/where/Where", {"big", "r", "onnx::zero"}, {"kept"});
      m.Node("Less", "/lt/Less", {"kept", "onnx::tenth"}, {"small"});
      m.Node("Not", "/not/Not", {"small"}, {"not_small"});
      m.Node("Where", "/fill/Where", {"not_small", "onnx::neg_inf", "kept"}, {"filled"});
      ModelMaker::IntAttr(m.Node("Cast", "/cast/Cast", {"big"}, {"big_f"}), "to",
                          onnx::TensorProto::FLOAT);
      m.Node("Mul", "/mul/Mul", {"big_f", "filled"}, {"gated"});
      m.Node("And", "/and/And", {"big", "not_small"}, {"both"});
      m.Node("Where", "/pick/Where", {"both", "gated", "r"}, {"picked"});
      if (more) more(m);
      FeedThePool(m, before, m.graph()->node(m.graph()->node_size() - 1).output(0));
    });
  };
  auto g = Import(model(nullptr));
  ASSERT_TRUE(g.ok()) << g.status();
  const auto op = [&](const char* id) { return g->op(g->Find(id)); };
  const auto attrs = [&](const char* id) { return g->attrs(g->Find(id)); };
  EXPECT_EQ(op("gt"), "compare");
  EXPECT_EQ(attrs("gt")["op"], "gt");
  EXPECT_EQ(g->dtype(g->Find("gt")), DType::kUInt8);
  EXPECT_EQ(op("where"), "masked_fill");  // r where big, else 0: fill where not
  EXPECT_EQ(attrs("where")["invert"], true);
  EXPECT_EQ(attrs("where")["value"], 0.0);
  EXPECT_EQ(op("not"), "compare");
  EXPECT_EQ(attrs("not")["op"], "eq");
  EXPECT_EQ(op("fill"), "masked_fill");
  EXPECT_EQ(attrs("fill")["value"], "-inf");  // JSON has no infinities
  EXPECT_EQ(attrs("fill")["invert"], false);
  EXPECT_EQ(op("cast"), "cast");  // 0 and 1
  EXPECT_EQ(attrs("cast")["dtype"], "fp32");
  EXPECT_EQ(attrs("and")["op"], "and");
  EXPECT_EQ(op("pick"), "add");  // each side with the other's elements -0.0
  EXPECT_EQ(op("pick.then"), "masked_fill");
  EXPECT_EQ(op("pick.else"), "masked_fill");
  for (const char* side : {"pick.then", "pick.else"}) {
    const double fill = attrs(side)["value"].get<double>();
    EXPECT_TRUE(fill == 0.0 && std::signbit(fill)) << side << ": " << fill;
  }
  EXPECT_EQ(*g->shape(g->Find("pick")), (Shape{2, 4, 8, 8}));
  // Gradients reach r through every masked_fill (the masks get none).
  EXPECT_NE(g->Find("grad:relu"), kNoNode);
  EXPECT_EQ(g->Find("grad:gt"), kNoNode);

  // Expand of a mask: or-ed into false values of the larger shape.
  g = Import(model([](ModelMaker& m) {
    m.IntInitializer("shape", {2, 2, 4, 8, 8});
    m.Node("Expand", "/expand/Expand", {"both", "shape"}, {"wide"});
    m.Node("Where", "/wide/Where", {"wide", "onnx::zero", "picked"}, {"wide_picked"});
    m.IntInitializer("axes", {0});
    ModelMaker::IntAttr(m.Node("ReduceSum", "/sum/ReduceSum", {"wide_picked", "axes"}, {"summed"}),
                        "keepdims", 0);
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(op("expand"), "compare");
  EXPECT_EQ(attrs("expand")["op"], "or");
  EXPECT_EQ(*g->shape(g->Find("expand")), (Shape{2, 2, 4, 8, 8}));
  EXPECT_EQ(*g->shape(g->Find("wide")), (Shape{2, 2, 4, 8, 8}));  // picked, broadcast

  // torch.where(mask, 0.0, -inf) of two constants; the same scalar read by
  // a Mul first (made a fill then) and compared with after; a strided slice
  // of a mask over an odd count; a computed side broadcast over dims that
  // are not one block ((2, 1, 8, 1) against (2, 4, 8, 8)).
  g = Import(model([](ModelMaker& m) {
    m.FloatVectorInitializer("onnx::zero_f", {0.0f});
    m.Node("Where", "/additive/Where", {"both", "onnx::zero_f", "onnx::neg_inf"}, {"additive"});
    m.Node("Mul", "/scaled/Mul", {"picked", "onnx::half"}, {"scaled"});
    m.Node("Less", "/again/Less", {"scaled", "onnx::half"}, {"again"});
    m.IntInitializer("s_starts", {1});
    m.IntInitializer("s_ends", {100});
    m.IntInitializer("s_axes", {3});
    m.IntInitializer("s_steps", {3});
    m.Node("Slice", "/thin/Slice", {"again", "s_starts", "s_ends", "s_axes", "s_steps"},
           {"thin"});
    ModelMaker::IntAttr(m.Node("ReduceMean", "/col/ReduceMean", {"scaled"}, {"col"}), "keepdims",
                        1);
    ModelMaker::IntsAttr(FindNode(m, "ReduceMean"), "axes", {1, 3});
    m.Node("Where", "/wide/Where", {"again", "col", "additive"}, {"wide"});
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(attrs("additive.else")["value"], "-inf");  // the else side, a fill
  EXPECT_EQ(attrs("additive")["value"], 0.0);
  EXPECT_EQ(op("again"), "compare");
  EXPECT_EQ(*g->shape(g->Find("thin")), (Shape{2, 4, 8, 3}));  // columns 1, 4, 7 of the mask
  EXPECT_EQ(g->dtype(g->Find("thin")), DType::kUInt8);
  EXPECT_EQ(*g->shape(g->Find("wide")), (Shape{2, 4, 8, 8}));

  // What is refused, naming the node.
  const struct {
    std::function<void(ModelMaker&)> edit;
    std::vector<std::string> needles;
  } refused[] = {
      {[](ModelMaker& m) {
         m.IntInitializer("onnx::huge", {(int64_t{1} << 53) + 1});
         m.Node("Greater", "/huge/Greater", {"r", "onnx::huge"}, {"bad"});
       },
       {"'/huge/Greater'", "9007199254740993", "beyond 2^53"}},
      {[](ModelMaker& m) { m.Node("Not", "/bad/Not", {"r"}, {"bad"}); },
       {"'/bad/Not'", "boolean computed by a comparison"}},
      {[](ModelMaker& m) { m.Node("Or", "/bad/Or", {"r", "big"}, {"bad"}); },
       {"'/bad/Or'", "'r'", "not a boolean"}},
      {[](ModelMaker& m) {
         ModelMaker::IntAttr(m.Node("Cast", "/bad/Cast", {"r"}, {"bad"}), "to",
                             onnx::TensorProto::INT32);
       },
       {"'/bad/Cast'", "INT32", "no pebble dtype"}},
  };
  for (const auto& c : refused) {
    g = Import(model(c.edit));
    ASSERT_FALSE(g.ok());
    for (const std::string& needle : c.needles) {
      EXPECT_NE(g.status().message().find(needle), std::string::npos) << g.status();
    }
  }
}

// Max and Min of computed tensors (torch.maximum, torch.minimum, a clamp
// by a constant written as Max), of three operands and of one, folded over
// integer shapes; Sign written into zeros by two masks.
TEST(OnnxImportTest, MaxMinAndSignOfComputedTensors) {
  const auto model = [](const std::function<void(ModelMaker&)>& more) {
    return TinyModel(13, "", [&](ModelMaker& m) {
      const int before = m.graph()->node_size();
      m.FloatVectorInitializer("onnx::half", {0.5f});
      m.Initializer("channel_scale", {4, 1, 1});
      m.Node("Max", "/floor/Max", {"r", "onnx::half"}, {"floored"});
      m.Node("Mul", "/scaled/Mul", {"r", "channel_scale"}, {"scaled"});
      m.Node("Min", "/low/Min", {"floored", "scaled"}, {"low"});
      m.Node("Max", "/three/Max", {"low", "r", "scaled"}, {"three"});
      m.Node("Max", "/one/Max", {"three"}, {"one"});
      m.Node("Sign", "/sign/Sign", {"scaled"}, {"sign"});
      m.Node("Mul", "/signed/Mul", {"one", "sign"}, {"signed"});
      m.Node("Shape", "/shape/Shape", {"signed"}, {"dims"});
      m.IntInitializer("onnx::ones", {1});
      m.Node("Max", "/dims_max/Max", {"dims", "onnx::ones"}, {"dims_max"});
      m.Node("Reshape", "/same/Reshape", {"signed", "dims_max"}, {"same"});
      if (more) more(m);
      FeedThePool(m, before, m.graph()->node(m.graph()->node_size() - 1).output(0));
    });
  };
  auto g = Import(model(nullptr));
  ASSERT_TRUE(g.ok()) << g.status();
  const auto op = [&](const char* id) { return g->op(g->Find(id)); };
  EXPECT_EQ(op("floor"), "maximum");
  EXPECT_EQ(op("floor.operand1"), "fill");  // the constant, then expanded to r's shape
  EXPECT_EQ(*g->shape(g->Find("floor.operand1_expanded")), (Shape{2, 4, 8, 8}));
  EXPECT_EQ(op("low"), "minimum");
  EXPECT_EQ(op("three.maximum1"), "maximum");  // pairwise from the left
  EXPECT_EQ(op("three"), "maximum");
  EXPECT_EQ(g->Find("one"), kNoNode);  // Max of one operand is the operand
  EXPECT_EQ(op("sign"), "masked_fill");
  EXPECT_EQ(g->attrs(g->Find("sign"))["value"], -1.0);
  EXPECT_EQ(g->attrs(g->Find("sign.ones"))["value"], 1.0);
  EXPECT_EQ(*g->shape(g->Find("same")), (Shape{2, 4, 8, 8}));  // the folded dims
  // Each computed operand gets a gradient through the extrema (the
  // constant's fill none): r's through floor's a, both of low's and of
  // three's two maxima.
  EXPECT_NE(g->Find("grad:channel_scale"), kNoNode);
  std::map<std::string, int> backwards;
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    if (absl::StrContains(g->op(v), "imum_backward")) {
      ++backwards[absl::StrCat(g->op(v), g->attrs(v)["input"].get<int>())];
    }
  }
  EXPECT_EQ(backwards, (std::map<std::string, int>{{"maximum_backward0", 3},
                                                   {"maximum_backward1", 2},
                                                   {"minimum_backward0", 1},
                                                   {"minimum_backward1", 1}}));

  const struct {
    std::function<void(ModelMaker&)> edit;
    std::vector<std::string> needles;
  } refused[] = {
      {[](ModelMaker& m) { m.Node("Min", "/consts/Min", {"onnx::half", "onnx::half"}, {"bad"}); },
       {"'/consts/Min'", "float constants"}},
      {[](ModelMaker& m) {
         m.Initializer("wrong", {3, 1, 1});
         m.Node("Max", "/wrong/Max", {"r", "wrong"}, {"bad"});
       },
       {"'/wrong/Max'", "do not broadcast"}},
      {[](ModelMaker& m) {
         m.IntInitializer("onnx::three", {1, 2, 3});
         m.Node("Max", "/ints/Max", {"dims", "onnx::three"}, {"bad"});
       },
       {"'/ints/Max'", "of 3 and 4 values"}},
  };
  for (const auto& c : refused) {
    g = Import(model(c.edit));
    ASSERT_FALSE(g.ok());
    for (const std::string& needle : c.needles) {
      EXPECT_NE(g.status().message().find(needle), std::string::npos) << g.status();
    }
  }
}

// ONNX's LSTM, GRU and RNN unrolled over the sequence: the tiny model's
// relu viewed as (sequence 8, batch 8, features 8) and read by one
// bidirectional layer of each kind: each step's nodes, the outputs' shapes,
// and what is refused.
TEST(OnnxImportTest, RecurrentLayersUnrollOverTheSequence) {
  using Edit = std::function<void(ModelMaker&, onnx::NodeProto*)>;
  const auto model = [](const std::string& op, int gates, const Edit& edit) {
    return TinyModel(13, "", [=](ModelMaker& m) {
      const int before = m.graph()->node_size();
      m.IntInitializer("seq_shape", {8, 8, 8});
      m.Node("Reshape", "/seq/Reshape", {"r", "seq_shape"}, {"seq"});
      m.Initializer("W", {2, gates * 3, 8});
      m.Initializer("R", {2, gates * 3, 3});
      m.Initializer("B", {2, 2 * gates * 3});
      auto* n = m.Node(op, "/rnn/" + op, {"seq", "W", "R", "B"}, {"Y", "Y_h"});
      ModelMaker::IntAttr(n, "hidden_size", 3);
      ModelMaker::StringAttr(n, "direction", "bidirectional");
      if (edit) edit(m, n);
      m.IntInitializer("back_shape", {2, 4, 8, 6});  // Y (8, 2, 8, 3), as the pool reads it
      m.Node("Reshape", "/back/Reshape", {"Y", "back_shape"}, {"back"});
      FeedThePool(m, before, "back");
    });
  };
  for (const auto& [op, gates] : {std::pair{"LSTM", 4}, {"GRU", 3}, {"RNN", 1}}) {
    auto g = Import(model(op, gates, [op = op](ModelMaker&, onnx::NodeProto* n) {
      if (std::string(op) == "GRU") ModelMaker::IntAttr(n, "linear_before_reset", 1);
    }));
    ASSERT_TRUE(g.ok()) << op << ": " << g.status();
    EXPECT_EQ(*g->shape(g->Find("rnn")), (Shape{8, 2, 8, 3})) << op;  // Y
    EXPECT_EQ(g->op(g->Find("rnn")), "concat") << op;                   // of the directions
    EXPECT_EQ(*g->shape(g->Find("rnn.d1_xw")), (Shape{8, 8, 3 * gates})) << op;
    // The reverse direction starts at the last step; the forward one's
    // first step reads zeros.
    EXPECT_NE(g->Find("rnn.d1_t7_hr"), kNoNode) << op;
    EXPECT_EQ(g->op(g->Find("rnn.d0_t0_hr")), "linear") << op;
    EXPECT_EQ(g->id(g->inputs(g->Find("rnn.d0_t0_hr"))[0]), "rnn.h0_0") << op;
    EXPECT_EQ(g->op(g->Find("rnn.h0_0")), "fill") << op;
    EXPECT_EQ(g->Find("rnn.Y_h"), kNoNode) << op;  // nothing reads Y_h
    EXPECT_NE(g->Find("grad:W"), kNoNode) << op;
  }
  const struct {
    const char* why;
    Edit edit;
    std::vector<std::string> needles;
  } refused[] = {
      {"a clip", [](ModelMaker&, onnx::NodeProto* n) { ModelMaker::FloatAttr(n, "clip", 3.0f); },
       {"'/rnn/LSTM'", "clip"}},
      {"batch first", [](ModelMaker&, onnx::NodeProto* n) { ModelMaker::IntAttr(n, "layout", 1); },
       {"'/rnn/LSTM'", "layout = 1"}},
      {"shorter sequences",
       [](ModelMaker& m, onnx::NodeProto* n) {
         m.IntInitializer("lens", {8, 8, 8, 8, 8, 8, 8, 5});
         n->add_input("lens");
       },
       {"'/rnn/LSTM'", "sequence_lens holds 5"}},
      {"peepholes",
       [](ModelMaker& m, onnx::NodeProto* n) {
         m.Initializer("P", {2, 9});
         for (const char* in : {"", "", "", "P"}) n->add_input(in);
       },
       {"'/rnn/LSTM'", "peephole"}},
  };
  for (const auto& c : refused) {
    auto g = Import(model("LSTM", 4, c.edit));
    ASSERT_FALSE(g.ok()) << c.why;
    for (const std::string& needle : c.needles) {
      EXPECT_NE(g.status().message().find(needle), std::string::npos) << c.why << ": "
                                                                      << g.status();
    }
  }
}

// ReduceL2 (x.norm(dim), F.normalize): the square root of a sum of
// squares, taken of 1 where the sum is 0 and set to 0 there (its gradient
// 0, as PyTorch's norm), with and without keepdims.
TEST(OnnxImportTest, ReduceL2IsARootOfSquaresWithZeroRowsMasked) {
  for (const int64_t keepdims : {1, 0}) {
    auto g = Import(TinyModel(13, "", [=](ModelMaker& m) {
      const int before = m.graph()->node_size();
      // Over the last dim, kept: the rows as they are; over dim 1, not
      // kept: moved last, and the result viewed back.
      auto* n = m.Node("ReduceL2", "/norm/ReduceL2", {"r"}, {"norms"});
      ModelMaker::IntsAttr(n, "axes", {keepdims ? 3 : 1});
      ModelMaker::IntAttr(n, "keepdims", keepdims);
      std::string divisor = "norms";
      if (keepdims == 0) {
        m.IntInitializer("back", {2, 1, 8, 8});
        m.Node("Reshape", "/back/Reshape", {"norms", "back"}, {"kept"});
        divisor = "kept";
      }
      m.Node("Div", "/unit/Div", {"r", divisor}, {"unit"});
      FeedThePool(m, before, "unit");
    }));
    ASSERT_TRUE(g.ok()) << keepdims << ": " << g.status();
    EXPECT_EQ(g->op(g->Find("norm.squares")), "mul");
    EXPECT_EQ(g->op(g->Find("norm.empty")), "compare");
    EXPECT_EQ(g->op(g->Find("norm.root")), "sqrt");
    EXPECT_EQ(*g->shape(g->Find("norm")), keepdims ? (Shape{2, 4, 8, 1}) : (Shape{2, 8, 8}));
    EXPECT_EQ(g->op(g->Find("norm")), keepdims ? "masked_fill" : "reshape");
  }
}

// Pow by the exponents ATen computes by products, a root and a
// reciprocal; other exponents are refused naming the node.
TEST(OnnxImportTest, PowByTheExponentsATenComputes) {
  const auto model = [](float exponent) {
    return TinyModel(13, "", [=](ModelMaker& m) {
      const int before = m.graph()->node_size();
      m.FloatVectorInitializer("onnx::exponent", {exponent});
      m.Node("Pow", "/pow/Pow", {"r", "onnx::exponent"}, {"powered"});
      FeedThePool(m, before, "powered");
    });
  };
  const struct {
    float exponent;
    std::vector<std::pair<std::string, std::string>> nodes;  // id, op
  } cases[] = {{3.0f, {{"pow.square", "mul"}, {"pow", "mul"}}},
               {-0.5f, {{"pow.sqrt", "sqrt"}, {"pow", "div"}}},
               {-1.0f, {{"pow.one", "fill"}, {"pow", "div"}}},
               {-2.0f, {{"pow.square", "mul"}, {"pow", "div"}}},
               {2.0f, {{"pow", "mul"}}},
               {0.5f, {{"pow", "sqrt"}}},
               // Other integers by squaring (x^4 = (x^2)^2, x^13 = x x^4 x^8).
               {4.0f, {{"pow.square", "mul"}, {"pow", "mul"}}},
               {13.0f, {{"pow.square", "mul"}, {"pow.pow4", "mul"}, {"pow.pow8", "mul"},
                        {"pow.product1", "mul"}, {"pow", "mul"}}},
               {-3.0f, {{"pow.square", "mul"}, {"pow.product1", "mul"}, {"pow", "div"}}},
               {0.0f, {{"pow.ones", "fill"}}}};
  for (const auto& c : cases) {
    auto g = Import(model(c.exponent));
    ASSERT_TRUE(g.ok()) << c.exponent << ": " << g.status();
    for (const auto& [id, op] : c.nodes) {
      ASSERT_NE(g->Find(id), kNoNode) << c.exponent << ": " << id;
      EXPECT_EQ(g->op(g->Find(id)), op) << c.exponent << ": " << id;
    }
  }
  // x ** 1 is x: the pool reads the relu.
  auto g = Import(model(1.0f));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->Find("pow"), kNoNode);
  // Another exponent of the relu (which may be 0) is refused, naming it;
  // of a sigmoid (positive) it is exp(p log x) (Note [Pow of a positive base]).
  for (const float exponent : {2.5f, 17.0f}) {
    g = Import(model(exponent));
    ASSERT_FALSE(g.ok()) << exponent;
    EXPECT_THAT(g.status().message(),
                AllOf(HasSubstr("'/pow/Pow'"), HasSubstr("an integer of -16 to 16"),
                      HasSubstr("'r' is not known to be")));
  }
  g = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.FloatVectorInitializer("onnx::exponent", {2.5f});
    m.Node("Sigmoid", "/Sigmoid", {"r"}, {"squashed"});
    m.Node("Pow", "/pow/Pow", {"squashed", "onnx::exponent"}, {"powered"});
    FeedThePool(m, before, "powered");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->op(g->Find("pow")), "exp");
  EXPECT_EQ(g->op(g->Find("pow.log")), "log");
  EXPECT_EQ(g->op(g->Find("pow.floored")), "clip");  // (a sigmoid may round to 0)
  EXPECT_EQ(g->attrs(g->Find("pow.exponent"))["value"], 2.5);
}

// GeM pooling (Radenović et al.): a learnable exponent p of a base clamped
// positive, the window's mean raised to 1/p: exp(p log x) both times, the
// gradient reaching p.
TEST(OnnxImportTest, GemPoolingTrainsItsExponent) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.FloatVectorInitializer("gem.p", {3.0f});
    m.FloatVectorInitializer("onnx::eps", {1e-6f});
    m.graph()->mutable_initializer()->rbegin()->clear_dims();  // a scalar
    m.Node("Clip", "/gem/Clip", {"r", "onnx::eps"}, {"clamped"});
    m.Node("Pow", "/gem/Pow", {"clamped", "gem.p"}, {"powered"});
    m.Node("Reciprocal", "/gem/Reciprocal", {"gem.p"}, {"inverse"});
    FeedThePool(m, before, "powered");
    m.Node("Pow", "/gem/Pow_1", {"p", "inverse"}, {"rooted"});
    FindNode(m, "Flatten")->set_input(0, "rooted");
    auto* nodes = m.graph()->mutable_node();  // the root before the Flatten
    for (int i = nodes->size() - 1; nodes->Get(i - 1).op_type() != "GlobalAveragePool"; --i) {
      nodes->SwapElements(i, i - 1);
    }
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_NE(g->Find("grad:gem.p"), kNoNode);
  EXPECT_EQ(g->op(g->Find("rooted")), "exp");
}

// Slices with steps of a computed tensor: r[:, :, ::2] (a view as (4, 2),
// the first of each pair kept), r[:, :, 1::3] of 8 (1 and 4 so, then 7,
// whose run of 3 passes the end, on its own), and negative steps: a `flip`
// first, then the positive step's cut in the reversed coordinates.
TEST(OnnxImportTest, StridedSlicesOfComputedTensors) {
  const auto model = [](std::vector<int64_t> starts, std::vector<int64_t> steps,
                        std::vector<int64_t> ends = {100, 100}) {
    return TinyModel(13, "", [=](ModelMaker& m) {
      const int before = m.graph()->node_size();
      m.IntInitializer("starts", starts);
      m.IntInitializer("ends", ends);
      m.IntInitializer("axes", {2, 3});
      m.IntInitializer("steps", steps);
      m.Node("Slice", "/s/Slice", {"r", "starts", "ends", "axes", "steps"}, {"strided"});
      FeedThePool(m, before, "strided");
    });
  };
  auto g = Import(model({0, 1}, {2, 3}));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->shape(g->Find("s")), (Shape{2, 4, 4, 3}));  // 8 / 2; 1, 4, 7 of 8
  EXPECT_EQ(*g->shape(g->Find("s.2_step_grouped")), (Shape{2, 4, 4, 2, 8}));
  EXPECT_EQ(*g->shape(g->Find("s.step_run")), (Shape{2, 4, 4, 6}));  // columns 1 to 6
  EXPECT_EQ(*g->shape(g->Find("s.step_grouped")), (Shape{2, 4, 4, 2, 3}));
  EXPECT_EQ(*g->shape(g->Find("s.step_kept")), (Shape{2, 4, 4, 2}));   // 1 and 4
  EXPECT_EQ(*g->shape(g->Find("s.step_last")), (Shape{2, 4, 4, 1}));   // 7: its run passes 8
  EXPECT_EQ(g->op(g->Find("s")), "concat");
  EXPECT_NE(g->Find("grad:relu"), kNoNode);
  // torch.flip(r, [3]) as PyTorch exports it: from -1 to -INT64_MAX by -1.
  const int64_t far = -std::numeric_limits<int64_t>::max();
  g = Import(model({0, -1}, {1, -1}, {100, far}));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->op(g->Find("s")), "flip");
  EXPECT_EQ(g->attrs(g->Find("s"))["dims"], nlohmann::json({3}));
  EXPECT_EQ(g->op(g->Find("grad:relu")), "flip");  // the gradient flipped back
  // r[:, :, ::-2, 5:1:-1]: rows 7, 5, 3, 1 and columns 5, 4, 3, 2, i.e.
  // rows 0, 2, 4, 6 and columns 2 to 5 of r flipped on both.
  g = Import(model({-1, 5}, {-2, -1}, {far, 1}));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->attrs(g->Find("s.reversed"))["dims"], nlohmann::json({2, 3}));
  EXPECT_EQ(*g->shape(g->Find("s")), (Shape{2, 4, 4, 4}));
  EXPECT_EQ(g->attrs(g->Find("s"))["begin"], 2);
  EXPECT_EQ(g->attrs(g->Find("s"))["end"], 6);
  // Nothing kept (from 1 up to 5 by -1) is refused.
  g = Import(model({0, 1}, {1, -1}, {100, 5}));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("is empty"), std::string::npos) << g.status();
}

// -x and torch.reciprocal: a mul by -1 and a div of 1; -x of a shape's
// integers folds.
TEST(OnnxImportTest, NegAndReciprocal) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.Node("Neg", "/neg/Neg", {"r"}, {"negated"});
    m.Node("Reciprocal", "/inv/Reciprocal", {"negated"}, {"inverted"});
    m.IntInitializer("two", {2});
    m.Node("Neg", "/bound/Neg", {"two"}, {"minus_two"});
    m.IntInitializer("big", {100});
    m.IntInitializer("axis3", {3});
    m.Node("Slice", "/tail/Slice", {"inverted", "minus_two", "big", "axis3"}, {"tail"});
    FeedThePool(m, before, "tail");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->op(g->Find("neg")), "mul");
  EXPECT_EQ(g->attrs(g->Find("neg.minus_one"))["value"], -1.0);
  EXPECT_EQ(g->op(g->Find("inv")), "div");
  EXPECT_EQ(g->id(g->inputs(g->Find("inv"))[1]), "neg");
  EXPECT_EQ(*g->shape(g->Find("tail")), (Shape{2, 4, 8, 2}));  // the last two columns
}

// nn.ELU(0.7), nn.SELU, nn.CELU(0.5) and F.softplus as pebble's elu and
// softplus (ATen's coefficients), nn.PReLU(4) (its slope unsqueezed to
// (4, 1, 1), as the export writes it) as relu(x) + slope (x - relu(x)), and
// torch.abs, exp and log as pebble's.
TEST(OnnxImportTest, SmoothActivationsAndPRelu) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    ModelMaker::FloatAttr(m.Node("Elu", "/elu/Elu", {"r"}, {"e"}), "alpha", 0.7f);
    m.Node("Selu", "/selu/Selu", {"e"}, {"s"});
    ModelMaker::FloatAttr(m.Node("Celu", "/celu/Celu", {"s"}, {"ce"}), "alpha", 0.5f);
    m.Node("Softplus", "/softplus/Softplus", {"ce"}, {"sp"});
    m.Initializer("prelu.weight", {4});
    m.IntInitializer("axes", {1, 2});
    m.Node("Unsqueeze", "/prelu/Unsqueeze", {"prelu.weight", "axes"}, {"slope"});
    m.Node("PRelu", "/prelu/PRelu", {"sp", "slope"}, {"pr"});
    m.Node("Abs", "/abs/Abs", {"pr"}, {"a"});
    m.Node("Exp", "/exp/Exp", {"a"}, {"ex"});
    m.Node("Log", "/log/Log", {"ex"}, {"lg"});
    FeedThePool(m, before, "lg");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* op : {"abs", "exp", "log"}) EXPECT_EQ(g->op(g->Find(op)), op);
  const auto attr = [&](const char* id, const char* name) {
    return g->attrs(g->Find(id))[name].get<double>();
  };
  EXPECT_EQ(g->op(g->Find("elu")), "elu");
  EXPECT_FLOAT_EQ(attr("elu", "alpha"), 0.7f);
  EXPECT_EQ(attr("elu", "scale"), 1.0);
  EXPECT_FLOAT_EQ(attr("selu", "alpha"), 1.6732632f);
  EXPECT_FLOAT_EQ(attr("selu", "scale"), 1.0507010f);
  EXPECT_FLOAT_EQ(attr("celu", "input_scale"), 2.0f);
  EXPECT_EQ(g->op(g->Find("softplus")), "softplus");
  EXPECT_EQ(attr("softplus", "threshold"), 20.0);
  const NodeId prelu = g->Find("prelu.prelu");
  ASSERT_NE(prelu, kNoNode);
  EXPECT_EQ(g->op(prelu), "add");
  EXPECT_EQ(g->op(g->Find("prelu.prelu.positive")), "relu");
  EXPECT_EQ(g->op(g->Find("prelu.prelu.negative")), "sub");
  EXPECT_EQ(*g->shape(prelu), (Shape{2, 4, 8, 8}));
  EXPECT_EQ(*g->shape(g->Find("grad:prelu.weight")), (Shape{4}));
  // A slope that x does not take is refused, naming the node.
  auto wide = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.Initializer("prelu.weight", {2, 4, 8, 8, 3});
    m.Node("PRelu", "/prelu/PRelu", {"r", "prelu.weight"}, {"pr"});
    FeedThePool(m, before, "pr");
  }));
  ASSERT_FALSE(wide.ok());
  EXPECT_THAT(wide.status().message(), HasSubstr("'/prelu/PRelu'"));
}

// x.sum(dim=1, keepdim=True) (ReduceSum, its axes an input from opset 13,
// an attribute before) as a gate, x.sum() over every dim, and
// nn.AdaptiveMaxPool2d(1) as GlobalMaxPool: a linear by a row of ones, and
// a max pool whose one window spans the map.
TEST(OnnxImportTest, ReduceSumAndGlobalMaxPool) {
  for (const int opset : {11, 13}) {
    auto g = Import(TinyModel(opset, "", [opset](ModelMaker& m) {
      const int before = m.graph()->node_size();
      onnx::NodeProto* sum = nullptr;
      if (opset >= 13) {
        m.IntInitializer("channel_axis", {1});
        sum = m.Node("ReduceSum", "/chan/ReduceSum", {"r", "channel_axis"}, {"chan"});
      } else {
        sum = m.Node("ReduceSum", "/chan/ReduceSum", {"r"}, {"chan"});
        ModelMaker::IntsAttr(sum, "axes", {1});
      }
      m.Node("Mul", "/gate/Mul", {"r", "chan"}, {"gated"});
      ModelMaker::IntAttr(m.Node("ReduceSum", "/all/ReduceSum", {"gated"}, {"all"}), "keepdims",
                          0);
      m.Node("Add", "/shift/Add", {"gated", "all"}, {"shifted"});
      m.Node("GlobalMaxPool", "/peak/GlobalMaxPool", {"shifted"}, {"peak"});
      m.Node("Add", "/both/Add", {"shifted", "peak"}, {"both"});
      FeedThePool(m, before, "both");
    }));
    ASSERT_TRUE(g.ok()) << "opset " << opset << ": " << g.status();
    EXPECT_EQ(*g->shape(g->Find("chan")), (Shape{2, 1, 8, 8})) << opset;
    EXPECT_EQ(g->attrs(g->Find("chan.sum_row"))["value"], 1.0) << opset;
    EXPECT_EQ(*g->shape(g->Find("all")), Shape{}) << opset;
    const NodeId peak = g->Find("peak");
    EXPECT_EQ(g->op(peak), "maxpool") << opset;
    EXPECT_EQ(g->attrs(peak)["kernel"], nlohmann::json({8, 8})) << opset;
    EXPECT_EQ(*g->shape(peak), (Shape{2, 4, 1, 1})) << opset;
    EXPECT_NE(g->Find("grad:conv1.weight"), kNoNode) << opset;
  }
  // noop_with_empty_axes and no axes: the input itself.
  auto noop = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    ModelMaker::IntAttr(m.Node("ReduceSum", "/same/ReduceSum", {"r"}, {"same"}),
                        "noop_with_empty_axes", 1);
    FeedThePool(m, before, "same");
  }));
  ASSERT_TRUE(noop.ok()) << noop.status();
  EXPECT_EQ(noop->Find("same"), kNoNode);
  EXPECT_EQ(noop->id(noop->inputs(noop->Find("avgpool"))[0]), "relu");
}

// DepthToSpace (mode DCR, ONNX's default; CRD is nn.PixelShuffle's, which
// import_check.py runs against PyTorch) and SpaceToDepth by 2 of the
// (2, 4, 8, 8) map: the 6-D view, the permutation and the view back of
// ONNX's definitions (np.reshape and np.transpose, which pebble's reshape
// and transpose are).
TEST(OnnxImportTest, DepthToSpaceAndSpaceToDepthAreOnnxsViewsAndPermutation) {
  struct Case {
    std::string op, mode;
    Shape blocks;
    std::vector<int64_t> perm;
    Shape out;
  };
  const std::vector<Case> cases = {
      {"DepthToSpace", "DCR", {2, 2, 2, 1, 8, 8}, {0, 3, 4, 1, 5, 2}, {2, 1, 16, 16}},
      {"DepthToSpace", "CRD", {2, 1, 2, 2, 8, 8}, {0, 1, 4, 2, 5, 3}, {2, 1, 16, 16}},
      {"SpaceToDepth", "", {2, 4, 4, 2, 4, 2}, {0, 3, 5, 1, 2, 4}, {2, 16, 4, 4}},
  };
  for (const Case& c : cases) {
    auto g = Import(TinyModel(13, "", [&c](ModelMaker& m) {
                      const int before = m.graph()->node_size();
                      auto* n = m.Node(c.op, "/blocks/" + c.op, {"r"}, {"moved"});
                      ModelMaker::IntAttr(n, "blocksize", 2);
                      if (!c.mode.empty()) ModelMaker::StringAttr(n, "mode", c.mode);
                      // Back to 4 channels for the model's classifier.
                      const std::string back =
                          c.op == "DepthToSpace" ? "SpaceToDepth" : "DepthToSpace";
                      ModelMaker::IntAttr(m.Node(back, "/back/" + back, {"moved"}, {"restored"}),
                                          "blocksize", 2);
                      FeedThePool(m, before, "restored");
                    }),
                    LossKind::kNone);
    ASSERT_TRUE(g.ok()) << c.op << " " << c.mode << ": " << g.status();
    const NodeId out = g->Find("blocks");
    ASSERT_NE(out, kNoNode);
    EXPECT_EQ(*g->shape(out), c.out) << c.op << c.mode;
    const NodeId moved = g->inputs(out)[0];
    EXPECT_EQ(g->op(moved), "transpose");
    EXPECT_EQ(g->attrs(moved)["perm"], nlohmann::json(c.perm)) << c.op << c.mode;
    EXPECT_EQ(*g->shape(g->inputs(moved)[0]), c.blocks) << c.op << c.mode;
  }
  auto odd = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    ModelMaker::IntAttr(m.Node("DepthToSpace", "/odd/DepthToSpace", {"r"}, {"moved"}),
                        "blocksize", 3);
    FeedThePool(m, before, "moved");
  }));
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(std::string(odd.status().message()),
              HasSubstr("blocksize 3 does not divide the channels of (2,4,8,8)"));
}

// ShuffleNet's channel shuffle as torch.onnx.export writes it: x.size()
// (Shape, Gather), the channels per group (Div), the new shape (Unsqueeze,
// Concat) folded into constants for Reshape; Transpose; a Split, a Slice
// of a shape vector, and the halves concatenated back in the other order.
std::string ShuffleModel(const std::function<void(ModelMaker&)>& edit = nullptr) {
  return TinyModel(13, "", [&](ModelMaker& m) {
    // r: (2, 4, 8, 8). Nodes go before the pool (topological order): they
    // are appended, then moved there.
    auto* nodes = m.graph()->mutable_node();
    const int before = nodes->size();
    m.ScalarIntInitializer("i0", 0);
    m.ScalarIntInitializer("i1", 1);
    m.ScalarIntInitializer("groups", 2);
    m.IntInitializer("axes0", {0});
    m.IntInitializer("two", {2});
    m.IntInitializer("four", {4});
    m.IntInitializer("flat", {2, -1, 8, 8});
    m.IntInitializer("sizes", {1, 3});
    m.Node("Shape", "/Shape", {"r"}, {"s"});
    m.Node("Gather", "/Gather", {"s", "i0"}, {"n"});
    m.Node("Gather", "/Gather_1", {"s", "i1"}, {"channels"});
    m.Node("Div", "/Div", {"channels", "groups"}, {"cpg"});
    m.Node("Unsqueeze", "/Unsqueeze", {"n", "axes0"}, {"n1"});
    m.Node("Unsqueeze", "/Unsqueeze_1", {"groups", "axes0"}, {"g1"});
    m.Node("Unsqueeze", "/Unsqueeze_2", {"cpg", "axes0"}, {"cpg1"});
    m.Node("Slice", "/Slice", {"s", "two", "four", "axes0"}, {"hw"});
    auto* cat = m.Node("Concat", "/Concat", {"n1", "g1", "cpg1", "hw"}, {"shape5"});
    ModelMaker::IntAttr(cat, "axis", 0);
    m.Node("Reshape", "/Reshape", {"r", "shape5"}, {"r5"});
    auto* t = m.Node("Transpose", "/Transpose", {"r5"}, {"t5"});
    ModelMaker::IntsAttr(t, "perm", {0, 2, 1, 3, 4});
    m.Node("Reshape", "/Reshape_1", {"t5", "flat"}, {"shuffled"});
    auto* split = m.Node("Split", "/Split", {"shuffled", "sizes"}, {"lo", "hi"});
    ModelMaker::IntAttr(split, "axis", 1);
    auto* back = m.Node("Concat", "/Concat_1", {"hi", "lo"}, {"swapped"});
    ModelMaker::IntAttr(back, "axis", 1);
    m.Node("Slice", "/Slice_1", {"swapped", "i0v", "four", "axes1"}, {"same"});
    m.IntInitializer("i0v", {0});
    m.IntInitializer("axes1", {1});
    FeedThePool(m, before, "same");
    if (edit) edit(m);
  });
}

// Mod of shape integers (newer exporters write it) folds like Div: the
// channels mod 5 (4) divided by the groups still shape the shuffle; Mod of
// a float tensor is refused, naming the node.
TEST(OnnxImportTest, ModOfShapeIntegersFolds) {
  auto with_mod = [](ModelMaker& m, const std::string& dividend, int64_t fmod) {
    m.ScalarIntInitializer("five", 5);
    auto* nodes = m.graph()->mutable_node();
    auto* mod = m.Node("Mod", "/Mod", {dividend, "five"}, {"cm"});
    ModelMaker::IntAttr(mod, "fmod", fmod);
    int div = 0;
    while (nodes->Get(div).op_type() != "Div") ++div;
    for (int i = nodes->size() - 1; i > div; --i) nodes->SwapElements(i, i - 1);
    nodes->Mutable(div + 1)->set_input(0, "cm");
  };
  for (int64_t fmod : {0, 1}) {
    auto g = Import(ShuffleModel([&](ModelMaker& m) { with_mod(m, "channels", fmod); }));
    ASSERT_TRUE(g.ok()) << g.status();
    const NodeId r5 = g->Find("reshape");
    ASSERT_NE(r5, kNoNode);
    EXPECT_EQ(*g->shape(r5), (Shape{2, 2, 2, 8, 8}));
    EXPECT_EQ(g->Find("mod"), kNoNode);
  }
  auto bad = Import(ShuffleModel([&](ModelMaker& m) { with_mod(m, "r", 0); }));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("/Mod"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("Mod of tensors"));
}

// F.pad as torch.onnx.export writes it: its pads (last dim first, (before,
// after) per dim) viewed as (dims, 2), reversed with a Slice of step -1,
// transposed and flattened into ONNX's order, all folded at import.
TEST(OnnxImportTest, PadsReversedAndTransposedFold) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    auto* nodes = m.graph()->mutable_node();
    const int before = nodes->size();
    m.IntInitializer("fpads", {1, 3, 2, 0, 0, 0, 0, 0});  // F.pad(r, (1, 3, 2, 0))
    m.IntInitializer("rows", {-1, 2});
    m.IntInitializer("start", {-1});
    m.IntInitializer("end", {-9223372036854775807});
    m.IntInitializer("axis0", {0});
    m.IntInitializer("back", {-1});
    m.IntInitializer("flat", {-1});
    m.Node("Reshape", "/Reshape_p", {"fpads", "rows"}, {"pairs"});
    m.Node("Slice", "/Slice_p", {"pairs", "start", "end", "axis0", "back"}, {"reversed"});
    auto* t = m.Node("Transpose", "/Transpose_p", {"reversed"}, {"columns"});
    ModelMaker::IntsAttr(t, "perm", {1, 0});
    m.Node("Reshape", "/Reshape_q", {"columns", "flat"}, {"onnx_pads"});
    m.Node("Pad", "/Pad", {"r", "onnx_pads"}, {"padded"});
    FeedThePool(m, before, "padded");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId pad = g->Find("pad");
  ASSERT_NE(pad, kNoNode);
  EXPECT_EQ(*g->shape(pad), (Shape{2, 4, 10, 12}));  // H + 2 + 0, W + 1 + 3
  EXPECT_EQ(g->attrs(pad)["pads"], nlohmann::json({1, 3, 2, 0, 0, 0, 0, 0}));  // F.pad order
}

// F.avg_pool2d(count_include_pad=False), padded, and in ceil mode
// (ResNet-D's AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)):
// avgpool without the padding in its divisor. Ceil mode with padding
// counted (PyTorch's default) is refused where it gives a larger output.
TEST(OnnxImportTest, AveragePoolsLeavingThePaddingOut) {
  const auto model = [](int64_t include_pad, int64_t pad, int64_t ceil) {
    return TinyModel(13, "", [=](ModelMaker& m) {
      const int before = m.graph()->node_size();
      auto* pool = m.Node("AveragePool", "/pool/AveragePool", {"r"}, {"pooled"});
      ModelMaker::IntsAttr(pool, "kernel_shape", {3, 3});
      ModelMaker::IntsAttr(pool, "strides", {2, 2});
      ModelMaker::IntsAttr(pool, "pads", {pad, pad, pad, pad});
      ModelMaker::IntAttr(pool, "ceil_mode", ceil);
      ModelMaker::IntAttr(pool, "count_include_pad", include_pad);
      FeedThePool(m, before, "pooled");
    });
  };
  auto padded = Import(model(0, 1, 0));
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(padded->attrs(padded->Find("pool"))["count_include_pad"], false);
  EXPECT_EQ(*padded->shape(padded->Find("pool")), (Shape{2, 4, 4, 4}));
  auto ceil = Import(model(0, 1, 1));  // 8 + 2 - 3 = 7: ceil 5 windows, floor 4
  ASSERT_TRUE(ceil.ok()) << ceil.status();
  EXPECT_EQ(ceil->attrs(ceil->Find("pool"))["ceil_mode"], true);
  EXPECT_EQ(*ceil->shape(ceil->Find("pool")), (Shape{2, 4, 5, 5}));
  auto unpadded_ceil = Import(model(1, 0, 1));  // 8 - 3 = 5: ceil 4, floor 3
  ASSERT_TRUE(unpadded_ceil.ok()) << unpadded_ceil.status();
  EXPECT_EQ(unpadded_ceil->attrs(unpadded_ceil->Find("pool"))["count_include_pad"], false);
  auto counted = Import(model(1, 1, 1));
  ASSERT_FALSE(counted.ok());
  EXPECT_THAT(counted.status().message(),
              AllOf(HasSubstr("'/pool/AveragePool'"), HasSubstr("ceil_mode")));
  // PyTorch's export of avg_pool2d(x, 2, 3, padding=1, ceil_mode=True): a
  // Pad of zeros and a pool whose ceil mode gives 4 windows over the 10
  // where PyTorch's gives 3. The file cannot tell it from a user's F.pad,
  // so it imports, with a note.
  const std::string exported = TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.IntInitializer("pads", {0, 0, 1, 1, 0, 0, 1, 1});
    m.Node("Pad", "/Pad", {"r", "pads"}, {"padded"});
    auto* pool = m.Node("AveragePool", "/AveragePool", {"padded"}, {"pooled"});
    ModelMaker::IntsAttr(pool, "kernel_shape", {2, 2});
    ModelMaker::IntsAttr(pool, "strides", {3, 3});
    ModelMaker::IntAttr(pool, "ceil_mode", 1);
    FeedThePool(m, before, "pooled");
  });
  std::vector<std::string> notes;
  auto noted = ImportOnnxModel(exported, "tiny", OnnxImportOptions(), &notes);
  ASSERT_TRUE(noted.ok()) << noted.status();
  EXPECT_EQ(*noted->shape(noted->Find("averagepool")), (Shape{2, 4, 4, 4}));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], AllOf(HasSubstr("'/AveragePool'"), HasSubstr("gives 4 windows"),
                              HasSubstr("PyTorch's pool gives 3")));
  auto plain = Import(model(1, 1, 0));  // PyTorch's default
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->attrs(plain->Find("pool")).contains("count_include_pad"));
}

// x.max(dim=1, keepdim=True) (ReduceMax), x.repeat(1, 4, 1, 1) (Tile) and
// x.min(dim=3, keepdim=True) (ReduceMin): a max pool with one window over
// the reduced dim viewed last, a concat of copies, and the max of -x
// negated.
TEST(OnnxImportTest, ReduceMaxReduceMinAndTile) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    auto* rmax = m.Node("ReduceMax", "/rmax/ReduceMax", {"r"}, {"peak"});
    ModelMaker::IntsAttr(rmax, "axes", {1});
    m.IntInitializer("repeats", {1, 4, 1, 1});
    m.Node("Tile", "/tile/Tile", {"peak", "repeats"}, {"tiled"});
    auto* rmin = m.Node("ReduceMin", "/rmin/ReduceMin", {"tiled"}, {"least"});
    ModelMaker::IntsAttr(rmin, "axes", {-1});
    FeedThePool(m, before, "least");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->shape(g->Find("rmax")), (Shape{2, 1, 8, 8}));
  const NodeId max = g->Find("rmax.max");
  ASSERT_NE(max, kNoNode);
  EXPECT_EQ(g->op(max), "maxpool");
  EXPECT_EQ(g->attrs(max)["kernel"], nlohmann::json({1, 4}));
  EXPECT_EQ(g->op(g->Find("rmax.reduced_last")), "transpose");
  const NodeId tile = g->Find("tile");
  EXPECT_EQ(g->op(tile), "concat");
  EXPECT_EQ(g->inputs(tile).size(), 4u);
  EXPECT_EQ(*g->shape(tile), (Shape{2, 4, 8, 8}));
  EXPECT_EQ(g->op(g->Find("rmin")), "mul");
  EXPECT_EQ(g->op(g->Find("rmin.negated")), "mul");
  EXPECT_EQ(g->attrs(g->Find("rmin.max"))["kernel"], nlohmann::json({1, 8}));
  EXPECT_EQ(*g->shape(g->Find("rmin")), (Shape{2, 4, 8, 1}));
  // x.numel() (ReduceProd of Shape(x), keepdims 0) folds: a Reshape reads it.
  auto numel = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.Node("Shape", "/Shape", {"r"}, {"dims"});
    ModelMaker::IntAttr(m.Node("ReduceProd", "/ReduceProd", {"dims"}, {"count"}), "keepdims", 0);
    m.IntInitializer("zero", {0});
    m.Node("Unsqueeze", "/Unsqueeze", {"count", "zero"}, {"flat_shape"});
    m.Node("Reshape", "/flat/Reshape", {"r", "flat_shape"}, {"flat"});
    m.IntInitializer("back", {2, 4, 8, 8});
    m.Node("Reshape", "/back/Reshape", {"flat", "back"}, {"unflat"});
    FeedThePool(m, before, "unflat");
  }));
  ASSERT_TRUE(numel.ok()) << numel.status();
  EXPECT_EQ(*numel->shape(numel->Find("flat")), (Shape{512}));
  // A repeat of 0 (an empty tensor) is refused, naming the node.
  auto empty = Import(TinyModel(13, "", [](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.IntInitializer("repeats", {1, 0, 1, 1});
    m.Node("Tile", "/tile/Tile", {"r", "repeats"}, {"tiled"});
    FeedThePool(m, before, "tiled");
  }));
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), AllOf(HasSubstr("'/tile/Tile'"), HasSubstr("repeats 0")));
}

// nn.BatchNorm2d(affine=False) as the export writes it: its weight and bias
// Constant ones and zeros, which become fills (no parameter, no gradient).
TEST(OnnxImportTest, BatchNormWithoutAffineParameters) {
  const auto model = [](float weight) {
    return TinyModel(13, "", [weight](ModelMaker& m) {
      for (int i : {1, 2}) {
        const std::string name = i == 1 ? "/bn1/Constant" : "/bn1/Constant_1";
        auto* constant = m.Node("Constant", name, {}, {name + "_output_0"});
        auto* value = constant->add_attribute();
        value->set_name("value");
        value->set_type(onnx::AttributeProto::TENSOR);
        value->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
        value->mutable_t()->add_dims(4);
        for (int c = 0; c < 4; ++c) value->mutable_t()->add_float_data(i == 1 ? weight : 0.0f);
        MoveFirst(m, {name});
        FindNode(m, "BatchNormalization")->set_input(i, name + "_output_0");
      }
    });
  };
  auto g = Import(model(1.0f));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId weight = g->Find("bn1.unit_weight"), bias = g->Find("bn1.zero_bias");
  ASSERT_NE(weight, kNoNode);
  ASSERT_NE(bias, kNoNode);
  EXPECT_EQ(g->op(weight), "fill");
  EXPECT_EQ(g->attrs(weight)["value"], 1.0);
  EXPECT_EQ(g->attrs(bias)["value"], 0.0);
  EXPECT_EQ(*g->dtype(weight), DType::kFloat32);
  EXPECT_EQ(g->Find("grad:bn1.weight"), kNoNode);
  EXPECT_NE(g->Find("grad:conv1.weight"), kNoNode);
  // Another constant weight is a `constant` node of its values (until
  // 2026-12-07 refused): still no parameter.
  auto scaled = Import(model(2.0f));
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  const NodeId constant = scaled->Find("/bn1/Constant_output_0");
  ASSERT_NE(constant, kNoNode);
  EXPECT_EQ(scaled->op(constant), "constant");
  EXPECT_EQ(scaled->Find("grad:bn1.weight"), kNoNode);
}

// A Constant node of `dims` and `type` holding `values` (row-major; bools
// as 0 and 1), named `name`, its output `name` + "_output_0", first.
std::string AddConstant(ModelMaker& m, const std::string& name, std::vector<int64_t> dims,
                        int type, const std::vector<double>& values) {
  auto* constant = m.Node("Constant", name, {}, {name + "_output_0"});
  auto* value = constant->add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  onnx::TensorProto* t = value->mutable_t();
  t->set_data_type(type);
  for (int64_t d : dims) t->add_dims(d);
  for (double v : values) {
    if (type == onnx::TensorProto::FLOAT) t->add_float_data(static_cast<float>(v));
    if (type == onnx::TensorProto::BOOL) t->add_int32_data(v != 0);
    if (type == onnx::TensorProto::INT64) t->add_int64_data(static_cast<int64_t>(v));
    // (bit patterns, one in each int32, as ONNX stores them)
    if (type == onnx::TensorProto::FLOAT16) t->add_int32_data(FloatToHalf(static_cast<float>(v)));
    if (type == onnx::TensorProto::BFLOAT16) {
      t->add_int32_data(FloatToBFloat16(static_cast<float>(v)));
    }
  }
  MoveFirst(m, {name});
  return name + "_output_0";
}

// The tiny model's classifier (its Gemm) reads `value`, computed by nodes
// added after it: the Gemm is moved last.
void FeedTheClassifier(ModelMaker& m, const std::string& value) {
  FindNode(m, "Gemm")->set_input(0, value);
  auto* nodes = m.graph()->mutable_node();
  for (int i = 0; i < nodes->size(); ++i) {
    if (nodes->Get(i).op_type() == "Gemm") {
      for (int j = i; j + 1 < nodes->size(); ++j) nodes->SwapElements(j, j + 1);
      break;
    }
  }
}

// The values of the `constant` node that `id` names, its bytes read as T.
template <typename T>
std::vector<T> ConstantValues(const Graph& g, const std::string& id) {
  std::string bytes;
  EXPECT_TRUE(absl::Base64Unescape(g.attrs(g.Find(id))["data"].get<std::string>(), &bytes));
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// A non-scalar constant that a computation reads is a `constant` node of its
// values (-inf kept); Sin, Trilu and Not of constants fold; Where takes a
// constant boolean condition as a mask.
TEST(OnnxImportTest, NonScalarConstantsAreReadAndFolded) {
  auto g = Import(TinyModel(17, "", [](ModelMaker& m) {
    const std::string scale = AddConstant(m, "/scale", {1, 4}, onnx::TensorProto::FLOAT,
                                          {0.5, -1.0, 2.0, -HUGE_VAL});
    const std::string angle = AddConstant(m, "/angle", {4}, onnx::TensorProto::FLOAT,
                                          {0.0, 0.5, 1.0, 1.5});
    const std::string ones = AddConstant(m, "/ones", {2, 4}, onnx::TensorProto::BOOL,
                                         {1, 1, 1, 1, 1, 1, 1, 1});
    m.Node("Sin", "/Sin", {angle}, {"sines"});
    auto* band = m.Node("Trilu", "/Trilu", {ones}, {"band"});
    ModelMaker::IntAttr(band, "upper", 0);  // tril: j <= i
    m.Node("Not", "/Not", {"band"}, {"outside"});
    m.Node("Mul", "/Mul", {"f", scale}, {"scaled"});
    m.Node("Add", "/Add", {"scaled", "sines"}, {"shifted"});
    m.Node("Where", "/Where", {"outside", "shifted", "f"}, {"picked"});
    FeedTheClassifier(m, "picked");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* id : {"/scale_output_0", "sines", "outside"}) {
    ASSERT_NE(g->Find(id), kNoNode) << id;
    EXPECT_EQ(g->op(g->Find(id)), "constant") << id;
  }
  EXPECT_EQ(ConstantValues<float>(*g, "/scale_output_0"),
            (std::vector<float>{0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(ConstantValues<float>(*g, "sines"),
            (std::vector<float>{std::sin(0.0f), std::sin(0.5f), std::sin(1.0f), std::sin(1.5f)}));
  // tril's complement: 1 where j > i
  EXPECT_EQ(ConstantValues<uint8_t>(*g, "outside"),
            (std::vector<uint8_t>{0, 1, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(*g->dtype(g->Find("outside")), DType::kUInt8);
  EXPECT_NE(g->Find("grad:fc.weight"), kNoNode);
}

// Constants of a model computed in float16 and bfloat16 (a .half() model's
// "* 0.375", its tables): read from raw data and from int32 bit patterns,
// `fill` and `constant` nodes of their own type; folded arithmetic and casts
// of float constants to them are rounded to that type.
// A tensor whose stored values do not match its shape (a damaged file) is
// refused naming it, its stored and expected sizes: a Constant read as a
// threshold was refused as "a constant tensor of shape (1) and type FLOAT",
// the very kind the importer reads, until 2026-12-07.
TEST(OnnxImportTest, ValuesOfAnotherSizeThanTheShapeAreNamed) {
  auto threshold = [](std::string raw, int floats) {
    return Import(TinyModel(13, "", [raw, floats](ModelMaker& m) {
      const std::string name = AddConstant(m, "/thr", {1}, onnx::TensorProto::FLOAT, {});
      onnx::TensorProto* t = m.graph()->mutable_node(0)->mutable_attribute(0)->mutable_t();
      t->set_raw_data(raw);
      for (int i = 0; i < floats; ++i) t->add_float_data(0.5f);
      m.Node("Greater", "/g", {"f", name}, {"g"});
      ModelMaker::IntAttr(m.Node("Cast", "/gf", {"g"}, {"gf"}), "to", onnx::TensorProto::FLOAT);
      m.Node("Mul", "/m", {"gf", "f"}, {"masked"});
      FeedTheClassifier(m, "masked");
    }));
  };
  const float half = 0.5f;
  const std::string four(reinterpret_cast<const char*>(&half), 4);
  ASSERT_TRUE(threshold(four, 0).ok()) << threshold(four, 0).status();
  auto cut = threshold(four.substr(0, 2), 0);
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(std::string(cut.status().message()),
              HasSubstr("'/thr' (op Constant): its value stores 2 bytes of raw_data, where "
                        "shape (1) of FLOAT takes 4"));
  auto two = threshold("", 2);
  ASSERT_FALSE(two.ok());
  EXPECT_THAT(std::string(two.status().message()), HasSubstr("stores 2 values in float_data"));
  auto none = threshold("", 0);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("(and no raw_data)"));

  auto weight = Import(TinyModel(13, "", [](ModelMaker& m) {
    for (onnx::TensorProto& t : *m.graph()->mutable_initializer()) {
      if (t.name() == "conv1.weight") t.mutable_raw_data()->resize(4);
    }
  }));
  ASSERT_FALSE(weight.ok());
  EXPECT_THAT(std::string(weight.status().message()),
              HasSubstr("initializer 'conv1.weight' stores 4 bytes of raw_data, where shape "
                        "(4,3,3,3) of FLOAT takes 432"));
}

TEST(OnnxImportTest, HalfAndBFloat16ConstantsKeepTheirType) {
  auto g = Import(TinyModel(17, "", [](ModelMaker& m) {
    auto* scale = m.Node("Constant", "/scale", {}, {"scale"});
    auto* value = scale->add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    value->mutable_t()->set_data_type(onnx::TensorProto::FLOAT16);
    const uint16_t bits = FloatToHalf(0.375f);
    value->mutable_t()->set_raw_data(std::string(reinterpret_cast<const char*>(&bits), 2));
    MoveFirst(m, {"/scale"});
    const std::string table = AddConstant(m, "/table", {1, 4}, onnx::TensorProto::FLOAT16,
                                          {1.0, 2.0, 4.0, 5.0});
    const std::string three = AddConstant(m, "/three", {}, onnx::TensorProto::FLOAT16, {3.0});
    const std::string tenths = AddConstant(m, "/tenths", {1, 4}, onnx::TensorProto::FLOAT,
                                           {0.1, 0.2, 0.3, 0.4});
    ModelMaker::IntAttr(m.Node("Cast", "/half/Cast", {"f"}, {"half"}), "to",
                        onnx::TensorProto::FLOAT16);
    m.Node("Mul", "/half/Mul", {"half", "scale"}, {"half_scaled"});
    m.Node("Div", "/thirds/Div", {table, three}, {"thirds"});
    m.Node("Add", "/half/Add", {"half_scaled", "thirds"}, {"half_shifted"});
    ModelMaker::IntAttr(m.Node("Cast", "/back/Cast", {"half_shifted"}, {"back"}), "to",
                        onnx::TensorProto::FLOAT);
    ModelMaker::IntAttr(m.Node("Cast", "/brain/Cast", {"f"}, {"brain"}), "to",
                        onnx::TensorProto::BFLOAT16);
    ModelMaker::IntAttr(m.Node("Cast", "/tenths/Cast", {tenths}, {"brain_tenths"}), "to",
                        onnx::TensorProto::BFLOAT16);
    m.Node("Mul", "/brain/Mul", {"brain", "brain_tenths"}, {"brain_scaled"});
    ModelMaker::IntAttr(m.Node("Cast", "/brain_back/Cast", {"brain_scaled"}, {"brain_back"}),
                        "to", onnx::TensorProto::FLOAT);
    m.Node("Add", "/both/Add", {"back", "brain_back"}, {"both"});
    FeedTheClassifier(m, "both");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId scale = g->Find("scale");
  ASSERT_NE(scale, kNoNode);
  EXPECT_EQ(g->op(scale), "fill");
  EXPECT_EQ(*g->dtype(scale), DType::kFloat16);
  EXPECT_EQ(g->attrs(scale)["value"], 0.375);

  ASSERT_NE(g->Find("thirds"), kNoNode);
  EXPECT_EQ(g->op(g->Find("thirds")), "constant");
  EXPECT_EQ(*g->dtype(g->Find("thirds")), DType::kFloat16);
  std::vector<uint16_t> thirds;
  for (float v : {1.0f, 2.0f, 4.0f, 5.0f}) thirds.push_back(FloatToHalf(v / 3));
  EXPECT_EQ(ConstantValues<uint16_t>(*g, "thirds"), thirds);

  ASSERT_NE(g->Find("brain_tenths"), kNoNode);
  EXPECT_EQ(*g->dtype(g->Find("brain_tenths")), DType::kBFloat16);
  std::vector<uint16_t> tenths;
  for (float v : {0.1f, 0.2f, 0.3f, 0.4f}) tenths.push_back(FloatToBFloat16(v));
  EXPECT_EQ(ConstantValues<uint16_t>(*g, "brain_tenths"), tenths);
  EXPECT_EQ(*g->dtype(g->Find("half.add")), DType::kFloat16);
  EXPECT_EQ(*g->dtype(g->Find("brain.mul")), DType::kBFloat16);
  EXPECT_NE(g->Find("grad:fc.weight"), kNoNode);
  EXPECT_NE(g->Find("grad:conv1.weight"), kNoNode);
}

// An Expand of a constant to dims whose product wraps in int64 is not
// folded (its size is counted in double): the node is refused, named.
TEST(OnnxImportTest, ExpandOfAConstantToHugeDimsIsRefused) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    const std::string one = AddConstant(m, "/one", {}, onnx::TensorProto::FLOAT, {1.0});
    m.IntInitializer("huge", {3, 6148914691236517206});  // 3 x that wraps to 2
    m.Node("Expand", "/huge/Expand", {one, "huge"}, {"wide"});
    m.Node("Mul", "/Mul", {"wide", "f"}, {"scaled"});
    FeedTheClassifier(m, "scaled");
  }));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()),
              ::testing::AllOf(::testing::HasSubstr("'/huge/Expand'"),
                               ::testing::HasSubstr("6148914691236517206")));
}

// Note [Casts of constants]: (t * 0.7).long() truncates (0.7 was read as it
// was), and its cast back to float is read as float; a comparison of float
// constants folds to a mask; Equal of integers (folded to int64 0 and 1) is
// a Where's mask.
TEST(OnnxImportTest, CastsAndComparisonsOfConstantsFold) {
  auto g = Import(TinyModel(17, "", [](ModelMaker& m) {
    const std::string table = AddConstant(m, "/table", {1, 4}, onnx::TensorProto::FLOAT,
                                          {0.0, 0.7, 1.4, 2.1});
    const std::string lower = AddConstant(m, "/lower", {2, 4}, onnx::TensorProto::FLOAT,
                                          {1, 0, 0, 0, 1, 1, 0, 0});
    const std::string zero = AddConstant(m, "/zero", {}, onnx::TensorProto::FLOAT, {0.0});
    const std::string ints = AddConstant(m, "/ints", {2, 4}, onnx::TensorProto::INT64,
                                         {1, 2, 1, 2, 2, 1, 2, 1});
    const std::string one = AddConstant(m, "/one", {}, onnx::TensorProto::INT64, {1});
    ModelMaker::IntAttr(m.Node("Cast", "/Cast", {table}, {"truncated"}), "to",
                        onnx::TensorProto::INT64);
    ModelMaker::IntAttr(m.Node("Cast", "/Cast_1", {"truncated"}, {"promoted"}), "to",
                        onnx::TensorProto::FLOAT);
    m.Node("Add", "/Add", {"f", "promoted"}, {"shifted"});
    m.Node("Equal", "/Equal", {lower, zero}, {"above"});
    m.Node("Where", "/Where", {"above", "shifted", "f"}, {"picked"});
    m.Node("Equal", "/Equal_1", {ints, one}, {"odd"});
    m.Node("Where", "/Where_1", {"odd", "picked", "f"}, {"kept"});
    FeedTheClassifier(m, "kept");
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->op(g->Find("promoted")), "constant");
  EXPECT_EQ(*g->dtype(g->Find("promoted")), DType::kFloat32);
  EXPECT_EQ(ConstantValues<float>(*g, "promoted"), (std::vector<float>{0, 0, 1, 2}));
  ASSERT_EQ(g->op(g->Find("above")), "constant");
  EXPECT_EQ(*g->dtype(g->Find("above")), DType::kUInt8);
  ASSERT_EQ(g->op(g->Find("odd")), "constant");
  EXPECT_EQ(*g->dtype(g->Find("odd")), DType::kUInt8);
}

// torch.randn_like and torch.rand_like (a VAE's noise): `random` nodes of
// the tensor's shape and type, each with its own seed, none a dropout
// mask's; the file's seed and a non-float type refused or ignored as said.
TEST(OnnxImportTest, RandomLikeIsSeededNoise) {
  auto model = [](int dtype) {
    return TinyModel(13, "", [dtype](ModelMaker& m) {
      const int before = m.graph()->node_size();
      auto* normal = m.Node("RandomNormalLike", "/RandomNormalLike", {"r"}, {"eps"});
      ModelMaker::FloatAttr(normal, "scale", 0.5f);
      ModelMaker::FloatAttr(normal, "seed", 3.0f);
      if (dtype != 0) ModelMaker::IntAttr(normal, "dtype", dtype);
      auto* uniform = m.Node("RandomUniformLike", "/RandomUniformLike", {"r"}, {"u"});
      ModelMaker::FloatAttr(uniform, "low", -1.0f);
      m.Node("Mul", "/Mul", {"eps", "u"}, {"noise"});
      m.Node("Add", "/Add", {"r", "noise"}, {"noisy"});
      FeedThePool(m, before, "noisy");
    });
  };
  auto g = Import(model(0));
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<NodeId> noise;  // (named after the module path, as every node)
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    if (g->op(v) == "random") noise.push_back(v);
  }
  ASSERT_EQ(noise.size(), 2u);
  const NodeId eps = noise[0], u = noise[1];
  EXPECT_EQ(*g->shape(eps), *g->shape(g->Find("relu")));
  EXPECT_EQ(g->attrs(eps)["distribution"], "normal");
  EXPECT_EQ(g->attrs(eps)["std"], 0.5);
  EXPECT_EQ(g->attrs(u)["distribution"], "uniform");
  EXPECT_EQ(g->attrs(u)["low"], -1.0);
  EXPECT_GE(g->attrs(eps)["seed"].get<int64_t>(), NetBuilder::kRandomSeedBase);
  EXPECT_NE(g->attrs(eps)["seed"], g->attrs(u)["seed"]);
  auto ints = Import(model(onnx::TensorProto::INT64));
  ASSERT_FALSE(ints.ok());
  EXPECT_THAT(ints.status().message(), AllOf(HasSubstr("'/RandomNormalLike'"),
                                             HasSubstr("noise of type i64")));
}

// Running statistics tiled from the buffers (nn.InstanceNorm with
// track_running_stats=True) would import as trainable tensors: refused,
// naming the buffer. Statistics computed from x (nn.BatchNorm2d with
// track_running_stats=False exports them so; a training-mode batch norm
// does not read them) import.
TEST(OnnxImportTest, BatchNormOfTiledRunningStatisticsIsRefused) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    m.IntInitializer("once", {1});
    m.Node("Tile", "/Tile", {"bn1.running_mean", "once"}, {"tiled_mean"});
    MoveFirst(m, {"/Tile"});
    FindNode(m, "BatchNormalization")->set_input(3, "tiled_mean");
  }));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(),
              AllOf(HasSubstr("'/bn1/BatchNormalization'"), HasSubstr("'bn1.running_mean' tiled"),
                    HasSubstr("track_running_stats=False")));
  auto computed = Import(TinyModel(13, "", [](ModelMaker& m) {
    auto* mean = m.Node("ReduceMean", "/ReduceMean", {"c"}, {"batch_mean"});
    ModelMaker::IntsAttr(mean, "axes", {0, 2, 3});
    ModelMaker::IntAttr(mean, "keepdims", 0);
    MoveFirst(m, {"/conv1/Conv", "/ReduceMean"});
    FindNode(m, "BatchNormalization")->set_input(3, "batch_mean");
  }));
  ASSERT_TRUE(computed.ok()) << computed.status();
}

// PyTorch 1.13 exports padding_mode="circular" by 1 along W as
// Concat(x[..., -2:-1], x, x[..., :1]), one column off (pytorch#86690): the
// graph is what the file says, and a note says that the file is not the
// model. PyTorch 2's correct Concat(x[..., -1:], x, x[..., :1]) gets none.
TEST(OnnxImportTest, PyTorch113sCircularPaddingIsNoted) {
  const auto model = [](int64_t left_start, int64_t left_end) {
    return TinyModel(13, "", [=](ModelMaker& m) {
      const int before = m.graph()->node_size();
      m.IntInitializer("left_start", {left_start});
      m.IntInitializer("left_end", {left_end});
      m.IntInitializer("zero", {0});
      m.IntInitializer("one", {1});
      m.IntInitializer("axis", {3});
      m.Node("Slice", "/pad/Slice", {"r", "left_start", "left_end", "axis"}, {"left"});
      m.Node("Slice", "/pad/Slice_1", {"r", "zero", "one", "axis"}, {"right"});
      ModelMaker::IntAttr(m.Node("Concat", "/pad/Concat", {"left", "r", "right"}, {"wrapped"}),
                          "axis", 3);
      FeedThePool(m, before, "wrapped");
    });
  };
  OnnxImportOptions options;
  std::vector<std::string> notes;
  auto old = ImportOnnxModel(model(-2, -1), "tiny", options, &notes);
  ASSERT_TRUE(old.ok()) << old.status();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], AllOf(HasSubstr("'/pad/Concat'"), HasSubstr("pytorch/pytorch#86690")));
  notes.clear();
  auto fixed = ImportOnnxModel(model(-1, INT64_MAX), "tiny", options, &notes);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_TRUE(notes.empty()) << notes[0];
}

// nn.ReflectionPad2d((2, 2, 1, 1)) and nn.ReplicationPad2d as the export
// writes them (Pad of mode reflect and edge, ONNX's pads order) are pad's
// reflect and replicate modes in F.pad's order; a reflection by the whole
// dim, which PyTorch refuses too, is an error naming the node.
TEST(OnnxImportTest, ReflectAndEdgePadsAreBorderPadding) {
  const auto model = [](const std::string& mode, std::vector<int64_t> pads) {
    return TinyModel(13, "", [&](ModelMaker& m) {
      const int before = m.graph()->node_size();
      m.IntInitializer("onnx_pads", pads);
      m.FloatVectorInitializer("value", {0.5f});  // read by mode constant only
      auto* pad = m.Node("Pad", "/pad/Pad", {"r", "onnx_pads", "value"}, {"padded"});
      ModelMaker::StringAttr(pad, "mode", mode);
      FeedThePool(m, before, "padded");
    });
  };
  for (const auto& [onnx_mode, mode] : {std::pair{"reflect", "reflect"}, {"edge", "replicate"}}) {
    auto g = Import(model(onnx_mode, {0, 0, 1, 2, 0, 0, 1, 2}));
    ASSERT_TRUE(g.ok()) << onnx_mode << ": " << g.status();
    const NodeId pad = g->Find("pad");
    ASSERT_NE(pad, kNoNode);
    EXPECT_EQ(g->attrs(pad), nlohmann::json({{"pads", {2, 2, 1, 1, 0, 0, 0, 0}}, {"mode", mode}}));
    EXPECT_EQ(*g->shape(pad), (Shape{2, 4, 10, 12}));
  }
  auto whole = Import(model("reflect", {0, 0, 0, 8, 0, 0, 0, 0}));
  ASSERT_FALSE(whole.ok());
  EXPECT_THAT(whole.status().message(),
              AllOf(HasSubstr("'/pad/Pad'"), HasSubstr("less than the dim's size")));
  auto wrap = Import(model("wrap", {0, 0, 0, 1, 0, 0, 0, 1}));
  ASSERT_FALSE(wrap.ok());
  EXPECT_THAT(wrap.status().message(), HasSubstr("mode = 'wrap'"));
}

// nn.Upsample as torch.onnx.export writes it: Resize by scales that a
// Concat of float constants makes, folded at import, becomes `upsample`;
// what PyTorch does not write (another nearest rounding, another cubic
// coefficient) is refused, naming the node.
std::string ResizeModel(const std::string& mode, const std::string& transform,
                        std::vector<float> spatial_scales, const std::string& nearest = "floor",
                        float cubic_coeff_a = -0.75f) {
  return TinyModel(13, "", [&](ModelMaker& m) {
    const int before = m.graph()->node_size();
    m.FloatVectorInitializer("keep", {1, 1});
    m.FloatVectorInitializer("factors", spatial_scales);
    auto* cat = m.Node("Concat", "/up/Concat", {"keep", "factors"}, {"scales"});
    ModelMaker::IntAttr(cat, "axis", 0);
    auto* resize = m.Node("Resize", "/up/Resize", {"r", "", "scales"}, {"big"});
    ModelMaker::StringAttr(resize, "mode", mode);
    ModelMaker::StringAttr(resize, "coordinate_transformation_mode", transform);
    ModelMaker::StringAttr(resize, "nearest_mode", nearest);
    if (mode == "cubic") ModelMaker::FloatAttr(resize, "cubic_coeff_a", cubic_coeff_a);
    FeedThePool(m, before, "big");
  });
}

TEST(OnnxImportTest, ResizeByWholeFactorsIsUpsample) {
  struct Case {
    std::string mode, transform;
    std::string want_mode;
    bool align_corners;
  };
  for (const Case& c : {Case{"nearest", "asymmetric", "nearest", false},
                        Case{"linear", "half_pixel", "bilinear", false},
                        Case{"linear", "pytorch_half_pixel", "bilinear", false},
                        Case{"linear", "align_corners", "bilinear", true},
                        Case{"cubic", "pytorch_half_pixel", "bicubic", false},
                        Case{"cubic", "align_corners", "bicubic", true}}) {
    auto g = Import(ResizeModel(c.mode, c.transform, {2, 3}));
    ASSERT_TRUE(g.ok()) << c.transform << ": " << g.status();
    const NodeId up = g->Find("up");
    ASSERT_NE(up, kNoNode);
    EXPECT_EQ(g->op(up), "upsample");
    EXPECT_EQ(*g->shape(up), (Shape{2, 4, 16, 24}));
    EXPECT_EQ(g->attrs(up)["mode"], c.want_mode);
    EXPECT_EQ(g->attrs(up).value("align_corners", false), c.align_corners);
    EXPECT_EQ(g->attrs(up)["scale"], nlohmann::json({2, 3}));
    EXPECT_NE(g->Find("grad:relu"), kNoNode);  // differentiated through the resize
  }
  // Fractional factors: the size, floor(in * scale), with PyTorch's scale
  // factor (its source step is 1 / scale_factor).
  // The scale factor is PyTorch's double, which the file rounds to float32
  // (1.1, not 1.10000002: for nearest, another pixel at some sizes).
  for (const auto& [mode, transform] : {std::pair{"nearest", "asymmetric"},
                                        {"linear", "pytorch_half_pixel"}}) {
    auto g = Import(ResizeModel(mode, transform, {1.5f, 1.1f}));
    ASSERT_TRUE(g.ok()) << mode << ": " << g.status();
    const NodeId up = g->Find("up");
    EXPECT_EQ(*g->shape(up), (Shape{2, 4, 12, 8})) << mode;
    EXPECT_FALSE(g->attrs(up).contains("scale")) << mode;
    EXPECT_EQ(g->attrs(up)["size"], nlohmann::json({12, 8})) << mode;
    EXPECT_EQ(g->attrs(up)["scale_factor"], nlohmann::json({1.5, 1.1})) << mode;
  }
  // The size is floor(in * scale) in float32, as ONNX computes it: 0.7 of
  // 10 elements is 7 (in double 6.9999998 of the float32 scale), as in
  // PyTorch; where PyTorch's double of the scale factor the float32
  // rounds gives another size (1.6999999 of 10: 16, float32 17), a note
  // says so.
  const auto padded_resize = [](float scale) {
    return TinyModel(13, "", [scale](ModelMaker& m) {
      const int before = m.graph()->node_size();
      m.IntInitializer("onnx_pads", {0, 0, 1, 1, 0, 0, 1, 1});
      m.Node("Pad", "/pad/Pad", {"r", "onnx_pads"}, {"padded"});
      m.FloatVectorInitializer("scales", {1, 1, scale, scale});
      auto* resize = m.Node("Resize", "/up/Resize", {"padded", "", "scales"}, {"big"});
      ModelMaker::StringAttr(resize, "coordinate_transformation_mode", "asymmetric");
      ModelMaker::StringAttr(resize, "nearest_mode", "floor");
      FeedThePool(m, before, "big");
    });
  };
  for (const auto& [scale, size, noted] :
       {std::tuple{0.7f, 7, false}, std::tuple{1.6999999f, 17, true}}) {
    std::vector<std::string> notes;
    auto g = ImportOnnxModel(padded_resize(scale), "tiny", OnnxImportOptions{}, &notes);
    ASSERT_TRUE(g.ok()) << scale << ": " << g.status();
    EXPECT_EQ(*g->shape(g->Find("up")), (Shape{2, 4, size, size})) << scale;
    const bool has_note = !notes.empty() && absl::StrContains(notes.back(), "'/up/Resize'");
    EXPECT_EQ(has_note, noted) << scale;
    if (noted) {
      EXPECT_THAT(notes.back(), AllOf(HasSubstr("1.69999993"), HasSubstr("(2,4,17,17)"),
                                      HasSubstr("PyTorch computed (2,4,16,16)")));
    }
  }
  const std::vector<std::pair<std::string, std::vector<std::string>>> refused = {
      {ResizeModel("nearest", "asymmetric", {-1.5f, 2}), {"'/up/Resize'", "scale -1.5"}},
      {ResizeModel("nearest", "asymmetric", {0.01f, 2}), {"'/up/Resize'", "to 0 elements"}},
      {ResizeModel("nearest", "half_pixel", {2, 2}), {"'/up/Resize'", "half_pixel"}},
      {ResizeModel("nearest", "asymmetric", {2, 2}, "round_prefer_floor"),
       {"'/up/Resize'", "round_prefer_floor"}},
      {ResizeModel("cubic", "half_pixel", {2, 2}, "floor", -0.5f),
       {"'/up/Resize'", "cubic_coeff_a = -0.5", "PyTorch's is -0.75"}},
  };
  for (const auto& [bytes, words] : refused) {
    auto g = Import(bytes);
    ASSERT_FALSE(g.ok());
    for (const std::string& w : words) {
      EXPECT_THAT(std::string(g.status().message()), HasSubstr(w));
    }
  }
}

TEST(OnnxImportTest, ShapeArithmeticFoldsAndChannelShuffleImports) {
  auto g = Import(ShuffleModel());
  ASSERT_TRUE(g.ok()) << g.status();
  std::map<std::string, int> ops;
  for (NodeId v = 0; v < g->num_nodes(); ++v) ++ops[g->op(v)];
  // No node for the shape arithmetic: two reshapes, the transpose, the
  // split's two slices, the concat (the full-width Slice is the input).
  EXPECT_EQ(ops["transpose"], 2);  // forward and its gradient
  const NodeId r5 = g->Find("reshape");
  ASSERT_NE(r5, kNoNode);
  EXPECT_EQ(*g->shape(r5), (Shape{2, 2, 2, 8, 8}));
  const NodeId t = g->Find("transpose");
  ASSERT_NE(t, kNoNode);
  EXPECT_EQ(g->attrs(t)["perm"], nlohmann::json({0, 2, 1, 3, 4}));
  const NodeId lo = g->Find("split");
  const NodeId hi = g->Find("split.1");
  ASSERT_NE(lo, kNoNode);
  ASSERT_NE(hi, kNoNode);
  EXPECT_EQ(*g->shape(lo), (Shape{2, 1, 8, 8}));
  EXPECT_EQ(*g->shape(hi), (Shape{2, 3, 8, 8}));
  EXPECT_EQ(g->Find("shape"), kNoNode);
  EXPECT_EQ(g->Find("div"), kNoNode);
}

// Reshape and Flatten (and the reshapes of the lowerings) are views of
// their input (docs/import.md): aliases that hold no memory of their own,
// and the gradient of such a view is a view of the incoming gradient.
TEST(OnnxImportTest, ReshapeFamilyNodesAreViews) {
  auto forward = Import(ShuffleModel(), LossKind::kNone);
  ASSERT_TRUE(forward.ok()) << forward.status();
  auto alias_of = [&](const Graph& g, const char* id) {
    const NodeId v = g.Find(id);
    EXPECT_NE(v, kNoNode) << id;
    return v == kNoNode || !g.is_alias(v) ? std::string() : g.id(g.alias_of(v));
  };
  EXPECT_EQ(alias_of(*forward, "flatten"), "avgpool");
  EXPECT_EQ(alias_of(*forward, "reshape"), "relu");
  EXPECT_EQ(alias_of(*forward, "shuffled"), "transpose");
  EXPECT_EQ(alias_of(*forward, "transpose"), "");  // a copy: tensors have no strides
  auto g = Import(ShuffleModel());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(alias_of(*g, "grad:avgpool"), "grad:flatten");
  // Computing a view adds no memory; the same graph with copies adds its
  // bytes.
  GraphBuilder copies("copies");
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    NodeSpec spec = SpecOf(*g, v);
    spec.alias_of.reset();
    copies.AddNode(std::move(spec));
  }
  for (NodeId o : g->outputs()) copies.AddOutput(g->id(o));
  auto plain = copies.Build();
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto growth = [](const Graph& graph, const char* id) -> int64_t {
    const Schedule s = *FreeAtLastUse(graph, DefaultOrder(graph));
    const PlanReport r = *Simulate(graph, s);
    for (size_t k = 0; k < s.steps.size(); ++k) {
      if (s.steps[k].node == graph.Find(id) && s.steps[k].action == Action::kCompute) {
        return r.timeline[k].device_bytes - (k == 0 ? r.initial_bytes : r.timeline[k - 1].device_bytes);
      }
    }
    return -1;
  };
  for (const char* id : {"reshape", "shuffled", "flatten", "grad:avgpool"}) {
    EXPECT_EQ(growth(*g, id), 0) << id;
    EXPECT_EQ(growth(*plain, id), g->bytes(g->Find(id))) << id;
  }
}

TEST(OnnxImportTest, WhatTheShapeFoldingCannotDoIsAnErrorNamingTheNode) {
  const std::vector<BadCase> cases = {
      {"sub of shapes that do not broadcast",
       [](ModelMaker& m) {
         auto* relu = FindNode(m, "Relu");
         relu->set_op_type("Sub");
         relu->add_input("fc.bias");
       },
       {"'/relu/Relu'", "op Sub", "do not broadcast"}},
      {"slice of a computed tensor by a step of 0",
       [](ModelMaker& m) {
         m.IntInitializer("step_none", {0});
         for (auto& node : *m.graph()->mutable_node()) {
           if (node.name() == "/Slice_1") node.add_input("step_none");
         }
       },
       {"'/Slice_1'", "step 0"}},
      {"gather of several indices from a computed tensor",
       [](ModelMaker& m) {
         auto* gather = FindNode(m, "Gather");
         gather->set_input(0, "r");
         gather->set_input(1, "axes0");
       },
       {"'/Gather'", "embedding"}},
  };
  for (const BadCase& c : cases) {
    auto g = Import(ShuffleModel(c.edit));
    ASSERT_FALSE(g.ok()) << c.what;
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(g.status().message(), HasSubstr(part)) << c.what;
    }
  }
}

// Gemm with B not transposed (K, N), and with A transposed: pebble's linear
// reads a transpose of the operand.
TEST(OnnxImportTest, GemmTransposesWhatLinearNeedsTransposed) {
  auto g = Import(TinyModel(13, "", [](ModelMaker& m) {
    for (auto& init : *m.graph()->mutable_initializer()) {
      if (init.name() == "fc.weight") {
        init.set_dims(0, 4);
        init.set_dims(1, 5);
      }
    }
    for (auto& a : *FindNode(m, "Gemm")->mutable_attribute()) a.set_i(0);  // transB = 0
  }));
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId t = g->Find("logits.b_t");
  ASSERT_NE(t, kNoNode);
  EXPECT_EQ(g->op(t), "transpose");
  EXPECT_EQ(*g->shape(t), (Shape{5, 4}));
  EXPECT_EQ(*g->shape(g->Find("logits")), (Shape{2, 5}));
  EXPECT_EQ(*g->shape(g->Find("grad:fc.weight")), (Shape{4, 5}));
}

// The tiny model's convolution made nn.ConvTranspose2d(3, 4, 3, stride 2,
// padding 1, output_padding 1) with `attrs_edit` applied: 8x8 -> 16x16.
std::string TransposedModel(const std::function<void(onnx::NodeProto*)>& attrs_edit = nullptr) {
  return TinyModel(13, "", [&](ModelMaker& m) {
    for (auto& init : *m.graph()->mutable_initializer()) {
      if (init.name() == "conv1.weight") {  // (C_in, C_out, k, k)
        init.set_dims(0, 3);
        init.set_dims(1, 4);
      }
    }
    auto* conv = FindNode(m, "Conv");
    conv->set_op_type("ConvTranspose");
    conv->set_name("/up/ConvTranspose");
    conv->clear_attribute();
    ModelMaker::IntsAttr(conv, "kernel_shape", {3, 3});
    ModelMaker::IntsAttr(conv, "pads", {1, 1, 1, 1});
    ModelMaker::IntsAttr(conv, "strides", {2, 2});
    ModelMaker::IntsAttr(conv, "output_padding", {1, 1});
    if (attrs_edit) attrs_edit(conv);
  });
}

TEST(OnnxImportTest, ConvTransposeIsAConvolutionsDataGradient) {
  auto g = Import(TransposedModel());
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId t = g->Find("up.transposed");
  ASSERT_NE(t, kNoNode);
  EXPECT_EQ(g->op(t), "conv2d_backward_data");
  EXPECT_EQ(g->attrs(t)["input_shape"], nlohmann::json({2, 4, 16, 16}));
  EXPECT_EQ(g->attrs(t)["stride"], nlohmann::json({2, 2}));
  const NodeId up = g->Find("up");
  EXPECT_EQ(g->op(up), "add");  // the bias, viewed as (C_out, 1, 1)
  EXPECT_EQ(*g->shape(g->Find("up.bias_column")), (Shape{4, 1, 1}));
  EXPECT_EQ(*g->shape(up), (Shape{2, 4, 16, 16}));
  EXPECT_EQ(*g->shape(g->Find("grad:conv1.weight")), (Shape{3, 4, 3, 3}));
  EXPECT_EQ(g->op(g->Find("grad:conv1.weight")), "conv2d_backward_weight");
  EXPECT_EQ(*g->shape(g->Find("grad:conv1.bias")), (Shape{4}));
}

TEST(OnnxImportTest, ConvTransposeThatPyTorchWouldRefuseIsAnErrorNamingTheNode) {
  struct Case {
    std::string what;
    std::function<void(onnx::NodeProto*)> edit;
    std::string message;
  };
  auto set_ints = [](onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
    for (auto& a : *n->mutable_attribute()) {
      if (a.name() != name) continue;
      a.clear_ints();
      for (int64_t x : v) a.add_ints(x);
    }
  };
  const std::vector<Case> cases = {
      {"output_padding not below the stride",
       [&](onnx::NodeProto* n) { set_ints(n, "output_padding", {2, 2}); },
       "output_padding = [2,2] is not supported (each must be at least 0 and less than"},
      {"output_shape instead of output_padding",
       [](onnx::NodeProto* n) { ModelMaker::IntsAttr(n, "output_shape", {16, 16}); },
       "output_shape"},
      {"padding beyond the kernel",
       [&](onnx::NodeProto* n) {
         set_ints(n, "pads", {9, 9, 9, 9});
         set_ints(n, "output_padding", {0, 0});
       },
       "would have size -1 on spatial dim 0"},
      {"a matrix as the weight",
       [](onnx::NodeProto* n) {
         auto* attrs = n->mutable_attribute();
         for (int i = 0; i < attrs->size(); ++i) {
           if (attrs->Get(i).name() == "kernel_shape") attrs->DeleteSubrange(i, 1);
         }
         n->set_input(1, "fc.weight");
       },
       "the weight (5,4) does not fit x (2,3,8,8)"},
  };
  for (const Case& c : cases) {
    auto g = Import(TransposedModel(c.edit));
    ASSERT_FALSE(g.ok()) << c.what;
    EXPECT_THAT(g.status().message(), HasSubstr("'/up/ConvTranspose'")) << c.what;
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(c.message)) << c.what;
  }
}

// nn.Embedding as torch.onnx.export writes it: token ids (an int64 input)
// and position ids (a constant 0..n-1) gathered from two tables, added, the
// mean over the sequence, a linear classifier. `positions` are the
// position ids' values; `edit` may change the model.
std::string EmbeddingModel(std::vector<int64_t> positions = {0, 1, 2, 3, 4},
                           const std::function<void(ModelMaker&)>& edit = nullptr) {
  ModelMaker m;
  m.Input("ids", {2, 5}, "", onnx::TensorProto::INT64);
  m.Initializer("tok.weight", {10, 4});
  m.Initializer("pos.weight", {8, 4});
  m.IntInitializer("position_ids", positions);
  m.Initializer("fc.weight", {3, 4});
  m.Initializer("fc.bias", {3});
  m.Node("Gather", "/tok/Gather", {"tok.weight", "ids"}, {"tokens"});
  m.Node("Gather", "/pos/Gather", {"pos.weight", "position_ids"}, {"places"});
  m.Node("Add", "/Add", {"tokens", "places"}, {"h"});
  auto* mean = m.Node("ReduceMean", "/ReduceMean", {"h"}, {"pooled"});
  ModelMaker::IntsAttr(mean, "axes", {1});
  ModelMaker::IntAttr(mean, "keepdims", 0);
  auto* fc = m.Node("Gemm", "/fc/Gemm", {"pooled", "fc.weight", "fc.bias"}, {"logits"});
  ModelMaker::IntAttr(fc, "transB", 1);
  m.Output("logits");
  if (edit) edit(m);
  return m.Bytes();
}

// The position look-up of EmbeddingModel reads the output of a new node
// `op` of `inputs` (named "/<op>", first in the graph).
void PositionsFrom(ModelMaker& m, const std::string& op, std::vector<std::string> inputs) {
  m.Node(op, "/" + op, std::move(inputs), {"new_position_ids"});
  MoveFirst(m, {"/" + op});
  for (auto& node : *m.graph()->mutable_node()) {
    if (node.name() == "/pos/Gather") node.set_input(1, "new_position_ids");
  }
}

TEST(OnnxImportTest, EmbeddingLookUpsTrainTheirTables) {
  auto g = Import(EmbeddingModel(), LossKind::kCrossEntropy, 6);
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId tokens = g->Find("tok");
  ASSERT_NE(tokens, kNoNode);
  EXPECT_EQ(g->op(tokens), "embedding");
  EXPECT_EQ(*g->shape(tokens), (Shape{6, 5, 4}));
  EXPECT_EQ(*g->dtype(g->Find("ids")), DType::kInt64);
  // The position ids are made at run time (no persistent integer tensor).
  const NodeId places = g->Find("pos");
  ASSERT_NE(places, kNoNode);
  EXPECT_EQ(g->op(g->inputs(places)[0]), "arange");
  EXPECT_EQ(g->Find("position_ids"), kNoNode);
  for (const char* table : {"tok.weight", "pos.weight"}) {
    const NodeId grad = g->Find(absl::StrCat("grad:", table));
    ASSERT_NE(grad, kNoNode) << table;
    EXPECT_EQ(*g->shape(grad), *g->shape(g->Find(table))) << table;
    EXPECT_EQ(g->op(grad), "embedding_backward") << table;
  }
}

TEST(OnnxImportTest, PositionIdsAreAnArangeAndOneValueAFill) {
  auto g = Import(EmbeddingModel(), LossKind::kNone);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g->shape(g->Find("pos")), (Shape{5, 4}));
  // Hugging Face's style: a (1, 8) buffer of position ids cut to the
  // sequence's length, (1, 5), which is an arange viewed as (1, 5).
  auto g2 = Import(EmbeddingModel({0, 1, 2, 3, 4, 5, 6, 7}, [](ModelMaker& m) {
                     for (auto& init : *m.graph()->mutable_initializer()) {
                       if (init.name() != "position_ids") continue;
                       init.clear_dims();
                       init.add_dims(1);
                       init.add_dims(8);
                     }
                     m.IntInitializer("starts", {0});
                     m.IntInitializer("ends", {5});
                     m.IntInitializer("axes", {1});
                     PositionsFrom(m, "Slice", {"position_ids", "starts", "ends", "axes"});
                   }),
                   LossKind::kNone);
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(*g2->shape(g2->Find("pos")), (Shape{1, 5, 4}));
  // torch.arange(ids.shape[1]) exported with a symbolic dim: a Range of
  // integer scalars, folded.
  auto ranged = [](int64_t start, int64_t limit, int64_t delta) {
    return Import(EmbeddingModel({0}, [=](ModelMaker& m) {
                    m.ScalarIntInitializer("start", start);
                    m.ScalarIntInitializer("limit", limit);
                    m.ScalarIntInitializer("delta", delta);
                    PositionsFrom(m, "Range", {"start", "limit", "delta"});
                  }),
                  LossKind::kNone);
  };
  auto g3 = ranged(0, 5, 1);
  ASSERT_TRUE(g3.ok()) << g3.status();
  EXPECT_EQ(*g3->shape(g3->Find("pos")), (Shape{5, 4}));
  EXPECT_EQ(g3->op(g3->inputs(g3->Find("pos"))[0]), "arange");
  // 4, 3, 2, 1, 0 is a Range too, but not position ids in order.
  auto reversed = ranged(4, -1, -1);
  ASSERT_FALSE(reversed.ok());
  EXPECT_THAT(reversed.status().message(), HasSubstr("these are 4, 3, 2, 1, 0"));
  // BERT's token type ids, a buffer of one value: a fill.
  auto g4 = Import(EmbeddingModel({1, 1, 1, 1, 1}), LossKind::kNone);
  ASSERT_TRUE(g4.ok()) << g4.status();
  const NodeId types = g4->inputs(g4->Find("pos"))[0];
  EXPECT_EQ(g4->op(types), "fill");
  EXPECT_EQ(g4->attrs(types)["value"], 1);
  EXPECT_EQ(*g4->dtype(types), DType::kInt64);
  EXPECT_EQ(*g4->shape(types), (Shape{5}));
  auto empty = ranged(0, 5, 0);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("'/Range' (op Range): delta 0"));
}

TEST(OnnxImportTest, LookUpsPebbleCannotMakeAreErrorsNamingTheNode) {
  const std::vector<BadCase> cases = {
      {"constant indices out of order",
       [](ModelMaker& m) {
         for (auto& init : *m.graph()->mutable_initializer()) {
           if (init.name() == "position_ids") init.set_int64_data(1, 3);
         }
       },
       {"'/pos/Gather'", "'position_ids'", "0, 1, ..., n-1", "these are 0, 3, 2, 3, 4"}},
      {"constant indices beyond the table",
       [](ModelMaker& m) {
         for (auto& init : *m.graph()->mutable_initializer()) {
           if (init.name() != "position_ids") continue;
           for (int i = 0; i < 5; ++i) init.set_int64_data(i, 8);
         }
       },
       {"'/pos/Gather'", "constant index 8 of 'position_ids' is outside the table's 8 rows"}},
      {"runtime indices along axis 1",
       [](ModelMaker& m) { ModelMaker::IntAttr(FindNode(m, "Gather"), "axis", 1); },
       {"'/tok/Gather'", "axis 1", "(10,4)"}},
      {"token ids expanded (an integer Expand)",
       [](ModelMaker& m) {
         m.IntInitializer("wide", {3, 2, 5});
         m.Node("Expand", "/Expand", {"ids", "wide"}, {"wide_ids"});
         MoveFirst(m, {"/Expand"});
         FindNode(m, "Gather")->set_input(1, "wide_ids");
       },
       {"'/Expand'", "an Expand of i64 'ids' is not supported"}},
      {"float indices",
       [](ModelMaker& m) {
         m.graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(
             onnx::TensorProto::FLOAT);
       },
       {"'/tok/Gather'", "'ids'", "fp32", "int64 indices"}},
  };
  for (const BadCase& c : cases) {
    auto g = Import(EmbeddingModel({0, 1, 2, 3, 4}, c.edit), LossKind::kNone);
    ASSERT_FALSE(g.ok()) << c.what;
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(g.status().message(), HasSubstr(part)) << c.what;
    }
  }
}

// Attention scores (N, 4, 4) plus a constant mask (1, 4, 4) scaled by an
// integer 1 cast to float, as nn.MultiheadAttention's export writes a
// causal src_mask, then a softmax over the last dim. `mask(i, j)` gives
// the mask's values; `edit` may change the model.
std::string MaskedAttentionModel(const std::function<float(int, int)>& mask,
                                 const std::function<void(ModelMaker&)>& edit = nullptr) {
  ModelMaker m;
  m.Input("input", {2, 4, 4});
  m.Initializer("q.weight", {4, 4});
  auto* t = m.graph()->add_initializer();
  t->set_name("onnx::Mul_7");  // a constant of the export, not the model's
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {1, 4, 4}) t->add_dims(d);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) t->add_float_data(mask(i, j));
  }
  m.ScalarIntInitializer("one", 1);
  ModelMaker::IntAttr(m.Node("Cast", "/Cast", {"one"}, {"one_f"}), "to",
                      onnx::TensorProto::FLOAT);
  m.Node("MatMul", "/q/MatMul", {"input", "q.weight"}, {"scores"});
  m.Node("Mul", "/Mul", {"onnx::Mul_7", "one_f"}, {"mask"});
  m.Node("Add", "/Add", {"scores", "mask"}, {"masked"});
  ModelMaker::IntAttr(m.Node("Softmax", "/Softmax", {"masked"}, {"attention"}), "axis", -1);
  m.Output("attention");
  if (edit) edit(m);
  return m.Bytes();
}

TEST(OnnxImportTest, ACausalMaskBeforeASoftmaxIsTheSoftmaxsCausalAttr) {
  const auto causal = [](int i, int j) { return j <= i ? 0.0f : -INFINITY; };
  auto g = Import(MaskedAttentionModel(causal), LossKind::kMse);
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId softmax = g->Find("attention");  // a graph output keeps its name
  ASSERT_NE(softmax, kNoNode);
  EXPECT_EQ(g->attrs(softmax)["causal"], true);
  EXPECT_EQ(g->id(g->inputs(softmax)[0]), "q");  // the scores themselves: no add
  for (NodeId v = 0; v < g->num_nodes(); ++v) EXPECT_NE(g->op(v), "add") << g->id(v);
  EXPECT_EQ(*g->shape(g->Find("grad:q.weight")), (Shape{4, 4}));
  // Hugging Face's style: a large negative number for the masked keys.
  auto finite = Import(
      MaskedAttentionModel([](int i, int j) { return j <= i ? 0.0f : -3.4e38f; }),
      LossKind::kNone);
  ASSERT_TRUE(finite.ok()) << finite.status();
  EXPECT_EQ(finite->attrs(finite->Find("attention"))["causal"], true);
}

// A boolean causal mask (torch.ones(n, n, dtype=bool).triu(1)) as the
// export writes it with a symbolic batch: Where(mask, -inf, zeros of
// Shape(mask)), then Unsqueeze; every step folds, and the softmax is causal.
TEST(OnnxImportTest, ABooleanCausalMaskFoldsThroughWhere) {
  auto g = Import(
      MaskedAttentionModel([](int, int) { return 0.0f; },
                           [](ModelMaker& m) {
                             auto* inits = m.graph()->mutable_initializer();
                             for (int i = 0; i < inits->size(); ++i) {
                               if (inits->Get(i).name() == "onnx::Mul_7") inits->DeleteSubrange(i, 1);
                             }
                             auto* mask = m.graph()->add_initializer();
                             mask->set_name("onnx::Where_3");
                             mask->set_data_type(onnx::TensorProto::BOOL);
                             mask->add_dims(4);
                             mask->add_dims(4);
                             for (int i = 0; i < 4; ++i) {
                               for (int j = 0; j < 4; ++j) mask->add_int32_data(j > i ? 1 : 0);
                             }
                             m.FloatVectorInitializer("onnx::Where_4", {-INFINITY});
                             m.IntInitializer("onnx::Unsqueeze_5", {0});
                             m.Node("Shape", "/Shape", {"onnx::Where_3"}, {"mask_shape"});
                             auto* zeros = m.Node("ConstantOfShape", "/ConstantOfShape",
                                                  {"mask_shape"}, {"zeros"});
                             auto* value = zeros->add_attribute();
                             value->set_name("value");
                             value->set_type(onnx::AttributeProto::TENSOR);
                             value->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
                             value->mutable_t()->add_dims(1);
                             value->mutable_t()->add_float_data(0.0f);
                             m.Node("Where", "/Where", {"onnx::Where_3", "onnx::Where_4", "zeros"},
                                    {"additive"});
                             m.Node("Unsqueeze", "/Unsqueeze", {"additive", "onnx::Unsqueeze_5"},
                                    {"onnx::Mul_7"});
                             MoveFirst(m, {"/Shape", "/ConstantOfShape", "/Where", "/Unsqueeze"});
                           }),
      LossKind::kNone);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->attrs(g->Find("attention"))["causal"], true);
}

// A mask that is not causal, or a masked sum that another node reads too,
// is no causal softmax: the mask is a `constant` node added to the scores
// (until 2026-12-07 refused), its -inf kept.
TEST(OnnxImportTest, AMaskThatIsNotCausalOrIsReadElsewhereIsAdded) {
  // Key 1 masked from query 3, which causality allows.
  auto holed = Import(MaskedAttentionModel([](int i, int j) {
                        return j <= i && !(i == 3 && j == 1) ? 0.0f : -INFINITY;
                      }),
                      LossKind::kNone);
  ASSERT_TRUE(holed.ok()) << holed.status();
  const NodeId mask = holed->Find("mask");
  ASSERT_NE(mask, kNoNode);
  EXPECT_EQ(holed->op(mask), "constant");
  EXPECT_EQ(*holed->shape(mask), (Shape{1, 4, 4}));
  const std::vector<float> values = ConstantValues<float>(*holed, "mask");
  ASSERT_EQ(values.size(), 16u);
  EXPECT_EQ(values[3 * 4 + 1], -INFINITY);
  EXPECT_EQ(values[3 * 4 + 0], 0.0f);
  EXPECT_EQ(holed->attrs(holed->Find("attention")).value("causal", false), false);
  // The sum read by another node too: it must hold the mask.
  auto read = Import(MaskedAttentionModel([](int i, int j) { return j <= i ? 0.0f : -INFINITY; },
                                          [](ModelMaker& m) {
                                            m.Node("Relu", "/Relu", {"masked"}, {"seen"});
                                            m.Output("seen");
                                          }),
                     LossKind::kNone);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->op(read->Find("mask")), "constant");
}

// TinyModel ending in F.log_softmax(logits, dim=1), as PyTorch's MNIST
// example does before F.nll_loss; `edit` may change it further.
std::string LogSoftmaxModel(int opset = 13,
                            const std::function<void(ModelMaker&)>& edit = nullptr) {
  return TinyModel(opset, "", [&](ModelMaker& m) {
    m.graph()->mutable_output()->Clear();
    ModelMaker::IntAttr(m.Node("LogSoftmax", "/LogSoftmax", {"logits"}, {"log_probs"}), "axis", 1);
    m.Output("log_probs");
    if (edit) edit(m);
  });
}

// Cross-entropy of log-probabilities is that of the logits, so the loss
// takes the last LogSoftmax in: the graph is TinyModel's with the output's
// name, under --loss cross-entropy and --loss nll alike.
TEST(OnnxImportTest, ALastLogSoftmaxIsTakenIntoTheCrossEntropyLoss) {
  for (const char* loss : {"cross-entropy", "nll"}) {
    OnnxImportOptions options;
    ASSERT_TRUE(SetOnnxLoss(loss, options).ok());
    std::vector<std::string> notes;
    auto g = ImportOnnxModel(LogSoftmaxModel(), "tiny", options, &notes);
    ASSERT_TRUE(g.ok()) << loss << ": " << g.status();
    const NodeId out = g->Find("log_probs");
    ASSERT_NE(out, kNoNode) << loss;
    EXPECT_EQ(g->op(out), "linear") << loss;
    EXPECT_EQ(g->inputs(g->Find("loss"))[0], out) << loss;
    EXPECT_EQ(g->op(g->Find("loss")), "softmax_cross_entropy") << loss;
    EXPECT_EQ(g->num_nodes(), Import(TinyModel())->num_nodes()) << loss;
    // Under --loss cross-entropy a note says what became of the node.
    const bool noted = !notes.empty() && absl::StrContains(notes.back(), "'/LogSoftmax'");
    EXPECT_EQ(noted, std::string(loss) == "cross-entropy") << loss;
  }
  // Opset 11's LogSoftmax of 2-D logits, axis 1 by default, is the same.
  auto old = Import(LogSoftmaxModel(11, [](ModelMaker& m) {
    FindNode(m, "LogSoftmax")->clear_attribute();
  }));
  ASSERT_TRUE(old.ok()) << old.status();
}

// A LogSoftmax the loss cannot take in is pebble's log_softmax over the
// last dim (another dim is transposed there and back).
TEST(OnnxImportTest, ALogSoftmaxTheLossCannotTakeInIsComputed) {
  for (const LossKind loss : {LossKind::kMse, LossKind::kNone}) {
    auto g = Import(LogSoftmaxModel(), loss);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->op(g->Find("log_probs")), "log_softmax");
  }
  struct Case {
    std::string what;
    std::function<void(ModelMaker&)> edit;
    std::vector<std::string> ops;  // from the model's output back through first inputs
  };
  const std::vector<Case> cases = {
      {"over the last dim of 4-D activations",
       [](ModelMaker& m) {
         m.graph()->mutable_output()->Clear();
         ModelMaker::IntAttr(m.Node("LogSoftmax", "/LogSoftmax", {"r"}, {"log_probs"}), "axis", -1);
         m.Output("log_probs");
       },
       {"log_softmax", "relu"}},
      {"over the channels of 4-D activations, not the model's output",
       [](ModelMaker& m) {
         m.graph()->mutable_output()->Clear();
         ModelMaker::IntAttr(m.Node("LogSoftmax", "/LogSoftmax", {"r"}, {"log_probs"}), "axis", 1);
         m.Node("Neg", "/Neg", {"log_probs"}, {"negated"});
         m.Output("negated");
       },
       {"mul", "transpose", "log_softmax", "transpose", "relu"}},
      {"read by another node",
       [](ModelMaker& m) {
         m.graph()->mutable_output()->Clear();
         ModelMaker::IntAttr(m.Node("LogSoftmax", "/LogSoftmax", {"logits"}, {"log_probs"}),
                             "axis", 1);
         m.Node("Neg", "/Neg", {"log_probs"}, {"negated"});
         m.Output("negated");
       },
       {"mul", "log_softmax", "linear"}},
  };
  for (const Case& c : cases) {
    auto g = Import(TinyModel(13, "", c.edit));
    ASSERT_TRUE(g.ok()) << c.what << ": " << g.status();
    NodeId v = g->Find(c.ops.front() == "mul" ? "negated" : "log_probs");  // Neg: mul by -1
    ASSERT_NE(v, kNoNode) << c.what;
    std::vector<std::string> seen;
    for (size_t k = 0; k < c.ops.size(); ++k, v = g->inputs(v)[0]) seen.push_back(g->op(v));
    EXPECT_EQ(seen, c.ops) << c.what;
  }
  // Before opset 13, axis 1 of a 4-D tensor flattens the dims after it.
  auto flattened = Import(TinyModel(11, "", [](ModelMaker& m) {
    m.graph()->mutable_output()->Clear();
    m.Node("LogSoftmax", "/LogSoftmax", {"r"}, {"log_probs"});
    m.Output("log_probs");
  }));
  ASSERT_FALSE(flattened.ok());
  EXPECT_THAT(flattened.status().message(), HasSubstr("before opset 13"));
}

TEST(OnnxImportTest, NllTakesLogProbabilities) {
  // --loss nll takes log-probabilities: a model returning logits is refused.
  OnnxImportOptions nll;
  ASSERT_TRUE(SetOnnxLoss("nll", nll).ok());
  auto logits = ImportOnnxModel(TinyModel(), "tiny", nll);
  ASSERT_FALSE(logits.ok());
  EXPECT_THAT(logits.status().message(),
              AllOf(HasSubstr("--loss nll"), HasSubstr("'logits' is computed by ONNX node "
                                                       "'/fc/Gemm' (op Gemm)"),
                    HasSubstr("--loss cross-entropy")));
  // A last LogSoftmax the loss cannot take in is named with the reason.
  auto last_dim = ImportOnnxModel(TinyModel(13, "", [](ModelMaker& m) {
                                    m.graph()->mutable_output()->Clear();
                                    ModelMaker::IntAttr(m.Node("LogSoftmax", "/LogSoftmax", {"r"},
                                                               {"log_probs"}),
                                                        "axis", -1);
                                    m.Output("log_probs");
                                  }),
                                  "tiny", nll);
  ASSERT_FALSE(last_dim.ok());
  EXPECT_THAT(last_dim.status().message(),
              AllOf(HasSubstr("'/LogSoftmax' (op LogSoftmax), which the loss cannot take in"),
                    HasSubstr("over dim 3 of a rank-4 tensor")));
  OnnxImportOptions unknown;
  EXPECT_THAT(SetOnnxLoss("nl", unknown).message(),
              HasSubstr("cross-entropy, nll, mse, bce or none"));
}

// --loss bce: nn.BCEWithLogitsLoss of the logits against a float target of
// their shape, the logits' gradient (sigmoid - target) / n.
TEST(OnnxImportTest, BceTakesATargetOfTheOutputsShape) {
  OnnxImportOptions bce;
  ASSERT_TRUE(SetOnnxLoss("bce", bce).ok());
  auto g = ImportOnnxModel(TinyModel(), "tiny", bce);
  ASSERT_TRUE(g.ok()) << g.status();
  const NodeId loss = g->Find("loss"), target = g->Find("target");
  EXPECT_EQ(g->op(loss), "bce_with_logits");
  EXPECT_EQ(*g->shape(target), (Shape{2, 5}));
  EXPECT_EQ(g->dtype(target), DType::kFloat32);
  EXPECT_EQ(g->op(g->Find("grad:logits")), "bce_with_logits_backward");
  EXPECT_NE(g->Find("grad:fc.weight"), kNoNode);
}

TEST(OnnxImportTest, SupportedOpsAreListed) {
  const std::vector<std::string> ops = SupportedOnnxOps();
  EXPECT_THAT(ops, ::testing::Contains("Conv"));
  EXPECT_THAT(ops, ::testing::Contains("BatchNormalization"));
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
}

}  // namespace
}  // namespace pebble
