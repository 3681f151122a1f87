#include "scheduler/schedule.h"
#include "scheduler/schedule_reader.h"

#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {

absl::string_view ActionName(Action action) {
  switch (action) {
    case Action::kCompute: return "compute";
    case Action::kFree: return "free";
    case Action::kOffload: return "offload";
    case Action::kPrefetch: return "prefetch";
    case Action::kHostCompute: return "host_compute";
    case Action::kAllReduce: return "all_reduce";
  }
  return "?";
}

absl::StatusOr<Action> ParseAction(absl::string_view name) {
  for (Action a : {Action::kCompute, Action::kFree, Action::kOffload, Action::kPrefetch,
                   Action::kHostCompute, Action::kAllReduce}) {
    if (ActionName(a) == name) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown action ", Quote(name),
                   " (expected compute, free, offload, prefetch, host_compute or all_reduce)"));
}

int64_t CountSteps(const Schedule& schedule, Action action) {
  int64_t n = 0;
  for (const Step& step : schedule.steps) n += step.action == action;
  return n;
}

int64_t CountBuckets(const Schedule& schedule) {
  int64_t n = 0;
  for (const Step& step : schedule.steps) {
    n += step.action == Action::kAllReduce && !step.joins_bucket;
  }
  return n;
}

nlohmann::json ScheduleToJson(const Graph& graph, const Schedule& schedule) {
  nlohmann::json steps = nlohmann::json::array();
  int64_t bucket = -1;  // the number of the last bucket written
  const size_t n = schedule.steps.size();
  for (size_t k = 0; k < n; ++k) {
    const Step& step = schedule.steps[k];
    if (step.node < 0 || step.node >= graph.num_nodes()) {
      const std::string message = absl::StrCat("step ", k, " names node id ", step.node,
                                               ", out of range (Simulate tells a schedule's "
                                               "faults)");
      internal::CheckFailed(__FILE__, __LINE__, "ScheduleToJson's nodes in the graph",
                            message.c_str());
    }
    nlohmann::json s = {{"action", std::string(ActionName(step.action))},
                        {"node", graph.id(step.node)}};
    // Only all_reduce steps and computes of collective nodes are in
    // buckets (a misplaced flag, which the simulator refuses, is not written).
    auto bucketable = [&](size_t j) {
      const Step& at = schedule.steps[j];
      return at.action == Action::kAllReduce ||
             (at.action == Action::kCompute && graph.collective(at.node));
    };
    // A flag joins only a step of the same kind (both all_reduce steps, or
    // both computes of collectives), as the simulator requires.
    auto joins = [&](size_t j) {
      return j > 0 && schedule.steps[j].joins_bucket && bucketable(j) && bucketable(j - 1) &&
             schedule.steps[j].action == schedule.steps[j - 1].action;
    };
    const bool heads_bucket = bucketable(k) && !joins(k) && k + 1 < n && joins(k + 1);
    if (heads_bucket) ++bucket;
    if (heads_bucket || (joins(k) && bucket >= 0)) s["bucket"] = bucket;
    steps.push_back(std::move(s));
  }
  return {{"format", "pebble-schedule"}, {"version", 1}, {"steps", steps}};
}

namespace {

constexpr absl::string_view kScheduleKeys[] = {"format", "version", "steps"};
constexpr absl::string_view kStepKeys[] = {"action", "node", "bucket"};

absl::StatusOr<Step> StepFromJson(const Graph& graph, const nlohmann::json& s, size_t i) {
  const std::string where = absl::StrCat("schedule step ", i);
  if (!s.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  RETURN_IF_ERROR(CheckJsonKeys(s, kStepKeys, where));
  auto action = s.find("action");
  auto node = s.find("node");
  if (action == s.end() || !action->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": 'action' must be a string"));
  }
  if (node == s.end() || !node->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": 'node' must be a string"));
  }
  auto parsed = ParseAction(action->get_ref<const std::string&>());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", parsed.status().message()));
  }
  const std::string& id = node->get_ref<const std::string&>();
  const NodeId v = graph.Find(id);
  if (v == kNoNode) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown node ", Quote(id)));
  }
  return Step{*parsed, v};
}

