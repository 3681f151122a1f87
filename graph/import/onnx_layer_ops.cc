// ONNX convolution, pooling, normalization, matrix products, softmax, dropout,
// resize and pad as pebble operators (see onnx_ops.h and docs/import.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graph/import/onnx_context.h"
#include "graph/import/onnx_ops.h"
#include "graph/import/onnx_util.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "graph/text_input.h"

namespace pebble::onnx_import {
namespace {

// The window of a Conv or ConvTranspose of x by weight w (1-D to 3-D):
// pebble's convolution attrs (stride, padding; groups and dilation written
// only where they are not 1, as pebble's own models write them), already
// widened to 2-D for a 1-D one, and the ONNX values they came from.
struct OnnxConvWindow {
  int spatial = 0;
  std::vector<int64_t> strides, padding, dilations;
  Json attrs;
};

absl::StatusOr<OnnxConvWindow> ReadConvWindow(const onnx::NodeProto& node, const Attrs& attrs,
                                              const Shape& x, const Shape& w) {
  const auto rank = static_cast<int>(x.size());
  if (rank != 3 && rank != 4 && rank != 5) {
    return NodeError(node, absl::StrCat("only 1-D, 2-D and 3-D convolutions are supported; x is ",
                                        ShapeToString(x)));
  }
  OnnxConvWindow win;
  win.spatial = rank - 2;
  const int spatial = win.spatial;
  RETURN_IF_ERROR(OnlyNotSetAutoPad(attrs));
  ASSIGN_OR_RETURN(win.dilations, attrs.Ints("dilations", std::vector<int64_t>(spatial, 1)));
  if (static_cast<int>(win.dilations.size()) != spatial) {
    return attrs.Unsupported("dilations", absl::StrCat("[", absl::StrJoin(win.dilations, ","),
                                                       "] (one per spatial dim expected)"));
  }
  ASSIGN_OR_RETURN(int64_t group, attrs.Int("group", 1));
  ASSIGN_OR_RETURN(win.padding, SymmetricPads(attrs, node, spatial));
  ASSIGN_OR_RETURN(win.strides, attrs.Ints("strides", std::vector<int64_t>(spatial, 1)));
  if (static_cast<int>(win.strides.size()) != spatial) {
    return attrs.Unsupported("strides", absl::StrCat("[", absl::StrJoin(win.strides, ","),
                                                     "] (one per spatial dim expected)"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> kernel, attrs.Ints("kernel_shape", {}));
  if (!kernel.empty() && (static_cast<int>(w.size()) != rank ||
                          !std::equal(kernel.begin(), kernel.end(), w.begin() + 2))) {
    return NodeError(node, absl::StrCat("kernel_shape [", absl::StrJoin(kernel, ","),
                                        "] disagrees with the weight ", ShapeToString(w)));
  }
  // Groups and dilation the operator table checks (a one-line error
  // naming this node where they do not fit the shapes).
  const bool dilated =
      std::any_of(win.dilations.begin(), win.dilations.end(), [](int64_t v) { return v != 1; });
  const bool one_d = spatial == 1;
  win.attrs = {{"stride", one_d ? Widen(win.strides, 1) : win.strides},
               {"padding", one_d ? Widen(win.padding, 0) : win.padding}};
  if (group != 1) win.attrs["groups"] = group;
  if (dilated) win.attrs["dilation"] = one_d ? Widen(win.dilations, 1) : win.dilations;
  return win;
}

absl::Status Conv(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 3));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  const Attrs attrs(node);
  RETURN_IF_ERROR(
      attrs.OnlyKnown({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}));
  ASSIGN_OR_RETURN(OnnxConvWindow win, ReadConvWindow(node, attrs, cx.nb().type(in[0]).shape,
                                                      cx.nb().type(in[1]).shape));
  if (win.spatial > 1) {
    return cx.Apply(node, win.spatial == 2 ? "conv2d" : "conv3d", in, win.attrs);
  }
  // 1-D: x (N, C, L) and the weight (O, C/g, k) as 2-D of height 1.
  return cx.ApplyAs2d(node, "conv2d", in, 2, win.attrs);
}

// ConvTranspose (nn.ConvTranspose1d/2d/3d) of x (N, C_in, S...) by the
// weight (C_in, C_out / group, k...): pebble's convolution data gradient
// of x by that weight (a transposed convolution is one; its own gradients
// are a convolution and a weight gradient, graph/ops/conv_pool.cc), whose
// input_shape is the output's: S_out = (S - 1) stride - 2 pad +
// dilation (k - 1) + output_padding + 1. A 1-D one runs as 2-D of height
// 1 between reshapes; the bias is a broadcast add of it viewed as
// (C_out, 1, ...).
absl::Status ConvTranspose(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 3));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"auto_pad", "dilations", "group", "kernel_shape", "pads",
                                   "strides", "output_padding", "output_shape"}));
  if (attrs.has("output_shape")) {
    return attrs.Unsupported("output_shape", "(given)",
                             "torch.onnx.export writes output_padding instead");
  }
  const Shape x = cx.nb().type(in[0]).shape;
  const Shape w = cx.nb().type(in[1]).shape;
  ASSIGN_OR_RETURN(OnnxConvWindow win, ReadConvWindow(node, attrs, x, w));
  const int spatial = win.spatial;
  if (static_cast<int>(w.size()) != spatial + 2 || w[0] != x[1]) {
    return NodeError(node, absl::StrCat("the weight ", ShapeToString(w), " does not fit x ",
                                        ShapeToString(x), " (ConvTranspose takes (C_in, "
                                        "C_out / group, k...) with C_in = x's channels)"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> output_padding,
                   attrs.Ints("output_padding", std::vector<int64_t>(spatial, 0)));
  if (static_cast<int>(output_padding.size()) != spatial) {
    return attrs.Unsupported("output_padding",
                             absl::StrCat("[", absl::StrJoin(output_padding, ","), "]"),
                             "one per spatial dim expected");
  }
  const int64_t group = win.attrs.value("groups", int64_t{1});
  Shape out = {x[0], w[1] * group};
  for (int d = 0; d < spatial; ++d) {
    const int64_t op = output_padding[d];
    if (op < 0 || op >= std::max(win.strides[d], win.dilations[d])) {
      return attrs.Unsupported(
          "output_padding", absl::StrCat("[", absl::StrJoin(output_padding, ","), "]"),
          "each must be at least 0 and less than the stride or the dilation, as PyTorch has it");
    }
    const int64_t size = (x[2 + d] - 1) * win.strides[d] - 2 * win.padding[d] +
                         win.dilations[d] * (w[2 + d] - 1) + op + 1;
    if (size < 1) {
      return NodeError(node, absl::StrCat("its output would have size ", size, " on spatial dim ",
                                          d, " (the padding exceeds what the kernel covers)"));
    }
    out.push_back(size);
  }
  const bool bias = in.size() == 3;
  const bool one_d = spatial == 1;
  const std::string op = spatial == 3 ? "conv3d_backward_data" : "conv2d_backward_data";
  Json op_attrs = win.attrs;
  op_attrs["input_shape"] = one_d ? WithUnitDim(out, 2) : out;
  Value xs = in[0], ws = in[1];
  if (one_d) {
    ASSIGN_OR_RETURN(xs, cx.Aux(node, "reshape", {xs}, {{"shape", WithUnitDim(x, 2)}}, "x2d"));
    ASSIGN_OR_RETURN(ws, cx.Aux(node, "reshape", {ws}, {{"shape", WithUnitDim(w, 2)}}, "w2d"));
  }
  ASSIGN_OR_RETURN(Value y, cx.Lowered(node, op, {xs, ws}, op_attrs,
                                       one_d || bias ? "transposed" : ""));
  if (one_d) {
    ASSIGN_OR_RETURN(y, cx.Lowered(node, "reshape", {y}, {{"shape", out}}, bias ? "y1d" : ""));
  }
  if (!bias) return cx.Define(node, y);
  Shape column(spatial + 1, 1);
  column[0] = out[1];
  ASSIGN_OR_RETURN(Value b, cx.Aux(node, "reshape", {in[2]}, {{"shape", column}}, "bias_column"));
  return cx.Apply(node, "add", {y, b});
}

absl::Status BatchNormalization(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 5, 5));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"epsilon", "momentum", "training_mode", "spatial"}));
  ASSIGN_OR_RETURN(int64_t training_mode, attrs.Int("training_mode", 0));
  // Before opset 14 a training-mode batch norm is told by its extra
  // outputs (the updated running statistics).
  const bool training = cx.opset() >= 14 ? training_mode != 0 : node.output_size() > 1;
  if (!training) {
    return NodeError(node,
                     "is in inference mode (running statistics); export the model "
                     "with training=torch.onnx.TrainingMode.TRAINING");
  }
  ASSIGN_OR_RETURN(double eps, attrs.Float("epsilon", 1e-5));
  ASSIGN_OR_RETURN(double momentum, attrs.Float("momentum", 0.9));
  std::vector<Value> in(5);
  for (int i : {0, 3, 4}) {
    ASSIGN_OR_RETURN(in[i], cx.Get(node, node.input(i)));
  }
  // nn.BatchNorm with affine=False exports its weight and bias as constant
  // ones and zeros: `fill`s of them, fp32 as the running statistics.
  for (int i : {1, 2}) {
    const double identity = i == 1 ? 1.0 : 0.0;
    const std::optional<Numbers> constant = cx.KnownNumbers(node.input(i));
    if (constant.has_value() && constant->dims == cx.nb().type(in[3]).shape &&
        std::all_of(constant->values.begin(), constant->values.end(),
                    [identity](double v) { return v == identity; })) {
      ASSIGN_OR_RETURN(in[i], cx.Fill(node, constant->dims, in[3], identity,
                                      i == 1 ? "unit_weight" : "zero_bias"));
    } else {
      ASSIGN_OR_RETURN(in[i], cx.Get(node, node.input(i)));
    }
  }
  // The running statistics are the model's buffers, which the step updates
  // in place (a training-mode batch norm normalizes by the batch's own; with
  // track_running_stats=False the export computes them from x, unused).
  // nn.InstanceNorm with track_running_stats=True exports its buffers tiled
  // over the batch (and averages the update back), which would make them
  // trainable tensors here: refused.
  for (int i : {3, 4}) {
    // Back through the copies (Expand, Tile, views) to an initializer.
    std::string source = node.input(i);
    static const auto* const kCopies = new std::set<std::string>{
        "Expand", "Tile", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten"};
    for (const onnx::NodeProto* p = cx.Producer(source);
         p != nullptr && kCopies->contains(p->op_type()) && p->input_size() > 0;
         p = cx.Producer(source)) {
      source = p->input(0);
    }
    if (source != node.input(i) && cx.IsInitializer(source)) {
      return NodeError(node, absl::StrCat(
          "its running statistics (input ", i, ", ", Quote(node.input(i)), ") are ",
          Quote(source), " tiled, as nn.InstanceNorm with "
          "track_running_stats=True exports its buffers, which would import as trainable "
          "tensors; use track_running_stats=False, or train the module with pebble.torch "
          "(docs/torch.md)"));
    }
  }
  // ONNX's momentum weighs the old running value; PyTorch's the new one.
  const Json a = {{"eps", eps}, {"momentum", 1.0 - momentum}};
  // The statistics node names the running statistics it updates in
  // PyTorch (pebble.torch updates them; pebble's executors do not).
  Json stats_attrs = a;
  stats_attrs["running_mean"] = cx.nb().id(in[3]);
  stats_attrs["running_var"] = cx.nb().id(in[4]);
  ASSIGN_OR_RETURN(Value stats,
                   cx.Aux(node, "batchnorm_stats", {in[0]}, std::move(stats_attrs), "stats"));
  RETURN_IF_ERROR(cx.Apply(node, "batchnorm", {in[0], stats, in[1], in[2]}, a));
  // The updated running statistics (outputs 1 and 2) are the buffers'
  // in-place update in PyTorch: nothing reads them in a training step.
  for (int i = 1; i < node.output_size(); ++i) {
    if (!node.output(i).empty()) cx.MarkUnreadable(node.output(i));
  }
  return absl::OkStatus();
}

