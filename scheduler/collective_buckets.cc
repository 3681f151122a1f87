// Note [Planned buckets of collectives]. On a sharded graph every gather
// and reduce-scatter is a message of its own unless a rule joins them
// (FSDP's units, remat_fsdp.cc), and each message pays the link's latency
// (r - 1) times: a decoder of 100 parameters sends about 300 messages a
// step, and its biases and norms cost more in latency than in bytes. One
// message for several costs one latency, but it starts when all its inputs
// are ready and ends for all its readers at once, and moving a step
// changes how long tensors live. So no rule fits every plan: the search
// below joins neighbouring messages of one op, one pair at a time in the
// schedule's order, and keeps a join where the simulator says the step is
// no slower (and, where no faster, no higher in peak) within the limit:
//  - gathers join the earlier message (prefetched with it): their outputs
//    live from there, and each member's next free moves to the last of
//    them, so that the message's storage goes at once (pebble.torch
//    gathers a message into one flat tensor, freed whole);
//  - reduce-scatters join the later message (they wait for its gradients):
//    their local gradients live until then, what the plan computes from
//    their shards between (an update, its offload) waits for the bucket,
//    and the message's local gradients fit the staging buffer the runtime
//    sends them through.
// Each message that may not join the open one opens the next. The search
// keeps the messages the policy made (FSDP's units) and may join them too.
#include "scheduler/collective_buckets.h"

#include <algorithm>
#include <climits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "graph/status.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble {

int64_t StagingCap(const Graph& graph) {
  int64_t cap = INT64_MAX;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.persistent(v) && graph.op(v) == "staging_buffer") cap = std::min(cap, graph.bytes(v));
  }
  return cap;
}

std::string MessageDtype(const Graph& graph, NodeId v) {
  for (int depth = 0; depth < 2; ++depth) {
    if (const std::optional<DType> dtype = graph.dtype(v)) return std::string(DTypeName(*dtype));
    const nlohmann::json& attrs = graph.attrs(v);
    if (attrs.is_object() && attrs.contains("dtype") && attrs["dtype"].is_string()) {
      const std::string name = attrs["dtype"].get<std::string>();
      const absl::StatusOr<DType> dtype = ParseDType(name);
      return dtype.ok() ? std::string(DTypeName(*dtype)) : name;
    }
    if (!graph.collective(v) || graph.inputs(v).empty()) break;
    v = graph.inputs(v)[0];
  }
  return "";
}

namespace {

constexpr absl::string_view kGatherOp = "all_gather";
constexpr absl::string_view kScatterOp = "reduce_scatter";
constexpr int kMaxJoinSimulations = 4000;

// One message: the steps first..last of a schedule, consecutive computes of
// collective nodes of one op, each after the first joining its bucket.
struct Message {
  size_t first = 0, last = 0;
};

std::vector<Message> MessagesOf(const Graph& graph, const Schedule& schedule,
                                absl::string_view op) {
  std::vector<Message> messages;
  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    const Step& s = schedule.steps[k];
    if (s.action != Action::kCompute || !graph.collective(s.node) || graph.op(s.node) != op) {
      continue;
    }
    if (s.joins_bucket && !messages.empty() && messages.back().last + 1 == k) {
      messages.back().last = k;
    } else {
      messages.push_back({k, k});
    }
  }
  return messages;
}

absl::flat_hash_set<NodeId> MembersOf(const Schedule& schedule, const Message& m) {
  absl::flat_hash_set<NodeId> members;
  for (size_t k = m.first; k <= m.last; ++k) members.insert(schedule.steps[k].node);
  return members;
}

absl::flat_hash_set<NodeId> InputsOf(const Graph& graph, const Schedule& schedule,
                                     const Message& m) {
  absl::flat_hash_set<NodeId> inputs;
  for (size_t k = m.first; k <= m.last; ++k) {
    for (NodeId u : graph.unique_inputs(schedule.steps[k].node)) inputs.insert(u);
  }
  return inputs;
}

// The storages of `nodes`: a step on any node of one (a view, an in-place
// write, a copy) may change what a collective reads.
absl::flat_hash_set<NodeId> StoragesOf(const Graph& graph,
                                       const absl::flat_hash_set<NodeId>& nodes) {
  absl::flat_hash_set<NodeId> storages;
  for (NodeId v : nodes) storages.insert(graph.storage(v));
  return storages;
}

// Whether the members of `a` and `b` may be one message: every one timed
// for one link, and of one dtype (a runtime sends one buffer: MessageDtype).
bool SameLinkAndDtype(const Graph& graph, const Schedule& schedule, const Message& a,
                      const Message& b) {
  const NodeId first = schedule.steps[a.first].node;
  const std::optional<CollectiveLink> link = CollectiveLinkOf(graph, first);
  if (!link.has_value()) return false;
  const std::string dtype = MessageDtype(graph, first);
  for (const Message& m : {a, b}) {
    for (size_t k = m.first; k <= m.last; ++k) {
      const NodeId v = schedule.steps[k].node;
      if (CollectiveLinkOf(graph, v) != link || MessageDtype(graph, v) != dtype) return false;
    }
  }
  return true;
}

