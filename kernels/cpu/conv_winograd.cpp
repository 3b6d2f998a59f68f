// conv2d by Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray, "Fast
// Algorithms for Convolutional Neural Networks", 2016): 3x3 kernels, stride 1.
//
// Each 2x2 block of outputs comes from a 4x4 tile d of the input:
// Y = A^T [(G g G^T) . (B^T d B)] A, 16 multiplications per input channel
// instead of 36. Over a whole image the 16 elementwise products become 16
// GEMMs, one per tile element xi: M[xi] (tiles x oc) = V[xi] (tiles x c) *
// U[xi] (c x oc), with V = B^T d B of every tile and U = G g G^T of every
// kernel: 2.25x fewer multiply-adds than the direct convolution, paid for by
// the transforms (additions only, on channel vectors).
//
// Backward data of a stride-1 convolution is the forward convolution of dy
// (padded by 2 - p) with the kernels rotated by 180 degrees and their channels
// swapped: the same code. Backward weights go through the same domain:
// dU[xi] (c x oc) = V[xi]^T dM[xi] with dM = A dy A^T of each output tile,
// summed over the tiles of every image, then dW = G^T dU G.
//
// Layouts, per image: the input position-major [h * w][cp] (load_positions
// transposes it, channel vectors contiguous), V [16][tiles][cp], U [16][cp][ocp],
// M [16][tiles][ocp], the output position-major [oh * ow][ocp] until
// store_channels writes NCHW with the bias and ReLU. The rounding differs
// from the direct kernels' (the transforms add and subtract before the
// products): the tests compare against im2col within 1e-5 relative.
//
// Compiled once per instruction set, into namespace detail::TROUPE_ISA
// (cmake/troupe_kernel_sets.cmake, simd_set.hpp): simd::width is that set's.

#include <omp.h>

#include <algorithm>
#include <array>
#include <utility>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/conv_internal.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels::detail::TROUPE_ISA {

namespace {

constexpr int W = simd::width;
constexpr int64_t elements = 16;  // of a 4x4 tile

/// A plane of h x w positions cut into 2x2 output tiles, each reading a 4x4
/// input tile whose corner is at (2 ty - p, 2 tx - p).
struct tiling {
  int64_t h, w, p;  // input plane and padding
  int64_t oh, ow;   // output plane
  int64_t th, tw;   // tiles down and across
  int64_t tiles() const { return th * tw; }
};

tiling make_tiling(int64_t h, int64_t w, int64_t p) {
  const int64_t oh = h + 2 * p - 2, ow = w + 2 * p - 2;
  return {h, w, p, oh, ow, (oh + 1) / 2, (ow + 1) / 2};
}

// ---------------------------------------------------------------- transforms

/// B^T d B of one channel vector's 4x4 tile d (element (i, j) at d + i * row + j * col) into the
/// 16 elements' rows of v, `step` apart. Straight-line code on registers: the tile's loads,
/// 32 additions, the 16 stores.
inline void tile_input_transform(const float* d, int64_t row, int64_t col, float* out, int64_t step) {
  simd::vec e[4][4];
  for (int j = 0; j < 4; ++j) {  // B^T d, column j
    const float* at = d + j * col;
    const simd::vec d0 = simd::load(at), d1 = simd::load(at + row), d2 = simd::load(at + 2 * row),
                    d3 = simd::load(at + 3 * row);
    e[0][j] = simd::sub(d0, d2);
    e[1][j] = simd::add(d1, d2);
    e[2][j] = simd::sub(d2, d1);
    e[3][j] = simd::sub(d1, d3);
  }
  for (int i = 0; i < 4; ++i) {  // (B^T d) B, row i
    simd::store(out, simd::sub(e[i][0], e[i][2]));
    simd::store(out + step, simd::add(e[i][1], e[i][2]));
    simd::store(out + 2 * step, simd::sub(e[i][2], e[i][1]));
    simd::store(out + 3 * step, simd::sub(e[i][1], e[i][3]));
    out += 4 * step;
  }
}

/// v[xi][t - t0][cp] = B^T d B for the 4x4 tiles d of xt [h * w][cp]
/// (position-major) numbered t0 ... t0 + nt - 1 (row by row); zero outside the plane.
/// A tile inside the plane is read in place; one at its edge is copied into a
/// zero-padded 4x4 first (the same arithmetic either way).
void input_transform(const float* xt, const tiling& g, int64_t cp, int64_t t0, int64_t nt, float* v) {
  const int64_t step = nt * cp;  // between the 16 elements
  alignas(64) float edge[elements * W];
  for (int64_t t = t0; t < t0 + nt; ++t) {
    const int64_t ty = t / g.tw, tx = t % g.tw;
    const int64_t r0 = 2 * ty - g.p, c0 = 2 * tx - g.p;
    const bool inside = r0 >= 0 && c0 >= 0 && r0 + 3 < g.h && c0 + 3 < g.w;
    float* out = v + (t - t0) * cp;
    if (inside) {
      const float* corner = xt + (r0 * g.w + c0) * cp;
      for (int64_t cb = 0; cb < cp; cb += W) tile_input_transform(corner + cb, g.w * cp, cp, out + cb, step);
      continue;
    }
    for (int64_t cb = 0; cb < cp; cb += W) {
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          const int64_t r = r0 + i, c = c0 + j;
          const bool in = r >= 0 && r < g.h && c >= 0 && c < g.w;
          simd::store(edge + (4 * i + j) * W, in ? simd::load(xt + (r * g.w + c) * cp + cb) : simd::zero());
        }
      tile_input_transform(edge, 4 * W, W, out + cb, step);
    }
  }
}

