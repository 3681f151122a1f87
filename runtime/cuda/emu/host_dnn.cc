// Host stand-ins for cuDNN's convolutions and cuBLAS's batched product
// (contract in host_dnn.h). The arithmetic is plain loops in a fixed order
// with fp32 accumulation; it runs on the handle's stream (host_runtime.h).
#include "runtime/cuda/emu/host_dnn.h"

#include <cublas_v2.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "graph/half.h"
#include "runtime/cuda/emu/host_runtime.h"

namespace pebble::cuda::emu {
namespace {

std::mutex dnn_mutex;
ConvRefusal refusal;
AlgorithmRefusal algorithm_refusal;
ConvCalls calls;
int64_t non_deterministic_runs = 0;  // alternates their summation order

struct DnnHandle {
  cudaStream_t stream = nullptr;
};
struct BlasHandle {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

constexpr int kMaxDims = 5;  // n, c and up to 3 spatial dims

// A packed NCHW tensor or filter descriptor (they hold the same here).
struct NdDescE {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int nd = 0;
  std::array<int, kMaxDims> dims{};
};
struct ConvDescE {
  bool set = false;
  int spatial = 0;
  std::array<int, 3> pad{}, stride{}, dilation{};
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

enum class Dir { kForward, kBackwardData, kBackwardFilter };

// A checked convolution, spatial dims padded to 3 at the front (a 2-D one
// has depth 1, kernel 1, stride 1, padding 0).
struct Geom {
  int64_t n = 0, c = 0, o = 0;
  std::array<int64_t, 3> in{1, 1, 1}, k{1, 1, 1}, out{1, 1, 1};
  std::array<int64_t, 3> stride{1, 1, 1}, pad{0, 0, 0};
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;

