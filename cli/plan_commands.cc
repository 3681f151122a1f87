// pebble plan | simulate | compare
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdlib.h>  // mkdtemp
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/common.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/budget.h"
#include "scheduler/memory_layout.h"
#include "scheduler/offload.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"

namespace pebble::cli {
namespace {

// Options shared by plan and compare.
struct PlanFlags {
  GraphSource source;
  std::string policy = "best-order";  // the default one-shot policy
  CLI::Option* policy_option = nullptr;  // unset: DefaultPolicy() picks
  std::string budget = "100%";
  std::string bandwidth;  // empty: the profile's, else 25e9
  std::string host_budget;  // empty: unlimited
  double time_limit_s = 60;
  uint64_t seed = 0;
  bool own_order = false;
  int milp_max_stages = 0;
  bool quiet = false;
  bool json = false;

  void AddOptions(CLI::App* cmd, bool with_policy_and_budget) {
    source.AddOptions(cmd);
    if (with_policy_and_budget) {
      policy_option = cmd->add_option(
          "--policy,-p", policy,
          "planner (see 'pebble policies'), or exec:PROGRAM: a policy outside pebble that "
          "reads the graph and options as JSON on stdin and writes a schedule on stdout "
          "(docs/library.md); default: best-order when the budget is at least "
          "the baseline peak, else hybrid (recompute or swap)")
          ->check(PolicyName());
      cmd->add_option("--budget,-b", budget,
                      "device memory budget: whole bytes or a size with units (8GiB, 1.5e9; a "
                      "fraction of a unit rounds down to whole bytes), a percentage of the "
                      "baseline peak (60%) or 'min' (the lowest peak the policy reaches)")
          ->capture_default_str()
          ->check(BudgetValue());
    }
    cmd->add_option("--bandwidth", bandwidth,
                    "host link bytes/s for offload timing, or a preset: pcie4 (25e9, the "
                    "default), pcie5 (55e9), nvlink-c2c (450e9)")
        ->check(BandwidthValue());
    cmd->add_option("--host-budget", host_budget, "host memory limit for offloaded copies")
        ->check(SizeValue());
    cmd->add_option("--time-limit", time_limit_s,
                    "seconds any planner may search (default 60); past it the best "
                    "valid plan found so far, the cut noted in the message")
        ->check(NumberAbove(0, "a positive number of seconds"));
    cmd->add_option("--seed", seed, "seed of randomised planners (default 0)")
        ->check(IntegerIn(0, INT64_MAX));
    AddOwnOrderFlag(cmd, own_order);
    cmd->add_option("--milp-max-stages", milp_max_stages,
                    "largest graph (needed non-persistent nodes) checkmate's MILP and "
                    "checkmate-lp's LP take (default 0: 300 and 600; the model grows as n^2)")
        ->check(IntegerIn(0, 100000));
    AddQuietFlag(cmd, quiet);
    cmd->add_flag("--json", json, "print one JSON document");
  }

