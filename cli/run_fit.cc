// pebble fit: for each policy, the largest value of a model parameter whose
// training step fits a memory budget (the seed report's 3-D experiment).
//
// Search: the predicted peak of a plan is assumed to grow with the
// parameter (true of every size parameter of the zoo under a fixed policy:
// each tensor's bytes grow with it; a heuristic planner could in principle
// find a better plan at a larger size, which the search would miss). Under
// that assumption an exponential search (1, 2, 4, ...) finds a feasible
// value and an infeasible one, and a binary search between them the largest
// feasible value: O(log n) plans per policy.
#include <cmath>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/common.h"
#include "scheduler/offload.h"
#include "cli/run_common.h"
#include "graph/models/models.h"
#include "graph/status.h"
#include "runtime/executor.h"
#include "runtime/make_backend.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"

namespace pebble::cli {
namespace {

// The policies fit tries when --policies is not given: every registered
// one except the exact searches whose cost explodes with the graph
// (exact, exact-order, checkmate), which --policies can still name.
bool InDefaultSet(const std::string& name) {
  return name != "exact" && name != "exact-order" && name != "checkmate";
}

struct FitFlags {
  std::string model;
  std::string vary;
  std::string budget;
  std::string policies;  // empty: the default set
  std::string backend = "cpu";
  std::string bandwidth;  // empty: the profile's, else 25e9
  double throughput_flops_per_s = 10e12;
  double time_limit_s = 10;
  int64_t start = 1;
  int64_t max_value = 0;  // 0: the model's own limit
  uint64_t seed = 0;
  bool verify = false;
  bool json = false;
};

struct Probe {
  bool feasible = false;
  std::string error;  // the model or the planner refused this value
};

// The largest v in [start, max] with probe(v).feasible, assuming
// monotonicity; nullopt when probe(start) is not feasible.
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
    int64_t next = lo * 2;
    if (max_value > 0) next = std::min(next, max_value);
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

struct FitRow {
  std::string policy;
  std::string kind;
  std::optional<int64_t> value;
  std::optional<Graph> graph;
  std::optional<PlanResult> plan;
  std::string note;
  // --verify
  std::optional<ExecutionResult> measured;
  std::string verify_error;
};

int RunFit(const FitFlags& f) {
  auto spec = ParseModelSpec(f.model);
  if (!spec.ok()) return Fail(spec.status());
  auto budget_spec = ParseBudget(f.budget);
  if (!budget_spec.ok()) return Fail(budget_spec.status());
  if (budget_spec->kind != BudgetSpec::Kind::kBytes) {
    return Fail(absl::InvalidArgumentError(
        "fit needs a budget in bytes (e.g. 2GiB): a percentage or 'min' changes with the "
        "parameter"));
  }
  const int64_t budget = budget_spec->bytes;
  auto bandwidth = ParseBandwidth(f.bandwidth.empty() ? "25e9" : f.bandwidth);
  if (!bandwidth.ok()) return Fail(bandwidth.status());
  if (f.start < 1) return Fail(absl::InvalidArgumentError("--start must be at least 1"));
  if (f.max_value != 0 && f.max_value < f.start) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--max ", f.max_value, " is below --start ", f.start, "; nothing to try")));
  }
  CostModel cost;
  cost.device_flops_per_s = f.throughput_flops_per_s;

  auto build = [&](int64_t value) {
    ModelSpec s = *spec;
    s.params[f.vary] = absl::StrCat(value);
    return BuildModel(s, cost);
  };
  {
    auto first = build(f.start);
    if (!first.ok()) return Fail(first.status());
  }

  std::vector<std::string> policies;
  if (f.policies.empty() || f.policies == "all") {
    for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
      if (f.policies == "all" || InDefaultSet(p->name)) policies.push_back(p->name);
    }
  } else {
    policies = absl::StrSplit(f.policies, ',', absl::SkipWhitespace());
    for (const std::string& p : policies) {
      if (PlannerRegistry::Global().Find(p) == nullptr) return Fail(MakePlanner(p).status());
    }
  }
  PlannerOptions options;
  options.budget_bytes = budget;
  options.host_bandwidth_bytes_per_s = *bandwidth;
  options.time_limit_s = f.time_limit_s;

