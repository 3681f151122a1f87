#include "scheduler/plan_api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "oneapi/tbb/info.h"
#include "oneapi/tbb/parallel_for.h"
#include "oneapi/tbb/task_arena.h"
#include "scheduler/budget.h"
#include "scheduler/checkmate.h"  // PeakLowerBound
#include "scheduler/collectives.h"  // ShardedRanks
#include "scheduler/policies.h"  // kFsdpPolicies
#include "scheduler/simulator.h"

namespace pebble {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The policies of a request: `names`, each checked, or every registered one
// (that `keep` accepts) when empty.
template <typename Keep>
absl::StatusOr<std::vector<std::string>> PolicyList(const std::vector<std::string>& names,
                                                    Keep keep) {
  if (names.empty()) {
    std::vector<std::string> all;
    for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
      if (keep(p->name)) all.push_back(p->name);
    }
    return all;
  }
  for (const std::string& name : names) RETURN_IF_ERROR(MakePlanner(name).status());
  return names;
}

// Runs body(0) .. body(n - 1), on `jobs` threads (0: every hardware
// thread; more than the hardware's threads or than n: as many) or, with
// jobs == 1, one after the other on this thread. (TBB warns on stderr of
// an arena larger than its workers allow.)
template <typename Body>
void ForEachIndex(size_t n, int jobs, Body body) {
  if (jobs == 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  const int hardware = oneapi::tbb::info::default_concurrency();
  oneapi::tbb::task_arena arena(
      jobs > 0 ? static_cast<int>(std::min<size_t>({static_cast<size_t>(jobs),
                                                     static_cast<size_t>(hardware), n}))
               : oneapi::tbb::task_arena::automatic);
  arena.execute([&] {
    oneapi::tbb::parallel_for(size_t{0}, n, [&](size_t i) { body(i); });
  });
}

// A graph sharded already (ShardedRanks) planned on its ranks with a link
// other than the one its collectives were timed for: the link would change
// nothing, so it is refused, as the command line refuses it. A link equal
// to the default is taken as none given. (On one rank such a graph is one
// rank's part of the step, as a policy of its own plans it.)
absl::Status CheckShardedGraph(const Graph& graph, const PlannerOptions& options) {
  const std::optional<CollectiveLink> timed = ShardedRanks(graph);
  if (!timed.has_value() || options.ranks < 2) return absl::OkStatus();
  const NetworkLink given = options.network, none;
  const bool differs = given.bandwidth_bytes_per_s != timed->link.bandwidth_bytes_per_s ||
                       given.latency_s != timed->link.latency_s;
  const bool default_link = given.bandwidth_bytes_per_s == none.bandwidth_bytes_per_s &&
                            given.latency_s == none.latency_s;
  if (differs && !default_link) {
    return absl::InvalidArgumentError(absl::StrCat(
        "network: the graph is sharded already, its collectives timed for a link of ",
        absl::StrFormat("%g", timed->link.bandwidth_bytes_per_s), " bytes/s and ",
        absl::StrFormat("%g", timed->link.latency_s), " s a message, which this does not "
        "change: shard the unsharded graph with this link instead"));
  }
  return absl::OkStatus();
}

// Note [Host-budget advice]. A plan refused for its host budget says what
// host budget would take it ("--host-budget 5119528 (4.88 MiB), with which
// this budget fits"; empty where none was found): the policy plans again at
// the same byte budget with the refused plan's host peak as the host budget
// (a policy may then move more to the host, so where that plan breaks it
// again, once more with that plan's host peak), and the advice names the
// host budget only where such a plan fits: advice followed fits. Where that host budget
// leaves the byte budget too low, the advice is both, the byte budget the
// least peak then as a percentage ("--host-budget 8895568 (8.48 MiB) with
// --budget 100%"), checked alike.
absl::StatusOr<std::string> HostBudgetAdvice(const Graph& graph, const Planner& planner,
                                             PlannerOptions options, const PlanResult& refused,
                                             int64_t baseline_peak_bytes) {
  if (!options.host_budget_bytes.has_value() ||
      refused.report.host_peak_bytes <= *options.host_budget_bytes) {
    return std::string();
  }
  const bool at_min = options.budget_bytes == kMinBudgetBytes;
  const Deadline deadline(options.time_limit_s);
  options.progress = nullptr;
  auto plan_with = [&](int64_t host_budget, int64_t budget_bytes) {
    options.host_budget_bytes = host_budget;
    options.budget_bytes = budget_bytes;
    options.time_limit_s = deadline.remaining_s();
    return planner.Plan(graph, options);
  };
  auto host_flag = [](int64_t host_budget) {
    return absl::StrCat("--host-budget ", host_budget, " (", FormatBytes(host_budget), ")");
  };
  const int64_t budget_bytes = options.budget_bytes;
  int64_t host_budget = refused.report.host_peak_bytes;
  for (int tries = 0; tries < 2 && !deadline.Expired(); ++tries) {
    ASSIGN_OR_RETURN(PlanResult plan, plan_with(host_budget, budget_bytes));
    if (plan.feasible) {
      return absl::StrCat(host_flag(host_budget), ", with which ",
                          at_min ? absl::StrCat("the least peak is ",
                                                FormatBytes(plan.report.peak_bytes))
                                 : std::string("this budget fits"));
    }
    if (plan.report.host_peak_bytes > host_budget) {
      host_budget = plan.report.host_peak_bytes;  // (it moved more to the host)
      continue;
    }
    if (at_min || deadline.Expired()) break;
    // Within that host budget the byte budget is too low: the least peak
    // there, as a percentage that admits it, if a plan at it fits.
    ASSIGN_OR_RETURN(const PlanResult least, plan_with(host_budget, kMinBudgetBytes));
    if (!least.feasible || baseline_peak_bytes <= 0 || deadline.Expired()) break;
    const double percent = std::ceil(100.0 * static_cast<double>(least.report.peak_bytes) /
                                     static_cast<double>(baseline_peak_bytes));
    const BudgetSpec spec = {.kind = BudgetSpec::Kind::kPercent, .percent = percent};
    ASSIGN_OR_RETURN(const PlanResult at_percent,
                     plan_with(host_budget, ResolveBudget(spec, baseline_peak_bytes)));
    if (!at_percent.feasible) break;
    return absl::StrCat(host_flag(host_budget), " with --budget ", absl::StrFormat("%g", percent),
                        "% (the least peak then is ", FormatBytes(least.report.peak_bytes), ")");
  }
  return std::string();
}

}  // namespace

