// Engine, streams, primitive cache, scratch, windows and conversions shared
// by the oneDNN kernels (Note [oneDNN kernels] in runtime/cpu/dnnl_util.h).
#include "runtime/cpu/dnnl_util.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/parallel.h"

namespace pebble {
namespace dnnl_internal {
namespace {

std::atomic<int64_t>& ScratchPeak() {
  static std::atomic<int64_t> peak{0};
  return peak;
}

// One growable 64-byte aligned buffer.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { std::free(data_); }

  std::byte* Get(int64_t bytes) {
    if (bytes > capacity_) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = 0;
      // Rounded up to whole cache lines (aligned_alloc wants a multiple).
      const int64_t size = (bytes + 63) / 64 * 64;
      data_ = static_cast<std::byte*>(std::aligned_alloc(64, size));
      if (data_ == nullptr) throw std::bad_alloc();
      capacity_ = size;
    }
    return data_;
  }

 private:
  std::byte* data_ = nullptr;
  int64_t capacity_ = 0;
};

// Anonymous memory mapped for one probe: zeros until the kernel writes.
struct MappedBuffer {
  explicit MappedBuffer(int64_t bytes) : size(static_cast<size_t>(bytes)) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data = static_cast<std::byte*>(p);
  }
  MappedBuffer(MappedBuffer&& o) noexcept : data(o.data), size(o.size) { o.data = nullptr; }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  MappedBuffer& operator=(MappedBuffer&&) = delete;
  ~MappedBuffer() {
    if (data != nullptr) munmap(data, size);
  }
  std::byte* data = nullptr;
  size_t size = 0;
};

// The calling thread's scratch: its own buffers (outside the plan) and the
// current kernel call's planned workspace, carved from the front.
struct ThreadScratch {
  ScratchBuffer slots[kNumScratchSlots];
  int64_t call_bytes = 0;     // every request of the call, rounded
  int64_t outside_bytes = 0;  // those served by `slots`
  int64_t last_call_bytes = 0;
  std::byte* planned = nullptr;
  int64_t planned_bytes = 0;
  int64_t planned_used = 0;
  bool probing = false;  // QueryWorkspace: nothing is noted
  // While probing, scratch comes from mappings of its own, unmapped when the
  // probe ends: none of it stays resident (the heap keeps freed memory).
  std::vector<MappedBuffer> probe_buffers;
};

ThreadScratch& LocalScratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

struct PrimitiveCache {
  std::mutex mu;
  std::unordered_map<std::string, std::unique_ptr<CachedPrimitive>> map;
};

PrimitiveCache& Cache() {
  static PrimitiveCache* cache = new PrimitiveCache();  // never destroyed
  return *cache;
}

}  // namespace

const dnnl::engine& Engine() {
  static const dnnl::engine* engine =
      new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

absl::Status ExpectInputs(const KernelContext& ctx, int min, int max) {
  const int n = static_cast<int>(ctx.inputs.size());
  if (n < min || n > max) {
    return Invalid("expects ", min == max ? absl::StrCat(min)
                                          : absl::StrCat(min, " to ", max),
                   " inputs, got ", n);
  }
  return absl::OkStatus();
}

absl::Status ExpectF32(const TensorView& t, absl::string_view what) {
  if (t.dtype != DType::kFloat32) {
    return Invalid(what, " must be fp32, got ", DTypeName(t.dtype));
  }
  return absl::OkStatus();
}

absl::Status ExpectRank(const TensorView& t, int rank,
                        absl::string_view what) {
  if (t.rank() != rank) {
    return Invalid(what, " must have rank ", rank, ", got ",
                   ShapeToString(t.shape));
  }
  return absl::OkStatus();
}

absl::Status ExpectShape(const TensorView& t, const Shape& shape,
                         absl::string_view what) {
  if (t.shape != shape) {
    return Invalid(what, " must be ", ShapeToString(shape), ", got ",
                   ShapeToString(t.shape));
  }
  return absl::OkStatus();
}

absl::Status ExpectData(const KernelContext& ctx) {
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (ctx.inputs[i].data == nullptr && ctx.inputs[i].num_elements() > 0) {
      return Invalid("input ", i, " has no data");
    }
  }
  if (ctx.output.data == nullptr && ctx.output.num_elements() > 0) {
    return Invalid("the output has no data");
  }
  return absl::OkStatus();
}

