// Own pooling and resampling kernels: global_avgpool, adaptive_avgpool,
// upsample (nearest, bilinear, trilinear) and their gradients. All work on
// planes (n, c): a 4-D tensor is handled as 5-D with depth 1, parallel over
// planes; each plane's gradient is accumulated sequentially (deterministic,
// no two tasks write one element).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/cpu/native_util.h"
#include "runtime/kernel_math.h"

namespace pebble::native {
namespace {

using ops_internal::BoolAttr;
using ops_internal::SpatialAttr;
using ops_internal::StringAttr;

// Spatial dims of a (N, C, ...) shape as (D, H, W), depth 1 for 4-D.
struct Volume {
  int64_t planes = 0;  // N * C
  int64_t d = 1, h = 1, w = 1;
  int64_t size() const { return d * h * w; }
};

Volume VolumeOf(const Shape& s) {
  Volume v;
  v.planes = s[0] * s[1];
  if (s.size() == 5) {
    v.d = s[2];
    v.h = s[3];
    v.w = s[4];
  } else {
    v.h = s[2];
    v.w = s[3];
  }
  return v;
}

// ---- global_avgpool (x (N, C, ...)) -> (N, C): the mean of each plane,
// summed in double. Backward: each element gets g / plane size.
absl::Status GlobalAvgPool(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  const int64_t planes = x.shape[0] * x.shape[1];
  const int64_t size = x.num_elements() / std::max<int64_t>(planes, 1);
  return DispatchFloat(x.dtype, "input 0 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T* out = ctx.output.as<T>();
    ParallelFor(planes, RowGrain(size), [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const T* plane = px + p * size;
        const double sum =
            BlockedSum(0, size, [plane](int64_t i) { return ToFloat(plane[i]); });
        out[p] = FromFloat<T>(static_cast<float>(sum / static_cast<double>(size)));
      }
    });
    return absl::OkStatus();
  });
}

absl::Status GlobalAvgPoolBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& g = ctx.inputs[0];
  const int64_t planes = g.num_elements();
  const int64_t size = ctx.output.num_elements() / std::max<int64_t>(planes, 1);
  return DispatchFloat(g.dtype, "input 0 (grad)", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.as<T>();
    T* out = ctx.output.as<T>();
    ParallelFor(planes, RowGrain(size), [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const T v = FromFloat<T>(ToFloat(pg[p]) / static_cast<float>(size));
        std::fill(out + p * size, out + (p + 1) * size, v);
      }
    });
    return absl::OkStatus();
  });
}

// ---- adaptive_avgpool: PyTorch's bins [floor(i in / out),
// ceil((i + 1) in / out)) per dim (aten/src/ATen/native/AdaptiveAvgPooling*),
// through the element functions the CUDA backend runs too
// (runtime/kernel_math.h): the forward sums a bin in double; the backward
// gathers g / bin size over the bins holding each input element, in output
// order (bins may overlap), which adds in the order of PyTorch's CPU scatter.

std::array<kmath::PoolAxis, 3> AdaptiveAxes(const Volume& in,
                                            const Volume& out) {
  const int64_t ins[3] = {in.d, in.h, in.w}, outs[3] = {out.d, out.h, out.w};
  std::array<kmath::PoolAxis, 3> axes;
  for (int k = 0; k < 3; ++k) {
    axes[k].in = ins[k];
    axes[k].out = outs[k];
    axes[k].adaptive = true;
  }
  return axes;
}

// dst[i] = element(i) for every element of dst's `planes` planes of
// `dst_size` elements, a plane per task unit (src planes of `src_size`).
template <typename T, typename Element>
void ForEachPlaneElement(T* dst, int64_t planes, int64_t dst_size,
                         int64_t src_size, Element element) {
  ParallelFor(planes, RowGrain(std::max(src_size, dst_size)),
              [&](int64_t p0, int64_t p1) {
                for (int64_t i = p0 * dst_size; i < p1 * dst_size; ++i) {
                  dst[i] = FromFloat<T>(element(i));
                }
              });
}

