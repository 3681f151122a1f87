#include "runtime/npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

absl::Status NpyError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Quote(path), ": ", what));
}

// The value of key `key` in the header dict, as raw text up to the next
// top-level comma or closing brace.
bool FindHeaderValue(absl::string_view header, absl::string_view key, std::string* value) {
  const std::string quoted = absl::StrCat("'", key, "'");
  size_t pos = header.find(quoted);
  if (pos == absl::string_view::npos) return false;
  pos = header.find(':', pos + quoted.size());
  if (pos == absl::string_view::npos) return false;
  ++pos;
  int depth = 0;
  size_t end = pos;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    if (depth < 0) break;
  }
  *value = std::string(absl::StripAsciiWhitespace(header.substr(pos, end - pos)));
  return true;
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

  std::string descr, fortran, shape_text;
  if (!FindHeaderValue(header, "descr", &descr) ||
      !FindHeaderValue(header, "fortran_order", &fortran) ||
      !FindHeaderValue(header, "shape", &shape_text)) {
    return NpyError(path, "header lacks descr, fortran_order or shape");
  }
  if (fortran != "False") return NpyError(path, "Fortran-order arrays are not supported");
  descr = std::string(absl::StripSuffix(absl::StripPrefix(descr, "'"), "'"));
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
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "'"));
  out.write(kMagic, kMagicSize);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(array.data.data()), bytes);
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("failed writing '", path, "'"));
  return absl::OkStatus();
}

}  // namespace pebble
