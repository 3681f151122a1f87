// Library-backed ops of the CUDA backend: cuDNN convolutions (forward,
// backward data, backward filter; 2-D and 3-D) and cuBLAS products
// (linear and its gradients, batched matmul).
//
// Note [Convolution algorithms] (docs/cuda.md): cuDNN's heuristics
// (cudnnGet*Algorithm_v7) rank the algorithms. The candidates of a
// configuration are the deterministic ones (CUDNN_DETERMINISTIC:
// recomputation must reproduce bits) that run in plain fp32 FMA for fp32
// data (no TF32, so results match the CPU backend to fp32 rounding): first
// those that fit the node's planned workspace, in the heuristics' rank,
// then the others by least workspace (those run with scratch outside the
// plan, reported as scratch_bytes_peak). The first candidate runs; when
// cuDNN refuses it (its workspace query or its call answers NOT_SUPPORTED,
// which the heuristics do not rule out), the next one does. A configuration
// with no candidate left takes the split fallback below, in FMA math. A
// sample that is refused even so (its depth split failed at every count,
// or it is 2-D) is marked fma_exhausted, and the convolution runs again
// from the start (RunConv): for fp32 data a marked configuration asks the
// heuristics again in CUDNN_TENSOR_OP_MATH, and its deterministic TF32
// algorithms become its candidates (asked in FMA math, cuDNN offers none).
// Exact FMA parts beat one TF32 call; TF32 beats refusing the node.
// Candidates, how far the trying got and the marks are cached per
// configuration, so later runs take the same path at once.
//
// Note [Split fallback]: when cuDNN refuses a configuration
// (CUDNN_STATUS_NOT_SUPPORTED from the heuristics, or for every candidate,
// or no deterministic algorithm at all; seen for large 3-D volumes), the
// convolution is split in two parts along the batch and each part runs on
// its own, recursively, down to one sample. The cut is BatchSplitPoint's
// (runtime/conv_depth_split.h): near the half, where the second part of
// every tensor starts 16-byte aligned if it can (cuDNN's kernels may need
// aligned pointers). Data gradients and outputs of the parts are disjoint
// slices; the weight gradient adds the second part into the first
// (beta = 1), in a fixed order, so the result is still deterministic.
//
// A single sample of a 3-D convolution that is still refused is split
// along the depth (runtime/conv_depth_split.h): 2, 4, 8, ... slices, up to
// one output plane per slice (one input plane for backward data). Every
// slice geometry of a count is probed (Accept) before anything runs, and
// the smallest count cuDNN accepts throughout runs, so that the weight
// gradient never restarts half-way. A slice copies its window of x (with
// zero planes where the window leaves the tensor) or its planes of dy into
// packed scratch, runs the convolution with depth padding 0, and copies y
// or the owned dx planes into place; the weight gradients of the slices
// add up in slice order (beta = 1 after the first). One scratch request
// holds the window, the slice's y or dy and any workspace beyond the
// planned one, as RunOnce would otherwise ask for scratch itself and
// invalidate the buffer. A 2-D convolution refused for one sample, or a 3-D
// one refused even one plane per slice, is an Unimplemented error naming
// the configuration.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "runtime/conv_depth_split.h"
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

// The geometry of one convolution: x (n, c, *in), w (o, c / groups, *k),
// y (n, o, *out); kernel taps `dilation` apart (cuDNN's group count and
// dilation, cudnnSetConvolutionGroupCount and cudnnSetConvolutionNdDescriptor).
struct ConvGeom {
  int dims = 0;  // spatial dims: 2 or 3
  int64_t n = 0, c = 0, o = 0, groups = 1;
  std::array<int64_t, 3> in{}, k{}, out{}, stride{}, pad{}, dilation{1, 1, 1};
  DType dtype = DType::kFloat32;

