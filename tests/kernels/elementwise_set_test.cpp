// The elementwise loops of the kernel sets (kernels/cpu/elementwise_set.cpp,
// simd_set.hpp's add ... gelu_backward): every set this CPU runs against naive
// double-precision references on lengths around the vector widths (0, 1, 17,
// 1000003, ...), on NaN, infinities and signed zeros where the kernels define
// a result, and the same bits for an element in a vector or in the tail; the
// public kernels (on the active set) the same on one thread and on two.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/simd_set.hpp"
#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "tests/gradcheck.hpp"
#include "tests/kernels/special_floats.hpp"

using namespace troupe;
using namespace troupe::testing;
namespace k = troupe::kernels;
using set_table = k::detail::simd_kernel_set;

namespace {

const std::vector<int64_t> lengths{0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 1003, 1000003};

std::vector<float> random_floats(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

double gelu_tanh(double x) { return std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)); }

/// A kernel on two inputs (a unary one ignores b): its entry point run on n floats, its reference
/// in double with the error allowed there, and the inputs' range.
struct binary_case {
  std::string name;
  std::function<void(const set_table&, const float*, const float*, float*, int64_t)> run;
  std::function<double(double, double)> want;
  std::function<double(double, double)> tolerance;
  float lo, hi;
};

const double ulp = std::ldexp(1.0, -23);  // float's relative spacing at 1
/// tanh_forward's and sigmoid_forward's bounds, absolute on any float and in float's spacing at the result
/// (for sigmoid where the result is a normal float: x above -87.3). Measured on every float (avx2+fma):
/// tanh within 1.49e-7 and 2.50 ulp, sigmoid within 8.93e-8 and 4.11 ulp; std::tanh and std::exp were
/// within 2.1 and 2.3 ulp (every 61st float).
const double tanh_bound = 2e-7, tanh_ulps = 3, sigmoid_bound = 1e-7, sigmoid_ulps = 5;
/// Float's spacing at r (at a denormal or 0: the denormals').
double ulp_at(double r) { return std::ldexp(1.0, std::max(std::ilogb(r), -126) - 23); }
double tanh_tolerance(double x) { return std::min(tanh_bound, tanh_ulps * ulp_at(std::tanh(x))); }
double sigmoid_tolerance(double x) {
  const double s = sigmoid(x);
  return s < FLT_MIN ? sigmoid_bound : std::min(sigmoid_bound, sigmoid_ulps * ulp_at(s));
}

