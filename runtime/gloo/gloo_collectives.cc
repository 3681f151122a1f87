#include "runtime/gloo/gloo_collectives.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <new>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/status.h"
#include "graph/text_input.h"

#ifdef PEBBLE_WITH_GLOO
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace pebble {

#ifdef PEBBLE_WITH_GLOO

namespace {

class GlooCollectives : public Collectives {
 public:
  GlooCollectives(std::shared_ptr<gloo::Context> context, double timeout_s)
      : context_(std::move(context)), timeout_s_(timeout_s) {}

  int rank() const override { return context_->rank; }
  int ranks() const override { return context_->size; }
  std::string Description() const override {
    return absl::StrFormat("gloo over TCP, rank %d of %d, timeout %g s", rank(), ranks(),
                           timeout_s_);
  }

  absl::Status AllReduceSum(float* data, int64_t count, absl::string_view what) override {
    return Sum(data, count, what);
  }
  absl::Status AllReduceSum(int64_t* data, int64_t count, absl::string_view what) override {
    return Sum(data, count, what);
  }
  absl::Status AllGather(const float* in, int64_t count, float* out,
                         absl::string_view what) override {
    if (count == 0) return absl::OkStatus();
    return Guarded(what, [&] {
      gloo::AllgatherOptions options(context_);
      // gloo reads the input only; its API takes a mutable pointer.
      options.setInput(const_cast<float*>(in), static_cast<size_t>(count));
      options.setOutput(out, static_cast<size_t>(count) * static_cast<size_t>(ranks()));
      options.setTag(next_tag_++);
      gloo::allgather(options);
    });
  }
  // An all-to-all (each rank receives every rank's copy of its part: the
  // (ranks - 1) / ranks of the whole that a reduce-scatter moves), then the
  // parts summed here in rank order, into place. gloo's own reduce-scatter
  // is of its older algorithm classes, which slowed the collectives after
  // it here by a second and more.
  absl::Status ReduceScatterSum(float* data, int64_t count, absl::string_view what) override {
    if (count == 0) return absl::OkStatus();
    const size_t part = static_cast<size_t>(count);
    const size_t n = static_cast<size_t>(ranks());
    std::vector<float> parts;  // rank r's copy of this rank's part at r * count
    try {
      parts.resize(n * part);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": cannot allocate ", n * part * sizeof(float), " bytes of host memory"));
    }
    RETURN_IF_ERROR(Guarded(what, [&] {
      gloo::AlltoallOptions options(context_);
      options.setInput(data, n * part);
      options.setOutput(parts.data(), n * part);
      options.setTag(next_tag_++);
      gloo::alltoall(options);
    }));
    float* mine = data + part * static_cast<size_t>(rank());
    for (size_t i = 0; i < part; ++i) {
      float sum = parts[i];
      for (size_t r = 1; r < n; ++r) sum += parts[r * part + i];
      mine[i] = sum;
    }
    return absl::OkStatus();
  }

 private:
  template <typename T>
  absl::Status Sum(T* data, int64_t count, absl::string_view what) {
    if (count == 0) return absl::OkStatus();
    return Guarded(what, [&] {
      gloo::AllreduceOptions options(context_);
      options.setOutput(data, static_cast<size_t>(count));
      options.setReduceFunction([](void* c, const void* a, const void* b, size_t n) {
        gloo::sum<T>(c, a, b, n);
      });
      options.setTag(next_tag_++);
      gloo::allreduce(options);
    });
  }

  // `collective()`, gloo's exceptions as a Status naming `what`.
  template <typename Fn>
  absl::Status Guarded(absl::string_view what, Fn collective) {
    try {
      collective();
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          what, " failed (a rank stopped, or the ranks did not all reach it within ",
          absl::StrFormat("%g", timeout_s_), " s): ", e.what()));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<gloo::Context> context_;
  double timeout_s_;
  uint32_t next_tag_ = 0;
};

// Creates `dir`/pebble-rank-<rank> exclusively: a rank that finds it
// already there is in a directory of an earlier run.
absl::Status ClaimRank(const std::string& dir, int rank) {
  const std::string marker =
      (std::filesystem::path(dir) / absl::StrCat("pebble-rank-", rank)).string();
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  const int error = errno;
  if (fd >= 0) {
    ::close(fd);
    return absl::OkStatus();
  }
  if (error == EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous directory ", Quote(dir), " already has rank ", rank,
        "'s marker (pebble-rank-", rank, "): it is left from an earlier run, or two ranks "
        "were given the same --rank; give each run a new empty directory"));
  }
  return absl::InvalidArgumentError(absl::StrCat("rendezvous directory ", Quote(dir),
                                                 ": cannot create ", Quote(marker), ": ",
                                                 std::generic_category().message(error)));
}

