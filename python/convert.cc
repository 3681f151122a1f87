#include "python/convert.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/collectives.h"
#include "scheduler/budget.h"
#include "scheduler/offload.h"
#include "scheduler/schedule_reader.h"

namespace pebble::python {
namespace {

py::object Steal(PyObject* p) { return py::reinterpret_steal<py::object>(p); }

// `str` (a Python str) as UTF-8, lone surrogates escaped (\udc80). A null
// `str` is the error in flight of the call that made it.
std::string Utf8(py::handle str) {
  if (!str) throw py::error_already_set();
  py::object bytes = Steal(PyUnicode_AsEncodedString(str.ptr(), "utf-8", "backslashreplace"));
  if (!bytes) throw py::error_already_set();
  return std::string(PyBytes_AS_STRING(bytes.ptr()), PyBytes_GET_SIZE(bytes.ptr()));
}

}  // namespace

// ---- Errors

void RaiseValueError(absl::string_view message, py::handle cause) {
  const std::string text = Printable(message, 10000);
  py::object str = Steal(PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()),
                                              "backslashreplace"));
  if (!str) throw py::error_already_set();
  py::object error = Steal(PyObject_CallFunctionObjArgs(PyExc_ValueError, str.ptr(), nullptr));
  if (!error) throw py::error_already_set();
  if (cause) PyException_SetCause(error.ptr(), cause.inc_ref().ptr());  // steals the reference
  PyErr_SetObject(PyExc_ValueError, error.ptr());
  throw py::error_already_set();
}

void Raise(const absl::Status& status) { RaiseValueError(status.message()); }

PyError::PyError(const py::error_already_set& e)
    : type(e.type()), value(e.value()), trace(e.trace()) {
  if (trace) PyException_SetTraceback(value.ptr(), trace.ptr());
}

bool PyError::IsException() const {
  return PyErr_GivenExceptionMatches(type.ptr(), PyExc_Exception) != 0;
}

std::string PyError::Describe() const {
  std::string text = reinterpret_cast<PyTypeObject*>(type.ptr())->tp_name;
  PyObject* str = PyObject_Str(value.ptr());
  if (str == nullptr) {
    PyErr_Clear();
    return text;
  }
  const std::string message = Utf8(Steal(str));
  if (!message.empty()) absl::StrAppend(&text, ": ", message);
  return text;
}

void PyError::Raise() const {
  PyErr_Restore(type.inc_ref().ptr(), value.inc_ref().ptr(), trace.inc_ref().ptr());
  throw py::error_already_set();
}

PyError FetchException() {
  py::error_already_set e;
  PyError error(e);
  if (!error.IsException()) error.Raise();
  return error;
}

std::string Shown(py::handle value) {
  PyObject* repr = PyObject_Repr(value.ptr());
  if (repr == nullptr) {
    FetchException();  // a repr that fails (an int too long to print): the type
    return absl::StrCat("<", Py_TYPE(value.ptr())->tp_name, " object>");
  }
  return Printable(Utf8(Steal(repr)));
}

void ArgError(absl::string_view name, absl::string_view what, py::handle value) {
  RaiseValueError(absl::StrCat(name, ": must be ", what, ", got ", Shown(value)));
}

namespace {

// ArgError in place of the Python error in flight, if it is an Exception.
[[noreturn]] void ArgErrorFromPython(absl::string_view name, absl::string_view what,
                                     py::handle value) {
  FetchException();
  ArgError(name, what, value);
}

// A bool, Python's or NumPy's (numpy.bool_, numpy.bool in NumPy 2): an int
// or a number to Python, but never a count or a size here.
bool IsBool(py::handle value) {
  if (PyBool_Check(value.ptr())) return true;
  const absl::string_view type = Py_TYPE(value.ptr())->tp_name;
  return type == "numpy.bool_" || type == "numpy.bool";
}

bool IsInteger(py::handle value) {
  return !IsBool(value) && PyIndex_Check(value.ptr());
}

}  // namespace

// ---- Arguments

