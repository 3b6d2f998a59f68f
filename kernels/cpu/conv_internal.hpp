#pragma once

// conv2d's paths, behind kernels::conv2d_forward/backward (dense_conv.cpp):
// im2col + GEMM (dense_conv.cpp), the reference; the direct kernels
// (conv_direct.cpp) and Winograd's (conv_winograd.cpp), compiled once per
// instruction set and reached through simd_set.hpp's active_simd_kernels().
// Shapes are checked and outputs shaped by the callers.

#include "kernels/kernels.hpp"

namespace troupe::kernels::detail {

/// Whether the direct kernels handle `g`: strides 1 and 2, kernels 1, 3, 5, 7.
bool conv2d_direct_supported(const conv2d_geometry& g);
/// Whether the Winograd kernels handle `g`: 3x3, stride 1, padding 0 to 2.
bool conv2d_winograd_supported(const conv2d_geometry& g);
/// The Winograd kernels' output tile side for a pass whose tiles cover an oh x ow plane (y's for
/// the forward pass and the weight gradient, dx's for the data gradient, a convolution of dy):
/// 4 (F(4x4, 3x3)) or 2 (F(2x2, 3x3)); dense_conv.cpp says why.
int winograd_tile_side(int64_t oh, int64_t ow);
/// dx alone by GEMM and col2im, image by image (needs no column buffer).
void conv2d_backward_data_gemm(const context& ctx, const tensor& w, const tensor& dy, const conv2d_geometry& g,
                               tensor& dx);

#ifdef TROUPE_ISA
// The files compiled once per instruction set, in that set's namespace.
namespace TROUPE_ISA {

/// y = conv(x, w) + bias, then max(y, 0) when `relu`. With `window` (relu then set), y and window are
/// conv2d_relu_pool_forward's: the 2x2 pool's maxima and their places (store_pooled).
void conv2d_forward_direct(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                           const conv2d_geometry& g, bool relu, tensor& y, tensor* window, const tensor* input_map);
/// dw, and dx and dbias when not null; dy counts where relu_output > 0 only, when given. With `window`, dy
/// and relu_output are the 2x2 pool's gradient and output (load_pooled); dx then needs stride 1 and
/// padding < kernel. With `dx_addend` (x's shape), dx is the input gradient plus it (add()'s bits).
void conv2d_backward_direct(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                            const tensor* relu_output, const conv2d_geometry& g, tensor* dx,
                            const tensor* dx_addend, tensor& dw, tensor* dbias, const tensor* window,
                            const tensor* input_map);
/// conv2d_forward_direct's and conv2d_backward_direct's contracts, by Winograd's F(2x2, 3x3) or F(4x4, 3x3)
/// (conv_winograd.cpp; winograd_tile_side chooses).
void conv2d_forward_winograd(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                             const conv2d_geometry& g, bool relu, tensor& y, tensor* window,
                             const tensor* input_map);
void conv2d_backward_winograd(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                              const tensor* relu_output, const conv2d_geometry& g, tensor* dx,
                              const tensor* dx_addend, tensor& dw, tensor* dbias, const tensor* window,
                              const tensor* input_map);

// Shared by the direct and Winograd kernels (conv_direct.cpp).

int64_t round_up(int64_t v, int64_t m);
/// Per-thread scratch slots (see conv_direct.cpp's scratch()).
constexpr int scratch_slots = 13;
/// Scratch of the calling thread, kept between calls: one buffer per slot,
/// grown as needed, contents unspecified. The calling thread is also thread 0
/// of a parallel region: what it holds across one uses other slots than the
/// region's body.
float* scratch(int slot, std::size_t n);
/// y [oc, P] = t [P, ocp] transposed, plus bias (when given), plus addend [oc, P] (when given: add()'s
/// bits), then ReLU (when asked).
void store_channels(const float* t, int64_t positions, int64_t ocp, int64_t oc, const float* bias, bool relu,
                    float* y, const float* addend = nullptr);
/// t [P, ocp] = dy [oc, P] transposed (zero in the padding channels), where
/// `mask` (of dy's shape) is > 0 when it is given; adds each channel's sum of
/// t to dbias when given.
void load_positions(const float* dy, const float* mask, int64_t positions, int64_t oc, int64_t ocp, float* t,
                    float* dbias);
/// load_positions of an image x [c][h][w] without mask or sums into rows `cols` positions wide: position
/// (r, q) at t [((r + p) * cols + q + p) * cp]; the rest of t is left as it is. With `map` ([2][cp]:
/// scales, then shifts, zero past c) each value v goes in as max(v * scale + shift, 0) (fused, in the
/// sets with FMA: channel_affine_relu's bits).
void load_positions_padded(const float* x, int64_t h, int64_t w, int64_t c, int64_t cp, int64_t p, int64_t cols,
                           float* t, const float* map = nullptr);
/// dbias [oc] += each channel's sum of t [positions][ocp], position by position (the order
/// load_positions and load_pooled share, so that both give the same bits).
void add_channel_sums(const float* t, int64_t positions, int64_t oc, int64_t ocp, float* dbias);
/// A convolution's output t [oh * ow][ocp] of one image, plus bias (when given), ReLU, then the 2x2 max
/// pool of stride 2: the maxima into y [oc][ph * pw] (ph = oh / 2, pw = ow / 2), each one's place in its
/// window (0 to 3, row by row, as a float) into window [ph * pw][ocp]; the first of equal maxima wins, as
/// in max_pool2d_forward, and the values are store_channels' with relu. Uses scratch slot 9.
void store_pooled(const float* t, int64_t oh, int64_t ow, int64_t ocp, int64_t oc, const float* bias, float* y,
                  float* window);
/// The reverse for the backward pass: t [oh * ow][ocp] = the pool's dy [oc][ph * pw] at each window's
/// maximum (window [ph * pw][ocp]) where the pool's output y is > 0, zero elsewhere and in the padding
/// channels (what max_pool2d_backward and load_positions with the ReLU's mask give); adds each channel's
/// sum to dbias when given. Uses scratch slot 9.
void load_pooled(const float* dy, const float* y, const float* window, int64_t oh, int64_t ow, int64_t oc,
                 int64_t ocp, float* t, float* dbias);
/// A backward pass's output gradient: dy [n, oc, oh, ow], counted where mask (the ReLU's output, when
/// given) is > 0; or, with `window`, the 2x2 pool's dy and output [n, oc, oh / 2, ow / 2] and window
/// [n, oh / 2 * ow / 2, ocp].
struct output_gradient {
  const float* dy;
  const float* mask;
  const float* window;
  int64_t oh, ow, oc, ocp;
  /// Throws, naming `kernel`, where the window's places were written by another kernel set (another ocp).
  static output_gradient of(const tensor& dy, const tensor* relu_output, const tensor* window, int64_t oh,
                            int64_t ow, int64_t oc, int64_t ocp, const char* kernel);
  /// Image i's gradient of the convolution's output, position-major, into t [oh * ow][ocp] (load_positions or
  /// load_pooled); each channel's sum added to dbias when given.
  void load(int64_t i, float* t, float* dbias) const;
};

} // namespace TROUPE_ISA
#endif

} // namespace troupe::kernels::detail
