// The row kernels of sequence.cpp compiled once per kernel set, like
// elementwise_set.cpp: the attention's causal softmax (simd_set.hpp's
// causal_softmax, called by attention_forward) and layer norm forward and
// backward (layer_norm_forward, _backward, _params).
//
// The softmax's exponential is simd_math.hpp's, on a vector at a time; the
// row's sum is kept in 16 lanes (entry j in lane j mod 16: one vector of 16
// floats, two of 8 or four of 4) and the lanes added in one fixed order. The
// floats left after the last 16 go through the same vectors, the entries after
// them (which become 0) as +0, or through the same expression on a float where
// the row has no room: every set gives the bits of that sum done one float at
// a time (a test runs it so).
//
// Layer norm keeps the bits of the loops before the sets: their row sums in 8
// lanes, as GCC vectorized them at the baseline, on every set; the elementwise
// parts in the set's vectors, dgamma and dbeta in double as before.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/cpu/simd_set.hpp"

namespace troupe::kernels::detail::TROUPE_ISA {

namespace {

constexpr int lanes = 16;
constexpr int vectors = lanes / simd::width;  // per 16 floats
alignas(64) constexpr float lane_index[lanes] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/// The largest of x[0, n), n >= 1; NaN only where x holds one (a row with a NaN becomes NaN whatever this gives).
float row_max(const float* x, int64_t n) {
  float mx = x[0];
  if (n < simd::width) {
    for (int64_t j = 1; j < n; ++j) mx = simd::max(mx, x[j]);
    return mx;
  }
  // The last vector ends at n and may overlap the one before: a maximum does not mind.
  simd::vec m = simd::load(x + n - simd::width);
  for (int64_t j = 0; j + simd::width < n; j += simd::width) m = simd::max(m, simd::load(x + j));
  return simd::max(mx, simd::max_lane(m));
}

/// v's lanes whose index among 16 (vector `at` of a block) is below `keep`; +0 in the others.
inline simd::vec first_lanes(simd::vec v, int at, int64_t keep) {
  return simd::where_positive(static_cast<float>(keep) - simd::load(lane_index + at * simd::width), v);
}

/// e^(x - mx) for the 16 floats at x, those from `keep` on +0, written back and added to the lanes' sums.
inline void exp_block(float* x, float mx, int64_t keep, simd::vec (&sum)[vectors]) {
  for (int v = 0; v < vectors; ++v) {
    simd::vec e = simd::exp_approx(simd::load(x + v * simd::width) - mx);
    if (keep < lanes) e = first_lanes(e, v, keep);
    simd::store(x + v * simd::width, e);
    sum[v] = sum[v] + e;
  }
}

/// x[j] = e^(x[j] - mx) for j < n (a row of `room` floats); returns their sum, the same bits on every set.
/// The n mod 16 floats after the last whole 16 go through one more block where the row has room for it (x[n,
/// ...) become +0 and add +0: s + 0 is s), else one float at a time into the same lanes.
float exp_and_sum(float* x, int64_t n, int64_t room, float mx) {
  simd::vec sum[vectors];
  for (simd::vec& s : sum) s = simd::zero();
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) exp_block(x + j, mx, lanes, sum);
  if (j < n && j + lanes <= room) {
    exp_block(x + j, mx, n - j, sum);
    j = n;
  }
  if (j < n) {  // one float at a time, the lanes through memory
    alignas(64) float s[lanes];
    for (int v = 0; v < vectors; ++v) simd::store(s + v * simd::width, sum[v]);
    for (int k = 0; j < n; ++j, ++k) {
      x[j] = simd::exp_approx(x[j] - mx);
      s[k] += x[j];
    }
    for (int v = 0; v < vectors; ++v) sum[v] = simd::load(s + v * simd::width);
  }
  // The 16 lanes' total by halves: lane k + lane k + 8, then k + 4, k + 2, k + 1 (vectors first, then lanes).
  for (int half = vectors / 2; half >= 1; half /= 2)
    for (int v = 0; v < half; ++v) sum[v] = sum[v] + sum[v + half];
  return simd::sum_halves(sum[0]);
}

/// x[j] *= inv for j < n (a row of `room` floats); the last n mod width in a vector where the row has room
/// (x[n, ...) +0, whatever inv is), else one at a time.
void scale(float* x, int64_t n, int64_t room, float inv) {
  int64_t j = 0;
  for (; j + simd::width <= n; j += simd::width) simd::store(x + j, simd::load(x + j) * inv);
  if (j < n && j + simd::width <= room) simd::store(x + j, first_lanes(simd::load(x + j) * inv, 0, n - j));
  else
    for (; j < n; ++j) x[j] *= inv;
}

} // namespace