std::string StrArg(py::handle value, absl::string_view name, bool allow_nul) {
  if (!PyUnicode_Check(value.ptr())) ArgError(name, "a str", value);
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (data == nullptr) ArgErrorFromPython(name, "valid Unicode (it holds a lone surrogate)", value);
  std::string text(data, static_cast<size_t>(size));
  if (!allow_nul && text.find('\0') != std::string::npos) {
    RaiseValueError(absl::StrCat(name, ": must not contain a NUL character, got ", Shown(value)));
  }
  return text;
}
std::optional<std::string> OptionalStrArg(py::handle value, absl::string_view name) {
  if (value.is_none()) return std::nullopt;
  return StrArg(value, name);
}

std::string PathArg(py::handle value, absl::string_view name) {
  constexpr absl::string_view kWhat = "a path (str, bytes or os.PathLike)";
  py::object path = Steal(PyOS_FSPath(value.ptr()));
  if (!path) ArgErrorFromPython(name, kWhat, value);
  py::object bytes = path;
  if (PyUnicode_Check(path.ptr())) {
    bytes = Steal(PyUnicode_EncodeFSDefault(path.ptr()));
    if (!bytes) ArgErrorFromPython(name, kWhat, value);
  }
  std::string text(PyBytes_AS_STRING(bytes.ptr()), PyBytes_GET_SIZE(bytes.ptr()));
  if (text.find('\0') != std::string::npos) {
    RaiseValueError(absl::StrCat(name, ": must not contain a NUL character, got ", Shown(value)));
  }
  return text;
}

int64_t IntArg(py::handle value, absl::string_view name, int64_t min, int64_t max) {
  const std::string what = absl::StrCat("a whole number from ", min, " to ", max);
  if (!IsInteger(value)) ArgError(name, what, value);
  py::object index = Steal(PyNumber_Index(value.ptr()));
  if (!index) ArgErrorFromPython(name, what, value);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) ArgErrorFromPython(name, what, value);
  if (overflow != 0 || v < min || v > max) ArgError(name, what, value);
  return v;
}

namespace {

// `value` as a double where it is a number (float, int, numpy's scalars,
// Fraction, Decimal: anything with __float__ or __index__), but a bool;
// NaN for an int past the largest double; nullopt for anything else.
std::optional<double> NumberArg(py::handle value) {
  PyObject* v = value.ptr();
  const PyNumberMethods* number = Py_TYPE(v)->tp_as_number;
  if (IsBool(value) || number == nullptr ||
      (number->nb_float == nullptr && number->nb_index == nullptr)) {
    return std::nullopt;
  }
  const double x = PyFloat_AsDouble(v);
  if (x == -1.0 && PyErr_Occurred()) {
    FetchException();  // an int past the largest double
    return std::nan("");
  }
  return x;
}

}  // namespace

double PositiveArg(py::handle value, absl::string_view name, absl::string_view what) {
  const double x = NumberArg(value).value_or(std::nan(""));
  if (!(std::isfinite(x) && x > 0)) ArgError(name, what, value);
  return x;
}

double ThroughputArg(py::handle value) {
  // (at least 1, as the command line's --throughput: a subnormal throughput
  // made every cost infinite, and the error blamed the model's first node)
  const double x = NumberArg(value).value_or(std::nan(""));
  if (!(std::isfinite(x) && x >= 1)) ArgError("throughput", "a number of FLOP/s from 1", value);
  return x;
}

double NonNegativeArg(py::handle value, absl::string_view name, absl::string_view what) {
  const double x = NumberArg(value).value_or(std::nan(""));
  if (!(std::isfinite(x) && x >= 0)) ArgError(name, what, value);
  return x;
}

bool BoolArg(py::handle value, absl::string_view name) {
  if (!IsBool(value)) ArgError(name, "True or False", value);
  return PyObject_IsTrue(value.ptr()) == 1;
}

const Graph& GraphArg(py::handle value) {
  if (!py::isinstance<Graph>(value)) ArgError("graph", "a pebble.Graph", value);
  return value.cast<const Graph&>();
}

std::vector<py::object> ListArg(py::handle value, absl::string_view name,
                                absl::string_view what) {
  PyObject* v = value.ptr();
  if (PyUnicode_Check(v) || PyBytes_Check(v) || PyByteArray_Check(v) || PyDict_Check(v)) {
    ArgError(name, what, value);
  }
  py::object iterator = Steal(PyObject_GetIter(v));
  if (!iterator) ArgErrorFromPython(name, what, value);
  std::vector<py::object> items;
  while (PyObject* item = PyIter_Next(iterator.ptr())) items.push_back(Steal(item));
  if (PyErr_Occurred()) ArgErrorFromPython(name, what, value);
  return items;
}

