// Own kernels that move data: slice, transpose, pad, pad_backward, concat,
// the head splits of attention (split_heads, split_heads_backward, merge_heads) and
// the embedding look-up with its scatter-add gradient. Byte copies: the
// dtype matters only for pad's fill value and the embedding gradient's sum.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/kernel_args.h"
#include "runtime/cpu/native_util.h"
#include "runtime/kernel_math.h"

namespace pebble::native {
namespace {

using ops_internal::DoubleAttr;
using ops_internal::IntAttr;
using ops_internal::IntListAttr;
using ops_internal::NormalizeAxis;
using ops_internal::Product;

// Copies `segments` blocks of `seg_bytes` from src (stride src_stride) to
// dst (stride dst_stride), in parallel over blocks or within a block.
void CopyBlocks(std::byte* dst, int64_t dst_stride, const std::byte* src,
                int64_t src_stride, int64_t segments, int64_t seg_bytes) {
  if (segments == 1 || seg_bytes >= (1 << 18)) {
    for (int64_t s = 0; s < segments; ++s) {
      ParallelCopy(dst + s * dst_stride, src + s * src_stride, seg_bytes);
    }
    return;
  }
  ParallelFor(segments, RowGrain(seg_bytes / 4), [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      std::memcpy(dst + s * dst_stride, src + s * src_stride,
                  static_cast<size_t>(seg_bytes));
    }
  });
}

// ---- slice (x), attrs axis, begin, end.
absl::Status Slice(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx.attrs(), "axis", 0));
  ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_attr, x.rank(), "axis"));
  ASSIGN_OR_RETURN(int64_t begin, ops_internal::RequiredIntAttr(ctx.attrs(), "begin"));
  const int64_t es = DTypeSize(x.dtype);
  const int64_t outer = Product(x.shape, 0, axis);
  const int64_t inner = Product(x.shape, axis + 1, x.rank()) * es;
  const int64_t len = ctx.output.shape[axis];
  CopyBlocks(ctx.output.data, len * inner, x.data + begin * inner,
             x.shape[axis] * inner, outer, len * inner);
  return absl::OkStatus();
}

// ---- transpose (x), attr perm (checked by the operator table), and flip
// (x), attr dims: out[i] = x[PermutedSource(i)] (kernel_math.h), element by
// element of the dtype's size; rows of the output are split across
// threads.
static_assert(kmath::kMaxPermuteRank == ops_internal::kMaxTransposeRank);
void GatherByMap(const KernelContext& ctx, const kmath::PermuteMap& map) {
  const TensorView& x = ctx.inputs[0];
  const int64_t n = ctx.output.num_elements();
  const int64_t es = DTypeSize(x.dtype);
  const std::byte* src = x.data;
  std::byte* dst = ctx.output.data;
  ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(dst + i * es, src + kmath::PermutedSource(map, i) * es,
                  static_cast<size_t>(es));
    }
  });
}

absl::Status Transpose(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, IntListAttr(ctx.attrs(), "perm"));
  if (!ops_internal::PermutesInto(x.shape, perm, ctx.output.shape)) {
    return Invalid(ctx, "attr 'perm' does not permute ", x.ToString(), " into ",
                   ctx.output.ToString());
  }
  GatherByMap(ctx, kmath::MakePermuteMap(x.shape.data(), perm.data(), x.rank()));
  return absl::OkStatus();
}

// flip (x), attr dims: the same gather with the flipped dims' strides
// negated.
absl::Status Flip(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  ASSIGN_OR_RETURN(const std::vector<bool> flipped, ops_internal::FlipDims(ctx.attrs(), x.rank()));
  if (x.shape != ctx.output.shape) {
    return Invalid(ctx, "flips ", x.ToString(), " into ", ctx.output.ToString());
  }
  bool mask[kmath::kMaxPermuteRank] = {};
  for (int d = 0; d < x.rank(); ++d) mask[d] = flipped[d];
  GatherByMap(ctx, kmath::MakeFlipMap(x.shape.data(), mask, x.rank()));
  return absl::OkStatus();
}