absl::StatusOr<PlanOutcome> PlanGraph(const Graph& graph, const PlanRequest& request) {
  ASSIGN_OR_RETURN(BudgetSpec spec, ParseBudget(request.budget));
  PlanOutcome out;
  out.budget = request.budget;
  out.budget_is_min = spec.kind == BudgetSpec::Kind::kMin;
  RETURN_IF_ERROR(CheckPlannable(graph));
  RETURN_IF_ERROR(CheckShardedGraph(graph, request.options));
  ASSIGN_OR_RETURN(out.baseline_peak_bytes, BaselinePeak(graph));
  PlannerOptions options = request.options;
  options.budget_bytes = ResolveBudget(spec, out.baseline_peak_bytes);
  out.bandwidth_bytes_per_s = options.host_bandwidth_bytes_per_s;
  out.policy = request.policy.empty()
                   ? std::string(DefaultPolicy(options.budget_bytes, out.baseline_peak_bytes))
                   : request.policy;
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(out.policy));
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(out.result, planner->Plan(graph, options));
  out.plan_time_s = SecondsSince(start);
  out.budget_bytes = options.budget_bytes == kMinBudgetBytes ? out.result.report.peak_bytes
                                                             : options.budget_bytes;
  ASSIGN_OR_RETURN(out.layout, PlanMemoryLayout(graph, out.result.schedule));
  out.parameter_bytes = ParameterBytes(graph);
  // Auto homes count where the plan put them.
  out.end_state_bytes = EndStateBytes(
      graph.has_auto_homes() ? ResolveHomes(graph, out.result.schedule) : graph);
  if (!out.result.feasible) {
    // Within the time limit where the first plan left time, else a tenth of
    // it, for the least-peak plan and the host-budget advice together.
    options.time_limit_s = std::max(0.1 * request.options.time_limit_s,
                                    request.options.time_limit_s - out.plan_time_s);
    options.progress = nullptr;
    ASSIGN_OR_RETURN(out.advice, RefusalAdvice(graph, *planner, options, out));
  }
  return out;
}

