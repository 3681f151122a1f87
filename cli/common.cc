#include "cli/common.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graph/autodiff.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "runtime/make_backend.h"
#include "runtime/workspace.h"
#include "scheduler/cost_profile.h"
#include "scheduler/offload.h"

namespace pebble::cli {

void GraphSource::AddOptions(CLI::App* cmd) {
  auto* model_opt = cmd->add_option(
      "--model,-m", model,
      "built-in model with parameters, e.g. conv3d:n=128,batch=2 (see 'pebble models')");
  auto* graph_opt =
      cmd->add_option("--graph,-g", graph, "graph file in the pebble-graph JSON format");
  model_opt->excludes(graph_opt);
  auto* train_opt = cmd->add_flag(
      "--train", train,
      "the --graph is a forward graph: add --loss and differentiate it first (the loss "
      "reads the graph's one output and a new input 'target')");
  train_opt->needs(graph_opt);
  cmd->add_option("--loss", loss,
                  "loss for --train: cross-entropy (class indices in 'target', the default) "
                  "or mse")
      ->check(CLI::IsMember({"cross-entropy", "mse"}));
  cmd->add_option("--throughput", throughput_flops_per_s,
                  "device FLOP/s that turns a model's FLOPs into seconds of cost "
                  "(default 10e12; ignored for --graph, whose costs are given)")
      ->check(NumberAbove(0, "a positive number of FLOP/s"));
  cmd->add_option("--profile", profile,
                  "cost profile from 'pebble calibrate': measured seconds replace the "
                  "cost of every node whose op, shapes, dtype and attrs it has, and its "
                  "measured link bandwidth is used unless --bandwidth is given");
}

namespace {

absl::StatusOr<Graph> LoadWithoutProfile(const GraphSource& source) {
  if (!source.model.empty()) {
    CostModel cost;
    cost.device_flops_per_s = source.throughput_flops_per_s;
    return BuildModel(source.model, cost);
  }
  if (!source.graph.empty()) {
    ASSIGN_OR_RETURN(Graph g, ReadGraphFile(source.graph));
    if (!source.train) return g;
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
  return absl::InvalidArgumentError("give a graph: --model NAME[:k=v,...] or --graph FILE");
}

}  // namespace

void GraphSource::AddWorkspaceBackendOption(CLI::App* cmd) {
  cmd->add_option("--backend", workspace_backend,
                  "plan for this backend (cpu or cuda): the scratch each kernel takes there "
                  "(oneDNN scratchpads and relayouts, cuDNN workspace) becomes its node's "
                  "workspace, so the arena holds it (docs/runtime.md, \"Workspace\"); "
                  "default: the graph's own workspace figures");
}

absl::StatusOr<Graph> GraphSource::Load(WorkspaceQueryStats* workspace) const {
  ASSIGN_OR_RETURN(Graph g, LoadWithoutProfile(*this));
  if (!profile.empty()) {
    ASSIGN_OR_RETURN(CostProfile p, ReadCostProfileFile(profile));
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
    std::cout << text;
    std::cout.flush();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckOutputPath(path, force));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", Quote(path)));
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("failed writing ", Quote(path)));
  return absl::OkStatus();
}

absl::Status CheckDistinctOutputs(
    const std::vector<std::pair<std::string, std::string>>& outputs) {
  namespace fs = std::filesystem;
  std::vector<std::pair<fs::path, std::string>> seen;
  for (const auto& [path, option] : outputs) {
    if (path.empty() || path == "-") continue;
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(path, ec);
    if (ec) canonical = fs::absolute(path, ec).lexically_normal();
    for (const auto& [other, other_option] : seen) {
      if (other == canonical) {
        return absl::InvalidArgumentError(absl::StrCat(
            other_option, " and ", option, " both write ", Quote(path), "; give them different files"));
      }
    }
    seen.emplace_back(std::move(canonical), option);
  }
  return absl::OkStatus();
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

std::string OneLineFailure(const CLI::App* app, const CLI::Error& e) {
  // The command being parsed: the deepest one given.
  std::string command = "pebble";
  for (const CLI::App* at = app; at != nullptr;) {
    const std::vector<const CLI::App*> parsed = at->get_subcommands([](const CLI::App* sub) {
      return sub->parsed();
    });
    if (parsed.empty()) break;
    at = parsed.front();
    absl::StrAppend(&command, " ", at->get_name());
  }
  std::string what = e.what();
  if (command == "pebble" && e.get_name() == "RequiredError") {
    std::vector<std::string> names;
    for (const CLI::App* sub : app->get_subcommands({})) names.push_back(sub->get_name());
    const std::vector<std::string> rest = app->remaining();
    what = rest.empty() ? absl::StrCat("give a command: ", absl::StrJoin(names, ", "))
                        : absl::StrCat("unknown command ", Quote(rest.front()),
                                       "; the commands are ", absl::StrJoin(names, ", "));
  }
  return absl::StrCat("pebble: ", Printable(what, 300), " (see '", command, " --help')\n");
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

std::string Table::ToString() const {
  const size_t cols = header_.size();
  std::vector<size_t> width(cols, 0);
  std::vector<bool> numeric(cols, true);
  for (size_t c = 0; c < cols; ++c) width[c] = header_[c].size();
  for (const auto& row : rows_) {
    for (size_t c = 0; c < cols && c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
      if (!LooksNumeric(row[c])) numeric[c] = false;
    }
  }
  auto render = [&](const std::vector<std::string>& row, bool is_header) {
    std::string line;
    for (size_t c = 0; c < cols; ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      const std::string pad(width[c] - cell.size(), ' ');
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
  for (const auto& row : rows_) out += render(row, false);
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

int Fail(const absl::Status& status) {
  std::cerr << "pebble: " << Printable(status.message(), 10000) << "\n";
  return 1;
}

}  // namespace pebble::cli
