// Turning CUDA runtime, cuDNN and cuBLAS errors into absl::Status.
//
// Every call into those libraries goes through PEBBLE_CUDA_RETURN_IF_ERROR
// (or PEBBLE_CUDA_STATUS where the caller wants the Status itself): the
// message holds the call's text, file:line and the library's own error
// string, e.g.
//   cudaMalloc(&ptr, bytes) failed at runtime/cuda/cuda_backend.cc:120:
//   out of memory (cudaErrorMemoryAllocation)
// Out-of-memory errors are ResourceExhausted, cuDNN/cuBLAS "not supported"
// is Unimplemented, "no device / no driver" (and a cuDNN installation that
// cannot run here) is FailedPrecondition, anything else Internal. Callers
// add the node, op and step.
#ifndef PEBBLE_RUNTIME_CUDA_CUDA_STATUS_H_
#define PEBBLE_RUNTIME_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "absl/status/status.h"

namespace pebble::cuda {

inline bool CallOk(cudaError_t e) { return e == cudaSuccess; }
inline bool CallOk(cudnnStatus_t e) { return e == CUDNN_STATUS_SUCCESS; }
inline bool CallOk(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }

// cuDNN "not supported" sub-codes that describe the installation, not the
// configuration (cudnn_graph.h): a driver or CUDA runtime this cuDNN cannot
// use, another GPU architecture, a missing runtime prerequisite (NVRTC) or
// sub-library. CallStatus makes them FailedPrecondition with cuDNN's last
// error string.
bool CudnnEnvironmentFault(cudnnStatus_t e);

absl::Status CallStatus(cudaError_t e, const char* call, const char* file,
                        int line);
absl::Status CallStatus(cudnnStatus_t e, const char* call, const char* file,
                        int line);
absl::Status CallStatus(cublasStatus_t e, const char* call, const char* file,
                        int line);

}  // namespace pebble::cuda

// The Status of a CUDA / cuDNN / cuBLAS call (OK on success).
#define PEBBLE_CUDA_STATUS(call)                                          \
  ([&]() -> ::absl::Status {                                              \
    const auto pebble_cuda_rc = (call);                                   \
    if (::pebble::cuda::CallOk(pebble_cuda_rc)) return ::absl::OkStatus(); \
    return ::pebble::cuda::CallStatus(pebble_cuda_rc, #call, __FILE__,    \
                                      __LINE__);                          \
  }())

// Returns the error Status of a failed CUDA / cuDNN / cuBLAS call.
#define PEBBLE_CUDA_RETURN_IF_ERROR(call)                                 \
  do {                                                                    \
    const auto pebble_cuda_rc = (call);                                   \
    if (!::pebble::cuda::CallOk(pebble_cuda_rc)) {                        \
      return ::pebble::cuda::CallStatus(pebble_cuda_rc, #call, __FILE__,  \
                                        __LINE__);                        \
    }                                                                     \
  } while (false)

#endif  // PEBBLE_RUNTIME_CUDA_CUDA_STATUS_H_
