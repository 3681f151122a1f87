// The CUDA backend's own-kernel ops (element-wise, normalisation, pooling,
// upsampling, losses, data movement) and the op table. Semantics are
// docs/operators.md's; each function checks what it relies on (ranks,
// dtypes, attrs) and returns InvalidArgument / Unimplemented otherwise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/kernel_args.h"
#include "runtime/cuda/cuda_kernels.h"
#include "runtime/cuda/cuda_ops.h"
#include "runtime/cuda/cuda_status.h"

namespace pebble::cuda {

// ---- Shared helpers.

absl::StatusOr<KType> KTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return KType::kF32;
    case DType::kFloat16:
      return KType::kF16;
    case DType::kBFloat16:
      return KType::kBF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "expected a floating-point tensor, got ", DTypeName(dtype)));
  }
}

absl::Status ExpectInputs(const KernelContext& ctx, size_t lo, size_t hi) {
  if (ctx.inputs.size() < lo || ctx.inputs.size() > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", lo, lo == hi ? "" : absl::StrCat(" to ", hi),
                     " inputs, got ", ctx.inputs.size()));
  }
  return absl::OkStatus();
}

absl::Status LaunchStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  if (e == cudaErrorInvalidValue) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": configuration out of the kernel's range (",
                     cudaGetErrorString(e), ")"));
  }
  return absl::InternalError(absl::StrCat(what, " launch failed: ",
                                          cudaGetErrorString(e), " (",
                                          cudaGetErrorName(e), ")"));
}

absl::Status CheckIndicesOnDevice(CudaContext& cc, const KernelContext& ctx,
                                  const TensorView& indices, int64_t limit,
                                  absl::string_view what) {
  const int64_t n = indices.num_elements();
  if (n == 0) return absl::OkStatus();
  if (cc.index_checks.size() >= kmath::kIndexFaultTagLimit) {
    // Out of tags: report what the checks so far found (TakeIndexFault
    // waits for them), then start over.
    RETURN_IF_ERROR(TakeIndexFault(cc));
  }
  if (static_cast<uint64_t>(n) >= kmath::kIndexFaultPositionLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        n, " positions of ", what, ": more than the device check can report"));
  }
  const uint64_t tag = cc.index_checks.size();
  RETURN_IF_ERROR(LaunchStatus(
      LaunchCheckIndices(reinterpret_cast<const int64_t*>(indices.data), n,
                         limit, tag, cc.index_fault, cc.stream),
      "LaunchCheckIndices"));
  cc.index_checks.push_back(
      {ctx.graph->id(ctx.node), ctx.op(), std::string(what), limit});
  return absl::OkStatus();
}

absl::Status TakeIndexFault(CudaContext& cc) {
  if (cc.index_checks.empty()) return absl::OkStatus();
  std::vector<CudaContext::IndexCheck> checks;
  checks.swap(cc.index_checks);
  IndexFault fault{};
  PEBBLE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&fault, cc.index_fault, sizeof(fault),
                      cudaMemcpyDeviceToHost, cc.stream));
  PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cc.stream));
  if (fault.key == kmath::kNoIndexFault) return absl::OkStatus();
  PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(&cc.index_fault->key, 0xff,
                                              sizeof(fault.key), cc.stream));
  PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cc.stream));
  const uint64_t tag = kmath::IndexFaultTag(fault.key);
  if (tag >= checks.size()) {
    return absl::InternalError(absl::StrCat(
        "the device reported an index fault of unknown check ", tag));
  }
  const CudaContext::IndexCheck& check = checks[tag];
  return absl::InvalidArgumentError(absl::StrCat(
      "node '", check.node, "' (op ", check.op, "): ", check.what, " ",
      fault.value, " at position ", kmath::IndexFaultPosition(fault.key),
      " is outside [0, ", check.limit,
      ") (found on the device; the run's results are not valid)"));
}

absl::Status Copy2D(CudaContext& cc, std::byte* dst, int64_t dpitch,
                    const std::byte* src, int64_t spitch, int64_t width,
                    int64_t height) {
  if (width == 0 || height == 0) return absl::OkStatus();
  if (height == 1 || (width == dpitch && width == spitch)) {
    PEBBLE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(width * height),
                        cudaMemcpyDeviceToDevice, cc.stream));
  } else if (dpitch <= cc.max_copy_pitch && spitch <= cc.max_copy_pitch) {
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        dst, static_cast<size_t>(dpitch), src, static_cast<size_t>(spitch),
        static_cast<size_t>(width), static_cast<size_t>(height),
        cudaMemcpyDeviceToDevice, cc.stream));
  } else {
    for (int64_t r = 0; r < height; ++r) {
      PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          dst + r * dpitch, src + r * spitch, static_cast<size_t>(width),
          cudaMemcpyDeviceToDevice, cc.stream));
    }
  }
  return absl::OkStatus();
}

absl::Status Zero2D(CudaContext& cc, std::byte* dst, int64_t pitch,
                    int64_t width, int64_t height) {
  if (width == 0 || height == 0) return absl::OkStatus();
  if (height == 1 || width == pitch) {
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        dst, 0, static_cast<size_t>(width * height), cc.stream));
  } else if (pitch <= cc.max_copy_pitch) {
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(
        dst, static_cast<size_t>(pitch), 0, static_cast<size_t>(width),
        static_cast<size_t>(height), cc.stream));
  } else {
    for (int64_t r = 0; r < height; ++r) {
      PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
          dst + r * pitch, 0, static_cast<size_t>(width), cc.stream));
    }
  }
  return absl::OkStatus();
}

namespace {

#define PEBBLE_LAUNCH(call) RETURN_IF_ERROR(LaunchStatus((call), #call))

absl::Status ExpectSameType(const TensorView& a, const TensorView& b,
                            absl::string_view what) {
  if (a.dtype != b.dtype || a.shape != b.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected ", DTypeName(a.dtype), ShapeToString(a.shape),
        ", got ", DTypeName(b.dtype), ShapeToString(b.shape)));
  }
  return absl::OkStatus();
}

// (outer, C, inner) of an NC* tensor.
void ChannelView(const Shape& s, int64_t* outer, int64_t* c, int64_t* inner) {
  *outer = s.empty() ? 1 : s[0];
  *c = s.size() > 1 ? s[1] : 1;
  *inner = 1;
  for (size_t i = 2; i < s.size(); ++i) *inner *= s[i];
}

// Scratch of an own kernel (Note [Own kernel scratch]): the node's planned
// workspace when it holds `bytes`, else the backend's buffer outside the plan.
absl::StatusOr<void*> KernelScratch(CudaContext& cc, const KernelContext& ctx, int64_t bytes) {
  if (ctx.workspace != nullptr && ctx.workspace_bytes >= bytes) return ctx.workspace;
  return cc.scratch(bytes);
}

const float* F32(const TensorView& t) {
  return reinterpret_cast<const float*>(t.data);
}

// ---- Element-wise.

// The parameters of clip, hardsigmoid, leaky_relu, elu and softplus from the node's attrs
// (the defaults of the operator table).
absl::StatusOr<UnaryParams> ParamsOf(UnaryOp op, const KernelContext& ctx) {
  const nlohmann::json& attrs = ctx.attrs();
  UnaryParams p;
  auto read = [&](const char* name, double fallback) -> absl::StatusOr<float> {
    ASSIGN_OR_RETURN(double v, ops_internal::DoubleAttr(attrs, name, fallback));
    return static_cast<float>(v);
  };
  switch (op) {
    case UnaryOp::kClip: {
      ASSIGN_OR_RETURN(p.a, read("min", -HUGE_VAL));
      ASSIGN_OR_RETURN(p.b, read("max", HUGE_VAL));
      break;
    }
    case UnaryOp::kHardSigmoid: {
      ASSIGN_OR_RETURN(p.a, read("alpha", 1.0 / 6));
      ASSIGN_OR_RETURN(p.b, read("beta", 0.5));
      break;
    }
    case UnaryOp::kLeakyRelu: {
      ASSIGN_OR_RETURN(p.a, read("negative_slope", 0.01));
      break;
    }
    case UnaryOp::kElu: {
      ASSIGN_OR_RETURN(p.a, read("alpha", 1.0));
      ASSIGN_OR_RETURN(p.b, read("scale", 1.0));
      ASSIGN_OR_RETURN(p.c, read("input_scale", 1.0));
      break;
    }
    case UnaryOp::kSoftplus: {
      ASSIGN_OR_RETURN(p.a, read("beta", 1.0));
      ASSIGN_OR_RETURN(p.b, read("threshold", 20.0));
      break;
    }
    default:
      break;
  }
  return p;
}

// y = op(x); the parameterised ops (ParamsOf) read
// theirs from the attrs.
template <UnaryOp kOp>
absl::Status UnaryKernel(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[0], "input 0"));
  ASSIGN_OR_RETURN(UnaryParams p, ParamsOf(kOp, ctx));
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchUnary(kOp, t, ctx.inputs[0].data, ctx.output.data,
                            ctx.output.num_elements(), cc.stream, p));
  return absl::OkStatus();
}

