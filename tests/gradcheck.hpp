#pragma once

// Numerical gradient checks by central differences, shared by the kernel and
// model tests.

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "kernels/context.hpp"
#include "tensor/tensor.hpp"

namespace troupe::testing {

/// The context kernel and model tests run in: two threads, so that the
/// kernels' parallel paths run on any machine.
inline kernels::context test_context() { return kernels::context::with_threads(2); }

inline tensor random_tensor(const shape& s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  tensor t = tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = d(rng);
  return t;
}

/// Largest |a - b| relative to the largest |b| (at least 1).
inline double max_rel_diff(const tensor& a, const tensor& b) {
  REQUIRE(a.shape() == b.shape());
  double worst = 0, scale = 1;
  for (int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, double(std::abs(b.at(i))));
  for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, double(std::abs(a.at(i) - b.at(i))));
  return worst / scale;
}

inline double dot(const tensor& a, const tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.at(i)) * b.at(i);
  return s;
}

/// Checks `analytic` against d loss / d x by central differences, perturbing
/// every element of `x` (or `max_checks` evenly spaced ones). `loss` must
/// re-run the forward pass from the current contents of x.
inline void check_gradient(tensor& x, const tensor& analytic, const std::function<double()>& loss,
                           double eps = 1e-2, double tol = 2e-2, int64_t max_checks = 200) {
  REQUIRE(analytic.defined());
  REQUIRE(analytic.shape() == x.shape());
  const int64_t n = x.numel();
  const int64_t step = std::max<int64_t>(1, n / max_checks);
  double worst = 0;
  for (int64_t i = 0; i < n; i += step) {
    const float orig = x.at(i);
    x.at(i) = orig + static_cast<float>(eps);
    const double up = loss();
    x.at(i) = orig - static_cast<float>(eps);
    const double down = loss();
    x.at(i) = orig;
    const double numeric = (up - down) / (2 * eps);
    const double err = std::abs(numeric - analytic.at(i)) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, err);
    INFO("element " << i << ": numeric " << numeric << ", analytic " << analytic.at(i));
    REQUIRE(err < tol);
  }
  loss();  // leave forward state as it was
  CHECK(worst < tol);
}

} // namespace troupe::testing