// ---- pad (x), attrs pads (F.pad order, negative crops), value; and
// pad_backward (g), attr pads: the unpadded region, i.e. pad with the
// amounts negated (output index o reads input index o - before). Their
// modes reflect and replicate are below (BorderPadForward).

// Fills `count` elements of `es` bytes at dst with `pattern`.
void FillPattern(std::byte* dst, int64_t count, const std::byte* pattern,
                 int64_t es) {
  for (int64_t i = 0; i < count; ++i) std::memcpy(dst + i * es, pattern, es);
}

absl::Status PadImpl(const KernelContext& ctx, int sign) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  const TensorView& out = ctx.output;
  ASSIGN_OR_RETURN(std::vector<int64_t> pads, IntListAttr(ctx.attrs(), "pads"));
  double value = 0.0;
  if (sign > 0) {
    ASSIGN_OR_RETURN(value, DoubleAttr(ctx.attrs(), "value", 0.0));
  }
  const int rank = x.rank();
  std::vector<int64_t> before(rank, 0);
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    before[rank - 1 - i] = sign * pads[2 * i];
  }
  const int64_t es = DTypeSize(x.dtype);
  std::byte pattern[8] = {};
  RETURN_IF_ERROR(DispatchFloat(x.dtype, "input 0", [&](auto tag) {
    using T = decltype(tag);
    const T v = FromFloat<T>(static_cast<float>(value));
    std::memcpy(pattern, &v, sizeof(T));
    return absl::OkStatus();
  }));
  const int64_t out_last = out.shape[rank - 1];
  const int64_t in_last = x.shape[rank - 1];
  const int64_t rows = out.num_elements() / std::max<int64_t>(out_last, 1);
  // Valid output columns [c0, c1) read input columns [c0 - before, ...).
  const int64_t b_last = before[rank - 1];
  const int64_t c0 = std::clamp<int64_t>(b_last, 0, out_last);
  const int64_t c1 = std::clamp<int64_t>(in_last + b_last, c0, out_last);
  ParallelFor(rows, RowGrain(out_last), [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> idx(rank, 0);
    for (int64_t r = r0; r < r1; ++r) {
      // Input row of output row r, or -1 when it lies in the padding.
      int64_t rem = r, in_row = 0, in_mul = 1;
      bool inside = true;
      for (int d = rank - 2; d >= 0; --d) {
        const int64_t o = rem % out.shape[d];
        rem /= out.shape[d];
        const int64_t i = o - before[d];
        if (i < 0 || i >= x.shape[d]) {
          inside = false;
          break;
        }
        in_row += i * in_mul;
        in_mul *= x.shape[d];
      }
      std::byte* dst = out.data + r * out_last * es;
      if (!inside) {
        FillPattern(dst, out_last, pattern, es);
        continue;
      }
      FillPattern(dst, c0, pattern, es);
      if (c1 > c0) {
        std::memcpy(dst + c0 * es,
                    x.data + (in_row * in_last + (c0 - b_last)) * es,
                    static_cast<size_t>((c1 - c0) * es));
      }
      FillPattern(dst + c1 * es, out_last - c1, pattern, es);
    }
  });
  return absl::OkStatus();
}

// pad's reflect and replicate modes (Note [Border padding]): y[o] =
// x[BorderSource(o)].
absl::Status BorderPadForward(const KernelContext& ctx) {
  const TensorView& x = ctx.inputs[0];
  ASSIGN_OR_RETURN(const kmath::BorderPad p, BorderPadOf(ctx, /*backward=*/false));
  const int64_t es = DTypeSize(x.dtype);
  ParallelFor(ctx.output.num_elements(), kGrain, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      std::memcpy(ctx.output.data + o * es, x.data + kmath::BorderSource(p, o) * es,
                  static_cast<size_t>(es));
    }
  });
  return absl::OkStatus();
}

