// The depth split of runtime/conv_depth_split.h on the CPU: the slices
// cover every output (forward, backward filter) or input (backward data)
// plane exactly once and every term of the convolution exactly once, and
// running them as the CUDA backend does (copy a window of x or dy into a
// packed buffer with zero planes outside the tensor, convolve it with depth
// padding 0, copy the result into place, crop it, or accumulate the weight
// gradient) gives the unsplit convolution, against naive loops here.
#include "runtime/conv_depth_split.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pebble {
namespace {

using Vec = std::vector<double>;

TEST(ConvDepthSplitTest, EvenRanges) {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(EvenRanges(7, 3), (Ranges{{0, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ(EvenRanges(6, 3), (Ranges{{0, 2}, {2, 4}, {4, 6}}));
  EXPECT_EQ(EvenRanges(3, 5), (Ranges{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(EvenRanges(4, 1), (Ranges{{0, 4}}));
  EXPECT_EQ(EvenRanges(0, 2), Ranges{});
}

TEST(ConvDepthSplitTest, SplitCounts) {
  using Counts = std::vector<int64_t>;
  EXPECT_EQ(SplitCounts(0), Counts{1});
  EXPECT_EQ(SplitCounts(1), Counts{1});
  EXPECT_EQ(SplitCounts(2), Counts{2});
  EXPECT_EQ(SplitCounts(3), (Counts{2, 3}));
  EXPECT_EQ(SplitCounts(8), (Counts{2, 4, 8}));
  EXPECT_EQ(SplitCounts(13), (Counts{2, 4, 8, 13}));
}

TEST(ConvDepthSplitTest, BatchSplitPointKeepsTheSecondPartAligned) {
  // fp32 samples of 256 and 32 bytes: any cut is aligned, so the half.
  EXPECT_EQ(BatchSplitPoint(10, {256, 32}), 5);
  EXPECT_EQ(BatchSplitPoint(7, {256, 32}), 3);
  EXPECT_EQ(BatchSplitPoint(2, {256, 32}), 1);
  // fp32 samples of 27 elements (108 bytes): 16-byte cuts every 4 samples.
  EXPECT_EQ(BatchSplitPoint(10, {108}), 4);
  EXPECT_EQ(BatchSplitPoint(5, {108}), 4);
  // fp16 samples of 27 elements (54 bytes): 16-byte cuts every 8 samples,
  // 4-byte cuts every 2; below that the half, misaligned.
  EXPECT_EQ(BatchSplitPoint(20, {54}), 8);
  EXPECT_EQ(BatchSplitPoint(9, {54}), 8);
  EXPECT_EQ(BatchSplitPoint(8, {54}), 4);
  EXPECT_EQ(BatchSplitPoint(6, {54}), 2);
  EXPECT_EQ(BatchSplitPoint(3, {54}), 2);
  EXPECT_EQ(BatchSplitPoint(2, {54}), 1);
  // Every tensor counts: 54 bytes needs 8 samples, 8 bytes 2.
  EXPECT_EQ(BatchSplitPoint(16, {8, 54}), 8);
  EXPECT_EQ(BatchSplitPoint(16, {8}), 8);
  EXPECT_EQ(BatchSplitPoint(10, {8}), 4);
  // Always a cut inside the batch; aligned to 16 whenever a 16-byte step
  // fits, else to 4 whenever a 4-byte step does.
  for (int64_t batch = 2; batch <= 40; ++batch) {
    for (const std::vector<int64_t>& bytes :
         std::vector<std::vector<int64_t>>{{2}, {6, 10}, {54, 4}, {12}, {1024}}) {
      const int64_t first = BatchSplitPoint(batch, bytes);
      ASSERT_GE(first, 1) << batch;
      ASSERT_LT(first, batch) << batch;
      for (const int64_t align : {16, 4}) {
        int64_t step = 1;
        for (int64_t b : bytes) step = std::lcm(step, align / std::gcd(int64_t{align}, b));
        if (step >= batch) continue;
        for (int64_t b : bytes) EXPECT_EQ(first * b % align, 0) << batch << " " << b;
        break;
      }
    }
  }
}

TEST(ConvDepthSplitTest, ClipPlanes) {
  auto run = [](int64_t planes, int64_t first, int64_t count) {
    const PlaneRun r = ClipPlanes(planes, first, count);
    return std::array<int64_t, 4>{r.zeros_before, r.src_begin, r.copied,
                                  r.zeros_after};
  };
  using R = std::array<int64_t, 4>;
  EXPECT_EQ(run(5, 1, 3), (R{0, 1, 3, 0}));   // inside
  EXPECT_EQ(run(5, -2, 4), (R{2, 0, 2, 0}));  // below 0
  EXPECT_EQ(run(5, 3, 4), (R{0, 3, 2, 2}));   // past the end
  EXPECT_EQ(run(3, -1, 5), (R{1, 0, 3, 1}));  // both ends
  EXPECT_EQ(run(3, -4, 2), (R{2, 0, 0, 0}));  // all below
  EXPECT_EQ(run(3, 5, 2), (R{0, 5, 0, 2}));   // all past
}

// Every axis (in, kernel, stride, pad) with in + 2 pad >= kernel in the
// ranges below: p >= s, p >= k, stride > kernel, outputs that read only
// padding, inputs that no output reads.
std::vector<ConvAxis> Axes() {
  std::vector<ConvAxis> axes;
  for (int64_t in = 1; in <= 9; ++in) {
    for (int64_t k = 1; k <= 4; ++k) {
      for (int64_t s = 1; s <= 3; ++s) {
        for (int64_t p = 0; p <= 3; ++p) {
          if (in + 2 * p >= k) axes.push_back(MakeConvAxis(in, k, s, p));
        }
      }
    }
  }
  return axes;
}

std::string Name(const ConvAxis& a, int64_t parts) {
  return absl::StrCat("in ", a.in, " kernel ", a.kernel, " stride ", a.stride,
                      " pad ", a.pad, " out ", a.out, ", ", parts, " parts");
}

TEST(ConvDepthSplitTest, OutputSlicesCoverEveryTermOnce) {
  for (const ConvAxis& a : Axes()) {
    for (int64_t parts = 1; parts <= a.out + 1; ++parts) {
      SCOPED_TRACE(Name(a, parts));
      const std::vector<ConvSlice> slices = SplitOutputs(a, parts);
      ASSERT_EQ(static_cast<int64_t>(slices.size()), std::min(parts, a.out));
      int64_t next = 0;
      for (const ConvSlice& s : slices) {
        EXPECT_EQ(s.out_begin, next);
        EXPECT_GT(s.outputs(), 0);
        next = s.out_end;
        // The slice's own convolution: padding 0, exactly its outputs.
        const ConvAxis sa = s.Axis(a);
        EXPECT_EQ(sa.pad, 0);
        EXPECT_EQ((sa.in - sa.kernel) / sa.stride + 1, s.outputs());
        EXPECT_EQ((sa.in - sa.kernel) % sa.stride, 0);
        EXPECT_EQ(s.window_begin, s.out_begin * a.stride - a.pad);
      }
      EXPECT_EQ(next, a.out);
      // Every (output plane, kernel tap) term that reads a real input plane
      // is in exactly one slice, which reads the same plane at that tap.
      for (int64_t o = 0; o < a.out; ++o) {
        for (int64_t j = 0; j < a.kernel; ++j) {
          const int64_t i = o * a.stride - a.pad + j;
          int found = 0;
          for (const ConvSlice& s : slices) {
            if (o < s.out_begin || o >= s.out_end) continue;
            ++found;
            const int64_t local = (o - s.out_begin) * a.stride + j;
            ASSERT_LT(local, s.window);
            EXPECT_EQ(s.window_begin + local, i);
            if (i >= 0 && i < a.in) {
              EXPECT_GE(i, s.in_begin);
              EXPECT_LT(i, s.in_end);
            }
          }
          EXPECT_EQ(found, 1) << "output " << o << " tap " << j;
        }
      }
    }
  }
}

TEST(ConvDepthSplitTest, InputSlicesCoverEveryPlaneOnce) {
  for (const ConvAxis& a : Axes()) {
    for (int64_t parts = 1; parts <= a.in + 1; ++parts) {
      SCOPED_TRACE(Name(a, parts));
      const std::vector<ConvSlice> slices = SplitInputs(a, parts);
      ASSERT_EQ(static_cast<int64_t>(slices.size()), std::min(parts, a.in));
      int64_t next = 0;
      for (const ConvSlice& s : slices) {
        EXPECT_EQ(s.in_begin, next);
        EXPECT_GT(s.in_end, s.in_begin);
        next = s.in_end;
        if (s.outputs() == 0) {
          EXPECT_EQ(s.window, 0);
          continue;
        }
        const ConvAxis sa = s.Axis(a);
        EXPECT_EQ((sa.in - sa.kernel) / sa.stride + 1, s.outputs());
        EXPECT_EQ((sa.in - sa.kernel) % sa.stride, 0);
        EXPECT_EQ(s.window_begin, s.out_begin * a.stride - a.pad);
        EXPECT_GE(s.out_begin, 0);
        EXPECT_LE(s.out_end, a.out);
        // Minimal: every output of the slice reads one of its planes.
        for (int64_t o = s.out_begin; o < s.out_end; ++o) {
          const int64_t lo = o * a.stride - a.pad;
          EXPECT_TRUE(lo <= s.in_end - 1 && lo + a.kernel - 1 >= s.in_begin)
              << "output " << o << " reads none of the slice's planes";
        }
      }
      EXPECT_EQ(next, a.in);
      // Every term reading input plane i is in the slice that owns i.
      for (int64_t o = 0; o < a.out; ++o) {
        for (int64_t j = 0; j < a.kernel; ++j) {
          const int64_t i = o * a.stride - a.pad + j;
          if (i < 0 || i >= a.in) continue;
          int owners = 0;
          for (const ConvSlice& s : slices) {
            if (i < s.in_begin || i >= s.in_end) continue;
            ++owners;
            EXPECT_TRUE(o >= s.out_begin && o < s.out_end)
                << "output " << o << " tap " << j << " misses plane " << i;
            EXPECT_GE(i, s.window_begin);
            EXPECT_LT(i, s.window_begin + s.window);
          }
          EXPECT_EQ(owners, 1);
        }
      }
    }
  }
}

// ---- Numerical check against naive 3-D convolutions.

// x (n, c, D, H, W), w (o, c, kD, kH, kW), y (n, o, D', H', W'); axis 0 is
// the depth.
struct Conv3 {
  int64_t n = 2, c = 2, o = 3;
  std::array<ConvAxis, 3> axis;

  int64_t XPlane() const { return axis[1].in * axis[2].in; }
  int64_t YPlane() const { return axis[1].out * axis[2].out; }
  int64_t XSize() const { return n * c * axis[0].in * XPlane(); }
  int64_t YSize() const { return n * o * axis[0].out * YPlane(); }
  int64_t WSize() const {
    return o * c * axis[0].kernel * axis[1].kernel * axis[2].kernel;
  }
};

using Index3 = std::array<int64_t, 3>;

// Calls fn(i) for every i of [0, e[0]) x [0, e[1]) x [0, e[2]), row-major.
template <typename Fn>
void ForBox(const Index3& e, Fn fn) {
  for (int64_t a = 0; a < e[0]; ++a) {
    for (int64_t b = 0; b < e[1]; ++b) {
      for (int64_t c = 0; c < e[2]; ++c) fn(Index3{a, b, c});
    }
  }
}

// The flat index of (row, i) in rows of e[0] x e[1] x e[2] elements.
int64_t Flat(int64_t row, const Index3& i, const Index3& e) {
  return ((row * e[0] + i[0]) * e[1] + i[1]) * e[2] + i[2];
}

// Calls fn(x index, w index, y index) for every product of the
// convolution whose x element is inside x (padding contributes nothing).
template <typename Fn>
void ForEachMac(const Conv3& g, Fn fn) {
  Index3 in, kernel, out;
  for (int i = 0; i < 3; ++i) {
    in[i] = g.axis[i].in;
    kernel[i] = g.axis[i].kernel;
    out[i] = g.axis[i].out;
  }
  for (int64_t b = 0; b < g.n; ++b) {
    for (int64_t oc = 0; oc < g.o; ++oc) {
      for (int64_t ic = 0; ic < g.c; ++ic) {
        ForBox(out, [&](const Index3& o) {
          ForBox(kernel, [&](const Index3& k) {
            Index3 x;
            for (int i = 0; i < 3; ++i) {
              x[i] = o[i] * g.axis[i].stride - g.axis[i].pad + k[i];
              if (x[i] < 0 || x[i] >= in[i]) return;
            }
            fn(Flat(b * g.c + ic, x, in), Flat(oc * g.c + ic, k, kernel),
               Flat(b * g.o + oc, o, out));
          });
        });
      }
    }
  }
}

Vec Forward(const Conv3& g, const Vec& x, const Vec& w) {
  Vec y(g.YSize(), 0.0);
  ForEachMac(
      g, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += x[xi] * w[wi]; });
  return y;
}

Vec BackwardData(const Conv3& g, const Vec& dy, const Vec& w) {
  Vec dx(g.XSize(), 0.0);
  ForEachMac(
      g, [&](int64_t xi, int64_t wi, int64_t yi) { dx[xi] += dy[yi] * w[wi]; });
  return dx;
}

Vec BackwardFilter(const Conv3& g, const Vec& x, const Vec& dy) {
  Vec dw(g.WSize(), 0.0);
  ForEachMac(
      g, [&](int64_t xi, int64_t wi, int64_t yi) { dw[wi] += dy[yi] * x[xi]; });
  return dw;
}

// What the CUDA backend's plane copies do: for each of `rows` rows,
// dst planes [dst_first, dst_first + count) (rows of dst_planes planes)
// get src planes [first, first + count) (rows of src_planes planes), zeros
// where those are outside [0, src_planes).
void CopyWindow(Vec& dst, int64_t dst_planes, int64_t dst_first, const Vec& src,
                int64_t src_planes, int64_t first, int64_t count, int64_t rows,
                int64_t plane) {
  const PlaneRun r = ClipPlanes(src_planes, first, count);
  ASSERT_EQ(r.zeros_before + r.copied + r.zeros_after, count);
  for (int64_t row = 0; row < rows; ++row) {
    double* out = dst.data() + (row * dst_planes + dst_first) * plane;
    const double* in = src.data() + (row * src_planes + r.src_begin) * plane;
    for (int64_t i = 0; i < r.zeros_before * plane; ++i) *out++ = 0.0;
    for (int64_t i = 0; i < r.copied * plane; ++i) *out++ = in[i];
    for (int64_t i = 0; i < r.zeros_after * plane; ++i) *out++ = 0.0;
  }
}

// The convolution of one slice: depth axis replaced by the slice's own.
Conv3 SliceConv(const Conv3& g, const ConvSlice& s) {
  Conv3 sg = g;
  sg.axis[0] = s.Axis(g.axis[0]);
  return sg;
}

// Outputs start as NaN: every element must be written.
constexpr double kGarbage = std::numeric_limits<double>::quiet_NaN();

Vec SplitForward(const Conv3& g, const Vec& x, const Vec& w, int64_t parts) {
  const ConvAxis& d = g.axis[0];
  Vec y(g.YSize(), kGarbage);
  for (const ConvSlice& s : SplitOutputs(d, parts)) {
    const Conv3 sg = SliceConv(g, s);
    Vec window(sg.XSize(), kGarbage);
    CopyWindow(window, s.window, 0, x, d.in, s.window_begin, s.window,
               g.n * g.c, g.XPlane());
    const Vec part = Forward(sg, window, w);
    CopyWindow(y, d.out, s.out_begin, part, s.outputs(), 0, s.outputs(),
               g.n * g.o, g.YPlane());
  }
  return y;
}

Vec SplitBackwardData(const Conv3& g, const Vec& dy, const Vec& w,
                      int64_t parts) {
  const ConvAxis& d = g.axis[0];
  Vec dx(g.XSize(), kGarbage);
  for (const ConvSlice& s : SplitInputs(d, parts)) {
    const int64_t owned = s.in_end - s.in_begin;
    if (s.outputs() == 0) {  // zeros: an empty window yields only zeros
      CopyWindow(dx, d.in, s.in_begin, Vec(), 0, 0, owned, g.n * g.c,
                 g.XPlane());
      continue;
    }
    const Conv3 sg = SliceConv(g, s);
    Vec dy_part(sg.YSize(), kGarbage);
    CopyWindow(dy_part, s.outputs(), 0, dy, d.out, s.out_begin, s.outputs(),
               g.n * g.o, g.YPlane());
    const Vec dx_window = BackwardData(sg, dy_part, w);
    // Crop the owned planes out of the window.
    CopyWindow(dx, d.in, s.in_begin, dx_window, s.window,
               s.in_begin - s.window_begin, owned, g.n * g.c, g.XPlane());
  }
  return dx;
}

Vec SplitBackwardFilter(const Conv3& g, const Vec& x, const Vec& dy,
                        int64_t parts) {
  const ConvAxis& d = g.axis[0];
  Vec dw(g.WSize(), kGarbage);
  bool first = true;
  for (const ConvSlice& s : SplitOutputs(d, parts)) {
    const Conv3 sg = SliceConv(g, s);
    Vec window(sg.XSize(), kGarbage);
    CopyWindow(window, s.window, 0, x, d.in, s.window_begin, s.window,
               g.n * g.c, g.XPlane());
    Vec dy_part(sg.YSize(), kGarbage);
    CopyWindow(dy_part, s.outputs(), 0, dy, d.out, s.out_begin, s.outputs(),
               g.n * g.o, g.YPlane());
    const Vec part = BackwardFilter(sg, window, dy_part);
    // beta = 0 for the first slice (overwrite), 1 after (accumulate).
    for (size_t i = 0; i < dw.size(); ++i) {
      dw[i] = first ? part[i] : dw[i] + part[i];
    }
    first = false;
  }
  return dw;
}

Vec Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Vec v(n);
  for (double& e : v) e = dist(rng);
  return v;
}

// max |a - b| <= 1e-12 (1 + max |b|): the split sums the same products,
// the weight gradient in another order.
void ExpectSame(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    const double e = std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]);
    err = std::max(err, e);
  }
  EXPECT_LE(err, 1e-12 * (1 + scale)) << what;
}

// Every slice count of every depth axis, against the unsplit convolution.
void CheckSplits(Conv3 g, const ConvAxis& depth) {
  g.axis[0] = depth;
  const Vec x = Random(g.XSize(), 1);
  const Vec w = Random(g.WSize(), 2);
  const Vec dy = Random(g.YSize(), 3);
  const Vec y = Forward(g, x, w);
  const Vec dx = BackwardData(g, dy, w);
  const Vec dw = BackwardFilter(g, x, dy);
  for (int64_t parts = 1; parts <= std::max(depth.in, depth.out) + 1; ++parts) {
    const std::string what = Name(depth, parts);
    ExpectSame(SplitForward(g, x, w, parts), y, "forward, " + what);
    ExpectSame(SplitBackwardData(g, dy, w, parts), dx,
               "backward data, " + what);
    ExpectSame(SplitBackwardFilter(g, x, dy, parts), dw,
               "backward filter, " + what);
  }
}

TEST(ConvDepthSplitTest, SlicesGiveTheUnsplitConvolutionDepthOnly) {
  Conv3 g;  // H = W = 1
  g.axis[1] = g.axis[2] = MakeConvAxis(1, 1, 1, 0);
  for (const ConvAxis& a : Axes()) CheckSplits(g, a);
}

TEST(ConvDepthSplitTest, SlicesGiveTheUnsplitConvolutionWithHeightWidth) {
  Conv3 g;
  g.n = 2;
  g.c = 3;
  g.o = 2;
  g.axis[1] = MakeConvAxis(4, 3, 2, 1);  // H 4 -> 2
  g.axis[2] = MakeConvAxis(3, 2, 1, 1);  // W 3 -> 4
  for (const ConvAxis& a : {MakeConvAxis(7, 3, 1, 1), MakeConvAxis(8, 3, 2, 2),
                            MakeConvAxis(9, 2, 3, 1), MakeConvAxis(6, 1, 2, 0),
                            MakeConvAxis(5, 4, 1, 3), MakeConvAxis(10, 3, 3, 0),
                            MakeConvAxis(1, 3, 1, 1)}) {
    CheckSplits(g, a);
  }
}

}  // namespace
}  // namespace pebble
