// Data parallelism in a plan (docs/semantics.md, "Collectives across
// ranks"): every rank runs the same schedule on its own slice of the batch,
// and each parameter's gradient is summed over the ranks by an all_reduce
// step once the backward is done with it.
#ifndef PEBBLE_SCHEDULER_COLLECTIVES_H_
#define PEBBLE_SCHEDULER_COLLECTIVES_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble {

// `schedule` with an all_reduce of each of GradientsToReduce(graph)
// (scheduler/simulator.h) right
// after the step that completes it: its last compute, or the last later
// compute of the backward (no in-place update, no view) that reads its
// storage,
// whichever comes later; and before anything copies, frees or updates from
// that storage. So the all-reduce overlaps the rest of the backward, and
// the backward reads each rank's own gradient (Note [Where a gradient is
// reduced] in collectives.cc). A gradient that is a view of another is
// summed with it, not on its own. Errors: a gradient the schedule never
// computes; one the backward reads after it was freed, copied or updated.
absl::StatusOr<Schedule> ReduceGradients(const Graph& graph, const Schedule& schedule);

// `reduced` (ReduceGradients's schedule: one all_reduce step per gradient,
// none in a bucket) with its all_reduce steps grouped into buckets
// (Step::joins_bucket; docs/semantics.md, "Buckets"), each bucket's steps
// moved to its last member's place: DistributedDataParallel's rule where
// cap_bytes > 0 (in the order the steps come, a bucket closes once its
// bytes reach the cap), one step a bucket where 0. A gradient is not
// delayed past a step that copies, frees or updates from its storage: the
// bucket closes before the gradient that would be.
Schedule BucketGradients(const Graph& graph, const Schedule& reduced, int64_t cap_bytes);

// A bucket rule as `--buckets` gives it: "auto" (PlannerOptions::
// kPlannedBuckets), "none" or 0 (0), or a size (ParseSize: 25MiB, 25MB,
// 26214400). InvalidArgument names the text.
absl::StatusOr<int64_t> ParseBuckets(absl::string_view text);

// What a sharded graph's collectives were timed for (ranks and link), as
// ShardGraph writes it in their attrs; nullopt where no collective says (a
// graph written by hand, or one not sharded).
std::optional<CollectiveLink> ShardedRanks(const Graph& graph);

// A schedule's computes of collective nodes (a sharded graph's): its
// gathers, its reduce-scatters, and the messages they make (a bucket is one).
struct CollectiveComputes {
  // all_gather, reduce_scatter and all_reduce nodes' computes (a sharded
  // step's clipping total is an all_reduce), and the messages they make.
  int64_t gathers = 0, scatters = 0, sums = 0, messages = 0;
};
CollectiveComputes CountCollectiveComputes(const Graph& graph, const Schedule& schedule);

// A network link by name, with the nominal rate of its standard per
// direction (not a measurement): ethernet-10g (1.25e9 bytes/s, 25 us),
// ethernet-100g (12.5e9, 10 us; NetworkLink's default), ib-hdr (25e9, 5
// us), ib-ndr (50e9, 5 us), nvlink4 (450e9, 3 us: H100's 18 links of
// 25 GB/s); or bytes/s (ParseByteRate: 12.5e9, 10GB) with the default
// latency, from kMinBandwidthBytesPerS to kMaxBandwidthBytesPerS (as the
// host link's). InvalidArgument names the text and the presets.
absl::StatusOr<NetworkLink> ParseNetwork(absl::string_view text);

// The prefixes of ShardGraph's per-parameter nodes: "gather:p" (the
// gathered parameter) and "local_grad:p" (the rank's own gradient).
inline constexpr absl::string_view kGatherPrefix = "gather:";
inline constexpr absl::string_view kLocalGradPrefix = "local_grad:";

// Note [Sharded graphs] in sharding.cc: `training` (a training graph,
// with or without an optimizer's step) as one rank of `ranks` runs it
// under ZeRO-3 / FSDP FULL_SHARD's layout. Each parameter p with a
// gradient keeps only its shard (ceil(numel / ranks) elements, shape
// [that]), read through a collective "gather:p" (op all_gather, the whole
// tensor); the backward's gradient becomes "local_grad:p", and "grad:p" is
// its reduce-scatter (op reduce_scatter, the shard); the optimizer's state
// of p and its updates work on shards (bytes, cost and workspace divided).
// A clipping step's "unclipped_grad:p" is the one reduce-scattered, its
// clipping works on shards, and an all_reduce "clip_total" sums the ranks'
// squares for the norm (Note [Clipping sharded gradients]). Collectives
// cost AllGatherSeconds on `link` (the total AllReduceSeconds). Errors:
// ranks < 2, a graph sharded already, no parameter with a gradient, a
// gradient added into one kept from before the step, clipping that is
// not element-wise or leaves a gradient unclipped.
absl::StatusOr<Graph> ShardGraph(const Graph& training, int ranks, const NetworkLink& link);

// Per node of `training`: whether ShardGraph keeps only a shard of it (a
// parameter with a gradient, or its optimizer state), whatever the ranks.
std::vector<uint8_t> ShardedTensors(const Graph& training);

// `inner`, and where options.ranks > 1, its schedule with ReduceGradients's
// all_reduce steps in buckets (options.bucket_bytes: where planned, the
// grouping of least simulated makespan that a search finds, Note [Planned
// buckets] in collectives.cc), simulated again with the ranks and their
// link (details["collectives"]: how many collectives, how many all_reduce
// steps in how many buckets and by which rule, the search's simulations,
// their bytes, the network's busy time and the link). Buckets move no
// memory, so the plan's peak is the inner one's, unless
// options.device_bucket_copies: then planned buckets stay within the
// budget (or the inner peak), and a cap whose copies break it makes the
// plan infeasible, saying so. A bucket rule other than
// planned or none on a sharded graph is refused. On a sharded graph with
// planned buckets and `join_collectives`, the plan's gathers and
// reduce-scatters are joined into messages where that is faster
// (JoinCollectiveMessages, collective_buckets.h; details["collectives"]
// ["collective_buckets"]).
// A graph sharded for other ranks (ShardGraph's attrs) is refused where
// options.ranks > 1; at 1 (the nested calls of a policy) it is planned as
// it is. Every planner the registry makes is wrapped (planner.cc).
std::unique_ptr<Planner> WithGradientReduction(std::unique_ptr<Planner> inner,
                                               bool join_collectives = true);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_COLLECTIVES_H_
