// Internal to the ONNX importer (graph/import/): the state of one import and
// the primitives every operator's mapping builds on. ImportContext maps ONNX
// value names to pebble values (computed nodes, graph inputs, initializers
// made persistent nodes on first use, integer tensors folded at import) and
// applies pebble operators under the ids docs/import.md describes. The
// operators' mappings (onnx_ops.h) read and define values through it (and
// Split applies its slices through the NetBuilder it holds).
#ifndef PEBBLE_GRAPH_IMPORT_ONNX_CONTEXT_H_
#define PEBBLE_GRAPH_IMPORT_ONNX_CONTEXT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/net_builder.h"
#include "onnx/onnx_pb.h"

namespace pebble::onnx_import {

using Json = nlohmann::json;

// An integer tensor known at import (a shape, its arithmetic): its dims and
// its values in row-major order. torch.onnx.export writes `x.size()` and the
// sizes computed from it (Shape, Gather, Div, Unsqueeze, Concat, ...) as
// nodes; every shape is static here, so they fold into such constants,
// which Reshape, Slice and the others read. No pebble node is made for them.
struct Ints {
  Shape dims;
  std::vector<int64_t> values;
};

// A numeric constant known at import, as doubles: its dims and its values
// in row-major order (a float Constant, an attention mask), and its ONNX
// type (that of a noted Cast: Note [Casts of constants]). A float constant
// folded from it keeps a FLOAT16 or BFLOAT16 type (FloatTensor).
struct Numbers {
  Shape dims;
  std::vector<double> values;
  int data_type = onnx::TensorProto::FLOAT;
};

// The element of an operand of `dims` that element `o` of the broadcast
// shape `out` reads (NumPy's rules: dims aligned on the right, a dim of 1
// repeated): for folding constants of different shapes.
int64_t BroadcastIndex(const Shape& dims, const Shape& out, int64_t o);
// The broadcast shape of two folded constants, where they broadcast and it
// holds at most 2^20 values.
std::optional<Shape> FoldedBroadcastShape(const Shape& a, const Shape& b);
// op(x, y) of the elements x of `a` and y of `b` that each element of their
// broadcast shape reads (FoldedBroadcastShape), or nullopt where they do
// not broadcast.
std::optional<Numbers> BroadcastFold(const Numbers& a, const Numbers& b,
                                     const std::function<double(double, double)>& op);

// Input 0 of a node: known integers, or else a computed value; its shape.
struct Operand {
  std::optional<Ints> ints;
  Value value;
  Shape shape;
};

class ImportContext {
 public:
  ImportContext(std::string graph_name, const CostModel& cost_model)
      : nb_(std::move(graph_name), cost_model) {}

  NetBuilder& nb() { return nb_; }
  const NetBuilder& nb() const { return nb_; }
  int64_t opset() const { return opset_; }
  void set_opset(int64_t opset) { opset_ = opset; }
  // The loss the training graph will add (the model's last LogSoftmax
  // depends on it).
  LossKind loss() const { return loss_; }
  void set_loss(LossKind loss) { loss_ = loss; }

  // ---- Setting up, before the nodes.

  // The graph's initializers by name (each once; no sparse ones); the
  // inputs 3 and 4 of every BatchNormalization are buffers, not parameters.
  absl::Status ReadInitializers(const onnx::GraphProto& graph);
  // After ReadInitializers: the floating-point initializers whose names
  // match one of `patterns` (ids or fnmatch(3) globs) are buffers too
  // (OnnxImportOptions::frozen); an option error naming a pattern that
  // matches no initializer at all.
  absl::Status FreezeInitializers(const std::vector<std::string>& patterns);
  bool IsInitializer(const std::string& name) const { return initializers_.contains(name); }
  // A graph input or output: its name is its node's id, which no other
  // node takes.
  void Reserve(const std::string& name) { reserved_.insert(name); }
  bool Reserved(const std::string& name) const { return reserved_.contains(name); }
  // Indexes which nodes read each value (Readers) and which writes it
  // (Producer).
  void IndexReaders(const onnx::GraphProto& graph);
  void DefineInput(const std::string& name, Value v) { values_[name] = v; }

  // ---- Reading values.

