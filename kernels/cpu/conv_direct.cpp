// conv2d without a column buffer: register-tiled direct convolution.
//
// Forward, per image: the input is copied into zero-padded planes, and each
// register tile computes MRQ consecutive output positions of one row for NV
// vectors of output channels, summing over the taps (input channel, kernel
// row, kernel column): per tap, NV vectors of packed weights W^T[tap][oc] and
// one broadcast input value per position (an implicit GEMM: positions x taps
// times taps x channels, its B panel never materialized). The tile goes to a
// position-major buffer [P][oc], transposed into NCHW with the bias (and
// ReLU) on the way out.
//
// Backward data, stride 1: the same kernel on dy padded by k-1-p, with the
// weights rotated by 180 degrees and their channels swapped. Stride 2 (k > 1):
// the same kernel once per parity class of dx's positions (parity_class), each
// a stride-1 convolution of dy with that parity's taps, its outputs two
// positions apart in one position-major plane.
// Backward weights: dW^T[tap][oc] += x[tap at position] * dy^T[position][oc],
// register tiles of G kernel rows (input channel, kernel row) x K columns x NV
// channel vectors, accumulated over every position of the thread's images;
// dy is transposed to position-major [P][oc] first (its sums give dbias).
//
// Everything else (strides other than 1 and 2, kernels other than 1, 3, 5 or
// 7, dx of a 1x1 stride-2 convolution or of a stride-1 one padded by k or
// more) goes to the im2col path of dense_conv.cpp, which is also the
// reference these kernels are tested against.
//
// Compiled once per instruction set, into namespace detail::TROUPE_ISA
// (cmake/troupe_kernel_sets.cmake, simd_set.hpp): simd::width is that set's.

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/conv_internal.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels::detail::TROUPE_ISA {

namespace {

constexpr int W = simd::width;

} // namespace

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/// Scratch of the calling thread, kept between calls (OpenMP's threads
/// persist): one buffer per slot, grown as needed, contents unspecified. The
/// calling thread is also thread 0 of a parallel region: what it holds across
/// one uses other slots than the region's body.
float* scratch(int slot, std::size_t n) {
  thread_local std::array<std::vector<float>, scratch_slots> buffers;
  std::vector<float>& b = buffers.at(static_cast<std::size_t>(slot));
  if (b.size() < n) b.resize(n);
  return b.data();
}

namespace {

/// x [c, h, w] into zeroed planes [c, h + 2p, w + 2p].
void pad_planes(const float* x, int64_t c, int64_t h, int64_t w, int64_t p, float* out) {
  const int64_t hp = h + 2 * p, wp = w + 2 * p;
  for (int64_t ci = 0; ci < c; ++ci) {
    float* o = out + ci * hp * wp;
    const float* in = x + ci * h * w;
    std::fill_n(o, p * wp, 0.0f);
    for (int64_t r = 0; r < h; ++r) {
      float* row = o + (r + p) * wp;
      std::fill_n(row, p, 0.0f);
      std::memcpy(row + p, in + r * w, w * sizeof(float));
      std::fill_n(row + p + w, p, 0.0f);
    }
    std::fill_n(o + (p + h) * wp, p * wp, 0.0f);
  }
}

// ---------------------------------------------------------------- forward tiles

/// out[j * step + v * W] (MRQ positions x NV channel vectors) = sum over taps
/// (ci, kh < kh_n, kw < kw_n) of in[ci][kh][kw + j*S] * wt[tap][v]. `in` points
/// at the first position's window in the padded planes.
template <int S, int NV, int MRQ>
void fwd_tile(const float* in, int64_t c, int64_t kh_n, int64_t kw_n, int64_t plane, int64_t wp, const float* wt,
              int64_t ocp, float* out, int64_t step) {
  simd::vec acc[MRQ][NV];
#pragma GCC unroll 32
  for (int j = 0; j < MRQ; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[j][v] = simd::zero();
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t kh = 0; kh < kh_n; ++kh) {
      const float* row = in + ci * plane + kh * wp;
      for (int64_t kw = 0; kw < kw_n; ++kw, wt += ocp) {
        simd::vec wv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) wv[v] = simd::load(wt + v * W);
#pragma GCC unroll 32
        for (int j = 0; j < MRQ; ++j) {
          const simd::vec xb = simd::broadcast(row + kw + j * S);
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) acc[j][v] = simd::fma(xb, wv[v], acc[j][v]);
        }
      }
    }
#pragma GCC unroll 32
  for (int j = 0; j < MRQ; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) simd::store(out + j * step + v * W, acc[j][v]);
}

using fwd_fn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, int64_t, float*,
                        int64_t);

/// The most positions a forward tile of NV channel vectors covers.
constexpr int fwd_max_positions(int nv) { return simd::accumulators / nv; }

template <int S, int NV, int... M>
constexpr std::array<fwd_fn, sizeof...(M)> fwd_table(std::integer_sequence<int, M...>) {
  return {&fwd_tile<S, NV, M + 1>...};
}

template <int S, int NV>
fwd_fn fwd_kernel(int positions) {
  static constexpr auto table = fwd_table<S, NV>(std::make_integer_sequence<int, fwd_max_positions(NV)>());
  return table[static_cast<std::size_t>(positions - 1)];
}

fwd_fn fwd_kernel(int64_t stride, int nv, int positions) {
  if (stride == 1) return nv == 1 ? fwd_kernel<1, 1>(positions) : fwd_kernel<1, 2>(positions);
  return nv == 1 ? fwd_kernel<2, 1>(positions) : fwd_kernel<2, 2>(positions);
}

