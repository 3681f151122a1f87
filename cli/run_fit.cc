// pebble fit: for each policy, the largest value of a model parameter whose
// training step fits a memory budget (the seed report's 3-D experiment).
// The search is the library's (Fit, scheduler/plan_api.h); this file adds
// the command line, --verify (each answer run on a backend) and the output.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/common.h"
#include "scheduler/offload.h"
#include "cli/run_common.h"
#include "graph/autodiff.h"
#include "graph/import/onnx_import.h"
#include "graph/models/models.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "runtime/executor.h"
#include "runtime/make_backend.h"
#include "runtime/workspace.h"
#include "scheduler/budget.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"

namespace pebble::cli {
namespace {

struct FitFlags {
  std::string model;
  std::string onnx;  // an ONNX model searched over its batch size, instead of --model
  std::string loss = "cross-entropy";  // --onnx's loss
  std::string optimizer;               // --onnx's optimizer step; empty: none
  std::string frozen;                  // --onnx's frozen initializers; empty: none
  std::string vary;
  std::string budget;
  std::string policies;  // empty: the default set
  std::string backend = "cpu";
  std::string bandwidth;  // empty: the profile's, else 25e9
  double throughput_flops_per_s = 10e12;
  double time_limit_s = 300;  // the whole command
  int64_t start = 1;
  int64_t max_value = 0;  // 0: the model's own limit
  uint64_t seed = 0;
  int jobs = 0;  // policies searched at once; 0: one per hardware thread
  int milp_max_stages = 0;  // 0: checkmate's and checkmate-lp's defaults
  bool own_order = false;
  bool quiet = false;
  bool verify = false;
  bool json = false;
  std::string workspace = "auto";  // query with --verify, else graph
  RankFlags rank_flags;
};

// A row of the library's search, and its measurement under --verify.
struct VerifiedRow {
  const FitRow* row;
  std::optional<ExecutionResult> measured;
  std::string verify_error;
};

// Each plan of the search may take this long at most (exact and MILP
// planners search until it), within the whole command's --time-limit.
constexpr double kFitPlanTimeLimitS = 10;

// Reports each value the search tries on stderr: on a terminal one line,
// rewritten in place and erased at the end; otherwise a line each (--quiet:
// none). Thread-safe (the policies are searched on several threads).
class FitProgressLine {
 public:
  FitProgressLine(std::string vary, bool terminal)
      : vary_(std::move(vary)), terminal_(terminal) {}

  void Tried(const FitTry& t) {
    std::string line = absl::StrFormat("fit: [%.1f s] %s %s=%d: %s", t.elapsed_s, t.policy,
                                       vary_, t.value, FitOutcomeName(t.outcome));
    if (t.outcome == FitTry::Outcome::kFits || t.outcome == FitTry::Outcome::kDoesNotFit) {
      absl::StrAppend(&line, " (peak ", FormatBytes(t.peak_bytes), ")");
    } else if (t.outcome == FitTry::Outcome::kBelowBound) {
      absl::StrAppend(&line, " (at least ", FormatBytes(t.peak_bytes), ")");
    }
    if (terminal_) {
      status_.Show(std::move(line));
    } else {
      const std::lock_guard<std::mutex> lock(mu_);
      std::cerr << line << "\n";
    }
  }

  // Erases the line being rewritten, if any.
  void Finish() { status_.Clear(); }

