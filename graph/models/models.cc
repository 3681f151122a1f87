// The model registry, the model-name parser and BuildModel's dispatch.
#include "graph/models/models.h"

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/autodiff.h"
#include "graph/models/transformer.h"
#include "graph/optimizer.h"
#include "graph/models/zoo_internal.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {
namespace {

using BuildFn = std::function<absl::StatusOr<Graph>(const zoo::ModelArgs&,
                                                    const CostModel&)>;

struct ModelEntry {
  ModelInfo info;
  BuildFn build;
};

ModelEntry Network(std::string name, std::string description,
                   std::vector<ModelParam> params, BuildFn build) {
  // Every network's training step may end with an optimizer's (BuildModel).
  params.push_back({"optimizer", "none",
                    "none, sgd, adam or adamw: the optimizer's step in the graph, with "
                    "PyTorch's defaults (docs/training.md; --optimizer takes settings)"});
  params.push_back({"optimizer_state", "device",
                    "device, host or auto: where the optimizer's state lives between steps "
                    "(host: streamed through the updates; auto: the plan chooses per tensor, "
                    "docs/training.md)"});
  params.push_back({"parameters", "device",
                    "device, host or auto: where the updated parameters live between steps "
                    "(host: streamed to their uses; auto: the plan chooses per tensor; needs "
                    "an optimizer, docs/training.md)"});
  params.push_back({"gradients", "keep",
                    "keep or drop: whether the parameters' gradients stay outputs of the step "
                    "(drop: each freed by its update, which may then run early; needs an "
                    "optimizer, docs/training.md)"});
  params.push_back({"updates", "device",
                    "device, host or auto: where the optimizer's updates run (host: on the "
                    "CPU, on host copies, the state then on the host; auto: the plan chooses "
                    "per parameter; needs an optimizer, docs/training.md)"});
  params.push_back({"max_grad_norm", "none",
                    "none or a positive number: the gradients clipped by their 2-norm before "
                    "the updates, as clip_grad_norm_ (needs an optimizer, docs/training.md)"});
  return {{std::move(name), std::move(description), std::move(params),
           /*training_graph=*/true},
          std::move(build)};
}

ModelEntry Pebbling(std::string name, std::string description,
                    std::vector<ModelParam> params, BuildFn build) {
  return {{std::move(name), std::move(description), std::move(params),
           /*training_graph=*/false},
          std::move(build)};
}

// transformer.h takes integer parameters and checks their ranges itself.
absl::StatusOr<Graph> BuildTransformerModel(const zoo::ModelArgs& args,
                                            const CostModel& cost) {
  std::map<std::string, int64_t> params;
  for (const auto& entry : args.values()) {
    const std::string& name = entry.first;
    ASSIGN_OR_RETURN(params[name],
                     args.Int(name, std::numeric_limits<int64_t>::min(),
                              std::numeric_limits<int64_t>::max()));
  }
  return BuildTransformer(params, cost, args.graph_name());
}

// batch and image of the ImageNet classifiers (vgg16, resnet18, resnet50).
std::vector<ModelParam> ImageNetParams() {
  return {{"batch", "32", "images per batch"},
          {"image", "224", "input height and width (pixels)"}};
}

// Every built-in model, in the order `pebble models` lists them. docs/models.md
// describes each one.
const std::vector<ModelEntry>& Registry() {
  static const auto* const registry = new std::vector<ModelEntry>{
      Network("tanh-chain",
              "L tanh ops on a variable x, loss = sum (the gradient "
              "tf.gradients(y, x) of the TensorFlow memory talk)",
              {{"length", "8", "number of tanh ops"},
               {"size", "1000000", "elements of x and of every activation"}},
              zoo::BuildTanhChain),
      Network("conv3d",
              "three 3x3x3 Conv3d+ReLU layers (1->4->8->1 channels), MSE loss",
              {{"n", "64", "edge of the cubic input volume (voxels)"},
               {"batch", "1", "volumes per batch"}},
              zoo::BuildConv3d),
      Network("mnist-cnn",
              "two-conv MNIST CNN (valid 5x5 convs, 2 dense layers; "
              "1,111,946 parameters), softmax cross-entropy",
              {{"batch", "64", "images (1x28x28) per batch"}},
              zoo::BuildMnistCnn),
      Network("vgg16", "torchvision vgg16 (138,357,544 parameters), 1000 classes",
              ImageNetParams(), zoo::BuildVgg16),
      Network("resnet18",
              "torchvision resnet18 (11,689,512 parameters), 1000 classes",
              ImageNetParams(), zoo::BuildResNet18),
      Network("resnet50",
              "torchvision resnet50 (25,557,032 parameters), 1000 classes",
              ImageNetParams(), zoo::BuildResNet50),
      Network("unet3d",
              "3-D U-Net for volumetric segmentation (large: 40,158,853 "
              "parameters; small: 14,496,517), per-voxel cross-entropy",
              {{"batch", "2", "volumes per batch"},
               {"variant", "large", "large (4 down/up levels, 64..512 "
                                    "channels) or small (3 levels, 64..256)"},
               {"dtype", "fp32", "fp32, fp16 or bf16 for activations and "
                                 "parameters"},
               {"depth", "26", "input depth D (voxels)"},
               {"height", "150", "input height H (voxels)"},
               {"width", "320", "input width W (voxels)"},
               {"classes", "5", "output classes per voxel"},
               {"features", "64", "inc's channels; every level's scale with "
                                  "them (64: the sizes above)"}},
              zoo::BuildUNet3d),
      Network("transformer",
              "GPT-2-style decoder-only language model (Hugging Face GPT2 "
              "names), next-token cross-entropy",
              TransformerParams(), BuildTransformerModel),
      Pebbling("path", "a path of n unit nodes; output the last",
               {{"n", "16", "number of nodes"}}, zoo::BuildPath),
      Pebbling("pyramid",
               "pyramid of height h (bottom level h+1 nodes, each node reads "
               "the two below it); h+2 pebbles",
               {{"h", "8", "height (levels minus one)"}}, zoo::BuildPyramid),
      Pebbling("tree",
               "complete binary in-tree of height h (2^h leaves, output the "
               "root); h+2 pebbles",
               {{"h", "4", "height"}}, zoo::BuildTree),
      Pebbling("linear",
               "Checkmate's gen_linear_graph: a path of 2n+1 nodes plus an "
               "edge from node i to node 2n-i for i < n",
               {{"n", "8", "forward nodes"}}, zoo::BuildLinear),
      Pebbling("random",
               "seeded random DAG: each node reads 1-3 earlier nodes; "
               "outputs are the sinks",
               {{"n", "50", "number of nodes"},
                {"seed", "0", "random seed (non-negative integer)"},
                {"sizes", "unit", "unit (bytes = cost = 1) or random (bytes "
                                  "1..100, cost 1..10)"}},
               zoo::BuildRandomDag),
  };
  return *registry;
}

const ModelEntry* FindEntry(absl::string_view name) {
  for (const ModelEntry& entry : Registry()) {
    if (entry.info.name == name) return &entry;
  }
  return nullptr;
}

std::string ModelNames() {
  std::vector<std::string> names;
  for (const ModelEntry& entry : Registry()) names.push_back(entry.info.name);
  return absl::StrJoin(names, ", ");
}

absl::Status UnknownModel(absl::string_view name) {
  std::vector<std::string> names;
  for (const ModelEntry& entry : Registry()) names.push_back(entry.info.name);
  const std::string nearest = NearestName(name, names);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model '", name, "'",
      nearest.empty() ? std::string() : absl::StrCat(" (did you mean '", nearest, "'?)"),
      " (known models: ", ModelNames(), ")"));
}

}  // namespace

