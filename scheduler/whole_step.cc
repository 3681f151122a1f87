// Note [hybrid on the whole step]. hybrid judges its candidates on the step
// its wrappers hand it (planner.cc): the step without the optimizer's
// updates (WithUpdatesLast adds them after, and places them), and with
// ranks above one, without the all-reduces (WithGradientReduction adds
// them after). The plan of the whole step then differs from the one judged:
// updates on the host run beside the backward in the gaps a plan leaves, a
// gradient's all-reduce waits for its last use, and a candidate that was
// second can be faster. So a policy run alone could beat hybrid at its own
// budget: on resnet18 (batch 8, Adam) at the least peak, dtr's step took
// 8.98 ms against hybrid's 9.18 ms, with its updates on the host 67.4
// against 70.6 ms; sharded with the updates on the host, fsdp-blocks'
// 54.29 ms against 61.5 ms.
//
// Here hybrid's plan is compared with the whole-step plans of the named
// policies among its candidates (those `--policy NAME` gives; a joint plan
// of recomputation and swaps has no name to plan it again by), most
// promising first: those that fitted, by their makespan on the step
// judged. On a sharded graph FSDP's rules (which keep their own messages)
// have their messages joined further where that is faster, as hybrid's
// own candidates do. The better plan by MakespanSelector's rule is taken,
// so at the budget hybrid is never slower than any of those policies (and
// at `min` never higher in peak), within the time limit. The cost: each
// compared policy is planned again, whole; best-order's search, which each
// of them runs to compose with (seconds on a large graph), is made once in
// the call (PlanMemo).
#include "scheduler/whole_step.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "scheduler/collective_buckets.h"
#include "scheduler/collectives.h"
#include "scheduler/compose.h"
#include "scheduler/offload.h"
#include "scheduler/policies.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

// Whether the wrappers of `graph`'s plan add steps the inner policy did not
// judge: the updates, or a data-parallel step's all-reduces (there are
// none to add on a sharded graph, or without gradients).
bool JudgedOnAnotherStep(const Graph& graph, const PlannerOptions& options) {
  if (graph.has_in_place()) return true;
  return options.ranks > 1 && !GradientsToReduce(graph).empty();
}

// The named policies among hybrid's `candidates`, the most promising
// first: ranked by `judge`'s rule on their figures on the step judged (at
// `min`, the lowest peak first). The one hybrid took is among them: inside
// hybrid a policy plans over the graph's own order, alone it is also
// composed with best-order's (docs/semantics.md), so its plans differ.
std::vector<std::string> NamedRivals(const nlohmann::json& candidates,
                                     const MakespanSelector& judge) {
  std::vector<std::pair<std::string, PlanReport>> rivals;
  for (const nlohmann::json& c : candidates) {
    const std::string name = c.value("candidate", "");
    if (name == "hybrid") continue;
    const PolicyInfo* info = PlannerRegistry::Global().Find(name);
    if (info == nullptr || info->external) continue;
    if (std::any_of(rivals.begin(), rivals.end(),
                    [&](const auto& r) { return r.first == name; })) {
      continue;
    }
    rivals.emplace_back(name, CandidateFigures(c));
  }
  std::stable_sort(rivals.begin(), rivals.end(), [&](const auto& a, const auto& b) {
    return judge.Prefers(a.second, b.second);
  });
  std::vector<std::string> names;
  for (auto& r : rivals) names.push_back(std::move(r.first));
  return names;
}

// `name`'s plan of the whole step, as `--policy NAME` makes it within the
// time left; a policy that keeps its own messages (FSDP's rules) on a
// sharded graph has them joined further where that is faster, its
// details["collectives"] made the joined plan's.
absl::StatusOr<PlanResult> WholeStep(const Graph& graph, const std::string& name,
                                     const PlannerOptions& options, const Deadline& deadline) {
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(name));
  PlannerOptions o = options;
  o.time_limit_s = deadline.remaining_s();
  ASSIGN_OR_RETURN(PlanResult r, planner->Plan(graph, o));
  const PolicyInfo* info = PlannerRegistry::Global().Find(name);
  if (!info->own_messages || !graph.has_collectives() || options.ranks <= 1 ||
      options.bucket_bytes != PlannerOptions::kPlannedBuckets || deadline.Expired()) {
    return r;
  }
  nlohmann::json collectives = std::move(r.details["collectives"]);
  ASSIGN_OR_RETURN(r, JoinCollectiveMessages(graph, std::move(r), options,
                                             kMaxJoinSimulatedSteps / 4));
  collectives["collective_buckets"] = std::move(r.details["collective_buckets"]);
  r.details.erase("collective_buckets");
  collectives["count"] = r.report.collectives;
  collectives["messages"] = CountCollectiveComputes(graph, r.schedule).messages;
  collectives["bytes"] = r.report.collective_bytes;
  collectives["network_busy"] = r.report.network_busy;
  r.details["collectives"] = std::move(collectives);
  return r;
}