// PyTorch exports avg_pool(padding=p, ceil_mode=True) counting the padding
// (count_include_pad=True, its default) as a symmetric Pad of zeros and an
// AveragePool without padding, whose ceil mode can give one window more
// than PyTorch's (which drops a last window starting in the right
// padding). The file cannot tell that from a user's own F.pad before a
// pool, whose step it is: a note says which it computes.
void NoteCeilModeAfterAPad(ImportContext& cx, const onnx::NodeProto& node, const Shape& x,
                           const std::vector<int64_t>& kernel,
                           const std::vector<int64_t>& strides) {
  const onnx::NodeProto* pad = cx.Producer(node.input(0));
  if (pad == nullptr || pad->op_type() != "Pad" || pad->input_size() < 2) return;
  const std::optional<Ints> pads = cx.KnownInts(pad->input(1));
  const auto rank = static_cast<int64_t>(x.size());
  if (!pads.has_value() || static_cast<int64_t>(pads->values.size()) != 2 * rank) return;
  if (pad->input_size() > 2 && !pad->input(2).empty()) {
    const std::optional<Numbers> value = cx.KnownNumbers(pad->input(2));
    if (!value.has_value() || value->values.size() != 1 || value->values[0] != 0) return;
  }
  for (int64_t d = 2; d < rank; ++d) {
    const int64_t p = pads->values[d], k = kernel[d - 2], s = strides[d - 2];
    if (p != pads->values[d + rank]) return;  // not the exporter's
    const auto ceil_windows = [&](int64_t size, int64_t padding) {
      int64_t out = (size + 2 * padding - k + s - 1) / s + 1;
      if ((out - 1) * s >= size + padding) --out;
      return out;
    };
    const int64_t ours = ceil_windows(x[d], 0), theirs = ceil_windows(x[d] - 2 * p, p);
    if (ours != theirs) {
      cx.AddNote(absl::StrCat(
          NodeLabel(node), " after ", NodeLabel(*pad), " gives ", ours, " windows along dim ",
          d, " in ceil mode; if that Pad is PyTorch's export of avg_pool(padding=", p,
          ", ceil_mode=True) counting the padding, PyTorch's pool gives ", theirs,
          " and the file is not the model (count_include_pad=False exports as the model)"));
      return;
    }
  }
}

