// The Backend interface: memory, kernels, two streams and events. The
// executor (runtime/executor.h) owns the plan and makes every decision; a
// backend only does what it is told, in the order it is told, and reports
// errors as Status (never a crash).
//
// Streams (SPEC section 4): work enqueued on one stream runs in order; the
// compute and copy streams run concurrently. An event marks the point a
// stream has reached when it is recorded; Wait() makes later work on a
// stream wait for that point. A synchronous backend (the CPU one) runs
// every call to completion before returning, so its events are timestamps
// and Wait() is a no-op.
#ifndef PEBBLE_RUNTIME_BACKEND_H_
#define PEBBLE_RUNTIME_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "runtime/kernel.h"

namespace pebble {

enum class Stream : uint8_t { kCompute, kCopy };
enum class CopyDirection : uint8_t { kDeviceToHost, kHostToDevice };

// Which of a kernel's configurations a workspace query answers for: the
// fastest the library ranks first, or the one that needs the least
// workspace (where the library offers a choice: cuDNN's algorithms).
enum class WorkspaceChoice : uint8_t { kFastest, kLeast };

using EventId = int32_t;

// Memory the backend allocated, for the measured report (bytes).
struct BackendMemoryStats {
  int64_t device_bytes_in_use = 0;    // through AllocateDevice, now
  int64_t device_bytes_peak = 0;      // high-water of the above
  int64_t host_bytes_in_use = 0;      // through AllocateHost, now
  int64_t host_bytes_peak = 0;
  // Kernel scratch outside the plan (library scratchpads, split buffers),
  // high-water; 0 when every kernel stays within its planned workspace.
  int64_t scratch_bytes_peak = 0;
  // The device's own view where it has one (CUDA: cudaMemGetInfo's used
  // bytes), else -1.
  int64_t driver_bytes_in_use = -1;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda"
  // One line: library versions, device, threads ("oneDNN 2.6.3, 2 threads").
  virtual std::string Description() const = 0;

  // Every op of `graph` that some needed node uses has a kernel here, and
  // every node the executor will run has a shape and a dtype; else
  // Unimplemented / InvalidArgument naming the node and op. An alias (a
  // view, Graph::alias_of) needs no kernel: the executor runs it. The
  // executor calls it before running anything.
  virtual absl::Status CheckSupported(const Graph& graph) const = 0;

  // ---- Memory. Device allocations are aligned to at least 256 bytes.
  virtual absl::StatusOr<std::byte*> AllocateDevice(int64_t bytes) = 0;
  virtual void FreeDevice(std::byte* ptr) = 0;
  // Host buffers for offloaded copies (pinned where the device has them).
  virtual absl::StatusOr<std::byte*> AllocateHost(int64_t bytes) = 0;
  virtual void FreeHost(std::byte* ptr) = 0;
  virtual BackendMemoryStats MemoryStats() const = 0;

  // Synchronous exchange with ordinary host memory (inputs, dumps); waits
  // for all enqueued work first.
  virtual absl::Status Upload(std::byte* device_dst, const void* host_src,
                              int64_t bytes) = 0;
  virtual absl::Status Download(void* host_dst, const std::byte* device_src,
                                int64_t bytes) = 0;
  // Fills device memory with a byte value (the executor poisons the arena).
  virtual absl::Status Fill(std::byte* device_dst, uint8_t value,
                            int64_t bytes) = 0;

  // The workspace (bytes) the kernel of computed node `node` asks for:
  // library scratch (oneDNN's scratchpad and relayouts, cuDNN's chosen
  // algorithm's workspace) that it takes from KernelContext::workspace when
  // that is at least this large, and from outside the plan otherwise (as
  // scratch_bytes_peak). The planner gives it an arena offset once it is the
  // node's `workspace` (WithBackendWorkspace in runtime/workspace.h). With
  // `choice` kLeast, the least workspace any of its configurations runs in
  // (the kernel then runs that one when planned so). May run the kernel on
  // scratch operands; results are cached per configuration. 0 by default.
  virtual absl::StatusOr<int64_t> QueryWorkspace(
      const Graph& graph, NodeId node, WorkspaceChoice choice = WorkspaceChoice::kFastest) {
    (void)graph;
    (void)node;
    (void)choice;
    return 0;
  }

  // ---- Work.
  // Enqueues the kernel of ctx.node on the compute stream.
  virtual absl::Status Compute(const KernelContext& ctx) = 0;
  // Enqueues a copy between a device buffer and a host buffer from
  // AllocateHost() on the copy stream.
  virtual absl::Status Copy(CopyDirection direction, std::byte* dst,
                            const std::byte* src, int64_t bytes) = 0;
  // Marks the current point of `stream`.
  virtual absl::StatusOr<EventId> Record(Stream stream) = 0;
  // Later work on `stream` waits for `event`.
  virtual absl::Status Wait(Stream stream, EventId event) = 0;
  // Waits for everything enqueued on both streams.
  virtual absl::Status Synchronize() = 0;
  // Seconds from `from` to `to`, both recorded and complete (after
  // Synchronize()). Events recorded on different streams are comparable.
  virtual absl::StatusOr<double> ElapsedSeconds(EventId from,
                                                EventId to) const = 0;
  // Forgets every recorded event (between runs).
  virtual void ResetEvents() = 0;

  // Named counts of events of the backend's own since it was made (the CUDA
  // backend's convolution splits, refused algorithms, TF32 calls); none by
  // default. The executor reports how much each grew over a run.
  virtual std::map<std::string, int64_t> Counters() const { return {}; }
};

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_BACKEND_H_
