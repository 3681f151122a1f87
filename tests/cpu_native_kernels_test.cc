// The CPU backend's own kernels (runtime/cpu/native_*.cc): each against a
// straightforward reference (naive loops in double, hand-computed values,
// finite differences, the adjoint identity <B(g), x> = <g, F(x)> for the
// backward of a linear map), 16-bit floats, errors, bitwise determinism
// across buffer addresses and thread counts, and a cross-check against
// PyTorch when python3 with torch is available.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "graph/net_builder.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/native_util.h"
#include "runtime/cpu/parallel.h"
#include "runtime/kernel.h"
#include "runtime/npy.h"

namespace pebble {
namespace {

using Json = nlohmann::json;
constexpr DType kF32 = DType::kFloat32;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kBF16 = DType::kBFloat16;
constexpr DType kI64 = DType::kInt64;
constexpr DType kU8 = DType::kUInt8;

// A host tensor: shape, dtype and raw bytes.
struct HostTensor {
  Shape shape;
  DType dtype = kF32;
  std::vector<std::byte> bytes;

  int64_t size() const { return NumElements(shape); }
  std::vector<float> Floats() const {
    std::vector<float> out(size());
    TensorView v{const_cast<std::byte*>(bytes.data()), shape, dtype};
    for (int64_t i = 0; i < size(); ++i) out[i] = native::LoadAsFloat(v, i);
    return out;
  }
  template <typename T>
  std::vector<T> As() const {
    std::vector<T> out(size());
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
};

HostTensor Floats(Shape shape, const std::vector<float>& values,
                  DType dtype = kF32) {
  HostTensor t{shape, dtype, {}};
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.size());
  t.bytes.resize(t.size() * DTypeSize(dtype));
  TensorView v{t.bytes.data(), shape, dtype};
  for (size_t i = 0; i < values.size(); ++i) native::StoreFloat(v, i, values[i]);
  return t;
}

HostTensor Ints(Shape shape, const std::vector<int64_t>& values) {
  HostTensor t{shape, kI64, {}};
  t.bytes.resize(values.size() * 8);
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo = -1.0f,
                                float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

HostTensor Random(Shape shape, uint32_t seed, DType dtype = kF32) {
  return Floats(shape, RandomFloats(NumElements(shape), seed), dtype);
}

const KernelTable& NativeTable() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable;
    RegisterNativeKernels(*t);
    return t;
  }();
  return *table;
}

// 64-byte aligned storage at `offset` bytes past an aligned address (a
// multiple of 64), filled with garbage.
struct Buffer {
  std::vector<std::byte> storage;
  std::byte* data = nullptr;
  Buffer(int64_t bytes, int64_t offset, std::byte garbage) {
    storage.assign(bytes + offset + 128, garbage);
    auto addr = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + ((64 - addr % 64) % 64) + offset;
  }
};

struct RunOptions {
  int64_t offset = 0;  // of every buffer past a 64-byte boundary
  std::byte garbage{0xA5};
  // Overrides the output view (shape, dtype) to test the checks.
  const TensorType* output_override = nullptr;
};

// Builds a one-node graph (an input per operand), runs the native kernel
// of `op` and returns its output.
absl::StatusOr<HostTensor> RunKernel(const std::string& op,
                               const std::vector<HostTensor>& inputs,
                               Json attrs = Json::object(),
                               RunOptions options = {}) {
  NetBuilder nb("t");
  std::vector<Value> values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    values.push_back(nb.Input(absl::StrCat("in", i), inputs[i].shape, inputs[i].dtype));
  }
  Value y = nb.Apply(op, values, attrs, "y");
  nb.MarkOutput(y);
  absl::StatusOr<Graph> graph = nb.Build();
  if (!graph.ok()) return graph.status();
  KernelFn kernel = NativeTable().Find(op);
  if (kernel == nullptr) return absl::NotFoundError(op);
  KernelContext ctx;
  ctx.graph = &*graph;
  ctx.node = graph->Find("y");
  std::vector<Buffer> buffers;
  buffers.reserve(inputs.size() + 1);
  for (const HostTensor& t : inputs) {
    buffers.emplace_back(t.bytes.size(), options.offset, std::byte{0});
    std::memcpy(buffers.back().data, t.bytes.data(), t.bytes.size());
    ctx.inputs.push_back({buffers.back().data, t.shape, t.dtype});
  }
  HostTensor out;
  out.shape = *graph->shape(ctx.node);
  out.dtype = graph->dtype(ctx.node).value_or(kF32);
  if (options.output_override != nullptr) {
    out.shape = options.output_override->shape;
    out.dtype = options.output_override->dtype;
  }
  const int64_t out_bytes = NumElements(out.shape) * DTypeSize(out.dtype);
  buffers.emplace_back(out_bytes, options.offset, options.garbage);
  ctx.output = {buffers.back().data, out.shape, out.dtype};
  absl::Status status = kernel(ctx);
  if (!status.ok()) return status;
  out.bytes.assign(buffers.back().data, buffers.back().data + out_bytes);
  return out;
}

HostTensor MustRun(const std::string& op, const std::vector<HostTensor>& inputs,
                   Json attrs = Json::object(), RunOptions options = {}) {
  absl::StatusOr<HostTensor> out = RunKernel(op, inputs, attrs, options);
  EXPECT_TRUE(out.ok()) << op << ": " << out.status();
  return out.ok() ? *out : HostTensor{};
}

// |a - b| <= tol (1 + |b|) elementwise.
void ExpectNear(const std::vector<float>& actual,
                const std::vector<double>& expected, double tol,
                const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], tol * (1 + std::abs(expected[i])))
        << what << " at " << i;
  }
}

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Row-major multi-index helpers.
std::vector<int64_t> Unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}
int64_t Ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * s[d] + idx[d];
  return i;
}

// The adjoint identity of a linear op F with backward B (attrs `bw_attrs`):
// <B(g), x> = <g, F(x)> for random x and g.
void ExpectAdjoint(const std::string& op, const std::string& backward,
                   const Shape& x_shape, const Json& attrs,
                   const Json& bw_attrs) {
  HostTensor x = Random(x_shape, 11);
  HostTensor y = MustRun(op, {x}, attrs);
  HostTensor g = Random(y.shape, 12);
  HostTensor gx = MustRun(backward, {g}, bw_attrs);
  ASSERT_EQ(gx.shape, x_shape) << backward;
  const double lhs = Dot(gx.Floats(), x.Floats());
  const double rhs = Dot(g.Floats(), y.Floats());
  EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(rhs))) << op << " / " << backward;
}

// ------------------------------------------------------------- registry

HostTensor Bools(Shape shape, const std::vector<uint8_t>& values) {
  HostTensor t{shape, DType::kUInt8, {}};
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.size());
  t.bytes.resize(values.size());
  std::memcpy(t.bytes.data(), values.data(), values.size());
  return t;
}

std::vector<uint8_t> BytesOf(const HostTensor& t) {
  std::vector<uint8_t> out(t.bytes.size());
  std::memcpy(out.data(), t.bytes.data(), out.size());
  return out;
}