// dx[i] = the sum, in float in ForEachBorderReader's order, of g over the
// outputs that read x[i].
absl::Status BorderPadBackward(const KernelContext& ctx) {
  const TensorView& g = ctx.inputs[0];
  ASSIGN_OR_RETURN(const kmath::BorderPad p, BorderPadOf(ctx, /*backward=*/true));
  return DispatchFloat(g.dtype, "input 0 (grad)", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.as<T>();
    T* dx = ctx.output.as<T>();
    ParallelFor(ctx.output.num_elements(), kGrain / 8, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float sum = 0.f;
        kmath::ForEachBorderReader(p, i, [&](int64_t o) { sum += ToFloat(pg[o]); });
        dx[i] = FromFloat<T>(sum);
      }
    });
    return absl::OkStatus();
  });
}

absl::Status Pad(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(std::string mode, ops_internal::StringAttr(ctx.attrs(), "mode", "constant"));
  return mode == "constant" ? PadImpl(ctx, +1) : BorderPadForward(ctx);
}
absl::Status PadBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(std::string mode, ops_internal::StringAttr(ctx.attrs(), "mode", "constant"));
  return mode == "constant" ? PadImpl(ctx, -1) : BorderPadBackward(ctx);
}

// ---- concat (x_1 .. x_m), attr axis.
absl::Status Concat(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& out = ctx.output;
  ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx.attrs(), "axis", 1));
  ASSIGN_OR_RETURN(int axis, NormalizeAxis(axis_attr, out.rank(), "axis"));
  const int64_t es = DTypeSize(out.dtype);
  const int64_t outer = Product(out.shape, 0, axis);
  const int64_t inner = Product(out.shape, axis + 1, out.rank()) * es;
  const int64_t out_row = out.shape[axis] * inner;
  int64_t offset = 0;
  for (const TensorView& x : ctx.inputs) {
    const int64_t seg = x.shape[axis] * inner;
    CopyBlocks(out.data + offset, out_row, x.data, seg, outer, seg);
    offset += seg;
  }
  return absl::OkStatus();
}

// ---- Head splits. x (B, S, C); part `index` of `chunks` along C, as H
// heads of Dh: out[b, h, s, :] = x[b, s, index C/chunks + h Dh + (0..Dh)].
absl::Status SplitHeads(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  ASSIGN_OR_RETURN(int64_t chunks, IntAttr(ctx.attrs(), "chunks", 1));
  ASSIGN_OR_RETURN(int64_t index, IntAttr(ctx.attrs(), "index", 0));
  const int64_t es = DTypeSize(x.dtype);
  const int64_t b_n = x.shape[0], s_n = x.shape[1], c = x.shape[2];
  const int64_t h_n = ctx.output.shape[1], dh = ctx.output.shape[3];
  const int64_t part = c / chunks;
  ParallelFor(b_n * h_n * s_n, RowGrain(dh), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t s = r % s_n, h = (r / s_n) % h_n, b = r / (s_n * h_n);
      std::memcpy(ctx.output.data + r * dh * es,
                  x.data + ((b * s_n + s) * c + index * part + h * dh) * es,
                  static_cast<size_t>(dh * es));
    }
  });
  return absl::OkStatus();
}

// Writes the heads of `parts` (each (B, H, S, Dh)) into out (B, S, width)
// at column offset first_part * H * Dh; the rest of each row is zeroed when
// `zero_rest`.
void MergeInto(const TensorView& out, const std::vector<const TensorView*>& parts,
               int64_t first_part, bool zero_rest) {
  const TensorView& p0 = *parts[0];
  const int64_t es = DTypeSize(out.dtype);
  const int64_t b_n = p0.shape[0], h_n = p0.shape[1], s_n = p0.shape[2],
                dh = p0.shape[3];
  const int64_t width = out.shape[2];
  ParallelFor(b_n * s_n, RowGrain(width), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t s = r % s_n, b = r / s_n;
      std::byte* row = out.data + r * width * es;
      if (zero_rest) std::memset(row, 0, static_cast<size_t>(width * es));
      for (size_t i = 0; i < parts.size(); ++i) {
        const std::byte* src = parts[i]->data;
        for (int64_t h = 0; h < h_n; ++h) {
          std::memcpy(row + ((first_part + i) * h_n + h) * dh * es,
                      src + ((b * h_n + h) * s_n + s) * dh * es,
                      static_cast<size_t>(dh * es));
        }
      }
    }
  });
}

