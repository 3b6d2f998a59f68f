#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/conv_internal.hpp"
#include "kernels/cpu/gemm_own.hpp"
#include "kernels/cpu/simd_set.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

// ---------------------------------------------------------------- dense

namespace {

/// Below this many elements of dy the backward pass's mask and bias sums stay on one thread.
constexpr int64_t min_split_gradient = int64_t{1} << 13;

/// dy [n, out] masked where y > 0 (relu_backward's bits) into g, when y is given (else g is dy's own
/// memory and not written), and its column sums into db (when not null), each column's rows in order
/// (the bits of a loop adding row after row): the set's masked_column_sums, columns split over ctx's threads.
void gradient_rows(const context& ctx, int64_t n, int64_t out, const float* dy, const float* y, float* g, float* db) {
  const auto sums = detail::active_simd_kernels().masked_column_sums;
  const int threads = static_cast<int>(std::min<int64_t>(detail::threads(ctx), out / 16));
  if (threads < 2 || n * out < min_split_gradient || omp_in_parallel())
    return sums(y, dy, g, out, n, out, db);
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t j0 = out * t / nt / 16 * 16, j1 = t + 1 == nt ? out : out * (t + 1) / nt / 16 * 16;
    sums(y ? y + j0 : nullptr, dy + j0, g ? g + j0 : nullptr, out, n, j1 - j0, db ? db + j0 : nullptr);
  }
}

/// The masked gradient's memory: this thread's, kept between calls.
float* masked_buffer(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(static_cast<std::size_t>(floats));
  return buffer.data();
}

} // namespace

void dense_forward(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                   tensor& y, bool relu) {
  detail::require_rank(x, 2, "dense_forward", "x");
  detail::require_rank(w, 2, "dense_forward", "w");
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  detail::require(w.dim(1) == in, "dense_forward",
                  [&] { return "x has " + std::to_string(in) + " features per row but w " + w.shape().to_string() +
                      " expects " + std::to_string(w.dim(1)); });
  if (bias.defined()) detail::require_shape(bias, {out}, "dense_forward", "bias");
  ensure_shape(y, {n, out});
  const detail::gemm_epilogue epilogue{bias.defined() ? bias.data() : nullptr,
                                       relu ? detail::active_simd_kernels().relu_forward : nullptr};
  detail::gemm_then(ctx, false, true, n, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y.data(), out, epilogue);
}

void dense_backward(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                    tensor* dx, tensor& dw, tensor* dbias, const tensor* relu_output) {
  detail::require_rank(x, 2, "dense_backward", "x");
  detail::require_rank(w, 2, "dense_backward", "w");
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  detail::require(w.dim(1) == in, "dense_backward",
                  [&] { return "x " + x.shape().to_string() + " vs w " + w.shape().to_string(); });
  detail::require_shape(dy, {n, out}, "dense_backward", "dy");
  if (relu_output) detail::require_shape(*relu_output, {n, out}, "dense_backward", "relu_output");
  ensure_shape(dw, {out, in});
  if (dbias) ensure_shape(*dbias, {out});
  const float* g = dy.data();
  if (relu_output || dbias) {
    float* masked = relu_output ? masked_buffer(n * out) : nullptr;
    gradient_rows(ctx, n, out, dy.data(), relu_output ? relu_output->data() : nullptr, masked,
                  dbias ? dbias->data() : nullptr);
    if (masked) g = masked;
  }
  gemm(ctx, true, false, out, in, n, 1.0f, g, out, x.data(), in, 0.0f, dw.data(), in);
  if (dx) {
    ensure_shape(*dx, {n, in});
    gemm(ctx, false, false, n, in, out, 1.0f, g, out, w.data(), in, 0.0f, dx->data(), in);
  }
}

// ---------------------------------------------------------------- conv2d

shape conv2d_output_shape(const shape& x, const conv2d_geometry& g) {
  const char* k = "conv2d";
  detail::require(x.rank() == 4, k, [&] { return "input must be [n, c, h, w], got " + x.to_string(); });
  detail::require(g.kernel > 0 && g.stride > 0 && g.padding >= 0, k,
                  "kernel and stride must be positive and padding non-negative");
  detail::require(x[1] == g.in_channels, k,
                  [&] { return "expects " + std::to_string(g.in_channels) + " input channels, got " +
                      std::to_string(x[1]) + " (input " + x.to_string() + ")"; });
  int64_t hp = x[2] + 2 * g.padding, wp = x[3] + 2 * g.padding;
  detail::require(hp >= g.kernel && wp >= g.kernel, k,
                  [&] { return "kernel " + std::to_string(g.kernel) + " is larger than the padded input " +
                      std::to_string(hp) + "x" + std::to_string(wp); });
  return {x[0], g.out_channels, (hp - g.kernel) / g.stride + 1, (wp - g.kernel) / g.stride + 1};
}

