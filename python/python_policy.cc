#include "python/python_policy.h"

#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/text_input.h"
#include "python/convert.h"
#include "scheduler/external_policy.h"
#include "scheduler/planner.h"

namespace pebble::python {

// What one plan(), compare() or fit() call shares with the Python policies
// it runs. Touched with the GIL held.
struct CallState {
  // The first KeyboardInterrupt, SystemExit (any BaseException that is not
  // an Exception) a policy raised: no Python policy runs after it, and the
  // call raises it again once planning returns.
  std::optional<PyError> interrupt;
  // The first exception a policy raised: the __cause__ of plan()'s error.
  std::optional<PyError> cause;
  // The Python policies whose call made this one (plan() inside a policy),
  // outermost first: one of them run again here would recurse.
  std::vector<std::string> outer_policies;
};

namespace {

// PlannerOptions::progress of a planning call: it reports nothing, and
// carries the call's state to the Python policies (PlanningCall::Attach).
struct CallHook {
  std::shared_ptr<CallState> state;
  void operator()(const PlanProgress&) const {}
};

CallState* StateOf(const PlannerOptions& options) {
  const CallHook* hook = options.progress.target<CallHook>();
  return hook != nullptr ? hook->state.get() : nullptr;
}

// Planning calls in flight, in any thread; changed with the GIL held.
int planning_calls = 0;

void CheckPoliciesIdle(absl::string_view function) {
  if (planning_calls > 0) {
    RaiseValueError(absl::StrCat(function,
                                 ": the policies cannot change while a plan, compare or fit "
                                 "call runs (in this thread or another); change them before "
                                 "or after planning"));
  }
}

// Raised in a Python policy that runs past its time limit: a BaseException,
// so that `except Exception` in the policy does not stop it
// (AddPolicyTimeLimit).
PyObject* policy_time_limit = nullptr;

// Stops a Python policy at its time limit: past it, raises PolicyTimeLimit
// asynchronously in the thread that made the watchdog, again each second
// until Stop(). Python delivers it between bytecodes: a policy blocked in
// one C call (time.sleep, a lock, I/O) sees it only when that call returns.
class Watchdog {
 public:
  // With the GIL held, in the policy's thread. A limit past a day is a day
  // (as Deadline takes it).
  explicit Watchdog(double limit_s) : thread_id_(PyThread_get_thread_ident()) {
    const double first_s = std::min(limit_s, 86400.0);
    thread_ = std::thread([this, first_s] { Watch(first_s); });
  }
  // Joins the thread, with the GIL released where this thread holds it
  // (not in a forced unwind at the interpreter's exit: python/gil.h).
  ~Watchdog() {
    Stop();
    if (ThisThreadHoldsGil()) {
      const GilReleased released;
      thread_.join();
    } else {
      thread_.join();
    }
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // With the GIL held: no exception is raised after this, and one raised
  // but not yet delivered is withdrawn. Whether the limit had passed.
  // (Without the GIL, in a forced unwind at exit, it only stops the watch.)
  bool Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (fired_ && ThisThreadHoldsGil()) PyThreadState_SetAsyncExc(thread_id_, nullptr);
    return fired_;
  }

 private:
  void Watch(double wait_s) {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        const auto wait = std::chrono::duration<double>(wait_s);
        if (cv_.wait_for(lock, wait, [this] { return stopped_; })) return;
      }
      if (ExitingWithoutThisThread()) return;  // (no GIL to take: python/gil.h)
      const PyGILState_STATE gil = PyGILState_Ensure();
      // stopped_ only turns true with the GIL held, so it cannot turn now.
      if (!stopped_) {
        PyThreadState_SetAsyncExc(thread_id_, policy_time_limit);
        fired_ = true;
      }
      PyGILState_Release(gil);
      wait_s = 1;
    }
  }

  const unsigned long thread_id_;  // NOLINT(runtime/int): CPython's thread ids
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;  // written under mu_ with the GIL held
  bool fired_ = false;    // with the GIL held
  std::thread thread_;
};

// The Python policies whose calls this thread runs, outermost first (a
// policy run by compare's workers carries its caller's chain): a policy
// that plans with itself (pebble.plan inside it, directly or through other
// Python policies, in any thread) is refused at once, not after Python's
// recursion limit.
thread_local std::vector<std::string> policies_running;

