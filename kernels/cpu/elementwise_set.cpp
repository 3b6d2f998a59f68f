// The elementwise kernels' loops over a range of flat arrays (simd_set.hpp's
// add ... gelu_backward, all_finite's scan and dropout_forward's mask),
// compiled once per kernel set like conv_direct.cpp. Each kernel's function of
// an element is a generic lambda, run on a vector at a time and then on the
// floats left: the same expression on a float (simd_math.hpp), so an element
// gets the same bits in the tail as in a vector.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/cpu/simd_set.hpp"
#include "kernels/cpu/splitmix.hpp"

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

/// The exponent bits of v (its sign and mantissa cleared), as a float: +inf where v is NaN or an infinity, else a
/// finite float or +0; never NaN, so that max keeps an infinity whichever operand it is.
inline simd::vec exponent_bits(simd::vec v) { return (simd::vec)((simd::ivec)v & 0x7f800000); }
inline bool exponent_all_ones(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}

/// Half a vector's lanes as 64-bit integers (a vector's size): the hashes of a vector of floats are two of them.
using u64vec = uint64_t __attribute__((vector_size(sizeof(simd::vec))));
using i64vec = int64_t __attribute__((vector_size(sizeof(simd::vec))));

/// from, from + 1, ... in the lanes of a u64vec.
inline u64vec counting(uint64_t from) {
  u64vec v;
  for (int l = 0; l < simd::width / 2; ++l) v[l] = from + static_cast<uint64_t>(l);
  return v;
}

/// The int32 lanes 0, 2, 4, ... of (a, b) viewed as one: each 64-bit lane of a and b (all ones or all zeros) as
/// one 32-bit lane.
inline simd::ivec even_lanes(i64vec a, i64vec b) {
  simd::ivec pick;
  for (int l = 0; l < simd::width; ++l) pick[l] = 2 * l;
  return __builtin_shuffle((simd::ivec)a, (simd::ivec)b, pick);
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

namespace {

/// Columns [j, j + V * width) of masked_column_sums, each vector's sum of the rows in a register.
template <int V, bool Masked>
void column_block(const float* y, const float* dy, float* g, int64_t ld, int64_t rows, int64_t j, float* db) {
  simd::vec acc[V];
  for (int v = 0; v < V; ++v) acc[v] = simd::zero();
  for (int64_t i = 0; i < rows; ++i)
    for (int v = 0; v < V; ++v) {
      const int64_t at = i * ld + j + v * simd::width;
      simd::vec gv = simd::load(dy + at);
      if (Masked) {
        gv = simd::where_positive(simd::load(y + at), gv);
        simd::store(g + at, gv);
      }
      acc[v] = simd::add(acc[v], gv);
    }
  if (db)
    for (int v = 0; v < V; ++v) simd::store(db + j + v * simd::width, acc[v]);
}

template <bool Masked>
void masked_columns(const float* y, const float* dy, float* g, int64_t ld, int64_t rows, int64_t cols, float* db) {
  constexpr int64_t four = 4 * simd::width;
  int64_t j = 0;
  for (; j + four <= cols; j += four) column_block<4, Masked>(y, dy, g, ld, rows, j, db);
  for (; j + simd::width <= cols; j += simd::width) column_block<1, Masked>(y, dy, g, ld, rows, j, db);
  for (; j < cols; ++j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < rows; ++i) {
      float gv = dy[i * ld + j];
      if (Masked) g[i * ld + j] = gv = simd::where_positive(y[i * ld + j], gv);
      acc += gv;
    }
    if (db) db[j] = acc;
  }
}

} // namespace

void masked_column_sums(const float* y, const float* dy, float* g, int64_t ld, int64_t rows, int64_t cols,
                        float* db) {
  if (y) masked_columns<true>(y, dy, g, ld, rows, cols, db);
  else if (db) masked_columns<false>(y, dy, g, ld, rows, cols, db);
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

bool all_finite(const float* x, int64_t n) {
  // The floats' exponent bits, their largest by blocks of 16 vectors in 4 independent maxima (infinite: one is
  // NaN or an infinity); a block at a time, so that a bad float ends the scan within a block.
  constexpr int64_t block = 16 * simd::width;
  const float inf = __builtin_inff();
  int64_t i = 0;
  for (; i + block <= n; i += block) {
    simd::vec m[4] = {simd::zero(), simd::zero(), simd::zero(), simd::zero()};
    for (int v = 0; v < 16; ++v) m[v % 4] = simd::max(m[v % 4], exponent_bits(simd::load(x + i + v * simd::width)));
    if (simd::max_lane(simd::max(simd::max(m[0], m[1]), simd::max(m[2], m[3]))) == inf) return false;
  }
  simd::vec m = simd::zero();
  for (; i + simd::width <= n; i += simd::width) m = simd::max(m, exponent_bits(simd::load(x + i)));
  bool bad = simd::max_lane(m) == inf;
  for (; i < n; ++i) bad |= exponent_all_ones(x[i]);
  return !bad;
}

void dropout(const float* x, uint64_t counter, uint64_t threshold, float keep, float* mask, float* y, int64_t n) {
  // A vector's hashes in two halves of 64-bit lanes; lane l of the floats is hash l (the compare's all-ones or
  // zeros, narrowed to 32 bits), and keep's bits where it is kept.
  constexpr int half = simd::width / 2;
  const simd::ivec kept_bits = (simd::ivec)simd::splat(keep);
  const u64vec low = counting(0), high = counting(half);
  int64_t i = 0;
  for (; i + simd::width <= n; i += simd::width) {
    const uint64_t at = counter + static_cast<uint64_t>(i);
    const i64vec a = splitmix(low + at) >= threshold, b = splitmix(high + at) >= threshold;
    const simd::vec m = (simd::vec)(kept_bits & even_lanes(a, b));
    simd::store(mask + i, m);
    simd::store(y + i, simd::load(x + i) * m);
  }
  for (; i < n; ++i) {
    mask[i] = splitmix(counter + static_cast<uint64_t>(i)) >= threshold ? keep : 0.0f;
    y[i] = x[i] * mask[i];
  }
}

} // namespace troupe::kernels::detail::TROUPE_ISA
