// Index and random-number arithmetic shared by the CPU backend's kernels
// and the CUDA backend's device code (runtime/cuda/cuda_kernels.cu), so
// that both compute the same thing by construction: the dropout mask
// generator (identical bits on both backends), the windows of the pooling
// averages, the upsampling source indices, the head-split index map and the
// ordering of out-of-range index reports, the border padding's source and
// reader indices, and the general broadcast of compare and masked_fill.
//
// Plain C++17 with no includes beyond <cmath> and <cstdint>: nvcc compiles
// it as __host__ __device__ code, and the host compiler (and the tests in
// tests/kernel_math_test.cc, which need no GPU) as ordinary inline
// functions.
#ifndef PEBBLE_RUNTIME_KERNEL_MATH_H_
#define PEBBLE_RUNTIME_KERNEL_MATH_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PEBBLE_HOST_DEVICE __host__ __device__
// A template below may be instantiated with a device-only loader; nvcc
// then must not check the host instantiation, which is never used.
#define PEBBLE_NO_EXEC_CHECK _Pragma("nv_exec_check_disable")
#else
#define PEBBLE_HOST_DEVICE
#define PEBBLE_NO_EXEC_CHECK
#endif

namespace pebble::kmath {

// Note [Dropout mask generator]. Element i of dropout_mask(p, seed) is kept
// (1) when u_i >= p, where u_i = (z_i >> 40) / 2^24 is uniform in [0, 1)
// and z_i is output i (counting from 0) of the SplitMix64 generator seeded
// with `seed` (Steele, Lea, Flood: "Fast splittable pseudorandom number
// generators", OOPSLA 2014; z_i = mix(seed + (i + 1) * 0x9E3779B97F4A7C15)).
// A counter-based generator: every element is computed on its own, so the
// mask is the same for any thread count, any recomputation and either
// backend. It is not PyTorch's Bernoulli stream; a cross-check feeds the
// mask in.
PEBBLE_HOST_DEVICE inline uint64_t SplitMix64At(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Whether element i survives dropout with probability p of dropping.
PEBBLE_HOST_DEVICE inline bool DropoutKeeps(uint64_t seed, uint64_t i,
                                            double p) {
  const double u = static_cast<double>(SplitMix64At(seed, i) >> 40) *
                   (1.0 / 16777216.0);  // 2^-24
  return u >= p;
}

// Note [Random values]. Element i of random(seed) is a function of (seed,
// i) alone, as the dropout mask is (Note [Dropout mask generator]): uniform
// in [low, high) from u_i = (z_i >> 11) / 2^53 in [0, 1); normal(mean, std)
// by Box-Muller from u_2i and u_2i+1, sqrt(-2 ln(1 - u_2i)) cos(2 pi
// u_2i+1), in double. The same on any thread count, any recomputation and
// either backend (up to the last bits of the device's log and cos). It is not
// PyTorch's stream: a cross-check scales the noise to nothing.
PEBBLE_HOST_DEVICE inline double UniformAt(uint64_t seed, uint64_t i) {
  return static_cast<double>(SplitMix64At(seed, i) >> 11) * (1.0 / 9007199254740992.0);
}
PEBBLE_HOST_DEVICE inline double RandomAt(uint64_t seed, uint64_t i, bool normal, double a,
                                          double b) {
  if (!normal) return a + (b - a) * UniformAt(seed, i);
  const double radius = sqrt(-2.0 * log(1.0 - UniformAt(seed, 2 * i)));
  return a + b * radius * cos(6.283185307179586 * UniformAt(seed, 2 * i + 1));
}

// floor(a / b) for b > 0 and any sign of a.
PEBBLE_HOST_DEVICE inline int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// ceil(a / b) for b > 0 and any sign of a.
PEBBLE_HOST_DEVICE inline int64_t CeilDiv(int64_t a, int64_t b) {
  return -FloorDiv(-a, b);
}

// One spatial axis of an averaging pool, mapping `in` positions to `out`
// bins:
//  - a window (avgpool): bin o covers [o stride - padding, + kernel),
//    clipped to the input; the divisor is `kernel` whatever the clipping
//    (PyTorch's count_include_pad=True default, docs/operators.md), or
//    with count_include_pad false the bin's size within the input;
//  - adaptive (adaptive_avgpool): bin o covers [floor(o in / out),
//    ceil((o + 1) in / out)) and its divisor is its size (PyTorch's bins,
//    aten/src/ATen/native/AdaptiveAvgPooling.cpp).
// An absent axis of a 2-D pool is in = out = kernel = stride = 1.
struct PoolAxis {
  int64_t in = 1, out = 1;
  bool adaptive = false;
  int64_t kernel = 1, stride = 1, padding = 0;  // windows only
  bool count_include_pad = true;                 // windows only
};

// First input position of bin o (inclusive).
PEBBLE_HOST_DEVICE inline int64_t BinBegin(const PoolAxis& a, int64_t o) {
  if (a.adaptive) return o * a.in / a.out;
  const int64_t b = o * a.stride - a.padding;
  return b < 0 ? 0 : b;
}

// One past the last input position of bin o.
PEBBLE_HOST_DEVICE inline int64_t BinEnd(const PoolAxis& a, int64_t o) {
  if (a.adaptive) return CeilDiv((o + 1) * a.in, a.out);
  const int64_t e = o * a.stride - a.padding + a.kernel;
  return e > a.in ? a.in : e;
}

// What bin o's sum is divided by along this axis.
PEBBLE_HOST_DEVICE inline int64_t BinDivisor(const PoolAxis& a, int64_t o) {
  return a.adaptive || !a.count_include_pad ? BinEnd(a, o) - BinBegin(a, o) : a.kernel;
}

// The bins that contain input position i are [FirstBin, LastBin]
// (inclusive; empty when LastBin < FirstBin): what a backward pass gathers
// from, instead of scattering with atomics.
PEBBLE_HOST_DEVICE inline int64_t FirstBin(const PoolAxis& a, int64_t i) {
  // adaptive: ceil((o + 1) in / out) > i  <=>  o >= floor(i out / in).
  const int64_t f = a.adaptive
                        ? i * a.out / a.in
                        : CeilDiv(i + a.padding - a.kernel + 1, a.stride);
  return f < 0 ? 0 : f;
}

PEBBLE_HOST_DEVICE inline int64_t LastBin(const PoolAxis& a, int64_t i) {
  // adaptive: floor(o in / out) <= i  <=>  o < (i + 1) out / in.
  const int64_t l = a.adaptive ? CeilDiv((i + 1) * a.out, a.in) - 1
                               : FloorDiv(i + a.padding, a.stride);
  return l > a.out - 1 ? a.out - 1 : l;
}

// Flat index i of (planes, D, H, W) as its plane and position.
struct Index3 {
  int64_t plane, d, h, w;
};
PEBBLE_HOST_DEVICE inline Index3 Unravel3(int64_t i, int64_t depth,
                                          int64_t height, int64_t width) {
  return {i / (width * height * depth), (i / (width * height)) % depth,
          (i / width) % height, i % width};
}

// What bin (od, oh, ow) of axes[0..2] is divided by.
PEBBLE_HOST_DEVICE inline int64_t BinDivisor3(const PoolAxis* axes, int64_t od,
                                              int64_t oh, int64_t ow) {
  return BinDivisor(axes[0], od) * BinDivisor(axes[1], oh) *
         BinDivisor(axes[2], ow);
}

// The two element functions of the averaging pools over planes (D, H, W) ->
// (oD, oH, oW) with axes[0..2], as the CUDA kernels run them (one thread per
// element; tests/kernel_math_test.cc runs them on the host). `load(j)` is
// element j (a flat index) of the input (x, or the gradient g) as float.

// Output element i: the bin's sum in fp64 over the product of the divisors.
PEBBLE_NO_EXEC_CHECK
template <typename Load>
PEBBLE_HOST_DEVICE inline float AvgPoolAt(const PoolAxis* axes, int64_t i,
                                          const Load& load) {
  const PoolAxis &ad = axes[0], &ah = axes[1], &aw = axes[2];
  const Index3 o = Unravel3(i, ad.out, ah.out, aw.out);
  const int64_t base = o.plane * ad.in * ah.in * aw.in;
  double sum = 0.0;
  for (int64_t d = BinBegin(ad, o.d); d < BinEnd(ad, o.d); ++d) {
    for (int64_t h = BinBegin(ah, o.h); h < BinEnd(ah, o.h); ++h) {
      const int64_t row = base + (d * ah.in + h) * aw.in;
      for (int64_t w = BinBegin(aw, o.w); w < BinEnd(aw, o.w); ++w) {
        sum += load(row + w);
      }
    }
  }
  const int64_t divisor = BinDivisor3(axes, o.d, o.h, o.w);
  return static_cast<float>(sum / static_cast<double>(divisor));
}

// Input-gradient element i: g / divisor summed in fp32 over the bins that
// contain i, in output order (the order of a scatter over the outputs).
PEBBLE_NO_EXEC_CHECK
template <typename Load>
PEBBLE_HOST_DEVICE inline float AvgPoolGradAt(const PoolAxis* axes, int64_t i,
                                              const Load& load) {
  const PoolAxis &ad = axes[0], &ah = axes[1], &aw = axes[2];
  const Index3 x = Unravel3(i, ad.in, ah.in, aw.in);
  const int64_t base = x.plane * ad.out * ah.out * aw.out;
  float acc = 0.f;
  for (int64_t od = FirstBin(ad, x.d); od <= LastBin(ad, x.d); ++od) {
    for (int64_t oh = FirstBin(ah, x.h); oh <= LastBin(ah, x.h); ++oh) {
      for (int64_t ow = FirstBin(aw, x.w); ow <= LastBin(aw, x.w); ++ow) {
        acc += load(base + (od * ah.out + oh) * aw.out + ow) /
               static_cast<float>(BinDivisor3(axes, od, oh, ow));
      }
    }
  }
  return acc;
}

// Note [Upsample taps]. upsample along one axis of `in` -> `out` elements
// (UpsampleAxis): output o reads inputs i0 and i1 with weights l0 and l1.
// Source indices follow PyTorch 1.13's CPU kernels
// (aten/src/ATen/native/UpSample.h), in float as there. `scale` is the
// source step per output, compute_scales_value's: float(1 / scale_factor)
// where a scale factor was given (an integer `scale` is one), else
// float(in) / out.
//  - nearest: i0 = i1 = min(floor(o * scale), in - 1) (nearest_idx; out =
//    in and out = 2 in are exact copies and shifts);
//  - linear: s = align_corners ? (in - 1) / (out - 1) (0 when out = 1)
//    : scale (area_pixel_compute_scale); src = align_corners ? s * o :
//    max(s * (o + 0.5) - 0.5, 0) with o + 0.5 in double
//    (area_pixel_compute_source_index); i0 = floor(src), i1 = i0 + (i0 <
//    in - 1), l1 = clamp(src - i0, 0, 1), l0 = 1 - l1; out == in copies.
// A factor below 1 (downsampling) samples as PyTorch does, without
// antialiasing.
struct UpsampleAxis {
  int64_t in = 1, out = 1;
  float scale = 1.f;
};

PEBBLE_HOST_DEVICE inline UpsampleAxis MakeUpsampleAxis(int64_t in, int64_t out,
                                                        double scale_factor) {
  UpsampleAxis a;
  a.in = in;
  a.out = out;
  a.scale = scale_factor > 0 ? static_cast<float>(1.0 / scale_factor)
                             : static_cast<float>(in) / static_cast<float>(out);
  return a;
}

// The source step per output of an interpolation along `a`: the scale, or
// (in - 1) / (out - 1) with align_corners (area_pixel_compute_scale).
PEBBLE_HOST_DEVICE inline float UpsampleStep(const UpsampleAxis& a, bool interpolating,
                                             bool align_corners) {
  if (!(interpolating && align_corners)) return a.scale;
  return a.out > 1 ? static_cast<float>(a.in - 1) / static_cast<float>(a.out - 1) : 0.f;
}

// The source coordinate of output o of an interpolation
// (area_pixel_compute_source_index): step * o with align_corners, else
// step * (o + 0.5) - 0.5 with o + 0.5 in double, clamped at 0 unless
// `cubic`.
PEBBLE_HOST_DEVICE inline float UpsampleSource(int64_t o, const UpsampleAxis& a,
                                               bool align_corners, bool cubic) {
  const float step = UpsampleStep(a, true, align_corners);
  if (align_corners) return step * static_cast<float>(o);
  const float src =
      static_cast<float>(static_cast<double>(step) * (static_cast<double>(o) + 0.5) - 0.5);
  return !cubic && src < 0.f ? 0.f : src;
}

struct UpsampleTap {
  int64_t i0 = 0, i1 = 0;
  float l0 = 1.f, l1 = 0.f;
};

PEBBLE_HOST_DEVICE inline UpsampleTap UpsampleTapAt(int64_t o, const UpsampleAxis& a,
                                                    bool nearest, bool align_corners) {
  const int64_t in = a.in, out = a.out;
  UpsampleTap t;
  if (out == in) {
    t.i0 = t.i1 = o;
    return t;
  }
  if (nearest) {
    if (out == 2 * in) {
      t.i0 = o >> 1;
    } else {
      // floor of a non-negative float: truncation.
      t.i0 = static_cast<int64_t>(static_cast<float>(o) * a.scale);
      if (t.i0 < 0) t.i0 = 0;
      if (t.i0 > in - 1) t.i0 = in - 1;
    }
    t.i1 = t.i0;
    return t;
  }
  const float src = UpsampleSource(o, a, align_corners, false);
  t.i0 = static_cast<int64_t>(src);
  if (t.i0 > in - 1) t.i0 = in - 1;  // keeps reads in
  float l1 = src - static_cast<float>(t.i0);
  l1 = l1 < 0.f ? 0.f : (l1 > 1.f ? 1.f : l1);
  t.i1 = t.i0 + (t.i0 < in - 1 ? 1 : 0);
  t.l1 = l1;
  t.l0 = 1.f - l1;
  return t;
}

// The weight with which tap `t` reads input i (0 when it does not).
PEBBLE_HOST_DEVICE inline float UpsampleWeight(const UpsampleTap& t,
                                               int64_t i) {
  return (t.i0 == i ? t.l0 : 0.f) + (t.i1 == i ? t.l1 : 0.f);
}

// Note [Bicubic taps]. bicubic upsample along one axis, PyTorch 1.13's
// upsample_bicubic2d (Keys' cubic convolution with A = -0.75,
// get_cubic_upsample_coefficients): src as linear's (above) but not
// clamped at 0 (area_pixel_compute_source_index with cubic); i =
// min(floor(src), in - 1), t = clamp(src - i, 0, 1)
// (guard_index_and_lambda); taps i - 1 .. i + 2, each clamped into [0,
// in - 1] (upsample_get_value_bounded), so an edge input may be read by
// several taps of one output. out = in gives weights (0, 1, 0, 0): a copy.
struct CubicTap {
  int64_t i[4] = {0, 0, 0, 0};
  float w[4] = {0.f, 0.f, 0.f, 0.f};
};

PEBBLE_HOST_DEVICE inline float CubicConvolution1(float x, float a) {
  return ((a + 2) * x - (a + 3)) * x * x + 1;
}
PEBBLE_HOST_DEVICE inline float CubicConvolution2(float x, float a) {
  return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
}

PEBBLE_HOST_DEVICE inline CubicTap CubicTapAt(int64_t o, const UpsampleAxis& a,
                                              bool align_corners) {
  const float src = UpsampleSource(o, a, align_corners, true);
  int64_t i = static_cast<int64_t>(floor(static_cast<double>(src)));
  if (i > a.in - 1) i = a.in - 1;
  float t = src - static_cast<float>(i);
  t = t < 0.f ? 0.f : (t > 1.f ? 1.f : t);
  const float kA = -0.75f;
  CubicTap tap;
  tap.w[0] = CubicConvolution2(t + 1.f, kA);
  tap.w[1] = CubicConvolution1(t, kA);
  tap.w[2] = CubicConvolution1(1.f - t, kA);
  tap.w[3] = CubicConvolution2(1.f - t + 1.f, kA);
  for (int k = 0; k < 4; ++k) {
    int64_t at = i - 1 + k;
    tap.i[k] = at < 0 ? 0 : (at > a.in - 1 ? a.in - 1 : at);
  }
  return tap;
}

// The weight with which tap `t` reads input i (0 when it does not).
PEBBLE_HOST_DEVICE inline float CubicWeight(const CubicTap& t, int64_t i) {
  float w = 0.f;
  for (int k = 0; k < 4; ++k) w += t.i[k] == i ? t.w[k] : 0.f;
  return w;
}

// The outputs o for which reads(o), a contiguous range [*first, *last]
// (empty when first > last) within `margin` inputs of input i: the source
// advances one input per 1 / step outputs, so the range lies strictly
// within (i - margin) / step - margin .. (i + margin) / step + margin. The
// first input's range starts at 0 and the last one's ends at out - 1
// (sources past the ends are clamped to them).
template <typename Reads>
PEBBLE_HOST_DEVICE inline void ContiguousReaders(int64_t i, const UpsampleAxis& a, float step,
                                                 int64_t margin, Reads reads, int64_t* first,
                                                 int64_t* last) {
  const int64_t out = a.out;
  int64_t lo = 0, hi = out - 1;
  if (step > 0.f) {
    const double per_input = 1.0 / static_cast<double>(step);
    lo = static_cast<int64_t>(floor(per_input * static_cast<double>(i - margin))) - margin;
    hi = static_cast<int64_t>(ceil(per_input * static_cast<double>(i + margin))) + margin;
  }
  if (lo < 0 || i == 0) lo = 0;
  if (hi > out - 1 || i == a.in - 1) hi = out - 1;
  *first = hi + 1;
  *last = hi;
  for (int64_t o = lo; o <= hi; ++o) {
    if (reads(o)) {
      if (*first > hi) *first = o;
      *last = o;
    } else if (*first <= hi) {
      break;  // past the contiguous readers
    }
  }
  if (*first > hi) *last = *first - 1;
}

// The outputs that read input i (nearest or linear taps). i0 is
// non-decreasing in o and i is read exactly where i0 is i - 1 or i, so
// the readers are contiguous, within 2 inputs of i. kernel_math_test
// compares the result with a full scan.
PEBBLE_HOST_DEVICE inline void UpsampleReaders(int64_t i, const UpsampleAxis& a, bool nearest,
                                               bool align_corners, int64_t* first,
                                               int64_t* last) {
  ContiguousReaders(
      i, a, UpsampleStep(a, !nearest, align_corners), 2,
      [&](int64_t o) {
        const UpsampleTap t = UpsampleTapAt(o, a, nearest, align_corners);
        return t.i0 == i || t.i1 == i;
      },
      first, last);
}

// The outputs that read input i through bicubic taps: the taps' least and
// greatest indices are non-decreasing in o, so the readers are contiguous,
// within 3 inputs of i.
PEBBLE_HOST_DEVICE inline void CubicReaders(int64_t i, const UpsampleAxis& a, bool align_corners,
                                            int64_t* first, int64_t* last) {
  ContiguousReaders(
      i, a, UpsampleStep(a, true, align_corners), 3,
      [&](int64_t o) {
        const CubicTap t = CubicTapAt(o, a, align_corners);
        return t.i[0] <= i && i <= t.i[3];
      },
      first, last);
}

// Head split geometry (docs/operators.md, split_heads / merge_heads): the
// heads tensor (B, H, S, Dh) is part of the merged tensor (B, S, width) at
// column `column`: heads[b, h, s, e] = merged[b, s, column + h Dh + e].
struct HeadsMap {
  int64_t heads = 1, seq = 1, head_dim = 1;
  int64_t width = 1;   // merged row length
  int64_t column = 0;  // first merged column of this part
};

// The merged-tensor index of heads-tensor element `i`.
PEBBLE_HOST_DEVICE inline int64_t MergedIndex(const HeadsMap& m, int64_t i) {
  const int64_t e = i % m.head_dim;
  int64_t r = i / m.head_dim;
  const int64_t s = r % m.seq;
  r /= m.seq;
  const int64_t h = r % m.heads;
  const int64_t b = r / m.heads;
  return (b * m.seq + s) * m.width + m.column + h * m.head_dim + e;
}

// Transpose and flip geometry (docs/operators.md, transpose, flip): out[i]
// = x[PermutedSource(p, i)], where out has dims out_dims (row-major) and
// src_strides[d] is x's stride (in elements) of the dim that becomes out's
// dim d, i.e. x's stride of dim perm[d], negated where flip reverses the
// dim (base then starts at that dim's last element). Rank at most
// kMaxPermuteRank.
inline constexpr int kMaxPermuteRank = 8;
struct PermuteMap {
  int rank = 0;
  int64_t base = 0;
  int64_t out_dims[kMaxPermuteRank] = {};
  int64_t src_strides[kMaxPermuteRank] = {};
};

// The x index of output element `i`.
PEBBLE_HOST_DEVICE inline int64_t PermutedSource(const PermuteMap& p,
                                                 int64_t i) {
  int64_t src = p.base;
  for (int d = p.rank - 1; d >= 0; --d) {
    src += (i % p.out_dims[d]) * p.src_strides[d];
    i /= p.out_dims[d];
  }
  return src;
}

// The map of transpose(x, perm) for x of `rank` dims `x_dims`; perm is a
// permutation of [0, rank) (checked by the operator table).
PEBBLE_HOST_DEVICE inline PermuteMap MakePermuteMap(const int64_t* x_dims,
                                                    const int64_t* perm,
                                                    int rank) {
  PermuteMap p;
  p.rank = rank;
  int64_t x_strides[kMaxPermuteRank];
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    x_strides[d] = stride;
    stride *= x_dims[d];
  }
  for (int d = 0; d < rank; ++d) {
    p.out_dims[d] = x_dims[perm[d]];
    p.src_strides[d] = x_strides[perm[d]];
  }
  return p;
}

// The map of flip(x, dims) for x of `rank` dims `x_dims`; flipped[d]: dim
// d is reversed.
PEBBLE_HOST_DEVICE inline PermuteMap MakeFlipMap(const int64_t* x_dims, const bool* flipped,
                                                 int rank) {
  PermuteMap p;
  p.rank = rank;
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    p.out_dims[d] = x_dims[d];
    p.src_strides[d] = flipped[d] ? -stride : stride;
    if (flipped[d] && x_dims[d] > 0) p.base += (x_dims[d] - 1) * stride;
    stride *= x_dims[d];
  }
  return p;
}

