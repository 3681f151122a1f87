// Host stand-ins for the runtime calls of the emulated builds (contract in
// host_runtime.h).
//
// Note [Emulated streams]: a stream is a queue of closures with two counts,
// enqueued and executed. An event record is a closure that stamps the
// event's time; the event remembers its stream and the position after its
// record, and is complete once the stream has executed that far. A wait
// (cudaStreamWaitEvent) captures that (stream, position) when it is
// enqueued, as the runtime does, and when it runs it drains the other
// stream up to the position first. Every wait points at work enqueued
// before it, so draining never cycles. The device state is guarded by one
// recursive mutex: a drain runs library work and waits that drain again.
#include "runtime/cuda/emu/host_runtime.h"

#include <cublas_api.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace pebble::cuda::emu {
namespace {

std::mutex error_mutex;
cudaError_t last_error = cudaSuccess;
cudaError_t sticky_error = cudaSuccess;

// cudaDeviceProp::memPitch of an H100: the widest pitch of a 2-D copy.
constexpr size_t kMaxPitch = 2147483647;

struct EmuStream {
  bool destroyed = false;
  std::deque<std::function<void()>> pending;
  int64_t enqueued = 0, executed = 0;
};

struct EmuEvent {
  EmuStream* stream = nullptr;  // of the latest record; null: never recorded
  int64_t position = 0;         // complete once stream->executed reaches it
  int64_t generation = 0;       // which record the stamp belongs to
  bool stamped = false;
  std::chrono::steady_clock::time_point time;
};

struct Device {
  std::recursive_mutex mutex;
  StreamSchedule schedule = StreamSchedule::kImmediate;
  int count = 1;
  std::vector<EmuStream*> streams;  // in creation order
  std::map<const void*, size_t> device_allocs, pinned_allocs;
  std::set<const void*> freeing;  // cudaFreeAsync enqueued, not yet run
  int64_t device_in_use = 0;
  int64_t device_in_use_limit = 0;  // SetDeviceMemoryLimit; 0: none
  int64_t device_wide_waits = 0;
};

Device& Dev() {
  static Device* device = new Device;  // never destroyed: used at exit
  return *device;
}

// Where events recorded on the null stream point: it runs work when
// enqueued, so it has always executed everything.
EmuStream* NullStream() {
  static EmuStream* null_stream = new EmuStream;
  return null_stream;
}

EmuStream* AsStream(cudaStream_t s) { return reinterpret_cast<EmuStream*>(s); }
EmuEvent* AsEvent(cudaEvent_t e) { return reinterpret_cast<EmuEvent*>(e); }

// Runs `s` until it has executed `upto` items (Note [Emulated streams]).
void Drain(EmuStream* s, int64_t upto) {
  while (s->executed < upto && !s->pending.empty()) {
    std::function<void()> work = std::move(s->pending.front());
    s->pending.pop_front();
    work();
    ++s->executed;
  }
}

// The streams in the schedule's order, draining each, up to and including
// `last` (null: all of them). Draining a stream also runs what its waits
// need of the others.
void DrainInOrder(const EmuStream* last) {
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  std::vector<EmuStream*> order = d.streams;
  if (d.schedule == StreamSchedule::kLazyNewestFirst) {
    std::reverse(order.begin(), order.end());
  }
  for (EmuStream* s : order) {
    Drain(s, s->enqueued);
    if (s == last) return;
  }
}

// Every stream (the device synchronises).
void DrainAll() { DrainInOrder(nullptr); }

// What cudaMalloc, cudaFree, cudaMallocHost and cudaFreeHost do first: the
// runtime synchronises every stream around them (CUDA Programming Guide,
// "Implicit Synchronization" and "Stream-Ordered Memory Allocator").
void WaitForTheDevice() {
  ++Dev().device_wide_waits;
  DrainAll();
}

// Device memory of `bytes` (256-byte aligned), counted against the device.
cudaError_t AllocateDevice(void** ptr, size_t bytes) {
  Device& d = Dev();
  *ptr = nullptr;
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  if (bytes > static_cast<size_t>(kDeviceBytes) ||
      static_cast<int64_t>(rounded) > kDeviceBytes - kContextBytes - d.device_in_use ||
      (d.device_in_use_limit > 0 &&
       d.device_in_use + static_cast<int64_t>(rounded) > d.device_in_use_limit)) {
    return cudaErrorMemoryAllocation;
  }
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return cudaErrorMemoryAllocation;
  d.device_allocs[p] = rounded;
  d.device_in_use += static_cast<int64_t>(rounded);
  *ptr = p;
  return cudaSuccess;
}

// Returns an allocation of AllocateDevice to the device, poisoned first so
// that a read after the free sees NaN bytes rather than the old values.
void ReleaseDevice(void* ptr) {
  Device& d = Dev();
  auto it = d.device_allocs.find(ptr);
  std::memset(ptr, 0xff, it->second);
  d.device_in_use -= static_cast<int64_t>(it->second);
  d.device_allocs.erase(it);
  std::free(ptr);
}

void Push(EmuStream* s, std::function<void()> work) {
  s->pending.push_back(std::move(work));
  ++s->enqueued;
  if (Dev().schedule == StreamSchedule::kImmediate) Drain(s, s->enqueued);
}

// Whether [p, p + bytes) lies in one pinned allocation.
bool IsPinned(const void* p, size_t bytes) {
  const auto& pinned = Dev().pinned_allocs;
  auto it = pinned.upper_bound(p);
  if (it == pinned.begin()) return false;
  --it;
  const char* base = static_cast<const char*>(it->first);
  const char* q = static_cast<const char*>(p);
  return q >= base && q + bytes <= base + it->second;
}

// The 2-D copy and set: `height` rows of `width` bytes, rows `pitch` apart.
cudaError_t CheckPitches(size_t width, size_t dpitch, size_t spitch) {
  return width > dpitch || width > spitch || dpitch > kMaxPitch ||
                 spitch > kMaxPitch
             ? cudaErrorInvalidPitchValue
             : cudaSuccess;
}

// A copy enqueued on `stream`, reading `src_bytes` from src and writing
// `dst_bytes` at dst: staged when its source is pageable host memory,
// finished before returning when its destination is (CUDA Runtime API,
// "API synchronization behavior", asynchronous copies). Source and
// destination spans that overlap are undefined on the device ("the memory
// areas may not overlap"); here they fail with cudaErrorInvalidValue, so a
// caller that relies on memmove semantics is found.
cudaError_t EnqueueCopy(void* dst, size_t dst_bytes, const void* src,
                        size_t src_bytes, cudaMemcpyKind kind,
                        cudaStream_t stream,
                        std::function<void(void*, const void*)> copy) {
  const auto to = reinterpret_cast<uintptr_t>(dst);
  const auto from = reinterpret_cast<uintptr_t>(src);
  if (to < from + src_bytes && from < to + dst_bytes) return cudaErrorInvalidValue;
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (kind == cudaMemcpyHostToDevice && !IsPinned(src, src_bytes)) {
    auto staged = std::make_shared<std::vector<char>>(
        static_cast<const char*>(src), static_cast<const char*>(src) + src_bytes);
    Enqueue(stream, [dst, staged, copy] { copy(dst, staged->data()); });
    return cudaSuccess;
  }
  Enqueue(stream, [dst, src, copy] { copy(dst, src); });
  if (kind == cudaMemcpyDeviceToHost && !IsPinned(dst, dst_bytes) &&
      stream != nullptr) {
    EmuStream* s = AsStream(stream);
    Drain(s, s->enqueued);
  }
  return cudaSuccess;
}

// The runtime's name and text of the errors the emulated build returns.
struct ErrorWords {
  cudaError_t error;
  const char* name;
  const char* text;
};
constexpr ErrorWords kErrorWords[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue",
     "invalid pitch argument"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice",
     "invalid device ordinal"},
    {cudaErrorNoDevice, "cudaErrorNoDevice",
     "no CUDA-capable device is detected"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
     "invalid resource handle"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure",
     "unspecified launch failure (emulated: see the emulator's faults)"},
};

