// Element-wise own kernels: add, mul (bias-style broadcast), the
// piecewise-linear activations (clip, hardsigmoid, hardswish, leaky_relu),
// elu, softplus, abs, exp, log, maximum and minimum,
// sum_to, the copies (copy, flatten, reshape), fill, arange, dropout,
// compare and masked_fill.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/activation_math.h"
#include "runtime/kernel_args.h"
#include "runtime/cpu/native_util.h"
#include "runtime/kernel_math.h"

namespace pebble::native {
namespace {

using ops_internal::DoubleAttr;
using ops_internal::IntAttr;

// ---- add, sub, mul, div: the result has one operand's shape (`big`); the
// other (`small`) is broadcast over it, element i of `big` meeting
// small[(i / inner) % block] (BlockBroadcast, graph/ops/op_util.h). The
// loop computes op(big, small); sub and div with a broadcast first operand
// swap the arguments back.

template <typename T, typename Op>
void BinaryLoop(const T* big, const T* small, ops_internal::BroadcastBlock b,
                T* out, int64_t n, Op op) {
  ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    if (b.block == n) {
      for (int64_t i = begin; i < end; ++i) {
        out[i] = FromFloat<T>(op(ToFloat(big[i]), ToFloat(small[i])));
      }
      return;
    }
    // Runs of `inner` elements that meet one value of `small`, or (inner
    // 1) runs of up to `block` elements that meet consecutive ones.
    int64_t i = begin;
    while (i < end) {
      const int64_t q = i / b.inner;
      const int64_t j = q % b.block;
      if (b.inner == 1) {
        const int64_t len = std::min(end - i, b.block - j);
        for (int64_t t = 0; t < len; ++t) {
          out[i + t] = FromFloat<T>(op(ToFloat(big[i + t]), ToFloat(small[j + t])));
        }
        i += len;
      } else {
        const int64_t len = std::min(end - i, (q + 1) * b.inner - i);
        const float v = ToFloat(small[j]);
        for (int64_t t = 0; t < len; ++t) {
          out[i + t] = FromFloat<T>(op(ToFloat(big[i + t]), v));
        }
        i += len;
      }
    }
  });
}

template <typename Op>
absl::Status BinaryKernel(const KernelContext& ctx, Op op) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const bool a_big = ctx.inputs[0].shape == ctx.output.shape;
  const TensorView& big = ctx.inputs[a_big ? 0 : 1];
  const TensorView& small = ctx.inputs[a_big ? 1 : 0];
  const std::optional<ops_internal::BroadcastBlock> b =
      ops_internal::BlockBroadcast(big.shape, small.shape);
  if (big.shape != ctx.output.shape || !b) {
    return Invalid(ctx, "cannot broadcast ", small.ToString(), " over ",
                   big.ToString(), " into ", ctx.output.ToString());
  }
  const int64_t n = ctx.output.num_elements();
  if (n == 0) return absl::OkStatus();
  return DispatchFloat(ctx.output.dtype, "the operands", [&](auto tag) {
    using T = decltype(tag);
    if (a_big) {
      BinaryLoop<T>(big.as<T>(), small.as<T>(), *b, ctx.output.as<T>(), n, op);
    } else {
      BinaryLoop<T>(big.as<T>(), small.as<T>(), *b, ctx.output.as<T>(), n,
                    [&op](float x, float y) { return op(y, x); });
    }
    return absl::OkStatus();
  });
}

absl::Status Add(const KernelContext& ctx) {
  return BinaryKernel(ctx, [](float a, float b) { return a + b; });
}

absl::Status Mul(const KernelContext& ctx) {
  return BinaryKernel(ctx, [](float a, float b) { return a * b; });
}

absl::Status Sub(const KernelContext& ctx) {
  return BinaryKernel(ctx, [](float a, float b) { return a - b; });
}

absl::Status Div(const KernelContext& ctx) {
  return BinaryKernel(ctx, [](float a, float b) { return a / b; });
}

// ---- maximum, minimum (a, b) of one shape, and their backwards (grad, a,
// b), attr input (runtime/activation_math.h).