// Note [Index fault keys]. The CUDA backend checks the indices of
// embedding and the targets of softmax_cross_entropy on the device, where a
// kernel cannot return an error. Each checked launch gets a tag, counting
// from 0 in enqueue order, and every bad position p of launch `tag` lowers
// one device word to IndexFaultKey(tag, p) with an atomic minimum. The word
// then holds the first bad position of the first launch that had one, the
// position the CPU backend reports, whatever the thread order; it starts at
// kNoIndexFault.
inline constexpr int kIndexFaultPositionBits = 40;
inline constexpr uint64_t kNoIndexFault = ~uint64_t{0};
// Tags and positions must stay below these (kNoIndexFault is never a key).
inline constexpr uint64_t kIndexFaultTagLimit =
    (uint64_t{1} << (64 - kIndexFaultPositionBits)) - 1;
inline constexpr uint64_t kIndexFaultPositionLimit = uint64_t{1}
                                                     << kIndexFaultPositionBits;

PEBBLE_HOST_DEVICE inline uint64_t IndexFaultKey(uint64_t tag,
                                                 uint64_t position) {
  return (tag << kIndexFaultPositionBits) | position;
}
PEBBLE_HOST_DEVICE inline uint64_t IndexFaultTag(uint64_t key) {
  return key >> kIndexFaultPositionBits;
}
PEBBLE_HOST_DEVICE inline uint64_t IndexFaultPosition(uint64_t key) {
  return key & (kIndexFaultPositionLimit - 1);
}