std::vector<binary_case> cases() {
  auto unary = [](set_table::unary set_table::*f) {
    return [f](const set_table& s, const float* a, const float*, float* y, int64_t n) { (s.*f)(a, y, n); };
  };
  auto binary = [](set_table::binary set_table::*f) {
    return [f](const set_table& s, const float* a, const float* b, float* y, int64_t n) { (s.*f)(a, b, y, n); };
  };
  auto rounding = [](double a, double b) { return ulp * std::abs(a + b); };
  return {
      {"add", [](const set_table& s, const float* a, const float* b, float* y, int64_t n) { s.add(a, b, y, n, false); },
       [](double a, double b) { return a + b; }, rounding, -1, 1},
      {"add relu", [](const set_table& s, const float* a, const float* b, float* y, int64_t n) { s.add(a, b, y, n, true); },
       [](double a, double b) { return std::max(a + b, 0.0); }, rounding, -1, 1},
      {"relu_forward", unary(&set_table::relu_forward), [](double a, double) { return std::max(a, 0.0); },
       [](double, double) { return 0.0; }, -1, 1},
      {"relu_backward", binary(&set_table::relu_backward), [](double y, double g) { return y > 0 ? g : 0.0; },
       [](double, double) { return 0.0; }, -1, 1},
      {"tanh_forward", unary(&set_table::tanh_forward), [](double x, double) { return std::tanh(x); },
       [](double x, double) { return tanh_tolerance(x); }, -12, 12},
      {"sigmoid_forward", unary(&set_table::sigmoid_forward), [](double x, double) { return sigmoid(x); },
       [](double x, double) { return sigmoid_tolerance(x); }, -24, 24},
      {"tanh_backward", binary(&set_table::tanh_backward), [](double y, double g) { return g * (1 - y * y); },
       [](double y, double g) { return 3 * ulp * std::abs(g) * (1 + y * y); }, -1, 1},
      {"sigmoid_backward", binary(&set_table::sigmoid_backward), [](double y, double g) { return g * y * (1 - y); },
       [](double y, double g) { return 3 * ulp * std::abs(g * y) * (1 + std::abs(y)); }, 0, 1},
      {"multiply", binary(&set_table::multiply), [](double a, double b) { return a * b; },
       [](double a, double b) { return ulp * std::abs(a * b); }, -2, 2},
      {"gelu_forward", unary(&set_table::gelu_forward), [](double x, double) { return 0.5 * x * (1 + gelu_tanh(x)); },
       [](double x, double) { return 2e-7 * (1 + std::abs(x)); }, -10, 10},
      {"gelu_backward", binary(&set_table::gelu_backward),
       [](double x, double g) {
         const double t = gelu_tanh(x), k = std::sqrt(2 / M_PI), c = 0.044715;
         return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x));
       },
       [](double x, double g) { return 2e-7 * std::abs(g) * (1 + x * x); }, -10, 10},
  };
}

} // namespace

TEST_CASE("each kernel set's elementwise loops match double references on any length", "[kernels][elementwise]") {
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (const binary_case& c : cases())
      for (int64_t n : lengths) {
        INFO(set << " " << c.name << " n " << n);
        // One float past the start: vectors load from addresses of any alignment.
        std::vector<float> a = random_floats(n + 1, 1 + n, c.lo, c.hi), b = random_floats(n + 1, 2 + n, -2, 2);
        std::vector<float> y(static_cast<std::size_t>(n + 2), -7.0f);
        c.run(*table, a.data() + 1, b.data() + 1, y.data() + 1, n);
        CHECK(y.front() == -7.0f);  // nothing written outside [0, n)
        CHECK(y.back() == -7.0f);
        int64_t bad = 0;
        double worst = 0;
        for (int64_t i = 1; i <= n; ++i) {
          const double want = c.want(a[i], b[i]), err = std::abs(y[i] - want);
          worst = std::max(worst, err / std::max(c.tolerance(a[i], b[i]), 1e-300));
          bad += !(err <= c.tolerance(a[i], b[i]));
        }
        INFO("worst error / tolerance " << worst);
        CHECK(bad == 0);
      }
}

TEST_CASE("an element gets the same bits in a vector and in the scalar tail", "[kernels][elementwise]") {
  // Run on [s, 53) for each shift s < 16: every element lies in a vector for some s and in the tail for others.
  const int64_t n = 53;
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (const binary_case& c : cases()) {
      INFO(set << " " << c.name);
      const std::vector<float> a = random_floats(n, 3, c.lo, c.hi), b = random_floats(n, 4, -2, 2);
      std::vector<float> whole(n), part(n);
      c.run(*table, a.data(), b.data(), whole.data(), n);
      for (int64_t s = 1; s < 16; ++s) {
        c.run(*table, a.data() + s, b.data() + s, part.data() + s, n - s);
        CHECK(std::memcmp(whole.data() + s, part.data() + s, (n - s) * sizeof(float)) == 0);
      }
    }
}

namespace {

/// 53 floats cycling through `values` from `start`: each value lands in a vector and in the tail.
std::vector<float> cycle(const std::vector<float>& values, std::size_t start) {
  std::vector<float> v(53);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = values[(start + i) % values.size()];
  return v;
}

const std::vector<float> specials{qnan, inf_f, -inf_f, -0.0f, 0.0f, tiny, -tiny, big, -big, 1.0f, -1.0f, -2.5f, 3.0f};

} // namespace