/// A kh_n x kw_n convolution of stride s over planes [c][plane] of row length wp (in: the first
/// output's window) into oh x ow outputs, output (r, q)'s ocp channels at out + r * row + q * step.
void conv_grid(const float* in, int64_t c, int64_t plane, int64_t wp, int64_t kh_n, int64_t kw_n, int64_t s,
               int64_t oh, int64_t ow, const float* wt, int64_t ocp, float* out, int64_t row, int64_t step) {
  for (int64_t ob = 0; ob < ocp;) {
    const int nv = ocp - ob >= 2 * W ? 2 : 1;
    const int64_t most = fwd_max_positions(nv);
    const int64_t tiles = (ow + most - 1) / most;
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t t = 0, ox = 0; t < tiles; ++t) {
        // Near-equal tiles: a row of 28 is 14 + 14 positions, not 26 + 2.
        const int64_t n = (ow - ox) / (tiles - t);
        fwd_kernel(s, nv, static_cast<int>(n))(in + oy * s * wp + ox * s, c, kh_n, kw_n, plane, wp, wt + ob, ocp,
                                               out + oy * row + ox * step + ob, step);
        ox += n;
      }
    ob += nv * W;
  }
}

/// One image: in = padded planes [c, hp, wp]; out [oh * ow, ocp] position-major.
void conv_image(const float* in, int64_t c, int64_t hp, int64_t wp, int64_t k, int64_t s, int64_t oh, int64_t ow,
                const float* wt, int64_t ocp, float* out) {
  conv_grid(in, c, hp * wp, wp, k, k, s, oh, ow, wt, ocp, out, ow * ocp, ocp);
}

// ---------------------------------------------------------------- weight-gradient tiles

/// dwt[(r0 + g) * K + kw][v] += sum over output positions of
/// in[row r0 + g][position * S + kw] * dyt[position][v]: G kernel rows
/// (r = ci * K + kh) x K columns x NV channel vectors.
template <int S, int K, int NV, int G>
void dw_tile(const float* in, int64_t plane, int64_t wp, int64_t r0, const float* dyt, int64_t ocp, int64_t oh,
             int64_t ow, float* dwt) {
  const float* rows[G];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) {
    const int64_t r = r0 + g;
    rows[g] = in + (r / K) * plane + (r % K) * wp;
  }
  simd::vec acc[G][K][NV];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int kw = 0; kw < K; ++kw)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[g][kw][v] = simd::load(dwt + ((r0 + g) * K + kw) * ocp + v * W);
  for (int64_t oy = 0; oy < oh; ++oy) {
    const float* d = dyt + oy * ow * ocp;
    const int64_t base = oy * S * wp;
    for (int64_t ox = 0; ox < ow; ++ox, d += ocp) {
      simd::vec dv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) dv[v] = simd::load(d + v * W);
      const int64_t at = base + ox * S;
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
        for (int kw = 0; kw < K; ++kw) {
          const simd::vec xb = simd::broadcast(rows[g] + at + kw);
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) acc[g][kw][v] = simd::fma(xb, dv[v], acc[g][kw][v]);
        }
    }
  }
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int kw = 0; kw < K; ++kw)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) simd::store(dwt + ((r0 + g) * K + kw) * ocp + v * W, acc[g][kw][v]);
}

using dw_fn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, float*);

/// The most kernel rows a weight-gradient tile covers: its accumulators, and
/// a pointer register per row.
constexpr int dw_max_rows(int k, int nv) { return std::min(10, simd::accumulators / (k * nv)); }

template <int S, int K, int NV, int... G>
constexpr std::array<dw_fn, sizeof...(G)> dw_table(std::integer_sequence<int, G...>) {
  return {&dw_tile<S, K, NV, G + 1>...};
}

static_assert(dw_max_rows(7, 1) >= 1, "a weight-gradient tile must cover at least one kernel row");

template <int S, int K, int NV>
dw_fn dw_kernel(int rows) {
  static constexpr auto table = dw_table<S, K, NV>(std::make_integer_sequence<int, dw_max_rows(K, NV)>());
  return table[static_cast<std::size_t>(rows - 1)];
}

template <int S, int K>
dw_fn dw_kernel(int nv, int rows) {
  return nv == 1 ? dw_kernel<S, K, 1>(rows) : dw_kernel<S, K, 2>(rows);
}

template <int S>
dw_fn dw_kernel(int64_t k, int nv, int rows) {
  switch (k) {
    case 1: return dw_kernel<S, 1>(nv, rows);
    case 3: return dw_kernel<S, 3>(nv, rows);
    case 5: return dw_kernel<S, 5>(nv, rows);
    default: return dw_kernel<S, 7>(nv, rows);
  }
}

