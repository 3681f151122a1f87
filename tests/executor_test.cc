// The executor (runtime/executor.h): plans are executed exactly as planned.
//
// Most tests run on SimBackend, a backend written here whose two streams
// are clocks advanced by the graph's costs and by bytes / bandwidth, as in
// SPEC section 4, and whose kernel is a deterministic mix of its inputs.
// With it the tests check, without any real kernel:
//  - the executor's Record/Wait calls make the backend's stream times equal
//    the simulator's start and end of every step (the dependencies of SPEC
//    section 4 are issued exactly);
//  - measured memory equals the simulator's, step by step, for every policy;
//  - every policy computes bitwise the same outputs as the baseline (a
//    layout that overlapped two live tensors would corrupt one);
//  - nothing reads memory that was never written (the arena is poisoned and
//    the kernel refuses NaN bytes).
// The last tests run the real CPU kernels on the zoo's models.
#include "runtime/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <utility>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/autodiff.h"
#include "graph/half.h"
#include "graph/models/models.h"
#include "graph/net_builder.h"
#include "gtest/gtest.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/make_backend.h"
#include "runtime/npy.h"
#include "runtime/trace.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"
#include "test_util.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;
using testing::MakeGraph;
using testing::MakeSchedule;

constexpr double kBandwidth = 25.0;  // bytes per cost unit, for SimBackend

// A backend whose streams are clocks (SPEC section 4) and whose kernel mixes
// its inputs deterministically. Memory is host memory.
class SimBackend final : public Backend {
 public:
  explicit SimBackend(double bandwidth = kBandwidth) : bandwidth_(bandwidth) {}
  ~SimBackend() override {
    EXPECT_EQ(live_, 0) << "the executor leaked backend memory";
  }

