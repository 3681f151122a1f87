// Fuzz target: the ONNX importer. The input is the bytes of an .onnx file
// given to ImportOnnxModel, once as a forward graph and once with the
// cross-entropy loss. A graph it accepts must write back (GraphToJsonText)
// to a document that reads back as the same graph; an error must say what.
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph/import/onnx_import.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pebble;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (LossKind loss : {LossKind::kNone, LossKind::kCrossEntropy}) {
    OnnxImportOptions options;
    options.loss = loss;
    absl::StatusOr<Graph> graph = ImportOnnxModel(bytes, "fuzz", options);
    if (!graph.ok()) {
      fuzz::Expect(!graph.status().message().empty(), "an error without a message");
      fuzz::Expect(graph.status().message().find('\n') == absl::string_view::npos,
                   "an error of more than one line");
      continue;
    }
    const std::string written = GraphToJsonText(*graph);
    const Graph again = fuzz::MustOk(ParseGraphJson(written), "re-reading the imported graph");
    fuzz::Expect(GraphToJsonText(again) == written, "the graph does not survive a round trip");
  }
  return 0;
}
