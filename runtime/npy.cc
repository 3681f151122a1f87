#include "runtime/npy.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "graph/file_output.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

absl::Status NpyError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Quote(path), ": ", what));
}

// The header dict's values by key, as raw text up to the next top-level
// comma or closing brace. The header is a Python dict literal
// ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"); NumPy
// requires exactly the keys descr, fortran_order and shape, and a literal
// that repeats a key means its last value, which a reader of the first
// would not see. So: a repeated or unknown key is an error naming it, as is
// a missing one, and nothing but blanks may follow the closing brace.
absl::StatusOr<std::map<std::string, std::string>> ParseHeaderDict(const std::string& path,
                                                                   absl::string_view header) {
  std::map<std::string, std::string> values;
  size_t pos = 0;
  auto skip_blanks = [&] {
    while (pos < header.size() && absl::ascii_isspace(static_cast<unsigned char>(header[pos]))) {
      ++pos;
    }
  };
  skip_blanks();
  if (pos >= header.size() || header[pos] != '{') return NpyError(path, "header is not a dict");
  ++pos;
  while (true) {
    skip_blanks();
    if (pos < header.size() && header[pos] == '}') break;
    if (pos >= header.size() || (header[pos] != '\'' && header[pos] != '"')) {
      return NpyError(path, "malformed header: expected a quoted key");
    }
    const char quote = header[pos];
    const size_t close = header.find(quote, pos + 1);
    if (close == absl::string_view::npos) return NpyError(path, "malformed header: unclosed key");
    const std::string key(header.substr(pos + 1, close - pos - 1));
    pos = close + 1;
    skip_blanks();
    if (pos >= header.size() || header[pos] != ':') {
      return NpyError(path, absl::StrCat("malformed header: no ':' after key ", Quote(key)));
    }
    ++pos;
    // The value: up to a comma or the closing brace outside brackets and
    // quotes.
    int depth = 0;
    char in_quote = 0;
    const size_t start = pos;
    for (; pos < header.size(); ++pos) {
      const char c = header[pos];
      if (in_quote != 0) {
        if (c == in_quote) in_quote = 0;
        continue;
      }
      if (c == '\'' || c == '"') in_quote = c;
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']') --depth;
      if (depth < 0 || (depth == 0 && (c == ',' || c == '}'))) break;
    }
    if (pos >= header.size() || depth != 0 || in_quote != 0) {
      return NpyError(path, absl::StrCat("malformed header: the value of ", Quote(key),
                                         " does not end"));
    }
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      return NpyError(path, absl::StrCat("header has unknown key ", Quote(key),
                                         " (NumPy writes descr, fortran_order and shape)"));
    }
    const std::string value(absl::StripAsciiWhitespace(header.substr(start, pos - start)));
    if (!values.emplace(key, value).second) {
      return NpyError(path, absl::StrCat("header repeats key ", Quote(key)));
    }
    if (header[pos] == ',') ++pos;
  }
  ++pos;  // the closing brace
  skip_blanks();
  if (pos != header.size()) return NpyError(path, "malformed header: text after the dict");
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (values.count(key) == 0) {
      return NpyError(path, absl::StrCat("header lacks key ", Quote(key)));
    }
  }
  return values;
}

}  // namespace