dnnl::memory::dims Dims(const Shape& shape) {
  if (shape.empty()) return {1};
  return dnnl::memory::dims(shape.begin(), shape.end());
}

dnnl::memory::desc PlainDesc(const Shape& shape, dt type) {
  const dnnl::memory::dims dims = Dims(shape);
  static constexpr tag kTags[] = {tag::a,     tag::ab,     tag::abc,
                                  tag::abcd, tag::abcde, tag::abcdef};
  PEBBLE_CHECK(!dims.empty() && dims.size() <= 6, "rank out of range");
  return dnnl::memory::desc(dims, type, kTags[dims.size() - 1]);
}

dnnl::memory Wrap(const dnnl::memory::desc& desc, const void* data) {
  // oneDNN takes a non-const handle; inputs are only read.
  return dnnl::memory(desc, Engine(), const_cast<void*>(data));
}

std::string DimsKey(const dnnl::memory::dims& dims) {
  std::string key;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) key += 'x';
    key += std::to_string(dims[i]);
  }
  return key;
}

const CachedPrimitive& GetPrimitive(
    const std::string& key, const std::function<CachedPrimitive()>& make) {
  PrimitiveCache& cache = Cache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.map.find(key);
    if (it != cache.map.end()) return *it->second;
  }
  // Built outside the lock (primitive creation can take milliseconds); a
  // concurrent builder of the same key keeps the first entry.
  auto made = std::make_unique<CachedPrimitive>(make());
  std::lock_guard<std::mutex> lock(cache.mu);
  auto [it, inserted] = cache.map.emplace(key, std::move(made));
  return *it->second;
}

LazyPrimitive::LazyPrimitive(const dnnl::primitive_desc_base& pd)
    : pd_(pd), state_(std::make_shared<State>()) {}

const dnnl::primitive& LazyPrimitive::Get() const {
  PEBBLE_CHECK(state_ != nullptr, "LazyPrimitive without a descriptor");
  std::call_once(state_->once, [&] { state_->primitive = dnnl::primitive(pd_.get()); });
  return state_->primitive;
}

CachedPrimitive Cached(const dnnl::primitive_desc_base& pd) {
  CachedPrimitive c;
  c.primitive = LazyPrimitive(pd);
  c.scratchpad_bytes = static_cast<int64_t>(pd.scratchpad_desc().get_size());
  return c;
}

dnnl::primitive_attr DefaultAttr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void AddRelayout(CachedPrimitive& p, int arg, const dnnl::memory::desc& plain,
                 const dnnl::memory::desc& chosen, bool output) {
  if (chosen == plain) return;
  PEBBLE_CHECK(p.relayouts.size() < 3, "more than 3 relayouts");
  Relayout r;
  r.arg = arg;
  r.internal = chosen;
  r.output = output;
  const dnnl::reorder::primitive_desc pd =
      output ? dnnl::reorder::primitive_desc(Engine(), chosen, Engine(), plain, DefaultAttr())
             : dnnl::reorder::primitive_desc(Engine(), plain, Engine(), chosen, DefaultAttr());
  r.reorder = LazyPrimitive(pd);
  p.reorder_scratchpad_bytes = std::max(
      p.reorder_scratchpad_bytes, static_cast<int64_t>(pd.scratchpad_desc().get_size()));
  p.relayouts.push_back(std::move(r));
}

