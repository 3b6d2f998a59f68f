// The elementwise kernels' loops over a range of flat arrays (simd_set.hpp's
// add ... gelu_backward), compiled once per kernel set like conv_direct.cpp.
// Each kernel's function of an element is a generic lambda, run on a vector
// at a time and then on the floats left: the same expression on a float
// (simd_math.hpp), so an element gets the same bits in the tail as in a vector.
#include <cstdint>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/cpu/simd_set.hpp"

namespace troupe::kernels::detail::TROUPE_ISA {

namespace {

template <class F>
void map1(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + simd::width <= n; i += simd::width) simd::store(y + i, f(simd::load(x + i)));
  for (; i < n; ++i) y[i] = f(x[i]);
}

template <class F>
void map2(const float* a, const float* b, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + simd::width <= n; i += simd::width) simd::store(y + i, f(simd::load(a + i), simd::load(b + i)));
  for (; i < n; ++i) y[i] = f(a[i], b[i]);
}

/// max(0, v) as std::max(v, 0.0f): v where it is NaN or -0.
template <class V>
V relu_of(V v) {
  return simd::max(simd::as<V>(0.0f), v);
}

constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float gelu_c = 0.044715f;

/// tanh(sqrt(2 / pi) (v + 0.044715 v^3)), GELU's approximation of erf(v / sqrt(2)).
template <class V>
V gelu_tanh(V v) {
  return simd::tanh_approx(gelu_k * (v + gelu_c * v * v * v));
}

/// 1 / (1 + e^-v), with e^-v as (e^(-v / 2))^2: the square overflows to inf where e^-v does in float
/// (v below about -88.7), so that sigmoid is 0 there, as 1 / (1 + std::exp(-v)) was, not 1 / (1 + e^88)
/// by exp_approx's clamp. Within 4.2 ulp of sigmoid where that is a normal float, 9e-8 absolute on any
/// float (measured on every float).
template <class V>
V sigmoid_of(V v) {
  const V h = simd::exp_approx(-0.5f * v);
  return 1.0f / (1.0f + h * h);
}

} // namespace

void add(const float* a, const float* b, float* y, int64_t n, bool relu) {
  if (relu) map2(a, b, y, n, [](auto p, auto q) { return relu_of(p + q); });
  else map2(a, b, y, n, [](auto p, auto q) { return p + q; });
}

void relu_forward(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](auto v) { return relu_of(v); });
}

void tanh_forward(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](auto v) { return simd::tanh_accurate(v); });
}

void sigmoid_forward(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](auto v) { return sigmoid_of(v); });
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n) {
  map2(y, dy, dx, n, [](auto v, auto g) { return simd::where_positive(v, g); });
}

void tanh_backward(const float* y, const float* dy, float* dx, int64_t n) {
  map2(y, dy, dx, n, [](auto v, auto g) { return g * (1.0f - v * v); });
}

void sigmoid_backward(const float* y, const float* dy, float* dx, int64_t n) {
  map2(y, dy, dx, n, [](auto v, auto g) { return g * v * (1.0f - v); });
}

void multiply(const float* a, const float* b, float* y, int64_t n) {
  map2(a, b, y, n, [](auto p, auto q) { return p * q; });
}

void gelu_forward(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](auto v) { return 0.5f * v * (1.0f + gelu_tanh(v)); });
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  map2(x, dy, dx, n, [](auto v, auto g) {
    const auto t = gelu_tanh(v);
    const auto dinner = gelu_k * (1.0f + 3.0f * gelu_c * v * v);
    return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
  });
}

} // namespace troupe::kernels::detail::TROUPE_ISA
