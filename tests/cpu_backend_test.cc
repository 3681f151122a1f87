// The CPU backend class (runtime/cpu/cpu_backend.cc): memory, events,
// dispatch, errors. Kernels have their own tests.
#include "runtime/cpu/cpu_backend.h"

#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "graph/models/models.h"
#include "graph/net_builder.h"
#include "graph/status.h"
#include "gtest/gtest.h"
#include "runtime/executor.h"
#include "runtime/make_backend.h"
#include "runtime/workspace.h"
#include "scheduler/planner.h"
#include "test_util.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

TEST(CpuBackendTest, MadeByName) {
  auto b = MakeBackend("cpu");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "cpu");
  EXPECT_THAT((*b)->Description(), HasSubstr("oneDNN 2."));
  EXPECT_THAT((*b)->Description(), HasSubstr(" thread"));
  EXPECT_GE(CpuBackendThreads(), 1);
}

TEST(CpuBackendTest, AllocationsAreAlignedAndCounted) {
  auto b = MakeCpuBackend();
  std::vector<std::byte*> ptrs;
  for (int64_t bytes : {1, 100, 256, 1000, 0}) {
    auto p = b->AllocateDevice(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_NE(*p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u) << bytes;
    ptrs.push_back(*p);
  }
  EXPECT_EQ(b->MemoryStats().device_bytes_in_use, 1357);
  EXPECT_EQ(b->MemoryStats().device_bytes_peak, 1357);
  b->FreeDevice(ptrs[3]);
  EXPECT_EQ(b->MemoryStats().device_bytes_in_use, 357);
  EXPECT_EQ(b->MemoryStats().device_bytes_peak, 1357);
  auto h = b->AllocateHost(4096);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*h) % 256, 0u);
  EXPECT_EQ(b->MemoryStats().host_bytes_in_use, 4096);
  b->FreeHost(*h);
  EXPECT_EQ(b->MemoryStats().host_bytes_in_use, 0);
  EXPECT_EQ(b->MemoryStats().host_bytes_peak, 4096);
  EXPECT_EQ(b->MemoryStats().driver_bytes_in_use, -1);
  EXPECT_FALSE(b->AllocateDevice(-1).ok());
  // Far more than any machine has: an error, not a crash.
  auto huge = b->AllocateDevice(int64_t{1} << 62);
  EXPECT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (i != 3) b->FreeDevice(ptrs[i]);
  }
  EXPECT_EQ(b->MemoryStats().device_bytes_in_use, 0);
}

TEST(CpuBackendTest, UploadFillCopyDownload) {
  auto b = MakeCpuBackend();
  auto dev = b->AllocateDevice(64);
  auto host = b->AllocateHost(64);
  ASSERT_TRUE(dev.ok() && host.ok());
  std::vector<uint8_t> src(64), dst(64);
  for (int i = 0; i < 64; ++i) src[i] = static_cast<uint8_t>(i * 3);
  ASSERT_TRUE(b->Fill(*dev, 0xFF, 64).ok());
  ASSERT_TRUE(b->Download(dst.data(), *dev, 64).ok());
  for (uint8_t x : dst) EXPECT_EQ(x, 0xFF);
  ASSERT_TRUE(b->Upload(*dev, src.data(), 64).ok());
  ASSERT_TRUE(b->Copy(CopyDirection::kDeviceToHost, *host, *dev, 64).ok());
  ASSERT_TRUE(b->Fill(*dev, 0, 64).ok());
  ASSERT_TRUE(b->Copy(CopyDirection::kHostToDevice, *dev, *host, 64).ok());
  ASSERT_TRUE(b->Download(dst.data(), *dev, 64).ok());
  EXPECT_EQ(dst, src);
  b->FreeDevice(*dev);
  b->FreeHost(*host);
}

TEST(CpuBackendTest, EventsAreTimestamps) {
  auto b = MakeCpuBackend();
  auto e0 = b->Record(Stream::kCompute);
  auto e1 = b->Record(Stream::kCopy);
  ASSERT_TRUE(e0.ok() && e1.ok());
  EXPECT_TRUE(b->Wait(Stream::kCompute, *e1).ok());
  EXPECT_TRUE(b->Synchronize().ok());
  auto dt = b->ElapsedSeconds(*e0, *e1);
  ASSERT_TRUE(dt.ok());
  EXPECT_GE(*dt, 0);
  EXPECT_LT(*dt, 1);
  EXPECT_FALSE(b->ElapsedSeconds(*e0, 99).ok());
  EXPECT_FALSE(b->Wait(Stream::kCopy, -1).ok());
  b->ResetEvents();
  EXPECT_FALSE(b->ElapsedSeconds(*e0, *e1).ok());
}

