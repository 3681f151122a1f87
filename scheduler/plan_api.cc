#include "scheduler/plan_api.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "oneapi/tbb/parallel_for.h"
#include "oneapi/tbb/task_arena.h"
#include "scheduler/budget.h"
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
// thread) or, with jobs == 1, one after the other on this thread.
template <typename Body>
void ForEachIndex(size_t n, int jobs, Body body) {
  if (jobs == 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  oneapi::tbb::task_arena arena(jobs > 0 ? jobs : oneapi::tbb::task_arena::automatic);
  arena.execute([&] {
    oneapi::tbb::parallel_for(size_t{0}, n, [&](size_t i) { body(i); });
  });
}

}  // namespace

absl::StatusOr<PlanOutcome> PlanGraph(const Graph& graph, const PlanRequest& request) {
  ASSIGN_OR_RETURN(BudgetSpec spec, ParseBudget(request.budget));
  PlanOutcome out;
  out.budget = request.budget;
  out.budget_is_min = spec.kind == BudgetSpec::Kind::kMin;
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
  return out;
}

nlohmann::json PlanReportJson(const Graph& graph, const PlanOutcome& outcome,
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
  return {
      {"graph", label},
      {"policy", outcome.policy},
      {"budget", outcome.budget},
      {"budget_bytes", outcome.budget_bytes},
      {"baseline_peak_bytes", outcome.baseline_peak_bytes},
      {"bandwidth_bytes_per_s", outcome.bandwidth_bytes_per_s},
      {"feasible", outcome.result.feasible},
      {"message", outcome.result.message},
      {"plan_time_s", outcome.plan_time_s},
      {"details", outcome.result.details},
      {"report", PlanReportJson(graph, outcome, with_timeline)},
      {"layout", layout},
      {"schedule", ScheduleToJson(graph, outcome.result.schedule)},
  };
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
  });
  for (const CompareEntry& e : c.entries) {
    if (e.policy == "exact-order" && e.result.ok()) {
      c.optimal_order_peak_bytes =
          std::min(c.optimal_order_peak_bytes.value_or(INT64_MAX), e.result->report.peak_bytes);
    }
  }
  return c;
}

double MakespanOverBaseline(const PlanReport& report) {
  return report.base_cost > 0 ? report.makespan / report.base_cost : 1.0;
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
  row["makespan_over_baseline"] = MakespanOverBaseline(r);
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

struct Probe {
  bool feasible = false;
  std::string error;  // the model or the planner refused this value
};

// The largest v in [start, max] with probe(v).feasible, assuming
// monotonicity; nullopt when probe(start) is not feasible. The first
// refusal goes to `first_error`.
template <typename ProbeFn>
std::optional<int64_t> LargestFeasible(int64_t start, int64_t max_value, ProbeFn probe,
                                       std::string* first_error) {
  auto feasible = [&](int64_t v) {
    Probe p = probe(v);
    if (!p.error.empty() && first_error->empty()) *first_error = p.error;
    return p.feasible;
  };
  if (!feasible(start)) return std::nullopt;
  int64_t lo = start, hi = -1;  // lo feasible; hi infeasible (or -1: unknown)
  while (hi < 0) {
    if (max_value > 0 && lo >= max_value) return lo;
    int64_t next = lo > INT64_MAX / 2 ? INT64_MAX : lo * 2;
    if (max_value > 0) next = std::min(next, max_value);
    if (next == lo) return lo;
    if (feasible(next)) {
      lo = next;
    } else {
      hi = next;
    }
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (feasible(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}


// One policy's search (Fit): fills `row`; an error only where the plan at
// the value found fails on the second run.
template <typename Build>
absl::Status FitPolicy(const FitRequest& request, const std::string& name,
                       const PlannerOptions& options, const Build& build, FitRow& row) {
  row.policy = name;
  const PolicyInfo* info = PlannerRegistry::Global().Find(name);
  row.kind = info != nullptr ? std::string(PlanKindName(info->kind)) : "external";
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(name));
  auto plan_at = [&](int64_t v) -> absl::StatusOr<std::pair<Graph, PlanResult>> {
    absl::StatusOr<Graph> g = build(v);
    if (!g.ok()) return absl::InvalidArgumentError(g.status().message());
    absl::StatusOr<PlanResult> plan = planner->Plan(*g, options);
    if (!plan.ok()) return plan.status();
    return std::make_pair(*std::move(g), *std::move(plan));
  };
  row.value = LargestFeasible(
      request.start, request.max_value,
      [&](int64_t v) {
        Probe p;
        auto planned = plan_at(v);
        if (!planned.ok()) {
          p.error = absl::StrCat(request.vary, "=", v, ": ", planned.status().message());
        } else {
          p.feasible = planned->second.feasible;
        }
        return p;
      },
      &row.note);
  // Plan again at the answer (the search keeps no plans, to bound memory).
  if (row.value.has_value()) {
    ASSIGN_OR_RETURN(auto planned, plan_at(*row.value));
    row.graph = std::move(planned.first);
    row.plan = std::move(planned.second);
    row.note.clear();
  } else if (row.note.empty()) {
    row.note = absl::StrCat("does not fit even at ", request.vary, "=", request.start);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> ParseFitBudget(absl::string_view text) {
  ASSIGN_OR_RETURN(BudgetSpec spec, ParseBudget(text));
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
  auto build = [&](int64_t value) {
    ModelSpec s = request.model;
    s.params[request.vary] = absl::StrCat(value);
    absl::StatusOr<Graph> g = BuildModel(s, request.cost);
    if (!g.ok() || !request.prepare_graph) return g;
    return request.prepare_graph(*g);
  };
  RETURN_IF_ERROR(build(request.start).status());
  ASSIGN_OR_RETURN(std::vector<std::string> policies,
                   PolicyList(request.policies, [](const std::string& name) {
                     return name != "exact" && name != "exact-order" && name != "checkmate";
                   }));
  PlannerOptions options = request.options;
  options.budget_bytes = request.budget_bytes;

  FitResult fit;
  fit.naive_value = LargestFeasible(
      request.start, request.max_value,
      [&](int64_t v) {
        Probe p;
        absl::StatusOr<Graph> g = build(v);
        if (!g.ok()) {
          p.error = std::string(g.status().message());
          return p;
        }
        const NodeId input = g->Find("input");
        if (input == kNoNode) {
          p.error = "the model has no node 'input'";
          return p;
        }
        p.feasible = 26 * g->bytes(input) <= request.budget_bytes;
        return p;
      },
      &fit.naive_note);

  if (request.jobs < 0) return absl::InvalidArgumentError("fit: jobs must be 0 or more");
  fit.rows.resize(policies.size());
  std::vector<absl::Status> failures(policies.size());
  ForEachIndex(policies.size(), request.jobs, [&](size_t k) {
    failures[k] = FitPolicy(request, policies[k], options, build, fit.rows[k]);
  });
  for (const absl::Status& failure : failures) RETURN_IF_ERROR(failure);
  return fit;
}

nlohmann::json FitRowJson(const FitRow& row) {
  nlohmann::json j = {{"policy", row.policy}, {"kind", row.kind},
                      {"baseline", row.policy == "baseline"}};
  if (row.value.has_value()) {
    j["value"] = *row.value;
    j["model"] = row.graph->name();
    j["predicted_peak_bytes"] = row.plan->report.peak_bytes;
    j["overhead"] = row.plan->report.overhead;
    j["transfer_bytes"] = row.plan->report.transfer_bytes;
  } else {
    j["value"] = nullptr;
  }
  if (!row.note.empty()) j["note"] = row.note;
  return j;
}

}  // namespace pebble