// The "bucket" numbers of a schedule's steps, read in order: a step
// joins the bucket of the step before it when both have the same number
// (all_reduce steps, or computes of collective nodes: whether they may
// join is the simulator's rule); a number may not come back after other
// steps.
class BucketReader {
 public:
  explicit BucketReader(const Graph& graph) : graph_(graph) {}
  absl::Status Read(const nlohmann::json& s, size_t i, Step& step) {
    auto bucket = s.find("bucket");
    if (bucket == s.end()) {
      previous_ = -1;
      return absl::OkStatus();
    }
    const std::string where = absl::StrCat("schedule step ", i);
    if (!bucket->is_number_integer() || bucket->get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": 'bucket' must be a non-negative integer, not ", bucket->dump()));
    }
    const int64_t number = bucket->get<int64_t>();
    if (step.action != Action::kAllReduce &&
        !(step.action == Action::kCompute && graph_.collective(step.node))) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": only an all_reduce step, or a compute of a collective node, is in a bucket, "
                 "not ", ActionName(step.action), " of ", Quote(graph_.id(step.node))));
    }
    step.joins_bucket = number == previous_;
    if (!step.joins_bucket && !seen_.insert(number).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": bucket ", number, " came before, with other steps between: a bucket's "
          "steps are consecutive (one collective)"));
    }
    previous_ = number;
    return absl::OkStatus();
  }

 private:
  const Graph& graph_;
  int64_t previous_ = -1;  // the bucket of the step before; -1: none
  absl::flat_hash_set<int64_t> seen_;
};

}  // namespace

namespace {

// The checks of a schedule document besides its steps, in the order
// ScheduleFromJson makes them.
absl::Status CheckScheduleDocument(const nlohmann::json& doc) {
  if (!doc.is_object()) {
    return absl::InvalidArgumentError("schedule: the document is not an object");
  }
  auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() ||
      format->get_ref<const std::string&>() != "pebble-schedule") {
    return absl::InvalidArgumentError(
        "schedule: 'format' must be \"pebble-schedule\"");
  }
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() ||
      version->get<int64_t>() != 1) {
    return absl::InvalidArgumentError("schedule: 'version' must be 1");
  }
  RETURN_IF_ERROR(CheckJsonKeys(doc, kScheduleKeys, "schedule"));
  auto steps = doc.find("steps");
  if (steps == doc.end() || !steps->is_array()) {
    return absl::InvalidArgumentError("schedule: 'steps' must be an array");
  }
  return absl::OkStatus();
}

}  // namespace

struct ScheduleReader::State {
  explicit State(const Graph& g) : graph(g), buckets(g) {}
  const Graph& graph;
  BucketReader buckets;
  Schedule schedule;
};

ScheduleReader::ScheduleReader(const Graph& graph) : state_(std::make_unique<State>(graph)) {}
ScheduleReader::~ScheduleReader() = default;

absl::Status ScheduleReader::Add(const nlohmann::json& s) {
  const size_t i = state_->schedule.steps.size();
  absl::StatusOr<Step> step = StepFromJson(state_->graph, s, i);
  if (step.ok()) {
    if (absl::Status read = state_->buckets.Read(s, i, *step); !read.ok()) step = read;
  }
  if (!step.ok()) {
    state_->schedule.steps = {};
    return step.status();
  }
  state_->schedule.steps.push_back(*step);
  return absl::OkStatus();
}

size_t ScheduleReader::size() const { return state_->schedule.steps.size(); }

Schedule ScheduleReader::Take() { return std::exchange(state_->schedule, Schedule{}); }

absl::StatusOr<Schedule> ScheduleFromJson(const Graph& graph,
                                          const nlohmann::json& doc) {
  RETURN_IF_ERROR(CheckScheduleDocument(doc));
  const nlohmann::json& steps = doc["steps"];
  ScheduleReader reader(graph);
  for (const nlohmann::json& step : steps) RETURN_IF_ERROR(reader.Add(step));
  return reader.Take();
}