absl::Status Pool(ImportContext& cx, const onnx::NodeProto& node, absl::string_view op) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"auto_pad", "ceil_mode", "count_include_pad", "dilations",
                                   "kernel_shape", "pads", "storage_order", "strides"}));
  if (node.output_size() > 1) return NodeError(node, "the Indices output is not supported");
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  const Shape& x = cx.nb().type(in[0]).shape;
  const int spatial = static_cast<int>(x.size()) - 2;
  if (spatial != 1 && spatial != 2 && spatial != 3) {
    return NodeError(
        node, absl::StrCat("only 1-D, 2-D and 3-D pooling is supported; x is ", ShapeToString(x)));
  }
  RETURN_IF_ERROR(OnlyNotSetAutoPad(attrs));
  RETURN_IF_ERROR(AllOnes(attrs, "dilations", spatial));
  ASSIGN_OR_RETURN(int64_t storage_order, attrs.Int("storage_order", 0));
  if (storage_order != 0) return attrs.Unsupported("storage_order", "1");
  ASSIGN_OR_RETURN(std::vector<int64_t> kernel, attrs.Ints("kernel_shape", {}));
  if (static_cast<int>(kernel.size()) != spatial) {
    return NodeError(node, "attribute kernel_shape must give one size per spatial dim");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> padding, SymmetricPads(attrs, node, spatial));
  ASSIGN_OR_RETURN(std::vector<int64_t> strides,
                   attrs.Ints("strides", std::vector<int64_t>(spatial, 1)));
  if (static_cast<int>(strides.size()) != spatial) {
    return NodeError(node, "attribute strides must give one stride per spatial dim");
  }
  ASSIGN_OR_RETURN(int64_t ceil_mode, attrs.Int("ceil_mode", 0));
  bool ceil_differs = false;  // whether ceil mode gives a larger output
  for (int d = 0; d < spatial; ++d) {
    if (strides[d] <= 0) return NodeError(node, "attribute strides must be positive");
    // PyTorch's pooling_output_shape: one more window in ceil mode where
    // the span does not divide, unless that window would start in the
    // right padding.
    const int64_t span = x[d + 2] + 2 * padding[d] - kernel[d];
    ceil_differs |= span >= 0 && span % strides[d] != 0 &&
                    (span / strides[d] + 1) * strides[d] < x[d + 2] + padding[d];
  }
  const bool ceil_attr = ceil_mode != 0 && ceil_differs;
  if (op == "avgpool" && ceil_attr) NoteCeilModeAfterAPad(cx, node, x, kernel, strides);
  Json pool_attrs = {{"kernel", kernel}, {"stride", strides}, {"padding", padding}};
  if (ceil_attr) pool_attrs["ceil_mode"] = true;
  if (op == "avgpool") {
    // ONNX's count_include_pad defaults to 0, PyTorch's to True (it writes
    // 1). Without padding both divide by the window's elements within the
    // input, in ceil mode too; with padding and ceil mode, PyTorch's
    // divisor counting it is not reproduced.
    ASSIGN_OR_RETURN(int64_t include_pad, attrs.Int("count_include_pad", 0));
    const bool padded =
        std::any_of(padding.begin(), padding.end(), [](int64_t p) { return p != 0; });
    if (ceil_attr && padded && include_pad != 0) {
      return attrs.Unsupported("ceil_mode", "1",
                               "with count_include_pad=1 and padding it gives a larger output "
                               "than floor mode, whose last windows PyTorch divides by a count "
                               "pebble does not reproduce");
    }
    if ((padded && include_pad == 0) || ceil_attr) pool_attrs["count_include_pad"] = false;
  }
  if (spatial > 1) return cx.Apply(node, op, in, pool_attrs);
  // 1-D: pooled as 2-D of height 1.
  pool_attrs["kernel"] = Widen(kernel, 1);
  pool_attrs["stride"] = Widen(strides, 1);
  pool_attrs["padding"] = Widen(padding, 0);
  return cx.ApplyAs2d(node, op, in, 1, pool_attrs);
}

// GlobalMaxPool (nn.AdaptiveMaxPool1d/2d/3d(1)): max pooling with one
// window over every spatial dim, which PyTorch's backward also pays to the
// window's first maximum; 1-D as 2-D of height 1.
absl::Status GlobalMaxPool(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  const Shape& x = cx.nb().type(in[0]).shape;
  if (x.size() < 3 || x.size() > 5) {
    return NodeError(node, absl::StrCat("input of shape ", ShapeToString(x),
                                        "; GlobalMaxPool takes (N, C, D1, ...) of 1 to 3 "
                                        "spatial dims"));
  }
  std::vector<int64_t> window(x.begin() + 2, x.end());
  if (x.size() == 3) window = Widen(window, 1);
  const Json attrs = {{"kernel", window}, {"stride", window},
                      {"padding", std::vector<int64_t>(window.size(), 0)}};
  if (x.size() == 3) return cx.ApplyAs2d(node, "maxpool", in, 1, attrs);
  return cx.Apply(node, "maxpool", in, attrs);
}

absl::Status GlobalAveragePool(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  // (N, C, 1, ...): adaptive pooling to size 1 keeps ONNX's rank.
  return cx.Apply(node, "adaptive_avgpool", in, {{"output_size", 1}});
}

enum class Reduction { kMean, kSum, kMax, kMin, kL2 };

// The 2-norm of `rows` (kept..., R) over its last dim, (kept..., 1), the
// node's own where `last`: sqrt of the sum of squares, where a sum of 0
// takes the root of 1 in its place and the norm is then set to 0, so that
// its gradient there is 0, as PyTorch's norm backward makes it (sqrt's
// would be 0 / 0).
absl::StatusOr<Value> L2Rows(ImportContext& cx, const onnx::NodeProto& node, Value rows,
                             bool last) {
  const int64_t count = cx.nb().type(rows).shape.back();
  ASSIGN_OR_RETURN(Value squares, cx.Aux(node, "mul", {rows, rows}, Json::object(), "squares"));
  ASSIGN_OR_RETURN(Value ones, cx.Fill(node, {1, count}, rows, 1.0, "sum_row"));
  ASSIGN_OR_RETURN(Value sum, cx.Aux(node, "linear", {squares, ones}, Json::object(), "sum"));
  ASSIGN_OR_RETURN(Value zero, cx.Fill(node, {}, rows, 0.0, "zero"));
  ASSIGN_OR_RETURN(Value empty, cx.Aux(node, "compare", {sum, zero}, {{"op", "eq"}}, "empty"));
  ASSIGN_OR_RETURN(Value safe, cx.Aux(node, "masked_fill", {sum, empty}, {{"value", 1.0}},
                                      "safe"));
  ASSIGN_OR_RETURN(Value root, cx.Aux(node, "sqrt", {safe}, Json::object(), "root"));
  return cx.Lowered(node, "masked_fill", {root, empty}, {{"value", 0.0}}, last ? "" : "norm");
}