/// Adds one image's weight gradient to dwt [c*k*k, ocp]: in = padded planes, dyt [oh*ow, ocp].
void dw_image(const float* in, int64_t c, int64_t hp, int64_t wp, int64_t k, int64_t s, int64_t oh, int64_t ow,
              const float* dyt, int64_t ocp, float* dwt) {
  const int64_t plane = hp * wp, rows = c * k;
  for (int64_t ob = 0; ob < ocp;) {
    // Two vectors of output channels per tile only where the registers hold a row of both
    // (not for 7x7 with 16 registers: AVX2).
    const int nv = ocp - ob >= 2 * W && dw_max_rows(static_cast<int>(k), 2) >= 1 ? 2 : 1;
    const int64_t most = dw_max_rows(static_cast<int>(k), nv);
    for (int64_t r = 0; r < rows;) {
      const int64_t g = std::min(most, rows - r);
      dw_fn f = s == 1 ? dw_kernel<1>(k, nv, static_cast<int>(g)) : dw_kernel<2>(k, nv, static_cast<int>(g));
      f(in, plane, wp, r, dyt + ob, ocp, oh, ow, dwt + ob);
      r += g;
    }
    ob += nv * W;
  }
}

// ---------------------------------------------------------------- layout changes

#if TROUPE_SIMD_WIDTH >= 8
constexpr int64_t tb = 8;  // transposes in 8x8 blocks of AVX registers
using block = __m256;
inline block load_block(const float* p) { return _mm256_loadu_ps(p); }
inline void store_block(float* p, block v) { _mm256_storeu_ps(p, v); }
inline block splat(float v) { return _mm256_set1_ps(v); }
inline block add_block(block a, block b) { return _mm256_add_ps(a, b); }
inline block relu_block(block a) { return _mm256_max_ps(a, _mm256_setzero_ps()); }
inline block where_positive(block y, block g) { return _mm256_and_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ), g); }
/// max(v * scale + shift, 0) (std::max(std::fma(...), 0.0f)'s bits: NaN and -0 stay).
inline block map_block(block v, block scale, block shift) {
  return _mm256_max_ps(_mm256_setzero_ps(), _mm256_fmadd_ps(v, scale, shift));
}
inline void transpose(block r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#else
constexpr int64_t tb = 4;  // SSE: 4x4 blocks
using block = __m128;
inline block load_block(const float* p) { return _mm_loadu_ps(p); }
inline void store_block(float* p, block v) { _mm_storeu_ps(p, v); }
inline block splat(float v) { return _mm_set1_ps(v); }
inline block add_block(block a, block b) { return _mm_add_ps(a, b); }
inline block relu_block(block a) { return _mm_max_ps(a, _mm_setzero_ps()); }
inline block where_positive(block y, block g) { return _mm_and_ps(_mm_cmpgt_ps(y, _mm_setzero_ps()), g); }
/// max(v * scale + shift, 0), the product rounded before the sum (no fused multiply-add in this set).
inline block map_block(block v, block scale, block shift) {
  return _mm_max_ps(_mm_setzero_ps(), _mm_add_ps(_mm_mul_ps(v, scale), shift));
}
inline void transpose(block r[4]) { _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]); }
#endif

/// Positions per pass of the layout changes: the pass's rows of the position-major side
/// ([P][ocp]: at most 16 KB of them) stay in L1 while every block of channels goes through
/// them, so each of their cache lines is filled once, not once per block of channels.
int64_t position_pass(int64_t ocp) { return std::max<int64_t>(tb, 4096 / ocp / tb * tb); }

/// The tb x tb blocks of store_channels for channels [o_begin, o_end) (multiples of tb) and positions
/// [0, full_q); with Partial, rows of channels from oc on are not stored (the last, partial block).
template <bool Bias, bool Relu, bool Partial>
void store_blocks(const float* t, int64_t positions, int64_t ocp, int64_t oc, int64_t o_begin, int64_t o_end,
                  int64_t full_q, const float* bias, const float* addend, float* y) {
  const int64_t pass = position_pass(ocp);
  for (int64_t p0 = 0; p0 < full_q; p0 += pass) {
    const int64_t p1 = std::min(full_q, p0 + pass);
    for (int64_t o0 = o_begin; o0 < o_end; o0 += tb) {
      const int64_t rows = Partial ? std::min(tb, oc - o0) : tb;
      block b[tb];
      if (Bias)
        for (int64_t r = 0; r < tb; ++r) b[r] = splat(r < rows ? bias[o0 + r] : 0.0f);
      for (int64_t q0 = p0; q0 < p1; q0 += tb) {
        block v[tb];
        for (int64_t r = 0; r < tb; ++r) v[r] = load_block(t + (q0 + r) * ocp + o0);
        transpose(v);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t at = (o0 + r) * positions + q0;
          block o = Bias ? add_block(v[r], b[r]) : v[r];
          if (addend) o = add_block(o, load_block(addend + at));
          if (Relu) o = relu_block(o);
          store_block(y + at, o);
        }
      }
    }
  }
}

/// store_blocks over every channel block: the full ones, then the partial one.
template <bool Bias, bool Relu>
void store_all_blocks(const float* t, int64_t positions, int64_t ocp, int64_t oc, int64_t full_q, const float* bias,
                      const float* addend, float* y) {
  const int64_t full_o = oc / tb * tb;
  store_blocks<Bias, Relu, false>(t, positions, ocp, oc, 0, full_o, full_q, bias, addend, y);
  if (full_o < oc)
    store_blocks<Bias, Relu, true>(t, positions, ocp, oc, full_o, full_o + tb, full_q, bias, addend, y);
}

/// Where load_blocks puts the channel vector of position q of a plane `w` wide: at
/// origin + (q / w) * line + (q % w) * ocp floats (w = positions: position-major, q * ocp).
struct position_rows {
  int64_t w, line, origin;
  int64_t at(int64_t q, int64_t ocp) const { return origin + q / w * line + q % w * ocp; }
};

