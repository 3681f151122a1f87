// Policies written in Python (pebble.register_policy) and the planning
// calls that run them: each policy call is stopped at the plan's time
// limit, and a KeyboardInterrupt or SystemExit it raises reaches the
// caller of plan(), compare() or fit() as itself (docs/library.md).
#ifndef PEBBLE_PYTHON_PYTHON_POLICY_H_
#define PEBBLE_PYTHON_PYTHON_POLICY_H_

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "python/gil.h"
#include "scheduler/planner.h"

namespace pebble::python {

namespace py = pybind11;

struct CallState;  // python_policy.cc

// One plan(), compare() or fit() call, made and destroyed with the GIL held.
// While one exists (in any thread), the policies cannot change: the
// registry is not thread-safe.
class PlanningCall {
 public:
  PlanningCall();
  ~PlanningCall();
  PlanningCall(const PlanningCall&) = delete;
  PlanningCall& operator=(const PlanningCall&) = delete;

  // Carries this call's state to the Python policies planning under
  // `options` (through options.progress, the one per-call hook that every
  // planner passes on; the Python functions report no progress).
  void Attach(PlannerOptions& options) const;

  // `plan()` with the GIL released; then the KeyboardInterrupt (or other
  // BaseException that is not an Exception) a Python policy raised, if one
  // did, is raised again here as itself.
  template <typename F>
  auto Run(F&& plan) -> decltype(plan()) {
    std::optional<decltype(plan())> out;
    {
      const GilReleased released;
      out.emplace(plan());
    }
    RaiseInterrupt();
    return *std::move(out);
  }

  // A ValueError for `status`, whose __cause__ is the first exception a
  // Python policy of this call raised.
  [[noreturn]] void Raise(const absl::Status& status) const;

 private:
  void RaiseInterrupt();

  std::shared_ptr<CallState> state_;
};

// The module's functions register_policy, unregister_policy, policies.
void RegisterPolicy(const py::object& name, const py::object& fn, const py::object& description,
                    const py::object& kind);
void UnregisterPolicy(const py::object& name);
py::list Policies();

// Adds PolicyTimeLimit, the exception raised inside a Python policy past
// its time limit, to `module`. Called once, at import.
void AddPolicyTimeLimit(py::module_& module);

}  // namespace pebble::python

#endif  // PEBBLE_PYTHON_PYTHON_POLICY_H_
