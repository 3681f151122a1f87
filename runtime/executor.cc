#include "runtime/executor.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "runtime/cpu/native_util.h"
#include "scheduler/collectives.h"

namespace pebble {

// ---------------------------------------------------------------- dtypes

// ---------------------------------------------------------------- files

std::string TensorFileName(absl::string_view id) {
  std::string name;
  if (id == "." || id == "..") return id == "." ? "%2E.npy" : "%2E%2E.npy";
  for (char c : id) {
    if (c == '%') {
      name += "%25";
    } else if (c == '/') {
      name += "%2F";
    } else {
      name += c;
    }
  }
  return name + ".npy";
}

namespace {

std::string Describe(const Graph& graph, NodeId v) {
  return absl::StrCat(DTypeName(*graph.dtype(v)), ShapeToString(*graph.shape(v)));
}

// Checks that v's tensor fits its slot: shape and dtype known, and
// shape x dtype exactly `bytes`, the size the layout gives it. GraphBuilder
// enforces the equality already; the executor relies on it for every byte a
// kernel or a copy writes, so it checks again rather than trust.
absl::Status CheckTensorSlot(const Graph& graph, NodeId v) {
  if (!graph.shape(v).has_value() || !graph.dtype(v).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", Quote(graph.id(v)), " (op ", Printable(graph.op(v)), ") has no shape or dtype"));
  }
  if (TensorBytes(*graph.shape(v), *graph.dtype(v)) != graph.bytes(v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", Quote(graph.id(v)), ": ", Describe(graph, v), " does not fill its ",
        graph.bytes(v), " bytes"));
  }
  return absl::OkStatus();
}

// The ops an alias may have: those whose output is the input's bytes in the
// same order (a contiguous reshape). The backends keep every tensor
// contiguous, without strides, so a transpose, a slice or an expand cannot
// be a view of its base's memory.
bool IsContiguousViewOp(absl::string_view op) {
  return op == "reshape" || op == "flatten" || op == "squeeze" || op == "unsqueeze" ||
         op == "identity" || op == "view";
}

// An alias runs as its storage's memory with its own shape: its op must be
// a contiguous view and its bytes and dtype its storage root's.
absl::Status CheckView(const Graph& graph, NodeId v) {
  const NodeId root = graph.storage(v);
  const std::string where =
      absl::StrCat("node ", Quote(graph.id(v)), " (op ", Printable(graph.op(v)), ", an alias of ",
                   Quote(graph.id(graph.alias_of(v))), ")");
  if (!IsContiguousViewOp(graph.op(v))) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the executor runs a view only as a contiguous reshape (reshape, flatten, "
               "squeeze, unsqueeze, identity, view); tensors have no strides"));
  }
  if (graph.bytes(v) != graph.bytes(root) || graph.dtype(v) != graph.dtype(root)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is ", Describe(graph, v), " (", graph.bytes(v), " bytes) but its storage ",
        Quote(graph.id(root)), " is ", Describe(graph, root), " (", graph.bytes(root),
        " bytes): a view must hold its storage's bytes"));
  }
  return absl::OkStatus();
}

// An in-place update writes its storage whole: it must have the storage's
// shape, dtype and bytes.
absl::Status CheckInPlace(const Graph& graph, NodeId v) {
  const NodeId root = graph.storage(v);
  if (graph.shape(v) == graph.shape(root) && graph.dtype(v) == graph.dtype(root) &&
      graph.bytes(v) == graph.bytes(root)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "in-place node ", Quote(graph.id(v)), " is ", Describe(graph, v), " (", graph.bytes(v),
      " bytes) but the storage it writes, ", Quote(graph.id(root)), ", is ",
      Describe(graph, root), " (", graph.bytes(root), " bytes)"));
}

// The kernels a host compute may run: the CPU backend's own optimizer
// updates (the same arithmetic as every backend's, runtime/optimizer_math.h).
const KernelTable& HostKernels() {
  static const KernelTable* const table = [] {
    auto* t = new KernelTable;
    native::RegisterNativeOptimizerKernels(*t);
    return t;
  }();
  return *table;
}

bool IsFloat(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

// `count` elements of `dtype` (fp32, fp16 or bf16) at `data` as float32,
// each divided by `divisor`, into out[0, count).
void WidenToFloat(std::byte* data, DType dtype, int64_t count, float divisor, float* out) {
  const TensorView view{data, Shape{count}, dtype};
  for (int64_t i = 0; i < count; ++i) out[i] = native::LoadAsFloat(view, i) / divisor;
}

// in[0, count) rounded to `dtype` (fp32, fp16 or bf16) at `data`.
void NarrowFromFloat(const float* in, int64_t count, DType dtype, std::byte* data) {
  const TensorView view{data, Shape{count}, dtype};
  for (int64_t i = 0; i < count; ++i) native::StoreFloat(view, i, in[i]);
}

// A collective node of a sharded graph (ShardGraph) that the executor can
// run: an all_gather or a reduce_scatter of floating-point tensors, sharded
// for as many ranks as `collectives` has, or an all_reduce (the sum over
// the ranks) of one into a tensor of its shape.
absl::Status CheckCollective(const Graph& graph, NodeId v, const Collectives* collectives) {
  const std::string who = absl::StrCat("node ", Quote(graph.id(v)), " (", graph.op(v), ")");
  if (collectives == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " is a collective: a sharded plan runs on several ranks; give them (pebble run "
        "--ranks N --shard full --rank R --rendezvous DIR; docs/runtime.md, \"Several ranks\")"));
  }
  if (graph.op(v) != "all_gather" && graph.op(v) != "reduce_scatter" &&
      graph.op(v) != "all_reduce") {
    return absl::UnimplementedError(absl::StrCat(
        who, ": the C++ runtime runs the collectives all_gather, reduce_scatter and "
        "all_reduce only"));
  }
  const nlohmann::json& attrs = graph.attrs(v);
  const auto ranks = attrs.find("ranks");
  if (ranks == attrs.end() || !ranks->is_number_integer() ||
      ranks->get<int64_t>() != collectives->ranks()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " is sharded for ", ranks == attrs.end() ? std::string("an unknown number of")
                                                      : ranks->dump(),
        " ranks, but the run has ", collectives->ranks()));
  }
  if (graph.inputs(v).size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": a collective reads one tensor"));
  }
  const NodeId in = graph.inputs(v)[0];
  const DType dtype = graph.dtype(v).value_or(DType::kInt64);
  if (graph.dtype(in) != dtype || !IsFloat(dtype)) {
    return absl::UnimplementedError(absl::StrCat(
        who, ": the C++ runtime's collectives take a floating-point tensor and make one of "
        "its dtype"));
  }
  if (graph.op(v) == "all_reduce") {
    if (graph.shape(v) != graph.shape(in)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": an all_reduce makes a tensor of its input's shape"));
    }
    return absl::OkStatus();
  }
  // ShardGraph's shards: ceil(numel / ranks) elements of the whole tensor.
  const bool gather = graph.op(v) == "all_gather";
  const int64_t whole = NumElements(*graph.shape(gather ? v : in));
  const int64_t shard = NumElements(*graph.shape(gather ? in : v));
  const int64_t ranks_here = collectives->ranks();
  if (shard != (whole + ranks_here - 1) / ranks_here) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": a shard of ", shard, " elements is not 1/", ranks_here, " of ", whole));
  }
  return absl::OkStatus();
}

// An all_reduce step of `v` that the executor can run: with ranks, of a
// floating-point tensor.
absl::Status CheckAllReduce(const Graph& graph, NodeId v, const Collectives* collectives) {
  const std::string who = absl::StrCat("step all_reduce ", Quote(graph.id(v)));
  if (collectives == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": a data-parallel plan runs on several ranks; give them (pebble run --ranks N "
        "--rank R --rendezvous DIR; docs/runtime.md, \"Several ranks\")"));
  }
  const DType dtype = *graph.dtype(v);  // CheckTensorSlot
  if (!IsFloat(dtype)) {
    return absl::UnimplementedError(absl::StrCat(
        who, ": a ", DTypeName(dtype), " tensor; the ranks average floating-point gradients "
        "only"));
  }
  return absl::OkStatus();
}

// The executor's views start where their storage does (CheckView), so two
// all-reduces of one storage's value would average its first bytes twice
// (the simulator takes sibling views for disjoint parts): refused.
absl::Status CheckOneAllReducePerValue(const Graph& graph, const Schedule& schedule) {
  std::vector<int> reduced_by(graph.num_nodes(), -1);  // storage -> the step that reduced it
  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    const Step& step = schedule.steps[k];
    const NodeId root = graph.storage(step.node);
    if (step.action == Action::kCompute && (step.node == root || graph.in_place(step.node))) {
      reduced_by[root] = -1;  // a new value
    } else if (step.action == Action::kAllReduce) {
      if (reduced_by[root] >= 0) {
        return absl::UnimplementedError(absl::StrCat(
            "steps ", reduced_by[root], " and ", k, " all-reduce two views of one storage, ",
            Quote(graph.id(root)), ": the C++ runtime's views all start at their storage's "
            "first byte, so it would average it twice"));
      }
      reduced_by[root] = static_cast<int>(k);
    }
  }
  return absl::OkStatus();
}