absl::StatusOr<std::string> RefusalAdvice(const Graph& graph, const Planner& planner,
                                          const PlannerOptions& options, PlanOutcome& out) {
  const Deadline deadline(options.time_limit_s);
  std::string advice;
  if (out.budget_is_min) {
    // At min only another limit (the host budget) is left to break.
    advice = absl::StrCat("the plan does not fit: ", out.result.message);
  } else {
    out.least_peak_bytes = out.result.least_peak_bytes;  // the planner's, if it made one
    out.least_peak_cut_short = TimeLimitReached(out.result);
    bool least_breaks_host =
        out.result.details.value("least_peak_breaks_host_budget", false);
    if (!out.least_peak_bytes.has_value()) {
      PlannerOptions at_min = options;
      at_min.budget_bytes = kMinBudgetBytes;
      ASSIGN_OR_RETURN(PlanResult least, planner.Plan(graph, at_min));
      out.least_peak_bytes = least.report.peak_bytes;
      out.least_peak_cut_short = TimeLimitReached(least);
      least_breaks_host = options.host_budget_bytes.has_value() &&
                          least.report.host_peak_bytes > *options.host_budget_bytes;
    }
    // (a least peak that breaks the host budget is no budget to try)
    advice = DoesNotFitAdvice(out.policy, out.budget_bytes,
                              least_breaks_host ? out.budget_bytes : *out.least_peak_bytes,
                              out.baseline_peak_bytes, out.end_state_bytes, out.result.message,
                              out.least_peak_cut_short);
  }
  PlannerOptions host_options = options;
  host_options.time_limit_s = deadline.remaining_s();
  if (host_options.time_limit_s <= 0) return advice;
  ASSIGN_OR_RETURN(const std::string host_advice,
                   HostBudgetAdvice(graph, planner, host_options, out.result,
                                    out.baseline_peak_bytes));
  if (!host_advice.empty()) {
    const bool tried = absl::StrContains(advice, "try --budget");
    absl::StrAppend(&advice, tried ? ", or " : "; try ", host_advice);
  }
  return advice;
}

std::string DoesNotFitAdvice(absl::string_view policy, int64_t budget_bytes,
                             int64_t least_peak_bytes, int64_t baseline_peak_bytes,
                             int64_t end_state_bytes, absl::string_view message,
                             bool cut_short) {
  if (least_peak_bytes <= budget_bytes) {
    return absl::StrCat("the plan does not fit ", FormatBytes(budget_bytes), ": ", message);
  }
  // Both in bytes too where they round alike ("does not fit 12.4 MiB: ... reaches 12.4 MiB").
  const bool exact = FormatBytes(budget_bytes) == FormatBytes(least_peak_bytes);
  return absl::StrCat(
      "the plan does not fit ", FormatBytes(budget_bytes),
      exact ? absl::StrCat(" (", budget_bytes, " bytes)") : std::string(), ": ",
      LeastPeakAdvice(policy, least_peak_bytes, baseline_peak_bytes, end_state_bytes, exact,
                      cut_short));
}

int64_t ParameterBytes(const Graph& graph) {
  int64_t bytes = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.role(v) == Role::kParameter && !graph.is_alias(v)) bytes += graph.bytes(v);
  }
  return bytes;
}

int64_t EndStateBytes(const Graph& graph) {
  std::vector<bool> counted(graph.num_nodes(), false);
  int64_t bytes = graph.persistent_bytes();
  for (NodeId v : graph.outputs()) {
    const NodeId s = graph.storage(v);
    if (graph.persistent(s) || counted[s]) continue;
    counted[s] = true;
    bytes += graph.bytes(s);
  }
  return bytes;
}

std::string LeastPeakAdvice(absl::string_view policy, int64_t least_peak_bytes,
                            int64_t baseline_peak_bytes, int64_t end_state_bytes,
                            bool with_bytes, bool cut_short) {
  const double percent =
      baseline_peak_bytes > 0
          ? std::ceil(100.0 * static_cast<double>(least_peak_bytes) /
                      static_cast<double>(baseline_peak_bytes))
          : 100.0;
  // Where the end state is most of the peak, the budget is out of any
  // policy's reach: say so.
  const std::string floor =
      end_state_bytes > 0 && 2 * end_state_bytes >= least_peak_bytes
          ? absl::StrCat(" (", FormatBytes(end_state_bytes),
                         " of it are the persistent tensors and outputs, such as parameters and "
                         "their gradients, that every plan keeps)")
          : std::string();
  const std::string bytes = with_bytes ? absl::StrCat(least_peak_bytes, " bytes, ") : "";
  if (cut_short) {
    return absl::StrFormat(
        "%s reaches %s (%s%g%%) in its time limit: try --budget %g%%, --budget min or a "
        "longer --time-limit%s",
        policy, FormatBytes(least_peak_bytes), bytes, percent, percent, floor);
  }
  return absl::StrFormat("%s reaches %s (%s%g%%) at least: try --budget %g%% or --budget min%s",
                         policy, FormatBytes(least_peak_bytes), bytes, percent, percent, floor);
}

