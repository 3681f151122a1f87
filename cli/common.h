// Shared pieces of the pebble command line: graph sources, output files,
// text tables.
#ifndef PEBBLE_CLI_COMMON_H_
#define PEBBLE_CLI_COMMON_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/optimizer.h"
#include "runtime/gloo/gloo_collectives.h"
#include "runtime/workspace.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "nlohmann/json.hpp"

namespace pebble::cli {

// A duration with its unit: "1.5 h", "20 min", "4.9 s", "0.23 ms", "12 us",
// "0 s".
std::string FormatSeconds(double seconds);

// The lines under a plan's `arena` row (each indented to its column) where
// the arena, the one block a run allocates for every tensor at its planned
// offset, is over a plan's byte budget: the budget bounds the peak, and
// gaps that tensors freed at different times leave add to the arena.
std::string ArenaOverBudgetNote(int64_t arena_bytes, int64_t budget_bytes);

// A schedule's collectives for people: "8 all-reduces", or "8 all-reduces
// in 3 buckets" where some are grouped; on a sharded graph "52 gathers and
// 26 reduce-scatters in 20 messages" (a bucket of collectives is one).
std::string CollectivesText(const Graph& graph, const Schedule& schedule);

// How a graph's costs read as time, so that every printed time says its unit
// and whether it is modelled or measured.
struct CostUnit {
  bool seconds = true;  // false: abstract unit steps (a pebbling graph)
  // How the costs were found: "model 0.23 ms at 10 TFLOP/s", "measured 0.23
  // ms (profile 'p.json')", "0.23 ms from the graph file's costs, read as
  // seconds".
  std::string prefix;  // "model", "measured" or ""
  std::string suffix;  // "at 10 TFLOP/s", "(profile 'p.json')", ...
  // "0.23 ms", or "12 units" for unit steps.
  std::string Amount(double cost) const;
  // The amount with its prefix and suffix.
  std::string Describe(double cost) const;
  // The prefix and suffix alone, for a legend: "model at 10 TFLOP/s".
  std::string Basis() const;
};

// --model / --graph and the cost model, shared by every command that reads
// a graph.
struct GraphSource {
  std::string model;  // "conv3d:n=128"
  std::string graph;  // path to a pebble-graph JSON file
  double throughput_flops_per_s = 10e12;
  // A cost profile from `pebble calibrate` (scheduler/cost_profile.h): node
  // costs become the measured seconds where the profile has the node's key.
  std::string profile;
  // --train: differentiate a forward --graph with `loss` first.
  bool train = false;
  std::string loss = "cross-entropy";
  // --optimizer: the optimizer's step appended to the training graph
  // (graph/optimizer.h); empty: none.
  std::string optimizer;
  // A backend ("cpu", "cuda") whose kernels' scratch becomes each computed
  // node's workspace (runtime/workspace.h); empty: the graph's own figures.
  std::string workspace_backend;
  // The backend that runs the graph (run): a --profile measured on another
  // backend is refused, as with workspace_backend.
  std::string run_backend;

