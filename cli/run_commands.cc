// pebble run: execute one training step under a plan and measure it.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "cli/common.h"
#include "cli/run_common.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "runtime/collectives.h"
#include "runtime/executor.h"
#include "runtime/gloo/gloo_collectives.h"
#include "runtime/make_backend.h"
#include "runtime/npy.h"
#include "runtime/trace.h"
#include "scheduler/budget.h"
#include "scheduler/collectives.h"
#include "scheduler/compose.h"
#include "scheduler/memory_layout.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble::cli {

nlohmann::json MeasuredToJson(const Graph& graph, const ExecutionResult& r, bool with_steps) {
  nlohmann::json measured = {
      {"peak_bytes", r.peak_bytes},
      {"peak_step", r.peak_step},
      {"arena_bytes", r.arena_bytes},
      {"device_peak_bytes", r.backend_memory.device_bytes_peak},
      {"host_peak_bytes", r.host_peak_bytes},
      {"host_allocated_bytes", r.backend_memory.host_bytes_peak},
      {"scratch_bytes", r.backend_memory.scratch_bytes_peak},
      {"time_s", r.time_s},
      {"kernel_time_s", r.kernel_time_s},
      {"copy_time_s", r.copy_time_s},
      {"host_time_s", r.host_time_s},
      {"collective_time_s", r.collective_time_s},
      {"copy_overlap_s", r.copy_overlap_s},
      {"overhead_s", r.overhead_s},
      {"setup_s", r.setup_s},
  };
  if (r.backend_memory.driver_bytes_in_use >= 0) {
    measured["driver_bytes_in_use"] = r.backend_memory.driver_bytes_in_use;
  }
  measured["backend_counters"] = r.backend_counters;  // an object, {} when none
  if (with_steps) {
    nlohmann::json steps = nlohmann::json::array();
    for (const StepMeasurement& s : r.steps) {
      steps.push_back({{"action", std::string(ActionName(s.action))},
                       {"node", graph.id(s.node)},
                       {"start_s", s.start_s},
                       {"end_s", s.end_s},
                       {"resident_bytes", s.resident_bytes},
                       {"during_bytes", s.during_bytes},
                       {"host_bytes", s.host_bytes}});
    }
    measured["steps"] = std::move(steps);
  }
  return measured;
}

namespace {

struct RunFlags {
  GraphSource source;
  std::string policy;  // empty: DefaultPolicy()
  std::string budget = "100%";
  std::string backend = "cpu";
  std::string inputs_dir;
  std::string dump_dir;
  std::string trace_path;
  std::string schedule_path;
  std::string bandwidth;  // empty: the profile's, else 25e9
  std::string host_budget;
  double time_limit_s = 60;
  bool own_order = false;
  bool quiet = false;
  uint64_t seed = 0;
  int warmup = 0;
  bool json = false;
  bool memory_log = false;
  bool force = false;        // replace existing output files
  bool over_budget = false;  // run a plan that does not fit the budget
  bool no_poison = false;
  bool budget_given = false;  // --budget on the command line
  std::string workspace = "query";  // or "graph"
  // Several ranks (docs/runtime.md, "Several ranks").
  RankFlags rank_flags;
  RankProcessFlags process;  // --rank, --rendezvous, --address, --rank-timeout
};

// The placeholder in --dump, --trace and --inputs that each rank replaces
// with its number, so that ranks on one machine write apart and read their
// own batches.
constexpr absl::string_view kRankPlaceholder = "{rank}";

// Refuses rank flags that cannot work together, naming them.
absl::Status CheckRankFlags(const RunFlags& f) {
  const int ranks = f.rank_flags.ranks;
  RETURN_IF_ERROR(f.rank_flags.CheckShard());
  RETURN_IF_ERROR(f.process.Check(ranks));
  if (ranks == 1) return absl::OkStatus();
  for (const auto& [flag, path] : {std::pair{"--dump", &f.dump_dir},
                                   std::pair{"--trace", &f.trace_path}}) {
    if (!path->empty() && !absl::StrContains(*path, kRankPlaceholder)) {
      return UsageError(absl::StrCat(flag, " ", Quote(*path), ": with --ranks, put ",
                                     kRankPlaceholder, " in the path, which each rank "
                                     "replaces with its number (out/rank{rank})"));
    }
  }
  return absl::OkStatus();
}

// `f` as rank `f.process.rank` runs it: {rank} in --dump, --trace and --inputs
// replaced.
RunFlags ForThisRank(const RunFlags& f) {
  RunFlags mine = f;
  const std::string rank = absl::StrCat(f.process.rank);
  for (std::string* path : {&mine.dump_dir, &mine.trace_path, &mine.inputs_dir}) {
    *path = absl::StrReplaceAll(*path, {{kRankPlaceholder, rank}});
  }
  return mine;
}

// With several ranks, --inputs without {rank} would give every rank the
// same batch, or with --shard full the same shard: refused where the
// directory holds a file of one (a persistent tensor of role "input", or
// one ShardGraph shards). `graph` is the unsharded graph.
absl::Status CheckSharedInputs(const RunFlags& given, const Graph& graph) {
  if (given.rank_flags.ranks == 1 || given.inputs_dir.empty() ||
      absl::StrContains(given.inputs_dir, kRankPlaceholder)) {
    return absl::OkStatus();
  }
  const std::vector<uint8_t> sharded =
      given.rank_flags.shard == "full" ? ShardedTensors(graph)
                                       : std::vector<uint8_t>(graph.num_nodes(), 0);
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    const bool batch = graph.role(v) == Role::kInput;
    if (!graph.persistent(v) || !(batch || sharded[v])) continue;
    std::error_code ec;
    if (std::filesystem::exists(
            std::filesystem::path(given.inputs_dir) / TensorFileName(graph.id(v)), ec)) {
      return UsageError(absl::StrCat(
          "--inputs ", Quote(given.inputs_dir), " holds ", batch ? "the batch tensor " : "",
          batch ? "" : "the sharded tensor ", Quote(graph.id(v)), ", which every rank would "
          "read: with --ranks, put ", kRankPlaceholder, " in the path (data/rank{rank}), one "
          "per rank"));
    }
  }
  return absl::OkStatus();
}