/// The tb x tb blocks of load_positions for channels [o_begin, o_end) (multiples of tb) and positions
/// [0, full_q); with Partial, rows of channels from oc on are zero (the padding channels). With `map`
/// ([2][ocp]: scales, then shifts, zero past oc), each value v becomes max(v * scale + shift, 0).
template <bool Masked, bool Partial>
void load_blocks(const float* dy, const float* mask, int64_t positions, int64_t ocp, int64_t oc, int64_t o_begin,
                 int64_t o_end, int64_t full_q, const position_rows& to, float* t, const float* map) {
  const int64_t pass = position_pass(ocp);
  for (int64_t p0 = 0; p0 < full_q; p0 += pass) {
    const int64_t p1 = std::min(full_q, p0 + pass);
    for (int64_t o0 = o_begin; o0 < o_end; o0 += tb) {
      const int64_t rows = Partial ? std::max<int64_t>(0, std::min(tb, oc - o0)) : tb;
      float* row = t + to.at(p0 - p0 % to.w, ocp) + o0;  // position p0's row, and its column in it
      int64_t col = p0 % to.w;
      for (int64_t q0 = p0; q0 < p1; q0 += tb) {
        block v[tb];
        for (int64_t r = 0; r < tb; ++r) {
          const int64_t at = (o0 + r) * positions + q0;
          v[r] = Partial && r >= rows ? splat(0.0f)
                 : Masked             ? where_positive(load_block(mask + at), load_block(dy + at))
                                      : load_block(dy + at);
        }
        transpose(v);
        if (map) {
          const block scale = load_block(map + o0), shift = load_block(map + ocp + o0);
          for (int64_t r = 0; r < tb; ++r) v[r] = map_block(v[r], scale, shift);
        }
        for (int64_t r = 0; r < tb; ++r) {
          store_block(row + col * ocp, v[r]);
          if (++col == to.w) col = 0, row += to.line;
        }
      }
    }
  }
}

/// load_blocks over every channel block (the full ones, then those holding padding channels), then
/// the last positions % tb positions one float at a time.
template <bool Masked>
void load_all(const float* dy, const float* mask, int64_t positions, int64_t ocp, int64_t oc,
              const position_rows& to, float* t, const float* map = nullptr) {
  const int64_t full_q = positions / tb * tb, full_o = oc / tb * tb;
  load_blocks<Masked, false>(dy, mask, positions, ocp, oc, 0, full_o, full_q, to, t, map);
  load_blocks<Masked, true>(dy, mask, positions, ocp, oc, full_o, ocp, full_q, to, t, map);
  for (int64_t q = full_q; q < positions; ++q) {
    float* out = t + to.at(q, ocp);
    for (int64_t o = 0; o < ocp; ++o) {
      const int64_t at = o * positions + q;
      out[o] = o < oc && (!Masked || mask[at] > 0.0f) ? dy[at] : 0.0f;
      if (map && o < oc) out[o] = std::max(std::fma(out[o], map[o], map[ocp + o]), 0.0f);
    }
  }
}

} // namespace

/// y [oc, P] = t [P, ocp] transposed, plus bias (when given), plus addend (when
/// given), then ReLU (when asked). ocp is a multiple of the block size.
void store_channels(const float* t, int64_t positions, int64_t ocp, int64_t oc, const float* bias, bool relu,
                    float* y, const float* addend) {
  const int64_t full_q = positions / tb * tb;
  if (bias)
    relu ? store_all_blocks<true, true>(t, positions, ocp, oc, full_q, bias, addend, y)
         : store_all_blocks<true, false>(t, positions, ocp, oc, full_q, bias, addend, y);
  else
    relu ? store_all_blocks<false, true>(t, positions, ocp, oc, full_q, bias, addend, y)
         : store_all_blocks<false, false>(t, positions, ocp, oc, full_q, bias, addend, y);
  for (int64_t o = 0; o < oc; ++o)  // the last positions % tb positions
    for (int64_t q = full_q; q < positions; ++q) {
      float v = t[q * ocp + o] + (bias ? bias[o] : 0.0f);
      if (addend) v += addend[o * positions + q];
      y[o * positions + q] = relu ? std::max(v, 0.0f) : v;
    }
}

/// t [P, ocp] = dy [oc, P] transposed (zero in the padding channels), where
/// `mask` (of dy's shape) is > 0 when it is given; adds each channel's sum of
/// t to dbias when given.
void load_positions(const float* dy, const float* mask, int64_t positions, int64_t oc, int64_t ocp, float* t,
                    float* dbias) {
  const position_rows contiguous{positions, positions * ocp, 0};
  if (mask)
    load_all<true>(dy, mask, positions, ocp, oc, contiguous, t);
  else
    load_all<false>(dy, mask, positions, ocp, oc, contiguous, t);
  if (dbias) add_channel_sums(t, positions, oc, ocp, dbias);
}

void load_positions_padded(const float* x, int64_t h, int64_t w, int64_t c, int64_t cp, int64_t p, int64_t cols,
                           float* t, const float* map) {
  load_all<false>(x, nullptr, h * w, cp, c, position_rows{w, cols * cp, (p * cols + p) * cp}, t, map);
}

void add_channel_sums(const float* t, int64_t positions, int64_t oc, int64_t ocp, float* dbias) {
  for (int64_t o0 = 0; o0 < ocp; o0 += W) {
    simd::vec acc = simd::zero();
    for (int64_t q = 0; q < positions; ++q) acc = simd::add(acc, simd::load(t + q * ocp + o0));
    alignas(64) float lanes[W];
    simd::store(lanes, acc);
    for (int64_t l = 0; l < W && o0 + l < oc; ++l) dbias[o0 + l] += lanes[l];
  }
}