  // The seed report's estimate: activations and gradients take about 26
  // times the input, so the largest value with 26 x bytes(input) <= budget.
  std::string naive_error;
  std::optional<int64_t> naive = LargestFeasible(
      f.start, f.max_value,
      [&](int64_t v) {
        Probe p;
        auto g = build(v);
        if (!g.ok()) {
          p.error = std::string(g.status().message());
          return p;
        }
        const NodeId input = g->Find("input");
        if (input == kNoNode) {
          p.error = "the model has no node 'input'";
          return p;
        }
        p.feasible = 26 * g->bytes(input) <= budget;
        return p;
      },
      &naive_error);

  std::vector<FitRow> rows;
  for (const std::string& name : policies) {
    FitRow row;
    row.policy = name;
    const PolicyInfo* info = PlannerRegistry::Global().Find(name);
    row.kind = std::string(PlanKindName(info->kind));
    auto planner = info->factory();
    row.value = LargestFeasible(
        f.start, f.max_value,
        [&](int64_t v) {
          Probe p;
          auto g = build(v);
          if (!g.ok()) {
            p.error = absl::StrCat(f.vary, "=", v, ": ", g.status().message());
            return p;
          }
          auto plan = planner->Plan(*g, options);
          if (!plan.ok()) {
            p.error = absl::StrCat(f.vary, "=", v, ": ", plan.status().message());
            return p;
          }
          p.feasible = plan->feasible;
          return p;
        },
        &row.note);
    // Plan again at the answer (the search keeps no plans, to bound memory).
    if (row.value.has_value()) {
      auto g = build(*row.value);
      auto plan = g.ok() ? planner->Plan(*g, options) : absl::StatusOr<PlanResult>(g.status());
      if (!plan.ok()) return Fail(plan.status());
      row.graph = *std::move(g);
      row.plan = *std::move(plan);
      row.note.clear();
    } else if (row.note.empty()) {
      row.note = absl::StrCat("does not fit even at ", f.vary, "=", f.start);
    }
    rows.push_back(std::move(row));
  }

  if (f.verify) {
    // Fail early when the backend cannot be had at all.
    if (auto probe = MakeBackend(f.backend); !probe.ok()) return Fail(probe.status());
    for (FitRow& row : rows) {
      if (!row.value.has_value()) continue;
      // A backend per row: its memory high-water marks (device_peak_bytes,
      // scratch_bytes) then describe this row's run alone.
      auto backend = MakeBackend(f.backend);
      if (!backend.ok()) return Fail(backend.status());
      ExecutorOptions eo;
      eo.seed = f.seed;
      eo.simulator.host_bandwidth_bytes_per_s = options.host_bandwidth_bytes_per_s;
      eo.download_outputs = false;
      if (!f.json) {
        std::cerr << absl::StrFormat("fit: running %s at %s=%d on %s...\n", row.policy, f.vary,
                                     *row.value, f.backend);
      }
      auto r = Execute(*row.graph, row.plan->schedule, **backend, eo);
      if (r.ok()) {
        row.measured = *std::move(r);
      } else {
        row.verify_error = std::string(r.status().message());
      }
    }
  }

  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const FitRow& row : rows) {
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
      if (row.measured.has_value()) {
        nlohmann::json m = MeasuredToJson(*row.graph, *row.measured, /*with_steps=*/false);
        m["peak_equal"] = row.measured->peak_bytes == row.plan->report.peak_bytes;
        j["measured"] = std::move(m);
      }
      if (!row.verify_error.empty()) j["verify_error"] = row.verify_error;
      out.push_back(std::move(j));
    }
    nlohmann::json doc = {{"model", spec->ToString()},
                          {"vary", f.vary},
                          {"budget", f.budget},
                          {"budget_bytes", budget},
                          {"search", "exponential then binary over the predicted peak; "
                                     "assumes the peak grows with the parameter"},
                          {"naive", {{"rule", "26 x bytes(input) <= budget"}}},
                          {"results", out}};
    if (naive.has_value()) {
      doc["naive"]["value"] = *naive;
    } else {
      doc["naive"]["value"] = nullptr;
      if (!naive_error.empty()) doc["naive"]["note"] = naive_error;
    }
    if (f.verify) doc["backend"] = f.backend;
    PrintJson(doc);
    return 0;
  }

  std::cout << absl::StrFormat("fit %s: the largest %s whose training step fits %s (%d bytes)\n\n",
                               spec->ToString(), f.vary, FormatBytes(budget), budget);
  std::vector<std::string> header = {"policy", "kind", f.vary, "predicted peak", "overhead",
                                     "transferred"};
  if (f.verify) {
    header.push_back("measured peak");
    header.push_back("equal");
    header.push_back("time");
  }
  header.push_back("note");
  Table t(header);
  {
    std::vector<std::string> cells = {"naive (26 x input)", "estimate",
                                      naive ? absl::StrCat(*naive) : "-", "", "", ""};
    if (f.verify) cells.insert(cells.end(), {"", "", ""});
    cells.push_back(naive ? "" : naive_error);
    t.AddRow(cells);
  }
  for (const FitRow& row : rows) {
    std::vector<std::string> cells = {row.policy == "baseline" ? "baseline *" : row.policy,
                                      row.kind};
    if (row.value.has_value()) {
      const PlanReport& r = row.plan->report;
      cells.push_back(absl::StrCat(*row.value));
      cells.push_back(FormatBytes(r.peak_bytes));
      // A one-shot plan's overhead is 0 up to rounding; print no "-0.0%".
      cells.push_back(absl::StrFormat("%.1f%%", std::abs(r.overhead) < 5e-4 ? 0.0 : 100 * r.overhead));
      cells.push_back(FormatBytes(r.transfer_bytes));
    } else {
      cells.insert(cells.end(), {"-", "", "", ""});
    }
    if (f.verify) {
      if (row.measured.has_value()) {
        cells.push_back(FormatBytes(row.measured->peak_bytes));
        cells.push_back(row.measured->peak_bytes == row.plan->report.peak_bytes ? "yes" : "NO");
        cells.push_back(absl::StrFormat("%.3f s", row.measured->time_s));
      } else {
        cells.insert(cells.end(), {"", "", ""});
      }
    }
    std::string note = !row.verify_error.empty() ? row.verify_error : row.note;
    if (note.size() > 72) note = note.substr(0, 69) + "...";  // the JSON has it whole
    cells.push_back(note);
    t.AddRow(cells);
  }
  std::cout << t.ToString();
  std::cout << "\n* baseline: the graph's own order, every tensor freed at its last use (what a "
               "framework runs).\n"
               "naive: the largest value with 26 x bytes(input) <= budget (the seed report's "
               "rule of thumb).\n"
               "Search: exponential then binary over the predicted peak, assuming it grows with "
               "the parameter.\n";
  return 0;
}

}  // namespace