bool detail::conv2d_direct_supported(const conv2d_geometry& g) {
  return (g.stride == 1 || g.stride == 2) && (g.kernel == 1 || g.kernel == 3 || g.kernel == 5 || g.kernel == 7);
}

bool detail::conv2d_winograd_supported(const conv2d_geometry& g) {
  return g.kernel == 3 && g.stride == 1 && g.padding >= 0 && g.padding <= 2;
}

// F(4x4, 3x3) multiplies 36 elements per tile of 16 outputs, F(2x2, 3x3) 16 per 4, but its
// transforms cost more per output and its tiles reach further past the plane's edge. Measured
// (troupe_conv_bench, docs/benchmarks.md): on 28 x 28 planes (49 tiles, its domain 0.56 of
// F(2x2)'s) it is faster both ways; on 14 x 14 (16 tiles reaching 16 x 16, 0.73) slower both
// ways; on 7 x 7 (0.56, 4 tiles) faster both ways once the weight gradient's products take the
// tiles of 8 images at a time (conv_winograd.cpp's weight_group).
int detail::winograd_tile_side(int64_t oh, int64_t ow) {
  auto tiles = [&](int64_t side) { return ((oh + side - 1) / side) * ((ow + side - 1) / side); };
  return 5 * 36 * tiles(4) <= 3 * 16 * tiles(2) ? 4 : 2;  // F(4x4) at most 0.6 of F(2x2)'s domain
}

namespace {

// cols [c*k*k, oh*ow] of one image x [c, h, w].
void im2col(const float* x, int64_t c, int64_t h, int64_t w, const conv2d_geometry& g, int64_t oh,
            int64_t ow, float* cols) {
  const int64_t k = g.kernel, s = g.stride, p = g.padding;
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t kh = 0; kh < k; ++kh)
      for (int64_t kw = 0; kw < k; ++kw) {
        float* row = cols + ((ci * k + kh) * k + kw) * oh * ow;
        const float* plane = x + ci * h * w;
        for (int64_t y = 0; y < oh; ++y) {
          float* dst = row + y * ow;
          int64_t ih = y * s - p + kh;
          if (ih < 0 || ih >= h) {
            std::fill_n(dst, ow, 0.0f);
            continue;
          }
          const float* src = plane + ih * w;
          if (s == 1) {
            // Columns ow0..ow1 map inside the row; the rest is padding.
            int64_t ow0 = std::max<int64_t>(0, p - kw), ow1 = std::min<int64_t>(ow, w + p - kw);
            if (ow1 < ow0) ow1 = ow0;
            std::fill_n(dst, ow0, 0.0f);
            std::memcpy(dst + ow0, src + ow0 - p + kw, (ow1 - ow0) * sizeof(float));
            std::fill_n(dst + ow1, ow - ow1, 0.0f);
          } else {
            for (int64_t xo = 0; xo < ow; ++xo) {
              int64_t iw = xo * s - p + kw;
              dst[xo] = (iw >= 0 && iw < w) ? src[iw] : 0.0f;
            }
          }
        }
      }
}

// Adds cols back into one image dx [c, h, w] (which the caller zeroes).
void col2im(const float* cols, int64_t c, int64_t h, int64_t w, const conv2d_geometry& g, int64_t oh,
            int64_t ow, float* x) {
  const int64_t k = g.kernel, s = g.stride, p = g.padding;
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t kh = 0; kh < k; ++kh)
      for (int64_t kw = 0; kw < k; ++kw) {
        const float* row = cols + ((ci * k + kh) * k + kw) * oh * ow;
        float* plane = x + ci * h * w;
        for (int64_t y = 0; y < oh; ++y) {
          int64_t ih = y * s - p + kh;
          if (ih < 0 || ih >= h) continue;
          const float* src = row + y * ow;
          float* dst = plane + ih * w;
          if (s == 1) {
            int64_t ow0 = std::max<int64_t>(0, p - kw), ow1 = std::min<int64_t>(ow, w + p - kw);
            for (int64_t xo = ow0; xo < ow1; ++xo) dst[xo - p + kw] += src[xo];
          } else {
            for (int64_t xo = 0; xo < ow; ++xo) {
              int64_t iw = xo * s - p + kw;
              if (iw >= 0 && iw < w) dst[iw] += src[xo];
            }
          }
        }
      }
}

