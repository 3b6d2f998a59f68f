// conv2d by Winograd's minimal filtering (Lavin and Gray, "Fast Algorithms
// for Convolutional Neural Networks", 2016): 3x3 kernels, stride 1, in two
// schemes, F(2x2, 3x3) and F(4x4, 3x3), chosen per plane (winograd_tile_side).
//
// F(m x m, 3x3): each m x m block of outputs comes from an (m+2) x (m+2)
// tile d of the input: Y = A^T [(G g G^T) . (B^T d B)] A, (m+2)^2
// multiplications per input channel instead of 9 m^2. Over a whole image the
// (m+2)^2 elementwise products become as many GEMMs, one per tile element xi:
// M[xi] (tiles x oc) = V[xi] (tiles x c) * U[xi] (c x oc), with V = B^T d B of
// every tile and U = G g G^T of every kernel: 2.25x (m = 2) or 4x (m = 4)
// fewer multiply-adds than the direct convolution, paid for by the transforms
// (additions and multiplications by small constants, on channel vectors), and
// by tiles that reach past the plane's edge (with m = 4 a 14 x 14 plane takes
// 16 x 16).
//
// Backward data of a stride-1 convolution is the forward convolution of dy
// (padded by 2 - p) with the kernels rotated by 180 degrees and their channels
// swapped: the same code. Backward weights go through the same domain:
// dU[xi] (c x oc) = V[xi]^T dM[xi] with dM = A dy A^T of each output tile,
// summed over the tiles of every image, then dW = G^T dU G.
//
// Layouts, per image: the input position-major and zero-padded so that every
// tile lies inside, [rows][cols][cp] (load_padded transposes it, channel
// vectors contiguous); V [xi][tiles][cp], U [xi][cp][ocp],
// M [xi][tiles][ocp], the output position-major [oh * ow][ocp] until
// store_channels writes NCHW with the bias and ReLU. The rounding differs
// from the direct kernels' (the transforms add and subtract before the
// products; F(4x4)'s constants reach 5 and 8, and 1/24): the tests compare
// against im2col within 1e-5 of the largest value.
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

// ---------------------------------------------------------------- the schemes
// Each applies its matrices to a line of channel vectors (B^T, A^T, A, G) or of
// floats (G^T); a tile's 2-D transform applies one to every row, then to every
// column.

/// F(2x2, 3x3): 4x4 input tiles, 16 elements.
struct f2 {
  static constexpr int out = 2, in = 4;
  static constexpr int64_t block_rows = 12;  // the fewest tiles convolve takes at a time (block_tiles)
  /// o = B^T d (4 -> 4).
  static void bt(const simd::vec* d, simd::vec* o) {
    o[0] = simd::sub(d[0], d[2]);
    o[1] = simd::add(d[1], d[2]);
    o[2] = simd::sub(d[2], d[1]);
    o[3] = simd::sub(d[1], d[3]);
  }
  /// o = A^T m (4 -> 2).
  static void at(const simd::vec* m, simd::vec* o) {
    o[0] = simd::add(simd::add(m[0], m[1]), m[2]);
    o[1] = simd::sub(simd::sub(m[1], m[2]), m[3]);
  }
  /// o = A d (2 -> 4).
  static void a(const simd::vec* d, simd::vec* o) {
    o[0] = d[0];
    o[1] = simd::add(d[0], d[1]);
    o[2] = simd::sub(d[0], d[1]);
    o[3] = simd::sub(simd::zero(), d[1]);
  }
  /// o = G g (3 -> 4).
  static void g(const simd::vec* g, simd::vec* o) {
    const simd::vec half = simd::splat(0.5f);
    o[0] = g[0];
    o[1] = simd::mul(half, simd::add(simd::add(g[0], g[1]), g[2]));
    o[2] = simd::mul(half, simd::add(simd::sub(g[0], g[1]), g[2]));
    o[3] = g[2];
  }
  /// o = G^T d (4 -> 3).
  static void gt(const float* d, float* o) {
    o[0] = d[0] + 0.5f * (d[1] + d[2]);
    o[1] = 0.5f * (d[1] - d[2]);
    o[2] = 0.5f * (d[1] + d[2]) + d[3];
  }
};

