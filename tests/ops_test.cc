// The operator table and NetBuilder: shape and dtype inference, FLOPs on
// hand-computed cases, errors that name the op and the node.
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/autodiff.h"
#include "graph/net_builder.h"
#include "graph/ops.h"
#include "graph/ops/op_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pebble {
namespace {

using Json = nlohmann::json;

constexpr DType kF32 = DType::kFloat32;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kI64 = DType::kInt64;

TensorType T(Shape shape, DType dtype = kF32) { return {shape, dtype}; }

absl::StatusOr<TensorType> Infer(const std::string& op,
                                 std::vector<TensorType> in,
                                 Json attrs = Json::object()) {
  const OpDef* def = FindOp(op);
  if (def == nullptr) return absl::NotFoundError(op);
  return def->infer(in, attrs);
}

double Flops(const std::string& op, std::vector<TensorType> in,
             Json attrs = Json::object()) {
  const OpDef* def = FindOp(op);
  EXPECT_NE(def, nullptr) << op;
  absl::StatusOr<TensorType> out = def->infer(in, attrs);
  EXPECT_TRUE(out.ok()) << op << ": " << out.status();
  return out.ok() ? def->flops(in, *out, attrs) : -1;
}

// Expects `op` to infer `shape` and `dtype`.
void ExpectType(const std::string& op, std::vector<TensorType> in, Json attrs,
                const Shape& shape, DType dtype = kF32) {
  absl::StatusOr<TensorType> out = Infer(op, in, attrs);
  ASSERT_TRUE(out.ok()) << op << ": " << out.status();
  EXPECT_EQ(out->shape, shape) << op << " " << ShapeToString(out->shape);
  EXPECT_EQ(out->dtype, dtype) << op;
}

// Expects an InvalidArgument whose message contains `needle`.
void ExpectError(const std::string& op, std::vector<TensorType> in, Json attrs,
                 const std::string& needle) {
  absl::StatusOr<TensorType> out = Infer(op, in, attrs);
  ASSERT_FALSE(out.ok()) << op << " inferred " << ShapeToString(out->shape);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find(needle), std::string::npos)
      << out.status();
}

bool Contains(absl::string_view text, absl::string_view needle) {
  return text.find(needle) != absl::string_view::npos;
}

// ------------------------------------------------------------------ table

TEST(OpTableTest, RegistersTheVocabularySorted) {
  const std::vector<std::string> names = OpNames();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const char* op :
       {"conv2d", "conv3d", "linear", "matmul", "relu", "tanh", "sigmoid",
        "gelu", "add", "mul", "sum", "softmax", "batchnorm", "batchnorm_stats",
        "layernorm", "layernorm_stats", "maxpool", "avgpool",
        "global_avgpool", "adaptive_avgpool", "upsample", "pad", "concat",
        "flatten", "reshape", "dropout", "dropout_mask",
        "softmax_cross_entropy", "mse_loss", "embedding", "split_heads",
        "merge_heads", "arange", "conv3d_backward_data",
        "conv3d_backward_weight", "conv3d_backward_bias", "relu_backward",
        "maxpool_backward", "batchnorm_backward", "embedding_backward"}) {
    const OpDef* def = FindOp(op);
    ASSERT_NE(def, nullptr) << op;
    EXPECT_EQ(def->name, op);
    EXPECT_TRUE(def->infer && def->flops) << op;
  }
  EXPECT_EQ(FindOp("no_such_op"), nullptr);
  // Forward ops are differentiable, backward ops are not, but for a
  // convolution's data gradient: run forward, it is a transposed
  // convolution (ONNX's ConvTranspose imports as one).
  EXPECT_NE(FindOp("conv2d")->backward, nullptr);
  EXPECT_EQ(FindOp("conv2d_backward_weight")->backward, nullptr);
  EXPECT_EQ(FindOp("relu_backward")->backward, nullptr);
  EXPECT_NE(FindOp("conv2d_backward_data")->backward, nullptr);
  EXPECT_NE(FindOp("conv3d_backward_data")->backward, nullptr);
  EXPECT_EQ(FindOp("dropout_mask")->backward, nullptr);
}

// ------------------------------------------------------------ convolution

TEST(ConvTest, Conv2dShapeAndFlops) {
  const std::vector<TensorType> in = {T({2, 3, 32, 32}), T({16, 3, 3, 3}),
                                      T({16})};
  ExpectType("conv2d", in, {{"padding", 1}}, {2, 16, 32, 32});
  // 2 N O HW I k^2 = 2*2*16*1024*3*9 = 1,769,472, + bias N O HW = 32,768.
  EXPECT_DOUBLE_EQ(Flops("conv2d", in, {{"padding", 1}}), 1769472 + 32768);
  // (32 + 2 - 3) / 2 + 1 = 16.
  ExpectType("conv2d", in, {{"stride", 2}, {"padding", 1}}, {2, 16, 16, 16});
  // No padding, no bias: 30x30.
  ExpectType("conv2d", {in[0], in[1]}, Json::object(), {2, 16, 30, 30});
  EXPECT_DOUBLE_EQ(Flops("conv2d", {in[0], in[1]}), 2.0 * 2 * 16 * 900 * 27);
}

TEST(ConvTest, Conv3dShapeAndFlops) {
  const std::vector<TensorType> in = {T({1, 1, 8, 8, 8}), T({4, 1, 3, 3, 3}),
                                      T({4})};
  ExpectType("conv3d", in, {{"padding", 1}}, {1, 4, 8, 8, 8});
  // 2*1*4*512*1*27 = 110,592 plus 2,048 for the bias.
  EXPECT_DOUBLE_EQ(Flops("conv3d", in, {{"padding", 1}}), 110592 + 2048);
  // Per-dim lists are accepted.
  ExpectType("conv3d", in, {{"padding", {1, 0, 0}}, {"stride", {1, 2, 2}}},
             {1, 4, 8, 3, 3});
}

TEST(ConvTest, GroupsAndDilation) {
  // Depthwise: 8 groups of one channel; FLOPs count I / groups per output.
  ExpectType("conv2d", {T({2, 8, 16, 16}), T({8, 1, 3, 3})},
             {{"padding", 1}, {"groups", 8}}, {2, 8, 16, 16});
  EXPECT_DOUBLE_EQ(Flops("conv2d", {T({2, 8, 16, 16}), T({8, 1, 3, 3})},
                         {{"padding", 1}, {"groups", 8}}),
                   2.0 * 2 * 8 * 256 * 1 * 9);
  // Dilation 2 spans 5 taps: (16 + 2 - 5) + 1 = 14.
  ExpectType("conv2d", {T({1, 3, 16, 16}), T({4, 3, 3, 3})},
             {{"padding", 1}, {"dilation", 2}}, {1, 4, 14, 14});
  ExpectType("conv3d", {T({1, 4, 8, 8, 8}), T({6, 2, 3, 3, 3})},
             {{"padding", 2}, {"dilation", {2, 1, 2}}, {"groups", 2}},
             {1, 6, 8, 10, 8});
  ExpectError("conv2d", {T({2, 8, 8, 8}), T({6, 2, 3, 3})}, {{"groups", 3}},
              "divisible by groups = 3");
  ExpectError("conv2d", {T({2, 8, 8, 8}), T({8, 2, 3, 3})}, {{"groups", 2}},
              "expects 4 (2 per group");
  ExpectError("conv2d", {T({2, 8, 8, 8}), T({8, 1, 3, 3})}, {{"groups", 0}},
              "groups");
  ExpectError("conv2d", {T({2, 3, 8, 8}), T({4, 3, 3, 3})}, {{"dilation", 0}},
              "dilation");
  ExpectError("conv2d", {T({2, 3, 8, 8}), T({4, 3, 3, 3})},
              {{"dilation", int64_t{1} << 50}}, "dilation");
  ExpectError("conv2d", {T({2, 3, 8, 8}), T({4, 3, 3, 3})}, {{"dilation", 4}},
              "larger than the padded input");
  // The backward ops carry the attrs and agree with the forward.
  const Json attrs = {{"padding", 1}, {"groups", 4}, {"dilation", 1}};
  Json data = attrs;
  data["input_shape"] = {2, 8, 6, 6};
  ExpectType("conv2d_backward_data", {T({2, 4, 6, 6}), T({4, 2, 3, 3})}, data,
             {2, 8, 6, 6});
  Json weight = attrs;
  weight["kernel"] = {3, 3};
  ExpectType("conv2d_backward_weight", {T({2, 4, 6, 6}), T({2, 8, 6, 6})},
             weight, {4, 2, 3, 3});
  weight["groups"] = 3;
  ExpectError("conv2d_backward_weight", {T({2, 4, 6, 6}), T({2, 8, 6, 6})},
              weight, "groups = 3");
}

