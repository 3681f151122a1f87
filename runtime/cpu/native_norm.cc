// Layer normalisation over the last dim, training mode, PyTorch's formulas
// (aten/src/ATen/native/cpu/layer_norm_kernel.cpp): rows of D elements,
// mean and rstd = 1 / sqrt(var + eps) with the biased variance, stored as
// the fp32 statistics tensor (2, rows...): row 0 the means, row 1 the rstd.
// Row statistics and the row reductions of the backward use BlockedSum
// (float lanes, double across blocks), one row per task (deterministic); the
// weight and bias gradients are ColumnSums over fixed row chunks
// (native_util.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/cpu/native_util.h"

namespace pebble::native {
namespace {

using ops_internal::DoubleAttr;

struct Rows {
  int64_t rows = 0, d = 0;
};

Rows RowsOf(const TensorView& x) {
  Rows r;
  r.d = x.shape.back();
  r.rows = r.d > 0 ? x.num_elements() / r.d : 0;
  return r;
}

// ---- layernorm_stats (x), attr eps -> (2, rows...) fp32.
absl::Status LayerNormStats(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(double eps, DoubleAttr(ctx.attrs(), "eps", 1e-5));
  const TensorView& x = ctx.inputs[0];
  const Rows r = RowsOf(x);
  float* mean = ctx.output.as<float>();
  float* rstd = mean + r.rows;
  return DispatchFloat(x.dtype, "input 0 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    ParallelFor(r.rows, RowGrain(r.d), [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const T* row = px + i * r.d;
        // Two passes: the mean, then the mean squared deviation from the
        // mean rounded to float (no cancellation of E[x^2] - E[x]^2).
        const double m =
            BlockedSum(0, r.d, [row](int64_t j) { return ToFloat(row[j]); }) /
            static_cast<double>(r.d);
        const float mf = static_cast<float>(m);
        const double v =
            BlockedSum(0, r.d,
                       [row, mf](int64_t j) {
                         const float c = ToFloat(row[j]) - mf;
                         return c * c;
                       }) /
            static_cast<double>(r.d);
        mean[i] = static_cast<float>(m);
        rstd[i] = static_cast<float>(1.0 / std::sqrt(std::max(v, 0.0) + eps));
      }
    });
    return absl::OkStatus();
  });
}

// ---- layernorm (x, stats[, weight, bias]): (x - mean) rstd weight + bias.
absl::Status LayerNorm(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  const Rows r = RowsOf(x);
  const float* mean = ctx.inputs[1].as<float>();
  const float* rstd = mean + r.rows;
  const bool affine = ctx.inputs.size() == 4;
  return DispatchFloat(x.dtype, "input 0 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    const T* w = affine ? ctx.inputs[2].as<T>() : nullptr;
    const T* b = affine ? ctx.inputs[3].as<T>() : nullptr;
    T* y = ctx.output.as<T>();
    ParallelFor(r.rows, RowGrain(r.d), [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const T* row = px + i * r.d;
        T* out = y + i * r.d;
        const float m = mean[i], s = rstd[i];
        for (int64_t j = 0; j < r.d; ++j) {
          float v = (ToFloat(row[j]) - m) * s;
          if (affine) v = v * ToFloat(w[j]) + ToFloat(b[j]);
          out[j] = FromFloat<T>(v);
        }
      }
    });
    return absl::OkStatus();
  });
}