ErrorWords Describe(cudaError_t e) {
  for (const ErrorWords& w : kErrorWords) {
    if (w.error == e) return w;
  }
  return {e, "cudaError (emulated build)", "error of the emulated runtime"};
}

}  // namespace

void SetLaunchError(cudaError_t e) {
  std::lock_guard<std::mutex> lock(error_mutex);
  last_error = e;
  if (e == cudaErrorLaunchFailure) sticky_error = e;
}

void ClearStickyError() {
  std::lock_guard<std::mutex> lock(error_mutex);
  sticky_error = cudaSuccess;
  last_error = cudaSuccess;
}

void SetStreamSchedule(StreamSchedule schedule) {
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  DrainAll();
  d.schedule = schedule;
}

StreamSchedule GetStreamSchedule() {
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  return d.schedule;
}

void Enqueue(cudaStream_t stream, std::function<void()> work) {
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (stream == nullptr) {
    work();
    return;
  }
  Push(AsStream(stream), std::move(work));
}

void SetDeviceCount(int count) {
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  d.count = count;
}

int64_t DeviceBytesInUse() {
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  return d.device_in_use;
}

void SetDeviceMemoryLimit(int64_t bytes) {
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  d.device_in_use_limit = bytes;
}

int64_t DeviceWideWaits() {
  Device& d = Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  return d.device_wide_waits;
}

}  // namespace pebble::cuda::emu

