// pebble plan | simulate | compare
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdlib.h>  // mkdtemp
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/common.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/budget.h"
#include "scheduler/collectives.h"
#include "scheduler/memory_layout.h"
#include "scheduler/offload.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"

namespace pebble::cli {
namespace {

constexpr char kBandwidthHelp[] =
    "host link bytes/s for offload timing, or a preset: pcie4 (25e9, the default), pcie5 "
    "(55e9), nvlink-c2c (450e9)";

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
  RankFlags rank_flags;

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
    cmd->add_option("--bandwidth", bandwidth, kBandwidthHelp)
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
    rank_flags.AddOptions(cmd, &source);
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
    RETURN_IF_ERROR(rank_flags.Apply(o));
    if (!json && !quiet) o.progress = StderrProgress();
    return o;
  }
};

// The human summary of a report, shared by plan and simulate; times in
// `unit`, the makespan said modelled or measured.
void PrintReport(const Graph& g, const Schedule& schedule, const PlanReport& r,
                 const CostUnit& unit) {
  std::string peak_at =
      r.peak_step < 0 ? "before the first step"
                      : absl::StrCat("at step ", r.peak_step, " (",
                                     ActionName(schedule.steps[r.peak_step].action), " ",
                                     Printable(g.id(schedule.steps[r.peak_step].node), 200),
                                     ")");
  std::cout << absl::StrFormat("  peak memory     %s (%d bytes) %s\n", FormatBytes(r.peak_bytes),
                               r.peak_bytes, peak_at)
            << absl::StrFormat("  persistent      %s\n", FormatBytes(r.initial_bytes))
            << absl::StrFormat("  compute cost    %s (base %s, overhead %s, %d recomputations%s)\n",
                               unit.Amount(r.compute_cost), unit.Amount(r.base_cost),
                               OverheadPercent(r.overhead), r.recomputations,
                               // (SPEC's base: every node's device cost; a host
                               // update's runs on the host stream instead)
                               r.host_compute_cost > 0
                                   ? "; the base counts the host updates' device cost"
                                   : "")
            << (r.transfer_bytes > 0
                    ? absl::StrFormat(
                          "  transfers       %s (%d bytes), host peak %s, copy stream busy %s, "
                          "exposed transfer time %s%s\n",
                          FormatBytes(r.transfer_bytes), r.transfer_bytes,
                          FormatBytes(r.host_peak_bytes), unit.Amount(r.copy_busy),
                          unit.Amount(r.exposed_transfer_time),
                          r.host_compute_cost > 0 ? " (with the host updates')" : "")
                    : std::string("  transfers       none\n"))
            << (r.host_compute_cost > 0
                    ? absl::StrFormat("  host updates    %s on the host stream (%d steps)\n",
                                      unit.Amount(r.host_compute_cost),
                                      CountSteps(schedule, Action::kHostCompute))
                    : std::string())
            << (r.collectives > 0
                    ? absl::StrFormat("  collectives     %d (%s) of %s, network busy %s\n",
                                      r.collectives, CollectivesText(g, schedule),
                                      FormatBytes(r.collective_bytes),
                                      unit.Amount(r.network_busy))
                    : std::string())
            << absl::StrFormat("  makespan        %s (compute stream busy %s)\n",
                               unit.Describe(r.makespan), unit.Amount(r.compute_busy))
            << absl::StrFormat("  steps           %d (%s)\n", r.num_steps,
                               r.one_shot ? "one-shot" : "multi-shot");
}

