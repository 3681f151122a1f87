// The emulated build runs pebble's own kernels only: cuDNN convolutions and
// cuBLAS products have no host emulation, so their family adds no ops and
// FindCudaKernel returns null for them (cuda_ops.h).
#include "runtime/cuda/cuda_ops.h"

namespace pebble::cuda {

void AddDnnKernels(std::map<std::string, CudaKernelFn>&) {}

}  // namespace pebble::cuda
