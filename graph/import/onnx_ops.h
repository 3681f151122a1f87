// Internal to the ONNX importer (graph/import/): the mapping of each ONNX
// operator to pebble's operator table, by family. Each family's file adds
// its handlers to the table that the importer dispatches on; a handler reads
// one ONNX node's inputs and attributes through the ImportContext, refuses
// what it cannot honour exactly (an error naming the node), and defines the
// node's outputs.
#ifndef PEBBLE_GRAPH_IMPORT_ONNX_OPS_H_
#define PEBBLE_GRAPH_IMPORT_ONNX_OPS_H_

#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/import/onnx_context.h"
#include "onnx/onnx_pb.h"

namespace pebble::onnx_import {

using OnnxHandler = std::function<absl::Status(ImportContext& cx, const onnx::NodeProto& node)>;
// By ONNX op type.
using OnnxHandlers = std::map<std::string, OnnxHandler>;

// Convolution, pooling, normalization, matrix products, softmax, dropout,
// resize and pad (onnx_layer_ops.cc).
void AddLayerOps(OnnxHandlers& handlers);
// Activations and arithmetic under NumPy broadcasting, Expand
// (onnx_elementwise_ops.cc).
void AddElementwiseOps(OnnxHandlers& handlers);
// Shapes and their integer arithmetic folded at import, views, slices,
// concatenation and constants (onnx_shape_ops.cc).
void AddShapeOps(OnnxHandlers& handlers);
// Comparisons, logic, Where, Cast, Sign, Max and Min: folded over
// constants, else pebble's compare, masked_fill, maximum and minimum
// (onnx_mask_ops.cc).
void AddMaskOps(OnnxHandlers& handlers);
// RNN, GRU and LSTM unrolled over the sequence (onnx_recurrent_ops.cc).
void AddRecurrentOps(OnnxHandlers& handlers);

// Shared between the families.

// Add, Sub, Mul, Div or Mod (fmod as ONNX's attribute) of two integer
// tensors known at import, folded.
absl::Status FoldArithmetic(ImportContext& cx, const onnx::NodeProto& node, bool fmod = false);

// `v` broadcast to `shape` by NumPy's rules: itself, or added to zeros of
// that shape (lowered as Add is, onnx_elementwise_ops.cc); ids
// "<node>.<suffix>...", the sum the node's own where `suffix` is empty.
// Expand's input, Where's computed sides.
absl::StatusOr<Value> ExpandTo(ImportContext& cx, const onnx::NodeProto& node, Value v,
                               const Shape& shape, absl::string_view suffix);

// Whether ONNX value `name` is a boolean tensor, which pebble holds as u8
// 0 and 1: written by a comparison, Not or a Cast to bool, through views
// and expansions of it (onnx_mask_ops.cc). A uint8 tensor of the model (an
// image) is not.
bool IsBoolean(const ImportContext& cx, const std::string& name);

}  // namespace pebble::onnx_import

#endif  // PEBBLE_GRAPH_IMPORT_ONNX_OPS_H_
