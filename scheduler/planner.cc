#include "scheduler/planner.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/alias_fold.h"
#include "scheduler/checkmate.h"  // PeakLowerBound
#include "scheduler/collectives.h"
#include "scheduler/updates_last.h"
#include "scheduler/whole_step.h"
#include "scheduler/budget.h"
#include "scheduler/external_policy.h"

namespace pebble {

absl::string_view PlanKindName(PlanKind kind) {
  switch (kind) {
    case PlanKind::kOneShot: return "one-shot";
    case PlanKind::kMultiShot: return "multi-shot";
    case PlanKind::kOffload: return "offload";
  }
  return "?";
}

PlannerRegistry& PlannerRegistry::Global() {
  static PlannerRegistry* registry = [] {
    auto* r = new PlannerRegistry();
    RegisterBuiltinPlanners(*r);
    return r;
  }();
  return *registry;
}

void PlannerRegistry::Register(PolicyInfo info) {
  PEBBLE_CHECK(Find(info.name) == nullptr, "duplicate policy name");
  PEBBLE_CHECK(static_cast<bool>(info.factory), "policy without factory");
  policies_.push_back(std::move(info));
}

absl::Status PlannerRegistry::RegisterExternal(PolicyInfo info) {
  if (!info.factory) return absl::InvalidArgumentError("a policy needs a planner");
  info.external = true;
  for (PolicyInfo& p : policies_) {
    // ("Rotor" beside "rotor" would be two policies that read as one.)
    if (!p.external && p.name != info.name && absl::EqualsIgnoreCase(p.name, info.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", info.name, "' differs from the built-in policy '", p.name,
          "' only by case; choose another name"));
    }
    if (p.name != info.name) continue;
    if (!p.external) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", info.name, "' is a built-in policy; choose another name"));
    }
    p = std::move(info);
    return absl::OkStatus();
  }
  policies_.push_back(std::move(info));
  return absl::OkStatus();
}

absl::Status PlannerRegistry::UnregisterExternal(absl::string_view name) {
  for (auto it = policies_.begin(); it != policies_.end(); ++it) {
    if (it->name != name) continue;
    if (!it->external) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", name, "' is a built-in policy, which cannot be unregistered"));
    }
    policies_.erase(it);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("no outside policy '", name, "' is registered"));
}