namespace emu = pebble::cuda::emu;

extern "C" {

// ---- Errors.

cudaError_t CUDARTAPI cudaGetLastError(void) {
  std::lock_guard<std::mutex> lock(emu::error_mutex);
  const cudaError_t e = emu::last_error;
  emu::last_error = emu::sticky_error;
  return e;
}

const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  return emu::Describe(e).name;
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  return emu::Describe(e).text;
}

// ---- The device.

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  *count = d.count;
  return d.count == 0 ? cudaErrorNoDevice : cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (d.count == 0) return cudaErrorNoDevice;
  return device >= 0 && device < d.count ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp* prop,
                                              int device) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return e;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "%s",
                "pebble host emulation (no GPU)");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = static_cast<size_t>(emu::kDeviceBytes);
  prop->memPitch = emu::kMaxPitch;
  prop->maxThreadsPerBlock = 1024;
  prop->memoryPoolsSupported = 1;
  prop->warpSize = 32;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  *total_bytes = static_cast<size_t>(emu::kDeviceBytes);
  *free_bytes = static_cast<size_t>(emu::kDeviceBytes - emu::kContextBytes -
                                    d.device_in_use);
  return cudaSuccess;
}

// ---- Memory.

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t bytes) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  emu::WaitForTheDevice();
  return emu::AllocateDevice(ptr, bytes);
}

cudaError_t CUDARTAPI cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  emu::WaitForTheDevice();  // which also runs any cudaFreeAsync pending
  if (d.device_allocs.count(ptr) == 0) return cudaErrorInvalidValue;
  emu::ReleaseDevice(ptr);
  return cudaSuccess;
}

// Stream-ordered: neither waits for the device. The memory is usable at
// once (a legal order of the allocation and the stream's work); the free
// runs on `stream` after the work enqueued before it.
cudaError_t CUDARTAPI cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream) {
  (void)stream;
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (ptr == nullptr) return cudaErrorInvalidValue;
  return emu::AllocateDevice(ptr, bytes);
}

cudaError_t CUDARTAPI cudaFreeAsync(void* ptr, cudaStream_t stream) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (ptr == nullptr || d.device_allocs.count(ptr) == 0 || d.freeing.count(ptr) > 0) {
    return cudaErrorInvalidValue;
  }
  d.freeing.insert(ptr);
  emu::Enqueue(stream, [ptr] {
    emu::Device& dev = emu::Dev();
    std::lock_guard<std::recursive_mutex> held(dev.mutex);
    dev.freeing.erase(ptr);
    emu::ReleaseDevice(ptr);
  });
  return cudaSuccess;
}

// One default pool per device (the current device is left as it is);
// trimming has nothing to do here, since a stream-ordered free returns its
// memory when it runs.
cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  static std::array<int, 64> default_pools{};
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  if (pool == nullptr) return cudaErrorInvalidValue;
  if (device < 0 || device >= d.count || device >= static_cast<int>(default_pools.size())) {
    return cudaErrorInvalidDevice;
  }
  *pool = reinterpret_cast<cudaMemPool_t>(&default_pools[static_cast<size_t>(device)]);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t pool, size_t min_bytes_to_keep) {
  (void)min_bytes_to_keep;
  return pool == nullptr ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t CUDARTAPI cudaMallocHost(void** ptr, size_t bytes) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  emu::WaitForTheDevice();
  *ptr = std::malloc(std::max<size_t>(bytes, 1));
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  d.pinned_allocs[*ptr] = std::max<size_t>(bytes, 1);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  emu::WaitForTheDevice();
  if (d.pinned_allocs.erase(ptr) == 0) return cudaErrorInvalidValue;
  std::free(ptr);
  return cudaSuccess;
}