// `options` with a PlanMemo for the call, where it has none.
PlannerOptions WithMemo(const PlannerOptions& given) {
  PlannerOptions options = given;
  if (options.best_order_memo == nullptr) {
    options.best_order_memo = std::make_shared<PlanMemo>();
  }
  return options;
}

class WholeStepsComparedPlanner : public Planner {
 public:
  explicit WholeStepsComparedPlanner(std::unique_ptr<Planner> inner)
      : inner_(std::move(inner)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& given) const override {
    const Deadline deadline(given.time_limit_s);
    // hybrid and each policy compared run best-order on the same graphs:
    // its plans are made once (PlanMemo).
    PlannerOptions options = WithMemo(given);
    // On a step with an optimizer's updates (which hybrid plans without,
    // many times over in the placement searches), the named policies'
    // composed plans come from the comparison below alone (Note [hybrid's
    // recompute candidates composed]).
    PlannerOptions for_hybrid = options;
    for_hybrid.named_rivals_on_whole_step = graph.has_in_place();
    ASSIGN_OR_RETURN(PlanResult best, inner_->Plan(graph, for_hybrid));
    if (!JudgedOnAnotherStep(graph, options)) return best;
    const bool search_cut = TimeLimitReached(best);
    const MakespanSelector judge(graph, options);
    nlohmann::json tried = best.details.value("candidates", nlohmann::json::array());
    std::string chosen;
    bool not_all = false, rival_cut = false;
    for (const std::string& name : NamedRivals(tried, judge)) {
      if (deadline.Expired()) {
        not_all = true;
        break;
      }
      absl::StatusOr<PlanResult> r = WholeStep(graph, name, options, deadline);
      if (!r.ok()) continue;  // e.g. revolve on a graph that is no chain
      rival_cut = rival_cut || TimeLimitReached(*r);
      tried.push_back(CandidateEntry(absl::StrCat(name, " (whole step)"), r->report,
                                     judge.Fits(r->report)));
      if (judge.Prefers(r->report, best.report)) {
        // (a policy alone may take FSDP's rule: Note [FSDP's rules on a
        // sharded step])
        chosen = r->details.value("rule", name);
        best = *std::move(r);
      }
    }
    best.details["candidates"] = std::move(tried);
    if (!chosen.empty()) {
      best.details["candidate"] = chosen;
      best.details["whole_step"] = true;
      best.details["tensors"] = ClassifyTensors(graph, best.schedule);
    }
    // A cut anywhere is said, whichever plan was taken.
    if (!TimeLimitReached(best)) {
      if (not_all) {
        NoteTimeLimit(best, options.time_limit_s,
                      "hybrid's named candidates not all compared on the whole step");
      } else if (search_cut || rival_cut) {
        NoteTimeLimit(best, options.time_limit_s,
                      search_cut ? "hybrid's search" : "a compared policy's search");
      }
    }
    return best;
  }

 private:
  std::unique_ptr<Planner> inner_;
};

