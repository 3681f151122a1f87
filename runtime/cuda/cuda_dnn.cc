// Library-backed ops of the CUDA backend: cuDNN convolutions (forward,
// backward data, backward filter; 2-D and 3-D) and cuBLAS products
// (linear and its gradients, batched matmul).
//
// Note [Convolution algorithms] (docs/cuda.md): cuDNN's heuristics
// (cudnnGet*Algorithm_v7) rank the algorithms; we keep the first that is
// deterministic (CUDNN_DETERMINISTIC: recomputation must reproduce bits),
// runs in plain fp32 FMA for fp32 data (no TF32, so results match the CPU
// backend to fp32 rounding) and fits the node's planned workspace. When no
// deterministic algorithm fits, the one needing the least workspace runs
// with scratch outside the plan (reported as scratch_bytes_peak). Choices
// are cached per configuration.
//
// Note [Split fallback]: when cuDNN refuses a configuration
// (CUDNN_STATUS_NOT_SUPPORTED from the heuristics or the call, or no
// deterministic algorithm at all; seen for large 3-D volumes), the
// convolution is split in two halves along the batch and each half runs on
// its own, recursively, down to one sample. Data gradients and outputs of
// the halves are disjoint slices; the weight gradient adds the second half
// into the first (beta = 1), in a fixed order, so the result is still
// deterministic. A single sample that is still refused is an Unimplemented
// error naming the configuration.
#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "runtime/cuda/cuda_ops.h"
#include "runtime/cuda/cuda_status.h"

namespace pebble::cuda {
namespace {

enum class ConvKind { kForward, kBackwardData, kBackwardFilter };

const char* KindName(ConvKind k) {
  switch (k) {
    case ConvKind::kForward:
      return "forward";
    case ConvKind::kBackwardData:
      return "backward data";
    case ConvKind::kBackwardFilter:
      return "backward filter";
  }
  return "?";
}

absl::StatusOr<cudnnDataType_t> DnnType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return CUDNN_DATA_FLOAT;
    case DType::kFloat16:
      return CUDNN_DATA_HALF;
    case DType::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("convolution of ", DTypeName(d), " is not supported"));
  }
}

// The geometry of one convolution: x (n, c, *in), w (o, c, *k), y (n, o, *out).
struct ConvGeom {
  int dims = 0;  // spatial dims: 2 or 3
  int64_t n = 0, c = 0, o = 0;
  std::array<int64_t, 3> in{}, k{}, out{}, stride{}, pad{};
  DType dtype = DType::kFloat32;

  int64_t XSample() const { return c * Prod(in); }
  int64_t YSample() const { return o * Prod(out); }
  int64_t Prod(const std::array<int64_t, 3>& a) const {
    int64_t p = 1;
    for (int i = 0; i < dims; ++i) p *= a[i];
    return p;
  }
  std::string Key(ConvKind kind, int64_t batch, int64_t budget) const {
    auto span = [&](const std::array<int64_t, 3>& a) {
      return absl::StrJoin(a.begin(), a.begin() + dims, "x");
    };
    return absl::StrCat(static_cast<int>(kind), "|", DTypeName(dtype), "|n", batch,
                        "c", c, "o", o, "|", span(in), "|k", span(k), "|s",
                        span(stride), "|p", span(pad), "|ws", budget);
  }
  std::string ToString(int64_t batch) const {
    auto span = [&](const std::array<int64_t, 3>& a) {
      return absl::StrJoin(a.begin(), a.begin() + dims, ",");
    };
    return absl::StrCat(DTypeName(dtype), " x(", batch, ",", c, ",", span(in),
                        ") w(", o, ",", c, ",", span(k), ") stride (",
                        span(stride), ") padding (", span(pad), ")");
  }
};

