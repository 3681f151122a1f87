#include "graph/text_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pebble {

namespace {

// The length of the well-formed UTF-8 sequence that starts at s[i] (RFC
// 3629: no overlong forms, no surrogates, nothing past U+10FFFF), or 0.
size_t Utf8SequenceAt(absl::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  int extra = 0;
  uint32_t code = 0;
  if (c < 0x80) {
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    extra = 1;
    code = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    extra = 2;
    code = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    extra = 3;
    code = c & 0x07;
  } else {
    return 0;
  }
  if (i + extra >= s.size()) return 0;  // truncated sequence
  for (int k = 1; k <= extra; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    code = (code << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (code < kMin[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return static_cast<size_t>(extra) + 1;
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t length = Utf8SequenceAt(s, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string Printable(absl::string_view s, size_t max_len) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    const size_t length = Utf8SequenceAt(s, i);
    if (length > 1) {  // a character beyond ASCII, whole
      out.append(s.data() + i, length);
      i += length;
      continue;
    }
    ++i;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7f || length == 0) {
      out += absl::StrFormat("\\x%02x", u);  // a control character, or a byte of no character
    } else {
      out += c;
    }
  }
  return out;
}

std::string Quote(absl::string_view s) {
  return absl::StrCat("'", Printable(s), "'");
}

bool ParseDecimal(absl::string_view text, double* value) {
  size_t i = 0;
  const size_t n = text.size();
  auto digits = [&] {
    const size_t start = i;
    while (i < n && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
  size_t mantissa = digits();
  if (i < n && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  if (i != n) return false;
  const std::string copy(text);
  errno = 0;
  char* end = nullptr;
  const double parsed = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(parsed)) return false;
  *value = parsed;
  return true;
}

namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string NearestName(absl::string_view name, absl::Span<const std::string> known,
                        size_t max_distance) {
  std::string nearest;
  size_t best = max_distance + 1;
  for (const std::string& k : known) {
    const size_t d = EditDistance(name, k);
    if (d < best) {
      best = d;
      nearest = k;
    }
  }
  return nearest;
}

absl::Status CheckJsonKeys(const nlohmann::json& object, absl::Span<const absl::string_view> known,
                           absl::string_view where) {
  if (!object.is_object()) return absl::OkStatus();
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    if (!key.empty() && key[0] == '_') continue;
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const std::string nearest =
        NearestName(key, std::vector<std::string>(known.begin(), known.end()));
    const std::string hint =
        nearest.empty() ? std::string() : absl::StrCat(" (did you mean '", nearest, "'?)");
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key ", Quote(key), hint));
  }
  return absl::OkStatus();
}

namespace {

// What a file that is not a regular one is, for messages.
absl::string_view FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::Status NotRegular(const std::string& shown, absl::string_view what, mode_t mode) {
  if (S_ISDIR(mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": cannot read ", what, ": is a directory"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      shown, ": cannot read ", what, ": not a regular file (", FileKind(mode),
      "); pebble reads its inputs from regular files only"));
}

absl::Status TooLarge(const std::string& shown, absl::string_view what, int64_t max_bytes) {
  return absl::InvalidArgumentError(absl::StrCat(
      shown, ": ", what, " is larger than ", max_bytes, " bytes, the most pebble reads"));
}

}  // namespace

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, absl::string_view what,
                                            int64_t max_bytes) {
  const std::string shown = Printable(path, 200);
  // stat before open: opening a FIFO would wait for a writer, and opening a
  // device may have effects of its own.
  struct stat before;
  if (stat(path.c_str(), &before) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(shown, ": cannot read ", what, ": no such file"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": cannot read ", what, " (", std::strerror(errno), ")"));
  }
  if (!S_ISREG(before.st_mode)) return NotRegular(shown, what, before.st_mode);
  if (before.st_size > max_bytes) return TooLarge(shown, what, max_bytes);
  // O_NONBLOCK: should the path have become a FIFO since the stat, the open
  // returns at once, and the fstat below refuses it.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": cannot open ", what, " (", std::strerror(errno), ")"));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};
  struct stat opened;
  if (fstat(fd, &opened) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": cannot read ", what, " (", std::strerror(errno), ")"));
  }
  if (!S_ISREG(opened.st_mode)) return NotRegular(shown, what, opened.st_mode);
  // Read at most max_bytes + 1 bytes: a file that grew since the stat is
  // refused as soon as one byte too many arrives.
  std::string text;
  text.reserve(static_cast<size_t>(std::min<int64_t>(opened.st_size, max_bytes) + 1));
  std::vector<char> chunk(1 << 16);
  for (;;) {
    const int64_t room = max_bytes + 1 - static_cast<int64_t>(text.size());
    if (room <= 0) break;
    const ssize_t n = read(fd, chunk.data(),
                           static_cast<size_t>(std::min<int64_t>(room, chunk.size())));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(shown, ": error while reading ", what, " (",
                                                     std::strerror(errno), ")"));
    }
    if (n == 0) break;
    text.append(chunk.data(), static_cast<size_t>(n));
  }
  if (static_cast<int64_t>(text.size()) > max_bytes) return TooLarge(shown, what, max_bytes);
  return text;
}

