#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

namespace {

struct bn_dims {
  int64_t n, c, inner;  // x viewed as [n, c, inner]
};

bn_dims bn_check(const tensor& x, const tensor& gamma, const tensor& beta, const char* k) {
  detail::require(x.defined() && (x.rank() == 2 || x.rank() == 4), k,
                  [&] { return "x must be [n, c] or [n, c, h, w], got " +
                      (x.defined() ? x.shape().to_string() : std::string("undefined")); });
  bn_dims d{x.dim(0), x.dim(1), x.rank() == 4 ? x.dim(2) * x.dim(3) : 1};
  detail::require_shape(gamma, {d.c}, k, "gamma");
  if (beta.defined()) detail::require_shape(beta, {d.c}, k, "beta");
  detail::require(d.n * d.inner > 0, k, "empty batch");
  return d;
}

} // namespace

namespace {

constexpr int V = simd::width;

// Per-plane loops of batch norm, in vector registers; each returns or
// accumulates in float within a plane (at most h * w elements), and the
// callers add planes in double.

float plane_sum(const float* a, int64_t n) {
  simd::vec s0 = simd::zero(), s1 = simd::zero();
  int64_t i = 0;
  for (; i + 2 * V <= n; i += 2 * V) {
    s0 = simd::add(s0, simd::load(a + i));
    s1 = simd::add(s1, simd::load(a + i + V));
  }
  float s = simd::reduce(simd::add(s0, s1));
  for (; i < n; ++i) s += a[i];
  return s;
}

/// Sums of d = a - shift and of d * d over a plane: its moments about a shift near its mean, small
/// numbers however far the values are from zero.
std::pair<float, float> plane_shifted_moments(const float* a, int64_t n, float shift) {
  const simd::vec m = simd::splat(shift);
  simd::vec s0 = simd::zero(), s1 = simd::zero(), q0 = simd::zero(), q1 = simd::zero();
  int64_t i = 0;
  for (; i + 2 * V <= n; i += 2 * V) {
    const simd::vec d0 = simd::sub(simd::load(a + i), m), d1 = simd::sub(simd::load(a + i + V), m);
    s0 = simd::add(s0, d0);
    s1 = simd::add(s1, d1);
    q0 = simd::fma(d0, d0, q0);
    q1 = simd::fma(d1, d1, q1);
  }
  float s = simd::reduce(simd::add(s0, s1)), q = simd::reduce(simd::add(q0, q1));
  for (; i < n; ++i) {
    s += a[i] - shift;
    q += (a[i] - shift) * (a[i] - shift);
  }
  return {s, q};
}

/// Each plane's centre (its mean, in float) and moments about it (plane_shifted_moments), [n][c].
struct plane_moments {
  std::vector<float> centres, firsts, seconds;
  explicit plane_moments(std::size_t planes) : centres(planes), firsts(planes), seconds(planes) {}

  void measure(const float* plane, int64_t inner, int64_t at) {
    centres[at] = plane_sum(plane, inner) / static_cast<float>(inner);
    std::tie(firsts[at], seconds[at]) = plane_shifted_moments(plane, inner, centres[at]);
  }

  /// Channel c's mean and variance (biased) over its n planes of `inner` values, merged in plane
  /// order in double: sum of (x - mean)^2 = sum over planes of [sum d^2 + 2 (centre - mean) sum d
  /// + inner (centre - mean)^2], exact algebra.
  std::pair<double, double> merged(int64_t n, int64_t channels, int64_t inner, int64_t c) const {
    const double count = static_cast<double>(n * inner), each = static_cast<double>(inner);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += each * centres[i * channels + c] + firsts[i * channels + c];
    const double mean = s / count;
    double s2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double to_mean = centres[i * channels + c] - mean;
      s2 += seconds[i * channels + c] + 2 * to_mean * firsts[i * channels + c] + each * to_mean * to_mean;
    }
    return {mean, std::max(0.0, s2) / count};  // never below zero by rounding (a constant channel)
  }
};

/// Batch norm's affine map, x * scale + shift: plane_affine's arithmetic, and
/// the backward pass's mask for a ReLU after it (keep_where_affine) computes the same.
inline simd::vec affine(simd::vec a, simd::vec scale, simd::vec shift) { return simd::fma(a, scale, shift); }
inline float affine(float a, float scale, float shift) { return a * scale + shift; }

