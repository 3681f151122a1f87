#include "graph/boost_adapter.h"

#include <algorithm>
#include <iterator>

#include "boost/graph/adjacency_list.hpp"
#include "boost/graph/biconnected_components.hpp"
#include "boost/graph/topological_sort.hpp"
#include "graph/status.h"

namespace pebble {

std::vector<NodeId> BoostTopologicalOrder(const Graph& graph) {
  using Directed =
      boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
  const int n = graph.num_nodes();
  Directed g(n);
  for (NodeId v = 0; v < n; ++v) {
    for (NodeId u : graph.unique_inputs(v)) boost::add_edge(u, v, g);
  }
  // topological_sort writes the reverse of a topological order. Its
  // depth-first search keeps an explicit stack, so long chains are safe; a
  // Graph is acyclic, so boost::not_a_dag cannot be thrown.
  std::vector<Directed::vertex_descriptor> reversed;
  reversed.reserve(n);
  boost::topological_sort(g, std::back_inserter(reversed));
  return std::vector<NodeId>(reversed.rbegin(), reversed.rend());
}

std::vector<NodeId> ArticulationPoints(const Graph& graph,
                                       const std::vector<bool>& mask) {
  const int n = graph.num_nodes();
  PEBBLE_CHECK(mask.empty() || static_cast<int>(mask.size()) == n,
               "mask must be empty or have one entry per node");
  auto in_mask = [&](NodeId v) { return mask.empty() || mask[v]; };

  // Vertices of the induced subgraph, numbered densely in NodeId order.
  std::vector<NodeId> members;
  std::vector<int> local(n, -1);
  for (NodeId v = 0; v < n; ++v) {
    if (!in_mask(v)) continue;
    local[v] = static_cast<int>(members.size());
    members.push_back(v);
  }
  using Undirected =
      boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS>;
  Undirected g(members.size());
  for (NodeId v : members) {
    // unique_inputs has no repeats and no self loops (the Graph is acyclic),
    // so every edge is added once.
    for (NodeId u : graph.unique_inputs(v)) {
      if (local[u] >= 0) boost::add_edge(local[u], local[v], g);
    }
  }
  std::vector<Undirected::vertex_descriptor> points;
  boost::articulation_points(g, std::back_inserter(points));
  std::vector<NodeId> result;
  result.reserve(points.size());
  for (auto p : points) result.push_back(members[p]);
  std::sort(result.begin(), result.end());
  return result;
}

}  // namespace pebble
