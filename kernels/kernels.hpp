#pragma once

// The one dispatch header for troupe's kernels: pure functions on tensors,
// forward and backward. Outputs are passed by reference and (re)allocated only
// when their shape differs, so a training loop reuses its buffers.
// Every kernel checks its shapes and throws troupe::shape_error naming the
// kernel, the argument and both shapes.

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace troupe::kernels {

// ---------------------------------------------------------------- runtime

/// Threads used by kernels (OpenMP and OpenBLAS); n <= 0 means all cores.
void set_num_threads(int n);
int num_threads();

/// Makes `t` a tensor of shape `s` on the CPU, reusing its storage when the
/// shape already matches. Contents are unspecified.
void ensure_shape(tensor& t, const shape& s);

// ---------------------------------------------------------------- GEMM

/// Which implementation troupe's GEMM calls. OpenBLAS is the default: it
/// measured faster than Eigen's product on the reference machine (see
/// docs/benchmarks.md).
enum class gemm_backend { openblas, eigen };
void set_gemm_backend(gemm_backend b);
gemm_backend get_gemm_backend();

/// Row-major C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
/// lda/ldb/ldc are row strides of the matrices as stored.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);

/// out = a [m, k] * b [k, n].
void matmul(const tensor& a, const tensor& b, tensor& out);

// ---------------------------------------------------------------- dense

/// y [n, out] = x [n, in] * w^T + bias; w is [out, in], bias [out] or undefined.
void dense_forward(const tensor& x, const tensor& w, const tensor& bias, tensor& y);
/// dw = dy^T x; dbias = column sums of dy (when dbias != nullptr);
/// dx = dy w (when dx != nullptr).
void dense_backward(const tensor& x, const tensor& w, const tensor& dy, tensor* dx, tensor& dw,
                    tensor* dbias);

// ---------------------------------------------------------------- conv2d

struct conv2d_geometry {
  int64_t in_channels = 0, out_channels = 0, kernel = 1, stride = 1, padding = 0;
};

/// The output shape [n, oc, oh, ow] of x [n, c, h, w]; throws on a mismatch.
shape conv2d_output_shape(const shape& x, const conv2d_geometry& g);

/// y = conv(x, w) + bias, w [oc, c, k, k]. `cols` receives the im2col matrices
/// [n, c*k*k, oh*ow] that the backward pass needs.
void conv2d_forward(const tensor& x, const tensor& w, const tensor& bias, const conv2d_geometry& g,
                    tensor& y, tensor& cols);
/// Gradients from dy and the forward pass's `cols`. dx and dbias are skipped
/// when null (the first layer needs no input gradient).
void conv2d_backward(const tensor& w, const tensor& cols, const tensor& dy,
                     const conv2d_geometry& g, const shape& x_shape, tensor* dx, tensor& dw,
                     tensor* dbias);

// ---------------------------------------------------------------- pooling

struct pool2d_geometry {
  int64_t kernel = 2, stride = 2;
};
shape pool2d_output_shape(const shape& x, const pool2d_geometry& g);

/// y = window maxima; argmax holds the flat input index of each maximum.
void max_pool2d_forward(const tensor& x, const pool2d_geometry& g, tensor& y,
                        std::vector<int32_t>& argmax);
void max_pool2d_backward(const tensor& dy, const std::vector<int32_t>& argmax,
                         const shape& x_shape, tensor& dx);
void avg_pool2d_forward(const tensor& x, const pool2d_geometry& g, tensor& y);
void avg_pool2d_backward(const tensor& dy, const pool2d_geometry& g, const shape& x_shape,
                         tensor& dx);

// ---------------------------------------------------------------- activations

/// Activation backward passes take the forward output y.
void relu_forward(const tensor& x, tensor& y);
void relu_backward(const tensor& y, const tensor& dy, tensor& dx);
void tanh_forward(const tensor& x, tensor& y);
void tanh_backward(const tensor& y, const tensor& dy, tensor& dx);
void sigmoid_forward(const tensor& x, tensor& y);
void sigmoid_backward(const tensor& y, const tensor& dy, tensor& dx);

/// Inverted dropout: mask holds 0 or 1/(1-p); y = x * mask. `seed` and
/// `counter` make the mask reproducible.
void dropout_forward(const tensor& x, float p, uint64_t seed, uint64_t counter, tensor& mask,
                     tensor& y);
void dropout_backward(const tensor& dy, const tensor& mask, tensor& dx);

// ---------------------------------------------------------------- batch norm

/// Per-channel batch normalization of x [n, c] or [n, c, h, w].
/// Training: normalizes with the batch statistics, saves mean and 1/std for
/// backward, and updates running statistics (running = (1-m) running + m batch,
/// unbiased variance).
void batch_norm_forward_train(const tensor& x, const tensor& gamma, const tensor& beta, float eps,
                              float momentum, tensor& running_mean, tensor& running_var,
                              tensor& y, tensor& saved_mean, tensor& saved_invstd);
void batch_norm_forward_eval(const tensor& x, const tensor& gamma, const tensor& beta, float eps,
                             const tensor& running_mean, const tensor& running_var, tensor& y);
void batch_norm_backward(const tensor& x, const tensor& gamma, const tensor& saved_mean,
                         const tensor& saved_invstd, const tensor& dy, tensor& dx, tensor& dgamma,
                         tensor& dbeta);

// ---------------------------------------------------------------- loss

/// Mean softmax cross-entropy of logits [n, classes] against labels; when
/// dlogits is given it receives d(mean loss)/d(logits). Throws on a label out
/// of range or a non-finite loss.
float softmax_cross_entropy(const tensor& logits, const std::vector<int32_t>& labels,
                            tensor* dlogits);
/// How many rows of logits have their maximum at the label.
int64_t count_correct(const tensor& logits, const std::vector<int32_t>& labels);

// ---------------------------------------------------------------- optimizer steps

/// w -= lr * (g + wd * w)
void sgd_step(tensor& w, const tensor& g, float lr, float weight_decay);
/// y[i] += a * x[i] over raw buffers (a parameter shard's flat state), on the
/// kernel threads when n is large.
void axpy(int64_t n, float a, const float* x, float* y);
/// y[i] = x[i] over raw buffers that do not overlap, on the kernel threads when n is large.
void copy(int64_t n, const float* x, float* y);
/// v = momentum * v + (g + wd * w); w -= lr * (nesterov ? g + momentum * v : v)
void momentum_step(tensor& w, const tensor& g, tensor& v, float lr, float momentum,
                   float weight_decay, bool nesterov);
/// Adam (Kingma & Ba) with bias correction; `step` counts from 1.
void adam_step(tensor& w, const tensor& g, tensor& m, tensor& v, float lr, float beta1,
               float beta2, float eps, float weight_decay, int64_t step);

/// True when every element is finite.
bool all_finite(const tensor& t);

} // namespace troupe::kernels
