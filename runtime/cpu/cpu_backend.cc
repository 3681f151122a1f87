// Placeholder: the CPU backend lands here.
#include "runtime/cpu/cpu_backend.h"

namespace pebble {

const KernelTable& CpuKernels() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable;
    RegisterDnnlKernels(*t);
    RegisterNativeKernels(*t);
    return t;
  }();
  return *table;
}

std::unique_ptr<Backend> MakeCpuBackend() { return nullptr; }

}  // namespace pebble
