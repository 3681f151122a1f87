// Internal to the CUDA backend: how one node becomes library calls and own
// kernels on the compute stream. cuda_backend.cc owns the streams, handles
// and memory; cuda_ops.cc (own kernels, shape ops) and cuda_dnn.cc (cuDNN
// convolutions, cuBLAS products) implement the ops.
#ifndef PEBBLE_RUNTIME_CUDA_CUDA_OPS_H_
#define PEBBLE_RUNTIME_CUDA_CUDA_OPS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/ops/op_util.h"
#include "runtime/cuda/cuda_kernels.h"
#include "runtime/kernel.h"

namespace pebble::cuda {

// A cuDNN algorithm choice for one convolution configuration.
struct ConvChoice {
  bool supported = false;  // false: cuDNN offers no usable algorithm
  int algo = 0;            // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  int64_t workspace_bytes = 0;
  std::string why;  // supported == false: who refused and how
};

// The usable algorithms of one convolution configuration in the order they
// are tried (Note [Convolution algorithms] in cuda_dnn.cc), and how far the
// trying got: ranked[next] runs until cuDNN refuses it (its workspace query
// or its call), then the next one does.
struct ConvCandidates {
  std::vector<ConvChoice> ranked;
  size_t next = 0;
  bool checked = false;     // ranked[next]'s workspace was asked in its own math
  // Refused in FMA math even split (a sample whose depth split failed, or a
  // 2-D sample): for fp32 data its TF32 candidates may run from now on.
  bool fma_exhausted = false;
  bool tf32_asked = false;  // fp32: the heuristics were asked for TF32 candidates
  std::string why;          // the last refusal, or why there is no candidate
};

struct CudaContext {
  cudaStream_t stream = nullptr;  // the compute stream
  cudnnHandle_t cudnn = nullptr;  // bound to `stream`
  cublasHandle_t cublas = nullptr;  // bound to `stream`
  // Device scratch outside the plan, at least `bytes` (stream-ordered on
  // `stream`; valid until the next call). The backend reports its size as
  // scratch_bytes_peak.
  std::function<absl::StatusOr<void*>(int64_t bytes)> scratch;
  // CudaBackendOptions' test hooks.
  int64_t refuse_conv_batch_above = 0;
  int64_t refuse_conv_depth_above = 0;
  int64_t conv_splits = 0;        // splits done so far, along batch or depth
  int64_t conv_depth_splits = 0;  // of which along the depth
  // The largest row pitch cudaMemcpy2DAsync takes (cudaDeviceProp::memPitch),
  // in bytes.
  int64_t max_copy_pitch = 0x7fffffff;
  // Algorithms cuDNN offered and then refused, each followed by the next
  // candidate (or, after the last, by a split).
  int64_t conv_algorithm_refusals = 0;
  // Configurations found refused in FMA math even split
  // (ConvCandidates::fma_exhausted), so far.
  int64_t conv_fma_exhausted = 0;
  int64_t conv_tf32_calls = 0;  // cuDNN calls on fp32 data in TF32
  std::map<std::string, ConvCandidates> conv_choices;  // by configuration key
  // Depth slice counts that ran, by configuration key (cuda_dnn.cc).
  std::map<std::string, int64_t> conv_depth_parts;
  // Index checks on the device (Note [Index fault keys] in
  // runtime/kernel_math.h): the fault word, and what the launch of each tag
  // checked, until the next TakeIndexFault.
  IndexFault* index_fault = nullptr;
  struct IndexCheck {
    std::string node, op;
    std::string what;  // "index", "target"
    int64_t limit = 0;
  };
  std::vector<IndexCheck> index_checks;
};

using CudaKernelFn = absl::Status (*)(CudaContext& cc, const KernelContext& ctx);

// The kernel of `op`, or nullptr.
CudaKernelFn FindCudaKernel(absl::string_view op);
std::vector<std::string> CudaKernelOps();  // sorted

// Families (each adds its ops to `table`).
void AddDnnKernels(std::map<std::string, CudaKernelFn>& table);   // cuda_dnn.cc
void AddOwnKernels(std::map<std::string, CudaKernelFn>& table);   // cuda_ops.cc

// Helpers shared by the families.
absl::StatusOr<KType> KTypeOf(DType dtype);
// InvalidArgument unless the node has lo to hi inputs.
absl::Status ExpectInputs(const KernelContext& ctx, size_t lo, size_t hi);
// Attributes: graph/ops/op_util.h's readers, as the CPU backend and the
// op definitions read them.
using ops_internal::BoolAttr;
using ops_internal::DoubleAttr;
using ops_internal::IntAttr;
using ops_internal::IntListAttr;
using ops_internal::SpatialAttr;
using ops_internal::StringAttr;
// On cc.stream: `height` rows of `width` bytes from src (rows `spitch`
// bytes apart) to dst (rows `dpitch` apart), and zero bytes (the zero of
// fp32, fp16 and bf16) into such rows. One call when the rows are
// contiguous, the 2-D call when the pitches are within cc.max_copy_pitch,
// else row by row.
absl::Status Copy2D(CudaContext& cc, std::byte* dst, int64_t dpitch,
                    const std::byte* src, int64_t spitch, int64_t width,
                    int64_t height);
absl::Status Zero2D(CudaContext& cc, std::byte* dst, int64_t pitch,
                    int64_t width, int64_t height);
// Enqueues the check that every element of `indices` (i64) lies in
// [0, limit); a fault is reported by TakeIndexFault, as the CPU backend
// words it ("<what> 9 at position 2 is outside [0, 5)").
absl::Status CheckIndicesOnDevice(CudaContext& cc, const KernelContext& ctx,
                                  const TensorView& indices, int64_t limit,
                                  absl::string_view what);
// Waits for the compute stream, then returns the first fault the checks
// since the last call found, as InvalidArgument naming the node, or OK.
// Resets the fault word and forgets the checks either way.
absl::Status TakeIndexFault(CudaContext& cc);
// An InvalidArgument when the kernel launch failed (cudaErrorInvalidValue
// from a launcher's own checks) or the launch error's Status.
absl::Status LaunchStatus(cudaError_t e, absl::string_view what);
// The errors of a convolution's groups and dilation attrs (a conv{2,3}d*
// node over `dims` spatial dims), found before the run.
absl::Status CheckConvSupported(const nlohmann::json& attrs, int dims);
// The workspace (bytes) of the algorithm cuDNN's heuristics rank first among
// the candidates of convolution node `node` (Note [Convolution algorithms]
// in cuda_dnn.cc, with no workspace limit), or with `least` of the candidate
// that needs the least: planned as the node's workspace, that algorithm runs
// from it. 0 for other ops, and where cuDNN refuses the whole configuration
// (the split fallback takes scratch of its own).
absl::StatusOr<int64_t> ConvWorkspaceQuery(CudaContext& cc, const Graph& graph, NodeId node,
                                           bool least = false);
// The scratch (bytes) own kernel `node` combines its partial sums in (Note
// [Own kernel scratch] in cuda_ops.cc); 0 for kernels that take none.
absl::StatusOr<int64_t> OwnKernelScratchBytes(const Graph& graph, NodeId node);

}  // namespace pebble::cuda

#endif  // PEBBLE_RUNTIME_CUDA_CUDA_OPS_H_
