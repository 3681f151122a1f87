// pebble's own CUDA kernels; the contract is in cuda_kernels.h.
//
// Note [Deterministic reductions]: every reduction splits its range into a
// number of chunks that depends on the shape alone; each block reduces its
// chunk with a fixed per-thread stride and a fixed shared-memory tree in
// fp64, writes one partial per chunk, and a second kernel adds the partials
// in index order. No atomics, so a recomputed tensor has the same bits as
// the first computation (the tests compare gradients across policies
// bitwise).
#ifdef PEBBLE_CUDA_EMULATION
#include "runtime/cuda/emu/cuda_emu.h"  // first: it redefines the keywords
#endif
#include "runtime/activation_math.h"
#include "runtime/cuda/cuda_kernels.h"
#include "runtime/optimizer_math.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

// PEBBLE_KERNEL_LAUNCH(grid, block, stream, Kernel<T>)(args...) is
// Kernel<T><<<grid, block, 0, stream>>>(args...), or its host emulation in
// the emulated build (runtime/cuda/emu/cuda_emu.h). The kernel comes last,
// as its template arguments may hold commas.
#ifdef PEBBLE_CUDA_EMULATION
#define PEBBLE_KERNEL_LAUNCH(grid, block, stream, ...)                \
  ::pebble::cuda::emu::Launch((grid), (block), (stream), __VA_ARGS__, \
                              #__VA_ARGS__)
#else
#define PEBBLE_KERNEL_LAUNCH(grid, block, stream, ...) \
  __VA_ARGS__<<<(grid), (block), 0, (stream)>>>
#endif

namespace pebble::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxChunks = 512;       // partials per channel
constexpr int kMaxScalarChunks = 1024;
constexpr int64_t kChunkElements = 16384;

__device__ __forceinline__ float Ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Ld(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
__device__ __forceinline__ float Ld(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
// Integers for compare, as they are.
__device__ __forceinline__ int64_t Ld(const int64_t* p, int64_t i) { return p[i]; }
__device__ __forceinline__ int64_t Ld(const uint8_t* p, int64_t i) { return p[i]; }
__device__ __forceinline__ void St(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void St(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void St(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

int Blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > (int64_t{1} << 20)) b = int64_t{1} << 20;
  return static_cast<int>(b);
}

// Calls f(T{}) with T the storage type of `t`.
template <typename F>
cudaError_t Dispatch(KType t, F f) {
  switch (t) {
    case KType::kF32:
      return f(float{});
    case KType::kF16:
      return f(__half{});
    case KType::kBF16:
      return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

cudaError_t Launched() { return cudaGetLastError(); }

#define PEBBLE_GRID_LOOP(i, n)                                          \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{blockDim.x} * gridDim.x)

// ---- Element-wise.

__device__ __forceinline__ float Unary(UnaryOp op, float v, UnaryParams p) {
  switch (op) {
    case UnaryOp::kClip:
      return activation::Clip(v, p.a, p.b);
    case UnaryOp::kHardSigmoid:
      return activation::HardSigmoid(v, p.a, p.b);
    case UnaryOp::kHardSwish:
      return activation::HardSwish(v);
    case UnaryOp::kLeakyRelu:
      return activation::LeakyRelu(v, p.a);
    case UnaryOp::kElu:
      return activation::Elu(v, p.a, p.b, p.c);
    case UnaryOp::kSoftplus:
      return activation::Softplus(v, p.a, p.b);
    case UnaryOp::kErf:
      return activation::Erf(v);
    case UnaryOp::kSqrt:
      return activation::Sqrt(v);
    case UnaryOp::kAbs:
      return activation::Abs(v);
    case UnaryOp::kExp:
      return activation::Exp(v);
    case UnaryOp::kLog:
      return activation::Log(v);
    case UnaryOp::kRelu:
      return activation::Relu(v);
    case UnaryOp::kTanh:
      return tanhf(v);
    case UnaryOp::kSigmoid:
      return 1.f / (1.f + expf(-v));
    case UnaryOp::kGeluErf:
      return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case UnaryOp::kGeluTanh: {
      const float inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
      return 0.5f * v * (1.f + tanhf(inner));
    }
  }
  return v;
}

__device__ __forceinline__ float UnaryGrad(UnaryOp op, float g, float s, UnaryParams p) {
  switch (op) {
    case UnaryOp::kClip:
      return activation::ClipGrad(g, s, p.a, p.b);
    case UnaryOp::kHardSigmoid:
      return activation::HardSigmoidGrad(g, s, p.a, p.b);
    case UnaryOp::kHardSwish:
      return activation::HardSwishGrad(g, s);
    case UnaryOp::kLeakyRelu:
      return activation::LeakyReluGrad(g, s, p.a);
    case UnaryOp::kElu:
      return activation::EluGrad(g, s, p.a, p.b, p.c);
    case UnaryOp::kSoftplus:
      return activation::SoftplusGrad(g, s, p.a, p.b);
    case UnaryOp::kErf:
      return activation::ErfGrad(g, s);
    case UnaryOp::kSqrt:
      return activation::SqrtGrad(g, s);
    case UnaryOp::kAbs:
      return activation::AbsGrad(g, s);
    case UnaryOp::kExp:
      return activation::ExpGrad(g, s);
    case UnaryOp::kLog:
      return activation::LogGrad(g, s);
    case UnaryOp::kRelu:
      return activation::ReluGrad(g, s);
    case UnaryOp::kTanh:
      return g * (1.f - s * s);
    case UnaryOp::kSigmoid:
      return g * s * (1.f - s);
    case UnaryOp::kGeluErf: {
      const float cdf = 0.5f * (1.f + erff(s * 0.70710678118654752f));
      const float pdf = expf(-0.5f * s * s) * 0.39894228040143268f;
      return g * (cdf + s * pdf);
    }
    case UnaryOp::kGeluTanh: {
      const float beta = 0.79788456080286536f, kappa = 0.044715f;
      const float x2 = s * s;
      const float t = tanhf(beta * (s + kappa * x2 * s));
      const float left = 0.5f * s, right = 1.f + t;
      return g * (0.5f * right +
                  left * (1.f - t * t) * beta * (1.f + 3.f * kappa * x2));
    }
  }
  return g;
}

template <typename T>
__global__ void UnaryKernel(UnaryOp op, UnaryParams p, const T* x, T* y, int64_t n) {
  PEBBLE_GRID_LOOP(i, n) St(y, i, Unary(op, Ld(x, i), p));
}

template <typename T>
__global__ void UnaryGradKernel(UnaryOp op, UnaryParams p, const T* g, const T* s, T* dx,
                                int64_t n) {
  PEBBLE_GRID_LOOP(i, n) St(dx, i, UnaryGrad(op, Ld(g, i), Ld(s, i), p));
}

template <typename T>
__global__ void BinaryKernel(BinaryOp op, const T* a, const T* b, T* out,
                             int64_t n, int64_t nb, int64_t inner,
                             bool b_first) {
  PEBBLE_GRID_LOOP(i, n) {
    float u = Ld(a, i), v = Ld(b, nb == n ? i : (i / inner) % nb);
    if (b_first) {
      const float t = u;
      u = v;
      v = t;
    }
    float r;
    switch (op) {
      case BinaryOp::kAdd: r = u + v; break;
      case BinaryOp::kMul: r = u * v; break;
      case BinaryOp::kSub: r = u - v; break;
      case BinaryOp::kMaximum: r = activation::Extremum(true, u, v); break;
      case BinaryOp::kMinimum: r = activation::Extremum(false, u, v); break;
      default: r = u / v; break;
    }
    St(out, i, r);
  }
}

template <typename T>
__global__ void ExtremumBackwardKernel(bool maximum, int input, const T* g, const T* a,
                                       const T* b, T* dx, int64_t n) {
  PEBBLE_GRID_LOOP(i, n) {
    St(dx, i, activation::ExtremumGrad(maximum, input, Ld(g, i), Ld(a, i), Ld(b, i)));
  }
}

template <typename T>
__global__ void ChannelBiasKernel(T* y, const T* bias, int64_t n,
                                  int64_t channels, int64_t inner) {
  PEBBLE_GRID_LOOP(i, n) {
    const int64_t c = (i / inner) % channels;
    St(y, i, Ld(y, i) + Ld(bias, c));
  }
}

// ---- Reductions (Note [Deterministic reductions]).

// Sums Q values over the block in a fixed tree; thread 0 gets the result.
// Every launch of a kernel that calls it (or BlockMaxF) uses kThreads
// threads per block: the tree spans exactly kThreads slots.
template <int Q>
__device__ void BlockSum(double (&v)[Q]) {
  __shared__ double sh[Q][kThreads];
  for (int q = 0; q < Q; ++q) sh[q][threadIdx.x] = v[q];
  __syncthreads();
  for (unsigned s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      for (int q = 0; q < Q; ++q) sh[q][threadIdx.x] += sh[q][threadIdx.x + s];
    }
    __syncthreads();
  }
  for (int q = 0; q < Q; ++q) v[q] = sh[q][0];
  __syncthreads();
}

int ChunksFor(int64_t count, int max_chunks) {
  int64_t c = (count + kChunkElements - 1) / kChunkElements;
  if (c < 1) c = 1;
  if (c > max_chunks) c = max_chunks;
  return static_cast<int>(c);
}

// Per-channel quantities over (outer, C, inner): q0 = x (or g), q1 as below.
enum class ChannelMode : int { kSum, kSumSquares, kGradXhat };

template <typename T, ChannelMode M>
__global__ void ChannelPartials(const T* x, const T* g, const float* stats,
                                int64_t outer, int64_t channels, int64_t inner,
                                int chunks, double* partials) {
  const int64_t c = blockIdx.x;
  const int64_t j = blockIdx.y;
  const int64_t count = outer * inner;
  const int64_t per = (count + chunks - 1) / chunks;
  const int64_t begin = j * per;
  const int64_t end = begin + per < count ? begin + per : count;
  float mean = 0.f, invstd = 0.f;
  if (M == ChannelMode::kGradXhat) {
    mean = stats[c];
    invstd = stats[channels + c];
  }
  double v[2] = {0.0, 0.0};
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int64_t o = i / inner, s = i - o * inner;
    const int64_t idx = (o * channels + c) * inner + s;
    if (M == ChannelMode::kSum) {
      v[0] += Ld(x, idx);
    } else if (M == ChannelMode::kSumSquares) {
      const double a = Ld(x, idx);
      v[0] += a;
      v[1] += a * a;
    } else {
      const float gv = Ld(g, idx);
      const float xhat = (Ld(x, idx) - mean) * invstd;
      v[0] += gv;
      v[1] += static_cast<double>(gv) * xhat;
    }
  }
  BlockSum<2>(v);
  if (threadIdx.x == 0) {
    partials[(c * chunks + j) * 2 + 0] = v[0];
    partials[(c * chunks + j) * 2 + 1] = v[1];
  }
}

// Adds each channel's partials in order into sums[c * 2 + q].
__global__ void ChannelFinish(const double* partials, int64_t channels,
                              int chunks, double* sums) {
  PEBBLE_GRID_LOOP(c, channels) {
    double a = 0.0, b = 0.0;
    for (int j = 0; j < chunks; ++j) {
      a += partials[(c * chunks + j) * 2];
      b += partials[(c * chunks + j) * 2 + 1];
    }
    sums[c * 2] = a;
    sums[c * 2 + 1] = b;
  }
}

template <typename T>
__global__ void StoreSums(const double* sums, int q, T* out, int64_t channels) {
  PEBBLE_GRID_LOOP(c, channels) St(out, c, static_cast<float>(sums[c * 2 + q]));
}

__global__ void StatsFromSums(const double* sums, float* stats, int64_t channels,
                              int64_t count, double eps) {
  PEBBLE_GRID_LOOP(c, channels) {
    const double mean = sums[c * 2] / count;
    double var = sums[c * 2 + 1] / count - mean * mean;
    if (var < 0) var = 0;
    stats[c] = static_cast<float>(mean);
    stats[channels + c] = static_cast<float>(1.0 / sqrt(var + eps));
  }
}

// Runs the partials and finish kernels; sums land after the partials.
template <typename T, ChannelMode M>
cudaError_t ChannelSums(const T* x, const T* g, const float* stats,
                        int64_t outer, int64_t channels, int64_t inner,
                        void* scratch, cudaStream_t stream, double** sums) {
  const int chunks = ChunksFor(outer * inner, kMaxChunks);
  double* partials = static_cast<double*>(scratch);
  *sums = partials + channels * kMaxChunks * 2;
  dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(chunks));
  PEBBLE_KERNEL_LAUNCH(grid, kThreads, stream, ChannelPartials<T, M>)
  (x, g, stats, outer, channels, inner, chunks, partials);
  PEBBLE_KERNEL_LAUNCH(Blocks(channels), kThreads, stream, ChannelFinish)
  (partials, channels, chunks, *sums);
  return Launched();
}

template <typename T>
__global__ void BatchNormKernel(const T* x, const float* stats,
                                const float* weight, const float* bias, T* y,
                                int64_t n, int64_t channels, int64_t s) {
  PEBBLE_GRID_LOOP(i, n) {
    const int64_t c = (i / s) % channels;
    float v = (Ld(x, i) - stats[c]) * stats[channels + c];
    if (weight != nullptr) v *= weight[c];
    if (bias != nullptr) v += bias[c];
    St(y, i, v);
  }
}

template <typename T>
__global__ void BatchNormBackwardKernel(const T* g, const T* x,
                                        const float* stats, const float* weight,
                                        const double* sums, T* dx, int64_t n,
                                        int64_t channels, int64_t s,
                                        int64_t count) {
  PEBBLE_GRID_LOOP(i, n) {
    const int64_t c = (i / s) % channels;
    const float mean = stats[c], invstd = stats[channels + c];
    const float mg = static_cast<float>(sums[c * 2] / count);
    const float mgx = static_cast<float>(sums[c * 2 + 1] / count);
    const float xhat = (Ld(x, i) - mean) * invstd;
    const float w = weight != nullptr ? weight[c] : 1.f;
    St(dx, i, w * invstd * (Ld(g, i) - mg - xhat * mgx));
  }
}

// Scalar reductions: f(i) summed over [0, n).
struct MseTerm {
  template <typename T>
  __device__ double operator()(const T* a, const T* b, int64_t i) const {
    const double d = static_cast<double>(Ld(a, i)) - Ld(b, i);
    return d * d;
  }
};
struct BceTerm {
  template <typename T>
  __device__ double operator()(const T* x, const T* t, int64_t i) const {
    return activation::BceWithLogits(Ld(x, i), Ld(t, i));
  }
};
struct SumTerm {
  template <typename T>
  __device__ double operator()(const T* a, const T*, int64_t i) const {
    return Ld(a, i);
  }
};

template <typename T, typename F>
__global__ void ScalarPartials(F f, const T* a, const T* b, int64_t n,
                               int chunks, double* partials) {
  const int64_t per = (n + chunks - 1) / chunks;
  const int64_t begin = blockIdx.x * per;
  const int64_t end = begin + per < n ? begin + per : n;
  double v[1] = {0.0};
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    v[0] += f(a, b, i);
  }
  BlockSum<1>(v);
  if (threadIdx.x == 0) partials[blockIdx.x] = v[0];
}

__global__ void ScalarFinish(const double* partials, int chunks, double scale,
                             float* out) {
  double v[1] = {0.0};
  // Fixed assignment of partials to threads, then the fixed tree.
  for (int j = threadIdx.x; j < chunks; j += blockDim.x) v[0] += partials[j];
  BlockSum<1>(v);
  if (threadIdx.x == 0) out[0] = static_cast<float>(v[0] * scale);
}

template <typename T, typename F>
cudaError_t ScalarReduce(F f, const T* a, const T* b, int64_t n, double scale,
                         float* out, void* scratch, cudaStream_t stream) {
  const int chunks = ChunksFor(n, kMaxScalarChunks);
  double* partials = static_cast<double*>(scratch);
  PEBBLE_KERNEL_LAUNCH(chunks, kThreads, stream, ScalarPartials<T, F>)
  (f, a, b, n, chunks, partials);
  PEBBLE_KERNEL_LAUNCH(1, kThreads, stream, ScalarFinish)
  (partials, chunks, scale, out);
  return Launched();
}

// The gradients of the pair losses: f(pred[i], target[i]) times a scale
// of the incoming gradient g (1 when absent) and n, computed once.
struct MseGrad {
  __device__ float Scale(float g, int64_t n) const { return 2.f / static_cast<float>(n) * g; }
  __device__ float operator()(float p, float t) const { return p - t; }
};
struct BceGrad {
  __device__ float Scale(float g, int64_t n) const { return g / static_cast<float>(n); }
  __device__ float operator()(float x, float t) const {
    return activation::BceWithLogitsGrad(x, t);
  }
};

template <typename T, typename F>
__global__ void PairGradKernel(F f, const T* a, const T* b, const float* g, T* da, int64_t n) {
  const float scale = f.Scale(g != nullptr ? g[0] : 1.f, n);
  PEBBLE_GRID_LOOP(i, n) St(da, i, f(Ld(a, i), Ld(b, i)) * scale);
}

// Cross-entropy of one position: logits (outer, C, inner).
template <typename T>
__device__ double PositionLoss(const T* logits, const int64_t* target,
                               int64_t p, int64_t classes, int64_t inner) {
  const int64_t o = p / inner, s = p - o * inner;
  const T* row = logits + o * classes * inner + s;
  float mx = -INFINITY;
  for (int64_t c = 0; c < classes; ++c) mx = fmaxf(mx, Ld(row, c * inner));
  double sum = 0.0;  // the CPU backend's: fp32 exp, fp64 sum and log
  for (int64_t c = 0; c < classes; ++c) sum += expf(Ld(row, c * inner) - mx);
  const int64_t t = target[p];
  if (t < 0 || t >= classes) return NAN;
  return static_cast<double>(mx) + log(sum) -
         static_cast<double>(Ld(row, t * inner));
}

template <typename T>
__global__ void CrossEntropyPartials(const T* logits, const int64_t* target,
                                     int64_t positions, int64_t classes,
                                     int64_t inner, int chunks,
                                     double* partials) {
  const int64_t per = (positions + chunks - 1) / chunks;
  const int64_t begin = blockIdx.x * per;
  const int64_t end = begin + per < positions ? begin + per : positions;
  double v[1] = {0.0};
  for (int64_t p = begin + threadIdx.x; p < end; p += blockDim.x) {
    v[0] += PositionLoss(logits, target, p, classes, inner);
  }
  BlockSum<1>(v);
  if (threadIdx.x == 0) partials[blockIdx.x] = v[0];
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(const T* logits,
                                           const int64_t* target,
                                           const float* g, T* d,
                                           int64_t positions, int64_t classes,
                                           int64_t inner) {
  const float scale =
      (g != nullptr ? g[0] : 1.f) / static_cast<float>(positions);
  PEBBLE_GRID_LOOP(p, positions) {
    const int64_t o = p / inner, s = p - o * inner;
    const int64_t base = o * classes * inner + s;
    float mx = -INFINITY;
    for (int64_t c = 0; c < classes; ++c)
      mx = fmaxf(mx, Ld(logits, base + c * inner));
    double sum = 0.0;  // as the forward; the CPU backend's 1 / sum in fp32
    for (int64_t c = 0; c < classes; ++c)
      sum += expf(Ld(logits, base + c * inner) - mx);
    const float inv = static_cast<float>(1.0 / sum);
    const int64_t t = target[p];
    for (int64_t c = 0; c < classes; ++c) {
      const float sm = expf(Ld(logits, base + c * inner) - mx) * inv;
      St(d, base + c * inner, (sm - (c == t ? 1.f : 0.f)) * scale);
    }
  }
}

// ---- Pooling.

// Input index (within one (n, c) plane) of the argmax of output window o.
template <typename T>
__device__ int64_t WindowArgmax(const Window3& w, const T* plane, int64_t od,
                                int64_t oh, int64_t ow, float* best_out) {
  float best = -INFINITY;
  int64_t arg = -1;
  const int64_t d0 = od * w.stride[0] - w.padding[0];
  const int64_t h0 = oh * w.stride[1] - w.padding[1];
  const int64_t w0 = ow * w.stride[2] - w.padding[2];
  for (int64_t kd = 0; kd < w.kernel[0]; ++kd) {
    const int64_t d = d0 + kd;
    if (d < 0 || d >= w.in[0]) continue;
    for (int64_t kh = 0; kh < w.kernel[1]; ++kh) {
      const int64_t h = h0 + kh;
      if (h < 0 || h >= w.in[1]) continue;
      for (int64_t kw = 0; kw < w.kernel[2]; ++kw) {
        const int64_t x = w0 + kw;
        if (x < 0 || x >= w.in[2]) continue;
        const int64_t idx = (d * w.in[1] + h) * w.in[2] + x;
        const float v = Ld(plane, idx);
        // As PyTorch and the CPU backend: the first maximum wins, and every
        // NaN takes over (so the last NaN of the window is the argmax).
        if (arg < 0 || v > best || isnan(v)) {
          best = v;
          arg = idx;
        }
      }
    }
  }
  *best_out = best;
  return arg;
}

template <typename T>
__global__ void MaxPoolKernel(Window3 w, const T* x, T* y) {
  const int64_t out_plane = w.out[0] * w.out[1] * w.out[2];
  const int64_t in_plane = w.in[0] * w.in[1] * w.in[2];
  PEBBLE_GRID_LOOP(i, w.nc * out_plane) {
    const kmath::Index3 o = kmath::Unravel3(i, w.out[0], w.out[1], w.out[2]);
    float best;
    WindowArgmax(w, x + o.plane * in_plane, o.d, o.h, o.w, &best);
    St(y, i, best);
  }
}

__device__ __forceinline__ void WindowRange(int64_t i, int64_t k, int64_t s,
                                            int64_t p, int64_t out,
                                            int64_t* lo, int64_t* hi) {
  // Windows o with o*s - p <= i <= o*s - p + k - 1.
  const int64_t a = i + p - k + 1;
  *lo = a <= 0 ? 0 : (a + s - 1) / s;
  int64_t h = (i + p) / s;
  if (h > out - 1) h = out - 1;
  *hi = h;
}

template <typename T>
__global__ void MaxPoolBackwardKernel(Window3 w, const T* g, const T* x,
                                      T* dx) {
  const int64_t out_plane = w.out[0] * w.out[1] * w.out[2];
  const int64_t in_plane = w.in[0] * w.in[1] * w.in[2];
  PEBBLE_GRID_LOOP(i, w.nc * in_plane) {
    const kmath::Index3 in = kmath::Unravel3(i, w.in[0], w.in[1], w.in[2]);
    const int64_t nc = in.plane, r = i - nc * in_plane;  // r: within the plane
    int64_t dlo, dhi, hlo, hhi, wlo, whi;
    WindowRange(in.d, w.kernel[0], w.stride[0], w.padding[0], w.out[0], &dlo,
                &dhi);
    WindowRange(in.h, w.kernel[1], w.stride[1], w.padding[1], w.out[1], &hlo,
                &hhi);
    WindowRange(in.w, w.kernel[2], w.stride[2], w.padding[2], w.out[2], &wlo,
                &whi);
    float acc = 0.f;
    const T* plane = x + nc * in_plane;
    for (int64_t od = dlo; od <= dhi; ++od)
      for (int64_t oh = hlo; oh <= hhi; ++oh)
        for (int64_t ow = wlo; ow <= whi; ++ow) {
          float best;
          if (WindowArgmax(w, plane, od, oh, ow, &best) == r) {
            acc += Ld(g, nc * out_plane + (od * w.out[1] + oh) * w.out[2] + ow);
          }
        }
    St(dx, i, acc);
  }
}

// ---- Upsampling.

// Dim d of the upsample, for the tap functions of runtime/kernel_math.h.
__device__ __forceinline__ kmath::UpsampleAxis DimAxis(const Upsample3& u, int d) {
  kmath::UpsampleAxis a;
  a.in = u.in[d];
  a.out = u.out[d];
  a.scale = u.scale[d];
  return a;
}

// Output o's taps along dim d (Note [Upsample taps], the CPU backend's).
__device__ __forceinline__ kmath::UpsampleTap DimTap(const Upsample3& u, int d,
                                                     int64_t o) {
  return kmath::UpsampleTapAt(o, DimAxis(u, d), u.mode == 0, u.align_corners);
}

// Bicubic (mode 2, 2-D: depth 1): each output the sum over its 4 x 4 taps
// (Note [Bicubic taps]), as the CPU backend sums them.
template <typename T>
__device__ __forceinline__ float BicubicAt(const Upsample3& u, const T* plane,
                                           const kmath::Index3& o) {
  const kmath::CubicTap th = kmath::CubicTapAt(o.h, DimAxis(u, 1), u.align_corners);
  const kmath::CubicTap tw = kmath::CubicTapAt(o.w, DimAxis(u, 2), u.align_corners);
  float v = 0.f;
  for (int j = 0; j < 4; ++j) {
    float along = 0.f;
    for (int k = 0; k < 4; ++k) along += tw.w[k] * Ld(plane, th.i[j] * u.in[2] + tw.i[k]);
    v += th.w[j] * along;
  }
  return v;
}

template <typename T>
__global__ void UpsampleKernel(Upsample3 u, const T* x, T* y) {
  const int64_t out_plane = u.out[0] * u.out[1] * u.out[2];
  const int64_t in_plane = u.in[0] * u.in[1] * u.in[2];
  PEBBLE_GRID_LOOP(i, u.nc * out_plane) {
    const kmath::Index3 o = kmath::Unravel3(i, u.out[0], u.out[1], u.out[2]);
    if (u.mode == 2) {
      St(y, i, BicubicAt(u, x + o.plane * in_plane, o));
      continue;
    }
    const kmath::UpsampleTap td = DimTap(u, 0, o.d), th = DimTap(u, 1, o.h),
                             tw = DimTap(u, 2, o.w);
    const T* p = x + o.plane * in_plane;
    auto at = [&](int64_t d, int64_t h, int64_t w) {
      return Ld(p, (d * u.in[1] + h) * u.in[2] + w);
    };
    auto plane = [&](int64_t d) {
      return th.l0 * (tw.l0 * at(d, th.i0, tw.i0) + tw.l1 * at(d, th.i0, tw.i1)) +
             th.l1 * (tw.l0 * at(d, th.i1, tw.i0) + tw.l1 * at(d, th.i1, tw.i1));
    };
    St(y, i, td.l0 * plane(td.i0) + td.l1 * plane(td.i1));
  }
}

// The outputs along dim d that read input index i (kmath::UpsampleReaders).
struct Readers {
  int64_t first, last;
};
__device__ __forceinline__ Readers DimReaders(const Upsample3& u, int d,
                                              int64_t i) {
  Readers r;
  kmath::UpsampleReaders(i, DimAxis(u, d), u.mode == 0, u.align_corners, &r.first, &r.last);
  return r;
}

// dx[i] = sum over the outputs that read i, in output order, of the tap
// weights times g: a gather per input element (no atomics, no cap on the
// number of readers).
// Bicubic's gather: over the outputs whose taps read (h, w) (CubicReaders),
// in output order.
template <typename T>
__device__ __forceinline__ float BicubicGradAt(const Upsample3& u, const T* g_plane,
                                               const kmath::Index3& in) {
  Readers rh, rw;
  kmath::CubicReaders(in.h, DimAxis(u, 1), u.align_corners, &rh.first, &rh.last);
  kmath::CubicReaders(in.w, DimAxis(u, 2), u.align_corners, &rw.first, &rw.last);
  float acc = 0.f;
  for (int64_t oh = rh.first; oh <= rh.last; ++oh) {
    const float wh =
        kmath::CubicWeight(kmath::CubicTapAt(oh, DimAxis(u, 1), u.align_corners), in.h);
    float row = 0.f;
    for (int64_t ow = rw.first; ow <= rw.last; ++ow) {
      row += kmath::CubicWeight(kmath::CubicTapAt(ow, DimAxis(u, 2), u.align_corners), in.w) *
             Ld(g_plane, oh * u.out[2] + ow);
    }
    acc += wh * row;
  }
  return acc;
}

template <typename T>
__global__ void UpsampleBackwardKernel(Upsample3 u, const T* g, T* dx) {
  const int64_t out_plane = u.out[0] * u.out[1] * u.out[2];
  const int64_t in_plane = u.in[0] * u.in[1] * u.in[2];
  PEBBLE_GRID_LOOP(i, u.nc * in_plane) {
    const kmath::Index3 in = kmath::Unravel3(i, u.in[0], u.in[1], u.in[2]);
    if (u.mode == 2) {
      St(dx, i, BicubicGradAt(u, g + in.plane * out_plane, in));
      continue;
    }
    const Readers rd = DimReaders(u, 0, in.d), rh = DimReaders(u, 1, in.h),
                  rw = DimReaders(u, 2, in.w);
    const T* p = g + in.plane * out_plane;
    float acc = 0.f;
    for (int64_t od = rd.first; od <= rd.last; ++od) {
      const float wd = kmath::UpsampleWeight(DimTap(u, 0, od), in.d);
      for (int64_t oh = rh.first; oh <= rh.last; ++oh) {
        const float wh = kmath::UpsampleWeight(DimTap(u, 1, oh), in.h);
        const int64_t base = (od * u.out[1] + oh) * u.out[2];
        float row = 0.f;
        for (int64_t ow = rw.first; ow <= rw.last; ++ow) {
          row +=
              kmath::UpsampleWeight(DimTap(u, 2, ow), in.w) * Ld(p, base + ow);
        }
        acc += wd * wh * row;
      }
    }
    St(dx, i, acc);
  }
}

// ---- Rows.

template <typename T>
__global__ void RowMeanKernel(const T* x, T* out, int64_t length) {
  const int64_t row = blockIdx.x;
  double v[1] = {0.0};
  for (int64_t j = threadIdx.x; j < length; j += blockDim.x)
    v[0] += Ld(x, row * length + j);
  BlockSum<1>(v);
  if (threadIdx.x == 0) St(out, row, static_cast<float>(v[0] / length));
}

template <typename T>
__global__ void RowBroadcastKernel(const T* g, T* out, int64_t n,
                                   int64_t length) {
  PEBBLE_GRID_LOOP(i, n) St(out, i, Ld(g, i / length) / static_cast<float>(length));
}

// One block per row; fp32 max and sum in a fixed tree.
__device__ float BlockMaxF(float v) {
  __shared__ float sh[kThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();
  return r;
}

// softmax, or with `log` log_softmax (no causal mask then).
template <typename T>
__global__ void SoftmaxKernel(const T* x, T* y, int64_t length, bool causal,
                              int64_t rows_per_matrix, bool log) {
  const int64_t row = blockIdx.x;
  const int64_t valid =
      causal ? ((row % rows_per_matrix) + 1 < length ? (row % rows_per_matrix) + 1
                                                     : length)
             : length;
  const T* xr = x + row * length;
  T* yr = y + row * length;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, Ld(xr, j));
  mx = BlockMaxF(mx);
  double v[1] = {0.0};
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) v[0] += expf(Ld(xr, j) - mx);
  BlockSum<1>(v);
  const float sum = static_cast<float>(v[0]);
  if (log) {
    const float log_sum = logf(sum);
    for (int64_t j = threadIdx.x; j < length; j += blockDim.x)
      St(yr, j, Ld(xr, j) - mx - log_sum);
    return;
  }
  for (int64_t j = threadIdx.x; j < length; j += blockDim.x)
    St(yr, j, j < valid ? expf(Ld(xr, j) - mx) / sum : 0.f);
}

// softmax's backward, or with `log` log_softmax's: g - exp(y) sum(g).
template <typename T>
__global__ void SoftmaxBackwardKernel(const T* g, const T* y, T* dx,
                                      int64_t length, bool log) {
  const int64_t row = blockIdx.x;
  const int64_t base = row * length;
  double v[1] = {0.0};
  if (log) {
    for (int64_t j = threadIdx.x; j < length; j += blockDim.x) v[0] += Ld(g, base + j);
    BlockSum<1>(v);
    const float sum = static_cast<float>(v[0]);
    for (int64_t j = threadIdx.x; j < length; j += blockDim.x)
      St(dx, base + j, Ld(g, base + j) - expf(Ld(y, base + j)) * sum);
    return;
  }
  for (int64_t j = threadIdx.x; j < length; j += blockDim.x)
    v[0] += static_cast<double>(Ld(g, base + j)) * Ld(y, base + j);
  BlockSum<1>(v);
  const float dot = static_cast<float>(v[0]);
  for (int64_t j = threadIdx.x; j < length; j += blockDim.x)
    St(dx, base + j, Ld(y, base + j) * (Ld(g, base + j) - dot));
}

// ---- Data movement.

template <typename S>
__global__ void PadKernel(PadSpec p, const S* in, S* out, int64_t n, S fill) {
  PEBBLE_GRID_LOOP(i, n) {
    int64_t rem = i, src = 0, stride = 1;
    bool inside = true;
    for (int d = p.rank - 1; d >= 0; --d) {
      const int64_t o = rem % p.out[d];
      rem /= p.out[d];
      const int64_t s = o - p.before[d];
      if (s < 0 || s >= p.in[d]) inside = false;
      src += s * stride;
      stride *= p.in[d];
    }
    out[i] = inside ? in[src] : fill;
  }
}

template <typename T>
__global__ void BorderPadKernel(kmath::BorderPad p, const T* x, T* y, int64_t n) {
  PEBBLE_GRID_LOOP(o, n) y[o] = x[kmath::BorderSource(p, o)];
}

template <typename T>
__global__ void BorderPadBackwardKernel(kmath::BorderPad p, const T* g, T* dx, int64_t n) {
  PEBBLE_GRID_LOOP(i, n) {
    float sum = 0.f;
    kmath::ForEachBorderReader(p, i, [&](int64_t o) { sum += Ld(g, o); });
    St(dx, i, sum);
  }
}

// ---- compare, masked_fill (Note [Broadcast index]).

template <typename T>
__global__ void CompareKernel(kmath::CompareOp op, const T* a, kmath::BroadcastIndex ia,
                              const T* b, kmath::BroadcastIndex ib, uint8_t* out, int64_t n) {
  PEBBLE_GRID_LOOP(o, n) {
    out[o] = kmath::Compares(op, Ld(a, kmath::BroadcastSource(ia, o)),
                             Ld(b, kmath::BroadcastSource(ib, o)))
                 ? 1
                 : 0;
  }
}

// cast's stores (Note [Cast values]): a float read as float, an integer
// as int64 (Ld), each written in the output's type.
__device__ __forceinline__ void StCast(int64_t* p, int64_t i, float v) {
  p[i] = kmath::CastToInt64(static_cast<double>(v));
}
__device__ __forceinline__ void StCast(uint8_t* p, int64_t i, float v) {
  p[i] = kmath::CastToUInt8(static_cast<double>(v));
}
__device__ __forceinline__ void StCast(int64_t* p, int64_t i, int64_t v) { p[i] = v; }
__device__ __forceinline__ void StCast(uint8_t* p, int64_t i, int64_t v) {
  p[i] = kmath::CastToUInt8(v);
}
template <typename T>
__device__ __forceinline__ void StCast(T* p, int64_t i, float v) {
  St(p, i, v);
}
template <typename T>
__device__ __forceinline__ void StCast(T* p, int64_t i, int64_t v) {
  St(p, i, static_cast<float>(v));
}

template <typename From, typename To>
__global__ void CastKernel(const From* x, To* y, int64_t n) {
  PEBBLE_GRID_LOOP(i, n) StCast(y, i, Ld(x, i));
}

template <typename T>
__global__ void MaskedFillKernel(const T* x, const uint8_t* mask, kmath::BroadcastIndex im,
                                 float value, bool invert, T* y, int64_t n) {
  PEBBLE_GRID_LOOP(o, n) {
    const bool set = mask[kmath::BroadcastSource(im, o)] != 0;
    if (set != invert) {
      St(y, o, value);
    } else {
      y[o] = x[o];
    }
  }
}

template <typename S>
__global__ void FillKernel(S* out, int64_t n, S value) {
  PEBBLE_GRID_LOOP(i, n) out[i] = value;
}

template <typename T>
__global__ void OptimizerUpdateKernel(optim::UpdateOp op, optim::UpdateScalars s,
                                      optim::AdamHyper h, T* a, const T* b, const T* c,
                                      const float* step, int64_t n) {
  if (op == optim::UpdateOp::kAdamUpdate) optim::AdamStep(s, h, step[0]);
  PEBBLE_GRID_LOOP(i, n) {
    St(a, i, optim::Update(op, s, Ld(a, i), Ld(b, i), c != nullptr ? Ld(c, i) : 0.f));
  }
}

__global__ void IncrementKernel(float* count) {
  if (blockIdx.x == 0 && threadIdx.x == 0) count[0] += 1.f;
}

template <typename T>
__global__ void BroadcastScalarKernel(const float* g, T* out, int64_t n) {
  PEBBLE_GRID_LOOP(i, n) St(out, i, g[0]);
}

// ---- Averaging pools (kmath::PoolAxis bins).

template <typename T>
__global__ void AvgPoolKernel(AvgPool3 p, const T* x, T* y, int64_t n) {
  auto load = [x](int64_t j) { return Ld(x, j); };
  PEBBLE_GRID_LOOP(i, n) St(y, i, kmath::AvgPoolAt(p.axis, i, load));
}

template <typename T>
__global__ void AvgPoolBackwardKernel(AvgPool3 p, const T* g, T* dx,
                                      int64_t n) {
  auto load = [g](int64_t j) { return Ld(g, j); };
  PEBBLE_GRID_LOOP(i, n) St(dx, i, kmath::AvgPoolGradAt(p.axis, i, load));
}

// ---- Layer norm: one block per row, fp64 sums (Note [Deterministic
// reductions]).

template <typename T>
__global__ void LayerNormStatsKernel(const T* x, float* stats, int64_t rows,
                                     int64_t d, double eps) {
  const int64_t r = blockIdx.x;
  const T* row = x + r * d;
  double v[1] = {0.0};
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) v[0] += Ld(row, j);
  BlockSum<1>(v);
  const double mean = v[0] / static_cast<double>(d);
  const float mean_f = static_cast<float>(mean);
  v[0] = 0.0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float c = Ld(row, j) - mean_f;
    v[0] += static_cast<double>(c * c);
  }
  BlockSum<1>(v);
  if (threadIdx.x == 0) {
    const double var = v[0] / static_cast<double>(d);
    stats[r] = mean_f;
    stats[rows + r] =
        static_cast<float>(1.0 / sqrt((var > 0.0 ? var : 0.0) + eps));
  }
}