// Note [Border padding]. pad's modes reflect and replicate (PyTorch's
// ReflectionPad and ReplicationPad, ONNX Pad's reflect and edge): along a
// dim of input size n padded by `before` elements, output o reads input
// s = o - before mapped back into [0, n): reflected about the first and
// last elements (-1 reads 1; needs before, after < n, as PyTorch) or
// clamped to them. Each dim is independent, so an output element reads
// the input element of its per-dim sources (BorderSource), and the
// backward gathers, for each input element, the gradient of every output
// that reads it (ForEachBorderReader), in a fixed order: no atomics, the
// same sums on both backends. Rank at most kMaxBorderRank.
inline constexpr int kMaxBorderRank = 6;
enum class BorderMode : int { kReflect = 0, kReplicate = 1 };
struct BorderPad {
  BorderMode mode = BorderMode::kReflect;
  int rank = 0;
  int64_t in[kMaxBorderRank] = {};
  int64_t out[kMaxBorderRank] = {};
  int64_t before[kMaxBorderRank] = {};
};

// The input index that output index s + before reads along a dim of size n.
PEBBLE_HOST_DEVICE inline int64_t BorderIndex(BorderMode mode, int64_t s, int64_t n) {
  if (mode == BorderMode::kReplicate) return s < 0 ? 0 : (s >= n ? n - 1 : s);
  return s < 0 ? -s : (s >= n ? 2 * (n - 1) - s : s);
}

