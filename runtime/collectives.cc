#include "runtime/collectives.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"

namespace pebble {

absl::Status CheckSameOnEveryRank(Collectives& collectives, uint64_t fingerprint,
                                  absl::string_view what, absl::string_view advice) {
  // An all-gather made of a sum: each rank writes its slot, zeros elsewhere.
  // The fingerprint goes in two 32-bit halves, so that no sum overflows.
  const int ranks = collectives.ranks();
  std::vector<int64_t> slots(2 * static_cast<size_t>(ranks), 0);
  slots[2 * collectives.rank()] = static_cast<int64_t>(fingerprint >> 32);
  slots[2 * collectives.rank() + 1] = static_cast<int64_t>(fingerprint & 0xffffffffu);
  if (absl::Status s = collectives.AllReduceSum(slots.data(), static_cast<int64_t>(slots.size()),
                                                absl::StrCat("the comparison of ", what));
      !s.ok()) {
    return s;
  }
  std::vector<int> differ;
  for (int r = 1; r < ranks; ++r) {
    if (slots[2 * r] != slots[0] || slots[2 * r + 1] != slots[1]) differ.push_back(r);
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " differs between the ranks (rank", differ.size() > 1 ? "s " : " ",
      absl::StrJoin(differ, ", "), " from rank 0): ", advice));
}

absl::Status AgreeOnEveryRank(Collectives& collectives, const absl::Status& own,
                              absl::string_view what) {
  std::vector<int64_t> failed(static_cast<size_t>(collectives.ranks()), 0);
  failed[collectives.rank()] = own.ok() ? 0 : 1;
  RETURN_IF_ERROR(collectives.AllReduceSum(failed.data(), static_cast<int64_t>(failed.size()),
                                           absl::StrCat("the agreement on ", what)));
  if (!own.ok()) return own;
  std::vector<int> ranks;
  for (int r = 0; r < collectives.ranks(); ++r) {
    if (failed[r] != 0) ranks.push_back(r);
  }
  if (ranks.empty()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("rank", ranks.size() > 1 ? "s " : " ",
                                         absl::StrJoin(ranks, ", "), " failed ", what,
                                         " (its own error says why)"));
}

namespace {

constexpr int64_t kMaxSentBytes = int64_t{1} << 32;  // FromRank0's result

// Rank 0's `bytes` on every rank, after a header of [code, size]: each a
// sum of rank 0's values and the other ranks' zeros, 8 bytes to an int64.
absl::StatusOr<std::string> SendFromRank0(Collectives& collectives,
                                          absl::StatusOr<std::string> own,
                                          absl::string_view what) {
  const bool sender = collectives.rank() == 0;
  const std::string* bytes = nullptr;
  std::string message;
  int64_t header[2] = {0, 0};
  if (sender) {
    if (own.ok()) {
      bytes = &*own;
    } else {
      header[0] = static_cast<int64_t>(own.status().code());
      message = std::string(own.status().message());
      bytes = &message;
    }
    header[1] = static_cast<int64_t>(bytes->size());
  }
  RETURN_IF_ERROR(collectives.AllReduceSum(header, 2, what));
  if (header[1] < 0 || header[1] > kMaxSentBytes) {
    return absl::OutOfRangeError(absl::StrCat(what, ": ", header[1], " bytes, above the ",
                                              kMaxSentBytes, " that rank 0 may send"));
  }
  const size_t size = static_cast<size_t>(header[1]);
  std::vector<int64_t> words((size + 7) / 8, 0);
  if (sender && !words.empty()) std::memcpy(words.data(), bytes->data(), size);
  if (!words.empty()) {
    RETURN_IF_ERROR(
        collectives.AllReduceSum(words.data(), static_cast<int64_t>(words.size()), what));
  }
  std::string received(reinterpret_cast<const char*>(words.data()), size);
  if (header[0] == 0) return received;
  if (sender) return own.status();
  return absl::Status(static_cast<absl::StatusCode>(header[0]),
                      absl::StrCat("rank 0: ", received));
}

}  // namespace