void PrintTimeline(const Graph& g, const Schedule& schedule, const PlanReport& r,
                   const CostUnit& unit) {
  Table t({"step", "action", "node", "device", "during", "host", "start", "end"});
  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    const StepRecord& s = r.timeline[k];
    t.AddRow({absl::StrCat(k), std::string(ActionName(schedule.steps[k].action)),
              g.id(schedule.steps[k].node), FormatBytes(s.device_bytes),
              FormatBytes(s.peak_bytes), FormatBytes(s.host_bytes), unit.Amount(s.start),
              unit.Amount(s.end)});
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
  auto graph = f.rank_flags.Sharded(f.source.Load(&workspace));
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
  // A plan that does not fit fails the command (exit 1), naming the least
  // peak the policy reaches (outcome->advice): the budget to try instead.
  // The plan is printed all the same (docs/cli.md), and no --schedule-out written.
  const std::string advice = !result.feasible && !schedule_out.empty()
                                 ? absl::StrCat(outcome->advice, " (--schedule-out not written)")
                                 : outcome->advice;
  if (!schedule_out.empty() && result.feasible) {
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
    return result.feasible ? 0 : Fail(absl::FailedPreconditionError(advice));
  }
  const bool is_min = outcome->budget_is_min;
  // (exact at min: the cheapest plan within 0.5% of its least peak, which
  // its details give)
  const int64_t least = result.details.value("min_peak_bytes", outcome->budget_bytes);
  std::cout << absl::StrFormat(
      "plan %s with %s, budget %s = %s (baseline peak %s): %s\n", f.source.Label(),
      outcome->policy, f.budget,
      !is_min                           ? FormatBytes(outcome->budget_bytes)
      : least < outcome->budget_bytes ? absl::StrCat(FormatBytes(outcome->budget_bytes),
                                                     ", within 0.5% of the least peak, ",
                                                     FormatBytes(least))
                                        : absl::StrCat("the least peak, ",
                                                       FormatBytes(outcome->budget_bytes)),
      FormatBytes(outcome->baseline_peak_bytes), result.feasible ? "fits" : "DOES NOT FIT");
  if (!result.message.empty()) std::cout << "  " << result.message << "\n";
  if (!f.source.workspace_backend.empty()) {
    std::cout << "  workspace       "
              << WorkspaceStatsLine(f.source.workspace_backend, workspace) << "\n";
  }
  PrintReport(*graph, result.schedule, result.report, f.source.Costs());
  if (result.details.contains("tensors")) {
    const nlohmann::json& c = result.details["tensors"]["counts"];
    std::cout << absl::StrFormat(
        "  tensors         %d kept, %d swapped, %d recomputed, %d swapped and recomputed\n",
        c.value("kept", int64_t{0}), c.value("swapped", int64_t{0}),
        c.value("recomputed", int64_t{0}), c.value("swapped_and_recomputed", int64_t{0}));
  }
  if (result.details.contains("state_placement")) {  // state=auto
    const nlohmann::json& p = result.details["state_placement"];
    const int streamed_parameters = p.value("streamed_parameters", 0);
    std::cout << absl::StrFormat(
        "  state placement %d tensors resident (%s), %d streamed from the host (%s)%s\n",
        p.value("resident_tensors", 0), FormatBytes(p.value("resident_bytes", int64_t{0})),
        p.value("streamed_tensors", 0), FormatBytes(p.value("streamed_bytes", int64_t{0})),
        streamed_parameters > 0 ? absl::StrCat(", ", streamed_parameters, " of them parameters")
                                : std::string());
  }
  const MemoryLayout& layout = outcome->layout;
  // The layout places the graph's tensors; buckets' device copies (a
  // runtime's own allocations) are not among them.
  const bool bucket_copies = result.details.contains("collectives") &&
                             result.details["collectives"].value("bucket_copies", "") == "device";
  std::cout << absl::StrFormat(
      "  arena           %s (%d bytes, +%.2f%% over the %speak, %s layout)\n",
      FormatBytes(layout.arena_bytes), layout.arena_bytes, 100 * layout.fragmentation,
      bucket_copies ? "tensors' " : "", layout.strategy);
  if (bucket_copies) {
    std::cout << "                  the buckets' device copies are not in it (peak memory "
                 "counts them)\n";
  }
  // The budget bounds the peak (docs/semantics.md); the one block that
  // holds every tensor at its offset may need more. (A plan over the budget
  // is over it by its peak already: its message says so.)
  if (!is_min && result.feasible && layout.arena_bytes > outcome->budget_bytes) {
    std::cout << ArenaOverBudgetNote(layout.arena_bytes, outcome->budget_bytes);
  }
  std::cout
            << absl::StrFormat("  plan time       %.3f s\n", outcome->plan_time_s);
  if (timeline) PrintTimeline(*graph, result.schedule, result.report, f.source.Costs());
  if (!result.feasible) {
    std::cout.flush();
    return Fail(absl::FailedPreconditionError(advice));
  }
  if (schedule_out.empty() && !timeline) {
    std::cout << "(--timeline shows every step; --schedule-out FILE writes the schedule; "
                 "--json prints both)\n";
  }
  return 0;
}