  int64_t XSample() const { return c * Prod(in); }
  int64_t YSample() const { return o * Prod(out); }
  int64_t WeightElements() const { return o * (c / groups) * Prod(k); }
  // The input planes one output plane reads along spatial dim i.
  int64_t Extent(int i) const { return dilation[i] * (k[i] - 1) + 1; }
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
                        span(stride), "|p", span(pad), "|d", span(dilation), "|g",
                        groups, "|ws", budget);
  }
  std::string ToString(int64_t batch) const {
    auto span = [&](const std::array<int64_t, 3>& a) {
      return absl::StrJoin(a.begin(), a.begin() + dims, ",");
    };
    return absl::StrCat(DTypeName(dtype), " x(", batch, ",", c, ",", span(in),
                        ") w(", o, ",", c / groups, ",", span(k), ") stride (",
                        span(stride), ") padding (", span(pad), ")",
                        groups != 1 ? absl::StrCat(" groups ", groups) : "",
                        Prod(dilation) != 1
                            ? absl::StrCat(" dilation (", span(dilation), ")")
                            : "");
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

// Whether cuDNN refused this configuration: cuDNN 9 answers NOT_SUPPORTED
// with sub-codes (CUDNN_STATUS_NOT_SUPPORTED_SHAPE, ..._PADDING, ...), so
// the category decides, except for the sub-codes that describe the
// installation, not the configuration (CudnnEnvironmentFault: a driver or
// runtime too old, a missing sub-library): no split helps there, and the
// call's error says what is wrong.
bool Refused(cudnnStatus_t rc) {
  return CUDNN_STATUS_CATEGORY(rc) == CUDNN_STATUS_NOT_SUPPORTED && !CudnnEnvironmentFault(rc);
}

// cuDNN's tensor and filter descriptors hold fewer than 2^31 elements
// (cudnnSetTensorNdDescriptorEx answers CUDNN_STATUS_NOT_SUPPORTED from
// 2^31 on); "" when x, y and w of (g, batch) fit, else which does not.
std::string OverDescriptorLimit(const ConvGeom& g, int64_t batch) {
  constexpr int64_t kLimit = 0x7fffffff;
  const int64_t x = batch * g.XSample(), y = batch * g.YSample();
  const int64_t w = g.WeightElements();
  for (const auto& [what, n] :
       {std::pair<const char*, int64_t>{"x", x}, {"y", y}, {"w", w}}) {
    if (n > kLimit) {
      return absl::StrCat(
          what, " has ", n,
          " elements; cuDNN's descriptors hold fewer than 2^31");
    }
  }
  return "";
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
  wd[1] = static_cast<int>(g.c / g.groups);
  for (int i = 0; i < g.dims; ++i) {
    RETURN_IF_ERROR(CheckInt(g.in[i], "spatial size"));
    xd[2 + i] = static_cast<int>(g.in[i]);
    yd[2 + i] = static_cast<int>(g.out[i]);
    wd[2 + i] = static_cast<int>(g.k[i]);
    pad[i] = static_cast<int>(g.pad[i]);
    stride[i] = static_cast<int>(g.stride[i]);
    dil[i] = static_cast<int>(g.dilation[i]);
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
  if (g.groups != 1) {
    PEBBLE_CUDA_RETURN_IF_ERROR(
        cudnnSetConvolutionGroupCount(d->conv.d, static_cast<int>(g.groups)));
  }
  PEBBLE_CUDA_RETURN_IF_ERROR(cudnnSetConvolutionMathType(d->conv.d, math));
  return absl::OkStatus();
}

// The math the heuristics are asked in first: plain FMA for fp32 (no TF32),
// tensor-op math for fp16 and bf16.
cudnnMathType_t RequestedMath(DType d) {
  return d == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

// Appends to `cands` the deterministic algorithms of one heuristics answer
// that it does not hold yet: those within `budget` bytes of workspace in
// the heuristics' rank, then those over it by least workspace. For fp32
// data, `tf32` false takes only the FMA ones (run in CUDNN_FMA_MATH), true
// only those in CUDNN_TENSOR_OP_MATH (TF32; not ..._ALLOW_CONVERSION,
// which may convert fp32 data down to fp16).
template <typename Perf>
void AddCandidates(const Perf* perf, int count, DType dtype, int64_t budget,
                   bool tf32, ConvCandidates* cands) {
  std::vector<ConvChoice> fits, over;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (p.determinism != CUDNN_DETERMINISTIC) continue;
    const bool fma = p.mathType == CUDNN_FMA_MATH || p.mathType == CUDNN_DEFAULT_MATH;
    if (dtype == DType::kFloat32 &&
        (tf32 ? p.mathType != CUDNN_TENSOR_OP_MATH : !fma)) {
      continue;
    }
    const cudnnMathType_t math =
        dtype == DType::kFloat32 && fma ? CUDNN_FMA_MATH : p.mathType;
    const int algo = static_cast<int>(p.algo);
    const bool known = std::any_of(
        cands->ranked.begin(), cands->ranked.end(),
        [&](const ConvChoice& c) { return c.algo == algo && c.math == math; });
    if (known) continue;
    const int64_t ws = static_cast<int64_t>(p.memory);
    (ws <= budget ? fits : over).push_back(ConvChoice{true, algo, math, ws, ""});
  }
  std::stable_sort(over.begin(), over.end(), [](const ConvChoice& a, const ConvChoice& b) {
    return a.workspace_bytes < b.workspace_bytes;
  });
  cands->ranked.insert(cands->ranked.end(), fits.begin(), fits.end());
  cands->ranked.insert(cands->ranked.end(), over.begin(), over.end());
}

// Asks cuDNN's heuristics (cudnnGet*Algorithm_v7) for (kind, g, batch) in
// `math` and adds their candidates (AddCandidates). Returns "" when they
// answered, else why not (the descriptors or the heuristics refused).
absl::StatusOr<std::string> AskHeuristics(CudaContext& cc, ConvKind kind,
                                          const ConvGeom& g, int64_t batch,
                                          int64_t budget, cudnnMathType_t math,
                                          bool tf32, ConvCandidates* cands) {
  Descs d;
  if (absl::Status s = MakeDescs(g, batch, math, &d); !s.ok()) {
    if (s.code() != absl::StatusCode::kUnimplemented) return s;
    return absl::StrCat("cuDNN refused the descriptors: ", s.message());
  }
  cudnnStatus_t rc = CUDNN_STATUS_SUCCESS;
  int count = 0;
  switch (kind) {
    case ConvKind::kForward: {
      std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perf{};
      rc = cudnnGetConvolutionForwardAlgorithm_v7(cc.cudnn, d.x.d, d.w.d, d.conv.d,
                                                  d.y.d, perf.size(), &count,
                                                  perf.data());
      if (rc == CUDNN_STATUS_SUCCESS)
        AddCandidates(perf.data(), count, g.dtype, budget, tf32, cands);
      break;
    }
    case ConvKind::kBackwardData: {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t,
                 CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> perf{};
      rc = cudnnGetConvolutionBackwardDataAlgorithm_v7(
          cc.cudnn, d.w.d, d.y.d, d.conv.d, d.x.d, perf.size(), &count, perf.data());
      if (rc == CUDNN_STATUS_SUCCESS)
        AddCandidates(perf.data(), count, g.dtype, budget, tf32, cands);
      break;
    }
    case ConvKind::kBackwardFilter: {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t,
                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> perf{};
      rc = cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          cc.cudnn, d.x.d, d.y.d, d.conv.d, d.w.d, perf.size(), &count, perf.data());
      if (rc == CUDNN_STATUS_SUCCESS)
        AddCandidates(perf.data(), count, g.dtype, budget, tf32, cands);
      break;
    }
  }
  if (Refused(rc)) {
    return absl::StrCat("cuDNN's heuristics answer ", cudnnGetErrorString(rc));
  }
  RETURN_IF_ERROR(PEBBLE_CUDA_STATUS(rc));
  return std::string();
}

// The heuristics rank algorithms in the math the descriptor asked for, but
// an algorithm runs in its own (fp32 in FMA math), which may need another
// workspace: the size is asked again in that math, and the larger of the
// two answers kept. Returns "" or, when cuDNN refuses the query, why.
absl::StatusOr<std::string> CheckWorkspace(CudaContext& cc, ConvKind kind,
                                           const ConvGeom& g, int64_t batch,
                                           ConvChoice* choice) {
  Descs d;
  RETURN_IF_ERROR(MakeDescs(g, batch, choice->math, &d));
  size_t bytes = 0;
  cudnnStatus_t rc = CUDNN_STATUS_SUCCESS;
  switch (kind) {
    case ConvKind::kForward:
      rc = cudnnGetConvolutionForwardWorkspaceSize(
          cc.cudnn, d.x.d, d.w.d, d.conv.d, d.y.d,
          static_cast<cudnnConvolutionFwdAlgo_t>(choice->algo), &bytes);
      break;
    case ConvKind::kBackwardData:
      rc = cudnnGetConvolutionBackwardDataWorkspaceSize(
          cc.cudnn, d.w.d, d.y.d, d.conv.d, d.x.d,
          static_cast<cudnnConvolutionBwdDataAlgo_t>(choice->algo), &bytes);
      break;
    case ConvKind::kBackwardFilter:
      rc = cudnnGetConvolutionBackwardFilterWorkspaceSize(
          cc.cudnn, d.x.d, d.y.d, d.conv.d, d.w.d,
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice->algo), &bytes);
      break;
  }
  if (Refused(rc)) {
    return absl::StrCat("cuDNN refused the workspace query of algorithm ",
                        choice->algo, ": ", cudnnGetErrorString(rc));
  }
  RETURN_IF_ERROR(PEBBLE_CUDA_STATUS(rc));
  choice->workspace_bytes =
      std::max(choice->workspace_bytes, static_cast<int64_t>(bytes));
  return std::string();
}

