// Host stand-ins for the cuDNN and cuBLAS calls of the CUDA backend
// (runtime/cuda/cuda_dnn.cc), for the emulated build (host_runtime.h):
// the functions are the libraries' C symbols, defined in host_dnn.cc.
//
// What they model: the legacy convolution API of cuDNN 9 (NCHW tensor,
// filter and convolution descriptors of 2 or 3 spatial dims, dilation 1,
// one group (other dilations and group counts are NOT_SUPPORTED),
// cross-correlation, fp32 / fp16 / bf16 data with fp32 accumulation), its
// v7 heuristics and workspace queries, and cuBLAS's
// cublasGemmStridedBatchedEx in CUBLAS_COMPUTE_32F. Every call checks its
// descriptors and arguments as the libraries document them (a geometry
// that does not agree is CUDNN_STATUS_BAD_PARAM, a data pointer off
// cuDNN's 4-byte minimum alignment CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
// a leading dimension too small CUBLAS_STATUS_INVALID_VALUE) and enqueues the arithmetic on the
// handle's stream, as the libraries do.
//
// The heuristics offer, for each direction, algorithms that exercise the
// caller's choice (Note [Convolution algorithms] in cuda_dnn.cc), ranked:
//  - forward: IMPLICIT_PRECOMP_GEMM in tensor-op math, then IMPLICIT_GEMM
//    in FMA math, then GEMM in FMA math;
//  - backward data and filter: ALGO_0 (non-deterministic), then ALGO_1 in
//    tensor-op math, then ALGO_1 in FMA math.
// Asked in CUDNN_FMA_MATH, they leave out the tensor-op entries, as cuDNN
// does. Tensor-op math and the forward GEMM need a workspace of one sample
// of x (the emulated algorithm fills it, so a workspace that overlaps live
// data corrupts it); tensor-op math rounds fp32 operands to TF32. The non-deterministic algorithm sums in
// an order that alternates from call to call, so its results differ in the
// last bits between runs, as atomics make them differ on a device.
#ifndef PEBBLE_RUNTIME_CUDA_EMU_HOST_DNN_H_
#define PEBBLE_RUNTIME_CUDA_EMU_HOST_DNN_H_

#include <cudnn.h>

#include <cstdint>
#include <vector>

namespace pebble::cuda::emu {

// Makes the emulated cuDNN answer CUDNN_STATUS_NOT_SUPPORTED_SHAPE for
// every convolution whose x (dx for backward data) has more than
// `x_elements_above` elements (0: never), as cuDNN refuses some large 3-D
// convolutions: from the heuristics on, or, with `at_call_only`, only from
// the convolution call (after the heuristics offered an algorithm).
// `status` is the answer (another NOT_SUPPORTED sub-code models an
// installation fault, which cudnnGetLastErrorString then describes).
struct ConvRefusal {
  int64_t x_elements_above = 0;
  bool at_call_only = false;
  cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
};
void SetConvRefusal(const ConvRefusal& refusal);

// Makes the emulated cuDNN answer CUDNN_STATUS_NOT_SUPPORTED for the
// forward algorithms `forward_algos` (cudnnConvolutionFwdAlgo_t values)
// that its heuristics still offer, on convolutions whose x has more than
// `x_elements_above` elements (0: any): from the workspace query on, or,
// with `at_call_only`, only from the convolution call. Empty: never.
struct AlgorithmRefusal {
  std::vector<int> forward_algos;
  bool at_call_only = false;
  int64_t x_elements_above = 0;
};
void SetAlgorithmRefusal(const AlgorithmRefusal& refusal);

// Convolution calls the emulated cuDNN ran (enqueued) since the start, and
// of those how many ran a non-deterministic algorithm or tensor-op math on
// fp32 data.
struct ConvCalls {
  int64_t total = 0;
  int64_t non_deterministic = 0;
  int64_t tf32 = 0;
};
ConvCalls GetConvCalls();

}  // namespace pebble::cuda::emu

#endif  // PEBBLE_RUNTIME_CUDA_EMU_HOST_DNN_H_
