// A host emulator for pebble's own CUDA kernels (runtime/cuda/*.cu), so that
// their logic runs and is tested on machines without a GPU (docs/cuda.md,
// "Host emulation").
//
// runtime/cuda/cuda_kernels.cu includes this header first when it is compiled
// as host C++ with PEBBLE_CUDA_EMULATION defined (cuda_kernels_emu.cc). The
// CUDA headers still give the types (dim3, uint3, cudaError_t, __half,
// __nv_bfloat16 with their host conversions); this header turns the device
// keywords into host C++ and supplies the built-in variables, __syncthreads,
// atomicMin and the kernel launch. A launch is enqueued on its stream
// (host_runtime.h), which runs it when the stream's schedule says.
//
// What it models, and what it checks on every launch:
//  - every thread of every block runs, with threadIdx, blockIdx, blockDim
//    and gridDim as on the device; the threads of one block run as fibers
//    (one host thread), each up to its next __syncthreads, so a barrier
//    holds exactly as on the device;
//  - __shared__ variables are function statics: one block runs at a time,
//    so each block sees its own (they keep the previous block's values,
//    where the device gives garbage);
//  - the launch limits of compute capability 9.0 (block <= 1024 threads,
//    z <= 64; grid y, z <= 65535): a bad configuration fails the launch with
//    cudaErrorInvalidConfiguration, as cudaGetLastError reports it;
//  - a barrier that not every thread of the block reaches, or threads that
//    wait at different barriers, is a fault (undefined behaviour on the
//    device, usually a hang): the launch stops, and the fault is reported by
//    cudaGetLastError / cudaStreamSynchronize and emu::TakeFaults();
//  - SetOrder(kReverse) runs blocks, and the threads of a block between two
//    barriers, in the opposite order: a kernel whose result depends on the
//    order (a race, a read of another thread's unwritten value) gives other
//    bits under the two orders.
// It does not model warps, the memory model beyond the barriers, device
// math's last-bit differences (the host's libm runs), or timing.
#ifndef PEBBLE_RUNTIME_CUDA_EMU_CUDA_EMU_H_
#define PEBBLE_RUNTIME_CUDA_EMU_CUDA_EMU_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/cuda/emu/host_runtime.h"

// Device-code keywords as host C++.
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline
#undef __shared__
#define __shared__ static
#define __syncthreads() ::pebble::cuda::emu::SyncThreads(__FILE__, __LINE__)

namespace pebble::cuda {

// The built-in variables of the emulated thread that runs now.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

// Device math the host spells in std.
using std::isnan;

// The fibers of a block share one host thread, so a plain update is atomic.
inline unsigned long long atomicMin(unsigned long long* address,
                                    unsigned long long value) {
  const unsigned long long old = *address;
  if (value < old) *address = value;
  return old;
}

namespace emu {

// The order in which blocks, and the threads of a block between barriers,
// run.
enum class Order { kForward, kReverse };
void SetOrder(Order order);
Order GetOrder();

// The faults found since the last call (one line each: the kernel, block,
// threads and barrier sites), and forgets them.
std::vector<std::string> TakeFaults();

// The calling thread's barrier; `file` and `line` name the call site.
void SyncThreads(const char* file, int line);

// Runs `thread` once for every thread of the grid (see the file comment).
// `kernel` identifies the kernel: whether it ever reached a barrier is
// remembered, and kernels that never do run as direct calls, without
// fibers. `name` is for fault messages.
void RunGrid(dim3 grid, dim3 block, const void* kernel, const char* name,
             const std::function<void()>& thread);

// Whether (grid, block) is within the launch limits (see the file comment).
bool ValidLaunch(dim3 grid, dim3 block);

// The emulated `kernel<<<grid, block, 0, stream>>>(args...)`: the arguments
// are converted to the kernel's parameter types once, as a launch copies
// them, every thread gets a copy, and the grid runs in its turn on `stream`
// (host_runtime.h). A bad configuration fails the launch at once.
template <typename... Params>
class Launcher {
 public:
  Launcher(dim3 grid, dim3 block, cudaStream_t stream,
           void (*kernel)(Params...), const char* name)
      : grid_(grid), block_(block), stream_(stream), kernel_(kernel),
        name_(name) {}

  template <typename... Args>
  void operator()(Args&&... args) const {
    if (!ValidLaunch(grid_, block_)) {
      SetLaunchError(cudaErrorInvalidConfiguration);
      return;
    }
    auto params = std::make_shared<const std::tuple<std::decay_t<Params>...>>(
        std::forward<Args>(args)...);
    Enqueue(stream_, [grid = grid_, block = block_, kernel = kernel_,
                      name = name_, params] {
      RunGrid(grid, block, reinterpret_cast<const void*>(kernel), name,
              [&] { std::apply(kernel, *params); });
    });
  }

 private:
  dim3 grid_, block_;
  cudaStream_t stream_;
  void (*kernel_)(Params...);
  const char* name_;
};

template <typename... Params>
Launcher<Params...> Launch(dim3 grid, dim3 block, cudaStream_t stream,
                           void (*kernel)(Params...), const char* name) {
  return Launcher<Params...>(grid, block, stream, kernel, name);
}

}  // namespace emu
}  // namespace pebble::cuda

#endif  // PEBBLE_RUNTIME_CUDA_EMU_CUDA_EMU_H_
