#pragma once

// The kernels written once on simd.hpp's vectors and compiled once per
// instruction set: conv_direct.cpp, conv_winograd.cpp and simd_set.cpp go
// into one CMake object library per set (troupe_kernels_generic, _avx2,
// _avx512), each with its own compiler flags, TROUPE_SIMD_WIDTH and
// TROUPE_ISA, the namespace their code lives in. machine.cpp chooses one set
// when the process starts; the callers (dense_conv.cpp, pool.cpp) go through
// active_simd_kernels().

#include <cstdint>

#include "kernels/kernels.hpp"

namespace troupe::kernels::detail {

/// One instruction set's compilation of the vector kernels.
struct simd_kernel_set {
  using conv_forward = void (*)(const context&, const tensor& x, const tensor& w, const tensor& bias,
                                const conv2d_geometry&, bool relu, tensor& y);
  using conv_backward = void (*)(const context&, const tensor& x, const tensor& w, const tensor& dy,
                                 const tensor* relu_output, const conv2d_geometry&, tensor* dx, tensor& dw,
                                 tensor* dbias);
  /// conv_internal.hpp's contracts, by the direct kernels (conv_direct.cpp).
  conv_forward forward_direct;
  conv_backward backward_direct;
  /// The same, by Winograd's F(2x2, 3x3) (conv_winograd.cpp).
  conv_forward forward_winograd;
  conv_backward backward_winograd;
  /// A 2x2 stride-2 max pool of one plane x [h, w] (oh = h / 2, ow = w / 2):
  /// maxima into yo [oh, ow], their flat input indices (`top` + the offset
  /// in the plane) into ao; the first of equal maxima wins (NaN never does).
  void (*max_pool_2x2_plane)(const float* x, int64_t h, int64_t w, int32_t top, float* yo, int32_t* ao);
};

// Each set's table (simd_set.cpp, compiled per set).
namespace generic { const simd_kernel_set& simd_kernels(); }
namespace avx2 { const simd_kernel_set& simd_kernels(); }
namespace avx512 { const simd_kernel_set& simd_kernels(); }

/// The set chosen for this process (machine.cpp), with cpu_kernels_name().
const simd_kernel_set& active_simd_kernels();

} // namespace troupe::kernels::detail