TEST(PoolTest, MaxPoolCeilModeFollowsPyTorch) {
  // in 6, kernel 3, stride 2: floor 2 windows, ceil 3.
  ExpectType("maxpool", {T({1, 2, 6, 6})}, {{"kernel", 3}, {"stride", 2}},
             {1, 2, 2, 2});
  ExpectType("maxpool", {T({1, 2, 6, 6})},
             {{"kernel", 3}, {"stride", 2}, {"ceil_mode", true}}, {1, 2, 3, 3});
  // in 5, kernel 2, stride 2, padding 1: a 4th window would start in the
  // right padding, so 3 (PyTorch's pooling_output_shape).
  ExpectType("maxpool", {T({1, 2, 5, 5})},
             {{"kernel", 2}, {"stride", 2}, {"padding", 1}, {"ceil_mode", true}},
             {1, 2, 3, 3});
  ExpectType("maxpool_backward", {T({1, 2, 3, 3}), T({1, 2, 6, 6})},
             {{"kernel", 3}, {"stride", 2}, {"ceil_mode", true}}, {1, 2, 6, 6});
  // Average pooling's ceil mode divides by the window's elements within the
  // input (count_include_pad false), the only ceil-mode divisor it takes.
  ExpectError("avgpool", {T({1, 2, 6, 6})},
              {{"kernel", 3}, {"stride", 2}, {"ceil_mode", true}}, "count_include_pad false");
  ExpectType("avgpool", {T({1, 2, 6, 6})},
             {{"kernel", 3}, {"stride", 2}, {"ceil_mode", true}, {"count_include_pad", false}},
             {1, 2, 3, 3});
  ExpectType("avgpool_backward", {T({1, 2, 3, 3})},
             {{"kernel", 3}, {"stride", 2}, {"ceil_mode", true}, {"count_include_pad", false},
              {"input_shape", {1, 2, 6, 6}}},
             {1, 2, 6, 6});
  ExpectError("avgpool", {T({1, 2, 6, 6})}, {{"kernel", 3}, {"count_include_pad", 0}},
              "must be a boolean");
  ExpectError("maxpool", {T({1, 2, 6, 6})}, {{"kernel", 3}, {"ceil_mode", "yes"}},
              "ceil_mode");
}

TEST(ConvTest, Errors) {
  ExpectError("conv2d", {T({2, 4, 8, 8}), T({16, 3, 3, 3})}, Json::object(),
              "channels");
  ExpectError("conv2d", {T({2, 3, 8}), T({16, 3, 3, 3})}, Json::object(),
              "rank 4");
  ExpectError("conv3d", {T({1, 1, 2, 2, 2}), T({4, 1, 3, 3, 3})},
              Json::object(), "larger than the padded input");
  ExpectError("conv2d", {T({2, 3, 8, 8}), T({16, 3, 3, 3}), T({8})},
              Json::object(), "bias");
  ExpectError("conv2d", {T({2, 3, 8, 8}), T({16, 3, 3, 3})},
              {{"stride", "two"}}, "attr 'stride'");
  ExpectError("conv2d", {T({2, 3, 8, 8}), T({16, 3, 3, 3}, kF16)},
              Json::object(), "dtype");
}

TEST(ConvTest, BackwardOpsCheckConsistency) {
  const Json attrs = {{"stride", {2, 2}},
                      {"padding", {1, 1}},
                      {"input_shape", {2, 3, 32, 32}}};
  ExpectType("conv2d_backward_data", {T({2, 16, 16, 16}), T({16, 3, 3, 3})},
             attrs, {2, 3, 32, 32});
  // Same cost as the forward product: 2 * 2*16*256 * 27.
  EXPECT_DOUBLE_EQ(Flops("conv2d_backward_data",
                         {T({2, 16, 16, 16}), T({16, 3, 3, 3})}, attrs),
                   2.0 * 2 * 16 * 256 * 27);
  ExpectError("conv2d_backward_data", {T({2, 16, 15, 16}), T({16, 3, 3, 3})},
              attrs, "grad");
  ExpectType("conv2d_backward_weight", {T({2, 16, 16, 16}), T({2, 3, 32, 32})},
             {{"stride", 2}, {"padding", 1}, {"kernel", 3}}, {16, 3, 3, 3});
  ExpectType("conv2d_backward_bias", {T({2, 16, 16, 16})}, Json::object(),
             {16});
}

// ------------------------------------------------------------ products

TEST(LinearTest, ShapeFlopsAndErrors) {
  ExpectType("linear", {T({4, 10}), T({5, 10}), T({5})}, Json::object(),
             {4, 5});
  // 2*4*5*10 + 4*5.
  EXPECT_DOUBLE_EQ(Flops("linear", {T({4, 10}), T({5, 10}), T({5})}), 420);
  ExpectType("linear", {T({2, 3, 10}), T({5, 10})}, Json::object(), {2, 3, 5});
  ExpectError("linear", {T({4, 9}), T({5, 10})}, Json::object(), "features");
  ExpectType("linear_backward_data", {T({2, 3, 5}), T({5, 10})},
             Json::object(), {2, 3, 10});
  ExpectType("linear_backward_weight", {T({2, 3, 5}), T({2, 3, 10})},
             Json::object(), {5, 10});
  EXPECT_DOUBLE_EQ(
      Flops("linear_backward_weight", {T({2, 3, 5}), T({2, 3, 10})}),
      2.0 * 6 * 5 * 10);
  ExpectType("linear_backward_bias", {T({2, 3, 5})}, Json::object(), {5});
}

TEST(MatmulTest, BatchedWithTransposes) {
  ExpectType("matmul", {T({2, 3, 4, 5}), T({2, 3, 5, 6})}, Json::object(),
             {2, 3, 4, 6});
  // 2 * batch 6 * 4 * 6 * 5.
  EXPECT_DOUBLE_EQ(Flops("matmul", {T({2, 3, 4, 5}), T({2, 3, 5, 6})}), 1440);
  ExpectType("matmul", {T({2, 3, 4, 5}), T({2, 3, 6, 5})},
             {{"transpose_b", true}}, {2, 3, 4, 6});
  ExpectType("matmul", {T({2, 3, 5, 4}), T({2, 3, 5, 6})},
             {{"transpose_a", true}, {"scale", 0.5}}, {2, 3, 4, 6});
  EXPECT_DOUBLE_EQ(Flops("matmul", {T({2, 3, 5, 4}), T({2, 3, 5, 6})},
                         {{"transpose_a", true}}),
                   1440);
  ExpectError("matmul", {T({2, 3, 4, 5}), T({2, 3, 4, 6})}, Json::object(),
              "inner dims");
  ExpectError("matmul", {T({2, 4, 5}), T({3, 5, 6})}, Json::object(),
              "batch dims");
}

