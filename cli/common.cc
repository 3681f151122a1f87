#include "cli/common.h"

#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "graph/autodiff.h"
#include "graph/file_output.h"
#include "graph/graph_json.h"
#include "graph/import/onnx_import.h"
#include "graph/models/models.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "runtime/make_backend.h"
#include "runtime/workspace.h"
#include "scheduler/collectives.h"
#include "scheduler/budget.h"
#include "scheduler/cost_profile.h"
#include "scheduler/external_policy.h"
#include "scheduler/offload.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"

namespace pebble::cli {

void GraphSource::AddOptions(CLI::App* cmd) {
  auto* model_opt = cmd->add_option(
      "--model,-m", model,
      "built-in model with parameters, e.g. conv3d:n=128,batch=2 (see 'pebble models')");
  auto* graph_opt =
      cmd->add_option("--graph,-g", graph, "graph file in the pebble-graph JSON format");
  model_opt->check(ModelName());
  model_opt->excludes(graph_opt);
  auto* train_opt = cmd->add_flag(
      "--train", train,
      "the --graph is a forward graph: add --loss and differentiate it first (the loss "
      "reads the graph's one output and a new input 'target')");
  train_opt->needs(graph_opt);
  cmd->add_option("--loss", loss,
                  "loss for --train: cross-entropy (class indices in 'target', the default), "
                  "mse, or bce (nn.BCEWithLogitsLoss: 'target' of the output's shape)")
      ->check(CLI::IsMember({"cross-entropy", "mse", "bce"}))
      ->needs(train_opt);  // not silently ignored without it
  AddOptimizerOption(cmd, optimizer);
  cmd->add_option("--throughput", throughput_flops_per_s,
                  "device FLOP/s that turns a model's FLOPs into seconds of cost "
                  "(default 10e12; ignored for --graph, whose costs are given)")
      // (at least 1: a subnormal throughput made every cost infinite)
      ->check(NumberAbove(std::nextafter(1.0, 0.0), "a number of FLOP/s of at least 1"));
  cmd->add_option("--profile", profile,
                  "cost profile from 'pebble calibrate': measured seconds replace the "
                  "cost of every node whose op, shapes, dtype and attrs it has; a command "
                  "that plans also takes its measured link bandwidth, unless --bandwidth "
                  "is given");
}

namespace {

absl::StatusOr<Graph> LoadWithoutProfile(const GraphSource& source) {
  if (!source.model.empty()) {
    CostModel cost;
    cost.device_flops_per_s = source.throughput_flops_per_s;
    absl::StatusOr<Graph> built = BuildModel(source.model, cost);
    // --model is command-line text: a model or parameter the zoo refuses
    // is a bad command line.
    if (built.status().code() == absl::StatusCode::kInvalidArgument) {
      return UsageError(absl::StrCat("--model: ", built.status().message()));
    }
    return built;
  }
  if (!source.graph.empty()) {
    ASSIGN_OR_RETURN(Graph g, ReadGraphFile(source.graph));
    if (!source.train) return g;
    // As import refuses a model without weights: the step would train nothing.
    if (!g.has_parameters()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--train: ", Quote(source.graph), " has no parameter (a node of role \"parameter\"), "
          "so its training step would train nothing: give its weights that role, or plan it "
          "without --train"));
    }
    ASSIGN_OR_RETURN(LossKind loss, ParseLossKind(source.loss));
    CostModel cost;  // for the backward nodes
    cost.device_flops_per_s = source.throughput_flops_per_s;
    auto trained = AddLossAndDifferentiate(g, loss, cost);
    if (!trained.ok()) {
      return absl::Status(trained.status().code(), absl::StrCat("--train: ", Quote(source.graph),
                                                                ": ", trained.status().message()));
    }
    return trained;
  }
  return UsageError("give a graph: --model NAME[:k=v,...] or --graph FILE");
}

}  // namespace

void GraphSource::AddWorkspaceBackendOption(CLI::App* cmd) {
  cmd->add_option("--backend", workspace_backend,
                  "plan for this backend (cpu or cuda): the scratch each kernel takes there "
                  "(oneDNN scratchpads and relayouts, cuDNN workspace) becomes its node's "
                  "workspace, so the arena holds it (docs/runtime.md, \"Workspace\"); "
                  "default: the graph's own workspace figures")
      ->check(BackendName());
}

absl::StatusOr<Graph> GraphSource::Load(WorkspaceQueryStats* workspace) const {
  ASSIGN_OR_RETURN(Graph g, LoadWithoutProfile(*this));
  if (!optimizer.empty()) {
    ASSIGN_OR_RETURN(const OptimizerSpec spec, ParseOptimizerOption(optimizer));
    if (g.has_in_place()) {
      return UsageError("--optimizer: the graph has an optimizer's step already (a model's "
                        "optimizer= parameter, or in-place nodes of its own)");
    }
    CostModel cost;
    cost.device_flops_per_s = throughput_flops_per_s;
    ASSIGN_OR_RETURN(g, AppendOptimizerStep(g, spec, cost));
  }
  if (!profile.empty()) {
    ASSIGN_OR_RETURN(CostProfile p, ReadCostProfileFile(profile));
    // Times and kernel workspaces are the backend's they were measured on.
    const std::string& backend = run_backend.empty() ? workspace_backend : run_backend;
    if (!backend.empty() && !p.backend.empty() && p.backend != backend) {
      return UsageError(absl::StrCat(
          "--profile ", Quote(profile), " was measured on the ", p.backend,
          " backend, and this plan is for ", backend, ": its times and kernel workspaces are "
          "another backend's (pebble calibrate --backend ", backend, " measures this one)"));
    }
    CostProfileMatch match;
    ASSIGN_OR_RETURN(g, ApplyCostProfile(g, p, &match));
    std::cerr << "pebble: cost profile '" << profile << "' (" << p.backend << "): "
              << match.matched << " of " << match.matched + match.unmatched
              << " computed nodes take measured times"
              << (match.workspaces > 0
                      ? absl::StrCat(", ", match.workspaces, " a measured kernel workspace")
                      : std::string())
              << "\n";
  }
  if (workspace_backend.empty()) return g;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeBackend(workspace_backend));
  return WithBackendWorkspace(g, *backend, workspace);
}