// The plan to run: planned, or read from --schedule and simulated.
struct RunPlan {
  std::string policy;
  std::string budget_text;   // as given (--budget)
  int64_t budget_bytes = 0;  // resolved (the peak itself for 'min')
  // As the planner took it: kMinBudgetBytes for 'min', INT64_MAX for none.
  int64_t planner_budget_bytes = 0;
  int64_t baseline_peak = 0;
  double bandwidth_bytes_per_s = kDefaultHostBandwidthBytesPerS;
  NetworkLink network;  // the ranks' link the plan was timed on
  PlanResult plan;
};

// The planner's options for `f`, and in `p` the figures they come from;
// `baseline_peak` is the peak a budget in percent is of.
absl::StatusOr<PlannerOptions> RunPlannerOptions(const RunFlags& f, int64_t baseline_peak,
                                                 RunPlan& p) {
  PlannerOptions options;
  ASSIGN_OR_RETURN(options.host_bandwidth_bytes_per_s, f.source.PlannerBandwidth(f.bandwidth));
  p.bandwidth_bytes_per_s = options.host_bandwidth_bytes_per_s;
  options.time_limit_s = f.time_limit_s;
  options.own_order = f.own_order;
  RETURN_IF_ERROR(f.rank_flags.Apply(options));
  p.network = options.network;
  if (!f.json && !f.quiet) options.progress = StderrProgress();
  if (!f.host_budget.empty()) {
    ASSIGN_OR_RETURN(int64_t hb, ParseSize(f.host_budget));
    options.host_budget_bytes = hb;
  }
  ASSIGN_OR_RETURN(BudgetSpec spec, ParseBudget(f.budget));
  p.baseline_peak = baseline_peak;
  options.budget_bytes = ResolveBudget(spec, baseline_peak);
  // A given schedule is run as it is: no budget unless one is asked for.
  if (!f.schedule_path.empty() && !f.budget_given) options.budget_bytes = INT64_MAX;
  return options;
}

// Refuses --schedule beside the flags of a policy.
absl::Status CheckScheduleFlags(const RunFlags& f, const PlannerOptions& options) {
  if (f.schedule_path.empty()) return absl::OkStatus();
  if (!f.policy.empty()) return UsageError("--schedule: give --policy or --schedule, not both");
  if (options.bucket_bytes != PlannerOptions::kPlannedBuckets) {
    return UsageError("--buckets: a --schedule file runs with its own buckets (the steps' "
                      "\"bucket\" numbers)");
  }
  return absl::OkStatus();
}

// What every rank checks of the planning flags before the ranks meet, so
// that a bad one fails at once rather than after rank 0's plan or the
// timeout: each flag's value, and the policy's name.
absl::Status CheckPlanFlags(const RunFlags& f) {
  RunFlags quiet = f;
  quiet.quiet = true;
  RunPlan unused;
  ASSIGN_OR_RETURN(const PlannerOptions options,
                   RunPlannerOptions(quiet, /*baseline_peak=*/0, unused));
  RETURN_IF_ERROR(CheckScheduleFlags(f, options));
  if (f.schedule_path.empty() && !f.policy.empty()) return MakePlanner(f.policy).status();
  return absl::OkStatus();
}

// `reference` (default: `graph`) is the graph whose baseline peak a budget
// in percent is of.
absl::StatusOr<RunPlan> MakeRunPlan(const RunFlags& f, const Graph& graph,
                                    const Graph* reference = nullptr) {
  RunPlan p;
  ASSIGN_OR_RETURN(const int64_t baseline_peak,
                   BaselinePeak(reference != nullptr ? *reference : graph));
  ASSIGN_OR_RETURN(const PlannerOptions options, RunPlannerOptions(f, baseline_peak, p));
  RETURN_IF_ERROR(CheckScheduleFlags(f, options));
  if (!f.schedule_path.empty()) {
    p.policy = "schedule";
    ASSIGN_OR_RETURN(Schedule schedule, ReadScheduleFile(graph, f.schedule_path));
    ASSIGN_OR_RETURN(p.plan, FinishPlan(graph, std::move(schedule), options));
    p.plan.message = absl::StrCat("schedule read from '", f.schedule_path, "'",
                                  p.plan.message.empty() ? "" : "; ", p.plan.message);
  } else {
    p.policy = f.policy.empty() ? DefaultPolicy(options.budget_bytes, p.baseline_peak)
                                : f.policy;
    ASSIGN_OR_RETURN(auto planner, MakePlanner(p.policy));
    ASSIGN_OR_RETURN(p.plan, planner->Plan(graph, options));
  }
  p.budget_text = f.budget;
  p.planner_budget_bytes = options.budget_bytes;
  p.budget_bytes = options.budget_bytes == kMinBudgetBytes ? p.plan.report.peak_bytes
                                                           : options.budget_bytes;
  return p;
}

