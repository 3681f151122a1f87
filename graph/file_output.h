// Writing a file so that a failure is never silent and never leaves a
// half-written file where a good one was. The command line's outputs (graph,
// schedule, trace, profile, plot, dumped tensors) all go through here.
#ifndef PEBBLE_GRAPH_FILE_OUTPUT_H_
#define PEBBLE_GRAPH_FILE_OUTPUT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pebble {

// Writes the concatenation of `parts` to the file at `path`.
//  - A regular file, new or existing (also behind a symbolic link, whose
//    target is written), is written as a temporary file beside it and
//    renamed over it, so a write that fails leaves what was there; an
//    existing file keeps its permission bits. Where the directory takes no
//    new file but the file itself is writable, it is rewritten in place.
//  - Anything else that opens for writing (a character device: /dev/null)
//    is written in place.
// Every failure (open, a short write, ENOSPC or EIO on write or close, the
// rename) is an error naming the path with the system's reason. Whether
// `path` may be written at all (an existing file replaced without asking)
// is the caller's decision, made before.
absl::Status WriteFileAtomically(const std::string& path, absl::Span<const absl::string_view> parts);
inline absl::Status WriteFileAtomically(const std::string& path, absl::string_view text) {
  return WriteFileAtomically(path, absl::MakeConstSpan(&text, 1));
}

}  // namespace pebble

#endif  // PEBBLE_GRAPH_FILE_OUTPUT_H_
