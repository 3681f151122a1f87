// The oneDNN kernel family of the CPU backend (runtime/cpu/dnnl_*.cc):
// every kernel against a straightforward reference in double (naive loops
// here), gradients also against finite differences, PyTorch's tie and
// padding rules, determinism across operand addresses, half precision,
// errors, and (when python3 with torch is present) a cross-check against
// PyTorch itself.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "graph/net_builder.h"
#include "graph/ops.h"
#include "graph/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/dnnl_util.h"
#include "runtime/kernel.h"
#include "runtime/npy.h"

namespace pebble {
namespace {

using Json = nlohmann::json;
using Vec = std::vector<float>;
using DVec = std::vector<double>;

const KernelTable& Table() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable();
    RegisterDnnlKernels(*t);
    return t;
  }();
  return *table;
}

// A 64-byte aligned buffer whose data starts `offset` bytes (a multiple of
// 64) past the aligned start, so that two runs see different addresses.
class Buffer {
 public:
  Buffer(int64_t bytes, int64_t offset) {
    const int64_t size = (bytes + offset + 64 + 63) / 64 * 64;
    storage_.reset(static_cast<std::byte*>(std::aligned_alloc(64, size)));
    // Garbage, not zeros: a kernel must write its whole output.
    std::memset(storage_.get(), 0x7f, size);
    data_ = storage_.get() + offset;
  }
  std::byte* data() const { return data_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> storage_;
  std::byte* data_ = nullptr;
};

void Store(const Vec& values, DType dtype, std::byte* data) {
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kFloat32:
        reinterpret_cast<float*>(data)[i] = values[i];
        break;
      case DType::kFloat16:
        reinterpret_cast<uint16_t*>(data)[i] =
            dnnl_internal::FloatToHalf(values[i]);
        break;
      case DType::kBFloat16:
        reinterpret_cast<uint16_t*>(data)[i] =
            dnnl_internal::FloatToBf16(values[i]);
        break;
      default:
        FAIL() << "unsupported dtype in test";
    }
  }
}

Vec Load(const std::byte* data, int64_t n, DType dtype) {
  Vec out(n);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kFloat32) {
      out[i] = reinterpret_cast<const float*>(data)[i];
    } else if (dtype == DType::kFloat16) {
      out[i] = dnnl_internal::HalfToFloat(
          reinterpret_cast<const uint16_t*>(data)[i]);
    } else {
      out[i] = dnnl_internal::Bf16ToFloat(
          reinterpret_cast<const uint16_t*>(data)[i]);
    }
  }
  return out;
}

// One node `out = op(in0, in1, ...)` of a real graph (NetBuilder infers the
// output type), run through the registered kernel.
class Case {
 public:
  Case(const std::string& op, std::vector<TensorType> inputs,
       Json attrs = Json::object()) {
    NetBuilder nb("t");
    std::vector<Value> values;
    for (size_t i = 0; i < inputs.size(); ++i) {
      values.push_back(nb.Input(absl::StrCat("in", i), inputs[i].shape,
                                inputs[i].dtype));
    }
    nb.Apply(op, values, std::move(attrs), "out");
    absl::StatusOr<Graph> g = nb.Build();
    build_status_ = g.status();
    if (!g.ok()) return;
    graph_ = std::move(*g);
    node_ = graph_.Find("out");
    inputs_ = std::move(inputs);
  }

  const absl::Status& build_status() const { return build_status_; }
  Shape out_shape() const { return *graph_.shape(node_); }
  DType out_dtype() const { return *graph_.dtype(node_); }
  int64_t out_size() const { return NumElements(out_shape()); }

  // Runs the kernel on `values` (one vector per input, as floats) with
  // every buffer `offset` bytes past a 64-byte boundary.
  absl::StatusOr<Vec> Run(const std::vector<Vec>& values,
                          int64_t offset = 0) const {
    RETURN_IF_ERROR(build_status_);
    KernelFn kernel = Table().Find(graph_.op(node_));
    if (kernel == nullptr) return absl::NotFoundError(graph_.op(node_));
    std::vector<Buffer> buffers;
    KernelContext ctx;
    ctx.graph = &graph_;
    ctx.node = node_;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      TensorView t{nullptr, inputs_[i].shape, inputs_[i].dtype};
      buffers.emplace_back(t.bytes(), offset);
      t.data = buffers.back().data();
      if (static_cast<int64_t>(values[i].size()) != t.num_elements()) {
        return absl::InvalidArgumentError("test: wrong input size");
      }
      Store(values[i], t.dtype, t.data);
      ctx.inputs.push_back(t);
    }
    TensorView out{nullptr, out_shape(), out_dtype()};
    buffers.emplace_back(out.bytes(), offset);
    out.data = buffers.back().data();
    ctx.output = out;
    RETURN_IF_ERROR(kernel(ctx));
    return Load(out.data, out.num_elements(), out.dtype);
  }

  // Runs with a hand-made output view (error tests).
  absl::Status RunWithOutput(const std::vector<Vec>& values,
                             TensorView out_type) const {
    KernelFn kernel = Table().Find(graph_.op(node_));
    std::vector<Buffer> buffers;
    KernelContext ctx;
    ctx.graph = &graph_;
    ctx.node = node_;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      TensorView t{nullptr, inputs_[i].shape, inputs_[i].dtype};
      buffers.emplace_back(t.bytes(), 0);
      t.data = buffers.back().data();
      Store(values[i], t.dtype, t.data);
      ctx.inputs.push_back(t);
    }
    buffers.emplace_back(out_type.bytes() + 4, 0);
    out_type.data = buffers.back().data();
    ctx.output = out_type;
    return kernel(ctx);
  }

 private:
  absl::Status build_status_;
  Graph graph_;
  NodeId node_ = kNoNode;
  std::vector<TensorType> inputs_;
};

Vec Random(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Small integers: many ties (max pooling).
Vec RandomInts(int64_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

// |got - want| <= atol + rtol |want| elementwise.
void ExpectNear(const Vec& got, const DVec& want, double rtol, double atol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i]))) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i]
                    << ", want " << want[i];
      if (++reported == 5) return;
    }
  }
}

void ExpectBitwiseEqual(const Vec& a, const Vec& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << what << " differs between runs";
}

// ---- Reference convolution over 3 spatial dims (2-D: D = 1).

// groups split the c input and o output channels; dil spaces the taps.
struct Conv {
  int64_t n, c, o, groups, in[3], k[3], s[3], p[3], dil[3], out[3];
};

Conv MakeConv(const Shape& x, const Shape& w, std::vector<int64_t> stride,
              std::vector<int64_t> pad, std::vector<int64_t> dilation = {},
              int64_t groups = 1) {
  Conv cv;
  cv.n = x[0];
  cv.c = x[1];
  cv.o = w[0];
  cv.groups = groups;
  const int d = static_cast<int>(x.size()) - 2;
  for (int i = 0; i < 3; ++i) {
    const int j = i - (3 - d);
    cv.in[i] = j < 0 ? 1 : x[2 + j];
    cv.k[i] = j < 0 ? 1 : w[2 + j];
    cv.s[i] = j < 0 ? 1 : stride[j];
    cv.p[i] = j < 0 ? 0 : pad[j];
    cv.dil[i] = j < 0 || dilation.empty() ? 1 : dilation[j];
    cv.out[i] =
        (cv.in[i] + 2 * cv.p[i] - cv.dil[i] * (cv.k[i] - 1) - 1) / cv.s[i] + 1;
  }
  return cv;
}