// The graph with each kernel's workspace on `backend` (docs/runtime.md,
// "Workspace"), and its plan. The budget decides: the workspace of the
// fastest configurations where the plan fits the budget; the least
// workspace where only that fits, and at `min` where it gives the better
// plan (BetterPlan). Budgets in percent are of the fastest graph's baseline.
absl::StatusOr<std::pair<Graph, RunPlan>> PlanWithBackendWorkspace(
    const RunFlags& f, const Graph& bare, Backend& backend, WorkspaceQueryStats* stats,
    std::string* choice) {
  ASSIGN_OR_RETURN(Graph fastest,
                   WithBackendWorkspace(bare, backend, stats, WorkspaceChoice::kFastest));
  ASSIGN_OR_RETURN(RunPlan plan, MakeRunPlan(f, fastest));
  *choice = "fastest";
  ASSIGN_OR_RETURN(BudgetSpec spec, ParseBudget(f.budget));
  const bool is_min = spec.kind == BudgetSpec::Kind::kMin;
  if (!f.schedule_path.empty() || (plan.plan.feasible && !is_min)) {
    return std::make_pair(std::move(fastest), std::move(plan));
  }
  WorkspaceQueryStats least_stats;
  ASSIGN_OR_RETURN(Graph least, WithBackendWorkspace(bare, backend, &least_stats,
                                                     WorkspaceChoice::kLeast));
  int64_t saved = 0;  // workspace bytes the least configurations save
  for (NodeId v = 0; v < least.num_nodes(); ++v) {
    saved += fastest.workspace(v) - least.workspace(v);
  }
  if (saved == 0) return std::make_pair(std::move(fastest), std::move(plan));
  ASSIGN_OR_RETURN(RunPlan lean, MakeRunPlan(f, least, &fastest));
  PlannerOptions rule;
  rule.budget_bytes = is_min ? PlannerOptions::kMinBudget : plan.budget_bytes;
  if (!BetterPlan(lean.plan, plan.plan, rule)) {
    return std::make_pair(std::move(fastest), std::move(plan));
  }
  *stats = least_stats;
  *choice = "least";
  return std::make_pair(std::move(least), std::move(lean));
}

// The files `run` will write: --trace and one .npy per output and per
// updated persistent tensor under --dump, each with the option that names
// it.
std::vector<PathFlag> RunOutputs(const RunFlags& f, const Graph& graph) {
  std::vector<PathFlag> outputs;
  if (!f.trace_path.empty()) outputs.emplace_back(f.trace_path, "--trace");
  if (!f.dump_dir.empty()) {
    std::vector<NodeId> dumped(graph.outputs().begin(), graph.outputs().end());
    for (NodeId v : UpdatedStorages(graph)) dumped.push_back(v);
    for (NodeId v : dumped) {
      outputs.emplace_back(
          (std::filesystem::path(f.dump_dir) / TensorFileName(graph.id(v))).string(), "--dump");
    }
  }
  return outputs;
}

// The files `run` reads: --graph, --profile, --schedule, and each
// persistent tensor's file under --inputs that is there.
std::vector<PathFlag> RunInputs(const RunFlags& f, const Graph& graph) {
  std::vector<PathFlag> inputs = f.source.InputFiles();
  if (!f.schedule_path.empty()) inputs.emplace_back(f.schedule_path, "--schedule");
  if (!f.inputs_dir.empty()) {
    for (NodeId v = 0; v < graph.num_nodes(); ++v) {
      if (!graph.persistent(v)) continue;
      const std::string path =
          (std::filesystem::path(f.inputs_dir) / TensorFileName(graph.id(v))).string();
      std::error_code ec;
      if (std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
        inputs.emplace_back(path, "--inputs");
      }
    }
  }
  return inputs;
}

// Checks every input and output path before anything runs: --inputs is a
// directory whose .npy files all name persistent nodes
// (CheckInputsDirectory); no two outputs are one file, none is a file the
// run reads, none replaces a file unless forced (CheckOutputs). Creates
// nothing: the --dump directory is made once the step has run
// (RunOutputFiles).
absl::Status CheckRunPaths(const RunFlags& f, const Graph& graph) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!f.inputs_dir.empty()) {
    if (!fs::is_directory(f.inputs_dir, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--inputs ", Quote(f.inputs_dir),
                       fs::exists(f.inputs_dir, ec) ? " is not a directory" : " does not exist"));
    }
    absl::Status s = CheckInputsDirectory(graph, f.inputs_dir);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--inputs: ", s.message()));
  }
  if (!f.trace_path.empty() && !f.dump_dir.empty() && SameFile(f.trace_path, f.dump_dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dump and --trace both name ", Quote(f.dump_dir), ": --dump is the directory the "
        "tensors are written into, --trace a file; give them different paths"));
  }
  RETURN_IF_ERROR(CheckOutputs(RunOutputs(f, graph), RunInputs(f, graph), f.force,
                               {f.dump_dir}));
  if (!f.dump_dir.empty() && fs::exists(f.dump_dir, ec) && !fs::is_directory(f.dump_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dump ", Quote(f.dump_dir), " is not a directory"));
  }
  return absl::OkStatus();
}

// The files a run creates, removed again (with the directories it made for
// them) unless the run succeeds: a failed run leaves nothing behind. A file
// it replaced (--force) keeps whatever was written into it.
class RunOutputFiles {
 public:
  RunOutputFiles() = default;
  RunOutputFiles(const RunOutputFiles&) = delete;
  RunOutputFiles& operator=(const RunOutputFiles&) = delete;
  ~RunOutputFiles() {
    if (kept_) return;
    std::error_code ec;
    for (auto it = written_.rbegin(); it != written_.rend(); ++it) {
      std::filesystem::remove(*it, ec);
    }
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) std::filesystem::remove(*it, ec);
  }

  // Creates `dir` and the directories above it that are missing.
  absl::Status MakeDirectory(const std::string& dir) {
    namespace fs = std::filesystem;
    std::vector<fs::path> missing;
    std::error_code ec;
    for (fs::path p = fs::absolute(dir, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec);
         p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.parent_path()) break;
    }
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create --dump directory ", Quote(dir), ": ", ec.message()));
    }
    made_.insert(made_.end(), missing.rbegin(), missing.rend());
    return absl::OkStatus();
  }
  // Records a file about to be written: one that is not there yet is
  // removed again if the run fails (a file or device that was there, such
  // as /dev/null, never is).
  void Writing(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
      written_.push_back(path);
    }
  }
  // The run succeeded: keep everything.
  void Keep() { kept_ = true; }

 private:
  std::vector<std::filesystem::path> made_;  // outermost first
  std::vector<std::string> written_;
  bool kept_ = false;
};

