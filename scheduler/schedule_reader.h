// A schedule read one step at a time (SPEC section 2's steps), each checked
// as ScheduleFromJson checks it and kept as a Step (8 bytes) at once: for
// readers that get the steps one by one and may stop early (a Python
// policy's list, which may never end), where a JSON array of them took
// about 330 bytes a step.
#ifndef PEBBLE_SCHEDULER_SCHEDULE_READER_H_
#define PEBBLE_SCHEDULER_SCHEDULE_READER_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/schedule.h"

namespace pebble {

class ScheduleReader {
 public:
  explicit ScheduleReader(const Graph& graph);
  ~ScheduleReader();
  ScheduleReader(const ScheduleReader&) = delete;
  ScheduleReader& operator=(const ScheduleReader&) = delete;

  // Checks and keeps the next step, a JSON object with "action", "node" and
  // an optional "bucket": the message of the first bad one, naming it
  // ("schedule step 3: unknown node 'x'"), after which nothing is kept.
  absl::Status Add(const nlohmann::json& step);
  size_t size() const;
  // The schedule of the steps added (the reader is empty after).
  Schedule Take();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_SCHEDULE_READER_H_
