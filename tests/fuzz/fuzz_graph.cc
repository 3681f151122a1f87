// Fuzz target: the graph reader. The input is the text of a graph file
// (docs/graph-format.md) given to ParseGraphJson. A graph it accepts must
// write back (GraphToJsonText) to a document that reads back as the same
// graph, and must export to DOT. Where the text is JSON, the streaming
// reader (ParseGraphJson) and the document reader (GraphFromJson) agree.
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph/text_input.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pebble;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Graph> graph = ParseGraphJson(text);
  // The streaming reader says what the document reader says.
  if (absl::StatusOr<nlohmann::json> doc = ParseStrictJson(text); doc.ok()) {
    absl::StatusOr<Graph> whole = GraphFromJson(*doc);
    fuzz::Expect(whole.status() == graph.status(),
                 "the streaming and the document readers disagree: '" +
                     std::string(graph.status().message()) + "' and '" +
                     std::string(whole.status().message()) + "'");
    if (whole.ok()) {
      fuzz::Expect(GraphToJsonText(*whole) == GraphToJsonText(*graph),
                   "the streaming and the document readers read different graphs");
    }
  }
  if (!graph.ok()) {
    fuzz::Expect(!graph.status().message().empty(), "an error without a message");
    return 0;
  }
  const std::string written = GraphToJsonText(*graph);
  const Graph again = fuzz::MustOk(ParseGraphJson(written), "re-reading the written graph");
  fuzz::Expect(GraphToJsonText(again) == written, "the graph does not survive a round trip");
  fuzz::Expect(again.num_nodes() == graph->num_nodes(), "the node count changed");
  (void)GraphToDot(*graph);
  return 0;
}
