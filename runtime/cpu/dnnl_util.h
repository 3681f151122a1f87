// Internal to the oneDNN kernels of the CPU backend (runtime/cpu/dnnl_*.cc):
// the process's engine and streams, the primitive cache, kernel scratch,
// dtype conversions and operand checks. Nothing outside runtime/cpu/dnnl_*
// includes this file; the public face is RegisterDnnlKernels() and
// DnnlScratchPeakBytes() in runtime/cpu/cpu_backend.h.
//
// Note [oneDNN kernels]
//  - Operands are wrapped in place: memory descriptors in plain row-major
//    layouts (a, ab, abc, ncdhw, oidhw, or explicit strides for a transposed
//    matrix) over the executor's buffers. Convolutions are the exception:
//    they are created with format_tag::any and, where oneDNN picks a
//    blocked layout, Execute reorders operands into per-thread scratch and
//    the output back (Relayout); that scratch is counted like the rest.
//  - Primitives are cached by a key that spells out everything that defines
//    them (kind, dtype, dims, strides, attrs), so a training step builds each
//    one once; the cache is guarded by a mutex and never evicts (a graph has
//    a bounded set of shapes).
//  - Scratchpads are user-managed (scratchpad_mode::user): each calling
//    thread owns its scratch buffers, so one cached primitive may run on
//    several threads at once, and every byte of scratch a kernel uses is
//    counted (DnnlScratchPeakBytes, NoteCpuKernelScratch).
//  - Determinism: oneDNN's CPU primitives are run-to-run deterministic for a
//    fixed thread count, shapes and attributes (oneDNN developer guide,
//    "Reproducibility"); the own loops (batch norm, bias gradients, max
//    pooling backward) reduce each output element in a fixed order, over
//    fixed-size blocks whose partial sums are combined in block order, so
//    their bits do not depend on the thread count either.
//  - fp16 / bf16: kernels compute in fp32. RegisterDnnlKernels wraps every
//    kernel so that half-precision operands are widened into fp32 scratch and
//    a half-precision output is rounded to nearest-even on store.
#ifndef PEBBLE_RUNTIME_CPU_DNNL_UTIL_H_
#define PEBBLE_RUNTIME_CPU_DNNL_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/half.h"
#include "graph/ops/op_util.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace pebble::dnnl_internal {

using Json = nlohmann::json;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// The process's CPU engine (created on first use).
const dnnl::engine& Engine();
// The calling thread's stream on Engine() (a oneDNN stream must not be used
// by two threads at once, so each thread that runs kernels gets its own).
dnnl::stream& Stream();

// ---- Operand checks; messages name the operand ("input 1 (weight)").