// compare over operands broadcast in full (a (2, 1, 3) by a (4, 1): a dim
// of 1 on each side), every op on floats, integers and booleans.
TEST(NativeKernelsTest, CompareBroadcastsBothOperands) {
  std::vector<float> av(6), bv(4);
  for (int i = 0; i < 6; ++i) av[i] = static_cast<float>(i % 4);
  for (int j = 0; j < 4; ++j) bv[j] = static_cast<float>(j);
  const struct {
    const char* op;
    bool (*f)(float, float);
  } cases[] = {{"eq", [](float x, float y) { return x == y; }},
               {"ne", [](float x, float y) { return x != y; }},
               {"lt", [](float x, float y) { return x < y; }},
               {"le", [](float x, float y) { return x <= y; }},
               {"gt", [](float x, float y) { return x > y; }},
               {"ge", [](float x, float y) { return x >= y; }},
               {"and", [](float x, float y) { return x != 0 && y != 0; }},
               {"or", [](float x, float y) { return x != 0 || y != 0; }}};
  for (DType dtype : {kF32, DType::kFloat16}) {
    for (const auto& c : cases) {
      const HostTensor out = MustRun("compare", {Floats({2, 1, 3}, av, dtype), Floats({4, 1}, bv, dtype)},
                                     {{"op", c.op}});
      ASSERT_EQ(out.shape, (Shape{2, 4, 3}));
      ASSERT_EQ(out.dtype, DType::kUInt8);
      const std::vector<uint8_t> got = BytesOf(out);
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 4; ++j) {
          for (int k = 0; k < 3; ++k) {
            EXPECT_EQ(got[(i * 4 + j) * 3 + k], c.f(av[i * 3 + k], bv[j]) ? 1 : 0)
                << c.op << " at " << i << "," << j << "," << k;
          }
        }
      }
    }
  }
  // Integers exactly (2^53 + 1 is not a double), booleans as truth values.
  const int64_t big = (int64_t{1} << 53) + 1;
  EXPECT_EQ(BytesOf(MustRun("compare", {Ints({2}, {big, 7}), Ints({1}, {big - 1})}, {{"op", "gt"}})),
            (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(BytesOf(MustRun("compare", {Bools({3}, {0, 1, 2}), Bools({}, {1})}, {{"op", "and"}})),
            (std::vector<uint8_t>{0, 1, 1}));
  // NaN: unequal to itself, every ordering false, true as a truth value.
  const float nan = std::nanf("");
  EXPECT_EQ(BytesOf(MustRun("compare", {Floats({4}, {nan, nan, nan, nan}), Floats({4}, {nan, 0, 0, 1})},
                            {{"op", "ne"}})),
            (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(BytesOf(MustRun("compare", {Floats({1}, {nan}), Floats({1}, {0})}, {{"op", "or"}})),
            (std::vector<uint8_t>{1}));
  EXPECT_EQ(BytesOf(MustRun("compare", {Floats({1}, {nan}), Floats({1}, {0})}, {{"op", "le"}})),
            (std::vector<uint8_t>{0}));
}

// cast between every pair of dtypes: Note [Cast values] (floats round to
// nearest, truncate toward zero to integers; NaN 0, beyond int64 its
// bound, u8 the low 8 bits).
TEST(NativeKernelsTest, CastConvertsAsNoteCastValuesSays) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  const HostTensor floats = Floats({8}, {2.7f, -2.7f, 300.0f, -1.0f, nan, inf, -inf, 1e20f});
  EXPECT_EQ(MustRun("cast", {floats}, {{"dtype", "i64"}}).As<int64_t>(),
            (std::vector<int64_t>{2, -2, 300, -1, 0, INT64_MAX, INT64_MIN, INT64_MAX}));
  EXPECT_EQ(BytesOf(MustRun("cast", {floats}, {{"dtype", "u8"}})),
            (std::vector<uint8_t>{2, 254, 44, 255, 0, 255, 0, 255}));
  // fp32 to fp16 and bf16 rounds to nearest (1 + 2^-11 is a tie: to even).
  const HostTensor fine = Floats({3}, {1.0f + 0x1p-11f, 1.0f + 0x1p-10f + 0x1p-11f, 70000.0f});
  EXPECT_EQ(MustRun("cast", {fine}, {{"dtype", "fp16"}}).Floats(),
            (std::vector<float>{1.0f, 1.0f + 0x1p-9f, inf}));
  EXPECT_EQ(MustRun("cast", {Floats({1}, {1.0f + 0x1p-8f + 0x1p-9f})}, {{"dtype", "bf16"}}).Floats(),
            (std::vector<float>{1.0f + 0x1p-7f}));
  // Back to fp32 exactly; an integer to a float to nearest (2^53 + 1 is not
  // an fp32: 2^53); integers to u8 by their low bits, u8 to i64 as it is.
  const HostTensor half = MustRun("cast", {Floats({2}, {0.5f, -3.0f}, kF16)}, {{"dtype", "fp32"}});
  EXPECT_EQ(half.dtype, kF32);
  EXPECT_EQ(half.Floats(), (std::vector<float>{0.5f, -3.0f}));
  const int64_t big = (int64_t{1} << 53) + 1;
  EXPECT_EQ(MustRun("cast", {Ints({3}, {big, -7, 257})}, {{"dtype", "fp32"}}).Floats(),
            (std::vector<float>{0x1p53f, -7.0f, 257.0f}));
  EXPECT_EQ(BytesOf(MustRun("cast", {Ints({3}, {big, -7, 257})}, {{"dtype", "u8"}})),
            (std::vector<uint8_t>{1, 249, 1}));
  EXPECT_EQ(MustRun("cast", {Bools({3}, {0, 1, 200})}, {{"dtype", "i64"}}).As<int64_t>(),
            (std::vector<int64_t>{0, 1, 200}));
  EXPECT_EQ(MustRun("cast", {Bools({2}, {0, 255})}, {{"dtype", "bf16"}}).Floats(),
            (std::vector<float>{0.0f, 255.0f}));
}

// masked_fill with a mask broadcast over x ((2, 1, 3) over (2, 2, 3)), the
// fill of -inf, inverted, and its backward (the same op with 0).
TEST(NativeKernelsTest, MaskedFillBroadcastsTheMask) {
  std::vector<float> xv(12);
  for (int i = 0; i < 12; ++i) xv[i] = static_cast<float>(i) + 0.5f;
  const std::vector<uint8_t> mv = {1, 0, 0, 0, 1, 1};
  const HostTensor x = Floats({2, 2, 3}, xv);
  const HostTensor mask = Bools({2, 1, 3}, mv);
  for (const bool invert : {false, true}) {
    const std::vector<float> y =
        MustRun("masked_fill", {x, mask}, {{"value", "-inf"}, {"invert", invert}}).Floats();
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        for (int k = 0; k < 3; ++k) {
          const int o = (i * 2 + j) * 3 + k;
          const bool filled = (mv[i * 3 + k] != 0) != invert;
          if (filled) {
            EXPECT_EQ(y[o], -HUGE_VALF) << o;
          } else {
            EXPECT_EQ(y[o], xv[o]) << o;
          }
        }
      }
    }
  }
  EXPECT_EQ(MustRun("masked_fill", {Floats({3}, {1, 2, 3}, DType::kBFloat16), Bools({}, {1})},
                    {{"value", 0.5}})
                .Floats(),
            (std::vector<float>{0.5f, 0.5f, 0.5f}));
  // -0.0 stays -0.0 (an imported Where adds it to the side taken).
  const std::vector<float> negative_zero =
      MustRun("masked_fill", {Floats({2}, {1, 2}), Bools({2}, {1, 0})}, {{"value", -0.0}})
          .Floats();
  EXPECT_TRUE(negative_zero[0] == 0.0f && std::signbit(negative_zero[0]));
  EXPECT_EQ(negative_zero[1], 2.0f);
  // A mask that does not broadcast over x, or a value that is no number.
  EXPECT_FALSE(RunKernel("masked_fill", {x, Bools({3, 1}, {1, 0, 1})}).ok());
  EXPECT_FALSE(RunKernel("masked_fill", {x, mask}, {{"value", "nan"}}).ok());
}

// torch.maximum / torch.minimum and their gradients, as ATen computes them
// (checked against PyTorch 1.13): NaN propagates forward; at a tie (-0
// equals +0) each operand gets half the gradient; where either is NaN both
// get all of it.
TEST(NativeKernelsTest, MaximumAndMinimumFollowATen) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const HostTensor a = Floats({6}, {1, 2, 3, nan, 1, 0.0f});
  const HostTensor b = Floats({6}, {2, 2, 1, 1, nan, -0.0f});
  const HostTensor g = Floats({6}, {1, 2, 3, 4, 5, 6});
  const std::vector<float> mx = MustRun("maximum", {a, b}).Floats();
  const std::vector<float> mn = MustRun("minimum", {a, b}).Floats();
  const std::vector<float> want_max = {2, 2, 3, nan, nan, 0}, want_min = {1, 2, 1, nan, nan, 0};
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(mx[i] == want_max[i] || (std::isnan(mx[i]) && std::isnan(want_max[i]))) << i;
    EXPECT_TRUE(mn[i] == want_min[i] || (std::isnan(mn[i]) && std::isnan(want_min[i]))) << i;
  }
  // maximum's a and minimum's b (and the other two) get the same gradients.
  const std::vector<float> larger_first = {0, 1, 3, 4, 5, 3}, smaller_first = {1, 1, 0, 4, 5, 3};
  EXPECT_EQ(MustRun("maximum_backward", {g, a, b}, {{"input", 0}}).Floats(), larger_first);
  EXPECT_EQ(MustRun("maximum_backward", {g, a, b}, {{"input", 1}}).Floats(), smaller_first);
  EXPECT_EQ(MustRun("minimum_backward", {g, a, b}, {{"input", 0}}).Floats(), smaller_first);
  EXPECT_EQ(MustRun("minimum_backward", {g, a, b}, {{"input", 1}}).Floats(), larger_first);
  // In fp16 as in fp32; operands of two shapes, or an input that is not 0
  // or 1, are refused.
  EXPECT_EQ(MustRun("maximum", {Floats({2}, {1, -3}, kF16), Floats({2}, {0.5, -2}, kF16)})
                .Floats(),
            (std::vector<float>{1, -2}));
  EXPECT_FALSE(RunKernel("maximum", {a, Floats({1}, {0})}).ok());
  EXPECT_FALSE(RunKernel("minimum_backward", {g, a, b}, {{"input", 2}}).ok());
}

TEST(NativeKernelsTest, RegistersItsOpsAndEveryOpIsInTheOpTable) {
  const std::vector<std::string> ops = NativeTable().Ops();
  for (const char* op :
       {"add", "mul", "sub", "div", "erf", "erf_backward", "sqrt", "sqrt_backward", "sum", "sum_backward", "sum_to", "copy", "flatten",
        "reshape", "slice", "transpose", "pad", "pad_backward", "concat", "global_avgpool",
        "global_avgpool_backward", "adaptive_avgpool",
        "adaptive_avgpool_backward", "upsample", "upsample_backward",
        "softmax_cross_entropy", "softmax_cross_entropy_backward", "mse_loss",
        "mse_loss_backward", "layernorm_stats", "layernorm",
        "layernorm_backward", "layernorm_backward_weight",
        "layernorm_backward_bias", "dropout_mask", "dropout",
        "dropout_backward", "embedding", "embedding_backward", "arange",
        "fill", "split_heads", "split_heads_backward", "merge_heads", "clip",
        "clip_backward", "hardsigmoid", "hardsigmoid_backward", "hardswish",
        "hardswish_backward", "leaky_relu", "leaky_relu_backward", "relu", "relu_backward",
        "elu", "elu_backward", "softplus", "softplus_backward", "abs", "abs_backward", "exp",
        "exp_backward", "log", "log_backward", "compare", "masked_fill", "maximum", "minimum",
        "maximum_backward", "minimum_backward", "flip", "bce_with_logits",
        "bce_with_logits_backward", "constant", "random"}) {
    EXPECT_NE(NativeTable().Find(op), nullptr) << op;
  }
  for (const std::string& op : ops) EXPECT_NE(FindOp(op), nullptr) << op;
  // The backend's table holds them beside the oneDNN family (a duplicate op
  // would abort here).
  for (const std::string& op : ops) EXPECT_NE(CpuKernels().Find(op), nullptr) << op;
}

// ------------------------------------------------------------- 16-bit floats

TEST(NativeKernelsTest, HalfAndBFloat16ConversionsRoundToNearestEven) {
  using native::BFloat16ToFloat;
  using native::FloatToBFloat16;
  using native::FloatToHalf;
  using native::HalfToFloat;
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);                  // overflow: inf
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: to even (1).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  for (uint32_t h = 0; h < 0x7C00; ++h) {  // every finite positive half
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16ToFloat(0x4049), 3.140625f);
  // 1 + 2^-8 is a tie: to even (1); 1 + 3 * 2^-8 rounds up.
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
}

// ------------------------------------------------------------- add, mul, sum_to

