// Own reduction kernels: sum, sum_backward, softmax_cross_entropy,
// mse_loss, bce_with_logits and their gradients. Losses are fp32 scalars accumulated in double over
// the fixed chunks of Note [Deterministic reductions] (native_util.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/activation_math.h"
#include "runtime/cpu/native_util.h"

namespace pebble::native {
namespace {

using ops_internal::IntAttr;
using ops_internal::NormalizeAxis;
using ops_internal::Product;

// The incoming gradient: input `i` when present (a float scalar), else 1
// (the op is the loss: d loss / d loss).
float IncomingGrad(const KernelContext& ctx, size_t i) {
  return ctx.inputs.size() > i ? LoadAsFloat(ctx.inputs[i], 0) : 1.0f;
}

// ---- sum (x) -> fp32 scalar.
absl::Status Sum(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  return DispatchFloat(x.dtype, "input 0 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    const double total = DeterministicSum(x.num_elements(), [&](int64_t b, int64_t e) {
      return BlockedSum(b, e, [px](int64_t i) { return ToFloat(px[i]); });
    });
    *ctx.output.as<float>() = static_cast<float>(total);
    return absl::OkStatus();
  });
}

// sum_backward ([g]), attrs shape, dtype: g (or 1) everywhere.
absl::Status SumBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const float g = IncomingGrad(ctx, 0);
  return DispatchFloat(ctx.output.dtype, "attr 'dtype'", [&](auto tag) {
    using T = decltype(tag);
    T* out = ctx.output.as<T>();
    const T v = FromFloat<T>(g);
    ParallelFor(ctx.output.num_elements(), kGrain, [&](int64_t b, int64_t e) {
      std::fill(out + b, out + e, v);
    });
    return absl::OkStatus();
  });
}

// ---- softmax_cross_entropy (logits, target i64[, g]), attr axis.
//
// logits viewed as (outer, C, inner) around the class axis; target as
// (outer, inner). loss = mean over the outer * inner targets of
// logsumexp(logits[o, :, i]) - logits[o, target, i] (PyTorch's
// cross_entropy: nll_loss(log_softmax(x)), reduction mean, no weights).
// Positions are processed in blocks of up to kBlock along `inner` so the
// class loop reads contiguous memory in both layouts.

struct CrossEntropyShape {
  int64_t outer = 0, classes = 0, inner = 0;
};

absl::StatusOr<CrossEntropyShape> CrossEntropyShapeOf(const KernelContext& ctx) {
  const TensorView& logits = ctx.inputs[0];
  // The table's inference (CheckOperands) accepted the axis; the backward
  // node always carries it, the forward may infer it like the table does.
  int axis = 1;
  const TensorView& target = ctx.inputs[1];
  if (ctx.attrs().is_object() && ctx.attrs().contains("axis")) {
    ASSIGN_OR_RETURN(int64_t a, IntAttr(ctx.attrs(), "axis", 1));
    ASSIGN_OR_RETURN(axis, NormalizeAxis(a, logits.rank(), "axis"));
  } else {
    Shape without1 = logits.shape;
    without1.erase(without1.begin() + 1);
    axis = target.shape == without1 ? 1 : logits.rank() - 1;
  }
  CrossEntropyShape s;
  s.outer = Product(logits.shape, 0, axis);
  s.classes = logits.shape[axis];
  s.inner = Product(logits.shape, axis + 1, logits.rank());
  return s;
}

absl::Status CheckTargets(const KernelContext& ctx, int64_t classes) {
  const TensorView& target = ctx.inputs[1];
  const int64_t* t = target.as<int64_t>();
  for (int64_t i = 0; i < target.num_elements(); ++i) {
    if (t[i] < 0 || t[i] >= classes) {
      return Invalid(ctx, "target ", t[i], " at position ", i,
                     " is outside [0, ", classes, ")");
    }
  }
  return absl::OkStatus();
}

constexpr int64_t kBlock = 64;