void Execute(const CachedPrimitive& p,
             std::unordered_map<int, dnnl::memory> args) {
  // A workspace probe wants the scratch requests, not the results: running
  // oneDNN on operands as large as the budget would take seconds and touch
  // every page, and so would wrapping a relayout buffer (oneDNN zeroes the
  // padding of a blocked layout when it gets a handle). Note [Planned
  // scratch] in runtime/cpu/cpu_backend.h.
  if (Probing()) {
    if (p.scratchpad_bytes > 0) Scratch(kScratchpad, p.scratchpad_bytes);
    if (p.reorder_scratchpad_bytes > 0) Scratch(kReorderScratchpad, p.reorder_scratchpad_bytes);
    int slot = kLayout0;
    for (const Relayout& r : p.relayouts) {
      Scratch(static_cast<ScratchSlot>(slot++), static_cast<int64_t>(r.internal.get_size()));
    }
    return;
  }
  dnnl::stream& stream = Stream();
  if (p.scratchpad_bytes > 0) {
    std::byte* scratch = Scratch(kScratchpad, p.scratchpad_bytes);
    const dnnl::memory::desc md({p.scratchpad_bytes}, dt::u8, tag::a);
    args.emplace(DNNL_ARG_SCRATCHPAD, Wrap(md, scratch));
  }
  // Each reorder below gets this scratchpad, or none.
  std::unordered_map<int, dnnl::memory> reorder_scratchpad;
  if (p.reorder_scratchpad_bytes > 0) {
    std::byte* scratch = Scratch(kReorderScratchpad, p.reorder_scratchpad_bytes);
    const dnnl::memory::desc md({p.reorder_scratchpad_bytes}, dt::u8, tag::a);
    reorder_scratchpad.emplace(DNNL_ARG_SCRATCHPAD, Wrap(md, scratch));
  }
  auto run_reorder = [&](const Relayout& r, const dnnl::memory& from, const dnnl::memory& to) {
    std::unordered_map<int, dnnl::memory> reorder_args = reorder_scratchpad;
    reorder_args.emplace(DNNL_ARG_FROM, from);
    reorder_args.emplace(DNNL_ARG_TO, to);
    r.reorder.Get().execute(stream, reorder_args);
  };
  // Outputs computed in the primitive's layout: (relayout, user memory).
  std::vector<std::pair<const Relayout*, dnnl::memory>> outputs;
  int slot = kLayout0;
  for (const Relayout& r : p.relayouts) {
    auto it = args.find(r.arg);
    PEBBLE_CHECK(it != args.end(), "relayout of a missing argument");
    std::byte* buffer = Scratch(static_cast<ScratchSlot>(slot++),
                                static_cast<int64_t>(r.internal.get_size()));
    dnnl::memory internal(r.internal, Engine(), buffer);
    if (r.output) {
      outputs.emplace_back(&r, it->second);
    } else {
      run_reorder(r, it->second, internal);
    }
    it->second = internal;
  }
  p.primitive.Get().execute(stream, args);
  for (auto& [r, user] : outputs) run_reorder(*r, args.at(r->arg), user);
  stream.wait();
}

bool Probing() { return LocalScratch().probing; }

std::byte* Scratch(ScratchSlot slot, int64_t bytes) {
  ThreadScratch& s = LocalScratch();
  const int64_t rounded = ScratchRequestBytes(bytes);
  s.call_bytes += rounded;
  if (s.planned != nullptr && s.planned_used + rounded <= s.planned_bytes) {
    std::byte* p = s.planned + s.planned_used;
    s.planned_used += rounded;
    return p;
  }
  s.outside_bytes += rounded;
  if (s.probing) return s.probe_buffers.emplace_back(rounded).data;
  return s.slots[slot].Get(rounded);
}

int64_t ScratchRequestBytes(int64_t bytes) {
  return (std::max<int64_t>(bytes, 1) + kScratchAlignment - 1) / kScratchAlignment *
         kScratchAlignment;
}

