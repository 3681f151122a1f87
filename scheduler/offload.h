// Shared machinery of the offload policies (`vdnn`, `swap`, `hybrid`):
// host-link presets, compute sequences with swap intervals, their emission as
// SPEC schedules, the greedy swap search and its simulator-guided placement.
// docs/offload.md describes the policies and the break-even rule.
//
// Note [Swap intervals]. A plan starts from a compute sequence (the compute
// steps of a one-shot or multi-shot schedule, in order). As in remat.h's
// Note [Emission], compute position i starts an "instance" of its node; a
// reader reads the latest instance; an instance is resident from its compute
// to its last reader (to the end for the final instance of an output). Its
// "uses" are its production and its readers; a gap is the stretch between
// two consecutive uses a < b. A swap interval evicts the instance inside one
// gap: `offload v` right after the compute that produced it (once per node:
// a later instance, or a later gap, reuses the host copy, which holds the
// same value), `free v` after compute e (a <= e), `prefetch v` before compute
// q (e + 2 <= q <= b). The instance is then not resident during computes
// e+1 .. q-1, which is the saving.
//
// Time (SPEC section 4) makes both ends delicate: the free waits for the
// offload, and every later step waits for the free (R_k), so a free placed
// before the offload is done stalls the compute stream; the prefetch starts
// only after the frees before it, so it starts roughly when compute q-1
// ends and must end before compute b starts, else b waits. "Hidden" means:
// end(e) >= end(i) + bytes / bandwidth and start(b) - end(q-1) >= bytes /
// bandwidth, with the compute stream's times. The break-even rule: a gap
// can hide the round trip when the compute in it covers 2 bytes / bandwidth.
#ifndef PEBBLE_SCHEDULER_OFFLOAD_H_
#define PEBBLE_SCHEDULER_OFFLOAD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"

namespace pebble {

// Host links, bytes per second in one direction (docs/offload.md cites the
// sources).
struct LinkPreset {
  const char* name;
  double bytes_per_s;
  const char* description;
};
absl::Span<const LinkPreset> LinkPresets();
// The host link bandwidths pebble takes, bytes per second: from a slow
// network link to well past any device link, so that bytes / bandwidth
// stays a finite, meaningful number of seconds.
inline constexpr double kMinBandwidthBytesPerS = 1e3;
inline constexpr double kMaxBandwidthBytesPerS = 1e15;

// "pcie4", "pcie5", "nvlink-c2c" or a size per second as ParseSize takes it
// ("25e9", "25GB"). Empty, unknown, or outside [kMinBandwidthBytesPerS,
// kMaxBandwidthBytesPerS]: InvalidArgument.
absl::StatusOr<double> ParseBandwidth(absl::string_view text);

// Forward operators whose outputs cost many FLOPs per byte (convolution and
// matrix products): the layers vDNN offloads the inputs of.
bool IsHeavyOp(absl::string_view op);

// A compute sequence and its instances (Note [Swap intervals]).
class ComputeSequence {
 public:
  // `computes` must read only nodes computed earlier in it (or persistent):
  // a broken one is a bug (PEBBLE_CHECK).
  ComputeSequence(const Graph& graph, std::vector<NodeId> computes);
  // The compute steps of a valid schedule.
  static ComputeSequence FromSchedule(const Graph& graph, const Schedule& schedule);

  const Graph& graph() const { return *graph_; }
  int size() const { return static_cast<int>(computes_.size()); }
  NodeId node(int p) const { return computes_[p]; }
  const std::vector<NodeId>& computes() const { return computes_; }
  // Positions that read instance i, ascending (a position reading it twice
  // appears once).
  absl::Span<const int> readers(int i) const {
    return absl::MakeConstSpan(readers_.data() + reader_offsets_[i],
                               reader_offsets_[i + 1] - reader_offsets_[i]);
  }
  // Index of instance i's first reader among all instances' readers, in
  // position order (the readers of instance 0 first): with k < readers(i).size(),
  // reader_index(i) + k names the gap that ends at readers(i)[k], a dense
  // id in [0, num_reads()).
  int reader_index(int i) const { return reader_offsets_[i]; }
  int num_reads() const { return static_cast<int>(readers_.size()); }
  // The last position at which instance i is resident without swapping:
  // its last reader, size()-1 for the final instance of an output, i itself
  // when nothing reads it.
  int last(int i) const { return last_[i]; }
  bool final_output(int i) const { return final_output_[i] != 0; }
  // Nominal compute-stream times with no stall: start(p), end(p).
  double start(int p) const { return start_[p]; }
  double end(int p) const { return start_[p] + graph_->cost(computes_[p]); }

