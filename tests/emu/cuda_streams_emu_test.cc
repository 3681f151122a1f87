// The whole CUDA backend on the host emulator (runtime/cuda/emu/,
// docs/cuda.md "Host emulation"): what only the emulator can show.
//  - Plans that recompute and plans that offload (conv3d, mnist-cnn,
//    unet3d) give the baseline's bits and their planned peak under each
//    stream schedule, including the two lazy
//    ones in which one stream runs as late as its events allow: a missing
//    event between compute and copies shows there as wrong bits. A backend
//    that drops the executor's waits is caught, so the check can fail.
//  - cuDNN refusals (from the heuristics, or only from the call) take the
//    split fallback, whose results match the unsplit ones; a refused
//    algorithm gives way to the next candidate first; TF32 runs only when
//    even the split is refused.
//  - Only deterministic algorithms in FMA math run on fp32 data.
//  - No device is a clear error; a backend returns every byte it took;
//    growing the scratch does not wait for the device; overlapping copies
//    (undefined on the device) fail.
// tests/cuda_backend_test.cc, linked into the same binary, runs the device
// tests on the emulated device too.
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/models/models.h"
#include "graph/status.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/emu/host_dnn.h"
#include "runtime/cuda/emu/host_runtime.h"
#include "runtime/executor.h"
#include "runtime/make_backend.h"
#include "scheduler/budget.h"
#include "scheduler/planner.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;
namespace emu = ::pebble::cuda::emu;

// Restores the emulator's defaults when a test ends, however it ends.
class EmulatorDefaults {
 public:
  ~EmulatorDefaults() {
    emu::SetStreamSchedule(emu::StreamSchedule::kImmediate);
    emu::SetConvRefusal({});
    emu::SetAlgorithmRefusal({});
    emu::SetDeviceMemoryLimit(0);
    emu::SetDeviceCount(1);
  }
};

const char* ScheduleName(emu::StreamSchedule s) {
  switch (s) {
    case emu::StreamSchedule::kImmediate:
      return "immediate";
    case emu::StreamSchedule::kLazyOldestFirst:
      return "copies late";
    case emu::StreamSchedule::kLazyNewestFirst:
      return "computes late";
  }
  return "?";
}


constexpr emu::StreamSchedule kSchedules[] = {
    emu::StreamSchedule::kImmediate, emu::StreamSchedule::kLazyOldestFirst,
    emu::StreamSchedule::kLazyNewestFirst};

using ::pebble::testing::Bytes;
using ::pebble::testing::Cuda;
using ::pebble::testing::ExpectClose;
using ::pebble::testing::kEmulatedUnet3d;
using ::pebble::testing::Floats;
using ::pebble::testing::Model;
using ::pebble::testing::PlanFor;
using ::pebble::testing::RunPlan;

// Whether every output has the reference's bits.
bool SameBits(const ExecutionResult& a, const ExecutionResult& b) {
  if (a.outputs.size() != b.outputs.size()) return false;
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    if (Bytes(a.outputs[i]) != Bytes(b.outputs[i])) return false;
  }
  return true;
}

int CountCopies(const Schedule& s) {
  int copies = 0;
  for (const Step& step : s.steps) {
    copies += step.action == Action::kOffload || step.action == Action::kPrefetch;
  }
  return copies;
}

// The plans the stream tests run, chosen so that the emulated runs stay
// short (a host step of unet3d takes seconds): every policy that plans
// conv3d quickly, at its tightest fit among 70%, 80% and 90% of the
// baseline's peak or at its minimum (tests/test_util.h), which gives the
// recomputing plans; the offload policies at their minimum on mnist-cnn
// and unet3d, the only budgets at which they move tensors on these graphs.
struct NamedPlan {
  std::string model, policy;
  PlanResult plan;
};