template <bool kMaximum>
absl::Status Extremum(const KernelContext& ctx) {
  return BinaryKernel(ctx, [](float a, float b) { return activation::Extremum(kMaximum, a, b); });
}

template <bool kMaximum>
absl::Status ExtremumBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(const int64_t input, IntAttr(ctx.attrs(), "input", 0));
  const int64_t n = ctx.output.num_elements();
  return DispatchFloat(ctx.output.dtype, "the output", [&](auto tag) {
    using T = decltype(tag);
    const T* g = ctx.inputs[0].as<T>();
    const T* a = ctx.inputs[1].as<T>();
    const T* b = ctx.inputs[2].as<T>();
    T* out = ctx.output.as<T>();
    ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        out[i] = FromFloat<T>(activation::ExtremumGrad(kMaximum, static_cast<int>(input),
                                                       ToFloat(g[i]), ToFloat(a[i]),
                                                       ToFloat(b[i])));
      }
    });
    return absl::OkStatus();
  });
}

// ---- relu, clip, hardsigmoid, hardswish, leaky_relu (x) and their
// backwards (grad, x; relu's reads its output y): element-wise in float
// (runtime/activation_math.h), any floating dtype.

template <typename F>
absl::Status UnaryFloatKernel(const KernelContext& ctx, F f) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  const int64_t n = ctx.output.num_elements();
  return DispatchFloat(ctx.output.dtype, "the output", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T* out = ctx.output.as<T>();
    ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = FromFloat<T>(f(ToFloat(px[i])));
    });
    return absl::OkStatus();
  });
}

template <typename F>
absl::Status UnaryGradKernel(const KernelContext& ctx, F df) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  const int64_t n = ctx.output.num_elements();
  return DispatchFloat(ctx.output.dtype, "the output", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.as<T>();
    const T* px = x.as<T>();
    T* out = ctx.output.as<T>();
    ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        out[i] = FromFloat<T>(df(ToFloat(pg[i]), ToFloat(px[i])));
      }
    });
    return absl::OkStatus();
  });
}

struct ClipBounds {
  float lo, hi;
};
absl::StatusOr<ClipBounds> ClipBoundsOf(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(double lo, DoubleAttr(ctx.attrs(), "min", -HUGE_VAL));
  ASSIGN_OR_RETURN(double hi, DoubleAttr(ctx.attrs(), "max", HUGE_VAL));
  return ClipBounds{static_cast<float>(lo), static_cast<float>(hi)};
}

absl::Status Relu(const KernelContext& ctx) {
  return UnaryFloatKernel(ctx, [](float x) { return activation::Relu(x); });
}
absl::Status ReluBackward(const KernelContext& ctx) {
  return UnaryGradKernel(ctx, [](float g, float y) { return activation::ReluGrad(g, y); });
}

absl::Status Clip(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(ClipBounds c, ClipBoundsOf(ctx));
  return UnaryFloatKernel(ctx, [c](float x) { return activation::Clip(x, c.lo, c.hi); });
}
absl::Status ClipBackward(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(ClipBounds c, ClipBoundsOf(ctx));
  return UnaryGradKernel(
      ctx, [c](float g, float x) { return activation::ClipGrad(g, x, c.lo, c.hi); });
}

struct HardSigmoidParams {
  float alpha, beta;
};
absl::StatusOr<HardSigmoidParams> HardSigmoidParamsOf(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(double alpha, DoubleAttr(ctx.attrs(), "alpha", 1.0 / 6));
  ASSIGN_OR_RETURN(double beta, DoubleAttr(ctx.attrs(), "beta", 0.5));
  return HardSigmoidParams{static_cast<float>(alpha), static_cast<float>(beta)};
}

absl::Status HardSigmoid(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(HardSigmoidParams p, HardSigmoidParamsOf(ctx));
  return UnaryFloatKernel(
      ctx, [p](float x) { return activation::HardSigmoid(x, p.alpha, p.beta); });
}
absl::Status HardSigmoidBackward(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(HardSigmoidParams p, HardSigmoidParamsOf(ctx));
  return UnaryGradKernel(ctx, [p](float g, float x) {
    return activation::HardSigmoidGrad(g, x, p.alpha, p.beta);
  });
}

