// The attention's causal softmax in the kernel sets (kernels/cpu/sequence_set.cpp,
// simd_set.hpp's causal_softmax): every set this CPU runs against a naive
// double-precision softmax on row lengths around the vector widths (1, 3, ...,
// 257) from an unaligned start, the masked entries exactly 0 and no row outside
// the range touched; the bits of a scalar model of it (exp_approx on a float,
// the sum in 16 lanes), the same on every set; on NaN, infinities and the
// largest floats what the loop before the sets gave; and attention_forward on
// the active set causal, normalized and the same on one thread and on two.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/cpu/simd_set.hpp"
#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "tests/gradcheck.hpp"
#include "tests/kernels/set_fma.hpp"
#include "tests/kernels/special_floats.hpp"

using namespace troupe;
using namespace troupe::testing;
namespace k = troupe::kernels;
namespace simd = troupe::kernels::simd;

namespace {

const double u = std::ldexp(1.0, -24);  // float's unit roundoff

const std::vector<int64_t> lengths{1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 47, 100, 128, 257};

/// A [t, t] matrix of scores in [lo, hi], one float past an allocation's start (vectors load from any alignment).
struct scores {
  std::vector<float> buf;
  int64_t t;
  float* p() { return buf.data() + 1; }
  float at(int64_t i, int64_t j) const { return buf[static_cast<std::size_t>(1 + i * t + j)]; }
};

scores random_scores(int64_t t, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  scores s{std::vector<float>(static_cast<std::size_t>(t * t + 2)), t};
  for (float& x : s.buf) x = d(rng);
  return s;
}

/// The softmax of x[0, n) in double, with an exact exponential, and what rounding x - max costs a row.
struct reference_row {
  std::vector<double> p, gap;  ///< gap: max - x
  double spread = 0;           ///< the sum of p (max - x): the sum's relative error from rounded gaps, in u
};

reference_row softmax_reference(const float* x, int64_t n) {
  double mx = x[0], sum = 0;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, double(x[j]));
  reference_row r{std::vector<double>(static_cast<std::size_t>(n)), std::vector<double>(static_cast<std::size_t>(n))};
  for (int64_t j = 0; j < n; ++j) {
    r.gap[j] = mx - x[j];
    sum += r.p[j] = std::exp(-r.gap[j]);
  }
  for (int64_t j = 0; j < n; ++j) {
    r.p[j] /= sum;
    r.spread += r.p[j] * r.gap[j];
  }
  return r;
}

/// The error allowed on entry j of a row of n: x - max rounded (|x - max| u, on the entry and, weighted, on
/// the sum), exp_approx's 1 ulp (2u, on the entry and the sum's terms; measured within 1.02 ulp on [-87, 0]),
/// the sum's roundings (n / 16 in a lane, 4 between lanes), the reciprocal and the product, relative; plus,
/// absolute, the clamp of e^x at x = -87 (e^-87 ~ 1.6e-38 for smaller x, then less after the product).
double tolerance(const reference_row& r, int64_t j) {
  const double n = static_cast<double>(r.p.size());
  return (std::ceil(n / 16) + 9 + r.gap[j] + r.spread) * u * r.p[j] + 2e-38;
}

/// The set's kernel written one float at a time: the row's max, e^(x - max) by exp_approx on a float,
/// entry j added to lane j mod 16, the lanes added by halves, then times the sum's reciprocal.
void scalar_model(float* row, int64_t n) {
  float mx = row[0];
  for (int64_t j = 1; j < n; ++j) mx = simd::max(mx, row[j]);
  float lane[16] = {};
  for (int64_t j = 0; j < n; ++j) {
    row[j] = simd::exp_approx(row[j] - mx);
    lane[j % 16] += row[j];
  }
  for (int half = 8; half >= 1; half /= 2)
    for (int k = 0; k < half; ++k) lane[k] += lane[k + half];
  const float inv = 1.0f / lane[0];
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
}

