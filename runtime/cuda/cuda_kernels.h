// pebble's own CUDA kernels (runtime/cuda/*.cu): everything cuDNN and
// cuBLAS do not do. Plain C++17 and CUDA types only, so that nvcc never sees
// Abseil; runtime/cuda/cuda_ops.cc turns nodes into these calls.
//
// Every launcher enqueues on `stream` and returns the launch's error
// (cudaGetLastError), cudaSuccess otherwise. Arithmetic is fp32 for every
// storage type (fp16 and bf16 are converted on load and rounded to nearest
// on store); reductions accumulate in fp64 in a fixed order (no atomics), so
// every kernel gives the same bits on every run, whatever the addresses.
//
// Layout conventions: "(outer, C, inner)" views a dense row-major tensor as
// outer x C x inner with the reduced or broadcast channel in the middle
// (NC* activations: outer = N, inner = prod(spatial); (M, C) rows:
// inner = 1).
#ifndef PEBBLE_RUNTIME_CUDA_CUDA_KERNELS_H_
#define PEBBLE_RUNTIME_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/kernel_math.h"
#include "runtime/optimizer_math.h"

namespace pebble::cuda {

// Storage types the kernels take (the floating-point DTypes of graph.h).
enum class KType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

enum class UnaryOp : int {
  kRelu, kTanh, kSigmoid, kGeluErf, kGeluTanh,
  // runtime/activation_math.h, with UnaryParams:
  kClip,         // a = lo, b = hi
  kHardSigmoid,  // a = alpha, b = beta
  kHardSwish,
  kLeakyRelu,    // a = negative slope
  kElu,          // a = alpha, b = scale, c = input_scale
  kSoftplus,     // a = beta, b = threshold
  kErf,
  kSqrt,  // the backward reads the output
  kAbs,
  kExp,   // the backward reads the output
  kLog,
};
// The parameters of the parameterised unary ops (0 for the others).
struct UnaryParams {
  float a = 0.f, b = 0.f, c = 0.f;
};
// kMaximum, kMinimum: ATen's, NaN where either operand is NaN
// (runtime/activation_math.h).
enum class BinaryOp : int { kAdd, kMul, kSub, kDiv, kMaximum, kMinimum };

// y = op(x), n elements.
cudaError_t LaunchUnary(UnaryOp op, KType t, const void* x, void* y, int64_t n,
                        cudaStream_t stream, UnaryParams params = {});
// dx from g and `saved`: the output y for relu/tanh/sigmoid, the input x for
// gelu and the parameterised ops (docs/operators.md).
cudaError_t LaunchUnaryBackward(UnaryOp op, KType t, const void* g,
                                const void* saved, void* dx, int64_t n,
                                cudaStream_t stream, UnaryParams params = {});
// out[i] = a[i] op b[(i / inner) % nb], n elements (nb * inner divides n;
// nb == n: no broadcast; BlockBroadcast in graph/ops/op_util.h); with
// `b_first`, b[...] op a[i] (sub and div whose first operand is broadcast).
cudaError_t LaunchBinary(BinaryOp op, KType t, const void* a, const void* b,
                         void* out, int64_t n, int64_t nb, int64_t inner,
                         bool b_first, cudaStream_t stream);
// The gradient of operand `input` (0: a, 1: b) of maximum (or minimum)
// from g, a and b, n elements of one shape (activation::ExtremumGrad).
cudaError_t LaunchExtremumBackward(bool maximum, int input, KType t, const void* g,
                                   const void* a, const void* b, void* dx, int64_t n,
                                   cudaStream_t stream);
// y[o, c, i] += bias[c] over (outer, C, inner); bias has y's type.
cudaError_t LaunchChannelBias(KType t, void* y, const void* bias, int64_t outer,
                              int64_t channels, int64_t inner,
                              cudaStream_t stream);
// out[c] = sum over (o, i) of x[o, c, i], written in `out_type`.
// `scratch` holds at least ChannelScratchBytes(channels) bytes.
cudaError_t LaunchChannelSum(KType t, const void* x, KType out_type, void* out,
                             int64_t outer, int64_t channels, int64_t inner,
                             void* scratch, cudaStream_t stream);
// Bytes of scratch the channel reductions need.
int64_t ChannelScratchBytes(int64_t channels);

// Batch norm, training mode, over (N, C, S). stats is fp32 (2, C): row 0 the
// mean, row 1 the inverse standard deviation 1/sqrt(var + eps) with the
// biased variance (PyTorch's save_mean / save_invstd).
cudaError_t LaunchBatchNormStats(KType t, const void* x, float* stats,
                                 int64_t n, int64_t channels, int64_t s,
                                 double eps, void* scratch, cudaStream_t stream);
// y = (x - mean) * invstd * weight + bias; weight/bias fp32, may be null.
cudaError_t LaunchBatchNorm(KType t, const void* x, const float* stats,
                            const float* weight, const float* bias, void* y,
                            int64_t n, int64_t channels, int64_t s,
                            cudaStream_t stream);
// dx = weight * invstd * (g - mean(g) - xhat * mean(g * xhat)), means over
// (N, S); weight may be null (1).
cudaError_t LaunchBatchNormBackward(KType t, const void* g, const void* x,
                                    const float* stats, const float* weight,
                                    void* dx, int64_t n, int64_t channels,
                                    int64_t s, void* scratch,
                                    cudaStream_t stream);
// dweight[c] = sum g * xhat (fp32 out).
cudaError_t LaunchBatchNormBackwardWeight(KType t, const void* g, const void* x,
                                          const float* stats, float* dweight,
                                          int64_t n, int64_t channels, int64_t s,
                                          void* scratch, cudaStream_t stream);

// Scalar losses (fp32 out[0]). `scratch` holds ScalarScratchBytes().
int64_t ScalarScratchBytes();
// mean((p - t)^2).
cudaError_t LaunchMseLoss(KType t, const void* pred, const void* target,
                          float* out, int64_t n, void* scratch,
                          cudaStream_t stream);
// dpred = 2 (p - t) / n * (g ? g[0] : 1).
cudaError_t LaunchMseLossBackward(KType t, const void* pred, const void* target,
                                  const float* g, void* dpred, int64_t n,
                                  cudaStream_t stream);
// mean of activation::BceWithLogits (nn.BCEWithLogitsLoss), and its
// gradient (sigmoid(x) - t) / n * (g ? g[0] : 1).
cudaError_t LaunchBceLoss(KType t, const void* logits, const void* target, float* out,
                          int64_t n, void* scratch, cudaStream_t stream);
cudaError_t LaunchBceLossBackward(KType t, const void* logits, const void* target,
                                  const float* g, void* dlogits, int64_t n,
                                  cudaStream_t stream);
// logits viewed as (outer, C, inner) with the class axis in the middle;
// target (outer, inner) i64. Mean over outer*inner of
// logsumexp - logit[target]. A target outside [0, C) yields NaN.
cudaError_t LaunchCrossEntropy(KType t, const void* logits,
                               const int64_t* target, float* out,
                               int64_t outer, int64_t classes, int64_t inner,
                               void* scratch, cudaStream_t stream);
// dlogits = (softmax - one_hot) / (outer*inner) * (g ? g[0] : 1).
cudaError_t LaunchCrossEntropyBackward(KType t, const void* logits,
                                       const int64_t* target, const float* g,
                                       void* dlogits, int64_t outer,
                                       int64_t classes, int64_t inner,
                                       cudaStream_t stream);
// out[0] = sum(x) in fp32.
cudaError_t LaunchSum(KType t, const void* x, float* out, int64_t n,
                      void* scratch, cudaStream_t stream);

// Windows over up to 3 spatial dims; a 2-D tensor is passed as D = 1 with
// kernel 1, stride 1, padding 0 in that dim. Shapes: x (N*C, D, H, W),
// y (N*C, oD, oH, oW).
struct Window3 {
  int64_t nc = 0;
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1};
  int64_t padding[3] = {0, 0, 0};
};
// Max over each window (padding never wins); the first maximum in
// row-major window order is the argmax.
cudaError_t LaunchMaxPool(KType t, const Window3& w, const void* x, void* y,
                          cudaStream_t stream);