// Calls f(x index, w index, y index) for every multiply-add of the conv.
template <typename F>
void ForEachMac(const Conv& cv, F f) {
  for (int64_t n = 0; n < cv.n; ++n)
    for (int64_t o = 0; o < cv.o; ++o)
      for (int64_t od = 0; od < cv.out[0]; ++od)
        for (int64_t oh = 0; oh < cv.out[1]; ++oh)
          for (int64_t ow = 0; ow < cv.out[2]; ++ow) {
            const int64_t yi =
                (((n * cv.o + o) * cv.out[0] + od) * cv.out[1] + oh) *
                    cv.out[2] + ow;
            // Output channel o reads the input channels of its group.
            const int64_t per_group = cv.c / cv.groups;
            const int64_t first = o / (cv.o / cv.groups) * per_group;
            for (int64_t c = 0; c < per_group; ++c)
              for (int64_t kd = 0; kd < cv.k[0]; ++kd)
                for (int64_t kh = 0; kh < cv.k[1]; ++kh)
                  for (int64_t kw = 0; kw < cv.k[2]; ++kw) {
                    const int64_t id = od * cv.s[0] - cv.p[0] + kd * cv.dil[0];
                    const int64_t ih = oh * cv.s[1] - cv.p[1] + kh * cv.dil[1];
                    const int64_t iw = ow * cv.s[2] - cv.p[2] + kw * cv.dil[2];
                    if (id < 0 || id >= cv.in[0] || ih < 0 ||
                        ih >= cv.in[1] || iw < 0 || iw >= cv.in[2])
                      continue;
                    const int64_t xi =
                        (((n * cv.c + first + c) * cv.in[0] + id) * cv.in[1] +
                         ih) * cv.in[2] + iw;
                    const int64_t wi =
                        (((o * per_group + c) * cv.k[0] + kd) * cv.k[1] + kh) *
                            cv.k[2] + kw;
                    f(xi, wi, yi);
                  }
          }
}

int64_t OutSize(const Conv& cv) {
  return cv.n * cv.o * cv.out[0] * cv.out[1] * cv.out[2];
}

// ---- Convolution.

void CheckConv(const Shape& x_shape, const Shape& w_shape,
               std::vector<int64_t> stride, std::vector<int64_t> pad,
               bool bias, std::vector<int64_t> dilation = {},
               int64_t groups = 1) {
  const int d = static_cast<int>(x_shape.size()) - 2;
  const std::string base = d == 2 ? "conv2d" : "conv3d";
  SCOPED_TRACE(base + " x " + ShapeToString(x_shape) + " w " +
               ShapeToString(w_shape) + " groups " + std::to_string(groups));
  const Conv cv = MakeConv(x_shape, w_shape, stride, pad, dilation, groups);
  const Vec x = Random(NumElements(x_shape), 1);
  const Vec w = Random(NumElements(w_shape), 2);
  const Vec b = Random(cv.o, 3);
  Json attrs = {{"stride", stride}, {"padding", pad}};
  if (!dilation.empty()) attrs["dilation"] = dilation;
  if (groups != 1) attrs["groups"] = groups;
  std::vector<TensorType> in = {{x_shape}, {w_shape}};
  if (bias) in.push_back({{cv.o}});
  Case fwd(base, in, attrs);
  ASSERT_TRUE(fwd.build_status().ok()) << fwd.build_status();
  std::vector<Vec> values = {x, w};
  if (bias) values.push_back(b);
  absl::StatusOr<Vec> y = fwd.Run(values);
  ASSERT_TRUE(y.ok()) << y.status();
  DVec want(OutSize(cv), 0.0);
  ForEachMac(cv, [&](int64_t xi, int64_t wi, int64_t yi) {
    want[yi] += static_cast<double>(x[xi]) * w[wi];
  });
  const int64_t inner = cv.out[0] * cv.out[1] * cv.out[2];
  if (bias) {
    for (int64_t i = 0; i < OutSize(cv); ++i) want[i] += b[(i / inner) % cv.o];
  }
  ExpectNear(*y, want, 1e-5, 1e-5, base + " forward");

  // Backward: g is random; dx = sum over MACs g[y] w, dw = sum g[y] x.
  const Shape y_shape = fwd.out_shape();
  const Vec g = Random(NumElements(y_shape), 4);
  DVec dx(x.size(), 0.0), dw(w.size(), 0.0), db(cv.o, 0.0);
  ForEachMac(cv, [&](int64_t xi, int64_t wi, int64_t yi) {
    dx[xi] += static_cast<double>(g[yi]) * w[wi];
    dw[wi] += static_cast<double>(g[yi]) * x[xi];
  });
  for (int64_t i = 0; i < OutSize(cv); ++i) db[(i / inner) % cv.o] += g[i];
  Json data_attrs = attrs;
  data_attrs["input_shape"] = x_shape;
  Case bwd_data(base + "_backward_data", {{y_shape}, {w_shape}}, data_attrs);
  absl::StatusOr<Vec> got_dx = bwd_data.Run({g, w});
  ASSERT_TRUE(got_dx.ok()) << got_dx.status();
  ExpectNear(*got_dx, dx, 1e-5, 1e-5, base + "_backward_data");
  Json weight_attrs = attrs;
  weight_attrs["kernel"] = Shape(w_shape.begin() + 2, w_shape.end());
  Case bwd_w(base + "_backward_weight", {{y_shape}, {x_shape}}, weight_attrs);
  absl::StatusOr<Vec> got_dw = bwd_w.Run({g, x});
  ASSERT_TRUE(got_dw.ok()) << got_dw.status();
  ExpectNear(*got_dw, dw, 1e-5, 1e-5, base + "_backward_weight");
  Case bwd_b(base + "_backward_bias", {{y_shape}});
  absl::StatusOr<Vec> got_db = bwd_b.Run({g});
  ASSERT_TRUE(got_db.ok()) << got_db.status();
  ExpectNear(*got_db, db, 1e-5, 1e-5, base + "_backward_bias");

  // Determinism: other addresses, same bits.
  for (int64_t offset : {64, 192}) {
    absl::StatusOr<Vec> y2 = fwd.Run(values, offset);
    absl::StatusOr<Vec> dx2 = bwd_data.Run({g, w}, offset);
    absl::StatusOr<Vec> dw2 = bwd_w.Run({g, x}, offset);
    absl::StatusOr<Vec> db2 = bwd_b.Run({g}, offset);
    ASSERT_TRUE(y2.ok() && dx2.ok() && dw2.ok() && db2.ok());
    ExpectBitwiseEqual(*y, *y2, base);
    ExpectBitwiseEqual(*got_dx, *dx2, base + "_backward_data");
    ExpectBitwiseEqual(*got_dw, *dw2, base + "_backward_weight");
    ExpectBitwiseEqual(*got_db, *db2, base + "_backward_bias");
  }
}