// dx from (grad, saved): y for relu/tanh/sigmoid, x for the others.
template <UnaryOp kOp>
absl::Status UnaryBackwardKernel(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[1], "input 1"));
  ASSIGN_OR_RETURN(UnaryParams p, ParamsOf(kOp, ctx));
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchUnaryBackward(kOp, t, ctx.inputs[0].data, ctx.inputs[1].data,
                                    ctx.output.data, ctx.output.num_elements(),
                                    cc.stream, p));
  return absl::OkStatus();
}

absl::StatusOr<UnaryOp> GeluOp(const KernelContext& ctx) {
  const nlohmann::json& attrs = ctx.attrs();
  std::string approx = "none";
  if (attrs.is_object() && attrs.contains("approximate")) {
    if (!attrs["approximate"].is_string()) {
      return absl::InvalidArgumentError("attr 'approximate' must be a string");
    }
    approx = attrs["approximate"].get<std::string>();
  }
  if (approx == "none") return UnaryOp::kGeluErf;
  if (approx == "tanh") return UnaryOp::kGeluTanh;
  return absl::InvalidArgumentError(
      absl::StrCat("attr 'approximate' must be \"none\" or \"tanh\", got \"",
                   approx, "\""));
}

absl::Status Gelu(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[0], "input 0"));
  ASSIGN_OR_RETURN(UnaryOp op, GeluOp(ctx));
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchUnary(op, t, ctx.inputs[0].data, ctx.output.data,
                            ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

absl::Status GeluBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[1], "input 1 (x)"));
  ASSIGN_OR_RETURN(UnaryOp op, GeluOp(ctx));
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchUnaryBackward(op, t, ctx.inputs[0].data,
                                    ctx.inputs[1].data, ctx.output.data,
                                    ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// add / sub / mul / div: one operand has the output's shape, the other is
// broadcast over it (BlockBroadcast, graph/ops/op_util.h).
template <BinaryOp kOp>
absl::Status BinaryKernel(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView* big = &ctx.inputs[0];
  const TensorView* small = &ctx.inputs[1];
  // The operand of the output's shape (by shape, not by element count: with
  // a dim of 1 or 0 the broadcast operand may have as many elements).
  const bool b_first = big->shape != ctx.output.shape;
  if (b_first) std::swap(big, small);
  RETURN_IF_ERROR(ExpectSameType(ctx.output, *big, "the larger operand"));
  const std::optional<ops_internal::BroadcastBlock> b =
      ops_internal::BlockBroadcast(big->shape, small->shape);
  if (small->dtype != big->dtype || !b) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operands ", ShapeToString(big->shape), " and ",
        ShapeToString(small->shape),
        " must share a dtype and one must broadcast over the other"));
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchBinary(kOp, t, big->data, small->data, ctx.output.data,
                             big->num_elements(), b->block, b->inner,
                             b_first, cc.stream));
  return absl::OkStatus();
}

// maximum_backward, minimum_backward (g, a, b), attr input.
template <bool kMaximum>
absl::Status ExtremumBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 3, 3));
  for (int i = 0; i < 3; ++i) {
    RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[i], absl::StrCat("input ", i)));
  }
  ASSIGN_OR_RETURN(const int64_t input, IntAttr(ctx.attrs(), "input", 0));
  if (input != 0 && input != 1) return absl::InvalidArgumentError("attr 'input' must be 0 or 1");
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchExtremumBackward(kMaximum, static_cast<int>(input), t, ctx.inputs[0].data,
                                       ctx.inputs[1].data, ctx.inputs[2].data, ctx.output.data,
                                       ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// ---- Normalisation.

absl::Status BatchNormStats(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  int64_t n, c, s;
  ChannelView(x.shape, &n, &c, &s);
  if (x.rank() < 2 || ctx.output.dtype != DType::kFloat32 ||
      ctx.output.shape != Shape{2, c}) {
    return absl::InvalidArgumentError("batchnorm_stats: expected x (N,C,...) and an fp32 (2,C) output");
  }
  if (c > 0 && n * s == 0) {  // as the CPU backend: no mean of nothing
    return absl::InvalidArgumentError(absl::StrCat(
        "batchnorm_stats of ", x.ToString(), ": no elements per channel"));
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  ASSIGN_OR_RETURN(double eps, DoubleAttr(ctx.attrs(), "eps", 1e-5));
  ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ChannelScratchBytes(c)));
  PEBBLE_LAUNCH(LaunchBatchNormStats(t, x.data, ctx.output.as<float>(), n, c, s,
                                     eps, scratch, cc.stream));
  return absl::OkStatus();
}

absl::Status CheckStats(const TensorView& stats, int64_t c) {
  if (stats.dtype != DType::kFloat32 || stats.shape != Shape{2, c}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected fp32 (2,", c, ") statistics, got ", stats.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckChannelParam(const TensorView& p, int64_t c,
                               absl::string_view what) {
  if (p.dtype != DType::kFloat32 || p.shape != Shape{c}) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected fp32 (", c, "), got ", p.ToString()));
  }
  return absl::OkStatus();
}

absl::Status BatchNorm(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 4));
  const TensorView& x = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectSameType(ctx.output, x, "input 0 (x)"));
  int64_t n, c, s;
  ChannelView(x.shape, &n, &c, &s);
  RETURN_IF_ERROR(CheckStats(ctx.inputs[1], c));
  const float* weight = nullptr;
  const float* bias = nullptr;
  if (ctx.inputs.size() > 2) {
    RETURN_IF_ERROR(CheckChannelParam(ctx.inputs[2], c, "input 2 (weight)"));
    weight = F32(ctx.inputs[2]);
  }
  if (ctx.inputs.size() > 3) {
    RETURN_IF_ERROR(CheckChannelParam(ctx.inputs[3], c, "input 3 (bias)"));
    bias = F32(ctx.inputs[3]);
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchBatchNorm(t, x.data, F32(ctx.inputs[1]), weight, bias,
                                ctx.output.data, n, c, s, cc.stream));
  return absl::OkStatus();
}

absl::Status BatchNormBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 3, 4));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectSameType(ctx.output, g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, x, "input 1 (x)"));
  int64_t n, c, s;
  ChannelView(x.shape, &n, &c, &s);
  RETURN_IF_ERROR(CheckStats(ctx.inputs[2], c));
  const float* weight = nullptr;
  if (ctx.inputs.size() > 3) {
    RETURN_IF_ERROR(CheckChannelParam(ctx.inputs[3], c, "input 3 (weight)"));
    weight = F32(ctx.inputs[3]);
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ChannelScratchBytes(c)));
  PEBBLE_LAUNCH(LaunchBatchNormBackward(t, g.data, x.data, F32(ctx.inputs[2]),
                                        weight, ctx.output.data, n, c, s,
                                        scratch, cc.stream));
  return absl::OkStatus();
}

absl::Status BatchNormBackwardWeight(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 3, 3));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectSameType(x, g, "input 0 (grad)"));
  int64_t n, c, s;
  ChannelView(x.shape, &n, &c, &s);
  RETURN_IF_ERROR(CheckStats(ctx.inputs[2], c));
  RETURN_IF_ERROR(CheckChannelParam(ctx.output, c, "output"));
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ChannelScratchBytes(c)));
  PEBBLE_LAUNCH(LaunchBatchNormBackwardWeight(
      t, g.data, x.data, F32(ctx.inputs[2]), ctx.output.as<float>(), n, c, s,
      scratch, cc.stream));
  return absl::OkStatus();
}

// Sum of g over every dim but 1 (conv bias, batch-norm bias), or over every
// dim but the last (linear bias): `last` picks.
absl::Status ChannelSumKernel(CudaContext& cc, const KernelContext& ctx,
                              bool last) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& g = ctx.inputs[0];
  int64_t outer, c, inner;
  if (last) {
    c = g.shape.empty() ? 1 : g.shape.back();
    outer = c == 0 ? 0 : g.num_elements() / c;
    inner = 1;
  } else {
    ChannelView(g.shape, &outer, &c, &inner);
  }
  if (ctx.output.shape != Shape{c}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a (", c, ") output, got ", ctx.output.ToString()));
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(g.dtype));
  ASSIGN_OR_RETURN(KType out_t, KTypeOf(ctx.output.dtype));
  ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ChannelScratchBytes(c)));
  PEBBLE_LAUNCH(LaunchChannelSum(t, g.data, out_t, ctx.output.data, outer, c,
                                 inner, scratch, cc.stream));
  return absl::OkStatus();
}

absl::Status BiasGradNc(CudaContext& cc, const KernelContext& ctx) {
  return ChannelSumKernel(cc, ctx, /*last=*/false);
}
absl::Status BiasGradLast(CudaContext& cc, const KernelContext& ctx) {
  return ChannelSumKernel(cc, ctx, /*last=*/true);
}

// ---- Pooling and upsampling.

// Fills the spatial part of a Window3/Upsample3 from an NC* shape (2 or 3
// spatial dims; 2-D goes in the last two slots).
absl::StatusOr<int> SpatialDims(const Shape& s) {
  if (s.size() != 4 && s.size() != 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a 4-D or 5-D tensor, got ", ShapeToString(s)));
  }
  return static_cast<int>(s.size()) - 2;
}

