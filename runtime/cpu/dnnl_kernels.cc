// The oneDNN kernel family of the CPU backend: registration and the wrapper
// every kernel runs in (Note [oneDNN kernels] in runtime/cpu/dnnl_util.h).
// The kernels themselves: dnnl_conv.cc (convolutions, linear, matmul),
// dnnl_pool.cc (pooling), dnnl_eltwise.cc (activations, softmax),
// dnnl_norm.cc (batch norm).
#include <exception>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/dnnl_util.h"

namespace pebble {
namespace {

using dnnl_internal::BeginScratchCount;
using dnnl_internal::EndScratchCount;

bool IsHalf(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// Runs `kernel` on fp32 copies of the half-precision operands: each fp16 /
// bf16 input is widened into scratch, an fp16 / bf16 output is computed
// into fp32 scratch and rounded to nearest-even on store.
absl::Status RunWidened(const KernelContext& ctx, KernelFn kernel) {
  KernelContext wide = ctx;
  int slot = dnnl_internal::kConvert0;
  for (TensorView& in : wide.inputs) {
    if (!IsHalf(in.dtype)) continue;
    if (slot == dnnl_internal::kConvertOut) {
      return absl::UnimplementedError(absl::StrCat(
          "op ", ctx.op(),
          ": too many fp16/bf16 inputs for the CPU backend"));
    }
    float* f = reinterpret_cast<float*>(dnnl_internal::Scratch(
        static_cast<dnnl_internal::ScratchSlot>(slot++),
        in.num_elements() * static_cast<int64_t>(sizeof(float))));
    if (!dnnl_internal::Probing()) dnnl_internal::ToFloat(in, f);
    in.data = reinterpret_cast<std::byte*>(f);
    in.dtype = DType::kFloat32;
  }
  const bool half_out = IsHalf(ctx.output.dtype);
  if (half_out) {
    wide.output.data = dnnl_internal::Scratch(
        dnnl_internal::kConvertOut,
        ctx.output.num_elements() * static_cast<int64_t>(sizeof(float)));
    wide.output.dtype = DType::kFloat32;
  }
  RETURN_IF_ERROR(kernel(wide));
  if (half_out && !dnnl_internal::Probing()) {
    dnnl_internal::FromFloat(wide.output.as<float>(), ctx.output);
  }
  return absl::OkStatus();
}

// Every kernel of the family runs through here: half precision, scratch
// accounting, and oneDNN's exceptions turned into a Status (nothing throws
// out of a kernel).
template <KernelFn kKernel>
absl::Status Run(const KernelContext& ctx) {
  if (ctx.graph == nullptr) {
    return absl::InvalidArgumentError("kernel context without a graph");
  }
  bool half = IsHalf(ctx.output.dtype);
  for (const TensorView& in : ctx.inputs) half = half || IsHalf(in.dtype);
  BeginScratchCount(ctx.workspace, ctx.workspace_bytes);
  absl::Status status;
  try {
    status = half ? RunWidened(ctx, kKernel) : kKernel(ctx);
  } catch (const dnnl::error& e) {
    const std::string message =
        absl::StrCat("op ", ctx.op(), ": oneDNN: ", e.what());
    status = e.status == dnnl_unimplemented
                 ? absl::UnimplementedError(message)
                 : absl::InternalError(message);
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("op ", ctx.op(), ": out of host memory for scratch"));
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("op ", ctx.op(), ": ", e.what()));
  }
  EndScratchCount();
  return status;
}

}  // namespace

void RegisterDnnlKernels(KernelTable& table) {
  using namespace dnnl_internal;  // NOLINT: the kernel names
  for (const char* conv : {"conv2d", "conv3d"}) {
    const std::string base = conv;
    table.Register(base, Run<ConvForward>);
    table.Register(base + "_backward_data", Run<ConvBackwardData>);
    table.Register(base + "_backward_weight", Run<ConvBackwardWeight>);
    table.Register(base + "_backward_bias", Run<ConvBackwardBias>);
  }
  table.Register("linear", Run<Linear>);
  table.Register("linear_backward_data", Run<LinearBackwardData>);
  table.Register("linear_backward_weight", Run<LinearBackwardWeight>);
  table.Register("linear_backward_bias", Run<LinearBackwardBias>);
  table.Register("matmul", Run<Matmul>);

  table.Register("maxpool", Run<MaxPool>);
  table.Register("maxpool_backward", Run<MaxPoolBackward>);
  table.Register("avgpool", Run<AvgPool>);
  table.Register("avgpool_backward", Run<AvgPoolBackward>);

  table.Register("tanh", Run<Tanh>);
  table.Register("sigmoid", Run<Sigmoid>);
  table.Register("gelu", Run<Gelu>);
  table.Register("tanh_backward", Run<TanhBackward>);
  table.Register("sigmoid_backward", Run<SigmoidBackward>);
  table.Register("gelu_backward", Run<GeluBackward>);
  table.Register("softmax", Run<Softmax>);
  table.Register("softmax_backward", Run<SoftmaxBackward>);
  table.Register("log_softmax", Run<LogSoftmax>);
  table.Register("log_softmax_backward", Run<LogSoftmaxBackward>);

  table.Register("batchnorm_stats", Run<BatchNormStats>);
  table.Register("batchnorm", Run<BatchNorm>);
  table.Register("batchnorm_backward", Run<BatchNormBackward>);
  table.Register("batchnorm_backward_weight", Run<BatchNormBackwardWeight>);
  table.Register("batchnorm_backward_bias", Run<BatchNormBackwardBias>);
}

}  // namespace pebble
