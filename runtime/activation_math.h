// The piecewise-linear activations of the operator table (relu, clip,
// hardsigmoid, hardswish, leaky_relu), elu, softplus, erf, sqrt, abs, exp,
// log, maximum and minimum, and their gradients, in float, shared by the CPU
// kernels and the CUDA kernels (device code, and its host emulation): one
// definition, so the backends agree to the bit. Each follows PyTorch's ATen
// definition (hardtanh, hardsigmoid, hardswish, leaky_relu and their
// *_backward), boundaries included; NaN inputs stay NaN in the forward.
#ifndef PEBBLE_RUNTIME_ACTIVATION_MATH_H_
#define PEBBLE_RUNTIME_ACTIVATION_MATH_H_

#include <cmath>

#if defined(__CUDACC__)
#define PEBBLE_HOST_DEVICE __host__ __device__
#else
#define PEBBLE_HOST_DEVICE
#endif

namespace pebble::activation {

// max(x, 0), as PyTorch's relu: NaN stays NaN and -0 stays -0 (oneDNN's
// eltwise_relu gives 0 for NaN, which hides a NaN from the loss).
PEBBLE_HOST_DEVICE inline float Relu(float x) { return x < 0.f ? 0.f : x; }
// relu_backward from relu's output y: threshold_backward(g, y, 0), which
// passes the gradient where y <= 0 is false (y > 0, or y NaN).
PEBBLE_HOST_DEVICE inline float ReluGrad(float g, float y) { return y <= 0.f ? 0.f : g; }

// min(max(x, lo), hi) (hardtanh; ReLU6 is lo = 0, hi = 6).
PEBBLE_HOST_DEVICE inline float Clip(float x, float lo, float hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}
// hardtanh_backward: the gradient passes strictly inside (lo, hi).
PEBBLE_HOST_DEVICE inline float ClipGrad(float g, float x, float lo, float hi) {
  return (x <= lo || x >= hi) ? 0.f : g;
}

// clip(alpha x + beta, 0, 1); PyTorch's hardsigmoid is alpha = 1/6, beta = 1/2.
PEBBLE_HOST_DEVICE inline float HardSigmoid(float x, float alpha, float beta) {
  return Clip(alpha * x + beta, 0.f, 1.f);
}
PEBBLE_HOST_DEVICE inline float HardSigmoidGrad(float g, float x, float alpha, float beta) {
  const float z = alpha * x + beta;
  return (z > 0.f && z < 1.f) ? g * alpha : 0.f;
}

// x relu6(x + 3) / 6.
PEBBLE_HOST_DEVICE inline float HardSwish(float x) {
  return x * Clip(x + 3.f, 0.f, 6.f) / 6.f;
}
PEBBLE_HOST_DEVICE inline float HardSwishGrad(float g, float x) {
  if (x < -3.f) return 0.f;
  if (x <= 3.f) return g * (x / 3.f + 0.5f);
  return g;
}

// x for x > 0, slope x otherwise.
PEBBLE_HOST_DEVICE inline float LeakyRelu(float x, float slope) {
  return x > 0.f ? x : x * slope;
}
PEBBLE_HOST_DEVICE inline float LeakyReluGrad(float g, float x, float slope) {
  return x > 0.f ? g : g * slope;
}

// ELU with PyTorch's three coefficients (ATen's elu, whose nn.ELU, nn.SELU
// and nn.CELU are each a choice of them): scale x for x > 0, else
// alpha scale (exp(input_scale x) - 1).
PEBBLE_HOST_DEVICE inline float Elu(float x, float alpha, float scale, float input_scale) {
  return x <= 0.f ? expm1f(x * input_scale) * alpha * scale : x * scale;
}
// elu_backward from the input x (is_result false): g input_scale alpha scale
// exp(input_scale x) for x <= 0, else g scale.
PEBBLE_HOST_DEVICE inline float EluGrad(float g, float x, float alpha, float scale,
                                        float input_scale) {
  return x <= 0.f ? g * input_scale * alpha * scale * expf(x * input_scale) : g * scale;
}

// Softplus as ATen's: log(1 + exp(beta x)) / beta, and x itself where
// beta x > threshold (PyTorch's defaults: beta 1, threshold 20).
PEBBLE_HOST_DEVICE inline float Softplus(float x, float beta, float threshold) {
  return x * beta > threshold ? x : log1pf(expf(x * beta)) / beta;
}
// softplus_backward: g z / (z + 1), z = exp(beta x), and g past the
// threshold.
PEBBLE_HOST_DEVICE inline float SoftplusGrad(float g, float x, float beta, float threshold) {
  const float z = expf(x * beta);
  return x * beta > threshold ? g : g * z / (z + 1.f);
}

// The error function (ONNX Erf: GELU written out) and its derivative
// 2 / sqrt(pi) exp(-x^2).
PEBBLE_HOST_DEVICE inline float Erf(float x) { return erff(x); }
PEBBLE_HOST_DEVICE inline float ErfGrad(float g, float x) {
  return g * 1.12837916709551257f * expf(-x * x);
}

// The square root (ONNX Sqrt: a layer norm written out) and its derivative
// 1 / (2 sqrt(x)), read from the output y = sqrt(x) as PyTorch's
// sqrt_backward does.
PEBBLE_HOST_DEVICE inline float Sqrt(float x) { return sqrtf(x); }
PEBBLE_HOST_DEVICE inline float SqrtGrad(float g, float y) { return g / (2.f * y); }

// |x|, and abs_backward: g sgn(x), 0 at x = 0 (and for NaN).
PEBBLE_HOST_DEVICE inline float Abs(float x) { return fabsf(x); }
PEBBLE_HOST_DEVICE inline float AbsGrad(float g, float x) {
  return x > 0.f ? g : (x < 0.f ? -g : 0.f * g);
}

// exp(x); its derivative read from the output y = exp(x), as PyTorch's
// exp_backward does.
PEBBLE_HOST_DEVICE inline float Exp(float x) { return expf(x); }
PEBBLE_HOST_DEVICE inline float ExpGrad(float g, float y) { return g * y; }

// The natural logarithm; its derivative g / x.
PEBBLE_HOST_DEVICE inline float Log(float x) { return logf(x); }
PEBBLE_HOST_DEVICE inline float LogGrad(float g, float x) { return g / x; }

// maximum (or minimum) of a and b, as ATen's: NaN where either is NaN.
PEBBLE_HOST_DEVICE inline float Extremum(bool maximum, float a, float b) {
  if (a != a || b != b) return a + b;  // NaN
  return maximum ? (a < b ? b : a) : (b < a ? b : a);
}
// The gradient of operand `input` (0: a, 1: b) of maximum or minimum, as
// ATen's derivatives.yaml writes it: g / 2 where a == b (-0 equals +0),
// else g, zeroed where the operand loses (a < b for maximum's a, a > b
// for its b; the reverse for minimum's). Where either is NaN neither
// loses, so both get g.
PEBBLE_HOST_DEVICE inline float ExtremumGrad(bool maximum, int input, float g, float a,
                                             float b) {
  if (a == b) return g * 0.5f;
  const bool loses = (maximum == (input == 0)) ? a < b : a > b;
  return loses ? 0.f : g;
}

// Binary cross-entropy of logit x against target t, ATen's
// binary_cross_entropy_with_logits term: (1 - t) x + m + log(exp(-m) +
// exp(-x - m)), m = max(-x, 0) (no overflow for any x).
PEBBLE_HOST_DEVICE inline float BceWithLogits(float x, float t) {
  const float m = -x > 0.f ? -x : 0.f;
  return (1.f - t) * x + m + logf(expf(-m) + expf(-x - m));
}
// Its derivative in x: sigmoid(x) - t.
PEBBLE_HOST_DEVICE inline float BceWithLogitsGrad(float x, float t) {
  return 1.f / (1.f + expf(-x)) - t;
}

}  // namespace pebble::activation

#endif  // PEBBLE_RUNTIME_ACTIVATION_MATH_H_