namespace zoo {

const std::string& ModelArgs::Text(absl::string_view name) const {
  const auto it = values_.find(std::string(name));
  PEBBLE_CHECK(it != values_.end(), "model parameter not declared");
  return it->second;
}

absl::StatusOr<int64_t> ModelArgs::Int(absl::string_view name, int64_t min,
                                       int64_t max) const {
  const std::string& text = Text(name);
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model_, "': parameter '", name,
                     "' must be an integer, got '", text, "'"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model_, "': parameter '", name, "' = ", value,
                     " is out of range [", min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<std::string> ModelArgs::Choice(
    absl::string_view name, const std::vector<std::string>& choices) const {
  const std::string& text = Text(name);
  for (const std::string& choice : choices) {
    if (text == choice) return text;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model '", model_, "': parameter '", name, "' = '", text,
                   "' is not one of ", absl::StrJoin(choices, ", ")));
}

absl::StatusOr<DType> ModelArgs::FloatDType(absl::string_view name) const {
  const std::string& text = Text(name);
  absl::StatusOr<DType> dtype = ParseDType(text);
  if (!dtype.ok() || (*dtype != DType::kFloat32 && *dtype != DType::kFloat16 &&
                      *dtype != DType::kBFloat16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model_, "': parameter '", name, "' = '", text,
                     "' is not a floating-point dtype (fp32, fp16 or bf16)"));
  }
  return *dtype;
}