namespace {

// "1 gather", "2 gathers": `n` and `noun`, plural but for one.
std::string Counted(int64_t n, absl::string_view noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

}  // namespace

std::string CollectivesText(const Graph& graph, const Schedule& schedule) {
  const auto [gathers, scatters, sums, messages] = CountCollectiveComputes(graph, schedule);
  const int64_t steps = CountSteps(schedule, Action::kAllReduce);
  const int64_t buckets = CountBuckets(schedule);
  std::string text = Counted(steps, "all-reduce");
  if (buckets != steps) absl::StrAppend(&text, " in ", Counted(buckets, "bucket"));
  if (gathers + scatters + sums == 0) return text;
  std::vector<std::string> computes;
  if (gathers + scatters > 0) {
    computes = {Counted(gathers, "gather"), Counted(scatters, "reduce-scatter")};
  }
  if (sums > 0) computes.push_back(Counted(sums, "all-reduce"));
  const std::string listed =
      computes.size() == 1
          ? computes[0]
          : absl::StrCat(absl::StrJoin(computes.begin(), computes.end() - 1, ", "), " and ",
                         computes.back());
  return absl::StrCat(listed, " in ", Counted(messages, "message"),
                      steps > 0 ? absl::StrCat(", ", text) : std::string());
}

std::string FormatSeconds(double seconds) {
  const double magnitude = std::abs(seconds);
  if (magnitude == 0) return "0 s";
  if (magnitude >= 3600) return absl::StrFormat("%.3g h", seconds / 3600);
  if (magnitude >= 60) return absl::StrFormat("%.3g min", seconds / 60);
  if (magnitude >= 1) return absl::StrFormat("%.3g s", seconds);
  if (magnitude >= 1e-3) return absl::StrFormat("%.3g ms", 1e3 * seconds);
  if (magnitude >= 1e-6) return absl::StrFormat("%.3g us", 1e6 * seconds);
  return absl::StrFormat("%.3g ns", 1e9 * seconds);
}

std::string ArenaOverBudgetNote(int64_t arena_bytes, int64_t budget_bytes) {
  return absl::StrFormat(
      "                  the arena is over the budget by %s: tensors freed at different "
      "times\n                  leave gaps; the budget bounds the peak, not the arena (a "
      "lower budget\n                  makes a smaller one)\n",
      FormatBytes(arena_bytes - budget_bytes));
}

std::string CostUnit::Amount(double cost) const {
  return seconds ? FormatSeconds(cost) : absl::StrFormat("%.6g units", cost);
}

std::string CostUnit::Describe(double cost) const {
  std::string text = Amount(cost);
  if (!prefix.empty()) text = absl::StrCat(prefix, " ", text);
  if (!suffix.empty()) absl::StrAppend(&text, " ", suffix);
  return text;
}

std::string CostUnit::Basis() const {
  std::string text = prefix;
  if (!suffix.empty()) absl::StrAppend(&text, text.empty() ? "" : " ", suffix);
  return text;
}

CostUnit GraphSource::Costs() const {
  CostUnit unit;
  if (!profile.empty()) {
    unit.prefix = "measured";
    unit.suffix = absl::StrCat("(profile ", Quote(profile), ")");
    return unit;
  }
  if (model.empty()) {
    unit.suffix = "from the graph file's costs, read as seconds";
    return unit;
  }
  const absl::StatusOr<ModelSpec> spec = ParseModelSpec(model);
  for (const ModelInfo& info : ListModels()) {
    if (spec.ok() && info.name == spec->name && !info.training_graph) {
      unit.seconds = false;
      unit.prefix = "pebbling";
      return unit;
    }
  }
  unit.prefix = "model";
  unit.suffix = absl::StrFormat("at %g TFLOP/s", throughput_flops_per_s / 1e12);
  return unit;
}

absl::StatusOr<double> GraphSource::PlannerBandwidth(absl::string_view given) const {
  if (!given.empty()) return ParseBandwidth(given);
  if (!profile.empty()) {
    ASSIGN_OR_RETURN(CostProfile p, ReadCostProfileFile(profile));
    if (auto measured = p.PlannerBandwidth()) return *measured;
  }
  return kDefaultHostBandwidthBytesPerS;
}

nlohmann::json WorkspaceStatsToJson(const std::string& backend, const WorkspaceQueryStats& stats,
                                    const std::string& choice) {
  return {{"backend", backend},
          {"choice", choice},
          {"nodes_queried", stats.queried},
          {"nodes_raised", stats.raised},
          {"largest_bytes", stats.largest_bytes}};
}

std::string WorkspaceStatsLine(const std::string& backend, const WorkspaceQueryStats& stats,
                               const std::string& choice) {
  return absl::StrCat(stats.raised, " of ", stats.queried, " computed nodes take kernel scratch on ",
                      backend, " (the largest ", FormatBytes(stats.largest_bytes),
                      "), planned in the arena",
                      choice == "least" ? "; the least-workspace configurations, as the "
                                          "budget does not hold the fastest ones'"
                                        : "");
}

std::string GraphSource::Label() const { return model.empty() ? graph : model; }

std::vector<PathFlag> GraphSource::InputFiles() const {
  std::vector<PathFlag> files;
  if (!graph.empty()) files.emplace_back(graph, "--graph");
  if (!profile.empty()) files.emplace_back(profile, "--profile");
  return files;
}

absl::Status CheckOutputPath(const std::string& path, bool force) {
  if (path.empty() || path == "-") return absl::OkStatus();
  namespace fs = std::filesystem;
  const std::string shown = Quote(path);
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(path, ec);
  if (!fs::exists(link)) return absl::OkStatus();
  const fs::file_status target = fs::status(path, ec);
  if (fs::is_symlink(link) && !fs::exists(target)) {
    return absl::AlreadyExistsError(absl::StrCat(
        shown, " is a symbolic link to a missing file; remove it or choose another path"));
  }
  if (fs::is_character_file(target)) return absl::OkStatus();  // /dev/null, /dev/stdout
  if (fs::is_directory(target)) {
    return absl::InvalidArgumentError(absl::StrCat(shown, " is a directory"));
  }
  if (!fs::is_regular_file(target)) {
    return absl::InvalidArgumentError(absl::StrCat(shown, " exists and is not a regular file"));
  }
  if (!force) {
    return absl::AlreadyExistsError(absl::StrCat(shown, " exists; pass --force to replace it"));
  }
  return absl::OkStatus();
}

absl::Status WriteOutput(const std::string& path, const std::string& text, bool force) {
  if (path.empty() || path == "-") {
    errno = 0;
    std::cout << text;
    std::cout.flush();
    if (!std::cout) {
      return absl::DataLossError(absl::StrCat(
          "cannot write standard output",
          errno != 0 ? absl::StrCat(": ", std::strerror(errno)) : std::string()));
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckOutputPath(path, force));
  return WriteFileAtomically(path, text);
}

namespace {

namespace fs = std::filesystem;

// `path` made absolute, resolved through the symbolic links of its longest
// existing prefix, and normalised (weakly_canonical leaves a relative path
// relative when no prefix of it exists).
fs::path NormalPath(const std::string& path) {
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  if (ec) absolute = fs::path(path);
  fs::path normal = fs::weakly_canonical(absolute, ec);
  if (ec) normal = absolute;
  return normal.lexically_normal();
}

}  // namespace

namespace {

// What identifies a file for SameFile: its normal path, and its device and
// inode where it exists (after links).
struct FileKey {
  fs::path normal;
  std::optional<std::pair<dev_t, ino_t>> inode;
};

FileKey KeyOf(const std::string& path) {
  FileKey key{NormalPath(path), std::nullopt};
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) key.inode = std::make_pair(st.st_dev, st.st_ino);
  return key;
}

// `p` without a trailing separator: "out/" names what "out" names.
fs::path WithoutTrailingSeparator(const fs::path& p) {
  return !p.has_filename() && p.has_relative_path() ? p.parent_path() : p;
}

bool SameKey(const FileKey& a, const FileKey& b) {
  return WithoutTrailingSeparator(a.normal) == WithoutTrailingSeparator(b.normal) ||
         (a.inode.has_value() && a.inode == b.inode);
}

}  // namespace

bool SameFile(const std::string& a, const std::string& b) { return SameKey(KeyOf(a), KeyOf(b)); }

absl::Status CheckOutputs(const std::vector<PathFlag>& outputs,
                          const std::vector<PathFlag>& inputs, bool force,
                          const std::vector<std::string>& made_directories) {
  auto skipped = [](const std::string& path) { return path.empty() || path == "-"; };
  // Each path's key once: a run dumps every gradient and reads every
  // parameter, so the pairs run to tens of thousands.
  std::vector<FileKey> input_keys;
  for (const auto& [input, input_option] : inputs) {
    input_keys.push_back(skipped(input) ? FileKey{} : KeyOf(input));
  }
  std::vector<FileKey> output_keys;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [path, option] = outputs[i];
    output_keys.push_back(skipped(path) ? FileKey{} : KeyOf(path));
    if (skipped(path)) continue;
    for (size_t j = 0; j < i; ++j) {
      const auto& [other, other_option] = outputs[j];
      if (!skipped(other) && SameKey(output_keys[i], output_keys[j])) {
        return absl::InvalidArgumentError(absl::StrCat(other_option, " and ", option,
                                                       " both write ", Quote(path),
                                                       "; give them different files"));
      }
    }
    for (size_t j = 0; j < inputs.size(); ++j) {
      const auto& [input, input_option] = inputs[j];
      if (skipped(input) || !SameKey(output_keys[i], input_keys[j])) continue;
      // A device (/dev/null, /dev/stdin) replaces nothing.
      std::error_code ec;
      if (fs::is_character_file(fs::status(path, ec))) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          option, " ", Quote(path), " is also an input (", input_option, "); pebble does not "
          "replace its own input, not even with --force: give another file"));
    }
  }
  std::vector<fs::path> made;
  for (const std::string& dir : made_directories) {
    if (!dir.empty()) made.push_back(NormalPath(dir));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [path, option] = outputs[i];
    absl::Status s = CheckOutputPath(path, force);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(option, ": ", s.message()));
    if (skipped(path)) continue;
    // Where the file goes must be a directory by the time it is written,
    // or the write fails after all the work.
    const fs::path parent = output_keys[i].normal.parent_path();
    std::error_code ec;
    if (fs::is_directory(parent, ec)) continue;
    // `parent` is a made directory or one of the directories above it.
    auto above = [&parent](const fs::path& dir) {
      return std::mismatch(parent.begin(), parent.end(), dir.begin(), dir.end()).first ==
             parent.end();
    };
    if (std::any_of(made.begin(), made.end(), above)) continue;
    const fs::path given = fs::path(path).parent_path();  // as the user spelt it
    return absl::InvalidArgumentError(absl::StrCat(
        option, " ", Quote(path), ": ", Quote(given.empty() ? "." : given.string()),
        fs::exists(parent, ec) ? " is not a directory" : " does not exist"));
  }
  return absl::OkStatus();
}