/// y = a * scale + shift, plus r when given, then max(., 0) when `relu`.
void plane_affine(const float* a, const float* r, float* y, int64_t n, float scale, float shift, bool relu) {
  const simd::vec sc = simd::splat(scale), sh = simd::splat(shift), z = simd::zero();
  int64_t i = 0;
  for (; i + V <= n; i += V) {
    simd::vec v = affine(simd::load(a + i), sc, sh);
    if (r) v = simd::add(v, simd::load(r + i));
    simd::store(y + i, relu ? simd::max(v, z) : v);
  }
  for (; i < n; ++i) {
    float v = affine(a[i], scale, shift);
    if (r) v += r[i];
    y[i] = relu ? std::max(v, 0.0f) : v;
  }
}

/// f(c, p, at) for every plane of x [n, c, inner]: its channel c, its number p = i * c + channel and its
/// first element `at`. The images split over the enclosing parallel region's threads (an orphaned `omp
/// for`, static: each thread the same contiguous run of images as the convolutions' loops give it; all on
/// the calling thread outside a region), so that a thread reads the planes it wrote from its own caches.
template <class F>
void each_plane(const bn_dims& d, F f) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < d.n; ++i)
    for (int64_t c = 0; c < d.c; ++c) f(c, i * d.c + c, (i * d.c + c) * d.inner);
}

/// plane_affine over every plane of x [n, c, inner] (xp), its addend (rp, or null) and y (yp), with channel
/// c's scales[c] and shifts[c] (each_plane's split).
void planes_affine(const float* xp, const float* rp, float* yp, const bn_dims& d, const float* scales,
                   const float* shifts, bool relu) {
  each_plane(d, [&](int64_t c, int64_t, int64_t at) {
    plane_affine(xp + at, rp ? rp + at : nullptr, yp + at, d.inner, scales[c], shifts[c], relu);
  });
}

// Which gradients batch norm's backward pass counts (a ReLU's mask), element i
// of a plane, in vector registers and one at a time; `at` moves to a plane.

/// Every one: no ReLU.
struct keep_all {
  keep_all at(int64_t) const { return *this; }
  simd::vec operator()(simd::vec g, int64_t) const { return g; }
  float operator()(float g, int64_t) const { return g; }
};

/// Where the ReLU's output y is positive.
struct keep_where_output {
  const float* y;
  keep_where_output at(int64_t offset) const { return {y + offset}; }
  simd::vec operator()(simd::vec g, int64_t i) const { return simd::where_positive(simd::load(y + i), g); }
  float operator()(float g, int64_t i) const { return y[i] > 0.0f ? g : 0.0f; }
};

/// Where x * scale + shift is positive: the same mask as the output's, for a
/// ReLU with no addend (max(v, 0) > 0 exactly where v > 0, NaN in neither).
struct keep_where_affine {
  const float* x;
  float scale, shift;
  keep_where_affine at(int64_t offset) const { return {x + offset, scale, shift}; }
  simd::vec operator()(simd::vec g, int64_t i) const {
    return simd::where_positive(affine(simd::load(x + i), simd::splat(scale), simd::splat(shift)), g);
  }
  float operator()(float g, int64_t i) const { return affine(x[i], scale, shift) > 0.0f ? g : 0.0f; }
};

/// g' = keep(g): sums of g' and g' * (x - mean).
template <class Keep>
void plane_gradient_sums(const float* g, const float* x, const Keep& keep, int64_t n, float mean, double& sg,
                         double& sgx) {
  const simd::vec m = simd::splat(mean);
  simd::vec a = simd::zero(), b = simd::zero();
  int64_t i = 0;
  for (; i + V <= n; i += V) {
    const simd::vec gv = keep(simd::load(g + i), i);
    a = simd::add(a, gv);
    b = simd::fma(gv, simd::sub(simd::load(x + i), m), b);
  }
  float s0 = simd::reduce(a), s1 = simd::reduce(b);
  for (; i < n; ++i) {
    const float gv = keep(g[i], i);
    s0 += gv;
    s1 += gv * (x[i] - mean);
  }
  sg += s0;
  sgx += s1;
}

