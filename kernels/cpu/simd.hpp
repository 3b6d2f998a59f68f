#pragma once

// The few vector operations the kernel sets use (the convolutions, the max
// pool, the elementwise loops; simd_math.hpp builds exp and tanh on them), on one
// instruction set: AVX-512 (16 floats), AVX2 + FMA (8) or SSE2 (4, x86-64's
// baseline). A file compiled once per kernel set (CMake's
// troupe_kernels_<set>) gets TROUPE_SIMD_WIDTH from its set; any other file
// the widest width its compiler flags allow. Each width has its own inline
// namespace: files of different widths never share a definition.

#include <immintrin.h>

#include <cstdint>

#ifndef TROUPE_SIMD_WIDTH
#if defined(__AVX512F__)
#define TROUPE_SIMD_WIDTH 16
#elif defined(__AVX2__) && defined(__FMA__)
#define TROUPE_SIMD_WIDTH 8
#else
#define TROUPE_SIMD_WIDTH 4
#endif
#endif

#define TROUPE_SIMD_PASTE(a, b) a##b
#define TROUPE_SIMD_NAME(width) TROUPE_SIMD_PASTE(w, width)
#define TROUPE_SIMD_NAMESPACE TROUPE_SIMD_NAME(TROUPE_SIMD_WIDTH)

namespace troupe::kernels::simd {
inline namespace TROUPE_SIMD_NAMESPACE {

#if TROUPE_SIMD_WIDTH == 16
#ifndef __AVX512F__
#error "TROUPE_SIMD_WIDTH 16 needs AVX-512F in the compiler flags"
#endif
constexpr int width = 16;
constexpr int registers = 32;
using vec = __m512;
inline vec zero() { return _mm512_setzero_ps(); }
inline vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
inline vec splat(float v) { return _mm512_set1_ps(v); }
inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
inline vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
/// g where y > 0, else 0.
inline vec where_positive(vec y, vec g) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), g);
}
inline vec min(vec a, vec b) { return _mm512_min_ps(a, b); }
/// v folded to 4 lanes by halves: lane k + lane k + 8 (or their max), then k + 4.
inline __m128 fold4_add(vec v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
inline __m128 fold4_max(vec v) {
  const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  return _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#elif TROUPE_SIMD_WIDTH == 8
#if !defined(__AVX2__) || !defined(__FMA__)
#error "TROUPE_SIMD_WIDTH 8 needs AVX2 and FMA in the compiler flags"
#endif
constexpr int width = 8;
constexpr int registers = 16;
using vec = __m256;
inline vec zero() { return _mm256_setzero_ps(); }
inline vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline vec splat(float v) { return _mm256_set1_ps(v); }
inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
inline vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
inline vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
inline vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
inline vec where_positive(vec y, vec g) { return _mm256_and_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ), g); }
inline vec min(vec a, vec b) { return _mm256_min_ps(a, b); }
inline __m128 fold4_add(vec v) { return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); }
inline __m128 fold4_max(vec v) { return _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); }
#elif TROUPE_SIMD_WIDTH == 4
constexpr int width = 4;
constexpr int registers = 16;
using vec = __m128;
inline vec zero() { return _mm_setzero_ps(); }
inline vec load(const float* p) { return _mm_loadu_ps(p); }
inline void store(float* p, vec v) { _mm_storeu_ps(p, v); }
inline vec broadcast(const float* p) { return _mm_set1_ps(*p); }
inline vec splat(float v) { return _mm_set1_ps(v); }
inline vec fma(vec a, vec b, vec c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
inline vec add(vec a, vec b) { return _mm_add_ps(a, b); }
inline vec mul(vec a, vec b) { return _mm_mul_ps(a, b); }
inline vec max(vec a, vec b) { return _mm_max_ps(a, b); }
inline vec sub(vec a, vec b) { return _mm_sub_ps(a, b); }
inline vec where_positive(vec y, vec g) { return _mm_and_ps(_mm_cmpgt_ps(y, _mm_setzero_ps()), g); }
inline vec min(vec a, vec b) { return _mm_min_ps(a, b); }
inline __m128 fold4_add(vec v) { return v; }
inline __m128 fold4_max(vec v) { return v; }
#else
#error "TROUPE_SIMD_WIDTH must be 4, 8 or 16"
#endif

/// The lanes' bits as integers: GCC's vector types (simd_math.hpp's operators) keep the bits in a
/// cast between two of one size.
using ivec = int32_t __attribute__((vector_size(sizeof(vec))));
inline vec abs(vec v) { return (vec)((ivec)v & INT32_MAX); }
/// m's magnitude with s's sign bit.
inline vec copysign(vec m, vec s) { return (vec)(((ivec)m & INT32_MAX) | ((ivec)s & INT32_MIN)); }
/// 2^n for integral n in [-126, 127], by its exponent bits.
inline vec pow2(vec n) { return (vec)((__builtin_convertvector(n, ivec) + 127) << 23); }

/// The sum of v's lanes.
inline float reduce(vec v) {
  alignas(64) float lanes[width];
  store(lanes, v);
  float s = 0.0f;
  for (int i = 0; i < width; ++i) s += lanes[i];
  return s;
}

/// The sum of v's lanes by halves: lane k + lane k + width / 2 for k < width / 2, and so on to one lane. A
/// fixed order: a vector of 16 gives the bits of its two halves of 8 added first (sequence_set.cpp's softmax).
inline float sum_halves(vec v) {
  __m128 q = fold4_add(v);
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}

/// The largest of v's lanes (where one is NaN: that or another).
inline float max_lane(vec v) {
  __m128 q = fold4_max(v);
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_max_ss(q, _mm_shuffle_ps(q, q, 1)));
}

/// Accumulators a register tile may use: the rest hold loaded operands.
constexpr int accumulators = registers == 32 ? 26 : 12;

} // namespace w4, w8 or w16, by the width
} // namespace troupe::kernels::simd