// ranked[next] was refused (`why`); the next candidate takes its place.
void GiveWay(CudaContext& cc, ConvCandidates& cands, std::string why) {
  cands.why = std::move(why);
  ++cands.next;
  cands.checked = false;
  ++cc.conv_algorithm_refusals;
}

// (kind, g, batch) is refused in FMA math even split (Note [Convolution
// algorithms]). Only configurations that have TF32 to try are marked: fp32
// within the descriptors' limit, and seen by Choose (one that a test hook
// refuses never reaches cuDNN, in any math).
void MarkFmaExhausted(CudaContext& cc, ConvKind kind, const ConvGeom& g,
                      int64_t batch, int64_t budget) {
  if (g.dtype != DType::kFloat32 || !OverDescriptorLimit(g, batch).empty()) return;
  auto it = cc.conv_choices.find(g.Key(kind, batch, budget));
  if (it == cc.conv_choices.end() || it->second.fma_exhausted) return;
  it->second.fma_exhausted = true;
  ++cc.conv_fma_exhausted;
}

// The candidates of a configuration before any has been tried.
absl::StatusOr<ConvCandidates> FirstCandidates(CudaContext& cc, ConvKind kind,
                                               const ConvGeom& g, int64_t batch,
                                               int64_t budget) {
  ConvCandidates cands;
  cands.why = OverDescriptorLimit(g, batch);
  if (cands.why.empty()) {
    ASSIGN_OR_RETURN(cands.why, AskHeuristics(cc, kind, g, batch, budget,
                                              RequestedMath(g.dtype),
                                              /*tf32=*/false, &cands));
  }
  if (cands.why.empty() && cands.ranked.empty()) {
    cands.why = "cuDNN offers no deterministic algorithm for this configuration";
  }
  return cands;
}

