// Reading input a user may have written by hand or a tool may have broken:
// files read with a size bound, JSON parsed strictly, and untrusted text
// rendered on one line for error messages. The graph, schedule and
// cost-profile readers share these, so they refuse the same things the
// same way.
#ifndef PEBBLE_GRAPH_TEXT_INPUT_H_
#define PEBBLE_GRAPH_TEXT_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pebble {

// Deepest array/object nesting the strict parser accepts (graph attrs
// included): copying and printing deeper values recurses.
inline constexpr int kMaxJsonDepth = 64;

// Largest JSON file (graph, schedule, cost profile) read, in bytes. A
// training graph of 10^6 nodes takes about 150 MB; the parsed document
// needs roughly ten times its text.
inline constexpr int64_t kMaxJsonFileBytes = int64_t{256} << 20;

// `s` for an error message: newlines, tabs and other control characters
// escaped (\n, \t, \x01), and so is each byte that is no part of a
// well-formed UTF-8 character (\xff); cut after `max_len` bytes with "...".
// The result is one line of valid UTF-8 whatever `s` holds.
std::string Printable(absl::string_view s, size_t max_len = 80);

// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF). Graph files are JSON text, so a node id
// must be: two ids that differ only in malformed bytes would write alike.
bool IsValidUtf8(absl::string_view s);

// Printable(s) in single quotes: 'conv1'.
std::string Quote(absl::string_view s);

// A decimal number as people write it: an optional sign, digits with an
// optional fraction, an optional exponent ("12", "-0.5", "1.5e9", ".5").
// Unlike strtod and absl::SimpleAtod, refuses hexadecimal ("0x10"),
// "inf", "nan", surrounding blanks and empty text. False on anything else,
// and on a value that overflows a double.
bool ParseDecimal(absl::string_view text, double* value);

// The name of `known` closest to `name` in edit distance (insertions,
// deletions and substitutions of one character each), when that distance is
// at most `max_distance`; the first such name on a tie. Empty when none is
// that close. For "did you mean" hints.
std::string NearestName(absl::string_view name, absl::Span<const std::string> known,
                        size_t max_distance = 2);

// OK when every key of `object` is in `known` or starts with '_' (free-form
// annotations such as "_comment"); else InvalidArgument "where: unknown key
// 'x'", suggesting the closest known key within edit distance 2. Keys are
// checked in sorted order, so the first unknown one is named.
absl::Status CheckJsonKeys(const nlohmann::json& object, absl::Span<const absl::string_view> known,
                           absl::string_view where);

// The whole content of the regular file at `path`, of at most `max_bytes`
// bytes. `what` names the file in messages ("graph file"). NotFound when
// nothing is there; InvalidArgument for an unreadable file, one larger than
// `max_bytes` (refused from its size before reading, and a file that grows
// meanwhile is read no further than that), and anything but a regular file:
// a directory, a FIFO (which is never opened for reading in a way that could
// wait for a writer), a device such as /dev/zero, a socket. Every input file
// of pebble (graphs, schedules, cost profiles, ONNX models) goes through it.
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, absl::string_view what,
                                            int64_t max_bytes = kMaxJsonFileBytes);

// Parses one JSON document, more strictly than nlohmann does by default:
// besides invalid JSON and numbers that overflow a double (1e999: JSON
// cannot spell infinity), InvalidArgument for a NUL byte anywhere (nlohmann
// would stop reading there and accept what follows), a key repeated in one
// object (nlohmann keeps the last silently) and nesting deeper than
// kMaxJsonDepth. Messages read "line L, column C: what (at path.to[2].value,
// node 'id')"; with a non-empty `source`, "source:L:C: what (...)", as
// compilers write it. Never throws.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text,
                                               absl::string_view source = "");

// Receives one element of a streamed array, complete, and its index; may
// move from it. An error ends the parse and is what the parse returns.
using JsonElementSink = absl::FunctionRef<absl::Status(nlohmann::json& element, size_t index)>;

// ParseStrictJson, except that the elements of the array under the key
// `stream_key` of the top-level object are handed to `sink` one at a time,
// in order, as soon as each is parsed, and not kept: the document returned
// has an empty array there. Memory is then the rest of the document and one
// element, not every element (a JSON value takes about ten times its text).
// Errors and their positions are those of ParseStrictJson; an error of a
// later element or of the rest of the document may come after the sink has
// seen earlier elements.
absl::StatusOr<nlohmann::json> ParseStrictJsonStreaming(absl::string_view text,
                                                        absl::string_view source,
                                                        absl::string_view stream_key,
                                                        const JsonElementSink& sink);

}  // namespace pebble

#endif  // PEBBLE_GRAPH_TEXT_INPUT_H_