// The reduction of `rows`, (kept..., R), over its last dim to (kept..., 1)
// or straight to `result` where that is the output's shape: a `linear` by
// a `fill` row of 1/R (a mean) or of ones (a sum); a max, as a max pool
// with one window over (1, K, 1, R) (K the kept elements), which pays the
// gradient to the first maximum; a min, as the max of -x negated; a 2-norm
// (L2Rows).
absl::Status ReduceRows(ImportContext& cx, const onnx::NodeProto& node, Value rows,
                        Reduction kind, const std::vector<int64_t>& result) {
  const Shape shape = cx.nb().type(rows).shape;
  const int64_t count = shape.back();
  std::vector<int64_t> kept_ones(shape.begin(), shape.end() - 1);  // (kept..., 1)
  kept_ones.push_back(1);
  if (kind == Reduction::kL2) {
    const bool last = result == kept_ones;
    ASSIGN_OR_RETURN(Value norm, L2Rows(cx, node, rows, last));
    if (last) return cx.Define(node, norm);
    return cx.Apply(node, "reshape", {norm}, {{"shape", result}});
  }
  if (kind == Reduction::kMean || kind == Reduction::kSum) {
    const bool mean = kind == Reduction::kMean;
    ASSIGN_OR_RETURN(Value row, cx.Fill(node, {1, count}, rows,
                                        mean ? 1.0 / static_cast<double>(count) : 1.0,
                                        mean ? "mean_row" : "sum_row"));
    if (result == kept_ones) return cx.Apply(node, "linear", {rows, row});
    ASSIGN_OR_RETURN(Value reduction,
                     cx.Aux(node, "linear", {rows, row}, Json::object(), mean ? "mean" : "sum"));
    return cx.Apply(node, "reshape", {reduction}, {{"shape", result}});
  }
  const bool min = kind == Reduction::kMin;
  int64_t kept = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) kept *= shape[d];
  Value v = rows, minus_one;
  if (min) {
    ASSIGN_OR_RETURN(minus_one, cx.Fill(node, {}, v, -1.0, "minus_one"));
    ASSIGN_OR_RETURN(v, cx.Aux(node, "mul", {v, minus_one}, Json::object(), "negated"));
  }
  ASSIGN_OR_RETURN(v, cx.Aux(node, "reshape", {v}, {{"shape", {1, kept, 1, count}}}, "windows"));
  const Json window = {{"kernel", {1, count}}, {"stride", {1, count}}, {"padding", {0, 0}}};
  ASSIGN_OR_RETURN(v, cx.Aux(node, "maxpool", {v}, window, "max"));
  if (!min) return cx.Apply(node, "reshape", {v}, {{"shape", result}});
  ASSIGN_OR_RETURN(v, cx.Aux(node, "reshape", {v}, {{"shape", result}}, "max_viewed"));
  return cx.Apply(node, "mul", {v, minus_one});
}

// ReduceMean, ReduceSum, ReduceMax or ReduceMin of x over `axes` (none:
// every dim). A mean over every spatial dim (2 ..) of a 2-D or 3-D image is
// global average pooling, then without keepdims the (N, C) view. Any other
// reduction: the reduced dims moved last (a transpose, where they are not
// already), the tensor viewed as (kept..., R), reduced (ReduceRows), and
// viewed as ONNX's result shape.
absl::Status Reduce(ImportContext& cx, const onnx::NodeProto& node, const std::vector<int64_t>& axes,
                    int64_t keepdims, Reduction kind) {
  ASSIGN_OR_RETURN(Value x_value, cx.Get(node, node.input(0)));
  const std::vector<Value> in = {x_value};
  const Shape& x = cx.nb().type(in[0]).shape;
  const auto rank = static_cast<int64_t>(x.size());
  std::vector<bool> reduced(rank, axes.empty());
  const std::string all = absl::StrCat("axes [", absl::StrJoin(axes, ","), "]");
  for (int64_t a : axes) {
    ASSIGN_OR_RETURN(const int64_t d,
                     OnnxAxis(node, absl::StrCat("axis ", a, " of ", all), a, rank));
    if (reduced[d]) return NodeError(node, absl::StrCat(all, ": dim ", d, " is repeated"));
    reduced[d] = true;
  }
  std::vector<int64_t> result;  // ONNX's output shape
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[d]) {
      result.push_back(x[d]);
    } else if (keepdims != 0) {
      result.push_back(1);
    }
  }
  // adaptive_avgpool takes (N, C, H, W) and (N, C, D, H, W).
  const bool spatial = (rank == 4 || rank == 5) && !reduced[0] && !reduced[1] &&
                       std::all_of(reduced.begin() + 2, reduced.end(), std::identity());
  if (spatial && kind == Reduction::kMean) {
    if (keepdims != 0) return cx.Apply(node, "adaptive_avgpool", in, {{"output_size", 1}});
    ASSIGN_OR_RETURN(Value pooled,
                     cx.Aux(node, "adaptive_avgpool", in, {{"output_size", 1}}, "pool"));
    return cx.Apply(node, "reshape", {pooled}, {{"shape", result}});
  }
  // The permutation putting the reduced dims last, in order.
  std::vector<int64_t> perm, kept_dims;
  int64_t count = 1;  // R: the elements each reduction takes
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[d]) perm.push_back(d), kept_dims.push_back(x[d]);
  }
  for (int64_t d = 0; d < rank; ++d) {
    if (reduced[d]) perm.push_back(d), count *= x[d];
  }
  Value v = in[0];
  if (!std::is_sorted(perm.begin(), perm.end())) {
    ASSIGN_OR_RETURN(v, cx.Aux(node, "transpose", {v}, {{"perm", perm}}, "reduced_last"));
  }
  std::vector<int64_t> rows = kept_dims;  // (kept..., R)
  rows.push_back(count);
  if (Shape(rows.begin(), rows.end()) != cx.nb().type(v).shape) {
    ASSIGN_OR_RETURN(v, cx.Aux(node, "reshape", {v}, {{"shape", rows}}, "rows"));
  }
  return ReduceRows(cx, node, v, kind, result);
}

// ReduceMean, ReduceMax and ReduceMin (x.max(dim), torch.amax, x.max()):
// axes an attribute (an input only from opset 18, which pebble does not
// read). On exact ties a max's gradient goes to the first maximum, as
// x.max(dim)'s and a max pool's do; torch.amax and a full x.max() split it
// evenly between the tied elements (docs/import.md).
absl::Status ReduceOverAxesAttribute(ImportContext& cx, const onnx::NodeProto& node,
                                     Reduction kind) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axes", "keepdims"}));
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, attrs.Ints("axes", {}));
  ASSIGN_OR_RETURN(int64_t keepdims, attrs.Int("keepdims", 1));
  return Reduce(cx, node, axes, keepdims, kind);
}

// ReduceSum (x.sum(dim)): axes an attribute before opset 13, a constant
// input from it; no axes reduce every dim, or none with
// noop_with_empty_axes (the input itself).
absl::Status ReduceSum(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, cx.opset() >= 13 ? 2 : 1));
  const Attrs attrs(node);
  if (cx.opset() >= 13) {
    RETURN_IF_ERROR(attrs.OnlyKnown({"keepdims", "noop_with_empty_axes"}));
  } else {
    RETURN_IF_ERROR(attrs.OnlyKnown({"axes", "keepdims"}));
  }
  std::vector<int64_t> axes;
  if (cx.opset() < 13) {
    ASSIGN_OR_RETURN(axes, attrs.Ints("axes", {}));
  } else if (node.input_size() == 2 && !node.input(1).empty()) {
    ASSIGN_OR_RETURN(axes, cx.ConstInts(node, 1));
  }
  ASSIGN_OR_RETURN(int64_t keepdims, attrs.Int("keepdims", 1));
  ASSIGN_OR_RETURN(int64_t noop, attrs.Int("noop_with_empty_axes", 0));
  if (axes.empty() && noop != 0) {
    ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
    return cx.Define(node, x);
  }
  return Reduce(cx, node, axes, keepdims, Reduction::kSum);
}

