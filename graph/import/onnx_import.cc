// ONNX import (see onnx_import.h and docs/import.md): the driver. It checks
// the model, reads its initializers and inputs, hands each node to its
// operator's handler (onnx_ops.h) and checks the shapes against ONNX's own
// inference; the handlers build the graph through an ImportContext.
#include "graph/import/onnx_import.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/import/onnx_batch.h"
#include "graph/import/onnx_context.h"
#include "graph/import/onnx_ops.h"
#include "graph/import/onnx_util.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "onnx/onnx_pb.h"
#include "onnx/shape_inference/implementation.h"

namespace pebble {
namespace onnx_import {
namespace {

// Every operator's handler, by ONNX op type.
const OnnxHandlers& Handlers() {
  static const OnnxHandlers* handlers = [] {
    auto* table = new OnnxHandlers;
    AddLayerOps(*table);
    AddElementwiseOps(*table);
    AddShapeOps(*table);
    AddMaskOps(*table);
    AddRecurrentOps(*table);
    return table;
  }();
  return *handlers;
}

// PyTorch before 2.0 exports a circular padding by p along a dim as
// Concat(x[-(p + 1):-1], x, x[:p]) there, whose first part is one row
// off (pytorch/pytorch#86690; it should be x[-p:]). The Concats of that
// pattern in `graph`, labelled, once `cx` has imported it (the Slices'
// bounds are then folded).
std::vector<std::string> OffByOneCircularPads(const onnx::GraphProto& graph,
                                              const ImportContext& cx) {
  std::vector<std::string> found;
  for (const onnx::NodeProto& node : graph.node()) {
    if (node.op_type() != "Concat" || node.input_size() != 3) continue;
    const absl::StatusOr<int64_t> axis = Attrs(node).Int("axis", 0);
    if (!axis.ok()) continue;
    // A Slice of the Concat's middle input along its axis: (start, end).
    auto bounds = [&](const std::string& name) -> std::optional<std::pair<int64_t, int64_t>> {
      const onnx::NodeProto* slice = cx.Producer(name);
      if (slice == nullptr || slice->op_type() != "Slice" || slice->input_size() != 4 ||
          slice->input(0) != node.input(1)) {
        return std::nullopt;
      }
      const std::optional<Ints> starts = cx.KnownInts(slice->input(1));
      const std::optional<Ints> ends = cx.KnownInts(slice->input(2));
      const std::optional<Ints> axes = cx.KnownInts(slice->input(3));
      if (!starts || !ends || !axes || starts->values.size() != 1 ||
          ends->values.size() != 1 || axes->values != std::vector<int64_t>{*axis}) {
        return std::nullopt;
      }
      return std::pair{starts->values[0], ends->values[0]};
    };
    const auto left = bounds(node.input(0)), right = bounds(node.input(2));
    if (left && right && right->first == 0 && right->second >= 1 && left->second == -1 &&
        left->first == -(right->second + 1)) {
      found.push_back(NodeLabel(node));
    }
  }
  return found;
}

class Importer {
 public:
  Importer(const onnx::ModelProto& model, absl::string_view name, const OnnxImportOptions& options)
      : model_(model),
        graph_(model.graph()),
        options_(options),
        cx_(std::string(name), options.cost_model) {
    cx_.set_loss(options.loss);
  }

  // The graph, and in `notes` (where given) what --batch could not rewrite;
  // an error says it too where it explains the error (BatchRewrite).
  absl::StatusOr<Graph> Run(std::vector<std::string>* notes) {
    absl::StatusOr<Graph> graph = Import();
    if (!graph.ok() && IsOnnxOptionError(graph.status())) return graph;  // (not the model's)
    if (graph.ok() && notes != nullptr) AddNotes(*notes);
    // A handler's note may explain a later error (a pool's extra window, a
    // Linear that then gets too many features).
    if (!graph.ok() && !cx_.notes().empty()) {
      graph = absl::Status(graph.status().code(),
                           absl::StrCat(graph.status().message(), "; note: ",
                                        absl::StrJoin(cx_.notes(), "; ")));
    }
    if (!batch_.has_value()) return graph;
    return batch_->Explain(std::move(graph), in_nodes_,
                           [this] { return ImportsAtTheExportedBatch(); }, notes);
  }