// RAII holders for cuDNN descriptors.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  ~TensorDesc() {
    if (d != nullptr) cudnnDestroyTensorDescriptor(d);
  }
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  ~FilterDesc() {
    if (d != nullptr) cudnnDestroyFilterDescriptor(d);
  }
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ~ConvDesc() {
    if (d != nullptr) cudnnDestroyConvolutionDescriptor(d);
  }
};

struct Descs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
};

absl::Status CheckInt(int64_t v, absl::string_view what) {
  if (v < 0 || v > 0x7fffffff) {
    return absl::UnimplementedError(
        absl::StrCat(what, " ", v, " does not fit cuDNN's 32-bit dims"));
  }
  return absl::OkStatus();
}

absl::Status MakeDescs(const ConvGeom& g, int64_t batch, cudnnMathType_t math,
                       Descs* d) {
  ASSIGN_OR_RETURN(cudnnDataType_t dt, DnnType(g.dtype));
  const int nd = g.dims + 2;
  std::array<int, 5> xd{}, yd{}, wd{};
  std::array<int, 3> pad{}, stride{}, dil{};
  RETURN_IF_ERROR(CheckInt(batch, "batch"));
  xd[0] = yd[0] = static_cast<int>(batch);
  xd[1] = static_cast<int>(g.c);
  yd[1] = wd[0] = static_cast<int>(g.o);
  wd[1] = static_cast<int>(g.c);
  for (int i = 0; i < g.dims; ++i) {
    RETURN_IF_ERROR(CheckInt(g.in[i], "spatial size"));
    xd[2 + i] = static_cast<int>(g.in[i]);
    yd[2 + i] = static_cast<int>(g.out[i]);
    wd[2 + i] = static_cast<int>(g.k[i]);
    pad[i] = static_cast<int>(g.pad[i]);
    stride[i] = static_cast<int>(g.stride[i]);
    dil[i] = 1;
  }
  PEBBLE_CUDA_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&d->x.d));
  PEBBLE_CUDA_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&d->y.d));
  PEBBLE_CUDA_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&d->w.d));
  PEBBLE_CUDA_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(&d->conv.d));
  PEBBLE_CUDA_RETURN_IF_ERROR(
      cudnnSetTensorNdDescriptorEx(d->x.d, CUDNN_TENSOR_NCHW, dt, nd, xd.data()));
  PEBBLE_CUDA_RETURN_IF_ERROR(
      cudnnSetTensorNdDescriptorEx(d->y.d, CUDNN_TENSOR_NCHW, dt, nd, yd.data()));
  PEBBLE_CUDA_RETURN_IF_ERROR(
      cudnnSetFilterNdDescriptor(d->w.d, dt, CUDNN_TENSOR_NCHW, nd, wd.data()));
  // fp32 accumulation for every storage type (fp16 "pseudo-half", bf16).
  PEBBLE_CUDA_RETURN_IF_ERROR(cudnnSetConvolutionNdDescriptor(
      d->conv.d, g.dims, pad.data(), stride.data(), dil.data(),
      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  PEBBLE_CUDA_RETURN_IF_ERROR(cudnnSetConvolutionMathType(d->conv.d, math));
  return absl::OkStatus();
}

// What the heuristics may pick for fp32 data: plain FMA, no TF32.
cudnnMathType_t RequestedMath(DType d) {
  return d == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

// `strict`: fp32 data only in FMA math (no TF32). When no strict choice
// exists, the caller retries with strict = false, which accepts tensor-core
// math for fp32 too (documented in docs/cuda.md): running with TF32 beats
// refusing the node.
template <typename Perf>
ConvChoice PickAlgorithm(const Perf* perf, int count, DType dtype,
                         int64_t budget, bool strict) {
  ConvChoice best_over;  // least workspace among those over budget
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (p.determinism != CUDNN_DETERMINISTIC) continue;
    const bool fma = p.mathType == CUDNN_FMA_MATH || p.mathType == CUDNN_DEFAULT_MATH;
    if (strict && dtype == DType::kFloat32 && !fma) continue;
    const int64_t ws = static_cast<int64_t>(p.memory);
    ConvChoice c{true, static_cast<int>(p.algo),
                 dtype == DType::kFloat32 && fma ? CUDNN_FMA_MATH : p.mathType, ws};
    if (ws <= budget) return c;  // ranked by the heuristics: first fit wins
    if (!best_over.supported || ws < best_over.workspace_bytes) best_over = c;
  }
  return best_over;
}

template <typename Perf>
ConvChoice PickAlgorithm(const Perf* perf, int count, DType dtype, int64_t budget) {
  ConvChoice c = PickAlgorithm(perf, count, dtype, budget, /*strict=*/true);
  return c.supported ? c : PickAlgorithm(perf, count, dtype, budget, /*strict=*/false);
}

// The algorithm for (kind, geometry, batch) within `budget` bytes of planned
// workspace; supported == false when cuDNN offers none.
absl::StatusOr<ConvChoice> Choose(CudaContext& cc, ConvKind kind,
                                  const ConvGeom& g, int64_t batch,
                                  int64_t budget) {
  const std::string key = g.Key(kind, batch, budget);
  if (auto it = cc.conv_choices.find(key); it != cc.conv_choices.end()) {
    return it->second;
  }
  Descs d;
  RETURN_IF_ERROR(MakeDescs(g, batch, RequestedMath(g.dtype), &d));
  ConvChoice choice;
  cudnnStatus_t rc = CUDNN_STATUS_SUCCESS;
  int count = 0;
  switch (kind) {
    case ConvKind::kForward: {
      std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perf{};
      rc = cudnnGetConvolutionForwardAlgorithm_v7(cc.cudnn, d.x.d, d.w.d, d.conv.d,
                                                  d.y.d, perf.size(), &count,
                                                  perf.data());
      if (rc == CUDNN_STATUS_SUCCESS)
        choice = PickAlgorithm(perf.data(), count, g.dtype, budget);
      break;
    }
    case ConvKind::kBackwardData: {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t,
                 CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> perf{};
      rc = cudnnGetConvolutionBackwardDataAlgorithm_v7(
          cc.cudnn, d.w.d, d.y.d, d.conv.d, d.x.d, perf.size(), &count, perf.data());
      if (rc == CUDNN_STATUS_SUCCESS)
        choice = PickAlgorithm(perf.data(), count, g.dtype, budget);
      break;
    }
    case ConvKind::kBackwardFilter: {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t,
                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> perf{};
      rc = cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          cc.cudnn, d.x.d, d.y.d, d.conv.d, d.w.d, perf.size(), &count, perf.data());
      if (rc == CUDNN_STATUS_SUCCESS)
        choice = PickAlgorithm(perf.data(), count, g.dtype, budget);
      break;
    }
  }
  if (rc != CUDNN_STATUS_SUCCESS && rc != CUDNN_STATUS_NOT_SUPPORTED) {
    return PEBBLE_CUDA_STATUS(rc);
  }
  cc.conv_choices[key] = choice;
  return choice;
}

