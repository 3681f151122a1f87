// The optimizer's step as part of a training graph (docs/training.md,
// "The optimizer in the graph"): its state tensors are persistent nodes and
// its updates in-place nodes (docs/semantics.md, "Home tiers and in-place
// updates"), so a plan places them like any other tensor.
//
// Note [Optimizer nodes]. For every parameter p with a gradient "grad:p":
//   SGD, momentum m > 0:  "momentum_buffer:p" (persistent, p's shape and
//     dtype, zeros at the first step), "momentum_buffer:p#1" writes it
//     (buf <- m buf + g, where g = grad + weight_decay p), "update:p" writes
//     p (p <- p - lr buf). PyTorch starts the buffer as a copy of the first
//     gradient, which is m 0 + g: the same (dampening is 0).
//   SGD, momentum 0:      "update:p" writes p (p <- p - lr g).
//   Adam and AdamW:       one "optimizer.step" (a float32 scalar, the steps
//     taken), which "optimizer.step#1" increments first; "exp_avg:p",
//     "exp_avg_sq:p" (zeros at the first step), written by "exp_avg:p#1"
//     (b1 m + (1 - b1) g) and "exp_avg_sq:p#1" (b2 v + (1 - b2) g^2);
//     "update:p" writes p with the bias-corrected step of
//     torch.optim.Adam / AdamW (AdamW decays p by lr weight_decay first,
//     Adam adds weight_decay p to g).
// The updates are needed (every step runs them) but not outputs; the
// gradients stay outputs unless the spec drops them (keep_gradients).
// Persistent states take role optimizer_state and the updates role update;
// their home is `home` (resident by default), but for Adam's step count,
// which is resident always.
//
// Note [Clipping in the graph]. With max_grad_norm = c, the updates read
// gradients clipped as torch.nn.utils.clip_grad_norm_(params, c) clips
// them: every updated gradient times min(1, c / (n + 1e-6)), n the 2-norm
// of all of them together. The backward's gradient of p is renamed
// "unclipped_grad:p", and ordinary nodes of the operator table follow it
// (role backward, so every runtime runs them and every policy plans them):
// "clip_square:p" (mul: its elements squared, a temporary of the gradient's
// size), "clip_part:p" (sum: a float32 scalar), "clip_sum:<k>" (add: the
// running total), "grad_norm" (sqrt: n, an output, as clip_grad_norm_
// returns it), "clip_max_norm" and "clip_eps" (fill: c and 1e-6),
// "clip_denominator" (add), "clip_ratio" (div), "clip_coef" (clip at 1),
// and "grad:p" (mul: the clipped gradient, the one the updates read and the
// step outputs, as .grad holds it after clip_grad_norm_). So the norm needs
// every gradient complete: no update runs before the backward ends, and
// each clipped gradient is a new tensor beside its unclipped one for as long
// as the plan keeps both (PyTorch scales .grad in place): a gradient more at
// most, as the squares are (a sum of squares without them would not lower
// the peak; scaling in place would, which only persistent storages may
// be: docs/semantics.md). The update nodes
// are the same as without clipping (a cost profile taken without it still
// applies). Float32 gradients only. On several ranks (data parallel) the
// unclipped gradients are summed before the clipping reads them, so the
// norm is of the averaged gradients (scheduler/collectives.cc,
// ClippedReducePositions); sharded, the norm is summed from every rank's
// shards (Note [Clipping sharded gradients], scheduler/sharding.cc).
//
// Note [Parameter groups]. As torch.optim's param_groups: an update node
// carries its own settings (lr, weight_decay, the betas, eps) in its attrs,
// and a group of the spec gives the parameters whose ids match its glob
// other values than the spec's (the usual weight decay on the weights
// only, a learning rate per layer, SGD's momentum on the weights only).
// Every group that matches a parameter applies, in the order given: a
// later one's value of a key wins. A parameter whose SGD settings have
// momentum 0 keeps no momentum buffer (as torch.optim.SGD keeps none): its
// update reads its gradient. The placement settings are the step's.
#ifndef PEBBLE_GRAPH_OPTIMIZER_H_
#define PEBBLE_GRAPH_OPTIMIZER_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/net_builder.h"

