// Data parallelism in the model: the ranks' link (ParseNetwork) and the
// all_reduce step of each gradient (ReduceGradients, WithGradientReduction).
// Sharded graphs are in sharding.cc, the fsdp policy in remat_fsdp.cc.
#include "scheduler/collectives.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "scheduler/budget.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {

namespace {

struct NetworkPreset {
  absl::string_view name;
  NetworkLink link;
};
constexpr NetworkPreset kNetworkPresets[] = {
    {"ethernet-10g", {1.25e9, 25e-6}}, {"ethernet-100g", {12.5e9, 10e-6}},
    {"ib-hdr", {25e9, 5e-6}},          {"ib-ndr", {50e9, 5e-6}},
    {"nvlink4", {450e9, 3e-6}}};

}  // namespace

absl::StatusOr<NetworkLink> ParseNetwork(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  for (const NetworkPreset& p : kNetworkPresets) {
    if (lower == p.name) return p.link;
  }
  absl::StatusOr<double> rate = ParseByteRate(text);
  if (!rate.ok() || !(*rate > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid network ", Quote(text), ": expected bytes per second (12.5e9, 10GB) or a "
        "preset (ethernet-10g, ethernet-100g, ib-hdr, ib-ndr, nvlink4)"));
  }
  NetworkLink link;
  link.bandwidth_bytes_per_s = *rate;
  return link;
}

namespace {

// Note [Where a gradient is reduced]. DistributedDataParallel's rule: a
// gradient is all-reduced as soon as autograd has completed it, while the
// backward goes on. In a plan, "completed" is after the gradient's last
// compute, and "the backward is done with it" is after the last compute
// that reads its storage and is no optimizer update: autograd may hand one
// tensor to two consumers (the gradients of both operands of x + p), and
// the backward must read the rank's own value there. The all-reduce must
// also come before the first step that copies its storage to the host,
// frees the gradient, or updates from it: past those, the host copy, the
// freed memory or the update would miss the sum. Where the backward still
// reads the storage after such a step, no place is right: an error.
absl::StatusOr<size_t> ReducePosition(const Graph& graph, const Schedule& schedule,
                                      NodeId gradient) {
  const NodeId root = graph.storage(gradient);
  const size_t n = schedule.steps.size();
  size_t last_compute = n;
  for (size_t k = 0; k < n; ++k) {
    const Step& s = schedule.steps[k];
    if (s.action == Action::kCompute && s.node == gradient) last_compute = k;
  }
  if (last_compute == n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient ", Quote(graph.id(gradient)), " is never computed by the schedule"));
  }
  auto reads_storage = [&](NodeId w) {
    for (NodeId u : graph.unique_inputs(w)) {
      if (graph.storage(u) == root) return true;
    }
    return false;
  };
  size_t after = last_compute;
  bool closed = false;  // a copy, free or update of the storage came
  for (size_t k = last_compute + 1; k < n; ++k) {
    const Step& s = schedule.steps[k];
    const bool on_storage = graph.storage(s.node) == root;
    const bool closes =
        (s.action == Action::kOffload && on_storage) ||
        (s.action == Action::kFree && (s.node == gradient || s.node == root)) ||
        ((s.action == Action::kCompute || s.action == Action::kHostCompute) &&
         graph.role(s.node) == Role::kUpdate && reads_storage(s.node));
    if (closes) closed = true;
    const bool backward_read = s.action == Action::kCompute && !graph.in_place(s.node) &&
                               !graph.is_alias(s.node) && reads_storage(s.node);
    if (!backward_read) continue;
    if (closed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient ", Quote(graph.id(gradient)), " is read by ", Quote(graph.id(s.node)),
          " (step ", k, ") after the schedule copied, freed or updated from it: no point of "
          "the schedule can sum it over the ranks"));
    }
    after = k;
  }
  return after;
}

}  // namespace

