#pragma once

// The kernels written once on simd.hpp's vectors and compiled once per
// instruction set: conv_direct.cpp, conv_winograd.cpp, elementwise_set.cpp,
// sequence_set.cpp and simd_set.cpp go into one CMake object library per set
// (troupe_kernels_generic, _avx2, _avx512), each with its own compiler flags,
// TROUPE_SIMD_WIDTH and TROUPE_ISA, the namespace their code lives in.
// machine.cpp chooses one set when the process starts; the callers
// (dense_conv.cpp, pool.cpp, elementwise.cpp, sequence.cpp) go through
// active_simd_kernels().

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.hpp"

namespace troupe::kernels::detail {

/// Layer norm's operands (sequence.cpp's layer_norm_forward and _backward): x [rows, cols], gamma and beta [cols]
/// (beta null: 0), eps; for the backward pass dy [rows, cols] and the forward pass's mean and rstd [rows].
struct layer_norm_args {
  const float* x;
  int64_t rows, cols;
  const float* gamma;
  const float* beta;
  float eps;
  const float* dy;
  const float* mean;
  const float* rstd;
};

/// One instruction set's compilation of the vector kernels.
struct simd_kernel_set {
  using conv_forward = void (*)(const context&, const tensor& x, const tensor& w, const tensor& bias,
                                const conv2d_geometry&, bool relu, tensor& y, tensor* window,
                                const tensor* input_map);
  using conv_backward = void (*)(const context&, const tensor& x, const tensor& w, const tensor& dy,
                                 const tensor* relu_output, const conv2d_geometry&, tensor* dx,
                                 const tensor* dx_addend, tensor& dw, tensor* dbias, const tensor* window,
                                 const tensor* input_map);
  /// conv_internal.hpp's contracts, by the direct kernels (conv_direct.cpp; no input_map: null), and
  /// Winograd's (x read through input_map where given).
  conv_forward forward_direct;
  conv_backward backward_direct;
  /// The same, by Winograd's F(2x2, 3x3) or F(4x4, 3x3) (conv_winograd.cpp).
  conv_forward forward_winograd;
  conv_backward backward_winograd;
  /// A 2x2 stride-2 max pool of one plane x [h, w] (oh = h / 2, ow = w / 2):
  /// maxima into yo [oh, ow], their flat input indices (`top` + the offset
  /// in the plane) into ao; the first of equal maxima wins (NaN never does).
  void (*max_pool_2x2_plane)(const float* x, int64_t h, int64_t w, int32_t top, float* yo, int32_t* ao);

  using unary = void (*)(const float* x, float* y, int64_t n);
  using binary = void (*)(const float* a, const float* b, float* y, int64_t n);
  /// The elementwise kernels' loops over [0, n) of flat arrays (elementwise_set.cpp), each the
  /// kernel of kernels.hpp or sequence.hpp of its name on one thread's range; y may be an input.
  /// y = a + b, or max(0, a + b) (as relu_forward) when relu.
  void (*add)(const float* a, const float* b, float* y, int64_t n, bool relu);
  /// y = max(0, x): NaN stays NaN, -0 stays -0 (std::max(x, 0.0f)).
  unary relu_forward;
  /// (a, b) = (y, dy): dx = dy where y > 0, else +0 (also where y is NaN).
  binary relu_backward;
  /// Columns [0, cols) of rows [0, rows) of [rows, ld] matrices (a dense layer's gradient behind a ReLU):
  /// g = dy where y > 0, relu_backward's bits (y null: g is not written), and db[j] = 0 + row 0 + row 1 ...
  /// of that gradient's column j, in row order (db null: no sums).
  void (*masked_column_sums)(const float* y, const float* dy, float* g, int64_t ld, int64_t rows, int64_t cols,
                             float* db);
  /// y = tanh(x) (simd_math.hpp's tanh_accurate: within 2.5 ulp), and the logistic sigmoid 1 / (1 + e^-x)
  /// (by exp_approx: within 4.2 ulp where it is a normal float, 9e-8 absolute): the infinities give +-1,
  /// and 1 or 0, as std::tanh and std::exp gave; NaN stays NaN.
  unary tanh_forward;
  unary sigmoid_forward;
  /// (a, b) = (y, dy): dx = dy (1 - y^2); dy y (1 - y).
  binary tanh_backward;
  binary sigmoid_backward;
  /// y = a b (dropout_backward: the mask times dy).
  binary multiply;
  /// GELU's tanh approximation, and (a, b) = (x, dy) its derivative times dy.
  unary gelu_forward;
  binary gelu_backward;
  /// all_finite's scan of x[0, n): false when a float has its exponent bits all ones (NaN or an infinity); a block
  /// of floats at a time, stopping after the first block with one.
  bool (*all_finite)(const float* x, int64_t n);
  /// dropout_forward on [0, n): mask[i] = keep where splitmix64(counter + i) >= threshold, else 0, and y[i] =
  /// x[i] mask[i]: the hash of the loop before the sets, the same mask bits on every set.
  void (*dropout)(const float* x, uint64_t counter, uint64_t threshold, float keep, float* mask, float* y, int64_t n);