// ---- layernorm_backward (g, x, stats[, weight]):
// dx = rstd (g w - mean_j(g w) - xhat mean_j(g w xhat)), xhat = (x - mean)
// rstd; the same as PyTorch's a g w + b x + c form.
absl::Status LayerNormBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  const Rows r = RowsOf(x);
  const float* mean = ctx.inputs[2].as<float>();
  const float* rstd = mean + r.rows;
  const bool affine = ctx.inputs.size() == 4;
  if (affine && ctx.inputs[3].dtype != x.dtype) {
    return Invalid(ctx, "weight ", ctx.inputs[3].ToString(),
                   " must have x's dtype");
  }
  return DispatchFloat(x.dtype, "input 1 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.as<T>();
    const T* px = x.as<T>();
    const T* w = affine ? ctx.inputs[3].as<T>() : nullptr;
    T* dx = ctx.output.as<T>();
    ParallelFor(r.rows, RowGrain(r.d), [&](int64_t r0, int64_t r1) {
      std::vector<float> gw(r.d), xhat(r.d);
      for (int64_t i = r0; i < r1; ++i) {
        const T* grow = pg + i * r.d;
        const T* xrow = px + i * r.d;
        const float m = mean[i], s = rstd[i];
        for (int64_t j = 0; j < r.d; ++j) {
          gw[j] = ToFloat(grow[j]) * (affine ? ToFloat(w[j]) : 1.0f);
          xhat[j] = (ToFloat(xrow[j]) - m) * s;
        }
        const double sum_gw =
            BlockedSum(0, r.d, [&gw](int64_t j) { return gw[j]; });
        const double sum_gw_xhat =
            BlockedSum(0, r.d, [&](int64_t j) { return gw[j] * xhat[j]; });
        const float c1 = static_cast<float>(sum_gw / static_cast<double>(r.d));
        const float c2 = static_cast<float>(sum_gw_xhat / static_cast<double>(r.d));
        T* out = dx + i * r.d;
        for (int64_t j = 0; j < r.d; ++j) {
          out[j] = FromFloat<T>(s * (gw[j] - c1 - xhat[j] * c2));
        }
      }
    });
    return absl::OkStatus();
  });
}

// ---- layernorm_backward_weight (g, x, stats) -> (D): sum over rows of
// g xhat; layernorm_backward_bias (g) -> (D): sum over rows of g.
absl::Status LayerNormBackwardWeight(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  const Rows r = RowsOf(x);
  const float* mean = ctx.inputs[2].as<float>();
  const float* rstd = mean + r.rows;
  return DispatchFloat(x.dtype, "input 1 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.as<T>();
    const T* px = x.as<T>();
    std::vector<double> sums(r.d);
    ColumnSums(
        r.rows, r.d,
        [&](int64_t i, int64_t k0, int64_t k1, float* acc) {
          const T* grow = pg + i * r.d;
          const T* xrow = px + i * r.d;
          const float m = mean[i], s = rstd[i];
          for (int64_t k = k0; k < k1; ++k) {
            acc[k - k0] += ToFloat(grow[k]) * ((ToFloat(xrow[k]) - m) * s);
          }
        },
        sums.data());
    T* out = ctx.output.as<T>();
    for (int64_t k = 0; k < r.d; ++k) out[k] = FromFloat<T>(static_cast<float>(sums[k]));
    return absl::OkStatus();
  });
}

absl::Status LayerNormBackwardBias(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& g = ctx.inputs[0];
  const Rows r = RowsOf(g);
  return DispatchFloat(g.dtype, "input 0 (grad)", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.as<T>();
    std::vector<double> sums(r.d);
    ColumnSums(
        r.rows, r.d,
        [&](int64_t i, int64_t k0, int64_t k1, float* acc) {
          const T* grow = pg + i * r.d;
          for (int64_t k = k0; k < k1; ++k) acc[k - k0] += ToFloat(grow[k]);
        },
        sums.data());
    T* out = ctx.output.as<T>();
    for (int64_t k = 0; k < r.d; ++k) out[k] = FromFloat<T>(static_cast<float>(sums[k]));
    return absl::OkStatus();
  });
}

}  // namespace

void RegisterNativeNormKernels(KernelTable& table) {
  table.Register("layernorm_stats", LayerNormStats);
  table.Register("layernorm", LayerNorm);
  table.Register("layernorm_backward", LayerNormBackward);
  table.Register("layernorm_backward_weight", LayerNormBackwardWeight);
  table.Register("layernorm_backward_bias", LayerNormBackwardBias);
}

}  // namespace pebble::native
