// `pebble import` and `--train` through the real binary, on the tiny models
// exported by PyTorch in tests/fuzz/corpus/onnx/ (tests/fuzz/onnx_corpus.py).
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "onnx/onnx_pb.h"
#include "tests/cli_test_util.h"

namespace {

namespace fs = std::filesystem;
using ::pebble::testing::ExpectOneLineError;
using ::pebble::testing::ReadFileText;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using Result = ::pebble::testing::CliResult;

Result Pebble(const std::string& args) { return ::pebble::testing::RunPebble(args); }

fs::path Scratch(const std::string& name) {
  return ::pebble::testing::ScratchDir("pebble_import", name);
}

std::string Corpus(const std::string& name) {
  return std::string(PEBBLE_SOURCE_DIR) + "/tests/fuzz/corpus/onnx/" + name + ".onnx";
}

// conv_bn_13.onnx with `edit` applied, written to `dir`.
fs::path EditedModel(const fs::path& dir, const std::function<void(onnx::ModelProto&)>& edit) {
  onnx::ModelProto model;
  EXPECT_TRUE(model.ParseFromString(ReadFileText(Corpus("conv_bn_13"))));
  edit(model);
  const fs::path path = dir / "edited.onnx";
  std::ofstream(path, std::ios::binary) << model.SerializeAsString();
  return path;
}

TEST(CliImportTest, ImportedModelsPlanAndRun) {
  const fs::path dir = Scratch("run");
  for (const std::string name : {"conv_bn_13", "conv_bn_14", "conv3d_softmax", "branches"}) {
    const std::string g = (dir / (name + ".json")).string();
    Result r = Pebble("import " + Corpus(name) + " --output " + g + " --json");
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
    const Json summary = Json::parse(r.out);
    EXPECT_EQ(summary["loss"], "cross-entropy");
    EXPECT_GT(summary["parameter_bytes"].get<int64_t>(), 0);
    r = Pebble("run --backend cpu --graph " + g + " --policy dtr --budget 80% --over-budget --json");
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
    const Json run = Json::parse(r.out);
    EXPECT_TRUE(run.contains("loss")) << name;
  }
}

// A weight that torch.onnx.export computed from the model's (named
// "onnx::Conv_7", as constant folding or an eval-mode export's fused batch
// norm names it) imports, with a note on stderr and in --json's "notes";
// the model's own names give none.
TEST(CliImportTest, ParametersTheExporterComputedAreNoted) {
  const fs::path dir = Scratch("folded");
  const fs::path model = EditedModel(dir, [](onnx::ModelProto& m) {
    for (auto& t : *m.mutable_graph()->mutable_initializer()) {
      if (t.name() == "0.weight") t.set_name("onnx::Conv_7");
    }
    for (auto& n : *m.mutable_graph()->mutable_node()) {
      for (auto& in : *n.mutable_input()) {
        if (in == "0.weight") in = "onnx::Conv_7";
      }
    }
  });
  const std::string g = (dir / "g.json").string();
  Result r = Pebble("import " + model.string() + " --output " + g + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("pebble: note: 1 parameter is not the model's own ('onnx::Conv_7')"));
  EXPECT_THAT(r.err, HasSubstr("do_constant_folding=False"));
  const Json summary = Json::parse(r.out);
  ASSERT_EQ(summary["notes"].size(), 1u);
  EXPECT_THAT(summary["notes"][0].get<std::string>(), HasSubstr("'onnx::Conv_7'"));
  r = Pebble("import " + Corpus("conv_bn_13") + " --output " + g + " --force --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(Json::parse(r.out)["notes"].empty());
}

TEST(CliImportTest, ForwardGraphIsTrainedWithTrain) {
  const fs::path dir = Scratch("train");
  const std::string forward = (dir / "forward.json").string();
  Result r = Pebble("import " + Corpus("conv_bn_13") + " --loss none --output " + forward);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json graph = Json::parse(ReadFileText(forward));
  for (const Json& node : graph["nodes"]) {
    EXPECT_NE(node["id"], "loss");
  }
  r = Pebble("plan --graph " + forward + " --train --loss mse --policy baseline --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Json::parse(r.out)["feasible"].get<bool>());
  // Without --train the forward graph is planned as it is; a training graph
  // cannot be trained twice.
  EXPECT_EQ(Pebble("plan --graph " + forward + " --policy baseline").exit_code, 0);
  const std::string training = (dir / "training.json").string();
  ASSERT_EQ(Pebble("import " + Corpus("conv_bn_13") + " --output " + training).exit_code, 0);
  ExpectOneLineError(Pebble("plan --train --graph " + training), 1,
                     {"--train", "'target'"});
  // --train reads a --graph only.
  EXPECT_EQ(Pebble("plan --train --model mnist-cnn").exit_code, 2);
  // A forward graph without a parameter would train nothing.
  const std::string weightless = (dir / "weightless.json").string();
  std::ofstream(weightless) << R"({"format": "pebble-graph", "version": 1, "nodes": [
      {"id": "x", "op": "input", "bytes": 16, "persistent": true, "shape": [4], "dtype": "fp32"},
      {"id": "r", "op": "relu", "bytes": 16, "inputs": ["x"], "shape": [4], "dtype": "fp32"}],
    "outputs": ["r"]})";
  ExpectOneLineError(Pebble("plan --train --loss mse --graph " + weightless), 1,
                     {"--train", "has no parameter"});
}