TEST(NativeKernelsTest, AddAndMulWithBroadcastMatchNaiveLoops) {
  for (DType dtype : {kF32, kF16, kBF16}) {
    const double tol = dtype == kF32 ? 1e-6 : (dtype == kF16 ? 2e-3 : 1e-2);
    HostTensor a = Random({3, 5, 7}, 1, dtype);
    HostTensor b = Random({3, 5, 7}, 2, dtype);
    HostTensor bias = Random({5, 7}, 3, dtype);
    const std::vector<float> fa = a.Floats(), fb = b.Floats(), fc = bias.Floats();
    std::vector<double> sum(105), prod(105), bsum(105), bprod(105);
    for (int i = 0; i < 105; ++i) {
      sum[i] = fa[i] + fb[i];
      prod[i] = static_cast<double>(fa[i]) * fb[i];
      bsum[i] = fa[i] + fc[i % 35];
      bprod[i] = static_cast<double>(fc[i % 35]) * fa[i];
    }
    ExpectNear(MustRun("add", {a, b}).Floats(), sum, tol, "add");
    ExpectNear(MustRun("mul", {a, b}).Floats(), prod, tol, "mul");
    ExpectNear(MustRun("add", {a, bias}).Floats(), bsum, tol, "add bias");
    ExpectNear(MustRun("mul", {bias, a}).Floats(), bprod, tol, "mul bias first");
    EXPECT_EQ(MustRun("add", {a, b}).dtype, dtype);
    // sub and div keep the operands' order whichever is broadcast.
    std::vector<float> away(35);  // divisors in [3, 5]
    for (int i = 0; i < 35; ++i) away[i] = fc[i] + 4.0f;
    const HostTensor divisor = Floats({5, 7}, away, dtype);
    const std::vector<float> fd = divisor.Floats();
    std::vector<double> diff(105), rdiff(105), quot(105), rquot(105);
    for (int i = 0; i < 105; ++i) {
      diff[i] = static_cast<double>(fa[i]) - fc[i % 35];
      rdiff[i] = static_cast<double>(fc[i % 35]) - fa[i];
      quot[i] = static_cast<double>(fa[i]) / fd[i % 35];
      rquot[i] = static_cast<double>(fd[i % 35]) / (fa[i] + 4.0);
    }
    ExpectNear(MustRun("sub", {a, bias}).Floats(), diff, tol, "sub");
    ExpectNear(MustRun("sub", {bias, a}).Floats(), rdiff, tol, "sub bias first");
    ExpectNear(MustRun("div", {a, divisor}).Floats(), quot, tol, "div");
    std::vector<float> fa4(105);
    for (int i = 0; i < 105; ++i) fa4[i] = fa[i] + 4.0f;
    const HostTensor a4 = Floats({3, 5, 7}, fa4, dtype);
    const std::vector<float> fa4r = a4.Floats();
    for (int i = 0; i < 105; ++i) rquot[i] = static_cast<double>(fd[i % 35]) / fa4r[i];
    ExpectNear(MustRun("div", {divisor, a4}).Floats(), rquot, tol, "div divisor first");
  }
  // A large odd size crosses the parallel grain and the broadcast period.
  HostTensor big = Random({70001, 3}, 4);
  HostTensor row = Random({3}, 5);
  const std::vector<float> out = MustRun("add", {big, row}).Floats();
  const std::vector<float> fbig = big.Floats(), frow = row.Floats();
  for (int64_t i = 0; i < 210003; ++i) ASSERT_EQ(out[i], fbig[i] + frow[i % 3]);
}

// The piecewise-linear activations at hand-computed points, boundaries
// included (PyTorch's ATen conventions: hardtanh_backward is 0 at the bounds,
// hardswish_backward is x / 3 + 1/2 at x = +-3, leaky_relu_backward takes the
// slope at 0).
TEST(NativeKernelsTest, PiecewiseLinearActivationsAndGradients) {
  const std::vector<float> xs = {-4, -3, -1, 0, 0.5f, 3, 6, 7};
  const HostTensor x = Floats({8}, xs);
  const HostTensor g = Floats({8}, std::vector<float>(8, 2.0f));
  struct Case {
    std::string op;
    Json attrs;
    std::vector<float> y, dx;  // dx for g = 2
  };
  const std::vector<Case> cases = {
      {"clip", {{"min", 0}, {"max", 6}},
       {0, 0, 0, 0, 0.5f, 3, 6, 6}, {0, 0, 0, 0, 2, 2, 0, 0}},
      {"clip", {{"max", 1}},  // no lower bound
       {-4, -3, -1, 0, 0.5f, 1, 1, 1}, {2, 2, 2, 2, 2, 0, 0, 0}},
      {"hardsigmoid", {{"alpha", 0.25}, {"beta", 0.5}},
       {0, 0, 0.25f, 0.5f, 0.625f, 1, 1, 1}, {0, 0, 0.5f, 0.5f, 0.5f, 0, 0, 0}},
      {"hardswish", Json::object(),
       {0, 0, -1.0f / 3, 0, 0.5f * 3.5f / 6, 3, 6, 7},
       {0, 2 * (-1 + 0.5f), 2 * (-1.0f / 3 + 0.5f), 1, 2 * (0.5f / 3 + 0.5f), 2 * 1.5f, 2, 2}},
      {"leaky_relu", {{"negative_slope", 0.1}},
       {-0.4f, -0.3f, -0.1f, 0, 0.5f, 3, 6, 7}, {0.2f, 0.2f, 0.2f, 0.2f, 2, 2, 2, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + " " + c.attrs.dump());
    const std::vector<float> y = MustRun(c.op, {x}, c.attrs).Floats();
    const std::vector<float> dx = MustRun(c.op + "_backward", {g, x}, c.attrs).Floats();
    for (int i = 0; i < 8; ++i) {
      EXPECT_FLOAT_EQ(y[i], c.y[i]) << "x = " << xs[i];
      EXPECT_FLOAT_EQ(dx[i], c.dx[i]) << "x = " << xs[i];
    }
  }
  // erf and its derivative 2 / sqrt(pi) exp(-x^2) against the C library's.
  for (float v : xs) {
    const HostTensor one = Floats({1}, {v});
    EXPECT_FLOAT_EQ(MustRun("erf", {one}).Floats()[0], std::erf(v)) << v;
    EXPECT_NEAR(MustRun("erf_backward", {Floats({1}, {2.0f}), one}).Floats()[0],
                2.0 * 2.0 / std::sqrt(M_PI) * std::exp(-static_cast<double>(v) * v), 1e-6)
        << v;
  }
  // sqrt, and its gradient g / (2 y) read from the output.
  EXPECT_FLOAT_EQ(MustRun("sqrt", {Floats({2}, {4.0f, 2.25f})}).Floats()[1], 1.5f);
  EXPECT_FLOAT_EQ(
      MustRun("sqrt_backward", {Floats({1}, {3.0f}), Floats({1}, {1.5f})}).Floats()[0], 1.0f);
  // elu and softplus against ATen's formulas in double: nn.ELU(0.7),
  // nn.SELU's coefficients, nn.CELU(0.5) (input_scale 2); softplus of beta
  // 1 and 2 on both sides of its threshold (20 / beta).
  struct Smooth {
    std::string op;
    Json attrs;
    std::function<double(double)> f, df;
  };
  const double selu_alpha = 1.6732632423543772, selu_scale = 1.0507009873554805;
  const std::vector<Smooth> smooth = {
      {"elu", {{"alpha", 0.7}},
       [](double v) { return v <= 0 ? 0.7 * std::expm1(v) : v; },
       [](double v) { return v <= 0 ? 0.7 * std::exp(v) : 1.0; }},
      {"elu", {{"alpha", selu_alpha}, {"scale", selu_scale}},
       [&](double v) { return selu_scale * (v <= 0 ? selu_alpha * std::expm1(v) : v); },
       [&](double v) { return selu_scale * (v <= 0 ? selu_alpha * std::exp(v) : 1.0); }},
      {"elu", {{"alpha", 0.5}, {"input_scale", 2.0}},
       [](double v) { return v <= 0 ? 0.5 * std::expm1(2 * v) : v; },
       [](double v) { return v <= 0 ? std::exp(2 * v) : 1.0; }},
      {"softplus", Json::object(),
       [](double v) { return v > 20 ? v : std::log1p(std::exp(v)); },
       [](double v) { return v > 20 ? 1.0 : 1 / (1 + std::exp(-v)); }},
      {"softplus", {{"beta", 2.0}},
       [](double v) { return 2 * v > 20 ? v : std::log1p(std::exp(2 * v)) / 2; },
       [](double v) { return 2 * v > 20 ? 1.0 : 1 / (1 + std::exp(-2 * v)); }},
  };
  const std::vector<float> points = {-30, -4, -1, -1e-3f, 0, 1e-3f, 0.5f, 9.9f, 10.5f, 21, 40};
  for (const Smooth& c : smooth) {
    SCOPED_TRACE(c.op + " " + c.attrs.dump());
    const HostTensor px = Floats({11}, points);
    const std::vector<float> y = MustRun(c.op, {px}, c.attrs).Floats();
    const std::vector<float> dx =
        MustRun(c.op + "_backward", {Floats({11}, std::vector<float>(11, 2.0f)), px}, c.attrs)
            .Floats();
    for (int i = 0; i < 11; ++i) {
      const double v = points[i];
      EXPECT_NEAR(y[i], c.f(v), 1e-6 * std::max(1.0, std::abs(c.f(v)))) << "x = " << v;
      EXPECT_NEAR(dx[i], 2 * c.df(v), 2e-6) << "x = " << v;
    }
  }
  // abs (its gradient 0 at 0, as PyTorch's g sgn(x)); exp, whose backward
  // reads its output; log, whose backward reads x.
  const HostTensor signs = Floats({3}, {-1.5f, 0.0f, 2.0f});
  const HostTensor twos = Floats({3}, {2.0f, 2.0f, 2.0f});
  EXPECT_EQ(MustRun("abs", {signs}).Floats(), (std::vector<float>{1.5f, 0, 2}));
  EXPECT_EQ(MustRun("abs_backward", {twos, signs}).Floats(), (std::vector<float>{-2, 0, 2}));
  EXPECT_FLOAT_EQ(MustRun("exp", {signs}).Floats()[2], std::exp(2.0f));
  EXPECT_EQ(MustRun("exp_backward", {twos, signs}).Floats(), (std::vector<float>{-3, 0, 4}));
  EXPECT_FLOAT_EQ(MustRun("log", {signs}).Floats()[2], std::log(2.0f));
  EXPECT_TRUE(std::isnan(MustRun("log", {signs}).Floats()[0]));
  EXPECT_EQ(MustRun("log_backward", {twos, signs}).Floats()[2], 1.0f);
  // The defaults are PyTorch's: hardsigmoid(x) = relu6(x + 3) / 6,
  // leaky_relu's slope 0.01.
  EXPECT_FLOAT_EQ(MustRun("hardsigmoid", {Floats({1}, {1.5f})}).Floats()[0], 0.75f);
  EXPECT_FLOAT_EQ(MustRun("leaky_relu", {Floats({1}, {-2.0f})}).Floats()[0], -0.02f);
  // Half precision goes through float.
  const HostTensor h = Random({9}, 7, kF16);
  const std::vector<float> hy = MustRun("hardswish", {h}).Floats(), hx = h.Floats();
  for (int i = 0; i < 9; ++i) {
    EXPECT_NEAR(hy[i], hx[i] * std::min(std::max(hx[i] + 3, 0.0f), 6.0f) / 6, 2e-3);
  }
}

// relu as PyTorch's: a NaN stays NaN (oneDNN's eltwise_relu made it 0, so
// a NaN input trained to a finite loss), -0 stays -0, and the gradient
// passes where y <= 0 is false (threshold_backward(g, y, 0)), a NaN's too.
TEST(NativeKernelsTest, ReluKeepsNaNAsPyTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dtype : {kF32, kF16, kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const HostTensor x = Floats({5}, {nan, -0.0f, -2.0f, 0.0f, 3.0f}, dtype);
    const std::vector<float> y = MustRun("relu", {x}).Floats();
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_TRUE(y[1] == 0.0f && std::signbit(y[1]));
    EXPECT_EQ(y[2], 0.0f);
    EXPECT_FALSE(std::signbit(y[2]));
    EXPECT_EQ(y[3], 0.0f);
    EXPECT_EQ(y[4], 3.0f);
    const HostTensor g = Floats({5}, std::vector<float>(5, 2.0f), dtype);
    const std::vector<float> dx =
        MustRun("relu_backward", {g, MustRun("relu", {x})}).Floats();
    EXPECT_EQ(dx, (std::vector<float>{2, 0, 0, 0, 2}));
  }
}

TEST(NativeKernelsTest, SumToReducesTheLeadingDims) {
  for (Shape x_shape : {Shape{4, 3, 5}, Shape{3000, 7}, Shape{2, 40000}}) {
    const Shape target(x_shape.begin() + 1, x_shape.end());
    HostTensor x = Random(x_shape, 7);
    const std::vector<float> fx = x.Floats();
    const int64_t k = NumElements(target);
    std::vector<double> ref(k, 0.0);
    for (size_t i = 0; i < fx.size(); ++i) ref[i % k] += fx[i];
    ExpectNear(MustRun("sum_to", {x}, {{"shape", target}}).Floats(), ref, 1e-6,
               "sum_to " + ShapeToString(x_shape));
  }
  // Down to the last dim only (rank 3 -> 1).
  HostTensor x = Random({2, 3, 4}, 8);
  std::vector<double> ref(4, 0.0);
  const std::vector<float> fx = x.Floats();
  for (int i = 0; i < 24; ++i) ref[i % 4] += fx[i];
  ExpectNear(MustRun("sum_to", {x}, {{"shape", {4}}}).Floats(), ref, 1e-6, "sum_to");
}

// ------------------------------------------------------------- copies

TEST(NativeKernelsTest, CopyFlattenReshapeCopyTheBytes) {
  HostTensor x = Random({2, 3, 4}, 9);
  HostTensor c = MustRun("copy", {x});
  EXPECT_EQ(c.bytes, x.bytes);
  HostTensor f = MustRun("flatten", {x});
  EXPECT_EQ(f.shape, (Shape{2, 12}));
  EXPECT_EQ(f.bytes, x.bytes);
  HostTensor r = MustRun("reshape", {x}, {{"shape", {4, -1}}});
  EXPECT_EQ(r.shape, (Shape{4, 6}));
  EXPECT_EQ(r.bytes, x.bytes);
  HostTensor h = Random({3, 100003}, 10, kF16);  // parallel copy, odd size
  EXPECT_EQ(MustRun("copy", {h}).bytes, h.bytes);
}

// ------------------------------------------------------------- slice, pad, concat

TEST(NativeKernelsTest, SliceMatchesIndexing) {
  HostTensor x = Random({3, 5, 4}, 13);
  const std::vector<float> fx = x.Floats();
  for (int axis = 0; axis < 3; ++axis) {
    const int64_t begin = 1, end = x.shape[axis] - 1;
    HostTensor y = MustRun("slice", {x}, {{"axis", axis}, {"begin", begin}, {"end", end}});
    Shape ys = x.shape;
    ys[axis] = end - begin;
    ASSERT_EQ(y.shape, ys);
    std::vector<double> ref(NumElements(ys));
    for (int64_t i = 0; i < NumElements(ys); ++i) {
      std::vector<int64_t> idx = Unravel(i, ys);
      idx[axis] += begin;
      ref[i] = fx[Ravel(idx, x.shape)];
    }
    ExpectNear(y.Floats(), ref, 0, "slice axis " + std::to_string(axis));
  }
}

// transpose against indexing, for several ranks and dtypes; a transpose by
// the inverse permutation gives x back.
// flip reverses the dims named, any dtype's bytes; flipping twice gives x
// back.
TEST(NativeKernelsTest, FlipMatchesIndexing) {
  for (const auto& [shape, dims] : {std::pair<Shape, std::vector<int64_t>>{{5}, {0}},
                                    {{2, 3, 4}, {0, 2}},
                                    {{2, 4, 3, 5}, {-1, 1, 2}},
                                    {{3, 1, 4}, {1}}}) {
    for (DType dtype : {kF32, kBF16}) {
      SCOPED_TRACE(ShapeToString(shape));
      HostTensor x = Random(shape, 22, dtype);
      const std::vector<float> fx = x.Floats();
      HostTensor y = MustRun("flip", {x}, {{"dims", dims}});
      ASSERT_EQ(y.shape, shape);
      std::vector<bool> flipped(shape.size(), false);
      for (int64_t d : dims) flipped[d < 0 ? d + static_cast<int64_t>(shape.size()) : d] = true;
      std::vector<double> ref(NumElements(shape));
      for (int64_t i = 0; i < NumElements(shape); ++i) {
        std::vector<int64_t> idx = Unravel(i, shape);
        for (size_t d = 0; d < shape.size(); ++d) {
          if (flipped[d]) idx[d] = shape[d] - 1 - idx[d];
        }
        ref[i] = fx[Ravel(idx, shape)];
      }
      ExpectNear(y.Floats(), ref, 0, "flip");
      EXPECT_EQ(MustRun("flip", {y}, {{"dims", dims}}).bytes, x.bytes);
    }
  }
  EXPECT_FALSE(RunKernel("flip", {Random({2, 3}, 23)}, {{"dims", {0, 0}}}).ok());
}

TEST(NativeKernelsTest, TransposeMatchesIndexing) {
  struct PermCase {
    Shape shape;
    std::vector<int64_t> perm;
  };
  for (const PermCase& c : {PermCase{{3, 5}, {1, 0}}, PermCase{{2, 3, 4}, {2, 0, 1}},
                            PermCase{{2, 4, 3, 5, 2}, {0, 2, 1, 3, 4}},
                            PermCase{{70, 3, 600}, {2, 1, 0}}}) {
    for (DType dtype : {kF32, kF16}) {
      SCOPED_TRACE(ShapeToString(c.shape));
      HostTensor x = Random(c.shape, 21, dtype);
      const std::vector<float> fx = x.Floats();
      HostTensor y = MustRun("transpose", {x}, {{"perm", c.perm}});
      Shape ys;
      for (int64_t p : c.perm) ys.push_back(c.shape[p]);
      ASSERT_EQ(y.shape, ys);
      std::vector<double> ref(NumElements(ys));
      for (int64_t i = 0; i < NumElements(ys); ++i) {
        const std::vector<int64_t> out_idx = Unravel(i, ys);
        std::vector<int64_t> in_idx(c.shape.size());
        for (size_t d = 0; d < c.perm.size(); ++d) in_idx[c.perm[d]] = out_idx[d];
        ref[i] = fx[Ravel(in_idx, c.shape)];
      }
      ExpectNear(y.Floats(), ref, 0, "transpose");
      std::vector<int64_t> inverse(c.perm.size());
      for (size_t d = 0; d < c.perm.size(); ++d) inverse[c.perm[d]] = static_cast<int64_t>(d);
      EXPECT_EQ(MustRun("transpose", {y}, {{"perm", inverse}}).bytes, x.bytes);
    }
  }
}

// out[o] = x[o - before] inside, `value` outside (F.pad semantics).
std::vector<double> NaivePad(const HostTensor& x, const std::vector<int64_t>& pads,
                             double value, Shape* out_shape) {
  const int rank = static_cast<int>(x.shape.size());
  std::vector<int64_t> before(rank, 0);
  Shape os = x.shape;
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    before[rank - 1 - i] = pads[2 * i];
    os[rank - 1 - i] += pads[2 * i] + pads[2 * i + 1];
  }
  *out_shape = os;
  const std::vector<float> fx = x.Floats();
  std::vector<double> out(NumElements(os));
  for (int64_t i = 0; i < NumElements(os); ++i) {
    std::vector<int64_t> idx = Unravel(i, os);
    bool inside = true;
    for (int d = 0; d < rank; ++d) {
      idx[d] -= before[d];
      inside = inside && idx[d] >= 0 && idx[d] < x.shape[d];
    }
    out[i] = inside ? fx[Ravel(idx, x.shape)] : value;
  }
  return out;
}

