// A CUDA plugin of "another build" (runtime/factory/cuda_plugin.h), which the
// pebble binary must refuse before making anything with it
// (cli_calibrate_test, CliCalibrateTest.CudaPluginRefusalsNameTheFile).
#include <memory>

#include "absl/status/status.h"
#include "runtime/factory/cuda_plugin.h"

namespace {

absl::StatusOr<std::unique_ptr<pebble::Backend>> MakeNothing() {
  return absl::InternalError("the fake CUDA plugin was asked for a backend");
}

constexpr pebble::CudaPlugin kPlugin{"0.0.0-another-build", &MakeNothing};

}  // namespace

extern "C" __attribute__((visibility("default"))) const pebble::CudaPlugin*
pebble_cuda_plugin() {
  return &kPlugin;
}
