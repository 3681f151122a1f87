// Internal to the ONNX importer (graph/import/): reading an ONNX node's
// attributes and constant tensors, with errors that name the node. The
// public face is onnx_import.h.
#ifndef PEBBLE_GRAPH_IMPORT_ONNX_UTIL_H_
#define PEBBLE_GRAPH_IMPORT_ONNX_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/text_input.h"
#include "onnx/onnx_pb.h"

namespace pebble::onnx_import {

absl::StatusOr<DType> DTypeOfOnnx(int elem_type);

// "ONNX node 'name' (op Conv)": its name, or its first output's where it has
// none.
std::string NodeLabel(const onnx::NodeProto& node);

// An InvalidArgument error naming `node` ("ONNX node 'name' (op Conv): ...").
// `what` may quote ids derived from the file's names (a graph builder's
// message): escaped, so that the error stays one line.
absl::Status NodeError(const onnx::NodeProto& node, absl::string_view what);
// An InvalidArgument error that IsOnnxOptionError (onnx_import.h) knows:
// an import option that does not fit the model. Its message starts with
// the option's name as the command line spells it without "--" ("frozen
// 'x' matches ..."), which the command line prefixes.
inline constexpr absl::string_view kOptionErrorPayload = "pebble.onnx.option";
absl::Status OptionError(absl::string_view message);

// The dim that `axis` of `node` names in an input of rank `rank`. ONNX counts
// a negative axis from the end, so -rank to rank - 1 are valid (to rank
// where `one_past_last`: Flatten's axis). Else an error naming the node, the
// axis as written (`what`: "axis -9", "axis 9 of axes [0,9]") and the rank.
absl::StatusOr<int64_t> OnnxAxis(const onnx::NodeProto& node, absl::string_view what, int64_t axis,
                                 int64_t rank, bool one_past_last = false);

// One ONNX node's attributes, read with their types checked.
class Attrs {
 public:
  explicit Attrs(const onnx::NodeProto& node) : node_(node) {
    for (const onnx::AttributeProto& a : node.attribute()) by_name_[a.name()] = &a;
  }
  bool has(absl::string_view name) const { return by_name_.contains(name); }