void PrintMemoryLog(const Graph& graph, const ExecutionResult& r) {
  Table t({"steps", "module", "phase", "delta", "total", "delta_bytes", "total_bytes"});
  for (const MemoryLogRow& row : MemoryLog(graph, r)) {
    const std::string sign = row.delta_bytes < 0 ? "-" : "+";
    t.AddRow({row.first_step == row.last_step
                  ? absl::StrCat(row.first_step)
                  : absl::StrCat(row.first_step, "-", row.last_step),
              row.module, row.phase,
              absl::StrCat(sign, FormatBytes(row.delta_bytes < 0 ? -row.delta_bytes
                                                                 : row.delta_bytes)),
              FormatBytes(row.total_bytes), absl::StrCat(row.delta_bytes),
              absl::StrCat(row.total_bytes)});
  }
  std::cout << "\nmemory log (resident bytes after each module's steps)\n" << t.ToString();
}

nlohmann::json MemoryLogToJson(const Graph& graph, const ExecutionResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const MemoryLogRow& row : MemoryLog(graph, r)) {
    rows.push_back({{"first_step", row.first_step},
                    {"last_step", row.last_step},
                    {"module", row.module},
                    {"phase", row.phase},
                    {"delta_bytes", row.delta_bytes},
                    {"total_bytes", row.total_bytes},
                    {"peak_bytes", row.peak_bytes}});
  }
  return rows;
}

// Why `run` refuses a plan that does not fit, and what to pass instead
// (RefusalAdvice, as `plan` says it; for a --schedule file, the
// simulator's message).
absl::Status DoesNotFit(const RunFlags& f, const Graph& graph, const RunPlan& plan) {
  PlanOutcome out;
  out.policy = plan.policy;
  out.budget_is_min = plan.planner_budget_bytes == kMinBudgetBytes;
  out.budget_bytes = plan.budget_bytes;
  out.baseline_peak_bytes = plan.baseline_peak;
  out.end_state_bytes = EndStateBytes(graph);
  out.result = plan.plan;
  if (out.result.message.empty()) out.result.message = "over budget";
  std::string advice;
  if (plan.policy == "schedule") {
    advice = DoesNotFitAdvice(plan.policy, plan.budget_bytes, /*least_peak_bytes=*/0,
                              plan.baseline_peak, out.end_state_bytes, out.result.message);
  } else {
    RunFlags quiet = f;
    quiet.quiet = true;
    RunPlan unused;
    ASSIGN_OR_RETURN(PlannerOptions options,
                     RunPlannerOptions(quiet, plan.baseline_peak, unused));
    options.budget_bytes = plan.planner_budget_bytes;
    ASSIGN_OR_RETURN(const std::unique_ptr<Planner> planner, MakePlanner(plan.policy));
    ASSIGN_OR_RETURN(advice, RefusalAdvice(graph, *planner, options, out));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(advice, "; nothing was run (--over-budget runs it anyway)"));
}

// The graph with the backend's workspace (--workspace query; `graph` is the
// bare graph on entry) and the plan to run, refused where it does not fit
// but with --over-budget.
absl::StatusOr<RunPlan> PlanRun(const RunFlags& f, Graph& graph, Backend& backend,
                                WorkspaceQueryStats* workspace, std::string* choice) {
  RunPlan plan;
  if (f.workspace == "query") {
    ASSIGN_OR_RETURN(auto planned, PlanWithBackendWorkspace(f, graph, backend, workspace, choice));
    graph = std::move(planned.first);
    plan = std::move(planned.second);
  } else {
    ASSIGN_OR_RETURN(plan, MakeRunPlan(f, graph));
  }
  if (!plan.plan.feasible && !f.over_budget) return DoesNotFit(f, graph, plan);
  return plan;
}

// Note [Rank 0 plans]
// With several ranks, rank 0 alone plans, and the others run its schedule.
// When each rank planned on its own, a policy that stops at its time limit
// (hybrid, best-order) could plan differently on ranks of different speeds,
// and then the ranks refused to run. The other ranks wait for the plan as
// long as it takes (FromRank0) and take rank 0's decisions: its schedule,
// policy, budget, baseline, links and workspace choice. Each simulates the
// schedule on its own graph (FinishPlan) for its report, and judges on that
// whether the plan fits there (its kernels may take other workspace); the
// ranks agree on it (AgreeOnEveryRank). Their graphs and the schedule are
// still compared before the run (Execute's fingerprint), so a rank given
// another model is refused.

// What the other ranks need of rank 0's plan.
nlohmann::json RunPlanToJson(const Graph& graph, const RunPlan& p, const std::string& choice) {
  return {{"policy", p.policy},
          {"budget", p.budget_text},
          {"budget_bytes", p.budget_bytes},
          {"planner_budget_bytes", p.planner_budget_bytes},
          {"baseline_peak_bytes", p.baseline_peak},
          {"message", p.plan.message},
          {"host_bandwidth_bytes_per_s", p.bandwidth_bytes_per_s},
          {"network_bandwidth_bytes_per_s", p.network.bandwidth_bytes_per_s},
          {"network_latency_s", p.network.latency_s},
          {"workspace_choice", choice},
          // Text, which the other ranks read step by step (ParseScheduleText).
          {"schedule", ScheduleToJson(graph, p.plan.schedule).dump()}};
}

