// The CUDA backend: memory, streams, events and op dispatch. The ops live in
// cuda_ops.cc (own kernels) and cuda_dnn.cc (cuDNN, cuBLAS).
//
// Streams (SPEC section 4, runtime/backend.h): two non-blocking streams, one
// for compute and one for copies, so offloads and prefetches overlap
// compute. Record() records a CUDA event (timing enabled) on the stream and
// Wait() is cudaStreamWaitEvent: the executor uses them for every
// dependency of SPEC section 4 (a compute waits for the prefetch of its
// inputs, a free of an offloaded tensor waits for its offload, a prefetch
// into freed memory waits for the computes that read it). Events are pooled
// and reused after ResetEvents().
//
// Memory: AllocateDevice is one cudaMalloc per call (the executor asks once,
// for the planned arena); nothing else the plan accounts for is allocated.
// Kernel scratch outside the plan (cuDNN workspace beyond the planned one,
// reduction partials) comes from one buffer that grows on demand and is
// reported as scratch_bytes_peak, never as device_bytes_*. The driver view
// (cudaMemGetInfo) also sees the CUDA context, cuDNN's and cuBLAS's own
// allocations.
#include "runtime/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/status.h"
#include "runtime/cuda/cuda_ops.h"
#include "runtime/cuda/cuda_status.h"