// Note [best-order on the whole step]. best-order takes the lowest peak of
// its orders on the step its wrappers hand it, as hybrid judges its
// candidates (Note [hybrid on the whole step]): without the optimizer's
// updates, which WithUpdatesLast then places around the order (Note
// [Updates early]), and without the all-reduces or the joined messages of
// collectives. The lowest order of that step need not stay the lowest once
// they are placed: on mnist-cnn:batch=2 with Adam's state on the host and
// the gradients dropped, greedy's order peaked at 8,664,768 bytes without
// the updates and 17,053,376 with them, baseline's at 9,340,904 and
// 17,036,992, so best-order ended above baseline, which it includes, and
// every composed policy with it. So on a whole step:
// - best-order also plans each other order it judged (baseline, dfs,
//   greedy, tree; not exact-order, whose search `--policy exact-order`
//   makes at four times best-order's state limit) as that policy's plan
//   of the whole step, and keeps the lowest peak, then the shortest
//   makespan, among those that fit where any does (FitsLowerOrFaster): it
//   is never above baseline there. A few one-shot plans
//   more, each with its updates placed.
// - a policy composed with best-order (Note [Composition]) is compared
//   with best-order's plan of the whole step, which it takes where
//   BetterPlan prefers it: none is worse than best-order. Both share one
//   PlanMemo, so best-order's search of the step without its updates
//   runs once. The exact policies (exact-order, exact, checkmate) alike:
//   their optimum is the step's without its updates (exact at min on an
//   MLP with Adam's state on the host: 3,008 bytes, "optimal", where
//   baseline's plan peaked at 2,752), and their message says so.

// Note [FSDP's rules on a sharded step]. On a sharded step the policies
// judge their plans before the gathers and reduce-scatters are joined into
// messages (WithGradientReduction joins them after), where gathering a
// parameter again only costs; joined, a plan that gathers again can be the
// faster. So a policy could give a slower plan at a looser budget, and be
// slower than FSDP's fixed rule that fits the same budget: on
// transformer:layers=2,seq=32,dim=64,vocab=200 with Adam on 2 ranks,
// sqrtn, rotor and dtr at 100% took best-order's one-shot plan (1,864,200
// bytes, 201.6 us), sqrtn at 1,600,000 bytes gave 126.6 us, and
// fsdp-blocks 137.6 us at 1,682,184 bytes. Every policy composed with
// best-order (and exact, checkmate) is therefore compared with FSDP's
// rules too (fsdp, fsdp-module, fsdp-blocks; their messages joined further
// where faster, as hybrid's candidates are; with buckets "none" fsdp
// alone, whose messages are one a collective), and takes one by the same
// rule as best-order's plan: no policy's plan of a sharded step is worse
// than FSDP's rule at its budget (within the time limit). hybrid compares
// them among its own candidates already (Note [hybrid on the whole step]).
// The cost: three plans of a fixed rule and their joins (milliseconds to a
// second on a large graph).

// Whether plan `a` is preferred to `b` as the lowest of a whole step's
// plans: one that fits first (a lower peak that breaks the host budget is
// no plan: swap with Adam's state streamed on mnist-cnn on 2 ranks took such
// an order's 8,654,672 bytes over a fitting 11,001,348 at that budget, and
// refused it, until 2026-12-05), then the lower peak, then the shorter
// makespan.
bool FitsLowerOrFaster(const PlanResult& a, const PlanResult& b) {
  if (a.feasible != b.feasible) return a.feasible;
  const PlanReport &x = a.report, &y = b.report;
  return x.peak_bytes < y.peak_bytes ||
         (x.peak_bytes == y.peak_bytes && x.makespan < y.makespan &&
          !SameMakespan(x.makespan, y.makespan));
}

nlohmann::json OrderEntry(const std::string& name, const PlanReport& report) {
  return {{"policy", name}, {"peak_bytes", report.peak_bytes}, {"makespan_s", report.makespan}};
}

class OrdersOnTheWholeStepPlanner : public Planner {
 public:
  explicit OrdersOnTheWholeStepPlanner(std::unique_ptr<Planner> inner)
      : inner_(std::move(inner)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& given) const override {
    const Deadline deadline(given.time_limit_s);
    const PlannerOptions options = WithMemo(given);
    ASSIGN_OR_RETURN(PlanResult best, inner_->Plan(graph, options));
    if (!OnAWholeStep(graph, options)) return best;
    const nlohmann::json own = best.details;
    const std::string judged_winner = own.value("winner", "");
    nlohmann::json orders = nlohmann::json::array({OrderEntry(judged_winner, best.report)});
    std::string winner = judged_winner;
    bool cut = false;
    for (const nlohmann::json& c : own.value("candidates", nlohmann::json::array())) {
      const std::string name = c.value("policy", "");
      if (name == judged_winner || name == "exact-order" || !c.contains("peak_bytes")) continue;
      if (deadline.Expired()) {
        cut = true;
        break;
      }
      ASSIGN_OR_RETURN(std::unique_ptr<Planner> order_planner, MakePlanner(name));
      PlannerOptions o = options;
      o.time_limit_s = deadline.remaining_s();
      o.progress = nullptr;
      absl::StatusOr<PlanResult> r = order_planner->Plan(graph, o);
      if (!r.ok()) continue;
      orders.push_back(OrderEntry(name, r->report));
      if (FitsLowerOrFaster(*r, best)) {
        best = *std::move(r);
        winner = name;
      }
    }
    if (winner != judged_winner) {
      // The whole step's keys (updates, collectives) are the plan's; what
      // best-order judged stays.
      for (const char* key : {"candidates", "optimal", "plan_s"}) {
        if (own.contains(key)) best.details[key] = own[key];
      }
      best.details["winner"] = winner;
    }
    best.details["whole_step_orders"] = std::move(orders);
    if (cut && !TimeLimitReached(best)) {
      NoteTimeLimit(best, options.time_limit_s,
                    "best-order's orders not all planned on the whole step");
    }
    return best;
  }

