// Shared helpers of the CPU backend's own kernels (native_util.h).
#include "runtime/cpu/native_util.h"

#include <vector>

#include "graph/ops.h"

namespace pebble::native {

float LoadAsFloat(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kFloat16:
      return ToFloat(t.as<Half>()[i]);
    case DType::kBFloat16:
      return ToFloat(t.as<BFloat16>()[i]);
    default:
      return t.as<float>()[i];
  }
}

void StoreFloat(const TensorView& t, int64_t i, float value) {
  switch (t.dtype) {
    case DType::kFloat16:
      t.as<Half>()[i] = FromFloat<Half>(value);
      break;
    case DType::kBFloat16:
      t.as<BFloat16>()[i] = FromFloat<BFloat16>(value);
      break;
    default:
      t.as<float>()[i] = value;
      break;
  }
}

absl::Status CheckOperands(const KernelContext& ctx) {
  if (ctx.graph == nullptr || ctx.node < 0 ||
      ctx.node >= ctx.graph->num_nodes()) {
    return absl::InvalidArgumentError("kernel context without a graph node");
  }
  const OpDef* def = FindOp(ctx.op());
  if (def == nullptr || def->infer == nullptr) {
    return Invalid(ctx, "not in the operator table");
  }
  const int n = static_cast<int>(ctx.inputs.size());
  if (n < def->min_inputs || (def->max_inputs >= 0 && n > def->max_inputs)) {
    return Invalid(ctx, "takes ", def->min_inputs, " to ",
                   def->max_inputs < 0 ? std::string("any number of")
                                       : absl::StrCat(def->max_inputs),
                   " inputs, got ", n);
  }
  std::vector<TensorType> types;
  types.reserve(n);
  for (int i = 0; i < n; ++i) {
    const TensorView& t = ctx.inputs[i];
    if (t.data == nullptr && t.bytes() > 0) {
      return Invalid(ctx, "input ", i, " ", t.ToString(), " has no memory");
    }
    types.push_back({t.shape, t.dtype});
  }
  if (ctx.output.data == nullptr && ctx.output.bytes() > 0) {
    return Invalid(ctx, "output ", ctx.output.ToString(), " has no memory");
  }
  absl::StatusOr<TensorType> out = def->infer(types, ctx.attrs());
  if (!out.ok()) return Invalid(ctx, out.status().message());
  if (out->shape != ctx.output.shape || out->dtype != ctx.output.dtype) {
    return Invalid(ctx, "the operands give an output ",
                   DTypeName(out->dtype), ShapeToString(out->shape),
                   " but the output buffer is ", ctx.output.ToString());
  }
  return absl::OkStatus();
}

void ParallelCopy(std::byte* dst, const std::byte* src, int64_t bytes) {
  constexpr int64_t kCopyGrain = 1 << 18;
  ParallelFor(bytes, kCopyGrain, [&](int64_t b0, int64_t b1) {
    std::memcpy(dst + b0, src + b0, static_cast<size_t>(b1 - b0));
  });
}

}  // namespace pebble::native
