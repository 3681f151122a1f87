// The entry point of libpebble_cuda.so, the `pebble` binary's CUDA backend
// (runtime/factory/cuda_plugin.h).
#include <memory>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/factory/cuda_plugin.h"

namespace {

absl::StatusOr<std::unique_ptr<pebble::Backend>> MakeDefaultCudaBackend() {
  return pebble::MakeCudaBackend();
}

constexpr pebble::CudaPlugin kPlugin{PEBBLE_CUDA_PLUGIN_ABI, &MakeDefaultCudaBackend};

}  // namespace

extern "C" __attribute__((visibility("default"))) const pebble::CudaPlugin*
pebble_cuda_plugin() {
  return &kPlugin;
}
