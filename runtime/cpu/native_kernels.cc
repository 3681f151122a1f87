// Placeholder: the own kernels land here.
#include "runtime/cpu/cpu_backend.h"

namespace pebble {

void RegisterNativeKernels(KernelTable& table) { (void)table; }

}  // namespace pebble
