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
// The kernels that take scratch (RegisterDnnlKernels'): the others never do,
// so their workspace is 0 without a probe.
const KernelTable& CpuScratchKernels();

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

// Note [Planned scratch]
// A oneDNN-family kernel takes scratch for oneDNN's scratchpad (user-managed),
// operands relaid into the layout oneDNN chose, and fp32 copies of fp16/bf16
// operands; each request rounded up to 64 bytes. It carves them, in order,
// from the planned workspace of its node (KernelContext::workspace); what
// does not fit comes from buffers of the calling thread, outside the plan,
// and is reported to NoteCpuKernelScratch. CpuBackend::QueryWorkspace runs
// the kernel once, on zeros and with no workspace, and returns the total it
// asked for: planned as the node's workspace, the whole step stays in the
// arena (scratch_bytes 0). The probe runs no oneDNN primitive and no
// half-precision conversion (dnnl_internal::Probing): the requests depend
// on the shapes alone, and a probe then takes milliseconds and touches
// little of its operands' mappings, however large they are.
//
// The largest scratch (bytes) one oneDNN-family kernel call has used since
// the process started, planned or not. Thread-safe.
int64_t DnnlScratchPeakBytes();  // cpu/dnnl_util.cc
// The scratch (bytes) `kernel` (a oneDNN-family kernel) asks for when it
// computes `node` once, on the calling thread, on zeroed operands of the
// node's shapes and with no planned workspace: the probe of
// CpuBackend::QueryWorkspace. Operands and scratch live in mappings of the
// probe's own, unmapped when it returns (none stays resident), and nothing
// is reported as scratch outside a plan. The node and its inputs need
// shapes and dtypes.
absl::StatusOr<int64_t> DnnlProbeScratchBytes(KernelFn kernel, const Graph& graph, NodeId node);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_CPU_CPU_BACKEND_H_