absl::Status MergeHeads(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  std::vector<const TensorView*> parts;
  for (const TensorView& x : ctx.inputs) parts.push_back(&x);
  MergeInto(ctx.output, parts, 0, false);
  return absl::OkStatus();
}

// split_heads_backward (g), attrs chunks, index: part `index` of the input
// gradient, zeros elsewhere.
absl::Status SplitHeadsBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  ASSIGN_OR_RETURN(int64_t index, IntAttr(ctx.attrs(), "index", 0));
  MergeInto(ctx.output, {&ctx.inputs[0]}, index, true);
  return absl::OkStatus();
}

// ---- embedding (indices i64, weight (num, dim)).

// The first index outside [0, num), as an error; indices are checked
// before any read.
absl::Status CheckIndices(const KernelContext& ctx, const TensorView& indices,
                          int64_t num) {
  const int64_t* idx = indices.as<int64_t>();
  for (int64_t i = 0; i < indices.num_elements(); ++i) {
    if (idx[i] < 0 || idx[i] >= num) {
      return Invalid(ctx, "index ", idx[i], " at position ", i,
                     " is outside [0, ", num, ")");
    }
  }
  return absl::OkStatus();
}

absl::Status Embedding(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& indices = ctx.inputs[0];
  const TensorView& weight = ctx.inputs[1];
  RETURN_IF_ERROR(CheckIndices(ctx, indices, weight.shape[0]));
  const int64_t row = weight.shape[1] * DTypeSize(weight.dtype);
  const int64_t* idx = indices.as<int64_t>();
  ParallelFor(indices.num_elements(), RowGrain(row / 4), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      std::memcpy(ctx.output.data + i * row, weight.data + idx[i] * row,
                  static_cast<size_t>(row));
    }
  });
  return absl::OkStatus();
}

// embedding_backward (g, indices), attr num_embeddings: out[j] = sum of
// g[i] over the positions i with indices[i] = j, added in position order.
// The positions are bucketed by row first (a stable counting sort), so rows
// are summed in parallel without two tasks touching one row.
absl::Status EmbeddingBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& g = ctx.inputs[0];
  const TensorView& indices = ctx.inputs[1];
  const int64_t num = ctx.output.shape[0], dim = ctx.output.shape[1];
  RETURN_IF_ERROR(CheckIndices(ctx, indices, num));
  const int64_t* idx = indices.as<int64_t>();
  const int64_t n = indices.num_elements();
  std::vector<int64_t> start(num + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++start[idx[i] + 1];
  for (int64_t j = 0; j < num; ++j) start[j + 1] += start[j];
  std::vector<int64_t> order(n);
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[next[idx[i]]++] = i;
  }
  return DispatchFloat(g.dtype, "input 0 (grad)", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.as<T>();
    T* out = ctx.output.as<T>();
    ParallelFor(num, RowGrain(dim), [&](int64_t j0, int64_t j1) {
      std::vector<float> acc(dim);
      for (int64_t j = j0; j < j1; ++j) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t = start[j]; t < start[j + 1]; ++t) {
          const T* src = pg + order[t] * dim;
          for (int64_t d = 0; d < dim; ++d) acc[d] += ToFloat(src[d]);
        }
        for (int64_t d = 0; d < dim; ++d) out[j * dim + d] = FromFloat<T>(acc[d]);
      }
    });
    return absl::OkStatus();
  });
}

}  // namespace

void RegisterNativeShapeKernels(KernelTable& table) {
  table.Register("slice", Slice);
  table.Register("transpose", Transpose);
  table.Register("flip", Flip);
  table.Register("pad", Pad);
  table.Register("pad_backward", PadBackward);
  table.Register("concat", Concat);
  table.Register("split_heads", SplitHeads);
  table.Register("split_heads_backward", SplitHeadsBackward);
  table.Register("merge_heads", MergeHeads);
  table.Register("embedding", Embedding);
  table.Register("embedding_backward", EmbeddingBackward);
}

}  // namespace pebble::native