absl::Status HardSwish(const KernelContext& ctx) {
  return UnaryFloatKernel(ctx, [](float x) { return activation::HardSwish(x); });
}
absl::Status HardSwishBackward(const KernelContext& ctx) {
  return UnaryGradKernel(ctx,
                         [](float g, float x) { return activation::HardSwishGrad(g, x); });
}

absl::Status Erf(const KernelContext& ctx) {
  return UnaryFloatKernel(ctx, [](float x) { return activation::Erf(x); });
}
absl::Status ErfBackward(const KernelContext& ctx) {
  return UnaryGradKernel(ctx, [](float g, float x) { return activation::ErfGrad(g, x); });
}

absl::Status Sqrt(const KernelContext& ctx) {
  return UnaryFloatKernel(ctx, [](float x) { return activation::Sqrt(x); });
}
absl::Status SqrtBackward(const KernelContext& ctx) {
  return UnaryGradKernel(ctx, [](float g, float y) { return activation::SqrtGrad(g, y); });
}

absl::Status LeakyRelu(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(double slope, DoubleAttr(ctx.attrs(), "negative_slope", 0.01));
  const auto s = static_cast<float>(slope);
  return UnaryFloatKernel(ctx, [s](float x) { return activation::LeakyRelu(x, s); });
}
absl::Status LeakyReluBackward(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(double slope, DoubleAttr(ctx.attrs(), "negative_slope", 0.01));
  const auto s = static_cast<float>(slope);
  return UnaryGradKernel(
      ctx, [s](float g, float x) { return activation::LeakyReluGrad(g, x, s); });
}

struct EluParams {
  float alpha, scale, input_scale;
};
absl::StatusOr<EluParams> EluParamsOf(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(double alpha, DoubleAttr(ctx.attrs(), "alpha", 1.0));
  ASSIGN_OR_RETURN(double scale, DoubleAttr(ctx.attrs(), "scale", 1.0));
  ASSIGN_OR_RETURN(double input_scale, DoubleAttr(ctx.attrs(), "input_scale", 1.0));
  return EluParams{static_cast<float>(alpha), static_cast<float>(scale),
                   static_cast<float>(input_scale)};
}
absl::Status Elu(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(EluParams p, EluParamsOf(ctx));
  return UnaryFloatKernel(
      ctx, [p](float x) { return activation::Elu(x, p.alpha, p.scale, p.input_scale); });
}
absl::Status EluBackward(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(EluParams p, EluParamsOf(ctx));
  return UnaryGradKernel(ctx, [p](float g, float x) {
    return activation::EluGrad(g, x, p.alpha, p.scale, p.input_scale);
  });
}

struct SoftplusParams {
  float beta, threshold;
};
absl::StatusOr<SoftplusParams> SoftplusParamsOf(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(double beta, DoubleAttr(ctx.attrs(), "beta", 1.0));
  ASSIGN_OR_RETURN(double threshold, DoubleAttr(ctx.attrs(), "threshold", 20.0));
  return SoftplusParams{static_cast<float>(beta), static_cast<float>(threshold)};
}
absl::Status Softplus(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(SoftplusParams p, SoftplusParamsOf(ctx));
  return UnaryFloatKernel(
      ctx, [p](float x) { return activation::Softplus(x, p.beta, p.threshold); });
}
absl::Status SoftplusBackward(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(SoftplusParams p, SoftplusParamsOf(ctx));
  return UnaryGradKernel(ctx, [p](float g, float x) {
    return activation::SoftplusGrad(g, x, p.beta, p.threshold);
  });
}

absl::Status Abs(const KernelContext& ctx) {
  return UnaryFloatKernel(ctx, [](float x) { return activation::Abs(x); });
}
absl::Status AbsBackward(const KernelContext& ctx) {
  return UnaryGradKernel(ctx, [](float g, float x) { return activation::AbsGrad(g, x); });
}
absl::Status Exp(const KernelContext& ctx) {
  return UnaryFloatKernel(ctx, [](float x) { return activation::Exp(x); });
}
absl::Status ExpBackward(const KernelContext& ctx) {
  return UnaryGradKernel(ctx, [](float g, float y) { return activation::ExpGrad(g, y); });
}
absl::Status Log(const KernelContext& ctx) {
  return UnaryFloatKernel(ctx, [](float x) { return activation::Log(x); });
}
absl::Status LogBackward(const KernelContext& ctx) {
  return UnaryGradKernel(ctx, [](float g, float x) { return activation::LogGrad(g, x); });
}

