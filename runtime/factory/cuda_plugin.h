// The `pebble` binary's CUDA backend as a plugin (docs/cuda.md, "The command
// line's CUDA backend"). cuBLAS's own start-up runs when its library
// is loaded, about 0.4 s on a 2-core machine whether or not a GPU is there,
// so the binary does not link the CUDA backend: it loads libpebble_cuda.so,
// built with it from the same sources, the first time `--backend cuda` is
// asked for. A machine without the CUDA runtime, cuBLAS or cuDNN then runs
// every command but those, which say what is missing.
//
// The library keeps its own copies of pebble's static libraries, hidden
// (-Wl,--exclude-libs,ALL): the two sides share no global state, only the
// Backend objects that the plugin makes, which is why a plugin of another
// build (its `abi` differs) is refused.
#ifndef PEBBLE_RUNTIME_FACTORY_CUDA_PLUGIN_H_
#define PEBBLE_RUNTIME_FACTORY_CUDA_PLUGIN_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/backend.h"

namespace pebble {

// What the plugin's entry point returns; lives as long as the process.
struct CudaPlugin {
  const char* abi;  // PEBBLE_CUDA_PLUGIN_ABI of the build that made it
  absl::StatusOr<std::unique_ptr<Backend>> (*make_backend)();
};

// The plugin's one exported symbol: extern "C" const CudaPlugin* NAME().
inline constexpr char kCudaPluginEntry[] = "pebble_cuda_plugin";
inline constexpr char kCudaPluginFile[] = "libpebble_cuda.so";
// An environment variable naming the plugin's file, instead of the places
// beside the binary that LoadCudaPlugin looks in.
inline constexpr char kCudaPluginVariable[] = "PEBBLE_CUDA_PLUGIN";

// Loads the plugin once per process (never unloaded) and returns its entry.
// FailedPrecondition naming the file and the reason when it is missing,
// cannot be loaded (a CUDA library missing) or comes from another build.
absl::StatusOr<const CudaPlugin*> LoadCudaPlugin();

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_FACTORY_CUDA_PLUGIN_H_
