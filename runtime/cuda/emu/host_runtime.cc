// Host stand-ins for the runtime calls of the emulated build (host_runtime.h).
#include "runtime/cuda/emu/host_runtime.h"

#include <cublas_api.h>
#include <cudnn.h>

#include <cstring>
#include <mutex>

namespace pebble::cuda::emu {
namespace {

std::mutex error_mutex;
cudaError_t last_error = cudaSuccess;
cudaError_t sticky_error = cudaSuccess;

// The 2-D copy and set: `height` rows of `width` bytes, rows `pitch` apart.
cudaError_t CheckPitches(size_t width, size_t dpitch, size_t spitch) {
  return width > dpitch || width > spitch ? cudaErrorInvalidPitchValue
                                          : cudaSuccess;
}

// The runtime's name and text of the errors the emulated build returns.
struct ErrorWords {
  cudaError_t error;
  const char* name;
  const char* text;
};
constexpr ErrorWords kErrorWords[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue",
     "invalid pitch argument"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure",
     "unspecified launch failure (emulated: see the emulator's faults)"},
};

ErrorWords Describe(cudaError_t e) {
  for (const ErrorWords& w : kErrorWords) {
    if (w.error == e) return w;
  }
  return {e, "cudaError (emulated build)", "error of the emulated runtime"};
}

}  // namespace

void SetLaunchError(cudaError_t e) {
  std::lock_guard<std::mutex> lock(error_mutex);
  last_error = e;
  if (e == cudaErrorLaunchFailure) sticky_error = e;
}

void ClearStickyError() {
  std::lock_guard<std::mutex> lock(error_mutex);
  sticky_error = cudaSuccess;
  last_error = cudaSuccess;
}

}  // namespace pebble::cuda::emu

using pebble::cuda::emu::CheckPitches;
using pebble::cuda::emu::error_mutex;
using pebble::cuda::emu::last_error;
using pebble::cuda::emu::sticky_error;

extern "C" {

cudaError_t CUDARTAPI cudaGetLastError(void) {
  std::lock_guard<std::mutex> lock(error_mutex);
  const cudaError_t e = last_error;
  last_error = sticky_error;
  return e;
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t) {
  std::lock_guard<std::mutex> lock(error_mutex);
  return sticky_error;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count,
                                      enum cudaMemcpyKind, cudaStream_t) {
  if (count > 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpy2DAsync(void* dst, size_t dpitch,
                                        const void* src, size_t spitch,
                                        size_t width, size_t height,
                                        enum cudaMemcpyKind, cudaStream_t) {
  if (cudaError_t e = CheckPitches(width, dpitch, spitch); e != cudaSuccess) {
    return e;
  }
  for (size_t r = 0; r < height; ++r) {
    std::memmove(static_cast<char*>(dst) + r * dpitch,
                 static_cast<const char*>(src) + r * spitch, width);
  }
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* dst, int value, size_t count,
                                      cudaStream_t) {
  if (count > 0) std::memset(dst, value, count);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemset2DAsync(void* dst, size_t pitch, int value,
                                        size_t width, size_t height,
                                        cudaStream_t) {
  if (cudaError_t e = CheckPitches(width, pitch, pitch); e != cudaSuccess) {
    return e;
  }
  for (size_t r = 0; r < height; ++r) {
    std::memset(static_cast<char*>(dst) + r * pitch, value, width);
  }
  return cudaSuccess;
}

const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  return pebble::cuda::emu::Describe(e).name;
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  return pebble::cuda::emu::Describe(e).text;
}

const char* CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t) {
  return "cuDNN is not emulated";
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t) {
  return "CUBLAS_STATUS (emulated build)";
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t) {
  return "cuBLAS is not emulated";
}

}  // extern "C"