TEST(NativeKernelsTest, PadWithValuesAndNegativeCrops) {
  HostTensor x = Random({2, 3, 5, 4}, 14);
  for (const std::vector<int64_t>& pads :
       {std::vector<int64_t>{1, 2}, std::vector<int64_t>{0, 0, 2, 1},
        std::vector<int64_t>{-1, 2, 1, -2}, std::vector<int64_t>{1, 1, 1, 1, -1, 0},
        std::vector<int64_t>{3, -2, 0, 0, 0, 0, 1, 0}}) {
    Shape os;
    const std::vector<double> ref = NaivePad(x, pads, 0.5, &os);
    HostTensor y = MustRun("pad", {x}, {{"pads", pads}, {"value", 0.5}});
    ASSERT_EQ(y.shape, os);
    ExpectNear(y.Floats(), ref, 0, "pad");
    // pad_backward: the gradient of the unpadded region.
    Json attrs = {{"pads", pads}};
    ExpectAdjoint("pad", "pad_backward", x.shape, attrs, attrs);
  }
  // fp16 keeps the fill value rounded to half.
  HostTensor h = Random({2, 3}, 15, kF16);
  HostTensor hy = MustRun("pad", {h}, {{"pads", {1, 0}}, {"value", 0.1}});
  EXPECT_EQ(hy.Floats()[0], native::HalfToFloat(native::FloatToHalf(0.1f)));
}

