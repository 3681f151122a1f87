// The CPU backend: host memory as the device, oneDNN for the heavy
// operators (runtime/cpu/dnnl_kernels.cc), own kernels for the rest
// (runtime/cpu/native_kernels*.cc), oneTBB for parallel loops. Synchronous:
// every call completes before it returns, so the copy "stream" is a memcpy
// and events are timestamps (runtime/backend.h).
#ifndef PEBBLE_RUNTIME_CPU_CPU_BACKEND_H_
#define PEBBLE_RUNTIME_CPU_CPU_BACKEND_H_

#include <cstdint>
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

// Alignment of every CPU backend allocation (bytes): at least the 256 bytes
// the Backend interface promises, and a multiple of the 64-byte cache line
// and AVX-512 vector.
inline constexpr int64_t kCpuAlignment = 256;

// Threads the CPU kernels use (oneTBB's arena; oneDNN's OpenMP pool follows
// the same core count unless OMP_NUM_THREADS says otherwise).
int CpuBackendThreads();

// A kernel that allocates scratch memory outside its planned workspace
// (a library scratchpad, a temporary copy) reports its size here, in bytes;
// BackendMemoryStats::scratch_bytes_peak is the high-water mark since the
// backend was made. Thread-safe.
void NoteCpuKernelScratch(int64_t bytes);

// The largest scratch (bytes) one oneDNN-family kernel call has used since
// the process started: oneDNN scratchpads (user-managed, per calling
// thread), fp32 copies of fp16/bf16 operands and kernel temporaries. This
// memory lies outside the planned arena; each calling thread keeps buffers
// of its own largest request. The same figures reach NoteCpuKernelScratch.
// Thread-safe.
int64_t DnnlScratchPeakBytes();  // cpu/dnnl_util.cc

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_CPU_CPU_BACKEND_H_
