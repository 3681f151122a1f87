// The CUDA backend's op code, run on the host by the emulator
// (runtime/cuda/emu/), against the CPU backend: no GPU needed.
//
// Every node of the training graphs below runs on the CPU backend, and as
// well through the CUDA backend's op code (runtime/cuda/cuda_ops.cc with
// the own kernels, cuda_dnn.cc with the emulated cuDNN and cuBLAS), on the
// CPU backend's inputs, twice: blocks and threads in launch order, then
// reversed. The two
// runs must give the same bits (no kernel depends on thread order), the
// result must equal the CPU backend's within the dtype's rounding (exactly,
// for ops that only move or select values), no launch may break the
// device's limits or fault at a barrier, nothing may be written outside the
// output, and the inputs must be left as they were. The first tests check
// that the emulator itself catches what it claims to.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "graph/half.h"
#include "graph/models/models.h"
#include "graph/net_builder.h"
#include "graph/optimizer.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_ops.h"
#include "runtime/cuda/emu/cuda_emu.h"
#include "runtime/cuda/emu/host_runtime.h"
#include "runtime/executor.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

namespace pebble {
namespace {

namespace emu = cuda::emu;
using ::pebble::testing::TrainingGraph;

// ---- The emulator's own checks, on kernels written here.

// Each block reverses its 256 values through shared memory; with
// `barrier` false a thread may read a slot before its owner wrote it.
template <bool kBarrier>
void ReverseInBlock(const float* in, float* out) {
  static float sh[256];  // __shared__
  sh[pebble::cuda::threadIdx.x] = in[pebble::cuda::blockIdx.x * 256 +
                                     pebble::cuda::threadIdx.x];
  if (kBarrier) __syncthreads();
  out[pebble::cuda::blockIdx.x * 256 + pebble::cuda::threadIdx.x] =
      sh[255 - pebble::cuda::threadIdx.x];
}

std::vector<float> RunReverse(bool barrier, emu::Order order) {
  std::vector<float> in(512), out(512, -1.f);
  for (int i = 0; i < 512; ++i) in[i] = static_cast<float>(i);
  emu::SetOrder(order);
  if (barrier) {
    emu::Launch(2, 256, nullptr, &ReverseInBlock<true>, "reverse")(in.data(),
                                                                    out.data());
  } else {
    emu::Launch(2, 256, nullptr, &ReverseInBlock<false>, "reverse")(
        in.data(), out.data());
  }
  emu::SetOrder(emu::Order::kForward);
  return out;
}

TEST(CudaEmulatorTest, BarriersHoldAndTheTwoOrdersExposeARace) {
  const std::vector<float> a = RunReverse(true, emu::Order::kForward);
  const std::vector<float> b = RunReverse(true, emu::Order::kReverse);
  for (int i = 0; i < 512; ++i) {
    ASSERT_EQ(a[i], static_cast<float>((i / 256) * 256 + 255 - i % 256)) << i;
  }
  EXPECT_EQ(a, b);
  // Without the barrier, forward order reads the upper half of each block
  // before it is written (the previous block's values, or zeros), reverse
  // order after.
  EXPECT_NE(RunReverse(false, emu::Order::kForward),
            RunReverse(false, emu::Order::kReverse));
  EXPECT_TRUE(emu::TakeFaults().empty());
}

void DivergentBarrier(int* out) {
  if (pebble::cuda::threadIdx.x % 2 == 0) return;
  __syncthreads();
  out[pebble::cuda::threadIdx.x] = 1;
}

void TwoBarriers(int* out) {
  if (pebble::cuda::threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[pebble::cuda::threadIdx.x] = 1;
}

TEST(CudaEmulatorTest, DivergentBarriersAreFaults) {
  std::vector<int> out(64, 0);
  emu::Launch(1, 64, nullptr, &DivergentBarrier, "divergent")(out.data());
  std::vector<std::string> faults = emu::TakeFaults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_NE(faults[0].find("32 returned threads never reach"), std::string::npos)
      << faults[0];
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaErrorLaunchFailure);
  emu::ClearStickyError();

  emu::Launch(1, 64, nullptr, &TwoBarriers, "two barriers")(out.data());
  faults = emu::TakeFaults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_NE(faults[0].find("at another site"), std::string::npos) << faults[0];
  emu::ClearStickyError();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

void Touch(int* out) { out[pebble::cuda::threadIdx.x] = 1; }

TEST(CudaEmulatorTest, LaunchLimitsAreTheDevices) {
  std::vector<int> out(2048, 0);
  emu::Launch(1, 1025, nullptr, &Touch, "touch")(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  emu::Launch(dim3(1, 65536), 1, nullptr, &Touch, "touch")(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  emu::Launch(1, dim3(1, 1, 65), nullptr, &Touch, "touch")(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(out[0], 0);  // none of them ran
  emu::Launch(1, 1024, nullptr, &Touch, "touch")(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(std::count(out.begin(), out.end(), 1), 1024);
}

// ---- The own kernels against the CPU backend.

// A node's operands and output in host memory, with guard bytes around the
// output.
constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xA5;
// Poison for outputs and scratch: all-ones bytes are NaN in fp32, fp16,
// bf16 and fp64, and -1 in integers.
constexpr uint8_t kPoison = 0xFF;

struct GuardedBuffer {
  explicit GuardedBuffer(int64_t bytes)
      : storage(static_cast<size_t>(bytes) + 2 * kGuard + 256, kGuardByte) {
    // 256-byte aligned, as device allocations are.
    const auto base = reinterpret_cast<uintptr_t>(storage.data()) + kGuard;
    offset = static_cast<size_t>((base + 255) / 256 * 256 -
                                 reinterpret_cast<uintptr_t>(storage.data()));
    size = static_cast<size_t>(bytes);
    std::memset(storage.data() + offset, kPoison, size);
  }
  std::byte* data() { return reinterpret_cast<std::byte*>(storage.data() + offset); }
  bool GuardsIntact() const {
    for (size_t i = 0; i < storage.size(); ++i) {
      if ((i < offset || i >= offset + size) && storage[i] != kGuardByte) return false;
    }
    return true;
  }
  std::vector<uint8_t> Contents() const {
    return std::vector<uint8_t>(storage.begin() + static_cast<ptrdiff_t>(offset),
                                storage.begin() + static_cast<ptrdiff_t>(offset + size));
  }
  std::vector<uint8_t> storage;
  size_t offset = 0, size = 0;
};

// The tensor's elements as doubles (integers too), for comparison.
std::vector<double> Values(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t size = static_cast<size_t>(DTypeSize(dtype));
  std::vector<double> out(bytes.size() / size);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = bytes.data() + i * size;
    switch (dtype) {
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, p, 4);
        out[i] = f;
        break;
      }
      case DType::kFloat16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = HalfToFloat(h);
        break;
      }
      case DType::kBFloat16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = BFloat16ToFloat(h);
        break;
      }
      case DType::kInt64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        out[i] = static_cast<double>(v);
        break;
      }
      default:
        out[i] = p[0];
        break;
    }
  }
  return out;
}

// Ops that only move, select or count values: the two backends must agree
// bit for bit.
bool IsExactOp(const std::string& op) {
  static const std::set<std::string> exact = {
      "relu", "relu_backward", "maxpool", "maxpool_backward", "concat",
      "slice", "pad", "pad_backward", "copy", "flatten", "reshape", "fill", "constant",
      "split_heads", "split_heads_backward", "merge_heads", "arange",
      "embedding", "dropout_mask", "dropout", "dropout_backward", "add", "mul",
      // runtime/optimizer_math.h: one definition, each operation rounded alone.
      "sgd_momentum", "sgd_update", "adam_exp_avg", "adam_exp_avg_sq", "adam_update",
      "optimizer_step"};
  return exact.count(op) > 0;
}

// The largest error the comparison accepts, relative to the largest
// magnitude of the CPU result. fp16, bf16: two roundings of the output's
// dtype (the backends add in other orders, fp64 here and fp32 lanes there,
// and the host's libm stands in for the device's; the worst seen is under
// half a rounding). fp32: 1e-4, for batchnorm, which the CPU backend
// computes as x * (invstd w) + (b - mean invstd w): with few values per
// channel invstd is large and that sum cancels (2e-5 seen on resnet18's
// 1x1 layer4 maps); every other fp32 op stays within 3e-7.
double RelativeTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 2.0 / 1024;
    case DType::kBFloat16:
      return 2.0 / 128;
    default:
      return 1e-4;
  }
}