template <typename T>
__global__ void LayerNormKernel(const T* x, const float* stats, const T* weight,
                                const T* bias, T* y, int64_t rows, int64_t d,
                                int64_t n) {
  PEBBLE_GRID_LOOP(i, n) {
    const int64_t r = i / d, j = i - r * d;
    float v = (Ld(x, i) - stats[r]) * stats[rows + r];
    if (weight != nullptr) v = v * Ld(weight, j) + Ld(bias, j);
    St(y, i, v);
  }
}

template <typename T>
__global__ void LayerNormBackwardKernel(const T* g, const T* x,
                                        const float* stats, const T* weight,
                                        T* dx, int64_t rows, int64_t d) {
  const int64_t r = blockIdx.x;
  const int64_t base = r * d;
  const float mean = stats[r], rstd = stats[rows + r];
  double v[2] = {0.0, 0.0};
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float gw =
        Ld(g, base + j) * (weight != nullptr ? Ld(weight, j) : 1.f);
    const float xhat = (Ld(x, base + j) - mean) * rstd;
    v[0] += gw;
    v[1] += static_cast<double>(gw * xhat);
  }
  BlockSum<2>(v);
  const float c1 = static_cast<float>(v[0] / static_cast<double>(d));
  const float c2 = static_cast<float>(v[1] / static_cast<double>(d));
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float gw =
        Ld(g, base + j) * (weight != nullptr ? Ld(weight, j) : 1.f);
    const float xhat = (Ld(x, base + j) - mean) * rstd;
    St(dx, base + j, rstd * (gw - c1 - xhat * c2));
  }
}

