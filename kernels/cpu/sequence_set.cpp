// The attention's causal softmax (simd_set.hpp's causal_softmax, called by
// sequence.cpp's attention_forward) over rows of the probabilities, compiled
// once per kernel set like elementwise_set.cpp. The exponential is
// simd_math.hpp's, on a vector at a time; the row's sum is kept in 16 lanes
// (entry j in lane j mod 16, one vector of 16 floats, two of 8 or four of 4)
// and the lanes added in one fixed order, and the floats left after the last
// 16 go through the same vectors padded, their padding added as +0: every set
// gives the bits of that sum done one float at a time (a test runs it so).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/cpu/simd_set.hpp"

namespace troupe::kernels::detail::TROUPE_ISA {

namespace {

constexpr int lanes = 16;
constexpr int vectors = lanes / simd::width;  // per 16 floats

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
  alignas(64) float lane[simd::width];
  simd::store(lane, m);
  for (float v : lane) mx = simd::max(mx, v);
  return mx;
}

/// e^(x - mx) for 16 floats at x, written back, and added to the lanes' partial sums.
inline void exp_block(float* x, float mx, simd::vec (&sum)[vectors]) {
  for (int v = 0; v < vectors; ++v) {
    const simd::vec e = simd::exp_approx(simd::load(x + v * simd::width) - mx);
    simd::store(x + v * simd::width, e);
    sum[v] = sum[v] + e;
  }
}

/// The 16 lanes' total, by halves: lane k + lane k + 8, then k + 4, k + 2, k + 1.
float total(const simd::vec (&sum)[vectors]) {
  alignas(64) float s[lanes];
  for (int v = 0; v < vectors; ++v) simd::store(s + v * simd::width, sum[v]);
  for (int half = lanes / 2; half >= 1; half /= 2)
    for (int k = 0; k < half; ++k) s[k] += s[k + half];
  return s[0];
}

/// x[j] = e^(x[j] - mx) for j < n; returns their sum (the same bits on every set).
float exp_and_sum(float* x, int64_t n, float mx) {
  simd::vec sum[vectors];
  for (simd::vec& s : sum) s = simd::zero();
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) exp_block(x + j, mx, sum);
  if (j < n) {
    // The last n - j floats in lanes 0 .. n - j - 1; the rest padded with mx and dropped as +0 (s + 0 is s).
    const int64_t left = n - j;
    alignas(64) float pad[lanes];
    std::fill(pad, pad + lanes, mx);
    std::memcpy(pad, x + j, static_cast<std::size_t>(left) * sizeof(float));
    simd::vec none[vectors];
    for (simd::vec& s : none) s = simd::zero();
    exp_block(pad, mx, none);
    std::fill(pad + left, pad + lanes, 0.0f);
    for (int v = 0; v < vectors; ++v) sum[v] = sum[v] + simd::load(pad + v * simd::width);
    std::memcpy(x + j, pad, static_cast<std::size_t>(left) * sizeof(float));
  }
  return total(sum);
}

} // namespace

void causal_softmax(float* p, int64_t t_len, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    float* row = p + i * t_len;
    const int64_t n = i + 1;
    const float mx = row_max(row, n);
    const float inv = 1.0f / exp_and_sum(row, n, mx);
    int64_t j = 0;
    for (; j + simd::width <= n; j += simd::width) simd::store(row + j, simd::load(row + j) * inv);
    for (; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + t_len, 0.0f);
  }
}

} // namespace troupe::kernels::detail::TROUPE_ISA