 private:
  std::string vary_;
  bool terminal_;
  std::mutex mu_;  // whole lines when piped
  StderrStatusLine status_;
};

// What the table and the JSON call the model searched.
std::string ModelLabel(const FitFlags& f, const FitRequest& request) {
  return f.onnx.empty() ? request.model.ToString() : f.onnx;
}

// The largest batch an --onnx search tries where --max is not given:
// pebble import --batch's own limit.
constexpr int64_t kOnnxMaxBatch = int64_t{1} << 24;

// --onnx: the model imported at each batch size, as pebble import --batch
// N with --loss and --optimizer would write it. The file is read once.
absl::Status SetOnnxModel(const FitFlags& f, FitRequest& request) {
  if (f.vary != "batch") {
    return UsageError(absl::StrCat("--onnx searches the batch size: --vary batch, not ",
                                   Quote(f.vary)));
  }
  OnnxImportOptions options;
  RETURN_IF_ERROR(SetOnnxLoss(f.loss, options));
  if (options.loss == LossKind::kNone) {
    return UsageError("--loss none: fit plans the training step; give --loss cross-entropy, "
                      "nll, mse or bce");
  }
  ASSIGN_OR_RETURN(options.frozen, ParseFrozenOption(f.frozen));
  std::optional<OptimizerSpec> optimizer;
  if (!f.optimizer.empty()) {
    ASSIGN_OR_RETURN(optimizer, ParseOptimizerOption(f.optimizer));
  }
  ASSIGN_OR_RETURN(std::string bytes, ReadBoundedFile(f.onnx, "ONNX model", kMaxOnnxFileBytes));
  auto model = std::make_shared<const std::string>(std::move(bytes));
  const std::string stem = std::filesystem::path(f.onnx).stem().string();
  options.cost_model = request.cost;
  // The model at `batch`, as import --batch writes it, and what import would
  // note of it where `notes` is given.
  auto import_at = [model, name = stem.empty() ? std::string("model") : stem, options,
                    optimizer](int64_t batch,
                               std::vector<std::string>* notes) -> absl::StatusOr<Graph> {
    OnnxImportOptions at = options;
    at.batch = batch;
    absl::StatusOr<Graph> graph = ImportOnnxModel(*model, name, at, notes);
    if (graph.ok() && optimizer.has_value()) {
      graph = AppendOptimizerStep(*graph, *optimizer, at.cost_model);
    }
    return graph;  // (its error: the search's note says "bounded by batch=N: ...")
  };
  request.build_model = [import_at](int64_t batch) { return import_at(batch, nullptr); };
  if (request.max_value == 0) request.max_value = kOnnxMaxBatch;
  // A model that imports at no batch from --start on is the file's fault;
  // the first that imports tells the notes.
  std::vector<std::string> notes;
  const absl::StatusOr<int64_t> first = FirstValueBuilt(
      [&](int64_t batch) {
        notes.clear();
        return import_at(batch, &notes);
      },
      request.start, request.max_value);
  if (!first.ok()) {
    if (absl::Status usage = ImportErrorOfOptions(first.status()); IsUsageError(usage)) {
      return usage;
    }
    return absl::Status(first.status().code(),
                        absl::StrCat(Quote(f.onnx), " at batch ", request.start, ": ",
                                     first.status().message()));
  }
  for (const std::string& note : notes) std::cerr << "pebble: note: " << note << "\n";
  return absl::OkStatus();
}

// The search that the flags ask for (but the hooks RunFit adds: progress,
// workspace queries), or the error that names the flag at fault.
absl::StatusOr<FitRequest> RequestFromFlags(const FitFlags& f) {
  FitRequest request;
  if (f.model.empty() == f.onnx.empty()) {
    return UsageError("give the model to search: --model (a built-in model) or --onnx (a file)");
  }
  if (f.onnx.empty() && (f.loss != "cross-entropy" || !f.optimizer.empty())) {
    return UsageError(absl::StrCat(f.optimizer.empty() ? "--loss" : "--optimizer",
                                   " goes with --onnx: a built-in model takes its loss and "
                                   "optimizer among its parameters, e.g. --model "
                                   "transformer:layers=4,optimizer=adam"));
  }
  if (!f.model.empty() && f.vary.empty()) {
    return UsageError("--vary: give the integer parameter of --model to search (n, batch, ...)");
  }
  if (!f.model.empty()) {
    auto spec = ParseModelSpec(f.model);
    if (!spec.ok()) return UsageError(absl::StrCat("--model: ", spec.status().message()));
    request.model = *spec;
  }
  request.vary = f.vary;
  auto budget_bytes = ParseFitBudget(f.budget);
  if (!budget_bytes.ok()) {
    return UsageError(absl::StrCat("--budget: ", budget_bytes.status().message()));
  }
  request.budget_bytes = *budget_bytes;
  auto bandwidth = ParseBandwidth(f.bandwidth.empty() ? "25e9" : f.bandwidth);
  if (!bandwidth.ok()) {
    return UsageError(absl::StrCat("--bandwidth: ", bandwidth.status().message()));
  }
  if (f.start < 1) return UsageError("--start must be at least 1");
  if (f.max_value != 0 && f.max_value < f.start) {
    return UsageError(absl::StrCat("--max ", f.max_value, " is below --start ", f.start,
                                   "; nothing to try"));
  }
  request.cost.device_flops_per_s = f.throughput_flops_per_s;
  request.start = f.start;
  request.jobs = f.jobs;
  request.max_value = f.max_value;
  if (!f.onnx.empty()) {
    RETURN_IF_ERROR(SetOnnxModel(f, request));
  } else {
    // The model from --start on: a --vary that is no parameter of it, or a
    // parameter it cannot be built with, is the command line's fault. (A
    // value that makes no model, such as heads that do not divide dim, is
    // one the search passes over: some of the next ones must.)
    const absl::StatusOr<int64_t> first =
        FirstValueWithAModel(request.model, f.vary, f.start, f.max_value, request.cost);
    if (first.status().code() == absl::StatusCode::kInvalidArgument) {
      return UsageError(absl::StrCat("--model ", Quote(f.model), " --vary ", Quote(f.vary),
                                     ": ", first.status().message(), " (and no value of ",
                                     f.vary, " from ", f.start,
                                     " on makes a model: --vary takes an integer parameter of "
                                     "the model)"));
    }
  }
  if (!f.policies.empty()) {  // (none given: Fit's defaults)
    absl::StatusOr<std::vector<std::string>> names = PolicyNames(f.policies);
    if (!names.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--policies ", names.status().message()));
    }
    request.policies = *std::move(names);
    if (request.policies.empty()) {  // all
      for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
        request.policies.push_back(p->name);
      }
    }
  }
  request.options.host_bandwidth_bytes_per_s = *bandwidth;
  request.options.time_limit_s = std::min(kFitPlanTimeLimitS, f.time_limit_s);
  request.time_limit_s = f.time_limit_s;
  request.options.own_order = f.own_order;
  request.options.milp_max_stages = f.milp_max_stages;
  RETURN_IF_ERROR(f.rank_flags.Apply(request.options));
  if (f.rank_flags.ranks > 1 && f.verify) {
    return UsageError("--verify runs one rank on the backend: not with --ranks");
  }
  RETURN_IF_ERROR(f.rank_flags.CheckShard());
  if (f.rank_flags.shard == "full") {
    const RankFlags& ranks = f.rank_flags;
    request.transform_model = [&ranks](const Graph& g) { return ranks.Sharded(g); };
  }
  return request;
}

// --verify: runs each row's plan on a backend of its own, within what is
// left of the time limit (counted from `started`).
absl::Status VerifyRows(const FitFlags& f, const PlannerOptions& options,
                        std::chrono::steady_clock::time_point started, bool report_progress,
                        std::vector<VerifiedRow>& rows) {
  // Fail early when the backend cannot be had at all.
  if (auto probe = MakeBackend(f.backend); !probe.ok()) return probe.status();
  for (VerifiedRow& v : rows) {
    const FitRow& row = *v.row;
    if (!row.value.has_value()) continue;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (elapsed >= f.time_limit_s) {
      v.verify_error =
          absl::StrFormat("not run: the time limit of %g s was reached", f.time_limit_s);
      continue;
    }
    // A backend per row: its memory high-water marks (device_peak_bytes,
    // scratch_bytes) then describe this row's run alone.
    auto backend = MakeBackend(f.backend);
    if (!backend.ok()) return backend.status();
    ExecutorOptions eo;
    eo.seed = f.seed;
    eo.simulator.host_bandwidth_bytes_per_s = options.host_bandwidth_bytes_per_s;
    eo.download_outputs = false;
    if (report_progress) {
      std::cerr << absl::StrFormat("fit: running %s at %s=%d on %s...\n", row.policy, f.vary,
                                   *row.value, f.backend);
    }
    auto r = Execute(*row.graph, row.plan->schedule, **backend, eo);
    if (r.ok()) {
      v.measured = *std::move(r);
    } else {
      v.verify_error = std::string(r.status().message());
    }
  }
  return absl::OkStatus();
}

void PrintFitJson(const FitFlags& f, const FitRequest& request, const FitResult& fit,
                  const std::vector<VerifiedRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const VerifiedRow& v : rows) {
    const FitRow& row = *v.row;
    nlohmann::json j = FitRowJson(row);
    if (v.measured.has_value()) {
      nlohmann::json m = MeasuredToJson(*row.graph, *v.measured, /*with_steps=*/false);
      m["peak_equal"] = v.measured->peak_bytes == row.plan->report.peak_bytes;
      j["measured"] = std::move(m);
    }
    if (!v.verify_error.empty()) j["verify_error"] = v.verify_error;
    out.push_back(std::move(j));
  }
  nlohmann::json doc = {{"model", ModelLabel(f, request)},
                        {"vary", f.vary},
                        {"budget", f.budget},
                        {"budget_bytes", request.budget_bytes},
                        {"time_limit_s", f.time_limit_s},
                        {"search_time_s", fit.search_time_s},
                        {"search", "exponential then binary over the predicted peak; "
                                   "assumes the peak grows with the parameter"},
                        {"naive", {{"rule", "26 x bytes(input) <= budget"}}},
                        {"results", out}};
  if (fit.naive_value.has_value()) {
    doc["naive"]["value"] = *fit.naive_value;
  } else {
    doc["naive"]["value"] = nullptr;
    if (!fit.naive_note.empty()) doc["naive"]["note"] = fit.naive_note;
  }
  if (f.verify) doc["backend"] = f.backend;
  if (f.rank_flags.ranks > 1) {
    doc["ranks"] = f.rank_flags.ranks;
    doc["shard"] = f.rank_flags.shard;
  }
  PrintJson(doc);
}