/// The loop of main at 57fd959, before the sets (sequence.cpp's causal_softmax), on row i.
void loop_before_sets(float* row, int64_t i) {
  float mx = row[0];
  for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j <= i; ++j) {
    row[j] = simd::exp_approx(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
}

} // namespace

TEST_CASE("each kernel set's causal softmax matches a double softmax on rows of any length", "[kernels][softmax]") {
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t t : lengths)
      for (float range : {8.0f, 100.0f}) {  // 100: entries below the max by more than 87 reach exp_approx's clamp
        INFO(set << " T " << t << " scores in +-" << range);
        const scores in = random_scores(t, 7 + t, -range, range);
        scores out = in;
        // Rows [i0, i1) in blocks of 13, as attention_forward calls it in blocks of 32.
        for (int64_t i0 = 0; i0 < t; i0 += 13) table->causal_softmax(out.p(), t, i0, std::min(t, i0 + 13));
        CHECK(out.buf.front() == in.buf.front());  // nothing written outside [T, T]
        CHECK(out.buf.back() == in.buf.back());
        int64_t bad = 0, unmasked = 0;
        double worst = 0;
        for (int64_t i = 0; i < t; ++i) {
          const reference_row want = softmax_reference(in.buf.data() + 1 + i * t, i + 1);
          for (int64_t j = 0; j <= i; ++j) {
            const double err = std::abs(out.at(i, j) - want.p[j]), tol = tolerance(want, j);
            worst = std::max(worst, err / tol);
            bad += !(err <= tol);
          }
          for (int64_t j = i + 1; j < t; ++j) unmasked += !same(out.at(i, j), 0.0f);  // +0, not -0
        }
        INFO("worst error / tolerance " << worst);
        CHECK(bad == 0);
        CHECK(unmasked == 0);
      }
}

TEST_CASE("the causal softmax touches only the rows from i0 up to i1", "[kernels][softmax]") {
  for (const auto& [set, table] : k::detail::runnable_simd_kernels()) {
    INFO(set);
    const scores in = random_scores(40, 3, -4, 4);
    scores out = in;
    table->causal_softmax(out.p(), 40, 17, 33);
    CHECK(std::memcmp(out.buf.data(), in.buf.data(), (1 + 17 * 40) * sizeof(float)) == 0);
    CHECK(std::memcmp(out.buf.data() + 1 + 33 * 40, in.buf.data() + 1 + 33 * 40, (7 * 40 + 1) * sizeof(float)) == 0);
    CHECK(out.at(17, 17) != in.at(17, 17));
    CHECK(out.at(32, 32) != in.at(32, 32));
  }
}

namespace {

/// Whether a set contracts a * b + c into an FMA where this file does (set_fma.hpp).
bool contracts_like_tests(const std::string& set) { return set_fuses(set) == tests_fuse; }

} // namespace

TEST_CASE("every set's causal softmax gives the bits of its scalar model", "[kernels][softmax]") {
  // The scalar model runs one float at a time; the sets 4, 8 or 16 at a time, their last floats in one more
  // block. Same bits: the sum's order is the same 16 lanes on every set, and exp_approx on a float is a lane's
  // where both contract alike (on a baseline without FMA, the sets with it agree with each other instead).
  for (int64_t t : lengths) {
    const scores in = random_scores(t, 11 + t, -10, 10);
    scores model = in, fma_sets{};
    for (int64_t i = 0; i < t; ++i) {
      float* row = model.p() + i * t;
      scalar_model(row, i + 1);
      std::fill(row + i + 1, row + t, 0.0f);
    }
    for (const auto& [set, table] : k::detail::runnable_simd_kernels()) {
      INFO(set << " T " << t);
      scores got = in;
      table->causal_softmax(got.p(), t, 0, t);
      if (!contracts_like_tests(set) && fma_sets.buf.empty()) fma_sets = got;
      const scores& want = contracts_like_tests(set) ? model : fma_sets;
      int64_t differ = 0;
      for (int64_t i = 0; i < t; ++i)
        differ += std::memcmp(got.p() + i * t, want.buf.data() + 1 + i * t, t * sizeof(float)) != 0;
      CHECK(differ == 0);
    }
  }
}