/// A^T m A of one channel vector's tile (its 16 elements `step` apart from m) into the 2x2
/// outputs y00 (at y), y01 (y + col), y10 (y + row), y11 (y + row + col).
inline void tile_output_transform(const float* m, int64_t step, float* y, int64_t row, int64_t col) {
  simd::vec f[2][4];
  for (int j = 0; j < 4; ++j) {  // A^T m, column j
    const simd::vec m0 = simd::load(m + j * step), m1 = simd::load(m + (4 + j) * step);
    const simd::vec m2 = simd::load(m + (8 + j) * step), m3 = simd::load(m + (12 + j) * step);
    f[0][j] = simd::add(simd::add(m0, m1), m2);
    f[1][j] = simd::sub(simd::sub(m1, m2), m3);
  }
  for (int a = 0; a < 2; ++a, y += row) {
    simd::store(y, simd::add(simd::add(f[a][0], f[a][1]), f[a][2]));
    simd::store(y + col, simd::sub(simd::sub(f[a][1], f[a][2]), f[a][3]));
  }
}

/// out [oh * ow][ocp] (position-major) = A^T m A for the tiles t0 ... t0 + nt - 1 of
/// m [xi][t - t0][ocp]; positions beyond the plane are dropped (a tile at the plane's
/// edge goes through a 2x2 of its own first).
void output_transform(const float* m, const tiling& g, int64_t ocp, int64_t t0, int64_t nt, float* out) {
  const int64_t step = nt * ocp;
  alignas(64) float edge[4 * W];
  for (int64_t t = t0; t < t0 + nt; ++t) {
    const int64_t ty = t / g.tw, tx = t % g.tw, y0 = 2 * ty, x0 = 2 * tx;
    const float* in = m + (t - t0) * ocp;
    float* corner = out + (y0 * g.ow + x0) * ocp;
    const bool down = y0 + 1 < g.oh, across = x0 + 1 < g.ow;
    if (down && across) {
      for (int64_t cb = 0; cb < ocp; cb += W) tile_output_transform(in + cb, step, corner + cb, g.ow * ocp, ocp);
      continue;
    }
    for (int64_t cb = 0; cb < ocp; cb += W) {
      tile_output_transform(in + cb, step, edge, 2 * W, W);
      simd::store(corner + cb, simd::load(edge));
      if (across) simd::store(corner + ocp + cb, simd::load(edge + W));
      if (down) simd::store(corner + g.ow * ocp + cb, simd::load(edge + 2 * W));
    }
  }
}