namespace {

/// b where `pick` is all ones, else a (pick: a lane comparison's result).
inline simd::vec choose(simd::ivec pick, simd::vec a, simd::vec b) {
  return (simd::vec)(((simd::ivec)b & pick) | ((simd::ivec)a & ~pick));
}

/// The flat positions of the four corners of pooled position (py, px) in a plane `ow` wide, row by row.
inline std::array<int64_t, 4> corners(int64_t py, int64_t px, int64_t ow) {
  const int64_t p0 = 2 * py * ow + 2 * px;
  return {p0, p0 + 1, p0 + ow, p0 + ow + 1};
}

} // namespace

void store_pooled(const float* t, int64_t oh, int64_t ow, int64_t ocp, int64_t oc, const float* bias, float* y,
                  float* window) {
  const int64_t ph = oh / 2, pw = ow / 2, pp = ph * pw;
  float* best_t = scratch(9, static_cast<std::size_t>(pp * ocp + ocp));
  float* b = best_t + pp * ocp;  // the bias, zero in the padding channels
  for (int64_t o = 0; o < ocp; ++o) b[o] = bias && o < oc ? bias[o] : 0.0f;
  for (int64_t py = 0; py < ph; ++py)
    for (int64_t px = 0; px < pw; ++px) {
      const std::array<int64_t, 4> at = corners(py, px, ow);
      const int64_t q = (py * pw + px) * ocp;
      for (int64_t o0 = 0; o0 < ocp; o0 += W) {
        const simd::vec bv = simd::load(b + o0);
        simd::vec best = simd::max(simd::add(simd::load(t + at[0] * ocp + o0), bv), simd::zero());
        simd::vec place = simd::zero();
        for (int k = 1; k < 4; ++k) {
          const simd::vec v = simd::max(simd::add(simd::load(t + at[k] * ocp + o0), bv), simd::zero());
          const simd::ivec gt = (simd::ivec)(v > best);  // ordered: NaN never wins
          best = choose(gt, best, v);
          place = choose(gt, place, simd::splat(static_cast<float>(k)));
        }
        simd::store(best_t + q + o0, best);
        simd::store(window + q + o0, place);
      }
    }
  store_channels(best_t, pp, ocp, oc, nullptr, false, y);
}

output_gradient output_gradient::of(const tensor& dy, const tensor* relu_output, const tensor* window, int64_t oh,
                                    int64_t ow, int64_t oc, int64_t ocp, const char* kernel) {
  if (window && window->dim(2) != ocp)
    throw error(std::string(kernel) + ": the window's places are another kernel set's");
  return {dy.data(), relu_output ? relu_output->data() : nullptr, window ? window->data() : nullptr, oh, ow, oc, ocp};
}

void output_gradient::load(int64_t i, float* t, float* dbias) const {
  const int64_t pooled = (oh / 2) * (ow / 2);
  const int64_t plane = oc * (window ? pooled : oh * ow);  // floats per image of dy and mask
  const float* maski = mask ? mask + i * plane : nullptr;
  if (window)
    load_pooled(dy + i * plane, maski, window + i * pooled * ocp, oh, ow, oc, ocp, t, dbias);
  else
    load_positions(dy + i * plane, maski, oh * ow, oc, ocp, t, dbias);
}

namespace {

/// dbias += each channel's sum of the gradient load_pooled spreads, with add_channel_sums' bits: that
/// adds every position of the plane in order, one vector chain per channel block; here the positions
/// no maximum took (+0, which leaves a sum started at +0 as it is) are left out, row 2 py (places 0
/// and 1) before row 2 py + 1 (places 2 and 3), and up to four channel blocks' chains interleave.
void add_pooled_channel_sums(const float* grad_t, const float* window, int64_t ph, int64_t pw, int64_t oc,
                             int64_t ocp, float* dbias) {
  constexpr int most = 4;
  for (int64_t o0 = 0; o0 < ocp; o0 += most * W) {
    const int nv = static_cast<int>(std::min<int64_t>(most, (ocp - o0) / W));
    simd::vec acc[most] = {simd::zero(), simd::zero(), simd::zero(), simd::zero()};
    for (int64_t py = 0; py < ph; ++py)
      for (int row = 0; row < 2; ++row) {
        const simd::vec split = simd::splat(1.5f);  // places 0, 1 above it; 2, 3 below
        for (int64_t px = 0; px < pw; ++px) {
          const int64_t q = (py * pw + px) * ocp + o0;
          for (int v = 0; v < nv; ++v) {
            const simd::vec place = simd::load(window + q + v * W);
            const simd::ivec in_row = (simd::ivec)(row ? place > split : place < split);
            acc[v] = simd::add(acc[v], choose(in_row, simd::zero(), simd::load(grad_t + q + v * W)));
          }
        }
      }
    for (int v = 0; v < nv; ++v) {
      alignas(64) float lanes[W];
      simd::store(lanes, acc[v]);
      for (int64_t l = 0, o = o0 + v * W; l < W && o + l < oc; ++l) dbias[o + l] += lanes[l];
    }
  }
}

} // namespace

