// Graph files (SPEC section 1) and DOT export.
#ifndef PEBBLE_GRAPH_GRAPH_JSON_H_
#define PEBBLE_GRAPH_GRAPH_JSON_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"

namespace pebble {

// Parses a pebble-graph document. Every error of SPEC section 1 is an
// InvalidArgument whose message names the node (or the field) at fault.
absl::StatusOr<Graph> GraphFromJson(const nlohmann::json& doc);
absl::StatusOr<Graph> ParseGraphJson(std::string_view text);
absl::StatusOr<Graph> ReadGraphFile(const std::string& path);

// Writes the graph so that GraphFromJson reads back an identical graph.
// Fields at their default are left out; `role` is written (an extension of
// SPEC section 1: input / parameter / buffer / forward / backward).
nlohmann::json GraphToJson(const Graph& graph);

// Graphviz DOT: persistent nodes as boxes, outputs with a double border,
// forward nodes blue, backward nodes red; node labels show id, op and bytes.
std::string GraphToDot(const Graph& graph);

}  // namespace pebble

#endif  // PEBBLE_GRAPH_GRAPH_JSON_H_