struct ConvPtrs {
  const std::byte* x = nullptr;   // forward, backward filter
  const std::byte* w = nullptr;   // forward, backward data
  const std::byte* dy = nullptr;  // backward data, backward filter
  std::byte* out = nullptr;       // y, dx or dw
};

// One cuDNN call over samples [0, batch) of the pointers; NOT_SUPPORTED
// comes back as Unimplemented with `*refused` set.
absl::Status RunOnce(CudaContext& cc, ConvKind kind, const ConvGeom& g,
                     int64_t batch, const ConvPtrs& p, float beta,
                     int64_t budget, void* planned_ws, bool* refused) {
  *refused = false;
  if (cc.refuse_conv_batch_above > 0 && batch > cc.refuse_conv_batch_above) {
    *refused = true;
    return absl::UnimplementedError("refused by the test hook");
  }
  ASSIGN_OR_RETURN(ConvChoice choice, Choose(cc, kind, g, batch, budget));
  if (!choice.supported) {
    *refused = true;
    return absl::UnimplementedError(
        "cuDNN offers no deterministic algorithm for this configuration");
  }
  void* ws = planned_ws;
  if (choice.workspace_bytes > budget) {
    ASSIGN_OR_RETURN(ws, cc.scratch(choice.workspace_bytes));
  }
  const size_t ws_bytes = static_cast<size_t>(choice.workspace_bytes);
  Descs d;
  RETURN_IF_ERROR(MakeDescs(g, batch, choice.math, &d));
  const float alpha = 1.f;
  cudnnStatus_t rc = CUDNN_STATUS_SUCCESS;
  switch (kind) {
    case ConvKind::kForward:
      rc = cudnnConvolutionForward(
          cc.cudnn, &alpha, d.x.d, p.x, d.w.d, p.w, d.conv.d,
          static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo), ws, ws_bytes,
          &beta, d.y.d, p.out);
      break;
    case ConvKind::kBackwardData:
      rc = cudnnConvolutionBackwardData(
          cc.cudnn, &alpha, d.w.d, p.w, d.y.d, p.dy, d.conv.d,
          static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo), ws, ws_bytes,
          &beta, d.x.d, p.out);
      break;
    case ConvKind::kBackwardFilter:
      rc = cudnnConvolutionBackwardFilter(
          cc.cudnn, &alpha, d.x.d, p.x, d.y.d, p.dy, d.conv.d,
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo), ws, ws_bytes,
          &beta, d.w.d, p.out);
      break;
  }
  if (rc == CUDNN_STATUS_NOT_SUPPORTED) *refused = true;
  return PEBBLE_CUDA_STATUS(rc);
}