std::vector<NamedPlan> StreamPlans() {
  std::vector<NamedPlan> plans;
  auto add = [&](const std::string& model, const std::string& policy, bool at_min) {
    const Graph g = Model(model);
    auto base = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
    if (!base.ok()) return;
    std::optional<PlanResult> plan;
    if (at_min) {
      auto p = PlanFor(g, policy, kMinBudgetBytes);
      if (p.ok() && p->feasible) plan = *std::move(p);
    } else {
      plan = ::pebble::testing::TightPlan(g, policy, base->report.peak_bytes);
    }
    if (plan.has_value()) plans.push_back({model, policy, *std::move(plan)});
  };
  for (const PolicyInfo* info : PlannerRegistry::Global().List()) {
    if (info->name == "exact" || info->name == "checkmate" ||
        info->name == "exact-order" || info->name == "revolve" ||
        info->name == "tree") {
      continue;  // too slow, or refuse these graphs
    }
    add("conv3d:n=12,batch=2", info->name, false);
  }
  for (const char* policy : {"swap", "hybrid", "vdnn"}) add("mnist-cnn:batch=8", policy, true);
  add(kEmulatedUnet3d, "vdnn", true);
  return plans;
}

TEST(EmulatedStreamsTest, EveryPlanGivesTheBaselineBitsUnderEveryStreamSchedule) {
  EmulatorDefaults restore;
  std::map<std::string, ExecutionResult> reference;
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  int with_copies = 0, with_recompute = 0;
  for (const NamedPlan& p : StreamPlans()) {
    const Graph g = Model(p.model);
    if (reference.count(p.model) == 0) {
      auto base = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
      ASSERT_TRUE(base.ok()) << base.status();
      auto run = RunPlan(g, base->schedule, *gpu);
      ASSERT_TRUE(run.ok()) << run.status();
      reference.emplace(p.model, *std::move(run));
    }
    with_copies += CountCopies(p.plan.schedule) > 0;
    with_recompute += p.plan.report.recomputations > 0;
    for (emu::StreamSchedule schedule : kSchedules) {
      // (the U-Net's plan under the two lazy schedules alone, the ones that
      // reorder the streams' work: each run takes seconds here)
      if (p.model == kEmulatedUnet3d && schedule == emu::StreamSchedule::kImmediate) continue;
      SCOPED_TRACE(absl::StrCat(p.model, ", ", p.policy, ", ", ScheduleName(schedule)));
      emu::SetStreamSchedule(schedule);
      auto run = RunPlan(g, p.plan.schedule, *gpu);
      emu::SetStreamSchedule(emu::StreamSchedule::kImmediate);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_TRUE(SameBits(*run, reference.at(p.model)))
          << "outputs differ from the baseline's";
      EXPECT_EQ(run->peak_bytes, p.plan.report.peak_bytes);
      EXPECT_EQ(run->arena_bytes, run->layout.arena_bytes);
    }
  }
  EXPECT_GE(with_copies, 3) << "too few plans move tensors to the host";
  EXPECT_GE(with_recompute, 4) << "too few plans recompute";
}