absl::StatusOr<Window3> PoolWindow(const KernelContext& ctx, const Shape& x,
                                   const Shape& y) {
  ASSIGN_OR_RETURN(int d, SpatialDims(x));
  if (y.size() != x.size()) {
    return absl::InvalidArgumentError("pooled and input ranks differ");
  }
  // Max pooling's ceil mode: windows clipped to the input, as in floor mode
  // (the kernels clip every window), only the output size differs.
  ASSIGN_OR_RETURN(const ops_internal::Window pool, ops_internal::PoolWindow(ctx.attrs(), d));
  const absl::StatusOr<Shape> mapped = ops_internal::WindowShape(x, x[1], pool);
  if (!mapped.ok() || *mapped != y) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window (kernel ", absl::StrJoin(pool.kernel, "x"), ", stride ",
        absl::StrJoin(pool.stride, "x"), ", padding ", absl::StrJoin(pool.padding, "x"),
        ") does not map ", ShapeToString(x), " to ", ShapeToString(y),
        mapped.ok() ? "" : absl::StrCat(": ", mapped.status().message())));
  }
  Window3 w;
  w.nc = x[0] * x[1];
  const int off = 3 - d;
  for (int i = 0; i < d; ++i) {
    w.in[off + i] = x[2 + i];
    w.out[off + i] = y[2 + i];
    w.kernel[off + i] = pool.kernel[i];
    w.stride[off + i] = pool.stride[i];
    w.padding[off + i] = pool.padding[i];
  }
  return w;
}

absl::Status MaxPool(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  if (x.dtype != ctx.output.dtype) return absl::InvalidArgumentError("dtype mismatch");
  ASSIGN_OR_RETURN(Window3 w, PoolWindow(ctx, x.shape, ctx.output.shape));
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchMaxPool(t, w, x.data, ctx.output.data, cc.stream));
  return absl::OkStatus();
}

absl::Status MaxPoolBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectSameType(ctx.output, x, "input 1 (x)"));
  if (g.dtype != x.dtype) return absl::InvalidArgumentError("dtype mismatch");
  ASSIGN_OR_RETURN(Window3 w, PoolWindow(ctx, x.shape, g.shape));
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchMaxPoolBackward(t, w, g.data, x.data, ctx.output.data,
                                      cc.stream));
  return absl::OkStatus();
}

// The geometry of upsample x -> y (ParseUpsampling, graph/ops/op_util.h).
absl::StatusOr<Upsample3> UpsampleSpec(const KernelContext& ctx, const Shape& x,
                                       const Shape& y) {
  ASSIGN_OR_RETURN(int d, SpatialDims(x));
  ASSIGN_OR_RETURN(const ops_internal::Upsampling geometry,
                   ops_internal::ParseUpsampling(ctx.attrs(), x));
  Upsample3 u;
  u.nc = x[0] * x[1];
  u.mode = geometry.mode == "nearest" ? 0 : geometry.mode == "bicubic" ? 2 : 1;
  u.align_corners = geometry.align_corners;
  const int off = 3 - d;
  for (int i = 0; i < d; ++i) {
    if (y.size() != x.size() || y[2 + i] != geometry.out[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          ShapeToString(y), " is not the upsampling of ", ShapeToString(x)));
    }
    u.in[off + i] = x[2 + i];
    u.out[off + i] = y[2 + i];
    u.scale[off + i] = kmath::MakeUpsampleAxis(x[2 + i], y[2 + i], geometry.scale_factor[i]).scale;
  }
  return u;
}

absl::Status Upsample(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  if (x.dtype != ctx.output.dtype) return absl::InvalidArgumentError("dtype mismatch");
  ASSIGN_OR_RETURN(Upsample3 u, UpsampleSpec(ctx, x.shape, ctx.output.shape));
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchUpsample(t, u, x.data, ctx.output.data, cc.stream));
  return absl::OkStatus();
}

absl::Status UpsampleBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& g = ctx.inputs[0];
  if (g.dtype != ctx.output.dtype) return absl::InvalidArgumentError("dtype mismatch");
  ASSIGN_OR_RETURN(Upsample3 u, UpsampleSpec(ctx, ctx.output.shape, g.shape));
  ASSIGN_OR_RETURN(KType t, KTypeOf(g.dtype));
  PEBBLE_LAUNCH(LaunchUpsampleBackward(t, u, g.data, ctx.output.data, cc.stream));
  return absl::OkStatus();
}

absl::Status GlobalAvgPool(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  int64_t n, c, s;
  ChannelView(x.shape, &n, &c, &s);
  if (x.rank() < 3 || x.dtype != ctx.output.dtype ||
      ctx.output.num_elements() != n * c) {
    return absl::InvalidArgumentError("expected x (N,C,...) and an (N,C) output");
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchRowMean(t, x.data, ctx.output.data, n * c, s, cc.stream));
  return absl::OkStatus();
}

absl::Status GlobalAvgPoolBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& g = ctx.inputs[0];
  int64_t n, c, s;
  ChannelView(ctx.output.shape, &n, &c, &s);
  if (ctx.output.rank() < 3 || g.dtype != ctx.output.dtype ||
      g.num_elements() != n * c) {
    return absl::InvalidArgumentError("expected g (N,C) and an (N,C,...) output");
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(g.dtype));
  PEBBLE_LAUNCH(LaunchRowBroadcastMean(t, g.data, ctx.output.data, n * c, s,
                                       cc.stream));
  return absl::OkStatus();
}

// ---- Losses.

// The incoming gradient of a loss used as a non-loss: an fp32 scalar last
// input, or null.
absl::StatusOr<const float*> OptionalGrad(const KernelContext& ctx, size_t index) {
  if (ctx.inputs.size() <= index) return nullptr;
  const TensorView& g = ctx.inputs[index];
  if (g.dtype != DType::kFloat32 || g.num_elements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input ", index, " (grad): expected an fp32 scalar, got ", g.ToString()));
  }
  return F32(g);
}

// mse_loss or, with kBce, bce_with_logits (pred, target).
template <bool kBce>
absl::Status PointLoss(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  RETURN_IF_ERROR(ExpectSameType(ctx.inputs[0], ctx.inputs[1], "input 1 (target)"));
  if (ctx.output.dtype != DType::kFloat32 || ctx.output.num_elements() != 1) {
    return absl::InvalidArgumentError("expected an fp32 scalar output");
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.inputs[0].dtype));
  ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ScalarScratchBytes()));
  PEBBLE_LAUNCH((kBce ? LaunchBceLoss : LaunchMseLoss)(
      t, ctx.inputs[0].data, ctx.inputs[1].data, ctx.output.as<float>(),
      ctx.inputs[0].num_elements(), scratch, cc.stream));
  return absl::OkStatus();
}

// Their backwards (pred, target[, grad]).
template <bool kBce>
absl::Status PointLossBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 3));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[0], "input 0 (pred)"));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[1], "input 1 (target)"));
  ASSIGN_OR_RETURN(const float* g, OptionalGrad(ctx, 2));
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH((kBce ? LaunchBceLossBackward : LaunchMseLossBackward)(
      t, ctx.inputs[0].data, ctx.inputs[1].data, g, ctx.output.data,
      ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// The class axis of softmax_cross_entropy (loss.cc's rule): attr `axis`, else
// 1 when the target is the logits without dim 1, else the last.
absl::StatusOr<int> ClassAxis(const KernelContext& ctx, const Shape& logits,
                              const Shape& target) {
  const int rank = static_cast<int>(logits.size());
  if (rank < 1) return absl::InvalidArgumentError("logits must have a class dim");
  int axis;
  if (ctx.attrs().is_object() && ctx.attrs().contains("axis")) {
    ASSIGN_OR_RETURN(int64_t a, IntAttr(ctx.attrs(), "axis", 1));
    if (a < 0) a += rank;
    axis = static_cast<int>(a);
  } else {
    Shape without1 = logits;
    if (rank >= 2) without1.erase(without1.begin() + 1);
    axis = (rank >= 2 && without1 == target) ? 1 : rank - 1;
  }
  if (axis < 0 || axis >= rank) return absl::InvalidArgumentError("class axis out of range");
  Shape expect = logits;
  expect.erase(expect.begin() + axis);
  if (expect != target) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target ", ShapeToString(target), " does not match logits ",
        ShapeToString(logits), " without the class axis ", axis));
  }
  return axis;
}

absl::Status CrossEntropyCommon(CudaContext& cc, const KernelContext& ctx,
                                bool backward) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, backward ? 3 : 2));
  const TensorView& logits = ctx.inputs[0];
  const TensorView& target = ctx.inputs[1];
  if (target.dtype != DType::kInt64) {
    return absl::InvalidArgumentError("input 1 (target) must be i64");
  }
  ASSIGN_OR_RETURN(int axis, ClassAxis(ctx, logits.shape, target.shape));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= logits.shape[i];
  for (int i = axis + 1; i < logits.rank(); ++i) inner *= logits.shape[i];
  const int64_t classes = logits.shape[axis];
  ASSIGN_OR_RETURN(KType t, KTypeOf(logits.dtype));
  RETURN_IF_ERROR(CheckIndicesOnDevice(cc, ctx, target, classes, "target"));
  const auto* tgt = reinterpret_cast<const int64_t*>(target.data);
  if (backward) {
    RETURN_IF_ERROR(ExpectSameType(ctx.output, logits, "input 0 (logits)"));
    ASSIGN_OR_RETURN(const float* g, OptionalGrad(ctx, 2));
    PEBBLE_LAUNCH(LaunchCrossEntropyBackward(t, logits.data, tgt, g,
                                             ctx.output.data, outer, classes,
                                             inner, cc.stream));
  } else {
    if (ctx.output.dtype != DType::kFloat32 || ctx.output.num_elements() != 1) {
      return absl::InvalidArgumentError("expected an fp32 scalar output");
    }
    ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ScalarScratchBytes()));
    PEBBLE_LAUNCH(LaunchCrossEntropy(t, logits.data, tgt, ctx.output.as<float>(),
                                     outer, classes, inner, scratch, cc.stream));
  }
  return absl::OkStatus();
}