/// F(4x4, 3x3): 6x6 input tiles, 36 elements.
struct f4 {
  static constexpr int out = 4, in = 6;
  static constexpr int64_t block_rows = 24;
  /// o = B^T d (6 -> 6).
  static void bt(const simd::vec* d, simd::vec* o) {
    const simd::vec four = simd::splat(4.0f), minus_four = simd::splat(-4.0f), two = simd::splat(2.0f),
                    minus_two = simd::splat(-2.0f), minus_five = simd::splat(-5.0f);
    o[0] = simd::fma(four, d[0], simd::fma(minus_five, d[2], d[4]));
    o[1] = simd::fma(minus_four, simd::add(d[1], d[2]), simd::add(d[3], d[4]));
    o[2] = simd::fma(four, simd::sub(d[1], d[2]), simd::sub(d[4], d[3]));
    const simd::vec d31 = simd::sub(d[3], d[1]), d42 = simd::sub(d[4], d[2]);
    o[3] = simd::fma(two, d31, d42);
    o[4] = simd::fma(minus_two, d31, d42);
    o[5] = simd::fma(four, d[1], simd::fma(minus_five, d[3], d[5]));
  }
  /// o = A^T m (6 -> 4).
  static void at(const simd::vec* m, simd::vec* o) {
    const simd::vec sum12 = simd::add(m[1], m[2]), sum34 = simd::add(m[3], m[4]);
    const simd::vec dif12 = simd::sub(m[1], m[2]), dif34 = simd::sub(m[3], m[4]);
    o[0] = simd::add(simd::add(m[0], sum12), sum34);
    o[1] = simd::fma(simd::splat(2.0f), dif34, dif12);
    o[2] = simd::fma(simd::splat(4.0f), sum34, sum12);
    o[3] = simd::add(simd::fma(simd::splat(8.0f), dif34, dif12), m[5]);
  }
  /// o = A d (4 -> 6).
  static void a(const simd::vec* d, simd::vec* o) {
    const simd::vec even = simd::add(d[0], d[2]), odd = simd::add(d[1], d[3]);
    const simd::vec even4 = simd::fma(simd::splat(4.0f), d[2], d[0]);
    const simd::vec odd4 = simd::fma(simd::splat(4.0f), d[3], d[1]);
    o[0] = d[0];
    o[1] = simd::add(even, odd);
    o[2] = simd::sub(even, odd);
    o[3] = simd::fma(simd::splat(2.0f), odd4, even4);
    o[4] = simd::fma(simd::splat(-2.0f), odd4, even4);
    o[5] = d[3];
  }
  /// o = G g (3 -> 6).
  static void g(const simd::vec* g, simd::vec* o) {
    const simd::vec outer = simd::add(g[0], g[2]);
    const simd::vec near = simd::fma(simd::splat(1.0f / 24), g[0], simd::mul(simd::splat(1.0f / 6), g[2]));
    const simd::vec mid = simd::mul(simd::splat(1.0f / 12), g[1]);
    o[0] = simd::mul(simd::splat(0.25f), g[0]);
    o[1] = simd::mul(simd::splat(-1.0f / 6), simd::add(outer, g[1]));
    o[2] = simd::mul(simd::splat(-1.0f / 6), simd::sub(outer, g[1]));
    o[3] = simd::add(near, mid);
    o[4] = simd::sub(near, mid);
    o[5] = g[2];
  }
  /// o = G^T d (6 -> 3).
  static void gt(const float* d, float* o) {
    const float sum12 = d[1] + d[2], sum34 = d[3] + d[4];
    o[0] = 0.25f * d[0] - sum12 / 6 + sum34 / 24;
    o[1] = (d[2] - d[1]) / 6 + (d[3] - d[4]) / 12;
    o[2] = (sum34 - sum12) / 6 + d[5];
  }
};

template <class S>
constexpr int64_t elements = S::in * S::in;  // of a tile in the Winograd domain