// pad's modes reflect and replicate (nn.ReflectionPad, nn.ReplicationPad)
// against their index maps written out (reflect: n - 1 - |n - 1 - |s||),
// and pad_backward as the forward's adjoint: <g, pad(x)> = <pad_backward(g), x>.
TEST(NativeKernelsTest, ReflectAndReplicatePadsAndTheirAdjoints) {
  const HostTensor x = Random({2, 3, 5, 4}, 21);
  const std::vector<float> fx = x.Floats();
  for (const std::string mode : {"reflect", "replicate"}) {
    for (const std::vector<int64_t>& pads :
         {std::vector<int64_t>{1, 2}, std::vector<int64_t>{0, 3, 2, 1},
          std::vector<int64_t>{3, 3, 4, 4, 1, 0}}) {
      const Json attrs = {{"pads", pads}, {"mode", mode}};
      SCOPED_TRACE(attrs.dump());
      const HostTensor y = MustRun("pad", {x}, attrs);
      std::vector<int64_t> before(4, 0);
      Shape os = x.shape;
      for (size_t i = 0; i < pads.size() / 2; ++i) {
        before[3 - i] = pads[2 * i];
        os[3 - i] += pads[2 * i] + pads[2 * i + 1];
      }
      ASSERT_EQ(y.shape, os);
      std::vector<double> ref(NumElements(os));
      for (int64_t o = 0; o < NumElements(os); ++o) {
        std::vector<int64_t> idx = Unravel(o, os);
        for (int d = 0; d < 4; ++d) {
          const int64_t s = idx[d] - before[d], n = x.shape[d];
          idx[d] = mode == "reflect" ? n - 1 - std::abs(n - 1 - std::abs(s))
                                     : std::clamp<int64_t>(s, 0, n - 1);
        }
        ref[o] = fx[Ravel(idx, x.shape)];
      }
      ExpectNear(y.Floats(), ref, 0, "pad");
      ExpectAdjoint("pad", "pad_backward", x.shape, attrs, attrs);
    }
  }
  // Half precision: the same elements; the backward sums in float.
  const HostTensor h = Random({2, 3}, 22, kF16);
  const Json row = {{"pads", {2, 1}}, {"mode", "reflect"}};
  const std::vector<float> hy = MustRun("pad", {h}, row).Floats(), hx = h.Floats();
  EXPECT_EQ(hy[0], hx[2]);
  EXPECT_EQ(hy[5], hx[1]);
  const HostTensor ones = Floats({2, 6}, std::vector<float>(12, 1.0f));
  // x2 x1 x0 x1 x2 x1: x0 is read once, x1 three times, x2 twice.
  EXPECT_EQ(MustRun("pad_backward", {ones}, row).Floats(), (std::vector<float>{1, 3, 2, 1, 3, 2}));
}

TEST(NativeKernelsTest, SliceBackwardIsAZeroPadAndConcatInvertsSlices) {
  HostTensor a = Random({2, 3, 4}, 16), b = Random({2, 1, 4}, 17),
             c = Random({2, 5, 4}, 18);
  for (int axis : {1, -2}) {
    HostTensor y = MustRun("concat", {a, b, c}, {{"axis", axis}});
    ASSERT_EQ(y.shape, (Shape{2, 9, 4}));
    int64_t begin = 0;
    for (const HostTensor* part : {&a, &b, &c}) {
      const int64_t end = begin + part->shape[1];
      HostTensor s = MustRun("slice", {y}, {{"axis", 1}, {"begin", begin}, {"end", end}});
      EXPECT_EQ(s.bytes, part->bytes);
      begin = end;
    }
  }
  HostTensor x0 = Random({4, 3}, 19), x1 = Random({2, 3}, 20);
  HostTensor y0 = MustRun("concat", {x0, x1}, {{"axis", 0}});
  std::vector<std::byte> both = x0.bytes;
  both.insert(both.end(), x1.bytes.begin(), x1.bytes.end());
  EXPECT_EQ(y0.bytes, both);
  ExpectAdjoint("slice", "pad", {3, 6}, {{"axis", 1}, {"begin", 2}, {"end", 5}},
                {{"pads", {2, 1}}});
}

// ------------------------------------------------------------- pooling

TEST(NativeKernelsTest, GlobalAvgPoolAndItsGradient) {
  HostTensor x = Random({2, 3, 5, 7}, 21);
  const std::vector<float> fx = x.Floats();
  std::vector<double> ref(6, 0.0);
  for (int i = 0; i < 210; ++i) ref[i / 35] += fx[i] / 35.0;
  ExpectNear(MustRun("global_avgpool", {x}).Floats(), ref, 1e-6, "global_avgpool");
  ExpectAdjoint("global_avgpool", "global_avgpool_backward", {2, 3, 5, 7},
                Json::object(), {{"input_shape", {2, 3, 5, 7}}});
  ExpectAdjoint("global_avgpool", "global_avgpool_backward", {1, 2, 3, 4, 5},
                Json::object(), {{"input_shape", {1, 2, 3, 4, 5}}});
}

TEST(NativeKernelsTest, AdaptiveAvgPoolUsesPyTorchBins) {
  // 5 -> 3 bins: [0,2), [1,4), [3,5): overlapping.
  HostTensor x = Floats({1, 1, 1, 5}, {1, 2, 3, 4, 5});
  ExpectNear(MustRun("adaptive_avgpool", {x}, {{"output_size", {1, 3}}}).Floats(),
             {1.5, 3.0, 4.5}, 1e-7, "1x5 -> 1x3");
  // Naive reference on odd sizes, 4-D and 5-D.
  for (auto [in, out] : {std::pair<Shape, Shape>{{2, 3, 7, 5}, {3, 2}},
                         std::pair<Shape, Shape>{{1, 2, 5, 6, 7}, {2, 4, 3}}}) {
    HostTensor t = Random(in, 22);
    const std::vector<float> ft = t.Floats();
    Shape os = {in[0], in[1]};
    os.insert(os.end(), out.begin(), out.end());
    std::vector<double> ref(NumElements(os), 0.0);
    const int d = static_cast<int>(out.size());
    for (int64_t i = 0; i < NumElements(os); ++i) {
      std::vector<int64_t> o = Unravel(i, os);
      std::vector<int64_t> lo(d), hi(d);
      int64_t count = 1;
      for (int k = 0; k < d; ++k) {
        lo[k] = o[2 + k] * in[2 + k] / out[k];
        hi[k] = ((o[2 + k] + 1) * in[2 + k] + out[k] - 1) / out[k];
        count *= hi[k] - lo[k];
      }
      for (int64_t j = 0; j < NumElements(in); ++j) {
        std::vector<int64_t> idx = Unravel(j, in);
        bool inside = idx[0] == o[0] && idx[1] == o[1];
        for (int k = 0; k < d && inside; ++k) {
          inside = idx[2 + k] >= lo[k] && idx[2 + k] < hi[k];
        }
        if (inside) ref[i] += ft[j] / static_cast<double>(count);
      }
    }
    ExpectNear(MustRun("adaptive_avgpool", {t}, {{"output_size", out}}).Floats(), ref,
               1e-6, "adaptive_avgpool");
    ExpectAdjoint("adaptive_avgpool", "adaptive_avgpool_backward", in,
                  {{"output_size", out}}, {{"output_size", out}, {"input_shape", in}});
  }
}

TEST(NativeKernelsTest, UpsampleMatchesHandComputedValues) {
  HostTensor x = Floats({1, 1, 2, 2}, {1, 2, 3, 4});
  // Nearest x2: each value repeated in a 2x2 block.
  ExpectNear(MustRun("upsample", {x}, {{"scale", 2}}).Floats(),
             {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}, 0, "nearest");
  // Bilinear, align_corners: src = o (in - 1) / (out - 1) = o / 3.
  HostTensor row = Floats({1, 1, 1, 2}, {0, 3});
  ExpectNear(MustRun("upsample", {row},
                     {{"scale", {1, 2}}, {"mode", "bilinear"}, {"align_corners", true}})
                 .Floats(),
             {0, 1, 2, 3}, 1e-6, "bilinear align_corners");
  // Bilinear, half-pixel: src = (o + 0.5) / 2 - 0.5 clamped at 0:
  // 0, 0.25, 0.75, 1.25 -> 1 (the last index is clamped).
  ExpectNear(MustRun("upsample", {row}, {{"scale", {1, 2}}, {"mode", "bilinear"}})
                 .Floats(),
             {0, 0.75, 2.25, 3}, 1e-6, "bilinear half-pixel");
  // Nearest x3: floor(o / 3).
  HostTensor r3 = Floats({1, 1, 1, 2}, {5, 7});
  ExpectNear(MustRun("upsample", {r3}, {{"scale", {1, 3}}}).Floats(),
             {5, 5, 5, 7, 7, 7}, 0, "nearest x3");
  // Trilinear with align_corners on 2x1x1 -> 4x2x2 along depth: 0, 1/3, 2/3, 1.
  HostTensor v = Floats({1, 1, 2, 1, 1}, {0, 6});
  std::vector<double> ref;
  for (double d : {0.0, 2.0, 4.0, 6.0}) ref.insert(ref.end(), 4, d);
  ExpectNear(MustRun("upsample", {v},
                     {{"scale", 2}, {"mode", "trilinear"}, {"align_corners", true}})
                 .Floats(),
             ref, 1e-6, "trilinear align_corners");
}

TEST(NativeKernelsTest, UpsampleBackwardIsTheAdjoint) {
  struct Case {
    Shape x;
    Json attrs;
  };
  for (const Case& c : std::vector<Case>{
           {{2, 3, 3, 5}, {{"scale", 2}}},
           {{1, 2, 3, 4}, {{"scale", {3, 2}}}},
           {{2, 2, 3, 5}, {{"scale", 2}, {"mode", "bilinear"}}},
           {{2, 2, 3, 5}, {{"scale", {2, 3}}, {"mode", "bilinear"}, {"align_corners", true}}},
           {{1, 2, 3, 2, 4}, {{"scale", 2}, {"mode", "trilinear"}}},
           {{1, 2, 3, 2, 4}, {{"scale", 2}, {"mode", "trilinear"}, {"align_corners", true}}},
           {{1, 1, 2, 3, 2}, {{"scale", {1, 2, 3}}, {"mode", "nearest"}}},
           {{2, 2, 5, 4}, {{"size", {7, 3}}, {"mode", "bilinear"}}},
           {{1, 2, 5, 4}, {{"size", {7, 10}}, {"scale_factor", {1.5, 2.5}}, {"mode", "bilinear"}}},
           {{1, 2, 5, 6}, {{"size", {2, 9}}, {"mode", "bilinear"}, {"align_corners", true}}},
           {{1, 2, 6, 5}, {{"size", {4, 8}}}},
           {{1, 1, 3, 5, 4}, {{"size", {4, 2, 9}}, {"mode", "trilinear"}}},
           {{2, 2, 5, 4}, {{"scale", {2, 3}}, {"mode", "bicubic"}}},
           {{1, 2, 5, 6}, {{"size", {3, 13}}, {"mode", "bicubic"}, {"align_corners", true}}}}) {
    Json bw = c.attrs;
    bw["input_shape"] = c.x;
    ExpectAdjoint("upsample", "upsample_backward", c.x, c.attrs, bw);
  }
}

// ------------------------------------------------------------- losses

TEST(NativeKernelsTest, SumAndSumBackward) {
  HostTensor x = Random({3, 100001}, 23);
  const std::vector<float> fx = x.Floats();
  double ref = 0;
  for (float v : fx) ref += v;
  HostTensor s = MustRun("sum", {x});
  EXPECT_EQ(s.shape, Shape{});
  EXPECT_NEAR(s.Floats()[0], ref, 1e-6 * std::abs(ref) + 1e-6);
  HostTensor ones = MustRun("sum_backward", {}, {{"shape", {2, 3}}, {"dtype", "fp16"}});
  EXPECT_EQ(ones.dtype, kF16);
  ExpectNear(ones.Floats(), std::vector<double>(6, 1.0), 0, "ones");
  HostTensor g = Floats({}, {2.5f});
  ExpectNear(MustRun("sum_backward", {g}, {{"shape", {4}}, {"dtype", "fp32"}}).Floats(),
             std::vector<double>(4, 2.5), 0, "g");
}

