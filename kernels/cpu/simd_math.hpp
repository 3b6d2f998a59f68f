#pragma once

// e^x, e^x - 1 and tanh written once for a float and for simd.hpp's vector: the
// elementwise kernels of a set (elementwise_set.cpp) run the same expression
// on a vector at a time and on the floats left, and the attention's softmax
// (sequence_set.cpp) e^x on vectors, as the tests' scalar model of it does on
// floats. Arithmetic is by
// operators, which GCC's vector types have too (a float operand is broadcast),
// so the compiler contracts a * b + c into an FMA alike in both; the rest by
// the overloads below, which give a float what simd.hpp's functions give a
// lane. In simd.hpp's inline namespace: one definition per width.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/simd.hpp"

namespace troupe::kernels::simd {
inline namespace TROUPE_SIMD_NAMESPACE {

/// c as a V: a float or a vec.
template <class V>
inline V as(float c) {
  if constexpr (std::is_same_v<V, float>) return c;
  else return splat(c);
}

// One lane's worth of simd.hpp's functions (max and min as maxps and minps:
// the second operand where either is NaN).
inline float max(float a, float b) { return a > b ? a : b; }
inline float min(float a, float b) { return a < b ? a : b; }
inline float abs(float v) { return std::fabs(v); }
inline float copysign(float m, float s) { return std::copysign(m, s); }
inline float where_positive(float y, float g) { return y > 0.0f ? g : 0.0f; }
/// 2^n for an integer n in [-126, 127] (exp_split's clamp keeps it there). A NaN n (from a NaN x)
/// gives 1, and the NaN goes on through exp_split's q: converting a NaN to an integer is undefined.
inline float pow2(float n) {
  const int32_t k = n == n ? static_cast<int32_t>(n) : 0;
  const uint32_t bits = static_cast<uint32_t>(k + 127) << 23;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

/// e^x = (q + 1) 2^n for x clamped to [-87, 88] (0 and overflow are not needed here; NaN stays NaN):
/// x = n ln 2 + r, |r| <= ln 2 / 2, q = e^r - 1 by Cephes' expf polynomial, 2^n into the exponent.
template <class V>
struct exp_parts {
  V q, pow2n;
};

template <class V>
inline exp_parts<V> exp_split(V x) {
  x = min(as<V>(88.0f), max(as<V>(-87.0f), x));
  constexpr float round = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const V n = (x * 1.44269504088896341f + round) - round;
  const V r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return {p * r * r + r, pow2(n)};
}

/// e^x within 2 ulp for x in [-87, 88] (clamped there, as exp_split).
template <class V>
inline V exp_approx(V x) {
  const exp_parts<V> e = exp_split(x);
  return (e.q + 1.0f) * e.pow2n;
}

/// e^x - 1 for x in [-87, 0] (clamped below), where e^r - 1 never passes through 1: no cancellation
/// near 0. Within 2 ulp (measured on [-87, 0]).
template <class V>
inline V expm1_approx(V x) {
  const exp_parts<V> e = exp_split(x);
  return e.q * e.pow2n + (e.pow2n - 1.0f);
}

/// tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2 |u|): within 2e-7 of tanh (absolute); near 0 its
/// 1 - e cancels (tanh(1e-3) off by 1.5e-5 relative, 0 below 1.5e-8). GELU's, where 1 + tanh hides that.
template <class V>
inline V tanh_approx(V u) {
  const V e = exp_approx(-2.0f * abs(u));
  return copysign((1.0f - e) / (1.0f + e), u);
}

/// tanh(u) = -sign(u) m / (m + 2), m = e^(-2 |u|) - 1 by expm1_approx: within 2.5 ulp of tanh, 1.5e-7
/// absolute (measured on every float) from 0 to the infinities (+-1); tanh_forward's.
template <class V>
inline V tanh_accurate(V u) {
  const V m = expm1_approx(-2.0f * abs(u));
  return copysign(-m / (m + 2.0f), u);
}

} // namespace w4, w8 or w16, by the width
} // namespace troupe::kernels::simd
