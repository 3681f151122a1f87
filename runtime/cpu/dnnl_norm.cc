// Batch normalisation, training mode, with PyTorch's CPU formulas
// (aten/src/ATen/native/Normalization.cpp and batch_norm_kernel.cpp,
// PyTorch 1.13): statistics accumulated in double (acc_type<float> on the
// CPU), the biased variance for normalisation, the backward
//   k = dotp invstd^2 / n,  grad_mean = sum(g) / n,
//   dx = (g - grad_mean - (x - mean) k) invstd w,
//   dw = dotp invstd,  db = sum(g),   dotp = sum((x - mean) g).
// Own oneTBB loops rather than oneDNN's batch_normalization primitive: the
// graph keeps the statistics as a (2, C) tensor of mean and 1/std, which
// oneDNN's primitive does not take (it wants the variance), and the
// reductions here are fixed-order (Note [oneDNN kernels]).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/cpu/dnnl_util.h"
#include "runtime/cpu/parallel.h"

namespace pebble::dnnl_internal {
namespace {

// x (N, C, *S) viewed as (outer, channels, inner).
struct ChannelView {
  int64_t outer = 0, channels = 0, inner = 0;
  int64_t count() const { return outer * inner; }  // elements per channel
};

absl::StatusOr<ChannelView> ViewOf(const TensorView& x,
                                   absl::string_view what) {
  if (x.rank() < 2) {
    return Invalid(what, " must be (N, C, ...), got ", ShapeToString(x.shape));
  }
  ChannelView v;
  v.outer = x.shape[0];
  v.channels = x.shape[1];
  v.inner = ops_internal::Product(x.shape, 2, x.rank());
  return v;
}

// Elements of one channel per reduction block; partial sums of the blocks
// are added in block order, so the result is independent of the threads.
constexpr int64_t kBlock = 1 << 15;

// Elements of a parallel chunk (cpu::GrainFor). Grouping tasks changes
// neither an element-wise map nor a reduction whose partial sums are stored
// per block.
constexpr int64_t kChunkElements = 1 << 14;

// For each channel c, out[c * K + k] = the sum over the channel's elements
// of what `seg(c, offset, length, acc)` adds into acc[0..K) for each
// contiguous run [offset, offset + length) of the channel.
template <int K, typename Seg>
void ChannelReduce(const ChannelView& v, Seg seg, std::vector<double>& out) {
  const int64_t total = v.count();
  const int64_t blocks = std::max<int64_t>(1, (total + kBlock - 1) / kBlock);
  std::vector<double> partial(v.channels * blocks * K, 0.0);
  // A workspace probe reads no operand (sums of zeros are zeros).
  if (!Probing()) cpu::ParallelRanges(
      v.channels * blocks, cpu::GrainFor(std::min(total, kBlock), kChunkElements),
      [&](int64_t first_task, int64_t end_task) {
        for (int64_t task = first_task; task < end_task; ++task) {
          const int64_t c = task / blocks;
          const int64_t b = task % blocks;
          const int64_t end = std::min(total, (b + 1) * kBlock);
          double* acc = partial.data() + task * K;
          for (int64_t t = b * kBlock; t < end;) {
            const int64_t i = t / v.inner;
            const int64_t j = t % v.inner;
            const int64_t len = std::min(v.inner - j, end - t);
            seg(c, (i * v.channels + c) * v.inner + j, len, acc);
            t += len;
          }
        }
      });
  out.assign(v.channels * K, 0.0);
  for (int64_t c = 0; c < v.channels; ++c) {
    for (int64_t b = 0; b < blocks; ++b) {
      for (int k = 0; k < K; ++k) {
        out[c * K + k] += partial[(c * blocks + b) * K + k];
      }
    }
  }
}

// Calls fn(c, offset, length) over every element of x, in parallel chunks
// of whole runs (an element-wise map: the order does not matter).
template <typename Fn>
void ChannelMap(const ChannelView& v, Fn fn) {
  const int64_t chunks_per_run =
      std::max<int64_t>(1, (v.inner + kBlock - 1) / kBlock);
  const int64_t tasks = v.outer * v.channels * chunks_per_run;
  if (Probing()) return;  // a workspace probe discards the results
  cpu::ParallelRanges(
      tasks, cpu::GrainFor(std::min(v.inner, kBlock), kChunkElements),
      [&](int64_t first_task, int64_t end_task) {
        for (int64_t task = first_task; task < end_task; ++task) {
          const int64_t run = task / chunks_per_run;
          const int64_t chunk = task % chunks_per_run;
          const int64_t begin = chunk * kBlock;
          const int64_t len = std::min(v.inner, begin + kBlock) - begin;
          fn(run % v.channels, run * v.inner + begin, len);
        }
      });
}

absl::Status CheckEps(const KernelContext& ctx, double* eps) {
  ASSIGN_OR_RETURN(*eps, ops_internal::DoubleAttr(ctx.attrs(), "eps", 1e-5));
  if (!(*eps >= 0)) return Invalid("attr 'eps' must be >= 0");
  return absl::OkStatus();
}

absl::Status CheckStats(const TensorView& stats, int64_t channels,
                        absl::string_view what) {
  RETURN_IF_ERROR(ExpectF32(stats, what));
  return ExpectShape(stats, {2, channels}, what);
}

absl::Status CheckParam(const TensorView& p, int64_t channels,
                        absl::string_view what) {
  RETURN_IF_ERROR(ExpectF32(p, what));
  return ExpectShape(p, {channels}, what);
}

// Per channel: sum(g) and sum((x - mean) g), in double.
std::vector<double> GradSums(const ChannelView& v, const float* g,
                             const float* x, const float* mean) {
  std::vector<double> sums;
  ChannelReduce<2>(
      v,
      [&](int64_t c, int64_t offset, int64_t len, double* acc) {
        const double m = mean[c];
        const float* gr = g + offset;
        const float* xr = x + offset;
        acc[0] += LaneSum(len, [&](int64_t i) { return double{gr[i]}; });
        acc[1] += LaneSum(len, [&](int64_t i) {
          return (double{xr[i]} - m) * double{gr[i]};
        });
      },
      sums);
  return sums;
}

}  // namespace

// batchnorm_stats (x (N, C, ...)), attr eps -> (2, C) fp32: mean and
// 1 / sqrt(biased variance + eps).
absl::Status BatchNormStats(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& xv = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectF32(xv, "input 0 (x)"));
  ASSIGN_OR_RETURN(ChannelView v, ViewOf(xv, "input 0 (x)"));
  double eps;
  RETURN_IF_ERROR(CheckEps(ctx, &eps));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, {2, v.channels}, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (v.channels == 0) return absl::OkStatus();
  if (v.count() == 0) {
    return Invalid("batch norm of ", ShapeToString(xv.shape),
                   ": no elements per channel");
  }
  const float* x = xv.as<float>();
  std::vector<double> sums;
  ChannelReduce<1>(
      v,
      [&](int64_t, int64_t offset, int64_t len, double* acc) {
        const float* xr = x + offset;
        acc[0] += LaneSum(len, [&](int64_t i) { return double{xr[i]}; });
      },
      sums);
  const double n = static_cast<double>(v.count());
  std::vector<double> mean(v.channels);
  for (int64_t c = 0; c < v.channels; ++c) mean[c] = sums[c] / n;
  std::vector<double> squares;
  ChannelReduce<1>(
      v,
      [&](int64_t c, int64_t offset, int64_t len, double* acc) {
        const double m = mean[c];
        const float* xr = x + offset;
        acc[0] += LaneSum(len, [&](int64_t i) {
          const double d = double{xr[i]} - m;
          return d * d;
        });
      },
      squares);
  float* out = ctx.output.as<float>();
  for (int64_t c = 0; c < v.channels; ++c) {
    out[c] = static_cast<float>(mean[c]);
    out[v.channels + c] =
        static_cast<float>(1.0 / std::sqrt(squares[c] / n + eps));
  }
  return absl::OkStatus();
}