TEST(AttentionOpsTest, SplitAndMergeHeads) {
  ExpectType("split_heads", {T({2, 7, 48})},
             {{"heads", 4}, {"chunks", 3}, {"index", 1}}, {2, 4, 7, 4});
  ExpectError("split_heads", {T({2, 7, 48})}, {{"heads", 5}, {"chunks", 3}},
              "does not split");
  ExpectError("split_heads", {T({2, 7, 48})},
              {{"heads", 4}, {"chunks", 3}, {"index", 3}}, "index");
  ExpectType("merge_heads", {T({2, 4, 7, 4})}, Json::object(), {2, 7, 16});
  ExpectType("merge_heads", {T({2, 4, 7, 4}), T({2, 4, 7, 4}), T({2, 4, 7, 4})},
             Json::object(), {2, 7, 48});
  ExpectType("split_heads_backward", {T({2, 4, 7, 4})},
             {{"chunks", 3}, {"index", 2}}, {2, 7, 48});
  ExpectType("softmax", {T({2, 4, 7, 7})}, {{"causal", true}}, {2, 4, 7, 7});
  EXPECT_DOUBLE_EQ(Flops("softmax", {T({2, 4, 7, 7})}), 5.0 * 392);
  ExpectError("softmax", {T({7})}, {{"causal", true}}, "rank >= 2");
  ExpectType("maximum", {T({2, 3}), T({2, 3})}, Json::object(), {2, 3});
  ExpectError("minimum", {T({2, 3}), T({3})}, Json::object(), "shape");
  ExpectType("maximum_backward", {T({2, 3}), T({2, 3}), T({2, 3})}, {{"input", 1}}, {2, 3});
  ExpectError("minimum_backward", {T({2, 3}), T({2, 3}), T({2, 3})}, {{"input", 2}},
              "must be 0 or 1");
  ExpectType("log_softmax", {T({2, 4, 7})}, Json::object(), {2, 4, 7});
  EXPECT_DOUBLE_EQ(Flops("log_softmax", {T({2, 4, 7})}), 5.0 * 56);
  ExpectError("log_softmax", {T({2, 7})}, {{"causal", true}}, "no attr 'causal'");
  ExpectError("log_softmax_backward", {T({2, 7}), T({2, 6})}, Json::object(), "y");
}

TEST(EmbeddingTest, LookUp) {
  ExpectType("embedding", {T({2, 7}, kI64), T({100, 16})}, Json::object(),
             {2, 7, 16});
  ExpectType("embedding", {T({2, 7}, kI64), T({100, 16}, kF16)},
             Json::object(), {2, 7, 16}, kF16);
  ExpectError("embedding", {T({2, 7}), T({100, 16})}, Json::object(),
              "indices");
  ExpectType("embedding_backward", {T({2, 7, 16}), T({2, 7}, kI64)},
             {{"num_embeddings", 100}}, {100, 16});
  // A FLOP count of a shape too large for any tensor (the graph refuses its
  // bytes afterwards) is a finite double, not an int64 overflow (fuzzed).
  const double huge = Flops("embedding_backward", {T({2, 7, 8}), T({2, 7}, kI64)},
                            {{"num_embeddings", int64_t{8355079725493122035}}});
  EXPECT_GT(huge, 6e19);
  EXPECT_TRUE(std::isfinite(huge));
  EXPECT_GT(Flops("conv2d", {T({1, 1, 1, 1}), T({1, 1, 1, 1})},
                  {{"padding", {int64_t{1} << 40, int64_t{1} << 40}}}),
            1e24);
  ExpectType("arange", {}, {{"n", 5}}, {5}, kI64);
}

// ------------------------------------------------------------ element-wise

// Attrs far beyond any tensor are errors, not overflows (a fuzzed graph
// reached signed overflow with a padding of 8e18).
TEST(OpTableTest, HugeWindowPadAndScaleAttrsAreRefused) {
  const Json huge = int64_t{8355289962797855731};
  ExpectError("conv2d", {T({1, 1, 4, 4}), T({1, 1, 3, 3})}, {{"padding", huge}}, "exceeds");
  ExpectError("maxpool", {T({1, 1, 4, 4})}, {{"kernel", 2}, {"stride", huge}}, "exceeds");
  ExpectError("maxpool", {T({1, 1, 4, 4})}, {{"kernel", 2}, {"padding", huge}}, "half the kernel");
  ExpectError("pad", {T({1, 1, 4, 4})}, {{"pads", {huge, huge}}}, "pads");
  ExpectError("upsample", {T({1, 1, 4, 4})}, {{"scale", huge}}, "scale");
  ExpectError("upsample", {T({1, 1, int64_t{1} << 30, 4})}, {{"scale", int64_t{1} << 40}},
              "overflows");
}

// cast: any dtype to any other, the shape kept; `dtype` required.
TEST(ElementwiseOpsTest, CastInfersAndRefuses) {
  ExpectType("cast", {T({2, 3}, DType::kUInt8)}, {{"dtype", "fp32"}}, {2, 3});
  ExpectType("cast", {T({4})}, {{"dtype", "fp16"}}, {4}, kF16);
  ExpectType("cast", {T({4}, kF16)}, {{"dtype", "i64"}}, {4}, kI64);
  ExpectType("cast", {T({4}, kI64)}, {{"dtype", "u8"}}, {4}, DType::kUInt8);
  EXPECT_DOUBLE_EQ(Flops("cast", {T({2, 3})}, {{"dtype", "bf16"}}), 6);
  ExpectError("cast", {T({4})}, Json::object(), "attr 'dtype' is required");
  ExpectError("cast", {T({4})}, {{"dtype", "fp32"}}, "the input's own");
  ExpectError("cast", {T({4})}, {{"dtype", "f64"}}, "dtype");
}

