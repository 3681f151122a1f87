// Plans a zoo model with a policy and a budget and prints the document of
// `pebble plan --json`: consumer MODEL POLICY BUDGET [OPTIMIZER [RANKS]], the
// step ending with OPTIMIZER's updates (--optimizer), sharded over RANKS
// ranks (--shard full --ranks RANKS, the default link).
#include <cstdlib>
#include <iostream>

#include <pebble/pebble.h>

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) {
    std::cerr << "usage: consumer MODEL POLICY BUDGET [OPTIMIZER [RANKS]]\n";
    return 2;
  }
  absl::StatusOr<pebble::Graph> graph = pebble::BuildModel(argv[1]);
  pebble::PlanRequest request;
  if (graph.ok() && argc >= 5) {
    absl::StatusOr<pebble::OptimizerSpec> spec = pebble::ParseOptimizer(argv[4]);
    if (spec.ok()) {
      graph = pebble::AddOptimizerStep(*graph, *spec);
    } else {
      graph = spec.status();
    }
  }
  if (graph.ok() && argc == 6) {
    request.options.ranks = std::atoi(argv[5]);
    graph = pebble::ShardGraph(*graph, request.options.ranks, pebble::NetworkLink{});
  }
  if (!graph.ok()) {
    std::cerr << graph.status().message() << "\n";
    return 1;
  }
  request.policy = argv[2];
  request.budget = argv[3];
  absl::StatusOr<pebble::PlanOutcome> plan = pebble::PlanGraph(*graph, request);
  if (!plan.ok()) {
    std::cerr << plan.status().message() << "\n";
    return 1;
  }
  const nlohmann::json document = pebble::PlanDocument(
      *graph, *plan, /*label=*/argv[1], /*with_timeline=*/false, /*with_instances=*/false);
  std::cout << document.dump() << "\n";
  return 0;
}