  // Adds the options to `cmd`. `graph_only`: no --model (simulate needs the
  // exact graph a schedule was made for, but a model works too).
  void AddOptions(CLI::App* cmd);
  // Adds --backend (into workspace_backend), for commands that plan without
  // running: plan, compare, simulate.
  void AddWorkspaceBackendOption(CLI::App* cmd);
  // The graph, or an error naming what was wrong. With --profile the costs
  // (and kernel workspaces) are the profile's where it matches, and one line
  // on stderr says how many nodes matched; with a workspace backend, each
  // computed node's workspace is raised to what that backend's kernel takes
  // (`workspace`, optional, counts).
  absl::StatusOr<Graph> Load(WorkspaceQueryStats* workspace = nullptr) const;
  // The host link bandwidth (bytes/s) a planner should use: `given` (the
  // text of --bandwidth: bytes/s with units, or a preset of ParseBandwidth)
  // when the user passed it; else the profile's measurement
  // (CostProfile::PlannerBandwidth) when --profile has one; else SPEC's
  // default, 25e9 (PCIe Gen4).
  absl::StatusOr<double> PlannerBandwidth(absl::string_view given) const;
  // The unit and source of the graph's costs: a network of the zoo is
  // modelled (FLOPs at --throughput), a pebbling graph counts unit steps,
  // --profile's are measured, a --graph file's are read as seconds.
  CostUnit Costs() const;
  // "conv3d:n=128" or the file's path, for headers.
  std::string Label() const;
  // The files Load reads (--graph, --profile), each with its option: no
  // output of the command may replace one.
  std::vector<std::pair<std::string, std::string>> InputFiles() const;
};

// What a workspace query did (runtime/workspace.h), for the reports of
// run and plan: JSON {"backend", "choice", "nodes_queried", "nodes_raised",
// "largest_bytes"}, and one line of text. `choice`: "fastest" or "least"
// (run's pick, PlanWithBackendWorkspace).
nlohmann::json WorkspaceStatsToJson(const std::string& backend, const WorkspaceQueryStats& stats,
                                    const std::string& choice = "fastest");
std::string WorkspaceStatsLine(const std::string& backend, const WorkspaceQueryStats& stats,
                               const std::string& choice = "fastest");

// Whether `path` may be written: "-" (stdout), a path where nothing is, a
// character device such as /dev/null (writing one replaces nothing), or,
// with `force`, an existing regular file (also behind a symbolic link).
// Refused, naming the path: an existing file without `force`, a directory,
// a symbolic link whose target is missing (writing would create a file
// elsewhere), anything else that is not a regular file.
absl::Status CheckOutputPath(const std::string& path, bool force);

// Writes `text` to `path` after CheckOutputPath: "-" is stdout; a file is
// written whole or not at all (WriteFileAtomically). A write that fails
// (ENOSPC, EIO, a file that cannot be written, stdout closed) is an error
// naming the file.
absl::Status WriteOutput(const std::string& path, const std::string& text, bool force);

// A path given on the command line, and the option that gave it
// ("--graph"; for an input, what it is: "the ONNX model").
using PathFlag = std::pair<std::string, std::string>;

// Whether two paths name one file: equal once made absolute and resolved
// through the symbolic links that exist (the rest normalised: "out/x",
// "./out/../out/x" and "$PWD/out/x" are one file whether or not "out"
// exists yet), or, when both exist, one device and inode (a hard link).
bool SameFile(const std::string& a, const std::string& b);

// Checks a command's outputs before it does any work: no two of `outputs`
// name one file ("--trace and --dump both write 'out/loss.npy'"); none
// names a file of `inputs`, which the command reads: that is refused even
// with `force`, as the command would replace its own input; each may be
// written (CheckOutputPath), into a directory that exists or that the
// command creates first (one of `made_directories` or a directory above
// one). "-" and empty paths are skipped.
absl::Status CheckOutputs(const std::vector<PathFlag>& outputs,
                          const std::vector<PathFlag>& inputs, bool force,
                          const std::vector<std::string>& made_directories = {});

// A bad command line that is found only when a command runs (a --vary
// that is no parameter of --model, a --model the zoo cannot build): Fail
// prints it as any error but returns 2, as SPEC section 5 asks of a bad
// command line. The message should start with the option ("--vary: ...").
absl::Status UsageError(absl::string_view message);
bool IsUsageError(const absl::Status& status);

// CLI11 validators whose messages fit on one line. A number is decimal
// (ParseDecimal: no hex, inf or nan); `what` completes "must be ...".
CLI::Validator NumberAbove(double min, absl::string_view what);  // > min
CLI::Validator IntegerIn(int64_t min, int64_t max);
// Values judged when the command line is parsed, so that a malformed one is
// a command-line error (exit 2) before any work, on every command alike.
CLI::Validator SizeValue();       // bytes with units (ParseSize)
CLI::Validator PositiveSize();    // a SizeValue above 0
CLI::Validator BudgetValue();     // bytes, NN% or min (ParseBudget)
CLI::Validator FitBudgetValue();  // bytes only (ParseFitBudget)
CLI::Validator BudgetList();      // comma-separated BudgetValues, at least one
CLI::Validator BandwidthValue();  // bytes/s or a preset (ParseBandwidth)
CLI::Validator NetworkValue();    // bytes/s or a network preset (ParseNetwork)
CLI::Validator PolicyName();      // a registered policy or exec:PROGRAM
CLI::Validator PolicyList();      // comma-separated PolicyNames, or "all"
CLI::Validator BackendName();     // cpu or cuda (whether it runs here is checked later)

// The items of a comma-separated list (--budgets, --policies), stripped;
// refused where it names no `item` or has an empty one between its commas.
absl::StatusOr<std::vector<std::string>> ListItems(const std::string& text,
                                                   absl::string_view item);
// The policies a --policies list names (ListItems); none for "all", spaces
// around it allowed. The names are not checked (PolicyList checks them).
absl::StatusOr<std::vector<std::string>> PolicyNames(const std::string& text);
CLI::Validator ModelName();       // name[:k=v,...] of a built-in model (ParseModelSpec)
// Refuses "-" for an output that stdout cannot take: the command prints its
// report there. `what` names the output ("the schedule").
CLI::Validator NotStdout(absl::string_view what);

// CLI11's help formatter with every line within 100 columns: option and
// command descriptions, and the prose of a command's own description, are
// wrapped at word boundaries; indented lines (examples) are kept as they
// are; the list of commands shows the first line of each one's description.
// Set on the app before its commands are added (they inherit it).
std::shared_ptr<CLI::Formatter> HelpFormatter();

// Adds to every option of `app` and its commands that takes a value a check
// that the value is not empty: an empty --budget or --bandwidth must not
// quietly mean the default.
void RefuseEmptyValues(CLI::App& app);

// The one-line message CLI11 prints for a command-line error ("pebble:
// --time-limit: must be a positive number of seconds, got 'abc' (see 'pebble
// plan --help')"), for CLI::App::failure_message.
std::string OneLineFailure(const CLI::App* app, const CLI::Error& e);

// An overhead (0.032) as "3.2%". A one-shot plan's overhead is 0 up to the
// rounding of summing costs in another order: no "-0.0%".
std::string OverheadPercent(double overhead);

// Prints a JSON document on stdout (2-space indent).
void PrintJson(const nlohmann::json& doc);

// Several ranks (--ranks, --network, --network-latency, --shard): plan,
// compare, simulate and fit take them (docs/cli.md).
struct RankFlags {
  int ranks = 1;
  std::string network;    // empty: NetworkLink's default
  double latency_s = -1;  // < 0: the link's own
  std::string shard = "none";
  std::string buckets = "auto";  // ParseBuckets
  std::string bucket_copies = "none";  // or "device": PlannerOptions::device_bucket_copies