// ---- Streams and events.

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream,
                                                unsigned int) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  auto* s = new emu::EmuStream;
  d.streams.push_back(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

// Destroying a stream or an event returns at once, as on the device, whose
// pending work still completes: the emulator keeps both objects (a few
// bytes each), so that pending records and waits, and events recorded on
// a destroyed stream, stay valid.
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  emu::EmuStream* s = emu::AsStream(stream);
  if (std::find(d.streams.begin(), d.streams.end(), s) == d.streams.end() ||
      s->destroyed) {
    return cudaErrorInvalidResourceHandle;
  }
  s->destroyed = true;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  if (stream != nullptr) emu::DrainInOrder(emu::AsStream(stream));
  std::lock_guard<std::mutex> lock(emu::error_mutex);
  return emu::sticky_error;
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new emu::EmuEvent);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  return cudaSuccess;  // kept (see cudaStreamDestroy)
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  emu::EmuEvent* e = emu::AsEvent(event);
  if (stream == nullptr) {  // the null stream has done everything enqueued
    ++e->generation;
    e->stream = emu::NullStream();
    e->position = 0;
    e->time = std::chrono::steady_clock::now();
    e->stamped = true;
    return cudaSuccess;
  }
  emu::EmuStream* s = emu::AsStream(stream);
  const int64_t generation = ++e->generation;
  e->stream = s;
  e->position = s->enqueued + 1;
  e->stamped = false;
  emu::Push(s, [e, generation] {
    if (e->generation != generation) return;  // recorded again since
    e->time = std::chrono::steady_clock::now();
    e->stamped = true;
  });
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream,
                                          cudaEvent_t event, unsigned int) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  const emu::EmuEvent* e = emu::AsEvent(event);
  if (e->stream == nullptr) return cudaSuccess;  // never recorded: complete
  emu::EmuStream* target = e->stream;
  const int64_t position = e->position;
  emu::Enqueue(stream, [target, position] { emu::Drain(target, position); });
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start,
                                           cudaEvent_t end) {
  emu::Device& d = emu::Dev();
  std::lock_guard<std::recursive_mutex> lock(d.mutex);
  const emu::EmuEvent* a = emu::AsEvent(start);
  const emu::EmuEvent* b = emu::AsEvent(end);
  if (a->stream == nullptr || b->stream == nullptr) {
    return cudaErrorInvalidResourceHandle;
  }
  if (!a->stamped || !b->stamped) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}

// ---- Copies and sets.

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count,
                                      enum cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return emu::EnqueueCopy(dst, count, src, count, kind, stream,
                          [count](void* to, const void* from) {
                            std::memcpy(to, from, count);
                          });
}

cudaError_t CUDARTAPI cudaMemcpy2DAsync(void* dst, size_t dpitch,
                                        const void* src, size_t spitch,
                                        size_t width, size_t height,
                                        enum cudaMemcpyKind kind,
                                        cudaStream_t stream) {
  if (cudaError_t e = emu::CheckPitches(width, dpitch, spitch);
      e != cudaSuccess) {
    return e;
  }
  if (width == 0 || height == 0) return cudaSuccess;
  // The bytes the copy reads (what a pageable source stages) and writes.
  const size_t src_span = (height - 1) * spitch + width;
  const size_t dst_span = (height - 1) * dpitch + width;
  return emu::EnqueueCopy(
      dst, dst_span, src, src_span, kind, stream,
      [=](void* to, const void* from) {
        for (size_t r = 0; r < height; ++r) {
          std::memcpy(static_cast<char*>(to) + r * dpitch,
                      static_cast<const char*>(from) + r * spitch, width);
        }
      });
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* dst, int value, size_t count,
                                      cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  emu::Enqueue(stream, [=] { std::memset(dst, value, count); });
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemset2DAsync(void* dst, size_t pitch, int value,
                                        size_t width, size_t height,
                                        cudaStream_t stream) {
  if (cudaError_t e = emu::CheckPitches(width, pitch, pitch); e != cudaSuccess) {
    return e;
  }
  emu::Enqueue(stream, [=] {
    for (size_t r = 0; r < height; ++r) {
      std::memset(static_cast<char*>(dst) + r * pitch, value, width);
    }
  });
  return cudaSuccess;
}

}  // extern "C"