void causal_softmax(float* p, int64_t t_len, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    float* row = p + i * t_len;
    const int64_t n = i + 1;
    const float mx = row_max(row, n);
    scale(row, n, t_len, 1.0f / exp_and_sum(row, n, t_len, mx));
    std::fill(row + n, row + t_len, 0.0f);
  }
}

// ---------------------------------------------------------------- layer norm

namespace {

/// 8 floats in GCC's vector type, whatever the set's width (one ymm register at the default baseline, two xmm on
/// one without AVX): the lanes of layer norm's row sums on every set.
using lanes8 = float __attribute__((vector_size(32)));

// Where the flags have no AVX (a baseline below x86-64-v3), GCC warns that load8 returns its 32 bytes by
// another ABI: it does not leave this file (internal linkage, inlined), up to row_backward.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

inline lanes8 load8(const float* p) {
  lanes8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// a b + c, fused where the set's flags have an FMA, as GCC contracts it there (the loops before the sets did, at
/// the baseline): explicit, for the sums' tails, whose products GCC's in-order vectorization leaves unfused.
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__) || defined(__AVX512F__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

/// The lanes added one after another, from +0.
inline float total(const lanes8& s) {
  float t = 0.0f;
  for (int k = 0; k < 8; ++k) t += s[k];
  return t;
}

/// A row's mean and 1 / sqrt(variance + eps). Both sums in the order GCC gave the `omp simd` reductions of
/// sequence.cpp's loops before the sets at the baseline (x86-64-v3: 8 lanes): x[j] in lane j mod 8 up to the last
/// whole 8, the rest in lane 0 one at a time, then total(): the bits of those loops, on every set.
struct row_stats {
  float mean, rstd;
};

row_stats stats_of(const float* x, int64_t n, float eps) {
  const int64_t whole = n / 8 * 8;
  lanes8 s = {};
  for (int64_t j = 0; j < whole; j += 8) s += load8(x + j);
  float s0 = s[0];
  for (int64_t j = whole; j < n; ++j) s0 += x[j];
  s[0] = s0;
  const float mean = total(s) / static_cast<float>(n);
  lanes8 q = {};
  for (int64_t j = 0; j < whole; j += 8) {
    const lanes8 d = load8(x + j) - mean;
    q += d * d;
  }
  float q0 = q[0];
  for (int64_t j = whole; j < n; ++j) q0 = mul_add(x[j] - mean, x[j] - mean, q0);
  q[0] = q0;
  return {mean, 1.0f / std::sqrt(total(q) / static_cast<float>(n) + eps)};
}

/// y = (x - mean) rstd gamma + beta over a row of n, a vector at a time and then a float (the same expression);
/// beta null: + 0, as before the sets.
void normalize(const float* x, const float* gamma, const float* beta, row_stats st, int64_t n, float* y) {
  const auto f = [m = st.mean, s = st.rstd](auto v, auto g, auto b) { return (v - m) * s * g + b; };
  int64_t c = 0;
  if (beta) {
    for (; c + simd::width <= n; c += simd::width)
      simd::store(y + c, f(simd::load(x + c), simd::load(gamma + c), simd::load(beta + c)));
    for (; c < n; ++c) y[c] = f(x[c], gamma[c], beta[c]);
    return;
  }
  for (; c + simd::width <= n; c += simd::width)
    simd::store(y + c, f(simd::load(x + c), simd::load(gamma + c), simd::zero()));
  for (; c < n; ++c) y[c] = f(x[c], gamma[c], 0.0f);
}

/// dx of one row: rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma, xhat = (x - mean) rstd; the two sums in
/// 8 lanes as stats_of's.
void row_backward(const float* x, const float* dy, const float* gamma, float mean, float rstd, int64_t n, float* dx) {
  const int64_t whole = n / 8 * 8;
  lanes8 sg = {}, sgx = {};
  for (int64_t j = 0; j < whole; j += 8) {
    const lanes8 g = load8(dy + j) * load8(gamma + j);
    sg += g;
    sgx += g * (load8(x + j) - mean) * rstd;
  }
  float g0 = sg[0], gx0 = sgx[0];
  for (int64_t j = whole; j < n; ++j) {
    const float g = dy[j] * gamma[j];
    g0 += g;
    gx0 = mul_add(g * (x[j] - mean), rstd, gx0);
  }
  sg[0] = g0;
  sgx[0] = gx0;
  const float mg = total(sg) / static_cast<float>(n), mgx = total(sgx) / static_cast<float>(n);
  const auto f = [&](auto v, auto d, auto g) { return rstd * (d * g - mg - (v - mean) * rstd * mgx); };
  int64_t c = 0;
  for (; c + simd::width <= n; c += simd::width)
    simd::store(dx + c, f(simd::load(x + c), simd::load(dy + c), simd::load(gamma + c)));
  for (; c < n; ++c) dx[c] = f(x[c], dy[c], gamma[c]);
}

#pragma GCC diagnostic pop

/// Half a vector of floats (the low 2 of 4 on the generic set), and as many doubles in GCC's vector type (x86's
/// __m128d ... would not go in a std::vector without its attributes dropped).
constexpr int half = simd::width / 2;
using doubles = double __attribute__((vector_size(half * sizeof(double))));
#if TROUPE_SIMD_WIDTH == 16
using half_floats = __m256;
inline half_floats load_half(const float* p) { return _mm256_loadu_ps(p); }
inline doubles widen(half_floats v) { return (doubles)_mm512_cvtps_pd(v); }
#elif TROUPE_SIMD_WIDTH == 8
using half_floats = __m128;
inline half_floats load_half(const float* p) { return _mm_loadu_ps(p); }
inline doubles widen(half_floats v) { return (doubles)_mm256_cvtps_pd(v); }
#else
using half_floats = __m128;
inline half_floats load_half(const float* p) {  // two floats, p aligned to 4 bytes only: memcpy, not a double load
  double two;
  std::memcpy(&two, p, sizeof two);
  return _mm_castpd_ps(_mm_set_sd(two));
}
inline doubles widen(half_floats v) { return (doubles)_mm_cvtps_pd(v); }
#endif

} // namespace

void layer_norm_forward(const layer_norm_args& a, int64_t r0, int64_t r1, float* y, float* mean, float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * a.cols;
    const row_stats st = stats_of(x, a.cols, a.eps);
    mean[r] = st.mean;
    rstd[r] = st.rstd;
    normalize(x, a.gamma, a.beta, st, a.cols, y + r * a.cols);
  }
}

