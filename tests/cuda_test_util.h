// Helpers shared by the CUDA backend's tests: tests/cuda_backend_test.cc
// (on a GPU, and on the host emulation) and tests/emu/. Needs the CUDA
// backend (PEBBLE_HAVE_CUDA_BACKEND).
#ifndef PEBBLE_TESTS_CUDA_TEST_UTIL_H_
#define PEBBLE_TESTS_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/models/models.h"
#include "graph/status.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/executor.h"
#include "scheduler/planner.h"

namespace pebble::testing {

// A CUDA backend, or null with a test failure.
inline std::unique_ptr<Backend> Cuda(const CudaBackendOptions& options = {}) {
  auto b = MakeCudaBackend(options);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

// The small U-Net the tests run on the host emulator: a quarter of its
// widths (the same ops and graph, 16x fewer weights, whose emulated kernels
// took most of those tests' time).
inline const std::string kEmulatedUnet3d =
    "unet3d:batch=1,variant=small,depth=8,height=8,width=8,features=16";

// A zoo model, or an empty graph with a test failure.
inline Graph Model(const std::string& text) {
  auto g = BuildModel(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

inline absl::StatusOr<PlanResult> PlanFor(const Graph& g, const std::string& policy,
                                          int64_t budget) {
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner(policy));
  PlannerOptions options;
  options.budget_bytes = budget;
  options.time_limit_s = 20;
  // The policies as published: their recomputing and offloading schedules
  // are what the backend tests exercise (composed with best-order, many
  // budgets are met by best-order's one-shot plan instead).
  options.own_order = true;
  return planner->Plan(g, options);
}

// One step with inputs generated from `seed`.
inline absl::StatusOr<ExecutionResult> RunPlan(const Graph& g, const Schedule& s,
                                               Backend& b, uint64_t seed = 7) {
  ExecutorOptions options;
  options.seed = seed;
  return Execute(g, s, b, options);
}

// An output's raw bytes (for bitwise checks).
inline std::vector<uint8_t> Bytes(const HostTensor& t) {
  const auto* p = reinterpret_cast<const uint8_t*>(t.array.data.data());
  return std::vector<uint8_t>(p, p + t.array.data.size());
}

// An fp32 output's values (bf16 outputs come back as fp32); empty for
// other dtypes.
inline std::vector<float> Floats(const HostTensor& t) {
  std::vector<float> out(t.array.data.size() / sizeof(float));
  if (t.array.dtype == DType::kFloat32) {
    std::memcpy(out.data(), t.array.data.data(), out.size() * sizeof(float));
  } else {
    out.clear();
  }
  return out;
}

// max |a - b| <= atol + rtol * max |b| over the tensor.
inline void ExpectClose(const std::vector<float>& a, const std::vector<float>& b,
                        double rtol, double atol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  EXPECT_LE(err, atol + rtol * scale) << what << ": max error " << err << " at scale " << scale;
}

// Kinks. relu_backward passes g where y > 0 and maxpool_backward routes g to
// each window's maximum: both pick a piece of a piecewise-linear function by
// a comparison. Where a forward value lies within rounding of the kink (a
// ReLU input next to 0, two values of a window next to each other), two
// correct backends whose sums differ in the last bits can pick different
// pieces. The gradient then differs by its own size at that position, and
// batch-norm and convolution backward spread the difference over whole
// tensors (unet3d at 16^3, seed 7: one ReLU output is 0 on the CPU backend
// and 1.3e-6 on the CUDA one, and the first block's weight gradients differ
// by 0.8%). A comparison of such a run tests the inputs, not the backends.

// The graph with the output of every relu_backward and maxpool_backward node
// added to its outputs, so that their zero patterns can be compared. The
// values of the original outputs do not change.
inline Graph WithKinkProbes(const Graph& g) {
  GraphBuilder b(g.name());
  for (NodeId v = 0; v < g.num_nodes(); ++v) b.AddNode(SpecOf(g, v));
  for (NodeId v : g.outputs()) b.AddOutput(g.id(v));
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (g.op(v) == "relu_backward" || g.op(v) == "maxpool_backward") b.AddOutput(g.id(v));
  }
  auto probed = b.Build();
  EXPECT_TRUE(probed.ok()) << probed.status();
  return probed.ok() ? *std::move(probed) : Graph();
}

// Positions where exactly one of two runs' outputs of a kink op is zero: the
// places where the backends picked different pieces (0 where the values are
// not fp32 or differ in size, which the caller's comparison reports).
inline int64_t KinkDisagreements(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += (a[i] == 0.f) != (b[i] == 0.f);
  return n;
}

}  // namespace pebble::testing

#endif  // PEBBLE_TESTS_CUDA_TEST_UTIL_H_
