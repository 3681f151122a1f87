// The simulator: the single implementation of SPEC sections 2 (memory and
// cost) and 4 (time). Every plan, from every planner, is checked and
// measured here, in tests and at run time.
#ifndef PEBBLE_SCHEDULER_SIMULATOR_H_
#define PEBBLE_SCHEDULER_SIMULATOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/schedule.h"

namespace pebble {

inline constexpr double kDefaultHostBandwidthBytesPerS = 25e9;

// The link the ranks of data parallelism share (docs/semantics.md,
// "Collectives across ranks"): its bandwidth in bytes/s and the latency of
// one message in seconds. The default is 100 Gb/s Ethernet's nominal rate.
struct NetworkLink {
  double bandwidth_bytes_per_s = 12.5e9;
  double latency_s = 10e-6;
};

// Seconds of one all-reduce of `bytes` over `ranks` ranks by the ring
// algorithm (a reduce-scatter then an all-gather: 2 (ranks - 1) messages,
// each rank sending 2 (ranks - 1) / ranks of the bytes; Thakur, Rabenseifner
// and Gropp, "Optimization of Collective Communication Operations in
// MPICH", 2005): 2 (r - 1) latency + 2 (r - 1) / r bytes / bandwidth; 0 for
// one rank.
double AllReduceSeconds(int64_t bytes, int ranks, const NetworkLink& link);
// Seconds of one all-gather of a tensor of `bytes` (the whole, gathered) or
// one reduce-scatter of it, by the ring: half an all-reduce, (r - 1)
// latency + (r - 1) / r bytes / bandwidth; 0 for one rank.
double AllGatherSeconds(int64_t bytes, int ranks, const NetworkLink& link);

// The ranks and link a collective node's `cost` was timed for, as
// ShardGraph writes them in its attrs ("ranks", "network_bandwidth_bytes_per_s",
// "network_latency_s"); nullopt where its attrs do not say (a graph written
// by hand).
struct CollectiveLink {
  int ranks = 0;
  NetworkLink link;
  bool operator==(const CollectiveLink& o) const {
    return ranks == o.ranks && link.bandwidth_bytes_per_s == o.link.bandwidth_bytes_per_s &&
           link.latency_s == o.link.latency_s;
  }
};
std::optional<CollectiveLink> CollectiveLinkOf(const Graph& graph, NodeId v);

struct SimulatorOptions {
  double host_bandwidth_bytes_per_s = kDefaultHostBandwidthBytesPerS;
  // The ranks that run the schedule, each on its own slice of the batch
  // (SPMD: one schedule, the same on every rank), and their link. Figures
  // are per rank.
  int ranks = 1;
  NetworkLink network;
  // A runtime that sends a bucket of several all_reduce steps as one
  // message through a flat copy of its tensors in device memory
  // (pebble.torch; docs/semantics.md, "Buckets"): the copy, the bucket's
  // bytes, is resident from the bucket's first step until the first later
  // step that reads, writes, copies or frees one of its members' storages
  // (the runtime then waits for the sum and copies it back), or the end.
  // False: a bucket moves no memory (the C++ runtime stages it on the host).
  bool device_bucket_copies = false;
  // Bytes each member's place in a device copy is rounded up to (>= 1; the
  // device allocator's block where each copy is one allocation).
  int64_t bucket_copy_alignment = 1;
  // False: PlanReport::timeline stays empty, for a candidate that is only
  // compared by its figures (writing the timeline was a tenth of a whole
  // step's placement search).
  bool record_timeline = true;
};

// One step of the memory timeline.
struct StepRecord {
  int64_t device_bytes = 0;  // bytes of the storages D holds after the step
  int64_t peak_bytes = 0;    // during the step (compute adds its workspace)
  int64_t host_bytes = 0;    // sum of bytes over H after the step
  double start = 0;          // SPEC section 4, in cost units
  double end = 0;
};

// The figures of SPEC section 2 (JSON keys in the comments).
struct PlanReport {
  int64_t peak_bytes = 0;        // peak_bytes
  double compute_cost = 0;       // compute_cost
  double base_cost = 0;          // base_cost
  double overhead = 0;           // overhead
  int64_t recomputations = 0;    // recomputations
  int64_t transfer_bytes = 0;    // transfer_bytes
  int64_t host_peak_bytes = 0;   // host_peak_bytes
  double makespan = 0;           // makespan
  // Extras: where the peak happens (-1: before the first step), the bytes
  // resident before the first step (persistent), one-shot or not, the
  // compute and copy-stream busy times, and the part of the copy-stream
  // time that compute does not hide (makespan minus compute-stream busy
  // time, never negative).
  int peak_step = -1;
  int64_t initial_bytes = 0;
  bool one_shot = true;
  int64_t num_steps = 0;
  double compute_busy = 0;
  double copy_busy = 0;
  double exposed_transfer_time = 0;
  // Host computes (docs/semantics.md, "Updates on the host"): the sum of
  // their host_cost, on the host stream. compute_cost leaves them out, and
  // exposed_transfer_time counts the host's time that compute did not hide.
  double host_compute_cost = 0;
  // Collectives (docs/semantics.md, "Collectives across ranks" and
  // "Sharding"): how many ran (all_reduce steps, and computes of collective
  // nodes: gathers again included), the bytes of the whole tensors they
  // reduced or gathered, and the network stream's busy time (in makespan
  // and exposed_transfer_time too; compute_cost leaves collectives out).
  int64_t collectives = 0;
  int64_t collective_bytes = 0;
  double network_busy = 0;
  std::vector<StepRecord> timeline;  // one per step (empty: SimulatorOptions::record_timeline)
};

// Runs `schedule` on `graph`. An invalid schedule (a broken precondition of
// SPEC section 2, or an output missing at the end) is InvalidArgument with
// the step index, the action, the node and the broken rule. With aliases
// (SPEC section 1), memory sums the resident storages, each once with its
// root's bytes; computing or prefetching a base whose storage an alias still
// holds is invalid (the message names the alias), and so is offloading or
// prefetching an alias (docs/semantics.md). Invalid options (a bandwidth
// not positive, ranks < 1, a latency negative) are InvalidArgument too.
absl::StatusOr<PlanReport> Simulate(const Graph& graph,
                                    const Schedule& schedule,
                                    const SimulatorOptions& options = {});

// Simulate for a search's candidate: a valid schedule whose total cost or
// time overflows a double (a heuristic's recomputations of a graph whose
// costs sum near the largest double, or a transfer on a link of almost no
// bandwidth) is the worst report there is (peaks of INT64_MAX bytes,
// infinite times), which a search passes over, rather than an error; the
// plan that FinishPlan makes of such a candidate is refused as Simulate
// refuses it. Any other error is Simulate's.
absl::StatusOr<PlanReport> SimulateCandidate(const Graph& graph, const Schedule& schedule,
                                             const SimulatorOptions& options);

// Why step k of `schedule` may not join the step before it in a bucket
// (Step::joins_bucket), or "" where it may: an all_reduce step joins an
// all_reduce step (docs/semantics.md, "Buckets"); a compute of a collective
// node joins a compute of a collective node of the same op, timed for the
// same ranks and link (CollectiveLinkOf), as one message ("Buckets of
// collectives").
// A step that joins nothing is "".
std::string BucketJoinError(const Graph& graph, const Schedule& schedule, size_t k);

// The gradients data parallelism sums (docs/semantics.md, "Collectives
// across ranks"): for each parameter p (a persistent node of role
// parameter), the node "grad:p" (SPEC section 3's name) where it exists and
// is computed (not persistent), in id order, but a reduce-scatter's or a view
// of one (a sharded graph's: it is summed already). With
// SimulatorOptions::ranks > 1, an update reads each only once it is summed,
// and each output one ends the step summed.
std::vector<NodeId> GradientsToReduce(const Graph& graph);

// SPEC's base_cost alone (no schedule needed).
double BaseCost(const Graph& graph);

// The report as JSON with SPEC's keys (and the extras); the timeline only
// when `with_timeline` (one object per step: action, node, device_bytes,
// peak_bytes, host_bytes, start, end).
nlohmann::json ReportToJson(const PlanReport& report, const Graph& graph,
                            const Schedule& schedule, bool with_timeline);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_SIMULATOR_H_