// The algorithm to run for (kind, geometry, batch) within `budget` bytes of
// planned workspace, from the configuration's candidates (cached), TF32
// ones for fp32 data once it is fma_exhausted; supported == false, with
// `why`, when none is left.
absl::StatusOr<ConvChoice> Choose(CudaContext& cc, ConvKind kind,
                                  const ConvGeom& g, int64_t batch,
                                  int64_t budget) {
  const std::string key = g.Key(kind, batch, budget);
  auto it = cc.conv_choices.find(key);
  if (it == cc.conv_choices.end()) {
    ASSIGN_OR_RETURN(ConvCandidates fresh, FirstCandidates(cc, kind, g, batch, budget));
    it = cc.conv_choices.emplace(key, std::move(fresh)).first;
  }
  ConvCandidates& cands = it->second;
  for (;;) {
    if (cands.next < cands.ranked.size()) {
      ConvChoice& c = cands.ranked[cands.next];
      if (!cands.checked) {
        ASSIGN_OR_RETURN(std::string refusal, CheckWorkspace(cc, kind, g, batch, &c));
        if (!refusal.empty()) {
          GiveWay(cc, cands, std::move(refusal));
          continue;
        }
        cands.checked = true;
      }
      return c;
    }
    if (g.dtype != DType::kFloat32 || !cands.fma_exhausted || cands.tf32_asked ||
        !OverDescriptorLimit(g, batch).empty()) {
      break;
    }
    // Refused in FMA math even split: the heuristics in FMA math offer no
    // TF32 algorithm, so they are asked in tensor-op math.
    ASSIGN_OR_RETURN(std::string refusal,
                     AskHeuristics(cc, kind, g, batch, budget, CUDNN_TENSOR_OP_MATH,
                                   /*tf32=*/true, &cands));
    cands.tf32_asked = true;
    // When they refuse too, the last FMA refusal stays the reason.
    (void)refusal;
  }
  ConvChoice none;
  none.why = cands.why;
  if (cands.tf32_asked) absl::StrAppend(&none.why, " (TF32 algorithms were tried too)");
  return none;
}

// Choose's answer unless a test hook refuses (kind, g, batch) first;
// supported == false with `why` when either refuses.
absl::StatusOr<ConvChoice> Accept(CudaContext& cc, ConvKind kind,
                                  const ConvGeom& g, int64_t batch,
                                  int64_t budget) {
  ConvChoice refused;
  if (cc.refuse_conv_batch_above > 0 && batch > cc.refuse_conv_batch_above) {
    refused.why = "refused by the test hook refuse_conv_batch_above";
    return refused;
  }
  if (g.dims == 3 && cc.refuse_conv_depth_above > 0 &&
      g.in[0] > cc.refuse_conv_depth_above) {
    refused.why = "refused by the test hook refuse_conv_depth_above";
    return refused;
  }
  return Choose(cc, kind, g, batch, budget);
}

struct ConvPtrs {
  const std::byte* x = nullptr;   // forward, backward filter
  const std::byte* w = nullptr;   // forward, backward data
  const std::byte* dy = nullptr;  // backward data, backward filter
  std::byte* out = nullptr;       // y, dx or dw
};

// Where one cuDNN call's workspace comes from: the node's planned workspace
// (`planned`, `budget` bytes) when the chosen algorithm fits it; beyond
// that `overflow` (`overflow_bytes`) when the caller carved one from its
// scratch, else a cc.scratch request of its own (which ends the validity
// of any scratch the caller holds).
struct ConvWorkspace {
  int64_t budget = 0;
  void* planned = nullptr;
  void* overflow = nullptr;
  int64_t overflow_bytes = 0;
};

// One cuDNN call over samples [0, batch) of the pointers. When the call
// refuses the chosen algorithm, the configuration's next candidate is
// tried (the refusal is remembered in cc.conv_choices). Comes back as
// Unimplemented with `*refused` set when no candidate is left (or a test
// hook refuses), or when the candidate that is left needs more workspace
// than the caller's `overflow` holds: the caller may split, or plan again.
absl::Status RunOnce(CudaContext& cc, ConvKind kind, const ConvGeom& g,
                     int64_t batch, const ConvPtrs& p, float beta,
                     const ConvWorkspace& ws, bool* refused) {
  *refused = false;
  for (;;) {
    ASSIGN_OR_RETURN(ConvChoice choice, Accept(cc, kind, g, batch, ws.budget));
    if (!choice.supported) {
      *refused = true;
      return absl::UnimplementedError(choice.why);
    }
    void* workspace = ws.planned;
    if (choice.workspace_bytes > ws.budget) {
      if (ws.overflow == nullptr) {
        ASSIGN_OR_RETURN(workspace, cc.scratch(choice.workspace_bytes));
      } else if (choice.workspace_bytes <= ws.overflow_bytes) {
        workspace = ws.overflow;
      } else {
        *refused = true;
        return absl::UnimplementedError(absl::StrCat(
            "algorithm ", choice.algo, " of the convolution ", KindName(kind), " of ",
            g.ToString(batch), " needs ", choice.workspace_bytes,
            " bytes of workspace, ", ws.overflow_bytes, " were set aside"));
      }
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
            static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo), workspace,
            ws_bytes, &beta, d.y.d, p.out);
        break;
      case ConvKind::kBackwardData:
        rc = cudnnConvolutionBackwardData(
            cc.cudnn, &alpha, d.w.d, p.w, d.y.d, p.dy, d.conv.d,
            static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo), workspace,
            ws_bytes, &beta, d.x.d, p.out);
        break;
      case ConvKind::kBackwardFilter:
        rc = cudnnConvolutionBackwardFilter(
            cc.cudnn, &alpha, d.x.d, p.x, d.y.d, p.dy, d.conv.d,
            static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo), workspace,
            ws_bytes, &beta, d.w.d, p.out);
        break;
    }
    absl::Status s = PEBBLE_CUDA_STATUS(rc);
    if (s.ok() && g.dtype == DType::kFloat32 && choice.math != CUDNN_FMA_MATH) {
      ++cc.conv_tf32_calls;
    }
    if (!Refused(rc)) return s;
    // A refused call enqueued nothing: the next candidate may run instead.
    GiveWay(cc, cc.conv_choices.at(g.Key(kind, batch, ws.budget)),
            absl::StrCat("cuDNN refused the call of algorithm ", choice.algo,
                         ": ", s.message()));
  }
}

