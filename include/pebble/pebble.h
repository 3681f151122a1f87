// pebble's umbrella header: everything an outside program needs to build or
// load a graph, plan it under a memory budget, check a schedule in the
// simulator and (where the runtime is built) execute it.
//
//   find_package(pebble CONFIG REQUIRED)
//   target_link_libraries(app PRIVATE pebble::pebble)
//
// docs/library.md lists what each header offers and what is stable.
#ifndef PEBBLE_PEBBLE_H_
#define PEBBLE_PEBBLE_H_

#include "pebble/config.h"

// Graph IR, its JSON files, operators, autodiff, the optimizer's step, the
// model zoo, ONNX import.
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph/import/onnx_import.h"
#include "graph/models/models.h"
#include "graph/net_builder.h"
#include "graph/ops.h"
#include "graph/optimizer.h"
#include "graph/status.h"

// Budgets, the planner registry, outside policies, plan / compare / fit,
// schedules, the simulator, collectives and sharding, and the arena layout.
#include "scheduler/budget.h"
#include "scheduler/collectives.h"
#include "scheduler/cost_profile.h"
#include "scheduler/external_policy.h"
#include "scheduler/memory_layout.h"
#include "scheduler/offload.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

#if PEBBLE_HAVE_RUNTIME
// The executor and the backends (CPU; CUDA where built).
#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/make_backend.h"
#include "runtime/npy.h"
#include "runtime/trace.h"
#include "runtime/workspace.h"
#endif

#endif  // PEBBLE_PEBBLE_H_
