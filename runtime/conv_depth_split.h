// The arithmetic of splitting a convolution along one spatial axis (the
// depth of a 3-D convolution) into slices that each run as a convolution of
// their own with padding 0 along that axis, and of the batch split before it
// (docs/cuda.md, "Split fallback").
// Pure host code: the CUDA backend runs the slices (runtime/cuda/cuda_dnn.cc),
// tests/conv_depth_split_test.cc checks on the CPU that the slices reproduce
// the unsplit convolution.
//
// Conventions along the axis: x has `in` planes, y (and dy) `out` planes,
// out = (in + 2 pad - kernel) / stride + 1; output plane o reads the x
// planes o * stride - pad + j for j in [0, kernel), planes outside [0, in)
// being the zeros of the padding.
//
// A slice runs the convolution over the output planes [out_begin, out_end)
// on a window of x planes [window_begin, window_begin + window) with padding
// 0, where window = (out_end - out_begin - 1) * stride + kernel: the window
// holds the planes those outputs read, the padding included as zero planes,
// so that the slice's convolution gives exactly y[out_begin, out_end).
//
// - Forward and backward filter partition the outputs: the slice's y planes
//   are y[out_begin, out_end) of the whole, and the weight gradient is the
//   sum over the slices of their weight gradients (every product
//   dy[o] * x[i] belongs to the one slice that owns o).
// - Backward data partitions the inputs: the slice owning dx planes
//   [in_begin, in_end) convolves every output plane that reads one of them,
//   so its window's dx holds every contribution to those planes; owned
//   planes outside the window are read by no output and are zero.
#ifndef PEBBLE_RUNTIME_CONV_DEPTH_SPLIT_H_
#define PEBBLE_RUNTIME_CONV_DEPTH_SPLIT_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace pebble {

// One axis of a convolution (sizes in planes).
struct ConvAxis {
  int64_t in = 0;
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t pad = 0;  // on both ends
  int64_t out = 0;  // (in + 2 pad - kernel) / stride + 1
};

// The axis with `out` computed; the caller checks in + 2 pad >= kernel,
// stride >= 1, pad >= 0.
ConvAxis MakeConvAxis(int64_t in, int64_t kernel, int64_t stride, int64_t pad);

struct ConvSlice {
  // Output planes the slice convolves; empty (out_begin == out_end, window
  // 0) only for a backward-data slice whose planes no output reads
  // (stride > kernel): its dx planes are zeros.
  int64_t out_begin = 0;
  int64_t out_end = 0;
  // The x (forward, backward filter) or dx (backward data) window: planes
  // [window_begin, window_begin + window) of the whole; window_begin may be
  // negative and the window may reach past `in` (zero planes there).
  int64_t window_begin = 0;
  int64_t window = 0;
  // The input planes the slice owns: backward data writes exactly
  // dx[in_begin, in_end) (the slices partition [0, in)); forward and
  // backward filter set them to the window's planes inside [0, in).
  int64_t in_begin = 0;
  int64_t in_end = 0;

  int64_t outputs() const { return out_end - out_begin; }
  // The slice's own convolution along the axis: in = window, padding 0,
  // out = outputs().
  ConvAxis Axis(const ConvAxis& whole) const;
};

// [0, n) cut into min(parts, n) contiguous ranges whose lengths differ by
// at most one, longer ones first; `parts` >= 1.
std::vector<std::pair<int64_t, int64_t>> EvenRanges(int64_t n, int64_t parts);

// Forward and backward filter: the outputs [0, axis.out) in `parts` slices.
std::vector<ConvSlice> SplitOutputs(const ConvAxis& axis, int64_t parts);
// Backward data: the inputs [0, axis.in) in `parts` slices.
std::vector<ConvSlice> SplitInputs(const ConvAxis& axis, int64_t parts);

// The slice counts to try, in order, for a range of `extent` planes: 2, 4,
// 8, ... below `extent`, then `extent` itself (one plane per slice); {1}
// when extent <= 1.
std::vector<int64_t> SplitCounts(int64_t extent);

// Reading `count` planes from `first` of a row of `planes` planes, planes
// outside [0, planes) being zeros: `zeros_before` zero planes, then
// `copied` planes from `src_begin`, then `zeros_after` zero planes.
struct PlaneRun {
  int64_t zeros_before = 0;
  int64_t src_begin = 0;
  int64_t copied = 0;
  int64_t zeros_after = 0;
};
PlaneRun ClipPlanes(int64_t planes, int64_t first, int64_t count);

// ---- The batch split that comes before the depth split.

// Where to cut `batch` (>= 2) samples in two: the size of the first part,
// so that the second part of every tensor of the convolution (one entry of
// `sample_bytes` each: bytes per sample) starts as aligned as the first.
// With `step` the fewest samples whose bytes are a multiple of 16 in every
// tensor: the largest multiple of `step` up to batch / 2, or `step` itself
// when that exceeds batch / 2. When `step` is not below `batch`, the same
// with 4 bytes (cuDNN's documented minimum for tensor pointers, fp16
// included); failing that, batch / 2. Each part is cut again at multiples
// of the same step, so every part of a recursive split starts aligned
// except parts of at most their 4-byte step.
int64_t BatchSplitPoint(int64_t batch, const std::vector<int64_t>& sample_bytes);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_CONV_DEPTH_SPLIT_H_
