// Internal to the CPU backend's own kernels (runtime/cpu/native_*.cc): the
// 16-bit float types, dtype dispatch, operand checks and the parallel loops
// whose results never depend on the thread count.
//
// Note [Deterministic reductions]. A kernel's output must be the same bits
// on every run (runtime/kernel.h). Element-wise work may be split in any way.
// A reduction is split into chunks whose bounds depend on the shape alone
// (kReduceChunk elements, or kRowsPerChunk rows), each chunk is summed by
// one task in a fixed order (BlockedSum: float lanes of 8 values, double
// across blocks; ColumnSums: float per chunk), and the chunk partials are
// added in double in chunk order: the result is a function of the shape and
// the data, never of the number of threads or the scheduling.
#ifndef PEBBLE_RUNTIME_CPU_NATIVE_UTIL_H_
#define PEBBLE_RUNTIME_CPU_NATIVE_UTIL_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/half.h"
#include "runtime/cpu/parallel.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace pebble::native {

// ---- 16-bit floats: storage only; kernels compute in float and round on
// store (round to nearest even, as PyTorch's c10::Half and c10::BFloat16).

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// Conversions: graph/half.h.
using ::pebble::BFloat16ToFloat;
using ::pebble::FloatToBFloat16;
using ::pebble::FloatToHalf;
using ::pebble::HalfToFloat;

inline float ToFloat(float x) { return x; }
inline float ToFloat(Half x) { return HalfToFloat(x.bits); }
inline float ToFloat(BFloat16 x) { return BFloat16ToFloat(x.bits); }

template <typename T>
inline T FromFloat(float x);
template <>
inline float FromFloat<float>(float x) {
  return x;
}
template <>
inline Half FromFloat<Half>(float x) {
  return Half{FloatToHalf(x)};
}
template <>
inline BFloat16 FromFloat<BFloat16>(float x) {
  return BFloat16{FloatToBFloat16(x)};
}

// Calls fn(T{}) with T = float, Half or BFloat16 for a floating-point
// dtype; other dtypes are an InvalidArgument naming `what`.
template <typename Fn>
absl::Status DispatchFloat(DType dtype, absl::string_view what, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat16:
      return fn(Half{});
    case DType::kBFloat16:
      return fn(BFloat16{});
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, " must be fp32, fp16 or bf16, got ",
                       DTypeName(dtype)));
  }
}

// Reads element i of a floating-point tensor of any float dtype as float
// (for scalars such as an incoming loss gradient).
float LoadAsFloat(const TensorView& t, int64_t i);
// Writes `value` rounded to t's float dtype (fp32, fp16, bf16).
void StoreFloat(const TensorView& t, int64_t i, float value);

// ---- Checks.

// Every kernel starts here: re-infers the output type from the operands'
// types and the node's attributes with the operator table (graph/ops.h) and
// compares it with ctx.output, so a kernel can rely on everything the
// table's inference checks (ranks, dtypes, attrs, operand counts). Also
// refuses a null buffer of non-zero size. InvalidArgument names the op.
absl::Status CheckOperands(const KernelContext& ctx);

// "op <op>: <parts>" as an InvalidArgument.
template <typename... Args>
absl::Status Invalid(const KernelContext& ctx, const Args&... parts) {
  return absl::InvalidArgumentError(
      absl::StrCat("op ", ctx.op(), ": ", parts...));
}

// ---- Parallel loops (OpenMP, runtime/cpu/parallel.h).

// Element-wise work: grain in elements of a task.
inline constexpr int64_t kGrain = 1 << 15;
// Elements summed sequentially per chunk of a deterministic reduction.
inline constexpr int64_t kReduceChunk = 1 << 14;

// fn(begin, end) over disjoint ranges covering [0, n); ranges of at least
// `grain` items. For work whose every output element is computed by one
// call, so the result does not depend on the split.
template <typename Fn>
void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  cpu::ParallelRanges(n, grain, fn);
}

// Rows of `row_elements` each: a grain of about kGrain elements.
inline int64_t RowGrain(int64_t row_elements) {
  return cpu::GrainFor(row_elements, kGrain);
}