  std::string name() const override { return "sim"; }
  std::string Description() const override { return "simulated streams"; }
  absl::Status CheckSupported(const Graph& graph) const override {
    for (NodeId v = 0; v < graph.num_nodes(); ++v) {
      if (graph.op(v) == "unsupported") {
        return absl::UnimplementedError(absl::StrCat("no kernel for node '", graph.id(v), "'"));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::byte*> AllocateDevice(int64_t bytes) override {
    ++device_allocations;
    stats_.device_bytes_in_use += bytes;
    stats_.device_bytes_peak = std::max(stats_.device_bytes_peak, stats_.device_bytes_in_use);
    return Allocate(bytes);
  }
  void FreeDevice(std::byte* ptr) override {
    stats_.device_bytes_in_use -= sizes_.at(ptr);
    Release(ptr);
  }
  absl::StatusOr<std::byte*> AllocateHost(int64_t bytes) override {
    stats_.host_bytes_in_use += bytes;
    stats_.host_bytes_peak = std::max(stats_.host_bytes_peak, stats_.host_bytes_in_use);
    return Allocate(bytes);
  }
  void FreeHost(std::byte* ptr) override {
    stats_.host_bytes_in_use -= sizes_.at(ptr);
    Release(ptr);
  }
  BackendMemoryStats MemoryStats() const override { return stats_; }
  absl::Status Upload(std::byte* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Download(void* dst, const std::byte* src, int64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Fill(std::byte* dst, uint8_t value, int64_t bytes) override {
    std::memset(dst, value, bytes);
    return absl::OkStatus();
  }

  // out[j] = tanh(0.1 * id_hash + sum_i w_i * in_i[j mod n_i]); the workspace
  // is written first (garbage that must not land on a live tensor).
  absl::Status Compute(const KernelContext& ctx) override {
    if (ctx.op() == "fails") return absl::InternalError("the kernel failed on purpose");
    for (int64_t b = 0; b < ctx.workspace_bytes; ++b) {
      ctx.workspace[b] = static_cast<std::byte>(0xA5);
    }
    float seed = 0;
    for (char c : ctx.graph->id(ctx.node)) seed = seed * 0.37f + static_cast<float>(c) * 0.01f;
    const int64_t n = ctx.output.num_elements();
    float* out = ctx.output.as<float>();
    for (int64_t j = 0; j < n; ++j) {
      float acc = seed;
      for (size_t i = 0; i < ctx.inputs.size(); ++i) {
        const TensorView& in = ctx.inputs[i];
        const int64_t m = in.num_elements();
        if (m == 0) continue;
        const float x = in.as<const float>()[j % m];
        if (std::isnan(x)) {
          return absl::DataLossError(absl::StrCat("read unwritten memory in input ", i));
        }
        acc += x * 0.5f / static_cast<float>(i + 1);
      }
      out[j] = ctx.op() == "copy" ? ctx.inputs[0].as<const float>()[j] : std::tanh(acc);
    }
    compute_clock_ += ctx.graph->cost(ctx.node);
    ++computes_;
    return absl::OkStatus();
  }
  absl::Status Copy(CopyDirection, std::byte* dst, const std::byte* src,
                    int64_t bytes) override {
    std::memcpy(dst, src, bytes);
    copy_clock_ += static_cast<double>(bytes) / bandwidth_;
    return absl::OkStatus();
  }
  absl::StatusOr<EventId> Record(Stream stream) override {
    times_.push_back(Clock(stream));
    return static_cast<EventId>(times_.size() - 1);
  }
  absl::Status Wait(Stream stream, EventId event) override {
    ++waits;
    double& clock = Clock(stream);
    clock = std::max(clock, times_.at(event));
    return absl::OkStatus();
  }
  // Returns, once, the error planted in device_fault: what an asynchronous
  // device reports at its next synchronisation (CUDA's index faults).
  absl::Status Synchronize() override {
    compute_clock_ = copy_clock_ = std::max(compute_clock_, copy_clock_);
    ++synchronizations;
    return std::exchange(device_fault, absl::OkStatus());
  }
  absl::StatusOr<double> ElapsedSeconds(EventId from, EventId to) const override {
    return times_.at(to) - times_.at(from);
  }
  void ResetEvents() override { times_.clear(); }
  // "computes" grows with every compute; "constant" never does.
  std::map<std::string, int64_t> Counters() const override {
    return {{"computes", computes_}, {"constant", 7}};
  }

  int device_allocations = 0;
  int waits = 0;
  int synchronizations = 0;
  absl::Status device_fault;

 private:
  double& Clock(Stream s) { return s == Stream::kCompute ? compute_clock_ : copy_clock_; }
  std::byte* Allocate(int64_t bytes) {
    ++live_;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(256, (std::max<int64_t>(bytes, 1) + 255) / 256 * 256));
    sizes_[p] = bytes;
    return p;
  }
  void Release(std::byte* p) {
    --live_;
    sizes_.erase(p);
    std::free(p);
  }

  double bandwidth_;
  double compute_clock_ = 0, copy_clock_ = 0;
  int64_t computes_ = 0;
  std::vector<double> times_;
  BackendMemoryStats stats_;
  std::map<std::byte*, int64_t> sizes_;
  int live_ = 0;
};

// RandomDag with shapes: every node an fp32 vector of bytes / 4 elements.
Graph ShapedRandomDag(int n, uint64_t seed) {
  Graph g = testing::RandomDag(n, seed);
  GraphBuilder b(g.name());
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    NodeSpec s = SpecOf(g, v);
    s.bytes = 4 * *s.bytes;
    s.workspace *= 4;
    s.shape = Shape{*s.bytes / 4};
    s.dtype = DType::kFloat32;
    b.AddNode(std::move(s));
  }
  for (NodeId v : g.outputs()) b.AddOutput(g.id(v));
  auto built = b.Build();
  EXPECT_TRUE(built.ok()) << built.status();
  return *std::move(built);
}

NodeSpec Vec(std::string id, int64_t elements, std::vector<std::string> inputs = {},
             double cost = 1, bool persistent = false) {
  NodeSpec s;
  s.id = std::move(id);
  s.bytes = 4 * elements;
  s.inputs = std::move(inputs);
  s.cost = cost;
  s.persistent = persistent;
  s.shape = Shape{elements};
  s.dtype = DType::kFloat32;
  return s;
}

// A schedule that offloads every computed tensor read later, frees it, and
// prefetches it right before its next reader: every copy-stream dependency
// of SPEC section 4 appears.
Schedule OffloadEverything(const Graph& g, const Schedule& one_shot) {
  Schedule out;
  std::vector<bool> resident(g.num_nodes(), false), on_host(g.num_nodes(), false);
  for (NodeId v = 0; v < g.num_nodes(); ++v) resident[v] = g.persistent(v);
  for (const Step& step : one_shot.steps) {
    if (step.action == Action::kCompute) {
      for (NodeId u : g.unique_inputs(step.node)) {
        if (!resident[u]) {
          out.steps.push_back({Action::kPrefetch, u});
          resident[u] = true;
        }
      }
      out.steps.push_back(step);
      resident[step.node] = true;
      const NodeId v = step.node;
      if (!g.is_output(v) && !g.readers(v).empty()) {
        out.steps.push_back({Action::kOffload, v});
        out.steps.push_back({Action::kFree, v});
        on_host[v] = true;
        resident[v] = false;
      }
    } else if (step.action == Action::kFree) {
      if (resident[step.node]) {
        out.steps.push_back(step);
        resident[step.node] = false;
      }
    }
  }
  return out;
}

Schedule BaselineSchedule(const Graph& g) {
  auto s = FreeAtLastUse(g, DefaultOrder(g));
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Measured memory equals the simulator's after and during every step.
void ExpectMemoryMatches(const ExecutionResult& r, const std::string& label) {
  EXPECT_EQ(r.peak_bytes, r.predicted.peak_bytes) << label;
  EXPECT_EQ(r.peak_step, r.predicted.peak_step) << label;
  EXPECT_EQ(r.host_peak_bytes, r.predicted.host_peak_bytes) << label;
  EXPECT_EQ(r.arena_bytes, r.layout.arena_bytes) << label;
  ASSERT_EQ(r.steps.size(), r.predicted.timeline.size()) << label;
  for (size_t k = 0; k < r.steps.size(); ++k) {
    EXPECT_EQ(r.steps[k].resident_bytes, r.predicted.timeline[k].device_bytes) << label << k;
    EXPECT_EQ(r.steps[k].during_bytes, r.predicted.timeline[k].peak_bytes) << label << k;
    EXPECT_EQ(r.steps[k].host_bytes, r.predicted.timeline[k].host_bytes) << label << k;
  }
}

void ExpectSameOutputs(const ExecutionResult& a, const ExecutionResult& b,
                       const Graph& g, const std::string& label) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size()) << label;
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    EXPECT_EQ(a.outputs[i].node, b.outputs[i].node);
    EXPECT_TRUE(a.outputs[i].array.data == b.outputs[i].array.data)
        << label << ": output '" << g.id(a.outputs[i].node) << "' differs bitwise";
  }
}

TEST(ExecutorTest, StreamTimesAreTheSimulatorsOnOffloadSchedules) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Graph g = ShapedRandomDag(25, seed);
    const Schedule s = OffloadEverything(g, BaselineSchedule(g));
    SimulatorOptions so;
    so.host_bandwidth_bytes_per_s = kBandwidth;
    auto report = Simulate(g, s, so);
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_GT(report->transfer_bytes, 0);
    SimBackend backend;
    ExecutorOptions options;
    options.simulator = so;
    auto r = Execute(g, s, backend, options);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectMemoryMatches(*r, absl::StrCat("seed ", seed));
    for (size_t k = 0; k < s.steps.size(); ++k) {
      EXPECT_DOUBLE_EQ(r->steps[k].start_s, report->timeline[k].start)
          << "seed " << seed << " step " << k << " " << ActionName(s.steps[k].action);
      EXPECT_DOUBLE_EQ(r->steps[k].end_s, report->timeline[k].end)
          << "seed " << seed << " step " << k << " " << ActionName(s.steps[k].action);
    }
    EXPECT_DOUBLE_EQ(r->time_s, report->makespan);
    EXPECT_GT(backend.waits, 0);
    // Offloading changes nothing in the results.
    SimBackend plain_backend;
    auto plain = Execute(g, BaselineSchedule(g), plain_backend, options);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ExpectSameOutputs(*plain, *r, g, absl::StrCat("seed ", seed));
  }
}