// dx[i] = sum of g over the windows whose argmax (recomputed from x) is i,
// gathered per input element (no atomics).
cudaError_t LaunchMaxPoolBackward(KType t, const Window3& w, const void* g,
                                  const void* x, void* dx, cudaStream_t stream);

// Upsampling by integer factors: mode 0 nearest, 1 (bi/tri)linear.
// in/out are the spatial sizes (D, H, W), with 1 for missing dims; each out
// is a multiple of its in. Source indices and weights are Note [Upsample
// taps] in runtime/kernel_math.h, the CPU backend's.
struct Upsample3 {
  int64_t nc = 0;
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  float scale[3] = {1.f, 1.f, 1.f};  // per dim, the source step (Note [Upsample taps])
  int mode = 0;                 // 0 nearest, 1 linear, 2 bicubic (2-D)
  bool align_corners = false;
};
cudaError_t LaunchUpsample(KType t, const Upsample3& u, const void* x, void* y,
                           cudaStream_t stream);
// Transpose of the above, gathered per input element (no atomics).
cudaError_t LaunchUpsampleBackward(KType t, const Upsample3& u, const void* g,
                                   void* dx, cudaStream_t stream);

// out[n, c] = mean over s of x[n, c, s]; rows = N*C of length s.
cudaError_t LaunchRowMean(KType t, const void* x, void* out, int64_t rows,
                          int64_t length, cudaStream_t stream);