void load_pooled(const float* dy, const float* y, const float* window, int64_t oh, int64_t ow, int64_t oc,
                 int64_t ocp, float* t, float* dbias) {
  const int64_t ph = oh / 2, pw = ow / 2, pp = ph * pw;
  float* grad_t = scratch(9, static_cast<std::size_t>(pp * ocp));
  load_positions(dy, y, pp, oc, ocp, grad_t, nullptr);
  if (oh % 2 || ow % 2) std::fill_n(t, oh * ow * ocp, 0.0f);  // the last row or column no window covers
  for (int64_t py = 0; py < ph; ++py)
    for (int64_t px = 0; px < pw; ++px) {
      const std::array<int64_t, 4> at = corners(py, px, ow);
      const int64_t q = (py * pw + px) * ocp;
      for (int64_t o0 = 0; o0 < ocp; o0 += W) {
        const simd::vec g = simd::load(grad_t + q + o0), place = simd::load(window + q + o0);
        for (int k = 0; k < 4; ++k) {
          const simd::ivec here = (simd::ivec)(place == simd::splat(static_cast<float>(k)));
          simd::store(t + at[k] * ocp + o0, choose(here, simd::zero(), g));
        }
      }
    }
  if (dbias) add_pooled_channel_sums(grad_t, window, ph, pw, oc, ocp, dbias);
}

namespace {

/// wt [c*k*k, ocp] = W [oc, c, k, k] transposed, zero beyond oc.
void pack_weights(const float* w, int64_t oc, int64_t taps, int64_t ocp, float* wt) {
  for (int64_t t = 0; t < taps; ++t) {
    float* dst = wt + t * ocp;
    for (int64_t o = 0; o < oc; ++o) dst[o] = w[o * taps + t];
    std::fill(dst + oc, dst + ocp, 0.0f);
  }
}

/// The weights of dx = conv(dy, W') for a stride-1 convolution: W'[ci][m][kh][kw] =
/// W[m][ci][k-1-kh][k-1-kw], packed as wt [oc*k*k, cp].
void pack_rotated_weights(const float* w, int64_t oc, int64_t c, int64_t k, int64_t cp, float* wt) {
  const int64_t kk = k * k;
  for (int64_t m = 0; m < oc; ++m)
    for (int64_t t = 0; t < kk; ++t) {
      float* dst = wt + (m * kk + t) * cp;
      const int64_t flipped = kk - 1 - t;  // (k-1-kh, k-1-kw)
      for (int64_t ci = 0; ci < c; ++ci) dst[ci] = w[(m * c + ci) * kk + flipped];
      std::fill(dst + c, dst + cp, 0.0f);
    }
}

/// dyt [oh * ow][ocp] (position-major) as NCHW planes [oc][oh + 2 pad][ow + 2 pad], zero-padded by
/// `pad` (scratch slots 6 and 4).
const float* padded_planes(const float* dyt, int64_t ocp, int64_t oc, int64_t oh, int64_t ow, int64_t pad) {
  float* din = scratch(6, static_cast<std::size_t>(oc * oh * ow));
  store_channels(dyt, oh * ow, ocp, oc, nullptr, false, din);
  if (pad == 0) return din;
  float* padded = scratch(4, static_cast<std::size_t>(oc * (oh + 2 * pad) * (ow + 2 * pad)));
  pad_planes(din, oc, oh, ow, pad, padded);
  return padded;
}

/// dx [c, h, wd] of one image by the direct kernel (stride 1): the output gradient dyt [oh * ow][ocp]
/// (position-major, as output_gradient::load gives it) in NCHW planes padded by pd, convolved with the
/// rotated weights wrot [oc*k*k, cp].
void dx_image(const float* dyt, int64_t ocp, int64_t oc, int64_t oh, int64_t ow, int64_t pd, int64_t k,
              const float* wrot, int64_t c, int64_t h, int64_t wd, int64_t cp, float* dxi, const float* addend) {
  const int64_t ohp = oh + 2 * pd, owp = ow + 2 * pd;
  const float* din = padded_planes(dyt, ocp, oc, oh, ow, pd);
  float* out = scratch(5, static_cast<std::size_t>(h * wd * cp));
  conv_image(din, oc, ohp, owp, k, 1, h, wd, wrot, cp, out);
  store_channels(out, h * wd, cp, c, nullptr, false, dxi, addend);
}

// ---------------------------------------------------------------- dx of a stride-2 convolution

/// dx of a stride-2 convolution, cut by the parity (a, b) of its positions (2u + a, 2v + b): each
/// class is a stride-1 convolution of dy with the taps (kh, kw) of that parity, the kh with
/// kh = a + p (mod 2), reading dy at (u + (a + p - kh) / 2, ...). Every tap is used by one class,
/// so the classes together do the multiply-adds of one pass, with no zeros inserted.
struct parity_class {
  int64_t a, b;           // the positions' parity
  int64_t kh_n, kw_n;     // the class's taps down and across
  int64_t kh0, kw0;       // its first tap (the largest kh, kw of the parity): offset dh0, dw0 into dy
  int64_t dh0, dw0;       // (a + p - kh0) / 2, (b + p - kw0) / 2
  int64_t uh, vw;         // its positions down and across
};

/// The four classes of a k x k (k > 1: every class has taps), stride-2 convolution with padding p
/// onto an h x w plane.
std::array<parity_class, 4> parity_classes(int64_t k, int64_t p, int64_t h, int64_t w) {
  std::array<parity_class, 4> out{};
  auto axis = [&](int64_t a, int64_t len, int64_t& n, int64_t& first, int64_t& d0, int64_t& count) {
    first = k - 1 - ((k - 1 - a - p) % 2 + 2) % 2;  // the largest tap of this parity
    n = first / 2 + 1;
    d0 = (a + p - first) / 2;
    count = len > a ? (len - a + 1) / 2 : 0;
  };
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 2; ++b) {
      parity_class& q = out[static_cast<std::size_t>(a * 2 + b)];
      q.a = a;
      q.b = b;
      axis(a, h, q.kh_n, q.kh0, q.dh0, q.uh);
      axis(b, w, q.kw_n, q.kw0, q.dw0, q.vw);
    }
  return out;
}