// Runs the convolution over `batch` samples, splitting along the batch
// where cuDNN refuses (Note [Split fallback]).
absl::Status RunSplit(CudaContext& cc, ConvKind kind, const ConvGeom& g,
                      int64_t batch, const ConvPtrs& p, float beta,
                      int64_t budget, void* planned_ws) {
  bool refused = false;
  absl::Status s = RunOnce(cc, kind, g, batch, p, beta, budget, planned_ws, &refused);
  if (s.ok() || !refused) return s;
  if (batch <= 1) {
    return absl::UnimplementedError(absl::StrCat(
        "cuDNN refuses the convolution ", KindName(kind), " of ",
        g.ToString(batch), " even for one sample (", s.message(),
        "); the depth split is not implemented"));
  }
  ++cc.conv_splits;
  const int64_t first = batch / 2;
  const int64_t es = DTypeSize(g.dtype);
  ConvPtrs second = p;
  switch (kind) {
    case ConvKind::kForward:
      second.x = p.x + first * g.XSample() * es;
      second.out = p.out + first * g.YSample() * es;
      break;
    case ConvKind::kBackwardData:
      second.dy = p.dy + first * g.YSample() * es;
      second.out = p.out + first * g.XSample() * es;
      break;
    case ConvKind::kBackwardFilter:
      second.x = p.x + first * g.XSample() * es;
      second.dy = p.dy + first * g.YSample() * es;
      break;
  }
  RETURN_IF_ERROR(RunSplit(cc, kind, g, first, p, beta, budget, planned_ws));
  // The weight gradient of the second half adds into the first's.
  const float beta2 = kind == ConvKind::kBackwardFilter ? 1.f : beta;
  return RunSplit(cc, kind, g, batch - first, second, beta2, budget, planned_ws);
}

absl::Status ExpectInputs(const KernelContext& ctx, size_t lo, size_t hi) {
  if (ctx.inputs.size() < lo || ctx.inputs.size() > hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", lo, lo == hi ? "" : absl::StrCat(" to ", hi), " inputs, got ",
        ctx.inputs.size()));
  }
  return absl::OkStatus();
}