absl::StatusOr<Schedule> ParseScheduleText(const Graph& graph, absl::string_view text,
                                           absl::string_view source, bool* json_error) {
  if (json_error != nullptr) *json_error = false;
  // Each step is checked and kept as a Step as soon as it is parsed. The
  // first bad step is reported only after the JSON and the rest of the
  // document are found sound, so that errors come in the order
  // ScheduleFromJson gives them.
  ScheduleReader reader(graph);
  absl::Status first_bad_step;
  auto sink = [&](nlohmann::json& element, size_t) {
    if (first_bad_step.ok()) first_bad_step = reader.Add(element);
    return absl::OkStatus();
  };
  absl::StatusOr<nlohmann::json> doc = ParseStrictJsonStreaming(text, source, "steps", sink);
  if (!doc.ok()) {
    if (json_error != nullptr) *json_error = true;
    return doc.status();
  }
  absl::Status status = CheckScheduleDocument(*doc);
  if (status.ok()) status = first_bad_step;
  if (!status.ok()) {
    if (source.empty()) return status;
    return absl::Status(status.code(), absl::StrCat(source, ": ", status.message()));
  }
  return reader.Take();
}

absl::StatusOr<Schedule> ReadScheduleFile(const Graph& graph,
                                          const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(path, "schedule file"));
  return ParseScheduleText(graph, text, Printable(path, 200));
}

std::vector<NodeId> DefaultOrder(const Graph& graph) {
  std::vector<NodeId> order;
  for (NodeId v : graph.topological_order()) {
    if (graph.needed()[v] && !graph.persistent(v)) order.push_back(v);
  }
  return order;
}

Graph ResolveHomes(const Graph& graph, const Schedule& schedule) {
  // Per node, whether the first step on it needs its host copy: a prefetch
  // of it, or a host compute that reads or writes its storage.
  std::vector<int8_t> first_on_host(graph.num_nodes(), -1);
  for (const Step& step : schedule.steps) {
    if (step.action == Action::kHostCompute) {
      for (NodeId u : graph.unique_inputs(step.node)) {
        int8_t& first = first_on_host[graph.storage(u)];
        if (first < 0) first = 1;
      }
    }
    int8_t& first = first_on_host[step.node];
    if (first < 0) first = step.action == Action::kPrefetch ? 1 : 0;
  }
  return graph.WithAutoHomesAs(
      [&](NodeId v) { return first_on_host[v] == 1 ? Tier::kHost : Tier::kDevice; });
}

absl::StatusOr<Schedule> FreeAtLastUse(const Graph& graph,
                                       const std::vector<NodeId>& order) {
  const int n = graph.num_nodes();
  std::vector<int> position(n, -1);
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    NodeId v = order[i];
    if (v < 0 || v >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("order position ", i, ": node id ", v, " out of range"));
    }
    if (graph.persistent(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "order: node '", graph.id(v), "' is persistent and never computed"));
    }
    if (!graph.needed()[v]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "order: node '", graph.id(v), "' is not an output nor an ancestor of one"));
    }
    if (position[v] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("order: node '", graph.id(v), "' appears twice"));
    }
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u) && position[u] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("order: node '", graph.id(v), "' comes before its input '",
                         graph.id(u), "'"));
      }
    }
    position[v] = i;
  }
  for (NodeId v = 0; v < n; ++v) {
    if (graph.needed()[v] && !graph.persistent(v) && position[v] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("order: node '", graph.id(v), "' is missing"));
    }
  }
  // last_reader[u]: position of the last node in `order` that reads u.
  std::vector<int> last_reader(n, -1);
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    for (NodeId u : graph.unique_inputs(order[i])) last_reader[u] = i;
  }
  Schedule schedule;
  schedule.steps.reserve(2 * order.size());
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    NodeId v = order[i];
    schedule.steps.push_back({Action::kCompute, v});
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u) && !graph.is_output(u) && last_reader[u] == i) {
        schedule.steps.push_back({Action::kFree, u});
      }
    }
    if (last_reader[v] < 0 && !graph.is_output(v)) {
      schedule.steps.push_back({Action::kFree, v});
    }
  }
  return schedule;
}

}  // namespace pebble
