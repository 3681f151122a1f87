// The executor: runs one schedule on a Backend exactly as planned and
// measures it (docs/runtime.md).
//
// The plan is data (TFLite's ArenaPlanner then its execution): the
// executor makes no decision of its own. It
//  1. simulates the schedule (scheduler/simulator.h) and refuses an invalid
//     one with the simulator's message, before touching the backend;
//  2. asks the backend whether it can run every op (Backend::CheckSupported);
//  3. allocates ONE device arena of the layout's `arena_bytes`, once, and
//     (optionally) poisons it so that a kernel reading memory nobody wrote
//     sees NaNs instead of a plausible leftover;
//  4. places every persistent tensor at its planned offset and fills it from
//     `inputs_dir`/<id>.npy or from the seeded generator (GenerateInput);
//  5. runs the steps in order: `compute v` hands the kernel its inputs at
//     their current instances' offsets, the output at the new instance's
//     offset and the planned workspace; `offload v` copies v into a host
//     buffer on the copy stream; `prefetch v` copies it back into its new
//     instance; `free v` is bookkeeping; `compute v` of an alias (a view,
//     SPEC section 1) runs no kernel and allocates nothing: v is its
//     storage's memory with v's shape, so only contiguous reshapes (reshape,
//     flatten, squeeze, unsqueeze, identity, view) of their storage's bytes
//     run, and any other alias is refused before running, named. Every
//     SPEC section 4 dependency is issued as Backend::Record/Wait (a
//     compute waits for the prefetch of its inputs and for the offloads
//     behind earlier frees; an offload waits for the compute that produced
//     its tensor; a prefetch waits for the computes behind earlier frees),
//     so an asynchronous backend runs the plan correctly and a synchronous
//     one ignores them;
//  6. downloads the outputs (loss, gradients).
//
// Measured memory is the executor's own bookkeeping of the instances it
// holds (not the simulator's), so comparing the two means something; the
// backend's own counters (arena, host buffers, kernel scratch) are reported
// beside it.
#ifndef PEBBLE_RUNTIME_EXECUTOR_H_
#define PEBBLE_RUNTIME_EXECUTOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/half.h"  // fp16/bf16 conversions of .npy inputs
#include "runtime/backend.h"
#include "runtime/collectives.h"
#include "runtime/npy.h"
#include "scheduler/memory_layout.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble {

struct ExecutorOptions {
  // Seed of the generator of persistent tensors not read from inputs_dir.
  uint64_t seed = 0;
  // Directory of <id>.npy files for persistent tensors (TensorFileName());
  // empty: every persistent tensor is generated.
  std::string inputs_dir;
  // Fill the arena with 0xFF bytes before placing anything (an fp32/fp16
  // NaN pattern): a kernel that reads what nobody wrote shows up as NaN.
  bool poison_arena = true;
  // Predicted times only (the simulator's bandwidth); no effect on the run.
  SimulatorOptions simulator;
  // Layout rule when the executor plans the layout itself.
  LayoutOptions layout;
  // Copy every graph output back to ExecutionResult::outputs.
  bool download_outputs = true;
  // The ranks of a data-parallel run (not owned; nullptr: one rank). With
  // them, each all_reduce step averages its gradient over the ranks
  // (docs/runtime.md, "Several ranks"), the ranks first check that they run
  // the same graph and schedule, and the generated inputs of role "input"
  // (the batch) take the seed `seed + rank`: each rank its own slice, the
  // same parameters everywhere.
  Collectives* collectives = nullptr;
  // The graph before ShardGraph, for a sharded run (not owned; nullptr:
  // none). A persistent tensor sharded from one of it (a parameter or its
  // optimizer state) that is generated starts as this rank's slice of the
  // whole tensor as `unsharded` generates it (GenerateShard), so that a
  // sharded run starts where the unsharded one does.
  const Graph* unsharded = nullptr;
};

// What the executor measured for one step. Times are seconds from the
// run's first event; `free` steps take the SPEC section 4 time of the
// work they wait for (start = end).
struct StepMeasurement {
  Action action = Action::kCompute;
  NodeId node = kNoNode;
  double start_s = 0;
  double end_s = 0;
  int64_t resident_bytes = 0;  // bytes of the instances held after the step
  int64_t during_bytes = 0;    // during it (a compute adds its workspace)
  int64_t host_bytes = 0;      // bytes of the host copies held after it
};