namespace {

using Json = nlohmann::json;

// Builds the document as nlohmann's own parser does and keeps the path to the
// value being parsed, so that errors can say where they are. Also rejects
// what nlohmann accepts but a graph file must not contain: a key repeated in
// one object (nlohmann keeps the last one silently) and nesting deeper than
// kMaxJsonDepth (copying and printing such values recurses).
//
// With a `stream_key`, the elements of the array under that key of the
// top-level object are not kept: each is built alone and handed to `sink`
// when complete, so that memory holds one element at a time.
class TrackingSax : public nlohmann::json_sax<Json> {
 public:
  TrackingSax(absl::string_view text, absl::string_view stream_key = "",
              const JsonElementSink* sink = nullptr)
      : text_(text), stream_key_(stream_key), sink_(sink) {}

  Json& root() { return root_; }
  // After a failed parse: "line L, column C: what (at path, node 'id')"
  // (no line and column when the parser gave no position).
  const std::string& error() const { return error_; }
  // An error the sink returned, which ended the parse (else OK).
  const absl::Status& sink_status() const { return sink_status_; }

  bool null() override { return Put(Json(nullptr)); }
  bool boolean(bool v) override { return Put(Json(v)); }
  bool number_integer(number_integer_t v) override { return Put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Put(Json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) override {
    return Put(Json(v));
  }
  bool string(string_t& v) override { return Put(Json(std::move(v))); }
  bool binary(binary_t& v) override { return Put(Json::binary(std::move(v))); }
  bool start_object(std::size_t /*elements*/) override {
    return Open(Json::object());
  }
  bool start_array(std::size_t /*elements*/) override {
    return Open(Json::array());
  }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& key) override {
    Frame& f = frames_.back();
    f.key = key;
    f.has_key = true;
    if (!f.keys.insert(key).second) {
      return Fail(std::nullopt, absl::StrCat("duplicate key ", Quote(key)));
    }
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    // Drops nlohmann's "[json.exception.parse_error.101] parse error at
    // line 3, column 4: " prefix: the position is rendered by Fail.
    std::string what = ex.what();
    if (size_t p = what.find("] "); p != std::string::npos) {
      what.erase(0, p + 2);
    }
    if (what.rfind("parse error", 0) == 0) {
      if (size_t p = what.find(": "); p != std::string::npos) {
        what.erase(0, p + 2);
      }
      what = absl::StrCat("invalid JSON: ", what);
    }
    return Fail(position, what);
  }

 private:
  struct Frame {
    Json* value = nullptr;
    bool is_array = false;
    bool streamed = false;  // an array whose elements go to the sink
    size_t count = 0;       // streamed arrays: elements begun
    bool has_key = false;
    std::string key;                        // objects: the key being parsed
    absl::flat_hash_set<std::string> keys;  // objects: lookups only
  };

  // Where the next value goes: a new root, the end of an array, or the
  // current key of an object.
  Json* Slot() {
    if (frames_.empty()) return &root_;
    Frame& f = frames_.back();
    if (f.streamed) {
      ++f.count;
      element_ = nullptr;
      return &element_;
    }
    if (f.is_array) {
      f.value->push_back(nullptr);
      return &f.value->back();
    }
    return &(*f.value)[f.key];
  }

  bool Put(Json v) {
    *Slot() = std::move(v);
    return frames_.empty() || !frames_.back().streamed || Hand();
  }

  // The streamed element just completed goes to the sink.
  bool Hand() {
    const size_t index = frames_.back().count - 1;
    absl::Status status = (*sink_)(element_, index);
    element_ = nullptr;
    if (status.ok()) return true;
    sink_status_ = std::move(status);
    return false;
  }