absl::Status CrossEntropy(CudaContext& cc, const KernelContext& ctx) {
  return CrossEntropyCommon(cc, ctx, false);
}
absl::Status CrossEntropyBackward(CudaContext& cc, const KernelContext& ctx) {
  return CrossEntropyCommon(cc, ctx, true);
}

absl::Status Sum(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  if (ctx.output.dtype != DType::kFloat32 || ctx.output.num_elements() != 1) {
    return absl::InvalidArgumentError("expected an fp32 scalar output");
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.inputs[0].dtype));
  ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ScalarScratchBytes()));
  PEBBLE_LAUNCH(LaunchSum(t, ctx.inputs[0].data, ctx.output.as<float>(),
                          ctx.inputs[0].num_elements(), scratch, cc.stream));
  return absl::OkStatus();
}

// sum_backward ([g]): g (or 1) broadcast to the output.
absl::Status SumBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 0, 1));
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  if (ctx.inputs.empty()) {
    PEBBLE_LAUNCH(LaunchFill(t, ctx.output.data, ctx.output.num_elements(), 1.0,
                             cc.stream));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const float* g, OptionalGrad(ctx, 0));
  PEBBLE_LAUNCH(LaunchBroadcastScalar(t, g, ctx.output.data,
                                      ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

absl::Status Fill(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 0, 0));
  ASSIGN_OR_RETURN(double value, ops_internal::ExtendedDoubleAttr(ctx.attrs(), "value", 1.0));
  const int64_t n = ctx.output.num_elements();
  // The CPU backend's conversions of `value` for each dtype.
  switch (ctx.output.dtype) {
    case DType::kInt64:
      PEBBLE_LAUNCH(LaunchFillInt64(ctx.output.as<int64_t>(), n,
                                    static_cast<int64_t>(value), cc.stream));
      return absl::OkStatus();
    case DType::kUInt8:
      if (n > 0) {
        PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
            ctx.output.data, static_cast<uint8_t>(value), n, cc.stream));
      }
      return absl::OkStatus();
    default:
      break;
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchFill(t, ctx.output.data, n, value, cc.stream));
  return absl::OkStatus();
}

// constant: the attr's bytes copied to the device (Note [Constant data],
// graph/ops/elementwise.cc). From pageable memory the copy returns once the
// bytes are staged, so `data` may go when it returns.
absl::Status Constant(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 0, 0));
  ASSIGN_OR_RETURN(const std::string data,
                   ops_internal::ConstantData(ctx.attrs(),
                                              TensorType{ctx.output.shape, ctx.output.dtype}));
  if (!data.empty()) {
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ctx.output.data, data.data(), data.size(),
                                                cudaMemcpyHostToDevice, cc.stream));
  }
  return absl::OkStatus();
}

// ---- The optimizer's in-place updates (graph/optimizer.h): the output is
// input 0's memory (runtime/kernel.h).

absl::Status ExpectInPlace(const KernelContext& ctx) {
  if (ctx.output.data != ctx.inputs[0].data) {
    return absl::InvalidArgumentError("an in-place update writes its input 0's memory");
  }
  return absl::OkStatus();
}

template <optim::UpdateOp kOp>
absl::Status OptimizerUpdate(CudaContext& cc, const KernelContext& ctx) {
  const bool adam_update = kOp == optim::UpdateOp::kAdamUpdate;
  const size_t inputs = kOp == optim::UpdateOp::kSgdUpdate ? 2 : adam_update ? 4 : 3;
  RETURN_IF_ERROR(ExpectInputs(ctx, inputs, inputs));
  RETURN_IF_ERROR(ExpectInPlace(ctx));
  for (size_t i = 1; i < std::min<size_t>(inputs, 3); ++i) {
    RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[i], absl::StrCat("input ", i)));
  }
  if (adam_update && (ctx.inputs[3].dtype != DType::kFloat32 ||
                      ctx.inputs[3].num_elements() != 1)) {
    return absl::InvalidArgumentError("expected an fp32 scalar step count (input 3)");
  }
  ASSIGN_OR_RETURN(const ops_internal::OptimizerAttrs a,
                   ops_internal::ReadOptimizerAttrs(ctx.attrs()));
  const optim::UpdateScalars s = optim::MakeUpdateScalars(
      a.lr, a.weight_decay, a.momentum, a.beta1, a.beta2, a.eps, a.decoupled_weight_decay);
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchOptimizerUpdate(
      kOp, t, s, {a.lr, a.beta1, a.beta2}, ctx.output.data, ctx.inputs[1].data,
      inputs > 2 ? ctx.inputs[2].data : nullptr,
      adam_update ? ctx.inputs[3].as<float>() : nullptr, ctx.output.num_elements(),
      cc.stream));
  return absl::OkStatus();
}

absl::Status OptimizerStep(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  RETURN_IF_ERROR(ExpectInPlace(ctx));
  if (ctx.output.dtype != DType::kFloat32 || ctx.output.num_elements() != 1) {
    return absl::InvalidArgumentError("expected an fp32 scalar step count");
  }
  PEBBLE_LAUNCH(LaunchIncrement(ctx.output.as<float>(), cc.stream));
  return absl::OkStatus();
}

// softmax (attr causal), or with kLog log_softmax.
template <bool kLog>
absl::Status Softmax(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectSameType(ctx.output, x, "input 0"));
  if (x.rank() < 1) return absl::InvalidArgumentError("softmax of a scalar");
  bool causal = false;
  if (!kLog) {
    ASSIGN_OR_RETURN(causal, BoolAttr(ctx.attrs(), "causal", false));
  }
  const int64_t length = x.shape.back();
  const int64_t rows = length == 0 ? 0 : x.num_elements() / length;
  const int64_t q = x.rank() >= 2 ? x.shape[x.rank() - 2] : 1;
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchSoftmax(t, x.data, ctx.output.data, rows, length, causal,
                              q, kLog, cc.stream));
  return absl::OkStatus();
}

// softmax_backward, or with kLog log_softmax_backward: (g, y).
template <bool kLog>
absl::Status SoftmaxBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectSameType(ctx.output, ctx.inputs[1], "input 1 (y)"));
  if (ctx.output.rank() < 1) return absl::InvalidArgumentError("softmax of a scalar");
  const int64_t length = ctx.output.shape.back();
  const int64_t rows = length == 0 ? 0 : ctx.output.num_elements() / length;
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchSoftmaxBackward(t, ctx.inputs[0].data, ctx.inputs[1].data,
                                      ctx.output.data, rows, length, kLog, cc.stream));
  return absl::OkStatus();
}

// ---- Data movement.

absl::Status CopyBytes(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  if (x.bytes() != ctx.output.bytes() || x.dtype != ctx.output.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot copy ", x.ToString(), " into ", ctx.output.ToString()));
  }
  if (x.bytes() == 0) return absl::OkStatus();
  PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ctx.output.data, x.data, x.bytes(),
                                              cudaMemcpyDeviceToDevice, cc.stream));
  return absl::OkStatus();
}

// pad and pad_backward in mode reflect or replicate (Note [Border
// padding]).
absl::Status BorderPad(CudaContext& cc, const KernelContext& ctx, bool backward) {
  ASSIGN_OR_RETURN(const kmath::BorderPad p, BorderPadOf(ctx, backward));
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchBorderPad(t, p, backward, ctx.inputs[0].data, ctx.output.data, cc.stream));
  return absl::OkStatus();
}

// ---- compare, masked_fill (Note [Broadcast index]).

// The element type of any dtype, for compare's and cast's kernels.
absl::StatusOr<CompareType> ElementTypeOf(const KernelContext& ctx, const TensorView& t) {
  switch (t.dtype) {
    case DType::kFloat32: return CompareType::kF32;
    case DType::kFloat16: return CompareType::kF16;
    case DType::kBFloat16: return CompareType::kBF16;
    case DType::kInt64: return CompareType::kI64;
    case DType::kUInt8: return CompareType::kU8;
  }
  return absl::InvalidArgumentError(absl::StrCat(ctx.op(), ": no kernel for ", t.ToString()));
}