/// dx = a * (m * g' - sg - (x - mean) * invstd * sgx_hat), g' as above.
template <class Keep>
void plane_gradient(const float* g, const float* x, const Keep& keep, float* dx, int64_t n, float a, float m,
                    float mean, float invstd, float sg, float sgx_hat) {
  const simd::vec va = simd::splat(a), vm = simd::splat(m), vmean = simd::splat(mean),
                  vk = simd::splat(invstd * sgx_hat), vsg = simd::splat(sg);
  int64_t i = 0;
  for (; i + V <= n; i += V) {
    const simd::vec gv = keep(simd::load(g + i), i);
    const simd::vec centred = simd::sub(simd::load(x + i), vmean);
    // m * g' - sg - centred * k
    const simd::vec t = simd::sub(simd::sub(simd::mul(vm, gv), vsg), simd::mul(centred, vk));
    simd::store(dx + i, simd::mul(va, t));
  }
  for (; i < n; ++i) {
    const float gv = keep(g[i], i);
    dx[i] = a * (m * gv - sg - (x[i] - mean) * invstd * sgx_hat);
  }
}

/// Batch norm's backward pass, split by images as the forward pass is (each_plane): each plane's gradient
/// sums (keep_of(c) the mask of channel c's planes, moved to each), added per channel in plane order
/// (dgamma, dbeta: the same bits on any number of threads), then dx.
template <class KeepOf>
void gradient_by_images(const context& ctx, const bn_dims& d, const float* xp, const float* gp, float* dxp,
                        const KeepOf& keep_of, const float* gamma, const float* mean, const float* invstd,
                        float* dgamma, float* dbeta) {
  const float m = static_cast<float>(d.n * d.inner);
  std::vector<double> sg(static_cast<std::size_t>(d.n * d.c)), sgx(sg.size());
  std::vector<float> sums(static_cast<std::size_t>(d.c)), sums_hat(sums.size()), factors(sums.size());
#pragma omp parallel num_threads(ctx.threads) if (detail::split(ctx, d.n * d.c * d.inner))
  {
    each_plane(d, [&](int64_t c, int64_t p, int64_t at) {
      plane_gradient_sums(gp + at, xp + at, keep_of(c).at(at), d.inner, mean[c], sg[p], sgx[p]);
    });
#pragma omp single
    for (int64_t c = 0; c < d.c; ++c) {
      double sdy = 0, sdyx = 0;
      for (int64_t i = 0; i < d.n; ++i) {
        sdy += sg[i * d.c + c];
        sdyx += sgx[i * d.c + c];
      }
      sums[c] = static_cast<float>(sdy);
      sums_hat[c] = static_cast<float>(sdyx) * invstd[c];  // sum of dy * xhat
      factors[c] = gamma[c] * invstd[c] / m;
      dbeta[c] = sums[c];
      dgamma[c] = sums_hat[c];
    }
    // dx = gamma * invstd / m * (m * dy - sum(dy) - xhat * sum(dy * xhat))
    each_plane(d, [&](int64_t c, int64_t, int64_t at) {
      plane_gradient(gp + at, xp + at, keep_of(c).at(at), dxp + at, d.inner, factors[c], m, mean[c], invstd[c], sums[c],
                     sums_hat[c]);
    });
  }
}

/// Inference's scale and shift of channel c: gamma / sqrt(running_var + eps), beta - running_mean * scale.
std::pair<float, float> eval_affine(const tensor& gamma, const tensor& beta, float eps, const tensor& running_mean,
                                    const tensor& running_var, int64_t c) {
  const float scale = gamma.data()[c] / std::sqrt(running_var.data()[c] + eps);
  return {scale, (beta.defined() ? beta.data()[c] : 0.0f) - running_mean.data()[c] * scale};
}

} // namespace

