// Plans a zoo model with a policy and a budget and prints the document of
// `pebble plan --json`: consumer MODEL POLICY BUDGET.
#include <iostream>

#include <pebble/pebble.h>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: consumer MODEL POLICY BUDGET\n";
    return 2;
  }
  absl::StatusOr<pebble::Graph> graph = pebble::BuildModel(argv[1]);
  if (!graph.ok()) {
    std::cerr << graph.status().message() << "\n";
    return 1;
  }
  pebble::PlanRequest request;
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