absl::Status WorkTogether(Collectives& collectives, const std::function<void()>& work,
                          absl::string_view what, double poll_s) {
  // Each beat sums how many ranks still work; all ranks see the same sum,
  // so all stop beating after the same beat, the first that sums to 0.
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  absl::Status beats_status;
  std::thread beats([&] {
    const auto period = std::chrono::duration<double>(poll_s);
    while (true) {
      int64_t working;
      {
        std::unique_lock<std::mutex> lock(mu);
        working = done_cv.wait_for(lock, period, [&] { return done; }) ? 0 : 1;
      }
      if (absl::Status s = collectives.AllReduceSum(&working, 1, what); !s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        beats_status = s;
        return;
      }
      if (working == 0) return;
    }
  });
  auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    done_cv.notify_all();
    beats.join();
  };
  try {
    work();
  } catch (...) {
    finish();
    throw;
  }
  finish();
  return beats_status;
}

absl::StatusOr<std::string> FromRank0(Collectives& collectives,
                                      const std::function<absl::StatusOr<std::string>()>& make,
                                      absl::string_view what, double poll_s) {
  absl::StatusOr<std::string> own = absl::UnknownError("made on rank 0");
  RETURN_IF_ERROR(WorkTogether(
      collectives, [&] { if (collectives.rank() == 0) own = make(); },
      absl::StrCat("the wait for ", what), poll_s));
  return SendFromRank0(collectives, std::move(own), what);
}

namespace {

// The least seconds of `repeats` all-reduces of `count` float32 elements.
absl::StatusOr<double> LeastAllReduceSeconds(Collectives& collectives, int64_t count,
                                             int repeats) {
  std::vector<float> data(static_cast<size_t>(count), 1.0f);
  double least = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repeats; ++i) {
    int64_t start_together = 0;
    if (absl::Status s = collectives.AllReduceSum(&start_together, 1, "the link's barrier");
        !s.ok()) {
      return s;
    }
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = collectives.AllReduceSum(data.data(), count, "the link's measurement");
        !s.ok()) {
      return s;
    }
    least = std::min(
        least, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return least;
}

}  // namespace

absl::StatusOr<NetworkLink> MeasureNetworkLink(Collectives& collectives, int64_t small_bytes,
                                               int64_t large_bytes, int repeats) {
  const int ranks = collectives.ranks();
  if (ranks < 2 || small_bytes < 4 || large_bytes <= small_bytes || repeats < 1) {
    return absl::InvalidArgumentError(
        "measuring a link takes 2 ranks or more and a large size above the small one");
  }
  const int64_t small = small_bytes / 4, large = large_bytes / 4;  // float32 elements
  for (int attempt = 0; attempt < 3; ++attempt) {
    double times[2];
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<double> t = LeastAllReduceSeconds(collectives, i == 0 ? small : large,
                                                       repeats);
      if (!t.ok()) return t.status();
      times[i] = *t;
    }
    // Rank 0's times on every rank (a sum of zeros and rank 0's), so that
    // the ranks decide alike.
    float shared[2] = {0, 0};
    if (collectives.rank() == 0) {
      shared[0] = static_cast<float>(times[0]);
      shared[1] = static_cast<float>(times[1]);
    }
    if (absl::Status s = collectives.AllReduceSum(shared, 2, "the link's times"); !s.ok()) {
      return s;
    }
    const double t_small = shared[0], t_large = shared[1];
    if (!(t_large > 1.5 * t_small)) continue;  // lost in the noise: measure again
    const double per_byte = 2.0 * (ranks - 1) / ranks;  // of the tensor, sent by each rank
    const double seconds_per_byte = (t_large - t_small) / static_cast<double>(4 * (large - small));
    NetworkLink link;
    link.bandwidth_bytes_per_s = per_byte / seconds_per_byte;
    link.latency_s = std::max(
        0.0, (t_small - per_byte * static_cast<double>(4 * small) / link.bandwidth_bytes_per_s) /
                 (2.0 * (ranks - 1)));
    return link;
  }
  return absl::UnavailableError(
      "the link could not be measured: three times, an all-reduce of the large size took "
      "less than 1.5 times the small one's (other work on these cores?); try a larger size");
}

}  // namespace pebble