namespace pebble {

enum class OptimizerKind { kSgd, kAdam, kAdamW };

// A parameter group (Note [Parameter groups]): the parameters whose ids
// match `pattern` (a shell glob: *, ? and [...], as fnmatch(3) matches
// them; "*" crosses dots) take `settings` (a key of ParameterGroupKeys and
// its value, in the order given) in place of the spec's.
struct ParameterGroup {
  std::string pattern;
  std::vector<std::pair<std::string, double>> settings;
};

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.01;
  double momentum = 0.0;      // SGD
  double weight_decay = 0.0;  // SGD, Adam: added to the gradient; AdamW: decoupled
  double beta1 = 0.9;         // Adam, AdamW
  double beta2 = 0.999;
  double eps = 1e-8;
  // Gradient clipping by the 2-norm of all the updated gradients together,
  // as torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm) before the
  // step; 0: none (Note [Clipping in the graph]).
  double max_grad_norm = 0.0;
  // Where the optimizer's state lives between steps; nullopt: resident
  // throughout (a persistent node without a home).
  std::optional<Tier> state_home;
  // Where the updated parameters live between steps; nullopt: resident
  // throughout. With a host home every policy streams each parameter to
  // its uses (Note [Parameters streamed], scheduler/updates_last.cc).
  std::optional<Tier> parameter_home;
  // Whether the gradients stay outputs of the step (true: resident at its
  // end, as without an optimizer); false ("gradients=drop"): only the
  // updates read them, and a plan may free each after its update.
  bool keep_gradients = true;
  // Where the updates run ("updates=device|host|auto"; docs/training.md,
  // "Updates on the host"). host: every update runs on the host, on host
  // copies, at a host_cost from CostModel::host_bytes_per_s; the state's
  // home is then the host unless given, Adam's step count's too, and the
  // parameters' the device unless given. auto: the plan chooses per
  // parameter whether its updates run on the host or the device; the state
  // lives on the host, or (state=auto) where the plan places it; Adam's
  // step count is counted on the device.
  Tier updates = Tier::kDevice;
  // Whether the optimizer keeps state (all but SGD without momentum, in the
  // spec and in every group): only then may the state have a home.
  bool keeps_state() const;
  // Parameter groups, in the order given (Note [Parameter groups]).
  std::vector<ParameterGroup> groups;
  // Whether `parameter` (an id) matches `group`'s pattern.
  static bool Matches(const ParameterGroup& group, absl::string_view parameter);
  // The settings of `parameter`'s updates: the spec's, with those of every
  // group that matches it applied in order.
  OptimizerSpec SettingsFor(absl::string_view parameter) const;
  // "adam:lr=0.001,beta1=0.9,...;*.bias:weight_decay=0" (canonical: the
  // keys in a fixed order, each group as given).
  std::string ToString() const;
};

// The keys a parameter group of `kind` may set: lr and weight_decay; SGD's
// momentum; Adam and AdamW's beta1, beta2 and eps.
std::vector<std::string> ParameterGroupKeys(OptimizerKind kind);

// "sgd", "adam", "adamw", optionally with parameters after a colon:
// "sgd:lr=0.1,momentum=0.9,weight_decay=1e-4", "adam:lr=1e-3,beta1=0.9,
// beta2=0.999,eps=1e-8,weight_decay=0", "...,state=host|auto",
// "...,parameters=host|auto", "...,gradients=drop", "...,updates=host|auto",
// "...,max_grad_norm=1.0" (any optimizer); then parameter groups after
// semicolons, each a glob and its settings after a colon:
// "adamw:lr=1e-3;*.bias:weight_decay=0;fc.*:lr=1e-4" (Note [Parameter
// groups]).
// Defaults are
// PyTorch's (lr 0.01 for SGD, 0.001 for Adam and AdamW; AdamW's
// weight_decay 0.01). InvalidArgument names an unknown optimizer or key,
// a value that is not a finite number, and a value out of range (lr >= 0,
// momentum and the betas in [0, 1), eps > 0, weight_decay >= 0,
// max_grad_norm > 0), and a group without a pattern or settings, or with a
// key that groups do not take.
absl::StatusOr<OptimizerSpec> ParseOptimizer(absl::string_view text);
// One number of a spec, `key`=`value` (a key of ParseOptimizer's: lr,
// max_grad_norm, ...): a decimal in the key's range, else InvalidArgument
// naming both.
absl::StatusOr<double> ParseOptimizerNumber(absl::string_view key, absl::string_view value);