TEST(CpuBackendTest, CheckSupportedNamesEveryMissingOpAndANode) {
  auto b = MakeCpuBackend();
  // Generic nodes with shapes: no CPU kernel for op 'generic' or 'mystery'.
  NodeSpec x = testing::Persistent("x", 16);
  x.shape = Shape{4};
  x.dtype = DType::kFloat32;
  NodeSpec a = testing::Node("a", 16, {"x"});
  a.op = "mystery";
  a.shape = Shape{4};
  a.dtype = DType::kFloat32;
  NodeSpec c = a;
  c.id = "c";
  c.inputs = {"a"};
  NodeSpec d = testing::Node("d", 16, {"c"});
  d.shape = Shape{4};
  d.dtype = DType::kFloat32;
  const Graph g = testing::MakeGraph({x, a, c, d}, {"d"});
  absl::Status s = b->CheckSupported(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("mystery (node 'a')"));
  EXPECT_THAT(s.message(), HasSubstr("generic (node 'd')"));
  // No shape: InvalidArgument naming the node.
  const Graph bare = testing::MakeGraph({testing::Persistent("x", 4), testing::Node("y", 4, {"x"})},
                                        {"y"});
  s = b->CheckSupported(bare);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'x'"));
}

TEST(CpuBackendTest, ComputeOfAnUnknownOpIsAnError) {
  auto b = MakeCpuBackend();
  NodeSpec x = testing::Persistent("x", 16);
  x.shape = Shape{4};
  x.dtype = DType::kFloat32;
  NodeSpec a = testing::Node("a", 16, {"x"});
  a.op = "mystery";
  a.shape = Shape{4};
  a.dtype = DType::kFloat32;
  const Graph g = testing::MakeGraph({x, a}, {"a"});
  std::vector<float> in(4, 1.0f), out(4);
  KernelContext ctx;
  ctx.graph = &g;
  ctx.node = g.Find("a");
  ctx.inputs = {TensorView{reinterpret_cast<std::byte*>(in.data()), {4}, DType::kFloat32}};
  ctx.output = TensorView{reinterpret_cast<std::byte*>(out.data()), {4}, DType::kFloat32};
  absl::Status s = b->Compute(ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("mystery"));
}

TEST(CpuBackendTest, KernelErrorsAreWrappedWithTheOp) {
  // A relu given an operand of the wrong size must be refused by the kernel
  // (not crash); the backend names the op.
  auto g = BuildModel("conv3d:n=4");
  ASSERT_TRUE(g.ok());
  const NodeId relu = g->Find("relu1");
  if (CpuKernels().Find("relu") == nullptr) GTEST_SKIP() << "no relu kernel yet";
  auto b = MakeCpuBackend();
  std::vector<float> in(16, 1.0f), out(256);  // in: 64 bytes, as the i64 view says
  KernelContext ctx;
  ctx.graph = &*g;
  ctx.node = relu;
  ctx.inputs = {TensorView{reinterpret_cast<std::byte*>(in.data()), {2, 4}, DType::kInt64}};
  ctx.output = TensorView{reinterpret_cast<std::byte*>(out.data()), *g->shape(relu),
                          DType::kFloat32};
  absl::Status s = b->Compute(ctx);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cpu kernel relu"));
}

TEST(CpuBackendTest, ScratchOutsideThePlanIsReported) {
  auto b = MakeCpuBackend();
  EXPECT_EQ(b->MemoryStats().scratch_bytes_peak, 0);
  NoteCpuKernelScratch(1000);
  NoteCpuKernelScratch(10);
  EXPECT_EQ(b->MemoryStats().scratch_bytes_peak, 1000);
  auto fresh = MakeCpuBackend();
  EXPECT_EQ(fresh->MemoryStats().scratch_bytes_peak, 0);
}

