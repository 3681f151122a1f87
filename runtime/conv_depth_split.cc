#include "runtime/conv_depth_split.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace pebble {
namespace {

// Floor and ceiling of a / b for b > 0 and any sign of a.
int64_t FloorDiv(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }

}  // namespace

ConvAxis MakeConvAxis(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  return ConvAxis{in, kernel, stride, pad,
                  (in + 2 * pad - kernel) / stride + 1};
}

ConvAxis ConvSlice::Axis(const ConvAxis& whole) const {
  return ConvAxis{window, whole.kernel, whole.stride, 0, outputs()};
}

std::vector<std::pair<int64_t, int64_t>> EvenRanges(int64_t n, int64_t parts) {
  parts = std::max<int64_t>(1, std::min(parts, n));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  if (n <= 0) return ranges;
  const int64_t base = n / parts, longer = n % parts;
  int64_t begin = 0;
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t end = begin + base + (i < longer ? 1 : 0);
    ranges.emplace_back(begin, end);
    begin = end;
  }
  return ranges;
}

std::vector<ConvSlice> SplitOutputs(const ConvAxis& axis, int64_t parts) {
  std::vector<ConvSlice> slices;
  for (const auto& [o0, o1] : EvenRanges(axis.out, parts)) {
    ConvSlice s;
    s.out_begin = o0;
    s.out_end = o1;
    s.window_begin = o0 * axis.stride - axis.pad;
    s.window = (o1 - o0 - 1) * axis.stride + axis.kernel;
    s.in_begin = std::clamp<int64_t>(s.window_begin, 0, axis.in);
    s.in_end = std::clamp<int64_t>(s.window_begin + s.window, 0, axis.in);
    slices.push_back(s);
  }
  return slices;
}

std::vector<ConvSlice> SplitInputs(const ConvAxis& axis, int64_t parts) {
  std::vector<ConvSlice> slices;
  for (const auto& [i0, i1] : EvenRanges(axis.in, parts)) {
    ConvSlice s;
    s.in_begin = i0;
    s.in_end = i1;
    // Output o reads planes [o s - p, o s - p + k): it reads one of
    // [i0, i1) iff o s - p <= i1 - 1 and o s - p + k - 1 >= i0.
    const int64_t lo = std::max<int64_t>(
        0, CeilDiv(i0 + axis.pad - axis.kernel + 1, axis.stride));
    const int64_t hi = std::min<int64_t>(
        axis.out - 1, FloorDiv(i1 - 1 + axis.pad, axis.stride));
    if (lo <= hi) {
      s.out_begin = lo;
      s.out_end = hi + 1;
      s.window_begin = lo * axis.stride - axis.pad;
      s.window = (hi - lo) * axis.stride + axis.kernel;
    } else {  // no output reads these planes: their dx is zero
      s.out_begin = s.out_end = 0;
      s.window_begin = i0;
      s.window = 0;
    }
    slices.push_back(s);
  }
  return slices;
}

std::vector<int64_t> SplitCounts(int64_t extent) {
  if (extent <= 1) return {1};
  std::vector<int64_t> counts;
  for (int64_t c = 2; c < extent; c *= 2) counts.push_back(c);
  counts.push_back(extent);
  return counts;
}

PlaneRun ClipPlanes(int64_t planes, int64_t first, int64_t count) {
  PlaneRun r;
  r.zeros_before = std::clamp<int64_t>(-first, 0, count);
  r.src_begin = std::max<int64_t>(first, 0);
  const int64_t end = std::min(first + count, planes);
  r.copied = std::max<int64_t>(0, end - r.src_begin);
  r.zeros_after = count - r.zeros_before - r.copied;
  return r;
}

int64_t BatchSplitPoint(int64_t batch, const std::vector<int64_t>& sample_bytes) {
  for (const int64_t align : {int64_t{16}, int64_t{4}}) {
    int64_t step = 1;  // samples
    for (const int64_t bytes : sample_bytes) {
      step = std::lcm(step, align / std::gcd(align, bytes));
    }
    if (step < batch) return std::max(step, batch / 2 / step * step);
  }
  return batch / 2;
}

}  // namespace pebble