/// The four classes, and the padding of dy [oh, ow] every class's reads stay inside (the same on
/// each side).
struct parity_plan {
  std::array<parity_class, 4> classes{};
  int64_t pad = 0;
};

parity_plan make_parity_plan(int64_t k, int64_t p, int64_t h, int64_t w, int64_t oh, int64_t ow) {
  parity_plan out{parity_classes(k, p, h, w), 0};
  for (const parity_class& q : out.classes) {
    if (q.uh == 0 || q.vw == 0) continue;
    out.pad = std::max({out.pad, -q.dh0, -q.dw0, q.uh - 1 + q.dh0 + q.kh_n - oh, q.vw - 1 + q.dw0 + q.kw_n - ow});
  }
  return out;
}

/// Each class's taps of W [oc, c, k, k], packed one after the other as [oc][kh_n][kw_n][cp]
/// (fwd_tile's order), the class's kh' = 0 ... kh_n - 1 being kh0, kh0 - 2, ...
void pack_parity_weights(const float* w, int64_t oc, int64_t c, int64_t k, int64_t cp,
                         const std::array<parity_class, 4>& classes, float* wt) {
  for (const parity_class& q : classes)
    for (int64_t m = 0; m < oc; ++m)
      for (int64_t i = 0; i < q.kh_n; ++i)
        for (int64_t j = 0; j < q.kw_n; ++j, wt += cp) {
          const int64_t tap = (q.kh0 - 2 * i) * k + (q.kw0 - 2 * j);
          for (int64_t ci = 0; ci < c; ++ci) wt[ci] = w[(m * c + ci) * k * k + tap];
          std::fill(wt + c, wt + cp, 0.0f);
        }
}

/// dx [c, h, wd] of one image of a stride-2 convolution: dyt [oh * ow][ocp] (position-major) in NCHW
/// planes padded by the plan's padding, each class convolved with its packed taps (wt,
/// pack_parity_weights) into its positions of one position-major plane, then stored as NCHW.
void dx_image_stride2(const float* dyt, int64_t ocp, int64_t oc, int64_t oh, int64_t ow, const parity_plan& plan,
                      const float* wt, int64_t c, int64_t h, int64_t wd, int64_t cp, float* dxi,
                      const float* addend) {
  const int64_t pad = plan.pad, owp = ow + 2 * pad, plane = (oh + 2 * pad) * owp;
  const float* din = padded_planes(dyt, ocp, oc, oh, ow, pad);
  float* out = scratch(5, static_cast<std::size_t>(h * wd * cp));
  for (const parity_class& q : plan.classes) {  // its outputs two positions apart each way
    conv_grid(din + (pad + q.dh0) * owp + pad + q.dw0, oc, plane, owp, q.kh_n, q.kw_n, 1, q.uh, q.vw, wt, cp,
              out + (q.a * wd + q.b) * cp, 2 * wd * cp, 2 * cp);
    wt += oc * q.kh_n * q.kw_n * cp;
  }
  store_channels(out, h * wd, cp, c, nullptr, false, dxi, addend);
}

/// The threads' partial sums (each `part` floats: dW^T [taps, ocp], then dbias [ocp]) summed into
/// dw [oc, taps] (the transpose of dW^T) and dbias when it is given.
void sum_partials(const float* partial, std::size_t part, int threads, int64_t oc, int64_t taps, int64_t ocp,
                  float* dwp, float* dbp) {
  for (int64_t o = 0; o < oc; ++o)
    for (int64_t tp = 0; tp < taps; ++tp) {
      float v = 0.0f;
      for (int th = 0; th < threads; ++th) v += partial[part * th + tp * ocp + o];
      dwp[o * taps + tp] = v;
    }
  if (!dbp) return;
  for (int64_t o = 0; o < oc; ++o) {
    float v = 0.0f;
    for (int th = 0; th < threads; ++th) v += partial[part * th + taps * ocp + o];
    dbp[o] = v;
  }
}

/// dx by im2col and GEMM, where the direct kernel does not compute it: dy masked by relu_output's
/// positives first when it is given; the addend added after when it is given.
void dx_by_gemm(const context& ctx, const tensor& w, const tensor& dy, const tensor* relu_output,
                const conv2d_geometry& g, tensor& dx, const tensor* addend) {
  tensor masked;
  if (relu_output) relu_backward(ctx, *relu_output, dy, masked);
  conv2d_backward_data_gemm(ctx, w, relu_output ? masked : dy, g, dx);
  if (addend) add(ctx, dx, *addend, dx);
}

} // namespace