namespace pebble {
namespace {

using cuda::CudaContext;

constexpr int64_t kScratchGranule = int64_t{1} << 20;  // grow in MiB steps

std::string FreeMemoryText() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return "the device's free memory is unknown";
  }
  return absl::StrCat("the device has ", FormatBytes(static_cast<int64_t>(free_bytes)),
                      " free of ", FormatBytes(static_cast<int64_t>(total_bytes)));
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}

  ~CudaBackend() override {
    // Best effort: errors at teardown have nowhere to go.
    if (compute_ != nullptr) cudaStreamSynchronize(compute_);
    if (copy_ != nullptr) cudaStreamSynchronize(copy_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (scratch_ != nullptr && scratch_stream_ordered_) {
      cudaFreeAsync(scratch_, compute_);
      cudaStreamSynchronize(compute_);
    } else if (scratch_ != nullptr) {
      cudaFree(scratch_);
    }
    if (cc_.index_fault != nullptr) cudaFree(cc_.index_fault);
    for (const auto& [ptr, bytes] : device_allocs_) cudaFree(ptr);
    for (const auto& [ptr, bytes] : host_allocs_) cudaFreeHost(ptr);
    if (cc_.cublas != nullptr) cublasDestroy(cc_.cublas);
    if (cc_.cudnn != nullptr) cudnnDestroy(cc_.cudnn);
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
    if (copy_ != nullptr) cudaStreamDestroy(copy_);
  }

  absl::Status Init() {
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    PEBBLE_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudnnCreate(&cc_.cudnn));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudnnSetStream(cc_.cudnn, compute_));
    PEBBLE_CUDA_RETURN_IF_ERROR(cublasCreate(&cc_.cublas));
    PEBBLE_CUDA_RETURN_IF_ERROR(cublasSetStream(cc_.cublas, compute_));
    // Plain fp32 products (no TF32), as the CPU backend computes them, and
    // fp16/bf16 products whose split-K reductions stay in fp32.
    PEBBLE_CUDA_RETURN_IF_ERROR(cublasSetMathMode(
        cc_.cublas, static_cast<cublasMath_t>(
                        CUBLAS_DEFAULT_MATH |
                        CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    cc_.stream = compute_;
    cc_.refuse_conv_batch_above = options_.refuse_conv_batch_above;
    cc_.refuse_conv_depth_above = options_.refuse_conv_depth_above;
    cc_.scratch = [this](int64_t bytes) { return Scratch(bytes); };
    // The index-check word (Note [Index fault keys]): a few bytes outside
    // the arena for the backend's lifetime, like the library handles.
    void* fault_word = nullptr;
    PEBBLE_CUDA_RETURN_IF_ERROR(
        cudaMalloc(&fault_word, sizeof(cuda::IndexFault)));
    cc_.index_fault = static_cast<cuda::IndexFault*>(fault_word);
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        cc_.index_fault, 0xff, sizeof(cuda::IndexFault), compute_));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));

    cudaDeviceProp prop{};
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options_.device));
    cc_.max_copy_pitch = static_cast<int64_t>(
        std::min<size_t>(prop.memPitch, size_t{0x7fffffffffffffff}));
    scratch_stream_ordered_ = prop.memoryPoolsSupported != 0;
    int runtime = 0, driver = 0, blas = 0;
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&driver));
    PEBBLE_CUDA_RETURN_IF_ERROR(cublasGetVersion(cc_.cublas, &blas));
    const size_t dnn = cudnnGetVersion();
    description_ = absl::StrFormat(
        "%s (sm_%d%d, %s), CUDA runtime %d.%d, driver %d.%d, cuDNN %d.%d.%d, "
        "cuBLAS %d",
        prop.name, prop.major, prop.minor,
        FormatBytes(static_cast<int64_t>(prop.totalGlobalMem)), runtime / 1000,
        (runtime % 1000) / 10, driver / 1000, (driver % 1000) / 10,
        static_cast<int>(dnn / 10000), static_cast<int>((dnn / 100) % 100),
        static_cast<int>(dnn % 100), blas);
    return absl::OkStatus();
  }

  std::string name() const override { return "cuda"; }
  std::string Description() const override { return description_; }

  absl::Status CheckSupported(const Graph& graph) const override {
    for (NodeId v = 0; v < graph.num_nodes(); ++v) {
      if (!graph.needed()[v] || graph.persistent(v)) continue;
      const std::string& op = graph.op(v);
      // A view runs no kernel (the executor checks it); an in-place update
      // does. A collective runs through the executor's Collectives.
      if ((graph.is_alias(v) && !graph.in_place(v)) || graph.collective(v)) continue;
      if (cuda::FindCudaKernel(op) == nullptr) {
        return absl::UnimplementedError(absl::StrCat(
            "node '", graph.id(v), "' (op ", op,
            "): the CUDA backend has no kernel for op '", op, "'"));
      }
      if (!graph.shape(v).has_value() || !graph.dtype(v).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node '", graph.id(v), "' (op ", op,
            "): a shape and a dtype are needed to execute it"));
      }
      const bool conv = op.rfind("conv2d", 0) == 0 || op.rfind("conv3d", 0) == 0;
      if (conv && op.find("_bias") == std::string::npos) {
        const absl::Status s =
            cuda::CheckConvSupported(graph.attrs(v), op[4] == '3' ? 3 : 2);
        if (!s.ok()) {
          return absl::Status(s.code(), absl::StrCat("node '", graph.id(v),
                                                     "' (op ", op, "): ",
                                                     s.message()));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::byte*> AllocateDevice(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
    void* ptr = nullptr;
    // cudaMalloc returns 256-byte aligned memory; ask for at least one byte
    // so that an empty arena still has an address.
    const cudaError_t e = cudaMalloc(&ptr, std::max<int64_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate the device arena of ", bytes, " bytes (",
          FormatBytes(bytes), "): ", cudaGetErrorString(e), "; ",
          FreeMemoryText()));
    }
    device_allocs_[ptr] = bytes;
    stats_.device_bytes_in_use += bytes;
    stats_.device_bytes_peak =
        std::max(stats_.device_bytes_peak, stats_.device_bytes_in_use);
    return static_cast<std::byte*>(ptr);
  }

  void FreeDevice(std::byte* ptr) override {
    auto it = device_allocs_.find(ptr);
    if (it == device_allocs_.end()) return;
    // cudaFree waits for the work that may still use the memory.
    cudaFree(ptr);
    stats_.device_bytes_in_use -= it->second;
    device_allocs_.erase(it);
  }

  absl::StatusOr<std::byte*> AllocateHost(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
    void* ptr = nullptr;
    const cudaError_t e = cudaMallocHost(&ptr, std::max<int64_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", bytes, " bytes (", FormatBytes(bytes),
          ") of pinned host memory: ", cudaGetErrorString(e)));
    }
    host_allocs_[ptr] = bytes;
    stats_.host_bytes_in_use += bytes;
    stats_.host_bytes_peak = std::max(stats_.host_bytes_peak, stats_.host_bytes_in_use);
    return static_cast<std::byte*>(ptr);
  }

  void FreeHost(std::byte* ptr) override {
    auto it = host_allocs_.find(ptr);
    if (it == host_allocs_.end()) return;
    cudaFreeHost(ptr);
    stats_.host_bytes_in_use -= it->second;
    host_allocs_.erase(it);
  }

  BackendMemoryStats MemoryStats() const override {
    BackendMemoryStats s = stats_;
    s.scratch_bytes_peak = scratch_peak_;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      s.driver_bytes_in_use = static_cast<int64_t>(total_bytes - free_bytes);
    } else {
      cudaGetLastError();
      s.driver_bytes_in_use = -1;
    }
    return s;
  }

  absl::Status Upload(std::byte* device_dst, const void* host_src,
                      int64_t bytes) override {
    RETURN_IF_ERROR(Synchronize());
    if (bytes == 0) return absl::OkStatus();
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, host_src, bytes,
                                                cudaMemcpyHostToDevice, compute_));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
    return absl::OkStatus();
  }

  absl::Status Download(void* host_dst, const std::byte* device_src,
                        int64_t bytes) override {
    RETURN_IF_ERROR(Synchronize());
    if (bytes == 0) return absl::OkStatus();
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, device_src, bytes,
                                                cudaMemcpyDeviceToHost, compute_));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
    return absl::OkStatus();
  }

  absl::Status Fill(std::byte* device_dst, uint8_t value, int64_t bytes) override {
    RETURN_IF_ERROR(Synchronize());
    if (bytes == 0) return absl::OkStatus();
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device_dst, value, bytes, compute_));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> QueryWorkspace(const Graph& graph, NodeId node,
                                         WorkspaceChoice choice) override {
    if (graph.persistent(node) || !graph.shape(node).has_value()) return 0;
    auto conv = cuda::ConvWorkspaceQuery(cc_, graph, node, choice == WorkspaceChoice::kLeast);
    auto own = conv.ok() ? cuda::OwnKernelScratchBytes(graph, node) : conv;
    if (own.ok()) return std::max(*conv, *own);
    const absl::Status& bad = own.status();
    return absl::Status(bad.code(),
                        absl::StrCat("workspace query of node '", graph.id(node), "' (op ",
                                     graph.op(node), "): ", bad.message()));
  }

  absl::Status Compute(const KernelContext& ctx) override {
    const std::string& op = ctx.op();
    cuda::CudaKernelFn fn = cuda::FindCudaKernel(op);
    if (fn == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("node '", ctx.graph->id(ctx.node), "' (op ", op,
                       "): the CUDA backend has no kernel for op '", op, "'"));
    }
    absl::Status s = fn(cc_, ctx);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("node '", ctx.graph->id(ctx.node),
                                                 "' (op ", op, "): ", s.message()));
    }
    return absl::OkStatus();
  }

  absl::Status Copy(CopyDirection direction, std::byte* dst, const std::byte* src,
                    int64_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst, src, bytes,
        direction == CopyDirection::kHostToDevice ? cudaMemcpyHostToDevice
                                                  : cudaMemcpyDeviceToHost,
        copy_));
    return absl::OkStatus();
  }

  absl::StatusOr<EventId> Record(Stream stream) override {
    if (next_event_ == static_cast<int>(events_.size())) {
      cudaEvent_t e = nullptr;
      PEBBLE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
      events_.push_back(e);
    }
    const EventId id = next_event_++;
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[id], StreamOf(stream)));
    return id;
  }

  absl::Status Wait(Stream stream, EventId event) override {
    if (event < 0 || event >= next_event_) {
      return absl::InvalidArgumentError(absl::StrCat("unknown event ", event));
    }
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(StreamOf(stream), events_[event], 0));
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    // A kernel's asynchronous error surfaces here, and so does an index
    // out of range found by the device checks since the last call.
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
    return cuda::TakeIndexFault(cc_);
  }

  absl::StatusOr<double> ElapsedSeconds(EventId from, EventId to) const override {
    if (from < 0 || to < 0 || from >= next_event_ || to >= next_event_) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown event ", from < 0 || from >= next_event_ ? from : to));
    }
    float ms = 0.f;
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events_[from], events_[to]));
    return static_cast<double>(ms) * 1e-3;
  }

  void ResetEvents() override { next_event_ = 0; }

  std::map<std::string, int64_t> Counters() const override {
    return {{"conv_algorithm_refusals", cc_.conv_algorithm_refusals},
            {"conv_splits", cc_.conv_splits},
            {"conv_depth_splits", cc_.conv_depth_splits},
            {"conv_fma_exhausted", cc_.conv_fma_exhausted},
            {"conv_tf32_calls", cc_.conv_tf32_calls}};
  }

 private:
  cudaStream_t StreamOf(Stream s) const {
    return s == Stream::kCompute ? compute_ : copy_;
  }

  // Scratch outside the plan: one buffer for the compute stream, its only
  // user, grown (never shrunk) on demand. Where the device has memory pools,
  // growth is stream-ordered (cudaFreeAsync, cudaMallocAsync on the compute
  // stream): the old buffer goes after the work enqueued before, and nothing
  // waits. cudaFree and cudaMalloc synchronise every stream (CUDA
  // Programming Guide, "Stream-Ordered Memory Allocator"), so growing with
  // them mid-run would stall the copy stream's transfers.
  absl::StatusOr<void*> Scratch(int64_t bytes) {
    if (bytes <= scratch_bytes_) return scratch_;
    const int64_t want = (bytes + kScratchGranule - 1) / kScratchGranule * kScratchGranule;
    if (scratch_ != nullptr) {
      if (scratch_stream_ordered_) {
        PEBBLE_CUDA_RETURN_IF_ERROR(cudaFreeAsync(scratch_, compute_));
      } else {
        // Work already enqueued may still read the old buffer.
        PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
        PEBBLE_CUDA_RETURN_IF_ERROR(cudaFree(scratch_));
      }
      scratch_ = nullptr;
      scratch_bytes_ = 0;
    }
    cudaError_t e = scratch_stream_ordered_
                        ? cudaMallocAsync(&scratch_, want, compute_)
                        : cudaMalloc(&scratch_, want);
    if (e == cudaErrorMemoryAllocation && scratch_stream_ordered_) {
      // The old buffer may not be free yet: its free waits for the stream,
      // and the pool keeps freed memory until a synchronisation (release
      // threshold 0). Wait for it, hand the pool's memory back, try again.
      cudaGetLastError();
      PEBBLE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_));
      cudaMemPool_t pool = nullptr;
      PEBBLE_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, options_.device));
      PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool, 0));
      e = cudaMallocAsync(&scratch_, want, compute_);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      scratch_ = nullptr;
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", want, " bytes (", FormatBytes(want),
          ") of kernel scratch outside the plan: ", cudaGetErrorString(e), "; ",
          FreeMemoryText()));
    }
    scratch_bytes_ = want;
    scratch_peak_ = std::max(scratch_peak_, want);
    return scratch_;
  }

  CudaBackendOptions options_;
  std::string description_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  CudaContext cc_;
  std::vector<cudaEvent_t> events_;
  int next_event_ = 0;
  std::map<void*, int64_t> device_allocs_;
  std::map<void*, int64_t> host_allocs_;
  BackendMemoryStats stats_;
  void* scratch_ = nullptr;
  bool scratch_stream_ordered_ = false;  // cudaMallocAsync / cudaFreeAsync
  int64_t scratch_bytes_ = 0;
  int64_t scratch_peak_ = 0;
};

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();  // not sticky; clear it
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: ",
        e != cudaSuccess ? absl::StrCat(cudaGetErrorString(e), " (", cudaGetErrorName(e), ")")
                         : std::string("the CUDA runtime sees 0 devices"),
        "; use --backend cpu"));
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options) {
  ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device ", options.device, ": ", count, " device(s) present"));
  }
  auto backend = std::make_unique<CudaBackend>(options);
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

std::vector<std::string> CudaOps() { return cuda::CudaKernelOps(); }

namespace {

// The CUDA backend's counter `name` (CudaBackend::Counters), or -1 when
// `backend` is not a CUDA backend.
int64_t CudaCounter(const Backend& backend, const char* name) {
  if (dynamic_cast<const CudaBackend*>(&backend) == nullptr) return -1;
  return backend.Counters().at(name);
}

}  // namespace

int64_t CudaConvSplitCount(const Backend& backend) {
  return CudaCounter(backend, "conv_splits");
}

int64_t CudaConvDepthSplitCount(const Backend& backend) {
  return CudaCounter(backend, "conv_depth_splits");
}

int64_t CudaConvTf32CallCount(const Backend& backend) {
  return CudaCounter(backend, "conv_tf32_calls");
}

int64_t CudaConvAlgorithmRefusalCount(const Backend& backend) {
  return CudaCounter(backend, "conv_algorithm_refusals");
}

}  // namespace pebble