/// dm [xi][t][ocp] = A dy A^T for every 2x2 tile of dyt [oh * ow][ocp]
/// (position-major); zero beyond the plane.
void gradient_transform(const float* dyt, const tiling& g, int64_t ocp, float* dm) {
  const int64_t step = g.tiles() * ocp;
  for (int64_t ty = 0; ty < g.th; ++ty)
    for (int64_t tx = 0; tx < g.tw; ++tx) {
      const int64_t y0 = 2 * ty, x0 = 2 * tx;
      const bool down = y0 + 1 < g.oh, across = x0 + 1 < g.ow;
      float* tile = dm + (ty * g.tw + tx) * ocp;
      for (int64_t cb = 0; cb < ocp; cb += W) {
        const float* at = dyt + (y0 * g.ow + x0) * ocp + cb;
        const simd::vec d00 = simd::load(at), d01 = across ? simd::load(at + ocp) : simd::zero();
        const simd::vec d10 = down ? simd::load(at + g.ow * ocp) : simd::zero();
        const simd::vec d11 = down && across ? simd::load(at + (g.ow + 1) * ocp) : simd::zero();
        // A dy: rows d0, d0 + d1, d0 - d1, -d1 (for each column b).
        const simd::vec r[4][2] = {{d00, d01},
                                   {simd::add(d00, d10), simd::add(d01, d11)},
                                   {simd::sub(d00, d10), simd::sub(d01, d11)},
                                   {simd::sub(simd::zero(), d10), simd::sub(simd::zero(), d11)}};
        float* out = tile + cb;
        for (int i = 0; i < 4; ++i, out += 4 * step) {  // (A dy) A^T, row i
          simd::store(out, r[i][0]);
          simd::store(out + step, simd::add(r[i][0], r[i][1]));
          simd::store(out + 2 * step, simd::sub(r[i][0], r[i][1]));
          simd::store(out + 3 * step, simd::sub(simd::zero(), r[i][1]));
        }
      }
    }
}

/// u [xi][rp][qp] = G k G^T of the 3x3 kernel k(r, q) for r < rows, q < cols
/// (zero elsewhere); `rotated` reads each kernel turned by 180 degrees. Rows
/// split over `threads`; in each row, the taps of every kernel are gathered
/// [9][qp] (scratch slot 2) and W kernels transformed at a time, with the
/// scalar formula's operations in its order.
template <class Kernel>
void weight_transform(Kernel kernel, int64_t rows, int64_t cols, int64_t rp, int64_t qp, bool rotated, int threads,
                      float* u) {
  std::fill_n(u, elements * rp * qp, 0.0f);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    float* taps = scratch(2, static_cast<std::size_t>(9 * qp));
    for (int64_t q = 0; q < qp; ++q) {
      const float* k = q < cols ? kernel(r, q) : nullptr;
      for (int tap = 0; tap < 9; ++tap) taps[tap * qp + q] = k ? k[rotated ? 8 - tap : tap] : 0.0f;
    }
    const simd::vec half = simd::splat(0.5f);
    for (int64_t q0 = 0; q0 < qp; q0 += W) {
      simd::vec t[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        const simd::vec g0 = simd::load(taps + j * qp + q0), g1 = simd::load(taps + (3 + j) * qp + q0);
        const simd::vec g2 = simd::load(taps + (6 + j) * qp + q0);
        t[0][j] = g0;
        t[1][j] = simd::mul(half, simd::add(simd::add(g0, g1), g2));
        t[2][j] = simd::mul(half, simd::add(simd::sub(g0, g1), g2));
        t[3][j] = g2;
      }
      for (int i = 0; i < 4; ++i) {  // (G g) G^T
        const simd::vec e[4] = {t[i][0], simd::mul(half, simd::add(simd::add(t[i][0], t[i][1]), t[i][2])),
                                simd::mul(half, simd::add(simd::sub(t[i][0], t[i][1]), t[i][2])), t[i][2]};
        for (int j = 0; j < 4; ++j) simd::store(u + ((4 * i + j) * rp + r) * qp + q0, e[j]);
      }
    }
  }
}

