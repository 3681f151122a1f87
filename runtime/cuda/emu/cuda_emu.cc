// The grid runner of the kernel emulator (contract in cuda_emu.h).
//
// Note [Emulated barriers]: the threads of a block run on fibers
// (Boost.Context) on the calling host thread. A phase resumes every runnable
// thread, in the launch order, until it reaches __syncthreads or returns;
// when every thread waits at the same barrier, the next phase starts.
// Fibers are slots that outlive their threads: a slot runs one thread after
// another, so a launch creates no stacks. Kernels that have never reached a
// barrier run as plain calls instead, which is safe because pebble's kernels
// reach their barriers unconditionally; one that reaches a barrier in such a
// direct run is stopped with a fault that says so, never run wrongly.
#include "runtime/cuda/emu/cuda_emu.h"

#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "runtime/cuda/emu/host_runtime.h"

namespace pebble::cuda {

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace emu {
namespace {

namespace ctx = boost::context;

// Compute capability 9.0's launch limits (CUDA C++ Programming Guide,
// "Features and Technical Specifications").
constexpr uint64_t kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockZ = 64;
constexpr unsigned kMaxGridX = 0x7fffffffu;
constexpr unsigned kMaxGridYZ = 65535;

// Stack of each fiber, above a guard page.
constexpr size_t kStackBytes = size_t{256} << 10;

enum class FiberState { kRunnable, kAtBarrier, kDone };

// Thrown out of a direct (fiber-free) run that reaches a barrier.
struct BarrierInDirectRun {};

struct Runner {
  const std::function<void()>* thread = nullptr;
  bool direct = false;
  bool reached_barrier = false;
  uint64_t running = 0;  // the slot (= thread of the block) running now
};

thread_local Runner* current_runner = nullptr;
thread_local Order order = Order::kForward;

// One fiber that runs the threads it is given, one after another.
struct Slot {
  ctx::fiber fiber;      // resumes the slot; empty while it runs
  ctx::fiber scheduler;  // held by the slot while it runs: where it yields to
  FiberState state = FiberState::kDone;
  const char* barrier_file = "";
  int barrier_line = 0;

  // Back to the scheduler until resumed.
  void Yield() { scheduler = std::move(scheduler).resume(); }
};

// The calling host thread's slots.
class SlotPool {
 public:
  Slot& Get(uint64_t i) {
    while (slots_.size() <= i) slots_.push_back(NewSlot());
    return *slots_[i];
  }
  // Discards every slot (after a fault left some inside a thread): their
  // stacks unwind.
  void Reset() { slots_.clear(); }

 private:
  static std::unique_ptr<Slot> NewSlot() {
    auto slot = std::make_unique<Slot>();
    Slot* s = slot.get();
    s->fiber = ctx::fiber(std::allocator_arg,
                          ctx::protected_fixedsize_stack(kStackBytes),
                          [s](ctx::fiber&& scheduler) {
                            s->scheduler = std::move(scheduler);
                            for (;;) {
                              (*current_runner->thread)();
                              s->state = FiberState::kDone;
                              s->Yield();
                            }
                            return std::move(s->scheduler);
                          });
    return slot;
  }

  std::vector<std::unique_ptr<Slot>> slots_;
};

thread_local SlotPool slot_pool;

std::mutex state_mutex;
// Kernel -> whether it has reached a barrier (absent: never launched).
std::map<const void*, bool>& KernelBarriers() {
  static auto* m = new std::map<const void*, bool>();
  return *m;
}
std::vector<std::string>& Faults() {
  static auto* v = new std::vector<std::string>();
  return *v;
}

void AddFault(std::string what) {
  std::lock_guard<std::mutex> lock(state_mutex);
  Faults().push_back(std::move(what));
  SetLaunchError(cudaErrorLaunchFailure);
}

uint3 Unravel(uint64_t i, dim3 d) {
  uint3 r;
  r.x = static_cast<unsigned>(i % d.x);
  r.y = static_cast<unsigned>(i / d.x % d.y);
  r.z = static_cast<unsigned>(i / (uint64_t{d.x} * d.y));
  return r;
}

std::string Where(const char* name, uint64_t block) {
  const uint3 b = Unravel(block, gridDim);
  return std::string(name) + " (grid " + std::to_string(gridDim.x) + "x" +
         std::to_string(gridDim.y) + "x" + std::to_string(gridDim.z) +
         ", block " + std::to_string(blockDim.x) + "x" +
         std::to_string(blockDim.y) + "x" + std::to_string(blockDim.z) +
         ") block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
         std::to_string(b.z) + ")";
}

// The position of the i-th thread or block to run under the current order.
uint64_t Nth(uint64_t i, uint64_t n) {
  return order == Order::kForward ? i : n - 1 - i;
}

// Runs one block on fibers; false after a fault.
bool RunBlockOnFibers(Runner& r, uint64_t threads, const char* name,
                      uint64_t block) {
  for (uint64_t t = 0; t < threads; ++t) {
    slot_pool.Get(t).state = FiberState::kRunnable;
  }
  for (;;) {
    for (uint64_t i = 0; i < threads; ++i) {
      const uint64_t t = Nth(i, threads);
      Slot& s = slot_pool.Get(t);
      if (s.state != FiberState::kRunnable) continue;
      threadIdx = Unravel(t, blockDim);
      r.running = t;
      s.fiber = std::move(s.fiber).resume();
    }
    uint64_t waiting = 0, done = 0;
    const Slot* first_waiting = nullptr;
    bool same_site = true;
    for (uint64_t t = 0; t < threads; ++t) {
      const Slot& s = slot_pool.Get(t);
      if (s.state == FiberState::kDone) {
        ++done;
      } else {
        ++waiting;
        if (first_waiting == nullptr) {
          first_waiting = &s;
        } else if (s.barrier_line != first_waiting->barrier_line ||
                   std::string(s.barrier_file) != first_waiting->barrier_file) {
          same_site = false;
        }
      }
    }
    if (waiting == 0) return true;
    if (done > 0 || !same_site) {
      AddFault(Where(name, block) + ": " + std::to_string(waiting) +
               " threads wait at a barrier (" + first_waiting->barrier_file +
               ":" + std::to_string(first_waiting->barrier_line) + ") that " +
               (done > 0
                    ? std::to_string(done) + " returned threads never reach"
                    : std::string("others reach at another site")));
      slot_pool.Reset();
      return false;
    }
    for (uint64_t t = 0; t < threads; ++t) {
      Slot& s = slot_pool.Get(t);
      if (s.state == FiberState::kAtBarrier) s.state = FiberState::kRunnable;
    }
  }
}

}  // namespace

void SetOrder(Order o) { order = o; }
Order GetOrder() { return order; }

std::vector<std::string> TakeFaults() {
  std::lock_guard<std::mutex> lock(state_mutex);
  std::vector<std::string> out;
  out.swap(Faults());
  return out;
}

void SyncThreads(const char* file, int line) {
  Runner* r = current_runner;
  if (r == nullptr) {
    std::fprintf(stderr, "cuda emulator: __syncthreads outside a kernel\n");
    std::abort();
  }
  r->reached_barrier = true;
  if (r->direct) throw BarrierInDirectRun{};
  Slot& s = slot_pool.Get(r->running);
  s.state = FiberState::kAtBarrier;
  s.barrier_file = file;
  s.barrier_line = line;
  s.Yield();
}

bool ValidLaunch(dim3 grid, dim3 block) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  return threads > 0 && blocks > 0 && threads <= kMaxThreadsPerBlock &&
         block.x <= kMaxThreadsPerBlock && block.y <= kMaxThreadsPerBlock &&
         block.z <= kMaxBlockZ && grid.x <= kMaxGridX && grid.y <= kMaxGridYZ &&
         grid.z <= kMaxGridYZ;
}

void RunGrid(dim3 grid, dim3 block, const void* kernel, const char* name,
             const std::function<void()>& thread) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  if (!ValidLaunch(grid, block)) {
    SetLaunchError(cudaErrorInvalidConfiguration);
    return;
  }
  if (current_runner != nullptr) {
    AddFault(std::string(name) + ": launched from inside a kernel");
    return;
  }
  bool direct = false;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    auto it = KernelBarriers().find(kernel);
    direct = it != KernelBarriers().end() && !it->second;
  }
  Runner r;
  r.thread = &thread;
  r.direct = direct;
  gridDim = grid;
  blockDim = block;
  current_runner = &r;
  for (uint64_t i = 0; i < blocks; ++i) {
    const uint64_t b = Nth(i, blocks);
    blockIdx = Unravel(b, grid);
    if (direct) {
      try {
        for (uint64_t j = 0; j < threads; ++j) {
          threadIdx = Unravel(Nth(j, threads), block);
          thread();
        }
      } catch (const BarrierInDirectRun&) {
        AddFault(Where(name, b) +
                 ": reached __syncthreads, but earlier launches of this "
                 "kernel never did, so the emulator ran it without fibers");
        break;
      }
    } else if (!RunBlockOnFibers(r, threads, name, b)) {
      break;
    }
  }
  current_runner = nullptr;
  std::lock_guard<std::mutex> lock(state_mutex);
  bool& reached = KernelBarriers()[kernel];
  reached = reached || r.reached_barrier;
}

}  // namespace emu
}  // namespace pebble::cuda