// The CUDA backend without its waits: compute and copies are ordered by
// nothing but the stream schedule.
class NoWaitBackend final : public Backend {
 public:
  explicit NoWaitBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::string Description() const override { return inner_->Description(); }
  absl::Status CheckSupported(const Graph& g) const override {
    return inner_->CheckSupported(g);
  }
  absl::StatusOr<std::byte*> AllocateDevice(int64_t bytes) override {
    return inner_->AllocateDevice(bytes);
  }
  void FreeDevice(std::byte* p) override { inner_->FreeDevice(p); }
  absl::StatusOr<std::byte*> AllocateHost(int64_t bytes) override {
    return inner_->AllocateHost(bytes);
  }
  void FreeHost(std::byte* p) override { inner_->FreeHost(p); }
  BackendMemoryStats MemoryStats() const override { return inner_->MemoryStats(); }
  absl::Status Upload(std::byte* dst, const void* src, int64_t bytes) override {
    return inner_->Upload(dst, src, bytes);
  }
  absl::Status Download(void* dst, const std::byte* src, int64_t bytes) override {
    return inner_->Download(dst, src, bytes);
  }
  absl::Status Fill(std::byte* dst, uint8_t value, int64_t bytes) override {
    return inner_->Fill(dst, value, bytes);
  }
  absl::Status Compute(const KernelContext& ctx) override { return inner_->Compute(ctx); }
  absl::Status Copy(CopyDirection d, std::byte* dst, const std::byte* src,
                    int64_t bytes) override {
    return inner_->Copy(d, dst, src, bytes);
  }
  absl::StatusOr<EventId> Record(Stream s) override { return inner_->Record(s); }
  absl::Status Wait(Stream, EventId) override { return absl::OkStatus(); }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::StatusOr<double> ElapsedSeconds(EventId a, EventId b) const override {
    return inner_->ElapsedSeconds(a, b);
  }
  void ResetEvents() override { inner_->ResetEvents(); }

 private:
  std::unique_ptr<Backend> inner_;
};


TEST(EmulatedStreamsTest, DroppedWaitsAreCaughtByTheLazySchedules) {
  EmulatorDefaults restore;
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  NoWaitBackend careless(Cuda());
  int caught[3] = {0, 0, 0}, offload_plans = 0;
  for (const NamedPlan& p : StreamPlans()) {
    // mnist-cnn's: a U-Net step takes seconds here.
    if (CountCopies(p.plan.schedule) == 0 || p.model == kEmulatedUnet3d) continue;
    ++offload_plans;
    const Graph g = Model(p.model);
    auto base = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
    ASSERT_TRUE(base.ok()) << base.status();
    auto reference = RunPlan(g, base->schedule, *gpu);
    ASSERT_TRUE(reference.ok()) << reference.status();
    for (int i = 0; i < 3; ++i) {
      emu::SetStreamSchedule(kSchedules[i]);
      auto run = RunPlan(g, p.plan.schedule, careless);
      emu::SetStreamSchedule(emu::StreamSchedule::kImmediate);
      ASSERT_TRUE(run.ok()) << p.policy << ": " << run.status();
      caught[i] += !SameBits(*run, *reference);
    }
  }
  ASSERT_GT(offload_plans, 0);
  // Run as enqueued, the streams need no events; lazily, each schedule
  // exposes some missing wait.
  EXPECT_EQ(caught[0], 0);
  EXPECT_GT(caught[1], 0) << "copies running late went unnoticed";
  EXPECT_GT(caught[2], 0) << "computes running late went unnoticed";
}

// Runs `g`'s baseline plan on a backend with `options` under `refusal`;
// the outputs must match `whole`'s within fp32 reordering.
// A configuration refused as a whole is split, never run in TF32 instead.
void ExpectSplitMatches(const Graph& g, const ExecutionResult& whole,
                        const emu::ConvRefusal& refusal, bool expect_depth) {
  emu::SetConvRefusal(refusal);
  auto plan = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  const emu::ConvCalls before = emu::GetConvCalls();
  auto run = RunPlan(g, plan->schedule, *gpu);
  emu::SetConvRefusal({});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(emu::GetConvCalls().tf32, before.tf32);
  EXPECT_GT(CudaConvSplitCount(*gpu), 0);
  if (expect_depth) {
    EXPECT_GT(CudaConvDepthSplitCount(*gpu), 0);
  } else {
    EXPECT_EQ(CudaConvDepthSplitCount(*gpu), 0);
  }
  ASSERT_EQ(run->outputs.size(), whole.outputs.size());
  for (size_t i = 0; i < run->outputs.size(); ++i) {
    ExpectClose(Floats(run->outputs[i]), Floats(whole.outputs[i]), 1e-4, 1e-7,
                g.id(run->outputs[i].node));
  }
}

