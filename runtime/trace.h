// Views of an execution for people: a Chrome trace and a per-module memory
// log (docs/runtime.md, "Trace" and "Memory log").
#ifndef PEBBLE_RUNTIME_TRACE_H_
#define PEBBLE_RUNTIME_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "runtime/executor.h"
#include "scheduler/schedule.h"

namespace pebble {

// The Trace Event Format of chrome://tracing and Perfetto
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PWSQk4Uq3b1FDQ3tTfLHxCWUHnnW0Q):
// {"displayTimeUnit": "ms", "traceEvents": [...]} with, in process 1,
//  - thread 1 "compute": one complete ("X") event per compute step but
//    collectives
//    (name = node id, cat = "compute", args: step, op, bytes, recompute);
//  - thread 2 "copy": one "X" event per offload / prefetch (cat = the action);
//  - thread 3 "host" (a graph with host costs): one "X" event per host
//    compute (cat = "host_compute");
//  - thread 4 "network" (a run with collectives): one "X" event per
//    all_reduce step (cat = "all_reduce") or collective compute (cat =
//    "compute"), from its issue to its settling (Note [Collectives in
//    flight] in executor.cc);
//  - "M" metadata events naming the process and its threads;
//  - counter ("C") events "device memory" {"bytes": ...} and "host memory"
//    {"bytes": ...} at each step's start (memory during the step) and end
//    (after it; an asynchronous step's at its start), in time order (Note
//    [Memory counters in time order] in trace.cc);
//  - free steps as instant ("i") events on the compute thread.
// Times are microseconds from the run's start.
nlohmann::json ChromeTrace(const Graph& graph, const ExecutionResult& result);

// One row of the memory log: consecutive compute steps of one module and
// phase, with the frees and copies that follow them (the per-layer table of
// the ResNet-18 memory blog post: module, phase, delta, total).
struct MemoryLogRow {
  int first_step = 0;
  int last_step = 0;
  std::string module;  // ModuleOf(node id)
  std::string phase;   // "forward", "backward", "update" or "recompute"
  int64_t delta_bytes = 0;  // resident after the row minus before it
  int64_t total_bytes = 0;  // resident after the row
  int64_t peak_bytes = 0;   // highest during the row's steps
};

// The module of a node id: a per-parameter prefix of the backward, the
// clipping or the optimizer ("grad:", "unclipped_grad:", "clip_square:",
// "clip_part:", "exp_avg:", "exp_avg_sq:", "momentum_buffer:", "update:":
// kPerParameterPrefixes) or of a sharded step ("gather:", "local_grad:")
// and a "#..." suffix dropped, then a trailing parameter or statistics name
// (".weight", ".bias", ".stats", ".running_mean", ".running_var"):
// "grad:layer1.0.conv1.weight" -> "layer1.0.conv1", "exp_avg:fc.bias" ->
// "fc", "grad:relu2#1" -> "relu2".
std::string ModuleOf(absl::string_view id);

// Rows of the execution's steps. Steps before the first compute form a row
// of their own with module "" and phase "start".
std::vector<MemoryLogRow> MemoryLog(const Graph& graph, const ExecutionResult& result);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_TRACE_H_