int RunSimulate(const GraphSource& source, const std::string& schedule_path,
                const std::string& bandwidth, const RankFlags& rank_flags, bool timeline,
                bool json) {
  auto graph = rank_flags.Sharded(source.Load());
  if (!graph.ok()) return Fail(graph.status());
  auto schedule = ReadScheduleFile(*graph, schedule_path);
  if (!schedule.ok()) return Fail(schedule.status());
  auto bw = source.PlannerBandwidth(bandwidth);
  if (!bw.ok()) return Fail(bw.status());
  SimulatorOptions options;
  options.host_bandwidth_bytes_per_s = *bw;
  options.ranks = rank_flags.ranks;
  auto link = rank_flags.Link();
  if (!link.ok()) return Fail(link.status());
  options.network = *link;
  if (absl::Status s = rank_flags.CheckBucketCopies(); !s.ok()) return Fail(s);
  options.device_bucket_copies = rank_flags.bucket_copies == "device";
  if (const int64_t sums = CountSteps(*schedule, Action::kAllReduce);
      sums > 0 && rank_flags.ranks < 2) {
    return Fail(UsageError(absl::StrCat(
        "--schedule ", Quote(schedule_path), " has ", sums, " all_reduce steps, a plan of "
        "several ranks: give --ranks N to time them (one rank sums nothing)")));
  }
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
  PrintReport(*graph, *schedule, *report, source.Costs());
  if (timeline) PrintTimeline(*graph, *schedule, *report, source.Costs());
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

// gnuplot's terminal for a picture at `path`, by its extension: .svg and
// .pdf as named, PNG otherwise (with a note on stderr where the extension
// names another format).
std::string PlotTerminal(const std::string& path) {
  const std::string extension =
      absl::AsciiStrToLower(std::filesystem::path(path).extension().string());
  if (extension == ".svg") return "svg size 1000,650";
  if (extension == ".pdf") return "pdfcairo size 10in,6.5in";
  if (!extension.empty() && extension != ".png") {
    std::cerr << "pebble: note: --plot " << Quote(path) << " is written as PNG (the format "
              << "follows the extension: .png, .svg or .pdf)\n";
  }
  return "pngcairo size 1000,650";
}

// Draws overhead against peak per policy with gnuplot (when it is installed)
// into `plot_path`. The points, the script and the picture go through a
// private temporary directory, removed afterwards, so nothing beside
// `plot_path` is written; the picture is then written to `plot_path` by
// WriteOutput, which reports a write that fails (gnuplot itself exits 0 when
// it cannot write its output).
absl::Status WriteParetoPlot(const std::string& title, std::vector<ParetoPoint> points,
                             const std::string& plot_path, bool force) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError(
        "--plot needs gnuplot (Debian: apt-get install gnuplot-nox); the table was printed");
  }
  RETURN_IF_ERROR(CheckOutputPath(plot_path, force));
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
  const std::string picture_path = (work_dir / "plot").string();
  // One plan many times slower than the rest (swap's, 19x the baseline's)
  // squashes every other line onto the axis: past 3x, the makespan's ratio
  // on a log scale instead of its excess in percent.
  double slowest = 0;
  for (const auto& p : points) slowest = std::max(slowest, p.slowdown);
  const bool log_scale = 1 + slowest > 3;
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
                            log_scale ? 1 + points[i].slowdown : 100 * points[i].slowdown);
  }
  if (block == 0) return absl::FailedPreconditionError("--plot: no feasible plan to draw");
  const std::string script = absl::StrFormat(
      "set terminal %s\nset output '%s'\nset title '%s'\n"
      "set xlabel 'peak memory (MiB)'\n%s"
      "set key outside right\nset grid\nplot %s\n",
      PlotTerminal(plot_path), quoted(picture_path), quoted(Printable(title)),
      log_scale ? "set ylabel 'makespan over the baseline (x, log scale)'\nset logscale y\n"
                : "set ylabel 'makespan over the baseline (+%)'\n",
      plots);
  RETURN_IF_ERROR(WriteOutput(data_path, data, /*force=*/false));
  RETURN_IF_ERROR(WriteOutput(script_path, script, /*force=*/false));
  std::string shell_path;  // POSIX shell single quotes: ' becomes '\''
  for (char c : script_path) shell_path += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string command = "gnuplot '" + shell_path + "' >/dev/null 2>&1";
  absl::StatusOr<std::string> picture = absl::UnknownError("gnuplot did not run");
  if (std::system(command.c_str()) == 0) picture = ReadBoundedFile(picture_path, "plot", 1 << 30);
  if (!picture.ok() || picture->empty()) {
    return absl::InternalError(absl::StrCat("gnuplot failed to draw ", Quote(plot_path)));
  }
  return WriteOutput(plot_path, *picture, force);
}