// compare: operands of one dtype broadcast in full into u8; masked_fill:
// a u8 mask broadcast over a float x, a value that may be infinite.
TEST(MaskOpsTest, CompareAndMaskedFillInferAndRefuse) {
  ExpectType("compare", {T({2, 1, 3}), T({4, 1})}, {{"op", "lt"}}, {2, 4, 3}, DType::kUInt8);
  ExpectType("compare", {T({5}, kI64), T({}, kI64)}, {{"op", "eq"}}, {5}, DType::kUInt8);
  ExpectType("compare", {T({5}, DType::kUInt8), T({5}, DType::kUInt8)}, {{"op", "and"}}, {5},
             DType::kUInt8);
  EXPECT_DOUBLE_EQ(Flops("compare", {T({2, 1, 3}), T({4, 1})}, {{"op", "ge"}}), 24);
  ExpectError("compare", {T({2, 3}), T({3, 2})}, {{"op", "eq"}}, "do not broadcast");
  ExpectError("compare", {T({2, 3}), T({2, 3}, kF16)}, {{"op", "eq"}}, "dtype");
  ExpectError("compare", {T({2}), T({2})}, {{"op", "xor"}}, "attr 'op'");
  ExpectError("compare", {T({2}), T({2})}, Json::object(), "attr 'op'");
  ExpectError("compare", {T(Shape(9, 1)), T({1})}, {{"op", "eq"}}, "rank");

  ExpectType("masked_fill", {T({2, 4, 3}, kF16), T({2, 1, 3}, DType::kUInt8)},
             {{"value", "-inf"}}, {2, 4, 3}, kF16);
  ExpectType("masked_fill", {T({2, 3}), T({}, DType::kUInt8)}, {{"value", 1.5}, {"invert", true}},
             {2, 3});
  EXPECT_DOUBLE_EQ(Flops("masked_fill", {T({2, 3}), T({3}, DType::kUInt8)}), 6);
  ExpectError("masked_fill", {T({2, 3}), T({2, 3}, DType::kUInt8)}, {{"value", "nan"}},
              "attr 'value'");
  ExpectError("masked_fill", {T({2, 3}), T({2, 3})}, Json::object(), "mask");
  ExpectError("masked_fill", {T({2, 3}, kI64), T({2, 3}, DType::kUInt8)}, Json::object(),
              "float");
  // fill: infinities for floats; integers within their dtype's range.
  ExpectType("fill", {}, {{"shape", Shape{2}}, {"value", "-inf"}}, {2});
  ExpectError("fill", {}, {{"shape", Shape{2}}, {"dtype", "i64"}, {"value", "-inf"}}, "range");
  ExpectError("fill", {}, {{"shape", Shape{2}}, {"dtype", "i64"}, {"value", 1e19}}, "range");
  ExpectType("fill", {}, {{"shape", Shape{2}}, {"dtype", "i64"}, {"value", 1.5}}, {2}, kI64);
  ExpectError("fill", {}, {{"shape", Shape{2}}, {"dtype", "u8"}, {"value", 256}}, "[0, 255]");
  ExpectError("fill", {}, {{"shape", Shape{2}}, {"dtype", "u8"}, {"value", -1}}, "[0, 255]");
  ExpectType("fill", {}, {{"shape", Shape{2}}, {"dtype", "u8"}, {"value", 255.5}}, {2},
             DType::kUInt8);
  // constant: base64 of exactly the tensor's bytes ("AACAPw==" is 1.0f).
  ExpectType("constant", {}, {{"shape", Shape{1}}, {"data", "AACAPw=="}}, {1});
  ExpectType("constant", {}, {{"shape", Shape{2}}, {"dtype", "u8"}, {"data", "AAE="}}, {2},
             DType::kUInt8);
  ExpectError("constant", {}, {{"shape", Shape{2}}, {"data", "AACAPw=="}}, "holds 4 bytes");
  ExpectError("constant", {}, {{"shape", Shape{1}}, {"data", "not base64!"}}, "not base64");
  ExpectError("constant", {}, {{"shape", Shape{1}}}, "'data' is required");
  ExpectError("constant", {}, {{"shape", Shape{1}}, {"data", 1.0}}, "base64 string");
  ExpectError("constant", {}, {{"shape", Shape{int64_t{1} << 30}}, {"data", ""}}, "at most");
  EXPECT_DOUBLE_EQ(Flops("constant", {}, {{"shape", Shape{2}}, {"dtype", "u8"}, {"data", "AAE="}}),
                   Flops("fill", {}, {{"shape", Shape{2}}, {"dtype", "u8"}}));
  // random: a float tensor of noise; its parameters checked.
  ExpectType("random", {}, {{"shape", Shape{2, 3}}, {"seed", 5}}, {2, 3});
  ExpectType("random", {}, {{"shape", Shape{2}}, {"dtype", "bf16"}, {"distribution", "uniform"},
                            {"low", -1.0}, {"high", 2.0}}, {2}, DType::kBFloat16);
  ExpectError("random", {}, {{"shape", Shape{2}}, {"dtype", "i64"}}, "float type");
  ExpectError("random", {}, {{"shape", Shape{2}}, {"std", -1.0}}, "below 0");
  ExpectError("random", {}, {{"shape", Shape{2}}, {"distribution", "uniform"}, {"low", 1.0},
                             {"high", 0.0}}, "below 'low'");
  ExpectError("random", {}, {{"shape", Shape{2}}, {"high", 2.0}}, "'high' is not one of a normal");
  ExpectError("random", {}, {{"shape", Shape{2}}, {"distribution", "gamma"}}, "normal or uniform");
  // The mask may not widen x: it broadcasts over x, not x over it.
  ExpectError("masked_fill", {T({3}), T({2, 3}, DType::kUInt8)}, Json::object(),
              "does not broadcast");
}

TEST(ElementwiseTest, ActivationsKeepTypeAndCountFlops) {
  for (const char* op : {"relu", "tanh", "sigmoid", "gelu"}) {
    ExpectType(op, {T({2, 3}, kF16)}, Json::object(), {2, 3}, kF16);
  }
  EXPECT_DOUBLE_EQ(Flops("relu", {T({2, 3})}), 6);
  EXPECT_DOUBLE_EQ(Flops("sigmoid", {T({2, 3})}), 18);
  EXPECT_DOUBLE_EQ(Flops("gelu", {T({2, 3})}), 30);
  EXPECT_DOUBLE_EQ(Flops("gelu", {T({2, 3})}, {{"approximate", "tanh"}}), 54);
  ExpectError("gelu", {T({2, 3})}, {{"approximate", "fast"}}, "approximate");
  ExpectError("relu", {T({2, 3}, kI64)}, Json::object(), "floating-point");
  for (const char* op : {"clip", "hardsigmoid", "hardswish", "leaky_relu"}) {
    ExpectType(op, {T({2, 3}, kF16)}, Json::object(), {2, 3}, kF16);
    ExpectType(std::string(op) + "_backward", {T({2, 3}), T({2, 3})}, Json::object(), {2, 3});
  }
  EXPECT_DOUBLE_EQ(Flops("clip", {T({2, 3})}, {{"min", 0}, {"max", 6}}), 12);
  EXPECT_DOUBLE_EQ(Flops("hardswish", {T({2, 3})}), 30);
  for (const char* op : {"abs", "exp", "log"}) {
    ExpectType(op, {T({2, 3}, kF16)}, Json::object(), {2, 3}, kF16);
    ExpectType(std::string(op) + "_backward", {T({2, 3}), T({2, 3})}, Json::object(), {2, 3});
    EXPECT_DOUBLE_EQ(Flops(op, {T({2, 3})}), 6) << op;
    ExpectError(op, {T({2, 3}, kI64)}, Json::object(), "float");
  }
  for (const char* op : {"elu", "softplus"}) {
    ExpectType(op, {T({2, 3}, DType::kBFloat16)}, Json::object(), {2, 3}, DType::kBFloat16);
    ExpectType(std::string(op) + "_backward", {T({2, 3}), T({2, 3})}, Json::object(), {2, 3});
    EXPECT_DOUBLE_EQ(Flops(op, {T({2, 3})}), 24) << op;
  }
  ExpectError("elu", {T({2, 3})}, {{"alpha", "1"}}, "'alpha' must be a finite number");
  ExpectError("elu_backward", {T({2, 3}), T({2, 3})}, {{"input_scale", HUGE_VAL}},
              "'input_scale' must be a finite number");
  ExpectError("softplus", {T({2, 3})}, {{"beta", 0}}, "'beta' must not be 0");
  ExpectError("softplus", {T({2, 3}, kI64)}, Json::object(), "float");
  ExpectType("erf", {T({2, 3}, kF16)}, Json::object(), {2, 3}, kF16);
  ExpectType("erf_backward", {T({2, 3}), T({2, 3})}, Json::object(), {2, 3});
  ExpectError("erf", {T({2, 3}, kI64)}, Json::object(), "float");
  ExpectType("sqrt", {T({2, 3})}, Json::object(), {2, 3});
  ExpectType("sqrt_backward", {T({2, 3}), T({2, 3})}, Json::object(), {2, 3});
  ExpectError("clip", {T({2, 3})}, {{"min", 6}, {"max", 0}}, "above");
  ExpectError("clip_backward", {T({2, 3}), T({2, 3})}, {{"min", "a"}}, "min");
  ExpectType("relu_backward", {T({2, 3}), T({2, 3})}, Json::object(), {2, 3});
  ExpectError("relu_backward", {T({2, 3}), T({3, 2})}, Json::object(),
              "same shape");
}