// g's baseline plan and its run on a fresh backend without refusals, which
// splits nothing: what the refusal tests compare with.
void RunBaseline(const Graph& g, PlanResult* plan, ExecutionResult* whole) {
  auto p = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  auto run = RunPlan(g, p->schedule, *gpu);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(CudaConvSplitCount(*gpu), 0);
  *plan = *std::move(p);
  *whole = *std::move(run);
}

TEST(EmulatedCudnnTest, RefusalsTakeTheSplitFallback) {
  EmulatorDefaults restore;
  // conv3d n=12, batch 4: x of conv1 holds 4 * 12^3 = 6912 elements, of
  // conv2 4 * 4 * 12^3.
  const Graph g = Model("conv3d:n=12,batch=4");
  PlanResult plan;
  ExecutionResult whole;
  ASSERT_NO_FATAL_FAILURE(RunBaseline(g, &plan, &whole));
  const int64_t sample = 12 * 12 * 12;
  {
    SCOPED_TRACE("refused by the heuristics above two samples of 8 channels");
    ExpectSplitMatches(g, whole, {2 * 8 * sample, false}, /*expect_depth=*/false);
  }
  {
    SCOPED_TRACE("accepted by the heuristics, refused by the call");
    ExpectSplitMatches(g, whole, {2 * 8 * sample, true}, /*expect_depth=*/false);
  }
  // 6000 elements: one sample of conv2's x (4 channels) or conv3's (8) is
  // refused, a slice of up to 5 planes of 8 channels of 12 x 12 accepted.
  {
    SCOPED_TRACE("one sample refused: depth slices");
    ExpectSplitMatches(g, whole, {6000, false}, /*expect_depth=*/true);
  }
  {
    SCOPED_TRACE("one sample refused only by the call: depth slices");
    ExpectSplitMatches(g, whole, {6000, true}, /*expect_depth=*/true);
  }
}

