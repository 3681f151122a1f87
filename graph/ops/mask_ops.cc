// Masks and selections: compare (two operands into a u8 truth value per
// element) and masked_fill (a value written where a mask says). Together
// they express `torch.where`, `masked_fill` and a padding mask computed
// from token ids; their operands broadcast by NumPy's rules in full (Note
// [Broadcast index] in runtime/kernel_math.h). maximum and minimum of two
// tensors of one shape (torch.maximum, torch.minimum). FLOPs per element in
// docs/operators.md.
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/autodiff.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::ops_internal {
namespace {

constexpr size_t kMaxMaskRank = kMaxBroadcastRank;

bool IsMaskOperandType(DType dtype) {
  return IsFloat(dtype) || dtype == DType::kInt64 || dtype == DType::kUInt8;
}

// compare (a, b), attr op: u8 of the broadcast shape, 1 where `a op b`.
absl::StatusOr<TensorType> InferCompare(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(CompareOpAttr(attrs).status());
  if (!IsMaskOperandType(in[0].dtype)) {
    return Invalid("input 0 (a) must be fp32, fp16, bf16, i64 or u8, got ",
                   DTypeName(in[0].dtype));
  }
  RETURN_IF_ERROR(ExpectSameDType(in[0], "a", in[1], "b"));
  std::optional<Shape> shape = BroadcastShapes(in[0].shape, in[1].shape);
  if (!shape) {
    return Invalid("shapes ", ShapeToString(in[0].shape), " and ", ShapeToString(in[1].shape),
                   " do not broadcast (aligned on the trailing dims, each dim equal or 1)");
  }
  if (shape->size() > kMaxMaskRank) return Invalid("rank above ", kMaxMaskRank);
  return TensorType{*std::move(shape), DType::kUInt8};
}

// masked_fill (x, mask), attrs value (0; "inf" and "-inf" too), invert
// (false): x's type, `value` where the mask is not 0 (with `invert`: where
// it is 0), x elsewhere. The mask broadcasts over x.
absl::StatusOr<TensorType> InferMaskedFill(Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(ExtendedDoubleAttr(attrs, "value", 0.0).status());
  RETURN_IF_ERROR(BoolAttr(attrs, "invert", false).status());
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  RETURN_IF_ERROR(ExpectDType(in[1], DType::kUInt8, "input 1 (mask)"));
  if (in[0].shape.size() > kMaxMaskRank) return Invalid("rank above ", kMaxMaskRank);
  if (BroadcastShapes(in[0].shape, in[1].shape) != in[0].shape) {
    return Invalid("mask ", ShapeToString(in[1].shape), " does not broadcast over x ",
                   ShapeToString(in[0].shape),
                   " (aligned on the trailing dims, each dim of the mask 1 or x's)");
  }
  return in[0];
}

// d masked_fill(x, m, v) / dx: the gradient with the filled elements' zeroed,
// masked_fill(g, m, 0) (PyTorch's masked_fill backward); the mask has none.
absl::Status MaskedFillBackward(BackwardContext& ctx) {
  if (!ctx.needs_grad(0)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool invert, BoolAttr(ctx.attrs(), "invert", false));
  ctx.AccumulateGrad(0, ctx.Emit("masked_fill", {ctx.grad_output(), ctx.input(1)},
                                 {{"value", 0.0}, {"invert", invert}}));
  return absl::OkStatus();
}

double OutputElements(Inputs, const TensorType& out, const Json&) { return Elements(out); }

// maximum, minimum (a, b): float operands of one shape and dtype (the
// importer expands a broadcast operand first).
absl::StatusOr<TensorType> InferExtremum(Inputs in, const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (a)"));
  RETURN_IF_ERROR(ExpectSameDType(in[0], "a", in[1], "b"));
  RETURN_IF_ERROR(ExpectSameShape(in[0], "a", in[1], "b"));
  return in[0];
}

// maximum_backward, minimum_backward (grad, a, b), attr input (0: a's
// gradient, 1: b's).
absl::StatusOr<TensorType> InferExtremumBackward(Inputs in, const Json& attrs) {
  ASSIGN_OR_RETURN(const int64_t input, IntAttr(attrs, "input", 0));
  if (input != 0 && input != 1) return Invalid("attr 'input' must be 0 or 1, got ", input);
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  for (int i : {1, 2}) {
    const char* name = i == 1 ? "a" : "b";
    RETURN_IF_ERROR(ExpectSameDType(in[0], "grad", in[i], name));
    RETURN_IF_ERROR(ExpectSameShape(in[0], "grad", in[i], name));
  }
  return in[0];
}

// Each operand's gradient reads both operands (ATen's maximum backward:
// the gradient goes to the larger, half of it to each at a tie).
std::function<absl::Status(BackwardContext&)> ExtremumBackward(std::string backward_op) {
  return [backward_op = std::move(backward_op)](BackwardContext& ctx) {
    for (int i : {0, 1}) {
      if (!ctx.needs_grad(i)) continue;
      ctx.AccumulateGrad(i, ctx.Emit(backward_op, {ctx.grad_output(), ctx.input(0), ctx.input(1)},
                                     {{"input", i}}));
    }
    return absl::OkStatus();
  };
}

}  // namespace

void RegisterMaskOps(std::vector<OpDef>& t) {
  t.push_back({.name = "compare", .min_inputs = 2, .max_inputs = 2, .infer = InferCompare,
               .flops = OutputElements});
  t.push_back({.name = "masked_fill", .min_inputs = 2, .max_inputs = 2,
               .infer = InferMaskedFill, .flops = OutputElements,
               .backward = MaskedFillBackward});
  for (const char* op : {"maximum", "minimum"}) {
    const std::string backward = absl::StrCat(op, "_backward");
    t.push_back({.name = op, .min_inputs = 2, .max_inputs = 2, .infer = InferExtremum,
                 .flops = OutputElements, .backward = ExtremumBackward(backward)});
    t.push_back({.name = backward, .min_inputs = 3, .max_inputs = 3,
                 .infer = InferExtremumBackward, .flops = OutputElements});
  }
}

}  // namespace pebble::ops_internal
