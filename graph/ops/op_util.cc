#include "graph/ops/op_util.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"

namespace pebble::ops_internal {
namespace {

// The attribute `name`, or nullptr when absent (or attrs is not an object).
const Json* Find(const Json& attrs, absl::string_view name) {
  if (!attrs.is_object()) return nullptr;
  auto it = attrs.find(std::string(name));
  return it == attrs.end() ? nullptr : &*it;
}

absl::Status BadAttr(absl::string_view name, absl::string_view expected,
                     const Json& got) {
  // replace: an invalid UTF-8 string becomes U+FFFD instead of throwing.
  std::string text = got.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 60) + "...";
  return Invalid("attr '", name, "' must be ", expected, ", got ", text);
}

}  // namespace

absl::StatusOr<int64_t> IntAttr(const Json& attrs, absl::string_view name,
                                int64_t default_value) {
  const Json* v = Find(attrs, name);
  if (v == nullptr) return default_value;
  if (v->is_number_integer()) return v->get<int64_t>();
  return BadAttr(name, "an integer", *v);
}

absl::StatusOr<int64_t> RequiredIntAttr(const Json& attrs,
                                        absl::string_view name) {
  if (Find(attrs, name) == nullptr) {
    return Invalid("missing attr '", name, "'");
  }
  return IntAttr(attrs, name, 0);
}

absl::StatusOr<bool> BoolAttr(const Json& attrs, absl::string_view name,
                              bool default_value) {
  const Json* v = Find(attrs, name);
  if (v == nullptr) return default_value;
  if (v->is_boolean()) return v->get<bool>();
  return BadAttr(name, "a boolean", *v);
}

absl::StatusOr<double> DoubleAttr(const Json& attrs, absl::string_view name,
                                  double default_value) {
  const Json* v = Find(attrs, name);
  if (v == nullptr) return default_value;
  if (v->is_number()) {
    const double d = v->get<double>();
    if (std::isfinite(d)) return d;
  }
  return BadAttr(name, "a finite number", *v);
}

absl::StatusOr<double> ExtendedDoubleAttr(const Json& attrs, absl::string_view name,
                                          double default_value) {
  const Json* v = Find(attrs, name);
  if (v != nullptr && v->is_string()) {
    if (*v == "inf") return HUGE_VAL;
    if (*v == "-inf") return -HUGE_VAL;
    return BadAttr(name, "a finite number, \"inf\" or \"-inf\"", *v);
  }
  return DoubleAttr(attrs, name, default_value);
}

absl::StatusOr<std::string> ConstantData(const Json& attrs, const TensorType& type) {
  const Json* v = Find(attrs, "data");
  if (v == nullptr) return Invalid("attr 'data' is required");
  if (!v->is_string()) return BadAttr("data", "a base64 string", *v);
  const std::optional<int64_t> bytes = TensorBytes(type.shape, type.dtype);
  if (!bytes.has_value() || *bytes > kMaxConstantBytes) {
    return Invalid("a constant holds at most ", kMaxConstantBytes, " bytes");
  }
  const std::string& text = v->get_ref<const std::string&>();
  if (static_cast<int64_t>(text.size()) > (kMaxConstantBytes / 3 + 1) * 4) {
    return Invalid("attr 'data' is longer than the most a constant holds (", kMaxConstantBytes,
                   " bytes)");
  }
  std::string data;
  if (!absl::Base64Unescape(text, &data)) return Invalid("attr 'data' is not base64");
  if (static_cast<int64_t>(data.size()) != *bytes) {
    return Invalid("attr 'data' holds ", data.size(), " bytes; a ", DTypeName(type.dtype), " ",
                   ShapeToString(type.shape), " tensor has ", *bytes);
  }
  return data;
}

