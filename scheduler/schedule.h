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

// kHostCompute ("host_compute") runs an in-place node with a host_cost on
// the host, on host copies (docs/semantics.md, "Updates on the host");
// kAllReduce ("all_reduce") sums a resident tensor over the ranks of data
// parallelism, in place, on the network (docs/semantics.md, "Collectives
// across ranks").
enum class Action : uint8_t { kCompute, kFree, kOffload, kPrefetch, kHostCompute, kAllReduce };
absl::string_view ActionName(Action action);  // "compute", "free", ...
absl::StatusOr<Action> ParseAction(absl::string_view name);

// A step acts on one node. `joins_bucket` makes the step one collective
// with the step before it: an all_reduce step joins an all_reduce step (a
// bucket of gradients summed as one message, as DistributedDataParallel's
// buckets are: docs/semantics.md, "Buckets"); a compute of a collective
// node joins a compute of the same op (a unit's parameters gathered or
// its gradients reduce-scattered as one message, as FSDP's flat parameter
// is: "Buckets of collectives"). In JSON, the steps of a bucket share a
// "bucket" number.
struct Step {
  Step() = default;
  constexpr Step(Action a, NodeId v, bool joins = false)
      : action(a), joins_bucket(joins), node(v) {}
  Action action = Action::kCompute;
  bool joins_bucket = false;
  NodeId node = kNoNode;
  bool operator==(const Step&) const = default;
};
static_assert(sizeof(Step) == 8, "a schedule of millions of steps keeps 8 bytes a step");

struct Schedule {
  std::vector<Step> steps;
  bool operator==(const Schedule&) const = default;
};

// JSON per SPEC section 2 (nodes by id). Reading checks the format, the
// version, the actions and that every node exists in `graph`, and refuses
// unknown keys (but '_' annotations) and a "bucket" (a non-negative
// integer) on anything but an all_reduce step or a compute of a collective
// node, or on steps that are not consecutive; writing numbers the buckets of two steps or more from 0; ParseScheduleText and
// ReadScheduleFile also refuse what ParseStrictJson does (repeated keys, NUL
// bytes), and ReadScheduleFile what ReadBoundedFile does (files over
// kMaxJsonFileBytes, anything but a regular file). Whether the steps are
// valid is the simulator's business, but ScheduleToJson's steps must name
// nodes of `graph` (a programming error otherwise: checked, the step named).
nlohmann::json ScheduleToJson(const Graph& graph, const Schedule& schedule);
absl::StatusOr<Schedule> ScheduleFromJson(const Graph& graph,
                                          const nlohmann::json& doc);
// Schedule text, parsed without a JSON document of its steps: each step is
// checked and kept (8 bytes) as soon as it is read, so memory is the text
// and the steps, where a document took about 330 bytes a step. A
// non-empty `source` begins every message ("source:L:C: ..." for JSON
// errors, "source: schedule step 3: ..." for the others); `json_error`,
// when given, tells whether the text was not valid JSON at all.
absl::StatusOr<Schedule> ParseScheduleText(const Graph& graph, absl::string_view text,
                                           absl::string_view source = "",
                                           bool* json_error = nullptr);
absl::StatusOr<Schedule> ReadScheduleFile(const Graph& graph,
                                          const std::string& path);

// How many steps of `schedule` take `action`.
int64_t CountSteps(const Schedule& schedule, Action action);
// How many collectives its all_reduce steps make: one a bucket.
int64_t CountBuckets(const Schedule& schedule);

// `graph` with each auto home (Tier::kAuto: the plan chooses) resolved by
// `schedule`: the host where the schedule's first step on the node is a
// prefetch or a host compute that reads or writes it, else the device (docs/semantics.md, "Home tiers and in-place
// updates"). The simulator, the memory layout and the executor read a
// graph with auto homes so.
Graph ResolveHomes(const Graph& graph, const Schedule& schedule);

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
