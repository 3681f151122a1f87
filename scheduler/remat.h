// Shared machinery of the forget-and-recompute (multi-shot) policies:
// `sqrtn`, `chen-greedy`, `articulation`, `revolve`, `rotor` (chain
// checkpointing) and `dtr` (scheduler/remat_dtr.cc, which uses only the
// emission helpers). docs/multi-shot.md describes every policy.
//
// Note [Chain view of a training graph]. A training step is a forward pass,
// a loss and a backward pass that reads activations saved by the forward
// pass. Checkpointing policies see it as an adjoint chain (Griewank and
// Walther 2000; Beaumont et al. 2019): stages 0..L-1, stage i computes its
// output a_i from a_{i-1} (F_i) and its backward B_i turns the gradient
// frontier above it into the frontier below it, reading a_{i-1} and the
// stage's own activations. We get there in four steps:
//
//  1. Forward part (SplitForward). With roles (autodiff graphs): the needed
//     non-persistent nodes of role kForward none of whose inputs is a
//     backward node. Without roles (every node kForward, e.g. Checkmate's
//     `linear` graph or a JSON file): the prefix of the graph's own order up
//     to the step where the baseline schedule's resident bytes peak, ties to
//     the earliest. A training step peaks when the forward pass ends (every
//     saved activation is live), so on `linear:n` the split is v0..vn. On a
//     graph that is not a training step the split is arbitrary but harmless:
//     every plan stays valid, it only recomputes less well.
//  2. Separators (BuildChainView). In the forward order (normalised: a node
//     that only the backward pass reads is moved right after its last
//     forward input, a node with no forward input right before its first
//     forward reader), position p is a separator when no forward edge jumps
//     over it: every forward node before p is read by forward nodes at or
//     before p only, and p has a forward reader. Removing a separator
//     disconnects the forward graph, so the separators are the articulation
//     points of the forward subgraph (graph/boost_adapter.h) that lie on
//     every path from the first forward node to the loss; side-branch
//     articulation points (a node with a dead-end reader) are not
//     separators. The first forward node is a separator too when nothing
//     jumps over it (it is not an articulation point of the undirected view,
//     but cutting after it is still valid).
//  3. Stages (CollapseChain). A subset of the separators is chosen as stage
//     boundaries; stage i is the forward positions after boundary i-1 up to
//     boundary i (the last stage ends at the last forward node). Forward
//     nodes of stage i read only stage-i nodes, a_{i-1} and persistent
//     nodes. Each backward node b goes to a stage compatible with what it
//     reads: a non-boundary forward node of stage j forces j, the boundary
//     a_j allows j or j+1 (it is resident in B_j as an activation and in
//     B_{j+1} as the stage input), and b may not come above any backward
//     input of it (backward stages run L-1 down to 0); among those, the
//     highest, or with BackwardPlacement::kWithProducer the one that reads
//     boundaries as activations of their own stage. A backward
//     node with no compatible stage is "irregular": it is placed as high as
//     its inputs allow and the emitter recomputes what it misses on demand.
//     Autodiff graphs have none: a backward rule reads the inputs and output
//     of one forward op.
//  4. Chain programs (ChainOp). A plan is a sequence of stage operations:
//     F_i (the cone of a_i only, internals freed), F_i^all (cone plus what
//     B_i reads), F_i^saved (only what B_i reads; B_i must run next) and B_i.
//     The policies differ only in the program they pick.
//
// Note [Late loss]. The loss is a graph output that no node reads (autodiff
// seeds the backward pass with a constant), so it may be computed at any
// moment its input is resident. In the chain view it is the last stage's
// forward part, computed when a forward sweep first reaches it and resident
// from then on: a whole stage's worth of bytes on a chain of scalars
// (tanh-chain:size=1). LossPlacement::kAfterBackward moves those forward
// sinks (graph outputs without readers, the whole forward part of the last
// stage) to the end of the last stage's backward part, where the input they
// read is still resident and the backward's incoming gradient has been
// freed; the stage's forward lists are then empty. Its figures (cost,
// permanent bytes, backward_reads_input, peaks) count the loss in the
// backward part. `revolve` and `rotor` plan both placements and keep the
// better plan. A schedule may also compute the loss after the whole
// backward pass, from a re-swept input: docs/multi-shot.md says when that
// is cheaper and which programs miss it.
//
// Note [Emission: free at last use per instance]. A program becomes a
// sequence of computes (EmitChainOps). ScheduleFromComputes turns any
// compute sequence into a SPEC schedule: each compute starts an "instance"
// of its node; a reader reads the latest instance; an instance is freed
// right after its last reader (before the node is computed again), the
// final instance of an output never. This is SPEC's free at last use
// extended to recomputation, and it makes the schedule valid whenever every
// input has been computed at least once before its reader (the emitter
// guarantees that, computing never-computed inputs on demand). Checkpoints
// need no special treatment: a_i stays resident exactly as long as a later
// recomputation reads it. Outputs are computed once: an output that is
// already resident is never recomputed.
#ifndef PEBBLE_SCHEDULER_REMAT_H_
#define PEBBLE_SCHEDULER_REMAT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"

