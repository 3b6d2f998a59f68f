#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include <Eigen/Core>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/gemm_own.hpp"
#include "kernels/kernels.hpp"
#include "kernels/machine.hpp"

namespace troupe::kernels {

namespace {

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using stride_t = Eigen::OuterStride<>;
using cmap = Eigen::Map<const row_matrix, 0, stride_t>;
using mmap = Eigen::Map<row_matrix, 0, stride_t>;

void eigen_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cmap A(a, ta ? k : m, ta ? m : k, stride_t(lda));
  cmap B(b, tb ? n : k, tb ? k : n, stride_t(ldb));
  mmap C(c, m, n, stride_t(ldc));
  // beta == 0 assigns (no pass over C first); otherwise scale and accumulate.
  auto run = [&](const auto& product) {
    if (beta == 0.0f) {
      C.noalias() = alpha * product;
    } else {
      if (beta != 1.0f) C *= beta;
      C.noalias() += alpha * product;
    }
  };
  if (!ta && !tb) run(A * B);
  else if (ta && !tb) run(A.transpose() * B);
  else if (!ta && tb) run(A * B.transpose());
  else run(A.transpose() * B.transpose());
}

/// One cblas_sgemm call, row-major.
void blas(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

/// Below this many multiply-adds a product runs on one thread: a fork and join costs more.
constexpr int64_t min_split_macs = int64_t{1} << 17;
/// From this many on, OpenBLAS's own threading: it shares packed panels
/// between threads, where one block per thread packs all of one operand in
/// every thread (a cost that grows with the thread count). The products of a
/// training step's dense layers are below it (the MLP's largest 2^23.6, the
/// CNN's 2^24.6); 1024^3 is above.
constexpr int64_t max_block_macs = int64_t{1} << 25;

/// One call with OpenBLAS's threads at `threads`: it reads their count from
/// this thread's OpenMP setting, put back after.
void blas_on(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
             int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int icv = omp_get_max_threads();
  if (icv != threads) omp_set_num_threads(threads);
  blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (icv != threads) omp_set_num_threads(icv);
}

/// Start of block t of `parts` over [0, len), in multiples of 16 (the kernels' register tiles).
int64_t block_start(int64_t len, int t, int parts) {
  return t == parts ? len : len * t / parts / 16 * 16;
}

/// OpenBLAS on ctx's threads. A product of a training step's size (from
/// min_split_macs to max_block_macs) has C cut into one block per thread, each
/// a single-threaded sgemm (OpenBLAS runs single-threaded inside a parallel
/// region): on an MLP's 64 x 256 x 784 faster than OpenBLAS's own threading,
/// which synchronizes inside (docs/benchmarks.md). C is cut by rows when op(A) is the larger operand, or
/// when C is the largest matrix (k the smallest dimension, as in a weight
/// gradient): each thread then writes one contiguous block. Otherwise by
/// columns, so that each thread packs half of op(B), not all of it.
void openblas_gemm(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const bool by_rows = m >= n || (k <= m && k <= n);
  const int64_t len = by_rows ? m : n;
  const int parts = static_cast<int>(std::min<int64_t>(threads, len / 16));
  if (omp_in_parallel()) {
    blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int64_t macs = m * n * k;
  if (parts < 2 || macs < min_split_macs || macs >= max_block_macs) {
    blas_on(macs >= max_block_macs ? threads : 1, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#pragma omp parallel num_threads(parts)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = block_start(len, t, nt), hi = block_start(len, t + 1, nt);
    if (hi > lo && by_rows)  // rows lo..hi of op(A) and C
      blas(ta, tb, hi - lo, n, k, alpha, ta ? a + lo : a + lo * lda, lda, b, ldb, beta, c + lo * ldc, ldc);
    else if (hi > lo)  // columns lo..hi of op(B) and C
      blas(ta, tb, m, hi - lo, k, alpha, a, lda, tb ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
  }
}

/// gemm_backend::automatic's choice. Measured with `troupe_gemm_bench --products mlp|cnn|resnet|gpt`
/// (docs/benchmarks.md).
/// * Where 512-bit FMAs issue at twice the 256-bit rate (cpu().full_rate_avx512) and the avx512
///   set runs, OpenBLAS 0.3.21's AVX2 kernels reach half the peak, and troupe's own kernels run
///   1.1-2.6x their speed on every product of the four models, one-row decoding included, but
///   those whose op(B) has fewer than 16 columns (the classifiers' forward, 64 x 10: 1.1x slower,
///   most of each 32-wide tile is padding).
/// * Elsewhere (Zen 4, AVX2 machines), own where every dimension is at least 64 and the depth at
///   most 1024: own 9-14 % faster on the MLP's five large products and 20-36 % on the CNN's dense
///   weight and input gradients (k 64 and 128), 16 % slower on the CNN's forward product (k = 3136:
///   own's depth blocks reload C 13 times), 1.2-2.9x slower where a dimension is 10 (the
///   classifiers) or on ResNet-20's per-image 1x1 projections (16 x 196 x 32, 32 x 49 x 64).
bool own_is_faster(int64_t m, int64_t n, int64_t k) {
  static const bool full_rate = cpu().full_rate_avx512 && &detail::active_gemm_kernels() == detail::avx512_gemm_kernels();
  if (full_rate) return n >= 16;
  return std::min({m, n, k}) >= 64 && k <= 1024;
}

} // namespace

void gemm(const context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  detail::gemm_then(ctx, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, {});
}

void detail::gemm_then(const context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                       const gemm_epilogue& epilogue) {
  if (m == 0 || n == 0) return;
  const int threads = detail::threads(ctx);
  if (ctx.gemm == gemm_backend::own || (ctx.gemm == gemm_backend::automatic && own_is_faster(m, n, k))) {
    detail::gemm_own(detail::active_gemm_kernels(), threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                     c, ldc, epilogue);
    return;
  }
  // The other backends: the bias copied into C first, the activation in a pass of its own after.
  if (epilogue.start(m, n, c, ldc)) beta = 1.0f;
  if (ctx.gemm == gemm_backend::eigen) {
    // Eigen reads its thread count from this thread's OpenMP ICV.
    if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
    eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    openblas_gemm(threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  epilogue.finish(m, n, c, ldc);
}

void matmul(const context& ctx, const tensor& a, const tensor& b, tensor& out) {
  detail::require_rank(a, 2, "matmul", "a");
  detail::require_rank(b, 2, "matmul", "b");
  detail::require(a.dim(1) == b.dim(0), "matmul",
                  [&] {
                    return "inner dimensions differ: a " + a.shape().to_string() + ", b " + b.shape().to_string();
                  });
  ensure_shape(out, {a.dim(0), b.dim(1)});
  gemm(ctx, false, false, a.dim(0), b.dim(1), a.dim(1), 1.0f, a.data(), a.dim(1), b.data(), b.dim(1),
       0.0f, out.data(), b.dim(1));
}

} // namespace troupe::kernels