namespace {

constexpr char kUsagePayload[] = "pebble.cli/usage";

}  // namespace

absl::Status UsageError(absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kUsagePayload, absl::Cord("1"));
  return status;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

CLI::Validator NumberAbove(double min, absl::string_view what) {
  return CLI::Validator(
      [min, what = std::string(what)](std::string& text) -> std::string {
        double value = 0;
        if (ParseDecimal(text, &value) && value > min) return "";
        return absl::StrCat("must be ", what, ", got ", Quote(text));
      },
      "NUMBER");
}

namespace {

// A validator from a parser that returns a Status: its message, or "".
template <typename Parse>
CLI::Validator StatusValidator(Parse parse, const std::string& type) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        const absl::Status s = parse(text);
        return s.ok() ? std::string() : std::string(s.message());
      },
      type);
}

absl::Status CheckPolicyName(absl::string_view name) {
  if (absl::StartsWith(name, kExecPolicyPrefix)) {
    if (absl::StripAsciiWhitespace(name.substr(kExecPolicyPrefix.size())).empty()) {
      return absl::InvalidArgumentError("policy 'exec:' names no program (exec:PROGRAM)");
    }
    return absl::OkStatus();
  }
  return MakePlanner(name).status();
}

// A SIZE validator: `parse` (text -> bytes) accepts the value and it is above
// zero.
absl::Status CheckPositiveBytes(absl::StatusOr<int64_t> (*parse)(absl::string_view),
                                absl::string_view text) {
  ASSIGN_OR_RETURN(int64_t bytes, parse(text));
  if (bytes > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("must be positive, got ", Quote(text)));
}

