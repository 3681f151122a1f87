// Fuzz target: the simulator on fuzzed schedules. The input's bytes decode
// (FuzzedDataProvider) into a small graph (up to 12 nodes, each reading
// earlier ones, any sizes the reader takes, some persistent, some aliases
// (views) of one of their inputs) and then a schedule of up to 64 steps
// (action and node), simulated at a fuzzed host bandwidth. Properties: the
// free-at-last-use schedule of the graph's own order is always valid; so is
// the one of the folded graph (scheduler/alias_fold.h) unfolded, with the
// same peak, the graph's own baseline peak where views read only their
// base (never less); a valid schedule's peak is at least the persistent bytes and
// at least every step's, and every step's memory is the bytes of the
// storages resident then, each once, recounted from scratch; its arena
// layout verifies.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "scheduler/alias_fold.h"
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
    if (!spec.inputs.empty() && in.ConsumeBool()) {
      spec.alias_of = spec.inputs[in.ConsumeIntegralInRange<size_t>(0, spec.inputs.size() - 1)];
    } else if (in.ConsumeBool()) {
      spec.workspace = ConsumeSize(in);
    }
    if (in.ConsumeBool() || i == n - 1) builder.AddOutput(spec.id);
    builder.AddNode(std::move(spec));
  }
  absl::StatusOr<Graph> built = builder.Build();
  if (!built.ok()) return 0;
  const Graph& graph = *built;

  // The graph's own order, freed at last use, is a valid schedule.
  const Schedule natural = fuzz::MustOk(FreeAtLastUse(graph, DefaultOrder(graph)),
                                        "free at last use of the default order");
  const PlanReport natural_report =
      fuzz::MustOk(Simulate(graph, natural), "simulating free at last use");

  // Fold, free at last use over the folded graph's own order, unfold: a
  // valid schedule of the same peak, the baseline's (the folded order is
  // the graph's own without its aliases).
  const FoldedGraph folded = fuzz::MustOk(FoldAliases(graph), "folding the aliases");
  const Schedule folded_natural = fuzz::MustOk(
      FreeAtLastUse(folded.graph, DefaultOrder(folded.graph)), "free at last use, folded");
  const PlanReport folded_report =
      fuzz::MustOk(Simulate(folded.graph, folded_natural), "simulating the folded schedule");
  const PlanReport unfolded_report = fuzz::MustOk(
      Simulate(graph, UnfoldSchedule(graph, folded, folded_natural)), "simulating the unfolded");
  fuzz::Expect(unfolded_report.peak_bytes == folded_report.peak_bytes,
               "the unfolded schedule's peak is not the folded one's");
  // Exactly the baseline's when views read nothing but their base (else
  // the folded reader keeps a view's other inputs until it runs).
  bool views_read_their_base_only = true;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.is_alias(v) && graph.unique_inputs(v).size() > 1) views_read_their_base_only = false;
  }
  fuzz::Expect(!views_read_their_base_only ||
                   natural_report.peak_bytes == folded_report.peak_bytes,
               "the baseline peak differs between the graph and its folded graph");
  fuzz::Expect(natural_report.peak_bytes <= folded_report.peak_bytes,
               "the folded baseline is below the graph's");

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
  // Every step's memory, recounted: the distinct storages of D.
  std::vector<uint8_t> in_d(graph.num_nodes(), 0);
  for (NodeId v = 0; v < graph.num_nodes(); ++v) in_d[v] = graph.persistent(v);
  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    const Step& step = schedule.steps[k];
    if (step.action == Action::kCompute || step.action == Action::kPrefetch) in_d[step.node] = 1;
    if (step.action == Action::kFree) in_d[step.node] = 0;
    std::vector<uint8_t> counted(graph.num_nodes(), 0);
    int64_t device = 0;
    for (NodeId v = 0; v < graph.num_nodes(); ++v) {
      if (in_d[v] && !counted[graph.storage(v)]) {
        counted[graph.storage(v)] = 1;
        device += graph.bytes(graph.storage(v));
      }
    }
    fuzz::Expect(report->timeline[k].device_bytes == device,
                 absl::StrCat("step ", k, " holds ", report->timeline[k].device_bytes,
                              " bytes, its storages ", device));
  }
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