  // Fills the budget-independent options.
  absl::StatusOr<PlannerOptions> Options() const {
    PlannerOptions o;
    ASSIGN_OR_RETURN(o.host_bandwidth_bytes_per_s, source.PlannerBandwidth(bandwidth));
    if (!host_budget.empty()) {
      ASSIGN_OR_RETURN(int64_t hb, ParseSize(host_budget));
      o.host_budget_bytes = hb;
    }
    o.time_limit_s = time_limit_s;
    o.seed = seed;
    o.own_order = own_order;
    o.milp_max_stages = milp_max_stages;
    if (!json && !quiet) o.progress = StderrProgress();
    return o;
  }
};

std::string Seconds(double s) { return absl::StrFormat("%.6g", s); }

// The human summary of a report, shared by plan and simulate.
void PrintReport(const Graph& g, const Schedule& schedule, const PlanReport& r) {
  std::string peak_at =
      r.peak_step < 0 ? "before the first step"
                      : absl::StrCat("at step ", r.peak_step, " (",
                                     ActionName(schedule.steps[r.peak_step].action), " ",
                                     g.id(schedule.steps[r.peak_step].node), ")");
  std::cout << absl::StrFormat("  peak memory     %s (%d bytes) %s\n", FormatBytes(r.peak_bytes),
                               r.peak_bytes, peak_at)
            << absl::StrFormat("  persistent      %s\n", FormatBytes(r.initial_bytes))
            << absl::StrFormat("  compute cost    %s (base %s, overhead %s, %d recomputations)\n",
                               Seconds(r.compute_cost), Seconds(r.base_cost),
                               OverheadPercent(r.overhead), r.recomputations)
            << (r.transfer_bytes > 0
                    ? absl::StrFormat(
                          "  transfers       %s (%d bytes), host peak %s, copy stream busy %s, "
                          "exposed transfer time %s\n",
                          FormatBytes(r.transfer_bytes), r.transfer_bytes,
                          FormatBytes(r.host_peak_bytes), Seconds(r.copy_busy),
                          Seconds(r.exposed_transfer_time))
                    : std::string("  transfers       none\n"))
            << absl::StrFormat("  makespan        %s (compute stream busy %s)\n",
                               Seconds(r.makespan), Seconds(r.compute_busy))
            << absl::StrFormat("  steps           %d (%s)\n", r.num_steps,
                               r.one_shot ? "one-shot" : "multi-shot");
}

void PrintTimeline(const Graph& g, const Schedule& schedule, const PlanReport& r) {
  Table t({"step", "action", "node", "device", "during", "host", "start", "end"});
  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    const StepRecord& s = r.timeline[k];
    t.AddRow({absl::StrCat(k), std::string(ActionName(schedule.steps[k].action)),
              g.id(schedule.steps[k].node), FormatBytes(s.device_bytes),
              FormatBytes(s.peak_bytes), FormatBytes(s.host_bytes), Seconds(s.start),
              Seconds(s.end)});
  }
  std::cout << "\n" << t.ToString();
}

int RunPlan(const PlanFlags& f, bool timeline, bool with_layout, const std::string& schedule_out,
            bool force) {
  // Before planning, which may take long: a refused --schedule-out fails now.
  if (absl::Status s = CheckOutputs({{schedule_out, "--schedule-out"}}, f.source.InputFiles(),
                                    force);
      !s.ok()) {
    return Fail(s);
  }
  WorkspaceQueryStats workspace;
  auto graph = f.source.Load(&workspace);
  if (!graph.ok()) return Fail(graph.status());
  PlanRequest request;
  auto options = f.Options();
  if (!options.ok()) return Fail(options.status());
  request.options = *options;
  request.budget = f.budget;
  // Without --policy: the library's default (best-order when the baseline
  // fits, else hybrid).
  if (f.policy_option == nullptr || f.policy_option->count() > 0) request.policy = f.policy;
  auto outcome = PlanGraph(*graph, request);
  if (!outcome.ok()) return Fail(outcome.status());
  const PlanResult& result = outcome->result;
  if (!schedule_out.empty()) {
    absl::Status w =
        WriteOutput(schedule_out, ScheduleToJson(*graph, result.schedule).dump(2) + "\n", force);
    if (!w.ok()) return Fail(w);
  }
  if (f.json) {
    nlohmann::json doc = PlanDocument(*graph, *outcome, f.source.Label(), timeline, with_layout);
    if (!f.source.workspace_backend.empty()) {
      doc["workspace"] = WorkspaceStatsToJson(f.source.workspace_backend, workspace);
    }
    PrintJson(doc);
    return 0;
  }
  const bool is_min = outcome->budget_is_min;
  std::cout << absl::StrFormat(
      "plan %s with %s, budget %s = %s (baseline peak %s): %s\n", f.source.Label(),
      outcome->policy, f.budget, is_min ? "min" : FormatBytes(outcome->budget_bytes),
      FormatBytes(outcome->baseline_peak_bytes), result.feasible ? "fits" : "DOES NOT FIT");
  if (!result.message.empty()) std::cout << "  " << result.message << "\n";
  if (!f.source.workspace_backend.empty()) {
    std::cout << "  workspace       "
              << WorkspaceStatsLine(f.source.workspace_backend, workspace) << "\n";
  }
  PrintReport(*graph, result.schedule, result.report);
  if (result.details.contains("tensors")) {
    const nlohmann::json& c = result.details["tensors"]["counts"];
    std::cout << absl::StrFormat(
        "  tensors         %d kept, %d swapped, %d recomputed, %d swapped and recomputed\n",
        c.value("kept", int64_t{0}), c.value("swapped", int64_t{0}),
        c.value("recomputed", int64_t{0}), c.value("swapped_and_recomputed", int64_t{0}));
  }
  const MemoryLayout& layout = outcome->layout;
  std::cout << absl::StrFormat("  arena           %s (%d bytes, +%.2f%% over the peak, %s layout)\n",
                               FormatBytes(layout.arena_bytes), layout.arena_bytes,
                               100 * layout.fragmentation, layout.strategy)
            << absl::StrFormat("  plan time       %.3f s\n", outcome->plan_time_s);
  if (timeline) PrintTimeline(*graph, result.schedule, result.report);
  if (schedule_out.empty() && !timeline) {
    std::cout << "(--timeline shows every step; --schedule-out FILE writes the schedule; "
                 "--json prints both)\n";
  }
  return 0;
}

int RunSimulate(const GraphSource& source, const std::string& schedule_path,
                const std::string& bandwidth, bool timeline, bool json) {
  auto graph = source.Load();
  if (!graph.ok()) return Fail(graph.status());
  auto schedule = ReadScheduleFile(*graph, schedule_path);
  if (!schedule.ok()) return Fail(schedule.status());
  auto bw = source.PlannerBandwidth(bandwidth);
  if (!bw.ok()) return Fail(bw.status());
  SimulatorOptions options;
  options.host_bandwidth_bytes_per_s = *bw;
  auto report = Simulate(*graph, *schedule, options);
  if (!report.ok()) return Fail(report.status());
  if (json) {
    PrintJson({{"graph", source.Label()},
               {"schedule", schedule_path},
               {"valid", true},
               {"report", ReportToJson(*report, *graph, *schedule, timeline)}});
    return 0;
  }
  std::cout << "schedule " << schedule_path << " on " << source.Label() << ": valid\n";
  PrintReport(*graph, *schedule, *report);
  if (timeline) PrintTimeline(*graph, *schedule, *report);
  return 0;
}

// One (peak, makespan over the baseline's) point of a feasible plan, for
// the Pareto plot: makespan, so that an offload plan's exposed transfers
// count (its compute overhead is 0).
struct ParetoPoint {
  std::string policy;
  int64_t peak_bytes = 0;
  double slowdown = 0;  // makespan / base_cost - 1
};

// Draws overhead against peak per policy with gnuplot (when it is installed)
// into `png_path`. The points, the script and the picture go through a
// private temporary directory, removed afterwards, so nothing beside
// `png_path` is written; the picture is then written to `png_path` by
// WriteOutput, which reports a write that fails (gnuplot itself exits 0 when
// it cannot write its output).
absl::Status WriteParetoPlot(const std::string& title, std::vector<ParetoPoint> points,
                             const std::string& png_path, bool force) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError(
        "--plot needs gnuplot (Debian: apt-get install gnuplot-nox); the table was printed");
  }
  RETURN_IF_ERROR(CheckOutputPath(png_path, force));
  std::stable_sort(points.begin(), points.end(), [](const ParetoPoint& a, const ParetoPoint& b) {
    return a.policy != b.policy ? a.policy < b.policy : a.peak_bytes < b.peak_bytes;
  });
  // gnuplot single-quoted strings escape a quote by doubling it.
  auto quoted = [](const std::string& text) {
    std::string out;
    for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out;
  };
  std::string work_template =
      (std::filesystem::temp_directory_path() / "pebble-plot-XXXXXX").string();
  if (mkdtemp(work_template.data()) == nullptr) {
    return absl::InternalError("--plot: cannot create a temporary directory");
  }
  const std::filesystem::path work_dir = work_template;
  struct RemoveDir {
    std::filesystem::path dir;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{work_dir};
  const std::string data_path = (work_dir / "points.dat").string();
  const std::string script_path = (work_dir / "plot.gp").string();
  const std::string picture_path = (work_dir / "plot.png").string();
  std::string data, plots;
  int block = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    if (i > 0 && points[i].policy != points[i - 1].policy) data += "\n\n";
    if (i == 0 || points[i].policy != points[i - 1].policy) {
      if (block > 0) plots += ", ";
      plots += absl::StrFormat("'%s' index %d using 1:2 with linespoints title '%s'", quoted(data_path),
                               block++, points[i].policy);
    }
    data += absl::StrFormat("%.6f %.6f\n", static_cast<double>(points[i].peak_bytes) / (1 << 20),
                            100 * points[i].slowdown);
  }
  if (block == 0) return absl::FailedPreconditionError("--plot: no feasible plan to draw");
  const std::string script = absl::StrFormat(
      "set terminal pngcairo size 1000,650\nset output '%s'\nset title '%s'\n"
      "set xlabel 'peak memory (MiB)'\nset ylabel 'makespan over the baseline (+%%)'\n"
      "set key outside right\nset grid\nplot %s\n",
      quoted(picture_path), quoted(Printable(title)), plots);
  RETURN_IF_ERROR(WriteOutput(data_path, data, /*force=*/false));
  RETURN_IF_ERROR(WriteOutput(script_path, script, /*force=*/false));
  std::string shell_path;  // POSIX shell single quotes: ' becomes '\''
  for (char c : script_path) shell_path += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string command = "gnuplot '" + shell_path + "' >/dev/null 2>&1";
  absl::StatusOr<std::string> picture = absl::UnknownError("gnuplot did not run");
  if (std::system(command.c_str()) == 0) picture = ReadBoundedFile(picture_path, "plot", 1 << 30);
  if (!picture.ok() || picture->empty()) {
    return absl::InternalError(absl::StrCat("gnuplot failed to draw ", Quote(png_path)));
  }
  return WriteOutput(png_path, *picture, force);
}