TEST(ElementwiseTest, AddAndMulBroadcastOneOperand) {
  ExpectType("add", {T({2, 3, 4}), T({2, 3, 4})}, Json::object(), {2, 3, 4});
  ExpectType("add", {T({2, 3, 4}), T({3, 4})}, Json::object(), {2, 3, 4});
  ExpectType("mul", {T({4}), T({2, 3, 4})}, Json::object(), {2, 3, 4});
  // A squeeze-excitation gate (N, C, 1, 1) and a per-channel (C, 1, 1).
  ExpectType("mul", {T({2, 8, 1, 1}), T({2, 8, 5, 5})}, Json::object(),
             {2, 8, 5, 5});
  ExpectType("add", {T({2, 8, 5, 5}), T({8, 1, 1})}, Json::object(),
             {2, 8, 5, 5});
  ExpectType("add", {T({2, 8, 5, 5}), T({1})}, Json::object(), {2, 8, 5, 5});
  // (2, 3) is not the trailing dims of (2, 3, 4), nor 1 where they differ.
  ExpectError("add", {T({2, 3, 4}), T({2, 3})}, Json::object(),
              "do not broadcast");
  // Both operands broadcast: the result is neither's shape.
  ExpectError("add", {T({2, 1}), T({1, 3})}, Json::object(), "do not broadcast");
  // Kept dims around a repeated one: (N, 1, W) over (N, C, W).
  ExpectError("mul", {T({2, 3, 4}), T({2, 1, 4})}, Json::object(),
              "contiguous");
  ExpectError("add", {T({2, 3}), T({2, 3}, kF16)}, Json::object(), "dtype");
  ExpectType("sub", {T({8, 1, 1}), T({2, 8, 5, 5})}, Json::object(), {2, 8, 5, 5});
  ExpectType("div", {T({2, 8, 5, 5}), T({5})}, Json::object(), {2, 8, 5, 5});
  ExpectError("div", {T({2, 3, 4}), T({2, 1, 4})}, Json::object(), "contiguous");
  ExpectType("sum_to", {T({2, 3, 4})}, {{"shape", {3, 4}}}, {3, 4});
  ExpectType("sum_to", {T({2, 8, 5, 5})}, {{"shape", {2, 8, 1, 1}}},
             {2, 8, 1, 1});
  ExpectType("sum_to", {T({2, 8, 5, 5})}, {{"shape", {8, 1, 1}}}, {8, 1, 1});
  ExpectError("sum_to", {T({2, 3, 4})}, {{"shape", {2, 3}}}, "broadcast");
}