nlohmann::json PlanDocumentReport(const Graph& graph, const PlanOutcome& outcome,
                                  bool with_timeline) {
  nlohmann::json report =
      ReportToJson(outcome.result.report, graph, outcome.result.schedule, with_timeline);
  report["arena_bytes"] = outcome.layout.arena_bytes;
  report["fragmentation"] = outcome.layout.fragmentation;
  return report;
}

nlohmann::json PlanDocument(const Graph& graph, const PlanOutcome& outcome,
                            const std::string& label, bool with_timeline,
                            bool with_instances) {
  nlohmann::json layout = outcome.layout.ToJson(graph);
  if (!with_instances) layout.erase("instances");
  nlohmann::json doc = {
      {"graph", label},
      {"policy", outcome.policy},
      {"budget", outcome.budget},
      {"budget_bytes", outcome.budget_bytes},
      {"baseline_peak_bytes", outcome.baseline_peak_bytes},
      {"parameter_bytes", outcome.parameter_bytes},
      {"end_state_bytes", outcome.end_state_bytes},
      {"bandwidth_bytes_per_s", outcome.bandwidth_bytes_per_s},
      {"feasible", outcome.result.feasible},
      {"message", outcome.result.message},
      {"plan_time_s", outcome.plan_time_s},
      {"details", outcome.result.details},
      {"report", PlanDocumentReport(graph, outcome, with_timeline)},
      {"layout", layout},
      {"schedule", ScheduleToJson(graph, outcome.result.schedule)},
  };
  if (outcome.least_peak_bytes) {
    doc["least_peak_bytes"] = *outcome.least_peak_bytes;
    doc["least_peak_cut_short"] = outcome.least_peak_cut_short;
    doc["advice"] = outcome.advice;
  }
  return doc;
}

absl::StatusOr<Comparison> Compare(const Graph& graph, const CompareRequest& request) {
  if (request.budgets.empty()) return absl::InvalidArgumentError("compare needs a budget");
  std::vector<BudgetSpec> specs;
  for (const std::string& b : request.budgets) {
    ASSIGN_OR_RETURN(specs.emplace_back(), ParseBudget(b));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> policies,
                   PolicyList(request.policies, [](const std::string&) { return true; }));
  if (request.jobs < 0) return absl::InvalidArgumentError("compare: jobs must be 0 or more");
  Comparison c;
  RETURN_IF_ERROR(CheckPlannable(graph));
  RETURN_IF_ERROR(CheckShardedGraph(graph, request.options));
  ASSIGN_OR_RETURN(c.baseline_peak_bytes, BaselinePeak(graph));
  // Policy-major, every plan independent of the others.
  const size_t n = policies.size() * specs.size();
  c.entries.reserve(n);
  for (const std::string& name : policies) {
    for (size_t i = 0; i < specs.size(); ++i) {
      c.entries.push_back({name, request.budgets[i],
                           ResolveBudget(specs[i], c.baseline_peak_bytes), 0,
                           absl::UnknownError("not planned")});
    }
  }
  ForEachIndex(n, request.jobs, [&](size_t k) {
    CompareEntry& e = c.entries[k];
    PlannerOptions o = request.options;
    o.budget_bytes = e.budget_bytes;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<Planner>> planner = MakePlanner(e.policy);
    e.result = planner.ok() ? (*planner)->Plan(graph, o)
                            : absl::StatusOr<PlanResult>(planner.status());
    e.plan_time_s = SecondsSince(start);
    if (request.on_entry) request.on_entry(e);
  });
  // The time every row is measured against.
  if (auto planner = MakePlanner("baseline"); planner.ok()) {
    PlannerOptions o = request.options;
    o.budget_bytes = INT64_MAX;
    if (absl::StatusOr<PlanResult> r = (*planner)->Plan(graph, o); r.ok()) {
      c.baseline_makespan = r->report.makespan;
    }
  }
  for (const CompareEntry& e : c.entries) {
    if (e.policy == "exact-order" && e.result.ok()) {
      c.optimal_order_peak_bytes =
          std::min(c.optimal_order_peak_bytes.value_or(INT64_MAX), e.result->report.peak_bytes);
    }
  }
  return c;
}