absl::Status AdaptiveAvgPool(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  const Volume vi = VolumeOf(x.shape), vo = VolumeOf(ctx.output.shape);
  const std::array<kmath::PoolAxis, 3> axes = AdaptiveAxes(vi, vo);
  return DispatchFloat(x.dtype, "input 0 (x)", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    auto load = [px](int64_t j) { return ToFloat(px[j]); };
    ForEachPlaneElement(
        ctx.output.as<T>(), vi.planes, vo.size(), vi.size(),
        [&](int64_t i) { return kmath::AvgPoolAt(axes.data(), i, load); });
    return absl::OkStatus();
  });
}

absl::Status AdaptiveAvgPoolBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& g = ctx.inputs[0];
  const Volume vo = VolumeOf(g.shape), vi = VolumeOf(ctx.output.shape);
  const std::array<kmath::PoolAxis, 3> axes = AdaptiveAxes(vi, vo);
  return DispatchFloat(g.dtype, "input 0 (grad)", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.as<T>();
    auto load = [pg](int64_t j) { return ToFloat(pg[j]); };
    ForEachPlaneElement(
        ctx.output.as<T>(), vi.planes, vi.size(), vo.size(),
        [&](int64_t i) { return kmath::AvgPoolGradAt(axes.data(), i, load); });
    return absl::OkStatus();
  });
}

// ---- upsample (ParseUpsampling, graph/ops/op_util.h).
//
// Source indices and weights: Note [Upsample taps] in runtime/kernel_math.h,
// which the CUDA backend's kernels compute too.

struct Axis {
  std::vector<int64_t> i0, i1;
  std::vector<float> l0, l1;
};

Axis AxisOf(const kmath::UpsampleAxis& axis, bool nearest, bool align_corners) {
  Axis a;
  for (int64_t o = 0; o < axis.out; ++o) {
    const kmath::UpsampleTap t = kmath::UpsampleTapAt(o, axis, nearest, align_corners);
    a.i0.push_back(t.i0);
    a.i1.push_back(t.i1);
    a.l0.push_back(t.l0);
    a.l1.push_back(t.l1);
  }
  return a;
}

struct Resample {
  Volume in, out;
  Axis d, h, w;
  // bicubic (2-D): the taps of each output row and column (Note [Bicubic
  // taps]).
  std::vector<kmath::CubicTap> cubic_h, cubic_w;
  bool nearest = true, cubic = false;
};

absl::StatusOr<Resample> ParseResample(const KernelContext& ctx,
                                       const Shape& x, const Shape& y) {
  ASSIGN_OR_RETURN(ops_internal::Upsampling u, ops_internal::ParseUpsampling(ctx.attrs(), x));
  if (x.size() == 4) {  // 2-D: a depth of 1
    u.out.insert(u.out.begin(), 1);
    u.scale_factor.insert(u.scale_factor.begin(), 1.0);
  }
  Resample r;
  r.in = VolumeOf(x);
  r.out = VolumeOf(y);
  if (r.out.d != u.out[0] || r.out.h != u.out[1] || r.out.w != u.out[2]) {
    return Invalid(ctx, ShapeToString(y), " is not the upsampling of ", ShapeToString(x));
  }
  r.nearest = u.mode == "nearest";
  r.cubic = u.mode == "bicubic";
  const bool align = u.align_corners;
  const kmath::UpsampleAxis d = kmath::MakeUpsampleAxis(r.in.d, r.out.d, u.scale_factor[0]);
  const kmath::UpsampleAxis h = kmath::MakeUpsampleAxis(r.in.h, r.out.h, u.scale_factor[1]);
  const kmath::UpsampleAxis w = kmath::MakeUpsampleAxis(r.in.w, r.out.w, u.scale_factor[2]);
  if (r.cubic) {
    for (int64_t o = 0; o < r.out.h; ++o) r.cubic_h.push_back(kmath::CubicTapAt(o, h, align));
    for (int64_t o = 0; o < r.out.w; ++o) r.cubic_w.push_back(kmath::CubicTapAt(o, w, align));
    return r;
  }
  r.d = AxisOf(d, r.nearest, align);
  r.h = AxisOf(h, r.nearest, align);
  r.w = AxisOf(w, r.nearest, align);
  return r;
}

