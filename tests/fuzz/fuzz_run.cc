// Fuzz target: `pebble run` on fuzzed small graphs. The input's bytes pick a
// small zoo training graph and then up to 12 mutations of its nodes: a
// dimension or the rank of a shape, a dtype (the bytes follow the new shape
// and dtype), an attribute (changed, added or removed), the operator, an
// input, the bytes, the workspace, the outputs; then, if the input says so,
// every computed node takes the shape the operator table infers from its
// inputs (Propagate). The graph is planned with `baseline` and executed on the CPU backend, as
// `pebble run --policy baseline --backend cpu` does (cli/run_commands.cc).
// Graphs over 16 MiB or 1e8 FLOPs are skipped, so that a run takes
// milliseconds. A run may refuse the graph; it must not crash, and what it
// measures must match the plan.
#include <fuzzer/FuzzedDataProvider.h>
#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "graph/ops.h"
#include "runtime/executor.h"
#include "runtime/make_backend.h"
#include "scheduler/planner.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace pebble;

constexpr int64_t kMaxTotalBytes = int64_t{16} << 20;
constexpr double kMaxFlops = 1e8;
constexpr int64_t kMaxDim = 16;

struct Base {
  std::vector<NodeSpec> specs;
  std::vector<std::string> outputs;
};

Base Decompose(const Graph& graph) {
  Base base;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) base.specs.push_back(SpecOf(graph, v));
  for (NodeId v : graph.outputs()) base.outputs.push_back(graph.id(v));
  return base;
}

const std::vector<Base>& Bases() {
  static const auto* bases = [] {
    auto* b = new std::vector<Base>;
    for (const char* model : {"tanh-chain:length=3,size=16", "mnist-cnn:batch=1",
                              "conv3d:n=4", "transformer:layers=1,seq=4,dim=8,heads=2,"
                              "batch=1,vocab=16"}) {
      b->push_back(Decompose(fuzz::MustOk(BuildModel(model), model)));
    }
    return b;
  }();
  return *bases;
}

// Elements of `shape`, or nullopt past 2^40 or for a negative dimension.
std::optional<int64_t> Elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 40) / d)) return std::nullopt;
    n *= d;
  }
  return n;
}

void ResizeToShape(NodeSpec& spec) {
  if (!spec.shape || !spec.dtype) return;
  if (std::optional<int64_t> n = Elements(*spec.shape)) spec.bytes = *n * DTypeSize(*spec.dtype);
}

nlohmann::json ConsumeAttrValue(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0: return in.ConsumeIntegralInRange<int64_t>(-2, 8);
    case 1: return in.ConsumeBool();
    case 2: return in.ConsumeFloatingPointInRange<double>(-4, 4);
    case 3: {
      nlohmann::json a = nlohmann::json::array();
      const int len = in.ConsumeIntegralInRange<int>(0, 5);
      for (int i = 0; i < len; ++i) a.push_back(in.ConsumeIntegralInRange<int64_t>(-1, 8));
      return a;
    }
    case 4: {
      // ASCII only: a graph file's strings are valid UTF-8 (the reader
      // refuses others), and nlohmann::json throws when it prints invalid
      // UTF-8 in an error message.
      std::string text = in.ConsumeRandomLengthString(12);
      for (char& c : text) c = static_cast<char>(c & 0x7f);
      return text;
    }
    case 5: return in.ConsumeIntegral<int64_t>();
    default: return nullptr;
  }
}

constexpr const char* kAttrKeys[] = {
    "align_corners", "approximate", "axis", "begin", "bias", "causal", "chunks", "dtype",
    "end", "end_dim", "eps", "heads", "index", "input_shape", "kernel", "mode", "momentum",
    "n", "num_embeddings", "output_size", "p", "padding", "pads", "reduction", "scale",
    "seed", "shape", "start_dim", "stride", "transpose_a", "transpose_b", "value"};