// Runs `s` on a SimBackend at kBandwidth and checks each step's [start,
// end] against `want`, traced by hand.
absl::StatusOr<ExecutionResult> RunHandTraced(
    const Graph& g, const Schedule& s,
    const std::vector<std::pair<double, double>>& want) {
  SimBackend backend;
  ExecutorOptions options;
  options.simulator.host_bandwidth_bytes_per_s = kBandwidth;
  auto r = Execute(g, s, backend, options);
  if (!r.ok()) return r.status();
  EXPECT_EQ(r->steps.size(), want.size());
  for (size_t k = 0; k < want.size() && k < r->steps.size(); ++k) {
    EXPECT_DOUBLE_EQ(r->steps[k].start_s, want[k].first) << k;
    EXPECT_DOUBLE_EQ(r->steps[k].end_s, want[k].second) << k;
  }
  return r;
}

// A hand-made case whose times are traced by hand (bandwidth 25 bytes per
// unit; a = 100 bytes takes 4 units to copy). SPEC section 4: a compute or
// prefetch waits for every earlier free (R_k), and a free of an offloaded
// tensor ends with its offload:
//   0 compute a  [0, 1]    1 offload a  [1, 5]    2 free a     [5, 5]
//   3 compute b  [5, 6]: R_3 = 5, though b does not read a
//   4 prefetch a [5, 9]    5 compute c  [9, 10]: waits for the prefetch of a
TEST(ExecutorTest, HandTracedOffloadTimes) {
  const Graph g = MakeGraph({Vec("x", 1, {}, 0, true), Vec("a", 25, {"x"}, 1),
                             Vec("b", 25, {"x"}, 1), Vec("c", 25, {"a", "b"}, 1)},
                            {"c"});
  const Schedule s = MakeSchedule(g, {{Action::kCompute, "a"},
                                      {Action::kOffload, "a"},
                                      {Action::kFree, "a"},
                                      {Action::kCompute, "b"},
                                      {Action::kPrefetch, "a"},
                                      {Action::kCompute, "c"}});
  auto r = RunHandTraced(g, s, {{0, 1}, {1, 5}, {5, 5}, {5, 6}, {5, 9}, {9, 10}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->time_s, 10);
  EXPECT_DOUBLE_EQ(r->kernel_time_s, 3);
  EXPECT_DOUBLE_EQ(r->copy_time_s, 8);
  // Compute b [5, 6] runs under prefetch a [5, 9]; neither stream idles.
  EXPECT_DOUBLE_EQ(r->copy_overlap_s, 1);
  EXPECT_DOUBLE_EQ(r->overhead_s, 0);
}

TEST(ExecutorTest, CopyComputeOverlapIsTheIntersectionOfTheStreamsBusyTimes) {
  auto step = [](Action a, double start, double end) {
    StepMeasurement m;
    m.action = a;
    m.start_s = start;
    m.end_s = end;
    return m;
  };
  EXPECT_DOUBLE_EQ(CopyComputeOverlapSeconds({}), 0);
  // Computes [0, 2] [3, 6]; copies [1, 4] and [5, 10] (out of order);
  // a free spanning everything counts in neither.
  EXPECT_DOUBLE_EQ(CopyComputeOverlapSeconds({step(Action::kCompute, 0, 2),
                                              step(Action::kPrefetch, 5, 10),
                                              step(Action::kCompute, 3, 6),
                                              step(Action::kOffload, 1, 4),
                                              step(Action::kFree, 0, 10)}),
                   1 + 1 + 1);
  // Copies that overlap each other count once; touching is no overlap.
  EXPECT_DOUBLE_EQ(CopyComputeOverlapSeconds({step(Action::kCompute, 0, 4),
                                              step(Action::kOffload, 1, 3),
                                              step(Action::kPrefetch, 2, 5),
                                              step(Action::kPrefetch, 4, 4)}),
                   3);
  EXPECT_DOUBLE_EQ(CopyComputeOverlapSeconds({step(Action::kCompute, 0, 1),
                                              step(Action::kOffload, 1, 2)}),
                   0);
}

TEST(ExecutorTest, BackendCountersAreWhatTheRunAdded) {
  const Graph g = MakeGraph({Vec("x", 1, {}, 0, true), Vec("a", 25, {"x"}, 1),
                             Vec("b", 25, {"a"}, 1)},
                            {"b"});
  const Schedule s = MakeSchedule(g, {{Action::kCompute, "a"}, {Action::kCompute, "b"}});
  SimBackend backend;
  for (int run = 0; run < 2; ++run) {  // the second run on the same backend
    auto r = Execute(g, s, backend);
    ASSERT_TRUE(r.ok()) << r.status();
    // Two computes this run, whatever the backend counted before; a count
    // that did not grow is left out.
    EXPECT_EQ(r->backend_counters, (std::map<std::string, int64_t>{{"computes", 2}}))
        << "run " << run;
  }
}

// A prefetch that no compute reads before the tensor is freed: the free
// waits for the prefetch, so later work does not reuse memory the copy is
// still writing. SPEC section 4 names only offloads in a free's start (it
// would end the free at 5 and start b at 5); the executor waits longer:
//   0 compute a  [0, 1]    1 offload a  [1, 5]    2 free a     [5, 5]
//   3 prefetch a [5, 9]    4 free a     [9, 9]    5 compute b  [9, 10]
TEST(ExecutorTest, AFreeWaitsForAnUnreadPrefetch) {
  const Graph g = MakeGraph({Vec("x", 1, {}, 0, true), Vec("a", 25, {"x"}, 1),
                             Vec("b", 25, {"x"}, 1)},
                            {"b"});
  const Schedule s = MakeSchedule(g, {{Action::kCompute, "a"},
                                      {Action::kOffload, "a"},
                                      {Action::kFree, "a"},
                                      {Action::kPrefetch, "a"},
                                      {Action::kFree, "a"},
                                      {Action::kCompute, "b"}});
  auto r = RunHandTraced(g, s, {{0, 1}, {1, 5}, {5, 5}, {5, 9}, {9, 9}, {9, 10}});
  ASSERT_TRUE(r.ok()) << r.status();
  // The simulator keeps SPEC section 4's time, without that wait.
  EXPECT_DOUBLE_EQ(r->predicted.makespan, 9);
}

TEST(ExecutorTest, EveryPolicyMatchesTheSimulatorAndTheBaselineBitwise) {
  std::vector<Graph> graphs;
  for (uint64_t seed : {3, 7, 11}) graphs.push_back(ShapedRandomDag(18, seed));
  auto conv = BuildModel("conv3d:n=4");
  ASSERT_TRUE(conv.ok());
  graphs.push_back(*conv);
  for (const Graph& g : graphs) {
    auto baseline_peak = BaselinePeak(g);
    ASSERT_TRUE(baseline_peak.ok());
    SimBackend base_backend;
    auto base = Execute(g, BaselineSchedule(g), base_backend);
    ASSERT_TRUE(base.ok()) << base.status();
    int policies_run = 0;
    for (const PolicyInfo* info : PlannerRegistry::Global().List()) {
      for (double fraction : {1.0, 0.7}) {
        PlannerOptions po;
        po.budget_bytes = static_cast<int64_t>(fraction * static_cast<double>(*baseline_peak));
        po.time_limit_s = 2;
        auto plan = info->factory()->Plan(g, po);
        if (!plan.ok()) continue;  // the policy refuses this graph (a non-chain, ...)
        const std::string label = absl::StrCat(g.name(), " ", info->name, " ", fraction);
        SimBackend backend;
        auto r = Execute(g, plan->schedule, backend);
        ASSERT_TRUE(r.ok()) << label << ": " << r.status();
        EXPECT_EQ(backend.device_allocations, 1) << label << ": one arena, once";
        ExpectMemoryMatches(*r, label);
        ExpectSameOutputs(*base, *r, g, label);
        ++policies_run;
      }
    }
    EXPECT_GE(policies_run, 10) << g.name();
  }
}

TEST(ExecutorTest, RefusesAnInvalidScheduleBeforeTouchingTheBackend) {
  const Graph g = MakeGraph({Vec("x", 4, {}, 0, true), Vec("a", 4, {"x"}), Vec("b", 4, {"a"})},
                            {"b"});
  const Schedule bad = MakeSchedule(g, {{Action::kCompute, "b"}});
  SimBackend backend;
  auto r = Execute(g, bad, backend);
  ASSERT_FALSE(r.ok());
  auto sim = Simulate(g, bad);
  ASSERT_FALSE(sim.ok());
  EXPECT_EQ(r.status(), sim.status());
  EXPECT_THAT(r.status().message(), HasSubstr("step 0"));
  EXPECT_EQ(backend.device_allocations, 0);
}

TEST(ExecutorTest, UnsupportedOpIsRefusedBeforeAllocating) {
  NodeSpec a = Vec("a", 4, {"x"});
  a.op = "unsupported";
  const Graph g = MakeGraph({Vec("x", 4, {}, 0, true), a}, {"a"});
  SimBackend backend;
  auto r = Execute(g, BaselineSchedule(g), backend);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(backend.device_allocations, 0);
}

TEST(ExecutorTest, KernelErrorNamesStepActionNodeAndOp) {
  NodeSpec b = Vec("b", 4, {"a"});
  b.op = "fails";
  const Graph g = MakeGraph({Vec("x", 4, {}, 0, true), Vec("a", 4, {"x"}), b}, {"b"});
  SimBackend backend;
  auto r = Execute(g, BaselineSchedule(g), backend);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.status().message(), HasSubstr("step 1 (compute 'b', op fails)"));
  EXPECT_THAT(r.status().message(), HasSubstr("failed on purpose"));
}