// ---- sum_to (x), attr shape: the gradient of a broadcast operand, x
// summed down to `shape` (BlockBroadcast: the sum over the leading dims and
// the `inner` trailing ones of each element of the block). Deterministic
// column sums in double (native_util.h).
absl::Status SumTo(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  const std::optional<ops_internal::BroadcastBlock> b =
      ops_internal::BlockBroadcast(x.shape, ctx.output.shape);
  if (!b) {
    return Invalid(ctx, "cannot sum ", x.ToString(), " down to ",
                   ctx.output.ToString());
  }
  const int64_t cols = ctx.output.num_elements();
  if (cols == 0) return absl::OkStatus();
  const int64_t inner = b->inner;
  const int64_t rows = x.num_elements() / (cols * inner);
  return DispatchFloat(x.dtype, "input 0 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    std::vector<double> sums(cols);
    ColumnSums(
        rows, cols,
        [&](int64_t m, int64_t k0, int64_t k1, float* acc) {
          const T* row = px + m * cols * inner;
          for (int64_t k = k0; k < k1; ++k) {
            if (inner == 1) {
              acc[k - k0] += ToFloat(row[k]);
            } else {
              const T* run = row + k * inner;
              acc[k - k0] += static_cast<float>(BlockedSum(
                  0, inner, [run](int64_t r) { return ToFloat(run[r]); }));
            }
          }
        },
        sums.data());
    T* out = ctx.output.as<T>();
    for (int64_t k = 0; k < cols; ++k) {
      out[k] = FromFloat<T>(static_cast<float>(sums[k]));
    }
    return absl::OkStatus();
  });
}

// ---- copy, flatten, reshape: every node is its own tensor, so these copy
// the bytes (docs/operators.md). Any dtype.
absl::Status CopyBytes(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  if (x.bytes() != ctx.output.bytes()) {
    return Invalid(ctx, "input ", x.ToString(), " and output ",
                   ctx.output.ToString(), " differ in size");
  }
  ParallelCopy(ctx.output.data, x.data, x.bytes());
  return absl::OkStatus();
}

// ---- cast (x), attr dtype: Note [Cast values] (runtime/kernel_math.h).
// A float is read as float, an integer as int64, and each written in the
// output's type.
template <typename To>
To CastElement(float x) {
  if constexpr (std::is_same_v<To, int64_t>) {
    return kmath::CastToInt64(static_cast<double>(x));
  } else if constexpr (std::is_same_v<To, uint8_t>) {
    return kmath::CastToUInt8(static_cast<double>(x));
  } else {
    return FromFloat<To>(x);
  }
}
template <typename To>
To CastElement(int64_t x) {
  if constexpr (std::is_same_v<To, int64_t>) {
    return x;
  } else if constexpr (std::is_same_v<To, uint8_t>) {
    return kmath::CastToUInt8(x);
  } else {
    return FromFloat<To>(static_cast<float>(x));
  }
}

// Calls fn(T{}) with T the storage type of any dtype.
template <typename Fn>
absl::Status DispatchAny(DType dtype, absl::string_view what, Fn&& fn) {
  if (dtype == DType::kInt64) return fn(int64_t{});
  if (dtype == DType::kUInt8) return fn(uint8_t{});
  return DispatchFloat(dtype, what, fn);
}

absl::Status Cast(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  const int64_t n = ctx.output.num_elements();
  return DispatchAny(x.dtype, "input 0 (x)", [&](auto from_tag) {
    using From = decltype(from_tag);
    return DispatchAny(ctx.output.dtype, "attr 'dtype'", [&](auto to_tag) {
      using To = decltype(to_tag);
      const From* in = x.as<From>();
      To* out = ctx.output.as<To>();
      ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          if constexpr (std::is_integral_v<From>) {
            out[i] = CastElement<To>(static_cast<int64_t>(in[i]));
          } else {
            out[i] = CastElement<To>(ToFloat(in[i]));
          }
        }
      });
      return absl::OkStatus();
    });
  });
}