struct OpStats {
  int nodes = 0;
  double worst = 0;  // largest relative error seen
  std::string worst_node;
};

// Runs every needed node of `g` as described at the top; records per-op
// statistics in `stats`.
void CompareGraph(const std::string& what, const Graph& g,
                  std::map<std::string, OpStats>& stats) {
  SCOPED_TRACE(what);
  std::vector<std::vector<uint8_t>> values(static_cast<size_t>(g.num_nodes()));
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (!g.persistent(v)) continue;
    auto input = GenerateInput(g, v, /*seed=*/11);
    ASSERT_TRUE(input.ok()) << input.status();
    values[static_cast<size_t>(v)] = std::move(input->data);
  }
  std::vector<uint8_t> scratch;
  cuda::CudaContext cc;
  cc.scratch = [&](int64_t bytes) -> absl::StatusOr<void*> {
    scratch.assign(static_cast<size_t>(bytes), kPoison);
    return static_cast<void*>(scratch.data());
  };
  cuda::IndexFault fault;
  std::memset(&fault, 0xff, sizeof(fault));
  cc.index_fault = &fault;
  // Library handles on the null stream: every call runs when made.
  ASSERT_EQ(cudnnCreate(&cc.cudnn), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cublasCreate(&cc.cublas), CUBLAS_STATUS_SUCCESS);
  struct Handles {
    cuda::CudaContext& cc;
    ~Handles() {
      cudnnDestroy(cc.cudnn);
      cublasDestroy(cc.cublas);
    }
  } handles{cc};

  for (NodeId v : g.topological_order()) {
    if (g.persistent(v) || !g.needed()[static_cast<size_t>(v)]) continue;
    const std::string& op = g.op(v);
    SCOPED_TRACE(absl::StrCat("node '", g.id(v), "' (op ", op, ")"));
    ASSERT_TRUE(g.shape(v).has_value() && g.dtype(v).has_value());
    KernelContext ctx;
    ctx.graph = &g;
    ctx.node = v;
    for (NodeId u : g.inputs(v)) {
      TensorView t;
      t.data = reinterpret_cast<std::byte*>(values[static_cast<size_t>(u)].data());
      t.shape = *g.shape(u);
      t.dtype = *g.dtype(u);
      ctx.inputs.push_back(t);
    }
    ctx.output.shape = *g.shape(v);
    ctx.output.dtype = *g.dtype(v);
    std::vector<uint8_t> workspace(static_cast<size_t>(g.workspace(v)));
    ctx.workspace = reinterpret_cast<std::byte*>(workspace.data());
    ctx.workspace_bytes = g.workspace(v);

    // An in-place update (an optimizer's step) writes its input 0: it gets
    // a copy of input 0's value as its output, and reads input 0 there.
    auto set_output = [&](GuardedBuffer& out) {
      ctx.output.data = out.data();
      if (!g.in_place(v)) return;
      const std::vector<uint8_t>& base = values[static_cast<size_t>(g.inputs(v)[0])];
      std::memcpy(out.data(), base.data(), base.size());
      ctx.inputs[0].data = out.data();
    };
    GuardedBuffer on_cpu(ctx.output.bytes());
    KernelFn cpu_kernel = CpuKernels().Find(op);
    ASSERT_NE(cpu_kernel, nullptr);
    set_output(on_cpu);
    const absl::Status cpu_status = cpu_kernel(ctx);
    ASSERT_TRUE(cpu_status.ok()) << cpu_status;
    values[static_cast<size_t>(v)] = on_cpu.Contents();

    cuda::CudaKernelFn cuda_kernel = cuda::FindCudaKernel(op);
    ASSERT_NE(cuda_kernel, nullptr) << "the CUDA backend has no kernel for " << op;
    std::vector<std::vector<uint8_t>> inputs_before;
    for (NodeId u : g.inputs(v)) inputs_before.push_back(values[static_cast<size_t>(u)]);
    std::vector<uint8_t> results[2];
    for (int run = 0; run < 2; ++run) {
      GuardedBuffer out(ctx.output.bytes());
      set_output(out);
      emu::SetOrder(run == 0 ? emu::Order::kForward : emu::Order::kReverse);
      absl::Status status = cuda_kernel(cc, ctx);
      if (status.ok()) status = cuda::TakeIndexFault(cc);
      emu::SetOrder(emu::Order::kForward);
      const std::vector<std::string> faults = emu::TakeFaults();
      emu::ClearStickyError();
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_TRUE(faults.empty()) << absl::StrJoin(faults, "\n");
      ASSERT_TRUE(out.GuardsIntact()) << "the kernel wrote outside its output";
      results[run] = out.Contents();
    }
    for (size_t i = 0; i < inputs_before.size(); ++i) {
      ASSERT_EQ(inputs_before[i], values[static_cast<size_t>(g.inputs(v)[i])])
          << "the kernel changed input " << i;
    }
    ASSERT_EQ(results[0], results[1])
        << "the result depends on the order of blocks and threads";

    const DType dtype = *g.dtype(v);
    const std::vector<double> got = Values(results[0], dtype);
    const std::vector<double> want = Values(values[static_cast<size_t>(v)], dtype);
    OpStats& s = stats[op];
    ++s.nodes;
    if (IsExactOp(op) || dtype == DType::kInt64 || dtype == DType::kUInt8) {
      // Equal values (a zero's sign aside: relu_backward gives -0 for a
      // negative gradient on the CPU backend, +0 here), NaN where NaN.
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
            << "element " << i << ": " << got[i] << " here, " << want[i]
            << " on the CPU backend";
      }
      continue;
    }
    double scale = 0, err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << "element " << i;
      if (std::isnan(want[i])) continue;
      scale = std::max(scale, std::abs(want[i]));
      const double e = std::abs(got[i] - want[i]);
      if (e > err) {
        err = e;
        worst = i;
      }
    }
    const double relative = scale > 0 ? err / scale : err;
    if (relative > s.worst) {
      s.worst = relative;
      s.worst_node = what + " " + g.id(v);
    }
    EXPECT_LE(relative, RelativeTolerance(dtype))
        << "element " << worst << ": " << got[worst] << " here, " << want[worst]
        << " on the CPU backend (scale " << scale << ")";
  }
}