// Rank 0's plan (RunPlanToJson) on this rank's graph, which gets the
// workspace that rank 0 chose (`graph` is the bare graph on entry).
absl::StatusOr<RunPlan> RunPlanOfRank0(const RunFlags& f, const nlohmann::json& doc,
                                       Graph& graph, Backend& backend,
                                       WorkspaceQueryStats* workspace, std::string* choice) {
  if (f.workspace == "query") {
    *choice = doc.at("workspace_choice").get<std::string>();
    ASSIGN_OR_RETURN(graph, WithBackendWorkspace(graph, backend, workspace,
                                                 *choice == "least" ? WorkspaceChoice::kLeast
                                                                    : WorkspaceChoice::kFastest));
  }
  RunPlan p;
  RunFlags quiet = f;
  quiet.quiet = true;
  ASSIGN_OR_RETURN(PlannerOptions options,
                   RunPlannerOptions(quiet, doc.at("baseline_peak_bytes").get<int64_t>(), p));
  p.policy = doc.at("policy").get<std::string>();
  p.budget_text = doc.at("budget").get<std::string>();
  p.budget_bytes = doc.at("budget_bytes").get<int64_t>();
  p.planner_budget_bytes = doc.at("planner_budget_bytes").get<int64_t>();
  p.bandwidth_bytes_per_s = doc.at("host_bandwidth_bytes_per_s").get<double>();
  p.network = {.bandwidth_bytes_per_s = doc.at("network_bandwidth_bytes_per_s").get<double>(),
               .latency_s = doc.at("network_latency_s").get<double>()};
  options.budget_bytes = p.planner_budget_bytes;
  options.host_bandwidth_bytes_per_s = p.bandwidth_bytes_per_s;
  options.network = p.network;
  ASSIGN_OR_RETURN(Schedule schedule,
                   ParseScheduleText(graph, doc.at("schedule").get<std::string>(),
                                     "rank 0's schedule"));
  absl::StatusOr<PlanResult> simulated = FinishPlan(graph, std::move(schedule), options);
  if (!simulated.ok()) {
    return absl::Status(simulated.status().code(), absl::StrCat("rank 0's plan, on this rank: ",
                                                                simulated.status().message()));
  }
  p.plan = *std::move(simulated);
  // Whether it fits is this rank's verdict: its kernels' workspace may
  // differ from rank 0's (another thread count), and so may its host budget.
  if (p.plan.feasible) p.plan.message = doc.at("message").get<std::string>();
  if (!p.plan.feasible && !f.over_budget) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank 0's plan does not fit this rank: ", p.plan.message, " (this rank's kernels take "
        "other workspace than rank 0's, say with another thread count, or its --host-budget "
        "differs); nothing was run (--over-budget runs it anyway)"));
  }
  return p;
}

// PlanRun on rank 0, and its plan on every rank (Note [Rank 0 plans]).
absl::StatusOr<RunPlan> PlanOnRank0(const RunFlags& f, Graph& graph, Backend& backend,
                                    Collectives& collectives, WorkspaceQueryStats* workspace,
                                    std::string* choice) {
  // A beat well within the timeout of each collective.
  const double poll_s = std::min(1.0, f.process.timeout_s / 4);
  std::optional<RunPlan> own;
  ASSIGN_OR_RETURN(const std::string text, FromRank0(
      collectives,
      [&]() -> absl::StatusOr<std::string> {
        ASSIGN_OR_RETURN(own, PlanRun(f, graph, backend, workspace, choice));
        // Paths and programs need not be UTF-8.
        return RunPlanToJson(graph, *own, *choice)
            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      },
      "rank 0's plan", poll_s));
  if (own.has_value()) {
    // The others meanwhile take it (their workspace query, a simulation).
    RETURN_IF_ERROR(WorkTogether(collectives, [] {}, "the other ranks' set-up", poll_s));
    RETURN_IF_ERROR(AgreeOnEveryRank(collectives, absl::OkStatus(), "to take rank 0's plan"));
    return *std::move(own);
  }
  absl::StatusOr<RunPlan> taken = absl::InternalError("rank 0's plan arrived unreadable");
  RETURN_IF_ERROR(WorkTogether(
      collectives,
      [&] {
        auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (doc.is_discarded() || !doc.is_object()) return;
        try {
          taken = RunPlanOfRank0(f, doc, graph, backend, workspace, choice);
        } catch (const nlohmann::json::exception& e) {
          taken = absl::InternalError(absl::StrCat("rank 0's plan arrived incomplete: ",
                                                   e.what()));
        }
      },
      "the other ranks' set-up", poll_s));
  RETURN_IF_ERROR(AgreeOnEveryRank(collectives, taken.status(), "to take rank 0's plan"));
  return taken;
}

// What a run made, for its outputs: the flags, the graph and plan it ran,
// and what the backend measured.
struct RunOutcome {
  const RunFlags& f;
  const Graph& graph;
  const RunPlan& plan;
  const Backend& backend;
  const ExecutionResult& r;
  const WorkspaceQueryStats& workspace;
  const std::string& workspace_choice;
  const Collectives* collectives;  // null on one rank
  bool sharded;
};

// --dump-dir and --trace: the files of the run, all written or none kept.
absl::Status WriteRunFiles(const RunOutcome& run) {
  const RunFlags& f = run.f;
  RunOutputFiles files;
  if (!f.dump_dir.empty()) {
    RETURN_IF_ERROR(files.MakeDirectory(f.dump_dir));
    std::vector<const HostTensor*> dumped;
    for (const HostTensor& t : run.r.outputs) dumped.push_back(&t);
    for (const HostTensor& t : run.r.updated) dumped.push_back(&t);
    for (const HostTensor* t : dumped) {
      const std::string path =
          (std::filesystem::path(f.dump_dir) / TensorFileName(run.graph.id(t->node))).string();
      files.Writing(path);
      RETURN_IF_ERROR(WriteNpy(path, t->array));
    }
  }
  if (!f.trace_path.empty()) {
    files.Writing(f.trace_path);
    nlohmann::json trace = ChromeTrace(run.graph, run.r);
    if (run.collectives != nullptr) {
      trace["otherData"]["rank"] = run.collectives->rank();
      trace["otherData"]["ranks"] = run.collectives->ranks();
    }
    RETURN_IF_ERROR(WriteOutput(
        f.trace_path,
        trace.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
        /*force=*/true));
  }
  files.Keep();
  return absl::OkStatus();
}