// The flat input index that flat output index o reads.
PEBBLE_HOST_DEVICE inline int64_t BorderSource(const BorderPad& p, int64_t o) {
  int64_t src = 0, stride = 1;
  for (int d = p.rank - 1; d >= 0; --d) {
    const int64_t od = o % p.out[d];
    o /= p.out[d];
    src += BorderIndex(p.mode, od - p.before[d], p.in[d]) * stride;
    stride *= p.in[d];
  }
  return src;
}

// The outputs along one dim that read input index i: up to three ranges
// [lo, hi) (reflect: i itself and its two mirror images; replicate: i, or
// for an end element the run of padding it fills).
struct BorderReaders {
  int count = 0;
  int64_t lo[3] = {}, hi[3] = {};
};
PEBBLE_HOST_DEVICE inline BorderReaders ReadersAlongDim(BorderMode mode, int64_t i, int64_t n,
                                                       int64_t before, int64_t out) {
  BorderReaders r;
  if (mode == BorderMode::kReplicate) {
    r.count = 1;
    r.lo[0] = i == 0 ? 0 : i + before;
    r.hi[0] = i == n - 1 ? out : i + before + 1;
    return r;
  }
  r.count = 1;
  r.lo[0] = i + before;
  r.hi[0] = i + before + 1;
  if (i >= 1 && i <= before) {  // read by output before - i, left of x
    r.lo[r.count] = before - i;
    r.hi[r.count++] = before - i + 1;
  }
  const int64_t right = before + 2 * (n - 1) - i;  // right of x
  if (right >= before + n && right < out) {
    r.lo[r.count] = right;
    r.hi[r.count++] = right + 1;
  }
  return r;
}