const PolicyInfo* PlannerRegistry::Find(absl::string_view name) const {
  for (const PolicyInfo& p : policies_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::vector<const PolicyInfo*> PlannerRegistry::List() const {
  std::vector<const PolicyInfo*> list;
  for (const PolicyInfo& p : policies_) list.push_back(&p);
  std::sort(list.begin(), list.end(),
            [](const PolicyInfo* a, const PolicyInfo* b) { return a->name < b->name; });
  return list;
}

namespace {

// Whether `plan` holds more on the host than `options` allow.
bool BreaksHostBudget(const PlanResult& plan, const PlannerOptions& options) {
  return options.host_budget_bytes.has_value() &&
         plan.report.host_peak_bytes > *options.host_budget_bytes;
}

// Note [The least peak of a sharded step]: a policy's least peak (budget
// min) comes from its own model of the graph. On a sharded graph the chain
// policies' stage figures leave out the gathers that stages share (their
// bytes and time), so the plan they make at their estimate can peak above
// one the same policy makes at a lower byte budget (mnist-cnn with Adam on 2
// ranks: rotor at min 13,051,044 bytes, at a budget of 13,000,168 bytes
// exactly that), and the plan they make at a byte budget may not fit where
// their least peak does (sqrtn on mnist-cnn:batch=16 with Adam on 4 ranks:
// min 8,902,776 bytes, at that budget a plan of 8,967,992). A whole
// training step is alike: its updates, and where the optimizer's state and
// gradients go, are placed around the policy's plan of the step without them
// (Note [Updates last]), so rotor on a transformer with Adam's state on the
// host and gradients dropped fit at min (903,688 bytes) and not at a budget of
// those bytes (a plan of 953,096), and vdnn with the parameters on the host
// found 20,036 bytes at a byte budget and 23,044 at min. So on a graph with
// collectives or in-place updates:
// - at min, the policy's plan at min, or its plan at baseline's peak where
//   that peaks lower (WithLooserPlan), is followed by one at a byte below
//   its peak while that fits (it then peaks lower), at most kDescents times
//   and within the time limit, counted from the first: the policy's min is
//   then never above a plan it makes a byte below it, nor above its plan at
//   100%;
// - at a byte budget whose own plan does not fit, the plan at min (found as
//   above, stopping once it fits) is taken where it fits: a budget at or
//   above the policy's min is never refused, but where the time limit cuts
//   that search short (its message then says so: a larger limit may fit).
//   The limit bounds the whole call, so a policy whose own plan takes all
//   of it (checkmate-lp) leaves none for its least-peak plan.
// A graph without either is alike, more rarely (hybrid on the transformer:
// min 16,263,172 bytes, at a budget of those bytes a plan of 16,264,196),
// and a descent there would cost every min a plan or more (checkmate-lp's
// LP: 19 s on that transformer). So there the byte budget's fallback runs
// without the descent (min's own plan, as made at min), and only where the
// budget is not below PeakLowerBound, under which no plan fits: a budget at
// or above min is never refused, and min stays the policy's own least peak
// (which a byte budget may undercut: dtr on that transformer, min
// 16,782,340 bytes, at those bytes 16,522,244). A one-shot policy plans
// such a graph alike at every budget: nothing to fall back on.
class LeastPeakDescent : public Planner {
 public:
  LeastPeakDescent(std::unique_ptr<Planner> inner, bool one_shot)
      : inner_(std::move(inner)), one_shot_(one_shot) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    // The time limit bounds the whole call: every plan below gets what is
    // left of it.
    const Deadline deadline(options.time_limit_s);
    const bool whole_step = graph.has_collectives() || graph.has_in_place();
    if (options.budget_bytes == kMinBudgetBytes) {
      bool cut = false;
      return LeastPeak(graph, options, kMinBudgetBytes, deadline, cut);
    }
    ASSIGN_OR_RETURN(PlanResult planned, inner_->Plan(graph, options));
    if (planned.feasible) return planned;
    if (!whole_step && (one_shot_ || options.budget_bytes < PeakLowerBound(graph))) {
      return planned;
    }
    PlannerOptions least = options;
    least.budget_bytes = kMinBudgetBytes;
    least.progress = nullptr;
    least.time_limit_s = deadline.remaining_s();
    if (least.time_limit_s <= 0) {
      NoteTimeLimit(planned, options.time_limit_s,
                    "its least-peak plan (as at budget min), which may fit, was not tried");
      return planned;
    }
    bool cut = false;
    ASSIGN_OR_RETURN(PlanResult low,
                     LeastPeak(graph, least, options.budget_bytes, deadline, cut));
    if (!low.feasible || low.report.peak_bytes > options.budget_bytes) {
      // (The least-peak plan had what the budget's own plan left of the
      // time limit: less than at budget min, so where the limit cut its
      // search or its descent it may peak higher.)
      cut = cut || deadline.Expired();
      const bool breaks_host = BreaksHostBudget(low, options);
      const std::string clause = absl::StrCat(
          "its least-peak plan (as at budget min)",
          cut ? absl::StrFormat(", cut by the %.3g s left of the time limit,",
                                least.time_limit_s)
              : std::string(),
          " peaked at ", FormatBytes(low.report.peak_bytes), " (", low.report.peak_bytes,
          " bytes)",
          breaks_host ? absl::StrCat(" and held ", FormatBytes(low.report.host_peak_bytes),
                                     " on the host, over the host budget")
                      : std::string());
      // (a nested search's plan may say so already: once is enough)
      if (!absl::StrContains(planned.message, clause)) {
        if (!planned.message.empty()) planned.message += "; ";
        planned.message += clause;
      }
      if (cut) planned.details["time_limit_reached"] = true;
      // (no byte budget then keeps to the host budget: advice says so)
      if (breaks_host) planned.details["least_peak_breaks_host_budget"] = true;
      planned.least_peak_bytes = low.report.peak_bytes;
      return planned;
    }
    if (!low.message.empty()) low.message += "; ";
    absl::StrAppend(&low.message, "the policy's own plan at this budget peaked at ",
                    FormatBytes(planned.report.peak_bytes), " (", planned.report.peak_bytes,
                    " bytes); its least-peak plan (as at budget min) fits");
    return low;
  }

 private:
  // The policy's least-peak plan, as at budget min (`min_options`): its own
  // plan at min, within the host budget where that breaks it
  // (WithinTheHostBudget), and on a whole step the looser plan and the
  // descent until the peak is at most `target` bytes (kMinBudgetBytes: as
  // low as it goes). `cut` becomes true where the time limit stopped it.
  absl::StatusOr<PlanResult> LeastPeak(const Graph& graph, const PlannerOptions& min_options,
                                       int64_t target, const Deadline& deadline,
                                       bool& cut) const {
    ASSIGN_OR_RETURN(PlanResult least, inner_->Plan(graph, min_options));
    cut = TimeLimitReached(least);
    if (!least.feasible && BreaksHostBudget(least, min_options)) {
      ASSIGN_OR_RETURN(least,
                       WithinTheHostBudget(graph, min_options, std::move(least), deadline));
    }
    if (!least.feasible || !(graph.has_collectives() || graph.has_in_place())) return least;
    ASSIGN_OR_RETURN(least, WithLooserPlan(graph, min_options, std::move(least), deadline));
    return Descend(graph, min_options, std::move(least), target, deadline, cut);
  }

  // Plans a byte below `best`'s peak while that fits and peaks lower, until
  // the peak is at most `target` bytes (kMinBudgetBytes: as low as it goes)
  // or the deadline; `cut` becomes true where the deadline stopped it.
  absl::StatusOr<PlanResult> Descend(const Graph& graph, const PlannerOptions& options,
                                     PlanResult best, int64_t target,
                                     const Deadline& deadline, bool& cut) const {
    PlannerOptions lower = options;
    lower.progress = nullptr;
    for (int k = 0; k < kDescents && best.report.peak_bytes > std::max<int64_t>(target, 0); ++k) {
      lower.time_limit_s = deadline.remaining_s();
      if (lower.time_limit_s <= 0) {
        cut = true;
        break;
      }
      lower.budget_bytes = best.report.peak_bytes - 1;
      ASSIGN_OR_RETURN(PlanResult next, inner_->Plan(graph, lower));
      if (!next.feasible || next.report.peak_bytes >= best.report.peak_bytes) {
        cut = cut || TimeLimitReached(next);
        break;
      }
      best = std::move(next);
    }
    return best;
  }

  // Note [The least peak within a host budget]. At min a policy moves to
  // the host all it may; its search bounds those bytes by the host budget,
  // but not what the step holds on the host around its plan (state whose
  // home is the host, the copies of host updates: Note [Updates last]), so
  // its plan at min may break the host budget where its plan at a looser
  // byte budget, moving less, keeps to it (swap on a transformer with Adam's
  // updates on the host: 10.5 MiB on the host at min, refused against a host
  // budget of 8.13 MiB that its plan at 100% met, until 2026-12-05). There
  // `least` (the plan at min, over the host budget) gives way to the plan at
  // the least byte budget, bisected between its peak and baseline's, whose
  // plan fits both budgets: at most kHostBisections plans, within the
  // deadline; `least` where even baseline's peak does not fit.
  absl::StatusOr<PlanResult> WithinTheHostBudget(const Graph& graph,
                                                 const PlannerOptions& min_options,
                                                 PlanResult least,
                                                 const Deadline& deadline) const {
    ASSIGN_OR_RETURN(const int64_t baseline_peak, BaselinePeak(graph));
    PlannerOptions at = min_options;
    at.progress = nullptr;
    auto plan_at = [&](int64_t budget) {
      at.budget_bytes = budget;
      at.time_limit_s = deadline.remaining_s();
      return inner_->Plan(graph, at);
    };
    if (deadline.remaining_s() <= 0 || baseline_peak <= least.report.peak_bytes) return least;
    ASSIGN_OR_RETURN(PlanResult best, plan_at(baseline_peak));
    if (!best.feasible) return least;
    int64_t lo = least.report.peak_bytes, hi = best.report.peak_bytes;  // lo's breaks it
    for (int k = 0; k < kHostBisections && hi - lo > 1 && deadline.remaining_s() > 0; ++k) {
      const int64_t mid = lo + (hi - lo) / 2;
      ASSIGN_OR_RETURN(PlanResult plan, plan_at(mid));
      if (!plan.feasible) {
        lo = mid;
        continue;
      }
      hi = std::min(mid, plan.report.peak_bytes);
      if (plan.report.peak_bytes < best.report.peak_bytes) best = std::move(plan);
    }
    if (deadline.Expired()) {
      NoteTimeLimit(best, min_options.time_limit_s, "the least peak within the host budget");
    }
    return best;
  }

  // `least` (a plan at min), or the policy's plan at the unplanned step's
  // peak (baseline's: 100%) where that peaks lower, as a plan at min: on a
  // whole step a policy's search at min may miss what its plan at a looser
  // budget reaches (chen-greedy on a transformer with Adam's state on the
  // host and gradients dropped: 954,888 bytes at min, 938,504 at 100%, and
  // a budget of those bytes refused until 2026-12-04). One-shot policies
  // plan alike at every budget.
  absl::StatusOr<PlanResult> WithLooserPlan(const Graph& graph,
                                            const PlannerOptions& min_options,
                                            PlanResult least, const Deadline& deadline) const {
    if (one_shot_ || deadline.remaining_s() <= 0) return least;
    ASSIGN_OR_RETURN(const int64_t baseline_peak, BaselinePeak(graph));
    PlannerOptions looser = min_options;
    looser.budget_bytes = baseline_peak;
    looser.progress = nullptr;
    looser.time_limit_s = deadline.remaining_s();
    ASSIGN_OR_RETURN(PlanResult plan, inner_->Plan(graph, looser));
    if (!plan.feasible || plan.report.peak_bytes >= least.report.peak_bytes) return least;
    plan.details["least_peak_planned_at_bytes"] = baseline_peak;
    return plan;
  }

  static constexpr int kDescents = 8;
  static constexpr int kHostBisections = 16;  // Note [The least peak within a host budget]
  std::unique_ptr<Planner> inner_;
  bool one_shot_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(absl::string_view name) {
  if (absl::StartsWith(name, kExecPolicyPrefix)) {
    const absl::string_view program = absl::StripAsciiWhitespace(name.substr(kExecPolicyPrefix.size()));
    if (program.empty()) {
      return absl::InvalidArgumentError("policy 'exec:' names no program (exec:PROGRAM)");
    }
    return WithGradientReduction(
        WithUpdatesLast(WithAliasFolding(MakeExecPlanner(std::string(program)))),
        /*join_collectives=*/false);
  }
  const PolicyInfo* info = PlannerRegistry::Global().Find(name);
  if (info == nullptr) {
    std::vector<std::string> names;
    for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
      names.push_back(p->name);
    }
    const std::string nearest = NearestName(name, names);
    return absl::NotFoundError(absl::StrCat(
        "unknown policy '", name, "'",
        nearest.empty() ? std::string() : absl::StrCat(" (did you mean '", nearest, "'?)"),
        " (known: ", absl::StrJoin(names, ", "), "; see 'pebble policies')"));
  }
  // Every policy plans storages, not views (Note [Alias folding]).
  std::unique_ptr<Planner> planner =
      WithGradientReduction(WithUpdatesLast(WithAliasFolding(info->factory())),
                            /*join_collectives=*/!info->external && !info->own_messages);
  if (name == "hybrid") planner = WithWholeStepsCompared(std::move(planner));
  // (an exact policy's least peak is its model's: Note [The least peak of a sharded step])
  if (!info->exact && !info->external) {
    planner = std::make_unique<LeastPeakDescent>(std::move(planner),
                                                 info->kind == PlanKind::kOneShot);
  }
  // Note [best-order on the whole step]
  if (name == "best-order") planner = WithOrdersOnTheWholeStep(std::move(planner));
  if (info->composed || (info->exact && info->kind != PlanKind::kOneShot)) {
    // (exact, checkmate too; hybrid compares FSDP's rules among its own)
    planner = WithBestOrderOnTheWholeStep(std::move(planner),
                                          /*with_fsdp_rules=*/name != "hybrid");
  } else if (info->exact) {
    planner = WithOptimalOfTheStepJudged(std::move(planner));  // (exact-order, tree)
  }
  return planner;
}

namespace {

// A graph's content as absl::Hash reads it: every field that changes a
// plan's memory or time.
struct GraphContent {
  const Graph& graph;

  template <typename H>
  friend H AbslHashValue(H h, const GraphContent& content) {
    const Graph& g = content.graph;
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      h = H::combine(std::move(h), g.id(v), g.bytes(v), g.cost(v), g.workspace(v),
                     g.persistent(v), g.is_output(v), static_cast<int>(g.role(v)));
      // Views, in-place updates, homes and where a node runs change a
      // plan's memory and time as much as bytes do (a placement search
      // plans one graph under several homes).
      h = H::combine(std::move(h), g.alias_of(v), g.in_place(v), g.collective(v),
                     g.home(v).has_value() ? static_cast<int>(*g.home(v)) + 1 : 0,
                     static_cast<int>(g.runs_on(v)), g.host_cost(v).value_or(-1));
      for (NodeId u : g.inputs(v)) h = H::combine(std::move(h), u);
      h = H::combine(std::move(h), g.inputs(v).size());
    }
    return h;
  }
};

}  // namespace

// absl::Hash, whose seed differs from process to process: the memos keyed
// by it live in one process, and a graph made to collide with another
// cannot be computed ahead (the hash it replaced, FNV-like and invertible
// step by step, gave a crafted graph another's exact order).
uint64_t GraphFingerprint(const Graph& graph) {
  return absl::Hash<GraphContent>{}(GraphContent{graph});
}

const PlanResult* PlanMemo::Find(const Graph& graph, const PlannerOptions& options) const {
  const uint64_t fingerprint = GraphFingerprint(graph);
  for (const Entry& e : entries_) {
    if (e.fingerprint == fingerprint && e.num_nodes == graph.num_nodes() &&
        e.budget_bytes == options.budget_bytes && e.ranks == options.ranks) {
      return &e.plan;
    }
  }
  return nullptr;
}

void PlanMemo::Keep(const Graph& graph, const PlannerOptions& options, PlanResult plan) {
  entries_.push_back({GraphFingerprint(graph), graph.num_nodes(), options.budget_bytes,
                      options.ranks, std::move(plan)});
}

void ReportProgress(const PlannerOptions& options, std::string stage,
                    std::optional<double> incumbent, std::optional<double> bound) {
  if (options.progress) options.progress({std::move(stage), incumbent, bound});
}

Deadline::Deadline(double limit_s) : Deadline(limit_s, std::chrono::steady_clock::now()) {}

Deadline::Deadline(double limit_s, std::chrono::steady_clock::time_point start)
    : limit_s_(limit_s) {
  // A limit past a day (or NaN/inf from a caller) is no limit; the clock's
  // range stays safe.
  const double capped = limit_s >= 0 && limit_s < 86400.0 ? limit_s : 86400.0;
  end_ = start +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(limit_s < 0 ? 0.0 : capped));
}