  absl::StatusOr<int64_t> Int(absl::string_view name, int64_t fallback) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::INT) return Wrong(name, "an integer");
    return a->i();
  }
  absl::StatusOr<double> Float(absl::string_view name, double fallback) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::FLOAT) return Wrong(name, "a float");
    return a->f();
  }
  absl::StatusOr<std::string> String(absl::string_view name, std::string fallback) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::STRING) return Wrong(name, "a string");
    return a->s();
  }
  absl::StatusOr<std::vector<int64_t>> Ints(absl::string_view name,
                                            std::vector<int64_t> fallback) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return fallback;
    if (a->type() != onnx::AttributeProto::INTS) return Wrong(name, "a list of integers");
    return std::vector<int64_t>(a->ints().begin(), a->ints().end());
  }
  // Every attribute not in `known` is an error: an attribute the importer
  // does not read could change the operator's meaning. The first such
  // attribute in the node's order is named.
  absl::Status OnlyKnown(std::initializer_list<absl::string_view> known) const {
    for (const onnx::AttributeProto& a : node_.attribute()) {
      if (std::find(known.begin(), known.end(), a.name()) == known.end()) {
        return NodeError(node_, absl::StrCat("attribute ", Quote(a.name()), " is not supported"));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Unsupported(absl::string_view name, absl::string_view value,
                           absl::string_view why = "") const {
    return NodeError(node_, absl::StrCat("attribute ", name, " = ", value, " is not supported",
                                         why.empty() ? "" : " (", why, why.empty() ? "" : ")"));
  }

 private:
  const onnx::AttributeProto* Find(absl::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }
  absl::Status Wrong(absl::string_view name, absl::string_view what) const {
    return NodeError(node_, absl::StrCat("attribute ", Quote(name), " must be ", what));
  }
  const onnx::NodeProto& node_;
  absl::flat_hash_map<std::string, const onnx::AttributeProto*> by_name_;
};

// The values of an integer tensor (initializer or Constant), for shapes,
// pads and axes.
absl::StatusOr<std::vector<int64_t>> IntValues(const onnx::TensorProto& t);
// Whether `data_type` is one of ONNX's float types that FloatValues reads
// (FLOAT, DOUBLE, FLOAT16, BFLOAT16).
bool IsFloatType(int data_type);
// Whether `data_type` is FLOAT16 or BFLOAT16, whose values ONNX stores as
// 16-bit patterns.
bool IsHalfType(int data_type);
// A FLOAT16 or BFLOAT16 `data_type`'s bits for `value`, rounded to float and
// then to that type (as an ONNX Cast from float rounds it), and the value
// that `bits` of that type hold (exact in a float).
uint16_t HalfBits(int data_type, double value);
float HalfValue(int data_type, uint16_t bits);
// A float, double, float16 or bfloat16 tensor's values (Resize's scales, a
// constant of a .half() model), when it is one of at most 2^20 elements.
std::optional<std::vector<double>> FloatValues(const onnx::TensorProto& t);
// InvalidArgument where tensor `t`'s stored values do not match its shape
// and type: raw_data of another length than its elements take, or a typed
// field (float_data, int32_data, ...) of another count; where it stores none
// at all, only with `require_values` (a Constant's value; an initializer's
// values may be the parameters', which a plan does not read). `what` names
// it ("initializer 'w'"). Types of no fixed size (strings) and external
// data pass.
absl::Status CheckStoredValues(const onnx::TensorProto& t, absl::string_view what,
                               bool require_values);
// A tensor of `dims` holding `values` (row-major): a float constant folded
// at import. Of `data_type` FLOAT16 or BFLOAT16 each value is rounded to
// float and then to that type (as an ONNX Cast from float rounds it);
// otherwise the tensor is FLOAT, each value rounded to float.
onnx::TensorProto FloatTensor(const Shape& dims, const std::vector<double>& values,
                              int data_type = onnx::TensorProto::FLOAT);
// A FLOAT, FLOAT16, BFLOAT16 (FloatTensor), BOOL (values 0 or not) or
// INT64 tensor of `dims` holding `values` (row-major); nullopt for another
// `data_type`. A constant of the
// same type as the one it was folded from.
std::optional<onnx::TensorProto> TypedTensor(int data_type, const Shape& dims,
                                             const std::vector<double>& values);
// A scalar float tensor's value (Dropout's ratio), when it is one.
std::optional<double> FloatScalar(const onnx::TensorProto& t);
// A one-value constant of a floating or an integer type, as a double (a
// bound, exponent or fill value that torch.onnx.export writes as an int64
// where the Python code gave an int: clamp(0, 6), x ** 2).
std::optional<double> NumberScalar(const onnx::TensorProto& t);
std::optional<bool> BoolScalar(const onnx::TensorProto& t);
// A BOOL tensor's values as 0 and 1 (at most 2^20 of them), or nullopt.
std::optional<std::vector<double>> BoolValues(const onnx::TensorProto& t);

// Symmetric ONNX pads [b_1..b_d, e_1..e_d] as one padding per spatial dim.
absl::StatusOr<std::vector<int64_t>> SymmetricPads(const Attrs& attrs, const onnx::NodeProto& node,
                                                   int spatial);
// auto_pad other than NOTSET is refused (explicit pads only).
absl::Status OnlyNotSetAutoPad(const Attrs& attrs);
// Attribute `name` (one value per spatial dim) must be all ones, its default.
absl::Status AllOnes(const Attrs& attrs, absl::string_view name, int spatial);

// The shape of `shape` with a dim of 1 put at `at`: a 1-D convolution or
// pooling runs as a 2-D one of height 1.
std::vector<int64_t> WithUnitDim(const Shape& shape, size_t at);
// 1-D window attrs as 2-D ones of height 1: `fill` (1 for strides and
// dilations, 0 for padding) put first.
std::vector<int64_t> Widen(std::vector<int64_t> v, int64_t fill);

}  // namespace pebble::onnx_import

#endif  // PEBBLE_GRAPH_IMPORT_ONNX_UTIL_H_