TEST(DnnlConvTest, Conv2dOddSizesStridePadding) {
  CheckConv({2, 3, 7, 9}, {5, 3, 3, 3}, {2, 2}, {1, 1}, true);
  CheckConv({1, 2, 6, 5}, {4, 2, 3, 2}, {1, 2}, {0, 1}, false);
  CheckConv({3, 1, 5, 5}, {2, 1, 5, 5}, {1, 1}, {2, 2}, true);  // 1 channel
}

// Grouped (depthwise included) and dilated convolutions, forward and both
// backwards, against the reference loops.
TEST(DnnlConvTest, GroupedAndDilated) {
  CheckConv({2, 4, 7, 9}, {6, 2, 3, 3}, {1, 1}, {1, 1}, true, {}, 2);
  CheckConv({2, 6, 8, 7}, {6, 1, 3, 3}, {2, 1}, {1, 1}, true, {}, 6);  // depthwise
  CheckConv({1, 3, 9, 10}, {4, 3, 3, 2}, {1, 1}, {2, 1}, false, {2, 3});
  CheckConv({2, 4, 9, 9}, {8, 1, 3, 3}, {2, 2}, {2, 2}, false, {2, 2}, 4);
  CheckConv({1, 4, 6, 7, 8}, {4, 2, 3, 3, 2}, {1, 2, 1}, {1, 2, 0}, true,
            {1, 2, 3}, 2);
}

TEST(DnnlConvTest, Conv3dForwardAndBackward) {
  CheckConv({2, 2, 5, 6, 7}, {3, 2, 3, 3, 3}, {1, 1, 1}, {1, 1, 1}, true);
  CheckConv({1, 3, 7, 5, 6}, {2, 3, 3, 2, 3}, {2, 1, 2}, {1, 0, 1}, true);
}

// A larger conv3d backward-weight (the reduction oneDNN splits over
// threads) is bitwise reproducible across calls and addresses.
TEST(DnnlConvTest, Conv3dBackwardWeightDeterministicAtSize) {
  const Shape x_shape = {2, 4, 24, 24, 24};
  const Shape y_shape = {2, 8, 24, 24, 24};
  const Json attrs = {{"stride", 1}, {"padding", 1}, {"kernel", 3}};
  Case c("conv3d_backward_weight", {{y_shape}, {x_shape}}, attrs);
  const Vec g = Random(NumElements(y_shape), 5);
  const Vec x = Random(NumElements(x_shape), 6);
  absl::StatusOr<Vec> a = c.Run({g, x}, 0);
  absl::StatusOr<Vec> b = c.Run({g, x}, 320);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ExpectBitwiseEqual(*a, *b, "conv3d_backward_weight");
}

// ---- Linear and matmul.

TEST(DnnlLinearTest, ForwardAndBackwardOverLeadingDims) {
  const int64_t in = 5, out = 4;
  const Shape x_shape = {2, 3, in};
  const Vec x = Random(2 * 3 * in, 10);
  const Vec w = Random(out * in, 11);
  const Vec b = Random(out, 12);
  const int64_t m = 6;
  Case fwd("linear", {{x_shape}, {{out, in}}, {{out}}});
  absl::StatusOr<Vec> y = fwd.Run({x, w, b});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(fwd.out_shape(), (Shape{2, 3, out}));
  DVec want(m * out);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * w[o * in + k];
      want[i * out + o] = s;
    }
  ExpectNear(*y, want, 1e-5, 1e-6, "linear");
  Case no_bias("linear", {{x_shape}, {{out, in}}});
  absl::StatusOr<Vec> y2 = no_bias.Run({x, w});
  ASSERT_TRUE(y2.ok());
  for (int64_t i = 0; i < m * out; ++i) want[i] -= b[i % out];
  ExpectNear(*y2, want, 1e-5, 1e-6, "linear without bias");

  const Vec g = Random(m * out, 13);
  DVec dx(m * in, 0), dw(out * in, 0), db(out, 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < out; ++o) {
      db[o] += g[i * out + o];
      for (int64_t k = 0; k < in; ++k) {
        dx[i * in + k] += double(g[i * out + o]) * w[o * in + k];
        dw[o * in + k] += double(g[i * out + o]) * x[i * in + k];
      }
    }
  Case bd("linear_backward_data", {{{2, 3, out}}, {{out, in}}});
  Case bw("linear_backward_weight", {{{2, 3, out}}, {x_shape}});
  Case bb("linear_backward_bias", {{{2, 3, out}}});
  absl::StatusOr<Vec> got_dx = bd.Run({g, w});
  absl::StatusOr<Vec> got_dw = bw.Run({g, x});
  absl::StatusOr<Vec> got_db = bb.Run({g});
  ASSERT_TRUE(got_dx.ok() && got_dw.ok() && got_db.ok())
      << got_dx.status() << got_dw.status() << got_db.status();
  ExpectNear(*got_dx, dx, 1e-5, 1e-6, "linear_backward_data");
  ExpectNear(*got_dw, dw, 1e-5, 1e-6, "linear_backward_weight");
  ExpectNear(*got_db, db, 1e-5, 1e-6, "linear_backward_bias");
}

TEST(DnnlLinearTest, LargeBackwardIsDeterministic) {
  const Shape g_shape = {64, 37, 96}, x_shape = {64, 37, 80};
  const Vec g = Random(NumElements(g_shape), 20);
  const Vec x = Random(NumElements(x_shape), 21);
  Case bw("linear_backward_weight", {{g_shape}, {x_shape}});
  Case bb("linear_backward_bias", {{g_shape}});
  for (Case* c : {&bw, &bb}) {
    std::vector<Vec> values = {g};
    if (c == &bw) values.push_back(x);
    absl::StatusOr<Vec> a = c->Run(values, 0);
    absl::StatusOr<Vec> b = c->Run(values, 128);
    ASSERT_TRUE(a.ok() && b.ok());
    ExpectBitwiseEqual(*a, *b, "linear backward");
  }
}

TEST(DnnlMatmulTest, TransposesScaleAndBatchDims) {
  const int64_t m = 3, k = 5, n = 4;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Shape a_shape = ta ? Shape{2, 3, k, m} : Shape{2, 3, m, k};
      const Shape b_shape = tb ? Shape{2, 3, n, k} : Shape{2, 3, k, n};
      const Vec a = Random(NumElements(a_shape), 30);
      const Vec b = Random(NumElements(b_shape), 31);
      const double scale = 0.375;
      Case c("matmul", {{a_shape}, {b_shape}},
             {{"transpose_a", ta}, {"transpose_b", tb}, {"scale", scale}});
      absl::StatusOr<Vec> y = c.Run({a, b});
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_EQ(c.out_shape(), (Shape{2, 3, m, n}));
      DVec want(6 * m * n, 0);
      for (int64_t bi = 0; bi < 6; ++bi)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t q = 0; q < k; ++q) {
              const double av = ta ? a[bi * m * k + q * m + i]
                                   : a[bi * m * k + i * k + q];
              const double bv = tb ? b[bi * k * n + j * k + q]
                                   : b[bi * k * n + q * n + j];
              s += av * bv;
            }
            want[(bi * m + i) * n + j] = scale * s;
          }
      ExpectNear(*y, want, 1e-5, 1e-6,
                 absl::StrCat("matmul ta=", ta, " tb=", tb));
    }
  }
}

