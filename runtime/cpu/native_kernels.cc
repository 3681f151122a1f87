// The CPU backend's own kernels: everything that is not a convolution,
// product, pooling window, batch norm or activation (those run on oneDNN,
// dnnl_kernels.cc). One file per family; this is the single entry point.
// docs/runtime-kernels.md ("Own kernels") lists ops, dtypes and rules.
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/native_util.h"

namespace pebble {

void RegisterNativeKernels(KernelTable& table) {
  native::RegisterNativeElementwiseKernels(table);
  native::RegisterNativeShapeKernels(table);
  native::RegisterNativePoolKernels(table);
  native::RegisterNativeLossKernels(table);
  native::RegisterNativeNormKernels(table);
  native::RegisterNativeOptimizerKernels(table);
}

}  // namespace pebble
