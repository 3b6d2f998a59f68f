// One instruction set's table of the vector kernels (simd_set.hpp), and the
// 2x2 max pool, whose AVX-512 path deinterleaves with a permute the
// narrower sets lack. Compiled once per set, like conv_direct.cpp.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/conv_internal.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/simd_set.hpp"

namespace troupe::kernels::detail::TROUPE_ISA {

namespace {

#if TROUPE_SIMD_WIDTH == 16
/// One output row of the 2x2 stride-2 window over input rows r0 and r1 (a
/// row `width` long, starting at flat index `top`), by 16 outputs at a time: the window's
/// four corners deinterleaved from two rows of 32 inputs; masked loads and
/// stores for a short row (14 and 7 in the reference CNN).
void max_pool_2x2_row(const float* r0, const float* r1, int64_t ow, int32_t top, int32_t width, float* yo,
                      int32_t* ao) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i steps[3] = {_mm512_set1_epi32(1), _mm512_set1_epi32(width), _mm512_set1_epi32(width + 1)};
  for (int64_t c = 0; c < ow; c += 16) {
    const int64_t n = std::min<int64_t>(16, ow - c), in = 2 * n;
    const __mmask16 out = static_cast<__mmask16>((1u << n) - 1);
    const __mmask16 lo = in >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << in) - 1);
    const __mmask16 hi = in <= 16 ? 0 : static_cast<__mmask16>((1u << (in - 16)) - 1);
    const float* a = r0 + 2 * c;
    const float* b = r1 + 2 * c;
    const __m512 a0 = _mm512_maskz_loadu_ps(lo, a), a1 = _mm512_maskz_loadu_ps(hi, a + 16);
    const __m512 b0 = _mm512_maskz_loadu_ps(lo, b), b1 = _mm512_maskz_loadu_ps(hi, b + 16);
    const __m512 corners[3] = {_mm512_permutex2var_ps(a0, odd, a1), _mm512_permutex2var_ps(b0, even, b1),
                               _mm512_permutex2var_ps(b0, odd, b1)};
    const __m512i base = _mm512_add_epi32(_mm512_set1_epi32(top + 2 * static_cast<int32_t>(c)), even);
    __m512 best = _mm512_permutex2var_ps(a0, even, a1);
    __m512i arg = base;
    for (int k = 0; k < 3; ++k) {
      const __mmask16 m = _mm512_cmp_ps_mask(corners[k], best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, m, corners[k]);
      arg = _mm512_mask_add_epi32(arg, m, base, steps[k]);
    }
    _mm512_mask_storeu_ps(yo + c, out, best);
    _mm512_mask_storeu_epi32(ao + c, out, arg);
  }
}
#else
/// One output row of the 2x2 stride-2 window over input rows r0 and r1 (a
/// row `width` long, starting at flat index `top`), one output at a time.
void max_pool_2x2_row(const float* r0, const float* r1, int64_t ow, int32_t top, int32_t width, float* yo,
                      int32_t* ao) {
  for (int64_t c = 0; c < ow; ++c) {
    const float a = r0[2 * c], b = r0[2 * c + 1], d = r1[2 * c], e = r1[2 * c + 1];
    const int32_t at = top + 2 * static_cast<int32_t>(c);
    float best = a;
    int32_t arg = at;
    arg = b > best ? at + 1 : arg;
    best = b > best ? b : best;
    arg = d > best ? at + width : arg;
    best = d > best ? d : best;
    arg = e > best ? at + width + 1 : arg;
    best = e > best ? e : best;
    yo[c] = best;
    ao[c] = arg;
  }
}
#endif

void max_pool_2x2_plane(const float* x, int64_t h, int64_t w, int32_t top, float* yo, int32_t* ao) {
  const int64_t oh = h / 2, ow = w / 2;
  for (int64_t r = 0; r < oh; ++r) {
    const float* r0 = x + 2 * r * w;
    max_pool_2x2_row(r0, r0 + w, ow, top + static_cast<int32_t>(2 * r * w), static_cast<int32_t>(w), yo + r * ow,
                     ao + r * ow);
  }
}

const simd_kernel_set table{conv2d_forward_direct, conv2d_backward_direct, conv2d_forward_winograd,
                            conv2d_backward_winograd, max_pool_2x2_plane, add, relu_forward, relu_backward,
                            masked_column_sums, tanh_forward, sigmoid_forward, tanh_backward, sigmoid_backward, multiply, gelu_forward,
                            gelu_backward, all_finite, dropout, causal_softmax, layer_norm_forward,
                            layer_norm_backward, layer_norm_params};

} // namespace

const simd_kernel_set& simd_kernels() { return table; }

} // namespace troupe::kernels::detail::TROUPE_ISA