// Phases 1-2 of Execute: refuses what cannot run, before touching the
// backend's memory. Every tensor the schedule touches must fit its slot and
// be what its operator makes, and the backend must have every kernel.
absl::Status CheckRunnable(const Graph& graph, const Schedule& schedule, const Backend& backend,
                           const Collectives* collectives) {
  // The schedule's nodes (a valid schedule computes every non-persistent
  // input before reading it) and every persistent one, each checked once.
  std::vector<uint8_t> touched(graph.num_nodes(), 0);
  for (NodeId v = 0; v < graph.num_nodes(); ++v) touched[v] = graph.persistent(v);
  for (const Step& step : schedule.steps) touched[step.node] = 1;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (touched[v] && graph.collective(v)) RETURN_IF_ERROR(CheckCollective(graph, v, collectives));
    if (touched[v]) RETURN_IF_ERROR(CheckTensorSlot(graph, v));
  }
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (!touched[v] || !graph.is_alias(v)) continue;
    RETURN_IF_ERROR(graph.in_place(v) ? CheckInPlace(graph, v) : CheckView(graph, v));
  }
  RETURN_IF_ERROR(backend.CheckSupported(graph));
  RETURN_IF_ERROR(CheckOneAllReducePerValue(graph, schedule));
  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    const Step& step = schedule.steps[k];
    if (std::string e = BucketJoinError(graph, schedule, k); !e.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", k, ": ", e));
    }
    if (step.action == Action::kAllReduce) {
      RETURN_IF_ERROR(CheckAllReduce(graph, step.node, collectives));
    }
    if (step.action == Action::kHostCompute &&
        HostKernels().Find(graph.op(step.node)) == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          "node ", Quote(graph.id(step.node)), ": op ", Quote(graph.op(step.node)),
          " has no host kernel (only the optimizer's updates run on the host)"));
    }
  }
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (touched[v] && !graph.persistent(v)) RETURN_IF_ERROR(CheckOperatorTypes(graph, v));
  }
  return absl::OkStatus();
}

// FNV-1a's rule over 8-byte words (a parameter's megabytes hash in
// milliseconds): the same in every process, where absl::Hash is seeded per
// process, for the ranks to compare.
class Fnv1a {
 public:
  void Bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      h_ = (h_ ^ word) * 1099511628211ull;
    }
    for (; i < n; ++i) h_ = (h_ ^ p[i]) * 1099511628211ull;
  }
  void Int(int64_t x) { Bytes(&x, sizeof x); }
  void Text(absl::string_view text) {
    Int(static_cast<int64_t>(text.size()));
    Bytes(text.data(), text.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ull;
};

// What the ranks of a run must share: every node's id, op, inputs, attrs
// (an optimizer's learning rate), bytes, shape, dtype, role, aliasing and
// home; the steps; the seed.
uint64_t RunFingerprint(const Graph& graph, const Schedule& schedule, uint64_t seed) {
  Fnv1a h;
  h.Int(graph.num_nodes());
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    h.Text(graph.id(v));
    h.Text(graph.op(v));
    h.Int(static_cast<int64_t>(graph.inputs(v).size()));
    for (NodeId u : graph.inputs(v)) h.Int(u);
    h.Text(graph.attrs(v).dump());
    h.Int(graph.bytes(v));
    h.Text(graph.shape(v).has_value() ? ShapeToString(*graph.shape(v)) : "?");
    h.Int(graph.dtype(v).has_value() ? static_cast<int64_t>(*graph.dtype(v)) : -1);
    h.Int(static_cast<int64_t>(graph.role(v)));
    h.Int(graph.alias_of(v));
    h.Int(graph.in_place(v));
    h.Int(graph.persistent(v));
    h.Int(graph.home(v).has_value() ? static_cast<int64_t>(*graph.home(v)) : -1);
  }
  h.Int(static_cast<int64_t>(schedule.steps.size()));
  for (const Step& step : schedule.steps) {
    h.Int(static_cast<int64_t>(step.action));
    h.Int(step.node);
    h.Int(step.joins_bucket);
  }
  h.Int(static_cast<int64_t>(seed));
  return h.value();
}

}  // namespace

absl::Status CheckOperatorTypes(const Graph& graph, NodeId v) {
  const OpDef* def = FindOp(graph.op(v));
  if (def == nullptr || def->infer == nullptr) return absl::OkStatus();
  const int num_inputs = static_cast<int>(graph.inputs(v).size());
  if (num_inputs < def->min_inputs || (def->max_inputs >= 0 && num_inputs > def->max_inputs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", Quote(graph.id(v)), " (op ", def->name, ") has ", num_inputs, " inputs"));
  }
  std::vector<TensorType> inputs;
  for (NodeId u : graph.inputs(v)) inputs.push_back({*graph.shape(u), *graph.dtype(u)});
  absl::StatusOr<TensorType> inferred;
  try {
    inferred = def->infer(inputs, graph.attrs(v));
  } catch (const std::exception& e) {  // attrs of the wrong JSON type
    inferred = absl::InvalidArgumentError(Printable(e.what(), 200));
  }
  if (!inferred.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", Quote(graph.id(v)), " (op ",
                                                   def->name, "): ", inferred.status().message()));
  }
  if (inferred->shape != *graph.shape(v) || inferred->dtype != *graph.dtype(v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", Quote(graph.id(v)), " (op ", def->name, ") is ", Describe(graph, v),
        " but its inputs and attrs make ", DTypeName(inferred->dtype),
        ShapeToString(inferred->shape)));
  }
  return absl::OkStatus();
}

namespace {

// A float32 array as bfloat16 (a bf16 node reads an fp32 file), and back
// (downloaded bf16 outputs are read as float).
void NarrowToBFloat16(NpyArray& array) {
  const int64_t n = NumElements(array.shape);
  std::vector<uint8_t> narrow(static_cast<size_t>(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, array.data.data() + 4 * i, 4);
    const uint16_t b = FloatToBFloat16(x);
    std::memcpy(narrow.data() + 2 * i, &b, 2);
  }
  array.dtype = DType::kBFloat16;
  array.data = std::move(narrow);
}

void WidenBFloat16(NpyArray& array) {
  const int64_t n = NumElements(array.shape);
  std::vector<uint8_t> wide(static_cast<size_t>(4 * n));
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, array.data.data() + 2 * i, 2);
    const float x = BFloat16ToFloat(b);
    std::memcpy(wide.data() + 4 * i, &x, 4);
  }
  array.dtype = DType::kFloat32;
  array.data = std::move(wide);
}

}  // namespace

absl::StatusOr<std::optional<NpyArray>> ReadInputFile(const Graph& graph, NodeId v,
                                                      const std::string& dir) {
  RETURN_IF_ERROR(CheckTensorSlot(graph, v));
  const std::string path = (std::filesystem::path(dir) / TensorFileName(graph.id(v))).string();
  std::error_code ec;
  const std::filesystem::file_status link = std::filesystem::symlink_status(path, ec);
  if (!std::filesystem::exists(link)) return std::optional<NpyArray>();
  if (std::filesystem::is_symlink(link) && !std::filesystem::exists(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("input for node ", Quote(graph.id(v)), ": ",
                                                   Quote(path),
                                                   " is a symbolic link to a missing file"));
  }
  // ReadNpy reads the whole file: bound it first by what the node holds
  // (twice that for an fp32 file of a bf16 node) and a generous header.
  constexpr uint64_t kHeaderSlack = uint64_t{1} << 20;
  const uint64_t most = static_cast<uint64_t>(graph.bytes(v)) *
                            (*graph.dtype(v) == DType::kBFloat16 ? 2 : 1) + kHeaderSlack;
  if (const uintmax_t size = std::filesystem::file_size(path, ec); !ec && size > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input for node '", graph.id(v), "': ", Quote(path), " is ", size,
        " bytes, more than the node's ", graph.bytes(v), " bytes and an .npy header"));
  }
  auto read = ReadNpy(path);
  if (!read.ok()) {
    return absl::Status(read.status().code(),
                        absl::StrCat("input for node '", graph.id(v), "': ",
                                     read.status().message()));
  }
  NpyArray array = *std::move(read);
  const DType want = *graph.dtype(v);
  const Shape& shape = *graph.shape(v);
  const bool bf16_from_fp32 = want == DType::kBFloat16 && array.dtype == DType::kFloat32;
  if ((array.dtype != want && !bf16_from_fp32) || array.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input file '", path, "' holds ", DTypeName(array.dtype), ShapeToString(array.shape),
        " but node '", graph.id(v), "' is ", Describe(graph, v),
        want == DType::kBFloat16 ? " (a bf16 node takes an fp32 or bf16 file)" : ""));
  }
  if (bf16_from_fp32) NarrowToBFloat16(array);
  return std::optional<NpyArray>(std::move(array));
}

absl::Status CheckInputsDirectory(const Graph& graph, const std::string& dir) {
  namespace fs = std::filesystem;
  std::map<std::string, NodeId> by_file;  // TensorFileName(id) -> node
  for (NodeId v = 0; v < graph.num_nodes(); ++v) by_file.emplace(TensorFileName(graph.id(v)), v);
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot list inputs directory ", Quote(dir), ": ", ec.message()));
  }
  // Sorted, so that the first offending file named is the same everywhere.
  std::vector<fs::path> entries;
  for (; it != fs::directory_iterator(); it.increment(ec)) entries.push_back(it->path());
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot list inputs directory ", Quote(dir), ": ", ec.message()));
  }
  std::sort(entries.begin(), entries.end());
  for (const fs::path& entry : entries) {
    const std::string name = entry.filename().string();
    if (name.size() < 4) continue;
    const std::string extension = name.substr(name.size() - 4);
    if (absl::AsciiStrToLower(extension) != ".npy") continue;
    const std::string shown = Quote(entry.string());
    if (extension != ".npy") {
      return absl::InvalidArgumentError(absl::StrCat(
          "input file ", shown, ": the extension must be '.npy' in lower case to be read"));
    }
    const auto found = by_file.find(name);
    if (found == by_file.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input file ", shown, " names no node of the graph (files are <id>.npy for a "
          "persistent node: a parameter, buffer or data input)"));
    }
    if (!graph.persistent(found->second)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input file ", shown, " is for node ", Quote(graph.id(found->second)),
          ", which the step computes: only persistent tensors are read"));
    }
    const fs::file_status link = fs::symlink_status(entry, ec);
    if (fs::is_symlink(link) && !fs::exists(entry, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("input file ", shown, " is a symbolic link to a missing file"));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- generator

namespace {

// SplitMix64 (Steele, Lea and Flood 2014): a fast generator whose output is
// fixed by its seed on every platform (std:: distributions are not).
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits: exact in fp32.
  float Unit() { return static_cast<float>(Next() >> 40) * 0x1p-24f; }
};

// FNV-1a of the node id: the stream of each tensor depends on (seed, id).
uint64_t HashId(absl::string_view id) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : id) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

