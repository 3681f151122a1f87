// The Python module pebble._core (pybind11): graphs, plans, the simulator,
// compare, fit and outside policies. python/pebble/__init__.py re-exports
// it as `pebble`; docs/library.md documents the API.
//
// Conventions: budgets take the command line's forms ("60%", "2GiB",
// "min") or an int of bytes; JSON-shaped results are plain dicts and lists
// with the keys of the CLI's --json output. Bad input, and an argument of
// the wrong type or out of range, is a ValueError whose message names the
// culprit: the CLI's message where the CLI has one, printed as the CLI
// prints it (control characters escaped). TypeError is left to Python's
// own checks (an unknown keyword, a missing argument) and to making a Graph
// or Plan other than through the functions. KeyboardInterrupt and the other
// BaseExceptions that are not Exceptions pass through as themselves. The
// GIL is released while planning and taken back only to call a policy
// written in Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph/import/onnx_import.h"
#include "graph/models/models.h"
#include "graph/optimizer.h"
#include "graph/text_input.h"
#include "python/convert.h"
#include "python/python_policy.h"
#include "scheduler/collectives.h"
#include "scheduler/budget.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace pebble::python {
namespace {

// What pebble.plan returns.
struct PyPlan {
  bool feasible = false;
  std::string policy;
  std::string message;
  int64_t budget_bytes = 0;
  int64_t baseline_peak_bytes = 0;
  double plan_time_s = 0;
  int64_t peak_bytes = 0;  // the report's, as planned (repr: whatever a caller did to report)
  py::dict report;   // plan --json's "report"
  py::list schedule;  // (action, node) pairs; (action, node, bucket) in buckets
  py::dict details;
  py::dict document;  // the whole plan --json document
};

PyPlan PlanPy(const py::object& graph_arg, const py::object& policy, const py::object& budget,
              const py::object& host_budget, const py::object& bandwidth,
              const py::object& time_limit, const py::object& seed, const py::object& timeline,
              const py::object& own_order, const py::object& ranks, const py::object& network,
              const py::object& network_latency, const py::object& buckets,
              const py::object& bucket_copies, const py::object& bucket_alignment,
              const py::object& milp_max_stages) {
  const Graph& graph = GraphArg(graph_arg);
  PlanningCall call;
  PlanRequest request;
  request.policy = OptionalStrArg(policy, "policy").value_or("");
  if (!policy.is_none() && request.policy.empty()) {
    RaiseValueError("policy: the name is empty (None means the default)");
  }
  request.budget = BudgetText(budget, "budget");
  request.options = Options(host_budget, bandwidth, time_limit, seed, own_order);
  request.options.milp_max_stages = MilpMaxStagesArg(milp_max_stages);
  RankOptions(ranks, network, network_latency, &request.options.ranks, &request.options.network,
              &graph);
  request.options.bucket_bytes = BucketsArg(buckets, request.options.ranks);
  SetBucketCopies(bucket_copies, bucket_alignment, request.options.ranks, request.options);
  call.Attach(request.options);
  const bool with_timeline = BoolArg(timeline, "timeline");
  absl::StatusOr<PlanOutcome> outcome = call.Run([&] { return PlanGraph(graph, request); });
  if (!outcome.ok()) call.Raise(outcome.status());
  PyPlan p;
  p.feasible = outcome->result.feasible;
  p.policy = outcome->policy;
  p.message = outcome->result.message;
  p.budget_bytes = outcome->budget_bytes;
  p.baseline_peak_bytes = outcome->baseline_peak_bytes;
  p.plan_time_s = outcome->plan_time_s;
  p.document = ToPython(PlanDocument(graph, *outcome, graph.name(), with_timeline, false));
  p.report = p.document["report"];
  p.peak_bytes = p.report["peak_bytes"].cast<int64_t>();
  p.details = p.document["details"];
  p.schedule = ScheduleToPython(graph, outcome->result.schedule);
  return p;
}

py::list ComparePy(const py::object& graph_arg, const py::object& policies,
                   const py::object& budgets, const py::object& host_budget,
                   const py::object& bandwidth, const py::object& time_limit,
                   const py::object& seed, const py::object& jobs, const py::object& own_order,
                   const py::object& ranks, const py::object& network,
                   const py::object& network_latency, const py::object& buckets,
                   const py::object& bucket_copies, const py::object& bucket_alignment,
                   const py::object& milp_max_stages) {
  const Graph& graph = GraphArg(graph_arg);
  PlanningCall call;
  CompareRequest request;
  request.jobs = static_cast<int>(IntArg(jobs, "jobs", 0, 4096));
  if (!policies.is_none()) request.policies = PolicyListArg(policies);
  if (!budgets.is_none()) {
    request.budgets.clear();
    for (const py::object& b : ListArg(budgets, "budgets", "a list of budgets")) {
      const std::string name = absl::StrCat("budgets[", request.budgets.size(), "]");
      request.budgets.push_back(BudgetText(b, name));
      RefuseRepeated(request.budgets, name, "budget");
    }
  }
  request.options = Options(host_budget, bandwidth, time_limit, seed, own_order);
  request.options.milp_max_stages = MilpMaxStagesArg(milp_max_stages);
  RankOptions(ranks, network, network_latency, &request.options.ranks, &request.options.network,
              &graph);
  request.options.bucket_bytes = BucketsArg(buckets, request.options.ranks);
  SetBucketCopies(bucket_copies, bucket_alignment, request.options.ranks, request.options);
  call.Attach(request.options);
  absl::StatusOr<Comparison> comparison =
      call.Run([&] { return pebble::Compare(graph, request); });
  if (!comparison.ok()) call.Raise(comparison.status());
  py::list rows;
  for (const CompareEntry& e : comparison->entries) {
    rows.append(ToPython(CompareRowJson(graph, *comparison, e)));
  }
  return rows;
}

py::dict FitPy(const py::object& model, const py::object& vary, const py::object& budget,
               const py::object& policies, const py::object& start, const py::object& max_value,
               const py::object& throughput, const py::object& bandwidth,
               const py::object& time_limit, const py::object& jobs, const py::object& ranks,
               const py::object& network, const py::object& network_latency,
               const py::object& shard, const py::object& buckets,
               const py::object& bucket_copies, const py::object& bucket_alignment,
               const py::object& milp_max_stages) {
  PlanningCall call;
  FitRequest request;
  request.model = Unwrap(ParseModelSpec(StrArg(model, "model")));
  request.vary = StrArg(vary, "vary");
  if (request.vary.empty()) ArgError("vary", "a parameter of the model (n, batch, ...)", vary);
  request.budget_bytes = Unwrap(ParseFitBudget(BudgetText(budget, "budget")));
  if (!policies.is_none()) request.policies = PolicyListArg(policies);
  request.start = IntArg(start, "start", 1, INT64_MAX);
  request.max_value = IntArg(max_value, "max", 0, INT64_MAX);
  request.cost.device_flops_per_s =
      ThroughputArg(throughput);
  // A vary that no value makes a model of is the argument's fault, said as
  // fit --vary says it (and not as the model's error alone: "optimizer=1:
  // unknown optimizer '1'").
  const absl::StatusOr<int64_t> first = FirstValueWithAModel(
      request.model, request.vary, request.start, request.max_value, request.cost);
  if (first.status().code() == absl::StatusCode::kInvalidArgument) {
    RaiseValueError(absl::StrCat("vary ", Quote(request.vary), ": ", first.status().message(),
                                 " (and no value of ", request.vary, " from ", request.start,
                                 " on makes a model: vary takes an integer parameter of the "
                                 "model)"));
  }
  request.jobs = static_cast<int>(IntArg(jobs, "jobs", 0, 4096));
  // time_limit bounds the whole search; each plan takes at most 10 s of it.
  request.options = Options(py::none(), bandwidth, time_limit, py::int_(0), py::bool_(false));
  request.time_limit_s = request.options.time_limit_s;
  request.options.time_limit_s = std::min(10.0, request.time_limit_s);
  request.options.milp_max_stages = MilpMaxStagesArg(milp_max_stages);
  RankOptions(ranks, network, network_latency, &request.options.ranks, &request.options.network);
  request.options.bucket_bytes = BucketsArg(buckets, request.options.ranks);
  SetBucketCopies(bucket_copies, bucket_alignment, request.options.ranks, request.options);
  const std::string shard_mode = StrArg(shard, "shard");
  if (shard_mode != "none" && shard_mode != "full") {
    ArgError("shard", "\"none\" (data parallelism) or \"full\" (ZeRO-3 / FSDP sharding)", shard);
  }
  if (shard_mode == "full" && (request.options.bucket_bytes > 0 ||
                               request.options.device_bucket_copies)) {
    RaiseValueError("buckets, bucket_copies: a bucket cap (and the buckets' device copies) "
                    "group the all-reduces of data parallelism; a sharded model "
                    "(shard='full') takes buckets 'auto' (gathers and reduce-scatters joined "
                    "where the plan is faster) or 'none' (each its own message)");
  }
  if (shard_mode == "full") {
    const int n = request.options.ranks;
    const NetworkLink link = request.options.network;
    if (n < 2) RaiseValueError("shard='full': give ranks=2 or more");
    request.transform_model = [n, link](const Graph& g) { return ShardGraph(g, n, link); };
  }
  call.Attach(request.options);
  absl::StatusOr<FitResult> fit = call.Run([&] { return pebble::Fit(request); });
  if (!fit.ok()) call.Raise(fit.status());
  py::list rows;
  for (const FitRow& row : fit->rows) rows.append(ToPython(FitRowJson(row)));
  py::dict out;
  out["model"] = request.model.ToString();
  out["vary"] = request.vary;
  out["budget_bytes"] = request.budget_bytes;
  out["naive"] =
      fit->naive_value ? py::object(py::int_(*fit->naive_value)) : py::object(py::none());
  // Why "naive" is None (fit --json's naive.note): the rule does not apply, or failed.
  out["naive_note"] =
      fit->naive_note.empty() ? py::object(py::none()) : py::object(py::str(fit->naive_note));
  out["results"] = rows;
  return out;
}

// work() with the GIL released: C++ alone (simulating; building, reading or
// writing a graph: 0.2 s on 20,000 nodes), which other Python threads need not wait
// for. Its arguments are converted before, its result after, with the GIL.
template <typename Work>
auto WithoutGil(Work&& work) {
  const GilReleased released;
  return work();
}

py::object SimulatePy(const py::object& graph_arg, const py::object& schedule,
                      const py::object& bandwidth, const py::object& timeline,
                      const py::object& ranks, const py::object& network,
                      const py::object& network_latency, const py::object& bucket_copies,
                      const py::object& bucket_alignment) {
  const Graph& graph = GraphArg(graph_arg);
  const bool with_timeline = BoolArg(timeline, "timeline");
  SimulatorOptions options;
  options.host_bandwidth_bytes_per_s =
      Options(py::none(), bandwidth, py::float_(60.0), py::int_(0), py::bool_(false))
          .host_bandwidth_bytes_per_s;
  RankOptions(ranks, network, network_latency, &options.ranks, &options.network, &graph);
  const BucketCopies copies = BucketCopiesArg(bucket_copies, bucket_alignment, options.ranks);
  options.device_bucket_copies = copies.device;
  options.bucket_copy_alignment = copies.alignment;
  const Schedule s = Unwrap(ScheduleFromPython(graph, schedule));
  const absl::StatusOr<PlanReport> report =
      WithoutGil([&] { return pebble::Simulate(graph, s, options); });
  if (!report.ok()) Raise(report.status());
  return ToPython(ReportToJson(*report, graph, s, with_timeline));
}

Graph ModelPy(const py::object& spec_arg, const py::object& throughput) {
  CostModel cost;
  cost.device_flops_per_s = ThroughputArg(throughput);
  const std::string spec = StrArg(spec_arg, "spec");
  return Unwrap(WithoutGil([&] { return BuildModel(spec, cost); }));
}

Graph LoadPy(const py::object& path_arg) {
  const std::string path = PathArg(path_arg, "path");
  return Unwrap(WithoutGil([&] { return ReadGraphFile(path); }));
}

Graph FromJsonPy(const py::object& text_arg) {
  const std::string text = StrArg(text_arg, "text", /*allow_nul=*/true);
  return Unwrap(WithoutGil([&] { return ParseGraphJson(text); }));
}

// import_onnx's frozen: None, or a list of ids or globs (a str alone is
// refused: it would read as its characters).
std::vector<std::string> FrozenArg(const py::object& frozen) {
  std::vector<std::string> patterns;
  if (frozen.is_none()) return patterns;
  for (const py::object& item : ListArg(frozen, "frozen", "a list of ids or globs")) {
    const std::string name = absl::StrCat("frozen[", patterns.size(), "]");
    patterns.emplace_back(absl::StripAsciiWhitespace(StrArg(item, name)));  // as the CLI
    if (patterns.back().empty()) RaiseValueError(absl::StrCat(name, ": an empty pattern"));
    RefuseRepeated(patterns, name, "pattern");
  }
  return patterns;
}

Graph ImportOnnxPy(const py::object& path_arg, const py::object& loss, const py::object& batch,
                   const py::object& frozen) {
  const std::string path = PathArg(path_arg, "path");
  OnnxImportOptions o;
  const absl::Status loss_set = SetOnnxLoss(StrArg(loss, "loss"), o);
  if (!loss_set.ok()) RaiseValueError(std::string(loss_set.message()));
  if (!batch.is_none()) o.batch = IntArg(batch, "batch", 1, int64_t{1} << 24);
  o.frozen = FrozenArg(frozen);
  std::vector<std::string> notes;
  Graph graph = Unwrap(WithoutGil([&] { return ImportOnnxFile(path, o, &notes); }));
  for (const std::string& note : notes) {
    if (PyErr_WarnEx(PyExc_UserWarning, note.c_str(), 1) != 0) {
      throw py::error_already_set();  // warnings turned into errors
    }
  }
  return graph;
}

// tp_new of the classes: their objects come only from the functions. (The
// default would hand out an object whose C++ value was never built.)
template <const char* kMessage>
PyObject* RefuseNew(PyTypeObject*, PyObject*, PyObject*) {
  PyErr_SetString(PyExc_TypeError, kMessage);
  return nullptr;
}
constexpr char kNewGraph[] =
    "pebble.Graph cannot be created directly: model(), load(), from_json(), import_onnx() "
    "and train() make graphs";
constexpr char kNewPlan[] = "pebble.Plan cannot be created directly: plan() makes plans";

}  // namespace
}  // namespace pebble::python