  // The pebble value of ONNX value `name`: computed, a graph input, a float
  // scalar constant (a `fill`), or an initializer made a persistent node on
  // first use. An error naming `node` where there is none.
  absl::StatusOr<Value> Get(const onnx::NodeProto& node, const std::string& name);
  // The values of the node's non-empty inputs, in order.
  absl::StatusOr<std::vector<Value>> Inputs(const onnx::NodeProto& node);
  // The computed value `name` holds, or nullptr (no initializer is made).
  const Value* Find(const std::string& name) const;
  // A constant tensor (a Constant's, a Cast's of one, a folded one, or an
  // initializer), or nullptr.
  const onnx::TensorProto* ConstTensor(const std::string& name) const;
  // Whether `name` is a float initializer that the model may train: PyTorch
  // names its parameters (and buffers) by their state_dict keys, and the
  // constants it folds "onnx::..."; an operator's argument (arguments_) is
  // none. A differentiable operand that is one (Pow's exponent, a Concat's
  // part) is a parameter, not a constant to fold (a learnable GeM exponent
  // was once frozen at its first value).
  bool IsParameterLike(const std::string& name) const;
  // Input `i` of `node` as constant integers; an error where it is not one.
  absl::StatusOr<std::vector<int64_t>> ConstInts(const onnx::NodeProto& node, int i);
  // `name`'s integers where they are known at import.
  std::optional<Ints> KnownInts(const std::string& name) const;
  // `name`'s numbers (float; integers, and booleans as 0 and 1, as doubles)
  // where it is a constant of at most 2^20 elements that is not a parameter
  // (IsParameterLike).
  std::optional<Numbers> KnownNumbers(const std::string& name) const;
  // The nodes that read value `name` (IndexReaders), in graph order.
  const std::vector<const onnx::NodeProto*>& Readers(const std::string& name) const;
  // The node whose output `name` is, or nullptr (a graph input, a weight).
  const onnx::NodeProto* Producer(const std::string& name) const {
    const auto it = producers_.find(name);
    return it == producers_.end() ? nullptr : it->second;
  }
  absl::StatusOr<Operand> FirstOperand(const onnx::NodeProto& node);
  // An error unless `node` has `min` to `max` inputs.
  absl::Status ExpectInputs(const onnx::NodeProto& node, int min, int max);

  // ---- Defining values.

  // Output `output` of `node` is `v`; ONNX values are assigned once.
  absl::Status Define(const onnx::NodeProto& node, Value v, int output = 0);
  // Output `output` of `node` is the integer tensor `ints`, folded.
  absl::Status DefineInts(const onnx::NodeProto& node, int output, Ints ints);
  // Output 0 of `node` is the constant `tensor`, folded (its name is set).
  absl::Status DefineFolded(const onnx::NodeProto& node, onnx::TensorProto tensor);
  // `name` is the constant `tensor` (which outlives the import).
  void SetConstant(const std::string& name, const onnx::TensorProto* tensor) {
    constants_[name] = tensor;
  }
  // Note [Casts of constants]: `name` is a constant cast to the ONNX type
  // `to` whose values the cast leaves as they are; its tensor keeps its own
  // type (for the shape arithmetic), and a computation that reads it gets
  // `to` (ConstantNode). Views of it that fold keep the note.
  void NoteCastTo(const std::string& name, int to) { cast_to_[name] = to; }
  std::optional<int> CastTo(const std::string& name) const {
    auto it = cast_to_.find(name);
    return it == cast_to_.end() ? std::nullopt : std::optional<int>(it->second);
  }
  // An output nothing in a training step reads (batch norm's updated
  // statistics, dropout's mask): reading it is an error.
  void MarkUnreadable(const std::string& name) { unreadable_.insert(name); }
  // Value `name` is a computed value plus a causal mask that the softmax
  // reading it applies (its `causal` attr) rather than an add.
  void MarkCausallyMasked(const std::string& name) { causally_masked_.insert(name); }
  bool CausallyMasked(const std::string& name) const { return causally_masked_.contains(name); }
  // The model's last node, a LogSoftmax over the classes, is left to the
  // cross-entropy loss (docs/import.md): its label, for the note.
  void NoteLossTakesLogSoftmax(std::string node) { loss_takes_log_softmax_ = std::move(node); }
  const std::optional<std::string>& loss_takes_log_softmax() const {
    return loss_takes_log_softmax_;
  }
  // Why the model's last node, a LogSoftmax, is computed rather than taken
  // into the loss (for --loss nll's error).
  void NoteLogSoftmaxOutsideLoss(std::string why) { log_softmax_outside_loss_ = std::move(why); }
  const std::optional<std::string>& log_softmax_outside_loss() const {
    return log_softmax_outside_loss_;
  }
  // A sentence for the user of a graph that imports (ImportOnnxModel's
  // notes).
  void AddNote(std::string note) { notes_.push_back(std::move(note)); }
  const std::vector<std::string>& notes() const { return notes_; }