double MakespanOverBaseline(const Comparison& comparison, const PlanReport& report) {
  const double base =
      comparison.baseline_makespan > 0 ? comparison.baseline_makespan : report.base_cost;
  return base > 0 ? report.makespan / base : 1.0;
}

nlohmann::json CompareRowJson(const Graph& graph, const Comparison& comparison,
                              const CompareEntry& e) {
  nlohmann::json row = {{"policy", e.policy}, {"budget", e.budget},
                        {"plan_time_s", e.plan_time_s}};
  if (e.budget_bytes != kMinBudgetBytes) row["budget_bytes"] = e.budget_bytes;
  if (!e.result.ok()) {
    row["error"] = std::string(e.result.status().message());
    return row;
  }
  const PlanReport& r = e.result->report;
  if (comparison.optimal_order_peak_bytes.value_or(0) > 0) {
    row["peak_vs_optimal_order"] = static_cast<double>(r.peak_bytes) /
                                   static_cast<double>(*comparison.optimal_order_peak_bytes);
  }
  row["feasible"] = e.result->feasible;
  row["report"] = ReportToJson(r, graph, e.result->schedule, false);
  row["makespan_over_baseline"] = MakespanOverBaseline(comparison, r);
  if (!e.result->message.empty()) row["message"] = e.result->message;
  return row;
}

nlohmann::json CompareDocument(const Graph& graph, const Comparison& comparison,
                               const std::string& label) {
  nlohmann::json rows = nlohmann::json::array();
  for (const CompareEntry& e : comparison.entries) {
    rows.push_back(CompareRowJson(graph, comparison, e));
  }
  nlohmann::json doc = {{"graph", label},
                        {"baseline_peak_bytes", comparison.baseline_peak_bytes},
                        {"results", rows}};
  if (comparison.optimal_order_peak_bytes) {
    doc["optimal_order_peak_bytes"] = *comparison.optimal_order_peak_bytes;
  }
  return doc;
}