/// The path conv2d takes for `g` under ctx.conv (context.hpp): direct, winograd or im2col.
conv_path path_for(const context& ctx, const conv2d_geometry& g) {
  const bool wide = g.in_channels >= 8 && g.out_channels >= 8;
  if (detail::conv2d_winograd_supported(g) &&
      (ctx.conv == conv_path::winograd || (ctx.conv == conv_path::automatic && wide)))
    return conv_path::winograd;
  if (ctx.conv != conv_path::im2col && detail::conv2d_direct_supported(g)) return conv_path::direct;
  return conv_path::im2col;
}

void conv2d_forward_im2col(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                           const conv2d_geometry& g, tensor& y, tensor& cols) {
  const shape ys = y.shape();
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const int64_t oc = g.out_channels, oh = ys[2], ow = ys[3], ohw = oh * ow;
  const int64_t ckk = c * g.kernel * g.kernel;
  ensure_shape(cols, {n, ckk, ohw});
  const float* xp = x.data();
  const float* wp = w.data();
  const float* bp = bias.defined() ? bias.data() : nullptr;
  float* yp = y.data();
  float* cp = cols.data();
  // One image per thread; GEMM inside a parallel region runs single-threaded.
#pragma omp parallel for schedule(static) num_threads(detail::threads(ctx)) if (ctx.threads > 1)
  for (int64_t i = 0; i < n; ++i) {
    float* ci = cp + i * ckk * ohw;
    float* yi = yp + i * oc * ohw;
    im2col(xp + i * c * h * wd, c, h, wd, g, oh, ow, ci);
    float beta = 0.0f;
    if (bp) {
      for (int64_t o = 0; o < oc; ++o) std::fill_n(yi + o * ohw, ohw, bp[o]);
      beta = 1.0f;
    }
    gemm(ctx, false, false, oc, ohw, ckk, 1.0f, wp, ckk, ci, ohw, beta, yi, ohw);
  }
}

void conv2d_backward_im2col(const context& ctx, const tensor& w, const tensor& cols, const tensor& dy,
                            const conv2d_geometry& g, const shape& x_shape, tensor* dx, tensor& dw,
                            tensor* dbias) {
  const int64_t n = x_shape[0], c = x_shape[1], h = x_shape[2], wd = x_shape[3];
  const int64_t oc = g.out_channels, oh = dy.dim(2), ow = dy.dim(3), ohw = oh * ow;
  const int64_t ckk = c * g.kernel * g.kernel;
  detail::require_shape(cols, {n, ckk, ohw}, "conv2d_backward", "cols (from conv2d_forward on the im2col path)");

  const int threads = detail::image_threads(ctx, n);
  // Per-thread partial sums of dw and dbias, reduced afterwards.
  std::vector<float> partial(static_cast<std::size_t>(threads) * (oc * ckk + oc), 0.0f);
  std::vector<float> dcols(dx ? static_cast<std::size_t>(threads) * ckk * ohw : 0);
  const float* dyp = dy.data();
  const float* cp = cols.data();
  const float* wp = w.data();
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    float* pdw = partial.data() + t * (oc * ckk + oc);
    float* pdb = pdw + oc * ckk;
    float* dc = dx ? dcols.data() + static_cast<std::size_t>(t) * ckk * ohw : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* dyi = dyp + i * oc * ohw;
      gemm(ctx, false, true, oc, ckk, ohw, 1.0f, dyi, ohw, cp + i * ckk * ohw, ohw, 1.0f, pdw, ckk);
      for (int64_t o = 0; o < oc; ++o) {
        float s = 0.0f;
        const float* r = dyi + o * ohw;
        for (int64_t j = 0; j < ohw; ++j) s += r[j];
        pdb[o] += s;
      }
      if (dc) {
        gemm(ctx, true, false, ckk, ohw, oc, 1.0f, wp, ckk, dyi, ohw, 0.0f, dc, ohw);
        float* dxi = dx->data() + i * c * h * wd;
        std::fill_n(dxi, c * h * wd, 0.0f);
        col2im(dc, c, h, wd, g, oh, ow, dxi);
      }
    }
  }
  float* dwp = dw.data();
  std::fill_n(dwp, oc * ckk, 0.0f);
  float* dbp = dbias ? dbias->data() : nullptr;
  if (dbp) std::fill_n(dbp, oc, 0.0f);
  for (int t = 0; t < threads; ++t) {
    const float* pdw = partial.data() + t * (oc * ckk + oc);
    for (int64_t j = 0; j < oc * ckk; ++j) dwp[j] += pdw[j];
    if (dbp)
      for (int64_t o = 0; o < oc; ++o) dbp[o] += pdw[oc * ckk + o];
  }
}

} // namespace

