// Host stand-ins for the CUDA runtime, cuDNN and cuBLAS calls that the own
// kernels (cuda_kernels.cu), runtime/cuda/cuda_ops.cc and cuda_status.cc
// make, for the emulated build (cuda_emu.h): "device" memory is host memory,
// every call runs to completion when made, and the error state follows the
// runtime's (cudaGetLastError returns and clears the last launch error;
// a kernel fault is sticky and cudaStreamSynchronize reports it).
//
// The functions themselves are the runtime's C symbols (cudaMemcpyAsync,
// ...), defined in host_runtime.cc with the headers' signatures, so that
// code written for the runtime links against them unchanged. A binary links
// either these or the real libraries, never both.
#ifndef PEBBLE_RUNTIME_CUDA_EMU_HOST_RUNTIME_H_
#define PEBBLE_RUNTIME_CUDA_EMU_HOST_RUNTIME_H_

#include <cuda_runtime_api.h>

namespace pebble::cuda::emu {

// Sets the error the next cudaGetLastError returns; cudaErrorLaunchFailure
// (a kernel fault) also stays for cudaStreamSynchronize until
// ClearStickyError.
void SetLaunchError(cudaError_t e);
void ClearStickyError();

}  // namespace pebble::cuda::emu

#endif  // PEBBLE_RUNTIME_CUDA_EMU_HOST_RUNTIME_H_