namespace pebble {

// Step 1 of Note [Chain view of a training graph].
struct ForwardPart {
  std::vector<uint8_t> is_forward;  // per node: 1 for forward-part nodes
  // Per node: 1 for a shared gather (Note [Shared gathers]), a forward-part
  // node that is in neither list below.
  std::vector<uint8_t> on_demand;
  std::vector<NodeId> forward;      // forward part, normalised order
  std::vector<NodeId> backward;     // other needed non-persistent nodes,
                                    // the graph's own order
  bool by_role = false;             // decided by roles (else: peak split)
};
ForwardPart SplitForward(const Graph& graph);

// Step 2: the forward part and its separators.
struct ChainView {
  ForwardPart part;
  std::vector<int> position;    // per node: index in part.forward, or -1
  std::vector<int> separators;  // positions in part.forward, ascending;
                                // never the last forward position
};
ChainView BuildChainView(const Graph& graph);

// One stage of a collapsed chain (step 3). Byte figures follow SPEC section
// 2; "peak" figures are the largest resident bytes while the operation runs
// alone, counting the stage input a_{i-1} while it is resident: index [1]
// when a_{i-1} stays resident after the operation (a later operation reads
// it), [0] when it is freed after its last read inside the operation.
struct ChainStage {
  NodeId input = kNoNode;  // a_{i-1}; kNoNode for the first stage
  NodeId output = kNoNode;  // a_i: the boundary (last forward node of the stage)
  std::vector<NodeId> forward;   // every forward node of the stage, in order
  std::vector<NodeId> cone;      // F_i: what a_i needs (a_i included)
  std::vector<NodeId> saved;     // F_i^saved: what B_i reads, the stage's
                                 // graph outputs, and their stage ancestors
  std::vector<NodeId> all;       // F_i^all: cone and saved
  std::vector<NodeId> backward;  // B_i, in the graph's own order
  std::vector<NodeId> frontier;  // backward nodes of higher stages that are
                                 // resident when B_i starts (the incoming
                                 // gradient), ascending ids
  double cone_cost = 0, all_cost = 0, saved_cost = 0, backward_cost = 0;
  int64_t input_bytes = 0;      // bytes(a_{i-1}); 0 for the first stage
  int64_t output_bytes = 0;     // bytes(a_i)
  int64_t saved_bytes = 0;      // forward nodes of the stage B_i reads
  int64_t saved_extra_bytes = 0;  // the same without a_i
  bool output_saved = false;    // B_i reads a_i
  bool backward_reads_input = false;  // B_i reads a_{i-1}
  int64_t frontier_bytes = 0;   // sum over `frontier`
  int64_t permanent_bytes = 0;  // graph outputs made by B_i (and, for the
                                // last stage, by its forward part)
  int64_t cone_peak[2] = {0, 0};
  int64_t all_peak[2] = {0, 0};
  int64_t saved_peak[2] = {0, 0};
  int64_t backward_peak[2] = {0, 0};  // includes the frontier, S_i, outputs
};

struct Chain {
  std::vector<ChainStage> stages;
  // Resident during the whole schedule whatever the program: persistent
  // nodes and the graph outputs of the forward part outside the last stage.
  int64_t fixed_bytes = 0;
  // Backward nodes with no compatible stage (step 3), ascending ids.
  std::vector<NodeId> irregular;
  // ForwardPart::on_demand: made again by each operation that reads them.
  std::vector<uint8_t> on_demand;
  // LossPlacement::kAfterBackward applied: the last stage's forward sinks
  // are at the end of its backward part (Note [Late loss]).
  bool late_loss = false;
  int num_stages() const { return static_cast<int>(stages.size()); }
};

// Where a backward node that reads a boundary a_j goes when both j and j+1
// are compatible (step 3): kWithInput, the highest stage, j+1 (a_j is the
// input of stage j+1, which must then keep it through its whole backward
// solve); kWithProducer, stage j, as long as its other reads allow it (a_j
// is then an activation that stage j's backward reads, which lets a program
// drop a_j early and recompute it, at the price of keeping it or
// recomputing it). Neither dominates: `rotor` plans both and keeps the
// better; the checkpoint-set policies use kWithInput.
enum class BackwardPlacement : uint8_t { kWithInput, kWithProducer };

// When the loss is computed (Note [Late loss]): kEarly, in the forward pass
// as the last stage's forward part (F^saved of that stage), so it is
// resident through the whole backward pass; kAfterBackward, as the last
// operation of the last stage's backward part; kAtEnd, in no list: the
// program ends with a sweep to the loss's input, and ChainComputes computes
// the loss last (it makes every output no operation made).
enum class LossPlacement : uint8_t { kEarly, kAfterBackward, kAtEnd };

// Step 3. `boundaries`: a subset of view.separators (positions, ascending);
// the stages end there and at the last forward position. A graph with an
// empty forward part gives a chain with no stages.
Chain CollapseChain(const Graph& graph, const ChainView& view,
                    const std::vector<int>& boundaries,
                    BackwardPlacement placement = BackwardPlacement::kWithInput,
                    LossPlacement loss = LossPlacement::kEarly);

// Step 4.
enum class ChainOpKind : uint8_t { kForward, kForwardAll, kForwardSaved, kBackward };
struct ChainOp {
  ChainOpKind kind;
  int stage;
  bool operator==(const ChainOp&) const = default;
};

// Chen et al. 2016's segment program: `kept` lists stage indices whose
// output is a checkpoint (ascending, each < L-1). Forward: F_i over every
// stage of every segment but the last, F_i^all over the last segment; then
// segment by segment from the last, F^all over the segment's stages from
// its checkpoint (F^saved for its last stage) and B over them in reverse.
// Each non-last segment is recomputed once: at most one extra forward pass.
std::vector<ChainOp> CheckpointOps(const Chain& chain, const std::vector<int>& kept);

// The compute sequence of a program (Note [Emission]): node lists of the
// operations in order, an output already computed skipped, a never-computed
// input computed first (on demand).
std::vector<NodeId> ChainComputes(const Graph& graph, const Chain& chain,
                                  const std::vector<ChainOp>& ops);

// Note [Emission]: the schedule of a compute sequence. Every input of a
// compute must have been computed earlier in `computes` (or be persistent):
// a broken one is a bug (PEBBLE_CHECK). Outputs missing from `computes`
// are missing from the schedule too (the simulator rejects it).
Schedule ScheduleFromComputes(const Graph& graph, const std::vector<NodeId>& computes);

Schedule EmitChainOps(const Graph& graph, const Chain& chain,
                      const std::vector<ChainOp>& ops);

// Peak resident bytes of computing `seq` (each node once, in order, inputs
// assumed resident) starting from `initial`, freeing at last use within
// `seq`: an initial node with keep = false is resident until its last read
// in `seq` (not at all when `seq` does not read it); with keep = true to the
// end. A node of `seq` stays to the end when keep_after(v), else until its
// last read in `seq`. Other nodes (persistent ones, anything outside) are
// not counted. Computes count their workspace.
struct InitialNode {
  NodeId node;
  bool keep;
};
// Per-node state SequencePeak reuses across calls (sized to the graph once;
// left clean after each call). Null: allocated for the call, O(nodes).
struct SequencePeakScratch {
  std::vector<int> last;       // last read position in the sequence, or -1
  std::vector<int8_t> keep;    // -1 untracked, 0 dropped, 1 kept
  std::vector<NodeId> touched;
};
int64_t SequencePeak(const Graph& graph, absl::Span<const NodeId> seq,
                     absl::Span<const InitialNode> initial,
                     const std::function<bool(NodeId)>& keep_after,
                     SequencePeakScratch* scratch = nullptr);

// Smallest cost clamp used where a policy divides by or ranks costs: every
// cost below it counts as it (zero-cost nodes are free to recompute but
// still ranked by size and age). 1e-9 times the mean positive cost of the
// needed nodes, or 1e-9 when all are zero.
double CostEpsilon(const Graph& graph);

// Picks among candidate schedules by the common budget rule of the
// multi-shot heuristics: with a byte budget, the least compute cost among
// those that fit (ties: lower peak, then the earlier candidate); when none
// fits, the lowest peak (ties: less cost); with kMinBudget the lowest peak
// (ties: less cost, then the earlier one). Candidates are simulated here;
// an invalid one is a bug (PEBBLE_CHECK).
class PlanSelector {
 public:
  // The deadline (options.time_limit_s) starts here, or at `start` (the
  // Plan call's entry: the chain's set-up counts against the limit).
  PlanSelector(const Graph& graph, const PlannerOptions& options)
      : graph_(graph), options_(options), deadline_(options.time_limit_s) {}
  PlanSelector(const Graph& graph, const PlannerOptions& options,
               std::chrono::steady_clock::time_point start)
      : graph_(graph), options_(options), deadline_(options.time_limit_s, start) {}

