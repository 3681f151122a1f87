// Static memory layout: the offset of every tensor instance of a schedule in
// one device arena, planned ahead of execution ("plans are data": TFLite's
// ArenaPlanner, XLA's heap simulator and its HeapAlgorithm family).
//
// Instances (all lifetimes in step indices of the schedule, inclusive):
//  - a persistent node: one instance for the whole schedule, [0, K-1]
//    (K = number of steps; [0, 0] when K = 0);
//  - `compute v` or `prefetch v` at step k starts an instance of v at k; it
//    lives until the step before the `free v` that ends it, or to K-1. A
//    node computed or prefetched again after a free is a new instance;
//  - the workspace of `compute v` at step k: an instance [k, k];
//  - `offload v` allocates nothing on the device;
//  - with aliases (SPEC section 1), an instance is a storage's lifetime: it
//    starts at the compute or prefetch of its base that makes the storage
//    resident and ends at the step before the free of its last holder (the
//    base or an alias); its node is the base. Computing an alias allocates
//    nothing: an alias lives at the offset of its storage's instance.
//    Without aliases this is the rule above, node by node.
// An instance is alive at step k exactly when the simulator counts it in
// StepRecord::peak_bytes of step k, so the sum of the bytes alive at a step
// is that step's memory and the largest such sum is the plan's peak.
//
// Alignment rule: every offset is a multiple of `alignment` (64 bytes by
// default, the size of a cache line and of CUDA's texture alignment, and
// what PyTorch's and TFLite's allocators assume), and every instance reserves
// its size rounded up to that multiple. Hence the arena can exceed the
// simulator's peak by the rounding; `aligned_peak_bytes` (the peak of the
// rounded sizes) is the lower bound of any layout under this rule, and
// peak_bytes <= aligned_peak_bytes <= arena_bytes always holds. With
// alignment = 1 the bound is the peak itself.
#ifndef PEBBLE_SCHEDULER_MEMORY_LAYOUT_H_
#define PEBBLE_SCHEDULER_MEMORY_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/schedule.h"

namespace pebble {

inline constexpr int64_t kDefaultLayoutAlignment = 64;

struct LayoutOptions {
  int64_t alignment = kDefaultLayoutAlignment;  // bytes, a power of two
};

struct TensorInstance {
  NodeId node = kNoNode;
  bool workspace = false;  // the temporary of node's compute
  int first_step = 0;      // first step it is resident, inclusive
  int last_step = 0;       // last step it is resident, inclusive
  int64_t offset = 0;      // bytes from the arena's start, aligned
  int64_t bytes = 0;       // the node's bytes (or workspace), unrounded
};

struct MemoryLayout {
  int64_t alignment = kDefaultLayoutAlignment;
  int64_t arena_bytes = 0;         // max over instances of offset + rounded size
  int64_t peak_bytes = 0;          // the simulator's peak of the schedule
  int64_t aligned_peak_bytes = 0;  // peak with every size rounded up
  // arena_bytes / peak_bytes - 1 (0 when the peak is 0): what the layout
  // wastes to fragmentation and alignment.
  double fragmentation = 0;
  std::string strategy;  // the heuristic that gave the smallest arena
  // In creation order (persistent nodes first by id, then by step; a
  // compute's workspace right after its output).
  std::vector<TensorInstance> instances;

  // "arena 1.20 MiB for a peak of 1.19 MiB (+0.8%, greedy-by-size), 42
  // instances".
  std::string ToString() const;
  // {"arena_bytes", "peak_bytes", "aligned_peak_bytes", "fragmentation",
  //  "alignment", "strategy", "instances": [{"node", "workspace",
  //  "first_step", "last_step", "offset", "bytes"}]}.
  nlohmann::json ToJson(const Graph& graph) const;
};

// The instances of `schedule` with their lifetimes (offsets 0). The schedule
// is validated by Simulate() first; an invalid one is its error.
absl::StatusOr<std::vector<TensorInstance>> TensorInstances(
    const Graph& graph, const Schedule& schedule);

// Assigns offsets with several heuristics and keeps the smallest arena
// (ties: the first in this list; it stops early at the aligned peak):
//  - "greedy-by-size": largest first, each at the best-fitting gap among the
//    instances it overlaps in time (TFLite's ArenaPlanner; Pisarchyk and Lee,
//    "Efficient memory management for deep neural net inference", 2020);
//  - "greedy-by-breadth": the steps of largest memory first, their
//    instances largest first, best fit (Pisarchyk and Lee's breadth order);
//  - "greedy-by-area": largest size x lifetime first, best fit;
//  - "best-fit-in-order": an allocator run in schedule order, smallest free
//    block that fits, neighbours merged (XLA's heap simulator baseline).
// Best fit: the smallest gap that holds the instance, the lowest offset on a
// tie; when none does, on top of the highest overlapping instance. The three
// offline heuristics cost O(N log K + P log P) each (N instances, K steps, P
// pairs of instances alive together) and run only while P <= 2e7; the
// online one costs O(N log N) and always runs unless an offline one already
// reached the aligned peak. Measured (bench/results): training graphs get
// arenas within 1% of their peak; random DAGs with long-lived tensors about
// 5% above it on average (alignment 1).
absl::StatusOr<MemoryLayout> PlanMemoryLayout(const Graph& graph,
                                              const Schedule& schedule,
                                              const LayoutOptions& options = {});

// Checks `layout` against `schedule`: the instances are exactly
// TensorInstances()'s, offsets are aligned, no two instances alive at the
// same step overlap in the ranges they reserve ([offset, offset + bytes
// rounded up to the alignment); zero-byte ones reserve nothing), every
// instance ends within
// the arena, and peak_bytes <= aligned_peak_bytes <= arena_bytes with the
// simulator's peak. Else FailedPrecondition (InvalidArgument for an invalid
// schedule) naming the instances at fault.
absl::Status VerifyLayout(const Graph& graph, const Schedule& schedule,
                          const MemoryLayout& layout);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_MEMORY_LAYOUT_H_
