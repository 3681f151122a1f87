// Pieces shared by `pebble run` and `pebble fit` (cli/run_commands.cc,
// cli/run_fit.cc).
#ifndef PEBBLE_CLI_RUN_COMMON_H_
#define PEBBLE_CLI_RUN_COMMON_H_

#include "CLI/CLI.hpp"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "runtime/executor.h"

namespace pebble::cli {

// The "measured" object of run's JSON (docs/runtime.md): peak_bytes,
// arena_bytes, host_peak_bytes, scratch_bytes, time_s, kernel_time_s,
// copy_time_s, overhead_s, and the per-step records when `with_steps`.
nlohmann::json MeasuredToJson(const Graph& graph, const ExecutionResult& result,
                              bool with_steps);

// `pebble fit`; AddRunCommands calls it.
void AddFitCommand(CLI::App& app, int& exit_code);

}  // namespace pebble::cli

#endif  // PEBBLE_CLI_RUN_COMMON_H_