// Cross-entropy in double: mean over targets of lse - x[target].
double NaiveCrossEntropy(const std::vector<float>& x, const std::vector<int64_t>& t,
                         int64_t outer, int64_t classes, int64_t inner,
                         std::vector<double>* grad) {
  double loss = 0;
  const double count = static_cast<double>(outer * inner);
  grad->assign(x.size(), 0.0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t c) { return (o * classes + c) * inner + i; };
      double m = -1e300;
      for (int64_t c = 0; c < classes; ++c) m = std::max<double>(m, x[at(c)]);
      double s = 0;
      for (int64_t c = 0; c < classes; ++c) s += std::exp(x[at(c)] - m);
      const int64_t target = t[o * inner + i];
      loss += m + std::log(s) - x[at(target)];
      for (int64_t c = 0; c < classes; ++c) {
        (*grad)[at(c)] = (std::exp(x[at(c)] - m) / s - (c == target)) / count;
      }
    }
  }
  return loss / count;
}

TEST(NativeKernelsTest, CrossEntropyForwardAndBackward) {
  struct Case {
    Shape logits;
    int axis;
  };
  std::mt19937 rng(24);
  for (const Case& c : {Case{{5, 7}, 1}, Case{{2, 4, 3, 67}, 1}, Case{{2, 3, 11}, 2}}) {
    const int64_t outer = std::accumulate(c.logits.begin(), c.logits.begin() + c.axis,
                                          int64_t{1}, std::multiplies<>());
    const int64_t classes = c.logits[c.axis];
    const int64_t inner = NumElements(c.logits) / outer / classes;
    Shape ts = c.logits;
    ts.erase(ts.begin() + c.axis);
    std::vector<int64_t> t(NumElements(ts));
    for (int64_t& v : t) v = std::uniform_int_distribution<int64_t>(0, classes - 1)(rng);
    HostTensor x = Floats(c.logits, RandomFloats(NumElements(c.logits), 25, -4, 4));
    HostTensor target = Ints(ts, t);
    std::vector<double> grad;
    const double ref = NaiveCrossEntropy(x.Floats(), t, outer, classes, inner, &grad);
    HostTensor loss = MustRun("softmax_cross_entropy", {x, target});
    EXPECT_NEAR(loss.Floats()[0], ref, 1e-6 * std::abs(ref)) << ShapeToString(c.logits);
    HostTensor dx = MustRun("softmax_cross_entropy_backward", {x, target}, {{"axis", c.axis}});
    ExpectNear(dx.Floats(), grad, 1e-6, "cross-entropy grad");
    // With an incoming gradient (not the loss): scaled.
    HostTensor g = Floats({}, {-3.0f});
    std::vector<double> scaled = grad;
    for (double& v : scaled) v *= -3.0;
    ExpectNear(MustRun("softmax_cross_entropy_backward", {x, target, g}, {{"axis", c.axis}})
                   .Floats(),
               scaled, 1e-6, "scaled grad");
  }
  // A target outside the classes is an error, not a read out of bounds.
  absl::StatusOr<HostTensor> bad =
      RunKernel("softmax_cross_entropy", {Random({2, 3}, 26), Ints({2}, {1, 3})});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("target 3"), std::string::npos) << bad.status();
}

TEST(NativeKernelsTest, MseLossForwardAndBackward) {
  HostTensor p = Random({3, 7, 5}, 27), t = Random({3, 7, 5}, 28);
  const std::vector<float> fp = p.Floats(), ft = t.Floats();
  double ref = 0;
  std::vector<double> grad(fp.size()), grad_t(fp.size());
  for (size_t i = 0; i < fp.size(); ++i) {
    ref += (static_cast<double>(fp[i]) - ft[i]) * (fp[i] - ft[i]) / fp.size();
    grad[i] = 2.0 * (fp[i] - ft[i]) / fp.size();
    grad_t[i] = -grad[i];
  }
  EXPECT_NEAR(MustRun("mse_loss", {p, t}).Floats()[0], ref, 1e-6 * ref);
  ExpectNear(MustRun("mse_loss_backward", {p, t}).Floats(), grad, 1e-6, "d pred");
  ExpectNear(MustRun("mse_loss_backward", {t, p}).Floats(), grad_t, 1e-6, "d target");
  HostTensor g = Floats({}, {0.5f});
  for (double& v : grad) v *= 0.5;
  ExpectNear(MustRun("mse_loss_backward", {p, t, g}).Floats(), grad, 1e-6, "scaled");
}

// nn.BCEWithLogitsLoss: the mean of (1 - t) x + log(1 + exp(-x)) in
// double, finite at logits of +-100 (whose exp overflows fp32), and its
// gradient (sigmoid(x) - t) / n.
TEST(NativeKernelsTest, BceWithLogitsForwardAndBackward) {
  std::vector<float> xv = RandomFloats(24, 29, -6, 6), tv = RandomFloats(24, 30, 0, 1);
  xv[0] = 100.0f, xv[1] = -100.0f, tv[0] = 0.0f, tv[1] = 1.0f;
  const HostTensor x = Floats({4, 6}, xv), t = Floats({4, 6}, tv);
  double ref = 0;
  std::vector<double> grad(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i], p = 1.0 / (1.0 + std::exp(-v));
    ref += ((1.0 - tv[i]) * v + std::log1p(std::exp(-v))) / xv.size();
    grad[i] = (p - tv[i]) / xv.size();
  }
  const float loss = MustRun("bce_with_logits", {x, t}).Floats()[0];
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, ref, 1e-5 * ref);
  ExpectNear(MustRun("bce_with_logits_backward", {x, t}).Floats(), grad, 1e-6, "d logits");
  for (double& v : grad) v *= 0.5;
  ExpectNear(MustRun("bce_with_logits_backward", {x, t, Floats({}, {0.5f})}).Floats(), grad, 1e-6,
             "scaled");
}

// ------------------------------------------------------------- layer norm

// Layer norm in double over the last dim of (rows, d).
std::vector<double> NaiveLayerNorm(const std::vector<double>& x, int64_t rows,
                                   int64_t d, const std::vector<double>& w,
                                   const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < d; ++j) m += x[r * d + j] / d;
    for (int64_t j = 0; j < d; ++j) v += (x[r * d + j] - m) * (x[r * d + j] - m) / d;
    for (int64_t j = 0; j < d; ++j) {
      y[r * d + j] = (x[r * d + j] - m) / std::sqrt(v + eps) * w[j] + b[j];
    }
  }
  return y;
}

TEST(NativeKernelsTest, LayerNormMatchesReferenceAndFiniteDifferences) {
  const int64_t rows = 6, d = 13;
  const double eps = 1e-5;
  HostTensor x = Floats({2, 3, d}, RandomFloats(rows * d, 29, -2, 2));
  HostTensor w = Random({d}, 30), b = Random({d}, 31), g = Random({2, 3, d}, 32);
  const std::vector<double> fx = ToDouble(x.Floats()), fw = ToDouble(w.Floats()),
                            fb = ToDouble(b.Floats()), fg = ToDouble(g.Floats());
  const Json attrs = {{"eps", eps}};
  HostTensor stats = MustRun("layernorm_stats", {x}, attrs);
  ASSERT_EQ(stats.shape, (Shape{2, 2, 3}));
  const std::vector<float> st = stats.Floats();
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < d; ++j) m += fx[r * d + j] / d;
    for (int64_t j = 0; j < d; ++j) v += (fx[r * d + j] - m) * (fx[r * d + j] - m) / d;
    EXPECT_NEAR(st[r], m, 1e-6);
    EXPECT_NEAR(st[rows + r], 1 / std::sqrt(v + eps), 1e-5);
  }
  ExpectNear(MustRun("layernorm", {x, stats, w, b}, attrs).Floats(),
             NaiveLayerNorm(fx, rows, d, fw, fb, eps), 1e-5, "layernorm");
  ExpectNear(MustRun("layernorm", {x, stats}, attrs).Floats(),
             NaiveLayerNorm(fx, rows, d, std::vector<double>(d, 1),
                            std::vector<double>(d, 0), eps),
             1e-5, "layernorm no affine");
  // Gradients of L = <g, layernorm(x)> by central differences in double.
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                  const std::vector<double>& bb) {
    const std::vector<double> y = NaiveLayerNorm(xx, rows, d, ww, bb, eps);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * fg[i];
    return s;
  };
  const double h = 1e-6;
  auto numeric = [&](int which, size_t n) {
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<double> xp = fx, wp = fw, bp = fb, xm = fx, wm = fw, bm = fb;
      std::vector<double>& p = which == 0 ? xp : (which == 1 ? wp : bp);
      std::vector<double>& m = which == 0 ? xm : (which == 1 ? wm : bm);
      p[i] += h;
      m[i] -= h;
      out[i] = (loss(xp, wp, bp) - loss(xm, wm, bm)) / (2 * h);
    }
    return out;
  };
  ExpectNear(MustRun("layernorm_backward", {g, x, stats, w}, attrs).Floats(),
             numeric(0, fx.size()), 1e-4, "dx");
  ExpectNear(MustRun("layernorm_backward_weight", {g, x, stats}, attrs).Floats(),
             numeric(1, d), 1e-4, "dw");
  ExpectNear(MustRun("layernorm_backward_bias", {g}).Floats(), numeric(2, d), 1e-4, "db");
  // Without weight the data gradient is that of weight = 1.
  std::vector<double> ones(d, 1.0);
  std::vector<double> fw_saved = fw;
  HostTensor one = Floats({d}, std::vector<float>(d, 1.0f));
  EXPECT_EQ(MustRun("layernorm_backward", {g, x, stats}, attrs).bytes,
            MustRun("layernorm_backward", {g, x, stats, one}, attrs).bytes);
}

TEST(NativeKernelsTest, LayerNormInHalfPrecisionFollowsFp32) {
  HostTensor x32 = Random({4, 33}, 33);
  HostTensor x16 = Floats({4, 33}, x32.Floats(), kF16);
  HostTensor w = Floats({33}, RandomFloats(33, 34), kF16), b = Floats({33}, RandomFloats(33, 35), kF16);
  HostTensor stats = MustRun("layernorm_stats", {x16});
  EXPECT_EQ(stats.dtype, kF32);
  HostTensor y = MustRun("layernorm", {x16, stats, w, b});
  EXPECT_EQ(y.dtype, kF16);
  const std::vector<double> ref =
      NaiveLayerNorm(ToDouble(x16.Floats()), 4, 33, ToDouble(w.Floats()),
                     ToDouble(b.Floats()), 1e-5);
  ExpectNear(y.Floats(), ref, 2e-3, "fp16 layernorm");
}