// Column sums: thread (column c, row chunk j) adds its chunk's rows in
// order in fp64; ColumnFinish adds the chunks in order.
template <typename T>
__global__ void ColumnPartials(const T* g, const T* x, const float* stats,
                               int64_t rows, int64_t cols, int chunks,
                               double* partials) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= cols) return;
  const int64_t j = blockIdx.y;
  const int64_t per = (rows + chunks - 1) / chunks;
  const int64_t begin = j * per;
  const int64_t end = begin + per < rows ? begin + per : rows;
  double s = 0.0;
  for (int64_t r = begin; r < end; ++r) {
    const float gv = Ld(g, r * cols + c);
    if (stats == nullptr) {
      s += gv;
    } else {
      s += static_cast<double>(
          gv * ((Ld(x, r * cols + c) - stats[r]) * stats[rows + r]));
    }
  }
  partials[j * cols + c] = s;
}

template <typename T>
__global__ void ColumnFinish(const double* partials, int chunks, T* out,
                             int64_t cols) {
  PEBBLE_GRID_LOOP(c, cols) {
    double s = 0.0;
    for (int j = 0; j < chunks; ++j) s += partials[j * cols + c];
    St(out, c, static_cast<float>(s));
  }
}

// Row chunks of a column sum: enough threads for small column counts, at
// most 64 chunks and about 2^20 partials. A function of the shape alone.
int ColumnChunks(int64_t rows, int64_t cols) {
  int64_t chunks = (rows + 63) / 64;
  if (chunks > 64) chunks = 64;
  const int64_t cap = (int64_t{1} << 20) / (cols > 0 ? cols : 1);
  if (chunks > cap) chunks = cap;
  return static_cast<int>(chunks < 1 ? 1 : chunks);
}

