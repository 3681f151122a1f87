// Fuzz target: the simulator on fuzzed schedules. The input's bytes decode
// (FuzzedDataProvider) into a small graph (up to 12 nodes, each reading
// earlier ones, any sizes the reader takes, some persistent) and then a
// schedule of up to 64 steps (action and node), simulated at a fuzzed host
// bandwidth. Properties: the free-at-last-use schedule of the graph's own
// order is always valid; a valid schedule's peak is at least the persistent
// bytes and at least every step's; its arena layout verifies.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "scheduler/memory_layout.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr int64_t kMaxReaderInteger = int64_t{1} << 53;  // graph files hold up to 2^53

int64_t ConsumeSize(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return in.ConsumeIntegralInRange<int64_t>(0, 16);
    case 1: return in.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 20);
    case 2: return kMaxReaderInteger - in.ConsumeIntegralInRange<int64_t>(0, 4);
    default: return in.ConsumeIntegralInRange<int64_t>(0, kMaxReaderInteger);
  }
}

double ConsumeCost(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: return in.ConsumeIntegralInRange<int>(0, 4);
    case 1: return in.ConsumeFloatingPointInRange<double>(0, 1e-300);
    default: return in.ConsumeFloatingPointInRange<double>(0, 1.7e308);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pebble;
  FuzzedDataProvider in(data, size);
  GraphBuilder builder("fuzz-simulate");
  const int n = in.ConsumeIntegralInRange<int>(1, 12);
  for (int i = 0; i < n; ++i) {
    NodeSpec spec;
    spec.id = absl::StrCat("n", i);
    spec.bytes = ConsumeSize(in);
    spec.cost = ConsumeCost(in);
    const int num_inputs = i == 0 ? 0 : in.ConsumeIntegralInRange<int>(0, 3);
    for (int k = 0; k < num_inputs; ++k) {
      spec.inputs.push_back(absl::StrCat("n", in.ConsumeIntegralInRange<int>(0, i - 1)));
    }
    spec.persistent = spec.inputs.empty() && in.ConsumeBool();
    if (in.ConsumeBool()) spec.workspace = ConsumeSize(in);
    if (in.ConsumeBool() || i == n - 1) builder.AddOutput(spec.id);
    builder.AddNode(std::move(spec));
  }
  absl::StatusOr<Graph> built = builder.Build();
  if (!built.ok()) return 0;
  const Graph& graph = *built;

  // The graph's own order, freed at last use, is a valid schedule.
  const Schedule natural = fuzz::MustOk(FreeAtLastUse(graph, DefaultOrder(graph)),
                                        "free at last use of the default order");
  fuzz::MustOk(Simulate(graph, natural), "simulating free at last use");

  SimulatorOptions options;
  options.host_bandwidth_bytes_per_s = in.ConsumeBool()
      ? kDefaultHostBandwidthBytesPerS
      : in.ConsumeFloatingPointInRange<double>(1e-3, 1e15);
  Schedule schedule;
  const int num_steps = in.ConsumeIntegralInRange<int>(0, 64);
  for (int s = 0; s < num_steps && in.remaining_bytes() > 0; ++s) {
    const Action action = static_cast<Action>(in.ConsumeIntegralInRange<int>(0, 3));
    const NodeId node = in.ConsumeIntegralInRange<NodeId>(0, graph.num_nodes() - 1);
    schedule.steps.push_back({action, node});
  }
  absl::StatusOr<PlanReport> report = Simulate(graph, schedule, options);
  if (!report.ok()) return 0;
  fuzz::Expect(report->peak_bytes >= graph.persistent_bytes(),
               "peak below the persistent bytes");
  for (const StepRecord& r : report->timeline) {
    fuzz::Expect(r.peak_bytes <= report->peak_bytes && r.device_bytes <= r.peak_bytes,
                 "a step above the peak");
    fuzz::Expect(!(r.end < r.start), "a step that ends before it starts");
  }
  (void)ReportToJson(*report, graph, schedule, /*with_timeline=*/true).dump();
  absl::StatusOr<MemoryLayout> layout = PlanMemoryLayout(graph, schedule);
  if (layout.ok()) {
    const absl::Status verified = VerifyLayout(graph, schedule, *layout);
    fuzz::Expect(verified.ok(), "layout does not verify: " + std::string(verified.message()));
  }
  return 0;
}