/// A plane of h x w positions cut into `side` x `side` output tiles, each reading a
/// (side + 2)-square input tile whose corner is at (side ty - p, side tx - p).
struct tiling {
  int64_t h, w, p;  // input plane and padding
  int64_t side;     // of an output tile
  int64_t oh, ow;   // output plane
  int64_t th, tw;   // tiles down and across
  int64_t tiles() const { return th * tw; }
  /// The zero-padded plane the tiles read (pad_plane): every tile inside it.
  int64_t padded_rows() const { return side * th + 2; }
  int64_t padded_cols() const { return side * tw + 2; }
};

tiling make_tiling(int64_t h, int64_t w, int64_t p, int64_t side) {
  const int64_t oh = h + 2 * p - 2, ow = w + 2 * p - 2;
  return {h, w, p, side, oh, ow, (oh + side - 1) / side, (ow + side - 1) / side};
}

// ---------------------------------------------------------------- transforms

/// B^T d B of one channel vector's tile d (element (i, j) at d + i * row + j * col) into the
/// elements' rows of v, `step` apart: each column's transform (in registers as far as they
/// go), then each row's straight to v (the rows in order, one pointer step apart).
template <class S>
inline void tile_input_transform(const float* d, int64_t row, int64_t col, float* out, int64_t step) {
  simd::vec cols[S::in][S::in];  // [i][j]: B^T d
  for (int j = 0; j < S::in; ++j) {  // B^T d, column j
    simd::vec line[S::in], t[S::in];
    const float* at = d + j * col;
    for (int i = 0; i < S::in; ++i, at += row) line[i] = simd::load(at);
    S::bt(line, t);
    for (int i = 0; i < S::in; ++i) cols[i][j] = t[i];
  }
  for (int i = 0; i < S::in; ++i) {  // (B^T d) B, row i
    simd::vec t[S::in];
    S::bt(cols[i], t);
    for (int j = 0; j < S::in; ++j, out += step) simd::store(out, t[j]);
  }
}

/// Zeros in the padded plane [padded_rows][padded_cols][cp] the tiles read (at least h + 2p by
/// w + 2p) wherever the h x w plane, its first position at (p, p), does not go.
void zero_border(const tiling& g, int64_t cp, float* padded) {
  const int64_t rows = g.padded_rows(), line = g.padded_cols() * cp;
  std::fill_n(padded, g.p * line, 0.0f);
  for (int64_t r = 0; r < g.h; ++r) {
    float* out = padded + (g.p + r) * line;
    std::fill_n(out, g.p * cp, 0.0f);
    std::fill(out + (g.p + g.w) * cp, out + line, 0.0f);
  }
  std::fill(padded + (g.p + g.h) * line, padded + rows * line, 0.0f);
}

/// An image x [c][h][w] (NCHW) into the padded plane, position-major; through `map` when given
/// (load_positions_padded).
void load_padded(const float* x, const tiling& g, int64_t c, int64_t cp, float* padded, const float* map) {
  zero_border(g, cp, padded);
  load_positions_padded(x, g.h, g.w, c, cp, g.p, g.padded_cols(), padded, map);
}

/// input_map [2, c] as load_positions_padded reads it, [2][cp] with zeros past c, in scratch slot 12;
/// null without one.
const float* padded_map(const tensor* input_map, int64_t c, int64_t cp) {
  if (!input_map) return nullptr;
  float* map = scratch(12, static_cast<std::size_t>(2 * cp));
  std::fill_n(map, 2 * cp, 0.0f);
  std::copy_n(input_map->data(), c, map);
  std::copy_n(input_map->data() + c, c, map + cp);
  return map;
}

/// xt [h * w][cp] (position-major) into the padded plane.
void pad_plane(const float* xt, const tiling& g, int64_t cp, float* padded) {
  zero_border(g, cp, padded);
  const int64_t line = g.padded_cols() * cp;
  for (int64_t r = 0; r < g.h; ++r) std::copy_n(xt + r * g.w * cp, g.w * cp, padded + (g.p + r) * line + g.p * cp);
}