// Sets policies_running to a call's chain while the call runs.
class RunningPolicy {
 public:
  explicit RunningPolicy(std::vector<std::string> chain)
      : saved_(std::exchange(policies_running, std::move(chain))) {}
  ~RunningPolicy() { policies_running = std::move(saved_); }
  RunningPolicy(const RunningPolicy&) = delete;
  RunningPolicy& operator=(const RunningPolicy&) = delete;

 private:
  std::vector<std::string> saved_;
};

// The Python objects of a policy's call, released (left to the exiting
// interpreter) where a forced unwind at exit passes without the GIL:
// python/gil.h. Made after them, so that it ends before they do.
class LeftWithoutGil {
 public:
  explicit LeftWithoutGil(std::initializer_list<py::object*> objects) : objects_(objects) {}
  ~LeftWithoutGil() {
    if (ThisThreadHoldsGil()) return;
    for (py::object* object : objects_) object->release();
  }
  LeftWithoutGil(const LeftWithoutGil&) = delete;
  LeftWithoutGil& operator=(const LeftWithoutGil&) = delete;

 private:
  std::vector<py::object*> objects_;
};

// Calls a policy written in Python, with the GIL held.
absl::StatusOr<Schedule> CallPolicy(const std::string& name, const py::function& fn,
                                    const Graph& graph, const PlannerOptions& options) {
  CallState* state = StateOf(options);
  const std::string who = absl::StrCat("policy ", Quote(name));
  if (state != nullptr && state->interrupt) {
    return absl::CancelledError(absl::StrCat(who, ": not run after an interrupt"));
  }
  std::vector<std::string> chain = state != nullptr ? state->outer_policies : policies_running;
  if (std::find(chain.begin(), chain.end(), name) != chain.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " plans with itself (a plan, compare or fit call inside it names it), which "
             "would recurse without end: plan with another policy there"));
  }
  chain.push_back(name);
  const RunningPolicy running(std::move(chain));
  auto failed = [&](PyError error) -> absl::Status {
    const std::string what = error.Describe();
    if (!error.IsException()) {
      if (state != nullptr && !state->interrupt) state->interrupt = std::move(error);
      return absl::CancelledError(absl::StrCat(who, " was interrupted (", what, ")"));
    }
    if (state != nullptr && !state->cause) state->cause = std::move(error);
    // A failure of a plan inside the policy that names this policy already
    // is given once, not once a level.
    const std::string nested = absl::StrCat("ValueError: ", who, " ");
    if (absl::StartsWith(what, nested)) {
      return absl::InvalidArgumentError(what.substr(nested.size() - who.size() - 1));
    }
    return absl::InvalidArgumentError(absl::StrCat(who, " raised ", what));
  };
  try {
    py::object graph_arg = py::cast(graph);  // a copy, which the policy may keep
    py::object options_arg = ToPython(PolicyOptionsJson(options));
    py::object result;
    const LeftWithoutGil left({&graph_arg, &options_arg, &result});
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(std::min(options.time_limit_s, 86400.0)));
    Watchdog watchdog(options.time_limit_s);
    std::optional<PyError> error;
    absl::StatusOr<Schedule> schedule = absl::UnknownError("no schedule");
    bool returned_in_time = false;  // (past the limit: its reading took the rest)
    try {
      // (the C API: no temporary of pybind11's to release in an unwind)
      PyObject* out = PyObject_CallFunctionObjArgs(fn.ptr(), graph_arg.ptr(),
                                                   options_arg.ptr(), nullptr);
      if (out == nullptr) throw py::error_already_set();
      result = py::reinterpret_steal<py::object>(out);
      returned_in_time = std::chrono::steady_clock::now() <= deadline;
      // Read within the policy's limit, the watchdog on: a sequence may
      // never end, or its __getitem__ never return.
      schedule = ScheduleFromPython(graph, result, deadline);
    } catch (const py::error_already_set& e) {
      error.emplace(e);
    }
    const bool late = watchdog.Stop();
    // A KeyboardInterrupt wins over the time limit.
    const bool interrupted =
        error && !error->IsException() &&
        !PyErr_GivenExceptionMatches(error->type.ptr(), policy_time_limit);
    // Past the limit, whatever the function did (it may have returned
    // before the exception reached it).
    if (late && !interrupted) {
      return absl::InvalidArgumentError(
          returned_in_time
              ? absl::StrCat(who, ": the schedule was not read within the time limit of ",
                             options.time_limit_s, " s (reading it was stopped; its ",
                             Py_TYPE(result.ptr())->tp_name, " may never end)")
              : absl::StrCat(who, ": no schedule within the time limit of ",
                             options.time_limit_s, " s; the function was stopped"));
    }
    if (error) return failed(*std::move(error));
    if (!schedule.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ", schedule.status().message()));
    }
    return schedule;
  } catch (const py::error_already_set& e) {  // converting the arguments or the result
    return failed(PyError(e));
  }
}

}  // namespace

