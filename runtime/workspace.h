// Kernel workspace in the plan (docs/runtime.md, "Workspace"): the graph a
// planner sees carries, per computed node, the scratch its kernel takes on
// the backend that will run it, so that the layout gives that scratch an
// arena offset and nothing is allocated outside the arena during a step.
#ifndef PEBBLE_RUNTIME_WORKSPACE_H_
#define PEBBLE_RUNTIME_WORKSPACE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "runtime/backend.h"

namespace pebble {

struct WorkspaceQueryStats {
  int queried = 0;            // computed nodes with a shape, asked
  int raised = 0;             // of them, nodes whose workspace grew
  int64_t largest_bytes = 0;  // the largest answer
};

// A copy of `graph` in which every computed node with a shape and dtype has
// workspace max(its own, backend.QueryWorkspace(graph, v, choice)): the
// graph's own figure stays where it is larger (a workspace the user asked
// for is never cut). Errors name the node. `stats` (optional) counts.
absl::StatusOr<Graph> WithBackendWorkspace(const Graph& graph, Backend& backend,
                                           WorkspaceQueryStats* stats = nullptr,
                                           WorkspaceChoice choice = WorkspaceChoice::kFastest);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_WORKSPACE_H_
