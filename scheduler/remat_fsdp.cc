// PyTorch FSDP's FULL_SHARD rule as policies of their own, the points pebble's plans of
// sharded graphs (sharding.cc) compare with: RegisterFsdpPlanner (policies.h).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "scheduler/collective_buckets.h"
#include "scheduler/collectives.h"
#include "scheduler/planner.h"
#include "scheduler/policies.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "scheduler/updates_last.h"

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

// The parameter of a sharded graph's collective ("gather:p", "grad:p", or
// "unclipped_grad:p" where the step clips), or "" for another node.
std::string ParameterOf(const Graph& graph, NodeId v) {
  absl::string_view id = graph.id(v);
  if (graph.op(v) == "all_gather") {
    return absl::ConsumePrefix(&id, kGatherPrefix) ? std::string(id) : "";
  }
  if (graph.op(v) != "reduce_scatter") return "";
  return absl::ConsumePrefix(&id, kGradPrefix) || absl::ConsumePrefix(&id, kUnclippedGradPrefix)
             ? std::string(id)
             : "";
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
    if (graph.role(v) == Role::kForward && !graph.collective(v) && graph.op(v) != kUpdateSinkOp &&
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

// The buckets of `collectives` (a run of them, JoinUnits) by (unit, op,
// dtype), in the order they first come; a bucket of reduce-scatters closes
// before its local gradients' bytes would pass `scatter_cap`. A collective
// of no unit (-1) is a bucket of its own.
std::vector<std::vector<NodeId>> UnitBuckets(const Graph& graph,
                                             const std::vector<Step>& collectives,
                                             const std::vector<int>& unit_of,
                                             int64_t scatter_cap) {
  std::vector<std::vector<NodeId>> buckets;
  std::vector<int64_t> bucket_bytes;
  // (unit, op, dtype) -> its open bucket: one buffer holds one dtype, as
  // FSDP's flat parameter does (MessageDtype).
  std::map<std::tuple<int, std::string, std::string>, size_t> open;
  for (const Step& s : collectives) {
    const auto key =
        std::make_tuple(unit_of[s.node], graph.op(s.node), MessageDtype(graph, s.node));
    const int64_t bytes =
        graph.op(s.node) == "reduce_scatter" ? graph.bytes(graph.inputs(s.node)[0]) : 0;
    const auto [it, added] = open.try_emplace(key, buckets.size());
    if (added || std::get<0>(key) < 0 || bucket_bytes[it->second] > scatter_cap - bytes) {
      it->second = buckets.size();
      buckets.emplace_back();
      bucket_bytes.push_back(0);
    }
    buckets[it->second].push_back(s.node);
    bucket_bytes[it->second] += bytes;
  }
  return buckets;
}

// The steps of one run of collectives (JoinUnits), its buckets joined: the
// frees of nodes that the run gathers again first; then each bucket, a free
// that came after some of its members moved after its last (within a bucket
// nothing may come between); every other free and sink after the last
// collective that came before it.
void EmitRun(const Graph& graph, const std::vector<Step>& run,
             const std::vector<std::vector<NodeId>>& buckets, std::vector<Step>& out) {
  // Per collective: its place in the joined order, and that of its bucket's last.
  absl::flat_hash_map<NodeId, int> place, bucket_end;
  int next = 0;
  for (const std::vector<NodeId>& bucket : buckets) {
    for (NodeId v : bucket) place[v] = next++;
    for (NodeId v : bucket) bucket_end[v] = next - 1;
  }
  std::vector<std::vector<Step>> after(next);
  std::vector<Step> first;
  absl::flat_hash_set<NodeId> computed_later;
  for (const Step& s : run) {
    if (place.contains(s.node) && s.action == Action::kCompute) computed_later.insert(s.node);
  }
  int last = -1;  // the latest place of a collective seen so far in `run`
  for (const Step& s : run) {
    if (s.action == Action::kCompute && place.contains(s.node)) {
      computed_later.erase(s.node);
      last = std::max(last, bucket_end[s.node]);
    } else if (computed_later.contains(s.node) || last < 0) {
      first.push_back(s);
    } else {
      after[last].push_back(s);
    }
  }
  out.insert(out.end(), first.begin(), first.end());
  for (const std::vector<NodeId>& bucket : buckets) {
    std::optional<CollectiveLink> previous;
    for (size_t m = 0; m < bucket.size(); ++m) {
      const std::optional<CollectiveLink> link = CollectiveLinkOf(graph, bucket[m]);
      out.push_back({Action::kCompute, bucket[m], m > 0 && link.has_value() && link == previous});
      previous = link;
      out.insert(out.end(), after[place[bucket[m]]].begin(), after[place[bucket[m]]].end());
    }
  }
}

// `schedule` with each unit's collectives sent as one message, as FSDP
// sends its flat parameter: in each run of consecutive collective computes
// (frees and the planner's zero-byte sinks between them included), the
// gathers of one unit, and its reduce-scatters, are put side by side and
// joined (Step::joins_bucket), in the order the units first come (EmitRun
// places the rest). `unit_of`: per node, its unit's index, or -1. A run
// whose collectives read each other, or compute a node twice, is left as
// it is; a collective without the link attrs a bucket needs, or with
// another link than the one before it, does not join. A bucket of
// reduce-scatters holds at most `scatter_cap` bytes of local gradients
// (StagingCap), but one larger gradient alone.
Schedule JoinUnits(const Graph& graph, const Schedule& schedule,
                   const std::vector<int>& unit_of, int64_t scatter_cap) {
  auto is_collective = [&](const Step& s) {
    return s.action == Action::kCompute && graph.collective(s.node);
  };
  auto movable = [&](const Step& s) {
    return s.action == Action::kFree ||
           (s.action == Action::kCompute && graph.op(s.node) == kUpdateSinkOp);
  };
  const size_t n = schedule.steps.size();
  Schedule out;
  out.steps.reserve(n);
  for (size_t i = 0; i < n;) {
    if (!is_collective(schedule.steps[i])) {
      out.steps.push_back(schedule.steps[i++]);
      continue;
    }
    size_t end = i;  // one past the run's last collective
    for (size_t j = i; j < n && (is_collective(schedule.steps[j]) || movable(schedule.steps[j]));
         ++j) {
      if (is_collective(schedule.steps[j])) end = j + 1;
    }
    const std::vector<Step> run(schedule.steps.begin() + static_cast<std::ptrdiff_t>(i),
                                schedule.steps.begin() + static_cast<std::ptrdiff_t>(end));
    i = end;
    std::vector<Step> collectives;
    absl::flat_hash_set<NodeId> computed;
    bool joinable = true;
    for (const Step& s : run) {
      if (!is_collective(s)) continue;
      for (NodeId u : graph.unique_inputs(s.node)) joinable = joinable && !computed.contains(u);
      joinable = joinable && computed.insert(s.node).second;
      collectives.push_back(s);
    }
    if (!joinable) {
      out.steps.insert(out.steps.end(), run.begin(), run.end());
      continue;
    }
    EmitRun(graph, run, UnitBuckets(graph, collectives, unit_of, scatter_cap), out.steps);
  }
  return out;
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
// makes. A unit's gathers, and its reduce-scatters, are one message each
// (JoinUnits), as FSDP's flat parameter is. Every policy plans
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
    if (wrap_ != Wrap::kParameter) {
      std::vector<int> unit_of(graph.num_nodes(), -1);
      for (size_t u = 0; u < units.size(); ++u) {
        for (NodeId g : units[u].gathers) unit_of[g] = static_cast<int>(u);
        for (NodeId r : units[u].scatters) unit_of[r] = static_cast<int>(u);
      }
      schedule = JoinUnits(graph, schedule, unit_of, StagingCap(graph));
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
            "a unit per module (a Linear's weight and bias together), its gathers and its "
            "reduce-scatters one message each"},
           {kFsdpPolicies[2], Wrap::kBlock,
            "a unit per block of a module list or sequence (layers.3), the other parameters in "
            "the root unit, kept for the backward; a unit's gathers and its reduce-scatters one "
            "message each"}}) {
    registry.Register(PolicyInfo{
        .name = name,
        .description = rule + units,
        .kind = PlanKind::kMultiShot,
        .exact = false,
        .own_messages = true,
        .factory = [wrap = wrap] { return std::make_unique<FsdpPlanner>(wrap); },
    });
  }
}

}  // namespace pebble