// ------------------------------------------------------------- dropout

TEST(NativeKernelsTest, DropoutMaskIsSeededAndKeepsAboutOneMinusP) {
  HostTensor x = Random({200, 500}, 36);
  const Json attrs = {{"p", 0.3}, {"seed", 42}};
  HostTensor mask = MustRun("dropout_mask", {x}, attrs);
  ASSERT_EQ(mask.dtype, kU8);
  const std::vector<uint8_t> m = mask.As<uint8_t>();
  int64_t kept = 0;
  for (uint8_t v : m) {
    ASSERT_LE(v, 1);
    kept += v;
  }
  EXPECT_NEAR(static_cast<double>(kept) / m.size(), 0.7, 0.01);
  EXPECT_EQ(MustRun("dropout_mask", {x}, attrs).bytes, mask.bytes);
  EXPECT_NE(MustRun("dropout_mask", {x}, {{"p", 0.3}, {"seed", 43}}).bytes, mask.bytes);
  // p = 0 keeps everything.
  for (uint8_t v : MustRun("dropout_mask", {x}, {{"p", 0.0}}).As<uint8_t>()) ASSERT_EQ(v, 1);

  const float scale = static_cast<float>(1.0 / 0.7);
  const std::vector<float> fx = x.Floats();
  std::vector<double> ref(fx.size());
  for (size_t i = 0; i < fx.size(); ++i) ref[i] = fx[i] * (m[i] ? scale : 0.0f);
  ExpectNear(MustRun("dropout", {x, mask}, attrs).Floats(), ref, 0, "dropout");
  ExpectNear(MustRun("dropout_backward", {x, mask}, attrs).Floats(), ref, 0, "dropout_backward");
}

// ------------------------------------------------------------- embedding, arange, fill

TEST(NativeKernelsTest, EmbeddingGathersAndScatterAdds) {
  HostTensor w = Random({5, 3}, 37);
  HostTensor idx = Ints({2, 4}, {4, 0, 4, 2, 1, 4, 0, 3});
  HostTensor y = MustRun("embedding", {idx, w});
  ASSERT_EQ(y.shape, (Shape{2, 4, 3}));
  const std::vector<float> fw = w.Floats(), fy = y.Floats();
  const std::vector<int64_t> ix = idx.As<int64_t>();
  for (int i = 0; i < 8; ++i) {
    for (int d = 0; d < 3; ++d) ASSERT_EQ(fy[i * 3 + d], fw[ix[i] * 3 + d]);
  }
  HostTensor g = Random({2, 4, 3}, 38);
  const std::vector<float> fg = g.Floats();
  std::vector<double> ref(15, 0.0);  // repeated rows add up; row 4 three times
  for (int i = 0; i < 8; ++i) {
    for (int d = 0; d < 3; ++d) ref[ix[i] * 3 + d] += fg[i * 3 + d];
  }
  ExpectNear(MustRun("embedding_backward", {g, idx}, {{"num_embeddings", 5}}).Floats(),
             ref, 1e-6, "embedding_backward");
  absl::StatusOr<HostTensor> bad = RunKernel("embedding", {Ints({2}, {0, 5}), w});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("index 5"), std::string::npos) << bad.status();
}

TEST(NativeKernelsTest, ArangeAndFill) {
  HostTensor a = MustRun("arange", {}, {{"n", 7}});
  EXPECT_EQ(a.dtype, kI64);
  EXPECT_EQ(a.As<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  HostTensor f = MustRun("fill", {}, {{"shape", {2, 2}}, {"value", 0.25}});
  ExpectNear(f.Floats(), std::vector<double>(4, 0.25), 0, "fill");
  HostTensor fi = MustRun("fill", {}, {{"shape", {3}}, {"dtype", "i64"}, {"value", 3}});
  EXPECT_EQ(fi.As<int64_t>(), (std::vector<int64_t>{3, 3, 3}));
  HostTensor fb = MustRun("fill", {}, {{"shape", {3}}, {"dtype", "bf16"}, {"value", 1}});
  ExpectNear(fb.Floats(), std::vector<double>(3, 1.0), 0, "fill bf16");
}

// constant: every value as the attr's bytes hold it (NaN, -inf, -0.0, an
// i64 past a double's 53 bits).
TEST(NativeKernelsTest, ConstantWritesItsBytes) {
  const std::vector<float> floats = {1.5f, -std::numeric_limits<float>::infinity(), -0.0f,
                                     std::numeric_limits<float>::quiet_NaN()};
  std::string bytes(reinterpret_cast<const char*>(floats.data()), floats.size() * 4);
  HostTensor f = MustRun("constant", {},
                         {{"shape", {2, 2}}, {"data", absl::Base64Escape(bytes)}});
  EXPECT_EQ(f.dtype, kF32);
  ASSERT_EQ(f.bytes.size(), bytes.size());
  EXPECT_EQ(std::memcmp(f.bytes.data(), bytes.data(), bytes.size()), 0);
  const std::vector<int64_t> ints = {(int64_t{1} << 60) + 1, -7};
  bytes.assign(reinterpret_cast<const char*>(ints.data()), ints.size() * 8);
  HostTensor i = MustRun("constant", {},
                         {{"shape", {2}}, {"dtype", "i64"}, {"data", absl::Base64Escape(bytes)}});
  EXPECT_EQ(i.As<int64_t>(), ints);
}

// random (Note [Random values]): the same values for a seed, others for
// another; normal noise of the mean and spread asked for, uniform noise
// within [low, high) and spread over it.
TEST(NativeKernelsTest, RandomNoiseHasItsDistribution) {
  const int64_t n = 1 << 16;
  auto draw = [n](nlohmann::json attrs) {
    attrs["shape"] = {n};
    return MustRun("random", {}, attrs).Floats();
  };
  const std::vector<float> a = draw({{"seed", 7}, {"mean", 1.5}, {"std", 2.0}});
  EXPECT_EQ(a, draw({{"seed", 7}, {"mean", 1.5}, {"std", 2.0}}));
  EXPECT_NE(a, draw({{"seed", 8}, {"mean", 1.5}, {"std", 2.0}}));
  double sum = 0, squares = 0;
  for (float v : a) sum += v;
  const double mean = sum / n;
  for (float v : a) squares += (v - mean) * (v - mean);
  const double std = std::sqrt(squares / (n - 1));
  EXPECT_NEAR(mean, 1.5, 5 * 2.0 / std::sqrt(n));  // five standard errors
  EXPECT_NEAR(std, 2.0, 0.05);
  const std::vector<float> u =
      draw({{"seed", 7}, {"distribution", "uniform"}, {"low", -1.0}, {"high", 3.0}});
  std::vector<int> quarters(4, 0);
  for (float v : u) {
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 3.0f);
    ++quarters[std::min(3, static_cast<int>(v + 1.0f))];
  }
  for (int q : quarters) EXPECT_NEAR(q, n / 4, 5 * std::sqrt(n / 4.0)) << "a quarter of [-1, 3)";
}

// ------------------------------------------------------------- heads

TEST(NativeKernelsTest, SplitAndMergeHeadsMatchTorchViews) {
  const int64_t B = 2, S = 3, H = 2, Dh = 4, chunks = 3;
  const int64_t C = chunks * H * Dh;
  HostTensor x = Random({B, S, C}, 39);
  const std::vector<float> fx = x.Floats();
  std::vector<HostTensor> parts;
  for (int64_t index = 0; index < chunks; ++index) {
    HostTensor y = MustRun("split_heads", {x}, {{"heads", H}, {"chunks", chunks}, {"index", index}});
    ASSERT_EQ(y.shape, (Shape{B, H, S, Dh}));
    std::vector<double> ref(y.size());
    for (int64_t i = 0; i < y.size(); ++i) {
      std::vector<int64_t> o = Unravel(i, y.shape);  // b, h, s, d
      ref[i] = fx[(o[0] * S + o[2]) * C + index * H * Dh + o[1] * Dh + o[3]];
    }
    ExpectNear(y.Floats(), ref, 0, "split_heads");
    parts.push_back(y);
    // A part alone: zeros elsewhere.
    HostTensor back = MustRun("split_heads_backward", {y}, {{"chunks", chunks}, {"index", index}});
    const std::vector<float> fb = back.Floats();
    for (int64_t i = 0; i < back.size(); ++i) {
      const int64_t col = i % C;
      const bool in_part = col / (H * Dh) == index;
      ASSERT_EQ(fb[i], in_part ? fx[i] : 0.0f) << i;
    }
  }
  // merge_heads of every part gives x back.
  EXPECT_EQ(MustRun("merge_heads", parts).bytes, x.bytes);
}

// ------------------------------------------------------------- errors

TEST(NativeKernelsTest, MismatchedOutputBufferIsAnError) {
  HostTensor a = Random({2, 3}, 40);
  const TensorType wrong{{3, 2}, kF32};
  RunOptions options;
  options.output_override = &wrong;
  absl::StatusOr<HostTensor> out = RunKernel("add", {a, a}, Json::object(), options);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("op add"), std::string::npos) << out.status();
  const TensorType wrong_dtype{{2, 3}, kF16};
  options.output_override = &wrong_dtype;
  EXPECT_FALSE(RunKernel("add", {a, a}, Json::object(), options).ok());
}

// ------------------------------------------------------------- determinism

struct OpCase {
  std::string op;
  std::vector<HostTensor> inputs;
  Json attrs;
};

std::vector<OpCase> DeterminismCases() {
  const Shape big = {4, 67, 301};  // ~80k elements: several reduction chunks
  HostTensor x = Random(big, 41), x2 = Random(big, 42), row = Random({301}, 43);
  HostTensor mask = MustRun("dropout_mask", {x}, {{"p", 0.2}, {"seed", 1}});
  HostTensor stats = MustRun("layernorm_stats", {x});
  std::vector<int64_t> targets(4 * 67);
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = (i * 37) % 301;
  HostTensor t = Ints({4, 67}, targets);
  std::vector<int64_t> ids(4 * 67);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 7) % 11;
  HostTensor idx = Ints({4, 67}, ids);
  HostTensor img = Random({2, 8, 33, 35}, 44), vol = Random({1, 4, 9, 10, 11}, 45);
  HostTensor gvol = Random({1, 4, 18, 20, 22}, 46);
  return {
      {"add", {x, row}, Json::object()},
      {"mul", {x, x2}, Json::object()},
      {"sum_to", {x}, {{"shape", {301}}}},
      {"sum", {x}, Json::object()},
      {"mse_loss", {x, x2}, Json::object()},
      {"softmax_cross_entropy", {x, t}, Json::object()},
      {"softmax_cross_entropy_backward", {x, t}, {{"axis", 2}}},
      {"layernorm_stats", {x}, Json::object()},
      {"layernorm", {x, stats, row, row}, Json::object()},
      {"layernorm_backward", {x2, x, stats, row}, Json::object()},
      {"layernorm_backward_weight", {x2, x, stats}, Json::object()},
      {"layernorm_backward_bias", {x2}, Json::object()},
      {"dropout", {x, mask}, {{"p", 0.2}}},
      {"pad", {x}, {{"pads", {1, -2, 3, 0}}}},
      {"concat", {x, x2}, {{"axis", 1}}},
      {"embedding_backward", {x, idx}, {{"num_embeddings", 11}}},
      {"global_avgpool", {img}, Json::object()},
      {"adaptive_avgpool", {img}, {{"output_size", {5, 7}}}},
      {"upsample", {vol}, {{"scale", 2}, {"mode", "trilinear"}, {"align_corners", true}}},
      {"upsample_backward", {gvol},
       {{"scale", 2}, {"mode", "trilinear"}, {"input_shape", {1, 4, 9, 10, 11}}}},
  };
}

