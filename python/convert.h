// Between Python and pebble, for the module (python/pebble_module.cc):
// errors raised as ValueErrors that name the culprit, arguments checked by
// name in the command line's ranges, JSON-shaped values and schedules.
// Everything here runs with the GIL held.
//
// A Python error met on the way (a __repr__, __index__ or json.dumps that
// raises) becomes the ValueError when it is an Exception; any other
// BaseException (KeyboardInterrupt, SystemExit) propagates as itself.
#ifndef PEBBLE_PYTHON_CONVERT_H_
#define PEBBLE_PYTHON_CONVERT_H_

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstddef>
#include <optional>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"

namespace pebble::python {

namespace py = pybind11;

// ---- Errors

// Raises a ValueError carrying `message` as the command line prints it
// (control characters escaped, at most 10000 characters), whatever bytes it
// holds; `cause`, an exception object, becomes its __cause__.
[[noreturn]] void RaiseValueError(absl::string_view message, py::handle cause = {});
[[noreturn]] void Raise(const absl::Status& status);
template <typename T>
T Unwrap(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return *std::move(value);
}
inline void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

// A Python exception caught in C++, kept to be raised again or chained.
struct PyError {
  explicit PyError(const py::error_already_set& e);
  // False for KeyboardInterrupt, SystemExit and the other BaseExceptions
  // that are not errors of the code that raised them.
  bool IsException() const;
  // "RuntimeError: no plan today".
  std::string Describe() const;
  [[noreturn]] void Raise() const;