// cuDNN's heuristics may offer an algorithm that its workspace query or its
// call then refuses. The emulated heuristics offer fp32 forward
// convolutions, asked in FMA math, IMPLICIT_GEMM (no workspace) then GEMM
// (one sample of x); asked in tensor-op math also IMPLICIT_PRECOMP_GEMM in
// TF32. A refused algorithm gives way to the next candidate, not to a
// split; a configuration with no FMA candidate left is split; TF32 runs
// only when even the split is refused.
TEST(EmulatedCudnnTest, ARefusedAlgorithmGivesWayToTheNextCandidate) {
  EmulatorDefaults restore;
  const Graph g = Model("conv3d:n=8,batch=2");
  PlanResult plan;
  ExecutionResult whole;
  ASSERT_NO_FATAL_FAILURE(RunBaseline(g, &plan, &whole));
  EXPECT_TRUE(whole.backend_counters.empty());
  constexpr int kImplicit = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  constexpr int kGemm = CUDNN_CONVOLUTION_FWD_ALGO_GEMM;
  constexpr int kPrecomp = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  // x of conv3 holds 2 samples of 8 x 8^3 = 8192 elements, conv2's and
  // conv1's fewer.
  constexpr int64_t kOneSampleOfConv3 = 8 * 512;
  struct Case {
    const char* name;
    emu::AlgorithmRefusal refusal;
    bool splits;
    bool tf32;
  };
  const Case cases[] = {
      {"IMPLICIT_GEMM refused by its workspace query: GEMM", {{kImplicit}, false},
       false, false},
      {"IMPLICIT_GEMM refused by its call: GEMM", {{kImplicit}, true}, false, false},
      {"both FMA algorithms refused above one sample of conv3: split, not TF32",
       {{kImplicit, kGemm}, true, kOneSampleOfConv3}, true, false},
      {"both FMA algorithms refused at every size: split, then TF32",
       {{kImplicit, kGemm}, true}, true, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    emu::SetAlgorithmRefusal(c.refusal);
    auto gpu = Cuda();
    ASSERT_NE(gpu, nullptr);
    const emu::ConvCalls before = emu::GetConvCalls();
    auto run = RunPlan(g, plan.schedule, *gpu);
    emu::SetAlgorithmRefusal({});
    ASSERT_TRUE(run.ok()) << run.status();
    const emu::ConvCalls after = emu::GetConvCalls();
    EXPECT_EQ(CudaConvSplitCount(*gpu) > 0, c.splits);
    EXPECT_GT(CudaConvAlgorithmRefusalCount(*gpu), 0);
    EXPECT_EQ(run->backend_counters["conv_algorithm_refusals"],
              CudaConvAlgorithmRefusalCount(*gpu));
    // The fallbacks need workspace the plan did not give (0 bytes): the
    // emulated call fails unless the backend passes enough scratch.
    if (c.tf32) {
      EXPECT_GT(after.tf32, before.tf32);
      EXPECT_EQ(CudaConvTf32CallCount(*gpu), after.tf32 - before.tf32);
      EXPECT_EQ(run->backend_counters["conv_tf32_calls"], CudaConvTf32CallCount(*gpu));
      EXPECT_GT(run->backend_counters["conv_fma_exhausted"], 0);
      // TF32 keeps 10 mantissa bits (relative rounding 2^-11 per operand);
      // through batch norm and the backward pass the weight gradients move
      // by up to about 2% of the largest one here.
      for (size_t i = 0; i < run->outputs.size(); ++i) {
        ExpectClose(Floats(run->outputs[i]), Floats(whole.outputs[i]), 5e-2, 1e-6,
                    g.id(run->outputs[i].node));
      }
      // The next run of the plan takes the path the first one found at once
      // (no refusal left to learn) and gives the same bits, as
      // recomputation needs.
      emu::SetAlgorithmRefusal(c.refusal);
      auto again = RunPlan(g, plan.schedule, *gpu);
      emu::SetAlgorithmRefusal({});
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_TRUE(SameBits(*again, *run));
      EXPECT_EQ(again->backend_counters.count("conv_algorithm_refusals"), 0u);
      EXPECT_GT(again->backend_counters["conv_tf32_calls"], 0);
    } else {
      EXPECT_EQ(after.tf32, before.tf32);
      EXPECT_EQ(CudaConvTf32CallCount(*gpu), 0);
      // GEMM sums as IMPLICIT_GEMM does, and a forward split along the
      // batch sums each output as the whole does.
      EXPECT_TRUE(SameBits(*run, whole));
    }
  }
  {
    SCOPED_TRACE("every forward algorithm refused by its call: split, TF32, then an error");
    emu::SetAlgorithmRefusal({{kImplicit, kGemm, kPrecomp}, true});
    auto gpu = Cuda();
    ASSERT_NE(gpu, nullptr);
    auto run = RunPlan(g, plan.schedule, *gpu);
    emu::SetAlgorithmRefusal({});
    ASSERT_FALSE(run.ok());
    EXPECT_EQ(run.status().code(), absl::StatusCode::kUnimplemented) << run.status();
    const std::string message(run.status().message());
    EXPECT_THAT(message, HasSubstr("node 'conv1' (op conv3d)"));
    EXPECT_THAT(message, HasSubstr("cuDNN refused the call of algorithm"));
    EXPECT_THAT(message, HasSubstr("(TF32 algorithms were tried too)"));
    EXPECT_GT(CudaConvSplitCount(*gpu), 0);
  }
}

// A 2-D sample cannot be split further: refused in FMA math, it is marked
// at once and runs in TF32 (mnist-cnn's two 5 x 5 convolutions, both FMA
// forward algorithms refused at every size).
TEST(EmulatedCudnnTest, ARefused2dSampleRunsInTf32) {
  EmulatorDefaults restore;
  const Graph g = Model("mnist-cnn:batch=2");
  PlanResult plan;
  ExecutionResult whole;
  ASSERT_NO_FATAL_FAILURE(RunBaseline(g, &plan, &whole));
  emu::SetAlgorithmRefusal(
      {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_GEMM}, true});
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  auto run = RunPlan(g, plan.schedule, *gpu);
  emu::SetAlgorithmRefusal({});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_GT(CudaConvSplitCount(*gpu), 0);  // the batch of 2 first
  EXPECT_EQ(CudaConvDepthSplitCount(*gpu), 0);
  // One mark per forward convolution's sample configuration.
  EXPECT_EQ(run->backend_counters["conv_fma_exhausted"], 2);
  EXPECT_GT(CudaConvTf32CallCount(*gpu), 0);
  // TF32 moves the convolutions' outputs by about 1e-3, enough to flip
  // ReLU masks and max-pool choices here, so the gradients are far from the
  // FMA run's (by up to 13% of the largest one); the loss stays close.
  ASSERT_TRUE(run->loss.has_value() && whole.loss.has_value());
  EXPECT_NEAR(*run->loss, *whole.loss, 1e-2 * std::abs(*whole.loss));
  for (const auto& out : run->outputs) {
    for (float v : Floats(out)) ASSERT_TRUE(std::isfinite(v)) << g.id(out.node);
  }
}