absl::Status Gemm(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 3));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"alpha", "beta", "transA", "transB"}));
  ASSIGN_OR_RETURN(double alpha, attrs.Float("alpha", 1));
  ASSIGN_OR_RETURN(double beta, attrs.Float("beta", 1));
  ASSIGN_OR_RETURN(int64_t trans_a, attrs.Int("transA", 0));
  ASSIGN_OR_RETURN(int64_t trans_b, attrs.Int("transB", 0));
  if (alpha != 1) return attrs.Unsupported("alpha", absl::StrCat(alpha));
  if (beta != 1 && node.input_size() == 3) return attrs.Unsupported("beta", absl::StrCat(beta));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  if (cx.nb().type(in[0]).shape.size() != 2 || cx.nb().type(in[1]).shape.size() != 2) {
    return NodeError(node, "A and B must be matrices");
  }
  // pebble's linear takes x (M, K) and the weight (N, K), as nn.Linear
  // exports them (transB = 1); other layouts are transposed first.
  if (trans_a != 0) {
    ASSIGN_OR_RETURN(in[0], cx.Aux(node, "transpose", {in[0]}, {{"perm", {1, 0}}}, "a_t"));
  }
  if (trans_b == 0) {
    ASSIGN_OR_RETURN(in[1], cx.Aux(node, "transpose", {in[1]}, {{"perm", {1, 0}}}, "b_t"));
  }
  if (in.size() == 3 && cx.nb().type(in[2]).shape.size() != 1) {
    return NodeError(node, absl::StrCat("the bias C must be 1-D, is ",
                                        ShapeToString(cx.nb().type(in[2]).shape)));
  }
  return cx.Apply(node, "linear", in);
}

// MatMul: by a matrix B (K, N), pebble's linear of x (..., K) with the
// weight B transposed; of two tensors with the same batch dims, matmul.
absl::Status MatMul(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 2));
  RETURN_IF_ERROR(Attrs(node).OnlyKnown({}));
  ASSIGN_OR_RETURN(std::vector<Value> in, cx.Inputs(node));
  const Shape& a = cx.nb().type(in[0]).shape;
  const Shape& b = cx.nb().type(in[1]).shape;
  if (a.size() >= 2 && b.size() == 2) {
    ASSIGN_OR_RETURN(Value w, cx.Aux(node, "transpose", {in[1]}, {{"perm", {1, 0}}}, "b_t"));
    return cx.Apply(node, "linear", {in[0], w});
  }
  if (a.size() >= 3 && a.size() == b.size()) return cx.Apply(node, "matmul", in);
  return NodeError(node, absl::StrCat("MatMul of ", ShapeToString(a), " and ", ShapeToString(b),
                                      " is not supported (a matrix B, or equal ranks with the "
                                      "same batch dims)"));
}

// LayerNormalization (opset 17) over the dims from `axis` on (the last by
// default): layernorm_stats, then layernorm with the scale and bias. Without a bias (ONNX's optional third
// input), a zero one; without a scale (an empty name: PyTorch 1.13's export
// of nn.LayerNorm(elementwise_affine=False)), a scale of ones.
absl::Status LayerNormalization(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 3));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axis", "epsilon", "stash_type"}));
  if (node.input(0).empty()) return NodeError(node, "has no input X");
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const Shape shape = cx.nb().type(x).shape;
  const auto rank = static_cast<int64_t>(shape.size());
  ASSIGN_OR_RETURN(const int64_t axis, attrs.Int("axis", -1));
  ASSIGN_OR_RETURN(const int64_t dim, OnnxAxis(node, absl::StrCat("axis ", axis), axis, rank));
  ASSIGN_OR_RETURN(int64_t stash, attrs.Int("stash_type", 1));
  if (stash != 1) return attrs.Unsupported("stash_type", absl::StrCat(stash));
  ASSIGN_OR_RETURN(double eps, attrs.Float("epsilon", 1e-5));
  // Over the dims from `dim` on (nn.LayerNorm([C, H, W]) is axis -3): x
  // viewed with them as one last dim, and the scale and bias as vectors.
  const bool viewed = dim != rank - 1;
  int64_t features = 1;
  for (int64_t d = dim; d < rank; ++d) features *= shape[d];
  if (viewed) {
    std::vector<int64_t> rows(shape.begin(), shape.begin() + dim);
    rows.push_back(features);
    ASSIGN_OR_RETURN(x, cx.Aux(node, "reshape", {x}, {{"shape", rows}}, "rows"));
  }
  std::vector<Value> in = {x, Value(), Value(), Value()};
  for (int i : {1, 2}) {
    const char* what = i == 1 ? "scale" : "bias";
    if (i < node.input_size() && !node.input(i).empty()) {
      ASSIGN_OR_RETURN(in[i + 1], cx.Get(node, node.input(i)));
      if (viewed) {
        ASSIGN_OR_RETURN(in[i + 1], cx.Aux(node, "reshape", {in[i + 1]},
                                           {{"shape", {features}}}, absl::StrCat(what, "_row")));
      }
    } else {
      ASSIGN_OR_RETURN(in[i + 1], cx.Fill(node, {features}, x, i == 1 ? 1.0 : 0.0, what));
    }
  }
  const Json a = {{"eps", eps}};
  ASSIGN_OR_RETURN(in[1], cx.Aux(node, "layernorm_stats", {x}, a, "stats"));
  if (viewed) {
    ASSIGN_OR_RETURN(Value y, cx.Aux(node, "layernorm", in, a, "normalized"));
    RETURN_IF_ERROR(cx.Apply(node, "reshape", {y}, {{"shape", shape}}));
  } else {
    RETURN_IF_ERROR(cx.Apply(node, "layernorm", in, a));
  }
  // The saved mean and inverse deviation: nothing reads them in a step.
  for (int i = 1; i < node.output_size(); ++i) {
    if (!node.output(i).empty()) cx.MarkUnreadable(node.output(i));
  }
  return absl::OkStatus();
}

// Whether ONNX value `name` is a constant (not a parameter) whose every
// element is `value`.
bool ConstantOfValue(const ImportContext& cx, const std::string& name, double value) {
  const std::optional<Numbers> numbers = cx.KnownNumbers(name);
  return numbers && std::all_of(numbers->values.begin(), numbers->values.end(),
                                [value](double v) { return v == value; });
}