PYBIND11_MODULE(_core, m) {
  using namespace pebble;          // NOLINT: the module's whole vocabulary
  using namespace pebble::python;  // NOLINT
  m.doc() = "pebble: memory planning for training steps (see docs/library.md)";

  InitGil();
  AddPolicyTimeLimit(m);
  m.attr("DEFAULT_HOST_BYTES_PER_S") = CostModel{}.host_bytes_per_s;

  py::class_<Graph>(m, "Graph", "A computation graph (pebble-graph).", py::is_final(),
                    py::custom_type_setup([](PyHeapTypeObject* type) {
                      type->ht_type.tp_new = &RefuseNew<kNewGraph>;
                    }))
      .def_property_readonly("name", &Graph::name,
                             "the graph's name (its file's \"name\"; a zoo model's spec)")
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
      }, "the ids of the nodes the step must leave computed (the loss, the gradients, ...)")
      .def("to_json",
           [](const Graph& g) { return WithoutGil([&] { return GraphToJsonText(g); }); },
           "the graph as pebble-graph JSON text (what `pebble export` writes)")
      .def("__repr__", [](const Graph& g) {
        return absl::StrCat("<pebble.Graph ", Quote(g.name()), " of ", g.num_nodes(), " nodes>");
      });

  m.def("model", &ModelPy, py::arg("spec"), py::arg("throughput") = 10e12,
        "A zoo model's training graph, e.g. model(\"resnet18:batch=8,image=128\"); node costs "
        "are FLOPs / throughput (FLOP/s).");
  m.def("load", &LoadPy, py::arg("path"),
        "A graph file (pebble-graph JSON); path: str, bytes or os.PathLike.");
  m.def("from_json", &FromJsonPy, py::arg("text"), "A graph from pebble-graph JSON text.");
  m.def("import_onnx", &ImportOnnxPy, py::arg("path"), py::arg("loss") = "cross-entropy",
        py::arg("batch") = py::none(), py::arg("frozen") = py::none(),
        "An ONNX model as a training graph (pebble import): loss 'cross-entropy', 'nll', "
        "'mse', 'bce' or 'none' (the forward graph); frozen: a list of initializer ids or "
        "globs not to train (buffers, frozen parameters: pebble import --frozen).");
  m.def("train", [](const py::object& forward, const py::object& loss) {
        const Graph& graph = GraphArg(forward);
        const LossKind kind = Unwrap(ParseLossKind(StrArg(loss, "loss")));
        return Unwrap(WithoutGil([&] { return AddLossAndDifferentiate(graph, kind); }));
      }, py::arg("graph"), py::arg("loss") = "cross-entropy",
      "A forward graph with the loss added and differentiated (--train).");
  m.def("with_optimizer", [](const py::object& training, const py::object& optimizer,
                             const py::object& host_bytes_per_s) {
        const Graph& graph = GraphArg(training);
        CostModel cost;
        if (!host_bytes_per_s.is_none()) {
          cost.host_bytes_per_s = PositiveArg(host_bytes_per_s, "host_bytes_per_s",
                                              "a positive number of bytes per second");
        }
        const OptimizerSpec spec = Unwrap(ParseOptimizer(StrArg(optimizer, "optimizer")));
        absl::StatusOr<Graph> out = WithoutGil([&] { return AddOptimizerStep(graph, spec, cost); });
        // (a rate so low that an update's host time is no finite number:
        // the rate's fault, not the node's that the graph check names)
        if (!out.ok() && !host_bytes_per_s.is_none() &&
            absl::StrContains(out.status().message(), "'host_cost'")) {
          RaiseValueError(absl::StrCat("host_bytes_per_s: ", Shown(host_bytes_per_s),
                                       " bytes per second is too slow: ",
                                       out.status().message()));
        }
        return Unwrap(std::move(out));
      }, py::arg("graph"), py::arg("optimizer"), py::arg("host_bytes_per_s") = py::none(),
      "A training graph ending with the optimizer's step (--optimizer): optimizer is "
      "'sgd', 'adam' or 'adamw' with settings, e.g. 'adam:lr=1e-3,weight_decay=0'. "
      "host_bytes_per_s: the host's rate for the host_cost of updates that may run on the "
      "host (bytes read and written per second; default pebble's cost model's, 10e9).");
  m.def("shard", [](const py::object& training, const py::object& ranks,
                    const py::object& network, const py::object& network_latency) {
        const Graph& graph = GraphArg(training);
        int n = 1;
        NetworkLink link;
        RankOptions(ranks, network, network_latency, &n, &link);
        return Unwrap(WithoutGil([&] { return ShardGraph(graph, n, link); }));
      }, py::arg("graph"), py::arg("ranks"), py::arg("network") = py::none(),
      py::arg("network_latency") = py::none(),
      "The training graph as one of `ranks` ranks runs it sharded (--shard full: ZeRO-3 / "
      "FSDP FULL_SHARD): parameters, gradients and optimizer state in shards, a collective "
      "'gather:p' before each parameter's use and a reduce-scatter of each gradient, timed on "
      "the network (a preset or bytes/s; network_latency in seconds). Plan it with "
      "plan(..., ranks=ranks); policy 'fsdp' is FSDP's own rule.");

  m.def("collective_seconds", [](const py::object& op, const py::object& bytes,
                                 const py::object& ranks, const py::object& network,
                                 const py::object& network_latency) {
        const std::string name = StrArg(op, "op");
        const int64_t n_bytes = IntArg(bytes, "bytes", 0, INT64_MAX);
        int n = 1;
        NetworkLink link;
        RankOptions(ranks, network, network_latency, &n, &link);
        double seconds = 0;
        if (name == "all_reduce") {
          seconds = AllReduceSeconds(n_bytes, n, link);
        } else if (name == "all_gather" || name == "reduce_scatter") {
          seconds = AllGatherSeconds(n_bytes, n, link);
        } else {
          throw py::value_error(absl::StrCat("op '", name, "': a collective is 'all_reduce', "
                                             "'all_gather' or 'reduce_scatter'"));
        }
        if (!std::isfinite(seconds)) {  // (a link too slow, or a latency too large, to time)
          throw py::value_error(absl::StrCat(
              "collective_seconds: the time exceeds the largest double (network ",
              link.bandwidth_bytes_per_s, " bytes/s, network_latency ", link.latency_s,
              " s): give a faster network or a smaller latency"));
        }
        return seconds;
      }, py::arg("op"), py::arg("bytes"), py::arg("ranks"), py::arg("network") = py::none(),
      py::arg("network_latency") = py::none(),
      "Seconds of one collective of a tensor of `bytes` (the whole tensor) over `ranks` ranks "
      "by the ring algorithm, as the simulator times it (docs/semantics.md, section 4): "
      "'all_reduce', or 'all_gather' and 'reduce_scatter' (half an all-reduce). network: a "
      "preset or bytes/s; network_latency: seconds per message.");

  py::class_<PyPlan>(m, "Plan", "What plan() returns.", py::is_final(),
                     py::custom_type_setup([](PyHeapTypeObject* type) {
                       type->ht_type.tp_new = &RefuseNew<kNewPlan>;
                     }))
      .def_readonly("feasible", &PyPlan::feasible, "whether the plan fits the budget")
      .def_readonly("policy", &PyPlan::policy, "the policy that planned (the default resolved)")
      .def_readonly("message", &PyPlan::message,
                    "the policy's word on the plan (why it does not fit, 'optimal', ...)")
      .def_readonly("budget_bytes", &PyPlan::budget_bytes,
                    "the budget in bytes (with 'min': the least peak reached)")
      .def_readonly("baseline_peak_bytes", &PyPlan::baseline_peak_bytes,
                    "the peak of the graph's own order, each tensor freed at its last use "
                    "(what '100%' is)")
      .def_readonly("plan_time_s", &PyPlan::plan_time_s, "seconds the planning took")
      .def_readonly("report", &PyPlan::report,
                    "the simulator's figures of the schedule (plan --json's report): "
                    "peak_bytes, makespan, overhead, ...")
      .def_readonly("schedule", &PyPlan::schedule,
                    "the steps: (action, node) pairs, (action, node, bucket) for a bucket's")
      .def_readonly("details", &PyPlan::details,
                    "the policy's own details (plan --json's details)")
      .def_readonly("document", &PyPlan::document, "the whole `plan --json` document")
      .def("__repr__", [](const PyPlan& p) {
        return absl::StrCat("<pebble.Plan ", p.policy, ": ", p.feasible ? "fits" : "does not fit",
                            ", peak ", p.peak_bytes, " bytes>");
      });

  m.def("plan", &PlanPy, py::arg("graph"), py::arg("policy") = py::none(),
        py::arg("budget") = "100%", py::arg("host_budget") = py::none(),
        py::arg("bandwidth") = py::none(), py::arg("time_limit") = 60.0, py::arg("seed") = 0,
        py::arg("timeline") = false, py::arg("own_order") = false, py::arg("ranks") = 1,
        py::arg("network") = py::none(), py::arg("network_latency") = py::none(),
        py::arg("buckets") = py::none(), py::arg("bucket_copies") = "none",
        py::arg("bucket_alignment") = 1, py::arg("milp_max_stages") = 0,
        "Plans `graph` under a policy (default: best-order where the baseline fits, else "
        "hybrid) and a budget (\"60%\", \"2GiB\", \"min\" or bytes); ranks > 1 adds the "
        "gradients' all-reduces over the ranks' network (a preset or bytes/s; "
        "network_latency in seconds), grouped in buckets (None or 'auto': planned; 'none'; "
        "or a size: DistributedDataParallel's rule). A bucket's steps in plan.schedule are "
        "(action, node, bucket) triples (all_reduce steps, or a unit's gathers or "
        "reduce-scatters under fsdp-module and fsdp-blocks). bucket_copies='device': the runtime sends "
        "a bucket of several gradients through a flat device copy of them, which the plan "
        "holds (pebble.torch's way), each gradient's place in it rounded up to "
        "bucket_alignment bytes. milp_max_stages: the largest graph (needed non-persistent "
        "nodes) checkmate's MILP and checkmate-lp's LP take (0: 300 and 600), as "
        "--milp-max-stages.");
  m.def("simulate", &SimulatePy, py::arg("graph"), py::arg("schedule"),
        py::arg("bandwidth") = py::none(), py::arg("timeline") = false, py::arg("ranks") = 1,
        py::arg("network") = py::none(), py::arg("network_latency") = py::none(),
        py::arg("bucket_copies") = "none", py::arg("bucket_alignment") = 1,
        "The simulator's report of a schedule (a list of (action, node) steps, with "
        "(action, node, bucket) triples for buckets, or a pebble-schedule dict); "
        "ValueError naming the first invalid step. bucket_copies='device': a bucket of "
        "several gradients holds a flat device copy of them until a later step touches one.");
  m.def("compare", &ComparePy, py::arg("graph"), py::arg("policies") = py::none(),
        py::arg("budgets") = py::none(), py::arg("host_budget") = py::none(),
        py::arg("bandwidth") = py::none(), py::arg("time_limit") = 60.0, py::arg("seed") = 0,
        py::arg("jobs") = 0, py::arg("own_order") = false, py::arg("ranks") = 1,
        py::arg("network") = py::none(), py::arg("network_latency") = py::none(),
        py::arg("buckets") = py::none(), py::arg("bucket_copies") = "none",
        py::arg("bucket_alignment") = 1, py::arg("milp_max_stages") = 0,
        "Every policy at every budget: one dict a row, the rows of `compare --format json`.");
  m.def("fit", &FitPy, py::arg("model"), py::arg("vary"), py::arg("budget"),
        py::arg("policies") = py::none(), py::arg("start") = 1, py::arg("max") = 0,
        py::arg("throughput") = 10e12, py::arg("bandwidth") = py::none(),
        py::arg("time_limit") = 300.0, py::arg("jobs") = 0, py::arg("ranks") = 1,
        py::arg("network") = py::none(), py::arg("network_latency") = py::none(),
        py::arg("shard") = "none", py::arg("buckets") = py::none(),
        py::arg("bucket_copies") = "none", py::arg("bucket_alignment") = 1,
        py::arg("milp_max_stages") = 0,
        "For each policy, the largest value of a zoo model's parameter whose training step "
        "fits the budget (`pebble fit`); time_limit (seconds) bounds the whole search.");
  m.def("policies", &Policies, "Every registered policy: name, kind, exact, external, "
                               "description.");
  m.def("register_policy", &RegisterPolicy, py::arg("name"), py::arg("fn"),
        py::arg("description") = "", py::arg("kind") = "multi-shot",
        "Registers fn(graph, options) -> schedule as a policy that plan() and compare() "
        "take by name; the simulator judges its schedules. It must return within the plan's "
        "time limit (it is stopped there).");
  m.def("unregister_policy", &UnregisterPolicy, py::arg("name"),
        "Removes a policy that register_policy() added; a built-in's name, or one not "
        "registered, is a ValueError.");
}