// out[r, s] = g[r] / length.
cudaError_t LaunchRowBroadcastMean(KType t, const void* g, void* out,
                                   int64_t rows, int64_t length,
                                   cudaStream_t stream);

// Constant pad / crop of a rank <= 6 tensor: out[i] = in[i - before] where
// that is inside `in`, else `value`. before[d] < 0 crops.
struct PadSpec {
  int rank = 0;
  int64_t in[6] = {0, 0, 0, 0, 0, 0};
  int64_t out[6] = {0, 0, 0, 0, 0, 0};
  int64_t before[6] = {0, 0, 0, 0, 0, 0};
};
cudaError_t LaunchPad(int element_bytes, const PadSpec& p, const void* in,
                      void* out, double value, KType t, cudaStream_t stream);
// pad's modes reflect and replicate (Note [Border padding] in
// runtime/kernel_math.h): y[o] = x[BorderSource(p, o)] over the padded
// shape p.out, or with `backward` dx[i] = the fp32 sum of g over the outputs
// that read x[i], over p.in.
cudaError_t LaunchBorderPad(KType t, const kmath::BorderPad& p, bool backward, const void* in,
                            void* out, cudaStream_t stream);

// compare's operand types; and masked_fill (Note [Broadcast index] in
// runtime/kernel_math.h): out[o] = a[BroadcastSource(ia, o)] op
// b[BroadcastSource(ib, o)] as 0 or 1 (floats compared in float, integers as
// they are), n outputs; y[o] = `value` where mask[BroadcastSource(im, o)] is
// not 0 (with `invert`: is 0), else x[o].
enum class CompareType : int { kF32 = 0, kF16, kBF16, kI64, kU8 };
cudaError_t LaunchCompare(CompareType t, kmath::CompareOp op, const void* a,
                          const kmath::BroadcastIndex& ia, const void* b,
                          const kmath::BroadcastIndex& ib, uint8_t* out, int64_t n,
                          cudaStream_t stream);
// cast: y[i] = x[i] converted from type `from` to type `to` (Note [Cast
// values] in runtime/kernel_math.h), n elements.
cudaError_t LaunchCast(CompareType from, CompareType to, const void* x, void* y, int64_t n,
                       cudaStream_t stream);
cudaError_t LaunchMaskedFill(KType t, const void* x, const uint8_t* mask,
                             const kmath::BroadcastIndex& im, float value, bool invert, void* y,
                             int64_t n, cudaStream_t stream);