absl::Status Compare(CudaContext& cc, const KernelContext& ctx) {
  ASSIGN_OR_RETURN(const CompareArgs args, CompareArgsOf(ctx));
  ASSIGN_OR_RETURN(const CompareType t, ElementTypeOf(ctx, ctx.inputs[0]));
  PEBBLE_LAUNCH(LaunchCompare(t, args.op, ctx.inputs[0].data, args.a, ctx.inputs[1].data, args.b,
                              reinterpret_cast<uint8_t*>(ctx.output.data),
                              ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// cast (x), attr dtype: Note [Cast values] (runtime/kernel_math.h).
absl::Status Cast(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  ASSIGN_OR_RETURN(const CompareType from, ElementTypeOf(ctx, ctx.inputs[0]));
  ASSIGN_OR_RETURN(const CompareType to, ElementTypeOf(ctx, ctx.output));
  PEBBLE_LAUNCH(LaunchCast(from, to, ctx.inputs[0].data, ctx.output.data,
                           ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

absl::Status MaskedFill(CudaContext& cc, const KernelContext& ctx) {
  ASSIGN_OR_RETURN(const MaskedFillArgs args, MaskedFillArgsOf(ctx));
  ASSIGN_OR_RETURN(const KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchMaskedFill(t, ctx.inputs[0].data,
                                 reinterpret_cast<const uint8_t*>(ctx.inputs[1].data), args.mask,
                                 args.value, args.invert, ctx.output.data,
                                 ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// Pad/crop with F.pad's `pads` (last dim first, (before, after) per dim),
// negated for pad_backward; other modes by BorderPad.
absl::Status PadCommon(CudaContext& cc, const KernelContext& ctx, int sign) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  if (x.dtype != ctx.output.dtype || x.rank() != ctx.output.rank() ||
      x.rank() > 6) {
    return absl::InvalidArgumentError("pad: dtype or rank mismatch (rank <= 6)");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> pads, IntListAttr(ctx.attrs(), "pads"));
  ASSIGN_OR_RETURN(double value, DoubleAttr(ctx.attrs(), "value", 0.0));
  if (pads.size() % 2 != 0 || pads.size() > 2 * static_cast<size_t>(x.rank())) {
    return absl::InvalidArgumentError("attr 'pads' has a bad length");
  }
  ASSIGN_OR_RETURN(std::string mode, ops_internal::StringAttr(ctx.attrs(), "mode", "constant"));
  if (mode != "constant") return BorderPad(cc, ctx, sign < 0);
  PadSpec p;
  p.rank = x.rank();
  for (int d = 0; d < p.rank; ++d) {
    p.in[d] = x.shape[d];
    p.out[d] = ctx.output.shape[d];
  }
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const int d = p.rank - 1 - static_cast<int>(i);
    p.before[d] = sign * pads[2 * i];
    if (p.in[d] + sign * (pads[2 * i] + pads[2 * i + 1]) != p.out[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attr 'pads' does not map ", ShapeToString(x.shape), " to ",
          ShapeToString(ctx.output.shape)));
    }
  }
  KType t = KType::kF32;
  if (auto kt = KTypeOf(x.dtype); kt.ok()) t = *kt;
  PEBBLE_LAUNCH(LaunchPad(static_cast<int>(DTypeSize(x.dtype)), p, x.data,
                          ctx.output.data, value, t, cc.stream));
  return absl::OkStatus();
}

absl::Status Pad(CudaContext& cc, const KernelContext& ctx) {
  return PadCommon(cc, ctx, +1);
}
absl::Status PadBackward(CudaContext& cc, const KernelContext& ctx) {
  return PadCommon(cc, ctx, -1);
}

// slice: a crop along one axis (the pad kernel with negative amounts).
absl::Status Slice(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  if (x.rank() < 1 || x.rank() > 6 || x.dtype != ctx.output.dtype) {
    return absl::InvalidArgumentError("slice: bad rank or dtype");
  }
  ASSIGN_OR_RETURN(int64_t axis, IntAttr(ctx.attrs(), "axis", 0));
  if (axis < 0) axis += x.rank();
  ASSIGN_OR_RETURN(int64_t begin, IntAttr(ctx.attrs(), "begin", 0));
  ASSIGN_OR_RETURN(int64_t end, IntAttr(ctx.attrs(), "end", 0));
  if (axis < 0 || axis >= x.rank() || begin < 0 || begin >= end ||
      end > x.shape[axis]) {
    return absl::InvalidArgumentError("slice: axis or range out of bounds");
  }
  Shape expect = x.shape;
  expect[axis] = end - begin;
  if (expect != ctx.output.shape) return absl::InvalidArgumentError("slice: output shape");
  // Outer x (dim * inner) rows: a 2-D copy.
  int64_t outer = 1, inner = DTypeSize(x.dtype);
  for (int64_t i = 0; i < axis; ++i) outer *= x.shape[i];
  for (int64_t i = axis + 1; i < x.rank(); ++i) inner *= x.shape[i];
  return Copy2D(cc, ctx.output.data, (end - begin) * inner,
                x.data + begin * inner, x.shape[axis] * inner,
                (end - begin) * inner, outer);
}

absl::Status Concat(CudaContext& cc, const KernelContext& ctx) {
  if (ctx.inputs.empty()) return absl::InvalidArgumentError("concat of nothing");
  const TensorView& out = ctx.output;
  ASSIGN_OR_RETURN(int64_t axis, IntAttr(ctx.attrs(), "axis", 1));
  if (axis < 0) axis += out.rank();
  if (axis < 0 || axis >= out.rank()) return absl::InvalidArgumentError("concat: bad axis");
  int64_t outer = 1, inner = DTypeSize(out.dtype);
  for (int64_t i = 0; i < axis; ++i) outer *= out.shape[i];
  for (int64_t i = axis + 1; i < out.rank(); ++i) inner *= out.shape[i];
  int64_t offset = 0;
  for (size_t k = 0; k < ctx.inputs.size(); ++k) {
    const TensorView& x = ctx.inputs[k];
    Shape expect = out.shape;
    if (x.rank() != out.rank()) return absl::InvalidArgumentError("concat: rank mismatch");
    expect[axis] = x.shape[axis];
    if (x.shape != expect || x.dtype != out.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "concat: input ", k, " ", x.ToString(), " does not fit ", out.ToString()));
    }
    const int64_t width = x.shape[axis] * inner;
    RETURN_IF_ERROR(Copy2D(cc, out.data + offset, out.shape[axis] * inner,
                           x.data, width, width, outer));
    offset += width;
  }
  if (offset != out.shape[axis] * inner) {
    return absl::InvalidArgumentError("concat: inputs do not fill the output");
  }
  return absl::OkStatus();
}

// ---- Averaging pools (kmath::PoolAxis bins).

// avgpool's window bins from the node's window attrs and count_include_pad.
absl::StatusOr<AvgPool3> WindowBins(const KernelContext& ctx, const Shape& x,
                                    const Shape& y) {
  ASSIGN_OR_RETURN(Window3 w, PoolWindow(ctx, x, y));
  ASSIGN_OR_RETURN(const int d, SpatialDims(x));
  ASSIGN_OR_RETURN(const ops_internal::Window pool, ops_internal::PoolWindow(ctx.attrs(), d));
  ASSIGN_OR_RETURN(const bool counted,
                   ops_internal::BoolAttr(ctx.attrs(), "count_include_pad", true));
  if (counted && pool.ceil_mode) {
    return absl::InvalidArgumentError("attr 'ceil_mode' of avgpool needs count_include_pad false");
  }
  AvgPool3 p;
  p.nc = w.nc;
  for (int i = 0; i < 3; ++i) {
    p.axis[i].in = w.in[i];
    p.axis[i].out = w.out[i];
    p.axis[i].kernel = w.kernel[i];
    p.axis[i].stride = w.stride[i];
    p.axis[i].padding = w.padding[i];
    p.axis[i].count_include_pad = counted;
  }
  return p;
}

// adaptive_avgpool's bins from the input and output shapes.
absl::StatusOr<AvgPool3> AdaptiveBins(const Shape& x, const Shape& y) {
  ASSIGN_OR_RETURN(int d, SpatialDims(x));
  if (y.size() != x.size() || y[0] != x[0] || y[1] != x[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        ShapeToString(y), " is not an adaptive pooling of ", ShapeToString(x)));
  }
  AvgPool3 p;
  p.nc = x[0] * x[1];
  const int off = 3 - d;
  for (int i = 0; i < d; ++i) {
    if (x[2 + i] < 1 || y[2 + i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("adaptive pooling of ", ShapeToString(x), " to ",
                       ShapeToString(y), " has an empty dim"));
    }
    p.axis[off + i].in = x[2 + i];
    p.axis[off + i].out = y[2 + i];
    p.axis[off + i].adaptive = true;
  }
  return p;
}

template <bool kAdaptive>
absl::Status AvgPool(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  if (x.dtype != ctx.output.dtype)
    return absl::InvalidArgumentError("dtype mismatch");
  absl::StatusOr<AvgPool3> p = kAdaptive
                                   ? AdaptiveBins(x.shape, ctx.output.shape)
                                   : WindowBins(ctx, x.shape, ctx.output.shape);
  RETURN_IF_ERROR(p.status());
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchAvgPool(t, *p, x.data, ctx.output.data, cc.stream));
  return absl::OkStatus();
}

template <bool kAdaptive>
absl::Status AvgPoolBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& g = ctx.inputs[0];
  if (g.dtype != ctx.output.dtype)
    return absl::InvalidArgumentError("dtype mismatch");
  absl::StatusOr<AvgPool3> p = kAdaptive
                                   ? AdaptiveBins(ctx.output.shape, g.shape)
                                   : WindowBins(ctx, ctx.output.shape, g.shape);
  RETURN_IF_ERROR(p.status());
  ASSIGN_OR_RETURN(KType t, KTypeOf(g.dtype));
  PEBBLE_LAUNCH(
      LaunchAvgPoolBackward(t, *p, g.data, ctx.output.data, cc.stream));
  return absl::OkStatus();
}

// ---- Layer norm over the last dim: rows = numel / D.

struct NormRows {
  int64_t rows = 0, d = 0;
};

absl::StatusOr<NormRows> RowsOf(const TensorView& x) {
  if (x.rank() < 1 || x.shape.back() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected x (..., D) with D >= 1, got ", x.ToString()));
  }
  return NormRows{x.num_elements() / x.shape.back(), x.shape.back()};
}

absl::Status CheckRowStats(const TensorView& stats, int64_t rows) {
  if (stats.dtype != DType::kFloat32 || stats.num_elements() != 2 * rows) {
    return absl::InvalidArgumentError(absl::StrCat("stats: expected fp32 with ",
                                                   2 * rows, " elements, got ",
                                                   stats.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckRowParam(const TensorView& p, const TensorView& x,
                           absl::string_view what) {
  if (p.dtype != x.dtype || p.shape != Shape{x.shape.back()}) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected ", DTypeName(x.dtype), " (",
                     x.shape.back(), "), got ", p.ToString()));
  }
  return absl::OkStatus();
}

absl::Status LayerNormStats(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  ASSIGN_OR_RETURN(NormRows r, RowsOf(x));
  RETURN_IF_ERROR(CheckRowStats(ctx.output, r.rows));
  ASSIGN_OR_RETURN(double eps, DoubleAttr(ctx.attrs(), "eps", 1e-5));
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchLayerNormStats(t, x.data,
                                     reinterpret_cast<float*>(ctx.output.data),
                                     r.rows, r.d, eps, cc.stream));
  return absl::OkStatus();
}

absl::Status LayerNorm(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 4));
  const TensorView& x = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectSameType(x, ctx.output, "output"));
  ASSIGN_OR_RETURN(NormRows r, RowsOf(x));
  RETURN_IF_ERROR(CheckRowStats(ctx.inputs[1], r.rows));
  if (ctx.inputs.size() == 3) {
    return absl::InvalidArgumentError(
        "expected both weight and bias, or neither");
  }
  const bool affine = ctx.inputs.size() == 4;
  if (affine) {
    RETURN_IF_ERROR(CheckRowParam(ctx.inputs[2], x, "input 2 (weight)"));
    RETURN_IF_ERROR(CheckRowParam(ctx.inputs[3], x, "input 3 (bias)"));
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchLayerNorm(t, x.data, F32(ctx.inputs[1]),
                                affine ? ctx.inputs[2].data : nullptr,
                                affine ? ctx.inputs[3].data : nullptr,
                                ctx.output.data, r.rows, r.d, cc.stream));
  return absl::OkStatus();
}

