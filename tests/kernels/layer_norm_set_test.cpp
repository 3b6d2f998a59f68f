// Layer norm in the kernel sets (kernels/cpu/sequence_set.cpp, simd_set.hpp's
// layer_norm_forward, _backward and _params): every set this CPU runs against
// double-precision references on rows of lengths around the vector widths (1,
// 7, 15, 16, 17, ..., 1003) from an unaligned start, with and without beta,
// within bounds derived from the sums' roundings; the bits of a scalar model of
// the loops before the sets (their 8-lane sums, as GCC vectorized them at the
// baseline), the same on every set; only the rows or columns asked for
// written; and the public kernels on the active set the same on 1 and 2 threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/simd_set.hpp"
#include "kernels/sequence.hpp"
#include "tests/gradcheck.hpp"
#include "tests/kernels/set_fma.hpp"

using namespace troupe;
using namespace troupe::testing;
namespace k = troupe::kernels;
using k::detail::layer_norm_args;

namespace {

const std::vector<int64_t> widths{1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 128, 1003};
const double u = std::ldexp(1.0, -24);  // float's unit roundoff
const float eps = 1e-5f;

/// Layer norm's operands for `rows` rows of `cols`, each array one float past its allocation's start (vectors
/// load from any alignment); x uniform in offset +- scale, gamma in [0.5, 1.5], beta and dy in [-1, 1].
struct operands {
  int64_t rows, cols;
  std::vector<float> x, gamma, beta, dy;
  layer_norm_args args(bool with_beta, const float* mean = nullptr, const float* rstd = nullptr) const {
    return {x.data() + 1, rows, cols, gamma.data() + 1, with_beta ? beta.data() + 1 : nullptr, eps, dy.data() + 1,
            mean, rstd};
  }
};

std::vector<float> uniform(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n + 1));
  for (float& f : v) f = d(rng);
  return v;
}

operands make(int64_t rows, int64_t cols, uint64_t seed, float offset, float scale) {
  return {rows, cols, uniform(rows * cols, seed, offset - scale, offset + scale), uniform(cols, seed + 1, 0.5f, 1.5f),
          uniform(cols, seed + 2, -1, 1), uniform(rows * cols, seed + 3, -1, 1)};
}

/// A set's outputs, each array with a sentinel on both sides (index 0 and the last).
struct outputs {
  std::vector<float> y, mean, rstd, dx, dgamma, dbeta;
};

outputs sentinels(const operands& o) {
  const auto n = static_cast<std::size_t>(o.rows * o.cols + 2), r = static_cast<std::size_t>(o.rows + 2),
             c = static_cast<std::size_t>(o.cols + 2);
  return {std::vector<float>(n, -7.0f), std::vector<float>(r, -7.0f), std::vector<float>(r, -7.0f),
          std::vector<float>(n, -7.0f), std::vector<float>(c, -7.0f), std::vector<float>(c, -7.0f)};
}

/// The forward pass (rows in two calls: [0, rows / 3) and the rest), then the backward pass on its mean and rstd
/// (rows in two calls, the columns in two: [0, cols / 2) and the rest).
outputs run_set(const k::detail::simd_kernel_set& s, const operands& o, bool with_beta) {
  outputs r = sentinels(o);
  const int64_t rs = o.rows / 3, cs = o.cols / 2;
  for (auto [r0, r1] : {std::pair{int64_t{0}, rs}, {rs, o.rows}})
    s.layer_norm_forward(o.args(with_beta), r0, r1, r.y.data() + 1, r.mean.data() + 1, r.rstd.data() + 1);
  const layer_norm_args a = o.args(with_beta, r.mean.data() + 1, r.rstd.data() + 1);
  for (auto [r0, r1] : {std::pair{int64_t{0}, rs}, {rs, o.rows}}) s.layer_norm_backward(a, r0, r1, r.dx.data() + 1);
  for (auto [c0, c1] : {std::pair{int64_t{0}, cs}, {cs, o.cols}})
    s.layer_norm_params(a, c0, c1, r.dgamma.data() + 1, r.dbeta.data() + 1);
  return r;
}

bool sentinels_kept(const outputs& r) {
  bool ok = true;
  for (const auto* v : {&r.y, &r.mean, &r.rstd, &r.dx, &r.dgamma, &r.dbeta})
    ok &= v->front() == -7.0f && v->back() == -7.0f;
  return ok;
}

/// Counts the entries of got (one past its start) off want by more than tol(i), noting the worst ratio.
template <class Want, class Tol>
int64_t count_off(const std::vector<float>& got, int64_t n, Want want, Tol tol, double& worst) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::abs(got[i + 1] - want(i)), t = tol(i);
    worst = std::max(worst, err / t);
    bad += !(err <= t);
  }
  return bad;
}