void RefuseRepeated(const std::vector<std::string>& items, absl::string_view name,
                    absl::string_view what) {
  if (std::find(items.begin(), items.end() - 1, items.back()) != items.end() - 1) {
    RaiseValueError(absl::StrCat(name, ": names the ", what, " ", Quote(items.back()), " twice"));
  }
}

std::vector<std::string> PolicyListArg(py::handle value) {
  std::vector<std::string> out;
  for (const py::object& item : ListArg(value, "policies", "a list of policy names")) {
    const std::string name = absl::StrCat("policies[", out.size(), "]");
    out.push_back(StrArg(item, name));
    RefuseRepeated(out, name, "policy");
  }
  if (out.empty()) {
    RaiseValueError("policies: the list names no policy (None means every registered one)");
  }
  return out;
}

std::string SizeText(py::handle value, absl::string_view name, absl::string_view forms) {
  if (PyUnicode_Check(value.ptr())) return StrArg(value, name);
  if (!IsInteger(value)) ArgError(name, forms, value);
  py::object index = Steal(PyNumber_Index(value.ptr()));
  if (!index) ArgErrorFromPython(name, forms, value);
  PyObject* text = PyObject_Str(index.ptr());
  if (text == nullptr) {  // past Python's limit on the digits of an int
    FetchException();
    RaiseValueError(absl::StrCat(name, ": an int of thousands of digits is no number of bytes"));
  }
  return Utf8(Steal(text));
}

std::string BudgetText(py::handle value, absl::string_view name) {
  std::string text = SizeText(value, name, kBudgetForms);
  if (IsInteger(value) && text.size() <= 4 && !text.empty() && text[0] != '-') {
    int64_t bytes = 0;
    if (absl::SimpleAtoi(text, &bytes) && bytes > 0 && bytes < 1024) text += "B";
  }
  return text;
}

PlannerOptions Options(const py::object& host_budget, const py::object& bandwidth,
                       const py::object& time_limit, const py::object& seed,
                       const py::object& own_order) {
  PlannerOptions o;
  if (!host_budget.is_none()) {
    absl::StatusOr<int64_t> bytes = ParseSize(SizeText(host_budget, "host_budget", kSizeForms));
    if (!bytes.ok()) RaiseValueError(absl::StrCat("host_budget: ", bytes.status().message()));
    o.host_budget_bytes = *bytes;
  }
  if (!bandwidth.is_none()) {
    std::string text;
    if (PyUnicode_Check(bandwidth.ptr())) {
      text = StrArg(bandwidth, "bandwidth");
    } else if (IsInteger(bandwidth)) {
      text = SizeText(bandwidth, "bandwidth", "bytes per second");
    } else if (const std::optional<double> x = NumberArg(bandwidth)) {
      text = absl::StrFormat("%.17g", *x);  // "25000000000", "nan": ParseBandwidth's words
    } else {
      ArgError("bandwidth",
               "bytes per second (a number) or a link preset (pcie4, pcie5, nvlink-c2c)",
               bandwidth);
    }
    o.host_bandwidth_bytes_per_s = Unwrap(ParseBandwidth(text));
  }
  o.time_limit_s = PositiveArg(time_limit, "time_limit", "a positive number of seconds");
  o.seed = static_cast<uint64_t>(IntArg(seed, "seed", 0, INT64_MAX));
  o.own_order = BoolArg(own_order, "own_order");
  return o;
}

int MilpMaxStagesArg(const py::object& value) {
  return static_cast<int>(IntArg(value, "milp_max_stages", 0, 100000));
}