// ---- The depth split (Note [Split fallback]).

constexpr int64_t kScratchAlign = 256;  // bytes; cudaMalloc's alignment

int64_t AlignUp(int64_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

// For each of `rows` rows (a sample's channel): dst planes [dst_first,
// dst_first + count) of a row of `dst_planes` planes get the src planes
// [first, first + count) of a row of `src_planes` planes, zeros where those
// fall outside [0, src_planes). `plane`: bytes of one depth plane.
absl::Status CopyPlanes(CudaContext& cc, std::byte* dst, int64_t dst_planes,
                        int64_t dst_first, const std::byte* src,
                        int64_t src_planes, int64_t first, int64_t count,
                        int64_t rows, int64_t plane) {
  const PlaneRun r = ClipPlanes(src_planes, first, count);
  const int64_t pitch = dst_planes * plane;
  std::byte* out = dst + dst_first * plane;
  RETURN_IF_ERROR(Zero2D(cc, out, pitch, r.zeros_before * plane, rows));
  out += r.zeros_before * plane;
  if (r.copied > 0) {
    RETURN_IF_ERROR(Copy2D(cc, out, pitch, src + r.src_begin * plane,
                           src_planes * plane, r.copied * plane, rows));
  }
  out += r.copied * plane;
  return Zero2D(cc, out, pitch, r.zeros_after * plane, rows);
}

// The geometry of one slice: its window of depth planes, padding 0.
ConvGeom SliceGeom(const ConvGeom& g, const ConvSlice& s) {
  ConvGeom sg = g;
  sg.in[0] = s.window;
  sg.out[0] = s.outputs();
  sg.pad[0] = 0;
  return sg;
}

// What one accepted slice count needs: the largest window and slice output,
// in depth planes, and the largest workspace beyond the planned one, in
// bytes.
struct DepthPlan {
  int64_t window = 0;
  int64_t outputs = 0;
  int64_t overflow_bytes = 0;
};

// The plan of `slices` when every one of them is accepted (hooks and
// cuDNN), else nullopt with `*refusal` naming the first refused slice.
absl::StatusOr<std::optional<DepthPlan>> PlanSlices(
    CudaContext& cc, ConvKind kind, const ConvGeom& g, int64_t batch,
    const std::vector<ConvSlice>& slices, int64_t budget,
    std::string* refusal) {
  DepthPlan plan;
  for (const ConvSlice& s : slices) {
    if (s.outputs() == 0) continue;  // backward data: zeros, no call
    const ConvGeom sg = SliceGeom(g, s);
    ASSIGN_OR_RETURN(ConvChoice c, Accept(cc, kind, sg, batch, budget));
    if (!c.supported) {
      *refusal = absl::StrCat(sg.ToString(batch), ": ", c.why);
      return std::optional<DepthPlan>();
    }
    plan.window = std::max(plan.window, s.window);
    plan.outputs = std::max(plan.outputs, s.outputs());
    if (c.workspace_bytes > budget) {
      plan.overflow_bytes = std::max(plan.overflow_bytes, c.workspace_bytes);
    }
  }
  return std::optional<DepthPlan>(plan);
}

// Runs the slices of an accepted plan, in order; `*refused` as RunOnce's.
absl::Status RunSlices(CudaContext& cc, ConvKind kind, const ConvGeom& g,
                       int64_t batch, const ConvPtrs& p, float beta,
                       const ConvWorkspace& ws,
                       const std::vector<ConvSlice>& slices,
                       const DepthPlan& plan, bool* refused) {
  *refused = false;
  const int64_t es = DTypeSize(g.dtype);
  const int64_t x_rows = batch * g.c, y_rows = batch * g.o;
  const int64_t x_plane = g.in[1] * g.in[2] * es;    // bytes
  const int64_t y_plane = g.out[1] * g.out[2] * es;  // bytes
  // One request: [x or dx window | y or dy slice | overflow workspace].
  const int64_t window_bytes = AlignUp(x_rows * plan.window * x_plane);
  const int64_t part_bytes = AlignUp(y_rows * plan.outputs * y_plane);
  ASSIGN_OR_RETURN(void* scratch,
                   cc.scratch(window_bytes + part_bytes + plan.overflow_bytes));
  std::byte* const window = static_cast<std::byte*>(scratch);
  std::byte* const part = window + window_bytes;
  ConvWorkspace slice_ws = ws;
  slice_ws.overflow = part + part_bytes;
  slice_ws.overflow_bytes = plan.overflow_bytes;
  ++cc.conv_splits;
  ++cc.conv_depth_splits;
  bool first = true;
  for (const ConvSlice& s : slices) {
    const ConvGeom sg = SliceGeom(g, s);
    switch (kind) {
      case ConvKind::kForward:
        RETURN_IF_ERROR(CopyPlanes(cc, window, s.window, 0, p.x, g.in[0],
                                   s.window_begin, s.window, x_rows, x_plane));
        RETURN_IF_ERROR(RunOnce(cc, kind, sg, batch,
                                {window, p.w, nullptr, part}, 0.f, slice_ws,
                                refused));
        RETURN_IF_ERROR(CopyPlanes(cc, p.out, g.out[0], s.out_begin, part,
                                   s.outputs(), 0, s.outputs(), y_rows,
                                   y_plane));
        break;
      case ConvKind::kBackwardFilter:
        RETURN_IF_ERROR(CopyPlanes(cc, window, s.window, 0, p.x, g.in[0],
                                   s.window_begin, s.window, x_rows, x_plane));
        RETURN_IF_ERROR(CopyPlanes(cc, part, s.outputs(), 0, p.dy, g.out[0],
                                   s.out_begin, s.outputs(), y_rows, y_plane));
        // The caller's beta for the first slice, then accumulate.
        RETURN_IF_ERROR(RunOnce(cc, kind, sg, batch,
                                {window, nullptr, part, p.out},
                                first ? beta : 1.f, slice_ws, refused));
        break;
      case ConvKind::kBackwardData: {
        const int64_t owned = s.in_end - s.in_begin;
        if (s.outputs() == 0) {  // no output reads these planes
          RETURN_IF_ERROR(CopyPlanes(cc, p.out, g.in[0], s.in_begin, nullptr, 0,
                                     0, owned, x_rows, x_plane));
          break;
        }
        RETURN_IF_ERROR(CopyPlanes(cc, part, s.outputs(), 0, p.dy, g.out[0],
                                   s.out_begin, s.outputs(), y_rows, y_plane));
        RETURN_IF_ERROR(RunOnce(cc, kind, sg, batch,
                                {nullptr, p.w, part, window}, 0.f, slice_ws,
                                refused));
        // The owned planes out of the window (zeros outside it).
        RETURN_IF_ERROR(CopyPlanes(cc, p.out, g.in[0], s.in_begin, window,
                                   s.window, s.in_begin - s.window_begin, owned,
                                   x_rows, x_plane));
        break;
      }
    }
    first = false;
  }
  return absl::OkStatus();
}

// The depth split of a 3-D convolution over `batch` samples that cuDNN
// refused (`whole`: why). Forward and backward data overwrite y and dx
// (beta 0 only); backward filter takes the caller's beta as RunOnce would.
absl::Status RunDepthSplit(CudaContext& cc, ConvKind kind, const ConvGeom& g,
                           int64_t batch, const ConvPtrs& p, float beta,
                           const ConvWorkspace& ws, const absl::Status& whole) {
  if (kind != ConvKind::kBackwardFilter && beta != 0.f) {
    return absl::InternalError("the depth split writes y and dx with beta 0");
  }
  // A dilated kernel's slices take its whole extent: the window holds every
  // plane an output plane reads (backward data: a superset of the outputs
  // that read an owned plane, the others adding zeros).
  const ConvAxis axis{g.in[0], g.Extent(0), g.stride[0], g.pad[0], g.out[0]};
  const bool by_input = kind == ConvKind::kBackwardData;
  // Later calls of the same configuration start at the count that ran.
  const std::string key = g.Key(kind, batch, ws.budget);
  const auto known = cc.conv_depth_parts.find(key);
  std::string refusal;
  for (int64_t parts : SplitCounts(by_input ? axis.in : axis.out)) {
    if (known != cc.conv_depth_parts.end() && parts < known->second) continue;
    const std::vector<ConvSlice> slices =
        by_input ? SplitInputs(axis, parts) : SplitOutputs(axis, parts);
    // Planned again at this count while calls keep refusing algorithms:
    // each refusal moves a slice to its next candidate, whose workspace
    // the new plan sets aside; the count fails once a slice has none left.
    for (;;) {
      const int64_t refusals_before = cc.conv_algorithm_refusals;
      ASSIGN_OR_RETURN(
          std::optional<DepthPlan> plan,
          PlanSlices(cc, kind, g, batch, slices, ws.budget, &refusal));
      if (!plan.has_value()) break;
      bool refused = false;
      absl::Status s =
          RunSlices(cc, kind, g, batch, p, beta, ws, slices, *plan, &refused);
      if (s.ok()) cc.conv_depth_parts[key] = parts;
      if (s.ok() || !refused) return s;
      // A slice could not run as its probe planned. The slices written so
      // far are overwritten by the next attempt, except a weight gradient
      // that already added into the caller's (beta != 0).
      if (kind == ConvKind::kBackwardFilter && beta != 0.f) {
        return absl::UnimplementedError(absl::StrCat(
            "cuDNN refused a depth slice of the convolution ", KindName(kind),
            " of ", g.ToString(batch), " when called (", s.message(),
            ") after accepting it, while accumulating the weight gradient"));
      }
      refusal = std::string(s.message());
      if (cc.conv_algorithm_refusals == refusals_before) break;
    }
  }
  MarkFmaExhausted(cc, kind, g, batch, ws.budget);
  return absl::UnimplementedError(absl::StrCat(
      "cuDNN refuses the convolution ", KindName(kind), " of ",
      g.ToString(batch), " (", whole.message(),
      ") even split along the depth down to one ",
      by_input ? "input" : "output", " plane per slice (", refusal, ")"));
}

// Runs the convolution over `batch` samples, splitting along the batch
// where cuDNN refuses, then along the depth (Note [Split fallback]).
absl::Status RunSplit(CudaContext& cc, ConvKind kind, const ConvGeom& g,
                      int64_t batch, const ConvPtrs& p, float beta,
                      const ConvWorkspace& ws) {
  bool refused = false;
  absl::Status s = RunOnce(cc, kind, g, batch, p, beta, ws, &refused);
  if (s.ok() || !refused) return s;
  if (batch <= 1) {
    if (g.dims == 3) return RunDepthSplit(cc, kind, g, batch, p, beta, ws, s);
    MarkFmaExhausted(cc, kind, g, batch, ws.budget);
    return absl::UnimplementedError(absl::StrCat(
        "cuDNN refuses the convolution ", KindName(kind), " of ",
        g.ToString(batch), " even for one sample (", s.message(),
        "); only 3-D convolutions are split along a spatial axis"));
  }
  ++cc.conv_splits;
  const int64_t es = DTypeSize(g.dtype);
  const int64_t first = BatchSplitPoint(batch, {g.XSample() * es, g.YSample() * es});
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
  RETURN_IF_ERROR(RunSplit(cc, kind, g, first, p, beta, ws));
  // The weight gradient of the second part adds into the first's.
  const float beta2 = kind == ConvKind::kBackwardFilter ? 1.f : beta;
  return RunSplit(cc, kind, g, batch - first, second, beta2, ws);
}

// The whole convolution of a node: RunSplit over all g.n samples, after the
// cases cuDNN's descriptors refuse (a dimension of 0): an empty output
// needs no call, and an output summed over nothing (no samples for the
// weight gradient, no channels) is zeros, as on the CPU backend. A
// convolution refused even split runs again, with what the attempt learned
// (Note [Convolution algorithms]); the refusal that ends it says whether
// TF32 algorithms were tried too.
absl::Status RunConv(CudaContext& cc, ConvKind kind, const ConvGeom& g,
                     const ConvPtrs& p, const ConvWorkspace& ws) {
  const int64_t x = g.n * g.XSample(), y = g.n * g.YSample();
  const int64_t w = g.WeightElements();
  const int64_t out = kind == ConvKind::kForward        ? y
                      : kind == ConvKind::kBackwardData ? x
                                                        : w;
  if (out == 0) return absl::OkStatus();
  if (x == 0 || y == 0 || w == 0) {
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        p.out, 0, static_cast<size_t>(out * DTypeSize(g.dtype)), cc.stream));
    return absl::OkStatus();
  }
  // A refused attempt runs again from the start (beta 0 overwrites whatever
  // it wrote) when it taught something: an algorithm refused mid-way (its
  // successor runs now) or a sample refused even split (its TF32 candidates
  // may run now). Each lesson is final, so the attempts end.
  for (;;) {
    const int64_t lessons = cc.conv_algorithm_refusals + cc.conv_fma_exhausted;
    absl::Status s = RunSplit(cc, kind, g, g.n, p, 0.f, ws);
    if (s.code() != absl::StatusCode::kUnimplemented ||
        cc.conv_algorithm_refusals + cc.conv_fma_exhausted == lessons) {
      return s;
    }
  }
}

}  // namespace

