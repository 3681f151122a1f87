// Reading ONNX nodes' attributes and constants (see onnx_util.h).
#include "graph/import/onnx_util.h"

#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_join.h"
#include "graph/half.h"
#include "graph/status.h"

namespace pebble::onnx_import {

std::string NodeLabel(const onnx::NodeProto& node) {
  const std::string& name =
      node.name().empty() && node.output_size() > 0 ? node.output(0) : node.name();
  return absl::StrCat("ONNX node ", Quote(name), " (op ", Printable(node.op_type()), ")");
}

namespace {

// Appends the elements of type T that `raw` holds (ONNX's raw_data: packed,
// little-endian) to `out`; false when `raw` is not a whole number of them.
template <typename T, typename Out>
bool DecodeRaw(const std::string& raw, std::vector<Out>& out) {
  if (raw.size() % sizeof(T) != 0) return false;
  for (size_t i = 0; i < raw.size(); i += sizeof(T)) {
    T x;
    std::memcpy(&x, raw.data() + i, sizeof(T));
    out.push_back(static_cast<Out>(x));
  }
  return true;
}

}  // namespace

absl::StatusOr<DType> DTypeOfOnnx(int elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::FLOAT: return DType::kFloat32;
    case onnx::TensorProto::FLOAT16: return DType::kFloat16;
    case onnx::TensorProto::BFLOAT16: return DType::kBFloat16;
    case onnx::TensorProto::INT64: return DType::kInt64;
    case onnx::TensorProto::UINT8: return DType::kUInt8;
    default: {
      // (the enum's name: DOUBLE, not "11"; pebble computes in the types above)
      const std::string name =
          onnx::TensorProto::DataType_IsValid(elem_type)
              ? onnx::TensorProto::DataType_Name(
                    static_cast<onnx::TensorProto::DataType>(elem_type))
              : absl::StrCat(elem_type);
      return absl::InvalidArgumentError(absl::StrCat(
          "ONNX element type ", name, " has no pebble dtype (pebble takes float, float16, "
          "bfloat16, int64 and uint8: export the model in float32)"));
    }
  }
}

absl::Status NodeError(const onnx::NodeProto& node, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(NodeLabel(node), ": ", Printable(what, 4000)));
}

absl::Status OptionError(absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kOptionErrorPayload, absl::Cord("1"));
  return status;
}

absl::StatusOr<int64_t> OnnxAxis(const onnx::NodeProto& node, absl::string_view what, int64_t axis,
                                 int64_t rank, bool one_past_last) {
  const int64_t last = one_past_last ? rank : rank - 1;
  if (axis < -rank || axis > last) {
    return NodeError(
        node, absl::StrCat(what, " is out of range for an input of rank ", rank,
                           last < 0 ? " (a scalar has no axis)"
                                    : absl::StrCat(" (", -rank, " to ", last, " are valid)")));
  }
  return axis < 0 ? axis + rank : axis;
}

absl::StatusOr<std::vector<int64_t>> IntValues(const onnx::TensorProto& t) {
  if (t.data_type() != onnx::TensorProto::INT64 && t.data_type() != onnx::TensorProto::INT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quote(t.name()), " is not an integer tensor"));
  }
  int64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 20) || (count *= std::max<int64_t>(d, 1)) > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("integer tensor ", Quote(t.name()), " is too large"));
    }
  }
  std::vector<int64_t> values;
  const bool int64 = t.data_type() == onnx::TensorProto::INT64;
  if (const std::string& raw = t.raw_data(); !raw.empty()) {
    if (!(int64 ? DecodeRaw<int64_t>(raw, values) : DecodeRaw<int32_t>(raw, values))) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quote(t.name()), ": raw data of ", raw.size(), " bytes"));
    }
  } else if (int64) {
    values.assign(t.int64_data().begin(), t.int64_data().end());
  } else {
    values.assign(t.int32_data().begin(), t.int32_data().end());
  }
  const int64_t expected = t.dims().empty() ? 1 : count;
  if (static_cast<int64_t>(values.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(t.name()), " holds ",
                                                   values.size(), " values for ", expected,
                                                   " elements"));
  }
  return values;
}

bool IsFloatType(int data_type) {
  return data_type == onnx::TensorProto::FLOAT || data_type == onnx::TensorProto::DOUBLE ||
         IsHalfType(data_type);
}

bool IsHalfType(int data_type) {
  return data_type == onnx::TensorProto::FLOAT16 || data_type == onnx::TensorProto::BFLOAT16;
}

uint16_t HalfBits(int data_type, double value) {
  const auto f = static_cast<float>(value);
  return data_type == onnx::TensorProto::FLOAT16 ? FloatToHalf(f) : FloatToBFloat16(f);
}

