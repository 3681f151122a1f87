// The CPU backend: host memory as the device, oneDNN for the heavy
// operators (runtime/cpu/dnnl_kernels.cc), own kernels for the rest
// (runtime/cpu/native_kernels*.cc), oneTBB for parallel loops. Synchronous:
// every call completes before it returns, so the copy "stream" is a memcpy
// and events are timestamps (runtime/backend.h).
#ifndef PEBBLE_RUNTIME_CPU_CPU_BACKEND_H_
#define PEBBLE_RUNTIME_CPU_CPU_BACKEND_H_

#include <memory>

#include "runtime/backend.h"
#include "runtime/kernel.h"

namespace pebble {

// Kernel families of the CPU backend; CpuKernels() calls each once.
void RegisterDnnlKernels(KernelTable& table);    // cpu/dnnl_kernels.cc
void RegisterNativeKernels(KernelTable& table);  // cpu/native_kernels*.cc

// Every CPU kernel (built once, thread-safe).
const KernelTable& CpuKernels();

std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_CPU_CPU_BACKEND_H_