// Whether the compute step `s` reads one of `nodes`.
bool Reads(const Graph& graph, const Step& s, const absl::flat_hash_set<NodeId>& nodes) {
  if (s.action != Action::kCompute && s.action != Action::kHostCompute) return false;
  const absl::Span<const NodeId> inputs = graph.unique_inputs(s.node);
  return std::any_of(inputs.begin(), inputs.end(), [&](NodeId u) { return nodes.contains(u); });
}

// `schedule` with the next free of each member of the message first..last
// moved to the latest of them, side by side; nullopt where a member has
// none (kept to the end: pebble.torch frees a bucket's tensor with its
// members' frees) or another step of it comes first, or where one's next
// step after its free touches it.
std::optional<Schedule> FreeTogether(const Schedule& schedule, size_t first, size_t last) {
  const size_t n = schedule.steps.size();
  std::vector<size_t> frees;
  for (size_t k = first; k <= last; ++k) {
    const NodeId v = schedule.steps[k].node;
    size_t next = last + 1;
    while (next < n && schedule.steps[next].node != v) ++next;
    if (next == n || schedule.steps[next].action != Action::kFree) return std::nullopt;
    frees.push_back(next);
  }
  const size_t at = *std::max_element(frees.begin(), frees.end());
  std::vector<uint8_t> moved(n, 0);
  for (size_t f : frees) {
    for (size_t k = f + 1; k < at && f != at; ++k) {
      if (schedule.steps[k].node == schedule.steps[f].node) return std::nullopt;
    }
    moved[f] = f != at;
  }
  Schedule out;
  out.steps.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    if (moved[k]) continue;
    if (k == at) {
      for (size_t f : frees) {
        if (moved[f]) out.steps.push_back(schedule.steps[f]);
      }
    }
    out.steps.push_back(schedule.steps[k]);
  }
  return out;
}

// The gathers of `b` moved up to join `a`, their frees and a's together
// (FreeTogether); nullopt where a step between touches b's members or
// their shards' storages, or the frees cannot go together.
std::optional<Schedule> JoinGathers(const Graph& graph, const Schedule& schedule,
                                    const Message& a, const Message& b) {
  const absl::flat_hash_set<NodeId> members = MembersOf(schedule, b);
  const absl::flat_hash_set<NodeId> shards = StoragesOf(graph, InputsOf(graph, schedule, b));
  for (size_t k = a.last + 1; k < b.first; ++k) {
    const Step& s = schedule.steps[k];
    if (members.contains(s.node) || shards.contains(graph.storage(s.node)) ||
        Reads(graph, s, members)) {
      return std::nullopt;
    }
  }
  Schedule joined;
  joined.steps.reserve(schedule.steps.size());
  const auto step = [&](size_t k) { return schedule.steps.begin() + static_cast<std::ptrdiff_t>(k); };
  joined.steps.insert(joined.steps.end(), step(0), step(a.last + 1));
  for (size_t k = b.first; k <= b.last; ++k) {
    joined.steps.push_back({Action::kCompute, schedule.steps[k].node, true});
  }
  joined.steps.insert(joined.steps.end(), step(a.last + 1), step(b.first));
  joined.steps.insert(joined.steps.end(), step(b.last + 1), schedule.steps.end());
  return FreeTogether(joined, a.first, a.last + (b.last - b.first + 1));
}

// The reduce-scatters of `a` moved down to join `b`. The steps between
// that follow from a's outputs (an update reading a shard, its offload,
// what reads the update: Note [Steps that wait for a joined message]) and
// the frees of a's local gradients' storages (the gradients, their bases,
// other views) move after the bucket, in their order; nullopt where a step
// between touches those storages otherwise, where b's members read what
// moves, or where the local gradients would pass `staging_cap` bytes.
std::optional<Schedule> JoinScatters(const Graph& graph, const Schedule& schedule,
                                     const Message& a, const Message& b, int64_t staging_cap) {
  const absl::flat_hash_set<NodeId> inputs = InputsOf(graph, schedule, a);
  const absl::flat_hash_set<NodeId> storages = StoragesOf(graph, inputs);
  int64_t gradient_bytes = 0;
  for (NodeId u : inputs) gradient_bytes += graph.bytes(u);
  for (NodeId u : InputsOf(graph, schedule, b)) gradient_bytes += graph.bytes(u);
  if (gradient_bytes > staging_cap) return std::nullopt;
  // Note [Steps that wait for a joined message]: a step between that reads
  // or touches a's outputs, or a value computed from them, must wait for
  // the bucket; so must a later step on a node such a step reads (its free,
  // an offload, a recomputation), or it would go before its reader.
  absl::flat_hash_set<NodeId> follows = MembersOf(schedule, a);
  absl::flat_hash_set<NodeId> read_after;
  std::vector<Step> between, after;
  for (size_t k = a.last + 1; k < b.first; ++k) {
    const Step& s = schedule.steps[k];
    if (follows.contains(s.node) || read_after.contains(s.node) || Reads(graph, s, follows)) {
      if (s.action == Action::kCompute || s.action == Action::kHostCompute) {
        follows.insert(s.node);
        for (NodeId u : graph.unique_inputs(s.node)) read_after.insert(u);
      }
      after.push_back(s);
    } else if (storages.contains(graph.storage(s.node))) {
      if (s.action != Action::kFree) return std::nullopt;
      after.push_back(s);
    } else {
      between.push_back(s);
    }
  }
  for (size_t k = b.first; k <= b.last; ++k) {
    if (Reads(graph, schedule.steps[k], follows)) return std::nullopt;
  }
  Schedule joined;
  joined.steps.reserve(schedule.steps.size());
  const auto step = [&](size_t k) { return schedule.steps.begin() + static_cast<std::ptrdiff_t>(k); };
  joined.steps.insert(joined.steps.end(), step(0), step(a.first));
  joined.steps.insert(joined.steps.end(), between.begin(), between.end());
  joined.steps.insert(joined.steps.end(), step(a.first), step(a.last + 1));
  joined.steps.push_back({Action::kCompute, schedule.steps[b.first].node, true});
  joined.steps.insert(joined.steps.end(), step(b.first + 1), step(b.last + 1));
  joined.steps.insert(joined.steps.end(), after.begin(), after.end());
  joined.steps.insert(joined.steps.end(), step(b.last + 1), schedule.steps.end());
  return joined;
}