void batch_norm_forward_train(const context& ctx, const tensor& x, const tensor& gamma,
                              const tensor& beta, float eps, float momentum, tensor& running_mean,
                              tensor& running_var, tensor& y, tensor& saved_mean,
                              tensor& saved_invstd, bool relu, const tensor* addend, tensor* saved_affine,
                              bool write_y) {
  const char* k = "batch_norm_forward_train";
  bn_dims d = bn_check(x, gamma, beta, k);
  if (addend) detail::require_same(x, *addend, k, "x", "addend");
  detail::require_shape(running_mean, {d.c}, k, "running_mean");
  detail::require_shape(running_var, {d.c}, k, "running_var");
  detail::require(write_y || saved_affine, k, "without write_y it needs saved_affine (what stands for y)");
  if (write_y) ensure_shape(y, x.shape());
  ensure_shape(saved_mean, {d.c});
  ensure_shape(saved_invstd, {d.c});
  if (saved_affine) ensure_shape(*saved_affine, {2, d.c});
  const float* xp = x.data();
  const float* rp = addend ? addend->data() : nullptr;
  float* yp = write_y ? y.data() : nullptr;
  const double m = static_cast<double>(d.n * d.inner);
  // Split by images (each_plane). Each plane is read twice while it is in L1: its sum gives a centre
  // near its mean, then its moments about the centre (small numbers). They are merged per channel in
  // double, in plane order (plane_moments): no cancellation however far the values are from zero, and
  // the same bits on any number of threads.
  plane_moments moments(static_cast<std::size_t>(d.n * d.c));
  std::vector<float> scales(static_cast<std::size_t>(d.c)), shifts(scales.size());
#pragma omp parallel num_threads(ctx.threads) if (detail::split(ctx, x.numel()))
  {
    each_plane(d, [&](int64_t, int64_t p, int64_t at) { moments.measure(xp + at, d.inner, p); });
#pragma omp single
    for (int64_t c = 0; c < d.c; ++c) {
      const auto [mean, var] = moments.merged(d.n, d.c, d.inner, c);
      const float invstd = static_cast<float>(1.0 / std::sqrt(var + eps));
      saved_mean.data()[c] = static_cast<float>(mean);
      saved_invstd.data()[c] = invstd;
      const double unbiased = m > 1 ? var * m / (m - 1) : var;
      running_mean.data()[c] = (1 - momentum) * running_mean.data()[c] + momentum * static_cast<float>(mean);
      running_var.data()[c] = (1 - momentum) * running_var.data()[c] + momentum * float(unbiased);
      scales[c] = gamma.data()[c] * invstd;
      shifts[c] = (beta.defined() ? beta.data()[c] : 0.0f) - static_cast<float>(mean) * scales[c];
      if (saved_affine) {
        saved_affine->data()[c] = scales[c];
        saved_affine->data()[d.c + c] = shifts[c];
      }
    }
    if (write_y) planes_affine(xp, rp, yp, d, scales.data(), shifts.data(), relu);
  }
}

void batch_norm_eval_affine(const tensor& gamma, const tensor& beta, float eps, const tensor& running_mean,
                            const tensor& running_var, tensor& affine) {
  const char* k = "batch_norm_eval_affine";
  detail::require_rank(gamma, 1, k, "gamma");
  const int64_t c = gamma.dim(0);
  if (beta.defined()) detail::require_shape(beta, {c}, k, "beta");
  detail::require_shape(running_mean, {c}, k, "running_mean");
  detail::require_shape(running_var, {c}, k, "running_var");
  ensure_shape(affine, {2, c});
  for (int64_t i = 0; i < c; ++i)
    std::tie(affine.data()[i], affine.data()[c + i]) = eval_affine(gamma, beta, eps, running_mean, running_var, i);
}

void channel_affine_relu(const context& ctx, const tensor& x, const tensor& affine, tensor& y) {
  const char* k = "channel_affine_relu";
  detail::require(x.rank() >= 2, k, [&] { return "x must be [n, c, ...], got " + x.shape().to_string(); });
  const int64_t n = x.dim(0), c = x.dim(1), inner = x.numel() / std::max<int64_t>(1, n * c);
  detail::require_shape(affine, {2, c}, k, "affine");
  ensure_shape(y, x.shape());
  const float* xp = x.data();
  const float* ap = affine.data();
  float* yp = y.data();
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, x.numel()))
  for (int64_t p = 0; p < n * c; ++p) {
    const float scale = ap[p % c], shift = ap[c + p % c];
    for (int64_t i = p * inner; i < (p + 1) * inner; ++i) yp[i] = std::max(std::fma(xp[i], scale, shift), 0.0f);
  }
}