CLI::Validator PositiveBytes(absl::StatusOr<int64_t> (*parse)(absl::string_view)) {
  return StatusValidator(
      [parse](const std::string& t) { return CheckPositiveBytes(parse, t); }, "SIZE");
}

}  // namespace

CLI::Validator SizeValue() {
  return StatusValidator([](const std::string& t) { return ParseSize(t).status(); }, "SIZE");
}

CLI::Validator PositiveSize() { return PositiveBytes(ParseSize); }

CLI::Validator BudgetValue() {
  return StatusValidator(
      [](const std::string& t) -> absl::Status {
        RETURN_IF_ERROR(CheckBudgetHasUnit(t, /*percent_allowed=*/true));
        return ParseBudget(t).status();
      },
      "BUDGET");
}

CLI::Validator FitBudgetValue() {
  return StatusValidator(
      [](const std::string& t) -> absl::Status {
        RETURN_IF_ERROR(CheckBudgetHasUnit(t, /*percent_allowed=*/false));
        return CheckPositiveBytes(ParseFitBudget, t);
      },
      "SIZE");
}

absl::StatusOr<std::vector<std::string>> ListItems(const std::string& text,
                                                   absl::string_view item) {
  std::vector<std::string> items;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    items.emplace_back(absl::StripAsciiWhitespace(part));
  }
  if (std::all_of(items.begin(), items.end(), [](const std::string& i) { return i.empty(); })) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(text), " names no ", item));
  }
  if (std::any_of(items.begin(), items.end(), [](const std::string& i) { return i.empty(); })) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quote(text), " has an empty ", item, " between its commas"));
  }
  // (each item is one column or row of the results: twice would plan it twice)
  for (size_t i = 0; i < items.size(); ++i) {
    if (std::find(items.begin(), items.begin() + i, items[i]) != items.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat(Quote(text), " names the ", item, " ", Quote(items[i]), " twice"));
    }
  }
  return items;
}

absl::StatusOr<std::vector<std::string>> PolicyNames(const std::string& text) {
  if (absl::StripAsciiWhitespace(text) == "all") return std::vector<std::string>{};
  return ListItems(text, "policy");
}

CLI::Validator BudgetList() {
  return StatusValidator(
      [](const std::string& t) -> absl::Status {
        ASSIGN_OR_RETURN(const std::vector<std::string> budgets, ListItems(t, "budget"));
        for (const std::string& b : budgets) {
          RETURN_IF_ERROR(CheckBudgetHasUnit(b, /*percent_allowed=*/true));
          RETURN_IF_ERROR(ParseBudget(b).status());
        }
        return absl::OkStatus();
      },
      "B1,B2,...");
}

CLI::Validator NetworkValue() {
  return StatusValidator([](const std::string& t) { return ParseNetwork(t).status(); },
                         "LINK");
}

CLI::Validator BandwidthValue() {
  return StatusValidator([](const std::string& t) { return ParseBandwidth(t).status(); },
                         "BYTES/S");
}

CLI::Validator PolicyName() {
  return StatusValidator([](const std::string& t) { return CheckPolicyName(t); }, "POLICY");
}

CLI::Validator PolicyList() {
  return StatusValidator(
      [](const std::string& t) -> absl::Status {
        ASSIGN_OR_RETURN(const std::vector<std::string> names, PolicyNames(t));
        for (const std::string& name : names) RETURN_IF_ERROR(CheckPolicyName(name));
        return absl::OkStatus();
      },
      "P1,P2,...");
}

CLI::Validator BackendName() {
  return StatusValidator(
      [](const std::string& t) -> absl::Status {
        if (t == "cpu" || t == "cuda") return absl::OkStatus();
        return absl::InvalidArgumentError(
            absl::StrCat("unknown backend ", Quote(t), "; known: cpu, cuda"));
      },
      "BACKEND");
}

void AddOptimizerOption(CLI::App* cmd, std::string& optimizer) {
  cmd->add_option("--optimizer", optimizer,
                  "end the training step with an optimizer's update of every parameter: "
                  "sgd, adam or adamw, with settings after a colon, e.g. "
                  "sgd:lr=0.1,momentum=0.9 or adam:lr=1e-3,weight_decay=0.01 (PyTorch's "
                  "defaults otherwise); placement: "
                  "state= and parameters= (device, host or auto), gradients=keep|drop, "
                  "updates=device|host|auto; max_grad_norm=X clips the gradients by their "
                  "2-norm first, as clip_grad_norm_; parameter groups after semicolons, a "
                  "glob of parameter ids and its settings each, e.g. "
                  "'adamw:lr=1e-3;*.bias:weight_decay=0' (docs/training.md)");
}

CLI::Option* AddFrozenOption(CLI::App* cmd, std::string& frozen) {
  return cmd->add_option("--frozen", frozen,
                  "initializers not to train, comma-separated ids or shell globs (*, ? and "
                  "[...]), e.g. 'mean,std' or 'backbone.*': buffers the forward reads "
                  "(register_buffer, as a normalization's mean and std) and frozen parameters "
                  "(requires_grad=False), which torch.onnx.export writes like the trained "
                  "ones; they become buffers, with no gradient and no update "
                  "(docs/import.md)");
}

absl::StatusOr<std::vector<std::string>> ParseFrozenOption(const std::string& text) {
  if (text.empty()) return std::vector<std::string>{};
  absl::StatusOr<std::vector<std::string>> patterns = ListItems(text, "pattern");
  if (!patterns.ok()) return UsageError(absl::StrCat("--frozen: ", patterns.status().message()));
  return patterns;
}

absl::Status ImportErrorOfOptions(const absl::Status& status) {
  if (IsOnnxOptionError(status)) return UsageError(absl::StrCat("--", status.message()));
  return status;
}

absl::StatusOr<OptimizerSpec> ParseOptimizerOption(const std::string& text) {
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizer(text);
  if (!spec.ok()) return UsageError(absl::StrCat("--optimizer: ", spec.status().message()));
  return spec;
}

