#include "graph/file_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "graph/text_input.h"

namespace pebble {
namespace {

namespace fs = std::filesystem;

absl::Status WriteError(const std::string& path, int error) {
  return absl::PermissionDeniedError(
      absl::StrCat("cannot write ", Quote(path), ": ", std::strerror(error)));
}

// Writes every part to `fd` (retrying short writes and EINTR), then closes
// it. Returns 0 or the errno of the first failure; `fd` is closed either way.
int WriteAllAndClose(int fd, absl::Span<const absl::string_view> parts) {
  int error = 0;
  for (absl::string_view part : parts) {
    const char* p = part.data();
    size_t left = part.size();
    while (left > 0 && error == 0) {
      const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
      if (n < 0) {
        if (errno != EINTR) error = errno;
        continue;
      }
      if (n == 0) error = EIO;  // no progress: the device takes no more
      p += n;
      left -= static_cast<size_t>(n);
    }
    if (error != 0) break;
  }
  // close() reports what a network or full file system only found now.
  if (::close(fd) != 0 && error == 0) error = errno;
  return error;
}

// A name for a temporary file in `dir` that no other writer picks: the
// process id and a counter.
fs::path TemporaryName(const fs::path& dir) {
  static std::atomic<int> counter{0};
  return dir / absl::StrCat(".pebble-", ::getpid(), "-", counter.fetch_add(1), ".tmp");
}

absl::Status WriteInPlace(const std::string& shown, const std::string& target, int flags,
                          absl::Span<const absl::string_view> parts) {
  const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | flags, 0666);
  if (fd < 0) return WriteError(shown, errno);
  if (const int error = WriteAllAndClose(fd, parts); error != 0) {
    return WriteError(shown, error);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> parts) {
  std::error_code ec;
  std::string target = path;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    // Replace the file the link leads to, not the link.
    const fs::path resolved = fs::canonical(path, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot write ", Quote(path), ": a symbolic link to a missing file"));
    }
    target = resolved.string();
  }
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) return WriteError(path, EISDIR);
  if (exists && !S_ISREG(st.st_mode)) {
    // A device (/dev/null, /dev/full) or a pipe: written as it is.
    return WriteInPlace(path, target, 0, parts);
  }
  // A read-only file stays one: the rename below would replace it anyway.
  if (exists && ::access(target.c_str(), W_OK) != 0) return WriteError(path, errno);

  fs::path dir = fs::path(target).parent_path();
  if (dir.empty()) dir = ".";
  const std::string temporary = TemporaryName(dir).string();
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int error = errno;
    // A directory that takes no new file (permissions, /proc): an existing
    // file is rewritten in place, without the protection of the rename.
    if (exists) return WriteInPlace(path, target, O_TRUNC, parts);
    return WriteError(path, error);
  }
  if (exists) (void)::fchmod(fd, st.st_mode & 07777);
  if (const int error = WriteAllAndClose(fd, parts); error != 0) {
    ::unlink(temporary.c_str());
    return WriteError(path, error);
  }
  if (::rename(temporary.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    return WriteError(path, error);
  }
  return absl::OkStatus();
}

}  // namespace pebble