/// v[xi * step + (t - t0) * cp] = B^T d B for the tiles d numbered t0 ... t0 + nt - 1 (row by
/// row) of the padded plane (pad_plane).
template <class S>
void input_transform(const float* padded, const tiling& g, int64_t cp, int64_t t0, int64_t nt, float* v,
                     int64_t step) {
  const int64_t line = g.padded_cols() * cp;  // between rows
  for (int64_t t = t0; t < t0 + nt; ++t) {
    const int64_t ty = t / g.tw, tx = t % g.tw;
    const float* corner = padded + S::out * (ty * line + tx * cp);
    float* out = v + (t - t0) * cp;
    for (int64_t cb = 0; cb < cp; cb += W) tile_input_transform<S>(corner + cb, line, cp, out + cb, step);
  }
}

/// A^T m A of one channel vector's tile (its elements `step` apart from m) into the
/// outputs, output (a, b) at y + a * row + b * col: each column's transform, then each row's.
template <class S>
inline void tile_output_transform(const float* m, int64_t step, float* y, int64_t row, int64_t col) {
  simd::vec cols[S::out][S::in];  // [a][j]: A^T m
  for (int j = 0; j < S::in; ++j) {  // A^T m, column j
    simd::vec line[S::in], t[S::out];
    const float* at = m + j * step;
    for (int i = 0; i < S::in; ++i, at += S::in * step) line[i] = simd::load(at);
    S::at(line, t);
    for (int a = 0; a < S::out; ++a) cols[a][j] = t[a];
  }
  for (int a = 0; a < S::out; ++a) {  // (A^T m) A, row a
    simd::vec t[S::out];
    S::at(cols[a], t);
    for (int b = 0; b < S::out; ++b) simd::store(y + a * row + b * col, t[b]);
  }
}

/// out [oh * ow][ocp] (position-major) = A^T m A for the tiles t0 ... t0 + nt - 1 of
/// m [xi][t - t0][ocp]; positions beyond the plane are dropped (a tile at the plane's
/// edge goes through a tile of its own first).
template <class S>
void output_transform(const float* m, const tiling& g, int64_t ocp, int64_t t0, int64_t nt, float* out) {
  const int64_t step = nt * ocp;
  alignas(64) float edge[S::out * S::out * W];
  for (int64_t t = t0; t < t0 + nt; ++t) {
    const int64_t ty = t / g.tw, tx = t % g.tw, y0 = S::out * ty, x0 = S::out * tx;
    const float* in = m + (t - t0) * ocp;
    float* corner = out + (y0 * g.ow + x0) * ocp;
    const int64_t down = std::min<int64_t>(S::out, g.oh - y0), across = std::min<int64_t>(S::out, g.ow - x0);
    if (down == S::out && across == S::out) {
      for (int64_t cb = 0; cb < ocp; cb += W) tile_output_transform<S>(in + cb, step, corner + cb, g.ow * ocp, ocp);
      continue;
    }
    for (int64_t cb = 0; cb < ocp; cb += W) {
      tile_output_transform<S>(in + cb, step, edge, S::out * W, W);
      for (int64_t a = 0; a < down; ++a)
        for (int64_t b = 0; b < across; ++b)
          simd::store(corner + (a * g.ow + b) * ocp + cb, simd::load(edge + (a * S::out + b) * W));
    }
  }
}

/// dm [xi * step + t * ocp] = A dy A^T for every output tile t of dyt [oh * ow][ocp]
/// (position-major); zero beyond the plane.
template <class S>
void gradient_transform(const float* dyt, const tiling& g, int64_t ocp, float* dm, int64_t step) {
  for (int64_t ty = 0; ty < g.th; ++ty)
    for (int64_t tx = 0; tx < g.tw; ++tx) {
      const int64_t y0 = S::out * ty, x0 = S::out * tx;
      const int64_t down = std::min<int64_t>(S::out, g.oh - y0), across = std::min<int64_t>(S::out, g.ow - x0);
      float* tile = dm + (ty * g.tw + tx) * ocp;
      for (int64_t cb = 0; cb < ocp; cb += W) {
        simd::vec cols[S::in][S::out];  // [i][b]: A dy
        for (int b = 0; b < S::out; ++b) {  // A dy, column b
          simd::vec line[S::out], t[S::in];
          for (int a = 0; a < S::out; ++a)
            line[a] = a < down && b < across ? simd::load(dyt + ((y0 + a) * g.ow + x0 + b) * ocp + cb) : simd::zero();
          S::a(line, t);
          for (int i = 0; i < S::in; ++i) cols[i][b] = t[i];
        }
        float* out = tile + cb;
        for (int i = 0; i < S::in; ++i) {  // (A dy) A^T, row i
          simd::vec t[S::in];
          S::a(cols[i], t);
          for (int j = 0; j < S::in; ++j, out += step) simd::store(out, t[j]);
        }
      }
    }
}