// batchnorm (x, stats[, weight, bias]): y = x alpha + beta with
// alpha = invstd w, beta = b - mean alpha (PyTorch's
// batch_norm_cpu_transform_input).
absl::Status BatchNorm(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 4));
  if (ctx.inputs.size() == 3) {
    return Invalid("takes (x, stats) or (x, stats, weight, bias), not 3 "
                   "inputs");
  }
  const TensorView& xv = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectF32(xv, "input 0 (x)"));
  ASSIGN_OR_RETURN(ChannelView v, ViewOf(xv, "input 0 (x)"));
  double eps;
  RETURN_IF_ERROR(CheckEps(ctx, &eps));
  RETURN_IF_ERROR(CheckStats(ctx.inputs[1], v.channels, "input 1 (stats)"));
  const bool affine = ctx.inputs.size() == 4;
  if (affine) {
    RETURN_IF_ERROR(CheckParam(ctx.inputs[2], v.channels, "input 2 (weight)"));
    RETURN_IF_ERROR(CheckParam(ctx.inputs[3], v.channels, "input 3 (bias)"));
  }
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, xv.shape, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (xv.num_elements() == 0) return absl::OkStatus();
  const float* stats = ctx.inputs[1].as<float>();
  std::vector<float> alpha(v.channels), beta(v.channels);
  for (int64_t c = 0; c < v.channels; ++c) {
    const float w = affine ? ctx.inputs[2].as<float>()[c] : 1.0f;
    const float b = affine ? ctx.inputs[3].as<float>()[c] : 0.0f;
    alpha[c] = stats[v.channels + c] * w;
    beta[c] = b - stats[c] * alpha[c];
  }
  const float* x = xv.as<float>();
  float* y = ctx.output.as<float>();
  ChannelMap(v, [&](int64_t c, int64_t offset, int64_t len) {
    const float a = alpha[c], b = beta[c];
    for (int64_t i = offset; i < offset + len; ++i) y[i] = x[i] * a + b;
  });
  return absl::OkStatus();
}