// ---- Pooling.

struct Pool {
  int64_t planes, in[3], out[3], k[3], s[3], p[3];
};

Pool MakePool(const Shape& x, std::vector<int64_t> k, std::vector<int64_t> s,
              std::vector<int64_t> p) {
  Pool pl;
  pl.planes = x[0] * x[1];
  const int d = static_cast<int>(x.size()) - 2;
  for (int i = 0; i < 3; ++i) {
    const int j = i - (3 - d);
    pl.in[i] = j < 0 ? 1 : x[2 + j];
    pl.k[i] = j < 0 ? 1 : k[j];
    pl.s[i] = j < 0 ? 1 : s[j];
    pl.p[i] = j < 0 ? 0 : p[j];
    pl.out[i] = (pl.in[i] + 2 * pl.p[i] - pl.k[i]) / pl.s[i] + 1;
  }
  return pl;
}

// Calls f(y index, list of in-bounds x indices in row-major window order,
// window size including padding).
template <typename F>
void ForEachWindow(const Pool& pl, F f) {
  const int64_t in_plane = pl.in[0] * pl.in[1] * pl.in[2];
  int64_t yi = 0;
  for (int64_t q = 0; q < pl.planes; ++q)
    for (int64_t od = 0; od < pl.out[0]; ++od)
      for (int64_t oh = 0; oh < pl.out[1]; ++oh)
        for (int64_t ow = 0; ow < pl.out[2]; ++ow, ++yi) {
          std::vector<int64_t> xs;
          for (int64_t kd = 0; kd < pl.k[0]; ++kd)
            for (int64_t kh = 0; kh < pl.k[1]; ++kh)
              for (int64_t kw = 0; kw < pl.k[2]; ++kw) {
                const int64_t id = od * pl.s[0] - pl.p[0] + kd;
                const int64_t ih = oh * pl.s[1] - pl.p[1] + kh;
                const int64_t iw = ow * pl.s[2] - pl.p[2] + kw;
                if (id < 0 || id >= pl.in[0] || ih < 0 || ih >= pl.in[1] ||
                    iw < 0 || iw >= pl.in[2])
                  continue;
                xs.push_back(q * in_plane +
                             (id * pl.in[1] + ih) * pl.in[2] + iw);
              }
          f(yi, xs, pl.k[0] * pl.k[1] * pl.k[2]);
        }
}

void CheckPool(const Shape& x_shape, std::vector<int64_t> k,
               std::vector<int64_t> s, std::vector<int64_t> p) {
  const Pool pl = MakePool(x_shape, k, s, p);
  // Integers in [0, 3]: windows have ties, which PyTorch breaks in favour
  // of the first element in row-major window order.
  const Vec x = RandomInts(NumElements(x_shape), 40, 0, 3);
  const Json attrs = {{"kernel", k}, {"stride", s}, {"padding", p}};
  Case maxpool("maxpool", {{x_shape}}, attrs);
  Case avgpool("avgpool", {{x_shape}}, attrs);
  ASSERT_TRUE(maxpool.build_status().ok()) << maxpool.build_status();
  const Shape y_shape = maxpool.out_shape();
  const int64_t ny = NumElements(y_shape);
  DVec ymax(ny), yavg(ny), dmax(x.size(), 0), davg(x.size(), 0);
  const Vec g = Random(ny, 41);
  ForEachWindow(pl, [&](int64_t yi, const std::vector<int64_t>& xs,
                        int64_t size) {
    int64_t arg = xs[0];
    float best = -std::numeric_limits<float>::infinity();
    double sum = 0;
    for (int64_t xi : xs) {
      if (x[xi] > best) {
        best = x[xi];
        arg = xi;
      }
      sum += x[xi];
    }
    ymax[yi] = best;
    yavg[yi] = sum / size;  // count_include_pad
    dmax[arg] += g[yi];
    for (int64_t xi : xs) davg[xi] += g[yi] / size;
  });
  absl::StatusOr<Vec> got_max = maxpool.Run({x});
  absl::StatusOr<Vec> got_avg = avgpool.Run({x});
  ASSERT_TRUE(got_max.ok() && got_avg.ok())
      << got_max.status() << got_avg.status();
  ExpectNear(*got_max, ymax, 0, 0, "maxpool");
  ExpectNear(*got_avg, yavg, 1e-6, 1e-6, "avgpool");
  Case max_bwd("maxpool_backward", {{y_shape}, {x_shape}}, attrs);
  Json avg_attrs = attrs;
  avg_attrs["input_shape"] = x_shape;
  Case avg_bwd("avgpool_backward", {{y_shape}}, avg_attrs);
  absl::StatusOr<Vec> got_dmax = max_bwd.Run({g, x});
  absl::StatusOr<Vec> got_davg = avg_bwd.Run({g});
  ASSERT_TRUE(got_dmax.ok() && got_davg.ok())
      << got_dmax.status() << got_davg.status();
  ExpectNear(*got_dmax, dmax, 1e-6, 1e-6, "maxpool_backward");
  ExpectNear(*got_davg, davg, 1e-6, 1e-6, "avgpool_backward");
  absl::StatusOr<Vec> again = max_bwd.Run({g, x}, 256);
  ASSERT_TRUE(again.ok());
  ExpectBitwiseEqual(*got_dmax, *again, "maxpool_backward");
}

TEST(DnnlPoolTest, TwoDimensionalWithTiesOverlapAndPadding) {
  CheckPool({2, 3, 7, 8}, {3, 3}, {2, 2}, {1, 1});  // overlapping windows
  CheckPool({1, 2, 6, 6}, {2, 2}, {2, 2}, {0, 0});  // PyTorch's default
  CheckPool({1, 1, 5, 7}, {3, 2}, {1, 2}, {1, 0});
}