/// u [xi][rp][qp] = G k G^T of the 3x3 kernel k(r, q) for r < rows, q < cols
/// (zero elsewhere); `rotated` reads each kernel turned by 180 degrees. Rows
/// split over `threads`; in each row, the taps of every kernel are gathered
/// [9][qp] (scratch slot 2) and W kernels transformed at a time.
template <class S, class Kernel>
void weight_transform(Kernel kernel, int64_t rows, int64_t cols, int64_t rp, int64_t qp, bool rotated, int threads,
                      float* u) {
  for (int64_t xi = 0; xi < elements<S>; ++xi)  // the padding rows; the loop below writes every other
    std::fill_n(u + (xi * rp + rows) * qp, (rp - rows) * qp, 0.0f);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    float* taps = scratch(2, static_cast<std::size_t>(9 * qp));
    for (int64_t q = 0; q < qp; ++q) {
      const float* k = q < cols ? kernel(r, q) : nullptr;
      for (int tap = 0; tap < 9; ++tap) taps[tap * qp + q] = k ? k[rotated ? 8 - tap : tap] : 0.0f;
    }
    for (int64_t q0 = 0; q0 < qp; q0 += W) {
      simd::vec t[S::in][3];  // G g: column j of the kernel into column j of t
      for (int j = 0; j < 3; ++j) {
        const simd::vec line[3] = {simd::load(taps + j * qp + q0), simd::load(taps + (3 + j) * qp + q0),
                                   simd::load(taps + (6 + j) * qp + q0)};
        simd::vec col[S::in];
        S::g(line, col);
        for (int i = 0; i < S::in; ++i) t[i][j] = col[i];
      }
      for (int i = 0; i < S::in; ++i) {  // (G g) G^T, row i
        simd::vec e[S::in];
        S::g(t[i], e);
        for (int j = 0; j < S::in; ++j) simd::store(u + ((S::in * i + j) * rp + r) * qp + q0, e[j]);
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
template <class S>
void weight_gradient(const float* du, int64_t c, int64_t oc, int64_t cp, int64_t ocp, int threads, float* dw) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t o = 0; o < oc; ++o)
    for (int64_t ci = 0; ci < c; ++ci) {
      float s[3][S::in];  // G^T d: column j of d into column j of s
      for (int j = 0; j < S::in; ++j) {
        float line[S::in], col[3];
        for (int i = 0; i < S::in; ++i) line[i] = du[((S::in * i + j) * cp + ci) * ocp + o];
        S::gt(line, col);
        for (int k = 0; k < 3; ++k) s[k][j] = col[k];
      }
      float* out = dw + (o * c + ci) * 9;
      for (int k = 0; k < 3; ++k) S::gt(s[k], out + 3 * k);  // (G^T d) G, row k
    }
}

// ---------------------------------------------------------------- the GEMMs, one per element

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
/// V and M in the L1 cache (24 KiB of them), in multiples of the scheme's block_rows and at least
/// that many (F(2x2): a register tile's 12 rows; F(4x4): two).
template <class S>
int64_t block_tiles(int64_t cp, int64_t ocp) {
  constexpr int64_t l1_bytes = 24 * 1024, rows = S::block_rows;
  const int64_t fit = l1_bytes / (elements<S> * (cp + ocp) * static_cast<int64_t>(sizeof(float)));
  return std::max(rows, fit / rows * rows);
}

/// One image's convolution in the Winograd domain: its padded plane (pad_plane, load_padded; c real
/// channels) into out [oh * ow][ocp] with u [xi][cp][ocp]. The tiles go in
/// near-equal blocks of at most block_tiles: each block's input transform,
/// products and output transform run while its V and M are in the L1 or L2
/// cache. v and m are scratch (a block's V and M).
template <class S>
void convolve(const float* padded, const tiling& g, int64_t c, int64_t cp, const float* u, int64_t ocp, float* v,
              float* m, float* out) {
  const int64_t tiles = g.tiles(), most = block_tiles<S>(cp, ocp), blocks = (tiles + most - 1) / most;
  for (int64_t b = 0, t0 = 0; b < blocks; ++b) {
    const int64_t nt = (tiles - t0) / (blocks - b);
    input_transform<S>(padded, g, cp, t0, nt, v, nt * cp);
    for (int64_t xi = 0; xi < elements<S>; ++xi)
      gemm(nt, c, v + xi * nt * cp, cp, 1, u + xi * cp * ocp, ocp, ocp / W, m + xi * nt * ocp, ocp, false);
    output_transform<S>(m, g, ocp, t0, nt, out);
    t0 += nt;
  }
}

template <class S>
void forward(const context& ctx, const tensor& x, const tensor& w, const tensor& bias, const conv2d_geometry& g,
             bool relu, tensor& y, tensor* window, const tensor* input_map) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3), oc = g.out_channels;
  const int64_t cp = round_up(c, W), ocp = round_up(oc, W);
  const float* map = padded_map(input_map, c, cp);
  const tiling tl = make_tiling(h, wd, g.padding, S::out);
  float* u = scratch(0, static_cast<std::size_t>(elements<S> * cp * ocp));
  const float* wp = w.data();
  weight_transform<S>([&](int64_t ci, int64_t o) { return wp + (o * c + ci) * 9; }, c, oc, cp, ocp, false,
                      detail::threads(ctx), u);
  const float* xp = x.data();
  const float* bp = bias.defined() ? bias.data() : nullptr;
  float* yp = y.data();
  const int64_t pooled = (tl.oh / 2) * (tl.ow / 2);
  if (window) ensure_shape(*window, {n, pooled, ocp});
  float* windowp = window ? window->data() : nullptr;
  const int threads = detail::image_threads(ctx, n);
  const int64_t block = std::min(tl.tiles(), block_tiles<S>(cp, ocp));
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t i = 0; i < n; ++i) {
    float* v = scratch(3, static_cast<std::size_t>(elements<S> * block * cp));
    float* m = scratch(4, static_cast<std::size_t>(elements<S> * block * ocp));
    float* out = scratch(5, static_cast<std::size_t>(tl.oh * tl.ow * ocp));
    float* padded = scratch(10, static_cast<std::size_t>(tl.padded_rows() * tl.padded_cols() * cp));
    load_padded(xp + i * c * h * wd, tl, c, cp, padded, map);
    convolve<S>(padded, tl, c, cp, u, ocp, v, m, out);
    if (windowp)
      store_pooled(out, tl.oh, tl.ow, ocp, oc, bp, yp + i * oc * pooled, windowp + i * pooled * ocp);
    else
      store_channels(out, tl.oh * tl.ow, ocp, oc, bp, relu, yp + i * oc * tl.oh * tl.ow);
  }
}

