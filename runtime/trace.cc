#include "runtime/trace.h"

#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "graph/optimizer.h"
#include "scheduler/collectives.h"

namespace pebble {
namespace {

constexpr int kPid = 1;
constexpr int kComputeTid = 1;
constexpr int kCopyTid = 2;
constexpr int kHostTid = 3;  // host computes (updates on the host)
constexpr int kNetworkTid = 4;  // collectives in flight (several ranks)

double Micros(double seconds) { return seconds * 1e6; }

}  // namespace

nlohmann::json ChromeTrace(const Graph& graph, const ExecutionResult& result) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"pid", kPid}, {"name", "process_name"},
                    {"args", {{"name", absl::StrCat("pebble ", graph.name(), " on ",
                                                    result.device)}}}});
  events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", kComputeTid}, {"name", "thread_name"},
                    {"args", {{"name", "compute"}}}});
  events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", kCopyTid}, {"name", "thread_name"},
                    {"args", {{"name", "copy"}}}});
  if (graph.has_host_costs()) {
    events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", kHostTid}, {"name", "thread_name"},
                      {"args", {{"name", "host"}}}});
  }
  // Collectives run beside the compute (Note [Collectives in flight],
  // executor.cc): all_reduce steps and a sharded graph's collective nodes.
  auto on_network = [&](const StepMeasurement& s) {
    return s.action == Action::kAllReduce ||
           (s.action == Action::kCompute && graph.collective(s.node));
  };
  if (absl::c_any_of(result.steps, on_network)) {
    events.push_back({{"ph", "M"}, {"pid", kPid}, {"tid", kNetworkTid}, {"name", "thread_name"},
                      {"args", {{"name", "network"}}}});
  }
  // Note [Memory counters in time order]: the bytes follow the schedule
  // (docs/semantics.md, section 2), while a step off the compute stream (a
  // copy, a collective, a host compute) may end after later steps start. A
  // step's counters stand at its start (the bytes during it) and its end
  // (after it), but an asynchronous step's "after" at its start too, since
  // it changes the bytes where it is issued; and no counter stands before
  // the one before it. So a viewer, which draws counters by time, reads
  // every step's figures in the schedule's order.
  double counter_s = 0;
  auto counter = [&](double t, int64_t device, int64_t host) {
    counter_s = std::max(counter_s, t);
    events.push_back({{"ph", "C"}, {"pid", kPid}, {"name", "device memory"},
                      {"ts", Micros(counter_s)}, {"args", {{"bytes", device}}}});
    events.push_back({{"ph", "C"}, {"pid", kPid}, {"name", "host memory"},
                      {"ts", Micros(counter_s)}, {"args", {{"bytes", host}}}});
  };
  counter(0, result.predicted.initial_bytes, 0);
  std::vector<bool> computed(graph.num_nodes(), false);
  for (size_t k = 0; k < result.steps.size(); ++k) {
    const StepMeasurement& s = result.steps[k];
    const std::string& id = graph.id(s.node);
    const int64_t bytes = graph.bytes(s.node);
    switch (s.action) {
      case Action::kCompute: {
        events.push_back({{"ph", "X"}, {"pid", kPid},
                          {"tid", on_network(s) ? kNetworkTid : kComputeTid}, {"name", id},
                          {"cat", "compute"}, {"ts", Micros(s.start_s)},
                          {"dur", Micros(s.end_s - s.start_s)},
                          {"args", {{"step", k}, {"op", graph.op(s.node)}, {"bytes", bytes},
                                    {"recompute", static_cast<bool>(computed[s.node])}}}});
        computed[s.node] = true;
        break;
      }
      case Action::kOffload:
      case Action::kPrefetch:
        events.push_back({{"ph", "X"}, {"pid", kPid}, {"tid", kCopyTid},
                          {"name", absl::StrCat(ActionName(s.action), " ", id)},
                          {"cat", std::string(ActionName(s.action))}, {"ts", Micros(s.start_s)},
                          {"dur", Micros(s.end_s - s.start_s)},
                          {"args", {{"step", k}, {"bytes", bytes}}}});
        break;
      case Action::kHostCompute:
        events.push_back({{"ph", "X"}, {"pid", kPid}, {"tid", kHostTid}, {"name", id},
                          {"cat", "host_compute"}, {"ts", Micros(s.start_s)},
                          {"dur", Micros(s.end_s - s.start_s)},
                          {"args", {{"step", k}, {"op", graph.op(s.node)}}}});
        break;
      case Action::kAllReduce:  // issue to settle (Note [Collectives in flight], executor.cc)
        events.push_back({{"ph", "X"}, {"pid", kPid}, {"tid", kNetworkTid},
                          {"name", absl::StrCat("all_reduce ", id)}, {"cat", "all_reduce"},
                          {"ts", Micros(s.start_s)}, {"dur", Micros(s.end_s - s.start_s)},
                          {"args", {{"step", k}, {"bytes", bytes}}}});
        break;
      case Action::kFree:
        events.push_back({{"ph", "i"}, {"pid", kPid}, {"tid", kComputeTid}, {"s", "t"},
                          {"name", absl::StrCat("free ", id)}, {"cat", "free"},
                          {"ts", Micros(s.end_s)}, {"args", {{"step", k}, {"bytes", bytes}}}});
        break;
    }
    const bool on_compute_stream =
        s.action == Action::kFree || (s.action == Action::kCompute && !on_network(s));
    counter(s.start_s, s.during_bytes, s.host_bytes);
    counter(on_compute_stream ? s.end_s : s.start_s, s.resident_bytes, s.host_bytes);
  }
  return {{"displayTimeUnit", "ms"},
          {"traceEvents", std::move(events)},
          {"otherData",
           {{"graph", graph.name()},
            {"device", result.device},
            {"measured_peak_bytes", result.peak_bytes},
            {"predicted_peak_bytes", result.predicted.peak_bytes},
            {"arena_bytes", result.layout.arena_bytes}}}};
}