// memcpy split over threads for large copies.
void ParallelCopy(std::byte* dst, const std::byte* src, int64_t bytes);

// The sum over [0, n) of chunk_sum(begin, end) (a double) over the fixed
// chunks of Note [Deterministic reductions], added in chunk order.
template <typename ChunkSum>
double DeterministicSum(int64_t n, ChunkSum&& chunk_sum) {
  if (n <= 0) return 0.0;
  const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  if (chunks == 1) return chunk_sum(int64_t{0}, n);
  std::vector<double> partial(chunks);
  ParallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      partial[c] = chunk_sum(c * kReduceChunk, std::min(n, (c + 1) * kReduceChunk));
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

// The sum of f(i) over [begin, end) with f returning float: eight float
// lanes over blocks of 64 items (each lane adds 8 values), block sums added
// to eight double lanes, the lanes combined pairwise. Near-double accuracy
// without a latency-bound double chain; the order is fixed by begin and end
// alone, so the result is deterministic.
template <typename F>
double BlockedSum(int64_t begin, int64_t end, F&& f) {
  double total[8] = {};
  int64_t i = begin;
  for (; i + 64 <= end; i += 64) {
    float lane[8] = {};
    for (int64_t j = 0; j < 64; j += 8) {
      for (int l = 0; l < 8; ++l) lane[l] += f(i + j + l);
    }
    for (int l = 0; l < 8; ++l) total[l] += lane[l];
  }
  double tail = 0.0;
  for (; i < end; ++i) tail += f(i);
  return ((total[0] + total[1]) + (total[2] + total[3])) +
         ((total[4] + total[5]) + (total[6] + total[7])) + tail;
}

// Column sums of an implicit (rows, cols) matrix: result[k] = the sum over
// m of the values that add_row(m, k0, k1, acc) adds (as float) to
// acc[0 .. k1 - k0) for columns [k0, k1) of row m. Rows are split into
// fixed chunks of kRowsPerChunk (a function of the shape alone); a chunk is
// summed in float, rows in order, and the chunk sums are added in double in
// chunk order. `result` has `cols` entries.
template <typename AddRow>
void ColumnSums(int64_t rows, int64_t cols, AddRow&& add_row, double* result) {
  constexpr int64_t kRowsPerChunk = 32;
  constexpr int64_t kColBlock = 512;
  std::fill(result, result + cols, 0.0);
  if (rows <= 0 || cols <= 0) return;
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const int64_t col_blocks = (cols + kColBlock - 1) / kColBlock;
  std::vector<float> partial(chunks * cols, 0.0f);
  const int64_t tasks = chunks * col_blocks;
  ParallelFor(tasks, RowGrain(kRowsPerChunk * std::min(cols, kColBlock)),
              [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c = t / col_blocks, b = t % col_blocks;
      const int64_t k0 = b * kColBlock, k1 = std::min(cols, k0 + kColBlock);
      float* acc = partial.data() + c * cols + k0;
      const int64_t m1 = std::min(rows, (c + 1) * kRowsPerChunk);
      for (int64_t m = c * kRowsPerChunk; m < m1; ++m) add_row(m, k0, k1, acc);
    }
  });
  ParallelFor(cols, 1024, [&](int64_t k0, int64_t k1) {
    for (int64_t c = 0; c < chunks; ++c) {
      const float* p = partial.data() + c * cols;
      for (int64_t k = k0; k < k1; ++k) result[k] += p[k];
    }
  });
}

// ---- Kernel families (one file each); RegisterNativeKernels (in
// native_kernels.cc) calls every one.
void RegisterNativeElementwiseKernels(KernelTable& table);  // native_elementwise.cc
void RegisterNativeShapeKernels(KernelTable& table);        // native_shape.cc
void RegisterNativePoolKernels(KernelTable& table);         // native_pool.cc
void RegisterNativeLossKernels(KernelTable& table);         // native_loss.cc
void RegisterNativeNormKernels(KernelTable& table);         // native_norm.cc
void RegisterNativeOptimizerKernels(KernelTable& table);    // native_optimizer.cc

}  // namespace pebble::native

#endif  // PEBBLE_RUNTIME_CPU_NATIVE_UTIL_H_