void conv2d_forward_direct(const context& ctx, const tensor& x, const tensor& w, const tensor& bias,
                           const conv2d_geometry& g, bool relu, tensor& y, tensor* window, const tensor* input_map) {
  require(!input_map, "conv2d_forward_direct", "reads no input map (conv2d_forward makes the mapped input first)");
  const shape ys = conv2d_output_shape(x.shape(), g);
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const int64_t oc = g.out_channels, oh = ys[2], ow = ys[3], k = g.kernel, p = g.padding;
  const int64_t hp = h + 2 * p, wp = wd + 2 * p, ocp = round_up(oc, W), taps = c * k * k;
  float* wt = scratch(0, static_cast<std::size_t>(taps * ocp));
  pack_weights(w.data(), oc, taps, ocp, wt);
  const float* xp = x.data();
  const float* bp = bias.defined() ? bias.data() : nullptr;
  float* yp = y.data();
  const int64_t pooled = (oh / 2) * (ow / 2);
  if (window) ensure_shape(*window, {n, pooled, ocp});
  float* windowp = window ? window->data() : nullptr;
  const int threads = detail::image_threads(ctx, n);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = xp + i * c * h * wd;
    const float* in = xi;
    if (p > 0) {
      float* padded = scratch(1, static_cast<std::size_t>(c * hp * wp));
      pad_planes(xi, c, h, wd, p, padded);
      in = padded;
    }
    float* out = scratch(2, static_cast<std::size_t>(oh * ow * ocp));
    conv_image(in, c, hp, wp, k, g.stride, oh, ow, wt, ocp, out);
    if (windowp)
      store_pooled(out, oh, ow, ocp, oc, bp, yp + i * oc * pooled, windowp + i * pooled * ocp);
    else
      store_channels(out, oh * ow, ocp, oc, bp, relu, yp + i * oc * oh * ow);
  }
}

void conv2d_backward_direct(const context& ctx, const tensor& x, const tensor& w, const tensor& dy,
                            const tensor* relu_output, const conv2d_geometry& g, tensor* dx,
                            const tensor* dx_addend, tensor& dw, tensor* dbias, const tensor* window,
                            const tensor* input_map) {
  require(!input_map, "conv2d_backward_direct", "reads no input map (conv2d_backward makes the mapped input first)");
  const shape ys = conv2d_output_shape(x.shape(), g);
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const int64_t oc = g.out_channels, oh = ys[2], ow = ys[3], k = g.kernel, p = g.padding, s = g.stride;
  const int64_t hp = h + 2 * p, wp = wd + 2 * p, ocp = round_up(oc, W), cp = round_up(c, W);
  const int64_t taps = c * k * k, positions = oh * ow, pd = k - 1 - p;
  // dx by the direct kernel: stride 1, and dy padded by pd = k-1-p >= 0; or stride 2 and k > 1, by parity
  // classes (a 1x1 kernel's dx is one product, which the GEMM does faster: ResNet's projections).
  const bool direct_dx = dx && s == 1 && p <= k - 1, strided_dx = dx && s == 2 && k > 1;
  const parity_plan parity = strided_dx ? make_parity_plan(k, p, h, wd, oh, ow) : parity_plan{};
  const int threads = detail::image_threads(ctx, n);

  // Per-thread partial sums of dW^T [taps, ocp] and dbias [ocp], in the calling thread's scratch.
  const std::size_t part = static_cast<std::size_t>(taps * ocp + ocp);
  float* partial = scratch(0, part * threads);
  std::fill_n(partial, part * threads, 0.0f);
  float* wrot = nullptr;
  if (direct_dx || strided_dx) {
    wrot = scratch(1, static_cast<std::size_t>(oc * k * k * cp));
    if (direct_dx)
      pack_rotated_weights(w.data(), oc, c, k, cp, wrot);
    else
      pack_parity_weights(w.data(), oc, c, k, cp, parity.classes, wrot);
  }
  const output_gradient grad =
      output_gradient::of(dy, relu_output, window, oh, ow, oc, ocp, "conv2d_backward_direct");
  require(!window || !dx || direct_dx, "conv2d_backward_direct",
          "a pooled gradient's dx needs stride 1 and padding < kernel");
  float* dxp = dx ? dx->data() : nullptr;
  const float* addp = dx && dx_addend ? dx_addend->data() : nullptr;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int t = omp_get_thread_num();
    float* dwt = partial + part * t;
    float* db = dbias ? dwt + taps * ocp : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * c * h * wd;
      const float* in = xi;
      if (p > 0) {
        float* padded = scratch(2, static_cast<std::size_t>(c * hp * wp));
        pad_planes(xi, c, h, wd, p, padded);
        in = padded;
      }
      float* dyt = scratch(3, static_cast<std::size_t>(positions * ocp));
      grad.load(i, dyt, db);
      dw_image(in, c, hp, wp, k, s, oh, ow, dyt, ocp, dwt);
      const int64_t at = i * c * h * wd;
      if (direct_dx) dx_image(dyt, ocp, oc, oh, ow, pd, k, wrot, c, h, wd, cp, dxp + at, addp ? addp + at : nullptr);
      if (strided_dx)
        dx_image_stride2(dyt, ocp, oc, oh, ow, parity, wrot, c, h, wd, cp, dxp + at, addp ? addp + at : nullptr);
    }
  }
  sum_partials(partial, part, threads, oc, taps, ocp, dw.data(), dbias ? dbias->data() : nullptr);
  if (dx && !direct_dx && !strided_dx) dx_by_gemm(ctx, w, dy, relu_output, g, *dx, dx_addend);
}

} // namespace troupe::kernels::detail::TROUPE_ISA