  // Returns the candidate's simulated peak and cost.
  struct Figures {
    int64_t peak_bytes = 0;
    double compute_cost = 0;
  };
  Figures Consider(Schedule schedule, nlohmann::json details);
  // Candidate i's schedule and details.
  using CandidateMaker = std::function<std::pair<Schedule, nlohmann::json>(int i)>;
  // Candidates [0, n): made and simulated concurrently (oneTBB), in batches
  // between which the time limit is checked, then considered in index
  // order, so that the choice is that of n calls of Consider in order
  // (identical whenever the time limit does not cut the search). `make`
  // must be safe to call from several threads at once.
  void ConsiderEach(int n, const CandidateMaker& make);
  bool fits(int64_t peak) const;
  bool has_best() const { return has_best_; }
  int64_t best_peak() const { return best_.peak_bytes; }
  double best_cost() const { return best_.compute_cost; }
  bool best_fits() const { return has_best_ && fits(best_.peak_bytes); }
  int num_considered() const { return considered_; }
  // True once the time limit has passed: the policy stops offering
  // candidates, and Finish notes the cut (NoteTimeLimit).
  bool TimeUp() const { return deadline_.Expired(); }
  const Deadline& deadline() const { return deadline_; }

  // FinishPlan on the chosen one; its details are merged into the result's.
  absl::StatusOr<PlanResult> Finish();