namespace {

/// The input a convolution reads: x, or on paths that cannot read x through `input_map`, the mapped
/// input made into `made` (checked against x's channels either way).
const tensor& mapped_input(const context& ctx, const tensor& x, const tensor* input_map, bool reads_map,
                           tensor& made, const char* kernel) {
  if (!input_map) return x;
  detail::require_shape(*input_map, {2, x.dim(1)}, kernel, "input_map");
  if (reads_map) return x;
  channel_affine_relu(ctx, x, *input_map, made);
  return made;
}

} // namespace

void conv2d_forward(const context& ctx, const tensor& x_in, const tensor& w, const tensor& bias,
                    const conv2d_geometry& g, tensor& y, tensor& cols, bool relu, const tensor* input_map) {
  const shape ys = conv2d_output_shape(x_in.shape(), g);
  detail::require_shape(w, {g.out_channels, g.in_channels, g.kernel, g.kernel}, "conv2d_forward", "w");
  if (bias.defined()) detail::require_shape(bias, {g.out_channels}, "conv2d_forward", "bias");
  ensure_shape(y, ys);
  const conv_path path = path_for(ctx, g);
  tensor made;
  const tensor& x = mapped_input(ctx, x_in, input_map, path == conv_path::winograd, made, "conv2d_forward");
  if (path != conv_path::im2col) {
    cols = tensor();
    if (path == conv_path::winograd)
      detail::active_simd_kernels().forward_winograd(ctx, x, w, bias, g, relu, y, nullptr, input_map);
    else
      detail::active_simd_kernels().forward_direct(ctx, x, w, bias, g, relu, y, nullptr, nullptr);
  } else {
    conv2d_forward_im2col(ctx, x, w, bias, g, y, cols);
    if (relu) relu_forward(ctx, y, y);
  }
}

void conv2d_backward(const context& ctx, const tensor& x_in, const tensor& w, const tensor& cols, const tensor& dy,
                     const conv2d_geometry& g, tensor* dx, tensor& dw, tensor* dbias, const tensor* relu_output,
                     const tensor* dx_addend, const tensor* input_map) {
  const shape ys = conv2d_output_shape(x_in.shape(), g);
  const conv_path path = path_for(ctx, g);
  tensor made;  // im2col's backward reads the forward's columns, not x
  const tensor& x = mapped_input(ctx, x_in, input_map, path != conv_path::direct, made, "conv2d_backward");
  detail::require_shape(dy, ys, "conv2d_backward", "dy");
  detail::require_shape(w, {g.out_channels, g.in_channels, g.kernel, g.kernel}, "conv2d_backward", "w");
  if (relu_output) detail::require_shape(*relu_output, ys, "conv2d_backward", "relu_output");
  ensure_shape(dw, w.shape());
  if (dbias) ensure_shape(*dbias, {g.out_channels});
  if (dx) ensure_shape(*dx, x.shape());
  if (dx && dx_addend) {
    detail::require_shape(*dx_addend, x.shape(), "conv2d_backward", "dx_addend");
    detail::require(!dx->shares_storage(*dx_addend), "conv2d_backward", "dx_addend shares dx's memory");
  }
  if (path == conv_path::winograd) {
    detail::active_simd_kernels().backward_winograd(ctx, x, w, dy, relu_output, g, dx, dx_addend, dw, dbias, nullptr,
                                                    input_map);
    return;
  }
  if (path == conv_path::direct) {
    detail::active_simd_kernels().backward_direct(ctx, x, w, dy, relu_output, g, dx, dx_addend, dw, dbias, nullptr,
                                                  nullptr);
    return;
  }
  if (relu_output) {
    tensor masked;
    relu_backward(ctx, *relu_output, dy, masked);
    conv2d_backward_im2col(ctx, w, cols, masked, g, x.shape(), dx, dw, dbias);
  } else {
    conv2d_backward_im2col(ctx, w, cols, dy, g, x.shape(), dx, dw, dbias);
  }
  if (dx && dx_addend) add(ctx, *dx, *dx_addend, *dx);
}