// Calls f(o) for every flat output index o that reads flat input index i,
// the last dim varying fastest.
PEBBLE_NO_EXEC_CHECK
template <typename F>
PEBBLE_HOST_DEVICE inline void ForEachBorderReader(const BorderPad& p, int64_t i, F f) {
  BorderReaders r[kMaxBorderRank];
  int64_t stride[kMaxBorderRank];
  int64_t s = 1;
  for (int d = p.rank - 1; d >= 0; --d) {
    r[d] = ReadersAlongDim(p.mode, i % p.in[d], p.in[d], p.before[d], p.out[d]);
    i /= p.in[d];
    stride[d] = s;
    s *= p.out[d];
  }
  int k[kMaxBorderRank] = {};
  int64_t o[kMaxBorderRank];
  for (int d = 0; d < p.rank; ++d) o[d] = r[d].lo[0];
  while (true) {
    int64_t flat = 0;
    for (int d = 0; d < p.rank; ++d) flat += o[d] * stride[d];
    f(flat);
    int d = p.rank - 1;
    for (; d >= 0; --d) {  // the next combination, an odometer
      if (++o[d] < r[d].hi[k[d]]) break;
      if (++k[d] < r[d].count) {
        o[d] = r[d].lo[k[d]];
        break;
      }
      k[d] = 0;
      o[d] = r[d].lo[0];
    }
    if (d < 0) return;
  }
}