// ---- Dropout, embedding, arange, head copies.

__global__ void DropoutMaskKernel(uint8_t* mask, int64_t n, double p,
                                  uint64_t seed) {
  PEBBLE_GRID_LOOP(i, n) {
    mask[i] = kmath::DropoutKeeps(seed, static_cast<uint64_t>(i), p) ? 1 : 0;
  }
}

template <typename T>
__global__ void RandomKernel(T* out, int64_t n, bool normal, double a, double b,
                             uint64_t seed) {
  PEBBLE_GRID_LOOP(i, n) {
    St(out, i, static_cast<float>(kmath::RandomAt(seed, static_cast<uint64_t>(i), normal, a, b)));
  }
}

template <typename T>
__global__ void DropoutApplyKernel(const T* x, const uint8_t* mask, float scale,
                                   T* y, int64_t n) {
  PEBBLE_GRID_LOOP(i, n) St(y, i, Ld(x, i) * (mask[i] != 0 ? scale : 0.f));
}

__global__ void CheckIndicesKernel(const int64_t* indices, int64_t n,
                                   int64_t limit, uint64_t tag,
                                   IndexFault* fault) {
  PEBBLE_GRID_LOOP(i, n) {
    const int64_t j = indices[i];
    if (j < 0 || j >= limit) {
      atomicMin(&fault->key,
                static_cast<unsigned long long>(
                    kmath::IndexFaultKey(tag, static_cast<uint64_t>(i))));
    }
  }
}

