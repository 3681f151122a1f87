// The CPU backend: host memory plays the device, kernels come from
// CpuKernels(), every call runs to completion before it returns.
#include "runtime/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "oneapi/dnnl/dnnl.h"
#include "runtime/cpu/parallel.h"
#include "scheduler/cost_profile.h"

namespace pebble {

const KernelTable& CpuScratchKernels() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable;
    RegisterDnnlKernels(*t);
    return t;
  }();
  return *table;
}

const KernelTable& CpuKernels() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable;
    RegisterDnnlKernels(*t);
    RegisterNativeKernels(*t);
    return t;
  }();
  return *table;
}

namespace {

// Kernel scratch outside the plan, reported by kernels through
// NoteCpuKernelScratch(); one process-wide high-water mark, read (and reset)
// by each backend when it is created.
std::atomic<int64_t>& ScratchHighWater() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() { ScratchHighWater().store(0); }

  ~CpuBackend() override {
    for (auto& [ptr, bytes] : device_) std::free(ptr);
    for (auto& [ptr, bytes] : host_) std::free(ptr);
  }

  std::string name() const override { return "cpu"; }

  std::string Description() const override {
    const dnnl_version_t* v = dnnl_version();
    return absl::StrCat("CPU, oneDNN ", v->major, ".", v->minor, ".", v->patch,
                        ", ", CpuBackendThreads(),
                        CpuBackendThreads() == 1 ? " thread" : " threads");
  }