// ---- fill (), attrs shape, dtype, value (1): any dtype.
absl::Status Fill(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(double value, ops_internal::ExtendedDoubleAttr(ctx.attrs(), "value", 1.0));
  const TensorView& out = ctx.output;
  const int64_t n = out.num_elements();
  auto fill = [n](auto* p, auto v) {
    ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
      std::fill(p + b, p + e, v);
    });
  };
  switch (out.dtype) {
    case DType::kInt64:
      fill(out.as<int64_t>(), static_cast<int64_t>(value));
      return absl::OkStatus();
    case DType::kUInt8:
      fill(out.as<uint8_t>(), static_cast<uint8_t>(value));
      return absl::OkStatus();
    default:
      return DispatchFloat(out.dtype, "attr 'dtype'", [&](auto tag) {
        using T = decltype(tag);
        fill(out.as<T>(), FromFloat<T>(static_cast<float>(value)));
        return absl::OkStatus();
      });
  }
}

// ---- arange (), attr n: (n) i64 = 0 .. n - 1.
absl::Status Arange(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  int64_t* out = ctx.output.as<int64_t>();
  ParallelFor(ctx.output.num_elements(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = i;
  });
  return absl::OkStatus();
}

// ---- compare (a, b) -> u8 and masked_fill (x, mask): operands read over
// the result by Note [Broadcast index] (runtime/kernel_math.h), as the CUDA
// backend reads them. compare takes floats in float (every fp16 and bf16
// value is one), integers as they are.

template <typename T>
void CompareLoop(const CompareArgs& args, const T* a, const T* b, uint8_t* out, int64_t n) {
  ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const T x = a[kmath::BroadcastSource(args.a, o)];
      const T y = b[kmath::BroadcastSource(args.b, o)];
      bool r;
      if constexpr (std::is_integral_v<T>) {
        r = kmath::Compares<int64_t>(args.op, x, y);
      } else {
        r = kmath::Compares<float>(args.op, ToFloat(x), ToFloat(y));
      }
      out[o] = r ? 1 : 0;
    }
  });
}

absl::Status Compare(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(const CompareArgs args, CompareArgsOf(ctx));
  const TensorView& a = ctx.inputs[0];
  const TensorView& b = ctx.inputs[1];
  uint8_t* out = ctx.output.as<uint8_t>();
  const int64_t n = ctx.output.num_elements();
  return DispatchAny(a.dtype, "the operands", [&](auto tag) {
    using T = decltype(tag);
    CompareLoop(args, a.as<T>(), b.as<T>(), out, n);
    return absl::OkStatus();
  });
}

// constant: the attr's bytes (Note [Constant data], graph/ops/elementwise.cc;
// this host is little-endian, as the data is).
absl::Status Constant(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(const std::string data,
                   ops_internal::ConstantData(ctx.attrs(),
                                              TensorType{ctx.output.shape, ctx.output.dtype}));
  if (!data.empty()) std::memcpy(ctx.output.data, data.data(), data.size());
  return absl::OkStatus();
}

absl::Status MaskedFill(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(const MaskedFillArgs args, MaskedFillArgsOf(ctx));
  const uint8_t* mask = ctx.inputs[1].as<uint8_t>();
  const int64_t n = ctx.output.num_elements();
  return DispatchFloat(ctx.output.dtype, "input 0 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* x = ctx.inputs[0].as<T>();
    T* y = ctx.output.as<T>();
    const T value = FromFloat<T>(args.value);
    ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        const bool set = mask[kmath::BroadcastSource(args.mask, o)] != 0;
        y[o] = set != args.invert ? value : x[o];
      }
    });
    return absl::OkStatus();
  });
}

// ---- dropout: the mask generator is Note [Dropout mask generator] in
// runtime/kernel_math.h, shared with the CUDA backend (same bits on both).

