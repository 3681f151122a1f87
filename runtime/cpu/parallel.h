// Parallel loops of the CPU backend's own kernels.
//
// Note [One thread pool]: they run on OpenMP, the runtime that oneDNN (the
// Debian build of libdnnl, linked against libgomp) runs its primitives on.
// With a second pool (oneTBB's workers, as before) the two fought over the
// cores: after every oneDNN primitive OpenMP's workers spin for a while
// (GOMP_SPINCOUNT) waiting for the next parallel region, so the own kernel
// that follows found its second core busy. On 2 cores batch norm ran at
// about half speed next to convolutions (ResNet-18, docs/runtime-kernels.md).
//
// Results never depend on the split: every caller either computes each
// output element in exactly one call, or stores partial sums per fixed block
// and adds them in block order.
#ifndef PEBBLE_RUNTIME_CPU_PARALLEL_H_
#define PEBBLE_RUNTIME_CPU_PARALLEL_H_

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace pebble::cpu {

// fn(begin, end) over the ranges [k grain, min(n, (k + 1) grain)) covering
// [0, n), handed to the threads dynamically. One call, on the calling
// thread, when n <= grain.
template <typename Fn>
void ParallelRanges(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (n <= grain || omp_get_max_threads() == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunks = (n + grain - 1) / grain;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < chunks; ++k) {
    fn(k * grain, std::min(n, (k + 1) * grain));
  }
}

// The grain, in tasks, that gives chunks of about `chunk_elements` elements
// when each task covers `elements_per_task` (at least one task a chunk).
// Tasks of a few dozen elements (a 4x4 feature map) cost more to schedule
// than to run.
inline int64_t GrainFor(int64_t elements_per_task, int64_t chunk_elements) {
  return std::max<int64_t>(
      1, chunk_elements / std::max<int64_t>(1, elements_per_task));
}

// The threads a parallel loop uses (OpenMP's, shared with oneDNN).
inline int ParallelThreads() { return omp_get_max_threads(); }

// For tests: runs the scope with one thread (own kernels and oneDNN alike),
// then restores the previous count.
class SingleThreadScope {
 public:
  SingleThreadScope() : previous_(omp_get_max_threads()) {
    omp_set_num_threads(1);
  }
  ~SingleThreadScope() { omp_set_num_threads(previous_); }
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;

 private:
  int previous_;
};

}  // namespace pebble::cpu

#endif  // PEBBLE_RUNTIME_CPU_PARALLEL_H_