TEST(ExecutorTest, AFailedStepReportsWhatTheDeviceFoundBeforeIt) {
  // An earlier op's fault, still unread on the device when step 1 fails: it
  // is reported with the step's error and taken, not left to the next run.
  NodeSpec b = Vec("b", 4, {"a"});
  b.op = "fails";
  const Graph g = MakeGraph({Vec("x", 4, {}, 0, true), Vec("a", 4, {"x"}), b}, {"b"});
  SimBackend backend;
  backend.device_fault = absl::InvalidArgumentError("node 'a' (op vec): index 7 is outside");
  auto r = Execute(g, BaselineSchedule(g), backend);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.status().message(),
              HasSubstr("step 1 (compute 'b', op fails): the kernel failed on purpose; the "
                        "device also reported: node 'a' (op vec): index 7 is outside"));
  EXPECT_EQ(backend.synchronizations, 1);

  const Graph clean = MakeGraph({Vec("x", 4, {}, 0, true), Vec("a", 4, {"x"})}, {"a"});
  auto next = Execute(clean, BaselineSchedule(clean), backend);
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST(ExecutorTest, GivenLayoutIsVerifiedBeforeAllocating) {
  // A given layout that puts b on top of a while both are alive: the
  // executor verifies given layouts and refuses it.
  const Graph g = MakeGraph({Vec("x", 4, {}, 0, true), Vec("a", 16, {"x"}), Vec("b", 16, {"a"})},
                            {"b"});
  const Schedule s = BaselineSchedule(g);
  auto layout = PlanMemoryLayout(g, s);
  ASSERT_TRUE(layout.ok());
  MemoryLayout broken = *layout;
  for (TensorInstance& inst : broken.instances) inst.offset = 0;
  SimBackend backend;
  auto r = Execute(g, s, backend, {}, &broken);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(backend.device_allocations, 0);
  // The planned layout runs; without poisoning too.
  SimBackend backend2;
  ExecutorOptions no_poison;
  no_poison.poison_arena = false;
  EXPECT_TRUE(Execute(g, s, backend2, no_poison, &*layout).ok());
}