 private:
  absl::StatusOr<Graph> Import() {
    RETURN_IF_ERROR(CheckOpset());
    RETURN_IF_ERROR(CheckOperatorsKnown());
    RETURN_IF_ERROR(cx_.ReadInitializers(graph_));
    RETURN_IF_ERROR(cx_.FreezeInitializers(options_.frozen));
    RETURN_IF_ERROR(CheckAssignedOnce());
    for (const onnx::ValueInfoProto& v : graph_.input()) cx_.Reserve(v.name());
    for (const onnx::ValueInfoProto& v : graph_.output()) cx_.Reserve(v.name());
    cx_.IndexReaders(graph_);
    RETURN_IF_ERROR(AddGraphInputs());
    in_nodes_ = true;
    for (const onnx::NodeProto& node : graph_.node()) {
      RETURN_IF_ERROR(batch_->NoteFailed(node, ImportNode(node)));
      RETURN_IF_ERROR(cx_.nb().status());
      batch_->NoteImported(node);
    }
    in_nodes_ = false;
    // ONNX's own shape inference runs only now, on nodes whose attributes
    // pebble has checked: it trusts them (a stride of 0 divides by zero in
    // libonnx's convolution inference, found by fuzzing).
    ReadDeclaredShapes();
    for (const onnx::NodeProto& node : graph_.node()) {
      RETURN_IF_ERROR(CheckDeclaredShapes(node));
    }
    if (graph_.output_size() == 0) {
      return absl::InvalidArgumentError("the ONNX graph has no outputs");
    }
    for (const onnx::ValueInfoProto& out : graph_.output()) {
      const Value* v = cx_.Find(out.name());
      if (v == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("ONNX graph output ", Quote(out.name()), " is not computed by any node"));
      }
      RETURN_IF_ERROR(KeepOutputName(*v, out.name()));
      cx_.nb().MarkOutput(*v);
    }
    RETURN_IF_ERROR(CheckLogProbabilities());
    ASSIGN_OR_RETURN(Graph forward, cx_.nb().Build());
    RETURN_IF_ERROR(CheckSomethingTrains(forward));
    return AddLossAndDifferentiate(forward, options_.loss, options_.cost_model);
  }

  // ONNX assigns each value once (static single assignment): a graph
  // input, an initializer (old exporters list one as a graph input too,
  // which then declares its type) or a node's output. A second assignment
  // would import as whichever the walk met last: a node output named like
  // a weight dropped that weight from the step, and a Constant named like a
  // stored shape replaced it. So it is refused, naming both.
  absl::Status CheckAssignedOnce() const {
    absl::flat_hash_map<std::string, std::string> assigned;  // value -> by what
    auto assign = [&](const std::string& name, std::string by) -> absl::Status {
      if (name.empty()) return absl::OkStatus();  // (an optional output left out)
      const auto [it, first] = assigned.try_emplace(name, by);
      if (first) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          "ONNX value ", Quote(name), " is assigned twice, by ", it->second, " and by ", by,
          " (ONNX assigns each value once)"));
    };
    for (const onnx::TensorProto& t : graph_.initializer()) {
      RETURN_IF_ERROR(assign(t.name(), "an initializer"));
    }
    for (const onnx::ValueInfoProto& in : graph_.input()) {
      if (in.name().empty()) return absl::InvalidArgumentError("a graph input has no name");
      if (cx_.IsInitializer(in.name())) {
        RETURN_IF_ERROR(CheckInitializerAsInput(in));
        continue;
      }
      RETURN_IF_ERROR(assign(in.name(), "a graph input"));
    }
    for (const onnx::NodeProto& node : graph_.node()) {
      for (int i = 0; i < node.output_size(); ++i) {
        RETURN_IF_ERROR(assign(node.output(i), absl::StrCat("output ", i, " of ", NodeLabel(node))));
      }
    }
    return absl::OkStatus();
  }

