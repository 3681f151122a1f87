// Boost.Graph algorithms on pebble graphs. The Graph is copied into a
// boost::adjacency_list once per call (these are not hot paths).
#ifndef PEBBLE_GRAPH_BOOST_ADAPTER_H_
#define PEBBLE_GRAPH_BOOST_ADAPTER_H_

#include <vector>

#include "graph/graph.h"

namespace pebble {

// A topological order computed by boost::topological_sort (an order, not
// necessarily the Graph's own).
std::vector<NodeId> BoostTopologicalOrder(const Graph& graph);

// Articulation points of the undirected view of the subgraph induced by
// `mask` (all nodes when empty), ascending: removing one disconnects it.
// Checkpointing planners use those of the forward pass as segment borders.
std::vector<NodeId> ArticulationPoints(const Graph& graph,
                                       const std::vector<bool>& mask = {});

}  // namespace pebble

#endif  // PEBBLE_GRAPH_BOOST_ADAPTER_H_