// For positions (o, i0 .. i0 + w): max and sum of exp(x - max) per
// position (the sum in double).
template <typename T>
void BlockSoftmaxStats(const T* x, const CrossEntropyShape& s, int64_t o,
                       int64_t i0, int64_t w, float* max, double* sum) {
  std::fill(max, max + w, -std::numeric_limits<float>::infinity());
  std::fill(sum, sum + w, 0.0);
  const T* base = x + o * s.classes * s.inner + i0;
  if (s.inner == 1) {  // one contiguous row of classes
    float m = max[0];
    for (int64_t c = 0; c < s.classes; ++c) m = std::max(m, ToFloat(base[c]));
    max[0] = m;
    sum[0] = BlockedSum(0, s.classes,
                        [base, m](int64_t c) { return std::exp(ToFloat(base[c]) - m); });
    return;
  }
  for (int64_t c = 0; c < s.classes; ++c) {
    const T* row = base + c * s.inner;
    for (int64_t t = 0; t < w; ++t) max[t] = std::max(max[t], ToFloat(row[t]));
  }
  for (int64_t c = 0; c < s.classes; ++c) {
    const T* row = base + c * s.inner;
    for (int64_t t = 0; t < w; ++t) sum[t] += std::exp(ToFloat(row[t]) - max[t]);
  }
}

absl::Status CrossEntropy(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(CrossEntropyShape s, CrossEntropyShapeOf(ctx));
  RETURN_IF_ERROR(CheckTargets(ctx, s.classes));
  const int64_t* target = ctx.inputs[1].as<int64_t>();
  const int64_t blocks_per_outer = (s.inner + kBlock - 1) / kBlock;
  const int64_t items = s.outer * blocks_per_outer;
  return DispatchFloat(ctx.inputs[0].dtype, "input 0 (logits)", [&](auto tag) {
    using T = decltype(tag);
    const T* x = ctx.inputs[0].as<T>();
    // One partial per (outer, block) item, added in item order.
    std::vector<double> partial(items);
    ParallelFor(items, RowGrain(s.classes * std::min(kBlock, s.inner)),
                [&](int64_t q0, int64_t q1) {
      float max[kBlock];
      double sum[kBlock];
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t o = q / blocks_per_outer;
        const int64_t i0 = (q % blocks_per_outer) * kBlock;
        const int64_t w = std::min(kBlock, s.inner - i0);
        BlockSoftmaxStats(x, s, o, i0, w, max, sum);
        double loss = 0.0;
        for (int64_t t = 0; t < w; ++t) {
          const int64_t pos = o * s.inner + i0 + t;
          const float xt = ToFloat(x[(o * s.classes + target[pos]) * s.inner + i0 + t]);
          loss += static_cast<double>(max[t]) + std::log(sum[t]) - xt;
        }
        partial[q] = loss;
      }
    });
    double total = 0.0;
    for (double p : partial) total += p;
    const double count = static_cast<double>(s.outer * s.inner);
    *ctx.output.as<float>() =
        static_cast<float>(count > 0 ? total / count
                                     : std::numeric_limits<double>::quiet_NaN());
    return absl::OkStatus();
  });
}

// softmax_cross_entropy_backward (logits, target[, g]), attr axis:
// (softmax(logits) - one_hot(target)) * g / count.
absl::Status CrossEntropyBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(CrossEntropyShape s, CrossEntropyShapeOf(ctx));
  RETURN_IF_ERROR(CheckTargets(ctx, s.classes));
  const int64_t* target = ctx.inputs[1].as<int64_t>();
  const float scale = static_cast<float>(
      static_cast<double>(IncomingGrad(ctx, 2)) /
      static_cast<double>(std::max<int64_t>(s.outer * s.inner, 1)));
  const int64_t blocks_per_outer = (s.inner + kBlock - 1) / kBlock;
  const int64_t items = s.outer * blocks_per_outer;
  return DispatchFloat(ctx.inputs[0].dtype, "input 0 (logits)", [&](auto tag) {
    using T = decltype(tag);
    const T* x = ctx.inputs[0].as<T>();
    T* dx = ctx.output.as<T>();
    ParallelFor(items, RowGrain(s.classes * std::min(kBlock, s.inner)),
                [&](int64_t q0, int64_t q1) {
      float max[kBlock];
      double sum[kBlock];
      float inv[kBlock];
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t o = q / blocks_per_outer;
        const int64_t i0 = (q % blocks_per_outer) * kBlock;
        const int64_t w = std::min(kBlock, s.inner - i0);
        BlockSoftmaxStats(x, s, o, i0, w, max, sum);
        for (int64_t t = 0; t < w; ++t) inv[t] = static_cast<float>(1.0 / sum[t]);
        const int64_t base = o * s.classes * s.inner + i0;
        for (int64_t c = 0; c < s.classes; ++c) {
          const T* row = x + base + c * s.inner;
          T* drow = dx + base + c * s.inner;
          for (int64_t t = 0; t < w; ++t) {
            const float p = std::exp(ToFloat(row[t]) - max[t]) * inv[t];
            const float hot = target[o * s.inner + i0 + t] == c ? 1.0f : 0.0f;
            drow[t] = FromFloat<T>((p - hot) * scale);
          }
        }
      }
    });
    return absl::OkStatus();
  });
}

