#include "runtime/make_backend.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/cpu/cpu_backend.h"
#if defined(PEBBLE_CUDA_PLUGIN)
#include "runtime/factory/cuda_plugin.h"
#elif defined(PEBBLE_WITH_CUDA)
#include "runtime/cuda/cuda_backend.h"
#endif

// Compiled three ways: into pebble_backends, which links the CUDA backend
// when the build has it (PEBBLE_WITH_CUDA); into the `pebble` binary, which
// loads it from its plugin (PEBBLE_CUDA_PLUGIN, runtime/factory/cuda_plugin.h);
// and into pebble-emu with the host emulation linked in its place.

namespace pebble {

bool BuiltWithCuda() {
#if defined(PEBBLE_WITH_CUDA) || defined(PEBBLE_CUDA_PLUGIN)
  return true;
#else
  return false;
#endif
}

std::vector<std::string> BackendNames() {
  std::vector<std::string> names = {"cpu"};
  if (BuiltWithCuda()) names.push_back("cuda");
  return names;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name) {
  if (name == "cpu") return MakeCpuBackend();
  if (name == "cuda") {
#if defined(PEBBLE_CUDA_PLUGIN)
    absl::StatusOr<const CudaPlugin*> plugin = LoadCudaPlugin();
    if (!plugin.ok()) return plugin.status();
    return (*plugin)->make_backend();
#elif defined(PEBBLE_WITH_CUDA)
    return MakeCudaBackend();
#else
    return absl::FailedPreconditionError(
        "pebble was built without CUDA (the CUDA toolkit was not found at "
        "configure time); use --backend cpu");
#endif
  }
  return absl::NotFoundError(absl::StrCat("unknown backend '", name,
                                          "'; known: cpu, cuda"));
}

}  // namespace pebble