void BeginScratchCount(std::byte* workspace, int64_t workspace_bytes) {
  ThreadScratch& s = LocalScratch();
  s.call_bytes = 0;
  s.outside_bytes = 0;
  // Requests are carved at multiples of kScratchAlignment from an aligned
  // start (the layout's offsets are 64-byte aligned by default).
  const auto address = reinterpret_cast<uintptr_t>(workspace);
  const int64_t skip = static_cast<int64_t>(
      (kScratchAlignment - address % kScratchAlignment) % kScratchAlignment);
  const bool usable = workspace != nullptr && workspace_bytes > skip;
  s.planned = usable ? workspace + skip : nullptr;
  s.planned_bytes = usable ? workspace_bytes - skip : 0;
  s.planned_used = 0;
}

void EndScratchCount() {
  ThreadScratch& s = LocalScratch();
  s.last_call_bytes = s.call_bytes;
  s.planned = nullptr;
  const int64_t bytes = s.call_bytes;
  if (bytes == 0 || s.probing) return;
  if (s.outside_bytes > 0) NoteCpuKernelScratch(s.outside_bytes);
  std::atomic<int64_t>& peak = ScratchPeak();
  int64_t seen = peak.load();
  while (bytes > seen && !peak.compare_exchange_weak(seen, bytes)) {
  }
}

namespace {
constexpr int64_t kConvertGrain = 1 << 14;

template <typename Fn>
void ParallelElements(int64_t n, Fn fn) {
  cpu::ParallelRanges(n, kConvertGrain, [&](int64_t first, int64_t end) {
    for (int64_t i = first; i < end; ++i) fn(i);
  });
}
}  // namespace

void ToFloat(const TensorView& src, float* dst) {
  const int64_t n = src.num_elements();
  switch (src.dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src.data, n * sizeof(float));
      break;
    case DType::kFloat16: {
      const uint16_t* s = src.as<uint16_t>();
      ParallelElements(n, [&](int64_t i) { dst[i] = HalfToFloat(s[i]); });
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* s = src.as<uint16_t>();
      ParallelElements(n, [&](int64_t i) { dst[i] = Bf16ToFloat(s[i]); });
      break;
    }
    default:
      PEBBLE_CHECK(false, "ToFloat: not a floating-point tensor");
  }
}

void FromFloat(const float* src, const TensorView& dst) {
  const int64_t n = dst.num_elements();
  switch (dst.dtype) {
    case DType::kFloat32:
      std::memcpy(dst.data, src, n * sizeof(float));
      break;
    case DType::kFloat16: {
      uint16_t* d = dst.as<uint16_t>();
      ParallelElements(n, [&](int64_t i) { d[i] = FloatToHalf(src[i]); });
      break;
    }
    case DType::kBFloat16: {
      uint16_t* d = dst.as<uint16_t>();
      ParallelElements(n, [&](int64_t i) { d[i] = FloatToBf16(src[i]); });
      break;
    }
    default:
      PEBBLE_CHECK(false, "FromFloat: not a floating-point tensor");
  }
}

namespace {

// Rows of a block in ColumnSums; elements of a block in the channel path.
constexpr int64_t kRowBlock = 256;
constexpr int64_t kChannelBlock = 1 << 15;

// x (rows, cols) row-major: out[c] = sum over rows.
void ColumnSums(const float* x, int64_t rows, int64_t cols, float* out) {
  const int64_t blocks = std::max<int64_t>(1, (rows + kRowBlock - 1) / kRowBlock);
  std::vector<double> partial(blocks * cols, 0.0);
  cpu::ParallelRanges(blocks, 1, [&](int64_t first_block, int64_t end_block) {
    for (int64_t b = first_block; b < end_block; ++b) {
      double* acc = partial.data() + b * cols;
      const int64_t end = std::min(rows, (b + 1) * kRowBlock);
      for (int64_t i = b * kRowBlock; i < end; ++i) {
        const float* row = x + i * cols;
        for (int64_t c = 0; c < cols; ++c) {
          acc[c] += static_cast<double>(row[c]);
        }
      }
    }
  });
  cpu::ParallelRanges(cols, 1024, [&](int64_t first_col, int64_t end_col) {
    for (int64_t c = first_col; c < end_col; ++c) {
      double s = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        s += partial[b * cols + c];
      }
      out[c] = static_cast<float>(s);
    }
  });
}

}  // namespace

