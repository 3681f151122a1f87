// Batch and layer normalisation, training mode. Each is two nodes: a small
// statistics node (mean and inverse standard deviation, fp32, as cuDNN's
// resultSaveMean / resultSaveInvVariance and PyTorch's native_layer_norm
// mean / rstd) read from x, and the normalisation itself. The backward reads
// x, the statistics, the weight and the incoming gradient; the statistics
// get no gradient node of their own (their gradient is folded into the data
// gradient's formula).
//
// Batch-norm weight, bias and statistics are fp32 whatever x's dtype, as
// cuDNN requires for half inputs (cudnnBatchNormalizationForwardTraining:
// bnScaleBiasMeanVarDesc is float for HALF x) and apex's
// keep_batchnorm_fp32; layer-norm weight and bias take x's dtype.
#include <functional>
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::ops_internal {
namespace {

// The normalised extent: batch norm normalises over every dim but the
// channel (dim 1), layer norm over the last dim.
enum class Norm { kBatch, kLayer };

absl::Status CheckEps(const Json& attrs) {
  ASSIGN_OR_RETURN(double eps, DoubleAttr(attrs, "eps", 1e-5));
  if (eps < 0) return Invalid("attr 'eps' must be >= 0");
  return DoubleAttr(attrs, "momentum", 0.1).status();
}

// Shape of the statistics of x: (2, C) for batch norm, (2, x[:-1]...) for
// layer norm. Row 0 is the mean, row 1 the inverse standard deviation.
absl::StatusOr<Shape> StatsShape(Norm norm, const TensorType& x) {
  if (norm == Norm::kBatch) {
    RETURN_IF_ERROR(ExpectRankAtLeast(x, 2, "input 0 (x (N, C, ...))"));
    return Shape{2, x.shape[1]};
  }
  RETURN_IF_ERROR(ExpectRankAtLeast(x, 1, "input 0 (x)"));
  Shape s = {2};
  s.insert(s.end(), x.shape.begin(), x.shape.end() - 1);
  return s;
}

// Length of the weight and bias: C or the last dim.
int64_t Features(Norm norm, const TensorType& x) {
  return norm == Norm::kBatch ? x.shape[1] : x.shape.back();
}

absl::StatusOr<TensorType> InferStats(Norm norm, Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(CheckEps(attrs));
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  ASSIGN_OR_RETURN(Shape stats, StatsShape(norm, in[0]));
  return TensorType{stats, DType::kFloat32};
}

// Checks stats (input `i`) and, when present, weight and bias.
absl::Status CheckNormOperands(Norm norm, Inputs in, int stats_index,
                               int weight_index, int bias_index) {
  const TensorType& x = in[stats_index - 1];
  ASSIGN_OR_RETURN(Shape stats, StatsShape(norm, x));
  RETURN_IF_ERROR(ExpectShape(in[stats_index], stats, "stats"));
  RETURN_IF_ERROR(ExpectDType(in[stats_index], DType::kFloat32, "stats"));
  const int64_t c = Features(norm, x);
  const DType param_dtype = norm == Norm::kBatch ? DType::kFloat32 : x.dtype;
  for (int i : {weight_index, bias_index}) {
    if (i < 0 || i >= static_cast<int>(in.size())) continue;
    const char* what = i == weight_index ? "weight" : "bias";
    RETURN_IF_ERROR(ExpectShape(in[i], {c}, what));
    RETURN_IF_ERROR(ExpectDType(in[i], param_dtype, what));
  }
  return absl::OkStatus();
}

// batchnorm / layernorm (x, stats[, weight, bias]).
absl::StatusOr<TensorType> InferNorm(Norm norm, Inputs in, const Json& attrs) {
  RETURN_IF_ERROR(CheckEps(attrs));
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (x)"));
  if (in.size() == 3) {
    return Invalid("takes (x, stats) or (x, stats, weight, bias), not 3 "
                   "inputs");
  }
  RETURN_IF_ERROR(CheckNormOperands(norm, in, 1, 2, 3));
  return in[0];
}

// {batch,layer}norm_backward (grad, x, stats[, weight]) -> dx.
absl::StatusOr<TensorType> InferNormBackward(Norm norm, Inputs in,
                                             const Json& attrs) {
  RETURN_IF_ERROR(CheckEps(attrs));
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectSameShape(in[0], "grad", in[1], "x"));
  RETURN_IF_ERROR(CheckNormOperands(norm, in, 2, 3, -1));
  return TensorType{in[1].shape, in[0].dtype};
}

// {batch,layer}norm_backward_weight (grad, x, stats) -> (C): sum(grad * xhat).
absl::StatusOr<TensorType> InferNormBackwardWeight(Norm norm, Inputs in,
                                                   const Json& attrs) {
  RETURN_IF_ERROR(CheckEps(attrs));
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  RETURN_IF_ERROR(ExpectSameShape(in[0], "grad", in[1], "x"));
  RETURN_IF_ERROR(CheckNormOperands(norm, in, 2, -1, -1));
  const DType dtype = norm == Norm::kBatch ? DType::kFloat32 : in[0].dtype;
  return TensorType{{Features(norm, in[1])}, dtype};
}

// {batch,layer}norm_backward_bias (grad) -> (C): sum(grad).
absl::StatusOr<TensorType> InferNormBackwardBias(Norm norm, Inputs in,
                                                 const Json&) {
  RETURN_IF_ERROR(ExpectFloat(in[0], "input 0 (grad)"));
  RETURN_IF_ERROR(StatsShape(norm, in[0]).status());
  const DType dtype = norm == Norm::kBatch ? DType::kFloat32 : in[0].dtype;
  return TensorType{{Features(norm, in[0])}, dtype};
}

// `per` FLOPs per element of input 0.
std::function<double(Inputs, const TensorType&, const Json&)> PerInput(
    double per) {
  return [per](Inputs in, const TensorType&, const Json&) {
    return per * Elements(in[0]);
  };
}

std::function<absl::Status(BackwardContext&)> NormBackward(std::string base) {
  return [base](BackwardContext& ctx) -> absl::Status {
    const Value g = ctx.grad_output();
    const Value x = ctx.input(0);
    const Value stats = ctx.input(1);
    Json eps = Json::object();
    if (ctx.attrs().contains("eps")) eps["eps"] = ctx.attrs()["eps"];
    const bool affine = ctx.num_inputs() == 4;
    if (ctx.needs_grad(0)) {
      std::vector<Value> reads = {g, x, stats};
      if (affine) reads.push_back(ctx.input(2));
      ctx.AccumulateGrad(0, ctx.Emit(base + "_backward", reads, eps));
    }
    if (affine && ctx.needs_grad(2)) {
      ctx.AccumulateGrad(
          2, ctx.Emit(base + "_backward_weight", {g, x, stats}, eps));
    }
    if (affine && ctx.needs_grad(3)) {
      ctx.AccumulateGrad(3, ctx.Emit(base + "_backward_bias", {g}));
    }
    return absl::OkStatus();
  };
}

}  // namespace