// One row of the table: the policy's answer, and under --verify its run.
std::vector<std::string> FitTableRow(const VerifiedRow& v, bool verify) {
  const FitRow& row = *v.row;
  std::vector<std::string> cells = {row.policy == "baseline" ? "baseline *" : row.policy,
                                    row.kind};
  if (row.value.has_value()) {
    const PlanReport& r = row.plan->report;
    // Cut by the time limit: a larger value may fit too.
    cells.push_back(absl::StrCat(row.time_limit_reached ? ">= " : "", *row.value));
    cells.push_back(FormatBytes(r.peak_bytes));
    cells.push_back(row.arena_bytes.has_value() ? FormatBytes(*row.arena_bytes)
                                                : std::string("?"));
    cells.push_back(OverheadPercent(r.overhead));
    cells.push_back(FormatBytes(r.transfer_bytes));
  } else {
    cells.insert(cells.end(), {"-", "", "", "", ""});
  }
  if (verify) {
    if (v.measured.has_value()) {
      cells.push_back(FormatBytes(v.measured->peak_bytes));
      cells.push_back(v.measured->peak_bytes == row.plan->report.peak_bytes ? "yes" : "NO");
      cells.push_back(absl::StrFormat("%.3f s", v.measured->time_s));
    } else {
      cells.insert(cells.end(), {"", "", ""});
    }
  }
  std::string note = !v.verify_error.empty() ? v.verify_error : row.note;
  if (note.size() > 72) note = note.substr(0, 69) + "...";  // the JSON has it whole
  cells.push_back(note);
  return cells;
}

