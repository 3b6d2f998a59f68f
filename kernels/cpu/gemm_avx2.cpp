// The x86 kernel sets of troupe's own SGEMM. AVX2 + FMA: a 6 x 16
// micro-kernel (12 accumulators, 2 B vectors, 1 broadcast of A: 15 of the 16
// ymm registers). AVX-512: an 8 x 32 one (16 zmm accumulators, 2 B vectors, 1
// broadcast: 19 of 32 registers; 8 rows divide the batches of 64 without an
// edge tile). Both pack with AVX2, transposing 8 x 8 blocks in registers.
//
// Compiled for AVX2 + FMA whatever the build's -march: everything below the
// pragma is. Only functions of this file (internal linkage) may follow it:
// an inline function or template of a header included after it would be
// compiled for AVX2 too, and the linker could keep that copy for every caller.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "kernels/cpu/gemm_own.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define TROUPE_HAVE_AVX2_SET 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#endif

namespace troupe::kernels::detail {
namespace {

constexpr int mr = 6, nr = 16;
constexpr int mr512 = 8, nr512 = 32;

/// C = alpha * acc + beta * C for one row of 16 (beta == 0: C is not read).
inline void store_row(float* c, __m256 lo, __m256 hi, __m256 alpha, float beta) {
  lo = _mm256_mul_ps(lo, alpha);
  hi = _mm256_mul_ps(hi, alpha);
  if (beta != 0.0f) {
    const __m256 b = _mm256_set1_ps(beta);
    lo = _mm256_fmadd_ps(b, _mm256_loadu_ps(c), lo);
    hi = _mm256_fmadd_ps(b, _mm256_loadu_ps(c + 8), hi);
  }
  _mm256_storeu_ps(c, lo);
  _mm256_storeu_ps(c + 8, hi);
}

#define TROUPE_ROW(I)                                   \
  {                                                     \
    const __m256 ai = _mm256_broadcast_ss(a + I);       \
    c##I##0 = _mm256_fmadd_ps(ai, b0, c##I##0);         \
    c##I##1 = _mm256_fmadd_ps(ai, b1, c##I##1);         \
  }

void micro(int64_t k, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int i = 0; i < mr; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
  for (int64_t p = 0; p < k; ++p, a += mr, b += nr) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    TROUPE_ROW(0) TROUPE_ROW(1) TROUPE_ROW(2) TROUPE_ROW(3) TROUPE_ROW(4) TROUPE_ROW(5)
  }
  const __m256 al = _mm256_set1_ps(alpha);
  store_row(c, c00, c01, al, beta);
  store_row(c + ldc, c10, c11, al, beta);
  store_row(c + 2 * ldc, c20, c21, al, beta);
  store_row(c + 3 * ldc, c30, c31, al, beta);
  store_row(c + 4 * ldc, c40, c41, al, beta);
  store_row(c + 5 * ldc, c50, c51, al, beta);
}
#undef TROUPE_ROW

namespace avx512 {  // the name tests/scripts/avx512_confined.sh looks for

__attribute__((target("avx512f"))) void micro(int64_t k, const float* a, const float* b, float* c, int64_t ldc,
                                              float alpha, float beta) {
  __m512 acc[mr512][2];
#pragma GCC unroll 8
  for (int i = 0; i < mr512; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int i = 0; i < mr512; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
  for (int64_t p = 0; p < k; ++p, a += mr512, b += nr512) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 8
    for (int i = 0; i < mr512; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < mr512; ++i) {
    float* ci = c + i * ldc;
    __m512 lo = _mm512_mul_ps(acc[i][0], al), hi = _mm512_mul_ps(acc[i][1], al);
    if (beta != 0.0f) {
      lo = _mm512_fmadd_ps(be, _mm512_loadu_ps(ci), lo);
      hi = _mm512_fmadd_ps(be, _mm512_loadu_ps(ci + 16), hi);
    }
    _mm512_storeu_ps(ci, lo);
    _mm512_storeu_ps(ci + 16, hi);
  }
}

} // namespace avx512

/// Transposes the 8 x 8 block r[0..7] in place (r[i] becomes column i).
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

/// `rows` (<= 8) source rows of contiguous p, at src + i * ld, into
/// dst[p * width + i] for i < min(width, 8) (rows past `rows` zero), p < k:
/// 8 x 8 blocks transposed in registers, the last k % 8 one by one. Each
/// vector store writes 8 floats: with width < 8 the next one overwrites the
/// excess, and the last may write 8 - width floats past p = k.
inline void transpose_rows(const float* src, int64_t ld, int rows, int64_t k, int width, float* dst) {
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(src + i * ld + p) : _mm256_setzero_ps();
    transpose8(r);
    for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + (p + q) * width, r[q]);
  }
  for (; p < k; ++p)
    for (int i = 0; i < (width < 8 ? width : 8); ++i) dst[p * width + i] = i < rows ? src[i * ld + p] : 0.0f;
}