absl::Status CheckConvSupported(const nlohmann::json& attrs, int dims) {
  return ops_internal::ConvGroupsDilationAttrs(attrs, dims).status();
}

namespace {

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
  ASSIGN_OR_RETURN(ops_internal::ConvGroupsDilation gd,
                   ops_internal::ConvGroupsDilationAttrs(ctx.attrs(), dims));
  ConvGeom g;
  g.dims = dims;
  g.n = x[0];
  g.c = x[1];
  g.o = w[0];
  g.groups = gd.groups;
  g.dtype = dtype;
  if (g.c % g.groups != 0 || g.o % g.groups != 0 || w[1] * g.groups != g.c ||
      y[0] != g.n || y[1] != g.o) {
    return absl::InvalidArgumentError(absl::StrCat(
        "x ", ShapeToString(x), ", weight ", ShapeToString(w), " and output ",
        ShapeToString(y), " do not agree at groups ", g.groups));
  }
  for (int i = 0; i < dims; ++i) {
    g.in[i] = x[2 + i];
    g.k[i] = w[2 + i];
    g.out[i] = y[2 + i];
    g.stride[i] = stride[i];
    g.pad[i] = pad[i];
    g.dilation[i] = gd.dilation[i];
    ASSIGN_OR_RETURN(const int64_t extent,
                     ops_internal::DilatedKernel(g.k[i], g.dilation[i], i));
    if (stride[i] < 1 || pad[i] < 0 || g.in[i] + 2 * pad[i] < extent ||
        (g.in[i] + 2 * pad[i] - extent) / stride[i] + 1 != g.out[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stride ", stride[i], ", padding ", pad[i], " and dilation ",
          g.dilation[i], " do not map ", ShapeToString(x), " to ",
          ShapeToString(y)));
    }
  }
  return g;
}

