#include "runtime/workspace.h"

#include <algorithm>
#include <utility>

#include "graph/status.h"

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
