// The model zoo: built-in networks and pebbling graphs, named with
// parameters as in SPEC section 5 ("conv3d:n=128,batch=2").
#ifndef PEBBLE_GRAPH_MODELS_MODELS_H_
#define PEBBLE_GRAPH_MODELS_MODELS_H_

#include <cstdint>
#include <map>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/net_builder.h"

namespace pebble {

// One parameter of a model: name, default value (as text), meaning.
struct ModelParam {
  std::string name;
  std::string default_value;
  std::string help;
};

struct ModelInfo {
  std::string name;         // "conv3d"
  std::string description;  // one line
  std::vector<ModelParam> params;
  bool training_graph = true;  // false: an abstract pebbling graph
};

// Every built-in model, in a stable order.
const std::vector<ModelInfo>& ListModels();

// Parsed model name: "unet3d:batch=2,variant=small" -> {"unet3d", {...}}.
struct ModelSpec {
  std::string name;
  std::map<std::string, std::string> params;  // only the ones given
  std::string ToString() const;               // canonical, sorted params
};
// Grammar: name [":" key "=" value ("," key "=" value)*], blanks around
// tokens ignored. InvalidArgument for an empty name, an unknown model, a
// malformed key=value or a key given twice. Parameter names and values are
// checked by BuildModel (docs/models.md lists them).
absl::StatusOr<ModelSpec> ParseModelSpec(absl::string_view text);

// Builds the model's graph: the training graph (forward + autodiff) for
// networks, the graph itself for pebbling graphs. Unknown model or
// parameter, or a bad value, is InvalidArgument naming it (an unknown
// parameter lists the valid ones); a size that makes a shape invalid is the
// builder's error, prefixed with the model. The graph is named
// spec.ToString().
absl::StatusOr<Graph> BuildModel(const ModelSpec& spec, CostModel cost = {});
absl::StatusOr<Graph> BuildModel(absl::string_view text, CostModel cost = {});

}  // namespace pebble

#endif  // PEBBLE_GRAPH_MODELS_MODELS_H_