// The direction, spatial dims and (x, w, y) shapes of convolution node v, or
// nullopt for other ops.
struct ConvNode {
  ConvKind kind;
  int dims;
  Shape x, w, y;
};
std::optional<ConvNode> AsConvNode(const Graph& graph, NodeId v) {
  const std::string& op = graph.op(v);
  if (op.size() < 6 || (op.rfind("conv2d", 0) != 0 && op.rfind("conv3d", 0) != 0)) {
    return std::nullopt;
  }
  const int dims = op[4] == '3' ? 3 : 2;
  const std::string rest = op.substr(6);
  const auto& in = graph.inputs(v);
  auto shape = [&](NodeId u) { return *graph.shape(u); };
  if (rest.empty() && in.size() >= 2) {
    return ConvNode{ConvKind::kForward, dims, shape(in[0]), shape(in[1]), shape(v)};
  }
  if (rest == "_backward_data" && in.size() == 2) {  // (grad, weight)
    return ConvNode{ConvKind::kBackwardData, dims, shape(v), shape(in[1]), shape(in[0])};
  }
  if (rest == "_backward_weight" && in.size() == 2) {  // (grad, x)
    return ConvNode{ConvKind::kBackwardFilter, dims, shape(in[1]), shape(v), shape(in[0])};
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<int64_t> ConvWorkspaceQuery(CudaContext& cc, const Graph& graph, NodeId node,
                                           bool least) {
  if (!graph.dtype(node).has_value()) return 0;
  for (NodeId u : graph.inputs(node)) {
    if (!graph.shape(u).has_value()) return 0;
  }
  const std::optional<ConvNode> conv = AsConvNode(graph, node);
  if (!conv.has_value()) return 0;
  KernelContext ctx;  // shapes and attrs only: Geometry reads no data
  ctx.graph = &graph;
  ctx.node = node;
  ASSIGN_OR_RETURN(ConvGeom g,
                   Geometry(ctx, conv->dims, conv->x, conv->w, conv->y, *graph.dtype(node)));
  if (g.n * g.XSample() == 0 || g.n * g.YSample() == 0 || g.WeightElements() == 0) return 0;
  // With a budget of 0 the candidates run least workspace first (those that
  // need none in the heuristics' rank).
  ASSIGN_OR_RETURN(ConvChoice choice,
                   Choose(cc, conv->kind, g, g.n,
                          least ? 0 : std::numeric_limits<int64_t>::max()));
  return choice.supported ? choice.workspace_bytes : 0;
}

namespace {

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
  RETURN_IF_ERROR(RunConv(cc, ConvKind::kForward, g, p,
                          {ctx.workspace_bytes, ctx.workspace, nullptr, 0}));
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
  return RunConv(cc, ConvKind::kBackwardData, g, p,
                 {ctx.workspace_bytes, ctx.workspace, nullptr, 0});
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
  return RunConv(cc, ConvKind::kBackwardFilter, g, p,
                 {ctx.workspace_bytes, ctx.workspace, nullptr, 0});
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
  if (k == 0) {  // sums over nothing: zeros (cuBLAS refuses ld < 1)
    if (ldc != n || (batch > 1 && stride_c != m * n)) {
      return absl::InternalError("an empty product into a strided C");
    }
    PEBBLE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        c, 0, static_cast<size_t>(batch * m * n * DTypeSize(dtype)),
        cc.stream));
    return absl::OkStatus();
  }
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

// The rows of a (M.., last) tensor: the product of the leading dims.
int64_t LeadingRows(const Shape& shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return rows;
}

// linear (x (M.., in), weight (out, in) [, bias (out)]) -> (M.., out).
absl::Status Linear(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 3));
  RETURN_IF_ERROR(SameDType(ctx));
  const TensorView& x = ctx.inputs[0];
  const TensorView& w = ctx.inputs[1];
  if (w.rank() != 2 || x.rank() < 1 || ctx.output.rank() != x.rank() ||
      x.shape.back() != w.shape[1] || ctx.output.shape.back() != w.shape[0] ||
      LeadingRows(ctx.output.shape) != LeadingRows(x.shape)) {
    return absl::InvalidArgumentError("linear: x, weight and output do not agree");
  }
  const int64_t in = w.shape[1], out = w.shape[0];
  const int64_t m = LeadingRows(x.shape);
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
  if (w.rank() != 2 || g.rank() < 1 || ctx.output.rank() != g.rank() ||
      g.shape.back() != w.shape[0] || ctx.output.shape.back() != w.shape[1] ||
      LeadingRows(ctx.output.shape) != LeadingRows(g.shape)) {
    return absl::InvalidArgumentError("linear_backward_data: shapes do not agree");
  }
  const int64_t in = w.shape[1], out = w.shape[0];
  const int64_t m = LeadingRows(g.shape);
  return RowMajorGemm(cc, g.dtype, false, false, m, in, out, 1.f, g.data, out, 0,
                      w.data, in, 0, ctx.output.data, in, 0, 1);
}

// linear_backward_weight (g (M.., out), x (M.., in)) -> (out, in) = g^T x.
absl::Status LinearBackwardWeight(CudaContext& cc, const KernelContext& ctx) {
  RETURN_IF_ERROR(ExpectInputs(ctx, 2, 2));
  RETURN_IF_ERROR(SameDType(ctx));
  const TensorView& g = ctx.inputs[0];
  const TensorView& x = ctx.inputs[1];
  if (ctx.output.rank() != 2 || g.rank() < 1 || x.rank() < 1 ||
      g.shape.back() != ctx.output.shape[0] ||
      x.shape.back() != ctx.output.shape[1] ||
      LeadingRows(g.shape) != LeadingRows(x.shape)) {
    return absl::InvalidArgumentError("linear_backward_weight: shapes do not agree");
  }
  const int64_t out = ctx.output.shape[0], in = ctx.output.shape[1];
  const int64_t m = LeadingRows(g.shape);
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