void PrintRunJson(const RunOutcome& run) {
  const RunFlags& f = run.f;
  const Graph& graph = run.graph;
  const RunPlan& plan = run.plan;
  const ExecutionResult& r = run.r;
  nlohmann::json predicted =
      ReportToJson(plan.plan.report, graph, plan.plan.schedule, /*with_timeline=*/false);
  predicted["arena_bytes"] = r.layout.arena_bytes;
  predicted["aligned_peak_bytes"] = r.layout.aligned_peak_bytes;
  predicted["fragmentation"] = r.layout.fragmentation;
  nlohmann::json doc = {
      {"graph", f.source.Label()},
      {"policy", plan.policy},
      {"budget", plan.budget_text},
      {"budget_bytes", plan.budget_bytes == INT64_MAX ? nlohmann::json(nullptr)
                                                      : nlohmann::json(plan.budget_bytes)},
      {"baseline_peak_bytes", plan.baseline_peak},
      {"feasible", plan.plan.feasible},
      {"message", plan.plan.message},
      {"backend", run.backend.name()},
      {"device", r.device},
      {"seed", f.seed},
      {"warmup", f.warmup},
      {"predicted", predicted},
      {"measured", MeasuredToJson(graph, r, /*with_steps=*/true)},
      {"peak_equal", r.peak_bytes == plan.plan.report.peak_bytes},
      {"workspace", f.workspace == "query"
                        ? WorkspaceStatsToJson(run.backend.name(), run.workspace,
                                               run.workspace_choice)
                        : nlohmann::json(nullptr)},
      {"loaded_inputs", r.loaded_inputs.size()},
      {"generated_inputs", r.generated_inputs.size()},
      {"ranks", f.rank_flags.ranks},
  };
  if (run.collectives != nullptr) {
    // The collectives the run made: all-reduces (data parallel), gathers and
    // reduce-scatters (sharded), recomputed gathers included.
    const CollectiveComputes sharded = CountCollectiveComputes(graph, plan.plan.schedule);
    doc["rank"] = f.process.rank;
    doc["shard"] = f.rank_flags.shard;
    doc["collectives"] = {
        {"description", run.collectives->Description()},
        {"all_reduce", CountSteps(plan.plan.schedule, Action::kAllReduce)},
        {"buckets", CountBuckets(plan.plan.schedule)},
        {"all_gather", sharded.gathers},
        {"reduce_scatter", sharded.scatters},
        {"all_reduce_nodes", sharded.sums},
        {"bytes", plan.plan.report.collective_bytes},
        {"predicted_network_busy_s", plan.plan.report.network_busy},
        {"measured_s", r.collective_time_s}};
  }
  if (!f.source.model.empty()) doc["model"] = f.source.model;
  doc["loss"] = r.loss.has_value() ? nlohmann::json(*r.loss) : nlohmann::json(nullptr);
  if (const std::optional<double> norm = r.ScalarOutput(graph, kGradNormId)) {
    doc["grad_norm"] = *norm;
  }
  if (!f.dump_dir.empty()) doc["dump"] = f.dump_dir;
  doc["updated"] = r.updated.size();
  if (!f.trace_path.empty()) doc["trace"] = f.trace_path;
  if (f.memory_log) doc["memory_log"] = MemoryLogToJson(graph, r);
  PrintJson(doc);
}

