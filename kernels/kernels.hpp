#pragma once

// The one dispatch header for troupe's kernels: pure functions on tensors,
// forward and backward. Outputs are passed by reference and (re)allocated only
// when their shape differs, so a training loop reuses its buffers.
// Every kernel checks its shapes and throws troupe::shape_error naming the
// kernel, the argument and both shapes. Every kernel takes the caller's
// execution context first: its thread count and GEMM backend.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/machine.hpp"
#include "tensor/tensor.hpp"

namespace troupe::kernels {

// ---------------------------------------------------------------- runtime

/// Makes `t` a tensor of shape `s` on the CPU, reusing its storage when the
/// shape already matches. Contents are unspecified.
void ensure_shape(tensor& t, const shape& s);

// ---------------------------------------------------------------- GEMM

/// Row-major C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
/// lda/ldb/ldc are row strides of the matrices as stored. Runs on ctx.gemm
/// with ctx.threads threads (one inside a parallel region).
void gemm(const context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc);

/// out = a [m, k] * b [k, n].
void matmul(const context& ctx, const tensor& a, const tensor& b, tensor& out);

// ---------------------------------------------------------------- dense

/// y [n, out] = x [n, in] * w^T + bias; w is [out, in], bias [out] or undefined.
/// With `relu`, y = max(y, 0) (relu_forward's bits) on the threads that
/// compute the product, as each block of y is written.
void dense_forward(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                   tensor& y, bool relu = false);
/// dw = dy^T x; dbias = column sums of dy (when dbias != nullptr);
/// dx = dy w (when dx != nullptr). With `relu_output` (y of a dense_forward
/// with relu), dy counts where y > 0 only: the bits of relu_backward, then
/// this, with the mask and dbias's sums in one pass over dy.
void dense_backward(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                    tensor* dx, tensor& dw, tensor* dbias, const tensor* relu_output = nullptr);

// ---------------------------------------------------------------- conv2d

struct conv2d_geometry {
  int64_t in_channels = 0, out_channels = 0, kernel = 1, stride = 1, padding = 0;
};

/// The output shape [n, oc, oh, ow] of x [n, c, h, w]; throws on a mismatch.
shape conv2d_output_shape(const shape& x, const conv2d_geometry& g);

/// y = conv(x, w) + bias, w [oc, c, k, k], by ctx.conv's path; then max(y, 0)
/// when `relu` (in the same pass). On the im2col path `cols` receives the
/// column matrices [n, c*k*k, oh*ow] that the backward pass needs; the direct
/// path needs none and leaves it undefined.
/// With `input_map` ([2, c]: scales, then shifts), the convolution is that of
/// channel_affine_relu(x, input_map), read from x where the kernels load it
/// (Winograd's path) or made first (the others): a batch norm's output that
/// is never written.
void conv2d_forward(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                    const conv2d_geometry& g, tensor& y, tensor& cols, bool relu = false,
                    const tensor* input_map = nullptr);
/// Gradients from dy, the forward pass's input x and its `cols` (same ctx.conv
/// as the forward pass). dx and dbias are skipped when null (the first layer
/// needs no input gradient). When the forward pass applied ReLU, `relu_output`
/// is its output y: dy then counts where y > 0 only. With `dx_addend` (x's
/// shape, not dx's memory), dx is the input gradient plus it, in the pass that
/// writes dx (the bits of add() after): a residual block's sum of gradients.
/// With `input_map` (the forward pass's), x is read through it as there; dx is
/// the gradient of the mapped input.
void conv2d_backward(const context& ctx, const tensor& x, const tensor& w, const tensor& cols, const tensor& dy,
                     const conv2d_geometry& g, tensor* dx, tensor& dw, tensor* dbias,
                     const tensor* relu_output = nullptr, const tensor* dx_addend = nullptr,
                     const tensor* input_map = nullptr);

/// Whether conv2d_relu_pool_forward and _backward take `g` in `ctx`: its path there is the direct
/// kernels' (with stride 1 and padding < kernel, as their input gradient needs) or Winograd's, not im2col.
bool conv2d_relu_pool_supported(const context& ctx, const conv2d_geometry& g);
/// y = max_pool2d(relu(conv2d(x, w) + bias)) with a 2x2 window of stride 2, image by image: the
/// convolution's own output is never written. window [n, oh / 2 * ow / 2, ocp], position-major (ocp: oc
/// rounded up to the kernel set's vector width; what conv2d_relu_pool_backward reads, as it was written),
/// holds each maximum's place in its window (0 to 3, row by row, as floats). y has the bits of
/// conv2d_forward with relu, then max_pool2d_forward (the first of equal maxima wins). Throws where
/// conv2d_relu_pool_supported is false.
void conv2d_relu_pool_forward(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                              const conv2d_geometry& g, tensor& y, tensor& window);
/// conv2d_backward's gradients from the pool's dy and the forward pass's y and window: the bits of
/// max_pool2d_backward, then conv2d_backward with the ReLU's mask.
void conv2d_relu_pool_backward(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                               const tensor& y, const tensor& window, const conv2d_geometry& g, tensor* dx,
                               tensor& dw, tensor* dbias);

// ---------------------------------------------------------------- pooling

struct pool2d_geometry {
  int64_t kernel = 2, stride = 2;
};
shape pool2d_output_shape(const shape& x, const pool2d_geometry& g);

/// y = window maxima; argmax holds the flat input index of each maximum.
void max_pool2d_forward(const context& ctx, const tensor& x, const pool2d_geometry& g, tensor& y,
                        std::vector<int32_t>& argmax);
void max_pool2d_backward(const context& ctx, const tensor& dy, const std::vector<int32_t>& argmax,
                         const shape& x_shape, tensor& dx);
void avg_pool2d_forward(const context& ctx, const tensor& x, const pool2d_geometry& g, tensor& y);
void avg_pool2d_backward(const context& ctx, const tensor& dy, const pool2d_geometry& g,
                         const shape& x_shape, tensor& dx);
/// y [n, c] = the mean of each plane of x [n, c, h, w].
void global_avg_pool2d_forward(const context& ctx, const tensor& x, tensor& y);
/// dx [n, c, h, w] = dy [n, c] / (h * w) at every position of the plane.
void global_avg_pool2d_backward(const context& ctx, const tensor& dy, const shape& x_shape, tensor& dx);

// ---------------------------------------------------------------- elementwise

/// y = a + b, elementwise (same shapes), then max(y, 0) when `relu`; y may be a or b.
void add(const context& ctx, const tensor& a, const tensor& b, tensor& y, bool relu = false);

// ---------------------------------------------------------------- activations

/// Whether data[0, n) holds only finite values (no NaN, no Inf): the check a
/// receiver runs on every tensor payload. Large arrays are scanned on
/// ctx.threads threads, one range each, the ranges of the other parallel
/// loops (each thread reads mostly what it wrote last).
bool all_finite(const context& ctx, const float* data, int64_t n);

/// Gradient clipping by global norm: scales the `parts` (pointer, length) in
/// place by max_norm / norm when their joint L2 norm exceeds `max_norm`;
/// returns the norm before (summed in double, in order: the same for the
/// same values however they are cut into parts). max_norm <= 0: no clipping.
double clip_by_global_norm(const context& ctx, const std::vector<std::pair<float*, int64_t>>& parts, double max_norm);

/// Activation backward passes take the forward output y.
void relu_forward(const context& ctx, const tensor& x, tensor& y);
void relu_backward(const context& ctx, const tensor& y, const tensor& dy, tensor& dx);
void tanh_forward(const context& ctx, const tensor& x, tensor& y);
void tanh_backward(const context& ctx, const tensor& y, const tensor& dy, tensor& dx);
void sigmoid_forward(const context& ctx, const tensor& x, tensor& y);
void sigmoid_backward(const context& ctx, const tensor& y, const tensor& dy, tensor& dx);

/// Inverted dropout: mask holds 0 or 1/(1-p); y = x * mask. `seed` and
/// `counter` make the mask reproducible.
void dropout_forward(const context& ctx, const tensor& x, float p, uint64_t seed, uint64_t counter,
                     tensor& mask, tensor& y);
void dropout_backward(const context& ctx, const tensor& dy, const tensor& mask, tensor& dx);

// ---------------------------------------------------------------- batch norm

/// Per-channel batch normalization of x [n, c] or [n, c, h, w].
/// Training: normalizes with the batch statistics, saves mean and 1/std for
/// backward, and updates running statistics (running = (1-m) running + m batch,
/// unbiased variance).
/// With `relu`, y = max(y, 0) in the same pass; the backward pass then takes
/// that y as `relu_output` and counts dy where y > 0 only. With `addend` (x's
/// shape), y = normalized x + addend, before the ReLU: a residual block's sum
/// in the same pass (the bits of add(), then relu, after batch norm).
/// With `saved_affine`, it receives [2, c]: each channel's scale and shift
/// (y = x * scale + shift before any addend and ReLU), for the backward pass's
/// `relu_affine`. Without `write_y` (and with `saved_affine`): the statistics,
/// the running ones and the scale and shift only, y not written: a consumer
/// that reads x through them (conv2d's `input_map`) stands in for it.
void batch_norm_forward_train(const context& ctx, const tensor& x, const tensor& gamma,
                              const tensor& beta, float eps, float momentum, tensor& running_mean,
                              tensor& running_var, tensor& y, tensor& saved_mean,
                              tensor& saved_invstd, bool relu = false, const tensor* addend = nullptr,
                              tensor* saved_affine = nullptr, bool write_y = true);
/// Inference's scale and shift ([2, c]: scales, then shifts), from the running statistics.
void batch_norm_eval_affine(const tensor& gamma, const tensor& beta, float eps, const tensor& running_mean,
                            const tensor& running_var, tensor& affine);
/// y = max(x * scale + shift, 0) per channel of x [n, c, ...], affine [2, c] (scales, then shifts), each
/// element by one fused multiply-add: what conv2d's `input_map` reads x as.
void channel_affine_relu(const context& ctx, const tensor& x, const tensor& affine, tensor& y);
void batch_norm_forward_eval(const context& ctx, const tensor& x, const tensor& gamma,
                             const tensor& beta, float eps, const tensor& running_mean,
                             const tensor& running_var, tensor& y, bool relu = false,
                             const tensor* addend = nullptr);
/// The ReLU's mask comes from `relu_output` (dy counts where y > 0) or, without
/// it, from `relu_affine` (the forward's `saved_affine`, for a ReLU with no
/// addend: dy counts where x * scale + shift > 0, the forward's own arithmetic,
/// so the same mask without reading y: one stream of the two passes fewer).
void batch_norm_backward(const context& ctx, const tensor& x, const tensor& gamma,
                         const tensor& saved_mean, const tensor& saved_invstd, const tensor& dy,
                         tensor& dx, tensor& dgamma, tensor& dbeta, const tensor* relu_output = nullptr,
                         const tensor* relu_affine = nullptr);

// ---------------------------------------------------------------- loss

/// Mean softmax cross-entropy of logits [n, classes] against labels; when
/// dlogits is given it receives d(mean loss)/d(logits). Throws on a label out
/// of range or a non-finite loss.
float softmax_cross_entropy(const context& ctx, const tensor& logits,
                            const std::vector<int32_t>& labels, tensor* dlogits);
/// How many rows of logits have their maximum at the label.
int64_t count_correct(const context& ctx, const tensor& logits, const std::vector<int32_t>& labels);

// ---------------------------------------------------------------- optimizer steps

/// w -= lr * (g + wd * w)
void sgd_step(const context& ctx, tensor& w, const tensor& g, float lr, float weight_decay);
/// y[i] += a * x[i] over raw buffers (a parameter shard's flat state), on the
/// context's threads when n is large.
void axpy(const context& ctx, int64_t n, float a, const float* x, float* y);
/// y[i] = x[i] over raw buffers that do not overlap, on the context's threads when n is large.
void copy(const context& ctx, int64_t n, const float* x, float* y);
/// v = momentum * v + (g + wd * w); w -= lr * (nesterov ? g + momentum * v : v)
void momentum_step(const context& ctx, tensor& w, const tensor& g, tensor& v, float lr,
                   float momentum, float weight_decay, bool nesterov);
/// Adam (Kingma & Ba) with bias correction; `step` counts from 1.
void adam_step(const context& ctx, tensor& w, const tensor& g, tensor& m, tensor& v, float lr,
               float beta1, float beta2, float eps, float weight_decay, int64_t step);

/// One parameter of a multi-tensor step: its value, its gradient and its
/// state (momentum's velocity in s1; Adam's m in s1 and v in s2), one shape.
struct update_slots {
  tensor* w;
  const tensor* g;
  tensor* s1;
  tensor* s2 = nullptr;
  bool decay = true;  ///< the step's weight decay applies to this parameter (AdamW leaves biases and norms out)
};
/// momentum_step on every parameter of `params` in one pass, as PyTorch's
/// multi-tensor ("foreach") optimizers: the elements of all of them are cut
/// into one contiguous range per thread, so that a model's small tensors are
/// not updated on one thread while the others wait, and the threads meet once
/// per step instead of once per tensor. Each element gets the same arithmetic
/// as momentum_step's, so the values are the same bits.
void momentum_steps(const context& ctx, const std::vector<update_slots>& params, float lr, float momentum,
                    float weight_decay, bool nesterov);
/// adam_step on every parameter of `params` in one pass (as momentum_steps).
void adam_steps(const context& ctx, const std::vector<update_slots>& params, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step);
/// adamw_step (kernels/sequence.hpp) on every parameter of `params` in one
/// pass, the decay on those whose `decay` is set.
void adamw_steps(const context& ctx, const std::vector<update_slots>& params, float lr, float beta1,
                 float beta2, float eps, float weight_decay, int64_t step);

/// True when every element is finite.
bool all_finite(const context& ctx, const tensor& t);

} // namespace troupe::kernels