// Geometry from x's shape, the weight's shape and the output's, with the
// node's stride/padding attrs; checks that they agree.
absl::StatusOr<ConvGeom> Geometry(const KernelContext& ctx, int dims,
                                  const Shape& x, const Shape& w, const Shape& y,
                                  DType dtype) {
  const size_t rank = static_cast<size_t>(dims) + 2;
  if (x.size() != rank || w.size() != rank || y.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", rank, "-D x, weight and output, got ", ShapeToString(x), ", ",
        ShapeToString(w), ", ", ShapeToString(y)));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> stride,
                   SpatialAttr(ctx.attrs(), "stride", dims, 1));
  ASSIGN_OR_RETURN(std::vector<int64_t> pad,
                   SpatialAttr(ctx.attrs(), "padding", dims, 0));
  ConvGeom g;
  g.dims = dims;
  g.n = x[0];
  g.c = x[1];
  g.o = w[0];
  g.dtype = dtype;
  if (w[1] != g.c || y[0] != g.n || y[1] != g.o) {
    return absl::InvalidArgumentError(absl::StrCat(
        "x ", ShapeToString(x), ", weight ", ShapeToString(w), " and output ",
        ShapeToString(y), " do not agree"));
  }
  for (int i = 0; i < dims; ++i) {
    g.in[i] = x[2 + i];
    g.k[i] = w[2 + i];
    g.out[i] = y[2 + i];
    g.stride[i] = stride[i];
    g.pad[i] = pad[i];
    if (stride[i] < 1 || pad[i] < 0 ||
        (g.in[i] + 2 * pad[i] - g.k[i]) / stride[i] + 1 != g.out[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stride ", stride[i], " and padding ", pad[i], " do not map ",
          ShapeToString(x), " to ", ShapeToString(y)));
    }
  }
  return g;
}

template <int kDims>
absl::Status ConvForward(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 3));
  const TensorView& x = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  if (x.dtype != w.dtype || x.dtype != ctx.output.dtype) {
    return absl::InvalidArgumentError("x, weight and output must share a dtype");
  }
  ASSIGN_OR_RETURN(ConvGeom g, Geometry(ctx, kDims, x.shape, w.shape,
                                        ctx.output.shape, x.dtype));
  ConvPtrs p{x.data, w.data, nullptr, ctx.output.data};
  RETURN_IF_ERROR(RunSplit(cc, ConvKind::kForward, g, g.n, p, 0.f,
                           ctx.workspace_bytes, ctx.workspace));
  if (ctx.inputs.size() == 3) {
    const TensorView& b = ctx.inputs[2];
    if (b.dtype != x.dtype || b.shape != Shape{g.o}) {
      return absl::InvalidArgumentError(
          absl::StrCat("input 2 (bias): expected (", g.o, "), got ", b.ToString()));
    }
    ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
    RETURN_IF_ERROR(LaunchStatus(
        LaunchChannelBias(t, ctx.output.data, b.data, g.n, g.o, g.Prod(g.out),
                          cc.stream),
        "bias"));
  }
  return absl::OkStatus();
}

// convNd_backward_data (grad, weight) -> dx of the output's shape.
template <int kDims>
absl::Status ConvBackwardData(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& dy = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  if (dy.dtype != w.dtype || dy.dtype != ctx.output.dtype) {
    return absl::InvalidArgumentError("grad, weight and output must share a dtype");
  }
  ASSIGN_OR_RETURN(ConvGeom g, Geometry(ctx, kDims, ctx.output.shape, w.shape,
                                        dy.shape, dy.dtype));
  ConvPtrs p{nullptr, w.data, dy.data, ctx.output.data};
  return RunSplit(cc, ConvKind::kBackwardData, g, g.n, p, 0.f,
                  ctx.workspace_bytes, ctx.workspace);
}