// Max pooling in PyTorch's ceil mode: the last window may reach past the
// input (and its padding), and is clipped; one that would start in the right
// padding is dropped (in 5, kernel 2, stride 2, padding 1: 3 windows, not 4).
TEST(DnnlPoolTest, MaxPoolCeilMode) {
  struct CeilCase {
    Shape x;
    std::vector<int64_t> k, s, p, out;
  };
  for (const CeilCase& c : {CeilCase{{2, 3, 6, 7}, {3, 3}, {2, 2}, {0, 0}, {3, 3}},
                            CeilCase{{1, 2, 5, 5}, {2, 2}, {2, 2}, {1, 1}, {3, 3}},
                            CeilCase{{1, 2, 8, 9}, {3, 2}, {2, 3}, {1, 1}, {5, 4}},
                            CeilCase{{1, 1, 5, 6, 7}, {2, 3, 2}, {2, 2, 3}, {0, 1, 1},
                                     {3, 4, 3}}}) {
    SCOPED_TRACE(ShapeToString(c.x));
    Pool pl = MakePool(c.x, c.k, c.s, c.p);
    for (size_t i = 0; i < c.out.size(); ++i) pl.out[3 - c.out.size() + i] = c.out[i];
    const Vec x = RandomInts(NumElements(c.x), 42, 0, 3);
    const Json attrs = {{"kernel", c.k}, {"stride", c.s}, {"padding", c.p}, {"ceil_mode", true}};
    Case maxpool("maxpool", {{c.x}}, attrs);
    ASSERT_TRUE(maxpool.build_status().ok()) << maxpool.build_status();
    const Shape y_shape = maxpool.out_shape();
    EXPECT_EQ(Shape(y_shape.begin() + 2, y_shape.end()), Shape(c.out.begin(), c.out.end()));
    const int64_t ny = NumElements(y_shape);
    DVec ymax(ny), dmax(x.size(), 0);
    const Vec g = Random(ny, 43);
    ForEachWindow(pl, [&](int64_t yi, const std::vector<int64_t>& xs, int64_t) {
      ASSERT_FALSE(xs.empty());
      int64_t arg = xs[0];
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t xi : xs) {
        if (x[xi] > best) {
          best = x[xi];
          arg = xi;
        }
      }
      ymax[yi] = best;
      dmax[arg] += g[yi];
    });
    absl::StatusOr<Vec> got = maxpool.Run({x});
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectNear(*got, ymax, 0, 0, "maxpool ceil_mode");
    Case bwd("maxpool_backward", {{y_shape}, {c.x}}, attrs);
    absl::StatusOr<Vec> got_d = bwd.Run({g, x});
    ASSERT_TRUE(got_d.ok()) << got_d.status();
    ExpectNear(*got_d, dmax, 1e-6, 1e-6, "maxpool_backward ceil_mode");
  }
  // Average pooling's edge divisor in ceil mode is not PyTorch's: refused.
  Case avg("avgpool", {{Shape{1, 1, 6, 6}}},
           {{"kernel", 3}, {"stride", 2}, {"ceil_mode", true}});
  EXPECT_FALSE(avg.build_status().ok());
}

TEST(DnnlPoolTest, ThreeDimensional) {
  CheckPool({1, 2, 5, 6, 7}, {2, 2, 2}, {2, 2, 2}, {0, 0, 0});
  CheckPool({2, 1, 5, 5, 5}, {3, 3, 3}, {2, 1, 2}, {1, 1, 1});
}

// All -inf in a window but one NaN: PyTorch takes the NaN's position; all
// -inf: the first element.
TEST(DnnlPoolTest, MaxPoolBackwardNanAndInfinityRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const Vec x = {-inf, -inf, -inf, -inf,  // window 0: all -inf
                 1, std::nanf(""), 3, 2};  // window 1: NaN wins
  Case c("maxpool_backward", {{{1, 1, 1, 2}}, {{1, 1, 1, 8}}},
         {{"kernel", Json::array({1, 4})}});
  absl::StatusOr<Vec> dx = c.Run({{10, 20}, x});
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ(*dx, (Vec{10, 0, 0, 0, 0, 20, 0, 0}));
}

// ---- Activations and softmax.

double Gelu(double x, bool tanh_mode) {
  if (tanh_mode) {
    const double c = std::sqrt(2 / M_PI);
    return 0.5 * x * (1 + std::tanh(c * (x + 0.044715 * x * x * x)));
  }
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

TEST(DnnlEltwiseTest, ActivationsAndGradients) {
  const Shape shape = {3, 7, 11};  // 231 elements: not a multiple of a vector
  const Vec x = Random(NumElements(shape), 50, -4, 4);
  const Vec g = Random(NumElements(shape), 51);
  const int64_t n = x.size();
  struct Activation {
    std::string op;
    Json attrs;
    double (*f)(double);
  };
  const std::vector<Activation> acts = {
      {"tanh", Json::object(), [](double v) { return std::tanh(v); }},
      {"sigmoid", Json::object(),
       [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"gelu", Json::object(), [](double v) { return Gelu(v, false); }},
      {"gelu", {{"approximate", "tanh"}},
       [](double v) { return Gelu(v, true); }}};
  for (const Activation& a : acts) {
    SCOPED_TRACE(a.op + a.attrs.dump());
    Case fwd(a.op, {{shape}}, a.attrs);
    absl::StatusOr<Vec> y = fwd.Run({x});
    ASSERT_TRUE(y.ok()) << y.status();
    DVec want(n), dx(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = a.f(x[i]);
      // Central difference in double of the reference function.
      const double h = 1e-5;
      dx[i] = g[i] * (a.f(x[i] + h) - a.f(x[i] - h)) / (2 * h);
    }
    ExpectNear(*y, want, 1e-5, 1e-6, a.op);
    // tanh and sigmoid read y; gelu reads x.
    const bool reads_y = a.op != "gelu";
    Case bwd(a.op + "_backward", {{shape}, {shape}}, a.attrs);
    absl::StatusOr<Vec> got = bwd.Run({g, reads_y ? *y : x});
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectNear(*got, dx, 1e-4, 1e-5, a.op + "_backward");
  }
}

TEST(DnnlSoftmaxTest, ForwardBackwardPlainAndCausal) {
  const Shape shape = {2, 3, 5, 5};
  const int64_t rows = 2 * 3 * 5, cols = 5;
  const Vec x = Random(rows * cols, 60, -3, 3);
  const Vec g = Random(rows * cols, 61);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "plain");
    Json attrs = Json::object();
    if (causal) attrs["causal"] = true;
    Case fwd("softmax", {{shape}}, attrs);
    absl::StatusOr<Vec> y = fwd.Run({x});
    ASSERT_TRUE(y.ok()) << y.status();
    DVec want(rows * cols, 0), dx(rows * cols, 0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t keep = causal ? r % 5 + 1 : cols;
      double mx = -1e300, sum = 0, dot = 0;
      for (int64_t j = 0; j < keep; ++j) mx = std::max<double>(mx, x[r * cols + j]);
      for (int64_t j = 0; j < keep; ++j) sum += std::exp(x[r * cols + j] - mx);
      for (int64_t j = 0; j < keep; ++j) {
        want[r * cols + j] = std::exp(x[r * cols + j] - mx) / sum;
        dot += want[r * cols + j] * g[r * cols + j];
      }
      for (int64_t j = 0; j < cols; ++j) {
        dx[r * cols + j] = want[r * cols + j] * (g[r * cols + j] - dot);
      }
    }
    ExpectNear(*y, want, 1e-5, 1e-7, "softmax");
    if (causal) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = r % 5 + 1; j < cols; ++j)
          EXPECT_EQ((*y)[r * cols + j], 0.0f) << "masked " << r << "," << j;
    }
    Case bwd("softmax_backward", {{shape}, {shape}}, attrs);
    absl::StatusOr<Vec> got = bwd.Run({g, *y});
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectNear(*got, dx, 1e-5, 1e-6, "softmax_backward");
  }
}