__global__ void CaptureIndexFault(const int64_t* indices, uint64_t tag,
                                  IndexFault* fault) {
  const uint64_t key = fault->key;
  if (key != kmath::kNoIndexFault && kmath::IndexFaultTag(key) == tag) {
    fault->value = indices[kmath::IndexFaultPosition(key)];
  }
}

template <typename T>
__global__ void EmbeddingKernel(const int64_t* indices, const T* weight, T* out,
                                int64_t n, int64_t num, int64_t dim) {
  PEBBLE_GRID_LOOP(i, n * dim) {
    const int64_t pos = i / dim, e = i - pos * dim;
    const int64_t j = indices[pos];
    St(out, i, j >= 0 && j < num ? Ld(weight, j * dim + e) : NAN);
  }
}

template <typename T>
__global__ void EmbeddingBackwardKernel(const T* g, const int64_t* indices,
                                        float* acc, int64_t n, int64_t num,
                                        int64_t dim) {
  PEBBLE_GRID_LOOP(e, dim) {
    for (int64_t pos = 0; pos < n; ++pos) {
      const int64_t j = indices[pos];
      if (j >= 0 && j < num) acc[j * dim + e] += Ld(g, pos * dim + e);
    }
  }
}

template <typename T>
__global__ void StoreFloats(const float* src, T* out, int64_t n) {
  PEBBLE_GRID_LOOP(i, n) St(out, i, src[i]);
}