TEST(ExecutorTest, SameSeedSameInputsAndOutputs) {
  const Graph g = ShapedRandomDag(20, 5);
  ExecutorOptions o1, o2;
  o1.seed = o2.seed = 42;
  SimBackend b1, b2, b3;
  auto r1 = Execute(g, BaselineSchedule(g), b1, o1);
  auto r2 = Execute(g, BaselineSchedule(g), b2, o2);
  ASSERT_TRUE(r1.ok() && r2.ok());
  ExpectSameOutputs(*r1, *r2, g, "same seed");
  o2.seed = 43;
  auto r3 = Execute(g, BaselineSchedule(g), b3, o2);
  ASSERT_TRUE(r3.ok());
  bool any_differs = false;
  for (size_t i = 0; i < r1->outputs.size(); ++i) {
    any_differs |= r1->outputs[i].array.data != r3->outputs[i].array.data;
  }
  EXPECT_TRUE(any_differs) << "another seed should give other inputs";
}

// A target of bce_with_logits that the model computes takes ATen's gradient,
// -logits g / n (binary_cross_entropy_with_logits_target_backward): as the
// loss itself (g = 1) and scaled by 3 after it, in fp32 and fp16 (g cast to
// fp16, the division by n in fp32, as ATen's opmath divides).
TEST(ExecutorTest, ATargetOfBceWithLogitsTakesItsGradient) {
  for (const DType dtype : {DType::kFloat32, DType::kFloat16}) {
    for (const bool scaled : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), scaled ? ", scaled" : ""));
      NetBuilder nb("bce_target");
      const Value x = nb.Parameter("x", {4, 6}, dtype);
      const Value t = nb.Parameter("t", {4, 6}, dtype);
      const Value bce = nb.Apply("bce_with_logits", {x, t}, nlohmann::json::object(),
                                 scaled ? "bce" : "loss");
      if (scaled) {
        const Value three =
            nb.Apply("fill", {}, {{"shape", Shape{}}, {"dtype", "fp32"}, {"value", 3.0}}, "three");
        nb.Apply("mul", {bce, three}, nlohmann::json::object(), "loss");
      }
      const Graph g = testing::TrainingGraph(nb);
      ASSERT_NE(g.Find("grad:t"), kNoNode);
      auto backend = MakeCpuBackend();
      auto r = Execute(g, BaselineSchedule(g), *backend);
      ASSERT_TRUE(r.ok()) << r.status();
      absl::StatusOr<NpyArray> logits = GenerateInput(g, g.Find("x"), /*seed=*/0);
      ASSERT_TRUE(logits.ok());
      const NpyArray& grad = r->FindOutput(g, "grad:t")->array;
      ASSERT_EQ(grad.dtype, dtype);
      for (int i = 0; i < 24; ++i) {
        float want, got;
        if (dtype == DType::kFloat32) {
          std::memcpy(&want, logits->data.data() + 4 * i, 4);
          want = (scaled ? want * 3.0f : want) / -24.0f;
          std::memcpy(&got, grad.data.data() + 4 * i, 4);
        } else {
          uint16_t xi, gi;
          std::memcpy(&xi, logits->data.data() + 2 * i, 2);
          std::memcpy(&gi, grad.data.data() + 2 * i, 2);
          float product = HalfToFloat(xi);
          if (scaled) product = HalfToFloat(FloatToHalf(product * 3.0f));
          want = HalfToFloat(FloatToHalf(product / -24.0f));
          got = HalfToFloat(gi);
        }
        EXPECT_EQ(got, want) << i;
      }
    }
  }
}

