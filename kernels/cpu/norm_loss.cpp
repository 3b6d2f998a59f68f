#include <algorithm>
#include <cmath>

#include "kernels/cpu/check.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

namespace {

struct bn_dims {
  int64_t n, c, inner;  // x viewed as [n, c, inner]
};

bn_dims bn_check(const tensor& x, const tensor& gamma, const tensor& beta, const char* k) {
  detail::require(x.defined() && (x.rank() == 2 || x.rank() == 4), k,
                  "x must be [n, c] or [n, c, h, w], got " +
                      (x.defined() ? x.shape().to_string() : std::string("undefined")));
  bn_dims d{x.dim(0), x.dim(1), x.rank() == 4 ? x.dim(2) * x.dim(3) : 1};
  detail::require_shape(gamma, {d.c}, k, "gamma");
  if (beta.defined()) detail::require_shape(beta, {d.c}, k, "beta");
  detail::require(d.n * d.inner > 0, k, "empty batch");
  return d;
}

} // namespace

void batch_norm_forward_train(const context& ctx, const tensor& x, const tensor& gamma,
                              const tensor& beta, float eps, float momentum, tensor& running_mean,
                              tensor& running_var, tensor& y, tensor& saved_mean,
                              tensor& saved_invstd) {
  const char* k = "batch_norm_forward_train";
  bn_dims d = bn_check(x, gamma, beta, k);
  detail::require_shape(running_mean, {d.c}, k, "running_mean");
  detail::require_shape(running_var, {d.c}, k, "running_var");
  ensure_shape(y, x.shape());
  ensure_shape(saved_mean, {d.c});
  ensure_shape(saved_invstd, {d.c});
  const float* xp = x.data();
  float* yp = y.data();
  const double m = static_cast<double>(d.n * d.inner);
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, x.numel()))
  for (int64_t c = 0; c < d.c; ++c) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = xp + (i * d.c + c) * d.inner;
      for (int64_t j = 0; j < d.inner; ++j) {
        s += p[j];
        s2 += double(p[j]) * p[j];
      }
    }
    double mean = s / m;
    double var = std::max(0.0, s2 / m - mean * mean);
    float invstd = static_cast<float>(1.0 / std::sqrt(var + eps));
    saved_mean.data()[c] = static_cast<float>(mean);
    saved_invstd.data()[c] = invstd;
    double unbiased = m > 1 ? var * m / (m - 1) : var;
    running_mean.data()[c] = (1 - momentum) * running_mean.data()[c] + momentum * float(mean);
    running_var.data()[c] = (1 - momentum) * running_var.data()[c] + momentum * float(unbiased);
    float scale = gamma.data()[c] * invstd;
    float shift = (beta.defined() ? beta.data()[c] : 0.0f) - float(mean) * scale;
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = xp + (i * d.c + c) * d.inner;
      float* q = yp + (i * d.c + c) * d.inner;
      for (int64_t j = 0; j < d.inner; ++j) q[j] = p[j] * scale + shift;
    }
  }
}

void batch_norm_forward_eval(const context& ctx, const tensor& x, const tensor& gamma,
                             const tensor& beta, float eps, const tensor& running_mean,
                             const tensor& running_var, tensor& y) {
  const char* k = "batch_norm_forward_eval";
  bn_dims d = bn_check(x, gamma, beta, k);
  detail::require_shape(running_mean, {d.c}, k, "running_mean");
  detail::require_shape(running_var, {d.c}, k, "running_var");
  ensure_shape(y, x.shape());
  for (int64_t c = 0; c < d.c; ++c) {
    float scale = gamma.data()[c] / std::sqrt(running_var.data()[c] + eps);
    float shift = (beta.defined() ? beta.data()[c] : 0.0f) - running_mean.data()[c] * scale;
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = x.data() + (i * d.c + c) * d.inner;
      float* q = y.data() + (i * d.c + c) * d.inner;
      for (int64_t j = 0; j < d.inner; ++j) q[j] = p[j] * scale + shift;
    }
  }
}