int64_t FanIn(const Shape& shape) {
  int64_t fan_in = 1;
  for (size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
  return std::max<int64_t>(fan_in, 1);
}

// Operand positions of v among r's inputs.
std::vector<int> OperandIndices(const Graph& graph, NodeId r, NodeId v) {
  std::vector<int> at;
  auto inputs = graph.inputs(r);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == v) at.push_back(static_cast<int>(i));
  }
  return at;
}

// How float parameter/data values of v are drawn: constant, or uniform in
// [-bound, bound).
// A generated float tensor: `value` everywhere when constant, else uniform
// in [offset - bound, offset + bound).
struct FloatRule {
  bool constant = false;
  float value = 0;
  float bound = 1;
  float offset = 0;
};

FloatRule FloatRuleOf(const Graph& graph, NodeId v) {
  const Shape& shape = *graph.shape(v);
  switch (graph.role(v)) {
    case Role::kOptimizerState:  // zeros, as torch.optim starts
      return {true, 0.0f, 0};
    case Role::kBuffer: {
      const std::string& id = graph.id(v);
      const absl::string_view suffix = "running_var";
      const bool var = id.size() >= suffix.size() &&
                       absl::string_view(id).substr(id.size() - suffix.size()) == suffix;
      return {true, var ? 1.0f : 0.0f, 0};
    }
    case Role::kParameter: {
      if (shape.size() >= 2) {
        return {false, 0, 1.0f / std::sqrt(static_cast<float>(FanIn(shape)))};
      }
      for (NodeId r : graph.readers(v)) {  // ascending: first reader decides
        const std::string& op = graph.op(r);
        for (int i : OperandIndices(graph, r, v)) {
          if (op == "batchnorm" || op == "layernorm") {
            if (i == 2) return {true, 1.0f, 0};
            if (i == 3) return {true, 0.0f, 0};
          }
          const bool biased = op == "conv2d" || op == "conv3d" || op == "linear";
          if (biased && i == 2) {
            const NodeId w = graph.inputs(r)[1];
            if (graph.shape(w).has_value()) {
              return {false, 0, 1.0f / std::sqrt(static_cast<float>(FanIn(*graph.shape(w))))};
            }
          }
        }
      }
      return {};
    }
    default:
      for (NodeId r : graph.readers(v)) {
        // bce_with_logits' target: probabilities in [0, 1).
        for (int i : OperandIndices(graph, r, v)) {
          if (graph.op(r) == "bce_with_logits" && i == 1) return {false, 0, 0.5f, 0.5f};
        }
      }
      return {};
  }
}

// The exclusive upper bound of an i64 tensor's values (0: all zeros).
int64_t IndexRangeOf(const Graph& graph, NodeId v) {
  const Shape& shape = *graph.shape(v);
  for (NodeId r : graph.readers(v)) {
    const std::string& op = graph.op(r);
    for (int i : OperandIndices(graph, r, v)) {
      if (op == "softmax_cross_entropy" && i == 1) {
        const NodeId logits = graph.inputs(r)[0];
        if (!graph.shape(logits).has_value()) continue;
        const Shape& ls = *graph.shape(logits);
        const int rank = static_cast<int>(ls.size());
        int axis = -1;
        const nlohmann::json& attrs = graph.attrs(r);
        if (attrs.is_object() && attrs.contains("axis") && attrs["axis"].is_number_integer()) {
          axis = attrs["axis"].get<int>();
          if (axis < 0) axis += rank;
        } else {
          // docs/operators.md: 1 when the target is the logits without
          // dim 1, else the last.
          Shape without1 = ls;
          if (rank >= 2) without1.erase(without1.begin() + 1);
          axis = rank >= 2 && without1 == shape ? 1 : rank - 1;
        }
        if (axis >= 0 && axis < rank) return ls[axis];
      }
      // A reader the schedule never runs is not checked against the
      // operator table (CheckRunnable): its input count may be anything.
      if (op == "embedding" && i == 0 && graph.inputs(r).size() >= 2) {
        const NodeId weight = graph.inputs(r)[1];
        if (graph.shape(weight).has_value() && !graph.shape(weight)->empty()) {
          return (*graph.shape(weight))[0];
        }
      }
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<NpyArray> GenerateShard(const Graph& unsharded, NodeId v, uint64_t seed,
                                       int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", ranks));
  }
  ASSIGN_OR_RETURN(NpyArray whole, GenerateInput(unsharded, v, seed));
  const int64_t numel = NumElements(whole.shape);
  const int64_t item = DTypeSize(whole.dtype);
  const int64_t shard = (numel + ranks - 1) / ranks;
  const int64_t begin = std::min(numel, shard * rank);
  const int64_t end = std::min(numel, begin + shard);
  NpyArray out;
  out.shape = {shard};
  out.dtype = whole.dtype;
  out.data.assign(static_cast<size_t>(shard * item), 0);  // the padding: zeros
  std::memcpy(out.data.data(), whole.data.data() + begin * item,
              static_cast<size_t>((end - begin) * item));
  return out;
}

absl::StatusOr<NpyArray> GenerateInput(const Graph& graph, NodeId v, uint64_t seed) {
  RETURN_IF_ERROR(CheckTensorSlot(graph, v));
  NpyArray array;
  array.shape = *graph.shape(v);
  array.dtype = *graph.dtype(v);
  const int64_t n = NumElements(array.shape);
  array.data.resize(static_cast<size_t>(n * DTypeSize(array.dtype)));
  SplitMix64 rng{seed ^ HashId(graph.id(v))};
  uint8_t* out = array.data.data();
  if (IsFloat(array.dtype)) {
    const FloatRule rule = FloatRuleOf(graph, v);
    for (int64_t i = 0; i < n; ++i) {
      const float x =
          rule.constant ? rule.value : rule.offset + (2.0f * rng.Unit() - 1.0f) * rule.bound;
      switch (array.dtype) {
        case DType::kFloat32:
          std::memcpy(out + 4 * i, &x, 4);
          break;
        case DType::kFloat16: {
          const uint16_t h = FloatToHalf(x);
          std::memcpy(out + 2 * i, &h, 2);
          break;
        }
        default: {
          const uint16_t b = FloatToBFloat16(x);
          std::memcpy(out + 2 * i, &b, 2);
          break;
        }
      }
    }
  } else if (array.dtype == DType::kInt64) {
    const int64_t range = IndexRangeOf(graph, v);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t x =
          range > 0 ? static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(range)) : 0;
      std::memcpy(out + 8 * i, &x, 8);
    }
  } else {  // u8 masks
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(rng.Next() >> 63);
  }
  return array;
}

// ---------------------------------------------------------------- executor

const HostTensor* ExecutionResult::FindOutput(const Graph& graph, absl::string_view id) const {
  const NodeId v = graph.Find(id);
  if (v == kNoNode) return nullptr;
  for (const HostTensor& t : outputs) {
    if (t.node == v) return &t;
  }
  return nullptr;
}

std::optional<double> ExecutionResult::ScalarOutput(const Graph& graph,
                                                    absl::string_view id) const {
  const HostTensor* t = FindOutput(graph, id);
  if (t == nullptr || NumElements(t->array.shape) != 1) return std::nullopt;
  switch (t->array.dtype) {
    case DType::kFloat32: {
      float x;
      std::memcpy(&x, t->array.data.data(), 4);
      return x;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, t->array.data.data(), 2);
      return HalfToFloat(h);
    }
    default:
      return std::nullopt;
  }
}

namespace {

// Frees backend memory on every exit path.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& backend, std::byte* ptr, bool host)
      : backend_(backend), ptr_(ptr), host_(host) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : backend_(other.backend_), ptr_(other.ptr_), host_(other.host_) {
    other.ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ == nullptr) return;
    if (host_) {
      backend_.FreeHost(ptr_);
    } else {
      backend_.FreeDevice(ptr_);
    }
  }
  std::byte* get() const { return ptr_; }

 private:
  Backend& backend_;
  std::byte* ptr_;
  bool host_;
};

// An event and its place in its stream's order (events of one stream
// complete in the order they were recorded, so waiting for the latest one
// covers the earlier ones).
struct StreamEvent {
  EventId id = -1;
  Stream stream = Stream::kCompute;
  int64_t seq = -1;  // position on its stream; -1: none (ready at time 0)
  bool valid() const { return seq >= 0; }
};

// The Record/Wait bookkeeping of SPEC section 4 (see executor.h).
class StreamTracker {
 public:
  explicit StreamTracker(Backend& backend) : backend_(backend) {}

  absl::StatusOr<StreamEvent> Record(Stream s) {
    ASSIGN_OR_RETURN(EventId id, backend_.Record(s));
    return StreamEvent{id, s, next_seq_[Index(s)]++};
  }

  // Later work on `s` waits for `e` (nothing when e is on s itself, or is
  // older than an event s already waits for).
  absl::Status Wait(Stream s, const StreamEvent& e) {
    if (!e.valid() || e.stream == s) return absl::OkStatus();
    int64_t& waited = waited_[Index(s)];
    if (e.seq <= waited) return absl::OkStatus();
    RETURN_IF_ERROR(backend_.Wait(s, e.id));
    waited = e.seq;
    return absl::OkStatus();
  }

 private:
  static int Index(Stream s) { return s == Stream::kCompute ? 0 : 1; }
  Backend& backend_;
  int64_t next_seq_[2] = {0, 0};
  int64_t waited_[2] = {-1, -1};  // latest seq of the other stream waited for
};

// The later of two events of the same stream.
StreamEvent Later(const StreamEvent& a, const StreamEvent& b) {
  if (!a.valid()) return b;
  if (!b.valid()) return a;
  PEBBLE_CHECK(a.stream == b.stream);
  return a.seq >= b.seq ? a : b;
}

