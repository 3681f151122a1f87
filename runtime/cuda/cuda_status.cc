#include "runtime/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pebble::cuda {
namespace {

std::string Where(const char* call, const char* file, int line) {
  return absl::StrCat(call, " failed at ", file, ":", line, ": ");
}

}  // namespace

bool CudnnEnvironmentFault(cudnnStatus_t e) {
  switch (e) {
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART:
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING:
    case CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE:
      return true;
    default:
      return false;
  }
}

absl::Status CallStatus(cudaError_t e, const char* call, const char* file,
                        int line) {
  // The runtime also keeps e for cudaGetLastError; clear it, or the next
  // kernel launch's check would report it again as its own.
  (void)cudaGetLastError();
  const std::string msg = absl::StrCat(Where(call, file, line),
                                       cudaGetErrorString(e), " (",
                                       cudaGetErrorName(e), ")");
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(msg);
    case cudaErrorNotSupported:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status CallStatus(cudnnStatus_t e, const char* call, const char* file,
                        int line) {
  const std::string msg =
      absl::StrCat(Where(call, file, line), cudnnGetErrorString(e));
  if (CudnnEnvironmentFault(e)) {
    char detail[512] = "";
    cudnnGetLastErrorString(detail, sizeof(detail));
    return absl::FailedPreconditionError(absl::StrCat(
        msg, detail[0] != '\0' ? absl::StrCat(" (", detail, ")") : std::string(),
        ": this cuDNN installation cannot run convolutions here (check the driver, the "
        "CUDA runtime and cuDNN's sub-libraries on the library path)"));
  }
  // cuDNN 9 codes are a category plus a sub-code (cudnn_graph.h).
  if (e == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      e == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return absl::ResourceExhaustedError(msg);
  }
  switch (CUDNN_STATUS_CATEGORY(e)) {
    case CUDNN_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(msg);
    case CUDNN_STATUS_BAD_PARAM:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status CallStatus(cublasStatus_t e, const char* call, const char* file,
                        int line) {
  const std::string msg = absl::StrCat(Where(call, file, line),
                                       cublasGetStatusString(e), " (",
                                       cublasGetStatusName(e), ")");
  switch (e) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(msg);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace pebble::cuda
