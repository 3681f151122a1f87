// The Planner interface and the name -> factory registry that the CLI,
// tests and benchmarks share.
#ifndef PEBBLE_SCHEDULER_PLANNER_H_
#define PEBBLE_SCHEDULER_PLANNER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/budget.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble {

// What kind of plan a policy makes (SPEC section 2 terms).
enum class PlanKind : uint8_t { kOneShot, kMultiShot, kOffload };
absl::string_view PlanKindName(PlanKind kind);  // "one-shot", "multi-shot", "offload"

// A report of a long planning stage, for a person watching (stderr on the
// command line): what runs now, and the best cost found and the best bound
// known so far where the stage has them (in the graph's cost unit).
struct PlanProgress {
  std::string stage;  // "checkmate: CBC on 390803 rows", ...
  std::optional<double> incumbent;
  std::optional<double> bound;
};

class PlanMemo;  // below

struct PlannerOptions {
  // Device memory budget in bytes; kMinBudget asks for the lowest peak the
  // policy can reach.
  static constexpr int64_t kMinBudget = kMinBudgetBytes;
  int64_t budget_bytes = INT64_MAX;
  std::optional<int64_t> host_budget_bytes;  // none: unlimited
  double host_bandwidth_bytes_per_s = kDefaultHostBandwidthBytesPerS;
  // Data parallelism (scheduler/collectives.h): above 1, every plan sums
  // each parameter's gradient over the ranks with an all_reduce step on
  // `network`, and its figures are one rank's.
  int ranks = 1;
  NetworkLink network;
  // Set by data parallelism's wrapper (WithGradientReduction) in the options
  // of the one-rank plan that it completes with all-reduces: their ranks, so
  // that a search trading memory for time on that plan knows its time is
  // not the whole step's (Note [Outputs computed late]). 1: none are added.
  int reduced_ranks = 1;
  // How the all_reduce steps are grouped into buckets (one collective
  // each): kPlannedBuckets, the plan chooses (BucketGradients in
  // scheduler/collectives.h); 0, one all-reduce per gradient; above 0,
  // DistributedDataParallel's rule with that cap in bytes.
  static constexpr int64_t kPlannedBuckets = -1;
  int64_t bucket_bytes = kPlannedBuckets;
  // Whether the runtime sends a bucket of several gradients through a flat
  // copy of them in device memory (SimulatorOptions::device_bucket_copies):
  // then buckets cost memory, and planned ones stay within the budget.
  bool device_bucket_copies = false;
  int64_t bucket_copy_alignment = 1;  // SimulatorOptions::bucket_copy_alignment
  // Wall-clock seconds for one Plan call, every policy (Deadline below):
  // past it a policy returns the best valid plan it has, noted in the
  // result (NoteTimeLimit).
  double time_limit_s = 60;
  uint64_t seed = 0;         // for randomised policies
  // Plan over the graph's own order only: the policy as published, not
  // composed with best-order (compose.h, --own-order). Policies that run
  // others as parts of their own search (checkmate's warm starts, hybrid)
  // set it for them: composing again would only repeat the work.
  bool own_order = false;
  // Set by hybrid's wrapper (WithWholeStepsCompared, whole_step.h) on a
  // step with an optimizer's updates, whose named policies it plans again
  // on the whole step: hybrid's own recompute candidates then run over the
  // graph's order, uncomposed (Note [hybrid's recompute candidates
  // composed], offload_hybrid.cc).
  bool named_rivals_on_whole_step = false;
  // The largest graph (needed non-persistent nodes) checkmate's MILP and
  // checkmate-lp's LP take; 0: their defaults (300 and 600).
  int milp_max_stages = 0;
  // Called as long stages start and end (from the planning thread; compare
  // plans on several). Empty: no reports.
  std::function<void(const PlanProgress&)> progress;
  // best-order's plans made so far in one call, shared by the policies that
  // call planned in turn (PlanMemo); null: none kept.
  std::shared_ptr<PlanMemo> best_order_memo;
};

// Calls options.progress, where set.
void ReportProgress(const PlannerOptions& options, std::string stage,
                    std::optional<double> incumbent = std::nullopt,
                    std::optional<double> bound = std::nullopt);

struct PlanResult {
  Schedule schedule;
  PlanReport report;      // the simulator's figures for `schedule`
  bool feasible = false;  // report.peak_bytes <= budget (and host budget)
  std::string message;    // why infeasible, or notes ("optimal", ...)
  nlohmann::json details = nlohmann::json::object();  // policy-specific
  // Infeasible at a byte budget, where the planner also made its least-peak
  // plan (as at budget min; Note [The least peak of a sharded step]): that
  // plan's peak, which a caller's advice can take instead of planning again.
  std::optional<int64_t> least_peak_bytes;
};

// A hash of everything a plan of `graph` depends on: its nodes' ids, sizes,
// costs, workspaces, roles, views, in-place updates, homes, where each
// runs (and its host cost), collectives and edges, and its outputs.
uint64_t GraphFingerprint(const Graph& graph);

// A policy's plans by graph (its content) and budget, kept for one planning
// call that would make the same plan several times: best-order's
// (order_best.cc), for a call that plans several policies on the same graph
// (Note [hybrid on the whole step]): each policy composed with best-order
// (compose.h) would run best-order's search again, seconds on a large
// graph; and the policy's plans inside the placement searches of a whole
// step (Note [Placements planned once], updates_last.cc).
// Not thread-safe: one call's plans are made in turn.
class PlanMemo {
 public:
  // The plan kept for `graph` (by content) under `options`' budget, or null.
  const PlanResult* Find(const Graph& graph, const PlannerOptions& options) const;
  void Keep(const Graph& graph, const PlannerOptions& options, PlanResult plan);