absl::Status LayerNormBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 3, 4));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectSameType(x, g, "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectSameType(x, ctx.output, "output"));
  ASSIGN_OR_RETURN(NormRows r, RowsOf(x));
  RETURN_IF_ERROR(CheckRowStats(ctx.inputs[2], r.rows));
  const bool affine = ctx.inputs.size() == 4;
  if (affine)
    RETURN_IF_ERROR(CheckRowParam(ctx.inputs[3], x, "input 3 (weight)"));
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  PEBBLE_LAUNCH(LaunchLayerNormBackward(t, g.data, x.data, F32(ctx.inputs[2]),
                                        affine ? ctx.inputs[3].data : nullptr,
                                        ctx.output.data, r.rows, r.d,
                                        cc.stream));
  return absl::OkStatus();
}

// Column sums into an output of x's trailing dims: (rows, cols) with cols =
// the output's elements. `stats`: layer-norm statistics for the g * xhat
// form, else null.
absl::Status ColumnSumInto(CudaContext& cc, const KernelContext& ctx,
                           const TensorView& g, const TensorView* x,
                           const float* stats) {
  const int64_t cols = ctx.output.num_elements();
  if (g.dtype != ctx.output.dtype || cols == 0 ||
      g.num_elements() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot sum ", g.ToString(), " to ", ctx.output.ToString()));
  }
  const int64_t rows = g.num_elements() / cols;
  ASSIGN_OR_RETURN(KType t, KTypeOf(g.dtype));
  ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ColumnScratchBytes(rows, cols)));
  PEBBLE_LAUNCH(LaunchColumnSum(t, g.data, x != nullptr ? x->data : nullptr,
                                stats, ctx.output.data, rows, cols, scratch,
                                cc.stream));
  return absl::OkStatus();
}

// sum_to (x), layernorm_backward_bias (g): sums of the leading dims.
absl::Status SumLeading(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  return ColumnSumInto(cc, ctx, ctx.inputs[0], nullptr, nullptr);
}

// sum_to (x), attr shape: x summed down to the output's shape, a broadcast
// operand's (BlockBroadcast): over the leading dims alone, or also over
// `inner` trailing ones (a channel sum).
absl::Status SumTo(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  const std::optional<ops_internal::BroadcastBlock> b =
      ops_internal::BlockBroadcast(x.shape, ctx.output.shape);
  if (!b) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot sum ", x.ToString(), " down to ", ctx.output.ToString()));
  }
  if (b->inner == 1) return SumLeading(cc, ctx);
  if (ctx.output.num_elements() == 0) return absl::OkStatus();
  const int64_t outer =
      b->block == 0 ? 0 : x.num_elements() / (b->block * b->inner);
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  ASSIGN_OR_RETURN(KType out_t, KTypeOf(ctx.output.dtype));
  ASSIGN_OR_RETURN(void* scratch, KernelScratch(cc, ctx, ChannelScratchBytes(b->block)));
  PEBBLE_LAUNCH(LaunchChannelSum(t, x.data, out_t, ctx.output.data, outer,
                                 b->block, b->inner, scratch, cc.stream));
  return absl::OkStatus();
}

absl::Status LayerNormBackwardWeight(CudaContext& cc,
                                     const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 3, 3));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectSameType(x, g, "input 0 (grad)"));
  ASSIGN_OR_RETURN(NormRows r, RowsOf(x));
  RETURN_IF_ERROR(CheckRowStats(ctx.inputs[2], r.rows));
  if (ctx.output.num_elements() != r.d) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output: expected (", r.d, "), got ", ctx.output.ToString()));
  }
  return ColumnSumInto(cc, ctx, g, &x, F32(ctx.inputs[2]));
}

// ---- Dropout.

absl::StatusOr<double> DropoutP(const KernelContext& ctx) {
  ASSIGN_OR_RETURN(double p, DoubleAttr(ctx.attrs(), "p", 0.5));
  if (!(p >= 0.0 && p < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attr 'p' must be in [0, 1), got ", p));
  }
  return p;
}

absl::Status DropoutMask(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 0, 1));
  if (ctx.output.dtype != DType::kUInt8) {
    return absl::InvalidArgumentError(
        absl::StrCat("output: expected u8, got ", ctx.output.ToString()));
  }
  ASSIGN_OR_RETURN(double p, DropoutP(ctx));
  ASSIGN_OR_RETURN(int64_t seed, IntAttr(ctx.attrs(), "seed", 0));
  PEBBLE_LAUNCH(LaunchDropoutMask(reinterpret_cast<uint8_t*>(ctx.output.data),
                                  ctx.output.num_elements(), p,
                                  static_cast<uint64_t>(seed), cc.stream));
  return absl::OkStatus();
}

absl::Status Random(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 0, 0));
  ASSIGN_OR_RETURN(const ops_internal::RandomArgs r, ops_internal::ParseRandom(ctx.attrs()));
  ASSIGN_OR_RETURN(KType t, KTypeOf(ctx.output.dtype));
  PEBBLE_LAUNCH(LaunchRandom(t, ctx.output.data, ctx.output.num_elements(), r.normal, r.a, r.b,
                             r.seed, cc.stream));
  return absl::OkStatus();
}

// dropout (x, mask) and dropout_backward (g, mask).
absl::Status DropoutApply(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& x = ctx.inputs[0];
  const TensorView& mask = ctx.inputs[1];
  RETURN_IF_ERROR(ExpectSameType(x, ctx.output, "output"));
  if (mask.dtype != DType::kUInt8 || mask.shape != x.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("input 1 (mask): expected u8", ShapeToString(x.shape),
                     ", got ", mask.ToString()));
  }
  ASSIGN_OR_RETURN(double p, DropoutP(ctx));
  ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
  // The CPU backend's scale: fp32(1 / (1 - p)).
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  PEBBLE_LAUNCH(
      LaunchDropoutApply(t, x.data, reinterpret_cast<const uint8_t*>(mask.data),
                         scale, ctx.output.data, x.num_elements(), cc.stream));
  return absl::OkStatus();
}

// ---- Embedding, arange.