 private:
  bool Better(const Figures& a, const Figures& b) const;
  // The simulator's figures of a candidate (thread-safe).
  Figures Evaluate(const Schedule& schedule) const;
  // Takes a simulated candidate as the best when it is better.
  void Take(const Figures& f, Schedule schedule, nlohmann::json details);

  const Graph& graph_;
  PlannerOptions options_;
  Deadline deadline_;
  bool has_best_ = false;
  int considered_ = 0;
  Figures best_;
  Schedule best_schedule_;
  nlohmann::json best_details_;
};

// The baseline schedule (free at last use over the graph's own order): every
// multi-shot heuristic offers it first, so that a budget the baseline meets
// costs no recomputation.
Schedule BaselineSchedule(const Graph& graph);

// The common driver of the checkpoint-set policies (sqrtn, articulation,
// chen-greedy): offers the baseline schedule, then CheckpointOps(chain,
// kept) for every candidate (a repeated set is skipped), and lets a
// PlanSelector choose. `details` goes into the result, with the winner's
// candidate details and the chain summary. The time limit counts from
// `started`, the policy's entry (its chain set-up included).
struct CheckpointCandidate {
  std::vector<int> kept;   // stage indices, ascending, each < L-1
  nlohmann::json details;  // what the candidate is ("segments": 4, ...)
};
absl::StatusOr<PlanResult> PlanCheckpointCandidates(
    const Graph& graph, const PlannerOptions& options, const ChainView& view,
    const Chain& chain, const std::vector<CheckpointCandidate>& candidates,
    nlohmann::json details, std::chrono::steady_clock::time_point started);

// Stage indices that cut L stages into k segments of nearly equal length
// (segment j ends at stage floor((j+1) L / k) - 1); 1 <= k <= L.
std::vector<int> EvenCheckpoints(int num_stages, int k);

// Revolve (remat_revolve.cc). The least number of forward steps that
// reverses a uniform chain of l steps with c checkpoint slots (Griewank and
// Walther's t(l, c + 1)); c < 0 is infinite unless l <= 1.
int64_t RevolveForwardSteps(int64_t l, int64_t c);
// OK when the chain is an adjoint chain (remat_revolve.cc); else
// InvalidArgument naming the node that breaks it.
absl::Status CheckAdjointChain(const Graph& graph, const ChainView& view,
                               const Chain& chain);

// Rotor (remat_rotor.cc, Note [Rotor's dynamic program]).
inline constexpr int kRotorSlots = 500;
inline constexpr int kRotorMaxStages = 100;
struct RotorSolution {
  bool feasible = false;      // a program fits `memory_bytes`
  std::vector<ChainOp> ops;   // the cheapest such program
  double predicted_cost = 0;  // its compute cost by the DP
  int64_t slot_bytes = 0;     // the rounding unit
  int64_t min_bytes = 0;      // the least memory the DP can use (whole
                              // slots); 0 when nothing fits
};
// The DP over `chain` with `memory_bytes` for the program (the budget less
// chain.fixed_bytes) in `slots` slots: the cheapest program within it, or
// with `least_memory` the cheapest one within min_bytes (the least memory
// this table can plan in).
RotorSolution SolveRotor(const Chain& chain, int64_t memory_bytes,
                         int slots = kRotorSlots, bool least_memory = false);
// Note [Late loss], the loss after the whole backward pass: programs on a
// chain collapsed with LossPlacement::kAtEnd, one per pinned stage p
// (-1: none): F_0..F_p, Solve(p+1, L-1) keeping a_p, Solve(0, p) with a_p
// held, then F_q..F_{L-2} for q = p+1..L-1, a sweep to the loss's input
// from a_p or from a later state whose last instance stays resident. Only
// those whose DP parts fit `memory_bytes`, cheapest predicted first; the
// final sweep's peak is the simulator's to judge.
std::vector<std::vector<ChainOp>> RotorLossAtEndPrograms(const Chain& chain,
                                                         int64_t memory_bytes,
                                                         int slots = kRotorSlots);
// At most max_stages - 1 of `separators`, evenly by index (all when they
// already make at most max_stages stages).
std::vector<int> CoarsenBoundaries(const std::vector<int>& separators, int max_stages);

// Chain summary for details JSON: stages, separators, irregular nodes.
nlohmann::json ChainSummary(const Graph& graph, const ChainView& view,
                            const Chain& chain);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_REMAT_H_