absl::Status DropoutMask(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(double p, DoubleAttr(ctx.attrs(), "p", 0.5));
  ASSIGN_OR_RETURN(int64_t seed, IntAttr(ctx.attrs(), "seed", 0));
  uint8_t* mask = ctx.output.as<uint8_t>();
  const uint64_t useed = static_cast<uint64_t>(seed);
  ParallelFor(ctx.output.num_elements(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      mask[i] = kmath::DropoutKeeps(useed, static_cast<uint64_t>(i), p) ? 1 : 0;
    }
  });
  return absl::OkStatus();
}

// random: Note [Random values] in runtime/kernel_math.h, the CUDA backend's
// values too.
absl::Status Random(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(const ops_internal::RandomArgs r, ops_internal::ParseRandom(ctx.attrs()));
  return DispatchFloat(ctx.output.dtype, "attr 'dtype'", [&](auto tag) {
    using T = decltype(tag);
    T* out = ctx.output.as<T>();
    ParallelFor(ctx.output.num_elements(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        out[i] = FromFloat<T>(
            static_cast<float>(kmath::RandomAt(r.seed, static_cast<uint64_t>(i), r.normal, r.a, r.b)));
      }
    });
    return absl::OkStatus();
  });
}

// dropout (x, mask) and dropout_backward (g, mask), attr p: y = x * noise
// with noise = mask / (1 - p) in the tensor's type, as PyTorch's
// _dropout_impl (noise.bernoulli_(1 - p).div_(1 - p); input * noise).
absl::Status DropoutApply(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(double p, DoubleAttr(ctx.attrs(), "p", 0.5));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const uint8_t* mask = ctx.inputs[1].as<uint8_t>();
  return DispatchFloat(ctx.output.dtype, "input 0", [&](auto tag) {
    using T = decltype(tag);
    const T* x = ctx.inputs[0].as<T>();
    T* y = ctx.output.as<T>();
    ParallelFor(ctx.output.num_elements(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        y[i] = FromFloat<T>(ToFloat(x[i]) * (mask[i] != 0 ? scale : 0.0f));
      }
    });
    return absl::OkStatus();
  });
}

}  // namespace

void RegisterNativeElementwiseKernels(KernelTable& table) {
  table.Register("add", Add);
  table.Register("mul", Mul);
  table.Register("sub", Sub);
  table.Register("div", Div);
  table.Register("sum_to", SumTo);
  table.Register("copy", CopyBytes);
  table.Register("cast", Cast);
  table.Register("flatten", CopyBytes);
  table.Register("reshape", CopyBytes);
  table.Register("fill", Fill);
  table.Register("constant", Constant);
  table.Register("random", Random);
  table.Register("arange", Arange);
  table.Register("maximum", Extremum<true>);
  table.Register("minimum", Extremum<false>);
  table.Register("maximum_backward", ExtremumBackward<true>);
  table.Register("minimum_backward", ExtremumBackward<false>);
  table.Register("compare", Compare);
  table.Register("masked_fill", MaskedFill);
  table.Register("dropout_mask", DropoutMask);
  table.Register("dropout", DropoutApply);
  table.Register("dropout_backward", DropoutApply);
  table.Register("relu", Relu);
  table.Register("relu_backward", ReluBackward);
  table.Register("clip", Clip);
  table.Register("clip_backward", ClipBackward);
  table.Register("hardsigmoid", HardSigmoid);
  table.Register("hardsigmoid_backward", HardSigmoidBackward);
  table.Register("erf", Erf);
  table.Register("sqrt", Sqrt);
  table.Register("sqrt_backward", SqrtBackward);
  table.Register("erf_backward", ErfBackward);
  table.Register("hardswish", HardSwish);
  table.Register("hardswish_backward", HardSwishBackward);
  table.Register("leaky_relu", LeakyRelu);
  table.Register("leaky_relu_backward", LeakyReluBackward);
  table.Register("elu", Elu);
  table.Register("elu_backward", EluBackward);
  table.Register("softplus", Softplus);
  table.Register("softplus_backward", SoftplusBackward);
  table.Register("abs", Abs);
  table.Register("abs_backward", AbsBackward);
  table.Register("exp", Exp);
  table.Register("exp_backward", ExpBackward);
  table.Register("log", Log);
  table.Register("log_backward", LogBackward);
}

}  // namespace pebble::native