class JoinSearch {
 public:
  JoinSearch(const Graph& graph, PlanResult planned, const PlannerOptions& options,
             int64_t max_simulated_steps)
      : graph_(graph), options_(options), staging_cap_(StagingCap(graph)),
        max_simulations_(static_cast<int>(std::clamp<int64_t>(
            max_simulated_steps / std::max<int64_t>(1, std::ssize(planned.schedule.steps)),
            12, kMaxJoinSimulations))),
        best_(std::move(planned)) {
    peak_limit_ = best_.feasible && options.budget_bytes != PlannerOptions::kMinBudget
                      ? std::max(options.budget_bytes, best_.report.peak_bytes)
                      : best_.report.peak_bytes;
  }

  absl::StatusOr<PlanResult> Run() {
    const int64_t messages_before = best_.report.collectives;
    // Half the simulations for the gathers, the rest for the reduce-scatters.
    for (const auto& [op, share] : {std::pair(kGatherOp, 2), std::pair(kScatterOp, 1)}) {
      const int limit = simulations_ + (max_simulations_ - simulations_) / share;
      size_t open = 0;  // the message the next one may join, by its index
      while (true) {
        const std::vector<Message> messages = MessagesOf(graph_, best_.schedule, op);
        if (open + 1 >= messages.size()) break;
        if (simulations_ >= limit) {
          cut_ = true;
          break;
        }
        const Message& a = messages[open];
        const Message& b = messages[open + 1];
        std::optional<Schedule> joined;
        if (SameLinkAndDtype(graph_, best_.schedule, a, b)) {
          joined = op == kGatherOp ? JoinGathers(graph_, best_.schedule, a, b)
                                   : JoinScatters(graph_, best_.schedule, a, b, staging_cap_);
        }
        if (!joined.has_value() || !Try(*std::move(joined))) ++open;
      }
    }
    best_.details["collective_buckets"] = {
        {"messages_joined", messages_before - best_.report.collectives},
        {"simulations", simulations_},
        {"cut", cut_}};
    return std::move(best_);
  }

 private:
  // Simulates `schedule`, kept where it is no slower, and faster or no
  // higher in peak, within the limits. A schedule the simulator refuses is
  // passed over (the joins keep every step's inputs in place, so none
  // should be).
  bool Try(Schedule schedule) {
    ++simulations_;
    absl::StatusOr<PlanResult> planned = FinishPlan(graph_, std::move(schedule), options_);
    if (!planned.ok() || planned->feasible != best_.feasible) return false;
    const PlanReport& r = planned->report;
    const PlanReport& best = best_.report;
    if (r.peak_bytes > peak_limit_ || r.host_peak_bytes > best.host_peak_bytes ||
        r.makespan > best.makespan ||
        (r.makespan == best.makespan && r.peak_bytes > best.peak_bytes)) {
      return false;
    }
    planned->message = std::move(best_.message);
    planned->details = std::move(best_.details);
    best_ = *std::move(planned);
    return true;
  }

  const Graph& graph_;
  const PlannerOptions& options_;
  const int64_t staging_cap_;
  const int max_simulations_;
  PlanResult best_;
  int64_t peak_limit_ = 0;
  int simulations_ = 0;
  bool cut_ = false;  // a pair was left untried
};

}  // namespace

absl::StatusOr<PlanResult> JoinCollectiveMessages(const Graph& graph, PlanResult planned,
                                                  const PlannerOptions& options,
                                                  int64_t max_simulated_steps) {
  return JoinSearch(graph, std::move(planned), options, max_simulated_steps).Run();
}

}  // namespace pebble