// ---- mse_loss and bce_with_logits (pred, target): the mean of a term per
// element pair, and their gradients, element-wise with the incoming
// gradient (input 2, else 1).

// fp32 scalar = mean over i of term(pred[i], target[i]) (floats).
template <typename Term>
absl::Status MeanOfTerms(const KernelContext& ctx, Term term) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const int64_t n = ctx.inputs[0].num_elements();
  return DispatchFloat(ctx.inputs[0].dtype, "input 0", [&](auto tag) {
    using T = decltype(tag);
    const T* p = ctx.inputs[0].as<T>();
    const T* t = ctx.inputs[1].as<T>();
    const double total = DeterministicSum(n, [&](int64_t b, int64_t e) {
      return BlockedSum(b, e,
                        [p, t, &term](int64_t i) { return term(ToFloat(p[i]), ToFloat(t[i])); });
    });
    *ctx.output.as<float>() = static_cast<float>(total / static_cast<double>(n));
    return absl::OkStatus();
  });
}

// out[i] = grad(a[i], b[i], g, n) (floats), g the incoming gradient, n
// the element count.
template <typename Grad>
absl::Status TermGradients(const KernelContext& ctx, Grad grad) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const int64_t n = ctx.inputs[0].num_elements();
  const float g = IncomingGrad(ctx, 2);
  return DispatchFloat(ctx.inputs[0].dtype, "input 0", [&](auto tag) {
    using T = decltype(tag);
    const T* a = ctx.inputs[0].as<T>();
    const T* b = ctx.inputs[1].as<T>();
    T* out = ctx.output.as<T>();
    ParallelFor(n, kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        out[i] = FromFloat<T>(grad(ToFloat(a[i]), ToFloat(b[i]), g, n));
      }
    });
    return absl::OkStatus();
  });
}

// mse_loss: mean((pred - target)^2).
absl::Status Mse(const KernelContext& ctx) {
  return MeanOfTerms(ctx, [](float p, float t) {
    const float d = p - t;
    return d * d;
  });
}

// mse_loss_backward (a, b[, g]): 2 (a - b) / n * g, as PyTorch's
// mse_loss_backward (norm * (input - target) * grad_output). The target's
// gradient is the same node with the operands swapped.
absl::Status MseBackward(const KernelContext& ctx) {
  return TermGradients(ctx, [](float a, float b, float g, int64_t n) {
    return static_cast<float>(2.0 / static_cast<double>(n)) * (a - b) * g;
  });
}

// bce_with_logits (logits, target): mean of activation::BceWithLogits.
absl::Status Bce(const KernelContext& ctx) {
  return MeanOfTerms(ctx, [](float x, float t) { return activation::BceWithLogits(x, t); });
}

// bce_with_logits_backward (logits, target[, g]): (sigmoid(x) - t) g / n,
// as ATen's binary_cross_entropy_with_logits_backward.
absl::Status BceBackward(const KernelContext& ctx) {
  return TermGradients(ctx, [](float x, float t, float g, int64_t n) {
    return activation::BceWithLogitsGrad(x, t) * (g / static_cast<float>(n));
  });
}

}  // namespace

void RegisterNativeLossKernels(KernelTable& table) {
  table.Register("sum", Sum);
  table.Register("sum_backward", SumBackward);
  table.Register("softmax_cross_entropy", CrossEntropy);
  table.Register("softmax_cross_entropy_backward", CrossEntropyBackward);
  table.Register("mse_loss", Mse);
  table.Register("mse_loss_backward", MseBackward);
  table.Register("bce_with_logits", Bce);
  table.Register("bce_with_logits_backward", BceBackward);
}

}  // namespace pebble::native