  // An initializer that is a graph input too must be declared there with
  // its own element type and shape (the weights are what the graph uses).
  absl::Status CheckInitializerAsInput(const onnx::ValueInfoProto& in) const {
    const onnx::TensorProto* t = cx_.ConstTensor(in.name());
    if (t == nullptr || !in.type().has_tensor_type()) return absl::OkStatus();
    const onnx::TypeProto::Tensor& tt = in.type().tensor_type();
    const std::string where =
        absl::StrCat("initializer ", Quote(in.name()), " is also a graph input, declared ");
    if (tt.elem_type() != onnx::TensorProto::UNDEFINED && tt.elem_type() != t->data_type()) {
      auto type_name = [](int type) {
        return onnx::TensorProto::DataType_IsValid(type)
                   ? onnx::TensorProto::DataType_Name(
                         static_cast<onnx::TensorProto::DataType>(type))
                   : absl::StrCat(type);
      };
      return absl::InvalidArgumentError(absl::StrCat(where, "of type ", type_name(tt.elem_type()),
                                                     ", but holds ", type_name(t->data_type())));
    }
    if (!tt.has_shape()) return absl::OkStatus();
    std::vector<int64_t> stored(t->dims().begin(), t->dims().end());
    bool agrees = tt.shape().dim_size() == static_cast<int>(stored.size());
    std::vector<std::string> declared;
    for (int d = 0; d < tt.shape().dim_size(); ++d) {
      const auto& dim = tt.shape().dim(d);
      declared.push_back(dim.has_dim_value() ? absl::StrCat(dim.dim_value()) : std::string("?"));
      agrees = agrees && (!dim.has_dim_value() || dim.dim_value() == stored[d]);
    }
    if (agrees) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(where, "of shape (", absl::StrJoin(declared, ","),
                                                   "), but holds (", absl::StrJoin(stored, ","),
                                                   ")"));
  }

  // A graph output keeps its name (docs/import.md, "Names") where its last
  // node imports as no node of its own (an Identity, a Dropout of ratio 0,
  // a Slice of everything): the node that computes its value takes it,
  // unless that is a graph input, a weight or another graph output.
  absl::Status KeepOutputName(Value v, const std::string& name) {
    NetBuilder& nb = cx_.nb();
    if (nb.id(v) == name || nb.role(v) != Role::kForward) return absl::OkStatus();
    for (const onnx::ValueInfoProto& out : graph_.output()) {
      if (out.name() == nb.id(v)) return absl::OkStatus();
    }
    return nb.Rename(v, name);
  }

  // What a user should know of the graph imported: the handlers' notes, a
  // last LogSoftmax taken into the loss, PyTorch 1.13's circular padding.
  void AddNotes(std::vector<std::string>& notes) const {
    notes.insert(notes.end(), cx_.notes().begin(), cx_.notes().end());
    if (cx_.loss_takes_log_softmax().has_value() && !options_.log_probabilities) {
      notes.push_back(absl::StrCat(
          "the model's last node, ", *cx_.loss_takes_log_softmax(),
          ", is taken into the cross-entropy loss: the cross-entropy of log-probabilities is "
          "that of the logits, as nn.NLLLoss of log_softmax(x) is nn.CrossEntropyLoss of x "
          "(docs/import.md)"));
    }
    const std::vector<std::string> circular = OffByOneCircularPads(graph_, cx_);
    if (!circular.empty()) {
      notes.push_back(absl::StrCat(
          absl::StrJoin(circular, ", "), circular.size() == 1 ? " looks" : " look",
          " like PyTorch 1.13's export of a circular padding (padding_mode=\"circular\"), "
          "whose first part reads the wrong rows (pytorch/pytorch#86690): the graph computes "
          "what the file says, which is not the model's step; export with PyTorch 2.0 or "
          "later, or train the module with pebble.torch (docs/import.md)"));
    }
  }

  // `--loss nll` takes log-probabilities: the model must end in the
  // LogSoftmax that the loss takes in.
  absl::Status CheckLogProbabilities() const {
    if (!options_.log_probabilities || cx_.loss_takes_log_softmax().has_value()) {
      return absl::OkStatus();
    }
    if (options_.loss != LossKind::kCrossEntropy) {
      return absl::InvalidArgumentError(
          "log-probabilities are read by the cross-entropy loss only");
    }
    const onnx::NodeProto* producer =
        graph_.output_size() > 0 ? cx_.Producer(graph_.output(0).name()) : nullptr;
    const std::string computed_by = producer ? NodeLabel(*producer) : "a graph input";
    const std::string output =
        graph_.output_size() > 0 ? Quote(graph_.output(0).name()) : std::string("(none)");
    if (producer != nullptr && producer->op_type() == "LogSoftmax" &&
        cx_.log_softmax_outside_loss().has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--loss nll takes log-probabilities over the classes (dim 1), but the model's output ",
          output, " is computed by ", computed_by, ", which the loss cannot take in: ",
          *cx_.log_softmax_outside_loss()));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--loss nll takes log-probabilities, so the model must end in a LogSoftmax over the "
        "classes (dim 1), but its output ", output, " is computed by ", computed_by,
        ": for a model that returns logits, use --loss cross-entropy"));
  }

  // A training graph needs a parameter: a model exported with
  // export_params=False holds its weights as graph inputs, which would
  // import as a step that trains nothing (its every weight an input).
  absl::Status CheckSomethingTrains(const Graph& forward) const {
    if (options_.loss == LossKind::kNone || forward.has_parameters()) return absl::OkStatus();
    if (!options_.frozen.empty()) {
      return absl::InvalidArgumentError(
          "the model has no parameters left to train: every floating-point initializer that a "
          "node reads is frozen");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the ONNX model has no parameters (no float initializers that a node reads), so a "
        "training graph would train nothing",
        graph_.input_size() > 1
            ? absl::StrCat(": its ", graph_.input_size(), " graph inputs hold them instead, as "
                           "torch.onnx.export(..., export_params=False) writes; export with "
                           "export_params=True (the default)")
            : "; import it with --loss none for its forward graph"));
  }

  absl::Status CheckOpset() {
    bool found = false;
    for (const onnx::OperatorSetIdProto& op_set : model_.opset_import()) {
      if (op_set.domain().empty() || op_set.domain() == "ai.onnx") {
        if (found && op_set.version() != cx_.opset()) {
          return absl::InvalidArgumentError(
              absl::StrCat("the model imports the ONNX opset twice, as ", cx_.opset(), " and as ",
                           op_set.version(), ": which its nodes follow is not known"));
        }
        found = true;
        cx_.set_opset(op_set.version());
      }
    }
    if (!found) return absl::InvalidArgumentError("the model imports no ONNX opset");
    if (cx_.opset() < kMinOnnxOpset || cx_.opset() > kMaxOnnxOpset) {
      return absl::InvalidArgumentError(
          absl::StrCat("ONNX opset ", cx_.opset(), " is not supported (", kMinOnnxOpset, " to ",
                       kMaxOnnxOpset, "; torch.onnx.export(..., opset_version=13) writes one)"));
    }
    return absl::OkStatus();
  }

  // Shapes ONNX shape inference gives (or the model declares) by value
  // name, to check pebble's against. Without --batch every dim counts;
  // with it, dim 0 is skipped (the model's batch is rewritten).
  void ReadDeclaredShapes() {
    onnx::ModelProto inferred = model_;
    try {
      onnx::shape_inference::InferShapes(inferred);
    } catch (const std::exception& e) {
      // ONNX's inference refuses what it cannot type (shapes the model
      // declares in contradiction with its nodes, say): the shapes the model
      // itself declares are checked instead.
      inferred = model_;
    }
    auto read = [&](const onnx::ValueInfoProto& info) {
      if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) return;
      Shape shape;
      for (const auto& dim : info.type().tensor_type().shape().dim()) {
        shape.push_back(dim.has_dim_value() ? dim.dim_value() : -1);
      }
      declared_[info.name()] = std::move(shape);
    };
    for (const auto& info : inferred.graph().value_info()) read(info);
    for (const auto& info : inferred.graph().output()) read(info);
  }

  absl::Status AddGraphInputs() {
    batch_.emplace(graph_, options_.batch, cx_);
    for (const onnx::ValueInfoProto& in : graph_.input()) {
      if (cx_.IsInitializer(in.name())) continue;  // old exporters list them
      if (!in.type().has_tensor_type()) {
        return absl::InvalidArgumentError(
            absl::StrCat("graph input ", Quote(in.name()), " is not a tensor"));
      }
      const onnx::TypeProto::Tensor& tt = in.type().tensor_type();
      auto dtype = DTypeOfOnnx(tt.elem_type());
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("graph input ", Quote(in.name()), ": ", dtype.status().message()));
      }
      if (!tt.has_shape()) {
        return absl::InvalidArgumentError(
            absl::StrCat("graph input ", Quote(in.name()), " has no shape"));
      }
      Shape shape;
      for (int d = 0; d < tt.shape().dim_size(); ++d) {
        const auto& dim = tt.shape().dim(d);
        if (d == 0 && batch_->Rewrites(in)) {
          shape.push_back(*options_.batch);
        } else if (dim.has_dim_value() && dim.dim_value() > 0) {
          shape.push_back(dim.dim_value());
        } else if (dim.has_dim_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "graph input ", Quote(in.name()), ": dimension ", d, " is ", dim.dim_value(),
              "; pebble plans tensors whose every dimension is at least 1"));
        } else {
          const std::string what = dim.has_dim_param()
                                       ? absl::StrCat("symbolic (", Quote(dim.dim_param()), ")")
                                       : std::string("unknown");
          return absl::InvalidArgumentError(absl::StrCat(
              "graph input ", Quote(in.name()), ": dimension ", d, " is ", what,
              d == 0 ? "; give the batch size (pebble import --batch N; the library's batch)"
                     : "; only the batch dimension may be symbolic (export with fixed sizes)"));
        }
      }
      cx_.DefineInput(in.name(), cx_.nb().Input(in.name(), shape, *dtype));
      RETURN_IF_ERROR(cx_.nb().status());
    }
    return absl::OkStatus();
  }

  // Every node's operator is checked before any is imported, so that a model
  // is refused at the operator pebble lacks (an LSTM), not at whichever of
  // its inputs the walk reaches first (an LSTM's initial state is an Expand
  // of a constant, which was refused for the constant).
  absl::Status CheckOperatorsKnown() const {
    const onnx::NodeProto* first = nullptr;
    std::set<std::string> others;  // the other unsupported operators, sorted
    auto name = [](const onnx::NodeProto& node) {
      return node.domain().empty() ? node.op_type()
                                   : absl::StrCat(node.domain(), ".", node.op_type());
    };
    for (const onnx::NodeProto& node : graph_.node()) {
      if (IsKnownOperator(node)) continue;
      if (first == nullptr) {
        first = &node;
      } else if (name(node) != name(*first)) {
        others.insert(name(node));
      }
    }
    if (first == nullptr) return absl::OkStatus();
    std::string also;
    if (!others.empty()) {
      constexpr size_t kMostNamed = 5;
      std::vector<std::string> quoted;
      for (const std::string& op : others) {
        if (quoted.size() == kMostNamed) {
          quoted.push_back("...");
          break;
        }
        quoted.push_back(Quote(op));
      }
      also = absl::StrCat("; the model also uses ", absl::StrJoin(quoted, ", "));
    }
    const std::string reason = UnsupportedOperatorReason(*first);
    const absl::string_view torch_advice =
        absl::StrContains(reason, "pebble.torch")
            ? ""
            : "; pebble.torch trains a PyTorch module from its own operators, without ONNX "
              "(docs/torch.md)";
    return NodeError(*first, absl::StrCat(reason, also, torch_advice));
  }

  static bool IsKnownOperator(const onnx::NodeProto& node) {
    return (node.domain().empty() || node.domain() == "ai.onnx") &&
           Handlers().contains(node.op_type());
  }

  // Why `node`'s operator is refused, with what to do instead.
  static std::string UnsupportedOperatorReason(const onnx::NodeProto& node) {
    if (!node.domain().empty() && node.domain() != "ai.onnx") {
      return absl::StrCat("operator domain ", Quote(node.domain()), " is not supported");
    }
    const std::string& op = node.op_type();
    if (op == "Loop" || op == "If" || op == "Scan") {
      return "control flow is not imported, as every shape is fixed at import: "
             "torch.onnx.export writes an If where a size depends on a dim of dynamic_axes "
             "(x.view(-1, 1).squeeze(1) under a symbolic batch), and Loop and If for a "
             "scripted module; export the nn.Module traced, without dynamic_axes (pebble "
             "import --batch N rewrites the batch of such a file)";
    }
    // Operators read only where their operands are known at import.
    static const auto* const kFoldedOnly = new std::set<std::string>{
        "ConstantOfShape", "Mod", "Range", "ReduceProd", "Shape"};
    std::vector<std::string> computing, folded;
    for (const std::string& supported : SupportedOnnxOps()) {
      (kFoldedOnly->contains(supported) ? folded : computing).push_back(supported);
    }
    return absl::StrCat("operator not supported (supported: ", absl::StrJoin(computing, ", "),
                        "; of constants and shapes only: ", absl::StrJoin(folded, ", "),
                        "; docs/import.md)");
  }

  absl::Status ImportNode(const onnx::NodeProto& node) {
    if (!IsKnownOperator(node)) return NodeError(node, UnsupportedOperatorReason(node));
    return Handlers().at(node.op_type())(cx_, node);
  }

  absl::Status CheckDeclaredShapes(const onnx::NodeProto& node) {
    // Past a known disagreement (below), ONNX's shapes are of another model.
    const bool reads_unchecked = std::any_of(
        node.input().begin(), node.input().end(),
        [&](const std::string& name) { return unchecked_.contains(name); });
    for (const std::string& out : node.output()) {
      const Value* v = cx_.Find(out);
      auto declared = declared_.find(out);
      if (reads_unchecked) unchecked_.insert(out);
      if (reads_unchecked || v == nullptr || declared == declared_.end() ||
          !cx_.nb().has_type(*v)) {
        continue;
      }
      const Shape& ours = cx_.nb().type(*v).shape;
      const Shape& theirs = declared->second;
      bool same = ours.size() == theirs.size();
      for (size_t d = 0; same && d < ours.size(); ++d) {
        if (theirs[d] < 0 || (d == 0 && options_.batch.has_value())) continue;
        same = ours[d] == theirs[d];
      }
      if (same) continue;
      if (DropsALastWindowInThePadding(node, ours, theirs)) {
        unchecked_.insert(out);
        continue;
      }
      return NodeError(node,
                       absl::StrCat("pebble computes ", Quote(out), " as ", ShapeToString(ours),
                                    " but ONNX as ", ShapeToString(theirs)));
    }
    return absl::OkStatus();
  }

  // A MaxPool in ceil mode whose last window would start in the right
  // padding: PyTorch drops that window (nn.MaxPool2d's documentation), ONNX's
  // shape inference keeps it, one more element. pebble follows PyTorch, which
  // exported the model.
  bool DropsALastWindowInThePadding(const onnx::NodeProto& node, const Shape& ours,
                                    const Shape& theirs) const {
    if (node.op_type() != "MaxPool" || node.input_size() < 1) return false;
    const Value* in = cx_.Find(node.input(0));
    if (in == nullptr || !cx_.nb().has_type(*in)) return false;
    const Shape& x = cx_.nb().type(*in).shape;
    const Attrs attrs(node);
    const auto ceil_mode = attrs.Int("ceil_mode", 0);
    const auto strides = attrs.Ints("strides", {});
    const auto pads = attrs.Ints("pads", {});
    if (!ceil_mode.ok() || *ceil_mode == 0 || !strides.ok() || !pads.ok()) return false;
    if (ours.size() != x.size() || theirs.size() != x.size() || x.size() < 3) return false;
    const size_t spatial = x.size() - 2;
    for (size_t d = 0; d < x.size(); ++d) {
      if (theirs[d] < 0 || ours[d] == theirs[d] || (d == 0 && options_.batch.has_value())) {
        continue;
      }
      if (d < 2 || ours[d] != theirs[d] - 1) return false;
      const size_t k = d - 2;  // the spatial dim
      const int64_t stride = strides->size() == spatial ? (*strides)[k] : 1;
      const int64_t pad_begin = pads->size() == 2 * spatial ? (*pads)[k] : 0;
      if ((theirs[d] - 1) * stride < x[d] + pad_begin) return false;
    }
    return true;
  }

  // Whether the model imports without --batch, at the batch it was exported
  // with: then a failure with --batch comes from the rewrite.
  bool ImportsAtTheExportedBatch() const {
    OnnxImportOptions exported = options_;
    exported.batch.reset();
    Importer again(model_, cx_.nb().name(), exported);
    return again.Run(nullptr).ok();
  }

  const onnx::ModelProto& model_;
  const onnx::GraphProto& graph_;
  const OnnxImportOptions& options_;
  ImportContext cx_;
  // Shapes ONNX's inference gives, by value name (ReadDeclaredShapes).
  absl::flat_hash_map<std::string, Shape> declared_;
  // Values whose shape ONNX's inference gets otherwise than PyTorch, and the
  // values computed from them: not checked (CheckDeclaredShapes).
  absl::flat_hash_set<std::string> unchecked_;
  // --batch against the exported batch (made with the graph inputs).
  std::optional<BatchRewrite> batch_;
  // Whether Import is in its walk over the nodes (an error there may come
  // from a fixed batch that --batch rewrote).
  bool in_nodes_ = false;
};

}  // namespace
}  // namespace onnx_import