  /// Rows [i0, i1) of p [t_len, t_len] (attention_forward's probabilities, sequence_set.cpp): row i
  /// becomes the softmax of its entries j <= i, e^(p - max) by simd_math.hpp's exp_approx, summed in 16
  /// lanes in a fixed order (the same bits on every set); entries j > i become 0. A row with a NaN or
  /// +inf, or all -inf, becomes NaN up to i.
  void (*causal_softmax)(float* p, int64_t t_len, int64_t i0, int64_t i1);
  /// Layer norm forward of rows [r0, r1) (sequence_set.cpp): each row's mean and rstd = 1 / sqrt(variance + eps),
  /// y = (x - mean) rstd gamma + beta. The row's sums in 8 lanes in the order of the loop before the sets at the
  /// baseline (GCC's `omp simd` reduction at AVX2): its bits, on every set.
  void (*layer_norm_forward)(const layer_norm_args& a, int64_t r0, int64_t r1, float* y, float* mean, float* rstd);
  /// dx of rows [r0, r1): rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma, xhat = (x - mean) rstd; the sums
  /// as the forward pass's.
  void (*layer_norm_backward)(const layer_norm_args& a, int64_t r0, int64_t r1, float* dx);
  /// dgamma and dbeta of columns [c0, c1): the sums over the rows, in row order and in double, of dy xhat and dy.
  void (*layer_norm_params)(const layer_norm_args& a, int64_t c0, int64_t c1, float* dgamma, float* dbeta);
};

/// y = f(x) for a tensor, by ranges over ctx's threads (elementwise.cpp).
void apply_ranges(const context& ctx, const tensor& x, tensor& y, simd_kernel_set::unary f);
/// y = f(a, b), a and b (named an and bn in the error of `kernel`) of the same shape.
void apply_ranges(const context& ctx, const tensor& a, const tensor& b, tensor& y, const char* kernel,
                  const char* an, const char* bn, simd_kernel_set::binary f);

#ifdef TROUPE_ISA
// elementwise_set.cpp's loops, in the namespace of the set it is compiled for (simd_set.cpp's table).
namespace TROUPE_ISA {
void add(const float* a, const float* b, float* y, int64_t n, bool relu);
void relu_forward(const float* x, float* y, int64_t n);
void relu_backward(const float* y, const float* dy, float* dx, int64_t n);
void masked_column_sums(const float* y, const float* dy, float* g, int64_t ld, int64_t rows, int64_t cols,
                        float* db);
void tanh_forward(const float* x, float* y, int64_t n);
void sigmoid_forward(const float* x, float* y, int64_t n);
void tanh_backward(const float* y, const float* dy, float* dx, int64_t n);
void sigmoid_backward(const float* y, const float* dy, float* dx, int64_t n);
void multiply(const float* a, const float* b, float* y, int64_t n);
void gelu_forward(const float* x, float* y, int64_t n);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);
bool all_finite(const float* x, int64_t n);
void dropout(const float* x, uint64_t counter, uint64_t threshold, float keep, float* mask, float* y, int64_t n);
// sequence_set.cpp's.
void causal_softmax(float* p, int64_t t_len, int64_t i0, int64_t i1);
void layer_norm_forward(const layer_norm_args& a, int64_t r0, int64_t r1, float* y, float* mean, float* rstd);
void layer_norm_backward(const layer_norm_args& a, int64_t r0, int64_t r1, float* dx);
void layer_norm_params(const layer_norm_args& a, int64_t c0, int64_t c1, float* dgamma, float* dbeta);
} // namespace TROUPE_ISA
#endif

// Each set's table (simd_set.cpp, compiled per set).
namespace generic { const simd_kernel_set& simd_kernels(); }
namespace avx2 { const simd_kernel_set& simd_kernels(); }
namespace avx512 { const simd_kernel_set& simd_kernels(); }

/// The set chosen for this process (machine.cpp), with cpu_kernels_name().
const simd_kernel_set& active_simd_kernels();

/// Each set this CPU runs, by name (cpu_kernel_sets()), widest first: for tests and benchmarks.
std::vector<std::pair<std::string, const simd_kernel_set*>> runnable_simd_kernels();

} // namespace troupe::kernels::detail