int RunCompare(const PlanFlags& f, const std::string& budgets_text,
               const std::string& policies_text, std::string format,
               const std::string& plot_path, bool force, int jobs) {
  if (f.json) format = "json";
  // Before planning, which may take long: a refused --plot path fails now.
  if (absl::Status s = CheckOutputs({{plot_path, "--plot"}}, f.source.InputFiles(), force);
      !s.ok()) {
    return Fail(s);
  }
  auto graph = f.source.Load();
  if (!graph.ok()) return Fail(graph.status());
  CompareRequest request;
  request.jobs = jobs;
  auto options = f.Options();
  if (!options.ok()) return Fail(options.status());
  request.options = *options;
  request.budgets = absl::StrSplit(budgets_text, ',', absl::SkipWhitespace());
  if (request.budgets.empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--budgets ", Quote(budgets_text), " names no budget")));
  }
  if (!policies_text.empty() && policies_text != "all") {
    request.policies = absl::StrSplit(policies_text, ',', absl::SkipWhitespace());
    if (request.policies.empty()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--policies ", Quote(policies_text), " names no policy")));
    }
  }
  auto comparison = Compare(*graph, request);
  if (!comparison.ok()) return Fail(comparison.status());

  std::vector<ParetoPoint> pareto;
  Table table({"policy", "budget", "budget_bytes", "fits", "peak_bytes", "peak", "vs_optimal",
               "overhead", "recomputations", "transfer_bytes", "host_peak_bytes", "makespan",
               "makespan_x", "exposed", "plan_ms", "note"});
  for (const CompareEntry& e : comparison->entries) {
    const bool is_min = e.budget_bytes == kMinBudgetBytes;
    const std::string ms = absl::StrFormat("%.1f", 1e3 * e.plan_time_s);
    if (!e.result.ok()) {
      table.AddRow({e.policy, e.budget, is_min ? "" : absl::StrCat(e.budget_bytes), "error", "",
                    "", "", "", "", "", "", "", "", "", ms,
                    std::string(e.result.status().message())});
      continue;
    }
    const PlanReport& r = e.result->report;
    std::string ratio;
    if (comparison->optimal_order_peak_bytes.value_or(0) > 0) {
      ratio = absl::StrFormat("%.3f", static_cast<double>(r.peak_bytes) /
                                          static_cast<double>(*comparison->optimal_order_peak_bytes));
    }
    const double slowdown = MakespanOverBaseline(r);
    if (e.result->feasible) pareto.push_back({e.policy, r.peak_bytes, slowdown - 1});
    table.AddRow({e.policy, e.budget, is_min ? "" : absl::StrCat(e.budget_bytes),
                  e.result->feasible ? "yes" : "no", absl::StrCat(r.peak_bytes),
                  FormatBytes(r.peak_bytes), ratio, OverheadPercent(r.overhead),
                  absl::StrCat(r.recomputations), absl::StrCat(r.transfer_bytes),
                  absl::StrCat(r.host_peak_bytes), Seconds(r.makespan),
                  absl::StrFormat("%.3f", slowdown), Seconds(r.exposed_transfer_time), ms,
                  e.result->feasible ? "" : e.result->message});
  }
  if (format == "json") {
    PrintJson(CompareDocument(*graph, *comparison, f.source.Label()));
  } else if (format == "csv") {
    std::cout << table.ToCsv();
  } else {
    std::cout << "compare " << f.source.Label() << " (baseline peak "
              << FormatBytes(comparison->baseline_peak_bytes) << ")\n\n"
              << table.ToString();
    if (comparison->optimal_order_peak_bytes) {
      std::cout << "\nvs_optimal: peak over the minimal one-shot peak found by exact-order ("
                << FormatBytes(*comparison->optimal_order_peak_bytes) << ").\n";
    }
  }
  if (!plot_path.empty()) {
    absl::Status plotted = WriteParetoPlot(f.source.Label(), pareto, plot_path, force);
    if (!plotted.ok()) return Fail(plotted);
  }
  return 0;
}

}  // namespace