// The policies `compare` runs without --policies: each plans a graph of a
// few thousand nodes in seconds. --policies all adds the exact and MILP
// searches (exact, exact-order, checkmate, checkmate-lp), which run to their
// time limit on large graphs, and the one-shot orders that best-order
// already takes the better of (dfs, greedy, tree) and articulation, revolve,
// vdnn.
constexpr char kFastComparePolicies[] =
    "baseline,best-order,sqrtn,chen-greedy,rotor,dtr,swap,hybrid";

// The progress of `compare` on a terminal's stderr, redrawn as its plans
// finish ("compare: [#######.....] 21/40 plans, 12 s"); nothing when stderr
// is not a terminal. Safe to call from several threads.
class ProgressBar {
 public:
  ProgressBar(size_t total, bool enabled) : total_(total), enabled_(enabled) {}
  // Erases the line, before the command prints anything else.
  void Clear() { line_.Clear(); }
  void Done() {
    if (!enabled_) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    ++done_;
    constexpr size_t kWidth = 30;
    const size_t filled = total_ > 0 ? kWidth * done_ / total_ : kWidth;
    const double elapsed = std::chrono::duration<double>(
        std::chrono::steady_clock::now() - start_).count();
    line_.Show(absl::StrFormat("compare: [%s%s] %d/%d plans, %.0f s", std::string(filled, '#'),
                               std::string(kWidth - filled, '.'), done_, total_, elapsed));
  }