float HalfValue(int data_type, uint16_t bits) {
  return data_type == onnx::TensorProto::FLOAT16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
}

std::optional<std::vector<double>> FloatValues(const onnx::TensorProto& t) {
  int64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 20) || (count *= d) > (int64_t{1} << 20)) {
      return std::nullopt;
    }
  }
  const std::string& raw = t.raw_data();
  std::vector<double> values;
  bool decoded = true;
  if (t.data_type() == onnx::TensorProto::FLOAT) {
    if (raw.empty()) {
      values.assign(t.float_data().begin(), t.float_data().end());
    } else {
      decoded = DecodeRaw<float>(raw, values);
    }
  } else if (t.data_type() == onnx::TensorProto::DOUBLE) {
    if (raw.empty()) {
      values.assign(t.double_data().begin(), t.double_data().end());
    } else {
      decoded = DecodeRaw<double>(raw, values);
    }
  } else if (IsHalfType(t.data_type())) {
    // Bit patterns: packed in raw_data, or one in each int32_data (ONNX's
    // TensorProto); every value is exact in a double.
    std::vector<uint32_t> bits;
    if (raw.empty()) {
      bits.assign(t.int32_data().begin(), t.int32_data().end());
    } else {
      decoded = DecodeRaw<uint16_t>(raw, bits);
    }
    for (uint32_t b : bits) {
      if (b > 0xFFFF) return std::nullopt;
      values.push_back(HalfValue(t.data_type(), static_cast<uint16_t>(b)));
    }
  } else {
    return std::nullopt;
  }
  if (!decoded || static_cast<int64_t>(values.size()) != count) return std::nullopt;
  return values;
}

onnx::TensorProto FloatTensor(const Shape& dims, const std::vector<double>& values,
                              int data_type) {
  onnx::TensorProto t;
  for (int64_t d : dims) t.add_dims(d);
  if (IsHalfType(data_type)) {
    t.set_data_type(data_type);
    for (double v : values) t.add_int32_data(HalfBits(data_type, v));
    return t;
  }
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (double v : values) t.add_float_data(static_cast<float>(v));
  return t;
}

std::optional<onnx::TensorProto> TypedTensor(int data_type, const Shape& dims,
                                             const std::vector<double>& values) {
  if (data_type == onnx::TensorProto::FLOAT || IsHalfType(data_type)) {
    return FloatTensor(dims, values, data_type);
  }
  if (data_type != onnx::TensorProto::BOOL && data_type != onnx::TensorProto::INT64) {
    return std::nullopt;
  }
  onnx::TensorProto t;
  t.set_data_type(data_type);
  for (int64_t d : dims) t.add_dims(d);
  for (double v : values) {
    if (data_type == onnx::TensorProto::BOOL) {
      t.add_int32_data(v != 0);
    } else {
      t.add_int64_data(static_cast<int64_t>(v));
    }
  }
  return t;
}

std::optional<double> FloatScalar(const onnx::TensorProto& t) {
  std::optional<std::vector<double>> values = FloatValues(t);
  if (!values || values->size() != 1) return std::nullopt;
  return values->front();
}

std::optional<double> NumberScalar(const onnx::TensorProto& t) {
  if (std::optional<double> f = FloatScalar(t)) return f;
  absl::StatusOr<std::vector<int64_t>> ints = IntValues(t);
  if (!ints.ok() || ints->size() != 1) return std::nullopt;
  return static_cast<double>(ints->front());
}

std::optional<std::vector<double>> BoolValues(const onnx::TensorProto& t) {
  if (t.data_type() != onnx::TensorProto::BOOL) return std::nullopt;
  int64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 20) || (count *= d) > (int64_t{1} << 20)) {
      return std::nullopt;
    }
  }
  std::vector<double> values;
  if (!t.raw_data().empty()) {
    for (char c : t.raw_data()) values.push_back(c != 0 ? 1.0 : 0.0);
  } else {
    for (int32_t v : t.int32_data()) values.push_back(v != 0 ? 1.0 : 0.0);
  }
  if (static_cast<int64_t>(values.size()) != count) return std::nullopt;
  return values;
}

std::optional<bool> BoolScalar(const onnx::TensorProto& t) {
  if (t.data_type() != onnx::TensorProto::BOOL) return std::nullopt;
  if (t.raw_data().size() == 1) return t.raw_data()[0] != 0;
  if (t.int32_data_size() == 1) return t.int32_data(0) != 0;
  return std::nullopt;
}