std::string ModuleOf(absl::string_view id) {
  // The per-parameter nodes of the backward, the clipping and the optimizer
  // (graph/optimizer.h), and of a sharded step (scheduler/collectives.h):
  // their parameter's module.
  const auto drop_prefix = [&id] {
    for (absl::string_view prefix : kPerParameterPrefixes) {
      if (absl::ConsumePrefix(&id, prefix)) return;
    }
    for (absl::string_view prefix : {kGatherPrefix, kLocalGradPrefix}) {
      if (absl::ConsumePrefix(&id, prefix)) return;
    }
  };
  drop_prefix();
  if (size_t hash = id.find('#'); hash != absl::string_view::npos) id = id.substr(0, hash);
  for (absl::string_view suffix :
       {".weight", ".bias", ".stats", ".running_mean", ".running_var"}) {
    if (absl::ConsumeSuffix(&id, suffix)) break;
  }
  return std::string(id);
}

std::vector<MemoryLogRow> MemoryLog(const Graph& graph, const ExecutionResult& result) {
  std::vector<MemoryLogRow> rows;
  std::vector<bool> computed(graph.num_nodes(), false);
  int64_t before = result.predicted.initial_bytes;
  for (size_t k = 0; k < result.steps.size(); ++k) {
    const StepMeasurement& s = result.steps[k];
    if (s.action == Action::kCompute) {
      std::string module = ModuleOf(graph.id(s.node));
      std::string phase = graph.role(s.node) == Role::kBackward ? "backward"
                          : graph.role(s.node) == Role::kUpdate ? "update"
                          : computed[s.node]                   ? "recompute"
                                                               : "forward";
      computed[s.node] = true;
      if (rows.empty() || rows.back().module != module || rows.back().phase != phase) {
        const int64_t start = rows.empty() ? before : rows.back().total_bytes;
        rows.push_back({static_cast<int>(k), static_cast<int>(k), std::move(module),
                        std::move(phase), 0, start, 0});
      }
    } else if (rows.empty()) {
      rows.push_back({static_cast<int>(k), static_cast<int>(k), "", "start", 0, before, 0});
    }
    MemoryLogRow& row = rows.back();
    const int64_t row_start = row.total_bytes - row.delta_bytes;
    row.last_step = static_cast<int>(k);
    row.total_bytes = s.resident_bytes;
    row.delta_bytes = s.resident_bytes - row_start;
    row.peak_bytes = std::max(row.peak_bytes, s.during_bytes);
  }
  return rows;
}

}  // namespace pebble
