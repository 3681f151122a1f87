#include "runtime/kernel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/border_pad.h"
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

std::vector<std::string> KernelTable::Ops() const {
  std::vector<std::string> ops;
  ops.reserve(kernels_.size());
  for (const auto& [op, kernel] : kernels_) ops.push_back(op);
  return ops;
}

}  // namespace pebble
