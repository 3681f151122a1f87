// Fuzz target: the schedule reader. The input is the text of a schedule
// file (SPEC section 2) for a small fixed graph, written to a temporary file
// and read with ReadScheduleFile, which streams the steps; where the text
// is JSON, ScheduleFromJson on its document must say the same. A schedule
// it accepts is then simulated, and where valid, laid out in an arena
// (PlanMemoryLayout) and the layout verified.
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/graph.h"
#include "graph/text_input.h"
#include "nlohmann/json.hpp"
#include "scheduler/memory_layout.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Persistent inputs, a workspace, a node read twice, two outputs; the
// corpus's schedules name these ids.
constexpr char kGraph[] = R"({
  "format": "pebble-graph", "version": 1, "name": "fuzz-schedule",
  "nodes": [
    {"id": "x", "op": "input", "bytes": 8, "persistent": true},
    {"id": "w", "op": "parameter", "bytes": 4, "persistent": true},
    {"id": "a", "bytes": 16, "cost": 1, "inputs": ["x", "w"], "workspace": 4},
    {"id": "b", "bytes": 8, "cost": 2, "inputs": ["a"]},
    {"id": "c", "bytes": 12, "cost": 0.5, "inputs": ["a", "a"]},
    {"id": "d", "bytes": 4, "cost": 1, "inputs": ["b", "c"]},
    {"id": "e", "bytes": 2, "cost": 3, "inputs": ["d", "x"]}
  ],
  "outputs": ["e", "b"]
})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pebble;
  static const Graph graph = fuzz::MustParseGraph(kGraph);
  const std::string path = fuzz::WriteTempFile("schedule.json", data, size);
  absl::StatusOr<Schedule> schedule = ReadScheduleFile(graph, path);
  // The streaming reader says what the document reader says.
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (absl::StatusOr<nlohmann::json> doc = ParseStrictJson(text); doc.ok()) {
    absl::StatusOr<Schedule> whole = ScheduleFromJson(graph, *doc);
    const absl::StatusOr<Schedule> streamed = ParseScheduleText(graph, text);
    fuzz::Expect(whole.status() == streamed.status(),
                 "the streaming and the document readers disagree: '" +
                     std::string(streamed.status().message()) + "' and '" +
                     std::string(whole.status().message()) + "'");
    fuzz::Expect(!whole.ok() || *whole == *streamed,
                 "the streaming and the document readers read different steps");
  }
  if (!schedule.ok()) return 0;
  absl::StatusOr<PlanReport> report = Simulate(graph, *schedule);
  if (!report.ok()) return 0;
  fuzz::Expect(report->peak_bytes >= graph.persistent_bytes(),
               "peak below the persistent bytes");
  (void)ReportToJson(*report, graph, *schedule, /*with_timeline=*/true).dump();
  const MemoryLayout layout =
      fuzz::MustOk(PlanMemoryLayout(graph, *schedule), "layout of a valid schedule");
  const absl::Status verified = VerifyLayout(graph, *schedule, layout);
  fuzz::Expect(verified.ok(), "layout does not verify: " + std::string(verified.message()));
  return 0;
}
