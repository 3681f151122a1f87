// The index map of pad's modes reflect and replicate for a kernel (Note
// [Border padding] in runtime/kernel_math.h), which both backends run.
// Internal to the runtime: not installed.
#ifndef PEBBLE_RUNTIME_BORDER_PAD_H_
#define PEBBLE_RUNTIME_BORDER_PAD_H_

#include "absl/status/statusor.h"
#include "runtime/kernel.h"
#include "runtime/kernel_math.h"

namespace pebble {

// The index map of a `pad` node in mode reflect or replicate, from its
// attrs and operands; with `backward`, of a `pad_backward` node, whose
// gradient is the padded tensor.
absl::StatusOr<kmath::BorderPad> BorderPadOf(const KernelContext& ctx, bool backward);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_BORDER_PAD_H_
