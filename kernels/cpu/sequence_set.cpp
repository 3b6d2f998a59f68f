// The attention's causal softmax (simd_set.hpp's causal_softmax, called by
// sequence.cpp's attention_forward) over rows of the probabilities, compiled
// once per kernel set like elementwise_set.cpp. The exponential is
// simd_math.hpp's, on a vector at a time; the row's sum is kept in 16 lanes
// (entry j in lane j mod 16: one vector of 16 floats, two of 8 or four of 4)
// and the lanes added in one fixed order. The floats left after the last 16 go
// through the same vectors, the entries after them (which become 0) as +0, or
// through the same expression on a float where the row has no room: every set
// gives the bits of that sum done one float at a time (a test runs it so).
#include <algorithm>
#include <cstdint>

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

} // namespace troupe::kernels::detail::TROUPE_ISA