// Note [Cast values]. `cast` converts as PyTorch's `.to(dtype)` does where
// that is defined: a float to a float rounds to nearest, an integer to a
// float too, but through fp32 (which holds every fp16 and bf16 value), so
// an integer beyond 2^24 made fp16 or bf16 is rounded twice, as PyTorch
// rounds it; a float to an integer truncates toward zero. Where C++ leaves the conversion
// undefined, pebble defines it, alike on both backends: NaN becomes 0, a
// float beyond int64's range its nearest bound, and a value cast to u8
// keeps the low 8 bits of its int64 (300 gives 44, -1 gives 255, as
// PyTorch on x86 gives for floats within int32's range).
PEBBLE_HOST_DEVICE inline int64_t CastToInt64(double v) {
  constexpr double kTwo63 = 9223372036854775808.0;
  if (!(v == v)) return 0;
  if (v >= kTwo63) return INT64_MAX;
  if (v < -kTwo63) return INT64_MIN;
  return static_cast<int64_t>(v);
}
PEBBLE_HOST_DEVICE inline uint8_t CastToUInt8(int64_t v) {
  return static_cast<uint8_t>(static_cast<uint64_t>(v) & 0xff);
}
PEBBLE_HOST_DEVICE inline uint8_t CastToUInt8(double v) { return CastToUInt8(CastToInt64(v)); }