absl::StatusOr<Schedule> ReduceGradients(const Graph& graph, const Schedule& schedule) {
  std::vector<std::pair<size_t, NodeId>> inserts;  // (after step, gradient)
  const std::vector<NodeId> gradients = GradientsToReduce(graph);
  // A gradient that is a view of another is summed with it.
  std::vector<uint8_t> is_gradient(graph.num_nodes(), 0);
  for (NodeId g : gradients) is_gradient[g] = 1;
  auto within_another = [&](NodeId g) {
    for (NodeId a = graph.alias_of(g); a != kNoNode; a = graph.alias_of(a)) {
      if (is_gradient[a]) return true;
    }
    return false;
  };
  for (NodeId g : gradients) {
    if (within_another(g)) continue;
    ASSIGN_OR_RETURN(size_t after, ReducePosition(graph, schedule, g));
    inserts.emplace_back(after, g);
  }
  std::stable_sort(inserts.begin(), inserts.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  Schedule out;
  out.steps.reserve(schedule.steps.size() + inserts.size());
  size_t next = 0;
  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    out.steps.push_back(schedule.steps[k]);
    for (; next < inserts.size() && inserts[next].first == k; ++next) {
      out.steps.push_back({Action::kAllReduce, inserts[next].second});
    }
  }
  return out;
}

namespace {

// What a sharded graph's collectives were timed for, as ShardGraph writes
// it in their attrs; nullopt where no collective says (a graph written by
// hand).
struct ShardedFor {
  int ranks = 0;
  NetworkLink link;
};

std::optional<ShardedFor> ShardedRanks(const Graph& graph) {
  for (NodeId v = 0; v < graph.num_nodes() && graph.has_collectives(); ++v) {
    if (!graph.collective(v)) continue;
    const nlohmann::json& a = graph.attrs(v);
    if (a.is_object() && a.contains("ranks") && a["ranks"].is_number_integer() &&
        a.contains("network_bandwidth_bytes_per_s") && a.contains("network_latency_s") &&
        a["network_bandwidth_bytes_per_s"].is_number() && a["network_latency_s"].is_number()) {
      return ShardedFor{a["ranks"].get<int>(),
                        {a["network_bandwidth_bytes_per_s"].get<double>(),
                         a["network_latency_s"].get<double>()}};
    }
  }
  return std::nullopt;
}

class GradientReductionPlanner : public Planner {
 public:
  explicit GradientReductionPlanner(std::unique_ptr<Planner> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const std::optional<ShardedFor> sharded = ShardedRanks(graph);
    // ranks 1: a nested policy's call, planning for one rank what this
    // wrapper completes (below).
    if (sharded.has_value() && options.ranks > 1 && sharded->ranks != options.ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the graph is sharded for ", sharded->ranks, " ranks (its collectives are timed for "
          "them): plan it with ", sharded->ranks, " ranks, not ", options.ranks));
    }
    if (options.ranks <= 1) return inner_->Plan(graph, options);
    // One rank's plan: a policy that plans with others (hybrid, checkmate's
    // warm starts) makes them through MakePlanner, wrapped too, and the
    // all-reduces are added once, here.
    PlannerOptions one_rank = options;
    one_rank.ranks = 1;
    ASSIGN_OR_RETURN(PlanResult planned, inner_->Plan(graph, one_rank));
    ASSIGN_OR_RETURN(Schedule schedule, ReduceGradients(graph, planned.schedule));
    ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph, std::move(schedule), options));
    // The all-reduces move no memory: the inner plan's verdict and notes
    // stand, its figures are replaced by those with the network's time.
    result.message = std::move(planned.message);
    result.details = std::move(planned.details);
    const PlanReport& r = result.report;
    // A sharded graph's collectives were timed on the link it records.
    const NetworkLink& link = sharded.has_value() ? sharded->link : options.network;
    result.details["collectives"] = {
        {"ranks", options.ranks},
        {"count", r.collectives},
        {"all_reduce", CountSteps(result.schedule, Action::kAllReduce)},
        {"bytes", r.collective_bytes},
        {"network_busy", r.network_busy},
        {"network_bandwidth_bytes_per_s", link.bandwidth_bytes_per_s},
        {"network_latency_s", link.latency_s}};
    return result;
  }

 private:
  std::unique_ptr<Planner> inner_;
};

}  // namespace

std::unique_ptr<Planner> WithGradientReduction(std::unique_ptr<Planner> inner) {
  return std::make_unique<GradientReductionPlanner>(std::move(inner));
}

}  // namespace pebble