namespace {

// What a search learns of one value.
struct Probe {
  bool feasible = false;
  bool stopped = false;  // the time limit passed before the value was tried
  bool no_model = false;  // the model refused the value (heads that do not divide dim)
  std::string error;     // the model or the planner refused this value
};

// The largest v in [start, max] with probe(v).feasible, assuming
// monotonicity among the values that make a model; nullopt when none from
// start on fits. A value that makes no model (Probe::no_model) is passed
// over for the nearest one that does, below it first (up to
// kFitSkippedValues away); where none is that near, it is taken as too
// large (past the model's range: unet3d's classes beyond 1024). `start`
// makes one (FirstValueWithAModel). The first refusal goes to
// `first_error`. A probe that reports `stopped` ends the search with the
// largest value known to fit (*stopped = true).
template <typename ProbeFn>
std::optional<int64_t> LargestFeasible(int64_t start, int64_t max_value, ProbeFn probe,
                                       std::string* first_error, bool* stopped) {
  *stopped = false;
  // 1: fits, 0: does not, -1: stopped, 2: no model of this value.
  auto feasible = [&](int64_t v) {
    Probe p = probe(v);
    if (p.stopped) {
      *stopped = true;
      return -1;
    }
    if (!p.error.empty() && first_error->empty()) *first_error = p.error;
    if (p.no_model) return 2;
    return p.feasible ? 1 : 0;
  };
  // The value nearest `v` in (low, high) that makes a model, below v first,
  // and what it gave; {v, 2} where none within reach does.
  auto nearest = [&](int64_t v, int64_t low, int64_t high) -> std::pair<int64_t, int> {
    for (int64_t u = v - 1; u > low && v - u <= kFitSkippedValues; --u) {
      if (const int f = feasible(u); f != 2) return {u, f};
    }
    for (int64_t u = v + 1; u < high && u - v <= kFitSkippedValues; ++u) {
      if (const int f = feasible(u); f != 2) return {u, f};
    }
    return {v, 2};
  };
  if (feasible(start) != 1) return std::nullopt;
  int64_t lo = start, hi = -1;  // lo feasible; hi infeasible (or -1: unknown)
  while (hi < 0) {
    if (max_value > 0 && lo >= max_value) return lo;
    int64_t next = lo > INT64_MAX / 2 ? INT64_MAX : lo * 2;
    if (max_value > 0) next = std::min(next, max_value);
    if (next == lo) return lo;
    int f = feasible(next);
    if (f == 2) std::tie(next, f) = nearest(next, lo, max_value > 0 ? max_value + 1 : INT64_MAX);
    if (f < 0) return lo;
    // (nothing near makes a model: past the model's range, taken as too large)
    if (f == 1) {
      lo = next;
    } else {
      hi = next;
    }
  }
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    int f = feasible(mid);
    if (f == 2) std::tie(mid, f) = nearest(mid, lo, hi);
    if (f < 0) return lo;
    if (f == 1) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The whole search's clock, shared by the policies' threads.
class FitClock {
 public:
  explicit FitClock(double limit_s)
      : start_(std::chrono::steady_clock::now()), limit_s_(limit_s) {}
  double elapsed_s() const { return SecondsSince(start_); }
  double remaining_s() const { return std::max(0.0, limit_s_ - elapsed_s()); }
  bool Expired() const { return elapsed_s() >= limit_s_; }

 private:
  std::chrono::steady_clock::time_point start_;
  double limit_s_;
};

// One policy's search (Fit) from `start`, the first value that makes a
// model: fills `row`. The largest plan found to fit is kept as the search
// goes, so the answer needs no second plan.
template <typename Build>
absl::Status FitPolicy(const FitRequest& request, int64_t start, const std::string& name,
                       const PlannerOptions& options, const Build& build,
                       const FitClock& clock, FitRow& row) {
  row.policy = name;
  const PolicyInfo* info = PlannerRegistry::Global().Find(name);
  row.kind = info != nullptr ? std::string(PlanKindName(info->kind)) : "external";
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(name));
  auto report = [&](int64_t v, FitTry::Outcome outcome, int64_t peak) {
    ++row.tries;
    if (!request.on_try) return;
    FitTry t;
    t.policy = name;
    t.value = v;
    t.outcome = outcome;
    t.peak_bytes = peak;
    t.elapsed_s = clock.elapsed_s();
    request.on_try(t);
  };
  // Why each value tried did not fit, where it was no verdict of the
  // budget: refused (by the model or the policy), or a plan the per-plan
  // time limit cut. "" for a plan that does not fit. (The search takes
  // each as too large; the answer's note says which bounded it.)
  std::map<int64_t, std::string> not_fitting;
  auto probe = [&](int64_t v) {
    Probe p;
    if (clock.Expired()) {
      p.stopped = true;
      return p;
    }
    auto refuse = [&](const absl::Status& status) {
      p.error = absl::StrCat(request.vary, "=", v, ": ", status.message());
      not_fitting[v] = p.error;
      report(v, FitTry::Outcome::kRefused, 0);
      return p;
    };
    absl::StatusOr<Graph> g = build(v);
    if (!g.ok()) {
      p.no_model = true;
      return refuse(g.status());
    }
    // No plan of this graph fits: neither plan nor prepare it (a backend's
    // workspace probe would touch operands larger than the budget).
    const int64_t bound = PeakLowerBound(*g);
    if (bound > request.budget_bytes) {
      not_fitting[v] = "";
      report(v, FitTry::Outcome::kBelowBound, bound);
      return p;
    }
    if (request.prepare_graph) {
      g = request.prepare_graph(*g);
      if (!g.ok()) return refuse(g.status());
    }
    PlannerOptions o = options;
    o.time_limit_s = std::max(1e-3, std::min(o.time_limit_s, clock.remaining_s()));
    absl::StatusOr<PlanResult> plan = planner->Plan(*g, o);
    if (!plan.ok()) return refuse(plan.status());
    p.feasible = plan->feasible;
    if (!p.feasible) {
      not_fitting[v] = TimeLimitReached(*plan)
                           ? absl::StrCat(request.vary, "=", v, " was not settled: its plan "
                                          "reached the time limit of ",
                                          absl::StrFormat("%.3g", o.time_limit_s),
                                          " s (--time-limit)")
                           : std::string();
    }
    report(v, p.feasible ? FitTry::Outcome::kFits : FitTry::Outcome::kDoesNotFit,
           plan->report.peak_bytes);
    if (p.feasible && (!row.value.has_value() || v > *row.value)) {
      row.value = v;
      row.graph = *std::move(g);
      row.plan = *std::move(plan);
    }
    return p;
  };
  std::string first_error;
  const std::optional<int64_t> found = LargestFeasible(
      start, request.max_value, probe, &first_error, &row.time_limit_reached);
  PEBBLE_CHECK(found == row.value, "fit: the search and its kept plan disagree");
  if (row.value.has_value()) {
    absl::StatusOr<MemoryLayout> layout = PlanMemoryLayout(*row.graph, row.plan->schedule);
    if (layout.ok()) row.arena_bytes = layout->arena_bytes;
  }
  if (row.time_limit_reached) {
    row.note = row.value.has_value()
                   ? absl::StrCat("time limit of ", request.time_limit_s,
                                  " s reached: a larger ", request.vary, " may fit too")
                   : absl::StrCat("time limit of ", request.time_limit_s,
                                  " s reached before ", request.vary, "=", start,
                                  " was planned");
  } else if (!row.value.has_value()) {
    row.note = first_error.empty()
                   ? absl::StrCat("does not fit even at ", request.vary, "=", start)
                   : first_error;
  } else if (request.max_value > 0 && *row.value >= request.max_value) {
    row.note = absl::StrCat("the bound --max ", request.max_value, " reached: a larger ",
                            request.vary, " may fit too");
  } else if (auto next = not_fitting.upper_bound(*row.value);
             next != not_fitting.end() && !next->second.empty()) {
    // The value above the answer was refused or cut, not found too large.
    row.note = absl::StrCat("bounded by ", next->second);
  }
  return absl::OkStatus();
}

// Why the seed report's rule of thumb (activations take about 26 times the
// input) says nothing of `g`, or "": it was made for 3-D convolution
// networks, whose input is a 5-D (N, C, D, H, W) tensor of floats; a
// transformer's input is its token ids.
std::string NaiveRuleRefusal(const Graph& g) {
  const NodeId input = g.Find("input");
  if (input == kNoNode) return "the model has no node 'input'";
  const std::optional<Shape>& shape = g.shape(input);
  const std::optional<DType> dtype = g.dtype(input);
  if (shape.has_value() && shape->size() == 5 &&
      (!dtype.has_value() || (*dtype != DType::kInt64 && *dtype != DType::kUInt8))) {
    return "";
  }
  std::string what = shape.has_value() ? ShapeToString(*shape) : std::string("of unknown shape");
  if (dtype.has_value()) absl::StrAppend(&what, " ", DTypeName(*dtype));
  return absl::StrCat("the 26 x input rule is for 3-D convolution networks (a 5-D input of "
                      "floats); this input is ", what);
}

}  // namespace