 private:
  std::unique_ptr<Planner> inner_;
};

// A whole step's plan whose message says "optimal": said to be so of the
// step the policy judged, without the updates and collectives placed
// around its plan after (the whole step may peak lower in another order).
void SayOptimalOfTheStepJudged(PlanResult& plan) {
  if (absl::StartsWith(plan.message, "optimal")) {
    plan.message += " (of the step without its optimizer's updates and collectives, "
                    "placed around the plan after)";
  }
}

// The one-shot exact policies (exact-order, tree) on a whole step: their
// plan, its "optimal" qualified (best-order plans them as its orders, so
// they are not compared with it: that would recurse).
class OptimalOfTheStepJudgedPlanner : public Planner {
 public:
  explicit OptimalOfTheStepJudgedPlanner(std::unique_ptr<Planner> inner)
      : inner_(std::move(inner)) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    ASSIGN_OR_RETURN(PlanResult plan, inner_->Plan(graph, options));
    if (!options.own_order && OnAWholeStep(graph, options)) SayOptimalOfTheStepJudged(plan);
    return plan;
  }

 private:
  std::unique_ptr<Planner> inner_;
};

// Whether `a` is a better plan of the whole step than `b`: at a byte
// budget BetterPlan's rule; at min the lower peak, then the shorter
// makespan (not BetterPlan's 0.5% margin: a byte below the policy's min
// then still does not fit, Note [The least peak of a sharded step],
// planner.cc).
bool BetterWholeStep(const PlanResult& a, const PlanResult& b, const PlannerOptions& options) {
  if (options.budget_bytes != PlannerOptions::kMinBudget) return BetterPlan(a, b, options);
  return FitsLowerOrFaster(a, b);
}

// The rivals of a policy's plan of the whole step: best-order's one-shot
// plan, and on a sharded step FSDP's rules (Note [FSDP's rules on a sharded
// step]): those whose units send one message each only where messages may
// be joined (buckets "auto"; with "none" every policy keeps one message a
// collective).
std::vector<std::string> Rivals(const Graph& graph, const PlannerOptions& options,
                                bool with_fsdp_rules) {
  std::vector<std::string> rivals = {"best-order"};
  if (!with_fsdp_rules || options.ranks <= 1 || !graph.has_collectives()) return rivals;
  for (const char* rule : kFsdpPolicies) {
    const bool units = std::string(rule) != "fsdp";  // (a parameter each: one message each)
    if (!units || options.bucket_bytes == PlannerOptions::kPlannedBuckets) rivals.push_back(rule);
  }
  return rivals;
}

// Why plan `a`, which BetterWholeStep prefers, is better than `b`: the
// words before "than ...".
std::string WhyBetter(const PlanResult& a, const PlanResult& b, bool at_min) {
  if (a.feasible && !b.feasible) return "fits, unlike";
  if (at_min || !a.feasible) {
    return a.report.peak_bytes < b.report.peak_bytes ? "peaks lower than"
                                                      : "peaks as low and is faster than";
  }
  return a.report.makespan < b.report.makespan &&
                 !SameMakespan(a.report.makespan, b.report.makespan)
             ? "fits and is faster than"
             : "fits as fast and peaks lower than";
}

