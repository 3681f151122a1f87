#include "runtime/make_backend.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/cpu/cpu_backend.h"
#ifdef PEBBLE_WITH_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif

namespace pebble {

bool BuiltWithCuda() {
#ifdef PEBBLE_WITH_CUDA
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
#ifdef PEBBLE_WITH_CUDA
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