absl::StatusOr<Graph> AppendOptimizerStep(const Graph& graph, const OptimizerSpec& spec,
                                          CostModel cost) {
  absl::StatusOr<Graph> stepped = AddOptimizerStep(graph, spec, cost);
  if (!stepped.ok()) {
    absl::string_view why = stepped.status().message();
    absl::ConsumePrefix(&why, "optimizer: ");
    // A group that matches no parameter is the command line's (exit 2, as
    // --optimizer's other refusals); the rest is the graph's.
    if (absl::StartsWith(why, "parameter group ")) {
      return UsageError(absl::StrCat("--optimizer: ", why));
    }
    return absl::Status(stepped.status().code(), absl::StrCat("--optimizer: ", why));
  }
  return stepped;
}

CLI::Validator ModelName() {
  return StatusValidator([](const std::string& t) { return ParseModelSpec(t).status(); },
                         "MODEL");
}

CLI::Validator NotStdout(absl::string_view what) {
  return CLI::Validator(
      [what = std::string(what)](std::string& text) -> std::string {
        if (text != "-") return "";
        return absl::StrCat("'-' (stdout) cannot take ", what,
                            ": the command prints its report there; give a file");
      },
      "FILE");
}

CLI::Validator IntegerIn(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        int64_t value = 0;
        if (absl::SimpleAtoi(text, &value) && value >= min && value <= max &&
            text.find_first_of(" \t+") == std::string::npos) {
          return "";
        }
        return absl::StrCat("must be a whole number from ", min, " to ", max, ", got ",
                            Quote(text));
      },
      "INT");
}

namespace {

constexpr size_t kHelpWidth = 100;

// `text` with each line that does not start with a blank wrapped at word
// boundaries to `width` columns; indented lines (examples) stay as they are.
std::string WrapProse(const std::string& text, size_t width) {
  std::string out;
  bool first_line = true;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!first_line) out += '\n';
    first_line = false;
    if (line.empty() || line.front() == ' ' || line.size() <= width) {
      absl::StrAppend(&out, line);
      continue;
    }
    size_t used = 0;
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      if (used > 0 && used + 1 + word.size() > width) {
        out += '\n';
        used = 0;
      } else if (used > 0) {
        out += ' ';
        ++used;
      }
      absl::StrAppend(&out, word);
      used += word.size();
    }
  }
  return out;
}

class WrappingFormatter : public CLI::Formatter {
 public:
  std::string make_option_desc(const CLI::Option* option) const override {
    return WrapProse(option->get_description(), DescriptionWidth());
  }
  // In the list of commands, the first line of each description: its
  // examples are in the command's own help.
  std::string make_subcommand(const CLI::App* sub) const override {
    const std::string& description = sub->get_description();
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true),
                             WrapProse(description.substr(0, description.find('\n')),
                                       DescriptionWidth()),
                             get_column_width());
    return out.str();
  }
  std::string make_description(const CLI::App* app) const override {
    return WrapProse(CLI::Formatter::make_description(app), kHelpWidth);
  }

 private:
  size_t DescriptionWidth() const {
    return get_column_width() + 30 < kHelpWidth ? kHelpWidth - get_column_width() : 30;
  }
};

}  // namespace

std::shared_ptr<CLI::Formatter> HelpFormatter() { return std::make_shared<WrappingFormatter>(); }

void RefuseEmptyValues(CLI::App& app) {
  const CLI::Validator not_empty(
      [](std::string& text) -> std::string {
        return text.empty() ? std::string("must not be empty") : std::string();
      },
      "");
  for (CLI::Option* option : app.get_options()) {
    if (option->get_type_size() != 0) option->check(not_empty);
  }
  for (CLI::App* sub : app.get_subcommands({})) RefuseEmptyValues(*sub);
}

namespace {

// Every spelling of `cmd`'s options and of its parents' ("--policy", "-p").
std::vector<std::string> OptionSpellings(const CLI::App* cmd) {
  std::vector<std::string> names;
  for (const CLI::App* at = cmd; at != nullptr; at = at->get_parent()) {
    for (const CLI::Option* option : at->get_options()) {
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
      for (const std::string& name : option->get_snames()) names.push_back("-" + name);
    }
  }
  return names;
}

// "unknown option '--polcy' (did you mean '--policy'?)" for the first
// argument `cmd` did not take that looks like an option; empty when none
// does or none is near.
std::string UnknownOptionHint(const CLI::App* cmd) {
  const std::vector<std::string> spellings = OptionSpellings(cmd);
  std::vector<std::string> extras;  // what the command and those above it did not take
  for (const CLI::App* at = cmd; at != nullptr; at = at->get_parent()) {
    for (const std::string& arg : at->remaining()) extras.push_back(arg);
  }
  for (const std::string& arg : extras) {
    if (arg.size() < 2 || arg[0] != '-' || absl::ascii_isdigit(arg[1])) continue;
    const std::string flag = arg.substr(0, arg.find('='));
    // Long names get two edits; a short one ("-x") only the exact spelling.
    std::string nearest = flag.size() > 3 ? NearestName(flag, spellings) : "";
    // run's and fit's --workspace query is plan's and compare's --backend.
    if (nearest.empty() && flag == "--workspace" &&
        std::find(spellings.begin(), spellings.end(), "--backend") != spellings.end()) {
      nearest = "--backend cpu";
    }
    return absl::StrCat("unknown option ", Quote(flag),
                        nearest.empty() ? std::string()
                                        : absl::StrCat(" (did you mean ", Quote(nearest), "?)"));
  }
  return "";
}

}  // namespace

