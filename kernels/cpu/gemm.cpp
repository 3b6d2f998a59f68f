#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>

#include "kernels/cpu/check.hpp"
#include "kernels/kernels.hpp"

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
} // namespace

void gemm(const context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // OpenBLAS (OpenMP build) and Eigen read their thread count from this thread's OpenMP ICV.
  const int threads = detail::threads(ctx);
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  if (ctx.gemm == gemm_backend::eigen) {
    eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void matmul(const context& ctx, const tensor& a, const tensor& b, tensor& out) {
  detail::require_rank(a, 2, "matmul", "a");
  detail::require_rank(b, 2, "matmul", "b");
  detail::require(a.dim(1) == b.dim(0), "matmul",
                  "inner dimensions differ: a " + a.shape().to_string() + ", b " + b.shape().to_string());
  ensure_shape(out, {a.dim(0), b.dim(1)});
  gemm(ctx, false, false, a.dim(0), b.dim(1), a.dim(1), 1.0f, a.data(), a.dim(1), b.data(), b.dim(1),
       0.0f, out.data(), b.dim(1));
}

} // namespace troupe::kernels