TEST(NativeKernelsTest, BitwiseDeterministicAcrossAddressesAndThreadCounts) {
  for (const OpCase& c : DeterminismCases()) {
    RunOptions a, b;
    a.offset = 0;
    b.offset = 192;
    b.garbage = std::byte{0x3C};
    const HostTensor first = MustRun(c.op, c.inputs, c.attrs, a);
    const HostTensor second = MustRun(c.op, c.inputs, c.attrs, b);
    EXPECT_EQ(first.bytes, second.bytes) << c.op << " differs across addresses";
    cpu::SingleThreadScope one_thread;
    const HostTensor serial = MustRun(c.op, c.inputs, c.attrs, b);
    EXPECT_EQ(first.bytes, serial.bytes) << c.op << " depends on the thread count";
  }
}

// ------------------------------------------------------------- PyTorch

// Runs `script` with /usr/bin/python3 in `dir`; false when python3 or torch
// is missing.
bool TorchAvailable() {
  static const bool available =
      std::system("/usr/bin/python3 -c 'import torch, numpy' > /dev/null 2>&1") == 0;
  return available;
}

void Save(const std::string& path, const HostTensor& t) {
  NpyArray a;
  a.shape = t.shape;
  a.dtype = t.dtype;
  a.data.resize(t.bytes.size());
  std::memcpy(a.data.data(), t.bytes.data(), t.bytes.size());
  ASSERT_TRUE(WriteNpy(path, a).ok()) << path;
}

std::vector<float> Load(const std::string& path) {
  absl::StatusOr<NpyArray> a = ReadNpy(path);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return {};
  HostTensor t{a->shape, a->dtype, {}};
  t.bytes.resize(a->data.size());
  std::memcpy(t.bytes.data(), a->data.data(), a->data.size());
  return t.Floats();
}

TEST(NativeKernelsTest, MatchesPyTorch) {
  if (!TorchAvailable()) GTEST_SKIP() << "python3 with torch and numpy not found";
  const std::string dir =
      (std::filesystem::temp_directory_path() /
       absl::StrCat("pebble_native_torch_", ::getpid()))
          .string();
  std::filesystem::create_directories(dir);
  HostTensor img = Random({2, 3, 5, 7}, 50), vol = Random({1, 2, 3, 4, 5}, 51);
  HostTensor logits = Floats({3, 4, 2, 5}, RandomFloats(120, 52, -3, 3));
  std::vector<int64_t> tv(30);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = (i * 3 + 1) % 4;
  HostTensor target = Ints({3, 2, 5}, tv);
  HostTensor ln = Random({3, 4, 10}, 53), lw = Random({10}, 54), lb = Random({10}, 55),
             lg = Random({3, 4, 10}, 56), cubic_grad = Random({2, 3, 8, 11}, 57);
  for (auto& [name, t] : std::vector<std::pair<std::string, const HostTensor*>>{
           {"img", &img}, {"vol", &vol}, {"logits", &logits}, {"target", &target},
           {"ln", &ln}, {"lw", &lw}, {"lb", &lb}, {"lg", &lg}, {"cg", &cubic_grad}}) {
    Save(dir + "/" + name + ".npy", *t);
  }
  const std::string script = R"PY(
import sys, numpy as np, torch, torch.nn.functional as F
d = sys.argv[1]
L = lambda n: torch.from_numpy(np.load(f"{d}/{n}.npy"))
S = lambda n, t: np.save(f"{d}/out_{n}.npy", t.detach().numpy().astype(np.float32))
img, vol = L("img"), L("vol")
S("near2", F.interpolate(img, scale_factor=(2, 3), mode="nearest"))
S("bil", F.interpolate(img, scale_factor=2, mode="bilinear", align_corners=False))
S("bil_ac", F.interpolate(img, scale_factor=(3, 2), mode="bilinear", align_corners=True))
up = torch.nn.Upsample(scale_factor=2, mode="trilinear", align_corners=True)
S("tri_ac", up(vol))
S("tri", F.interpolate(vol, scale_factor=2, mode="trilinear", align_corners=False))
S("near3", F.interpolate(vol, scale_factor=3, mode="nearest"))
S("bil_size", F.interpolate(img, size=(7, 4), mode="bilinear", align_corners=False))
S("bil_frac", F.interpolate(img, scale_factor=(1.5, 0.6), mode="bilinear", align_corners=False))
S("bil_size_ac", F.interpolate(img, size=(3, 10), mode="bilinear", align_corners=True))
S("near_size", F.interpolate(img, size=(8, 3), mode="nearest"))
S("near_frac", F.interpolate(img, scale_factor=(2.5, 1.4), mode="nearest"))
S("tri_size", F.interpolate(vol, size=(4, 7, 3), mode="trilinear", align_corners=False))
S("cubic", F.interpolate(img, scale_factor=2, mode="bicubic", align_corners=False))
S("cubic_ac", F.interpolate(img, size=(8, 9), mode="bicubic", align_corners=True))
S("cubic_frac", F.interpolate(img, scale_factor=(1.5, 0.7), mode="bicubic", align_corners=False))
S("cubic_down", F.interpolate(img, size=(3, 4), mode="bicubic", align_corners=False))
ci = L("img").requires_grad_()
F.interpolate(ci, size=(8, 11), mode="bicubic", align_corners=False).backward(L("cg"))
S("cubic_dx", ci.grad)
S("adapt", F.adaptive_avg_pool2d(img, (3, 4)))
S("adapt3", F.adaptive_avg_pool3d(vol, (2, 3, 2)))
x = L("logits").requires_grad_()
loss = F.cross_entropy(x, L("target"))
loss.backward()
S("ce", loss); S("ce_grad", x.grad)
x, w, b = L("ln").requires_grad_(), L("lw").requires_grad_(), L("lb").requires_grad_()
y = F.layer_norm(x, (10,), w, b, 1e-5)
y.backward(L("lg"))
S("ln", y); S("ln_dx", x.grad); S("ln_dw", w.grad); S("ln_db", b.grad)
)PY";
  {
    std::ofstream(dir + "/ref.py") << script;
  }
  ASSERT_EQ(std::system(("/usr/bin/python3 " + dir + "/ref.py " + dir).c_str()), 0);
  auto check = [&](const std::string& name, const HostTensor& ours) {
    const std::vector<float> ref = Load(dir + "/out_" + name + ".npy");
    ExpectNear(ours.Floats(), ToDouble(ref), 1e-5, "torch " + name);
  };
  check("near2", MustRun("upsample", {img}, {{"scale", {2, 3}}}));
  check("bil", MustRun("upsample", {img}, {{"scale", 2}, {"mode", "bilinear"}}));
  check("bil_ac", MustRun("upsample", {img},
                          {{"scale", {3, 2}}, {"mode", "bilinear"}, {"align_corners", true}}));
  check("tri_ac", MustRun("upsample", {vol},
                          {{"scale", 2}, {"mode", "trilinear"}, {"align_corners", true}}));
  check("tri", MustRun("upsample", {vol}, {{"scale", 2}, {"mode", "trilinear"}}));
  check("near3", MustRun("upsample", {vol}, {{"scale", 3}}));
  // Sizes that are not multiples (PyTorch's step in / out), fractional
  // scale factors (step 1 / scale_factor, out = floor(in * scale_factor)),
  // downsampling.
  check("bil_size", MustRun("upsample", {img}, {{"size", {7, 4}}, {"mode", "bilinear"}}));
  check("bil_frac", MustRun("upsample", {img},
                            {{"size", {7, 4}}, {"scale_factor", {1.5, 0.6}}, {"mode", "bilinear"}}));
  check("bil_size_ac", MustRun("upsample", {img}, {{"size", {3, 10}}, {"mode", "bilinear"},
                                                   {"align_corners", true}}));
  check("near_size", MustRun("upsample", {img}, {{"size", {8, 3}}}));
  check("near_frac", MustRun("upsample", {img}, {{"size", {12, 9}}, {"scale_factor", {2.5, 1.4}}}));
  check("tri_size", MustRun("upsample", {vol}, {{"size", {4, 7, 3}}, {"mode", "trilinear"}}));
  // Bicubic: whole and fractional factors, sizes, downsampling, corners
  // aligned, and the gradient.
  check("cubic", MustRun("upsample", {img}, {{"scale", 2}, {"mode", "bicubic"}}));
  check("cubic_ac", MustRun("upsample", {img}, {{"size", {8, 9}}, {"mode", "bicubic"},
                                                {"align_corners", true}}));
  check("cubic_frac", MustRun("upsample", {img}, {{"size", {7, 4}}, {"scale_factor", {1.5, 0.7}},
                                                  {"mode", "bicubic"}}));
  check("cubic_down", MustRun("upsample", {img}, {{"size", {3, 4}}, {"mode", "bicubic"}}));
  check("cubic_dx", MustRun("upsample_backward", {cubic_grad},
                            {{"size", {8, 11}}, {"mode", "bicubic"},
                             {"input_shape", {2, 3, 5, 7}}}));
  check("adapt", MustRun("adaptive_avgpool", {img}, {{"output_size", {3, 4}}}));
  check("adapt3", MustRun("adaptive_avgpool", {vol}, {{"output_size", {2, 3, 2}}}));
  check("ce", MustRun("softmax_cross_entropy", {logits, target}));
  check("ce_grad", MustRun("softmax_cross_entropy_backward", {logits, target}, {{"axis", 1}}));
  HostTensor stats = MustRun("layernorm_stats", {ln});
  check("ln", MustRun("layernorm", {ln, stats, lw, lb}));
  check("ln_dx", MustRun("layernorm_backward", {lg, ln, stats, lw}));
  check("ln_dw", MustRun("layernorm_backward_weight", {lg, ln, stats}));
  check("ln_db", MustRun("layernorm_backward_bias", {lg}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pebble