  // ---- Applying pebble operators.

  // Applies pebble op `op` with the node's first output as id, and defines
  // that output.
  absl::Status Apply(const onnx::NodeProto& node, absl::string_view op, std::vector<Value> inputs,
                     Json attrs = Json::object(), std::string id = "");
  // A node `node` needs beside the one computing its output (a lowering's
  // reshape, transpose, statistics): id "<node's id>.<suffix>".
  absl::StatusOr<Value> Aux(const onnx::NodeProto& node, absl::string_view op,
                            std::vector<Value> inputs, Json attrs, absl::string_view suffix);
  // A node of `node`'s lowering: with an empty `suffix` the one whose id is
  // the node's own (its output, still to be defined), else an Aux.
  absl::StatusOr<Value> Lowered(const onnx::NodeProto& node, absl::string_view op,
                                std::vector<Value> inputs, Json attrs, absl::string_view suffix);
  // A 1-D convolution or pooling run as 2-D of height 1: the first
  // `viewed` inputs (x; for a convolution the weight too) get a unit dim at
  // 2 (reshapes: views of their inputs), `op` runs on them with `attrs`
  // (already 2-D), and its result is viewed back without that dim.
  absl::Status ApplyAs2d(const onnx::NodeProto& node, absl::string_view op, std::vector<Value> in,
                         size_t viewed, Json attrs);
  // A `fill` of `value`, of `shape` and `like`'s dtype (a Aux of `node`).
  absl::StatusOr<Value> Fill(const onnx::NodeProto& node, const std::vector<int64_t>& shape,
                             Value like, double value, absl::string_view suffix);
  // A zero Fill: what Expand and a two-sided broadcast add a tensor to, to
  // broadcast it.
  absl::StatusOr<Value> Zeros(const onnx::NodeProto& node, const std::vector<int64_t>& shape,
                              Value like, absl::string_view suffix) {
    return Fill(node, shape, like, 0.0, suffix);
  }

  // The id of the node computing `node`'s first output (docs/import.md).
  std::string NodeIdFor(const onnx::NodeProto& node) const;
  // Whether `id` may name a new node.
  bool Free(const std::string& id) const;
  // "<stem>#2", "<stem>#3", ...: the first that is free.
  std::string FreshId(const std::string& stem) const;

 private:
  // A constant that a computation reads, as a `constant` node of its values
  // (float as f32, bool as u8, int64 as i64; at most 2^20 elements): a table
  // the exporter computed (positions from torch.arange), a fixed mask.
  absl::StatusOr<Value> ConstantNode(const onnx::NodeProto& node, const std::string& name,
                                     const onnx::TensorProto& t);
  // A folded view (Reshape, Unsqueeze, ...) of a cast constant is cast too.
  void InheritCast(const onnx::NodeProto& node, const std::string& output);
  absl::StatusOr<Value> PersistentNode(const onnx::NodeProto& node, const std::string& name,
                                       const onnx::TensorProto& t);
  void MarkView(absl::string_view op, Value v, const std::vector<Value>& inputs);

  NetBuilder nb_;
  int64_t opset_ = 0;
  LossKind loss_ = LossKind::kNone;
  std::optional<std::string> loss_takes_log_softmax_;
  std::optional<std::string> log_softmax_outside_loss_;
  std::vector<std::string> notes_;
  absl::flat_hash_map<std::string, const onnx::TensorProto*> initializers_;
  absl::flat_hash_map<std::string, const onnx::TensorProto*> constants_;
  // The constants folded at import (DefineInts, DefineFolded); a deque
  // keeps the addresses constants_ holds.
  std::deque<onnx::TensorProto> folded_;
  absl::flat_hash_set<std::string> buffers_;
  absl::flat_hash_map<std::string, int> cast_to_;  // NoteCastTo
  // Values that are operators' arguments, not operands (Resize's roi,
  // scales and sizes, and the parts of a Concat that makes one, as
  // nn.Upsample exports its scales): constants, however they are named.
  absl::flat_hash_set<std::string> arguments_;
  absl::flat_hash_set<std::string> unreadable_;
  absl::flat_hash_set<std::string> causally_masked_;
  absl::flat_hash_map<std::string, std::vector<const onnx::NodeProto*>> readers_;
  absl::flat_hash_map<std::string, const onnx::NodeProto*> producers_;
  absl::flat_hash_map<std::string, Value> values_;
  absl::flat_hash_set<std::string> reserved_;
};

}  // namespace pebble::onnx_import

#endif  // PEBBLE_GRAPH_IMPORT_ONNX_CONTEXT_H_