/// The forward pass of row r in double, and the error each output may carry: the sums in float (n / 8 + 8
/// additions a term at most), x - mean and the products rounded (first order, doubled).
struct row_forward {
  double mean, rstd, mean_tol, rstd_tol;
};

row_forward forward_reference(const float* x, int64_t n) {
  const double k = std::ceil(n / 8.0) + 9;
  double sum = 0, abs_sum = 0, sq = 0, dev = 0;
  for (int64_t j = 0; j < n; ++j) sum += x[j], abs_sum += std::abs(x[j]);
  const double mean = sum / n, mean_tol = 2 * k * u * abs_sum / n;
  for (int64_t j = 0; j < n; ++j) sq += (x[j] - mean) * (x[j] - mean), dev += std::abs(x[j] - mean);
  const double var = sq / n, rstd = 1 / std::sqrt(var + eps);
  const double var_err = 2 * dev * mean_tol / n + mean_tol * mean_tol + (k + 3) * u * var;
  return {mean, rstd, mean_tol, 2 * (0.5 * var_err / (var + eps) + 3 * u) * rstd};
}

} // namespace

TEST_CASE("each kernel set's layer norm forward matches a double reference on rows of any length",
          "[kernels][layer_norm]") {
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t cols : widths)
      for (float offset : {0.0f, 30.0f})  // 30: a mean far from 0 against a spread of 1
        for (bool with_beta : {true, false}) {
          INFO(set << " cols " << cols << " offset " << offset << (with_beta ? " with beta" : " without beta"));
          const operands o = make(5, cols, cols * 3 + 1, offset, 1.0f);
          const outputs r = run_set(*table, o, with_beta);
          CHECK(sentinels_kept(r));
          int64_t bad = 0;
          double worst = 0;
          for (int64_t row = 0; row < o.rows; ++row) {
            const float* x = o.x.data() + 1 + row * cols;
            const row_forward f = forward_reference(x, cols);
            bad += std::abs(r.mean[row + 1] - f.mean) > f.mean_tol || std::abs(r.rstd[row + 1] - f.rstd) > f.rstd_tol;
            auto want = [&](int64_t j) {
              return (x[j] - f.mean) * f.rstd * o.gamma[j + 1] + (with_beta ? o.beta[j + 1] : 0.0);
            };
            auto tol = [&](int64_t j) {
              const double dev = std::abs(x[j] - f.mean), g = o.gamma[j + 1];
              return 2 * g * (f.rstd * (f.mean_tol + u * dev) + dev * f.rstd_tol + u * dev * f.rstd) +
                     2 * u * std::abs(want(j)) + 1e-30;
            };
            std::vector<float> y_row(r.y.begin() + row * cols, r.y.begin() + (row + 1) * cols + 1);
            bad += count_off(y_row, cols, want, tol, worst);
          }
          INFO("worst error / tolerance " << worst);
          CHECK(bad == 0);
        }
}

namespace {

/// The backward pass's references for one row from the float mean and rstd it is given: dx, and the error each
/// entry may carry (the sums of g = dy gamma and g xhat in float, then the products; first order, doubled).
void backward_reference(const operands& o, int64_t row, float mean, float rstd, std::vector<double>& dx,
                        std::vector<double>& tol) {
  const int64_t n = o.cols;
  const float* x = o.x.data() + 1 + row * n;
  const float* dy = o.dy.data() + 1 + row * n;
  const double k = std::ceil(n / 8.0) + 9;
  double sg = 0, sgx = 0, abs_g = 0, abs_gx = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double g = double(dy[j]) * o.gamma[j + 1], xhat = (x[j] - double(mean)) * rstd;
    sg += g, sgx += g * xhat, abs_g += std::abs(g), abs_gx += std::abs(g * xhat);
  }
  const double mg = sg / n, mgx = sgx / n, mg_err = (k + 3) * u * abs_g / n, mgx_err = (k + 5) * u * abs_gx / n;
  for (int64_t j = 0; j < n; ++j) {
    const double g = double(dy[j]) * o.gamma[j + 1], xhat = (x[j] - double(mean)) * rstd;
    dx[j] = rstd * (g - mg - xhat * mgx);
    tol[j] = 2 * (rstd * (2 * u * (std::abs(g) + std::abs(mg)) + mg_err + std::abs(xhat) * mgx_err +
                          3 * u * std::abs(xhat * mgx)) +
                  u * std::abs(dx[j])) +
             1e-30;
  }
}

} // namespace