void PrintRunText(const RunOutcome& run) {
  const RunFlags& f = run.f;
  const Graph& graph = run.graph;
  const RunPlan& plan = run.plan;
  const ExecutionResult& r = run.r;
  const Collectives* collectives = run.collectives;
  const PlanReport& p = plan.plan.report;
  std::cout << absl::StrFormat("run %s with %s, budget %s (baseline peak %s): %s\n",
                               f.source.Label(), plan.policy,
                               plan.budget_bytes == INT64_MAX
                                   ? std::string("none")
                                   : absl::StrCat(plan.budget_text, " = ",
                                                  FormatBytes(plan.budget_bytes)),
                               FormatBytes(plan.baseline_peak),
                               plan.plan.feasible ? "fits" : "DOES NOT FIT (--over-budget)");
  std::cout << absl::StrFormat("  backend         %s (%s)\n", run.backend.name(), r.device);
  if (collectives != nullptr) {
    const std::string made =
        absl::StrCat(run.sharded ? "sharded: " : "",
                     CollectivesText(graph, plan.plan.schedule));
    std::cout << absl::StrFormat(
        "  ranks           %s; %s of %s, measured %s (network busy %s predicted)\n",
        collectives->Description(), made, FormatBytes(plan.plan.report.collective_bytes),
        FormatSeconds(r.collective_time_s), FormatSeconds(plan.plan.report.network_busy));
  }
  Table t({"", "predicted", "measured", "bytes predicted", "bytes measured"});
  t.AddRow({"peak memory", FormatBytes(p.peak_bytes), FormatBytes(r.peak_bytes),
            absl::StrCat(p.peak_bytes), absl::StrCat(r.peak_bytes)});
  t.AddRow({"arena", FormatBytes(r.layout.arena_bytes),
            FormatBytes(r.arena_bytes), absl::StrCat(r.layout.arena_bytes),
            absl::StrCat(r.arena_bytes)});
  t.AddRow({"host peak", FormatBytes(p.host_peak_bytes), FormatBytes(r.host_peak_bytes),
            absl::StrCat(p.host_peak_bytes), absl::StrCat(r.host_peak_bytes)});
  std::cout << t.ToString();
  std::cout << absl::StrFormat(
      "  peak            %s\n",
      r.peak_bytes == p.peak_bytes ? "measured == predicted" : "MEASURED != PREDICTED");
  // (as plan says it; at 'min' the budget is the peak itself)
  if (plan.plan.feasible && plan.planner_budget_bytes != kMinBudgetBytes &&
      plan.budget_bytes != INT64_MAX && r.arena_bytes > plan.budget_bytes) {
    std::cout << ArenaOverBudgetNote(r.arena_bytes, plan.budget_bytes);
  }
  if (f.workspace == "query") {
    std::cout << "  workspace       "
              << WorkspaceStatsLine(run.backend.name(), run.workspace, run.workspace_choice) << "\n";
  }
  std::cout << absl::StrFormat("  kernel scratch  %s outside the plan\n",
                               FormatBytes(r.backend_memory.scratch_bytes_peak));
  if (!r.backend_counters.empty()) {
    std::vector<std::string> counts;
    for (const auto& [name, count] : r.backend_counters) {
      counts.push_back(absl::StrCat(name, " ", count));
    }
    std::cout << "  backend events  " << absl::StrJoin(counts, ", ") << "\n";
  }
  std::cout << absl::StrFormat(
      "  time            measured %s (kernels %s, copies %s of which %s under compute, %s%s"
      "executor %s; setup %s before)\n"
      "  makespan        %s\n",
      FormatSeconds(r.time_s), FormatSeconds(r.kernel_time_s), FormatSeconds(r.copy_time_s),
      FormatSeconds(r.copy_overlap_s),
      r.host_time_s > 0 ? absl::StrCat("host updates ", FormatSeconds(r.host_time_s), ", ")
                        : std::string(),
      r.collective_time_s > 0
          ? absl::StrCat("collectives ", FormatSeconds(r.collective_time_s), ", ")
          : std::string(),
      FormatSeconds(r.overhead_s), FormatSeconds(r.setup_s),
      f.source.Costs().Describe(p.makespan));
  std::cout << absl::StrFormat("  steps           %d (%d recomputations, %s transferred)\n",
                               r.steps.size(), p.recomputations, FormatBytes(p.transfer_bytes));
  std::cout << absl::StrFormat("  inputs          %d read from files, %d generated (seed %d%s)\n",
                               r.loaded_inputs.size(), r.generated_inputs.size(), f.seed,
                               collectives == nullptr
                                   ? ""
                                   : absl::StrFormat("; the batch's %d + rank", f.seed));
  if (r.loss.has_value()) std::cout << absl::StrFormat("  loss            %.9g\n", *r.loss);
  if (const std::optional<double> norm = r.ScalarOutput(graph, kGradNormId)) {
    std::cout << absl::StrFormat("  grad norm       %.9g (before clipping)\n", *norm);
  }
  if (!f.dump_dir.empty()) {
    const std::string updated =
        r.updated.empty() ? ""
                          : absl::StrFormat(" and %d updated persistent tensors", r.updated.size());
    std::cout << absl::StrFormat("  dump            %d outputs%s in %s\n", r.outputs.size(),
                                 updated, f.dump_dir);
  }
  if (!f.trace_path.empty()) std::cout << "  trace           " << f.trace_path << "\n";
  if (f.memory_log) PrintMemoryLog(graph, r);
}

int RunRun(const RunFlags& given) {
  if (absl::Status s = CheckRankFlags(given); !s.ok()) return Fail(s);
  RunFlags f = ForThisRank(given);
  f.source.run_backend = f.backend;  // (a --profile of another backend is refused)
  auto graph = f.source.Load();
  if (!graph.ok()) return Fail(graph.status());
  if (absl::Status s = CheckSharedInputs(given, *graph); !s.ok()) return Fail(s);
  // --shard full: the rank's graph; its shards start as slices of the
  // unsharded graph's tensors (ExecutorOptions::unsharded).
  std::optional<Graph> unsharded;
  if (f.rank_flags.shard == "full") {
    unsharded = *graph;
    graph = f.rank_flags.Sharded(std::move(graph));
    if (!graph.ok()) return Fail(graph.status());
  }
  if (absl::Status s = CheckRunPaths(f, *graph); !s.ok()) return Fail(s);
  auto backend = MakeBackend(f.backend);
  if (!backend.ok()) return Fail(backend.status());
  // With several ranks, the ranks meet first: rank 0 plans for them all.
  std::unique_ptr<Collectives> collectives;
  if (f.rank_flags.ranks > 1) {
    if (absl::Status s = CheckPlanFlags(f); !s.ok()) return Fail(s);
    auto connected = ConnectGloo(f.process.Gloo(f.rank_flags.ranks));
    if (!connected.ok()) return Fail(connected.status());
    collectives = *std::move(connected);
    // Every rank runs as many steps (a warm-up of one would pair with
    // another's measured step).
    if (absl::Status s = CheckSameOnEveryRank(*collectives, f.warmup, "--warmup",
                                              "give every rank the same --warmup");
        !s.ok()) {
      return Fail(s);
    }
  }
  WorkspaceQueryStats workspace;
  std::string workspace_choice;
  absl::StatusOr<RunPlan> plan =
      collectives != nullptr
          ? PlanOnRank0(f, *graph, **backend, *collectives, &workspace, &workspace_choice)
          : PlanRun(f, *graph, **backend, &workspace, &workspace_choice);
  if (!plan.ok()) return Fail(plan.status());
  ExecutorOptions options;
  options.seed = f.seed;
  options.inputs_dir = f.inputs_dir;
  options.poison_arena = !f.no_poison;
  options.simulator.host_bandwidth_bytes_per_s = plan->bandwidth_bytes_per_s;
  if (collectives != nullptr) {
    options.collectives = collectives.get();
    if (unsharded.has_value()) options.unsharded = &*unsharded;
    options.simulator.network = plan->network;
  }
  for (int i = 0; i < f.warmup; ++i) {  // primitive caches, page faults
    ExecutorOptions quiet = options;
    quiet.download_outputs = false;
    auto warm = Execute(*graph, plan->plan.schedule, **backend, quiet);
    if (!warm.ok()) return Fail(warm.status());
  }
  auto result = Execute(*graph, plan->plan.schedule, **backend, options);
  if (!result.ok()) return Fail(result.status());
  const RunOutcome run{f, *graph, *plan, **backend, *result, workspace, workspace_choice,
                       collectives.get(), unsharded.has_value()};
  if (absl::Status s = WriteRunFiles(run); !s.ok()) return Fail(s);
  if (f.json) {
    PrintRunJson(run);
  } else {
    PrintRunText(run);
  }
  return 0;
}

}  // namespace

