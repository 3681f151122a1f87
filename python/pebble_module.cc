// The Python module pebble._core (pybind11): graphs, plans, the simulator,
// compare, fit and outside policies. python/pebble/__init__.py re-exports
// it as `pebble`; docs/library.md documents the API.
//
// Conventions: budgets take the command line's forms ("60%", "2GiB",
// "min") or an int of bytes; JSON-shaped results are plain dicts and lists
// with the keys of the CLI's --json output; every error is a ValueError
// carrying the CLI's message. The GIL is released while planning and
// taken back only to call a policy written in Python.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph/import/onnx_import.h"
#include "graph/models/models.h"
#include "scheduler/external_policy.h"
#include "scheduler/offload.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace py = pybind11;

namespace pebble::python {
namespace {

// Raises ValueError with the status's message.
[[noreturn]] void Raise(const absl::Status& status) {
  throw py::value_error(std::string(status.message()));
}
template <typename T>
T Unwrap(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return *std::move(value);
}
void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

// JSON to Python objects and back through the json module: exact for every
// value pebble writes (integers stay ints, ids stay str).
template <typename Json>
py::object ToPython(const Json& j) {
  return py::module_::import("json").attr("loads")(
      j.dump(-1, ' ', false, Json::error_handler_t::replace));
}
nlohmann::json FromPython(const py::handle& value, const char* what) {
  std::string text;
  try {
    text = py::module_::import("json").attr("dumps")(value).cast<std::string>();
  } catch (const py::error_already_set& e) {
    throw py::value_error(absl::StrCat(what, " is not JSON-shaped: ", e.what()));
  }
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// A budget given as text or as an int of bytes.
std::string BudgetText(const py::handle& budget) {
  if (py::isinstance<py::str>(budget)) return budget.cast<std::string>();
  if (py::isinstance<py::int_>(budget) && !py::isinstance<py::bool_>(budget)) {
    return std::to_string(budget.cast<int64_t>());
  }
  throw py::value_error(absl::StrCat("a budget is a str (\"60%\", \"2GiB\", \"min\") or an int "
                                     "of bytes, not ",
                                     std::string(py::str(py::type::of(budget)))));
}

// The budget-independent planner options, from the keyword arguments the
// functions share. bandwidth: bytes/s or a preset name (pcie4, pcie5,
// nvlink-c2c); host_budget: like a budget, None for unlimited.
PlannerOptions Options(const py::object& host_budget, const py::object& bandwidth,
                       double time_limit, uint64_t seed, bool own_order = false) {
  PlannerOptions o;
  o.own_order = own_order;
  if (!host_budget.is_none()) o.host_budget_bytes = Unwrap(ParseSize(BudgetText(host_budget)));
  if (!bandwidth.is_none()) {
    const std::string text = py::isinstance<py::str>(bandwidth)
                                 ? bandwidth.cast<std::string>()
                                 : std::string(py::str(bandwidth));
    o.host_bandwidth_bytes_per_s = Unwrap(ParseBandwidth(text));
  }
  if (!(time_limit > 0)) throw py::value_error("time_limit must be a positive number of seconds");
  o.time_limit_s = time_limit;
  o.seed = seed;
  return o;
}

// A schedule from Python: a pebble-schedule dict, or a list of steps, each
// an (action, node) pair or an {"action", "node"} dict.
absl::StatusOr<Schedule> ScheduleFromPython(const Graph& graph, const py::handle& value) {
  nlohmann::json doc;
  if (py::isinstance<py::dict>(value)) {
    doc = FromPython(value, "the schedule");
  } else {
    nlohmann::json steps = nlohmann::json::array();
    if (!py::isinstance<py::sequence>(value) || py::isinstance<py::str>(value)) {
      return absl::InvalidArgumentError(
          "a schedule is a list of (action, node) steps or a pebble-schedule dict");
    }
    size_t k = 0;
    for (const py::handle step : value) {
      if (py::isinstance<py::dict>(step)) {
        steps.push_back(FromPython(step, "a step"));
      } else if (py::isinstance<py::sequence>(step) && !py::isinstance<py::str>(step) &&
                 py::len(step) == 2) {
        py::sequence pair = py::reinterpret_borrow<py::sequence>(step);
        steps.push_back({{"action", FromPython(pair[0], "an action")},
                         {"node", FromPython(pair[1], "a node")}});
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "step ", k, " of the schedule is not an (action, node) pair or a dict"));
      }
      ++k;
    }
    doc = {{"format", "pebble-schedule"}, {"version", 1}, {"steps", std::move(steps)}};
  }
  return ScheduleFromJson(graph, doc);
}

py::list ScheduleToPython(const Graph& graph, const Schedule& schedule) {
  py::list steps;
  for (const Step& s : schedule.steps) {
    steps.append(py::make_tuple(std::string(ActionName(s.action)), graph.id(s.node)));
  }
  return steps;
}

// What pebble.plan returns.
struct PyPlan {
  bool feasible = false;
  std::string policy;
  std::string message;
  int64_t budget_bytes = 0;
  int64_t baseline_peak_bytes = 0;
  double plan_time_s = 0;
  py::dict report;   // plan --json's "report"
  py::list schedule;  // (action, node) pairs
  py::dict details;
  py::dict document;  // the whole plan --json document
};

PyPlan PlanPy(const Graph& graph, const std::optional<std::string>& policy,
            const py::object& budget, const py::object& host_budget,
            const py::object& bandwidth, double time_limit, uint64_t seed, bool timeline,
            bool own_order) {
  PlanRequest request;
  request.policy = policy.value_or("");
  request.budget = BudgetText(budget);
  request.options = Options(host_budget, bandwidth, time_limit, seed, own_order);
  absl::StatusOr<PlanOutcome> outcome;
  {
    py::gil_scoped_release release;
    outcome = PlanGraph(graph, request);
  }
  if (!outcome.ok()) Raise(outcome.status());
  PyPlan p;
  p.feasible = outcome->result.feasible;
  p.policy = outcome->policy;
  p.message = outcome->result.message;
  p.budget_bytes = outcome->budget_bytes;
  p.baseline_peak_bytes = outcome->baseline_peak_bytes;
  p.plan_time_s = outcome->plan_time_s;
  p.document = ToPython(PlanDocument(graph, *outcome, graph.name(), timeline, false));
  p.report = p.document["report"];
  p.details = p.document["details"];
  p.schedule = ScheduleToPython(graph, outcome->result.schedule);
  return p;
}

py::list ComparePy(const Graph& graph, const std::optional<std::vector<std::string>>& policies,
                 const std::optional<std::vector<py::object>>& budgets,
                 const py::object& host_budget, const py::object& bandwidth, double time_limit,
                 uint64_t seed, int jobs, bool own_order) {
  CompareRequest request;
  if (jobs < 0) throw py::value_error("jobs must be 0 (one per hardware thread) or more");
  request.jobs = jobs;
  if (policies) request.policies = *policies;
  if (budgets) {
    request.budgets.clear();
    for (const py::object& b : *budgets) request.budgets.push_back(BudgetText(b));
  }
  request.options = Options(host_budget, bandwidth, time_limit, seed, own_order);
  absl::StatusOr<Comparison> comparison;
  {
    py::gil_scoped_release release;
    comparison = pebble::Compare(graph, request);
  }
  if (!comparison.ok()) Raise(comparison.status());
  py::list rows;
  for (const CompareEntry& e : comparison->entries) {
    rows.append(ToPython(CompareRowJson(graph, *comparison, e)));
  }
  return rows;
}

py::dict FitPy(const std::string& model, const std::string& vary, const py::object& budget,
             const std::optional<std::vector<std::string>>& policies, int64_t start,
             int64_t max_value, double throughput, const py::object& bandwidth,
             double time_limit, int jobs) {
  FitRequest request;
  if (jobs < 0) throw py::value_error("jobs must be 0 (one per hardware thread) or more");
  request.jobs = jobs;
  request.model = Unwrap(ParseModelSpec(model));
  request.vary = vary;
  request.budget_bytes = Unwrap(ParseFitBudget(BudgetText(budget)));
  if (policies) request.policies = *policies;
  request.start = start;
  request.max_value = max_value;
  request.cost.device_flops_per_s = throughput;
  // time_limit bounds the whole search; each plan takes at most 10 s of it.
  request.options = Options(py::none(), bandwidth, std::min(10.0, time_limit), 0);
  request.time_limit_s = time_limit;
  absl::StatusOr<FitResult> fit;
  {
    py::gil_scoped_release release;
    fit = pebble::Fit(request);
  }
  if (!fit.ok()) Raise(fit.status());
  py::list rows;
  for (const FitRow& row : fit->rows) rows.append(ToPython(FitRowJson(row)));
  py::dict out;
  out["model"] = request.model.ToString();
  out["vary"] = vary;
  out["budget_bytes"] = request.budget_bytes;
  out["naive"] = fit->naive_value ? py::object(py::int_(*fit->naive_value)) : py::object(py::none());
  out["results"] = rows;
  return out;
}

py::dict SimulatePy(const Graph& graph, const py::object& schedule, const py::object& bandwidth,
                  bool timeline) {
  Schedule s = Unwrap(ScheduleFromPython(graph, schedule));
  SimulatorOptions options;
  options.host_bandwidth_bytes_per_s = Options(py::none(), bandwidth, 60, 0).host_bandwidth_bytes_per_s;
  absl::StatusOr<PlanReport> report;
  {
    py::gil_scoped_release release;
    report = pebble::Simulate(graph, s, options);
  }
  if (!report.ok()) Raise(report.status());
  return ToPython(ReportToJson(*report, graph, s, timeline));
}

// pebble.register_policy: `fn(graph, options)` returns a schedule. Called
// with the GIL held; a Python exception becomes the plan's error.
void RegisterPolicy(const std::string& name, py::function fn, const std::string& description,
                    const std::string& kind) {
  PlanKind plan_kind;
  if (kind == "one-shot") {
    plan_kind = PlanKind::kOneShot;
  } else if (kind == "multi-shot") {
    plan_kind = PlanKind::kMultiShot;
  } else if (kind == "offload") {
    plan_kind = PlanKind::kOffload;
  } else {
    throw py::value_error(absl::StrCat("kind '", kind,
                                       "' must be one-shot, multi-shot or offload"));
  }
  // The function outlives this call: held (and finally released) under the GIL.
  auto held = std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* f) {
    py::gil_scoped_acquire gil;
    delete f;
  });
  ScheduleFunction schedule_fn = [held, name](const Graph& graph,
                                              const PlannerOptions& options)
      -> absl::StatusOr<Schedule> {
    py::gil_scoped_acquire gil;
    try {
      py::object result = (*held)(graph, ToPython(PolicyOptionsJson(options)));
      absl::StatusOr<Schedule> schedule = ScheduleFromPython(graph, result);
      if (!schedule.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("policy '", name, "': ", schedule.status().message()));
      }
      return schedule;
    } catch (py::error_already_set& e) {
      return absl::InvalidArgumentError(absl::StrCat("policy '", name, "' raised ", e.what()));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("policy '", name, "': ", e.what()));
    }
  };
  Check(RegisterExternalPolicy(name, description, plan_kind, std::move(schedule_fn)));
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

}  // namespace
}  // namespace pebble::python