TEST_CASE("each kernel set's layer norm backward matches a double reference on rows of any length",
          "[kernels][layer_norm]") {
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t cols : widths) {
      INFO(set << " cols " << cols);
      const operands o = make(7, cols, cols * 5 + 2, 0.0f, 2.0f);
      const outputs r = run_set(*table, o, true);
      CHECK(sentinels_kept(r));
      int64_t bad = 0;
      double worst = 0;
      std::vector<double> dx(cols), tol(cols), dg(cols, 0.0), db(cols, 0.0), dg_abs(cols, 0.0), db_abs(cols, 0.0);
      for (int64_t row = 0; row < o.rows; ++row) {
        const float mean = r.mean[row + 1], rstd = r.rstd[row + 1];
        backward_reference(o, row, mean, rstd, dx, tol);
        std::vector<float> dx_row(r.dx.begin() + row * cols, r.dx.begin() + (row + 1) * cols + 1);
        bad += count_off(dx_row, cols, [&](int64_t j) { return dx[j]; }, [&](int64_t j) { return tol[j]; }, worst);
        for (int64_t j = 0; j < cols; ++j) {
          const double g = o.dy[1 + row * cols + j], xhat = (o.x[1 + row * cols + j] - double(mean)) * rstd;
          dg[j] += g * xhat, dg_abs[j] += std::abs(g * xhat), db[j] += g, db_abs[j] += std::abs(g);
        }
      }
      // dgamma: each term's xhat rounded twice in float, the sum in double; dbeta: the sum in double. Then a float.
      bad += count_off(r.dgamma, cols, [&](int64_t j) { return dg[j]; },
                       [&](int64_t j) { return 2.5 * u * dg_abs[j] + u * std::abs(dg[j]) + 1e-30; }, worst);
      bad += count_off(r.dbeta, cols, [&](int64_t j) { return db[j]; },
                       [&](int64_t j) { return u * std::abs(db[j]) + 1e-12 * db_abs[j] + 1e-30; }, worst);
      INFO("worst error / tolerance " << worst);
      CHECK(bad == 0);
    }
}

namespace {

/// a b rounded to a float: a call GCC does not inline, so that no caller's sum contracts it into an FMA.
__attribute__((noinline)) float product(float a, float b) { return a * b; }

/// The loops before the sets written one float at a time, as GCC compiled them at the baseline: a row's sums in 8
/// lanes (x[j] in lane j mod 8 up to the last whole 8, the rest in lane 0, then the lanes one after another from
/// +0), the products GCC fused as FMAs (std::fma where `fused`), every other product rounded.
struct model {
  bool fused;
  float mul_add(float a, float b, float c) const { return fused ? std::fma(a, b, c) : product(a, b) + c; }
  template <class Term>
  float sum8(int64_t n, Term term) const {
    float lane[8] = {};
    const int64_t whole = n / 8 * 8;
    for (int64_t j = 0; j < n; ++j) {
      float& l = lane[j < whole ? j % 8 : 0];
      l = term(j, l);
    }
    float t = 0.0f;
    for (float l : lane) t += l;
    return t;
  }
  void forward(const layer_norm_args& a, float* y, float* mean, float* rstd) const;
  void backward(const layer_norm_args& a, float* dx, float* dgamma, float* dbeta) const;
};

void model::forward(const layer_norm_args& a, float* y, float* mean, float* rstd) const {
  const int64_t n = a.cols;
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * n;
    const float m = sum8(n, [&](int64_t j, float acc) { return acc + x[j]; }) / static_cast<float>(n);
    const float q = sum8(n, [&](int64_t j, float acc) { return mul_add(x[j] - m, x[j] - m, acc); });
    const float s = 1.0f / std::sqrt(q / static_cast<float>(n) + a.eps);
    mean[r] = m;
    rstd[r] = s;
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = mul_add((x[j] - m) * s, a.gamma[j], a.beta ? a.beta[j] : 0.0f);
  }
}

void model::backward(const layer_norm_args& a, float* dx, float* dgamma, float* dbeta) const {
  const int64_t n = a.cols;
  std::vector<double> sg(n, 0.0), sb(n, 0.0);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float *x = a.x + r * n, *dy = a.dy + r * n, m = a.mean[r], s = a.rstd[r];
    auto g = [&](int64_t j) { return product(dy[j], a.gamma[j]); };
    const float mg = sum8(n, [&](int64_t j, float acc) { return acc + g(j); }) / static_cast<float>(n);
    const float mgx = sum8(n, [&](int64_t j, float acc) { return mul_add(g(j) * (x[j] - m), s, acc); }) /
                      static_cast<float>(n);
    for (int64_t j = 0; j < n; ++j) {
      dx[r * n + j] = s * mul_add(-((x[j] - m) * s), mgx, mul_add(dy[j], a.gamma[j], -mg));
      sg[j] += double(dy[j]) * double((x[j] - m) * s);
      sb[j] += dy[j];
    }
  }
  for (int64_t j = 0; j < n; ++j) dgamma[j] = static_cast<float>(sg[j]), dbeta[j] = static_cast<float>(sb[j]);
}

} // namespace