namespace {

// The zoo model `spec` with its parameter `vary` at `value`.
absl::StatusOr<Graph> ModelAt(const ModelSpec& spec, const std::string& vary, int64_t value,
                              const CostModel& cost) {
  ModelSpec model = spec;
  model.params[vary] = absl::StrCat(value);
  return BuildModel(model, cost);
}

}  // namespace

absl::StatusOr<int64_t> FirstValueWithAModel(const ModelSpec& spec, const std::string& vary,
                                             int64_t start, int64_t max_value,
                                             const CostModel& cost) {
  return FirstValueBuilt(
      [&](int64_t value) { return ModelAt(spec, vary, value, cost); }, start, max_value);
}

absl::StatusOr<int64_t> FirstValueBuilt(
    const std::function<absl::StatusOr<Graph>(int64_t value)>& build, int64_t start,
    int64_t max_value) {
  absl::Status first_refusal;
  for (int64_t v = start; v - start <= kFitSkippedValues && (max_value <= 0 || v <= max_value);
       ++v) {
    const absl::StatusOr<Graph> built = build(v);
    if (built.ok()) return v;
    if (first_refusal.ok()) first_refusal = built.status();
  }
  return first_refusal;
}

absl::string_view FitOutcomeName(FitTry::Outcome outcome) {
  switch (outcome) {
    case FitTry::Outcome::kFits:
      return "fits";
    case FitTry::Outcome::kDoesNotFit:
      return "does not fit";
    case FitTry::Outcome::kBelowBound:
      return "over the budget at any plan";
    case FitTry::Outcome::kRefused:
      return "refused";
  }
  return "?";
}

absl::StatusOr<int64_t> ParseFitBudget(absl::string_view text) {
  RETURN_IF_ERROR(CheckBudgetHasUnit(text, /*percent_allowed=*/false));
  absl::StatusOr<BudgetSpec> parsed = ParseBudget(text);
  if (!parsed.ok()) {
    // (a budget's syntax error offers percentages and 'min', which fit
    // refuses: the size's own problem says what a size is)
    const absl::Status size = ParseSizeOf(text, "budget").status();
    return size.ok() ? parsed.status() : size;
  }
  const BudgetSpec& spec = *parsed;
  if (spec.kind != BudgetSpec::Kind::kBytes) {
    return absl::InvalidArgumentError(
        "fit needs a budget in bytes (e.g. 2GiB): a percentage or 'min' changes with the "
        "parameter");
  }
  return spec.bytes;
}

