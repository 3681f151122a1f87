// The own kernels compiled as host C++ for the emulator (cuda_emu.h): the
// same source that nvcc compiles for the device.
#define PEBBLE_CUDA_EMULATION 1
#include "runtime/cuda/cuda_kernels.cu"