// Whether a file named `name` in a rendezvous directory is one that a
// meeting of ranks writes: a rank's marker (pebble-rank-R), an object of
// gloo's file store (the decimal hash of its key) or a temporary file of it
// (hidden).
bool WrittenByAMeeting(const std::string& name) {
  auto digits = [](absl::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return name.front() == '.' || digits(name) ||
         (absl::StartsWith(name, "pebble-rank-") && digits(name.substr(12)));
}

// OK where `dir` holds nothing but what the ranks' meeting writes: a file of
// the user's there is refused before anything is written beside it.
absl::Status CheckRendezvousContents(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!WrittenByAMeeting(name)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rendezvous directory ", Quote(dir), " holds ", Quote(name), ", which no meeting of "
          "ranks wrote: give each run a new empty directory (the ranks write their markers and "
          "gloo's store there)"));
    }
  }
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous directory ", Quote(dir),
                                                   ": cannot list it: ", ec.message()));
  }
  return absl::OkStatus();
}

// gloo's message without the source locations it puts in front
// ("[./gloo/rendezvous/file_store.cc:147] ", once per layer).
std::string WithoutSourceLocations(std::string message) {
  while (message.size() > 1 && message.front() == '[') {
    const size_t end = message.find("] ");
    if (end == std::string::npos || message.find(':') > end) break;
    message.erase(0, end + 2);
  }
  return message;
}

// OK where `address` resolves to an address of TCP; gloo's device reads
// past a failed lookup (a crash, not an exception), so it is checked here.
absl::Status CheckAddress(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(address.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (error == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the rank's address ", Quote(address), " (--address) does not resolve: ",
      gai_strerror(error), "; give a name or IP address of this machine that the other ranks "
      "reach"));
}

}  // namespace

bool HaveGloo() { return true; }

absl::StatusOr<std::unique_ptr<Collectives>> ConnectGloo(const GlooOptions& options) {
  if (options.ranks < 1 || options.rank < 0 || options.rank >= options.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of ",
                                                   options.ranks, ": a rank is 0 to ranks - 1"));
  }
  if (!(options.timeout_s > 0) || !std::isfinite(options.timeout_s)) {
    return absl::InvalidArgumentError("the ranks' timeout must be a positive number of seconds");
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(options.rendezvous_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous directory ", Quote(options.rendezvous_dir), " is not a directory"));
  }
  RETURN_IF_ERROR(CheckAddress(options.address));
  RETURN_IF_ERROR(CheckRendezvousContents(options.rendezvous_dir));
  RETURN_IF_ERROR(ClaimRank(options.rendezvous_dir, options.rank));
  // In whole milliseconds, at least one: gloo takes 0 for no timeout at all.
  const auto timeout = std::chrono::milliseconds(std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(std::min(options.timeout_s, 1e9) * 1000))));
  std::optional<gloo::rendezvous::FileStore> store;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    store.emplace(options.rendezvous_dir);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.ranks);
    context->setTimeout(timeout);
    context->connectFullMesh(*store, device);
    return std::unique_ptr<Collectives>(
        std::make_unique<GlooCollectives>(std::move(context), options.timeout_s));
  } catch (const std::exception& e) {
    // A failed meeting takes back what this rank wrote, so that the
    // directory is as it found it (the others' files aside).
    std::error_code ignored;
    if (store.has_value()) {
      for (const std::string& path : store->getAllKeyFilePaths()) {
        std::filesystem::remove(path, ignored);
      }
    }
    std::filesystem::remove(
        std::filesystem::path(options.rendezvous_dir) / absl::StrCat("pebble-rank-", options.rank),
        ignored);
    return absl::UnavailableError(absl::StrCat(
        "rank ", options.rank, " of ", options.ranks, " could not meet the others through ",
        Quote(options.rendezvous_dir), " at address ", Quote(options.address), " within ",
        absl::StrFormat("%g", options.timeout_s), " s: ", WithoutSourceLocations(e.what())));
  }
}

#else  // !PEBBLE_WITH_GLOO

bool HaveGloo() { return false; }

absl::StatusOr<std::unique_ptr<Collectives>> ConnectGloo(const GlooOptions&) {
  return absl::UnimplementedError(
      "this build of pebble has no gloo, so it runs one rank: install Debian's libgloo-dev "
      "(scripts/setup does) and build again");
}

#endif  // PEBBLE_WITH_GLOO

}  // namespace pebble