absl::StatusOr<FitResult> Fit(const FitRequest& request) {
  if (request.start < 1) return absl::InvalidArgumentError("fit: start must be at least 1");
  if (request.max_value != 0 && request.max_value < request.start) {
    return absl::InvalidArgumentError(absl::StrCat("fit: max ", request.max_value,
                                                   " is below start ", request.start,
                                                   "; nothing to try"));
  }
  if (request.budget_bytes <= 0) {
    return absl::InvalidArgumentError("fit needs a budget of a positive number of bytes");
  }
  if (!(request.time_limit_s > 0)) {
    return absl::InvalidArgumentError("fit: the time limit must be a positive number of seconds");
  }
  if (request.jobs < 0) return absl::InvalidArgumentError("fit: jobs must be 0 or more");
  const FitClock clock(request.time_limit_s);
  // The model as built: cheap (no tensors), so the naive rule and the
  // bound need no preparation.
  auto as_built = [&](int64_t value) -> absl::StatusOr<Graph> {
    return request.build_model ? request.build_model(value)
                               : ModelAt(request.model, request.vary, value, request.cost);
  };
  auto build = [&](int64_t value) {
    absl::StatusOr<Graph> built = as_built(value);
    if (!built.ok() || !request.transform_model) return built;
    return request.transform_model(*built);
  };
  // The first model from start on (a value may make none: the searches
  // pass over it), for the naive rule's refusal.
  ASSIGN_OR_RETURN(const int64_t first_value,
                   FirstValueBuilt(as_built, request.start, request.max_value));
  ASSIGN_OR_RETURN(const Graph first, build(first_value));
  ASSIGN_OR_RETURN(std::vector<std::string> policies,
                   PolicyList(request.policies, [&first](const std::string& name) {
                     return name != "exact" && name != "exact-order" && name != "checkmate" &&
                            (first.has_collectives() ||
                             std::find(kFsdpPolicies.begin(), kFsdpPolicies.end(), name) ==
                                 kFsdpPolicies.end());
                   }));
  PlannerOptions options = request.options;
  options.budget_bytes = request.budget_bytes;

  FitResult fit;
  bool naive_stopped = false;
  fit.naive_note = NaiveRuleRefusal(first);
  fit.naive_applies = fit.naive_note.empty();
  if (fit.naive_applies) {
    fit.naive_value = LargestFeasible(
        first_value, request.max_value,
        [&](int64_t v) {
          Probe p;
          absl::StatusOr<Graph> g = build(v);
          if (!g.ok()) {
            p.error = std::string(g.status().message());
            p.no_model = true;
            return p;
          }
          p.feasible = 26 * g->bytes(g->Find("input")) <= request.budget_bytes;
          return p;
        },
        &fit.naive_note, &naive_stopped);
  }

  fit.rows.resize(policies.size());
  std::vector<absl::Status> failures(policies.size());
  ForEachIndex(policies.size(), request.jobs, [&](size_t k) {
    failures[k] =
        FitPolicy(request, first_value, policies[k], options, build, clock, fit.rows[k]);
  });
  for (const absl::Status& failure : failures) RETURN_IF_ERROR(failure);
  fit.search_time_s = clock.elapsed_s();
  return fit;
}

nlohmann::json FitRowJson(const FitRow& row) {
  nlohmann::json j = {{"policy", row.policy}, {"kind", row.kind},
                      {"baseline", row.policy == "baseline"}};
  if (row.value.has_value()) {
    j["value"] = *row.value;
    j["model"] = row.graph->name();
    j["predicted_peak_bytes"] = row.plan->report.peak_bytes;
    if (row.arena_bytes.has_value()) j["arena_bytes"] = *row.arena_bytes;
    j["overhead"] = row.plan->report.overhead;
    j["transfer_bytes"] = row.plan->report.transfer_bytes;
  } else {
    j["value"] = nullptr;
  }
  if (!row.note.empty()) j["note"] = row.note;
  j["tries"] = row.tries;
  j["time_limit_reached"] = row.time_limit_reached;
  return j;
}

}  // namespace pebble