absl::StatusOr<RandomArgs> ParseRandom(const Json& attrs) {
  RandomArgs r;
  ASSIGN_OR_RETURN(const std::string distribution, StringAttr(attrs, "distribution", "normal"));
  if (distribution != "normal" && distribution != "uniform") {
    return Invalid("attr 'distribution' must be normal or uniform, got \"", distribution, "\"");
  }
  r.normal = distribution == "normal";
  const char* a_name = r.normal ? "mean" : "low";
  const char* b_name = r.normal ? "std" : "high";
  for (const char* other : {"mean", "std", "low", "high"}) {
    if (other != a_name && other != b_name && Find(attrs, other) != nullptr) {
      return Invalid("attr '", other, "' is not one of a ", distribution, " distribution's");
    }
  }
  ASSIGN_OR_RETURN(r.a, DoubleAttr(attrs, a_name, 0.0));
  ASSIGN_OR_RETURN(r.b, DoubleAttr(attrs, b_name, 1.0));
  if (!std::isfinite(r.a) || !std::isfinite(r.b)) {
    return Invalid("attrs '", a_name, "' and '", b_name, "' must be finite");
  }
  if (r.normal && r.b < 0) return Invalid("attr 'std' (", r.b, ") is below 0");
  if (!r.normal && r.b < r.a) return Invalid("attr 'high' (", r.b, ") is below 'low' (", r.a, ")");
  ASSIGN_OR_RETURN(const int64_t seed, IntAttr(attrs, "seed", 0));
  r.seed = static_cast<uint64_t>(seed);
  return r;
}

absl::StatusOr<int> CompareOpAttr(const Json& attrs) {
  ASSIGN_OR_RETURN(const std::string op, StringAttr(attrs, "op", ""));
  for (int i = 0; i < static_cast<int>(std::size(kCompareOps)); ++i) {
    if (op == kCompareOps[i]) return i;
  }
  return Invalid("attr 'op' must be one of eq, ne, lt, le, gt, ge, and, or; got \"", op, "\"");
}

absl::StatusOr<std::string> StringAttr(const Json& attrs,
                                       absl::string_view name,
                                       absl::string_view default_value) {
  const Json* v = Find(attrs, name);
  if (v == nullptr) return std::string(default_value);
  if (v->is_string()) return v->get<std::string>();
  return BadAttr(name, "a string", *v);
}

