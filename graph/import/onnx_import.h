// ONNX import: a model as torch.onnx.export writes it in training mode
// becomes a pebble forward graph, and with a loss, a training graph
// (docs/import.md).
//
// Names. Initializers are persistent nodes named by their ONNX names, which
// torch.onnx.export takes from state_dict(): trainable tensors are
// parameters ("conv1.weight"), batch-norm running statistics are buffers
// ("bn1.running_mean", with "bn1.num_batches_tracked" added as PyTorch keeps
// it). Graph inputs keep their names. Computed nodes are named by their ONNX
// output value. The loss adds the input "target" and the node "loss"; the
// gradients are "grad:<parameter>" (autodiff.h).
//
// Shapes come from pebble's operator table applied in graph order; where
// ONNX shape inference knows a value's shape, the two must agree (a
// different shape means the operator was not honoured, so it is an error).
// Costs are the table's FLOPs over CostModel's throughput.
//
// Anything the importer cannot honour exactly (an operator, an attribute
// value, a symbolic dimension without --batch) is an InvalidArgument error
// naming the ONNX node, its op and the attribute: never a silently
// different graph.
#ifndef PEBBLE_GRAPH_IMPORT_ONNX_IMPORT_H_
#define PEBBLE_GRAPH_IMPORT_ONNX_IMPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/net_builder.h"

namespace pebble {

struct OnnxImportOptions {
  LossKind loss = LossKind::kCrossEntropy;
  // With the cross-entropy loss: the model's output is log-probabilities,
  // as nn.NLLLoss takes them (`--loss nll`), so its last node must be a
  // LogSoftmax over the classes, which the loss takes in (an error
  // otherwise). Without it such a LogSoftmax is taken in all the same.
  bool log_probabilities = false;
  // Rewrites dimension 0 of every graph input (a symbolic batch needs it).
  std::optional<int64_t> batch;
  // Initializers that are not trained, by id or shell glob (fnmatch(3):
  // *, ? and [...]; "*" crosses dots): they import as buffers, with no
  // gradient and no update. torch.onnx.export writes a module's buffers
  // (register_buffer: a normalization's mean and std) and its frozen
  // parameters (requires_grad=False) as initializers like the trained
  // ones, so only the user can say which they are; batch-norm running
  // statistics are known buffers without it. A pattern may name an
  // initializer of another type (a boolean mask buffer), a constant that
  // no step trains; one that matches no initializer is an error.
  std::vector<std::string> frozen;
  CostModel cost_model;
};

// Sets `options`' loss from its command-line name: "cross-entropy", "nll"
// (the cross-entropy loss on log-probabilities: log_probabilities), "mse",
// "bce" or "none"; InvalidArgument naming the choices.
absl::Status SetOnnxLoss(absl::string_view name, OnnxImportOptions& options);

// The opsets the importer reads (torch 1.13 exports 9 to 17; the ONNX
// operators' semantics used here are those of opsets 11 to 17).
inline constexpr int kMinOnnxOpset = 11;
inline constexpr int kMaxOnnxOpset = 17;
// Largest model file read: 2 GiB less one byte, protobuf's own limit for one
// message.
inline constexpr int64_t kMaxOnnxFileBytes = (int64_t{2} << 30) - 1;

// Imports the serialized ModelProto `bytes`; `name` names the graph. Where
// `notes` is given, what a user should know of a graph that imported is
// appended to it, a sentence each: FoldedParametersNote's, and a Reshape
// that keeps the exported batch under --batch (the nodes after it have the
// exported batch's shapes, though the same bytes).
absl::StatusOr<Graph> ImportOnnxModel(absl::string_view bytes, absl::string_view name,
                                      const OnnxImportOptions& options,
                                      std::vector<std::string>* notes = nullptr);
// Whether an error of ImportOnnxModel or ImportOnnxFile refuses an option
// for this model rather than the model (a frozen pattern that matches
// none of its initializers); ImportOnnxFile does not prefix such an error
// with the file's name.
bool IsOnnxOptionError(const absl::Status& status);
// Reads and imports the file `path` (the graph is named after its stem).
absl::StatusOr<Graph> ImportOnnxFile(const std::string& path, const OnnxImportOptions& options,
                                     std::vector<std::string>* notes = nullptr);

// A note for the user where an imported graph's parameters are not all the
// model's own: torch.onnx.export names what it computed from them
// "onnx::<Op>_<n>" (a weight transposed by constant folding; in eval mode,
// batch norms fused into the convolutions, dropout gone: another step).
// Empty where every parameter is named as the model's.
std::string FoldedParametersNote(const Graph& graph);

// The ONNX operators the importer maps, sorted.
std::vector<std::string> SupportedOnnxOps();

}  // namespace pebble

#endif  // PEBBLE_GRAPH_IMPORT_ONNX_IMPORT_H_
