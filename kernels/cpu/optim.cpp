#include <cstring>
#include <cmath>

#include "kernels/cpu/check.hpp"
#include "kernels/sequence.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

void sgd_step(const context& ctx, tensor& w, const tensor& g, float lr, float weight_decay) {
  detail::require_same(w, g, "sgd_step", "w", "g");
  float* wp = w.data();
  const float* gp = g.data();
  detail::parallel_ranges(ctx, w.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) wp[i] -= lr * (gp[i] + weight_decay * wp[i]);
  });
}

void axpy(const context& ctx, int64_t n, float a, const float* x, float* y) {
  detail::parallel_ranges(ctx, n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] += a * x[i];
  });
}

void copy(const context& ctx, int64_t n, const float* x, float* y) {
  detail::parallel_ranges(ctx, n, [&](int64_t lo, int64_t hi) { std::memcpy(y + lo, x + lo, (hi - lo) * sizeof(float)); });
}

void momentum_step(const context& ctx, tensor& w, const tensor& g, tensor& v, float lr,
                   float momentum, float weight_decay, bool nesterov) {
  detail::require_same(w, g, "momentum_step", "w", "g");
  detail::require_same(w, v, "momentum_step", "w", "velocity");
  float* wp = w.data();
  float* vp = v.data();
  const float* gp = g.data();
  detail::parallel_ranges(ctx, w.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float d = gp[i] + weight_decay * wp[i];
      vp[i] = momentum * vp[i] + d;
      wp[i] -= lr * (nesterov ? d + momentum * vp[i] : vp[i]);
    }
  });
}

namespace {

/// Adam's step; `decoupled`: AdamW's weight decay (on w, outside the moments), else L2 (added to g).
void adam_update(const context& ctx, const char* k, tensor& w, const tensor& g, tensor& m, tensor& v, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step, bool decoupled) {
  detail::require_same(w, g, k, "w", "g");
  detail::require_same(w, m, k, "w", "m");
  detail::require_same(w, v, k, "w", "v");
  detail::require(step >= 1, k, "step counts from 1, got " + std::to_string(step));
  const float c1 = 1.0f - static_cast<float>(std::pow(beta1, step));
  const float c2 = 1.0f - static_cast<float>(std::pow(beta2, step));
  float* wp = w.data();
  float* mp = m.data();
  float* vp = v.data();
  const float* gp = g.data();
  detail::parallel_ranges(ctx, w.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float d = decoupled ? gp[i] : gp[i] + weight_decay * wp[i];
      mp[i] = beta1 * mp[i] + (1 - beta1) * d;
      vp[i] = beta2 * vp[i] + (1 - beta2) * d * d;
      if (decoupled)
        wp[i] -= lr * ((mp[i] / c1) / (std::sqrt(vp[i] / c2) + eps) + weight_decay * wp[i]);
      else
        wp[i] -= lr * (mp[i] / c1) / (std::sqrt(vp[i] / c2) + eps);
    }
  });
}

} // namespace

void adam_step(const context& ctx, tensor& w, const tensor& g, tensor& m, tensor& v, float lr,
               float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  adam_update(ctx, "adam_step", w, g, m, v, lr, beta1, beta2, eps, weight_decay, step, false);
}

void adamw_step(const context& ctx, tensor& w, const tensor& g, tensor& m, tensor& v, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step) {
  adam_update(ctx, "adamw_step", w, g, m, v, lr, beta1, beta2, eps, weight_decay, step, true);
}

} // namespace troupe::kernels
