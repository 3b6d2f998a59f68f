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

namespace {

/// The sizes of `params`' tensors, each parameter's four tensors checked to be of one shape.
std::vector<int64_t> segment_sizes(const std::vector<update_slots>& params, const char* k, bool two_slots) {
  std::vector<int64_t> sizes;
  sizes.reserve(params.size());
  for (const update_slots& p : params) {
    detail::require(p.w && p.g && p.s1 && (!two_slots || p.s2), k, "a parameter's tensors are missing");
    detail::require_same(*p.w, *p.g, k, "w", "g");
    detail::require_same(*p.w, *p.s1, k, "w", two_slots ? "m" : "velocity");
    if (two_slots) detail::require_same(*p.w, *p.s2, k, "w", "v");
    sizes.push_back(p.w->numel());
  }
  return sizes;
}

/// Adam's step; `decoupled`: AdamW's weight decay (on w, outside the moments), else L2 (added to g).
void adam_update(const context& ctx, const char* k, const std::vector<update_slots>& params, float lr,
                 float beta1, float beta2, float eps, float decay, int64_t step, bool decoupled) {
  const std::vector<int64_t> sizes = segment_sizes(params, k, true);
  detail::require(step >= 1, k, [&] { return "step counts from 1, got " + std::to_string(step); });
  const float c1 = 1.0f - static_cast<float>(std::pow(beta1, step));
  const float c2 = 1.0f - static_cast<float>(std::pow(beta2, step));
  detail::parallel_segments(ctx, sizes, [&](std::size_t s, int64_t lo, int64_t hi) {
    const float weight_decay = params[s].decay ? decay : 0.0f;
    float* wp = params[s].w->data();
    float* mp = params[s].s1->data();
    float* vp = params[s].s2->data();
    const float* gp = params[s].g->data();
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

void momentum_steps(const context& ctx, const std::vector<update_slots>& params, float lr, float momentum,
                    float weight_decay, bool nesterov) {
  const std::vector<int64_t> sizes = segment_sizes(params, "momentum_step", false);
  detail::parallel_segments(ctx, sizes, [&](std::size_t s, int64_t lo, int64_t hi) {
    const float wd = params[s].decay ? weight_decay : 0.0f;
    float* wp = params[s].w->data();
    float* vp = params[s].s1->data();
    const float* gp = params[s].g->data();
    for (int64_t i = lo; i < hi; ++i) {
      float d = gp[i] + wd * wp[i];
      vp[i] = momentum * vp[i] + d;
      wp[i] -= lr * (nesterov ? d + momentum * vp[i] : vp[i]);
    }
  });
}

void momentum_step(const context& ctx, tensor& w, const tensor& g, tensor& v, float lr,
                   float momentum, float weight_decay, bool nesterov) {
  momentum_steps(ctx, {{&w, &g, &v}}, lr, momentum, weight_decay, nesterov);
}

void adam_steps(const context& ctx, const std::vector<update_slots>& params, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step) {
  adam_update(ctx, "adam_step", params, lr, beta1, beta2, eps, weight_decay, step, false);
}

void adam_step(const context& ctx, tensor& w, const tensor& g, tensor& m, tensor& v, float lr,
               float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  adam_update(ctx, "adam_step", {{&w, &g, &m, &v}}, lr, beta1, beta2, eps, weight_decay, step, false);
}

void adamw_steps(const context& ctx, const std::vector<update_slots>& params, float lr, float beta1,
                 float beta2, float eps, float weight_decay, int64_t step) {
  adam_update(ctx, "adamw_step", params, lr, beta1, beta2, eps, weight_decay, step, true);
}

void adamw_step(const context& ctx, tensor& w, const tensor& g, tensor& m, tensor& v, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step) {
  adam_update(ctx, "adamw_step", {{&w, &g, &m, &v}}, lr, beta1, beta2, eps, weight_decay, step, true);
}

} // namespace troupe::kernels
