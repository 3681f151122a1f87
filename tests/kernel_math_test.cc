// runtime/kernel_math.h: the arithmetic the CUDA kernels share with the CPU
// backend. These tests need no GPU: they check the index maps against brute
// force, and they run the very element functions of the CUDA averaging-pool
// kernels (kmath::AvgPoolAt, AvgPoolGradAt; the CPU backend's adaptive pool
// runs them too) and the head-copy index map (kmath::MergedIndex) on the
// host against the CPU backend's kernels and a scatter written out here, so
// the device code's indexing is checked on every machine; and the keys that
// order the device's index-fault reports.
#include "runtime/kernel_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/net_builder.h"
#include "graph/ops/op_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/kernel.h"

namespace pebble {
namespace {

using Json = nlohmann::json;
using kmath::PoolAxis;

TEST(KernelMathTest, SplitMix64MatchesTheReferenceSequence) {
  // The first outputs of SplitMix64 seeded with 0 (Steele et al. 2014;
  // the reference splitmix64.c of the xorshift family).
  EXPECT_EQ(kmath::SplitMix64At(0, 0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(kmath::SplitMix64At(0, 1), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(kmath::SplitMix64At(0, 2), 0x06C45D188009454Full);
  EXPECT_NE(kmath::SplitMix64At(1, 0), kmath::SplitMix64At(0, 0));
}

TEST(KernelMathTest, DropoutKeepsAboutOneMinusP) {
  for (double p : {0.0, 0.1, 0.5, 0.9}) {
    int64_t kept = 0;
    const int64_t n = 200000;
    for (int64_t i = 0; i < n; ++i) kept += kmath::DropoutKeeps(7, i, p);
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.005) << "p=" << p;
  }
  EXPECT_EQ(kmath::DropoutKeeps(3, 12345, 0.5),
            kmath::DropoutKeeps(3, 12345, 0.5));
}

TEST(KernelMathTest, FloorAndCeilDivisionOfBothSigns) {
  for (int64_t a = -20; a <= 20; ++a) {
    for (int64_t b = 1; b <= 6; ++b) {
      EXPECT_EQ(kmath::FloorDiv(a, b),
                static_cast<int64_t>(std::floor(static_cast<double>(a) / b)));
      EXPECT_EQ(kmath::CeilDiv(a, b),
                static_cast<int64_t>(std::ceil(static_cast<double>(a) / b)));
    }
  }
}

// Brute force: the bins containing i are exactly [FirstBin, LastBin].
void ExpectBinsInvert(const PoolAxis& a, const std::string& what) {
  for (int64_t i = 0; i < a.in; ++i) {
    int64_t first = -1, last = -2;
    for (int64_t o = 0; o < a.out; ++o) {
      if (kmath::BinBegin(a, o) <= i && i < kmath::BinEnd(a, o)) {
        if (first < 0) first = o;
        EXPECT_EQ(last, first < o ? o - 1 : last)
            << what << ": bins not contiguous";
        last = o;
      }
    }
    if (first < 0) {
      EXPECT_LT(kmath::LastBin(a, i), kmath::FirstBin(a, i))
          << what << " i=" << i;
    } else {
      EXPECT_EQ(kmath::FirstBin(a, i), first) << what << " i=" << i;
      EXPECT_EQ(kmath::LastBin(a, i), last) << what << " i=" << i;
    }
  }
}

TEST(KernelMathTest, WindowBinsInvert) {
  for (int64_t in = 1; in <= 13; ++in) {
    for (int64_t k = 1; k <= 5; ++k) {
      for (int64_t s = 1; s <= 4; ++s) {
        for (int64_t p = 0; p <= k / 2; ++p) {
          if (in + 2 * p < k) continue;
          PoolAxis a;
          a.in = in;
          a.kernel = k;
          a.stride = s;
          a.padding = p;
          a.out = (in + 2 * p - k) / s + 1;
          ExpectBinsInvert(
              a, absl::StrCat("in ", in, " k ", k, " s ", s, " p ", p));
          for (int64_t o = 0; o < a.out; ++o) {
            EXPECT_EQ(kmath::BinDivisor(a, o), k);  // count_include_pad
            EXPECT_LT(kmath::BinBegin(a, o), kmath::BinEnd(a, o));
          }
        }
      }
    }
  }
}

TEST(KernelMathTest, AdaptiveBinsInvertAndMatchPyTorch) {
  for (int64_t in = 1; in <= 17; ++in) {
    for (int64_t out = 1; out <= 17; ++out) {
      PoolAxis a;
      a.in = in;
      a.out = out;
      a.adaptive = true;
      ExpectBinsInvert(a, absl::StrCat("adaptive ", in, " -> ", out));
      for (int64_t o = 0; o < out; ++o) {
        // PyTorch: start = floor(o in / out), end = ceil((o + 1) in / out).
        EXPECT_EQ(kmath::BinBegin(a, o), o * in / out);
        EXPECT_EQ(kmath::BinEnd(a, o), ((o + 1) * in + out - 1) / out);
        EXPECT_EQ(kmath::BinDivisor(a, o),
                  kmath::BinEnd(a, o) - kmath::BinBegin(a, o));
      }
    }
  }
}

// ---- The CUDA gathers, on the host, against the CPU backend.

struct Tensor {
  Shape shape;
  DType dtype = DType::kFloat32;
  std::vector<std::byte> bytes;
};

Tensor RandomFloats(Shape shape, uint32_t seed) {
  Tensor t{shape, DType::kFloat32, {}};
  std::vector<float> v(NumElements(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (float& x : v) x = dist(rng);
  t.bytes.resize(v.size() * sizeof(float));
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

std::vector<float> FloatsOf(const Tensor& t) {
  std::vector<float> v(t.bytes.size() / sizeof(float));
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

// Runs the CPU backend's kernel of `op` on a one-node graph.
Tensor RunCpu(const std::string& op, const std::vector<Tensor>& inputs,
              const Json& attrs) {
  NetBuilder nb("t");
  std::vector<Value> values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    values.push_back(
        nb.Input(absl::StrCat("in", i), inputs[i].shape, inputs[i].dtype));
  }
  nb.MarkOutput(nb.Apply(op, values, attrs, "y"));
  absl::StatusOr<Graph> graph = nb.Build();
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  KernelContext ctx;
  ctx.graph = &*graph;
  ctx.node = graph->Find("y");
  std::vector<std::vector<std::byte>> storage;
  storage.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    storage.push_back(t.bytes);
    ctx.inputs.push_back({storage.back().data(), t.shape, t.dtype});
  }
  Tensor out{*graph->shape(ctx.node),
             graph->dtype(ctx.node).value_or(DType::kFloat32),
             {}};
  out.bytes.resize(NumElements(out.shape) * DTypeSize(out.dtype));
  ctx.output = {out.bytes.data(), out.shape, out.dtype};
  const KernelFn kernel = CpuKernels().Find(op);
  EXPECT_NE(kernel, nullptr) << op;
  if (kernel == nullptr) return {};
  const absl::Status status = kernel(ctx);
  EXPECT_TRUE(status.ok()) << op << ": " << status;
  return out;
}

// The pool axes of an NC* shape pair, as runtime/cuda/cuda_ops.cc builds
// them (a 2-D pool leaves axis 0 at its default).
std::vector<PoolAxis> Axes(const Shape& x, const Shape& y, bool adaptive,
                           int64_t k, int64_t s, int64_t p) {
  std::vector<PoolAxis> axes(3);
  const size_t d = x.size() - 2, off = 3 - d;
  for (size_t i = 0; i < d; ++i) {
    PoolAxis& a = axes[off + i];
    a.in = x[2 + i];
    a.out = y[2 + i];
    a.adaptive = adaptive;
    if (!adaptive) {
      a.kernel = k;
      a.stride = s;
      a.padding = p;
    }
  }
  return axes;
}

// AvgPoolKernel and AvgPoolBackwardKernel: one element function call per
// output (input-gradient) element.
std::vector<float> GatherForward(const std::vector<PoolAxis>& ax, int64_t nc,
                                 const std::vector<float>& x) {
  std::vector<float> y(nc * ax[0].out * ax[1].out * ax[2].out);
  auto load = [&x](int64_t j) { return x[j]; };
  for (size_t i = 0; i < y.size(); ++i)
    y[i] = kmath::AvgPoolAt(ax.data(), i, load);
  return y;
}

std::vector<float> GatherBackward(const std::vector<PoolAxis>& ax, int64_t nc,
                                  const std::vector<float>& g) {
  std::vector<float> dx(nc * ax[0].in * ax[1].in * ax[2].in);
  auto load = [&g](int64_t j) { return g[j]; };
  for (size_t i = 0; i < dx.size(); ++i) {
    dx[i] = kmath::AvgPoolGradAt(ax.data(), i, load);
  }
  return dx;
}

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::abs(b[i])))
        << what << " at " << i;
  }
}

// Windows counting the padding (PyTorch's default) and not
// (count_include_pad=False, floor and ceil mode: the CPU backend's oneDNN
// pooling_avg_exclude_padding).
TEST(KernelMathTest, AvgPoolGathersMatchTheCpuBackend) {
  struct Case {
    Shape x;
    int64_t k, s, p;
    bool counted = true, ceil = false;
  };
  for (const Case& c :
       {Case{{2, 3, 9, 7}, 3, 2, 1}, Case{{1, 2, 8, 8}, 2, 2, 0},
        Case{{1, 2, 7, 6, 5}, 3, 1, 1}, Case{{2, 1, 6, 9, 7}, 2, 3, 1},
        Case{{1, 1, 5, 5}, 5, 1, 2}, Case{{2, 3, 9, 7}, 3, 1, 1, false},
        Case{{1, 2, 9, 9}, 2, 2, 0, false, true}, Case{{2, 2, 8, 7}, 3, 2, 1, false, true},
        Case{{1, 2, 7, 6, 5}, 3, 2, 1, false, true}}) {
    const std::string what = absl::StrCat("avgpool k", c.k, " s", c.s, " p", c.p,
                                          c.counted ? "" : " excluding the padding",
                                          c.ceil ? " ceil" : "");
    Json attrs = {{"kernel", c.k}, {"stride", c.s}, {"padding", c.p}};
    if (!c.counted) attrs["count_include_pad"] = false;
    if (c.ceil) attrs["ceil_mode"] = true;
    const Tensor x = RandomFloats(c.x, 3);
    const Tensor y = RunCpu("avgpool", {x}, attrs);
    std::vector<PoolAxis> ax = Axes(c.x, y.shape, false, c.k, c.s, c.p);
    for (PoolAxis& a : ax) a.count_include_pad = c.counted;
    const int64_t nc = c.x[0] * c.x[1];
    ExpectClose(GatherForward(ax, nc, FloatsOf(x)), FloatsOf(y), what);
    Json bw = attrs;
    bw["input_shape"] = c.x;
    const Tensor g = RandomFloats(y.shape, 4);
    ExpectClose(GatherBackward(ax, nc, FloatsOf(g)),
                FloatsOf(RunCpu("avgpool_backward", {g}, bw)),
                what + " backward");
  }
}

// The adaptive-pool gradient as PyTorch's CPU kernel computes it: a scatter
// over the outputs in row-major order, g / bin size added into every input
// element of the bin, in fp32.
std::vector<float> ScatterBackward(const std::vector<PoolAxis>& ax, int64_t nc,
                                   const std::vector<float>& g) {
  const PoolAxis &ad = ax[0], &ah = ax[1], &aw = ax[2];
  std::vector<float> dx(nc * ad.in * ah.in * aw.in, 0.f);
  int64_t o = 0;  // flat output index
  for (int64_t p = 0; p < nc; ++p) {
    for (int64_t od = 0; od < ad.out; ++od) {
      for (int64_t oh = 0; oh < ah.out; ++oh) {
        for (int64_t ow = 0; ow < aw.out; ++ow, ++o) {
          const int64_t count =
              (kmath::BinEnd(ad, od) - kmath::BinBegin(ad, od)) *
              (kmath::BinEnd(ah, oh) - kmath::BinBegin(ah, oh)) *
              (kmath::BinEnd(aw, ow) - kmath::BinBegin(aw, ow));
          const float delta = g[o] / static_cast<float>(count);
          for (int64_t d = kmath::BinBegin(ad, od); d < kmath::BinEnd(ad, od);
               ++d)
            for (int64_t h = kmath::BinBegin(ah, oh); h < kmath::BinEnd(ah, oh);
                 ++h)
              for (int64_t w = kmath::BinBegin(aw, ow);
                   w < kmath::BinEnd(aw, ow); ++w)
                dx[((p * ad.in + d) * ah.in + h) * aw.in + w] += delta;
        }
      }
    }
  }
  return dx;
}

TEST(KernelMathTest, AdaptiveAvgPoolGathersMatchTheScatterAndTheCpuBackend) {
  struct Case {
    Shape x, out;
  };
  for (const Case& c :
       {Case{{2, 3, 7, 5}, {3, 2}}, Case{{1, 2, 5, 6, 7}, {2, 4, 3}},
        Case{{1, 1, 3, 4}, {7, 7}}, Case{{2, 2, 13, 11}, {5, 1}}}) {
    const std::string what = absl::StrCat("adaptive to ", ShapeToString(c.out));
    const Tensor x = RandomFloats(c.x, 5);
    const Tensor y = RunCpu("adaptive_avgpool", {x}, {{"output_size", c.out}});
    const std::vector<PoolAxis> ax = Axes(c.x, y.shape, true, 0, 0, 0);
    const int64_t nc = c.x[0] * c.x[1];
    ExpectClose(GatherForward(ax, nc, FloatsOf(x)), FloatsOf(y), what);
    const Tensor g = RandomFloats(y.shape, 6);
    // The gather adds in the scatter's order of fp32 additions: equal bits.
    const std::vector<float> dx = GatherBackward(ax, nc, FloatsOf(g));
    const std::vector<float> scatter = ScatterBackward(ax, nc, FloatsOf(g));
    const std::vector<float> cpu =
        FloatsOf(RunCpu("adaptive_avgpool_backward", {g},
                        {{"output_size", c.out}, {"input_shape", c.x}}));
    ASSERT_EQ(dx.size(), scatter.size());
    ASSERT_EQ(dx.size(), cpu.size());
    EXPECT_EQ(std::memcmp(dx.data(), scatter.data(), dx.size() * sizeof(float)),
              0)
        << what;
    EXPECT_EQ(std::memcmp(dx.data(), cpu.data(), dx.size() * sizeof(float)), 0)
        << what;
  }
}

TEST(KernelMathTest, HeadsMapMatchesSplitAndMergeHeads) {
  const int64_t b = 2, s = 5, h = 3, dh = 4, chunks = 3;
  const Shape merged = {b, s, chunks * h * dh};
  const Tensor x = RandomFloats(merged, 7);
  const std::vector<float> fx = FloatsOf(x);
  std::vector<Tensor> parts;
  for (int64_t index = 0; index < chunks; ++index) {
    const Tensor part =
        RunCpu("split_heads", {x},
               {{"heads", h}, {"chunks", chunks}, {"index", index}});
    ASSERT_EQ(part.shape, (Shape{b, h, s, dh}));
    kmath::HeadsMap m{h, s, dh, merged[2], index * h * dh};
    // HeadsCopyKernel<gather>: heads[i] = merged[MergedIndex(i)].
    std::vector<float> gathered(NumElements(part.shape));
    for (int64_t i = 0; i < static_cast<int64_t>(gathered.size()); ++i) {
      gathered[i] = fx[kmath::MergedIndex(m, i)];
    }
    EXPECT_EQ(gathered, FloatsOf(part)) << "part " << index;
    parts.push_back(part);
  }
  // HeadsCopyKernel<scatter> of every part rebuilds the merged tensor, as
  // merge_heads does.
  const Tensor cpu_merged = RunCpu("merge_heads", parts, Json::object());
  std::vector<float> scattered(NumElements(merged), NAN);
  for (int64_t index = 0; index < chunks; ++index) {
    kmath::HeadsMap m{h, s, dh, merged[2], index * h * dh};
    const std::vector<float> fp = FloatsOf(parts[index]);
    for (int64_t i = 0; i < static_cast<int64_t>(fp.size()); ++i) {
      scattered[kmath::MergedIndex(m, i)] = fp[i];
    }
  }
  EXPECT_EQ(scattered, FloatsOf(cpu_merged));
  EXPECT_EQ(scattered, fx);
}

// Note [Upsample taps]: the readers of every input are the contiguous
// range a full scan over the outputs finds, for whole factors, sizes that
// are not multiples of the input (PyTorch's in / out step), fractional
// scale factors and downsampling. Factors from 14 on have inputs read by
// more than 40 outputs (the cap an earlier gather had).
TEST(KernelMathTest, UpsampleReadersAreAFullScan) {
  struct Geometry {
    int64_t out;
    double scale_factor;  // 0: a size alone
  };
  int64_t most_readers = 0;
  for (int64_t in : {1, 2, 3, 4, 7, 13}) {
    std::vector<Geometry> geometries;
    for (int64_t factor : {1, 2, 3, 5, 14, 17, 19, 25}) {
      geometries.push_back({in * factor, static_cast<double>(factor)});
    }
    for (double f : {1.5, 2.4, 0.5, 0.3, 1.0 / 3.0, 7.7}) {
      const auto out = static_cast<int64_t>(std::floor(static_cast<double>(in) * f));
      if (out >= 1) geometries.push_back({out, f});
    }
    for (int64_t out : {in + 1, 2 * in + 1, 3 * in - 1, in / 2 + 1, int64_t{5}}) {
      if (out >= 1) geometries.push_back({out, 0.0});
    }
    for (const Geometry& g : geometries) {
      const kmath::UpsampleAxis axis = kmath::MakeUpsampleAxis(in, g.out, g.scale_factor);
      for (int mode = 0; mode < 3; ++mode) {  // nearest, linear, aligned
        const bool nearest = mode == 0, align = mode == 2;
        const std::string what = absl::StrCat("in ", in, " out ", g.out, " scale_factor ",
                                              g.scale_factor, " mode ", mode);
        for (int64_t i = 0; i < in; ++i) {
          std::vector<int64_t> readers;
          for (int64_t o = 0; o < g.out; ++o) {
            const kmath::UpsampleTap t = kmath::UpsampleTapAt(o, axis, nearest, align);
            ASSERT_TRUE(t.i0 >= 0 && t.i0 < in && t.i1 >= 0 && t.i1 < in)
                << what << " output " << o;
            if (t.i0 == i || t.i1 == i) readers.push_back(o);
          }
          int64_t first = 0, last = 0;
          kmath::UpsampleReaders(i, axis, nearest, align, &first, &last);
          ASSERT_EQ(last - first + 1, static_cast<int64_t>(readers.size()))
              << what << " input " << i;
          if (!readers.empty()) {
            EXPECT_EQ(first, readers.front()) << what << " input " << i;
            EXPECT_EQ(last, readers.back()) << what << " input " << i;
          }
          most_readers = std::max(most_readers, static_cast<int64_t>(readers.size()));
        }
      }
    }
  }
  EXPECT_GT(most_readers, 40);
}

// Note [Bicubic taps]: CubicReaders finds the outputs whose (clamped) taps
// read each input, as a full scan does, over whole and fractional
// factors, sizes and downsampling, with and without align_corners; the
// weights of every output sum to 1.
TEST(KernelMathTest, CubicReadersAreAFullScan) {
  for (int64_t in : {1, 2, 3, 5, 8}) {
    for (const auto& [out, scale_factor] :
         {std::pair<int64_t, double>{in, 0.0}, {2 * in, 2.0}, {3 * in + 1, 0.0}, {in * 17, 17.0},
          {std::max<int64_t>(1, in / 2), 0.0}, {static_cast<int64_t>(in * 2.5), 2.5}}) {
      const kmath::UpsampleAxis axis = kmath::MakeUpsampleAxis(in, out, scale_factor);
      for (const bool align : {false, true}) {
        const std::string what = absl::StrCat("in ", in, " out ", out, " scale_factor ",
                                              scale_factor, align ? " aligned" : "");
        for (int64_t o = 0; o < out; ++o) {
          const kmath::CubicTap t = kmath::CubicTapAt(o, axis, align);
          EXPECT_NEAR(t.w[0] + t.w[1] + t.w[2] + t.w[3], 1.0f, 1e-6) << what << " output " << o;
        }
        for (int64_t i = 0; i < in; ++i) {
          std::vector<int64_t> readers;
          for (int64_t o = 0; o < out; ++o) {
            const kmath::CubicTap t = kmath::CubicTapAt(o, axis, align);
            bool reads = false;
            for (int k = 0; k < 4; ++k) {
              ASSERT_TRUE(t.i[k] >= 0 && t.i[k] < in) << what << " output " << o;
              reads = reads || t.i[k] == i;
            }
            if (reads) readers.push_back(o);
          }
          int64_t first = 0, last = 0;
          kmath::CubicReaders(i, axis, align, &first, &last);
          ASSERT_EQ(last - first + 1, static_cast<int64_t>(readers.size()))
              << what << " input " << i;
          if (!readers.empty()) {
            EXPECT_EQ(first, readers.front()) << what << " input " << i;
            EXPECT_EQ(last, readers.back()) << what << " input " << i;
          }
        }
      }
    }
  }
}

// Note [Upsample taps] at points PyTorch 1.13 computes
// (F.interpolate(torch.arange(5.).view(1, 1, 5), ...)): size 7, linear:
// 0, 0.5714, 1.2857, 2, 2.7143, 3.4286, 4 (step 5/7); scale_factor 1.5
// (out 7, step 2/3): 0, 0.5, 1.1667, 1.8333, 2.5, 3.1667, 3.8333; nearest
// to size 3: sources 0, 1, 3.
TEST(KernelMathTest, FractionalUpsampleTapsArePyTorchs) {
  const auto lerp = [](const kmath::UpsampleTap& t) {
    return t.l0 * static_cast<float>(t.i0) + t.l1 * static_cast<float>(t.i1);
  };
  const kmath::UpsampleAxis sized = kmath::MakeUpsampleAxis(5, 7, 0.0);
  const std::vector<float> sized_want = {0, 0.5714f, 1.2857f, 2, 2.7143f, 3.4286f, 4};
  const kmath::UpsampleAxis factor = kmath::MakeUpsampleAxis(5, 7, 1.5);
  const std::vector<float> factor_want = {0, 0.5f, 1.1667f, 1.8333f, 2.5f, 3.1667f, 3.8333f};
  for (int64_t o = 0; o < 7; ++o) {
    EXPECT_NEAR(lerp(kmath::UpsampleTapAt(o, sized, false, false)), sized_want[o], 1e-4) << o;
    EXPECT_NEAR(lerp(kmath::UpsampleTapAt(o, factor, false, false)), factor_want[o], 1e-4) << o;
  }
  const kmath::UpsampleAxis down = kmath::MakeUpsampleAxis(5, 3, 0.0);
  const std::vector<int64_t> nearest_want = {0, 1, 3};
  for (int64_t o = 0; o < 3; ++o) {
    EXPECT_EQ(kmath::UpsampleTapAt(o, down, true, false).i0, nearest_want[o]) << o;
  }
}

// Note [Border padding]: the readers ForEachBorderReader lists for each
// input element are exactly the outputs whose BorderSource is that element,
// each once, over random shapes and pads of both modes (reflect pads below
// the dim's size); BorderSource matches PyTorch's rows at a hand-computed
// point.
TEST(KernelMathTest, BorderReadersInvertBorderSource) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    kmath::BorderPad p;
    p.mode = trial % 2 == 0 ? kmath::BorderMode::kReflect : kmath::BorderMode::kReplicate;
    p.rank = 1 + static_cast<int>(rng() % 4);
    int64_t outputs = 1, inputs = 1;
    for (int d = 0; d < p.rank; ++d) {
      p.in[d] = 1 + static_cast<int64_t>(rng() % 5);
      const int64_t most = p.mode == kmath::BorderMode::kReflect ? p.in[d] - 1 : 4;
      p.before[d] = static_cast<int64_t>(rng() % (most + 1));
      p.out[d] = p.in[d] + p.before[d] + static_cast<int64_t>(rng() % (most + 1));
      outputs *= p.out[d];
      inputs *= p.in[d];
    }
    std::vector<std::vector<int64_t>> readers(inputs);
    for (int64_t o = 0; o < outputs; ++o) {
      const int64_t src = kmath::BorderSource(p, o);
      ASSERT_TRUE(src >= 0 && src < inputs) << "trial " << trial << " output " << o;
      readers[src].push_back(o);
    }
    for (int64_t i = 0; i < inputs; ++i) {
      std::vector<int64_t> listed;
      kmath::ForEachBorderReader(p, i, [&](int64_t o) { listed.push_back(o); });
      std::sort(listed.begin(), listed.end());
      ASSERT_EQ(listed, readers[i]) << "trial " << trial << " input " << i;
    }
  }
  // F.pad(arange(4), (3, 2), mode="reflect") is 3 2 1 0 1 2 3 2 1, and
  // mode="replicate" 0 0 0 0 1 2 3 3 3.
  kmath::BorderPad row;
  row.rank = 1;
  row.in[0] = 4;
  row.before[0] = 3;
  row.out[0] = 9;
  const std::vector<int64_t> reflect = {3, 2, 1, 0, 1, 2, 3, 2, 1};
  const std::vector<int64_t> replicate = {0, 0, 0, 0, 1, 2, 3, 3, 3};
  for (int64_t o = 0; o < 9; ++o) EXPECT_EQ(kmath::BorderSource(row, o), reflect[o]) << o;
  row.mode = kmath::BorderMode::kReplicate;
  for (int64_t o = 0; o < 9; ++o) EXPECT_EQ(kmath::BorderSource(row, o), replicate[o]) << o;
}