TEST(ElementwiseTest, BlockBroadcastFindsTheBlockAndItsPeriod) {
  using ops_internal::BlockBroadcast;
  auto block = [](const Shape& big, const Shape& small) {
    auto b = BlockBroadcast(big, small);
    return b ? std::vector<int64_t>{b->block, b->inner} : std::vector<int64_t>{};
  };
  EXPECT_EQ(block({2, 3, 4}, {2, 3, 4}), (std::vector<int64_t>{24, 1}));
  EXPECT_EQ(block({2, 3, 4}, {3, 4}), (std::vector<int64_t>{12, 1}));
  EXPECT_EQ(block({2, 8, 5, 5}, {2, 8, 1, 1}), (std::vector<int64_t>{16, 25}));
  EXPECT_EQ(block({2, 8, 5, 5}, {8, 1, 1}), (std::vector<int64_t>{8, 25}));
  EXPECT_EQ(block({2, 8, 5, 5}, {1, 1}), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(block({2, 1, 5}, {2, 1, 1}), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(block({2, 3, 4}, {2, 1, 4}), std::vector<int64_t>{});
  EXPECT_EQ(block({2, 3, 4}, {3}), std::vector<int64_t>{});
  EXPECT_EQ(block({3}, {2, 3}), std::vector<int64_t>{});
}

TEST(ElementwiseTest, DropoutMaskIsOneBytePerElement) {
  ExpectType("dropout_mask", {T({2, 3}, kF16)}, {{"p", 0.5}, {"seed", 1}},
             {2, 3}, DType::kUInt8);
  ExpectType("dropout", {T({2, 3}, kF16), T({2, 3}, DType::kUInt8)},
             {{"p", 0.5}}, {2, 3}, kF16);
  ExpectError("dropout_mask", {T({2, 3})}, {{"p", 1.0}}, "[0, 1)");
  ExpectError("dropout", {T({2, 3}), T({2, 3})}, {{"p", 0.1}}, "mask");
}

// ------------------------------------------------------------ reductions

TEST(LossTest, ScalarsAreFp32) {
  ExpectType("sum", {T({10}, kF16)}, Json::object(), {}, kF32);
  ExpectType("sum_backward", {}, {{"shape", {10}}, {"dtype", "fp16"}}, {10},
             kF16);
  ExpectType("softmax_cross_entropy", {T({4, 10}, kF16), T({4}, kI64)},
             Json::object(), {}, kF32);
  // 4 per logit + 1 per target.
  EXPECT_DOUBLE_EQ(
      Flops("softmax_cross_entropy", {T({4, 10}), T({4}, kI64)}), 164);
  ExpectType("mse_loss", {T({2, 3}), T({2, 3})}, Json::object(), {}, kF32);
  ExpectError("mse_loss", {T({2, 3}), T({3, 2})}, Json::object(),
              "same shape");
  ExpectType("bce_with_logits", {T({4}), T({4})}, Json::object(), {}, kF32);
  EXPECT_DOUBLE_EQ(Flops("bce_with_logits", {T({4, 3}), T({4, 3})}), 96);
  ExpectError("bce_with_logits", {T({4}), T({4}, kI64)}, Json::object(), "dtype");
  ExpectType("bce_with_logits_backward", {T({4, 3}), T({4, 3})}, Json::object(), {4, 3});
}

TEST(LossTest, CrossEntropyClassAxis) {
  // nn.CrossEntropyLoss: classes on dim 1, per-voxel targets.
  ExpectType("softmax_cross_entropy",
             {T({2, 5, 3, 4, 4}), T({2, 3, 4, 4}, kI64)}, Json::object(), {});
  // Language model: classes last.
  ExpectType("softmax_cross_entropy", {T({2, 7, 100}), T({2, 7}, kI64)},
             Json::object(), {});
  ExpectType("softmax_cross_entropy", {T({2, 7, 100}), T({2, 7}, kI64)},
             {{"axis", -1}}, {});
  ExpectError("softmax_cross_entropy", {T({2, 7, 100}), T({2, 7}, kI64)},
              {{"axis", 1}}, "target");
  // (2, 100) would be the target of 7 classes over 100 positions (axis 1).
  ExpectType("softmax_cross_entropy", {T({2, 7, 100}), T({2, 100}, kI64)},
             Json::object(), {});
  ExpectError("softmax_cross_entropy", {T({2, 7, 100}), T({2, 5}, kI64)},
              Json::object(), "neither");
  ExpectError("softmax_cross_entropy", {T({4, 10}), T({4})}, Json::object(),
              "i64");
  ExpectType("softmax_cross_entropy_backward",
             {T({2, 7, 100}), T({2, 7}, kI64)}, {{"axis", 2}}, {2, 7, 100});
}

// ------------------------------------------------------------ normalisation

TEST(NormTest, StatsAndOutputs) {
  ExpectType("batchnorm_stats", {T({2, 8, 4, 4}, kF16)}, Json::object(),
             {2, 8}, kF32);
  ExpectType("batchnorm",
             {T({2, 8, 4, 4}, kF16), T({2, 8}), T({8}), T({8})},
             Json::object(), {2, 8, 4, 4}, kF16);
  EXPECT_DOUBLE_EQ(Flops("batchnorm_stats", {T({2, 8, 4, 4})}), 3.0 * 256);
  ExpectError("batchnorm", {T({2, 8, 4, 4}), T({2, 8}), T({4}), T({8})},
              Json::object(), "weight");
  ExpectError("batchnorm", {T({2, 8, 4, 4}), T({2, 8}), T({8})},
              Json::object(), "3 inputs");
  ExpectType("layernorm_stats", {T({2, 7, 16})}, Json::object(), {2, 2, 7});
  ExpectType("layernorm", {T({2, 7, 16}), T({2, 2, 7}), T({16}), T({16})},
             Json::object(), {2, 7, 16});
  ExpectType("batchnorm_backward",
             {T({2, 8, 4, 4}), T({2, 8, 4, 4}), T({2, 8}), T({8})},
             Json::object(), {2, 8, 4, 4});
  ExpectType("batchnorm_backward_weight",
             {T({2, 8, 4, 4}, kF16), T({2, 8, 4, 4}, kF16), T({2, 8})},
             Json::object(), {8}, kF32);
  ExpectType("layernorm_backward_bias", {T({2, 7, 16})}, Json::object(),
             {16});
}

// ------------------------------------------------------------ pooling

TEST(PoolTest, MaxAndAveragePooling) {
  // ResNet's stem pool: (112 + 2 - 3) / 2 + 1 = 56.
  const Json stem = {{"kernel", 3}, {"stride", 2}, {"padding", 1}};
  ExpectType("maxpool", {T({1, 64, 112, 112})}, stem, {1, 64, 56, 56});
  EXPECT_DOUBLE_EQ(Flops("maxpool", {T({1, 64, 112, 112})}, stem),
                   9.0 * 64 * 56 * 56);
  // Stride defaults to the kernel; 3-D by rank.
  ExpectType("maxpool", {T({1, 2, 5, 4, 4})}, {{"kernel", 2}},
             {1, 2, 2, 2, 2});
  ExpectType("avgpool", {T({1, 2, 4, 4})}, {{"kernel", 2}}, {1, 2, 2, 2});
  ExpectError("maxpool", {T({1, 2, 4, 4})}, {{"kernel", 2}, {"padding", 2}},
              "half the kernel");
  ExpectError("maxpool", {T({1, 2, 4, 4})}, Json::object(), "kernel");
  ExpectType("maxpool_backward", {T({1, 64, 56, 56}), T({1, 64, 112, 112})},
             stem, {1, 64, 112, 112});
  ExpectType("global_avgpool", {T({2, 512, 7, 7})}, Json::object(),
             {2, 512});
  ExpectType("global_avgpool_backward", {T({2, 512})},
             {{"input_shape", {2, 512, 7, 7}}}, {2, 512, 7, 7});
}

TEST(PoolTest, AdaptiveBins) {
  ExpectType("adaptive_avgpool", {T({1, 512, 14, 14})}, {{"output_size", 7}},
             {1, 512, 7, 7});
  // 14 -> 7: bins of 2, 14 reads per dim.
  EXPECT_DOUBLE_EQ(
      Flops("adaptive_avgpool", {T({1, 512, 14, 14})}, {{"output_size", 7}}),
      512.0 * 14 * 14);
  // 13 -> 7: bins [0,2) [1,4) [3,6) [5,8) [7,10) [9,12) [11,13): 19 reads.
  EXPECT_DOUBLE_EQ(
      Flops("adaptive_avgpool", {T({1, 1, 13, 13})}, {{"output_size", 7}}),
      19.0 * 19);
}

TEST(PoolTest, Upsample) {
  const Json tri = {{"scale", 2}, {"mode", "trilinear"},
                    {"align_corners", true}};
  ExpectType("upsample", {T({1, 2, 3, 4, 5})}, tri, {1, 2, 6, 8, 10});
  // 16 per output element (weighted sum of 8 neighbours).
  EXPECT_DOUBLE_EQ(Flops("upsample", {T({1, 2, 3, 4, 5})}, tri),
                   16.0 * 2 * 6 * 8 * 10);
  ExpectError("upsample", {T({1, 2, 3, 4, 5})},
              {{"scale", 2}, {"mode", "bilinear"}}, "4-D");
  ExpectError("upsample", {T({1, 2, 3, 4})},
              {{"scale", 2}, {"align_corners", true}}, "align_corners");
  Json back = tri;
  back["input_shape"] = {1, 2, 3, 4, 5};
  ExpectType("upsample_backward", {T({1, 2, 6, 8, 10})}, back,
             {1, 2, 3, 4, 5});
  // By a size (any, downsampling too), with or without PyTorch's scale
  // factor; scale and size are exclusive.
  const Json sized = {{"size", {7, 2}}, {"scale_factor", {1.5, 0.5}}, {"mode", "bilinear"}};
  ExpectType("upsample", {T({1, 2, 5, 4})}, sized, {1, 2, 7, 2});
  Json sized_back = sized;
  sized_back["input_shape"] = {1, 2, 5, 4};
  ExpectType("upsample_backward", {T({1, 2, 7, 2})}, sized_back, {1, 2, 5, 4});
  ExpectError("upsample_backward", {T({1, 2, 7, 3})}, sized_back, "input 0");
  ExpectError("upsample", {T({1, 2, 5, 4})}, {{"size", {7, 2}}, {"scale", 2}}, "one of them");
  ExpectError("upsample", {T({1, 2, 5, 4})}, Json::object(), "one of them");
  ExpectError("upsample", {T({1, 2, 5, 4})}, {{"size", {0, 2}}}, "attr 'size'");
  ExpectError("upsample", {T({1, 2, 5, 4})}, {{"size", {3, 2}}, {"scale_factor", {1, -1}}},
              "scale_factor");
  ExpectError("upsample", {T({1, 2, 5, 4})}, {{"scale", 2}, {"scale_factor", 2}},
              "goes with attr 'size'");
  // A scale factor must give the size (within one: ONNX's float32 floor)
  // and lie in [2^-40, 2^40] (its source step is then finite).
  ExpectType("upsample", {T({1, 2, 10, 4})}, {{"size", {7, 4}}, {"scale_factor", {0.7, 1}}},
             {1, 2, 7, 4});
  ExpectError("upsample", {T({1, 2, 10, 4})}, {{"size", {9, 4}}, {"scale_factor", {0.7, 1}}},
              "does not give attr 'size' 9");
  ExpectError("upsample", {T({1, 2, 5, 4})}, {{"size", {1, 1}}, {"scale_factor", 1e-39}},
              "2^-40");
  // Bicubic: 2-D, 32 FLOPs per output element.
  EXPECT_DOUBLE_EQ(Flops("upsample", {T({1, 2, 5, 4})}, {{"scale", 2}, {"mode", "bicubic"}}),
                   32.0 * 2 * 10 * 8);
  ExpectError("upsample", {T({1, 2, 3, 5, 4})}, {{"scale", 2}, {"mode", "bicubic"}}, "4-D");
}

// ------------------------------------------------------------ data movement

TEST(ShapeOpsTest, FlipReversesDims) {
  ExpectType("flip", {T({2, 3, 4})}, {{"dims", {0, -1}}}, {2, 3, 4});
  EXPECT_DOUBLE_EQ(Flops("flip", {T({2, 3, 4})}, {{"dims", {1}}}), 24);
  ExpectError("flip", {T({2, 3})}, {{"dims", {1, -1}}}, "twice");
  ExpectError("flip", {T({2, 3})}, {{"dims", {2}}}, "attr 'dims'");
  ExpectError("flip", {T({2, 3})}, Json::object(), "dims");
}

TEST(ShapeOpsTest, TransposePermutesAndItsGradientTransposesBack) {
  ExpectType("transpose", {T({2, 3, 4, 5})}, {{"perm", {0, 2, 1, 3}}}, {2, 4, 3, 5});
  ExpectType("transpose", {T({2, 3, 4})}, Json::object(), {4, 3, 2});  // reversed
  EXPECT_DOUBLE_EQ(Flops("transpose", {T({2, 3, 4})}, {{"perm", {1, 0, 2}}}), 24);
  ExpectError("transpose", {T({2, 3})}, {{"perm", {0, 0}}}, "not a permutation");
  ExpectError("transpose", {T({2, 3})}, {{"perm", {0, 1, 2}}}, "not a permutation");
  ExpectError("transpose", {T({1, 1, 1, 1, 1, 1, 1, 1, 1})}, Json::object(), "at most 8");
  // The backward of perm (2, 0, 1) is a transpose by (1, 2, 0).
  NetBuilder nb("t");
  const Value x = nb.Parameter("x", {2, 3, 4});
  nb.MarkOutput(nb.Apply("sum", {nb.Apply("transpose", {x}, {{"perm", {2, 0, 1}}})}, Json::object(),
                         "loss"));
  auto g = nb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto train = BuildTrainingGraph(*g, "loss");
  ASSERT_TRUE(train.ok()) << train.status();
  bool found = false;
  for (NodeId v = 0; v < train->num_nodes(); ++v) {
    if (train->op(v) == "transpose" && train->attrs(v).value("perm", Json()) ==
                                           Json({1, 2, 0})) {
      found = true;
      EXPECT_EQ(*train->shape(v), (Shape{2, 3, 4}));
    }
  }
  EXPECT_TRUE(found) << "no transpose by (1, 2, 0) in the training graph";
}

TEST(ShapeOpsTest, PadConcatFlattenReshape) {
  // F.pad order: (W left, W right, H top, H bottom).
  ExpectType("pad", {T({1, 2, 3, 4, 5})}, {{"pads", {1, 2, 0, 1}}},
             {1, 2, 3, 5, 8});
  ExpectError("pad", {T({1, 2})}, {{"pads", {1, 2, 3}}}, "even");
  // Reflect and replicate: no crops; reflect below the dim's size; no value.
  ExpectType("pad", {T({1, 2, 3, 4})}, {{"pads", {3, 3, 2, 0}}, {"mode", "reflect"}},
             {1, 2, 5, 10});
  ExpectType("pad_backward", {T({1, 2, 5, 10})}, {{"pads", {3, 3, 2, 0}}, {"mode", "reflect"}},
             {1, 2, 3, 4});
  ExpectType("pad", {T({1, 1})}, {{"pads", {5, 0}}, {"mode", "replicate"}}, {1, 6});
  ExpectError("pad", {T({1, 2, 3, 4})}, {{"pads", {4, 0}}, {"mode", "reflect"}},
              "less than the dim's size");
  ExpectError("pad_backward", {T({1, 2, 3, 9})}, {{"pads", {4, 1}}, {"mode", "reflect"}},
              "less than the dim's size");
  ExpectError("pad", {T({1, 4})}, {{"pads", {-1, 2}}, {"mode", "replicate"}}, "does not crop");
  ExpectError("pad", {T({1, 4})}, {{"pads", {1, 1}}, {"mode", "reflect"}, {"value", 1}},
              "'value' is for mode \"constant\"");
  ExpectError("pad", {T({1, 4})}, {{"pads", {1, 1}}, {"mode", "circular"}},
              "\"constant\", \"reflect\" or \"replicate\"");
  ExpectType("pad_backward", {T({1, 2, 3, 5, 8})}, {{"pads", {1, 2, 0, 1}}},
             {1, 2, 3, 4, 5});
  ExpectType("concat", {T({1, 2, 4, 4}), T({1, 3, 4, 4})}, {{"axis", 1}},
             {1, 5, 4, 4});
  ExpectType("concat", {T({1, 2, 4, 4}), T({1, 2, 4, 4})}, {{"axis", -1}},
             {1, 2, 4, 8});
  ExpectError("concat", {T({1, 2, 4, 4}), T({1, 3, 4, 5})}, {{"axis", 1}},
              "outside axis");
  ExpectType("slice", {T({1, 5, 4, 4})},
             {{"axis", 1}, {"begin", 2}, {"end", 5}}, {1, 3, 4, 4});
  ExpectType("flatten", {T({2, 3, 4, 5})}, Json::object(), {2, 60});
  ExpectType("flatten", {T({2, 3, 4, 5})}, {{"start_dim", 0}, {"end_dim", 1}},
             {6, 4, 5});
  ExpectType("reshape", {T({2, 60})}, {{"shape", {-1, 6}}}, {20, 6});
  ExpectError("reshape", {T({2, 60})}, {{"shape", {7, -1}}}, "cannot reshape");
  EXPECT_DOUBLE_EQ(Flops("flatten", {T({2, 3, 4, 5})}), 120);
}

// ------------------------------------------------------------ NetBuilder

TEST(NetBuilderTest, LayersNameParametersLikeStateDict) {
  NetBuilder nb("net");
  const Value x = nb.Input("input", {2, 3, 8, 8});
  Value y = nb.Conv("conv1", x, 4, 3, 1, 1);
  y = nb.BatchNorm("bn1", y);
  y = nb.Relu(y);
  y = nb.Relu(y);
  EXPECT_EQ(nb.id(y), "relu_2");
  y = nb.Apply("flatten", {y});
  EXPECT_EQ(nb.id(y), "flatten_1");
  y = nb.Linear("fc", y, 10);
  y = nb.Dropout(y, 0.5);
  absl::StatusOr<Graph> g = nb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  struct Expected {
    const char* id;
    Shape shape;
    DType dtype;
    Role role;
  };
  for (const Expected& e : std::vector<Expected>{
           {"input", {2, 3, 8, 8}, kF32, Role::kInput},
           {"conv1.weight", {4, 3, 3, 3}, kF32, Role::kParameter},
           {"conv1.bias", {4}, kF32, Role::kParameter},
           {"conv1", {2, 4, 8, 8}, kF32, Role::kForward},
           {"bn1.weight", {4}, kF32, Role::kParameter},
           {"bn1.bias", {4}, kF32, Role::kParameter},
           {"bn1.running_mean", {4}, kF32, Role::kBuffer},
           {"bn1.running_var", {4}, kF32, Role::kBuffer},
           {"bn1.num_batches_tracked", {}, kI64, Role::kBuffer},
           {"bn1.stats", {2, 4}, kF32, Role::kForward},
           {"bn1", {2, 4, 8, 8}, kF32, Role::kForward},
           {"relu_1", {2, 4, 8, 8}, kF32, Role::kForward},
           {"fc.weight", {10, 256}, kF32, Role::kParameter},
           {"fc", {2, 10}, kF32, Role::kForward},
           {"dropout_mask_1", {2, 10}, DType::kUInt8, Role::kForward},
           {"dropout_1", {2, 10}, kF32, Role::kForward},
       }) {
    const NodeId v = g->Find(e.id);
    ASSERT_NE(v, kNoNode) << e.id;
    EXPECT_EQ(*g->shape(v), e.shape) << e.id;
    EXPECT_EQ(*g->dtype(v), e.dtype) << e.id;
    EXPECT_EQ(g->role(v), e.role) << e.id;
    EXPECT_EQ(g->bytes(v), NumElements(e.shape) * DTypeSize(e.dtype)) << e.id;
    EXPECT_EQ(g->persistent(v), e.role == Role::kInput ||
                                    e.role == Role::kParameter ||
                                    e.role == Role::kBuffer)
        << e.id;
  }
  const NodeId bn = g->Find("bn1");
  std::vector<std::string> reads;
  for (NodeId u : g->inputs(bn)) reads.push_back(g->id(u));
  EXPECT_EQ(reads, (std::vector<std::string>{"conv1", "bn1.stats",
                                             "bn1.weight", "bn1.bias"}));
  const NodeId mask = g->Find("dropout_mask_1");
  EXPECT_EQ(g->bytes(mask), 20);
  EXPECT_EQ(g->id(g->inputs(g->Find("dropout_1"))[1]), "dropout_mask_1");
}

TEST(NetBuilderTest, CostIsFlopsOverThroughput) {
  NetBuilder nb("net", CostModel{1e9});
  const Value x = nb.Input("x", {4, 10});
  const Value y = nb.Linear("fc", x, 5);
  absl::StatusOr<Graph> g = nb.Build();
  ASSERT_TRUE(g.ok());
  EXPECT_DOUBLE_EQ(g->cost(g->Find("fc")), 420 / 1e9);
  EXPECT_EQ(g->cost(g->Find("x")), 0);
  EXPECT_EQ(nb.type(y).shape, (Shape{4, 5}));
}

TEST(NetBuilderTest, HalfPrecisionHalvesBytes) {
  int64_t bytes[2];
  for (int half = 0; half < 2; ++half) {
    NetBuilder nb("net");
    const Value x = nb.Input("input", {1, 2, 6, 6, 6}, half ? kF16 : kF32);
    nb.Conv("conv1", x, 4, 3);
    absl::StatusOr<Graph> g = nb.Build();
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(*g->dtype(g->Find("conv1.weight")), half ? kF16 : kF32);
    bytes[half] = g->bytes(g->Find("conv1"));
  }
  EXPECT_EQ(bytes[0], 4 * 4 * 64);
  EXPECT_EQ(bytes[1], bytes[0] / 2);
}

TEST(NetBuilderTest, ErrorsStickAndNameNodeAndOp) {
  NetBuilder nb("net");
  const Value x = nb.Input("input", {2, 3, 8, 8});
  const Value bad = nb.Apply("conv2d", {x, nb.Parameter("w", {4, 5, 3, 3})},
                             Json::object(), "conv1");
  EXPECT_FALSE(bad.valid());
  // Later calls are ignored; the first error wins.
  const Value later = nb.Apply("no_such_op", {x});
  EXPECT_FALSE(later.valid());
  ASSERT_FALSE(nb.status().ok());
  const std::string message(nb.status().message());
  EXPECT_TRUE(Contains(message, "conv1")) << message;
  EXPECT_TRUE(Contains(message, "conv2d")) << message;
  EXPECT_TRUE(Contains(message, "channels")) << message;
  absl::StatusOr<Graph> g = nb.Build();
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status(), nb.status());
}

TEST(NetBuilderTest, ApplyErrors) {
  {
    NetBuilder nb("net");
    nb.Apply("no_such_op", {});
    EXPECT_TRUE(Contains(nb.status().message(), "unknown operator"));
  }
  {
    NetBuilder nb("net");
    const Value x = nb.Input("x", {2});
    nb.Apply("relu", {x, x});
    EXPECT_TRUE(Contains(nb.status().message(), "takes 1 inputs, got 2"))
        << nb.status();
  }
  {
    NetBuilder nb("net");
    const Value x = nb.Input("x", {2});
    nb.Apply("relu", {x}, Json::object(), "x");
    EXPECT_TRUE(Contains(nb.status().message(), "duplicate id"));
  }
  {
    NetBuilder nb("net");
    const Value g = nb.Generic("g", {}, 10, 1);
    nb.Apply("relu", {g});
    EXPECT_TRUE(Contains(nb.status().message(), "has no shape"));
  }
  {
    NetBuilder nb("net");
    nb.Apply("relu", {Value{}});
    EXPECT_TRUE(Contains(nb.status().message(), "invalid value"));
  }
}

TEST(NetBuilderTest, SamePrefixSharesParameters) {
  NetBuilder nb("net");
  const Value x = nb.Input("x", {2, 8});
  const Value a = nb.Linear("fc", x, 8);
  const Value b = nb.Linear("fc", a, 8);
  EXPECT_EQ(nb.id(a), "fc");
  EXPECT_EQ(nb.id(b), "fc_1");
  absl::StatusOr<Graph> g = nb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  int parameters = 0;
  for (NodeId v = 0; v < g->num_nodes(); ++v) {
    parameters += g->role(v) == Role::kParameter;
  }
  EXPECT_EQ(parameters, 2);
  // A clash of kinds is an error.
  nb.Linear("fc", x, 4);
  EXPECT_TRUE(Contains(nb.status().message(), "fc.weight")) << nb.status();
}

TEST(NetBuilderTest, GenericNodesAndOutputs) {
  NetBuilder nb("pebbles");
  const Value a = nb.Generic("a", {}, 3, 1);
  const Value b = nb.Generic("b", {a}, 5, 2);
  nb.MarkOutput(b);
  nb.MarkOutput(b);
  absl::StatusOr<Graph> g = nb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->num_nodes(), 2);
  EXPECT_EQ(g->outputs().size(), 1u);
  EXPECT_EQ(g->op(g->Find("b")), "generic");
  EXPECT_EQ(g->bytes(g->Find("b")), 5);
  EXPECT_FALSE(g->shape(g->Find("b")).has_value());
  // FromGraph keeps ids, order and outputs.
  NetBuilder again = NetBuilder::FromGraph(*g);
  EXPECT_EQ(again.id(Value{1}), "b");
  absl::StatusOr<Graph> g2 = again.Build();
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g2->id(g2->outputs()[0]), "b");
}