void batch_norm_backward(const context& ctx, const tensor& x, const tensor& gamma,
                         const tensor& saved_mean, const tensor& saved_invstd, const tensor& dy,
                         tensor& dx, tensor& dgamma, tensor& dbeta) {
  const char* k = "batch_norm_backward";
  bn_dims d = bn_check(x, gamma, tensor(), k);
  detail::require_same(x, dy, k, "x", "dy");
  detail::require_shape(saved_mean, {d.c}, k, "saved_mean");
  detail::require_shape(saved_invstd, {d.c}, k, "saved_invstd");
  ensure_shape(dx, x.shape());
  ensure_shape(dgamma, {d.c});
  ensure_shape(dbeta, {d.c});
  const float m = static_cast<float>(d.n * d.inner);
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, x.numel()))
  for (int64_t c = 0; c < d.c; ++c) {
    const float mean = saved_mean.data()[c], invstd = saved_invstd.data()[c];
    double sdy = 0, sdyx = 0;
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = x.data() + (i * d.c + c) * d.inner;
      const float* g = dy.data() + (i * d.c + c) * d.inner;
      for (int64_t j = 0; j < d.inner; ++j) {
        sdy += g[j];
        sdyx += double(g[j]) * (p[j] - mean) * invstd;
      }
    }
    dbeta.data()[c] = static_cast<float>(sdy);
    dgamma.data()[c] = static_cast<float>(sdyx);
    // dx = gamma * invstd / m * (m * dy - sum(dy) - xhat * sum(dy * xhat))
    const float a = gamma.data()[c] * invstd / m;
    for (int64_t i = 0; i < d.n; ++i) {
      const float* p = x.data() + (i * d.c + c) * d.inner;
      const float* g = dy.data() + (i * d.c + c) * d.inner;
      float* q = dx.data() + (i * d.c + c) * d.inner;
      for (int64_t j = 0; j < d.inner; ++j) {
        float xhat = (p[j] - mean) * invstd;
        q[j] = a * (m * g[j] - float(sdy) - xhat * float(sdyx));
      }
    }
  }
}

float softmax_cross_entropy(const context& ctx, const tensor& logits,
                            const std::vector<int32_t>& labels, tensor* dlogits) {
  const char* k = "softmax_cross_entropy";
  detail::require_rank(logits, 2, k, "logits");
  const int64_t n = logits.dim(0), classes = logits.dim(1);
  detail::require(static_cast<int64_t>(labels.size()) == n, k,
                  std::to_string(labels.size()) + " labels for " + std::to_string(n) + " rows of logits");
  detail::require(n > 0, k, "empty batch");
  if (dlogits) ensure_shape(*dlogits, logits.shape());
  double total = 0;
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t y = labels[i];
    if (y < 0 || y >= classes)
      throw error(std::string(k) + ": label " + std::to_string(y) + " at row " + std::to_string(i) +
                  " is outside [0, " + std::to_string(classes) + ")");
    const float* z = logits.data() + i * classes;
    float mx = *std::max_element(z, z + classes);
    double sum = 0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(double(z[j] - mx));
    const double lse = mx + std::log(sum);
    total += lse - z[y];
    if (dlogits) {
      float* d = dlogits->data() + i * classes;
      for (int64_t j = 0; j < classes; ++j)
        d[j] = static_cast<float>(std::exp(double(z[j]) - lse)) * inv_n;
      d[y] -= inv_n;
    }
  }
  float loss = static_cast<float>(total / n);
  if (!std::isfinite(loss))
    throw error(std::string(k) + ": loss is not finite (" + std::to_string(loss) +
                "); the model diverged: lower the learning rate");
  return loss;
}

int64_t count_correct(const context& ctx, const tensor& logits, const std::vector<int32_t>& labels) {
  detail::require_rank(logits, 2, "count_correct", "logits");
  const int64_t n = logits.dim(0), classes = logits.dim(1);
  detail::require(static_cast<int64_t>(labels.size()) == n, "count_correct",
                  std::to_string(labels.size()) + " labels for " + std::to_string(n) + " rows");
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits.data() + i * classes;
    correct += (std::max_element(z, z + classes) - z) == labels[i];
  }
  return correct;
}

} // namespace troupe::kernels