absl::StatusOr<std::vector<int64_t>> IntListAttr(const Json& attrs,
                                                 absl::string_view name) {
  const Json* v = Find(attrs, name);
  if (v == nullptr) return Invalid("missing attr '", name, "'");
  if (!v->is_array()) return BadAttr(name, "a list of integers", *v);
  std::vector<int64_t> out;
  for (const Json& e : *v) {
    if (!e.is_number_integer()) return BadAttr(name, "a list of integers", *v);
    out.push_back(e.get<int64_t>());
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> SpatialAttr(const Json& attrs,
                                                 absl::string_view name,
                                                 int dims, int64_t default_value,
                                                 bool required) {
  const Json* v = Find(attrs, name);
  if (v == nullptr) {
    if (required) return Invalid("missing attr '", name, "'");
    return std::vector<int64_t>(dims, default_value);
  }
  if (v->is_number_integer()) {
    return std::vector<int64_t>(dims, v->get<int64_t>());
  }
  const std::string expected =
      absl::StrCat("an integer or a list of ", dims, " integers");
  if (!v->is_array() || static_cast<int>(v->size()) != dims) {
    return BadAttr(name, expected, *v);
  }
  std::vector<int64_t> out;
  for (const Json& e : *v) {
    if (!e.is_number_integer()) return BadAttr(name, expected, *v);
    out.push_back(e.get<int64_t>());
  }
  return out;
}

absl::StatusOr<Shape> ShapeAttr(const Json& attrs, absl::string_view name) {
  std::vector<int64_t> dims;
  {
    absl::StatusOr<std::vector<int64_t>> list = IntListAttr(attrs, name);
    if (!list.ok()) return list.status();
    dims = *std::move(list);
  }
  for (int64_t d : dims) {
    if (d < 0) {
      return Invalid("attr '", name, "' has a negative dimension (",
                     absl::StrJoin(dims, ","), ")");
    }
  }
  return dims;
}

absl::StatusOr<DType> DTypeAttr(const Json& attrs, absl::string_view name,
                                DType default_value) {
  const Json* v = Find(attrs, name);
  if (v == nullptr) return default_value;
  if (!v->is_string()) return BadAttr(name, "a dtype name", *v);
  absl::StatusOr<DType> dtype = ParseDType(v->get<std::string>());
  if (!dtype.ok()) {
    return Invalid("attr '", name, "': ", dtype.status().message());
  }
  return *dtype;
}

bool IsFloat(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

absl::Status ExpectFloat(const TensorType& t, absl::string_view what) {
  if (IsFloat(t.dtype)) return absl::OkStatus();
  return Invalid(what, " must be floating-point (fp32, fp16, bf16), got ",
                 DTypeName(t.dtype));
}

absl::Status ExpectDType(const TensorType& t, DType dtype,
                         absl::string_view what) {
  if (t.dtype == dtype) return absl::OkStatus();
  return Invalid(what, " must be ", DTypeName(dtype), ", got ",
                 DTypeName(t.dtype));
}

absl::Status ExpectRank(const TensorType& t, int rank, absl::string_view what) {
  if (static_cast<int>(t.shape.size()) == rank) return absl::OkStatus();
  return Invalid(what, " must have rank ", rank, ", got shape ",
                 ShapeToString(t.shape));
}

absl::Status ExpectRankAtLeast(const TensorType& t, int rank,
                               absl::string_view what) {
  if (static_cast<int>(t.shape.size()) >= rank) return absl::OkStatus();
  return Invalid(what, " must have rank >= ", rank, ", got shape ",
                 ShapeToString(t.shape));
}

absl::Status ExpectSameShape(const TensorType& a, absl::string_view what_a,
                             const TensorType& b, absl::string_view what_b) {
  if (a.shape == b.shape) return absl::OkStatus();
  return Invalid(what_a, " ", ShapeToString(a.shape), " and ", what_b, " ",
                 ShapeToString(b.shape), " must have the same shape");
}

absl::Status ExpectSameDType(const TensorType& a, absl::string_view what_a,
                             const TensorType& b, absl::string_view what_b) {
  if (a.dtype == b.dtype) return absl::OkStatus();
  return Invalid(what_a, " (", DTypeName(a.dtype), ") and ", what_b, " (",
                 DTypeName(b.dtype), ") must have the same dtype");
}

absl::Status ExpectShape(const TensorType& t, const Shape& shape,
                         absl::string_view what) {
  if (t.shape == shape) return absl::OkStatus();
  return Invalid(what, " must have shape ", ShapeToString(shape), ", got ",
                 ShapeToString(t.shape));
}

absl::StatusOr<DType> FirstFloatDType(Inputs inputs) {
  for (const TensorType& t : inputs) {
    if (IsFloat(t.dtype)) return t.dtype;
  }
  return Invalid("no floating-point input");
}

absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank,
                                  absl::string_view name) {
  if (axis < -rank || axis >= rank) {
    return Invalid("attr '", name, "' = ", axis, " is out of range for rank ",
                   rank);
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

absl::StatusOr<int64_t> WindowOutput(int64_t in, int64_t kernel,
                                     int64_t stride, int64_t padding,
                                     int dim, bool ceil_mode) {
  if (kernel < 1) return Invalid("kernel size ", kernel, " must be >= 1");
  if (stride < 1) return Invalid("stride ", stride, " must be >= 1");
  if (padding < 0) return Invalid("padding ", padding, " must be >= 0");
  // Beyond any tensor's extent; keeps in + 2 padding from overflowing (a
  // fuzzed graph file reached signed overflow here).
  if (kernel > kMaxWindowExtent || stride > kMaxWindowExtent ||
      padding > kMaxWindowExtent) {
    return Invalid("spatial dim ", dim, ": kernel ", kernel, ", stride ", stride,
                   " or padding ", padding, " exceeds ", kMaxWindowExtent);
  }
  if (in + 2 * padding < kernel) {
    return Invalid("spatial dim ", dim, ": window ", kernel,
                   " is larger than the padded input ", in, " + 2*", padding);
  }
  const int64_t span = in + 2 * padding - kernel;
  if (!ceil_mode) return span / stride + 1;
  int64_t out = (span + stride - 1) / stride + 1;
  if ((out - 1) * stride >= in + padding) --out;
  return out;
}

absl::StatusOr<ConvGroupsDilation> ConvGroupsDilationAttrs(const Json& attrs,
                                                           int dims) {
  ConvGroupsDilation g;
  ASSIGN_OR_RETURN(g.groups, IntAttr(attrs, "groups", 1));
  if (g.groups < 1 || g.groups > kMaxWindowExtent) {
    return Invalid("attr 'groups' = ", g.groups, " must be in [1, ",
                   kMaxWindowExtent, "]");
  }
  ASSIGN_OR_RETURN(g.dilation, SpatialAttr(attrs, "dilation", dims, 1));
  for (int i = 0; i < dims; ++i) {
    if (g.dilation[i] < 1 || g.dilation[i] > kMaxWindowExtent) {
      return Invalid("attr 'dilation' dim ", i, " = ", g.dilation[i],
                     " must be in [1, ", kMaxWindowExtent, "]");
    }
  }
  return g;
}

absl::StatusOr<int64_t> DilatedKernel(int64_t kernel, int64_t dilation,
                                      int dim) {
  if (kernel < 1) return Invalid("kernel size ", kernel, " must be >= 1");
  if (dilation < 1) return Invalid("dilation ", dilation, " must be >= 1");
  if (dilation > 1 && kernel - 1 > (kMaxWindowExtent - 1) / dilation) {
    return Invalid("spatial dim ", dim, ": kernel ", kernel, " at dilation ",
                   dilation, " spans more than ", kMaxWindowExtent);
  }
  return dilation * (kernel - 1) + 1;
}

absl::StatusOr<Window> PoolWindow(const Json& attrs, int dims) {
  Window w;
  ASSIGN_OR_RETURN(w.kernel, SpatialAttr(attrs, "kernel", dims, 0, /*required=*/true));
  const bool has_stride =
      attrs.is_object() && attrs.contains("stride") && !attrs["stride"].is_null();
  if (has_stride) {
    ASSIGN_OR_RETURN(w.stride, SpatialAttr(attrs, "stride", dims, 1));
  } else {
    w.stride = w.kernel;
  }
  ASSIGN_OR_RETURN(w.padding, SpatialAttr(attrs, "padding", dims, 0));
  ASSIGN_OR_RETURN(w.ceil_mode, BoolAttr(attrs, "ceil_mode", false));
  for (int i = 0; i < dims; ++i) {
    // PyTorch: "pad should be at most half of effective kernel size"
    // (divided, not doubled: a huge padding must not overflow).
    if (w.padding[i] > w.kernel[i] / 2) {
      return Invalid("padding ", w.padding[i], " is more than half the kernel ", w.kernel[i]);
    }
  }
  return w;
}

absl::StatusOr<Window> ConvWindow(const Json& attrs, std::vector<int64_t> kernel, int dims) {
  Window w;
  w.kernel = std::move(kernel);
  ASSIGN_OR_RETURN(w.stride, SpatialAttr(attrs, "stride", dims, 1));
  ASSIGN_OR_RETURN(w.padding, SpatialAttr(attrs, "padding", dims, 0));
  ASSIGN_OR_RETURN(ConvGroupsDilation gd, ConvGroupsDilationAttrs(attrs, dims));
  w.dilation = std::move(gd.dilation);
  w.groups = gd.groups;
  return w;
}

absl::StatusOr<Shape> WindowShape(const Shape& x, int64_t out_channels, const Window& w) {
  const int d = static_cast<int>(w.kernel.size());
  if (static_cast<int>(x.size()) != d + 2) {
    return Invalid("shape ", ShapeToString(x), " does not have ", d, " spatial dims");
  }
  Shape out = {x[0], out_channels};
  for (int i = 0; i < d; ++i) {
    int64_t extent = w.kernel[i];
    if (!w.dilation.empty()) {
      ASSIGN_OR_RETURN(extent, DilatedKernel(w.kernel[i], w.dilation[i], i));
    }
    ASSIGN_OR_RETURN(int64_t o,
                     WindowOutput(x[2 + i], extent, w.stride[i], w.padding[i], i, w.ceil_mode));
    out.push_back(o);
  }
  return out;
}

absl::Status CheckConvGroups(int64_t in_channels, const Shape& weight,
                             int64_t groups, absl::string_view what) {
  if (in_channels % groups != 0 || weight[0] % groups != 0) {
    return Invalid(what, " has ", in_channels, " channels and the weight ",
                   ShapeToString(weight), " ", weight[0],
                   " outputs: both must be divisible by groups = ", groups);
  }
  if (in_channels / groups != weight[1]) {
    return Invalid(what, " has ", in_channels, " channels but the weight ",
                   ShapeToString(weight), " expects ", weight[1] * groups,
                   groups > 1 ? absl::StrCat(" (", weight[1], " per group x ",
                                             groups, " groups)")
                              : std::string());
  }
  return absl::OkStatus();
}

std::optional<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t x = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
    const int64_t y = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[k] = x == 1 ? y : x;
  }
  return out;
}

std::optional<BroadcastBlock> BlockBroadcast(const Shape& big,
                                             const Shape& small) {
  if (small.size() > big.size()) return std::nullopt;
  const size_t pad = big.size() - small.size();
  // The dims that `small` keeps (equal and not 1) and those it repeats.
  int first_kept = -1, last_kept = -1;
  for (size_t d = 0; d < big.size(); ++d) {
    const int64_t s = d < pad ? 1 : small[d - pad];
    if (s == big[d]) {
      if (s == 1) continue;  // neither kept nor repeated
      if (first_kept < 0) first_kept = static_cast<int>(d);
      last_kept = static_cast<int>(d);
    } else if (s != 1) {
      return std::nullopt;
    }
  }
  BroadcastBlock b;
  if (first_kept < 0) return b;  // one element, repeated everywhere
  for (int d = first_kept; d <= last_kept; ++d) {
    const int64_t s = static_cast<size_t>(d) < pad ? 1 : small[d - pad];
    if (s != big[d]) return std::nullopt;  // a repeated dim inside the block
  }
  const int rank = static_cast<int>(big.size());
  b.block = Product(big, first_kept, last_kept + 1);
  b.inner = Product(big, last_kept + 1, rank);
  return b;
}

bool IsPermutation(const std::vector<int64_t>& perm, size_t rank) {
  if (perm.size() != rank) return false;
  std::vector<bool> seen(rank, false);
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[p]) return false;
    seen[p] = true;
  }
  return true;
}

