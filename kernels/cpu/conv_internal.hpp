#pragma once

// conv2d's two paths, behind kernels::conv2d_forward/backward: the direct
// kernels (conv_direct.cpp) and im2col + GEMM (dense_conv.cpp), the reference.
// Shapes are checked and outputs shaped by the callers.

#include "kernels/kernels.hpp"

namespace troupe::kernels::detail {

/// Whether the direct kernels handle `g`: strides 1 and 2, kernels 1, 3, 5, 7.
bool conv2d_direct_supported(const conv2d_geometry& g);
/// y = conv(x, w) + bias, then max(y, 0) when `relu`.
void conv2d_forward_direct(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                           const conv2d_geometry& g, bool relu, tensor& y);
/// dw, and dx and dbias when not null; dy counts where relu_output > 0 only, when given.
void conv2d_backward_direct(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                            const tensor* relu_output, const conv2d_geometry& g, tensor* dx, tensor& dw,
                            tensor* dbias);
/// dx alone by GEMM and col2im, image by image (needs no column buffer).
void conv2d_backward_data_gemm(const context& ctx, const tensor& w, const tensor& dy, const conv2d_geometry& g,
                               tensor& dx);

} // namespace troupe::kernels::detail