  int64_t XElements() const { return n * c * in[0] * in[1] * in[2]; }
  int64_t YElements() const { return n * o * out[0] * out[1] * out[2]; }
  int64_t WElements() const { return o * c * k[0] * k[1] * k[2]; }
  int64_t ElementBytes() const { return type == CUDNN_DATA_FLOAT ? 4 : 2; }
  // The workspace of the emulated algorithms that need one: one sample of x.
  int64_t SampleWorkspace() const {
    return c * in[0] * in[1] * in[2] * ElementBytes();
  }
};

// Whether fp32 data runs in TF32: every math type but FMA permits tensor
// cores from Ampere on (cuDNN's cudnnMathType_t: CUDNN_DEFAULT_MATH
// permits TF32 there, CUDNN_FMA_MATH does not).
bool UsesTf32(const Geom& g) {
  return g.type == CUDNN_DATA_FLOAT && g.math != CUDNN_FMA_MATH;
}

bool Supported(cudnnDataType_t t) {
  return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF ||
         t == CUDNN_DATA_BFLOAT16;
}

// cudnnSetTensorNdDescriptorEx and cudnnSetFilterNdDescriptor: packed
// NCHW of 4 or 5 dims, each at least 1, fewer than 2^31 elements.
template <typename Desc>
cudnnStatus_t SetNd(Desc desc, cudnnTensorFormat_t format, cudnnDataType_t type,
                    int nd, const int dims[]) {
  if (desc == nullptr || dims == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (format != CUDNN_TENSOR_NCHW || nd < 4 || nd > kMaxDims || !Supported(type)) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  int64_t elements = 1;
  for (int i = 0; i < nd; ++i) {
    if (dims[i] < 1) return CUDNN_STATUS_BAD_PARAM;
    elements *= dims[i];
  }
  if (elements > 0x7fffffff) return CUDNN_STATUS_NOT_SUPPORTED;
  auto* d = reinterpret_cast<NdDescE*>(desc);
  d->type = type;
  d->nd = nd;
  for (int i = 0; i < nd; ++i) d->dims[static_cast<size_t>(i)] = dims[i];
  d->set = true;
  return CUDNN_STATUS_SUCCESS;
}

// The geometry of (x, w, conv, y), or BAD_PARAM when they do not agree (or
// NOT_SUPPORTED for what the emulation leaves out: dilation, convolution
// mode, compute types other than fp32).
cudnnStatus_t Check(cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                    cudnnConvolutionDescriptor_t cd,
                    cudnnTensorDescriptor_t yd, Geom* g) {
  if (xd == nullptr || wd == nullptr || cd == nullptr || yd == nullptr) {
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  }
  const auto& x = *reinterpret_cast<const NdDescE*>(xd);
  const auto& w = *reinterpret_cast<const NdDescE*>(wd);
  const auto& conv = *reinterpret_cast<const ConvDescE*>(cd);
  const auto& y = *reinterpret_cast<const NdDescE*>(yd);
  if (!x.set || !w.set || !conv.set || !y.set) {
    return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
  }
  const int nd = conv.spatial + 2;
  if (x.nd != nd || w.nd != nd || y.nd != nd || conv.spatial < 2 ||
      conv.spatial > 3) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (x.type != w.type || x.type != y.type) return CUDNN_STATUS_BAD_PARAM;
  if (conv.mode != CUDNN_CROSS_CORRELATION ||
      conv.compute != CUDNN_DATA_FLOAT) {
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  g->n = x.dims[0];
  g->c = x.dims[1];
  g->o = w.dims[0];
  g->type = x.type;
  g->math = conv.math;
  if (w.dims[1] != g->c || y.dims[0] != g->n || y.dims[1] != g->o) {
    return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
  }
  const int shift = 3 - conv.spatial;
  for (int i = 0; i < conv.spatial; ++i) {
    if (conv.dilation[i] != 1) return CUDNN_STATUS_NOT_SUPPORTED;
    const int j = shift + i;
    g->in[j] = x.dims[2 + i];
    g->k[j] = w.dims[2 + i];
    g->out[j] = y.dims[2 + i];
    g->stride[j] = conv.stride[i];
    g->pad[j] = conv.pad[i];
    if (g->stride[j] < 1 || g->pad[j] < 0 || g->k[j] < 1 ||
        g->in[j] + 2 * g->pad[j] < g->k[j] ||
        (g->in[j] + 2 * g->pad[j] - g->k[j]) / g->stride[j] + 1 != g->out[j]) {
      return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    }
  }
  if (g->n < 1 || g->c < 1 || g->o < 1) return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

// Checks (x, w, conv, y) and hands their geometry to `call`, or returns
// what the check answered.
template <typename Call>
cudnnStatus_t WithGeom(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                       cudnnConvolutionDescriptor_t conv,
                       cudnnTensorDescriptor_t y, Call call) {
  Geom g;
  if (cudnnStatus_t s = Check(x, w, conv, y, &g); s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  return call(g);
}

bool RefusedHere(const Geom& g, bool at_call) {
  std::lock_guard<std::mutex> lock(dnn_mutex);
  if (refusal.x_elements_above <= 0) return false;
  if (refusal.at_call_only && !at_call) return false;
  return g.XElements() > refusal.x_elements_above;
}

// The refusal's status; cudnnGetLastErrorString then names it.
std::string last_error;
cudnnStatus_t RefusalStatus() {
  std::lock_guard<std::mutex> lock(dnn_mutex);
  last_error = std::string("emulated refusal: ") + cudnnGetErrorString(refusal.status);
  return refusal.status;
}

// ---- Element access and the three directions.

float Load(cudnnDataType_t t, const void* p, int64_t i) {
  switch (t) {
    case CUDNN_DATA_HALF:
      return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case CUDNN_DATA_BFLOAT16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

void Store(cudnnDataType_t t, void* p, int64_t i, float v) {
  switch (t) {
    case CUDNN_DATA_HALF:
      static_cast<uint16_t*>(p)[i] = FloatToHalf(v);
      break;
    case CUDNN_DATA_BFLOAT16:
      static_cast<uint16_t*>(p)[i] = FloatToBFloat16(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

// fp32 rounded to TF32 (10 mantissa bits, to nearest even), as tensor cores
// read fp32 operands.
float ToTf32(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  if ((b & 0x7f800000u) != 0x7f800000u) {
    b += 0xfffu + ((b >> 13) & 1u);
    b &= ~0x1fffu;
  }
  std::memcpy(&v, &b, 4);
  return v;
}

// The operand as fp32 values (TF32 when `tf32`).
std::vector<float> Widen(cudnnDataType_t t, const void* p, int64_t n,
                         bool tf32) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float v = Load(t, p, i);
    out[static_cast<size_t>(i)] = tf32 ? ToTf32(v) : v;
  }
  return out;
}

// out = alpha * acc + beta * out (out is not read when beta is 0).
void Blend(cudnnDataType_t t, void* out, const std::vector<float>& acc,
           float alpha, float beta) {
  for (size_t i = 0; i < acc.size(); ++i) {
    const int64_t j = static_cast<int64_t>(i);
    float v = alpha * acc[i];
    if (beta != 0.f) v += beta * Load(t, out, j);
    Store(t, out, j, v);
  }
}

// Position of output `o` along one axis reading kernel tap `k`, in the
// input: o * stride - pad + k.
struct Axis {
  int64_t in, k, out, stride, pad;
};

// One convolution direction over a whole batch. `reverse`: sum the
// reduction in the opposite order (the non-deterministic algorithm).
void Convolve(Dir dir, const Geom& g, const void* a, const void* b, void* out,
              float alpha, float beta, bool reverse) {
  const bool tf32 = UsesTf32(g);
  const Axis ax[3] = {{g.in[0], g.k[0], g.out[0], g.stride[0], g.pad[0]},
                      {g.in[1], g.k[1], g.out[1], g.stride[1], g.pad[1]},
                      {g.in[2], g.k[2], g.out[2], g.stride[2], g.pad[2]}};
  const int64_t in_sp = g.in[0] * g.in[1] * g.in[2];
  const int64_t out_sp = g.out[0] * g.out[1] * g.out[2];
  const int64_t k_sp = g.k[0] * g.k[1] * g.k[2];
  auto x_at = [&](int64_t d, int64_t h, int64_t w) {
    return (d * g.in[1] + h) * g.in[2] + w;
  };
  auto y_at = [&](int64_t d, int64_t h, int64_t w) {
    return (d * g.out[1] + h) * g.out[2] + w;
  };
  auto k_at = [&](int64_t d, int64_t h, int64_t w) {
    return (d * g.k[1] + h) * g.k[2] + w;
  };
  // Each reduction sums its products in a fixed loop order, or (reverse)
  // collects them and sums them backwards.
  float acc = 0.f;
  std::vector<float> terms;
  auto add = [&](float v) {
    if (reverse) {
      terms.push_back(v);
    } else {
      acc += v;
    }
  };
  auto sum = [&] {
    float s = acc;
    for (size_t i = terms.size(); i-- > 0;) s += terms[i];
    terms.clear();
    acc = 0.f;
    return s;
  };
  switch (dir) {
    case Dir::kForward: {  // a = x, b = w, out = y
      const std::vector<float> x = Widen(g.type, a, g.XElements(), tf32);
      const std::vector<float> w = Widen(g.type, b, g.WElements(), tf32);
      std::vector<float> y(static_cast<size_t>(g.YElements()));
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t o = 0; o < g.o; ++o)
          for (int64_t od = 0; od < g.out[0]; ++od)
            for (int64_t oh = 0; oh < g.out[1]; ++oh)
              for (int64_t ow = 0; ow < g.out[2]; ++ow) {
                for (int64_t c = 0; c < g.c; ++c)
                  for (int64_t kd = 0; kd < g.k[0]; ++kd) {
                    const int64_t id = od * ax[0].stride - ax[0].pad + kd;
                    if (id < 0 || id >= g.in[0]) continue;
                    for (int64_t kh = 0; kh < g.k[1]; ++kh) {
                      const int64_t ih = oh * ax[1].stride - ax[1].pad + kh;
                      if (ih < 0 || ih >= g.in[1]) continue;
                      for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                        const int64_t iw = ow * ax[2].stride - ax[2].pad + kw;
                        if (iw < 0 || iw >= g.in[2]) continue;
                        add(
                            x[static_cast<size_t>((n * g.c + c) * in_sp +
                                                  x_at(id, ih, iw))] *
                            w[static_cast<size_t>((o * g.c + c) * k_sp +
                                                  k_at(kd, kh, kw))]);
                      }
                    }
                  }
                y[static_cast<size_t>((n * g.o + o) * out_sp +
                                      y_at(od, oh, ow))] = sum();
              }
      Blend(g.type, out, y, alpha, beta);
      break;
    }
    case Dir::kBackwardData: {  // a = w, b = dy, out = dx
      const std::vector<float> w = Widen(g.type, a, g.WElements(), tf32);
      const std::vector<float> dy = Widen(g.type, b, g.YElements(), tf32);
      std::vector<float> dx(static_cast<size_t>(g.XElements()));
      // The outputs o along an axis that read input i through tap k:
      // o * stride = i + pad - k.
      auto tap = [](const Axis& axis, int64_t i, int64_t k, int64_t* o) {
        const int64_t t = i + axis.pad - k;
        if (t < 0 || t % axis.stride != 0) return false;
        *o = t / axis.stride;
        return *o < axis.out;
      };
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t c = 0; c < g.c; ++c)
          for (int64_t id = 0; id < g.in[0]; ++id)
            for (int64_t ih = 0; ih < g.in[1]; ++ih)
              for (int64_t iw = 0; iw < g.in[2]; ++iw) {
                for (int64_t o = 0; o < g.o; ++o)
                  for (int64_t kd = 0; kd < g.k[0]; ++kd) {
                    int64_t od;
                    if (!tap(ax[0], id, kd, &od)) continue;
                    for (int64_t kh = 0; kh < g.k[1]; ++kh) {
                      int64_t oh;
                      if (!tap(ax[1], ih, kh, &oh)) continue;
                      for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                        int64_t ow;
                        if (!tap(ax[2], iw, kw, &ow)) continue;
                        add(
                            dy[static_cast<size_t>((n * g.o + o) * out_sp +
                                                   y_at(od, oh, ow))] *
                            w[static_cast<size_t>((o * g.c + c) * k_sp +
                                                  k_at(kd, kh, kw))]);
                      }
                    }
                  }
                dx[static_cast<size_t>((n * g.c + c) * in_sp +
                                       x_at(id, ih, iw))] = sum();
              }
      Blend(g.type, out, dx, alpha, beta);
      break;
    }
    case Dir::kBackwardFilter: {  // a = x, b = dy, out = dw
      const std::vector<float> x = Widen(g.type, a, g.XElements(), tf32);
      const std::vector<float> dy = Widen(g.type, b, g.YElements(), tf32);
      std::vector<float> dw(static_cast<size_t>(g.WElements()));
      for (int64_t o = 0; o < g.o; ++o)
        for (int64_t c = 0; c < g.c; ++c)
          for (int64_t kd = 0; kd < g.k[0]; ++kd)
            for (int64_t kh = 0; kh < g.k[1]; ++kh)
              for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                for (int64_t n = 0; n < g.n; ++n)
                  for (int64_t od = 0; od < g.out[0]; ++od) {
                    const int64_t id = od * ax[0].stride - ax[0].pad + kd;
                    if (id < 0 || id >= g.in[0]) continue;
                    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
                      const int64_t ih = oh * ax[1].stride - ax[1].pad + kh;
                      if (ih < 0 || ih >= g.in[1]) continue;
                      for (int64_t ow = 0; ow < g.out[2]; ++ow) {
                        const int64_t iw = ow * ax[2].stride - ax[2].pad + kw;
                        if (iw < 0 || iw >= g.in[2]) continue;
                        add(
                            dy[static_cast<size_t>((n * g.o + o) * out_sp +
                                                   y_at(od, oh, ow))] *
                            x[static_cast<size_t>((n * g.c + c) * in_sp +
                                                  x_at(id, ih, iw))]);
                      }
                    }
                  }
                dw[static_cast<size_t>((o * g.c + c) * k_sp +
                                       k_at(kd, kh, kw))] = sum();
              }
      Blend(g.type, out, dw, alpha, beta);
      break;
    }
  }
}

// ---- The emulated algorithms (host_dnn.h).

struct AlgoInfo {
  int algo;
  cudnnMathType_t math;
};

std::vector<AlgoInfo> Ranked(Dir dir) {
  if (dir == Dir::kForward) {
    return {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_TENSOR_OP_MATH},
            {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_FMA_MATH},
            {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_FMA_MATH}};
  }
  return {{0, CUDNN_FMA_MATH}, {1, CUDNN_TENSOR_OP_MATH}, {1, CUDNN_FMA_MATH}};
}

// Whether the heuristics of `dir` offer `algo`.
bool KnownAlgo(Dir dir, int algo) {
  for (const AlgoInfo& a : Ranked(dir)) {
    if (a.algo == algo) return true;
  }
  return false;
}

// ALGO_0 of the backward directions is non-deterministic (as in cuDNN).
bool Deterministic(Dir dir, int algo) { return dir == Dir::kForward || algo != 0; }

// Workspace of `algo` run in g.math, in bytes: one sample of x in
// tensor-op math and for the forward GEMM (its unfolded input), else none.
int64_t Workspace(Dir dir, int algo, const Geom& g) {
  if (dir == Dir::kForward && algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM) {
    return g.SampleWorkspace();
  }
  return g.math == CUDNN_TENSOR_OP_MATH ? g.SampleWorkspace() : 0;
}

// Whether the AlgorithmRefusal hook refuses `algo` of `dir` on `g` here.
bool AlgorithmRefusedHere(Dir dir, int algo, const Geom& g, bool at_call) {
  std::lock_guard<std::mutex> lock(dnn_mutex);
  if (dir != Dir::kForward) return false;
  if (algorithm_refusal.at_call_only && !at_call) return false;
  if (g.XElements() <= algorithm_refusal.x_elements_above) return false;
  return std::find(algorithm_refusal.forward_algos.begin(),
                   algorithm_refusal.forward_algos.end(),
                   algo) != algorithm_refusal.forward_algos.end();
}

cudnnStatus_t AlgorithmRefusalStatus(int algo) {
  std::lock_guard<std::mutex> lock(dnn_mutex);
  last_error = "emulated refusal of algorithm " + std::to_string(algo);
  return CUDNN_STATUS_NOT_SUPPORTED;
}

// What the refusal hooks answer for `algo` of `dir` on `g` here (the size
// refusal first, then the algorithm's), or CUDNN_STATUS_SUCCESS.
cudnnStatus_t HookedRefusal(Dir dir, int algo, const Geom& g, bool at_call) {
  if (RefusedHere(g, at_call)) return RefusalStatus();
  if (AlgorithmRefusedHere(dir, algo, g, at_call)) return AlgorithmRefusalStatus(algo);
  return CUDNN_STATUS_SUCCESS;
}

template <typename Perf, typename AlgoT>
cudnnStatus_t Heuristics(Dir dir, const Geom& g, int requested, int* returned,
                         Perf* perf) {
  if (requested < 1 || returned == nullptr || perf == nullptr) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (RefusedHere(g, /*at_call=*/false)) return RefusalStatus();
  const std::vector<AlgoInfo> ranked = Ranked(dir);
  int count = 0;
  for (const AlgoInfo& a : ranked) {
    if (count == requested) break;
    // Asked in FMA math, the heuristics offer no tensor-op algorithm.
    if (g.math == CUDNN_FMA_MATH && a.math != CUDNN_FMA_MATH) continue;
    Perf p{};
    p.algo = static_cast<AlgoT>(a.algo);
    p.status = CUDNN_STATUS_SUCCESS;
    p.time = -1.f;  // heuristics, not measurements
    Geom with_math = g;
    with_math.math = a.math;
    p.memory = static_cast<size_t>(Workspace(dir, a.algo, with_math));
    p.determinism =
        Deterministic(dir, a.algo) ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    p.mathType = a.math;
    perf[count++] = p;
  }
  *returned = count;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t WorkspaceSize(Dir dir, const Geom& g, int algo, size_t* bytes) {
  if (bytes == nullptr || !KnownAlgo(dir, algo)) return CUDNN_STATUS_BAD_PARAM;
  if (cudnnStatus_t s = HookedRefusal(dir, algo, g, /*at_call=*/false);
      s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  *bytes = static_cast<size_t>(Workspace(dir, algo, g));
  return CUDNN_STATUS_SUCCESS;
}

// Checks and enqueues one convolution call: a, b the inputs in the call's
// order, out the output (see Convolve).
cudnnStatus_t Run(cudnnHandle_t handle, Dir dir, const Geom& g, int algo,
                  const void* alpha, const void* a, const void* b,
                  void* workspace, size_t workspace_bytes, const void* beta,
                  void* out) {
  if (handle == nullptr || alpha == nullptr || beta == nullptr ||
      a == nullptr || b == nullptr || out == nullptr) {
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  }
  if (!KnownAlgo(dir, algo)) return CUDNN_STATUS_BAD_PARAM;
  // cuDNN's documented minimum: tensor and filter pointers 4-byte aligned,
  // fp16 included.
  for (const void* p : {a, b, static_cast<const void*>(out)}) {
    if (reinterpret_cast<uintptr_t>(p) % 4 != 0) {
      return CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER;
    }
  }
  if (cudnnStatus_t s = HookedRefusal(dir, algo, g, /*at_call=*/true);
      s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  const int64_t need = Workspace(dir, algo, g);
  if (need > 0 && (workspace == nullptr ||
                   static_cast<int64_t>(workspace_bytes) < need)) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  const float alpha_v = *static_cast<const float*>(alpha);
  const float beta_v = *static_cast<const float*>(beta);
  bool reverse = false;
  {
    std::lock_guard<std::mutex> lock(dnn_mutex);
    ++calls.total;
    if (!Deterministic(dir, algo)) {
      ++calls.non_deterministic;
      reverse = (non_deterministic_runs++ % 2) == 1;
    }
    if (UsesTf32(g)) ++calls.tf32;
  }
  const cudaStream_t stream = reinterpret_cast<DnnHandle*>(handle)->stream;
  Enqueue(stream, [=] {
    if (need > 0) std::memset(workspace, 0xA5, static_cast<size_t>(need));
    Convolve(dir, g, a, b, out, alpha_v, beta_v, reverse);
  });
  return CUDNN_STATUS_SUCCESS;
}

// ---- cuBLAS.

bool BlasSupported(cudaDataType_t t) {
  return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF;
}

cudnnDataType_t AsDnn(cudaDataType_t t) {
  return t == CUDA_R_16F    ? CUDNN_DATA_HALF
         : t == CUDA_R_16BF ? CUDNN_DATA_BFLOAT16
                            : CUDNN_DATA_FLOAT;
}

}  // namespace

void SetConvRefusal(const ConvRefusal& r) {
  std::lock_guard<std::mutex> lock(dnn_mutex);
  refusal = r;
}

void SetAlgorithmRefusal(const AlgorithmRefusal& r) {
  std::lock_guard<std::mutex> lock(dnn_mutex);
  algorithm_refusal = r;
}

ConvCalls GetConvCalls() {
  std::lock_guard<std::mutex> lock(dnn_mutex);
  return calls;
}

}  // namespace pebble::cuda::emu

namespace emu = pebble::cuda::emu;

extern "C" {

// ---- cuDNN: handle, errors, descriptors.

size_t CUDNNWINAPI cudnnGetVersion(void) { return CUDNN_VERSION; }

void CUDNNWINAPI cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  std::lock_guard<std::mutex> lock(pebble::cuda::emu::dnn_mutex);
  std::snprintf(message, max_size, "%s", pebble::cuda::emu::last_error.c_str());
  pebble::cuda::emu::last_error.clear();
}

const char* CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
      return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED:
      return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
      return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE:
      return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE:
      return "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE";
    default:
      return "CUDNN_STATUS (emulated build)";
  }
}

cudnnStatus_t CUDNNWINAPI cudnnCreate(cudnnHandle_t* handle) {
  *handle = reinterpret_cast<cudnnHandle_t>(new emu::DnnHandle);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroy(cudnnHandle_t handle) {
  delete reinterpret_cast<emu::DnnHandle*>(handle);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetStream(cudnnHandle_t handle,
                                         cudaStream_t stream) {
  if (handle == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  reinterpret_cast<emu::DnnHandle*>(handle)->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI
cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  *d = reinterpret_cast<cudnnTensorDescriptor_t>(new emu::NdDescE);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI
cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  delete reinterpret_cast<emu::NdDescE*>(d);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensorNdDescriptorEx(
    cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
    cudnnDataType_t type, int nd, const int dims[]) {
  return emu::SetNd(desc, format, type, nd, dims);
}

cudnnStatus_t CUDNNWINAPI
cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) {
  *d = reinterpret_cast<cudnnFilterDescriptor_t>(new emu::NdDescE);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI
cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
  delete reinterpret_cast<emu::NdDescE*>(d);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetFilterNdDescriptor(
    cudnnFilterDescriptor_t desc, cudnnDataType_t type,
    cudnnTensorFormat_t format, int nd, const int dims[]) {
  return emu::SetNd(desc, format, type, nd, dims);
}

cudnnStatus_t CUDNNWINAPI
cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) {
  *d = reinterpret_cast<cudnnConvolutionDescriptor_t>(new emu::ConvDescE);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI
cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  delete reinterpret_cast<emu::ConvDescE*>(d);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionNdDescriptor(
    cudnnConvolutionDescriptor_t desc, int spatial, const int pad[],
    const int stride[], const int dilation[], cudnnConvolutionMode_t mode,
    cudnnDataType_t compute) {
  if (desc == nullptr || pad == nullptr || stride == nullptr ||
      dilation == nullptr) {
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  }
  if (spatial < 1 || spatial > 3) return CUDNN_STATUS_BAD_PARAM;
  auto* c = reinterpret_cast<emu::ConvDescE*>(desc);
  for (int i = 0; i < spatial; ++i) {
    if (pad[i] < 0 || stride[i] < 1 || dilation[i] < 1) {
      return CUDNN_STATUS_BAD_PARAM;
    }
    c->pad[static_cast<size_t>(i)] = pad[i];
    c->stride[static_cast<size_t>(i)] = stride[i];
    c->dilation[static_cast<size_t>(i)] = dilation[i];
  }
  c->spatial = spatial;
  c->mode = mode;
  c->compute = compute;
  c->set = true;
  return CUDNN_STATUS_SUCCESS;
}

// One group only: the emulation models no grouped convolution, and refuses
// one as cuDNN refuses a configuration it does not support.
cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionGroupCount(
    cudnnConvolutionDescriptor_t desc, int groups) {
  if (desc == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (groups < 1) return CUDNN_STATUS_BAD_PARAM;
  return groups == 1 ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionMathType(
    cudnnConvolutionDescriptor_t desc, cudnnMathType_t math) {
  if (desc == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  reinterpret_cast<emu::ConvDescE*>(desc)->math = math;
  return CUDNN_STATUS_SUCCESS;
}

// ---- cuDNN: heuristics, workspace, convolutions.

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x,
    const cudnnFilterDescriptor_t w, const cudnnConvolutionDescriptor_t conv,
    const cudnnTensorDescriptor_t y, const int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf) {
  return emu::WithGeom(x, w, conv, y, [&](const emu::Geom& g) {
    return emu::Heuristics<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
        emu::Dir::kForward, g, requested, returned, perf);
  });
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, const cudnnFilterDescriptor_t w,
    const cudnnTensorDescriptor_t dy, const cudnnConvolutionDescriptor_t conv,
    const cudnnTensorDescriptor_t dx, const int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  return emu::WithGeom(dx, w, conv, dy, [&](const emu::Geom& g) {
    return emu::Heuristics<cudnnConvolutionBwdDataAlgoPerf_t,
                           cudnnConvolutionBwdDataAlgo_t>(
        emu::Dir::kBackwardData, g, requested, returned, perf);
  });
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x,
    const cudnnTensorDescriptor_t dy, const cudnnConvolutionDescriptor_t conv,
    const cudnnFilterDescriptor_t dw, const int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  return emu::WithGeom(x, dw, conv, dy, [&](const emu::Geom& g) {
    return emu::Heuristics<cudnnConvolutionBwdFilterAlgoPerf_t,
                           cudnnConvolutionBwdFilterAlgo_t>(
        emu::Dir::kBackwardFilter, g, requested, returned, perf);
  });
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x,
    const cudnnFilterDescriptor_t w, const cudnnConvolutionDescriptor_t conv,
    const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
    size_t* bytes) {
  return emu::WithGeom(x, w, conv, y, [&](const emu::Geom& g) {
    return emu::WorkspaceSize(emu::Dir::kForward, g, algo, bytes);
  });
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, const cudnnFilterDescriptor_t w,
    const cudnnTensorDescriptor_t dy, const cudnnConvolutionDescriptor_t conv,
    const cudnnTensorDescriptor_t dx, cudnnConvolutionBwdDataAlgo_t algo,
    size_t* bytes) {
  return emu::WithGeom(dx, w, conv, dy, [&](const emu::Geom& g) {
    return emu::WorkspaceSize(emu::Dir::kBackwardData, g, algo, bytes);
  });
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x,
    const cudnnTensorDescriptor_t dy, const cudnnConvolutionDescriptor_t conv,
    const cudnnFilterDescriptor_t dw, cudnnConvolutionBwdFilterAlgo_t algo,
    size_t* bytes) {
  return emu::WithGeom(x, dw, conv, dy, [&](const emu::Geom& g) {
    return emu::WorkspaceSize(emu::Dir::kBackwardFilter, g, algo, bytes);
  });
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionForward(
    cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xd,
    const void* x, const cudnnFilterDescriptor_t wd, const void* w,
    const cudnnConvolutionDescriptor_t conv, cudnnConvolutionFwdAlgo_t algo,
    void* workspace, size_t workspace_bytes, const void* beta,
    const cudnnTensorDescriptor_t yd, void* y) {
  return emu::WithGeom(xd, wd, conv, yd, [&](const emu::Geom& g) {
    return emu::Run(handle, emu::Dir::kForward, g, algo, alpha, x, w, workspace,
                    workspace_bytes, beta, y);
  });
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardData(
    cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wd,
    const void* w, const cudnnTensorDescriptor_t dyd, const void* dy,
    const cudnnConvolutionDescriptor_t conv, cudnnConvolutionBwdDataAlgo_t algo,
    void* workspace, size_t workspace_bytes, const void* beta,
    const cudnnTensorDescriptor_t dxd, void* dx) {
  return emu::WithGeom(dxd, wd, conv, dyd, [&](const emu::Geom& g) {
    return emu::Run(handle, emu::Dir::kBackwardData, g, algo, alpha, w, dy,
                    workspace, workspace_bytes, beta, dx);
  });
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardFilter(
    cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xd,
    const void* x, const cudnnTensorDescriptor_t dyd, const void* dy,
    const cudnnConvolutionDescriptor_t conv,
    cudnnConvolutionBwdFilterAlgo_t algo, void* workspace,
    size_t workspace_bytes, const void* beta,
    const cudnnFilterDescriptor_t dwd, void* dw) {
  return emu::WithGeom(xd, dwd, conv, dyd, [&](const emu::Geom& g) {
    return emu::Run(handle, emu::Dir::kBackwardFilter, g, algo, alpha, x, dy,
                    workspace, workspace_bytes, beta, dw);
  });
}

// ---- cuBLAS.

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS (emulated build)";
  }
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "invalid value";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "not supported";
    default:
      return "error of the emulated cuBLAS";
  }
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  *handle = reinterpret_cast<cublasHandle_t>(new emu::BlasHandle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  delete reinterpret_cast<emu::BlasHandle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetVersion_v2(cublasHandle_t, int* version) {
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle,
                                               cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  reinterpret_cast<emu::BlasHandle*>(handle)->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle,
                                              cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  reinterpret_cast<emu::BlasHandle*>(handle)->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

// Column-major C = alpha op(A) op(B) + beta C over `batch` strided
// matrices, with fp32 accumulation in a fixed order.
cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const void* alpha, const void* A, cudaDataType a_type,
    int lda, long long int stride_a, const void* B, cudaDataType b_type,
    int ldb, long long int stride_b, const void* beta, void* C,
    cudaDataType c_type, int ldc, long long int stride_c, int batch,
    cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (a_type != b_type || a_type != c_type || !emu::BlasSupported(a_type) ||
      compute != CUBLAS_COMPUTE_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const int a_rows = ta ? k : m, b_rows = tb ? n : k;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_rows) ||
      ldb < std::max(1, b_rows) || ldc < std::max(1, m) || alpha == nullptr ||
      beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const float alpha_v = *static_cast<const float*>(alpha);
  const float beta_v = *static_cast<const float*>(beta);
  const cudnnDataType_t t = emu::AsDnn(a_type);
  const auto* h = reinterpret_cast<const emu::BlasHandle*>(handle);
  // fp32 products in CUBLAS_TF32_TENSOR_OP_MATH round their operands to TF32.
  const bool tf32 = a_type == CUDA_R_32F &&
                    (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH;
  auto load = [t, tf32](const void* p, int64_t i) {
    const float v = emu::Load(t, p, i);
    return tf32 ? emu::ToTf32(v) : v;
  };
  const cudaStream_t stream = h->stream;
  emu::Enqueue(stream, [=] {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t a0 = b * stride_a, b0 = b * stride_b, c0 = b * stride_c;
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < m; ++i) {
          float acc = 0.f;
          for (int64_t l = 0; l < k; ++l) {
            const int64_t ai = ta ? l + i * lda : i + l * lda;
            const int64_t bi = tb ? j + l * ldb : l + j * ldb;
            acc += load(A, a0 + ai) * load(B, b0 + bi);
          }
          const int64_t ci = c0 + i + j * ldc;
          float v = alpha_v * acc;
          if (beta_v != 0.f) v += beta_v * emu::Load(t, C, ci);
          emu::Store(t, C, ci, v);
        }
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
