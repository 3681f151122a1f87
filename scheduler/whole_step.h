// hybrid judged on the whole step (Note [hybrid on the whole step]).
#ifndef PEBBLE_SCHEDULER_WHOLE_STEP_H_
#define PEBBLE_SCHEDULER_WHOLE_STEP_H_

#include <memory>

#include "scheduler/planner.h"

namespace pebble {

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

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_WHOLE_STEP_H_
