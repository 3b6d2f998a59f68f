// all_finite's scan and dropout_forward's mask in the kernel sets
// (kernels/cpu/elementwise_set.cpp, simd_set.hpp's all_finite and dropout):
// every set this CPU runs against exact references on lengths around the
// vector widths and the scan's blocks (0, 1, 7, 15, 16, 17, 1003, ...) from an
// unaligned start: the scan against std::isfinite with NaN and the infinities
// at every position of short buffers and near the end of long ones; the mask
// and y bit for bit against the loop before the sets (main at e613a43, kept
// below), thresholds on both sides of a hash and above 2^63 included; and the
// public kernels the same on one thread and on two.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/simd_set.hpp"
#include "kernels/kernels.hpp"
#include "tests/gradcheck.hpp"
#include "tests/kernels/special_floats.hpp"

using namespace troupe;
using namespace troupe::testing;
namespace k = troupe::kernels;

namespace {

const std::vector<int64_t> lengths{0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 255, 256, 257, 1003, 4099};

/// n floats one past the start of their allocation (vectors load from any alignment): finite values of every
/// kind (normal, denormal, zeros of both signs, the largest), uniform in [-2, 2] most of them.
std::vector<float> finite_floats(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  const float kinds[] = {big, -big, tiny, -tiny, FLT_MIN, -0.0f, 0.0f, 1e30f};
  std::vector<float> v(static_cast<std::size_t>(n + 1), qnan);  // v[0]: outside the scan
  for (int64_t i = 1; i <= n; ++i) v[i] = i % 5 == 0 ? kinds[(i / 5) % 8] : d(rng);
  return v;
}

/// NaN of both signs (quiet and signalling payloads) and the infinities: every float whose exponent is all ones.
std::vector<float> non_finite() {
  std::vector<float> v{qnan, -qnan, inf_f, -inf_f};
  for (uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu, 0xffffffffu}) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    v.push_back(f);
  }
  return v;
}

bool finite_reference(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

} // namespace

TEST_CASE("each kernel set's all_finite finds a NaN or an infinity at every position of a short buffer",
          "[kernels][elementwise]") {
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t n : lengths) {
      if (n > 300) continue;  // the long ones below
      std::vector<float> v = finite_floats(n, 3 + n);
      INFO(set << " n " << n);
      CHECK(table->all_finite(v.data() + 1, n));
      int64_t missed = 0, wrong = 0;
      for (float bad : non_finite())
        for (int64_t at = 1; at <= n; ++at) {
          const float keep = v[at];
          v[at] = bad;
          missed += table->all_finite(v.data() + 1, n);
          wrong += table->all_finite(v.data() + 1, n) != finite_reference(v.data() + 1, n);
          v[at] = keep;
        }
      CHECK(missed == 0);
      CHECK(wrong == 0);
      CHECK(table->all_finite(v.data() + 1, n));  // v[0], before the range, is NaN: not read
    }
}

TEST_CASE("each kernel set's all_finite finds a NaN or an infinity near the end of a long buffer",
          "[kernels][elementwise]") {
  // The last 40 positions: the last block of 16 vectors, the vectors after it and the floats one at a time.
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t n : {int64_t{1003}, int64_t{4099}, int64_t{1000003}}) {
      std::vector<float> v = finite_floats(n, 5 + n);
      INFO(set << " n " << n);
      CHECK(table->all_finite(v.data() + 1, n));
      int64_t missed = 0;
      for (float bad : {qnan, inf_f, -inf_f})
        for (int64_t at = n - 39; at <= n; ++at) {
          const float keep = v[at];
          v[at] = bad;
          missed += table->all_finite(v.data() + 1, n);
          v[at] = keep;
        }
      v[n / 2] = -inf_f;  // and one in the middle
      CHECK_FALSE(table->all_finite(v.data() + 1, n));
      CHECK(missed == 0);
    }
}