/// The threads' partial sums (`threads` blocks of `part` floats) added into the first, each element in
/// thread order (the elements split over the threads).
void sum_into_first(float* partial, int64_t part, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t j = 0; j < part; ++j)
    for (int t = 1; t < threads; ++t) partial[j] += partial[part * t + j];
}

/// dw [oc][c][3][3] = G^T du G of du [xi][cp][ocp] (rows: input channels); output
/// channels split over `threads`.
void weight_gradient(const float* du, int64_t c, int64_t oc, int64_t cp, int64_t ocp, int threads, float* dw) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t o = 0; o < oc; ++o)
    for (int64_t ci = 0; ci < c; ++ci) {
      float d[4][4];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) d[i][j] = du[((4 * i + j) * cp + ci) * ocp + o];
      float s[3][4];  // G^T d
      for (int j = 0; j < 4; ++j) {
        s[0][j] = d[0][j] + 0.5f * (d[1][j] + d[2][j]);
        s[1][j] = 0.5f * (d[1][j] - d[2][j]);
        s[2][j] = 0.5f * (d[1][j] + d[2][j]) + d[3][j];
      }
      float* out = dw + (o * c + ci) * 9;
      for (int k = 0; k < 3; ++k) {  // (G^T d) G
        out[k * 3 + 0] = s[k][0] + 0.5f * (s[k][1] + s[k][2]);
        out[k * 3 + 1] = 0.5f * (s[k][1] - s[k][2]);
        out[k * 3 + 2] = 0.5f * (s[k][1] + s[k][2]) + s[k][3];
      }
    }
}

// ---------------------------------------------------------------- the 16 GEMMs

/// c[j][v] (MR rows x NV vectors, row stride ldc) (+)= sum over kk < depth of
/// a[j * a_row + kk * a_depth] * b[kk * ldb + v * W]: a register tile, A read
/// by broadcasts (either orientation), B by vectors.
template <int NV, int MR>
void gemm_tile(const float* a, int64_t a_row, int64_t a_depth, int64_t depth, const float* b, int64_t ldb,
               float* c, int64_t ldc, bool accumulate) {
  simd::vec acc[MR][NV];
#pragma GCC unroll 32
  for (int j = 0; j < MR; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[j][v] = accumulate ? simd::load(c + j * ldc + v * W) : simd::zero();
  for (int64_t kk = 0; kk < depth; ++kk, a += a_depth, b += ldb) {
    simd::vec bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = simd::load(b + v * W);
#pragma GCC unroll 32
    for (int j = 0; j < MR; ++j) {
      const simd::vec ab = simd::broadcast(a + j * a_row);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[j][v] = simd::fma(ab, bv[v], acc[j][v]);
    }
  }
#pragma GCC unroll 32
  for (int j = 0; j < MR; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) simd::store(c + j * ldc + v * W, acc[j][v]);
}

using gemm_fn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t, bool);

constexpr int max_vectors = 4;
/// The most rows a tile of NV vectors covers (the rest of the registers hold B and the broadcast).
constexpr int max_rows(int nv) { return std::min(12, simd::accumulators / nv); }

template <int NV, int... M>
constexpr std::array<gemm_fn, sizeof...(M)> gemm_table(std::integer_sequence<int, M...>) {
  return {&gemm_tile<NV, M + 1>...};
}

template <int NV>
gemm_fn gemm_kernel(int rows) {
  static constexpr auto table = gemm_table<NV>(std::make_integer_sequence<int, max_rows(NV)>());
  return table[static_cast<std::size_t>(rows - 1)];
}

gemm_fn gemm_kernel(int nv, int rows) {
  switch (nv) {
    case 1: return gemm_kernel<1>(rows);
    case 2: return gemm_kernel<2>(rows);
    case 3: return gemm_kernel<3>(rows);
    default: return gemm_kernel<4>(rows);
  }
}

