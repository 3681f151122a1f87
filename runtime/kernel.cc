#include "runtime/kernel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/kernel_args.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble {

void KernelTable::Register(std::string op, KernelFn kernel) {
  PEBBLE_CHECK(kernel != nullptr);
  auto it = std::lower_bound(
      kernels_.begin(), kernels_.end(), op,
      [](const auto& entry, const std::string& key) { return entry.first < key; });
  PEBBLE_CHECK(it == kernels_.end() || it->first != op);  // duplicate kernel
  kernels_.insert(it, {std::move(op), kernel});
}

KernelFn KernelTable::Find(absl::string_view op) const {
  auto it = std::lower_bound(
      kernels_.begin(), kernels_.end(), op,
      [](const auto& entry, absl::string_view key) { return entry.first < key; });
  if (it == kernels_.end() || it->first != op) return nullptr;
  return it->second;
}

absl::StatusOr<kmath::BorderPad> BorderPadOf(const KernelContext& ctx, bool backward) {
  if (ctx.inputs.size() != 1) return absl::InvalidArgumentError("pad takes one input");
  const TensorView& big = backward ? ctx.inputs[0] : ctx.output;
  const TensorView& small = backward ? ctx.output : ctx.inputs[0];
  ASSIGN_OR_RETURN(const std::string mode,
                   ops_internal::StringAttr(ctx.attrs(), "mode", "constant"));
  ASSIGN_OR_RETURN(const std::vector<int64_t> pads,
                   ops_internal::IntListAttr(ctx.attrs(), "pads"));
  if ((mode != "reflect" && mode != "replicate") || big.rank() != small.rank() ||
      big.rank() > kmath::kMaxBorderRank || pads.size() > 2 * static_cast<size_t>(big.rank())) {
    return absl::InvalidArgumentError(absl::StrCat("mode \"", mode, "\" does not pad ",
                                                   small.ToString(), " into ", big.ToString()));
  }
  kmath::BorderPad p;
  p.mode = mode == "reflect" ? kmath::BorderMode::kReflect : kmath::BorderMode::kReplicate;
  p.rank = big.rank();
  for (int d = 0; d < p.rank; ++d) {
    p.in[d] = small.shape[d];
    p.out[d] = big.shape[d];
  }
  for (size_t i = 0; i < pads.size() / 2; ++i) p.before[p.rank - 1 - i] = pads[2 * i];
  return p;
}

static_assert(kmath::kMaxBroadcastRank == ops_internal::kMaxBroadcastRank,
              "compare's and masked_fill's rank limit differs between the op table and the "
              "kernels");

namespace {

// How `operand` is read over `result` (Note [Broadcast index]).
absl::StatusOr<kmath::BroadcastIndex> BroadcastIndexOf(const TensorView& operand,
                                                       const TensorView& result) {
  kmath::BroadcastIndex b;
  if (!kmath::MakeBroadcastIndex(result.shape.data(), result.rank(), operand.shape.data(),
                                 operand.rank(), &b)) {
    return absl::InvalidArgumentError(absl::StrCat(operand.ToString(), " does not broadcast to ",
                                                   result.ToString()));
  }
  return b;
}

}  // namespace

absl::StatusOr<CompareArgs> CompareArgsOf(const KernelContext& ctx) {
  if (ctx.inputs.size() != 2 || ctx.inputs[0].dtype != ctx.inputs[1].dtype ||
      ctx.output.dtype != DType::kUInt8) {
    return absl::InvalidArgumentError("compare takes two operands of one dtype into u8");
  }
  ASSIGN_OR_RETURN(const int op, ops_internal::CompareOpAttr(ctx.attrs()));
  CompareArgs args;
  args.op = static_cast<kmath::CompareOp>(op);
  ASSIGN_OR_RETURN(args.a, BroadcastIndexOf(ctx.inputs[0], ctx.output));
  ASSIGN_OR_RETURN(args.b, BroadcastIndexOf(ctx.inputs[1], ctx.output));
  return args;
}

absl::StatusOr<MaskedFillArgs> MaskedFillArgsOf(const KernelContext& ctx) {
  if (ctx.inputs.size() != 2 || ctx.inputs[1].dtype != DType::kUInt8 ||
      ctx.inputs[0].dtype != ctx.output.dtype || ctx.inputs[0].shape != ctx.output.shape) {
    return absl::InvalidArgumentError("masked_fill takes x and a u8 mask into x's type");
  }
  MaskedFillArgs args;
  ASSIGN_OR_RETURN(const double value,
                   ops_internal::ExtendedDoubleAttr(ctx.attrs(), "value", 0.0));
  args.value = static_cast<float>(value);
  ASSIGN_OR_RETURN(args.invert, ops_internal::BoolAttr(ctx.attrs(), "invert", false));
  ASSIGN_OR_RETURN(args.mask, BroadcastIndexOf(ctx.inputs[1], ctx.output));
  return args;
}

std::vector<std::string> KernelTable::Ops() const {
  std::vector<std::string> ops;
  ops.reserve(kernels_.size());
  for (const auto& [op, kernel] : kernels_) ops.push_back(op);
  return ops;
}

}  // namespace pebble