void AddPlanCommands(CLI::App& app, int& exit_code) {
  static PlanFlags plan_flags;
  static bool plan_timeline = false, plan_force = false, plan_layout = false;
  static std::string plan_schedule_out;
  auto* plan = app.add_subcommand(
      "plan",
      "plan a graph under a policy and a memory budget; prints the simulator's figures\n"
      "  e.g. pebble plan --model conv3d:n=128 --policy baseline --budget 100% --json");
  plan_flags.AddOptions(plan, true);
  plan_flags.source.AddWorkspaceBackendOption(plan);
  plan->add_flag("--timeline", plan_timeline, "show (or put in the JSON) the per-step memory "
                                              "and time");
  plan->add_flag("--layout", plan_layout,
                 "put every tensor's arena offset and lifetime in the JSON");
  plan->add_option("--schedule-out", plan_schedule_out,
                   "also write the schedule to this file (not one the command reads)")
      ->check(NotStdout("the schedule"));
  plan->add_flag("--force", plan_force, "replace an existing --schedule-out file");
  plan->callback([&exit_code] {
    exit_code = RunPlan(plan_flags, plan_timeline, plan_layout, plan_schedule_out, plan_force);
  });

  static GraphSource sim_source;
  static std::string sim_schedule, sim_bandwidth;
  static bool sim_timeline = false, sim_json = false;
  auto* sim = app.add_subcommand(
      "simulate",
      "validate a schedule file against a graph and report its peak, cost and makespan\n"
      "  e.g. pebble simulate --graph g.json --schedule s.json --timeline");
  sim_source.AddOptions(sim);
  sim_source.AddWorkspaceBackendOption(sim);
  sim->add_option("--schedule,-s", sim_schedule, "schedule file (pebble-schedule JSON)")
      ->required();
  sim->add_option("--bandwidth", sim_bandwidth,
                  "host link bytes/s or a preset: pcie4 (25e9, the default), pcie5, nvlink-c2c")
      ->check(BandwidthValue());
  sim->add_flag("--timeline", sim_timeline, "show the per-step memory and time");
  sim->add_flag("--json", sim_json, "print JSON");
  sim->callback([&exit_code] {
    exit_code = RunSimulate(sim_source, sim_schedule, sim_bandwidth, sim_timeline, sim_json);
  });

  static PlanFlags cmp_flags;
  static std::string cmp_budgets = "100%,80%,60%,40%,min", cmp_policies = "all",
                     cmp_format = "table", cmp_plot;
  static bool cmp_force = false;
  static int cmp_jobs = 0;
  auto* cmp = app.add_subcommand(
      "compare",
      "every policy at every budget, as a table, CSV or JSON\n"
      "  e.g. pebble compare --model resnet18:batch=8 --budgets 100%,60%,min --format csv");
  cmp_flags.AddOptions(cmp, false);
  cmp_flags.source.AddWorkspaceBackendOption(cmp);
  cmp->add_option("--budgets", cmp_budgets, "comma-separated budgets")
      ->capture_default_str()
      ->check(BudgetList());
  cmp->add_option("--policies", cmp_policies,
                  "comma-separated policies, or 'all' (every registered one); "
                  "exec:PROGRAM runs a policy outside pebble (docs/library.md)")
      ->capture_default_str()
      ->check(PolicyList());
  cmp->add_option("--format,-f", cmp_format, "table, csv or json")->capture_default_str()
      ->check(CLI::IsMember({"table", "csv", "json"}));
  cmp->add_option("--plot", cmp_plot,
                  "also draw the Pareto curve (overhead against peak, feasible plans) as a PNG "
                  "with gnuplot")
      ->check(NotStdout("the plot"));
  cmp->add_flag("--force", cmp_force, "replace an existing --plot file");
  cmp->add_option("--jobs,-j", cmp_jobs,
                  "plans made at once (default 0: one per hardware thread; 1: one after the "
                  "other). The plans are the same, but a search cut by its time limit may "
                  "reach less, and plan_ms is measured under the sharing")
      ->check(IntegerIn(0, 4096));
  cmp->callback([&exit_code] {
    exit_code = RunCompare(cmp_flags, cmp_budgets, cmp_policies, cmp_format, cmp_plot, cmp_force,
                           cmp_jobs);
  });
}

}  // namespace pebble::cli