// `training` (a training graph: parameters with gradients "grad:p" among
// its outputs) with the optimizer's state and updates (Note [Optimizer
// nodes]), its gradients clipped first where the spec says (Note [Clipping
// in the graph]). Costs: element-wise work at cost.device_flops_per_s (SGD 3 and
// Adam 10 operations per element); updates that may run on the host have a
// host_cost: the bytes each reads and writes at cost.host_bytes_per_s. The
// state and updates of a parameter take its shape, bytes and dtype (none
// where it has none: a dtype the format cannot name, as pebble.torch's
// float64). Errors: no parameter with a gradient, a
// parameter without a shape, a state id already taken, a parameter group
// that matches no updated parameter; with clipping, a gradient that is not
// float32 (Unimplemented).
absl::StatusOr<Graph> AddOptimizerStep(const Graph& training, const OptimizerSpec& spec,
                                       CostModel cost = {});

// Whether `graph` clips its gradients (Note [Clipping in the graph]): it has
// a node "unclipped_grad:p" of a parameter p. Planned on one rank, data
// parallel (the norm of the gradients averaged over the ranks, as
// clip_grad_norm_ after DistributedDataParallel's backward) and sharded
// (ShardGraph: the norm of every rank's shards, summed by one all_reduce).
bool ClipsGradients(const Graph& graph);
// Whether `v` is a parameter's unclipped gradient "unclipped_grad:p": the
// backward's gradient, which only the clipping's nodes read.
bool IsUnclippedGradient(const Graph& graph, NodeId v);
// The gradient of parameter `p` that the backward makes: "unclipped_grad:p"
// where the step clips, else "grad:p"; kNoNode where there is none. With
// several ranks this is the gradient summed over them.
NodeId BackwardGradient(const Graph& graph, NodeId p);
// The prefixes of the per-parameter node ids "<prefix><p>" (Notes
// [Optimizer nodes] and [Clipping in the graph]); a reader that maps such
// a node to its parameter (the memory log's ModuleOf) takes them from
// here, with ShardGraph's (scheduler/collectives.h).
inline constexpr absl::string_view kGradPrefix = "grad:";
inline constexpr absl::string_view kUnclippedGradPrefix = "unclipped_grad:";
inline constexpr absl::string_view kClipSquarePrefix = "clip_square:";
inline constexpr absl::string_view kClipPartPrefix = "clip_part:";
inline constexpr absl::string_view kMomentumBufferPrefix = "momentum_buffer:";
inline constexpr absl::string_view kExpAvgPrefix = "exp_avg:";
inline constexpr absl::string_view kExpAvgSqPrefix = "exp_avg_sq:";
inline constexpr absl::string_view kUpdatePrefix = "update:";
inline constexpr absl::string_view kPerParameterPrefixes[] = {
    kGradPrefix,           kUnclippedGradPrefix, kClipSquarePrefix, kClipPartPrefix,
    kMomentumBufferPrefix, kExpAvgPrefix,        kExpAvgSqPrefix,   kUpdatePrefix};
// The ops of the update nodes (Note [Optimizer nodes]).
inline constexpr absl::string_view kUpdateOps[] = {
    "sgd_momentum", "sgd_update", "adam_exp_avg", "adam_exp_avg_sq", "adam_update",
    "optimizer_step"};
// The id of the clipped gradients' norm before clipping (an output).
inline constexpr absl::string_view kGradNormId = "grad_norm";
// The id of a sharded step's sum of its squared gradient shards over the
// ranks (ShardGraph's all_reduce collective, which the norm reads).
inline constexpr absl::string_view kClipTotalId = "clip_total";
// Where `graph` has collectives (sharded) and clips its gradients: each
// unclipped gradient is a reduce-scatter's shard, and the norm is computed
// from an all_reduce collective (the ranks' parts summed); else
// InvalidArgument naming the culprit. A gradient kept whole would count
// once per rank in that sum.
absl::Status CheckShardedClipping(const Graph& graph);

// The host cost model of an element-wise update (seconds): it streams
// `bytes_moved` (its operands' bytes read plus its output's written) at
// `bytes_per_s` (CostModel::host_bytes_per_s, or a profile's measured rate).
inline double HostUpdateSeconds(int64_t bytes_moved, double bytes_per_s) {
  return static_cast<double>(bytes_moved) / bytes_per_s;
}

}  // namespace pebble

#endif  // PEBBLE_GRAPH_OPTIMIZER_H_