 private:
  struct Entry {
    uint64_t fingerprint;
    int num_nodes;
    int64_t budget_bytes;
    int ranks;
    PlanResult plan;
  };
  std::vector<Entry> entries_;
};

// The time limit of one Plan call, started at construction. Policies check
// it between candidates and inside their long loops; once it has passed
// they stop searching and return the best full, valid schedule they have
// (the baseline when nothing better is ready). Checking costs one clock
// read.
class Deadline {
 public:
  explicit Deadline(double limit_s);
  // A limit counted from `start` (a call's entry, when set-up work came
  // before the object).
  Deadline(double limit_s, std::chrono::steady_clock::time_point start);
  // True once the limit has passed; remembers that it did (hit()).
  bool Expired() const;
  // Seconds left, >= 0: the limit to give a nested Plan call.
  double remaining_s() const;
  double limit_s() const { return limit_s_; }
  // Whether Expired() ever returned true, or MarkHit() was called (a nested
  // call was cut).
  bool hit() const { return hit_; }
  void MarkHit() const { hit_ = true; }

 private:
  double limit_s_;
  std::chrono::steady_clock::time_point end_;
  mutable bool hit_ = false;
};

// Marks a result whose search the time limit cut: details
// "time_limit_reached" = true and, in message, "time limit of <limit> s
// reached: <what>" (appended after any earlier message).
void NoteTimeLimit(PlanResult& result, double limit_s, absl::string_view what);
// Whether a (nested) result carries that mark.
bool TimeLimitReached(const PlanResult& result);

class Planner {
 public:
  virtual ~Planner() = default;
  // Plans `graph` under `options`. Errors are for inputs the policy cannot
  // take (a non-chain for a chain policy, a graph past a size limit); a
  // budget it cannot meet is a PlanResult with feasible = false and the best
  // schedule it found.
  virtual absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                          const PlannerOptions& options) const = 0;
};

struct PolicyInfo {
  std::string name;
  std::string description;  // one line: what it does
  PlanKind kind = PlanKind::kOneShot;
  bool exact = false;       // provably optimal within its model
  bool external = false;    // registered from outside (external_policy.h)
  // On a sharded graph, its collectives are sent as it plans them, not
  // joined into planned buckets (collective_buckets.h): FSDP's rules, the
  // fixed points the plans compare with. Outside policies keep theirs too.
  bool own_messages = false;
  // Runs composed with best-order (Note [Composition], compose.h), or plans
  // over its order itself (swap, hybrid): on a whole step it is also
  // compared with best-order's plan of that step (Note [best-order on the
  // whole step], whole_step.h).
  bool composed = false;
  std::function<std::unique_ptr<Planner>()> factory;
};

class PlannerRegistry {
 public:
  static PlannerRegistry& Global();
  // Aborts on a duplicate name (a programming error).
  void Register(PolicyInfo info);
  // An outside policy (info.external): added, or replacing an outside one
  // of the same name; InvalidArgument for a built-in's name. Pointers that
  // Find and List gave for that name are invalid afterwards.
  absl::Status RegisterExternal(PolicyInfo info);
  // Removes an outside policy; NotFound otherwise.
  absl::Status UnregisterExternal(absl::string_view name);
  const PolicyInfo* Find(absl::string_view name) const;
  // Sorted by name.
  std::vector<const PolicyInfo*> List() const;

 private:
  std::vector<PolicyInfo> policies_;
};

// Looks up and instantiates a policy, or makes the planner of
// "exec:PROGRAM" (external_policy.h); NotFound lists the known names. The
// planner plans a graph with aliases over its storages (WithAliasFolding,
// alias_fold.h), a graph with in-place updates without them, running them
// last (WithUpdatesLast, updates_last.h), and takes any other graph as it is;
// with options.ranks > 1 it adds the gradients' all-reduces
// (WithGradientReduction, collectives.h).
absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(absl::string_view name);

// Simulates `schedule`, fills a PlanResult and decides feasibility against
// the budgets of `options` (kMinBudget is always feasible).
// OK where the planners can plan `graph`; an error naming the first node
// with a home tier (docs/semantics.md): the simulator checks schedules of
// such graphs, no policy makes them yet. In-place updates are planned (last:
// updates_last.h).
absl::Status CheckPlannable(const Graph& graph);

// The schedule simulated and judged against the budgets of `options`.
// Without `record_timeline`, report.timeline is empty: for a candidate
// only compared, never returned.
absl::StatusOr<PlanResult> FinishPlan(const Graph& graph, Schedule schedule,
                                      const PlannerOptions& options,
                                      bool record_timeline = true);
// FinishPlan's message: what of `report` breaks the budgets of `options`
// ("peak ... exceeds the budget of ...; host peak ..."), or "".
std::string BudgetExcess(const PlanReport& report, const PlannerOptions& options);

// Built-in policies register here, explicitly (no static initialisers, so
// nothing depends on link order): each policy's .cc defines
// Register<Name>Planner(PlannerRegistry&), declared in scheduler/policies.h
// and called from RegisterBuiltinPlanners() (policies.cc), which
// PlannerRegistry::Global() runs once.
void RegisterBuiltinPlanners(PlannerRegistry& registry);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_PLANNER_H_