absl::Status Embedding(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& indices = ctx.inputs[0];
  const TensorView& weight = ctx.inputs[1];
  if (indices.dtype != DType::kInt64 || weight.rank() != 2 ||
      weight.dtype != ctx.output.dtype ||
      ctx.output.num_elements() != indices.num_elements() * weight.shape[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected i64 indices and a (num, dim) weight of the "
                     "output's dtype, got ",
                     indices.ToString(), " and ", weight.ToString()));
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(weight.dtype));
  RETURN_IF_ERROR(
      CheckIndicesOnDevice(cc, ctx, indices, weight.shape[0], "index"));
  PEBBLE_LAUNCH(
      LaunchEmbedding(t, reinterpret_cast<const int64_t*>(indices.data),
                      weight.data, ctx.output.data, indices.num_elements(),
                      weight.shape[0], weight.shape[1], cc.stream));
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& g = ctx.inputs[0];
  const TensorView& indices = ctx.inputs[1];
  const TensorView& out = ctx.output;
  if (indices.dtype != DType::kInt64 || out.rank() != 2 ||
      g.dtype != out.dtype ||
      g.num_elements() != indices.num_elements() * out.shape[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a grad of (indices..., dim), i64 indices and a (num, dim) "
        "output, got ",
        g.ToString(), ", ", indices.ToString(), " and ", out.ToString()));
  }
  ASSIGN_OR_RETURN(KType t, KTypeOf(g.dtype));
  RETURN_IF_ERROR(
      CheckIndicesOnDevice(cc, ctx, indices, out.shape[0], "index"));
  void* scratch = nullptr;
  if (const int64_t bytes =
          EmbeddingScratchBytes(t, out.shape[0], out.shape[1]);
      bytes > 0) {
    ASSIGN_OR_RETURN(scratch, KernelScratch(cc, ctx, bytes));
  }
  PEBBLE_LAUNCH(LaunchEmbeddingBackward(
      t, g.data, reinterpret_cast<const int64_t*>(indices.data), out.data,
      indices.num_elements(), out.shape[0], out.shape[1], scratch, cc.stream));
  return absl::OkStatus();
}

absl::Status Arange(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 0, 0));
  if (ctx.output.dtype != DType::kInt64 || ctx.output.rank() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("output: expected i64 (n), got ", ctx.output.ToString()));
  }
  PEBBLE_LAUNCH(LaunchArange(reinterpret_cast<int64_t*>(ctx.output.data),
                             ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// ---- Head splits: (B, S, C) <-> (B, H, S, Dh) parts (kmath::HeadsMap).

// The map of a heads tensor `heads` (B, H, S, Dh) as part `index` of a
// merged (B, S, width) tensor.
absl::StatusOr<kmath::HeadsMap> HeadsMapOf(const Shape& heads,
                                           const Shape& merged, int64_t index) {
  if (heads.size() != 4 || merged.size() != 3 || heads[0] != merged[0] ||
      heads[2] != merged[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected heads (B,H,S,Dh) and (B,S,C), got ",
                     ShapeToString(heads), " and ", ShapeToString(merged)));
  }
  kmath::HeadsMap m;
  m.heads = heads[1];
  m.seq = heads[2];
  m.head_dim = heads[3];
  m.width = merged[2];
  m.column = index * m.heads * m.head_dim;
  if (index < 0 || m.column + m.heads * m.head_dim > m.width) {
    return absl::InvalidArgumentError(
        absl::StrCat("part ", index, " of ", ShapeToString(heads),
                     " does not fit in ", ShapeToString(merged)));
  }
  return m;
}

absl::Status SplitHeads(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  if (x.dtype != ctx.output.dtype)
    return absl::InvalidArgumentError("dtype mismatch");
  ASSIGN_OR_RETURN(int64_t index, IntAttr(ctx.attrs(), "index", 0));
  ASSIGN_OR_RETURN(kmath::HeadsMap m,
                   HeadsMapOf(ctx.output.shape, x.shape, index));
  PEBBLE_LAUNCH(LaunchHeadsCopy(static_cast<int>(DTypeSize(x.dtype)), m,
                                /*to_heads=*/true, x.data, ctx.output.data,
                                ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// transpose (x), attr perm (checked by the operator table).
absl::Status Transpose(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  ASSIGN_OR_RETURN(std::vector<int64_t> perm,
                   ops_internal::IntListAttr(ctx.attrs(), "perm"));
  if (!ops_internal::PermutesInto(x.shape, perm, ctx.output.shape) ||
      x.dtype != ctx.output.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attr 'perm' and ", ctx.output.ToString(), " do not fit ", x.ToString()));
  }
  const kmath::PermuteMap m =
      kmath::MakePermuteMap(x.shape.data(), perm.data(), x.rank());
  PEBBLE_LAUNCH(LaunchTranspose(static_cast<int>(DTypeSize(x.dtype)), m,
                                x.data, ctx.output.data,
                                ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// flip (x), attr dims: transpose's gather with the flipped dims' strides
// negated (kmath::MakeFlipMap).
absl::Status Flip(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& x = ctx.inputs[0];
  RETURN_IF_ERROR(ExpectSameType(ctx.output, x, "input 0"));
  ASSIGN_OR_RETURN(const std::vector<bool> flipped, ops_internal::FlipDims(ctx.attrs(), x.rank()));
  bool mask[kmath::kMaxPermuteRank] = {};
  for (int d = 0; d < x.rank(); ++d) mask[d] = flipped[d];
  const kmath::PermuteMap m = kmath::MakeFlipMap(x.shape.data(), mask, x.rank());
  PEBBLE_LAUNCH(LaunchTranspose(static_cast<int>(DTypeSize(x.dtype)), m, x.data,
                                ctx.output.data, ctx.output.num_elements(), cc.stream));
  return absl::OkStatus();
}

// merge_heads (x_1 ... x_m): part j goes to columns [j H Dh, (j + 1) H Dh).
absl::Status MergeHeads(CudaContext& cc, const KernelContext& ctx) {
  if (ctx.inputs.empty()) return absl::InvalidArgumentError("expected inputs");
  for (size_t j = 0; j < ctx.inputs.size(); ++j) {
    const TensorView& part = ctx.inputs[j];
    if (part.dtype != ctx.output.dtype || part.shape != ctx.inputs[0].shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", j, ": expected ", DTypeName(ctx.output.dtype),
          ShapeToString(ctx.inputs[0].shape), ", got ", part.ToString()));
    }
    ASSIGN_OR_RETURN(kmath::HeadsMap m, HeadsMapOf(part.shape, ctx.output.shape,
                                                   static_cast<int64_t>(j)));
    PEBBLE_LAUNCH(LaunchHeadsCopy(static_cast<int>(DTypeSize(part.dtype)), m,
                                  /*to_heads=*/false, part.data,
                                  ctx.output.data, part.num_elements(),
                                  cc.stream));
  }
  const int64_t covered =
      static_cast<int64_t>(ctx.inputs.size()) * ctx.inputs[0].num_elements();
  if (covered != ctx.output.num_elements()) {
    return absl::InvalidArgumentError(
        "merge_heads: inputs do not fill the output");
  }
  return absl::OkStatus();
}

// split_heads_backward (g), attrs index: part `index` of the input
// gradient, zeros elsewhere.
absl::Status SplitHeadsBackward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 1, 1));
  const TensorView& g = ctx.inputs[0];
  if (g.dtype != ctx.output.dtype)
    return absl::InvalidArgumentError("dtype mismatch");
  ASSIGN_OR_RETURN(int64_t index, IntAttr(ctx.attrs(), "index", 0));
  ASSIGN_OR_RETURN(kmath::HeadsMap m,
                   HeadsMapOf(g.shape, ctx.output.shape, index));
  PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
      ctx.output.data, 0, static_cast<size_t>(ctx.output.bytes()), cc.stream));
  PEBBLE_LAUNCH(LaunchHeadsCopy(static_cast<int>(DTypeSize(g.dtype)), m,
                                /*to_heads=*/false, g.data, ctx.output.data,
                                g.num_elements(), cc.stream));
  return absl::OkStatus();
}

}  // namespace