void PrintFitTable(const FitFlags& f, const FitRequest& request, const FitResult& fit,
                   const std::vector<VerifiedRow>& rows) {
  const std::string per_rank =
      f.rank_flags.ranks > 1
          ? absl::StrFormat(" on each of %d ranks (%s)", f.rank_flags.ranks,
                            f.rank_flags.shard == "full" ? "sharded" : "data parallel")
          : std::string();
  std::cout << absl::StrFormat("fit %s: the largest %s whose training step fits %s (%d bytes)%s\n\n",
                               ModelLabel(f, request), f.vary,
                               FormatBytes(request.budget_bytes), request.budget_bytes, per_rank);
  std::vector<std::string> header = {"policy", "kind", f.vary, "predicted peak", "arena",
                                     "overhead", "transferred"};
  if (f.verify) header.insert(header.end(), {"measured peak", "equal", "time"});
  header.push_back("note");
  Table t(header);
  if (fit.naive_applies) {
    const std::optional<int64_t>& naive = fit.naive_value;
    std::vector<std::string> cells = {"naive (26 x input)", "estimate",
                                      naive ? absl::StrCat(*naive) : "-", "", "", "", ""};
    if (f.verify) cells.insert(cells.end(), {"", "", ""});
    cells.push_back(naive ? "" : fit.naive_note);
    t.AddRow(cells);
  }
  for (const VerifiedRow& v : rows) t.AddRow(FitTableRow(v, f.verify));
  std::cout << t.ToString() << "\n";
  if (absl::c_any_of(rows, [](const VerifiedRow& v) { return v.row->policy == "baseline"; })) {
    std::cout << "* baseline: the graph's own order, every tensor freed at its last use (what a "
                 "framework runs).\n";
  }
  if (fit.naive_applies) {
    std::cout << "naive: the largest value with 26 x bytes(input) <= budget (a rule of thumb "
                 "for 3-D networks).\n";
  }
  std::vector<std::string> over;  // policies whose arena is over the budget
  for (const VerifiedRow& v : rows) {
    const std::optional<int64_t>& arena = v.row->arena_bytes;
    if (arena.has_value() && *arena > request.budget_bytes) over.push_back(v.row->policy);
  }
  if (!over.empty()) {
    std::cout << "arena: the one block a run allocates, every tensor at its planned offset; over "
                 "the budget for "
              << absl::StrJoin(over, ", ")
              << ": the budget bounds the peak, and tensors freed at different times leave gaps "
                 "(a lower --budget keeps the arena within the memory you have).\n";
  }
  std::cout << "Search: exponential then binary over the predicted peak, assuming it grows with "
               "the parameter";
  std::cout << absl::StrFormat(" (%.1f s).\n", fit.search_time_s);
}

