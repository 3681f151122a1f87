// The optimizer's in-place updates (graph/optimizer.h): the output is input
// 0's memory (runtime/kernel.h), written element by element with
// runtime/optimizer_math.h.
#include "graph/ops/op_util.h"
#include "graph/status.h"
#include "runtime/cpu/native_util.h"
#include "runtime/optimizer_math.h"

namespace pebble::native {
namespace {

using optim::UpdateOp;

// The operands checked, and the output input 0's memory (runtime/kernel.h).
absl::Status CheckInPlaceOperands(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckOperands(ctx));
  if (ctx.output.data != ctx.inputs[0].data) {
    return Invalid(ctx, "an in-place update writes its input 0's memory");
  }
  return absl::OkStatus();
}

template <UpdateOp kOp>
absl::Status UpdateKernel(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckInPlaceOperands(ctx));
  ASSIGN_OR_RETURN(const ops_internal::OptimizerAttrs a,
                   ops_internal::ReadOptimizerAttrs(ctx.attrs()));
  optim::UpdateScalars s = optim::MakeUpdateScalars(a.lr, a.weight_decay, a.momentum, a.beta1,
                                                    a.beta2, a.eps, a.decoupled_weight_decay);
  if constexpr (kOp == UpdateOp::kAdamUpdate) {
    optim::AdamStep(s, {a.lr, a.beta1, a.beta2}, LoadAsFloat(ctx.inputs[3], 0));
  }
  const int64_t n = ctx.output.num_elements();
  return DispatchFloat(ctx.output.dtype, "the updated tensor", [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(static_cast<void*>(ctx.output.data));
    const T* b = static_cast<const T*>(static_cast<const void*>(ctx.inputs[1].data));
    const T* c = ctx.inputs.size() > 2
                     ? static_cast<const T*>(static_cast<const void*>(ctx.inputs[2].data))
                     : nullptr;
    ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float ci = c != nullptr ? ToFloat(c[i]) : 0.f;
        out[i] = FromFloat<T>(optim::Update(kOp, s, ToFloat(out[i]), ToFloat(b[i]), ci));
      }
    });
    return absl::OkStatus();
  });
}

// t <- t + 1, in place.
absl::Status OptimizerStep(const KernelContext& ctx) {
  RETURN_IF_ERROR(CheckInPlaceOperands(ctx));
  StoreFloat(ctx.output, 0, LoadAsFloat(ctx.inputs[0], 0) + 1.f);
  return absl::OkStatus();
}

}  // namespace

void RegisterNativeOptimizerKernels(KernelTable& table) {
  table.Register("sgd_momentum", UpdateKernel<UpdateOp::kSgdMomentum>);
  table.Register("sgd_update", UpdateKernel<UpdateOp::kSgdUpdate>);
  table.Register("adam_exp_avg", UpdateKernel<UpdateOp::kAdamExpAvg>);
  table.Register("adam_exp_avg_sq", UpdateKernel<UpdateOp::kAdamExpAvgSq>);
  table.Register("adam_update", UpdateKernel<UpdateOp::kAdamUpdate>);
  table.Register("optimizer_step", OptimizerStep);
}

}  // namespace pebble::native