// log_softmax: x - max - log(sum(exp(x - max))) per row of the last dim;
// its backward g - exp(y) sum(g), against fp64 references.
TEST(DnnlSoftmaxTest, LogSoftmaxForwardBackward) {
  const Shape shape = {3, 4, 7};
  const int64_t rows = 12, cols = 7;
  Vec x = Random(rows * cols, 62, -30, 30);
  x[5] = -1e4f;  // a probability below fp32's range: its log is still finite
  const Vec g = Random(rows * cols, 63);
  Case fwd("log_softmax", {{shape}});
  absl::StatusOr<Vec> y = fwd.Run({x});
  ASSERT_TRUE(y.ok()) << y.status();
  DVec want(rows * cols, 0), dx(rows * cols, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -1e300, sum = 0, gsum = 0;
    for (int64_t j = 0; j < cols; ++j) mx = std::max<double>(mx, x[r * cols + j]);
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(x[r * cols + j] - mx);
    for (int64_t j = 0; j < cols; ++j) gsum += g[r * cols + j];
    for (int64_t j = 0; j < cols; ++j) {
      want[r * cols + j] = x[r * cols + j] - mx - std::log(sum);
      dx[r * cols + j] = g[r * cols + j] - std::exp(want[r * cols + j]) * gsum;
    }
  }
  ExpectNear(*y, want, 1e-5, 1e-5, "log_softmax");
  Case bwd("log_softmax_backward", {{shape}, {shape}});
  absl::StatusOr<Vec> got = bwd.Run({g, *y});
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectNear(*got, dx, 1e-5, 1e-6, "log_softmax_backward");
}

// ---- Batch norm.

struct BnRef {
  DVec mean, invstd, y, dx, dw, db;
};

// Training-mode batch norm in double, x (N, C, inner).
BnRef BatchNormRef(const Vec& x, const Vec& w, const Vec& b, const Vec& g,
                   int64_t n, int64_t c, int64_t inner, double eps) {
  BnRef r;
  const double count = static_cast<double>(n * inner);
  r.mean.assign(c, 0);
  r.invstd.assign(c, 0);
  r.y.assign(x.size(), 0);
  r.dx.assign(x.size(), 0);
  r.dw.assign(c, 0);
  r.db.assign(c, 0);
  auto at = [&](int64_t i, int64_t ch, int64_t j) {
    return (i * c + ch) * inner + j;
  };
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0, sq = 0, dot = 0, sg = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) s += x[at(i, ch, j)];
    const double mean = s / count;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) {
        const double d = x[at(i, ch, j)] - mean;
        sq += d * d;
      }
    const double invstd = 1 / std::sqrt(sq / count + eps);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) {
        const int64_t k = at(i, ch, j);
        const double xhat = (x[k] - mean) * invstd;
        r.y[k] = xhat * w[ch] + b[ch];
        sg += g[k];
        dot += g[k] * xhat;
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) {
        const int64_t k = at(i, ch, j);
        const double xhat = (x[k] - mean) * invstd;
        r.dx[k] = w[ch] * invstd * (g[k] - sg / count - xhat * dot / count);
      }
    r.mean[ch] = mean;
    r.invstd[ch] = invstd;
    r.dw[ch] = dot;
    r.db[ch] = sg;
  }
  return r;
}

TEST(DnnlBatchNormTest, StatsForwardAndGradients) {
  const int64_t n = 3, c = 4, inner = 5 * 7;
  const Shape shape = {n, c, 5, 7};
  const Vec x = Random(n * c * inner, 70, -2, 3);
  const Vec w = Random(c, 71, 0.5, 1.5);
  const Vec b = Random(c, 72);
  const Vec g = Random(n * c * inner, 73);
  const double eps = 1e-3;
  const Json attrs = {{"eps", eps}};
  const BnRef ref = BatchNormRef(x, w, b, g, n, c, inner, eps);

  Case stats("batchnorm_stats", {{shape}}, attrs);
  absl::StatusOr<Vec> st = stats.Run({x});
  ASSERT_TRUE(st.ok()) << st.status();
  DVec want_stats = ref.mean;
  want_stats.insert(want_stats.end(), ref.invstd.begin(), ref.invstd.end());
  ExpectNear(*st, want_stats, 1e-6, 1e-6, "batchnorm_stats");

  const TensorType param{{c}};
  Case fwd("batchnorm", {{shape}, {{2, c}}, param, param}, attrs);
  absl::StatusOr<Vec> y = fwd.Run({x, *st, w, b});
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectNear(*y, ref.y, 1e-5, 1e-5, "batchnorm");

  Case bwd("batchnorm_backward", {{shape}, {shape}, {{2, c}}, param}, attrs);
  absl::StatusOr<Vec> dx = bwd.Run({g, x, *st, w});
  ASSERT_TRUE(dx.ok()) << dx.status();
  ExpectNear(*dx, ref.dx, 1e-4, 1e-5, "batchnorm_backward");
  Case bwd_w("batchnorm_backward_weight", {{shape}, {shape}, {{2, c}}}, attrs);
  absl::StatusOr<Vec> dw = bwd_w.Run({g, x, *st});
  ASSERT_TRUE(dw.ok()) << dw.status();
  ExpectNear(*dw, ref.dw, 1e-5, 1e-5, "batchnorm_backward_weight");
  Case bwd_b("batchnorm_backward_bias", {{shape}});
  absl::StatusOr<Vec> db = bwd_b.Run({g});
  ASSERT_TRUE(db.ok()) << db.status();
  ExpectNear(*db, ref.db, 1e-5, 1e-5, "batchnorm_backward_bias");

  // The data gradient against finite differences of the double reference:
  // L(x) = sum(g * batchnorm(x)) with the statistics recomputed from x.
  for (int64_t k : {0L, 17L, 100L, n * c * inner - 1}) {
    const double h = 1e-3;
    Vec xp = x, xm = x;
    xp[k] += h;
    xm[k] -= h;
    const BnRef rp = BatchNormRef(xp, w, b, g, n, c, inner, eps);
    const BnRef rm = BatchNormRef(xm, w, b, g, n, c, inner, eps);
    double lp = 0, lm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      lp += g[i] * rp.y[i];
      lm += g[i] * rm.y[i];
    }
    // xp[k] - xm[k] is not exactly 2h in float.
    const double fd = (lp - lm) / (double(xp[k]) - double(xm[k]));
    EXPECT_NEAR((*dx)[k], fd, 2e-3 * std::max(1.0, std::abs(fd))) << k;
  }

  // Without weight and bias: (x, stats) and the 3-input backward.
  Case plain("batchnorm", {{shape}, {{2, c}}}, attrs);
  absl::StatusOr<Vec> y2 = plain.Run({x, *st});
  ASSERT_TRUE(y2.ok()) << y2.status();
  const Vec ones(c, 1.0f), zeros(c, 0.0f);
  const BnRef ref1 = BatchNormRef(x, ones, zeros, g, n, c, inner, eps);
  ExpectNear(*y2, ref1.y, 1e-5, 1e-5, "batchnorm without affine");
  Case plain_bwd("batchnorm_backward", {{shape}, {shape}, {{2, c}}}, attrs);
  absl::StatusOr<Vec> dx2 = plain_bwd.Run({g, x, *st});
  ASSERT_TRUE(dx2.ok()) << dx2.status();
  ExpectNear(*dx2, ref1.dx, 1e-4, 1e-5, "batchnorm_backward without weight");
}