// The CUDA upsample kernels' loops (runtime/cuda/cuda_kernels.cu), run on
// the host over the same kmath functions, against the CPU backend: the
// forward reads the taps of each output, the backward gathers over the
// readers of each input.
TEST(KernelMathTest, UpsampleGathersMatchTheCpuBackend) {
  struct Case {
    Shape x;
    Json geometry;  // upsample's scale, or size and scale_factor
    std::string mode;
    bool align;
  };
  const std::vector<Case> cases = {
      {{1, 2, 3, 4}, {{"scale", {2, 17}}}, "bilinear", false},
      {{1, 2, 3, 4}, {{"scale", {17, 3}}}, "bilinear", true},
      {{2, 1, 3, 2}, {{"scale", {19, 2}}}, "bilinear", true},
      {{1, 1, 2, 3, 2}, {{"scale", {3, 2, 19}}}, "trilinear", false},
      {{1, 1, 3, 2, 2}, {{"scale", {14, 2, 1}}}, "trilinear", true},
      {{1, 2, 3, 5}, {{"scale", {25, 3}}}, "nearest", false},
      {{1, 1, 2, 2, 3}, {{"scale", {2, 3, 5}}}, "nearest", false},
      {{1, 2, 5, 4}, {{"size", {7, 3}}}, "bilinear", false},
      {{1, 2, 5, 4}, {{"size", {7, 10}}, {"scale_factor", {1.5, 2.5}}}, "bilinear", false},
      {{1, 1, 5, 6}, {{"size", {8, 4}}}, "bilinear", true},
      {{1, 1, 3, 5, 4}, {{"size", {4, 2, 9}}}, "trilinear", false},
      {{1, 2, 6, 5}, {{"size", {4, 8}}}, "nearest", false},
      {{1, 2, 6, 5}, {{"size", {9, 2}}, {"scale_factor", {1.5, 0.5}}}, "nearest", false},
  };
  for (const Case& c : cases) {
    const size_t dims = c.x.size() - 2;
    const std::string what = absl::StrCat(ShapeToString(c.x), " ", c.geometry.dump(), " ",
                                          c.mode, c.align ? " aligned" : "");
    Json attrs = c.geometry;
    attrs["mode"] = c.mode;
    if (c.mode != "nearest") attrs["align_corners"] = c.align;
    const absl::StatusOr<ops_internal::Upsampling> u = ops_internal::ParseUpsampling(attrs, c.x);
    ASSERT_TRUE(u.ok()) << what << ": " << u.status();
    const bool nearest = c.mode == "nearest";
    int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
    kmath::UpsampleAxis axes[3];
    for (size_t i = 0; i < dims; ++i) {
      const size_t d = 3 - dims + i;
      in[d] = c.x[2 + i];
      out[d] = u->out[i];
      axes[d] = kmath::MakeUpsampleAxis(in[d], out[d], u->scale_factor[i]);
    }
    const int64_t nc = c.x[0] * c.x[1];
    auto tap = [&](int d, int64_t o) {
      return kmath::UpsampleTapAt(o, axes[d], nearest, c.align);
    };
    // Forward: UpsampleKernel.
    const Tensor x = RandomFloats(c.x, 11);
    const Tensor y = RunCpu("upsample", {x}, attrs);
    const std::vector<float> fx = FloatsOf(x);
    std::vector<float> gathered;
    for (int64_t p = 0; p < nc; ++p) {
      const float* xp = fx.data() + p * in[0] * in[1] * in[2];
      auto at = [&](int64_t d, int64_t h, int64_t w) {
        return xp[(d * in[1] + h) * in[2] + w];
      };
      for (int64_t od = 0; od < out[0]; ++od) {
        for (int64_t oh = 0; oh < out[1]; ++oh) {
          for (int64_t ow = 0; ow < out[2]; ++ow) {
            const kmath::UpsampleTap td = tap(0, od), th = tap(1, oh),
                                     tw = tap(2, ow);
            auto plane = [&](int64_t d) {
              return th.l0 * (tw.l0 * at(d, th.i0, tw.i0) +
                              tw.l1 * at(d, th.i0, tw.i1)) +
                     th.l1 * (tw.l0 * at(d, th.i1, tw.i0) +
                              tw.l1 * at(d, th.i1, tw.i1));
            };
            gathered.push_back(td.l0 * plane(td.i0) + td.l1 * plane(td.i1));
          }
        }
      }
    }
    ExpectClose(gathered, FloatsOf(y), what + " forward");
    // Backward: UpsampleBackwardKernel.
    Json bw = attrs;
    bw["input_shape"] = c.x;
    const Tensor g = RandomFloats(y.shape, 12);
    const std::vector<float> fg = FloatsOf(g);
    std::vector<float> dx;
    for (int64_t p = 0; p < nc; ++p) {
      const float* gp = fg.data() + p * out[0] * out[1] * out[2];
      for (int64_t id = 0; id < in[0]; ++id) {
        for (int64_t ih = 0; ih < in[1]; ++ih) {
          for (int64_t iw = 0; iw < in[2]; ++iw) {
            int64_t r[3][2];
            const int64_t idx[3] = {id, ih, iw};
            for (int d = 0; d < 3; ++d) {
              kmath::UpsampleReaders(idx[d], axes[d], nearest, c.align, &r[d][0], &r[d][1]);
            }
            float acc = 0.f;
            for (int64_t od = r[0][0]; od <= r[0][1]; ++od) {
              const float wd = kmath::UpsampleWeight(tap(0, od), id);
              for (int64_t oh = r[1][0]; oh <= r[1][1]; ++oh) {
                const float wh = kmath::UpsampleWeight(tap(1, oh), ih);
                float row = 0.f;
                for (int64_t ow = r[2][0]; ow <= r[2][1]; ++ow) {
                  row += kmath::UpsampleWeight(tap(2, ow), iw) *
                         gp[(od * out[1] + oh) * out[2] + ow];
                }
                acc += wd * wh * row;
              }
            }
            dx.push_back(acc);
          }
        }
      }
    }
    ExpectClose(dx, FloatsOf(RunCpu("upsample_backward", {g}, bw)),
                what + " backward");
  }
}