std::string OneLineFailure(const CLI::App* app, const CLI::Error& e) {
  // The command being parsed: the deepest one given.
  std::string command = "pebble";
  const CLI::App* deepest = app;
  for (const CLI::App* at = app; at != nullptr;) {
    const std::vector<const CLI::App*> parsed = at->get_subcommands([](const CLI::App* sub) {
      return sub->parsed();
    });
    if (parsed.empty()) break;
    at = deepest = parsed.front();
    absl::StrAppend(&command, " ", at->get_name());
  }
  std::string what = e.what();
  if (command == "pebble" && e.get_name() == "RequiredError") {
    std::vector<std::string> names;
    for (const CLI::App* sub : app->get_subcommands({})) names.push_back(sub->get_name());
    const std::vector<std::string> rest = app->remaining();
    if (rest.empty()) {
      what = absl::StrCat("give a command: ", absl::StrJoin(names, ", "));
    } else {
      const std::string nearest = NearestName(rest.front(), names);
      what = absl::StrCat("unknown command ", Quote(rest.front()),
                          nearest.empty() ? std::string()
                                          : absl::StrCat(" (did you mean ", Quote(nearest), "?)"),
                          "; the commands are ", absl::StrJoin(names, ", "));
    }
  } else if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    if (std::string hint = UnknownOptionHint(deepest); !hint.empty()) what = hint;
  } else if (e.get_name() == "ValidationError") {
    // "--budget: 70: did you mean ..." reads "--budget 70: did you mean ...".
    const size_t colon = what.find(": ");
    const size_t value_end = colon == std::string::npos ? colon : what.find(": ", colon + 2);
    if (value_end != std::string::npos && what.rfind("-", 0) == 0 &&
        what.find(' ', colon + 2) > value_end) {
      what.erase(colon, 1);
    }
  }
  return absl::StrCat("pebble: ", Printable(what, 600), " (see '", command, " --help')\n");
}
void PrintJson(const nlohmann::json& doc) {
  // replace: an invalid UTF-8 sequence becomes U+FFFD instead of throwing.
  std::cout << doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  std::cout.flush();
}

namespace {

bool LooksNumeric(const std::string& cell) {
  if (cell.empty() || cell == "-") return true;
  const char c = cell[0];
  return absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' ||
         c == '.';
}

}  // namespace

namespace {

// Columns `text` takes: its UTF-8 code points (a continuation byte takes
// none).
size_t DisplayWidth(const std::string& text) {
  size_t n = 0;
  for (const char ch : text) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

// The first `columns` code points of `text`.
std::string FirstColumns(const std::string& text, size_t columns) {
  size_t seen = 0, end = 0;
  for (; end < text.size(); ++end) {
    if ((static_cast<unsigned char>(text[end]) & 0xC0) != 0x80 && seen++ == columns) break;
  }
  return text.substr(0, end);
}

}  // namespace

std::string Table::ToString(size_t max_width) const {
  const size_t cols = header_.size();
  std::vector<size_t> width(cols, 0);
  std::vector<bool> numeric(cols, true);
  std::vector<std::vector<std::string>> rows;
  rows.reserve(rows_.size());
  for (const auto& row : rows_) {
    rows.emplace_back();
    // (a cell as a terminal shows it: an id's ESC or NUL escaped, not sent raw)
    for (const std::string& cell : row) {
      rows.back().push_back(Printable(cell, std::numeric_limits<size_t>::max()));
    }
  }
  for (size_t c = 0; c < cols; ++c) width[c] = DisplayWidth(header_[c]);
  for (const auto& row : rows) {
    for (size_t c = 0; c < cols && c < row.size(); ++c) {
      width[c] = std::max(width[c], DisplayWidth(row[c]));
      if (!LooksNumeric(row[c])) numeric[c] = false;
    }
  }
  if (max_width > 0 && cols > 0) {
    size_t others = 0;
    for (size_t c = 0; c + 1 < cols; ++c) others += width[c] + 2;
    constexpr size_t kLeast = 12;
    if (others + width[cols - 1] > max_width) {
      width[cols - 1] = std::max({kLeast, header_[cols - 1].size(),
                                  max_width > others ? max_width - others : 0});
    }
  }
  auto cut = [&](const std::string& cell, size_t c) {
    if (DisplayWidth(cell) <= width[c]) return cell;
    return FirstColumns(cell, width[c] - 3) + "...";
  };
  auto render = [&](const std::vector<std::string>& row, bool is_header) {
    std::string line;
    for (size_t c = 0; c < cols; ++c) {
      const std::string cell = cut(c < row.size() ? row[c] : "", c);
      const std::string pad(width[c] - DisplayWidth(cell), ' ');
      if (c > 0) line += "  ";
      line += (numeric[c] && !is_header) || (numeric[c] && is_header) ? pad + cell : cell + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + "\n";
  };
  std::string out = render(header_, true);
  size_t total = 0;
  for (size_t c = 0; c < cols; ++c) total += width[c] + (c > 0 ? 2 : 0);
  out += std::string(total, '-') + "\n";
  for (const auto& row : rows) out += render(row, false);
  return out;
}

std::string DefinitionList(const std::vector<std::pair<std::string, std::string>>& entries,
                           size_t max_width) {
  size_t name_width = 0;
  for (const auto& [name, text] : entries) name_width = std::max(name_width, name.size());
  const size_t indent = name_width + 2;
  const size_t text_width = max_width > indent + 20 ? max_width - indent : 20;
  std::string out;
  for (const auto& [name, text] : entries) {
    std::string lead = name + std::string(indent - name.size(), ' ');
    for (absl::string_view line : absl::StrSplit(WrapProse(text, text_width), '\n')) {
      absl::StrAppend(&out, lead, line, "\n");
      lead = std::string(indent, ' ');
    }
  }
  return out;
}

std::string Table::ToCsv() const {
  auto quote = [](const std::string& cell) {
    if (cell.find_first_of(",\"\n") == std::string::npos) return cell;
    std::string q = "\"";
    for (char ch : cell) {
      if (ch == '"') q += '"';
      q += ch;
    }
    return q + "\"";
  };
  std::string out;
  auto line = [&](const std::vector<std::string>& row) {
    std::vector<std::string> cells;
    for (const auto& c : row) cells.push_back(quote(c));
    out += absl::StrJoin(cells, ",") + "\n";
  };
  line(header_);
  for (const auto& row : rows_) line(row);
  return out;
}

std::string OverheadPercent(double overhead) {
  return absl::StrFormat("%.1f%%", std::abs(overhead) < 5e-4 ? 0.0 : 100 * overhead);
}

void AddOwnOrderFlag(CLI::App* cmd, bool& own_order) {
  cmd->add_flag("--own-order", own_order,
                "plan over the graph's own order only: the policy as published, not composed with "
                "best-order (by default every recomputation and offload policy also plans "
                "over best-order's order and takes the better plan; docs/semantics.md)");
}

void AddQuietFlag(CLI::App* cmd, bool& quiet) {
  cmd->add_flag("--quiet,-q", quiet,
                "print no progress of long planning on stderr (--json prints none either)");
}

std::function<void(const PlanProgress&)> StderrProgress() {
  struct Shared {
    std::mutex mutex;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  };
  auto shared = std::make_shared<Shared>();
  return [shared](const PlanProgress& p) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - shared->start).count();
    if (elapsed < 1.0) return;
    std::string line = absl::StrFormat("pebble: [%.1f s] %s", elapsed, p.stage);
    if (p.incumbent || p.bound) {
      std::vector<std::string> parts;
      if (p.incumbent) parts.push_back(absl::StrFormat("incumbent %.6g", *p.incumbent));
      if (p.bound) parts.push_back(absl::StrFormat("bound %.6g", *p.bound));
      absl::StrAppend(&line, " (", absl::StrJoin(parts, ", "), ")");
    }
    const std::lock_guard<std::mutex> lock(shared->mutex);
    std::cerr << line << "\n";
  };
}