absl::StatusOr<std::string> NpyDescr(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return std::string("<f4");
    case DType::kFloat16: return std::string("<f2");
    case DType::kInt64: return std::string("<i8");
    case DType::kUInt8: return std::string("|u1");
    case DType::kBFloat16: break;
  }
  return absl::InvalidArgumentError("NumPy has no bf16 dtype; convert the tensor to fp32");
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  // The file's size bounds every allocation below: a header cannot make the
  // reader allocate more than the file holds.
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat("cannot open ", Quote(path), ": no such file"));
  }
  if (!std::filesystem::is_regular_file(status)) {
    return NpyError(path, "not a regular file");
  }
  const uintmax_t file_size = std::filesystem::file_size(path, ec);
  if (ec) return NpyError(path, absl::StrCat("cannot read its size (", ec.message(), ")"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", Quote(path)));
  char magic[kMagicSize + 2] = {};
  if (!in.read(magic, kMagicSize + 2) || std::memcmp(magic, kMagic, kMagicSize) != 0) {
    return NpyError(path, "not a NumPy .npy file (bad magic)");
  }
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char len[2];
    if (!in.read(reinterpret_cast<char*>(len), 2)) return NpyError(path, "truncated header");
    header_len = len[0] | (len[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char len[4];
    if (!in.read(reinterpret_cast<char*>(len), 4)) return NpyError(path, "truncated header");
    header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  } else {
    return NpyError(path, absl::StrCat("unsupported .npy version ", major));
  }
  const uintmax_t data_start = kMagicSize + 2 + (major == 1 ? 2 : 4) + uintmax_t{header_len};
  if (data_start > file_size) return NpyError(path, "truncated header");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) return NpyError(path, "truncated header");

  ASSIGN_OR_RETURN(auto values, ParseHeaderDict(path, header));
  std::string descr = values["descr"];
  const std::string& fortran = values["fortran_order"];
  const std::string& shape_text = values["shape"];
  if (fortran != "False") return NpyError(path, "Fortran-order arrays are not supported");
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"') &&
      descr.back() == descr.front()) {
    descr = descr.substr(1, descr.size() - 2);
  }
  NpyArray array;
  if (descr == "<f4") {
    array.dtype = DType::kFloat32;
  } else if (descr == "<f2") {
    array.dtype = DType::kFloat16;
  } else if (descr == "<i8") {
    array.dtype = DType::kInt64;
  } else if (descr == "|u1" || descr == "|b1") {
    array.dtype = DType::kUInt8;
  } else {
    return NpyError(path, absl::StrCat("unsupported dtype ", Quote(descr),
                                       " (little-endian float32, float16, int64, uint8 only)"));
  }
  absl::string_view dims = absl::StripAsciiWhitespace(shape_text);
  if (!absl::ConsumePrefix(&dims, "(") || !absl::ConsumeSuffix(&dims, ")")) {
    return NpyError(path, absl::StrCat("malformed shape ", Printable(shape_text)));
  }
  for (absl::string_view d : absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &value) || value < 0) {
      return NpyError(path, absl::StrCat("malformed shape ", Printable(shape_text)));
    }
    array.shape.push_back(value);
  }
  const std::optional<int64_t> tensor_bytes = TensorBytes(array.shape, array.dtype);
  if (!tensor_bytes.has_value()) {
    return NpyError(path,
                    absl::StrCat("shape ", Printable(shape_text), " holds more than 2^63 bytes"));
  }
  const int64_t bytes = *tensor_bytes;
  const uintmax_t data_bytes = file_size - data_start;
  if (data_bytes != static_cast<uintmax_t>(bytes)) {
    return NpyError(path, absl::StrCat(data_bytes < static_cast<uintmax_t>(bytes)
                                           ? "truncated data: "
                                           : "extra bytes after the data: ",
                                       "shape ", Printable(shape_text), " of ", descr, " takes ",
                                       bytes, " bytes, the file holds ", data_bytes));
  }
  array.data.resize(static_cast<size_t>(bytes));
  if (bytes > 0 && !in.read(reinterpret_cast<char*>(array.data.data()), bytes)) {
    return NpyError(path, absl::StrCat("error reading ", bytes, " bytes of data"));
  }
  return array;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  ASSIGN_OR_RETURN(std::string descr, NpyDescr(array.dtype));
  const int64_t bytes = NumElements(array.shape) * DTypeSize(array.dtype);
  if (static_cast<int64_t>(array.data.size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", array.data.size(),
                                                   " data bytes for a tensor of ", bytes));
  }
  std::string shape = absl::StrJoin(array.shape, ", ");
  if (array.shape.size() == 1) shape += ",";
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (",
                                    shape, "), }");
  // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  const size_t unpadded = kMagicSize + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  if (header.size() > 65535) return absl::InvalidArgumentError("shape too long for .npy 1.0");
  std::string preamble(kMagic, kMagicSize);
  preamble += '\x01';  // version 1.0
  preamble += '\x00';
  preamble += static_cast<char>(header.size() & 0xff);
  preamble += static_cast<char>(header.size() >> 8);
  preamble += header;
  const absl::string_view parts[] = {
      preamble, absl::string_view(reinterpret_cast<const char*>(array.data.data()),
                                  static_cast<size_t>(bytes))};
  return WriteFileAtomically(path, parts);
}

}  // namespace pebble