bool Deadline::Expired() const {
  if (hit_) return true;
  if (std::chrono::steady_clock::now() >= end_) hit_ = true;
  return hit_;
}

double Deadline::remaining_s() const {
  const double left =
      std::chrono::duration<double>(end_ - std::chrono::steady_clock::now()).count();
  return std::max(0.0, left);
}

void NoteTimeLimit(PlanResult& result, double limit_s, absl::string_view what) {
  result.details["time_limit_reached"] = true;
  if (!result.message.empty()) result.message += "; ";
  // (a nested call's share of a limit: "30 s", not "29.9998 s")
  absl::StrAppend(&result.message, "time limit of ", absl::StrFormat("%.3g", limit_s),
                  " s reached: ", what);
}

bool TimeLimitReached(const PlanResult& result) {
  auto it = result.details.find("time_limit_reached");
  return it != result.details.end() && it->is_boolean() && it->get<bool>();
}

absl::Status CheckPlannable(const Graph& graph) {
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (!graph.home(v).has_value() || OnlyUpdatesRead(graph, v) || UpdatedParameter(graph, v)) {
      continue;
    }
    return absl::UnimplementedError(absl::StrCat(
        "node ", Quote(graph.id(v)), " has 'home' and is read by more than the "
        "optimizer's updates: pebble's policies move the optimizer's state and the parameters "
        "it updates between tiers, nothing else yet; `pebble simulate` checks a schedule of "
        "such a graph"));
  }
  // An update that may run on the host reads and writes host copies: every
  // persistent storage it touches must be able to move (Note [Updates on
  // the host]).
  for (NodeId w = 0; w < graph.num_nodes(); ++w) {
    if (graph.runs_on(w) == Tier::kDevice) continue;
    for (NodeId u : graph.unique_inputs(w)) {
      const NodeId s = graph.storage(u);
      if (graph.persistent(s) && !graph.home(s).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "update ", Quote(graph.id(w)), " may run on the host (runs_on: ",
            TierName(graph.runs_on(w)), "), but ", Quote(graph.id(s)), " has no 'home': a "
            "tensor a host update reads or writes must be able to move (give it a home)"));
      }
    }
  }
  return absl::OkStatus();
}