bool PermutesInto(const Shape& x, const std::vector<int64_t>& perm,
                  const Shape& out) {
  if (out.size() != x.size() || static_cast<int>(x.size()) > kMaxTransposeRank ||
      !IsPermutation(perm, x.size())) {
    return false;
  }
  for (size_t d = 0; d < perm.size(); ++d) {
    if (out[d] != x[perm[d]]) return false;
  }
  return true;
}

absl::StatusOr<std::vector<bool>> FlipDims(const Json& attrs, int rank) {
  if (rank > kMaxTransposeRank) {
    return Invalid("flip of rank ", rank, " (at most ", kMaxTransposeRank, ")");
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> dims, IntListAttr(attrs, "dims"));
  std::vector<bool> flipped(rank, false);
  for (int64_t d : dims) {
    ASSIGN_OR_RETURN(const int axis, NormalizeAxis(d, rank, "attr 'dims'"));
    if (flipped[axis]) return Invalid("attr 'dims' names dim ", axis, " twice");
    flipped[axis] = true;
  }
  return flipped;
}

int64_t Product(const Shape& shape, int begin, int end) {
  int64_t p = 1;
  for (int i = begin; i < end; ++i) p *= shape[i];
  return p;
}

double Elements(const Shape& shape) {
  // In double: a FLOP formula may see a shape that inference gave but whose
  // byte count the graph then refuses (fuzzed: embedding_backward with a
  // num_embeddings of 8e18), and must not overflow on it.
  double n = 1;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

double Elements(const TensorType& t) { return Elements(t.shape); }

double CopyFlops(Inputs, const TensorType& out, const Json&) {
  return Elements(out);
}

std::function<double(Inputs, const TensorType&, const Json&)> PerElement(double per_element) {
  return [per_element](Inputs, const TensorType& out, const Json&) {
    return per_element * Elements(out);
  };
}

namespace {

// upsample's attr `scale_factor`: one number > 0 per spatial dim, or one
// for all.
absl::StatusOr<std::vector<double>> ScaleFactors(const Json& attrs, int dims) {
  const Json* v = Find(attrs, "scale_factor");
  std::vector<double> out;
  if (v == nullptr) return std::vector<double>(dims, 0.0);
  const std::string expected =
      absl::StrCat("a number in [2^-40, 2^40] or a list of ", dims, " of them");
  if (v->is_number()) {
    out.assign(dims, v->get<double>());
  } else if (v->is_array() && static_cast<int>(v->size()) == dims) {
    for (const Json& e : *v) {
      if (!e.is_number()) return BadAttr("scale_factor", expected, *v);
      out.push_back(e.get<double>());
    }
  } else {
    return BadAttr("scale_factor", expected, *v);
  }
  for (double f : out) {
    if (!(f >= 0x1p-40 && f <= 0x1p40)) return BadAttr("scale_factor", expected, *v);
  }
  return out;
}

}  // namespace

absl::StatusOr<Upsampling> ParseUpsampling(const Json& attrs, const Shape& x) {
  if (x.size() < 3) return Invalid("upsample needs an (N, C, ...) input, got ", ShapeToString(x));
  const int dims = static_cast<int>(x.size()) - 2;
  Upsampling u;
  const bool sized = Find(attrs, "size") != nullptr;
  if (sized == (Find(attrs, "scale") != nullptr)) {
    return Invalid("upsample takes attr 'scale' (whole factors) or attr 'size', one of them");
  }
  if (sized) {
    ASSIGN_OR_RETURN(u.out, SpatialAttr(attrs, "size", dims, 0, true));
    for (int64_t s : u.out) {
      if (s < 1 || s > kMaxWindowExtent) {
        return Invalid("attr 'size' must be in [1, ", kMaxWindowExtent, "], got ", s);
      }
    }
    ASSIGN_OR_RETURN(u.scale_factor, ScaleFactors(attrs, dims));
    // A scale factor sets the output's size in PyTorch (floor(in x
    // factor)); the size given may differ by one (ONNX computes it in
    // float32 from the factor rounded to float32).
    for (int i = 0; i < dims; ++i) {
      const double f = u.scale_factor[i];
      if (f == 0) continue;
      const double expected = std::floor(static_cast<double>(x[2 + i]) * f);
      if (std::abs(expected - static_cast<double>(u.out[i])) > 1) {
        return Invalid("attr 'scale_factor' ", f, " does not give attr 'size' ", u.out[i],
                       " from dim ", 2 + i, " of ", ShapeToString(x), " (floor(", x[2 + i],
                       " x ", f, ") is ", expected, ")");
      }
    }
  } else {
    if (Find(attrs, "scale_factor") != nullptr) {
      return Invalid("attr 'scale_factor' goes with attr 'size', not 'scale'");
    }
    ASSIGN_OR_RETURN(const std::vector<int64_t> scale, SpatialAttr(attrs, "scale", dims, 0, true));
    for (int i = 0; i < dims; ++i) {
      const int64_t s = scale[i];
      if (s < 1 || s > kMaxWindowExtent) {
        return Invalid("attr 'scale' must be in [1, ", kMaxWindowExtent, "], got ", s);
      }
      int64_t out = 0;
      if (__builtin_mul_overflow(x[2 + i], s, &out)) {
        return Invalid("attr 'scale' overflows dim ", 2 + i, " of ", ShapeToString(x));
      }
      u.out.push_back(out);
      u.scale_factor.push_back(static_cast<double>(s));
    }
  }
  for (int i = 0; i < dims; ++i) {
    if (x[2 + i] < 1) return Invalid("upsample of an empty dim ", 2 + i, " of ", ShapeToString(x));
  }
  ASSIGN_OR_RETURN(u.mode, StringAttr(attrs, "mode", "nearest"));
  ASSIGN_OR_RETURN(u.align_corners, BoolAttr(attrs, "align_corners", false));
  if (u.mode == "nearest") {
    // As torch.nn.functional.interpolate: only interpolating modes.
    if (u.align_corners) {
      return Invalid("align_corners is only valid with bilinear, bicubic or trilinear");
    }
  } else if (u.mode == "bilinear" || u.mode == "bicubic") {
    if (dims != 2) return Invalid("mode ", u.mode, " needs a 4-D input (N, C, H, W)");
  } else if (u.mode == "trilinear") {
    if (dims != 3) return Invalid("mode trilinear needs a 5-D input (N, C, D, H, W)");
  } else {
    return Invalid("attr 'mode' must be nearest, bilinear, bicubic or trilinear, got \"", u.mode,
                   "\"");
  }
  return u;
}

}  // namespace pebble::ops_internal