/// How many images' tiles one product of the weight gradient takes (its depth: their tiles
/// together): enough for a depth of at least 32 where their V and dM fit 512 KiB (half the L2
/// cache). One image's tiles alone make too shallow a product on small planes (4 tiles of F(4x4)
/// on 7 x 7): it would load and store its dU tiles for every 4 steps. Measured on the zoo's
/// planes (docs/benchmarks.md): with 8 images a group, 7 x 7's backward takes F(4x4) and is a
/// quarter faster; larger planes (49 tiles and more) stay at one image, where depths of 64 and
/// 128 gained nothing.
template <class S>
int64_t weight_group(int64_t tiles, int64_t cp, int64_t ocp) {
  constexpr int64_t depth = 32, bytes = 512 * 1024;
  const int64_t fit = bytes / (elements<S> * tiles * (cp + ocp) * static_cast<int64_t>(sizeof(float)));
  return std::max<int64_t>(1, std::min((depth + tiles - 1) / tiles, fit));
}

/// A run of images' share of the backward pass: their dU (and dbias) added into du (db), their dx
/// written. The weight gradient goes by the scheme SW over the forward's tiles, the data gradient
/// (the rotated kernels over dy) by SD, each chosen for its own plane.
template <class SW, class SD>
struct backward_images {
  const tiling fwd, bwd;  // SW's tiles of x (and of dy, the forward's output); SD's of dy -> dx
  int64_t c, oc, cp, ocp, group;
  const float* x;
  const float* map;  // x read through it (load_positions_padded), or null
  const output_gradient& grad;
  const float* urot;  // null: no dx
  float* dx;
  const float* dx_addend;  // added to dx when not null