bool conv2d_relu_pool_supported(const context& ctx, const conv2d_geometry& g) {
  const conv_path path = path_for(ctx, g);
  return path == conv_path::winograd || (path == conv_path::direct && g.stride == 1 && g.padding < g.kernel);
}

namespace {

/// The pool's output shape of conv2d_relu_pool_forward for x, after checking its operands.
shape relu_pool_shape(const context& ctx, const tensor& x, const tensor& w, const conv2d_geometry& g,
                      const char* what) {
  const shape cs = conv2d_output_shape(x.shape(), g);
  detail::require_shape(w, {g.out_channels, g.in_channels, g.kernel, g.kernel}, what, "w");
  detail::require(cs[2] >= 2 && cs[3] >= 2, what,
                  [&] { return "the convolution's output " + cs.to_string() + " is smaller than the 2x2 window"; });
  detail::require(conv2d_relu_pool_supported(ctx, g), what,
                  "needs the direct kernels (stride 1, padding < kernel) or Winograd's for this geometry");
  return {cs[0], cs[1], cs[2] / 2, cs[3] / 2};
}

} // namespace

void conv2d_relu_pool_forward(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                              const conv2d_geometry& g, tensor& y, tensor& window) {
  const shape ps = relu_pool_shape(ctx, x, w, g, "conv2d_relu_pool_forward");
  if (bias.defined()) detail::require_shape(bias, {g.out_channels}, "conv2d_relu_pool_forward", "bias");
  ensure_shape(y, ps);
  const detail::simd_kernel_set& set = detail::active_simd_kernels();
  (path_for(ctx, g) == conv_path::winograd ? set.forward_winograd : set.forward_direct)(ctx, x, w, bias, g, true, y,
                                                                                        &window, nullptr);
}

void conv2d_relu_pool_backward(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                               const tensor& y, const tensor& window, const conv2d_geometry& g, tensor* dx,
                               tensor& dw, tensor* dbias) {
  const shape ps = relu_pool_shape(ctx, x, w, g, "conv2d_relu_pool_backward");
  detail::require_shape(dy, ps, "conv2d_relu_pool_backward", "dy");
  detail::require_shape(y, ps, "conv2d_relu_pool_backward", "y");
  detail::require(window.rank() == 3 && window.dim(0) == ps[0] && window.dim(1) == ps[2] * ps[3] &&
                      window.dim(2) >= ps[1],
                  "conv2d_relu_pool_backward",
                  [&] { return "window " + window.shape().to_string() + " is not the forward pass's"; });
  ensure_shape(dw, w.shape());
  if (dbias) ensure_shape(*dbias, {g.out_channels});
  if (dx) ensure_shape(*dx, x.shape());
  const detail::simd_kernel_set& set = detail::active_simd_kernels();
  (path_for(ctx, g) == conv_path::winograd ? set.backward_winograd : set.backward_direct)(ctx, x, w, dy, &y, g, dx,
                                                                                          nullptr, dw, dbias, &window,
                                                                                          nullptr);
}

void detail::conv2d_backward_data_gemm(const context& ctx, const tensor& w, const tensor& dy,
                                       const conv2d_geometry& g, tensor& dx) {
  const int64_t n = dx.dim(0), c = dx.dim(1), h = dx.dim(2), wd = dx.dim(3);
  const int64_t oc = g.out_channels, oh = dy.dim(2), ow = dy.dim(3), ohw = oh * ow;
  const int64_t ckk = c * g.kernel * g.kernel;
  const int threads = detail::image_threads(ctx, n);
  std::vector<float> dcols(static_cast<std::size_t>(threads) * ckk * ohw);
  const float* wp = w.data();
  const float* dyp = dy.data();
  float* dxp = dx.data();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* dc = dcols.data() + static_cast<std::size_t>(omp_get_thread_num()) * ckk * ohw;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      gemm(ctx, true, false, ckk, ohw, oc, 1.0f, wp, ckk, dyp + i * oc * ohw, ohw, 0.0f, dc, ohw);
      float* dxi = dxp + i * c * h * wd;
      std::fill_n(dxi, c * h * wd, 0.0f);
      col2im(dc, c, h, wd, g, oh, ow, dxi);
    }
  }
}

} // namespace troupe::kernels