// The optimizer's in-place update `op` (runtime/optimizer_math.h): a[i] =
// Update(op, s, a[i], b[i], c[i]) for n elements (c null: 0). kAdamUpdate
// first sets s's step factors from `h` and the step count *step (an fp32
// scalar in device memory, read on the device).
cudaError_t LaunchOptimizerUpdate(optim::UpdateOp op, KType t, optim::UpdateScalars s,
                                  optim::AdamHyper h, void* a, const void* b, const void* c,
                                  const float* step, int64_t n, cudaStream_t stream);
// *count += 1 (an fp32 scalar in device memory).
cudaError_t LaunchIncrement(float* count, cudaStream_t stream);

// Every element = value (stored in `t`).
cudaError_t LaunchFill(KType t, void* out, int64_t n, double value,
                       cudaStream_t stream);
// Every element of an i64 tensor = value.
cudaError_t LaunchFillInt64(int64_t* out, int64_t n, int64_t value,
                            cudaStream_t stream);
// Every element = g[0] (fp32 scalar) in `t`.
cudaError_t LaunchBroadcastScalar(KType t, const float* g, void* out, int64_t n,
                                  cudaStream_t stream);

// Softmax over rows of `length` (the last dim); `causal`: in each
// (q, k) matrix of the last two dims (rows_per_matrix = q), key j > query i
// is masked out. `log`: log_softmax, x - max - log(sum(exp(x - max)))
// (not causal).
cudaError_t LaunchSoftmax(KType t, const void* x, void* y, int64_t rows,
                          int64_t length, bool causal, int64_t rows_per_matrix,
                          bool log, cudaStream_t stream);
// dx = y * (g - sum(g * y)) per row; `log`: dx = g - exp(y) * sum(g).
cudaError_t LaunchSoftmaxBackward(KType t, const void* g, const void* y,
                                  void* dx, int64_t rows, int64_t length,
                                  bool log, cudaStream_t stream);

// ---- Averaging pools: avgpool (count_include_pad) and adaptive_avgpool,
// the bins of runtime/kernel_math.h (PoolAxis) per spatial dim. x (nc, D,
// H, W) -> y (nc, oD, oH, oW); a 2-D pool leaves axis 0 at its default.
struct AvgPool3 {
  int64_t nc = 0;
  kmath::PoolAxis axis[3];
};
// Sum over each bin in fp64, divided by the product of the divisors.
cudaError_t LaunchAvgPool(KType t, const AvgPool3& p, const void* x, void* y,
                          cudaStream_t stream);
// dx[i] = sum over the bins containing i, in output order, of
// g / divisor (fp32), gathered per input element (no atomics).
cudaError_t LaunchAvgPoolBackward(KType t, const AvgPool3& p, const void* g,
                                  void* dx, cudaStream_t stream);

// ---- Layer norm over rows of `d` elements (the last dim). stats is fp32
// (2, rows): row 0 the means, row 1 1/sqrt(var + eps) with the biased
// variance from a second pass over x - mean (no cancellation). weight and
// bias have x's type and may be null.
cudaError_t LaunchLayerNormStats(KType t, const void* x, float* stats,
                                 int64_t rows, int64_t d, double eps,
                                 cudaStream_t stream);
cudaError_t LaunchLayerNorm(KType t, const void* x, const float* stats,
                            const void* weight, const void* bias, void* y,
                            int64_t rows, int64_t d, cudaStream_t stream);
// dx = rstd (g w - mean(g w) - xhat mean(g w xhat)) per row.
cudaError_t LaunchLayerNormBackward(KType t, const void* g, const void* x,
                                    const float* stats, const void* weight,
                                    void* dx, int64_t rows, int64_t d,
                                    cudaStream_t stream);

// Column sums of a (rows, cols) tensor in fp64, out in `t`: with `stats`
// null, out[c] = sum_r x[r, c] (sum_to, layernorm_backward_bias); with
// layer-norm stats (2, rows), out[c] = sum_r g[r, c] xhat[r, c] where
// xhat = (x - mean_r) rstd_r (layernorm_backward_weight; `g` then is the
// gradient and `x` the input). `scratch` holds ColumnScratchBytes(rows,
// cols) bytes.
int64_t ColumnScratchBytes(int64_t rows, int64_t cols);
cudaError_t LaunchColumnSum(KType t, const void* g, const void* x,
                            const float* stats, void* out, int64_t rows,
                            int64_t cols, void* scratch, cudaStream_t stream);