std::vector<std::string> SupportedOnnxOps() {
  std::vector<std::string> names;
  for (const auto& [name, handler] : onnx_import::Handlers()) names.push_back(name);
  return names;
}

absl::Status SetOnnxLoss(absl::string_view name, OnnxImportOptions& options) {
  options.log_probabilities = name == "nll";
  if (options.log_probabilities) {
    options.loss = LossKind::kCrossEntropy;
    return absl::OkStatus();
  }
  absl::StatusOr<LossKind> loss = ParseLossKind(name);
  if (!loss.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown loss '", name, "' (cross-entropy, nll, mse, bce or none)"));
  }
  options.loss = *loss;
  return absl::OkStatus();
}

absl::StatusOr<Graph> ImportOnnxModel(absl::string_view bytes, absl::string_view name,
                                      const OnnxImportOptions& options,
                                      std::vector<std::string>* notes) {
  if (options.batch.has_value() && (*options.batch < 1 || *options.batch > (int64_t{1} << 24))) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch size (--batch) must be 1 to ", int64_t{1} << 24, ", got ",
                     *options.batch));
  }
  onnx::ModelProto model;
  if (bytes.size() > static_cast<size_t>(kMaxOnnxFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("the model is ", bytes.size(),
                                                   " bytes, larger than ", kMaxOnnxFileBytes,
                                                   " bytes, the most protobuf reads"));
  }
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        "not an ONNX model: the file does not parse as an ONNX ModelProto (truncated?)");
  }
  if (!model.has_graph()) return absl::InvalidArgumentError("the ONNX model has no graph");
  onnx_import::Importer importer(model, name, options);
  std::vector<std::string> import_notes;
  ASSIGN_OR_RETURN(Graph graph, importer.Run(&import_notes));
  if (notes != nullptr) {
    const std::string folded = FoldedParametersNote(graph);
    if (!folded.empty()) notes->push_back(folded);
    notes->insert(notes->end(), import_notes.begin(), import_notes.end());
  }
  return graph;
}