/// c [rows][ldc] (+)= A (rows x depth, strides a_row and a_depth) * b [depth][ldb],
/// for the first `vectors` channel vectors of b and c.
void gemm(int64_t rows, int64_t depth, const float* a, int64_t a_row, int64_t a_depth, const float* b, int64_t ldb,
          int64_t vectors, float* c, int64_t ldc, bool accumulate) {
  for (int64_t v0 = 0; v0 < vectors;) {
    const int nv = static_cast<int>(std::min<int64_t>(max_vectors, vectors - v0));
    const int64_t most = max_rows(nv), tiles = (rows + most - 1) / most;
    for (int64_t t = 0, r = 0; t < tiles; ++t) {
      const int64_t n = (rows - r) / (tiles - t);  // near-equal tiles
      gemm_kernel(nv, static_cast<int>(n))(a + r * a_row, a_row, a_depth, depth, b + v0 * W, ldb,
                                           c + r * ldc + v0 * W, ldc, accumulate);
      r += n;
    }
    v0 += nv;
  }
}

/// How many tiles convolve transforms and multiplies at a time: as many as keep that block's
/// V and M in the L1 cache (24 KiB of them), at least a register tile's rows.
int64_t block_tiles(int64_t cp, int64_t ocp) {
  constexpr int64_t l1_bytes = 24 * 1024, rows = 12;
  const int64_t fit = l1_bytes / (elements * (cp + ocp) * static_cast<int64_t>(sizeof(float)));
  return std::max(rows, fit / rows * rows);
}

/// One image's convolution in the Winograd domain: xt [h * w][cp] (c real
/// channels) into out [oh * ow][ocp] with u [xi][cp][ocp]. The tiles go in
/// near-equal blocks of at most block_tiles: each block's input transform,
/// 16 products and output transform run while its V and M are in the L1
/// cache (the whole image's would be in L2). v and m are scratch for a block.
void convolve(const float* xt, const tiling& g, int64_t c, int64_t cp, const float* u, int64_t ocp, float* v,
              float* m, float* out) {
  const int64_t tiles = g.tiles(), most = block_tiles(cp, ocp), blocks = (tiles + most - 1) / most;
  for (int64_t b = 0, t0 = 0; b < blocks; ++b) {
    const int64_t nt = (tiles - t0) / (blocks - b);
    input_transform(xt, g, cp, t0, nt, v);
    for (int64_t xi = 0; xi < elements; ++xi)
      gemm(nt, c, v + xi * nt * cp, cp, 1, u + xi * cp * ocp, ocp, ocp / W, m + xi * nt * ocp, ocp, false);
    output_transform(m, g, ocp, t0, nt, out);
    t0 += nt;
  }
}

} // namespace

void conv2d_forward_winograd(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                             const conv2d_geometry& g, bool relu, tensor& y, tensor* window) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3), oc = g.out_channels;
  const int64_t cp = round_up(c, W), ocp = round_up(oc, W);
  const tiling tl = make_tiling(h, wd, g.padding);
  float* u = scratch(0, static_cast<std::size_t>(elements * cp * ocp));
  const float* wp = w.data();
  weight_transform([&](int64_t ci, int64_t o) { return wp + (o * c + ci) * 9; }, c, oc, cp, ocp, false,
                   detail::threads(ctx), u);
  const float* xp = x.data();
  const float* bp = bias.defined() ? bias.data() : nullptr;
  float* yp = y.data();
  const int64_t pooled = (tl.oh / 2) * (tl.ow / 2);
  if (window) ensure_shape(*window, {n, pooled, ocp});
  float* windowp = window ? window->data() : nullptr;
  const int threads = detail::image_threads(ctx, n);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t i = 0; i < n; ++i) {
    float* xt = scratch(2, static_cast<std::size_t>(h * wd * cp));
    const int64_t block = std::min(tl.tiles(), block_tiles(cp, ocp));
    float* v = scratch(3, static_cast<std::size_t>(elements * block * cp));
    float* m = scratch(4, static_cast<std::size_t>(elements * block * ocp));
    float* out = scratch(5, static_cast<std::size_t>(tl.oh * tl.ow * ocp));
    load_positions(xp + i * c * h * wd, nullptr, h * wd, c, cp, xt, nullptr);
    convolve(xt, tl, c, cp, u, ocp, v, m, out);
    if (windowp)
      store_pooled(out, tl.oh, tl.ow, ocp, oc, bp, yp + i * oc * pooled, windowp + i * pooled * ocp);
    else
      store_channels(out, tl.oh * tl.ow, ocp, oc, bp, relu, yp + i * oc * tl.oh * tl.ow);
  }
}