// -------------------------------------------------------------- optimizer

TEST(OptimizerOpsTest, UpdatesHaveTheWrittenTensorsTypeAndCheckTheirSettings) {
  const Json sgd = {{"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 0.0}};
  const Json adam = {{"lr", 1e-3}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8},
                     {"weight_decay", 0.0}, {"decoupled_weight_decay", true}};
  const TensorType w = T({4, 3}), scalar = T({});
  ExpectType("sgd_momentum", {w, w, w}, sgd, {4, 3});
  ExpectType("sgd_update", {w, w}, sgd, {4, 3});
  ExpectType("adam_exp_avg", {w, w, w}, adam, {4, 3});
  ExpectType("adam_exp_avg_sq", {w, w, w}, adam, {4, 3});
  ExpectType("adam_update", {w, w, w, scalar}, adam, {4, 3});
  ExpectType("optimizer_step", {scalar}, Json::object(), {});
  EXPECT_DOUBLE_EQ(Flops("adam_update", {w, w, w, scalar}, adam), 10.0 * 12);
  EXPECT_DOUBLE_EQ(Flops("sgd_update", {w, w}, sgd), 3.0 * 12);
  ExpectError("sgd_update", {w, T({3, 4})}, sgd, "shape");
  ExpectError("adam_update", {w, w, w, T({1})}, adam, "the step count (input 3)");
  ExpectError("adam_exp_avg", {w, w, T({4, 3}, DType::kFloat16)}, adam, "dtype");
  ExpectError("sgd_update", {w, w}, {{"lr", -0.5}}, "lr=-0.5 is out of range (0 or more)");
  ExpectError("sgd_update", {w, w}, Json::object(), "needs its learning rate (attrs.lr)");
  ExpectType("sgd_update", {w, w}, {{"lr", 0.0}}, {4, 3});  // (PyTorch's warm-ups start at 0)
  ExpectError("adam_update", {w, w, w, scalar}, {{"lr", 1e-3}, {"beta2", 1.0}},
                "beta2=1 is out of range (in [0, 1))");
  ExpectError("optimizer_step", {T({2})}, Json::object(), "the step count");
  EXPECT_EQ(FindOp("adam_update")->backward, nullptr);
}

}  // namespace
}  // namespace pebble