TEST_CASE("ReLU and add keep what the scalar loops gave NaN, infinities and -0", "[kernels][elementwise]") {
  // std::max(v, 0.0f) returns v unless v < 0: NaN stays NaN and -0 stays -0; relu_backward passes dy only where
  // y > 0 (not where y is NaN). The sums as IEEE floats (inf - inf is NaN).
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (std::size_t start = 0; start < specials.size(); ++start) {
      INFO(set << " start " << start);
      const std::vector<float> a = cycle(specials, start), b = cycle(specials, start * 7 + 3);
      std::vector<float> r(a.size()), d(a.size()), s(a.size()), sr(a.size());
      table->relu_forward(a.data(), r.data(), 53);
      table->relu_backward(a.data(), b.data(), d.data(), 53);
      table->add(a.data(), b.data(), s.data(), 53, false);
      table->add(a.data(), b.data(), sr.data(), 53, true);
      for (std::size_t i = 0; i < a.size(); ++i) {
        INFO("a " << a[i] << " b " << b[i]);
        CHECK(same(r[i], std::max(a[i], 0.0f)));
        CHECK(same(d[i], a[i] > 0.0f ? b[i] : 0.0f));
        CHECK(same(s[i], a[i] + b[i]));
        CHECK(same(sr[i], std::max(a[i] + b[i], 0.0f)));
      }
      CHECK(std::signbit(r[(specials.size() - start + 3) % specials.size()]));  // relu(-0) is -0
    }
}

TEST_CASE("gelu's results on NaN, infinities, signed zeros and the largest floats", "[kernels][elementwise]") {
  // gelu(-inf) is NaN, as it was before the kernel sets: 0.5 v (1 + tanh) is -inf * 0. A float below
  // about -7e12 has v^3 = -inf, tanh = -1 and gelu = -0. The derivative is NaN at both infinities (inf * 0).
  const std::vector<std::pair<float, float>> forward{{qnan, qnan}, {inf_f, inf_f},  {-inf_f, qnan},    {-0.0f, -0.0f},
                                                     {0.0f, 0.0f}, {big, big}, {-big, -0.0f}, {-1e4f, -0.0f}};
  const std::vector<std::pair<float, float>> backward{{qnan, qnan}, {inf_f, qnan}, {-inf_f, qnan},  {-0.0f, 0.5f},
                                                      {0.0f, 0.5f}, {1e4f, 1.0f}, {-1e4f, 0.0f}};
  for (const auto& [set, table] : k::detail::runnable_simd_kernels()) {
    INFO(set);
    for (const auto& [v, want] : forward) {
      const std::vector<float> x(21, v);
      std::vector<float> y(21);
      table->gelu_forward(x.data(), y.data(), 21);
      INFO("gelu(" << v << ") = " << y[0] << " and " << y[20]);
      CHECK((same(y[0], want) && same(y[20], want)));
    }
    for (const auto& [v, want] : backward) {
      const std::vector<float> x(21, v), one(21, 1.0f);
      std::vector<float> dx(21);
      table->gelu_backward(x.data(), one.data(), dx.data(), 21);
      INFO("gelu'(" << v << ") = " << dx[0] << " and " << dx[20]);
      CHECK((same(dx[0], want) && same(dx[20], want)));
    }
  }
}

namespace {

/// Inputs over the whole float range, each with both signs: the values at the edges of tanh's and
/// sigmoid's regimes (0, the denormals, 1e-3, e^-x's overflow at 88.7, the largest floats, infinity)
/// and every 65537th positive float (about 32 600, from the denormals to FLT_MAX).
std::vector<float> wide_floats() {
  std::vector<float> v{0.0f, tiny, FLT_MIN, 1e-30f, 1e-7f, 1e-3f, 0.1f, 0.5f, 1.0f, 2.0f, 5.0f,  9.0f, 17.0f,
                       20.0f, 44.0f, 87.0f, 88.0f, 88.7f, 89.0f, 100.0f, 1e4f, 1e30f, big,  inf_f};
  for (uint32_t bits = 1; bits < 0x7f800000u; bits += 65537) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    v.push_back(f);
  }
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

} // namespace