TEST(ExecutorTest, GeneratedInputsFollowTheDocumentedRule) {
  auto g = BuildModel("mnist-cnn:batch=16");
  ASSERT_TRUE(g.ok());
  // Target: i64 in [0, 10), the logits' class axis; several classes drawn.
  auto target = GenerateInput(*g, g->Find("target"), 7);
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_EQ(target->dtype, DType::kInt64);
  std::vector<int64_t> classes(16);
  std::memcpy(classes.data(), target->data.data(), 16 * 8);
  for (int64_t c : classes) {
    EXPECT_GE(c, 0);
    EXPECT_LT(c, 10);
  }
  EXPECT_GT(std::set<int64_t>(classes.begin(), classes.end()).size(), 3u);
  // A float target of bce_with_logits: probabilities in [0, 1).
  {
    NetBuilder nb("bce");
    const Value x = nb.Parameter("x", {4, 64});
    nb.MarkOutput(x);
    auto forward = nb.Build();
    ASSERT_TRUE(forward.ok()) << forward.status();
    auto bce = AddLossAndDifferentiate(*forward, LossKind::kBce);
    ASSERT_TRUE(bce.ok()) << bce.status();
    auto probabilities = GenerateInput(*bce, bce->Find("target"), 7);
    ASSERT_TRUE(probabilities.ok()) << probabilities.status();
    const float* p = reinterpret_cast<const float*>(probabilities->data.data());
    const auto [lo, hi] = std::minmax_element(p, p + 256);
    EXPECT_GE(*lo, 0.0f);
    EXPECT_LT(*hi, 1.0f);
    EXPECT_LT(*lo, 0.1f);
    EXPECT_GT(*hi, 0.9f);
  }
  // Weights: uniform within 1/sqrt(fan_in); fc1.weight (1024, 1024).
  auto w = GenerateInput(*g, g->Find("fc1.weight"), 7);
  ASSERT_TRUE(w.ok());
  const float* wf = reinterpret_cast<const float*>(w->data.data());
  float lo = 1, hi = -1;
  for (int64_t i = 0; i < 1024 * 1024; ++i) {
    lo = std::min(lo, wf[i]);
    hi = std::max(hi, wf[i]);
  }
  EXPECT_GE(lo, -1.0f / 32);
  EXPECT_LT(hi, 1.0f / 32);
  EXPECT_LT(lo, -0.9f / 32);
  EXPECT_GT(hi, 0.9f / 32);
  // Reproducible from (seed, id), different across ids and seeds.
  auto w2 = GenerateInput(*g, g->Find("fc1.weight"), 7);
  auto w3 = GenerateInput(*g, g->Find("fc1.weight"), 8);
  EXPECT_EQ(w->data, w2->data);
  EXPECT_NE(w->data, w3->data);
  // Batch norm: weight 1, bias 0, running_var 1, running_mean 0.
  auto rn = BuildModel("resnet18:batch=1,image=32");
  ASSERT_TRUE(rn.ok());
  auto value0 = [&](const std::string& id) {
    auto a = GenerateInput(*rn, rn->Find(id), 1);
    EXPECT_TRUE(a.ok()) << id;
    float x;
    std::memcpy(&x, a->data.data(), 4);
    return x;
  };
  EXPECT_EQ(value0("bn1.weight"), 1.0f);
  EXPECT_EQ(value0("bn1.bias"), 0.0f);
  EXPECT_EQ(value0("bn1.running_var"), 1.0f);
  EXPECT_EQ(value0("bn1.running_mean"), 0.0f);
}