void conv2d_backward_winograd(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                              const tensor* relu_output, const conv2d_geometry& g, tensor* dx, tensor& dw,
                              tensor* dbias, const tensor* window) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3), oc = g.out_channels;
  const int64_t cp = round_up(c, W), ocp = round_up(oc, W);
  const tiling fwd = make_tiling(h, wd, g.padding);          // x -> y
  const tiling bwd = make_tiling(fwd.oh, fwd.ow, 2 - g.padding);  // dy -> dx
  const int64_t positions = fwd.oh * fwd.ow;
  const int threads = detail::image_threads(ctx, n);

  // Per-thread partial sums of dU [xi][cp][ocp] and dbias [ocp], in the calling thread's scratch.
  const std::size_t part = static_cast<std::size_t>(elements * cp * ocp + ocp);
  float* partial = scratch(0, part * threads);
  std::fill_n(partial, part * threads, 0.0f);
  float* urot = nullptr;  // the rotated kernels, output channels as rows
  if (dx) {
    urot = scratch(1, static_cast<std::size_t>(elements * ocp * cp));
    const float* wp = w.data();
    weight_transform([&](int64_t o, int64_t ci) { return wp + (o * c + ci) * 9; }, oc, c, ocp, cp, true, threads,
                     urot);
  }
  const float* xp = x.data();
  const output_gradient grad =
      output_gradient::of(dy, relu_output, window, fwd.oh, fwd.ow, oc, ocp, "conv2d_backward_winograd");
  float* dxp = dx ? dx->data() : nullptr;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* du = partial + part * omp_get_thread_num();
    float* db = dbias ? du + elements * cp * ocp : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float* xt = scratch(2, static_cast<std::size_t>(h * wd * cp));
      float* v = scratch(3, static_cast<std::size_t>(elements * fwd.tiles() * cp));
      float* dyt = scratch(4, static_cast<std::size_t>(positions * ocp));
      float* dm = scratch(5, static_cast<std::size_t>(elements * fwd.tiles() * ocp));
      load_positions(xp + i * c * h * wd, nullptr, h * wd, c, cp, xt, nullptr);
      input_transform(xt, fwd, cp, 0, fwd.tiles(), v);
      grad.load(i, dyt, db);
      gradient_transform(dyt, fwd, ocp, dm);
      const int64_t tiles = fwd.tiles();
      for (int64_t xi = 0; xi < elements; ++xi)  // dU[xi] += V[xi]^T dM[xi]
        gemm(c, tiles, v + xi * tiles * cp, 1, cp, dm + xi * tiles * ocp, ocp, ocp / W, du + xi * cp * ocp, ocp,
             true);
      if (dx) {
        const int64_t block = std::min(bwd.tiles(), block_tiles(ocp, cp));
        float* vd = scratch(6, static_cast<std::size_t>(elements * block * ocp));
        float* md = scratch(7, static_cast<std::size_t>(elements * block * cp));
        float* out = scratch(8, static_cast<std::size_t>(h * wd * cp));
        convolve(dyt, bwd, oc, ocp, urot, cp, vd, md, out);
        store_channels(out, h * wd, cp, c, nullptr, false, dxp + i * c * h * wd);
      }
    }
  }
  // Sum the threads' partials into the first, then back from the Winograd domain.
  sum_into_first(partial, static_cast<int64_t>(part), threads);
  weight_gradient(partial, c, oc, cp, ocp, threads, dw.data());
  if (dbias) std::copy_n(partial + elements * cp * ocp, oc, dbias->data());
}

} // namespace troupe::kernels::detail::TROUPE_ISA
