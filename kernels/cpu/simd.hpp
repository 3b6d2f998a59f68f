#pragma once

// The few vector operations the direct convolution kernels use, on the
// widest instruction set the build targets: AVX-512 (16 floats), AVX2 + FMA
// (8) or SSE2 (4, x86-64's baseline, which builds without -march=native get).

#include <immintrin.h>

namespace troupe::kernels::simd {

#if defined(__AVX512F__)
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
#elif defined(__AVX2__) && defined(__FMA__)
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
#else
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
#endif

/// The sum of v's lanes.
inline float reduce(vec v) {
  alignas(64) float lanes[width];
  store(lanes, v);
  float s = 0.0f;
  for (int i = 0; i < width; ++i) s += lanes[i];
  return s;
}

/// Accumulators a register tile may use: the rest hold loaded operands.
constexpr int accumulators = registers == 32 ? 26 : 12;

} // namespace troupe::kernels::simd
