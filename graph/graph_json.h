// Graph files (SPEC section 1, docs/graph-format.md) and DOT export.
#ifndef PEBBLE_GRAPH_GRAPH_JSON_H_
#define PEBBLE_GRAPH_GRAPH_JSON_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/text_input.h"
#include "nlohmann/json.hpp"

namespace pebble {

// Parses a pebble-graph document. Every error of SPEC section 1 is an
// InvalidArgument whose one-line message names the node (by id, or as
// `nodes[i]` when the id itself is bad) and the field at fault. Field types
// are checked strictly; unknown keys are errors, except keys starting with
// '_' (free-form annotations such as "_comment"), which are ignored.
// Never throws.
absl::StatusOr<Graph> GraphFromJson(const nlohmann::json& doc);

// Parses JSON text, then GraphFromJson. Besides its errors, InvalidArgument
// for: invalid JSON and numbers that overflow a double (1e999: JSON cannot
// spell infinity), with line and column ("line 3, column 7: ..."); a NUL
// byte; a key repeated in one object (nlohmann would keep the last
// silently) and nesting deeper than kMaxJsonDepth (ParseStrictJson). All four name the path to the value and, when
// it was already read, the node ("(at nodes[2].cost, node 'a2')"). The
// nodes are read one at a time as the text is parsed, never held as a JSON
// document of all of them (which takes about ten times the text); errors
// come in GraphFromJson's order all the same.
absl::StatusOr<Graph> ParseGraphJson(absl::string_view text);

// Reads and parses a file of at most kMaxJsonFileBytes (ReadBoundedFile).
// Every message starts with the path; JSON syntax errors read
// "path:line:column: ...". NotFound if the file does not exist,
// InvalidArgument for anything else.
absl::StatusOr<Graph> ReadGraphFile(const std::string& path);

// Largest `bytes`, `workspace` or shape dimension read: 2^53, so that
// every JSON reader (JavaScript, Python floats) holds the value exactly. It
// is kMaxBytes, what GraphBuilder accepts: a graph that builds writes a file
// that reads back.
inline constexpr int64_t kMaxJsonInteger = kMaxBytes;

// The graph as a pebble-graph document such that GraphFromJson reads back an
// identical graph (same node order, so the same NodeIds). Keys in the order
// format, version, name, nodes (by NodeId), outputs; node keys in the order
// id, op, bytes, cost, inputs, alias_of, workspace, persistent, home,
// in_place, role, shape, dtype, attrs. Node fields at their default are left out, except id, op and bytes;
// `role` is written when it differs from its default (input if persistent,
// else forward). Converts implicitly to nlohmann::json (keys then sorted).
// Ids are not checked for UTF-8: to print a graph that did not come from a
// file, dump with nlohmann::json::error_handler_t::replace (as
// GraphToJsonText does), since plain dump() throws on invalid UTF-8.
nlohmann::ordered_json GraphToJson(const Graph& graph);

// GraphToJson as text in the layout of the SPEC's example: one node per
// line, ending with a newline. What `pebble export --format json` writes.
std::string GraphToJsonText(const Graph& graph);

// Writes GraphToJsonText(graph) to `path`.
absl::Status WriteGraphFile(const Graph& graph, const std::string& path);

// Graphviz DOT (see the legend comment it starts with): data inputs as
// green boxes, parameters as yellow boxes, buffers as grey boxes, forward
// nodes as blue ellipses, backward nodes as red ellipses, outputs with a
// double border. Labels show id, op, bytes (binary units, 3 significant
// digits), "(view of b)" for an alias and the shape when known. An input
// that a node reads k > 1 times is one edge labelled "xk"; the edge from
// the node an alias views is dashed.
std::string GraphToDot(const Graph& graph);

}  // namespace pebble

#endif  // PEBBLE_GRAPH_GRAPH_JSON_H_