 private:
  const Graph* graph_;
  std::vector<NodeId> computes_;
  std::vector<int32_t> reader_offsets_;
  std::vector<int> readers_;
  std::vector<int> last_;
  std::vector<uint8_t> final_output_;
  std::vector<double> start_;
};

// One eviction (Note [Swap intervals]): instance `instance` (its compute
// position) is freed after compute `evict_after` and prefetched before
// compute `prefetch_before`.
struct SwapInterval {
  int instance = 0;
  int evict_after = 0;
  int prefetch_before = 0;
  bool operator==(const SwapInterval&) const = default;
};

// OK when every interval lies inside a gap of its instance, with
// evict_after + 2 <= prefetch_before, and intervals of one instance do not
// overlap; else InvalidArgument naming the node.
absl::Status CheckSwaps(const ComputeSequence& seq, absl::Span<const SwapInterval> swaps);

// The schedule: per position, the prefetches placed before it (the one whose
// instance is read first goes first), the compute, the offload of a swapped
// instance whose node has no host copy yet, the frees at last use (as
// ScheduleFromComputes), then the evictions placed after it. `swaps` must
// pass CheckSwaps (PEBBLE_CHECK).
Schedule EmitSwapSchedule(const ComputeSequence& seq, absl::Span<const SwapInterval> swaps);

// Resident bytes during each compute of the emitted schedule (persistent
// bytes, live instances, the compute's workspace), without emitting it. The
// schedule's peak is max(persistent bytes, max of these).
std::vector<int64_t> DuringBytes(const ComputeSequence& seq,
                                 absl::Span<const SwapInterval> swaps);

// Bytes of the distinct nodes that `swaps` offload: the emitted schedule's
// host peak.
int64_t HostBytes(const ComputeSequence& seq, absl::Span<const SwapInterval> swaps);

// The greedy swap search (Note [Greedy swaps] in offload_common.cc).
enum class SwapRule : uint8_t {
  kHiddenGapsOnly,  // `swap`: only gaps whose compute covers the round trip,
                    // largest bytes first
  kLeastExposure,   // `hybrid`: any gap, the least estimated exposed time
                    // per byte first
};
struct SwapSearchOptions {
  int64_t target_bytes = 0;  // stop once the peak is at most this;
                             // kMinBudgetBytes: as low as it goes
  std::optional<int64_t> host_budget_bytes;
  double bandwidth_bytes_per_s = 25e9;
  SwapRule rule = SwapRule::kHiddenGapsOnly;
  // Null: none. Past it the search stops with the swaps it has (each round
  // keeps the intervals valid, so any prefix of the search is a plan).
  const Deadline* deadline = nullptr;
};
std::vector<SwapInterval> GreedySwaps(const ComputeSequence& seq, const SwapSearchOptions& options,
                                      std::vector<SwapInterval> initial = {});

// Simulator-guided placement (Note [Placement rounds]): moves evictions
// later and prefetches earlier where the measured timeline shows a stall
// and the memory stays within `cap_bytes`. Returns the best schedule found
// by simulated makespan among the rounds (the input first).
std::vector<SwapInterval> RefinePlacement(const ComputeSequence& seq,
                                          std::vector<SwapInterval> swaps, int64_t cap_bytes,
                                          double bandwidth_bytes_per_s, int rounds,
                                          const Deadline* deadline = nullptr);

// Per-tensor classes of a plan, for details JSON and the docs tables: every
// needed non-persistent node is "kept" (computed once, never offloaded),
// "swapped" (prefetched at least once, computed once), "recomputed"
// (computed more than once, never prefetched) or "swapped_and_recomputed".
// Counts and bytes per class, counts per class and operator, and the ids of
// swapped and recomputed nodes (the first `max_ids` each).
nlohmann::json ClassifyTensors(const Graph& graph, const Schedule& schedule, int max_ids = 50);

// One entry of details["candidates"], the list of the plans hybrid judged
// (and Note [hybrid on the whole step] adds to): its name, its figures and
// whether it fits. CandidateFigures reads the figures back as a report
// (peak, makespan and transfer bytes; the rest zero).
nlohmann::json CandidateEntry(const std::string& name, const PlanReport& report, bool fits);
PlanReport CandidateFigures(const nlohmann::json& entry);

// Picks among candidate schedules by simulated time: with a byte budget,
// the least makespan among those that fit both budgets (ties: lower peak,
// then fewer transfer bytes, then the earlier candidate); when none fits,
// the lowest peak (ties: makespan); with kMinBudget the lowest peak (ties:
// makespan, then the earlier one). Invalid candidates are a bug
// (PEBBLE_CHECK).
class MakespanSelector {
 public:
  // The deadline (options.time_limit_s) starts here.
  MakespanSelector(const Graph& graph, const PlannerOptions& options)
      : graph_(graph), options_(options), deadline_(options.time_limit_s) {}
  // Returns the candidate's simulated report.
  const PlanReport& Consider(Schedule schedule, nlohmann::json details);
  bool has_best() const { return has_best_; }
  const PlanReport& best() const { return best_report_; }
  const Schedule& best_schedule() const { return best_schedule_; }
  bool Fits(const PlanReport& report) const;
  // Whether report `a` is chosen over `b` by the rule Consider follows.
  bool Prefers(const PlanReport& a, const PlanReport& b) const { return Better(a, b); }
  int num_considered() const { return considered_; }
  // True once the time limit has passed: the policy stops offering
  // candidates, and Finish notes the cut (NoteTimeLimit).
  bool TimeUp() const { return deadline_.Expired(); }
  const Deadline& deadline() const { return deadline_; }
  // FinishPlan on the chosen one, its details merged, ClassifyTensors under
  // "tensors".
  absl::StatusOr<PlanResult> Finish();

 private:
  bool Better(const PlanReport& a, const PlanReport& b) const;

  const Graph& graph_;
  PlannerOptions options_;
  Deadline deadline_;
  bool has_best_ = false;
  int considered_ = 0;
  PlanReport best_report_;
  PlanReport last_report_;
  Schedule best_schedule_;
  nlohmann::json best_details_;
};

// The plans of the offload policies, for hybrid and the tests (the
// registered planners call these).
absl::StatusOr<PlanResult> PlanVdnn(const Graph& graph, const PlannerOptions& options);
// `best_order`: best-order's compute sequence when the caller has it (it
// can take seconds on some graphs); null: planned here.
absl::StatusOr<PlanResult> PlanSwap(const Graph& graph, const PlannerOptions& options,
                                    const std::vector<NodeId>* best_order = nullptr);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_OFFLOAD_H_
