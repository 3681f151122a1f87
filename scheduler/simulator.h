// The simulator: the single implementation of SPEC sections 2 (memory and
// cost) and 4 (time). Every plan, from every planner, is checked and
// measured here, in tests and at run time.
#ifndef PEBBLE_SCHEDULER_SIMULATOR_H_
#define PEBBLE_SCHEDULER_SIMULATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/schedule.h"

namespace pebble {

inline constexpr double kDefaultHostBandwidthBytesPerS = 25e9;

struct SimulatorOptions {
  double host_bandwidth_bytes_per_s = kDefaultHostBandwidthBytesPerS;
};

// One step of the memory timeline.
struct StepRecord {
  int64_t device_bytes = 0;  // bytes of the storages D holds after the step
  int64_t peak_bytes = 0;    // during the step (compute adds its workspace)
  int64_t host_bytes = 0;    // sum of bytes over H after the step
  double start = 0;          // SPEC section 4, in cost units
  double end = 0;
};

// The figures of SPEC section 2 (JSON keys in the comments).
struct PlanReport {
  int64_t peak_bytes = 0;        // peak_bytes
  double compute_cost = 0;       // compute_cost
  double base_cost = 0;          // base_cost
  double overhead = 0;           // overhead
  int64_t recomputations = 0;    // recomputations
  int64_t transfer_bytes = 0;    // transfer_bytes
  int64_t host_peak_bytes = 0;   // host_peak_bytes
  double makespan = 0;           // makespan
  // Extras: where the peak happens (-1: before the first step), the bytes
  // resident before the first step (persistent), one-shot or not, the
  // compute and copy-stream busy times, and the part of the copy-stream
  // time that compute does not hide (makespan minus compute-stream busy
  // time, never negative).
  int peak_step = -1;
  int64_t initial_bytes = 0;
  bool one_shot = true;
  int64_t num_steps = 0;
  double compute_busy = 0;
  double copy_busy = 0;
  double exposed_transfer_time = 0;
  // Host computes (docs/semantics.md, "Updates on the host"): the sum of
  // their host_cost, on the host stream. compute_cost leaves them out, and
  // exposed_transfer_time counts the host's time that compute did not hide.
  double host_compute_cost = 0;
  std::vector<StepRecord> timeline;
};

// Runs `schedule` on `graph`. An invalid schedule (a broken precondition of
// SPEC section 2, or an output missing at the end) is InvalidArgument with
// the step index, the action, the node and the broken rule. With aliases
// (SPEC section 1), memory sums the resident storages, each once with its
// root's bytes; computing or prefetching a base whose storage an alias still
// holds is invalid (the message names the alias), and so is offloading or
// prefetching an alias (docs/semantics.md).
absl::StatusOr<PlanReport> Simulate(const Graph& graph,
                                    const Schedule& schedule,
                                    const SimulatorOptions& options = {});

// SPEC's base_cost alone (no schedule needed).
double BaseCost(const Graph& graph);

// The report as JSON with SPEC's keys (and the extras); the timeline only
// when `with_timeline` (one object per step: action, node, device_bytes,
// peak_bytes, host_bytes, start, end).
nlohmann::json ReportToJson(const PlanReport& report, const Graph& graph,
                            const Schedule& schedule, bool with_timeline);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_SIMULATOR_H_