void RankOptions(const py::object& ranks, const py::object& network,
                 const py::object& network_latency, int* ranks_out, NetworkLink* link,
                 const Graph* graph) {
  *ranks_out = static_cast<int>(IntArg(ranks, "ranks", 1, 1 << 20));
  if (!network.is_none()) {
    std::string text;
    if (PyUnicode_Check(network.ptr())) {
      text = StrArg(network, "network");
    } else {
      text = absl::StrFormat(
          "%.17g", PositiveArg(network, "network",
                               "bytes per second (a number) or a network preset "
                               "(ethernet-10g, ethernet-100g, ib-hdr, ib-ndr, nvlink4)"));
    }
    *link = Unwrap(ParseNetwork(text));
  }
  if (!network_latency.is_none()) {
    link->latency_s =
        NonNegativeArg(network_latency, "network_latency", "a non-negative number of seconds");
  }
  // (on one rank such a graph is one rank's part of the step, no link in it;
  // what is not given is the graph's own)
  if (graph == nullptr || *ranks_out < 2 || (network.is_none() && network_latency.is_none())) {
    return;
  }
  const std::optional<CollectiveLink> timed = ShardedRanks(*graph);
  if (!timed) return;
  if (network.is_none()) link->bandwidth_bytes_per_s = timed->link.bandwidth_bytes_per_s;
  if (link->bandwidth_bytes_per_s != timed->link.bandwidth_bytes_per_s ||
      link->latency_s != timed->link.latency_s) {
    RaiseValueError(absl::StrCat(
        network.is_none() ? "network_latency" : "network", ": the graph is sharded already, "
        "its collectives timed for a link of ",
        absl::StrFormat("%g", timed->link.bandwidth_bytes_per_s), " bytes/s and ",
        absl::StrFormat("%g", timed->link.latency_s), " s a message, which this does not "
        "change: shard the unsharded graph with this link instead (pebble.shard)"));
  }
}

int64_t BucketsArg(const py::object& buckets, int ranks) {
  if (buckets.is_none()) return PlannerOptions::kPlannedBuckets;
  int64_t bytes = 0;
  if (PyUnicode_Check(buckets.ptr())) {
    bytes = Unwrap(ParseBuckets(StrArg(buckets, "buckets")));
  } else {
    bytes = IntArg(buckets, "buckets", 0, INT64_MAX);
  }
  if (bytes != PlannerOptions::kPlannedBuckets && ranks < 2) {
    RaiseValueError("buckets group the all-reduces of data parallelism: give ranks=2 or more");
  }
  return bytes;
}

BucketCopies BucketCopiesArg(const py::object& copies, const py::object& alignment, int ranks) {
  const std::string text = StrArg(copies, "bucket_copies");
  if (text != "none" && text != "device") {
    ArgError("bucket_copies", "\"none\" or \"device\"", copies);
  }
  if (text == "device" && ranks < 2) {
    RaiseValueError("bucket_copies: buckets group the all-reduces of data parallelism: give "
                    "ranks=2 or more");
  }
  BucketCopies out{text == "device", IntArg(alignment, "bucket_alignment", 1, int64_t{1} << 30)};
  if (out.alignment > 1 && !out.device) {
    RaiseValueError("bucket_alignment rounds the places in a bucket's device copy: give "
                    "bucket_copies='device' too");
  }
  return out;
}

void SetBucketCopies(const py::object& copies, const py::object& alignment, int ranks,
                     PlannerOptions& options) {
  const BucketCopies c = BucketCopiesArg(copies, alignment, ranks);
  options.device_bucket_copies = c.device;
  options.bucket_copy_alignment = c.alignment;
}

// ---- JSON and schedules

absl::StatusOr<nlohmann::json> FromPython(py::handle value, absl::string_view what) {
  py::object dumps = py::module_::import("json").attr("dumps");
  PyObject* text = PyObject_Call(dumps.ptr(), py::make_tuple(value).ptr(),
                                 py::dict(py::arg("allow_nan") = false).ptr());
  if (text == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not JSON-shaped (", FetchException().Describe(), ")"));
  }
  absl::StatusOr<nlohmann::json> doc = ParseStrictJson(Utf8(Steal(text)));
  if (!doc.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", doc.status().message()));
  }
  return doc;
}

namespace {

bool IsText(py::handle value) {
  return PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr()) ||
         PyByteArray_Check(value.ptr());
}

// A pair's action or node: a str of valid Unicode, as a JSON string.
absl::StatusOr<nlohmann::json> StepTextFromPython(py::handle value, absl::string_view where,
                                                  absl::string_view field) {
  if (!PyUnicode_Check(value.ptr())) {
    return absl::InvalidArgumentError(absl::StrCat("schedule ", where, ": '", field,
                                                   "' must be a string, got ", Shown(value)));
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (data == nullptr) {
    FetchException();
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule ", where, ": '", field, "' must be valid Unicode (it holds a lone "
        "surrogate), got ", Shown(value)));
  }
  return nlohmann::json(std::string(data, static_cast<size_t>(size)));
}

}  // namespace