namespace {

/// Rows with special values: each a vector of its first entries (the rest of the row finite, in [-3, 3]).
const std::vector<std::vector<float>> special_rows{
    {qnan},           {1.0f, qnan},     {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, qnan},
    {inf_f},          {-1.0f, inf_f},   {-inf_f},
    {-inf_f, -inf_f}, {2.0f, -inf_f},   {-inf_f, 0.5f, -inf_f},
    {big, -big},      {-big, big, 0.0f}, {-0.0f, 0.0f, -0.0f},
    {1e30f, -1e30f},  {-1e30f, -1e30f, -1e30f},
};

} // namespace

TEST_CASE("the causal softmax keeps the old loop's results on NaN, infinities and the largest floats",
          "[kernels][softmax]") {
  // A row up to i with a NaN or +inf, or all -inf, is NaN (inf - inf, NaN - max); a -inf entry among finite
  // ones gets e^-87 / sum (exp_approx's clamp), not 0; big - (-big) overflows to -inf the same way. Each special
  // row is placed at the start of rows 0 .. T - 1 of one matrix: every row length, in a vector and in the tail.
  // Finite results differ from the old loop's only by the sums' order (the old loop's one float after another).
  const int64_t t = 37;
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (std::size_t r = 0; r < special_rows.size(); ++r) {
      INFO(set << " special row " << r);
      scores in = random_scores(t, 13 + r, -3, 3);
      for (int64_t i = 0; i < t; ++i)
        for (std::size_t j = 0; j < special_rows[r].size() && j <= static_cast<std::size_t>(i); ++j)
          in.p()[i * t + static_cast<int64_t>(j)] = special_rows[r][j];
      scores got = in, before = in;
      table->causal_softmax(got.p(), t, 0, t);
      for (int64_t i = 0; i < t; ++i) {
        loop_before_sets(before.p() + i * t, i);
        for (int64_t j = 0; j < t; ++j) {
          const float g = got.at(i, j), b = j <= i ? before.at(i, j) : 0.0f;
          INFO("row " << i << " entry " << j << ": " << g << ", before " << b);
          if (std::isnan(b) || b == 0.0f) CHECK(same(g, b));
          else CHECK(std::abs(g - b) <= (2.0 * (i + 1) + 8) * u * b + 2e-38);  // the two sums' roundings
        }
      }
    }
}

TEST_CASE("attention_forward's probabilities on the active set: causal, normalized, the same on 1 and 2 threads",
          "[kernels][softmax]") {
  // T = 67: blocks of 32 query rows, and rows of every length mod 16.
  const tensor qkv = testing::random_tensor({3, 67, 3 * 12}, 21, -2.0f, 2.0f);
  tensor out1, probs1, out2, probs2;
  k::attention_forward(k::context::with_threads(1), qkv, 3, out1, probs1);
  k::attention_forward(k::context::with_threads(2), qkv, 3, out2, probs2);
  CHECK(std::memcmp(probs1.data(), probs2.data(), probs1.numel() * sizeof(float)) == 0);
  CHECK(std::memcmp(out1.data(), out2.data(), out1.numel() * sizeof(float)) == 0);
  const int64_t t = 67;
  int64_t unmasked = 0;
  double worst = 0;
  for (int64_t row = 0; row < probs1.numel() / t; ++row) {
    const int64_t i = row % t;
    double sum = 0;
    for (int64_t j = 0; j < t; ++j) {
      const float p = probs1.data()[row * t + j];
      if (j > i) unmasked += !same(p, 0.0f);
      else sum += p;
    }
    worst = std::max(worst, std::abs(sum - 1));
  }
  CHECK(unmasked == 0);
  CHECK(worst < 1e-6);
}