using ::pebble::testing::Model;
using ::pebble::testing::kEmulatedUnet3d;

using nlohmann::json;

// Element-wise ops (the piecewise-linear activations with points on both
// sides of their kinks; elu and softplus, its threshold within the range;
// log, abs and exp; compares, masked fills and casts), broadcast products and
// sums, a ceil-mode max pool, a transpose, padding of every mode (a
// constant one with a crop), an averaging pool with padding, a copy and a
// sum loss (and their backward ops).
Graph PointwiseGraph() {
  NetBuilder nb("pointwise");
  const Value x = nb.Parameter("x", {2, 3, 5, 7});
  const Value w = nb.Parameter("w", {5, 7});
  Value y = nb.Apply("leaky_relu", {x}, {{"negative_slope", 0.2}});
  y = nb.Apply("hardswish", {y});
  y = nb.Apply("clip", {y}, {{"min", -0.25}, {"max", 0.5}});
  y = nb.Apply("hardsigmoid", {y}, {{"alpha", 2.0}, {"beta", 0.5}});
  y = nb.Apply("tanh", {y});
  y = nb.Apply("sigmoid", {y});
  y = nb.Apply("sqrt", {y});  // of (0, 1)
  y = nb.Apply("gelu", {y}, {{"approximate", "tanh"}});
  y = nb.Apply("erf", {y});
  y = nb.Apply("elu", {y}, {{"alpha", 0.7}, {"scale", 1.5}, {"input_scale", 2.0}});
  y = nb.Apply("softplus", {y}, {{"beta", 2.0}, {"threshold", 1.0}});
  y = nb.Apply("log", {y});  // of a positive tensor
  y = nb.Apply("exp", {nb.Apply("abs", {y})});
  // Masks: a comparison broadcast from (5, 7), one of y by a scalar, their
  // and; masked fills by them, one inverted.
  const Value zero = nb.Apply("fill", {}, {{"shape", Shape{}}, {"value", 0.0}});
  const Value one = nb.Apply("fill", {}, {{"shape", Shape{}}, {"value", 1.0}});
  const Value positive_w = nb.Apply("compare", {w, zero}, {{"op", "gt"}});
  const Value small_y = nb.Apply("compare", {y, one}, {{"op", "le"}});
  y = nb.Apply("masked_fill", {y, positive_w}, {{"value", 0.25}});
  y = nb.Apply("masked_fill", {y, nb.Apply("compare", {small_y, positive_w}, {{"op", "and"}})},
               {{"value", -0.5}, {"invert", true}});
  // Casts: through fp16 and back (its gradient cast back), a mask to
  // floats, w scaled and truncated to i64, then to u8 (negatives wrap),
  // each back to fp32 (Note [Cast values]).
  y = nb.Apply("cast", {nb.Apply("cast", {y}, {{"dtype", "fp16"}})}, {{"dtype", "fp32"}});
  const Value w_ints = nb.Apply(
      "cast", {nb.Apply("mul", {w, nb.Apply("fill", {}, {{"shape", Shape{}}, {"value", 4.0}})})},
      {{"dtype", "i64"}});
  const Value w_bytes = nb.Apply("cast", {w_ints}, {{"dtype", "u8"}});
  y = nb.Apply("add", {y, nb.Apply("cast", {w_ints}, {{"dtype", "fp32"}})});
  y = nb.Apply("add", {y, nb.Apply("cast", {w_bytes}, {{"dtype", "fp32"}})});
  y = nb.Apply("add", {y, nb.Apply("cast", {positive_w}, {{"dtype", "fp32"}})});
  y = nb.Apply("mul", {y, w});
  const Value half = nb.Apply("fill", {}, {{"shape", {5, 7}}, {"value", 0.5}});
  y = nb.Apply("mul", {y, half});
  // A constant of 35 values multiplied in (its bytes in the attr, base64).
  std::vector<float> table(35);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 0.5f + 0.25f * static_cast<float>(i % 6);
  // Seeded noise added in (Note [Random values]: the same on both backends).
  y = nb.Apply("add", {y, nb.Apply("random", {}, {{"shape", {5, 7}}, {"seed", 3}, {"std", 0.1}})});
  y = nb.Apply("mul", {y, nb.Apply("constant", {},
                                   {{"shape", {5, 7}},
                                    {"data", absl::Base64Escape(absl::string_view(
                                                 reinterpret_cast<const char*>(table.data()),
                                                 table.size() * sizeof(float)))}})});
  // Extrema of two computed tensors, and of one with itself (a tie
  // everywhere: half the gradient each way).
  const Value x_tanh = nb.Apply("tanh", {x});
  y = nb.Apply("maximum", {y, x_tanh});
  y = nb.Apply("minimum", {y, nb.Apply("sigmoid", {x})});
  y = nb.Apply("maximum", {y, y});
  // A squeeze-excitation gate and a per-channel shift: broadcasts whose
  // gradients sum over the trailing dims too.
  y = nb.Apply("mul", {nb.Parameter("gate", {2, 3, 1, 1}), y});
  y = nb.Apply("add", {y, nb.Parameter("shift", {3, 1, 1})});
  y = nb.Apply("sub", {nb.Parameter("offset", {3, 1, 1}), y});
  y = nb.Apply("div", {y, nb.Apply("add", {nb.Parameter("scale", {5, 7}),
                                            nb.Apply("fill", {}, {{"shape", {5, 7}},
                                                                  {"value", 2.0}})})});
  y = nb.Apply("pad", {y}, {{"pads", {1, 2, -1, 0}}, {"value", 0.25}});
  y = nb.Apply("pad", {y}, {{"pads", {2, 1, 0, 3}}, {"mode", "reflect"}});
  y = nb.Apply("pad", {y}, {{"pads", {0, 2, 1, 1}}, {"mode", "replicate"}});
  y = nb.Apply("avgpool", {y}, {{"kernel", 3}, {"stride", 2}, {"padding", 1}});
  // Ceil mode: the last window reaches past the input.
  y = nb.Apply("maxpool", {y}, {{"kernel", 2}, {"stride", 2}, {"ceil_mode", true}});
  // Leaving the padding out of the divisor, in ceil mode.
  y = nb.Apply("avgpool", {y}, {{"kernel", 2}, {"stride", 2}, {"padding", 1},
                                {"ceil_mode", true}, {"count_include_pad", false}});
  y = nb.Apply("copy", {y});
  y = nb.Apply("transpose", {y}, {{"perm", {0, 3, 1, 2}}});
  y = nb.Apply("flip", {y}, {{"dims", {1, -1}}});
  y = nb.Dropout(y, 0.3);
  nb.MarkOutput(nb.Apply("sum", {y}, json::object(), "loss"));
  return TrainingGraph(nb);
}

