// The optimizer's updates (graph/optimizer.h, Note [Optimizer nodes]): each
// writes its first input's storage in place, element by element, and has
// that input's type. Not differentiated.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble::ops_internal {

// A learning rate of 0 is PyTorch's too (a warm-up's first steps): the
// update then moves no parameter but advances the state. So is a momentum
// of 1 or more (torch.optim.SGD refuses only a negative one), and an eps of
// 0 (an update of a zero second moment is then 0/0, NaN, as eager's); the
// betas stay in [0, 1), as torch.optim.Adam has them.
absl::Status CheckOptimizerValue(absl::string_view key, double value) {
  const bool positive = key == "max_grad_norm";
  const bool non_negative =
      key == "weight_decay" || key == "lr" || key == "momentum" || key == "eps";
  const bool ok = std::isfinite(value) && (positive       ? value > 0
                                           : non_negative ? value >= 0
                                                          : value >= 0 && value < 1);
  if (ok) return absl::OkStatus();
  return Invalid(key, "=", value, " is out of range (",
                 positive ? "above 0" : non_negative ? "0 or more" : "in [0, 1)", ")");
}

absl::StatusOr<OptimizerAttrs> ReadOptimizerAttrs(const Json& attrs) {
  OptimizerAttrs a;
  if (!attrs.is_object() || !attrs.contains("lr")) {
    return Invalid("an optimizer's update needs its learning rate (attrs.lr)");
  }
  struct Field {
    const char* key;
    double* value;
    double fallback;
  };
  for (const Field& f : {Field{"lr", &a.lr, 0.0}, Field{"weight_decay", &a.weight_decay, 0.0},
                         Field{"momentum", &a.momentum, 0.0}, Field{"beta1", &a.beta1, 0.9},
                         Field{"beta2", &a.beta2, 0.999}, Field{"eps", &a.eps, 1e-8}}) {
    ASSIGN_OR_RETURN(*f.value, DoubleAttr(attrs, f.key, f.fallback));
    RETURN_IF_ERROR(CheckOptimizerValue(f.key, *f.value));
  }
  ASSIGN_OR_RETURN(a.decoupled_weight_decay, BoolAttr(attrs, "decoupled_weight_decay", false));
  return a;
}

namespace {

// Every input but the step count has the written tensor's (input 0's) type;
// the step count (adam_update's input 3) is an fp32 scalar.
OpDef UpdateOp(const char* name, int num_inputs, double flops_per_element,
               bool reads_step_count) {
  OpDef def;
  def.name = name;
  def.min_inputs = def.max_inputs = num_inputs;
  def.infer = [num_inputs, reads_step_count](Inputs in,
                                             const Json& attrs) -> absl::StatusOr<TensorType> {
    RETURN_IF_ERROR(ReadOptimizerAttrs(attrs).status());
    RETURN_IF_ERROR(ExpectFloat(in[0], "the updated tensor (input 0)"));
    for (int i = 1; i < num_inputs; ++i) {
      const std::string what = absl::StrCat("input ", i);
      if (reads_step_count && i == num_inputs - 1) {
        RETURN_IF_ERROR(ExpectDType(in[i], DType::kFloat32, "the step count (input 3)"));
        RETURN_IF_ERROR(ExpectShape(in[i], Shape{}, "the step count (input 3)"));
        continue;
      }
      RETURN_IF_ERROR(ExpectSameShape(in[i], what, in[0], "input 0"));
      RETURN_IF_ERROR(ExpectSameDType(in[i], what, in[0], "input 0"));
    }
    return in[0];
  };
  def.flops = [flops_per_element](Inputs in, const TensorType&, const Json&) {
    return flops_per_element * Elements(in[0]);
  };
  return def;
}

}  // namespace

void RegisterOptimizerOps(std::vector<OpDef>& t) {
  // buf <- momentum buf + (grad + weight_decay p): inputs buf, grad, p.
  t.push_back(UpdateOp("sgd_momentum", 3, 3, false));
  // p <- p - lr d: inputs p, d (the momentum buffer, or the gradient, to
  // which weight_decay p is added, without momentum).
  t.push_back(UpdateOp("sgd_update", 2, 3, false));
  // m <- beta1 m + (1 - beta1) g; v <- beta2 v + (1 - beta2) g^2: inputs
  // the moment, grad, p (g = grad + weight_decay p unless decoupled).
  t.push_back(UpdateOp("adam_exp_avg", 3, 4, false));
  t.push_back(UpdateOp("adam_exp_avg_sq", 3, 5, false));
  // p <- p - lr/(1 - beta1^t) m / (sqrt(v)/sqrt(1 - beta2^t) + eps), after
  // p <- (1 - lr weight_decay) p when decoupled: inputs p, m, v, t.
  t.push_back(UpdateOp("adam_update", 4, 10, true));
  // t <- t + 1 (an fp32 scalar).
  OpDef step;
  step.name = "optimizer_step";
  step.min_inputs = step.max_inputs = 1;
  step.infer = [](Inputs in, const Json&) -> absl::StatusOr<TensorType> {
    RETURN_IF_ERROR(ExpectDType(in[0], DType::kFloat32, "the step count"));
    RETURN_IF_ERROR(ExpectShape(in[0], Shape{}, "the step count"));
    return in[0];
  };
  step.flops = [](Inputs, const TensorType&, const Json&) { return 1.0; };
  t.push_back(std::move(step));
}

}  // namespace pebble::ops_internal