absl::StatusOr<std::vector<int64_t>> SymmetricPads(const Attrs& attrs, const onnx::NodeProto& node,
                                                   int spatial) {
  ASSIGN_OR_RETURN(std::vector<int64_t> pads,
                   attrs.Ints("pads", std::vector<int64_t>(2 * spatial, 0)));
  if (static_cast<int>(pads.size()) != 2 * spatial) {
    return NodeError(node, absl::StrCat("attribute pads has ", pads.size(), " values for ", spatial,
                                        " spatial dims"));
  }
  std::vector<int64_t> padding(spatial);
  for (int d = 0; d < spatial; ++d) {
    if (pads[d] != pads[d + spatial]) {
      return attrs.Unsupported("pads", absl::StrCat("[", absl::StrJoin(pads, ","), "]"),
                               "asymmetric padding");
    }
    padding[d] = pads[d];
  }
  return padding;
}

absl::Status OnlyNotSetAutoPad(const Attrs& attrs) {
  ASSIGN_OR_RETURN(std::string auto_pad, attrs.String("auto_pad", "NOTSET"));
  if (auto_pad != "NOTSET") {
    return attrs.Unsupported("auto_pad", Quote(auto_pad), "give explicit pads");
  }
  return absl::OkStatus();
}

absl::Status AllOnes(const Attrs& attrs, absl::string_view name, int spatial) {
  ASSIGN_OR_RETURN(std::vector<int64_t> v, attrs.Ints(name, std::vector<int64_t>(spatial, 1)));
  for (int64_t x : v) {
    if (x != 1) {
      return attrs.Unsupported(name, absl::StrCat("[", absl::StrJoin(v, ","), "]"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Bytes per element of ONNX data type `type` in raw_data, and the field and
// count per element that holds its values otherwise; 0 bytes for a type of
// no fixed size.
struct StoredAs {
  int64_t bytes = 0;
  const char* field = "";
  int per_element = 1;
};

StoredAs StoredAsOf(int type) {
  using T = onnx::TensorProto;
  switch (type) {
    case T::FLOAT: return {4, "float_data"};
    case T::COMPLEX64: return {8, "float_data", 2};
    case T::DOUBLE: return {8, "double_data"};
    case T::COMPLEX128: return {16, "double_data", 2};
    case T::INT64: return {8, "int64_data"};
    case T::UINT32: return {4, "uint64_data"};
    case T::UINT64: return {8, "uint64_data"};
    case T::INT32: return {4, "int32_data"};
    case T::FLOAT16: case T::BFLOAT16: case T::INT16: case T::UINT16: return {2, "int32_data"};
    case T::INT8: case T::UINT8: case T::BOOL: return {1, "int32_data"};
    default: return {};
  }
}

int64_t TypedCount(const onnx::TensorProto& t, absl::string_view field) {
  if (field == "float_data") return t.float_data_size();
  if (field == "double_data") return t.double_data_size();
  if (field == "int64_data") return t.int64_data_size();
  if (field == "uint64_data") return t.uint64_data_size();
  return t.int32_data_size();
}

}  // namespace

absl::Status CheckStoredValues(const onnx::TensorProto& t, absl::string_view what,
                               bool require_values) {
  const StoredAs stored = StoredAsOf(t.data_type());
  if (stored.bytes == 0 || t.data_location() == onnx::TensorProto::EXTERNAL) {
    return absl::OkStatus();
  }
  int64_t elements = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || (d > 0 && elements > (int64_t{1} << 40) / d)) return absl::OkStatus();
    elements *= d;
  }
  const std::string type = onnx::TensorProto::DataType_Name(t.data_type());
  const std::string shape = ShapeToString(Shape(t.dims().begin(), t.dims().end()));
  if (!t.raw_data().empty()) {
    const int64_t want = elements * stored.bytes;
    if (static_cast<int64_t>(t.raw_data().size()) == want) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        what, " stores ", t.raw_data().size(), " bytes of raw_data, where shape ", shape,
        " of ", type, " takes ", want, ": the file is damaged"));
  }
  const int64_t count = TypedCount(t, stored.field);
  const int64_t want = elements * stored.per_element;
  if (count == want || (count == 0 && !require_values)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " stores ", count, " values in ", stored.field, ", where shape ", shape, " of ",
      type, " takes ", want, count == 0 ? " (and no raw_data)" : "", ": the file is damaged"));
}

std::vector<int64_t> WithUnitDim(const Shape& shape, size_t at) {
  std::vector<int64_t> out(shape.begin(), shape.end());
  out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), 1);
  return out;
}

std::vector<int64_t> Widen(std::vector<int64_t> v, int64_t fill) {
  v.insert(v.begin(), fill);
  return v;
}

}  // namespace pebble::onnx_import