// The operands every batch-norm gradient reads: g and x (fp32, one shape)
// and the stats; checks them and the eps attr, and returns x's channel view.
absl::StatusOr<ChannelView> CheckGradXStats(const KernelContext& ctx) {
  const TensorView& gv = ctx.inputs[0];
  const TensorView& xv = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectF32(gv, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(xv, "input 1 (x)"));
  RETURN_IF_ERROR(ExpectShape(gv, xv.shape, "input 0 (grad)"));
  ASSIGN_OR_RETURN(ChannelView v, ViewOf(xv, "input 1 (x)"));
  double eps;
  RETURN_IF_ERROR(CheckEps(ctx, &eps));
  RETURN_IF_ERROR(CheckStats(ctx.inputs[2], v.channels, "input 2 (stats)"));
  return v;
}

// batchnorm_backward (g, x, stats[, weight]) -> dx (the training-mode
// formula of the file comment; weight 1 when absent).
absl::Status BatchNormBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 3, 4));
  const TensorView& gv = ctx.inputs[0];
  const TensorView& xv = ctx.inputs[1];
  ASSIGN_OR_RETURN(ChannelView v, CheckGradXStats(ctx));
  const bool affine = ctx.inputs.size() == 4;
  if (affine) {
    RETURN_IF_ERROR(CheckParam(ctx.inputs[3], v.channels, "input 3 (weight)"));
  }
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, xv.shape, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (xv.num_elements() == 0) return absl::OkStatus();
  const float* g = gv.as<float>();
  const float* x = xv.as<float>();
  const float* mean = ctx.inputs[2].as<float>();
  const float* invstd = mean + v.channels;
  const std::vector<double> sums = GradSums(v, g, x, mean);
  const double n = static_cast<double>(v.count());
  std::vector<float> k(v.channels), grad_mean(v.channels), scale(v.channels);
  for (int64_t c = 0; c < v.channels; ++c) {
    const float w = affine ? ctx.inputs[3].as<float>()[c] : 1.0f;
    // As PyTorch: k and grad_mean are rounded to the tensor's type.
    k[c] = static_cast<float>(sums[2 * c + 1] * invstd[c] * invstd[c] / n);
    grad_mean[c] = static_cast<float>(sums[2 * c] / n);
    scale[c] = invstd[c] * w;
  }
  float* dx = ctx.output.as<float>();
  ChannelMap(v, [&](int64_t c, int64_t offset, int64_t len) {
    const float m = mean[c], kc = k[c], gm = grad_mean[c], s = scale[c];
    for (int64_t i = offset; i < offset + len; ++i) {
      dx[i] = (g[i] - gm - (x[i] - m) * kc) * s;
    }
  });
  return absl::OkStatus();
}

// batchnorm_backward_weight (g, x, stats) -> (C) fp32: sum(g xhat) =
// dotp invstd.
absl::Status BatchNormBackwardWeight(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 3, 3));
  const TensorView& gv = ctx.inputs[0];
  const TensorView& xv = ctx.inputs[1];
  ASSIGN_OR_RETURN(ChannelView v, CheckGradXStats(ctx));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, {v.channels}, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (v.channels == 0) return absl::OkStatus();
  const float* mean = ctx.inputs[2].as<float>();
  const float* invstd = mean + v.channels;
  const std::vector<double> sums =
      GradSums(v, gv.as<float>(), xv.as<float>(), mean);
  float* out = ctx.output.as<float>();
  for (int64_t c = 0; c < v.channels; ++c) {
    out[c] = static_cast<float>(sums[2 * c + 1] * invstd[c]);
  }
  return absl::OkStatus();
}

// batchnorm_backward_bias (g) -> (C) fp32: sum(g) over all but dim 1.
absl::Status BatchNormBackwardBias(const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& gv = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectF32(gv, "input 0 (grad)"));
  ASSIGN_OR_RETURN(ChannelView v, ViewOf(gv, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectF32(ctx.output, "the output"));
  RETURN_IF_ERROR(ExpectShape(ctx.output, {v.channels}, "the output"));
  RETURN_IF_ERROR(ExpectData(ctx));
  if (v.channels == 0) return absl::OkStatus();
  ChannelSums(gv.as<float>(), v.outer, v.channels, v.inner,
              ctx.output.as<float>());
  return absl::OkStatus();
}

}  // namespace pebble::dnnl_internal
