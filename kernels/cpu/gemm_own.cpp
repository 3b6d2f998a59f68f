// troupe's own SGEMM: the loops of BLIS/GotoBLAS around a register-blocked
// micro-kernel. For each block of nc columns of C and each slice of kc of the
// depth, op(B)'s block is packed into nr-wide panels (kept in L2/L3); for each
// block of mc rows, op(A)'s block into mr-wide panels (kept in L2); the
// micro-kernel then walks the tiles, one B panel (in L1) against every A panel.
// Edge tiles go through a small buffer. Threads take rectangles of C.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "kernels/cpu/gemm_own.hpp"
#include "kernels/machine.hpp"

namespace troupe::kernels::detail {

void pack_panels_ref(const float* src, int64_t si, int64_t sp, int64_t count, int64_t k, int width, float* dst) {
  for (int64_t i0 = 0; i0 < count; i0 += width, dst += k * width) {
    const int64_t w = std::min<int64_t>(width, count - i0);
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t i = 0; i < w; ++i) dst[p * width + i] = src[(i0 + i) * si + p * sp];
      for (int64_t i = w; i < width; ++i) dst[p * width + i] = 0.0f;
    }
  }
}

namespace {

// ---------------------------------------------------------------- the generic set

constexpr int generic_mr = 4, generic_nr = 8;

void generic_micro(int64_t k, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta) {
  float acc[generic_mr][generic_nr] = {};
  for (int64_t p = 0; p < k; ++p, a += generic_mr, b += generic_nr)
    for (int i = 0; i < generic_mr; ++i)
      for (int j = 0; j < generic_nr; ++j) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < generic_mr; ++i)
    for (int j = 0; j < generic_nr; ++j)
      c[i * ldc + j] = alpha * acc[i][j] + (beta == 0.0f ? 0.0f : beta * c[i * ldc + j]);
}

void generic_pack_a(bool trans, const float* a, int64_t lda, int64_t m, int64_t k, float* dst) {
  pack_panels_ref(a, trans ? 1 : lda, trans ? lda : 1, m, k, generic_mr, dst);
}

void generic_pack_b(bool trans, const float* b, int64_t ldb, int64_t k, int64_t n, float* dst) {
  pack_panels_ref(b, trans ? ldb : 1, trans ? 1 : ldb, n, k, generic_nr, dst);
}

const gemm_kernel_set generic_set{"generic", generic_mr, generic_nr, generic_micro, generic_pack_a, generic_pack_b};

// ---------------------------------------------------------------- blocking

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

struct blocking {
  int64_t mc, kc, nc;
};

/// kc: a B panel (kc x nr) fills half of L1; mc: A's block (mc x kc) half of
/// L2; nc: B's block (kc x nc) half of this core's share of L3. Each is then
/// evened out over its dimension (784 deep is 4 slices of 196, not 3 of 256
/// and one of 16).
blocking block_sizes(const gemm_kernel_set& ks, int64_t m, int64_t n, int64_t k) {
  const cache_sizes& cs = caches();
  static const long cores = std::max(1u, std::thread::hardware_concurrency());  // a file read: once
  int64_t kc = std::clamp<int64_t>(cs.l1d / 2 / (ks.nr * 4), 64, 1024);
  kc = ceil_div(k, ceil_div(k, kc));
  int64_t mc = std::clamp<int64_t>(cs.l2 / 2 / (kc * 4) / ks.mr * ks.mr, 4 * ks.mr, 4096);
  mc = round_up(ceil_div(m, ceil_div(m, mc)), ks.mr);
  int64_t nc = std::clamp<int64_t>(cs.l3 / cores / 2 / (kc * 4) / ks.nr * ks.nr, 8 * ks.nr, 16384);
  nc = round_up(ceil_div(n, ceil_div(n, nc)), ks.nr);
  return {mc, std::max<int64_t>(kc, 1), nc};
}

// ---------------------------------------------------------------- packing buffers