// A depth slice whose algorithm the call refuses after the slice's probe
// accepted it: the next candidate (GEMM) needs workspace the slice plan did
// not set aside, so the slices are planned again with it (at the same
// count) rather than failing.
TEST(EmulatedCudnnTest, ADepthSliceWhoseAlgorithmIsRefusedStillRuns) {
  EmulatorDefaults restore;
  const Graph g = Model("conv3d:n=12,batch=4");
  PlanResult plan;
  ExecutionResult whole;
  ASSERT_NO_FATAL_FAILURE(RunBaseline(g, &plan, &whole));
  // As in RefusalsTakeTheSplitFallback: one sample of conv2 or conv3 is
  // refused, depth slices of up to 5 planes are accepted.
  emu::SetConvRefusal({6000, false});
  emu::SetAlgorithmRefusal({{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM}, true});
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  auto run = RunPlan(g, plan.schedule, *gpu);
  emu::SetConvRefusal({});
  emu::SetAlgorithmRefusal({});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_GT(CudaConvDepthSplitCount(*gpu), 0);
  EXPECT_GT(CudaConvAlgorithmRefusalCount(*gpu), 0);
  for (size_t i = 0; i < run->outputs.size(); ++i) {
    ExpectClose(Floats(run->outputs[i]), Floats(whole.outputs[i]), 1e-4, 1e-7,
                g.id(run->outputs[i].node));
  }
}

TEST(EmulatedCudnnTest, RefusedEvenOnePlanePerSliceIsAnErrorNamingTheNode) {
  EmulatorDefaults restore;
  const Graph g = Model("conv3d:n=8");
  auto plan = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  emu::SetConvRefusal({1, false});  // every convolution
  auto run = RunPlan(g, plan->schedule, *gpu);
  emu::SetConvRefusal({});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("node 'conv1' (op conv3d)"));
  EXPECT_THAT(std::string(run.status().message()),
              HasSubstr("CUDNN_STATUS_NOT_SUPPORTED_SHAPE"));
}

TEST(EmulatedCudnnTest, AnInstallationFaultIsAnErrorNotARefusal) {
  // NOT_SUPPORTED sub-codes about the installation (here a missing
  // sub-library) are not refusals of the configuration: no split, a
  // FailedPrecondition naming the node, the status and cuDNN's last error.
  EmulatorDefaults restore;
  const Graph g = Model("conv3d:n=8,batch=2");
  auto plan = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (bool at_call : {false, true}) {
    SCOPED_TRACE(at_call ? "from the call" : "from the heuristics");
    auto gpu = Cuda();
    ASSERT_NE(gpu, nullptr);
    emu::SetConvRefusal({1, at_call, CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE});
    auto run = RunPlan(g, plan->schedule, *gpu);
    emu::SetConvRefusal({});
    ASSERT_FALSE(run.ok());
    EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition) << run.status();
    const std::string message(run.status().message());
    EXPECT_THAT(message, HasSubstr("node 'conv1' (op conv3d)"));
    EXPECT_THAT(message, HasSubstr("CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE"));
    EXPECT_THAT(message, HasSubstr("emulated refusal"));  // cuDNN's last error
    EXPECT_EQ(CudaConvSplitCount(*gpu), 0);
  }
}