// convNd_backward_weight (grad, x) -> dw of the output's shape.
template <int kDims>
absl::Status ConvBackwardWeight(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  const TensorView& dy = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  if (dy.dtype != x.dtype || dy.dtype != ctx.output.dtype) {
    return absl::InvalidArgumentError("grad, x and output must share a dtype");
  }
  ASSIGN_OR_RETURN(ConvGeom g, Geometry(ctx, kDims, x.shape, ctx.output.shape,
                                        dy.shape, dy.dtype));
  ConvPtrs p{x.data, nullptr, dy.data, ctx.output.data};
  return RunSplit(cc, ConvKind::kBackwardFilter, g, g.n, p, 0.f,
                  ctx.workspace_bytes, ctx.workspace);
}

// ---- cuBLAS.

absl::StatusOr<cudaDataType_t> BlasType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("matrix product of ", DTypeName(d), " is not supported"));
  }
}

// Row-major C (m x n) = alpha op(A) op(B) over `batch` matrices, with
// row-major leading dims; computed as the column-major C^T = op(B)^T op(A)^T.
// fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32).
absl::Status RowMajorGemm(CudaContext& cc, DType dtype, bool ta, bool tb,
                          int64_t m, int64_t n, int64_t k, float alpha,
                          const void* a, int64_t lda, int64_t stride_a,
                          const void* b, int64_t ldb, int64_t stride_b, void* c,
                          int64_t ldc, int64_t stride_c, int64_t batch) {
  ASSIGN_OR_RETURN(cudaDataType_t t, BlasType(dtype));
  for (int64_t v : {m, n, k, lda, ldb, ldc, batch}) {
    RETURN_IF_ERROR(CheckInt(v, "matrix dimension"));
  }
  if (m == 0 || n == 0 || batch == 0) return absl::OkStatus();
  const float beta = 0.f;
  PEBBLE_CUDA_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      cc.cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, t,
      static_cast<int>(ldb), stride_b, a, t, static_cast<int>(lda), stride_a, &beta,
      c, t, static_cast<int>(ldc), stride_c, static_cast<int>(batch),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status SameDType(const KernelContext& ctx) {
  for (const TensorView& t : ctx.inputs) {
    if (t.dtype != ctx.output.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "operands must share the output's dtype ", DTypeName(ctx.output.dtype),
          ", got ", t.ToString()));
    }
  }
  return absl::OkStatus();
}

// linear (x (M.., in), weight (out, in) [, bias (out)]) -> (M.., out).
absl::Status Linear(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 3));
  RETURN_IF_ERROR(SameDType(ctx));
  const TensorView& x = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  if (w.rank() != 2 || x.rank() < 1 || x.shape.back() != w.shape[1] ||
      ctx.output.shape.back() != w.shape[0]) {
    return absl::InvalidArgumentError("linear: x, weight and output do not agree");
  }
  const int64_t in = w.shape[1], out = w.shape[0];
  const int64_t m = in == 0 ? 0 : x.num_elements() / in;
  RETURN_IF_ERROR(RowMajorGemm(cc, x.dtype, false, true, m, out, in, 1.f, x.data, in,
                               0, w.data, in, 0, ctx.output.data, out, 0, 1));
  if (ctx.inputs.size() == 3) {
    if (ctx.inputs[2].shape != Shape{out}) {
      return absl::InvalidArgumentError("linear: bias shape");
    }
    ASSIGN_OR_RETURN(KType t, KTypeOf(x.dtype));
    RETURN_IF_ERROR(LaunchStatus(LaunchChannelBias(t, ctx.output.data,
                                                   ctx.inputs[2].data, m, out, 1,
                                                   cc.stream),
                                 "bias"));
  }
  return absl::OkStatus();
}