TEST(ExecutorTest, InputsComeFromNpyFilesAndMismatchesAreNamed) {
  const Graph g = MakeGraph({Vec("x", 3, {}, 0, true), [] {
                               NodeSpec s = Vec("y", 3, {"x"});
                               s.op = "copy";
                               return s;
                             }()},
                            {"y"});
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           absl::StrCat("executor_inputs_", getpid()))
                              .string();
  std::filesystem::create_directories(dir);
  NpyArray x;
  x.shape = {3};
  x.dtype = DType::kFloat32;
  const float values[3] = {1.5f, -2.0f, 0.25f};
  x.data.resize(12);
  std::memcpy(x.data.data(), values, 12);
  ASSERT_TRUE(WriteNpy(dir + "/x.npy", x).ok());
  SimBackend backend;
  ExecutorOptions o;
  o.inputs_dir = dir;
  auto r = Execute(g, BaselineSchedule(g), backend, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->loaded_inputs.size(), 1u);
  EXPECT_TRUE(r->generated_inputs.empty());
  EXPECT_EQ(r->FindOutput(g, "y")->array.data, x.data);

  x.shape = {1, 3};
  ASSERT_TRUE(WriteNpy(dir + "/x.npy", x).ok());
  SimBackend backend2;
  auto bad = Execute(g, BaselineSchedule(g), backend2, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("x.npy"));
  EXPECT_THAT(bad.status().message(), HasSubstr("node 'x'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("fp32(1,3)"));
  std::filesystem::remove_all(dir);
}

TEST(ExecutorTest, TensorFileNamesKeepIdsVerbatimWherePossible) {
  EXPECT_EQ(TensorFileName("grad:conv1.weight"), "grad:conv1.weight.npy");
  EXPECT_EQ(TensorFileName("layer1.0.bn1.running_mean"), "layer1.0.bn1.running_mean.npy");
  EXPECT_EQ(TensorFileName("a/b%c"), "a%2Fb%25c.npy");
  EXPECT_EQ(TensorFileName(".."), "%2E%2E.npy");
}

TEST(ExecutorTest, HalfAndBFloat16RoundToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);  // overflow to infinity
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  for (int i = -256; i <= 256; ++i) {
    const float x = static_cast<float>(i) / 64;  // 8 significant bits: exact in both
    EXPECT_EQ(HalfToFloat(FloatToHalf(x)), x);
    EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(x)), x);
  }
}

TEST(ExecutorTest, ChromeTraceHasComputeCopyAndCounterTracks) {
  const Graph g = ShapedRandomDag(12, 9);
  const Schedule s = OffloadEverything(g, BaselineSchedule(g));
  SimBackend backend;
  auto r = Execute(g, s, backend);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string text = ChromeTrace(g, *r).dump();
  const nlohmann::json trace = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(trace.is_discarded());
  ASSERT_TRUE(trace["traceEvents"].is_array());
  int compute = 0, copy = 0, counters = 0, names = 0;
  for (const auto& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid"));
    const std::string ph = e["ph"];
    if (ph == "X") {
      ASSERT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("tid"));
      EXPECT_GE(e["dur"].get<double>(), 0);
      (e["tid"] == 1 ? compute : copy) += 1;
    } else if (ph == "C") {
      ++counters;
      EXPECT_TRUE(e["args"].contains("bytes"));
    } else if (ph == "M") {
      ++names;
    }
  }
  int computes = 0, copies = 0;
  for (const Step& step : s.steps) {
    computes += step.action == Action::kCompute;
    copies += step.action == Action::kOffload || step.action == Action::kPrefetch;
  }
  EXPECT_EQ(compute, computes);
  EXPECT_EQ(copy, copies);
  EXPECT_GT(copies, 0);
  EXPECT_EQ(counters, 2 + 4 * static_cast<int>(s.steps.size()));
  EXPECT_EQ(names, 3);
}

TEST(ExecutorTest, MemoryLogGroupsStepsByModuleAndPhase) {
  EXPECT_EQ(ModuleOf("grad:layer1.0.conv1.weight"), "layer1.0.conv1");
  EXPECT_EQ(ModuleOf("layer1.0.bn1.stats"), "layer1.0.bn1");
  EXPECT_EQ(ModuleOf("grad:relu2#1"), "relu2");
  EXPECT_EQ(ModuleOf("clip_square:conv1.weight"), "conv1");
  EXPECT_EQ(ModuleOf("exp_avg_sq:fc.bias"), "fc");
  EXPECT_EQ(ModuleOf("momentum_buffer:fc.weight#1"), "fc");
  EXPECT_EQ(ModuleOf("gather:layers.3.attn.weight"), "layers.3.attn");  // a sharded step's
  EXPECT_EQ(ModuleOf("local_grad:fc.bias"), "fc");
  EXPECT_EQ(ModuleOf("clip_sum:3"), "clip_sum:3");
  EXPECT_EQ(ModuleOf("conv1"), "conv1");
  auto g = BuildModel("conv3d:n=4");
  ASSERT_TRUE(g.ok());
  SimBackend backend;
  auto r = Execute(*g, BaselineSchedule(*g), backend);
  ASSERT_TRUE(r.ok());
  const std::vector<MemoryLogRow> rows = MemoryLog(*g, *r);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.front().module, "conv1");
  EXPECT_EQ(rows.front().phase, "forward");
  EXPECT_EQ(rows.back().phase, "backward");
  // Deltas add up to the final total; rows tile the steps.
  int64_t total = r->predicted.initial_bytes;
  int next = 0;
  for (const MemoryLogRow& row : rows) {
    EXPECT_EQ(row.first_step, next);
    next = row.last_step + 1;
    total += row.delta_bytes;
    EXPECT_EQ(total, row.total_bytes);
    EXPECT_EQ(row.total_bytes, r->steps[row.last_step].resident_bytes);
  }
  EXPECT_EQ(next, static_cast<int>(r->steps.size()));
  bool saw_conv3_backward = false;
  for (const MemoryLogRow& row : rows) {
    saw_conv3_backward |= row.module == "conv3" && row.phase == "backward";
  }
  EXPECT_TRUE(saw_conv3_backward);
}

