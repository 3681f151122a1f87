// Kernel arguments that both backends read the same way from a node's
// attrs and operands: the index maps of runtime/kernel_math.h. Internal to
// the runtime: not installed.
#ifndef PEBBLE_RUNTIME_KERNEL_ARGS_H_
#define PEBBLE_RUNTIME_KERNEL_ARGS_H_

#include "absl/status/statusor.h"
#include "runtime/kernel.h"
#include "runtime/kernel_math.h"

namespace pebble {

// The index map of a `pad` node in mode reflect or replicate, from its
// attrs and operands; with `backward`, of a `pad_backward` node, whose
// gradient is the padded tensor (Note [Border padding]).
absl::StatusOr<kmath::BorderPad> BorderPadOf(const KernelContext& ctx, bool backward);

// A `compare` node: its op and how each operand is read over the result
// (Note [Broadcast index]). The operands share a dtype; the result is u8.
struct CompareArgs {
  kmath::CompareOp op = kmath::CompareOp::kEq;
  kmath::BroadcastIndex a, b;
};
absl::StatusOr<CompareArgs> CompareArgsOf(const KernelContext& ctx);

// A `masked_fill` node: how the mask is read over x, the value (in x's
// dtype, through float, on both backends) and which mask elements fill.
struct MaskedFillArgs {
  kmath::BroadcastIndex mask;
  float value = 0;
  bool invert = false;  // fill where the mask is 0
};
absl::StatusOr<MaskedFillArgs> MaskedFillArgsOf(const KernelContext& ctx);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_KERNEL_ARGS_H_