void ChannelSums(const float* x, int64_t outer, int64_t channels,
                 int64_t inner, float* out) {
  if (Probing()) return;  // a workspace probe discards the results
  if (inner == 1) {
    ColumnSums(x, outer, channels, out);
    return;
  }
  const int64_t total = outer * inner;  // elements per channel
  const int64_t blocks =
      std::max<int64_t>(1, (total + kChannelBlock - 1) / kChannelBlock);
  std::vector<double> partial(channels * blocks, 0.0);
  // Chunks of about 16K elements (a small feature map makes tiny tasks);
  // the partial sums are per block, so grouping does not change them.
  const int64_t grain =
      cpu::GrainFor(std::min(total, kChannelBlock), int64_t{1} << 14);
  cpu::ParallelRanges(
      channels * blocks, grain, [&](int64_t first_task, int64_t end_task) {
        for (int64_t task = first_task; task < end_task; ++task) {
          const int64_t c = task / blocks;
          const int64_t b = task % blocks;
          const int64_t end = std::min(total, (b + 1) * kChannelBlock);
          double acc = 0;
          for (int64_t t = b * kChannelBlock; t < end;) {
            const int64_t i = t / inner;
            const int64_t j = t % inner;
            const int64_t len = std::min(inner - j, end - t);
            acc += SumRun(x + (i * channels + c) * inner + j, len);
            t += len;
          }
          partial[task] = acc;
        }
      });
  for (int64_t c = 0; c < channels; ++c) {
    double s = 0;
    for (int64_t b = 0; b < blocks; ++b) s += partial[c * blocks + b];
    out[c] = static_cast<float>(s);
  }
}

}  // namespace dnnl_internal

int64_t DnnlScratchPeakBytes() {
  return dnnl_internal::ScratchPeak().load();
}

absl::StatusOr<int64_t> DnnlProbeScratchBytes(KernelFn kernel, const Graph& graph, NodeId node) {
  dnnl_internal::ThreadScratch& s = dnnl_internal::LocalScratch();
  // Operands and scratch in mappings of the probe's own, unmapped at its end.
  s.probing = true;
  s.probe_buffers.clear();
  struct EndProbe {
    dnnl_internal::ThreadScratch& s;
    ~EndProbe() {
      s.probing = false;
      s.probe_buffers.clear();
    }
  } end{s};
  KernelContext ctx;
  ctx.graph = &graph;
  ctx.node = node;
  NodeId mapping = node;  // (the operand being mapped, for the error)
  auto zeroed = [&](NodeId v) {
    mapping = v;
    TensorView t{nullptr, *graph.shape(v), *graph.dtype(v)};
    t.data = s.probe_buffers.emplace_back(std::max<int64_t>(t.bytes(), 1)).data;
    return t;
  };
  try {
    for (NodeId u : graph.inputs(node)) ctx.inputs.push_back(zeroed(u));
    ctx.output = zeroed(node);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of host memory: cannot map ", mapping == node ? "its output" : "its operand '",
        mapping == node ? "" : graph.id(mapping), mapping == node ? "" : "'", " of ",
        FormatBytes(graph.bytes(mapping)), " (", graph.bytes(mapping),
        " bytes) to probe the kernel's workspace"));
  }
  RETURN_IF_ERROR(kernel(ctx));
  return s.last_call_bytes;
}

}  // namespace pebble