void Mutate(FuzzedDataProvider& in, Base& g) {
  static const std::vector<std::string> ops = OpNames();
  const int n = static_cast<int>(g.specs.size());
  NodeSpec& spec = g.specs[in.ConsumeIntegralInRange<int>(0, n - 1)];
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:  // one dimension
      if (spec.shape && !spec.shape->empty()) {
        (*spec.shape)[in.ConsumeIntegralInRange<size_t>(0, spec.shape->size() - 1)] =
            in.ConsumeIntegralInRange<int64_t>(0, kMaxDim);
        ResizeToShape(spec);
      }
      break;
    case 1:  // the rank
      if (spec.shape) {
        if (in.ConsumeBool() && !spec.shape->empty()) {
          spec.shape->erase(spec.shape->begin() +
                            in.ConsumeIntegralInRange<size_t>(0, spec.shape->size() - 1));
        } else if (spec.shape->size() < 6) {
          spec.shape->insert(spec.shape->begin() +
                                 in.ConsumeIntegralInRange<size_t>(0, spec.shape->size()),
                             in.ConsumeIntegralInRange<int64_t>(1, 4));
        }
        ResizeToShape(spec);
      }
      break;
    case 2:  // the dtype
      if (spec.dtype) {
        spec.dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(0, 4));
        ResizeToShape(spec);
      }
      break;
    case 3: {  // an attribute
      if (!spec.attrs.is_object()) spec.attrs = nlohmann::json::object();
      const char* key = kAttrKeys[in.ConsumeIntegralInRange<size_t>(0, std::size(kAttrKeys) - 1)];
      if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
        spec.attrs.erase(key);
      } else {
        spec.attrs[key] = ConsumeAttrValue(in);
      }
      break;
    }
    case 4:  // the operator
      if (!spec.persistent) spec.op = ops[in.ConsumeIntegralInRange<size_t>(0, ops.size() - 1)];
      break;
    case 5:  // an input (a cycle is the builder's error)
      if (!spec.inputs.empty()) {
        spec.inputs[in.ConsumeIntegralInRange<size_t>(0, spec.inputs.size() - 1)] =
            g.specs[in.ConsumeIntegralInRange<int>(0, n - 1)].id;
      } else if (!spec.persistent) {
        spec.inputs.push_back(g.specs[in.ConsumeIntegralInRange<int>(0, n - 1)].id);
      }
      break;
    case 6:  // the bytes
      spec.bytes = *spec.bytes + in.ConsumeIntegralInRange<int64_t>(-64, 64);
      if (*spec.bytes < 0) spec.bytes = 0;
      break;
    case 7:  // the workspace
      spec.workspace = in.ConsumeIntegralInRange<int64_t>(0, 1 << 16);
      break;
    case 8:  // the outputs
      if (in.ConsumeBool() && g.outputs.size() > 1) {
        g.outputs.erase(g.outputs.begin() +
                        in.ConsumeIntegralInRange<size_t>(0, g.outputs.size() - 1));
      } else {
        g.outputs.push_back(spec.id);
      }
      break;
    default:  // drop shape or dtype
      if (in.ConsumeBool()) {
        spec.shape.reset();
      } else {
        spec.dtype.reset();
      }
      break;
  }
}

// Why `graph` is not run, or nullptr: small enough to run in milliseconds.
const char* WhyNotRun(const Graph& graph) {
  int64_t total = 0;
  double flops = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    total += graph.bytes(v) + graph.workspace(v);
    if (total > kMaxTotalBytes) return "over 16 MiB";
    if (!graph.shape(v) || !graph.dtype(v)) continue;
    const std::optional<int64_t> n = Elements(*graph.shape(v));
    if (!n || *n * DTypeSize(*graph.dtype(v)) > kMaxTotalBytes) return "a shape over 16 MiB";
    const OpDef* def = FindOp(graph.op(v));
    if (graph.persistent(v) || def == nullptr || def->flops == nullptr) continue;
    std::vector<TensorType> inputs;
    bool typed = true;
    for (NodeId u : graph.inputs(v)) {
      typed = typed && graph.shape(u) && graph.dtype(u) && Elements(*graph.shape(u));
      if (typed) inputs.push_back({*graph.shape(u), *graph.dtype(u)});
    }
    if (!typed) continue;  // the executor refuses it
    // The arity first, as the kernels check it (runtime/cpu/native_util.cc):
    // infer() assumes it.
    const int arity = static_cast<int>(inputs.size());
    if (arity < def->min_inputs || (def->max_inputs >= 0 && arity > def->max_inputs)) continue;
    if (def->infer == nullptr) continue;
    // The count of the output infer() gives (as NetBuilder calls it), not
    // of the node's shape: flops() assumes the two agree.
    const absl::StatusOr<TensorType> out = def->infer(inputs, graph.attrs(v));
    if (!out.ok()) continue;
    flops += def->flops(inputs, *out, graph.attrs(v));
    if (!(flops <= kMaxFlops)) return "over the FLOP cap";
  }
  return nullptr;
}

