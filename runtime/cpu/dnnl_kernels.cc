// Placeholder: the oneDNN kernels land here.
#include "runtime/cpu/cpu_backend.h"

namespace pebble {

void RegisterDnnlKernels(KernelTable& table) { (void)table; }

}  // namespace pebble