void AddRunCommands(CLI::App& app, int& exit_code) {
  static RunFlags flags;
  auto* run = app.add_subcommand(
      "run",
      "execute one training step under a plan on a backend; measured peak and time beside "
      "the predicted ones\n"
      "  e.g. pebble run --model conv3d:n=64 --policy baseline --budget 100% --backend cpu\n"
      "       pebble run --model resnet18:batch=8,image=128 --budget 80% --dump out/ "
      "--trace t.json");
  flags.source.AddOptions(run);
  CLI::Option* policy =
      run->add_option("--policy,-p", flags.policy,
                      "planner (see 'pebble policies'), or exec:PROGRAM (docs/library.md); "
                      "default: best-order at or above the baseline peak, hybrid below it")
          ->check(PolicyName());
  CLI::Option* budget = run->add_option(
      "--budget,-b", flags.budget,
      "device memory budget: whole bytes or a size with units (8GiB), a percentage of the "
      "baseline peak (60%) or 'min'; with --schedule, none unless given");
  budget->capture_default_str()->check(BudgetValue());
  run->add_option("--backend", flags.backend, "cpu or cuda")
      ->capture_default_str()
      ->check(BackendName());
  run->add_option("--workspace", flags.workspace,
                  "query: the scratch each kernel takes on --backend (oneDNN scratchpads and "
                  "relayouts, cuDNN workspace) becomes its node's workspace, planned in the arena, "
                  "so that nothing is allocated outside it; graph: the graph's own workspace "
                  "figures (kernel scratch beyond them lies outside the plan, as scratch_bytes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"query", "graph"}));
  run->add_option("--schedule,-s", flags.schedule_path,
                  "run this schedule file (pebble-schedule JSON) instead of planning")
      ->excludes(policy);
  run->add_option("--inputs", flags.inputs_dir,
                  "directory of <id>.npy files for persistent tensors (others are generated); "
                  "a .npy file there that names no persistent node is an error");
  run->add_option("--dump", flags.dump_dir,
                  "write every output, and every persistent tensor an optimizer's update wrote, "
                  "as DIR/<id>.npy (never over a file the run reads)")
      ->check(NotStdout("the dumped tensors"));
  run->add_option("--seed", flags.seed, "seed of generated inputs (default 0)")
      ->check(IntegerIn(0, INT64_MAX));
  run->add_option("--warmup", flags.warmup,
                  "run the step this many times first and measure the next one (default 0)")
      ->check(IntegerIn(0, 1000));
  run->add_option("--trace", flags.trace_path,
                  "write a Chrome trace (chrome://tracing, ui.perfetto.dev) to this file")
      ->check(NotStdout("the trace"));
  run->add_flag("--memory-log", flags.memory_log,
                "print the per-module memory table (module, phase, delta, total)");
  run->add_option("--bandwidth", flags.bandwidth,
                  "host link bytes/s for the planner's offload timing, or pcie4 (25e9, the "
                  "default), pcie5 (55e9), nvlink-c2c (450e9); with --profile: its measured "
                  "bandwidth")
      ->check(BandwidthValue());
  run->add_option("--host-budget", flags.host_budget, "host memory limit for offloaded copies")
      ->check(SizeValue());
  AddQuietFlag(run, flags.quiet);
  AddOwnOrderFlag(run, flags.own_order);
  run->add_option("--time-limit", flags.time_limit_s,
                  "seconds any planner may search (default 60); past it the best valid plan "
                  "found so far, the cut noted in the message")
      ->check(NumberAbove(0, "a positive number of seconds"));
  run->add_flag("--no-poison", flags.no_poison,
                "do not fill the arena with NaN bytes before running");
  run->add_flag("--force", flags.force,
                "replace existing --dump and --trace files (never a file the run reads)");
  run->add_flag("--over-budget", flags.over_budget,
                "run a plan that does not fit the budget (by default refused, with the "
                "planner's reason)");
  run->add_flag("--json", flags.json, "print one JSON document");
  flags.rank_flags.AddOptions(run, &flags.source, /*planned=*/true, /*copies=*/false);
  flags.process.AddOptions(
      run, "each rank is one process running the same plan on its own batch: the inputs of "
           "role 'input' generated with seed --seed + rank, or read from its own --inputs, "
           "{rank} in the path");
  run->callback([&exit_code, budget] {
    flags.process.NoteGiven();
    flags.budget_given = budget->count() > 0;
    exit_code = RunRun(flags);
  });

  AddFitCommand(app, exit_code);
}

}  // namespace pebble::cli