// Interpolating and nearest upsampling, 2-D and 3-D, with and without
// align_corners, by whole factors and to sizes, and adaptive pools whose
// bins overlap.
Graph ResampleGraph() {
  NetBuilder nb("resample");
  const Value x3 = nb.Parameter("x3", {1, 2, 3, 4, 5});
  Value a = nb.Apply("upsample", {x3},
                     {{"scale", 2}, {"mode", "trilinear"}, {"align_corners", true}});
  a = nb.Apply("upsample", {a}, {{"scale", {1, 2, 3}}, {"mode", "nearest"}});
  a = nb.Apply("adaptive_avgpool", {a}, {{"output_size", {5, 3, 7}}});
  const Value x2 = nb.Parameter("x2", {2, 3, 5, 4});
  Value b = nb.Apply("upsample", {x2}, {{"scale", 3}, {"mode", "bilinear"}});
  b = nb.Apply("adaptive_avgpool", {b}, {{"output_size", 4}});
  // Sizes that are not multiples, a fractional scale factor, downsampling.
  b = nb.Apply("upsample", {b}, {{"size", {7, 3}}, {"mode", "bilinear"}});
  b = nb.Apply("upsample", {b}, {{"size", {10, 4}}, {"scale_factor", {1.5, 1.5}},
                                 {"mode", "bilinear"}, {"align_corners", true}});
  b = nb.Apply("upsample", {b}, {{"size", {6, 9}}});
  // Bicubic, with corners aligned and by a fractional factor.
  b = nb.Apply("upsample", {b}, {{"scale", 2}, {"mode", "bicubic"}, {"align_corners", true}});
  b = nb.Apply("upsample", {b}, {{"size", {8, 27}}, {"scale_factor", {0.7, 1.5}},
                                 {"mode", "bicubic"}});
  const Value sa = nb.Apply("sum", {a});
  const Value sb = nb.Apply("sum", {b});
  nb.MarkOutput(nb.Apply("add", {sa, sb}, json::object(), "loss"));
  return TrainingGraph(nb);
}