TEST_CASE("tanh and sigmoid forward hold their bounds on any float, in vectors and in the tail",
          "[kernels][elementwise]") {
  // The inputs cut into runs of n: 1 and 7 all in the scalar tail, 16 all in vectors, 15, 17 and 1003 in both.
  const std::vector<float> x = wide_floats();
  const auto size = static_cast<int64_t>(x.size());
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t n : {1, 7, 15, 16, 17, 1003}) {
      std::vector<float> t(x.size()), s(x.size());
      for (int64_t i = 0; i < size; i += n) {
        table->tanh_forward(x.data() + i, t.data() + i, std::min(n, size - i));
        table->sigmoid_forward(x.data() + i, s.data() + i, std::min(n, size - i));
      }
      int64_t bad = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const bool ok = std::abs(t[i] - std::tanh(static_cast<double>(x[i]))) <= tanh_tolerance(x[i]) &&
                        std::abs(s[i] - sigmoid(x[i])) <= sigmoid_tolerance(x[i]);
        if (!ok && bad++ < 5) UNSCOPED_INFO(x[i] << ": tanh " << t[i] << ", sigmoid " << s[i]);
      }
      INFO(set << " n " << n);
      CHECK(bad == 0);
    }
}

TEST_CASE("tanh and sigmoid forward on NaN, infinities, signed zeros and the largest floats",
          "[kernels][elementwise]") {
  // What std::tanh and 1 / (1 + std::exp(-v)) gave before the kernel sets: e^-v overflows to inf below
  // about -88.7, where sigmoid is 0.
  const std::vector<std::pair<float, float>> tanh_of{{qnan, qnan}, {inf_f, 1.0f}, {-inf_f, -1.0f}, {-0.0f, -0.0f},
                                                     {0.0f, 0.0f},  {big, 1.0f},  {-big, -1.0f},   {-1e30f, -1.0f}};
  const std::vector<std::pair<float, float>> sigmoid_of{{qnan, qnan}, {inf_f, 1.0f}, {-inf_f, 0.0f}, {-0.0f, 0.5f},
                                                        {0.0f, 0.5f}, {big, 1.0f},   {-big, 0.0f},   {-89.0f, 0.0f},
                                                        {100.0f, 1.0f}};
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (const auto& [kernel, values] : {std::pair{table->tanh_forward, tanh_of}, {table->sigmoid_forward, sigmoid_of}})
      for (const auto& [v, want] : values) {
        const std::vector<float> x(21, v);
        std::vector<float> y(21);
        kernel(x.data(), y.data(), 21);
        INFO(set << ": f(" << v << ") = " << y[0] << " and " << y[20] << ", want " << want);
        CHECK((same(y[0], want) && same(y[20], want)));
      }
}