// InstanceNormalization of x (N, C, D1, ...): each (sample, channel)
// normalised over its other elements, then scaled and shifted per channel.
// nn.InstanceNorm1d/2d/3d without running statistics export as one with
// their parameters; nn.GroupNorm (before opset 18) as one over x viewed as
// (N, groups, -1) with a constant unit scale and zero bias, between two
// Reshapes, then its own affine. Lowered to a layer norm over the last dim
// of x viewed as (N, C, D1 x ...), the affine a broadcast mul and add by
// the scale and bias viewed as (C, 1) (left out where they are constant
// ones and zeros), and the result viewed back.
absl::Status InstanceNormalization(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 3, 3));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"epsilon"}));
  ASSIGN_OR_RETURN(double eps, attrs.Float("epsilon", 1e-5));
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const Shape shape = cx.nb().type(x).shape;
  if (shape.size() < 3) {
    return NodeError(node, absl::StrCat("input of shape ", ShapeToString(shape),
                                        "; InstanceNormalization takes (N, C, D1, ...)"));
  }
  int64_t per_channel = 1;
  for (size_t d = 2; d < shape.size(); ++d) per_channel *= shape[d];
  const Shape rows_shape = {shape[0], shape[1], per_channel};
  const bool viewed = shape.size() != 3;
  const bool affine = !(ConstantOfValue(cx, node.input(1), 1.0) &&
                        ConstantOfValue(cx, node.input(2), 0.0));
  Value rows = x;
  if (viewed) {
    ASSIGN_OR_RETURN(rows, cx.Aux(node, "reshape", {x}, {{"shape", rows_shape}}, "rows"));
  }
  const Json a = {{"eps", eps}};
  ASSIGN_OR_RETURN(Value stats, cx.Aux(node, "layernorm_stats", {rows}, a, "stats"));
  ASSIGN_OR_RETURN(Value y, cx.Lowered(node, "layernorm", {rows, stats}, a,
                                       viewed || affine ? "normalized" : ""));
  if (affine) {
    const Shape column = {shape[1], 1};
    for (int i : {1, 2}) {
      ASSIGN_OR_RETURN(Value p, cx.Get(node, node.input(i)));
      if (cx.nb().type(p).shape != Shape{shape[1]}) {
        return NodeError(node, absl::StrCat(i == 1 ? "scale " : "bias ", Quote(node.input(i)),
                                            " of shape ", ShapeToString(cx.nb().type(p).shape),
                                            "; expected (", shape[1], ")"));
      }
      ASSIGN_OR_RETURN(p, cx.Aux(node, "reshape", {p}, {{"shape", column}},
                                 i == 1 ? "scale_column" : "bias_column"));
      const bool last = i == 2 && !viewed;
      ASSIGN_OR_RETURN(y, cx.Lowered(node, i == 1 ? "mul" : "add", {y, p}, Json::object(),
                                     last ? "" : (i == 1 ? "scaled" : "shifted")));
    }
  }
  if (viewed) return cx.Apply(node, "reshape", {y}, {{"shape", shape}});
  return cx.Define(node, y);
}

// The operand of a Softmax or LogSoftmax, its rank, and its axis as given
// (ONNX's default: the last dim from opset 13, 1 before) and normalized.
struct SoftmaxOperand {
  std::vector<Value> in;
  int64_t rank, given, axis;
};
absl::StatusOr<SoftmaxOperand> ReadSoftmaxOperand(ImportContext& cx,
                                                  const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 1));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"axis"}));
  SoftmaxOperand s;
  ASSIGN_OR_RETURN(s.in, cx.Inputs(node));
  s.rank = static_cast<int64_t>(cx.nb().type(s.in[0]).shape.size());
  ASSIGN_OR_RETURN(s.given, attrs.Int("axis", cx.opset() >= 13 ? -1 : 1));
  ASSIGN_OR_RETURN(s.axis, OnnxAxis(node, absl::StrCat("axis ", s.given), s.given, s.rank));
  return s;
}

// `op` (softmax or log_softmax, over the last dim) of the operand over its
// `axis`: another dim is swapped with the last one, `op`, and swapped back.
absl::Status ApplySoftmaxOverAxis(ImportContext& cx, const onnx::NodeProto& node,
                                  const SoftmaxOperand& s, const std::string& op,
                                  const Json& attrs) {
  if (s.axis == s.rank - 1) return cx.Apply(node, op, s.in, attrs);
  // Before opset 13, axis 1 of a 2-D input is the last one as well; its
  // other axes flatten the dims after them, which is refused.
  if (cx.opset() < 13) {
    return Attrs(node).Unsupported("axis", absl::StrCat(s.given),
                                   "before opset 13, over the last dim only");
  }
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < s.rank; ++d) perm.push_back(d);
  std::swap(perm[s.axis], perm.back());
  ASSIGN_OR_RETURN(Value t, cx.Aux(node, "transpose", s.in, {{"perm", perm}}, "to_last"));
  ASSIGN_OR_RETURN(Value sm, cx.Aux(node, op, {t}, attrs, op));
  return cx.Apply(node, "transpose", {sm}, {{"perm", perm}});
}

// The sum of scores and a causal mask is the scores, softmaxed with `causal`
// (CausallyMaskedAdd).
absl::Status Softmax(ImportContext& cx, const onnx::NodeProto& node) {
  ASSIGN_OR_RETURN(const SoftmaxOperand s, ReadSoftmaxOperand(cx, node));
  Json causal = Json::object();
  if (s.axis == s.rank - 1 && cx.CausallyMasked(node.input(0))) causal["causal"] = true;
  return ApplySoftmaxOverAxis(cx, node, s, "softmax", causal);
}

// Why a LogSoftmax is not the model's last node over the classes (dim 1)
// under the cross-entropy loss, which then takes it in; empty when it is.
std::string WhyLossCannotTakeLogSoftmax(ImportContext& cx, const onnx::NodeProto& node,
                                        const SoftmaxOperand& s) {
  const std::string& out = node.output(0);
  if (cx.loss() != LossKind::kCrossEntropy) return "the loss is not cross-entropy";
  if (!cx.Reserved(out)) return "it is not the model's output";
  if (!cx.Readers(out).empty()) {
    return absl::StrCat("the model's output is read by ", NodeLabel(*cx.Readers(out).front()),
                        " too");
  }
  if (s.rank < 2 || s.axis != 1) {
    return absl::StrCat("it is over dim ", s.axis, " of a rank-", s.rank,
                        " tensor, not over the classes (dim 1)");
  }
  if (cx.opset() < 13 && s.rank > 2) {
    return "before opset 13 it is over dims 1 and after, flattened, not over the classes alone";
  }
  return "";
}

// LogSoftmax. As the model's last node, over the classes (dim 1), under the
// cross-entropy loss, the loss takes it in, and the node imports as its
// input. That is exact: log_softmax(log_softmax(x)) = log_softmax(x), so the
// cross-entropy of log-probabilities is that of the logits, and nn.NLLLoss
// of log_softmax(x) (PyTorch's MNIST example) is nn.CrossEntropyLoss of x.
// Anywhere else it is the log_softmax operator.
absl::Status LogSoftmax(ImportContext& cx, const onnx::NodeProto& node) {
  ASSIGN_OR_RETURN(const SoftmaxOperand s, ReadSoftmaxOperand(cx, node));
  const std::string why = WhyLossCannotTakeLogSoftmax(cx, node, s);
  if (why.empty()) {
    cx.NoteLossTakesLogSoftmax(NodeLabel(node));
    return cx.Define(node, s.in[0]);
  }
  if (cx.Reserved(node.output(0))) cx.NoteLogSoftmaxOutsideLoss(why);
  return ApplySoftmaxOverAxis(cx, node, s, "log_softmax", Json::object());
}