// Note [Broadcast index]. compare's operands and masked_fill's mask are
// read over the result by NumPy's rules in full (unlike add's one block):
// the operand's dims are aligned on the result's trailing dims, and a dim
// of 1 (or a missing leading dim) repeats. Flat result index o reads the
// operand at BroadcastSource(b, o), with stride 0 along every repeated dim.
// Rank at most kMaxBroadcastRank.
inline constexpr int kMaxBroadcastRank = 8;
struct BroadcastIndex {
  int rank = 0;
  int64_t out[kMaxBroadcastRank] = {};
  int64_t stride[kMaxBroadcastRank] = {};
};

// The index of an operand of dims in[0, in_rank) read over a result of dims
// out[0, out_rank); false where it does not broadcast so (a dim neither 1
// nor the result's, a higher rank) or the rank is above kMaxBroadcastRank.
PEBBLE_HOST_DEVICE inline bool MakeBroadcastIndex(const int64_t* out, int out_rank,
                                                  const int64_t* in, int in_rank,
                                                  BroadcastIndex* b) {
  if (out_rank > kMaxBroadcastRank || in_rank > out_rank) return false;
  b->rank = out_rank;
  int64_t stride = 1;
  for (int d = out_rank - 1; d >= 0; --d) {
    const int k = d - (out_rank - in_rank);  // the operand's dim, or < 0
    const int64_t n = k >= 0 ? in[k] : 1;
    if (n != 1 && n != out[d]) return false;
    b->out[d] = out[d];
    b->stride[d] = n == 1 ? 0 : stride;
    stride *= n;
  }
  return true;
}