TEST(DnnlBatchNormTest, LargeReductionsAreDeterministicAndAccurate) {
  // 2 x 3 x 40000: channels span several reduction blocks.
  const Shape shape = {2, 3, 200, 200};
  const int64_t size = NumElements(shape);
  const Vec x = Random(size, 80, 9.0f, 11.0f);  // mean far from 0
  const Vec g = Random(size, 81);
  Case stats("batchnorm_stats", {{shape}});
  absl::StatusOr<Vec> a = stats.Run({x}, 0);
  absl::StatusOr<Vec> b = stats.Run({x}, 64);
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectBitwiseEqual(*a, *b, "batchnorm_stats");
  const Vec w(3, 1.0f), bias(3, 0.0f);
  const BnRef ref = BatchNormRef(x, w, bias, g, 2, 3, 40000, 1e-5);
  DVec want = ref.mean;
  want.insert(want.end(), ref.invstd.begin(), ref.invstd.end());
  ExpectNear(*a, want, 1e-6, 0, "batchnorm_stats at size");
  Case bwd("batchnorm_backward", {{shape}, {shape}, {{2, 3}}});
  absl::StatusOr<Vec> d1 = bwd.Run({g, x, *a}, 0);
  absl::StatusOr<Vec> d2 = bwd.Run({g, x, *a}, 448);
  ASSERT_TRUE(d1.ok() && d2.ok());
  ExpectBitwiseEqual(*d1, *d2, "batchnorm_backward");
}

// ---- Half precision, errors, registration.