  py::object type, value, trace;
};

// The Python error in flight, cleared, if it is an Exception; any other
// BaseException is raised on (thrown as py::error_already_set).
PyError FetchException();

// `value` for a message: its repr on one line, cut after 80 characters.
std::string Shown(py::handle value);

// Raises "<name>: must be <what>, got <value>", as the command line says
// "--time-limit: must be a positive number of seconds, got 'abc'".
[[noreturn]] void ArgError(absl::string_view name, absl::string_view what, py::handle value);

// ---- Arguments: each raises a ValueError naming `name`

// A str, as UTF-8. A NUL (where C would cut the text) is refused unless
// `allow_nul` (text a parser reads, which says where the NUL is).
std::string StrArg(py::handle value, absl::string_view name, bool allow_nul = false);
std::optional<std::string> OptionalStrArg(py::handle value, absl::string_view name);
// A file path: a str, bytes or os.PathLike, encoded as os.fsencode does.
std::string PathArg(py::handle value, absl::string_view name);
// An int (or anything with __index__, as numpy's integers; not a bool) in
// [min, max].
int64_t IntArg(py::handle value, absl::string_view name, int64_t min, int64_t max);
// A finite number above 0; `what` completes "must be" ("a positive number
// of seconds").
double PositiveArg(py::handle value, absl::string_view name, absl::string_view what);
// A finite number at or above 0 (a latency of 0), `what` as above.
double NonNegativeArg(py::handle value, absl::string_view name, absl::string_view what);
// A device's FLOP/s for a model's costs: a finite number from 1 (as
// --throughput), else ValueError naming `throughput`.
double ThroughputArg(py::handle value);
// True or False, nothing else.
bool BoolArg(py::handle value, absl::string_view name);
// A pebble.Graph (argument "graph").
const Graph& GraphArg(py::handle value);
// The items of a list argument: any iterable but a str, bytes or a dict.
std::vector<py::object> ListArg(py::handle value, absl::string_view name,
                                absl::string_view what);
// A ValueError where the last of `items` (given as `name`, "policies[2]")
// repeats an earlier one: each item of compare's and fit's lists is a row of
// the results, so twice would plan it twice (the command line refuses it
// too). `what`: "policy", "budget".
void RefuseRepeated(const std::vector<std::string>& items, absl::string_view name,
                    absl::string_view what);
// A non-empty list of policy names (argument "policies"): None, not an
// empty list, means every registered policy, as the command line refuses
// `--policies ,`.
std::vector<std::string> PolicyListArg(py::handle value);

inline constexpr absl::string_view kBudgetForms =
    "a str (\"60%\", \"2GiB\", \"min\") or an int of bytes";
inline constexpr absl::string_view kSizeForms = "a str (\"2GiB\") or an int of bytes";
// A budget or size given as a str or an int: the text that the command
// line's parser then judges, so that its messages are the CLI's.
std::string SizeText(py::handle value, absl::string_view name, absl::string_view forms);
// A budget's text (SizeText with kBudgetForms). A Python int is bytes: one
// under 1024, which as text the command line's rule reads as a percentage
// and refuses (CheckBudgetHasUnit), is given its unit ("7B").
std::string BudgetText(py::handle value, absl::string_view name);

// The options the planning functions share: host_budget (None:
// unlimited), bandwidth (None: the default link), time_limit, seed,
// own_order.
PlannerOptions Options(const py::object& host_budget, const py::object& bandwidth,
                       const py::object& time_limit, const py::object& seed,
                       const py::object& own_order);

// Data parallelism's options (scheduler/collectives.h): ranks (an int >=
// 1), network (None: the default link; a preset's name, or bytes per
// second) and network_latency (None: the link's; seconds >= 0).
// PlannerOptions::milp_max_stages from a Python int, 0 to 100000 (0: the
// defaults), as --milp-max-stages takes it; else ValueError naming it.
int MilpMaxStagesArg(const py::object& value);
// With `graph` sharded already (ShardedRanks), a network or network_latency
// given that differs from the link its collectives were timed for is
// refused, naming the argument, as the command line refuses it.
void RankOptions(const py::object& ranks, const py::object& network,
                 const py::object& network_latency, int* ranks_out, NetworkLink* link,
                 const Graph* graph = nullptr);
// The bucket rule of data parallelism's all-reduces (PlannerOptions::
// bucket_bytes): None or "auto" (planned), "none" or 0, a size ("25MB") or
// bytes. ValueError for anything else, and for a rule other than planned
// where `ranks` is below 2.
int64_t BucketsArg(const py::object& buckets, int ranks);
// Where a bucket of several gradients is copied to be sent as one message
// (PlannerOptions::device_bucket_copies): `copies` "none" (reduced where
// they lie, or staged off the device) or "device"; `alignment` the bytes
// each gradient's place in the copy is rounded up to (an integer >= 1).
// ValueError for anything else, for "device" where `ranks` is below 2, and
// for an alignment above 1 without "device".
struct BucketCopies {
  bool device = false;
  int64_t alignment = 1;
};
BucketCopies BucketCopiesArg(const py::object& copies, const py::object& alignment, int ranks);
// Sets `options`'s bucket copies (BucketCopiesArg).
void SetBucketCopies(const py::object& copies, const py::object& alignment, int ranks,
                     PlannerOptions& options);

// ---- JSON and schedules

// JSON to Python objects through the json module: exact for every value
// pebble writes (integers stay ints, ids stay str).
template <typename Json>
py::object ToPython(const Json& j) {
  return py::module_::import("json").attr("loads")(
      j.dump(-1, ' ', false, Json::error_handler_t::replace));
}

// A JSON-shaped Python value as JSON, through json.dumps (which refuses
// cycles, nan and objects it cannot write) and the strict parser. `what`
// begins the message ("step 3: the node").
absl::StatusOr<nlohmann::json> FromPython(py::handle value, absl::string_view what);

// A schedule from Python: a pebble-schedule dict, or a list (any sequence)
// of steps, each an (action, node) pair, an (action, node, bucket) triple
// or an {"action", "node"} dict. Each step is checked and kept as it is read
// (8 bytes), and the reading stops, with an error, at the first bad step,
// past kMaxPythonScheduleSteps, or (where given) past `deadline` on the
// steady clock: a sequence that never ends is an error, not a hang.
inline constexpr size_t kMaxPythonScheduleSteps = 10'000'000;
absl::StatusOr<Schedule> ScheduleFromPython(
    const Graph& graph, py::handle value,
    std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
// (action, node) pairs.
py::list ScheduleToPython(const Graph& graph, const Schedule& schedule);

}  // namespace pebble::python

#endif  // PEBBLE_PYTHON_CONVERT_H_