// RandomNormalLike and RandomUniformLike (torch.randn_like, torch.rand_like:
// a VAE's reparameterization noise) and RandomNormal, RandomUniform of a
// fixed shape: a `random` node of pebble's seeded noise (Note [Random
// values], runtime/kernel_math.h), not PyTorch's stream, as dropout's
// masks (docs/import.md); the file's own seed is not used.
absl::Status RandomNoise(ImportContext& cx, const onnx::NodeProto& node) {
  const bool like = absl::EndsWith(node.op_type(), "Like");
  const bool normal = absl::StartsWith(node.op_type(), "RandomNormal");
  RETURN_IF_ERROR(cx.ExpectInputs(node, like ? 1 : 0, like ? 1 : 0));
  const Attrs attrs(node);
  const absl::string_view a_name = normal ? "mean" : "low", b_name = normal ? "scale" : "high";
  RETURN_IF_ERROR(like ? attrs.OnlyKnown({"dtype", "seed", a_name, b_name})
                       : attrs.OnlyKnown({"dtype", "seed", "shape", a_name, b_name}));
  Shape shape;
  std::optional<DType> dtype;
  if (like) {
    ASSIGN_OR_RETURN(const Value x, cx.Get(node, node.input(0)));
    shape = cx.nb().type(x).shape;
    dtype = cx.nb().type(x).dtype;
  } else {
    ASSIGN_OR_RETURN(const std::vector<int64_t> dims, attrs.Ints("shape", {}));
    shape.assign(dims.begin(), dims.end());
  }
  if (attrs.has("dtype") || !dtype.has_value()) {
    ASSIGN_OR_RETURN(const int64_t type, attrs.Int("dtype", onnx::TensorProto::FLOAT));
    absl::StatusOr<DType> d = DTypeOfOnnx(static_cast<int>(type));
    if (!d.ok()) return NodeError(node, d.status().message());
    dtype = *d;
  }
  if (!ops_internal::IsFloat(*dtype)) {
    return NodeError(node, absl::StrCat("noise of type ", DTypeName(*dtype),
                                        " is not supported (of a float type it is)"));
  }
  Json args = {{"distribution", normal ? "normal" : "uniform"}};
  ASSIGN_OR_RETURN(const double a, attrs.Float(a_name, 0.0));
  ASSIGN_OR_RETURN(const double b, attrs.Float(b_name, 1.0));
  args[normal ? "mean" : "low"] = a;
  args[normal ? "std" : "high"] = b;
  const Value noise = cx.nb().Random(shape, *dtype, std::move(args), cx.NodeIdFor(node));
  if (!cx.nb().status().ok()) return NodeError(node, cx.nb().status().message());
  return cx.Define(node, noise);
}

absl::Status Dropout(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 3));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"seed", "ratio"}));
  double ratio = 0.5;
  // Before opset 12 Dropout has no training input; torch.onnx.export
  // writes one only in training mode (eval mode drops the node).
  bool training = cx.opset() < 12;
  if (node.input_size() >= 2 && !node.input(1).empty()) {
    const onnx::TensorProto* t = cx.ConstTensor(node.input(1));
    std::optional<double> r = t == nullptr ? std::nullopt : FloatScalar(*t);
    if (!r.has_value()) return NodeError(node, "the ratio must be a constant scalar");
    ratio = *r;
  } else {
    ASSIGN_OR_RETURN(ratio, attrs.Float("ratio", 0.5));
  }
  if (node.input_size() >= 3 && !node.input(2).empty()) {
    const onnx::TensorProto* t = cx.ConstTensor(node.input(2));
    std::optional<bool> b = t == nullptr ? std::nullopt : BoolScalar(*t);
    if (!b.has_value()) return NodeError(node, "training_mode must be a constant boolean");
    training = *b;
  }
  if (node.output_size() > 1 && !node.output(1).empty()) cx.MarkUnreadable(node.output(1));
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  if (!training || ratio == 0) return cx.Define(node, x);  // identity
  if (!(ratio > 0 && ratio < 1)) return attrs.Unsupported("ratio", absl::StrCat(ratio));
  // Seeded masks, not PyTorch's random stream (docs/import.md).
  return cx.Define(node, cx.nb().Dropout(x, ratio));
}

// The shortest decimal that a float32 scale rounds from (PyTorch's scale
// factor is a Python float, which the ONNX file holds as float32): 0.7 for
// 0.699999988.
double ShortestDecimal(double value) {
  const auto f = static_cast<float>(value);
  for (int digits = 1; digits < 9; ++digits) {
    const double candidate = std::strtod(absl::StrFormat("%.*g", digits, value).c_str(), nullptr);
    if (static_cast<float>(candidate) == f) return candidate;
  }
  return value;
}