void AddFitCommand(CLI::App& app, int& exit_code) {
  static FitFlags flags;
  auto* fit = app.add_subcommand(
      "fit",
      "for each policy, the largest model parameter (n, batch) whose training step fits a "
      "budget\n"
      "  e.g. pebble fit --model conv3d --vary n --budget 2GiB\n"
      "       pebble fit --model resnet18:image=64 --vary batch --budget 1GiB --policies "
      "baseline,rotor --verify");
  fit->add_option("--model,-m", flags.model, "model with fixed parameters, e.g. conv3d:batch=1")
      ->required();
  fit->add_option("--vary", flags.vary, "the integer parameter to search (n, batch, ...)")
      ->required();
  fit->add_option("--budget,-b", flags.budget, "device memory budget in bytes (2GiB)")
      ->required();
  fit->add_option("--policies", flags.policies,
                  "comma-separated policies; default: every policy but the exact searches "
                  "(exact, exact-order, checkmate); 'all': every one");
  fit->add_flag("--verify", flags.verify,
                "run each policy's largest value on the backend and compare the measured peak");
  fit->add_option("--backend", flags.backend, "backend for --verify")->capture_default_str();
  fit->add_option("--seed", flags.seed, "seed of generated inputs for --verify")
      ->check(IntegerIn(0, INT64_MAX));
  fit->add_option("--start", flags.start, "smallest value tried (default 1)")
      ->check(IntegerIn(1, INT64_MAX));
  fit->add_option("--max", flags.max_value,
                  "largest value tried, at least --start (default: the model's limit)")
      ->check(IntegerIn(1, INT64_MAX));
  fit->add_option("--throughput", flags.throughput_flops_per_s,
                  "FLOP/s of the cost model (default 10e12)")
      ->check(NumberAbove(0, "a positive number of FLOP/s"));
  fit->add_option("--bandwidth", flags.bandwidth, "host link bytes/s, or pcie4 (25e9, the default), pcie5, nvlink-c2c");
  fit->add_option("--time-limit", flags.time_limit_s,
                  "seconds an exact or MILP planner may search per plan (default 10)")
      ->check(NumberAbove(0, "a positive number of seconds"));
  fit->add_flag("--json", flags.json, "print one JSON document");
  fit->callback([&exit_code] { exit_code = RunFit(flags); });
}

}  // namespace pebble::cli