void batch_norm_forward_eval(const context& ctx, const tensor& x, const tensor& gamma,
                             const tensor& beta, float eps, const tensor& running_mean,
                             const tensor& running_var, tensor& y, bool relu, const tensor* addend) {
  const char* k = "batch_norm_forward_eval";
  bn_dims d = bn_check(x, gamma, beta, k);
  if (addend) detail::require_same(x, *addend, k, "x", "addend");
  detail::require_shape(running_mean, {d.c}, k, "running_mean");
  detail::require_shape(running_var, {d.c}, k, "running_var");
  ensure_shape(y, x.shape());
  const float* xp = x.data();
  const float* rp = addend ? addend->data() : nullptr;
  float* yp = y.data();
  tensor affine;  // [2, c]: scales, then shifts
  batch_norm_eval_affine(gamma, beta, eps, running_mean, running_var, affine);
#pragma omp parallel num_threads(ctx.threads) if (detail::split(ctx, x.numel()))
  planes_affine(xp, rp, yp, d, affine.data(), affine.data() + d.c, relu);
}

void batch_norm_backward(const context& ctx, const tensor& x, const tensor& gamma,
                         const tensor& saved_mean, const tensor& saved_invstd, const tensor& dy,
                         tensor& dx, tensor& dgamma, tensor& dbeta, const tensor* relu_output,
                         const tensor* relu_affine) {
  const char* k = "batch_norm_backward";
  bn_dims d = bn_check(x, gamma, tensor(), k);
  detail::require_same(x, dy, k, "x", "dy");
  detail::require_shape(saved_mean, {d.c}, k, "saved_mean");
  detail::require_shape(saved_invstd, {d.c}, k, "saved_invstd");
  if (relu_output) detail::require_same(x, *relu_output, k, "x", "relu_output");
  else if (relu_affine) detail::require_shape(*relu_affine, {2, d.c}, k, "relu_affine");
  ensure_shape(dx, x.shape());
  ensure_shape(dgamma, {d.c});
  ensure_shape(dbeta, {d.c});
  const float* xp = x.data();
  const float* gp = dy.data();
  float* dxp = dx.data();
  const float* gm = gamma.data();
  const float* mean = saved_mean.data();
  const float* invstd = saved_invstd.data();
  if (relu_output) {
    const keep_where_output keep{relu_output->data()};
    gradient_by_images(ctx, d, xp, gp, dxp, [&](int64_t) { return keep; }, gm, mean, invstd, dgamma.data(),
                       dbeta.data());
  } else if (relu_affine) {
    const float* ra = relu_affine->data();
    gradient_by_images(ctx, d, xp, gp, dxp, [&](int64_t c) { return keep_where_affine{xp, ra[c], ra[d.c + c]}; }, gm,
                       mean, invstd, dgamma.data(), dbeta.data());
  } else {
    gradient_by_images(ctx, d, xp, gp, dxp, [](int64_t) { return keep_all{}; }, gm, mean, invstd, dgamma.data(),
                       dbeta.data());
  }
}

float softmax_cross_entropy(const context& ctx, const tensor& logits,
                            const std::vector<int32_t>& labels, tensor* dlogits) {
  const char* k = "softmax_cross_entropy";
  detail::require_rank(logits, 2, k, "logits");
  const int64_t n = logits.dim(0), classes = logits.dim(1);
  detail::require(static_cast<int64_t>(labels.size()) == n, k,
                  [&] {
                    return std::to_string(labels.size()) + " labels for " + std::to_string(n) + " rows of logits";
                  });
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
    throw diverged_error(std::string(k) + ": loss is not finite (" + std::to_string(loss) +
                         "); the model diverged: lower the learning rate");
  return loss;
}

int64_t count_correct(const context& ctx, const tensor& logits, const std::vector<int32_t>& labels) {
  detail::require_rank(logits, 2, "count_correct", "logits");
  const int64_t n = logits.dim(0), classes = logits.dim(1);
  detail::require(static_cast<int64_t>(labels.size()) == n, "count_correct",
                  [&] { return std::to_string(labels.size()) + " labels for " + std::to_string(n) + " rows"; });
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits.data() + i * classes;
    correct += (std::max_element(z, z + classes) - z) == labels[i];
  }
  return correct;
}

} // namespace troupe::kernels
