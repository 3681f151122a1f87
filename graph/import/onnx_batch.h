// Internal to the ONNX importer (graph/import/): `--batch N` against the
// batch an ONNX file was exported with. It says which graph inputs take the
// new batch in dimension 0, and what the rewrite could not change, for the
// import's errors and notes (docs/import.md, `--batch N`): a Reshape whose
// constant shape keeps a batch in dimension 0 is found and named; in a
// file of fixed batch, the other constants computed from the batch cannot
// be told from any constant, so the rewrite itself is said.
#ifndef PEBBLE_GRAPH_IMPORT_ONNX_BATCH_H_
#define PEBBLE_GRAPH_IMPORT_ONNX_BATCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/import/onnx_context.h"
#include "onnx/onnx_pb.h"

namespace pebble::onnx_import {

class BatchRewrite {
 public:
  // `batch`: --batch, where given. The context's initializers are read
  // (old exporters list them among the graph inputs, which keep their size);
  // its values are read as the import defines them.
  BatchRewrite(const onnx::GraphProto& graph, std::optional<int64_t> batch,
               const ImportContext& cx);

  // Whether --batch rewrites dimension 0 of graph input `in`: where some
  // input's dimension 0 is symbolic (an export with dynamic_axes), that of
  // the inputs whose dimension 0 is symbolic alone (a mask of fixed size
  // beside the batch keeps its size); else that of every input.
  bool Rewrites(const onnx::ValueInfoProto& in) const;

  // After `node` imported: remembers a Reshape that set dimension 0 from
  // the new batch to a constant's size (the exported batch, or the size
  // the file's constant gives where the batch was symbolic).
  void NoteImported(const onnx::NodeProto& node);
  // After `node` failed with `status`, returned as it is: remembers a
  // Reshape whose constant shape keeps the exported batch in dimension 0
  // (x.view(2, 2, 58, 8, 8) of an input rewritten to batch 4).
  absl::Status NoteFailed(const onnx::NodeProto& node, absl::Status status);

  // The import's result with what the rewrite explains: an error gets the
  // Reshape named, or, where none was and the error came from a node
  // (`in_nodes`) of a file of fixed batch that imports at its exported
  // batch (`imports_at_exported_batch`, asked only then), the rewrite said;
  // a graph gets the same as a note in `notes` (where given).
  absl::StatusOr<Graph> Explain(absl::StatusOr<Graph> graph, bool in_nodes,
                                const std::function<bool()>& imports_at_exported_batch,
                                std::vector<std::string>* notes) const;

 private:
  // Dimension 0 as every rewritten graph input was exported with it, a size
  // other than --batch or one symbolic name (dynamic_axes), where all agree.
  struct Exported {
    std::optional<int64_t> size;
    std::string symbol;
  };
  void ReadExported(const onnx::GraphProto& graph);
  // The first number of `name` where the file holds it as a literal (a
  // Constant node's output or an initializer), not one computed from shapes.
  std::optional<int64_t> LiteralFirstDim(const std::string& name) const;
  void Remember(const onnx::NodeProto& node, int64_t size);
  std::string ReshapeNote() const;
  std::string FixedSizeNote(absl::string_view tail) const;

  const onnx::GraphProto& graph_;
  std::optional<int64_t> batch_;
  const ImportContext& cx_;
  bool some_symbolic_ = false;
  std::optional<Exported> exported_;
  // The first Reshape that set dimension 0 to a constant's size, and that size.
  std::optional<std::string> fixed_by_;
  int64_t fixed_to_ = 0;
};

}  // namespace pebble::onnx_import

#endif  // PEBBLE_GRAPH_IMPORT_ONNX_BATCH_H_