std::string StepLabel(const Graph& graph, const Schedule& schedule, int k) {
  const Step& step = schedule.steps[k];
  return absl::StrCat("step ", k, " (", ActionName(step.action), " '", graph.id(step.node),
                      "', op ", graph.op(step.node), ")");
}

absl::Status AtStep(const Graph& graph, const Schedule& schedule, int k,
                    const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(StepLabel(graph, schedule, k), ": ",
                                                  status.message()));
}

using Interval = std::pair<double, double>;  // [start, end], seconds

// Sorted, disjoint intervals covering the same time as `v`.
std::vector<Interval> UnionOf(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> merged;
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!merged.empty() && i.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, i.second);
    } else {
      merged.push_back(i);
    }
  }
  return merged;
}

// The seconds that some interval of `v` covers.
double CoveredSeconds(std::vector<Interval> v) {
  double covered = 0;
  for (const Interval& i : UnionOf(std::move(v))) covered += i.second - i.first;
  return covered;
}

// One thread that runs tasks in the order they are given (the collectives
// of Note [Collectives in flight]: every rank must call them in the same
// order). Destroying it drops the tasks not started yet (their futures
// report a broken promise; nobody waits for them after a failed run) and
// waits for the one running.
class TaskThread {
 public:
  TaskThread() : thread_([this] { Loop(); }) {}
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;
  ~TaskThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.clear();
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  std::future<absl::Status> Run(std::function<absl::Status()> task) {
    std::packaged_task<absl::Status()> packaged(std::move(task));
    std::future<absl::Status> done = packaged.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(packaged));
    }
    wake_.notify_one();
    return done;
  }

 private:
  void Loop() {
    for (;;) {
      std::packaged_task<absl::Status()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopped
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // the task, and what it holds, ends here
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<absl::Status()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace

double CopyComputeOverlapSeconds(const std::vector<StepMeasurement>& steps) {
  std::vector<Interval> compute, copy;
  for (const StepMeasurement& m : steps) {
    if (m.action == Action::kCompute) compute.emplace_back(m.start_s, m.end_s);
    if (m.action == Action::kOffload || m.action == Action::kPrefetch) {
      copy.emplace_back(m.start_s, m.end_s);
    }
  }
  const std::vector<Interval> a = UnionOf(std::move(compute)), b = UnionOf(std::move(copy));
  double overlap = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const double start = std::max(a[i].first, b[j].first);
    const double end = std::min(a[i].second, b[j].second);
    overlap += std::max(0.0, end - start);
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return overlap;
}

namespace {

// The layout's instances by what creates them.
struct InstanceIndex {
  std::vector<int32_t> persistent;      // node -> its instance, or -1
  std::vector<int32_t> step_output;     // step -> the instance it creates, or -1
  std::vector<int32_t> step_workspace;  // step -> its workspace instance, or -1
};

InstanceIndex IndexInstances(const Graph& graph, const MemoryLayout& layout, int num_steps) {
  InstanceIndex index;
  index.persistent.assign(graph.num_nodes(), -1);
  index.step_output.assign(num_steps, -1);
  index.step_workspace.assign(num_steps, -1);
  for (size_t i = 0; i < layout.instances.size(); ++i) {
    const TensorInstance& inst = layout.instances[i];
    const auto instance = static_cast<int32_t>(i);
    // A persistent tensor's instance from the start (one whose home is the
    // host has none; a later one, after a prefetch, is that step's).
    const bool from_start = graph.persistent(inst.node) && !inst.workspace &&
                            graph.home(inst.node) != Tier::kHost && inst.first_step == 0;
    if (from_start) {
      index.persistent[inst.node] = instance;
    } else if (inst.workspace) {
      index.step_workspace[inst.first_step] = instance;
    } else {
      index.step_output[inst.first_step] = instance;
    }
  }
  return index;
}

// One run of a checked schedule on a backend, phase by phase (Execute calls
// them in order): the arena, the persistent tensors, the host buffers, the
// steps, their times, the outputs. Holds the executor-side state of every
// tensor, kept apart from the simulator's, and fills `result`.
class ScheduleRun {
 public:
  ScheduleRun(const Graph& graph, const Schedule& schedule, Backend& backend,
              Collectives* collectives, ExecutionResult& result)
      : graph_(graph),
        schedule_(schedule),
        backend_(backend),
        collectives_(collectives),
        result_(result),
        layout_(result.layout),
        num_steps_(static_cast<int>(schedule.steps.size())),
        instances_(IndexInstances(graph, result.layout, num_steps_)),
        streams_(backend),
        current_(graph.num_nodes(), -1),
        holders_(graph.num_nodes(), 0),
        host_index_(graph.num_nodes(), -1),
        host_counted_(graph.num_nodes(), 0),
        ready_(graph.num_nodes()),
        last_compute_use_(graph.num_nodes()),
        last_copy_use_(graph.num_nodes()),
        events_(num_steps_) {}

  // 3. One arena, once; poisoned (0xFF) on request.
  absl::Status AllocateArena(bool poison) {
    const int64_t device_before = backend_.MemoryStats().device_bytes_in_use;
    ASSIGN_OR_RETURN(std::byte * arena, backend_.AllocateDevice(layout_.arena_bytes));
    result_.arena_bytes = backend_.MemoryStats().device_bytes_in_use - device_before;
    arena_.emplace(backend_, arena, /*host=*/false);
    if (poison) RETURN_IF_ERROR(backend_.Fill(arena_->get(), 0xFF, layout_.arena_bytes));
    return absl::OkStatus();
  }

  // 4. Every persistent tensor, read from `inputs_dir` or generated.
  absl::Status LoadPersistent(const ExecutorOptions& options) {
    if (options.unsharded != nullptr) sharded_ = ShardedTensors(*options.unsharded);
    for (NodeId v = 0; v < graph_.num_nodes(); ++v) {
      if (!graph_.persistent(v)) continue;
      const int32_t instance = instances_.persistent[v];
      PEBBLE_CHECK(instance >= 0 || graph_.home(v) == Tier::kHost,
                   "persistent node without an instance");
      std::optional<NpyArray> array;
      if (!options.inputs_dir.empty()) {
        ASSIGN_OR_RETURN(array, ReadInputFile(graph_, v, options.inputs_dir));
      }
      if (array.has_value()) {
        result_.loaded_inputs.push_back(v);
      } else {
        ASSIGN_OR_RETURN(array, Generate(v, options));
        result_.generated_inputs.push_back(v);
      }
      if (graph_.role(v) != Role::kInput && UnshardedOf(v, options) == kNoNode) {
        replicated_.Text(graph_.id(v));
        replicated_.Bytes(array->data.data(), array->data.size());
      }
      if (static_cast<int64_t>(array->data.size()) != graph_.bytes(v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "persistent node ", Quote(graph_.id(v)), ": ", array->data.size(),
            " bytes of data for a ", graph_.bytes(v), "-byte slot"));
      }
      if (graph_.home(v) == Tier::kHost) {  // starts in its host buffer
        RETURN_IF_ERROR(AllocateHostBuffer(v));
        std::memcpy(host_buffers_[host_index_[v]].get(), array->data.data(),
                    array->data.size());
        host_counted_[v] = 1;
        host_held_ += graph_.bytes(v);
        continue;
      }
      RETURN_IF_ERROR(backend_.Upload(Address(instance), array->data.data(), graph_.bytes(v)));
      current_[v] = instance;
      holders_[v] = 1;
    }
    return absl::OkStatus();
  }

  // Persistent tensor v as generated: each rank its own batch (seed + rank),
  // the same parameters and state everywhere, a shard as its rank's slice
  // of the unsharded tensor.
  absl::StatusOr<NpyArray> Generate(NodeId v, const ExecutorOptions& options) const {
    const Collectives* ranks = options.collectives;
    if (ranks == nullptr) return GenerateInput(graph_, v, options.seed);
    if (graph_.role(v) == Role::kInput) {
      return GenerateInput(graph_, v, options.seed + static_cast<uint64_t>(ranks->rank()));
    }
    if (const NodeId whole = UnshardedOf(v, options); whole != kNoNode) {
      return GenerateShard(*options.unsharded, whole, options.seed, ranks->rank(),
                           ranks->ranks());
    }
    return GenerateInput(graph_, v, options.seed);
  }

  // The tensor of options.unsharded that persistent v is a shard of
  // (ShardedTensors), or kNoNode.
  NodeId UnshardedOf(NodeId v, const ExecutorOptions& options) const {
    if (options.unsharded == nullptr) return kNoNode;
    const NodeId whole = options.unsharded->Find(graph_.id(v));
    return whole != kNoNode && sharded_[whole] ? whole : kNoNode;
  }

  // The persistent tensors every rank holds alike (all but the batch and the
  // shards), as loaded: for the ranks to compare.
  uint64_t ReplicatedFingerprint() const { return replicated_.value(); }

  // 5a. Host buffers (pinned on CUDA) for every offloaded tensor, before the
  // timed steps: a pinned allocation is slow and may serialise the device,
  // which would hide the overlap the plan assumes. They count as held from
  // their first offload on, as H grows in SPEC section 2.
  absl::Status AllocateHostBuffers() {
    for (const Step& step : schedule_.steps) {
      const NodeId v = step.node;
      if (step.action != Action::kOffload || host_index_[v] >= 0) continue;
      RETURN_IF_ERROR(AllocateHostBuffer(v));
    }
    return absl::OkStatus();
  }

  // 5b. The steps, enqueued on the two streams, with the bytes held.
  absl::Status RunSteps() {
    backend_.ResetEvents();
    ASSIGN_OR_RETURN(origin_, streams_.Record(Stream::kCompute));
    held_ = graph_.persistent_bytes();  // the device-resident ones
    result_.peak_bytes = held_;
    result_.host_peak_bytes = host_held_;
    result_.peak_step = -1;
    result_.steps.resize(num_steps_);
    in_flight_storage_.assign(graph_.num_nodes(), 0);
    for (int k = 0; k < num_steps_; ++k) {
      RETURN_IF_ERROR(SettleFor(k));
      const Step& step = schedule_.steps[k];
      StepMeasurement& m = result_.steps[k];
      m.action = step.action;
      m.node = step.node;
      int64_t during = 0;  // bytes held while the step runs
      switch (step.action) {
        case Action::kCompute: {
          ASSIGN_OR_RETURN(during, RunCompute(k));
          break;
        }
        case Action::kOffload: {
          ASSIGN_OR_RETURN(during, RunOffload(k));
          break;
        }
        case Action::kPrefetch: {
          ASSIGN_OR_RETURN(during, RunPrefetch(k));
          break;
        }
        case Action::kFree:
          during = RunFree(k);
          break;
        case Action::kHostCompute: {
          ASSIGN_OR_RETURN(during, RunOnHost(k));
          break;
        }
        case Action::kAllReduce: {
          ASSIGN_OR_RETURN(during, RunAllReduce(k));
          break;
        }
      }
      m.resident_bytes = held_;
      m.during_bytes = during;
      m.host_bytes = host_held_;
      if (during > result_.peak_bytes) {
        result_.peak_bytes = during;
        result_.peak_step = k;
      }
      result_.host_peak_bytes = std::max(result_.host_peak_bytes, host_held_);
    }
    RETURN_IF_ERROR(SettleFor(num_steps_));
    return backend_.Synchronize();
  }

  // 5c. Each step's start and end, once every event is complete; the
  // totals of ExecutionResult.
  absl::Status MeasureTimes() {
    auto at = [&](const StreamEvent& e) -> absl::StatusOr<double> {
      if (!e.valid()) return 0.0;
      return backend_.ElapsedSeconds(origin_.id, e.id);
    };
    double last_end = 0;
    // Collectives in flight overlap one another and the compute: their
    // union, and not compute that copies hide behind.
    std::vector<Interval> collectives, busy;
    std::vector<StepMeasurement> besides_collectives;
    for (int k = 0; k < num_steps_; ++k) {
      StepMeasurement& m = result_.steps[k];
      if (m.action == Action::kFree) {
        ASSIGN_OR_RETURN(double a, at(events_[k].start));
        ASSIGN_OR_RETURN(double b, at(events_[k].end));
        m.start_s = m.end_s = std::max(a, b);
      } else {
        ASSIGN_OR_RETURN(m.start_s, at(events_[k].start));
        ASSIGN_OR_RETURN(m.end_s, at(events_[k].end));
        busy.emplace_back(m.start_s, m.end_s);
        const double d = m.end_s - m.start_s;
        const bool collective = m.action == Action::kAllReduce ||
                                (m.action == Action::kCompute && graph_.collective(m.node));
        if (collective) {
          collectives.emplace_back(m.start_s, m.end_s);
        } else if (m.action == Action::kCompute) {
          result_.kernel_time_s += d;
        } else if (m.action == Action::kHostCompute) {
          result_.host_time_s += d;
        } else {
          result_.copy_time_s += d;
        }
        if (!collective) besides_collectives.push_back(m);
      }
      last_end = std::max(last_end, m.end_s);
    }
    result_.time_s = last_end;
    result_.copy_overlap_s = CopyComputeOverlapSeconds(besides_collectives);
    result_.collective_time_s = CoveredSeconds(std::move(collectives));
    result_.overhead_s = std::max(0.0, result_.time_s - CoveredSeconds(std::move(busy)));
    return absl::OkStatus();
  }

  // 6. The graph's outputs and the persistent tensors an update wrote,
  // copied to the host (bfloat16 widened to float32), and the loss when it
  // is a scalar.
  absl::Status DownloadOutputs() {
    for (NodeId v : graph_.outputs()) {
      PEBBLE_CHECK(current_[v] >= 0, "output not resident at the end");
      ASSIGN_OR_RETURN(HostTensor t, Download(v));
      result_.outputs.push_back(std::move(t));
    }
    for (NodeId v : UpdatedStorages(graph_)) {
      ASSIGN_OR_RETURN(HostTensor t, Download(v));
      result_.updated.push_back(std::move(t));
    }
    result_.loss = result_.ScalarOutput(graph_, "loss");
    return absl::OkStatus();
  }

 private:
  struct StepEvents {
    StreamEvent start, end;
  };

  // v's value at the end on the host (bfloat16 widened to float32): its
  // instance's, or its host copy's where it is not resident (a host home).
  absl::StatusOr<HostTensor> Download(NodeId v) {
    HostTensor t;
    t.node = v;
    t.array.shape = *graph_.shape(v);
    t.array.dtype = *graph_.dtype(v);
    t.array.data.resize(static_cast<size_t>(graph_.bytes(v)));
    if (current_[v] >= 0) {
      RETURN_IF_ERROR(
          backend_.Download(t.array.data.data(), Address(current_[v]), graph_.bytes(v)));
    } else {
      PEBBLE_CHECK(host_counted_[v], "a tensor neither resident nor with a host copy");
      std::memcpy(t.array.data.data(), host_buffers_[host_index_[v]].get(), graph_.bytes(v));
    }
    if (t.array.dtype == DType::kBFloat16) WidenBFloat16(t.array);
    return t;
  }

  // A host buffer (pinned on CUDA) for v's copies, kept in host_index_[v].
  absl::Status AllocateHostBuffer(NodeId v) {
    auto buffer = backend_.AllocateHost(graph_.bytes(v));
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat("host buffer for '", graph_.id(v), "' (", graph_.bytes(v),
                                       " bytes): ", buffer.status().message()));
    }
    host_index_[v] = static_cast<int32_t>(host_buffers_.size());
    host_buffers_.emplace_back(backend_, *buffer, /*host=*/true);
    return absl::OkStatus();
  }

  std::byte* Address(int32_t instance) const {
    const TensorInstance& inst = layout_.instances[instance];
    PEBBLE_CHECK(inst.offset >= 0 && inst.offset + inst.bytes <= layout_.arena_bytes,
                 "instance outside the arena");
    return arena_->get() + inst.offset;
  }
  TensorView View(NodeId v, int32_t instance) const {
    return TensorView{Address(instance), *graph_.shape(v), *graph_.dtype(v)};
  }

  // Step k failed: the error naming the step. The work already enqueued is
  // drained first, so that it finishes before the arena is freed, and so
  // that what the device found in it meanwhile (an index fault of an
  // earlier op, docs/cuda.md) is reported with this error, not by the next
  // run's synchronisation.
  absl::Status Failed(int k, const absl::Status& status) {
    const absl::Status at = AtStep(graph_, schedule_, k, status);
    const absl::Status drained = backend_.Synchronize();
    if (drained.ok()) return at;
    return absl::Status(at.code(), absl::StrCat(at.message(), "; the device also reported: ",
                                                drained.message()));
  }

  // Runs `work` (a Backend call enqueued on `stream`) between two events,
  // kept as step k's start and end; the end, or the error naming the step.
  absl::StatusOr<StreamEvent> Timed(int k, Stream stream,
                                    absl::FunctionRef<absl::Status()> work) {
    absl::StatusOr<StreamEvent> start = streams_.Record(stream);
    if (!start.ok()) return Failed(k, start.status());
    if (absl::Status s = work(); !s.ok()) return Failed(k, s);
    absl::StatusOr<StreamEvent> end = streams_.Record(stream);
    if (!end.ok()) return Failed(k, end.status());
    events_[k] = {*start, *end};
    return end;
  }

  absl::Status WaitOrFail(int k, Stream stream, const StreamEvent& e) {
    absl::Status s = streams_.Wait(stream, e);
    return s.ok() ? s : Failed(k, s);
  }

  // Each Run* returns the bytes held while its step runs.
  absl::StatusOr<int64_t> RunCompute(int k) {
    const NodeId v = schedule_.steps[k].node;
    if (graph_.in_place(v)) return RunInPlace(k);
    if (graph_.is_alias(v)) return RunView(k);
    const int32_t output = instances_.step_output[k];
    PEBBLE_CHECK(current_[v] < 0 && output >= 0, "compute without a new instance");
    RETURN_IF_ERROR(PrepareKernel(k, output));
    current_[v] = output;
    holders_[v] = 1;
    held_ += graph_.bytes(v);
    return RunKernel(k);
  }

  // `compute v` of an in-place update: its kernel writes v's storage (its
  // base's instance, resident: the storage is persistent), and v then
  // holds that instance like a view.
  absl::StatusOr<int64_t> RunInPlace(int k) {
    const NodeId v = schedule_.steps[k].node;
    const NodeId root = graph_.storage(v);
    const int32_t instance = current_[root];
    PEBBLE_CHECK(current_[v] < 0 && instance >= 0 && instances_.step_output[k] < 0,
                 "in-place update without its storage's instance");
    // A copy of the storage still in flight (an earlier offload) reads it.
    RETURN_IF_ERROR(WaitOrFail(k, Stream::kCompute, last_copy_use_[root]));
    RETURN_IF_ERROR(PrepareKernel(k, instance));
    current_[v] = instance;
    ++holders_[root];
    if (host_counted_[root]) {  // the write makes the host copy stale
      host_counted_[root] = 0;
      host_held_ -= graph_.bytes(root);
    }
    ASSIGN_OR_RETURN(const int64_t during, RunKernel(k));
    ready_[root] = ready_[v];
    last_compute_use_[root] = last_compute_use_[v];
    return during;
  }

  // Step k's kernel context, once its inputs are ready and earlier frees
  // done (R_k): the operands, the output at `output`, the workspace.
  absl::Status PrepareKernel(int k, int32_t output) {
    const NodeId v = schedule_.steps[k].node;
    for (NodeId u : graph_.unique_inputs(v)) {
      PEBBLE_CHECK(current_[u] >= 0, "compute input not resident");
      RETURN_IF_ERROR(WaitOrFail(k, Stream::kCompute, ready_[u]));
    }
    RETURN_IF_ERROR(WaitOrFail(k, Stream::kCompute, freed_copy_));  // R_k
    const int32_t workspace = instances_.step_workspace[k];
    KernelContext& ctx = kernel_context_;
    ctx.graph = &graph_;
    ctx.node = v;
    ctx.inputs.clear();
    for (NodeId u : graph_.inputs(v)) ctx.inputs.push_back(View(u, current_[u]));
    ctx.output = View(v, output);
    ctx.workspace = workspace >= 0 ? Address(workspace) : nullptr;
    ctx.workspace_bytes = workspace >= 0 ? layout_.instances[workspace].bytes : 0;
    return absl::OkStatus();
  }

  // Runs the prepared kernel of step k on the compute stream; the bytes
  // held while it runs (its workspace included).
  absl::StatusOr<int64_t> RunKernel(int k) {
    const NodeId v = schedule_.steps[k].node;
    const int64_t during = held_ + kernel_context_.workspace_bytes;
    if (graph_.collective(v)) {
      // A bucket of collectives is issued at its last step, all its members
      // allocated (IssueCollectives).
      if (k + 1 < num_steps_ && schedule_.steps[k + 1].joins_bucket) return during;
      int first = k;
      while (schedule_.steps[first].joins_bucket) --first;
      RETURN_IF_ERROR(IssueCollectives(first, k));
      return during;
    }
    ASSIGN_OR_RETURN(StreamEvent end, Timed(k, Stream::kCompute,
                                            [&] { return backend_.Compute(kernel_context_); }));
    ready_[v] = end;
    last_compute_use_[v] = end;
    for (NodeId u : graph_.unique_inputs(v)) last_compute_use_[u] = end;
    return during;
  }

  // `compute v` of an alias: v takes its storage's instance (its input's,
  // resident) with its own shape; no kernel runs and nothing is allocated.
  // Its data is ready when its input's is; the step is an empty interval
  // on the compute stream.
  absl::StatusOr<int64_t> RunView(int k) {
    const NodeId v = schedule_.steps[k].node;
    const NodeId base = graph_.alias_of(v);
    PEBBLE_CHECK(current_[v] < 0 && current_[base] >= 0 && instances_.step_output[k] < 0,
                 "view without its base's instance");
    current_[v] = current_[base];
    ++holders_[graph_.storage(v)];
    ASSIGN_OR_RETURN(StreamEvent end, Timed(k, Stream::kCompute, [] { return absl::OkStatus(); }));
    ready_[v] = ready_[base];
    last_compute_use_[v] = end;
    return held_;
  }

  absl::StatusOr<int64_t> RunOffload(int k) {
    const NodeId v = schedule_.steps[k].node;
    PEBBLE_CHECK(current_[v] >= 0, "offload of a tensor not resident");
    RETURN_IF_ERROR(WaitOrFail(k, Stream::kCopy, ready_[v]));
    if (!host_counted_[v]) {
      host_counted_[v] = 1;
      host_held_ += graph_.bytes(v);
    }
    ASSIGN_OR_RETURN(StreamEvent end, Timed(k, Stream::kCopy, [&] {
                       return backend_.Copy(CopyDirection::kDeviceToHost,
                                            host_buffers_[host_index_[v]].get(),
                                            Address(current_[v]), graph_.bytes(v));
                     }));
    last_copy_use_[v] = end;
    return held_;
  }

  absl::StatusOr<int64_t> RunPrefetch(int k) {
    const NodeId v = schedule_.steps[k].node;
    const int32_t output = instances_.step_output[k];
    PEBBLE_CHECK(current_[v] < 0 && host_index_[v] >= 0 && output >= 0,
                 "prefetch without a host copy or a new instance");
    RETURN_IF_ERROR(WaitOrFail(k, Stream::kCopy, freed_compute_));  // R_k
    current_[v] = output;
    holders_[v] = 1;
    held_ += graph_.bytes(v);
    ASSIGN_OR_RETURN(StreamEvent end, Timed(k, Stream::kCopy, [&] {
                       return backend_.Copy(CopyDirection::kHostToDevice, Address(output),
                                            host_buffers_[host_index_[v]].get(),
                                            graph_.bytes(v));
                     }));
    ready_[v] = end;
    last_copy_use_[v] = end;
    return held_;
  }

  // `host_compute v` (docs/semantics.md, "Updates on the host"): the
  // update's CPU kernel (runtime/cpu, on every backend; pinned buffers on
  // CUDA) on the host copies, on this thread. Every enqueued step is
  // drained first, so that no copy of those host copies is still in flight
  // (a GPU would overlap more with a wait on those copies alone; this
  // first version is exact, not fast). Timed between two copy-stream
  // events: exact on a synchronous backend.
  absl::StatusOr<int64_t> RunOnHost(int k) {
    const NodeId v = schedule_.steps[k].node;
    const NodeId root = graph_.storage(v);
    PEBBLE_CHECK(current_[root] < 0 && host_index_[root] >= 0 && host_counted_[root],
                 "host compute without its storage's host copy");
    if (absl::Status s = backend_.Synchronize(); !s.ok()) return Failed(k, s);
    KernelContext& ctx = kernel_context_;
    ctx.graph = &graph_;
    ctx.node = v;
    ctx.inputs.clear();
    for (NodeId u : graph_.inputs(v)) {
      const NodeId s = graph_.storage(u);
      PEBBLE_CHECK(host_counted_[s], "host compute input without a host copy");
      ctx.inputs.push_back(
          TensorView{host_buffers_[host_index_[s]].get(), *graph_.shape(u), *graph_.dtype(u)});
    }
    ctx.output = TensorView{host_buffers_[host_index_[root]].get(), *graph_.shape(v),
                            *graph_.dtype(v)};
    ctx.workspace = nullptr;
    ctx.workspace_bytes = 0;
    const KernelFn kernel = HostKernels().Find(graph_.op(v));
    PEBBLE_CHECK(kernel != nullptr, "a host compute without a host kernel (CheckRunnable)");
    ASSIGN_OR_RETURN(StreamEvent end, Timed(k, Stream::kCopy, [&] { return kernel(ctx); }));
    last_copy_use_[root] = end;
    return held_;
  }

  // An all_reduce step: the gradient's average over the ranks, in place.
  // DistributedDataParallel's rule: each rank's value divided by the ranks,
  // then summed (in float32, whatever the gradient's dtype). A bucket (the
  // step and the all_reduce steps that join it) is one all-reduce of its
  // gradients side by side, issued at its first step; the steps that join
  // it only count as held. It runs while the steps after it do (Note
  // [Collectives in flight]).
  absl::StatusOr<int64_t> RunAllReduce(int k) {
    const NodeId v = schedule_.steps[k].node;
    const NodeId root = graph_.storage(v);
    PEBBLE_CHECK(collectives_ != nullptr && current_[v] >= 0, "all_reduce of a tensor not held");
    if (!schedule_.steps[k].joins_bucket) {
      int last = k;
      while (last + 1 < num_steps_ && schedule_.steps[last + 1].joins_bucket) ++last;
      RETURN_IF_ERROR(IssueBucket(k, last));
    }
    if (host_counted_[root]) {  // the host copy holds this rank's own value
      host_counted_[root] = 0;
      host_held_ -= graph_.bytes(root);
    }
    return held_;
  }

  // Note [Collectives in flight]. The plan lets the network's collectives
  // overlap the compute that follows them. So an all_reduce bucket (at its
  // first step), or a sharded graph's gather, reduce-scatter or all_reduce
  // node (or a bucket of them, at its last step), is staged (every stream drained, its
  // tensors copied to a host buffer in float32, a gradient divided by the
  // ranks) and run on the collectives' thread
  // (TaskThread), while the steps go on. That thread runs them one after
  // the other, in the schedule's order, the same on every rank, as the
  // collectives of one gloo context must. A collective is settled (its
  // result copied into place, its end recorded) once it is done, checked
  // before each step, and at the latest before a step (but an all_reduce)
  // that reads, writes, copies or frees a storage it writes, and at the end
  // of the run; its end is thus measured up to a step late. The
  // collectives in flight hold host memory outside the plan (their float32
  // buffers), as every collective's staging does.
  struct InFlight {
    int first = 0, last = 0;  // its steps: a bucket's, or a collective's compute
    StreamEvent start;
    std::shared_ptr<std::vector<float>> sums;  // shared with its task until that ends
    // What it writes once done: `count` elements of `sums` from `offset`
    // into `node` (a bucket's gradients; a collective's output).
    struct Output {
      NodeId node;
      int64_t offset, count;
    };
    std::vector<Output> outputs;
    std::future<absl::Status> done;
  };

  // Step `first`'s collective begins: every stream drained (the work before
  // it, copies of its tensors included), its start recorded.
  absl::StatusOr<InFlight> BeginCollective(int first, int last) {
    if (absl::Status s = backend_.Synchronize(); !s.ok()) return Failed(first, s);
    InFlight op;
    op.first = first;
    op.last = last;
    absl::StatusOr<StreamEvent> start = streams_.Record(Stream::kCompute);
    if (!start.ok()) return Failed(first, start.status());
    op.start = *start;
    return op;
  }

  absl::Status IssueBucket(int first, int last) {
    ASSIGN_OR_RETURN(InFlight bucket, BeginCollective(first, last));
    const float ranks = static_cast<float>(collectives_->ranks());
    int64_t total = 0;
    for (int j = first; j <= last; ++j) total += Elements(schedule_.steps[j].node);
    auto sums = std::make_shared<std::vector<float>>(static_cast<size_t>(total));
    int64_t offset = 0;
    for (int j = first; j <= last; ++j) {
      const NodeId g = schedule_.steps[j].node;
      if (absl::Status s = StageAsFloat(Address(current_[g]), *graph_.dtype(g), Elements(g),
                                        ranks, sums->data() + offset);
          !s.ok()) {
        return Failed(first, s);
      }
      bucket.outputs.push_back({g, offset, Elements(g)});
      offset += Elements(g);
    }
    return EnqueueAllReduce(std::move(bucket), std::move(sums), "of ");
  }

  // Queues `op`'s all-reduce of `sums` (its steps' tensors side by side),
  // named for its first step: "the all-reduce <of>'id'".
  absl::Status EnqueueAllReduce(InFlight op, std::shared_ptr<std::vector<float>> sums,
                                absl::string_view of) {
    const NodeId head = schedule_.steps[op.first].node;
    const std::string what =
        op.first == op.last
            ? absl::StrCat("the all-reduce ", of, Quote(graph_.id(head)))
            : absl::StrCat("the all-reduce of the bucket of ", Quote(graph_.id(head)), " and ",
                           op.last - op.first, " more");
    op.sums = sums;
    return Enqueue(std::move(op), what, [collectives = collectives_, sums, what] {
      return collectives->AllReduceSum(sums->data(), static_cast<int64_t>(sums->size()), what);
    });
  }

  // A sharded graph's collectives (Note [Sharded graphs], scheduler/
  // sharding.cc) at steps first..last: one compute of a collective node, or
  // a bucket of them (Step::joins_bucket: a unit's gathers or reduce-
  // scatters), sent as one message. Each member's input is staged in
  // float32; a member of s elements a shard has its place at `offset` in
  // every rank's part of the message (the parts of ranks * S elements, S
  // the members' shards together), and the collective runs as a bucket
  // does (Note [Collectives in flight]): all_gather gathers every rank's
  // shards, then each member's are put side by side (the padding past the
  // tensor's end dropped); reduce_scatter sums the whole local gradients
  // divided by the ranks (DistributedDataParallel's and FSDP's average),
  // rank r's part of each in rank r's part of the message, of which this
  // rank keeps its own (Collectives::ReduceScatterSum).
  absl::Status IssueCollectives(int first, int last) {
    if (graph_.op(schedule_.steps[first].node) == "all_reduce") return IssueSums(first, last);
    const bool gather = graph_.op(schedule_.steps[first].node) == "all_gather";
    const int ranks = collectives_->ranks();
    int64_t total = 0;  // S: the members' shards, in elements
    ASSIGN_OR_RETURN(const std::vector<CollectiveMember> members,
                     CollectiveMembers(first, last, gather, total));
    ASSIGN_OR_RETURN(InFlight op, BeginCollective(first, last));
    auto buffer = std::make_shared<std::vector<float>>(static_cast<size_t>(total * ranks), 0.0f);
    auto own = std::make_shared<std::vector<float>>(gather ? static_cast<size_t>(total) : 0);
    for (const CollectiveMember& m : members) {
      if (absl::Status s = StageMember(m, gather, members.size() == 1, total,
                                       gather ? *own : *buffer);
          !s.ok()) {
        return Failed(first, s);
      }
    }
    absl::StatusOr<StreamEvent> staged = streams_.Record(Stream::kCompute);
    if (!staged.ok()) return Failed(first, staged.status());
    for (const CollectiveMember& m : members) {
      for (NodeId u : graph_.unique_inputs(m.node)) last_compute_use_[u] = *staged;
    }
    const NodeId head = members.front().node;
    const std::string kind = gather ? "all-gather" : "reduce-scatter";
    const std::string what =
        members.size() == 1
            ? absl::StrCat("the ", kind, " ", Quote(graph_.id(head)))
            : absl::StrCat("the ", kind, " of the bucket of ", Quote(graph_.id(head)), " and ",
                           members.size() - 1, " more");
    if (gather) return EnqueueGather(std::move(op), members, own, buffer, total, what);
    for (const CollectiveMember& m : members) {
      op.outputs.push_back({m.node, collectives_->rank() * total + m.offset, m.out_count});
    }
    op.sums = buffer;
    return Enqueue(std::move(op), what, [collectives = collectives_, buffer, total, what] {
      return collectives->ReduceScatterSum(buffer->data(), total, what);
    });
  }

  // all_reduce nodes at steps first..last (a sharded step's clipping total,
  // Note [Clipping sharded gradients] in scheduler/sharding.cc): their
  // inputs in float32 side by side, summed over the ranks (not averaged:
  // each rank's part of a sum), each output its part of the message.
  absl::Status IssueSums(int first, int last) {
    int64_t total = 0;
    for (int j = first; j <= last; ++j) total += Elements(schedule_.steps[j].node);
    ASSIGN_OR_RETURN(InFlight op, BeginCollective(first, last));
    auto sums = std::make_shared<std::vector<float>>(static_cast<size_t>(total));
    int64_t offset = 0;
    for (int j = first; j <= last; ++j) {
      const NodeId v = schedule_.steps[j].node;
      const NodeId u = graph_.inputs(v)[0];
      const TensorView in = View(u, current_[u]);
      if (absl::Status s = StageAsFloat(in.data, in.dtype, Elements(v), 1.0f,
                                        sums->data() + offset);
          !s.ok()) {
        return Failed(first, s);
      }
      op.outputs.push_back({v, offset, Elements(v)});
      offset += Elements(v);
    }
    absl::StatusOr<StreamEvent> staged = streams_.Record(Stream::kCompute);
    if (!staged.ok()) return Failed(first, staged.status());
    for (int j = first; j <= last; ++j) {
      for (NodeId u : graph_.unique_inputs(schedule_.steps[j].node)) last_compute_use_[u] = *staged;
    }
    return EnqueueAllReduce(std::move(op), std::move(sums), "");
  }

  // A member of a sharded collective (IssueCollectives): its node, its
  // input, their elements, a shard's, and its place in a rank's part.
  struct CollectiveMember {
    NodeId node;
    TensorView in;
    int64_t in_count, out_count, shard, offset;
  };

  // The members of steps first..last, each at `total`, which grows by its shard.
  absl::StatusOr<std::vector<CollectiveMember>> CollectiveMembers(int first, int last,
                                                                  bool gather, int64_t& total) {
    const int ranks = collectives_->ranks();
    std::vector<CollectiveMember> members;
    for (int j = first; j <= last; ++j) {
      const NodeId v = schedule_.steps[j].node;
      const NodeId u = graph_.inputs(v)[0];
      CollectiveMember m{v, View(u, current_[u]), NumElements(*graph_.shape(u)),
                         NumElements(*graph_.shape(v)), 0, total};
      m.shard = gather ? m.in_count : m.out_count;
      const int64_t whole = gather ? m.out_count : m.in_count;
      if (m.shard * ranks < whole) {
        return Failed(j, absl::InternalError(absl::StrCat(
                             Quote(graph_.id(v)), ": shards of ", m.shard,
                             " elements cannot hold ", whole)));
      }
      total += m.shard;
      members.push_back(m);
    }
    return members;
  }

  // `m`'s input in float32 at its place in `message` (ranks parts of
  // `total` elements): a gather's shard at its offset of this rank's one
  // part (`message` is then that part alone); a reduce-scatter's gradient
  // divided by the ranks, rank r's slice at its offset of part r (in
  // order, where it is the only member).
  absl::Status StageMember(const CollectiveMember& m, bool gather, bool alone, int64_t total,
                           std::vector<float>& message) {
    const int ranks = collectives_->ranks();
    if (gather || alone) {
      return StageAsFloat(m.in.data, m.in.dtype, m.in_count,
                          gather ? 1.0f : static_cast<float>(ranks), message.data() + m.offset);
    }
    std::vector<float> gradient(static_cast<size_t>(m.in_count));
    RETURN_IF_ERROR(StageAsFloat(m.in.data, m.in.dtype, m.in_count, static_cast<float>(ranks),
                                 gradient.data()));
    for (int64_t r = 0, lo = 0; r < ranks && lo < m.in_count; ++r, lo += m.shard) {
      std::copy(gradient.begin() + lo, gradient.begin() + std::min(m.in_count, lo + m.shard),
                message.begin() + r * total + m.offset);
    }
    return absl::OkStatus();
  }

  // `count` elements of `dtype` at `data` (device memory), each divided by
  // `divisor`, in float32 at `out` (host memory), through staging_bytes_.
  absl::Status StageAsFloat(const std::byte* data, DType dtype, int64_t count, float divisor,
                            float* out) {
    staging_bytes_.resize(static_cast<size_t>(count * DTypeSize(dtype)));
    RETURN_IF_ERROR(backend_.Download(staging_bytes_.data(), data,
                                      static_cast<int64_t>(staging_bytes_.size())));
    WidenToFloat(staging_bytes_.data(), dtype, count, divisor, out);
    return absl::OkStatus();
  }

  // Enqueues the all-gather of `own` (this rank's shards side by side) into
  // `message` (every rank's, rank-major), whose sums then hold each member's
  // whole tensor: its shards from every rank side by side (the message
  // itself where there is one member).
  absl::Status EnqueueGather(InFlight op, const std::vector<CollectiveMember>& members,
                             std::shared_ptr<std::vector<float>> own,
                             std::shared_ptr<std::vector<float>> message, int64_t total,
                             const std::string& what) {
    const int ranks = collectives_->ranks();
    std::vector<std::pair<int64_t, int64_t>> places;  // (offset, shard) per member
    for (const CollectiveMember& m : members) {
      op.outputs.push_back({m.node, m.offset * ranks, m.out_count});
      places.push_back({m.offset, m.shard});
    }
    auto sums = members.size() == 1 ? message
                                    : std::make_shared<std::vector<float>>(message->size());
    op.sums = sums;
    return Enqueue(std::move(op), what,
                   [collectives = collectives_, own, message, sums, places = std::move(places),
                    total, ranks, what]() -> absl::Status {
                     RETURN_IF_ERROR(
                         collectives->AllGather(own->data(), total, message->data(), what));
                     if (sums == message) return absl::OkStatus();
                     for (const auto& [offset, shard] : places) {
                       for (int r = 0; r < ranks; ++r) {
                         const auto from = message->begin() + r * total + offset;
                         std::copy(from, from + shard, sums->begin() + offset * ranks + r * shard);
                       }
                     }
                     return absl::OkStatus();
                   });
  }

  // Queues `task` (`op`'s collective, named `what`) on the collectives'
  // thread, started on first use; `op`'s outputs are in flight from here.
  absl::Status Enqueue(InFlight op, const std::string& what,
                       std::function<absl::Status()> task) {
    if (collective_thread_ == nullptr) {
      try {
        collective_thread_ = std::make_unique<TaskThread>();
      } catch (const std::system_error& e) {
        return Failed(op.first, absl::ResourceExhaustedError(absl::StrCat(
                                    "cannot start the collectives' thread: ", e.what())));
      }
    }
    op.done = collective_thread_->Run([task = std::move(task), what]() -> absl::Status {
      try {
        return task();
      } catch (const std::exception& e) {  // a Collectives that throws
        return absl::InternalError(absl::StrCat(what, ": ", e.what()));
      }
    });
    for (const InFlight::Output& out : op.outputs) in_flight_storage_[graph_.storage(out.node)] = 1;
    in_flight_.push_back(std::move(op));
    return absl::OkStatus();
  }

  int64_t Elements(NodeId v) const { return graph_.bytes(v) / DTypeSize(*graph_.dtype(v)); }

  // The oldest collective in flight, once done: its outputs copied into
  // place, its steps' ends recorded (the first step's interval from its
  // start; the steps that join a bucket take none of their own).
  absl::Status SettleOldest() {
    InFlight op = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (absl::Status s = op.done.get(); !s.ok()) return Failed(op.first, s);
    for (const InFlight::Output& out : op.outputs) {
      const DType dtype = *graph_.dtype(out.node);
      staging_bytes_.resize(static_cast<size_t>(out.count * DTypeSize(dtype)));
      NarrowFromFloat(op.sums->data() + out.offset, out.count, dtype, staging_bytes_.data());
      if (absl::Status s = backend_.Upload(Address(current_[out.node]), staging_bytes_.data(),
                                           static_cast<int64_t>(staging_bytes_.size()));
          !s.ok()) {
        return Failed(op.first, s);
      }
      in_flight_storage_[graph_.storage(out.node)] = 0;
    }
    absl::StatusOr<StreamEvent> end = streams_.Record(Stream::kCompute);
    if (!end.ok()) return Failed(op.first, end.status());
    for (int j = op.first; j <= op.last; ++j) events_[j] = {j == op.first ? op.start : *end, *end};
    for (const InFlight::Output& out : op.outputs) {
      for (NodeId u : {out.node, graph_.storage(out.node)}) {
        ready_[u] = *end;
        last_compute_use_[u] = *end;
      }
    }
    return absl::OkStatus();
  }

  // Before step k (num_steps_: the end of the run): settles each
  // collective in flight that is done, and, waiting for them, those up to
  // the last that writes a storage the step touches (each, at the end).
  absl::Status SettleFor(int k) {
    while (!in_flight_.empty()) {
      const bool done = in_flight_.front().done.wait_for(std::chrono::seconds(0)) ==
                        std::future_status::ready;
      if (!done && k < num_steps_ && !Touches(k)) break;
      RETURN_IF_ERROR(SettleOldest());
    }
    return absl::OkStatus();
  }

  // Whether step k touches a storage that a collective in flight writes.
  bool Touches(int k) const {
    const Step& step = schedule_.steps[k];
    // A bucket's own later steps (a storage is all-reduced once: CheckOne-
    // AllReducePerValue), and every other bucket, go on.
    if (step.action == Action::kAllReduce) return false;
    if (in_flight_storage_[graph_.storage(step.node)]) return true;
    if (step.action != Action::kCompute && step.action != Action::kHostCompute) return false;
    for (NodeId u : graph_.unique_inputs(step.node)) {
      if (in_flight_storage_[graph_.storage(u)]) return true;
    }
    return false;
  }

  int64_t RunFree(int k) {
    const NodeId v = schedule_.steps[k].node;
    PEBBLE_CHECK(current_[v] >= 0 && (!graph_.persistent(v) || graph_.home(v).has_value()),
                 "free of a tensor not held");
    current_[v] = -1;
    // The storage's bytes are released with its last holder (the base or
    // a view of it).
    const NodeId root = graph_.storage(v);
    if (--holders_[root] == 0) held_ -= graph_.bytes(root);
    // Really free once every compute that read or produced v and every copy
    // of v is done (SPEC section 4; a prefetch that no compute read before
    // the free would otherwise still be writing memory the free hands on).
    freed_compute_ = Later(freed_compute_, last_compute_use_[v]);
    freed_copy_ = Later(freed_copy_, last_copy_use_[v]);
    events_[k] = {last_compute_use_[v], last_copy_use_[v]};  // resolved in MeasureTimes
    return held_;
  }

  const Graph& graph_;
  const Schedule& schedule_;
  Backend& backend_;
  Collectives* const collectives_;  // nullptr: one rank
  Fnv1a replicated_;                // ReplicatedFingerprint
  std::vector<uint8_t> sharded_;    // per node of options.unsharded: ShardedTensors
  // A collective's tensor as the device holds it (IssueBucket,
  // IssueCollective and their settling).
  std::vector<std::byte> staging_bytes_;
  std::deque<InFlight> in_flight_;          // Note [Collectives in flight], oldest first
  std::vector<uint8_t> in_flight_storage_;  // per storage: written by a collective in flight
  ExecutionResult& result_;
  const MemoryLayout& layout_;
  const int num_steps_;
  const InstanceIndex instances_;
  StreamTracker streams_;
  std::optional<DeviceBuffer> arena_;
  std::vector<DeviceBuffer> host_buffers_;
  std::vector<int32_t> current_;     // node -> the instance it holds, or -1
  std::vector<int32_t> holders_;     // storage root -> nodes holding it
  std::vector<int32_t> host_index_;  // node -> its host buffer, or -1
  std::vector<uint8_t> host_counted_;
  int64_t held_ = 0, host_held_ = 0;
  // Per node: its data is complete; the last compute that read or produced
  // it; the last copy of its instance (an offload reads it, a prefetch
  // writes it; a free waits for both).
  std::vector<StreamEvent> ready_, last_compute_use_, last_copy_use_;
  StreamEvent freed_compute_, freed_copy_;  // the latest behind any earlier free
  StreamEvent origin_;
  std::vector<StepEvents> events_;
  KernelContext kernel_context_;
  // Last: destroyed first, so that no collective runs past the run's end.
  std::unique_ptr<TaskThread> collective_thread_;
};

}  // namespace

