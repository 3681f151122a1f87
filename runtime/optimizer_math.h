// The optimizer's updates (graph/optimizer.h), one element at a time in
// float, shared by the CPU kernels and the CUDA kernels (device code, and
// its host emulation): one definition, so the backends agree to the bit.
// Each follows torch.optim's single-tensor SGD and Adam of PyTorch 1.13
// operation by operation, with the hyper-parameters rounded to float as
// ATen's CPU kernels round a Python scalar:
//   SGD   d = grad + wd p;  buf = buf * momentum + d;  p = p + (-lr) d'
//   Adam  g = grad + wd p (AdamW: p = p * (1 - lr wd) before the step);
//         m = m * beta1 + (1 - beta1) g;  v = v * beta2 + ((1 - beta2) g) g;
//         p = p + ((-step_size) m) / (sqrt(v) / sqrt(bc2) + eps)
// with step_size = lr / (1 - beta1^t) and bc2 = 1 - beta2^t computed in
// double from the step count t, as Python does (ATen's CPU addcdiv
// multiplies by the value before it divides). Every product and sum is
// rounded on its own (Mul, Add): nvcc would fuse them into an FMA, which
// rounds once, and the backends would differ.
#ifndef PEBBLE_RUNTIME_OPTIMIZER_MATH_H_
#define PEBBLE_RUNTIME_OPTIMIZER_MATH_H_

#include <cmath>

#if defined(__CUDACC__)
#define PEBBLE_HOST_DEVICE __host__ __device__
#else
#define PEBBLE_HOST_DEVICE
#endif

namespace pebble::optim {

// The in-place update ops; each writes its input 0 (`a` below).
enum class UpdateOp : int {
  kSgdMomentum,   // a = momentum buffer, b = grad, c = p
  kSgdUpdate,     // a = p, b = momentum buffer (momentum > 0) or grad
  kAdamExpAvg,    // a = exp_avg, b = grad, c = p
  kAdamExpAvgSq,  // a = exp_avg_sq, b = grad, c = p
  kAdamUpdate,    // a = p, b = exp_avg, c = exp_avg_sq (and the step count)
};

// An update's hyper-parameters in float, and Adam's step-dependent factors.
struct UpdateScalars {
  float lr = 0, weight_decay = 0, momentum = 0;
  float beta1 = 0, beta2 = 0, eps = 0;
  float one_minus_beta1 = 0, one_minus_beta2 = 0;
  float decay = 1;  // AdamW: 1 - lr weight_decay; else 1
  bool decoupled = false;
  // kAdamUpdate: lr / (1 - beta1^t) and sqrt(1 - beta2^t); AdamStep sets them.
  float step_size = 0, bias_correction2_sqrt = 1;
};

// The scalars from the double hyper-parameters, each rounded once as ATen
// rounds a Python float.
inline UpdateScalars MakeUpdateScalars(double lr, double weight_decay, double momentum,
                                       double beta1, double beta2, double eps,
                                       bool decoupled) {
  UpdateScalars s;
  s.lr = static_cast<float>(lr);
  s.weight_decay = static_cast<float>(weight_decay);
  s.momentum = static_cast<float>(momentum);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = static_cast<float>(eps);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.decoupled = decoupled;
  s.decay = decoupled ? static_cast<float>(1 - lr * weight_decay) : 1.f;
  return s;
}

// The double hyper-parameters Adam's step-dependent factors come from.
struct AdamHyper {
  double lr = 0, beta1 = 0, beta2 = 0;
};

// Adam's factors for step count t (the value after this step's increment).
PEBBLE_HOST_DEVICE inline void AdamStep(UpdateScalars& s, const AdamHyper& h, float t) {
  s.step_size = static_cast<float>(h.lr / (1.0 - pow(h.beta1, static_cast<double>(t))));
  s.bias_correction2_sqrt =
      static_cast<float>(sqrt(1.0 - pow(h.beta2, static_cast<double>(t))));
}

// a b and a + b, each rounded to float on its own (no FMA contraction).
PEBBLE_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
PEBBLE_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// The gradient an update uses: grad + weight_decay p (coupled decay).
PEBBLE_HOST_DEVICE inline float DecayedGrad(const UpdateScalars& s, float grad, float p) {
  return (s.weight_decay != 0.f && !s.decoupled) ? Add(grad, Mul(s.weight_decay, p)) : grad;
}

// The new value of `a` (UpdateOp lists the operands).
PEBBLE_HOST_DEVICE inline float Update(UpdateOp op, const UpdateScalars& s, float a, float b,
                                       float c) {
  switch (op) {
    case UpdateOp::kSgdMomentum:
      return Add(Mul(a, s.momentum), DecayedGrad(s, b, c));
    case UpdateOp::kSgdUpdate: {
      const float d = s.momentum != 0.f ? b : DecayedGrad(s, b, a);
      return Add(a, Mul(-s.lr, d));
    }
    case UpdateOp::kAdamExpAvg:
      return Add(Mul(a, s.beta1), Mul(s.one_minus_beta1, DecayedGrad(s, b, c)));
    case UpdateOp::kAdamExpAvgSq: {
      const float g = DecayedGrad(s, b, c);
      return Add(Mul(a, s.beta2), Mul(Mul(s.one_minus_beta2, g), g));
    }
    case UpdateOp::kAdamUpdate: {
      const float p = s.decoupled ? Mul(a, s.decay) : a;
      const float denom = Add(sqrtf(c) / s.bias_correction2_sqrt, s.eps);
      return Add(p, Mul(-s.step_size, b) / denom);
    }
  }
  return a;
}

}  // namespace pebble::optim

#endif  // PEBBLE_RUNTIME_OPTIMIZER_MATH_H_
