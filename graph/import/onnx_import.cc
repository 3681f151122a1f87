// ONNX import (see onnx_import.h and docs/import.md): the driver. It checks
// the model, reads its initializers and inputs, hands each node to its
// operator's handler (onnx_ops.h) and checks the shapes against ONNX's own
// inference; the handlers build the graph through an ImportContext.
#include "graph/import/onnx_import.h"

#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
    return table;
  }();
  return *handlers;
}

class Importer {
 public:
  Importer(const onnx::ModelProto& model, absl::string_view name, const OnnxImportOptions& options)
      : model_(model),
        graph_(model.graph()),
        options_(options),
        cx_(std::string(name), options.cost_model) {}

  absl::StatusOr<Graph> Run() {
    RETURN_IF_ERROR(CheckOpset());
    RETURN_IF_ERROR(cx_.ReadInitializers(graph_));
    for (const onnx::ValueInfoProto& v : graph_.input()) cx_.Reserve(v.name());
    for (const onnx::ValueInfoProto& v : graph_.output()) cx_.Reserve(v.name());
    RETURN_IF_ERROR(AddGraphInputs());
    for (const onnx::NodeProto& node : graph_.node()) {
      RETURN_IF_ERROR(ImportNode(node));
      RETURN_IF_ERROR(cx_.nb().status());
    }
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
      cx_.nb().MarkOutput(*v);
    }
    ASSIGN_OR_RETURN(Graph forward, cx_.nb().Build());
    RETURN_IF_ERROR(CheckSomethingTrains(forward));
    return AddLossAndDifferentiate(forward, options_.loss, options_.cost_model);
  }

 private:
  // A training graph needs a parameter: a model exported with
  // export_params=False holds its weights as graph inputs, which would
  // import as a step that trains nothing (its every weight an input).
  absl::Status CheckSomethingTrains(const Graph& forward) const {
    if (options_.loss == LossKind::kNone) return absl::OkStatus();
    for (NodeId v = 0; v < forward.num_nodes(); ++v) {
      if (forward.role(v) == Role::kParameter) return absl::OkStatus();
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
        if (d == 0 && options_.batch.has_value()) {
          shape.push_back(*options_.batch);
        } else if (dim.has_dim_value() && dim.dim_value() > 0) {
          shape.push_back(dim.dim_value());
        } else {
          const std::string what = dim.has_dim_param()
                                       ? absl::StrCat("symbolic (", Quote(dim.dim_param()), ")")
                                       : std::string("unknown");
          return absl::InvalidArgumentError(absl::StrCat(
              "graph input ", Quote(in.name()), ": dimension ", d, " is ", what,
              d == 0 ? "; give the batch size with --batch N"
                     : "; only the batch dimension may be symbolic (export with fixed sizes)"));
        }
      }
      cx_.DefineInput(in.name(), cx_.nb().Input(in.name(), shape, *dtype));
      RETURN_IF_ERROR(cx_.nb().status());
    }
    return absl::OkStatus();
  }

  absl::Status ImportNode(const onnx::NodeProto& node) {
    if (!node.domain().empty() && node.domain() != "ai.onnx") {
      return NodeError(node,
                       absl::StrCat("operator domain ", Quote(node.domain()), " is not supported"));
    }
    const auto& handlers = Handlers();
    auto it = handlers.find(node.op_type());
    if (it == handlers.end()) {
      return NodeError(node,
                       absl::StrCat("operator not supported (supported: ",
                                    absl::StrJoin(SupportedOnnxOps(), ", "), "; docs/import.md)"));
    }
    return it->second(cx_, node);
  }

  absl::Status CheckDeclaredShapes(const onnx::NodeProto& node) {
    for (const std::string& out : node.output()) {
      const Value* v = cx_.Find(out);
      auto declared = declared_.find(out);
      if (v == nullptr || declared == declared_.end() || !cx_.nb().has_type(*v)) continue;
      const Shape& ours = cx_.nb().type(*v).shape;
      const Shape& theirs = declared->second;
      bool same = ours.size() == theirs.size();
      for (size_t d = 0; same && d < ours.size(); ++d) {
        if (theirs[d] < 0 || (d == 0 && options_.batch.has_value())) continue;
        same = ours[d] == theirs[d];
      }
      if (!same) {
        return NodeError(node,
                         absl::StrCat("pebble computes ", Quote(out), " as ", ShapeToString(ours),
                                      " but ONNX as ", ShapeToString(theirs)));
      }
    }
    return absl::OkStatus();
  }

  const onnx::ModelProto& model_;
  const onnx::GraphProto& graph_;
  const OnnxImportOptions& options_;
  ImportContext cx_;
  // Shapes ONNX's inference gives, by value name (ReadDeclaredShapes).
  absl::flat_hash_map<std::string, Shape> declared_;
};

}  // namespace
}  // namespace onnx_import

std::vector<std::string> SupportedOnnxOps() {
  std::vector<std::string> names;
  for (const auto& [name, handler] : onnx_import::Handlers()) names.push_back(name);
  return names;
}

absl::StatusOr<Graph> ImportOnnxModel(absl::string_view bytes, absl::string_view name,
                                      const OnnxImportOptions& options) {
  if (options.batch.has_value() && (*options.batch < 1 || *options.batch > (int64_t{1} << 24))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch must be 1 to ", int64_t{1} << 24, ", got ", *options.batch));
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
  return importer.Run();
}

absl::StatusOr<Graph> ImportOnnxFile(const std::string& path, const OnnxImportOptions& options) {
  ASSIGN_OR_RETURN(std::string bytes, ReadBoundedFile(path, "ONNX model", kMaxOnnxFileBytes));
  const std::string stem = std::filesystem::path(path).stem().string();
  auto graph = ImportOnnxModel(bytes, stem.empty() ? "model" : stem, options);
  if (!graph.ok()) {
    return absl::Status(graph.status().code(),
                        absl::StrCat(Quote(path), ": ", graph.status().message()));
  }
  return graph;
}

}  // namespace pebble