absl::StatusOr<Graph> FinishTrainingGraph(NetBuilder& nb,
                                          const CostModel& cost) {
  const Value loss = nb.Find("loss");
  if (nb.status().ok()) PEBBLE_CHECK(loss.valid(), "model has no 'loss' node");
  nb.MarkOutput(loss);
  ASSIGN_OR_RETURN(Graph forward, nb.Build());
  return BuildTrainingGraph(forward, "loss", cost);
}

}  // namespace zoo

const std::vector<ModelInfo>& ListModels() {
  static const auto* const infos = [] {
    auto* list = new std::vector<ModelInfo>;
    for (const ModelEntry& entry : Registry()) list->push_back(entry.info);
    return list;
  }();
  return *infos;
}

std::string ModelSpec::ToString() const {
  if (params.empty()) return name;
  std::vector<std::string> items;
  for (const auto& [key, value] : params) {  // std::map: sorted by key
    items.push_back(absl::StrCat(key, "=", value));
  }
  return absl::StrCat(name, ":", absl::StrJoin(items, ","));
}

// Grammar: name [":" key "=" value ("," key "=" value)*], blanks around
// tokens ignored. Keys and values are non-empty and hold no ',', ':' or '='.
absl::StatusOr<ModelSpec> ParseModelSpec(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  if (trimmed.empty()) {
    return absl::InvalidArgumentError("empty model name");
  }
  ModelSpec spec;
  const size_t colon = trimmed.find(':');
  spec.name = std::string(absl::StripAsciiWhitespace(trimmed.substr(0, colon)));
  if (spec.name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec '", trimmed, "' has no model name"));
  }
  if (FindEntry(spec.name) == nullptr) return UnknownModel(spec.name);
  if (colon == absl::string_view::npos) return spec;

  const absl::string_view list = trimmed.substr(colon + 1);
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    const std::vector<absl::string_view> kv = absl::StrSplit(item, '=');
    const absl::string_view key =
        kv.empty() ? "" : absl::StripAsciiWhitespace(kv[0]);
    const absl::string_view value =
        kv.size() < 2 ? "" : absl::StripAsciiWhitespace(kv[1]);
    if (kv.size() != 2 || key.empty() || value.empty() ||
        key.find(':') != absl::string_view::npos ||
        value.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model spec '", trimmed, "': malformed parameter '",
          absl::StripAsciiWhitespace(item), "' (expected key=value)"));
    }
    const auto [it, inserted] =
        spec.params.emplace(std::string(key), std::string(value));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model spec '", trimmed, "': parameter '", key, "' given twice"));
    }
  }
  return spec;
}

