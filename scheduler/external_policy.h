// Policies written outside pebble, judged by pebble's simulator like the
// built-in ones (docs/library.md, "Policies from outside"):
//
// - a function registered at run time (RegisterExternalPolicy; the Python
//   module's pebble.register_policy), which `plan`, `compare` and `fit`
//   then find by name;
// - `exec:PROGRAM`, a program in any language: it reads one JSON document
//   (ExecPolicyInput) on stdin and writes a pebble-schedule JSON document
//   on stdout.
//
// Either way the schedule goes through FinishPlan: an invalid one is an
// error naming the step, and feasibility is the simulator's verdict.
#ifndef PEBBLE_SCHEDULER_EXTERNAL_POLICY_H_
#define PEBBLE_SCHEDULER_EXTERNAL_POLICY_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"

namespace pebble {

// What an outside policy computes: a schedule for `graph` under `options`
// (options.budget_bytes is kMinBudgetBytes for "as low as you can"). An
// error is the policy refusing the graph.
using ScheduleFunction =
    std::function<absl::StatusOr<Schedule>(const Graph& graph, const PlannerOptions& options)>;

// Registers `fn` as policy `name` (letters, digits, '-', '_', '.'), or
// replaces an outside policy registered earlier under that name.
// InvalidArgument for a malformed name or a built-in policy's name. Not to
// be called while another thread plans.
absl::Status RegisterExternalPolicy(const std::string& name, const std::string& description,
                                    PlanKind kind, ScheduleFunction fn);
// Removes an outside policy; NotFound for any other name.
absl::Status UnregisterExternalPolicy(const std::string& name);

// The options an outside policy gets: {"budget_bytes": B or null for
// "min", "min_budget": bool, "host_budget_bytes": B or null,
// "host_bandwidth_bytes_per_s", "time_limit_s", "seed"}.
nlohmann::ordered_json PolicyOptionsJson(const PlannerOptions& options);

// ---- exec:PROGRAM

inline constexpr absl::string_view kExecPolicyPrefix = "exec:";

// The document an exec: policy reads on stdin:
// {"format": "pebble-policy-input", "version": 1,
//  "graph": <the graph, pebble-graph JSON>,
//  "options": PolicyOptionsJson(options)}.
nlohmann::ordered_json ExecPolicyInput(const Graph& graph, const PlannerOptions& options);

// The planner of "exec:PROGRAM": runs PROGRAM with /bin/sh -c (so it may
// carry arguments), in its own process group, with ExecPolicyInput on
// stdin; its stderr is passed through, and it inherits no other
// descriptor. It must exit 0 within the plan's time limit and write one
// pebble-schedule document (at most kMaxJsonFileBytes) on stdout before it
// exits; the schedule is read step by step (ParseScheduleText). However it
// ends, its whole process group is killed before Plan returns, so nothing
// it started in the background outlives the plan. Each failure is an error
// naming the program.
std::unique_ptr<Planner> MakeExecPlanner(std::string program);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_EXTERNAL_POLICY_H_
