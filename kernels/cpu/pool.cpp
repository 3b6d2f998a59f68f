#include <algorithm>
#include <limits>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/simd_set.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

shape pool2d_output_shape(const shape& x, const pool2d_geometry& g) {
  const char* k = "pool2d";
  detail::require(x.rank() == 4, k, [&] { return "input must be [n, c, h, w], got " + x.to_string(); });
  detail::require(g.kernel > 0 && g.stride > 0, k, "kernel and stride must be positive");
  detail::require(x[2] >= g.kernel && x[3] >= g.kernel, k,
                  [&] { return "window " + std::to_string(g.kernel) + " is larger than the input " + x.to_string(); });
  return {x[0], x[1], (x[2] - g.kernel) / g.stride + 1, (x[3] - g.kernel) / g.stride + 1};
}

void max_pool2d_forward(const context& ctx, const tensor& x, const pool2d_geometry& g, tensor& y,
                        std::vector<int32_t>& argmax) {
  shape ys = pool2d_output_shape(x.shape(), g);
  ensure_shape(y, ys);
  argmax.resize(static_cast<std::size_t>(y.numel()));
  const int64_t planes = ys[0] * ys[1], h = x.dim(2), w = x.dim(3), oh = ys[2], ow = ys[3];
  const int64_t k = g.kernel, s = g.stride;
  const float* xp = x.data();
  float* yp = y.data();
  int32_t* ap = argmax.data();
  const auto pool_plane = detail::active_simd_kernels().max_pool_2x2_plane;
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, x.numel()))
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* in = xp + pl * h * w;
    if (k == 2 && s == 2) {
      pool_plane(in, h, w, static_cast<int32_t>(pl * h * w), yp + pl * oh * ow, ap + pl * oh * ow);
      continue;
    }
    for (int64_t r = 0; r < oh; ++r)
      for (int64_t c = 0; c < ow; ++c) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t at = (r * s) * w + c * s;
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j) {
            int64_t idx = (r * s + i) * w + c * s + j;
            if (in[idx] > best) {
              best = in[idx];
              at = idx;
            }
          }
        int64_t o = pl * oh * ow + r * ow + c;
        yp[o] = best;
        ap[o] = static_cast<int32_t>(pl * h * w + at);
      }
  }
}

void max_pool2d_backward(const context& ctx, const tensor& dy, const std::vector<int32_t>& argmax,
                         const shape& x_shape, tensor& dx) {
  detail::require(static_cast<int64_t>(argmax.size()) == dy.numel(), "max_pool2d_backward",
                  [&] { return "dy " + dy.shape().to_string() + " does not match the forward pass's " +
                      std::to_string(argmax.size()) + " outputs"; });
  detail::require(dy.rank() == 4 && dy.dim(0) == x_shape[0] && dy.dim(1) == x_shape[1],
                  "max_pool2d_backward",
                  [&] { return "dy " + dy.shape().to_string() + " does not match input " + x_shape.to_string(); });
  ensure_shape(dx, x_shape);
  float* d = dx.data();
  const float* g = dy.data();
  // Each plane's maxima lie in the same plane of the input: planes split over threads.
  const int64_t planes = x_shape[0] * x_shape[1], in_plane = x_shape[2] * x_shape[3];
  const int64_t out_plane = planes ? dy.numel() / planes : 0;
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, dx.numel()))
  for (int64_t pl = 0; pl < planes; ++pl) {
    std::fill_n(d + pl * in_plane, in_plane, 0.0f);
    for (int64_t i = pl * out_plane; i < (pl + 1) * out_plane; ++i) d[argmax[i]] += g[i];
  }
}

void avg_pool2d_forward(const context& ctx, const tensor& x, const pool2d_geometry& g, tensor& y) {
  shape ys = pool2d_output_shape(x.shape(), g);
  ensure_shape(y, ys);
  const int64_t planes = ys[0] * ys[1], h = x.dim(2), w = x.dim(3), oh = ys[2], ow = ys[3];
  const int64_t k = g.kernel, s = g.stride;
  const float inv = 1.0f / static_cast<float>(k * k);
  const float* xp = x.data();
  float* yp = y.data();
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, x.numel()))
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* in = xp + pl * h * w;
    for (int64_t r = 0; r < oh; ++r)
      for (int64_t c = 0; c < ow; ++c) {
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j) sum += in[(r * s + i) * w + c * s + j];
        yp[pl * oh * ow + r * ow + c] = sum * inv;
      }
  }
}

void avg_pool2d_backward(const context& ctx, const tensor& dy, const pool2d_geometry& g,
                         const shape& x_shape, tensor& dx) {
  shape ys = pool2d_output_shape(x_shape, g);
  detail::require_shape(dy, ys, "avg_pool2d_backward", "dy");
  ensure_shape(dx, x_shape);
  dx.fill(0.0f);
  const int64_t planes = ys[0] * ys[1], h = x_shape[2], w = x_shape[3], oh = ys[2], ow = ys[3];
  const int64_t k = g.kernel, s = g.stride;
  const float inv = 1.0f / static_cast<float>(k * k);
  const float* gp = dy.data();
  float* dp = dx.data();
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, dx.numel()))
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* out = dp + pl * h * w;
    for (int64_t r = 0; r < oh; ++r)
      for (int64_t c = 0; c < ow; ++c) {
        float v = gp[pl * oh * ow + r * ow + c] * inv;
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j) out[(r * s + i) * w + c * s + j] += v;
      }
  }
}

void global_avg_pool2d_forward(const context& ctx, const tensor& x, tensor& y) {
  detail::require(x.defined() && x.rank() == 4, "global_avg_pool2d_forward",
                  [&] {
                    return "x must be [n, c, h, w], got " +
                           (x.defined() ? x.shape().to_string() : std::string("undefined"));
                  });
  const int64_t planes = x.dim(0) * x.dim(1), hw = x.dim(2) * x.dim(3);
  detail::require(hw > 0, "global_avg_pool2d_forward", [&] { return "empty planes in x " + x.shape().to_string(); });
  ensure_shape(y, {x.dim(0), x.dim(1)});
  const float inv = 1.0f / static_cast<float>(hw);
  const float* xp = x.data();
  float* yp = y.data();
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, x.numel()))
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* in = xp + pl * hw;
    float sum = 0.0f;
    for (int64_t i = 0; i < hw; ++i) sum += in[i];
    yp[pl] = sum * inv;
  }
}

void global_avg_pool2d_backward(const context& ctx, const tensor& dy, const shape& x_shape, tensor& dx) {
  detail::require(x_shape.rank() == 4, "global_avg_pool2d_backward",
                  [&] { return "x must be [n, c, h, w], got " + x_shape.to_string(); });
  detail::require_shape(dy, {x_shape[0], x_shape[1]}, "global_avg_pool2d_backward", "dy");
  ensure_shape(dx, x_shape);
  const int64_t planes = x_shape[0] * x_shape[1], hw = x_shape[2] * x_shape[3];
  const float inv = 1.0f / static_cast<float>(hw);
  const float* gp = dy.data();
  float* dp = dx.data();
#pragma omp parallel for schedule(static) num_threads(ctx.threads) if (detail::split(ctx, dx.numel()))
  for (int64_t pl = 0; pl < planes; ++pl) std::fill_n(dp + pl * hw, hw, gp[pl] * inv);
}

} // namespace troupe::kernels
