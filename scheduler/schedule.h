// Schedules (SPEC section 2): the steps a plan executes, in order.
#ifndef PEBBLE_SCHEDULER_SCHEDULE_H_
#define PEBBLE_SCHEDULER_SCHEDULE_H_

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"

namespace pebble {

enum class Action : uint8_t { kCompute, kFree, kOffload, kPrefetch };
absl::string_view ActionName(Action action);  // "compute", "free", ...
absl::StatusOr<Action> ParseAction(absl::string_view name);

struct Step {
  Action action;
  NodeId node;
  bool operator==(const Step&) const = default;
};

struct Schedule {
  std::vector<Step> steps;
  bool operator==(const Schedule&) const = default;
};

// JSON per SPEC section 2 (nodes by id). Reading checks the format, the
// version, the actions and that every node exists in `graph`, and refuses
// unknown keys (but '_' annotations); ReadScheduleFile also refuses what
// ParseStrictJson does (repeated keys, NUL bytes, files over
// kMaxJsonFileBytes). Whether the steps are valid is the simulator's
// business.
nlohmann::json ScheduleToJson(const Graph& graph, const Schedule& schedule);
absl::StatusOr<Schedule> ScheduleFromJson(const Graph& graph,
                                          const nlohmann::json& doc);
absl::StatusOr<Schedule> ReadScheduleFile(const Graph& graph,
                                          const std::string& path);

// SPEC section 2, "free at last use": the one-shot schedule of an execution
// order. `order` must be a topological order of exactly the non-persistent
// ancestors of the outputs (each once); else InvalidArgument naming the
// offending node.
absl::StatusOr<Schedule> FreeAtLastUse(const Graph& graph,
                                       const std::vector<NodeId>& order);

// The graph's own order restricted to the non-persistent ancestors of the
// outputs: what a framework runs.
std::vector<NodeId> DefaultOrder(const Graph& graph);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_SCHEDULE_H_
