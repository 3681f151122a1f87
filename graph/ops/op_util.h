// Internal to the operator table (graph/ops/): attribute readers, shape
// checks and the registration functions of each operator family. The public
// face is graph/ops.h; besides graph/ops/, only the runtime's kernels
// (runtime/cpu/, runtime/cuda/) include this file, for the attribute readers
// and window helpers, so that a kernel reads attrs exactly as shape
// inference does.
#ifndef PEBBLE_GRAPH_OPS_OP_UTIL_H_
#define PEBBLE_GRAPH_OPS_OP_UTIL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "graph/graph.h"
#include "graph/ops.h"
#include "nlohmann/json.hpp"

namespace pebble::ops_internal {

using Json = nlohmann::json;
using Inputs = absl::Span<const TensorType>;

// An InvalidArgument whose message is the concatenation of `parts`. The
// caller (NetBuilder) prefixes the node id and the op name.
template <typename... Args>
absl::Status Invalid(const Args&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// ---- Attributes. `attrs` may be null (no attributes) or an object; a
// missing attribute takes the default, a present one of the wrong JSON type
// is an error naming it. Nothing here throws.

absl::StatusOr<int64_t> IntAttr(const Json& attrs, absl::string_view name,
                                int64_t default_value);
absl::StatusOr<int64_t> RequiredIntAttr(const Json& attrs,
                                        absl::string_view name);
absl::StatusOr<bool> BoolAttr(const Json& attrs, absl::string_view name,
                              bool default_value);
absl::StatusOr<double> DoubleAttr(const Json& attrs, absl::string_view name,
                                  double default_value);
absl::StatusOr<std::string> StringAttr(const Json& attrs,
                                       absl::string_view name,
                                       absl::string_view default_value);
// A list of integers of any length (required).
absl::StatusOr<std::vector<int64_t>> IntListAttr(const Json& attrs,
                                                 absl::string_view name);
// One integer per spatial dimension: an integer (the same for each of the
// `dims` dimensions) or a list of `dims` integers. Absent: `default_value`
// repeated, or an error when `required`.
absl::StatusOr<std::vector<int64_t>> SpatialAttr(const Json& attrs,
                                                 absl::string_view name,
                                                 int dims, int64_t default_value,
                                                 bool required = false);
// A shape attribute (list of non-negative integers).
absl::StatusOr<Shape> ShapeAttr(const Json& attrs, absl::string_view name);
// A dtype attribute ("fp32", ...; ParseDType's spellings).
absl::StatusOr<DType> DTypeAttr(const Json& attrs, absl::string_view name,
                                DType default_value);
// A value that may be infinite: a finite number, or the string "inf" or
// "-inf" (JSON has no infinities): masked_fill's `value`, -inf for an
// attention mask.
absl::StatusOr<double> ExtendedDoubleAttr(const Json& attrs, absl::string_view name,
                                          double default_value);
// constant's values (Note [Constant data] in elementwise.cc): attr `data`,
// base64 (RFC 4648; absl's decoder, which also takes it unpadded and
// skips whitespace) of the elements of `type` in row-major order,
// each little-endian, as the bytes of the tensor; the decoded bytes, or
// InvalidArgument where they are not exactly the tensor's bytes or exceed
// kMaxConstantBytes.
inline constexpr int64_t kMaxConstantBytes = int64_t{16} << 20;
absl::StatusOr<std::string> ConstantData(const Json& attrs, const TensorType& type);
// random's attrs (Note [Random values] in runtime/kernel_math.h):
// `distribution` "normal" (a = `mean`, 0; b = `std`, 1) or "uniform" (a =
// `low`, 0; b = `high`, 1), `seed` (0); InvalidArgument for a std below 0,
// high below low or a value that is not finite.
struct RandomArgs {
  bool normal = true;
  double a = 0, b = 1;
  uint64_t seed = 0;
};
absl::StatusOr<RandomArgs> ParseRandom(const Json& attrs);
// compare's attr `op`, as its index in kCompareOps (the order of
// kmath::CompareOp in runtime/kernel_math.h).
inline constexpr const char* kCompareOps[] = {"eq", "ne", "lt", "le", "gt", "ge", "and", "or"};
absl::StatusOr<int> CompareOpAttr(const Json& attrs);

// ---- Tensor checks. `what` names the operand in messages ("input 0 (x)").

bool IsFloat(DType dtype);
absl::Status ExpectFloat(const TensorType& t, absl::string_view what);
absl::Status ExpectDType(const TensorType& t, DType dtype,
                         absl::string_view what);
absl::Status ExpectRank(const TensorType& t, int rank, absl::string_view what);
absl::Status ExpectRankAtLeast(const TensorType& t, int rank,
                               absl::string_view what);
absl::Status ExpectSameShape(const TensorType& a, absl::string_view what_a,
                             const TensorType& b, absl::string_view what_b);
absl::Status ExpectSameDType(const TensorType& a, absl::string_view what_a,
                             const TensorType& b, absl::string_view what_b);
absl::Status ExpectShape(const TensorType& t, const Shape& shape,
                         absl::string_view what);

// The dtype of the first floating-point input (the output dtype rule of
// docs/operators.md), or an error when none is.
absl::StatusOr<DType> FirstFloatDType(Inputs inputs);

// Normalises a possibly negative axis into [0, rank).
absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank,
                                  absl::string_view name);

// The largest kernel, stride, padding (and pad, scale) an attr may give:
// 2^40, beyond any tensor's extent, so that size arithmetic stays in int64.
inline constexpr int64_t kMaxWindowExtent = int64_t{1} << 40;

// upsample's geometry over the spatial dims (dims 2..) of an (N, C, ...)
// input, for the operator table and both backends: attr `scale` (an
// integer per spatial dim: out = in * scale), or attr `size` (the output's
// spatial dims) with an optional `scale_factor` (a number > 0 per dim:
// PyTorch's scale_factor, which sets the source step to 1 / scale_factor
// where a size alone sets it to in / out; Note [Upsample taps]); attrs
// `mode` (nearest, bilinear or bicubic for 4-D, trilinear for 5-D) and
// `align_corners` (interpolating modes only).
struct Upsampling {
  std::vector<int64_t> out;          // the output's spatial dims
  std::vector<double> scale_factor;  // per spatial dim; 0 where none was given
  std::string mode;
  bool align_corners = false;
};
absl::StatusOr<Upsampling> ParseUpsampling(const Json& attrs, const Shape& x);

// Output size of a sliding window along one dimension, PyTorch's floor mode:
// (in + 2 * padding - kernel) / stride + 1; with `ceil_mode` (pooling),
// PyTorch's ceil mode: the quotient rounded up, less one where the last
// window would start in the right padding (pooling_output_shape in ATen).
// Errors when the window does not fit or a parameter is out of range.
absl::StatusOr<int64_t> WindowOutput(int64_t in, int64_t kernel,
                                     int64_t stride, int64_t padding,
                                     int dim, bool ceil_mode = false);

// The attrs of a convolution beyond its window: `groups` (default 1; the
// channels split into that many independent convolutions, depthwise when it
// equals the input's channels) and `dilation` (one value per spatial dim,
// default 1: the kernel's taps that far apart).
struct ConvGroupsDilation {
  int64_t groups = 1;
  std::vector<int64_t> dilation;
};
absl::StatusOr<ConvGroupsDilation> ConvGroupsDilationAttrs(const Json& attrs,
                                                           int dims);
// The extent a kernel of `kernel` taps covers at `dilation`:
// dilation * (kernel - 1) + 1; an error beyond kMaxWindowExtent.
absl::StatusOr<int64_t> DilatedKernel(int64_t kernel, int64_t dilation,
                                      int dim);
// A sliding window over the spatial dims (dims 2..) of an (N, C, ...)
// tensor: the one reading of a pooling's or a convolution's attrs, for the
// operator table and for both backends. `dilation` empty means 1 in every
// dim (pooling); `groups` applies to convolutions alone, `ceil_mode` to
// pooling (max pooling alone, as the ops say).
struct Window {
  std::vector<int64_t> kernel, stride, padding, dilation;
  int64_t groups = 1;
  bool ceil_mode = false;
};
// Pooling: attrs kernel (required), stride (default: the kernel), padding
// (0; at most half the kernel, as PyTorch requires), ceil_mode (false).
absl::StatusOr<Window> PoolWindow(const Json& attrs, int dims);
// Convolution: the kernel given (the weight's spatial dims), attrs stride
// (1), padding (0), dilation and groups (ConvGroupsDilationAttrs).
absl::StatusOr<Window> ConvWindow(const Json& attrs, std::vector<int64_t> kernel, int dims);
// The output (N, out_channels, S'...) of `w` slid over x (N, C, S...):
// WindowOutput per spatial dim, on the dilated kernel. Errors name a rank
// that does not match the window's dims, and WindowOutput's faults.
absl::StatusOr<Shape> WindowShape(const Shape& x, int64_t out_channels, const Window& w);

// The channel checks of a grouped convolution with weight (O, I / groups,
// k...): `in_channels` and O both divisible by `groups`, the weight's
// second dim I / groups. `what` names the operand holding the input
// channels.
absl::Status CheckConvGroups(int64_t in_channels, const Shape& weight,
                             int64_t groups, absl::string_view what);

// How a broadcast operand of shape `small` is read over a tensor of shape
// `big` (NumPy rules, `small` left-padded with 1s): where the dims in which
// `small` is not 1 form one contiguous block [a, b) of `big`'s dims, element
// i of `big` meets element (i / inner) % block of `small`, with block = the
// product of big[a, b) and inner = the product of big[b, rank). Equal shapes
// give block = every element, inner = 1; `small` equal to big's trailing dims
// gives inner = 1; a (N, C, 1, 1) gate over (N, C, H, W) gives inner = H W.
struct BroadcastBlock {
  int64_t block = 1;
  int64_t inner = 1;
};
// nullopt where `small` does not broadcast to `big` that way (a dim that is
// neither 1 nor big's, a higher rank, or 1s between the dims it keeps).
std::optional<BroadcastBlock> BlockBroadcast(const Shape& big,
                                             const Shape& small);
// The NumPy broadcast of `a` and `b` in full (aligned on the trailing dims,
// each dim equal or 1): compare's result; nullopt where they do not.
std::optional<Shape> BroadcastShapes(const Shape& a, const Shape& b);

// The highest rank of compare's and masked_fill's broadcast operands
// (kmath::kMaxBroadcastRank in runtime/kernel_math.h; runtime/kernel.cc
// checks that they agree).
inline constexpr int kMaxBroadcastRank = 8;

// The highest rank transpose takes (the kernels' index maps are fixed-size).
inline constexpr int kMaxTransposeRank = 8;
// Whether `perm` holds each of 0 .. rank - 1 once.
bool IsPermutation(const std::vector<int64_t>& perm, size_t rank);
// Whether `perm` permutes the dims of `x` into `out` (transpose's kernels
// check what the operator table checked, before indexing with it).
bool PermutesInto(const Shape& x, const std::vector<int64_t>& perm,
                  const Shape& out);
// flip's attr `dims` (torch.flip's): distinct dims of a tensor of `rank`
// (at most kMaxTransposeRank), negative ones counted from the end, as a
// mask of the dims reversed.
absl::StatusOr<std::vector<bool>> FlipDims(const Json& attrs, int rank);

// Product of dims [begin, end) of `shape`.
int64_t Product(const Shape& shape, int begin, int end);
// The element count as a double, for FLOP formulas: never overflows, even
// on a shape the graph later refuses as too large.
double Elements(const Shape& shape);
double Elements(const TensorType& t);

// The FLOP count of ops that only move data: one per element written, so
// that no node is free to recompute (docs/operators.md, "FLOPs").
double CopyFlops(Inputs inputs, const TensorType& out, const Json& attrs);
// A FLOP formula of `per_element` FLOPs for every element of the output.
std::function<double(Inputs, const TensorType&, const Json&)> PerElement(double per_element);

// ---- The optimizer's updates (graph/optimizer.h): their hyper-parameters,
// as the operator table checks them and the kernels read them.
struct OptimizerAttrs {
  double lr = 0, weight_decay = 0;
  double momentum = 0;                           // sgd_*
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam_*
  bool decoupled_weight_decay = false;           // AdamW
};
// key=value in range: lr, eps and max_grad_norm above 0, weight_decay 0 or
// more, momentum and the betas in [0, 1). InvalidArgument names the key.
absl::Status CheckOptimizerValue(absl::string_view key, double value);
// The attrs of an update node (absent keys: 0, or Adam's defaults).
absl::StatusOr<OptimizerAttrs> ReadOptimizerAttrs(const Json& attrs);

// ---- Registration, one function per family (explicit calls from
// registry.cc: a static library drops files whose symbols nobody uses, so
// self-registering globals would silently vanish).
void RegisterElementwiseOps(std::vector<OpDef>& table);  // elementwise.cc
void RegisterConvPoolOps(std::vector<OpDef>& table);     // conv_pool.cc
void RegisterLinalgOps(std::vector<OpDef>& table);       // linalg.cc
void RegisterNormOps(std::vector<OpDef>& table);         // norm.cc
void RegisterShapeOps(std::vector<OpDef>& table);        // shape_ops.cc
void RegisterLossOps(std::vector<OpDef>& table);         // loss.cc
void RegisterOptimizerOps(std::vector<OpDef>& table);    // optimizer_ops.cc
void RegisterMaskOps(std::vector<OpDef>& table);         // mask_ops.cc

}  // namespace pebble::ops_internal

#endif  // PEBBLE_GRAPH_OPS_OP_UTIL_H_