// Bicubic, 2-D: each output the sum over its 4 x 4 taps, row by row.
template <typename T>
void UpsampleBicubic(const Resample& r, const T* x, T* y) {
  const Volume vi = r.in, vo = r.out;
  ParallelFor(vo.planes * vo.h, RowGrain(vo.w), [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const kmath::CubicTap& th = r.cubic_h[q % vo.h];
      const T* in = x + (q / vo.h) * vi.size();
      T* out = y + q * vo.w;
      for (int64_t ow = 0; ow < vo.w; ++ow) {
        const kmath::CubicTap& tw = r.cubic_w[ow];
        float v = 0.f;
        for (int j = 0; j < 4; ++j) {
          const T* row = in + th.i[j] * vi.w;
          float along = 0.f;
          for (int k = 0; k < 4; ++k) along += tw.w[k] * ToFloat(row[tw.i[k]]);
          v += th.w[j] * along;
        }
        out[ow] = FromFloat<T>(v);
      }
    }
  });
}

// Its adjoint: each output gradient added to its 16 taps with their
// weights, plane by plane in output order (PyTorch's loop nests the taps
// the other way round: sums at the clamped edges may round differently).
template <typename T>
void UpsampleBicubicBackward(const Resample& r, const T* g, T* dx) {
  const Volume vi = r.in, vo = r.out;
  ParallelFor(vi.planes, RowGrain(vo.size()), [&](int64_t p0, int64_t p1) {
    std::vector<float> acc(vi.size());
    for (int64_t p = p0; p < p1; ++p) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      const T* gp = g + p * vo.size();
      for (int64_t oh = 0; oh < vo.h; ++oh) {
        const kmath::CubicTap& th = r.cubic_h[oh];
        for (int64_t ow = 0; ow < vo.w; ++ow) {
          const kmath::CubicTap& tw = r.cubic_w[ow];
          const float v = ToFloat(gp[oh * vo.w + ow]);
          for (int j = 0; j < 4; ++j) {
            for (int k = 0; k < 4; ++k) acc[th.i[j] * vi.w + tw.i[k]] += v * th.w[j] * tw.w[k];
          }
        }
      }
      T* out = dx + p * vi.size();
      for (int64_t i = 0; i < vi.size(); ++i) out[i] = FromFloat<T>(acc[i]);
    }
  });
}

absl::Status Upsample(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& x = ctx.inputs[0];
  ASSIGN_OR_RETURN(Resample r, ParseResample(ctx, x.shape, ctx.output.shape));
  return DispatchFloat(x.dtype, "input 0 (x)", [&](auto tag) {
    using T = decltype(tag);
    if (r.cubic) {
      UpsampleBicubic<T>(r, x.as<T>(), ctx.output.as<T>());
      return absl::OkStatus();
    }
    const Volume vi = r.in, vo = r.out;
    ParallelFor(vo.planes * vo.d * vo.h, RowGrain(vo.w), [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        // One output row (plane, od, oh).
        const int64_t oh = q % vo.h, od = (q / vo.h) % vo.d, p = q / (vo.h * vo.d);
        const T* in = x.as<T>() + p * vi.size();
        T* out = ctx.output.as<T>() + q * vo.w;
        if (r.nearest) {
          const T* row = in + (r.d.i0[od] * vi.h + r.h.i0[oh]) * vi.w;
          for (int64_t ow = 0; ow < vo.w; ++ow) out[ow] = row[r.w.i0[ow]];
          continue;
        }
        const float d0 = r.d.l0[od], d1 = r.d.l1[od];
        const float h0 = r.h.l0[oh], h1 = r.h.l1[oh];
        const T* r00 = in + (r.d.i0[od] * vi.h + r.h.i0[oh]) * vi.w;
        const T* r01 = in + (r.d.i0[od] * vi.h + r.h.i1[oh]) * vi.w;
        const T* r10 = in + (r.d.i1[od] * vi.h + r.h.i0[oh]) * vi.w;
        const T* r11 = in + (r.d.i1[od] * vi.h + r.h.i1[oh]) * vi.w;
        for (int64_t ow = 0; ow < vo.w; ++ow) {
          const int64_t w0 = r.w.i0[ow], w1 = r.w.i1[ow];
          const float l0 = r.w.l0[ow], l1 = r.w.l1[ow];
          auto lerp = [&](const T* row) {
            return l0 * ToFloat(row[w0]) + l1 * ToFloat(row[w1]);
          };
          float v = h0 * lerp(r00) + h1 * lerp(r01);
          if (d1 != 0.0f) v = d0 * v + d1 * (h0 * lerp(r10) + h1 * lerp(r11));
          out[ow] = FromFloat<T>(v);
        }
      }
    });
    return absl::OkStatus();
  });
}