// examples/mlp-train.json, written by hand, is what --train makes of its
// forward graph examples/mlp.json: both run, to the same loss.
TEST(CliImportTest, HandWrittenTrainingGraphEqualsTrainOfItsForwardGraph) {
  const std::string dir = std::string(PEBBLE_SOURCE_DIR) + "/examples/";
  Result hand = Pebble("run --backend cpu --json --graph " + dir + "mlp-train.json");
  ASSERT_EQ(hand.exit_code, 0) << hand.err;
  Result trained = Pebble("run --backend cpu --json --graph " + dir + "mlp.json --train --loss mse");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const Json a = Json::parse(hand.out), b = Json::parse(trained.out);
  EXPECT_EQ(a["loss"], b["loss"]);
  EXPECT_EQ(a["measured"]["peak_bytes"], b["measured"]["peak_bytes"]);
}

TEST(CliImportTest, BadModelsGiveOneLineErrors) {
  const fs::path dir = Scratch("bad");
  const std::string out = (dir / "g.json").string();
  const std::string model = ReadFileText(Corpus("conv_bn_13"));
  const fs::path truncated = dir / "truncated.onnx";
  std::ofstream(truncated, std::ios::binary) << model.substr(0, model.size() / 3);
  ExpectOneLineError(Pebble("import " + truncated.string() + " --output " + out), 1,
                     {"truncated.onnx", "not an ONNX model"});
  ExpectOneLineError(Pebble("import " + (dir / "missing.onnx").string() + " --output " + out), 1,
                     {"missing.onnx"});
  ExpectOneLineError(Pebble("import " + dir.string() + " --output " + out), 1,
                     {"directory"});

  const fs::path old_opset = EditedModel(dir, [](onnx::ModelProto& m) {
    m.mutable_opset_import(0)->set_version(7);
  });
  ExpectOneLineError(Pebble("import " + old_opset.string() + " --output " + out), 1,
                     {"opset 7", "11 to 17"});
  const fs::path unknown = EditedModel(dir, [](onnx::ModelProto& m) {
    m.mutable_graph()->mutable_node(2)->set_op_type("Softsign");
  });
  ExpectOneLineError(Pebble("import " + unknown.string() + " --output " + out), 1,
                     {"op Softsign", "not supported"});
  const fs::path symbolic = EditedModel(dir, [](onnx::ModelProto& m) {
    m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()
        ->mutable_shape()->mutable_dim(0)->set_dim_param("batch");
  });
  ExpectOneLineError(Pebble("import " + symbolic.string() + " --output " + out), 1,
                     {"'input'", "--batch"});
  // With --batch it imports, at that batch.
  Result r = Pebble("import " + symbolic.string() + " --batch 4 --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(ReadFileText(out), HasSubstr("\"shape\": [4, 3, 8, 8]"));
  // An existing output is not replaced without --force.
  ExpectOneLineError(Pebble("import " + symbolic.string() + " --batch 4 --output " + out), 1,
                     {"--force"});
  // Bad options are command-line errors (exit 2).
  EXPECT_EQ(Pebble("import " + symbolic.string() + " --batch 0 --output -").exit_code, 2);
  EXPECT_EQ(Pebble("import " + symbolic.string() + " --loss hinge --output -").exit_code, 2);
}