__global__ void ArangeKernel(int64_t* out, int64_t n) {
  PEBBLE_GRID_LOOP(i, n) out[i] = i;
}

template <typename S>
__global__ void TransposeKernel(kmath::PermuteMap m, const S* src, S* dst,
                                int64_t n) {
  PEBBLE_GRID_LOOP(i, n) dst[i] = src[kmath::PermutedSource(m, i)];
}

template <typename S, bool kGather>
__global__ void HeadsCopyKernel(kmath::HeadsMap m, const S* src, S* dst,
                                int64_t n) {
  PEBBLE_GRID_LOOP(i, n) {
    const int64_t merged = kmath::MergedIndex(m, i);
    if (kGather) {
      dst[i] = src[merged];
    } else {
      dst[merged] = src[i];
    }
  }
}

// Calls f(S{}) with S an unsigned integer of `element_bytes`.
template <typename F>
cudaError_t DispatchBytes(int element_bytes, F f) {
  switch (element_bytes) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

// ---- Launchers.

cudaError_t LaunchUnary(UnaryOp op, KType t, const void* x, void* y, int64_t n,
                        cudaStream_t stream, UnaryParams params) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, UnaryKernel<T>)
    (op, params, static_cast<const T*>(x), static_cast<T*>(y), n);
    return Launched();
  });
}

cudaError_t LaunchUnaryBackward(UnaryOp op, KType t, const void* g,
                                const void* saved, void* dx, int64_t n,
                                cudaStream_t stream, UnaryParams params) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, UnaryGradKernel<T>)
    (op, params, static_cast<const T*>(g), static_cast<const T*>(saved),
     static_cast<T*>(dx), n);
    return Launched();
  });
}

cudaError_t LaunchBinary(BinaryOp op, KType t, const void* a, const void* b,
                         void* out, int64_t n, int64_t nb, int64_t inner,
                         bool b_first, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (nb <= 0 || inner <= 0 || n % nb != 0 || (n / nb) % inner != 0) {
    return cudaErrorInvalidValue;
  }
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, BinaryKernel<T>)
    (op, static_cast<const T*>(a), static_cast<const T*>(b),
     static_cast<T*>(out), n, nb, inner, b_first);
    return Launched();
  });
}

cudaError_t LaunchExtremumBackward(bool maximum, int input, KType t, const void* g,
                                   const void* a, const void* b, void* dx, int64_t n,
                                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, ExtremumBackwardKernel<T>)
    (maximum, input, static_cast<const T*>(g), static_cast<const T*>(a),
     static_cast<const T*>(b), static_cast<T*>(dx), n);
    return Launched();
  });
}

cudaError_t LaunchChannelBias(KType t, void* y, const void* bias, int64_t outer,
                              int64_t channels, int64_t inner,
                              cudaStream_t stream) {
  const int64_t n = outer * channels * inner;
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, ChannelBiasKernel<T>)
    (static_cast<T*>(y), static_cast<const T*>(bias), n, channels, inner);
    return Launched();
  });
}

int64_t ChannelScratchBytes(int64_t channels) {
  return channels * (kMaxChunks + 1) * 2 * static_cast<int64_t>(sizeof(double));
}

cudaError_t LaunchChannelSum(KType t, const void* x, KType out_type, void* out,
                             int64_t outer, int64_t channels, int64_t inner,
                             void* scratch, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    double* sums = nullptr;
    cudaError_t e = ChannelSums<T, ChannelMode::kSum>(
        static_cast<const T*>(x), nullptr, nullptr, outer, channels, inner,
        scratch, stream, &sums);
    if (e != cudaSuccess) return e;
    return Dispatch(out_type, [&](auto out_tag) {
      using O = decltype(out_tag);
      PEBBLE_KERNEL_LAUNCH(Blocks(channels), kThreads, stream, StoreSums<O>)
      (sums, 0, static_cast<O*>(out), channels);
      return Launched();
    });
  });
}

cudaError_t LaunchBatchNormStats(KType t, const void* x, float* stats,
                                 int64_t n, int64_t channels, int64_t s,
                                 double eps, void* scratch, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    double* sums = nullptr;
    cudaError_t e = ChannelSums<T, ChannelMode::kSumSquares>(
        static_cast<const T*>(x), nullptr, nullptr, n, channels, s, scratch,
        stream, &sums);
    if (e != cudaSuccess) return e;
    PEBBLE_KERNEL_LAUNCH(Blocks(channels), kThreads, stream, StatsFromSums)
    (sums, stats, channels, n * s, eps);
    return Launched();
  });
}

cudaError_t LaunchBatchNorm(KType t, const void* x, const float* stats,
                            const float* weight, const float* bias, void* y,
                            int64_t n, int64_t channels, int64_t s,
                            cudaStream_t stream) {
  const int64_t total = n * channels * s;
  if (total == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(total), kThreads, stream, BatchNormKernel<T>)
    (static_cast<const T*>(x), stats, weight, bias, static_cast<T*>(y), total,
     channels, s);
    return Launched();
  });
}

cudaError_t LaunchBatchNormBackward(KType t, const void* g, const void* x,
                                    const float* stats, const float* weight,
                                    void* dx, int64_t n, int64_t channels,
                                    int64_t s, void* scratch,
                                    cudaStream_t stream) {
  const int64_t total = n * channels * s;
  if (total == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    double* sums = nullptr;
    cudaError_t e = ChannelSums<T, ChannelMode::kGradXhat>(
        static_cast<const T*>(x), static_cast<const T*>(g), stats, n, channels,
        s, scratch, stream, &sums);
    if (e != cudaSuccess) return e;
    PEBBLE_KERNEL_LAUNCH(Blocks(total), kThreads, stream,
                         BatchNormBackwardKernel<T>)
    (static_cast<const T*>(g), static_cast<const T*>(x), stats, weight, sums,
     static_cast<T*>(dx), total, channels, s, n * s);
    return Launched();
  });
}

cudaError_t LaunchBatchNormBackwardWeight(KType t, const void* g, const void* x,
                                          const float* stats, float* dweight,
                                          int64_t n, int64_t channels, int64_t s,
                                          void* scratch, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    double* sums = nullptr;
    cudaError_t e = ChannelSums<T, ChannelMode::kGradXhat>(
        static_cast<const T*>(x), static_cast<const T*>(g), stats, n, channels,
        s, scratch, stream, &sums);
    if (e != cudaSuccess) return e;
    PEBBLE_KERNEL_LAUNCH(Blocks(channels), kThreads, stream, StoreSums<float>)
    (sums, 1, dweight, channels);
    return Launched();
  });
}

int64_t ScalarScratchBytes() {
  return kMaxScalarChunks * static_cast<int64_t>(sizeof(double));
}

cudaError_t LaunchMseLoss(KType t, const void* pred, const void* target,
                          float* out, int64_t n, void* scratch,
                          cudaStream_t stream) {
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return ScalarReduce<T>(MseTerm{}, static_cast<const T*>(pred),
                           static_cast<const T*>(target), n,
                           n > 0 ? 1.0 / n : NAN, out, scratch, stream);
  });
}

cudaError_t LaunchBceLoss(KType t, const void* logits, const void* target, float* out,
                          int64_t n, void* scratch, cudaStream_t stream) {
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return ScalarReduce<T>(BceTerm{}, static_cast<const T*>(logits),
                           static_cast<const T*>(target), n, n > 0 ? 1.0 / n : NAN, out,
                           scratch, stream);
  });
}

namespace {
template <typename F>
cudaError_t LaunchPairGrad(F f, KType t, const void* a, const void* b, const float* g, void* da,
                           int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, PairGradKernel<T, F>)
    (f, static_cast<const T*>(a), static_cast<const T*>(b), g, static_cast<T*>(da), n);
    return Launched();
  });
}
}  // namespace

cudaError_t LaunchBceLossBackward(KType t, const void* logits, const void* target,
                                  const float* g, void* dlogits, int64_t n,
                                  cudaStream_t stream) {
  return LaunchPairGrad(BceGrad{}, t, logits, target, g, dlogits, n, stream);
}