struct free_deleter {
  void operator()(float* p) const { std::free(p); }
};
using aligned_floats = std::unique_ptr<float[], free_deleter>;

/// A thread's packing buffer, grown on demand and kept: no allocation per call.
float* thread_buffer(int which, int64_t floats) {
  thread_local aligned_floats buf[2];
  thread_local int64_t cap[2] = {0, 0};
  if (cap[which] < floats) {
    const int64_t want = round_up(floats + 64, 16);  // 64: what a pack may write past its panels
    buf[which].reset(static_cast<float*>(std::aligned_alloc(64, static_cast<std::size_t>(want) * 4)));
    if (!buf[which]) throw std::bad_alloc();
    cap[which] = want - 64;
  }
  return buf[which].get();
}

// ---------------------------------------------------------------- the loops

struct problem {
  bool ta, tb;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
};

/// The rows past m or columns past n of an edge tile stay in `tile`; the rest goes to C.
void store_edge(const float* tile, int nr, int64_t rows, int64_t cols, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      c[i * ldc + j] = tile[i * nr + j] + (beta == 0.0f ? 0.0f : beta * c[i * ldc + j]);
}

/// C[mlen x nlen] from packed A (mlen x kc) and B (kc x nlen): B panel outer (in L1), A panels inner.
void macro_kernel(const gemm_kernel_set& ks, int64_t mlen, int64_t nlen, int64_t kc, const float* pa,
                  const float* pb, float alpha, float beta, float* c, int64_t ldc) {
  alignas(64) float tile[32 * 32];
  for (int64_t jr = 0; jr < nlen; jr += ks.nr) {
    const int64_t cols = std::min<int64_t>(ks.nr, nlen - jr);
    for (int64_t ir = 0; ir < mlen; ir += ks.mr) {
      const int64_t rows = std::min<int64_t>(ks.mr, mlen - ir);
      float* cc = c + ir * ldc + jr;
      if (rows == ks.mr && cols == ks.nr) {
        ks.micro(kc, pa + ir * kc, pb + jr * kc, cc, ldc, alpha, beta);
      } else {
        ks.micro(kc, pa + ir * kc, pb + jr * kc, tile, ks.nr, alpha, 0.0f);
        store_edge(tile, ks.nr, rows, cols, beta, cc, ldc);
      }
    }
  }
}

/// The whole product on this thread.
void serial_gemm(const gemm_kernel_set& ks, const problem& p) {
  const blocking bs = block_sizes(ks, p.m, p.n, p.k);
  float* pb = thread_buffer(1, bs.kc * bs.nc);
  float* pa = thread_buffer(0, bs.kc * bs.mc);
  for (int64_t jc = 0; jc < p.n; jc += bs.nc) {
    const int64_t nlen = std::min(bs.nc, p.n - jc);
    for (int64_t pc = 0; pc < p.k; pc += bs.kc) {
      const int64_t klen = std::min(bs.kc, p.k - pc);
      ks.pack_b(p.tb, p.tb ? p.b + jc * p.ldb + pc : p.b + pc * p.ldb + jc, p.ldb, klen, nlen, pb);
      const float beta = pc == 0 ? p.beta : 1.0f;
      for (int64_t ic = 0; ic < p.m; ic += bs.mc) {
        const int64_t mlen = std::min(bs.mc, p.m - ic);
        ks.pack_a(p.ta, p.ta ? p.a + pc * p.lda + ic : p.a + ic * p.lda + pc, p.lda, mlen, klen, pa);
        macro_kernel(ks, mlen, nlen, klen, pa, pb, p.alpha, beta, p.c + ic * p.ldc + jc, p.ldc);
      }
    }
  }
}

/// C = beta * C (0 where beta is 0, whatever C held).
void scale_c(const problem& p) {
  for (int64_t i = 0; i < p.m; ++i) {
    float* row = p.c + i * p.ldc;
    if (p.beta == 0.0f) std::fill(row, row + p.n, 0.0f);
    else if (p.beta != 1.0f) for (int64_t j = 0; j < p.n; ++j) row[j] *= p.beta;
  }
}