namespace {

// One step of a schedule given in Python, as the JSON step it stands for.
absl::StatusOr<nlohmann::json> StepFromPython(py::handle step, const std::string& where) {
  if (py::isinstance<py::dict>(step)) return FromPython(step, where);
  if (!PySequence_Check(step.ptr()) || IsText(step) ||
      (py::len(step) != 2 && py::len(step) != 3)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " of the schedule is not an (action, node) pair, an (action, node, bucket) "
        "triple or a dict: ", Shown(step)));
  }
  py::sequence pair = py::reinterpret_borrow<py::sequence>(step);
  ASSIGN_OR_RETURN(nlohmann::json action, StepTextFromPython(pair[0], where, "action"));
  ASSIGN_OR_RETURN(nlohmann::json node, StepTextFromPython(pair[1], where, "node"));
  nlohmann::json out = {{"action", std::move(action)}, {"node", std::move(node)}};
  if (py::len(step) == 3) {
    ASSIGN_OR_RETURN(out["bucket"], FromPython(pair[2], where + ": the bucket"));
  }
  return out;
}

}  // namespace

absl::StatusOr<Schedule> ScheduleFromPython(
    const Graph& graph, py::handle value,
    std::optional<std::chrono::steady_clock::time_point> deadline) {
  if (py::isinstance<py::dict>(value)) {
    ASSIGN_OR_RETURN(const nlohmann::json doc, FromPython(value, "the schedule"));
    return ScheduleFromJson(graph, doc);
  }
  if (!PySequence_Check(value.ptr()) || IsText(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a schedule is a list of (action, node) steps or a pebble-schedule dict, not ",
        Shown(value)));
  }
  // How far reading got: "5 of 9 steps" of a list or tuple, whose length
  // is known; else the count, and the sequence's type, which may never end.
  const bool known_length = PyList_Check(value.ptr()) || PyTuple_Check(value.ptr());
  auto read_so_far = [&value, known_length](size_t k) {
    if (known_length) {
      return absl::StrCat(k, " of its ", py::len(value), " steps read");
    }
    return absl::StrCat(k, " steps read; its ", Py_TYPE(value.ptr())->tp_name,
                        " may never end");
  };
  ScheduleReader reader(graph);
  try {
    for (const py::handle step : value) {
      const size_t k = reader.size();
      if (k == kMaxPythonScheduleSteps) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the schedule has more than ", kMaxPythonScheduleSteps, " steps (",
            read_so_far(k), ")"));
      }
      // (a list's or tuple's clock read once every 4096 steps: a tenth of a
      // microsecond a step; another sequence's at each, beside its
      // __getitem__ in Python)
      if (deadline && (k % 4096 == 4095 || !known_length) &&
          std::chrono::steady_clock::now() > *deadline) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the schedule was not read within the time limit (", read_so_far(k), ")"));
      }
      const std::string where = absl::StrCat("step ", k);
      ASSIGN_OR_RETURN(const nlohmann::json s, StepFromPython(step, where));
      RETURN_IF_ERROR(reader.Add(s));
    }
  } catch (const py::error_already_set& e) {
    const PyError error(e);
    if (!error.IsException()) error.Raise();
    return absl::InvalidArgumentError(absl::StrCat("the schedule: ", error.Describe()));
  }
  return reader.Take();
}

py::list ScheduleToPython(const Graph& graph, const Schedule& schedule) {
  // The JSON's steps, for their bucket numbers.
  const nlohmann::json doc = ScheduleToJson(graph, schedule);
  py::list steps;
  for (const nlohmann::json& s : doc["steps"]) {
    const std::string& action = s["action"].get_ref<const std::string&>();
    const std::string& node = s["node"].get_ref<const std::string&>();
    if (s.contains("bucket")) {
      steps.append(py::make_tuple(action, node, s["bucket"].get<int64_t>()));
    } else {
      steps.append(py::make_tuple(action, node));
    }
  }
  return steps;
}

}  // namespace pebble::python