void StderrStatusLine::Show(std::string text) {
  constexpr size_t kWidth = 99;
  if (text.size() > kWidth) text.resize(kWidth);
  const std::lock_guard<std::mutex> lock(mutex_);
  const size_t blanks = shown_ > text.size() ? shown_ - text.size() : 0;
  std::cerr << "\r" << text << std::string(blanks, ' ') << std::flush;
  shown_ = std::max<size_t>(text.size(), 1);
}

void StderrStatusLine::Clear() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (shown_ > 0) std::cerr << "\r\033[K" << std::flush;
  shown_ = 0;
}

int Fail(const absl::Status& status) {
  std::cerr << "pebble: " << Printable(status.message(), 10000) << "\n";
  return IsUsageError(status) ? 2 : 1;
}

int FinishStdout(int exit_code) {
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  // A command that failed has said why on its one line already.
  if (exit_code != 0 || (std::cout && flushed && !std::ferror(stdout))) return exit_code;
  std::cerr << "pebble: cannot write standard output"
            << (error != 0 ? absl::StrCat(": ", std::strerror(error)) : std::string()) << "\n";
  return 1;
}

void RankFlags::AddOptions(CLI::App* cmd, const GraphSource* source, bool planned,
                           bool copies) {
  source_ = source;
  cmd->add_option("--ranks", ranks,
                  "data-parallel ranks running the plan, each on its own slice of the batch "
                  "(default 1); above 1 every parameter's gradient is summed over them by "
                  "an all_reduce step after the backward's last use (a clipped step's before "
                  "the clipping reads it), and the figures are one rank's (docs/semantics.md, "
                  "\"Collectives across ranks\")")
      ->check(IntegerIn(1, 1 << 20));
  cmd->add_option("--network", network,
                  absl::StrCat("the ranks' link: bytes/s, or a preset: ethernet-10g, "
                               "ethernet-100g (12.5e9 and 10 us, the default), ib-hdr, ib-ndr, "
                               "nvlink4",
                               source != nullptr ? "; without it, the --profile's measured link "
                                                   "where it has one (pebble calibrate --ranks)"
                                                 : ""))
      ->check(NetworkValue());
  cmd->add_option("--network-latency", latency_s,
                  "time per message on the ranks' link: seconds, or with a unit (5us, 0.2ms) "
                  "(default: the preset's, else 10e-6)")
      ->transform(CLI::Validator(
          [](std::string& text) -> std::string {
            // (the unit's scale applied here: the option then reads seconds)
            // (divided, not multiplied: 5us is 5e-06 to the last bit)
            static constexpr std::pair<absl::string_view, double> kUnits[] = {
                {"ns", 1e9}, {"us", 1e6}, {"ms", 1e3}, {"s", 1.0}};
            absl::string_view number = absl::StripAsciiWhitespace(text);
            double per_second = 1.0;
            for (const auto& [unit, divisor] : kUnits) {
              if (absl::ConsumeSuffix(&number, unit)) {
                per_second = divisor;
                break;
              }
            }
            double value = 0;
            if (ParseDecimal(std::string(absl::StripAsciiWhitespace(number)), &value) &&
                value >= 0 && std::isfinite(value)) {
              text = absl::StrFormat("%.17g", value / per_second);
              return "";
            }
            return absl::StrCat("must be a non-negative time (seconds, or with a unit: ns, us, "
                                "ms, s), got ", Quote(text));
          },
          "TIME"));
  cmd->add_option("--shard", shard,
                  "none (data parallelism: every rank holds the whole model) or full "
                  "(ZeRO-3 / FSDP FULL_SHARD: parameters, gradients and optimizer state in "
                  "1/ranks shards, each parameter gathered where read, each gradient "
                  "reduce-scattered, and a clipped step's norm summed from every rank's "
                  "shards; the plan decides when to gather again; needs --ranks 2 or more; "
                  "docs/semantics.md, \"Sharding\")")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "full"}));
  if (copies) {
    cmd->add_option("--bucket-copies", bucket_copies,
                    "none (a bucket's all-reduce works on its gradients where they lie, or "
                    "off the device, as pebble run does) or device (the runtime sends a bucket "
                    "of several gradients as one message through a flat copy of them in device "
                    "memory, as pebble.torch does: the plan holds the copy until a later step "
                    "touches one of them); docs/semantics.md, \"Buckets through a device "
                    "copy\"")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "device"}));
  }
  if (!planned) return;
  cmd->add_option("--buckets", buckets,
                  "how the gradients' all-reduces are grouped, each group one collective: "
                  "auto (the plan chooses the groups of least time), none (one all-reduce per "
                  "gradient), or a size such as 25MiB (DistributedDataParallel's rule with that "
                  "bucket cap); docs/semantics.md, \"Buckets\". With --shard full, auto joins "
                  "gathers, and reduce-scatters, into one message where the plan is faster, "
                  "none sends each on its own (FSDP's rules keep their units either way)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            absl::StatusOr<int64_t> b = ParseBuckets(text);
            return b.ok() ? "" : std::string(b.status().message());
          },
          "auto|none|SIZE"));
}

absl::Status RankFlags::Apply(PlannerOptions& options) const {
  RETURN_IF_ERROR(CheckBucketCopies());
  options.device_bucket_copies = bucket_copies == "device";
  ASSIGN_OR_RETURN(options.bucket_bytes, ParseBuckets(buckets));
  if (options.bucket_bytes != PlannerOptions::kPlannedBuckets && ranks < 2) {
    return UsageError(absl::StrCat("--buckets ", buckets, ": buckets group the collectives of "
                                   "several ranks; give --ranks 2 or more"));
  }
  if (options.bucket_bytes > 0 && shard == "full") {
    return UsageError(absl::StrCat(
        "--buckets ", buckets, ": a bucket cap groups the all-reduces of data parallelism; "
        "with --shard full, buckets are auto (gathers and reduce-scatters joined where the "
        "plan is faster) or none (each its own message)"));
  }
  options.ranks = ranks;
  ASSIGN_OR_RETURN(options.network, Link());
  return absl::OkStatus();
}

