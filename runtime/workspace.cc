#include "runtime/workspace.h"

#include <algorithm>
#include <utility>

#include "graph/status.h"
#include "runtime/executor.h"

namespace pebble {

absl::StatusOr<Graph> WithBackendWorkspace(const Graph& graph, Backend& backend,
                                           WorkspaceQueryStats* stats, WorkspaceChoice choice) {
  WorkspaceQueryStats s;
  GraphBuilder builder(graph.name());
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    NodeSpec spec = SpecOf(graph, v);
    // A collective runs no kernel on the backend (its staging is host memory).
    if (!graph.persistent(v) && !graph.collective(v) && graph.shape(v).has_value() &&
        graph.dtype(v).has_value()) {
      // A node that its inputs do not make is named before a kernel probe
      // of it, or of a reader, fails on its shape.
      if (std::all_of(graph.inputs(v).begin(), graph.inputs(v).end(), [&](NodeId u) {
            return graph.shape(u).has_value() && graph.dtype(u).has_value();
          })) {
        RETURN_IF_ERROR(CheckOperatorTypes(graph, v));
      }
      ASSIGN_OR_RETURN(const int64_t bytes, backend.QueryWorkspace(graph, v, choice));
      ++s.queried;
      s.largest_bytes = std::max(s.largest_bytes, bytes);
      if (bytes > spec.workspace) {
        spec.workspace = bytes;
        ++s.raised;
      }
    }
    builder.AddNode(std::move(spec));
  }
  for (NodeId v : graph.outputs()) builder.AddOutput(graph.id(v));
  if (stats != nullptr) *stats = s;
  return builder.Build();
}

}  // namespace pebble