TEST_CASE("every set's layer norm gives the bits of the loops before the sets", "[kernels][layer_norm]") {
  // The model's forward and backward, each fed the same inputs as the set (the backward the set's mean and rstd),
  // fusing where the set does: as the loops before the sets did at the baseline, on every set at x86-64-v3 (on a
  // baseline without FMA the wider sets fuse where those loops did not).
  for (const auto& [set, table] : k::detail::runnable_simd_kernels())
    for (int64_t cols : widths)
      for (bool with_beta : {true, false}) {
        INFO(set << " cols " << cols << (with_beta ? " with beta" : " without beta"));
        const operands o = make(6, cols, cols * 7 + 3, 0.5f, 3.0f);
        const outputs got = run_set(*table, o, with_beta);
        outputs want = sentinels(o);
        const model m{set_fuses(set)};
        m.forward(o.args(with_beta), want.y.data() + 1, want.mean.data() + 1, want.rstd.data() + 1);
        m.backward(o.args(with_beta, got.mean.data() + 1, got.rstd.data() + 1), want.dx.data() + 1,
                   want.dgamma.data() + 1, want.dbeta.data() + 1);
        auto same = [](const std::vector<float>& p, const std::vector<float>& q) {
          return std::memcmp(p.data(), q.data(), p.size() * sizeof(float)) == 0;
        };
        CHECK(same(got.mean, want.mean));
        CHECK(same(got.rstd, want.rstd));
        CHECK(same(got.y, want.y));
        CHECK(same(got.dx, want.dx));
        CHECK(same(got.dgamma, want.dgamma));
        CHECK(same(got.dbeta, want.dbeta));
      }
}

TEST_CASE("layer norm's set kernels write only the rows and columns they are given", "[kernels][layer_norm]") {
  const operands o = make(9, 37, 41, 0.0f, 1.0f);
  for (const auto& [set, table] : k::detail::runnable_simd_kernels()) {
    INFO(set);
    outputs r = sentinels(o);
    std::fill(r.mean.begin(), r.mean.end(), 1.0f);
    std::fill(r.rstd.begin(), r.rstd.end(), 1.0f);
    const outputs before = r;
    const layer_norm_args a = o.args(true, r.mean.data() + 1, r.rstd.data() + 1);
    table->layer_norm_forward(a, 3, 7, r.y.data() + 1, r.mean.data() + 1, r.rstd.data() + 1);
    table->layer_norm_backward(a, 3, 7, r.dx.data() + 1);
    table->layer_norm_params(a, 5, 23, r.dgamma.data() + 1, r.dbeta.data() + 1);
    for (int64_t row = 0; row < o.rows; ++row) {
      const bool in = row >= 3 && row < 7;
      CHECK((r.mean[row + 1] != before.mean[row + 1]) == in);
      for (int64_t j = 0; j < o.cols; ++j) {
        const std::size_t i = static_cast<std::size_t>(1 + row * o.cols + j);
        CHECK(((r.y[i] != before.y[i]) && (r.dx[i] != before.dx[i])) == in);
      }
    }
    for (int64_t j = 0; j < o.cols; ++j) CHECK((r.dgamma[j + 1] != before.dgamma[j + 1]) == (j >= 5 && j < 23));
  }
}

TEST_CASE("layer norm forward and backward on the active set give the same bits on 1 and 2 threads",
          "[kernels][layer_norm]") {
  // 4099 rows of 67: two threads cut the rows at 2049, the columns at 32 (a multiple of 16).
  const tensor x = testing::random_tensor({4099, 67}, 51, -2.0f, 2.0f), gamma = testing::random_tensor({67}, 52),
               beta = testing::random_tensor({67}, 53), dy = testing::random_tensor({4099, 67}, 54);
  std::vector<std::vector<float>> runs[2];
  for (int threads : {1, 2}) {
    const k::context ctx = k::context::with_threads(threads);
    tensor y, mean, rstd, dx, dg, db;
    k::layer_norm_forward(ctx, x, gamma, beta, eps, y, mean, rstd);
    k::layer_norm_backward(ctx, x, gamma, mean, rstd, dy, dx, dg, db);
    for (const tensor* t : {&y, &mean, &rstd, &dx, &dg, &db}) runs[threads - 1].push_back(t->to_vector());
  }
  CHECK(runs[0] == runs[1]);
}
