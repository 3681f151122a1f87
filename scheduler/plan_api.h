// The planning entry points shared by the command line, C++ users and the
// Python module: one call each for `plan`, `compare` and `fit`, with the
// JSON documents of `plan --json` and `compare --format json`.
#ifndef PEBBLE_SCHEDULER_PLAN_API_H_
#define PEBBLE_SCHEDULER_PLAN_API_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/models/models.h"
#include "nlohmann/json.hpp"
#include "scheduler/memory_layout.h"
#include "scheduler/planner.h"

namespace pebble {

// ---- plan

struct PlanRequest {
  // A registered policy, or exec:PROGRAM (scheduler/external_policy.h). Empty:
  // DefaultPolicy (best-order when the baseline fits the budget, else
  // hybrid).
  std::string policy;
  // The budget as the command line takes it (ParseBudget): "60%", "2GiB",
  // "min" or bytes.
  std::string budget = "100%";
  // Everything but budget_bytes, which `budget` sets.
  PlannerOptions options;
};

struct PlanOutcome {
  std::string policy;  // the policy that planned (the default resolved)
  std::string budget;  // the request's text
  int64_t baseline_peak_bytes = 0;
  bool budget_is_min = false;
  // The budget in bytes; with "min", the peak reached.
  int64_t budget_bytes = 0;
  double bandwidth_bytes_per_s = 0;  // the host link the plan assumed
  double plan_time_s = 0;
  PlanResult result;
  MemoryLayout layout;  // the arena layout of result.schedule
  // The parameters' own bytes, and what every plan holds when it ends
  // (EndStateBytes): figures that show why a budget cannot be met.
  int64_t parameter_bytes = 0;
  int64_t end_state_bytes = 0;
  // Where the plan does not fit a budget other than "min": the peak the
  // policy reaches at "min" (a second plan), and what to do about it
  // (LeastPeakAdvice); at "min", the limit it broke (the host budget).
  // Empty where it fits.
  std::optional<int64_t> least_peak_bytes;
  // Whether the search for that least peak reached its time limit: a longer
  // one may find less, so the advice does not call it the least.
  bool least_peak_cut_short = false;
  std::string advice;
};

// Bytes of the graph's parameters (Role::kParameter).
int64_t ParameterBytes(const Graph& graph);
// What every schedule holds when it ends: the persistent tensors and the
// outputs (each storage once). For a training graph: parameters, buffers,
// the batch, the loss and the parameter gradients. No plan's peak is lower.
int64_t EndStateBytes(const Graph& graph);

// "rotor reaches 167 MiB (72%) at least: try --budget 72% or --budget min":
// the least peak a policy reaches, in bytes and as a percentage of the
// baseline peak, rounded up so that the budget it suggests admits that peak.
// Where `end_state_bytes` (EndStateBytes) is half the least peak or more, it
// adds that most of the peak is what every plan keeps ("(89.2 MiB of it are
// the persistent tensors and outputs, ...)").
// `with_bytes`: the least peak in bytes too ("12.4 MiB (13001000 bytes, 96%)").
// `cut_short`: the search for it reached its time limit ("checkmate reaches
// 30.0 MiB (100%) in its time limit: try --budget 100%, --budget min or a
// longer --time-limit").
std::string LeastPeakAdvice(absl::string_view policy, int64_t least_peak_bytes,
                            int64_t baseline_peak_bytes, int64_t end_state_bytes = 0,
                            bool with_bytes = false, bool cut_short = false);
// Why a plan does not fit `budget_bytes`, for `plan` and `run` alike: "the
// plan does not fit 139 MiB: " then LeastPeakAdvice where the least peak the
// policy reaches is over the budget, else (the host budget failed, say) the
// planner's `message`.
std::string DoesNotFitAdvice(absl::string_view policy, int64_t budget_bytes,
                             int64_t least_peak_bytes, int64_t baseline_peak_bytes,
                             int64_t end_state_bytes, absl::string_view message,
                             bool cut_short = false);

// Resolves the budget against the graph's baseline peak, plans, simulates
// (the result's report) and lays the schedule out in an arena; where the
// plan does not fit, plans again at "min" for least_peak_bytes and advice
// (where the planner has not: PlanResult::least_peak_bytes).
// Errors: a malformed budget, an unknown policy, a graph the policy cannot
// take.
absl::StatusOr<PlanOutcome> PlanGraph(const Graph& graph, const PlanRequest& request);

// Why `out` (its result refused) does not fit and what to try, for `plan`
// and `run` alike (PlanOutcome::advice): the least peak `planner` reaches
// where the byte budget is below it (out.least_peak_bytes: the planner's,
// else a plan at min, which this sets), but not where that plan breaks the
// host budget too, which no byte budget then mends; and a host budget that
// fits (Note [Host-budget advice], plan_api.cc). `options`: those `out` was
// planned with, the time limit what is left of it. Needs out.policy,
// budget_is_min, budget_bytes, baseline_peak_bytes, end_state_bytes and
// result.
absl::StatusOr<std::string> RefusalAdvice(const Graph& graph, const Planner& planner,
                                          const PlannerOptions& options, PlanOutcome& out);

// The whole `plan --json` document: graph (`label`: a model spec or a file
// path), policy, budget, budget_bytes, baseline_peak_bytes, parameter_bytes,
// end_state_bytes, bandwidth_bytes_per_s, feasible, message, least_peak_bytes and advice
// (where the plan does not fit), plan_time_s, details, report
// (PlanDocumentReport), layout (with every tensor's arena offset in
// "instances" when `with_instances`) and schedule.
nlohmann::json PlanDocument(const Graph& graph, const PlanOutcome& outcome,
                            const std::string& label, bool with_timeline,
                            bool with_instances);
// The document's "report" member alone: the simulator's figures
// (ReportToJson, with the per-step timeline when asked) plus arena_bytes and
// fragmentation. Whether the plan fits is not in it: that is the document's
// "feasible" (outcome.result.feasible).
nlohmann::json PlanDocumentReport(const Graph& graph, const PlanOutcome& outcome,
                                  bool with_timeline);

// ---- compare

struct CompareEntry;

struct CompareRequest {
  // Policy names (registered or exec:PROGRAM); empty: every registered one.
  std::vector<std::string> policies;
  // Budget texts as PlanRequest::budget; at least one.
  std::vector<std::string> budgets = {"100%", "80%", "60%", "40%", "min"};
  PlannerOptions options;  // budget_bytes is set per budget
  // Plans at once (oneTBB): 0 for one per hardware thread, 1 for one
  // after the other. Each plan is the same either way, but those of
  // policies that stop at a wall-clock limit (checkmate, exact, a search
  // cut by --time-limit) may reach less when they share the cores, and
  // plan_time_s is each plan's wall-clock time under that sharing.
  int jobs = 0;
  // Called after each plan (policy, budget) is made, on the thread that
  // made it, so concurrently when jobs != 1: for progress displays.
  std::function<void(const CompareEntry&)> on_entry;
};

struct CompareEntry {
  std::string policy;
  std::string budget;    // the request's text
  int64_t budget_bytes;  // kMinBudgetBytes for "min"
  double plan_time_s = 0;
  absl::StatusOr<PlanResult> result;  // an error is a row, not a failure
};

struct Comparison {
  int64_t baseline_peak_bytes = 0;
  // The makespan of baseline's plan (no budget) under the request's
  // options, the ranks' collectives and the updates' placement included;
  // 0 where baseline could not plan the graph.
  double baseline_makespan = 0;
  // The least peak exact-order found, when it was among the policies and
  // finished: each row's peak is also shown over it.
  std::optional<int64_t> optimal_order_peak_bytes;
  std::vector<CompareEntry> entries;  // policy-major, in the request's order
};

// Plans every (policy, budget). Errors only for the request itself: no
// budget, a malformed budget, an unknown policy.
absl::StatusOr<Comparison> Compare(const Graph& graph, const CompareRequest& request);

// A plan's makespan over baseline's plan's (comparison.baseline_makespan;
// where that is 0, over the base cost: every node once, nothing moved); 1
// for a graph of no cost.
double MakespanOverBaseline(const Comparison& comparison, const PlanReport& report);

// One row of `compare --format json` ("results"): policy, budget,
// budget_bytes (not for min), plan_time_s, and either error or feasible,
// report, makespan_over_baseline, message, peak_vs_optimal_order.
nlohmann::json CompareRowJson(const Graph& graph, const Comparison& comparison,
                              const CompareEntry& entry);
// The whole document: graph (`label`), baseline_peak_bytes, results and
// optimal_order_peak_bytes where known.
nlohmann::json CompareDocument(const Graph& graph, const Comparison& comparison,
                               const std::string& label);

// ---- fit

// One value a search tried, for progress reports (FitRequest::on_try).
struct FitTry {
  enum class Outcome : uint8_t {
    kFits,         // planned, within the budget
    kDoesNotFit,   // planned, over the budget
    kBelowBound,   // not planned: even the least peak any plan can have is over the budget
    kRefused,      // the model or the planner refused the value
  };
  std::string policy;  // empty for the naive estimate
  int64_t value = 0;
  Outcome outcome = Outcome::kRefused;
  int64_t peak_bytes = 0;  // the plan's peak (kFits, kDoesNotFit) or the bound (kBelowBound)
  double elapsed_s = 0;    // since the search started
};
absl::string_view FitOutcomeName(FitTry::Outcome outcome);  // "fits", ...

struct FitRequest {
  ModelSpec model;  // a zoo model
  std::string vary;  // the parameter searched ("n", "batch", ...)
  // Where set, builds the model at each value instead of the zoo's `model`
  // (an ONNX model imported at each batch size: pebble fit --onnx); `vary`
  // then only names the value. Called from the planning threads (jobs): it
  // must be thread-safe.
  std::function<absl::StatusOr<Graph>(int64_t value)> build_model;
  int64_t budget_bytes = 0;
  // Empty: every registered policy but the exact searches (exact,
  // exact-order, checkmate), whose cost explodes with the graph, and, where
  // the model is not sharded (transform_model), the fsdp rules, each
  // baseline again there.
  std::vector<std::string> policies;
  // budget_bytes is set from budget_bytes; options.time_limit_s bounds each
  // plan (and is cut to what is left of time_limit_s).
  PlannerOptions options;
  CostModel cost;
  int64_t start = 1;      // the first value tried
  int64_t max_value = 0;  // 0: the model's own limit
  int jobs = 0;           // policies searched at once, as CompareRequest::jobs
  // Wall-clock seconds for the whole search, every policy together. Past
  // it, each policy stops and keeps the largest value found to fit so far
  // (FitRow::time_limit_reached).
  double time_limit_s = 60;
  // Applied to the model at each value before it is planned (the command
  // line's --workspace query gives each node its kernel's scratch on the
  // backend, runtime/workspace.h); none: the model as built. Called only
  // for values whose PeakLowerBound (as built) is within the budget, so it
  // never sees operands larger than the budget; called from the planning
  // threads (jobs), so it must be thread-safe. A prepared graph must not
  // have a lower peak than the model as built (it only adds workspace).
  std::function<absl::StatusOr<Graph>(const Graph&)> prepare_graph;
  // Applied to the model as built at each value, before any bound or rule
  // sees it: the graph one rank runs (ShardGraph for sharding). None: the
  // model as built. Called from the planning threads: thread-safe.
  std::function<absl::StatusOr<Graph>(const Graph&)> transform_model;
  // Called after each value tried, from the planning threads (jobs): it
  // must be thread-safe. Empty: no reports.
  std::function<void(const FitTry&)> on_try;
};

struct FitRow {
  std::string policy;
  std::string kind;  // PlanKindName, or "external" for exec:PROGRAM
  std::optional<int64_t> value;  // the largest value that fits
  std::optional<Graph> graph;    // the model at that value (prepared)
  std::optional<PlanResult> plan;
  // The arena a run of `plan` allocates (its layout's: the budget bounds the
  // peak, not the arena); nullopt without a value, or where the layout fails.
  std::optional<int64_t> arena_bytes;
  std::string note;  // why nothing fits, the first refusal, or where the time limit cut
  int tries = 0;     // values tried (planned or bounded)
  // The search stopped at FitRequest::time_limit_s: `value` fits, but a
  // larger one might too.
  bool time_limit_reached = false;
};

struct FitResult {
  // The seed report's rule of thumb: the largest value with 26 x
  // bytes(input) <= budget. It applies to 3-D convolution networks only
  // (a 5-D input of floats); elsewhere naive_note says why not.
  bool naive_applies = false;
  std::optional<int64_t> naive_value;
  std::string naive_note;
  std::vector<FitRow> rows;
  double search_time_s = 0;
};

// fit's budget, from the command line's text: bytes only (a percentage or
// "min" would change with the parameter searched).
absl::StatusOr<int64_t> ParseFitBudget(absl::string_view text);

// For each policy, the largest value of `vary` whose training step the
// policy fits in the budget: an exponential then a binary search over the
// predicted peak, assuming it grows with the parameter (true of every size
// parameter of the zoo under a fixed policy; a heuristic could find a
// better plan at a larger size, which the search would miss). A value whose
// PeakLowerBound is over the budget is not planned (nor prepared). Memory:
// at most two graphs and plans per policy searched at once, plus what
// prepare_graph takes.
absl::StatusOr<FitResult> Fit(const FitRequest& request);

// How far fit looks past a value of `vary` that makes no model (heads that
// do not divide dim) for one that does.
inline constexpr int64_t kFitSkippedValues = 64;

// The first value of `vary` from `start` on (at most kFitSkippedValues
// further, nor past `max_value` where it is positive) with which `spec`
// makes a model; where none does, the start's refusal.
absl::StatusOr<int64_t> FirstValueWithAModel(const ModelSpec& spec, const std::string& vary,
                                             int64_t start, int64_t max_value,
                                             const CostModel& cost);
// The same, of the models `build` makes at each value (FitRequest::build_model).
absl::StatusOr<int64_t> FirstValueBuilt(
    const std::function<absl::StatusOr<Graph>(int64_t value)>& build, int64_t start,
    int64_t max_value);

// The rows of `fit --json` ("results"), without measurements.
nlohmann::json FitRowJson(const FitRow& row);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_PLAN_API_H_
