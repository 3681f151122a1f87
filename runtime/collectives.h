// The collectives a data-parallel run calls across its ranks (docs/runtime.md,
// "Several ranks"). The executor runs each all_reduce step of a schedule
// through this interface; runtime/gloo/ implements it with gloo over TCP.
// Every rank makes the same calls in the same order (SPMD): a call that one
// rank skips leaves the others waiting until the timeout.
#ifndef PEBBLE_RUNTIME_COLLECTIVES_H_
#define PEBBLE_RUNTIME_COLLECTIVES_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/simulator.h"

namespace pebble {

// The executor calls a Collectives from one thread at a time, not always
// the thread that made it: its all-reduces and all-gathers run on a thread
// of their own while the steps go on (Note [Collectives in flight],
// runtime/executor.cc).
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // E.g. "gloo over TCP, rank 0 of 2, timeout 300 s".
  virtual std::string Description() const = 0;
  // Sums `count` elements at `data` (host memory) over the ranks, in place.
  // Every rank ends with the same bits. An error (a rank stopped, the
  // timeout passed) is a Status naming `what`.
  virtual absl::Status AllReduceSum(float* data, int64_t count, absl::string_view what) = 0;
  virtual absl::Status AllReduceSum(int64_t* data, int64_t count, absl::string_view what) = 0;
  // Every rank's `count` elements at `in`, into `out` (ranks * count
  // elements, rank r's at r * count), on every rank, bit for bit.
  virtual absl::Status AllGather(const float* in, int64_t count, float* out,
                                 absl::string_view what) = 0;
  // Sums `ranks() * count` elements at `data` over the ranks and leaves
  // rank r's part of the sum (elements r * count to (r + 1) * count) in
  // place on rank r; the rest of `data` is scratch afterwards. This default
  // is one AllReduceSum of the whole (twice a reduce-scatter's traffic);
  // an implementation with a reduce-scatter of its own overrides it.
  virtual absl::Status ReduceScatterSum(float* data, int64_t count, absl::string_view what) {
    return AllReduceSum(data, count * ranks(), what);
  }
};

// Whether every rank gave the same `fingerprint` (of its graph and schedule,
// say): otherwise an error on every rank alike, naming `what`, the ranks
// that differ from rank 0, and then `advice`.
absl::Status CheckSameOnEveryRank(Collectives& collectives, uint64_t fingerprint,
                                  absl::string_view what, absl::string_view advice);

// `own` where it is an error; else an error on every rank where another
// rank's `own` was one, naming those ranks and `what` they failed at (each
// says why in its own error); OK where every rank's was.
absl::Status AgreeOnEveryRank(Collectives& collectives, const absl::Status& own,
                              absl::string_view what);

// Runs `work` on this thread of every rank, and returns once every rank's
// has returned. Meanwhile a thread of its own beats with the other ranks
// (an all-reduce each `poll_s` seconds, which must be below the
// collectives' timeout), so that the ranks wait for each other as long as
// their work takes, while a rank that stops is still found within the
// timeout: that failure, named `what`, comes once `work` has returned.
// `work` must not use `collectives`.
absl::Status WorkTogether(Collectives& collectives, const std::function<void()>& work,
                          absl::string_view what, double poll_s = 1.0);

// Rank 0's `make()`, on every rank: its bytes, or its error (on the other
// ranks prefixed "rank 0: "). Only rank 0 calls `make`; the others wait
// for it as WorkTogether does.
absl::StatusOr<std::string> FromRank0(Collectives& collectives,
                                      const std::function<absl::StatusOr<std::string>()>& make,
                                      absl::string_view what, double poll_s = 1.0);

// The ranks' link as the simulator times an all-reduce (AllReduceSeconds:
// 2 (r - 1) latency + 2 (r - 1) / r bytes / bandwidth), fitted to the least
// time of `repeats` all-reduces of `small_bytes` and of `large_bytes`
// float32 bytes, each started together (a one-element all-reduce first).
// Rank 0's fit, on every rank. Where the large one is not clearly slower
// than the small one (other work took the cores), the ranks measure again,
// up to three times, then fail. The latency is 0 where the small one takes
// no longer per byte than the large one allows.
absl::StatusOr<NetworkLink> MeasureNetworkLink(Collectives& collectives, int64_t small_bytes,
                                               int64_t large_bytes, int repeats = 5);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_COLLECTIVES_H_