  absl::Status CheckSupported(const Graph& graph) const override {
    const KernelTable& kernels = CpuKernels();
    // Every missing op once, with the first node that uses it: one error
    // tells the whole story.
    std::map<std::string, std::string> missing;  // op -> first node
    for (NodeId v : graph.topological_order()) {
      if (!graph.needed()[v]) continue;
      if (!graph.shape(v).has_value() || !graph.dtype(v).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node '", graph.id(v), "' (op ", graph.op(v),
            ") has no shape or dtype; the cpu backend executes only graphs with "
            "shapes (built-in models, or graph files with 'shape' and 'dtype')"));
      }
      // Views run no kernel; an in-place update, an alias too, does. A
      // collective runs through the executor's Collectives.
      if (graph.persistent(v) || (graph.is_alias(v) && !graph.in_place(v)) ||
          graph.collective(v)) {
        continue;
      }
      if (kernels.Find(graph.op(v)) == nullptr) {
        missing.emplace(graph.op(v), graph.id(v));
      }
    }
    if (missing.empty()) return absl::OkStatus();
    std::vector<std::string> parts;
    for (const auto& [op, node] : missing) {
      parts.push_back(absl::StrCat(op, " (node '", node, "')"));
    }
    return absl::UnimplementedError(
        absl::StrCat("the cpu backend has no kernel for ", missing.size(),
                     " op(s) of graph '", graph.name(), "': ", absl::StrJoin(parts, ", ")));
  }

  absl::StatusOr<std::byte*> AllocateDevice(int64_t bytes) override {
    ASSIGN_OR_RETURN(std::byte * ptr, Allocate(bytes, "device"));
    device_[ptr] = bytes;
    device_in_use_ += bytes;
    device_peak_ = std::max(device_peak_, device_in_use_);
    return ptr;
  }

  void FreeDevice(std::byte* ptr) override {
    auto it = device_.find(ptr);
    PEBBLE_CHECK(it != device_.end(), "FreeDevice of a pointer the cpu backend did not allocate");
    device_in_use_ -= it->second;
    std::free(ptr);
    device_.erase(it);
  }

  absl::StatusOr<std::byte*> AllocateHost(int64_t bytes) override {
    ASSIGN_OR_RETURN(std::byte * ptr, Allocate(bytes, "host"));
    host_[ptr] = bytes;
    host_in_use_ += bytes;
    host_peak_ = std::max(host_peak_, host_in_use_);
    return ptr;
  }

  void FreeHost(std::byte* ptr) override {
    auto it = host_.find(ptr);
    PEBBLE_CHECK(it != host_.end(), "FreeHost of a pointer the cpu backend did not allocate");
    host_in_use_ -= it->second;
    std::free(ptr);
    host_.erase(it);
  }

  BackendMemoryStats MemoryStats() const override {
    BackendMemoryStats s;
    s.device_bytes_in_use = device_in_use_;
    s.device_bytes_peak = device_peak_;
    s.host_bytes_in_use = host_in_use_;
    s.host_bytes_peak = host_peak_;
    s.scratch_bytes_peak = ScratchHighWater().load();
    return s;
  }

  absl::Status Upload(std::byte* device_dst, const void* host_src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(device_dst, host_src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status Download(void* host_dst, const std::byte* device_src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, device_src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status Fill(std::byte* device_dst, uint8_t value, int64_t bytes) override {
    if (bytes > 0) std::memset(device_dst, value, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status Compute(const KernelContext& ctx) override {
    PEBBLE_CHECK(ctx.graph != nullptr && ctx.node != kNoNode);
    KernelFn kernel = CpuKernels().Find(ctx.op());
    if (kernel == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          "the cpu backend has no kernel for op '", ctx.op(), "'"));
    }
    absl::Status status = kernel(ctx);
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat("cpu kernel ", ctx.op(), ": ",
                                                    status.message()));
  }

  // Note [Planned scratch] in cpu_backend.h: the kernel runs once on zeroed
  // operands of the node's shapes, and its scratch total is the answer.
  // oneDNN offers one configuration per primitive: `choice` changes nothing.
  absl::StatusOr<int64_t> QueryWorkspace(const Graph& graph, NodeId node,
                                         WorkspaceChoice choice) override {
    (void)choice;
    KernelFn kernel = CpuScratchKernels().Find(graph.op(node));
    if (kernel == nullptr || graph.persistent(node)) return 0;
    const std::optional<std::string> key = CostKey(graph, node);
    if (!key.has_value()) return 0;  // no shapes: never executed
    if (auto it = workspace_cache_.find(*key); it != workspace_cache_.end()) {
      return it->second;
    }
    const absl::StatusOr<int64_t> bytes = DnnlProbeScratchBytes(kernel, graph, node);
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(),
                          absl::StrCat("workspace query of node '", graph.id(node), "' (op ",
                                       graph.op(node), "): ", bytes.status().message()));
    }
    workspace_cache_[*key] = *bytes;
    return *bytes;
  }

  absl::Status Copy(CopyDirection direction, std::byte* dst, const std::byte* src,
                    int64_t bytes) override {
    (void)direction;  // host to host either way
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::StatusOr<EventId> Record(Stream stream) override {
    (void)stream;  // synchronous: both streams are at "now"
    events_.push_back(Clock::now());
    return static_cast<EventId>(events_.size() - 1);
  }

  absl::Status Wait(Stream stream, EventId event) override {
    (void)stream;
    if (event < 0 || event >= static_cast<EventId>(events_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("unknown event ", event));
    }
    return absl::OkStatus();  // already complete
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::StatusOr<double> ElapsedSeconds(EventId from, EventId to) const override {
    const EventId n = static_cast<EventId>(events_.size());
    if (from < 0 || from >= n || to < 0 || to >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown event ", from < 0 || from >= n ? from : to));
    }
    return std::chrono::duration<double>(events_[to] - events_[from]).count();
  }

  void ResetEvents() override { events_.clear(); }

 private:
  using Clock = std::chrono::steady_clock;

  // Aligned to kCpuAlignment, the size rounded up to it (aligned_alloc's
  // rule); a zero-byte request still gets a distinct, valid pointer.
  static absl::StatusOr<std::byte*> Allocate(int64_t bytes, const char* what) {
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative ", what, " allocation: ", bytes));
    }
    // Past a 64-bit machine's user address space (128 TiB on x86-64) no
    // allocator can succeed: refused here, so that the rounding below cannot
    // overflow and a sanitizer's allocator (which aborts on such sizes) is
    // never asked.
    constexpr int64_t kAddressSpaceBytes = int64_t{1} << 47;
    void* ptr = nullptr;
    if (bytes <= kAddressSpaceBytes) {
      const int64_t rounded = std::max<int64_t>(
          kCpuAlignment, (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment);
      ptr = std::aligned_alloc(kCpuAlignment, static_cast<size_t>(rounded));
    }
    if (ptr == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of ", what, " memory: cannot allocate ", bytes, " bytes (",
                       FormatBytes(bytes), ")"));
    }
    return static_cast<std::byte*>(ptr);
  }

  std::vector<Clock::time_point> events_;
  std::map<std::string, int64_t> workspace_cache_;  // CostKey -> bytes
  std::map<std::byte*, int64_t> device_, host_;
  int64_t device_in_use_ = 0, device_peak_ = 0;
  int64_t host_in_use_ = 0, host_peak_ = 0;
};

}  // namespace

int CpuBackendThreads() { return cpu::ParallelThreads(); }

void NoteCpuKernelScratch(int64_t bytes) {
  std::atomic<int64_t>& peak = ScratchHighWater();
  int64_t seen = peak.load();
  while (bytes > seen && !peak.compare_exchange_weak(seen, bytes)) {
  }
}

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace pebble
