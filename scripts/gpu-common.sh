# Sourced by scripts/gpu-check and scripts/gpu-bundle (not run on its own);
# the caller sets $root to the source tree.

# What a GPU run needs: the CLI, then the test binaries whose tests need a
# device.
gpu_binaries=(pebble cuda_backend_test cost_profile_test cli_calibrate_test)

# Configures build directory $1 in Release with the CUDA backend (further
# arguments go to cmake) and builds gpu_binaries; exits with a message when
# the CUDA toolkit or cuDNN 9 was not found.
build_gpu_binaries() {
  local build="$1"
  shift
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPEBBLE_CUDA=ON \
    -DPEBBLE_BUILD_BENCH=OFF "$@"
  if ! ninja -C "$build" -t targets all | grep -q '^pebble_runtime_cuda:'; then
    echo "$(basename "$0"): the CUDA backend was not configured (CUDA toolkit or cuDNN 9" \
         "not found; see the cmake output above, or set CUDAToolkit_ROOT /" \
         "PEBBLE_CUDNN_ROOT)" >&2
    exit 1
  fi
  ninja -C "$build" -j "$(nproc 2>/dev/null || echo 2)" "${gpu_binaries[@]}"
  # The Python module too, where pybind11 is here (pebble.torch's GPU checks).
  if ninja -C "$build" -t targets all | grep -q '^pebble_python:'; then
    ninja -C "$build" -j "$(nproc 2>/dev/null || echo 2)" pebble_python
  fi
}