cudaError_t LaunchMseLossBackward(KType t, const void* pred, const void* target,
                                  const float* g, void* dpred, int64_t n,
                                  cudaStream_t stream) {
  return LaunchPairGrad(MseGrad{}, t, pred, target, g, dpred, n, stream);
}

cudaError_t LaunchCrossEntropy(KType t, const void* logits,
                               const int64_t* target, float* out,
                               int64_t outer, int64_t classes, int64_t inner,
                               void* scratch, cudaStream_t stream) {
  const int64_t positions = outer * inner;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const int chunks = ChunksFor(positions, kMaxScalarChunks);
    double* partials = static_cast<double*>(scratch);
    PEBBLE_KERNEL_LAUNCH(chunks, kThreads, stream, CrossEntropyPartials<T>)
    (static_cast<const T*>(logits), target, positions, classes, inner, chunks,
     partials);
    PEBBLE_KERNEL_LAUNCH(1, kThreads, stream, ScalarFinish)
    (partials, chunks, positions > 0 ? 1.0 / positions : NAN, out);
    return Launched();
  });
}

cudaError_t LaunchCrossEntropyBackward(KType t, const void* logits,
                                       const int64_t* target, const float* g,
                                       void* dlogits, int64_t outer,
                                       int64_t classes, int64_t inner,
                                       cudaStream_t stream) {
  const int64_t positions = outer * inner;
  if (positions == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(positions), kThreads, stream,
                         CrossEntropyBackwardKernel<T>)
    (static_cast<const T*>(logits), target, g, static_cast<T*>(dlogits),
     positions, classes, inner);
    return Launched();
  });
}

cudaError_t LaunchSum(KType t, const void* x, float* out, int64_t n,
                      void* scratch, cudaStream_t stream) {
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return ScalarReduce<T>(SumTerm{}, static_cast<const T*>(x), nullptr, n, 1.0,
                           out, scratch, stream);
  });
}

cudaError_t LaunchMaxPool(KType t, const Window3& w, const void* x, void* y,
                          cudaStream_t stream) {
  const int64_t n = w.nc * w.out[0] * w.out[1] * w.out[2];
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, MaxPoolKernel<T>)
    (w, static_cast<const T*>(x), static_cast<T*>(y));
    return Launched();
  });
}

cudaError_t LaunchMaxPoolBackward(KType t, const Window3& w, const void* g,
                                  const void* x, void* dx, cudaStream_t stream) {
  const int64_t n = w.nc * w.in[0] * w.in[1] * w.in[2];
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, MaxPoolBackwardKernel<T>)
    (w, static_cast<const T*>(g), static_cast<const T*>(x),
     static_cast<T*>(dx));
    return Launched();
  });
}

namespace {
// Whether every dim is non-empty (and bicubic 2-D).
bool ValidDims(const Upsample3& u) {
  if (u.mode == 2 && u.in[0] != 1) return false;  // bicubic is 2-D
  for (int d = 0; d < 3; ++d) {
    if (u.in[d] <= 0 || u.out[d] <= 0) return false;
  }
  return true;
}
}  // namespace

cudaError_t LaunchUpsample(KType t, const Upsample3& u, const void* x, void* y,
                           cudaStream_t stream) {
  const int64_t n = u.nc * u.out[0] * u.out[1] * u.out[2];
  if (n == 0) return cudaSuccess;
  if (!ValidDims(u)) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, UpsampleKernel<T>)
    (u, static_cast<const T*>(x), static_cast<T*>(y));
    return Launched();
  });
}

cudaError_t LaunchUpsampleBackward(KType t, const Upsample3& u, const void* g,
                                   void* dx, cudaStream_t stream) {
  const int64_t n = u.nc * u.in[0] * u.in[1] * u.in[2];
  if (n == 0) return cudaSuccess;
  if (!ValidDims(u)) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, UpsampleBackwardKernel<T>)
    (u, static_cast<const T*>(g), static_cast<T*>(dx));
    return Launched();
  });
}

cudaError_t LaunchRowMean(KType t, const void* x, void* out, int64_t rows,
                          int64_t length, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(static_cast<unsigned>(rows), kThreads, stream,
                         RowMeanKernel<T>)
    (static_cast<const T*>(x), static_cast<T*>(out), length);
    return Launched();
  });
}

cudaError_t LaunchRowBroadcastMean(KType t, const void* g, void* out,
                                   int64_t rows, int64_t length,
                                   cudaStream_t stream) {
  const int64_t n = rows * length;
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, RowBroadcastKernel<T>)
    (static_cast<const T*>(g), static_cast<T*>(out), n, length);
    return Launched();
  });
}

cudaError_t LaunchBorderPad(KType t, const kmath::BorderPad& p, bool backward, const void* in,
                            void* out, cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < p.rank; ++d) n *= backward ? p.in[d] : p.out[d];
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    if (backward) {
      PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, BorderPadBackwardKernel<T>)
      (p, static_cast<const T*>(in), static_cast<T*>(out), n);
    } else {
      PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, BorderPadKernel<T>)
      (p, static_cast<const T*>(in), static_cast<T*>(out), n);
    }
    return Launched();
  });
}

// Calls f(T{}) with T the storage type of `t`, any element type.
template <typename F>
cudaError_t DispatchElement(CompareType t, F&& f) {
  switch (t) {
    case CompareType::kF32: return f(float{});
    case CompareType::kF16: return f(__half{});
    case CompareType::kBF16: return f(__nv_bfloat16{});
    case CompareType::kI64: return f(int64_t{});
    case CompareType::kU8: return f(uint8_t{});
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchCompare(CompareType t, kmath::CompareOp op, const void* a,
                          const kmath::BroadcastIndex& ia, const void* b,
                          const kmath::BroadcastIndex& ib, uint8_t* out, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchElement(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, CompareKernel<T>)
    (op, static_cast<const T*>(a), ia, static_cast<const T*>(b), ib, out, n);
    return Launched();
  });
}

cudaError_t LaunchCast(CompareType from, CompareType to, const void* x, void* y, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchElement(from, [&](auto from_tag) {
    using From = decltype(from_tag);
    return DispatchElement(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, CastKernel<From, To>)
      (static_cast<const From*>(x), static_cast<To*>(y), n);
      return Launched();
    });
  });
}

cudaError_t LaunchMaskedFill(KType t, const void* x, const uint8_t* mask,
                             const kmath::BroadcastIndex& im, float value, bool invert, void* y,
                             int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, MaskedFillKernel<T>)
    (static_cast<const T*>(x), mask, im, value, invert, static_cast<T*>(y), n);
    return Launched();
  });
}

cudaError_t LaunchPad(int element_bytes, const PadSpec& p, const void* in,
                      void* out, double value, KType t, cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < p.rank; ++d) n *= p.out[d];
  if (n == 0) return cudaSuccess;
  auto run = [&](auto tag) {
    using S = decltype(tag);
    const S fill = static_cast<S>(value);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, PadKernel<S>)
    (p, static_cast<const S*>(in), static_cast<S*>(out), n, fill);
    return Launched();
  };
  switch (element_bytes) {
    case 1:
      return run(uint8_t{});
    case 2:
      if (t == KType::kBF16) {
        return [&] {
          const __nv_bfloat16 fill = __float2bfloat16_rn(static_cast<float>(value));
          PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream,
                               PadKernel<__nv_bfloat16>)
          (p, static_cast<const __nv_bfloat16*>(in),
           static_cast<__nv_bfloat16*>(out), n, fill);
          return Launched();
        }();
      }
      return [&] {
        const __half fill = __float2half_rn(static_cast<float>(value));
        PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, PadKernel<__half>)
        (p, static_cast<const __half*>(in), static_cast<__half*>(out), n, fill);
        return Launched();
      }();
    case 4:
      return run(float{});
    case 8:
      return run(int64_t{});
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchOptimizerUpdate(optim::UpdateOp op, KType t, optim::UpdateScalars s,
                                  optim::AdamHyper h, void* a, const void* b, const void* c,
                                  const float* step, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, OptimizerUpdateKernel<T>)
    (op, s, h, static_cast<T*>(a), static_cast<const T*>(b), static_cast<const T*>(c), step, n);
    return Launched();
  });
}

cudaError_t LaunchIncrement(float* count, cudaStream_t stream) {
  PEBBLE_KERNEL_LAUNCH(1, 1, stream, IncrementKernel)(count);
  return Launched();
}

cudaError_t LaunchFill(KType t, void* out, int64_t n, double value,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (t) {
    case KType::kF32:
      PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, FillKernel<float>)
      (static_cast<float*>(out), n, static_cast<float>(value));
      break;
    case KType::kF16:
      PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, FillKernel<__half>)
      (static_cast<__half*>(out), n,
       __float2half_rn(static_cast<float>(value)));
      break;
    case KType::kBF16:
      PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream,
                           FillKernel<__nv_bfloat16>)
      (static_cast<__nv_bfloat16*>(out), n,
       __float2bfloat16_rn(static_cast<float>(value)));
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return Launched();
}

