#include "runtime/factory/cuda_plugin.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pebble {
namespace {

namespace fs = std::filesystem;

constexpr char kUseCpu[] = "; use --backend cpu";

// Where the plugin may be: `named` (the environment's file) where given, or
// else the install's layout relative to this binary
// (PEBBLE_CUDA_PLUGIN_RELDIR, from bin/ to <libdir>/pebble, which the build
// tree mirrors), then beside it (a wheel's pebble/_bin/).
std::vector<fs::path> Candidates(const char* named) {
  if (named != nullptr) return {fs::path(named)};
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) return {};
  const fs::path dir = self.parent_path();
  return {(dir / PEBBLE_CUDA_PLUGIN_RELDIR / kCudaPluginFile).lexically_normal(),
          dir / kCudaPluginFile};
}

absl::StatusOr<const CudaPlugin*> Load() {
  const char* named = std::getenv(kCudaPluginVariable);
  if (named != nullptr && *named == '\0') named = nullptr;
  const std::vector<fs::path> candidates = Candidates(named);
  const fs::path* found = nullptr;
  for (const fs::path& candidate : candidates) {
    std::error_code error;
    if (fs::is_regular_file(candidate, error)) {
      found = &candidate;
      break;
    }
  }
  if (found == nullptr && named != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        kCudaPluginVariable, " names ", named, ", which is not a file", kUseCpu));
  }
  if (found == nullptr) {
    std::vector<std::string> looked;
    for (const fs::path& candidate : candidates) looked.push_back(candidate.string());
    return absl::FailedPreconditionError(absl::StrCat(
        "pebble's CUDA backend (", kCudaPluginFile, ") is not installed with this binary: ",
        "looked for ", looked.empty() ? "it (this binary's path is unknown)"
                                      : absl::StrJoin(looked, " and "),
        "; reinstall pebble, or set ", kCudaPluginVariable, " to its path", kUseCpu));
  }
  // Absolute: dlopen would look a bare name up on the library path instead.
  std::error_code error;
  std::string path = fs::absolute(*found, error).string();
  if (error) path = found->string();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load pebble's CUDA backend ", path, ": ", why != nullptr ? why : "unknown error",
        " (it needs the CUDA runtime, cuBLAS and cuDNN 9 that pebble was built with)",
        kUseCpu));
  }
  // Never dlclose'd once accepted: backends made by it live until the
  // process ends.
  using Entry = const CudaPlugin* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, kCudaPluginEntry));
  const CudaPlugin* plugin = entry != nullptr ? entry() : nullptr;
  if (plugin == nullptr) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is not pebble's CUDA backend (it has no ", kCudaPluginEntry, ")", kUseCpu));
  }
  if (std::strcmp(plugin->abi, PEBBLE_CUDA_PLUGIN_ABI) != 0) {
    std::string message = absl::StrCat(
        path, " comes from another build of pebble (", plugin->abi, ", this binary is ",
        PEBBLE_CUDA_PLUGIN_ABI, "): install the binary and its ", kCudaPluginFile,
        " together", kUseCpu);
    dlclose(handle);  // (after the last read of its abi string)
    return absl::FailedPreconditionError(message);
  }
  return plugin;
}

}  // namespace

absl::StatusOr<const CudaPlugin*> LoadCudaPlugin() {
  static const absl::StatusOr<const CudaPlugin*> loaded = Load();
  return loaded;
}

}  // namespace pebble