// A tensor copied back from the backend. bf16 tensors come back as fp32
// (NumPy has no bf16; the conversion is exact).
struct HostTensor {
  NodeId node = kNoNode;
  NpyArray array;
};

struct ExecutionResult {
  PlanReport predicted;  // the simulator's report of the schedule
  MemoryLayout layout;   // the layout the arena follows
  std::string device;    // Backend::Description()

  // ---- Measured memory (bytes).
  // High-water mark of the instances the executor held (persistent tensors,
  // computed and prefetched tensors, a compute's workspace while it runs):
  // SPEC section 2's peak, as executed. -1 in peak_step: before the first
  // step.
  int64_t peak_bytes = 0;
  int peak_step = -1;
  int64_t host_peak_bytes = 0;  // high-water of the host copies held
  // Bytes the arena took from the backend: the growth of its
  // device_bytes_in_use across the one allocation (layout.arena_bytes when
  // the backend counts honestly).
  int64_t arena_bytes = 0;
  // What the backend really allocated: the arena (device_bytes_peak; equals
  // layout.arena_bytes), host buffers, and kernel scratch outside the plan.
  BackendMemoryStats backend_memory;
  // How much each of the backend's Counters() grew over the run, those that
  // did (the CUDA backend: docs/cuda.md, "Convolution algorithms").
  std::map<std::string, int64_t> backend_counters;

  // ---- Measured time (seconds).
  // Host wall time before the first step: simulation, layout, the arena's
  // allocation and poisoning, reading or generating the persistent tensors.
  double setup_s = 0;
  double time_s = 0;         // first event to the end of the last step
  double kernel_time_s = 0;  // sum of compute-step durations (but collectives)
  double copy_time_s = 0;    // sum of offload and prefetch durations
  // The time some collective ran (the union of their intervals): an
  // all_reduce bucket, or a sharded graph's all_gather or reduce_scatter,
  // from its issue to its result's copy into place, beside the compute
  // (Note [Collectives in flight], executor.cc).
  double collective_time_s = 0;
  // Sum of host-compute durations (updates on the host, docs/semantics.md,
  // "Updates on the host"): host wall time between two events of the copy
  // stream, so exact on a synchronous backend (the CPU's) only.
  double host_time_s = 0;
  // time_s minus the time some step ran (the union of every step's
  // interval), never negative: the time no stream ran a step, what the
  // executor itself costs between steps.
  double overhead_s = 0;
  // Seconds during which a copy step and a compute step ran at once
  // (CopyComputeOverlapSeconds): the transfer time the copy stream hid
  // behind compute. 0 on a synchronous backend (the CPU's).
  double copy_overlap_s = 0;
  std::vector<StepMeasurement> steps;

  // ---- Results.
  std::vector<HostTensor> outputs;  // graph.outputs(), in order
  // The persistent tensors an in-place update wrote (a training step's
  // parameters and optimizer state: graph/optimizer.h), their values at the
  // end of the step, in node order; node is the persistent tensor.
  std::vector<HostTensor> updated;
  std::optional<double> loss;       // node "loss" when it is a scalar
  std::vector<NodeId> loaded_inputs;     // persistent tensors read from files
  std::vector<NodeId> generated_inputs;  // persistent tensors generated

  // The output `id`, or nullptr.
  const HostTensor* FindOutput(const Graph& graph, absl::string_view id) const;
  // The output `id`'s value where it is a float32 or float16 scalar (the
  // loss, a clipped step's "grad_norm"), else nullopt.
  std::optional<double> ScalarOutput(const Graph& graph, absl::string_view id) const;
};

// The persistent tensors that the graph's in-place updates write (a
// training step's parameters and optimizer state), in node order: every
// schedule runs every update, so these are ExecutionResult::updated's.
std::vector<NodeId> UpdatedStorages(const Graph& graph);

// OK where computed node `v`'s shape and dtype are what its operator makes
// of its inputs' (the operator table's inference), else an error naming v:
// no kernel then reads or writes past a tensor. v and its inputs have a
// shape and dtype; ops without an entry in the table are left to the
// backend's CheckSupported.
absl::Status CheckOperatorTypes(const Graph& graph, NodeId v);

