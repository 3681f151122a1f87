// Backends by name, for the command line, tests and benchmarks. Lives in its
// own target (pebble_backends) because it links the CUDA backend when pebble
// is built with it, and the CUDA backend itself depends on pebble_runtime.
#ifndef PEBBLE_RUNTIME_MAKE_BACKEND_H_
#define PEBBLE_RUNTIME_MAKE_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/backend.h"

namespace pebble {

// "cpu" or "cuda". NotFound for an unknown name (listing the known ones);
// FailedPrecondition when the backend cannot run here ("pebble was built
// without CUDA", "no CUDA device: ...").
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name);

// The backend names this build knows ("cpu", and "cuda" when built with it).
std::vector<std::string> BackendNames();

// True when pebble was built with the CUDA backend.
bool BuiltWithCuda();

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_MAKE_BACKEND_H_
