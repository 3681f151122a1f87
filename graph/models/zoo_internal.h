// Internal to the model zoo (graph/models/): the resolved parameters of one
// model and the builder of every built-in model. Callers outside the zoo use
// graph/models/models.h only.
#ifndef PEBBLE_GRAPH_MODELS_ZOO_INTERNAL_H_
#define PEBBLE_GRAPH_MODELS_ZOO_INTERNAL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/net_builder.h"

namespace pebble::zoo {

// Every declared parameter of one model with its value: the one given in the
// spec, else the default. BuildModel() has already rejected parameters the
// model does not declare, so a look-up of an undeclared name is a bug.
class ModelArgs {
 public:
  ModelArgs(std::string model, std::string graph_name,
            std::map<std::string, std::string> values)
      : model_(std::move(model)),
        graph_name_(std::move(graph_name)),
        values_(std::move(values)) {}

  const std::string& model() const { return model_; }
  // The name the built graph carries (the canonical spec).
  const std::string& graph_name() const { return graph_name_; }
  const std::map<std::string, std::string>& values() const { return values_; }

  // The raw text of a declared parameter.
  const std::string& Text(absl::string_view name) const;
  // A decimal integer in [min, max]; InvalidArgument naming the model, the
  // parameter, the value and the range otherwise.
  absl::StatusOr<int64_t> Int(absl::string_view name, int64_t min,
                              int64_t max) const;
  // One of `choices` (exact match); InvalidArgument listing them otherwise.
  absl::StatusOr<std::string> Choice(
      absl::string_view name, const std::vector<std::string>& choices) const;
  // A floating-point dtype: fp32, fp16 or bf16 (ParseDType's spellings).
  absl::StatusOr<DType> FloatDType(absl::string_view name) const;

 private:
  std::string model_;
  std::string graph_name_;
  std::map<std::string, std::string> values_;
};

// Marks the node "loss" (the scalar loss, which the model must have added
// unless `nb` holds an error) as the forward graph's output and turns the
// forward graph into the training graph (SPEC section 3). Returns the
// builder's first error instead, if any.
absl::StatusOr<Graph> FinishTrainingGraph(NetBuilder& nb,
                                          const CostModel& cost);

// Pebbling graphs (pebbling.cc): op "generic", bytes 1, cost 1 (or random
// sizes for `random`), nothing persistent, no workspace.
absl::StatusOr<Graph> BuildPath(const ModelArgs& args, const CostModel& cost);
absl::StatusOr<Graph> BuildPyramid(const ModelArgs& args,
                                   const CostModel& cost);
absl::StatusOr<Graph> BuildTree(const ModelArgs& args, const CostModel& cost);
absl::StatusOr<Graph> BuildLinear(const ModelArgs& args, const CostModel& cost);
absl::StatusOr<Graph> BuildRandomDag(const ModelArgs& args,
                                     const CostModel& cost);

// Networks: training graphs.
absl::StatusOr<Graph> BuildTanhChain(const ModelArgs& args,
                                     const CostModel& cost);  // tanh_chain.cc
absl::StatusOr<Graph> BuildConv3d(const ModelArgs& args,
                                  const CostModel& cost);     // cnn.cc
absl::StatusOr<Graph> BuildMnistCnn(const ModelArgs& args,
                                    const CostModel& cost);   // cnn.cc
absl::StatusOr<Graph> BuildVgg16(const ModelArgs& args,
                                 const CostModel& cost);      // cnn.cc
absl::StatusOr<Graph> BuildResNet18(const ModelArgs& args,
                                    const CostModel& cost);   // resnet.cc
absl::StatusOr<Graph> BuildResNet50(const ModelArgs& args,
                                    const CostModel& cost);   // resnet.cc
absl::StatusOr<Graph> BuildUNet3d(const ModelArgs& args,
                                  const CostModel& cost);     // unet3d.cc

}  // namespace pebble::zoo

#endif  // PEBBLE_GRAPH_MODELS_ZOO_INTERNAL_H_