// One part of a split without its siblings (split_heads_backward), a
// softmax that is not causal, and a log_softmax.
Graph HeadsGraph() {
  NetBuilder nb("heads");
  const Value x = nb.Parameter("x", {2, 4, 12});
  Value q = nb.Apply("split_heads", {x}, {{"heads", 2}, {"chunks", 3}, {"index", 1}});
  q = nb.Apply("softmax", {q});
  q = nb.Apply("log_softmax", {q});
  nb.MarkOutput(nb.Apply("sum", {q}, json::object(), "loss"));
  return TrainingGraph(nb);
}

// nn.BCEWithLogitsLoss of logits against soft targets.
Graph BceGraph() {
  NetBuilder nb("bce");
  const Value x = nb.Parameter("x", {3, 5});
  const Value logits = nb.Apply("mul", {nb.Apply("tanh", {x}),
                                        nb.Apply("fill", {}, {{"shape", Shape{}}, {"value", 4.0}})});
  const Value target = nb.Apply("fill", {}, {{"shape", {3, 5}}, {"value", 0.25}});
  nb.MarkOutput(nb.Apply("bce_with_logits", {logits, target}, json::object(), "loss"));
  return TrainingGraph(nb);
}

Graph WithOptimizer(const Graph& training, const char* optimizer) {
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizer(optimizer);
  PEBBLE_CHECK(spec.ok(), "bad optimizer spec");
  absl::StatusOr<Graph> g = AddOptimizerStep(training, *spec);
  PEBBLE_CHECK(g.ok(), "AddOptimizerStep failed");
  return *std::move(g);
}

