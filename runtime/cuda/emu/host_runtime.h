// Host stand-ins for the CUDA runtime calls of the emulated builds
// (cuda_emu.h, docs/cuda.md "Host emulation"): "device" memory is host
// memory, and streams are queues of host work.
//
// The functions themselves are the runtime's C symbols (cudaMemcpyAsync,
// cudaStreamWaitEvent, ...), defined in host_runtime.cc with the headers'
// signatures, so that code written for the runtime links against them
// unchanged. A binary links either these or the real libraries, never both.
//
// What the emulated device models:
//  - one device (SetDeviceCount changes that) with compute capability 9.0's
//    limits, kDeviceBytes of memory of which kContextBytes are taken by the
//    context: cudaMalloc beyond the rest fails with
//    cudaErrorMemoryAllocation, and cudaMemGetInfo reports the driver view;
//  - streams as FIFO queues of work (kernels, copies, sets, library calls,
//    event records, waits). Under StreamSchedule::kImmediate work runs when
//    it is enqueued, so the streams only name an order the host already
//    follows. Under the lazy schedules nothing runs until the host has to
//    wait (cudaStreamSynchronize, cudaMalloc, cudaFree, cudaMallocHost,
//    cudaFreeHost, a copy to pageable memory): then the streams drain, one after another, in
//    creation order (kLazyOldestFirst) or its reverse (kLazyNewestFirst),
//    up to the one synchronised (all of them for cudaFree), a wait
//    (cudaStreamWaitEvent) first running the other stream up to the event. Each lazy schedule is a legal execution that a GPU could
//    produce, the one in which one stream runs as late as its dependencies
//    allow: work that reads or writes memory without the event that orders
//    it against the other stream sees the wrong bytes;
//  - the error state: cudaGetLastError returns and clears the last launch
//    error; a kernel fault is sticky and cudaStreamSynchronize reports it;
//  - copies from pageable host memory are staged when enqueued, copies to
//    pageable host memory complete before the call returns (the runtime's
//    documented behaviour); pinned memory (cudaMallocHost) is asynchronous.
// Event timings are host clock readings taken when the record runs.
#ifndef PEBBLE_RUNTIME_CUDA_EMU_HOST_RUNTIME_H_
#define PEBBLE_RUNTIME_CUDA_EMU_HOST_RUNTIME_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

namespace pebble::cuda::emu {

inline constexpr int64_t kDeviceBytes = int64_t{80} << 30;   // an H100's 80 GiB
inline constexpr int64_t kContextBytes = int64_t{512} << 20;  // the context's share

// Sets the error the next cudaGetLastError returns; cudaErrorLaunchFailure
// (a kernel fault) also stays for cudaStreamSynchronize until
// ClearStickyError.
void SetLaunchError(cudaError_t e);
void ClearStickyError();

enum class StreamSchedule { kImmediate, kLazyOldestFirst, kLazyNewestFirst };
// The schedule of work enqueued from now on (the default is kImmediate);
// changing it drains what is pending.
void SetStreamSchedule(StreamSchedule schedule);
StreamSchedule GetStreamSchedule();

// Enqueues `work` on `stream` (the null stream runs it now).
void Enqueue(cudaStream_t stream, std::function<void()> work);

// How many devices cudaGetDeviceCount reports (default 1; 0: no device,
// cudaErrorNoDevice).
void SetDeviceCount(int count);

// Device memory in use by cudaMalloc and cudaMallocAsync, in bytes.
int64_t DeviceBytesInUse();

// Makes device allocations fail with cudaErrorMemoryAllocation once the
// memory in use would exceed `bytes` (0: only the device's own size), to
// test what runs near the limit.
void SetDeviceMemoryLimit(int64_t bytes);

// How many times the host waited for every stream of the device: each
// cudaMalloc, cudaFree, cudaMallocHost and cudaFreeHost (the runtime
// synchronises around them), not the stream-ordered cudaMallocAsync and
// cudaFreeAsync.
int64_t DeviceWideWaits();

}  // namespace pebble::cuda::emu

#endif  // PEBBLE_RUNTIME_CUDA_EMU_HOST_RUNTIME_H_