TEST_CASE("the public elementwise kernels give the same bits on one thread and on two", "[kernels][elementwise]") {
  // 1000003 floats: two threads cut the range at 500001, where neither part is a whole number of vectors.
  const shape s{1000003};
  const tensor x = testing::random_tensor(s, 5, -6.0f, 6.0f), g = testing::random_tensor(s, 6);
  const k::context one = k::context::with_threads(1), two = k::context::with_threads(2);
  auto check_same = [](const tensor& p, const tensor& q) {
    REQUIRE(p.shape() == q.shape());
    CHECK(std::memcmp(p.data(), q.data(), p.numel() * sizeof(float)) == 0);
  };
  std::vector<std::function<void(const k::context&, tensor&)>> kernels{
      [&](const k::context& c, tensor& y) { k::add(c, x, g, y, true); },
      [&](const k::context& c, tensor& y) { k::relu_forward(c, x, y); },
      [&](const k::context& c, tensor& y) { k::relu_backward(c, x, g, y); },
      [&](const k::context& c, tensor& y) { k::tanh_forward(c, x, y); },
      [&](const k::context& c, tensor& y) { k::sigmoid_forward(c, x, y); },
      [&](const k::context& c, tensor& y) { k::tanh_backward(c, g, x, y); },
      [&](const k::context& c, tensor& y) { k::sigmoid_backward(c, g, x, y); },
      [&](const k::context& c, tensor& y) { k::dropout_backward(c, x, g, y); },
      [&](const k::context& c, tensor& y) { k::gelu_forward(c, x, y); },
      [&](const k::context& c, tensor& y) { k::gelu_backward(c, x, g, y); },
  };
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    INFO("kernel " << i);
    tensor y1, y2;
    kernels[i](one, y1);
    kernels[i](two, y2);
    check_same(y1, y2);
  }
  tensor y;
  k::add(two, x, g, y);
  tensor in_place = x.clone();
  k::add(two, in_place, g, in_place);  // y may be an input
  check_same(y, in_place);
}

TEST_CASE("each kernel set's masked column sums: relu_backward's mask and row-ordered sums, any width",
          "[kernels][elementwise]") {
  // A block of columns of a wider matrix (ld > cols, starting one float in): the mask where y > 0 (NaN and -0
  // count as not positive), the columns' sums in row order as a float loop gives them, nothing written
  // outside the block; without y, g is not touched and only the sums come out.
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t cols : {0, 1, 5, 16, 17, 64, 67, 130})
      for (int64_t rows : {1, 3, 64}) {
        INFO(set << " rows " << rows << " cols " << cols);
        const int64_t ld = cols + 5;
        std::vector<float> y = random_floats(rows * ld + 1, 3 + cols, -1, 1);
        const std::vector<float> dy = random_floats(rows * ld + 1, 4 + cols, -2, 2);
        for (std::size_t i = 0; i < y.size(); i += 5) y[i] = i % 2 ? -0.0f : std::nanf("");
        std::vector<float> g(y.size(), -7.0f), db(static_cast<std::size_t>(cols + 2), -7.0f);
        table->masked_column_sums(y.data() + 1, dy.data() + 1, g.data() + 1, ld, rows, cols, db.data() + 1);
        std::vector<float> g_plain(y.size(), -7.0f), db_plain(db.size(), -7.0f);
        table->masked_column_sums(nullptr, dy.data() + 1, g_plain.data() + 1, ld, rows, cols, db_plain.data() + 1);
        int64_t bad = 0;
        for (int64_t j = 0; j < cols; ++j) {
          float sum = 0.0f, plain = 0.0f;
          for (int64_t i = 0; i < rows; ++i) {
            const std::size_t at = static_cast<std::size_t>(1 + i * ld + j);
            const float want = y[at] > 0.0f ? dy[at] : 0.0f;
            bad += std::memcmp(&g[at], &want, 4) != 0;
            sum += want;
            plain += dy[at];
          }
          bad += std::memcmp(&db[static_cast<std::size_t>(1 + j)], &sum, 4) != 0;
          bad += std::memcmp(&db_plain[static_cast<std::size_t>(1 + j)], &plain, 4) != 0;
        }
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = cols; j < ld; ++j) bad += g[static_cast<std::size_t>(1 + i * ld + j)] != -7.0f;
        CHECK(bad == 0);
        CHECK(g.front() == -7.0f);
        CHECK(db.front() == -7.0f);
        CHECK(db.back() == -7.0f);
        CHECK(std::all_of(g_plain.begin(), g_plain.end(), [](float v) { return v == -7.0f; }));
      }
}