// ---- The real CPU kernels.

struct CpuCase {
  std::string model;
  // Policies to compare with the baseline; empty: every registered one but
  // the slow exact searches (their plans take the same executor path).
  std::vector<std::string> policies;
};

// ctest names the instances by model, not by the struct's bytes.
void PrintTo(const CpuCase& c, std::ostream* os) { *os << c.model; }

class ExecutorCpuTest : public ::testing::TestWithParam<CpuCase> {};

TEST_P(ExecutorCpuTest, EveryPolicyGivesTheBaselinesGradientsBitwise) {
  const CpuCase& c = GetParam();
  auto backend = MakeCpuBackend();
  auto g = BuildModel(c.model);
  ASSERT_TRUE(g.ok()) << g.status();
  if (absl::Status s = backend->CheckSupported(*g); !s.ok()) {
    GTEST_SKIP() << c.model << " cannot run on the CPU backend yet: " << s.message();
  }
  auto base = Execute(*g, BaselineSchedule(*g), *backend);
  ASSERT_TRUE(base.ok()) << c.model << ": " << base.status();
  ASSERT_TRUE(base->loss.has_value());
  EXPECT_TRUE(std::isfinite(*base->loss)) << c.model;
  EXPECT_EQ(base->peak_bytes, base->predicted.peak_bytes);
  for (const HostTensor& t : base->outputs) {  // no NaN: nothing read the poison
    if (t.array.dtype != DType::kFloat32) continue;
    const float* x = reinterpret_cast<const float*>(t.array.data.data());
    for (int64_t i = 0; i < NumElements(t.array.shape); ++i) {
      ASSERT_TRUE(std::isfinite(x[i])) << g->id(t.node) << "[" << i << "]";
    }
  }
  auto baseline_peak = BaselinePeak(*g);
  ASSERT_TRUE(baseline_peak.ok());
  std::vector<std::string> policies = c.policies;
  if (policies.empty()) {
    for (const PolicyInfo* info : PlannerRegistry::Global().List()) {
      if (info->name != "exact" && info->name != "exact-order" && info->name != "checkmate") {
        policies.push_back(info->name);
      }
    }
  }
  int ran = 0;
  for (const std::string& name : policies) {
    const PolicyInfo* info = PlannerRegistry::Global().Find(name);
    if (info == nullptr) continue;  // not in this build
    PlannerOptions po;
    po.budget_bytes = *baseline_peak * 6 / 10;
    po.time_limit_s = 5;
    auto plan = info->factory()->Plan(*g, po);
    if (!plan.ok()) continue;  // the policy refuses this graph
    const std::string label = absl::StrCat(c.model, " ", name);
    auto r = Execute(*g, plan->schedule, *backend);
    ASSERT_TRUE(r.ok()) << label << ": " << r.status();
    EXPECT_EQ(r->peak_bytes, plan->report.peak_bytes) << label;
    EXPECT_EQ(r->arena_bytes, r->layout.arena_bytes) << label;
    ExpectSameOutputs(*base, *r, *g, label);
    ++ran;
  }
  EXPECT_GE(ran, 2) << c.model;
}

// One policy of each kind on the larger graphs; all of them on the small ones.
const std::vector<std::string> kOnePerKind = {"best-order", "sqrtn", "checkmate-lp", "hybrid"};

INSTANTIATE_TEST_SUITE_P(
    Zoo, ExecutorCpuTest,
    ::testing::Values(CpuCase{"tanh-chain:length=6,size=1000", {}}, CpuCase{"conv3d:n=6", {}},
                      CpuCase{"mnist-cnn:batch=2", {}},
                      CpuCase{"transformer:layers=1,seq=16,dim=32,heads=2,batch=1,vocab=50", {}},
                      CpuCase{"resnet18:batch=1,image=32", kOnePerKind},
                      CpuCase{"unet3d:batch=1,variant=small,depth=8,height=8,width=8",
                              kOnePerKind}),
    [](const ::testing::TestParamInfo<CpuCase>& param_info) {
      std::string name = param_info.param.model.substr(0, param_info.param.model.find(':'));
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace pebble