// Note [Index fault keys]: keys order by launch first, then by position,
// decode to what was encoded, and never reach the "no fault" value.
TEST(KernelMathTest, IndexFaultKeysOrderByLaunchThenPosition) {
  const uint64_t last_tag = kmath::kIndexFaultTagLimit - 1;
  const uint64_t last_position = kmath::kIndexFaultPositionLimit - 1;
  const std::vector<std::pair<uint64_t, uint64_t>> sorted = {
      {0, 0},        {0, 1},        {0, last_position},
      {1, 0},        {1, 7},        {2, 0},
      {last_tag, 0}, {last_tag, 3}, {last_tag, last_position}};
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto [tag, position] = sorted[i];
    const uint64_t key = kmath::IndexFaultKey(tag, position);
    EXPECT_EQ(kmath::IndexFaultTag(key), tag);
    EXPECT_EQ(kmath::IndexFaultPosition(key), position);
    EXPECT_LT(key, kmath::kNoIndexFault);
    if (i > 0) {
      EXPECT_LT(kmath::IndexFaultKey(sorted[i - 1].first, sorted[i - 1].second),
                key)
          << "tag " << tag << " position " << position;
    }
  }
}

// BroadcastSource against NumPy's rule written out: result index
// (i0, ..., ik) reads the operand at the same trailing indices, 0 where the
// operand's dim is 1; and MakeBroadcastIndex refuses what does not
// broadcast.
TEST(KernelMathTest, BroadcastSourceIsNumpysRule) {
  const std::vector<int64_t> out = {2, 3, 4, 5};
  const std::vector<std::vector<int64_t>> operands = {
      {2, 3, 4, 5}, {5}, {4, 1}, {2, 1, 4, 1}, {1, 3, 1, 5}, {}, {1, 1}, {3, 4, 5}};
  for (const std::vector<int64_t>& in : operands) {
    kmath::BroadcastIndex b;
    ASSERT_TRUE(kmath::MakeBroadcastIndex(out.data(), 4, in.data(), static_cast<int>(in.size()), &b));
    const int lead = 4 - static_cast<int>(in.size());
    int64_t o = 0;
    for (int64_t i0 = 0; i0 < 2; ++i0) {
      for (int64_t i1 = 0; i1 < 3; ++i1) {
        for (int64_t i2 = 0; i2 < 4; ++i2) {
          for (int64_t i3 = 0; i3 < 5; ++i3, ++o) {
            const int64_t idx[4] = {i0, i1, i2, i3};
            int64_t src = 0;
            for (int d = lead; d < 4; ++d) {
              const int64_t n = in[d - lead];
              src = src * n + (n == 1 ? 0 : idx[d]);
            }
            ASSERT_EQ(kmath::BroadcastSource(b, o), src) << "operand rank " << in.size() << " at " << o;
          }
        }
      }
    }
  }
  kmath::BroadcastIndex b;
  const int64_t bad[] = {3, 5};
  EXPECT_FALSE(kmath::MakeBroadcastIndex(out.data(), 4, bad, 2, &b));
  const int64_t wider[] = {1, 2, 3, 4, 5};
  EXPECT_FALSE(kmath::MakeBroadcastIndex(out.data(), 4, wider, 5, &b));
  const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_FALSE(kmath::MakeBroadcastIndex(nine, 9, nine, 9, &b));
}

}  // namespace
}  // namespace pebble