  // `source` (not owned): whose --profile's measured link (pebble calibrate
  // --ranks) stands where --network is not given. `planned`: the command
  // plans (--buckets), where simulate reads a schedule's own. `copies`:
  // the command plans or simulates for another runtime (--bucket-copies),
  // where run runs its own.
  void AddOptions(CLI::App* cmd, const GraphSource* source, bool planned = true,
                  bool copies = true);
  // Sets the planner's ranks, link (Link), buckets and bucket copies; a
  // usage error for --buckets other than auto or --bucket-copies device
  // without --ranks 2 or more, or with --shard full (its gradients are
  // reduce-scattered one by one).
  absl::Status Apply(PlannerOptions& options) const;
  // The ranks' link: --network, else the --profile's measured one, else
  // NetworkLink's default; --network-latency over its latency.
  absl::StatusOr<NetworkLink> Link() const;
  // A usage error where --shard full comes without --ranks 2 or more.
  absl::Status CheckShard() const;
  // A usage error for --bucket-copies device without --ranks 2 or more, or
  // with --shard full.
  absl::Status CheckBucketCopies() const;
  // The graph as one rank runs it: `graph` itself, or sharded (ShardGraph)
  // with --shard full (a usage error without --ranks 2 or more). A usage
  // error for a graph sharded already without --ranks (its ranks').
  absl::StatusOr<Graph> Sharded(absl::StatusOr<Graph> graph) const;

 private:
  const GraphSource* source_ = nullptr;
};

// The flags of one process among several ranks (`run` and `calibrate`
// with --ranks N): --rank, --rendezvous, --address, --rank-timeout.
class RankProcessFlags {
 public:
  int rank = 0;
  std::string rendezvous;  // the directory the ranks meet through
  std::string address = "127.0.0.1";
  double timeout_s = 300;

  // `rank_help`: what a rank is to the command, for --rank's help.
  void AddOptions(CLI::App* cmd, absl::string_view rank_help);
  // From the command's callback: which of the flags were given.
  void NoteGiven();
  // A usage error naming the flags given where `ranks` is 1, or, from 2
  // ranks, where --rank or --rendezvous is missing or --rank is out of
  // range.
  absl::Status Check(int ranks) const;
  // How ConnectGloo meets the other ranks.
  GlooOptions Gloo(int ranks) const;