template <typename... Args>
absl::Status Invalid(const Args&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// The op's number of inputs is in [min, max].
absl::Status ExpectInputs(const KernelContext& ctx, int min, int max);
absl::Status ExpectF32(const TensorView& t, absl::string_view what);
absl::Status ExpectRank(const TensorView& t, int rank, absl::string_view what);
absl::Status ExpectShape(const TensorView& t, const Shape& shape,
                         absl::string_view what);
// Every operand (inputs and output) has data, unless it has no elements.
absl::Status ExpectData(const KernelContext& ctx);

// ---- Memory descriptors over plain row-major tensors.

dnnl::memory::dims Dims(const Shape& shape);
// Row-major fp32 descriptor of `shape` (rank 1 to 6; a scalar is (1)).
dnnl::memory::desc PlainDesc(const Shape& shape, dt type = dt::f32);
// A memory object over `data` (no copy). `data` may be null for an empty
// tensor.
dnnl::memory Wrap(const dnnl::memory::desc& desc, const void* data);
// "2x3x4" for cache keys.
std::string DimsKey(const dnnl::memory::dims& dims);

// ---- Primitive cache.

// An operand the primitive wants in another layout than the plain one
// (oneDNN chose it through format_tag::any): Execute reorders an input into
// scratch before the primitive runs, and an output from scratch after.
// A primitive made from its descriptor on first use (thread-safe). Making
// one can take seconds and touch memory in proportion to its operands (some
// reorders of large tensors do); a workspace probe needs only the
// descriptor's sizes and never pays it.
class LazyPrimitive {
 public:
  LazyPrimitive() = default;
  explicit LazyPrimitive(const dnnl::primitive_desc_base& pd);
  // Throws dnnl::error where oneDNN cannot make it (the next call tries
  // again).
  const dnnl::primitive& Get() const;

 private:
  struct State {
    std::once_flag once;
    dnnl::primitive primitive;
  };
  dnnl::primitive_desc_base pd_;
  std::shared_ptr<State> state_;
};

struct Relayout {
  int arg = 0;                    // DNNL_ARG_*
  dnnl::memory::desc internal;    // the primitive's layout
  bool output = false;
  LazyPrimitive reorder;          // plain -> internal, or internal -> plain
};

// A primitive and what it asks of the scratch. Every primitive, reorders
// included, is made with a user scratchpad (DefaultAttr): in oneDNN's
// default mode a primitive allocates its scratchpad itself, at creation
// and outside any plan (a reorder into a blocked layout can take as much
// as its operand).
struct CachedPrimitive {
  LazyPrimitive primitive;
  int64_t scratchpad_bytes = 0;
  // The largest scratchpad of the relayouts' reorders: they run one after
  // another and share one buffer.
  int64_t reorder_scratchpad_bytes = 0;
  std::vector<Relayout> relayouts;  // at most 3 (kLayout0..2)
};

// A primitive of `pd` (made with DefaultAttr), its scratchpad size, no
// relayouts yet.
CachedPrimitive Cached(const dnnl::primitive_desc_base& pd);

// Records a relayout of `arg` when `chosen` (the primitive descriptor's
// layout) differs from `plain`.
void AddRelayout(CachedPrimitive& p, int arg, const dnnl::memory::desc& plain,
                 const dnnl::memory::desc& chosen, bool output);

// The primitive cached under `key`, built by `make` on the first request.
// `make` may throw dnnl::error (the caller's kernel wrapper turns it into a
// Status); nothing is cached then. The returned reference stays valid for
// the life of the process. Thread-safe.
const CachedPrimitive& GetPrimitive(
    const std::string& key, const std::function<CachedPrimitive()>& make);

// Attributes every cached primitive is created with: user scratchpad.
dnnl::primitive_attr DefaultAttr();

// Runs `p` on the calling thread's stream with `args` plus a scratchpad
// from this thread's scratch (and the relayouts of p), and waits for it.
// During a workspace probe (Probing()) it asks for the scratch and runs
// nothing.
void Execute(const CachedPrimitive& p,
             std::unordered_map<int, dnnl::memory> args);

// ---- Scratch: carved from the kernel call's planned workspace while it
// lasts (Note [Planned scratch] in runtime/cpu/cpu_backend.h), else from
// per-thread buffers, 64-byte aligned, grown on demand and kept, which lie
// outside the plan. Slots let one kernel call hold several buffers at once.
enum ScratchSlot : int {
  kScratchpad = 0,  // oneDNN scratchpads (Execute)
  kLayout0,         // operands in a primitive's own layout (Relayout)
  kLayout1,
  kLayout2,
  kReorderScratchpad,  // the relayouts' reorders (one at a time)
  kConvert0,  // fp32 copies of half-precision operands (up to 5 inputs)
  kConvertOut = kConvert0 + 5,
  kNumScratchSlots,
};
inline constexpr int64_t kScratchAlignment = 64;  // bytes
// What a request of `bytes` takes: rounded up to kScratchAlignment, at
// least one unit.
int64_t ScratchRequestBytes(int64_t bytes);
// `bytes` of scratch for `slot`: the next piece of the planned workspace
// when it still has room, else the calling thread's buffer for the slot.
// Adds ScratchRequestBytes(bytes) to the call's total. The previous contents
// are garbage.
std::byte* Scratch(ScratchSlot slot, int64_t bytes);
// Whether the calling thread runs a workspace probe
// (DnnlProbeScratchBytes): kernels then ask for their scratch as they
// would, but may skip their arithmetic (the results are discarded).
bool Probing();
// Starts a kernel call's scratch (resets the thread's totals); `workspace`
// (null for none) is its planned workspace of `workspace_bytes`.
void BeginScratchCount(std::byte* workspace, int64_t workspace_bytes);
// Ends the call: its total is kept for DnnlProbeScratchBytes; outside a
// probe, what it took outside the planned workspace goes to
// NoteCpuKernelScratch and its total to the process-wide high-water mark.
void EndScratchCount();

// ---- Windows: the operator table's reading of a pooling's or a
// convolution's attrs (graph/ops/op_util.h).
using ops_internal::ConvWindow;
using ops_internal::PoolWindow;
using ops_internal::Window;
using ops_internal::WindowShape;

// ---- Half precision (bit patterns in uint16_t): graph/half.h.
using ::pebble::FloatToHalf;
using ::pebble::HalfToFloat;
inline float Bf16ToFloat(uint16_t h) { return BFloat16ToFloat(h); }
inline uint16_t FloatToBf16(float f) { return FloatToBFloat16(f); }
// Widens n elements of `src` (fp16/bf16/fp32) into fp32 `dst`, in parallel.
void ToFloat(const TensorView& src, float* dst);
// Narrows n fp32 elements into `dst` (fp16/bf16/fp32), in parallel.
void FromFloat(const float* src, const TensorView& dst);

// ---- Kernel entry points of each family (registered in dnnl_kernels.cc).
// Each takes fp32 operands (half precision is handled by the wrapper).
absl::Status ConvForward(const KernelContext& ctx);
absl::Status ConvBackwardData(const KernelContext& ctx);
absl::Status ConvBackwardWeight(const KernelContext& ctx);
absl::Status ConvBackwardBias(const KernelContext& ctx);
absl::Status Linear(const KernelContext& ctx);
absl::Status LinearBackwardData(const KernelContext& ctx);
absl::Status LinearBackwardWeight(const KernelContext& ctx);
absl::Status LinearBackwardBias(const KernelContext& ctx);
absl::Status Matmul(const KernelContext& ctx);
absl::Status MaxPool(const KernelContext& ctx);
absl::Status MaxPoolBackward(const KernelContext& ctx);
absl::Status AvgPool(const KernelContext& ctx);
absl::Status AvgPoolBackward(const KernelContext& ctx);
absl::Status Tanh(const KernelContext& ctx);
absl::Status Sigmoid(const KernelContext& ctx);
absl::Status Gelu(const KernelContext& ctx);
absl::Status TanhBackward(const KernelContext& ctx);
absl::Status SigmoidBackward(const KernelContext& ctx);
absl::Status GeluBackward(const KernelContext& ctx);
absl::Status Softmax(const KernelContext& ctx);
absl::Status SoftmaxBackward(const KernelContext& ctx);
absl::Status LogSoftmax(const KernelContext& ctx);
absl::Status LogSoftmaxBackward(const KernelContext& ctx);
absl::Status BatchNormStats(const KernelContext& ctx);
absl::Status BatchNorm(const KernelContext& ctx);
absl::Status BatchNormBackward(const KernelContext& ctx);
absl::Status BatchNormBackwardWeight(const KernelContext& ctx);
absl::Status BatchNormBackwardBias(const KernelContext& ctx);

// ---- Deterministic reductions used by several kernels.

// The sum over i < n of term(i), in double, in eight independent lanes
// (lane l adds the i = l mod 8 terms; the tail goes to lane 0) combined
// pairwise. The order depends on n only, so results are reproducible; eight
// dependency chains instead of one keep the adder busy (a single running
// double sum is latency-bound, several times slower) and let the compiler
// vectorise the lanes.
template <typename Term>
double LaneSum(int64_t n, Term term) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += term(i + l);
  }
  for (; i < n; ++i) lane[0] += term(i);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// Sum of n consecutive floats in double (LaneSum).
inline double SumRun(const float* p, int64_t n) {
  return LaneSum(n, [p](int64_t i) { return double{p[i]}; });
}

// out[c] = sum over i of x[(i * C + c) * inner + j] for i < outer, j < inner:
// x viewed as (outer, C, inner). Each sum is accumulated in double over
// fixed blocks combined in block order; out is written as fp32.
void ChannelSums(const float* x, int64_t outer, int64_t channels,
                 int64_t inner, float* out);

}  // namespace pebble::dnnl_internal

#endif  // PEBBLE_RUNTIME_CPU_DNNL_UTIL_H_