// The flat operand index that flat result index o reads.
PEBBLE_HOST_DEVICE inline int64_t BroadcastSource(const BroadcastIndex& b, int64_t o) {
  int64_t src = 0;
  for (int d = b.rank - 1; d >= 0; --d) {
    src += (o % b.out[d]) * b.stride[d];
    o /= b.out[d];
  }
  return src;
}

// compare's `op`: six comparisons, and `and` / `or` of the operands taken
// as truth values (not 0). NaN compares as IEEE 754 says (unequal to
// everything; every ordering false) and is true as a truth value, as in
// PyTorch.
enum class CompareOp : int { kEq = 0, kNe, kLt, kLe, kGt, kGe, kAnd, kOr };
template <typename V>
PEBBLE_HOST_DEVICE inline bool Compares(CompareOp op, V a, V b) {
  switch (op) {
    case CompareOp::kEq: return a == b;
    case CompareOp::kNe: return a != b;
    case CompareOp::kLt: return a < b;
    case CompareOp::kLe: return a <= b;
    case CompareOp::kGt: return a > b;
    case CompareOp::kGe: return a >= b;
    case CompareOp::kAnd: return a != V(0) && b != V(0);
    case CompareOp::kOr: return a != V(0) || b != V(0);
  }
  return false;
}

}  // namespace pebble::kmath

#endif  // PEBBLE_RUNTIME_KERNEL_MATH_H_