class BestOrderOnTheWholeStepPlanner : public Planner {
 public:
  BestOrderOnTheWholeStepPlanner(std::unique_ptr<Planner> inner, bool with_fsdp_rules)
      : inner_(std::move(inner)), with_fsdp_rules_(with_fsdp_rules) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& given) const override {
    const Deadline deadline(given.time_limit_s);
    const PlannerOptions options = WithMemo(given);
    ASSIGN_OR_RETURN(PlanResult plan, inner_->Plan(graph, options));
    if (options.own_order || !OnAWholeStep(graph, options) || deadline.Expired()) return plan;
    PlannerOptions o = options;
    o.progress = nullptr;
    std::optional<PlanResult> taken;
    std::string taken_name;
    nlohmann::json rivals = nlohmann::json::array();  // (each rival's figures)
    bool not_all = false, cut = false;
    for (const std::string& name : Rivals(graph, options, with_fsdp_rules_)) {
      if (name != "best-order" && deadline.Expired()) {
        not_all = true;
        break;
      }
      absl::StatusOr<PlanResult> r = WholeStep(graph, name, o, deadline);
      if (!r.ok()) {
        if (name == "best-order") return r.status();
        continue;
      }
      cut = cut || TimeLimitReached(*r);
      rivals.push_back(CandidateEntry(name, r->report, r->feasible));
      if (BetterWholeStep(*r, taken ? *taken : plan, options)) {
        taken = *std::move(r);
        taken_name = name;
      }
    }
    if (!taken) {
      SayOptimalOfTheStepJudged(plan);
      plan.details["whole_step_rivals"] = std::move(rivals);
      if (not_all && !TimeLimitReached(plan)) {
        NoteTimeLimit(plan, options.time_limit_s, "FSDP's rules not all compared");
      }
      return plan;
    }
    PlanResult& rival = *taken;
    const bool at_min = options.budget_bytes == PlannerOptions::kMinBudget;
    if (taken_name == "best-order") {
      if (rival.feasible && !at_min && rival.message.empty()) {
        rival.message = "best-order's one-shot plan fits: nothing to recompute or offload";
      }
      // best-order's details (its orders, and the whole step's keys:
      // updates, collectives) as they are, beside the composed plan's labels.
      rival.details["order"] = "best-order one-shot";
      rival.details["best_order_peak_bytes"] = rival.report.peak_bytes;
    } else {
      const std::string rule_said = std::move(rival.message);
      const bool joined = options.bucket_bytes == PlannerOptions::kPlannedBuckets;
      rival.message = absl::StrCat("FSDP's rule ", taken_name,
                                   joined ? " (its messages joined) " : " ",
                                   WhyBetter(rival, plan, at_min),
                                   " this policy's own plan (details.policy) on the sharded "
                                   "step: taken",
                                   rule_said.empty() ? "" : "; ", rule_said);
      rival.details["rule"] = taken_name;
    }
    if ((not_all || cut) && !TimeLimitReached(rival)) {
      NoteTimeLimit(rival, options.time_limit_s,
                    not_all ? "FSDP's rules not all compared" : "a compared plan's search");
    }
    if (TimeLimitReached(plan)) rival.details["policy_time_limit_reached"] = true;
    rival.details["whole_step_rivals"] = std::move(rivals);
    rival.details["whole_step"] = true;
    rival.details["policy"] = std::move(plan.details);
    return rival;
  }

 private:
  std::unique_ptr<Planner> inner_;
  bool with_fsdp_rules_;
};

}  // namespace

bool OnAWholeStep(const Graph& graph, const PlannerOptions& options) {
  return JudgedOnAnotherStep(graph, options) || (options.ranks > 1 && graph.has_collectives());
}

std::unique_ptr<Planner> WithWholeStepsCompared(std::unique_ptr<Planner> inner) {
  return std::make_unique<WholeStepsComparedPlanner>(std::move(inner));
}

std::unique_ptr<Planner> WithOrdersOnTheWholeStep(std::unique_ptr<Planner> inner) {
  return std::make_unique<OrdersOnTheWholeStepPlanner>(std::move(inner));
}

std::unique_ptr<Planner> WithOptimalOfTheStepJudged(std::unique_ptr<Planner> inner) {
  return std::make_unique<OptimalOfTheStepJudgedPlanner>(std::move(inner));
}

std::unique_ptr<Planner> WithBestOrderOnTheWholeStep(std::unique_ptr<Planner> inner,
                                                     bool with_fsdp_rules) {
  return std::make_unique<BestOrderOnTheWholeStepPlanner>(std::move(inner), with_fsdp_rules);
}

}  // namespace pebble