// Resize of the spatial dims (nn.Upsample, F.interpolate with a
// scale_factor or a size): `upsample`. By whole factors, its `scale`;
// else its `size`, with `scale_factor` where ONNX has scales (PyTorch then
// steps its sources by 1 / scale_factor, and by in / out for a size).
// PyTorch's nearest is ONNX's asymmetric transform with floor; bilinear and
// trilinear are `linear` with half_pixel (align_corners=False) or
// align_corners, bicubic `cubic` with them and A = -0.75.
absl::Status Resize(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 1, 4));
  const Attrs attrs(node);
  RETURN_IF_ERROR(
      attrs.OnlyKnown({"coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                       "extrapolation_value", "mode", "nearest_mode"}));
  ASSIGN_OR_RETURN(std::string mode, attrs.String("mode", "nearest"));
  ASSIGN_OR_RETURN(std::string transform,
                   attrs.String("coordinate_transformation_mode", "half_pixel"));
  ASSIGN_OR_RETURN(std::string nearest_mode, attrs.String("nearest_mode", "round_prefer_floor"));
  ASSIGN_OR_RETURN(int64_t exclude_outside, attrs.Int("exclude_outside", 0));
  if (exclude_outside != 0) return attrs.Unsupported("exclude_outside", "1");
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const Shape shape = cx.nb().type(x).shape;
  const auto rank = static_cast<int64_t>(shape.size());
  if (rank != 4 && rank != 5) {
    return NodeError(node,
                     absl::StrCat("resizes ", ShapeToString(shape), " (only 4-D and 5-D tensors)"));
  }
  // Each dim's size, and its factor where ONNX gives scales (input 2) rather
  // than sizes (3): the output is floor(in * scale) in float32, as ONNX's,
  // and a note says where PyTorch's floor in double of the scale factor
  // the file rounds differs.
  std::vector<int64_t> sizes, pytorch_sizes;
  // The file's float32 scales, and PyTorch's scale factors, the doubles they
  // round (its step is float(1 / 1.1), not float(1 / 1.10000002), which for
  // nearest may pick another pixel).
  std::vector<double> factors, pytorch_factors;
  const onnx::TensorProto* scales =
      node.input_size() > 2 && !node.input(2).empty() ? cx.ConstTensor(node.input(2)) : nullptr;
  std::optional<std::vector<double>> scale_values =
      scales != nullptr ? FloatValues(*scales) : std::nullopt;
  if (scale_values && !scale_values->empty()) {
    factors = *scale_values;
    if (static_cast<int64_t>(factors.size()) != rank) {
      return NodeError(node, "scales do not match the input's rank");
    }
    for (int64_t d = 0; d < rank; ++d) {
      const double f = factors[d];
      if (!(f > 0) || f > 1024) {
        return NodeError(node, absl::StrCat("scale ", f, " of dim ", d,
                                            " is not supported (only in (0, 1024])"));
      }
      // In float32, as ONNX's shape inference and ONNX Runtime compute it.
      sizes.push_back(static_cast<int64_t>(
          std::floor(static_cast<float>(shape[d]) * static_cast<float>(f))));
      pytorch_factors.push_back(ShortestDecimal(f));
      pytorch_sizes.push_back(
          static_cast<int64_t>(std::floor(static_cast<double>(shape[d]) * pytorch_factors.back())));
    }
    if (pytorch_sizes != sizes) {
      cx.AddNote(absl::StrCat(
          NodeLabel(node), " resizes ", ShapeToString(shape), " to ", ShapeToString(sizes),
          " as ONNX computes it, from the float32 scales (", absl::StrJoin(factors, ", ",
          [](std::string* out, double f) { absl::StrAppendFormat(out, "%.9g", f); }),
          "); PyTorch computed ", ShapeToString(pytorch_sizes),
          " from the scale factors these round (give F.interpolate a size instead of a scale "
          "factor, and the file holds PyTorch's sizes)"));
    }
  } else if (node.input_size() > 3 && !node.input(3).empty()) {
    ASSIGN_OR_RETURN(sizes, cx.ConstInts(node, 3));
    if (static_cast<int64_t>(sizes.size()) != rank) {
      return NodeError(node, "sizes do not match the input's rank");
    }
  } else {
    return NodeError(node, "needs constant scales or sizes");
  }
  if (sizes[0] != shape[0] || sizes[1] != shape[1]) {
    return NodeError(node, "resizes the batch or channel dim (only spatial dims)");
  }
  bool whole = true;  // every dim by a whole factor, as `scale`
  std::vector<int64_t> scale, size;
  std::vector<double> scale_factor;
  for (int64_t d = 2; d < rank; ++d) {
    if (sizes[d] < 1) {
      return NodeError(node, absl::StrCat("resizes dim ", d, " of ", ShapeToString(shape),
                                          " to ", sizes[d], " elements"));
    }
    size.push_back(sizes[d]);
    const bool divides = sizes[d] % shape[d] == 0;
    const double f = pytorch_factors.empty() ? 0.0 : pytorch_factors[d];
    whole = whole && divides && (f == 0.0 || f == static_cast<double>(sizes[d] / shape[d]));
    scale.push_back(divides ? sizes[d] / shape[d] : 0);
    scale_factor.push_back(f);
  }
  Json a = whole ? Json{{"scale", scale}} : Json{{"size", size}};
  if (!whole && !pytorch_factors.empty()) a["scale_factor"] = scale_factor;
  if (mode == "nearest") {
    if (transform != "asymmetric" || nearest_mode != "floor") {
      return NodeError(node, absl::StrCat("nearest resize with coordinate_transformation_mode ",
                                          transform, " and nearest_mode ", nearest_mode,
                                          " (only PyTorch's: asymmetric, floor)"));
    }
    a["mode"] = "nearest";
  } else if (mode == "linear" || mode == "cubic") {
    if (transform == "align_corners") {
      a["align_corners"] = true;
    } else if (transform != "half_pixel" && transform != "pytorch_half_pixel") {
      return attrs.Unsupported("coordinate_transformation_mode", transform);
    }
    a["mode"] = rank == 4 ? "bilinear" : "trilinear";
    if (mode == "cubic") {
      // PyTorch's bicubic: Keys' kernel with A = -0.75, 2-D.
      ASSIGN_OR_RETURN(const double coeff, attrs.Float("cubic_coeff_a", -0.75));
      if (static_cast<float>(coeff) != -0.75f) {
        return attrs.Unsupported("cubic_coeff_a", absl::StrCat(coeff), "PyTorch's is -0.75");
      }
      if (rank != 4) return NodeError(node, "a cubic resize of a 5-D tensor is not supported");
      a["mode"] = "bicubic";
    }
  } else {
    return attrs.Unsupported("mode", mode);
  }
  return cx.Apply(node, "upsample", {x}, std::move(a));
}

absl::Status Pad(ImportContext& cx, const onnx::NodeProto& node) {
  RETURN_IF_ERROR(cx.ExpectInputs(node, 2, 3));
  const Attrs attrs(node);
  RETURN_IF_ERROR(attrs.OnlyKnown({"mode"}));
  ASSIGN_OR_RETURN(std::string mode, attrs.String("mode", "constant"));
  // nn.ReflectionPad and padding_mode="reflect" export reflect, nn.ReplicationPad
  // and "replicate" edge; a constant_value is read by mode constant only.
  if (mode == "edge") mode = "replicate";
  if (mode != "constant" && mode != "reflect" && mode != "replicate") {
    return attrs.Unsupported("mode", Quote(mode));
  }
  double value = 0;
  if (mode == "constant" && node.input_size() == 3 && !node.input(2).empty()) {
    const onnx::TensorProto* t = cx.ConstTensor(node.input(2));
    std::optional<double> v = t == nullptr ? std::nullopt : NumberScalar(*t);
    if (!v.has_value()) return NodeError(node, "constant_value must be a constant scalar");
    value = *v;
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> pads, cx.ConstInts(node, 1));
  ASSIGN_OR_RETURN(Value x, cx.Get(node, node.input(0)));
  const auto rank = static_cast<int64_t>(cx.nb().type(x).shape.size());
  if (static_cast<int64_t>(pads.size()) != 2 * rank) {
    return NodeError(node, absl::StrCat("pads has ", pads.size(), " values for rank ", rank));
  }
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) {
    return cx.Define(node, x);  // no padding (torch exports one before AvgPool)
  }
  // ONNX: [b_0 .. b_r-1, e_0 .. e_r-1]; F.pad: (b_last, e_last, ...).
  std::vector<int64_t> torch_pads;
  int64_t last = rank - 1;
  while (last >= 0 && pads[last] == 0 && pads[last + rank] == 0) --last;
  for (int64_t d = rank - 1; d >= 0 && d >= (last < 0 ? rank : 0); --d) {
    torch_pads.push_back(pads[d]);
    torch_pads.push_back(pads[d + rank]);
  }
  if (mode != "constant") return cx.Apply(node, "pad", {x}, {{"pads", torch_pads}, {"mode", mode}});
  return cx.Apply(node, "pad", {x}, {{"pads", torch_pads}, {"mode", "constant"}, {"value", value}});
}

}  // namespace

void AddLayerOps(OnnxHandlers& handlers) {
  handlers["Conv"] = Conv;
  handlers["ConvTranspose"] = ConvTranspose;
  handlers["BatchNormalization"] = BatchNormalization;
  for (const auto& ops : {std::pair{"MaxPool", "maxpool"}, {"AveragePool", "avgpool"}}) {
    handlers[ops.first] = [op = ops.second](ImportContext& cx, const onnx::NodeProto& node) {
      return Pool(cx, node, op);
    };
  }
  handlers["GlobalAveragePool"] = GlobalAveragePool;
  handlers["GlobalMaxPool"] = GlobalMaxPool;
  for (const auto& ops : {std::pair{"ReduceMean", Reduction::kMean},
                          {"ReduceMax", Reduction::kMax},
                          {"ReduceMin", Reduction::kMin},
                          {"ReduceL2", Reduction::kL2}}) {
    handlers[ops.first] = [kind = ops.second](ImportContext& cx, const onnx::NodeProto& node) {
      return ReduceOverAxesAttribute(cx, node, kind);
    };
  }
  handlers["ReduceSum"] = ReduceSum;
  handlers["Gemm"] = Gemm;
  handlers["MatMul"] = MatMul;
  handlers["LayerNormalization"] = LayerNormalization;
  handlers["InstanceNormalization"] = InstanceNormalization;
  handlers["Softmax"] = Softmax;
  handlers["LogSoftmax"] = LogSoftmax;
  handlers["Dropout"] = Dropout;
  for (const char* op : {"RandomNormalLike", "RandomUniformLike", "RandomNormal", "RandomUniform"}) {
    handlers[op] = RandomNoise;
  }
  handlers["Resize"] = Resize;
  handlers["Pad"] = Pad;
}

}  // namespace pebble::onnx_import
