// `--batch N` against the batch an ONNX file was exported with (see
// onnx_batch.h and docs/import.md).
#include "graph/import/onnx_batch.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/import/onnx_util.h"
#include "graph/text_input.h"

namespace pebble::onnx_import {
namespace {

bool SymbolicBatch(const onnx::ValueInfoProto& in) {
  const auto& tt = in.type().tensor_type();
  return tt.has_shape() && tt.shape().dim_size() > 0 && !tt.shape().dim(0).has_dim_value();
}

}  // namespace

BatchRewrite::BatchRewrite(const onnx::GraphProto& graph, std::optional<int64_t> batch,
                           const ImportContext& cx)
    : graph_(graph), batch_(batch), cx_(cx) {
  some_symbolic_ = std::any_of(graph.input().begin(), graph.input().end(), [&](const auto& in) {
    return !cx.IsInitializer(in.name()) && SymbolicBatch(in);
  });
  ReadExported(graph);
}

bool BatchRewrite::Rewrites(const onnx::ValueInfoProto& in) const {
  if (!batch_.has_value() || cx_.IsInitializer(in.name())) return false;
  return !some_symbolic_ || SymbolicBatch(in);
}

void BatchRewrite::ReadExported(const onnx::GraphProto& graph) {
  if (!batch_.has_value()) return;
  std::optional<Exported> exported;
  for (const onnx::ValueInfoProto& in : graph.input()) {
    if (!Rewrites(in)) continue;
    const auto& tt = in.type().tensor_type();
    if (!tt.has_shape() || tt.shape().dim_size() == 0) return;
    const auto& dim = tt.shape().dim(0);
    Exported e;
    if (dim.has_dim_value() && dim.dim_value() > 0) {
      e.size = dim.dim_value();
    } else if (dim.has_dim_param() && !dim.dim_param().empty()) {
      e.symbol = dim.dim_param();
    } else {
      return;
    }
    if (exported.has_value() && (exported->size != e.size || exported->symbol != e.symbol)) {
      return;
    }
    exported = std::move(e);
  }
  if (exported.has_value() && exported->size != batch_) exported_ = std::move(exported);
}

// A model written with x.reshape(2, -1) at an exported batch of 2 keeps 2
// rows whatever --batch says: the -1 takes the rest, and the error comes
// later (a Linear's features, or the shape ONNX's inference gives).
void BatchRewrite::NoteImported(const onnx::NodeProto& node) {
  if (!exported_.has_value() || fixed_by_.has_value()) return;
  if (node.op_type() != "Reshape" || node.input_size() < 2 || node.output_size() < 1) return;
  const Value* in = cx_.Find(node.input(0));
  const Value* out = cx_.Find(node.output(0));
  if (in == nullptr || out == nullptr || !cx_.nb().has_type(*in) || !cx_.nb().has_type(*out)) {
    return;
  }
  const Shape& x = cx_.nb().type(*in).shape;
  const Shape& y = cx_.nb().type(*out).shape;
  if (x.empty() || y.empty() || x[0] != *batch_ || y[0] == *batch_) return;
  const bool fixed = exported_->size.has_value() ? y[0] == *exported_->size
                                                 : LiteralFirstDim(node.input(1)) == y[0];
  if (fixed) Remember(node, y[0]);
}

absl::Status BatchRewrite::NoteFailed(const onnx::NodeProto& node, absl::Status status) {
  if (status.ok() || fixed_by_.has_value() || !exported_.has_value() ||
      !exported_->size.has_value() || node.op_type() != "Reshape" || node.input_size() < 2) {
    return status;
  }
  const std::optional<Ints> shape = cx_.KnownInts(node.input(1));
  if (shape.has_value() && !shape->values.empty() && shape->values.front() == *exported_->size) {
    Remember(node, *exported_->size);
  }
  return status;
}

void BatchRewrite::Remember(const onnx::NodeProto& node, int64_t size) {
  fixed_by_ = node.name().empty() ? node.output(0) : node.name();
  fixed_to_ = size;
}

std::optional<int64_t> BatchRewrite::LiteralFirstDim(const std::string& name) const {
  const onnx::TensorProto* literal = nullptr;
  for (const onnx::TensorProto& t : graph_.initializer()) {
    if (t.name() == name) literal = &t;
  }
  for (const onnx::NodeProto& n : graph_.node()) {
    if (n.op_type() != "Constant" || n.output_size() != 1 || n.output(0) != name) continue;
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (a.name() == "value" && a.has_t()) literal = &a.t();
    }
  }
  if (literal == nullptr) return std::nullopt;
  absl::StatusOr<std::vector<int64_t>> values = IntValues(*literal);
  if (!values.ok() || values->empty()) return std::nullopt;
  return values->front();
}

absl::StatusOr<Graph> BatchRewrite::Explain(
    absl::StatusOr<Graph> graph, bool in_nodes,
    const std::function<bool()>& imports_at_exported_batch,
    std::vector<std::string>* notes) const {
  if (fixed_by_.has_value()) {
    if (!graph.ok()) {
      return absl::Status(graph.status().code(),
                          absl::StrCat(graph.status().message(), " (", ReshapeNote(), ")"));
    }
    if (notes != nullptr) {
      notes->push_back(absl::StrCat(
          ReshapeNote(), ". The graph imported: the nodes after it keep dimension 0 at ",
          fixed_to_, " (a reshape keeps the bytes, so the plan's figures hold, but the "
          "shapes are not those of batch ", *batch_, ")"));
    }
    return graph;
  }
  // A file of fixed batch: the exporter wrote every value the model
  // computed from x.shape[0] as a literal of that size.
  if (!exported_.has_value() || !exported_->size.has_value()) return graph;
  if (!graph.ok()) {
    if (!in_nodes || !imports_at_exported_batch()) return graph;
    return absl::Status(
        graph.status().code(),
        absl::StrCat(graph.status().message(), " (",
                     FixedSizeNote(absl::StrCat(", and the file imports at batch ",
                                                *exported_->size)),
                     ")"));
  }
  if (notes != nullptr) {
    notes->push_back(FixedSizeNote(
        ", and pebble cannot tell such a constant from others: the step may not be the one of "
        "this batch"));
  }
  return graph;
}

std::string BatchRewrite::FixedSizeNote(absl::string_view tail) const {
  return absl::StrCat("--batch ", *batch_, " rewrote dimension 0 from the exported ",
                      *exported_->size,
                      ", a size the file fixes: what the model computed from the batch size at "
                      "export (x.shape[0] in arithmetic, torch.arange(x.shape[0]), "
                      "nn.MultiheadAttention's batch x heads) is a constant there and keeps ",
                      *exported_->size, tail,
                      "; export with a symbolic batch (dynamic_axes={\"input\": {0: "
                      "\"batch\"}}) to import at other sizes");
}

std::string BatchRewrite::ReshapeNote() const {
  const std::string exported =
      exported_->size.has_value()
          ? absl::StrCat("rewrote dimension 0 from the exported ", *exported_->size)
          : absl::StrCat("gave the symbolic batch ", Quote(exported_->symbol), " its size");
  return absl::StrCat("--batch ", *batch_, " ", exported, ", but Reshape ", Quote(*fixed_by_),
                      " sets dimension 0 to ", fixed_to_,
                      " with a constant shape: write it with -1 for the batch "
                      "(x.reshape(-1, features)) or as x.flatten(1)",
                      exported_->size.has_value()
                          ? ", or export at the batch size you want and import without --batch"
                          : "");
}

}  // namespace pebble::onnx_import