void layer_norm_backward(const layer_norm_args& a, int64_t r0, int64_t r1, float* dx) {
  for (int64_t r = r0; r < r1; ++r)
    row_backward(a.x + r * a.cols, a.dy + r * a.cols, a.gamma, a.mean[r], a.rstd[r], a.cols, dx + r * a.cols);
}

void layer_norm_params(const layer_norm_args& a, int64_t c0, int64_t c1, float* dgamma, float* dbeta) {
  // The rows one after another, each in vectors of `half` columns and then a column at a time; the sums in double
  // (a float's product is exact there: an FMA or not, the same bits) in memory, a column's in row order.
  const int64_t n = c1 - c0, vectors = n / half;
  std::vector<doubles> sg(static_cast<std::size_t>(vectors)), sb(sg.size());
  std::vector<double> rg(static_cast<std::size_t>(n - vectors * half)), rb(rg.size());
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.cols + c0;
    const float* dy = a.dy + r * a.cols + c0;
    const float m = a.mean[r], s = a.rstd[r];
    for (int64_t v = 0; v < vectors; ++v) {
      const doubles g = widen(load_half(dy + v * half));
      sg[v] += g * widen((load_half(x + v * half) - m) * s);
      sb[v] += g;
    }
    for (std::size_t k = 0; k < rg.size(); ++k) {
      const int64_t c = vectors * half + static_cast<int64_t>(k);
      rg[k] += double(dy[c]) * ((x[c] - m) * s);
      rb[k] += dy[c];
    }
  }
  for (int64_t c = 0; c < n; ++c) {
    const bool in_vector = c < vectors * half;
    const std::size_t k = static_cast<std::size_t>(c - vectors * half);
    dgamma[c0 + c] = static_cast<float>(in_vector ? sg[c / half][c % half] : rg[k]);
    dbeta[c0 + c] = static_cast<float>(in_vector ? sb[c / half][c % half] : rb[k]);
  }
}

} // namespace troupe::kernels::detail::TROUPE_ISA