struct Case {
  const char* name;
  Graph (*build)();
};

const Case kCases[] = {
    {"conv3d", [] { return Model("conv3d:n=8,batch=2"); }},
    {"mnist_cnn", [] { return Model("mnist-cnn:batch=2"); }},
    {"resnet18", [] { return Model("resnet18:batch=2,image=32"); }},
    {"unet3d", [] { return Model(kEmulatedUnet3d); }},
    {"unet3d_fp16", [] { return Model(kEmulatedUnet3d + ",dtype=fp16"); }},
    {"unet3d_bf16", [] { return Model(kEmulatedUnet3d + ",dtype=bf16"); }},
    {"transformer", [] { return Model("transformer:layers=1,seq=8,dim=16,heads=2,batch=2,vocab=20"); }},
    // The optimizers' in-place updates (graph/optimizer.h).
    {"mnist_cnn_adamw", [] { return Model("mnist-cnn:batch=2,optimizer=adamw"); }},
    {"conv3d_adam", [] { return WithOptimizer(Model("conv3d:n=8,batch=2"), "adam:weight_decay=0.1"); }},
    {"conv3d_sgd_momentum",
     [] { return WithOptimizer(Model("conv3d:n=8,batch=2"), "sgd:momentum=0.9,weight_decay=0.01"); }},
    {"pointwise", PointwiseGraph},
    {"resample", ResampleGraph},
    {"heads", HeadsGraph},
    {"bce", BceGraph},
};