  /// Images i0 ... i0 + count - 1 (count at most `group`): one product per element over all their tiles,
  /// added to du, or written to its first c rows when not `accumulate` (the same bits as onto zeros).
  void operator()(int64_t i0, int64_t count, float* du, float* db, bool accumulate) const {
    const int64_t h = fwd.h, wd = fwd.w, tiles = fwd.tiles(), depth = count * tiles;
    float* v = scratch(3, static_cast<std::size_t>(elements<SW> * group * tiles * cp));
    float* dyt = scratch(4, static_cast<std::size_t>(fwd.oh * fwd.ow * ocp));
    float* dm = scratch(5, static_cast<std::size_t>(elements<SW> * group * tiles * ocp));
    float* padded = scratch(10, static_cast<std::size_t>(fwd.padded_rows() * fwd.padded_cols() * cp));
    for (int64_t k = 0; k < count; ++k) {  // V [xi][depth][cp] and dM [xi][depth][ocp], image k's tiles at k * tiles
      load_padded(x + (i0 + k) * c * h * wd, fwd, c, cp, padded, map);
      input_transform<SW>(padded, fwd, cp, 0, tiles, v + k * tiles * cp, depth * cp);
      grad.load(i0 + k, dyt, db);
      gradient_transform<SW>(dyt, fwd, ocp, dm + k * tiles * ocp, depth * ocp);
      if (urot) data_gradient(i0 + k, dyt);
    }
    for (int64_t xi = 0; xi < elements<SW>; ++xi)  // dU[xi] += V[xi]^T dM[xi]
      gemm(c, depth, v + xi * depth * cp, 1, cp, dm + xi * depth * ocp, ocp, ocp / W, du + xi * cp * ocp, ocp,
           accumulate);
  }

  /// Image i's dx from its dyt [oh * ow][ocp].
  void data_gradient(int64_t i, const float* dyt) const {
    const int64_t h = fwd.h, wd = fwd.w;
    const int64_t block = std::min(bwd.tiles(), block_tiles<SD>(ocp, cp));
    float* vd = scratch(6, static_cast<std::size_t>(elements<SD> * block * ocp));
    float* md = scratch(7, static_cast<std::size_t>(elements<SD> * block * cp));
    float* out = scratch(8, static_cast<std::size_t>(h * wd * cp));
    float* dy_padded = scratch(11, static_cast<std::size_t>(bwd.padded_rows() * bwd.padded_cols() * ocp));
    pad_plane(dyt, bwd, ocp, dy_padded);
    convolve<SD>(dy_padded, bwd, oc, ocp, urot, cp, vd, md, out);
    const int64_t at = i * c * h * wd;
    store_channels(out, h * wd, cp, c, nullptr, false, dx + at, dx_addend ? dx_addend + at : nullptr);
  }
};