bool IsOnnxOptionError(const absl::Status& status) {
  return status.GetPayload(onnx_import::kOptionErrorPayload).has_value();
}

std::string FoldedParametersNote(const Graph& graph) {
  constexpr absl::string_view kFoldedPrefix = "onnx::";
  constexpr size_t kMostNamed = 3;
  std::vector<std::string> folded;
  size_t count = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.role(v) != Role::kParameter || !absl::StartsWith(graph.id(v), kFoldedPrefix)) {
      continue;
    }
    if (++count <= kMostNamed) folded.push_back(Quote(graph.id(v)));
  }
  if (count == 0) return "";
  if (count > kMostNamed) folded.push_back("...");
  const bool one = count == 1;
  return absl::StrCat(
      count, one ? " parameter is" : " parameters are", " not the model's own (",
      absl::StrJoin(folded, ", "), "): torch.onnx.export computed ", one ? "it" : "them",
      " from the model's (constant folding; in eval mode, batch norms fused into the "
      "convolutions and dropout dropped: another step), so the graph trains ",
      one ? "it" : "them",
      " in place of the model's. Export with training=torch.onnx.TrainingMode.TRAINING and "
      "do_constant_folding=False (docs/import.md)");
}

absl::StatusOr<Graph> ImportOnnxFile(const std::string& path, const OnnxImportOptions& options,
                                     std::vector<std::string>* notes) {
  ASSIGN_OR_RETURN(std::string bytes, ReadBoundedFile(path, "ONNX model", kMaxOnnxFileBytes));
  const std::string stem = std::filesystem::path(path).stem().string();
  auto graph = ImportOnnxModel(bytes, stem.empty() ? "model" : stem, options, notes);
  if (!graph.ok() && !IsOnnxOptionError(graph.status())) {
    return absl::Status(graph.status().code(),
                        absl::StrCat(Quote(path), ": ", graph.status().message()));
  }
  return graph;
}

}  // namespace pebble