cudaError_t LaunchFillInt64(int64_t* out, int64_t n, int64_t value,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, FillKernel<int64_t>)
  (out, n, value);
  return Launched();
}

cudaError_t LaunchBroadcastScalar(KType t, const float* g, void* out, int64_t n,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, BroadcastScalarKernel<T>)
    (g, static_cast<T*>(out), n);
    return Launched();
  });
}

cudaError_t LaunchSoftmax(KType t, const void* x, void* y, int64_t rows,
                          int64_t length, bool causal, int64_t rows_per_matrix,
                          bool log, cudaStream_t stream) {
  if (rows == 0 || length == 0) return cudaSuccess;
  if (rows > 0x7fffffff || rows_per_matrix <= 0) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(static_cast<unsigned>(rows), kThreads, stream,
                         SoftmaxKernel<T>)
    (static_cast<const T*>(x), static_cast<T*>(y), length, causal,
     rows_per_matrix, log);
    return Launched();
  });
}

cudaError_t LaunchSoftmaxBackward(KType t, const void* g, const void* y,
                                  void* dx, int64_t rows, int64_t length,
                                  bool log, cudaStream_t stream) {
  if (rows == 0 || length == 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(static_cast<unsigned>(rows), kThreads, stream,
                         SoftmaxBackwardKernel<T>)
    (static_cast<const T*>(g), static_cast<const T*>(y), static_cast<T*>(dx),
     length, log);
    return Launched();
  });
}

cudaError_t LaunchAvgPool(KType t, const AvgPool3& p, const void* x, void* y,
                          cudaStream_t stream) {
  const int64_t n = p.nc * p.axis[0].out * p.axis[1].out * p.axis[2].out;
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, AvgPoolKernel<T>)
    (p, static_cast<const T*>(x), static_cast<T*>(y), n);
    return Launched();
  });
}

cudaError_t LaunchAvgPoolBackward(KType t, const AvgPool3& p, const void* g,
                                  void* dx, cudaStream_t stream) {
  const int64_t n = p.nc * p.axis[0].in * p.axis[1].in * p.axis[2].in;
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, AvgPoolBackwardKernel<T>)
    (p, static_cast<const T*>(g), static_cast<T*>(dx), n);
    return Launched();
  });
}

cudaError_t LaunchLayerNormStats(KType t, const void* x, float* stats,
                                 int64_t rows, int64_t d, double eps,
                                 cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffff || d == 0) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(static_cast<unsigned>(rows), kThreads, stream,
                         LayerNormStatsKernel<T>)
    (static_cast<const T*>(x), stats, rows, d, eps);
    return Launched();
  });
}

cudaError_t LaunchLayerNorm(KType t, const void* x, const float* stats,
                            const void* weight, const void* bias, void* y,
                            int64_t rows, int64_t d, cudaStream_t stream) {
  const int64_t n = rows * d;
  if (n == 0) return cudaSuccess;
  if ((weight == nullptr) != (bias == nullptr)) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, LayerNormKernel<T>)
    (static_cast<const T*>(x), stats, static_cast<const T*>(weight),
     static_cast<const T*>(bias), static_cast<T*>(y), rows, d, n);
    return Launched();
  });
}

cudaError_t LaunchLayerNormBackward(KType t, const void* g, const void* x,
                                    const float* stats, const void* weight,
                                    void* dx, int64_t rows, int64_t d,
                                    cudaStream_t stream) {
  if (rows == 0 || d == 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(static_cast<unsigned>(rows), kThreads, stream,
                         LayerNormBackwardKernel<T>)
    (static_cast<const T*>(g), static_cast<const T*>(x), stats,
     static_cast<const T*>(weight), static_cast<T*>(dx), rows, d);
    return Launched();
  });
}

int64_t ColumnScratchBytes(int64_t rows, int64_t cols) {
  return int64_t{ColumnChunks(rows, cols)} * cols *
         static_cast<int64_t>(sizeof(double));
}

cudaError_t LaunchColumnSum(KType t, const void* g, const void* x,
                            const float* stats, void* out, int64_t rows,
                            int64_t cols, void* scratch, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const int chunks = ColumnChunks(rows, cols);
  const int64_t col_blocks = (cols + kThreads - 1) / kThreads;
  if (col_blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    double* partials = static_cast<double*>(scratch);
    dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
    PEBBLE_KERNEL_LAUNCH(grid, kThreads, stream, ColumnPartials<T>)
    (static_cast<const T*>(g), static_cast<const T*>(x), stats, rows, cols,
     chunks, partials);
    PEBBLE_KERNEL_LAUNCH(Blocks(cols), kThreads, stream, ColumnFinish<T>)
    (partials, chunks, static_cast<T*>(out), cols);
    return Launched();
  });
}

cudaError_t LaunchRandom(KType t, void* out, int64_t n, bool normal, double a, double b,
                         uint64_t seed, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, RandomKernel<T>)
    (static_cast<T*>(out), n, normal, a, b, seed);
    return Launched();
  });
}

cudaError_t LaunchDropoutMask(uint8_t* mask, int64_t n, double p, uint64_t seed,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, DropoutMaskKernel)
  (mask, n, p, seed);
  return Launched();
}

cudaError_t LaunchDropoutApply(KType t, const void* x, const uint8_t* mask,
                               float scale, void* y, int64_t n,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, DropoutApplyKernel<T>)
    (static_cast<const T*>(x), mask, scale, static_cast<T*>(y), n);
    return Launched();
  });
}

cudaError_t LaunchCheckIndices(const int64_t* indices, int64_t n, int64_t limit,
                               uint64_t tag, IndexFault* fault,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (static_cast<uint64_t>(n) >= kmath::kIndexFaultPositionLimit ||
      tag >= kmath::kIndexFaultTagLimit) {
    return cudaErrorInvalidValue;
  }
  PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, CheckIndicesKernel)
  (indices, n, limit, tag, fault);
  PEBBLE_KERNEL_LAUNCH(1, 1, stream, CaptureIndexFault)(indices, tag, fault);
  return Launched();
}

cudaError_t LaunchEmbedding(KType t, const int64_t* indices, const void* weight,
                            void* out, int64_t n, int64_t num, int64_t dim,
                            cudaStream_t stream) {
  if (n * dim == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n * dim), kThreads, stream, EmbeddingKernel<T>)
    (indices, static_cast<const T*>(weight), static_cast<T*>(out), n, num, dim);
    return Launched();
  });
}

int64_t EmbeddingScratchBytes(KType t, int64_t num, int64_t dim) {
  return t == KType::kF32 ? 0 : num * dim * static_cast<int64_t>(sizeof(float));
}

cudaError_t LaunchEmbeddingBackward(KType t, const void* g,
                                    const int64_t* indices, void* dweight,
                                    int64_t n, int64_t num, int64_t dim,
                                    void* scratch, cudaStream_t stream) {
  const int64_t total = num * dim;
  if (total == 0) return cudaSuccess;
  float* acc = t == KType::kF32 ? static_cast<float*>(dweight)
                                : static_cast<float*>(scratch);
  cudaError_t e = cudaMemsetAsync(
      acc, 0, static_cast<size_t>(total) * sizeof(float), stream);
  if (e != cudaSuccess) return e;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(dim), kThreads, stream,
                         EmbeddingBackwardKernel<T>)
    (static_cast<const T*>(g), indices, acc, n, num, dim);
    if (t != KType::kF32) {
      PEBBLE_KERNEL_LAUNCH(Blocks(total), kThreads, stream, StoreFloats<T>)
      (acc, static_cast<T*>(dweight), total);
    }
    return Launched();
  });
}

cudaError_t LaunchArange(int64_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, ArangeKernel)(out, n);
  return Launched();
}

cudaError_t LaunchTranspose(int element_bytes, const kmath::PermuteMap& m,
                            const void* src, void* dst, int64_t n,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchBytes(element_bytes, [&](auto tag) {
    using S = decltype(tag);
    PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream, TransposeKernel<S>)
    (m, static_cast<const S*>(src), static_cast<S*>(dst), n);
    return Launched();
  });
}

cudaError_t LaunchHeadsCopy(int element_bytes, const kmath::HeadsMap& m,
                            bool to_heads, const void* src, void* dst,
                            int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchBytes(element_bytes, [&](auto tag) {
    using S = decltype(tag);
    const S* from = static_cast<const S*>(src);
    S* to = static_cast<S*>(dst);
    if (to_heads) {
      PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream,
                           HeadsCopyKernel<S, true>)
      (m, from, to, n);
    } else {
      PEBBLE_KERNEL_LAUNCH(Blocks(n), kThreads, stream,
                           HeadsCopyKernel<S, false>)
      (m, from, to, n);
    }
    return Launched();
  });
}

}  // namespace pebble::cuda