PlanningCall::PlanningCall() : state_(std::make_shared<CallState>()) {
  ++planning_calls;
  state_->outer_policies = policies_running;
}

PlanningCall::~PlanningCall() {
  --planning_calls;
  state_->interrupt.reset();
  state_->cause.reset();
}

void PlanningCall::Attach(PlannerOptions& options) const { options.progress = CallHook{state_}; }

void PlanningCall::RaiseInterrupt() {
  if (!state_->interrupt) return;
  const PyError interrupt = *std::move(state_->interrupt);
  state_->interrupt.reset();
  interrupt.Raise();
}

void PlanningCall::Raise(const absl::Status& status) const {
  RaiseValueError(status.message(), state_->cause ? state_->cause->value : py::handle());
}

void RegisterPolicy(const py::object& name_arg, const py::object& fn,
                    const py::object& description_arg, const py::object& kind_arg) {
  const std::string name = StrArg(name_arg, "name");
  if (!PyCallable_Check(fn.ptr())) {
    ArgError("fn", "callable as fn(graph, options), returning a schedule", fn);
  }
  const std::string description = StrArg(description_arg, "description");
  const std::string kind = StrArg(kind_arg, "kind");
  PlanKind plan_kind;
  if (kind == "one-shot") {
    plan_kind = PlanKind::kOneShot;
  } else if (kind == "multi-shot") {
    plan_kind = PlanKind::kMultiShot;
  } else if (kind == "offload") {
    plan_kind = PlanKind::kOffload;
  } else {
    ArgError("kind", "one-shot, multi-shot or offload", kind_arg);
  }
  CheckPoliciesIdle("register_policy");
  // The function outlives this call: held (and finally released) under the GIL.
  auto held = std::shared_ptr<py::function>(
      new py::function(py::reinterpret_borrow<py::function>(fn)), [](py::function* f) {
        const GilHeld gil;
        delete f;
      });
  ScheduleFunction schedule_fn = [held, name](const Graph& graph,
                                              const PlannerOptions& options)
      -> absl::StatusOr<Schedule> {
    const GilHeld gil;
    try {
      return CallPolicy(name, *held, graph, options);
    } catch (const abi::__forced_unwind&) {
      // CPython ends this thread at exit (python/gil.h): the unwind stops
      // here, not in a caller that would swallow it (TBB's tasks of
      // compare and fit, which abort the process then).
      WaitForExit();
    } catch (const std::exception& e) {  // bad_alloc, a thread that would not start
      return absl::InternalError(absl::StrCat("policy ", Quote(name), ": ", e.what()));
    }
  };
  Check(RegisterExternalPolicy(name, description, plan_kind, std::move(schedule_fn)));
}

void UnregisterPolicy(const py::object& name) {
  const std::string text = StrArg(name, "name");
  CheckPoliciesIdle("unregister_policy");
  Check(UnregisterExternalPolicy(text));
}

py::list Policies() {
  py::list out;
  for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
    py::dict d;
    d["name"] = p->name;
    d["kind"] = std::string(PlanKindName(p->kind));
    d["exact"] = p->exact;
    d["external"] = p->external;
    d["description"] = p->description;
    out.append(d);
  }
  return out;
}

void AddPolicyTimeLimit(py::module_& module) {
  policy_time_limit = PyErr_NewExceptionWithDoc(
      "pebble._core.PolicyTimeLimit",
      "Raised inside a Python policy that runs past the plan's time limit (a BaseException, "
      "so that `except Exception` does not catch it).",
      PyExc_BaseException, nullptr);
  if (policy_time_limit == nullptr) throw py::error_already_set();
  module.attr("PolicyTimeLimit") = py::handle(policy_time_limit);
}

}  // namespace pebble::python