// One baseline step of `g` on a fresh CPU backend.
absl::StatusOr<ExecutionResult> BaselineStep(const Graph& g) {
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner("baseline"));
  ASSIGN_OR_RETURN(PlanResult plan, planner->Plan(g, PlannerOptions{}));
  auto backend = MakeCpuBackend();
  ExecutorOptions options;
  options.seed = 3;
  return Execute(g, plan.schedule, *backend, options);
}

// Note [Planned scratch]: each kernel's scratch, planned as its node's
// workspace, is carved from the arena, so nothing lies outside the plan;
// unplanned, the same kernels take it outside, with the same results.
TEST(CpuBackendTest, PlannedWorkspaceHoldsEveryKernelScratch) {
  for (const std::string model :
       {"conv3d:n=16", "resnet18:batch=2,image=32", "unet3d:batch=1,variant=small,"
                                                    "dtype=fp16,depth=8,height=8,width=8"}) {
    SCOPED_TRACE(model);
    auto g = BuildModel(model);
    ASSERT_TRUE(g.ok()) << g.status();
    auto backend = MakeCpuBackend();
    WorkspaceQueryStats stats;
    auto planned = WithBackendWorkspace(*g, *backend, &stats);
    ASSERT_TRUE(planned.ok()) << planned.status();
    EXPECT_GT(stats.raised, 0);
    EXPECT_GT(stats.largest_bytes, 0);
    int64_t total = 0;
    for (NodeId v = 0; v < planned->num_nodes(); ++v) {
      EXPECT_GE(planned->workspace(v), g->workspace(v));
      total += planned->workspace(v);
      // Every answer is whole 64-byte pieces.
      EXPECT_EQ(planned->workspace(v) % 64, 0) << planned->id(v);
    }
    EXPECT_GT(total, 0);

    auto outside = BaselineStep(*g);
    auto inside = BaselineStep(*planned);
    ASSERT_TRUE(outside.ok()) << outside.status();
    ASSERT_TRUE(inside.ok()) << inside.status();
    EXPECT_GT(outside->backend_memory.scratch_bytes_peak, 0);
    EXPECT_EQ(inside->backend_memory.scratch_bytes_peak, 0);
    EXPECT_GT(inside->peak_bytes, outside->peak_bytes);
    ASSERT_EQ(inside->outputs.size(), outside->outputs.size());
    for (size_t i = 0; i < inside->outputs.size(); ++i) {
      EXPECT_EQ(inside->outputs[i].array.data, outside->outputs[i].array.data)
          << g->id(inside->outputs[i].node);
    }
  }
}

TEST(CpuBackendTest, WorkspaceQueryIsZeroWhereNoScratchIsTaken) {
  auto g = BuildModel("conv3d:n=8");
  ASSERT_TRUE(g.ok()) << g.status();
  auto backend = MakeCpuBackend();
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    auto bytes = backend->QueryWorkspace(*g, v);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const std::string& op = g->op(v);
    // Own kernels (ReLU, the loss) and persistent tensors take none.
    if (g->persistent(v) || op.rfind("relu", 0) == 0 || op.rfind("mse", 0) == 0) {
      EXPECT_EQ(*bytes, 0) << g->id(v);
    }
  }
  // The probes leave nothing outside a plan behind them.
  EXPECT_EQ(backend->MemoryStats().scratch_bytes_peak, 0);
}

// An operand too large to map for the probe is named with its size, as an
// allocation that fails is (it said "cannot map the operands of the
// workspace probe").
TEST(CpuBackendTest, AWorkspaceProbeOutOfMemoryNamesTheOperandAndItsSize) {
  NetBuilder nb("huge");
  const Value x = nb.Input("x", {4, 8});
  const Value w = nb.Parameter("big.weight", {int64_t{1} << 42, 8});  // 128 TiB
  nb.MarkOutput(nb.Apply("linear", {x, w}, {}, "y"));
  auto g = nb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto backend = MakeCpuBackend();
  auto bytes = backend->QueryWorkspace(*g, g->Find("y"));
  ASSERT_FALSE(bytes.ok());
  EXPECT_THAT(bytes.status().message(),
              ::testing::HasSubstr("workspace query of node 'y' (op linear): out of host memory: "
                                   "cannot map its operand 'big.weight' of 128 TiB "
                                   "(140737488355328 bytes)"));
}

}  // namespace
}  // namespace pebble