// linear_backward_data (g (M.., out), weight (out, in)) -> (M.., in) = g W.
absl::Status LinearBackwardData(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  RETURN_IF_ERROR(SameDType(ctx));
  const TensorView& g = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  if (w.rank() != 2 || g.shape.back() != w.shape[0] ||
      ctx.output.shape.back() != w.shape[1]) {
    return absl::InvalidArgumentError("linear_backward_data: shapes do not agree");
  }
  const int64_t in = w.shape[1], out = w.shape[0];
  const int64_t m = out == 0 ? 0 : g.num_elements() / out;
  return RowMajorGemm(cc, g.dtype, false, false, m, in, out, 1.f, g.data, out, 0,
                      w.data, in, 0, ctx.output.data, in, 0, 1);
}

// linear_backward_weight (g (M.., out), x (M.., in)) -> (out, in) = g^T x.
absl::Status LinearBackwardWeight(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  RETURN_IF_ERROR(SameDType(ctx));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  if (ctx.output.rank() != 2 || g.shape.back() != ctx.output.shape[0] ||
      x.shape.back() != ctx.output.shape[1]) {
    return absl::InvalidArgumentError("linear_backward_weight: shapes do not agree");
  }
  const int64_t out = ctx.output.shape[0], in = ctx.output.shape[1];
  const int64_t m = out == 0 ? 0 : g.num_elements() / out;
  return RowMajorGemm(cc, g.dtype, true, false, out, in, m, 1.f, g.data, out, 0,
                      x.data, in, 0, ctx.output.data, in, 0, 1);
}

// matmul (a, b), attrs transpose_a, transpose_b, scale: equal batch dims.
absl::Status Matmul(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  RETURN_IF_ERROR(SameDType(ctx));
  const TensorView& a = ctx.inputs[0];
  const TensorView& b = ctx.inputs[1];
  ASSIGN_OR_RETURN(bool ta, BoolAttr(ctx.attrs(), "transpose_a", false));
  ASSIGN_OR_RETURN(bool tb, BoolAttr(ctx.attrs(), "transpose_b", false));
  ASSIGN_OR_RETURN(double scale, DoubleAttr(ctx.attrs(), "scale", 1.0));
  if (a.rank() < 2 || b.rank() != a.rank() || ctx.output.rank() != a.rank()) {
    return absl::InvalidArgumentError("matmul: operands must have equal ranks >= 2");
  }
  const int r = a.rank();
  const int64_t m = ta ? a.shape[r - 1] : a.shape[r - 2];
  const int64_t k = ta ? a.shape[r - 2] : a.shape[r - 1];
  const int64_t kb = tb ? b.shape[r - 1] : b.shape[r - 2];
  const int64_t n = tb ? b.shape[r - 2] : b.shape[r - 1];
  int64_t batch = 1;
  for (int i = 0; i < r - 2; ++i) {
    if (a.shape[i] != b.shape[i] || a.shape[i] != ctx.output.shape[i]) {
      return absl::InvalidArgumentError("matmul: batch dims differ");
    }
    batch *= a.shape[i];
  }
  if (k != kb || ctx.output.shape[r - 2] != m || ctx.output.shape[r - 1] != n) {
    return absl::InvalidArgumentError("matmul: inner or output dims do not agree");
  }
  return RowMajorGemm(cc, a.dtype, ta, tb, m, n, k, static_cast<float>(scale),
                      a.data, a.shape[r - 1], m * k, b.data, b.shape[r - 1], k * n,
                      ctx.output.data, n, m * n, batch);
}

}  // namespace

void AddDnnKernels(std::map<std::string, CudaKernelFn>& t) {
  t["conv2d"] = ConvForward<2>;
  t["conv3d"] = ConvForward<3>;
  t["conv2d_backward_data"] = ConvBackwardData<2>;
  t["conv3d_backward_data"] = ConvBackwardData<3>;
  t["conv2d_backward_weight"] = ConvBackwardWeight<2>;
  t["conv3d_backward_weight"] = ConvBackwardWeight<3>;
  t["linear"] = Linear;
  t["linear_backward_data"] = LinearBackwardData;
  t["linear_backward_weight"] = LinearBackwardWeight;
  t["matmul"] = Matmul;
}

}  // namespace pebble::cuda
