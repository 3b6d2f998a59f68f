#include <algorithm>
#include <cmath>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/simd_set.hpp"
#include "kernels/cpu/splitmix.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

namespace {

const detail::simd_kernel_set& set() { return detail::active_simd_kernels(); }

} // namespace

namespace detail {

void apply_ranges(const context& ctx, const tensor& x, tensor& y, simd_kernel_set::unary f) {
  ensure_shape(y, x.shape());
  const float* a = x.data();
  float* o = y.data();
  parallel_ranges(ctx, x.numel(), [&](int64_t lo, int64_t hi) { f(a + lo, o + lo, hi - lo); });
}

void apply_ranges(const context& ctx, const tensor& a, const tensor& b, tensor& y, const char* kernel,
                  const char* an, const char* bn, simd_kernel_set::binary f) {
  require_same(a, b, kernel, an, bn);
  ensure_shape(y, a.shape());
  const float* ap = a.data();
  const float* bp = b.data();
  float* o = y.data();
  parallel_ranges(ctx, a.numel(), [&](int64_t lo, int64_t hi) { f(ap + lo, bp + lo, o + lo, hi - lo); });
}

} // namespace detail

void add(const context& ctx, const tensor& a, const tensor& b, tensor& y, bool relu) {
  detail::require_same(a, b, "add", "a", "b");
  if (!y.shares_storage(a) && !y.shares_storage(b)) ensure_shape(y, a.shape());
  detail::require_same(a, y, "add", "a", "y");
  const float* ap = a.data();
  const float* bp = b.data();
  float* o = y.data();
  const auto kernel = set().add;
  detail::parallel_ranges(ctx, a.numel(),
                          [&](int64_t lo, int64_t hi) { kernel(ap + lo, bp + lo, o + lo, hi - lo, relu); });
}

bool all_finite(const context& ctx, const float* data, int64_t n) {
  // The set's scan of the floats' exponent bits, one range per thread.
  const auto scan = set().all_finite;
  bool ok = true;
  detail::parallel_ranges(ctx, n, [&](int64_t lo, int64_t hi) {
    if (!scan(data + lo, hi - lo)) {
#pragma omp atomic write
      ok = false;
    }
  });
  return ok;
}

void relu_forward(const context& ctx, const tensor& x, tensor& y) {
  detail::apply_ranges(ctx, x, y, set().relu_forward);
}
void relu_backward(const context& ctx, const tensor& y, const tensor& dy, tensor& dx) {
  detail::apply_ranges(ctx, y, dy, dx, "relu_backward", "y", "dy", set().relu_backward);
}
void tanh_forward(const context& ctx, const tensor& x, tensor& y) {
  detail::apply_ranges(ctx, x, y, set().tanh_forward);
}
void tanh_backward(const context& ctx, const tensor& y, const tensor& dy, tensor& dx) {
  detail::apply_ranges(ctx, y, dy, dx, "tanh_backward", "y", "dy", set().tanh_backward);
}
void sigmoid_forward(const context& ctx, const tensor& x, tensor& y) {
  detail::apply_ranges(ctx, x, y, set().sigmoid_forward);
}
void sigmoid_backward(const context& ctx, const tensor& y, const tensor& dy, tensor& dx) {
  detail::apply_ranges(ctx, y, dy, dx, "sigmoid_backward", "y", "dy", set().sigmoid_backward);
}

void dropout_forward(const context& ctx, const tensor& x, float p, uint64_t seed, uint64_t counter,
                     tensor& mask, tensor& y) {
  detail::require(p >= 0.0f && p < 1.0f, "dropout_forward",
                  [&] { return "probability must be in [0, 1), got " + std::to_string(p); });
  ensure_shape(mask, x.shape());
  ensure_shape(y, x.shape());
  const int64_t n = x.numel();
  const float keep = 1.0f / (1.0f - p);
  const uint64_t threshold = static_cast<uint64_t>(static_cast<double>(p) * 18446744073709551616.0);
  const uint64_t base = detail::splitmix(seed ^ detail::splitmix(counter));
  float* m = mask.data();
  float* o = y.data();
  const float* a = x.data();
  // Element i's hash is splitmix(base + i) on any thread and set.
  const auto kernel = set().dropout;
  detail::parallel_ranges(ctx, n, [&](int64_t lo, int64_t hi) {
    kernel(a + lo, base + static_cast<uint64_t>(lo), threshold, keep, m + lo, o + lo, hi - lo);
  });
}

void dropout_backward(const context& ctx, const tensor& dy, const tensor& mask, tensor& dx) {
  detail::apply_ranges(ctx, mask, dy, dx, "dropout_backward", "mask", "dy", set().multiply);
}

bool all_finite(const context& ctx, const tensor& t) { return all_finite(ctx, t.data(), t.numel()); }

} // namespace troupe::kernels

namespace troupe::kernels {

double clip_by_global_norm(const context& ctx, const std::vector<std::pair<float*, int64_t>>& parts, double max_norm) {
  double sum = 0;  // one pass in order: the same bits however the values are cut into parts
  for (const auto& [p, n] : parts)
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  const double norm = std::sqrt(sum);
  if (max_norm <= 0 || !(norm > max_norm)) return norm;
  const auto scale = static_cast<float>(max_norm / norm);
  for (const auto& [p, n] : parts) {
    float* q = p;
    detail::parallel_ranges(ctx, n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) q[i] *= scale;
    });
  }
  return norm;
}

} // namespace troupe::kernels
