// Fuzz target: the graph reader. The input is the text of a graph file
// (docs/graph-format.md) given to ParseGraphJson. A graph it accepts must
// write back (GraphToJsonText) to a document that reads back as the same
// graph, and must export to DOT. Where the text is JSON, the streaming
// reader (ParseGraphJson) and the document reader (GraphFromJson) agree.
// Its aliases (views) must be what the format promises: alias_of one of the
// node's inputs, never persistent, storage() the end of the chain and no
// alias itself.
#include <algorithm>
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
  int aliases = 0;
  for (NodeId v = 0; v < graph->num_nodes(); ++v) {
    const NodeId base = graph->alias_of(v);
    fuzz::Expect(again.alias_of(v) == base, "alias_of changed in a round trip");
    const NodeId root = graph->storage(v);
    fuzz::Expect(root >= 0 && root < graph->num_nodes() && !graph->is_alias(root),
                 "a storage root that is an alias");
    if (base == kNoNode) {
      fuzz::Expect(root == v, "a node of its own storage with another root");
      continue;
    }
    ++aliases;
    const absl::Span<const NodeId> inputs = graph->inputs(v);
    fuzz::Expect(std::find(inputs.begin(), inputs.end(), base) != inputs.end(),
                 "an alias of a node it does not read");
    fuzz::Expect(!graph->persistent(v) && graph->workspace(v) == 0,
                 "a persistent alias or one with workspace");
    fuzz::Expect(graph->storage(base) == root, "a chain with two roots");
  }
  fuzz::Expect(aliases == graph->num_aliases(), "num_aliases() miscounts");
  (void)GraphToDot(*graph);
  return 0;
}