PYBIND11_MODULE(_core, m) {
  using namespace pebble;          // NOLINT: the module's whole vocabulary
  using namespace pebble::python;  // NOLINT
  m.doc() = "pebble: memory planning for training steps (see docs/library.md)";

  py::class_<Graph>(m, "Graph", "A computation graph (pebble-graph).")
      .def_property_readonly("name", &Graph::name)
      .def("__len__", &Graph::num_nodes)
      .def_property_readonly("ids", [](const Graph& g) {
        std::vector<std::string> ids;
        for (NodeId n = 0; n < g.num_nodes(); ++n) ids.push_back(g.id(n));
        return ids;
      }, "every node id, in the graph's order")
      .def_property_readonly("outputs", [](const Graph& g) {
        std::vector<std::string> ids;
        for (NodeId n : g.outputs()) ids.push_back(g.id(n));
        return ids;
      })
      .def("to_json", [](const Graph& g) { return GraphToJsonText(g); },
           "the graph as pebble-graph JSON text (what `pebble export` writes)")
      .def("__repr__", [](const Graph& g) {
        return absl::StrCat("<pebble.Graph '", g.name(), "' of ", g.num_nodes(), " nodes>");
      });

  m.def("model", [](const std::string& spec, double throughput) {
        CostModel cost;
        cost.device_flops_per_s = throughput;
        return Unwrap(BuildModel(spec, cost));
      }, py::arg("spec"), py::arg("throughput") = 10e12,
      "A zoo model's training graph, e.g. model(\"resnet18:batch=8,image=128\"); node costs are "
      "FLOPs / throughput (FLOP/s).");
  m.def("load", [](const std::string& path) { return Unwrap(ReadGraphFile(path)); },
        py::arg("path"), "A graph file (pebble-graph JSON).");
  m.def("from_json", [](const std::string& text) { return Unwrap(ParseGraphJson(text)); },
        py::arg("text"), "A graph from pebble-graph JSON text.");
  m.def("import_onnx", [](const std::string& path, const std::string& loss,
                          std::optional<int64_t> batch) {
        OnnxImportOptions o;
        o.loss = Unwrap(ParseLossKind(loss));
        o.batch = batch;
        absl::StatusOr<Graph> g;
        {
          py::gil_scoped_release release;
          g = ImportOnnxFile(path, o);
        }
        return Unwrap(std::move(g));
      }, py::arg("path"), py::arg("loss") = "cross-entropy", py::arg("batch") = py::none(),
      "An ONNX model as a training graph (pebble import): loss 'cross-entropy', 'mse' or "
      "'none' (the forward graph).");
  m.def("train", [](const Graph& forward, const std::string& loss) {
        return Unwrap(AddLossAndDifferentiate(forward, Unwrap(ParseLossKind(loss))));
      }, py::arg("graph"), py::arg("loss") = "cross-entropy",
      "A forward graph with the loss added and differentiated (--train).");

  py::class_<PyPlan>(m, "Plan", "What plan() returns.")
      .def_readonly("feasible", &PyPlan::feasible)
      .def_readonly("policy", &PyPlan::policy)
      .def_readonly("message", &PyPlan::message)
      .def_readonly("budget_bytes", &PyPlan::budget_bytes)
      .def_readonly("baseline_peak_bytes", &PyPlan::baseline_peak_bytes)
      .def_readonly("plan_time_s", &PyPlan::plan_time_s)
      .def_readonly("report", &PyPlan::report)
      .def_readonly("schedule", &PyPlan::schedule)
      .def_readonly("details", &PyPlan::details)
      .def_readonly("document", &PyPlan::document, "the whole `plan --json` document")
      .def("__repr__", [](const PyPlan& p) {
        return absl::StrCat("<pebble.Plan ", p.policy, ": ", p.feasible ? "fits" : "does not fit",
                            ", peak ", py::str(p.report["peak_bytes"]).cast<std::string>(),
                            " bytes>");
      });

  m.def("plan", &PlanPy, py::arg("graph"), py::arg("policy") = py::none(),
        py::arg("budget") = "100%", py::arg("host_budget") = py::none(),
        py::arg("bandwidth") = py::none(), py::arg("time_limit") = 60.0, py::arg("seed") = 0,
        py::arg("timeline") = false, py::arg("own_order") = false,
        "Plans `graph` under a policy (default: best-order where the baseline fits, else "
        "hybrid) and a budget (\"60%\", \"2GiB\", \"min\" or bytes).");
  m.def("simulate", &SimulatePy, py::arg("graph"), py::arg("schedule"),
        py::arg("bandwidth") = py::none(), py::arg("timeline") = false,
        "The simulator's report of a schedule (a list of (action, node) steps or a "
        "pebble-schedule dict); ValueError naming the first invalid step.");
  m.def("compare", &ComparePy, py::arg("graph"), py::arg("policies") = py::none(),
        py::arg("budgets") = py::none(), py::arg("host_budget") = py::none(),
        py::arg("bandwidth") = py::none(), py::arg("time_limit") = 60.0, py::arg("seed") = 0,
        py::arg("jobs") = 0, py::arg("own_order") = false,
        "Every policy at every budget: one dict a row, the rows of `compare --format json`.");
  m.def("fit", &FitPy, py::arg("model"), py::arg("vary"), py::arg("budget"),
        py::arg("policies") = py::none(), py::arg("start") = 1, py::arg("max") = 0,
        py::arg("throughput") = 10e12, py::arg("bandwidth") = py::none(),
        py::arg("time_limit") = 300.0, py::arg("jobs") = 0,
        "For each policy, the largest value of a zoo model's parameter whose training step "
        "fits the budget (`pebble fit`); time_limit (seconds) bounds the whole search.");
  m.def("policies", &Policies, "Every registered policy: name, kind, exact, external, "
                               "description.");
  m.def("register_policy", &RegisterPolicy, py::arg("name"), py::arg("fn"),
        py::arg("description") = "", py::arg("kind") = "multi-shot",
        "Registers fn(graph, options) -> schedule as a policy that plan() and compare() "
        "take by name; the simulator judges its schedules.");
  m.def("unregister_policy", [](const std::string& name) {
        Check(UnregisterExternalPolicy(name));
      }, py::arg("name"));
}