 private:
  const size_t total_;
  const bool enabled_;
  size_t done_ = 0;
  std::mutex mutex_;
  StderrStatusLine line_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// "compare: 8 policies x 5 budgets = 40 plans on 2 threads: at most 20 min
// if each ran to --time-limit 60 s; most take a second or less".
std::string CompareForecast(size_t policies, size_t budgets, int jobs, double time_limit_s) {
  const size_t plans = policies * budgets;
  const size_t threads =
      jobs > 0 ? static_cast<size_t>(jobs)
               : std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t used = std::max<size_t>(1, std::min(plans, threads));  // threads with a plan
  const size_t rounds = (plans + used - 1) / used;
  return absl::StrFormat(
      "compare: %d polic%s x %d budget%s = %d plan%s on %d thread%s: at most %s if each "
      "ran to --time-limit %g s; most take a second or less",
      policies, policies == 1 ? "y" : "ies", budgets, budgets == 1 ? "" : "s", plans,
      plans == 1 ? "" : "s", used, used == 1 ? "" : "s",
      FormatSeconds(static_cast<double>(rounds) * time_limit_s), time_limit_s);
}

// The table of `compare`: every figure with --wide (and in CSV), else the
// columns a person reads, within 100 columns.
Table CompareTable(const Comparison& comparison, const CostUnit& unit, bool wide) {
  const bool with_optimal = comparison.optimal_order_peak_bytes.value_or(0) > 0;
  auto vs_optimal = [&](int64_t peak) {
    return with_optimal ? absl::StrFormat("%.3f", static_cast<double>(peak) /
                                                      *comparison.optimal_order_peak_bytes)
                        : std::string();
  };
  Table table = wide ? Table({"policy", "budget", "budget_bytes", "fits", "peak_bytes", "peak",
                              "vs_optimal", "overhead", "recomputations", "transfer_bytes",
                              "host_peak_bytes", "makespan", "makespan_x", "exposed", "plan_ms",
                              "note"})
                     : Table(with_optimal
                                 ? std::vector<std::string>{"policy", "budget", "fits", "peak",
                                                            "vs_opt", "overhead", "recomp",
                                                            "moved", "makespan", "x_base",
                                                            "plan", "note"}
                                 : std::vector<std::string>{"policy", "budget", "fits", "peak",
                                                            "overhead", "recomp", "moved",
                                                            "makespan", "x_base", "plan",
                                                            "note"});
  for (const CompareEntry& e : comparison.entries) {
    const bool is_min = e.budget_bytes == kMinBudgetBytes;
    std::vector<std::string> row;
    if (!e.result.ok()) {
      const std::string note(e.result.status().message());
      row = wide ? std::vector<std::string>{e.policy, e.budget,
                                            is_min ? "" : absl::StrCat(e.budget_bytes), "error"}
                 : std::vector<std::string>{e.policy, e.budget, "error"};
      row.resize(table.num_columns() - 1);
      row[table.num_columns() - 2] = wide ? absl::StrFormat("%.1f", 1e3 * e.plan_time_s)
                                          : FormatSeconds(e.plan_time_s);
      row.push_back(note);
      table.AddRow(std::move(row));
      continue;
    }
    const PlanReport& r = e.result->report;
    const std::string fits = e.result->feasible ? "yes" : "no";
    // "peak 667 MiB exceeds the budget of ..." repeats fits=no: only --wide
    // and CSV keep it.
    const bool plain_over_budget =
        !e.result->feasible && absl::StartsWith(e.result->message, "peak ");
    const std::string note =
        e.result->feasible || (!wide && plain_over_budget) ? "" : e.result->message;
    const double slowdown = MakespanOverBaseline(comparison, r);
    if (wide) {
      row = {e.policy, e.budget, is_min ? "" : absl::StrCat(e.budget_bytes), fits,
             absl::StrCat(r.peak_bytes), FormatBytes(r.peak_bytes), vs_optimal(r.peak_bytes),
             OverheadPercent(r.overhead), absl::StrCat(r.recomputations),
             absl::StrCat(r.transfer_bytes), absl::StrCat(r.host_peak_bytes),
             absl::StrFormat("%.6g", r.makespan), absl::StrFormat("%.3f", slowdown),
             absl::StrFormat("%.6g", r.exposed_transfer_time),
             absl::StrFormat("%.1f", 1e3 * e.plan_time_s), note};
    } else {
      row = {e.policy, e.budget, fits, FormatBytes(r.peak_bytes)};
      if (with_optimal) row.push_back(vs_optimal(r.peak_bytes));
      for (std::string cell :
           {OverheadPercent(r.overhead), absl::StrCat(r.recomputations),
            r.transfer_bytes > 0 ? FormatBytes(r.transfer_bytes) : std::string("-"),
            unit.Amount(r.makespan), absl::StrFormat("%.3f", slowdown),
            FormatSeconds(e.plan_time_s), note}) {
        row.push_back(std::move(cell));
      }
    }
    table.AddRow(std::move(row));
  }
  return table;
}

int RunCompare(const PlanFlags& f, const std::string& budgets_text,
               const std::string& policies_text, std::string format,
               const std::string& plot_path, bool force, int jobs, bool wide) {
  if (f.json) format = "json";
  // Before planning, which may take long: a refused --plot path fails now.
  if (absl::Status s = CheckOutputs({{plot_path, "--plot"}}, f.source.InputFiles(), force);
      !s.ok()) {
    return Fail(s);
  }
  auto graph = f.rank_flags.Sharded(f.source.Load());
  if (!graph.ok()) return Fail(graph.status());
  CompareRequest request;
  request.jobs = jobs;
  auto options = f.Options();
  if (!options.ok()) return Fail(options.status());
  request.options = *options;
  // One progress bar instead of each planner's stage lines.
  request.options.progress = nullptr;
  absl::StatusOr<std::vector<std::string>> budgets = ListItems(budgets_text, "budget");
  if (!budgets.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--budgets ", budgets.status().message())));
  }
  request.budgets = *std::move(budgets);
  // (none: every registered policy)
  absl::StatusOr<std::vector<std::string>> policies = PolicyNames(policies_text);
  if (!policies.ok()) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("--policies ", policies.status().message())));
  }
  request.policies = *std::move(policies);
  const size_t num_policies =
      request.policies.empty() ? PlannerRegistry::Global().List().size()
                               : request.policies.size();
  if (!f.quiet) {
    std::cerr << "pebble: "
              << CompareForecast(num_policies, request.budgets.size(), jobs, f.time_limit_s)
              << "\n";
  }
  ProgressBar bar(num_policies * request.budgets.size(), !f.quiet && isatty(STDERR_FILENO));
  request.on_entry = [&bar](const CompareEntry&) { bar.Done(); };
  auto comparison = Compare(*graph, request);
  bar.Clear();
  if (!comparison.ok()) return Fail(comparison.status());

  std::vector<ParetoPoint> pareto;
  for (const CompareEntry& e : comparison->entries) {
    if (e.result.ok() && e.result->feasible) {
      pareto.push_back({e.policy, e.result->report.peak_bytes,
                        MakespanOverBaseline(*comparison, e.result->report) - 1});
    }
  }
  const CostUnit unit = f.source.Costs();
  if (format == "json") {
    PrintJson(CompareDocument(*graph, *comparison, f.source.Label()));
  } else if (format == "csv") {
    std::cout << CompareTable(*comparison, unit, /*wide=*/true).ToCsv();
  } else {
    const int ranks = f.rank_flags.ranks;
    std::cout << "compare " << f.source.Label()
              << (ranks > 1 ? absl::StrCat(" on ", ranks, " ranks",
                                           f.rank_flags.shard == "full" ? ", sharded" : "",
                                           ", per rank")
                            : "")
              << " (baseline peak " << FormatBytes(comparison->baseline_peak_bytes) << ")\n\n"
              << CompareTable(*comparison, unit, wide).ToString(wide ? 0 : 100);
    std::cout << "\nmakespan: " << unit.Basis()
              << "; x_base: makespan over the baseline's; plan: time to plan.\n";
    if (!wide) std::cout << "--wide shows every figure and whole notes.\n";
    if (comparison->optimal_order_peak_bytes) {
      std::cout << "vs_opt: peak over the minimal one-shot peak found by exact-order ("
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
      "(exit 1 when the plan does not fit, naming the least peak the policy reaches)\n"
      "  e.g. pebble plan --model conv3d:n=128 --policy baseline --budget 100% --json\n"
      "       pebble plan --model resnet18:batch=8 --policy rotor --budget min --schedule-out r.json");
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
  static RankFlags sim_ranks;
  static std::string sim_schedule, sim_bandwidth;
  static bool sim_timeline = false, sim_json = false;
  auto* sim = app.add_subcommand(
      "simulate",
      "validate a schedule file against a graph and report its peak, cost and makespan\n"
      "  e.g. pebble plan --graph examples/diamond.json --budget min --schedule-out d.json\n"
      "       pebble simulate --graph examples/diamond.json --schedule d.json --timeline");
  sim_source.AddOptions(sim);
  sim_source.AddWorkspaceBackendOption(sim);
  sim->add_option("--schedule,-s", sim_schedule, "schedule file (pebble-schedule JSON)")
      ->required();
  sim->add_option("--bandwidth", sim_bandwidth, kBandwidthHelp)
      ->check(BandwidthValue());
  sim_ranks.AddOptions(sim, &sim_source, /*planned=*/false);
  sim->add_flag("--timeline", sim_timeline, "show the per-step memory and time");
  sim->add_flag("--json", sim_json, "print JSON");
  sim->callback([&exit_code] {
    exit_code =
        RunSimulate(sim_source, sim_schedule, sim_bandwidth, sim_ranks, sim_timeline, sim_json);
  });

  static PlanFlags cmp_flags;
  static std::string cmp_budgets = "100%,80%,60%,40%,min", cmp_policies = kFastComparePolicies,
                     cmp_format = "table", cmp_plot;
  static bool cmp_force = false, cmp_wide = false;
  static int cmp_jobs = 0;
  auto* cmp = app.add_subcommand(
      "compare",
      "every policy (by default a fast set) at every budget, as a table, CSV or JSON\n"
      "  e.g. pebble compare --model resnet18:batch=8 --budgets 100%,80%,min --format csv\n"
      "       pebble compare --model linear:n=12 --policies all --budgets 100%,50%,min");
  cmp_flags.AddOptions(cmp, false);
  cmp_flags.source.AddWorkspaceBackendOption(cmp);
  cmp->add_option("--budgets", cmp_budgets, "comma-separated budgets")
      ->capture_default_str()
      ->check(BudgetList());
  cmp->add_option("--policies", cmp_policies,
                  "comma-separated policies, or 'all' (every registered one, the exact and "
                  "MILP searches included: slow on large graphs); exec:PROGRAM runs a policy "
                  "outside pebble (docs/library.md). The default is the fast set")
      ->capture_default_str()
      ->check(PolicyList());
  cmp->add_flag("--wide", cmp_wide,
                "every figure in the table (bytes, host peak, exposed transfer time) and whole "
                "notes; by default the table fits 100 columns");
  cmp->add_option("--format,-f", cmp_format, "table, csv or json")->capture_default_str()
      ->check(CLI::IsMember({"table", "csv", "json"}));
  cmp->add_option("--plot", cmp_plot,
                  "also draw the Pareto curve (makespan over the baseline against peak, "
                  "feasible plans) with gnuplot: PNG, or SVG or PDF for a .svg or .pdf file")
      ->check(NotStdout("the plot"));
  cmp->add_flag("--force", cmp_force, "replace an existing --plot file");
  cmp->add_option("--jobs,-j", cmp_jobs,
                  "plans made at once (default 0: one per hardware thread; 1: one after the "
                  "other). The plans are the same, but a search cut by its time limit may "
                  "reach less, and plan_ms is measured under the sharing")
      ->check(IntegerIn(0, 4096));
  cmp->callback([&exit_code] {
    exit_code = RunCompare(cmp_flags, cmp_budgets, cmp_policies, cmp_format, cmp_plot, cmp_force,
                           cmp_jobs, cmp_wide);
  });
}

}  // namespace pebble::cli