namespace {

// ---------------------------------------------------------------- dropout_forward before the sets (e613a43)

uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// e613a43's loop of dropout_forward, from its hash base on.
void dropout_before_sets(const float* a, uint64_t base, uint64_t threshold, float keep, float* m, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = splitmix(base + static_cast<uint64_t>(i)) >= threshold ? keep : 0.0f;
    o[i] = a[i] * m[i];
  }
}

uint64_t threshold_of(double p) { return static_cast<uint64_t>(p * 18446744073709551616.0); }

/// Thresholds: p = 0, 0.1, 0.5 (2^63), 0.9 (above 2^63: an unsigned comparison), and the hash of element 3 from
/// `base`, and one more (element 3 kept, then dropped: the comparison is >=).
std::vector<uint64_t> thresholds(uint64_t base) {
  const uint64_t h = splitmix(base + 3);
  return {0, threshold_of(0.1), threshold_of(0.5), threshold_of(0.9), h, h + 1};
}

} // namespace

TEST_CASE("each kernel set's dropout mask is the loop before the sets' bit for bit", "[kernels][elementwise]") {
  // Bases near 2^64: the counter wraps around inside a vector.
  const std::vector<uint64_t> bases{0, 12345, splitmix(7 ^ splitmix(3)), ~uint64_t{0} - 5};
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t n : lengths)
      for (uint64_t base : bases)
        for (uint64_t threshold : thresholds(base)) {
          INFO(set << " n " << n << " base " << base << " threshold " << threshold);
          const std::vector<float> x = finite_floats(n, 7 + n);
          const float keep = 1.0f / 0.9f;
          std::vector<float> m(n + 2, -7.0f), y(n + 2, -7.0f), want_m(n + 2, -7.0f), want_y(n + 2, -7.0f);
          table->dropout(x.data() + 1, base, threshold, keep, m.data() + 1, y.data() + 1, n);
          dropout_before_sets(x.data() + 1, base, threshold, keep, want_m.data() + 1, want_y.data() + 1, n);
          CHECK(std::memcmp(m.data(), want_m.data(), m.size() * sizeof(float)) == 0);  // -7 outside [0, n)
          CHECK(std::memcmp(y.data(), want_y.data(), y.size() * sizeof(float)) == 0);
          if (n > 3 && threshold == thresholds(base)[4]) CHECK(m[4] == keep);
          if (n > 3 && threshold == thresholds(base)[5]) CHECK(m[4] == 0.0f);
        }
}

TEST_CASE("dropout_forward keeps e613a43's mask on one thread and on two", "[kernels][elementwise]") {
  // 1000003 floats: two threads cut the range at 500001, where neither part is a whole number of vectors.
  const tensor x = random_tensor({1000003}, 11, -3.0f, 3.0f);
  const float p = 0.3f;
  const uint64_t seed = 99, counter = 17;
  std::vector<float> want_m(1000003), want_y(1000003);
  dropout_before_sets(x.data(), splitmix(seed ^ splitmix(counter)), threshold_of(p), 1.0f / (1.0f - p),
                      want_m.data(), want_y.data(), x.numel());
  for (int threads : {1, 2}) {
    INFO(threads << " thread(s)");
    tensor mask, y;
    k::dropout_forward(k::context::with_threads(threads), x, p, seed, counter, mask, y);
    CHECK(std::memcmp(mask.data(), want_m.data(), want_m.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(y.data(), want_y.data(), want_y.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("all_finite of a tensor is the scan's answer, on one thread and on two", "[kernels][elementwise]") {
  tensor t = random_tensor({300007}, 13);
  for (int threads : {1, 2}) {
    const k::context ctx = k::context::with_threads(threads);
    INFO(threads << " thread(s)");
    CHECK(k::all_finite(ctx, t));
    for (int64_t at : {int64_t{0}, int64_t{150003}, int64_t{300006}}) {
      t.at(at) = -inf_f;
      CHECK_FALSE(k::all_finite(ctx, t));
      t.at(at) = 0.5f;
    }
  }
}