 private:
  CLI::Option* rank_option_ = nullptr;
  std::vector<CLI::Option*> options_;
  std::vector<std::string> given_;  // the flags given, by name
};

// A plain text table: a header row, then rows; columns whose cells all look
// numeric are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  size_t num_columns() const { return header_.size(); }
  // The table as text. `max_width` > 0: lines longer than that have their
  // last column cut ("..."), down to 12 characters of it.
  std::string ToString(size_t max_width = 0) const;
  // Comma-separated, quoting cells that need it (RFC 4180).
  std::string ToCsv() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Names, each with its text beside it, wrapped at word boundaries to
// `max_width` columns; a '\n' in a text starts a new line there. For
// listings (models, policies) whose texts are too long for a table.
std::string DefinitionList(const std::vector<std::pair<std::string, std::string>>& entries,
                           size_t max_width);

// Registers each command on `app`. Each returns the process exit code
// through the callback's captured int.
void AddInfoCommands(CLI::App& app, int& exit_code);
void AddPlanCommands(CLI::App& app, int& exit_code);
void AddRunCommands(CLI::App& app, int& exit_code);        // run, fit
void AddCalibrateCommand(CLI::App& app, int& exit_code);   // calibrate
void AddImportCommand(CLI::App& app, int& exit_code);      // import

// --own-order (PlannerOptions::own_order) and --quiet,-q (no StderrProgress),
// with the same help on every planning command.
void AddOwnOrderFlag(CLI::App* cmd, bool& own_order);
void AddQuietFlag(CLI::App* cmd, bool& quiet);

// --optimizer (graph/optimizer.h, docs/training.md), one help text for every
// command that takes it.
void AddOptimizerOption(CLI::App* cmd, std::string& optimizer);
// The optimizer --optimizer names; a UsageError "--optimizer: ..." where
// ParseOptimizer refuses it.
absl::StatusOr<OptimizerSpec> ParseOptimizerOption(const std::string& text);
// AddOptimizerStep, its errors prefixed "--optimizer: " (their code kept).
absl::StatusOr<Graph> AppendOptimizerStep(const Graph& graph, const OptimizerSpec& spec,
                                          CostModel cost);

// --frozen (OnnxImportOptions::frozen) for the commands that import an
// ONNX model, and its comma-separated patterns (ListItems); a UsageError
// "--frozen: ..." where the list is malformed.
CLI::Option* AddFrozenOption(CLI::App* cmd, std::string& frozen);
absl::StatusOr<std::vector<std::string>> ParseFrozenOption(const std::string& text);
// An import's error, as the command line says it: a --frozen pattern that
// matches no initializer is a UsageError naming the option (exit 2, as
// --optimizer's parameter groups); the rest are unchanged.
absl::Status ImportErrorOfOptions(const absl::Status& status);

// Reports of long planning stages on stderr, for PlannerOptions::progress:
// "pebble: [12.5 s] checkmate: CBC stopped (incumbent 0.0012, bound
// 0.00119)". Stages reported within the first second are not printed (a
// quick plan prints nothing); safe to call from several threads.
std::function<void(const PlanProgress&)> StderrProgress();

// One status line on stderr that a terminal redraws in place (progress of
// long work): Show() replaces the line (cut to 99 columns, blanks over what
// the last one left), Clear() erases it; the destructor clears. For a
// terminal only: piped, it would leave carriage returns in the output.
// Thread-safe.
class StderrStatusLine {
 public:
  StderrStatusLine() = default;
  StderrStatusLine(const StderrStatusLine&) = delete;
  StderrStatusLine& operator=(const StderrStatusLine&) = delete;
  ~StderrStatusLine() { Clear(); }
  void Show(std::string text);
  void Clear();

 private:
  std::mutex mutex_;
  size_t shown_ = 0;  // length of the line on screen; 0: none
};

// Prints "pebble: <message>" on stderr, on one line (control characters
// escaped), and returns 1, or 2 for a UsageError.
int Fail(const absl::Status& status);

// Flushes stdout; where the command succeeded but its output could not be
// written (a full disk, a closed descriptor), prints the error naming
// standard output and returns 1, else `exit_code`. main calls it last.
int FinishStdout(int exit_code);

}  // namespace pebble::cli

#endif  // PEBBLE_CLI_COMMON_H_