// Note [Own kernel scratch]: the reductions (batch-norm statistics and
// gradients, bias and column sums, scalar losses) and the embedding
// gradient combine per-block partial sums in scratch, in a fixed order. Their
// sizes follow from the node's shapes alone, as each kernel computes them;
// planned as the node's workspace, the kernel takes its scratch from there
// (KernelScratch). The emulated backend tests check every model's kernels
// against these figures (no scratch outside the plan).
absl::StatusOr<int64_t> OwnKernelScratchBytes(const Graph& graph, NodeId v) {
  const std::string& op = graph.op(v);
  const auto in = graph.inputs(v);
  auto input = [&](size_t i) -> absl::StatusOr<Shape> {
    if (i >= in.size() || !graph.shape(in[i]).has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, " has no shape"));
    }
    return *graph.shape(in[i]);
  };
  const Shape& out = *graph.shape(v);
  auto channels = [](const Shape& s) {
    int64_t outer, c, inner;
    ChannelView(s, &outer, &c, &inner);
    return c;
  };
  auto columns = [&](const Shape& g) -> int64_t {  // ColumnSumInto's scratch
    const int64_t cols = NumElements(out);
    if (cols == 0 || NumElements(g) % cols != 0) return 0;
    return ColumnScratchBytes(NumElements(g) / cols, cols);
  };
  if (op == "batchnorm_stats" || op == "batchnorm_backward_bias" ||
      op == "conv2d_backward_bias" || op == "conv3d_backward_bias") {
    ASSIGN_OR_RETURN(Shape x, input(0));
    return ChannelScratchBytes(channels(x));
  }
  if (op == "batchnorm_backward" || op == "batchnorm_backward_weight") {
    ASSIGN_OR_RETURN(Shape x, input(1));
    return ChannelScratchBytes(channels(x));
  }
  if (op == "linear_backward_bias") {
    ASSIGN_OR_RETURN(Shape g, input(0));
    return ChannelScratchBytes(g.empty() ? 1 : g.back());
  }
  if (op == "mse_loss" || op == "bce_with_logits" || op == "softmax_cross_entropy" ||
      op == "sum") {
    return ScalarScratchBytes();
  }
  if (op == "layernorm_backward_weight" || op == "layernorm_backward_bias") {
    ASSIGN_OR_RETURN(Shape g, input(0));
    return columns(g);
  }
  if (op == "sum_to") {
    ASSIGN_OR_RETURN(Shape x, input(0));
    const std::optional<ops_internal::BroadcastBlock> b = ops_internal::BlockBroadcast(x, out);
    if (!b.has_value()) return 0;  // the kernel's own error
    return b->inner == 1 ? columns(x) : ChannelScratchBytes(b->block);
  }
  if (op == "embedding_backward" && out.size() == 2 && graph.dtype(v).has_value()) {
    absl::StatusOr<KType> t = KTypeOf(*graph.dtype(v));
    return t.ok() ? EmbeddingScratchBytes(*t, out[0], out[1]) : 0;
  }
  return 0;
}

void AddOwnKernels(std::map<std::string, CudaKernelFn>& t) {
  t["relu"] = UnaryKernel<UnaryOp::kRelu>;
  t["tanh"] = UnaryKernel<UnaryOp::kTanh>;
  t["sigmoid"] = UnaryKernel<UnaryOp::kSigmoid>;
  t["gelu"] = Gelu;
  t["relu_backward"] = UnaryBackwardKernel<UnaryOp::kRelu>;
  t["tanh_backward"] = UnaryBackwardKernel<UnaryOp::kTanh>;
  t["sigmoid_backward"] = UnaryBackwardKernel<UnaryOp::kSigmoid>;
  t["gelu_backward"] = GeluBackward;
  t["clip"] = UnaryKernel<UnaryOp::kClip>;
  t["clip_backward"] = UnaryBackwardKernel<UnaryOp::kClip>;
  t["hardsigmoid"] = UnaryKernel<UnaryOp::kHardSigmoid>;
  t["hardsigmoid_backward"] = UnaryBackwardKernel<UnaryOp::kHardSigmoid>;
  t["erf"] = UnaryKernel<UnaryOp::kErf>;
  t["sqrt"] = UnaryKernel<UnaryOp::kSqrt>;
  t["sqrt_backward"] = UnaryBackwardKernel<UnaryOp::kSqrt>;
  t["erf_backward"] = UnaryBackwardKernel<UnaryOp::kErf>;
  t["hardswish"] = UnaryKernel<UnaryOp::kHardSwish>;
  t["hardswish_backward"] = UnaryBackwardKernel<UnaryOp::kHardSwish>;
  t["leaky_relu"] = UnaryKernel<UnaryOp::kLeakyRelu>;
  t["leaky_relu_backward"] = UnaryBackwardKernel<UnaryOp::kLeakyRelu>;
  t["elu"] = UnaryKernel<UnaryOp::kElu>;
  t["elu_backward"] = UnaryBackwardKernel<UnaryOp::kElu>;
  t["softplus"] = UnaryKernel<UnaryOp::kSoftplus>;
  t["softplus_backward"] = UnaryBackwardKernel<UnaryOp::kSoftplus>;
  t["abs"] = UnaryKernel<UnaryOp::kAbs>;
  t["abs_backward"] = UnaryBackwardKernel<UnaryOp::kAbs>;
  t["exp"] = UnaryKernel<UnaryOp::kExp>;
  t["exp_backward"] = UnaryBackwardKernel<UnaryOp::kExp>;
  t["log"] = UnaryKernel<UnaryOp::kLog>;
  t["log_backward"] = UnaryBackwardKernel<UnaryOp::kLog>;
  t["add"] = BinaryKernel<BinaryOp::kAdd>;
  t["mul"] = BinaryKernel<BinaryOp::kMul>;
  t["sub"] = BinaryKernel<BinaryOp::kSub>;
  t["div"] = BinaryKernel<BinaryOp::kDiv>;
  t["maximum"] = BinaryKernel<BinaryOp::kMaximum>;
  t["minimum"] = BinaryKernel<BinaryOp::kMinimum>;
  t["maximum_backward"] = ExtremumBackward<true>;
  t["minimum_backward"] = ExtremumBackward<false>;
  t["sgd_momentum"] = OptimizerUpdate<optim::UpdateOp::kSgdMomentum>;
  t["sgd_update"] = OptimizerUpdate<optim::UpdateOp::kSgdUpdate>;
  t["adam_exp_avg"] = OptimizerUpdate<optim::UpdateOp::kAdamExpAvg>;
  t["adam_exp_avg_sq"] = OptimizerUpdate<optim::UpdateOp::kAdamExpAvgSq>;
  t["adam_update"] = OptimizerUpdate<optim::UpdateOp::kAdamUpdate>;
  t["optimizer_step"] = OptimizerStep;
  t["batchnorm_stats"] = BatchNormStats;
  t["batchnorm"] = BatchNorm;
  t["batchnorm_backward"] = BatchNormBackward;
  t["batchnorm_backward_weight"] = BatchNormBackwardWeight;
  t["batchnorm_backward_bias"] = BiasGradNc;
  t["conv2d_backward_bias"] = BiasGradNc;
  t["conv3d_backward_bias"] = BiasGradNc;
  t["linear_backward_bias"] = BiasGradLast;
  t["maxpool"] = MaxPool;
  t["maxpool_backward"] = MaxPoolBackward;
  t["upsample"] = Upsample;
  t["upsample_backward"] = UpsampleBackward;
  t["global_avgpool"] = GlobalAvgPool;
  t["global_avgpool_backward"] = GlobalAvgPoolBackward;
  t["mse_loss"] = PointLoss<false>;
  t["mse_loss_backward"] = PointLossBackward<false>;
  t["bce_with_logits"] = PointLoss<true>;
  t["bce_with_logits_backward"] = PointLossBackward<true>;
  t["softmax_cross_entropy"] = CrossEntropy;
  t["softmax_cross_entropy_backward"] = CrossEntropyBackward;
  t["sum"] = Sum;
  t["sum_backward"] = SumBackward;
  t["fill"] = Fill;
  t["constant"] = Constant;
  t["softmax"] = Softmax<false>;
  t["softmax_backward"] = SoftmaxBackward<false>;
  t["log_softmax"] = Softmax<true>;
  t["log_softmax_backward"] = SoftmaxBackward<true>;
  t["copy"] = CopyBytes;
  t["cast"] = Cast;
  t["flatten"] = CopyBytes;
  t["reshape"] = CopyBytes;
  t["pad"] = Pad;
  t["pad_backward"] = PadBackward;
  t["slice"] = Slice;
  t["concat"] = Concat;
  t["avgpool"] = AvgPool<false>;
  t["avgpool_backward"] = AvgPoolBackward<false>;
  t["adaptive_avgpool"] = AvgPool<true>;
  t["adaptive_avgpool_backward"] = AvgPoolBackward<true>;
  t["layernorm_stats"] = LayerNormStats;
  t["layernorm"] = LayerNorm;
  t["layernorm_backward"] = LayerNormBackward;
  t["layernorm_backward_weight"] = LayerNormBackwardWeight;
  t["layernorm_backward_bias"] = SumLeading;
  t["sum_to"] = SumTo;
  t["compare"] = Compare;
  t["masked_fill"] = MaskedFill;
  t["dropout_mask"] = DropoutMask;
  t["random"] = Random;
  t["dropout"] = DropoutApply;
  t["dropout_backward"] = DropoutApply;
  t["embedding"] = Embedding;
  t["embedding_backward"] = EmbeddingBackward;
  t["arange"] = Arange;
  t["split_heads"] = SplitHeads;
  t["transpose"] = Transpose;
  t["flip"] = Flip;
  t["split_heads_backward"] = SplitHeadsBackward;
  t["merge_heads"] = MergeHeads;
}

namespace {

const std::map<std::string, CudaKernelFn>& Table() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, CudaKernelFn>;
    AddOwnKernels(*t);
    AddDnnKernels(*t);
    return t;
  }();
  return *table;
}

}  // namespace

CudaKernelFn FindCudaKernel(absl::string_view op) {
  auto it = Table().find(std::string(op));
  return it == Table().end() ? nullptr : it->second;
}

std::vector<std::string> CudaKernelOps() {
  std::vector<std::string> ops;
  for (const auto& [name, fn] : Table()) ops.push_back(name);
  return ops;
}

}  // namespace pebble::cuda