// Backward: each output gradient is scattered to the (up to 8) sources with
// its weights, plane by plane, in output order (PyTorch's
// cpu_upsample_linear_backward / nearest backward order).
absl::Status UpsampleBackward(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  const TensorView& g = ctx.inputs[0];
  ASSIGN_OR_RETURN(Resample r, ParseResample(ctx, ctx.output.shape, g.shape));
  return DispatchFloat(g.dtype, "input 0 (grad)", [&](auto tag) {
    using T = decltype(tag);
    if (r.cubic) {
      UpsampleBicubicBackward<T>(r, g.as<T>(), ctx.output.as<T>());
      return absl::OkStatus();
    }
    const Volume vi = r.in, vo = r.out;
    ParallelFor(vi.planes, RowGrain(vo.size()), [&](int64_t p0, int64_t p1) {
      std::vector<float> acc(vi.size());
      for (int64_t p = p0; p < p1; ++p) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        const T* gp = g.as<T>() + p * vo.size();
        for (int64_t od = 0; od < vo.d; ++od) {
          for (int64_t oh = 0; oh < vo.h; ++oh) {
            const T* grow = gp + (od * vo.h + oh) * vo.w;
            if (r.nearest) {
              float* row = acc.data() + (r.d.i0[od] * vi.h + r.h.i0[oh]) * vi.w;
              for (int64_t ow = 0; ow < vo.w; ++ow) row[r.w.i0[ow]] += ToFloat(grow[ow]);
              continue;
            }
            const float d0 = r.d.l0[od], d1 = r.d.l1[od];
            const float h0 = r.h.l0[oh], h1 = r.h.l1[oh];
            float* r00 = acc.data() + (r.d.i0[od] * vi.h + r.h.i0[oh]) * vi.w;
            float* r01 = acc.data() + (r.d.i0[od] * vi.h + r.h.i1[oh]) * vi.w;
            float* r10 = acc.data() + (r.d.i1[od] * vi.h + r.h.i0[oh]) * vi.w;
            float* r11 = acc.data() + (r.d.i1[od] * vi.h + r.h.i1[oh]) * vi.w;
            for (int64_t ow = 0; ow < vo.w; ++ow) {
              const float v = ToFloat(grow[ow]);
              const int64_t w0 = r.w.i0[ow], w1 = r.w.i1[ow];
              const float l0 = r.w.l0[ow], l1 = r.w.l1[ow];
              r00[w0] += d0 * h0 * l0 * v;
              r00[w1] += d0 * h0 * l1 * v;
              r01[w0] += d0 * h1 * l0 * v;
              r01[w1] += d0 * h1 * l1 * v;
              if (d1 != 0.0f) {
                r10[w0] += d1 * h0 * l0 * v;
                r10[w1] += d1 * h0 * l1 * v;
                r11[w0] += d1 * h1 * l0 * v;
                r11[w1] += d1 * h1 * l1 * v;
              }
            }
          }
        }
        T* out = ctx.output.as<T>() + p * vi.size();
        for (int64_t i = 0; i < vi.size(); ++i) out[i] = FromFloat<T>(acc[i]);
      }
    });
    return absl::OkStatus();
  });
}

}  // namespace

void RegisterNativePoolKernels(KernelTable& table) {
  table.Register("global_avgpool", GlobalAvgPool);
  table.Register("global_avgpool_backward", GlobalAvgPoolBackward);
  table.Register("adaptive_avgpool", AdaptiveAvgPool);
  table.Register("adaptive_avgpool_backward", AdaptiveAvgPoolBackward);
  table.Register("upsample", Upsample);
  table.Register("upsample_backward", UpsampleBackward);
}

}  // namespace pebble::native