template <int MR>
void pack_a(bool trans, const float* a, int64_t lda, int64_t m, int64_t k, float* dst) {
  static_assert(MR <= 8, "pack_a transposes up to 8 rows at a time");
  for (int64_t i0 = 0; i0 < m; i0 += MR, dst += k * MR) {
    const int rows = m - i0 < MR ? static_cast<int>(m - i0) : MR;
    if (!trans) {
      transpose_rows(a + i0 * lda, lda, rows, k, MR, dst);
    } else if (rows == MR) {
      for (int64_t p = 0; p < k; ++p) std::memcpy(dst + p * MR, a + p * lda + i0, MR * sizeof(float));
    } else {
      for (int64_t p = 0; p < k; ++p)
        for (int i = 0; i < MR; ++i) dst[p * MR + i] = i < rows ? a[p * lda + i0 + i] : 0.0f;
    }
  }
}

template <int NR>
void pack_b(bool trans, const float* b, int64_t ldb, int64_t k, int64_t n, float* dst) {
  static_assert(NR % 8 == 0, "pack_b fills panels by 8 columns");
  for (int64_t j0 = 0; j0 < n; j0 += NR, dst += k * NR) {
    const int cols = n - j0 < NR ? static_cast<int>(n - j0) : NR;
    if (trans) {
      // By 8 columns, each up to 8 source rows transposed (zeros past n); none overwrites the next.
      for (int h = 0; h < NR; h += 8) {
        const int part = cols - h < 0 ? 0 : cols - h > 8 ? 8 : cols - h;
        transpose_rows(part > 0 ? b + (j0 + h) * ldb : b, ldb, part, k, NR, dst + h);
      }
    } else if (cols == NR) {
      for (int64_t p = 0; p < k; ++p)
        for (int h = 0; h < NR; h += 8) _mm256_store_ps(dst + p * NR + h, _mm256_loadu_ps(b + p * ldb + j0 + h));
    } else {
      for (int64_t p = 0; p < k; ++p)
        for (int j = 0; j < NR; ++j) dst[p * NR + j] = j < cols ? b[p * ldb + j0 + j] : 0.0f;
    }
  }
}

const gemm_kernel_set avx2_set{"avx2+fma", mr, nr, micro, pack_a<mr>, pack_b<nr>};
const gemm_kernel_set avx512_set{"avx512", mr512, nr512, avx512::micro, pack_a<mr512>, pack_b<nr512>};

} // namespace
} // namespace troupe::kernels::detail

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#endif

namespace troupe::kernels::detail {

const gemm_kernel_set* avx2_gemm_kernels() {
#ifdef TROUPE_HAVE_AVX2_SET
  return &avx2_set;
#else
  return nullptr;
#endif
}

const gemm_kernel_set* avx512_gemm_kernels() {
#ifdef TROUPE_HAVE_AVX2_SET
  return &avx512_set;
#else
  return nullptr;
#endif
}

} // namespace troupe::kernels::detail