template <class SW, class SD>
void backward(const context& ctx, const tensor& x, const tensor& w, const tensor& dy, const tensor* relu_output,
              const conv2d_geometry& g, tensor* dx, const tensor* dx_addend, tensor& dw, tensor* dbias,
              const tensor* window, const tensor* input_map) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3), oc = g.out_channels;
  const int64_t cp = round_up(c, W), ocp = round_up(oc, W);
  const tiling fwd = make_tiling(h, wd, g.padding, SW::out);                // x -> y
  const tiling bwd = make_tiling(fwd.oh, fwd.ow, 2 - g.padding, SD::out);  // dy -> dx
  const int threads = detail::image_threads(ctx, n);

  // Per-thread partial sums of dU [xi][cp][ocp] and dbias [ocp], in the calling thread's scratch.
  const std::size_t part = static_cast<std::size_t>(elements<SW> * cp * ocp + ocp);
  float* partial = scratch(0, part * threads);
  int team = 1;  // the threads the region below gets; each zeroes its own partial sums
  float* urot = nullptr;  // the rotated kernels, output channels as rows
  if (dx) {
    urot = scratch(1, static_cast<std::size_t>(elements<SD> * ocp * cp));
    const float* wp = w.data();
    weight_transform<SD>([&](int64_t o, int64_t ci) { return wp + (o * c + ci) * 9; }, oc, c, ocp, cp, true,
                         threads, urot);
  }
  const output_gradient grad =
      output_gradient::of(dy, relu_output, window, fwd.oh, fwd.ow, oc, ocp, "conv2d_backward_winograd");
  const int64_t group = weight_group<SW>(fwd.tiles(), cp, ocp);
  const backward_images<SW, SD> images{fwd, bwd, c, oc, cp, ocp, group, x.data(), padded_map(input_map, c, cp), grad, urot,
                                       dx ? dx->data() : nullptr, dx && dx_addend ? dx_addend->data() : nullptr};
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int t = omp_get_thread_num(), size = omp_get_num_threads();
    float* du = partial + part * t;
    if (t == 0) team = size;
    // A contiguous run of images per thread (as a static schedule), in groups. The first group writes
    // the rows of dU it computes; only the rest (padding rows, dbias) starts at zero, or all of it
    // where the thread has no images.
    const int64_t lo = n * t / size, hi = n * (t + 1) / size;
    if (hi == lo) {
      std::fill_n(du, part, 0.0f);
    } else {
      for (int64_t xi = 0; xi < elements<SW>; ++xi) std::fill(du + (xi * cp + c) * ocp, du + (xi + 1) * cp * ocp, 0.0f);
      std::fill_n(du + elements<SW> * cp * ocp, ocp, 0.0f);
    }
    for (int64_t i = lo; i < hi; i += group)
      images(i, std::min(group, hi - i), du, dbias ? du + elements<SW> * cp * ocp : nullptr, i != lo);
  }
  std::fill(partial + part * team, partial + part * threads, 0.0f);  // threads the region did not get
  // Sum the threads' partials into the first, then back from the Winograd domain.
  sum_into_first(partial, static_cast<int64_t>(part), threads);
  weight_gradient<SW>(partial, c, oc, cp, ocp, threads, dw.data());
  if (dbias) std::copy_n(partial + elements<SW> * cp * ocp, oc, dbias->data());
}

} // namespace

void conv2d_forward_winograd(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                             const conv2d_geometry& g, bool relu, tensor& y, tensor* window, const tensor* input_map) {
  const shape ys = conv2d_output_shape(x.shape(), g);
  if (winograd_tile_side(ys[2], ys[3]) == f4::out)
    forward<f4>(ctx, x, w, bias, g, relu, y, window, input_map);
  else
    forward<f2>(ctx, x, w, bias, g, relu, y, window, input_map);
}

void conv2d_backward_winograd(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                              const tensor* relu_output, const conv2d_geometry& g, tensor* dx,
                              const tensor* dx_addend, tensor& dw, tensor* dbias, const tensor* window,
                              const tensor* input_map) {
  const shape ys = conv2d_output_shape(x.shape(), g);
  const bool weights4 = winograd_tile_side(ys[2], ys[3]) == f4::out;     // over the output's tiles
  const bool data4 = winograd_tile_side(x.dim(2), x.dim(3)) == f4::out;  // onto dx's plane
  if (weights4 && data4)
    backward<f4, f4>(ctx, x, w, dy, relu_output, g, dx, dx_addend, dw, dbias, window, input_map);
  else if (weights4)
    backward<f4, f2>(ctx, x, w, dy, relu_output, g, dx, dx_addend, dw, dbias, window, input_map);
  else if (data4)
    backward<f2, f4>(ctx, x, w, dy, relu_output, g, dx, dx_addend, dw, dbias, window, input_map);
  else
    backward<f2, f2>(ctx, x, w, dy, relu_output, g, dx, dx_addend, dw, dbias, window, input_map);
}

} // namespace troupe::kernels::detail::TROUPE_ISA
