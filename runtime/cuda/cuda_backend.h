// The CUDA backend (docs/cuda.md): one device arena from a single cudaMalloc
// per AllocateDevice call (the executor asks for the planned arena once), a
// compute stream and a copy stream, pinned host buffers, CUDA events for
// Record/Wait, cuDNN for convolutions, cuBLAS for matrix products and
// pebble's own deterministic kernels (runtime/cuda/cuda_kernels.h) for the
// rest, in fp32, fp16 and bf16.
//
// Built only when the CUDA toolkit and cuDNN 9 were found at configure time
// (PEBBLE_HAVE_CUDA_BACKEND is then defined for everything that links
// pebble_runtime_cuda).
#ifndef PEBBLE_RUNTIME_CUDA_CUDA_BACKEND_H_
#define PEBBLE_RUNTIME_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/backend.h"

namespace pebble {

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal
  // Test hooks for the split fallback (docs/cuda.md, "Split fallback"): a
  // convolution over more than this many samples is treated as if cuDNN had
  // answered CUDNN_STATUS_NOT_SUPPORTED, so it is split along the batch.
  // 0: off.
  int64_t refuse_conv_batch_above = 0;
  // Likewise a 3-D convolution whose x (dx for backward data) has more than
  // this many depth planes: the batch splits down to one sample, which then
  // splits along the depth until each slice's window has at most this many
  // planes; below the kernel's depth nothing passes and the node fails with
  // Unimplemented. 0: off.
  int64_t refuse_conv_depth_above = 0;
};

// The number of CUDA devices, or FailedPrecondition "no CUDA device: <the
// runtime's reason>" when there is none (no GPU, no driver).
absl::StatusOr<int> CudaDeviceCount();

// A backend on options.device. FailedPrecondition "no CUDA device: ..."
// without a device; ResourceExhausted / Internal when a stream, handle or
// library cannot be set up (the message names the call).
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options = {});

// Ops the CUDA backend has kernels for, sorted (docs/cuda.md lists them).
std::vector<std::string> CudaOps();

// How many times a convolution of `backend` was split, along the batch or
// the depth, because cuDNN refused it (or a test hook did); -1 when
// `backend` is not a CUDA backend.
int64_t CudaConvSplitCount(const Backend& backend);
// Of those, the splits along the depth (one per sample split); -1 when
// `backend` is not a CUDA backend.
int64_t CudaConvDepthSplitCount(const Backend& backend);
// How many times cuDNN refused an algorithm its heuristics had offered
// (its workspace query or its call), so that the configuration's next
// candidate ran instead, or the split when none was left (docs/cuda.md,
// "Convolution algorithms"); -1 when `backend` is not a CUDA backend.
int64_t CudaConvAlgorithmRefusalCount(const Backend& backend);
// How many cuDNN calls ran fp32 data in TF32: only convolutions that cuDNN
// refused in FMA math even split to the end; -1 when `backend` is not a
// CUDA backend.
int64_t CudaConvTf32CallCount(const Backend& backend);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_CUDA_CUDA_BACKEND_H_