// Gives every computed node the shape and dtype the operator table infers
// from its (already updated) inputs, in topological order, and bytes to
// match, where inference succeeds: a mutation of an input's or a weight's
// shape then reaches the kernels as a consistent graph with odd shapes,
// instead of a refusal at the first node whose shape no longer fits.
void Propagate(const Graph& graph, Base& g) {
  for (NodeId v : graph.topological_order()) {
    NodeSpec& spec = g.specs[v];
    const OpDef* def = FindOp(spec.op);
    if (spec.persistent || def == nullptr || def->infer == nullptr) continue;
    const int arity = static_cast<int>(graph.inputs(v).size());
    if (arity < def->min_inputs || (def->max_inputs >= 0 && arity > def->max_inputs)) continue;
    std::vector<TensorType> inputs;
    for (NodeId u : graph.inputs(v)) {
      const NodeSpec& in = g.specs[u];
      if (!in.shape || !in.dtype || !Elements(*in.shape)) break;
      inputs.push_back({*in.shape, *in.dtype});
    }
    if (static_cast<int>(inputs.size()) != arity) continue;
    const absl::StatusOr<TensorType> out = def->infer(inputs, spec.attrs);
    if (!out.ok()) continue;
    spec.shape = out->shape;
    spec.dtype = out->dtype;
    ResizeToShape(spec);
  }
}

// PEBBLE_FUZZ_VERBOSE=1: say how far each input got (for tuning the corpus).
void Note(const std::string& what) {
  static const bool verbose = std::getenv("PEBBLE_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "fuzz_run: %s\n", what.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One thread: many small runs, and no OpenMP workers spinning between
  // them (the runtime read OMP_NUM_THREADS before main; the call sets it).
  omp_set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Backend* backend = fuzz::MustOk(MakeBackend("cpu"), "cpu backend").release();
  static const Planner* planner = fuzz::MustOk(MakePlanner("baseline"), "baseline").release();
  FuzzedDataProvider in(data, size);
  Base g = Bases()[in.ConsumeIntegralInRange<size_t>(0, Bases().size() - 1)];
  const int mutations = in.ConsumeIntegralInRange<int>(0, 12);
  const bool propagate = in.ConsumeBool();
  for (int i = 0; i < mutations && in.remaining_bytes() > 0; ++i) Mutate(in, g);

  auto build = [](const Base& b) {
    GraphBuilder builder("fuzz-run");
    for (const NodeSpec& spec : b.specs) builder.AddNode(spec);
    for (const std::string& id : b.outputs) builder.AddOutput(id);
    return builder.Build();
  };
  absl::StatusOr<Graph> graph = build(g);
  if (graph.ok() && propagate) {
    Propagate(*graph, g);
    graph = build(g);
  }
  if (!graph.ok()) {
    Note(absl::StrCat("not a graph: ", graph.status().message()));
    return 0;
  }
  if (const char* why = WhyNotRun(*graph)) {
    Note(absl::StrCat("skipped: ", why));
    return 0;
  }
  absl::StatusOr<PlanResult> plan = planner->Plan(*graph, PlannerOptions{});
  if (!plan.ok()) {
    Note(absl::StrCat("not planned: ", plan.status().message()));
    return 0;
  }
  ExecutorOptions options;
  options.seed = in.ConsumeIntegral<uint8_t>();
  absl::StatusOr<ExecutionResult> result = Execute(*graph, plan->schedule, *backend, options);
  if (!result.ok()) {
    Note(absl::StrCat("refused: ", result.status().message()));
    return 0;
  }
  Note(absl::StrCat("ran ", graph->num_nodes(), " nodes, peak ", result->peak_bytes));
  fuzz::Expect(result->peak_bytes == plan->report.peak_bytes,
               absl::StrCat("measured peak ", result->peak_bytes, " != predicted ",
                            plan->report.peak_bytes));
  fuzz::Expect(result->outputs.size() == graph->outputs().size(), "outputs missing");
  return 0;
}