TEST(EmulatedCudnnTest, OnlyDeterministicFmaAlgorithmsRunOnFp32) {
  EmulatorDefaults restore;
  const emu::ConvCalls before = emu::GetConvCalls();
  const Graph g = Model("conv3d:n=12,batch=2");
  auto plan = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  auto first = RunPlan(g, plan->schedule, *gpu);
  auto second = RunPlan(g, plan->schedule, *gpu);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(SameBits(*first, *second));
  const emu::ConvCalls after = emu::GetConvCalls();
  EXPECT_GT(after.total, before.total);
  EXPECT_EQ(after.non_deterministic, before.non_deterministic);
  EXPECT_EQ(after.tf32, before.tf32);
}

TEST(EmulatedDeviceTest, NoDeviceIsAClearError) {
  EmulatorDefaults restore;
  emu::SetDeviceCount(0);
  auto backend = MakeBackend("cuda");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("no CUDA device"));
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("cudaErrorNoDevice"));
  emu::SetDeviceCount(1);
  CudaBackendOptions options;
  options.device = 1;
  auto second = MakeCudaBackend(options);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("1 device(s) present"));
}

// The case of both scratch tests: conv3d n=44 and its baseline plan, with
// the forward IMPLICIT_GEMM refused, so that the forward convolutions run
// GEMM, whose workspace (one sample of x: 44^3 fp32 = 0.3 MiB for conv1,
// 4 x 44^3 = 1.3 MiB for conv2, 8 x 44^3 = 2.7 MiB for conv3) grows the
// scratch three times: to 1, 2 and 3 MiB.
void ScratchGrowingCase(Graph* g, PlanResult* plan) {
  emu::SetAlgorithmRefusal({{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM}, false});
  *g = Model("conv3d:n=44");
  auto p = PlanFor(*g, "baseline", PlannerOptions{}.budget_bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  *plan = *std::move(p);
}

// The kernel scratch grows mid-run (reductions' partial sums, cuDNN
// workspace beyond the plan). cudaMalloc and cudaFree would make every
// stream wait, stalling the copy stream; grown stream-ordered, the first run
// of a plan (which grows the buffer) waits for the device exactly as often
// as the second (which reuses it), and the old buffer is freed only after
// the work that reads it, under every stream schedule.
TEST(EmulatedDeviceTest, GrowingTheScratchDoesNotWaitForTheDevice) {
  EmulatorDefaults restore;
  Graph g;
  PlanResult plan;
  ASSERT_NO_FATAL_FAILURE(ScratchGrowingCase(&g, &plan));
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  const int64_t before = emu::DeviceWideWaits();
  auto first = RunPlan(g, plan.schedule, *gpu);
  ASSERT_TRUE(first.ok()) << first.status();
  const int64_t between = emu::DeviceWideWaits();
  auto second = RunPlan(g, plan.schedule, *gpu);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(first->backend_memory.scratch_bytes_peak, int64_t{1} << 20);
  EXPECT_EQ(between - before, emu::DeviceWideWaits() - between);
  EXPECT_TRUE(SameBits(*first, *second));
  for (emu::StreamSchedule schedule :
       {emu::StreamSchedule::kLazyOldestFirst, emu::StreamSchedule::kLazyNewestFirst}) {
    SCOPED_TRACE(ScheduleName(schedule));
    emu::SetStreamSchedule(schedule);
    auto fresh = Cuda();
    ASSERT_NE(fresh, nullptr);
    auto run = RunPlan(g, plan.schedule, *fresh);
    emu::SetStreamSchedule(emu::StreamSchedule::kImmediate);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE(SameBits(*run, *first));
  }
}

// Growing the scratch near the device's limit: the old buffer's
// stream-ordered free has not run yet when the new buffer is asked for
// (here under the lazy schedule; on a device the pool keeps freed memory
// until a synchronisation), so the first cudaMallocAsync fails; the backend
// waits for the free and tries again rather than failing the run.
TEST(EmulatedDeviceTest, GrowingTheScratchNearTheLimitWaitsForTheOldBuffer) {
  EmulatorDefaults restore;
  Graph g;
  PlanResult plan;
  ASSERT_NO_FATAL_FAILURE(ScratchGrowingCase(&g, &plan));
  auto reference = Cuda();
  ASSERT_NE(reference, nullptr);
  auto whole = RunPlan(g, plan.schedule, *reference);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const int64_t scratch = whole->backend_memory.scratch_bytes_peak;
  ASSERT_EQ(scratch, int64_t{3} << 20);
  reference.reset();
  // Room for the index-check word, the arena and the 3 MiB scratch, with
  // half a MiB to spare: not for the 2 MiB buffer beside the 3 MiB one.
  emu::SetDeviceMemoryLimit(emu::DeviceBytesInUse() + 256 + whole->arena_bytes + scratch +
                            (int64_t{1} << 19));
  emu::SetStreamSchedule(emu::StreamSchedule::kLazyOldestFirst);
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  auto run = RunPlan(g, plan.schedule, *gpu);
  emu::SetStreamSchedule(emu::StreamSchedule::kImmediate);
  emu::SetDeviceMemoryLimit(0);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(SameBits(*run, *whole));
}

TEST(EmulatedDeviceTest, ABackendReturnsEveryDeviceByte) {
  EmulatorDefaults restore;
  const int64_t before = emu::DeviceBytesInUse();
  {
    const Graph g = Model("conv3d:n=8");
    auto gpu = Cuda();
    ASSERT_NE(gpu, nullptr);
    auto base = PlanFor(g, "baseline", PlannerOptions{}.budget_bytes);
    ASSERT_TRUE(base.ok()) << base.status();
    auto run = RunPlan(g, base->schedule, *gpu);
    ASSERT_TRUE(run.ok()) << run.status();
    // The arena went back after the run; the index-check word (one
    // 256-byte granule) and the kernel scratch stay with the backend.
    EXPECT_EQ(emu::DeviceBytesInUse(),
              before + 256 + gpu->MemoryStats().scratch_bytes_peak);
    // The driver view counts the context and whatever is still allocated.
    EXPECT_GE(gpu->MemoryStats().driver_bytes_in_use, emu::kContextBytes);
  }
  EXPECT_EQ(emu::DeviceBytesInUse(), before);
}

TEST(EmulatedDeviceTest, OverlappingCopiesFail) {
  // Undefined on the device; the emulator refuses them (host_runtime.cc).
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  char* b = static_cast<char*>(p);
  EXPECT_EQ(cudaMemcpyAsync(b + 8, b, 64, cudaMemcpyDeviceToDevice, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(b, b + 63, 64, cudaMemcpyDeviceToDevice, nullptr),
            cudaErrorInvalidValue);
  // Rows 128 bytes apart: the source's span [0, 320) meets the
  // destination's [256, 576).
  EXPECT_EQ(cudaMemcpy2DAsync(b + 256, 128, b, 128, 64, 3, cudaMemcpyDeviceToDevice, nullptr),
            cudaErrorInvalidValue);
  // Adjacent spans do not overlap.
  EXPECT_EQ(cudaMemcpyAsync(b + 64, b, 64, cudaMemcpyDeviceToDevice, nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

}  // namespace
}  // namespace pebble