absl::StatusOr<Graph> BuildModel(const ModelSpec& spec, CostModel cost) {
  const ModelEntry* entry = FindEntry(spec.name);
  if (entry == nullptr) return UnknownModel(spec.name);

  std::map<std::string, std::string> values;
  std::vector<std::string> valid;
  for (const ModelParam& param : entry->info.params) {
    values[param.name] = param.default_value;
    valid.push_back(param.name);
  }
  for (const auto& [key, value] : spec.params) {
    if (values.find(key) == values.end()) {
      const std::string nearest = NearestName(key, valid);
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name, "' has no parameter '", key, "'",
          nearest.empty() ? std::string() : absl::StrCat(" (did you mean '", nearest, "'?)"),
          " (valid: ", valid.empty() ? "none" : absl::StrJoin(valid, ", "), ")"));
    }
    values[key] = value;
  }
  std::string optimizer = "none", state = "device", parameters = "device", gradients = "keep",
              updates = "device", max_grad_norm = "none";
  if (entry->info.training_graph) {
    max_grad_norm = values["max_grad_norm"];
    values.erase("max_grad_norm");
    if (max_grad_norm != "none" && values["optimizer"] == "none") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name, "': max_grad_norm=", max_grad_norm,
          " needs an optimizer (optimizer=sgd, adam or adamw; or leave it out and give "
          "--optimizer NAME:max_grad_norm=", max_grad_norm, ")"));
    }
    optimizer = values["optimizer"];
    state = values["optimizer_state"];
    parameters = values["parameters"];
    values.erase("optimizer");
    values.erase("optimizer_state");
    gradients = values["gradients"];
    values.erase("parameters");
    values.erase("gradients");
    updates = values["updates"];
    values.erase("updates");
    if (updates != "device" && updates != "host" && updates != "auto") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name, "': updates=", updates, " (expected device, host or auto)"));
    }
    if (updates != "device" && optimizer == "none") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name, "': updates=", updates, " needs an optimizer (optimizer=sgd, "
          "adam or adamw)"));
    }
    if (gradients != "keep" && gradients != "drop") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name, "': gradients=", gradients, " (expected keep or drop)"));
    }
    if (gradients == "drop" && optimizer == "none") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name, "': gradients=drop needs an optimizer (optimizer=sgd, adam or "
          "adamw): without one nothing reads the gradients"));
    }
    for (const auto& [key, tier] : {std::pair{"optimizer_state", state},
                                    std::pair{"parameters", parameters}}) {
      if (tier != "device" && tier != "host" && tier != "auto") {
        return absl::InvalidArgumentError(absl::StrCat(
            "model '", spec.name, "': ", key, "=", tier, " (expected device, host or auto)"));
      }
      if (tier != "device" && optimizer == "none") {
        return absl::InvalidArgumentError(absl::StrCat(
            "model '", spec.name, "': ", key, "=", tier,
            " needs an optimizer (optimizer=sgd, adam or adamw)"));
      }
    }
  }
  const zoo::ModelArgs args(spec.name, spec.ToString(), std::move(values));
  absl::StatusOr<Graph> graph = entry->build(args, cost);
  if (graph.ok() && optimizer != "none") {
    absl::StatusOr<OptimizerSpec> step = ParseOptimizer(optimizer);
    if (!step.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model '", spec.name, "': optimizer=",
                                                     optimizer, ": ", step.status().message()));
    }
    if (state != "device" && !step->keeps_state()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name, "': optimizer_state=", state, ", but ", optimizer,
          " keeps no state (SGD without momentum)"));
    }
    // With updates on the host the state lives there unless the spec says
    // optimizer_state=device itself.
    if (state != "device" || (updates != "device" && spec.params.count("optimizer_state") > 0)) {
      step->state_home = *ParseTier(state);
    }
    if (parameters != "device") step->parameter_home = *ParseTier(parameters);
    step->keep_gradients = gradients == "keep";
    if (updates != "device") step->updates = *ParseTier(updates);
    if (max_grad_norm != "none") {
      absl::StatusOr<double> clip = ParseOptimizerNumber("max_grad_norm", max_grad_norm);
      if (!clip.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("model '", spec.name, "': ", clip.status().message()));
      }
      step->max_grad_norm = *clip;
    }
    if (step->updates == Tier::kAuto && step->state_home == Tier::kDevice &&
        step->keeps_state()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name, "': updates=auto with optimizer_state=device is not planned "
          "(give optimizer_state=host or auto)"));
    }
    graph = AddOptimizerStep(*graph, *step, cost);
  }
  if (!graph.ok()) {
    // Prefix the model when the builder's message does not name it (shape
    // errors from NetBuilder name the node only).
    const std::string prefix = absl::StrCat("model '", spec.name, "'");
    if (!absl::StrContains(graph.status().message(), prefix)) {
      return absl::Status(
          graph.status().code(),
          absl::StrCat("model '", spec.ToString(), "': ",
                       graph.status().message()));
    }
  }
  return graph;
}

absl::StatusOr<Graph> BuildModel(absl::string_view text, CostModel cost) {
  ASSIGN_OR_RETURN(const ModelSpec spec, ParseModelSpec(text));
  return BuildModel(spec, cost);
}

}  // namespace pebble