int RunFit(FitFlags f) {
  if (!f.onnx.empty() && f.vary.empty()) f.vary = "batch";
  absl::StatusOr<FitRequest> request = RequestFromFlags(f);
  if (!request.ok()) return Fail(request.status());
  const bool report_progress = !f.json && !f.quiet;
  FitProgressLine progress_line(f.vary, isatty(STDERR_FILENO) != 0);
  if (report_progress) {
    request->on_try = [&progress_line](const FitTry& t) { progress_line.Tried(t); };
  }
  // --workspace query: each model planned with --backend's kernel scratch
  // (runtime/workspace.h), one probe at a time.
  std::unique_ptr<Backend> probe_backend;
  std::mutex probe_mu;
  if (f.workspace == "query" || (f.workspace == "auto" && f.verify)) {
    auto made = MakeBackend(f.backend);
    if (!made.ok()) return Fail(made.status());
    probe_backend = *std::move(made);
    request->prepare_graph = [&](const Graph& g) -> absl::StatusOr<Graph> {
      std::lock_guard<std::mutex> lock(probe_mu);
      return WithBackendWorkspace(g, *probe_backend);
    };
  }
  const auto started = std::chrono::steady_clock::now();
  auto fit = Fit(*request);
  progress_line.Finish();
  if (!fit.ok()) return Fail(fit.status());
  std::vector<VerifiedRow> rows;
  for (const FitRow& row : fit->rows) rows.push_back({&row, std::nullopt, ""});
  if (f.verify) {
    if (absl::Status s = VerifyRows(f, request->options, started, report_progress, rows);
        !s.ok()) {
      return Fail(s);
    }
  }
  if (f.json) {
    PrintFitJson(f, *request, *fit, rows);
  } else {
    PrintFitTable(f, *request, *fit, rows);
  }
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
      "       pebble fit --model conv3d --vary n --budget 128MiB --policies "
      "baseline,rotor --verify\n"
      "       /usr/bin/python3 examples/onnx/export.py onnx-out resnet18 --batch 2 --image 64\n"
      "       pebble fit --onnx onnx-out/resnet18.onnx --budget 1GiB --policies "
      "baseline,rotor   # the largest batch");
  auto* model =
      fit->add_option("--model,-m", flags.model,
                      "built-in model with fixed parameters, e.g. conv3d:batch=1 (or --onnx)")
          ->check(ModelName());
  auto* onnx = fit->add_option("--onnx", flags.onnx,
                               "an ONNX model (torch.onnx.export in training mode) instead of "
                               "--model, searched over its batch size: imported at each batch "
                               "as pebble import --batch does (docs/import.md)");
  model->excludes(onnx);
  fit->add_option("--loss", flags.loss,
                  "--onnx's loss: cross-entropy (input 'target' of class indices), nll "
                  "(nn.NLLLoss of the log_softmax the model ends in), mse or bce "
                  "(nn.BCEWithLogitsLoss) (default cross-entropy)")
      ->check(CLI::IsMember({"cross-entropy", "nll", "mse", "bce"}))
      ->needs(onnx);
  AddOptimizerOption(fit, flags.optimizer);
  AddFrozenOption(fit, flags.frozen)->needs(onnx);
  fit->add_option("--vary", flags.vary,
                  "the integer parameter of --model to search (n, batch, ...); with --onnx, "
                  "batch (the default there)");
  fit->add_option("--budget,-b", flags.budget,
                  "device memory budget: whole bytes or a size with units (2GiB)")
      ->required()
      ->check(FitBudgetValue());
  fit->add_option("--policies", flags.policies,
                  "comma-separated policies; default: every policy but the exact searches "
                  "(exact, exact-order, checkmate) and, unless --shard full, the fsdp rules; "
                  "'all': every one")
      ->check(PolicyList());
  fit->add_flag("--verify", flags.verify,
                "run each policy's largest value on the backend and compare the measured peak");
  fit->add_option("--backend", flags.backend, "backend for --verify and --workspace query")
      ->capture_default_str()
      ->check(BackendName());
  fit->add_option("--workspace", flags.workspace,
                  "query: plan each model with the scratch its kernels take on --backend as "
                  "their nodes' workspace (docs/runtime.md, \"Workspace\"); graph: the model's "
                  "own figures; auto (the default): query with --verify, graph without")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "query", "graph"}));
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
  fit->add_option("--bandwidth", flags.bandwidth,
                  "host link bytes/s, or pcie4 (25e9, the default), pcie5, nvlink-c2c")
      ->check(BandwidthValue());
  flags.rank_flags.AddOptions(fit, /*source=*/nullptr);  // fit takes no --profile
  AddQuietFlag(fit, flags.quiet);
  AddOwnOrderFlag(fit, flags.own_order);
  fit->add_option("--time-limit", flags.time_limit_s,
                  "seconds for the whole command (default 300): past it the search keeps, per "
                  "policy, the largest value found to fit so far, and --verify runs no more; "
                  "each plan takes at most 10 s of it")
      ->check(NumberAbove(0, "a positive number of seconds"));
  fit->add_option("--milp-max-stages", flags.milp_max_stages,
                  "largest graph (needed non-persistent nodes) checkmate's MILP and "
                  "checkmate-lp's LP take (default 0: 300 and 600), as plan takes it")
      ->check(IntegerIn(0, 100000));
  fit->add_option("--jobs,-j", flags.jobs,
                  "policies searched at once (default 0: one per hardware thread; 1: one "
                  "after the other)")
      ->check(IntegerIn(0, 4096));
  fit->add_flag("--json", flags.json, "print one JSON document");
  fit->callback([&exit_code] { exit_code = RunFit(flags); });
}

}  // namespace pebble::cli