std::string BudgetExcess(const PlanReport& report, const PlannerOptions& options) {
  std::string message;
  if (options.budget_bytes != PlannerOptions::kMinBudget &&
      report.peak_bytes > options.budget_bytes) {
    message = absl::StrCat("peak ", FormatBytes(report.peak_bytes), " (", report.peak_bytes,
                           " bytes) exceeds the budget of ", FormatBytes(options.budget_bytes),
                           " (", options.budget_bytes, " bytes)");
  }
  if (options.host_budget_bytes.has_value() &&
      report.host_peak_bytes > *options.host_budget_bytes) {
    if (!message.empty()) message += "; ";
    absl::StrAppend(&message, "host peak ", FormatBytes(report.host_peak_bytes), " (",
                    report.host_peak_bytes, " bytes) exceeds the host budget of ",
                    FormatBytes(*options.host_budget_bytes), " (",
                    *options.host_budget_bytes, " bytes)");
  }
  return message;
}

absl::StatusOr<PlanResult> FinishPlan(const Graph& graph, Schedule schedule,
                                      const PlannerOptions& options, bool record_timeline) {
  SimulatorOptions sim;
  sim.record_timeline = record_timeline;
  sim.host_bandwidth_bytes_per_s = options.host_bandwidth_bytes_per_s;
  sim.ranks = options.ranks;
  sim.network = options.network;
  sim.device_bucket_copies = options.device_bucket_copies;
  sim.bucket_copy_alignment = options.bucket_copy_alignment;
  ASSIGN_OR_RETURN(PlanReport report, Simulate(graph, schedule, sim));
  PlanResult result;
  result.schedule = std::move(schedule);
  result.report = std::move(report);
  result.message = BudgetExcess(result.report, options);
  result.feasible = result.message.empty();
  return result;
}

}  // namespace pebble