// An index out of range: the device check (CheckIndicesOnDevice, the
// CheckIndices and CaptureIndexFault kernels, TakeIndexFault) reports the
// first bad position in the CPU backend's words, whatever the thread order.
TEST(OwnKernelIndexCheckTest, OutOfRangeIndicesAreReportedInTheCpuBackendsWords) {
  NetBuilder nb("embedding");
  const Value tokens = nb.Input("tokens", {2, 4}, DType::kInt64);
  Value y = nb.Embedding("emb", tokens, 5, 3);
  nb.MarkOutput(nb.Apply("sum", {y}, json::object(), "loss"));
  const Graph g = TrainingGraph(nb);
  const NodeId emb = g.Find("emb");
  ASSERT_NE(emb, kNoNode);
  std::vector<int64_t> indices = {0, 1, 2, 3, 4, 7, 9, -1};
  std::vector<float> weight(15, 1.f), out(24);
  KernelContext ctx;
  ctx.graph = &g;
  ctx.node = emb;
  ctx.inputs = {TensorView{reinterpret_cast<std::byte*>(indices.data()), {2, 4}, DType::kInt64},
                TensorView{reinterpret_cast<std::byte*>(weight.data()), {5, 3}, DType::kFloat32}};
  ctx.output = TensorView{reinterpret_cast<std::byte*>(out.data()), {2, 4, 3}, DType::kFloat32};
  const absl::Status on_cpu = CpuKernels().Find("embedding")(ctx);
  ASSERT_FALSE(on_cpu.ok());
  EXPECT_NE(on_cpu.message().find("index 7 at position 5 is outside [0, 5)"),
            std::string::npos)
      << on_cpu;

  cuda::CudaContext cc;
  cuda::IndexFault fault;
  std::memset(&fault, 0xff, sizeof(fault));
  cc.index_fault = &fault;
  for (emu::Order order : {emu::Order::kForward, emu::Order::kReverse}) {
    emu::SetOrder(order);
    ASSERT_TRUE(cuda::FindCudaKernel("embedding")(cc, ctx).ok());
    const absl::Status on_device = cuda::TakeIndexFault(cc);
    emu::SetOrder(emu::Order::kForward);
    EXPECT_EQ(on_device.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(on_device.message().find(
                  "node 'emb' (op embedding): index 7 at position 5 is outside [0, 5)"),
              std::string::npos)
        << on_device;
    // The word is reset: the next check of good indices finds nothing.
    std::vector<int64_t> good = {0, 1, 2, 3, 4, 0, 1, 2};
    KernelContext good_ctx = ctx;
    good_ctx.inputs[0].data = reinterpret_cast<std::byte*>(good.data());
    ASSERT_TRUE(cuda::FindCudaKernel("embedding")(cc, good_ctx).ok());
    EXPECT_TRUE(cuda::TakeIndexFault(cc).ok());
  }
  EXPECT_TRUE(emu::TakeFaults().empty());
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class OwnKernelsTest : public ::testing::TestWithParam<Case> {};

TEST_P(OwnKernelsTest, MatchTheCpuBackend) {
  std::map<std::string, OpStats> stats;
  CompareGraph(GetParam().name, GetParam().build(), stats);
  for (const auto& [op, s] : stats) {
    std::printf("  %-32s %3d nodes, largest relative error %.2e%s%s\n", op.c_str(),
                s.nodes, s.worst, s.worst_node.empty() ? "" : " at ",
                s.worst_node.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Graphs, OwnKernelsTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& param) {
                           return std::string(param.param.name);
                         });

TEST(OwnKernelsCoverageTest, EveryOwnKernelRunsInSomeCase) {
  std::set<std::string> ops;
  for (const Case& c : kCases) {
    const Graph g = c.build();
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      if (!g.persistent(v) && g.needed()[static_cast<size_t>(v)]) ops.insert(g.op(v));
    }
  }
  const std::vector<std::string> own = cuda::CudaKernelOps();
  EXPECT_GE(own.size(), 50u);  // the table is the own kernels' alone
  for (const std::string& op : own) {
    EXPECT_TRUE(ops.count(op) > 0) << "no case runs the own kernel of " << op;
  }
}

}  // namespace
}  // namespace pebble