TEST(DnnlHalfTest, Fp16AndBf16ComputeInFloatAndRoundOnStore) {
  const Shape x_shape = {1, 2, 5, 5}, w_shape = {3, 2, 3, 3};
  // Values exactly representable in both half formats.
  const Vec x = RandomInts(NumElements(x_shape), 90, -4, 4);
  const Vec w = RandomInts(NumElements(w_shape), 91, -2, 2);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    Case c("conv2d", {{x_shape, dtype}, {w_shape, dtype}}, {{"padding", 1}});
    ASSERT_EQ(c.out_dtype(), dtype);
    absl::StatusOr<Vec> y = c.Run({x, w});
    ASSERT_TRUE(y.ok()) << y.status();
    Case f32("conv2d", {{x_shape}, {w_shape}}, {{"padding", 1}});
    absl::StatusOr<Vec> want = f32.Run({x, w});
    ASSERT_TRUE(want.ok());
    // Integer sums below 256: exact in fp32 and in both half formats.
    ExpectNear(*y, DVec(want->begin(), want->end()), 0, 0, "half conv2d");
    // An eltwise primitive in half precision: fp32's result, rounded.
    Case t("tanh", {{x_shape, dtype}});
    absl::StatusOr<Vec> ty = t.Run({x});
    ASSERT_TRUE(ty.ok()) << ty.status();
    DVec tanh_x(x.size());
    for (size_t i = 0; i < x.size(); ++i) tanh_x[i] = std::tanh(static_cast<double>(x[i]));
    ExpectNear(*ty, tanh_x, dtype == DType::kFloat16 ? 1e-3 : 8e-3, 0, "half tanh");
  }
  EXPECT_GT(DnnlScratchPeakBytes(), 0);  // the fp32 copies were counted
  // Rounding: 1 + 2^-11 is a tie between two fp16 values -> even (1.0);
  // 1 + 3 * 2^-11 rounds up to 1 + 2^-9.
  EXPECT_EQ(dnnl_internal::FloatToHalf(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(dnnl_internal::FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(dnnl_internal::FloatToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(dnnl_internal::HalfToFloat(0x0001), 0x1p-24f);  // subnormal
  EXPECT_EQ(dnnl_internal::FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(dnnl_internal::FloatToHalf(65520.0f), 0x7c00);  // overflow
}

TEST(DnnlErrorsTest, BadOperandsAreInvalidArgument) {
  Case c("conv2d", {{{1, 2, 5, 5}}, {{3, 2, 3, 3}}});
  const Vec x(50, 1.0f), w(54, 1.0f);
  // Wrong output shape.
  absl::Status s = c.RunWithOutput({x, w}, TensorView{nullptr, {1, 3, 4, 4}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("output"), std::string::npos) << s;
  // Wrong output dtype.
  s = c.RunWithOutput({x, w},
                      TensorView{nullptr, {1, 3, 3, 3}, DType::kInt64});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // A good call through the same path works.
  EXPECT_TRUE(c.RunWithOutput({x, w}, TensorView{nullptr, {1, 3, 3, 3}}).ok());
  // Bad window attrs read by the kernel (a graph built without checks).
  GraphBuilder gb("bad");
  NodeSpec in;
  in.id = "x";
  in.bytes = 4 * 16;
  in.persistent = true;
  in.shape = Shape{1, 1, 4, 4};
  in.dtype = DType::kFloat32;
  gb.AddNode(in);
  NodeSpec pool;
  pool.id = "p";
  pool.op = "maxpool";
  pool.bytes = 16;
  pool.inputs = {"x"};
  pool.shape = Shape{1, 1, 2, 2};
  pool.dtype = DType::kFloat32;
  pool.attrs = {{"kernel", "two"}};
  gb.AddNode(pool);
  gb.AddOutput("p");
  absl::StatusOr<Graph> g = gb.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  Buffer xb(64, 0), yb(16, 0);
  KernelContext ctx;
  ctx.graph = &*g;
  ctx.node = g->Find("p");
  ctx.inputs = {TensorView{xb.data(), {1, 1, 4, 4}}};
  ctx.output = TensorView{yb.data(), {1, 1, 2, 2}};
  s = Table().Find("maxpool")(ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("kernel"), std::string::npos) << s;
}

TEST(DnnlRegistryTest, EveryOpIsInTheOperatorTable) {
  KernelTable table;
  RegisterDnnlKernels(table);
  const std::vector<std::string> ops = table.Ops();
  EXPECT_EQ(ops.size(), 32u);  // relu and relu_backward are own kernels (NaN kept)
  for (const std::string& op : ops) EXPECT_NE(FindOp(op), nullptr) << op;
  for (const char* op : {"conv3d_backward_weight", "matmul", "maxpool_backward",
                         "batchnorm_backward_bias", "softmax_backward"}) {
    EXPECT_NE(table.Find(op), nullptr) << op;
  }
}

// ---- Cross-check against PyTorch (skipped without python3 + torch).

std::string TempDir() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("pebble_dnnl_test_", ::getpid());
  std::filesystem::create_directories(dir);
  return dir.string();
}

bool HaveTorch() {
  return std::system("/usr/bin/python3 -c 'import torch, numpy' "
                     ">/dev/null 2>&1") == 0;
}

void SaveNpy(const std::string& path, const Shape& shape, const Vec& v) {
  NpyArray a;
  a.shape = shape;
  a.dtype = DType::kFloat32;
  a.data.resize(v.size() * sizeof(float));
  std::memcpy(a.data.data(), v.data(), a.data.size());
  ASSERT_TRUE(WriteNpy(path, a).ok()) << path;
}

Vec LoadNpy(const std::string& path) {
  absl::StatusOr<NpyArray> a = ReadNpy(path);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return {};
  Vec v(a->data.size() / sizeof(float));
  std::memcpy(v.data(), a->data.data(), a->data.size());
  return v;
}

void ExpectRelClose(const Vec& got, const Vec& want, double rtol,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), rtol) << what;
}

TEST(DnnlTorchTest, MatchesPyTorch) {
  if (!HaveTorch()) GTEST_SKIP() << "python3 with torch and numpy not found";
  const std::string dir = TempDir();
  const Shape x_shape = {2, 3, 6, 7, 5}, w_shape = {4, 3, 3, 3, 3};
  const Vec x = RandomInts(NumElements(x_shape), 100, -3, 3);  // pool ties
  const Vec w = Random(NumElements(w_shape), 101);
  const Vec b = Random(4, 102);
  SaveNpy(dir + "/x.npy", x_shape, x);
  SaveNpy(dir + "/w.npy", w_shape, w);
  SaveNpy(dir + "/b.npy", {4}, b);
  const std::string script = dir + "/check.py";
  {
    std::ofstream py(script);
    py << R"(import sys, numpy as np, torch
import torch.nn.functional as F
d = sys.argv[1]
x = torch.from_numpy(np.load(d + '/x.npy')).requires_grad_()
w = torch.from_numpy(np.load(d + '/w.npy')).requires_grad_()
b = torch.from_numpy(np.load(d + '/b.npy')).requires_grad_()
y = F.conv3d(x, w, b, stride=(1, 2, 1), padding=1)
p = F.max_pool3d(x, 3, stride=2, padding=1)
bn = F.batch_norm(y, None, None, training=True, eps=1e-5)
gl = F.gelu(bn)
loss = gl.square().sum() + (p * p.detach()).sum() + (y * y.detach()).sum()
loss.backward()
for name, t in [('y', y), ('p', p), ('bn', bn), ('gl', gl)]:
    np.save(d + '/' + name + '_t.npy', t.detach().numpy())
np.save(d + '/dx_t.npy', x.grad.numpy())
np.save(d + '/dw_t.npy', w.grad.numpy())
np.save(d + '/db_t.npy', b.grad.numpy())
)";
  }
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + dir).c_str()), 0);
  const Json conv_attrs = {{"stride", Json::array({1, 2, 1})}, {"padding", 1}};
  Case conv("conv3d", {{x_shape}, {w_shape}, {{4}}}, conv_attrs);
  absl::StatusOr<Vec> y = conv.Run({x, w, b});
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectRelClose(*y, LoadNpy(dir + "/y_t.npy"), 1e-6, "conv3d");
  const Shape y_shape = conv.out_shape();
  const Json pool_attrs = {{"kernel", 3}, {"stride", 2}, {"padding", 1}};
  Case pool("maxpool", {{x_shape}}, pool_attrs);
  absl::StatusOr<Vec> p = pool.Run({x});
  ASSERT_TRUE(p.ok());
  ExpectRelClose(*p, LoadNpy(dir + "/p_t.npy"), 0, "maxpool3d");
  Case stats("batchnorm_stats", {{y_shape}});
  absl::StatusOr<Vec> st = stats.Run({*y});
  ASSERT_TRUE(st.ok());
  Case bn("batchnorm", {{y_shape}, {{2, 4}}});
  absl::StatusOr<Vec> yn = bn.Run({*y, *st});
  ASSERT_TRUE(yn.ok());
  ExpectRelClose(*yn, LoadNpy(dir + "/bn_t.npy"), 1e-5, "batchnorm");
  Case gelu("gelu", {{y_shape}});
  absl::StatusOr<Vec> gl = gelu.Run({*yn});
  ASSERT_TRUE(gl.ok());
  ExpectRelClose(*gl, LoadNpy(dir + "/gl_t.npy"), 1e-5, "gelu");
  // Backward: loss = sum(gl^2) + sum(p * p_const) + sum(y * y_const): the
  // last term gives the bias a gradient (batch norm alone would cancel it).
  Vec g_gl(gl->size());
  for (size_t i = 0; i < gl->size(); ++i) g_gl[i] = 2 * (*gl)[i];
  Case gelu_b("gelu_backward", {{y_shape}, {y_shape}});
  absl::StatusOr<Vec> g_bn = gelu_b.Run({g_gl, *yn});
  ASSERT_TRUE(g_bn.ok());
  Case bn_b("batchnorm_backward", {{y_shape}, {y_shape}, {{2, 4}}});
  absl::StatusOr<Vec> g_y = bn_b.Run({*g_bn, *y, *st});
  ASSERT_TRUE(g_y.ok());
  for (size_t i = 0; i < g_y->size(); ++i) (*g_y)[i] += (*y)[i];
  Json data_attrs = conv_attrs;
  data_attrs["input_shape"] = x_shape;
  Case conv_bd("conv3d_backward_data", {{y_shape}, {w_shape}}, data_attrs);
  Json weight_attrs = conv_attrs;
  weight_attrs["kernel"] = 3;
  Case conv_bw("conv3d_backward_weight", {{y_shape}, {x_shape}}, weight_attrs);
  Case conv_bb("conv3d_backward_bias", {{y_shape}});
  Case pool_b("maxpool_backward", {{pool.out_shape()}, {x_shape}},
              pool_attrs);
  absl::StatusOr<Vec> dx_conv = conv_bd.Run({*g_y, w});
  absl::StatusOr<Vec> dx_pool = pool_b.Run({*p, x});
  absl::StatusOr<Vec> dw = conv_bw.Run({*g_y, x});
  absl::StatusOr<Vec> db = conv_bb.Run({*g_y});
  ASSERT_TRUE(dx_conv.ok() && dx_pool.ok() && dw.ok() && db.ok());
  Vec dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) dx[i] = (*dx_conv)[i] + (*dx_pool)[i];
  ExpectRelClose(dx, LoadNpy(dir + "/dx_t.npy"), 1e-4, "dx");
  ExpectRelClose(*dw, LoadNpy(dir + "/dw_t.npy"), 1e-4, "dw");
  ExpectRelClose(*db, LoadNpy(dir + "/db_t.npy"), 1e-4, "db");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pebble
