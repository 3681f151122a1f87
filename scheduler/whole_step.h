// Plans judged on the whole step that the wrappers of MakePlanner make of
// the step a policy planned: hybrid's (Note [hybrid on the whole step]) and
// best-order's (Note [best-order on the whole step]).
#ifndef PEBBLE_SCHEDULER_WHOLE_STEP_H_
#define PEBBLE_SCHEDULER_WHOLE_STEP_H_

#include <memory>

#include "scheduler/planner.h"

namespace pebble {

// Whether the wrappers of `graph`'s plan add or move steps that a policy
// planning it did not judge: an optimizer's updates (in-place nodes), a
// data-parallel step's all-reduces (where it has gradients), a sharded
// step's messages joined. There the wrappers below plan the named policies
// again on the whole step.
bool OnAWholeStep(const Graph& graph, const PlannerOptions& options);

// `inner` (hybrid: planner.cc), and where its candidates were judged on
// another step than the one planned, the better (MakespanSelector's rule)
// of its plan and each named candidate's plan of the whole step: the
// policies among details["candidates"] (and on a sharded graph FSDP's
// rules, their messages joined where faster), most promising first. Those
// plans join details["candidates"] as "NAME (whole step)"; one taken says
// so in details["candidate"] and details["whole_step"]. Within
// options.time_limit_s, counted from the call: past it the candidates left
// are not compared (details["time_limit_reached"]).
std::unique_ptr<Planner> WithWholeStepsCompared(std::unique_ptr<Planner> inner);

// `inner` (best-order, as MakePlanner wraps it), and on a whole step (an
// optimizer's updates, a data-parallel step's all-reduces, a sharded
// step's messages) the lowest peak, then the shortest makespan, of its plan
// and each order it judged (baseline, dfs, greedy, tree: those
// details["candidates"] gives a peak) planned whole as its own policy.
// details["whole_step_orders"] lists those plans' figures and
// details["winner"] names the order taken. Within options.time_limit_s.
std::unique_ptr<Planner> WithOrdersOnTheWholeStep(std::unique_ptr<Planner> inner);

// `inner` (a policy composed with best-order, PolicyInfo::composed, or an
// exact one, whose optimum is the step's without its updates), and on a
// whole step without options.own_order, best-order's plan of the whole
// step where BetterPlan (compose.h) prefers it: details then best-order's,
// with "order": "best-order one-shot", "whole_step": true and the policy's
// own under "policy". `with_fsdp_rules`: on a sharded step, FSDP's rules
// (their messages joined) are rivals too (details["rule"] names the one
// taken). A plan of the policy's own that says "optimal" is said to be so
// of the step it judged.
std::unique_ptr<Planner> WithBestOrderOnTheWholeStep(std::unique_ptr<Planner> inner,
                                                     bool with_fsdp_rules);

// `inner` (a one-shot exact policy: exact-order, tree), whose "optimal" on a
// whole step without options.own_order is said to be of the step it judged.
std::unique_ptr<Planner> WithOptimalOfTheStepJudged(std::unique_ptr<Planner> inner);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_WHOLE_STEP_H_