std::vector<NodeId> UpdatedStorages(const Graph& graph) {
  std::vector<uint8_t> written(graph.num_nodes(), 0);
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (graph.in_place(v)) written[graph.storage(v)] = 1;
  }
  std::vector<NodeId> storages;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (written[v]) storages.push_back(v);
  }
  return storages;
}

absl::StatusOr<ExecutionResult> Execute(const Graph& graph, const Schedule& schedule,
                                        Backend& backend, const ExecutorOptions& options,
                                        const MemoryLayout* given_layout) {
  if (graph.has_auto_homes()) {
    return Execute(ResolveHomes(graph, schedule), schedule, backend, options, given_layout);
  }
  const auto setup_start = std::chrono::steady_clock::now();
  ExecutionResult result;
  // 1-2. Refuse what cannot run, before touching the backend's memory.
  SimulatorOptions simulator = options.simulator;
  if (simulator.device_bucket_copies) {
    return absl::InvalidArgumentError(
        "this runtime stages each bucket through host memory, not a device copy: simulate "
        "without device bucket copies");
  }
  if (options.collectives != nullptr) simulator.ranks = options.collectives->ranks();
  ASSIGN_OR_RETURN(result.predicted, Simulate(graph, schedule, simulator));
  RETURN_IF_ERROR(CheckRunnable(graph, schedule, backend, options.collectives));
  if (options.collectives != nullptr) {
    if (graph.has_collectives() && options.unsharded == nullptr) {
      return absl::InvalidArgumentError(
          "the graph is sharded (it has collectives): run it with the graph it was sharded "
          "from (ExecutorOptions::unsharded; pebble run --shard full on the unsharded graph), "
          "whose tensors its shards start from");
    }
    RETURN_IF_ERROR(CheckSameOnEveryRank(
        *options.collectives, RunFingerprint(graph, schedule, options.seed),
        "the graph, schedule or seed",
        "every rank must run the same plan, since their collectives pair up by their order; "
        "give every rank the same graph and seed, and one rank's plan (pebble run --ranks "
        "runs rank 0's on every rank)"));
  }
  if (!options.inputs_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(options.inputs_dir, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs directory ", Quote(options.inputs_dir), " is not a directory"));
    }
    RETURN_IF_ERROR(CheckInputsDirectory(graph, options.inputs_dir));
  }
  const std::map<std::string, int64_t> counters_before = backend.Counters();
  if (given_layout != nullptr) {
    RETURN_IF_ERROR(VerifyLayout(graph, schedule, *given_layout));
    result.layout = *given_layout;
  } else {
    ASSIGN_OR_RETURN(result.layout, PlanMemoryLayout(graph, schedule, options.layout));
  }
  result.device = backend.Description();

  ScheduleRun run(graph, schedule, backend, options.collectives, result);
  RETURN_IF_ERROR(run.AllocateArena(options.poison_arena));
  RETURN_IF_ERROR(run.LoadPersistent(options));
  if (options.collectives != nullptr) {
    RETURN_IF_ERROR(CheckSameOnEveryRank(
        *options.collectives, run.ReplicatedFingerprint(),
        "the parameters, buffers or optimizer state",
        "every rank must start from the same ones: give the ranks the same --inputs files of "
        "them (or none), and the same seed"));
  }
  RETURN_IF_ERROR(run.AllocateHostBuffers());
  result.setup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  RETURN_IF_ERROR(run.RunSteps());
  RETURN_IF_ERROR(run.MeasureTimes());
  if (options.download_outputs) RETURN_IF_ERROR(run.DownloadOutputs());

  result.backend_memory = backend.MemoryStats();
  for (const auto& [name, count] : backend.Counters()) {
    const auto before = counters_before.find(name);
    const int64_t grew = count - (before == counters_before.end() ? 0 : before->second);
    if (grew != 0) result.backend_counters[name] = grew;
  }
  return result;
}

}  // namespace pebble