void RankProcessFlags::AddOptions(CLI::App* cmd, absl::string_view rank_help) {
  rank_option_ = cmd->add_option("--rank", rank,
                                 absl::StrCat("with --ranks: this process's rank, 0 to --ranks "
                                              "- 1", rank_help.empty() ? "" : " (", rank_help,
                                              rank_help.empty() ? "" : ")"));
  rank_option_->check(IntegerIn(0, 1 << 20));
  options_ = {
      rank_option_,
      cmd->add_option("--rendezvous", rendezvous,
                      "with --ranks: a new, empty directory that every rank sees (one machine, "
                      "or a shared file system), where the ranks meet; scripts/pebble-ranks "
                      "makes one"),
      cmd->add_option("--address", address,
                      "with --ranks: the address other ranks reach this one at (default "
                      "127.0.0.1: every rank on this machine)"),
      cmd->add_option("--rank-timeout", timeout_s,
                      "with --ranks: seconds a rank waits for the others, to meet and in each "
                      "collective (default 300)")
          ->check(NumberAbove(0, "a positive number of seconds"))};
}

void RankProcessFlags::NoteGiven() {
  given_.clear();
  for (CLI::Option* option : options_) {
    if (option->count() > 0) given_.push_back(option->get_name());
  }
}

absl::Status RankProcessFlags::Check(int ranks) const {
  if (ranks == 1) {
    if (given_.empty()) return absl::OkStatus();
    return UsageError(absl::StrCat(absl::StrJoin(given_, ", "),
                                   ": with --ranks 2 or more only"));
  }
  if (rendezvous.empty() || rank_option_ == nullptr || rank_option_->count() == 0) {
    return UsageError(absl::StrCat(
        "--ranks ", ranks, ": give --rank and --rendezvous DIR, a new directory every rank "
        "sees (scripts/pebble-ranks starts the ranks on this machine)"));
  }
  if (rank >= ranks) {
    return UsageError(absl::StrCat("--rank ", rank, ": ranks are 0 to ", ranks - 1));
  }
  return absl::OkStatus();
}

GlooOptions RankProcessFlags::Gloo(int ranks) const {
  return {.rank = rank, .ranks = ranks, .rendezvous_dir = rendezvous, .address = address,
          .timeout_s = timeout_s};
}

absl::Status RankFlags::CheckBucketCopies() const {
  if (bucket_copies != "device" || (ranks >= 2 && shard != "full")) return absl::OkStatus();
  return UsageError(absl::StrCat(
      "--bucket-copies device: buckets group the all-reduces of data parallelism; ",
      ranks < 2 ? "give --ranks 2 or more"
                : "a sharded graph (--shard full) has none (its gathers and reduce-scatters are "
                  "sent where they lie)"));
}

absl::StatusOr<NetworkLink> RankFlags::Link() const {
  if (ranks < 2 && (!network.empty() || latency_s >= 0)) {
    return UsageError(absl::StrCat(network.empty() ? "--network-latency" : "--network",
                                   ": the link between ranks; give --ranks 2 or more"));
  }
  NetworkLink link;
  if (!network.empty()) {
    ASSIGN_OR_RETURN(link, ParseNetwork(network));
  } else if (source_ != nullptr && !source_->profile.empty()) {
    ASSIGN_OR_RETURN(const CostProfile profile, ReadCostProfileFile(source_->profile));
    if (profile.network_bandwidth_bytes_per_s > 0) {
      link.bandwidth_bytes_per_s = profile.network_bandwidth_bytes_per_s;
      link.latency_s = profile.network_latency_s;
    }
  }
  if (latency_s >= 0) link.latency_s = latency_s;
  return link;
}

absl::Status RankFlags::CheckShard() const {
  if (shard == "full" && ranks < 2) return UsageError("--shard full: give --ranks 2 or more");
  return absl::OkStatus();
}

absl::StatusOr<Graph> RankFlags::Sharded(absl::StatusOr<Graph> graph) const {
  // A graph sharded already is one rank's part of a step on several: planned
  // as a whole step on one rank, its collectives would go unplanned (no
  // joined messages, no all-reduce of a clipped norm), silently.
  // Other ranks than its own are a mistake of the command line alike (exit 2).
  if (graph.ok() && shard == "none") {
    if (const std::optional<CollectiveLink> timed = ShardedRanks(*graph);
        timed.has_value() && timed->ranks != ranks) {
      return UsageError(absl::StrCat(
          "the graph is sharded for ", timed->ranks, " ranks (it has their collectives): give "
          "--ranks ", timed->ranks, ranks < 2 ? "" : absl::StrCat(", not ", ranks)));
    }
  }
  // A graph sharded already has its collectives timed for its link: a
  // --network that differs would change nothing, silently.
  if (graph.ok() && shard == "none" && (!network.empty() || latency_s >= 0)) {
    if (const std::optional<CollectiveLink> timed = ShardedRanks(*graph)) {
      ASSIGN_OR_RETURN(const NetworkLink link, Link());
      if (link.bandwidth_bytes_per_s != timed->link.bandwidth_bytes_per_s ||
          link.latency_s != timed->link.latency_s) {
        return UsageError(absl::StrCat(
            network.empty() ? "--network-latency" : "--network", ": the graph is sharded "
            "already, its collectives timed for a link of ",
            absl::StrFormat("%g", timed->link.bandwidth_bytes_per_s), " bytes/s and ",
            absl::StrFormat("%g", timed->link.latency_s), " s a message, which this does not "
            "change: shard the unsharded graph with --shard full and this link instead"));
      }
    }
  }
  if (!graph.ok() || shard == "none") return graph;
  RETURN_IF_ERROR(CheckShard());
  ASSIGN_OR_RETURN(const NetworkLink link, Link());
  return ShardGraph(*graph, ranks, link);
}

}  // namespace pebble::cli
