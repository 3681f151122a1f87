// PyTorch FSDP's FULL_SHARD rule as policies of their own, the points pebble's plans of
// sharded graphs (sharding.cc) compare with: RegisterFsdpPlanner (policies.h).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/status.h"
#include "scheduler/planner.h"
#include "scheduler/policies.h"
#include "scheduler/schedule.h"

namespace pebble {

namespace {

// Which parameters FSDP gathers together: its units, one per wrapped module
// (each unit's parameters are one flat parameter, gathered and freed as one).
enum class Wrap {
  kParameter,  // each parameter a unit of its own: the finest wrapping
  kModule,     // the parameters of one module (the name up to its last '.')
  kBlock,      // the parameters of one element of a module list or sequence
               // (the name through its first numeric component: "layers.3"),
               // the others in the root unit, as FSDP wraps repeated blocks
};

// The unit of the parameter `name` under `wrap`; "" is the root unit (the
// parameters of no wrapped module), which kParameter never makes.
std::string UnitOf(absl::string_view name, Wrap wrap) {
  if (wrap == Wrap::kParameter) return std::string(name);
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  if (wrap == Wrap::kModule) {
    return absl::StrJoin(parts.begin(), parts.end() - 1, ".");
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!parts[i].empty() && std::all_of(parts[i].begin(), parts[i].end(), absl::ascii_isdigit)) {
      return absl::StrJoin(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(i) + 1, ".");
    }
  }
  return "";
}

// A unit's gathers and reduce-scatters, and the span of its readers in the
// order (positions; -1 or INT_MAX where it has none).
struct Unit {
  bool root = false;
  std::vector<NodeId> gathers, scatters;
  int first_forward = INT_MAX, last_forward = -1, first_backward = INT_MAX, last_backward = -1;
  int last_local_gradient = -1;
};

// The parameter of a sharded graph's collective ("gather:p", "grad:p"), or
// "" for another node.
std::string ParameterOf(const Graph& graph, NodeId v) {
  absl::string_view id = graph.id(v);
  const absl::string_view prefix = graph.op(v) == "all_gather" ? "gather:" : "grad:";
  return absl::ConsumePrefix(&id, prefix) ? std::string(id) : "";
}

// The position in `order` of its forward's last node (the loss, in a
// training graph): FSDP's forward is the order up to it, its backward the
// rest. By position, not by each reader's role: a capture labels a
// forward operator's extra outputs that only the backward reads (a layer
// norm's mean) backward nodes, though the forward computes them. The last
// forward node before the last backward node, collectives (a gather's role
// is forward, wherever it runs) and a planner's sinks (updates_last.h: they
// read gradients) left out.
int ForwardEnd(const Graph& graph, const std::vector<NodeId>& order) {
  int last_backward = -1;
  for (size_t i = 0; i < order.size(); ++i) {
    if (graph.role(order[i]) == Role::kBackward) last_backward = static_cast<int>(i);
  }
  int end = -1;
  for (size_t i = 0; i < order.size(); ++i) {
    const NodeId v = order[i];
    const int at = static_cast<int>(i);
    if (graph.role(v) == Role::kForward && !graph.collective(v) && graph.op(v) != "update_sink" &&
        (at < last_backward || last_backward < 0)) {
      end = at;
    }
  }
  return end;
}

// The units of the collectives in `order`, their readers' spans measured
// in `order`.
std::vector<Unit> Units(const Graph& graph, const std::vector<NodeId>& order, Wrap wrap) {
  std::vector<int> position(graph.num_nodes(), -1);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  const int forward_end = ForwardEnd(graph, order);
  std::map<std::string, Unit> by_name;
  for (NodeId v : order) {
    if (!graph.collective(v)) continue;
    // A collective of a parameter is in its parameter's unit; any other (a
    // graph written by hand) is a unit of its own.
    const std::string parameter = ParameterOf(graph, v);
    const std::string name = parameter.empty() ? absl::StrCat("\x01", graph.id(v))
                                               : UnitOf(parameter, wrap);
    Unit& unit = by_name[name];
    unit.root = wrap != Wrap::kParameter && name.empty();
    if (graph.op(v) == "all_gather") {
      unit.gathers.push_back(v);
      for (NodeId r : graph.readers(v)) {
        if (position[r] < 0) continue;
        if (position[r] > forward_end) {
          unit.first_backward = std::min(unit.first_backward, position[r]);
          unit.last_backward = std::max(unit.last_backward, position[r]);
        } else {
          unit.first_forward = std::min(unit.first_forward, position[r]);
          unit.last_forward = std::max(unit.last_forward, position[r]);
        }
      }
    } else if (graph.op(v) == "reduce_scatter") {
      unit.scatters.push_back(v);
      for (NodeId u : graph.unique_inputs(v)) {
        unit.last_local_gradient = std::max(unit.last_local_gradient, position[u]);
      }
    }
  }
  std::vector<Unit> units;
  for (auto& [name, unit] : by_name) units.push_back(std::move(unit));
  return units;
}

// `order` reordered as FSDP runs units of several parameters: a unit's
// gathers together before its first reader, its reduce-scatters together
// after its last local gradient; everything else keeps its place where the
// dependencies allow (a topological order, least key first).
std::vector<NodeId> UnitOrder(const Graph& graph, const std::vector<NodeId>& order,
                              const std::vector<Unit>& units) {
  const int n = graph.num_nodes();
  std::vector<double> key(n, 0);
  std::vector<uint8_t> in_order(n, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    key[order[i]] = static_cast<double>(i);
    in_order[order[i]] = 1;
  }
  for (const Unit& unit : units) {
    const int first = std::min(unit.first_forward, unit.first_backward);
    for (NodeId g : unit.gathers) {
      if (first != INT_MAX) key[g] = first - 0.5;
    }
    for (NodeId s : unit.scatters) key[s] = unit.last_local_gradient + 0.5;
  }
  std::vector<int> waiting(n, 0);
  using Entry = std::tuple<double, NodeId>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  for (NodeId v : order) {
    for (NodeId u : graph.unique_inputs(v)) waiting[v] += in_order[u];
    if (waiting[v] == 0) ready.emplace(key[v], v);
  }
  std::vector<NodeId> result;
  result.reserve(order.size());
  while (!ready.empty()) {
    const NodeId v = std::get<1>(ready.top());
    ready.pop();
    result.push_back(v);
    for (NodeId r : graph.readers(v)) {
      if (in_order[r] && --waiting[r] == 0) ready.emplace(key[r], r);
    }
  }
  return result;
}

// The FSDP policies: PyTorch FSDP's FULL_SHARD rule on a sharded graph
// (ShardGraph), its units wrapped by `wrap`. The graph's own order (a
// unit's gathers moved to its first reader, its reduce-scatters to its
// last local gradient: UnitOrder), every tensor freed at its last use, but
// a unit that the backward reads as well is freed after its last forward
// reader (reshard_after_forward), gathered again whole right before its
// first backward reader, and freed after its last backward reader (FSDP's
// post-backward reshard).
// The forward is the order up to its last forward node (ForwardEnd). The
// root unit is not resharded after the forward (FSDP keeps it for the
// backward, which starts with it). Gathers run on the network stream, so
// one issued after a compute may start before it ends: the prefetch FSDP
// makes. Each parameter is still a collective of its own (pebble's
// runtimes send them so), where FSDP sends one per unit. Every policy plans
// the alias-folded graph (planner.cc), so a view of a gathered parameter
// is computed again from the gather. A graph without gathers gets the
// baseline.
class FsdpPlanner final : public Planner {
 public:
  explicit FsdpPlanner(Wrap wrap) : wrap_(wrap) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    std::vector<NodeId> order = DefaultOrder(graph);
    std::vector<Unit> units = Units(graph, order, wrap_);
    if (wrap_ != Wrap::kParameter) {
      order = UnitOrder(graph, order, units);
      units = Units(graph, order, wrap_);
    }
    ASSIGN_OR_RETURN(Schedule base, FreeAtLastUse(graph, order));
    std::vector<int> position(graph.num_nodes(), -1);
    for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
    // Per order position: gathers to free after it, gathers to make before
    // it; and the gathers whose frees the units place (not FreeAtLastUse).
    std::vector<std::vector<NodeId>> free_after(order.size()), gather_before(order.size());
    std::vector<uint8_t> placed_free(graph.num_nodes(), 0);
    int resharded = 0;
    for (const Unit& unit : units) {
      const int last = std::max(unit.last_forward, unit.last_backward);
      if (last < 0) continue;
      const bool reshard = !unit.root && unit.last_forward >= 0 &&
                           unit.first_backward != INT_MAX &&
                           unit.last_forward < unit.first_backward;
      for (NodeId g : unit.gathers) {
        // An output (a graph written by hand) stays resident at the end.
        const bool output = graph.is_output(g);
        placed_free[g] = !output;
        if (!reshard) {
          if (!output) free_after[last].push_back(g);
          continue;
        }
        free_after[unit.last_forward].push_back(g);
        gather_before[unit.first_backward].push_back(g);  // the whole unit, as FSDP
        if (!output) free_after[unit.last_backward].push_back(g);
        ++resharded;
      }
    }
    Schedule schedule;
    for (const Step& step : base.steps) {
      if (step.action == Action::kFree && placed_free[step.node]) continue;
      const int at = step.action == Action::kCompute ? position[step.node] : -1;
      if (at >= 0) {
        for (NodeId g : gather_before[at]) schedule.steps.push_back({Action::kCompute, g});
      }
      schedule.steps.push_back(step);
      if (at >= 0) {
        for (NodeId g : free_after[at]) schedule.steps.push_back({Action::kFree, g});
      }
    }
    ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(schedule), options));
    result.details["resharded_parameters"] = resharded;
    result.details["fsdp_units"] = static_cast<int64_t>(units.size());
    if (!graph.has_collectives()) {
      result.message = "no sharded parameters (plan with --ranks N --shard full): the baseline";
    }
    return result;
  }

 private:
  Wrap wrap_;
};

}  // namespace

void RegisterFsdpPlanner(PlannerRegistry& registry) {
  const std::string rule =
      "PyTorch FSDP's FULL_SHARD rule on a sharded graph (--shard full): the graph's own order, "
      "each unit gathered before its forward and again before its backward, freed after each; ";
  for (const auto& [name, wrap, units] : std::vector<std::tuple<const char*, Wrap, const char*>>{
           {kFsdpPolicies[0], Wrap::kParameter, "each parameter a unit of its own"},
           {kFsdpPolicies[1], Wrap::kModule,
            "a unit per module (a Linear's weight and bias together)"},
           {kFsdpPolicies[2], Wrap::kBlock,
            "a unit per block of a module list or sequence (layers.3), the other parameters in "
            "the root unit, kept for the backward"}}) {
    registry.Register(PolicyInfo{
        .name = name,
        .description = rule + units,
        .kind = PlanKind::kMultiShot,
        .exact = false,
        .factory = [wrap = wrap] { return std::make_unique<FsdpPlanner>(wrap); },
    });
  }
}

}  // namespace pebble