/// A block of C (the whole product, or one thread's): its rows start as the epilogue's bias, then the
/// product, then its activation, while the block is in this thread's cache.
void block_gemm(const gemm_kernel_set& ks, problem p, const gemm_epilogue& e) {
  if (e.start(p.m, p.n, p.c, p.ldc)) p.beta = 1.0f;
  if (p.k <= 0 || p.alpha == 0.0f) scale_c(p);
  else serial_gemm(ks, p);
  e.finish(p.m, p.n, p.c, p.ldc);
}

/// Rows [i0, i1) and columns [j0, j1) of the product: the same problem on a block of C.
problem sub_problem(const problem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  problem s = p;
  s.m = i1 - i0;
  s.n = j1 - j0;
  s.a = p.ta ? p.a + i0 : p.a + i0 * p.lda;
  s.b = p.tb ? p.b + j0 * p.ldb : p.b + j0;
  s.c = p.c + i0 * p.ldc + j0;
  return s;
}

/// Start of part t of `parts` over [0, len), in multiples of `unit` (a tile).
int64_t part_start(int64_t len, int t, int parts, int unit) {
  return t >= parts ? len : std::min(len, round_up(len * t / parts, unit));
}

/// Below this many multiply-adds a product runs on one thread: a fork and join costs more.
constexpr int64_t min_split_macs = int64_t{1} << 17;

/// The grid of rows x columns of C's blocks, one per thread, that packs the
/// least per thread: each packs its rows of op(A) and its columns of op(B).
std::pair<int, int> thread_grid(const gemm_kernel_set& ks, const problem& p, int threads) {
  std::pair<int, int> best{1, 1};
  double best_cost = -1;
  for (int rows = 1; rows <= threads; ++rows) {
    if (threads % rows) continue;
    const int cols = threads / rows;
    if (p.m < int64_t{rows} * ks.mr || p.n < int64_t{cols} * ks.nr) continue;
    const double cost = double(p.m) / rows * p.k + double(p.n) / cols * p.k;
    if (best_cost < 0 || cost < best_cost) best = {rows, cols}, best_cost = cost;
  }
  return best;
}

void parallel_gemm(const gemm_kernel_set& ks, const problem& p, int threads, const gemm_epilogue& e) {
  const auto [rows, cols] = thread_grid(ks, p, threads);
  if (rows * cols < 2) return block_gemm(ks, p, e);
#pragma omp parallel num_threads(rows * cols)
  {
    const int t = omp_get_thread_num();
    if (omp_get_num_threads() != rows * cols) {
      if (t == 0) block_gemm(ks, p, e);  // fewer threads than asked: the whole product on one
    } else {
      const int r = t / cols, q = t % cols;
      const int64_t i0 = part_start(p.m, r, rows, ks.mr), i1 = part_start(p.m, r + 1, rows, ks.mr);
      const int64_t j0 = part_start(p.n, q, cols, ks.nr), j1 = part_start(p.n, q + 1, cols, ks.nr);
      if (i1 > i0 && j1 > j0)
        block_gemm(ks, sub_problem(p, i0, i1, j0, j1), {e.row_bias ? e.row_bias + j0 : nullptr, e.act});
    }
  }
}

} // namespace

const gemm_kernel_set& generic_gemm_kernels() { return generic_set; }

void gemm_own(const gemm_kernel_set& ks, int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
              float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, const gemm_epilogue& epilogue) {
  if (m <= 0 || n <= 0) return;
  const problem p{ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc};
  if (k <= 0 || alpha == 0.0f || threads < 2 || omp_in_parallel() || m * n * k < min_split_macs)
    return block_gemm(ks, p, epilogue);
  parallel_gemm(ks, p, threads, epilogue);
}

} // namespace troupe::kernels::detail