// ---- Dropout (Note [Dropout mask generator] in runtime/kernel_math.h:
// the CPU backend's bits). mask: n bytes, 1 kept, 0 dropped.
// random's noise (Note [Random values], runtime/kernel_math.h) into n
// elements of type t.
cudaError_t LaunchRandom(KType t, void* out, int64_t n, bool normal, double a, double b,
                         uint64_t seed, cudaStream_t stream);
cudaError_t LaunchDropoutMask(uint8_t* mask, int64_t n, double p, uint64_t seed,
                              cudaStream_t stream);
// y = x * (mask ? scale : 0), scale = fp32(1 / (1 - p)).
cudaError_t LaunchDropoutApply(KType t, const void* x, const uint8_t* mask,
                               float scale, void* y, int64_t n,
                               cudaStream_t stream);

// ---- Index checks (Note [Index fault keys] in runtime/kernel_math.h). A
// device word the backend reads when it synchronises: `key` is
// kmath::kNoIndexFault or the first fault's key, `value` the index found
// there.
struct IndexFault {
  unsigned long long key;
  long long value;
};
// For launch `tag`: lowers fault->key to IndexFaultKey(tag, i) for every
// position i < n with indices[i] outside [0, limit), then, when the word
// holds a position of this launch, copies that index into fault->value
// (ordered after the minimum on `stream`, while `indices` is still valid).
// n < kmath::kIndexFaultPositionLimit, tag < kmath::kIndexFaultTagLimit.
cudaError_t LaunchCheckIndices(const int64_t* indices, int64_t n, int64_t limit,
                               uint64_t tag, IndexFault* fault,
                               cudaStream_t stream);

// ---- Embedding: out[i, :] = weight[indices[i], :] for n positions of
// `dim` elements; an index outside [0, num) yields a row of NaN (the op
// checks its indices first with LaunchCheckIndices).
cudaError_t LaunchEmbedding(KType t, const int64_t* indices, const void* weight,
                            void* out, int64_t n, int64_t num, int64_t dim,
                            cudaStream_t stream);
// dweight[j, :] = sum of g[i, :] over positions i with indices[i] = j, in
// position order, accumulated in fp32 (one thread per column; no atomics),
// so the bits equal the CPU backend's. fp16/bf16 accumulate in `scratch`
// (EmbeddingScratchBytes); out-of-range positions are skipped.
int64_t EmbeddingScratchBytes(KType t, int64_t num, int64_t dim);
cudaError_t LaunchEmbeddingBackward(KType t, const void* g,
                                    const int64_t* indices, void* dweight,
                                    int64_t n, int64_t num, int64_t dim,
                                    void* scratch, cudaStream_t stream);

// out[i] = src[PermutedSource(m, i)] (transpose, flip), n elements of
// `element_bytes` (1, 2, 4 or 8).
cudaError_t LaunchTranspose(int element_bytes, const kmath::PermuteMap& m,
                            const void* src, void* dst, int64_t n,
                            cudaStream_t stream);
// out[i] = i, n int64 elements.
cudaError_t LaunchArange(int64_t* out, int64_t n, cudaStream_t stream);

// ---- Head split copies (kmath::HeadsMap): n = B H S Dh elements of
// `element_bytes` (1, 2, 4 or 8). to_heads (split_heads): heads[i] =
// merged[MergedIndex(i)], src = merged, dst = heads; else (merge_heads):
// merged[MergedIndex(i)] = heads[i], src = heads, dst = merged, the other
// merged elements untouched.
cudaError_t LaunchHeadsCopy(int element_bytes, const kmath::HeadsMap& m,
                            bool to_heads, const void* src, void* dst,
                            int64_t n, cudaStream_t stream);

}  // namespace pebble::cuda

#endif  // PEBBLE_RUNTIME_CUDA_CUDA_KERNELS_H_