void RegisterNormOps(std::vector<OpDef>& t) {
  for (Norm norm : {Norm::kBatch, Norm::kLayer}) {
    const std::string base = norm == Norm::kBatch ? "batchnorm" : "layernorm";
    // Sum and sum of squares: 3 per element.
    t.push_back({.name = base + "_stats", .min_inputs = 1, .max_inputs = 1,
                 .infer = [norm](Inputs in, const Json& a) {
                   return InferStats(norm, in, a);
                 },
                 .flops = PerInput(3)});
    // (x - mean) * inv_std * weight + bias.
    t.push_back({.name = base, .min_inputs = 2, .max_inputs = 4,
                 .infer = [norm](Inputs in, const Json& a) {
                   return InferNorm(norm, in, a);
                 },
                 .flops = PerInput(4),
                 .backward = NormBackward(base)});
    // Two reductions (sum g, sum g xhat: 3) and the formula (5).
    t.push_back({.name = base + "_backward", .min_inputs = 3, .max_inputs = 4,
                 .infer = [norm](Inputs in, const Json& a) {
                   return InferNormBackward(norm, in, a);
                 },
                 .flops = PerInput(8)});
    t.push_back({.name = base + "_backward_weight", .min_inputs = 3,
                 .max_inputs = 3,
                 .infer = [norm](Inputs in, const Json& a) {
                   return InferNormBackwardWeight(norm, in, a);
                 },
                 .flops = PerInput(4)});
    t.push_back({.name = base + "_backward_bias", .min_inputs = 1,
                 .max_inputs = 1,
                 .infer = [norm](Inputs in, const Json& a) {
                   return InferNormBackwardBias(norm, in, a);
                 },
                 .flops = PerInput(1)});
  }
}

}  // namespace pebble::ops_internal