  bool Open(Json container) {
    if (frames_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      return Fail(std::nullopt, absl::StrCat("nested deeper than ",
                                             kMaxJsonDepth, " levels"));
    }
    const bool is_array = container.is_array();
    Json* slot = Slot();
    *slot = std::move(container);
    // The pointer stays valid: a container's parent gains no element until
    // the container is closed.
    Frame frame;
    frame.value = slot;
    frame.is_array = is_array;
    // The array under the stream key of the top-level object.
    frame.streamed = is_array && sink_ != nullptr && frames_.size() == 1 &&
                     !frames_[0].is_array && frames_[0].key == stream_key_;
    frames_.push_back(std::move(frame));
    return true;
  }

  bool Close() {
    frames_.pop_back();
    return frames_.empty() || !frames_.back().streamed || Hand();
  }

  // "nodes[2].cost": the path to the value being parsed.
  std::string Path() const {
    std::string path;
    for (size_t j = 0; j < frames_.size(); ++j) {
      const Frame& f = frames_[j];
      const bool has_child = j + 1 < frames_.size();
      if (f.is_array) {
        // An open child container was already appended; a scalar was not.
        const size_t n = f.streamed ? f.count : f.value->size();
        absl::StrAppend(&path, "[", has_child ? n - 1 : n, "]");
      } else if (f.has_key) {
        absl::StrAppend(&path, j == 0 ? "" : ".", Printable(f.key, 40));
      } else {
        break;
      }
    }
    return path;
  }

  // The id of the node being parsed, when the error lies inside a node
  // object under "nodes" whose id was already read.
  std::optional<std::string> CurrentNodeId() const {
    if (frames_.size() < 3 || frames_[0].is_array ||
        frames_[0].key != "nodes" || !frames_[1].is_array ||
        frames_[2].is_array) {
      return std::nullopt;
    }
    auto it = frames_[2].value->find("id");
    if (it == frames_[2].value->end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  }

  bool Fail(std::optional<size_t> position, absl::string_view what) {
    if (position.has_value()) {
      const size_t pos = std::min(*position, text_.size());
      const absl::string_view before = text_.substr(0, pos);
      const size_t line = 1 + static_cast<size_t>(std::count(
                                  before.begin(), before.end(), '\n'));
      const size_t line_start = before.rfind('\n');
      const size_t column =
          line_start == absl::string_view::npos ? pos : pos - line_start - 1;
      error_ = absl::StrCat("line ", line, ", column ", column, ": ");
    }
    absl::StrAppend(&error_, Printable(what, 200));
    std::string context = Path();
    if (std::optional<std::string> id = CurrentNodeId(); id.has_value()) {
      absl::StrAppend(&context, context.empty() ? "" : ", ", "node ",
                      Quote(*id));
    }
    if (!context.empty()) absl::StrAppend(&error_, " (at ", context, ")");
    return false;
  }

  absl::string_view text_;
  absl::string_view stream_key_;
  const JsonElementSink* sink_;
  Json root_;
  Json element_;  // the streamed element being built
  std::vector<Frame> frames_;
  std::string error_;
  absl::Status sink_status_;
};

}  // namespace

namespace {

absl::StatusOr<nlohmann::json> Parse(absl::string_view text, absl::string_view source,
                                     absl::string_view stream_key, const JsonElementSink* sink) {
  const absl::string_view prefix_sep = source.empty() ? "" : ": ";
  if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, prefix_sep, "invalid JSON: a NUL byte at offset ", nul));
  }
  TrackingSax sax(text, stream_key, sink);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const std::exception& e) {
    // Not expected: the parser reports through the handler. Kept so that no
    // input can escape as an exception.
    return absl::InvalidArgumentError(
        absl::StrCat(source, prefix_sep, "invalid JSON: ", Printable(e.what(), 200)));
  }
  if (ok) return std::move(sax.root());
  if (!sax.sink_status().ok()) return sax.sink_status();
  const std::string& error = sax.error();
  if (source.empty()) return absl::InvalidArgumentError(error);
  // "line 3, column 4: x" -> "path:3:4: x", as compilers write it.
  size_t line = 0;
  size_t column = 0;
  int consumed = 0;
  if (std::sscanf(error.c_str(), "line %zu, column %zu: %n", &line, &column, &consumed) == 2 &&
      consumed > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", line, ":", column, ": ", error.substr(consumed)));
  }
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", error));
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, absl::string_view source) {
  return Parse(text, source, "", nullptr);
}

absl::StatusOr<nlohmann::json> ParseStrictJsonStreaming(absl::string_view text,
                                                        absl::string_view source,
                                                        absl::string_view stream_key,
                                                        const JsonElementSink& sink) {
  return Parse(text, source, stream_key, &sink);
}

}  // namespace pebble