// --frozen: initializers not to train become buffers (no gradient output);
// a pattern that matches none, or a malformed list, is a command-line
// error naming the option (exit 2), in fit --onnx too.
TEST(CliImportTest, FrozenInitializersAreNotTrained) {
  const fs::path dir = Scratch("frozen");
  const std::string model = Corpus("conv_bn_13");
  const std::string out = (dir / "g.json").string();
  Result all = Pebble("import " + model + " --json --output " + out);
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const Json trained = Json::parse(all.out);
  fs::remove(out);
  // (nn.Sequential's names: the convolution is "0", its batch norm "1")
  Result r = Pebble("import " + model + " --frozen '0.*' --json --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json frozen = Json::parse(r.out);
  EXPECT_LT(frozen["parameters"].get<int64_t>(), trained["parameters"].get<int64_t>());
  EXPECT_GT(frozen["buffers"].get<int64_t>(), trained["buffers"].get<int64_t>());
  EXPECT_EQ(trained["outputs"].get<int64_t>() - frozen["outputs"].get<int64_t>(),
            trained["parameters"].get<int64_t>() - frozen["parameters"].get<int64_t>());
  const Json graph = Json::parse(ReadFileText(out));
  for (const Json& node : graph["nodes"]) {
    const std::string id = node["id"].get<std::string>();
    if (id.rfind("0.", 0) == 0 && node.value("persistent", false)) {
      EXPECT_EQ(node["role"], "buffer") << id;
    }
    EXPECT_NE(id.rfind("grad:0.", 0), 0u) << id;
  }
  ExpectOneLineError(Pebble("import " + model + " --frozen '0.*,head.*' --output -"), 2,
                     {"--frozen 'head.*' matches none"});
  ExpectOneLineError(Pebble("import " + model + " --frozen '0.*,' --output -"), 2,
                     {"--frozen", "empty pattern"});
  ExpectOneLineError(Pebble("fit --onnx " + model + " --frozen head --budget 1GiB"), 2,
                     {"--frozen 'head' matches none"});
}

// fit --onnx: the largest batch whose training step fits, the model imported
// at each batch; pebble import --batch at that batch plans within the
// budget, at the next batch it does not.
TEST(CliImportTest, FitFindsTheLargestBatchOfAnOnnxModel) {
  const fs::path dir = Scratch("fit");
  const fs::path model = EditedModel(dir, [](onnx::ModelProto& m) {
    m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()
        ->mutable_shape()->mutable_dim(0)->set_dim_param("batch");
  });
  const std::string budget = "3MiB";
  Result r = Pebble("fit --onnx " + model.string() + " --budget " + budget +
                    " --policies baseline,rotor --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json doc = Json::parse(r.out);
  EXPECT_EQ(doc["model"], model.string());
  EXPECT_EQ(doc["vary"], "batch");
  ASSERT_EQ(doc["results"].size(), 2u);
  for (const Json& row : doc["results"]) {
    SCOPED_TRACE(row.dump());
    ASSERT_TRUE(row["value"].is_number_integer());
    const int64_t batch = row["value"].get<int64_t>();
    for (const int64_t b : {batch, batch + 1}) {
      const std::string g = (dir / absl::StrCat("g", b, ".json")).string();
      fs::remove(g);
      ASSERT_EQ(Pebble("import " + model.string() + " --batch " + std::to_string(b) +
                       " --output " + g).exit_code, 0);
      EXPECT_EQ(Pebble("plan --graph " + g + " --policy " + row["policy"].get<std::string>() +
                       " --budget " + budget).exit_code,
                b == batch ? 0 : 1)
          << "batch " << b;
    }
  }
  // What import notes of the model, fit notes too.
  const fs::path folded = EditedModel(dir, [](onnx::ModelProto& m) {
    m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()
        ->mutable_shape()->mutable_dim(0)->set_dim_param("batch");
    for (auto& t : *m.mutable_graph()->mutable_initializer()) {
      if (t.name() == "0.weight") t.set_name("onnx::Conv_7");
    }
    for (auto& n : *m.mutable_graph()->mutable_node()) {
      for (auto& in : *n.mutable_input()) {
        if (in == "0.weight") in = "onnx::Conv_7";
      }
    }
  });
  r = Pebble("fit --onnx " + folded.string() + " --budget " + budget +
             " --policies baseline --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("pebble: note: 1 parameter is not the model's own"));
  // The batch is what --onnx searches; --loss and --optimizer go with it.
  ExpectOneLineError(Pebble("fit --onnx " + model.string() + " --vary n --budget 1MiB"), 2,
                     {"--vary batch, not 'n'"});
  ExpectOneLineError(Pebble("fit --model conv3d --vary n --optimizer adam --budget 1MiB"), 2,
                     {"--optimizer goes with --onnx"});
  ExpectOneLineError(Pebble("fit --budget 1MiB"), 2, {"--model", "--onnx"});
  ExpectOneLineError(Pebble("fit --onnx " + (dir / "missing.onnx").string() + " --budget 1MiB"),
                     1, {"missing.onnx"});
}

}  // namespace