// Runs `schedule` on `backend` (see the file comment). `layout` may be
// given (it is verified against the schedule with VerifyLayout) or is
// planned with options.layout. Errors: the simulator's for an invalid
// schedule; the backend's CheckSupported; an input file that does not match
// its node (named); a kernel or copy failure, named with the step index,
// the action, the node id and the op.
absl::StatusOr<ExecutionResult> Execute(const Graph& graph, const Schedule& schedule,
                                        Backend& backend, const ExecutorOptions& options = {},
                                        const MemoryLayout* layout = nullptr);

// The length of the intersection of two time sets: the union of the compute
// steps' [start_s, end_s] and the union of the offload and prefetch steps'.
// Free steps take no time and count in neither.
double CopyComputeOverlapSeconds(const std::vector<StepMeasurement>& steps);

// ---- Persistent tensors (docs/runtime.md, "Inputs").

// The generated value of persistent node `v`, reproducible from (seed, id)
// alone: the same seed gives the same tensor whatever the graph's other
// nodes or their order. The rule:
//  - fp32/fp16/bf16 data (role input): uniform in [-1, 1);
//  - parameters of rank >= 2 (weights): uniform in [-b, b), b =
//    1/sqrt(fan_in), fan_in = the product of all dims but the first
//    (PyTorch's default bound for Linear and ConvNd weights);
//  - parameters of rank <= 1: the weight of a batch/layer norm (operand 2)
//    is 1 and its bias (operand 3) 0, as PyTorch initialises them; the
//    bias of a convolution or linear layer (operand 2) is uniform in
//    [-b, b) with the b of its weight; any other, uniform in [-1, 1);
//  - buffers: `*running_var` 1, everything else 0;
//  - i64: the target of softmax_cross_entropy uniform in [0, classes) with
//    classes the logits' class axis; the indices of an embedding uniform in
//    [0, num_embeddings); others 0 (num_batches_tracked);
//  - u8 (masks): 0 or 1 with probability 1/2.
// fp16 and bf16 values are the fp32 ones rounded to nearest even. bf16
// tensors are returned as bf16 bytes (NpyArray with dtype kBFloat16).
absl::StatusOr<NpyArray> GenerateInput(const Graph& graph, NodeId v, uint64_t seed);

// Rank `rank`'s shard of `unsharded`'s persistent tensor `v` as
// GenerateInput makes it: elements [rank * s, (rank + 1) * s) of the
// flattened tensor, s = ceil(numel / ranks), zeros past its end (ShardGraph's
// shards).
absl::StatusOr<NpyArray> GenerateShard(const Graph& unsharded, NodeId v, uint64_t seed,
                                       int rank, int ranks);

// The file name of tensor `id` in an --inputs or --dump directory: the id
// itself plus ".npy" (ids such as "grad:conv1.weight" keep their ':'),
// except that '%' and '/' are written as "%25" and "%2F" (percent-encoding:
// '/' cannot appear in a file name). An id of "." or ".." is encoded too.
std::string TensorFileName(absl::string_view id);

// Reads `dir`/TensorFileName(id) for persistent node `v` when it exists
// (nullopt when nothing is there; a symbolic link to a missing file is an
// error). Its dtype and shape must be the node's exactly (a bf16
// node also takes an fp32 file, rounded to nearest even); else
// InvalidArgument naming the file and the node.
absl::StatusOr<std::optional<NpyArray>> ReadInputFile(const Graph& graph, NodeId v,
                                                      const std::string& dir);

// Checks a directory of input files against `graph` before anything is read
// from it, so that no file the user put there is silently passed over: every
// entry whose name ends in ".npy" must be TensorFileName of a persistent
// node, else InvalidArgument naming the file (a computed node's tensor is
// never read; a name that is no node's id is a typo or another model's
// file); a name ending in ".npy" in another case ("input.NPY") and a
// symbolic link to a missing file are errors too. Entries of other names
// are not looked at. Execute calls it for ExecutorOptions::inputs_dir.
absl::Status CheckInputsDirectory(const Graph& graph, const std::string& dir);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_EXECUTOR_H_
